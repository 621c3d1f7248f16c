//! The host's native kernels: the ops that are calls rather than generated loops.
//! `matmul` goes to a packed, cache-blocked GEMM over strided views (so a transposed
//! operand costs no copy); the others are index work (`check_indices`, `argmax`,
//! `argmin`, `gather`, `scatter_add`, `concat`) written directly over the buffers.

use super::lower::{Elem, Kernel, View};
use super::mem::Mem;
use crate::ir::float;
use crate::ir::{DType, Graph, Op};

/// Runs a kernel that is not generated: a GEMM or one of the ops below.
pub fn call(k: &Kernel, g: &Graph, mem: &Mem) -> Result<(), String> {
    let n = g.node(k.node());
    match k {
        Kernel::MatMul { a, b, out, .. } => {
            matmul(a, b, out, n.ty.dtype, mem);
            Ok(())
        }
        Kernel::Native { args, out, .. } => run(&n.op, n.ty.dtype, args, out, mem),
        Kernel::Loop(_) | Kernel::Softmax { .. } => {
            Err(format!("{} is a generated kernel", n.op.name()))
        }
    }
}

/// Runs native kernel `op` (the node's type `dtype`, `shape`) over `args` into `out`.
pub fn run(op: &Op, dtype: DType, args: &[View], out: &View, mem: &Mem) -> Result<(), String> {
    match op {
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
