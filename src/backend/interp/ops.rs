//! The interpreter's kernels: one function per op, written for clarity, with ndarray's
//! matrix product (matrixmultiply's GEMM) under matmul and convolution (im2col).

use crate::backend::window::Geo;
use crate::ir::float;
use crate::ir::{BinaryOp, Conv, DType, Op, Pool, ReduceOp, TensorType, UnaryOp};
use crate::rng::Stream;
use crate::tensor::{Arr, Data, Tensor};
use ndarray::{Array2, Axis, IxDyn, Slice, Zip};

/// What the kernels need besides operands: the global step, the run seed and the shard.
#[derive(Debug, Clone, Copy)]
pub struct OpEnv {
    pub step: i64,
    pub seed: u64,
    pub shard: usize,
}

type R = Result<Tensor, String>;

fn dyn_shape(ty: &TensorType) -> IxDyn {
    IxDyn(&ty.shape)
}

/// Evaluates one op on its operands; the result has type `ty`.
pub fn eval(op: &Op, args: &[&Tensor], ty: &TensorType, env: &OpEnv) -> R {
    match op {
        Op::Const { bits } => Ok(Tensor::splat(ty, f64::from_bits(*bits))),
        Op::GlobalStep => Ok(Tensor::int(
            DType::I64,
            Arr::from_elem(IxDyn(&[]), env.step),
        )),
        Op::Unary(u) => unary(*u, args[0], ty),
        Op::Binary(b) => binary(*b, args[0], args[1], ty),
        Op::Select => select(args[0], args[1], args[2], ty),
        Op::Cast => Ok(cast(args[0], ty)),
        Op::Reduce { op, axes, .. } => reduce(*op, axes, args[0], ty),
        Op::ArgMax { axis } => Ok(arg_extremum(args[0], *axis, ty, true)),
        Op::ArgMin { axis } => Ok(arg_extremum(args[0], *axis, ty, false)),
        Op::MatMul => matmul(args[0], args[1], ty),
        Op::Transpose { perm } => Ok(map_data(args[0], |d| match d {
            Data::F(a) => Data::F(a.clone().permuted_axes(IxDyn(perm))),
            Data::I(a) => Data::I(a.clone().permuted_axes(IxDyn(perm))),
            Data::B(a) => Data::B(a.clone().permuted_axes(IxDyn(perm))),
            Data::S(a) => Data::S(a.clone().permuted_axes(IxDyn(perm))),
        })),
        Op::Reshape => Ok(map_data(args[0], |d| match d {
            Data::F(a) => Data::F(reshape(a, ty)),
            Data::I(a) => Data::I(reshape(a, ty)),
            Data::B(a) => Data::B(reshape(a, ty)),
            Data::S(a) => Data::S(reshape(a, ty)),
        })),
        Op::BroadcastTo | Op::CrossShardMean => Ok(map_data(args[0], |d| match d {
            Data::F(a) => Data::F(bcast(a, ty)),
            Data::I(a) => Data::I(bcast(a, ty)),
            Data::B(a) => Data::B(bcast(a, ty)),
            Data::S(a) => Data::S(bcast(a, ty)),
        })),
        Op::Concat { axis } => concat(*axis, args),
        Op::Slice { axis, start, end } => Ok(map_data(args[0], |d| {
            let s = Slice::from(*start..*end);
            match d {
                Data::F(a) => Data::F(sliced(a, *axis, s)),
                Data::I(a) => Data::I(sliced(a, *axis, s)),
                Data::B(a) => Data::B(sliced(a, *axis, s)),
                Data::S(a) => Data::S(sliced(a, *axis, s)),
            }
        })),
        Op::OneHot { depth } => Ok(one_hot(args[0], *depth, ty)),
        Op::Iota { axis } => Ok(iota(*axis, ty)),
        Op::CheckIndices { depth } => check_indices(args[0], *depth),
        Op::Gather => gather(args[0], args[1], ty),
        Op::ScatterAdd => scatter_add(args[0], args[1], ty),
        Op::Conv2d(c) => Ok(conv2d(args[0], args[1], c, ty)),
        Op::Conv2dBackpropInput(c) => Ok(conv2d_backprop_input(args[0], args[1], c, ty)),
        Op::Conv2dBackpropFilter(c) => Ok(conv2d_backprop_filter(args[0], args[1], c, ty)),
        Op::MaxPool2d(p) => Ok(max_pool(args[0], None, p, ty)),
        Op::MaxPool2dGrad(p) => Ok(max_pool(args[0], Some(args[1]), p, ty)),
        Op::AvgPool2d(p) => Ok(avg_pool(args[0], p, ty)),
        Op::AvgPool2dGrad(p) => Ok(avg_pool_grad(args[0], p, ty)),
        Op::Softmax { axis } => Ok(softmax(args[0], *axis, false)),
        Op::LogSoftmax { axis } => Ok(softmax(args[0], *axis, true)),
        Op::RandomUniform { stream } | Op::RandomNormal { stream } => {
            let normal = matches!(op, Op::RandomNormal { .. });
            let s = Stream::new(env.seed, *stream);
            let n = ty.elements();
            // Shard k draws the elements a single shard would draw for its part of the
            // global batch, so the numbers do not depend on the shard count.
            let first = (env.shard * n) as u64;
            let step = env.step as u64;
            let v: Vec<f32> = if normal {
                (0..n as u64).map(|i| s.normal(first + i, step)).collect()
            } else {
                s.uniforms(first, n, step)
            };
            Ok(Tensor::float(
                ty.dtype,
                Arr::from_shape_vec(dyn_shape(ty), v).expect("shape"),
            ))
        }
        Op::DecodeRaw => crate::tensor::decode_raw(args[0], ty),
        Op::DecodeImage { format, resize } => {
            crate::data::image::decode(args[0], *format, *resize, ty)
        }
        Op::Lookup {
            vocab,
            oov,
            default,
        } => {
            let index: rustc_hash::FxHashMap<&[u8], usize> = vocab
                .iter()
                .enumerate()
                .map(|(i, v)| (v.as_bytes(), i))
                .collect();
            Ok(strings_to_ids(args[0], ty, |s| match index.get(s) {
                Some(&i) => i as i64,
                None if *oov > 0 => (vocab.len() + bucket(s, *oov)) as i64,
                None => *default,
            }))
        }
        Op::HashBucket { buckets } => {
            Ok(strings_to_ids(args[0], ty, |s| bucket(s, *buckets) as i64))
        }
        Op::Input { .. } | Op::Variable { .. } => {
            Err(format!("{} has no value (not fed)", op.name()))
        }
    }
}

/// A string's bucket among `n`: FNV-1a 64 of its bytes, modulo `n`.
fn bucket(s: &[u8], n: usize) -> usize {
    (crate::hash::fnv1a(crate::hash::FNV_OFFSET, s) % n.max(1) as u64) as usize
}

/// Each string of `x` mapped to an integer id.
fn strings_to_ids(x: &Tensor, ty: &TensorType, f: impl Fn(&[u8]) -> i64) -> Tensor {
    match &x.data {
        Data::S(a) => Tensor::int(ty.dtype, a.mapv(|s| f(&s)).into_shared()),
        _ => Tensor::splat(ty, 0.0),
    }
}

/// Each element's index along `axis`.
fn iota(axis: usize, ty: &TensorType) -> Tensor {
    let at = Arr::from_shape_fn(dyn_shape(ty), |ix| ix[axis] as i64);
    if ty.dtype.is_float() {
        Tensor::float(ty.dtype, at.mapv(|i| i as f32).into_shared())
    } else {
        Tensor::int(ty.dtype, at)
    }
}

fn map_data(t: &Tensor, f: impl FnOnce(&Data) -> Data) -> Tensor {
    Tensor {
        dtype: t.dtype,
        data: f(&t.data),
    }
}

fn reshape<T: Clone>(a: &Arr<T>, ty: &TensorType) -> Arr<T> {
    let shape = dyn_shape(ty);
    if a.is_standard_layout() {
        if let Ok(r) = a.clone().into_shape_with_order(shape.clone()) {
            return r;
        }
    }
    let owned = a.as_standard_layout().into_owned();
    owned
        .into_shape_with_order(shape)
        .expect("reshape keeps the element count")
        .into_shared()
}

fn bcast<T: Clone>(a: &Arr<T>, ty: &TensorType) -> Arr<T> {
    if a.shape() == ty.shape.as_slice() {
        return a.clone();
    }
    a.broadcast(dyn_shape(ty))
        .expect("broadcast checked by inference")
        .to_owned()
        .into_shared()
}

fn sliced<T: Clone>(a: &Arr<T>, axis: usize, s: Slice) -> Arr<T> {
    let mut c = a.clone();
    c.slice_axis_inplace(Axis(axis), s);
    c
}

fn unary(u: UnaryOp, a: &Tensor, ty: &TensorType) -> R {
    if u == UnaryOp::StopGradient {
        return Ok(a.clone());
    }
    Ok(match &a.data {
        Data::F(x) => {
            let f: fn(f32) -> f32 = match u {
                UnaryOp::Neg => |x| -x,
                UnaryOp::Abs => f32::abs,
                UnaryOp::Exp => f32::exp,
                UnaryOp::Log => f32::ln,
                UnaryOp::Sqrt => f32::sqrt,
                UnaryOp::Rsqrt => |x| 1.0 / x.sqrt(),
                UnaryOp::Square => |x| x * x,
                UnaryOp::Tanh => f32::tanh,
                UnaryOp::Sigmoid => |x| 1.0 / (1.0 + (-x).exp()),
                UnaryOp::Relu => float::relu,
                UnaryOp::Floor => f32::floor,
                UnaryOp::Sign => float::sign,
                UnaryOp::Sin => f32::sin,
                UnaryOp::Cos => f32::cos,
                UnaryOp::Erf => |x| float::erf(f64::from(x)) as f32,
                UnaryOp::StopGradient => |x| x,
                UnaryOp::Not => return Err("not of a float".into()),
            };
            Tensor::float(ty.dtype, x.map(|&v| f(v)).into_shared())
        }
        Data::I(x) => {
            let f: fn(i64) -> i64 = match u {
                UnaryOp::Neg => i64::wrapping_neg,
                UnaryOp::Abs => i64::wrapping_abs,
                UnaryOp::Square => |x| x.wrapping_mul(x),
                UnaryOp::Sign => i64::signum,
                UnaryOp::Relu => |x| x.max(0),
                UnaryOp::Floor => |x| x,
                _ => return Err(format!("{} of an integer", Op::Unary(u).name())),
            };
            Tensor::int(ty.dtype, x.map(|&v| f(v)).into_shared())
        }
        Data::B(x) => Tensor::bool(x.map(|&v| !v).into_shared()),
        Data::S(_) => return Err("arithmetic on bytes".into()),
    })
}

fn zip_any<T: Copy, U: Clone>(
    a: &Arr<T>,
    b: &Arr<T>,
    ty: &TensorType,
    f: impl Fn(T, T) -> U,
) -> Arr<U> {
    let shape = dyn_shape(ty);
    let av = a.broadcast(shape.clone()).expect("broadcast");
    let bv = b.broadcast(shape).expect("broadcast");
    Zip::from(&av)
        .and(&bv)
        .map_collect(|&x, &y| f(x, y))
        .into_shared()
}

fn compare<T: PartialOrd + Copy>(
    op: BinaryOp,
    a: &Arr<T>,
    b: &Arr<T>,
    ty: &TensorType,
) -> Option<Arr<bool>> {
    let f: fn(T, T) -> bool = match op {
        BinaryOp::Eq => |x, y| x == y,
        BinaryOp::Ne => |x, y| x != y,
        BinaryOp::Lt => |x, y| x < y,
        BinaryOp::Le => |x, y| x <= y,
        BinaryOp::Gt => |x, y| x > y,
        BinaryOp::Ge => |x, y| x >= y,
        _ => return None,
    };
    Some(zip_any(a, b, ty, f))
}

fn binary(op: BinaryOp, a: &Tensor, b: &Tensor, ty: &TensorType) -> R {
    if op.is_comparison() {
        let r = match (&a.data, &b.data) {
            (Data::F(x), Data::F(y)) => compare(op, x, y, ty),
            (Data::I(x), Data::I(y)) => compare(op, x, y, ty),
            (Data::B(x), Data::B(y)) => compare(op, x, y, ty),
            _ => None,
        };
        return r
            .map(Tensor::bool)
            .ok_or_else(|| format!("{} of {} and {}", Op::Binary(op).name(), a.dtype, b.dtype));
    }
    match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => {
            let f: fn(f32, f32) -> f32 = match op {
                BinaryOp::Add => |x, y| x + y,
                BinaryOp::Sub => |x, y| x - y,
                BinaryOp::Mul => |x, y| x * y,
                BinaryOp::Div => |x, y| x / y,
                BinaryOp::Rem => |x, y| x % y,
                BinaryOp::Pow => f32::powf,
                BinaryOp::Max => float::maximum,
                BinaryOp::Min => float::minimum,
                _ => return Err(format!("{} of floats", Op::Binary(op).name())),
            };
            Ok(Tensor::float(ty.dtype, zip_any(x, y, ty, f)))
        }
        (Data::I(x), Data::I(y)) => {
            if matches!(op, BinaryOp::Div | BinaryOp::Rem) && y.iter().any(|&v| v == 0) {
                return Err("integer division by zero".into());
            }
            let f: fn(i64, i64) -> i64 = match op {
                BinaryOp::Add => i64::wrapping_add,
                BinaryOp::Sub => i64::wrapping_sub,
                BinaryOp::Mul => i64::wrapping_mul,
                BinaryOp::Div => i64::wrapping_div,
                BinaryOp::Rem => i64::wrapping_rem,
                BinaryOp::Pow => |x, y| x.wrapping_pow(y.clamp(0, u32::MAX as i64) as u32),
                BinaryOp::Max => i64::max,
                BinaryOp::Min => i64::min,
                _ => return Err(format!("{} of integers", Op::Binary(op).name())),
            };
            Ok(Tensor::int(ty.dtype, zip_any(x, y, ty, f)))
        }
        (Data::B(x), Data::B(y)) => {
            let f: fn(bool, bool) -> bool = match op {
                BinaryOp::And => |x, y| x && y,
                BinaryOp::Or => |x, y| x || y,
                _ => return Err(format!("{} of booleans", Op::Binary(op).name())),
            };
            Ok(Tensor::bool(zip_any(x, y, ty, f)))
        }
        _ => Err(format!(
            "{} of {} and {}",
            Op::Binary(op).name(),
            a.dtype,
            b.dtype
        )),
    }
}

fn select(c: &Tensor, a: &Tensor, b: &Tensor, ty: &TensorType) -> R {
    let shape = dyn_shape(ty);
    let cv = c.b().broadcast(shape.clone()).expect("broadcast");
    fn pick<T: Copy>(
        cv: &ndarray::ArrayViewD<bool>,
        x: &Arr<T>,
        y: &Arr<T>,
        shape: &IxDyn,
    ) -> Arr<T> {
        let xv = x.broadcast(shape.clone()).expect("broadcast");
        let yv = y.broadcast(shape.clone()).expect("broadcast");
        Zip::from(cv)
            .and(&xv)
            .and(&yv)
            .map_collect(|&c, &x, &y| if c { x } else { y })
            .into_shared()
    }
    Ok(match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => Tensor::float(ty.dtype, pick(&cv, x, y, &shape)),
        (Data::I(x), Data::I(y)) => Tensor::int(ty.dtype, pick(&cv, x, y, &shape)),
        (Data::B(x), Data::B(y)) => Tensor::bool(pick(&cv, x, y, &shape)),
        _ => return Err("select of mismatched operands".into()),
    })
}

fn cast(a: &Tensor, ty: &TensorType) -> Tensor {
    let to = ty.dtype;
    match &a.data {
        Data::F(x) if to.is_float() => Tensor::float(to, x.clone()),
        Data::F(x) if to == DType::Bool => Tensor::bool(x.map(|&v| v != 0.0).into_shared()),
        // Truncation toward zero, saturated to the dtype; NaN becomes its smallest value.
        Data::F(x) => Tensor::int(
            to,
            x.map(|&v| float::to_int(f64::from(v), to)).into_shared(),
        ),
        Data::I(x) if to.is_float() => Tensor::float(to, x.map(|&v| v as f32).into_shared()),
        Data::I(x) if to == DType::Bool => Tensor::bool(x.map(|&v| v != 0).into_shared()),
        Data::I(x) => Tensor::int(to, x.clone()),
        Data::B(x) if to.is_float() => {
            Tensor::float(to, x.map(|&v| f32::from(u8::from(v))).into_shared())
        }
        Data::B(x) if to == DType::Bool => a.clone(),
        Data::B(x) => Tensor::int(to, x.map(|&v| i64::from(v)).into_shared()),
        Data::S(_) => a.clone(),
    }
}

fn reduce(op: ReduceOp, axes: &[usize], a: &Tensor, ty: &TensorType) -> R {
    let mut sorted = axes.to_vec();
    sorted.sort_unstable_by(|x, y| y.cmp(x));
    let count: usize = axes.iter().map(|&ax| a.shape()[ax]).product();
    match &a.data {
        Data::F(x) => {
            let mut r = x.to_owned();
            for &ax in &sorted {
                r = match op {
                    ReduceOp::Sum | ReduceOp::Mean => r.sum_axis(Axis(ax)),
                    ReduceOp::Prod => r.fold_axis(Axis(ax), 1.0, |&p, &v| p * v),
                    ReduceOp::Max => {
                        r.fold_axis(Axis(ax), f32::NEG_INFINITY, |&p, &v| float::maximum(p, v))
                    }
                    ReduceOp::Min => {
                        r.fold_axis(Axis(ax), f32::INFINITY, |&p, &v| float::minimum(p, v))
                    }
                };
            }
            if op == ReduceOp::Mean {
                let c = count.max(1) as f32;
                r.mapv_inplace(|v| v / c);
            }
            Ok(Tensor::float(ty.dtype, reshape(&r.into_shared(), ty)))
        }
        Data::I(x) => {
            let mut r = x.to_owned();
            for &ax in &sorted {
                r = match op {
                    ReduceOp::Sum | ReduceOp::Mean => {
                        r.fold_axis(Axis(ax), 0i64, |&p, &v| p.wrapping_add(v))
                    }
                    ReduceOp::Prod => r.fold_axis(Axis(ax), 1i64, |&p, &v| p.wrapping_mul(v)),
                    ReduceOp::Max => r.fold_axis(Axis(ax), i64::MIN, |&p, &v| p.max(v)),
                    ReduceOp::Min => r.fold_axis(Axis(ax), i64::MAX, |&p, &v| p.min(v)),
                };
            }
            Ok(Tensor::int(ty.dtype, reshape(&r.into_shared(), ty)))
        }
        Data::B(x) => {
            // sum/max of booleans: any; min/prod: all
            let mut r = x.to_owned();
            for &ax in &sorted {
                r = match op {
                    ReduceOp::Min | ReduceOp::Prod => r.fold_axis(Axis(ax), true, |&p, &v| p && v),
                    _ => r.fold_axis(Axis(ax), false, |&p, &v| p || v),
                };
            }
            Ok(Tensor::bool(reshape(&r.into_shared(), ty)))
        }
        Data::S(_) => Err("reduction of bytes".into()),
    }
}

fn arg_extremum(a: &Tensor, axis: usize, ty: &TensorType, max: bool) -> Tensor {
    let vals: Vec<f64> = a.to_f64();
    let shape = a.shape();
    let outer: usize = shape[..axis].iter().product();
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let mut out = Vec::with_capacity(outer * inner);
    if n == 0 {
        // an empty axis has no extremum: index 0, as for a single element
        return Tensor::int(ty.dtype, Arr::zeros(dyn_shape(ty)));
    }
    for o in 0..outer {
        for i in 0..inner {
            let mut best = 0usize;
            for k in 1..n {
                let v = vals[(o * n + k) * inner + i];
                let b = vals[(o * n + best) * inner + i];
                if float::beats(v, b, max) {
                    best = k;
                }
            }
            out.push(best as i64);
        }
    }
    Tensor::int(
        ty.dtype,
        Arr::from_shape_vec(dyn_shape(ty), out).expect("shape"),
    )
}

fn matmul(a: &Tensor, b: &Tensor, ty: &TensorType) -> R {
    let (ra, rb) = (a.shape().len(), b.shape().len());
    match (&a.data, &b.data) {
        (Data::F(x), Data::F(y)) => {
            if ra == 2 && rb == 2 {
                let xv = x
                    .view()
                    .into_dimensionality::<ndarray::Ix2>()
                    .expect("rank 2");
                let yv = y
                    .view()
                    .into_dimensionality::<ndarray::Ix2>()
                    .expect("rank 2");
                return Ok(Tensor::float(
                    ty.dtype,
                    xv.dot(&yv).into_dyn().into_shared(),
                ));
            }
            let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
            let batch: Vec<usize> = ty.shape[..ty.shape.len() - 2].to_vec();
            let nb: usize = batch.iter().product();
            let mut sa = batch.clone();
            sa.extend([m, k]);
            let mut sb = batch.clone();
            sb.extend([k, n]);
            let xv: Vec<f32> = x
                .broadcast(IxDyn(&sa))
                .expect("broadcast")
                .iter()
                .copied()
                .collect();
            let yv: Vec<f32> = y
                .broadcast(IxDyn(&sb))
                .expect("broadcast")
                .iter()
                .copied()
                .collect();
            let xa = ndarray::Array3::from_shape_vec((nb, m, k), xv).expect("shape");
            let yb = ndarray::Array3::from_shape_vec((nb, k, n), yv).expect("shape");
            let mut out = ndarray::Array3::<f32>::zeros((nb, m, n));
            for i in 0..nb {
                let r = xa.index_axis(Axis(0), i).dot(&yb.index_axis(Axis(0), i));
                out.index_axis_mut(Axis(0), i).assign(&r);
            }
            Ok(Tensor::float(
                ty.dtype,
                out.into_shape_with_order(dyn_shape(ty))
                    .expect("shape")
                    .into_shared(),
            ))
        }
        (Data::I(_), Data::I(_)) => {
            // Integer matmul: exact, through i64 loops.
            let af = a.to_f64();
            let bf = b.to_f64();
            let (m, k, n) = (a.shape()[ra - 2], a.shape()[ra - 1], b.shape()[rb - 1]);
            let nb: usize = ty.shape[..ty.shape.len() - 2].iter().product();
            let a_batch = af.len() / (m * k);
            let b_batch = bf.len() / (k * n);
            let mut out = vec![0i64; nb * m * n];
            for bi in 0..nb {
                let ao = (bi % a_batch) * m * k;
                let bo = (bi % b_batch) * k * n;
                for i in 0..m {
                    for j in 0..n {
                        let mut s = 0i64;
                        for l in 0..k {
                            s = s.wrapping_add(
                                (af[ao + i * k + l] as i64).wrapping_mul(bf[bo + l * n + j] as i64),
                            );
                        }
                        out[bi * m * n + i * n + j] = s;
                    }
                }
            }
            Ok(Tensor::int(
                ty.dtype,
                Arr::from_shape_vec(dyn_shape(ty), out).expect("shape"),
            ))
        }
        _ => Err("matmul of non-numeric tensors".into()),
    }
}

fn concat(axis: usize, args: &[&Tensor]) -> R {
    let dtype = args[0].dtype;
    macro_rules! cat {
        ($variant:ident, $wrap:expr) => {{
            let views: Vec<_> = args
                .iter()
                .map(|t| match &t.data {
                    Data::$variant(a) => a.view(),
                    _ => unreachable!("concat operands share a dtype"),
                })
                .collect();
            let r = ndarray::concatenate(Axis(axis), &views).map_err(|e| e.to_string())?;
            $wrap(r.into_shared())
        }};
    }
    Ok(match &args[0].data {
        Data::F(_) => cat!(F, |a| Tensor::float(dtype, a)),
        Data::I(_) => cat!(I, |a| Tensor::int(dtype, a)),
        Data::B(_) => cat!(B, Tensor::bool),
        Data::S(_) => cat!(S, |a| Tensor {
            dtype,
            data: Data::S(a)
        }),
    })
}

fn one_hot(idx: &Tensor, depth: usize, ty: &TensorType) -> Tensor {
    // Made in the result's dtype directly: a one-hot tensor may be the largest of a
    // step, and an f64 copy of it would triple its peak.
    fn hot<T: Copy>(ids: &Arr<i64>, depth: usize, zero: T, one: T) -> Vec<T> {
        let mut v = vec![zero; ids.len() * depth];
        for (i, &k) in ids.iter().enumerate() {
            // Out-of-range indices give a row of zeros, as in TensorFlow.
            if k >= 0 && (k as u64) < depth as u64 {
                v[i * depth + k as usize] = one;
            }
        }
        v
    }
    let ids = idx.i();
    // The shape from the indices (a dimension the pipeline left open is only known
    // from them), so it always holds the values made.
    let mut dims = idx.shape().to_vec();
    dims.push(depth);
    let shape = IxDyn(&dims);
    match ty.dtype {
        d if d.is_float() => Tensor::float(
            d,
            Arr::from_shape_vec(shape, hot(ids, depth, 0f32, 1.0)).expect("shape"),
        ),
        DType::Bool => {
            Tensor::bool(Arr::from_shape_vec(shape, hot(ids, depth, false, true)).expect("shape"))
        }
        d => Tensor::int(
            d,
            Arr::from_shape_vec(shape, hot(ids, depth, 0i64, 1)).expect("shape"),
        ),
    }
}

/// `idx` itself when every index lies in `[0, depth)`; else the first one that does
/// not, with its position in the batch (the row of the first axis).
fn check_indices(idx: &Tensor, depth: usize) -> R {
    let row: usize = idx.shape().iter().skip(1).product();
    for (i, &k) in idx.i().iter().enumerate() {
        if k < 0 || k as u64 >= depth as u64 {
            let at = if idx.shape().len() > 1 {
                format!("batch position {} (element {i})", i / row.max(1))
            } else {
                format!("batch position {i}")
            };
            return Err(format!(
                "label {k} at {at} is outside [0, {depth}) (the model has {depth} classes)"
            ));
        }
    }
    Ok(idx.clone())
}

fn gather(table: &Tensor, idx: &Tensor, ty: &TensorType) -> R {
    let rows = table.shape()[0];
    let row: usize = table.shape()[1..].iter().product();
    let ids = idx.i();
    for &k in ids.iter() {
        if k < 0 || k as usize >= rows {
            return Err(format!(
                "gather index {k} is out of range for a table of {rows} rows"
            ));
        }
    }
    macro_rules! g {
        ($a:expr) => {{
            let t = $a.as_standard_layout();
            let s = t.as_slice().expect("standard layout");
            let mut out = Vec::with_capacity(ids.len() * row);
            for &k in ids.iter() {
                out.extend_from_slice(&s[k as usize * row..(k as usize + 1) * row]);
            }
            Arr::from_shape_vec(dyn_shape(ty), out).expect("shape")
        }};
    }
    Ok(match &table.data {
        Data::F(a) => Tensor::float(ty.dtype, g!(a)),
        Data::I(a) => Tensor::int(ty.dtype, g!(a)),
        Data::B(a) => Tensor::bool(g!(a)),
        Data::S(a) => Tensor {
            dtype: ty.dtype,
            data: Data::S(g!(a)),
        },
    })
}

fn scatter_add(idx: &Tensor, dy: &Tensor, ty: &TensorType) -> R {
    let rows = ty.shape[0];
    let row: usize = ty.shape[1..].iter().product();
    let mut out = vec![0f32; rows * row];
    let d = dy.f().as_standard_layout();
    let ds = d.as_slice().expect("standard layout");
    for (i, &k) in idx.i().iter().enumerate() {
        if k < 0 || k as usize >= rows {
            return Err(format!("scatter index {k} is out of range for {rows} rows"));
        }
        let dst = &mut out[k as usize * row..(k as usize + 1) * row];
        for (o, &v) in dst.iter_mut().zip(&ds[i * row..(i + 1) * row]) {
            *o += v;
        }
    }
    Ok(Tensor::float(
        ty.dtype,
        Arr::from_shape_vec(dyn_shape(ty), out).expect("shape"),
    ))
}

fn softmax(a: &Tensor, axis: usize, log: bool) -> Tensor {
    let mut r = a.f().to_owned();
    for mut lane in r.lanes_mut(Axis(axis)) {
        let m = lane.fold(f32::NEG_INFINITY, |m, &v| float::maximum(m, v));
        if log {
            let s: f32 = lane.iter().map(|&v| (v - m).exp()).sum();
            let l = s.ln() + m;
            lane.mapv_inplace(|v| v - l);
        } else {
            lane.mapv_inplace(|v| (v - m).exp());
            let s: f32 = lane.sum();
            lane.mapv_inplace(|v| v / s);
        }
    }
    Tensor::float(a.dtype, r.into_shared())
}

fn contiguous(a: &Arr<f32>) -> std::borrow::Cow<'_, [f32]> {
    match a.as_slice() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(a.iter().copied().collect()),
    }
}

fn filter2(w: &Tensor) -> Array2<f32> {
    let s = w.shape();
    let rows = s[0] * s[1] * s[2];
    let v = contiguous(w.f()).into_owned();
    Array2::from_shape_vec((rows, s[3]), v).expect("shape")
}

fn float_out(ty: &TensorType, v: Vec<f32>) -> Tensor {
    Tensor::float(
        ty.dtype,
        Arr::from_shape_vec(dyn_shape(ty), v).expect("shape"),
    )
}

fn conv2d(x: &Tensor, w: &Tensor, c: &Conv, ty: &TensorType) -> Tensor {
    let ws = w.shape();
    let g = Geo::conv(x.shape(), &ty.shape, [ws[0], ws[1]], c);
    let mut cols = Array2::<f32>::zeros((g.pixels(), g.cols()));
    g.im2col(&contiguous(x.f()), cols.as_slice_mut().expect("contiguous"));
    let out = cols.dot(&filter2(w));
    Tensor::float(
        ty.dtype,
        out.into_shape_with_order(dyn_shape(ty))
            .expect("shape")
            .into_shared(),
    )
}

fn conv2d_backprop_input(dy: &Tensor, w: &Tensor, c: &Conv, ty: &TensorType) -> Tensor {
    let ws = w.shape();
    let g = Geo::conv(&ty.shape, dy.shape(), [ws[0], ws[1]], c);
    let o = ws[3];
    let dy2 =
        Array2::from_shape_vec((g.pixels(), o), contiguous(dy.f()).into_owned()).expect("shape");
    let dcols = dy2.dot(&filter2(w).t());
    let dcols = dcols.as_standard_layout();
    let mut dx = vec![0f32; g.input_len()];
    g.col2im(dcols.as_slice().expect("contiguous"), &mut dx);
    float_out(ty, dx)
}

fn conv2d_backprop_filter(x: &Tensor, dy: &Tensor, c: &Conv, ty: &TensorType) -> Tensor {
    let g = Geo::conv(x.shape(), dy.shape(), [ty.shape[0], ty.shape[1]], c);
    let o = ty.shape[3];
    let mut cols = Array2::<f32>::zeros((g.pixels(), g.cols()));
    g.im2col(&contiguous(x.f()), cols.as_slice_mut().expect("contiguous"));
    let dy2 =
        Array2::from_shape_vec((g.pixels(), o), contiguous(dy.f()).into_owned()).expect("shape");
    let dw = cols.t().dot(&dy2);
    Tensor::float(
        ty.dtype,
        dw.as_standard_layout()
            .into_owned()
            .into_shape_with_order(dyn_shape(ty))
            .expect("shape")
            .into_shared(),
    )
}

/// Max pooling, or (with `dy`) its gradient: each output's dy goes to the first
/// maximum of its window.
fn max_pool(x: &Tensor, dy: Option<&Tensor>, p: &Pool, ty: &TensorType) -> Tensor {
    let out_shape: Vec<usize> = match dy {
        Some(d) => d.shape().to_vec(),
        None => ty.shape.to_vec(),
    };
    let g = Geo::pool(x.shape(), &out_shape, p);
    let xs = contiguous(x.f());
    let mut out = vec![0f32; g.pixels() * g.c];
    match dy {
        None => {
            g.max_pool(&xs, &mut out, None);
            float_out(ty, out)
        }
        Some(d) => {
            let mut dx = vec![0f32; xs.len()];
            g.max_pool(&xs, &mut out, Some((&contiguous(d.f()), &mut dx)));
            float_out(ty, dx)
        }
    }
}

/// Average pooling over the window positions inside the input (padding is not counted,
/// as in TensorFlow).
fn avg_pool(x: &Tensor, p: &Pool, ty: &TensorType) -> Tensor {
    let g = Geo::pool(x.shape(), &ty.shape, p);
    let mut out = vec![0f32; g.pixels() * g.c];
    g.avg_pool(&contiguous(x.f()), &mut out);
    float_out(ty, out)
}

fn avg_pool_grad(dy: &Tensor, p: &Pool, ty: &TensorType) -> Tensor {
    let g = Geo::pool(&ty.shape, dy.shape(), p);
    let mut dx = vec![0f32; g.input_len()];
    g.avg_pool_grad(&contiguous(dy.f()), &mut dx);
    float_out(ty, dx)
}
