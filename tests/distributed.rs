//! Training across ranks: the ranks of a data-parallel run (as threads here, and as
//! the processes of `mpirun -n 2` with the `mpi` feature) train, evaluate and predict as
//! one process does over as many shards; a rank that fails stops every rank; ranks that
//! run different programs refuse to start; a job that loses a rank to SIGKILL ends, and
//! running it again resumes bit for bit.

mod common;

use common::root;
use est::diag::Code;
use est::dist::{threads, Group};
use est::elab::Target;
use est::runtime::{Estimator, Reducer, RunOptions, Steps};
use est::tensor::Tensor;
use est::Program;
use std::path::Path;
use std::sync::Arc;

/// Digits with a shuffled, repeated train input, dropout (random numbers drawn per
/// shard), and metrics of three kinds: a ratio, AUC, and a custom reducer.
const SRC: &str = r#"
use std.nn.{dense, dropout}
use std.losses.softmax_cross_entropy
use std.metrics.{accuracy, auc, reducer}

params { batch_size: int = 32 }

input rows(path: string, training: bool, batch_size: int) {
  let r = csv(path, columns: { pixels: f32[64], label: i32 }) |> map |r| (r.pixels / 16.0, r.label)
  let r = if training { r |> shuffle(500) |> repeat } else { r }
  r |> batch(batch_size, drop_remainder: training)
}

model m(features: f32[B, 64], labels: i32[B]) {
  let h = dense(features, 32, activation: relu)
  if mode == train { h = dropout(h, rate: 0.25) }
  let logits = dense(h, 10)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with adam(lr: 0.01) }
  eval {
    metric accuracy = accuracy(labels, argmax(logits, 1))
    metric auc_of_zero = auc(cast(labels == 0, i32), squeeze(slice(softmax(logits), axis: 1, start: 0, end: 1), axis: 1))
    metric nonzero_labels = reducer("positives", labels)
  }
  predict { classes = argmax(logits, 1); probabilities = softmax(logits) }
}

estimator e {
  model = m
  train_input = rows("examples/data/digits_train.csv", training: true, batch_size: params.batch_size)
  eval_input = rows("examples/data/digits_test.csv", training: false, batch_size: 40)
  predict_input = rows("examples/data/digits_test.csv", training: false, batch_size: 40)
  config { random_seed = 11  iterations_per_loop = 5  save_checkpoint_steps = 10 }
}
"#;

/// Counts positive values: a custom reducer, merged across shards and ranks.
struct Positives(f64);

impl Reducer for Positives {
    fn accumulate(&mut self, args: &[&Tensor]) {
        self.0 += args[0].to_f64().iter().filter(|&&v| v > 0.0).count() as f64;
    }
    fn merge(&mut self, other: &dyn Reducer) {
        if let Some(o) = other.as_any().downcast_ref::<Positives>() {
            self.0 += o.0;
        }
    }
    fn result(&self) -> f64 {
        self.0
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn targets() -> Vec<Target> {
    let mut t = vec![Target::Interp];
    if cfg!(feature = "llvm") {
        t.push(Target::Host);
    }
    t
}

fn program(params: &[(&str, &str)]) -> Program {
    let mut p = Program::from_source("dist.est", SRC, None);
    for (k, v) in params {
        p.add_override(k, v, &format!("--param {k}"));
    }
    p
}

/// The codes each of two ranks (threads) of `p` in model_dir `dir` fails with doing
/// `act`, both reading their data under `data` (ranks with different data refuse to
/// join: E0925).
fn failures_on_two_ranks(
    p: &Program,
    dir: &Path,
    data: &Path,
    act: impl Fn(&mut Estimator) -> Option<est::runtime::RunFailure> + Sync,
) -> Vec<Vec<Code>> {
    threads::run(2, |g: Group| {
        let mut e = estimator_in(p, dir, data, Target::Interp, 1, 2);
        e.join(g).map_err(|f| f.diags).unwrap();
        act(&mut e).map_or_else(Vec::new, |f| f.diags.iter().map(|d| d.code).collect())
    })
}

/// A copy of `examples/data` under `base`, `NAME` with the label of one example (row
/// `row`, from 0) 99, out of range: the one rank whose share of the input holds it fails,
/// the other does not.
fn one_bad_label(base: &Path, name: &str, row: usize) {
    let data = base.join("examples/data");
    std::fs::create_dir_all(&data).unwrap();
    for f in ["digits_train.csv", "digits_test.csv"] {
        std::fs::copy(root().join("examples/data").join(f), data.join(f)).unwrap();
    }
    let csv = std::fs::read_to_string(root().join("examples/data").join(name)).unwrap();
    let bad: Vec<String> = csv
        .lines()
        .enumerate()
        .map(|(i, l)| match l.rsplit_once(',') {
            Some((head, _)) if i == row + 1 => format!("{head},99"),
            _ => l.to_string(),
        })
        .collect();
    std::fs::write(data.join(name), bad.join("\n") + "\n").unwrap();
}

/// That one rank failed with `code` and the other stopped with E0924, in either order.
fn one_failed_with(codes: &[Vec<Code>], code: Code) {
    let mut seen: Vec<&Vec<Code>> = codes.iter().collect();
    seen.sort_by_key(|c| c.first().map(|c| c.id()));
    assert_eq!(
        seen,
        vec![&vec![code], &vec![Code::RankFailed]],
        "{codes:?}"
    );
}

/// An estimator of `p` as one of `ranks` ranks with `shards` shards each.
fn estimator(p: &Program, dir: &Path, target: Target, shards: i64, ranks: u64) -> Estimator {
    estimator_in(p, dir, &root(), target, shards, ranks)
}

/// `estimator`, reading its data under `data`.
fn estimator_in(
    p: &Program,
    dir: &Path,
    data: &Path,
    target: Target,
    shards: i64,
    ranks: u64,
) -> Estimator {
    let opts = RunOptions {
        target,
        model_dir: Some(dir.to_path_buf()),
        data_dir: Some(data.to_path_buf()),
        config: vec![("num_shards".to_string(), shards)],
        threads: Some(1),
        ranks,
        ..Default::default()
    };
    let mut e = match Estimator::new(p, &opts) {
        Ok(e) => e,
        Err(f) => panic!("{:?}", f.diags),
    };
    e.register_reducer(
        "positives",
        Arc::new(|| Box::new(Positives(0.0)) as Box<dyn Reducer>),
    );
    e
}

/// What a run leaves: its variables after training, its evaluation, its predictions.
#[derive(Debug, PartialEq)]
struct Outcome {
    vars: Vec<(String, Vec<f64>)>,
    step: i64,
    loss: f64,
    metrics: Vec<(String, f64)>,
    examples: u64,
    predictions: Vec<u8>,
}

fn run(e: &mut Estimator, steps: u64, dir: &Path) -> Outcome {
    let r = e.train(Steps::Max(steps)).map_err(|f| f.diags).unwrap();
    let mut vars: Vec<(String, Vec<f64>)> = (e.variables().into_iter())
        .map(|(k, t)| (k, t.to_f64()))
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    let m = e.evaluate(None).map_err(|f| f.diags).unwrap();
    let out = dir.join("predictions");
    let p = e.predict(&out, None).map_err(|f| f.diags).unwrap();
    assert_eq!(p.examples, 360);
    Outcome {
        vars,
        step: r.global_step,
        loss: m.loss,
        metrics: m.metrics,
        examples: m.examples,
        predictions: std::fs::read(out.join("predictions.jsonl")).unwrap_or_default(),
    }
}

/// `ranks` ranks as threads, each with `shards` shards; rank 0's outcome. Rank 0's
/// model_dir is `dir`; the others are given directories of their own, which must stay
/// empty: rank 0 restores and sends them the state, and writes alone.
fn on_ranks(p: &Program, dir: &Path, target: Target, shards: i64, ranks: usize) -> Outcome {
    let mut all = threads::run(ranks, |g: Group| {
        let own = match g.rank() {
            0 => dir.to_path_buf(),
            r => dir.join(format!("rank{r}")),
        };
        let mut e = estimator(p, &own, target, shards, ranks as u64);
        e.join(g).map_err(|f| f.diags).unwrap();
        run(&mut e, 20, &own)
    });
    let first = all.remove(0);
    for (r, other) in all.iter().enumerate() {
        // every rank trained and evaluated the same; rank 0 alone wrote anything
        assert_eq!(
            (&other.vars, other.step, &other.metrics),
            (&first.vars, first.step, &first.metrics)
        );
        assert!(other.predictions.is_empty());
        assert!(
            !dir.join(format!("rank{}", r + 1)).exists(),
            "rank {} wrote",
            r + 1
        );
    }
    first
}

fn alone(p: &Program, dir: &Path, target: Target, shards: i64) -> Outcome {
    run(&mut estimator(p, dir, target, shards, 1), 20, dir)
}

/// 2 ranks of 1 shard train bit for bit as 1 process of 2 shards: each rank sums its
/// shards in order, and the ranks' sums are added in rank order, as one process adds
/// its shards. Evaluation and prediction over the ranks equal one process's.
#[test]
fn two_ranks_train_evaluate_and_predict_as_two_shards() {
    let p = program(&[]);
    for target in targets() {
        let base = common::scratch("dist", &format!("two-{target:?}"));
        let one = alone(&p, &base.join("one"), target, 2);
        let two = on_ranks(&p, &base.join("two"), target, 1, 2);
        assert_eq!(two.step, 20);
        assert_eq!(
            one, two,
            "{target:?}: 2 ranks x 1 shard against 1 process x 2 shards"
        );
        // the checkpoints are the same bytes (rank 0 wrote one, and only rank 0)
        let ckpt = |d: &Path| std::fs::read(d.join("ckpt-20.safetensors")).unwrap();
        assert_eq!(ckpt(&base.join("one")), ckpt(&base.join("two")));
        // the evaluation covers every row once whatever the split: exact counts
        let single = run(
            &mut estimator(&p, &base.join("two"), target, 1, 1),
            20,
            &base.join("two"),
        );
        assert_eq!(two.examples, 360);
        assert_eq!(single.metrics[0], two.metrics[0], "accuracy");
        assert_eq!(single.metrics[2], two.metrics[2], "a custom reducer");
        assert!(
            (single.metrics[1].1 - two.metrics[1].1).abs() < 1e-12,
            "auc"
        );
    }
}

/// Each rank a wafer: 2 simulated wafers of one shard each, averaging the gradients
/// their PEs hold, train as the interpreter does over 2 shards, within the wafer's
/// tolerance against the interpreter (tests/wafer.rs: it sums in another order):
/// weights within 1e-5 of each variable's largest magnitude after 20 steps.
#[test]
fn each_rank_a_wafer_trains_as_two_shards() {
    let base = common::scratch("dist", "wafer");
    let p = Program::load(&root().join("examples/digits_mlp.est")).unwrap();
    let make = |dir: &Path, target: Target, shards: i64, ranks: u64| {
        let opts = RunOptions {
            target,
            model_dir: Some(dir.to_path_buf()),
            config: vec![("num_shards".to_string(), shards)],
            ranks,
            ..Default::default()
        };
        Estimator::new(&p, &opts).map_err(|f| f.diags).unwrap()
    };
    let mut one = make(&base.join("interp"), Target::Interp, 2, 1);
    one.train(Steps::Max(20)).map_err(|f| f.diags).unwrap();
    let want = one.variables();
    let got = threads::run(2, |g: Group| {
        let mut e = make(&base.join("wafer"), Target::Wafer, 1, 2);
        e.join(g).map_err(|f| f.diags).unwrap();
        let r = e.train(Steps::Max(20)).map_err(|f| f.diags).unwrap();
        (r.global_step, e.variables())
    });
    assert_eq!(got[0].1, got[1].1, "the two wafers hold the same weights");
    assert_eq!(got[0].0, 20);
    let worst = common::worst(&want, &got[0].1);
    assert!(worst <= 1e-5, "largest relative difference {worst:e}");
}

/// With several shards per rank, each rank adds its own shards first: 2 ranks x 2
/// shards group the sum as (s0 + s1) + (s2 + s3), one process of 4 shards as
/// ((s0 + s1) + s2) + s3. Float addition is not associative, so the weights agree to
/// rounding: within 1e-6 relative (the digits model's weights move by 1e-3 a step,
/// rounding in a sum of 4 moves them by 1e-7 relative).
#[test]
fn ranks_of_several_shards_agree_with_one_process_to_rounding() {
    let p = program(&[]);
    let target = Target::Interp;
    let base = common::scratch("dist", "four");
    let one = alone(&p, &base.join("one"), target, 4);
    let two = on_ranks(&p, &base.join("two"), target, 2, 2);
    for ((name, a), (_, b)) in one.vars.iter().zip(&two.vars) {
        let scale = a.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
        let worst = a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(worst / scale <= 1e-6, "{name}: {}", worst / scale);
    }
    assert_eq!(one.examples, two.examples);
}

/// A batch that fails on one rank stops both: of the same data, one example's label is
/// out of range, and the rank whose batch holds it says why (E0915); the other says that
/// it failed (E0924). Neither waits for the other.
#[test]
fn a_rank_whose_step_fails_stops_every_rank() {
    let base = common::scratch("dist", "fail");
    one_bad_label(&base, "digits_train.csv", 0);
    let p = program(&[]);
    let codes = failures_on_two_ranks(&p, &base.join("run"), &base, |e| {
        e.train(Steps::Max(30)).err()
    });
    one_failed_with(&codes, Code::LabelOutOfRange);
}

/// A checkpoint resumes across rank counts at any position: 3 steps of one shard,
/// then 10 more on 2 ranks of one shard or on one process of 2 shards, end with the
/// same weights (each rank's share counts from the position the run starts at).
#[test]
fn a_checkpoint_resumes_across_rank_counts() {
    let p = program(&[]);
    let base = common::scratch("dist", "resume");
    let start = base.join("start");
    estimator(&p, &start, Target::Interp, 1, 1)
        .train(Steps::Max(3))
        .map_err(|f| f.diags)
        .unwrap();
    let copy = |to: &Path| {
        std::fs::create_dir_all(to).unwrap();
        for f in std::fs::read_dir(&start).unwrap().flatten() {
            if f.path().is_file() {
                std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
            }
        }
    };
    let (one, two) = (base.join("one"), base.join("two"));
    copy(&one);
    copy(&two);
    let mut e = estimator(&p, &one, Target::Interp, 2, 1);
    e.train(Steps::Max(13)).map_err(|f| f.diags).unwrap();
    let want = e.variables();
    let got = threads::run(2, |g: Group| {
        let mut e = estimator(&p, &two, Target::Interp, 1, 2);
        e.join(g).map_err(|f| f.diags).unwrap();
        let r = e.train(Steps::Max(13)).map_err(|f| f.diags).unwrap();
        (r.start_step, e.variables())
    });
    for (start, vars) in got {
        assert_eq!(start, 3);
        assert!(vars == want, "the weights differ from one process's");
    }
}

/// An evaluation batch that fails on one rank (the test data's first example has a
/// label out of range, in the first batch, rank 0's) stops both: rank 0 says why
/// (E0915), rank 1 that rank 0 failed.
#[test]
fn a_rank_whose_eval_batch_fails_says_why() {
    let base = common::scratch("dist", "evalfail");
    one_bad_label(&base, "digits_test.csv", 0);
    let p = program(&[]);
    let run = base.join("run");
    estimator(&p, &run, Target::Interp, 1, 1)
        .train(Steps::Max(3))
        .map_err(|f| f.diags)
        .unwrap();
    let codes = failures_on_two_ranks(&p, &run, &base, |e| e.evaluate(None).err());
    assert_eq!(
        codes,
        vec![vec![Code::LabelOutOfRange], vec![Code::RankFailed]]
    );
}

/// Issue 43, finding 22: ranks whose input files differ (here one example of the eval
/// set) refuse to join, every rank saying which rank and which input differs (E0925);
/// they died at the first eval batch with no reason, and a rank with other training
/// data went undetected.
#[test]
fn ranks_with_different_input_files_refuse_to_start() {
    let base = common::scratch("dist", "other-data");
    for (dir, row) in [("a", 0), ("b", 5)] {
        one_bad_label(&base.join(dir), "digits_test.csv", row);
    }
    let p = program(&[]);
    let codes = threads::run(2, |g: Group| {
        let data = base.join(if g.rank() == 0 { "a" } else { "b" });
        refusal(
            estimator_in(&p, &base.join("run"), &data, Target::Interp, 1, 2),
            g,
        )
    });
    for c in &codes {
        assert_eq!(
            c,
            &vec![(
                Code::RanksDisagree,
                "rank 1 runs another eval input's files (their sizes or contents) and predict input's files (their sizes or contents) than rank 0".to_string()
            )]
        );
    }
}

/// Rank 0 that cannot take model_dir (another run holds its lock) says so (E0909), and
/// the other rank, waiting for rank 0's state, stops with E0924 instead of hanging.
#[test]
fn rank_0_without_the_model_dir_stops_every_rank() {
    let p = program(&[]);
    let base = common::scratch("dist", "locked");
    let held = est::runtime::model_dir::lock(&base)
        .map_err(|_| "lock")
        .unwrap();
    let codes = failures_on_two_ranks(&p, &base, &root(), |e| e.train(Steps::Max(5)).err());
    drop(held);
    assert_eq!(
        codes,
        vec![vec![Code::ModelDirLocked], vec![Code::RankFailed]]
    );
}

/// The codes and messages of `e` refusing to join `g`.
fn refusal(mut e: Estimator, g: Group) -> Vec<(Code, String)> {
    let f = e.join(g).expect_err("refused");
    f.diags
        .iter()
        .map(|d| (d.code, d.message.clone()))
        .collect()
}

/// Ranks that run different programs (here another batch size) refuse to start, on
/// every rank (E0925), and so do ranks checked for another number of ranks.
#[test]
fn ranks_of_different_programs_refuse_to_start() {
    let base = common::scratch("dist", "differ");
    let codes = threads::run(2, |g: Group| {
        let p = if g.rank() == 0 {
            program(&[])
        } else {
            program(&[("batch_size", "64")])
        };
        refusal(estimator(&p, &base, Target::Interp, 1, 2), g)
    });
    for c in &codes {
        assert_eq!(
            c,
            &vec![(
                Code::RanksDisagree,
                "rank 1 runs another program (its files or params) than rank 0".to_string()
            )]
        );
    }
    let p = program(&[]);
    let codes = threads::run(2, |g: Group| {
        let mut e = estimator(&p, &base, Target::Interp, 1, 1);
        e.join(g)
            .err()
            .map_or_else(Vec::new, |f| f.diags.iter().map(|d| d.code).collect())
    });
    assert_eq!(codes, vec![vec![Code::RanksDisagree]; 2]);
}

/// The same as processes: `mpirun -n 2 estc ...` on this machine's loopback.
#[cfg(feature = "mpi")]
mod mpirun {
    use super::root;
    use std::path::Path;
    use std::process::{Command, Output, Stdio};
    use std::time::{Duration, Instant};

    fn estc() -> &'static str {
        env!("CARGO_BIN_EXE_estc")
    }

    /// `mpirun -n N` of estc with `args` (as root too: the tests run as root in CI).
    fn mpirun(n: usize, args: &[&str]) -> Command {
        let mut c = Command::new("mpirun");
        c.args(["--oversubscribe", "-n", &n.to_string(), estc()])
            .args(args)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .current_dir(root());
        c
    }

    fn ok(o: Output) -> String {
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{}\n{text}",
            String::from_utf8_lossy(&o.stderr)
        );
        text
    }

    fn digits(dir: &Path, extra: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = ["examples/digits_mlp.est", "--threads", "1", "--model-dir"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.push(dir.display().to_string());
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    }

    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }

    /// Two processes of one shard train to the same checkpoint bytes as one process of
    /// two shards, and evaluate and predict the same.
    #[test]
    fn mpirun_two_ranks_train_as_two_shards() {
        let base = super::common::scratch("dist", "mpirun");
        let (one, two) = (base.join("one"), base.join("two"));
        let train = |d: &Path, extra: &[&str]| {
            let mut v = vec!["train".to_string()];
            v.extend(digits(d, &[&["--max-steps", "30"], extra].concat()));
            v
        };
        ok(Command::new(estc())
            .args(args(&train(&one, &["--config", "num_shards=2"])))
            .current_dir(root())
            .output()
            .unwrap());
        ok(mpirun(2, &args(&train(&two, &[]))).output().unwrap());
        let ckpt = |d: &Path| std::fs::read(d.join("ckpt-30.safetensors")).unwrap();
        assert_eq!(ckpt(&one), ckpt(&two));
        let json = |v: Vec<String>| {
            let mut v = v;
            v.extend(["--message-format".to_string(), "json".to_string()]);
            v
        };
        let eval = |d: &Path| json([vec!["eval".to_string()], digits(d, &[])].concat());
        // (one process of two shards reads the same groups of batches: the same count)
        let mut shards = eval(&one);
        shards.extend(["--config".to_string(), "num_shards=2".to_string()]);
        let alone = ok(Command::new(estc())
            .args(args(&shards))
            .current_dir(root())
            .output()
            .unwrap());
        let ranked = ok(mpirun(2, &args(&eval(&two))).output().unwrap());
        // rank 0 alone prints the result: one line, as one process prints
        assert_eq!(alone, ranked);
        assert!(ranked.contains("\"examples\":360"), "{ranked}");
        let predict = |d: &Path| {
            let mut v = vec!["predict".to_string()];
            v.extend(digits(d, &["--output", &d.join("p").display().to_string()]));
            v
        };
        ok(Command::new(estc())
            .args(args(&predict(&one)))
            .current_dir(root())
            .output()
            .unwrap());
        ok(mpirun(2, &args(&predict(&two))).output().unwrap());
        let p = |d: &Path| std::fs::read(d.join("p/predictions.jsonl")).unwrap();
        assert_eq!(p(&one), p(&two));
    }

    /// Ranks may run on different thread counts (`--threads` is each rank's own): rank 0
    /// on 1 thread and rank 1 on 5, at a batch smaller than twice the threads, train the
    /// same checkpoint bytes as one process of two shards on 2 threads.
    #[test]
    fn mpirun_ranks_on_different_thread_counts_train_the_same_bits() {
        let base = super::common::scratch("dist", "mpirun-threads");
        let (one, two) = (base.join("one"), base.join("two"));
        let train = |d: &Path, threads: &str| {
            let mut v: Vec<String> = ["train", "examples/digits_mlp.est", "--max-steps", "20"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            v.extend(
                [
                    "--param",
                    "batch_size=8",
                    "--threads",
                    threads,
                    "--model-dir",
                ]
                .map(String::from),
            );
            v.push(d.display().to_string());
            v
        };
        let mut alone = train(&one, "2");
        alone.extend(["--config".to_string(), "num_shards=2".to_string()]);
        ok(Command::new(estc())
            .args(args(&alone))
            .current_dir(root())
            .output()
            .unwrap());
        let o = Command::new("mpirun")
            .args(["--oversubscribe", "-n", "1", estc()])
            .args(args(&train(&two, "1")))
            .args([":", "-n", "1", estc()])
            .args(args(&train(&two, "5")))
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .current_dir(root())
            .output()
            .unwrap();
        ok(o);
        let ckpt = |d: &Path| std::fs::read(d.join("ckpt-20.safetensors")).unwrap();
        assert!(
            ckpt(&one) == ckpt(&two),
            "ranks on 1 and 5 threads wrote other bytes than one process of two shards"
        );
    }

    /// The rank whose model_dir argument is `dir` and whose MPI rank is `rank`.
    fn rank_pid(dir: &Path, rank: usize) -> Option<u32> {
        let want = format!("OMPI_COMM_WORLD_RANK={rank}");
        for e in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            if !cmd.starts_with(estc()) || !cmd.contains(&*dir.display().to_string()) {
                continue;
            }
            let env = std::fs::read(e.path().join("environ")).unwrap_or_default();
            if env.split(|&b| b == 0).any(|v| v == want.as_bytes()) {
                return Some(pid);
            }
        }
        None
    }

    /// kill -9 of rank 1 mid-run ends the job within seconds, rank 0 saying it was
    /// stopped; running the same command again resumes from the last checkpoint and
    /// ends with the same bytes as a run that was never interrupted.
    #[test]
    fn a_killed_rank_ends_the_job_and_the_rerun_resumes_exactly() {
        let base = super::common::scratch("dist", "kill");
        let (cut, whole) = (base.join("cut"), base.join("whole"));
        let train = |d: &Path| {
            let mut v = vec!["train".to_string()];
            v.extend(digits(
                d,
                &[
                    "--max-steps",
                    "4000",
                    "--config",
                    "save_checkpoint_steps=100",
                ],
            ));
            v
        };
        ok(mpirun(2, &args(&train(&whole))).output().unwrap());
        let job = mpirun(2, &args(&train(&cut)))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let t0 = Instant::now();
        while !cut.join("ckpt-200.json").exists() {
            assert!(t0.elapsed() < Duration::from_secs(120), "no checkpoint");
            std::thread::sleep(Duration::from_millis(5));
        }
        let pid = rank_pid(&cut, 1).expect("rank 1 runs");
        let killed = Instant::now();
        // SAFETY: kill(2) of a process this test started (through mpirun)
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
        let out = job.wait_with_output().unwrap();
        let took = killed.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the job ended non-zero");
        assert!(
            took < Duration::from_secs(15),
            "the job took {took:?} to end"
        );
        assert!(
            err.contains("rank 0 of 2 was stopped by the MPI launcher"),
            "{err}"
        );
        assert!(
            !cut.join("ckpt-4000.json").exists(),
            "the kill came before the end"
        );
        let again = ok(mpirun(2, &args(&train(&cut))).output().unwrap());
        assert!(again.contains("trained"), "{again}");
        let ckpt = |d: &Path| std::fs::read(d.join("ckpt-4000.safetensors")).unwrap();
        assert_eq!(ckpt(&cut), ckpt(&whole));
    }

    /// Ranks started with different params refuse to run: E0925 from rank 0, nothing
    /// written.
    #[test]
    fn mpirun_ranks_of_different_programs_refuse() {
        let base = super::common::scratch("dist", "mpmd");
        let d = base.join("run").display().to_string();
        let o = Command::new("mpirun")
            .args([
                "--oversubscribe",
                "-n",
                "1",
                estc(),
                "train",
                "examples/digits_mlp.est",
            ])
            .args([
                "--model-dir",
                &d,
                "--max-steps",
                "5",
                ":",
                "-n",
                "1",
                estc(),
                "train",
            ])
            .args([
                "examples/digits_mlp.est",
                "--model-dir",
                &d,
                "--max-steps",
                "5",
            ])
            .args(["--param", "learning_rate=0.2"])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .current_dir(root())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success());
        assert!(err.contains("E0925"), "{err}");
        assert!(
            err.contains("rank 1 runs another program (its files or params) than rank 0"),
            "{err}"
        );
        assert!(!base.join("run").join("checkpoint.json").exists());
    }

    /// A rank whose program does not check stops the others, which were waiting for it
    /// to join (E0924 from rank 0, E0505 from rank 1); ranks that fail alike print
    /// their diagnostic once.
    #[test]
    fn mpirun_a_rank_whose_program_does_not_check_stops_the_others() {
        let base = super::common::scratch("dist", "nocheck");
        let d = base.join("run").display().to_string();
        let run = |rank1: &[&str], both: &[&str]| {
            let o = Command::new("mpirun")
                .args([
                    "--oversubscribe",
                    "-n",
                    "1",
                    estc(),
                    "train",
                    "examples/digits_mlp.est",
                ])
                .args([
                    "--model-dir",
                    &d,
                    "--max-steps",
                    "5",
                    "--message-format",
                    "json",
                ])
                .args(both)
                .args([":", "-n", "1", estc(), "train", "examples/digits_mlp.est"])
                .args([
                    "--model-dir",
                    &d,
                    "--max-steps",
                    "5",
                    "--message-format",
                    "json",
                ])
                .args(both)
                .args(rank1)
                .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                .current_dir(root())
                .output()
                .unwrap();
            assert!(!o.status.success());
            String::from_utf8_lossy(&o.stdout).into_owned()
        };
        // rank 1 alone: a global batch of 33 is not divisible by 2 ranks
        let out = run(&["--param", "batch_size=33"], &[]);
        assert_eq!(out.matches("\"code\":\"E0505\"").count(), 1, "{out}");
        assert!(out.contains("\"code\":\"E0924\""), "{out}");
        assert!(out.contains("rank 1 failed to check the program"), "{out}");
        // both alike: said once
        let out = run(&[], &["--param", "batch_size=33"]);
        assert_eq!(out.matches("\"code\":\"E0505\"").count(), 1, "{out}");
        assert!(!out.contains("E0924"), "{out}");
        assert!(!base.join("run").exists());
    }
}
