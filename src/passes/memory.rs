//! What a run of a graph holds in memory, estimated before anything runs, so that a
//! program that cannot fit (a dense layer of 10^9 units, a batch of 10^9, `zeros([10^6,
//! 10^6])`) is a diagnostic of `estc check` (E0602) instead of an allocation failure or
//! the OOM killer after minutes of work.
//!
//! The estimate adds, for one graph:
//! - the variables (with a train graph, twice: the step computes every new value
//!   before the old ones are replaced);
//! - the peak of the intermediate values, by liveness over the topological order as
//!   the interpreter's plan frees them (times the shards of a train step, which run at
//!   once);
//! - the input pipeline's buffers: per input worker, every `shuffle` buffer, the batch
//!   being assembled, every `prefetch` and the hand-off queue. An in-memory `cache`
//!   holds the whole data set, whose size is not known here: it is not counted.
//!
//! It is an estimate of the interpreter's needs; compiled backends plan their own
//! arenas and report them.

use crate::diag::{Code, Diag};
use crate::elab::data::{Dataset, Elem, StageKind};
use crate::ir::{DType, Graph, NodeIndex, Op, TensorType};
use crate::span::Span;
use petgraph::visit::{EdgeRef, NodeIndexable};
use petgraph::Direction;

/// Bytes an element of a byte string is counted as (its length is only known at run
/// time).
const BYTES_PER_STRING: u128 = 64;

/// A graph's memory, by kind, in bytes.
#[derive(Debug, Clone, Default)]
pub struct Estimate {
    pub variables: u128,
    pub activations: u128,
    pub input: u128,
    /// The largest single tensors: (bytes, description, span).
    pub largest: Vec<(u128, String, Span)>,
}

impl Estimate {
    pub fn total(&self) -> u128 {
        self.variables + self.activations + self.input
    }
}

/// What besides the graph the estimate needs.
#[derive(Debug, Clone, Copy)]
pub struct RunShape {
    /// Whether the graph is a train step (variables are held twice).
    pub train: bool,
    /// Replicas of the step that run at once.
    pub shards: u64,
    /// Copies of the input pipeline.
    pub workers: u64,
}

/// The bytes of a tensor as the interpreter holds it: floats as f32, every integer
/// dtype as i64, bools as bytes.
pub fn bytes_of(ty: &TensorType) -> u128 {
    let per = match ty.dtype {
        DType::F32 | DType::F16 | DType::BF16 => 4,
        DType::I32 | DType::U8 | DType::I64 => 8,
        DType::Bool => 1,
        DType::Bytes => BYTES_PER_STRING,
    };
    ty.shape
        .iter()
        .fold(per, |n: u128, &d| n.saturating_mul(d as u128))
}

/// The memory a run of `g` (fed by `input`) needs.
pub fn estimate(g: &Graph, input: Option<&Dataset>, run: RunShape) -> Estimate {
    let mut e = Estimate::default();
    // The three largest tensors, largest first.
    let mut big: Vec<(u128, NodeIndex)> = Vec::with_capacity(4);
    let order = g.topo_order();
    let mut position = vec![0usize; g.g.node_bound()];
    for (i, &n) in order.iter().enumerate() {
        position[n.index()] = i;
    }
    // The last step that reads each value (outputs are kept to the end).
    let mut last = vec![0usize; g.g.node_bound()];
    for &n in &order {
        let users =
            g.g.edges_directed(n, Direction::Outgoing)
                .map(|x| x.target());
        last[n.index()] = users
            .map(|u| position[u.index()])
            .max()
            .unwrap_or(position[n.index()]);
    }
    for o in &g.outputs {
        last[o.node.index()] = order.len();
    }
    let mut frees: Vec<Vec<NodeIndex>> = vec![Vec::new(); order.len() + 1];
    let (mut live, mut peak) = (0u128, 0u128);
    for (i, &n) in order.iter().enumerate() {
        let node = g.node(n);
        let b = bytes_of(&node.ty);
        if big.len() < 3 || b > big[big.len() - 1].0 {
            let at = big.partition_point(|x| x.0 >= b);
            big.insert(at, (b, n));
            big.truncate(3);
        }
        if let Op::Variable { .. } = node.op {
            e.variables = e.variables.saturating_add(b);
            continue;
        }
        live = live.saturating_add(b);
        peak = peak.max(live);
        frees[last[n.index()].max(i)].push(n);
        for f in std::mem::take(&mut frees[i]) {
            live = live.saturating_sub(bytes_of(g.ty(f)));
        }
    }
    if run.train {
        e.variables = e.variables.saturating_mul(2);
    }
    e.activations = peak.saturating_mul(u128::from(run.shards.max(1)));
    e.largest = big
        .into_iter()
        .map(|(b, n)| (b, describe(g, n), g.node(n).span))
        .collect();
    if let Some(ds) = input {
        let (bytes, stage) = pipeline_bytes(ds);
        e.input = bytes.saturating_mul(u128::from(run.workers.max(1)));
        if let Some(buffer) = stage {
            let at = e.largest.partition_point(|x| x.0 >= buffer.0);
            e.largest.insert(at, buffer);
            e.largest.truncate(3);
        }
    }
    e
}

/// A node as a person reads it in the list of the largest tensors.
fn describe(g: &Graph, n: NodeIndex) -> String {
    let node = g.node(n);
    match &node.op {
        Op::Variable { name, .. } => format!("variable `{name}` {}", node.ty),
        Op::Input { name } => format!("input `{name}` {}", node.ty),
        op => format!("{} {}", op.name(), node.ty),
    }
}

fn elem_bytes(e: &Elem) -> u128 {
    match e {
        Elem::Tensor { dtype, dims } => {
            let per = match dtype {
                DType::Bytes => BYTES_PER_STRING,
                d => bytes_of(&TensorType::scalar(*d)),
            };
            dims.iter()
                .fold(per, |n, d| n.saturating_mul(d.unwrap_or(1) as u128))
        }
        Elem::Tuple(xs) => xs.iter().map(elem_bytes).fold(0, u128::saturating_add),
        Elem::Record(fs) => fs
            .iter()
            .map(|(_, x)| elem_bytes(x))
            .fold(0, u128::saturating_add),
    }
}

/// The buffers of one copy of a pipeline, and its largest one.
fn pipeline_bytes(ds: &Dataset) -> (u128, Option<(u128, String, Span)>) {
    let mut total = 0u128;
    let mut largest: Option<(u128, String, Span)> = None;
    let mut before = 0u128;
    for s in &ds.stages {
        let b = match &s.kind {
            StageKind::Shuffle { buffer, .. } => before.saturating_mul(*buffer as u128),
            StageKind::Batch { .. } => elem_bytes(&s.elem),
            StageKind::Prefetch { n } => elem_bytes(&s.elem).saturating_mul(*n as u128),
            StageKind::Zip { other } => pipeline_bytes(other).0,
            _ => 0,
        };
        if b > 0 && largest.as_ref().is_none_or(|l| b > l.0) {
            largest = Some((
                b,
                format!("the `{}` buffer of the input", s.kind.name()),
                s.span,
            ));
        }
        total = total.saturating_add(b);
        before = elem_bytes(&s.elem);
    }
    // The hand-off queue of a worker holds two elements ahead.
    total = total.saturating_add(before.saturating_mul(2));
    (total, largest)
}

/// A size for people: `3.6 TiB`, `512.0 MiB`, `12 bytes`.
pub fn human(b: u128) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if b < 1024 {
        return format!("{b} bytes");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// The memory this process may use: `MemTotal` of `/proc/meminfo`, or the memory
/// limit of its cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`) when that is
/// lower, as in a container. `None` when neither is known. Read once per process: the
/// language server checks on every edit.
pub fn machine_memory() -> Option<u64> {
    static MEMORY: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *MEMORY.get_or_init(read_machine_memory)
}

fn read_machine_memory() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line
                .trim_start_matches("MemTotal:")
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            kib.checked_mul(1024)
        });
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok()?.trim().parse::<u64>().ok())
    .min();
    match (total, cgroup) {
        (Some(t), Some(c)) => Some(t.min(c)),
        (t, c) => t.or(c),
    }
}

/// E0602 when the estimate is beyond `limit`.
pub fn check(e: &Estimate, limit: u64, what: &str, fallback: Span) -> Option<Diag> {
    let total = e.total();
    if total <= u128::from(limit) {
        return None;
    }
    let (at, first) = e
        .largest
        .first()
        .map_or((fallback, String::new()), |(b, d, s)| {
            (*s, format!("{d}: {}", human(*b)))
        });
    let list: Vec<String> = e
        .largest
        .iter()
        .map(|(b, d, _)| format!("{d} ({})", human(*b)))
        .collect();
    Some(
        Diag::new(
            Code::OutOfMemory,
            at,
            format!(
                "{what} needs about {} of memory, more than the limit of {}: variables {}, intermediate values {}, input buffers {}",
                human(total),
                human(u128::from(limit)),
                human(e.variables),
                human(e.activations),
                human(e.input)
            ),
        )
        .label(first)
        .help(format!(
            "the largest tensors are {}; make them smaller (the batch size, a layer's width), or set the limit with --memory-limit (default: this machine's memory)",
            list.join(", ")
        )),
    )
}
