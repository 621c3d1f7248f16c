//! The helpers of vector kernels' code: views and loops over a sample's laid-out axes,
//! reductions and broadcasts by rows, pooling, a softmax's normalisation.

use crate::backend::wafer::isa::{Dsd, Instr, Src, VecOp};
use crate::backend::wafer::kernels::nest;
use crate::backend::wafer::lower::{vec, Scratch, Val};
use crate::ir::{window_pad, Op};

/// `dst = src`, word by word (either may be a stream).
pub(super) fn mov(dst: Dsd, src: Dsd) -> Instr {
    Instr::Vec {
        op: VecOp::Mov,
        dst,
        srcs: vec![Src::V(src)],
    }
}

/// What a log-softmax computed on the way, in scratch of the current phase: its rows'
/// exponentials (of `x` less the row's maximum) and their sums, the rows `runs` (`outer`
/// runs of `inner` entries of `post` words: see `reduce_run`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Soft {
    pub(super) e: Val,
    pub(super) s: Val,
    pub(super) runs: (u32, u32, u32),
}

/// `dst = e / s` row by row: each row's reciprocal once (in software), then a multiply.
pub(super) fn normalise(
    dst: Val,
    e: Val,
    s: Val,
    runs: (u32, u32, u32),
    scratch: &mut Scratch,
) -> [Instr; 2] {
    let (outer, _, post) = runs;
    let r = scratch.alloc(outer * post);
    [
        vec(VecOp::Div, r, &[Val::Imm(1.0), s], outer * post),
        per_run(VecOp::Mul, dst, e, r, runs),
    ]
}

/// `op` reducing the middle axis of `outer x inner x post` words of `x` into `dst`'s
/// `outer x post` (`reduce_rows` when `post` is 1, the axis last, else `reduce_middle`).
pub(super) fn reduce_run(
    op: VecOp,
    dst: Val,
    x: Val,
    (outer, inner, post): (u32, u32, u32),
) -> Instr {
    if post == 1 {
        reduce_rows(op, dst, x, outer, inner)
    } else {
        reduce_middle(op, dst, x, (outer, inner, post))
    }
}

/// `dst = op(x, s)` of `outer x inner x post` words against `s`'s `outer x post`, one
/// value for each entry of the middle axis (`per_row` when `post` is 1).
pub(super) fn per_run(
    op: VecOp,
    dst: Val,
    x: Val,
    s: Val,
    (outer, inner, post): (u32, u32, u32),
) -> Instr {
    if post == 1 {
        return per_row(op, dst, x, s, outer, inner);
    }
    let many = |v: Val| u32::from(v.elements() != 1);
    nest(
        &[outer, inner],
        Instr::Vec {
            op,
            dst: at(dst, 0, post, 1, &[inner * post, post]),
            srcs: vec![
                view(
                    x,
                    0,
                    post,
                    many(x),
                    &[many(x) * inner * post, many(x) * post],
                ),
                view(s, 0, post, many(s), &[many(s) * post, 0]),
            ],
        },
    )
}

/// The order a sample value's axes lie in on the wafer: an image's (rank 4, NHWC in
/// the graph) planar, channel by channel (N, C, H, W), as is its pixels' regrouping
/// (rank 4 or more, the channels last: `form::planes`); any other's as they are.
pub(super) fn laid_order(rank: usize) -> Vec<usize> {
    if rank >= 4 {
        std::iter::once(0)
            .chain(std::iter::once(rank - 1))
            .chain(1..rank - 1)
            .collect()
    } else {
        (0..rank).collect()
    }
}

/// `shape` in the order its axes lie in on the wafer, and where `axis` lies in it.
pub(super) fn laid(shape: &[usize], axis: usize) -> (Vec<usize>, usize) {
    let order = laid_order(shape.len());
    let at = order.iter().position(|&a| a == axis).unwrap_or(axis);
    (order.iter().map(|&a| shape[a]).collect(), at)
}

/// The rows of a sample (`shape` with the batch first) around `axis`: how many runs of
/// it there are (the axes before it, but the batch), and the elements of one of its
/// entries (the axes after it).
pub(super) fn around(shape: &[usize], axis: usize) -> (u32, u32) {
    let outer: usize = shape[1..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    (outer as u32, inner as u32)
}

/// Whether an op of a value of rank `rank` lying planar moves its pixels within their
/// planes: a slice or concat along an axis neither the batch's nor the channels' (a
/// window of an image, its padding).
pub(super) fn moves_pixels(op: &Op, rank: usize) -> bool {
    matches!(op, Op::Slice { axis, .. } | Op::Concat { axis } if *axis > 0 && *axis + 1 < rank)
}

/// Whether an op pools an image (or is pooling's gradient).
pub(super) fn pooling(op: &Op) -> bool {
    matches!(
        op,
        Op::MaxPool2d(_) | Op::AvgPool2d(_) | Op::MaxPool2dGrad(_) | Op::AvgPool2dGrad(_)
    )
}

/// `len` words of buffer `v` from word `off` on, `stride` apart, moved `step[d]` per
/// iteration of the `d`th loop around it (in `v`'s slot, if it has one); a constant
/// describes no words.
pub(super) fn at(v: Val, off: u32, len: u32, stride: u32, step: &[u32]) -> Dsd {
    let Val::Buf {
        base,
        len: whole,
        slot,
    } = v
    else {
        return Dsd::mem(0, 0);
    };
    Dsd::strided(
        base + off,
        len,
        stride as i32,
        step,
        slot.map(|c| (c, whole as i32)),
    )
}

/// `v` as a source: the words `at` describes, or the constant.
pub(super) fn view(v: Val, off: u32, len: u32, stride: u32, step: &[u32]) -> Src {
    match v {
        Val::Imm(x) => Src::Imm(x),
        _ => Src::V(at(v, off, len, stride, step)),
    }
}

/// `op` over `channels x rows` rows, one vector operation per row (`dst` and each
/// source as their first row, moved by their steps).
pub(super) fn rows_of(op: VecOp, (channels, rows): (u32, u32), dst: Dsd, srcs: Vec<Src>) -> Instr {
    nest(&[channels, rows], Instr::Vec { op, dst, srcs })
}

/// `t` = each of the `cl` words of `v` repeated over a plane of `hw`.
pub(super) fn spread(t: Val, v: Val, cl: u32, hw: u32) -> Instr {
    let srcs = vec![view(v, 0, hw, 0, &[1])];
    nest(
        &[cl],
        Instr::Vec {
            op: VecOp::Mov,
            dst: at(t, 0, hw, 1, &[hw]),
            srcs,
        },
    )
}

/// `count` copies of the `len` words of `v` one after another into `t` (a bias given
/// to every token of a sequence).
pub(super) fn repeat(t: Val, v: Val, len: u32, count: u32) -> Instr {
    nest(
        &[count],
        Instr::Vec {
            op: VecOp::Mov,
            dst: at(t, 0, len, 1, &[len]),
            srcs: vec![view(v, 0, len, 1, &[0])],
        },
    )
}

/// A pooling (or its gradient) over `cl` planes of `x` (`h x w`, the image pooled)
/// into `y` (`ho x wo`): `dst` is `y` (pooling) or `x` (a gradient); `args` the op's
/// operands. Windows that cross the image's border (`same` padding, TensorFlow's: the
/// odd row or column after) pool a copy of the image padded with what changes nothing
/// (`-inf` for a maximum, 0 for a sum); an average then divides by the pixels inside
/// each window, as TensorFlow does, and a gradient is taken in the padded planes and
/// its interior kept.
#[allow(clippy::too_many_arguments)]
pub(super) fn pool(
    op: &Op,
    dst: Val,
    args: &[Val],
    cl: u32,
    (h, w): (u32, u32),
    (ho, wo): (u32, u32),
    scratch: &mut Scratch,
    body: &mut Vec<Instr>,
) -> Result<(), String> {
    let (Op::MaxPool2d(p) | Op::AvgPool2d(p) | Op::MaxPool2dGrad(p) | Op::AvgPool2dGrad(p)) = op
    else {
        return Err(format!("`{}` is no pooling", op.name()));
    };
    let ([kh, kw], [sh, sw]) = (p.window.map(|v| v as u32), p.strides.map(|v| v as u32));
    let (eh, ew) = ((ho - 1) * sh + kh, (wo - 1) * sw + kw);
    if eh <= h && ew <= w {
        return pool_valid(op, dst, args, cl, (h, w), (ho, wo), scratch, body);
    }
    let pad = |len: u32, out: u32, k: u32, s: u32| {
        window_pad(
            len as usize,
            out as usize,
            k as usize,
            s as usize,
            p.padding,
        ) as u32
    };
    let (pt, pl) = (pad(h, ho, kh, sh), pad(w, wo, kw, sw));
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
    let (Op::MaxPool2d(p) | Op::AvgPool2d(p) | Op::MaxPool2dGrad(p) | Op::AvgPool2dGrad(p)) = op
    else {
        return Err(format!("`{}` is no pooling", op.name()));
    };
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

/// The words between neighbours along each axis of a sample value of `shape` (the
/// batch first, whose stride is 0) as it lies on a lane (`laid`: an image planar).
pub(super) fn laid_strides(shape: &[usize]) -> Vec<u32> {
    let order = laid_order(shape.len());
    let sample: Vec<usize> = order.iter().skip(1).map(|&a| shape[a]).collect();
    let st = strides(&sample);
    let mut out = vec![0; shape.len()];
    for (&a, &s) in order.iter().skip(1).zip(&st) {
        out[a] = s;
    }
    out
}

/// For each axis of `fine` (a sample's shape, the batch first) that regroups the axes
/// of `coarse` (`form::regrouping`), the words between its neighbours in a value of
/// `coarse` as it lies (`laid_strides`); `None` when `fine` does not regroup `coarse`.
pub(super) fn regroup_strides(fine: &[usize], coarse: &[usize]) -> Option<Vec<u32>> {
    let cs = laid_strides(coarse);
    let groups = crate::backend::wafer::form::regrouping(fine, coarse)?;
    Some(groups.iter().map(|&(a, m)| cs[a] * m as u32).collect())
}

/// The words between neighbours along each axis of a row-major `shape`.
pub(super) fn strides(shape: &[usize]) -> Vec<u32> {
    let mut st = vec![1u32; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        st[d] = st[d + 1] * shape[d + 1] as u32;
    }
    st
}

/// A shape's elements around reduced axes: the runs before them (the batch aside), the
/// entries of the reduced axes, and the elements after them (the reduced axes must be
/// next to each other, after the batch).
pub(super) fn reduced(shape: &[usize], axes: &[usize]) -> Result<(u32, u32, u32), String> {
    let r = shape.len();
    let mut sorted = axes.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let together = sorted.windows(2).all(|w| w[1] == w[0] + 1);
    let (Some(&first), Some(&last)) = (sorted.first(), sorted.last()) else {
        return Err(format!("a reduction over no axes of a rank-{r} value"));
    };
    if first == 0 || !together || last >= r {
        return Err(format!("a reduction over axes {axes:?} of a rank-{r} value (only axes next to each other, within a sample)"));
    }
    let size = |a: &[usize]| a.iter().product::<usize>() as u32;
    Ok((
        size(&shape[1..first]),
        size(&shape[first..=last]),
        size(&shape[last + 1..]),
    ))
}

/// `dst` = `x` (of shape `from`) broadcast to shape `to` (both with the batch first
/// when they are sample values; `from` aligned to the right): a loop over every axis of
/// a sample but the last, one move per run of the last, reading `x` 0 words apart
/// along the axes it is broadcast over.
pub(super) fn broadcast(dst: Val, x: Val, from: &[usize], to: &[usize]) -> Instr {
    let r = to.len();
    let mut padded = vec![1usize; r.saturating_sub(from.len())];
    padded.extend(from);
    // in the order the result's axes lie in (an image's planar). An operand of the
    // same rank lies in that order too; one of lower rank lies as it is (row-major in
    // its own axes), so its strides are taken in its order, then put in the result's.
    let order = laid_order(r);
    let to: Vec<usize> = laid(to, 0).0;
    let (padded, mut sx) = if from.len() == r {
        let p = laid(&padded, 0).0;
        let s = strides(&p);
        (p, s)
    } else {
        let s = strides(&padded);
        (
            order.iter().map(|&a| padded[a]).collect::<Vec<usize>>(),
            order.iter().map(|&a| s[a]).collect::<Vec<u32>>(),
        )
    };
    let so = strides(&to);
    for d in 0..r {
        if padded[d] == 1 {
            sx[d] = 0;
        }
    }
    if r < 2 {
        // a scalar of each sample, or a value of none: one word each
        return Instr::Vec {
            op: VecOp::Mov,
            dst: at(dst, 0, 1, 1, &[]),
            srcs: vec![view(x, 0, 1, 0, &[])],
        };
    }
    let last = r - 1;
    let loops: Vec<u32> = (1..last).map(|d| to[d] as u32).collect();
    let len = to[last] as u32;
    nest(
        &loops,
        Instr::Vec {
            op: VecOp::Mov,
            dst: at(dst, 0, len, 1, &so[1..last]),
            srcs: vec![view(x, 0, len, sx[last], &sx[1..last])],
        },
    )
}

/// A shape's elements as rows: those before the reduced axes and those in them (the
/// reduced axes must be the last ones, after the batch).
pub(super) fn rows(shape: &[usize], axes: &[usize]) -> Result<(u32, u32), String> {
    match reduced(shape, axes) {
        Ok((outer, inner, 1)) => Ok((outer, inner)),
        _ => Err(format!(
            "a reduction over axes {axes:?} of a rank-{} value (only the last axes, within a sample)",
            shape.len()
        )),
    }
}

/// `dst[r] = op(dst[r], x[r * inner + i])` over every `i`, for each row `r`: a loop of
/// accumulations into one word each.
pub(super) fn reduce_rows(op: VecOp, dst: Val, x: Val, outer: u32, inner: u32) -> Instr {
    let acc = at(dst, 0, inner, 0, &[1]);
    nest(
        &[outer],
        Instr::Vec {
            op,
            dst: acc.clone(),
            srcs: vec![Src::V(acc), view(x, 0, inner, 1, &[inner])],
        },
    )
}

/// `dst[r * post + j] = op(dst[r * post + j], x[(r * inner + i) * post + j])` over every
/// `i`: the middle axis of `outer x inner x post` reduced, a run of `post` words at a
/// time (a sequence's tokens summed feature by feature).
pub(super) fn reduce_middle(
    op: VecOp,
    dst: Val,
    x: Val,
    (outer, inner, post): (u32, u32, u32),
) -> Instr {
    let acc = at(dst, 0, post, 1, &[post, 0]);
    nest(
        &[outer, inner],
        Instr::Vec {
            op,
            dst: acc.clone(),
            srcs: vec![Src::V(acc), view(x, 0, post, 1, &[inner * post, post])],
        },
    )
}

/// `dst[r * inner + i] = op(x[r * inner + i], s[r])`: a row's elements against the row's
/// one value.
pub(super) fn per_row(op: VecOp, dst: Val, x: Val, s: Val, outer: u32, inner: u32) -> Instr {
    // a one-word operand repeats its word
    let many = |v: Val| u32::from(v.elements() != 1);
    nest(
        &[outer],
        Instr::Vec {
            op,
            dst: at(dst, 0, inner, 1, &[inner]),
            srcs: vec![
                view(x, 0, inner, many(x), &[many(x) * inner]),
                view(s, 0, inner, 0, &[many(s)]),
            ],
        },
    )
}
