//! The `estc` binary: exit statuses, output formats, `explain`, overrides and dumps.

use std::process::{Command, Output};

fn estc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_estc"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("estc runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn scratch(name: &str, text: &str) -> String {
    let dir = std::env::temp_dir().join(format!("estc-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p.to_string_lossy().into_owned()
}

const BROKEN: &str = "use std.nn.dense
params { batch_size: int = 8 }
input d() { range(16) |> map |i| (fill([4], 1.0), i) |> repeat |> batch(params.batch_size, drop_remainder: true) }
model m(features: f32[B, 4], labels: i32[B]) {
  let h = dense(featurs, 3)
  let loss = reduce_mean(features + fill([5], 1.0))
  train { minimize loss with sgd(lr: 0.1) }
  predict { y = h }
}
estimator e { model = m  train_input = d() }
";

#[test]
fn exit_statuses() {
    let ok = estc(&["check", "examples/mnist_cnn.est"]);
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    assert!(stderr(&ok).contains("ok (3 graphs checked)"));
    let bad = estc(&["check", &scratch("broken.est", BROKEN)]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("2 errors"), "{}", stderr(&bad));
    let missing = estc(&["check", "no/such/file.est"]);
    assert_eq!(missing.status.code(), Some(2));
    let usage = estc(&["check", "examples/mnist_cnn.est", "--target", "gpu"]);
    assert_eq!(usage.status.code(), Some(2));
    let bad_param = estc(&["check", "examples/mnist_cnn.est", "--param", "novalue"]);
    assert_eq!(bad_param.status.code(), Some(2));
}

#[test]
fn json_diagnostics_have_every_field() {
    let out = estc(&[
        "check",
        &scratch("broken_json.est", BROKEN),
        "--message-format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2, "{}", stdout(&out));
    let unknown = lines
        .iter()
        .find(|d| d["code"] == "E0201")
        .expect("unknown name reported");
    assert_eq!(unknown["severity"], "error");
    assert_eq!(unknown["line"], 5);
    assert_eq!(unknown["column"], 17);
    assert_eq!(unknown["end_line"], 5);
    assert_eq!(unknown["end_column"], 24);
    assert!(unknown["help"]
        .as_str()
        .is_some_and(|h| h.contains("features")));
    // its fix: the suggested name where the misspelled one is
    assert_eq!(
        unknown["fixes"],
        serde_json::json!([{"title": "replace `featurs` with `features`", "edits": [{
            "file": unknown["file"], "line": 5, "column": 17, "end_line": 5, "end_column": 24,
            "text": "features"}]}])
    );
    let shape = lines
        .iter()
        .find(|d| d["code"] == "E0401")
        .expect("shape mismatch reported");
    let related = shape["related"].as_array().expect("related spans");
    assert_eq!(related.len(), 2, "both operands are labelled: {shape}");
    assert!(related
        .iter()
        .any(|r| r["label"].as_str().is_some_and(|l| l.contains("f32[8, 4]"))));
    assert!(related
        .iter()
        .any(|r| r["label"].as_str().is_some_and(|l| l.contains("f32[5]"))));
    for field in ["file", "message", "label", "column", "end_column"] {
        assert!(!shape[field].is_null(), "missing {field}");
    }
    assert_eq!(shape["fixes"], serde_json::json!([]));
}

#[test]
fn explain_prints_the_catalogue_entry() {
    let out = estc(&["explain", "e0401"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).starts_with("E0401 (error): shape mismatch"));
    assert_eq!(estc(&["explain", "E9999"]).status.code(), Some(2));
    let list = estc(&["explain", "--list"]);
    assert_eq!(stdout(&list).lines().count(), est::diag::Code::all().len());
}

#[test]
fn diagnostics_catalogue_doc_is_current() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/diagnostics.md"))
        .expect("docs/diagnostics.md");
    assert!(
        doc == est::diag::catalogue_markdown(),
        "docs/diagnostics.md is stale: run `estc explain --markdown > docs/diagnostics.md`"
    );
}

/// docs/cli.md lists every code with its severity and title, as `estc explain --list`.
#[test]
fn cli_doc_lists_every_code() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli.md"))
        .expect("docs/cli.md");
    let listed: Vec<&str> = doc
        .lines()
        .filter(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            cells.len() == 3
                && est::diag::Code::from_id(cells[0].trim_start_matches("| ")).is_some()
                && ["error", "warning"].contains(&cells[1])
        })
        .collect();
    let want: Vec<String> = est::diag::Code::all()
        .iter()
        .map(|c| format!("| {} | {} | {} |", c.id, c.severity.name(), c.title))
        .collect();
    assert_eq!(listed, want, "docs/cli.md's list of codes is stale");
}

#[test]
fn param_overrides_reach_the_graph() {
    let out = estc(&[
        "check",
        "examples/fc_mnist.est",
        "--mode",
        "train",
        "--emit",
        "ir",
        "--param",
        "hidden=[64]",
        "--param",
        "batch_size=32",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let ir = stdout(&out);
    assert!(ir.contains("input \"features\" : f32[32, 784]"), "{ir}");
    assert!(
        ir.contains("variable \"dense/kernel\" init=glorot_uniform : f32[784, 64]"),
        "{ir}"
    );
    assert!(!ir.contains("dense_2"), "{ir}");
    let bad = estc(&[
        "check",
        "examples/fc_mnist.est",
        "--param",
        "hiden=[64]",
        "--message-format",
        "json",
    ]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stdout(&bad).contains("\"code\":\"E0306\""),
        "{}",
        stdout(&bad)
    );
    // it suggests `hidden`, but its span is the override's value, so it has no fix
    assert!(
        stdout(&bad).contains("did you mean `hidden`?"),
        "{}",
        stdout(&bad)
    );
    assert!(stdout(&bad).contains("\"fixes\":[]"), "{}", stdout(&bad));
    let yaml = scratch(
        "params.yaml",
        "batch_size: 64\nlearning_rate: 0.5\nhidden: [32, 16]\n",
    );
    let out = estc(&[
        "check",
        "examples/fc_mnist.est",
        "--mode",
        "train",
        "--emit",
        "ir",
        "--params",
        &yaml,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("f32[64, 784]") && stdout(&out).contains("f32[32, 16]"));
}

#[test]
fn shards_divide_the_batch() {
    let out = estc(&[
        "check",
        "examples/mnist_cnn.est",
        "--mode",
        "train",
        "--emit",
        "ir",
        "--config",
        "num_shards=4",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("input \"features\" : f32[32, 784]"));
    let bad = estc(&[
        "check",
        "examples/mnist_cnn.est",
        "--config",
        "num_shards=3",
        "--message-format",
        "json",
    ]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stdout(&bad).contains("E0505"));
}

#[test]
fn dumps_are_deterministic() {
    for emit in ["tokens", "ast", "ir", "ir-dot"] {
        let a = estc(&["check", "examples/mnist_cnn.est", "--emit", emit]);
        let b = estc(&["check", "examples/mnist_cnn.est", "--emit", emit]);
        assert_eq!(a.status.code(), Some(0), "{emit}: {}", stderr(&a));
        assert!(!a.stdout.is_empty(), "{emit} printed nothing");
        assert_eq!(a.stdout, b.stdout, "{emit} differs between runs");
    }
    let dot = stdout(&estc(&[
        "check",
        "examples/linear_regression.est",
        "--mode",
        "predict",
        "--emit",
        "ir-dot",
    ]));
    assert!(dot.starts_with("digraph \"linear_regression/predict/host\""));
    assert!(dot.contains("->"));
}

#[test]
fn help_is_complete() {
    let top = stdout(&estc(&["--help"]));
    assert!(top.contains("check") && top.contains("explain"));
    let check = stdout(&estc(&["check", "--help"]));
    for opt in [
        "--target",
        "--mode",
        "--param",
        "--params",
        "--config",
        "--emit",
        "--message-format",
        "--estimator",
    ] {
        assert!(check.contains(opt), "check --help lacks {opt}");
    }
}

/// `estc train`, `eval` and `predict`: log lines when not on a terminal, the final
/// summary, JSON results, and the exit statuses of run-time errors and bad flags.
#[test]
fn train_eval_predict_commands() {
    let dir = std::env::temp_dir().join(format!("estc-cli-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let md = dir.to_string_lossy().into_owned();
    let file = "examples/digits_mlp.est";
    let o = estc(&[
        "train",
        file,
        "--model-dir",
        &md,
        "--steps",
        "200",
        "--config",
        "log_step_count_steps=50",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let log = stderr(&o);
    assert!(
        log.contains("step 50/200: loss = ") && log.contains("step 200/200"),
        "{log}"
    );
    assert!(
        stdout(&o).starts_with("trained 200 steps (global step 0 -> 200)"),
        "{}",
        stdout(&o)
    );
    // --max-steps is a total; --steps adds
    let o = estc(&["train", file, "--model-dir", &md, "--max-steps", "150"]);
    assert!(
        stdout(&o).contains("nothing to do: global step 200"),
        "{}",
        stdout(&o)
    );
    let o = estc(&[
        "train",
        file,
        "--model-dir",
        &md,
        "--steps",
        "10",
        "--message-format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(
        (v["start_step"].as_i64(), v["global_step"].as_i64()),
        (Some(200), Some(210))
    );
    let o = estc(&["eval", file, "--model-dir", &md, "--message-format", "json"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["global_step"].as_i64(), Some(210));
    assert_eq!(v["steps"].as_i64(), Some(9));
    assert!(v["accuracy"].as_f64().unwrap() > 0.8);
    let o = estc(&["eval", file, "--model-dir", &md, "--steps", "2"]);
    assert!(
        stdout(&o)
            .starts_with("eval at global step 210 over 2 batches (80 examples):\n  accuracy = "),
        "{}",
        stdout(&o)
    );
    let out = dir.join("p").to_string_lossy().into_owned();
    let o = estc(&["predict", file, "--model-dir", &md, "--output", &out]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).starts_with("360 predictions written:"));
    let o = estc(&["train", file, "--smoke"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).ends_with("smoke: ok\n"));
    // a model the wafer cannot hold is found when the program is checked: a diagnostic
    // and exit status 1
    let wmd = format!("{md}-wafer");
    let o = estc(&[
        "train",
        file,
        "--model-dir",
        &wmd,
        "--target",
        "wafer",
        "--param",
        "hidden=[4096, 4096]",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("E0603"), "{}", stderr(&o));
    let o = estc(&["train", file, "--steps", "1", "--max-steps", "2"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--steps and --max-steps exclude each other"
    );
    let o = estc(&["train", file, "--config", "num_shard=2"]);
    assert_eq!(o.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `estc perf-input`: the pipeline alone, its speed and shapes, and `--show`.
#[test]
fn perf_input_runs_the_pipeline_alone() {
    let o = estc(&[
        "perf-input",
        "examples/digits_mlp.est",
        "--steps",
        "20",
        "--message-format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["steps"].as_u64(), Some(20));
    assert_eq!(v["shapes"]["features"].as_str(), Some("f32[32, 64]"));
    assert_eq!(v["shapes"]["labels"].as_str(), Some("i32[32]"));
    assert!(v["steps_per_sec"].as_f64().unwrap() > 0.0);
    // the eval input ends after 9 batches of 40
    let o = estc(&[
        "perf-input",
        "examples/digits_mlp.est",
        "--input",
        "eval",
        "--show",
        "2",
    ]);
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2);
    let b: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(b["features"].as_array().unwrap().len(), 40);
    assert_eq!(b["labels"].as_array().unwrap().len(), 40);
    let o = estc(&["perf-input", "examples/digits_mlp.est", "--input", "eval"]);
    assert!(stdout(&o).starts_with("9 batches in "), "{}", stdout(&o));
}

/// `estc data convert`: CSV to sharded TFRecord, which `perf-input` then reads with two
/// input workers; a missing input is exit status 2 with its code.
#[test]
fn data_convert_then_perf_input() {
    let dir = std::env::temp_dir().join(format!("estc-cli-convert-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let prefix = dir.join("digits");
    let o = estc(&[
        "data",
        "convert",
        "--from",
        "csv",
        "examples/data/digits_test.csv",
        "-o",
        prefix.to_str().unwrap(),
        "--shards",
        "2",
        "--group",
        "pixels=p0:p63",
        "--type",
        "pixels=float",
        "--message-format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["records"].as_u64(), Some(360));
    assert_eq!(v["files"].as_array().unwrap().len(), 2);
    assert_eq!(v["features"][0]["name"], "pixels");
    assert_eq!(v["features"][0]["kind"], "float_list");
    assert_eq!(v["features"][0]["values"], 64);
    let program = format!(
        "use std.nn.dense\nuse std.losses.softmax_cross_entropy\n\
         input d() {{ tfrecord(\"{}-*.tfrecord\") |> interleave(2) |> parse {{ pixels: f32[64], label: i32 }}\n\
           |> map |r| (r.pixels / 16.0, r.label)\n  |> batch(40, drop_remainder: true) }}\n\
         model m(features: f32[B, 64], labels: i32[B]) {{\n\
           train {{ minimize softmax_cross_entropy(labels, dense(features, 10)) with sgd(lr: 0.1) }} }}\n\
         estimator e {{ model = m  train_input = d()  config {{ input_workers = 2 }} }}\n",
        prefix.display()
    );
    std::fs::write(dir.join("p.est"), program).unwrap();
    let p = dir.join("p.est");
    let o = estc(&[
        "perf-input",
        p.to_str().unwrap(),
        "--message-format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    // each of the two workers reads the 360 records once: 2 x 9 batches
    assert_eq!(v["steps"].as_u64(), Some(18));
    assert_eq!(v["workers"].as_u64(), Some(2));
    assert_eq!(v["skipped_records"].as_u64(), Some(0));
    let o = estc(&[
        "data",
        "convert",
        "--from",
        "csv",
        "no/such.csv",
        "-o",
        prefix.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with("E0904: cannot read no/such.csv"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs `estc` with its stdout or its stderr (or both) writing to `/dev/full`, where
/// every write fails with ENOSPC.
fn estc_full(args: &[&str], stdout_full: bool, stderr_full: bool) -> Output {
    use std::process::Stdio;
    let full = || -> Stdio {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full")
            .into()
    };
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_estc"));
    cmd.args(args).current_dir(env!("CARGO_MANIFEST_DIR"));
    if stdout_full {
        cmd.stdout(full());
    } else {
        cmd.stdout(Stdio::piped());
    }
    if stderr_full {
        cmd.stderr(full());
    } else {
        cmd.stderr(Stdio::piped());
    }
    cmd.output().expect("estc runs")
}

/// `estc train 2>/dev/full`: the log lines are lost, but training goes on to its
/// checkpoints and its result.
#[test]
fn a_failed_log_write_does_not_stop_training() {
    let dir = std::env::temp_dir().join(format!("estc-cli-full-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let md = dir.to_string_lossy().into_owned();
    let o = estc_full(
        &[
            "train",
            "examples/digits_mlp.est",
            "--model-dir",
            &md,
            "--steps",
            "120",
            "--config",
            "log_step_count_steps=10",
            "--config",
            "iterations_per_loop=20",
            "--config",
            "save_checkpoint_steps=60",
        ],
        false,
        true,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(
        stdout(&o).starts_with("trained 120 steps (global step 0 -> 120)"),
        "{}",
        stdout(&o)
    );
    for f in [
        "ckpt-60.safetensors",
        "ckpt-120.safetensors",
        "ckpt-120.json",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    let state = std::fs::read_to_string(dir.join("checkpoint.json")).unwrap();
    assert!(state.contains("\"latest\":120"), "{state}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A failed write of a command's result is an I/O error (exit status 2, a message on
/// stderr), never a panic: the user must not take a lost result for a clean run.
#[test]
fn a_failed_result_write_is_an_error() {
    let dir = std::env::temp_dir().join(format!("estc-cli-full-out-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let md = dir.to_string_lossy().into_owned();
    let file = "examples/digits_mlp.est";
    let o = estc(&["train", file, "--model-dir", &md, "--steps", "5"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let cases: Vec<Vec<&str>> = vec![
        vec!["eval", file, "--model-dir", &md, "--steps", "1"],
        vec![
            "eval",
            file,
            "--model-dir",
            &md,
            "--steps",
            "1",
            "--message-format",
            "json",
        ],
        vec!["train", file, "--model-dir", &md, "--steps", "1"],
        vec!["check", file, "--emit", "tokens"],
        vec!["check", file, "--emit", "ir"],
        vec!["explain", "E0401"],
        vec!["explain", "--list"],
        vec!["perf-input", file, "--steps", "2"],
        vec!["perf-input", file, "--steps", "2", "--show", "2"],
        vec!["--help"],
        vec!["check", "--help"],
        vec!["--version"],
    ];
    for args in &cases {
        let o = estc_full(args, true, false);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("error: cannot write to stdout: No space left on device"),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(!stderr(&o).contains("panicked"), "{args:?}: {}", stderr(&o));
    }
    // diagnostics that cannot be shown are not a clean run either
    let broken = scratch("broken_full.est", BROKEN);
    let o = estc_full(&["check", &broken, "--message-format", "json"], true, false);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = estc_full(&["check", "examples/digits_mlp.est"], false, true);
    assert_eq!(o.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `perf-input --time`: a finite, non-negative number of seconds; a huge one runs until
/// the input ends.
#[test]
fn perf_input_time_is_checked() {
    for bad in ["nan", "inf", "-1", "-inf", "soon"] {
        let o = estc(&["perf-input", "examples/digits_mlp.est", "--time", bad]);
        assert_eq!(o.status.code(), Some(2), "--time {bad}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("invalid value") && stderr(&o).contains("--time"),
            "--time {bad}: {}",
            stderr(&o)
        );
    }
    let o = estc(&[
        "perf-input",
        "examples/digits_mlp.est",
        "--input",
        "eval",
        "--time",
        "1e20",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).starts_with("9 batches in "), "{}", stdout(&o));
}

/// A diagnostic past column 65,535 of a line (miette's limit for padding) is drawn
/// with a window of the line around the label.
#[test]
fn a_diagnostic_far_along_a_line_is_drawn() {
    let text = format!(
        "params {{ n: int = 1 }}\nfn f() {{\n{}let y = zzz + 1\n  y\n}}\n",
        " ".repeat(70_000)
    );
    let o = estc(&["check", &scratch("far.est", &text)]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("unknown name `zzz`"), "{err}");
    assert!(err.contains("far.est:3:70009]"), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with(" 3 │ "))
        .unwrap_or_else(|| panic!("line 3 shown: {err}"));
    assert!(line.ends_with("…") || line.contains("… "), "{line}");
    assert!(line.contains("let y = zzz + 1"), "{line}");
    assert!(line.chars().count() < 200, "{line}");
    // the underline sits under `zzz`
    let at = line.find("zzz").unwrap();
    let under = err
        .lines()
        .skip_while(|l| !l.starts_with(" 3 │ "))
        .nth(1)
        .unwrap();
    let col = |s: &str, byte: usize| s[..byte].chars().count();
    let mark = under.find(['┬', '─']).unwrap();
    assert_eq!(col(under, mark), col(line, at), "{line}\n{under}");
    let o = estc(&[
        "check",
        &scratch("far.est", &text),
        "--message-format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(stdout(&o).lines().next().unwrap()).unwrap();
    assert_eq!(
        (v["line"].as_u64(), v["column"].as_u64()),
        (Some(3), Some(70_009))
    );
}

/// Source and params files are read with limits: a source file over 16 MiB, or an
/// endless one (`/dev/zero`), is refused after reading 16 MiB, as the root file (exit
/// status 2) or at the `use` of an imported one (E0105); a file that is not UTF-8 is
/// named with its line and byte; a params file nested deeper than 64 levels is refused
/// before the YAML parser (quadratic in the depth) runs.
#[test]
fn oversized_endless_and_deep_inputs_are_refused() {
    let dir = std::env::temp_dir().join(format!("estc-cli-limits-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.est");
    std::fs::write(&big, " ".repeat((16 << 20) + 1)).unwrap();
    let o = estc(&["check", big.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(
        stderr(&o),
        format!(
            "error: cannot read {}: it is larger than 16 MiB, the limit of a source file; split it into modules (see `use`)\n",
            big.display()
        )
    );
    // exactly 16 MiB is read
    std::fs::write(dir.join("edge.est"), " ".repeat(16 << 20)).unwrap();
    let o = estc(&["check", dir.join("edge.est").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // not UTF-8: the line and byte of the first bad byte
    let latin = dir.join("latin.est");
    std::fs::write(&latin, b"fn f(x) { x }\n// caf\xe9\n").unwrap();
    let o = estc(&["check", latin.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        format!(
            "error: cannot read {}: it is not UTF-8 text (line 2, byte 20); save it as UTF-8\n",
            latin.display()
        )
    );
    // imported files: E0105 at the `use`, with the reason
    let main = dir.join("main.est");
    let json_diags = |text: &str| -> Vec<serde_json::Value> {
        std::fs::write(&main, text).unwrap();
        let o = estc(&["check", main.to_str().unwrap(), "--message-format", "json"]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        stdout(&o)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let d = json_diags("use big\n");
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        (d[0]["code"].as_str(), d[0]["line"].as_u64()),
        (Some("E0105"), Some(1))
    );
    assert_eq!(
        d[0]["message"],
        "cannot read big.est, the file of module `big`: it is larger than 16 MiB, the limit of a source file"
    );
    let d = json_diags("use latin.f\n");
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(
        d[0]["message"],
        "cannot read latin.est, the file of module `latin`: it is not UTF-8 text (line 2, byte 20)"
    );
    assert_eq!(d[0]["help"], "save the file as UTF-8 text");
    // a params file nested 100,000 levels deep, in flow and in block style
    for (name, text) in [
        (
            "flow.yaml",
            format!("a: {}{}\n", "[".repeat(100_000), "]".repeat(100_000)),
        ),
        ("block.yaml", format!("a:\n{}1\n", "- ".repeat(100_000))),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        let o = estc(&[
            "check",
            "examples/fc_mnist.est",
            "--params",
            p.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).starts_with(&format!(
                "error: {}:{}: nested more than 64 levels deep, the limit of a params file",
                p.display(),
                if name == "flow.yaml" { 1 } else { 2 }
            )),
            "{}",
            stderr(&o)
        );
    }
    // endless files stop at the limit: the root, an import, a params file
    let o = estc(&["check", "/dev/zero"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("/dev/zero: it is larger than 16 MiB"),
        "{}",
        stderr(&o)
    );
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.est")).unwrap();
    let d = json_diags("use zero\n");
    assert_eq!(d[0]["code"], "E0105");
    let o = estc(&["check", "examples/fc_mnist.est", "--params", "/dev/zero"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "error: cannot read /dev/zero: it is larger than 16 MiB, the limit of a params file\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--emit tokens` carries the position from token to token: a line of 2,000,000
/// characters (1,000,000 tokens) is written in a second, where a look-up per token
/// took minutes.
#[test]
fn emit_tokens_is_linear_in_line_length() {
    let n = 1_000_000;
    let text = format!("fn f() {{ [{}1] }}\n", "1,".repeat(n - 1));
    let o = estc(&[
        "check",
        &scratch("long_line.est", &text),
        "--emit",
        "tokens",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2 * n + 7);
    assert_eq!(lines[6], "1:11 Int(\"1\") \"1\"");
    assert_eq!(lines[7], "1:12 Comma \",\"");
    assert_eq!(
        lines[lines.len() - 1],
        format!("1:{} RBrace \"}}\"", 2 * n + 12)
    );
}

/// `--epochs` counts the train input's examples (the CSV's rows) and trains that many
/// passes of whole batches; evaluation refuses it.
#[test]
fn epochs_convert_to_steps_from_the_input_size() {
    let dir = std::env::temp_dir().join(format!("estc-cli-epochs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let md = dir.to_string_lossy().into_owned();
    let rows = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/digits_train.csv"),
    )
    .unwrap()
    .lines()
    .filter(|l| !l.is_empty())
    .count()
        - 1;
    // digits_mlp batches after its `repeat`: 2 passes' examples in batches of 32
    let o = estc(&[
        "train",
        "examples/digits_mlp.est",
        "--model-dir",
        &md,
        "--epochs",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let line = format!(
        "2 epochs of {rows} examples (the rows of data/digits_train.csv) in batches of 32: {} steps",
        2 * rows / 32
    );
    assert!(stderr(&o).contains(&line), "{}", stderr(&o));
    assert!(
        stdout(&o).starts_with(&format!(
            "trained {} steps (global step 0 -> {})",
            2 * rows / 32,
            2 * rows / 32
        )),
        "{}",
        stdout(&o)
    );
    let o = estc(&[
        "eval",
        "examples/digits_mlp.est",
        "--model-dir",
        &md,
        "--epochs",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("`--epochs` is for training"),
        "{}",
        stderr(&o)
    );
}

/// `--eval-every N` trains and evaluates: the JSON result lists each evaluation, by
/// global step, with its loss and metrics.
#[test]
fn eval_every_trains_and_evaluates() {
    let dir = std::env::temp_dir().join(format!("estc-cli-eval-every-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let md = dir.to_string_lossy().into_owned();
    let o = estc(&[
        "train",
        "examples/digits_mlp.est",
        "--model-dir",
        &md,
        "--steps",
        "6",
        "--eval-every",
        "4",
        "--message-format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    assert_eq!(v["global_step"], 6);
    let evals = v["evaluations"].as_array().unwrap();
    let steps: Vec<i64> = evals
        .iter()
        .map(|e| e["global_step"].as_i64().unwrap())
        .collect();
    assert_eq!(steps, [4, 6]);
    assert!(evals
        .iter()
        .all(|e| e["loss"].as_f64().unwrap().is_finite()));
    assert!(
        stderr(&o).contains("eval at global step 4: loss = "),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Cerebras's fc_mnist as its model zoo writes it: params in sections (`train_input:`,
/// `model:`, `optimizer:`) read as record-typed params fields, and a `runconfig:`
/// section setting the run's steps, model_dir and config.
const CEREBRAS_FC_MNIST: &str = "use std.nn.{dense, dropout}
use std.losses.softmax_cross_entropy

params {
  train_input: { batch_size: int, shuffle: bool } = { batch_size: 256, shuffle: true }
  model: { depth: int, hidden_size: int, dropout: float, activation_fn: string } =
    { depth: 10, hidden_size: 50, dropout: 0.0, activation_fn: \"relu\" }
  optimizer: { learning_rate: float, momentum: float } = { learning_rate: 0.001, momentum: 0.9 }
}

input mnist() {
  let ds = synthetic(features: f32[784], labels: i32, count: 64, classes: 10)
  let ds = if params.train_input.shuffle { ds |> shuffle(64) } else { ds }
  ds |> repeat |> batch(params.train_input.batch_size, drop_remainder: true)
}

model fc_mnist(features: f32[B, 784], labels: i32[B]) {
  let x = features
  for i in 0..params.model.depth {
    x = dense(x, params.model.hidden_size, activation: if params.model.activation_fn == \"relu\" { relu } else { tanh })
    if mode == train && params.model.dropout > 0.0 { x = dropout(x, rate: params.model.dropout) }
  }
  let loss = softmax_cross_entropy(labels, dense(x, 10))
  train { minimize loss with momentum(lr: params.optimizer.learning_rate, momentum: params.optimizer.momentum) }
}

estimator fc_mnist { model = fc_mnist  train_input = mnist() }
";

#[test]
fn a_cerebras_params_yaml_sets_record_params_and_the_run_config() {
    let program = scratch("cerebras_fc_mnist.est", CEREBRAS_FC_MNIST);
    let model_dir = std::env::temp_dir().join(format!("estc-cli-cerebras-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&model_dir);
    let yaml = scratch(
        "cerebras_params.yaml",
        &format!(
            "train_input:\n    batch_size: 8\n    shuffle: False\n\nmodel:\n    depth: 3\n    hidden_size: 5\n    dropout: 0.1\n    activation_fn: \"tanh\"\n\noptimizer:\n    learning_rate: 0.01\n    momentum: 0.5\n\nrunconfig:\n    max_steps: 3\n    log_steps: 1\n    checkpoint_steps: 3\n    seed: 1\n    iterations_per_loop: 1\n    model_dir: {:?}\n",
            model_dir.display().to_string()
        ),
    );
    let ir = estc(&[
        "check", &program, "--mode", "train", "--emit", "ir", "--params", &yaml,
    ]);
    assert_eq!(ir.status.code(), Some(0), "{}", stderr(&ir));
    let ir = stdout(&ir);
    for want in [
        "input \"features\" : f32[8, 784]",
        "variable \"dense_2/kernel\" init=glorot_uniform : f32[5, 5]",
        "tanh",
    ] {
        assert!(ir.contains(want), "missing `{want}`");
    }
    assert!(
        !ir.contains("dense_3/kernel\" init=glorot_uniform : f32[5, 5]"),
        "depth 3"
    );
    let out = estc(&[
        "train",
        &program,
        "--params",
        &yaml,
        "--target",
        "interp",
        "--message-format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("\"global_step\":3"),
        "{}",
        stdout(&out)
    );
    assert!(
        model_dir.join("ckpt-3.safetensors").exists(),
        "runconfig.model_dir"
    );
    // `--param` of a record's field, and its mistakes
    let o = estc(&[
        "check",
        &program,
        "--mode",
        "train",
        "--emit",
        "ir",
        "--param",
        "model.depth=2",
        "--param",
        "optimizer={ learning_rate: 0.1, momentum: 0.0 }",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let ir = stdout(&o);
    assert!(
        ir.contains("variable \"dense_1/kernel\" init=glorot_uniform : f32[50, 50]")
            && !ir.contains("dense_2/kernel\" init=glorot_uniform : f32[50, 50]"),
        "depth 2"
    );
    assert!(
        ir.contains("optimizer momentum(momentum=0"),
        "the optimizer record"
    );
    for (kv, says) in [
        ("model.dept=2", "`params.model` has no field `dept`"),
        ("model.depth.x=2", "`params.model.depth` is not a record"),
        ("model={ depth: 2 }", "is not a value of `model`'s type"),
    ] {
        let o = estc(&["check", &program, "--param", kv, "--message-format", "json"]);
        assert_eq!(o.status.code(), Some(1), "{kv}");
        assert!(
            stdout(&o).contains("E0306") && stdout(&o).contains(says),
            "{kv}: {}",
            stdout(&o)
        );
    }
    let bad = scratch("cerebras_bad.yaml", "runconfig:\n    cs_ip: \"1.2.3.4\"\n");
    let o = estc(&["check", &program, "--params", &bad]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("`runconfig.cs_ip` is not a key est reads"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(&model_dir);
}

#[test]
fn fmt_formats_in_place_checks_and_reads_stdin() {
    let messy = "params {batch_size:int=8}   // one field\nfn f(x) {x*2.0}\n\n\n";
    let tidy = "params { batch_size: int = 8 }  // one field\nfn f(x) { x * 2.0 }\n";
    let path = scratch("fmt_messy.est", messy);
    // --check writes nothing, names the first line that differs, and fails
    let o = estc(&["fmt", "--check", &path]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("fmt_messy.est:1: not formatted"),
        "{}",
        stdout(&o)
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), messy);
    // formatting writes the canonical layout; then --check passes
    let o = estc(&["fmt", &path]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("formatted 1 file, 0 already formatted"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), tidy);
    assert_eq!(estc(&["fmt", "--check", &path]).status.code(), Some(0));
    // standard input to standard output
    let mut child = Command::new(env!("CARGO_BIN_EXE_estc"))
        .arg("fmt")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(messy.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!((o.status.code(), stdout(&o)), (Some(0), tidy.to_string()));
    // a file that does not parse is left as it is, with its diagnostics
    let broken = scratch("fmt_broken.est", "fn f( {\n");
    let o = estc(&["fmt", &broken]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("E0101") && stderr(&o).contains("not formatted: it does not parse"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read_to_string(&broken).unwrap(), "fn f( {\n");
    // the examples, the standard library and the fuzz seeds are formatted
    let o = estc(&["fmt", "--check", "examples", "stdlib", "fuzz/seeds"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}
