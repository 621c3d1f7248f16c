//! Train-and-evaluate (issue 13 §5): `Estimator::train_and_evaluate` and `estc train
//! --eval-every N` evaluate every N steps from a fresh checkpoint, write the eval
//! summaries, keep the best checkpoint (`keep_best`), stop when a metric stops
//! improving (`early_stopping`, or a Rust hook's `after_eval`), and an eval section may
//! report a loss of its own (`loss = ...`).

mod common;
use est::elab::Target;
use est::runtime::{Action, Estimator, EvalInfo, RunHook, RunOptions, Steps};
use est::Program;
use std::sync::{Arc, Mutex};

/// A small classifier; `HOOKS` and `EVAL_LOSS` are replaced per test.
const SRC: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
use std.metrics.{accuracy, mean}
use std.hooks.{early_stopping, keep_best}

fn example(i) {
  let x = cast(i % 7, f32) / 7.0;
  (reshape(x, [1]) * fill([4], 1.0) + reshape(cast(i % 3, f32), [1]), (i % 7) / 3)
}

input examples(training: bool) {
  let rows = range(64) |> map |i| example(i)
  let rows = if training { rows |> shuffle(64) |> repeat } else { rows }
  rows |> batch(16, drop_remainder: training)
}

model m(features: f32[B, 4], labels: i32[B]) {
  let logits = dense(dense(features, 8, activation: relu), 3)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with adam(lr: 0.05) }
  eval {
    metric acc = accuracy(labels, argmax(logits))
    metric zero = mean(reduce_sum(features, axis: 1) * 0.0)
    EVAL_LOSS
  }
}

estimator m {
  model = m
  train_input = examples(true)
  eval_input = examples(false)
  hooks = [HOOKS]
  config { save_checkpoint_steps = 1000  random_seed = 3 }
}
"#;

fn estimator(tag: &str, hooks: &str, eval_loss: &str) -> (Estimator, std::path::PathBuf) {
    let dir = common::scratch("train_eval", tag);
    let src = SRC.replace("HOOKS", hooks).replace("EVAL_LOSS", eval_loss);
    let p = Program::from_source("te.est", &src, None);
    assert!(
        !p.diags
            .iter()
            .any(|d| d.severity() == est::diag::Severity::Error),
        "{:?}",
        p.diags
    );
    let opts = RunOptions {
        target: Target::Interp,
        model_dir: Some(dir.clone()),
        ..Default::default()
    };
    let e = Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{:?}", f.diags));
    (e, dir)
}

#[test]
fn evaluates_every_n_steps_and_keeps_the_best_checkpoint() {
    let (mut e, dir) = estimator("best", "keep_best(monitor: \"loss\")", "");
    let r = e.train_and_evaluate(Steps::Max(20), 5).unwrap();
    let steps: Vec<i64> = r.evals.iter().map(|e| e.global_step).collect();
    assert_eq!(steps, [5, 10, 15, 20]);
    assert_eq!(r.train.global_step, 20);
    assert!(r.train.stopped_early.is_none());
    // each evaluation is of the checkpoint at its step, over the whole eval input
    assert!(r.evals.iter().all(|e| e.examples == 64));
    let (best_step, best_loss) = r
        .evals
        .iter()
        .map(|e| (e.global_step, e.loss))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("best/best.json")).unwrap())
            .unwrap();
    assert_eq!(record["global_step"], best_step);
    assert_eq!(record["metric"], "loss");
    assert_eq!(record["value"].as_f64().unwrap(), best_loss);
    let kept = est::runtime::checkpoint::steps(&dir.join("best")).unwrap();
    assert_eq!(kept, [best_step], "one best checkpoint");
    // the best directory is a model_dir: evaluating it gives the loss it was kept for
    let p = Program::from_source(
        "te.est",
        &SRC.replace("HOOKS", "").replace("EVAL_LOSS", ""),
        None,
    );
    let opts = RunOptions {
        target: Target::Interp,
        model_dir: Some(dir.join("best")),
        ..Default::default()
    };
    let mut b = Estimator::new(&p, &opts).unwrap();
    let again = b.evaluate(None).unwrap();
    assert_eq!(again.global_step, best_step);
    assert!((again.loss - best_loss).abs() <= 1e-12 * best_loss.abs().max(1.0));
    // the evaluations' summaries, by step; the stretches of training write one file
    let scalars = |d: &std::path::Path| -> Vec<Vec<(i64, String, f32)>> {
        let mut files: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().contains("events.out.tfevents"))
            .collect();
        files.sort();
        files
            .iter()
            .map(|f| est::runtime::summary::read_scalars(f).unwrap())
            .collect()
    };
    let train = scalars(&dir);
    assert_eq!(train.len(), 1, "one train event file");
    let losses: Vec<i64> = train[0]
        .iter()
        .filter(|s| s.1 == "loss")
        .map(|s| s.0)
        .collect();
    assert_eq!(losses, [5, 10, 15, 20]);
    let evals: Vec<(i64, String, f32)> = scalars(&dir.join("eval")).concat();
    for s in [5, 10, 15, 20] {
        assert!(
            evals
                .iter()
                .any(|(step, tag, _)| *step == s && tag == "acc"),
            "eval summary of acc at step {s}: {evals:?}"
        );
    }
}

#[test]
fn early_stopping_ends_training_when_a_metric_stops_improving() {
    // `zero` never improves on its first value: after `patience` more evaluations the
    // hook stops training
    let (mut e, _) = estimator(
        "early",
        "early_stopping(monitor: \"zero\", patience: 2, mode: \"max\")",
        "",
    );
    let r = e.train_and_evaluate(Steps::Max(100), 4).unwrap();
    let steps: Vec<i64> = r.evals.iter().map(|e| e.global_step).collect();
    assert_eq!(steps, [4, 8, 12]);
    assert_eq!(r.train.global_step, 12);
    let why = r.train.stopped_early.unwrap();
    assert!(
        why.contains("after the evaluation at global step 12"),
        "{why}"
    );
    // `min_steps` holds it off until then
    let (mut e, _) = estimator(
        "early-min",
        "early_stopping(monitor: \"zero\", patience: 1, mode: \"max\", min_steps: 16)",
        "",
    );
    let r = e.train_and_evaluate(Steps::Max(100), 4).unwrap();
    assert_eq!(r.train.global_step, 16);
}

/// A Rust hook sees each evaluation and may stop training, as `early_stopping` does.
struct StopAtAccuracy(Arc<Mutex<Vec<(i64, f64)>>>);

impl RunHook for StopAtAccuracy {
    fn after_eval(&mut self, info: &EvalInfo) -> Action {
        let acc = info.metric("acc").unwrap();
        self.0.lock().unwrap().push((info.global_step, acc));
        assert!(info.checkpoint.exists(), "{}", info.checkpoint.display());
        if info.global_step >= 6 {
            Action::Stop
        } else {
            Action::Continue
        }
    }
}

#[test]
fn a_rust_hook_watches_evaluations() {
    let (mut e, _) = estimator("rust-hook", "", "");
    let seen = Arc::new(Mutex::new(Vec::new()));
    e.add_hook(Box::new(StopAtAccuracy(seen.clone()))).unwrap();
    let r = e.train_and_evaluate(Steps::Max(50), 3).unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.iter().map(|s| s.0).collect::<Vec<_>>(), [3, 6]);
    let accs: Vec<f64> = r.evals.iter().map(|e| e.metrics[0].1).collect();
    assert_eq!(seen.iter().map(|s| s.1).collect::<Vec<_>>(), accs);
    assert_eq!(r.train.global_step, 6);
}

#[test]
fn a_hook_watching_an_unknown_metric_is_e0201() {
    let (mut e, _) = estimator("unknown", "early_stopping(monitor: \"accuracy\")", "");
    let f = e.train_and_evaluate(Steps::Max(10), 5).unwrap_err();
    let d = &f.diags[0];
    assert_eq!(d.code, est::diag::Code::UnknownName);
    assert!(d.message.contains("`accuracy`"), "{}", d.message);
    assert!(
        d.help
            .as_deref()
            .unwrap_or("")
            .contains("the evaluation reports `loss`, `acc`, `zero`"),
        "{:?}",
        d.help
    );
}

#[test]
fn an_eval_section_reports_a_loss_of_its_own() {
    let (mut a, _) = estimator("own-loss-a", "", "");
    a.train(Steps::Max(5)).unwrap();
    let base = a.evaluate(None).unwrap().loss;
    let (mut b, _) = estimator(
        "own-loss-b",
        "",
        "loss = softmax_cross_entropy(labels, logits) * 3.0",
    );
    b.train(Steps::Max(5)).unwrap();
    let own = b.evaluate(None).unwrap().loss;
    assert!(
        (own - 3.0 * base).abs() <= 1e-6 * own.abs(),
        "{own} against 3 x {base}"
    );
}

/// A train input that ends at an evaluation's step is not evaluated twice.
#[test]
fn an_input_ending_at_an_evaluation_is_evaluated_once() {
    let dir = common::scratch("train_eval", "ends");
    let src = SRC
        .replace("HOOKS", "")
        .replace("EVAL_LOSS", "")
        .replace("rows |> shuffle(64) |> repeat", "rows");
    let p = Program::from_source("te.est", &src, None);
    let opts = RunOptions {
        target: Target::Interp,
        model_dir: Some(dir),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).unwrap();
    // 64 rows in batches of 16: the input ends after step 4
    let r = e.train_and_evaluate(Steps::Max(100), 2).unwrap();
    let steps: Vec<i64> = r.evals.iter().map(|e| e.global_step).collect();
    assert_eq!(steps, [2, 4]);
    assert_eq!(r.train.global_step, 4);
    assert!(r.train.final_loss.is_finite());
    assert!(r.train.stopped_early.unwrap().contains("input ended"));
}

/// `mode: "auto"` goes by the metric's kind; a mean could go either way and is refused.
#[test]
fn auto_mode_needs_a_metric_whose_direction_is_known() {
    let (mut e, _) = estimator("auto", "early_stopping(monitor: \"zero\")", "");
    let f = e.train_and_evaluate(Steps::Max(10), 5).unwrap_err();
    assert_eq!(f.diags[0].code, est::diag::Code::InvalidEstimator);
    assert!(f.diags[0]
        .message
        .contains("cannot tell which way `zero` improves"));
    // accuracy improves upwards without being told
    let (mut e, dir) = estimator("auto-acc", "keep_best(monitor: \"acc\")", "");
    let r = e.train_and_evaluate(Steps::Max(10), 5).unwrap();
    let best = r
        .evals
        .iter()
        .map(|e| e.metrics[0].1)
        .fold(f64::MIN, f64::max);
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("best/best.json")).unwrap())
            .unwrap();
    assert_eq!(record["value"].as_f64().unwrap(), best);
    assert_eq!(record["higher_is_better"], true);
}
