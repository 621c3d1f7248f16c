//! Variables as Keras layers make them (issue 13 §3): initialisers given to the
//! layers, regularizers whose penalties join the minimised loss (and its summary), and
//! `trainable_variables` for hand-written weight decay, on every target this build has.
//! The expected values are computed here from the definitions; tolerance 1e-5 relative
//! (f32 sums).

mod common;
use est::elab::Target;
use est::runtime::{Estimator, RunOptions, Steps};
use est::Program;

fn targets() -> Vec<Target> {
    let mut t = vec![Target::Interp, Target::Wafer];
    if cfg!(feature = "llvm") {
        t.push(Target::Host);
    }
    t
}

fn estimator(src: &str, target: Target, tag: &str) -> (Estimator, std::path::PathBuf) {
    let dir = common::scratch("variables", &format!("{tag}-{target:?}"));
    let p = Program::from_source(&format!("{tag}.est"), src, None);
    let opts = RunOptions {
        target,
        model_dir: Some(dir.clone()),
        ..Default::default()
    };
    let e =
        Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{tag} on {target:?}: {:?}", f.diags));
    (e, dir)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * b.abs().max(1.0)
}

/// `loss = mean(x . w + x . v) + 0.1 sum(w^2) + 0.01 sum(|v|)` with
/// `w = [0.5, -1, 2, 0.25]`, `v = [1, -2, 0.5, -0.5]` at the start and every feature
/// row `x = [1, 2, 3, 4]`: one SGD step (lr 0.5) moves `w` by `-0.5 (x + 0.2 w)` and
/// `v` by `-0.5 (x + 0.01 sign(v))`.
const PENALISED: &str = r#"
input rows() {
  range(8) |> map |i| (concat([fill([1], 1.0), fill([1], 2.0), fill([1], 3.0), fill([1], 4.0)]) + cast(i, f32) * 0.0, i % 2) |> repeat |> batch(4, drop_remainder: true)
}

model m(features: f32[B, 4], labels: i32[B]) {
  let w = variable("w", [4], init: 0.0, regularizer: l2(0.1))
  let v = variable("v", [4], init: 0.0, regularizer: l1(0.01))
  let data = reduce_mean(reduce_sum(features * w, axis: 1) + reduce_sum(features * v, axis: 1))
  train { minimize data with sgd(lr: 0.5) }
}

estimator e {
  model = m
  train_input = rows()
  eval_input = rows() |> take(2)
  config { save_summary_steps = 1 }
}
"#;

#[test]
fn regularizers_add_their_penalties_to_the_loss_and_its_gradient() {
    let w0 = [0.5, -1.0, 2.0, 0.25];
    let v0 = [1.0, -2.0, 0.5, -0.5];
    let x = [1.0, 2.0, 3.0, 4.0];
    for target in targets() {
        let (mut e, dir) = estimator(PENALISED, target, "penalised");
        e.restore_or_init().unwrap();
        let set = |e: &mut Estimator, n: &str, v: &[f64]| {
            let ty = est::ir::TensorType::new(est::ir::DType::F32, vec![v.len()]);
            e.set_variable(n, est::tensor::Tensor::from_f64(&ty, v.to_vec()))
                .unwrap();
        };
        set(&mut e, "w", &w0);
        set(&mut e, "v", &v0);
        let dot = |w: &[f64]| -> f64 { x.iter().zip(w).map(|(a, b)| a * b).sum() };
        let data = dot(&w0) + dot(&v0);
        let l2: f64 = 0.1 * w0.iter().map(|w| w * w).sum::<f64>();
        let l1: f64 = 0.01 * v0.iter().map(|v: &f64| v.abs()).sum::<f64>();
        let r = e.train(Steps::Add(1)).unwrap();
        assert!(
            close(r.final_loss, data + l2 + l1),
            "{target:?}: loss {} against {}",
            r.final_loss,
            data + l2 + l1
        );
        let vars = e.variables();
        let w = vars["w"].to_f64();
        let v = vars["v"].to_f64();
        for i in 0..4 {
            let want = w0[i] - 0.5 * (x[i] + 0.2 * w0[i]);
            assert!(
                close(w[i], want),
                "{target:?}: w[{i}] {} against {want}",
                w[i]
            );
        }
        for i in 0..4 {
            let want = v0[i] - 0.5 * (x[i] + 0.01 * v0[i].signum());
            assert!(
                close(v[i], want),
                "{target:?}: v[{i}] {} against {want}",
                v[i]
            );
        }
        // the penalty is a summary of its own, of the weights before the step
        let events: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|d| d.path())
            .filter(|p| p.to_string_lossy().contains("tfevents"))
            .collect();
        assert_eq!(events.len(), 1, "{target:?}");
        let scalars = est::runtime::summary::read_scalars(&events[0]).unwrap();
        let reg = scalars
            .iter()
            .find(|s| s.1 == "regularization_loss")
            .unwrap_or_else(|| panic!("{target:?}: no regularization_loss in {scalars:?}"));
        assert_eq!(reg.0, 1, "{target:?}");
        assert!(
            close(f64::from(reg.2), l2 + l1),
            "{target:?}: {} against {}",
            reg.2,
            l2 + l1
        );
        // evaluation reports the loss the model minimises, penalties included
        let w1: Vec<f64> = w.clone();
        let v1: Vec<f64> = v.clone();
        let ev = e.evaluate(None).unwrap();
        let want = dot(&w1)
            + dot(&v1)
            + 0.1 * w1.iter().map(|w| w * w).sum::<f64>()
            + 0.01 * v1.iter().map(|v| v.abs()).sum::<f64>();
        assert!(
            close(ev.loss, want),
            "{target:?}: eval loss {} against {want}",
            ev.loss
        );
    }
}

/// Hand-written weight decay over `trainable_variables`: the kernels of both layers
/// (not the biases, not the excluded layer), after one SGD step with lr 1 and a loss
/// made of the decay alone, `0.5 sum(w^2)` of each kernel: each kernel is multiplied by
/// 0, and the rest does not move. (Not on the wafer, which lays out no layer whose
/// output's gradient is a constant zero, `mean(out) * 0`; its update of a penalised
/// variable is the first test's.)
const DECAYED: &str = r#"
use std.nn.dense

input rows() {
  range(8) |> map |i| (fill([3], 1.0) + cast(i, f32), i % 2) |> repeat |> batch(4, drop_remainder: true)
}

model m(features: f32[B, 3], labels: i32[B]) {
  let h = dense(features, 4, bias_init: 0.5)
  let h = dense(h, 2, bias_init: -0.25, kernel_init: init_orthogonal(gain: 2.0))
  let out = dense(h, 1, kernel_init: init_variance_scaling(scale: 2.0, mode: "fan_out", distribution: "uniform"))
  let decay = 0.0
  for w in trainable_variables("kernel", exclude: ["dense_2"]) { decay = decay + 0.5 * reduce_sum(square(w)) }
  train { minimize decay + reduce_mean(out) * 0.0 with sgd(lr: 1.0) }
}

estimator e {
  model = m
  train_input = rows()
  config { random_seed = 4 }
}
"#;

#[test]
fn trainable_variables_name_the_kernels_a_decay_is_written_over() {
    for target in targets().into_iter().filter(|t| *t != Target::Wafer) {
        let (mut e, _) = estimator(DECAYED, target, "decayed");
        e.restore_or_init().unwrap();
        let before = e.variables();
        // the layers' initialisers: constant biases, an orthogonal kernel (times its
        // gain) and a variance-scaling one within its uniform bound, sqrt(3 * 2 / 1)
        assert!(before["dense/bias"].to_f64().iter().all(|&b| b == 0.5));
        assert!(before["dense_1/bias"].to_f64().iter().all(|&b| b == -0.25));
        let k = before["dense_1/kernel"].to_f64(); // [4, 2]
        for p in 0..2 {
            for q in 0..2 {
                let dot: f64 = (0..4).map(|i| k[i * 2 + p] * k[i * 2 + q]).sum();
                let want = if p == q { 4.0 } else { 0.0 };
                assert!(
                    (dot - want).abs() < 1e-4,
                    "{target:?}: gram {p},{q} = {dot}"
                );
            }
        }
        let limit = 6f64.sqrt();
        let out = before["dense_2/kernel"].to_f64();
        assert!(out.iter().all(|w| w.abs() <= limit) && out.iter().any(|w| *w != 0.0));
        e.train(Steps::Add(1)).unwrap();
        let after = e.variables();
        for (name, t) in &after {
            let (b, a) = (before[name].to_f64(), t.to_f64());
            let decayed = name == "dense/kernel" || name == "dense_1/kernel";
            for (x, y) in b.iter().zip(&a) {
                let want = if decayed { 0.0 } else { *x };
                assert!(
                    (y - want).abs() <= 1e-6 * x.abs().max(1.0),
                    "{target:?}: {name} {x} became {y}, not {want}"
                );
            }
        }
    }
}

/// Wide & deep: the linear part trained by FTRL, the deep part by Adagrad, one loss.
fn wide_and_deep(train: &str) -> String {
    format!(
        r#"
use std.nn.dense
use std.losses.sigmoid_cross_entropy

input d() {{
  range(64)
    |> map |i| ({{ wide: broadcast_to(cast(i % 5, f32) / 5.0, [6]), deep: broadcast_to(cast(i % 3, f32), [4]) }}, cast(i % 2, f32))
    |> repeat
    |> batch(8, drop_remainder: true)
}}

fn linear(x) {{ dense(x, 1) }}

model m(features: {{ wide: f32[B, 6], deep: f32[B, 4] }}, labels: f32[B]) {{
  let wide = linear(features.wide)
  let h = dense(features.deep, 8, activation: relu)
  let logits = reshape(wide + dense(h, 1), [B])
  let loss = sigmoid_cross_entropy(labels, logits)
  train {{ {train} }}
}}

estimator e {{ model = m  train_input = d()  config {{ random_seed = 1 }} }}
"#
    )
}

/// Several `minimize` clauses over disjoint variables: after one step from the same
/// weights, each group's variables are what its optimiser alone makes of them (the
/// gradients of the first step do not depend on the other group's rule), on every
/// target; and the same optimiser twice over a partition is that optimiser once.
#[test]
fn each_minimize_trains_its_own_variables() {
    let split = wide_and_deep(
        "minimize loss with ftrl(lr: 0.1, l1: 0.01) |> only(trainable_variables(\"linear\"))\n    minimize loss with adagrad(lr: 0.05)",
    );
    let ftrl = wide_and_deep("minimize loss with ftrl(lr: 0.1, l1: 0.01)");
    let adagrad = wide_and_deep("minimize loss with adagrad(lr: 0.05)");
    let sgd_twice = wide_and_deep(
        "minimize loss with sgd(lr: 0.1) |> only(trainable_variables(\"linear\"))\n    minimize loss with sgd(lr: 0.1)",
    );
    let sgd = wide_and_deep("minimize loss with sgd(lr: 0.1)");
    let step = |src: &str, target: Target, tag: &str, steps: u64| {
        let (mut e, _) = estimator(src, target, tag);
        e.train(Steps::Max(steps)).unwrap();
        e.variables()
    };
    for target in targets() {
        let got = step(&split, target, "split", 1);
        let (f, a) = (
            step(&ftrl, target, "ftrl", 1),
            step(&adagrad, target, "adagrad", 1),
        );
        for (name, t) in &got {
            let want = if name.starts_with("linear/") { &f } else { &a };
            let (x, y) = (t.to_f64(), want[name].to_f64());
            for (p, q) in x.iter().zip(&y) {
                assert!(close(*p, *q), "{target:?}: {name} {p} against {q}");
            }
        }
        // the groups' slots: FTRL's accumulator and linear for the linear part only
        assert!(got.contains_key("linear/dense/kernel/linear"));
        assert!(!got.contains_key("dense/kernel/linear"));
        assert!(got.contains_key("dense/kernel/accumulator"));
        let d = common::worst(
            &step(&sgd_twice, target, "sgd-twice", 5),
            &step(&sgd, target, "sgd", 5),
        );
        assert!(
            d <= 1e-6,
            "{target:?}: sgd over a partition differs by {d:e}"
        );
    }
}
