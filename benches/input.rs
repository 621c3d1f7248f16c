//! Input pipeline speed against tf.data, side by side in one run.
//!
//! Data: 60,000 MNIST-shaped `tf.Example`s (784-byte `image_raw`, int64 `label`) in one
//! TFRecord file, written by TensorFlow's own writer (`bench/tfdata_input.py write`) into
//! `target/bench-input/` once.
//!
//! The pipeline, on both sides: TFRecord -> parse -> decode_raw, cast to f32, / 255 ->
//! (cache) -> repeat -> batch(128, drop_remainder); a third variant shuffles after the
//! cache (`shuffle(10000)`), so that batches gather elements instead of taking
//! consecutive ones. est runs it with `Estimator`'s
//! pipeline (`map(parallel: T)`); tf.data with `map(parse, num_parallel_calls=AUTOTUNE)`
//! and a private thread pool of T threads. Each measurement skips `warmup` batches (for
//! the cached pipelines, more than one epoch, so the cache is full) and times the next
//! `batches`. The two sides alternate, `EST_BENCH_ROUNDS` rounds (default 5); medians
//! and their ratio are reported, for each thread count of `EST_BENCH_THREADS` (default
//! 1,2), with and without the cache.
//!
//! Run: `cargo bench --bench input` (needs bench/.venv with tensorflow-cpu:
//! `scripts/setup_bench_venv.sh`).

use est::runtime::{Estimator, RunOptions};
use est::syntax::ast::SectionKind;
use est::Program;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const PROGRAM: &str = r#"// The input benchmark's pipeline (written by benches/input.rs).
use std.nn.dense
use std.losses.softmax_cross_entropy

params {
  threads: int = 1
  cached: bool = false
  shuffled: bool = false
}

input mnist() {
  let ds = tfrecord("mnist60k.tfrecord")
    |> parse { image_raw: bytes, label: i32 }
    |> map(|r| (cast(decode_raw(r.image_raw, u8), f32) / 255.0, r.label), parallel: params.threads)
  let ds = if params.cached { ds |> cache } else { ds }
  let ds = if params.shuffled { ds |> shuffle(10_000) } else { ds }
  ds |> repeat |> batch(128, drop_remainder: true)
}

model m(features: f32[B, 784], labels: i32[B]) {
  let loss = softmax_cross_entropy(labels, dense(features, 10))
  train { minimize loss with sgd(lr: 0.1) }
}

estimator e { model = m  train_input = mnist()  config { random_seed = 1 } }
"#;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One of the measured pipelines.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Plain,
    Cached,
    /// `cache |> shuffle(10_000)`: batches gather shuffled elements (a copy each).
    CachedShuffled,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Plain => "parse + map + batch",
            Variant::Cached => "with cache",
            Variant::CachedShuffled => "with cache, then shuffle(10000)",
        }
    }
}

fn est_rate(dir: &Path, threads: usize, v: Variant, warmup: usize, batches: usize) -> f64 {
    let mut program = Program::load(&dir.join("bench.est")).expect("program");
    program.add_override("threads", &threads.to_string(), "bench");
    program.add_override("cached", &(v != Variant::Plain).to_string(), "bench");
    program.add_override(
        "shuffled",
        &(v == Variant::CachedShuffled).to_string(),
        "bench",
    );
    let est = Estimator::new(&program, &RunOptions::default()).expect("estimator");
    let (mut pipe, _) = est.input_pipeline(SectionKind::Train).expect("pipeline");
    for _ in 0..warmup {
        pipe.next_element().expect("batch").expect("not the end");
    }
    let t = Instant::now();
    let mut check = 0usize;
    for _ in 0..batches {
        let b = pipe.next_element().expect("batch").expect("not the end");
        check += b[0].shape()[0];
    }
    let dt = t.elapsed().as_secs_f64();
    assert_eq!(check, batches * 128);
    (batches * 128) as f64 / dt
}

fn tf_rate(
    python: &Path,
    script: &Path,
    data: &Path,
    threads: usize,
    v: Variant,
    warmup: usize,
    batches: usize,
) -> f64 {
    let mut cmd = Command::new(python);
    cmd.arg(script)
        .arg("run")
        .arg(data)
        .args(["--threads", &threads.to_string()])
        .args(["--warmup", &warmup.to_string()])
        .args(["--batches", &batches.to_string()]);
    if v != Variant::Plain {
        cmd.arg("--cache");
    }
    if v == Variant::CachedShuffled {
        cmd.arg("--shuffle");
    }
    let out = cmd.output().expect("run the tf.data peer");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(line).expect("peer JSON");
    v["records_per_sec"].as_f64().expect("records_per_sec")
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    est::runtime::keep_freed_memory();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("bench/.venv/bin/python");
    let script = root.join("bench/tfdata_input.py");
    if !python.exists() {
        eprintln!("bench/.venv is missing: run scripts/setup_bench_venv.sh first");
        std::process::exit(2);
    }
    let dir = root.join("target/bench-input");
    std::fs::create_dir_all(&dir).unwrap();
    let data = dir.join("mnist60k.tfrecord");
    if !data.exists() {
        eprintln!(
            "writing {} with TensorFlow's TFRecordWriter",
            data.display()
        );
        let ok = Command::new(&python)
            .arg(&script)
            .arg("write")
            .arg(&data)
            .status()
            .expect("write data");
        assert!(ok.success());
    }
    std::fs::write(dir.join("bench.est"), PROGRAM).unwrap();
    let rounds: usize = std::env::var("EST_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let threads: Vec<usize> = std::env::var("EST_BENCH_THREADS")
        .unwrap_or_else(|_| "1,2".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    // One epoch is 468 batches; the cached runs warm up over more than one epoch.
    let (batches, cached_batches) = (468, 2000);
    println!("input pipeline, 60,000 MNIST tf.Examples, batch 128; records/sec, medians of {rounds} alternating rounds");
    println!("| pipeline | threads | est | tf.data | est / tf.data |");
    println!("|---|---|---|---|---|");
    for v in [Variant::Plain, Variant::Cached, Variant::CachedShuffled] {
        for &t in &threads {
            let (warmup, n) = match v {
                Variant::Plain => (20, batches),
                _ => (500, cached_batches),
            };
            let (mut e, mut f) = (Vec::new(), Vec::new());
            for _ in 0..rounds {
                e.push(est_rate(&dir, t, v, warmup, n));
                f.push(tf_rate(&python, &script, &data, t, v, warmup, n));
            }
            let (me, mf) = (median(e.clone()), median(f.clone()));
            eprintln!("  {} threads={t}: est {e:.0?} tf.data {f:.0?}", v.name());
            println!(
                "| {} | {t} | {me:.0} | {mf:.0} | {:.2}x |",
                v.name(),
                me / mf
            );
        }
    }
}
