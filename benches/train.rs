//! Training speed of the host backend against JAX, TensorFlow and PyTorch (and the
//! interpreter), side by side in one run.
//!
//! The est side trains `examples/fc_mnist.est` and `examples/mnist_cnn.est` (with
//! `hidden=[128]`: the TPU example's conv 5x5x32, pool, conv 5x5x64, pool, dense 128,
//! dropout, dense 10), batch 128, plain SGD, with `Estimator` on MNIST-shaped TFRecord
//! data generated into a temporary directory. Like the peers, est trains on a pool of
//! 10 batches already in memory, served in turn: the bench's copy of each example
//! batches its input, takes 10 batches and caches them (`in_memory`), where the
//! example shuffles cached rows through a 10,000-row buffer and stacks each batch
//! anew. The peers are `bench/peers_train.py` (same models, same batch, a pool of 10
//! synthetic batches already in memory): JAX `jit`, TensorFlow `tf.function`,
//! PyTorch eager. Each round runs every
//! contender at every thread count of `EST_BENCH_THREADS` (default 1,2), alternating,
//! `EST_BENCH_ROUNDS` rounds (default 3); the table shows medians and the host's ratio
//! to each peer, the first step (compile included) of each, and each one's peak
//! resident memory (est's from `estc train` in a process of its own).
//!
//! Run: `cargo bench --bench train` (needs bench/.venv: `scripts/setup_bench_venv.sh`).
//! `EST_BENCH_MODELS=fc` limits the models; `EST_BENCH_STEPS` sets the timed steps;
//! `EST_BENCH_PEERS=jax,tf,torch,torch-compile,tf-xla` chooses the peers.

#[path = "../tests/common/mnist.rs"]
mod mnist;

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

/// One contender's figures in one round (NaN where they do not apply).
#[derive(Clone, Copy)]
struct Run {
    /// steps per second after warm-up
    rate: f64,
    /// seconds from the start to the end of the first step (compilation included)
    first: f64,
    /// seconds from `train`'s call to the start of the first step: compiling (or
    /// loading from the cache), binding the variables, the first batch
    ready: f64,
    /// peak resident MiB
    rss: f64,
}

/// Steps per second of `steps` est train steps after `warmup` steps, the seconds of
/// the first step (from `train`'s call: compilation included) and to its start.
fn est_rate(
    program: &Path,
    data: &Path,
    (warmup, steps): (i64, i64),
    target: Target,
    threads: usize,
) -> Run {
    let mut p = Program::load(program).unwrap();
    if program.ends_with("mnist_cnn.est") {
        p.add_override("hidden", "[128]", "bench");
    }
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
        threads: Some(threads),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{:?}", f.diags));
    let t = Arc::new(Mutex::new((None, None)));
    let first = Arc::new(Mutex::new((None, None)));
    e.add_hook(Box::new(Clock {
        from: warmup,
        to: warmup + steps,
        t: t.clone(),
    }))
    .unwrap();
    let started = Instant::now();
    e.add_hook(Box::new(First(started, first.clone()))).unwrap();
    e.train(Steps::Max((warmup + steps) as u64))
        .unwrap_or_else(|f| panic!("{:?}", f.diags));
    let _ = std::fs::remove_dir_all(&dir);
    let (a, b) = *t.lock().unwrap();
    let (ready, first) = *first.lock().unwrap();
    Run {
        rate: match (a, b) {
            (Some(a), Some(b)) => steps as f64 / (b - a).as_secs_f64(),
            _ => f64::NAN,
        },
        first: first.unwrap_or(f64::NAN),
        ready: ready.unwrap_or(f64::NAN),
        rss: f64::NAN,
    }
}

/// The host's first step compiled cold (an empty code cache) and then from the cache
/// it filled, with steps per second of the cold run.
fn est_host(program: &Path, data: &Path, (warmup, steps): (i64, i64), threads: usize) -> [Run; 2] {
    let cache = std::env::temp_dir().join(format!("est-bench-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    // SAFETY (of the bench): no other thread reads the environment meanwhile.
    std::env::set_var("EST_CACHE_DIR", &cache);
    let cold = est_rate(program, data, (warmup, steps), Target::Host, threads);
    let cached = est_rate(program, data, (0, 1), Target::Host, threads);
    std::env::remove_var("EST_CACHE_DIR");
    let _ = std::fs::remove_dir_all(&cache);
    let rss = est_rss(program, data, warmup + steps, threads);
    [
        Run { rss, ..cold },
        Run {
            rate: f64::NAN,
            ..cached
        },
    ]
}

/// Records the seconds from `train`'s call to the start and to the end of the first
/// step.
type Marks = Arc<Mutex<(Option<f64>, Option<f64>)>>;
struct First(Instant, Marks);

impl RunHook for First {
    fn before_step(&mut self, _: i64) {
        let mut f = self.1.lock().unwrap();
        f.0.get_or_insert(self.0.elapsed().as_secs_f64());
    }

    fn after_step(&mut self, _: &StepInfo) -> Action {
        let mut f = self.1.lock().unwrap();
        f.1.get_or_insert(self.0.elapsed().as_secs_f64());
        Action::Continue
    }
}

/// A peer's steps per second, first step and peak MiB (`bench/peers_train.py`), or why not.
fn peer_rate(
    root: &Path,
    peer: &str,
    model: &str,
    threads: usize,
    steps: i64,
) -> Result<Run, String> {
    let py = root.join("bench/.venv/bin/python");
    let out = std::process::Command::new(py)
        .arg(root.join("bench/peers_train.py"))
        .args(["--peer", peer, "--model", model])
        .args(["--threads", &threads.to_string()])
        .args([
            "--steps",
            &steps.to_string(),
            "--warmup",
            "5",
            "--batch",
            "128",
        ])
        .output()
        .map_err(|e| format!("bench/.venv is missing ({e}): run scripts/setup_bench_venv.sh"))?;
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(line.lines().last().unwrap_or("")).map_err(|_| {
            format!(
                "{peer}: no result: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    if let Some(e) = v["error"].as_str() {
        return Err(format!("{peer}: {e}"));
    }
    Ok(Run {
        rate: v["steps_per_sec"].as_f64().unwrap_or(f64::NAN),
        first: v["first_step_seconds"].as_f64().unwrap_or(f64::NAN),
        ready: f64::NAN,
        rss: v["peak_rss_mb"].as_f64().unwrap_or(f64::NAN),
    })
}

/// est's peak resident memory in MiB training `steps` steps of `program` (with the
/// data of `data`) as `estc train` does, in a process of its own.
fn est_rss(program: &Path, data: &Path, steps: i64, threads: usize) -> f64 {
    let copy = data.join("rss.est");
    std::fs::copy(program, &copy).unwrap();
    let dir = std::env::temp_dir().join(format!("est-bench-rss-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_estc"));
    cmd.arg("train")
        .arg(&copy)
        .args([
            "--steps",
            &steps.to_string(),
            "--threads",
            &threads.to_string(),
        ])
        .arg("--model-dir")
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if program.ends_with("mnist_cnn.est") {
        cmd.args(["--param", "hidden=[128]"]);
    }
    // Its own peak (VmHWM), read while it runs: wait4's ru_maxrss would also count
    // this process's peak, which Linux carries over into the child's at exec.
    let mut child = cmd.spawn().unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak_kb = 0u64;
    let done = loop {
        // (once it is estc: before exec, the child shares this process's memory map)
        let own = |s: &String| {
            s.lines()
                .any(|l| l.split_whitespace().eq(["Name:", "estc"]))
        };
        if let Some(s) = std::fs::read_to_string(&status).ok().filter(own) {
            let hwm = s.lines().find_map(|l| l.strip_prefix("VmHWM:"));
            if let Some(kb) = hwm.and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            {
                peak_kb = peak_kb.max(kb);
            }
        }
        match child.try_wait() {
            Ok(None) => std::thread::sleep(std::time::Duration::from_millis(5)),
            other => break other,
        }
    };
    let _ = std::fs::remove_dir_all(&dir);
    match done {
        Ok(Some(s)) if s.success() => peak_kb as f64 / 1024.0,
        other => {
            eprintln!("estc train for the peak memory failed ({other:?})");
            f64::NAN
        }
    }
}

/// Each (contender, threads) with its figures per round.
type Runs = Vec<((String, usize), Vec<Run>)>;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // As estc does (src/main.rs): keep freed tensor buffers in the heap for reuse.
    est::runtime::keep_freed_memory();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let data = std::env::temp_dir().join(format!("est-bench-data-{}", std::process::id()));
    mnist::write(&data, 6400);
    let rounds: usize = std::env::var("EST_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let models = std::env::var("EST_BENCH_MODELS").unwrap_or_else(|_| "fc,cnn".into());
    let threads: Vec<usize> = std::env::var("EST_BENCH_THREADS")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .filter_map(|t| t.trim().parse().ok())
        .collect();
    let peers_env = std::env::var("EST_BENCH_PEERS").unwrap_or_else(|_| "jax,tf,torch".into());
    let peers: Vec<&str> = peers_env
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    println!("training steps/sec, batch 128, median of {rounds} alternating rounds; first step in seconds (compilation included; `est cached`: the first step of a second run, from the code cache); ready: seconds until est's first step starts (compiling or loading code, binding variables, the first batch)");
    for model in models.split(',') {
        let (file, steps, warmup) = match model {
            "fc" => ("examples/fc_mnist.est", 1000, 100),
            _ => ("examples/mnist_cnn.est", 20, 5),
        };
        let steps = std::env::var("EST_BENCH_STEPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(steps);
        let program = mnist::in_memory(&root.join(file), &data);
        // (contender, threads) -> rates and first steps
        let mut got: Runs = Vec::new();
        let mut put = |name: &str, t: usize, r: Run| match got
            .iter_mut()
            .find(|g| g.0 .0 == name && g.0 .1 == t)
        {
            Some(g) => g.1.push(r),
            None => got.push(((name.to_string(), t), vec![r])),
        };
        for _ in 0..rounds {
            for &t in &threads {
                if cfg!(feature = "llvm") {
                    let [cold, cached] = est_host(&program, &data, (warmup, steps), t);
                    put("est host", t, cold);
                    put("est cached", t, cached);
                }
                for peer in &peers {
                    match peer_rate(&root, peer, model, t, steps) {
                        Ok(r) => put(peer, t, r),
                        Err(e) => eprintln!("{e}"),
                    }
                }
            }
            let r = est_rate(&program, &data, (warmup, steps), Target::Interp, 1);
            put("est interp", 1, r);
        }
        println!(
            "\n{model}: {:<14} {:>7} {:>10} {:>12} {:>8} {:>10} {:>14}",
            "contender", "threads", "steps/s", "first step", "ready", "peak MiB", "est host / it"
        );
        for ((name, t), rs) in &got {
            let rate = median(rs.iter().map(|r| r.rate).collect());
            let first = median(rs.iter().map(|r| r.first).collect());
            let ready = median(rs.iter().map(|r| r.ready).collect());
            let rss = median(rs.iter().map(|r| r.rss).collect());
            let host = got
                .iter()
                .find(|g| g.0 .0 == "est host" && g.0 .1 == *t)
                .map(|g| median(g.1.iter().map(|r| r.rate).collect()));
            let ratio = match host {
                Some(h) if rate.is_finite() => format!("{:.2}x", h / rate),
                _ => "-".to_string(),
            };
            println!(
                "{model}: {name:<14} {t:>7} {rate:>10.1} {first:>12.3} {ready:>8.3} {rss:>10.0} {ratio:>14}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&data);
}
