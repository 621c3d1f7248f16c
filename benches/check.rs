//! `estc check` on generated programs: a deep unrolled network whose train graph
//! elaborates to about 10k, 100k and 1M IR nodes. Reports the time of the whole check
//! (parse, resolve, elaborate all three modes, every pass), nodes per second, and how
//! the time grows with size (it should be about linear).
//!
//! Run: `cargo bench --bench check` (or `make bench`). `EST_BENCH_SIZES=10000,100000`
//! chooses the sizes; `EST_BENCH_RUNS` the runs per size (median reported).
//!
//! Wall time per node rises with size as the graph outgrows the caches; the work done is
//! linear, which instruction counts show (HACKING.md: `valgrind --tool=callgrind`).

use est::syntax::ast::SectionKind;
use est::{check, CheckOptions, Program};
use std::time::{Duration, Instant};

/// A residual block of about 30 nodes; the loop over `layers` unrolls it.
const PROGRAM: &str = "
use std.nn.{dense, layer_norm, gelu}
use std.losses.softmax_cross_entropy

params { batch_size: int = 32  width: int = 64  layers: int = 10 }

input points() {
  range(1024) |> map |i| (fill([64], 1.0) * cast(i, f32), i % 10) |> repeat |> batch(params.batch_size, drop_remainder: true)
}

fn block(x, width: int) {
  let h = layer_norm(x)
  let h = dense(h, width) |> gelu
  x + h * 0.5
}

model deep(features: f32[B, 64], labels: i32[B]) {
  let x = features
  for i in 0..params.layers { x = block(x, params.width) }
  let logits = dense(x, 10)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with adam(lr: 0.001) }
  predict { classes = argmax(logits, 1) }
}

estimator deep { model = deep  train_input = points() }
";

struct Run {
    nodes_elaborated: usize,
    nodes_after: usize,
    all_modes: Duration,
    train_only: Duration,
}

fn program(layers: usize) -> Program {
    let mut p = Program::from_source("deep.est", PROGRAM, None);
    p.add_override("layers", &layers.to_string(), "--param layers");
    p
}

/// One measurement of each kind, each with nothing else alive (a large graph left over
/// from the previous measurement would skew the next one's memory behaviour).
fn run_once(layers: usize) -> Run {
    let nodes_elaborated = {
        // Elaboration alone, without passes, gives the node count before CSE and DCE.
        let p = program(layers);
        let eopts = est::elab::ElabOptions {
            target: est::elab::Target::Host,
            modes: vec![SectionKind::Train],
            estimator: None,
            config: Vec::new(),
            max_steps: est::elab::MAX_STEPS,
            hover: false,
            ranks: 1,
        };
        let (_, graphs, _) = est::elab::elaborate(&p, &eopts);
        graphs[0].graph.node_count()
    };
    let opts_train = CheckOptions {
        modes: vec![SectionKind::Train],
        verify: false,
        ..CheckOptions::default()
    };
    let (train_only, nodes_after) = {
        let t = Instant::now();
        let p = program(layers);
        let checked = check(&p, &opts_train);
        let elapsed = t.elapsed();
        assert!(
            !checked.has_errors(),
            "the generated program must check clean"
        );
        (elapsed, checked.graphs[0].graph.node_count())
    };
    let opts_all = CheckOptions {
        verify: false,
        ..CheckOptions::default()
    };
    let all_modes = {
        let t = Instant::now();
        let p = program(layers);
        let checked = check(&p, &opts_all);
        let elapsed = t.elapsed();
        assert_eq!(checked.graphs.len(), 3);
        elapsed
    };
    Run {
        nodes_elaborated,
        nodes_after,
        all_modes,
        train_only,
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let sizes: Vec<usize> = std::env::var("EST_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 100_000, 1_000_000]);
    let runs: usize = std::env::var("EST_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    // Nodes per layer, measured on a small program.
    let probe = run_once(100);
    let per_layer = (probe.nodes_elaborated as f64 / 100.0).max(1.0);
    println!("estc check on a generated deep residual MLP ({per_layer:.1} train-graph nodes per layer, {runs} runs, median)");
    println!(
        "{:>10} {:>12} {:>12} {:>14} {:>14} {:>16} {:>10}",
        "layers",
        "train nodes",
        "after passes",
        "check (train)",
        "check (all 3)",
        "nodes/s (train)",
        "time/node"
    );
    let mut prev: Option<(usize, Duration)> = None;
    for target in sizes {
        let layers = ((target as f64) / per_layer).ceil() as usize;
        let n = runs.min(if target >= 1_000_000 { 3 } else { runs });
        let results: Vec<Run> = (0..n).map(|_| run_once(layers)).collect();
        let nodes = results[0].nodes_elaborated;
        let after = results[0].nodes_after;
        let train = median(results.iter().map(|r| r.train_only).collect());
        let all = median(results.iter().map(|r| r.all_modes).collect());
        let rate = nodes as f64 / train.as_secs_f64();
        println!(
            "{layers:>10} {nodes:>12} {after:>12} {:>12.3} s {:>12.3} s {rate:>16.0} {:>8.2} us",
            train.as_secs_f64(),
            all.as_secs_f64(),
            train.as_secs_f64() * 1e6 / nodes as f64
        );
        if let Some((pn, pt)) = prev {
            let growth = (train.as_secs_f64() / pt.as_secs_f64()) / (nodes as f64 / pn as f64);
            println!(
                "{:>10} time grew {:.2}x for {:.1}x the nodes (1.00 = linear)",
                "",
                train.as_secs_f64() / pt.as_secs_f64(),
                nodes as f64 / pn as f64
            );
            let _ = growth;
        }
        prev = Some((nodes, train));
    }
}
