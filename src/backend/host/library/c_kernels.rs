//! The library's versions of the kernels the device runs natively over its buffers
//! (`native.rs`): index work (`gather`, `concat`, `check_indices`, integer `argmax` and
//! `argmin`), integer matrix products, average pooling, max pooling of half-precision
//! values and the convolutions whose shapes have no generated direct kernel. They are
//! C functions of the library's own source, with every shape a constant, and the same
//! signature as the generated kernels: `(table of buffer addresses, start, end)`,
//! returning 0, or 2 for an index out of range.
//!
//! They sum in the interpreter's order where it is cheap to (pooling: taps in window
//! order); the fallback convolution sums over taps and channels in one pass, where the
//! interpreter's GEMM blocks the sum, so it agrees within rounding.

use super::super::codegen::KernelFn;
use super::super::lower::{Bufs, Elem, View};
use super::c_type;
use crate::backend::window::Geo;
use crate::ir::{DType, Op};
use std::fmt::Write as _;

/// What a predict graph returns when an index (a gather's, or a label's) is out of range.
pub const INDEX_OUT_OF_RANGE: i32 = 2;

/// C function `name` computing native op `op` (of dtype `dtype`) over `args` into
/// `out`, and its table of buffers; `Err` says why the op has no C version.
pub fn c_kernel(
    name: &str,
    op: &Op,
    dtype: DType,
    args: &[View],
    out: &View,
    bufs: &Bufs,
) -> Result<(String, KernelFn), String> {
    let elem = |v: &View| bufs.bufs[v.buf].elem;
    let half = matches!(dtype, DType::F16 | DType::BF16);
    let rounded = |what: &str| {
        if half {
            Err(format!(
                "{what} in {dtype} has no kernel in a standalone library yet (it rounds every \
                 result to {dtype}); compute it in f32"
            ))
        } else {
            Ok(())
        }
    };
    let body = match op {
        Op::Concat { axis } => concat(*axis, args, out, elem(out).size()),
        Op::Gather => gather(args, elem(&args[0]).size()),
        Op::CheckIndices { depth } => format!(
            "  for (size_t i = 0; i < {n}; i++) {{\n    int64_t k = (int64_t)a0[i];\n    \
             if (k < 0 || k >= {depth}) return {INDEX_OUT_OF_RANGE};\n    o[i] = k;\n  }}\n",
            n = out.len()
        ),
        Op::ArgMax { axis } | Op::ArgMin { axis } if elem(&args[0]) != Elem::F32 => {
            arg(*axis, &args[0], matches!(op, Op::ArgMax { .. }))
        }
        Op::MatMul if elem(out) != Elem::F32 => int_matmul(args, out, dtype),
        Op::AvgPool2d(p) => {
            rounded("average pooling")?;
            pool(&Geo::pool(&args[0].shape, &out.shape, p), false)
        }
        // the max of values already rounded to a half type is one of them
        Op::MaxPool2d(p) => pool(&Geo::pool(&args[0].shape, &out.shape, p), true),
        Op::Conv2d(c) => {
            rounded("a convolution")?;
            let ws = &args[1].shape;
            conv(
                &Geo::conv(&args[0].shape, &out.shape, [ws[0], ws[1]], c),
                ws[3],
            )
        }
        Op::RandomUniform { .. } | Op::RandomNormal { .. } => {
            return Err(format!(
                "`{}` has no kernel in a standalone library: a predict graph that draws \
                 random numbers is not served by it",
                op.name()
            ))
        }
        op => {
            return Err(format!(
                "`{}` has no kernel in a standalone library yet",
                op.name()
            ))
        }
    };
    let mut s = format!("static int64_t {name}(void *const *t, int64_t lo, int64_t hi) {{\n");
    for (i, a) in args.iter().enumerate() {
        let ty = c_type(elem(a));
        let _ = writeln!(s, "  const {ty} *a{i} = (const {ty} *)t[{i}];");
    }
    let ty = c_type(elem(out));
    let _ = writeln!(s, "  {ty} *o = ({ty} *)t[{}];", args.len());
    s.push_str("  (void)lo;\n  (void)hi;\n");
    for i in 0..args.len() {
        let _ = writeln!(s, "  (void)a{i};");
    }
    s.push_str(&body);
    s.push_str("  return 0;\n}\n\n");
    let f = KernelFn {
        name: name.to_string(),
        bufs: args.iter().chain([out]).map(|v| v.buf).collect(),
    };
    Ok((s, f))
}

/// `out` is the operands side by side along `axis`: for each index of the axes before
/// it, a run of bytes from each operand in turn.
fn concat(axis: usize, args: &[View], out: &View, size: usize) -> String {
    let outer: usize = out.shape[..axis].iter().product();
    let inner: usize = out.shape[axis + 1..].iter().product();
    let total = out.shape[axis] * inner * size;
    let mut s = format!("  for (size_t i = 0; i < {outer}; i++) {{\n");
    let mut at = 0;
    for (k, a) in args.iter().enumerate() {
        let w = a.shape[axis] * inner * size;
        if w > 0 {
            let _ = writeln!(
                s,
                "    memcpy((unsigned char *)o + i * {total} + {at}, \
                 (const unsigned char *)a{k} + i * {w}, {w});"
            );
        }
        at += w;
    }
    s.push_str("  }\n");
    s
}

/// Row `ids[i]` of table `a0` for each id `i` of `a1`.
fn gather(args: &[View], size: usize) -> String {
    let rows = args[0].shape[0];
    let row: usize = args[0].shape[1..].iter().product::<usize>() * size;
    format!(
        "  for (size_t i = 0; i < {n}; i++) {{\n    int64_t k = (int64_t)a1[i];\n    \
         if (k < 0 || k >= {rows}) return {INDEX_OUT_OF_RANGE};\n    \
         memcpy((unsigned char *)o + i * {row}, (const unsigned char *)a0 + k * {row}, {row});\n  }}\n",
        n = args[1].len()
    )
}

/// The first index of the largest (smallest) integer along `axis`.
fn arg(axis: usize, x: &View, max: bool) -> String {
    let outer: usize = x.shape[..axis].iter().product();
    let n = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    let cmp = if max { '>' } else { '<' };
    format!(
        "  for (size_t j = 0; j < {len}; j++) {{\n    \
         size_t at = (j / {inner}) * {n} * {inner} + j % {inner}, best = 0;\n    \
         for (size_t k = 1; k < {n}; k++)\n      \
         if (a0[at + k * {inner}] {cmp} a0[at + best * {inner}]) best = k;\n    \
         o[j] = best;\n  }}\n",
        len = outer * inner
    )
}

/// An integer matrix product over the last two axes, batched (and broadcast) over the
/// leading ones, with sums wrapping as the interpreter's do.
fn int_matmul(args: &[View], out: &View, dtype: DType) -> String {
    let r = out.shape.len();
    let (m, n) = (out.shape[r - 2], out.shape[r - 1]);
    let k = args[0].shape[args[0].shape.len() - 1];
    let batch: usize = out.shape[..r - 2].iter().product();
    let (sa, sb) = (m * k, k * n);
    let (ba, bb) = (
        (args[0].len() / sa.max(1)).max(1),
        (args[1].len() / sb.max(1)).max(1),
    );
    let wrap = match dtype {
        DType::I32 => "(int32_t)(int64_t)",
        DType::U8 => "(uint8_t)",
        _ => "(int64_t)",
    };
    format!(
        "  for (size_t e = 0; e < {len}; e++) {{\n    \
         size_t b = e / {mn}, i = e / {n} % {m}, j = e % {n};\n    \
         size_t oa = (b % {ba}) * {sa}, ob = (b % {bb}) * {sb};\n    uint64_t s = 0;\n    \
         for (size_t p = 0; p < {k}; p++)\n      \
         s += (uint64_t)(int64_t)a0[oa + i * {k} + p] * (uint64_t)(int64_t)a1[ob + p * {n} + j];\n    \
         o[e] = {wrap}s;\n  }}\n",
        len = batch * m * n,
        mn = m * n
    )
}

/// The loops over the output pixels of window op `g` and over the taps of each window
/// that fall inside the input (`i`, `j`: the input row and column); `init`, `tap` and
/// `done` are the statements at a pixel's start, at each tap (`xs`: the tap's input
/// pixel, `y`: the output pixel, `taps`: taps so far) and at its end.
fn windows(g: &Geo, out_c: usize, init: &str, tap: &str, done: &str) -> String {
    let Geo {
        n,
        h,
        w,
        c,
        oh,
        ow,
        kh,
        kw,
        sh,
        sw,
        dh,
        dw,
        pt,
        pl,
    } = *g;
    format!(
        "  for (size_t b = 0; b < {n}; b++)\n  for (size_t oi = 0; oi < {oh}; oi++)\n  \
         for (size_t oj = 0; oj < {ow}; oj++) {{\n    \
         float *y = o + ((b * {oh} + oi) * {ow} + oj) * {out_c};\n    size_t taps = 0;\n\
         {init}    for (size_t ki = 0; ki < {kh}; ki++) {{\n      \
         int64_t i = (int64_t)(oi * {sh} + ki * {dh}) - {pt};\n      \
         if (i < 0 || i >= {h}) continue;\n      \
         for (size_t kj = 0; kj < {kw}; kj++) {{\n        \
         int64_t j = (int64_t)(oj * {sw} + kj * {dw}) - {pl};\n        \
         const float *xs;\n        if (j < 0 || j >= {w}) continue;\n        \
         xs = a0 + ((b * {h} + (size_t)i) * {w} + (size_t)j) * {c};\n{tap}        \
         taps++;\n      }}\n    }}\n{done}  }}\n"
    )
}

/// Max or average pooling (of f32 values; the average over the taps inside the input,
/// as TensorFlow's `same` padding counts them).
fn pool(g: &Geo, max: bool) -> String {
    let c = g.c;
    if max {
        // the first tap, then any tap that beats it (NaN beats every number)
        windows(
            g,
            c,
            "",
            &format!(
                "        for (size_t ch = 0; ch < {c}; ch++)\n          \
                 if (taps == 0 || xs[ch] > y[ch] || (xs[ch] != xs[ch] && y[ch] == y[ch])) \
                 y[ch] = xs[ch];\n"
            ),
            "",
        )
    } else {
        windows(
            g,
            c,
            &format!("    for (size_t ch = 0; ch < {c}; ch++) y[ch] = 0.0f;\n"),
            &format!("        for (size_t ch = 0; ch < {c}; ch++) y[ch] += xs[ch];\n"),
            &format!(
                "    {{\n      float inv = 1.0f / (float)(taps ? taps : 1);\n      \
                 for (size_t ch = 0; ch < {c}; ch++) y[ch] *= inv;\n    }}\n"
            ),
        )
    }
}

/// A direct convolution of `a0` (NHWC) with filter `a1` ([kh, kw, c, o]).
fn conv(g: &Geo, o: usize) -> String {
    let (c, kw) = (g.c, g.kw);
    windows(
        g,
        o,
        &format!("    for (size_t q = 0; q < {o}; q++) y[q] = 0.0f;\n"),
        &format!(
            "        {{\n          const float *ws = a1 + (ki * {kw} + kj) * {c} * {o};\n          \
             for (size_t ch = 0; ch < {c}; ch++)\n            \
             for (size_t q = 0; q < {o}; q++) y[q] += xs[ch] * ws[ch * {o} + q];\n        }}\n"
        ),
        "",
    )
}
