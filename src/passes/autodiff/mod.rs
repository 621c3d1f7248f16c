//! Reverse-mode automatic differentiation: turns the forward graph of a train section
//! into the whole train step. It adds, to the same graph,
//!
//! - the backward pass: the gradient of the loss with respect to every trainable
//!   variable, built from the adjoint of each op (vector-Jacobian products made of IR
//!   ops, so every backend runs them like any other op);
//! - `cross_shard_mean` of each gradient (the cross-shard optimiser: the identity with
//!   one shard, the mean over shards when the step is replicated);
//! - global-norm clipping, when the optimiser asks for it;
//! - the optimiser's update rule, with its slot variables (`<var>/momentum`, ...), as
//!   `update` outputs named by the variable they replace;
//! - the global step plus one, as the `next_step` output.
//!
//! Gradients flow through float tensors only. A float value that depends on a
//! trainable variable and reaches the loss through an op without a gradient (`argmax`,
//! a comparison, `floor`, a cast to an integer) is E0801: the optimiser would never
//! see that path.
//!
//! Here: the pass (`run`), the graph builders it shares, and the backward sweep; each
//! op's adjoint in `vjp.rs`, adjoints of one value summed in `pieces.rs`, and the
//! update (loss scale, clipping, optimisers, slots) in `update.rs`.

mod pieces;
mod update;
mod vjp;

use super::PassCtx;
use crate::diag::{Code, Diag, Diags};
use crate::ir::{infer, BinaryOp, DType, Graph, Op, ReduceOp, Role, Shape, TensorType, UnaryOp};
use crate::span::Span;
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::{EdgeRef, NodeIndexable};
use petgraph::Direction;
use rustc_hash::FxHashMap;
use vjp::has_gradient;

pub fn run(g: &mut Graph, _ctx: &PassCtx, diags: &mut Diags) {
    if g.optimizers.is_empty() || g.output(Role::NextStep).is_some() {
        return; // nothing to train, or already differentiated
    }
    let opts = g.optimizers.clone();
    let named = |g: &Graph, name: &str| g.outputs.iter().find(|o| o.name == name).map(|o| o.node);
    let mut ad = Ad { g, diags };
    // each loss differentiated once, for all the optimisers that minimise it
    let mut grads_of: FxHashMap<NodeIndex, Vec<(NodeIndex, NodeIndex)>> = FxHashMap::default();
    let sp = opts[0].span;
    for (k, opt) in opts.iter().enumerate() {
        let (Some(loss), Some(lr)) = (named(ad.g, &opt.loss), named(ad.g, &opt.learning_rate))
        else {
            return;
        };
        if !ad.g.ty(loss).dtype.is_float() {
            return; // reported by the front end
        }
        // a scaled loss is differentiated for its optimiser alone
        let scaled;
        let mut gate = None;
        let grads = match opt.loss_scale {
            Some(how) => {
                let Some((grads, g)) = ad.scaled_gradients(loss, how, k, opt.span) else {
                    return;
                };
                scaled = grads;
                gate = g;
                &scaled
            }
            None => match grads_of.entry(loss) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let Some(grads) = ad.backward(loss) else {
                        return;
                    };
                    e.insert(grads)
                }
            },
        };
        let mine: Vec<(NodeIndex, NodeIndex)> = grads
            .iter()
            .copied()
            .filter(|&(v, _)| {
                let Op::Variable { name, .. } = &ad.g.node(v).op else {
                    return false;
                };
                trains(&opts, k, name)
            })
            .collect();
        ad.apply(opt, lr, mine, gate);
    }
    ad.next_step(sp);
}

/// Whether optimiser `k` of `opts` trains the variable `name`: one that lists its
/// variables (`only(...)`) trains those, and one without a list every variable no
/// optimiser lists.
pub fn trains(opts: &[crate::ir::Optimizer], k: usize, name: &str) -> bool {
    let listed =
        |o: &crate::ir::Optimizer| o.variables.as_ref().map(|v| v.iter().any(|n| n == name));
    match listed(&opts[k]) {
        Some(mine) => mine,
        None => !opts.iter().any(|o| listed(o) == Some(true)),
    }
}

/// The gradients of `loss` with respect to the trainable variables it depends on, as
/// (variable, gradient) nodes added to `g`; `None` after an E0801 diagnostic. The pass
/// uses it; tests use it to check every gradient against finite differences.
pub fn gradients(
    g: &mut Graph,
    loss: NodeIndex,
    diags: &mut Diags,
) -> Option<Vec<(NodeIndex, NodeIndex)>> {
    Ad { g, diags }.backward(loss)
}

struct Ad<'a> {
    g: &'a mut Graph,
    diags: &'a mut Diags,
}

impl Ad<'_> {
    /// Adds a node whose type inference gives (`declared` for ops whose shape or dtype
    /// is an attribute).
    fn mk(&mut self, op: Op, args: &[NodeIndex], declared: TensorType, span: Span) -> NodeIndex {
        let tys: Vec<&TensorType> = args.iter().map(|&a| self.g.ty(a)).collect();
        let ty = infer(&op, &tys, &declared).unwrap_or(declared);
        self.g.add(op, args, ty, span)
    }

    fn ty(&self, n: NodeIndex) -> TensorType {
        self.g.ty(n).clone()
    }

    fn konst(&mut self, v: f64, dtype: DType, span: Span) -> NodeIndex {
        self.g.add(
            Op::Const { bits: v.to_bits() },
            &[],
            TensorType::scalar(dtype),
            span,
        )
    }

    fn zeros(&mut self, ty: TensorType, span: Span) -> NodeIndex {
        self.g.add(
            Op::Const {
                bits: 0f64.to_bits(),
            },
            &[],
            ty,
            span,
        )
    }

    fn un(&mut self, u: UnaryOp, a: NodeIndex, span: Span) -> NodeIndex {
        let t = self.ty(a);
        self.mk(Op::Unary(u), &[a], t, span)
    }

    fn bin(&mut self, b: BinaryOp, x: NodeIndex, y: NodeIndex, span: Span) -> NodeIndex {
        let t = self.ty(x);
        self.mk(Op::Binary(b), &[x, y], t, span)
    }

    fn scale(&mut self, x: NodeIndex, v: f64, span: Span) -> NodeIndex {
        let c = self.konst(v, self.g.ty(x).dtype, span);
        self.bin(BinaryOp::Mul, x, c, span)
    }

    fn reshape(&mut self, x: NodeIndex, shape: &[usize], span: Span) -> NodeIndex {
        if self.g.ty(x).shape.as_slice() == shape {
            return x;
        }
        let t = TensorType::new(self.g.ty(x).dtype, Shape::from_slice(shape));
        self.mk(Op::Reshape, &[x], t, span)
    }

    fn broadcast_to(&mut self, x: NodeIndex, shape: &[usize], span: Span) -> NodeIndex {
        if self.g.ty(x).shape.as_slice() == shape {
            return x;
        }
        let t = TensorType::new(self.g.ty(x).dtype, Shape::from_slice(shape));
        self.mk(Op::BroadcastTo, &[x], t, span)
    }

    fn reduce(
        &mut self,
        op: ReduceOp,
        x: NodeIndex,
        axes: Vec<usize>,
        keep: bool,
        span: Span,
    ) -> NodeIndex {
        if axes.is_empty() {
            return x;
        }
        let t = self.ty(x);
        self.mk(
            Op::Reduce {
                op,
                axes,
                keep_dims: keep,
            },
            &[x],
            t,
            span,
        )
    }

    /// A comparison or logical op, elementwise with broadcasting: a bool tensor.
    fn cmp(&mut self, b: BinaryOp, x: NodeIndex, y: NodeIndex, span: Span) -> NodeIndex {
        let shape = crate::ir::broadcast(&self.g.ty(x).shape, &self.g.ty(y).shape)
            .unwrap_or_else(|| self.g.ty(x).shape.clone());
        self.mk(
            Op::Binary(b),
            &[x, y],
            TensorType::new(DType::Bool, shape),
            span,
        )
    }

    /// `x != x`: where `x` is NaN.
    fn is_nan(&mut self, x: NodeIndex, span: Span) -> NodeIndex {
        self.cmp(BinaryOp::Ne, x, x, span)
    }

    fn select(&mut self, c: NodeIndex, a: NodeIndex, b: NodeIndex, span: Span) -> NodeIndex {
        let t = self.ty(a);
        self.mk(Op::Select, &[c, a, b], t, span)
    }

    fn cast(&mut self, x: NodeIndex, dtype: DType, span: Span) -> NodeIndex {
        if self.g.ty(x).dtype == dtype {
            return x;
        }
        let t = TensorType::new(dtype, self.g.ty(x).shape.clone());
        self.mk(Op::Cast, &[x], t, span)
    }

    /// Sums `dy` down to `shape`: the adjoint of numpy broadcasting.
    fn unbroadcast(&mut self, dy: NodeIndex, shape: &[usize], span: Span) -> NodeIndex {
        let dshape = self.g.ty(dy).shape.clone();
        if dshape.as_slice() == shape {
            return dy;
        }
        let lead = dshape.len() - shape.len();
        let mut axes: Vec<usize> = (0..lead).collect();
        for (i, &d) in shape.iter().enumerate() {
            if d == 1 && dshape[lead + i] != 1 {
                axes.push(lead + i);
            }
        }
        let s = self.reduce(ReduceOp::Sum, dy, axes, false, span);
        self.reshape(s, shape, span)
    }

    /// The gradients of `loss` with respect to the trainable variables it depends on,
    /// in node order; `None` after a diagnostic.
    fn backward(&mut self, loss: NodeIndex) -> Option<Vec<(NodeIndex, NodeIndex)>> {
        let bound = self.g.g.node_bound();
        // Which nodes reach the loss (not counting the condition of a `select`, which
        // picks values but carries no gradient), and which depend on a trainable
        // variable.
        let mut reaches = vec![false; bound];
        let mut stack = vec![loss];
        while let Some(n) = stack.pop() {
            if std::mem::replace(&mut reaches[n.index()], true) {
                continue;
            }
            let select = matches!(self.g.node(n).op, Op::Select);
            for e in self.g.g.edges_directed(n, Direction::Incoming) {
                if !(select && *e.weight() == 0) {
                    stack.push(e.source());
                }
            }
        }
        let order = self.g.topo_order();
        let mut depends = vec![false; bound];
        for &n in &order {
            depends[n.index()] = match &self.g.node(n).op {
                Op::Variable { trainable, .. } => *trainable,
                // (a constant to the train step, on purpose)
                Op::Unary(UnaryOp::StopGradient) => false,
                _ => self
                    .g
                    .g
                    .neighbors_directed(n, Direction::Incoming)
                    .any(|o| depends[o.index()]),
            };
        }
        let live = |n: NodeIndex| reaches[n.index()] && depends[n.index()];
        // A value with a path to the loss but no gradient along it.
        let mut ok = true;
        for &n in &order {
            if !live(n) || self.g.ty(n).dtype.is_float() && has_gradient(&self.g.node(n).op) {
                continue;
            }
            let ops = self.g.operands(n);
            let cut = ops
                .iter()
                .any(|&o| live(o) && self.g.ty(o).dtype.is_float());
            if cut && !matches!(self.g.node(n).op, Op::Variable { .. }) {
                let node = self.g.node(n);
                self.diags.push(
                    Diag::new(
                        Code::NoGradient,
                        node.span,
                        format!(
                            "`{}` has no gradient, but it lies between a trainable variable and the loss",
                            node.op.name()
                        ),
                    )
                    .label(format!("`{}` makes {}", node.op.name(), node.ty))
                    .help("compute the loss from differentiable ops, or cut the path on purpose with `stop_gradient(...)`"),
                );
                ok = false;
            }
        }
        if !ok {
            return None;
        }
        let span = self.g.node(loss).span;
        let mut adj: FxHashMap<NodeIndex, NodeIndex> = FxHashMap::default();
        let one = self.g.add(
            Op::Const {
                bits: 1f64.to_bits(),
            },
            &[],
            self.ty(loss),
            span,
        );
        adj.insert(loss, one);
        let mut grads = Vec::new();
        for &n in order.iter().rev() {
            if !live(n) {
                continue;
            }
            let Some(&dy) = adj.get(&n) else { continue };
            if let Op::Variable {
                trainable: true, ..
            } = self.g.node(n).op
            {
                grads.push((n, dy));
                continue;
            }
            let ops = self.g.operands(n);
            for (i, &o) in ops.iter().enumerate() {
                if !live(o) || !self.g.ty(o).dtype.is_float() {
                    continue;
                }
                if matches!(self.g.node(n).op, Op::Select) && i == 0 {
                    continue;
                }
                let Some(d) = self.vjp(n, i, dy) else {
                    continue;
                };
                let d = match adj.get(&o) {
                    Some(&prev) => self.sum_adjoints(prev, d, span),
                    None => d,
                };
                adj.insert(o, d);
            }
        }
        grads.sort_by_key(|(v, _)| *v);
        Some(grads)
    }
}
