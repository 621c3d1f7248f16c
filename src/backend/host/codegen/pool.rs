//! Max pooling over NHWC data and its gradient, as generated loops vectorised over
//! channels.
//!
//! A window's taps are unrolled (their bounds checks are per pixel, not per channel);
//! taps outside the input read a clamped address and are masked. The gradient sends
//! each window's `dy` to the first maximum of the window (a NaN is the maximum once
//! met), as the interpreter does, adding in window order; when the windows tile the
//! input exactly (the usual 2x2, stride 2) every input element gets exactly one store.

use super::{e, Codegen, KernelFn, R};
use crate::backend::host::lower::{Bufs, View};
use crate::backend::window::Geo;
use crate::ir::Graph;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::FloatPredicate;
use rustc_hash::FxHashMap;

impl<'c> Codegen<'c> {
    /// Max pooling of `x` into `out` (or, with `dy`, its gradient into `out`), split
    /// over images.
    pub(super) fn max_pool_kernel(
        &mut self,
        name: &str,
        [x, out]: [&View; 2],
        dy: Option<&View>,
        geo: &Geo,
        g: &Graph,
        bufs: &Bufs,
    ) -> R<KernelFn> {
        let mut views = vec![x, out];
        views.extend(dy);
        let (body, ids) = self.body(name, g, bufs, &views, FxHashMap::default())?;
        let (start, end) = self.start_end(&body, ids.len());
        let (f, xp, op) = (body.f, body.ptrs[&x.buf], body.ptrs[&out.buf]);
        let dyp = dy.map(|v| body.ptrs[&v.buf]);
        let gm = *geo;
        let zero = self.i64c(0);
        let f32t = self.ctx.f32_type();
        let i32t = self.ctx.i32_type();
        let image = gm.image_len();
        // every input element lies in exactly one window, and no tap is padding
        let tiles = gm.kh == gm.sh
            && gm.kw == gm.sw
            && gm.pt == 0
            && gm.pl == 0
            && gm.oh * gm.sh == gm.h
            && gm.ow * gm.sw == gm.w;
        self.counted(f, start, end, &mut |cg, n| {
            if dyp.is_some() && !tiles {
                let at = cg.mad(n, image, zero)?;
                cg.counted(f, zero, cg.i64c(image as i64), &mut |cg, i| {
                    e(cg.b.build_store(cg.f32_at(op, cg.add(at, i)?)?, cg.f32c(0.0)))?;
                    Ok(())
                })?;
            }
            cg.counted(f, zero, cg.i64c(gm.oh as i64), &mut |cg, oi| {
                cg.counted(f, zero, cg.i64c(gm.ow as i64), &mut |cg, oj| {
                    // each tap: whether it is inside the input, and its first channel
                    // (clamped to the image's first element when not)
                    let first = cg.mad(n, image, zero)?;
                    let mut taps = Vec::new();
                    for ki in 0..gm.kh {
                        for kj in 0..gm.kw {
                            let row = cg.mad(oi, gm.sh, cg.i64c(ki as i64 - gm.pt as i64))?;
                            let col = cg.mad(oj, gm.sw, cg.i64c(kj as i64 - gm.pl as i64))?;
                            let inside = cg.below(row, gm.h)?;
                            let inside = e(cg.b.build_and(inside, cg.below(col, gm.w)?, "in"))?;
                            let at =
                                cg.mad(cg.mad(cg.mad(n, gm.h, row)?, gm.w, col)?, gm.c, zero)?;
                            let at =
                                e(cg.b.build_select(inside, at, first, "at"))?.into_int_value();
                            taps.push((inside, at));
                        }
                    }
                    let o = cg.mad(cg.mad(cg.mad(n, gm.oh, oi)?, gm.ow, oj)?, gm.c, zero)?;
                    cg.counted(f, zero, cg.i64c(gm.c as i64), &mut |cg, ch| {
                        let (best, arg) = cg.window_max(&taps, xp, ch, dyp.is_some())?;
                        let Some(dyp) = dyp else {
                            e(cg.b.build_store(cg.f32_at(op, cg.add(o, ch)?)?, best))?;
                            return Ok(());
                        };
                        let gy = cg.load_f32(dyp, cg.add(o, ch)?)?;
                        let zf = f32t.const_zero();
                        for (t, &(_, at)) in taps.iter().enumerate() {
                            let mine = e(cg.b.build_int_compare(
                                inkwell::IntPredicate::EQ,
                                arg,
                                i32t.const_int(t as u64, false),
                                "mine",
                            ))?;
                            let add = e(cg.b.build_select(mine, gy, zf, "g"))?.into_float_value();
                            let p = cg.f32_at(op, cg.add(at, ch)?)?;
                            // dx starts at zero: 0 + dy, as the interpreter adds it
                            let before = if tiles {
                                zf
                            } else {
                                cg.load_f32(op, cg.add(at, ch)?)?
                            };
                            let v = e(cg.b.build_float_add(before, add, "dx"))?;
                            e(cg.b.build_store(p, v))?;
                        }
                        Ok(())
                    })
                })
            })
        })?;
        self.finish(&body, name, ids)
    }

    /// The maximum of channel `ch` over a window's `taps` (inside, first channel's
    /// offset) of `x`, and with `track` the index of the tap holding it: the first tap
    /// inside, then any that beats the best (so a NaN once met). -inf (and index -1)
    /// for a window with no tap inside.
    fn window_max(
        &self,
        taps: &[(IntValue<'c>, IntValue<'c>)],
        x: PointerValue<'c>,
        ch: IntValue<'c>,
        track: bool,
    ) -> R<(FloatValue<'c>, IntValue<'c>)> {
        let i32t = self.ctx.i32_type();
        let mut best = self.f32c(f64::NEG_INFINITY);
        let mut arg = i32t.const_int(u64::MAX, true);
        for (t, &(inside, at)) in taps.iter().enumerate() {
            let v = self.load_f32(x, self.add(at, ch)?)?;
            if !track {
                let m = self.fextremum(best, v, true)?;
                best = e(self.b.build_select(inside, m, best, "best"))?.into_float_value();
                continue;
            }
            let none = e(self.b.build_int_compare(
                inkwell::IntPredicate::SLT,
                arg,
                i32t.const_zero(),
                "none",
            ))?;
            let take = e(self.b.build_or(none, self.beats(v, best, true)?, "take"))?;
            let take = e(self.b.build_and(inside, take, "take"))?;
            best = e(self.b.build_select(take, v, best, "best"))?.into_float_value();
            let t = i32t.const_int(t as u64, false);
            arg = e(self.b.build_select(take, t, arg, "arg"))?.into_int_value();
        }
        Ok((best, arg))
    }

    /// Whether `v` replaces `best` as a running maximum (minimum when `!max`;
    /// `float::beats`): it is greater (smaller), or the first NaN.
    pub(super) fn beats(
        &self,
        v: FloatValue<'c>,
        best: FloatValue<'c>,
        max: bool,
    ) -> R<IntValue<'c>> {
        let b = &self.b;
        let p = if max {
            FloatPredicate::OGT
        } else {
            FloatPredicate::OLT
        };
        let gt = e(b.build_float_compare(p, v, best, "gt"))?;
        let nan = e(b.build_float_compare(FloatPredicate::UNO, v, v, "nan"))?;
        let open = e(b.build_float_compare(FloatPredicate::ORD, best, best, "open"))?;
        let first_nan = e(b.build_and(nan, open, "first_nan"))?;
        e(b.build_or(gt, first_nan, "beats"))
    }

    pub(super) fn load_f32(&self, p: PointerValue<'c>, i: IntValue<'c>) -> R<FloatValue<'c>> {
        let at = self.f32_at(p, i)?;
        Ok(e(self.b.build_load(self.ctx.f32_type(), at, "x"))?.into_float_value())
    }
}
