//! The wafer target end to end: programs compiled for the simulated wafer train,
//! evaluate and predict like the interpreter.
//!
//! Tolerance: weights within 1e-5 of each variable's largest magnitude after 20 steps,
//! losses within 1e-5 relative. The wafer sums in another order than the interpreter
//! (each PE its block's terms in order, then the PEs' partial sums along a chain) and
//! its softmax divides by a sum it makes in its own order, so results are not the same
//! bits.

use est::diag::Code;
use est::elab::Target;
use est::runtime::{Estimator, RunOptions, Steps};
use est::tensor::Tensor;
use est::Program;
use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("est-wafer-{}-{name}", std::process::id()));
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

/// The largest difference between two sets of variables, relative to the largest
/// magnitude of each variable.
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

/// 20 train steps of digits_mlp on the wafer and on the interpreter from the same
/// seed, then evaluation and prediction of the same checkpoint.
#[test]
fn wafer_trains_like_the_interpreter() {
    let (dw, di) = (tmp("mlp-wafer"), tmp("mlp-interp"));
    let mut w = estimator("examples/digits_mlp.est", Target::Wafer, &dw).unwrap();
    let mut i = estimator("examples/digits_mlp.est", Target::Interp, &di).unwrap();
    let rw = w.train(Steps::Max(20)).unwrap();
    let ri = i.train(Steps::Max(20)).unwrap();
    assert_eq!(rw.global_step, 20);
    let d = worst(&w.variables(), &i.variables());
    eprintln!("largest relative difference {d:e}");
    assert!(d <= 1e-5, "largest relative difference {d:e}");
    assert!(
        (rw.final_loss - ri.final_loss).abs() <= 1e-5 * ri.final_loss.abs().max(1.0),
        "{} vs {}",
        rw.final_loss,
        ri.final_loss
    );
    let ew = w.evaluate(None).unwrap();
    let ei = i.evaluate(None).unwrap();
    assert_eq!(ew.examples, ei.examples);
    for ((n, a), (_, b)) in ew.metrics.iter().zip(&ei.metrics) {
        assert!((a - b).abs() <= 1e-6, "{n}: {a} vs {b}");
    }
    assert!((ew.loss - ei.loss).abs() <= 1e-5 * ei.loss.abs().max(1.0));
    let pw = w.predict(&dw.join("p"), None).unwrap();
    let pi = i.predict(&di.join("p"), None).unwrap();
    assert_eq!(pw.examples, pi.examples);
    let read = |d: &Path| std::fs::read_to_string(d.join("p/predictions.jsonl")).unwrap();
    let rows = |s: &str| -> Vec<serde_json::Value> {
        s.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let (lw, li) = (rows(&read(&dw)), rows(&read(&di)));
    assert_eq!(lw.len(), li.len());
    for (a, b) in lw.iter().zip(&li) {
        assert_eq!(a["classes"], b["classes"]);
        let (pa, pb) = (
            a["probabilities"].as_array().unwrap(),
            b["probabilities"].as_array().unwrap(),
        );
        for (x, y) in pa.iter().zip(pb) {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= 1e-5, "probability {x} vs {y}");
        }
    }
}

/// digits_mlp trained on the wafer as the example says (1,500 steps) reaches 0.95 test
/// accuracy.
#[test]
fn digits_mlp_on_wafer_reaches_095() {
    let d = tmp("mlp-full");
    let mut w = estimator("examples/digits_mlp.est", Target::Wafer, &d).unwrap();
    w.train(Steps::Default).unwrap();
    let e = w.evaluate(None).unwrap();
    let acc = e.metrics.iter().find(|m| m.0 == "accuracy").unwrap().1;
    assert!(acc >= 0.95, "accuracy {acc}");
}
