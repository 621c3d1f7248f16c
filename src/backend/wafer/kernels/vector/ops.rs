//! The helpers of vector kernels' code: views and loops over a sample's laid-out axes,
//! reductions and broadcasts by rows, a softmax's normalisation.

use crate::backend::wafer::isa::{Dsd, Instr, Src, VecOp};
use crate::backend::wafer::kernels::nest;
use crate::backend::wafer::lower::{vec, Scratch, Val};
use crate::ir::Op;

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
