//! The functions the compiler implements: the `extern fn`s of `std.prim` (tensor
//! primitives), `std.optim` (optimisers), `std.metrics` (metric reducers) and
//! `std.hooks`. Their signatures, defaults and docs live in the `.est` files; here each
//! one checks its static arguments and makes nodes or values.

use super::value::{HookVal, MetricVal, OptimizerVal, Value};
use super::Elab;
use crate::diag::{did_you_mean, Code, Diag};
use crate::ir::{
    float, BinaryOp, DType, Init, NodeIndex, Op, Output, Padding, ReduceOp, Role, TensorType,
    UnaryOp,
};
use crate::span::Span;
use crate::syntax::ast::Param;
use std::rc::Rc;

mod composite;

/// The arguments of a builtin call, by parameter name.
pub(super) struct Args<'p> {
    params: &'p [Param],
    vals: Vec<(Value<'p>, Span)>,
    pub call: Span,
}

impl<'p> Args<'p> {
    pub(super) fn get(&self, name: &str) -> (Value<'p>, Span) {
        match self.params.iter().position(|p| p.name.name == name) {
            Some(i) => self.vals[i].clone(),
            None => (Value::Error, self.call),
        }
    }
}

/// The most elements a tensor made from a static shape may have.
const MAX_ELEMENTS: usize = 1 << 40;

fn scalar(d: DType) -> TensorType {
    TensorType::scalar(d)
}

impl<'p> Elab<'p> {
    pub(super) fn builtin(
        &mut self,
        name: &str,
        params: &'p [Param],
        vals: Vec<(Value<'p>, Span)>,
        call: Span,
    ) -> Value<'p> {
        let a = Args { params, vals, call };
        if a.vals.iter().any(|(v, _)| matches!(v, Value::Error)) {
            return Value::Error;
        }
        if let Some((v, _)) = a.vals.iter().find(|(v, _)| matches!(v, Value::Absent(_))) {
            return v.clone();
        }
        if let Some(u) = unary_op(name) {
            return self.b_unary(u, &a);
        }
        match name {
            "maximum" | "minimum" | "pow" => self.b_binary(name, &a),
            "where" => self.b_where(&a),
            "cast" => self.b_cast(&a),
            "reshape" => self.b_reshape(&a),
            "transpose" => self.b_transpose(&a),
            "broadcast_to" => self.b_broadcast(&a),
            "expand_dims" | "squeeze" => self.b_expand_squeeze(name, &a),
            "concat" => self.b_concat(&a),
            "slice" => self.b_slice(&a),
            "pad" => self.b_pad(&a),
            "iota" => self.b_iota(&a),
            "reverse" => self.b_reverse(&a),
            "tile" => self.b_tile(&a),
            "cumsum" => self.b_cumsum(&a),
            "top_k" => self.b_top_k(&a),
            "in_top_k" => self.b_in_top_k(&a),
            "einsum" => self.b_einsum(&a),
            "resize" => self.b_resize(&a),
            "flip_left_right"
            | "flip_up_down"
            | "random_flip_left_right"
            | "random_flip_up_down" => self.b_flip(name, &a),
            "random_crop" => self.b_random_crop(&a),
            "conv_transpose" => self.b_conv_transpose(&a),
            "depthwise_conv" => self.b_depthwise_conv(&a),
            "matmul" => self.b_matmul(&a),
            "reduce_sum" | "reduce_mean" | "reduce_max" | "reduce_min" | "reduce_prod" => {
                self.b_reduce(name, &a)
            }
            "argmax" => self.b_axis_op(&a, |axis| Op::ArgMax { axis }, DType::I32),
            "argmin" => self.b_axis_op(&a, |axis| Op::ArgMin { axis }, DType::I32),
            "softmax" => self.b_axis_op(&a, |axis| Op::Softmax { axis }, DType::F32),
            "log_softmax" => self.b_axis_op(&a, |axis| Op::LogSoftmax { axis }, DType::F32),
            "one_hot" => self.b_one_hot(&a),
            "gather" => self.b_gather(&a),
            "conv" => self.b_conv(&a),
            "max_pool" | "avg_pool" => self.b_pool(name, &a),
            "random_uniform" | "random_normal" => self.b_random(name, &a),
            "variable" => self.b_variable(&a),
            "zeros" | "ones" | "fill" => self.b_fill(name, &a),
            "decode_raw" => self.b_decode_raw(&a),
            "decode_png" | "decode_jpeg" => self.b_decode_image(name, &a),
            "lookup" => self.b_lookup(&a),
            "hash_bucket" => self.b_hash_bucket(&a),
            "shape" => self.b_shape(&a),
            "len" => self.b_len(&a),
            "static_assert" => self.b_static_assert(&a),
            "check_loss_shapes" => self.b_check_loss_shapes(&a),
            "pair" => {
                let (v, s) = a.get("x");
                match self.pair(&v, s) {
                    Some([x, y]) => {
                        Value::List(Rc::new(vec![Value::Int(x as i64), Value::Int(y as i64)]))
                    }
                    None => Value::Error,
                }
            }
            "float" | "int" => self.b_convert(name, &a),
            "assign" => self.b_assign(&a),
            "summary_scalar" | "summary_image" => self.b_summary(name, &a),
            "trainable_variables" => self.b_trainable_variables(&a),
            "init_normal"
            | "init_truncated_normal"
            | "init_uniform"
            | "init_constant"
            | "init_variance_scaling"
            | "init_orthogonal" => self.b_init(name, &a),
            "sgd" | "momentum" | "adam" | "adamw" | "rmsprop" | "adagrad" | "ftrl"
            | "tf_rmsprop" | "tf_adam" => self.b_optimizer(name, &a),
            "clip_by_global_norm" => self.b_clip(&a),
            "loss_scale" => self.b_loss_scale(&a),
            "only" => self.b_only(&a),
            "moving_average" => self.b_moving_average(&a),
            "accuracy"
            | "mean"
            | "precision"
            | "recall"
            | "auc"
            | "reducer"
            | "mean_squared_error"
            | "root_mean_squared_error"
            | "mean_absolute_error"
            | "accuracy_baseline"
            | "auc_pr" => self.b_metric(name, &a),
            "logging_hook" | "stop_at_step_hook" | "nan_hook" | "early_stopping" | "keep_best" => {
                self.b_hook(name, &a)
            }
            _ => self.data_builtin(name, &a),
        }
    }

    /// A tensor argument. Static numbers become f32 constants.
    fn tensor_arg(&mut self, a: &Args<'p>, name: &str) -> Option<(NodeIndex, Span)> {
        let (v, s) = a.get(name);
        let n = self.operand(&v, s, None)?;
        Some((n, s))
    }

    fn int_arg(&mut self, a: &Args<'p>, name: &str) -> Option<i64> {
        let (v, s) = a.get(name);
        self.as_int(&v, s)
    }

    fn float_arg(&mut self, a: &Args<'p>, name: &str) -> Option<f64> {
        let (v, s) = a.get(name);
        self.as_float(&v, s)
    }

    pub(super) fn dtype_arg(&mut self, a: &Args<'p>, name: &str) -> Option<DType> {
        match a.get(name) {
            (Value::DType(DType::I64), s) => {
                self.int64_type(s);
                None
            }
            (Value::DType(d), _) => Some(d),
            (v, s) => {
                self.expected("a dtype (f32, i32, ...)", &v, s);
                None
            }
        }
    }

    /// An axis, negative counting from the end, checked against `rank`.
    fn axis(&mut self, v: &Value<'p>, s: Span, rank: usize) -> Option<usize> {
        let i = self.as_int(v, s)?;
        let r = rank as i64;
        let j = if i < 0 { i + r } else { i };
        if (0..r).contains(&j) {
            Some(j as usize)
        } else {
            self.diags.push(
                Diag::new(
                    Code::InvalidAxis,
                    self.site(s),
                    format!("axis {i} is out of range for a tensor of rank {rank}"),
                )
                .label("out of range")
                .help(format!("axes run from {} to {}", -r, r - 1)),
            );
            None
        }
    }

    /// A list of static integers (`[2, 2]`), or one integer repeated `n` times.
    fn ints(&mut self, v: &Value<'p>, s: Span, n: Option<usize>) -> Option<Vec<i64>> {
        match v {
            Value::Int(i) => Some(vec![*i; n.unwrap_or(1)]),
            Value::List(xs) | Value::Tuple(xs) => {
                let mut out = Vec::with_capacity(xs.len());
                for x in xs.iter() {
                    out.push(self.as_int(x, s)?);
                }
                if let Some(n) = n {
                    if out.len() != n {
                        self.diags.push(
                            Diag::new(
                                Code::InvalidShape,
                                self.site(s),
                                format!("expected {n} integers, found {}", out.len()),
                            )
                            .label("wrong length")
                            .help(format!("give one integer, or a list of {n}")),
                        );
                        return None;
                    }
                }
                Some(out)
            }
            other => {
                self.expected("a list of integers", &other.clone(), s);
                None
            }
        }
    }

    fn pair(&mut self, v: &Value<'p>, s: Span) -> Option<[usize; 2]> {
        let xs = self.ints(v, s, Some(2))?;
        if xs.iter().any(|&x| x <= 0) {
            self.diags.push(
                Diag::new(
                    Code::InvalidShape,
                    self.site(s),
                    "window sizes, strides and dilations must be positive",
                )
                .label("not positive")
                .help("use integers of 1 or more"),
            );
            return None;
        }
        Some([xs[0] as usize, xs[1] as usize])
    }

    /// A shape: a list of positive integers.
    fn shape_arg(&mut self, v: &Value<'p>, s: Span) -> Option<Vec<usize>> {
        let xs = self.ints(v, s, None)?;
        if matches!(v, Value::Int(_)) {
            self.expected("a shape (a list of integers)", v, s);
            return None;
        }
        let mut out = Vec::with_capacity(xs.len());
        for (k, x) in xs.into_iter().enumerate() {
            out.push(self.as_axis_dim(&Value::Int(x), s, Some(k))?);
        }
        let elements = out.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if elements.is_none_or(|e| e > MAX_ELEMENTS) {
            self.diags.push(
                Diag::new(
                    Code::InvalidShape,
                    self.site(s),
                    format!("a tensor of shape {out:?} is too large"),
                )
                .label("more than 2^40 elements")
                .help("tensors hold at most 2^40 elements"),
            );
            return None;
        }
        Some(out)
    }

    fn b_unary(&mut self, u: UnaryOp, a: &Args<'p>) -> Value<'p> {
        let (v, s) = a.get("x");
        if let Some(x) = static_unary(u, &v) {
            let keeps_ints = matches!(
                u,
                UnaryOp::Abs
                    | UnaryOp::Sign
                    | UnaryOp::Square
                    | UnaryOp::Relu
                    | UnaryOp::Floor
                    | UnaryOp::StopGradient
            );
            return match v {
                Value::Int(_) if keeps_ints && x.abs() < 9.0e15 => Value::Int(x as i64),
                _ => Value::Float(x),
            };
        }
        let Some(x) = self.operand(&v, s, None) else {
            return Value::Error;
        };
        self.op(Op::Unary(u), &[(x, s)], scalar(DType::F32), a.call)
    }

    fn b_binary(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let ((va, sa), (vb, sb)) = (a.get("a"), a.get("b"));
        if let (Some(x), Some(y)) = (static_num(&va), static_num(&vb)) {
            let r = match name {
                "maximum" => float::maximum(x, y),
                "minimum" => float::minimum(x, y),
                _ => x.powf(y),
            };
            return match (&va, &vb, name) {
                (Value::Int(_), Value::Int(_), "maximum" | "minimum") => Value::Int(r as i64),
                _ => Value::Float(r),
            };
        }
        let like = [&va, &vb].iter().find_map(|v| match v {
            Value::Tensor(n) => Some(self.graph.ty(*n).dtype),
            _ => None,
        });
        let (Some(x), Some(y)) = (self.operand(&va, sa, like), self.operand(&vb, sb, like)) else {
            return Value::Error;
        };
        let op = match name {
            "maximum" => BinaryOp::Max,
            "minimum" => BinaryOp::Min,
            _ => BinaryOp::Pow,
        };
        self.op(
            Op::Binary(op),
            &[(x, sa), (y, sb)],
            scalar(DType::F32),
            a.call,
        )
    }

    fn b_where(&mut self, a: &Args<'p>) -> Value<'p> {
        let (vc, sc) = a.get("cond");
        let ((va, sa), (vb, sb)) = (a.get("a"), a.get("b"));
        let like = [&va, &vb].iter().find_map(|v| match v {
            Value::Tensor(n) => Some(self.graph.ty(*n).dtype),
            _ => None,
        });
        let (Some(c), Some(x), Some(y)) = (
            self.operand(&vc, sc, Some(DType::Bool)),
            self.operand(&va, sa, like),
            self.operand(&vb, sb, like),
        ) else {
            return Value::Error;
        };
        self.op(
            Op::Select,
            &[(c, sc), (x, sa), (y, sb)],
            scalar(DType::F32),
            a.call,
        )
    }

    fn b_cast(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some(d) = self.dtype_arg(a, "dtype") else {
            return Value::Error;
        };
        let Some((x, s)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        self.op(Op::Cast, &[(x, s)], scalar(d), a.call)
    }

    fn b_reshape(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let (vs, ss) = a.get("shape");
        let Some(dims) = self.ints(&vs, ss, None) else {
            return Value::Error;
        };
        let ty = self.graph.ty(x).clone();
        let known: i64 = dims
            .iter()
            .filter(|&&d| d != -1)
            .try_fold(1i64, |a, &d| a.checked_mul(d))
            .unwrap_or(0);
        let holes: Vec<usize> = (0..dims.len()).filter(|&k| dims[k] == -1).collect();
        // what is wrong, naming the axis
        let why = if let Some(k) = dims.iter().position(|&d| d == 0 || d < -1) {
            Some(format!("axis {k} is {}", dims[k]))
        } else if let [a, b, ..] = holes[..] {
            Some(format!("axes {a} and {b} are both -1"))
        } else if !holes.is_empty() && (known == 0 || ty.elements() as i64 % known != 0) {
            Some(format!(
                "the {} elements do not divide into axes of {known} elements and one inferred",
                ty.elements()
            ))
        } else {
            None
        };
        if let Some(why) = why {
            return self.error(
                Diag::new(Code::InvalidShape, self.site(ss), format!("{dims:?} is not a valid shape for {ty}: {why}"))
                    .label("invalid shape")
                    .help("dimensions are positive; at most one may be -1 (inferred), and the element count must match"),
            );
        }
        let shape: Vec<usize> = dims
            .iter()
            .map(|&d| {
                if d == -1 {
                    (ty.elements() as i64 / known) as usize
                } else {
                    d as usize
                }
            })
            .collect();
        self.op(
            Op::Reshape,
            &[(x, sx)],
            TensorType::new(ty.dtype, shape),
            a.call,
        )
    }

    fn b_transpose(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let rank = self.graph.ty(x).rank();
        let perm = match a.get("perm") {
            (Value::None, _) => (0..rank).rev().collect(),
            (Value::List(xs), s) => {
                let mut p = Vec::with_capacity(xs.len());
                for x in xs.iter() {
                    let Some(ax) = self.axis(x, s, rank) else {
                        return Value::Error;
                    };
                    p.push(ax);
                }
                p
            }
            (v, s) => return self.expected("a list of axes", &v, s),
        };
        self.op(
            Op::Transpose { perm },
            &[(x, sx)],
            scalar(DType::F32),
            a.call,
        )
    }

    fn b_broadcast(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let (vs, ss) = a.get("shape");
        let Some(shape) = self.shape_arg(&vs, ss) else {
            return Value::Error;
        };
        let d = self.graph.ty(x).dtype;
        self.op(
            Op::BroadcastTo,
            &[(x, sx)],
            TensorType::new(d, shape),
            a.call,
        )
    }

    fn b_expand_squeeze(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let ty = self.graph.ty(x).clone();
        let (va, sa) = a.get("axis");
        let mut shape = ty.shape.clone();
        if name == "expand_dims" {
            let Some(ax) = self.axis(&va, sa, ty.rank() + 1) else {
                return Value::Error;
            };
            shape.insert(ax, 1);
        } else {
            let Some(ax) = self.axis(&va, sa, ty.rank()) else {
                return Value::Error;
            };
            if shape[ax] != 1 {
                return self.error(
                    Diag::new(
                        Code::InvalidShape,
                        self.site(sa),
                        format!("axis {ax} of {ty} has size {}, not 1", shape[ax]),
                    )
                    .label("cannot squeeze")
                    .help("squeeze removes an axis of size 1"),
                );
            }
            shape.remove(ax);
        }
        self.op(
            Op::Reshape,
            &[(x, sx)],
            TensorType::new(ty.dtype, shape),
            a.call,
        )
    }

    fn b_concat(&mut self, a: &Args<'p>) -> Value<'p> {
        let (vx, sx) = a.get("xs");
        let Value::List(xs) = vx else {
            return self.expected("a list of tensors", &vx, sx);
        };
        let mut ops = Vec::with_capacity(xs.len());
        for x in xs.iter() {
            let Some(n) = self.operand(x, sx, None) else {
                return Value::Error;
            };
            ops.push((n, sx));
        }
        if ops.is_empty() {
            return self.error(
                Diag::new(Code::InvalidShape, self.site(sx), "concat of an empty list")
                    .label("no tensors")
                    .help("pass at least one tensor"),
            );
        }
        let rank = self.graph.ty(ops[0].0).rank();
        let (va, sa) = a.get("axis");
        let Some(axis) = self.axis(&va, sa, rank) else {
            return Value::Error;
        };
        self.op(Op::Concat { axis }, &ops, scalar(DType::F32), a.call)
    }

    fn b_slice(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let rank = self.graph.ty(x).rank();
        let (va, sa) = a.get("axis");
        let Some(axis) = self.axis(&va, sa, rank) else {
            return Value::Error;
        };
        let (Some(start), Some(end)) = (self.int_arg(a, "start"), self.int_arg(a, "end")) else {
            return Value::Error;
        };
        if start < 0 || end < 0 {
            return self.error(
                Diag::new(
                    Code::InvalidShape,
                    self.site(a.call),
                    "slice bounds must not be negative",
                )
                .label("negative bound")
                .help("give start and end as 0-based positions"),
            );
        }
        self.op(
            Op::Slice {
                axis,
                start: start as usize,
                end: end as usize,
            },
            &[(x, sx)],
            scalar(DType::F32),
            a.call,
        )
    }

    /// `pad(x, paddings, mode, value)`, TensorFlow's `tf.pad`: `paddings` gives each axis
    /// its `[before, after]`. It is made of the ops every target runs: each padded axis a
    /// `concat` of `x` with constants (`constant`) or with one-wide slices of `x` in
    /// mirrored order (`reflect` leaves the edge out, `symmetric` repeats it), so its
    /// gradient is theirs.
    fn b_pad(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let ty = self.graph.ty(x).clone();
        let rank = ty.rank();
        let (vp, sp) = a.get("paddings");
        let entries = match &vp {
            Value::List(xs) | Value::Tuple(xs) => xs.clone(),
            other => {
                return self.expected("a list of [before, after] pairs, one per axis", other, sp)
            }
        };
        if entries.len() != rank {
            return self.error(
                Diag::new(
                    Code::InvalidShape,
                    self.site(sp),
                    format!(
                        "pad of a tensor of rank {rank} takes {rank} [before, after] pairs, found {}",
                        entries.len()
                    ),
                )
                .label(format!("{} pairs", entries.len()))
                .with(self.site(sx), format!("this is {ty}"))
                .help(format!("give one pair per axis of {ty}, [0, 0] for an axis left as it is")),
            );
        }
        let mut pads = Vec::with_capacity(rank);
        for e in entries.iter() {
            let Some(p) = self.ints(e, sp, Some(2)) else {
                return Value::Error;
            };
            if p.iter().any(|&n| n < 0) {
                return self.error(
                    Diag::new(
                        Code::InvalidShape,
                        self.site(sp),
                        "paddings must not be negative",
                    )
                    .label("negative padding")
                    .help("to cut a tensor, use `slice`"),
                );
            }
            pads.push((p[0] as usize, p[1] as usize));
        }
        let (vm, sm) = a.get("mode");
        let mode = match &vm {
            Value::Str(m) if ["constant", "reflect", "symmetric"].contains(&&**m) => m.to_string(),
            other => return self.expected("\"constant\", \"reflect\" or \"symmetric\"", other, sm),
        };
        let value = if mode == "constant" {
            match self.float_arg(a, "value") {
                Some(v) => v,
                None => return Value::Error,
            }
        } else {
            0.0
        };
        // reflect mirrors about the edge, symmetric through it: at most n - 1 or n
        let edge = usize::from(mode == "reflect");
        for (axis, &(b, e)) in pads.iter().enumerate() {
            let n = ty.shape[axis];
            if mode != "constant" && b.max(e) + edge > n {
                return self.error(
                    Diag::new(
                        Code::InvalidShape,
                        self.site(sp),
                        format!(
                            "{mode} padding of {} on axis {axis} needs an axis of at least {}, and axis {axis} of {ty} has {n}",
                            b.max(e),
                            b.max(e) + edge
                        ),
                    )
                    .label("more padding than the axis can mirror")
                    .with(self.site(sx), format!("this is {ty}"))
                    .help(format!(
                        "{mode} padding takes at most {} on each side of this axis; pad less, or use mode: \"constant\"",
                        n - edge
                    )),
                );
            }
        }
        let site = self.site(a.call);
        let mut y = x;
        for (axis, &(b, e)) in pads.iter().enumerate() {
            if b == 0 && e == 0 {
                continue;
            }
            let n = self.graph.ty(y).shape[axis];
            let mut parts = Vec::new();
            for (count, before) in [(b, true), (e, false)] {
                if !before {
                    parts.push(y);
                }
                if count == 0 {
                    continue;
                }
                if mode == "constant" {
                    let mut shape = self.graph.ty(y).shape.clone();
                    shape[axis] = count;
                    let bits = value.to_bits();
                    let ty = TensorType::new(ty.dtype, shape);
                    parts.push(self.graph.add(Op::Const { bits }, &[], ty, site));
                    continue;
                }
                // one-wide slices in mirrored order: before the value the elements
                // `edge + count - 1` down to `edge`, after it `n - 1 - edge` downwards
                let at: Vec<usize> = if before {
                    (edge..edge + count).rev().collect()
                } else {
                    (0..count).map(|i| n - 1 - edge - i).collect()
                };
                for i in at {
                    let slice = Op::Slice {
                        axis,
                        start: i,
                        end: i + 1,
                    };
                    match self.op(slice, &[(y, a.call)], scalar(DType::F32), a.call) {
                        Value::Tensor(t) => parts.push(t),
                        other => return other,
                    }
                }
            }
            let ops: Vec<(NodeIndex, Span)> = parts.into_iter().map(|p| (p, a.call)).collect();
            match self.op(Op::Concat { axis }, &ops, scalar(DType::F32), a.call) {
                Value::Tensor(t) => y = t,
                other => return other,
            }
        }
        Value::Tensor(y)
    }

    fn b_matmul(&mut self, a: &Args<'p>) -> Value<'p> {
        let (Some(x), Some(y)) = (self.tensor_arg(a, "a"), self.tensor_arg(a, "b")) else {
            return Value::Error;
        };
        self.op(Op::MatMul, &[x, y], scalar(DType::F32), a.call)
    }

    fn b_reduce(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let rank = self.graph.ty(x).rank();
        let (va, sa) = a.get("axis");
        let axes: Vec<usize> = match &va {
            Value::None => (0..rank).collect(),
            Value::Int(_) => match self.axis(&va, sa, rank) {
                Some(ax) => vec![ax],
                None => return Value::Error,
            },
            Value::List(xs) => {
                let mut v = Vec::new();
                for x in xs.iter() {
                    let Some(ax) = self.axis(x, sa, rank) else {
                        return Value::Error;
                    };
                    v.push(ax);
                }
                v
            }
            other => return self.expected("an axis, a list of axes or `none`", &other.clone(), sa),
        };
        let (vk, sk) = a.get("keep_dims");
        let Value::Bool(keep_dims) = vk else {
            return self.expected("bool", &vk, sk);
        };
        let op = match name {
            "reduce_sum" => ReduceOp::Sum,
            "reduce_mean" => ReduceOp::Mean,
            "reduce_max" => ReduceOp::Max,
            "reduce_min" => ReduceOp::Min,
            _ => ReduceOp::Prod,
        };
        self.op(
            Op::Reduce {
                op,
                axes,
                keep_dims,
            },
            &[(x, sx)],
            scalar(DType::F32),
            a.call,
        )
    }

    /// Ops with one tensor operand and an axis (argmax, softmax, ...).
    fn b_axis_op(&mut self, a: &Args<'p>, make: fn(usize) -> Op, dtype: DType) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let rank = self.graph.ty(x).rank();
        let (va, sa) = a.get("axis");
        let Some(axis) = self.axis(&va, sa, rank) else {
            return Value::Error;
        };
        self.op(make(axis), &[(x, sx)], scalar(dtype), a.call)
    }

    fn b_one_hot(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "indices") else {
            return Value::Error;
        };
        let (vd, sd) = a.get("depth");
        let Some(depth) = self.as_dim(&vd, sd) else {
            return Value::Error;
        };
        let Some(d) = self.dtype_arg(a, "dtype") else {
            return Value::Error;
        };
        self.op(Op::OneHot { depth }, &[(x, sx)], scalar(d), a.call)
    }

    fn b_gather(&mut self, a: &Args<'p>) -> Value<'p> {
        let (Some(t), Some(i)) = (self.tensor_arg(a, "table"), self.tensor_arg(a, "indices"))
        else {
            return Value::Error;
        };
        self.op(Op::Gather, &[t, i], scalar(DType::F32), a.call)
    }

    fn padding_arg(&mut self, a: &Args<'p>) -> Option<Padding> {
        match a.get("padding") {
            (Value::Padding(p), _) => Some(p),
            (v, s) => {
                self.expected("`same` or `valid`", &v, s);
                None
            }
        }
    }

    fn b_conv(&mut self, a: &Args<'p>) -> Value<'p> {
        let (Some(x), Some(w)) = (self.tensor_arg(a, "x"), self.tensor_arg(a, "filter")) else {
            return Value::Error;
        };
        let ((vs, ss), (vd, sd)) = (a.get("strides"), a.get("dilation"));
        let (Some(strides), Some(dilation), Some(padding)) =
            (self.pair(&vs, ss), self.pair(&vd, sd), self.padding_arg(a))
        else {
            return Value::Error;
        };
        let c = crate::ir::Conv {
            strides,
            padding,
            dilation,
        };
        let (vg, sg) = a.get("groups");
        let Some(groups) = self.as_dim(&vg, sg) else {
            return Value::Error;
        };
        if groups > 1 {
            return self
                .grouped_conv(x, w, c, groups, sg, a.call)
                .map_or(Value::Error, Value::Tensor);
        }
        self.op(Op::Conv2d(c), &[x, w], scalar(DType::F32), a.call)
    }

    fn b_pool(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let Some(x) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let (vw, sw) = a.get("window");
        let Some(window) = self.pair(&vw, sw) else {
            return Value::Error;
        };
        let strides = match a.get("strides") {
            (Value::None, _) => window,
            (v, s) => match self.pair(&v, s) {
                Some(p) => p,
                None => return Value::Error,
            },
        };
        let Some(padding) = self.padding_arg(a) else {
            return Value::Error;
        };
        let pool = crate::ir::Pool {
            window,
            strides,
            padding,
        };
        let op = if name == "max_pool" {
            Op::MaxPool2d(pool)
        } else {
            Op::AvgPool2d(pool)
        };
        self.op(op, &[x], scalar(DType::F32), a.call)
    }

    fn b_random(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let (vs, ss) = a.get("shape");
        let Some(shape) = self.shape_arg(&vs, ss) else {
            return Value::Error;
        };
        let Some(d) = self.dtype_arg(a, "dtype") else {
            return Value::Error;
        };
        let stream = self.random_stream();
        let op = if name == "random_uniform" {
            Op::RandomUniform { stream }
        } else {
            Op::RandomNormal { stream }
        };
        self.op(op, &[], TensorType::new(d, shape), a.call)
    }

    fn b_variable(&mut self, a: &Args<'p>) -> Value<'p> {
        let (vn, sn) = a.get("name");
        let Value::Str(local) = vn else {
            return self.expected("a string", &vn, sn);
        };
        let (vs, ss) = a.get("shape");
        let Some(shape) = self.shape_arg(&vs, ss) else {
            return Value::Error;
        };
        let Some(d) = self.dtype_arg(a, "dtype") else {
            return Value::Error;
        };
        let (vt, st) = a.get("trainable");
        let Value::Bool(trainable) = vt else {
            return self.expected("bool", &vt, st);
        };
        let (vi, si) = a.get("init");
        let init = match &vi {
            Value::Init(i) => i.clone(),
            Value::Float(_) | Value::Int(_) => Init::Constant { bits: (static_num(&vi).unwrap_or(0.0) as f32).to_bits() },
            Value::Str(s) => match init_by_name(s) {
                Some(i) => i,
                None => {
                    return self.error(
                        Diag::new(Code::TypeMismatch, self.site(si), format!("unknown initialiser \"{s}\""))
                            .label("not an initialiser")
                            .help(match did_you_mean(s, INIT_NAMES.iter().copied()) {
                                Some(h) => h,
                                None => format!("use {}, a number, or an `init_*` value (`init_normal(stddev)`, `init_truncated_normal(stddev)`, `init_uniform(lo, hi)`, `init_variance_scaling(scale, mode, distribution)`, `init_orthogonal(gain)`)", INIT_NAMES.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ")),
                            }),
                    )
                }
            },
            other => return self.expected("an initialiser", &other.clone(), si),
        };
        let (vr, sr) = a.get("regularizer");
        let penalty = match &vr {
            Value::None => None,
            Value::Record(fs)
                if fs.len() == 2 && fs.iter().all(|(k, _)| k == "l1" || k == "l2") =>
            {
                let get = |k: &str| {
                    fs.iter()
                        .find(|(n, _)| n == k)
                        .and_then(|(_, v)| static_num(v))
                };
                match (get("l1"), get("l2")) {
                    (Some(l1), Some(l2)) if l1 >= 0.0 && l2 >= 0.0 => Some((l1, l2)),
                    _ => {
                        return self.error(
                            Diag::new(Code::StaticEvalError, self.site(sr), "a regularizer's factors must be static numbers of at least 0")
                                .label("this regularizer")
                                .help("write `l2(0.0001)`, `l1(0.00001)` or `l1_l2(l1: ..., l2: ...)` with factors >= 0"),
                        )
                    }
                }
            }
            Value::Error => return Value::Error,
            other => {
                return self.expected(
                    "a regularizer (`l1(...)`, `l2(...)` or `l1_l2(...)`)",
                    &other.clone(),
                    sr,
                )
            }
        };
        let name = self.variable_name(&local);
        if self.variables.contains_key(&name) {
            return self.error(
                Diag::new(
                    Code::DuplicateDefinition,
                    self.site(sn),
                    format!("variable `{name}` is made twice"),
                )
                .label("second variable with this name in the same function call")
                .help("give each variable of a function a different name"),
            );
        }
        let site = self.site(a.call);
        let n = self.graph.add(
            Op::Variable {
                name: name.clone(),
                init,
                trainable,
            },
            &[],
            TensorType::new(d, shape),
            site,
        );
        self.variables.insert(name, n);
        if let (Some((l1, l2)), true) = (penalty, trainable) {
            self.regularizers.push((n, l1, l2));
        }
        Value::Tensor(n)
    }

    /// `trainable_variables(filter = none, exclude = [])`: the trainable variables made
    /// so far, in the order they were made, whose names match `filter` and no pattern
    /// of `exclude` (see `ir::name_matches`).
    fn b_trainable_variables(&mut self, a: &Args<'p>) -> Value<'p> {
        let (vf, sf) = a.get("filter");
        let filter = match &vf {
            Value::None => None,
            Value::Str(s) => Some(s.to_string()),
            other => return self.expected("a name pattern (a string)", &other.clone(), sf),
        };
        let (ve, se) = a.get("exclude");
        let mut exclude = Vec::new();
        match &ve {
            Value::List(xs) => {
                for x in xs.iter() {
                    match x {
                        Value::Str(s) => exclude.push(s.to_string()),
                        other => return self.expected("a name pattern (a string)", other, se),
                    }
                }
            }
            other => return self.expected("a list of name patterns", &other.clone(), se),
        }
        let mut vars: Vec<(&String, NodeIndex)> = (self.variables.iter())
            .filter(|(_, &n)| {
                matches!(
                    self.graph.node(n).op,
                    Op::Variable {
                        trainable: true,
                        ..
                    }
                )
            })
            .filter(|(name, _)| {
                filter
                    .as_deref()
                    .is_none_or(|f| crate::ir::name_matches(f, name))
            })
            .filter(|(name, _)| !exclude.iter().any(|p| crate::ir::name_matches(p, name)))
            .map(|(k, &n)| (k, n))
            .collect();
        vars.sort_by_key(|v| v.1);
        Value::List(Rc::new(
            vars.into_iter().map(|(_, n)| Value::Tensor(n)).collect(),
        ))
    }

    fn b_fill(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let (vs, ss) = a.get("shape");
        let Some(shape) = self.shape_arg(&vs, ss) else {
            return Value::Error;
        };
        let Some(d) = self.dtype_arg(a, "dtype") else {
            return Value::Error;
        };
        let v = match name {
            "zeros" => 0.0,
            "ones" => 1.0,
            _ => match self.float_arg(a, "value") {
                Some(v) => v,
                None => return Value::Error,
            },
        };
        let site = self.site(a.call);
        Value::Tensor(self.graph.add(
            Op::Const { bits: v.to_bits() },
            &[],
            TensorType::new(d, shape),
            site,
        ))
    }

    /// `lookup(x, vocabulary, num_oov_buckets, default_value)`: strings to their
    /// indices in a vocabulary (a list of strings, or a file of one per line).
    fn b_lookup(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let (vv, sv) = a.get("vocabulary");
        let vocab: Vec<String> = match &vv {
            Value::List(xs) => {
                let mut out = Vec::new();
                for x in xs.iter() {
                    match x {
                        Value::Str(s) => out.push(s.to_string()),
                        other => return self.expected("a list of strings", other, sv),
                    }
                }
                out
            }
            Value::Str(path) => {
                let full = match self.p.root_dir() {
                    Some(d) => d.join(&**path),
                    None => std::path::PathBuf::from(&**path),
                };
                match std::fs::read_to_string(&full) {
                    Ok(text) => text
                        .lines()
                        .map(|l| l.trim_end_matches('\r').to_string())
                        .filter(|l| !l.is_empty())
                        .collect(),
                    Err(e) => {
                        return self.error(
                            Diag::new(Code::UnreadableFile, self.site(sv), format!("cannot read the vocabulary {path}: {}", io_reason(&e)))
                                .label("this vocabulary file")
                                .help("paths are relative to the program's directory; or give the vocabulary as a list of strings"),
                        )
                    }
                }
            }
            other => {
                return self.expected(
                    "a vocabulary: a list of strings, or the path of a file of one per line",
                    other,
                    sv,
                )
            }
        };
        let mut seen = rustc_hash::FxHashSet::default();
        if let Some(dup) = vocab.iter().find(|v| !seen.insert(v.as_str())) {
            return self.error(
                Diag::new(
                    Code::InvalidShape,
                    self.site(sv),
                    format!("the vocabulary has `{dup}` twice"),
                )
                .label("a repeated entry")
                .help("each string of a vocabulary has one id: remove the repeat"),
            );
        }
        let (Some(oov), Some(default)) = (
            self.int_arg(a, "num_oov_buckets"),
            self.int_arg(a, "default_value"),
        ) else {
            return Value::Error;
        };
        if oov < 0 {
            let (_, so) = a.get("num_oov_buckets");
            return self.error(
                Diag::new(Code::InvalidShape, self.site(so), format!("{oov} out-of-vocabulary buckets"))
                    .label("negative")
                    .help("0 maps unknown strings to `default_value`; 1 or more to ids after the vocabulary's"),
            );
        }
        self.op(
            Op::Lookup {
                vocab,
                oov: oov as usize,
                default,
            },
            &[(x, sx)],
            scalar(DType::I32),
            a.call,
        )
    }

    /// `hash_bucket(x, buckets)`: strings hashed into `buckets` ids; integers mixed
    /// (Knuth's multiplicative hash) into them.
    fn b_hash_bucket(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "x") else {
            return Value::Error;
        };
        let (vb, sb) = a.get("buckets");
        let Some(buckets) = self.as_dim(&vb, sb) else {
            return Value::Error;
        };
        let d = self.graph.ty(x).dtype;
        if d == DType::Bytes {
            return self.op(
                Op::HashBucket { buckets },
                &[(x, sx)],
                scalar(DType::I32),
                a.call,
            );
        }
        if !d.is_int() {
            return self.expected("strings or integer ids", &Value::Tensor(x), sx);
        }
        self.int_buckets(x, buckets, a.call)
            .map_or(Value::Error, Value::Tensor)
    }

    fn b_decode_raw(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "bytes") else {
            return Value::Error;
        };
        let Some(d) = self.dtype_arg(a, "dtype") else {
            return Value::Error;
        };
        let len = match a.get("length") {
            (Value::None, _) => super::datasets::UNKNOWN_DIM,
            (v, s) => match self.as_dim(&v, s) {
                Some(n) => n,
                None => return Value::Error,
            },
        };
        let mut shape = self.graph.ty(x).shape.clone();
        shape.push(len);
        self.op(Op::DecodeRaw, &[(x, sx)], TensorType::new(d, shape), a.call)
    }

    /// `decode_png(contents, channels, size)` and `decode_jpeg(...)`: u8 `[?, ?, c]`
    /// (the model's signature fixes the open size), or with `size`, f32 `[h, w, c]`.
    fn b_decode_image(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let Some((x, sx)) = self.tensor_arg(a, "contents") else {
            return Value::Error;
        };
        let (vc, sc) = a.get("channels");
        let Some(c) = self.as_dim(&vc, sc) else {
            return Value::Error;
        };
        let (vs, ss) = a.get("size");
        let (shape, resize) = match &vs {
            Value::None => (
                vec![
                    super::datasets::UNKNOWN_DIM,
                    super::datasets::UNKNOWN_DIM,
                    c,
                ],
                false,
            ),
            _ => match self.pair(&vs, ss) {
                Some([h, w]) => (vec![h, w, c], true),
                None => return Value::Error,
            },
        };
        let format = if name == "decode_png" {
            crate::ir::ImageFormat::Png
        } else {
            crate::ir::ImageFormat::Jpeg
        };
        self.op(
            Op::DecodeImage { format, resize },
            &[(x, sx)],
            TensorType::new(DType::U8, shape),
            a.call,
        )
    }

    fn b_shape(&mut self, a: &Args<'p>) -> Value<'p> {
        let (v, s) = a.get("x");
        match v {
            Value::Tensor(n) => Value::List(Rc::new(
                self.graph
                    .ty(n)
                    .shape
                    .iter()
                    .map(|&d| Value::Int(d as i64))
                    .collect(),
            )),
            other => self.expected("a tensor", &other, s),
        }
    }

    /// A static check a library function makes of its arguments, reported at the user's
    /// call site.
    fn b_static_assert(&mut self, a: &Args<'p>) -> Value<'p> {
        let (c, sc) = a.get("cond");
        let (m, _) = a.get("message");
        match c {
            Value::Bool(true) => Value::None,
            Value::Bool(false) => {
                let msg = match m {
                    Value::Str(s) => s.to_string(),
                    other => super::value::show(&other),
                };
                self.error(
                    Diag::new(Code::StaticEvalError, self.site(a.call), msg.clone())
                        .label("the arguments do not satisfy this function")
                        .help(msg),
                )
            }
            other => self.expected("a static bool", &other, sc),
        }
    }

    /// E0401 unless a loss's labels fit its predictions: the same shape, or (with
    /// `classes`) integer class indices of the predictions' shape without its last
    /// axis. Broadcasting them would pair every label with every prediction.
    fn b_check_loss_shapes(&mut self, a: &Args<'p>) -> Value<'p> {
        let (loss, _) = a.get("loss");
        let (classes, _) = a.get("classes");
        let (Value::Tensor(l), Value::Tensor(p)) = (a.get("labels").0, a.get("predictions").0)
        else {
            return Value::None; // a static label or prediction is reported where it is used
        };
        let (lt, pt) = (self.graph.ty(l).clone(), self.graph.ty(p).clone());
        let name = match &loss {
            Value::Str(s) => s.to_string(),
            _ => "the loss".into(),
        };
        let indices = matches!(classes, Value::Bool(true))
            && lt.dtype.is_int()
            && pt.rank() >= 1
            && lt.shape.as_slice() == &pt.shape[..pt.rank() - 1];
        if lt.shape == pt.shape || indices {
            return Value::None;
        }
        let what = if matches!(classes, Value::Bool(true)) {
            "logits"
        } else {
            "predictions"
        };
        let squeezable = |x: &TensorType, y: &TensorType| {
            x.rank() == y.rank() + 1
                && x.shape.last() == Some(&1)
                && x.shape[..y.rank()] == y.shape[..]
        };
        let help = if squeezable(&pt, &lt) {
            format!("the {what} have a trailing axis of 1: pass `squeeze({what}, axis: -1)`, or `expand_dims(labels, axis: -1)`")
        } else if squeezable(&lt, &pt) {
            format!("the labels have a trailing axis of 1: pass `squeeze(labels, axis: -1)`, or `expand_dims({what}, axis: -1)`")
        } else if matches!(classes, Value::Bool(true)) {
            format!("give class indices shaped like the logits without their last axis ({}), or probabilities shaped like the logits ({})", crate::ir::TensorType::new(crate::ir::DType::I32, pt.shape[..pt.rank().saturating_sub(1)].to_vec()), pt)
        } else {
            format!("reshape one to the other (`reshape(labels, {what}.shape)`)")
        };
        self.error(
            Diag::new(
                Code::ShapeMismatch,
                self.site(a.call),
                format!("{name} needs labels shaped like its {what}, but the labels are {lt} and the {what} {pt}"),
            )
            .label(format!("labels {lt}, {what} {pt}"))
            .help(format!("{help}; broadcasting them would pair every label with every prediction")),
        );
        Value::None
    }

    fn b_len(&mut self, a: &Args<'p>) -> Value<'p> {
        match a.get("xs") {
            (Value::List(xs) | Value::Tuple(xs), _) => Value::Int(xs.len() as i64),
            (Value::Str(s), _) => Value::Int(s.chars().count() as i64),
            (other, s) => self.expected("a list or a string", &other, s),
        }
    }

    fn b_convert(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let (v, s) = a.get("x");
        match (name, &v) {
            ("float", Value::Int(i)) => Value::Float(*i as f64),
            ("float", Value::Float(_)) | ("int", Value::Int(_)) => v,
            ("int", Value::Float(f)) => Value::Int(f.trunc() as i64),
            ("float" | "int", Value::Str(t)) => match (name, t.trim().parse::<f64>()) {
                ("float", Ok(f)) => Value::Float(f),
                ("int", Ok(f)) if f.fract() == 0.0 => Value::Int(f as i64),
                _ => self.error(
                    Diag::new(
                        Code::StaticEvalError,
                        self.site(s),
                        format!("\"{t}\" is not a number"),
                    )
                    .label("not a number")
                    .help("convert strings that hold numbers"),
                ),
            },
            _ => self.expected("a static number", &v, s),
        }
    }

    /// `summary_scalar(name, value)` and `summary_image(name, images, max_outputs)`:
    /// values written to TensorBoard with the train summaries, recorded in train mode
    /// only (as outputs the backends compute apart from the step).
    fn b_summary(&mut self, kind: &str, a: &Args<'p>) -> Value<'p> {
        let (vn, sn) = a.get("name");
        let Value::Str(tag) = vn else {
            return self.expected("a string", &vn, sn);
        };
        let value = if kind == "summary_scalar" {
            "value"
        } else {
            "images"
        };
        let Some((x, sx)) = self.tensor_arg(a, value) else {
            return Value::Error;
        };
        let ty = self.graph.ty(x).clone();
        let node = if kind == "summary_scalar" {
            if ty.rank() != 0 || ty.dtype == DType::Bytes || ty.dtype == DType::Bool {
                return self.error(
                    Diag::new(
                        Code::ShapeMismatch,
                        self.site(sx),
                        format!("a scalar summary of {ty}"),
                    )
                    .label("not a number")
                    .help("summarise a scalar: `reduce_mean(x)`, or `summary_image` for images"),
                );
            }
            x
        } else {
            let channels = ty.shape.get(3).copied();
            if ty.rank() != 4
                || !matches!(channels, Some(1 | 3 | 4))
                || !(ty.dtype.is_float() || ty.dtype == DType::U8)
            {
                return self.error(
                    Diag::new(Code::ShapeMismatch, self.site(sx), format!("an image summary of {ty}"))
                        .label("not a batch of images")
                        .help("give `[batch, height, width, channels]` images with 1, 3 or 4 channels, floats in [0, 1] or u8"),
                );
            }
            let Some(max) = self.int_arg(a, "max_outputs") else {
                return Value::Error;
            };
            if max < 1 {
                return self.error(
                    Diag::new(
                        Code::StaticEvalError,
                        self.site(a.get("max_outputs").1),
                        "`max_outputs` must be at least 1",
                    )
                    .label(format!("{max}"))
                    .help("write `max_outputs: 3` (TensorFlow's default)"),
                );
            }
            let n = (max as usize).min(ty.shape[0]);
            if n == ty.shape[0] {
                x
            } else {
                let mut shape = ty.shape.to_vec();
                shape[0] = n;
                let site = self.site(a.call);
                self.graph.add(
                    Op::Slice {
                        axis: 0,
                        start: 0,
                        end: n,
                    },
                    &[x],
                    TensorType::new(ty.dtype, shape),
                    site,
                )
            }
        };
        if self.mode != crate::syntax::ast::SectionKind::Train {
            return Value::None;
        }
        if self
            .graph
            .outputs
            .iter()
            .any(|o| o.role == Role::Summary && *o.name == *tag)
        {
            return self.error(
                Diag::new(
                    Code::DuplicateDefinition,
                    self.site(sn),
                    format!("a second summary `{tag}`"),
                )
                .label("the same name again")
                .help("give each summary its own name"),
            );
        }
        self.graph.outputs.push(Output {
            name: tag.to_string(),
            role: Role::Summary,
            node,
        });
        Value::None
    }

    fn b_assign(&mut self, a: &Args<'p>) -> Value<'p> {
        let (vv, sv) = a.get("variable");
        let Value::Tensor(var) = vv else {
            return self.expected("a variable", &vv, sv);
        };
        let Op::Variable {
            name, trainable, ..
        } = self.graph.node(var).op.clone()
        else {
            return self.error(
                Diag::new(
                    Code::TypeMismatch,
                    self.site(sv),
                    "`assign` needs a variable",
                )
                .label("not a variable")
                .help("assign to a value made by `variable(...)`"),
            );
        };
        if trainable {
            return self.error(
                Diag::new(
                    Code::TypeMismatch,
                    self.site(sv),
                    format!("`{name}` is trainable; only the optimiser updates it"),
                )
                .label("trainable variable")
                .help("make it with `trainable: false` to update it with `assign`"),
            );
        }
        let Some((x, sx)) = self.tensor_arg(a, "value") else {
            return Value::Error;
        };
        let (want, got) = (self.graph.ty(var).clone(), self.graph.ty(x).clone());
        if want != got {
            return self.error(
                Diag::new(
                    Code::ShapeMismatch,
                    self.site(sx),
                    format!("cannot assign {got} to `{name}` of type {want}"),
                )
                .label(format!("this is {got}"))
                .help("the new value must have the variable's shape and dtype"),
            );
        }
        if self.mode == crate::syntax::ast::SectionKind::Train {
            self.updates.push((name, x));
        }
        Value::None
    }

    fn b_init(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let bits = |v: f64| (v as f32).to_bits();
        Value::Init(match name {
            "init_normal" => Init::Normal {
                stddev_bits: bits(self.float_arg(a, "stddev").unwrap_or(0.0)),
            },
            "init_truncated_normal" => Init::TruncatedNormal {
                stddev_bits: bits(self.float_arg(a, "stddev").unwrap_or(0.0)),
            },
            "init_variance_scaling" => {
                let scale = self.float_arg(a, "scale").unwrap_or(1.0);
                let pick = |el: &mut Self, key: &str, names: &[&str]| -> Option<String> {
                    let (v, sp) = a.get(key);
                    match &v {
                        Value::Str(x)
                            if names.contains(&&x[..])
                                || (key == "distribution" && &x[..] == "normal") =>
                        {
                            Some(x.to_string())
                        }
                        Value::Str(x) => {
                            let mut d = Diag::new(
                                Code::TypeMismatch,
                                el.site(sp),
                                format!("unknown {key} \"{x}\""),
                            )
                            .label(format!("not a {key}"));
                            d = match did_you_mean(x, names.iter().copied()) {
                                Some(h) => d.help(h),
                                None => d.help(format!(
                                    "use one of {}",
                                    names
                                        .iter()
                                        .map(|n| format!("\"{n}\""))
                                        .collect::<Vec<_>>()
                                        .join(", ")
                                )),
                            };
                            el.error(d);
                            None
                        }
                        other => {
                            el.expected("a string", &other.clone(), sp);
                            None
                        }
                    }
                };
                let mode = pick(self, "mode", &crate::ir::FanMode::NAMES);
                let dist = pick(self, "distribution", &crate::ir::Distribution::NAMES);
                let (Some(mode), Some(dist)) = (mode, dist) else {
                    return Value::Error;
                };
                Init::VarianceScaling {
                    scale_bits: bits(scale),
                    mode: crate::ir::FanMode::from_name(&mode).expect("checked"),
                    distribution: crate::ir::Distribution::from_name(&dist).expect("checked"),
                }
            }
            "init_orthogonal" => Init::Orthogonal {
                gain_bits: bits(self.float_arg(a, "gain").unwrap_or(1.0)),
            },
            "init_uniform" => {
                let (lo, hi) = (
                    self.float_arg(a, "lo").unwrap_or(0.0),
                    self.float_arg(a, "hi").unwrap_or(0.0),
                );
                Init::Uniform {
                    lo_bits: bits(lo),
                    hi_bits: bits(hi),
                }
            }
            _ => Init::Constant {
                bits: bits(self.float_arg(a, "value").unwrap_or(0.0)),
            },
        })
    }

    fn b_optimizer(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let (lr, slr) = a.get("lr");
        match &lr {
            Value::Float(_) | Value::Int(_) => {}
            Value::Tensor(n)
                if self.graph.ty(*n).rank() == 0 && self.graph.ty(*n).dtype.is_float() => {}
            other => {
                return self.expected(
                    "a learning rate (a float, or a scalar float tensor such as a schedule)",
                    &other.clone(),
                    slr,
                )
            }
        }
        let (kind, keys): (&'static str, &[&'static str]) = match name {
            "sgd" => ("sgd", &[]),
            "momentum" => ("momentum", &["momentum", "nesterov"]),
            "adam" => ("adam", &["beta1", "beta2", "epsilon"]),
            "adamw" => (
                "adamw",
                &[
                    "weight_decay",
                    "beta1",
                    "beta2",
                    "epsilon",
                    "bias_correction",
                ],
            ),
            "adagrad" => ("adagrad", &["initial_accumulator_value", "epsilon"]),
            "ftrl" => (
                "ftrl",
                &[
                    "learning_rate_power",
                    "initial_accumulator_value",
                    "l1",
                    "l2",
                    "l2_shrinkage",
                    "beta",
                ],
            ),
            "tf_rmsprop" => ("tf_rmsprop", &["rho", "momentum", "epsilon"]),
            "tf_adam" => ("tf_adam", &["beta1", "beta2", "epsilon"]),
            _ => ("rmsprop", &["rho", "momentum", "epsilon"]),
        };
        let mut hyper = Vec::new();
        for &k in keys {
            let (v, s) = a.get(k);
            let f = match v {
                Value::Bool(b) => f64::from(u8::from(b)),
                v => match self.as_float(&v, s) {
                    Some(f) => f,
                    None => return Value::Error,
                },
            };
            // the ranges TensorFlow's kernels check
            let bad = match k {
                "learning_rate_power" => (f > 0.0).then_some("at most 0"),
                "initial_accumulator_value" if kind == "ftrl" => {
                    (f <= 0.0).then_some("above 0 (FTRL divides by its power)")
                }
                "initial_accumulator_value"
                | "l1"
                | "l2"
                | "l2_shrinkage"
                | "beta"
                | "epsilon"
                | "weight_decay"
                | "momentum" => (f < 0.0).then_some("at least 0"),
                "beta1" | "beta2" | "rho" => (!(0.0..1.0).contains(&f)).then_some("in [0, 1)"),
                _ => None,
            };
            if let Some(range) = bad {
                return self.error(
                    Diag::new(
                        Code::StaticEvalError,
                        self.site(s),
                        format!("`{k}` of `{name}` must be {range}"),
                    )
                    .label(format!("{f}"))
                    .help(format!("give `{k}` a value {range}")),
                );
            }
            hyper.push((k, f));
        }
        let mut decay_exclude = Vec::new();
        if kind == "adamw" {
            let (v, s) = a.get("exclude_from_weight_decay");
            let Value::List(xs) = &v else {
                return self.expected("a list of name patterns", &v, s);
            };
            for x in xs.iter() {
                match x {
                    Value::Str(p) => decay_exclude.push(p.to_string()),
                    other => return self.expected("a name pattern (a string)", other, s),
                }
            }
        }
        Value::Optimizer(Rc::new(OptimizerVal {
            kind,
            lr,
            hyper,
            clip_global_norm: None,
            decay_exclude,
            variables: None,
            moving_average: None,
            loss_scale: None,
            span: self.site(a.call),
        }))
    }

    /// `only(optimizer, variables)`: the optimiser, updating these variables alone.
    fn b_only(&mut self, a: &Args<'p>) -> Value<'p> {
        let (v, s) = a.get("optimizer");
        let Value::Optimizer(o) = v else {
            return self.expected("an optimizer", &v, s);
        };
        let (vs, ss) = a.get("variables");
        let Value::List(xs) = &vs else {
            return self.expected(
                "a list of variables (`trainable_variables(\"linear\")`)",
                &vs,
                ss,
            );
        };
        let mut names = Vec::new();
        for x in xs.iter() {
            match x {
                Value::Tensor(n) => match &self.graph.node(*n).op {
                    Op::Variable {
                        name,
                        trainable: true,
                        ..
                    } => names.push(name.clone()),
                    _ => {
                        return self.error(
                            Diag::new(
                                Code::TypeMismatch,
                                self.site(ss),
                                "`only` takes trainable variables",
                            )
                            .label(format!(
                                "this list holds a {} that is not one",
                                self.graph.node(*n).op.name()
                            ))
                            .help("list variables, e.g. `trainable_variables(\"linear\")`"),
                        )
                    }
                },
                Value::Error => return Value::Error,
                other => return self.expected("a variable", &other.clone(), ss),
            }
        }
        names.dedup();
        if names.is_empty() {
            return self.error(
                Diag::new(Code::InvalidModel, self.site(ss), "`only` names no variable")
                    .label("an empty list")
                    .help("check the filter of `trainable_variables`: it must match the names of variables made before it"),
            );
        }
        let mut o = (*o).clone();
        o.variables = Some((names, self.site(ss)));
        Value::Optimizer(Rc::new(o))
    }

    /// `moving_average(optimizer, decay, num_updates)`: the optimiser, also keeping an
    /// exponential moving average of each variable it updates.
    fn b_moving_average(&mut self, a: &Args<'p>) -> Value<'p> {
        let (v, s) = a.get("optimizer");
        let Value::Optimizer(o) = v else {
            return self.expected("an optimizer", &v, s);
        };
        let Some(decay) = self.float_arg(a, "decay") else {
            return Value::Error;
        };
        if !(0.0..1.0).contains(&decay) {
            return self.error(
                Diag::new(
                    Code::StaticEvalError,
                    self.site(a.get("decay").1),
                    "a moving average's decay must be in [0, 1)",
                )
                .label(format!("{decay}"))
                .help("use a decay such as 0.9999 (MobileNet's)"),
            );
        }
        let (vn, sn) = a.get("num_updates");
        let Value::Bool(ramp) = vn else {
            return self.expected("bool", &vn, sn);
        };
        let mut o = (*o).clone();
        o.moving_average = Some((decay, ramp));
        Value::Optimizer(Rc::new(o))
    }

    fn b_clip(&mut self, a: &Args<'p>) -> Value<'p> {
        let (v, s) = a.get("optimizer");
        let Value::Optimizer(o) = v else {
            return self.expected("an optimizer", &v, s);
        };
        let Some(norm) = self.float_arg(a, "norm") else {
            return Value::Error;
        };
        if norm <= 0.0 {
            return self.error(
                Diag::new(
                    Code::StaticEvalError,
                    self.site(a.call),
                    "the clipping norm must be positive",
                )
                .label(format!("{norm}"))
                .help("use a norm above 0"),
            );
        }
        let mut o = (*o).clone();
        o.clip_global_norm = Some(norm);
        Value::Optimizer(Rc::new(o))
    }

    /// `loss_scale(optimizer, scale, initial, growth_interval)`: `scale` "dynamic" or a
    /// positive number.
    fn b_loss_scale(&mut self, a: &Args<'p>) -> Value<'p> {
        let (v, s) = a.get("optimizer");
        let Value::Optimizer(o) = v else {
            return self.expected("an optimizer", &v, s);
        };
        let (vs, ss) = a.get("scale");
        let scale = match &vs {
            Value::Str(d) if &**d == "dynamic" => {
                let Some(initial) = self.float_arg(a, "initial") else {
                    return Value::Error;
                };
                let (vg, sg) = a.get("growth_interval");
                // the count is an f32, exact up to 2^24
                let growth = match vg {
                    Value::Int(n) if (1..=1 << 24).contains(&n) => n as u64,
                    other => return self.expected("a positive integer up to 16777216", &other, sg),
                };
                if !(1.0..=f64::from(f32::MAX)).contains(&initial) {
                    return self.expected(
                        "an initial scale of at least 1 that f32 holds",
                        &Value::Float(initial),
                        a.call,
                    );
                }
                crate::ir::LossScale::Dynamic {
                    initial,
                    growth_interval: growth,
                }
            }
            Value::Int(n) if *n > 0 && (*n as f64) <= f64::from(f32::MAX) => {
                crate::ir::LossScale::Fixed(*n as f64)
            }
            Value::Float(f) if *f > 0.0 && *f <= f64::from(f32::MAX) => {
                crate::ir::LossScale::Fixed(*f)
            }
            _ => return self.expected("\"dynamic\" or a positive number that f32 holds", &vs, ss),
        };
        let mut o = (*o).clone();
        o.loss_scale = Some(scale);
        Value::Optimizer(Rc::new(o))
    }

    fn b_metric(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let names: &[&'static str] = match name {
            "mean" => &["values"],
            "accuracy_baseline" => &["labels"],
            "reducer" => &["a", "b"],
            "auc" | "auc_pr" => &["labels", "scores"],
            _ => &["labels", "predictions"],
        };
        let mut args = Vec::new();
        for &n in names {
            let (v, s) = a.get(n);
            if name == "reducer" && n == "b" && matches!(v, Value::None) {
                continue;
            }
            let Value::Tensor(t) = v else {
                return self.expected("a tensor", &v, s);
            };
            args.push((n, t, s));
        }
        if args.len() == 2 {
            let (t0, t1) = (
                self.graph.ty(args[0].1).clone(),
                self.graph.ty(args[1].1).clone(),
            );
            if t0.shape != t1.shape {
                return self.error(
                    Diag::new(
                        Code::ShapeMismatch,
                        self.site(a.call),
                        format!(
                            "`{name}` needs {} and {} of the same shape",
                            args[0].0, args[1].0
                        ),
                    )
                    .label(format!("{t0} and {t1}"))
                    .with(self.site(args[0].2), format!("this is {t0}"))
                    .with(self.site(args[1].2), format!("this is {t1}"))
                    .help("for classes, compare labels with `argmax(logits, 1)`"),
                );
            }
        }
        if name != "reducer" {
            let (w, sw) = a.get("weights");
            match w {
                Value::None => {}
                w => {
                    let Some(wn) = self.operand(&w, sw, Some(DType::F32)) else {
                        return Value::Error;
                    };
                    let want = self.graph.ty(args[0].1).clone();
                    let wt = self.graph.ty(wn).clone();
                    if !wt.dtype.is_float() && wt.dtype != DType::I32 {
                        return self.expected("float weights", &Value::Tensor(wn), sw);
                    }
                    let fits = crate::ir::broadcast(&wt.shape, &want.shape)
                        .is_some_and(|b| b.as_slice() == want.shape.as_slice());
                    if !fits {
                        return self.error(
                            Diag::new(
                                Code::ShapeMismatch,
                                self.site(sw),
                                format!(
                                    "`weights` of {wt} do not broadcast to the {} of {want}",
                                    args[0].0
                                ),
                            )
                            .label(format!("this is {wt}"))
                            .help(format!(
                                "give one weight per example or per element: {}",
                                want
                            )),
                        );
                    }
                    let site = self.site(sw);
                    let wf = if wt.dtype == DType::F32 {
                        wn
                    } else {
                        self.graph.add(
                            Op::Cast,
                            &[wn],
                            TensorType::new(DType::F32, wt.shape.to_vec()),
                            site,
                        )
                    };
                    let wb = if wt.shape == want.shape {
                        wf
                    } else {
                        self.graph.add(
                            Op::BroadcastTo,
                            &[wf],
                            TensorType::new(DType::F32, want.shape.to_vec()),
                            site,
                        )
                    };
                    args.push(("weights", wb, sw));
                }
            }
        }
        let reducer = match name {
            "reducer" => match a.get("name") {
                (Value::Str(r), _) => r.to_string(),
                (v, s) => return self.expected("the reducer's name, a string", &v, s),
            },
            other => other.to_string(),
        };
        Value::Metric(Rc::new(MetricVal {
            reducer,
            args: args.into_iter().map(|(n, t, _)| (n, t)).collect(),
            span: self.site(a.call),
        }))
    }

    fn b_hook(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        type Keys = &'static [&'static str];
        let (kind, ints, strings, floats): (&'static str, Keys, Keys, Keys) = match name {
            "logging_hook" => ("logging_hook", &["every_n_steps"], &[], &[]),
            "stop_at_step_hook" => ("stop_at_step_hook", &["last_step"], &[], &[]),
            "early_stopping" => (
                "early_stopping",
                &["patience", "min_steps"],
                &["monitor", "mode"],
                &["min_delta"],
            ),
            "keep_best" => ("keep_best", &[], &["monitor", "mode"], &[]),
            _ => ("nan_hook", &[], &[], &[]),
        };
        let mut h = HookVal {
            kind,
            args: Vec::new(),
            strings: Vec::new(),
            floats: Vec::new(),
            span: self.site(a.call),
        };
        for &k in ints {
            let Some(v) = self.int_arg(a, k) else {
                return Value::Error;
            };
            h.args.push((k, v));
        }
        for &k in floats {
            let Some(v) = self.float_arg(a, k) else {
                return Value::Error;
            };
            h.floats.push((k, v));
        }
        for &k in strings {
            match a.get(k) {
                (Value::Str(s), _) => h.strings.push((k, s.to_string())),
                (v, s) => return self.expected("a string", &v, s),
            }
        }
        if let Some(mode) = h.strings.iter().find(|s| s.0 == "mode") {
            if !["auto", "min", "max"].contains(&mode.1.as_str()) {
                let (_, s) = a.get("mode");
                return self.error(
                    Diag::new(Code::InvalidEstimator, self.site(s), format!("mode \"{}\" is not a way a metric improves", mode.1))
                        .label("not \"auto\", \"min\" or \"max\"")
                        .help("\"max\" for a metric that improves upwards (accuracy), \"min\" for one that improves downwards (a loss), \"auto\" to decide by its name"),
                );
            }
        }
        Value::Hook(Rc::new(h))
    }
}

/// An I/O error without the OS's error number, the same on every machine.
fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file".into(),
        std::io::ErrorKind::PermissionDenied => "permission denied".into(),
        std::io::ErrorKind::InvalidData => "it is not UTF-8 text".into(),
        _ => e.to_string(),
    }
}

fn unary_op(name: &str) -> Option<UnaryOp> {
    Some(match name {
        "relu" => UnaryOp::Relu,
        "sigmoid" => UnaryOp::Sigmoid,
        "tanh" => UnaryOp::Tanh,
        "exp" => UnaryOp::Exp,
        "log" => UnaryOp::Log,
        "sqrt" => UnaryOp::Sqrt,
        "rsqrt" => UnaryOp::Rsqrt,
        "abs" => UnaryOp::Abs,
        "square" => UnaryOp::Square,
        "floor" => UnaryOp::Floor,
        "sign" => UnaryOp::Sign,
        "sin" => UnaryOp::Sin,
        "cos" => UnaryOp::Cos,
        "erf" => UnaryOp::Erf,
        "stop_gradient" => UnaryOp::StopGradient,
        _ => return None,
    })
}

fn static_num(v: &Value<'_>) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    }
}

/// Unary math on a static number, so schedules and shapes can use it statically.
fn static_unary(u: UnaryOp, v: &Value<'_>) -> Option<f64> {
    u.eval(static_num(v)?)
}

/// The initialisers a string names (Keras's names).
const INIT_NAMES: [&str; 13] = [
    "zeros",
    "ones",
    "glorot_uniform",
    "glorot_normal",
    "he_uniform",
    "he_normal",
    "lecun_uniform",
    "lecun_normal",
    "variance_scaling",
    "orthogonal",
    "random_normal",
    "truncated_normal",
    "random_uniform",
];

fn init_by_name(s: &str) -> Option<Init> {
    Some(match s {
        "zeros" => Init::Zeros,
        "ones" => Init::Ones,
        "glorot_uniform" => Init::GlorotUniform,
        "glorot_normal" => Init::GlorotNormal,
        "he_uniform" => Init::HeUniform,
        "he_normal" => Init::HeNormal,
        "lecun_normal" => Init::LecunNormal,
        "lecun_uniform" => Init::VarianceScaling {
            scale_bits: 1f32.to_bits(),
            mode: crate::ir::FanMode::FanIn,
            distribution: crate::ir::Distribution::Uniform,
        },
        "variance_scaling" => Init::VarianceScaling {
            scale_bits: 1f32.to_bits(),
            mode: crate::ir::FanMode::FanIn,
            distribution: crate::ir::Distribution::TruncatedNormal,
        },
        "orthogonal" => Init::Orthogonal {
            gain_bits: 1f32.to_bits(),
        },
        // Keras's defaults for its plain initialisers
        "random_normal" => Init::Normal {
            stddev_bits: 0.05f32.to_bits(),
        },
        "truncated_normal" => Init::TruncatedNormal {
            stddev_bits: 0.05f32.to_bits(),
        },
        "random_uniform" => Init::Uniform {
            lo_bits: (-0.05f32).to_bits(),
            hi_bits: 0.05f32.to_bits(),
        },
        _ => return None,
    })
}
