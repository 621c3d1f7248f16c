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
    checkpoint::list(dir).unwrap().iter().all(|c| {
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
    assert_eq!(checkpoint::latest(&dir).unwrap().unwrap().step, 20);
    assert!(checkpoints_are_finite(&dir));
}

/// The digits example with a model_dir in `dir/model` and overridden config keys.
fn digits_in(dir: &Path, config: &[(&str, i64)]) -> Estimator {
    let p = Program::load(&root().join("examples/digits_mlp.est")).unwrap();
    let opts = RunOptions {
        model_dir: Some(dir.join("model")),
        config: config.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        ..Default::default()
    };
    Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{:?}", f.diags))
}

const SMALL: &[(&str, i64)] = &[
    ("iterations_per_loop", 10),
    ("save_checkpoint_steps", 10),
    ("keep_checkpoint_max", 5),
];

/// The names of the files in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Point 2: two runs on one model_dir both exited 0 and overwrote each other's
/// checkpoints. A training run now holds an exclusive `flock` on `.est.lock`; a second
/// training run is E0909 naming the holder's PID, `eval` reads alongside, and the lock
/// of a killed run is taken over.
#[test]
fn a_model_dir_is_locked_by_its_training_run() {
    let dir = tmp("lock");
    digits_in(&dir, SMALL).train(Steps::Max(10)).unwrap();
    let md = dir.join("model");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_estc"))
        .args([
            "train",
            root().join("examples/digits_mlp.est").to_str().unwrap(),
        ])
        .args([
            "--model-dir",
            md.to_str().unwrap(),
            "--max-steps",
            "100000000",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let lock = md.join(".est.lock");
    let t = std::time::Instant::now();
    while std::fs::read_to_string(&lock).ok().as_deref() != Some(pid.as_str()) {
        assert!(t.elapsed().as_secs() < 60, "the child never took the lock");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let f = digits_in(&dir, SMALL).train(Steps::Max(20)).unwrap_err();
    assert_eq!(codes(&f), [Code::ModelDirLocked]);
    assert!(
        f.diags[0]
            .message
            .ends_with(&format!("is in use by another training run (PID {pid})")),
        "{}",
        f.diags[0].message
    );
    // eval reads alongside the training run
    let m = digits_in(&dir, SMALL).evaluate(None).unwrap();
    assert_eq!(m.examples, 360);
    // SIGKILL: the kernel releases the lock, and the next run takes it over
    child.kill().unwrap();
    child.wait().unwrap();
    let r = digits_in(&dir, SMALL).train(Steps::Add(10)).unwrap();
    assert_eq!(r.global_step, r.start_step + 10);
    // within one process, a second holder is refused too
    let _held = est::runtime::model_dir::lock(&md).unwrap();
    let f = digits_in(&dir, SMALL).train(Steps::Add(10)).unwrap_err();
    assert_eq!(codes(&f), [Code::ModelDirLocked]);
}

/// Flips one bit `from_end` bytes before the end of `path`.
fn flip_bit(path: &Path, from_end: usize) {
    let mut b = std::fs::read(path).unwrap();
    let at = b.len() - from_end;
    b[at] ^= 0x10;
    std::fs::write(path, b).unwrap();
}

/// Points 3 and 5: a flipped bit in a tensor was restored silently, and a damaged
/// latest checkpoint stopped the run with no hint. Each tensor now has a CRC32C in the
/// metadata; training falls back to the newest intact checkpoint with W0910, which
/// names the tensor, and sets the damaged files aside; eval falls back too but moves
/// nothing; with no intact checkpoint left, E0911.
#[test]
fn a_damaged_checkpoint_is_detected_and_skipped() {
    let dir = tmp("bitflip");
    let md = dir.join("model");
    digits_in(&dir, SMALL).train(Steps::Max(30)).unwrap();
    flip_bit(&checkpoint::tensors_path(&md, 30), 5);
    // eval: falls back to step 20, leaves the files alone
    let mut e = digits_in(&dir, SMALL);
    let m = e.evaluate(None).unwrap();
    assert_eq!(m.global_step, 20);
    let w = e.take_warnings();
    assert_eq!(
        w.iter().map(|d| d.code).collect::<Vec<_>>(),
        [Code::DamagedCheckpoint]
    );
    assert!(
        w[0].message.starts_with(
            "the checkpoint of global step 30 is damaged (ckpt-30.safetensors: the data of `"
        ),
        "{}",
        w[0].message
    );
    assert!(
        w[0].message.contains("does not match its checksum"),
        "{}",
        w[0].message
    );
    assert_eq!(
        w[0].help.as_deref(),
        Some("its files are left as they are; a training run will set them aside")
    );
    assert!(checkpoint::tensors_path(&md, 30).exists());
    // train: falls back, sets the damaged files aside, and trains the steps again
    let mut e = digits_in(&dir, SMALL);
    let r = e.train(Steps::Max(40)).unwrap();
    assert_eq!((r.start_step, r.global_step), (20, 40));
    assert_eq!(e.take_warnings()[0].code, Code::DamagedCheckpoint);
    let files = names(&md);
    assert!(
        files.contains(&"ckpt-30.safetensors.damaged".to_string()),
        "{files:?}"
    );
    assert!(
        files.contains(&"ckpt-30.json.damaged".to_string()),
        "{files:?}"
    );
    assert!(
        files.contains(&"ckpt-30.safetensors".to_string()),
        "trained again: {files:?}"
    );
    // the weights equal an uninterrupted run's: the damage cost time, not results
    let whole = tmp("bitflip-whole");
    digits_in(&whole, SMALL).train(Steps::Max(40)).unwrap();
    assert_eq!(
        std::fs::read(checkpoint::tensors_path(&md, 40)).unwrap(),
        std::fs::read(checkpoint::tensors_path(&whole.join("model"), 40)).unwrap()
    );
    // a missing tensors file beside its metadata is damage too
    std::fs::remove_file(checkpoint::tensors_path(&md, 40)).unwrap();
    let mut e = digits_in(&dir, SMALL);
    assert_eq!(e.evaluate(None).unwrap().global_step, 30);
    let w = e.take_warnings();
    assert!(
        w[0].message
            .contains("(ckpt-40.safetensors is missing (its metadata ckpt-40.json is there))"),
        "{}",
        w[0].message
    );
    // nothing intact: E0911, and nothing is changed
    for c in checkpoint::list(&md)
        .unwrap()
        .iter()
        .filter(|c| c.tensors.exists())
    {
        flip_bit(&c.tensors, 5);
    }
    let before = names(&md);
    let f = digits_in(&dir, SMALL).train(Steps::Max(50)).unwrap_err();
    assert_eq!(codes(&f), [Code::NoCheckpoint]);
    assert!(
        f.diags[0].message.contains("is damaged: ckpt-40: "),
        "{}",
        f.diags[0].message
    );
    let mut after = names(&md);
    after.retain(|n| n != ".est.lock");
    let mut before = before;
    before.retain(|n| n != ".est.lock");
    assert_eq!(before, after);
}

/// Rewrites the metadata of `ckpt-step` with `edit`, sealing it again with a valid
/// checksum of its own when `seal` (a forged or buggy file rather than a flipped bit).
fn edit_meta(md: &Path, step: i64, seal: bool, edit: impl FnOnce(&mut checkpoint::Meta)) {
    let p = checkpoint::meta_path(md, step);
    let mut m: checkpoint::Meta = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut m);
    if seal {
        m.seal();
    }
    std::fs::write(&p, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

/// An edit of a checkpoint's metadata.
type MetaEdit = fn(&mut checkpoint::Meta);

/// Point 4: a `global_step` that disagrees with the file, a negative step and an
/// `input_position` of 1e12 were trusted (restarting forever, or skipping input
/// forever). Each is now damage, named precisely, and the run falls back.
#[test]
fn checkpoint_metadata_is_checked() {
    let dir = tmp("meta");
    let md = dir.join("model");
    digits_in(&dir, SMALL).train(Steps::Max(20)).unwrap();
    let cases: [(bool, MetaEdit, &str); 5] = [
        (
            true,
            |m| m.global_step = 5,
            "global_step is 5, but the file is the checkpoint of step 20",
        ),
        // (issue 43, finding 16: a huge max_shards let a huge input_position through,
        // which a resume passed over for minutes)
        (
            true,
            |m| {
                m.max_shards = Some(1 << 40);
                m.input_position = 20 << 40;
            },
            "max_shards is 1099511627776, more than any run has (4096)",
        ),
        (
            true,
            |m| m.input_position = 1_000_000_000_000,
            "input_position 1000000000000 is more than the train input can have produced in 20 steps of 1 shard (20)",
        ),
        (true, |m| m.max_shards = Some(0), "max_shards is 0"),
        (
            false,
            |m| m.input_position = 19,
            "the metadata does not match its checksum",
        ),
    ];
    let original = std::fs::read(checkpoint::meta_path(&md, 20)).unwrap();
    for (seal, edit, want) in cases {
        edit_meta(&md, 20, seal, edit);
        let mut e = digits_in(&dir, SMALL);
        assert_eq!(e.evaluate(None).unwrap().global_step, 10, "{want}");
        let w = e.take_warnings();
        assert!(
            w[0].message.contains(&format!("(ckpt-20.json: {want})")),
            "{}",
            w[0].message
        );
        std::fs::write(checkpoint::meta_path(&md, 20), &original).unwrap();
    }
    // a negative step in a file of its own
    let mut m: checkpoint::Meta = serde_json::from_slice(&original).unwrap();
    m.global_step = -3;
    m.seal();
    std::fs::write(
        checkpoint::meta_path(&md, -3),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    std::fs::copy(
        checkpoint::tensors_path(&md, 20),
        checkpoint::tensors_path(&md, -3),
    )
    .unwrap();
    let found = checkpoint::list(&md).unwrap();
    let neg = found.iter().find(|c| c.step == -3).unwrap();
    assert_eq!(
        checkpoint::load(neg).unwrap_err(),
        checkpoint::LoadError::Damaged("ckpt--3.json: the global step -3 is negative".into())
    );
}

/// Point 6: a directory of TensorFlow's checkpoints was treated as empty and est wrote
/// beside it. Now E0912, for training and evaluation, and nothing is written.
#[test]
fn a_foreign_checkpoint_directory_is_refused() {
    let dir = tmp("foreign");
    let md = dir.join("model");
    std::fs::create_dir_all(&md).unwrap();
    std::fs::write(md.join("checkpoint"), "model_checkpoint_path: \"ckpt-7\"\n").unwrap();
    std::fs::write(md.join("ckpt-7.index"), b"\x00").unwrap();
    std::fs::write(md.join("ckpt-7.data-00000-of-00001"), b"\x00").unwrap();
    let before = names(&md);
    let f = digits_in(&dir, SMALL).train(Steps::Max(10)).unwrap_err();
    assert_eq!(codes(&f), [Code::ForeignModelDir]);
    assert!(
        f.diags[0].message.ends_with("holds checkpoint files est did not write (checkpoint, ckpt-7.data-00000-of-00001, ckpt-7.index)"),
        "{}",
        f.diags[0].message
    );
    assert!(f.diags[0].help.as_deref().unwrap().contains("TensorFlow"));
    let f = digits_in(&dir, SMALL).evaluate(None).unwrap_err();
    assert_eq!(codes(&f), [Code::ForeignModelDir]);
    assert_eq!(names(&md), before, "nothing written");
}

/// Point 17: an unwritable model_dir (a regular file, /dev/null, a directory that
/// cannot be written) was found only when the first summary was written, after a loop
/// of training. It is now E0904 before the first step, with the right message.
#[test]
fn an_unwritable_model_dir_is_found_before_training() {
    let dir = tmp("unwritable");
    let file = dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let cases = [
        (
            file.clone(),
            format!("{} is not a directory", file.display()),
        ),
        (
            PathBuf::from("/dev/null"),
            "/dev/null is not a directory".to_string(),
        ),
        (
            file.join("model"),
            format!(
                "cannot create {}: {} is a file, not a directory",
                file.join("model").display(),
                file.display()
            ),
        ),
        (
            PathBuf::from("/sys/kernel"),
            "/sys/kernel is not writable: Permission denied (os error 13)".to_string(),
        ),
        (
            dir.join("dangling"),
            format!(
                "{} is a symbolic link to {}, which does not exist",
                dir.join("dangling").display(),
                dir.join("nowhere").display()
            ),
        ),
    ];
    std::os::unix::fs::symlink(dir.join("nowhere"), dir.join("dangling")).unwrap();
    let p = Program::load(&root().join("examples/digits_mlp.est")).unwrap();
    for (md, want) in cases {
        let opts = RunOptions {
            model_dir: Some(md.clone()),
            ..Default::default()
        };
        let mut e = Estimator::new(&p, &opts).unwrap();
        let t = std::time::Instant::now();
        let f = e.train(Steps::Max(100)).unwrap_err();
        assert_eq!(codes(&f), [Code::RunIo], "{}", md.display());
        assert_eq!(
            f.diags[0].message,
            format!("cannot train in this model_dir: {want}")
        );
        assert_eq!(e.global_step(), 0, "no step ran");
        assert!(t.elapsed().as_secs() < 30);
    }
}

/// Point 17: `eval` on a model_dir whose `eval/` cannot be written still reports its
/// metrics, with W0914.
#[test]
fn eval_reports_metrics_when_summaries_cannot_be_written() {
    let dir = tmp("eval-ro");
    digits_in(&dir, SMALL).train(Steps::Max(10)).unwrap();
    std::fs::write(dir.join("model/eval"), "in the way").unwrap();
    let mut e = digits_in(&dir, SMALL);
    let m = e.evaluate(None).unwrap();
    assert_eq!(m.examples, 360);
    assert!(m.metrics[0].1 > 0.1);
    let w = e.take_warnings();
    assert_eq!(
        w.iter().map(|d| d.code).collect::<Vec<_>>(),
        [Code::SummariesNotWritten]
    );
}

/// Point 18: a failed save left its `.tmp-PID` file behind (on a full disk, keeping it
/// full). The temporary file is now removed when a write fails, and a training run
/// removes those of killed runs when it takes the lock.
#[test]
fn failed_saves_leave_no_temporary_files() {
    let dir = tmp("tmpfiles");
    let md = dir.join("model");
    // the rename of step 10's tensors fails: a non-empty directory is in the way
    std::fs::create_dir_all(checkpoint::tensors_path(&md, 10).join("x")).unwrap();
    std::fs::write(
        md.join(".ckpt-5.safetensors.tmp-99999"),
        b"left by a killed run",
    )
    .unwrap();
    let f = digits_in(&dir, SMALL).train(Steps::Max(10)).unwrap_err();
    assert_eq!(codes(&f), [Code::RunIo]);
    let temps: Vec<String> = names(&md)
        .into_iter()
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(temps.is_empty(), "{temps:?}");
    // the cache: a failed store removes its temporary file too
    let cache = dir.join("cache");
    std::fs::create_dir_all(cache.join("c.estcache").join("x")).unwrap();
    assert!(est::data::cache::store(&cache.join("c.estcache"), "c", 1, &[]).is_err());
    assert_eq!(names(&cache), ["c.estcache"]);
}

/// Point 19: after a crash and resume TensorBoard showed the redone steps twice. Each
/// training run's event file now starts with a `SessionLog` START (`Event` field 7,
/// status 1) at the step after the one it starts from, which makes TensorBoard purge
/// the orphaned events (checked by hand with TensorBoard's `EventAccumulator`).
#[test]
fn a_resumed_run_writes_session_start_at_its_step() {
    let dir = tmp("session");
    digits_in(&dir, SMALL).train(Steps::Max(20)).unwrap();
    digits_in(&dir, SMALL).train(Steps::Max(30)).unwrap();
    let md = dir.join("model");
    let mut starts: Vec<Vec<i64>> = names(&md)
        .iter()
        .filter(|n| n.starts_with("events.out.tfevents"))
        .map(|n| est::runtime::summary::read_session_starts(&md.join(n)).unwrap())
        .collect();
    starts.sort();
    assert_eq!(starts, [vec![1], vec![21]]);
}

const PARTIAL: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
use std.metrics.{accuracy, mean}

params {
  eval_batch: int = 360
  max_label: int = 10
}

input train_rows() {
  csv("data/digits_train.csv", columns: { pixels: f32[64], label: i32 })
    |> map |r| (r.pixels / 16.0, r.label)
    |> shuffle(2_000) |> repeat |> batch(32, drop_remainder: true)
}

input test_rows() {
  csv("data/digits_test.csv", columns: { pixels: f32[64], label: i32 })
    |> filter |r| r.label < params.max_label
    |> map |r| (r.pixels / 16.0, r.label)
    |> batch(params.eval_batch)
}

input test_records() {
  tfrecord("data/digits_test.tfrecord", skip_corrupt: true)
    |> parse { pixels: f32[64], label: i32 }
    |> map |r| (r.pixels / 16.0, r.label)
    |> batch(params.eval_batch)
}

model m(features: f32[B, 64], labels: i32[B]) {
  let logits = dense(dense(features, 32, activation: relu), 10)
  let loss = softmax_cross_entropy(labels, logits)
  train   { minimize loss with momentum(lr: 0.1, momentum: 0.9) }
  eval    {
    metric accuracy = accuracy(labels, argmax(logits, 1))
    metric mean_label = mean(cast(labels, f32))
    metric top_logit = mean(reduce_max(logits, axis: 1))
  }
  predict { classes = argmax(logits, 1); probabilities = softmax(logits) }
}

estimator digits {
  model = m
  train_input = train_rows()
  eval_input = test_rows()
  predict_input = test_rows()
  config { random_seed = 5 }
}

estimator records {
  model = m
  train_input = train_rows()
  eval_input = test_records()
}

// A loss that sums over the batch: exact only when every batch is full (W0513).
model summed(features: f32[B, 64], labels: i32[B]) {
  let logits = dense(features, 10)
  let per = -reduce_sum(one_hot(labels, 10) * log_softmax(logits), axis: 1)
  let loss = reduce_sum(per) / float(params.eval_batch)
  train { minimize loss with sgd(lr: 0.1) }
}

estimator summed {
  model = summed
  train_input = train_rows()
  eval_input = test_rows()
}
"#;

/// The digits CSVs, copied to `dir/data`.
fn copy_digits(dir: &Path) {
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    for f in ["digits_train.csv", "digits_test.csv"] {
        std::fs::copy(root().join("examples/data").join(f), data.join(f)).unwrap();
    }
}

/// An estimator of `PARTIAL` with its data under `dir/data` and model_dir `dir/model`.
fn partial(dir: &Path, name: &str, eval_batch: usize, shards: i64) -> Estimator {
    partial_with(dir, name, eval_batch, shards, &[])
}

fn partial_with(
    dir: &Path,
    name: &str,
    eval_batch: usize,
    shards: i64,
    params: &[(&str, &str)],
) -> Estimator {
    let mut p = Program::from_source("partial.est", PARTIAL, None);
    p.add_override("eval_batch", &eval_batch.to_string(), "--param eval_batch");
    for (k, v) in params {
        p.add_override(k, v, &format!("--param {k}"));
    }
    let opts = RunOptions {
        estimator: Some(name.into()),
        model_dir: Some(dir.join("model")),
        data_dir: Some(dir.to_path_buf()),
        config: vec![("num_shards".into(), shards)],
        ..Default::default()
    };
    Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{:?}", f.diags))
}

fn metric(r: &est::runtime::EvalReport, name: &str) -> f64 {
    r.metrics.iter().find(|(k, _)| k == name).unwrap().1
}

/// Point 12: eval and predict inputs with a partial last batch passed `check` and
/// failed at run time (E0906), so most eval sets could not be evaluated in full. The
/// last batch is now padded and masked: metrics and the loss over batches of 64 (the
/// last of 40), of 7 (the last of 3) and over two shards equal those of one batch of
/// all 360 examples, and predict writes one row per example.
#[test]
fn a_partial_last_batch_is_evaluated_exactly() {
    let dir = tmp("partial");
    copy_digits(&dir);
    partial(&dir, "digits", 360, 1)
        .train(Steps::Max(60))
        .unwrap();
    let whole = partial(&dir, "digits", 360, 1).evaluate(None).unwrap();
    assert_eq!((whole.steps, whole.examples), (1, 360));
    for (batch, shards, steps) in [(64, 1, 6), (7, 1, 52), (64, 2, 3), (50, 2, 4)] {
        let r = partial(&dir, "digits", batch, shards)
            .evaluate(None)
            .unwrap();
        let case = format!("batch {batch}, {shards} shard(s)");
        assert_eq!((r.steps, r.examples), (steps, 360), "{case}");
        assert_eq!(metric(&r, "accuracy"), metric(&whole, "accuracy"), "{case}");
        assert_eq!(
            metric(&r, "mean_label"),
            metric(&whole, "mean_label"),
            "{case}"
        );
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
        assert!(
            close(metric(&r, "top_logit"), metric(&whole, "top_logit")),
            "{case}"
        );
        assert!(
            close(r.loss, whole.loss),
            "{case}: loss {} vs {}",
            r.loss,
            whole.loss
        );
    }
    // predict: one row per real example, the same as from one whole batch
    let read = |batch: usize| {
        let out = dir.join(format!("pred-{batch}"));
        let p = partial(&dir, "digits", batch, 1)
            .predict(&out, None)
            .unwrap();
        assert_eq!(p.examples, 360);
        std::fs::read_to_string(out.join("predictions.jsonl")).unwrap()
    };
    let (a, b) = (read(360), read(64));
    assert_eq!(b.lines().count(), 360);
    for (x, y) in a.lines().zip(b.lines()) {
        let x: serde_json::Value = serde_json::from_str(x).unwrap();
        let y: serde_json::Value = serde_json::from_str(y).unwrap();
        assert_eq!(x["classes"], y["classes"]);
    }
}

/// Point 12: `skip_corrupt` made the eval set's size a non-multiple of the batch and
/// broke evaluation; now the 359 intact records are evaluated.
#[test]
fn skip_corrupt_evaluation_counts_the_intact_records() {
    let dir = tmp("partial-records");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::copy(
        root().join("examples/data/digits_train.csv"),
        data.join("digits_train.csv"),
    )
    .unwrap();
    let opts = est::data::convert::ConvertOptions {
        from: est::data::convert::From::Csv,
        inputs: vec![root().join("examples/data/digits_test.csv")],
        output: data.join("digits_test"),
        shards: 1,
        labels: None,
        groups: vec![("pixels".into(), "p0".into(), "p63".into())],
        kinds: vec![("pixels".into(), est::data::convert::Kind::Float)],
    };
    est::data::convert::convert(&opts, &mut |_, _| {}).unwrap();
    let file = data.join("digits_test.tfrecord");
    // a bit of the data of record 100 (records are 8 + 4 + len + 4 bytes)
    let mut b = std::fs::read(&file).unwrap();
    let len = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    b[100 * (len + 16) + 12 + len / 2] ^= 0x01;
    std::fs::write(&file, b).unwrap();
    let mut e = partial(&dir, "records", 40, 1);
    e.train(Steps::Max(20)).unwrap();
    let r = e.evaluate(None).unwrap();
    assert_eq!((r.steps, r.examples), (9, 359));
    assert_eq!(e.skipped_records(), 1);
}

/// Point 9: an evaluation over zero batches printed `accuracy = 0`, wrote it to
/// TensorBoard, and `--smoke` said ok. It is now E0913 and nothing is written.
#[test]
fn an_evaluation_over_no_examples_is_an_error() {
    let dir = tmp("empty-eval");
    copy_digits(&dir);
    // a filter that keeps no test row
    let none = [("max_label", "0")];
    let mut e = partial_with(&dir, "digits", 40, 1, &none);
    e.train(Steps::Max(10)).unwrap();
    let f = e.evaluate(None).unwrap_err();
    assert_eq!(codes(&f), [Code::NoExamples]);
    assert_eq!(
        f.diags[0].message,
        "the evaluation ran over no examples: the eval input yielded no batch"
    );
    let f = e.evaluate(Some(0)).unwrap_err();
    assert_eq!(codes(&f), [Code::NoExamples]);
    let f = e.predict(&dir.join("pred"), None).unwrap_err();
    assert_eq!(codes(&f), [Code::NoExamples]);
    assert!(!dir.join("model/eval").exists(), "no summary written");
    assert!(!dir.join("pred").exists(), "no prediction written");
    let f = partial_with(&dir, "digits", 40, 1, &none)
        .smoke()
        .unwrap_err();
    assert_eq!(codes(&f), [Code::NoExamples]);
    // eval and predict need a checkpoint: untrained weights mean nothing
    let f = partial(&tmp("untrained"), "digits", 40, 1)
        .evaluate(None)
        .unwrap_err();
    assert_eq!(codes(&f), [Code::NoCheckpoint]);
}

/// Trains one step of a model on `rows.csv` written with `csv` (columns x: f32[2] and
/// label: i32), and returns the failure.
fn train_on_csv(name: &str, csv: &str) -> RunFailure {
    let dir = tmp(name);
    std::fs::write(dir.join("rows.csv"), csv).unwrap();
    let src = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
input rows() {
  csv("rows.csv", columns: { x: f32[2], label: i32 }) |> map |r| (r.x, r.label) |> batch(2, drop_remainder: true)
}
model m(features: f32[B, 2], labels: i32[B]) {
  let loss = softmax_cross_entropy(labels, dense(features, 2))
  train { minimize loss with sgd(lr: 0.1) }
}
estimator e { model = m  train_input = rows() }
"#;
    let p = Program::from_source("csv.est", src, None);
    estimator_of(&p, None, &dir.join("model"), &dir)
        .train(Steps::Max(1))
        .unwrap_err()
}

/// Point 7: CSV integer fields wrapped to i32 (99999999999 became 1215752191). A value
/// out of its column's range is now E0905 naming file, line and column; so is a float
/// beyond f32's range, which became infinite. Whitespace-only lines are blank lines.
#[test]
fn csv_values_out_of_range_are_errors() {
    let f = train_on_csv("csv-int", "x0,x1,label\n1,2,0\n  \n3,4,99999999999\n");
    assert_eq!(codes(&f), [Code::BadData]);
    assert!(
        f.diags[0].message.ends_with(
            "rows.csv:4:3: column `label`: 99999999999 is out of range for i32 ([-2147483648, 2147483647])"
        ),
        "{}",
        f.diags[0].message
    );
    let f = train_on_csv("csv-float", "x0,x1,label\n3.4028235e38,2,0\n3,1e40,1\n");
    assert_eq!(codes(&f), [Code::BadData]);
    assert!(
        f.diags[0]
            .message
            .contains("rows.csv:3:2: column `x`: 1e40 is out of range for f32"),
        "{}",
        f.diags[0].message
    );
}

const LABELS: &str = r#"
use std.nn.dense
use std.losses.{softmax_cross_entropy, mean_squared_error}
use std.metrics.accuracy

input rows(path: string) {
  csv(path, columns: { pixels: f32[64], label: i32 })
    |> map |r| (r.pixels / 16.0, r.label) |> batch(8, drop_remainder: true)
}

// The loss takes the labels through a one_hot of the program's own.
model own_one_hot(features: f32[B, 64], labels: i32[B]) {
  let logits = dense(features, 10)
  let loss = softmax_cross_entropy(one_hot(labels, 10), logits)
  train { minimize loss with sgd(lr: 0.1) }
}

// No one_hot in the loss: only accuracy sees the labels as classes.
model regression(features: f32[B, 64], labels: i32[B]) {
  let logits = dense(features, 10)
  let loss = mean_squared_error(labels, reduce_sum(logits, axis: 1))
  train { minimize loss with sgd(lr: 0.001) }
  eval  { metric accuracy = accuracy(labels, argmax(logits, 1)) }
}

estimator own { model = own_one_hot  train_input = rows("data/bad.csv") }
estimator scored {
  model = regression  train_input = rows("data/good.csv")  eval_input = rows("data/bad.csv")
}
"#;

/// Point 8: class labels outside `[0, classes)` trained silently on zero rows in the
/// sparse losses, a `one_hot` in a loss and `accuracy`. Each is now E0915 naming the
/// step (or eval batch), the label and its batch position.
#[test]
fn labels_out_of_range_are_errors() {
    // the sparse path of softmax_cross_entropy, in the digits example
    let dir = tmp("labels-sparse");
    let p = digits_with(&dir, |rows| {
        let mut cells: Vec<&str> = rows[1].split(',').collect();
        *cells.last_mut().unwrap() = "10";
        rows[1] = cells.join(",");
    });
    let f = estimator_of(&p, None, &dir.join("model"), &dir)
        .train(Steps::Default)
        .unwrap_err();
    assert_eq!(codes(&f), [Code::LabelOutOfRange]);
    let msg = &f.diags[0].message;
    assert!(msg.starts_with("at global step "), "{msg}");
    assert!(
        msg.contains(": label 10 at batch position ")
            && msg.ends_with(" is outside [0, 10) (the model has 10 classes)"),
        "{msg}"
    );
    // a one_hot of the program's own, in the loss: the 3rd row of the 2nd batch
    let dir = tmp("labels-own");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let test = std::fs::read_to_string(root().join("examples/data/digits_test.csv")).unwrap();
    let mut rows: Vec<String> = test.lines().map(String::from).collect();
    std::fs::write(data.join("good.csv"), rows.join("\n") + "\n").unwrap();
    let mut cells: Vec<String> = rows[11].split(',').map(String::from).collect();
    *cells.last_mut().unwrap() = "-1".into();
    rows[11] = cells.join(",");
    std::fs::write(data.join("bad.csv"), rows.join("\n") + "\n").unwrap();
    let p = Program::from_source("labels.est", LABELS, None);
    let f = estimator_of(&p, Some("own"), &dir.join("model-own"), &dir)
        .train(Steps::Max(5))
        .unwrap_err();
    assert_eq!(codes(&f), [Code::LabelOutOfRange]);
    assert_eq!(
        f.diags[0].message,
        "at global step 2: label -1 at batch position 2 is outside [0, 10) (the model has 10 classes)"
    );
    // the variables of step 1 were intact: kept, with the input position before the
    // bad batch
    let help = f.diags[0].help.as_deref().unwrap_or_default();
    assert!(
        help.contains("training stopped after global step 1; its checkpoint"),
        "{help}"
    );
    let kept = checkpoint::latest(&dir.join("model-own")).unwrap().unwrap();
    assert_eq!(kept.step, 1);
    // accuracy's labels, in evaluation
    let mut e = estimator_of(&p, Some("scored"), &dir.join("model-scored"), &dir);
    e.train(Steps::Max(5)).unwrap();
    let f = e.evaluate(None).unwrap_err();
    assert_eq!(codes(&f), [Code::LabelOutOfRange]);
    assert_eq!(
        f.diags[0].message,
        "in eval batch 2: label -1 at batch position 2 is outside [0, 10) (the model has 10 classes)"
    );
}

/// Point 11: `estc predict` on a model without a predict section wrote "0 predictions"
/// and exited 0. It is now E0511, and nothing is written.
#[test]
fn predict_without_a_predict_section_is_an_error() {
    let src = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
input rows() {
  csv("examples/data/digits_test.csv", columns: { pixels: f32[64], label: i32 })
    |> map |r| (r.pixels, r.label) |> batch(8, drop_remainder: true)
}
model m(features: f32[B, 64], labels: i32[B]) {
  let loss = softmax_cross_entropy(labels, dense(features, 10))
  train { minimize loss with sgd(lr: 0.1) }
}
estimator e { model = m  train_input = rows()  predict_input = rows() }
"#;
    let p = Program::from_source("nopredict.est", src, None);
    let dir = tmp("nopredict");
    // untrained: the missing section is said first, not the missing checkpoint
    let mut e = estimator_of(&p, None, &dir.join("model"), &root());
    let f = e.predict(&dir.join("out"), None).unwrap_err();
    assert_eq!(codes(&f), [Code::InvalidModel]);
    assert_eq!(
        f.diags[0].message,
        "the model has no predictions: its predict section is missing or empty"
    );
    assert!(!dir.join("out").exists());
}

/// Point 13: huge static shapes passed `check` and aborted with "memory allocation
/// failed" (or woke the OOM killer). `check` now estimates each graph's memory (E0602,
/// naming the largest tensors; the cases are in tests/ui/memory/), and with the limit
/// lifted the interpreter's large allocations are fallible: an error, not an abort.
#[test]
fn allocation_beyond_the_machine_is_an_error_not_an_abort() {
    let src =
        std::fs::read_to_string(root().join("tests/ui/memory/E0602_huge_tensors.est")).unwrap();
    let p = Program::from_source("huge.est", &src, Some(root().join("tests/ui/memory")));
    let dir = tmp("huge");
    let check = |limit: Option<u64>| {
        let opts = RunOptions {
            estimator: Some("b".into()),
            model_dir: Some(dir.join("model")),
            data_dir: Some(root().join("examples")),
            memory_limit: limit,
            // the interpreter materialises the huge constant (the host fuses it into
            // the loop that reads it, and so needs no such buffer)
            target: est::elab::Target::Interp,
            ..Default::default()
        };
        Estimator::new(&p, &opts)
    };
    let f = check(Some(16 << 30)).err().unwrap();
    assert_eq!(codes(&f), [Code::OutOfMemory]);
    // 4 TB of zeros: no machine here has it, so the reservation fails
    let mut e = check(Some(u64::MAX)).unwrap_or_else(|f| panic!("{:?}", f.diags));
    let f = e.train(Steps::Max(1)).unwrap_err();
    assert_eq!(codes(&f), [Code::RunFailed]);
    assert!(
        f.diags[0]
            .message
            .starts_with("const failed at global step 1: cannot allocate 3.6 TiB for its result"),
        "{}",
        f.diags[0].message
    );
}

/// Review findings on the runtime, each with its regression test.
///
/// A checkpoint pruned by a training run alongside while an evaluation read it is not
/// damage: `load` says it is gone, and `restore` goes on to the newest one.
#[test]
fn a_checkpoint_pruned_while_read_is_gone_not_damaged() {
    let dir = tmp("pruned");
    digits_in(&dir, SMALL).train(Steps::Max(20)).unwrap();
    let md = dir.join("model");
    let found = checkpoint::list(&md).unwrap();
    let first = found[0].clone();
    std::fs::remove_file(&first.meta).unwrap();
    std::fs::remove_file(&first.tensors).unwrap();
    assert_eq!(
        checkpoint::load(&first).unwrap_err(),
        checkpoint::LoadError::Gone
    );
    // the tensors gone but the metadata there: that is damage
    let second = found[1].clone();
    let kept = std::fs::read(&second.tensors).unwrap();
    std::fs::remove_file(&second.tensors).unwrap();
    assert!(matches!(
        checkpoint::load(&second).unwrap_err(),
        checkpoint::LoadError::Damaged(_)
    ));
    std::fs::write(&second.tensors, kept).unwrap();
    assert_eq!(checkpoint::restore(&md).unwrap().unwrap().found.step, 20);
}

/// A checkpoint of an est that recorded no checksums and no `max_shards`, trained with
/// two shards, is restored by a run with one: its input position (two elements a step)
/// is within what any run could have read.
#[test]
fn an_older_checkpoint_of_a_sharded_run_is_restored() {
    let dir = tmp("old-format");
    let md = dir.join("model");
    let cfg = [
        ("iterations_per_loop", 10),
        ("save_checkpoint_steps", 10),
        ("num_shards", 2),
    ];
    digits_in(&dir, &cfg).train(Steps::Max(10)).unwrap();
    edit_meta(&md, 10, false, |m| {
        assert_eq!(m.input_position, 20);
        m.checksums = None;
        m.meta_checksum = None;
        m.max_shards = None;
    });
    let mut e = digits_in(&dir, SMALL);
    let r = e.evaluate(Some(1)).unwrap();
    assert_eq!(r.global_step, 10);
    assert!(e.take_warnings().is_empty());
}

/// The AUC of scores with a NaN is NaN, computed at once (the tie loop never ended).
#[test]
fn auc_of_a_nan_score_is_nan() {
    let t = |v: &[f64]| {
        est::tensor::Tensor::from_f64(
            &est::ir::TensorType::new(est::ir::DType::F32, vec![v.len()]),
            v.to_vec(),
        )
    };
    let mut auc = est::runtime::metrics::builtin("auc").unwrap()();
    auc.accumulate(&[&t(&[1.0, 0.0, 1.0]), &t(&[0.3, f64::NAN, 0.9])]);
    assert!(auc.result().is_nan());
}

/// An embedding program that trains, lets another run train the same model_dir, and
/// trains again, continues from the other run's checkpoint instead of overwriting it
/// with its older state.
#[test]
fn a_second_train_call_reads_what_another_run_saved() {
    let dir = tmp("catch-up");
    let mut a = digits_in(&dir, SMALL);
    a.train(Steps::Max(10)).unwrap();
    let mut b = digits_in(&dir, SMALL);
    assert_eq!(b.train(Steps::Max(30)).unwrap().global_step, 30);
    let r = a.train(Steps::Add(10)).unwrap();
    assert_eq!((r.start_step, r.global_step), (30, 40));
}

/// A graph that a padded batch would change (W0513 at check time: here a loss that sums
/// over the batch) evaluates as it always did when every batch is full, and stops with
/// E0916 when a partial batch arrives, instead of reporting a loss that depends on the
/// batch size.
#[test]
fn an_inexact_graph_stops_only_when_a_partial_batch_arrives() {
    let dir = tmp("inexact");
    copy_digits(&dir);
    partial(&dir, "summed", 40, 1)
        .train(Steps::Max(10))
        .unwrap();
    let r = partial(&dir, "summed", 40, 1).evaluate(None).unwrap();
    assert_eq!((r.steps, r.examples), (9, 360));
    let f = partial(&dir, "summed", 64, 1).evaluate(None).unwrap_err();
    assert_eq!(codes(&f), [Code::InexactPartialBatch]);
    assert_eq!(
        f.diags[0].message,
        "in eval batch 6: a partial batch of 40 (of 64) arrived, and the eval loss `loss` would come out differently with padding"
    );
}
