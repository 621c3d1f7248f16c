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
//!
//! **Passes.** `layout` checks the graph is a chain the staircase lays out, then
//! `search` sizes it (`sizer`: what kernels cost on so many lanes; `balance`: sizings
//! to a budget; `lanes`: a sizing and its staircase), and `build` lays a sizing out:
//! placement, `colour`, `lay` (each kernel on its place), `host` (the host's streams),
//! every PE's memory, and the legality `check`.

mod balance;
mod build;
mod check;
mod colour;
mod host;
mod lanes;
mod lay;
mod replay;
mod search;
mod sizer;
#[cfg(test)]
mod tests;

pub use check::{bytes, check, link_loads, memory, sizing};
pub use host::host_inputs;

use super::fabric::Fabric;
use super::form::{self, End, Formed, Kind, Unsupported};
use super::isa::Colour;
use super::kernels::{Orient, Piece};
use super::pipeline::Widths;
use super::sim::{Dir, Setup};
use crate::ir::{Graph, NodeIndex, Op};
use crate::span::Span;
use host::parts_of;
use sizer::Sizer;
use std::collections::BTreeMap;

/// What the wafer lays out, for the help of what it does not.
const RESIDUALS: &str = "the wafer lays out chains of layers, residuals around dense layers and convolutions (`h + f(h W)`, `h + g(f(h V) W)`, `x + conv(relu(conv(x)))`, `h + f(layer_norm(h) W)`: the first layer carries `h` past itself, the kernels after it pass it on to the sum), two layers of one value (two towers, a projection shortcut: the later carries the value to the other), and any number of dense layers of one value, fused into one layer of their weights side by side (three towers of a layer each, attention's query, key and value): feed each value to the next layer, to a sum after the layers it reads, to dense layers of their own variables, or to two layers of which one is deeper";

const TOKEN_TOWERS: &str = "a layer over each token of a sequence carries its own input past itself (a residual's) but no other layer's: dense layers of one sequence run as one layer of their weights side by side (attention's query, key and value, each a `dense` of its own variable, fused), but a tower of more than one layer beside another has no wafer layout yet; end each tower of the sequence after its first layer (feed the deeper layers from the vector kernel that joins them), or train on the host (`--target host`)";

const STEPS: &str = "each step of an unrolled recurrent layer (`gru`, `lstm`, a loop over time steps) takes its step of the sequence beside its state, from the host: a sequence the wafer makes (an `embedding`'s, a layer's) would have to reach every step at once, which the chain of layers does not route yet; feed the recurrent layer a sequence of the features (ids one-hot in the input pipeline, `map |(f, l)| (one_hot(f.ids, vocabulary), l)`: its input kernel, vocabulary by 3 or 4 units, takes the place of the embedding's table and its own), or train on the host (`--target host`)";

/// Whether some kernel sends slices of a value to three or more layers: the steps of
/// an unrolled recurrent layer, each taking its time step of a sequence the wafer
/// makes.
fn deals_steps(g: &Graph, f: &Formed) -> bool {
    let mut layers: BTreeMap<usize, std::collections::BTreeSet<usize>> = BTreeMap::new();
    let slices =
        (f.streams.iter()).filter(|s| !s.bwd && matches!(g.node(s.node).op, Op::Slice { .. }));
    for s in slices {
        let End::Kernel(a) = s.from else { continue };
        let to = s.to.iter().filter_map(|t| match t {
            End::Kernel(b) if matches!(f.kernels[*b].kind, Kind::Dense { .. }) => Some(*b),
            _ => None,
        });
        layers.entry(a).or_default().extend(to);
    }
    layers.values().any(|l| l.len() > 2)
}

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
    /// The tensors whose pieces each hold a part of their value (`Laid::summed`).
    pub summed: std::collections::BTreeSet<String>,
    pub inputs: Vec<HostStream>,
    pub outputs: Vec<HostStream>,
    pub kernels: Vec<Placed>,
    /// The block size every layer got, or 0 when each was sized to a common period.
    pub block: u32,
    /// The cycles of a step as the sizer estimates them before any simulation
    /// (`Sizer::step`); 0 when not known.
    pub estimate: u64,
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

impl LayoutError {
    /// Whether it is a kernel short of memory that keeps every sample of the step
    /// (`SramShort::keeps`): neither larger blocks nor narrower windows shrink what it
    /// keeps, so the search stops at it.
    pub fn keeps_batch(&self) -> bool {
        matches!(self, LayoutError::Sram(s) if s.keeps.is_some())
    }
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
    /// The batch, when the kernel keeps every sample of the step (it reads a statistic
    /// of the batch, or a kernel after it does: `pipeline::BARRIER`), whatever the
    /// windows.
    pub keeps: Option<u32>,
    /// Whether the kernel holds each sample (or each head of it) whole on one PE,
    /// whatever the fabric (a vector kernel of one lane: attention's products, a
    /// softmax over a sample's axes; a heads kernel with a head a lane).
    pub whole: bool,
}

impl SramShort {
    /// For a kernel that keeps the batch (`keeps`), the largest batch its stash leaves
    /// room for as it was sized: the stash grows with the batch, the rest does not (0
    /// when even one sample does not fit).
    pub fn batch_that_fits(&self) -> Option<u32> {
        let batch = self.keeps?;
        let stash: u32 = (self.parts.iter())
            .filter(|(w, _)| *w == "stashed activations")
            .map(|(_, b)| *b)
            .sum();
        let per = f64::from(stash) / f64::from(batch.max(1));
        let room = f64::from(self.have) - f64::from(self.need - stash.min(self.need));
        Some(if per > 0.0 {
            (room / per).floor().max(0.0) as u32
        } else {
            0
        })
    }
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
    let scope = |v: NodeIndex| match &g.node(v).op {
        Op::Variable { name, .. } => Some(
            name.rsplit_once('/')
                .map_or(name.clone(), |(a, _)| a.to_string()),
        ),
        _ => None,
    };
    // (a joined weight's layer by its variables' scopes, the later without the first's
    // path: `attention/dense+dense_1+dense_2`)
    let joined = |parts: Vec<NodeIndex>| {
        let scopes = parts.into_iter().map(scope).collect::<Option<Vec<_>>>()?;
        let path = scopes[0].rsplit_once('/').map_or("", |(p, _)| p);
        let short = |s: &String| match s.strip_prefix(path).and_then(|r| r.strip_prefix('/')) {
            Some(rest) if !path.is_empty() => rest.to_string(),
            _ => s.clone(),
        };
        let rest: Vec<String> = scopes[1..].iter().map(short).collect();
        Some(format!("{}+{}", scopes[0], rest.join("+")))
    };
    let var = kr.vars.iter().find_map(|&v| match form::joined(g, v) {
        Some(parts) => joined(parts),
        None => scope(v),
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
                        | "max_pool2d"
                        | "avg_pool2d"
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
    chain_only(g, f)?;
    // a softmax on one lane (as replicas: the fewest cycles for a few classes), or,
    // when that does not fit (the layer before it on one row), across the lanes; at
    // once when its layer's weights alone cannot fit those rows
    let widens = lanes::across_widens(g, f);
    if (widens.iter()).any(|&k| lanes::one_lane_hopeless(g, f, fab, k)) {
        return sized(g, f, fab, true);
    }
    if widens.is_empty() {
        return sized(g, f, fab, false);
    }
    // (a one-lane loss or its layer short of memory at the widest windows: across
    // before narrower windows, which leave those kernels as they are)
    let at_softmax: Vec<String> = (widens.iter())
        .flat_map(|&k| [k.saturating_sub(1), k])
        .map(|k| kernel_name(g, f, k))
        .collect();
    let stop =
        |e: &LayoutError| matches!(e, LayoutError::Sram(s) if at_softmax.contains(&s.kernel));
    match sized_until(g, f, fab, false, stop) {
        Err(e @ (LayoutError::Sram(_) | LayoutError::Pes(_))) => match sized(g, f, fab, true) {
            Ok(l) => Ok(l),
            // (the one-lane layout's own error, its windows narrowed as far as they go)
            Err(_) if stop(&e) => sized(g, f, fab, false),
            Err(_) => Err(e),
        },
        // (both fit: the shorter estimated step, a wide softmax's lanes often, whose
        // windows narrow less; within the estimates' slack, the fewer PEs)
        Ok(one) => match sized(g, f, fab, true) {
            Ok(wide) => {
                let key = |l: &Layout| (l.estimate, l.setup.pes.len());
                match search::thrifty([key(&one), key(&wide)].into_iter()) {
                    Some(1) => Ok(wide),
                    _ => Ok(one),
                }
            }
            Err(_) => Ok(one),
        },
        r => r,
    }
}

/// `layout` with vector kernels softmaxing `across` their lanes or not: the windows as
/// wide as they need, narrowed while memory (or the PEs that more lanes of memory
/// take) is short.
fn sized(g: &Graph, f: &Formed, fab: &Fabric, across: bool) -> Result<Layout, LayoutError> {
    sized_until(g, f, fab, across, |_| false)
}

/// `sized`, giving up narrowing the windows at an error `stop` picks.
fn sized_until(
    g: &Graph,
    f: &Formed,
    fab: &Fabric,
    across: bool,
    stop: impl Fn(&LayoutError) -> bool,
) -> Result<Layout, LayoutError> {
    let mut widths = Widths::WIDEST;
    // the last schedule searched, which narrower widths may leave as it was (windows
    // at or before a barrier keep the batch)
    let mut last: Option<Vec<(u32, u32)>> = None;
    loop {
        let sizer = Sizer::new(g, f, fab, (widths, across))?;
        if std::env::var_os("EST_WAFER_DEBUG").is_some() {
            eprintln!("widths {widths:?}: windows {:?}", sizer.sched);
        }
        let widest = sizer.sched.iter().map(|s| s.0).max().unwrap_or(1);
        let narrower = widths.narrower(widest);
        if let (Some(w), true) = (narrower, last.as_ref() == Some(&sizer.sched)) {
            widths = w;
            continue;
        }
        match (search::search(&sizer), narrower) {
            (Err(e @ (LayoutError::Sram(_) | LayoutError::Pes(_))), Some(w))
                if !stop(&e) && !e.keeps_batch() =>
            {
                last = Some(sizer.sched.clone());
                widths = w
            }
            (r, _) => return r,
        }
    }
}

/// Whether `f` is a chain the staircase lays out: each kernel's forward input comes
/// from the one before (and goes on at most through a strip to the one after, or past
/// the layer after it, which carries it), each backward one from the one after; each
/// layer's input from the kernel before it, its further parts' from the host.
fn chain_only(g: &Graph, f: &Formed) -> Result<(), LayoutError> {
    for s in &f.streams {
        if let (true, End::Kernel(a)) = (s.bwd, s.from) {
            // (or past a strip, through its routers)
            let ok = s.to.iter().all(|t| match t {
                End::Kernel(b) => {
                    *b + 1 == a
                        || (*b + 2 == a && matches!(f.kernels[a - 1].kind, Kind::Vector { .. }))
                        || f.carried(s.node, *b)
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
                End::Kernel(b) => *b == a + 1 || (*b > a + 1 && f.carried(s.node, *b)),
                End::Host => true,
            });
            if !ok {
                // (a layer of each step's input between a step's state and the next
                // step's layer)
                if deals_steps(g, f) {
                    return Err(unsupported(g, s.node, "a sequence made on the wafer and read step by step by an unrolled recurrent layer has no wafer layout yet".into(), STEPS));
                }
                // (a sequence, token by token: no tower beside a layer over tokens)
                let help = match g.ty(s.node).rank() {
                    3 => TOKEN_TOWERS,
                    _ => RESIDUALS,
                };
                return Err(unsupported(g, s.node, "a value read past the layer after it (or by several layers) has no wafer layout yet".into(), help));
            }
        }
    }
    // a vector kernel passes a value on between two layers (it comes in beside the
    // outputs of the one before and goes on beside the input of the one after)
    let layer = |k: Option<usize>| {
        k.and_then(|k| f.kernels.get(k))
            .is_some_and(|kr| matches!(kr.kind, Kind::Dense { .. }))
    };
    for (k, kr) in f.kernels.iter().enumerate() {
        // (and a vector kernel that sends a carried value's gradient back beside the
        // output gradient of the layer before must make that gradient, not let it pass
        // over it from the kernel after)
        let over = k.checked_sub(1).and_then(|l| match &f.kernels[l].kind {
            Kind::Dense {
                fwd, dy: Some(d), ..
            } if matches!(kr.kind, Kind::Vector { .. }) => {
                let d = f.resolve(*d);
                let skip = f.carried_past(l).and_then(|c| c.grad);
                let passes = (f.streams.iter()).any(|s| s.node == d && s.from != End::Kernel(k));
                (skip.is_some_and(|g| g != d) && passes).then_some(*fwd)
            }
            _ => None,
        });
        if let Some(n) = over {
            return Err(unsupported(
                g,
                n,
                "a carried value's gradient beside an output gradient that passes over its kernel has no wafer layout yet".into(),
                RESIDUALS,
            ));
        }
        if let (Kind::Vector { .. }, Some(c)) = (&kr.kind, f.passed(k)) {
            if !layer(k.checked_sub(1)) || !layer(Some(k + 1)) {
                return Err(unsupported(
                    g,
                    c.x,
                    "a value passed on through a kernel that is not between two layers has no wafer layout yet".into(),
                    RESIDUALS,
                ));
            }
        }
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
            // (or carried to it by the shortcut before it: `Carry::first`)
            if from != Some(want)
                && !(k > 0 && f.carries_first(k - 1) && f.carried(f.resolve(x), k))
            {
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
    Ok(())
}
