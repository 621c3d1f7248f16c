//! fp32 GEMM 1024^3 inside est against numpy (OpenBLAS), alternating, at 1 and 2
//! threads. est runs a graph `sum(matmul(a, b))` on the host device, with `a` and `b`
//! resident variables (nothing is fed); numpy runs `(x @ w).sum()` (`bench/gemm.py`,
//! from `bench/`'s virtualenv). Each round takes the median of `reps` products.
//!
//! `cargo bench --bench gemm`; `EST_BENCH_ROUNDS` (default 5), `EST_BENCH_N`
//! (default 1024), `EST_BENCH_THREADS` (default `1,2`).

use est::backend::{self, Feeds, StepCtx};
use est::elab::Target;
use est::ir::{DType, Graph, Init, Op, ReduceOp, TensorType};
use est::span::Span;
use est::tensor::Tensor;
use rustc_hash::FxHashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median seconds of one product (and its sum) on est's host device.
fn est_gemm(n: usize, threads: usize, reps: usize) -> f64 {
    let mut g = Graph::new();
    let ty = TensorType::new(DType::F32, vec![n, n]);
    let var = |g: &mut Graph, name: &str| {
        g.add(
            Op::Variable {
                name: name.into(),
                init: Init::Zeros,
                trainable: false,
            },
            &[],
            ty.clone(),
            Span::default(),
        )
    };
    let (a, b) = (var(&mut g, "a"), var(&mut g, "b"));
    let c = g.add(Op::MatMul, &[a, b], ty.clone(), Span::default());
    let s = g.add(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0, 1],
            keep_dims: false,
        },
        &[c],
        TensorType::scalar(DType::F32),
        Span::default(),
    );
    let mut dev = backend::open(Target::Host, Span::default(), threads).unwrap();
    let mut vars = FxHashMap::default();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for name in ["a", "b"] {
        let vals: Vec<f64> = (0..n * n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f64 / (1u64 << 24) as f64 - 0.5
            })
            .collect();
        vars.insert(name.to_string(), Tensor::from_f64(&ty, vals));
    }
    dev.bind(vars).unwrap();
    let exe = dev
        .compile_run(Arc::new(g), vec![s], Span::default())
        .unwrap();
    let ctx = StepCtx { step: 0, seed: 0 };
    let mut times = Vec::new();
    for i in 0..reps + 3 {
        let t = Instant::now();
        let out = dev.run(exe, Feeds::default(), ctx, 0).unwrap();
        assert!(out[0].scalar().is_finite());
        if i >= 3 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    median(times)
}

/// numpy's median seconds, or why not.
fn numpy_gemm(root: &Path, n: usize, threads: usize, reps: usize) -> Result<f64, String> {
    let out = std::process::Command::new(root.join("bench/.venv/bin/python"))
        .arg(root.join("bench/gemm.py"))
        .args(["--n", &n.to_string(), "--threads", &threads.to_string()])
        .args(["--reps", &reps.to_string()])
        .output()
        .map_err(|e| {
            format!("numpy: cannot run bench/.venv's python ({e}); run scripts/setup_bench_venv.sh")
        })?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.trim()).map_err(|_| {
        format!(
            "numpy: no result: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    v["median_seconds"]
        .as_f64()
        .ok_or_else(|| format!("numpy: no time in {text}"))
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let (rounds, n, reps) = (env("EST_BENCH_ROUNDS", 5), env("EST_BENCH_N", 1024), 20);
    let threads: Vec<usize> = std::env::var("EST_BENCH_THREADS")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .filter_map(|t| t.trim().parse().ok())
        .collect();
    let flops = 2.0 * (n as f64).powi(3);
    println!("fp32 GEMM {n}^3, median of {rounds} alternating rounds (each the median of {reps} products)");
    println!(
        "{:>8} {:>12} {:>12} {:>12} {:>12} {:>10}",
        "threads", "est ms", "est GFLOP/s", "numpy ms", "numpy GFLOP/s", "est/numpy"
    );
    for &t in &threads {
        let (mut e, mut p) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            e.push(est_gemm(n, t, reps));
            match numpy_gemm(root, n, t, reps) {
                Ok(s) => p.push(s),
                Err(why) => eprintln!("{why}"),
            }
        }
        let es = median(e);
        let (ps, ratio) = if p.is_empty() {
            (f64::NAN, "-".to_string())
        } else {
            let ps = median(p);
            (ps, format!("{:.2}x", ps / es))
        };
        println!(
            "{t:>8} {:>12.2} {:>12.1} {:>12.2} {:>12.1} {ratio:>10}",
            es * 1e3,
            flops / es / 1e9,
            ps * 1e3,
            flops / ps / 1e9
        );
    }
}
