//! Optimisers and learning-rate schedules against reference values computed by
//! PyTorch (`scripts/optim_reference.py` wrote tests/fixtures/optim_reference.json)
//! and, for the optimisers TensorFlow defines otherwise (Adagrad, FTRL, TF1's RMSProp
//! and Adam, BERT's AdamWeightDecay), by TensorFlow (`scripts/tf_optim_reference.py`
//! wrote tests/fixtures/tf_optim_reference.json). Each optimiser runs on every target
//! this build has.
//!
//! The program's loss is `reduce_sum(w * g)` with `g` fed from the input, so the
//! gradient of step t is exactly the fixture's g_t; after each step `w` must match
//! PyTorch's trajectory within 1e-5 (relative to max(1, |w|)).

use est::ir::{DType, TensorType};
use est::runtime::{Action, Estimator, RunHook, RunOptions, StepInfo, Steps};
use est::tensor::Tensor;
use est::Program;
use serde_json::Value;
use std::sync::{Arc, Mutex};

fn fixture() -> Value {
    read_fixture("optim_reference.json")
}

fn read_fixture(file: &str) -> Value {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(file);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn program(optimizer: &str, steps_input: &str) -> String {
    format!(
        r#"
input grads() {{
  {steps_input}
}}

model m(features: f32[B, 4], labels: i32[B]) {{
  let w = variable("w", [4], init: "zeros")
  let loss = reduce_sum(features * w)
  train {{ minimize loss with {optimizer} }}
}}

estimator e {{
  model = m
  train_input = grads()
  config {{ random_seed = 1  iterations_per_loop = 1 }}
}}
"#
    )
}

/// A fresh `dir` with `grads.csv`: one row per step, the gradient and a label 0.
fn write_grads(dir: &std::path::Path, grads: &[Vec<f64>]) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let csv: String = grads
        .iter()
        .map(|g| {
            let v: Vec<String> = g.iter().map(|x| format!("{x:?}")).collect();
            format!("{},0\n", v.join(","))
        })
        .collect();
    std::fs::write(dir.join("grads.csv"), csv).unwrap();
}

fn run(name: &str, optimizer: &str, f: &Value) {
    run_against(name, optimizer, f, "PyTorch")
}

/// Trains `w` from the fixture's `w0` on its gradients with `optimizer`, comparing
/// every step with the fixture's trajectory `name`, computed by `reference`.
fn run_against(name: &str, optimizer: &str, f: &Value, reference: &str) {
    for target in targets() {
        run_on(name, optimizer, f, reference, target);
    }
}

/// The interpreter, the host when this build has it, and the wafer: each computes the
/// update rule's graph itself (the wafer on its PEs).
fn targets() -> Vec<est::elab::Target> {
    let mut t = vec![est::elab::Target::Interp, est::elab::Target::Wafer];
    if cfg!(feature = "llvm") {
        t.push(est::elab::Target::Host);
    }
    t
}

fn run_on(name: &str, optimizer: &str, f: &Value, reference: &str, target: est::elab::Target) {
    let dir = std::env::temp_dir().join(format!(
        "est-optim-{}-{name}-{target:?}",
        std::process::id()
    ));
    let grads: Vec<Vec<f64>> = f["grads"].as_array().unwrap().iter().map(floats).collect();
    write_grads(&dir, &grads);
    let src = program(
        optimizer,
        "csv(\"grads.csv\", header: false, columns: { g: f32[4], label: i32 }) |> map |r| (r.g, r.label) |> repeat |> batch(1, drop_remainder: true)",
    );
    let p = Program::from_source("optim.est", &src, None);
    let opts = RunOptions {
        target,
        model_dir: Some(dir.join("run")),
        data_dir: Some(dir.clone()),
        ..Default::default()
    };
    let mut e =
        Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{name} on {target:?}: {:?}", f.diags));
    e.restore_or_init().unwrap();
    let w0 = floats(&f["w0"]);
    let ty = TensorType::new(DType::F32, vec![4]);
    e.set_variable("w", Tensor::from_f64(&ty, w0)).unwrap();
    let want: Vec<Vec<f64>> = f["optimizers"][name]["trajectory"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    assert_eq!(want.len(), grads.len());
    for (t, w_t) in want.iter().enumerate() {
        e.train(Steps::Add(1))
            .unwrap_or_else(|f| panic!("{name}: {:?}", f.diags));
        let got = e.variables()["w"].to_f64();
        for i in 0..4 {
            let tol = 1e-5 * w_t[i].abs().max(1.0);
            assert!(
                (got[i] - w_t[i]).abs() <= tol,
                "{name} on {target:?}, step {}: w[{i}] = {} but {reference} has {}",
                t + 1,
                got[i],
                w_t[i]
            );
        }
    }
}

#[test]
fn optimisers_match_pytorch() {
    let f = fixture();
    let cases = [
        ("sgd", "sgd(lr: 0.1)"),
        ("momentum", "momentum(lr: 0.1, momentum: 0.9)"),
        (
            "nesterov",
            "momentum(lr: 0.1, momentum: 0.9, nesterov: true)",
        ),
        (
            "adam",
            "adam(lr: 0.01, beta1: 0.9, beta2: 0.999, epsilon: 0.0000001)",
        ),
        (
            "adamw",
            "adamw(lr: 0.01, weight_decay: 0.01, beta1: 0.9, beta2: 0.999, epsilon: 0.0000001)",
        ),
        ("rmsprop", "rmsprop(lr: 0.01, rho: 0.9, epsilon: 0.0000001)"),
        (
            "rmsprop_momentum",
            "rmsprop(lr: 0.01, rho: 0.9, momentum: 0.5, epsilon: 0.0000001)",
        ),
        ("sgd_clip", "clip_by_global_norm(sgd(lr: 0.1), norm: 0.2)"),
    ];
    let names: Vec<&str> = f["optimizers"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(names.len(), cases.len(), "every fixture case is tested");
    for (name, opt) in cases {
        run(name, opt, &f);
    }
}

/// The optimisers TensorFlow defines differently from PyTorch, or PyTorch lacks,
/// against TensorFlow's own trajectories (`scripts/tf_optim_reference.py` wrote
/// tests/fixtures/tf_optim_reference.json).
#[test]
fn tensorflow_optimisers_match_tensorflow() {
    let f = read_fixture("tf_optim_reference.json");
    let cases = [
        ("adagrad", "adagrad(lr: 0.1, initial_accumulator_value: 0.1, epsilon: 0.0000001)"),
        ("ftrl", "ftrl(lr: 0.1, l1: 0.01, l2: 0.01)"),
        (
            "ftrl_shrinkage",
            "ftrl(lr: 0.1, l1: 0.001, l2: 0.02, l2_shrinkage: 0.01, beta: 0.5)",
        ),
        (
            "ftrl_power",
            "ftrl(lr: 0.05, learning_rate_power: -0.25, initial_accumulator_value: 0.2)",
        ),
        ("tf_rmsprop", "tf_rmsprop(lr: 0.01, rho: 0.9, epsilon: 0.0000000001)"),
        (
            "tf_rmsprop_momentum",
            "tf_rmsprop(lr: 0.01, rho: 0.9, momentum: 0.5, epsilon: 0.001)",
        ),
        ("tf_adam", "tf_adam(lr: 0.01, epsilon: 0.00000001)"),
        (
            "tf_adam_large_epsilon",
            "tf_adam(lr: 0.01, beta1: 0.8, beta2: 0.99, epsilon: 0.1)",
        ),
        (
            "bert_adamw",
            "adamw(lr: 0.01, weight_decay: 0.01, epsilon: 0.000001, bias_correction: false)",
        ),
        (
            "bert_adamw_excluded",
            "adamw(lr: 0.01, weight_decay: 0.01, epsilon: 0.000001, bias_correction: false, exclude_from_weight_decay: [\"LayerNorm\", \"w\"])",
        ),
    ];
    let names: Vec<&str> = f["optimizers"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(names.len(), cases.len(), "every fixture case is tested");
    for (name, opt) in cases {
        run_against(name, opt, &f, "TensorFlow");
    }
}

struct Rates(Arc<Mutex<Vec<(i64, f64)>>>);

impl RunHook for Rates {
    fn after_step(&mut self, i: &StepInfo) -> Action {
        // the rate of a step is the schedule at the step's global step before it ran
        self.0
            .lock()
            .unwrap()
            .push((i.global_step - 1, i.learning_rate));
        Action::Continue
    }
}

#[test]
fn schedules_match_reference_values() {
    let f = fixture();
    let cases = [
        (
            "exponential_decay",
            "exponential_decay(0.1, global_step, 100, 0.96)",
        ),
        (
            "exponential_decay_staircase",
            "exponential_decay(0.1, global_step, 100, 0.96, staircase: true)",
        ),
        (
            "cosine_decay",
            "cosine_decay(0.1, global_step, 250, alpha: 0.1)",
        ),
        ("linear_warmup", "linear_warmup(0.1, global_step, 100)"),
        (
            "polynomial_decay",
            "polynomial_decay(0.1, global_step, 250, end_lr: 0.001, power: 2.0)",
        ),
        (
            "piecewise_constant",
            "piecewise_constant(global_step, [50, 250], [0.1, 0.01, 0.001])",
        ),
    ];
    for (name, schedule) in cases {
        let src = program(
            &format!("sgd(lr: {schedule})"),
            "range(1) |> map |i| (broadcast_to(cast(i, f32), [4]), i) |> repeat |> batch(1, drop_remainder: true)",
        );
        let p = Program::from_source("sched.est", &src, None);
        let dir = std::env::temp_dir().join(format!("est-sched-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let opts = RunOptions {
            model_dir: Some(dir.clone()),
            config: vec![("save_checkpoint_steps".into(), 100_000)],
            ..Default::default()
        };
        let mut e = Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{name}: {:?}", f.diags));
        let rates = Arc::new(Mutex::new(Vec::new()));
        e.add_hook(Box::new(Rates(rates.clone()))).unwrap();
        e.train(Steps::Max(1001)).unwrap();
        let rates = rates.lock().unwrap();
        let steps = floats(&f["schedules"][name]["steps"]);
        let want = floats(&f["schedules"][name]["values"]);
        for (s, v) in steps.iter().zip(want) {
            let got = rates.iter().find(|r| r.0 == *s as i64).unwrap().1;
            assert!(
                (got - v).abs() <= 1e-6 * v.abs().max(1e-3) + 1e-7,
                "{name} at step {s}: {got} vs {v}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `moving_average` keeps `w/ExponentialMovingAverage`, starting at `w`'s initial
/// value and moving towards each new `w` (PyTorch's SGD trajectory of the fixture):
/// `avg -= (1 - d) (avg - w)`, with `d` fixed or ramped by the step
/// (`min(decay, (1 + t) / (10 + t))`); evaluation reads the average, not `w`. On every
/// target.
#[test]
fn moving_averages_follow_the_weights_and_evaluation_reads_them() {
    let f = fixture();
    let grads: Vec<Vec<f64>> = f["grads"].as_array().unwrap().iter().map(floats).collect();
    let sgd: Vec<Vec<f64>> = f["optimizers"]["sgd"]["trajectory"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    for (decay, ramp) in [(0.5, false), (0.9, true)] {
        for target in targets() {
            let tag = format!("ema-{decay}-{target:?}");
            let dir = std::env::temp_dir().join(format!("est-optim-{}-{tag}", std::process::id()));
            write_grads(&dir, &grads);
            let src = program(
                &format!("moving_average(sgd(lr: 0.1), decay: {decay}, num_updates: {ramp})"),
                "csv(\"grads.csv\", header: false, columns: { g: f32[4], label: i32 }) |> map |r| (r.g, r.label) |> repeat |> batch(1, drop_remainder: true)",
            )
            .replace(
                "  train_input = grads()",
                "  train_input = grads()\n  eval_input = csv(\"grads.csv\", header: false, columns: { g: f32[4], label: i32 }) |> map |r| (r.g, r.label) |> take(1) |> batch(1)",
            );
            let p = Program::from_source("ema.est", &src, None);
            let opts = RunOptions {
                target,
                model_dir: Some(dir.join("run")),
                data_dir: Some(dir.clone()),
                ..Default::default()
            };
            let mut e =
                Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{tag}: {:?}", f.diags));
            e.restore_or_init().unwrap();
            let w0 = floats(&f["w0"]);
            let ty = TensorType::new(DType::F32, vec![4]);
            e.set_variable("w", Tensor::from_f64(&ty, w0.clone()))
                .unwrap();
            e.set_variable(
                "w/ExponentialMovingAverage",
                Tensor::from_f64(&ty, w0.clone()),
            )
            .unwrap();
            let mut avg = w0;
            for (t, w_t) in sgd.iter().enumerate() {
                e.train(Steps::Add(1)).unwrap();
                let step = (t + 1) as f64;
                let d = if ramp {
                    f64::min(decay, (1.0 + step) / (10.0 + step))
                } else {
                    decay
                };
                for (a, w) in avg.iter_mut().zip(w_t) {
                    *a -= (1.0 - d) * (*a - w);
                }
                let got = e.variables()["w/ExponentialMovingAverage"].to_f64();
                for i in 0..4 {
                    assert!(
                        (got[i] - avg[i]).abs() <= 1e-5 * avg[i].abs().max(1.0),
                        "{tag} step {}: average {} against {}",
                        t + 1,
                        got[i],
                        avg[i]
                    );
                }
            }
            // the eval loss is sum(g_0 * w) of the average
            let want: f64 = grads[0].iter().zip(&avg).map(|(g, a)| g * a).sum();
            let raw: f64 = grads[0].iter().zip(&sgd[5]).map(|(g, w)| g * w).sum();
            let ev = e.evaluate(None).unwrap();
            assert!(
                (ev.loss - want).abs() <= 1e-5 * want.abs().max(1.0) && (want - raw).abs() > 1e-3,
                "{tag}: eval loss {} against {want} (the raw weights' {raw})",
                ev.loss
            );
        }
    }
}

/// A small CNN in mixed precision or not: `half` casts the features to f16 (the layers
/// then compute in f16 with their f32 weights cast), `scale` wraps the optimiser in
/// `loss_scale` (`""` for none), `boost` multiplies the loss.
fn mixed(half: bool, scale: &str, boost: f64) -> String {
    let opt = if scale.is_empty() {
        "sgd(lr: 0.05)".to_string()
    } else {
        format!("loss_scale(sgd(lr: 0.05){scale})")
    };
    format!(
        r#"
use std.nn.{{dense, conv2d, batch_norm}}
use std.losses.softmax_cross_entropy
model m(features: f32[B, 6, 6, 1], labels: i32[B]) {{
  let x = {x}
  let x = conv2d(x, 3, kernel: 3) |> batch_norm |> relu
  let x = dense(reshape(x, [B, 108]), 8, activation: relu)
  let logits = cast(dense(x, 3), f32)
  let loss = softmax_cross_entropy(labels, logits) * {boost:?}
  train {{ minimize loss with {opt} }}
}}
estimator e {{
  model = m
  train_input = synthetic(features: f32[6, 6, 1], labels: i32, classes: 3, count: 32) |> repeat |> batch(8, drop_remainder: true)
  config {{ random_seed = 3  iterations_per_loop = 1  save_checkpoint_steps = 1000 }}
}}
"#,
        x = if half {
            "cast(features, f16)"
        } else {
            "features"
        }
    )
}

fn trained(
    src: &str,
    target: est::elab::Target,
    tag: &str,
    steps: i64,
) -> rustc_hash::FxHashMap<String, Tensor> {
    let p = Program::from_source("mixed.est", src, None);
    let dir =
        std::env::temp_dir().join(format!("est-mixed-{}-{tag}-{target:?}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = RunOptions {
        target,
        model_dir: Some(dir.clone()),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{tag}: {:?}", f.diags));
    if steps > 0 {
        e.train(Steps::Max(steps as u64)).unwrap();
    } else {
        e.restore_or_init().unwrap();
    }
    let v = e.variables();
    let _ = std::fs::remove_dir_all(&dir);
    v
}

fn weights(v: &rustc_hash::FxHashMap<String, Tensor>) -> Vec<(String, Vec<f64>)> {
    let mut w: Vec<(String, Vec<f64>)> = v
        .iter()
        .filter(|(k, _)| k.ends_with("/kernel") || k.ends_with("/bias"))
        .map(|(k, t)| (k.clone(), t.to_f64()))
        .collect();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

/// The targets that run mixed precision: the wafer refuses it (E0601).
fn cpu_targets() -> Vec<est::elab::Target> {
    targets()
        .into_iter()
        .filter(|t| *t != est::elab::Target::Wafer)
        .collect()
}

/// Layers on an f16 input compute in f16 with f32 variables (batch norm in f32): the
/// variables stay f32, training follows the f32 run to f16's precision (and is not the
/// f32 run), and the host computes what the interpreter does, to 1e-3.
#[test]
fn mixed_precision_trains_f32_weights_through_f16_layers() {
    let mut runs = Vec::new();
    for target in cpu_targets() {
        let v = trained(&mixed(true, "", 1.0), target, "half", 10);
        for (k, t) in &v {
            assert_eq!(t.dtype, est::ir::DType::F32, "{target:?}: {k} stays f32");
        }
        runs.push(weights(&v));
    }
    if runs.len() == 2 {
        // the host rounds to f16 as the interpreter does; batch norm's sums, in f32 in
        // another order, can tip an f16 rounding, which ten steps carry on
        for ((k, a), (_, b)) in runs[0].iter().zip(&runs[1]) {
            let far = a
                .iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            assert!(far <= 1e-3, "{k}: host and interpreter differ by {far}");
        }
    }
    let full = weights(&trained(
        &mixed(false, "", 1.0),
        est::elab::Target::Interp,
        "full",
        10,
    ));
    let start = weights(&trained(
        &mixed(false, "", 1.0),
        est::elab::Target::Interp,
        "start",
        0,
    ));
    let (mut moved, mut off, mut differs) = (0.0f64, 0.0f64, false);
    for (((k, h), (_, f)), (_, s)) in runs[0].iter().zip(&full).zip(&start) {
        for ((a, b), c) in h.iter().zip(f).zip(s) {
            moved = moved.max((b - c).abs());
            off = off.max((a - b).abs());
            differs |= a != b;
        }
        assert!(!k.is_empty());
    }
    assert!(differs, "the f16 run computes in f16");
    assert!(
        off < 0.05 * moved,
        "f16 training stays near f32's: off by {off}, while training moved weights by {moved}"
    );
}

/// A fixed loss scale changes nothing an f32 model computes, beyond rounding (1000 is
/// no power of two: scaling and unscaling round).
#[test]
fn a_fixed_loss_scale_leaves_f32_training_as_it_was() {
    let plain = weights(&trained(
        &mixed(false, "", 1.0),
        est::elab::Target::Interp,
        "plain",
        5,
    ));
    let scaled = weights(&trained(
        &mixed(false, ", scale: 1000.0", 1.0),
        est::elab::Target::Interp,
        "fixed",
        5,
    ));
    for ((k, a), (_, b)) in plain.iter().zip(&scaled) {
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{k}: {x} vs {y}");
        }
    }
}

/// A dynamic loss scale skips the steps whose f16 gradients overflow, halving the
/// scale each time, until they fit; after `growth_interval` finite steps it doubles.
#[test]
fn a_dynamic_loss_scale_skips_overflowing_steps_and_grows_after_good_ones() {
    for target in cpu_targets() {
        let scale_of =
            |v: &rustc_hash::FxHashMap<String, Tensor>| v[est::ir::LOSS_SCALE].to_f64()[0];
        let start = weights(&trained(&mixed(true, "", 1.0), target, "dyn-start", 0));
        // a loss 1000 times larger: its gradients times 32768 pass f16's 65504
        let boosted = mixed(true, ", initial: 32768.0, growth_interval: 1000", 1000.0);
        let two = trained(&boosted, target, "dyn-2", 2);
        assert_eq!(scale_of(&two), 8192.0, "{target:?}: halved twice");
        assert_eq!(weights(&two), start, "{target:?}: both steps skipped");
        let many = trained(&boosted, target, "dyn-12", 12);
        let s = scale_of(&many);
        assert!((1.0..8192.0).contains(&s), "{target:?}: {s}");
        assert_ne!(weights(&many), start, "{target:?}: finite steps train");
        // no overflow: the scale doubles every 2 steps
        let calm = trained(
            &mixed(true, ", initial: 4.0, growth_interval: 2", 1.0),
            target,
            "dyn-grow",
            4,
        );
        assert_eq!(scale_of(&calm), 16.0, "{target:?}");
        assert_eq!(calm[est::ir::GOOD_STEPS].to_f64()[0], 0.0, "{target:?}");
    }
}
