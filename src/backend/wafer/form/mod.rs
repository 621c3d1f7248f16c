//! Kernel formation: which kernel computes each node of a train (or eval, predict)
//! graph, and the streams between them.
//!
//! The wafer runs a step one sample at a time, so every node is first classed by how it
//! relates to the batch:
//!
//! - **sample**: row `b` of its value depends only on row `b` of the inputs (the
//!   forward and backward passes);
//! - **batch**: a sum (or mean) over the samples (a weight or bias gradient, the loss),
//!   accumulated in place as the samples pass;
//! - **step**: once per step from variables and batch values (the optimiser), run
//!   after the samples by the kernel that holds what it reads;
//! - **host**: from constants and the global step alone (the learning rate and its
//!   schedule), computed by the host and written into the PEs that read it.
//!
//! Then kernels form around the matrix products with a variable (`dense`: forward,
//! input gradient, weight gradient, update); the other sample and batch nodes that touch
//! form the fused elementwise kernels between them (`vector`). A value that crosses from
//! one kernel to another is a stream; a stream into a layer's output gradient, or out of
//! its input gradient, belongs to the backward pass.
//!
//! The passes, in the order `form_surveyed` runs them: `classify` (classes, aliases and
//! blockers), `layers` (the dense layers, their gradients, and what the host computes
//! for them), `groups` (the vector kernels between them, residuals and shortcuts), `order`
//! (kernels in dataflow order), `steps` (where the variables, step nodes and host
//! values live), `streams` (what crosses between kernels); `update` turns a kernel's
//! step nodes into its PEs' update. Every wafer path forms the graph `relay::prepared`
//! makes: without train summaries, and with a relay where a layer's output must pass
//! through a vector kernel after it (a pre-LayerNorm residual's, or a residual around
//! the layer after it). Before formation, the wafer's pass pipeline has fused the
//! dense layers of one value into one (`passes::fuse_products`), whose weight is its
//! variables side by side (`joined`).

mod classify;
mod groups;
mod layers;
mod relay;
mod statistics;
mod steps;
mod streams;
#[cfg(test)]
mod tests;
mod update;

pub use classify::{
    batch_of, classify, image, per_sample_constant, planes, regrouping, regroups, survey, Survey,
};
pub use relay::prepared;
pub use update::{
    feeding, joined_shares, joined_storage, part_update, update_of, update_over, Share,
};

use crate::ir::{DType, Graph, NodeIndex, Op};
use crate::span::Span;
use petgraph::visit::NodeIndexable;

/// How a node relates to the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Sample,
    /// The transpose of a sample value (only as a weight gradient's operand).
    SampleT,
    Batch,
    Step,
    Host,
}

/// Why a graph does not form into wafer kernels: where, what, and what would.
#[derive(Debug, Clone, PartialEq)]
pub struct Unsupported {
    pub span: Span,
    pub message: String,
    pub help: String,
}

/// One kernel of a formed graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    pub kind: Kind,
    /// The variables it holds (for a dense layer, the weight first).
    pub vars: Vec<NodeIndex>,
    /// Its step nodes, in order, and the variables they replace (name, node).
    pub steps: Vec<NodeIndex>,
    pub commits: Vec<(String, NodeIndex)>,
    /// The host's values its code reads (scalars).
    pub hosts: Vec<NodeIndex>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// `fwd = x W`; `bwd = dy W^T` (the input gradient) and `dw = x^T dy` when trained.
    Dense {
        w: NodeIndex,
        x: NodeIndex,
        fwd: NodeIndex,
        dy: Option<NodeIndex>,
        bwd: Option<NodeIndex>,
        dw: Option<NodeIndex>,
        /// Further products summed into `fwd` (which is then their sum), each of an
        /// input the host sends.
        more: Vec<Part>,
        /// What it carries past itself for a residual (`h + f(h W)`).
        carry: Option<Carry>,
    },
    /// Sample and batch nodes, in order.
    Vector { nodes: Vec<NodeIndex> },
}

/// A further product of a layer that sums several (`x W + h U`, the step of a
/// recurrent network): its weight, its input (from the host), the product, and its
/// weight gradient when it trains. Its columns lie beside the layer's own, its partial
/// sums joining theirs in the row's chain.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Part {
    pub w: NodeIndex,
    pub x: NodeIndex,
    pub mm: NodeIndex,
    pub dw: Option<NodeIndex>,
    /// A side part: a layer of the host's inputs whose product is not summed into
    /// the layer's but read beside it by the kernel after it (a tower or a shortcut
    /// of the features that joins the chain there). Its outputs travel in the rows'
    /// chains after the layer's, as a residual's do (`Carry`), and their gradient
    /// (`dy`, when it trains) comes back after the layer's output gradient.
    pub side: bool,
    /// The value a side part's outputs are, which the kernel after the layer reads:
    /// its product, or the sum of several a side layer makes (`e1 + e2`: a wide
    /// model's linear part), which its first part stands for; `mm` for another part.
    pub out: NodeIndex,
    /// Whether it is a further product of a side part of several (`out` is theirs):
    /// its outputs add into that part's in the rows' chains, as a layer's parts add
    /// into the layer's.
    pub joined: bool,
    pub dy: Option<NodeIndex>,
}

impl Part {
    /// Whether its outputs travel beside the layer's as values of their own: a side
    /// part, and not a further product of one.
    pub fn beside(&self) -> bool {
        self.side && !self.joined
    }
}

/// A residual around a layer (`h + f(h W)`): its input `x` is read past it too, by the
/// kernel after it or one further on (the kernels between pass it on:
/// `Formed::passed`), and the layer carries it there along its rows' chains beside its
/// outputs; the gradient that way comes back beside its output gradient, and the layer
/// adds it into its input gradient along its columns' chains, which then sends the
/// sum (`bwd` is the sum). Or another value the kernel before the layer makes beside
/// its input and a kernel after the layer reads (an LSTM's cell state, read by the
/// next step's gates past the step's product): the layer takes it after its input
/// and carries it as a kernel passing it on does, its gradient going back after the
/// layer's input gradient (`Formed::carries_beside`).
///
/// Or, `first`, a shortcut beside another layer of the same input (ResNet's projection,
/// a 1x1 convolution of a block's input beside the block's first convolution): the
/// shortcut's layer comes just before that other layer and carries its input to it
/// ahead of its own outputs, which the kernels after pass on to the sum
/// (`shortcuts`); the other layer's input gradient comes back ahead of the shortcut's
/// output gradient, and the shortcut adds it into its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Carry {
    pub x: NodeIndex,
    /// The skip's gradient (the gradient of `x` that the kernels after the layer
    /// make), when the layer sends one back.
    pub grad: Option<NodeIndex>,
    /// Whether the layer carries `x` ahead of its outputs to the layer after it, which
    /// reads it as its input (a shortcut's).
    pub first: bool,
}

impl Kernel {
    /// A layer's forward node (its outputs), none for a vector kernel.
    pub fn fwd(&self) -> Option<NodeIndex> {
        match self.kind {
            Kind::Dense { fwd, .. } => Some(fwd),
            Kind::Vector { .. } => None,
        }
    }
}

/// Layer `kind`'s own product: its `fwd` when it has no further parts, else the
/// product its sums start from.
pub fn product(g: &Graph, kind: &Kind) -> Option<NodeIndex> {
    let Kind::Dense { fwd, more, .. } = kind else {
        return None;
    };
    let mut n = *fwd;
    while !more.is_empty() && matches!(g.node(n).op, Op::Binary(crate::ir::BinaryOp::Add)) {
        let ops = g.operands(n);
        n = if more.iter().any(|p| p.mm == ops[1]) {
            ops[0]
        } else {
            ops[1]
        };
    }
    Some(n)
}

/// Where a stream starts or ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum End {
    /// The host: an input it sends, or a per-sample output it collects.
    Host,
    Kernel(usize),
}

/// A value crossing from one kernel to others, sample by sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    pub node: NodeIndex,
    pub from: End,
    pub to: Vec<End>,
    /// Part of the backward pass.
    pub bwd: bool,
}

/// A graph formed into kernels.
#[derive(Debug, Clone)]
pub struct Formed {
    pub batch: u32,
    pub class: Vec<Class>,
    /// The kernel of each node (by index), if any.
    pub owner: Vec<Option<usize>>,
    pub kernels: Vec<Kernel>,
    pub streams: Vec<Stream>,
    /// What the host computes each step, in order (for the kernels and the outputs).
    pub host: Vec<NodeIndex>,
    /// What the host computes between a train step's backward pass and its updates,
    /// from the gradients it reads: the step values that mix layers (a global norm),
    /// which kernels' updates read (scalars, written into their PEs as the host's
    /// values are).
    pub mixed: Vec<NodeIndex>,
    /// The variables the host updates (a weight several kernels hold, and its
    /// optimiser's slots): each name with its new value, one of `mixed`. The host
    /// writes it into every PE that holds the variable after the backward pass, so
    /// the replicas stay equal.
    pub host_commits: Vec<(String, NodeIndex)>,
    /// For each node that is another's value under another name (a shard mean of one
    /// shard, a label check the host makes), that node.
    pub alias: Vec<Option<NodeIndex>>,
    /// Each value carried past the kernels after the one that makes it (a layer's
    /// carried input, a shortcut's outputs): that layer, the kernel that reads it
    /// there, and the carry, in order.
    pub skips: Vec<(usize, usize, Carry)>,
    /// For each kernel, whether its samples read a statistic of the batch (batch norm
    /// in training: `statistics`).
    pub barriers: Vec<bool>,
}

impl Formed {
    /// Whether kernel `k` has a backward pass (a stream of the backward pass into it).
    pub fn has_backward(&self, k: usize) -> bool {
        (self.streams.iter()).any(|s| s.bwd && s.to.contains(&End::Kernel(k)))
    }

    /// Kernel `k`'s place in the backward pass (`pipeline::plan`): `Some(1)` when it
    /// ends it (it sends gradients back and takes none: a loss), `Some(0)` when it has
    /// a backward pass, `None` when it has no part in it.
    pub fn backward_role(&self, k: usize) -> Option<u32> {
        let sends = (self.streams.iter()).any(|s| s.bwd && s.from == End::Kernel(k));
        match (self.has_backward(k), sends) {
            (true, _) => Some(0),
            (false, true) => Some(1),
            (false, false) => None,
        }
    }

    /// The node whose value `n` is.
    pub fn resolve(&self, n: NodeIndex) -> NodeIndex {
        resolve(&self.alias, n)
    }

    /// Layer `k`'s carry, if it has one.
    pub fn carry(&self, k: usize) -> Option<&Carry> {
        match &self.kernels.get(k)?.kind {
            Kind::Dense { carry, .. } => carry.as_ref(),
            Kind::Vector { .. } => None,
        }
    }

    /// The layer whose carried input kernel `k` passes on, and that carry: a skip of
    /// several kernels (`h + g(f(h W1)) W2`) goes from the layer that carries it to
    /// the kernel that reads it (`Formed::skips`) through every kernel between, in the
    /// streams between them beside their own values (forward, the value; backward, its
    /// gradient).
    pub fn passed(&self, k: usize) -> Option<&Carry> {
        let (_, _, c) = self.skips.iter().find(|&&(l, r, _)| l < k && k < r)?;
        Some(c)
    }

    /// Whether layer `k` is a shortcut that carries its input ahead of its outputs to
    /// the layer after it (`Carry::first`).
    pub fn carries_first(&self, k: usize) -> bool {
        self.carry(k).is_some_and(|c| c.first)
    }

    /// What kernel `k` carries past itself: its own carry, or a skip it passes on.
    pub fn carried_past(&self, k: usize) -> Option<&Carry> {
        self.carry(k).or_else(|| self.passed(k))
    }

    /// Layer `l`'s carry when what it carries is not its input but a value beside it.
    pub fn carries_beside(&self, l: usize) -> Option<&Carry> {
        match &self.kernels.get(l)?.kind {
            Kind::Dense { x, carry, .. } => carry.as_ref().filter(|c| c.x != self.resolve(*x)),
            Kind::Vector { .. } => None,
        }
    }

    /// Whether stream `n` reaches kernel `to` beside another, carried by a layer: a
    /// residual's value or a side part's product into the kernel after the layer that
    /// carries it (or passes it on), or their gradients into that layer (or a kernel
    /// that passes it on).
    pub fn carried(&self, n: NodeIndex, to: usize) -> bool {
        self.carried_rank(n, to) > 0
    }

    /// Where stream `n` comes into kernel `to` beside another, carried by a layer (see
    /// `carried`): 1 for a residual's value or gradient, 2 + `i` for side part `i`'s
    /// (in the order they follow the layer's own values); 0 when not carried.
    pub fn carried_rank(&self, n: NodeIndex, to: usize) -> u8 {
        let sides = |l: usize| {
            let more = self.kernels.get(l).and_then(|k| match &k.kind {
                Kind::Dense { more, .. } => Some(more),
                Kind::Vector { .. } => None,
            });
            more.into_iter().flatten().filter(|p| p.beside())
        };
        let dy = match self.kernels.get(to).map(|k| &k.kind) {
            Some(Kind::Dense { dy, .. }) => dy.map(|d| self.resolve(d)),
            _ => None,
        };
        // (a shortcut takes its output gradient after the input gradient of the layer
        // after it, which carries it back: see `Carry::first`)
        if self.carries_first(to) {
            return u8::from(dy == Some(n));
        }
        if let Some(l) = to.checked_sub(1) {
            if self.carried_past(l).is_some_and(|c| c.x == n) {
                return 1;
            }
            if let Some(i) = sides(l).position(|p| p.out == n) {
                return 2 + i as u8;
            }
        }
        // (the kernel a skip's gradient comes back into: the layer that carries it,
        // or one passing it on, unless it is that layer's output gradient, `dy`: see
        // `dense::Back::Same`; and the
        // kernel that made a value the layer after it carries beside its input)
        let back = self.carried_past(to).and_then(|c| c.grad);
        if back.is_some_and(|skip| skip == n && dy != Some(n)) {
            return 1;
        }
        if self
            .carries_beside(to + 1)
            .is_some_and(|c| c.grad == Some(n))
        {
            return 1;
        }
        match sides(to).position(|p| p.dy == Some(n) && dy != Some(n)) {
            Some(i) => 2 + i as u8,
            None => 0,
        }
    }
}

/// The node whose value `n` is, through `alias`.
fn resolve(alias: &[Option<NodeIndex>], mut n: NodeIndex) -> NodeIndex {
    while let Some(a) = alias[n.index()] {
        n = a;
    }
    n
}

fn unsupported(g: &Graph, n: NodeIndex, message: String, help: &str) -> Unsupported {
    Unsupported {
        span: g.node(n).span,
        message,
        help: help.to_string(),
    }
}

/// The name under which a node's value is kept on the wafer (an accumulator, a host
/// value): `%` and its index.
pub fn key(n: NodeIndex) -> String {
    format!("%{}", n.index())
}

/// The name under which node `n`'s value is held on the wafer: a variable's own name,
/// else its key (`key`).
pub fn name_of(g: &Graph, n: NodeIndex) -> String {
    match &g.node(n).op {
        Op::Variable { name, .. } => name.clone(),
        _ => key(n),
    }
}

/// The columns of each variable a joined weight `w` puts side by side (`joined`), in
/// order.
pub fn joined_columns(g: &Graph, w: NodeIndex) -> Option<Vec<(NodeIndex, std::ops::Range<usize>)>> {
    let mut at = 0;
    let parts = joined(g, w)?.into_iter().map(|v| {
        let cols = at..at + g.ty(v).shape[1];
        at = cols.end;
        (v, cols)
    });
    Some(parts.collect())
}

/// The variable node `n` is a view of and where the view starts in it: the variable
/// itself, a reshape of a view, or a slice of one that is a run of its words (a GRU's
/// bias `[2, 3u]`, its rows read apart and sliced by gate). A kernel that reads a view
/// holds its variable (a replica when several do) and reads the run in place.
pub fn view_of(g: &Graph, n: NodeIndex) -> Option<(NodeIndex, u32)> {
    match &g.node(n).op {
        Op::Variable { .. } => Some((n, 0)),
        Op::Reshape => view_of(g, g.operands(n)[0]),
        Op::Slice { axis, start, .. } => {
            let src = g.operands(n)[0];
            let shape = &g.ty(src).shape;
            // (a run when every axis before the sliced one is of one)
            if shape[..*axis].iter().any(|&d| d != 1) {
                return None;
            }
            let stride: usize = shape[axis + 1..].iter().product();
            let (v, at) = view_of(g, src)?;
            Some((v, at + (start * stride) as u32))
        }
        _ => None,
    }
}

/// The variables node `n` puts side by side as one layer's weight, if it does: a
/// `concat` of variables of rank 2 along their columns (`x concat([Wq, Wk, Wv])`, the
/// layers of one value fused: `passes::fuse_products`). The layer holds the joined
/// weight, each variable's columns a run of every row, and the device reads and
/// writes each variable by its name there (`place::build::joined_pieces`).
pub fn joined(g: &Graph, n: NodeIndex) -> Option<Vec<NodeIndex>> {
    let ops = g.operands(n);
    let var = |v: &NodeIndex| matches!(g.node(*v).op, Op::Variable { .. }) && g.ty(*v).rank() == 2;
    (matches!(g.node(n).op, Op::Concat { axis: 1 }) && ops.len() > 1 && ops.iter().all(var))
        .then(|| ops.to_vec())
}

/// The value of a constant node as an f32, if it is one.
pub fn constant(g: &Graph, n: NodeIndex) -> Option<f32> {
    match g.node(n).op {
        Op::Const { bits } => Some(f64::from_bits(bits) as f32),
        _ => None,
    }
}

/// What every pass of formation reads: the graph, its batch, classes and aliases, its
/// nodes in dataflow order, and which sample values the host computes and streams.
struct Cx<'g> {
    g: &'g Graph,
    batch: u32,
    class: Vec<Class>,
    alias: Vec<Option<NodeIndex>>,
    order: Vec<NodeIndex>,
    bound: usize,
    /// The sample values the inputs and constants alone make (`classify`).
    inputs_only: Vec<bool>,
    /// The sample values the host computes from its inputs and streams (set by
    /// `layers::hosted` once the layers are known; none before).
    hosted: Vec<bool>,
}

impl Cx<'_> {
    /// The node whose value `n` is.
    fn resolve(&self, n: NodeIndex) -> NodeIndex {
        resolve(&self.alias, n)
    }

    fn is_var(&self, n: NodeIndex) -> bool {
        matches!(self.g.node(n).op, Op::Variable { .. })
    }

    /// The variable `n` is as a layer's weight: itself (or variables joined side by
    /// side, `joined`), or it cast to a half-precision float (mixed precision: the
    /// layer computes with the weight rounded and updates the f32 variable).
    fn weight(&self, n: NodeIndex) -> Option<NodeIndex> {
        if self.is_var(n) || joined(self.g, n).is_some() {
            return Some(n);
        }
        let o = *self.g.operands(n).first()?;
        let half = matches!(self.g.ty(n).dtype, DType::F16 | DType::BF16);
        (matches!(self.g.node(n).op, Op::Cast) && half && self.is_var(o)).then_some(o)
    }

    /// Whether `n` is a value the host streams as it has it: an input, random numbers,
    /// a constant made one per sample.
    fn source(&self, n: NodeIndex) -> bool {
        matches!(
            self.g.node(n).op,
            Op::Input { .. } | Op::RandomUniform { .. } | Op::RandomNormal { .. }
        ) || (self.class[n.index()] == Class::Sample && per_sample_constant(self.g, n, self.batch))
    }

    /// Whether the host sends `x` (a source, or a value it computes from them).
    fn host_sends(&self, x: NodeIndex) -> bool {
        let x = self.resolve(x);
        self.source(x) || self.hosted[x.index()]
    }

    /// Whether `n` is a sample or batch node no kernel has taken yet (nor the host):
    /// one for a vector kernel.
    fn free(&self, n: NodeIndex, owner: &[Option<usize>]) -> bool {
        matches!(
            self.class[n.index()],
            Class::Sample | Class::Batch | Class::SampleT
        ) && owner[n.index()].is_none()
            && self.alias[n.index()].is_none()
            && !self.hosted[n.index()]
            && !self.source(n)
    }

    /// Whether `n` is a scalar computed from scalar step values and the host's alone (a
    /// global norm from each layer's sum of squares): the host's, as it ties no kernels
    /// together.
    fn scalar_of_scalars(&self, n: NodeIndex) -> bool {
        let scalar_step = |o: NodeIndex| {
            self.class[o.index()] == Class::Step && !self.is_var(o) && self.g.ty(o).rank() == 0
        };
        let ops: Vec<NodeIndex> = (self.g.operands(n).into_iter())
            .map(|o| self.resolve(o))
            .collect();
        self.g.ty(n).rank() == 0
            && ops.iter().any(|&o| scalar_step(o))
            && (ops.iter()).all(|&o| scalar_step(o) || self.class[o.index()] == Class::Host)
    }
}

/// Forms `g` into kernels.
pub fn form(g: &Graph) -> Result<Formed, Unsupported> {
    form_surveyed(g, survey(g))
}

/// `form` of a graph surveyed already (`survey(g)`): its passes in turn.
pub fn form_surveyed(g: &Graph, survey: Survey) -> Result<Formed, Unsupported> {
    let Survey {
        batch,
        class,
        alias,
        inputs_only,
        blockers,
    } = survey;
    if let Some(first) = blockers.into_iter().next() {
        return Err(first);
    }
    let bound = g.g.node_bound();
    let mut cx = Cx {
        g,
        batch,
        class,
        alias,
        order: g.topo_order(),
        bound,
        inputs_only,
        hosted: vec![false; bound],
    };
    let mut owner: Vec<Option<usize>> = vec![None; bound];
    let mut kernels = layers::layers(&cx, &mut owner);
    layers::gradients(&cx, &mut kernels, &mut owner)?;
    cx.hosted = layers::hosted(&cx, &kernels);
    layers::merge_sums(&cx, &mut kernels, &mut owner);
    let mut group = groups::groups(&cx, &kernels, &owner);
    groups::residuals(&cx, &mut kernels, &mut owner, &mut group);
    groups::shortcuts(&cx, &mut kernels, &mut owner);
    groups::vectors(&cx, &mut kernels, &mut owner, &group);
    layers::side_parts(&cx, &mut kernels, &mut owner);
    let mut kernels = groups::in_order(&cx, kernels, &mut owner);
    let (mixed, host_commits) = steps::steps(&cx, &mut kernels, &mut owner)?;
    let (host, mixed) = steps::host_values(&cx, &mut kernels, &owner, mixed, &host_commits)?;
    let streams = streams::streams(&cx, &kernels, &owner);
    streams::check_reshapes(&cx, &kernels, &owner)?;
    let skips = streams::skips(&cx, &kernels, &streams);
    let barriers = statistics::barriers(&cx, &kernels, &owner)?;
    let Cx { class, alias, .. } = cx;
    Ok(Formed {
        batch,
        class,
        owner,
        kernels,
        streams,
        host,
        mixed,
        host_commits,
        alias,
        skips,
        barriers,
    })
}

/// Whether node `n` has users and `of` holds every one of them.
fn read_only_by(g: &Graph, n: NodeIndex, of: impl Fn(NodeIndex) -> bool) -> bool {
    let mut users =
        g.g.neighbors_directed(n, petgraph::Direction::Outgoing)
            .peekable();
    users.peek().is_some() && users.all(of)
}
