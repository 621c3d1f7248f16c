//! Each op's vector-Jacobian product: the contribution of a node's adjoint to the
//! adjoint of each of its operands, built from IR ops; and which ops carry none.

use super::Ad;
use crate::ir::{BinaryOp, Op, ReduceOp, TensorType, UnaryOp};
use crate::span::Span;
use petgraph::stable_graph::NodeIndex;

impl Ad<'_> {
    /// The contribution of `n`'s adjoint `dy` to the adjoint of its operand `i`.
    pub(super) fn vjp(&mut self, n: NodeIndex, i: usize, dy: NodeIndex) -> Option<NodeIndex> {
        let node = self.g.node(n).clone();
        let sp = node.span;
        let ops = self.g.operands(n);
        let x = ops[i];
        let xs = self.g.ty(x).shape.clone();
        let y = n;
        let d = match &node.op {
            Op::Unary(u) => match u {
                UnaryOp::Neg => self.un(UnaryOp::Neg, dy, sp),
                UnaryOp::Abs => {
                    let s = self.un(UnaryOp::Sign, x, sp);
                    self.bin(BinaryOp::Mul, dy, s, sp)
                }
                UnaryOp::Exp => self.bin(BinaryOp::Mul, dy, y, sp),
                UnaryOp::Log => self.bin(BinaryOp::Div, dy, x, sp),
                UnaryOp::Sqrt => {
                    let t = self.scale(y, 2.0, sp);
                    self.bin(BinaryOp::Div, dy, t, sp)
                }
                UnaryOp::Rsqrt => {
                    // d/dx x^-1/2 = -1/2 y^3
                    let y2 = self.bin(BinaryOp::Mul, y, y, sp);
                    let y3 = self.bin(BinaryOp::Mul, y2, y, sp);
                    let t = self.scale(y3, -0.5, sp);
                    self.bin(BinaryOp::Mul, dy, t, sp)
                }
                UnaryOp::Square => {
                    let t = self.scale(x, 2.0, sp);
                    self.bin(BinaryOp::Mul, dy, t, sp)
                }
                UnaryOp::Tanh => {
                    let y2 = self.bin(BinaryOp::Mul, y, y, sp);
                    let one = self.konst(1.0, node.ty.dtype, sp);
                    let t = self.bin(BinaryOp::Sub, one, y2, sp);
                    self.bin(BinaryOp::Mul, dy, t, sp)
                }
                UnaryOp::Sigmoid => {
                    let one = self.konst(1.0, node.ty.dtype, sp);
                    let t = self.bin(BinaryOp::Sub, one, y, sp);
                    let t = self.bin(BinaryOp::Mul, y, t, sp);
                    self.bin(BinaryOp::Mul, dy, t, sp)
                }
                UnaryOp::Relu => {
                    // Through where relu passed x on: x > 0, or x NaN (ir::float), that
                    // is, wherever `y <= 0` is false. Asked of the result rather than
                    // of x (the same answer), so that x need not be kept: the ops
                    // making x fuse into relu's loop.
                    let zero = self.konst(0.0, node.ty.dtype, sp);
                    let stop = self.cmp(BinaryOp::Le, y, zero, sp);
                    let z = self.zeros(self.ty(dy), sp);
                    self.select(stop, z, dy, sp)
                }
                UnaryOp::Sin => {
                    let c = self.un(UnaryOp::Cos, x, sp);
                    self.bin(BinaryOp::Mul, dy, c, sp)
                }
                UnaryOp::Cos => {
                    let s = self.un(UnaryOp::Sin, x, sp);
                    let t = self.bin(BinaryOp::Mul, dy, s, sp);
                    self.un(UnaryOp::Neg, t, sp)
                }
                UnaryOp::Erf => {
                    // 2 / sqrt(pi) exp(-x^2)
                    let x2 = self.bin(BinaryOp::Mul, x, x, sp);
                    let n = self.un(UnaryOp::Neg, x2, sp);
                    let e = self.un(UnaryOp::Exp, n, sp);
                    let t = self.scale(e, std::f64::consts::FRAC_2_SQRT_PI, sp);
                    self.bin(BinaryOp::Mul, dy, t, sp)
                }
                UnaryOp::Sign => return None, // zero almost everywhere
                UnaryOp::Floor | UnaryOp::Not | UnaryOp::StopGradient => return None,
            },
            Op::Binary(b) => {
                let (a0, a1) = (ops[0], ops[1]);
                let d = match b {
                    BinaryOp::Add => dy,
                    BinaryOp::Sub if i == 0 => dy,
                    BinaryOp::Sub => self.un(UnaryOp::Neg, dy, sp),
                    BinaryOp::Mul => {
                        let other = ops[1 - i];
                        self.bin(BinaryOp::Mul, dy, other, sp)
                    }
                    BinaryOp::Div if i == 0 => self.bin(BinaryOp::Div, dy, a1, sp),
                    BinaryOp::Div => {
                        // -dy * y / b
                        let t = self.bin(BinaryOp::Mul, dy, y, sp);
                        let t = self.bin(BinaryOp::Div, t, a1, sp);
                        self.un(UnaryOp::Neg, t, sp)
                    }
                    BinaryOp::Pow if i == 0 => {
                        // dy * b * a^(b - 1)
                        let one = self.konst(1.0, node.ty.dtype, sp);
                        let bm1 = self.bin(BinaryOp::Sub, a1, one, sp);
                        let p = self.bin(BinaryOp::Pow, a0, bm1, sp);
                        let t = self.bin(BinaryOp::Mul, p, a1, sp);
                        self.bin(BinaryOp::Mul, dy, t, sp)
                    }
                    BinaryOp::Pow => {
                        // dy * ln(a) * y
                        let l = self.un(UnaryOp::Log, a0, sp);
                        let t = self.bin(BinaryOp::Mul, l, y, sp);
                        self.bin(BinaryOp::Mul, dy, t, sp)
                    }
                    BinaryOp::Max | BinaryOp::Min => {
                        // To the operand the result came from (ir::float::takes_first):
                        // the first on ties and when it is NaN.
                        let cmp = if *b == BinaryOp::Max {
                            BinaryOp::Ge
                        } else {
                            BinaryOp::Le
                        };
                        let wins = self.cmp(cmp, a0, a1, sp);
                        let nan = self.is_nan(a0, sp);
                        let first = self.cmp(BinaryOp::Or, wins, nan, sp);
                        let z = self.zeros(self.ty(dy), sp);
                        if i == 0 {
                            self.select(first, dy, z, sp)
                        } else {
                            self.select(first, z, dy, sp)
                        }
                    }
                    BinaryOp::Rem if i == 0 => dy,
                    BinaryOp::Rem => {
                        let q = self.bin(BinaryOp::Div, a0, a1, sp);
                        let q = self.un(UnaryOp::Floor, q, sp);
                        let t = self.bin(BinaryOp::Mul, dy, q, sp);
                        self.un(UnaryOp::Neg, t, sp)
                    }
                    _ => return None,
                };
                self.unbroadcast(d, &xs, sp)
            }
            Op::Select => {
                let z = self.zeros(self.ty(dy), sp);
                let d = if i == 1 {
                    self.select(ops[0], dy, z, sp)
                } else {
                    self.select(ops[0], z, dy, sp)
                };
                self.unbroadcast(d, &xs, sp)
            }
            Op::Cast => {
                let dt = self.g.ty(x).dtype;
                self.cast(dy, dt, sp)
            }
            Op::CrossShardMean => dy,
            Op::Reduce { op, axes, .. } => {
                let mut kept = xs.clone();
                for &a in axes {
                    kept[a] = 1;
                }
                let dyk = self.reshape(dy, &kept, sp);
                match op {
                    ReduceOp::Sum => self.broadcast_to(dyk, &xs, sp),
                    ReduceOp::Mean => {
                        let count: usize = axes.iter().map(|&a| xs[a]).product();
                        let t = self.broadcast_to(dyk, &xs, sp);
                        self.scale(t, 1.0 / count.max(1) as f64, sp)
                    }
                    ReduceOp::Prod => {
                        let yk = self.reshape(y, &kept, sp);
                        let t = self.bin(BinaryOp::Mul, dyk, yk, sp);
                        let t = self.broadcast_to(t, &xs, sp);
                        self.bin(BinaryOp::Div, t, x, sp)
                    }
                    ReduceOp::Max | ReduceOp::Min => {
                        // Shared equally among the positions that attain the extremum
                        // (the NaNs, when the result is NaN).
                        let yk = self.reshape(y, &kept, sp);
                        let eq = self.cmp(BinaryOp::Eq, x, yk, sp);
                        let nan = self.is_nan(x, sp);
                        let at = self.cmp(BinaryOp::Or, eq, nan, sp);
                        let mask = self.cast(at, node.ty.dtype, sp);
                        let count = self.reduce(ReduceOp::Sum, mask, axes.clone(), true, sp);
                        let share = self.bin(BinaryOp::Div, dyk, count, sp);
                        self.bin(BinaryOp::Mul, mask, share, sp)
                    }
                }
            }
            Op::MatMul => {
                let (a, b) = (ops[0], ops[1]);
                let d = if i == 0 {
                    let bt = self.swap_last(b, sp);
                    let t = self.ty(dy);
                    self.mk(Op::MatMul, &[dy, bt], t, sp)
                } else {
                    let at = self.swap_last(a, sp);
                    let t = self.ty(dy);
                    self.mk(Op::MatMul, &[at, dy], t, sp)
                };
                self.unbroadcast(d, &xs, sp)
            }
            Op::Transpose { perm } => {
                let mut inv = vec![0; perm.len()];
                for (k, &p) in perm.iter().enumerate() {
                    inv[p] = k;
                }
                let t = self.ty(x);
                self.mk(Op::Transpose { perm: inv }, &[dy], t, sp)
            }
            Op::Reshape => self.reshape(dy, &xs, sp),
            Op::BroadcastTo => self.unbroadcast(dy, &xs, sp),
            Op::Concat { axis } => {
                let start: usize = ops[..i].iter().map(|&o| self.g.ty(o).shape[*axis]).sum();
                let end = start + xs[*axis];
                let t = self.ty(x);
                self.mk(
                    Op::Slice {
                        axis: *axis,
                        start,
                        end,
                    },
                    &[dy],
                    t,
                    sp,
                )
            }
            Op::Slice { axis, start, end } => {
                let mut parts = Vec::new();
                let dt = node.ty.dtype;
                if *start > 0 {
                    let mut s = xs.clone();
                    s[*axis] = *start;
                    parts.push(self.zeros(TensorType::new(dt, s), sp));
                }
                parts.push(dy);
                if *end < xs[*axis] {
                    let mut s = xs.clone();
                    s[*axis] = xs[*axis] - end;
                    parts.push(self.zeros(TensorType::new(dt, s), sp));
                }
                if parts.len() == 1 {
                    dy
                } else {
                    let t = self.ty(x);
                    self.mk(Op::Concat { axis: *axis }, &parts, t, sp)
                }
            }
            Op::Gather => {
                let t = self.ty(x);
                self.mk(Op::ScatterAdd, &[ops[1], dy], t, sp)
            }
            Op::Conv2d(c) => {
                let t = self.ty(x);
                if i == 0 {
                    self.mk(Op::Conv2dBackpropInput(*c), &[dy, ops[1]], t, sp)
                } else {
                    self.mk(Op::Conv2dBackpropFilter(*c), &[ops[0], dy], t, sp)
                }
            }
            // a transposed convolution (conv2d_transpose): the adjoint of conv2d in its
            // input, so its input's gradient is conv2d and its filter's conv2d's
            Op::Conv2dBackpropInput(c) => {
                let t = self.ty(x);
                if i == 0 {
                    self.mk(Op::Conv2d(*c), &[dy, ops[1]], t, sp)
                } else {
                    self.mk(Op::Conv2dBackpropFilter(*c), &[dy, ops[0]], t, sp)
                }
            }
            Op::MaxPool2d(p) => {
                let t = self.ty(x);
                self.mk(Op::MaxPool2dGrad(*p), &[x, dy], t, sp)
            }
            Op::AvgPool2d(p) => {
                let t = self.ty(x);
                self.mk(Op::AvgPool2dGrad(*p), &[dy], t, sp)
            }
            Op::Softmax { axis } => {
                // y * (dy - sum(dy * y))
                let p = self.bin(BinaryOp::Mul, dy, y, sp);
                let s = self.reduce(ReduceOp::Sum, p, vec![*axis], true, sp);
                let t = self.bin(BinaryOp::Sub, dy, s, sp);
                self.bin(BinaryOp::Mul, y, t, sp)
            }
            Op::LogSoftmax { axis } => {
                // dy - softmax(x) * sum(dy)
                let s = self.reduce(ReduceOp::Sum, dy, vec![*axis], true, sp);
                let e = self.un(UnaryOp::Exp, y, sp);
                let t = self.bin(BinaryOp::Mul, e, s, sp);
                self.bin(BinaryOp::Sub, dy, t, sp)
            }
            _ => return None,
        };
        Some(d)
    }

    /// `x` with its last two axes swapped.
    fn swap_last(&mut self, x: NodeIndex, sp: Span) -> NodeIndex {
        let r = self.g.ty(x).rank();
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 2, r - 1);
        let t = self.ty(x);
        self.mk(Op::Transpose { perm }, &[x], t, sp)
    }
}

/// Whether gradients flow through `op` to its float operands.
pub(super) fn has_gradient(op: &Op) -> bool {
    !matches!(
        op,
        Op::Unary(UnaryOp::Floor | UnaryOp::Sign | UnaryOp::Not | UnaryOp::StopGradient)
            | Op::ArgMax { .. }
            | Op::ArgMin { .. }
            | Op::RandomUniform { .. }
            | Op::RandomNormal { .. }
            | Op::DecodeRaw
            | Op::DecodeImage { .. }
            | Op::Lookup { .. }
            | Op::HashBucket { .. }
            | Op::Iota { .. }
            | Op::CheckIndices { .. }
            | Op::Binary(
                BinaryOp::Eq
                    | BinaryOp::Ne
                    | BinaryOp::Lt
                    | BinaryOp::Le
                    | BinaryOp::Gt
                    | BinaryOp::Ge
                    | BinaryOp::And
                    | BinaryOp::Or
            )
    )
}
