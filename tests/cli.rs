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
    // a run-time error is a diagnostic and exit status 1
    let o = estc(&["train", file, "--model-dir", &md, "--target", "wafer"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("E0908"));
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
