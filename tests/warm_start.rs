//! Warm start (issue 13 §3): a fresh run starts its model's variables from another
//! run's checkpoint, as TensorFlow's `WarmStartSettings` does for fine-tuning, with
//! renames and skips; a variable the checkpoint lacks or holds with another shape is
//! E0921, naming it; a run with a checkpoint of its own resumes from it instead.

mod common;
use est::diag::Code;
use est::elab::Target;
use est::runtime::{Estimator, RunOptions, Steps};
use est::Program;
use std::path::Path;

/// A body of two layers and a head of `classes`, with `warm` as the estimator's
/// `warm_start_from` (or none). `body` names the first layer's scope.
fn program(body: &str, classes: usize, warm: &str) -> String {
    format!(
        r#"
use std.nn.dense
use std.losses.softmax_cross_entropy

input rows() {{
  range(40) |> map |i| (broadcast_to(cast(i % 7, f32) / 7.0, [5]), i % {classes}) |> repeat |> batch(8, drop_remainder: true)
}}

fn {body}(x) {{ dense(x, 6, activation: relu) }}
fn head(x) {{ dense(x, {classes}) }}

model m(features: f32[B, 5], labels: i32[B]) {{
  let logits = head({body}(features))
  train {{ minimize softmax_cross_entropy(labels, logits) with momentum(lr: 0.1) }}
}}

estimator e {{
  model = m
  train_input = rows()
  config {{ random_seed = 9 }}
  {warm}
}}
"#
    )
}

fn estimator(src: &str, dir: &Path) -> Result<Estimator, Vec<Code>> {
    let p = Program::from_source("warm.est", src, None);
    let opts = RunOptions {
        target: Target::Interp,
        model_dir: Some(dir.to_path_buf()),
        ..Default::default()
    };
    Estimator::new(&p, &opts).map_err(|f| f.diags.iter().map(|d| d.code).collect())
}

/// A trained base run of `program("encoder", 3, "")`: its directory.
fn base(tag: &str) -> std::path::PathBuf {
    let dir = common::scratch("warm", &format!("{tag}-base"));
    let mut e = estimator(&program("encoder", 3, ""), &dir).unwrap();
    e.train(Steps::Max(5)).unwrap();
    dir
}

#[test]
fn a_fresh_run_starts_from_the_checkpoint_renamed_and_skipped() {
    let from = base("fresh");
    let trained = estimator(&program("encoder", 3, ""), &from).unwrap();
    let mut t = trained;
    t.restore_or_init().unwrap();
    let want = t.variables();
    // the new model calls its body `body` and has a head of 5 classes, left to its
    // initialiser
    let warm = format!(
        "warm_start_from = warm_start(\"{}\", rename: [(\"body/dense/kernel\", \"encoder/dense/kernel\"), (\"body/dense/bias\", \"encoder/dense/bias\")], skip: [\"head\"])",
        from.display()
    );
    let dir = common::scratch("warm", "fresh-new");
    let mut e = estimator(&program("body", 5, &warm), &dir).unwrap();
    e.restore_or_init().unwrap();
    let got = e.variables();
    assert_eq!(got["body/dense/kernel"], want["encoder/dense/kernel"]);
    assert_eq!(got["body/dense/bias"], want["encoder/dense/bias"]);
    // a slot starts again; the head is the initialiser's (5 classes, not 3)
    assert!(got["body/dense/kernel/momentum"]
        .to_f64()
        .iter()
        .all(|&x| x == 0.0));
    assert_eq!(got["head/dense/kernel"].shape(), [6, 5]);
    let r = e.train(Steps::Add(2)).unwrap();
    assert_eq!(
        (r.start_step, r.global_step),
        (0, 2),
        "the global step starts at 0"
    );
    // a run with a checkpoint of its own resumes from it, not from the warm start
    let after = e.variables();
    let mut again = estimator(&program("body", 5, &warm), &dir).unwrap();
    again.restore_or_init().unwrap();
    assert_eq!(
        again.variables()["body/dense/kernel"],
        after["body/dense/kernel"]
    );
    assert_ne!(after["body/dense/kernel"], want["encoder/dense/kernel"]);
}

#[test]
fn a_variable_the_checkpoint_lacks_or_shapes_otherwise_is_e0921_naming_it() {
    let from = base("bad");
    let cases = [
        // no `body/...` in the checkpoint, and no rename
        (
            program(
                "body",
                3,
                &format!("warm_start_from = \"{}\"", from.display()),
            ),
            "body/dense/bias",
        ),
        // a head of 5 where the checkpoint's has 3
        (
            program(
                "encoder",
                5,
                &format!("warm_start_from = \"{}\"", from.display()),
            ),
            "head/dense/bias",
        ),
    ];
    for (i, (src, name)) in cases.iter().enumerate() {
        let dir = common::scratch("warm", &format!("bad-{i}"));
        let mut e = estimator(src, &dir).unwrap();
        let f = e.train(Steps::Add(1)).unwrap_err();
        let d = &f.diags[0];
        assert_eq!(d.code, Code::WarmStart, "{d:?}");
        assert!(d.message.contains(&format!("`{name}`")), "{}", d.message);
        assert!(
            est::runtime::checkpoint::steps(&dir).unwrap().is_empty(),
            "nothing is written"
        );
    }
    // and a path that holds no checkpoint
    let dir = common::scratch("warm", "bad-path");
    let src = program("encoder", 3, "warm_start_from = \"no/such/run\"");
    let f = estimator(&src, &dir)
        .unwrap()
        .train(Steps::Add(1))
        .unwrap_err();
    let codes: Vec<Code> = f.diags.iter().map(|d| d.code).collect();
    assert_eq!(codes, [Code::WarmStart]);
    assert!(
        f.diags[0].message.contains("no/such/run"),
        "{}",
        f.diags[0].message
    );
}
