//! Generated versions of the kernels a device runs natively (GEMM, arg-reductions),
//! for code that must stand alone: the shared library of `estc build --lib`, which
//! cannot call into estc. They are plain loops that LLVM vectorises, not tuned ones.

use super::{e, Codegen, KernelFn, Val, R};
use crate::backend::host::lower::{Bufs, Kernel, View};
use crate::ir::{DType, Graph, Op};
use rustc_hash::FxHashMap;

impl<'c> Codegen<'c> {
    /// Emits `kernel` as function `name` with no call out of the module, with the
    /// extent of its outer loop; `None` for a native kernel with no generated version.
    pub fn portable(
        &mut self,
        name: &str,
        kernel: &Kernel,
        g: &Graph,
        bufs: &Bufs,
    ) -> R<Option<(KernelFn, usize)>> {
        // the generated GEMM and arg-reduction loop over their output's first axis
        let rows = |out: &View| out.shape.first().copied().unwrap_or(1);
        Ok(match kernel {
            Kernel::MatMul { a, b, out, .. } => {
                Some((self.matmul_kernel(name, [a, b, out], g, bufs)?, rows(out)))
            }
            Kernel::Native { node, args, out } => match &g.node(*node).op {
                Op::ArgMax { axis } | Op::ArgMin { axis }
                    if g.node(g.operands(*node)[0]).ty.dtype.is_float() =>
                {
                    let max = matches!(g.node(*node).op, Op::ArgMax { .. });
                    let f = self.arg_kernel(name, [&args[0], out], *axis, max, g, bufs)?;
                    Some((f, rows(out)))
                }
                _ => None,
            },
            k => self.kernel(name, k, g, bufs)?.map(|f| (f, k.outer(g))),
        })
    }

    /// `out = a · b` over the last two axes, batched over the leading ones; split over
    /// the rows of `out` (its axes but the last).
    fn matmul_kernel(
        &mut self,
        name: &str,
        [a, b, out]: [&View; 3],
        g: &Graph,
        bufs: &Bufs,
    ) -> R<KernelFn> {
        let (body, ids) = self.body(name, g, bufs, &[a, b, out], FxHashMap::default())?;
        let (start, end) = self.start_end(&body, ids.len());
        let rank = out.shape.len();
        let (k_len, n_len) = (a.shape[rank - 1], out.shape[rank - 1]);
        let zero = self.i64c(0);
        let f = body.f;
        self.nest(&body, &out.shape[..rank - 1], start, end, &mut |cg, idx| {
            let at = |cg: &Self, v: &View, tail: &[inkwell::values::IntValue<'c>]| {
                let lead = if v.shape.len() == rank {
                    &idx[..rank - 2]
                } else {
                    &[][..]
                };
                let full: Vec<_> = lead.iter().chain(tail).copied().collect();
                cg.addr(&body, v, &full)
            };
            let row = |j| -> Vec<_> { idx.iter().copied().chain([j]).collect() };
            let (kn, nn) = (cg.i64c(k_len as i64), cg.i64c(n_len as i64));
            cg.counted(f, zero, nn, &mut |cg, j| {
                cg.store(&body, out, &row(j), Val::F(cg.f32c(0.0)))
            })?;
            cg.counted(f, zero, kn, &mut |cg, k| {
                let p = at(cg, a, &[idx[rank - 2], k])?;
                let aik = e(cg.b.build_load(cg.ctx.f32_type(), p, "a"))?.into_float_value();
                cg.counted(f, zero, nn, &mut |cg, j| {
                    let p = at(cg, b, &[k, j])?;
                    let bkj = e(cg.b.build_load(cg.ctx.f32_type(), p, "b"))?.into_float_value();
                    let o = cg.addr(&body, out, &row(j))?;
                    let acc = e(cg.b.build_load(cg.ctx.f32_type(), o, "o"))?.into_float_value();
                    let m = e(cg.b.build_float_mul(aik, bkj, "m"))?;
                    let s = e(cg.b.build_float_add(acc, m, "s"))?;
                    e(cg.b.build_store(o, s))?;
                    Ok(())
                })
            })
        })?;
        self.finish(&body, name, ids)
    }

    /// The position of the first maximum (`max`) or minimum of `x` along `axis` into
    /// `out` (a NaN is the extremum once met), as the interpreter finds it.
    fn arg_kernel(
        &mut self,
        name: &str,
        [x, out]: [&View; 2],
        axis: usize,
        max: bool,
        g: &Graph,
        bufs: &Bufs,
    ) -> R<KernelFn> {
        let (body, ids) = self.body(name, g, bufs, &[x, out], FxHashMap::default())?;
        let (start, end) = self.start_end(&body, ids.len());
        let f = body.f;
        let i64t = self.ctx.i64_type();
        let best = e(self.b.build_alloca(self.ctx.f32_type(), "best"))?;
        let arg = e(self.b.build_alloca(i64t, "arg"))?;
        let dims = if out.shape.is_empty() {
            vec![1]
        } else {
            out.shape.clone()
        };
        let scalar = out.shape.is_empty();
        let n = x.shape[axis];
        self.nest(&body, &dims, start, end, &mut |cg, idx| {
            let idx = if scalar { &idx[..0] } else { idx };
            let xi = |k| -> Vec<_> {
                let mut v = idx.to_vec();
                v.insert(axis, k);
                v
            };
            let first = cg.load(&body, x, &xi(cg.i64c(0)), DType::F32)?.f();
            e(cg.b.build_store(best, first))?;
            e(cg.b.build_store(arg, i64t.const_zero()))?;
            cg.counted(f, cg.i64c(1), cg.i64c(n as i64), &mut |cg, k| {
                let v = cg.load(&body, x, &xi(k), DType::F32)?.f();
                let b = e(cg.b.build_load(cg.ctx.f32_type(), best, "b"))?.into_float_value();
                let take = cg.beats(v, b, max)?;
                let nb = e(cg.b.build_select(take, v, b, "nb"))?;
                e(cg.b.build_store(best, nb))?;
                let a = e(cg.b.build_load(i64t, arg, "a"))?.into_int_value();
                let na = e(cg.b.build_select(take, k, a, "na"))?;
                e(cg.b.build_store(arg, na))?;
                Ok(())
            })?;
            let a = e(cg.b.build_load(i64t, arg, "a"))?.into_int_value();
            cg.store(&body, out, idx, Val::I(a))
        })?;
        self.finish(&body, name, ids)
    }
}
