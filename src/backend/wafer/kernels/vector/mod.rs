//! Fused vector kernels: the sample and batch nodes between two layers (a bias and its
//! activation, the activation's gradient, a softmax with its cross-entropy and their
//! gradient) as one program per lane. A kernel of `L` lanes deals a sample's `N`
//! features to `L` PEs (`split(N, L, l)`), which elementwise groups allow, and groups
//! whose reductions within a sample are along its features (a layer norm's: the lanes
//! reduce together, `rows`); any other reduction within a sample (a softmax, an argmax,
//! a one-hot) runs on one lane. A sequence (`[B, T, N]`, token by token) is dealt so
//! too, each lane its share of every token (`tokens`), in elementwise groups and in
//! groups that reduce along each token's features (`along_tokens`: the lanes reduce a
//! word a token together, and hold the values per token whole).
//!
//! Tasks, one per phase: the forward task runs when a sample's forward inputs arrive,
//! the backward task when its output gradients do, in the order of the 1F1B schedule
//! (`pipeline`). Values the backward task reads from the forward one are stashed, one
//! slot per sample of its window. Sums over the batch accumulate as samples pass; after
//! the step's last sample, a finishing task divides the means. A gradient computed in
//! the forward task (a loss's, which needs no output gradient) goes back in the
//! sample's backward task, or, in a kernel without one, as soon as it is computed.
//!
//! A kernel of multi-head attention may instead deal its heads to lanes (`heads`): each
//! lane runs, as one lane would, a local graph of the heads it holds.
//!
//! In bands of rows (`bands`), a lane computes its images on the rows its code's
//! readers want, and takes the rows past its band from the lanes beside it (`halo`).
//!
//! Here: the kernel, its ports and what its lanes hold; `build` makes a lane's program
//! (or a replica's), `node` one node's code in it, `moves` the code of moving a
//! sample's elements, `halo` the rows of its images in bands, `pool` a pooling's code
//! (whole planes or in bands), `dealer` a one-lane kernel's dealer, `heads` a heads
//! kernel's analysis and local graph, and `ops` the helpers they share (views of a
//! sample's laid-out axes, reductions and broadcasts by rows).

use super::super::form::{image, planes, Class, End, Formed, Kind};
use super::super::isa::{Colour, Program};
use super::super::lower;
use super::rows::RowColours;
use super::{share, split, Piece, Share};
use crate::ir::{Graph, NodeIndex, Op};

mod build;
mod dealer;
mod halo;
mod heads;
mod levels;
mod moves;
mod node;
mod ops;
mod passes;
mod pool;

use ops::*;
use pool::pooling;

pub use halo::{routes as halo_routes, HaloColours};
pub use heads::Heads;

/// A stream of a vector kernel: the node, its colour, whether it is part of the
/// backward pass, whether every lane receives the whole sample (a stream from the
/// host, multicast along the strip) and keeps its share, and where it follows others
/// on the same colour (0: it does not; else its rank among those the layer before
/// carries: a residual's value, side parts' outputs, and their gradients; see
/// `form::Formed::carried_rank`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Port {
    pub node: NodeIndex,
    pub colour: Colour,
    pub bwd: bool,
    pub whole: bool,
    pub carried: u8,
}

/// Kernel `k` of a formed graph, a vector kernel, with its streams.
pub struct Vector<'a> {
    pub g: &'a Graph,
    pub f: &'a Formed,
    pub k: usize,
    pub inputs: Vec<Port>,
    pub outputs: Vec<Port>,
    /// Its window and FIFO in samples (`pipeline::plan`): the slots of its stash when
    /// it has a backward pass, and the output gradients it keeps room for; a dealer's
    /// window, the samples out at its replicas.
    pub window: u32,
    pub fifo: u32,
    /// The colours of its reductions along a sample's features across its lanes
    /// (`rows`), when it has any on several lanes.
    pub rows: Option<RowColours>,
    /// The colours of its halos (`halo`), when its lanes exchange them.
    pub halo: Option<HaloColours>,
    /// Whether a softmax, a one-hot and an argmax along its samples' features run
    /// across its lanes, the lanes reducing together (`rows`), so that it runs on as
    /// many lanes as the layer before it has rows (a softmax over 1,000 classes, whose
    /// layer would not fit on one row); else they make it a one-lane kernel (which may
    /// run as replicas).
    pub across: bool,
    /// `width_of`, once worked out (every value's extent on a lane reads it).
    pub widths: std::cell::OnceCell<Option<(u32, bool)>>,
    /// `heads`, once worked out.
    pub heads_memo: std::cell::OnceCell<Option<Heads>>,
    /// A lane of a heads kernel, when this is its local view (`heads`).
    pub dealt: Option<heads::Dealt<'a>>,
}

/// A lane's program, initial memory and tensors (pieces without their PE).
pub struct Lane {
    pub program: Program,
    pub memory: Vec<f32>,
    pub tensors: Vec<(String, Piece)>,
}

/// How a value is given to every word of a sequence (`Vector::given_to_tokens`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Given {
    /// One value a token, over its features.
    PerToken,
    /// One value a feature, for every token.
    PerFeature,
}

/// A replica of a one-lane kernel (`Vector::replica`): which of how many, the colour
/// its samples come on from the dealer (and, at the step's end, the sums over the
/// batch of every replica), and the one it sends its sums and gradients back on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rep {
    pub of: u32,
    pub to: Colour,
    pub back: Colour,
}

/// A one-lane kernel's input that the several rows of the layer before it send
/// (`place/colour.rs`): row `l` sends its share `split(N, L, l)` of `input` on
/// `colours[l].0`, and takes its share of `grad` back on `colours[l].1`. Only a dealer
/// gathers one (its replicas take whole samples from it).
#[derive(Debug, Clone, PartialEq)]
pub struct Fan {
    pub input: NodeIndex,
    pub grad: Option<NodeIndex>,
    pub colours: Vec<(Colour, Colour)>,
}

impl Fan {
    /// Each row's share of `len` words: its offset, length, and colours.
    fn shares(&self, len: u32) -> impl Iterator<Item = (u32, u32, (Colour, Colour))> + '_ {
        let rows = self.colours.len() as u32;
        (0..rows).zip(&self.colours).map(move |(l, &c)| {
            let s = split(len, rows, l);
            (s.start, s.len() as u32, c)
        })
    }
}

/// The counters of a lane's stash slots (forward, backward: `window` samples).
const SLOT_BASE: u8 = 0;

/// The counters of a lane's samples in a step (forward, backward), which start the
/// finishing tasks.
const SAMPLE_BASE: u8 = 2;

/// The counters of a lane's samples in its passes' deeper levels (forward, backward:
/// `levels`), which are also their stash slots.
const BARRIER_BASE: u8 = 4;

impl Vector<'_> {
    /// The colours its reductions across its lanes take (`rows`; colour 0 for each
    /// when none were given, as the sizer builds it to measure).
    pub fn row_colours(&self) -> RowColours {
        self.rows.unwrap_or([0; 3])
    }

    /// The image a sample value is: its own shape's, or (a vector a layer sends back
    /// for an image it flattened) the shape this kernel reads it as.
    fn image(&self, n: NodeIndex) -> Option<(u32, u32, u32)> {
        image(self.g, n).or_else(|| {
            self.nodes()
                .iter()
                .flat_map(|&u| self.g.operands(u))
                .find(|&o| o != n && self.f.resolve(o) == n && image(self.g, o).is_some())
                .and_then(|o| image(self.g, o))
        })
    }

    fn nodes(&self) -> &[NodeIndex] {
        match &self.f.kernels[self.k].kind {
            Kind::Vector { nodes } => nodes,
            Kind::Dense { .. } => &[],
        }
    }

    /// The width `N` its samples' features have, when it can run on several lanes:
    /// every value it computes is a sample's `N` features or a sum of them over the
    /// batch, by elementwise ops; or every value is an image of `N` channels (or a sum
    /// of one over the batch and its pixels, per channel), by elementwise ops and
    /// pooling, and each lane holds some channels' planes.
    pub fn width(&self) -> Option<u32> {
        self.width_of().map(|w| w.0)
    }

    /// `width`, and whether it counts an image's channels (each lane then holds some
    /// channels' planes, and a variable of them its channels' share of each run).
    fn width_of(&self) -> Option<(u32, bool)> {
        *self.widths.get_or_init(|| {
            // (a heads kernel: its heads)
            self.work_out_width()
                .or_else(|| self.heads().map(|h| (h.count, false)))
        })
    }

    /// `width_of`, worked out from its nodes and streams.
    fn work_out_width(&self) -> Option<(u32, bool)> {
        let g = self.g;
        // (a sample's values for the host leave from one lane: the host reads a stream
        // from one PE; but a scalar every lane has, or a softmax across lanes, whose
        // probabilities for the host say so in their own diagnostic)
        let to_host = (self.f.streams.iter()).any(|s| {
            let per = g.ty(s.node).elements() / self.f.batch.max(1) as usize;
            s.from == End::Kernel(self.k)
                && s.to.contains(&End::Host)
                && self.f.class[s.node.index()] == Class::Sample
                && per > 1
        });
        if to_host && !self.across {
            return None;
        }
        let b = self.f.batch as usize;
        let mut width = None;
        // the width, and whether it counts an image's channels (a sample's vector of
        // as many features beside images, as a global pooling makes: an image of one
        // pixel, dealt to the lanes alike)
        let mut agree = |n: usize, planes: bool| match width {
            None => {
                width = Some((n, planes));
                true
            }
            Some(w) => w.0 == n,
        };
        // a sample's scalars (`[B, 1]`: a layer norm's mean) beside its features, each
        // lane holding them whole: made by reductions along the features (`rows`) or
        // from other such scalars, and read beside the features elementwise
        let wide = (self
            .nodes()
            .iter()
            .chain(self.inputs.iter().map(|p| &p.node)))
        .any(|&n| self.f.class[n.index()] == Class::Sample && self.row_width(n) > 1);
        for &n in self.nodes() {
            let node = g.node(n);
            let src = g.operands(n).first().map(|&o| self.f.resolve(o));
            let ok = match self.f.class[n.index()] {
                // a step value given to every sample (a statistic's share of a batch
                // norm's gradient): its features', or channels', own
                Class::Sample if self.of_step(n) => {
                    let planes = node.ty.rank() == 4;
                    let w = node.ty.shape.last().copied().unwrap_or(1);
                    src.is_some_and(|s| g.ty(s).elements() == w) && agree(w, planes)
                }
                Class::Sample if planes(g, n).is_some() => {
                    let c = node.ty.shape[node.ty.rank() - 1];
                    agree(c, true)
                        && (lower::elementwise(&node.op)
                            || pooling(&node.op)
                            || moves_pixels(&node.op, node.ty.rank())
                            || self.pools_planes(n)
                            || self.spreads_channels(n))
                }
                Class::Sample if wide && self.row_width(n) == 1 => {
                    lower::elementwise(&node.op)
                        || self.along_rows(n)
                        || (self.across && self.arg_across(n))
                }
                // a value per token of a sequence (a layer norm's mean), which every
                // lane holds whole: a reduction along the tokens' features, or made
                // from such values
                Class::Sample if self.along_tokens(n) => true,
                Class::Sample if self.token_scalar(n) => lower::elementwise(&node.op),
                // a sequence, token by token: each lane its share of every token
                Class::Sample if self.tokens(n).is_some() => {
                    // (a value per token over its features, or a sample's value per
                    // feature over its tokens: the gradient of a pooling over them)
                    let spreads = matches!(node.op, Op::BroadcastTo)
                        && self.given_to_tokens(g.operands(n)[0], n).is_some();
                    agree(node.ty.shape[2], false) && (lower::elementwise(&node.op) || spreads)
                }
                Class::Sample => {
                    node.ty.rank() == 2
                        && node.ty.shape[0] == b
                        && agree(node.ty.shape[1], false)
                        && (lower::elementwise(&node.op)
                            || self.pools_planes(n)
                            || self.pools_tokens(n)
                            || matches!(node.op, Op::CheckIndices { .. })
                            || (matches!(node.op, Op::BroadcastTo)
                                && src.is_some_and(|s| self.row_width(s) == 1))
                            || (self.across
                                && match node.op {
                                    Op::Softmax { axis } | Op::LogSoftmax { axis } => axis == 1,
                                    Op::OneHot { .. } => {
                                        src.is_some_and(|s| self.row_width(s) == 1)
                                    }
                                    _ => false,
                                }))
                }
                // a sum over the batch of a sample's scalar (a loss), which each lane
                // has whole
                Class::Batch if wide && node.ty.rank() == 0 => {
                    src.is_some_and(|s| self.row_width(s) == 1)
                        && matches!(&node.op, Op::Reduce { axes: a, .. } if a.as_slice() == [0])
                }
                Class::Batch => {
                    let planes = src.is_some_and(|s| g.ty(s).rank() == 4);
                    let tokens = src.is_some_and(|s| self.tokens(s).is_some());
                    let axes: &[usize] = match (planes, tokens) {
                        (true, _) => &[0, 1, 2],
                        (_, true) => &[0, 1],
                        _ => &[0],
                    };
                    node.ty.rank() == 1
                        && agree(node.ty.shape[0], planes)
                        && matches!(&node.op, Op::Reduce { axes: a, .. } if a.as_slice() == axes)
                }
                _ => true,
            };
            if !ok {
                return None;
            }
        }
        // (a sequence passed on past it, of its own width: each lane its share of
        // every token, as the layers on either side deal it)
        let passed = |n: NodeIndex| {
            (self.f.passed(self.k)).is_some_and(|c| c.x == n || c.grad == Some(n))
                && self.tokens(n).is_some_and(|(_, w)| w > 1)
        };
        for p in self.inputs.iter().filter(|p| !passed(p.node)) {
            let ty = g.ty(p.node);
            let ok = match (self.image(p.node), ty.rank()) {
                (Some((_, _, c)), _) => agree(c as usize, true),
                (None, 2) if wide && ty.shape[1] == 1 => true,
                // a sample's scalar (a label), which every lane takes whole
                (None, 1) => wide && self.across,
                (None, 2) => agree(ty.shape[1], false),
                // (a sequence the host sends whole: each lane keeps its share of every
                // token, `passes::receive`)
                (None, 3) if self.tokens(p.node).is_some() => agree(ty.shape[2], false),
                _ => false,
            };
            if !ok {
                return None;
            }
        }
        // a sequence it sends on flattened (`reshape(x, [B, T * N])`, for a dense layer
        // whose columns take runs of the flat words) goes whole, from one lane
        let flattened = (self.outputs.iter()).any(|p| {
            self.tokens(p.node).is_some()
                && (g
                    .g
                    .neighbors_directed(p.node, petgraph::Direction::Outgoing))
                .any(|u| matches!(g.node(u).op, Op::Reshape) && self.tokens(u).is_none())
        });
        if flattened {
            return None;
        }
        width.map(|w| (w.0 as u32, w.1))
    }

    /// Whether `n` reduces each plane of an image to one value (a global pooling:
    /// `reduce_mean(x, axis: [1, 2])`), which each lane does for its channels.
    fn pools_planes(&self, n: NodeIndex) -> bool {
        let Op::Reduce { op, axes, .. } = &self.g.node(n).op else {
            return false;
        };
        let src = self.f.resolve(self.g.operands(n)[0]);
        let rank = self.g.ty(src).rank();
        !matches!(op, crate::ir::ReduceOp::Prod)
            && planes(self.g, src).is_some()
            && axes.iter().copied().eq(1..rank - 1)
    }

    /// Whether `n` gives each plane of an image its channel's value of a sample
    /// (`broadcast_to` of `[B, C]` or `[B, 1, 1, C]`: a global pooling's gradient).
    fn spreads_channels(&self, n: NodeIndex) -> bool {
        let src = self.f.resolve(self.g.operands(n)[0]);
        let (from, to) = (self.g.ty(src), self.g.ty(n));
        matches!(self.g.node(n).op, Op::BroadcastTo)
            && self.f.class[src.index()] == Class::Sample
            && planes(self.g, n).is_some()
            && from.shape.first() == to.shape.first()
            && from.shape.iter().skip(1).product::<usize>() == *to.shape.last().unwrap_or(&0)
            && from.shape.last() == to.shape.last()
    }

    /// The runs of variable (or sum, or step value) `n` that lane `lane` of `lanes`
    /// holds when its kernel's lanes hold channels and `n` is per channel (its last axis
    /// past those of one is the channels: a depthwise filter `[k, k, C, 1]`, a bias):
    /// the lane's channels of each run of `C`.
    pub(super) fn channel_runs(
        &self,
        n: NodeIndex,
        lanes: u32,
        lane: u32,
    ) -> Option<Vec<(u32, u32)>> {
        let ty = self.g.ty(n);
        if lanes < 2 || matches!(self.f.class[n.index()], Class::Sample | Class::SampleT) {
            return None;
        }
        let (w, true) = self.width_of()? else {
            return None;
        };
        if w == 1 {
            // (of one channel, in bands: every lane holds it whole)
            return Some(vec![(0, ty.elements() as u32)]);
        }
        let c = *ty.shape.iter().rev().find(|&&d| d != 1)? as u32;
        if c != w {
            return None;
        }
        // (its channels, or in bands its channel)
        let share = share(c, 1, self.bands(lanes), lanes, lane).groups;
        let runs = ty.elements() as u32 / c;
        Some(
            (0..runs)
                .map(|t| (t * c + share.start, share.len() as u32))
                .collect(),
        )
    }

    /// The bands of rows its lanes deal its images in (`kernels::share`): with more
    /// lanes than its images have channels, `lanes / C`, each lane a channel's band of
    /// rows (a convolution in bands on either side: `Dense::bands`); else 1.
    pub fn bands(&self, lanes: u32) -> u32 {
        match self.width_of() {
            Some((w, true)) if w > 0 && lanes > w => lanes / w,
            _ => 1,
        }
    }

    /// In bands (`bands`), what lane `lane` of `lanes` holds of a sample of image `n`:
    /// its channel's band of rows, the image's rows, and a row's words; none out of
    /// bands or for a value that is not an image.
    fn band_share(&self, n: NodeIndex, lanes: u32, lane: u32) -> Option<(Share, u32, u32)> {
        let bands = self.bands(lanes);
        let (h, w, c) = self.image(n).filter(|_| bands > 1)?;
        Some((share(c, h, bands, lanes, lane), h, w))
    }

    /// The tensors of lane `lane` of `lanes` that hold a part of their value (in bands:
    /// its sums over the batch, each lane's over its band: `Laid::summed`).
    pub fn summed(&self, lanes: u32) -> Vec<String> {
        if self.bands(lanes) < 2 {
            return Vec::new();
        }
        // (not those the lanes of a channel sum together: `grouped_sums`)
        let lv = self.levels();
        (self.nodes().iter())
            .filter(|&&n| self.f.class[n.index()] == Class::Batch && !self.read_in_step(&lv, n))
            .map(|&n| super::super::form::key(n))
            .collect()
    }

    /// Whether sum over the batch `acc` is read within the step: by a step value its
    /// samples read (`Levels::mids`) or by code of a later level (a batch norm's
    /// statistics), not only by the update.
    fn read_in_step(&self, lv: &levels::Levels, acc: NodeIndex) -> bool {
        let reads =
            |n: &NodeIndex| (self.g.operands(*n).into_iter()).any(|o| self.f.resolve(o) == acc);
        lv.mids.iter().any(|(n, _)| reads(n)) || lv.code.values().flatten().any(reads)
    }

    /// Whether on `lanes` lanes, in bands, the lanes of a channel sum its statistics of
    /// the batch together (`grouped_sums`), on the colours of `rows`.
    pub fn sums_in_bands(&self, lanes: u32) -> bool {
        self.bands(lanes) > 1 && self.f.barriers[self.k]
    }

    /// In bands (`bands`), an error for what its lanes have no code for yet: only
    /// elementwise work on the images (an activation, a bias and their gradients),
    /// moves of their pixels (a depthwise convolution's padding, windows and strides:
    /// `halo`), poolings and their gradients (`pool`), and sums of each channel over the
    /// batch (a bias's gradient, a batch norm's statistics: `grouped_sums`) run; a
    /// reduction within a sample would need the lanes of a channel to work together
    /// sample by sample.
    fn in_bands(&self, lanes: u32) -> Result<(), String> {
        if self.bands(lanes) < 2 {
            return Ok(());
        }
        let g = self.g;
        let refused = |what: &str| {
            Err(format!(
                "{what} over an image in bands of rows has no wafer kernel yet"
            ))
        };
        for &n in self.nodes() {
            let node = g.node(n);
            let ok = match self.f.class[n.index()] {
                // (a move of its pixels, along its rows too: `halo`)
                Class::Sample => {
                    let src = self.f.resolve(g.operands(n)[0]);
                    let rank = node.ty.rank();
                    let same_channels = planes(g, src).map(|p| p.1) == planes(g, n).map(|p| p.1);
                    self.row_layout(n).is_some()
                        && (lower::elementwise(&node.op)
                            || matches!(node.op, Op::BroadcastTo)
                            || moves_pixels(&node.op, rank)
                            || pooling(&node.op)
                            || (matches!(node.op, Op::Reshape)
                                && self.row_layout(src).is_some()
                                && same_channels))
                }
                Class::Batch => {
                    matches!(&node.op, Op::Reduce { axes, .. } if axes.as_slice() == [0, 1, 2])
                }
                _ => true,
            };
            if !ok {
                return refused(&format!("`{}`", node.op.name()));
            }
        }
        Ok(())
    }

    /// Whether it has a backward pass (an input of it: an output gradient).
    fn has_backward(&self) -> bool {
        self.inputs.iter().any(|i| i.bwd)
    }

    /// Whether `n` gives a step value to every sample alike (`broadcast_to` of a
    /// statistic of the batch, or of a value made from one).
    fn of_step(&self, n: NodeIndex) -> bool {
        let src = self.g.operands(n).first().map(|&o| self.f.resolve(o));
        matches!(self.g.node(n).op, Op::BroadcastTo)
            && src.is_some_and(|s| matches!(self.f.class[s.index()], Class::Step | Class::Batch))
    }

    /// The features a sample of rank-2 value `n` has (`[B, N]`: `N`; `[B]`, a scalar
    /// a sample: 1; 0 for another).
    fn row_width(&self, n: NodeIndex) -> usize {
        let ty = self.g.ty(n);
        match ty.shape.as_slice() {
            [b, w] if *b == self.f.batch as usize => *w,
            [b] if *b == self.f.batch as usize => 1,
            _ => 0,
        }
    }

    /// Whether `n` sums (or averages) a sequence over its tokens (`reduce_mean(x, axis:
    /// 1)`), which each lane does for its share of the features.
    fn pools_tokens(&self, n: NodeIndex) -> bool {
        self.sums_sequence(n, 1)
    }

    /// Whether `n` reduces each token of a sequence along its features (a layer norm's
    /// `reduce_mean(x, axis: 2)`, its dims kept or not), which several lanes do
    /// together (`rows`, a word a token).
    fn along_tokens(&self, n: NodeIndex) -> bool {
        let src = || self.f.resolve(self.g.operands(n)[0]);
        self.sums_sequence(n, 2) && self.tokens(src()).is_some_and(|(_, w)| w > 1)
    }

    /// Whether `n` sums (or averages) a sequence along `axis` alone.
    fn sums_sequence(&self, n: NodeIndex, axis: usize) -> bool {
        let Op::Reduce { op, axes, .. } = &self.g.node(n).op else {
            return false;
        };
        let src = self.f.resolve(self.g.operands(n)[0]);
        matches!(op, crate::ir::ReduceOp::Sum | crate::ir::ReduceOp::Mean)
            && self.tokens(src).is_some()
            && axes.as_slice() == [axis]
    }

    /// How operand `o` is given to every word of `n`, a sequence of `T` tokens of `N`
    /// features: a value per token over its features (`[B, T, 1]`: a layer norm's
    /// mean), or a value per feature for every token (a bias `[N]`, a sample's `[B, N]`
    /// or `[B, 1, N]`: a pooling's gradient); `None` otherwise. By `o`'s own type, not
    /// the value it names (`[B, T]` made `[B, T, 1]` is a value per token).
    fn given_to_tokens(&self, o: NodeIndex, n: NodeIndex) -> Option<Given> {
        let (tokens, width) = self.tokens(n)?;
        let ty = self.g.ty(o);
        let last = ty.shape.last().copied().unwrap_or(1) as u32;
        let per = match self.f.class[self.f.resolve(o).index()] {
            Class::Sample => ty.elements() / self.f.batch.max(1) as usize,
            _ => ty.elements(),
        } as u32;
        if last == 1 && per == tokens {
            Some(Given::PerToken)
        } else if last == width && per == width {
            Some(Given::PerFeature)
        } else {
            None
        }
    }

    /// Whether `n` is a value per token of a sequence (`[B, T, 1]`) in a kernel of
    /// wider sequences, which every lane holds whole.
    fn token_scalar(&self, n: NodeIndex) -> bool {
        self.tokens(n).is_some_and(|(_, w)| w == 1)
            && (self
                .nodes()
                .iter()
                .chain(self.inputs.iter().map(|p| &p.node)))
            .any(|&m| self.tokens(m).is_some_and(|(_, w)| w > 1))
    }

    /// A sequence's tokens and features when `n` is a sample's sequence (`[B, T, N]`,
    /// token by token; not an image's planes).
    fn tokens(&self, n: NodeIndex) -> Option<(u32, u32)> {
        match self.g.ty(n).shape.as_slice() {
            &[b, t, w] if b == self.f.batch as usize => Some((t as u32, w as u32)),
            _ => None,
        }
    }

    /// Whether `n` reduces a sample's features to one (`reduce_sum(x, 1, keep_dims)`),
    /// which several lanes do together (`rows`).
    fn along_rows(&self, n: NodeIndex) -> bool {
        let Op::Reduce { axes, .. } = &self.g.node(n).op else {
            return false;
        };
        let src = self.f.resolve(self.g.operands(n)[0]);
        axes.as_slice() == [1] && self.row_width(src) > 1 && self.row_width(n) == 1
    }

    /// Whether `n` is the position of a sample's largest (or smallest) feature
    /// (`argmax(x, 1)`), which several lanes find together when they softmax across
    /// them (`across`).
    fn arg_across(&self, n: NodeIndex) -> bool {
        let (Op::ArgMax { axis } | Op::ArgMin { axis }) = self.g.node(n).op else {
            return false;
        };
        let src = self.f.resolve(self.g.operands(n)[0]);
        axis == 1 && self.row_width(src) > 1
    }

    /// Whether it reduces along a sample's features (on several lanes, it then needs
    /// the colours of `rows`).
    pub fn reduces_rows(&self) -> bool {
        // (a heads kernel's lanes reduce within their heads)
        if self.work_out_width().is_none() {
            return false;
        }
        (self.nodes().iter()).any(|&n| {
            let across = self.across
                && (self.arg_across(n)
                    || matches!(
                        self.g.node(n).op,
                        Op::Softmax { .. } | Op::LogSoftmax { .. }
                    ));
            self.f.class[n.index()] == Class::Sample
                && (self.along_rows(n) || self.along_tokens(n) || across)
        })
    }

    /// The elements of node `n` on lane `lane` of `lanes`: a sample's share of a
    /// sample value, a variable's or sum's share, or one.
    fn extent(&self, n: NodeIndex, lanes: u32, lane: u32) -> u32 {
        let ty = self.g.ty(n);
        let planar = planes(self.g, n).or_else(|| self.image(n).map(|(h, w, c)| (h * w, c)));
        if let (Some((pixels, c)), Class::Sample) = (planar, self.f.class[n.index()]) {
            // some channels' planes, or a channel's band of rows (of an image, or of its
            // rows regrouped)
            if let (Some(r), Some((_, words))) =
                (self.band_rows(n, lanes, lane), self.row_layout(n))
            {
                return r.len() as u32 * words;
            }
            return split(c, lanes, lane).len() as u32 * pixels;
        }
        if let Some(runs) = self.channel_runs(n, lanes, lane) {
            return runs.iter().map(|r| r.1).sum();
        }
        if let (Some((t, w)), Class::Sample) = (self.tokens(n), self.f.class[n.index()]) {
            // its share of every token, or a value per token whole
            if self.token_scalar(n) {
                return t;
            }
            return t * split(w, lanes, lane).len() as u32;
        }
        if self.along_tokens(n) {
            return self.g.ty(n).shape[1] as u32;
        }
        let per = match self.f.class[n.index()] {
            Class::Sample | Class::SampleT => ty.shape.iter().skip(1).product::<usize>(),
            _ => ty.elements(),
        } as u32;
        // (a value it passes on is dealt as the layers on either side deal it, even of
        // one word: the first lane has it)
        let passed = (self.f.passed(self.k)).is_some_and(|c| c.x == n || c.grad == Some(n));
        if lanes > 1 && (per > 1 || passed) {
            split(per, lanes, lane).len() as u32
        } else {
            per
        }
    }

    /// The flat elements of node `n` that lane `lane` holds (one run; a heads kernel's
    /// lane, its heads' runs).
    fn runs(&self, n: NodeIndex, lanes: u32, lane: u32) -> Vec<(u32, u32)> {
        if let Some((_, runs)) = self.dealt_runs(n) {
            return runs;
        }
        if let (Some((s, h, w)), Class::Sample) =
            (self.band_share(n, lanes, lane), self.f.class[n.index()])
        {
            let words = s.words(h, w);
            return vec![(words.start, words.len() as u32)];
        }
        if let Some(runs) = self.channel_runs(n, lanes, lane) {
            return runs;
        }
        if self.token_scalar(n) || self.along_tokens(n) {
            return vec![(0, self.extent(n, lanes, lane))];
        }
        if let (Some((t, w)), Class::Sample, true) =
            (self.tokens(n), self.f.class[n.index()], lanes > 1)
        {
            let s = split(w, lanes, lane);
            return (0..t).map(|i| (i * w + s.start, s.len() as u32)).collect();
        }
        let ext = self.extent(n, lanes, lane);
        if lanes > 1 && ext > 0 && self.extent(n, 1, 0) > 1 {
            let per = self.extent(n, 1, 0);
            vec![(split(per, lanes, lane).start, ext)]
        } else {
            vec![(0, ext)]
        }
    }

    /// Lane `lane` of `lanes` (of a heads kernel on several: its local view's one lane,
    /// `dealt_lane`).
    pub fn lane(&self, lanes: u32, lane: u32) -> Result<Lane, String> {
        match self.heads() {
            Some(h) if lanes > 1 => self.dealt_lane(h, lanes, lane),
            _ => self.build(lanes, lane, None),
        }
    }

    /// Whether it can run as replicas, each taking one sample in so many
    /// (`replica`, `dealer`): it runs on one lane, has no backward phase, and sends
    /// nothing while a sample passes (only the gradients it holds back to the step's
    /// end, and sums over the batch the host reads), as a loss.
    pub fn replicable(&self) -> bool {
        let phases = self.phases();
        !self.f.barriers[self.k]
            && self.width().is_none()
            && self.inputs.iter().all(|i| !i.bwd)
            && (self.outputs.iter()).all(|o| o.bwd && phases.get(&o.node) == Some(&0))
    }

    /// A replica of a one-lane kernel: the lane's program for the samples the dealer
    /// sends it (one in `rep.of`), all its inputs on `rep.to`. It sends each sample's
    /// gradients back as it computes them; at the step's end it sends its sums over the
    /// batch back to the dealer and takes every replica's total from it.
    pub fn replica(&self, rep: Rep) -> Result<Lane, String> {
        self.build(1, 0, Some(rep))
    }
}
