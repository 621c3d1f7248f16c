//! Shape and dtype inference: the type of an op's result from its operands' types. The
//! elaborator calls it for every node it makes, and the `shape_infer` pass calls it again
//! over the whole graph, so both agree by construction.

use super::{
    broadcast, BinaryOp, Conv, DType, Op, Padding, Pool, ReduceOp, TensorType, UnaryOp, UNKNOWN_DIM,
};
use crate::diag::Code;

/// Why an op does not accept its operands. The elaborator adds the spans.
#[derive(Debug, Clone, PartialEq)]
pub struct InferError {
    pub code: Code,
    pub message: String,
    pub help: Option<String>,
}

fn err(code: Code, message: impl Into<String>) -> InferError {
    InferError {
        code,
        message: message.into(),
        help: None,
    }
}

impl InferError {
    fn help(mut self, h: impl Into<String>) -> InferError {
        self.help = Some(h.into());
        self
    }
}

type R = Result<TensorType, InferError>;

/// The help of an error about a size each record gives (`?`).
pub const UNKNOWN_HELP: &str = "a decoded image's height and width are each image's (`?`): give `decode_png` or `decode_jpeg` a `size: [height, width]` to resize every image to it, or declare them in the model's signature";

/// The result type of `op` applied to `args`. `declared` is the node's own type for ops
/// whose result shape or dtype is an attribute of the node (sources, reshape, cast,
/// broadcast, random, decode_raw); it is checked against the operands.
pub fn infer(op: &Op, args: &[&TensorType], declared: &TensorType) -> R {
    match op {
        Op::Input { .. } | Op::Variable { .. } | Op::Const { .. } => Ok(declared.clone()),
        Op::GlobalStep => Ok(TensorType::scalar(DType::I64)),
        Op::Iota { axis } => {
            need_axis(*axis, declared)?;
            if declared.dtype == DType::Bytes || declared.dtype == DType::Bool {
                return Err(err(
                    Code::DtypeMismatch,
                    format!("iota counts in a number type, not {}", declared.dtype),
                ));
            }
            Ok(declared.clone())
        }
        Op::RandomUniform { .. } | Op::RandomNormal { .. } => {
            if declared.dtype.is_float() {
                Ok(declared.clone())
            } else {
                Err(err(
                    Code::DtypeMismatch,
                    format!(
                        "random numbers must be a float type, not {}",
                        declared.dtype
                    ),
                ))
            }
        }
        Op::Unary(u) => unary(*u, args[0]),
        Op::Binary(b) => binary(*b, args[0], args[1]),
        Op::Select => select(args[0], args[1], args[2]),
        Op::Cast => Ok(TensorType::new(declared.dtype, args[0].shape.clone())),
        Op::Reduce {
            op,
            axes,
            keep_dims,
        } => reduce(*op, axes, *keep_dims, args[0]),
        Op::ArgMax { axis } | Op::ArgMin { axis } => arg_reduce(*axis, args[0]),
        Op::MatMul => matmul(args[0], args[1]),
        Op::Transpose { perm } => transpose(perm, args[0]),
        Op::Reshape => reshape(args[0], declared),
        Op::BroadcastTo => broadcast_to(args[0], declared),
        Op::Concat { axis } => concat(*axis, args),
        Op::Slice { axis, start, end } => slice(*axis, *start, *end, args[0]),
        Op::OneHot { depth } => one_hot(*depth, args[0], declared),
        Op::Gather => gather(args[0], args[1]),
        Op::Conv2d(c) => conv2d(args[0], args[1], c),
        Op::MaxPool2d(p) | Op::AvgPool2d(p) => pool(args[0], p),
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            need_float(op.name(), args[0])?;
            need_axis(*axis, args[0])?;
            Ok(args[0].clone())
        }
        Op::CheckIndices { .. } => {
            if !args[0].dtype.is_int() {
                return Err(err(
                    Code::DtypeMismatch,
                    format!("class indices must be integers, not {}", args[0].dtype),
                ));
            }
            Ok(args[0].clone())
        }
        Op::Lookup { .. } | Op::HashBucket { .. } => {
            if args[0].dtype != DType::Bytes {
                return Err(err(
                    Code::DtypeMismatch,
                    format!("{} reads strings, not {}", op.name(), args[0].dtype),
                )
                .help("give it a string column (`bytes`); integer ids need no lookup"));
            }
            Ok(TensorType::new(DType::I32, args[0].shape.clone()))
        }
        Op::DecodeImage { format, resize } => {
            let name = op.name();
            if args[0].dtype != DType::Bytes || args[0].rank() != 0 {
                return Err(err(
                    Code::DtypeMismatch,
                    format!(
                        "{name} decodes one image, a scalar of bytes, not {}",
                        args[0]
                    ),
                )
                .help(format!(
                    "decode each image in the input pipeline's `map`: `map |r| {name}(r.image)`"
                )));
            }
            let channels = declared.shape.last().copied().unwrap_or(0);
            let allowed: &[usize] = match format {
                crate::ir::ImageFormat::Png => &[1, 2, 3, 4],
                crate::ir::ImageFormat::Jpeg => &[1, 3],
            };
            if declared.rank() != 3 || !allowed.contains(&channels) {
                return Err(err(
                    Code::ShapeMismatch,
                    format!("{name} makes [height, width, channels] with {allowed:?} channels, not {declared}"),
                ));
            }
            let dtype = if *resize { DType::F32 } else { DType::U8 };
            Ok(TensorType::new(dtype, declared.shape.clone()))
        }
        Op::DecodeRaw => {
            if args[0].dtype != DType::Bytes {
                return Err(err(
                    Code::DtypeMismatch,
                    format!("decode_raw reads bytes, not {}", args[0].dtype),
                ));
            }
            Ok(declared.clone())
        }
        Op::Conv2dBackpropInput(_)
        | Op::Conv2dBackpropFilter(_)
        | Op::AvgPool2dGrad(_)
        | Op::ScatterAdd => {
            let dy = args[args.len() - 1];
            if dy.dtype != declared.dtype || !dy.dtype.is_float() {
                return Err(err(
                    Code::DtypeMismatch,
                    format!("{} of {dy} cannot make {declared}", op.name()),
                ));
            }
            Ok(declared.clone())
        }
        Op::MaxPool2dGrad(_) => {
            if args[0].dtype != args[1].dtype {
                return Err(err(
                    Code::DtypeMismatch,
                    format!("max_pool2d_grad of {} and {}", args[0], args[1]),
                ));
            }
            Ok(args[0].clone())
        }
        Op::CrossShardMean => {
            need_float(op.name(), args[0])?;
            Ok(args[0].clone())
        }
    }
}

/// How many operands an op takes.
pub fn arity(op: &Op) -> usize {
    match op {
        Op::Input { .. } | Op::Variable { .. } | Op::Const { .. } | Op::GlobalStep => 0,
        Op::Iota { .. } => 0,
        Op::RandomUniform { .. } | Op::RandomNormal { .. } => 0,
        Op::Binary(_) | Op::MatMul | Op::Gather | Op::Conv2d(_) => 2,
        Op::Conv2dBackpropInput(_)
        | Op::Conv2dBackpropFilter(_)
        | Op::MaxPool2dGrad(_)
        | Op::ScatterAdd => 2,
        Op::Select => 3,
        Op::Concat { .. } => usize::MAX,
        _ => 1,
    }
}

fn need_float(what: &str, t: &TensorType) -> Result<(), InferError> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(err(
            Code::DtypeMismatch,
            format!("{what} needs a float tensor, found {t}"),
        )
        .help("convert it with `cast(x, f32)`"))
    }
}

fn need_axis(axis: usize, t: &TensorType) -> Result<(), InferError> {
    if axis < t.rank() {
        Ok(())
    } else {
        Err(err(
            Code::InvalidAxis,
            format!("axis {axis} is out of range for {t} (rank {})", t.rank()),
        ))
    }
}

fn unary(u: UnaryOp, a: &TensorType) -> R {
    match u {
        UnaryOp::Not => {
            if a.dtype != DType::Bool {
                return Err(err(
                    Code::DtypeMismatch,
                    format!("`!` needs a bool tensor, found {a}"),
                ));
            }
        }
        UnaryOp::StopGradient => {}
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sign | UnaryOp::Square => {
            if !a.dtype.is_numeric() {
                return Err(err(
                    Code::DtypeMismatch,
                    format!("expected a numeric tensor, found {a}"),
                ));
            }
        }
        _ => need_float(&format!("{u:?}").to_lowercase(), a)?,
    }
    Ok(a.clone())
}

fn binary(b: BinaryOp, x: &TensorType, y: &TensorType) -> R {
    if x.dtype != y.dtype {
        return Err(err(
            Code::DtypeMismatch,
            format!(
                "operands have different dtypes: {} and {}",
                x.dtype, y.dtype
            ),
        )
        .help(cast_help(x.dtype, y.dtype)));
    }
    if b.is_logical() && x.dtype != DType::Bool {
        return Err(err(
            Code::DtypeMismatch,
            format!("`{}` needs bool tensors, found {}", b_sym(b), x.dtype),
        ));
    }
    if !b.is_logical() && !b.is_comparison() && !x.dtype.is_numeric() {
        return Err(err(
            Code::DtypeMismatch,
            format!("arithmetic needs numeric tensors, found {}", x.dtype),
        ));
    }
    let shape = broadcast(&x.shape, &y.shape).ok_or_else(|| {
        err(Code::ShapeMismatch, format!("shapes {x} and {y} do not broadcast"))
            .help("dimensions must be equal or 1, aligned from the right; reshape or transpose one operand")
    })?;
    let dtype = if b.is_comparison() {
        DType::Bool
    } else {
        x.dtype
    };
    Ok(TensorType::new(dtype, shape))
}

/// How to make operands of dtypes `a` and `b` agree: a cast, and for a half-precision
/// float beside f32, how mixed precision keeps them apart.
fn cast_help(a: DType, b: DType) -> String {
    let half = |d: DType| matches!(d, DType::F16 | DType::BF16);
    let (low, high) = if half(a) { (a, b) } else { (b, a) };
    if half(low) && high == DType::F32 {
        return format!(
            "cast one side: `cast(x, {low})` to compute in {low}, or `cast(x, f32)`; in mixed precision, layers (`dense`, `conv2d`) cast their f32 weights to an input of {low} themselves, and a loss is computed in f32 (`cast(logits, f32)`)"
        );
    }
    format!("cast one side: `cast(x, {a})` or `cast(x, {b})`")
}

fn b_sym(b: BinaryOp) -> &'static str {
    match b {
        BinaryOp::And => "&&",
        _ => "||",
    }
}

fn select(c: &TensorType, a: &TensorType, b: &TensorType) -> R {
    if c.dtype != DType::Bool {
        return Err(err(
            Code::DtypeMismatch,
            format!("the condition of `where` must be bool, found {c}"),
        ));
    }
    if a.dtype != b.dtype {
        return Err(err(
            Code::DtypeMismatch,
            format!(
                "the branches of `where` differ in dtype: {} and {}",
                a.dtype, b.dtype
            ),
        )
        .help(cast_help(a.dtype, b.dtype)));
    }
    let s = broadcast(&a.shape, &b.shape)
        .and_then(|s| broadcast(&c.shape, &s))
        .ok_or_else(|| {
            err(
                Code::ShapeMismatch,
                format!("shapes {c}, {a} and {b} do not broadcast"),
            )
        })?;
    Ok(TensorType::new(a.dtype, s))
}

fn reduce(op: ReduceOp, axes: &[usize], keep: bool, a: &TensorType) -> R {
    if !a.dtype.is_numeric() {
        return Err(err(
            Code::DtypeMismatch,
            format!("reductions need a numeric tensor, found {a}"),
        ));
    }
    if op == ReduceOp::Mean && !a.dtype.is_float() {
        return Err(err(
            Code::DtypeMismatch,
            format!("reduce_mean needs a float tensor, found {a}"),
        )
        .help("convert it with `cast(x, f32)`"));
    }
    for (i, &ax) in axes.iter().enumerate() {
        need_axis(ax, a)?;
        if axes[..i].contains(&ax) {
            return Err(err(Code::InvalidAxis, format!("axis {ax} is given twice")));
        }
    }
    let shape: Vec<usize> = a
        .shape
        .iter()
        .enumerate()
        .filter_map(|(i, &d)| {
            if !axes.contains(&i) {
                Some(d)
            } else if keep {
                Some(1)
            } else {
                None
            }
        })
        .collect();
    Ok(TensorType::new(a.dtype, shape))
}

fn arg_reduce(axis: usize, a: &TensorType) -> R {
    need_axis(axis, a)?;
    let mut shape = a.shape.clone();
    shape.remove(axis);
    Ok(TensorType::new(DType::I32, shape))
}

fn matmul(a: &TensorType, b: &TensorType) -> R {
    if a.dtype != b.dtype {
        return Err(err(
            Code::DtypeMismatch,
            format!(
                "matmul operands differ in dtype: {} and {}",
                a.dtype, b.dtype
            ),
        )
        .help(cast_help(a.dtype, b.dtype)));
    }
    if !a.dtype.is_numeric() {
        return Err(err(
            Code::DtypeMismatch,
            format!("matmul needs numeric tensors, found {a}"),
        ));
    }
    if a.rank() < 2 || b.rank() < 2 {
        return Err(err(
            Code::ShapeMismatch,
            format!("matmul needs operands of rank 2 or more, found {a} and {b}"),
        ));
    }
    let (m, k1) = (a.shape[a.rank() - 2], a.shape[a.rank() - 1]);
    let (k2, n) = (b.shape[b.rank() - 2], b.shape[b.rank() - 1]);
    if k1 != k2 {
        return Err(err(
            Code::ShapeMismatch,
            format!("matmul inner dimensions differ: {a} times {b} ({k1} vs {k2})"),
        )
        .help(
            "the last dimension of the left operand must equal the second-to-last of the right",
        ));
    }
    let batch = broadcast(&a.shape[..a.rank() - 2], &b.shape[..b.rank() - 2]).ok_or_else(|| {
        err(
            Code::ShapeMismatch,
            format!("matmul batch dimensions of {a} and {b} do not broadcast"),
        )
    })?;
    let mut shape = batch;
    shape.extend([m, n]);
    Ok(TensorType::new(a.dtype, shape))
}

fn transpose(perm: &[usize], a: &TensorType) -> R {
    let mut seen = vec![false; a.rank()];
    if perm.len() != a.rank()
        || perm
            .iter()
            .any(|&p| p >= a.rank() || std::mem::replace(&mut seen[p], true))
    {
        return Err(err(
            Code::InvalidAxis,
            format!("{perm:?} is not a permutation of the axes of {a}"),
        ));
    }
    Ok(TensorType::new(
        a.dtype,
        perm.iter().map(|&p| a.shape[p]).collect::<Vec<usize>>(),
    ))
}

fn reshape(a: &TensorType, to: &TensorType) -> R {
    if a.has_unknown() && !to.has_unknown() {
        return Err(err(
            Code::InvalidShape,
            format!(
                "cannot reshape {a} to {to}: `?` is a size each record gives, so the number of elements is not known here"
            ),
        )
        .help(UNKNOWN_HELP));
    }
    if a.elements() != to.elements() {
        return Err(err(
            Code::InvalidShape,
            format!(
                "cannot reshape {a} ({} elements) to {:?} ({} elements)",
                a.elements(),
                to.shape,
                to.elements()
            ),
        )
        .help("the new shape must have as many elements as the old one"));
    }
    Ok(TensorType::new(a.dtype, to.shape.clone()))
}

fn broadcast_to(a: &TensorType, to: &TensorType) -> R {
    match broadcast(&a.shape, &to.shape) {
        Some(s) if s == to.shape => Ok(TensorType::new(a.dtype, to.shape.clone())),
        _ => Err(err(
            Code::ShapeMismatch,
            format!("{a} cannot be broadcast to {:?}", to.shape),
        )),
    }
}

fn concat(axis: usize, args: &[&TensorType]) -> R {
    let Some(first) = args.first() else {
        return Err(err(Code::InvalidShape, "concat needs at least one tensor"));
    };
    need_axis(axis, first)?;
    let mut shape = first.shape.clone();
    for t in &args[1..] {
        if t.dtype != first.dtype {
            return Err(err(
                Code::DtypeMismatch,
                format!(
                    "concat operands differ in dtype: {} and {}",
                    first.dtype, t.dtype
                ),
            )
            .help(cast_help(first.dtype, t.dtype)));
        }
        let same_rest = t.rank() == first.rank()
            && (0..t.rank()).all(|i| i == axis || t.shape[i] == first.shape[i]);
        if !same_rest {
            return Err(err(
                Code::ShapeMismatch,
                format!("cannot concatenate {first} and {t} along axis {axis}"),
            ));
        }
        // (a length each record gives stays one: `[1]` and `[?]` make `[?]`)
        shape[axis] = if shape[axis] == UNKNOWN_DIM || t.shape[axis] == UNKNOWN_DIM {
            UNKNOWN_DIM
        } else {
            shape[axis] + t.shape[axis]
        };
    }
    Ok(TensorType::new(first.dtype, shape))
}

fn slice(axis: usize, start: usize, end: usize, a: &TensorType) -> R {
    need_axis(axis, a)?;
    if start >= end || end > a.shape[axis] {
        return Err(err(
            Code::InvalidShape,
            format!("slice {start}..{end} is out of range for axis {axis} of {a}"),
        ));
    }
    let mut shape = a.shape.clone();
    shape[axis] = end - start;
    Ok(TensorType::new(a.dtype, shape))
}

fn one_hot(depth: usize, a: &TensorType, declared: &TensorType) -> R {
    if !matches!(a.dtype, DType::I32 | DType::U8) {
        return Err(err(
            Code::DtypeMismatch,
            format!("one_hot needs integer indices, found {a}"),
        ));
    }
    let mut shape = a.shape.clone();
    shape.push(depth);
    Ok(TensorType::new(declared.dtype, shape))
}

fn gather(table: &TensorType, idx: &TensorType) -> R {
    if idx.dtype != DType::I32 {
        return Err(err(
            Code::DtypeMismatch,
            format!("gather needs i32 indices, found {idx}"),
        ));
    }
    if table.rank() < 1 {
        return Err(err(
            Code::ShapeMismatch,
            format!("gather needs a table of rank 1 or more, found {table}"),
        ));
    }
    let mut shape = idx.shape.clone();
    shape.extend_from_slice(&table.shape[1..]);
    Ok(TensorType::new(table.dtype, shape))
}

/// Output length of a sliding window along one axis.
pub fn window_out(len: usize, window: usize, stride: usize, padding: Padding) -> Option<usize> {
    if stride == 0 || window == 0 {
        return None;
    }
    match padding {
        Padding::Same => Some(len.div_ceil(stride)),
        Padding::Valid => (len >= window).then(|| (len - window) / stride + 1),
    }
}

/// The padding before a sliding window's first position along one axis of `len`, for
/// `out` positions `stride` apart of a `window` (its effective extent, dilation
/// included): none when valid; when `same`, half of what the positions overrun the
/// axis by, the odd one after (TensorFlow's).
pub fn window_pad(len: usize, out: usize, window: usize, stride: usize, padding: Padding) -> usize {
    match padding {
        Padding::Valid => 0,
        Padding::Same => (out.saturating_sub(1) * stride + window).saturating_sub(len) / 2,
    }
}

fn conv2d(x: &TensorType, w: &TensorType, c: &Conv) -> R {
    let Conv {
        strides,
        padding,
        dilation,
    } = *c;
    need_float("conv2d", x)?;
    if x.dtype != w.dtype {
        return Err(err(
            Code::DtypeMismatch,
            format!(
                "conv2d input and filter differ in dtype: {} and {}",
                x.dtype, w.dtype
            ),
        )
        .help(cast_help(x.dtype, w.dtype)));
    }
    if x.rank() != 4 || w.rank() != 4 {
        return Err(err(
            Code::ShapeMismatch,
            format!("conv2d needs an NHWC input and an HWIO filter, found {x} and {w}"),
        )
        .help("reshape the input to [batch, height, width, channels]"));
    }
    if x.shape[3] != w.shape[2] {
        return Err(err(
            Code::ShapeMismatch,
            format!(
                "conv2d input has {} channels but the filter expects {}",
                x.shape[3], w.shape[2]
            ),
        ));
    }
    let mut out = vec![x.shape[0]];
    for i in 0..2 {
        let k = (w.shape[i] - 1)
            .saturating_mul(dilation[i])
            .saturating_add(1);
        let o = window_out(x.shape[1 + i], k, strides[i], padding).ok_or_else(|| {
            err(
                Code::ShapeMismatch,
                format!(
                    "conv2d window {k} is larger than the input {} with valid padding",
                    x.shape[1 + i]
                ),
            )
        })?;
        out.push(o);
    }
    out.push(w.shape[3]);
    Ok(TensorType::new(x.dtype, out))
}

fn pool(x: &TensorType, p: &Pool) -> R {
    let Pool {
        window,
        strides,
        padding,
    } = *p;
    need_float("pooling", x)?;
    if x.rank() != 4 {
        return Err(err(
            Code::ShapeMismatch,
            format!("pooling needs an NHWC input, found {x}"),
        ));
    }
    let mut out = vec![x.shape[0]];
    for i in 0..2 {
        let o = window_out(x.shape[1 + i], window[i], strides[i], padding).ok_or_else(|| {
            err(
                Code::ShapeMismatch,
                format!(
                    "pooling window {} does not fit the input {}",
                    window[i],
                    x.shape[1 + i]
                ),
            )
        })?;
        out.push(o);
    }
    out.push(x.shape[3]);
    Ok(TensorType::new(x.dtype, out))
}
