//! The host backend (`--target host`, LLVM) against the interpreter: training, eval and
//! predict agree within stated tolerances, and its failures are diagnostics.

use est::diag::Code;
use est::elab::Target;
use est::runtime::{Estimator, RunOptions, Steps};
#[cfg(feature = "llvm")]
use est::tensor::Tensor;
use est::Program;
#[cfg(feature = "llvm")]
use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("est-host-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn estimator(file: &str, target: Target, dir: &Path) -> Result<Estimator, Vec<Code>> {
    let p = Program::load(&root().join(file)).unwrap();
    let opts = RunOptions {
        target,
        model_dir: Some(dir.to_path_buf()),
        ..Default::default()
    };
    Estimator::new(&p, &opts).map_err(|f| f.diags.iter().map(|d| d.code).collect())
}

#[cfg(feature = "llvm")]
/// The largest difference between two sets of variables, relative to the largest
/// magnitude of each variable (so that a weight near zero is not held to a relative
/// bound its neighbours' rounding cannot meet).
fn worst(a: &FxHashMap<String, Tensor>, b: &FxHashMap<String, Tensor>) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0f64;
    for (k, x) in a {
        let (x, y) = (x.to_f64(), b[k].to_f64());
        let scale = x.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
        for (p, q) in x.iter().zip(&y) {
            worst = worst.max((p - q).abs() / scale);
        }
    }
    worst
}

/// 20 train steps of digits_mlp on host and on the interpreter from the same seed:
/// the weights agree within 1e-5 of each variable's largest magnitude. They are not
/// bit-identical: the host sums reductions in another order (vectorised), and its exp
/// and log are polynomials within 2 ulp of the interpreter's libm.
#[cfg(feature = "llvm")]
#[test]
fn host_trains_like_the_interpreter() {
    let (dh, di) = (tmp("mlp-host"), tmp("mlp-interp"));
    let mut h = estimator("examples/digits_mlp.est", Target::Host, &dh).unwrap();
    let mut i = estimator("examples/digits_mlp.est", Target::Interp, &di).unwrap();
    let rh = h.train(Steps::Max(20)).unwrap();
    let ri = i.train(Steps::Max(20)).unwrap();
    assert_eq!(rh.global_step, 20);
    let w = worst(&h.variables(), &i.variables());
    assert!(w <= 1e-5, "largest relative difference {w:e}");
    assert!(
        (rh.final_loss - ri.final_loss).abs() <= 1e-5 * ri.final_loss.abs().max(1.0),
        "{} vs {}",
        rh.final_loss,
        ri.final_loss
    );
    // evaluation and prediction of the same checkpoint
    let eh = h.evaluate(None).unwrap();
    let ei = i.evaluate(None).unwrap();
    assert_eq!(eh.examples, ei.examples);
    for ((n, a), (_, b)) in eh.metrics.iter().zip(&ei.metrics) {
        assert!((a - b).abs() <= 1e-6, "{n}: {a} vs {b}");
    }
    assert!((eh.loss - ei.loss).abs() <= 1e-5 * ei.loss.abs().max(1.0));
    let ph = h.predict(&dh.join("p"), None).unwrap();
    let pi = i.predict(&di.join("p"), None).unwrap();
    assert_eq!(ph.examples, pi.examples);
    let read = |d: &Path| std::fs::read_to_string(d.join("p/predictions.jsonl")).unwrap();
    let (lh, li) = (read(&dh), read(&di));
    let classes = |s: &str| -> Vec<i64> {
        s.lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["classes"]
                    .as_i64()
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(classes(&lh), classes(&li));
}

/// digits_mlp trained on host to its last step reaches the accuracy of the main job.
#[cfg(feature = "llvm")]
#[test]
fn digits_mlp_on_host_reaches_095() {
    let d = tmp("mlp-full");
    let mut h = estimator("examples/digits_mlp.est", Target::Host, &d).unwrap();
    h.train(Steps::Default).unwrap();
    let e = h.evaluate(None).unwrap();
    let acc = e.metrics.iter().find(|m| m.0 == "accuracy").unwrap().1;
    assert!(acc >= 0.95, "accuracy {acc}");
}

/// A failure of LLVM (here, an object file damaged on purpose) is E0917, not a panic.
#[cfg(feature = "llvm")]
#[test]
fn an_llvm_failure_is_a_diagnostic() {
    let d = tmp("fault");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_estc"))
        .args([
            "train",
            "examples/digits_mlp.est",
            "--target",
            "host",
            "--steps",
            "1",
        ])
        .arg("--model-dir")
        .arg(&d)
        .args(["--message-format", "json"])
        .current_dir(root())
        .env("EST_FAULT", "host-object")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let out = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    let code = format!("{:?}", [Code::HostCompile]);
    assert!(out.contains("E0917"), "{code}: {out}");
}

/// Without the `llvm` feature the host target says how to get it.
#[cfg(not(feature = "llvm"))]
#[test]
fn without_llvm_the_host_target_says_how_to_build_it() {
    let d = tmp("nollvm");
    let mut h = estimator("examples/digits_mlp.est", Target::Host, &d).unwrap();
    let f = h.train(Steps::Max(1)).unwrap_err();
    assert_eq!(f.diags[0].code, Code::NoRuntime);
    assert!(f.diags[0]
        .help
        .as_deref()
        .unwrap_or("")
        .contains("--features llvm"));
}
