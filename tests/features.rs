//! Feature columns and CSV missing values (issue 13 §6): `csv`'s `defaults`,
//! `na_values` and `skip_invalid`; `lookup` (a vocabulary list or file, out-of-vocabulary
//! buckets), `hash_bucket`, `bucketize` and `crossed`, in an input pipeline's `map`,
//! read back through a model's predictions on the interpreter and the host. The
//! expected values are worked out by hand from `tests/fixtures/census/census.csv`.

mod common;
use est::elab::Target;
use est::runtime::{Estimator, RunOptions, Steps};
use est::Program;

const SRC: &str = r#"
use std.nn.{dense, embedding}
use std.losses.sigmoid_cross_entropy

fn features(r) {
  let age = bucketize(r.age, [25, 35, 45, 55])
  let work = lookup(r.workclass, VOCAB)
  let edu = hash_bucket(r.education, 8)
  let known = lookup(r.education, ["Bachelors", "Masters"]);
  ({ age: age, work: work, edu: edu, known: known, cross: crossed([age, work], 16), hours: r.hours }, cast(r.income, f32))
}

input census(training: bool) {
  let rows = csv("census.csv", columns: { age: f32, workclass: bytes, education: bytes, hours: f32, income: i32 }, CSV_OPTIONS)
    |> map |r| features(r)
  let rows = if training { rows |> repeat } else { rows }
  rows |> batch(3, drop_remainder: training)
}

model wd(features: { age: i32[B], work: i32[B], edu: i32[B], known: i32[B], cross: i32[B], hours: f32[B] }, labels: f32[B]) {
  let deep = concat([embedding(features.age, 5, 4), embedding(features.work, 4, 4), embedding(features.edu, 8, 4)], axis: 1)
  let wide = embedding(features.cross, 16, 1)
  let logits = reshape(dense(dense(deep, 8, activation: relu), 1) + wide, [features.age.shape[0]])
  let loss = sigmoid_cross_entropy(labels, logits)
  train {
    minimize loss with ftrl(lr: 0.1) |> only(trainable_variables("embedding_3"))
    minimize loss with adagrad(lr: 0.05)
  }
  predict { age = features.age  work = features.work  edu = features.edu  known = features.known  cross = features.cross  hours = features.hours }
}

estimator wd {
  model = wd
  train_input = census(true)
  predict_input = census(false)
  config { save_checkpoint_steps = 100  random_seed = 1 }
}
"#;

const OPTIONS: &str = r#"defaults: { hours: 40.0, workclass: "Private" }, skip_invalid: true"#;

fn program(vocab: &str, options: &str) -> Program {
    let src = SRC.replace("VOCAB", vocab).replace("CSV_OPTIONS", options);
    Program::from_source(
        "census.est",
        &src,
        Some(common::root().join("tests/fixtures/census")),
    )
}

fn rows(target: Target, tag: &str, vocab: &str) -> (Vec<serde_json::Value>, u64) {
    let dir = common::scratch("features", &format!("{tag}-{target:?}"));
    let p = program(vocab, OPTIONS);
    let opts = RunOptions {
        target,
        model_dir: Some(dir.clone()),
        data_dir: Some(common::root().join("tests/fixtures/census")),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{:?}", f.diags));
    e.train(Steps::Max(4)).unwrap();
    let out = dir.join("pred");
    e.predict(&out, None).unwrap();
    let rows = std::fs::read_to_string(out.join("predictions.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (rows, e.skipped_records())
}

fn column(rows: &[serde_json::Value], name: &str) -> Vec<f64> {
    rows.iter().map(|r| r[name].as_f64().unwrap()).collect()
}

#[test]
fn csv_defaults_and_feature_columns() {
    let mut targets = vec![Target::Interp];
    if cfg!(feature = "llvm") {
        targets.push(Target::Host);
    }
    for target in targets {
        for (tag, vocab) in [
            ("file", "\"workclass.txt\", num_oov_buckets: 1"),
            (
                "list",
                "[\"Private\", \"Self-emp\", \"State-gov\"], num_oov_buckets: 1",
            ),
        ] {
            let (rows, skipped) = rows(target, tag, vocab);
            // the row whose hours are `bad` is skipped (and counted); the others are
            // ages 39, 50, 38, 53, 28, 49
            assert_eq!(rows.len(), 6, "{target:?}");
            assert!(skipped >= 1, "{target:?}: the bad row is counted");
            assert_eq!(column(&rows, "age"), [2.0, 3.0, 2.0, 3.0, 1.0, 3.0]);
            // State-gov, Self-emp, Private, `?` (missing: the default, Private),
            // Private, Private
            assert_eq!(column(&rows, "work"), [2.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
            // an empty hours field takes the default 40
            assert_eq!(column(&rows, "hours"), [40.0, 13.0, 40.0, 40.0, 40.0, 16.0]);
            // Bachelors, Bachelors, HS-grad, 11th, Bachelors, 9th: 0 when known, -1
            // (the default value) when not
            assert_eq!(column(&rows, "known"), [0.0, 0.0, -1.0, -1.0, 0.0, -1.0]);
            // equal strings hash alike, into the buckets
            let edu = column(&rows, "edu");
            assert!(edu.iter().all(|&b| (0.0..8.0).contains(&b)));
            assert_eq!(edu[0], edu[1]);
            assert_eq!(edu[0], edu[4]);
            // equal crossings hash alike: rows 3 and 5 are both (age 3, Private)
            let cross = column(&rows, "cross");
            assert!(cross.iter().all(|&b| (0.0..16.0).contains(&b)));
            assert_eq!(cross[3], cross[5], "(3, 0) twice");
        }
    }
}

#[test]
fn a_missing_field_without_a_default_stops_the_run() {
    let dir = common::scratch("features", "no-default");
    let p = program(
        "\"workclass.txt\", num_oov_buckets: 1",
        "skip_invalid: false",
    );
    let opts = RunOptions {
        target: Target::Interp,
        model_dir: Some(dir),
        data_dir: Some(common::root().join("tests/fixtures/census")),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).unwrap();
    let f = e.train(Steps::Max(2)).unwrap_err();
    assert_eq!(f.diags[0].code, est::diag::Code::BadData);
    assert!(
        f.diags[0].message.contains(
            "census.csv:4:4: column `hours`: `` is a missing value, and the column has no default"
        ),
        "{}",
        f.diags[0].message
    );
}

#[test]
fn a_vocabulary_file_that_cannot_be_read_is_e0106() {
    let p = program("\"workclas.txt\"", OPTIONS);
    let checked = est::check(&p, &est::CheckOptions::default());
    let d = checked
        .diags
        .iter()
        .find(|d| d.code == est::diag::Code::UnreadableFile)
        .unwrap_or_else(|| panic!("{:?}", checked.diags));
    assert!(d.message.contains("workclas.txt"), "{}", d.message);
}
