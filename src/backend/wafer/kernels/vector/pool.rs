//! Pooling on a lane: a pooling's (or its gradient's) code over the planes of the
//! channels a lane holds (`pool`), and in bands of rows over the rows of one channel's
//! image its readers want (`Vector::pool_band`), whose windows reach into the bands
//! beside it (`RowWindows`, from which `halo` works out the rows it widens).

use super::halo::{part_of, Halo, Rows};
use super::node::Site;
use super::ops::{at, mov, rows_of, view};
use super::Vector;
use crate::backend::wafer::isa::{Instr, Src, VecOp};
use crate::backend::wafer::lower::{vec, Scratch, Val};
use crate::ir::{window_pad, NodeIndex, Op, Pool};

/// A pooling's windows along an image's rows: `k` rows each, `s` apart, the first
/// starting `pad` rows above the image (`same` padding's), over `h` rows pooled into
/// `ho`.
#[derive(Debug, Clone, Copy)]
pub(super) struct RowWindows {
    k: u32,
    s: u32,
    pad: u32,
    h: u32,
    ho: u32,
}

impl RowWindows {
    /// The windows of pooling `p` (or its gradient) of an image of `h` rows into `ho`.
    pub(super) fn of(p: &Pool, h: u32, ho: u32) -> Self {
        let (k, s) = (p.window[0] as u32, p.strides[0] as u32);
        let pad = window_pad(h as usize, ho as usize, k as usize, s as usize, p.padding) as u32;
        RowWindows { k, s, pad, h, ho }
    }

    /// The image's rows that output rows `q` pool (those inside the image).
    pub(super) fn input(&self, q: &Rows) -> Rows {
        if q.is_empty() {
            return 0..0;
        }
        let a = (q.start * self.s).saturating_sub(self.pad).min(self.h);
        let b = ((q.end - 1) * self.s + self.k)
            .saturating_sub(self.pad)
            .min(self.h);
        a..b.max(a)
    }

    /// The output rows whose windows hold a row of the image's rows `d`.
    pub(super) fn output(&self, d: &Rows) -> Rows {
        if d.is_empty() {
            return 0..0;
        }
        let q0 = ((d.start + self.pad + 1).saturating_sub(self.k)).div_ceil(self.s);
        let q1 = (d.end - 1 + self.pad) / self.s + 1;
        q0.min(self.ho)..q1.min(self.ho).max(q0.min(self.ho))
    }

    /// The rows of padding above image rows `r` that the first of output rows `q`'s
    /// windows starts with (`r` the image's rows those windows pool: `input`).
    fn above(&self, r: &Rows, q: &Rows) -> u32 {
        r.start + self.pad - q.start * self.s
    }
}

impl Vector<'_> {
    /// A pooling (or its gradient) at `site` over the planes of the channels lane
    /// holds: the image pooled (`x`) and the pooled one (`y`), each whole, or in bands
    /// (`h`) one channel's rows (`pool_band`).
    pub(super) fn pooled(
        &self,
        site: &Site,
        h: Option<&Halo>,
        scratch: &mut Scratch,
        body: &mut Vec<Instr>,
    ) -> Result<(), String> {
        let (g, f) = (self.g, self.f);
        let (n, (lanes, lane)) = (site.n, site.lanes);
        let op = &g.node(n).op;
        let ops = g.operands(n);
        let (x, y) = match op {
            Op::MaxPool2d(_) | Op::AvgPool2d(_) => (f.resolve(ops[0]), n),
            Op::MaxPool2dGrad(_) => (n, f.resolve(ops[1])),
            _ => (n, f.resolve(ops[0])),
        };
        let (Some(xi), Some(yi)) = (self.image(x), self.image(y)) else {
            return Err(format!("`{}` of values not images", op.name()));
        };
        let p = params(op)?;
        let win = RowWindows::of(p, xi.0, yi.0);
        let pl = window_pad(
            xi.1 as usize,
            yi.1 as usize,
            p.window[1],
            p.strides[1],
            p.padding,
        );
        let pl = pl as u32;
        match (h, self.bands(lanes) > 1) {
            (Some(h), true) => self.pool_band(site, h, (win, pl), (xi.1, yi.1), scratch, body),
            _ => {
                let cl = super::split(xi.2, lanes, lane).len() as u32;
                let pad = (win.pad, pl);
                let (xs, ys) = ((xi.0, xi.1), (yi.0, yi.1));
                pool(op, site.dst, &site.args, cl, xs, ys, pad, scratch, body)
            }
        }
    }

    /// `pooled` in bands: lane's rows of its channel's image (`h`'s rows of the node:
    /// of `y` for a pooling, of `x` for a gradient) from the rows of its operands it
    /// holds (the halo widened them to the rows their windows reach). A gradient is
    /// taken over the image rows of every window that holds one of its rows, then its
    /// rows kept (0 where no window reaches).
    fn pool_band(
        &self,
        site: &Site,
        h: &Halo,
        (win, pl): (RowWindows, u32),
        (w, wo): (u32, u32),
        scratch: &mut Scratch,
        body: &mut Vec<Instr>,
    ) -> Result<(), String> {
        let (g, f) = (self.g, self.f);
        let (n, (lanes, lane)) = (site.n, site.lanes);
        let op = &g.node(n).op;
        let ops = g.operands(n);
        let d = h
            .rows
            .get(&n)
            .cloned()
            .ok_or("a pooling in bands without its rows")?;
        let mut copies = Vec::new();
        // operand `i`'s rows `r`, from the rows of it the lane holds
        let mut part = |i: usize, r: &Rows, scratch: &mut Scratch, body: &mut Vec<Instr>| {
            let (o, v) = (ops[i], f.resolve(ops[i]));
            let held = (self.held_rows(v, h, lanes, lane))
                .map(|held| self.as_read(v, o, held))
                .filter(|held| held.start <= r.start && r.end <= held.end)
                .ok_or("a pooling in bands reads rows its lane does not hold")?;
            let words = self.row_layout(o).map_or(0, |l| l.1);
            let off = (r.start - held.start) * words;
            Ok::<_, String>(part_of(
                site.args[i],
                (off, r.len() as u32 * words),
                scratch,
                body,
                &mut copies,
            ))
        };
        let out = match op {
            Op::MaxPool2d(_) | Op::AvgPool2d(_) => {
                let r = win.input(&d);
                let xa = part(0, &r, scratch, body)?;
                let (xs, ys) = ((r.len() as u32, w), (d.len() as u32, wo));
                let pad = (win.above(&r, &d), pl);
                pool(op, site.dst, &[xa], 1, xs, ys, pad, scratch, body)
            }
            _ => {
                let (q, ext) = (win.output(&d), d.len() as u32 * w);
                if q.is_empty() {
                    body.push(vec(VecOp::Mov, site.dst, &[Val::Imm(0.0)], ext));
                    return Ok(());
                }
                let r = win.input(&q);
                let args = match op {
                    Op::MaxPool2dGrad(_) => {
                        vec![part(0, &r, scratch, body)?, part(1, &q, scratch, body)?]
                    }
                    _ => vec![part(0, &q, scratch, body)?],
                };
                let dx = if r == d {
                    site.dst
                } else {
                    scratch.alloc(r.len() as u32 * w)
                };
                let (xs, ys) = ((r.len() as u32, w), (q.len() as u32, wo));
                let pad = (win.above(&r, &q), pl);
                pool(op, dx, &args, 1, xs, ys, pad, scratch, body)?;
                if r != d {
                    // its rows of the gradient (0 on those no window reaches)
                    let keep = d.start.max(r.start)..d.end.min(r.end);
                    body.push(vec(VecOp::Mov, site.dst, &[Val::Imm(0.0)], ext));
                    if !keep.is_empty() {
                        let len = keep.len() as u32 * w;
                        body.push(mov(
                            at(site.dst, (keep.start - d.start) * w, len, 1, &[]),
                            at(dx, (keep.start - r.start) * w, len, 1, &[]),
                        ));
                    }
                    scratch.release(dx);
                }
                Ok(())
            }
        };
        copies.into_iter().for_each(|t| scratch.release(t));
        out
    }

    /// The rows of operand `o` (`raw`, as read) pooling (or gradient) `u` reads to make
    /// its rows `d`: the image's rows of the windows of the output rows it makes or
    /// those whose windows hold its rows, and those output rows.
    pub(super) fn pool_wants(&self, u: NodeIndex, raw: NodeIndex, d: &Rows) -> Option<Rows> {
        let (g, f) = (self.g, self.f);
        let op = &g.node(u).op;
        let ops = g.operands(u);
        match op {
            Op::MaxPool2d(_) | Op::AvgPool2d(_) => {
                let (h, ho) = (self.row_layout(raw)?.0, self.row_layout(u)?.0);
                Some(RowWindows::of(params(op).ok()?, h, ho).input(d))
            }
            Op::MaxPool2dGrad(_) | Op::AvgPool2dGrad(_) => {
                let dy = *ops.last()?;
                let (h, ho) = (self.row_layout(u)?.0, self.row_layout(dy)?.0);
                let win = RowWindows::of(params(op).ok()?, h, ho);
                let q = win.output(d);
                let image = f.resolve(raw) != f.resolve(dy);
                Some(if image { win.input(&q) } else { q })
            }
            _ => None,
        }
    }
}

/// Whether an op pools an image (or is pooling's gradient).
pub(super) fn pooling(op: &Op) -> bool {
    params(op).is_ok()
}

/// The windows of pooling `op` (or of its gradient).
fn params(op: &Op) -> Result<&Pool, String> {
    match op {
        Op::MaxPool2d(p) | Op::AvgPool2d(p) | Op::MaxPool2dGrad(p) | Op::AvgPool2dGrad(p) => Ok(p),
        _ => Err(format!("`{}` is no pooling", op.name())),
    }
}

/// A pooling (or its gradient) over `cl` planes of `x` (`h x w`, the image pooled)
/// into `y` (`ho x wo`): `dst` is `y` (pooling) or `x` (a gradient); `args` the op's
/// operands; the first window starts `pt` rows above the image and `pl` columns left of
/// it. Windows that cross the image's border (`same` padding, TensorFlow's: the odd
/// row or column after; in bands, a lane's rows) pool a copy of the image padded with
/// what changes nothing (`-inf` for a maximum, 0 for a sum); an average then divides
/// by the pixels inside each window, as TensorFlow does, and a gradient is taken in the
/// padded planes and its interior kept.
#[allow(clippy::too_many_arguments)]
pub(super) fn pool(
    op: &Op,
    dst: Val,
    args: &[Val],
    cl: u32,
    (h, w): (u32, u32),
    (ho, wo): (u32, u32),
    (pt, pl): (u32, u32),
    scratch: &mut Scratch,
    body: &mut Vec<Instr>,
) -> Result<(), String> {
    let p = params(op)?;
    let ([kh, kw], [sh, sw]) = (p.window.map(|v| v as u32), p.strides.map(|v| v as u32));
    let (eh, ew) = ((ho - 1) * sh + kh, (wo - 1) * sw + kw);
    if pt == 0 && pl == 0 && eh <= h && ew <= w {
        return pool_valid(op, dst, args, cl, (h, w), (ho, wo), scratch, body);
    }
    let (hp, wp) = (eh.max(pt + h), ew.max(pl + w));
    let (plane, plane_p) = (h * w, hp * wp);
    let n = cl * plane_p;
    // the image's planes into the interior of padded ones (filled with `fill`)
    let padded = |x: Val, fill: f32, scratch: &mut Scratch, body: &mut Vec<Instr>| {
        let xp = scratch.alloc(n);
        body.push(vec(VecOp::Mov, xp, &[Val::Imm(fill)], n));
        body.push(rows_of(
            VecOp::Mov,
            (cl, h),
            at(xp, pt * wp + pl, w, 1, &[plane_p, wp]),
            vec![view(x, 0, w, 1, &[plane, w])],
        ));
        xp
    };
    // a padded plane's interior into `dst`'s planes
    let interior = |xp: Val, body: &mut Vec<Instr>| {
        body.push(rows_of(
            VecOp::Mov,
            (cl, h),
            at(dst, 0, w, 1, &[plane, w]),
            vec![view(xp, pt * wp + pl, w, 1, &[plane_p, wp])],
        ));
    };
    // an average's correction per output: the window's area over the pixels inside it
    let correction = |scratch: &mut Scratch, body: &mut Vec<Instr>| {
        let ones = scratch.alloc(plane_p);
        body.push(vec(VecOp::Mov, ones, &[Val::Imm(0.0)], plane_p));
        body.push(rows_of(
            VecOp::Mov,
            (1, h),
            at(ones, pt * wp + pl, w, 1, &[0, wp]),
            vec![Src::Imm(1.0)],
        ));
        let fix = scratch.alloc(ho * wo);
        let sum = Op::AvgPool2d(*p);
        pool_valid(&sum, fix, &[ones], 1, (hp, wp), (ho, wo), scratch, body)?;
        // the mean over the whole window, so its area over the pixels inside
        body.push(vec(VecOp::Div, fix, &[Val::Imm(1.0), fix], ho * wo));
        scratch.release(ones);
        Ok::<_, String>(fix)
    };
    // `dst = v * fix`, each plane by the one correction plane
    let by = |dst: Val, v: Val, fix: Val| {
        rows_of(
            VecOp::Mul,
            (cl, ho),
            at(dst, 0, wo, 1, &[ho * wo, wo]),
            vec![
                view(v, 0, wo, 1, &[ho * wo, wo]),
                view(fix, 0, wo, 1, &[0, wo]),
            ],
        )
    };
    match op {
        Op::MaxPool2d(_) | Op::AvgPool2d(_) => {
            let max = matches!(op, Op::MaxPool2d(_));
            let xp = padded(
                args[0],
                if max { f32::NEG_INFINITY } else { 0.0 },
                scratch,
                body,
            );
            pool_valid(op, dst, &[xp], cl, (hp, wp), (ho, wo), scratch, body)?;
            if !max {
                let fix = correction(scratch, body)?;
                body.push(by(dst, dst, fix));
                scratch.release(fix);
            }
            scratch.release(xp);
        }
        Op::MaxPool2dGrad(_) => {
            let xp = padded(args[0], f32::NEG_INFINITY, scratch, body);
            let dxp = scratch.alloc(n);
            pool_valid(
                op,
                dxp,
                &[xp, args[1]],
                cl,
                (hp, wp),
                (ho, wo),
                scratch,
                body,
            )?;
            interior(dxp, body);
            scratch.release(dxp);
            scratch.release(xp);
        }
        _ => {
            let fix = correction(scratch, body)?;
            let dy = scratch.alloc(cl * ho * wo);
            body.push(by(dy, args[0], fix));
            let dxp = scratch.alloc(n);
            pool_valid(op, dxp, &[dy], cl, (hp, wp), (ho, wo), scratch, body)?;
            interior(dxp, body);
            scratch.release(dxp);
            scratch.release(dy);
            scratch.release(fix);
        }
    }
    Ok(())
}

/// `pool` when every window lies inside the image.
#[allow(clippy::too_many_arguments)]
pub(super) fn pool_valid(
    op: &Op,
    dst: Val,
    args: &[Val],
    cl: u32,
    (h, w): (u32, u32),
    (ho, wo): (u32, u32),
    scratch: &mut Scratch,
    body: &mut Vec<Instr>,
) -> Result<(), String> {
    let p = params(op)?;
    let ([kh, kw], [sh, sw]) = (p.window.map(|v| v as u32), p.strides.map(|v| v as u32));
    if (ho - 1) * sh + kh > h || (wo - 1) * sw + kw > w {
        return Err(format!(
            "`{}` whose windows cross the image's border (padding)",
            op.name()
        ));
    }
    let dims = (cl, ho);
    // a window position's input pixels, per output row; an output row
    let win_at = |v: Val, (r, c): (u32, u32)| at(v, r * w + c, wo, sw, &[h * w, sh * w]);
    let out_at = |v: Val| at(v, 0, wo, 1, &[ho * wo, wo]);
    let win = |v: Val, (r, c): (u32, u32)| view(v, r * w + c, wo, sw, &[h * w, sh * w]);
    let out = |v: Val| view(v, 0, wo, 1, &[ho * wo, wo]);
    let taps: Vec<(u32, u32)> = (0..kh).flat_map(|r| (0..kw).map(move |c| (r, c))).collect();
    let area = Val::Imm(1.0 / (kh * kw) as f32);
    // the maximum of each window of `x` into `m`
    let max = |m: Val, x: Val, body: &mut Vec<Instr>| {
        for (i, &t) in taps.iter().enumerate() {
            let (v, srcs) = if i == 0 {
                (VecOp::Mov, vec![win(x, t)])
            } else {
                (VecOp::Max, vec![out(m), win(x, t)])
            };
            body.push(rows_of(v, dims, out_at(m), srcs));
        }
    };
    match op {
        Op::MaxPool2d(_) => max(dst, args[0], body),
        Op::AvgPool2d(_) => {
            for (i, &t) in taps.iter().enumerate() {
                let (v, srcs) = if i == 0 {
                    (VecOp::Mov, vec![win(args[0], t)])
                } else {
                    (VecOp::Add, vec![out(dst), win(args[0], t)])
                };
                body.push(rows_of(v, dims, out_at(dst), srcs));
            }
            body.push(rows_of(
                VecOp::Mul,
                dims,
                out_at(dst),
                vec![out(dst), area.src(1)],
            ));
        }
        Op::MaxPool2dGrad(_) => {
            // the gradient goes to each window's first maximum
            let (x, dy) = (args[0], args[1]);
            let n = cl * ho * wo;
            let (m, taken, hit) = (scratch.alloc(n), scratch.alloc(n), scratch.alloc(n));
            max(m, x, body);
            body.push(vec(VecOp::Mov, taken, &[Val::Imm(0.0)], n));
            body.push(vec(VecOp::Mov, dst, &[Val::Imm(0.0)], dst.elements()));
            for &t in &taps {
                body.push(rows_of(
                    VecOp::Eq,
                    dims,
                    out_at(hit),
                    vec![win(x, t), out(m)],
                ));
                body.push(rows_of(
                    VecOp::Sel,
                    dims,
                    out_at(hit),
                    vec![out(taken), Src::Imm(0.0), out(hit)],
                ));
                body.push(rows_of(
                    VecOp::Add,
                    dims,
                    out_at(taken),
                    vec![out(taken), out(hit)],
                ));
                body.push(rows_of(
                    VecOp::Fmac,
                    dims,
                    win_at(dst, t),
                    vec![win(dst, t), out(hit), out(dy)],
                ));
            }
            scratch.release(hit);
            scratch.release(taken);
            scratch.release(m);
        }
        _ => {
            let dy = args[0];
            body.push(vec(VecOp::Mov, dst, &[Val::Imm(0.0)], dst.elements()));
            for &t in &taps {
                body.push(rows_of(
                    VecOp::Fmac,
                    dims,
                    win_at(dst, t),
                    vec![win(dst, t), out(dy), area.src(1)],
                ));
            }
        }
    }
    Ok(())
}
