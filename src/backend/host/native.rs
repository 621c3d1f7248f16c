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
use crate::backend::pool::{part, Pool, MIN_SPLIT};
use crate::backend::window::Geo;
use crate::ir::float;
use crate::ir::{DType, Graph, Op};
use crate::rng::Stream;

/// Runs a kernel that is not generated: a GEMM or one of the ops below.
pub fn call(k: &Kernel, g: &Graph, mem: &Mem, env: &OpEnv, pool: &Pool) -> Result<(), String> {
    let n = g.node(k.node());
    match k {
        Kernel::MatMul { a, b, out, .. } => {
            matmul(a, b, out, n.ty.dtype, mem, pool);
            Ok(())
        }
        Kernel::Native { args, out, .. } => run(&n.op, n.ty.dtype, args, out, mem, env, pool),
        Kernel::Loop(_)
        | Kernel::Softmax { .. }
        | Kernel::Conv { .. }
        | Kernel::MaxPool { .. }
        | Kernel::Pad { .. } => Err(format!("{} is a generated kernel", n.op.name())),
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
    pool: &Pool,
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
                s.fill_uniforms(first, o, step);
            }
            round(o, dtype);
        }
        Op::Conv2d(c) => {
            let (x, w, cols) = (&args[0], &args[1], &args[2]);
            let ws = &w.shape;
            let g = Geo::conv(&x.shape, &out.shape, [ws[0], ws[1]], c);
            im2col(&g, mem, x, cols, pool);
            let (m, k, n) = (g.pixels(), g.cols(), ws[3]);
            // out[pixels, o] = cols[pixels, k] · w[k, o]
            let a = Mat::of(mem, cols, k, 1);
            gemm(
                pool,
                (m, k, n),
                a,
                Mat::of(mem, w, n, 1),
                Mat::of(mem, out, n, 1),
            );
            round(mem.f32s_mut(out), dtype);
        }
        Op::Conv2dBackpropInput(c) => {
            let (dy, w, cols) = (&args[0], &args[1], &args[2]);
            let ws = &w.shape;
            let g = Geo::conv(&out.shape, &dy.shape, [ws[0], ws[1]], c);
            let (m, k, n) = (g.pixels(), ws[3], g.cols());
            // dcols[pixels, k] = dy[pixels, o] · wᵀ[o, k]
            let b = Mat::of(mem, w, 1, k);
            gemm(
                pool,
                (m, k, n),
                Mat::of(mem, dy, k, 1),
                b,
                Mat::of(mem, cols, n, 1),
            );
            by_images(pool, &g, |sub, lo, hi| {
                let (xl, cl) = (g.image_len(), g.out_image_len(g.cols()));
                sub.col2im(
                    &mem.f32s(cols)[lo * cl..hi * cl],
                    mem.f32s_part(out, lo * xl, hi * xl),
                );
            });
            round(mem.f32s_mut(out), dtype);
        }
        Op::Conv2dBackpropFilter(c) => {
            let (x, dy, cols) = (&args[0], &args[1], &args[2]);
            let os = &out.shape;
            let g = Geo::conv(&x.shape, &dy.shape, [os[0], os[1]], c);
            im2col(&g, mem, x, cols, pool);
            let (m, k, n) = (g.cols(), g.pixels(), os[3]);
            // dw[k, o] = colsᵀ[k, pixels] · dy[pixels, o]
            let a = Mat::of(mem, cols, 1, m);
            gemm(
                pool,
                (m, k, n),
                a,
                Mat::of(mem, dy, n, 1),
                Mat::of(mem, out, n, 1),
            );
            round(mem.f32s_mut(out), dtype);
        }
        Op::MaxPool2d(p) | Op::AvgPool2d(p) => {
            let x = &args[0];
            let g = Geo::pool(&x.shape, &out.shape, p);
            let max = matches!(op, Op::MaxPool2d(_));
            by_images(pool, &g, |sub, lo, hi| {
                let (xl, ol) = (g.image_len(), g.out_image_len(g.c));
                let xs = &mem.f32s(x)[lo * xl..hi * xl];
                let o = mem.f32s_part(out, lo * ol, hi * ol);
                if max {
                    sub.max_pool(xs, o, None);
                } else {
                    sub.avg_pool(xs, o);
                }
                round(o, dtype);
            });
        }
        Op::MaxPool2dGrad(p) => {
            let (x, dy) = (&args[0], &args[1]);
            let g = Geo::pool(&x.shape, &dy.shape, p);
            by_images(pool, &g, |sub, lo, hi| {
                let (xl, ol) = (g.image_len(), g.out_image_len(g.c));
                let mut pooled = vec![0f32; (hi - lo) * ol];
                let dx = mem.f32s_part(out, lo * xl, hi * xl);
                let grad = (&mem.f32s(dy)[lo * ol..hi * ol], &mut *dx);
                sub.max_pool(&mem.f32s(x)[lo * xl..hi * xl], &mut pooled, Some(grad));
                round(dx, dtype);
            });
        }
        Op::AvgPool2dGrad(p) => {
            let dy = &args[0];
            let g = Geo::pool(&out.shape, &dy.shape, p);
            by_images(pool, &g, |sub, lo, hi| {
                let (xl, ol) = (g.image_len(), g.out_image_len(g.c));
                let dx = mem.f32s_part(out, lo * xl, hi * xl);
                sub.avg_pool_grad(&mem.f32s(dy)[lo * ol..hi * ol], dx);
                round(dx, dtype);
            });
        }
        Op::CheckIndices { depth } => {
            let row: usize = args[0].shape.iter().skip(1).product();
            for (i, k) in mem.ints(&args[0]).enumerate() {
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
            mem.put_int_iter(out, mem.ints(&args[0]));
        }
        Op::ArgMax { axis } | Op::ArgMin { axis } => {
            let max = matches!(op, Op::ArgMax { .. });
            let shape = &args[0].shape;
            let outer: usize = shape[..*axis].iter().product();
            let n = shape[*axis];
            let inner: usize = shape[axis + 1..].iter().product();
            let x = &args[0];
            let float = mem.elem(x) == Elem::F32;
            // whether element k of the reduced axis beats element `best`
            let beats = |at: usize, k: usize, best: usize| {
                let (a, b) = (at + k * inner, at + best * inner);
                if float {
                    let v = mem.f32s(x);
                    float::beats(v[a], v[b], max)
                } else {
                    let (a, b) = (mem.int(x, a), mem.int(x, b));
                    (max && a > b) || (!max && a < b)
                }
            };
            let best = (0..outer * inner).map(|j| {
                let at = (j / inner) * n * inner + j % inner;
                (1..n).fold(0, |best, k| if beats(at, k, best) { k } else { best }) as i64
            });
            mem.put_int_iter(out, best);
        }
        Op::Gather => {
            let rows = args[0].shape[0];
            let row: usize = args[0].shape[1..].iter().product();
            for k in mem.ints(&args[1]) {
                if k < 0 || k as usize >= rows {
                    return Err(format!(
                        "gather index {k} is out of range for a table of {rows} rows"
                    ));
                }
            }
            let size = mem.elem(&args[0]).size();
            let (src, dst) = (mem.bytes(&args[0]), mem.bytes_mut(out));
            for (i, k) in mem.ints(&args[1]).enumerate() {
                let s = k as usize * row * size;
                dst[i * row * size..(i + 1) * row * size].copy_from_slice(&src[s..s + row * size]);
            }
        }
        Op::ScatterAdd => {
            let rows = out.shape[0];
            let row: usize = out.shape[1..].iter().product();
            let dy = mem.f32s(&args[1]);
            let acc = mem.f32s_mut(out);
            acc.fill(0.0);
            for (i, k) in mem.ints(&args[0]).enumerate() {
                if k < 0 || k as usize >= rows {
                    return Err(format!("scatter index {k} is out of range for {rows} rows"));
                }
                let d = &mut acc[k as usize * row..(k as usize + 1) * row];
                for (o, &v) in d.iter_mut().zip(&dy[i * row..(i + 1) * row]) {
                    *o += v;
                }
            }
            round(acc, dtype);
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
            let (a, b) = (|i| mem.int(&args[0], i), |i| mem.int(&args[1], i));
            let r = out.shape.len();
            let (m, n) = (out.shape[r - 2], out.shape[r - 1]);
            let k = args[0].shape[args[0].shape.len() - 1];
            let batch: usize = out.shape[..r - 2].iter().product();
            let (sa, sb) = (m * k, k * n);
            let (ba, bb) = (args[0].len() / sa.max(1), args[1].len() / sb.max(1));
            let res = (0..batch * m * n).map(|e| {
                let (t, i, j) = (e / (m * n), e / n % m, e % n);
                let (oa, ob) = ((t % ba.max(1)) * sa, (t % bb.max(1)) * sb);
                let s = (0..k).fold(0i64, |s, p| {
                    s.wrapping_add(a(oa + i * k + p).wrapping_mul(b(ob + p * n + j)))
                });
                crate::tensor::wrap_int(dtype, s)
            });
            mem.put_int_iter(out, res);
        }
        op => return Err(format!("no native kernel for {}", op.name())),
    }
    Ok(())
}

/// `out = a · b` in f32 over the last two axes of strided views, batched over the
/// leading axes of `out` (an operand with fewer or size-1 leading axes is broadcast).
pub fn matmul(a: &View, b: &View, out: &View, dtype: DType, mem: &Mem, pool: &Pool) {
    let r = out.shape.len();
    let (m, n) = (out.shape[r - 2], out.shape[r - 1]);
    let k = a.shape[a.shape.len() - 1];
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
    // matrix t of the batch of a view (its last two axes), and of out
    let mat = |v: &View, t: usize| {
        let r = v.shape.len();
        Mat {
            // SAFETY: lowering made the view lie within its buffer.
            ptr: unsafe { (mem.ptr(v.buf) as *mut f32).offset(offset(v, t) as isize) } as usize,
            rs: v.strides[r - 2] as isize,
            cs: v.strides[r - 1] as isize,
        }
    };
    let c = |t: usize| Mat::of(mem, out, n, 1).at(t * m, 0);
    if batch == 1 {
        gemm(pool, (m, k, n), mat(a, 0), mat(b, 0), c(0));
    } else {
        // one task per matrix of the batch
        let tasks = if batch * m * k * n < MIN_SPLIT {
            1
        } else {
            batch
        };
        pool.run(tasks, &|t| {
            let ts = if tasks == 1 { 0..batch } else { t..t + 1 };
            for t in ts {
                sgemm((m, k, n), mat(a, t), mat(b, t), c(t));
            }
        });
    }
    round(mem.f32s_mut(out), dtype);
}

/// A strided f32 matrix: the address of its first element, its row and column strides.
#[derive(Clone, Copy)]
struct Mat {
    ptr: usize,
    rs: isize,
    cs: isize,
}

impl Mat {
    /// Contiguous view `v` (from its first element) with strides `rs`, `cs`.
    fn of(mem: &Mem, v: &View, rs: usize, cs: usize) -> Mat {
        Mat {
            // SAFETY: lowering made the view lie within its buffer.
            ptr: unsafe { (mem.ptr(v.buf) as *mut f32).offset(v.offset as isize) } as usize,
            rs: rs as isize,
            cs: cs as isize,
        }
    }

    /// The matrix from row `r`, column `c` on.
    fn at(self, r: usize, c: usize) -> Mat {
        Mat {
            ptr: self.ptr + 4 * (r as isize * self.rs + c as isize * self.cs) as usize,
            ..self
        }
    }
}

/// `c = a · b` for f32 matrices of `(m, k, n)`, cut into blocks of `c` by
/// `gemm_blocks` (a function of the shape alone) and the blocks dealt out to the pool's
/// threads in contiguous runs. Each block is one product with the whole sum over k, and
/// the blocks are the same at any thread count, so the result is the same bits at any
/// count: which path faer takes (a matrix-vector product for one row, nano-gemm for
/// tiny products, its packed kernels otherwise) depends on the block's shape, which the
/// threads never change.
fn gemm(pool: &Pool, (m, k, n): (usize, usize, usize), a: Mat, b: Mat, c: Mat) {
    let (rows, blocks) = gemm_blocks(m, k, n);
    let parts = pool.threads().min(blocks);
    pool.run(parts, &|i| {
        let (first, end) = part(blocks, parts, i);
        for block in first..end {
            if rows {
                let (lo, hi) = part(m, blocks, block);
                sgemm((hi - lo, k, n), a.at(lo, 0), b, c.at(lo, 0));
            } else {
                let (lo, hi) = part(n, blocks, block);
                sgemm((m, k, hi - lo), a, b.at(0, lo), c.at(0, lo));
            }
        }
    });
}

/// Columns of `c` a GEMM block holds at least when a product is cut along n: faer runs
/// blocks of 64 columns or more as fast as the whole product (128x784x256 at one thread:
/// 246 GFLOP/s in 4 blocks, 235 whole; 32 columns drop to 209).
const GEMM_BLOCK_COLS: usize = 64;
/// Blocks a product is cut into along n, at most, unless it is wider than 2048 columns
/// (then blocks of 256): each block repacks `a`, and 1024^3 in 16 blocks of 64 ran 2-3%
/// slower than whole in est (`cargo bench --bench gemm`), in 8 of 128 as fast.
const GEMM_MAX_BLOCKS: usize = 8;
/// Rows a block holds at least when a product is cut along m (too few columns to cut):
/// 8-row blocks lose 5-10% to whole products on small ones (128x256x10).
const GEMM_BLOCK_ROWS: usize = 16;

/// How a GEMM of `(m, k, n)` is cut: along m (`true`) or n, into how many blocks. One
/// block under `MIN_SPLIT` multiply-adds; otherwise blocks of at least
/// `GEMM_BLOCK_COLS` columns (`GEMM_MAX_BLOCKS` of them, more for very wide products),
/// or of `GEMM_BLOCK_ROWS` rows when the columns are too few. It never depends on the
/// thread count (see `gemm`).
fn gemm_blocks(m: usize, k: usize, n: usize) -> (bool, usize) {
    if m * k * n < MIN_SPLIT {
        (false, 1)
    } else if n >= 2 * GEMM_BLOCK_COLS {
        let most = GEMM_MAX_BLOCKS.max(n / 256);
        (false, (n / GEMM_BLOCK_COLS).min(most))
    } else {
        (true, (m / GEMM_BLOCK_ROWS).max(1))
    }
}

/// One thread's `c = a · b`: faer's GEMM (packed, cache-blocked, with AVX-512 or AVX2
/// micro-kernels chosen at run time), never threaded itself.
fn sgemm((m, k, n): (usize, usize, usize), a: Mat, b: Mat, c: Mat) {
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the three matrices lie within their buffers (lowering sized them), and c
    // is disjoint from a and b (a kernel's output and scratch buffers are its own) and
    // from every other task's block of c.
    let (a, b, c) = unsafe {
        (
            faer::MatRef::from_raw_parts(a.ptr as *const f32, m, k, a.rs, a.cs),
            faer::MatRef::from_raw_parts(b.ptr as *const f32, k, n, b.rs, b.cs),
            faer::MatMut::from_raw_parts_mut(c.ptr as *mut f32, m, n, c.rs, c.cs),
        )
    };
    faer::linalg::matmul::matmul(c, faer::Accum::Replace, a, b, 1.0f32, faer::Par::Seq);
}

/// The patches of `x` into `cols` (`g`'s patch matrix), split over images.
fn im2col(g: &Geo, mem: &Mem, x: &View, cols: &View, pool: &Pool) {
    by_images(pool, g, |sub, lo, hi| {
        let (xl, cl) = (g.image_len(), g.out_image_len(g.cols()));
        sub.im2col(
            &mem.f32s(x)[lo * xl..hi * xl],
            mem.f32s_part(cols, lo * cl, hi * cl),
        );
    });
}

/// Runs `f(geometry of images lo..hi, lo, hi)` for a split of `g`'s images over the
/// pool's threads (one part when the work is small).
fn by_images(pool: &Pool, g: &Geo, f: impl Fn(&Geo, usize, usize) + Sync) {
    let work = g.pixels() * g.kh * g.kw * g.c;
    let parts = if work < MIN_SPLIT {
        1
    } else {
        pool.threads().min(g.n).max(1)
    };
    pool.run(parts, &|i| {
        let (lo, hi) = part(g.n, parts, i);
        if lo < hi {
            f(&Geo { n: hi - lo, ..*g }, lo, hi);
        }
    });
}

fn round(v: &mut [f32], dtype: DType) {
    if matches!(dtype, DType::F16 | DType::BF16) {
        for x in v {
            *x = crate::tensor::round_float(dtype, *x);
        }
    }
}
