//! Record features and labels, and models without labels (issue 13 §2), trained on
//! every target this build has against the interpreter from the same seed.
//!
//! Tolerance, as in `tests/wafer.rs` and `tests/host.rs`: weights within 1e-5 of each
//! variable's largest magnitude, losses and metrics within 1e-5 relative (the backends
//! sum in other orders than the interpreter).

mod common;
use common::worst;
use est::elab::Target;
use est::runtime::{Estimator, RunOptions, Steps};
use est::Program;
use std::path::Path;

/// The examples of `TWO_HEADS` and `ONE_HEAD`, in place of their `{EXAMPLES}`: two
/// features and two labels per row, as dicts.
const EXAMPLES: &str = r#"
fn example(i) {
  let x = cast(i % 7, f32) / 7.0
  let w = cast(i % 3, f32)
  let labels = { value: reshape(x * 2.0 + w, [1]), class: (i % 7) / 3 };
  ({ x: reshape(x, [1]) * fill([4], 1.0), weight: reshape(w, [1]) }, labels)
}

input examples(training: bool) {
  let rows = range(90) |> map |i| example(i)
  let rows = if training { rows |> shuffle(90) |> repeat } else { rows }
  rows |> batch(16, drop_remainder: training)
}
"#;

/// Two feature tensors and two label heads, as dicts from a TensorFlow `input_fn`. The
/// model declares the fields in another order than the element has them: they are
/// bound by name. The wafer does not lay out two heads on one layer (E0601), so this
/// one runs on the interpreter and the host.
const TWO_HEADS: &str = r#"
use std.nn.dense
use std.losses.{softmax_cross_entropy, mean_squared_error}
use std.metrics.{accuracy, root_mean_squared_error, auc_pr}

{EXAMPLES}
model two_heads(
  features: { weight: f32[B, 1], x: f32[B, 4] },
  labels: { class: i32[B], value: f32[B, 1] },
) {
  let h = dense(concat([features.x, features.weight], axis: 1), 16, activation: relu)
  let logits = dense(h, 3)
  let value = dense(h, 1)
  let loss = softmax_cross_entropy(labels.class, logits) + mean_squared_error(labels.value, value)
  train   { minimize loss with adam(lr: 0.01) }
  eval    {
    metric class_accuracy = accuracy(labels.class, argmax(logits, 1))
    metric value_rmse = root_mean_squared_error(labels.value, value)
    metric weighted_auc_pr = auc_pr(labels.class == 0, reshape(slice(softmax(logits), 1, 0, 1), [B]), weights: reshape(features.weight, [B]))
  }
  predict { class = argmax(logits, 1)  value = value }
}

estimator two_heads {
  model = two_heads
  train_input = examples(training: true)
  eval_input = examples(training: false)
  config { random_seed = 7 }
}
"#;

/// A record of features and a record of labels of which the model reads one, on
/// every target, the wafer too.
const ONE_HEAD: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
use std.metrics.accuracy

{EXAMPLES}
model one_head(
  features: { weight: f32[B, 1], x: f32[B, 4] },
  labels: { value: f32[B, 1], class: i32[B] },
) {
  let h = dense(concat([features.x, features.weight], axis: 1), 16, activation: relu)
  let logits = dense(h, 3)
  train   { minimize softmax_cross_entropy(labels.class, logits) with adam(lr: 0.01) }
  eval    { metric class_accuracy = accuracy(labels.class, argmax(logits, 1)) }
  predict { class = argmax(logits, 1) }
}

estimator one_head {
  model = one_head
  train_input = examples(training: true)
  eval_input = examples(training: false)
  config { random_seed = 7 }
}
"#;

/// An autoencoder: the input yields features alone, and the model takes no labels.
/// The eval input ends with a partial batch (360 rows in batches of 32), padded and
/// masked. (No predict section: the wafer has no layout yet for a per-sample output of
/// a layer of several lanes, E0601.)
fn autoencoder() -> String {
    let csv = common::root().join("examples/data/digits_test.csv");
    format!(
        r#"
use std.nn.dense
use std.losses.mean_squared_error
use std.metrics.mean_squared_error as reconstruction_error

input digits(training: bool) {{
  let d = csv("{}", columns: {{ pixels: f32[64], label: i32 }}) |> map |r| r.pixels / 16.0
  let d = if training {{ d |> shuffle(360) |> repeat }} else {{ d }}
  d |> batch(32, drop_remainder: training)
}}

model autoencoder(features: f32[B, 64]) {{
  let code = dense(features, 16, activation: relu)
  let reconstruction = dense(code, 64, activation: sigmoid)
  let loss = mean_squared_error(features, reconstruction)
  train {{ minimize loss with adam(lr: 0.01) }}
  eval  {{ metric error = reconstruction_error(features, reconstruction) }}
}}

estimator autoencoder {{
  model = autoencoder
  train_input = digits(training: true)
  eval_input = digits(training: false)
  config {{ random_seed = 3 }}
}}
"#,
        csv.display()
    )
}

fn targets(wafer: bool) -> Vec<Target> {
    let mut t = vec![Target::Interp];
    if cfg!(feature = "llvm") {
        t.push(Target::Host);
    }
    if wafer {
        t.push(Target::Wafer);
    }
    t
}

fn trained(src: &str, target: Target, tag: &str, steps: u64) -> (Estimator, std::path::PathBuf) {
    let dir = common::scratch("records", &format!("{tag}-{target:?}"));
    let src = src.replace("{EXAMPLES}", EXAMPLES);
    let p = Program::from_source(&format!("{tag}.est"), &src, None);
    let opts = RunOptions {
        target,
        model_dir: Some(dir.clone()),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{target:?}: {:?}", f.diags));
    let r = e.train(Steps::Max(steps)).unwrap();
    assert_eq!(r.global_step, steps as i64, "{target:?}");
    (e, dir)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-5 * b.abs().max(1.0)
}

/// Trains `src` on every target, then evaluates it (and predicts, when `predicts`),
/// comparing each with the interpreter. The interpreter's evaluation.
fn alike(src: &str, tag: &str, wafer: bool, predicts: bool) -> est::runtime::EvalReport {
    let (mut reference, rdir) = trained(src, Target::Interp, tag, 30);
    let want = reference.evaluate(None).unwrap();
    let rows = |d: &Path, e: &mut Estimator| -> Vec<serde_json::Value> {
        e.predict(&d.join("p"), None).unwrap();
        (std::fs::read_to_string(d.join("p/predictions.jsonl"))
            .unwrap()
            .lines())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
    };
    let want_rows = if predicts {
        rows(&rdir, &mut reference)
    } else {
        Vec::new()
    };
    for target in targets(wafer).into_iter().skip(1) {
        let (mut e, dir) = trained(src, target, tag, 30);
        let d = worst(&e.variables(), &reference.variables());
        assert!(d <= 1e-5, "{tag} on {target:?}: weights differ by {d:e}");
        let got = e.evaluate(None).unwrap();
        assert_eq!(got.examples, want.examples, "{tag} on {target:?}");
        assert!(
            close(got.loss, want.loss),
            "{tag} on {target:?}: loss {} vs {}",
            got.loss,
            want.loss
        );
        for ((n, a), (_, b)) in got.metrics.iter().zip(&want.metrics) {
            assert!(close(*a, *b), "{tag} on {target:?}: {n} {a} vs {b}");
        }
        if predicts {
            let got_rows = rows(&dir, &mut e);
            assert_eq!(got_rows.len(), want_rows.len());
            for (a, b) in got_rows.iter().zip(&want_rows) {
                assert_eq!(a["class"], b["class"], "{tag} on {target:?}");
            }
        }
    }
    want
}

#[test]
fn record_features_and_two_label_heads_train_alike_on_every_target() {
    let want = alike(TWO_HEADS, "two-heads", false, true);
    assert_eq!(want.examples, 90);
    let names: Vec<&str> = want.metrics.iter().map(|m| m.0.as_str()).collect();
    assert_eq!(names, ["class_accuracy", "value_rmse", "weighted_auc_pr"]);
    // the loss is the sum of the heads': the class head alone is above the value's rmse
    let rmse = want.metrics[1].1;
    assert!(
        want.loss > rmse * rmse,
        "loss {} against rmse {rmse}",
        want.loss
    );
}

#[test]
fn record_features_and_labels_train_alike_on_the_wafer_too() {
    let want = alike(ONE_HEAD, "one-head", true, true);
    assert_eq!(want.examples, 90);
}

#[test]
fn a_model_without_labels_trains_alike_on_every_target() {
    let want = alike(&autoencoder(), "autoencoder", true, false);
    assert_eq!(want.examples, 360);
    assert!(close(want.metrics[0].1, want.loss), "{:?}", want);
}

/// The predictions of a record model carry the predict section's names, one row per
/// example.
#[test]
fn predictions_of_a_record_model_have_every_head() {
    let (mut e, dir) = trained(TWO_HEADS, Target::Interp, "heads-predict", 5);
    let p = e.predict(&dir.join("p"), None).unwrap();
    assert_eq!(p.examples, 90);
    let text = std::fs::read_to_string(dir.join("p/predictions.jsonl")).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let keys: Vec<&str> = first
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    assert_eq!(keys, ["class", "value"]);
    assert!(first["class"].as_i64().is_some_and(|c| (0..3).contains(&c)));
    assert_eq!(first["value"].as_array().unwrap().len(), 1);
}
