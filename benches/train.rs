//! Training speed of the host backend and the interpreter against PyTorch eager, side
//! by side in one run.
//!
//! The est side trains `examples/fc_mnist.est` and `examples/mnist_cnn.est` (batch 128)
//! with `Estimator` on MNIST-shaped TFRecord data generated into a temporary directory
//! (the pipeline caches it after the first epoch, so steady-state steps measure the
//! train step). The PyTorch side is `bench/torch_train.py` (same models, same batch,
//! synthetic tensors already in memory). The two alternate, `EST_BENCH_ROUNDS` rounds
//! (default 5), and the medians and their ratios are reported. The host (when built
//! with the `llvm` feature) and the interpreter run on one thread; PyTorch runs at each thread count of `EST_BENCH_THREADS` (default 1,2).
//!
//! Run: `cargo bench --bench train` (needs bench/.venv: `scripts/setup_bench_venv.sh`).
//! `EST_BENCH_MODELS=fc` limits the models; `EST_BENCH_STEPS` sets the timed steps.

use est::elab::Target;
use est::runtime::{Action, Estimator, RunHook, RunOptions, StepInfo, Steps};
use est::Program;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Records when the timed steps start and end.
struct Clock {
    from: i64,
    to: i64,
    t: Arc<Mutex<(Option<Instant>, Option<Instant>)>>,
}

impl RunHook for Clock {
    fn after_step(&mut self, i: &StepInfo) -> Action {
        let mut t = self.t.lock().unwrap();
        if i.global_step == self.from {
            t.0 = Some(Instant::now());
        }
        if i.global_step == self.to {
            t.1 = Some(Instant::now());
        }
        Action::Continue
    }
}

fn example(img: &[u8], label: i64) -> Vec<u8> {
    use est::data::records::{encode_example, Feature};
    encode_example(&[
        ("image_raw", Feature::Bytes(img)),
        ("label", Feature::Ints(&[label])),
    ])
}

/// 6,400 MNIST-shaped records (pseudo-random pixels) as data/mnist_{train,test}.tfrecord.
fn make_data(dir: &Path) {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    let mut file = Vec::new();
    let mut x: u32 = 12345;
    for i in 0..6400u32 {
        let img: Vec<u8> = (0..784)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8
            })
            .collect();
        file.extend(est::data::records::frame(&example(&img, i64::from(i % 10))));
    }
    std::fs::write(dir.join("data/mnist_train.tfrecord"), &file).unwrap();
    std::fs::write(dir.join("data/mnist_test.tfrecord"), &file).unwrap();
}

/// Steps per second of `steps` est train steps after `warmup` steps.
fn est_rate(program: &Path, data: &Path, warmup: i64, steps: i64, target: Target) -> f64 {
    let p = Program::load(program).unwrap();
    let dir = std::env::temp_dir().join(format!("est-bench-train-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = RunOptions {
        model_dir: Some(dir.clone()),
        data_dir: Some(data.to_path_buf()),
        config: vec![
            ("save_checkpoint_steps".into(), 1_000_000),
            ("save_summary_steps".into(), 1_000_000),
            ("iterations_per_loop".into(), 1_000),
        ],
        target,
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{:?}", f.diags));
    let t = Arc::new(Mutex::new((None, None)));
    e.add_hook(Box::new(Clock {
        from: warmup,
        to: warmup + steps,
        t: t.clone(),
    }))
    .unwrap();
    e.train(Steps::Max((warmup + steps) as u64))
        .unwrap_or_else(|f| panic!("{:?}", f.diags));
    let _ = std::fs::remove_dir_all(&dir);
    let (a, b) = *t.lock().unwrap();
    steps as f64 / (b.unwrap() - a.unwrap()).as_secs_f64()
}

fn torch_rate(root: &Path, model: &str, threads: usize, steps: i64) -> Option<f64> {
    let py = root.join("bench/.venv/bin/python");
    let out = std::process::Command::new(py)
        .arg(root.join("bench/torch_train.py"))
        .args([
            "--model",
            model,
            "--threads",
            &threads.to_string(),
            "--steps",
            &steps.to_string(),
            "--batch",
            "128",
        ])
        .output()
        .ok()?;
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.lines().last()?).ok()?;
    v["steps_per_sec"].as_f64()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // As estc does (src/main.rs): keep freed tensor buffers in the heap for reuse.
    est::runtime::keep_freed_memory();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let data = std::env::temp_dir().join(format!("est-bench-data-{}", std::process::id()));
    make_data(&data);
    let rounds: usize = std::env::var("EST_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let models = std::env::var("EST_BENCH_MODELS").unwrap_or_else(|_| "fc,cnn".into());
    let threads: Vec<usize> = std::env::var("EST_BENCH_THREADS")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .filter_map(|t| t.trim().parse().ok())
        .collect();
    println!(
        "training steps/sec, batch 128, median of {rounds} alternating rounds (est: 1 thread)"
    );
    println!(
        "{:<10} {:>10} {:>12} {:>22} {:>12} {:>14}",
        "model", "est host", "est interp", "pytorch eager", "host/torch", "host/interp"
    );
    for model in models.split(',') {
        let (file, steps, warmup) = match model {
            "fc" => ("examples/fc_mnist.est", 200, 60),
            _ => ("examples/mnist_cnn.est", 20, 5),
        };
        let steps = std::env::var("EST_BENCH_STEPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(steps);
        let mut ours = Vec::new();
        let mut host = Vec::new();
        let mut theirs: Vec<Vec<f64>> = vec![Vec::new(); threads.len()];
        for _ in 0..rounds {
            if cfg!(feature = "llvm") {
                host.push(est_rate(
                    &root.join(file),
                    &data,
                    warmup,
                    steps,
                    Target::Host,
                ));
            }
            ours.push(est_rate(
                &root.join(file),
                &data,
                warmup,
                steps,
                Target::Interp,
            ));
            for (k, &t) in threads.iter().enumerate() {
                match torch_rate(&root, model, t, steps) {
                    Some(r) => theirs[k].push(r),
                    None => eprintln!(
                        "bench/.venv with torch is missing: run scripts/setup_bench_venv.sh"
                    ),
                }
            }
        }
        let o = median(ours);
        let h = if host.is_empty() {
            f64::NAN
        } else {
            median(host)
        };
        for (k, &t) in threads.iter().enumerate() {
            let (p, torch) = if theirs[k].is_empty() {
                (f64::NAN, "-".to_string())
            } else {
                let p = median(theirs[k].clone());
                (
                    p,
                    format!("{p:.1} ({t} thread{})", if t == 1 { "" } else { "s" }),
                )
            };
            println!(
                "{model:<10} {h:>10.1} {o:>12.1} {torch:>22} {:>11.2}x {:>13.2}x",
                h / p,
                h / o
            );
        }
    }
    let _ = std::fs::remove_dir_all(&data);
}
