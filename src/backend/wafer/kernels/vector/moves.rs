//! Moving a sample's elements on a lane: slices, concats and transposes within a
//! sample, and reshapes that regroup an image's axes; in bands of rows, on the rows the
//! lane's code holds (`halo`).

use super::halo::Halo;
use super::node::Site;
use super::ops::*;
use super::Vector;
use crate::backend::wafer::form::{planes, regroups};
use crate::backend::wafer::isa::{Instr, VecOp};
use crate::backend::wafer::kernels::{nest, split};
use crate::backend::wafer::lower::Val;
use crate::ir::{NodeIndex, Op};

impl Vector<'_> {
    /// Whether node `n` moves a sample's elements about in a way `moved` writes: a
    /// slice or a concat along an axis past the batch's, a transpose that keeps the batch
    /// first.
    pub(super) fn movable(&self, n: NodeIndex) -> bool {
        match &self.g.node(n).op {
            Op::Slice { axis, .. } | Op::Concat { axis } => *axis > 0,
            Op::Transpose { perm } => perm.first() == Some(&0) && perm.len() > 1,
            _ => false,
        }
    }

    /// The operand slice `n` reads in place on lane `lane` of `lanes`, as a run of its
    /// words (a recurrent step's gate, cut from all its gates), rather than copying it:
    /// a slice along a sample's axis whose run is one stretch of words, outside bands,
    /// neither it nor its operand stashed (a stash is read through a counter's slots).
    pub(super) fn in_place(
        &self,
        n: NodeIndex,
        (lanes, lane): (u32, u32),
        stash: &std::collections::BTreeMap<NodeIndex, (u32, u32)>,
    ) -> Option<NodeIndex> {
        let Op::Slice { axis, .. } = self.g.node(n).op else {
            return None;
        };
        let o = self.f.resolve(*self.g.operands(n).first()?);
        let banded =
            self.band_rows(n, lanes, lane).is_some() || self.band_rows(o, lanes, lane).is_some();
        let (shape, laxis) = self.laid_here(n, axis, (lanes, lane), None);
        let one_run = axis > 0 && around(&shape, laxis).0 == 1;
        (one_run && !banded && !stash.contains_key(&n) && !stash.contains_key(&o)).then_some(o)
    }

    /// Slice `n` as a view of its operand's words `args[0]` (`in_place`), when the
    /// operand lies in words of its own.
    pub(super) fn sliced_in_place(
        &self,
        n: NodeIndex,
        lanes: (u32, u32),
        stash: &std::collections::BTreeMap<NodeIndex, (u32, u32)>,
        args: &[Val],
    ) -> Option<Val> {
        let g = self.g;
        let Op::Slice { axis, start, end } = g.node(n).op else {
            return None;
        };
        self.in_place(n, lanes, stash)?;
        let (shape, laxis) = self.laid_here(g.operands(n)[0], axis, lanes, None);
        let inner = around(&shape, laxis).1;
        let whole = shape[laxis] as u32 * inner;
        match *args.first()? {
            Val::Buf {
                base,
                len,
                slot: None,
            } if len == whole => Some(Val::buf(
                base + start as u32 * inner,
                (end - start) as u32 * inner,
            )),
            _ => None,
        }
    }

    /// A slice, concat or transpose within a sample (`movable`), row by row.
    pub(super) fn moved(&self, site: &Site, body: &mut Vec<Instr>) -> Result<(), String> {
        let g = self.g;
        let Site {
            n, dst, ref args, ..
        } = *site;
        let node = g.node(n);
        let ops = g.operands(n);
        match &node.op {
            Op::Slice { axis, start, end } if *axis > 0 => {
                // each run of the sliced axis (and the axes inside it), row by row (in
                // bands, of the rows it computes: `halo`)
                let (shape, laxis) = self.laid_here(ops[0], *axis, site.lanes, site.halo);
                let outer = around(&self.laid_here(n, *axis, site.lanes, site.halo).0, laxis).0;
                let inner = around(&shape, laxis).1;
                let whole = shape[laxis] as u32 * inner;
                let part = match (*axis, self.held(n, site)) {
                    (1, Some(r)) => r.len() as u32 * inner,
                    _ => (end - start) as u32 * inner,
                };
                let from = words_at(i64::from(*start as u32 * inner) + self.shift(site, ops[0]))?;
                body.push(nest(
                    &[outer],
                    Instr::Vec {
                        op: VecOp::Mov,
                        dst: at(dst, 0, part, 1, &[part]),
                        srcs: vec![view(args[0], from, part, 1, &[whole])],
                    },
                ));
            }
            Op::Concat { axis: 1 } if self.held(n, site).is_some() => {
                // in bands, each operand's rows among those it computes into their place
                let rows = self.held(n, site).unwrap_or(0..0);
                let inner = self.row_layout(n).map_or(0, |l| l.1);
                let mut off = 0;
                for (&o, &a) in ops.iter().zip(args) {
                    let len = g.ty(o).shape[1] as u32;
                    let (lo, hi) = (rows.start.max(off), rows.end.min(off + len));
                    if lo < hi {
                        // (a one-word operand repeats its word)
                        let stride = u32::from(a.elements() != 1);
                        let from = match stride {
                            0 => 0,
                            _ => {
                                let held = self.held(o, site).unwrap_or(0..len);
                                words_at(i64::from(lo) - i64::from(off + held.start))? * inner
                            }
                        };
                        let words = (hi - lo) * inner;
                        body.push(Instr::Vec {
                            op: VecOp::Mov,
                            dst: at(dst, (lo - rows.start) * inner, words, 1, &[]),
                            srcs: vec![view(a, from, words, stride, &[])],
                        });
                    }
                    off += len;
                }
            }
            Op::Concat { axis } if *axis > 0 => {
                // each operand's rows into their place in each row of the result
                let (shape, axis) = self.laid_here(n, *axis, site.lanes, site.halo);
                let (outer, inner) = around(&shape, axis);
                let whole = shape[axis] as u32 * inner;
                let mut off = 0;
                for (&o, &a) in ops.iter().zip(args) {
                    let part = laid(&g.ty(o).shape, axis).0[axis] as u32 * inner;
                    // a one-word operand repeats its word
                    let stride = u32::from(a.elements() != 1);
                    let from = match stride {
                        0 => 0,
                        _ => words_at(self.shift(site, o))?,
                    };
                    body.push(nest(
                        &[outer],
                        Instr::Vec {
                            op: VecOp::Mov,
                            dst: at(dst, off, part, 1, &[whole]),
                            srcs: vec![view(a, from, part, stride, &[stride * part])],
                        },
                    ));
                    off += part;
                }
            }
            Op::Transpose { perm } if perm.first() == Some(&0) => {
                // the result in the order its axes lie in: a loop over each of them
                // but the last, whose elements are read `stride` apart in the operand
                // (images lie planar: an axis's stride is its place in that order's)
                let (from, to) = (&g.ty(ops[0]).shape, &node.ty.shape);
                let (ri, ro) = (laid_order(from.len()), laid_order(to.len()));
                let si = strides(&laid(from, 0).0);
                let so = strides(&laid(to, 0).0);
                // the operand's stride along the result's `d`th laid axis
                let src = |d: usize| {
                    let a = perm[ro[d]];
                    si[ri.iter().position(|&x| x == a).unwrap_or(0)]
                };
                let last = to.len() - 1;
                let loops: Vec<u32> = (1..last).map(|d| to[ro[d]] as u32).collect();
                let dst_step: Vec<u32> = (1..last).map(|d| so[d]).collect();
                let src_step: Vec<u32> = (1..last).map(src).collect();
                let len = to[ro[last]] as u32;
                body.push(nest(
                    &loops,
                    Instr::Vec {
                        op: VecOp::Mov,
                        dst: at(dst, 0, len, 1, &dst_step),
                        srcs: vec![view(args[0], 0, len, src(last), &src_step)],
                    },
                ));
            }
            _ => {}
        }
        Ok(())
    }
    /// The rows of planar value `o` the code at `site` holds (`halo::held_rows`), in
    /// bands.
    pub(super) fn held(&self, o: NodeIndex, site: &Site) -> Option<std::ops::Range<u32>> {
        let (lanes, lane) = site.lanes;
        let v = self.f.resolve(o);
        // (in `o`'s rows, a view's of the value it views)
        let rows = site.halo.and_then(|h| self.held_rows(v, h, lanes, lane))?;
        Some(self.as_read(v, o, rows))
    }

    /// Where the first row node `site.n` computes starts among the words of operand
    /// `o` it holds, in bands, when it holds other rows of `o` (`halo`); 0 else. Its
    /// rows are `o`'s rows (a slice or concat along another axis: a slice along the
    /// rows adds its start), or, through a reshape, the same words.
    pub(super) fn shift(&self, site: &Site, o: NodeIndex) -> i64 {
        let reshape = matches!(self.g.node(site.n).op, Op::Reshape);
        match (
            self.held(site.n, site),
            self.held(o, site),
            self.row_layout(site.n),
            self.row_layout(o),
        ) {
            (Some(r), Some(from), Some((_, wn)), Some((_, wo))) if reshape => {
                i64::from(r.start * wn) - i64::from(from.start * wo)
            }
            (Some(r), Some(from), Some(_), Some((_, wo))) => {
                (i64::from(r.start) - i64::from(from.start)) * i64::from(wo)
            }
            _ => 0,
        }
    }

    /// `laid` of value `n` as lane `lane` of `lanes` holds it: an image's (or its
    /// pixels regrouped) with the lane's channels (in bands, its channel's rows: its
    /// band, or those its code computes, `halo`).
    pub(super) fn laid_here(
        &self,
        n: NodeIndex,
        axis: usize,
        (lanes, lane): (u32, u32),
        halo: Option<&Halo>,
    ) -> (Vec<usize>, usize) {
        let (mut shape, at) = laid(&self.g.ty(n).shape, axis);
        let v = self.f.resolve(n);
        let rows = match halo {
            Some(h) => self
                .held_rows(v, h, lanes, lane)
                .map(|r| self.as_read(v, n, r)),
            None => self.band_rows(n, lanes, lane),
        };
        if let Some(r) = rows.filter(|_| self.bands(lanes) > 1) {
            // (a channel's band of rows)
            shape[1] = 1;
            shape[2] = r.len();
        } else if let (Some((_, c)), true) = (planes(self.g, n), lanes > 1) {
            shape[1] = split(c, lanes, lane).len();
        } else if let (Some((_, w)), true) = (self.tokens(n), lanes > 1) {
            // (a sequence's share of every token's features)
            shape[2] = split(w, lanes, lane).len();
        }
        (shape, at)
    }
}

/// A word offset worked out from rows (`Vector::shift`), which must not be negative.
pub(super) fn words_at(off: i64) -> Result<u32, String> {
    u32::try_from(off)
        .map_err(|_| format!("a window of rows {off} words before those its lane holds"))
}

/// Whether reshaping `from` into `to` moves words on a lane: the two lie otherwise
/// (one of them rank 4 or more, planar, and not one plane) and one regroups the
/// other's axes (`regroup_strides`).
pub(super) fn relaid(g: &crate::ir::Graph, from: NodeIndex, to: NodeIndex) -> bool {
    let planar = |v: NodeIndex| planes(g, v).is_some_and(|(pixels, c)| pixels > 1 && c > 1);
    (planar(from) || planar(to)) && regroups(&g.ty(from).shape, &g.ty(to).shape)
}

/// `dst = x` reshaped from `from` to `to` (`relaid`): a loop over the axes of the finer
/// shape, the words of each lying `laid_strides` apart in the value of that shape and
/// `regroup_strides` apart in the other.
pub(super) fn regrouped(
    g: &crate::ir::Graph,
    (from, to): (NodeIndex, NodeIndex),
    dst: Val,
    x: Val,
) -> Result<Instr, String> {
    let (a, b) = (&g.ty(from).shape, &g.ty(to).shape);
    let (fine, src, dsts) = match regroup_strides(b, a) {
        Some(st) => (b, st, laid_strides(b)),
        None => {
            let st = regroup_strides(a, b).ok_or("a reshape that regroups no axes")?;
            (a, laid_strides(a), st)
        }
    };
    let r = fine.len();
    let loops: Vec<u32> = fine[1..r - 1].iter().map(|&d| d as u32).collect();
    let len = fine[r - 1] as u32;
    Ok(nest(
        &loops,
        Instr::Vec {
            op: VecOp::Mov,
            dst: at(dst, 0, len, dsts[r - 1], &dsts[1..r - 1]),
            srcs: vec![view(x, 0, len, src[r - 1], &src[1..r - 1])],
        },
    ))
}
