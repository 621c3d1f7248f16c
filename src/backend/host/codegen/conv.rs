//! Direct NHWC convolutions (`lower::Direct`) and the zero-padded copies they read.
//!
//! The forward kernel (also the input gradient) computes a register block of output
//! pixels of one row by one or two vectors of output channels: for every tap and input
//! channel it loads the filter's vectors once and, for each pixel, broadcasts one input
//! value into a fused multiply-add per vector. The filter gradient keeps a block of
//! filter taps (kernel column and input channel) by output-channel vectors in
//! registers and streams the output pixels of one image at a time through them,
//! accumulating into the output (which stays in cache); each image serves all of a
//! thread's blocks before the next is read. Both skip the kernel rows
//! that fall in the padding, and every output element is summed whole by one task in a
//! fixed order, so splitting over threads changes no result.

use super::{e, Codegen, KernelFn, R};
use crate::backend::host::lower::{Bufs, Direct, View, LANES};
use crate::ir::Graph;
use inkwell::types::VectorType;
use inkwell::values::{BasicValue, FunctionValue, IntValue, PointerValue, VectorValue};
use inkwell::IntPredicate;
use rustc_hash::FxHashMap;

/// Accumulators of a register block: 28 of AVX-512's 32 vector registers, the rest
/// holding the operands.
const ACC: usize = 28;

/// The pointers and geometry of a convolution kernel being built.
struct Conv<'c> {
    f: FunctionValue<'c>,
    x: PointerValue<'c>,
    k: PointerValue<'c>,
    out: PointerValue<'c>,
    d: Direct,
    /// One stack slot per accumulator (promoted to registers by LLVM).
    accs: Vec<PointerValue<'c>>,
}

/// The fewest input channels at which a border block leaves out its padding taps.
const MIN_SKIP_CHANNELS: usize = 8;

/// Where a block of output pixels starts: in a loop over the blocks whose every tap
/// reads input, or at a border, known when generating.
#[derive(Clone, Copy)]
enum Cols<'c> {
    Inner(IntValue<'c>),
    Border(usize),
}

pub(super) type Build<'a, 'c> = &'a mut dyn FnMut(&mut Codegen<'c>) -> R<()>;

impl<'c> Codegen<'c> {
    /// The direct convolution (or, when `filter`, filter gradient) `d` reading `x` and
    /// `k` into `out`, split over images (over kernel rows and channel blocks for the
    /// filter gradient).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn conv_kernel(
        &mut self,
        name: &str,
        filter: bool,
        [x, k, out]: [&View; 3],
        d: &Direct,
        g: &Graph,
        bufs: &Bufs,
    ) -> R<KernelFn> {
        let (body, ids) = self.body(name, g, bufs, &[x, k, out], FxHashMap::default())?;
        let (start, end) = self.start_end(&body, ids.len());
        let accs = (0..ACC)
            .map(|_| e(self.b.build_alloca(self.vec_t(), "acc")))
            .collect::<R<Vec<_>>>()?;
        let c = Conv {
            f: body.f,
            x: body.ptrs[&x.buf],
            k: body.ptrs[&k.buf],
            out: body.ptrs[&out.buf],
            d: *d,
            accs,
        };
        if filter {
            self.filter_grad(&c, start, end)?;
        } else {
            self.forward(&c, start, end)?;
        }
        self.finish(&body, name, ids)
    }

    /// Copies NHWC `x` into `out` (larger), `top` rows and `left` columns in, with zeros
    /// around it; split over images.
    pub(super) fn pad_kernel(
        &mut self,
        name: &str,
        [x, out]: [&View; 2],
        [top, left]: [usize; 2],
        g: &Graph,
        bufs: &Bufs,
    ) -> R<KernelFn> {
        let (body, ids) = self.body(name, g, bufs, &[x, out], FxHashMap::default())?;
        let (start, end) = self.start_end(&body, ids.len());
        let (f, xp, op) = (body.f, body.ptrs[&x.buf], body.ptrs[&out.buf]);
        let [_, h, w, ch] = x.shape[..] else {
            return Err("padding a value that is not NHWC".into());
        };
        let (ih, iw) = (out.shape[1], out.shape[2]);
        let zero = self.i64c(0);
        self.counted(f, start, end, &mut |cg, n| {
            cg.counted(f, zero, cg.i64c(ih as i64), &mut |cg, y| {
                cg.counted(f, zero, cg.i64c(iw as i64), &mut |cg, xq| {
                    let o = cg.mad(cg.mad(cg.mad(n, ih, y)?, iw, xq)?, ch, zero)?;
                    let sy = e(cg.b.build_int_sub(y, cg.i64c(top as i64), "sy"))?;
                    let sx = e(cg.b.build_int_sub(xq, cg.i64c(left as i64), "sx"))?;
                    let inside = cg.below(sy, h)?;
                    let inside = e(cg.b.build_and(inside, cg.below(sx, w)?, "in"))?;
                    let chans = cg.i64c(ch as i64);
                    let mut zeros = |cg: &mut Codegen<'c>| {
                        cg.counted(f, zero, chans, &mut |cg, c| {
                            let zero = cg.f32c(0.0);
                            e(cg.b.build_store(cg.f32_at(op, cg.add(o, c)?)?, zero))?;
                            Ok(())
                        })
                    };
                    cg.branch(
                        f,
                        inside,
                        &mut |cg| {
                            let i = cg.mad(cg.mad(cg.mad(n, h, sy)?, w, sx)?, ch, zero)?;
                            cg.counted(f, zero, chans, &mut |cg, c| {
                                let v = e(cg.b.build_load(
                                    cg.ctx.f32_type(),
                                    cg.f32_at(xp, cg.add(i, c)?)?,
                                    "x",
                                ))?;
                                e(cg.b.build_store(cg.f32_at(op, cg.add(o, c)?)?, v))?;
                                Ok(())
                            })
                        },
                        Some(&mut zeros),
                    )
                })
            })
        })?;
        self.finish(&body, name, ids)
    }

    /// Images `[start, end)`: each output row in blocks of pixels by channel blocks.
    /// The blocks whose every tap reads input run in a loop; the ones at the borders
    /// are emitted one by one, each leaving out the taps that fall in the padding.
    fn forward(&mut self, c: &Conv<'c>, start: IntValue<'c>, end: IntValue<'c>) -> R<()> {
        let d = c.d;
        let px = (ACC / d.block()).min(d.g.ow);
        let (lo, hi) = d.cols();
        let blocks: Vec<(usize, usize)> = (0..d.g.ow)
            .step_by(px)
            .map(|ox| (ox, px.min(d.g.ow - ox)))
            .collect();
        let inner = |&(ox, p): &(usize, usize)| {
            p == px && ox * d.g.sw >= lo && (ox + p - 1) * d.g.sw + (d.g.kw - 1) * d.g.dw < hi
        };
        let first = blocks.iter().position(inner).unwrap_or(blocks.len());
        let run = blocks[first..].iter().take_while(|b| inner(b)).count();
        let zero = self.i64c(0);
        self.counted(c.f, start, end, &mut |cg, n| {
            cg.counted(c.f, zero, cg.i64c(d.g.oh as i64), &mut |cg, oy| {
                cg.counted(c.f, zero, cg.i64c(d.blocks() as i64), &mut |cg, b| {
                    for (i, &(ox, p)) in blocks.iter().enumerate() {
                        if i == first {
                            let (from, to) = (cg.i64c(first as i64), cg.i64c((first + run) as i64));
                            cg.counted(c.f, from, to, &mut |cg, bx| {
                                let ox = cg.mad(bx, px, zero)?;
                                cg.forward_block(c, [n, oy, b], Cols::Inner(ox), px)
                            })?;
                        } else if !(first..first + run).contains(&i) {
                            cg.forward_block(c, [n, oy, b], Cols::Border(ox), p)?;
                        }
                    }
                    Ok(())
                })
            })
        })
    }

    /// Output pixels `[ox, ox + px)` of row `oy` of image `n`, channel block `b`.
    fn forward_block(
        &mut self,
        c: &Conv<'c>,
        [n, oy, b]: [IntValue<'c>; 3],
        ox: Cols<'c>,
        px: usize,
    ) -> R<()> {
        let d = c.d;
        let ob = d.block();
        self.clear(&c.accs[..px * ob])?;
        let zero = self.i64c(0);
        let (lo, hi) = d.cols();
        // one kernel column's taps: for each input channel, the filter's vectors once
        // and, for each pixel `ps` lists, a broadcast input into a multiply-add
        let column = |cg: &mut Self,
                      ky: IntValue<'c>,
                      iy: IntValue<'c>,
                      kx: IntValue<'c>,
                      ox: IntValue<'c>,
                      ps: &[usize]| {
            cg.counted(c.f, zero, cg.i64c(d.g.c as i64), &mut |cg, ch| {
                // k[ky, kx, ch, b·ob·LANES ..]
                let tap = cg.mad(cg.mad(ky, d.g.kw, kx)?, d.g.c, ch)?;
                let wk = cg.mad(tap, d.o, cg.mad(b, ob * LANES, zero)?)?;
                let ws = (0..ob)
                    .map(|j| cg.vload(c.k, cg.add(wk, cg.i64c((j * LANES) as i64))?))
                    .collect::<R<Vec<_>>>()?;
                // x[n, iy, ox·sw + kx·dw, ch]
                let col = cg.mad(ox, d.g.sw, cg.mad(kx, d.g.dw, zero)?)?;
                let at = cg.mad(cg.mad(cg.mad(n, d.ih(), iy)?, d.iw(), col)?, d.g.c, ch)?;
                for &p in ps {
                    let s = cg.broadcast(c.x, cg.add(at, cg.i64c((p * d.g.sw * d.g.c) as i64))?)?;
                    for (j, w) in ws.iter().enumerate() {
                        cg.accumulate(c.accs[p * ob + j], s, *w)?;
                    }
                }
                Ok(())
            })
        };
        let all: Vec<usize> = (0..px).collect();
        self.counted(c.f, zero, self.i64c(d.g.kh as i64), &mut |cg, ky| {
            let iy = cg.mad(oy, d.g.sh, cg.mad(ky, d.g.dh, zero)?)?;
            let every = |cg: &mut Self, ox| {
                cg.counted(c.f, zero, cg.i64c(d.g.kw as i64), &mut |cg, kx| {
                    column(cg, ky, iy, kx, ox, &all)
                })
            };
            cg.real_row(c, iy, &mut |cg| match ox {
                Cols::Inner(ox) => every(cg, ox),
                // with few channels the unrolled columns are straight-line code that
                // LLVM schedules into spills: every tap, padding included, is cheaper
                Cols::Border(x0) if d.g.c < MIN_SKIP_CHANNELS => every(cg, cg.i64c(x0 as i64)),
                Cols::Border(x0) => {
                    for kx in 0..d.g.kw {
                        let ps: Vec<usize> = (0..px)
                            .filter(|p| (lo..hi).contains(&((x0 + p) * d.g.sw + kx * d.g.dw)))
                            .collect();
                        if !ps.is_empty() {
                            let (k, o) = (cg.i64c(kx as i64), cg.i64c(x0 as i64));
                            column(cg, ky, iy, k, o, &ps)?;
                        }
                    }
                    Ok(())
                }
            })
        })?;
        let ox = match ox {
            Cols::Inner(ox) => ox,
            Cols::Border(x0) => self.i64c(x0 as i64),
        };
        // out[n, oy, ox + p, b·ob·LANES + j·LANES ..]
        let row = self.mad(self.mad(n, d.g.oh, oy)?, d.g.ow, ox)?;
        let base = self.mad(b, ob * LANES, zero)?;
        for p in 0..px {
            let at = self.mad(self.add(row, self.i64c(p as i64))?, d.o, base)?;
            for j in 0..ob {
                let v = self.acc(c.accs[p * ob + j])?;
                self.vstore(c.out, self.add(at, self.i64c((j * LANES) as i64))?, v)?;
            }
        }
        Ok(())
    }

    /// Tasks `[start, end)` of (kernel row, channel block): every column tap in blocks,
    /// each summed over all output pixels.
    fn filter_grad(&mut self, c: &Conv<'c>, start: IntValue<'c>, end: IntValue<'c>) -> R<()> {
        let d = c.d;
        let taps = d.g.kw * d.g.c;
        let cb = (ACC / d.block()).min(taps);
        let (full, rest) = (taps / cb, taps % cb);
        let zero = self.i64c(0);
        // task t is kernel row t / blocks, channel block t % blocks
        let task = |cg: &mut Self, t: IntValue<'c>| -> R<[IntValue<'c>; 2]> {
            let blocks = cg.i64c(d.blocks() as i64);
            let ky = e(cg.b.build_int_unsigned_div(t, blocks, "ky"))?;
            let b = e(cg.b.build_int_unsigned_rem(t, blocks, "b"))?;
            Ok([ky, b])
        };
        // out[ky, .., b·ob·LANES ..] starts at zero
        self.counted(c.f, start, end, &mut |cg, t| {
            let [ky, b] = task(cg, t)?;
            let base = cg.mad(b, d.block() * LANES, zero)?;
            cg.counted(c.f, zero, cg.i64c(taps as i64), &mut |cg, q| {
                let at = cg.mad(cg.mad(ky, taps, q)?, d.o, base)?;
                for j in 0..d.block() {
                    let v = cg.vec_t().const_zero();
                    cg.vstore(c.out, cg.add(at, cg.i64c((j * LANES) as i64))?, v)?;
                }
                Ok(())
            })
        })?;
        // image by image, every task of the range: the image's input and gradient are
        // read from memory once and stay in cache for all of them (task by task, the
        // whole batch would stream through the cache once per task)
        self.counted(c.f, zero, self.i64c(d.g.n as i64), &mut |cg, n| {
            cg.counted(c.f, start, end, &mut |cg, t| {
                let [ky, b] = task(cg, t)?;
                cg.counted(c.f, zero, cg.i64c(full as i64), &mut |cg, q| {
                    let q = cg.mad(q, cb, zero)?;
                    cg.filter_block(c, [n, ky, b, q], cb)
                })?;
                if rest > 0 {
                    cg.filter_block(c, [n, ky, b, cg.i64c((full * cb) as i64)], rest)?;
                }
                Ok(())
            })
        })
    }

    /// Adds image `n`'s products to filter taps `[q, q + cb)` (over kernel column,
    /// then input channel) of kernel row `ky`, channel block `b`.
    fn filter_block(&mut self, c: &Conv<'c>, [n, ky, b, q]: [IntValue<'c>; 4], cb: usize) -> R<()> {
        let d = c.d;
        let ob = d.block();
        let zero = self.i64c(0);
        let base = self.mad(b, ob * LANES, zero)?;
        // out[ky, q + i, b·ob·LANES + j·LANES ..]
        let tap = self.mad(ky, d.g.kw * d.g.c, q)?;
        let at = |cg: &Self, i: usize, j: usize| -> R<IntValue<'c>> {
            let at = cg.mad(cg.add(tap, cg.i64c(i as i64))?, d.o, base)?;
            cg.add(at, cg.i64c((j * LANES) as i64))
        };
        for i in 0..cb {
            for j in 0..ob {
                let v = self.vload(c.out, at(self, i, j)?)?;
                e(self.b.build_store(c.accs[i * ob + j], v))?;
            }
        }
        {
            let cg = &mut *self;
            cg.counted(c.f, zero, cg.i64c(d.g.oh as i64), &mut |cg, oy| {
                let iy = cg.mad(oy, d.g.sh, cg.mad(ky, d.g.dh, zero)?)?;
                cg.real_row(c, iy, &mut |cg| {
                    // x[n, iy, ox·sw + kx, ch] with (kx, ch) = tap q + i
                    let xrow = cg.mad(cg.mad(n, d.ih(), iy)?, d.iw() * d.g.c, q)?;
                    // dy[n, oy, ox, b·ob·LANES ..]
                    let dyrow = cg.mad(cg.mad(n, d.g.oh, oy)?, d.g.ow * d.o, base)?;
                    let (from, to) = cg.real_pixels(c, q, cb)?;
                    cg.counted(c.f, from, to, &mut |cg, ox| {
                        let at = cg.mad(ox, d.o, dyrow)?;
                        let dys = (0..ob)
                            .map(|j| cg.vload(c.k, cg.add(at, cg.i64c((j * LANES) as i64))?))
                            .collect::<R<Vec<_>>>()?;
                        let xs = cg.mad(ox, d.g.sw * d.g.c, xrow)?;
                        for i in 0..cb {
                            let s = cg.broadcast(c.x, cg.add(xs, cg.i64c(i as i64))?)?;
                            for (j, dy) in dys.iter().enumerate() {
                                cg.accumulate(c.accs[i * ob + j], s, *dy)?;
                            }
                        }
                        Ok(())
                    })
                })
            })?;
        }
        for i in 0..cb {
            for j in 0..ob {
                let v = self.acc(c.accs[i * ob + j])?;
                self.vstore(c.out, at(self, i, j)?, v)?;
            }
        }
        Ok(())
    }

    /// The output columns `[from, to)` at which some filter tap of `[q, q + cb)` (over
    /// kernel column, then input channel; column dilation 1) reads input rather than
    /// padding: the filter gradient sums over these alone.
    fn real_pixels(
        &self,
        c: &Conv<'c>,
        q: IntValue<'c>,
        cb: usize,
    ) -> R<(IntValue<'c>, IntValue<'c>)> {
        let d = c.d;
        let (lo, hi) = d.cols();
        let chans = self.i64c(d.g.c as i64);
        let kx0 = e(self.b.build_int_unsigned_div(q, chans, "kx0"))?;
        let last = self.add(q, self.i64c(cb as i64 - 1))?;
        let kx1 = e(self.b.build_int_unsigned_div(last, chans, "kx1"))?;
        // the first column whose tap at kx1 is real, the last + 1 whose tap at kx0 is
        let ceil = |cg: &Self, a: usize, kx: IntValue<'c>| -> R<IntValue<'c>> {
            let num = e(cg.b.build_int_sub(cg.i64c(a as i64), kx, "num"))?;
            let pos =
                e(cg.b.build_int_compare(IntPredicate::SGT, num, cg.i64c(0), "pos"))?;
            let num = e(cg.b.build_select(pos, num, cg.i64c(0), "num"))?.into_int_value();
            let up = cg.add(num, cg.i64c(d.g.sw as i64 - 1))?;
            e(cg.b.build_int_unsigned_div(up, cg.i64c(d.g.sw as i64), "ceil"))
        };
        let from = ceil(self, lo, kx1)?;
        let to = ceil(self, hi, kx0)?;
        let ow = self.i64c(d.g.ow as i64);
        let inside = e(self.b.build_int_compare(IntPredicate::ULT, to, ow, "in"))?;
        let to = e(self.b.build_select(inside, to, ow, "to"))?.into_int_value();
        Ok((from, to))
    }

    /// Runs `body` only when padded row `iy` holds input (a tap on a padding row
    /// reads zeros and is skipped).
    fn real_row(&mut self, c: &Conv<'c>, iy: IntValue<'c>, body: Build<'_, 'c>) -> R<()> {
        let (lo, hi) = c.d.rows();
        if (lo, hi) == (0, c.d.ih()) {
            return body(self);
        }
        let from = e(self.b.build_int_sub(iy, self.i64c(lo as i64), "r"))?;
        let real = self.below(from, hi - lo)?;
        self.branch(c.f, real, body, None)
    }

    /// `if cond { then } else { otherwise }`.
    pub(super) fn branch(
        &mut self,
        f: FunctionValue<'c>,
        cond: IntValue<'c>,
        then: Build<'_, 'c>,
        otherwise: Option<Build<'_, 'c>>,
    ) -> R<()> {
        let yes = self.ctx.append_basic_block(f, "then");
        let no = self.ctx.append_basic_block(f, "else");
        let join = self.ctx.append_basic_block(f, "join");
        e(self.b.build_conditional_branch(cond, yes, no))?;
        self.b.position_at_end(yes);
        then(self)?;
        e(self.b.build_unconditional_branch(join))?;
        self.b.position_at_end(no);
        if let Some(otherwise) = otherwise {
            otherwise(self)?;
        }
        e(self.b.build_unconditional_branch(join))?;
        self.b.position_at_end(join);
        Ok(())
    }

    /// Whether `0 <= i < n` (one unsigned comparison).
    pub(super) fn below(&self, i: IntValue<'c>, n: usize) -> R<IntValue<'c>> {
        e(self
            .b
            .build_int_compare(IntPredicate::ULT, i, self.i64c(n as i64), "in"))
    }

    /// `a · k + b`.
    pub(super) fn mad(&self, a: IntValue<'c>, k: usize, b: IntValue<'c>) -> R<IntValue<'c>> {
        let m = e(self.b.build_int_mul(a, self.i64c(k as i64), "m"))?;
        self.add(m, b)
    }

    pub(super) fn add(&self, a: IntValue<'c>, b: IntValue<'c>) -> R<IntValue<'c>> {
        e(self.b.build_int_add(a, b, "a"))
    }

    pub(super) fn vec_t(&self) -> VectorType<'c> {
        self.ctx.f32_type().vec_type(LANES as u32)
    }

    /// The address of f32 element `i` of `p`.
    pub(super) fn f32_at(&self, p: PointerValue<'c>, i: IntValue<'c>) -> R<PointerValue<'c>> {
        // SAFETY (of the generated code): lowering sized every buffer for the
        // geometry these offsets come from.
        unsafe {
            e(self
                .b
                .build_in_bounds_gep(self.ctx.f32_type(), p, &[i], "at"))
        }
    }

    /// The `LANES` floats from element `i` of `p`.
    pub(super) fn vload(&self, p: PointerValue<'c>, i: IntValue<'c>) -> R<VectorValue<'c>> {
        let v = e(self.b.build_load(self.vec_t(), self.f32_at(p, i)?, "v"))?;
        if let Some(ins) = v.as_instruction_value() {
            e(ins.set_alignment(4))?;
        }
        Ok(v.into_vector_value())
    }

    pub(super) fn vstore(&self, p: PointerValue<'c>, i: IntValue<'c>, v: VectorValue<'c>) -> R<()> {
        let s = e(self.b.build_store(self.f32_at(p, i)?, v))?;
        e(s.set_alignment(4))
    }

    /// Element `i` of `p` in every lane.
    pub(super) fn broadcast(&self, p: PointerValue<'c>, i: IntValue<'c>) -> R<VectorValue<'c>> {
        let x = e(self
            .b
            .build_load(self.ctx.f32_type(), self.f32_at(p, i)?, "x"))?;
        let i32t = self.ctx.i32_type();
        let one =
            e(self
                .b
                .build_insert_element(self.vec_t().get_undef(), x, i32t.const_zero(), "x1"))?;
        let mask = i32t.vec_type(LANES as u32).const_zero();
        e(self
            .b
            .build_shuffle_vector(one, self.vec_t().get_undef(), mask, "xs"))
    }

    pub(super) fn clear(&self, accs: &[PointerValue<'c>]) -> R<()> {
        for &a in accs {
            e(self.b.build_store(a, self.vec_t().const_zero()))?;
        }
        Ok(())
    }

    pub(super) fn acc(&self, a: PointerValue<'c>) -> R<VectorValue<'c>> {
        Ok(e(self.b.build_load(self.vec_t(), a, "acc"))?.into_vector_value())
    }

    /// `*acc += s · w`, fused.
    pub(super) fn accumulate(
        &self,
        acc: PointerValue<'c>,
        s: VectorValue<'c>,
        w: VectorValue<'c>,
    ) -> R<()> {
        let fma = inkwell::intrinsics::Intrinsic::find("llvm.fma").ok_or("no llvm.fma")?;
        let decl = fma
            .get_declaration(&self.module, &[self.vec_t().into()])
            .ok_or("llvm.fma declaration")?;
        let a = self.acc(acc)?;
        let r = e(self
            .b
            .build_call(decl, &[s.into(), w.into(), a.into()], "fma"))?
        .try_as_basic_value()
        .basic()
        .ok_or("llvm.fma has a value")?;
        e(self.b.build_store(acc, r))?;
        Ok(())
    }
}
