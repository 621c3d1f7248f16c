//! Fused vector kernels: the sample and batch nodes between two layers (a bias and its
//! activation, the activation's gradient, a softmax with its cross-entropy and their
//! gradient) as one program per lane. A kernel of `L` lanes deals a sample's `N`
//! features to `L` PEs (`split(N, L, l)`), which elementwise groups allow, and groups
//! whose reductions within a sample are along its features (a layer norm's: the lanes
//! reduce together, `rows`); any other reduction within a sample (a softmax, an argmax,
//! a one-hot) runs on one lane.
//!
//! Tasks, one per phase: the forward task runs when a sample's forward inputs arrive,
//! the backward task when its output gradients do, in the order of the 1F1B schedule
//! (`pipeline`). Values the backward task reads from the forward one are stashed, one
//! slot per sample of its window. Sums over the batch accumulate as samples pass; after
//! the step's last sample, a finishing task divides the means. A gradient computed in
//! the forward task (a loss's, which needs no output gradient) goes back in the
//! sample's backward task, or, in a kernel without one, as soon as it is computed.

use super::super::form::{self, constant, image, key, Class, Formed, Kind};
use super::super::isa::{Colour, Dsd, Instr, Program, Src, Task, Trigger, VecOp};
use super::super::lower::{self, vec, Scratch, Val};
use super::super::pipeline::Pipeline;
use super::rows::{self, RowColours};
use super::{nest, split, Piece, UPDATE};
use crate::ir::{window_pad, Graph, NodeIndex, Op, ReduceOp, UnaryOp};
use std::collections::BTreeMap;

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
}

/// A lane's program, initial memory and tensors (pieces without their PE).
pub struct Lane {
    pub program: Program,
    pub memory: Vec<f32>,
    pub tensors: Vec<(String, Piece)>,
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

/// `dst = src`, word by word (either may be a stream).
fn mov(dst: Dsd, src: Dsd) -> Instr {
    Instr::Vec {
        op: VecOp::Mov,
        dst,
        srcs: vec![Src::V(src)],
    }
}

/// What a log-softmax computed on the way, in scratch of the current phase: its rows'
/// exponentials (of `x` less the row's maximum) and their sums, `outer` rows of
/// `inner`.
#[derive(Debug, Clone, Copy)]
struct Soft {
    e: Val,
    s: Val,
    outer: u32,
    inner: u32,
}

/// `dst = e / s` row by row: each row's reciprocal once (in software), then a multiply.
fn normalise(
    dst: Val,
    e: Val,
    s: Val,
    outer: u32,
    inner: u32,
    scratch: &mut Scratch,
) -> [Instr; 2] {
    let r = scratch.alloc(outer);
    [
        vec(VecOp::Div, r, &[Val::Imm(1.0), s], outer),
        per_row(VecOp::Mul, dst, e, r, outer, inner),
    ]
}

impl Vector<'_> {
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
        let g = self.g;
        let b = self.f.batch as usize;
        let mut width = None;
        // the width, and whether it counts an image's channels
        let mut agree = |n: usize, planes: bool| match width {
            None => {
                width = Some((n, planes));
                true
            }
            Some(w) => w == (n, planes),
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
                Class::Sample if node.ty.rank() == 4 => {
                    agree(node.ty.shape[3], true)
                        && (lower::elementwise(&node.op) || pooling(&node.op))
                }
                Class::Sample if wide && self.row_width(n) == 1 => {
                    lower::elementwise(&node.op) || self.along_rows(n)
                }
                Class::Sample => {
                    node.ty.rank() == 2
                        && node.ty.shape[0] == b
                        && agree(node.ty.shape[1], false)
                        && (lower::elementwise(&node.op)
                            || matches!(node.op, Op::CheckIndices { .. })
                            || (matches!(node.op, Op::BroadcastTo)
                                && src.is_some_and(|s| self.row_width(s) == 1)))
                }
                Class::Batch => {
                    let planes = src.is_some_and(|s| g.ty(s).rank() == 4);
                    let axes: &[usize] = if planes { &[0, 1, 2] } else { &[0] };
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
        for p in &self.inputs {
            let ty = g.ty(p.node);
            let ok = match (self.image(p.node), ty.rank()) {
                (Some((_, _, c)), _) => agree(c as usize, true),
                (None, 2) if wide && ty.shape[1] == 1 => true,
                (None, 2) => agree(ty.shape[1], false),
                _ => false,
            };
            if !ok {
                return None;
            }
        }
        width.map(|w| w.0 as u32)
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

    /// Whether `n` reduces a sample's features to one (`reduce_sum(x, 1, keep_dims)`),
    /// which several lanes do together (`rows`).
    fn along_rows(&self, n: NodeIndex) -> bool {
        let Op::Reduce { axes, .. } = &self.g.node(n).op else {
            return false;
        };
        let src = self.f.resolve(self.g.operands(n)[0]);
        axes.as_slice() == [1] && self.row_width(src) > 1 && self.row_width(n) == 1
    }

    /// Whether it reduces along a sample's features (on several lanes, it then needs
    /// the colours of `rows`).
    pub fn reduces_rows(&self) -> bool {
        (self.nodes().iter())
            .any(|&n| self.f.class[n.index()] == Class::Sample && self.along_rows(n))
    }

    /// The elements of node `n` on lane `lane` of `lanes`: a sample's share of a
    /// sample value, a variable's or sum's share, or one.
    fn extent(&self, n: NodeIndex, lanes: u32, lane: u32) -> u32 {
        let ty = self.g.ty(n);
        if let (Some((h, w, c)), Class::Sample) = (self.image(n), self.f.class[n.index()]) {
            // some channels' planes
            return split(c, lanes, lane).len() as u32 * h * w;
        }
        let per = match self.f.class[n.index()] {
            Class::Sample | Class::SampleT => ty.shape.iter().skip(1).product::<usize>(),
            _ => ty.elements(),
        } as u32;
        if lanes > 1 && per > 1 {
            split(per, lanes, lane).len() as u32
        } else {
            per
        }
    }

    /// The flat elements of node `n` that lane `lane` holds (one run).
    fn runs(&self, n: NodeIndex, lanes: u32, lane: u32) -> Vec<(u32, u32)> {
        let ext = self.extent(n, lanes, lane);
        if lanes > 1 && ext > 0 && self.extent(n, 1, 0) > 1 {
            let per = self.extent(n, 1, 0);
            vec![(split(per, lanes, lane).start, ext)]
        } else {
            vec![(0, ext)]
        }
    }

    /// The phase of each of its nodes and inputs: 1 when it depends on a backward
    /// input.
    fn phases(&self) -> BTreeMap<NodeIndex, u8> {
        let mut ph = BTreeMap::new();
        for p in &self.inputs {
            ph.insert(p.node, u8::from(p.bwd));
        }
        for &n in self.nodes() {
            let p = self
                .g
                .operands(n)
                .iter()
                .map(|&o| ph.get(&self.f.resolve(o)).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            ph.insert(n, p);
        }
        // a forward value only the backward task reads is computed there, from what it
        // reads (which the backward task then stashes instead, if anything: one value
        // of the same size, or none, since it reads stashed values)
        let mine: std::collections::BTreeSet<NodeIndex> = self.nodes().iter().copied().collect();
        for &n in self.nodes().iter().rev() {
            let node = self.g.node(n);
            if ph.get(&n) != Some(&0)
                || self.f.class[n.index()] != Class::Sample
                || !lower::elementwise(&node.op)
                || self.outputs.iter().any(|o| o.node == n)
            {
                continue;
            }
            let mut users = self
                .g
                .g
                .neighbors_directed(n, petgraph::Direction::Outgoing)
                .peekable();
            let late = users.peek().is_some()
                && users.all(|u| mine.contains(&u) && ph.get(&u) == Some(&1));
            let small = self.g.operands(n).iter().all(|&o| {
                let o = self.f.resolve(o);
                constant(self.g, o).is_some() || self.g.ty(o).elements() == node.ty.elements()
            });
            if late && small {
                ph.insert(n, 1);
            }
        }
        ph
    }

    /// Lane `lane` of `lanes`.
    pub fn lane(&self, lanes: u32, lane: u32) -> Result<Lane, String> {
        self.build(lanes, lane, None)
    }

    /// Whether it can run as replicas, each taking one sample in so many
    /// (`replica`, `dealer`): it runs on one lane, has no backward phase, and sends
    /// nothing while a sample passes (only the gradients it holds back to the step's
    /// end, and sums over the batch the host reads), as a loss.
    pub fn replicable(&self) -> bool {
        let phases = self.phases();
        self.width().is_none()
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

    /// The dealer of `to.len()` replicas (`to`: each one's colours to it and back):
    /// it takes each sample's inputs and sends them on to one replica in turn (a
    /// counter per replica, started so that each reaches its count on that replica's
    /// samples), and passes each sample's gradients on toward the layers as they come
    /// back, a task per replica taken in turn (its pipeline: it deals a replica a
    /// sample only once its previous one came back). After the step's last gradient it
    /// sums the replicas' sums over the batch and sends the total to each.
    /// With a `fan`, it gathers that input from the rows of the layer before it, and
    /// sends its gradient back to them in shares.
    pub fn dealer(&self, to: &[(Colour, Colour)], fan: Option<&Fan>) -> Result<Program, String> {
        let f = self.f;
        let r = to.len() as u32;
        if r < 2 || r > u32::from(super::super::isa::COUNTERS) - 1 || !f.batch.is_multiple_of(r) {
            return Err(format!("{r} replicas of a batch of {}", f.batch));
        }
        let phases = self.phases();
        let mut p = Program::default();
        let ins: Vec<(Port, u32, u32)> = (self.inputs.iter())
            .map(|i| {
                let ext = self.extent(i.node, 1, 0);
                (*i, ext, p.alloc(&format!("{} in", key(i.node)), ext))
            })
            .collect();
        let sums: u32 = (self.nodes().iter())
            .filter(|&&n| f.class[n.index()] == Class::Batch)
            .map(|&n| self.extent(n, 1, 0))
            .sum();
        let total = (sums > 0).then(|| p.alloc("sums", sums));
        let back: Vec<(Port, u32)> = (self.outputs.iter())
            .filter(|o| o.bwd && phases.get(&o.node) == Some(&0))
            .map(|o| (*o, self.extent(o.node, 1, 0)))
            .collect();
        // a stream's shares: (offset, length, colour), one for a stream no fan gathers
        let shares = |port: &Port, len: u32, bwd: bool| -> Vec<(u32, u32, Colour)> {
            let fanned = fan.filter(|f| {
                if bwd {
                    f.grad == Some(port.node)
                } else {
                    f.input == port.node
                }
            });
            match fanned {
                Some(f) => (f.shares(len))
                    .map(|(at, n, c)| (at, n, if bwd { c.1 } else { c.0 }))
                    .collect(),
                None => vec![(0, len, port.colour)],
            }
        };
        for (k, &(c, _)) in to.iter().enumerate() {
            p.tasks.push(Task {
                id: 2 * k as u8,
                name: format!("deal to replica {k}"),
                trigger: Trigger::Local { at_start: false },
                body: (ins.iter())
                    .map(|&(_, len, base)| mov(Dsd::Out { colour: c, len }, Dsd::mem(base, len)))
                    .collect(),
            });
        }
        let Some(first) = ins.first() else {
            return Err("a vector kernel without inputs".into());
        };
        let gather = (sums > 0).then_some(2 * r as u8 + 2);
        let mut take: Vec<Instr> = (ins.iter())
            .flat_map(|&(i, len, base)| {
                (shares(&i, len, false).into_iter()).map(move |(at, len, colour)| {
                    mov(Dsd::mem(base + at, len), Dsd::In { colour, len })
                })
            })
            .collect();
        take.extend((0..r).map(|k| Instr::Count {
            counter: k as u8,
            every: r,
            then: Some(2 * k as u8),
        }));
        // the step's end: after its last gradient passed, or its last sample
        let end = Instr::Count {
            counter: r as u8,
            every: f.batch,
            then: gather,
        };
        if back.is_empty() && gather.is_some() {
            take.push(end.clone());
        }
        let take_id = 2 * r as u8;
        p.tasks.push(Task {
            id: take_id,
            name: "take".into(),
            trigger: Trigger::Data(first.0.colour),
            body: take,
        });
        // each replica's gradients on toward the layers (odd ids: the backward pass)
        let returns: Vec<u8> = (0..r as u8).map(|k| take_id + 1 + 2 * k).collect();
        if !back.is_empty() {
            for (&(_, b), &id) in to.iter().zip(&returns) {
                let mut body: Vec<Instr> = (back.iter())
                    .flat_map(|(port, len)| {
                        (shares(port, *len, true).into_iter()).map(move |(_, len, c)| {
                            mov(Dsd::Out { colour: c, len }, Dsd::In { colour: b, len })
                        })
                    })
                    .collect();
                if gather.is_some() {
                    body.push(end.clone());
                }
                p.tasks.push(Task {
                    id,
                    name: format!("return from replica {}", (id - take_id) / 2),
                    trigger: Trigger::Data(b),
                    body,
                });
            }
            p.pipeline = Some(Pipeline {
                forward: take_id,
                backward: returns.clone(),
                window: self.window.max(1),
                samples: f.batch,
            });
            // room for the gradients a replica sends while the dealer deals the others
            let out = self.window.div_ceil(r);
            for (&(_, b), &id) in to.iter().zip(&returns) {
                let words = p.receives(id, b) as u32;
                p.fifo(b, out * words);
            }
        }
        if let Some(id) = gather {
            let mut body = Vec::new();
            if let Some(t) = total {
                let len = sums;
                body.push(vec(VecOp::Mov, Val::buf(t, len), &[Val::Imm(0.0)], len));
                let t = Dsd::mem(t, len);
                for &(_, b) in to {
                    body.push(Instr::Vec {
                        op: VecOp::Add,
                        dst: t.clone(),
                        srcs: vec![Src::V(t.clone()), Src::V(Dsd::In { colour: b, len })],
                    });
                }
                for &(c, _) in to {
                    body.push(mov(Dsd::Out { colour: c, len }, t.clone()));
                }
            }
            p.tasks.push(Task {
                id,
                name: "gather".into(),
                trigger: Trigger::Local { at_start: false },
                body,
            });
        }
        // counter k reaches `r` on replica k's samples
        let prime: Vec<Instr> = (0..r)
            .flat_map(|k| {
                (0..r - 1 - k).map(move |_| Instr::Count {
                    counter: k as u8,
                    every: r,
                    then: None,
                })
            })
            .collect();
        if !prime.is_empty() {
            // (before any take, whatever the timing: the lowest id ready first)
            p.tasks.push(Task {
                id: 2 * r as u8 - 1,
                name: "prime".into(),
                trigger: Trigger::Local { at_start: true },
                body: prime,
            });
        }
        Ok(p)
    }

    /// Lane `lane` of `lanes`, or a replica of the one lane.
    fn build(&self, lanes: u32, lane: u32, rep: Option<Rep>) -> Result<Lane, String> {
        let g = self.g;
        let f = self.f;
        let kr = &f.kernels[self.k];
        let batch = f.batch;
        // the samples it takes in a step
        let samples = rep.map_or(batch, |r| batch / r.of.max(1));
        let mut p = Program::default();
        if let Some(r) = rep {
            p.deal = r.of;
        }
        let mut tensors = Vec::new();
        let mut init: Vec<(u32, Vec<f32>)> = Vec::new();
        let phases = self.phases();
        let name = |n: NodeIndex| match &g.node(n).op {
            Op::Variable { name, .. } => name.clone(),
            _ => key(n),
        };
        // what stays: variables, sums over the batch, the host's values
        let accs: Vec<NodeIndex> = (self.nodes().iter())
            .copied()
            .filter(|&n| f.class[n.index()] == Class::Batch)
            .collect();
        let mut vals: BTreeMap<NodeIndex, Val> = BTreeMap::new();
        for &n in kr.vars.iter().chain(&accs).chain(&kr.hosts) {
            let ext = self.extent(n, lanes, lane);
            let base = p.alloc(&name(n), ext);
            let runs = self.runs(n, lanes, lane);
            tensors.push((
                name(n),
                Piece {
                    pe: (0, 0),
                    word: base,
                    runs,
                },
            ));
            vals.insert(n, Val::buf(base, ext));
        }
        // counting 0, 1, 2, ... (one-hot, argmax)
        let iota_len = (self.nodes().iter())
            .map(|&n| match g.node(n).op {
                Op::OneHot { depth } => depth,
                Op::ArgMax { .. } | Op::ArgMin { .. } => {
                    g.ty(g.operands(n)[0]).shape.last().copied().unwrap_or(1)
                }
                _ => 0,
            })
            .max()
            .unwrap_or(0) as u32;
        let iota = (iota_len > 0).then(|| {
            let base = p.alloc("iota", iota_len);
            init.push((base, (0..iota_len).map(|i| i as f32).collect()));
            base
        });
        // stashes: values of the forward phase the backward task reads
        let has_bwd = self.inputs.iter().any(|i| i.bwd);
        let late: Vec<NodeIndex> = {
            let mut late = Vec::new();
            for &n in self.nodes() {
                for o in g.operands(n) {
                    let o = f.resolve(o);
                    if phases.get(&o) == Some(&0)
                        && phases.get(&n) == Some(&1)
                        && !late.contains(&o)
                    {
                        late.push(o);
                    }
                }
            }
            // gradients computed going forward go back in the backward pass, if any
            for out in &self.outputs {
                let early = out.bwd && phases.get(&out.node) == Some(&0);
                if early && has_bwd && !late.contains(&out.node) {
                    late.push(out.node);
                }
            }
            late
        };
        let mut stash: BTreeMap<NodeIndex, (u32, u32)> = BTreeMap::new();
        for &n in &late {
            let ext = self.extent(n, lanes, lane);
            stash.insert(
                n,
                (
                    p.alloc(&format!("{} stash", key(n)), self.window * ext),
                    ext,
                ),
            );
        }
        let junk = if self.inputs.iter().any(|i| i.whole) {
            p.alloc("dropped", 1)
        } else {
            0
        };
        let mut scratch = Scratch::new(p.words());
        // the values sent on one colour go in one phase (a carried gradient with
        // what carries it: each sample's together)
        let sent_when = |o: &Port| {
            // (a value it passes on goes in the pass it comes in)
            let ph = (phases.get(&o.node).copied()).unwrap_or(u8::from(o.bwd && has_bwd));
            (o.bwd, ph)
        };
        // (each beside the value that carries it: a gradient beside the layer before's
        // output gradient, a value passed on beside the layer after's input)
        let layer = |k: Option<usize>| {
            k.and_then(|k| match &f.kernels.get(k)?.kind {
                Kind::Dense { x, dy, .. } => Some((f.resolve(*x), dy.map(|d| f.resolve(d)))),
                Kind::Vector { .. } => None,
            })
        };
        let (before, after) = (layer(self.k.checked_sub(1)), layer(Some(self.k + 1)));
        for o in self.outputs.iter().filter(|o| o.carried > 0) {
            let by = match o.bwd {
                true => before.and_then(|l| l.1),
                false => after.map(|l| l.0),
            };
            let carrier = (self.outputs.iter()).find(|c| Some(c.node) == by && c.carried == 0);
            if carrier.is_some_and(|c| sent_when(c) != sent_when(o)) {
                return Err("a gradient carried beside another that is computed in the other pass has no wafer kernel yet".into());
            }
        }
        for phase in 0..=u8::from(has_bwd) {
            scratch.reset();
            let mut body = Vec::new();
            let mut cur = vals.clone();
            let slot = SLOT_BASE + phase;
            for (&n, &(base, ext)) in &stash {
                cur.insert(
                    n,
                    Val::Buf {
                        base,
                        len: ext,
                        slot: Some(slot),
                    },
                );
            }
            let ins: Vec<Port> = self
                .inputs
                .iter()
                .filter(|i| u8::from(i.bwd) == phase)
                .copied()
                .collect();
            let Some(first) = ins.first() else {
                return Err("a vector kernel's phase without inputs".into());
            };
            for i in &ins {
                let colour = rep.map_or(i.colour, |r| r.to);
                let ext = self.extent(i.node, lanes, lane);
                let dst = match cur.get(&i.node) {
                    Some(&v) if stash.contains_key(&i.node) => v,
                    _ => scratch.alloc(ext),
                };
                // a whole sample: the words before and after this lane's share dropped
                let (before, after) = if i.whole {
                    let all = self.extent(i.node, 1, 0);
                    let start = self.runs(i.node, lanes, lane).first().map_or(0, |r| r.0);
                    (start, all - start - ext)
                } else {
                    (0, 0)
                };
                let drop = |len: u32| Instr::Vec {
                    op: VecOp::Mov,
                    dst: Dsd::strided(junk, len, 0, &[], None),
                    srcs: vec![Src::V(Dsd::In { colour, len })],
                };
                if before > 0 {
                    body.push(drop(before));
                }
                body.push(Instr::Vec {
                    op: VecOp::Mov,
                    dst: dst.dsd(ext).unwrap_or_else(|| Dsd::mem(0, ext)),
                    srcs: vec![Src::V(Dsd::In { colour, len: ext })],
                });
                if after > 0 {
                    body.push(drop(after));
                }
                cur.insert(i.node, dst);
            }
            let mut means = Vec::new();
            let mut soft = BTreeMap::new();
            for &n in self.nodes() {
                if phases.get(&n) != Some(&phase) {
                    continue;
                }
                self.node(
                    n,
                    (lanes, lane),
                    &mut cur,
                    &stash,
                    &mut scratch,
                    iota,
                    &mut body,
                    &mut means,
                    &mut soft,
                )?;
            }
            for o in &self.outputs {
                // (a gradient computed going forward goes back in the backward pass,
                // from its stash; without one, as soon as it is computed)
                let ph = phases.get(&o.node).copied().unwrap_or(0);
                let now = if o.bwd && has_bwd {
                    phase == 1
                } else {
                    ph == phase
                };
                if !now {
                    continue;
                }
                let ext = self.extent(o.node, lanes, lane);
                let v = cur
                    .get(&f.resolve(o.node))
                    .copied()
                    .ok_or("a stream of a value not computed")?;
                let colour = match rep {
                    Some(r) if o.bwd => r.back,
                    _ => o.colour,
                };
                body.push(Instr::Vec {
                    op: VecOp::Mov,
                    dst: Dsd::Out { colour, len: ext },
                    srcs: vec![v.src(ext)],
                });
            }
            // after the step's last sample: the means, and the gradients held back
            let mut fin = Vec::new();
            if let (Some(r), 0) = (rep, phase) {
                // every replica's sums, through the dealer
                let sums = accs.iter().filter_map(|a| vals[a].dsd(vals[a].elements()));
                let sums: Vec<Dsd> = sums.collect();
                for d in &sums {
                    let len = d.len();
                    fin.push(mov(
                        Dsd::Out {
                            colour: r.back,
                            len,
                        },
                        d.clone(),
                    ));
                }
                for d in sums {
                    let len = d.len();
                    fin.push(mov(d, Dsd::In { colour: r.to, len }));
                }
            }
            for (a, scale) in means {
                fin.push(vec(VecOp::Mul, a, &[a, Val::Imm(scale)], a.elements()));
            }
            let fin_id = 2 + phase;
            if !stash.is_empty() {
                body.push(Instr::Count {
                    counter: slot,
                    every: self.window,
                    then: None,
                });
            }
            if !fin.is_empty() {
                body.push(Instr::Count {
                    counter: SAMPLE_BASE + phase,
                    every: samples,
                    then: Some(fin_id),
                });
            }
            let pass = if phase == 0 { "forward" } else { "backward" };
            p.tasks.push(Task {
                id: phase,
                name: pass.into(),
                trigger: Trigger::Data(rep.map_or(first.colour, |r| r.to)),
                body,
            });
            if !fin.is_empty() {
                p.tasks.push(Task {
                    id: fin_id,
                    name: format!("{pass} finish"),
                    trigger: Trigger::Local { at_start: false },
                    body: fin,
                });
            }
        }
        // the update
        if !kr.steps.is_empty() || !kr.commits.is_empty() || !accs.is_empty() {
            scratch.reset();
            let block: Vec<usize> = kr
                .vars
                .first()
                .map_or(Vec::new(), |&v| g.ty(v).shape.to_vec());
            let u = form::update_of(g, f, self.k, (&kr.vars, &accs, &kr.hosts), &block)
                .map_err(|e| e.message)?;
            let n = kr.vars.first().map_or(1, |&v| self.extent(v, lanes, lane));
            let at = |ns: &[NodeIndex]| -> Vec<Val> { ns.iter().map(|n| vals[n]).collect() };
            let body = u.code(&at(&kr.vars), &at(&accs), &at(&kr.hosts), n, &mut scratch)?;
            p.tasks.push(Task {
                id: UPDATE,
                name: "update".into(),
                trigger: Trigger::Local { at_start: false },
                body,
            });
        }
        if scratch.high > 0 {
            p.alloc("scratch", scratch.high);
        }
        if let Some(r) = rep {
            // room for the samples dealt to it while it computes one
            let words = p.receives(0, r.to) as u32;
            let waiting = self.window.div_ceil(r.of.max(1)).saturating_sub(1);
            p.fifo(r.to, waiting * words);
        }
        if has_bwd {
            p.pipeline = Some(Pipeline {
                forward: 0,
                backward: vec![1],
                window: self.window,
                samples,
            });
            // room for the output gradients that come while it runs forwards
            let mut colours: Vec<Colour> = (self.inputs.iter())
                .filter(|i| i.bwd)
                .map(|i| i.colour)
                .collect();
            colours.dedup();
            for c in colours {
                let words = p.receives(1, c);
                p.fifo(c, self.fifo * words as u32);
            }
        }
        let mut memory = vec![0.0; p.words() as usize];
        for (base, v) in init {
            memory[base as usize..base as usize + v.len()].copy_from_slice(&v);
        }
        Ok(Lane {
            program: p,
            memory,
            tensors,
        })
    }

    /// The code of one node of the current phase.
    #[allow(clippy::too_many_arguments)]
    fn node(
        &self,
        n: NodeIndex,
        (lanes, lane): (u32, u32),
        cur: &mut BTreeMap<NodeIndex, Val>,
        stash: &BTreeMap<NodeIndex, (u32, u32)>,
        scratch: &mut Scratch,
        iota: Option<u32>,
        body: &mut Vec<Instr>,
        means: &mut Vec<(Val, f32)>,
        soft: &mut BTreeMap<NodeIndex, Soft>,
    ) -> Result<(), String> {
        let g = self.g;
        let f = self.f;
        let node = g.node(n);
        let ext = self.extent(n, lanes, lane);
        let ops = g.operands(n);
        let arg = |o: NodeIndex, cur: &BTreeMap<NodeIndex, Val>| -> Result<Val, String> {
            let o = f.resolve(o);
            if let Some(v) = constant(g, o) {
                return Ok(Val::Imm(v));
            }
            cur.get(&o).copied().ok_or_else(|| {
                format!(
                    "`{}` reads a value its kernel does not have",
                    node.op.name()
                )
            })
        };
        if f.alias[n.index()].is_some() {
            return Ok(());
        }
        let args = ops
            .iter()
            .map(|&o| arg(o, cur))
            .collect::<Result<Vec<Val>, String>>()?;
        if f.class[n.index()] == Class::Batch {
            // a sum over the batch: this sample's share, reduced over the sample's own
            // axes first
            let Op::Reduce { op, axes, .. } = &node.op else {
                return Err(format!("`{}` over the batch", node.op.name()));
            };
            let acc = cur[&n];
            let src = ops[0];
            let per = self.extent(src, lanes, lane);
            let part = if per == acc.elements() {
                args[0]
            } else if acc.elements() == 1 || per.is_multiple_of(acc.elements()) {
                // over the whole sample, or (an image) over each channel's plane
                let rows = acc.elements();
                let t = scratch.alloc(rows);
                body.push(vec(VecOp::Mov, t, &[Val::Imm(0.0)], rows));
                body.push(reduce_rows(VecOp::Add, t, args[0], rows, per / rows));
                t
            } else {
                return Err(format!(
                    "a sum over the batch and some of a sample's axes ({axes:?})"
                ));
            };
            body.push(vec(VecOp::Add, acc, &[acc, part], acc.elements()));
            if *op == ReduceOp::Mean {
                let count = g.ty(src).elements() / g.ty(n).elements().max(1);
                means.push((acc, 1.0 / count as f32));
            }
            return Ok(());
        }
        let dst = match stash.get(&n) {
            Some(&(base, len)) => Val::Buf {
                base,
                len,
                slot: Some(SLOT_BASE),
            },
            None => scratch.alloc(ext),
        };
        cur.insert(n, dst);
        let rank = node.ty.rank();
        // the softmax a log-softmax's gradient takes: its exponentials over their row
        // sums, which it computed
        let of_softmax = ops.first().and_then(|&o| soft.get(&f.resolve(o)).copied());
        if let (Op::Unary(UnaryOp::Exp), Some(Soft { e, s, outer, inner })) = (&node.op, of_softmax)
        {
            body.extend(normalise(dst, e, s, outer, inner, scratch));
            return Ok(());
        }
        match &node.op {
            op if lower::elementwise(op) => {
                let from = ops.first().map_or(node.ty.dtype, |&o| g.ty(o).dtype);
                // an image's per-channel operands (a bias) spread over their planes
                let mut args = args;
                if let Some((h, w, _)) = image(g, n) {
                    for a in &mut args {
                        let cl = a.elements();
                        if cl > 1 && cl * h * w == ext {
                            let t = scratch.alloc(ext);
                            body.push(spread(t, *a, cl, h * w));
                            *a = t;
                        }
                    }
                }
                lower::emit(op, dst, &args, ext, (from, node.ty.dtype), body)?;
            }
            op if pooling(op) => {
                // the image pooled and the pooled one
                let (x, y) = match op {
                    Op::MaxPool2d(_) | Op::AvgPool2d(_) => (f.resolve(ops[0]), n),
                    Op::MaxPool2dGrad(_) => (n, f.resolve(ops[1])),
                    _ => (n, f.resolve(ops[0])),
                };
                let (Some(x), Some(y)) = (self.image(x), self.image(y)) else {
                    return Err(format!("`{}` of values not images", op.name()));
                };
                let cl = split(x.2, lanes, lane).len() as u32;
                pool(op, dst, &args, cl, (x.0, x.1), (y.0, y.1), scratch, body)?;
            }
            Op::Reshape => {
                body.push(vec(VecOp::Mov, dst, &args[..1], ext));
            }
            // (a sample's scalar over its features' share on this lane)
            Op::BroadcastTo if lanes > 1 && args[0].elements() == 1 => {
                body.push(vec(VecOp::Mov, dst, &args[..1], ext));
            }
            Op::BroadcastTo => {
                body.push(broadcast(dst, args[0], &g.ty(ops[0]).shape, &node.ty.shape));
            }
            // a transpose of a batch of scalars keeps them where they are
            Op::Transpose { perm } if perm.len() == 1 => {
                body.push(vec(VecOp::Mov, dst, &args[..1], ext));
            }
            Op::Reduce { op, axes, .. } => {
                let (outer, inner, post) = reduced(g.ty(ops[0]).shape.as_slice(), axes)?;
                let (v, init) = match op {
                    ReduceOp::Sum | ReduceOp::Mean => (VecOp::Add, 0.0),
                    ReduceOp::Max => (VecOp::Max, f32::NEG_INFINITY),
                    ReduceOp::Min => (VecOp::Min, f32::INFINITY),
                    ReduceOp::Prod => (VecOp::Mul, 1.0),
                };
                body.push(vec(VecOp::Mov, dst, &[Val::Imm(init)], ext));
                if lanes > 1 && self.along_rows(n) {
                    // this lane's share, then every lane's (`rows`)
                    let mine = self.extent(f.resolve(ops[0]), lanes, lane);
                    body.push(reduce_rows(v, dst, args[0], 1, mine));
                    let c = self.rows.unwrap_or([0; 3]);
                    body.extend(rows::across(v, dst, (lanes, lane), c));
                    if *op == ReduceOp::Mean {
                        body.push(vec(
                            VecOp::Mul,
                            dst,
                            &[dst, Val::Imm(1.0 / inner as f32)],
                            1,
                        ));
                    }
                    return Ok(());
                }
                if post == 1 {
                    body.push(reduce_rows(v, dst, args[0], outer, inner));
                } else {
                    // axes in the middle: each run of the axes after them, accumulated
                    // into its place, for every entry of the reduced ones
                    let acc = at(dst, 0, post, 1, &[post, 0]);
                    body.push(nest(
                        &[outer, inner],
                        Instr::Vec {
                            op: v,
                            dst: acc.clone(),
                            srcs: vec![
                                Src::V(acc),
                                view(args[0], 0, post, 1, &[inner * post, post]),
                            ],
                        },
                    ));
                }
                if *op == ReduceOp::Mean {
                    body.push(vec(
                        VecOp::Mul,
                        dst,
                        &[dst, Val::Imm(1.0 / inner as f32)],
                        ext,
                    ));
                }
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } if *axis + 1 == rank => {
                let (outer, inner) = rows(g.ty(ops[0]).shape.as_slice(), &[*axis])?;
                let x = args[0];
                let m = scratch.alloc(outer);
                body.push(vec(VecOp::Mov, m, &[Val::Imm(f32::NEG_INFINITY)], outer));
                body.push(reduce_rows(VecOp::Max, m, x, outer, inner));
                // t = x - m, row by row
                body.push(per_row(VecOp::Sub, dst, x, m, outer, inner));
                let e = scratch.alloc(ext);
                body.push(vec(VecOp::Exp, e, &[dst], ext));
                let s = scratch.alloc(outer);
                body.push(vec(VecOp::Mov, s, &[Val::Imm(0.0)], outer));
                body.push(reduce_rows(VecOp::Add, s, e, outer, inner));
                if matches!(node.op, Op::LogSoftmax { .. }) {
                    let ls = scratch.alloc(outer);
                    body.push(vec(VecOp::Log, ls, &[s], outer));
                    body.push(per_row(VecOp::Sub, dst, dst, ls, outer, inner));
                    soft.insert(n, Soft { e, s, outer, inner });
                } else {
                    body.extend(normalise(dst, e, s, outer, inner, scratch));
                }
            }
            Op::ArgMax { axis } | Op::ArgMin { axis } if *axis + 1 == rank + 1 => {
                let (outer, inner) = rows(g.ty(ops[0]).shape.as_slice(), &[*axis])?;
                let max = matches!(node.op, Op::ArgMax { .. });
                let x = args[0];
                let m = scratch.alloc(outer);
                let (best, init) = if max {
                    (VecOp::Max, f32::NEG_INFINITY)
                } else {
                    (VecOp::Min, f32::INFINITY)
                };
                body.push(vec(VecOp::Mov, m, &[Val::Imm(init)], outer));
                body.push(reduce_rows(best, m, x, outer, inner));
                // the first position holding it: min over (x == m ? i : inner)
                let hit = scratch.alloc(outer * inner);
                body.push(per_row(VecOp::Eq, hit, x, m, outer, inner));
                let iota = Val::buf(iota.ok_or("no counting buffer")?, inner);
                for r in 0..outer {
                    let row = |v: Val| match v {
                        Val::Buf { base, len, slot } if len > 1 => Val::Buf {
                            base: base + r * inner,
                            len: inner,
                            slot,
                        },
                        v => v,
                    };
                    body.push(vec(
                        VecOp::Sel,
                        row(hit),
                        &[row(hit), iota, Val::Imm(inner as f32)],
                        inner,
                    ));
                }
                body.push(vec(VecOp::Mov, dst, &[Val::Imm(inner as f32)], ext));
                body.push(reduce_rows(VecOp::Min, dst, hit, outer, inner));
            }
            Op::Slice { axis, start, end } if *axis > 0 => {
                // each run of the sliced axis (and the axes inside it), row by row
                let (shape, axis) = laid(&g.ty(ops[0]).shape, *axis);
                let (outer, inner) = around(&shape, axis);
                let (whole, part) = (shape[axis] as u32 * inner, (end - start) as u32 * inner);
                body.push(nest(
                    &[outer],
                    Instr::Vec {
                        op: VecOp::Mov,
                        dst: at(dst, 0, part, 1, &[part]),
                        srcs: vec![view(args[0], *start as u32 * inner, part, 1, &[whole])],
                    },
                ));
            }
            Op::Concat { axis } if *axis > 0 => {
                // each operand's rows into their place in each row of the result
                let (shape, axis) = laid(&node.ty.shape, *axis);
                let (outer, inner) = around(&shape, axis);
                let whole = shape[axis] as u32 * inner;
                let mut off = 0;
                for (&o, &a) in ops.iter().zip(&args) {
                    let part = laid(&g.ty(o).shape, axis).0[axis] as u32 * inner;
                    // a one-word operand repeats its word
                    let stride = u32::from(a.elements() != 1);
                    body.push(nest(
                        &[outer],
                        Instr::Vec {
                            op: VecOp::Mov,
                            dst: at(dst, off, part, 1, &[whole]),
                            srcs: vec![view(a, 0, part, stride, &[stride * part])],
                        },
                    ));
                    off += part;
                }
            }
            Op::Transpose { perm } if perm.first() == Some(&0) => {
                // the result in the order its axes lie in: a loop over each of them
                // but the last, whose elements are read `stride` apart in the operand
                // (images lie planar: an axis's stride is its place in that order's)
                let (from, to) = (&g.ty(ops[0]).shape, &node.ty.shape);
                let (ri, ro) = (laid_order(from.len()), laid_order(to.len()));
                let si = strides(&laid(from, 0).0);
                let so = strides(&laid(to, 0).0);
                // the operand's stride along the result's `d`th laid axis
                let src = |d: usize| {
                    let a = perm[ro[d]];
                    si[ri.iter().position(|&x| x == a).unwrap_or(0)]
                };
                let last = to.len() - 1;
                let loops: Vec<u32> = (1..last).map(|d| to[ro[d]] as u32).collect();
                let dst_step: Vec<u32> = (1..last).map(|d| so[d]).collect();
                let src_step: Vec<u32> = (1..last).map(src).collect();
                let len = to[ro[last]] as u32;
                body.push(nest(
                    &loops,
                    Instr::Vec {
                        op: VecOp::Mov,
                        dst: at(dst, 0, len, 1, &dst_step),
                        srcs: vec![view(args[0], 0, len, src(last), &src_step)],
                    },
                ));
            }
            Op::OneHot { depth } if ext == *depth as u32 => {
                let iota = Val::buf(iota.ok_or("no counting buffer")?, *depth as u32);
                body.push(vec(VecOp::Eq, dst, &[iota, args[0]], ext));
            }
            other => {
                return Err(format!(
                    "`{}` of {} has no wafer kernel yet",
                    other.name(),
                    node.ty
                ));
            }
        }
        Ok(())
    }
}

/// The order a sample value's axes lie in on the wafer: an image's (rank 4, NHWC in
/// the graph) planar, channel by channel (N, C, H, W); any other's as they are.
fn laid_order(rank: usize) -> Vec<usize> {
    if rank == 4 {
        vec![0, 3, 1, 2]
    } else {
        (0..rank).collect()
    }
}

/// `shape` in the order its axes lie in on the wafer, and where `axis` lies in it.
fn laid(shape: &[usize], axis: usize) -> (Vec<usize>, usize) {
    let order = laid_order(shape.len());
    let at = order.iter().position(|&a| a == axis).unwrap_or(axis);
    (order.iter().map(|&a| shape[a]).collect(), at)
}

/// The rows of a sample (`shape` with the batch first) around `axis`: how many runs of
/// it there are (the axes before it, but the batch), and the elements of one of its
/// entries (the axes after it).
fn around(shape: &[usize], axis: usize) -> (u32, u32) {
    let outer: usize = shape[1..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    (outer as u32, inner as u32)
}

/// Whether an op pools an image (or is pooling's gradient).
fn pooling(op: &Op) -> bool {
    matches!(
        op,
        Op::MaxPool2d(_) | Op::AvgPool2d(_) | Op::MaxPool2dGrad(_) | Op::AvgPool2dGrad(_)
    )
}

/// `len` words of buffer `v` from word `off` on, `stride` apart, moved `step[d]` per
/// iteration of the `d`th loop around it (in `v`'s slot, if it has one); a constant
/// describes no words.
fn at(v: Val, off: u32, len: u32, stride: u32, step: &[u32]) -> Dsd {
    let Val::Buf {
        base,
        len: whole,
        slot,
    } = v
    else {
        return Dsd::mem(0, 0);
    };
    Dsd::strided(
        base + off,
        len,
        stride as i32,
        step,
        slot.map(|c| (c, whole as i32)),
    )
}

/// `v` as a source: the words `at` describes, or the constant.
fn view(v: Val, off: u32, len: u32, stride: u32, step: &[u32]) -> Src {
    match v {
        Val::Imm(x) => Src::Imm(x),
        _ => Src::V(at(v, off, len, stride, step)),
    }
}

/// `op` over `channels x rows` rows, one vector operation per row (`dst` and each
/// source as their first row, moved by their steps).
fn rows_of(op: VecOp, (channels, rows): (u32, u32), dst: Dsd, srcs: Vec<Src>) -> Instr {
    nest(&[channels, rows], Instr::Vec { op, dst, srcs })
}

/// `t` = each of the `cl` words of `v` repeated over a plane of `hw`.
fn spread(t: Val, v: Val, cl: u32, hw: u32) -> Instr {
    let srcs = vec![view(v, 0, hw, 0, &[1])];
    nest(
        &[cl],
        Instr::Vec {
            op: VecOp::Mov,
            dst: at(t, 0, hw, 1, &[hw]),
            srcs,
        },
    )
}

/// A pooling (or its gradient) over `cl` planes of `x` (`h x w`, the image pooled)
/// into `y` (`ho x wo`): `dst` is `y` (pooling) or `x` (a gradient); `args` the op's
/// operands. Windows that cross the image's border (`same` padding, TensorFlow's: the
/// odd row or column after) pool a copy of the image padded with what changes nothing
/// (`-inf` for a maximum, 0 for a sum); an average then divides by the pixels inside
/// each window, as TensorFlow does, and a gradient is taken in the padded planes and
/// its interior kept.
#[allow(clippy::too_many_arguments)]
fn pool(
    op: &Op,
    dst: Val,
    args: &[Val],
    cl: u32,
    (h, w): (u32, u32),
    (ho, wo): (u32, u32),
    scratch: &mut Scratch,
    body: &mut Vec<Instr>,
) -> Result<(), String> {
    let (Op::MaxPool2d(p) | Op::AvgPool2d(p) | Op::MaxPool2dGrad(p) | Op::AvgPool2dGrad(p)) = op
    else {
        return Err(format!("`{}` is no pooling", op.name()));
    };
    let ([kh, kw], [sh, sw]) = (p.window.map(|v| v as u32), p.strides.map(|v| v as u32));
    let (eh, ew) = ((ho - 1) * sh + kh, (wo - 1) * sw + kw);
    if eh <= h && ew <= w {
        return pool_valid(op, dst, args, cl, (h, w), (ho, wo), scratch, body);
    }
    let pad = |len: u32, out: u32, k: u32, s: u32| {
        window_pad(
            len as usize,
            out as usize,
            k as usize,
            s as usize,
            p.padding,
        ) as u32
    };
    let (pt, pl) = (pad(h, ho, kh, sh), pad(w, wo, kw, sw));
    let (hp, wp) = (eh.max(pt + h), ew.max(pl + w));
    let (plane, plane_p) = (h * w, hp * wp);
    let n = cl * plane_p;
    // the image's planes into the interior of padded ones (filled with `fill`)
    let padded = |x: Val, fill: f32, scratch: &mut Scratch, body: &mut Vec<Instr>| {
        let xp = scratch.alloc(n);
        body.push(vec(VecOp::Mov, xp, &[Val::Imm(fill)], n));
        body.push(rows_of(
            VecOp::Mov,
            (cl, h),
            at(xp, pt * wp + pl, w, 1, &[plane_p, wp]),
            vec![view(x, 0, w, 1, &[plane, w])],
        ));
        xp
    };
    // a padded plane's interior into `dst`'s planes
    let interior = |xp: Val, body: &mut Vec<Instr>| {
        body.push(rows_of(
            VecOp::Mov,
            (cl, h),
            at(dst, 0, w, 1, &[plane, w]),
            vec![view(xp, pt * wp + pl, w, 1, &[plane_p, wp])],
        ));
    };
    // an average's correction per output: the window's area over the pixels inside it
    let correction = |scratch: &mut Scratch, body: &mut Vec<Instr>| {
        let ones = scratch.alloc(plane_p);
        body.push(vec(VecOp::Mov, ones, &[Val::Imm(0.0)], plane_p));
        body.push(rows_of(
            VecOp::Mov,
            (1, h),
            at(ones, pt * wp + pl, w, 1, &[0, wp]),
            vec![Src::Imm(1.0)],
        ));
        let fix = scratch.alloc(ho * wo);
        let sum = Op::AvgPool2d(*p);
        pool_valid(&sum, fix, &[ones], 1, (hp, wp), (ho, wo), scratch, body)?;
        // the mean over the whole window, so its area over the pixels inside
        body.push(vec(VecOp::Div, fix, &[Val::Imm(1.0), fix], ho * wo));
        scratch.release(ones);
        Ok::<_, String>(fix)
    };
    // `dst = v * fix`, each plane by the one correction plane
    let by = |dst: Val, v: Val, fix: Val| {
        rows_of(
            VecOp::Mul,
            (cl, ho),
            at(dst, 0, wo, 1, &[ho * wo, wo]),
            vec![
                view(v, 0, wo, 1, &[ho * wo, wo]),
                view(fix, 0, wo, 1, &[0, wo]),
            ],
        )
    };
    match op {
        Op::MaxPool2d(_) | Op::AvgPool2d(_) => {
            let max = matches!(op, Op::MaxPool2d(_));
            let xp = padded(
                args[0],
                if max { f32::NEG_INFINITY } else { 0.0 },
                scratch,
                body,
            );
            pool_valid(op, dst, &[xp], cl, (hp, wp), (ho, wo), scratch, body)?;
            if !max {
                let fix = correction(scratch, body)?;
                body.push(by(dst, dst, fix));
                scratch.release(fix);
            }
            scratch.release(xp);
        }
        Op::MaxPool2dGrad(_) => {
            let xp = padded(args[0], f32::NEG_INFINITY, scratch, body);
            let dxp = scratch.alloc(n);
            pool_valid(
                op,
                dxp,
                &[xp, args[1]],
                cl,
                (hp, wp),
                (ho, wo),
                scratch,
                body,
            )?;
            interior(dxp, body);
            scratch.release(dxp);
            scratch.release(xp);
        }
        _ => {
            let fix = correction(scratch, body)?;
            let dy = scratch.alloc(cl * ho * wo);
            body.push(by(dy, args[0], fix));
            let dxp = scratch.alloc(n);
            pool_valid(op, dxp, &[dy], cl, (hp, wp), (ho, wo), scratch, body)?;
            interior(dxp, body);
            scratch.release(dxp);
            scratch.release(dy);
            scratch.release(fix);
        }
    }
    Ok(())
}

/// `pool` when every window lies inside the image.
#[allow(clippy::too_many_arguments)]
fn pool_valid(
    op: &Op,
    dst: Val,
    args: &[Val],
    cl: u32,
    (h, w): (u32, u32),
    (ho, wo): (u32, u32),
    scratch: &mut Scratch,
    body: &mut Vec<Instr>,
) -> Result<(), String> {
    let (Op::MaxPool2d(p) | Op::AvgPool2d(p) | Op::MaxPool2dGrad(p) | Op::AvgPool2dGrad(p)) = op
    else {
        return Err(format!("`{}` is no pooling", op.name()));
    };
    let ([kh, kw], [sh, sw]) = (p.window.map(|v| v as u32), p.strides.map(|v| v as u32));
    if (ho - 1) * sh + kh > h || (wo - 1) * sw + kw > w {
        return Err(format!(
            "`{}` whose windows cross the image's border (padding)",
            op.name()
        ));
    }
    let dims = (cl, ho);
    // a window position's input pixels, per output row; an output row
    let win_at = |v: Val, (r, c): (u32, u32)| at(v, r * w + c, wo, sw, &[h * w, sh * w]);
    let out_at = |v: Val| at(v, 0, wo, 1, &[ho * wo, wo]);
    let win = |v: Val, (r, c): (u32, u32)| view(v, r * w + c, wo, sw, &[h * w, sh * w]);
    let out = |v: Val| view(v, 0, wo, 1, &[ho * wo, wo]);
    let taps: Vec<(u32, u32)> = (0..kh).flat_map(|r| (0..kw).map(move |c| (r, c))).collect();
    let area = Val::Imm(1.0 / (kh * kw) as f32);
    // the maximum of each window of `x` into `m`
    let max = |m: Val, x: Val, body: &mut Vec<Instr>| {
        for (i, &t) in taps.iter().enumerate() {
            let (v, srcs) = if i == 0 {
                (VecOp::Mov, vec![win(x, t)])
            } else {
                (VecOp::Max, vec![out(m), win(x, t)])
            };
            body.push(rows_of(v, dims, out_at(m), srcs));
        }
    };
    match op {
        Op::MaxPool2d(_) => max(dst, args[0], body),
        Op::AvgPool2d(_) => {
            for (i, &t) in taps.iter().enumerate() {
                let (v, srcs) = if i == 0 {
                    (VecOp::Mov, vec![win(args[0], t)])
                } else {
                    (VecOp::Add, vec![out(dst), win(args[0], t)])
                };
                body.push(rows_of(v, dims, out_at(dst), srcs));
            }
            body.push(rows_of(
                VecOp::Mul,
                dims,
                out_at(dst),
                vec![out(dst), area.src(1)],
            ));
        }
        Op::MaxPool2dGrad(_) => {
            // the gradient goes to each window's first maximum
            let (x, dy) = (args[0], args[1]);
            let n = cl * ho * wo;
            let (m, taken, hit) = (scratch.alloc(n), scratch.alloc(n), scratch.alloc(n));
            max(m, x, body);
            body.push(vec(VecOp::Mov, taken, &[Val::Imm(0.0)], n));
            body.push(vec(VecOp::Mov, dst, &[Val::Imm(0.0)], dst.elements()));
            for &t in &taps {
                body.push(rows_of(
                    VecOp::Eq,
                    dims,
                    out_at(hit),
                    vec![win(x, t), out(m)],
                ));
                body.push(rows_of(
                    VecOp::Sel,
                    dims,
                    out_at(hit),
                    vec![out(taken), Src::Imm(0.0), out(hit)],
                ));
                body.push(rows_of(
                    VecOp::Add,
                    dims,
                    out_at(taken),
                    vec![out(taken), out(hit)],
                ));
                body.push(rows_of(
                    VecOp::Fmac,
                    dims,
                    win_at(dst, t),
                    vec![win(dst, t), out(hit), out(dy)],
                ));
            }
            scratch.release(hit);
            scratch.release(taken);
            scratch.release(m);
        }
        _ => {
            let dy = args[0];
            body.push(vec(VecOp::Mov, dst, &[Val::Imm(0.0)], dst.elements()));
            for &t in &taps {
                body.push(rows_of(
                    VecOp::Fmac,
                    dims,
                    win_at(dst, t),
                    vec![win(dst, t), out(dy), area.src(1)],
                ));
            }
        }
    }
    Ok(())
}

/// The words between neighbours along each axis of a row-major `shape`.
fn strides(shape: &[usize]) -> Vec<u32> {
    let mut st = vec![1u32; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        st[d] = st[d + 1] * shape[d + 1] as u32;
    }
    st
}

/// A shape's elements around reduced axes: the runs before them (the batch aside), the
/// entries of the reduced axes, and the elements after them (the reduced axes must be
/// next to each other, after the batch).
fn reduced(shape: &[usize], axes: &[usize]) -> Result<(u32, u32, u32), String> {
    let r = shape.len();
    let mut sorted = axes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let together = sorted.windows(2).all(|w| w[1] == w[0] + 1);
    let (Some(&first), Some(&last)) = (sorted.first(), sorted.last()) else {
        return Err(format!("a reduction over no axes of a rank-{r} value"));
    };
    if first == 0 || !together || last >= r {
        return Err(format!("a reduction over axes {axes:?} of a rank-{r} value (only axes next to each other, within a sample)"));
    }
    let size = |a: &[usize]| a.iter().product::<usize>() as u32;
    Ok((
        size(&shape[1..first]),
        size(&shape[first..=last]),
        size(&shape[last + 1..]),
    ))
}

/// `dst` = `x` (of shape `from`) broadcast to shape `to` (both with the batch first
/// when they are sample values; `from` aligned to the right): a loop over every axis of
/// a sample but the last, one move per run of the last, reading `x` 0 words apart
/// along the axes it is broadcast over.
fn broadcast(dst: Val, x: Val, from: &[usize], to: &[usize]) -> Instr {
    let r = to.len();
    let mut padded = vec![1usize; r.saturating_sub(from.len())];
    padded.extend(from);
    // in the order the result's axes lie in (an image's planar). An operand of the
    // same rank lies in that order too; one of lower rank lies as it is (row-major in
    // its own axes), so its strides are taken in its order, then put in the result's.
    let order = laid_order(r);
    let to: Vec<usize> = laid(to, 0).0;
    let (padded, mut sx) = if from.len() == r {
        let p = laid(&padded, 0).0;
        let s = strides(&p);
        (p, s)
    } else {
        let s = strides(&padded);
        (
            order.iter().map(|&a| padded[a]).collect::<Vec<usize>>(),
            order.iter().map(|&a| s[a]).collect::<Vec<u32>>(),
        )
    };
    let so = strides(&to);
    for d in 0..r {
        if padded[d] == 1 {
            sx[d] = 0;
        }
    }
    if r < 2 {
        // a scalar of each sample, or a value of none: one word each
        return Instr::Vec {
            op: VecOp::Mov,
            dst: at(dst, 0, 1, 1, &[]),
            srcs: vec![view(x, 0, 1, 0, &[])],
        };
    }
    let last = r - 1;
    let loops: Vec<u32> = (1..last).map(|d| to[d] as u32).collect();
    let len = to[last] as u32;
    nest(
        &loops,
        Instr::Vec {
            op: VecOp::Mov,
            dst: at(dst, 0, len, 1, &so[1..last]),
            srcs: vec![view(x, 0, len, sx[last], &sx[1..last])],
        },
    )
}

/// A shape's elements as rows: those before the reduced axes and those in them (the
/// reduced axes must be the last ones, after the batch).
fn rows(shape: &[usize], axes: &[usize]) -> Result<(u32, u32), String> {
    match reduced(shape, axes) {
        Ok((outer, inner, 1)) => Ok((outer, inner)),
        _ => Err(format!(
            "a reduction over axes {axes:?} of a rank-{} value (only the last axes, within a sample)",
            shape.len()
        )),
    }
}

/// `dst[r] = op(dst[r], x[r * inner + i])` over every `i`, for each row `r`: a loop of
/// accumulations into one word each.
fn reduce_rows(op: VecOp, dst: Val, x: Val, outer: u32, inner: u32) -> Instr {
    let acc = at(dst, 0, inner, 0, &[1]);
    nest(
        &[outer],
        Instr::Vec {
            op,
            dst: acc.clone(),
            srcs: vec![Src::V(acc), view(x, 0, inner, 1, &[inner])],
        },
    )
}

/// `dst[r * inner + i] = op(x[r * inner + i], s[r])`: a row's elements against the row's
/// one value.
fn per_row(op: VecOp, dst: Val, x: Val, s: Val, outer: u32, inner: u32) -> Instr {
    // a one-word operand repeats its word
    let many = |v: Val| u32::from(v.elements() != 1);
    nest(
        &[outer],
        Instr::Vec {
            op,
            dst: at(dst, 0, inner, 1, &[inner]),
            srcs: vec![
                view(x, 0, inner, many(x), &[many(x) * inner]),
                view(s, 0, inner, 0, &[many(s)]),
            ],
        },
    )
}
