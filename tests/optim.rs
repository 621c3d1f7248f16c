//! Optimisers and learning-rate schedules against reference values computed by
//! PyTorch (`scripts/optim_reference.py` wrote tests/fixtures/optim_reference.json).
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
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/optim_reference.json"
    );
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
  let loss = reduce_sum(reshape(features, [4]) * w)
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

fn run(name: &str, optimizer: &str, f: &Value) {
    let dir = std::env::temp_dir().join(format!("est-optim-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let grads: Vec<Vec<f64>> = f["grads"].as_array().unwrap().iter().map(floats).collect();
    let csv: String = grads
        .iter()
        .map(|g| {
            format!(
                "{},0\n",
                g.iter()
                    .map(|x| format!("{x:?}"))
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
        .collect();
    std::fs::write(dir.join("grads.csv"), csv).unwrap();
    let src = program(
        optimizer,
        "csv(\"grads.csv\", header: false, columns: { g: f32[4], label: i32 }) |> map |r| (r.g, r.label) |> batch(1, drop_remainder: true)",
    );
    let p = Program::from_source("optim.est", &src, None);
    let opts = RunOptions {
        model_dir: Some(dir.join("run")),
        data_dir: Some(dir.clone()),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{name}: {:?}", f.diags));
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
                "{name} step {}: w[{i}] = {} but PyTorch has {}",
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
