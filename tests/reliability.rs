//! Results a user can trust: each test here is the regression test of a finding of
//! issue 10 (hostile probes of the runtime): NaN is never lost, a model_dir is locked
//! and its checkpoints checksummed and checked, bad labels and empty evaluations are
//! errors, partial last batches are evaluated exactly, resources are bounded.

use est::diag::Code;
use est::runtime::{checkpoint, Estimator, RunFailure, RunOptions, Steps};
use est::Program;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("est-reliability-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn codes(f: &RunFailure) -> Vec<Code> {
    f.diags.iter().map(|d| d.code).collect()
}

/// An estimator of `program` (named `name` when it has several) with its model_dir in
/// `dir` and its data under `data`.
fn estimator_of(p: &Program, name: Option<&str>, dir: &Path, data: &Path) -> Estimator {
    let opts = RunOptions {
        estimator: name.map(String::from),
        model_dir: Some(dir.to_path_buf()),
        data_dir: Some(data.to_path_buf()),
        ..Default::default()
    };
    Estimator::new(p, &opts).unwrap_or_else(|f| panic!("{:?}", f.diags))
}

/// The digits example with its data copied to `data/`, the training CSV changed by
/// `edit` (given the rows, header first).
fn digits_with(dir: &Path, edit: impl FnOnce(&mut Vec<String>)) -> Program {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let train = std::fs::read_to_string(root().join("examples/data/digits_train.csv")).unwrap();
    let mut rows: Vec<String> = train.lines().map(String::from).collect();
    edit(&mut rows);
    std::fs::write(data.join("digits_train.csv"), rows.join("\n") + "\n").unwrap();
    std::fs::copy(
        root().join("examples/data/digits_test.csv"),
        data.join("digits_test.csv"),
    )
    .unwrap();
    let text = std::fs::read_to_string(root().join("examples/digits_mlp.est")).unwrap();
    Program::from_source("digits_mlp.est", &text, Some(dir.to_path_buf()))
}

/// Every float value of every checkpoint in `dir` is finite.
fn checkpoints_are_finite(dir: &Path) -> bool {
    checkpoint::list(dir).iter().all(|c| {
        let (_, vars) = checkpoint::load(c).unwrap();
        vars.values()
            .all(|t| t.to_f64().iter().all(|v| v.is_finite()))
    })
}

/// Point 1: one `nan` pixel in the training CSV used to train to chance accuracy with
/// NaN in every checkpoint (relu mapped NaN to 0) and exit 0. Now the NaN reaches the
/// loss and E0902 stops training before any checkpoint holds it.
#[test]
fn a_nan_pixel_stops_training_with_e0902() {
    let dir = tmp("nan-pixel");
    let p = digits_with(&dir, |rows| {
        let mut cells: Vec<&str> = rows[100].split(',').collect();
        cells[20] = "nan";
        rows[100] = cells.join(",");
    });
    let model_dir = dir.join("model");
    let mut e = estimator_of(&p, None, &model_dir, &dir);
    let f = e.train(Steps::Default).unwrap_err();
    assert_eq!(codes(&f), [Code::NonFiniteLoss]);
    let msg = &f.diags[0].message;
    assert!(msg.starts_with("the loss is NaN at global step"), "{msg}");
    assert!(checkpoints_are_finite(&model_dir));
}

const GRADIENTS: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy

input rows() {
  csv("examples/data/digits_test.csv", columns: { pixels: f32[64], label: i32 })
    |> map |r| (r.pixels, r.label) |> repeat |> batch(8, drop_remainder: true)
}

// sqrt at 0: the loss is finite (0) but its gradient is infinite.
model inf_gradient(features: f32[B, 64], labels: i32[B]) {
  let w = variable("w", [3], init: "zeros")
  let loss = softmax_cross_entropy(labels, dense(features, 10)) + reduce_sum(sqrt(w))
  train { minimize loss with sgd(lr: 0.01) }
}

// A finite gradient (-1) and a finite learning rate push w past f32's largest value.
model overflowing_update(features: f32[B, 64], labels: i32[B]) {
  let w = variable("w", [1], init: init_constant(3.0e38))
  let loss = softmax_cross_entropy(labels, dense(features, 10)) - reduce_sum(w) * 1.0e-38
  train { minimize loss with sgd(lr: 1.0e76) }
}

// w grows tenfold a step: the loss is finite for 20 steps, then -inf.
model diverging(features: f32[B, 64], labels: i32[B]) {
  let w = variable("w", [1], init: init_constant(1.0))
  let loss = softmax_cross_entropy(labels, dense(features, 10)) - reduce_sum(square(w)) * 0.5
  train { minimize loss with sgd(lr: 9.0) }
}

estimator gradient { model = inf_gradient  train_input = rows() }
estimator update { model = overflowing_update  train_input = rows() }
estimator diverging {
  model = diverging  train_input = rows()
  config { iterations_per_loop = 10  save_checkpoint_steps = 10 }
}
"#;

/// Point 1: a NaN or an infinity in a gradient or an updated variable stops training,
/// not only a non-finite loss, and says which variable.
#[test]
fn a_non_finite_gradient_or_update_stops_training() {
    let p = Program::from_source("gradients.est", GRADIENTS, None);
    let dir = tmp("inf-gradient");
    let f = estimator_of(&p, Some("gradient"), &dir, &root())
        .train(Steps::Max(5))
        .unwrap_err();
    assert_eq!(codes(&f), [Code::NonFiniteLoss]);
    let msg = &f.diags[0].message;
    assert!(
        msg.starts_with("the gradient of `w` holds inf (element 0) at global step 1"),
        "{msg}"
    );
    let dir = tmp("inf-update");
    let f = estimator_of(&p, Some("update"), &dir, &root())
        .train(Steps::Max(5))
        .unwrap_err();
    assert_eq!(codes(&f), [Code::NonFiniteLoss]);
    let msg = &f.diags[0].message;
    assert!(
        msg.starts_with("the updated value of `w` holds inf (element 0) at global step 1"),
        "{msg}"
    );
}

/// Point 21: E0902's help used to call the last checkpoint intact and suggest resuming
/// from it, though it held diverged weights (1e20 here). It now says what was checked
/// (finite values, the largest weight) and warns when the weights are that large.
#[test]
fn e0902_says_what_was_checked_of_the_last_checkpoint() {
    let p = Program::from_source("gradients.est", GRADIENTS, None);
    let dir = tmp("diverging");
    let f = estimator_of(&p, Some("diverging"), &dir, &root())
        .train(Steps::Max(100))
        .unwrap_err();
    assert_eq!(codes(&f), [Code::NonFiniteLoss]);
    let d = &f.diags[0];
    assert!(
        d.message.starts_with("the loss is -inf at global step 21"),
        "{}",
        d.message
    );
    let help = d.help.as_deref().unwrap_or_default();
    assert!(
        help.contains("ckpt-20.safetensors (global step 20), holds only finite values"),
        "{help}"
    );
    assert!(
        help.contains("its largest weight is |w| = 1.000e20"),
        "{help}"
    );
    assert!(help.contains("already diverging"), "{help}");
    assert_eq!(checkpoint::latest(&dir).unwrap().step, 20);
    assert!(checkpoints_are_finite(&dir));
}
