//! Builtins made of other ops: each builds its result from the IR's primitives, so every
//! target that runs those runs it, and its gradient is theirs (checked by finite
//! differences in `tests/gradients.rs` like any primitive's). `iota` is the one
//! primitive here; the rest are compositions:
//!
//! - `reverse`: one-wide slices joined in the other order (as `pad`'s mirroring);
//! - `tile`: a reshape that opens an axis before each, a broadcast along it, a reshape;
//! - `cumsum`: log2(n) shifted additions (Hillis and Steele's scan), exact for integers;
//! - `top_k`: k rounds of "the first largest element not yet taken";
//! - `in_top_k`: the count of predictions above the target's, below k;
//! - `einsum`: transposes and reshapes around one batched `matmul`;
//! - `resize`, `random_crop`: matrix products with interpolation or selection matrices
//!   that `iota` counts out (one per spatial axis);
//! - `conv_transpose`: conv2d's input gradient, as in TensorFlow;
//! - `depthwise_conv`: a sum over the filter's taps of strided views times weights;
//!   `conv(groups:)`: a convolution per group of channels, joined.

use super::{scalar, Args};
use crate::diag::{Code, Diag};
use crate::elab::{Elab, Value};
use crate::ir::{
    window_out, window_pad, BinaryOp, Conv, DType, NodeIndex, Op, Padding, ReduceOp, TensorType,
    UnaryOp,
};
use crate::span::Span;
use std::rc::Rc;

type N = Option<NodeIndex>;

impl<'p> Elab<'p> {
    /// A node of `op` on `args` (spans at `sp`), or `None` after a diagnostic.
    fn mk(&mut self, op: Op, args: &[NodeIndex], declared: TensorType, sp: Span) -> N {
        let args: Vec<(NodeIndex, Span)> = args.iter().map(|&n| (n, sp)).collect();
        match self.op(op, &args, declared, sp) {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    fn shape_of(&self, x: NodeIndex) -> Vec<usize> {
        self.graph.ty(x).shape.to_vec()
    }

    fn dtype_of(&self, x: NodeIndex) -> DType {
        self.graph.ty(x).dtype
    }

    fn reshaped(&mut self, x: NodeIndex, shape: Vec<usize>, sp: Span) -> N {
        if self.graph.ty(x).shape[..] == shape[..] {
            return Some(x);
        }
        let d = self.dtype_of(x);
        self.mk(Op::Reshape, &[x], TensorType::new(d, shape), sp)
    }

    fn transposed(&mut self, x: NodeIndex, perm: Vec<usize>, sp: Span) -> N {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Some(x);
        }
        self.mk(Op::Transpose { perm }, &[x], scalar(DType::F32), sp)
    }

    fn bin(&mut self, op: BinaryOp, a: NodeIndex, b: NodeIndex, sp: Span) -> N {
        self.mk(Op::Binary(op), &[a, b], scalar(DType::F32), sp)
    }

    fn un(&mut self, op: UnaryOp, a: NodeIndex, sp: Span) -> N {
        self.mk(Op::Unary(op), &[a], scalar(DType::F32), sp)
    }

    fn select(&mut self, c: NodeIndex, a: NodeIndex, b: NodeIndex, sp: Span) -> N {
        self.mk(Op::Select, &[c, a, b], scalar(DType::F32), sp)
    }

    fn cast_to(&mut self, x: NodeIndex, d: DType, sp: Span) -> N {
        if self.dtype_of(x) == d {
            return Some(x);
        }
        self.mk(Op::Cast, &[x], scalar(d), sp)
    }

    /// A constant of `dtype` and `shape`.
    fn filled(&mut self, v: f64, dtype: DType, shape: Vec<usize>, sp: Span) -> NodeIndex {
        let site = self.site(sp);
        self.graph.add(
            Op::Const { bits: v.to_bits() },
            &[],
            TensorType::new(dtype, shape),
            site,
        )
    }

    fn sliced(&mut self, x: NodeIndex, axis: usize, start: usize, end: usize, sp: Span) -> N {
        if start == 0 && end == self.graph.ty(x).shape[axis] {
            return Some(x);
        }
        self.mk(Op::Slice { axis, start, end }, &[x], scalar(DType::F32), sp)
    }

    fn joined(&mut self, parts: &[NodeIndex], axis: usize, sp: Span) -> N {
        if parts.len() == 1 {
            return Some(parts[0]);
        }
        self.mk(Op::Concat { axis }, parts, scalar(DType::F32), sp)
    }

    fn summed(&mut self, x: NodeIndex, axes: Vec<usize>, keep_dims: bool, sp: Span) -> N {
        let op = Op::Reduce {
            op: ReduceOp::Sum,
            axes,
            keep_dims,
        };
        self.mk(op, &[x], scalar(DType::F32), sp)
    }

    fn iota_node(&mut self, shape: Vec<usize>, axis: usize, d: DType, sp: Span) -> N {
        self.mk(Op::Iota { axis }, &[], TensorType::new(d, shape), sp)
    }

    /// `x` moved so that `axis` is last, as a matrix `[rest, n]`, with what undoes it.
    fn axis_last(&mut self, x: NodeIndex, axis: usize, sp: Span) -> Option<(NodeIndex, Undo)> {
        let shape = self.shape_of(x);
        let r = shape.len();
        let mut perm: Vec<usize> = (0..r).filter(|&k| k != axis).collect();
        perm.push(axis);
        let t = self.transposed(x, perm.clone(), sp)?;
        let moved: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
        let rows = moved[..r - 1].iter().product();
        let m = self.reshaped(t, vec![rows, shape[axis]], sp)?;
        Some((m, Undo { perm, moved }))
    }

    /// A matrix `[rest, k]` (from `axis_last`'s `[rest, n]`) put back as `x` was, with
    /// `k` along the axis.
    fn undo_axis_last(&mut self, m: NodeIndex, u: &Undo, sp: Span) -> N {
        let k = self.shape_of(m)[1];
        let mut moved = u.moved.clone();
        *moved.last_mut().expect("rank >= 1") = k;
        let t = self.reshaped(m, moved, sp)?;
        let mut inverse = vec![0; u.perm.len()];
        for (i, &p) in u.perm.iter().enumerate() {
            inverse[p] = i;
        }
        self.transposed(t, inverse, sp)
    }

    /// `x` with each `[rest, n]` row multiplied by `m^T` (`m` is `[k, n]`) along `axis`:
    /// the axis becomes `k` long, each new element a weighted sum of the old.
    fn along_axis(&mut self, x: NodeIndex, axis: usize, m: NodeIndex, sp: Span) -> N {
        let (rows, undo) = self.axis_last(x, axis, sp)?;
        let mt = self.transposed(m, vec![1, 0], sp)?;
        let p = self.mk(Op::MatMul, &[rows, mt], scalar(DType::F32), sp)?;
        self.undo_axis_last(p, &undo, sp)
    }

    /// Integer ids mixed into `buckets` ids: `((x * 2654435761) mod 2^32) mod buckets`,
    /// in i64 (Knuth's multiplicative hash), as i32.
    pub(super) fn int_buckets(&mut self, x: NodeIndex, buckets: usize, sp: Span) -> N {
        let i64 = DType::I64;
        let k = self.filled(2_654_435_761.0, i64, vec![], sp);
        let m = self.filled(4_294_967_296.0, i64, vec![], sp);
        let b = self.filled(buckets as f64, i64, vec![], sp);
        let mut y = self.cast_to(x, i64, sp)?;
        for (op, c) in [
            (BinaryOp::Mul, k),
            (BinaryOp::Rem, m),
            (BinaryOp::Add, m),
            (BinaryOp::Rem, m),
            (BinaryOp::Rem, b),
        ] {
            y = self.bin(op, y, c, sp)?;
        }
        self.cast_to(y, DType::I32, sp)
    }

    pub(super) fn b_iota(&mut self, a: &Args<'p>) -> Value<'p> {
        let (vs, ss) = a.get("shape");
        let Some(shape) = self.shape_arg(&vs, ss) else {
            return Value::Error;
        };
        let (va, sa) = a.get("axis");
        let Some(axis) = self.axis(&va, sa, shape.len()) else {
            return Value::Error;
        };
        let Some(d) = self.dtype_arg(a, "dtype") else {
            return Value::Error;
        };
        self.op(Op::Iota { axis }, &[], TensorType::new(d, shape), a.call)
    }

    /// The axes of an `axis` argument: one, or a list (negative from the end).
    fn axes_arg(&mut self, a: &Args<'p>, rank: usize) -> Option<Vec<usize>> {
        let (va, sa) = a.get("axis");
        let list = match &va {
            Value::List(xs) => xs.as_ref().clone(),
            v => vec![v.clone()],
        };
        let mut out = Vec::new();
        for v in &list {
            out.push(self.axis(v, sa, rank)?);
        }
        Some(out)
    }

    pub(super) fn b_reverse(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, _)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let Some(axes) = self.axes_arg(a, self.graph.ty(x).rank()) else {
            return Value::Error;
        };
        let mut y = x;
        for axis in axes {
            match self.reversed(y, axis, a.call) {
                Some(r) => y = r,
                None => return Value::Error,
            }
        }
        Value::Tensor(y)
    }

    fn reversed(&mut self, x: NodeIndex, axis: usize, sp: Span) -> N {
        let n = self.shape_of(x)[axis];
        let mut parts = Vec::with_capacity(n);
        for i in (0..n).rev() {
            parts.push(self.sliced(x, axis, i, i + 1, sp)?);
        }
        self.joined(&parts, axis, sp)
    }

    pub(super) fn b_tile(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, _)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let shape = self.shape_of(x);
        let (vm, sm) = a.get("multiples");
        let Some(ms) = self.ints(&vm, sm, Some(shape.len())) else {
            return Value::Error;
        };
        if let Some(k) = ms.iter().position(|&m| m < 1) {
            return self.error(
                Diag::new(
                    Code::InvalidShape,
                    self.site(sm),
                    format!("multiple {} for axis {k} is not positive", ms[k]),
                )
                .label("not positive")
                .help("each axis is repeated 1 or more times"),
            );
        }
        let sp = a.call;
        // a new axis before each repeated one (only those: a batch axis repeated once
        // stays first), broadcast along it
        let mut opened = Vec::new();
        let mut wide = Vec::new();
        for (&s, &m) in shape.iter().zip(&ms) {
            if m > 1 {
                opened.push(1);
                wide.push(m as usize);
            }
            opened.push(s);
            wide.push(s);
        }
        let out: Vec<usize> = shape
            .iter()
            .zip(&ms)
            .map(|(&s, &m)| m as usize * s)
            .collect();
        let d = self.dtype_of(x);
        let r = (|| {
            let o = self.reshaped(x, opened, sp)?;
            let b = self.mk(Op::BroadcastTo, &[o], TensorType::new(d, wide), sp)?;
            self.reshaped(b, out, sp)
        })();
        r.map_or(Value::Error, Value::Tensor)
    }

    pub(super) fn b_cumsum(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let ty = self.graph.ty(x).clone();
        if !(ty.dtype.is_float() || ty.dtype.is_int()) {
            return self.expected("a number tensor", &Value::Tensor(x), sx);
        }
        let (va, sa) = a.get("axis");
        let Some(axis) = self.axis(&va, sa, ty.rank()) else {
            return Value::Error;
        };
        let (Value::Bool(exclusive), Value::Bool(reverse)) =
            (a.get("exclusive").0, a.get("reverse").0)
        else {
            return self.expected("bool", &a.get("exclusive").0, a.get("exclusive").1);
        };
        let sp = a.call;
        let n = ty.shape[axis];
        // y_i + y_(i-d) for d = 1, 2, 4, ...: after the round with d, y_i sums the
        // 2d elements up to i
        let r = (|| {
            let mut y = x;
            let mut d = 1;
            while d < n {
                let s = self.shifted(y, axis, d, reverse, sp)?;
                y = self.bin(BinaryOp::Add, y, s, sp)?;
                d *= 2;
            }
            if exclusive && n > 0 {
                y = self.shifted(y, axis, 1, reverse, sp)?;
            }
            Some(y)
        })();
        r.map_or(Value::Error, Value::Tensor)
    }

    /// `x` moved `d` places along `axis` (towards the end, or the start when
    /// `backward`), zeros filling in.
    fn shifted(&mut self, x: NodeIndex, axis: usize, d: usize, backward: bool, sp: Span) -> N {
        let mut shape = self.shape_of(x);
        let n = shape[axis];
        shape[axis] = d.min(n);
        let zeros = self.filled(0.0, self.dtype_of(x), shape, sp);
        if d >= n {
            return Some(zeros);
        }
        if backward {
            let kept = self.sliced(x, axis, d, n, sp)?;
            self.joined(&[kept, zeros], axis, sp)
        } else {
            let kept = self.sliced(x, axis, 0, n - d, sp)?;
            self.joined(&[zeros, kept], axis, sp)
        }
    }

    /// The smallest value of a dtype: what `top_k` puts in place of a taken element.
    fn lowest(d: DType) -> f64 {
        match d {
            DType::I32 => f64::from(i32::MIN),
            DType::I64 => i64::MIN as f64,
            DType::U8 => 0.0,
            _ => f64::NEG_INFINITY,
        }
    }

    pub(super) fn b_top_k(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let ty = self.graph.ty(x).clone();
        if ty.rank() == 0 || !(ty.dtype.is_float() || ty.dtype.is_int()) {
            return self.expected("a number tensor of rank 1 or more", &Value::Tensor(x), sx);
        }
        let (vk, sk) = a.get("k");
        let Some(k) = self.as_int(&vk, sk) else {
            return Value::Error;
        };
        let last = ty.rank() - 1;
        let n = ty.shape[last];
        if k < 1 || k as usize > n {
            return self.error(
                Diag::new(
                    Code::InvalidShape,
                    self.site(sk),
                    format!("k is {k}, and the last axis of {ty} has {n} elements"),
                )
                .label(format!("not in 1..={n}"))
                .help(format!(
                    "top_k picks between 1 and {n} elements of each row"
                )),
            );
        }
        let sp = a.call;
        let r = (|| {
            let lowest = self.filled(Self::lowest(ty.dtype), ty.dtype, vec![], sp);
            let zero = self.filled(0.0, ty.dtype, vec![], sp);
            let mut taken = self.filled(0.0, DType::Bool, ty.shape.to_vec(), sp);
            let (mut values, mut indices) = (Vec::new(), Vec::new());
            for _ in 0..k {
                // the first largest element not taken: among the untaken, those equal
                // to their largest (so a row of -inf still gives distinct indices)
                let open = self.un(UnaryOp::Not, taken, sp)?;
                let cand = self.select(taken, lowest, x, sp)?;
                let max = self.mk(
                    Op::Reduce {
                        op: ReduceOp::Max,
                        axes: vec![last],
                        keep_dims: true,
                    },
                    &[cand],
                    scalar(DType::F32),
                    sp,
                )?;
                // (a NaN is the largest, as in XLA: the maximum of a row with one is
                // NaN, and the NaNs are its top elements)
                let top = self.bin(BinaryOp::Eq, cand, max, sp)?;
                let nan = self.bin(BinaryOp::Ne, cand, cand, sp)?;
                let top = self.bin(BinaryOp::Or, top, nan, sp)?;
                let eligible = self.bin(BinaryOp::And, top, open, sp)?;
                let e = self.cast_to(eligible, DType::F32, sp)?;
                let i = self.mk(Op::ArgMax { axis: last }, &[e], scalar(DType::I32), sp)?;
                let hit = self.mk(Op::OneHot { depth: n }, &[i], scalar(DType::Bool), sp)?;
                let picked = self.select(hit, x, zero, sp)?;
                let v = self.summed(picked, vec![last], true, sp)?;
                let mut s = self.shape_of(i);
                s.push(1);
                indices.push(self.reshaped(i, s, sp)?);
                values.push(v);
                taken = self.bin(BinaryOp::Or, taken, hit, sp)?;
            }
            let v = self.joined(&values, last, sp)?;
            let i = self.joined(&indices, last, sp)?;
            Some((v, i))
        })();
        match r {
            Some((v, i)) => Value::Tuple(Rc::new(vec![Value::Tensor(v), Value::Tensor(i)])),
            None => Value::Error,
        }
    }

    pub(super) fn b_in_top_k(&mut self, a: &Args<'p>) -> Value<'p> {
        let (Some((p, sp_)), Some((t, st))) = (
            self.tensor_arg(a, "predictions"),
            self.tensor_arg(a, "targets"),
        ) else {
            return Value::Error;
        };
        let (pt, tt) = (self.graph.ty(p).clone(), self.graph.ty(t).clone());
        if pt.rank() != 2 || !pt.dtype.is_float() {
            return self.expected(
                "float predictions of shape [batch, classes]",
                &Value::Tensor(p),
                sp_,
            );
        }
        if !tt.dtype.is_int() || tt.shape[..] != pt.shape[..1] {
            return self.error(
                Diag::new(
                    Code::ShapeMismatch,
                    self.site(st),
                    format!(
                        "targets are {tt}; predictions {pt} need integer targets [{}]",
                        pt.shape[0]
                    ),
                )
                .label("one class index per row of predictions")
                .help("pass the labels as class indices, e.g. `labels` of i32[B]"),
            );
        }
        let (vk, sk) = a.get("k");
        let Some(k) = self.as_int(&vk, sk) else {
            return Value::Error;
        };
        let c = pt.shape[1];
        let sp = a.call;
        // TensorFlow's rule: the target is in the top k when fewer than k predictions
        // are strictly larger (ties with it count in), and its prediction is finite
        let r = (|| {
            let checked = self.mk(Op::CheckIndices { depth: c }, &[t], scalar(DType::F32), sp)?;
            let hit = self.mk(Op::OneHot { depth: c }, &[checked], scalar(DType::Bool), sp)?;
            let zero = self.filled(0.0, pt.dtype, vec![], sp);
            let picked = self.select(hit, p, zero, sp)?;
            let target = self.summed(picked, vec![1], true, sp)?;
            let above = self.bin(BinaryOp::Gt, p, target, sp)?;
            let above = self.cast_to(above, DType::I32, sp)?;
            let count = self.summed(above, vec![1], false, sp)?;
            let kk = self.filled(k as f64, DType::I32, vec![], sp);
            let within = self.bin(BinaryOp::Lt, count, kk, sp)?;
            // every prediction of the row finite (TensorFlow's kernel gives false
            // otherwise): x - x is 0 for a finite x, NaN for the others
            let diff = self.bin(BinaryOp::Sub, p, p, sp)?;
            let bad = self.bin(BinaryOp::Ne, diff, zero, sp)?;
            let bad = self.cast_to(bad, DType::I32, sp)?;
            let bad = self.summed(bad, vec![1], false, sp)?;
            let none = self.filled(0.0, DType::I32, vec![], sp);
            let finite = self.bin(BinaryOp::Eq, bad, none, sp)?;
            self.bin(BinaryOp::And, within, finite, sp)
        })();
        r.map_or(Value::Error, Value::Tensor)
    }

    pub(super) fn b_einsum(&mut self, a: &Args<'p>) -> Value<'p> {
        let (ve, se) = a.get("equation");
        let Value::Str(eq) = &ve else {
            return self.expected("an equation such as \"bij,bjk->bik\"", &ve, se);
        };
        let eq = eq.to_string();
        let Some((x, _)) = self.tensor_arg(a, "a") else {
            return Value::Error;
        };
        let y = match a.get("b") {
            (Value::None, _) => None,
            _ => match self.tensor_arg(a, "b") {
                Some((y, _)) => Some(y),
                None => return Value::Error,
            },
        };
        let mut shapes = vec![self.shape_of(x)];
        if let Some(y) = y {
            shapes.push(self.shape_of(y));
        }
        let spec = match Einsum::parse(&eq, &shapes) {
            Ok(s) => s,
            Err((msg, help)) => {
                return self.error(
                    Diag::new(Code::InvalidShape, self.site(se), msg)
                        .label("in this equation")
                        .help(help),
                )
            }
        };
        let r = match y {
            None => self.einsum1(&spec, x, a.call),
            Some(y) => self.einsum2(&spec, x, y, a.call),
        };
        r.map_or(Value::Error, Value::Tensor)
    }

    /// An operand's labels summed away when no other operand and not the output has
    /// them, then put in `order`.
    fn einsum_operand(
        &mut self,
        s: &Einsum,
        k: usize,
        x: NodeIndex,
        keep: &[char],
        sp: Span,
    ) -> Option<(NodeIndex, Vec<char>)> {
        let labels = &s.inputs[k];
        let gone: Vec<usize> = (0..labels.len())
            .filter(|&i| !keep.contains(&labels[i]))
            .collect();
        let mut x = x;
        let mut left: Vec<char> = labels.clone();
        if !gone.is_empty() {
            x = self.summed(x, gone.clone(), false, sp)?;
            left = labels
                .iter()
                .enumerate()
                .filter(|(i, _)| !gone.contains(i))
                .map(|(_, &c)| c)
                .collect();
        }
        Some((x, left))
    }

    fn einsum1(&mut self, s: &Einsum, x: NodeIndex, sp: Span) -> N {
        let (x, left) = self.einsum_operand(s, 0, x, &s.output, sp)?;
        let perm: Vec<usize> = s
            .output
            .iter()
            .map(|c| left.iter().position(|l| l == c).expect("kept"))
            .collect();
        self.transposed(x, perm, sp)
    }

    fn einsum2(&mut self, s: &Einsum, x: NodeIndex, y: NodeIndex, sp: Span) -> N {
        let (xl, yl) = (&s.inputs[0], &s.inputs[1]);
        // batch: in both and the output; contracted: in both only; free: in one and
        // the output
        let batch: Vec<char> = s
            .output
            .iter()
            .copied()
            .filter(|c| xl.contains(c) && yl.contains(c))
            .collect();
        let mut contracted: Vec<char> = Vec::new();
        for c in xl {
            if yl.contains(c) && !s.output.contains(c) && !contracted.contains(c) {
                contracted.push(*c);
            }
        }
        let xf: Vec<char> = s
            .output
            .iter()
            .copied()
            .filter(|c| xl.contains(c) && !yl.contains(c))
            .collect();
        let yf: Vec<char> = s
            .output
            .iter()
            .copied()
            .filter(|c| yl.contains(c) && !xl.contains(c))
            .collect();
        let keep_x: Vec<char> = batch
            .iter()
            .chain(&contracted)
            .chain(&xf)
            .copied()
            .collect();
        let keep_y: Vec<char> = batch
            .iter()
            .chain(&contracted)
            .chain(&yf)
            .copied()
            .collect();
        let (x, xl) = self.einsum_operand(s, 0, x, &keep_x, sp)?;
        let (y, yl) = self.einsum_operand(s, 1, y, &keep_y, sp)?;
        let size = |c: &char| s.sizes[c];
        let pos = |ls: &[char], c: &char| ls.iter().position(|l| l == c).expect("kept");
        let nc = contracted.iter().map(size).product::<usize>();
        let (nx, ny) = (
            xf.iter().map(size).product::<usize>(),
            yf.iter().map(size).product::<usize>(),
        );
        // x as [batch, free, contracted], y as [batch, contracted, free]
        let px: Vec<usize> = batch
            .iter()
            .chain(&xf)
            .chain(&contracted)
            .map(|c| pos(&xl, c))
            .collect();
        let py: Vec<usize> = batch
            .iter()
            .chain(&contracted)
            .chain(&yf)
            .map(|c| pos(&yl, c))
            .collect();
        let xt = self.transposed(x, px, sp)?;
        let yt = self.transposed(y, py, sp)?;
        // (the batch axes kept apart, not folded into one: a model's batch stays first
        // and alone, as the wafer streams it, and attention's heads beside it)
        let nb: Vec<usize> = batch.iter().map(size).collect();
        let with = |a: usize, b: usize| [nb.as_slice(), &[a, b]].concat();
        let (xm, ym) = (
            self.reshaped(xt, with(nx, nc), sp)?,
            self.reshaped(yt, with(nc, ny), sp)?,
        );
        let p = self.mk(Op::MatMul, &[xm, ym], scalar(DType::F32), sp)?;
        let produced: Vec<char> = batch.iter().chain(&xf).chain(&yf).copied().collect();
        let p = self.reshaped(p, produced.iter().map(size).collect(), sp)?;
        let perm: Vec<usize> = s.output.iter().map(|c| pos(&produced, c)).collect();
        self.transposed(p, perm, sp)
    }

    /// The `[out, len]` matrix that resizes an axis of `len` to `out` (TensorFlow 2's
    /// `tf.image.resize`: half-pixel centres, no antialiasing).
    fn resize_matrix(&mut self, out: usize, len: usize, bilinear: bool, sp: Span) -> N {
        let f = DType::F32;
        let i = self.iota_node(vec![out, len], 0, f, sp)?;
        let j = self.iota_node(vec![out, len], 1, f, sp)?;
        let c = |e: &mut Self, v: f64| e.filled(v, f, vec![], sp);
        let (half, scale) = (c(self, 0.5), c(self, len as f64 / out as f64));
        let centre = self.bin(BinaryOp::Add, i, half, sp)?;
        let scaled = self.bin(BinaryOp::Mul, centre, scale, sp)?;
        let (zero, one, top) = (c(self, 0.0), c(self, 1.0), c(self, (len - 1) as f64));
        if !bilinear {
            // the nearest source pixel: floor((i + 0.5) * scale), within the axis
            let at = self.un(UnaryOp::Floor, scaled, sp)?;
            let at = self.bin(BinaryOp::Min, at, top, sp)?;
            let hit = self.bin(BinaryOp::Eq, j, at, sp)?;
            return self.cast_to(hit, f, sp);
        }
        let src = self.bin(BinaryOp::Sub, scaled, half, sp)?;
        let fl = self.un(UnaryOp::Floor, src, sp)?;
        let lerp = self.bin(BinaryOp::Sub, src, fl, sp)?;
        let lower = self.bin(BinaryOp::Max, fl, zero, sp)?;
        let next = self.bin(BinaryOp::Add, fl, one, sp)?;
        let upper = self.bin(BinaryOp::Min, next, top, sp)?;
        let rest = self.bin(BinaryOp::Sub, one, lerp, sp)?;
        let at_lower = self.bin(BinaryOp::Eq, j, lower, sp)?;
        let at_upper = self.bin(BinaryOp::Eq, j, upper, sp)?;
        let wl = self.select(at_lower, rest, zero, sp)?;
        let wu = self.select(at_upper, lerp, zero, sp)?;
        self.bin(BinaryOp::Add, wl, wu, sp)
    }

    /// The image axes (height, width) of `x`, rank 3 (`[h, w, c]`) or 4 (`[b, h, w, c]`).
    fn image_axes(&mut self, x: NodeIndex, sx: Span) -> Option<(usize, usize)> {
        match self.graph.ty(x).rank() {
            3 => Some((0, 1)),
            4 => Some((1, 2)),
            _ => {
                self.expected("an image [height, width, channels] or a batch of them [batch, height, width, channels]", &Value::Tensor(x), sx);
                None
            }
        }
    }

    pub(super) fn b_resize(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "images") else {
            return Value::Error;
        };
        let Some((ah, aw)) = self.image_axes(x, sx) else {
            return Value::Error;
        };
        let (vs, ss) = a.get("size");
        let Some([h, w]) = self.pair(&vs, ss) else {
            return Value::Error;
        };
        let (vm, sm) = a.get("method");
        let bilinear = match &vm {
            Value::Str(m) if &**m == "bilinear" => true,
            Value::Str(m) if &**m == "nearest" => false,
            _ => return self.expected("\"bilinear\" or \"nearest\"", &vm, sm),
        };
        let sp = a.call;
        let shape = self.shape_of(x);
        let r = (|| {
            let mut y = self.cast_to(x, DType::F32, sp)?;
            for (axis, out) in [(ah, h), (aw, w)] {
                if shape[axis] != out {
                    let m = self.resize_matrix(out, shape[axis], bilinear, sp)?;
                    y = self.along_axis(y, axis, m, sp)?;
                }
            }
            Some(y)
        })();
        r.map_or(Value::Error, Value::Tensor)
    }

    pub(super) fn b_flip(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "image") else {
            return Value::Error;
        };
        let Some((ah, aw)) = self.image_axes(x, sx) else {
            return Value::Error;
        };
        let axis = if name.ends_with("left_right") { aw } else { ah };
        let sp = a.call;
        let r = (|| {
            let flipped = self.reversed(x, axis, sp)?;
            if !name.starts_with("random") {
                return Some(flipped);
            }
            // a coin per image: one for an image, one per image of a batch (as TF 2)
            let shape = self.shape_of(x);
            let coins = if shape.len() == 4 {
                vec![shape[0], 1, 1, 1]
            } else {
                vec![]
            };
            let stream = self.random_stream();
            let u = self.mk(
                Op::RandomUniform { stream },
                &[],
                TensorType::new(DType::F32, coins),
                sp,
            )?;
            let half = self.filled(0.5, DType::F32, vec![], sp);
            let heads = self.bin(BinaryOp::Lt, u, half, sp)?;
            self.select(heads, flipped, x, sp)
        })();
        r.map_or(Value::Error, Value::Tensor)
    }

    pub(super) fn b_random_crop(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, _)) = self.tensor_arg(a, "value") else {
            return Value::Error;
        };
        let shape = self.shape_of(x);
        let (vs, ss) = a.get("size");
        let Some(size) = self.ints(&vs, ss, Some(shape.len())) else {
            return Value::Error;
        };
        if let Some(k) = (0..shape.len()).find(|&k| size[k] < 1 || size[k] as usize > shape[k]) {
            return self.error(
                Diag::new(
                    Code::InvalidShape,
                    self.site(ss),
                    format!("a crop of {} along axis {k}, which has {}", size[k], shape[k]),
                )
                .label(format!("not in 1..={}", shape[k]))
                .help("`size` gives the crop's whole shape, each axis no larger than the value's (as `tf.image.random_crop`)"),
            );
        }
        let sp = a.call;
        let d = self.dtype_of(x);
        let r = (|| {
            // one uniform offset per axis, as TensorFlow's: floor(u * (n - s + 1))
            let stream = self.random_stream();
            let rank = shape.len();
            let u = self.mk(
                Op::RandomUniform { stream },
                &[],
                TensorType::new(DType::F32, vec![rank]),
                sp,
            )?;
            let mut y = self.cast_to(x, DType::F32, sp)?;
            for k in 0..rank {
                let (n, s) = (shape[k], size[k] as usize);
                if s == n {
                    continue;
                }
                let uk = self.sliced(u, 0, k, k + 1, sp)?;
                let uk = self.reshaped(uk, vec![], sp)?;
                let room = self.filled((n - s + 1) as f64, DType::F32, vec![], sp);
                let last = self.filled((n - s) as f64, DType::F32, vec![], sp);
                let off = self.bin(BinaryOp::Mul, uk, room, sp)?;
                let off = self.un(UnaryOp::Floor, off, sp)?;
                let off = self.bin(BinaryOp::Min, off, last, sp)?;
                // the selection matrix [s, n]: row i picks element i + offset
                let i = self.iota_node(vec![s, n], 0, DType::F32, sp)?;
                let j = self.iota_node(vec![s, n], 1, DType::F32, sp)?;
                let at = self.bin(BinaryOp::Add, i, off, sp)?;
                let hit = self.bin(BinaryOp::Eq, j, at, sp)?;
                let m = self.cast_to(hit, DType::F32, sp)?;
                y = self.along_axis(y, k, m, sp)?;
            }
            self.cast_to(y, d, sp)
        })();
        r.map_or(Value::Error, Value::Tensor)
    }

    /// `conv_transpose(x, filter, strides, padding)`: TensorFlow's `conv2d_transpose`,
    /// the input gradient of the convolution that would map its output back to `x`.
    /// The filter is `[h, w, out_channels, in_channels]`, as TensorFlow's.
    pub(super) fn b_conv_transpose(&mut self, a: &Args<'p>) -> Value<'p> {
        let (Some((x, sx)), Some((w, sw))) =
            (self.tensor_arg(a, "x"), self.tensor_arg(a, "filter"))
        else {
            return Value::Error;
        };
        let (vs, ss) = a.get("strides");
        let (Some(strides), Some(padding)) = (self.pair(&vs, ss), self.padding_arg(a)) else {
            return Value::Error;
        };
        let (xt, wt) = (self.graph.ty(x).clone(), self.graph.ty(w).clone());
        if xt.rank() != 4 || wt.rank() != 4 || xt.shape[3] != wt.shape[3] {
            return self.error(
                Diag::new(
                    Code::ShapeMismatch,
                    self.site(a.call),
                    format!("conv_transpose needs an NHWC input and a [h, w, out, in] filter whose last axis is the input's channels, found {xt} and {wt}"),
                )
                .label("in this conv_transpose")
                .with(self.site(sx), format!("this is {xt}"))
                .with(self.site(sw), format!("this is {wt}"))
                .help("the filter of conv2d_transpose is [height, width, output channels, input channels]"),
            );
        }
        // Keras's output size: `in * stride`, plus what a valid window overhangs
        let mut out = vec![xt.shape[0]];
        for (i, &s) in strides.iter().enumerate() {
            let (n, k) = (xt.shape[1 + i], wt.shape[i]);
            out.push(match padding {
                Padding::Same => n * s,
                Padding::Valid => n * s + k.saturating_sub(s),
            });
        }
        out.push(wt.shape[2]);
        let c = Conv {
            strides,
            padding,
            dilation: [1, 1],
        };
        self.op(
            Op::Conv2dBackpropInput(c),
            &[(x, sx), (w, sw)],
            TensorType::new(xt.dtype, out),
            a.call,
        )
    }

    /// `depthwise_conv(x, filter, strides, padding, dilation)`: TensorFlow's
    /// `depthwise_conv2d`, filter `[h, w, channels, multiplier]`, output channel
    /// `c * multiplier + m`. Made of a view of the (padded) input per tap, strided by
    /// regrouping each axis into `[out, stride]`, times the tap's weights, summed.
    pub(super) fn b_depthwise_conv(&mut self, a: &Args<'p>) -> Value<'p> {
        let (Some((x, sx)), Some((w, sw))) =
            (self.tensor_arg(a, "x"), self.tensor_arg(a, "filter"))
        else {
            return Value::Error;
        };
        let ((vs, ss), (vd, sd)) = (a.get("strides"), a.get("dilation"));
        let (Some(strides), Some(dilation), Some(padding)) =
            (self.pair(&vs, ss), self.pair(&vd, sd), self.padding_arg(a))
        else {
            return Value::Error;
        };
        self.depthwise(x, sx, w, sw, strides, dilation, padding, a.call)
            .map_or(Value::Error, Value::Tensor)
    }

    #[allow(clippy::too_many_arguments)]
    fn depthwise(
        &mut self,
        x: NodeIndex,
        sx: Span,
        w: NodeIndex,
        sw: Span,
        strides: [usize; 2],
        dilation: [usize; 2],
        padding: Padding,
        sp: Span,
    ) -> N {
        let (xt, wt) = (self.graph.ty(x).clone(), self.graph.ty(w).clone());
        if xt.rank() != 4
            || wt.rank() != 4
            || xt.shape[3] != wt.shape[2]
            || !xt.dtype.is_float()
            || xt.dtype != wt.dtype
        {
            self.error(
                Diag::new(
                    Code::ShapeMismatch,
                    self.site(sp),
                    format!("depthwise_conv needs a float NHWC input and a [h, w, channels, multiplier] filter of its channels and dtype, found {xt} and {wt}"),
                )
                .label("in this depthwise_conv")
                .with(self.site(sx), format!("this is {xt}"))
                .with(self.site(sw), format!("this is {wt}"))
                .help("the filter's third axis is the input's channels; its fourth, how many outputs each channel makes"),
            );
            return None;
        }
        let (b, c, m) = (xt.shape[0], xt.shape[3], wt.shape[3]);
        let d = xt.dtype;
        let mut outs = [0; 2];
        let mut padded = x;
        let mut lens = [0; 2];
        for i in 0..2 {
            let (n, k) = (xt.shape[1 + i], (wt.shape[i] - 1) * dilation[i] + 1);
            let Some(o) = window_out(n, k, strides[i], padding) else {
                self.error(
                    Diag::new(
                        Code::ShapeMismatch,
                        self.site(sp),
                        format!(
                            "a window of {k} does not fit axis {} of {xt}, which is {n}",
                            i + 1
                        ),
                    )
                    .label("in this depthwise_conv")
                    .help("use padding: same, or a smaller filter"),
                );
                return None;
            };
            outs[i] = o;
            let before = window_pad(n, o, k, strides[i], padding);
            // room for every tap's `o` positions `stride` apart, a multiple of stride
            let s = strides[i];
            let need = ((k - 1) / s + o) * s;
            let after = need.saturating_sub(n + before);
            let len = (n + before + after).div_ceil(s) * s;
            let after = len - n - before;
            for (count, at_start) in [(before, true), (after, false)] {
                if count == 0 {
                    continue;
                }
                let mut shape = self.shape_of(padded);
                shape[1 + i] = count;
                let z = self.filled(0.0, d, shape, sp);
                let parts = if at_start { [z, padded] } else { [padded, z] };
                padded = self.joined(&parts, 1 + i, sp)?;
            }
            lens[i] = len;
        }
        let [sh, sw_] = strides;
        // strided, [b, H/sh, sh, W/sw, sw, c]: a tap at offset t is phase t % s from
        // row t / s; else the taps are plain windows of the padded image
        let strided = sh > 1 || sw_ > 1;
        let grouped = if strided {
            self.reshaped(padded, vec![b, lens[0] / sh, sh, lens[1] / sw_, sw_, c], sp)?
        } else {
            padded
        };
        // (one output per channel: each tap's window times a weight per channel, all of
        // rank 4, which keeps an image's channels last for every backend)
        let (view, tap_shape) = if m == 1 {
            (vec![b, outs[0], outs[1], c], vec![c])
        } else {
            (vec![b, outs[0], outs[1], c, 1], vec![c, m])
        };
        let mut total: Option<NodeIndex> = None;
        for i in 0..wt.shape[0] {
            for j in 0..wt.shape[1] {
                let (ti, tj) = (i * dilation[0], j * dilation[1]);
                let v = if strided {
                    let v = self.sliced(grouped, 1, ti / sh, ti / sh + outs[0], sp)?;
                    let v = self.sliced(v, 2, ti % sh, ti % sh + 1, sp)?;
                    let v = self.sliced(v, 3, tj / sw_, tj / sw_ + outs[1], sp)?;
                    self.sliced(v, 4, tj % sw_, tj % sw_ + 1, sp)?
                } else {
                    let v = self.sliced(grouped, 1, ti, ti + outs[0], sp)?;
                    self.sliced(v, 2, tj, tj + outs[1], sp)?
                };
                let v = self.reshaped(v, view.clone(), sp)?;
                let tap = self.sliced(w, 0, i, i + 1, sp)?;
                let tap = self.sliced(tap, 1, j, j + 1, sp)?;
                let tap = self.reshaped(tap, tap_shape.clone(), sp)?;
                let p = self.bin(BinaryOp::Mul, v, tap, sp)?;
                total = Some(match total {
                    Some(t) => self.bin(BinaryOp::Add, t, p, sp)?,
                    None => p,
                });
            }
        }
        self.reshaped(total?, vec![b, outs[0], outs[1], c * m], sp)
    }

    /// A convolution of `groups` groups of channels: group g's input channels through
    /// the filter's outputs of group g (Keras's `Conv2D(groups=)`); each group of one
    /// channel is a depthwise convolution.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn grouped_conv(
        &mut self,
        x: (NodeIndex, Span),
        w: (NodeIndex, Span),
        c: Conv,
        groups: usize,
        sg: Span,
        sp: Span,
    ) -> N {
        let (xt, wt) = (self.graph.ty(x.0).clone(), self.graph.ty(w.0).clone());
        let ok = xt.rank() == 4
            && wt.rank() == 4
            && xt.shape[3] == wt.shape[2] * groups
            && wt.shape[3] % groups == 0;
        if !ok {
            self.error(
                Diag::new(
                    Code::ShapeMismatch,
                    self.site(sg),
                    format!("{groups} groups need a filter of [h, w, channels / {groups}, outputs divisible by {groups}], found {xt} and the filter {wt}"),
                )
                .label("groups")
                .with(self.site(x.1), format!("this is {xt}"))
                .with(self.site(w.1), format!("this is {wt}"))
                .help("the input's channels and the filter's outputs must both divide into the groups; the filter's third axis is the channels of one group"),
            );
            return None;
        }
        let (cin, cout) = (xt.shape[3] / groups, wt.shape[3] / groups);
        if cin == 1 {
            let [kh, kw] = [wt.shape[0], wt.shape[1]];
            let f = self.reshaped(w.0, vec![kh, kw, groups, cout], sp)?;
            return self.depthwise(x.0, x.1, f, w.1, c.strides, c.dilation, c.padding, sp);
        }
        let mut parts = Vec::with_capacity(groups);
        for g in 0..groups {
            let xs = self.sliced(x.0, 3, g * cin, (g + 1) * cin, sp)?;
            let ws = self.sliced(w.0, 3, g * cout, (g + 1) * cout, sp)?;
            parts.push(self.mk(Op::Conv2d(c), &[xs, ws], scalar(DType::F32), sp)?);
        }
        self.joined(&parts, 3, sp)
    }
}

/// How `axis_last` moved a value: the permutation and the moved shape.
struct Undo {
    perm: Vec<usize>,
    moved: Vec<usize>,
}

/// A parsed einsum equation: each operand's labels, the output's, each label's size.
struct Einsum {
    inputs: Vec<Vec<char>>,
    output: Vec<char>,
    sizes: std::collections::HashMap<char, usize>,
}

type EinsumError = (String, String);

impl Einsum {
    /// Parses `eq` for operands of `shapes`: `"ij,jk->ik"`, with `...` standing for the
    /// same leading axes in each operand, and without `->` the output being the
    /// labels seen once, in alphabetical order (numpy's rule).
    fn parse(eq: &str, shapes: &[Vec<usize>]) -> Result<Einsum, EinsumError> {
        let help = "write one letter per axis, operands separated by `,`, then `->` and the output's letters, e.g. \"bij,bjk->bik\"".to_string();
        let eq: String = eq.chars().filter(|c| !c.is_whitespace()).collect();
        let (lhs, rhs) = match eq.split_once("->") {
            Some((l, r)) => (l.to_string(), Some(r.to_string())),
            None => (eq.clone(), None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        if terms.len() != shapes.len() {
            return Err((
                format!(
                    "the equation has {} operand(s), and {} tensor(s) are given",
                    terms.len(),
                    shapes.len()
                ),
                help,
            ));
        }
        // `...` becomes the same fresh labels (digits) in every operand
        let mut dots: Option<usize> = None;
        let mut inputs = Vec::new();
        for (t, shape) in terms.iter().zip(shapes) {
            let letters = t.replace("...", "");
            let n_dots = if t.contains("...") {
                let k = shape
                    .len()
                    .checked_sub(letters.chars().count())
                    .ok_or_else(|| {
                        (
                            format!(
                                "`{t}` names more axes than the operand's {} ({shape:?})",
                                shape.len()
                            ),
                            help.clone(),
                        )
                    })?;
                if dots.is_some_and(|d| d != k) {
                    return Err((
                        "`...` stands for a different number of axes in each operand".into(),
                        "give the operands the same leading axes under `...`".into(),
                    ));
                }
                dots = Some(k);
                k
            } else {
                0
            };
            inputs.push(expand(t, n_dots, &help)?);
        }
        let output = match rhs {
            Some(r) => expand(&r, dots.unwrap_or(0), &help)?,
            None => {
                let mut once: Vec<char> = inputs
                    .iter()
                    .flatten()
                    .copied()
                    .filter(|c| inputs.iter().flatten().filter(|d| *d == c).count() == 1)
                    .collect();
                once.sort_unstable();
                let lead: Vec<char> = (0..dots.unwrap_or(0)).map(dot_label).collect();
                lead.into_iter()
                    .chain(once.into_iter().filter(|c| c.is_alphabetic()))
                    .collect()
            }
        };
        let mut sizes = std::collections::HashMap::new();
        for (labels, shape) in inputs.iter().zip(shapes) {
            if labels.len() != shape.len() {
                return Err((
                    format!(
                        "`{}` names {} axes, and the operand has {} ({shape:?})",
                        show(labels),
                        labels.len(),
                        shape.len()
                    ),
                    help,
                ));
            }
            for (k, (c, &n)) in labels.iter().zip(shape).enumerate() {
                if labels[..k].contains(c) {
                    return Err((format!("`{c}` appears twice in `{}`: a diagonal, which einsum does not take here", show(labels)), "take the diagonal another way (multiply by an identity mask and sum)".into()));
                }
                match sizes.insert(*c, n) {
                    Some(m) if m != n => {
                        return Err((
                            format!("`{c}` is {m} in one operand and {n} in another"),
                            "a label names the same size wherever it appears".into(),
                        ))
                    }
                    _ => {}
                }
            }
        }
        for (k, c) in output.iter().enumerate() {
            if !sizes.contains_key(c) {
                return Err((format!("the output's `{c}` is in no operand"), help));
            }
            if output[..k].contains(c) {
                return Err((format!("`{c}` appears twice in the output"), help));
            }
        }
        Ok(Einsum {
            inputs,
            output,
            sizes,
        })
    }
}

fn dot_label(k: usize) -> char {
    char::from_digit(k as u32 % 10, 10).unwrap_or('0')
}

fn show(labels: &[char]) -> String {
    labels
        .iter()
        .map(|c| if c.is_ascii_digit() { '.' } else { *c })
        .collect()
}

/// A term's labels, `...` replaced by `n` digit labels.
fn expand(t: &str, n: usize, help: &str) -> Result<Vec<char>, EinsumError> {
    let mut out = Vec::new();
    let mut rest = t;
    while let Some(c) = rest.chars().next() {
        if let Some(r) = rest.strip_prefix("...") {
            out.extend((0..n).map(dot_label));
            rest = r;
            continue;
        }
        if !c.is_ascii_alphabetic() {
            return Err((format!("`{c}` is not an axis label"), help.to_string()));
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    Ok(out)
}
