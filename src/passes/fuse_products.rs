//! Horizontal fusion of products (the wafer's): the dense layers of one value whose
//! weights are variables (`x Wq`, `x Wk`, `x Wv`, attention's separate projections)
//! become one layer of the variables side by side, `x concat([Wq, Wk, Wv])`, whose
//! outputs are sliced apart. Each variable keeps its name, initialiser, optimiser and
//! slots: only the product changes, so the gradients reach each variable through the
//! concatenation (a slice of the layer's weight gradient each) and the step is the
//! same, up to the order the input gradient's sum adds in.
//!
//! The wafer lays out a chain of layers, and three layers of one value (or two of a
//! sequence, which a layer over tokens cannot carry past itself) are not a chain; one
//! layer is, whose weight the kernel holds as the variables' columns
//! (`form::weight_parts`). Other targets keep their products: a backend's GEMM does
//! not gain from it as the wafer's layout does.

use super::PassCtx;
use crate::diag::Diags;
use crate::elab::Target;
use crate::ir::{Graph, NodeIndex, Op, TensorType};
use petgraph::Direction;

pub fn run(g: &mut Graph, ctx: &PassCtx, _diags: &mut Diags) {
    if ctx.target != Target::Wafer || g.output(crate::ir::Role::NextStep).is_some() {
        return; // (a train graph is differentiated already: fusing now would skip it)
    }
    for x in g.topo_order() {
        if !g.g.contains_node(x) {
            continue; // (a product fused already)
        }
        let layers = layers_of(g, x);
        // (two layers of a value lay out as towers, but not of a sequence)
        let least = if g.ty(x).rank() >= 3 { 2 } else { 3 };
        if layers.len() >= least {
            fuse(g, x, &layers);
        }
    }
}

/// The products `x W` of value `x` whose `W` is a variable of `x`'s dtype that nothing
/// else reads, trained by the same optimisers: each product with its variable.
fn layers_of(g: &Graph, x: NodeIndex) -> Vec<(NodeIndex, NodeIndex)> {
    let mut layers: Vec<(NodeIndex, NodeIndex)> = Vec::new();
    let dtype = g.ty(x).dtype;
    for m in g.g.neighbors_directed(x, Direction::Outgoing) {
        let ops = g.operands(m);
        if !matches!(g.node(m).op, Op::MatMul) || ops[0] != x || ops[1] == x {
            continue;
        }
        let w = ops[1];
        let plain = matches!(g.node(w).op, Op::Variable { .. })
            && g.ty(w).rank() == 2
            && g.ty(w).dtype == dtype
            && g.g.neighbors_directed(w, Direction::Outgoing).count() == 1;
        if plain && !layers.iter().any(|&(n, _)| n == m) {
            layers.push((m, w));
        }
    }
    // (in the graph's order, so the slices keep the program's; each optimiser's apart)
    layers.sort_by_key(|&(m, _)| m.index());
    let optimiser = |w: NodeIndex| optimiser_of(g, w);
    let first = layers.first().map(|&(_, w)| optimiser(w));
    layers.retain(|&(_, w)| Some(optimiser(w)) == first);
    layers
}

/// The optimisers that train variable `w`, as autodiff decides: those that name it,
/// or, if none does, every one that names none.
fn optimiser_of(g: &Graph, w: NodeIndex) -> Vec<usize> {
    let Op::Variable { name, .. } = &g.node(w).op else {
        return Vec::new();
    };
    let names = |o: &crate::ir::Optimizer| o.variables.as_ref().map(|v| v.contains(name));
    let named: Vec<usize> = (0..g.optimizers.len())
        .filter(|&k| names(&g.optimizers[k]) == Some(true))
        .collect();
    if !named.is_empty() {
        return named;
    }
    (0..g.optimizers.len())
        .filter(|&k| names(&g.optimizers[k]).is_none())
        .collect()
}

/// Makes products `layers` of `x` one, `x concat(W...)`, each old product a slice of it.
fn fuse(g: &mut Graph, x: NodeIndex, layers: &[(NodeIndex, NodeIndex)]) {
    let (rows, dtype) = (g.ty(layers[0].1).shape[0], g.ty(x).dtype);
    let widths: Vec<usize> = layers.iter().map(|&(_, w)| g.ty(w).shape[1]).collect();
    let total: usize = widths.iter().sum();
    let span = g.node(layers[0].0).span;
    let ws: Vec<NodeIndex> = layers.iter().map(|&(_, w)| w).collect();
    let weight = TensorType::new(dtype, vec![rows, total]);
    let joined = g.add(Op::Concat { axis: 1 }, &ws, weight, span);
    let mut shape = g.ty(x).shape.to_vec();
    let axis = shape.len() - 1;
    shape[axis] = total;
    let y = g.add(
        Op::MatMul,
        &[x, joined],
        TensorType::new(dtype, shape),
        span,
    );
    let mut start = 0;
    for (&(m, _), width) in layers.iter().zip(widths) {
        let slice = Op::Slice {
            axis,
            start,
            end: start + width,
        };
        let ty = g.ty(m).clone();
        let s = g.add(slice, &[y], ty, g.node(m).span);
        g.replace_uses(m, s);
        start += width;
    }
    let old: Vec<NodeIndex> = layers.iter().map(|&(m, _)| m).collect();
    g.remove_nodes(&old);
}
