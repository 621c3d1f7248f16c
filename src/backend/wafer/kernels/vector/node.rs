//! The code of one node of a vector kernel on a lane.

use super::halo::{part_of, Halo};
use super::moves::{regrouped, relaid, words_at};
use super::ops::*;
use super::pool::pooling;
use super::{Given, Vector};
use crate::backend::wafer::form::{constant, image, planes, view_of, Class};
use crate::backend::wafer::isa::{Instr, Src, VecOp};
use crate::backend::wafer::kernels::nest;
use crate::backend::wafer::kernels::rows;
use crate::backend::wafer::lower::{self, vec, Scratch, Val};
use crate::ir::{NodeIndex, Op, ReduceOp, UnaryOp};
use std::collections::BTreeMap;

impl Vector<'_> {
    /// `acc` (one word a lane: its share's reduction by `op`) made every lane's on
    /// lane `lane` of `lanes` (`rows::across`; nothing on one lane).
    fn together(&self, op: VecOp, acc: Val, (lanes, lane): (u32, u32)) -> Vec<Instr> {
        let c = self.row_colours();
        rows::across(op, acc, (lanes, lane), c)
    }

    /// The value operand `o` has on lane `lane` of `lanes`, if it has one: a constant, a value the lane
    /// has (`cur`), or a view of a variable it holds, in place (one lane's, or the whole,
    /// or a run of channels of which the lane holds its own: a depthwise filter's tap).
    fn operand(
        &self,
        o: NodeIndex,
        (lanes, lane): (u32, u32),
        cur: &BTreeMap<NodeIndex, Val>,
    ) -> Option<Val> {
        let g = self.g;
        let o = self.f.resolve(o);
        if let Some(v) = constant(g, o) {
            return Some(Val::Imm(v));
        }
        let elements = g.ty(o).elements() as u32;
        let view = || match view_of(g, o).and_then(|(v, at)| Some((v, *cur.get(&v)?, at))) {
            Some((v, Val::Buf { base, len, slot }, at))
                if lanes == 1
                    || self.width() == Some(1)
                    || (at == 0
                        && len == elements
                        && self.channel_runs(v, lanes, lane).is_none()) =>
            {
                Some(Val::Buf {
                    base: base + at,
                    len: elements,
                    slot,
                })
            }
            Some((v, Val::Buf { base, slot, .. }, at)) => {
                let runs = self.channel_runs(v, lanes, lane)?;
                let c = self.width()?;
                let mine = runs.first()?.1;
                (elements == c && at % c == 0).then_some(Val::Buf {
                    base: base + at / c * mine,
                    len: mine,
                    slot,
                })
            }
            _ => None,
        };
        cur.get(&o).copied().or_else(view)
    }

    /// The code of one node of the current phase.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn node(
        &self,
        n: NodeIndex,
        (lanes, lane): (u32, u32),
        cur: &mut BTreeMap<NodeIndex, Val>,
        (stash, slot, halo): (&BTreeMap<NodeIndex, (u32, u32)>, u8, Option<&Halo>),
        scratch: &mut Scratch,
        iota: Option<u32>,
        body: &mut Vec<Instr>,
        means: &mut Vec<(Val, f32)>,
        soft: &mut BTreeMap<NodeIndex, Soft>,
    ) -> Result<(), String> {
        let g = self.g;
        let f = self.f;
        let node = g.node(n);
        // (in bands, the rows its readers want: `halo`)
        let rows = halo.and_then(|h| h.rows.get(&n).cloned());
        let ext = match (&rows, self.row_layout(n)) {
            (Some(r), Some((_, words))) => r.len() as u32 * words,
            _ => self.extent(n, lanes, lane),
        };
        let ops = g.operands(n);
        if f.alias[n.index()].is_some() {
            return Ok(());
        }
        let mut args = ops
            .iter()
            .map(|&o| self.operand(o, (lanes, lane), cur))
            .collect::<Option<Vec<Val>>>()
            .ok_or_else(|| {
                format!(
                    "`{}` reads a value its kernel does not have",
                    node.op.name()
                )
            })?;
        if rows.as_ref().is_some_and(|r| r.is_empty()) {
            // (no reader wants a row of it on this lane: a padding's part)
            cur.insert(n, Val::Imm(0.0));
            return Ok(());
        }
        let mut copies = Vec::new();
        if f.class[n.index()] == Class::Batch {
            // (in bands, a sample's share is its band: not the rows past it it holds)
            if let Some(h) = halo {
                let o = f.resolve(ops[0]);
                if let (Some(b), Some((_, words))) =
                    (self.band_rows(o, lanes, lane), self.row_layout(o))
                {
                    let part = (
                        self.band_within(o, h, (lanes, lane)),
                        b.len() as u32 * words,
                    );
                    args[0] = part_of(args[0], part, scratch, body, &mut copies);
                }
            }
            let acc = cur[&n];
            self.batch_sum(n, (lanes, lane), (acc, args[0]), scratch, body, means)?;
            copies.into_iter().for_each(|t| scratch.release(t));
            return Ok(());
        }
        // (in bands, an elementwise op's operands from the rows it computes on)
        if let (Some(h), Some(r), true) = (halo, &rows, lower::elementwise(&node.op)) {
            let entries = self.row_layout(n).map(|l| l.0);
            for (a, &o) in args.iter_mut().zip(&ops) {
                let v = f.resolve(o);
                let from = self
                    .held_rows(v, h, lanes, lane)
                    .map(|r| self.as_read(v, o, r));
                let (Some(from), Some((e, words))) = (from, self.row_layout(o)) else {
                    continue;
                };
                if Some(e) == entries && from != *r {
                    let part = ((r.start - from.start) * words, ext);
                    *a = part_of(*a, part, scratch, body, &mut copies);
                }
            }
        }
        // (a gate of a step's gates: a run of their words, read in place)
        let view = match halo {
            None => self.sliced_in_place(n, (lanes, lane), stash, &args),
            Some(_) => None,
        };
        if let Some(v) = view {
            cur.insert(n, v);
            return Ok(());
        }
        // (a stashed value computed on more rows than its band: computed in scratch,
        // its band then stashed)
        let band = self.band_rows(n, lanes, lane);
        let wider = rows.is_some() && band.is_some() && rows != band;
        let dst = match stash.get(&n) {
            Some(&(base, len)) if !wider => Val::Buf {
                base,
                len,
                slot: Some(slot),
            },
            _ => scratch.alloc(ext),
        };
        cur.insert(n, dst);
        let rank = node.ty.rank();
        let site = Site {
            n,
            lanes: (lanes, lane),
            ext,
            dst,
            args: args.clone(),
            halo,
        };
        // the softmax a log-softmax's gradient takes: its exponentials over their row
        // sums, which it computed
        let of_softmax = ops.first().and_then(|&o| soft.get(&f.resolve(o)).copied());
        if let (Op::Unary(UnaryOp::Exp), Some(Soft { e, s, runs })) = (&node.op, of_softmax) {
            body.extend(normalise(dst, e, s, runs, scratch));
            body.extend(lower::rounded(dst, ext, node.ty.dtype));
            return Ok(());
        }
        match &node.op {
            op if lower::elementwise(op) => {
                let from = ops.first().map_or(node.ty.dtype, |&o| g.ty(o).dtype);
                let mut args = args;
                let spread_out = self.broadcast(&site, &mut args, scratch, body);
                lower::emit(op, dst, &args, ext, (from, node.ty.dtype), body)?;
                for t in spread_out {
                    scratch.release(t);
                }
            }
            op if pooling(op) => self.pooled(&site, halo, scratch, body)?,
            // (on one lane, a regrouping between values that lie otherwise: heads split
            // from a token's features, which lie planar as rank 4, and merged back)
            Op::Reshape if lanes == 1 && relaid(g, ops[0], n) => {
                body.push(regrouped(g, (ops[0], n), dst, args[0])?);
            }
            Op::Reshape => {
                let from = words_at(self.shift(&site, ops[0]))?;
                body.push(mov(at(dst, 0, ext, 1, &[]), at(args[0], from, ext, 1, &[])));
            }
            Op::BroadcastTo => body.push(self.broadcast_to(&site)),
            // a transpose of a batch of scalars keeps them where they are
            Op::Transpose { perm } if perm.len() == 1 => {
                body.push(vec(VecOp::Mov, dst, &args[..1], ext));
            }
            Op::Reduce { op, axes, .. } => {
                self.reduce(&site, (*op, axes), body)?;
            }
            Op::MatMul if lanes == 1 => product(&site, self.g, body)?,
            // (along a sample's last axis as it lies: not an image's channels, which lie
            // a plane apart)
            Op::Softmax { axis } | Op::LogSoftmax { axis }
                if lanes == 1 || (*axis + 1 == rank && !self.across_planes(n)) =>
            {
                self.softmax(&site, *axis, scratch, body, soft)?;
            }
            Op::ArgMax { axis } | Op::ArgMin { axis }
                if *axis + 1 == rank + 1 && !self.across_planes(ops[0]) =>
            {
                self.arg_best(&site, *axis, iota, scratch, body)?;
            }
            Op::Slice { .. } | Op::Concat { .. } | Op::Transpose { .. } if self.movable(n) => {
                self.moved(&site, body)?;
            }
            // (on several lanes, this lane's share of the classes, which its counting
            // buffer counts)
            Op::OneHot { depth } if ext == *depth as u32 || lanes > 1 => {
                let iota = Val::buf(iota.ok_or("no counting buffer")?, ext);
                body.push(vec(VecOp::Eq, dst, &[iota, args[0]], ext));
            }
            other => {
                return Err(format!(
                    "`{}` of {} has no wafer kernel yet",
                    other.name(),
                    node.ty
                ));
            }
        }
        // a half-precision result the op computed in f32 (an elementwise op's is
        // rounded where it is made; a move's words are already)
        let computes = matches!(
            node.op,
            Op::Reduce { .. } | Op::MatMul | Op::Softmax { .. } | Op::LogSoftmax { .. }
        ) || pooling(&node.op);
        if computes {
            body.extend(lower::rounded(dst, ext, node.ty.dtype));
        }
        if let (true, Some(&(base, len)), Some(r), Some(b)) = (wider, stash.get(&n), &rows, &band) {
            let words = self.row_layout(n).map_or(0, |l| l.1);
            let slot = Val::Buf {
                base,
                len,
                slot: Some(slot),
            };
            body.push(mov(
                at(slot, 0, len, 1, &[]),
                at(dst, (b.start - r.start) * words, len, 1, &[]),
            ));
        }
        copies.into_iter().for_each(|t| scratch.release(t));
        Ok(())
    }

    /// The operands of elementwise node `site.n` that it reads over more words than they
    /// have, spread into scratch words of its extent (returned, to release after): an
    /// image's per-channel operands (a bias) over their planes; a sequence's (tokens
    /// one after another, on one lane) value per token (a layer norm's mean) over its
    /// features, or value per feature (a bias) for every token.
    fn broadcast(
        &self,
        site: &Site,
        args: &mut [Val],
        scratch: &mut Scratch,
        body: &mut Vec<Instr>,
    ) -> Vec<Val> {
        let (g, n, ext) = (self.g, site.n, site.ext);
        let mut spread_out = Vec::new();
        if let Some((pixels, _)) = planes(g, n) {
            for (a, o) in args.iter_mut().zip(g.operands(n)) {
                let cl = a.elements();
                // (a value per pixel, one plane: a softmax's sum over attention's keys,
                // which lie a plane apart, repeated for each)
                let per_pixel = g.ty(o).shape.last() == Some(&1) && cl == pixels;
                if per_pixel && cl > 1 && cl < ext {
                    let t = scratch.alloc(ext);
                    body.push(repeat(t, *a, cl, ext / cl));
                    *a = t;
                    spread_out.push(t);
                } else if cl > 1 && cl * pixels == ext {
                    let t = scratch.alloc(ext);
                    body.push(spread(t, *a, cl, pixels));
                    *a = t;
                    spread_out.push(t);
                }
            }
        } else if let Some((tokens, _)) = self.tokens(n) {
            for (a, o) in args.iter_mut().zip(g.operands(n)) {
                let cl = a.elements();
                let given = self.given_to_tokens(o, n).filter(|_| cl > 1 && cl != ext);
                let Some(given) = given else {
                    continue;
                };
                let t = scratch.alloc(ext);
                body.push(over_tokens(t, *a, given, (tokens, ext / tokens.max(1))));
                *a = t;
                spread_out.push(t);
            }
        }
        spread_out
    }

    /// Whether `n` is an image of several pixels, whose last axis (its channels) lies a
    /// plane apart: a softmax or argmax along it has no kernel yet.
    fn across_planes(&self, n: NodeIndex) -> bool {
        image(self.g, self.f.resolve(n)).is_some_and(|(h, w, _)| h * w > 1)
    }

    /// A broadcast within a sample: a step value to every sample alike (its share of
    /// the features, or of an image's channels spread over their planes), a sample's
    /// scalar over its features' share on this lane, or over the sample's axes.
    fn broadcast_to(&self, site: &Site) -> Instr {
        let g = self.g;
        let (n, (lanes, _), ext, dst, args) = site.parts();
        if self.of_step(n) || self.spreads_channels(n) {
            // (a value per channel over its planes: a statistic, a global pooling's
            // gradient)
            return match planes(g, n) {
                Some((pixels, _)) if args[0].elements() * pixels == ext && pixels > 1 => {
                    spread(dst, args[0], args[0].elements(), pixels)
                }
                _ => vec(VecOp::Mov, dst, &args[..1], ext),
            };
        }
        if lanes > 1 && args[0].elements() == 1 {
            return vec(VecOp::Mov, dst, &args[..1], ext);
        }
        if let (Some((t, _)), true) = (self.tokens(n), lanes > 1) {
            if let Some(given) = self.given_to_tokens(g.operands(n)[0], n) {
                return over_tokens(dst, args[0], given, (t, ext / t.max(1)));
            }
        }
        let from = &g.ty(g.operands(n)[0]).shape;
        broadcast(dst, args[0], from, &g.ty(n).shape)
    }

    /// A reduction within a sample (`op` over `axes`): along its features across the
    /// lanes (`rows`), or over runs of its axes on one lane.
    fn reduce(
        &self,
        site: &Site,
        (op, axes): (ReduceOp, &[usize]),
        body: &mut Vec<Instr>,
    ) -> Result<(), String> {
        let (g, f) = (self.g, self.f);
        let (n, (lanes, lane), ext, dst, args) = site.parts();
        let ops = g.operands(n);
        // (over an image's axes as they lie: planar, channel by channel)
        let shape = g.ty(ops[0]).shape.as_slice();
        let laid_axes: Vec<usize> = axes.iter().map(|&a| laid(shape, a).1).collect();
        let (outer, inner, post) = reduced(
            &self.laid_here(ops[0], 0, (lanes, lane), None).0,
            &laid_axes,
        )?;
        let (v, init) = match op {
            ReduceOp::Sum | ReduceOp::Mean => (VecOp::Add, 0.0),
            ReduceOp::Max => (VecOp::Max, f32::NEG_INFINITY),
            ReduceOp::Min => (VecOp::Min, f32::INFINITY),
            ReduceOp::Prod => (VecOp::Mul, 1.0),
        };
        body.push(vec(VecOp::Mov, dst, &[Val::Imm(init)], ext));
        // along the features across the lanes: each lane's share of every row (a
        // sample's, or each token's of a sequence), then every lane's (`rows`)
        let src = f.resolve(ops[0]);
        let across = match (lanes > 1, self.tokens(src)) {
            (true, Some(tw)) if self.along_tokens(n) => Some(tw),
            (true, _) if self.along_rows(n) => Some((1, inner)),
            _ => None,
        };
        if let Some((rows, whole)) = across {
            let share = self.extent(src, lanes, lane) / rows.max(1);
            body.push(reduce_rows(v, dst, args[0], rows, share));
            body.extend(self.together(v, dst, (lanes, lane)));
            if op == ReduceOp::Mean {
                let by = Val::Imm(1.0 / whole as f32);
                body.push(vec(VecOp::Mul, dst, &[dst, by], rows));
            }
            return Ok(());
        }
        if post == 1 {
            body.push(reduce_rows(v, dst, args[0], outer, inner));
        } else {
            // axes in the middle: each run of the axes after them, accumulated
            // into its place, for every entry of the reduced ones
            body.push(reduce_middle(v, dst, args[0], (outer, inner, post)));
        }
        if op == ReduceOp::Mean {
            body.push(vec(
                VecOp::Mul,
                dst,
                &[dst, Val::Imm(1.0 / inner as f32)],
                ext,
            ));
        }
        Ok(())
    }

    /// A softmax (or log-softmax) along a sample's last axis: on one lane row by row, or
    /// across the lanes (`across`: each its share of the features).
    fn softmax(
        &self,
        site: &Site,
        axis: usize,
        scratch: &mut Scratch,
        body: &mut Vec<Instr>,
        soft: &mut BTreeMap<NodeIndex, Soft>,
    ) -> Result<(), String> {
        let g = self.g;
        let (n, (lanes, lane), ext, dst, args) = site.parts();
        let node = g.node(n);
        let ops = g.operands(n);
        // (on one lane, along its axis as it lies: the runs around it; on several, this
        // lane's share of a sample's features: the lanes reduce together, `rows`)
        let runs = match lanes {
            1 => {
                let (shape, at) = self.laid_here(ops[0], axis, (1, 0), None);
                reduced(&shape, &[at])?
            }
            _ => (1, ext, 1),
        };
        let rows = runs.0 * runs.2;
        let x = args[0];
        let m = scratch.alloc(rows);
        body.push(vec(VecOp::Mov, m, &[Val::Imm(f32::NEG_INFINITY)], rows));
        body.push(reduce_run(VecOp::Max, m, x, runs));
        body.extend(self.together(VecOp::Max, m, (lanes, lane)));
        // t = x - m, row by row
        body.push(per_run(VecOp::Sub, dst, x, m, runs));
        let e = scratch.alloc(ext);
        body.push(vec(VecOp::Exp, e, &[dst], ext));
        let s = scratch.alloc(rows);
        body.push(vec(VecOp::Mov, s, &[Val::Imm(0.0)], rows));
        body.push(reduce_run(VecOp::Add, s, e, runs));
        body.extend(self.together(VecOp::Add, s, (lanes, lane)));
        if matches!(node.op, Op::LogSoftmax { .. }) {
            let ls = scratch.alloc(rows);
            body.push(vec(VecOp::Log, ls, &[s], rows));
            body.push(per_run(VecOp::Sub, dst, dst, ls, runs));
            soft.insert(n, Soft { e, s, runs });
        } else {
            body.extend(normalise(dst, e, s, runs, scratch));
        }
        Ok(())
    }

    /// The position of the largest (or smallest) of a sample's features along its last
    /// axis: on one lane row by row, or across the lanes (`across`).
    fn arg_best(
        &self,
        site: &Site,
        axis: usize,
        iota: Option<u32>,
        scratch: &mut Scratch,
        body: &mut Vec<Instr>,
    ) -> Result<(), String> {
        let (g, f) = (self.g, self.f);
        let (n, (lanes, lane), ext, dst, args) = site.parts();
        let node = g.node(n);
        let ops = g.operands(n);
        // the positions of a sample's features: `whole` of them, `inner` on
        // this lane (its share on several: the lanes reduce together, and its
        // counting buffer counts from its share's first)
        let (outer, whole) = rows(g.ty(ops[0]).shape.as_slice(), &[axis])?;
        let inner = match lanes {
            1 => whole,
            _ => self.extent(f.resolve(ops[0]), lanes, lane),
        };
        let max = matches!(node.op, Op::ArgMax { .. });
        let x = args[0];
        let m = scratch.alloc(outer);
        let (best, init) = if max {
            (VecOp::Max, f32::NEG_INFINITY)
        } else {
            (VecOp::Min, f32::INFINITY)
        };
        body.push(vec(VecOp::Mov, m, &[Val::Imm(init)], outer));
        body.push(reduce_rows(best, m, x, outer, inner));
        body.extend(self.together(best, m, (lanes, lane)));
        // the first position holding it: min over (x == m ? i : whole)
        let hit = scratch.alloc(outer * inner);
        body.push(per_row(VecOp::Eq, hit, x, m, outer, inner));
        let iota = Val::buf(iota.ok_or("no counting buffer")?, inner);
        for r in 0..outer {
            let row = |v: Val| match v {
                Val::Buf { base, len, slot } if len > 1 => Val::Buf {
                    base: base + r * inner,
                    len: inner,
                    slot,
                },
                v => v,
            };
            body.push(vec(
                VecOp::Sel,
                row(hit),
                &[row(hit), iota, Val::Imm(whole as f32)],
                inner,
            ));
        }
        body.push(vec(VecOp::Mov, dst, &[Val::Imm(whole as f32)], ext));
        body.push(reduce_rows(VecOp::Min, dst, hit, outer, inner));
        body.extend(self.together(VecOp::Min, dst, (lanes, lane)));
        Ok(())
    }

    /// A sum over the batch (node `n`, accumulated in `acc`): this sample's share `x`,
    /// reduced over the sample's own axes first.
    fn batch_sum(
        &self,
        n: NodeIndex,
        (lanes, lane): (u32, u32),
        (acc, x): (Val, Val),
        scratch: &mut Scratch,
        body: &mut Vec<Instr>,
        means: &mut Vec<(Val, f32)>,
    ) -> Result<(), String> {
        let g = self.g;
        let node = g.node(n);
        let ops = g.operands(n);
        let args = [x];
        // a sum over the batch: this sample's share, reduced over the sample's own
        // axes first
        let Op::Reduce { op, axes, .. } = &node.op else {
            return Err(format!("`{}` over the batch", node.op.name()));
        };
        let src = ops[0];
        let per = self.extent(src, lanes, lane);
        // (on several lanes, each its share of every token's features)
        let tokens = (self.tokens(src))
            .map(|(t, _)| (t, per / t.max(1)))
            .filter(|&(_, share)| acc.elements() == share && axes.as_slice() == [0, 1]);
        let part = if per == acc.elements() {
            args[0]
        } else if let Some((tokens, width)) = tokens {
            // a sequence's tokens (one after another) summed feature by feature
            let t = scratch.alloc(width);
            body.push(vec(VecOp::Mov, t, &[Val::Imm(0.0)], width));
            body.push(reduce_middle(VecOp::Add, t, args[0], (1, tokens, width)));
            t
        } else if acc.elements() == 1 || per.is_multiple_of(acc.elements()) {
            // over the whole sample, or (an image) over each channel's plane
            let rows = acc.elements();
            let t = scratch.alloc(rows);
            body.push(vec(VecOp::Mov, t, &[Val::Imm(0.0)], rows));
            body.push(reduce_rows(VecOp::Add, t, args[0], rows, per / rows));
            t
        } else {
            return Err(format!(
                "a sum over the batch and some of a sample's axes ({axes:?})"
            ));
        };
        body.push(vec(VecOp::Add, acc, &[acc, part], acc.elements()));
        if *op == ReduceOp::Mean {
            let count = g.ty(src).elements() / g.ty(n).elements().max(1);
            means.push((acc, 1.0 / count as f32));
        }
        Ok(())
    }
}

/// `v` given (`given`) to every word of a lane's share of a sequence, `tokens` tokens of
/// `share` features each, into `t`: a value per token spread over its features, or the
/// lane's share of a value per feature repeated for every token.
fn over_tokens(t: Val, v: Val, given: Given, (tokens, share): (u32, u32)) -> Instr {
    match given {
        Given::PerToken => spread(t, v, tokens, share),
        Given::PerFeature => repeat(t, v, share, tokens),
    }
}

/// A product of two of a sample's values on one lane (attention's `q k^T` and `p v`,
/// and their gradients), each read as it lies (`laid_strides`): for each entry of the
/// axes between the batch and the matrices' (a head's), each row `i` of the left and
/// each of its columns `k`, the result's row `i` gains `a[i, k]` times `b`'s row `k`.
fn product(site: &Site, g: &crate::ir::Graph, body: &mut Vec<Instr>) -> Result<(), String> {
    let (n, _, ext, dst, args) = site.parts();
    let ops = g.operands(n);
    let (sa, sb, so) = (&g.ty(ops[0]).shape, &g.ty(ops[1]).shape, &g.ty(n).shape);
    let r = so.len();
    if sa.len() != r || sb.len() != r || r < 3 {
        return Err(format!(
            "a product of {} by {} has no wafer kernel yet",
            g.ty(ops[0]),
            g.ty(ops[1])
        ));
    }
    let (ta, tb, to) = (laid_strides(sa), laid_strides(sb), laid_strides(so));
    // (an operand of one entry along an axis the other has more of is read again)
    let along = |shape: &[usize], st: &[u32], ax: usize| if shape[ax] == 1 { 0 } else { st[ax] };
    let (mut loops, mut da, mut db, mut dd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for ax in 1..r - 2 {
        loops.push(so[ax] as u32);
        da.push(along(sa, &ta, ax));
        db.push(along(sb, &tb, ax));
        dd.push(to[ax]);
    }
    // rows, then the inner index
    loops.extend([so[r - 2] as u32, sa[r - 1] as u32]);
    da.extend([ta[r - 2], ta[r - 1]]);
    db.extend([0, tb[r - 2]]);
    dd.extend([to[r - 2], 0]);
    let cols = so[r - 1] as u32;
    body.push(vec(VecOp::Mov, dst, &[Val::Imm(0.0)], ext));
    let acc = at(dst, 0, cols, to[r - 1], &dd);
    body.push(nest(
        &loops,
        Instr::Vec {
            op: VecOp::Fmac,
            dst: acc.clone(),
            srcs: vec![
                Src::V(acc),
                view(args[0], 0, cols, 0, &da),
                view(args[1], 0, cols, tb[r - 1], &db),
            ],
        },
    ));
    Ok(())
}

/// A node's place in a lane's code: the node, the lane of how many, its elements on
/// the lane, where its value goes and its operands' values.
pub(super) struct Site<'h> {
    pub(super) n: NodeIndex,
    pub(super) lanes: (u32, u32),
    pub(super) ext: u32,
    pub(super) dst: Val,
    pub(super) args: Vec<Val>,
    /// In bands, the rows of its images the code holds (`halo`), when its lanes
    /// exchange halos.
    pub(super) halo: Option<&'h Halo>,
}

impl Site<'_> {
    /// Its node, lane of how many, elements, place and operands, to unpack at once.
    pub(super) fn parts(&self) -> (NodeIndex, (u32, u32), u32, Val, &[Val]) {
        (self.n, self.lanes, self.ext, self.dst, &self.args)
    }
}
