//! Exact evaluation of a partial last batch (TPUEstimator's `is_real_example`, done by
//! the compiler). An eval or predict input without `drop_remainder` may end with a
//! batch smaller than the graph's static batch size; the runtime pads it with copies of
//! its last row and feeds a `bool[B]` mask of the real rows (`MASK_INPUT`). This pass
//! makes the graph ignore the padding:
//!
//! - it follows, for every node, which axis holds the examples (row `i` computed from
//!   example `i` alone), through elementwise ops, broadcasting, reshapes, transposes,
//!   matmuls, convolutions (transposed ones too), pooling and gathers, and through a
//!   reshape that merges the examples with the axis after them (`[B, T, D]` to
//!   `[B * T, D]`, as `einsum` does), row blocks of one example each;
//! - every reduction across that axis (`reduce_sum`, `reduce_mean`, ... over the
//!   batch) becomes the same reduction over the real rows only, so a loss written with
//!   `reduce_mean` over the batch is the mean over the real examples;
//! - each prediction and metric argument should be per example (the runtime keeps its
//!   real rows), and the loss a mean over the examples (an affine function of
//!   `reduce_mean`s over the batch, such as a `std.losses` loss plus a regulariser),
//!   which the runtime averages over batches weighted by their real examples. Any
//!   other output (a loss that sums over the batch, a metric fed one value per batch, a
//!   value that mixes the examples through a matmul or a softmax over the batch) would
//!   come out differently with padding: it is W0513 here, and E0916 at run time only
//!   if a partial batch actually arrives (an eval set that divides evenly runs as it
//!   always did).
//!
//! It runs only on graphs whose `partial_batches` elaboration set.

use super::PassCtx;
use crate::diag::{Code, Diag, Diags};
use crate::ir::{
    BatchMask, DType, Graph, NodeIndex, Op, ReduceOp, Role, Shape, TensorType, MASK_INPUT,
};
use crate::span::Span;
use petgraph::visit::{EdgeRef, NodeIndexable};

/// How a value depends on the examples of its batch.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Rows {
    /// Not at all (constants, variables, the step, random numbers).
    Shared,
    /// Row by row along an axis, in blocks of `per` rows (`Axis(axis, per)`): rows
    /// `i * per .. (i + 1) * per` depend on example `i` (and shared or exactly
    /// aggregated values) only. `per` is 1 but where a reshape merged the examples with
    /// the axis after them (`[B, T, D]` to `[B * T, D]`, as `einsum` does).
    Axis(usize, usize),
    /// An affine function of means over the real examples (`reduce_mean` over the
    /// batch, then sums, differences and scalings by shared values): its mean over all
    /// examples is the mean of its per-batch values weighted by their real examples.
    Mean,
    /// Another aggregate over the real examples (a sum or a max over the batch, a
    /// nonlinear function of a mean): exact per batch, not across batches of unequal
    /// size.
    Aggregate,
    /// Mixes the examples in a way padding would change; the op that did it.
    Mixed(NodeIndex),
}

pub fn run(g: &mut Graph, _ctx: &PassCtx, diags: &mut Diags) {
    if !g.partial_batches || g.batch_mask.is_some() {
        return;
    }
    let inputs: Vec<NodeIndex> =
        g.g.node_indices()
            .filter(|&n| matches!(g.node(n).op, Op::Input { .. }))
            .collect();
    let Some(size) = inputs.first().and_then(|&n| g.ty(n).shape.first().copied()) else {
        return;
    };
    let span = inputs.first().map_or(Span::default(), |&n| g.node(n).span);
    let mask = g.add(
        Op::Input {
            name: MASK_INPUT.into(),
        },
        &[],
        TensorType::new(DType::Bool, vec![size]),
        span,
    );
    let mut rows = vec![Rows::Shared; g.g.node_bound()];
    for n in g.topo_order() {
        let r = match &g.node(n).op {
            _ if n == mask => continue,
            Op::Input { .. } => Rows::Axis(0, 1),
            Op::Reduce { .. } => reduction(g, n, &mut rows, mask, size),
            _ => follow(g, n, &rows),
        };
        set(&mut rows, n, r);
    }
    let mut per_example = Vec::new();
    let mut inexact = Vec::new();
    for (i, o) in g.outputs.iter().enumerate() {
        let what = match o.role {
            Role::Loss => "the eval loss",
            Role::MetricInput => "a metric's argument",
            Role::Prediction => "a prediction",
            _ => continue,
        };
        let r = rows[o.node.index()];
        let ok = match (o.role, r) {
            (_, Rows::Shared) => true,
            (Role::Loss, Rows::Mean) => true,
            (Role::MetricInput | Role::Prediction, Rows::Axis(0, 1)) => {
                per_example.push(i);
                true
            }
            _ => false,
        };
        if !ok {
            let d = unmaskable(g, o.node, &o.name, what, r);
            inexact.push(format!("{what} `{}`", o.name));
            diags.push(d);
        }
    }
    g.batch_mask = Some(BatchMask {
        input: mask,
        size,
        per_example,
        inexact,
    });
    g.renumber();
}

/// Records the rows of `n` (the rewrites add nodes beyond the table's end).
fn set(rows: &mut Vec<Rows>, n: NodeIndex, r: Rows) {
    if rows.len() <= n.index() {
        rows.resize(n.index() + 1, Rows::Shared);
    }
    rows[n.index()] = r;
}

/// The rows of the reduction `n`. One across the examples axis is rewritten to skip
/// the padding (its result then a mean or another aggregate over the real examples);
/// others keep or shift the axis.
fn reduction(
    g: &mut Graph,
    n: NodeIndex,
    rows: &mut Vec<Rows>,
    mask: NodeIndex,
    size: usize,
) -> Rows {
    let Op::Reduce {
        op,
        axes,
        keep_dims,
    } = g.node(n).op.clone()
    else {
        return Rows::Mixed(n);
    };
    let x = g.operands(n)[0];
    match rows[x.index()] {
        Rows::Axis(a, per) if axes.contains(&a) => {
            let result = mask_reduction(g, n, x, (a, per), op, mask, size);
            let r = if op == ReduceOp::Mean {
                Rows::Mean
            } else {
                Rows::Aggregate
            };
            set(rows, result, r);
            r
        }
        Rows::Axis(a, per) if keep_dims => Rows::Axis(a, per),
        Rows::Axis(a, per) => Rows::Axis(a - axes.iter().filter(|&&ax| ax < a).count(), per),
        Rows::Mean if matches!(op, ReduceOp::Sum | ReduceOp::Mean) => Rows::Mean,
        Rows::Mean => Rows::Aggregate,
        r => r,
    }
}

/// W0513: an output that padding rows would change.
fn unmaskable(g: &Graph, out: NodeIndex, name: &str, what: &str, r: Rows) -> Diag {
    let (why, at, label) = match r {
        Rows::Mixed(m) => (
            format!(
                "mixes the examples of a batch (through a `{}`)",
                g.node(m).op.name()
            ),
            g.node(m).span,
            format!("this `{}` mixes the examples", g.node(m).op.name()),
        ),
        Rows::Mean | Rows::Aggregate if what.starts_with("the eval loss") => (
            "is not a mean over the examples (it sums, or takes a maximum, or a nonlinear function of a mean, over the batch), so a smaller last batch would change it"
                .to_string(),
            g.node(out).span,
            "not a mean over the examples".to_string(),
        ),
        Rows::Mean | Rows::Aggregate => (
            "is one value per batch, so the smaller last batch would weigh as much as a full one"
                .to_string(),
            g.node(out).span,
            format!("one value per batch: {}", g.ty(out)),
        ),
        _ => (
            format!(
                "has its examples along another axis than the first ({})",
                g.ty(out)
            ),
            g.node(out).span,
            format!("{}", g.ty(out)),
        ),
    };
    let help = if what.starts_with("the eval loss") {
        "write the loss as a mean over the batch (`reduce_mean`, as the std.losses do), or drop the partial last batch with `batch(n, drop_remainder: true)`; an eval set that divides into full batches runs as it is"
    } else {
        "give it one row per example (the batch first), or drop the partial last batch with `batch(n, drop_remainder: true)`; an eval set that divides into full batches runs as it is"
    };
    let mut d = Diag::new(
        Code::UnmaskablePartialBatch,
        at,
        format!("{what} `{name}` {why}: a padded last batch cannot be evaluated exactly"),
    )
    .label(label)
    .help(help);
    if g.node(out).span != at {
        d = d.with(g.node(out).span, format!("`{name}`"));
    }
    d
}

/// The rows of an op other than a reduction, from its operands'.
fn follow(g: &Graph, n: NodeIndex, rows: &[Rows]) -> Rows {
    let node = g.node(n);
    let ops = g.operands(n);
    let of = |i: usize| rows[ops[i].index()];
    let rank = node.ty.rank();
    let mixed = Rows::Mixed(n);
    match &node.op {
        Op::Variable { .. }
        | Op::Const { .. }
        | Op::GlobalStep
        | Op::Iota { .. }
        | Op::RandomUniform { .. }
        | Op::RandomNormal { .. } => Rows::Shared,
        // Elementwise, with numpy broadcasting (right-aligned axes).
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast | Op::BroadcastTo => {
            let all: Vec<Rows> = ops
                .iter()
                .map(|&o| aligned(rows[o.index()], g.ty(o).rank(), rank))
                .collect();
            let r = combine(all.iter().copied(), mixed);
            if r == Rows::Mean && !affine(&node.op, &all, node.ty.dtype) {
                Rows::Aggregate
            } else {
                r
            }
        }
        Op::CrossShardMean => of(0),
        Op::OneHot { .. }
        | Op::DecodeRaw
        | Op::DecodeImage { .. }
        | Op::CheckIndices { .. }
        | Op::Lookup { .. }
        | Op::HashBucket { .. } => nonlinear(of(0)),
        Op::ArgMax { axis } | Op::ArgMin { axis } => match of(0) {
            Rows::Axis(a, _) if a == *axis => mixed,
            Rows::Axis(a, per) if a > *axis => Rows::Axis(a - 1, per),
            r => nonlinear(r),
        },
        Op::Softmax { axis } | Op::LogSoftmax { axis } => match of(0) {
            Rows::Axis(a, _) if a == *axis => mixed,
            r => nonlinear(r),
        },
        Op::Slice { axis, .. } => match of(0) {
            Rows::Axis(a, _) if a == *axis => mixed,
            r => r,
        },
        Op::Concat { axis } => {
            let all: Vec<Rows> = ops.iter().map(|o| rows[o.index()]).collect();
            if all
                .iter()
                .any(|r| matches!(r, Rows::Axis(a, _) if a == axis))
            {
                mixed
            } else {
                combine(all.into_iter(), mixed)
            }
        }
        Op::Transpose { perm } => match of(0) {
            Rows::Axis(a, per) => Rows::Axis(perm.iter().position(|&p| p == a).unwrap_or(a), per),
            r => r,
        },
        Op::Reshape => match of(0) {
            Rows::Axis(a, per) => {
                reshaped(&g.ty(ops[0]).shape, &node.ty.shape, a, per).unwrap_or(mixed)
            }
            r => r,
        },
        Op::MatMul => {
            if of(0) == Rows::Mean && of(1) == Rows::Mean {
                return Rows::Aggregate;
            }
            let (ra, rb) = (g.ty(ops[0]).rank(), g.ty(ops[1]).rank());
            let a = match of(0) {
                Rows::Axis(x, _) if x + 1 == ra => mixed,
                Rows::Axis(x, per) => Rows::Axis(x + rank - ra, per),
                r => r,
            };
            let b = match of(1) {
                Rows::Axis(x, _) if x + 2 == rb => mixed,
                Rows::Axis(x, per) => Rows::Axis(x + rank - rb, per),
                r => r,
            };
            combine([a, b].into_iter(), mixed)
        }
        Op::Gather => match (of(0), of(1)) {
            (Rows::Axis(..) | Rows::Mixed(_), _) => mixed,
            (t, idx) => combine([t, nonlinear(idx)].into_iter(), mixed),
        },
        // (a transposed convolution, `conv2d_transpose`, is a convolution's input
        // gradient: image by image too)
        Op::Conv2d(_) | Op::Conv2dBackpropInput(_) | Op::MaxPool2d(_) | Op::AvgPool2d(_) => {
            let filter = if ops.len() > 1 { of(1) } else { Rows::Shared };
            match (of(0), filter) {
                (_, Rows::Axis(..) | Rows::Mixed(_)) => mixed,
                (Rows::Axis(0, per), f) => {
                    combine([Rows::Axis(0, per), nonlinear(f)].into_iter(), mixed)
                }
                (Rows::Axis(..), _) => mixed,
                (x, f) => nonlinear(combine([x, f].into_iter(), mixed)),
            }
        }
        Op::Input { .. } => Rows::Axis(0, 1),
        // Gradient ops only appear in train graphs.
        Op::Reduce { .. }
        | Op::Conv2dBackpropFilter(_)
        | Op::MaxPool2dGrad(_)
        | Op::AvgPool2dGrad(_)
        | Op::ScatterAdd => mixed,
    }
}

/// An operand's rows as seen in a result of rank `out` (numpy aligns axes on the right).
fn aligned(r: Rows, rank: usize, out: usize) -> Rows {
    match r {
        Rows::Axis(a, per) => Rows::Axis(a + out - rank, per),
        r => r,
    }
}

/// A value computed from `r` by an op that is not linear: a mean goes in, a general
/// aggregate comes out.
fn nonlinear(r: Rows) -> Rows {
    match r {
        Rows::Mean => Rows::Aggregate,
        r => r,
    }
}

/// Whether an elementwise op keeps means over the examples affine: sums and
/// differences of means and shared values, a mean scaled or divided by a shared value,
/// a negation, a cast to a float type, a broadcast, a select by a shared condition.
fn affine(op: &Op, all: &[Rows], dtype: DType) -> bool {
    use crate::ir::{BinaryOp, UnaryOp};
    let means = all.iter().filter(|&&r| r == Rows::Mean).count();
    match op {
        Op::Unary(UnaryOp::Neg | UnaryOp::StopGradient) | Op::BroadcastTo => true,
        Op::Cast => dtype.is_float(),
        Op::Binary(BinaryOp::Add | BinaryOp::Sub) => true,
        Op::Binary(BinaryOp::Mul) => means == 1,
        Op::Binary(BinaryOp::Div) => all[0] == Rows::Mean && all[1] == Rows::Shared,
        Op::Select => all[0] == Rows::Shared,
        _ => false,
    }
}

/// The rows of a value made from several: mixed if any is, or if two hold their
/// examples along different axes.
fn combine(all: impl Iterator<Item = Rows>, mixed: Rows) -> Rows {
    let mut out = Rows::Shared;
    for r in all {
        out = match (out, r) {
            (Rows::Mixed(m), _) | (_, Rows::Mixed(m)) => return Rows::Mixed(m),
            (Rows::Axis(a, p), Rows::Axis(b, q)) if (a, p) != (b, q) => return mixed,
            (Rows::Axis(a, p), _) | (_, Rows::Axis(a, p)) => Rows::Axis(a, p),
            (Rows::Aggregate, _) | (_, Rows::Aggregate) => Rows::Aggregate,
            (Rows::Mean, _) | (_, Rows::Mean) => Rows::Mean,
            _ => Rows::Shared,
        };
    }
    out
}

/// Where the examples of `from` (along axis `a`, in blocks of `per` rows) go in a
/// reshape to `to`: to an axis after the same number of elements (so that each
/// example's elements stay one contiguous run in each of those outer positions) whose
/// rows each hold elements of one example only. `[B, T, D]` to `[B * T, D]` puts them
/// along axis 0 in blocks of T rows, and back.
fn reshaped(from: &[usize], to: &[usize], a: usize, per: usize) -> Option<Rows> {
    let before: usize = from[..a].iter().product();
    // the elements of one example in one outer position
    let block = per.saturating_mul(from[a + 1..].iter().product());
    let mut p = 1usize;
    for (i, &d) in to.iter().enumerate() {
        let inner: usize = to[i + 1..].iter().product();
        if p == before
            && inner > 0
            && block % inner == 0
            && block >= inner
            && d % (block / inner) == 0
        {
            return Some(Rows::Axis(i, block / inner));
        }
        p = p.saturating_mul(d);
    }
    None
}

/// Rewrites the reduction `n` of `x` over (among others) its examples axis `a` to skip
/// the padding rows: padding becomes the reduction's identity, and a mean divides by
/// the number of real elements. Returns the node that now holds the result.
fn mask_reduction(
    g: &mut Graph,
    n: NodeIndex,
    x: NodeIndex,
    (a, per): (usize, usize),
    op: ReduceOp,
    mask: NodeIndex,
    size: usize,
) -> NodeIndex {
    let span = g.node(n).span;
    let xt = g.ty(x).clone();
    // the mask of the rows: each example's `per` rows take its flag
    let rows = if per == 1 {
        mask
    } else {
        let column = g.add(
            Op::Reshape,
            &[mask],
            TensorType::new(DType::Bool, vec![size, 1]),
            span,
        );
        let blocks = g.add(
            Op::BroadcastTo,
            &[column],
            TensorType::new(DType::Bool, vec![size, per]),
            span,
        );
        g.add(
            Op::Reshape,
            &[blocks],
            TensorType::new(DType::Bool, vec![size * per]),
            span,
        )
    };
    let m = if xt.rank() == 1 {
        rows
    } else {
        let mut mshape: Shape = smallvec::smallvec![1; xt.rank()];
        mshape[a] = size * per;
        g.add(
            Op::Reshape,
            &[rows],
            TensorType::new(DType::Bool, mshape),
            span,
        )
    };
    let identity = match (op, xt.dtype.is_float()) {
        (ReduceOp::Sum | ReduceOp::Mean, _) => 0.0,
        (ReduceOp::Prod, _) => 1.0,
        (ReduceOp::Max, true) => f64::NEG_INFINITY,
        (ReduceOp::Min, true) => f64::INFINITY,
        (ReduceOp::Max, false) => int_bound(xt.dtype, false),
        (ReduceOp::Min, false) => int_bound(xt.dtype, true),
    };
    let id = g.add(
        Op::Const {
            bits: identity.to_bits(),
        },
        &[],
        TensorType::scalar(xt.dtype),
        span,
    );
    let kept = g.add(Op::Select, &[m, x, id], xt.clone(), span);
    // The reduction now reads the masked value.
    let edge =
        g.g.find_edge(x, n)
            .expect("the reduction reads its operand");
    g.g.remove_edge(edge);
    g.g.add_edge(kept, n, 0);
    if op != ReduceOp::Mean {
        return n;
    }
    // mean = sum / (real rows * the other reduced axes' sizes)
    let Op::Reduce {
        axes, keep_dims, ..
    } = g.node(n).op.clone()
    else {
        return n;
    };
    g.g[n].op = Op::Reduce {
        op: ReduceOp::Sum,
        axes: axes.clone(),
        keep_dims,
    };
    let users: Vec<(NodeIndex, u32, petgraph::stable_graph::EdgeIndex)> =
        g.g.edges_directed(n, petgraph::Direction::Outgoing)
            .map(|e| (e.target(), *e.weight(), e.id()))
            .collect();
    // (each real example counts its `per` rows)
    let others: usize = per
        * axes
            .iter()
            .filter(|&&ax| ax != a)
            .map(|&ax| xt.shape[ax])
            .product::<usize>();
    let dt = xt.dtype;
    let mf = g.add(Op::Cast, &[mask], TensorType::new(dt, vec![size]), span);
    let real = g.add(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0],
            keep_dims: false,
        },
        &[mf],
        TensorType::scalar(dt),
        span,
    );
    let count = if others == 1 {
        real
    } else {
        let k = g.add(
            Op::Const {
                bits: (others as f64).to_bits(),
            },
            &[],
            TensorType::scalar(dt),
            span,
        );
        g.add(
            Op::Binary(crate::ir::BinaryOp::Mul),
            &[real, k],
            TensorType::scalar(dt),
            span,
        )
    };
    let ty = g.ty(n).clone();
    let mean = g.add(Op::Binary(crate::ir::BinaryOp::Div), &[n, count], ty, span);
    for (user, idx, e) in users {
        g.g.remove_edge(e);
        g.g.add_edge(mean, user, idx);
    }
    for o in &mut g.outputs {
        if o.node == n {
            o.node = mean;
        }
    }
    mean
}

/// The smallest (or largest) value of an integer dtype, as a reduction's identity.
fn int_bound(d: DType, largest: bool) -> f64 {
    match (d, largest) {
        (DType::U8 | DType::Bool, false) => 0.0,
        (DType::U8 | DType::Bool, true) => 255.0,
        (DType::I64, false) => i64::MIN as f64,
        (DType::I64, true) => i64::MAX as f64,
        (_, false) => f64::from(i32::MIN),
        (_, true) => f64::from(i32::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reshape_of_no_elements_is_no_row_regroup() {
        // an example of no elements: no axis of the result holds whole examples
        assert!(reshaped(&[2, 0], &[0, 5], 0, 1).is_none());
        assert!(matches!(
            reshaped(&[4, 6], &[4, 2, 3], 0, 1),
            Some(Rows::Axis(0, 1))
        ));
    }
}
