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
