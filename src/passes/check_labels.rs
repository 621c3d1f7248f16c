//! Class labels outside `[0, classes)` are errors at run time, not silent zero rows:
//! a `one_hot` of an out-of-range index is a row of zeros (TensorFlow's semantics, kept
//! for `one_hot` itself), so a loss would train on nothing for that example and
//! `accuracy` would count it wrong without a word. This pass puts a `check_indices`
//! before
//!
//! - the indices of every `one_hot` whose value reaches the loss and whose indices are
//!   computed from the model's labels (the sparse path of `softmax_cross_entropy`, or a
//!   user's `one_hot` of the labels; a `one_hot` of a feature keeps TensorFlow's zero
//!   rows, which Keras's masked one-hot and TensorFlow's indicator columns, whose
//!   padding is -1, rely on), and
//! - the labels of every `accuracy` metric whose predictions are an `argmax` (or
//!   `argmin`) over `classes` values,
//!
//! so that the backend stops at the first bad label and names it, with its batch
//! position (the runtime adds the step). TensorFlow's sparse losses raise here too.

use super::PassCtx;
use crate::diag::Diags;
use crate::ir::{Graph, NodeIndex, Op, Role};
use petgraph::visit::{EdgeRef, NodeIndexable};
use petgraph::Direction;

pub fn run(g: &mut Graph, _ctx: &PassCtx, _diags: &mut Diags) {
    let reaches = reaches_loss(g);
    let labelled = from_labels(g);
    let one_hots: Vec<(NodeIndex, usize)> =
        g.g.node_indices()
            .filter(|n| reaches[n.index()])
            .filter_map(|n| match g.node(n).op {
                Op::OneHot { depth } if labelled[g.operands(n)[0].index()] => Some((n, depth)),
                _ => None,
            })
            .collect();
    for (n, depth) in one_hots {
        let idx = g.operands(n)[0];
        if already_checked(g, idx, depth) {
            continue;
        }
        let checked = check(g, idx, depth, n);
        if let Some(e) = g.g.find_edge(idx, n) {
            g.g.remove_edge(e);
        }
        g.g.add_edge(checked, n, 0);
    }
    for m in g.metrics.clone() {
        if m.reducer != "accuracy" || m.args.len() != 2 {
            continue;
        }
        let (labels, preds) = (g.outputs[m.args[0]].node, g.outputs[m.args[1]].node);
        let classes = match g.node(preds).op {
            Op::ArgMax { axis } | Op::ArgMin { axis } => {
                g.ty(g.operands(preds)[0]).shape.get(axis).copied()
            }
            _ => None,
        };
        if let Some(c) = classes.filter(|_| g.ty(labels).dtype.is_int()) {
            if !already_checked(g, labels, c) {
                let checked = check(g, labels, c, labels);
                g.outputs[m.args[0]].node = checked;
            }
        }
    }
    g.renumber();
}

/// `check_indices(idx)`, with the span of `at`.
fn check(g: &mut Graph, idx: NodeIndex, depth: usize, at: NodeIndex) -> NodeIndex {
    let ty = g.ty(idx).clone();
    let span = g.node(at).span;
    g.add(Op::CheckIndices { depth }, &[idx], ty, span)
}

fn already_checked(g: &Graph, n: NodeIndex, depth: usize) -> bool {
    matches!(g.node(n).op, Op::CheckIndices { depth: d } if d == depth)
}

/// The nodes whose value is computed from the model's labels (`Graph::label_feeds`).
fn from_labels(g: &Graph) -> Vec<bool> {
    let labels = g
        .g
        .node_indices()
        .filter(|&n| matches!(&g.node(n).op, Op::Input { name } if g.label_feeds.contains(name)));
    reach(g, labels.collect(), Direction::Outgoing)
}

/// The nodes whose value the loss reads (through any path).
fn reaches_loss(g: &Graph) -> Vec<bool> {
    let losses = (g.outputs.iter())
        .filter(|o| o.role == Role::Loss)
        .map(|o| o.node);
    reach(g, losses.collect(), Direction::Incoming)
}

/// The nodes reached from `start` (themselves included) along edges in `dir`.
fn reach(g: &Graph, mut stack: Vec<NodeIndex>, dir: Direction) -> Vec<bool> {
    let mut seen = vec![false; g.g.node_bound()];
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut seen[n.index()], true) {
            continue;
        }
        stack.extend(g.g.edges_directed(n, dir).map(|e| match dir {
            Direction::Incoming => e.source(),
            Direction::Outgoing => e.target(),
        }));
    }
    seen
}
