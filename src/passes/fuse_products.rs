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
//! (`backend::wafer::form::joined`), each variable's update running over its columns
//! as any layer's does. So the variables fused take steps of one form: trained by the
//! same optimisers, each alike in a decoupled weight decay, all trainable. Other
//! targets keep their products: a backend's GEMM does not gain from it as the wafer's
//! layout does.

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

/// The products `x W` of value `x` whose `W` is a variable of `x`'s dtype that no other
/// product reads (a regulariser may), trained alike: each product with its variable.
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
            && g.g
                .neighbors_directed(w, Direction::Outgoing)
                .all(|u| u == m || !product(g, u));
        if plain {
            layers.push((m, w));
        }
    }
    // (in the graph's order, so the slices keep the program's; each optimiser's apart)
    layers.sort_by_key(|&(m, _)| m.index());
    // (a variable a regulariser reads too takes another step: those fuse apart)
    let regularised = |w: NodeIndex| g.g.neighbors_directed(w, Direction::Outgoing).count() > 1;
    let optimiser = |w: NodeIndex| (optimiser_of(g, w), regularised(w));
    let first = layers.first().map(|&(_, w)| optimiser(w));
    layers.retain(|&(_, w)| Some(optimiser(w)) == first);
    layers
}

/// Whether node `n` multiplies by a weight: a product or a convolution (a weight read
/// by two is shared, and stays its layers').
fn product(g: &Graph, n: NodeIndex) -> bool {
    matches!(
        g.node(n).op,
        Op::MatMul | Op::Conv2d(_) | Op::Conv2dBackpropInput(_) | Op::Gather
    )
}

/// The optimisers that train variable `w` (`autodiff::trains`), each with whether its
/// decoupled weight decay skips `w`: variables alike in these take steps of one form.
fn optimiser_of(g: &Graph, w: NodeIndex) -> Vec<(usize, bool)> {
    let Op::Variable {
        name,
        trainable: true,
        ..
    } = &g.node(w).op
    else {
        return Vec::new(); // (frozen: trained by none)
    };
    let opts = &g.optimizers;
    let skips = |k: usize| (opts[k].decay_exclude.iter()).any(|p| crate::ir::name_matches(p, name));
    (0..opts.len())
        .filter(|&k| super::autodiff::trains(opts, k, name))
        .map(|k| (k, skips(k)))
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

#[cfg(test)]
mod tests {
    use crate::elab::Target;
    use crate::ir::Op;

    /// The variables the products of the train graph read side by side (each fused
    /// layer's), for four towers on a hidden value trained by `optimiser` on `target`.
    fn joined(optimiser: &str, target: Target) -> Vec<Vec<String>> {
        let towers = "dense(h, 4, activation: relu), dense(h, 4, activation: relu), dense(h, 2, activation: relu), dense(h, 4, activation: tanh)";
        joined_towers(towers, optimiser, target)
    }

    /// `joined` of the towers `towers` (of `h`, into a concat).
    fn joined_towers(towers: &str, optimiser: &str, target: Target) -> Vec<Vec<String>> {
        let src = format!(
            r#"use std.nn.dense
use std.losses.softmax_cross_entropy
model m(features: f32[B, 8], labels: i32[B]) {{
  let h = dense(features, 8, activation: relu)
  let towers = [{towers}]
  let loss = softmax_cross_entropy(labels, dense(concat(towers, axis: 1), 3))
  train {{ minimize loss with {optimiser} }}
}}
input data() {{ range(64) |> map |i| (broadcast_to(cast(i, f32), [8]), i % 3) |> repeat |> batch(8, drop_remainder: true) }}
estimator e {{ model = m  train_input = data() }}
"#
        );
        let p = crate::Program::from_source("t.est", &src, None);
        let opts = crate::CheckOptions {
            target,
            modes: vec![crate::syntax::ast::SectionKind::Train],
            ..Default::default()
        };
        let c = crate::check(&p, &opts);
        let g = c.graphs[0].graph.as_ref();
        let name = |v| match &g.node(v).op {
            Op::Variable { name, .. } => name.clone(),
            _ => String::new(),
        };
        (g.g.node_indices())
            .filter(|&n| crate::backend::wafer::form::joined(g, n).is_some())
            .map(|n| g.operands(n).into_iter().map(name).collect())
            .collect()
    }

    #[test]
    fn layers_of_one_value_fuse_only_for_the_wafer_and_only_when_trained_alike() {
        let all = [
            "dense_1/kernel",
            "dense_2/kernel",
            "dense_3/kernel",
            "dense_4/kernel",
        ];
        assert_eq!(joined("adam(lr: 0.01)", Target::Wafer), [all]);
        assert!(joined("adam(lr: 0.01)", Target::Interp).is_empty());
        // (a decoupled weight decay that skips one kernel: the other three fuse)
        let adamw =
            r#"adamw(lr: 0.01, weight_decay: 0.01, exclude_from_weight_decay: ["dense_2/kernel"])"#;
        let three = ["dense_1/kernel", "dense_3/kernel", "dense_4/kernel"];
        assert_eq!(joined(adamw, Target::Wafer), [three]);
        // (a regulariser on one kernel: its step differs too; on all, they fuse)
        let l2 = |t: &str| t.replace("activation:", "kernel_regularizer: l2(0.01), activation:");
        let one = "dense(h, 4, activation: relu), ".to_string()
            + &l2("dense(h, 4, activation: relu)")
            + ", dense(h, 2, activation: relu), dense(h, 4, activation: tanh)";
        assert_eq!(joined_towers(&one, "sgd(lr: 0.1)", Target::Wafer), [three]);
        let all = l2("dense(h, 4, activation: relu), dense(h, 4, activation: relu), dense(h, 2, activation: relu), dense(h, 4, activation: tanh)");
        assert_eq!(joined_towers(&all, "sgd(lr: 0.1)", Target::Wafer).len(), 1);
    }
}
