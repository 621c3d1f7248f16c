//! The graph the wafer forms: without the train summaries (which the runtime computes
//! apart), and with a relay where a layer's output is read by the kernel after it and
//! again past it.
//!
//! A pre-LayerNorm residual (`x + f(layer_norm(x))`, GPT's blocks) reads a layer's
//! output `x` (an embedding's, a block's last layer's) twice: the vector kernel after
//! the layer normalises it, and the sum past the block adds it. So does a residual
//! straight after a layer (`x + attention(x)` on a sum of embeddings, Keras's
//! transformer block): the next layer reads `x`, and the sum past it. The chain
//! carries a value past layers only from the vector kernel just before the first of
//! them, which sends it beside its own output (`Carry`, `Formed::passed`). A relay
//! `x * 1` makes `x` that kernel's value: every reader of `x` but the layer itself
//! reads the relay, so the relay (with the normalisation) and the sum fall into one
//! group of nodes, which the layer after splits as it splits any residual
//! (`groups::residuals`).

use super::{form, End, Formed, Kind};
use crate::ir::{BinaryOp, Graph, Op, TensorType};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use std::borrow::Cow;

/// `g` as the wafer forms it: without its train summaries, each value the chain could
/// not carry past the kernel after its layer relayed (by that kernel when it is a
/// vector kernel, else by a vector kernel of its own between the two layers).
pub fn prepared(g: &Graph) -> Cow<'_, Graph> {
    let g = crate::passes::without_summaries(g);
    match form(&g).ok().map(|f| relayed(&g, &f)) {
        Some(Some(r)) => Cow::Owned(r),
        _ => g,
    }
}

/// The forward values a layer makes that the kernel after it reads, and a kernel past
/// that one too, which it does not carry there: each with its layer.
fn to_relay(f: &Formed) -> Vec<(petgraph::stable_graph::NodeIndex, usize)> {
    (f.streams.iter())
        .filter(|s| !s.bwd)
        .filter_map(|s| match s.from {
            End::Kernel(a) if matches!(f.kernels[a].kind, Kind::Dense { .. }) => {
                let next = s.to.contains(&End::Kernel(a + 1));
                let past = s
                    .to
                    .iter()
                    .any(|t| matches!(t, End::Kernel(b) if *b > a + 1 && !f.carried(s.node, *b)));
                (next && past).then_some((s.node, a))
            }
            _ => None,
        })
        .collect()
}

/// `g` with a relay of each value `to_relay` finds, or `None` when there is none.
fn relayed(g: &Graph, f: &Formed) -> Option<Graph> {
    let relays = to_relay(f);
    if relays.is_empty() {
        return None;
    }
    let mut g = g.clone();
    for (v, layer) in relays {
        let (ty, span) = (g.ty(v).clone(), g.node(v).span);
        let one = Op::Const {
            bits: 1f64.to_bits(),
        };
        let one = g.add(one, &[], TensorType::scalar(ty.dtype), span);
        let users: Vec<_> = (g.g.edges_directed(v, Direction::Outgoing))
            .filter(|e| f.owner.get(e.target().index()).copied().flatten() != Some(layer))
            .map(|e| (e.target(), *e.weight(), e.id()))
            .collect();
        let relay = g.add(Op::Binary(BinaryOp::Mul), &[v, one], ty, span);
        for (user, idx, e) in users {
            g.g.remove_edge(e);
            g.g.add_edge(relay, user, idx);
        }
    }
    Some(g)
}
