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

use super::lower::{self, Operand, Update, UpdateOp};
use crate::ir::{DType, Graph, NodeIndex, Op, ReduceOp, Role, UnaryOp};
use crate::span::Span;
use petgraph::visit::NodeIndexable;
use std::collections::BTreeSet;

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
    pub dy: Option<NodeIndex>,
}

/// A residual around a layer (`h + f(h W)`): its input `x` is read past it too, by the
/// kernel after it, and the layer carries it there along its rows' chains beside its
/// outputs; the gradient that way comes back beside its output gradient, and the layer
/// adds it into its input gradient along its columns' chains, which then sends the
/// sum (`bwd` is the sum).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Carry {
    pub x: NodeIndex,
    /// The layer's own input gradient (its product) and the skip's gradient, when the
    /// layer sends an input gradient.
    pub grad: Option<(NodeIndex, NodeIndex)>,
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

    /// Whether stream `n` reaches kernel `to` beside another, carried by a layer: a
    /// residual's value or a side part's product into the kernel after the layer that
    /// carries it, or their gradients into that layer.
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
            more.into_iter().flatten().filter(|p| p.side)
        };
        if let Some(l) = to.checked_sub(1) {
            if self.carry(l).is_some_and(|c| c.x == n) {
                return 1;
            }
            if let Some(i) = sides(l).position(|p| p.mm == n) {
                return 2 + i as u8;
            }
        }
        // (not when the skip's gradient is the layer's output gradient: see
        // `dense::Back::Same`)
        let dy = match self.kernels.get(to).map(|k| &k.kind) {
            Some(Kind::Dense { dy, .. }) => dy.map(|d| self.resolve(d)),
            _ => None,
        };
        if (self.carry(to).and_then(|c| c.grad)).is_some_and(|(_, skip)| skip == n && dy != Some(n))
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

/// The batch size of a graph: the leading dimension of its first input (the features,
/// or their first part).
pub fn batch_of(g: &Graph) -> Option<u32> {
    let f =
        g.g.node_indices()
            .find(|&n| matches!(g.node(n).op, Op::Input { .. }))?;
    g.ty(f).shape.first().map(|&b| b as u32)
}

/// Classes every node of `g` (see the module's doc), with every node that has no
/// class on the wafer (classed as a sample's value, so that the nodes after it are
/// classed on).
pub fn classify(g: &Graph, batch: u32) -> (Vec<Class>, Vec<Option<NodeIndex>>, Vec<Unsupported>) {
    let mut class = vec![Class::Host; g.g.node_bound()];
    let mut alias = vec![None; g.g.node_bound()];
    let mut errors = Vec::new();
    let b = batch as usize;
    for n in g.topo_order() {
        let node = g.node(n);
        let ops = g.operands(n);
        let cl = |o: &NodeIndex| class[o.index()];
        let has = |c: Class| ops.iter().any(|o| cl(o) == c);
        let leading = node.ty.shape.first() == Some(&b);
        let c = match &node.op {
            Op::Input { .. } => {
                if !leading {
                    errors.push(unsupported(g, n, format!("the input `{}` has no batch dimension of {batch} first", node.op.name()), "the wafer streams the samples of a batch one by one: give every input the batch dimension first"));
                }
                Class::Sample
            }
            Op::Variable { .. } => Class::Step,
            Op::Const { .. } | Op::GlobalStep => Class::Host,
            // the host draws a step's random numbers and streams them with the samples
            Op::RandomUniform { .. } | Op::RandomNormal { .. } if leading => Class::Sample,
            Op::RandomUniform { .. } | Op::RandomNormal { .. } => {
                errors.push(unsupported(g, n, format!("`{}` of {} has no wafer kernel", node.op.name(), node.ty), "the host streams random numbers to the wafer per sample: draw them with the batch dimension first"));
                Class::Sample
            }
            // the identity once the train step is made: its operand's value
            Op::Unary(UnaryOp::StopGradient) => {
                alias[n.index()] = Some(ops[0]);
                cl(&ops[0])
            }
            Op::CrossShardMean if has(Class::Batch) => {
                alias[n.index()] = Some(ops[0]);
                Class::Batch
            }
            Op::CheckIndices { .. } if has(Class::Sample) => {
                // the host checks the labels it sends
                alias[n.index()] = Some(ops[0]);
                Class::Sample
            }
            _ if has(Class::Sample) || has(Class::SampleT) => {
                match &node.op {
                    Op::Reduce { axes, op, .. } if axes.contains(&0) => {
                        if !matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
                            errors.push(unsupported(g, n, format!("a `{}` over the batch has no wafer kernel", node.op.name()), "the wafer sums (or averages) over the batch as samples pass; take a maximum or minimum per sample instead"));
                        }
                        Class::Batch
                    }
                    Op::Transpose { perm } if perm.first() != Some(&0) => {
                        if perm.as_slice() != [1, 0] {
                            errors.push(unsupported(g, n, "a transpose that moves the batch dimension has no wafer kernel".into(), "the wafer streams samples one by one: keep the batch dimension first"));
                        }
                        Class::SampleT
                    }
                    Op::MatMul if cl(&ops[0]) == Class::SampleT && cl(&ops[1]) == Class::Sample => {
                        Class::Batch
                    }
                    Op::Conv2dBackpropFilter(_) => Class::Batch,
                    // a gather's gradient: every sample's rows added into one table
                    Op::ScatterAdd => Class::Batch,
                    Op::Reshape if leading && (planar_view(g, ops[0], n) || flat(g, ops[0], n)) => {
                        // the same words in the same order: images travel planar
                        alias[n.index()] = Some(ops[0]);
                        Class::Sample
                    }
                    // any other reshape moves the words as they are, which would scramble
                    // an image of several channels and pixels (planar, not NHWC)
                    Op::Reshape
                        if [ops[0], n]
                            .iter()
                            .any(|&v| image(g, v).is_some_and(|(h, w, c)| c > 1 && h * w > 1)) =>
                    {
                        errors.push(unsupported(g, n, format!("a reshape of {} into {} has no wafer kernel yet", g.ty(ops[0]), node.ty), "the wafer keeps images planar (channel by channel) and regroups their pixels or flattens them for a dense layer, nothing else: keep the image's channels and reshape only its height and width, or use `--target host`"));
                        Class::Sample
                    }
                    _ if has(Class::SampleT) => {
                        errors.push(unsupported(g, n, format!("`{}` of a transposed batch has no wafer kernel", node.op.name()), "the wafer computes `transpose(x) @ dy` (a weight gradient) over the batch and nothing else of a transposed batch"));
                        Class::Sample
                    }
                    _ => {
                        if !leading {
                            errors.push(unsupported(g, n, format!("`{}` mixes the samples of a batch", node.op.name()), "the wafer streams the samples of a batch one by one: keep the batch dimension first and reduce over it only with a sum or mean"));
                        }
                        Class::Sample
                    }
                }
            }
            _ if has(Class::Batch) || has(Class::Step) => Class::Step,
            // constants made one per sample (positions): streamed by the host
            _ if per_sample_constant(g, n, batch) => Class::Sample,
            _ => Class::Host,
        };
        class[n.index()] = c;
    }
    (class, alias, errors)
}

/// Whether `n` broadcasts a value of constants over a new leading axis of the batch
/// (`broadcast_to(iota([T]), [B, T])`: a position per token of every sample): the host
/// computes it, as it computes every constant, and streams it per sample like an
/// input, so that nothing constant reaches the fabric as an op.
pub fn per_sample_constant(g: &Graph, n: NodeIndex, batch: u32) -> bool {
    let ops = g.operands(n);
    matches!(g.node(n).op, Op::BroadcastTo)
        && g.ty(n).shape.first() == Some(&(batch as usize))
        && ops
            .first()
            .is_some_and(|&o| g.ty(o).rank() < g.ty(n).rank())
}

/// Whether reshaping sample value `from` into `to` keeps a sample's words in their
/// order on the wafer, where images (rank 4) travel planar: a plane's pixels regrouped,
/// a one-channel image flattened or made, or an image flattened into a vector (which
/// only a dense layer reads, with its weight's rows in the image's order).
fn planar_view(g: &Graph, from: NodeIndex, to: NodeIndex) -> bool {
    let rank = |n: NodeIndex| g.ty(n).rank();
    match (image(g, from), image(g, to)) {
        (Some(a), Some(b)) => a.2 == b.2,
        (Some(_), None) => rank(to) == 2,
        // a vector made an image of one channel, or a dense layer's input gradient
        // made the image it flattened again
        (None, Some(_)) => rank(from) == 2,
        (None, None) => false,
    }
}

/// Whether reshaping sample value `from` into `to` regroups axes neither of which is an
/// image's: the same words in the same order (an embedding's rows of a sample made
/// one vector for a dense layer, and that layer's input gradient made rows again).
fn flat(g: &Graph, from: NodeIndex, to: NodeIndex) -> bool {
    image(g, from).is_none() && image(g, to).is_none()
}

/// A rank-4 (image) value's height, width and channels.
pub fn image(g: &Graph, n: NodeIndex) -> Option<(u32, u32, u32)> {
    let s = &g.ty(n).shape;
    (s.len() == 4).then(|| (s[1] as u32, s[2] as u32, s[3] as u32))
}

/// A graph's batch, classes and aliases (`classify`), and its blockers: every construct
/// that has no wafer layout, as far as each node alone shows it (loss scaling, mixed
/// precision, a node the batch does not class, a sample's value made from a statistic
/// of its batch), each once, so that a check reports them together. `form_surveyed`
/// refuses a graph with any, and finds the rest (how kernels meet) one at a time.
pub struct Survey {
    batch: u32,
    class: Vec<Class>,
    alias: Vec<Option<NodeIndex>>,
    pub blockers: Vec<Unsupported>,
}

/// `g`'s survey (see `Survey`).
pub fn survey(g: &Graph) -> Survey {
    let mut errors: Vec<Unsupported> = (g.optimizers.iter())
        .filter(|o| o.loss_scale.is_some())
        .map(|o| Unsupported {
            span: o.span,
            message: "loss scaling has no wafer layout yet".into(),
            help: "the wafer trains in f32, which needs no loss scale: drop `loss_scale(...)` for the wafer (`if target == wafer { opt } else { loss_scale(opt) }`), or train on the host (`--target host`)".into(),
        })
        .collect();
    // mixed precision: a weight cast to f16 or bf16 before its layer uses it
    for n in g.topo_order() {
        let narrows = matches!(g.node(n).op, Op::Cast)
            && matches!(g.ty(n).dtype, DType::F16 | DType::BF16)
            && g.operands(n)
                .into_iter()
                .any(|o| matches!(g.node(o).op, Op::Variable { .. }));
        if narrows {
            errors.push(unsupported(g, n, format!("mixed precision (an f32 weight cast to {} for its layer) has no wafer layout yet", g.ty(n).dtype), "the wafer's kernels read their weights as they are stored: compute in f32 on the wafer, or train this model in mixed precision on the host (`--target host`)"));
        }
    }
    let batch = batch_of(g).unwrap_or(1);
    let (class, alias, unclassed) = classify(g, batch);
    errors.extend(unclassed);
    // a sample's value made from a statistic of its whole batch (batch norm in
    // training): the kernels see a sample at a time, so the statistic is not whole yet
    for n in g.topo_order() {
        let of_batch = |o: NodeIndex| class[resolve(&alias, o).index()] == Class::Batch;
        if class[n.index()] == Class::Sample && g.operands(n).into_iter().any(of_batch) {
            errors.push(unsupported(g, n, "a sample's value made from a statistic of its whole batch (batch norm in training) has no wafer kernel yet".into(), "the wafer's kernels see one sample at a time: normalise each sample on its own (`layer_norm`), or train this model on the host (`--target host`)"));
        }
    }
    // each once (a layer's gradient nodes point at the layer too)
    let mut seen = BTreeSet::new();
    errors.retain(|u| seen.insert((u.span.file, u.span.lo, u.span.hi, u.message.clone())));
    Survey {
        batch,
        class,
        alias,
        blockers: errors,
    }
}

/// Forms `g` into kernels.
pub fn form(g: &Graph) -> Result<Formed, Unsupported> {
    form_surveyed(g, survey(g))
}

/// `form` of a graph surveyed already (`survey(g)`).
pub fn form_surveyed(g: &Graph, survey: Survey) -> Result<Formed, Unsupported> {
    let Survey {
        batch,
        class,
        alias,
        blockers,
    } = survey;
    if let Some(first) = blockers.into_iter().next() {
        return Err(first);
    }
    let bound = g.g.node_bound();
    let order = g.topo_order();
    let mut owner: Vec<Option<usize>> = vec![None; bound];
    let mut kernels: Vec<Kernel> = Vec::new();
    let is_var = |n: NodeIndex| matches!(g.node(n).op, Op::Variable { .. });
    let resolve = |n: NodeIndex| resolve(&alias, n);
    // layers: x W with a variable W of rank 2 (dense), a convolution with a variable
    // filter, and rows of a variable table of rank 2 chosen per sample (an embedding)
    for &n in &order {
        if class[n.index()] != Class::Sample {
            continue;
        }
        let ops = g.operands(n);
        // its input and weight
        let (x, w) = match &g.node(n).op {
            Op::MatMul | Op::Conv2d(_) => {
                let rank = if matches!(g.node(n).op, Op::MatMul) {
                    2
                } else {
                    4
                };
                if g.ty(ops[0]).rank() != rank {
                    continue;
                }
                (ops[0], ops[1])
            }
            Op::Gather if g.ty(ops[0]).rank() == 2 && class[ops[1].index()] == Class::Sample => {
                (ops[1], ops[0])
            }
            _ => continue,
        };
        if !is_var(w) {
            continue;
        }
        // a weight several products use (across the time steps of an unrolled
        // recurrent network, a table looked up twice) is held by each of their layers:
        // a replica each, which the host keeps equal (see `Formed::host_commits`)
        let k = kernels.len();
        owner[n.index()] = Some(k);
        owner[w.index()].get_or_insert(k);
        kernels.push(Kernel {
            kind: Kind::Dense {
                w,
                x,
                fwd: n,
                dy: None,
                bwd: None,
                dw: None,
                more: Vec::new(),
                carry: None,
            },
            vars: vec![w],
            steps: Vec::new(),
            commits: Vec::new(),
            hosts: Vec::new(),
        });
    }
    // their gradients: dy W^T and x^T dy (a convolution's: the gradients of its
    // input, from dy and the filter, and of its filter, from x and dy; an embedding's:
    // dy's rows added into its table's); the weight gradients first, which tie each
    // replica of a shared weight to its output gradient
    let gradients = (order.iter().filter(|n| class[n.index()] == Class::Batch))
        .chain(order.iter().filter(|n| class[n.index()] != Class::Batch));
    for &n in gradients {
        let ops = g.operands(n);
        if matches!(g.node(n).op, Op::ScatterAdd) && class[n.index()] == Class::Batch {
            let (ids, dy) = (ops[0], ops[1]);
            let table = (kernels.iter().enumerate()).find_map(|(k, kr)| match kr.kind {
                Kind::Dense { x, fwd, .. } if x == ids && matches!(g.node(fwd).op, Op::Gather) => {
                    Some(k)
                }
                _ => None,
            });
            let Some(k) = table else {
                return Err(unsupported(g, n, "a `scatter_add` that is no embedding's gradient has no wafer kernel".into(), "the wafer adds rows into a table only as the gradient of `gather` from a variable (an embedding)"));
            };
            if let Kind::Dense { dy: d, dw, .. } = &mut kernels[k].kind {
                if d.is_some() || dw.is_some() {
                    return Err(unsupported(
                        g,
                        n,
                        "an embedding with two gradients has no wafer kernel".into(),
                        "look each table up once in the forward pass",
                    ));
                }
                *d = Some(dy);
                *dw = Some(n);
            }
            owner[n.index()] = Some(k);
            continue;
        }
        if !matches!(
            g.node(n).op,
            Op::MatMul | Op::Conv2dBackpropInput(_) | Op::Conv2dBackpropFilter(_)
        ) {
            continue;
        }
        let (a, b) = (ops[0], ops[1]);
        let conv = !matches!(g.node(n).op, Op::MatMul);
        let transposed_var = |t: NodeIndex| match g.node(t).op {
            Op::Transpose { .. } if is_var(g.operands(t)[0]) => Some(g.operands(t)[0]),
            _ if conv && is_var(t) => Some(t),
            _ => None,
        };
        if class[n.index()] == Class::Sample {
            if let Some(w) = transposed_var(b) {
                // the layer of `w` whose output gradient this is (of its replicas,
                // the one whose weight gradient reads the same)
                let layers: Vec<usize> = (kernels.iter().enumerate())
                    .filter(|(_, kr)| matches!(kr.kind, Kind::Dense { w: v, .. } if v == w))
                    .map(|(k, _)| k)
                    .collect();
                let mine = layers.iter().copied().find(
                    |&k| matches!(kernels[k].kind, Kind::Dense { dy: Some(d), .. } if d == a),
                );
                let k = match (mine, layers.as_slice()) {
                    (Some(k), _) | (None, &[k]) => k,
                    (None, []) => continue,
                    (None, _) => {
                        return Err(unsupported(
                            g,
                            n,
                            "a frozen weight shared by several layers has no wafer kernel yet"
                                .into(),
                            "train the shared weight, or give each layer its own",
                        ));
                    }
                };
                if let Kind::Dense { dy, bwd, .. } = &mut kernels[k].kind {
                    if bwd.is_some_and(|o| o != n) || dy.is_some_and(|d| d != a) {
                        return Err(unsupported(
                            g,
                            n,
                            "a layer with two input gradients has no wafer kernel".into(),
                            "use each weight once in the forward pass",
                        ));
                    }
                    *bwd = Some(n);
                    *dy = Some(a);
                }
                owner[n.index()] = Some(k);
                if !conv {
                    owner[b.index()] = Some(k);
                }
            }
        } else if class[n.index()] == Class::Batch {
            let xt = if conv { a } else { g.operands(a)[0] };
            // of the layers that read `x` (several: two towers on the features), the
            // one whose weight the update of this gradient reads
            let updated = updates_read(g, &class, n);
            let all: Vec<usize> = (kernels.iter().enumerate())
                .filter(|(_, kr)| matches!(kr.kind, Kind::Dense { x, .. } if x == xt))
                .map(|(k, _)| k)
                .collect();
            let mine: Vec<usize> = if all.len() > 1 {
                (all.iter().copied())
                    .filter(|&k| matches!(kernels[k].kind, Kind::Dense { w, .. } if updated.contains(&w)))
                    .collect()
            } else {
                all
            };
            let mut readers = mine.into_iter();
            let found = readers.next();
            if readers.next().is_some() {
                return Err(unsupported(
                    g,
                    xt,
                    "a value that several layers read has no wafer layout yet".into(),
                    "the wafer lays out chains of layers so far: feed each value to one layer",
                ));
            }
            let Some(k) = found else {
                return Err(unsupported(g, n, "a product over the batch that is no layer's weight gradient has no wafer kernel".into(), "the wafer computes `transpose(x) @ dy` only as the gradient of a dense layer's weight"));
            };
            if let Kind::Dense { dy, dw, .. } = &mut kernels[k].kind {
                if dy.is_some_and(|d| d != b) || dw.is_some() {
                    return Err(unsupported(g, n, "a layer whose weight gradient and input gradient disagree has no wafer kernel".into(), "use each weight once in the forward pass"));
                }
                *dy = Some(b);
                *dw = Some(n);
            }
            owner[n.index()] = Some(k);
            if !conv {
                owner[a.index()] = Some(k);
            }
        }
    }
    // a layer's input computed from the inputs alone (a time step's slice of the
    // features, ids computed from others) is the host's: it computes it from the
    // inputs it has and streams it, as it streams random numbers; and so is what only
    // such values read
    let source = |n: NodeIndex| {
        matches!(
            g.node(n).op,
            Op::Input { .. } | Op::RandomUniform { .. } | Op::RandomNormal { .. }
        ) || (class[n.index()] == Class::Sample && per_sample_constant(g, n, batch))
    };
    let mut inputs_only = vec![false; bound];
    for &n in &order {
        let ops = g.operands(n);
        inputs_only[n.index()] = class[n.index()] == Class::Sample
            && (source(n)
                || (ops.iter().any(|o| inputs_only[o.index()])
                    && ops
                        .iter()
                        .all(|o| inputs_only[o.index()] || class[o.index()] == Class::Host)));
    }
    let mut hosted = vec![false; bound];
    for kr in &kernels {
        if let Kind::Dense { x, .. } = kr.kind {
            let x = resolve(x);
            hosted[x.index()] = inputs_only[x.index()] && !source(x);
        }
    }
    for &n in order.iter().rev() {
        if inputs_only[n.index()] && !source(n) && read_only_by(g, n, |u| hosted[u.index()]) {
            hosted[n.index()] = true;
        }
    }
    // a sum of products, one of them of an input from the kernel before and the others
    // of inputs the host sends (`x W + h U`), is one layer: its products' columns side
    // by side, their partial sums in one chain
    merge_sums(g, &mut kernels, &mut owner, resolve, |x| {
        let x = resolve(x);
        source(x) || hosted[x.index()]
    });
    // the other sample and batch nodes: connected groups
    let free = |n: NodeIndex, owner: &[Option<usize>]| {
        matches!(
            class[n.index()],
            Class::Sample | Class::Batch | Class::SampleT
        ) && owner[n.index()].is_none()
            && alias[n.index()].is_none()
            && !hosted[n.index()]
            && !source(n)
    };
    let mut parent: Vec<usize> = (0..bound).collect();
    fn find(p: &mut [usize], mut i: usize) -> usize {
        while p[i] != i {
            p[i] = p[p[i]];
            i = p[i];
        }
        i
    }
    fn union(p: &mut [usize], a: usize, b: usize) {
        let (a, b) = (find(p, a), find(p, b));
        p[a.max(b)] = a.min(b);
    }
    for &n in &order {
        if !free(n, &owner) {
            continue;
        }
        for o in g.operands(n) {
            // through values under other names (a reshape that keeps the words)
            let o = resolve(o);
            if free(o, &owner) {
                union(&mut parent, n.index(), o.index());
            }
        }
    }
    // a layer's neighbours in both directions are one: what makes its input with what
    // reads its input gradient, what makes its output gradient with what reads its
    // output (a linear op, such as a mean over a sample's axis, and its gradient share
    // no value, but they sit between the same two layers)
    let readers = |n: NodeIndex, owner: &[Option<usize>]| {
        let mut out = Vec::new();
        let mut stack = vec![n];
        while let Some(v) = stack.pop() {
            for u in g.g.neighbors_directed(v, petgraph::Direction::Outgoing) {
                if alias[u.index()].is_some() {
                    stack.push(u);
                } else if free(u, owner) {
                    out.push(u);
                }
            }
        }
        out
    };
    for kr in &kernels {
        let Kind::Dense {
            x, fwd, dy, bwd, ..
        } = kr.kind
        else {
            continue;
        };
        let pairs = [(Some(x), bwd), (dy, Some(fwd))];
        for (made, read) in pairs {
            let (Some(made), Some(read)) = (made.map(resolve), read) else {
                continue;
            };
            if !free(made, &owner) {
                continue;
            }
            for u in readers(read, &owner) {
                union(&mut parent, made.index(), u.index());
            }
        }
    }
    // and the groups one step node reads from are one (a bias added in one group and
    // its gradient summed in another, when no activation links them, update together):
    // a step node's anchors are the batch nodes and the readers of the variables it
    // reads, through other step nodes; a scalar computed from scalars (a global norm
    // from each layer's sum of squares) ties no groups together (the host computes it
    // when it mixes groups: see `mixed` below); nor does the update of a variable
    // several kernels hold (a weight of several layers, a bias added at every time
    // step), which the host makes from their gradients
    let mut anchors: Vec<Vec<usize>> = vec![Vec::new(); bound];
    let scalar_step =
        |o: NodeIndex| class[o.index()] == Class::Step && !is_var(o) && g.ty(o).rank() == 0;
    let from_scalars = |n: NodeIndex| {
        let ops: Vec<NodeIndex> = g.operands(n).into_iter().map(resolve).collect();
        g.ty(n).rank() == 0
            && ops.iter().any(|&o| scalar_step(o))
            && (ops.iter()).all(|&o| scalar_step(o) || class[o.index()] == Class::Host)
    };
    let by_host = shared_updates(g, &class, &kernels, |n| free(n, &owner));
    for &n in &order {
        if class[n.index()] != Class::Step || is_var(n) || by_host.contains(&n) || from_scalars(n) {
            continue;
        }
        let mut mine: Vec<usize> = Vec::new();
        for o in g.operands(n) {
            let o = resolve(o);
            if free(o, &owner) {
                mine.push(o.index());
            } else if is_var(o) {
                mine.extend(
                    g.g.neighbors_directed(o, petgraph::Direction::Outgoing)
                        .filter(|&u| free(u, &owner))
                        .map(|u| u.index()),
                );
            } else {
                mine.extend(anchors[o.index()].iter().copied());
            }
        }
        mine.sort_unstable();
        mine.dedup();
        for w in mine.windows(2) {
            union(&mut parent, w[0], w[1]);
        }
        anchors[n.index()] = mine;
    }
    // a residual: a group that makes a layer's input and reads its output (through
    // the sum `h + f(h W)`) is two, the nodes before the layer and those after it; the
    // layer carries its input to the kernel after it, and the skip's gradient back into
    // its input gradient (see `Carry`)
    let mut group: Vec<usize> = (0..bound).map(|i| find(&mut parent, i)).collect();
    let reach = |from: NodeIndex, dir: petgraph::Direction| {
        let mut seen = vec![false; bound];
        seen[from.index()] = true;
        let mut stack = vec![from];
        while let Some(v) = stack.pop() {
            for u in g.g.neighbors_directed(v, dir) {
                if !seen[u.index()] {
                    seen[u.index()] = true;
                    stack.push(u);
                }
            }
        }
        seen
    };
    for (k, kr) in kernels.iter_mut().enumerate() {
        let Kind::Dense {
            x,
            fwd,
            bwd,
            ref more,
            ..
        } = kr.kind
        else {
            continue;
        };
        let x = resolve(x);
        if !more.is_empty() || !free(x, &owner) {
            continue;
        }
        let before = group[x.index()];
        if !readers(fwd, &owner)
            .iter()
            .any(|u| group[u.index()] == before)
        {
            continue;
        }
        // after: what the output makes but not the input gradient, and what only such
        // nodes read (the labels' share of a loss); before: the rest (what makes the
        // input, what its gradient makes, an activation's mask for its gradient)
        let after = bound + k;
        let to_x = reach(x, petgraph::Direction::Incoming);
        let from_fwd = reach(fwd, petgraph::Direction::Outgoing);
        let from_bwd = bwd.map_or_else(
            || vec![false; bound],
            |m| reach(m, petgraph::Direction::Outgoing),
        );
        for &n in order.iter().rev() {
            let i = n.index();
            if group[i] != before || from_bwd[i] || to_x[i] {
                continue;
            }
            let mut readers = (g.g.neighbors_directed(n, petgraph::Direction::Outgoing))
                .filter(|u| group[u.index()] == before || group[u.index()] == after)
                .peekable();
            let read_after = readers.peek().is_some() && readers.all(|u| group[u.index()] == after);
            if from_fwd[i] || read_after {
                group[i] = after;
            }
        }
        // the skip's gradient summed with the layer's input gradient: the layer's
        let sum = bwd.and_then(|m| {
            let mut users = g.g.neighbors_directed(m, petgraph::Direction::Outgoing);
            let (u, None) = (users.next()?, users.next()) else {
                return None;
            };
            let ops = g.operands(u);
            let add = matches!(g.node(u).op, Op::Binary(crate::ir::BinaryOp::Add));
            let skip = *ops.iter().find(|&&o| o != m)?;
            let same = g.ty(skip).shape == g.ty(m).shape && g.ty(u).shape == g.ty(m).shape;
            (add && same
                && free(u, &owner)
                && group[u.index()] == before
                && !from_bwd[skip.index()])
            .then_some((u, m, resolve(skip)))
        });
        if let Some((u, _, _)) = sum {
            owner[u.index()] = Some(k);
        }
        if let Kind::Dense { bwd, carry, .. } = &mut kr.kind {
            *carry = Some(Carry {
                x,
                grad: sum.map(|(_, m, skip)| (m, skip)),
            });
            if let Some((u, _, _)) = sum {
                *bwd = Some(u);
            }
        }
    }
    let mut group_of: std::collections::BTreeMap<usize, usize> = Default::default();
    for &n in &order {
        if !free(n, &owner) {
            continue;
        }
        let root = group[n.index()];
        let k = *group_of.entry(root).or_insert_with(|| {
            kernels.push(Kernel {
                kind: Kind::Vector { nodes: Vec::new() },
                vars: Vec::new(),
                steps: Vec::new(),
                commits: Vec::new(),
                hosts: Vec::new(),
            });
            kernels.len() - 1
        });
        owner[n.index()] = Some(k);
        if let Kind::Vector { nodes } = &mut kernels[k].kind {
            nodes.push(n);
        }
    }
    // a layer of the host's inputs whose product only the kernel after another layer
    // reads (a tower, a shortcut of the features) is a side part of that layer
    side_parts(
        g,
        &mut kernels,
        &mut owner,
        &|x| {
            let x = resolve(x);
            source(x) || hosted[x.index()]
        },
        &resolve,
    );
    // kernels in dataflow order (of their first node)
    let pos: Vec<usize> = {
        let mut p = vec![usize::MAX; bound];
        for (i, n) in order.iter().enumerate() {
            p[n.index()] = i;
        }
        p
    };
    // (a vector kernel just after the last layer whose outputs it reads: a side part's
    // nodes may come long before its layer's)
    let outputs: BTreeSet<NodeIndex> = (kernels.iter())
        .flat_map(|k| match &k.kind {
            Kind::Dense { fwd, more, .. } => std::iter::once(*fwd)
                .chain(more.iter().filter(|p| p.side).map(|p| p.mm))
                .collect(),
            Kind::Vector { .. } => Vec::new(),
        })
        .collect();
    let first = |k: &Kernel| match &k.kind {
        Kind::Dense { fwd, .. } => (pos[fwd.index()], 0),
        Kind::Vector { nodes } => {
            let after = (nodes.iter())
                .flat_map(|&n| g.operands(n))
                .map(resolve)
                .filter(|o| outputs.contains(o))
                .map(|o| pos[o.index()])
                .max();
            let own = nodes.iter().map(|n| pos[n.index()]).min().unwrap_or(0);
            (after.unwrap_or(own), 1)
        }
    };
    let mut perm: Vec<usize> = (0..kernels.len()).collect();
    perm.sort_by_key(|&k| first(&kernels[k]));
    let mut renum = vec![0; kernels.len()];
    for (new, &old) in perm.iter().enumerate() {
        renum[old] = new;
    }
    let mut sorted: Vec<Option<Kernel>> = kernels.into_iter().map(Some).collect();
    let mut kernels: Vec<Kernel> = perm.iter().filter_map(|&k| sorted[k].take()).collect();
    for o in owner.iter_mut().flatten() {
        *o = renum[*o];
    }
    // a value under another name is where that value is
    for &n in &order {
        if alias[n.index()].is_some() {
            owner[n.index()] = owner[resolve(n).index()];
        }
    }
    // variables read per sample belong to the kernel that reads them (each kernel that
    // reads one holds a replica: a bias shared across time steps)
    for &n in &order {
        if let (Some(k), Class::Sample) = (owner[n.index()], class[n.index()]) {
            for o in g.operands(n) {
                let elsewhere = owner[o.index()].is_some_and(|k2| k2 != k)
                    && matches!(g.node(n).op, Op::MatMul | Op::Transpose { .. });
                if is_var(o) && !kernels[k].vars.contains(&o) && !elsewhere {
                    owner[o.index()].get_or_insert(k);
                    kernels[k].vars.push(o);
                }
            }
        }
    }
    // the variables several kernels hold: their updates are the host's
    let mut holders: Vec<usize> = vec![0; bound];
    for kr in &kernels {
        for v in &kr.vars {
            holders[v.index()] += 1;
        }
    }
    let shared = |v: NodeIndex| holders[v.index()] > 1;
    // step nodes (and the optimiser's slots) belong to the kernel whose values they
    // read; repeat until the slots, read only by step nodes, have found theirs
    let claim =
        |n: NodeIndex, k: usize, owner: &mut Vec<Option<usize>>, kernels: &mut Vec<Kernel>| {
            owner[n.index()] = Some(k);
            kernels[k].steps.push(n);
            for o in g.operands(n) {
                if is_var(o) && owner[o.index()].is_none() {
                    owner[o.index()] = Some(k);
                    kernels[k].vars.push(o);
                }
            }
        };
    // a step node that reads the values of several kernels (a global norm) is the
    // host's, and so is one that reads such a node and no kernel's
    let mut mixed: BTreeSet<NodeIndex> = BTreeSet::new();
    loop {
        let mut changed = false;
        for &n in &order {
            if class[n.index()] != Class::Step
                || is_var(n)
                || owner[n.index()].is_some()
                || mixed.contains(&n)
            {
                continue;
            }
            let ops = g.operands(n);
            let owners: BTreeSet<usize> = ops
                .iter()
                .filter_map(|o| owner[resolve(*o).index()])
                .collect();
            let reads_mixed = ops.iter().any(|o| mixed.contains(&resolve(*o)));
            // (or a tensor of such: a sum of a shared weight's gradients, in steps)
            let reads_shared = ops.iter().any(|&o| {
                (is_var(o) && shared(o)) || (mixed.contains(&resolve(o)) && g.ty(o).rank() > 0)
            });
            // and a scalar computed from scalars (a running sum of the layers' sums of
            // squares, whichever layer comes last, or of two parts' of one layer): the
            // host's, as it ties no groups together
            if owners.len() > 1
                || (owners.is_empty() && reads_mixed)
                || reads_shared
                || from_scalars(n)
            {
                mixed.insert(n);
                changed = true;
                continue;
            }
            if let Some(&k) = owners.first() {
                claim(n, k, &mut owner, &mut kernels);
                changed = true;
            }
        }
        // and a step node that reads only slots and constants belongs to its users'
        // (the host's, when they are all the host's: a shared weight's slots)
        for &n in order.iter().rev() {
            if class[n.index()] != Class::Step
                || is_var(n)
                || owner[n.index()].is_some()
                || mixed.contains(&n)
            {
                continue;
            }
            if read_only_by(g, n, |u| mixed.contains(&u)) {
                mixed.insert(n);
                changed = true;
                continue;
            }
            let users: BTreeSet<usize> =
                g.g.neighbors_directed(n, petgraph::Direction::Outgoing)
                    .filter_map(|u| owner[u.index()])
                    .collect();
            if let (1, Some(&k)) = (users.len(), users.first()) {
                claim(n, k, &mut owner, &mut kernels);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // what a kernel would compute only for the host's mixed values, the host computes
    // itself from the gradients (a layer's sum of squares for a global norm)
    if !mixed.is_empty() {
        for &n in order.iter().rev() {
            let Some(k) = owner[n.index()] else { continue };
            if class[n.index()] != Class::Step || is_var(n) {
                continue;
            }
            if read_only_by(g, n, |u| mixed.contains(&u)) {
                owner[n.index()] = None;
                kernels[k].steps.retain(|&m| m != n);
                mixed.insert(n);
            }
        }
    }
    for k in &mut kernels {
        k.steps.sort_by_key(|&n| n.index());
    }
    // the variables' new values (the host's for a shared variable and its slots)
    let mut host_commits = Vec::new();
    for (name, node) in g.outputs_with(Role::Update) {
        let var = g.variable(&name);
        if mixed.contains(&node) || var.is_some_and(|v| shared(v) && node != v) {
            // the host computes it (and what it reads that no kernel holds)
            mixed.insert(node);
            host_commits.push((name, node));
            continue;
        }
        let k = var.and_then(|v| owner[v.index()]);
        let Some(k) = k else {
            return Err(unsupported(
                g,
                node,
                format!("the variable `{name}` is updated but no kernel holds it"),
                "the wafer updates a variable on the PEs that read it",
            ));
        };
        if owner[node.index()] != Some(k) && !(is_var(node) && node == var.unwrap_or(node)) {
            return Err(unsupported(
                g,
                node,
                format!("the update of `{name}` is made away from the kernel that holds it"),
                "update each variable from its own layer's values",
            ));
        }
        kernels[k].commits.push((name, node));
    }
    // the host's values the kernels read
    let mut host = BTreeSet::new();
    for (k, kr) in kernels.iter_mut().enumerate() {
        let mut mine = BTreeSet::new();
        for &n in &order {
            if owner[n.index()] != Some(k) {
                continue;
            }
            for o in g.operands(n) {
                let computed =
                    class[o.index()] == Class::Host && !matches!(g.node(o).op, Op::Const { .. });
                if computed || mixed.contains(&o) {
                    if g.ty(o).rank() != 0 {
                        return Err(unsupported(g, o, "a computed tensor the host would send each step has no wafer kernel".into(), "the host sends scalars (a learning rate, a global norm's clipping factor) each step; compute tensors from the samples or the variables"));
                    }
                    mine.insert(o);
                }
            }
        }
        kr.hosts = mine.iter().copied().collect();
        host.extend(mine.into_iter().filter(|o| !mixed.contains(o)));
    }
    // the mixed values the kernels read, which the host computes after the gradients
    let mixed: Vec<NodeIndex> = (mixed.into_iter())
        .filter(|m| {
            kernels.iter().any(|k| k.hosts.contains(m)) || host_commits.iter().any(|(_, c)| c == m)
        })
        .collect();
    for o in &g.outputs {
        if class[o.node.index()] == Class::Host {
            host.insert(o.node);
        }
    }
    let host = g.schedule(&host.into_iter().collect::<Vec<_>>(), |_| false);
    // streams: sample values crossing kernels
    let mut streams: Vec<Stream> = Vec::new();
    let wants: BTreeSet<NodeIndex> = g
        .outputs
        .iter()
        .filter(|o| matches!(o.role, Role::Prediction | Role::MetricInput))
        .map(|o| resolve(o.node))
        .collect();
    let mut users: Vec<Vec<NodeIndex>> = vec![Vec::new(); bound];
    for &n in &order {
        for o in g.operands(n) {
            users[o.index()].push(n);
        }
    }
    for &n in &order {
        let n = resolve(n);
        if !matches!(class[n.index()], Class::Sample) || streams.iter().any(|s| s.node == n) {
            continue;
        }
        let from = owner[n.index()].map_or(End::Host, End::Kernel);
        let mut to: BTreeSet<End> = BTreeSet::new();
        let mut stack = users[n.index()].clone();
        while let Some(u) = stack.pop() {
            // through its other names (a reshape of a reshape of it too)
            if alias[u.index()].is_some() && resolve(u) == n {
                stack.extend(users[u.index()].iter().copied());
                continue;
            }
            if let Some(k) = owner[u.index()] {
                if End::Kernel(k) != from {
                    to.insert(End::Kernel(k));
                }
            }
        }
        if wants.contains(&n) && from != End::Host {
            to.insert(End::Host);
        }
        if to.is_empty() {
            continue;
        }
        let bwd = kernels.iter().any(|k| match &k.kind {
            Kind::Dense {
                dy,
                bwd,
                carry,
                more,
                ..
            } => {
                *dy == Some(n)
                    || *bwd == Some(n)
                    || carry
                        .and_then(|c| c.grad)
                        .is_some_and(|(_, skip)| skip == n)
                    || more.iter().any(|p| p.side && p.dy == Some(n))
            }
            Kind::Vector { .. } => false,
        });
        streams.push(Stream {
            node: n,
            from,
            to: to.into_iter().collect(),
            bwd,
        });
    }
    // an image is flattened for dense layers only, and made again only from their
    // input gradients (planar both ways); an image of one pixel is its channels in
    // either order
    let image = |n: NodeIndex| image(g, n).is_some_and(|(h, w, c)| c > 1 && h * w > 1);
    for &n in &order {
        let Some(src) = alias[n.index()] else {
            continue;
        };
        if !matches!(g.node(n).op, Op::Reshape) {
            continue;
        }
        let dense_x = |k: Option<usize>| {
            k.is_some_and(|k| matches!(kernels[k].kind, Kind::Dense { x, .. } if x == n))
        };
        if image(src) && !image(n) && !users[n.index()].iter().all(|u| dense_x(owner[u.index()])) {
            return Err(unsupported(g, n, "an image flattened for anything but a dense layer has no wafer kernel yet".into(), "the wafer keeps images planar (channel by channel): flatten an image only into a dense layer"));
        }
        let from_dense = kernels.iter().any(|k| match k.kind {
            Kind::Dense { x, bwd, .. } => {
                bwd == Some(src) && g.ty(resolve(x)).shape == g.ty(n).shape
            }
            Kind::Vector { .. } => false,
        });
        if image(n) && !image(src) && !from_dense {
            return Err(unsupported(g, n, "a vector reshaped into an image of several channels has no wafer kernel yet".into(), "the wafer keeps images planar (channel by channel): make images of one channel from vectors"));
        }
    }
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
    })
}

/// Merges the layers whose products are summed (`add(x W, h U)`, each product read
/// by the sum alone, with one output gradient) into one layer of several parts: the
/// layer whose input comes from another kernel keeps its place, the others (whose
/// inputs the host sends: `from_host`) become its further parts, and `fwd` becomes the
/// sum. Sums of sums merge in turn.
fn merge_sums(
    g: &Graph,
    kernels: &mut Vec<Kernel>,
    owner: &mut [Option<usize>],
    resolve: impl Fn(NodeIndex) -> NodeIndex,
    from_host: impl Fn(NodeIndex) -> bool,
) {
    // a product of rank-2 values (a dense layer's, or an embedding's of each
    // sample's ids), or a sum of them already merged
    let plain = |fwd: NodeIndex| {
        matches!(
            g.node(fwd).op,
            Op::MatMul | Op::Gather | Op::Binary(crate::ir::BinaryOp::Add)
        )
    };
    let layer = |kr: &Kernel| {
        let Kind::Dense { x, fwd, dy, .. } = kr.kind else {
            return None;
        };
        let p = product(g, &kr.kind)?;
        let gather = matches!(g.node(p).op, Op::Gather);
        (plain(fwd) && (g.ty(x).rank() == 2 || gather) && image(g, x).is_none()).then_some((p, dy))
    };
    loop {
        let by_fwd = |n: NodeIndex, kernels: &[Kernel]| {
            kernels
                .iter()
                .position(|kr| matches!(kr.kind, Kind::Dense { fwd, .. } if fwd == n))
        };
        let mut found = None;
        for n in g.topo_order() {
            if !matches!(g.node(n).op, Op::Binary(crate::ir::BinaryOp::Add)) {
                continue;
            }
            let ops = g.operands(n);
            let (Some(a), Some(b)) = (by_fwd(ops[0], kernels), by_fwd(ops[1], kernels)) else {
                continue;
            };
            let (Some(pa), Some(pb)) = (layer(&kernels[a]), layer(&kernels[b])) else {
                continue;
            };
            let only_sum = |m: NodeIndex| {
                g.g.neighbors_directed(m, petgraph::Direction::Outgoing)
                    .all(|u| u == n)
            };
            let same = g.ty(ops[0]).shape == g.ty(n).shape && g.ty(ops[1]).shape == g.ty(n).shape;
            // the part: a plain product of a host input, with no input gradient
            let part_of = |k: usize| match &kernels[k].kind {
                Kind::Dense {
                    w,
                    x,
                    fwd,
                    dw,
                    bwd: None,
                    more,
                    ..
                } if more.is_empty()
                    && matches!(g.node(*fwd).op, Op::MatMul | Op::Gather)
                    && from_host(*x) =>
                {
                    Some(Part {
                        w: *w,
                        x: *x,
                        mm: *fwd,
                        dw: *dw,
                        side: false,
                        dy: None,
                    })
                }
                _ => None,
            };
            // the products alike (both dense layers' or both embeddings'), with one
            // output gradient
            let gather = |n: NodeIndex| matches!(g.node(n).op, Op::Gather);
            if a == b
                || !same
                || !only_sum(ops[0])
                || !only_sum(ops[1])
                || pa.1 != pb.1
                || gather(pa.0) != gather(pb.0)
            {
                continue;
            }
            let pick = match (part_of(b), part_of(a)) {
                (Some(p), _) => Some((a, b, p)),
                (None, Some(p)) => Some((b, a, p)),
                _ => None,
            };
            // a part's input is its own (the host sends each stream to one part's
            // columns): one the layer or another part reads stays a join
            let taken = |main: usize, part: &Part| match &kernels[main].kind {
                Kind::Dense { x, more, .. } => {
                    resolve(*x) == resolve(part.x)
                        || more.iter().any(|p| resolve(p.x) == resolve(part.x))
                }
                Kind::Vector { .. } => true,
            };
            if let Some((main, gone, part)) = pick.filter(|(m, _, p)| !taken(*m, p)) {
                found = Some((n, main, gone, part));
                break;
            }
        }
        let Some((sum, main, gone, part)) = found else {
            return;
        };
        let main = absorb(kernels, owner, (gone, main), |_| Some(part));
        owner[sum.index()] = Some(main);
        if let Kind::Dense { fwd, .. } = &mut kernels[main].kind {
            *fwd = sum;
        }
    }
}

/// Removes layer `gone` and makes it a further part of layer `main` (the part `part`
/// makes of it): its nodes and variables become `main`'s. Returns `main`'s new index.
fn absorb(
    kernels: &mut Vec<Kernel>,
    owner: &mut [Option<usize>],
    (gone, main): (usize, usize),
    part: impl FnOnce(&Kind) -> Option<Part>,
) -> usize {
    let taken = kernels.remove(gone);
    let main = if gone < main { main - 1 } else { main };
    for o in owner.iter_mut() {
        match *o {
            Some(k) if k == gone => *o = Some(main),
            Some(k) if k > gone => *o = Some(k - 1),
            _ => {}
        }
    }
    let kr = &mut kernels[main];
    kr.vars.extend(taken.vars);
    if let (Some(p), Kind::Dense { more, .. }) = (part(&taken.kind), &mut kr.kind) {
        more.push(p);
    }
    main
}

/// The step nodes that make the new values of variables several kernels will hold
/// (from `kernels`, the layers alone, and `free`, whether a node will be in a vector
/// kernel): a weight of several layers, a variable that several vector nodes read.
fn shared_updates(
    g: &Graph,
    class: &[Class],
    kernels: &[Kernel],
    free: impl Fn(NodeIndex) -> bool,
) -> BTreeSet<NodeIndex> {
    let mut out = BTreeSet::new();
    for (name, node) in g.outputs_with(Role::Update) {
        let Some(v) = g.variable(&name) else { continue };
        let layers = (kernels.iter())
            .filter(|k| match &k.kind {
                Kind::Dense { w, more, .. } => *w == v || more.iter().any(|p| p.w == v),
                Kind::Vector { .. } => false,
            })
            .count();
        let readers = (g.g.neighbors_directed(v, petgraph::Direction::Outgoing))
            .filter(|&u| class[u.index()] == Class::Sample && free(u))
            .count();
        if layers < 2 && readers < 2 {
            continue;
        }
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            let step =
                class[n.index()] == Class::Step && !matches!(g.node(n).op, Op::Variable { .. });
            if step && out.insert(n) {
                stack.extend(g.operands(n));
            }
        }
    }
    out
}

/// Whether node `n` has users and `of` holds every one of them.
/// Makes each layer of the host's inputs (`from_host`) whose product only a vector
/// kernel reads that also reads another layer's product a side part of that other
/// layer (see `Part::side`). Run before the step nodes find their kernels.
fn side_parts(
    g: &Graph,
    kernels: &mut Vec<Kernel>,
    owner: &mut [Option<usize>],
    from_host: &dyn Fn(NodeIndex) -> bool,
    resolve: &dyn Fn(NodeIndex) -> NodeIndex,
) {
    // the one kernel that reads node `n` (none when several do, or none)
    let reader = |n: NodeIndex, owner: &[Option<usize>]| {
        let ks: BTreeSet<Option<usize>> =
            (g.g.neighbors_directed(n, petgraph::Direction::Outgoing))
                .map(|u| owner[u.index()])
                .collect();
        match ks.into_iter().collect::<Vec<_>>().as_slice() {
            [Some(k)] => Some(*k),
            _ => None,
        }
    };
    let plain = |kr: &Kernel| match &kr.kind {
        Kind::Dense {
            x,
            fwd,
            bwd: None,
            more,
            carry: None,
            ..
        } => {
            more.is_empty()
                && matches!(g.node(*fwd).op, Op::MatMul)
                && g.ty(*x).rank() == 2
                && from_host(*x)
        }
        _ => false,
    };
    loop {
        let vector = |k: usize| matches!(kernels[k].kind, Kind::Vector { .. });
        // the layer it joins: a product of its own input (the host sends an input to
        // one part of a layer), which trains if the side part does (its output
        // gradient brings the side part's)
        let joins = |l: usize, s: usize, v: usize| {
            let (
                Kind::Dense { x: xs, dy: ds, .. },
                Kind::Dense {
                    x, fwd, dy, more, ..
                },
            ) = (&kernels[s].kind, &kernels[l].kind)
            else {
                return false;
            };
            let inputs = std::iter::once(*x).chain(more.iter().map(|p| p.x));
            l != s
                && reader(*fwd, owner) == Some(v)
                && product(g, &kernels[l].kind).is_some_and(|p| matches!(g.node(p).op, Op::MatMul))
                && inputs.into_iter().all(|i| resolve(i) != resolve(*xs))
                && (ds.is_none() || dy.is_some())
        };
        let found = (0..kernels.len()).find_map(|s| {
            let Kind::Dense { fwd, .. } = kernels[s].kind else {
                return None;
            };
            if !plain(&kernels[s]) {
                return None;
            }
            let v = reader(fwd, owner).filter(|&v| vector(v))?;
            let l = (0..kernels.len()).find(|&l| joins(l, s, v))?;
            Some((s, l))
        });
        let Some((gone, main)) = found else {
            return;
        };
        absorb(kernels, owner, (gone, main), |kind| match *kind {
            Kind::Dense {
                w, x, fwd, dy, dw, ..
            } => Some(Part {
                w,
                x,
                mm: fwd,
                dw,
                side: true,
                dy: dy.map(resolve),
            }),
            Kind::Vector { .. } => None,
        });
    }
}

/// The variables the step nodes after node `n` read (a weight gradient's: its
/// weight, and its optimiser's slots).
fn updates_read(g: &Graph, class: &[Class], n: NodeIndex) -> BTreeSet<NodeIndex> {
    let mut vars = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut stack = vec![n];
    while let Some(v) = stack.pop() {
        for u in g.g.neighbors_directed(v, petgraph::Direction::Outgoing) {
            // (through the batch values it makes: a mean across shards; not through
            // scalars, which may mix every layer's: a global norm)
            let tensor = g.ty(u).rank() > 0;
            if matches!(class[u.index()], Class::Step | Class::Batch) && tensor && seen.insert(u) {
                vars.extend(
                    (g.operands(u).into_iter())
                        .filter(|&o| matches!(g.node(o).op, Op::Variable { .. })),
                );
                stack.push(u);
            }
        }
    }
    vars
}

fn read_only_by(g: &Graph, n: NodeIndex, of: impl Fn(NodeIndex) -> bool) -> bool {
    let mut users =
        g.g.neighbors_directed(n, petgraph::Direction::Outgoing)
            .peekable();
    users.peek().is_some() && users.all(of)
}

/// The name under which a node's value is kept on the wafer (an accumulator, a host
/// value): `%` and its index.
pub fn key(n: NodeIndex) -> String {
    format!("%{}", n.index())
}

/// The value of a constant node as an f32, if it is one.
pub fn constant(g: &Graph, n: NodeIndex) -> Option<f32> {
    match g.node(n).op {
        Op::Const { bits } => Some(f64::from_bits(bits) as f32),
        _ => None,
    }
}

/// The share of layer `k`'s update that part `p` makes (0: its own product, then each
/// of `more`): its variables (the weight, then the optimiser's slots), its step nodes
/// and its commits. A layer of one part has it all.
#[allow(clippy::type_complexity)]
pub fn part_update(
    g: &Graph,
    f: &Formed,
    k: usize,
    p: usize,
) -> (Vec<NodeIndex>, Vec<NodeIndex>, Vec<(String, NodeIndex)>) {
    let kr = &f.kernels[k];
    let (w, dw, more) = match &kr.kind {
        Kind::Dense { w, dw, more, .. } if !more.is_empty() => (w, dw, more),
        _ => return (kr.vars.clone(), kr.steps.clone(), kr.commits.clone()),
    };
    let (w, dw) = match p {
        0 => (*w, *dw),
        _ => (more[p - 1].w, more[p - 1].dw),
    };
    let name = |v: NodeIndex| match &g.node(v).op {
        Op::Variable { name, .. } => Some(name.clone()),
        _ => None,
    };
    // what the weight and its gradient lead to, then what those commits read
    let reads = |n: NodeIndex| g.operands(n).into_iter().map(|o| f.resolve(o));
    let mut ahead: BTreeSet<NodeIndex> = [w].into_iter().chain(dw).collect();
    while let Some(n) =
        (kr.steps.iter()).find(|&&n| !ahead.contains(&n) && reads(n).any(|o| ahead.contains(&o)))
    {
        ahead.insert(*n);
    }
    let commits: Vec<(String, NodeIndex)> = (kr.commits.iter())
        .filter(|(c, n)| ahead.contains(n) || name(w).as_ref() == Some(c))
        .cloned()
        .collect();
    let mut needed: BTreeSet<NodeIndex> = commits.iter().map(|c| c.1).collect();
    while let Some(n) =
        (kr.steps.iter()).find(|&&n| needed.contains(&n) && reads(n).any(|o| !needed.contains(&o)))
    {
        needed.extend(reads(*n));
    }
    let steps: Vec<NodeIndex> = (kr.steps.iter())
        .copied()
        .filter(|n| needed.contains(n))
        .collect();
    let committed = |v: &NodeIndex| commits.iter().any(|c| name(*v).as_ref() == Some(&c.0));
    let mut vars = vec![w];
    vars.extend(
        (kr.vars.iter())
            .filter(|&&v| v != w && (needed.contains(&v) || committed(&v)))
            .filter(|&&v| !matches!(&kr.kind, Kind::Dense { more, .. } if more.iter().any(|q| q.w == v)))
            .copied(),
    );
    (vars, steps, commits)
}

/// Kernel `k`'s step nodes as an update over its blocks: `vars`, `accs` and `hosts` number
/// the operands of those kinds; a value shaped `block` is a whole block, a scalar one
/// word.
pub fn update_of(
    g: &Graph,
    f: &Formed,
    k: usize,
    (vars, accs, hosts): (&[NodeIndex], &[NodeIndex], &[NodeIndex]),
    block: &[usize],
) -> Result<Update, Unsupported> {
    let kr = &f.kernels[k];
    update_over(g, f, (&kr.steps, &kr.commits), (vars, accs, hosts), block)
}

/// `update_of` over the step nodes `steps` and the commits `commits` (a part's).
pub fn update_over(
    g: &Graph,
    f: &Formed,
    (steps, commits): (&[NodeIndex], &[(String, NodeIndex)]),
    (vars, accs, hosts): (&[NodeIndex], &[NodeIndex], &[NodeIndex]),
    block: &[usize],
) -> Result<Update, Unsupported> {
    let mut u = Update::default();
    let mut done: Vec<NodeIndex> = Vec::new();
    let operand = |o: NodeIndex, done: &[NodeIndex]| -> Option<Operand> {
        let o = f.resolve(o);
        if let Some(v) = constant(g, o) {
            return Some(Operand::Imm(v));
        }
        if let Some(i) = vars.iter().position(|&v| v == o) {
            return Some(Operand::Var(i));
        }
        if let Some(i) = accs.iter().position(|&v| v == o) {
            return Some(Operand::Acc(i));
        }
        if let Some(i) = hosts.iter().position(|&v| v == o) {
            return Some(Operand::Host(i));
        }
        done.iter().position(|&v| v == o).map(Operand::Val)
    };
    for &n in steps {
        let node = g.node(n);
        if !lower::elementwise(&node.op) {
            return Err(unsupported(
                g,
                n,
                format!("`{}` in an update has no wafer kernel", node.op.name()),
                "the wafer updates variables with elementwise ops over each PE's block",
            ));
        }
        let full = if node.ty.shape.as_slice() == block {
            true
        } else if node.ty.rank() == 0 {
            false
        } else {
            return Err(unsupported(
                g,
                n,
                format!(
                    "`{}` of shape {} in the update of a layer whose variables are {:?}",
                    node.op.name(),
                    node.ty,
                    block
                ),
                "the wafer updates variables with elementwise ops over each PE's block",
            ));
        };
        let ops = g.operands(n);
        let mut args = Vec::new();
        for &o in &ops {
            args.push(operand(o, &done).ok_or_else(|| {
                unsupported(
                    g,
                    n,
                    format!(
                        "`{}` reads a value its layer's PEs do not hold",
                        node.op.name()
                    ),
                    "update each layer from its own variables and gradients",
                )
            })?);
        }
        let from = ops.first().map_or(node.ty.dtype, |&o| g.ty(o).dtype);
        u.ops.push(UpdateOp {
            op: node.op.clone(),
            args,
            full,
            types: (from, node.ty.dtype),
        });
        done.push(n);
    }
    for (name, node) in commits {
        let var = vars
            .iter()
            .position(|&v| matches!(&g.node(v).op, Op::Variable { name: m, .. } if m == name));
        let (Some(var), Some(a)) = (var, operand(*node, &done)) else {
            return Err(unsupported(
                g,
                *node,
                format!("the update of `{name}` is made away from the PEs that hold it"),
                "update each layer from its own variables and gradients",
            ));
        };
        u.commits.push((var, a));
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn train_graph(src: &str) -> Graph {
        crate::backend::wafer::testing::graph(src, crate::syntax::ast::SectionKind::Train)
    }

    #[test]
    fn an_mlp_forms_dense_and_vector_kernels_in_a_chain() {
        let g = train_graph(&crate::backend::wafer::testing::mlp(8, 16, 4, 4));
        let f = form(&g).unwrap();
        let kinds: Vec<&str> = f
            .kernels
            .iter()
            .map(|k| match k.kind {
                Kind::Dense { .. } => "dense",
                Kind::Vector { .. } => "vector",
            })
            .collect();
        assert_eq!(kinds, ["dense", "vector", "dense", "vector"]);
        // the first layer sends no input gradient; the second does
        assert!(matches!(
            f.kernels[0].kind,
            Kind::Dense {
                bwd: None,
                dw: Some(_),
                ..
            }
        ));
        assert!(matches!(
            f.kernels[2].kind,
            Kind::Dense {
                bwd: Some(_),
                dw: Some(_),
                ..
            }
        ));
        // each kernel updates its own variables: the weights and biases with their
        // momentum slots
        let commits: Vec<usize> = f.kernels.iter().map(|k| k.commits.len()).collect();
        assert_eq!(commits, [2, 2, 2, 2]);
        // features -> dense, dense -> vector (y), vector -> dense (relu), dense -> vector
        // (logits), labels -> vector; and back: vector -> dense (dlogits), dense ->
        // vector (dx), vector -> dense (relu grad)
        let s: Vec<(End, Vec<End>, bool)> = f
            .streams
            .iter()
            .map(|s| (s.from, s.to.clone(), s.bwd))
            .collect();
        use End::{Host, Kernel as K};
        assert_eq!(
            s,
            [
                (Host, vec![K(0)], false),
                (Host, vec![K(3)], false),
                (K(0), vec![K(1)], false),
                (K(1), vec![K(2)], false),
                (K(2), vec![K(3)], false),
                (K(3), vec![K(2)], true),
                (K(2), vec![K(1)], true),
                (K(1), vec![K(0)], true),
            ]
        );
        // the learning rate is the host's
        assert!(f.kernels.iter().all(|k| k.hosts.is_empty()));
    }

    #[test]
    fn a_weight_of_several_layers_is_held_by_each_and_updated_by_the_host() {
        let g = train_graph(RECURRENT);
        let f = form(&g).unwrap();
        let wh = g.variable("wh").unwrap();
        let holders: Vec<usize> = (0..f.kernels.len())
            .filter(|&k| f.kernels[k].vars.contains(&wh))
            .collect();
        // its two layers, and nothing else
        assert_eq!(holders.len(), 2);
        assert!(holders
            .iter()
            .all(|&k| matches!(f.kernels[k].kind, Kind::Dense { w, dw: Some(_), .. } if w == wh)));
        // the host updates it (from the sum of both gradients); the other layers'
        // updates stay theirs
        let names: Vec<&str> = f.host_commits.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(names, ["wh"]);
        assert!(f.mixed.contains(&f.host_commits[0].1));
        assert!(holders.iter().all(|&k| f.kernels[k].commits.is_empty()));
        let on_kernels: usize = f.kernels.iter().map(|k| k.commits.len()).sum();
        assert_eq!(on_kernels, 4);
        // a chain still: each kernel's forward output feeds the next
        assert!(f.streams.iter().filter(|s| !s.bwd).all(|s| match s.from {
            End::Kernel(a) => s.to == [End::Kernel(a + 1)],
            End::Host => true,
        }));
    }

    const RECURRENT: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
model m(features: f32[B, 8], labels: i32[B]) {
  let wh = variable("wh", [16, 16], init: init_normal(0.1))
  let h = dense(features, 16, activation: relu)
  h = tanh(matmul(h, wh))
  h = tanh(matmul(h, wh))
  let logits = dense(h, 4)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with sgd(lr: 0.1) }
}
input data() { range(64) |> map |i| (broadcast_to(cast(i, f32), [8]), i % 4) |> repeat |> batch(4, drop_remainder: true) }
estimator e { model = m  train_input = data() }
"#;
}
