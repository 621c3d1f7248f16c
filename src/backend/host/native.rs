//! The host's native kernels: the ops that are calls rather than generated loops.
//! `matmul` goes to a packed, cache-blocked GEMM over strided views (so a transposed
//! operand costs no copy), and so do convolutions and their gradients (im2col into a
//! scratch buffer of the plan, then one GEMM); the others are window work (pooling),
//! random numbers (the interpreter's generator, `crate::rng`) and index work
//! (`check_indices`, `argmax`, `argmin`, `gather`, `scatter_add`, `concat`) written
//! directly over the buffers.

use super::lower::{Elem, Kernel, View};
use super::mem::Mem;
use crate::backend::interp::OpEnv;
use crate::backend::window::Geo;
use crate::ir::float;
use crate::ir::{DType, Graph, Op};
use crate::rng::Stream;

/// Runs a kernel that is not generated: a GEMM or one of the ops below.
pub fn call(k: &Kernel, g: &Graph, mem: &Mem, env: &OpEnv) -> Result<(), String> {
    let n = g.node(k.node());
    match k {
        Kernel::MatMul { a, b, out, .. } => {
            matmul(a, b, out, n.ty.dtype, mem);
            Ok(())
        }
        Kernel::Native { args, out, .. } => run(&n.op, n.ty.dtype, args, out, mem, env),
        Kernel::Loop(_) | Kernel::Softmax { .. } => {
            Err(format!("{} is a generated kernel", n.op.name()))
        }
    }
}

/// Runs native kernel `op` (the node's type `dtype`, `shape`) over `args` into `out`.
pub fn run(
    op: &Op,
    dtype: DType,
    args: &[View],
    out: &View,
    mem: &Mem,
    env: &OpEnv,
) -> Result<(), String> {
    match op {
        Op::RandomUniform { stream } | Op::RandomNormal { stream } => {
            let s = Stream::new(env.seed, *stream);
            let n = out.len();
            // shard k draws the elements one shard would draw for its part of the
            // global batch (as the interpreter does)
            let (first, step) = ((env.shard * n) as u64, env.step as u64);
            let o = mem.f32s_mut(out);
            if matches!(op, Op::RandomNormal { .. }) {
                for (i, v) in o.iter_mut().enumerate() {
                    *v = s.normal(first + i as u64, step);
                }
            } else {
                o.copy_from_slice(&s.uniforms(first, n, step));
            }
            round(o, dtype);
        }
        Op::Conv2d(c) => {
            let (x, w, cols) = (&args[0], &args[1], &args[2]);
            let ws = &w.shape;
            let g = Geo::new(
                &x.shape,
                &out.shape,
                [ws[0], ws[1]],
                c.strides,
                c.dilation,
                c.padding,
            );
            g.im2col(mem.f32s(x), mem.f32s_mut(cols));
            let (m, k, n) = (g.pixels(), g.cols(), ws[3]);
            // out[pixels, o] = cols[pixels, k] · w[k, o]
            sgemm(
                mem,
                (m, k, n),
                (cols.buf, 0, k, 1),
                (w.buf, 0, n, 1),
                (out.buf, 0, n, 1),
            );
            round(mem.f32s_mut(out), dtype);
        }
        Op::Conv2dBackpropInput(c) => {
            let (dy, w, cols) = (&args[0], &args[1], &args[2]);
            let ws = &w.shape;
            let g = Geo::new(
                &out.shape,
                &dy.shape,
                [ws[0], ws[1]],
                c.strides,
                c.dilation,
                c.padding,
            );
            let (m, k, n) = (g.pixels(), ws[3], g.cols());
            // dcols[pixels, k] = dy[pixels, o] · wᵀ[o, k]
            sgemm(
                mem,
                (m, k, n),
                (dy.buf, 0, k, 1),
                (w.buf, 0, 1, k),
                (cols.buf, 0, n, 1),
            );
            g.col2im(mem.f32s(cols), mem.f32s_mut(out));
            round(mem.f32s_mut(out), dtype);
        }
        Op::Conv2dBackpropFilter(c) => {
            let (x, dy, cols) = (&args[0], &args[1], &args[2]);
            let os = &out.shape;
            let g = Geo::new(
                &x.shape,
                &dy.shape,
                [os[0], os[1]],
                c.strides,
                c.dilation,
                c.padding,
            );
            g.im2col(mem.f32s(x), mem.f32s_mut(cols));
            let (m, k, n) = (g.cols(), g.pixels(), os[3]);
            // dw[k, o] = colsᵀ[k, pixels] · dy[pixels, o]
            sgemm(
                mem,
                (m, k, n),
                (cols.buf, 0, 1, m),
                (dy.buf, 0, n, 1),
                (out.buf, 0, n, 1),
            );
            round(mem.f32s_mut(out), dtype);
        }
        Op::MaxPool2d(p) | Op::AvgPool2d(p) => {
            let g = Geo::new(
                &args[0].shape,
                &out.shape,
                p.window,
                p.strides,
                [1, 1],
                p.padding,
            );
            let (x, o) = (mem.f32s(&args[0]), mem.f32s_mut(out));
            if matches!(op, Op::MaxPool2d(_)) {
                g.max_pool(x, o, None);
            } else {
                g.avg_pool(x, o);
            }
            round(o, dtype);
        }
        Op::MaxPool2dGrad(p) => {
            let (x, dy) = (&args[0], &args[1]);
            let g = Geo::new(&x.shape, &dy.shape, p.window, p.strides, [1, 1], p.padding);
            let mut pooled = vec![0f32; dy.len()];
            let dx = mem.f32s_mut(out);
            g.max_pool(mem.f32s(x), &mut pooled, Some((mem.f32s(dy), &mut *dx)));
            round(dx, dtype);
        }
        Op::AvgPool2dGrad(p) => {
            let dy = &args[0];
            let g = Geo::new(
                &out.shape,
                &dy.shape,
                p.window,
                p.strides,
                [1, 1],
                p.padding,
            );
            let dx = mem.f32s_mut(out);
            g.avg_pool_grad(mem.f32s(dy), dx);
            round(dx, dtype);
        }
        Op::CheckIndices { depth } => {
            let x = mem.ints(&args[0]);
            let row: usize = args[0].shape.iter().skip(1).product();
            for (i, &k) in x.iter().enumerate() {
                if k < 0 || k as u64 >= *depth as u64 {
                    let at = if args[0].shape.len() > 1 {
                        format!("batch position {} (element {i})", i / row.max(1))
                    } else {
                        format!("batch position {i}")
                    };
                    return Err(format!(
                        "label {k} at {at} is outside [0, {depth}) (the model has {depth} classes)"
                    ));
                }
            }
            mem.put_ints(out, &x);
        }
        Op::ArgMax { axis } | Op::ArgMin { axis } => {
            let max = matches!(op, Op::ArgMax { .. });
            let shape = &args[0].shape;
            let outer: usize = shape[..*axis].iter().product();
            let n = shape[*axis];
            let inner: usize = shape[axis + 1..].iter().product();
            let mut res = Vec::with_capacity(outer * inner);
            if mem.elem(&args[0]) == Elem::F32 {
                let v = mem.f32s(&args[0]);
                for o in 0..outer {
                    for i in 0..inner {
                        let mut best = 0usize;
                        for k in 1..n {
                            if float::beats(
                                v[(o * n + k) * inner + i],
                                v[(o * n + best) * inner + i],
                                max,
                            ) {
                                best = k;
                            }
                        }
                        res.push(best as i64);
                    }
                }
            } else {
                let v = mem.ints(&args[0]);
                for o in 0..outer {
                    for i in 0..inner {
                        let mut best = 0usize;
                        for k in 1..n {
                            let (a, b) =
                                (v[(o * n + k) * inner + i], v[(o * n + best) * inner + i]);
                            if (max && a > b) || (!max && a < b) {
                                best = k;
                            }
                        }
                        res.push(best as i64);
                    }
                }
            }
            mem.put_ints(out, &res);
        }
        Op::Gather => {
            let rows = args[0].shape[0];
            let row: usize = args[0].shape[1..].iter().product();
            let ids = mem.ints(&args[1]);
            for &k in &ids {
                if k < 0 || k as usize >= rows {
                    return Err(format!(
                        "gather index {k} is out of range for a table of {rows} rows"
                    ));
                }
            }
            let size = mem.elem(&args[0]).size();
            let (src, dst) = (mem.bytes(&args[0]), mem.bytes_mut(out));
            for (i, &k) in ids.iter().enumerate() {
                let s = k as usize * row * size;
                dst[i * row * size..(i + 1) * row * size].copy_from_slice(&src[s..s + row * size]);
            }
        }
        Op::ScatterAdd => {
            let rows = out.shape[0];
            let row: usize = out.shape[1..].iter().product();
            let ids = mem.ints(&args[0]);
            let dy = mem.f32s(&args[1]);
            let mut acc = vec![0f32; rows * row];
            for (i, &k) in ids.iter().enumerate() {
                if k < 0 || k as usize >= rows {
                    return Err(format!("scatter index {k} is out of range for {rows} rows"));
                }
                let d = &mut acc[k as usize * row..(k as usize + 1) * row];
                for (o, &v) in d.iter_mut().zip(&dy[i * row..(i + 1) * row]) {
                    *o += v;
                }
            }
            round(&mut acc, dtype);
            mem.put_f32s(out, &acc);
        }
        Op::Concat { axis } => {
            let outer: usize = out.shape[..*axis].iter().product();
            let inner: usize = out.shape[axis + 1..].iter().product();
            let size = mem.elem(out).size();
            let dst = mem.bytes_mut(out);
            let total = out.shape[*axis] * inner * size;
            let mut at = 0;
            for a in args {
                let w = a.shape[*axis] * inner * size;
                let src = mem.bytes(a);
                for o in 0..outer {
                    dst[o * total + at..o * total + at + w]
                        .copy_from_slice(&src[o * w..(o + 1) * w]);
                }
                at += w;
            }
        }
        Op::MatMul => {
            // integer matrix products (float ones are Kernel::MatMul)
            let (a, b) = (mem.ints(&args[0]), mem.ints(&args[1]));
            let r = out.shape.len();
            let (m, n) = (out.shape[r - 2], out.shape[r - 1]);
            let k = args[0].shape[args[0].shape.len() - 1];
            let batch: usize = out.shape[..r - 2].iter().product();
            let (sa, sb) = (m * k, k * n);
            let (ba, bb) = (args[0].len() / sa.max(1), args[1].len() / sb.max(1));
            let mut res = vec![0i64; batch * m * n];
            for t in 0..batch {
                let (oa, ob) = ((t % ba.max(1)) * sa, (t % bb.max(1)) * sb);
                for i in 0..m {
                    for j in 0..n {
                        let mut s = 0i64;
                        for p in 0..k {
                            s = s.wrapping_add(a[oa + i * k + p].wrapping_mul(b[ob + p * n + j]));
                        }
                        res[(t * m + i) * n + j] = crate::tensor::wrap_int(dtype, s);
                    }
                }
            }
            mem.put_ints(out, &res);
        }
        op => return Err(format!("no native kernel for {}", op.name())),
    }
    Ok(())
}

/// `out = a · b` in f32 over the last two axes of strided views, batched over the
/// leading axes of `out` (an operand with fewer or size-1 leading axes is broadcast).
pub fn matmul(a: &View, b: &View, out: &View, dtype: DType, mem: &Mem) {
    let r = out.shape.len();
    let (m, n) = (out.shape[r - 2], out.shape[r - 1]);
    let ra = a.shape.len();
    let k = a.shape[ra - 1];
    let rb = b.shape.len();
    let batch_shape = &out.shape[..r - 2];
    let batch: usize = batch_shape.iter().product();
    let offset = |v: &View, t: usize| -> i64 {
        let lead = v.shape.len() - 2;
        let mut rem = t;
        let mut off = v.offset;
        for (d, &size) in batch_shape.iter().enumerate().rev() {
            let i = rem % size;
            rem /= size;
            let vd = d as isize - (batch_shape.len() as isize - lead as isize);
            if vd >= 0 && v.shape[vd as usize] != 1 {
                off += i as i64 * v.strides[vd as usize];
            }
        }
        off
    };
    let (pa, pb, pc) = (
        mem.ptr(a.buf) as *const f32,
        mem.ptr(b.buf) as *const f32,
        mem.ptr(out.buf) as *mut f32,
    );
    for t in 0..batch {
        // SAFETY: the views lie within their buffers (lowering made them), and out is a
        // buffer of its own, disjoint from a and b.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                pa.offset(offset(a, t) as isize),
                a.strides[ra - 2] as isize,
                a.strides[ra - 1] as isize,
                pb.offset(offset(b, t) as isize),
                b.strides[rb - 2] as isize,
                b.strides[rb - 1] as isize,
                0.0,
                pc.add(t * m * n),
                n as isize,
                1,
            );
        }
    }
    if matches!(dtype, DType::F16 | DType::BF16) {
        let c = mem.f32s_mut(out);
        round(c, dtype);
    }
}

fn round(v: &mut [f32], dtype: DType) {
    if matches!(dtype, DType::F16 | DType::BF16) {
        for x in v {
            *x = crate::tensor::round_float(dtype, *x);
        }
    }
}

/// A matrix operand of `sgemm`: its buffer, the offset of its first element, and its
/// row and column strides (in elements).
type Operand = (usize, usize, usize, usize);

/// `c = a · b` for f32 matrices of `(m, k, n)` in the buffers of `mem`.
fn sgemm(mem: &Mem, (m, k, n): (usize, usize, usize), a: Operand, b: Operand, c: Operand) {
    let at = |(buf, off, ..): Operand| {
        // SAFETY: lowering sized the buffer to hold the matrix at this offset.
        unsafe { (mem.ptr(buf) as *mut f32).add(off) }
    };
    // SAFETY: the three matrices lie within their buffers, and c is disjoint from a and b
    // (a kernel's output and scratch buffers are its own).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            at(a),
            a.2 as isize,
            a.3 as isize,
            at(b),
            b.2 as isize,
            b.3 as isize,
            0.0,
            at(c),
            c.2 as isize,
            c.3 as isize,
        );
    }
}
