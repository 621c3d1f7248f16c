//! The survey of a graph before formation: each node's class (how it relates to the
//! batch), the nodes that are others' values under other names, and every construct
//! that has no wafer layout as far as each node alone shows it; and which nodes the
//! forward pass computes.

use super::{unsupported, Class, Unsupported};
use crate::ir::{BinaryOp, Graph, NodeIndex, Op, ReduceOp, Role, UnaryOp};
use petgraph::visit::NodeIndexable;
use std::collections::BTreeSet;

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
/// classed on); and which sample values the inputs and constants alone make (which the
/// host can compute and stream).
#[allow(clippy::type_complexity)]
pub fn classify(
    g: &Graph,
    batch: u32,
) -> (
    Vec<Class>,
    Vec<Option<NodeIndex>>,
    Vec<bool>,
    Vec<Unsupported>,
) {
    let mut class = vec![Class::Host; g.g.node_bound()];
    let mut alias = vec![None; g.g.node_bound()];
    let mut inputs_only = vec![false; g.g.node_bound()];
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
                    // a reshape of the inputs alone that does not keep the words' planar
                    // order (a sequence `[B, T, C]` made an image `[B, 1, T, C]` for a
                    // convolution): the host computes it and streams the image planar, as
                    // it streams an input
                    Op::Reshape
                        if leading && inputs_only[ops[0].index()] && !in_order(g, ops[0], n) =>
                    {
                        Class::Sample
                    }
                    Op::Reshape if leading && (planar_view(g, ops[0], n) || flat(g, ops[0], n)) => {
                        // the same words in the same order: images travel planar
                        alias[n.index()] = Some(ops[0]);
                        Class::Sample
                    }
                    // a regrouping of a sample's axes (attention's heads split from each
                    // token's features, `[B, T, h * d]` as `[B, T, h, d]`, and merged
                    // back): its vector kernel moves the words where the result lies, on
                    // one lane
                    Op::Reshape if leading && regroups(&g.ty(ops[0]).shape, &node.ty.shape) => {
                        Class::Sample
                    }
                    // any other reshape moves the words as they are, which would scramble
                    // an image of several channels and pixels (planar, not NHWC)
                    Op::Reshape
                        if [ops[0], n]
                            .iter()
                            .any(|&v| image(g, v).is_some_and(|(h, w, c)| c > 1 && h * w > 1)) =>
                    {
                        let (message, help) = reshape_blocker(g, ops[0], n);
                        errors.push(unsupported(g, n, message, help));
                        Class::Sample
                    }
                    // a depthwise convolution of several channels with a multiplier above
                    // 1: each tap's window `[B, h, w, C, 1]` times its weights `[C, m]`
                    Op::Binary(BinaryOp::Mul) if depthwise_multiplied(g, &ops) => {
                        errors.push(unsupported(g, n, "a depthwise convolution of several channels with a channel multiplier above 1 has no wafer kernel yet".into(), "a multiplier of 1 runs (MobileNet's depthwise convolutions), and so does a multiplier over an image of one channel; or follow a multiplier-1 depthwise convolution with a 1x1 `conv2d` (a separable convolution)"));
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
            // a statistic of the batch (or a value made from one) given to every sample
            // alike (batch norm's gradient): each sample's copy of the step's value
            Op::BroadcastTo if leading && (has(Class::Batch) || has(Class::Step)) => Class::Sample,
            _ if has(Class::Batch) || has(Class::Step) => Class::Step,
            // constants made one per sample (positions): streamed by the host
            _ if per_sample_constant(g, n, batch) => Class::Sample,
            _ => Class::Host,
        };
        // (a sample's value of the inputs and constants alone, which the host can make)
        let source = matches!(
            node.op,
            Op::Input { .. } | Op::RandomUniform { .. } | Op::RandomNormal { .. }
        ) || (c == Class::Sample && per_sample_constant(g, n, batch));
        inputs_only[n.index()] = c == Class::Sample
            && (source
                || (ops.iter().any(|o| inputs_only[o.index()])
                    && (ops.iter()).all(|o| inputs_only[o.index()] || cl(o) == Class::Host)));
        class[n.index()] = c;
    }
    (class, alias, inputs_only, errors)
}

/// Why reshaping sample value `from` into `to` has no wafer kernel, and the nearest
/// form that has: attention's heads split or merged, an axis folded into the batch, or
/// an image's channels moved.
fn reshape_blocker(g: &Graph, from: NodeIndex, to: NodeIndex) -> (String, &'static str) {
    let (a, b) = (&g.ty(from).shape, &g.ty(to).shape);
    let what = format!("{} into {}", g.ty(from), g.ty(to));
    let heads = |a: &[usize], b: &[usize]| {
        a.len() == 3 && b.len() == 4 && a[..2] == b[..2] && a[2] == b[2] * b[3]
    };
    let attention = "the wafer keeps a token's features together; attention's heads run on the host for now (`--target host`)";
    if heads(a, b) {
        (
            format!("splitting each token's features into heads ({what}) has no wafer kernel yet"),
            attention,
        )
    } else if heads(b, a) {
        (format!("merging attention's heads into each token's features ({what}) has no wafer kernel yet"), attention)
    } else if a.first() != b.first() {
        (format!("a reshape that folds another axis into the batch ({what}: a product over heads, as einsum makes one) has no wafer kernel"), "the wafer streams the samples of a batch one by one: keep the batch dimension first, alone, or train on the host (`--target host`)")
    } else {
        (format!("a reshape of {what} has no wafer kernel yet"), "the wafer keeps images planar (channel by channel) and regroups their pixels or flattens them for a dense layer, nothing else: keep the image's channels and reshape only its height and width, or use `--target host`")
    }
}

/// Whether one of two shapes (the batch first in both) regroups the other's axes
/// (`regrouping`).
pub fn regroups(a: &[usize], b: &[usize]) -> bool {
    regrouping(a, b).is_some() || regrouping(b, a).is_some()
}

/// How shape `fine` (a sample's, the batch first) regroups the axes of `coarse`, each
/// of `coarse`'s a run of `fine`'s (attention's heads split from a token's features,
/// `[B, T, h * d]` as `[B, T, h, d]`): for each axis of `fine`, the axis of `coarse` it
/// lies in and the entries of that axis one of its steps spans (`(0, 0)` for an axis
/// of one); `None` when `fine` does not regroup `coarse`.
pub fn regrouping(fine: &[usize], coarse: &[usize]) -> Option<Vec<(usize, usize)>> {
    if fine.first() != coarse.first() {
        return None;
    }
    let mut out = vec![(0, 0); fine.len()];
    let (mut a, mut left) = (1, 1usize);
    for (i, &f) in fine.iter().enumerate().skip(1) {
        if f == 1 {
            continue;
        }
        while left == 1 {
            left = *coarse.get(a)?;
            a += 1;
        }
        if !left.is_multiple_of(f) {
            return None;
        }
        left /= f;
        out[i] = (a - 1, left);
    }
    let rest_ones = coarse[a.min(coarse.len())..].iter().all(|&c| c == 1);
    (left == 1 && rest_ones).then_some(out)
}

/// Whether `ops`, a product's operands, are a depthwise convolution's tap of several
/// channels with a multiplier above 1 (`depthwise_conv` elaborates each tap as a window
/// `[B, h, w, C, 1]` times the tap's weights `[C, m]`).
fn depthwise_multiplied(g: &Graph, ops: &[NodeIndex]) -> bool {
    let [a, b] = ops else { return false };
    let (a, b) = (&g.ty(*a).shape, &g.ty(*b).shape);
    matches!(
        (a.as_slice(), b.as_slice()),
        (&[_, _, _, c, 1], &[c2, m]) if c == c2 && c > 1 && m > 1
    )
}

/// Which nodes the forward pass computes: those the loss, a prediction or a metric
/// reads, not a gradient (a convolution's input gradient and a transposed convolution
/// are one op).
pub fn forward(g: &Graph) -> Vec<bool> {
    let mut forward = vec![false; g.g.node_bound()];
    let roots = (g.outputs.iter())
        .filter(|o| matches!(o.role, Role::Loss | Role::Prediction | Role::MetricInput));
    let mut stack: Vec<NodeIndex> = roots.map(|o| o.node).collect();
    while let Some(n) = stack.pop() {
        if !std::mem::replace(&mut forward[n.index()], true) {
            stack.extend(g.operands(n));
        }
    }
    forward
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
    if let (Some(a), Some(b)) = (planes(g, from), planes(g, to)) {
        return a.1 == b.1;
    }
    match (image(g, from), image(g, to)) {
        (Some(a), Some(b)) => a.2 == b.2,
        (Some(_), None) => rank(to) == 2,
        // a vector made an image of one channel, or a dense layer's input gradient
        // made the image it flattened again
        (None, Some(_)) => rank(from) == 2,
        (None, None) => false,
    }
}

/// Whether reshaping sample value `from` into `to` keeps every word where planar images
/// have it: `planar_view`'s or `flat`'s, but a vector made an image of several channels
/// and pixels (whose words a vector has pixel by pixel, an image channel by channel).
fn in_order(g: &Graph, from: NodeIndex, to: NodeIndex) -> bool {
    match (image(g, from), image(g, to)) {
        (None, Some((h, w, c))) => g.ty(from).rank() == 2 && (c == 1 || h * w == 1),
        _ => planar_view(g, from, to) || flat(g, from, to),
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

/// The planes value `n` lies in on the wafer when it is an image or its pixels regrouped
/// (rank 4 or more, the channels last: a strided convolution's view of an image as
/// `[B, H/s, s, W/s, s, C]`): a plane's pixels and the channels.
pub fn planes(g: &Graph, n: NodeIndex) -> Option<(u32, u32)> {
    let s = &g.ty(n).shape;
    let c = *s.last()?;
    (s.len() >= 4).then(|| (s[1..s.len() - 1].iter().product::<usize>() as u32, c as u32))
}

/// A graph's batch, classes, aliases and values of the inputs alone (`classify`), and
/// its blockers: every construct that has no wafer layout, as far as each node alone
/// shows it (a node the batch does not class: an op over the batch, random numbers
/// without it), each once, so that a check reports them together.
/// `form_surveyed` refuses a graph with any, and finds the rest (how kernels meet) one
/// at a time.
pub struct Survey {
    pub(super) batch: u32,
    pub(super) class: Vec<Class>,
    pub(super) alias: Vec<Option<NodeIndex>>,
    pub(super) inputs_only: Vec<bool>,
    pub blockers: Vec<Unsupported>,
}

/// `g`'s survey (see `Survey`).
pub fn survey(g: &Graph) -> Survey {
    let batch = batch_of(g).unwrap_or(1);
    let (class, alias, inputs_only, mut errors) = classify(g, batch);
    // each once (a layer's gradient nodes point at the layer too)
    let mut seen = BTreeSet::new();
    errors.retain(|u| seen.insert((u.span.file, u.span.lo, u.span.hi, u.message.clone())));
    Survey {
        batch,
        class,
        alias,
        inputs_only,
        blockers: errors,
    }
}
