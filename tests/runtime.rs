//! The Estimator runtime end to end: training to accuracy, determinism, exact resume
//! after SIGKILL, shards, checkpoints, summaries, metrics, hooks, smoke runs, and every
//! run-time diagnostic (E09xx).

use est::diag::Code;
use est::elab::Target;
use est::runtime::{
    checkpoint, metrics, summary, Action, Estimator, Reducer, RunHook, RunOptions, StepInfo, Steps,
};
use est::tensor::Tensor;
use est::Program;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("est-runtime-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn digits(params: &[(&str, &str)]) -> Program {
    let mut p = Program::load(&root().join("examples/digits_mlp.est")).unwrap();
    for (k, v) in params {
        p.add_override(k, v, &format!("--param {k}"));
    }
    p
}

fn estimator(p: &Program, dir: &Path, config: &[(&str, i64)]) -> Estimator {
    let opts = RunOptions {
        model_dir: Some(dir.to_path_buf()),
        config: config.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        ..Default::default()
    };
    match Estimator::new(p, &opts) {
        Ok(e) => e,
        Err(f) => panic!("{:?}", f.diags),
    }
}

fn codes(f: est::runtime::RunFailure) -> Vec<Code> {
    f.diags.iter().map(|d| d.code).collect()
}

/// The main job: the digits MLP reaches at least 0.95 accuracy on the held-out test
/// split (360 images).
#[test]
fn digits_mlp_reaches_95_percent() {
    let dir = tmp("digits");
    let mut e = estimator(&digits(&[]), &dir, &[]);
    let r = e.train(Steps::Default).unwrap();
    assert_eq!(r.global_step, 1500);
    let m = e.evaluate(None).unwrap();
    assert_eq!(m.steps, 9, "9 batches of 40: every test row");
    let acc = m.metrics.iter().find(|(k, _)| k == "accuracy").unwrap().1;
    assert!(acc >= 0.95, "test accuracy {acc}");
    // a second train call has nothing left to do: train_steps is a total
    let again = e.train(Steps::Default).unwrap();
    assert_eq!((again.start_step, again.global_step), (1500, 1500));
    // predictions: one line per test example, classes agree with the accuracy
    let out = dir.join("pred");
    let p = e.predict(&out, None).unwrap();
    assert_eq!(p.examples, 360);
    let lines = std::fs::read_to_string(out.join("predictions.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 360);
    let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    let probs: f64 = first["probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .sum();
    assert!((probs - 1.0).abs() < 1e-5);
    let npy = std::fs::read(out.join("classes.npy")).unwrap();
    assert!(npy.starts_with(b"\x93NUMPY"));
    assert_eq!(
        npy.len() % 64,
        (360 * 4) % 64,
        "header padded to 64 bytes, then 360 i32"
    );
}

#[test]
fn fixed_seed_training_is_deterministic() {
    let run = |name: &str| {
        let dir = tmp(name);
        let mut e = estimator(&digits(&[]), &dir, &[]);
        e.train(Steps::Max(120)).unwrap();
        std::fs::read(checkpoint::tensors_path(&dir, 120)).unwrap()
    };
    assert_eq!(run("det-a"), run("det-b"));
}

/// Kills `estc train` with SIGKILL at several points (and once inside a checkpoint
/// write), restarts it each time, and compares the final weights with an
/// uninterrupted run's: identical bytes. On the interpreter and on the host.
#[test]
fn resume_after_sigkill_is_bit_identical() {
    let targets: &[&str] = if cfg!(feature = "llvm") {
        &["interp", "host"]
    } else {
        &["interp"]
    };
    for target in targets {
        resume_after_sigkill_on(target);
    }
}

fn resume_after_sigkill_on(target: &str) {
    let bin = env!("CARGO_BIN_EXE_estc");
    let file = root().join("examples/digits_mlp.est");
    let train = |dir: &Path, fault: Option<&str>| {
        let mut c = std::process::Command::new(bin);
        c.args([
            "train",
            file.to_str().unwrap(),
            "--max-steps",
            "400",
            "--target",
            target,
            "--model-dir",
            dir.to_str().unwrap(),
        ])
        .args([
            "--config",
            "save_checkpoint_steps=50",
            "--config",
            "iterations_per_loop=25",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        if let Some(f) = fault {
            c.env("EST_FAULT", f);
        }
        c
    };
    let whole = tmp(&format!("resume-whole-{target}"));
    assert!(train(&whole, None).status().unwrap().success());
    let want = std::fs::read(checkpoint::tensors_path(&whole, 400)).unwrap();

    let dir = tmp(&format!("resume-killed-{target}"));
    // a crash in the middle of writing the checkpoint of step 100
    let st = train(&dir, Some("checkpoint-write:100")).status().unwrap();
    assert!(!st.success(), "the fault aborts the process");
    assert_eq!(
        checkpoint::latest(&dir).unwrap().map(|c| c.step),
        Some(50),
        "the torn checkpoint is not used"
    );
    // SIGKILL at several moments
    for delay_ms in [300u64, 700, 1100] {
        let mut child = train(&dir, None).spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
    }
    assert!(train(&dir, None).status().unwrap().success());
    let got = std::fs::read(checkpoint::tensors_path(&dir, 400)).unwrap();
    assert!(
        got == want,
        "{target}: resumed weights differ from the uninterrupted run's"
    );
}

/// `num_shards = 2` with per-shard batch 16 equals one shard on the global batch of 32.
#[test]
fn two_shards_equal_one_shard_on_the_global_batch() {
    let one = tmp("shards-1");
    let two = tmp("shards-2");
    let mut a = estimator(&digits(&[]), &one, &[("num_shards", 1)]);
    let mut b = estimator(&digits(&[]), &two, &[("num_shards", 2)]);
    a.train(Steps::Max(20)).unwrap();
    b.train(Steps::Max(20)).unwrap();
    let mut worst = 0f64;
    let vars_b = b.variables();
    for (k, va) in a.variables() {
        let vb = &vars_b[&k];
        for (x, y) in va.to_f64().iter().zip(vb.to_f64()) {
            worst = worst.max((x - y).abs());
        }
    }
    assert!(worst <= 1e-5, "largest difference {worst}");
    // the sharded evaluation reduces its reducers across shards: 4 steps of 2 shards
    // see the same 320 rows as 8 steps of one
    let ea = a.evaluate(Some(8)).unwrap();
    let eb = b.evaluate(Some(4)).unwrap();
    assert_eq!(ea.metrics, eb.metrics);
}

#[test]
fn checkpoints_are_pruned_and_summaries_readable() {
    let dir = tmp("ckpt");
    let mut e = estimator(
        &digits(&[]),
        &dir,
        &[
            ("save_checkpoint_steps", 100),
            ("keep_checkpoint_max", 2),
            ("save_summary_steps", 50),
            ("iterations_per_loop", 50),
        ],
    );
    e.train(Steps::Max(300)).unwrap();
    let steps: Vec<i64> = checkpoint::list(&dir)
        .unwrap()
        .iter()
        .map(|c| c.step)
        .collect();
    assert_eq!(steps, [200, 300]);
    let (meta, vars) = checkpoint::load(&checkpoint::latest(&dir).unwrap().unwrap()).unwrap();
    assert_eq!(meta.global_step, 300);
    assert_eq!(meta.seed, 7);
    assert_eq!(meta.input_position, 300);
    // weights and the optimiser's momentum slots
    assert!(vars.contains_key("dense/kernel") && vars.contains_key("dense/kernel/momentum"));
    let events: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("events.out.tfevents")
        })
        .collect();
    assert_eq!(events.len(), 1);
    let scalars = summary::read_scalars(&events[0]).unwrap();
    let at =
        |tag: &str| -> Vec<i64> { scalars.iter().filter(|s| s.1 == tag).map(|s| s.0).collect() };
    assert_eq!(at("loss"), [50, 100, 150, 200, 250, 300]);
    assert_eq!(at("learning_rate"), at("loss"));
    assert_eq!(at("global_step/sec").len(), 6);
    assert!(scalars
        .iter()
        .filter(|s| s.1 == "learning_rate")
        .all(|s| (s.2 - 0.1).abs() < 1e-7));
    let m = e.evaluate(Some(2)).unwrap();
    let eval_events: Vec<PathBuf> = std::fs::read_dir(dir.join("eval"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let ev = summary::read_scalars(&eval_events[0]).unwrap();
    assert_eq!(ev.len(), 2);
    assert!(ev.iter().all(|s| s.0 == 300));
    assert_eq!(ev[0].1, "accuracy");
    assert_eq!(ev[0].2 as f64, m.metrics[0].1 as f32 as f64);
    assert_eq!(ev[1].1, "loss");
}

#[test]
fn a_checkpoint_of_another_program_is_refused_by_name() {
    let dir = tmp("mismatch");
    estimator(&digits(&[]), &dir, &[])
        .train(Steps::Max(10))
        .unwrap();
    let mut other = estimator(&digits(&[("hidden", "[100, 64]")]), &dir, &[]);
    let f = other.train(Steps::Max(20)).unwrap_err();
    assert_eq!(codes(f.clone_diags()), [Code::CheckpointMismatch]);
    let msg = &f.diags[0].message;
    assert!(
        msg.contains(
            "`dense/kernel` is f32[64, 128] in the checkpoint but f32[64, 100] in the program"
        ),
        "{msg}"
    );
    assert!(msg.contains("`dense_1/kernel`"), "{msg}");
}

trait CloneDiags {
    fn clone_diags(&self) -> est::runtime::RunFailure;
}

impl CloneDiags for est::runtime::RunFailure {
    fn clone_diags(&self) -> est::runtime::RunFailure {
        est::runtime::RunFailure {
            diags: self.diags.clone(),
        }
    }
}

#[test]
fn a_nan_loss_stops_training_and_keeps_the_last_checkpoint() {
    let dir = tmp("nan");
    estimator(
        &digits(&[]),
        &dir,
        &[("iterations_per_loop", 10), ("save_checkpoint_steps", 10)],
    )
    .train(Steps::Max(20))
    .unwrap();
    let before = std::fs::read(checkpoint::tensors_path(&dir, 20)).unwrap();
    let mut e = estimator(
        &digits(&[("learning_rate", "1e30")]),
        &dir,
        &[("iterations_per_loop", 10), ("save_checkpoint_steps", 10)],
    );
    let f = e.train(Steps::Max(100)).unwrap_err();
    assert_eq!(codes(f.clone_diags()), [Code::NonFiniteLoss]);
    let msg = &f.diags[0].message;
    assert!(msg.contains("at global step 2"), "{msg}");
    let help = f.diags[0].help.as_deref().unwrap_or_default();
    assert!(
        help.contains("ckpt-20.safetensors (global step 20), holds only finite values"),
        "{help}"
    );
    assert_eq!(
        checkpoint::latest(&dir).unwrap().unwrap().step,
        20,
        "nothing after the NaN was saved"
    );
    assert_eq!(
        std::fs::read(checkpoint::tensors_path(&dir, 20)).unwrap(),
        before
    );
}

#[derive(Default)]
struct Counts {
    begin: usize,
    before: usize,
    after: usize,
    saved: Vec<i64>,
    loaded: Vec<i64>,
    end: usize,
    losses: Vec<f64>,
}

struct Counter(Arc<Mutex<Counts>>, i64);

impl RunHook for Counter {
    fn begin(&mut self, _: i64, _: i64) {
        self.0.lock().unwrap().begin += 1;
    }
    fn before_step(&mut self, _: i64) {
        self.0.lock().unwrap().before += 1;
    }
    fn after_step(&mut self, i: &StepInfo) -> Action {
        let mut c = self.0.lock().unwrap();
        c.after += 1;
        c.losses.push(i.loss);
        if i.global_step >= self.1 {
            Action::Stop
        } else {
            Action::Continue
        }
    }
    fn checkpoint_saved(&mut self, step: i64, _: &Path) {
        self.0.lock().unwrap().saved.push(step);
    }
    fn checkpoint_loaded(&mut self, step: i64, _: &Path) {
        self.0.lock().unwrap().loaded.push(step);
    }
    fn end(&mut self, _: i64) {
        self.0.lock().unwrap().end += 1;
    }
}

#[test]
fn hooks_run_on_interp_and_are_refused_on_the_wafer() {
    let dir = tmp("hooks");
    let counts = Arc::new(Mutex::new(Counts::default()));
    let mut e = estimator(
        &digits(&[]),
        &dir,
        &[("iterations_per_loop", 10), ("save_checkpoint_steps", 20)],
    );
    e.add_hook(Box::new(Counter(counts.clone(), 35))).unwrap();
    let r = e.train(Steps::Max(100)).unwrap();
    assert_eq!(r.global_step, 35, "the hook stopped the run");
    assert!(r.stopped_early.is_some());
    {
        let c = counts.lock().unwrap();
        assert_eq!((c.begin, c.before, c.after, c.end), (1, 35, 35, 1));
        assert_eq!(
            c.saved,
            [20, 35],
            "every 20 steps at loop boundaries, and at the stop"
        );
    }
    let mut again = estimator(&digits(&[]), &dir, &[]);
    again
        .add_hook(Box::new(Counter(counts.clone(), 1000)))
        .unwrap();
    again.train(Steps::Add(5)).unwrap();
    assert_eq!(counts.lock().unwrap().loaded, [35]);

    let opts = RunOptions {
        target: Target::Wafer,
        model_dir: Some(tmp("wafer")),
        ..Default::default()
    };
    let mut w = Estimator::new(&digits(&[]), &opts)
        .map_err(|f| f.diags)
        .unwrap();
    let f = w.add_hook(Box::new(Counter(counts, 1))).unwrap_err();
    assert_eq!(codes(f), [Code::HooksOnWafer]);
    // without the hook, the wafer trains
    assert_eq!(w.train(Steps::Max(1)).unwrap().global_step, 1);
}

#[test]
fn smoke_mode_trains_saves_restores_and_evaluates_once() {
    let dir = tmp("smoke");
    let mut e = estimator(&digits(&[]), &dir, &[]);
    let lines = e.smoke().unwrap();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].starts_with("train: 1 step"));
    assert!(lines[1].contains("restored") && lines[1].contains("global step 1"));
    assert!(lines[2].starts_with("eval: 1 step") && lines[2].contains("accuracy"));
    assert!(
        checkpoint::list(&dir).unwrap().is_empty(),
        "smoke runs leave model_dir alone"
    );
}

/// A reducer counting examples with a positive label, registered from Rust and used
/// by `std.metrics.reducer` in the program.
struct Positives(f64);

impl Reducer for Positives {
    fn accumulate(&mut self, args: &[&Tensor]) {
        self.0 += args[0].to_f64().iter().filter(|&&v| v > 0.0).count() as f64;
    }
    fn merge(&mut self, other: &dyn Reducer) {
        self.0 += other.as_any().downcast_ref::<Positives>().unwrap().0;
    }
    fn result(&self) -> f64 {
        self.0
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

const CUSTOM: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
use std.metrics.{reducer, auc}

input rows(training: bool) {
  let r = csv("examples/data/digits_test.csv", columns: { pixels: f32[64], label: i32 })
    |> map |r| (r.pixels / 16.0, r.label)
  let r = if training { r |> repeat } else { r }
  r |> batch(40, drop_remainder: true)
}

model m(features: f32[B, 64], labels: i32[B]) {
  let logits = dense(features, 10)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with sgd(lr: 0.1) }
  eval {
    metric nonzero_labels = reducer("positives", labels)
    metric auc_of_zero = auc(cast(labels == 0, i32), squeeze(slice(softmax(logits), axis: 1, start: 0, end: 1), axis: 1))
  }
}

estimator e {
  model = m
  train_input = rows(training: true)
  eval_input = rows(training: false)
  config { random_seed = 3  num_shards = 2 }
}
"#;

#[test]
fn custom_and_exact_metrics_under_shards() {
    let p = Program::from_source("custom.est", CUSTOM, None);
    let dir = tmp("custom");
    let opts = RunOptions {
        model_dir: Some(dir),
        data_dir: Some(root()),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).map_err(|f| f.diags).unwrap();
    assert!(
        e.evaluate(None).is_err(),
        "an unregistered reducer is an error"
    );
    e.register_reducer(
        "positives",
        Arc::new(|| Box::new(Positives(0.0)) as Box<dyn Reducer>),
    );
    e.train(Steps::Max(30)).unwrap();
    let m = e.evaluate(None).unwrap();
    let labels: Vec<i64> = std::fs::read_to_string(root().join("examples/data/digits_test.csv"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.rsplit(',').next().unwrap().parse().unwrap())
        .collect();
    // 5 steps of 2 shards of 40 rows: the 9th batch goes to shard 0 alone, and every
    // row counts
    assert_eq!((m.steps, m.examples), (5, 360));
    let nonzero = labels.iter().filter(|&&l| l != 0).count() as f64;
    assert_eq!(m.metrics[0], ("nonzero_labels".to_string(), nonzero));
    let auc = m.metrics[1].1;
    assert!(auc > 0.9 && auc <= 1.0, "auc {auc}");
}

#[test]
fn auc_is_exact_and_merges_across_shards() {
    // scores and labels with ties; AUC by counting pairs
    let scores = [0.1, 0.4, 0.35, 0.8, 0.4, 0.7, 0.2, 0.9];
    let labels = [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0];
    let mut pairs = 0.0;
    let mut total = 0.0;
    for i in 0..8 {
        for j in 0..8 {
            if labels[i] == 1.0 && labels[j] == 0.0 {
                total += 1.0;
                pairs += if scores[i] > scores[j] {
                    1.0
                } else if scores[i] == scores[j] {
                    0.5
                } else {
                    0.0
                };
            }
        }
    }
    let f = |v: &[f64]| {
        Tensor::from_f64(
            &est::ir::TensorType::new(est::ir::DType::F32, vec![v.len()]),
            v.to_vec(),
        )
    };
    let make = metrics::builtin("auc").unwrap();
    let mut whole = make();
    whole.accumulate(&[&f(&labels), &f(&scores)]);
    let mut a = make();
    a.accumulate(&[&f(&labels[..3]), &f(&scores[..3])]);
    let mut b = make();
    b.accumulate(&[&f(&labels[3..]), &f(&scores[3..])]);
    a.merge(b.as_ref());
    assert_eq!(whole.result(), pairs / total);
    assert_eq!(a.result(), pairs / total);
}

const BROKEN: &str = r#"
use std.nn.dense
use std.nn.embedding
use std.losses.softmax_cross_entropy
use std.metrics.mean
use std.hooks.{stop_at_step_hook, nan_hook}

input rows(path: string) {
  csv(path, columns: { pixels: f32[64], label: i32 }) |> map |r| (r.pixels, r.label) |> batch(8, drop_remainder: true)
}

input forever() {
  csv("examples/data/digits_test.csv", columns: { pixels: f32[64], label: i32 }) |> map |r| (r.pixels, r.label) |> repeat |> batch(8, drop_remainder: true)
}

input labels_out_of_range() {
  csv("examples/data/digits_test.csv", columns: { pixels: f32[64], label: i32 }) |> map |r| (r.pixels, r.label + 1000) |> batch(8, drop_remainder: true)
}

model m(features: f32[B, 64], labels: i32[B]) {
  let emb = embedding(labels, 10, 4)
  let logits = dense(features, 10) + reduce_sum(emb, axis: 1, keep_dims: true)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with sgd(lr: 0.1) }
  eval { metric mean_loss = mean(loss) }
}

estimator missing { model = m  train_input = rows("no/such/file.csv") }
estimator bad_rows { model = m  train_input = rows("tests/fixtures/bad_rows.csv") }
estimator endless { model = m  train_input = forever()  eval_input = forever() }
estimator out_of_range { model = m  train_input = labels_out_of_range() }
estimator stops { model = m  train_input = forever()  hooks = [stop_at_step_hook(5), nan_hook()] }
"#;

fn broken(name: &str, target: Target) -> Estimator {
    let p = Program::from_source("broken.est", BROKEN, None);
    let opts = RunOptions {
        estimator: Some(name.into()),
        target,
        model_dir: Some(tmp(name)),
        data_dir: Some(root()),
        ..Default::default()
    };
    Estimator::new(&p, &opts).map_err(|f| f.diags).unwrap()
}

#[test]
fn runtime_errors_are_diagnostics() {
    let f = broken("missing", Target::Interp)
        .train(Steps::Max(1))
        .unwrap_err();
    assert_eq!(codes(f.clone_diags()), [Code::RunIo]);
    assert!(f.diags[0].message.contains("no/such/file.csv"));
    let f = broken("bad_rows", Target::Interp)
        .train(Steps::Max(1))
        .unwrap_err();
    assert_eq!(codes(f.clone_diags()), [Code::BadData]);
    assert!(
        f.diags[0].message.contains("bad_rows.csv:3"),
        "{}",
        f.diags[0].message
    );
    let mut e = broken("endless", Target::Interp);
    e.train(Steps::Max(1)).unwrap();
    assert_eq!(codes(e.evaluate(None).unwrap_err()), [Code::EndlessEval]);
    assert_eq!(e.evaluate(Some(2)).unwrap().steps, 2);
    let f = broken("out_of_range", Target::Interp)
        .train(Steps::Max(1))
        .unwrap_err();
    assert_eq!(codes(f.clone_diags()), [Code::RunFailed]);
    assert!(
        f.diags[0].message.contains("gather failed"),
        "{}",
        f.diags[0].message
    );
    // the program's own hooks run
    let r = broken("stops", Target::Interp)
        .train(Steps::Max(20))
        .unwrap();
    assert_eq!(r.global_step, 5);
    // a model_dir that cannot be created
    let p = Program::from_source("broken.est", BROKEN, None);
    let opts = RunOptions {
        estimator: Some("endless".into()),
        model_dir: Some(PathBuf::from("/proc/est-cannot-write-here")),
        data_dir: Some(root()),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).map_err(|f| f.diags).unwrap();
    assert_eq!(codes(e.train(Steps::Max(1)).unwrap_err()), [Code::RunIo]);
}

/// Every run-time code (E09xx, W09xx) is exercised by a test in this file or in
/// tests/reliability.rs, tests/host.rs, tests/wafer.rs, tests/warm_start.rs or
/// tests/export.rs.
#[test]
fn every_runtime_code_is_tested() {
    let me = std::fs::read_to_string(root().join("tests/runtime.rs")).unwrap()
        + &std::fs::read_to_string(root().join("tests/reliability.rs")).unwrap()
        + &std::fs::read_to_string(root().join("tests/host.rs")).unwrap()
        + &std::fs::read_to_string(root().join("tests/wafer.rs")).unwrap()
        + &std::fs::read_to_string(root().join("tests/warm_start.rs")).unwrap()
        + &std::fs::read_to_string(root().join("tests/export.rs")).unwrap()
        + &std::fs::read_to_string(root().join("tests/distributed.rs")).unwrap();
    let missing: Vec<&str> = est::diag::Code::all()
        .iter()
        .filter(|c| c.id[1..].starts_with("09"))
        .filter(|c| !me.contains(&format!("Code::{:?}]", c.code)))
        .map(|c| c.id)
        .collect();
    assert!(
        missing.is_empty(),
        "run-time codes without a test: {missing:?}"
    );
}

/// The MNIST CNN of DESIGN.md §2, verbatim, on generated TFRecord data (tf.Example
/// records of 784-byte images whose bright block marks the class): the loss falls.
#[test]
fn mnist_cnn_trains_on_generated_data() {
    let data = tmp("mnist-data");
    std::fs::create_dir_all(data.join("data")).unwrap();
    let mut file = Vec::new();
    for i in 0..256u32 {
        let label = (i % 10) as i64;
        let mut img = vec![0u8; 784];
        for r in 0..6 {
            for c in 0..6 {
                img[(2 + (label as usize / 5) * 12 + r) * 28 + 2 + (label as usize % 5) * 5 + c] =
                    200 + (i % 50) as u8;
            }
        }
        file.extend(est::data::records::frame(&example(&img, label)));
    }
    std::fs::write(data.join("data/mnist_train.tfrecord"), &file).unwrap();
    std::fs::write(data.join("data/mnist_test.tfrecord"), &file).unwrap();
    let mut p = Program::load(&root().join("examples/mnist_cnn.est")).unwrap();
    p.add_override("batch_size", "16", "--param batch_size");
    let opts = RunOptions {
        model_dir: Some(tmp("mnist-run")),
        data_dir: Some(data),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).map_err(|f| f.diags).unwrap();
    let counts = Arc::new(Mutex::new(Counts::default()));
    e.add_hook(Box::new(Counter(counts.clone(), 1000))).unwrap();
    e.train(Steps::Max(40)).unwrap();
    let losses = counts.lock().unwrap().losses.clone();
    let first: f64 = losses[..5].iter().sum::<f64>() / 5.0;
    let last: f64 = losses[35..].iter().sum::<f64>() / 5.0;
    assert!(last < 0.8 * first, "loss {first} -> {last}");
}

fn example(img: &[u8], label: i64) -> Vec<u8> {
    use est::data::records::{encode_example, Feature};
    encode_example(&[
        ("image_raw", Feature::Bytes(img)),
        ("label", Feature::Ints(&[label])),
    ])
}

/// tf.Example round trip through TFRecord framing; a flipped bit and a truncated tail
/// are errors naming the record and the byte offset; int64 narrowing is range-checked.
#[test]
fn tfrecord_and_example_round_trip() {
    use est::data::records::{encode_example, frame, parse_example, unframe, Feature};
    use est::ir::DType;
    let a = encode_example(&[
        ("x", Feature::Floats(&[1.5, -2.0])),
        ("n", Feature::Ints(&[-3])),
        ("s", Feature::Bytes(b"hi")),
    ]);
    let b = encode_example(&[("n", Feature::Ints(&[5_000_000_000]))]);
    let mut file = frame(&a);
    file.extend(frame(&b));
    let recs = unframe(&file).unwrap();
    assert_eq!(recs, [a.clone(), b.clone()]);
    let want = [
        ("x".to_string(), DType::F32, vec![2]),
        ("n".to_string(), DType::I32, vec![]),
        ("s".to_string(), DType::Bytes, vec![]),
    ];
    let e = parse_example(&recs[0], &want).unwrap();
    assert_eq!(e[0].to_f64(), [1.5, -2.0]);
    assert_eq!(e[1].to_f64(), [-3.0]);
    assert_eq!(e[2].s().iter().next().unwrap(), b"hi");
    let err = parse_example(&recs[1], &want[1..2]).unwrap_err();
    assert_eq!(err, "feature `n`: 5000000000 does not fit i32");
    let err = parse_example(&recs[1], &want[..1]).unwrap_err();
    assert_eq!(err, "feature `x` is missing");
    let mut flipped = file.clone();
    flipped[12 + 3] ^= 0x10;
    assert_eq!(
        unframe(&flipped).unwrap_err().to_string(),
        "record 0 at byte 0: data CRC mismatch"
    );
    let cut = &file[..file.len() - 3];
    let second = frame(&a).len();
    assert_eq!(
        unframe(cut).unwrap_err().to_string(),
        format!("record 1 at byte {second}: truncated data")
    );
}

const COUNTING: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy

input rows() {
  csv("examples/data/digits_test.csv", columns: { pixels: f32[64], label: i32 })
    |> map |r| (r.pixels / 16.0, r.label) |> repeat |> batch(8, drop_remainder: true)
}

input once() {
  csv("examples/data/digits_test.csv", columns: { pixels: f32[64], label: i32 })
    |> map |r| (r.pixels / 16.0, r.label) |> take(16) |> batch(8, drop_remainder: true)
}

model m(features: f32[B, 64], labels: i32[B]) {
  let logits = dense(features, 10)
  let seen = variable("seen", [], init: "zeros", dtype: i32, trainable: false)
  if mode == train { assign(seen, seen + B) }
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with sgd(lr: 0.1) }
  predict { classes = argmax(logits, 1) }
}

estimator e {
  model = m
  train_input = rows()
  predict_input = once()
  config { random_seed = 5  num_shards = 2 }
}
"#;

/// An integer state update under two shards is taken from one shard (not averaged as
/// floats).
#[test]
fn integer_state_under_shards() {
    let p = Program::from_source("counting.est", COUNTING, None);
    let dir = tmp("counting");
    let opts = RunOptions {
        model_dir: Some(dir.clone()),
        data_dir: Some(root()),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).map_err(|f| f.diags).unwrap();
    e.train(Steps::Max(3)).unwrap();
    assert_eq!(
        e.variables()["seen"].to_f64(),
        [24.0],
        "3 steps of a per-shard batch of 8"
    );
    let r = e.predict(&dir.join("pred"), None).unwrap();
    assert_eq!(r.examples, 16);
    let text = std::fs::read_to_string(dir.join("pred/predictions.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert!(first["classes"].is_number());
}

/// `pad` gives tf.pad's values (the examples of TensorFlow's documentation, for
/// `[[1, 2, 3], [4, 5, 6]]` padded `[[1, 1], [2, 2]]`) in each mode, and a constant of
/// its own, on every target (on the wafer, each output a kernel the host's features
/// are sent to).
#[test]
fn pad_follows_tensorflow() {
    const SRC: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
input rows() {
  csv("d.csv", header: false, columns: { x: f32[6], label: i32 }) |> map |r| (r.x, r.label) |> repeat |> batch(2, drop_remainder: true)
}
input once() {
  csv("d.csv", header: false, columns: { x: f32[6], label: i32 }) |> map |r| (r.x, r.label) |> batch(2, drop_remainder: true)
}
model m(features: f32[B, 6], labels: i32[B]) {
  let x = reshape(features, [B, 2, 3])
  let r = pad(x, [[0, 0], [1, 1], [2, 2]], mode: "reflect")
  let logits = dense(reshape(r, [B, 28]), 2)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with sgd(lr: 0.1) }
  predict {
    constant = pad(x, [[0, 0], [1, 1], [2, 2]])
    reflect = r
    symmetric = pad(x, [[0, 0], [1, 1], [2, 2]], mode: "symmetric")
    filled = pad(x, [[0, 0], [0, 1], [1, 0]], value: -1.5)
  }
}
estimator e { model = m  train_input = rows()  predict_input = once() }
"#;
    let want = [
        (
            "constant",
            vec![
                [0., 0., 0., 0., 0., 0., 0.],
                [0., 0., 1., 2., 3., 0., 0.],
                [0., 0., 4., 5., 6., 0., 0.],
                [0., 0., 0., 0., 0., 0., 0.],
            ],
        ),
        (
            "reflect",
            vec![
                [6., 5., 4., 5., 6., 5., 4.],
                [3., 2., 1., 2., 3., 2., 1.],
                [6., 5., 4., 5., 6., 5., 4.],
                [3., 2., 1., 2., 3., 2., 1.],
            ],
        ),
        (
            "symmetric",
            vec![
                [2., 1., 1., 2., 3., 3., 2.],
                [2., 1., 1., 2., 3., 3., 2.],
                [5., 4., 4., 5., 6., 6., 5.],
                [5., 4., 4., 5., 6., 6., 5.],
            ],
        ),
    ];
    let filled = [
        [-1.5, 1., 2., 3.],
        [-1.5, 4., 5., 6.],
        [-1.5, -1.5, -1.5, -1.5],
    ];
    let mut targets = vec![Target::Interp, Target::Wafer];
    if cfg!(feature = "llvm") {
        targets.push(Target::Host);
    }
    for target in targets {
        let dir = tmp(&format!("pad-{}", target.name()));
        std::fs::write(dir.join("d.csv"), "1,2,3,4,5,6,0\n10,20,30,40,50,60,1\n").unwrap();
        let p = Program::from_source("pad.est", SRC, None);
        let opts = RunOptions {
            target,
            model_dir: Some(dir.join("model")),
            data_dir: Some(dir.clone()),
            ..Default::default()
        };
        let mut e = Estimator::new(&p, &opts).map_err(|f| f.diags).unwrap();
        e.train(Steps::Max(1)).unwrap();
        e.predict(&dir.join("pred"), None).unwrap();
        let text = std::fs::read_to_string(dir.join("pred/predictions.jsonl")).unwrap();
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        let rows = |k: &str| -> Vec<Vec<f64>> {
            serde_json::from_value(first[k].clone()).unwrap_or_else(|e| panic!("{k}: {e}"))
        };
        for (mode, w) in &want {
            let w: Vec<Vec<f64>> = w.iter().map(|r| r.to_vec()).collect();
            assert_eq!(rows(mode), w, "{mode} on {}", target.name());
        }
        let w: Vec<Vec<f64>> = filled.iter().map(|r| r.to_vec()).collect();
        assert_eq!(rows("filled"), w, "filled on {}", target.name());
    }
}
