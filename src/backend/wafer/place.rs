//! Placement, routing and colours: a formed graph laid out on a fabric, ready to run.
//!
//! **Shape.** The kernels of a chain (the forward streams run kernel to kernel) are laid
//! out as a staircase from the fabric's north-west corner: each dense layer's output edge
//! faces the next kernel's input edge lane for lane, so no stream needs an adapter. A
//! dense layer lies as it is (inputs from the north, outputs to the east) or transposed,
//! alternately; the vector kernel after a layer is a strip of its lanes along the
//! layer's output edge.
//!
//! **Size.** Every layer gets blocks of about the same size `s`: `ceil(k / s)` columns and
//! `ceil(n / s)` rows (one row before a kernel that needs a sample's values on one PE).
//! The smallest `s` whose staircase fits the fabric (and every PE's memory) wins: the
//! most PEs, so the shortest period.
//!
//! **Streams and colours.** Kernel to kernel, a stream's lanes go straight across the
//! facing edges. The host's streams enter at the fabric's north edge and run down a
//! column to their kernel (an input several kernels read, to each); per-sample outputs
//! run east to the fabric's east edge. Each stream takes the lowest colour that no
//! router on its way uses yet; a dense layer's chains use the four colours below the
//! streams'.

use super::fabric::Fabric;
use super::form::{self, image, End, Formed, Kind, Unsupported};
use super::isa::Colour;
use super::kernels::dense::{self, Dense, Geom, Shape};
use super::kernels::vector::{Fan, Port, Rep, Vector};
use super::kernels::{split, Laid, Orient, Piece, UPDATE};
use super::lower::Update;
use super::pipeline::Widths;
use super::sim::{Dir, HostIn, Route, Setup};
use crate::ir::{Graph, NodeIndex, Op, Padding};
use crate::span::Span;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What the wafer lays out, for the help of what it does not.
const RESIDUALS: &str = "the wafer lays out chains of layers, and residuals around one dense layer (`h + f(h W)`, the layer carrying `h` past itself): feed each value to the next layer, or to the sum just after it";

/// The colours a dense layer's chains take; streams take the ones above.
pub const CHAIN_COLOURS: Colour = 4;

/// One lane of a stream between the fabric and the host: the router it enters or
/// leaves at (and through which port), its colour, and the elements of a sample it
/// carries.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostLane {
    pub x: u32,
    pub y: u32,
    pub dir: Dir,
    pub colour: Colour,
    pub elems: std::ops::Range<u32>,
}

/// A stream between the fabric and the host: the node (its index in the graph, and its
/// input's name or op), its elements per sample, lanes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostStream {
    pub node: u32,
    pub name: String,
    pub per_sample: u32,
    /// An image's channels when the host sends it planar (channel by channel), else 0.
    #[serde(default)]
    pub channels: u32,
    /// The ids of an embedding: the gather's node and its table's rows (the host checks
    /// every id is below them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<(u32, u32)>,
    pub lanes: Vec<HostLane>,
}

/// A kernel's place.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Placed {
    pub name: String,
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
    pub orient: Orient,
}

/// A formed graph laid out on a fabric.
#[derive(Debug, Clone)]
pub struct Layout {
    pub fabric: Fabric,
    pub batch: u32,
    pub setup: Setup,
    pub tensors: BTreeMap<String, Vec<Piece>>,
    pub inputs: Vec<HostStream>,
    pub outputs: Vec<HostStream>,
    pub kernels: Vec<Placed>,
    /// The block size every layer got, or 0 when each was sized to a common period.
    pub block: u32,
}

/// Why a layout failed.
#[derive(Debug, Clone, PartialEq)]
pub enum LayoutError {
    /// The graph has something the wafer's kernels do not do.
    Unsupported(Unsupported),
    /// With the smallest blocks whose kernels fit the fabric's PEs, a PE's memory does
    /// not hold its share.
    Sram(SramShort),
    /// Even the smallest staircase runs off the fabric.
    Pes(PesShort),
    /// The streams need more colours than the fabric's routers give programs.
    Colours(ColoursShort),
    /// No sizing works for another reason: what went wrong.
    DoesNotFit(String),
}

/// A kernel whose PE needs more SRAM than a PE has.
#[derive(Debug, Clone, PartialEq)]
pub struct SramShort {
    pub kernel: String,
    /// Where its layer is written.
    pub span: Option<Span>,
    /// The PE (the kernel's largest memory map).
    pub at: (u32, u32),
    /// The sizing (`sizing`'s argument), and the PEs the kernel takes at it.
    pub block: u32,
    pub pes: u64,
    /// Bytes by what they hold (code and runtime first), the non-zero ones.
    pub parts: Vec<(&'static str, u32)>,
    /// All of them, and the PE's SRAM.
    pub need: u32,
    pub have: u32,
    /// The kernel beside a layer that keeps it on one PE, whatever the fabric: the
    /// kernels on both sides of it run on one lane (a reduction within a sample).
    pub pinned: Option<String>,
}

/// A staircase larger than the fabric.
#[derive(Debug, Clone, PartialEq)]
pub struct PesShort {
    /// The first kernel that runs off the fabric, and where its layer is written.
    pub kernel: String,
    pub span: Option<Span>,
    /// Some kernel takes more lanes than its block size gives, for its memory (a
    /// smaller batch per step would shrink it).
    pub floor: bool,
    pub block: u32,
    /// The columns and rows the staircase spans, and the PEs its kernels take.
    pub extent: (u32, u32),
    pub pes: u64,
}

impl PesShort {
    /// The PEs a fabric of `w` x `h` lacks for the staircase's rectangle.
    pub fn missing(&self, w: u32, h: u32) -> u64 {
        let (sw, sh) = (
            u64::from(self.extent.0.max(w)),
            u64::from(self.extent.1.max(h)),
        );
        sw * sh - u64::from(w) * u64::from(h)
    }
}

/// More colours needed than a fabric gives programs.
#[derive(Debug, Clone, PartialEq)]
pub struct ColoursShort {
    /// The first stream that found none free.
    pub stream: String,
    pub need: u32,
    pub have: u32,
}

impl From<Unsupported> for LayoutError {
    fn from(u: Unsupported) -> LayoutError {
        LayoutError::Unsupported(u)
    }
}

fn unsupported(g: &Graph, n: NodeIndex, message: String, help: &str) -> LayoutError {
    LayoutError::Unsupported(Unsupported {
        span: g.node(n).span,
        message,
        help: help.to_string(),
    })
}

/// Where a kernel's layer is written: its first variable's, else its first node's span.
fn kernel_span(g: &Graph, f: &Formed, k: usize) -> Option<Span> {
    let kr = &f.kernels[k];
    let first = match &kr.kind {
        Kind::Dense { fwd, .. } => Some(*fwd),
        Kind::Vector { nodes } => nodes.first().copied(),
    };
    kr.vars.first().copied().or(first).map(|n| g.node(n).span)
}

/// The name of a kernel for reports: its layer's variable scope, or its first op.
fn kernel_name(g: &Graph, f: &Formed, k: usize) -> String {
    let kr = &f.kernels[k];
    let var = kr.vars.iter().find_map(|&v| match &g.node(v).op {
        Op::Variable { name, .. } => Some(
            name.rsplit_once('/')
                .map_or(name.clone(), |(a, _)| a.to_string()),
        ),
        _ => None,
    });
    match (&kr.kind, var) {
        (Kind::Dense { .. }, Some(v)) => v,
        (Kind::Dense { .. }, None) => format!("dense #{k}"),
        (Kind::Vector { nodes }, v) => {
            // its telling ops, else its first
            let mut ops: Vec<&str> = Vec::new();
            for &n in nodes {
                let name = g.node(n).op.name();
                let telling = matches!(
                    name,
                    "relu"
                        | "sigmoid"
                        | "tanh"
                        | "softmax"
                        | "log_softmax"
                        | "one_hot"
                        | "argmax"
                        | "exp"
                        | "log"
                );
                if telling && !ops.contains(&name) {
                    ops.push(name);
                }
            }
            if ops.is_empty() {
                ops.extend(nodes.first().map(|&n| g.node(n).op.name()));
            }
            let ops = ops.join(" ");
            match v {
                Some(v) => format!("{v} {ops}"),
                None => format!("{ops} #{k}"),
            }
        }
    }
}

/// Lays out `g` (formed as `f`) on fabric `fab`.
pub fn layout(g: &Graph, f: &Formed, fab: &Fabric) -> Result<Layout, LayoutError> {
    let n = f.kernels.len();
    if n == 0 {
        return Err(LayoutError::DoesNotFit(
            "the graph has no kernel to lay out".into(),
        ));
    }
    if std::env::var_os("EST_WAFER_DEBUG").is_some() {
        for (k, kr) in f.kernels.iter().enumerate() {
            eprintln!("kernel {k}: {:?}", kr.kind);
        }
        for s in &f.streams {
            eprintln!("stream {s:?} ({})", g.node(s.node).op.name());
        }
    }
    // the chain: each kernel's forward input comes from the one before (and goes on
    // at most through a strip to the one after), each backward one from the one after
    for s in &f.streams {
        if let (true, End::Kernel(a)) = (s.bwd, s.from) {
            // (or past a strip, through its routers)
            let ok = s.to.iter().all(|t| match t {
                End::Kernel(b) => {
                    *b + 1 == a
                        || (*b + 2 == a && matches!(f.kernels[a - 1].kind, Kind::Vector { .. }))
                }
                End::Host => false,
            });
            if !ok {
                return Err(unsupported(
                    g,
                    s.node,
                    "a gradient that skips a layer has no wafer layout yet".into(),
                    RESIDUALS,
                ));
            }
            continue;
        }
        if s.bwd {
            continue;
        }
        if let End::Kernel(a) = s.from {
            // (or past the layer after it, which carries it: a residual)
            let ok = s.to.iter().all(|t| match t {
                End::Kernel(b) => *b == a + 1 || (*b == a + 2 && f.carried(s.node, *b)),
                End::Host => true,
            });
            if !ok {
                return Err(unsupported(g, s.node, "a value read past the layer after it (or by several layers) has no wafer layout yet".into(), RESIDUALS));
            }
        }
    }
    for (k, kr) in f.kernels.iter().enumerate() {
        if let Kind::Dense { x, fwd, .. } = kr.kind {
            let from = f
                .streams
                .iter()
                .find(|s| s.node == f.resolve(x))
                .map(|s| s.from);
            let gathers =
                form::product(g, &kr.kind).is_some_and(|p| matches!(g.node(p).op, Op::Gather));
            if gathers && from != Some(End::Host) {
                return Err(unsupported(g, fwd, "an embedding of ids computed on the wafer has no wafer layout yet".into(), "every column of an embedding takes a sample's ids from the host: compute the ids in the input pipeline (`map`) and feed them to `embedding` as they are"));
            }
            let want = if k == 0 {
                End::Host
            } else {
                End::Kernel(k - 1)
            };
            if from != Some(want) {
                return Err(unsupported(g, x, "a layer whose input does not come from the kernel before it has no wafer layout yet".into(), "the wafer lays out chains of layers so far"));
            }
            for part in parts_of(f, k) {
                let from = f.streams.iter().find(|s| s.node == f.resolve(part.x));
                if from.is_none_or(|s| s.from != End::Host) {
                    return Err(unsupported(g, part.x, "a sum of products whose inputs come from two kernels has no wafer layout yet".into(), "the wafer sums a layer's products over its own input and inputs the host sends (`x W + h U`): compute the other input from the features alone"));
                }
            }
        }
    }
    // the windows as wide as they need, narrowed while memory (or the PEs that more
    // lanes of memory take) is short
    let mut widths = Widths::WIDEST;
    loop {
        let sizer = Sizer::new(g, f, fab, widths)?;
        let widest = sizer.sched.iter().map(|s| s.0).max().unwrap_or(1);
        match (search(&sizer), widths.narrower(widest)) {
            (Err(LayoutError::Sram(_) | LayoutError::Pes(_)), Some(w)) => widths = w,
            (r, _) => return r,
        }
    }
}

/// The sizings of `sizer`'s graph: one block size for every layer (the smallest that
/// fits), and each kernel sized to the tightest budget of each pace whose staircase
/// fits (`balanced`); of the layouts within 2% of the shortest estimated step, the one
/// with the fewest PEs wins (`thrifty`).
fn search(sizer: &Sizer) -> Result<Layout, LayoutError> {
    let (g, f, fab) = (sizer.g, sizer.f, sizer.fab);
    let n = f.kernels.len();
    let debug = std::env::var_os("EST_WAFER_DEBUG").is_some();
    if debug {
        for k in 0..n {
            eprintln!(
                "kernel {k} {}: {:?}, width {:?}, floor {}",
                kernel_name(g, f, k),
                sizer.dims[k],
                sizer.width[k],
                sizer.floor[k]
            );
        }
    }
    // what no sizing had enough of: a PE's memory (the smallest blocks that got that
    // far), colours, PEs (the staircase nearest to fitting), something else
    let mut sram = None;
    let mut colours = None;
    let mut pes: Option<PesShort> = None;
    let mut other = None;
    // the sizings that fit, by (estimated step, PEs), with their block size: a layout
    // holds every PE's program and memory (gigabytes on a large fabric), so only the
    // winner's is made again, not each one kept
    let mut fit: Vec<((u64, usize), Lanes, u32)> = Vec::new();
    let mut consider =
        |r: Result<(Lanes, Layout), LayoutError>, s: u32| -> Result<(), LayoutError> {
            if debug {
                if let Err(e) = &r {
                    eprintln!("does not fit: {e:?}");
                }
            }
            match r {
                Ok((lanes, l)) => {
                    let key = (sizer.step(&lanes), l.setup.pes.len());
                    if debug {
                        let each = sizer.periods(&lanes);
                        eprintln!(
                            "sizing {lanes:?}: step {} on {} PEs ({each:?})",
                            key.0, key.1
                        );
                    }
                    fit.push((key, lanes, s));
                }
                Err(LayoutError::Sram(e)) => {
                    sram.get_or_insert(e);
                }
                Err(LayoutError::Colours(e)) => {
                    colours.get_or_insert(e);
                }
                Err(LayoutError::Pes(mut e)) => {
                    e.floor = sizer.floor.iter().any(|&l| l > 1);
                    let area = |p: &PesShort| p.missing(fab.width, fab.height);
                    if pes.as_ref().is_none_or(|p| area(&e) < area(p)) {
                        pes = Some(e);
                    }
                }
                Err(LayoutError::DoesNotFit(why)) => other = Some(why),
                Err(e) => return Err(e),
            }
            Ok(())
        };
    for s in [
        1u32, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096,
    ] {
        let r = sizer
            .block(s)
            .and_then(|lanes| try_lanes(sizer, &lanes, s).map(|l| (lanes, l)));
        let fits = r.is_ok();
        consider(r, s)?;
        if fits {
            break;
        }
    }
    for lanes in sizer.balanced() {
        let r = try_lanes(sizer, &lanes, 0).map(|l| (lanes, l));
        consider(r, 0)?;
    }
    if let Some(i) = thrifty(fit.iter().map(|f| f.0)) {
        let (_, lanes, s) = fit.swap_remove(i);
        return try_lanes(sizer, &lanes, s);
    }
    Err(if let Some(e) = sram {
        LayoutError::Sram(e)
    } else if let Some(e) = colours {
        LayoutError::Colours(e)
    } else if let Some(e) = pes {
        LayoutError::Pes(e)
    } else {
        LayoutError::DoesNotFit(other.unwrap_or_default())
    })
}

/// The most replicas a one-lane kernel runs as (its dealer counts each one's samples
/// on a counter of its own, and one the batch's).
const MAX_REPS: u32 = 6;

/// How much longer (in 1/1000) an estimated step may be to save PEs: the estimates
/// are not closer than that to what the simulator measures.
const STEP_SLACK: u64 = 20;

/// Of sizings as (estimated step, PEs), the one with the fewest PEs of those whose
/// step is within `STEP_SLACK` of the shortest (then the shorter step, then the
/// first).
fn thrifty(keys: impl Iterator<Item = (u64, usize)> + Clone) -> Option<usize> {
    let shortest = keys.clone().map(|k| k.0).min()?;
    let limit = shortest + shortest * STEP_SLACK / 1000;
    (keys.enumerate())
        .filter(|(_, k)| k.0 <= limit)
        .min_by_key(|&(i, (step, pes))| (pes, step, i))
        .map(|(i, _)| i)
}

/// Each kernel's input and output lanes.
#[derive(Debug, Clone, PartialEq)]
struct Lanes {
    inp: Vec<u32>,
    out: Vec<u32>,
    /// A layer's further parts' input lanes (columns beside its own).
    more: Vec<Vec<u32>>,
    /// A one-lane kernel's replicas (1: it runs on its lane; more: a dealer on the
    /// lane deals the samples to them, in the lanes after it).
    reps: Vec<u32>,
}

impl Lanes {
    fn new(kernels: usize) -> Lanes {
        Lanes {
            inp: vec![0; kernels],
            out: vec![0; kernels],
            more: vec![Vec::new(); kernels],
            reps: vec![1; kernels],
        }
    }

    /// Vector kernel `k`'s PEs along its layer's output edge: its lanes, or its
    /// dealer and replicas.
    fn strip(&self, k: usize) -> u32 {
        match self.reps[k] {
            0 | 1 => self.out[k],
            r => 1 + r,
        }
    }

    /// Kernel `k`'s input lanes: its own and its further parts'.
    fn columns(&self, k: usize) -> u32 {
        self.inp[k] + self.more[k].iter().sum::<u32>()
    }
}

/// The vector kernel `k` with its streams (colours from `colour`).
fn vector_of<'a>(
    g: &'a Graph,
    f: &'a Formed,
    k: usize,
    (window, fifo): (u32, u32),
    colour: impl Fn(NodeIndex) -> Colour,
) -> Vector<'a> {
    let mut v = Vector {
        g,
        f,
        k,
        inputs: Vec::new(),
        outputs: Vec::new(),
        window,
        fifo,
    };
    // a residual's value and a side part's outputs come in after the outputs of the
    // layer before, which carries them; their gradients go out after that layer's
    // output gradient, in the same order
    let layer = k.checked_sub(1).and_then(|l| match &f.kernels[l].kind {
        Kind::Dense {
            fwd,
            dy,
            carry,
            more,
            ..
        } => Some((*fwd, *dy, *carry, more)),
        Kind::Vector { .. } => None,
    });
    for st in &f.streams {
        let c = colour(st.node);
        if st.to.contains(&End::Kernel(k)) {
            let carried = f.carried_rank(st.node, k);
            v.inputs.push(Port {
                node: st.node,
                colour: match layer {
                    Some((fwd, ..)) if carried > 0 => colour(fwd),
                    _ => c,
                },
                bwd: st.bwd,
                whole: st.from == End::Host,
                carried,
            });
        }
        if st.from == End::Kernel(k) && !(k > 0 && f.carried(st.node, k - 1)) {
            v.outputs.push(Port {
                node: st.node,
                colour: c,
                bwd: st.bwd,
                whole: false,
                carried: 0,
            });
        }
    }
    if let Some((_, Some(dy), carry, more)) = layer {
        let dy = f.resolve(dy);
        let skip = carry.and_then(|c| c.grad).map(|g| g.1);
        let sides = more
            .iter()
            .filter(|p| p.side && p.dw.is_some())
            .filter_map(|p| p.dy);
        // (a residual's gradient that is the layer's output gradient is sent once)
        for (rank, node) in (1u8..).zip(std::iter::once(skip).chain(sides.map(Some))) {
            match node {
                Some(node) if node != dy => v.outputs.push(Port {
                    node,
                    colour: colour(dy),
                    bwd: true,
                    whole: false,
                    carried: rank,
                }),
                _ => {}
            }
        }
    }
    sorted(v)
}

/// Vector kernel `v` with each carried stream after what carries it.
fn sorted(mut v: Vector<'_>) -> Vector<'_> {
    v.inputs.sort_by_key(|p| p.carried);
    v.outputs.sort_by_key(|p| p.carried);
    v
}

/// A layer's input and output groups (features or channels), whether it trains and
/// whether it sends `dx`, and what it computes.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Dims {
    k: u32,
    n: u32,
    train: bool,
    dx: bool,
    shape: Shape,
}

/// A layer kernel's dimensions (`None` for a vector kernel).
fn dense_dims(g: &Graph, f: &Formed, kind: &Kind) -> Option<Dims> {
    let Kind::Dense {
        w, x, fwd, dw, bwd, ..
    } = kind
    else {
        return None;
    };
    let ws: Vec<u32> = g.ty(*w).shape.iter().map(|&d| d as u32).collect();
    let made = form::product(g, kind).unwrap_or(*fwd);
    let (k, n, shape) = match (&g.node(made).op, image(g, *x), image(g, f.resolve(*x))) {
        (Op::Gather, _, _) => {
            let t = g.ty(*x).elements() / f.batch.max(1) as usize;
            (ws[0], ws[1], Shape::Gather { t: t as u32 })
        }
        (Op::Conv2d(c), Some((h, wd, _)), _) => {
            let dil = (c.dilation[0] as u32, c.dilation[1] as u32);
            let same = c.padding == Padding::Same;
            let stride = (c.strides[0] as u32, c.strides[1] as u32);
            let geom = Geom::new(h, wd, (ws[0], ws[1]), dil, stride, same)?;
            (ws[2], ws[3], Shape::Conv(geom))
        }
        // an image flattened: its channels split over the columns
        (_, _, Some((h, wd, c))) => (c, ws[1], Shape::Planar { hw: h * wd }),
        _ => (ws[0], ws[1], Shape::Matmul),
    };
    Some(Dims {
        k,
        n,
        train: dw.is_some(),
        dx: bwd.is_some(),
        shape,
    })
}

/// A product layer's cycles per sample on `w x h` lanes in the forward and the
/// backward pass, stalls aside (its program's operations, as `kernels/dense.rs` makes
/// them for a row of its own outputs alone).
fn dense_period(fab: &Fabric, d: Dims, w: u32, h: u32) -> Cost {
    use super::cost::vec_op;
    use super::isa::VecOp::{Add, Fmac, Mov, Mul};
    let Dims {
        k, n, train, dx, ..
    } = d;
    let (a, b) = (
        k.div_ceil(w.max(1)) * d.shape.per_in(),
        n.div_ceil(h.max(1)),
    );
    let sw = u64::from(fab.task_switch);
    // `count` multiply-adds of `len` elements: one two-dimensional operation
    let macs = |count: u32, len: u32| match count {
        0 => 0,
        _ => vec_op(fab, Fmac, count * len, 3, true),
    };
    // `count` products of `len` elements summed: a multiply, then the multiply-adds
    let products = |count: u32, len: u32| match count {
        0 => vec_op(fab, Mov, len, 0, true),
        _ => vec_op(fab, Mul, len, 2, true) + macs(count - 1, len),
    };
    let fwd = sw + vec_op(fab, Mov, a, 0, true) + products(a, b) + vec_op(fab, Add, b, 1, false);
    if !train {
        return [fwd, 0];
    }
    let back = if dx {
        products(b, a) + vec_op(fab, Add, a, 1, false)
    } else {
        0
    };
    [fwd, sw + vec_op(fab, Mov, b, 0, true) + back + macs(a, b)]
}

/// A kernel's place on a staircase: its north-west corner, its size on the fabric, its
/// orientation.
type Stair = ((u32, u32), (u32, u32), Orient);

/// Each kernel's place on the staircase of a sizing (layers alternate orientation; a
/// strip keeps its layer's).
fn staircase(f: &Formed, lanes: &Lanes) -> Vec<Stair> {
    let mut orient = Orient::North;
    let mut at = (0u32, 0u32);
    let mut out = Vec::with_capacity(f.kernels.len());
    for (k, kr) in f.kernels.iter().enumerate() {
        let size = match kr.kind {
            Kind::Dense { .. } => {
                if k > 0 {
                    orient = orient.flip();
                }
                orient.size(lanes.columns(k), lanes.out[k])
            }
            Kind::Vector { .. } => orient.size(1, lanes.strip(k)),
        };
        out.push((at, size, orient));
        at = match orient {
            Orient::North => (at.0 + size.0, at.1),
            Orient::West => (at.0, at.1 + size.1),
        };
    }
    out
}

/// The staircase's width and height for a sizing.
fn extents(f: &Formed, lanes: &Lanes) -> (u32, u32) {
    staircase(f, lanes)
        .iter()
        .fold((0, 0), |(w, h), &((x, y), (fw, fh), _)| {
            (w.max(x + fw), h.max(y + fh))
        })
}

/// What sizing needs of a formed graph, worked out once: each kernel's dense sizes,
/// vector width and whether it hands its outputs to a one-lane kernel, and the vector
/// kernels' periods as they are asked for (each one a generated program).
struct Sizer<'a> {
    g: &'a Graph,
    f: &'a Formed,
    fab: &'a Fabric,
    dims: Vec<Option<Dims>>,
    /// A vector kernel's width on several lanes (`None`: one lane only; dense: `None`).
    width: Vec<Option<u32>>,
    single_next: Vec<bool>,
    /// A layer's fewest output lanes: those the vector kernel after it needs for its
    /// lanes' memory to fit (1 when none does).
    floor: Vec<u32>,
    /// Each layer kernel with its tensors and update (`None` for a vector kernel).
    dense: Vec<Option<Dense>>,
    /// Further parts' first PEs by (kernel, part, columns, rows), as they are asked
    /// for: cycles per sample, and whether the memory fits.
    part_pes: std::cell::RefCell<BTreeMap<(usize, usize, u32, u32), Measured>>,
    periods: std::cell::RefCell<BTreeMap<VectorSizing, Option<Cost>>>,
    /// Whether a one-lane kernel can run as replicas (`Vector::replicable`).
    replicable: Vec<bool>,
    /// A replicable one-lane kernel's input from the layer before it and that input's
    /// gradient, when its dealer can gather them from the layer's rows (`fanned`).
    fanned: Vec<Option<(NodeIndex, Option<NodeIndex>)>>,
    /// Layers' first PEs by (kernel, columns, rows), as they are asked for: cycles per
    /// sample, and whether the memory fits.
    layers: std::cell::RefCell<BTreeMap<KernelLanes, Measured>>,
    /// How wide windows may be (memory's limit), and each kernel's window and FIFO
    /// with as many replicas as a loss may have (`schedule`).
    widths: Widths,
    sched: Vec<(u32, u32)>,
}

/// The samples a dealer keeps out at each of its replicas: one computed, one waiting
/// in the replica's FIFO (`Vector::dealer`).
const DEALT: u32 = 2;

/// Each kernel's window and FIFO (`pipeline::plan`) as wide as `widths` lets them,
/// when a kernel that ends the backward pass runs as `reps(k)` replicas.
fn schedule(f: &Formed, widths: Widths, reps: impl Fn(usize) -> u32) -> Vec<(u32, u32)> {
    let chain: Vec<Option<u32>> = (0..f.kernels.len())
        .map(|k| match f.backward_role(k) {
            Some(1) => Some(match reps(k) {
                0 | 1 => 1,
                r => DEALT * r,
            }),
            role => role,
        })
        .collect();
    super::pipeline::plan(&chain, f.batch, widths)
}

/// A kernel's cycles per sample in the forward pass and in the backward pass. A
/// step's backward pass starts when its forward pass has ended (`kernels/vector.rs`),
/// so each pass goes at its slowest kernel's pace.
type Cost = [u64; 2];

/// A cost that rules a kernel out.
const NEVER: Cost = [u64::MAX / 4, 0];

/// What a sizing allows each kernel: cycles per sample in all, and in each pass.
#[derive(Debug, Clone, Copy)]
struct Budget {
    total: u64,
    pass: Cost,
}

impl Budget {
    fn admits(&self, c: Cost) -> bool {
        c[0].saturating_add(c[1]) <= self.total && c[0] <= self.pass[0] && c[1] <= self.pass[1]
    }
}

/// A kind of budget: one period for both passes together, or one for each pass, the
/// backward's `num / den` of the forward's, or the forward pass's fixed (at what a
/// one-lane kernel takes: no layer need be faster) and the backward's the period.
#[derive(Debug, Clone, Copy)]
enum Pace {
    Together,
    Passes(u64, u64),
    Back(u64),
}

impl Pace {
    /// The budget of period `t`.
    fn at(self, t: u64) -> Budget {
        match self {
            Pace::Together => Budget {
                total: t,
                pass: [u64::MAX; 2],
            },
            Pace::Passes(num, den) => Budget {
                total: u64::MAX,
                pass: [t, t.saturating_mul(num) / den],
            },
            Pace::Back(forward) => Budget {
                total: u64::MAX,
                pass: [forward, t],
            },
        }
    }
}

/// A layer's first PE as measured: cycles per sample, and whether its memory fits.
type Measured = (Cost, bool);

/// A vector kernel on lanes, replicas, and rows it gathers: (kernel, lanes, reps, fan).
type VectorSizing = (usize, u32, u32, u32);

/// A kernel on `w x h` lanes: (kernel, w, h).
type KernelLanes = (usize, u32, u32);

impl<'a> Sizer<'a> {
    /// The sizer of `f`; an error when a layer has no kernel (its update, or no output).
    fn new(
        g: &'a Graph,
        f: &'a Formed,
        fab: &'a Fabric,
        widths: Widths,
    ) -> Result<Sizer<'a>, LayoutError> {
        let nk = f.kernels.len();
        let dims: Vec<_> = f
            .kernels
            .iter()
            .map(|k| dense_dims(g, f, &k.kind))
            .collect();
        let unscheduled = (f.batch, 0);
        let width: Vec<Option<u32>> = (0..nk)
            .map(|k| {
                if dims[k].is_some() {
                    None
                } else {
                    vector_of(g, f, k, unscheduled, |_| 0).width()
                }
            })
            .collect();
        let replicable: Vec<bool> = (0..nk)
            .map(|k| dims[k].is_none() && vector_of(g, f, k, unscheduled, |_| 0).replicable())
            .collect();
        // the windows with as many replicas as a loss may have: the most memory
        let sched = schedule(f, widths, |k| if replicable[k] { MAX_REPS } else { 1 });
        let dense = (0..nk)
            .map(|k| match f.kernels[k].kind {
                Kind::Dense { .. } => dense_kernel(g, f, k, dims[k], sched[k]).map(Some),
                Kind::Vector { .. } => Ok(None),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let fanned = (0..nk)
            .map(|k| {
                let plain = |l: usize| {
                    dims[l].is_some_and(|d| matches!(d.shape, Shape::Matmul | Shape::Planar { .. }))
                };
                k.checked_sub(1)
                    .filter(|&l| replicable[k] && plain(l))
                    .and_then(|l| fanned(f, l, k))
            })
            .collect();
        let single_next = (0..nk)
            .map(|k| k + 1 < nk && dims[k + 1].is_none() && width[k + 1].is_none())
            .collect();
        let words = fab.usable_bytes() / super::cost::WORD;
        let floor = (0..nk)
            .map(|k| match (dims[k], width.get(k + 1).copied().flatten()) {
                (Some(_), Some(wd)) => (1..=wd)
                    .filter(|&l| super::kernels::used(wd, l) == l)
                    .find(|&l| {
                        vector_of(g, f, k + 1, sched[k + 1], |_| CHAIN_COLOURS)
                            .lane(l, 0)
                            .is_ok_and(|lane| lane.program.words() <= words)
                    })
                    .unwrap_or(wd),
                _ => 1,
            })
            .collect();
        Ok(Sizer {
            g,
            f,
            fab,
            dims,
            width,
            single_next,
            floor,
            dense,
            replicable,
            fanned,
            part_pes: Default::default(),
            periods: Default::default(),
            layers: Default::default(),
            widths,
            sched,
        })
    }

    /// Layer `k`'s cycles per sample on `w x h` lanes, stalls aside: a product's by
    /// formula, a convolution's from its first PE's program.
    fn layer_period(&self, k: usize, d: Dims, w: u32, h: u32) -> Cost {
        // (a row that carries more than the layer's outputs, a residual's features or
        // side parts' outputs, is zeroed first: measured from the program)
        let carries = self.f.carry(k).is_some() || parts_of(self.f, k).iter().any(|p| p.side);
        if matches!(d.shape, Shape::Matmul | Shape::Planar { .. }) && !carries {
            return dense_period(self.fab, d, w, h);
        }
        self.first_pe(k, d, w, h).0
    }

    /// Whether layer `k`'s first PE (the one with the largest share) fits its memory on
    /// `w x h` lanes.
    fn layer_fits(&self, k: usize, d: Dims, w: u32, h: u32) -> bool {
        self.first_pe(k, d, w, h).1
    }

    /// Layer `k`'s first PE on `w x h` lanes, from its program: its cycles per sample,
    /// and whether its memory fits (memoised).
    fn first_pe(&self, k: usize, d: Dims, w: u32, h: u32) -> Measured {
        *self
            .layers
            .borrow_mut()
            .entry((k, w, h))
            .or_insert_with(|| match &self.dense[k] {
                Some(layer) => self.measure(layer, d, w, h),
                None => (NEVER, false),
            })
    }

    /// `layer` (of dims `d`) on `w x h` lanes, from its first PE's program: its cycles
    /// per sample, and whether its memory fits.
    fn measure(&self, layer: &Dense, d: Dims, w: u32, h: u32) -> Measured {
        let (wc, hr) = layer.used(w, h);
        let c = dense::Colours::with_streams(4, 5, 6, 7);
        let ranges = (&split(d.k, wc, 0), &split(d.n, hr, 0));
        let mut scratch = Laid::default();
        let words = self.fab.usable_bytes() / super::cost::WORD;
        layer
            .program(
                0,
                0,
                (wc, hr),
                c,
                &mut scratch,
                (0, 0),
                ranges,
                layer.row(0, hr, None),
            )
            .map_or((NEVER, false), |p| {
                let t = super::cost::per_pass(self.fab, &p, self.f.batch, super::kernels::UPDATE);
                (t, p.words() <= words)
            })
    }

    /// A vector kernel's cycles per sample on `lanes` lanes (its first, widest lane's
    /// program), or on one lane as `reps` replicas (the slower of the dealer and a
    /// replica; the dealer gathering its input from `fan` rows of the layer before),
    /// stalls aside; `None` when it cannot run so.
    fn vector_period(&self, k: usize, lanes: u32, reps: u32, fan: u32) -> Option<Cost> {
        *self
            .periods
            .borrow_mut()
            .entry((k, lanes, reps, fan))
            .or_insert_with(|| {
                let v = vector_of(self.g, self.f, k, self.sched[k], |_| CHAIN_COLOURS);
                let cost = |p: &super::isa::Program| {
                    super::cost::per_pass(self.fab, p, self.f.batch, super::kernels::UPDATE)
                };
                if reps > 1 {
                    let c = CHAIN_COLOURS;
                    let to: Vec<(Colour, Colour)> =
                        (0..reps as u8).map(|r| (c, c + 1 + r)).collect();
                    let fan = if fan > 1 {
                        let (input, grad) = self.fanned[k]?;
                        let colours = (0..fan as u8).map(|l| (c + 2 * l, c + 2 * l + 1)).collect();
                        Some(Fan {
                            input,
                            grad,
                            colours,
                        })
                    } else {
                        None
                    };
                    let dealer = cost(&v.dealer(&to, fan.as_ref()).ok()?);
                    let rep = v
                        .replica(Rep {
                            of: reps,
                            to: c,
                            back: c + 1,
                        })
                        .ok()?;
                    let one = cost(&rep.program);
                    return Some([dealer[0].max(one[0]), dealer[1].max(one[1])]);
                }
                Some(cost(&v.lane(lanes, 0).ok()?.program))
            })
    }

    /// The replicas one-lane kernel `k` may run as, fewest first: 1 (when it need
    /// gather no rows), and when it can run as replicas (`Vector::replicable`), each
    /// count up to `MAX_REPS` that divides the batch, reaches the `fan` rows of the
    /// layer before whose outputs its dealer gathers (the replicas lie along them), and
    /// whose two colours each (to a replica and back) the dealer's router has beside
    /// the chains', the kernel's streams and two for each row past the first.
    fn reps(&self, k: usize, fan: u32) -> Vec<u32> {
        let mut out = if fan > 1 { vec![] } else { vec![1] };
        if self.replicable[k] {
            let streams = (self.f.streams.iter())
                .filter(|s| s.from == End::Kernel(k) || s.to.contains(&End::Kernel(k)))
                .filter(|s| !self.f.carried(s.node, k))
                .count() as u32;
            let room = (self.fab.program_colours())
                .saturating_sub(u32::from(CHAIN_COLOURS) + streams + 2 * (fan - 1))
                / 2;
            out.extend(
                (2.max(fan - 1)..=MAX_REPS.min(room)).filter(|&r| self.f.batch.is_multiple_of(r)),
            );
        }
        out
    }

    /// Each kernel's estimated cycles per sample on a sizing.
    fn periods(&self, lanes: &Lanes) -> Vec<Cost> {
        (0..self.f.kernels.len())
            .map(|k| match self.dims[k] {
                Some(d) => {
                    let h = lanes.out[k];
                    let parts = (lanes.more[k].iter().enumerate())
                        .map(|(p, &l)| self.part_pe(k, p, l, h).0);
                    parts.fold(self.layer_period(k, d, lanes.inp[k], h), |a, b| {
                        [a[0].max(b[0]), a[1].max(b[1])]
                    })
                }
                None => self
                    .vector_period(k, lanes.out[k], lanes.reps[k], fan_of(self.f, lanes, k))
                    .unwrap_or(NEVER),
            })
            .collect()
    }

    /// Layer `k`'s further parts, each with its dimensions.
    fn parts(&self, k: usize) -> impl Iterator<Item = (&Dense, Dims)> + '_ {
        let dims = |p: &Dense| Dims {
            k: p.k,
            n: p.n,
            train: p.train,
            dx: false,
            shape: p.shape,
        };
        (self.dense[k].iter().flat_map(|d| &d.more)).map(move |p| (p, dims(p)))
    }

    /// The fewest lanes each further part of layer `k` needs on `h` rows to reach
    /// budget `t` with its memory fitting (`None` when one cannot on the fabric).
    fn part_lanes(&self, k: usize, h: u32, t: Budget) -> Option<Vec<u32>> {
        let used = super::kernels::used;
        let most = self.fab.width.max(self.fab.height);
        (self.parts(k).enumerate())
            .map(|(p, (_, pd))| {
                (1..=pd.k.min(most))
                    .filter(|&l| used(pd.k, l) == l)
                    .find(|&l| {
                        let (period, fits) = self.part_pe(k, p, l, h);
                        t.admits(period) && fits
                    })
            })
            .collect()
    }

    /// Further part `p` of layer `k` on `l x h` lanes, from its first PE's program (a
    /// product's period by formula, as `layer_period`): its cycles per sample, and
    /// whether its memory fits (memoised).
    fn part_pe(&self, k: usize, p: usize, l: u32, h: u32) -> Measured {
        *self
            .part_pes
            .borrow_mut()
            .entry((k, p, l, h))
            .or_insert_with(|| {
                let Some((part, d)) = self.parts(k).nth(p) else {
                    return (NEVER, false);
                };
                let (t, fits) = self.measure(part, d, l, h);
                match d.shape {
                    Shape::Matmul => (dense_period(self.fab, d, l, h), fits),
                    _ => (t, fits),
                }
            })
    }

    /// The estimated cycles of a step of a sizing: in each pass its samples one period
    /// apart (the pass's slowest kernel's cycles per sample), plus the pipeline's
    /// filling and draining (about one sample's time through every kernel).
    fn step(&self, lanes: &Lanes) -> u64 {
        let each = self.periods(lanes);
        let slowest = (each.iter()).map(|c| c[0] + c[1]).max().unwrap_or(0);
        let through: u64 = each.iter().map(|c| c[0] + c[1]).sum();
        u64::from(self.f.batch.saturating_sub(1)) * slowest + through
    }

    /// The lanes of vector kernel `k` after a kernel with `prev` output lanes (or, first
    /// in the chain, `first` when it can run on several); `None` when its width does not
    /// split over them.
    fn vector_lanes(&self, k: usize, prev: Option<u32>, first: u32) -> Option<u32> {
        match (self.width[k], prev) {
            (None, _) => Some(1),
            (Some(_), None) => Some(first),
            (Some(w), Some(l)) => (super::kernels::used(w, l) == l).then_some(l),
        }
    }

    /// Whether layer `k` takes one row: before a one-lane kernel, or an embedding of
    /// several ids a sample (whose rows would each send a part of every id's row).
    fn one_row(&self, k: usize) -> bool {
        self.single_next[k]
            || self.dims[k].is_some_and(|d| matches!(d.shape, Shape::Gather { t } if t > 1))
    }

    /// The output lanes a dense layer may take: 1 before a one-lane kernel, or up to
    /// one more than its most replicas when its dealer gathers them (`fanned`); else
    /// at least its floor.
    fn rows(&self, k: usize, n: u32) -> Vec<u32> {
        if self.fanned.get(k + 1).is_some_and(Option::is_some) {
            (1..=n.min(1 + MAX_REPS)).collect()
        } else if self.one_row(k) {
            vec![1]
        } else {
            (self.floor[k]..=n.min(self.fab.height.max(self.fab.width))).collect()
        }
    }

    /// Each kernel sized to budget `t`: every layer gets the fewest lanes whose cost `t`
    /// admits and that leave the next layer able to meet `t`, and the staircase fits the
    /// fabric; `None` when some kernel cannot meet `t` on the lanes its neighbours leave
    /// it, or no staircase fits. The first layer's rows are
    /// the next layer's columns, so its shape decides the chain's: of its few smallest
    /// shapes, the one whose chain takes the fewest PEs for about the shortest
    /// estimated step (`thrifty`).
    fn for_period(&self, t: Budget) -> Option<Lanes> {
        const SHAPES: usize = 8;
        let mut shapes = Vec::new();
        let first = self.chain(t, None, &mut shapes);
        let others = shapes.into_iter().skip(1).take(SHAPES - 1);
        let chains = others.filter_map(|s| self.chain(t, Some(s), &mut Vec::new()));
        let fits = |l: &Lanes| {
            let (w, h) = extents(self.f, l);
            w <= self.fab.width && h <= self.fab.height
        };
        let mut all: Vec<Lanes> = first.into_iter().chain(chains).filter(fits).collect();
        let keys: Vec<(u64, usize)> = (all.iter())
            .map(|l| (self.step(l), self.area(l) as usize))
            .collect();
        thrifty(keys.into_iter()).map(|i| all.swap_remove(i))
    }

    /// `lanes` with the first layer given the fewest columns that keep the estimated step
    /// within half of `STEP_SLACK` (its columns are its own: no other kernel's size
    /// depends on them). A budget sizes every kernel to the pass it bounds; a layer
    /// faster than a pass's slowest kernel gains nothing from its extra PEs.
    fn trim(&self, mut lanes: Lanes) -> Lanes {
        let Some(d) = self.dims.first().copied().flatten() else {
            return lanes;
        };
        let step = self.step(&lanes);
        let limit = step + step * STEP_SLACK / 2000;
        let h = lanes.out[0];
        let used = super::kernels::used;
        let fewest = (1..lanes.inp[0])
            .filter(|&w| used(d.k, w) == w && self.layer_fits(0, d, w, h))
            .find(|&w| {
                let mut l = lanes.clone();
                l.inp[0] = w;
                self.step(&l) <= limit
            });
        if let Some(w) = fewest {
            lanes.inp[0] = w;
        }
        lanes
    }

    /// The PEs a sizing's kernels take.
    fn area(&self, lanes: &Lanes) -> u32 {
        (0..self.f.kernels.len())
            .map(|k| match self.dims[k] {
                Some(_) => {
                    let more: u32 = lanes.more[k].iter().sum();
                    (lanes.inp[k] + more) * lanes.out[k]
                }
                None => lanes.strip(k),
            })
            .sum()
    }

    /// `for_period` with the first layer's shape `first`, or (none given) its
    /// smallest (the fewest PEs, then the fewest rows), its shapes that meet `t` put in
    /// `shapes` smallest first.
    fn chain(
        &self,
        t: Budget,
        first: Option<(u32, u32)>,
        shapes: &mut Vec<(u32, u32)>,
    ) -> Option<Lanes> {
        let (fab, nk) = (self.fab, self.f.kernels.len());
        let used = super::kernels::used;
        let mut lanes = Lanes::new(nk);
        for k in 0..nk {
            let prev = k.checked_sub(1).map(|p| lanes.out[p]);
            let Some(d) = self.dims[k] else {
                let l = self.vector_lanes(k, prev, 1)?;
                // (a one-lane kernel's dealer may gather the rows of the layer before)
                let fan = match prev {
                    Some(p) if p != l && l == 1 && self.fanned[k].is_some() => p,
                    Some(p) if p != l => return None,
                    _ => 1,
                };
                // (a one-lane kernel as the fewest replicas that meet `t`)
                let reps = if l == 1 { self.reps(k, fan) } else { vec![1] };
                let r = reps.into_iter().find(|&r| {
                    self.vector_period(k, l, r, fan)
                        .is_some_and(|c| t.admits(c))
                })?;
                lanes.inp[k] = l;
                lanes.out[k] = l;
                lanes.reps[k] = r;
                continue;
            };
            let (kk, nn) = (d.k, d.n);
            let hs = self.rows(k, nn);
            // the next layer (past a strip) takes these rows as its columns: it must
            // still reach `t` on them
            let next = (k + 1..nk).find_map(|j| self.dims[j].map(|d| (j, d)));
            let reachable = |h: u32| match next {
                Some((j, d2)) => {
                    used(d2.k, h) == h
                        && self.rows(j, d2.n).iter().any(|&h2| {
                            let h2 = used(d2.n, h2);
                            t.admits(self.layer_period(j, d2, h, h2))
                                && self.layer_fits(j, d2, h, h2)
                        })
                }
                None => true,
            };
            let ok = |w: u32, h: u32| {
                t.admits(self.layer_period(k, d, w, h))
                    && self.layer_fits(k, d, w, h)
                    && reachable(h)
                    && self.part_lanes(k, h, t).is_some()
            };
            let (w, h) = match (prev, first) {
                (None, Some(shape)) => shape,
                (None, None) => {
                    for w in 1..=kk.min(fab.width.max(fab.height)) {
                        let w = used(kk, w);
                        if let Some(&h) = hs.iter().find(|&&h| ok(w, used(nn, h))) {
                            shapes.push((w, used(nn, h)));
                        }
                    }
                    shapes.sort_by_key(|&(w, h)| (w * h, h));
                    shapes.dedup();
                    *shapes.first()?
                }
                (Some(w), _) => {
                    if used(kk, w) != w {
                        return None;
                    }
                    let h = *hs.iter().find(|&&h| ok(w, used(nn, h)))?;
                    (w, used(nn, h))
                }
            };
            lanes.inp[k] = w;
            lanes.out[k] = h;
            lanes.more[k] = self.part_lanes(k, h, t)?;
        }
        Some(lanes)
    }

    /// The sizings of the tightest budgets whose staircases fit the fabric: a common
    /// period for both passes together, and periods for each pass at several ratios
    /// of the backward pass's to the forward's (a step's passes go one after the
    /// other, each at its slowest kernel's pace: a kernel whose work is all in one
    /// pass, as a loss, leaves the layers room in the other). Each pace's budgets are
    /// tried from the least that admits every one-lane kernel up in steps of 2% (the
    /// greedy sizing is not monotone in the budget, so no bisection).
    fn balanced(&self) -> Vec<Lanes> {
        // (each at its fastest: on its most replicas)
        let fastest = |k: usize| {
            (self.reps(k, 1).into_iter())
                .filter_map(|r| self.vector_period(k, 1, r, 1))
                .min_by_key(|c| c[0] + c[1])
        };
        let ones = (0..self.f.kernels.len())
            .filter(|&k| self.dims[k].is_none() && self.width[k].is_none());
        let single: Vec<Cost> = ones.clone().filter_map(fastest).collect();
        let on_one: Vec<Cost> = ones
            .filter_map(|k| self.vector_period(k, 1, 1, 1))
            .collect();
        // the smallest period at which a pace admits every one-lane kernel
        let least = |pace: Pace| {
            let ok = |t: u64| single.iter().all(|&c| pace.at(t).admits(c));
            let (mut lo, mut hi) = (0u64, 1u64 << 24);
            while lo + 1 < hi {
                let mid = (lo + hi) / 2;
                if ok(mid) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            hi
        };
        // the forward pass fixed at the one-lane kernels' pace, at their fastest and
        // on one PE each
        let forward = |s: &[Cost]| s.iter().map(|c| c[0]).max().filter(|&f| f > 0);
        let mut fixed: Vec<u64> = [forward(&single), forward(&on_one)]
            .into_iter()
            .flatten()
            .collect();
        fixed.dedup();
        let paces = [Pace::Together]
            .into_iter()
            .chain([(1, 2), (3, 4), (1, 1), (4, 3), (2, 1)].map(|(n, d)| Pace::Passes(n, d)))
            .chain(fixed.into_iter().map(Pace::Back));
        let mut found: Vec<Lanes> = Vec::new();
        for pace in paces {
            let mut t = least(pace);
            while t < 1 << 24 {
                if let Some(l) = self.for_period(pace.at(t)) {
                    let l = self.trim(l);
                    if !found.contains(&l) {
                        found.push(l);
                    }
                    break;
                }
                t += (t / 50).max(1);
            }
        }
        found
    }

    /// One block size `s` for every layer.
    fn block(&self, s: u32) -> Result<Lanes, LayoutError> {
        let (g, f, nk) = (self.g, self.f, self.f.kernels.len());
        let used = super::kernels::used;
        let mut lanes = Lanes::new(nk);
        for k in 0..nk {
            let prev = k.checked_sub(1).map(|p| lanes.out[p]);
            match self.dims[k] {
                Some(Dims { k: kk, n: nn, .. }) => {
                    lanes.inp[k] = prev.unwrap_or_else(|| used(kk, kk.div_ceil(s)));
                    lanes.out[k] = if self.one_row(k) {
                        1
                    } else {
                        // as many as the block size gives, or the floor, split evenly
                        let l = used(nn, nn.div_ceil(s)).max(self.floor[k]);
                        (l..=nn).find(|&l| used(nn, l) == l).unwrap_or(nn)
                    };
                    lanes.more[k] = (self.parts(k))
                        .map(|(_, pd)| used(pd.k, pd.k.div_ceil(s)))
                        .collect();
                    if used(kk, lanes.inp[k]) != lanes.inp[k] {
                        return Err(LayoutError::DoesNotFit(format!(
                            "layer {} cannot split its {kk} inputs over {} lanes",
                            kernel_name(g, f, k),
                            lanes.inp[k]
                        )));
                    }
                }
                None => {
                    let first = self.width[k].map_or(1, |w| w.div_ceil(s));
                    let l = self
                        .vector_lanes(k, prev, first)
                        .filter(|&l| prev.is_none_or(|p| p == l));
                    let Some(l) = l else {
                        return Err(LayoutError::DoesNotFit(format!(
                            "{} cannot take the {} lanes of the kernel before it",
                            kernel_name(g, f, k),
                            prev.unwrap_or_default()
                        )));
                    };
                    lanes.inp[k] = l;
                    lanes.out[k] = l;
                }
            }
        }
        Ok(lanes)
    }
}

/// Dense kernel `k` (of dims `dims`) with its variables, gradient, host values and
/// update: all but its lanes.
fn dense_kernel(
    g: &Graph,
    f: &Formed,
    k: usize,
    dims: Option<Dims>,
    (window, fifo): (u32, u32),
) -> Result<Dense, LayoutError> {
    let kr = &f.kernels[k];
    let Kind::Dense {
        w,
        fwd,
        dw,
        dy,
        ref more,
        ..
    } = kr.kind
    else {
        return Err(LayoutError::DoesNotFit(format!(
            "kernel {k} is not a layer"
        )));
    };
    let names = |vars: &[NodeIndex]| -> Vec<String> {
        vars.iter()
            .map(|&v| match &g.node(v).op {
                Op::Variable { name, .. } => name.clone(),
                _ => form::key(v),
            })
            .collect()
    };
    // how a carried value's gradient (a residual's, a side part's) comes back: not at
    // all, as the layer's output gradient itself, or beside it
    let back = |grad: Option<NodeIndex>| match grad {
        None => dense::Back::Not,
        Some(g) if dy.is_some_and(|d| f.resolve(d) == f.resolve(g)) => dense::Back::Same,
        Some(_) => dense::Back::Beside,
    };
    // each part's share of the update: its own weight, slots and gradient
    let shares: Vec<_> = (0..=more.len())
        .map(|p| form::part_update(g, f, k, p))
        .collect();
    let update = |p: usize, w: NodeIndex, dw: Option<NodeIndex>| -> Result<_, LayoutError> {
        let (vars, steps, commits) = &shares[p];
        let u = match dw {
            Some(dw) => form::update_over(
                g,
                f,
                (steps, commits),
                (vars, &[dw], &kr.hosts),
                &g.ty(w).shape,
            )?,
            None => Update::default(),
        };
        Ok((names(vars), u))
    };
    // the parts' updates partition the layer's: each step node and commit in one
    if !more.is_empty() {
        // each in exactly one: as many in all as in the layer, and all different
        let once = |all: Vec<NodeIndex>, want: usize| {
            let n = all.len();
            n == want && all.into_iter().collect::<BTreeSet<_>>().len() == n
        };
        let steps = shares.iter().flat_map(|s| s.1.iter().copied()).collect();
        let commits = shares
            .iter()
            .flat_map(|s| s.2.iter().map(|c| c.1))
            .collect();
        if !once(steps, kr.steps.len()) || !once(commits, kr.commits.len()) {
            return Err(unsupported(
                g,
                fwd,
                "a layer of several products whose updates share a value has no wafer kernel yet"
                    .into(),
                "update each product's weight from its own gradient and slots",
            ));
        }
    }
    let (vars, update_main) = update(0, w, dw)?;
    let mut parts = Vec::new();
    for (p, part) in more.iter().enumerate() {
        let (vars, u) = update(p + 1, part.w, part.dw)?;
        let ws = &g.ty(part.w).shape;
        let shape = match g.node(part.mm).op {
            Op::Gather => Shape::Gather {
                t: (g.ty(part.x).elements() / f.batch.max(1) as usize) as u32,
            },
            _ => Shape::Matmul,
        };
        parts.push(Dense {
            k: ws[0] as u32,
            n: ws[1] as u32,
            shape,
            batch: f.batch,
            window,
            fifo,
            train: part.dw.is_some(),
            dx: false,
            vars,
            grad: part.dw.map(form::key).unwrap_or_default(),
            hosts: kr.hosts.iter().map(|&h| form::key(h)).collect(),
            update: u,
            more: Vec::new(),
            carry: None,
            side: part.side.then(|| back(part.dy)),
        });
    }
    let update = update_main;
    let Some(d) = dims else {
        return Err(unsupported(
            g,
            fwd,
            "a layer without an output".into(),
            "give the convolution an output of at least one pixel",
        ));
    };
    Ok(Dense {
        k: d.k,
        n: d.n,
        shape: d.shape,
        batch: f.batch,
        window,
        fifo,
        train: d.train,
        dx: d.dx,
        vars,
        grad: dw.map(form::key).unwrap_or_default(),
        hosts: kr.hosts.iter().map(|&h| form::key(h)).collect(),
        update,
        more: parts,
        carry: f.carry(k).map(|c| back(c.grad.map(|g| g.1))),
        side: None,
    })
}

/// A host input's leg to one kernel that reads it: its colour, and the routers of its
/// path down to the kernel.
type Leg = (Colour, Vec<(u32, u32)>);

/// The kernels a stream from the host is sent to, a leg each (none for another stream).
fn host_legs(st: &form::Stream) -> impl Iterator<Item = usize> + '_ {
    st.to.iter().filter_map(|t| match (st.from, t) {
        (End::Host, End::Kernel(b)) => Some(*b),
        _ => None,
    })
}

/// Layer `k`'s further parts (none for another kernel).
fn parts_of(f: &Formed, k: usize) -> &[form::Part] {
    match &f.kernels[k].kind {
        Kind::Dense { more, .. } => more,
        Kind::Vector { .. } => &[],
    }
}

/// The further part of layer `b` that reads host stream `node`, if one does, and its
/// columns (after the layer's own columns and the parts' before it).
fn part_columns<'f>(
    f: &'f Formed,
    lanes: &Lanes,
    b: usize,
    node: NodeIndex,
) -> Option<(&'f form::Part, std::ops::Range<u32>)> {
    let parts = parts_of(f, b);
    let p = parts.iter().position(|p| f.resolve(p.x) == node)?;
    let first = lanes.inp[b] + lanes.more[b][..p].iter().sum::<u32>();
    Some((&parts[p], first..first + lanes.more[b][p]))
}

/// The way into column `col` of kernel `p` from the fabric's edge on its inputs'
/// side: the router a host lane enters at and the port it enters by, and the routers
/// before the kernel (each passing it on straight).
fn edge_path(p: &Placed, col: u32) -> ((u32, u32), Dir, Vec<(u32, u32)>) {
    let at = p.orient.at((p.x, p.y), col, 0);
    let dir = p.orient.dir(Dir::N);
    if dir == Dir::N {
        ((at.0, 0), dir, (0..at.1).map(|y| (at.0, y)).collect())
    } else {
        ((0, at.1), dir, (0..at.0).map(|x| (x, at.1)).collect())
    }
}

/// The staircase of a sizing (`s`, the block size it came from, or 0).
fn try_lanes(sizer: &Sizer, lanes: &Lanes, s: u32) -> Result<Layout, LayoutError> {
    let (g, f, fab, dims) = (sizer.g, sizer.f, sizer.fab, &sizer.dims);
    let nk = f.kernels.len();
    let lanes_in = &lanes.inp;
    let lanes_out = &lanes.out;
    // the staircase
    let mut placed = Vec::new();
    let mut off = None;
    let (mut sw, mut sh) = (0, 0);
    for (k, (at, (fw, fh), orient)) in staircase(f, lanes).into_iter().enumerate() {
        if off.is_none() && (at.0 + fw > fab.width || at.1 + fh > fab.height) {
            off = Some(k);
        }
        sw = sw.max(at.0 + fw);
        sh = sh.max(at.1 + fh);
        placed.push(Placed {
            name: kernel_name(g, f, k),
            x: at.0,
            y: at.1,
            w: fw,
            h: fh,
            orient,
        });
    }
    if let Some(k) = off {
        return Err(LayoutError::Pes(PesShort {
            kernel: placed[k].name.clone(),
            span: kernel_span(g, f, k),
            floor: false,
            block: s,
            extent: (sw, sh),
            pes: placed.iter().map(|p| u64::from(p.w * p.h)).sum(),
        }));
    }
    // the routers each stream uses, for its colour
    let pes_of = |k: usize| -> Vec<(u32, u32)> {
        let p = &placed[k];
        (p.x..p.x + p.w)
            .flat_map(|x| (p.y..p.y + p.h).map(move |y| (x, y)))
            .collect()
    };
    let program_colours = fab.program_colours() as Colour;
    let mut colours = Palette {
        used: BTreeMap::new(),
        need: CHAIN_COLOURS.min(program_colours),
        have: program_colours,
        short: None,
    };
    for k in 0..nk {
        if matches!(f.kernels[k].kind, Kind::Dense { .. }) {
            for (x, y) in pes_of(k) {
                *colours.used.entry((x, y)).or_default() |= (1u64 << CHAIN_COLOURS) - 1;
            }
        }
    }
    let mut colour_of: BTreeMap<NodeIndex, Colour> = BTreeMap::new();
    let mut paths: BTreeMap<NodeIndex, Vec<(u32, u32)>> = BTreeMap::new();
    // the host's inputs come down a column from the north edge to their kernel (the
    // first kernel's come straight in); an input several kernels read is sent to each
    // (a leg each, with its own colour and path)
    let mut legs: BTreeMap<(NodeIndex, usize), Leg> = BTreeMap::new();
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    for (st, leg) in f.streams.iter().flat_map(|st| {
        let legs: Vec<Option<usize>> = match st.from {
            End::Host => host_legs(st).map(Some).collect(),
            End::Kernel(_) => vec![None],
        };
        legs.into_iter().map(move |l| (st, l))
    }) {
        // (a stream carried to a kernel goes there on its carrier's colour; one
        // carried to every kernel it reaches has no colour of its own)
        let direct = |b: usize| !f.carried(st.node, b);
        if st
            .to
            .iter()
            .all(|t| matches!(t, End::Kernel(b) if !direct(*b)))
        {
            continue;
        }
        let mut routers: BTreeSet<(u32, u32)> = BTreeSet::new();
        if let End::Kernel(a) = st.from {
            routers.extend(pes_of(a));
            if let Some(strip) = passes_over(f, st) {
                routers.extend(pes_of(strip));
            }
        }
        for t in &st.to {
            if let End::Kernel(b) = t {
                if leg.is_none_or(|l| l == *b) && direct(*b) {
                    routers.extend(pes_of(*b));
                }
            }
        }
        // paths to and from the host
        let mut path = Vec::new();
        if let Some((b, (_, cols))) =
            leg.and_then(|b| part_columns(f, lanes, b, st.node).map(|c| (b, c)))
        {
            // a further part's input: straight in from the fabric's edge to each
            // of its columns
            let p = &placed[b];
            for col in cols {
                path.extend(edge_path(p, col).2);
            }
        } else if let Some(b) = leg {
            let p = &placed[b];
            if !(b == 0 && matches!(f.kernels[b].kind, Kind::Dense { .. })) {
                if matches!(f.kernels[b].kind, Kind::Dense { .. }) {
                    return Err(unsupported(
                        g,
                        st.node,
                        "an input into a layer past the first has no wafer layout yet".into(),
                        "the wafer lays out chains of layers so far",
                    ));
                }
                // down the column to the strip's first lane (then along the strip)
                path = (0..p.y).map(|y| (p.x, y)).collect();
            }
        }
        if leg.is_none() && st.to.contains(&End::Host) {
            let End::Kernel(a) = st.from else { continue };
            let p = &placed[a];
            if p.w * p.h != 1 {
                return Err(unsupported(
                    g,
                    st.node,
                    "a per-sample output from a kernel of several lanes has no wafer layout yet"
                        .into(),
                    "the wafer lays out chains of layers so far",
                ));
            }
            path.extend((p.x + 1..fab.width).map(|x| (x, p.y)));
        }
        routers.extend(path.iter().copied());
        let routers: Vec<(u32, u32)> = routers.into_iter().collect();
        let c = colours.take(&routers, || stream_name(g, st.node))?;
        match leg {
            Some(b) => {
                legs.insert((st.node, b), (c, path));
            }
            None => {
                colour_of.insert(st.node, c);
                paths.insert(st.node, path);
            }
        }
    }
    // a one-lane kernel's replicas: a colour from the dealer to each, and one back,
    // free on the lanes between
    let mut rep_colours: BTreeMap<usize, Vec<(Colour, Colour)>> = BTreeMap::new();
    let mut fans: BTreeMap<usize, Vec<(Colour, Colour)>> = BTreeMap::new();
    for (k, p) in placed.iter().enumerate() {
        if lanes.reps[k] < 2 {
            continue;
        }
        let mut cs = Vec::new();
        for j in 0..lanes.reps[k] {
            let routers: Vec<(u32, u32)> =
                (0..=j + 1).map(|l| p.orient.at((p.x, p.y), 0, l)).collect();
            let mut take = || {
                colours.take(&routers, || {
                    format!("the samples dealt to {}'s replicas", p.name)
                })
            };
            cs.push((take()?, take()?));
        }
        rep_colours.insert(k, cs);
        // the rows of the layer before whose outputs the dealer gathers: from each
        // row's east end up the strip to the dealer, and its share of their gradient
        // back down and west along the row, a colour each beside the first row's
        let fan = fan_of(f, lanes, k);
        let Some((_, grad)) = sizer.fanned[k].filter(|_| fan > 1) else {
            continue;
        };
        let l = &placed[k - 1];
        let cols = lanes.columns(k - 1);
        let mut fc = Vec::new();
        for j in 1..fan {
            let strip = (0..=j).map(|m| p.orient.at((p.x, p.y), 0, m));
            let mut routers: Vec<(u32, u32)> = strip.clone().collect();
            routers.push(l.orient.at((l.x, l.y), cols - 1, j));
            let name = || format!("the outputs {} gathers", p.name);
            let y = colours.take(&routers, name)?;
            let dy = match grad {
                Some(_) => {
                    let mut routers: Vec<(u32, u32)> = strip.collect();
                    routers.extend((0..cols).map(|i| l.orient.at((l.x, l.y), i, j)));
                    colours.take(&routers, || format!("the gradients {} sends back", p.name))?
                }
                None => 0,
            };
            fc.push((y, dy));
        }
        fans.insert(k, fc);
    }
    if let Some(stream) = colours.short {
        return Err(LayoutError::Colours(ColoursShort {
            stream,
            need: u32::from(colours.need),
            have: u32::from(program_colours),
        }));
    }
    // a stream's colour into kernel `k` (a host input's leg to it, or the stream's)
    let colour_in = |n: NodeIndex, k: usize| -> Option<Colour> {
        (legs.get(&(n, k)).map(|l| l.0)).or_else(|| colour_of.get(&n).copied())
    };
    let colour = |n: Option<NodeIndex>, k: usize| -> Colour {
        n.and_then(|n| colour_in(f.resolve(n), k)).unwrap_or(0)
    };
    // lay out every kernel, with the windows of its replicas
    let sched = schedule(f, sizer.widths, |k| lanes.reps[k]);
    let mut all = Laid::default();
    for k in 0..nk {
        let p = &placed[k];
        let kr = &f.kernels[k];
        let laid = match (&kr.kind, &sizer.dense[k]) {
            (
                Kind::Dense {
                    x, fwd, dy, bwd, ..
                },
                Some(d),
            ) => {
                let c = dense::Colours::with_streams(
                    colour(Some(*x), k),
                    colour(Some(*fwd), k),
                    colour(*dy, k),
                    colour(*bwd, k),
                );
                let more: Vec<(u32, Colour)> = (lanes.more[k].iter())
                    .zip(parts_of(f, k))
                    .map(|(&l, part)| (l, colour(Some(part.x), k)))
                    .collect();
                let fan = fans.get(&(k + 1)).map_or(&[][..], Vec::as_slice);
                d.scheduled(sched[k])
                    .lay_parts(
                        (p.x, p.y),
                        p.orient,
                        (lanes_in[k], lanes_out[k]),
                        &more,
                        c,
                        fan,
                    )
                    .map_err(|e| {
                        unsupported(g, *fwd, e, "this layer's update has no wafer kernel")
                    })?
            }
            (Kind::Dense { fwd, .. }, None) => {
                return Err(unsupported(
                    g,
                    *fwd,
                    "a layer the sizer did not make".into(),
                    "this is a bug in estc's wafer compiler",
                ))
            }
            (Kind::Vector { nodes }, _) => {
                let v = vector_of(g, f, k, sched[k], |n| colour_in(n, k).unwrap_or(0));
                let reps = rep_colours.get(&k);
                let lanes = lanes_out[k];
                let mut laid = Laid::default();
                let no_kernel = |e: String| {
                    unsupported(g, nodes[0], e, "write it with the ops the wafer's vector kernels run: elementwise ops, reductions over a sample's last axes, softmax, argmax, one-hot")
                };
                // its lanes, or its replicas in the lanes after the dealer's
                let mut programs = Vec::new();
                match reps {
                    None => {
                        for l in 0..lanes {
                            programs.push((l, v.lane(lanes, l).map_err(no_kernel)?));
                        }
                    }
                    Some(cs) => {
                        let of = cs.len() as u32;
                        for (j, &(to, back)) in (1..).zip(cs) {
                            let rep = Rep { of, to, back };
                            programs.push((j, v.replica(rep).map_err(no_kernel)?));
                        }
                    }
                }
                for (l, lane) in programs {
                    let at = p.orient.at((p.x, p.y), 0, l);
                    for (name, mut piece) in lane.tensors {
                        piece.pe = at;
                        laid.tensors.entry(name).or_default().push(piece);
                    }
                    laid.pes.insert(at, (Arc::new(lane.program), lane.memory));
                }
                if let Some(cs) = reps {
                    let o = p.orient;
                    let at = |l: u32| o.at((p.x, p.y), 0, l);
                    // (gathering the rows of the layer before, the first on the ports'
                    // colours)
                    let fan = match (fans.get(&k), sizer.fanned[k]) {
                        (Some(more), Some((input, grad))) => {
                            let port = |n: NodeIndex| colour_in(n, k).unwrap_or(0);
                            let first = (
                                port(input),
                                grad.map_or(0, |g| colour_of.get(&g).copied().unwrap_or(0)),
                            );
                            Some(Fan {
                                input,
                                grad,
                                colours: std::iter::once(first)
                                    .chain(more.iter().copied())
                                    .collect(),
                            })
                        }
                        _ => None,
                    };
                    let dealer = v.dealer(cs, fan.as_ref()).map_err(no_kernel)?;
                    let words = dealer.words() as usize;
                    laid.pes.insert(at(0), (Arc::new(dealer), vec![0.0; words]));
                    // colour `c` along the strip between the dealer (lane 0) and lane
                    // `j`, entering at one end from `rx` and leaving at the other to `tx`:
                    // down from the dealer, or up to it
                    let along =
                        |laid: &mut Laid, c: Colour, j: u32, down: bool, rx: Dir, tx: Dir| {
                            let (first, last, on) = if down {
                                (0, j, [Dir::N, Dir::S])
                            } else {
                                (j, 0, [Dir::S, Dir::N])
                            };
                            let mut hop = |l: u32, rx: Dir, tx: Dir| {
                                laid.route(at(l), c, o.route(rx, &[tx]))
                                    .map_err(LayoutError::DoesNotFit)
                            };
                            hop(first, rx, on[1])?;
                            for m in 1..j {
                                hop(m, on[0], on[1])?;
                            }
                            hop(last, on[0], tx)
                        };
                    // each row past the first up the strip from its east end, and its
                    // share of the gradient back down and west along it
                    for (j, &(y, dy)) in (1..).zip(fan.iter().flat_map(|f| &f.colours[1..])) {
                        along(&mut laid, y, j, false, Dir::W, Dir::Ramp)?;
                        if fan.as_ref().is_some_and(|f| f.grad.is_some()) {
                            along(&mut laid, dy, j, true, Dir::Ramp, Dir::W)?;
                        }
                    }
                    // each replica's samples down the strip, and back
                    for (j, &(to, back)) in (1..).zip(cs) {
                        along(&mut laid, to, j, true, Dir::Ramp, Dir::Ramp)?;
                        along(&mut laid, back, j, false, Dir::Ramp, Dir::Ramp)?;
                    }
                }
                for l in 0..lanes {
                    let at = p.orient.at((p.x, p.y), 0, l);
                    let o = p.orient;
                    for port in &v.inputs {
                        // forward inputs from the frame's west, backward ones from its east
                        let from = if port.bwd { Dir::E } else { Dir::W };
                        if st_from_host(f, port.node) || port.carried > 0 {
                            continue;
                        }
                        // a stream that goes on to the kernel beyond this strip (a
                        // layer's input gradient that the bias before it also sums)
                        // passes through
                        let beyond = if port.bwd {
                            k.checked_sub(1)
                        } else {
                            Some(k + 1)
                        };
                        let through = beyond.is_some_and(|b| {
                            !f.carried(port.node, b)
                                && f.streams
                                    .iter()
                                    .any(|s| s.node == port.node && s.to.contains(&End::Kernel(b)))
                        });
                        let to = if port.bwd { Dir::W } else { Dir::E };
                        let tx: &[Dir] = if through {
                            &[Dir::Ramp, to]
                        } else {
                            &[Dir::Ramp]
                        };
                        laid.route(at, port.colour, o.route(from, tx))
                            .map_err(LayoutError::DoesNotFit)?;
                    }
                    // a gradient that passes over the strip without it reading it
                    for st in &f.streams {
                        if passes_over(f, st) == Some(k) && !st.to.contains(&End::Kernel(k)) {
                            let c = colour_in(st.node, k).unwrap_or(0);
                            laid.route(at, c, o.route(Dir::E, &[Dir::W]))
                                .map_err(LayoutError::DoesNotFit)?;
                        }
                    }
                    for port in &v.outputs {
                        if port.carried > 0
                            || f.streams
                                .iter()
                                .any(|s| s.node == port.node && s.to.contains(&End::Host))
                        {
                            continue;
                        }
                        let to = if port.bwd { Dir::W } else { Dir::E };
                        laid.route(at, port.colour, o.route(Dir::Ramp, &[to]))
                            .map_err(LayoutError::DoesNotFit)?;
                    }
                }
                laid
            }
        };
        all.merge(laid).map_err(LayoutError::DoesNotFit)?;
    }
    // the host's streams: a leg to each kernel that reads an input, and the outputs
    for st in &f.streams {
        let per = (g.ty(st.node).elements() / f.batch.max(1) as usize) as u32;
        for b in host_legs(st) {
            let (c, path) = &legs[&(st.node, b)];
            let c = *c;
            let p = &placed[b];
            let mut host_lanes = Vec::new();
            let mut channels = 0;
            let mut ids = None;
            if let Some((part, cols)) = part_columns(f, lanes, b, st.node) {
                // a further part's columns, each from the fabric's edge (an
                // embedding's each take every id)
                let n = cols.len() as u32;
                let k = per;
                let table = Some(part).filter(|p| matches!(g.node(p.mm).op, Op::Gather));
                if let Some(p) = table {
                    ids = Some((p.mm.index() as u32, g.ty(p.w).shape[0] as u32));
                }
                for (i, col) in cols.enumerate() {
                    let (entry, dir, path) = edge_path(p, col);
                    for r in path {
                        all.route(r, c, Route::new(dir, &[dir.opposite()]))
                            .map_err(LayoutError::DoesNotFit)?;
                    }
                    let groups = match table {
                        Some(_) => 0..k,
                        None => split(k, n, i as u32),
                    };
                    host_lanes.push(HostLane {
                        x: entry.0,
                        y: entry.1,
                        dir,
                        colour: c,
                        elems: groups,
                    });
                }
            } else if let (0, Some(d)) = (b, dims[b]) {
                if let (Shape::Conv(_), Some((_, _, c))) = (d.shape, image(g, st.node)) {
                    channels = c;
                }
                for i in 0..lanes_in[b] {
                    let (x, y) = p.orient.at((p.x, p.y), i, 0);
                    let groups = split(d.k, lanes_in[b], i);
                    let per_in = d.shape.per_in();
                    // an embedding's columns each take every id
                    let elems = match d.shape {
                        Shape::Gather { t } => 0..t,
                        _ => groups.start * per_in..groups.end * per_in,
                    };
                    host_lanes.push(HostLane {
                        x,
                        y,
                        dir: p.orient.dir(Dir::N),
                        colour: c,
                        elems,
                    });
                }
                if let (Shape::Gather { .. }, Kind::Dense { fwd, .. }) =
                    (d.shape, &f.kernels[b].kind)
                {
                    ids = Some((fwd.index() as u32, d.k));
                }
            } else {
                // a vector kernel's images lie planar, as it computes them
                if let Some((_, _, c)) = image(g, st.node) {
                    channels = c;
                }
                // down the column, then through every lane of the strip (each keeps
                // its share)
                for &(x, y) in path {
                    all.route((x, y), c, Route::new(Dir::N, &[Dir::S]))
                        .map_err(LayoutError::DoesNotFit)?;
                }
                let n = lanes_out[b];
                for l in 0..n {
                    let at = p.orient.at((p.x, p.y), 0, l);
                    let rx = if l == 0 { Dir::N } else { p.orient.dir(Dir::N) };
                    let tx: &[Dir] = if l + 1 < n {
                        &[Dir::Ramp, p.orient.dir(Dir::S)]
                    } else {
                        &[Dir::Ramp]
                    };
                    all.route(at, c, Route::new(rx, tx))
                        .map_err(LayoutError::DoesNotFit)?;
                }
                host_lanes.push(HostLane {
                    x: p.x,
                    y: 0,
                    dir: Dir::N,
                    colour: c,
                    elems: 0..per,
                });
            }
            inputs.push(HostStream {
                node: st.node.index() as u32,
                name: stream_name(g, st.node),
                per_sample: per,
                channels,
                ids,
                lanes: host_lanes,
            });
        }
    }
    for st in &f.streams {
        let Some(&c) = colour_of.get(&st.node) else {
            continue;
        };
        let per = (g.ty(st.node).elements() / f.batch.max(1) as usize) as u32;
        if st.to.contains(&End::Host) {
            let End::Kernel(a) = st.from else { continue };
            let p = &placed[a];
            all.route((p.x, p.y), c, Route::new(Dir::Ramp, &[Dir::E]))
                .map_err(LayoutError::DoesNotFit)?;
            for &(x, y) in &paths[&st.node] {
                all.route((x, y), c, Route::new(Dir::W, &[Dir::E]))
                    .map_err(LayoutError::DoesNotFit)?;
            }
            let x = fab.width - 1;
            outputs.push(HostStream {
                node: st.node.index() as u32,
                name: stream_name(g, st.node),
                per_sample: per,
                // an image comes back planar, as kernels keep it
                channels: image(g, st.node).map_or(0, |(_, _, c)| c),
                ids: None,
                lanes: vec![HostLane {
                    x,
                    y: p.y,
                    dir: Dir::E,
                    colour: c,
                    elems: 0..per,
                }],
            });
        }
    }
    // every PE's memory fits
    let words = fab.usable_bytes() / super::cost::WORD;
    if let Some(((x, y), (prog, _))) = all.pes.iter().max_by_key(|(_, (p, _))| p.words()) {
        if prog.words() > words {
            if std::env::var_os("EST_WAFER_DEBUG").is_some() {
                eprintln!("{:?}", prog.symbols);
            }
            let k = placed
                .iter()
                .position(|k| *x >= k.x && *x < k.x + k.w && *y >= k.y && *y < k.y + k.h);
            let parts = memory(prog, fab);
            let one_lane = |j: usize| {
                matches!(f.kernels[j].kind, Kind::Vector { .. }) && sizer.width[j].is_none()
            };
            let pinned = k
                .filter(|&k| {
                    matches!(f.kernels[k].kind, Kind::Dense { .. })
                        && k > 0
                        && k + 1 < nk
                        && one_lane(k - 1)
                        && one_lane(k + 1)
                })
                .map(|k| placed[k - 1].name.clone());
            return Err(LayoutError::Sram(SramShort {
                pinned,
                kernel: k.map_or_else(|| "a kernel".to_string(), |k| placed[k].name.clone()),
                span: k.and_then(|k| kernel_span(g, f, k)),
                at: (*x, *y),
                block: s,
                pes: k.map_or(1, |k| u64::from(placed[k].w) * u64::from(placed[k].h)),
                parts,
                need: prog.words() * super::cost::WORD + fab.reserved_bytes,
                have: fab.sram_bytes,
            }));
        }
    }
    let setup = Setup {
        pes: all.pes,
        routes: all.routes,
        inputs: host_inputs(&inputs),
    };
    let l = Layout {
        fabric: fab.clone(),
        batch: f.batch,
        setup,
        tensors: all.tensors,
        inputs,
        outputs,
        kernels: placed,
        block: s,
    };
    // every layout is checked: it is cheap beside the simulation it leads to
    check(&l)
        .map_err(|e| LayoutError::DoesNotFit(format!("an illegal layout (a bug in estc): {e}")))?;
    Ok(l)
}

/// The colours a layout's streams take, router by router.
struct Palette {
    /// Per router: the colours streams through it use (a bit each).
    used: BTreeMap<(u32, u32), u64>,
    /// The colours needed so far, and the programs' budget.
    need: Colour,
    have: Colour,
    /// The first stream past the budget.
    short: Option<String>,
}

impl Palette {
    /// The lowest colour no router of `routers` uses yet, now theirs; beyond the
    /// budget only to count how many are needed (`name`: the stream, for the
    /// diagnostic).
    fn take(
        &mut self,
        routers: &[(u32, u32)],
        name: impl FnOnce() -> String,
    ) -> Result<Colour, LayoutError> {
        let busy = (routers.iter()).fold(0u64, |m, r| m | self.used.get(r).copied().unwrap_or(0));
        let Some(c) = (CHAIN_COLOURS..64).find(|&c| busy & (1 << c) == 0) else {
            return Err(LayoutError::DoesNotFit(
                "a router would carry more than 64 streams".into(),
            ));
        };
        if c >= self.have && self.short.is_none() {
            self.short = Some(name());
        }
        self.need = self.need.max(c + 1);
        for r in routers {
            *self.used.entry(*r).or_default() |= 1 << c;
        }
        Ok(c)
    }
}

/// The input one-lane kernel `k` takes from layer `l` before it, and that input's
/// gradient it sends back, when its dealer can gather them from the layer's rows
/// (`vector::Fan`): the layer's rows carry its outputs alone (no residual's features,
/// no side part's outputs).
fn fanned(f: &Formed, l: usize, k: usize) -> Option<(NodeIndex, Option<NodeIndex>)> {
    if f.carry(l).is_some() || parts_of(f, l).iter().any(|p| p.side) {
        return None;
    }
    let input = (f.streams.iter())
        .find(|s| !s.bwd && s.from == End::Kernel(l) && s.to == [End::Kernel(k)])?
        .node;
    let grad = (f.streams.iter())
        .find(|s| s.bwd && s.from == End::Kernel(k) && s.to.contains(&End::Kernel(l)))
        .map(|s| s.node);
    Some((input, grad))
}

/// The rows of the layer before one-lane kernel `k` whose outputs its dealer gathers
/// on a sizing (1: it takes them from one).
fn fan_of(f: &Formed, lanes: &Lanes, k: usize) -> u32 {
    match k.checked_sub(1) {
        Some(l) if lanes.out[k] == 1 && matches!(f.kernels[l].kind, Kind::Dense { .. }) => {
            lanes.out[l].max(1)
        }
        _ => 1,
    }
}

/// The strip a backward stream passes on its way from a layer to the one before it.
fn passes_over(f: &Formed, st: &form::Stream) -> Option<usize> {
    let End::Kernel(a) = st.from else {
        return None;
    };
    let strip = a.checked_sub(1)?;
    (st.bwd
        && a >= 2
        && st.to.contains(&End::Kernel(a - 2))
        && matches!(f.kernels[strip].kind, Kind::Vector { .. }))
    .then_some(strip)
}

/// Whether node `n` streams from the host.
fn st_from_host(f: &Formed, n: NodeIndex) -> bool {
    f.streams.iter().any(|s| s.node == n && s.from == End::Host)
}

/// What a host stream carries: its input's name, or its op.
fn stream_name(g: &Graph, n: NodeIndex) -> String {
    match &g.node(n).op {
        Op::Input { name } => name.clone(),
        op => format!("{} %{}", op.name(), n.index()),
    }
}

/// Why a layout is not legal, if it is not: a kernel off the fabric or over another,
/// a PE whose memory map exceeds its SRAM, a colour beyond the programs' budget, a
/// route that leads nowhere, loops or merges (what `Sim::new` refuses), or a link that
/// carries more wavelets a step (`link_loads`) than the busiest PE has cycles in one (a
/// link carries one a cycle: the fabric, not the kernels, would bound the step).
pub fn check(l: &Layout) -> Result<(), String> {
    let f = &l.fabric;
    for (i, k) in l.kernels.iter().enumerate() {
        if k.x + k.w > f.width || k.y + k.h > f.height {
            return Err(format!(
                "kernel {} runs off the {}x{} fabric",
                k.name, f.width, f.height
            ));
        }
        for o in &l.kernels[..i] {
            let apart =
                k.x + k.w <= o.x || o.x + o.w <= k.x || k.y + k.h <= o.y || o.y + o.h <= k.y;
            if !apart {
                return Err(format!("kernels {} and {} overlap", o.name, k.name));
            }
        }
    }
    let words = f.usable_bytes() / super::cost::WORD;
    for ((x, y), (p, _)) in &l.setup.pes {
        if p.words() > words {
            return Err(format!(
                "PE ({x}, {y}) needs {} words of SRAM, more than its {words}",
                p.words()
            ));
        }
        let inside = l
            .kernels
            .iter()
            .any(|k| *x >= k.x && *x < k.x + k.w && *y >= k.y && *y < k.y + k.h);
        if !inside {
            return Err(format!("PE ({x}, {y}) runs a program outside every kernel"));
        }
    }
    for ((x, y), (p, _)) in &l.setup.pes {
        let brought = |c: Colour| {
            l.setup
                .routes
                .get(&(*x, *y, c))
                .is_some_and(|r| r.tx().any(|d| d == Dir::Ramp))
        };
        for t in &p.tasks {
            if let super::isa::Trigger::Data(c) = t.trigger {
                if !brought(c) {
                    return Err(format!(
                        "PE ({x}, {y}): task `{}` runs on colour {c}, which no route brings",
                        t.name
                    ));
                }
            }
        }
    }
    let budget = f.program_colours();
    if let Some((x, y, c)) = l.setup.routes.keys().find(|k| u32::from(k.2) >= budget) {
        return Err(format!(
            "router ({x}, {y}) routes colour {c}, beyond the {budget} programs may use"
        ));
    }
    super::sim::Sim::new(f, &l.setup).map_err(|e| e.0)?;
    let batch = l.batch.max(1);
    let busiest = (l.setup.pes.values())
        .map(|(p, _)| super::cost::per_sample(f, p, batch, UPDATE) * u64::from(batch))
        .max()
        .unwrap_or(0);
    if let Some(((x, y, d), n)) = link_loads(l).into_iter().max_by_key(|&(_, n)| n) {
        if n > busiest {
            return Err(format!(
                "the link leaving router ({x}, {y}) {} carries {n} wavelets a step, more than the {busiest} cycles a step of the busiest PE",
                d.name()
            ));
        }
    }
    Ok(())
}

/// Per link (a router, and the port wavelets leave it by): the wavelets a step sends
/// across it. Each stream's are counted at its source (a PE's program's, `cost::sends`;
/// a host lane's elements of every sample) and cross every link of its route tree.
pub fn link_loads(l: &Layout) -> BTreeMap<(u32, u32, Dir), u64> {
    let f = &l.fabric;
    let batch = u64::from(l.batch.max(1));
    let routes = &l.setup.routes;
    let mut load = BTreeMap::new();
    for (&(x, y, c), r) in routes {
        let sent = if r.rx == Dir::Ramp {
            (l.setup.pes.get(&(x, y))).map_or(0, |(p, _)| super::cost::sends(p, c, batch))
        } else if r.rx.step(x, y, f).is_none() {
            (l.inputs.iter().flat_map(|s| &s.lanes))
                .filter(|h| (h.x, h.y, h.colour) == (x, y, c))
                .map(|h| h.elems.len() as u64 * batch)
                .sum()
        } else {
            continue;
        };
        let mut todo = vec![(x, y)];
        let mut seen = BTreeSet::new();
        while let Some((x, y)) = todo.pop() {
            let Some(r) = routes.get(&(x, y, c)) else {
                continue;
            };
            if !seen.insert((x, y)) {
                continue;
            }
            for d in r.tx().filter(|&d| d != Dir::Ramp) {
                *load.entry((x, y, d)).or_default() += sent;
                todo.extend(d.step(x, y, f));
            }
        }
    }
    load.retain(|_, n| *n > 0);
    load
}

pub fn bytes(b: u32) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", f64::from(b) / f64::from(1u32 << 20))
    } else {
        format!("{:.1} KiB", f64::from(b) / 1024.0)
    }
}

/// A program's memory by what it holds: weights, gradients, optimiser state, stashed
/// activations, buffers (streams in flight, temporaries, constants); the non-zero ones.
/// A PE's memory by what it holds, in bytes (code and runtime first), the non-zero
/// parts.
pub fn memory(p: &super::isa::Program, fab: &Fabric) -> Vec<(&'static str, u32)> {
    let mut parts = vec![("code and runtime", fab.reserved_bytes)];
    parts.extend(breakdown(p));
    parts
}

fn breakdown(p: &super::isa::Program) -> Vec<(&'static str, u32)> {
    let mut parts = [0u32; 6];
    for s in &p.symbols {
        let i = if s.name.ends_with(" fifo") {
            5
        } else if s.name.contains("stash") {
            3
        } else if s.name.starts_with('%') {
            1
        } else if s.name.contains('/')
            && p.symbols
                .iter()
                .any(|o| o.name != s.name && s.name.starts_with(&format!("{}/", o.name)))
        {
            2
        } else if s.name.contains('/') {
            0
        } else {
            4
        };
        parts[i] += s.len * super::cost::WORD;
    }
    let names = [
        "weights",
        "gradients",
        "optimiser state",
        "stashed activations",
        "buffers",
        "FIFOs",
    ];
    names
        .into_iter()
        .zip(parts)
        .filter(|(_, b)| *b > 0)
        .collect()
}

/// The simulator's host inputs of the host's streams (empty: values come each step).
pub fn host_inputs(streams: &[HostStream]) -> Vec<HostIn> {
    (streams.iter().flat_map(|h| h.lanes.iter()))
        .map(|l| HostIn {
            x: l.x,
            y: l.y,
            colour: l.colour,
            values: Vec::new(),
        })
        .collect()
}

/// How a layout sized its kernels: one block size, or each to a common period (0).
pub fn sizing(block: u32) -> String {
    if block == 0 {
        "each kernel sized to a common period".to_string()
    } else {
        format!("with blocks of {block}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::wafer::isa::{Dsd, Instr, Program, Src, Task, Trigger, VecOp};

    /// A program that sends `n` words on colour `c` at start, or (`recv`) adds `n`
    /// wavelets of colour `c` into its words when they come.
    fn pe(c: Colour, n: u32, recv: bool) -> Arc<Program> {
        let mut p = Program::default();
        let x = p.alloc("x", n);
        let (trigger, dst, srcs) = if recv {
            let srcs = vec![
                Src::V(Dsd::mem(x, n)),
                Src::V(Dsd::In { colour: c, len: n }),
            ];
            (Trigger::Data(c), Dsd::mem(x, n), srcs)
        } else {
            let srcs = vec![Src::V(Dsd::mem(x, n))];
            (
                Trigger::Local { at_start: true },
                Dsd::Out { colour: c, len: n },
                srcs,
            )
        };
        let op = if recv { VecOp::Add } else { VecOp::Mov };
        p.tasks.push(Task {
            id: 0,
            name: "t".into(),
            trigger,
            body: vec![Instr::Vec { op, dst, srcs }],
        });
        Arc::new(p)
    }

    /// PEs along row 0 from column 0; `streams` as (colour, from, to) columns, routed
    /// east.
    fn row(pes: &[(u32, Arc<Program>)], streams: &[(Colour, u32, u32)]) -> Layout {
        let fabric = Fabric::named("test32").unwrap();
        let mut setup = Setup::default();
        for (x, p) in pes {
            setup
                .pes
                .insert((*x, 0), (p.clone(), vec![0.0; p.words() as usize]));
        }
        for &(c, a, b) in streams {
            for x in a..=b {
                let route = match (x == a, x == b) {
                    (true, _) => Route::new(Dir::Ramp, &[Dir::E]),
                    (false, true) => Route::new(Dir::W, &[Dir::Ramp]),
                    (false, false) => Route::new(Dir::W, &[Dir::E]),
                };
                setup.routes.insert((x, 0, c), route);
            }
        }
        Layout {
            fabric,
            batch: 1,
            setup,
            tensors: BTreeMap::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            kernels: vec![Placed {
                name: "row".into(),
                x: 0,
                y: 0,
                w: 4,
                h: 1,
                orient: Orient::North,
            }],
            block: 0,
        }
    }

    /// A link that two streams share carries both; the checker refuses a link that
    /// carries more wavelets a step than the busiest PE has cycles (here 75: a task
    /// switch of 10, a start-up of 5 and 60 elements).
    #[test]
    fn a_link_carries_its_streams_and_an_overloaded_one_is_refused() {
        // PE 0 sends 60 words to PE 3 through PEs 1 and 2
        let alone = row(&[(0, pe(1, 60, false)), (3, pe(1, 60, true))], &[(1, 0, 3)]);
        let loads: Vec<_> = link_loads(&alone).into_iter().collect();
        assert_eq!(
            loads,
            [
                ((0, 0, Dir::E), 60),
                ((1, 0, Dir::E), 60),
                ((2, 0, Dir::E), 60)
            ]
        );
        check(&alone).unwrap();
        // and PE 1 sends 60 more to PE 2 on the link out of it
        let shared = row(
            &[
                (0, pe(1, 60, false)),
                (1, pe(2, 60, false)),
                (2, pe(2, 60, true)),
                (3, pe(1, 60, true)),
            ],
            &[(1, 0, 3), (2, 1, 2)],
        );
        assert_eq!(link_loads(&shared)[&(1, 0, Dir::E)], 120);
        let e = check(&shared).unwrap_err();
        assert!(
            e.contains("router (1, 0) east carries 120 wavelets a step, more than the 75 cycles"),
            "{e}"
        );
    }

    /// A loss run as replicas (a dealer dealing the samples, the step's sums gathered
    /// and sent back, the gradients put back in order) computes what it computes on
    /// one lane: the same sizing but for the loss's replicas, the same weights and
    /// inputs, one train step and its update in the simulator; every tensor within
    /// 1e-6 of its largest magnitude (the sums over the batch add the replicas'
    /// shares in another order). Counts of 2, 3, 4 and 6 replicas of a batch of 12,
    /// the dealer taking the logits from one row of the last layer, or gathering them
    /// from 2 to 5 rows (and sending each row its share of their gradient).
    #[test]
    fn a_loss_as_replicas_computes_what_it_does_on_one_lane() {
        use crate::backend::wafer::kernels::{gather, scatter};
        use crate::backend::wafer::sim::Sim;
        let src = crate::backend::wafer::testing::mlp(7, 9, 5, 12);
        let g = crate::backend::wafer::testing::graph(&src, crate::syntax::ast::SectionKind::Train);
        let f = form::form(&g).unwrap();
        // a fabric with colours for six replicas gathering five rows
        let mut fab = Fabric::named("test32").unwrap();
        fab.colours += 10;
        let sizer = Sizer::new(&g, &f, &fab, Widths::WIDEST).unwrap();
        let last = f.kernels.len() - 1;
        assert!(sizer.replicable[last]);
        let base = sizer.block(4).unwrap();
        let value = |seed: usize| {
            let z = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        // (the last layer's rows, whose outputs the dealer gathers)
        let run = |reps: u32, rows: u32| -> BTreeMap<String, Vec<f32>> {
            let mut lanes = base.clone();
            lanes.reps[last] = reps;
            lanes.out[last - 1] = rows;
            let l = try_lanes(&sizer, &lanes, 4).unwrap();
            let mut sim = Sim::new(&fab, &l.setup).unwrap();
            let len = |pieces: &[Piece]| {
                (pieces.iter().flat_map(|p| &p.runs))
                    .map(|&(o, n)| (o + n) as usize)
                    .max()
                    .unwrap_or(0)
            };
            // the variables (sums over the batch start at zero, as the update leaves
            // them)
            for (t, (name, pieces)) in l.tensors.iter().enumerate() {
                if name.starts_with('%') {
                    continue;
                }
                let data: Vec<f32> = (0..len(pieces)).map(|i| value(1000 * t + i)).collect();
                scatter(pieces, &data, |(x, y), a, v| {
                    sim.write(x, y, a, v);
                });
            }
            for s in &l.inputs {
                for lane in &s.lanes {
                    let v: Vec<f32> = (0..l.batch)
                        .flat_map(|b| lane.elems.clone().map(move |e| (b, e)))
                        .map(|(b, e)| match s.name.as_str() {
                            "labels" => ((b * 3 + 1) % 5) as f32,
                            _ => value((b * 7 + e) as usize + 77),
                        })
                        .collect();
                    sim.feed(lane.x, lane.y, lane.colour, &v);
                }
            }
            sim.run().unwrap();
            for &(x, y) in l.setup.pes.keys() {
                sim.launch(x, y, UPDATE);
            }
            sim.run().unwrap();
            (l.tensors.iter())
                .map(|(name, pieces)| {
                    let v = gather(pieces, len(pieces), |(x, y)| sim.memory(x, y));
                    (name.clone(), v)
                })
                .collect()
        };
        let one = run(1, 1);
        assert!(one.len() >= 6, "{:?}", one.keys());
        // (rows a layer of 5 outputs uses all of)
        let cases = [
            (2, 1),
            (3, 1),
            (4, 1),
            (6, 1),
            (2, 2),
            (2, 3),
            (3, 3),
            (4, 5),
            (6, 5),
        ];
        for (reps, rows) in cases {
            let many = run(reps, rows);
            for (name, a) in &one {
                let b = &many[name];
                let scale = a.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
                for (x, y) in a.iter().zip(b) {
                    assert!(
                        (x - y).abs() <= 1e-6 * scale,
                        "{reps} replicas, {rows} rows: {name}: {x} against {y} on one lane"
                    );
                }
            }
        }
    }
}
