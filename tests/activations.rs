//! The activations of `std.nn` (`gelu`, exact and approximate, `relu6`, `leaky_relu`,
//! `elu`, `selu`) and `std.prim`'s `sin`, `cos`, `erf` and `clip_by_value`, predicted
//! on every target this build has, against values computed in f64 with Python's `math`
//! module (TensorFlow's formulas). Tolerance: 1e-5 of `max(1, |value|)`, the f32
//! rounding of a few operations (`gelu` of -5 is `0.5 x (1 + erf(x / sqrt 2))`, a
//! difference of two numbers near 1, as TensorFlow computes it too).
//!
//! The train step through them: `stop_gradient` keeps a term out of the gradient,
//! and the others' gradients are their ops' (`tests/gradients.rs`).

mod common;
use est::elab::Target;
use est::runtime::{Estimator, RunOptions, Steps};
use est::Program;

const SRC: &str = r#"
use std.nn.{gelu, relu6, leaky_relu, elu, selu}

// x = -5, -3.75, ..., 6.25 (ten examples of one feature)
input xs(repeats: bool) {
  let d = range(10) |> map |i| (broadcast_to(cast(i, f32) * 1.25 - 5.0, [1]), 0.0)
  let d = if repeats { d |> repeat } else { d }
  d |> batch(10, drop_remainder: true)
}

model acts(features: f32[B, 1], labels: f32[B]) {
  let x = features
  let w = variable("w", [1], init: 0.5)
  // d loss / d w = mean(x): the second term's gradient (mean(x) 2 w) is stopped
  let loss = reduce_mean(x * w + stop_gradient(x * w) * stop_gradient(w))
  train { minimize loss with sgd(lr: 1.0) }
  predict {
    gelu = gelu(x)
    gelu_tanh = gelu(x, approximate: true)
    relu6 = relu6(x)
    leaky = leaky_relu(x)
    leaky_keras = leaky_relu(x, alpha: 0.3)
    elu = elu(x)
    selu = selu(x)
    sin = sin(x)
    cos = cos(x)
    erf = erf(x)
    clipped = clip_by_value(x, -2.0, 3.0)
  }
}

estimator acts {
  model = acts
  train_input = xs(true)
  predict_input = xs(false)
  config { save_checkpoint_steps = 100 }
}
"#;

/// `(name, f(x) for x = -5, -3.75, ..., 6.25)`.
const WANT: &[(&str, [f64; 10])] = &[
    (
        "gelu",
        [
            -1.43325786e-06,
            -0.00033156482,
            -0.0155241633,
            -0.132062217,
            0.0,
            1.11793778,
            2.48447584,
            3.74966844,
            4.99999857,
            6.25,
        ],
    ),
    (
        "gelu_tanh",
        [
            -2.2917962e-07,
            -0.000219252072,
            -0.0150842661,
            -0.132285797,
            0.0,
            1.1177142,
            2.48491573,
            3.74978075,
            4.99999977,
            6.25,
        ],
    ),
    (
        "relu6",
        [0.0, 0.0, 0.0, 0.0, 0.0, 1.25, 2.5, 3.75, 5.0, 6.0],
    ),
    (
        "leaky",
        [-1.0, -0.75, -0.5, -0.25, 0.0, 1.25, 2.5, 3.75, 5.0, 6.25],
    ),
    (
        "leaky_keras",
        [-1.5, -1.125, -0.75, -0.375, 0.0, 1.25, 2.5, 3.75, 5.0, 6.25],
    ),
    (
        "elu",
        [
            -0.993262053,
            -0.976482254,
            -0.917915001,
            -0.713495203,
            0.0,
            1.25,
            2.5,
            3.75,
            5.0,
            6.25,
        ],
    ),
    (
        "selu",
        [
            -1.74625336,
            -1.71675281,
            -1.61378576,
            -1.25439545,
            0.0,
            1.31337623,
            2.62675247,
            3.9401287,
            5.25350494,
            6.56688117,
        ],
    ),
    (
        "sin",
        [
            0.958924275,
            0.571561319,
            -0.598472144,
            -0.948984619,
            0.0,
            0.948984619,
            0.598472144,
            -0.571561319,
            -0.958924275,
            -0.0331792165,
        ],
    ),
    (
        "cos",
        [
            0.283662185,
            -0.820559357,
            -0.801143616,
            0.315322362,
            1.0,
            0.315322362,
            -0.801143616,
            -0.820559357,
            0.283662185,
            0.999449418,
        ],
    ),
    (
        "erf",
        [
            -1.0,
            -0.999999886,
            -0.999593048,
            -0.922900128,
            0.0,
            0.922900128,
            0.999593048,
            0.999999886,
            1.0,
            1.0,
        ],
    ),
    (
        "clipped",
        [-2.0, -2.0, -2.0, -1.25, 0.0, 1.25, 2.5, 3.0, 3.0, 3.0],
    ),
];

fn targets() -> Vec<Target> {
    let mut t = vec![Target::Interp, Target::Wafer];
    if cfg!(feature = "llvm") {
        t.push(Target::Host);
    }
    t
}

/// An estimator of `SRC` on `target` after one train step, in a fresh directory
/// (`tag` names it).
fn trained(target: Target, tag: &str) -> (Estimator, std::path::PathBuf) {
    let dir = common::scratch("activations", &format!("{tag}-{target:?}"));
    let p = Program::from_source("acts.est", SRC, None);
    let opts = RunOptions {
        target,
        model_dir: Some(dir.clone()),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{target:?}: {:?}", f.diags));
    e.train(Steps::Max(1)).unwrap();
    (e, dir)
}

#[test]
fn activations_predict_tensorflows_values_on_every_target() {
    for target in targets() {
        let (mut e, dir) = trained(target, "acts");
        let out = dir.join("pred");
        let p = e.predict(&out, None).unwrap();
        assert_eq!(p.examples, 10, "{target:?}");
        let rows: Vec<serde_json::Value> = std::fs::read_to_string(out.join("predictions.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        for (name, want) in WANT {
            for (i, (row, &w)) in rows.iter().zip(want).enumerate() {
                let got = &row[*name];
                let got = got.as_f64().or_else(|| got[0].as_f64()).unwrap();
                assert!(
                    (got - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{target:?}: {name} of example {i}: {got} against {w}"
                );
            }
        }
    }
}

/// One SGD step of `loss = mean(x w + stop_gradient(x w) stop_gradient(w))` at
/// `w = 0.5`, `lr = 1`: the gradient is `mean(x) = 0.625`, not `mean(x) (1 + 2 w)`.
#[test]
fn stop_gradient_keeps_a_term_out_of_the_step_on_every_target() {
    for target in targets() {
        let (e, _) = trained(target, "sg");
        let w = e.variables()["w"].to_f64()[0];
        assert!(
            (w - (0.5 - 0.625)).abs() <= 1e-6,
            "{target:?}: w after one step {w}"
        );
    }
}
