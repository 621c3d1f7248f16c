//! A vector kernel's passes and their levels. A node runs in the forward pass or the
//! backward one (1 when it depends on an output gradient), and within its pass at a
//! level: 0 for what a sample's inputs make as they arrive, one more for what reads a
//! statistic of the batch that the level before sums (a batch norm's mean, then its
//! variance, which sums the squares of the samples less the mean). A level past 0 runs
//! once every sample of the step is in: a task runs it for each sample in turn, from
//! the values of the levels before, which the kernel keeps for every sample (its
//! stash); before it, the step values made from the sums (`mids`: the variance's
//! `1 / sqrt(var + eps)`) are computed once. Step values made from variables alone
//! (inference's `1 / sqrt(moving_var + eps)`) are made at each sample, first.

use super::ops::moves_pixels;
use super::Vector;
use crate::backend::wafer::form::{constant, planes, view_of, Class};
use crate::backend::wafer::lower::elementwise;
use crate::ir::{NodeIndex, Op};
use std::collections::{BTreeMap, BTreeSet};

/// A pass (0 forward, 1 backward) and a level within it.
pub(super) type At = (u8, u8);

/// The passes and levels of a kernel's values (see the module's doc).
pub(super) struct Levels {
    /// Each node's and input's pass and level: where it is computed (a sum over the
    /// batch: where it accumulates).
    pub at: BTreeMap<NodeIndex, At>,
    /// The step values made from its sums that its samples read, in order, each with
    /// the pass and level it is made before.
    pub mids: Vec<(NodeIndex, At)>,
    /// Each pass's deepest level.
    pub deepest: [u8; 2],
    /// In a kernel with levels, whose stash holds every sample of the step: the values
    /// made by elementwise ops or spread from step values, which each pass and level
    /// that reads one computes again from what it reads rather than stash it (a batch
    /// norm's `x - mean`, read in three places, is one subtraction in each; the stash
    /// keeps `x`). An output among them is also computed where it is sent from (a
    /// batch norm's ReLU, whose mask the backward pass reads again from `x`).
    pub recomputed: BTreeSet<NodeIndex>,
    /// The nodes each pass and level computes, in order: those made there, and the
    /// values made elsewhere that it computes again to read them (`recomputed`).
    pub code: BTreeMap<At, Vec<NodeIndex>>,
}

impl Levels {
    /// Whether a pass has levels past the first (it reads a statistic of the batch).
    pub(super) fn deep(&self) -> bool {
        self.deepest != [0, 0]
    }

    /// Where value `o` can be read from: a sum over the batch from the level after the
    /// one it accumulates in; a value computed elsewhere (a variable, the host's) from
    /// the first.
    pub(super) fn avail(&self, v: &Vector, o: NodeIndex) -> At {
        let o = v.f.resolve(o);
        if let Some(&(p, l)) = self.at.get(&o) {
            let sum = v.f.class[o.index()] == Class::Batch && v.nodes().contains(&o);
            return (p, l + u8::from(sum));
        }
        (self.mids.iter())
            .find(|m| m.0 == o)
            .map_or((0, 0), |m| m.1)
    }
}

impl Vector<'_> {
    /// Whether `o` is a step value of this kernel that its samples read, made from its
    /// variables and the host's values (a batch norm's `1 / sqrt(moving_var + eps)`,
    /// made at each sample, as the sample's first code) or from its sums over the batch
    /// (through other such values: made once, before the level that reads them).
    fn mid(&self, o: NodeIndex, memo: &mut BTreeMap<NodeIndex, bool>) -> bool {
        let o = self.f.resolve(o);
        if let Some(&m) = memo.get(&o) {
            return m;
        }
        let kr = &self.f.kernels[self.k];
        let g = self.g;
        let held = |a: NodeIndex| {
            matches!(g.node(a).op, Op::Variable { .. })
                || constant(g, a).is_some()
                || view_of(g, a).is_some()
                || kr.hosts.contains(&a)
        };
        let yes = self.f.class[o.index()] == Class::Step
            && self.f.owner[o.index()] == Some(self.k)
            && !held(o)
            && g.operands(o).into_iter().all(|a| {
                let a = self.f.resolve(a);
                held(a)
                    || (self.f.class[a.index()] == Class::Batch && self.nodes().contains(&a))
                    || self.mid(a, memo)
            });
        memo.insert(o, yes);
        yes
    }

    /// Its values' passes and levels (see the module's doc).
    pub(super) fn levels(&self) -> Levels {
        let g = self.g;
        let f = self.f;
        let mut lv = Levels {
            at: BTreeMap::new(),
            mids: Vec::new(),
            deepest: [0; 2],
            recomputed: BTreeSet::new(),
            code: BTreeMap::new(),
        };
        for p in &self.inputs {
            lv.at.insert(p.node, (u8::from(p.bwd), 0));
        }
        let mut memo = BTreeMap::new();
        // a value's place: where its operands are all there, the latest pass of theirs
        // and the deepest level in it (a value of the other pass is there whole:
        // stashed, or made before)
        let place = |lv: &Levels, n: NodeIndex| {
            (g.operands(n).into_iter())
                .map(|o| lv.avail(self, o))
                .max()
                .unwrap_or((0, 0))
        };
        let mut wanted: BTreeSet<NodeIndex> = BTreeSet::new();
        let mut stack: Vec<NodeIndex> = self.nodes().to_vec();
        while let Some(n) = stack.pop() {
            for o in g.operands(n) {
                let o = f.resolve(o);
                if self.mid(o, &mut memo) && wanted.insert(o) {
                    stack.push(o);
                }
            }
        }
        for &n in self.nodes() {
            // (the mids it reads first, and theirs)
            for o in g.operands(n) {
                self.place_mid(f.resolve(o), &wanted, &mut lv, &place);
            }
            let at = place(&lv, n);
            lv.at.insert(n, at);
        }
        // a forward value only the backward pass reads is computed there, from what
        // it reads (which the backward pass then stashes instead, if anything: one
        // value of the same size, or none, since it reads stashed values)
        let mine: BTreeSet<NodeIndex> = self.nodes().iter().copied().collect();
        for &n in self.nodes().iter().rev() {
            let node = g.node(n);
            if lv.at.get(&n).map(|a| a.0) != Some(0)
                || f.class[n.index()] != Class::Sample
                || !elementwise(&node.op)
                || self.outputs.iter().any(|o| o.node == n)
            {
                continue;
            }
            let mut users =
                g.g.neighbors_directed(n, petgraph::Direction::Outgoing)
                    .peekable();
            let late = users.peek().is_some()
                && users.all(|u| mine.contains(&u) && lv.at.get(&u).map(|a| a.0) == Some(1));
            let small = g.operands(n).iter().all(|&o| {
                let o = f.resolve(o);
                constant(g, o).is_some() || g.ty(o).elements() == node.ty.elements()
            });
            if late && small {
                lv.at.insert(n, (1, 0));
            }
        }
        for &(p, l) in lv.at.values().chain(lv.mids.iter().map(|m| &m.1)) {
            let d = &mut lv.deepest[usize::from(p.min(1))];
            *d = (*d).max(l);
        }
        // (a barrier's elementwise values and step values spread over a sample, and an
        // image's windows and paddings, which overlap: a depthwise convolution's taps
        // would stash its image nine times; an output too, where it is sent from its
        // own place, which computes it as well)
        let deep = lv.deep();
        let has_bwd = self.has_backward();
        lv.recomputed = (self.nodes().iter())
            .copied()
            .filter(|&n| {
                let op = &g.node(n).op;
                let moved = planes(g, n).is_some() && moves_pixels(op, g.ty(n).rank());
                let spread = matches!(op, Op::BroadcastTo | Op::Reshape)
                    && (g.operands(n).iter())
                        .all(|&o| f.class[f.resolve(o).index()] != Class::Sample);
                let sent_elsewhere = (self.outputs.iter()).any(|o| {
                    o.node == n && Some(self.sent_at(o, &lv, has_bwd)) != lv.at.get(&n).copied()
                });
                f.class[n.index()] == Class::Sample
                    && ((deep && (elementwise(op) || spread)) || moved)
                    && !sent_elsewhere
            })
            .collect();
        for pass in 0..=u8::from(has_bwd) {
            for level in 0..=lv.deepest[usize::from(pass)] {
                let code = self.emitted(&lv, (pass, level));
                lv.code.insert((pass, level), code);
            }
        }
        lv
    }

    /// The nodes the code at `at` computes, in order (`Levels::code`): its own, each
    /// after the values it computes again for it, just before their first reader, and
    /// a slice before every reader (so that they die soon: a depthwise convolution's
    /// nine windows, read going forward and again by their taps' gradients, are not
    /// all live at once, only the padded image they are cut from). An output is
    /// computed where it is made, recomputed or not.
    fn emitted(&self, lv: &Levels, at: At) -> Vec<NodeIndex> {
        let mut out = Vec::new();
        let mut done = BTreeSet::new();
        for &n in self.nodes() {
            let output = self.outputs.iter().any(|o| o.node == n);
            if lv.at.get(&n) == Some(&at) && (!lv.recomputed.contains(&n) || output) {
                self.after_recomputed(n, lv, &mut done, &mut out);
            }
        }
        out
    }

    /// Emits `n` into `out` after the recomputed values it reads not emitted yet.
    fn after_recomputed(
        &self,
        n: NodeIndex,
        lv: &Levels,
        done: &mut BTreeSet<NodeIndex>,
        out: &mut Vec<NodeIndex>,
    ) {
        let mut ops: Vec<NodeIndex> = (self.g.operands(n).into_iter())
            .map(|o| self.f.resolve(o))
            .collect();
        ops.dedup();
        for o in ops {
            if lv.recomputed.contains(&o) && (self.sliced(o) || !done.contains(&o)) {
                self.after_recomputed(o, lv, done, out);
            }
        }
        if done.insert(n) || (lv.recomputed.contains(&n) && self.sliced(n)) {
            out.push(n);
        }
    }

    /// Whether `n` is a slice (which a recomputing kernel cuts again for each reader).
    fn sliced(&self, n: NodeIndex) -> bool {
        matches!(self.g.node(n).op, Op::Slice { .. })
    }

    /// Places mid `o` (and the mids it reads first), if it is one not placed yet.
    fn place_mid(
        &self,
        o: NodeIndex,
        wanted: &BTreeSet<NodeIndex>,
        lv: &mut Levels,
        place: &dyn Fn(&Levels, NodeIndex) -> At,
    ) {
        if !wanted.contains(&o) || lv.mids.iter().any(|m| m.0 == o) {
            return;
        }
        for a in self.g.operands(o) {
            self.place_mid(self.f.resolve(a), wanted, lv, place);
        }
        let at = place(lv, o);
        lv.mids.push((o, at));
    }

    /// The passes of its nodes and inputs (`levels`).
    pub(super) fn phases(&self) -> BTreeMap<NodeIndex, u8> {
        (self.levels().at.into_iter())
            .map(|(n, a)| (n, a.0))
            .collect()
    }
}
