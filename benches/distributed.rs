//! Training across ranks on this machine: `mpirun -n 1` against `mpirun -n 2` of
//! `estc train` (each rank on one thread, this machine's two cores), for
//! `examples/fc_mnist.est` and `examples/mnist_cnn.est` on MNIST-shaped data from a
//! pool of 10 batches in memory (as `benches/train.rs` trains them). Three runs,
//! alternating, `EST_BENCH_ROUNDS` rounds (default 3), medians:
//!
//! - 1 rank, batch 128;
//! - 2 ranks, the same global batch (64 per rank: strong scaling, the same training);
//! - 2 ranks, 128 per rank (global 256: weak scaling, twice the examples per step).
//!
//! Each run reports steps/s, examples/s, its speed-up over one rank in examples/s, and
//! the share of the time rank 0 spent in the all-reduce (waiting there for the other
//! rank included). Then, on paper, what the measured one-rank step and the model's
//! gradient size predict across machines on 10 and 100 Gb/s links.
//!
//! Run: `cargo bench --features mpi --bench distributed` (Open MPI from
//! scripts/setup.sh). `EST_BENCH_MODELS=fc` limits the models.

#[path = "../tests/common/mnist.rs"]
mod mnist;

use std::path::{Path, PathBuf};
use std::process::Command;

/// One run's figures.
#[derive(Clone, Copy)]
struct Run {
    steps_per_sec: f64,
    allreduce_share: f64,
}

/// `mpirun -n ranks estc train` of `program` at global batch `batch` for `steps` steps.
fn run(program: &Path, data: &Path, ranks: usize, batch: usize, steps: u64) -> Run {
    let dir = std::env::temp_dir().join(format!("est-bench-dist-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let o = Command::new("mpirun")
        .args(["--oversubscribe", "-n", &ranks.to_string()])
        .arg(env!("CARGO_BIN_EXE_estc"))
        .arg("train")
        .arg(program)
        .args(["--threads", "1", "--max-steps", &steps.to_string()])
        .args(["--param", &format!("batch_size={batch}")])
        .args(["--config", "save_summary_steps=1000000"])
        .args(["--config", "save_checkpoint_steps=1000000"])
        .args(["--config", "iterations_per_loop=1000"])
        .args(["--message-format", "json", "--model-dir"])
        .arg(&dir)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .current_dir(data)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Run {
        steps_per_sec: f("steps_per_sec"),
        allreduce_share: f("allreduce_seconds") / f("seconds"),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The bytes of the model's variables (its gradient, under plain SGD): a checkpoint's
/// tensors, less the safetensors header.
fn gradient_bytes(program: &Path, data: &Path) -> f64 {
    let dir = std::env::temp_dir().join(format!("est-bench-dist-g-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ok = Command::new(env!("CARGO_BIN_EXE_estc"))
        .arg("train")
        .arg(program)
        .args(["--max-steps", "1", "--model-dir"])
        .arg(&dir)
        .current_dir(data)
        .output()
        .is_ok_and(|o| o.status.success());
    let b = std::fs::read(dir.join("ckpt-1.safetensors")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    if !ok || b.len() < 8 {
        return f64::NAN;
    }
    let header = u64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8])) as f64;
    b.len() as f64 - 8.0 - header
}

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let data = std::env::temp_dir().join(format!("est-bench-dist-data-{}", std::process::id()));
    mnist::write(&data, 6400);
    let rounds: usize = std::env::var("EST_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let models = std::env::var("EST_BENCH_MODELS").unwrap_or_else(|_| "fc,cnn".into());
    let confs = [
        ("1 rank, batch 128", 1usize, 128usize),
        ("2 ranks, global batch 128 (64 each)", 2, 128),
        ("2 ranks, 128 each (global 256)", 2, 256),
    ];
    println!("training across ranks (mpirun, one thread per rank), median of {rounds} alternating rounds");
    for model in models.split(',') {
        let (file, steps) = match model.trim() {
            "fc" => ("examples/fc_mnist.est", 600),
            _ => ("examples/mnist_cnn.est", 12),
        };
        let program = mnist::in_memory(&root.join(file), &data);
        let mut got: Vec<Vec<Run>> = vec![Vec::new(); confs.len()];
        for _ in 0..rounds {
            for (i, &(_, ranks, batch)) in confs.iter().enumerate() {
                got[i].push(run(&program, &data, ranks, batch, steps));
            }
        }
        println!("\n{file} ({steps} steps)");
        println!(
            "{:<40} {:>9} {:>11} {:>9} {:>11}",
            "run", "steps/s", "examples/s", "speed-up", "all-reduce"
        );
        let mut base = f64::NAN;
        let mut one_step = f64::NAN;
        for (i, &(name, _, batch)) in confs.iter().enumerate() {
            let rate = median(got[i].iter().map(|r| r.steps_per_sec).collect());
            let share = median(got[i].iter().map(|r| r.allreduce_share).collect());
            let ex = rate * batch as f64;
            if i == 0 {
                base = ex;
                one_step = 1.0 / rate;
            }
            println!(
                "{name:<40} {rate:>9.2} {ex:>11.0} {:>8.2}x {:>10.1}%",
                ex / base,
                100.0 * share
            );
        }
        // On paper: N machines, each one rank stepping as the measured one-rank step
        // (batch 128), exchanging the gradient by reduce-scatter and all-gather:
        // 2 (N - 1) / N of its bytes each way, plus a latency per exchange.
        let g = gradient_bytes(&program, &data);
        println!(
            "on paper, across machines (one rank each, batch 128 per rank, step {:.1} ms, gradient {:.2} MB, 2 x 20 us latency per step):",
            one_step * 1e3,
            g / 1e6
        );
        for gbps in [10.0, 100.0] {
            let line: Vec<String> = [2.0f64, 8.0, 64.0]
                .iter()
                .map(|&n| {
                    let comm = 2.0 * (n - 1.0) / n * g / (gbps * 1e9 / 8.0) + 40e-6;
                    let eff = one_step / (one_step + comm);
                    format!("{n} ranks {:.1}x ({:.0}% efficiency)", n * eff, 100.0 * eff)
                })
                .collect();
            println!(
                "  {gbps:>5} Gb/s: all-reduce under {:.2} ms; {}",
                (2.0 * g / (gbps * 1e9 / 8.0)) * 1e3,
                line.join(", ")
            );
        }
    }
    let _ = std::fs::remove_dir_all(&data);
}
