//! Nothing silently wrong, on the surfaces added since the first hardening: each test
//! here is the regression test of a finding of issue 43's hostile probes about results
//! and messages (numbers beyond their range, partial batches through merged rows, a
//! one-hot of a feature, override excerpts, config labels, quick fixes); the findings
//! about files, resources and crashes are `tests/hardening.rs`'. Each test's comment
//! names the finding it guards.

#[path = "common/estc.rs"]
mod estc;
use estc::{estc, ok, s, stderr};
use std::process::Output;

fn tmp(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "est-hardening-results-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Findings 7 and 19: a CSV number beyond f64's range (`1e400`, an integer of 310
/// digits) is E0905 like one beyond f32's, not an infinity; `inf` written as such stays
/// a value; a byte that is not UTF-8 is E0905 naming the file, the line and the byte
/// (with no position before). `data convert` says the same of a float column.
#[test]
fn csv_numbers_beyond_f64_are_out_of_range() {
    let d = tmp("csv-f64");
    let program = r#"use std.nn.dense
use std.losses.softmax_cross_entropy
input rows() {
  csv("rows.csv", columns: { x: f32[2], label: i32 }) |> map |r| (r.x, r.label) |> batch(2, drop_remainder: true) |> repeat
}
model m(features: f32[B, 2], labels: i32[B]) {
  let loss = softmax_cross_entropy(labels, dense(features, 2))
  train { minimize loss with sgd(lr: 0.1) }
}
estimator e { model = m  train_input = rows() }
"#;
    std::fs::write(d.join("p.est"), program).unwrap();
    let train = |csv: &[u8]| {
        std::fs::write(d.join("rows.csv"), csv).unwrap();
        let _ = std::fs::remove_dir_all(d.join("md"));
        estc(&[
            "train",
            s(&d.join("p.est")),
            "--target",
            "interp",
            "--max-steps",
            "1",
            "--message-format",
            "json",
            "--model-dir",
            s(&d.join("md")),
        ])
    };
    let out = |o: &Output| String::from_utf8_lossy(&o.stdout).into_owned();
    let digits = "9".repeat(310);
    for (field, column, range) in [
        ("1e400", 2, "f32 (±3.4028235e38)"),
        ("-1e400", 2, "f32 (±3.4028235e38)"),
        (digits.as_str(), 3, "i32 ([-2147483648, 2147483647])"),
    ] {
        let csv = if column == 2 {
            format!("x0,x1,label\n1,2,0\n3,{field},1\n")
        } else {
            format!("x0,x1,label\n1,2,0\n3,4,{field}\n")
        };
        let o = train(csv.as_bytes());
        assert_eq!(o.status.code(), Some(1), "{}", out(&o));
        let want = format!(
            "rows.csv:3:{column}: column `{}`: {field} is out of range for {range}",
            if column == 2 { "x" } else { "label" }
        );
        assert!(
            out(&o).contains("E0905") && out(&o).contains(&want),
            "{want}\n{}",
            out(&o)
        );
    }
    // an infinity written as one is a value (the NaN check stops what it makes)
    let o = train(b"x0,x1,label\n1,2,0\n3,inf,1\n");
    assert!(!out(&o).contains("out of range"), "{}", out(&o));
    // (finding 19) a byte that is not UTF-8: E0905 naming the file, line and byte
    let o = train(b"x0,x1,label\n1,2,0\n3,\xe94,1\n");
    assert!(
        out(&o).contains("E0905")
            && out(&o).contains("rows.csv:3: not UTF-8 text (the byte at offset 20)")
            && out(&o).contains("save the file as UTF-8"),
        "{}",
        out(&o)
    );
    // data convert
    std::fs::write(d.join("t.csv"), "a,b\n1.5,2\n1e40,3\n").unwrap();
    let o = estc(&[
        "data",
        "convert",
        "--from",
        "csv",
        s(&d.join("t.csv")),
        "-o",
        s(&d.join("t")),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("row 2: column group `a`: 1e40 is out of range for a float"),
        "{}",
        stderr(&o)
    );
    assert!(!d.join("t.tfrecord").exists());
}

/// Finding 9 (first part): a reshape that merges the examples with the axis after them
/// (`[B, 64]` to `[B * 8, 8]`, as `einsum` does) and `conv2d_transpose` keep each
/// example's rows apart, so a partial last batch is evaluated exactly (it was W0513 at
/// check and E0916 at run time): eval over batches of 64 (the last of 40) gives the
/// accuracy and loss of one batch of all 360 examples, and predict one row each.
#[test]
fn merged_rows_and_transposed_convolutions_evaluate_partial_batches() {
    let d = tmp("merged-rows");
    let program = "tests/fixtures/hardening/merged_rows.est";
    let o = ok(estc(&[
        "check",
        program,
        "--param",
        "eval_batch=64",
        "--target",
        "host",
    ]));
    assert!(!stderr(&o).contains("W0513"), "{}", stderr(&o));
    let md = d.join("md");
    let target = if cfg!(feature = "llvm") {
        "host"
    } else {
        "interp"
    };
    ok(estc(&[
        "train",
        program,
        "--target",
        target,
        "--model-dir",
        s(&md),
    ]));
    // `estc CMD` of the program at eval batch `batch`, with `extra` arguments
    let run = |cmd: &str, batch: &str, extra: &[&str]| {
        let batch = format!("eval_batch={batch}");
        let mut args = vec![cmd, program, "--target", target, "--model-dir", s(&md)];
        args.extend(["--param", &batch]);
        args.extend(extra);
        ok(estc(&args))
    };
    let eval = |batch: &str| -> serde_json::Value {
        let o = run("eval", batch, &["--message-format", "json"]);
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (whole, parts) = (eval("360"), eval("64"));
    assert_eq!(parts["examples"], 360, "{parts}");
    assert_eq!(parts["accuracy"], whole["accuracy"], "{parts} {whole}");
    let (a, b) = (
        parts["loss"].as_f64().unwrap(),
        whole["loss"].as_f64().unwrap(),
    );
    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
    let out = d.join("p");
    run("predict", "64", &["--output", s(&out)]);
    let lines = std::fs::read_to_string(out.join("predictions.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 360);
}

/// Finding 9: `one_hot(ids - 1, n)` of a feature with 0 as padding (Keras's masked
/// one-hot; TensorFlow's indicator columns pad with -1, documented to give zeros) trains,
/// its -1 rows zeros; the labels are still checked (E0915 for a label of -1).
#[test]
fn a_one_hot_of_a_feature_is_not_checked_as_a_label() {
    let d = tmp("one-hot-feature");
    let program = |label: &str| {
        format!(
            r#"use std.nn.dense
use std.losses.softmax_cross_entropy

input rows() {{
  range(64)
    |> map |i| ({{ ids: concat([reshape(i % 5, [1]), reshape((i + 2) % 5, [1]), reshape(i * 0, [1])]) }}, {label})
    |> repeat
    |> batch(8, drop_remainder: true)
}}

model m(features: {{ ids: i32[B, T] }}, labels: i32[B]) {{
  let bag = reduce_sum(one_hot(features.ids - 1, 4), axis: 1)
  let loss = softmax_cross_entropy(labels, dense(bag, 3))
  train {{ minimize loss with sgd(lr: 0.1) }}
}}

estimator e {{ model = m  train_input = rows() }}
"#
        )
    };
    for (label, fails) in [("i % 3", false), ("i % 3 - 1", true)] {
        let file = d.join("m.est");
        std::fs::write(&file, program(label)).unwrap();
        let md = d.join(format!("md-{fails}"));
        let o = estc(&[
            "train",
            s(&file),
            "--target",
            "interp",
            "--max-steps",
            "5",
            "--model-dir",
            s(&md),
        ]);
        if fails {
            assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
            assert!(
                stderr(&o).contains("E0915") && stderr(&o).contains("label -1"),
                "{}",
                stderr(&o)
            );
        } else {
            ok(o);
        }
    }
}

/// Finding 20: E0306 quotes an override's value in part: a 6 MB list in a params file
/// gives a message of a few lines (it printed 8.5 MB).
#[test]
fn an_override_value_is_quoted_in_part() {
    let d = tmp("big-override");
    let yaml = d.join("params.yaml");
    let list: Vec<&str> = vec!["\"x\""; 1_200_000];
    std::fs::write(&yaml, format!("hidden: [{}]\n", list.join(", "))).unwrap();
    let o = estc(&["check", "examples/digits_mlp.est", "--params", s(&yaml)]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.len() < 10_000, "{} bytes of diagnostics", e.len());
    assert!(
        e.contains("E0306") && e.contains("… (6000000 bytes)") && e.contains("is not a value"),
        "{e}"
    );
}

/// Finding 25: a config rule's diagnostic about a value `--config` set labels the
/// override, not the program's own value (E0506 for `--config save_checkpoint_steps=20`
/// labelled the file's 500), and offers no fix to a file that does not hold it; a value
/// from a params file's `runconfig:` names that file.
#[test]
fn a_config_rule_labels_the_override_that_set_the_value() {
    let diag = |args: &[&str]| -> serde_json::Value {
        let mut all = vec![
            "check",
            "examples/digits_mlp.est",
            "--target",
            "wafer",
            "--message-format",
            "json",
        ];
        all.extend(args);
        let o = estc(&all);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let line = out
            .lines()
            .find(|l| l.contains("E0506"))
            .unwrap_or_else(|| panic!("{out}"));
        serde_json::from_str(line).unwrap()
    };
    let d = diag(&["--config", "save_checkpoint_steps=20"]);
    assert_eq!(d["file"], "--config", "{d}");
    assert_eq!(d["fixes"], serde_json::json!([]), "{d}");
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .contains("save_checkpoint_steps = 20"),
        "{d}"
    );
    let dir = tmp("runconfig");
    let yaml = dir.join("p.yaml");
    std::fs::write(&yaml, "runconfig:\n  checkpoint_steps: 30\n").unwrap();
    let d = diag(&["--params", s(&yaml)]);
    assert_eq!(d["file"], format!("--params {}", yaml.display()), "{d}");
}

/// Finding 26: the quick fix "add `drop_remainder: true`" is offered for the train input
/// of an estimator that has no eval or predict input (it required an `eval_input`).
#[test]
fn the_drop_remainder_fix_is_offered_without_an_eval_input() {
    let d = tmp("fix-train-only");
    let file = d.join("p.est");
    std::fs::write(
        &file,
        "use std.nn.dense\nuse std.losses.softmax_cross_entropy\n\nparams { batch_size: int = 8 }\n\ninput points() {\n  range(64) |> map |i| (fill([4], 1.0) * cast(i, f32), i % 3) |> repeat |> batch(params.batch_size)\n}\n\nmodel m(features: f32[B, 4], labels: i32[B]) {\n  let loss = softmax_cross_entropy(labels, dense(features, 3))\n  train { minimize loss with sgd(lr: 0.1) }\n}\n\nestimator e { model = m  train_input = points() }\n",
    )
    .unwrap();
    let o = estc(&[
        "check",
        s(&file),
        "--target",
        "wafer",
        "--message-format",
        "json",
    ]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let d: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(d["code"], "E0502", "{d}");
    assert_eq!(d["fixes"][0]["title"], "add `drop_remainder: true`", "{d}");
    assert_eq!(
        d["fixes"][0]["edits"][0]["text"], ", drop_remainder: true",
        "{d}"
    );
}
