//! A per-kernel time profile of host steps, on when `EST_PROFILE` is set: every kernel
//! run is timed, and the totals are printed to stderr, largest first, when the device
//! is dropped.

use crate::ir::{Graph, NodeIndex};
use rustc_hash::FxHashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Seconds and runs per kernel, by its label.
static TOTALS: Mutex<Option<FxHashMap<String, (f64, u64)>>> = Mutex::new(None);

/// Whether kernels are timed (`EST_PROFILE` is set and not empty).
pub fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("EST_PROFILE").is_ok_and(|v| !v.is_empty()))
}

/// Adds a run of `node`'s kernel.
pub fn add(g: &Graph, node: NodeIndex, kind: &str, took: Duration) {
    let n = g.node(node);
    let label = format!("{kind:<16} {:<24} {}  #{}", n.op.name(), n.ty, node.index());
    let mut t = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
    let e = t
        .get_or_insert_with(FxHashMap::default)
        .entry(label)
        .or_default();
    e.0 += took.as_secs_f64();
    e.1 += 1;
}

/// Prints the totals (and forgets them).
pub fn print() {
    let Some(totals) = TOTALS.lock().unwrap_or_else(|e| e.into_inner()).take() else {
        return;
    };
    let mut rows: Vec<_> = totals.into_iter().collect();
    rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
    let all: f64 = rows.iter().map(|r| r.1 .0).sum();
    eprintln!("host profile: {:.3} s in kernels", all);
    eprintln!("  {:>9} {:>6} {:>7}  kernel", "ms/run", "%", "runs");
    for (label, (secs, runs)) in rows {
        eprintln!(
            "  {:>9.3} {:>5.1}% {:>7}  {label}",
            secs * 1e3 / runs as f64,
            100.0 * secs / all,
            runs
        );
    }
}
