//! Heads dealt to lanes. A kernel of multi-head attention (a sequence's features split
//! into `h` heads, `[B, T, h, d]`, and merged back) runs on `L` lanes that divide `h`:
//! lane `l` holds heads `l h/L .. (l + 1) h/L` of every value that has them, and works
//! them as one lane would a model of `h/L` heads (its `local` graph, the same nodes of
//! smaller types), since heads never meet within attention. A value is dealt along one
//! axis (`Deal`): the axis of its heads, or of its features where those are heads'
//! (`[B, T, h d]`), in `groups` equal runs each dealt alike (the fused projection's
//! `q | k | v`: lane `l` holds its heads of each). A value with no deal (the padding
//! mask, `[B, 1, 1, T]`) is whole on every lane. The layers on either side deal their
//! features so too: the one before sends row `l` its heads of each group (its columns
//! regrouped, `Dense::groups`), the one after takes lane `l`'s share of the merged
//! context as its column `l`'s inputs.
//!
//! A recurrent step's gates are dealt alike (`gate_seeds`): with no head reshape, a
//! sample's features `[B, N]` sliced into equal runs (the gates of `x W + b`) make as
//! many heads as a gate has units, each sliced value dealt in as many groups as it has
//! gates, so that lane `l` holds its units of every gate. The views of variables that
//! its nodes read in place (`form::view_of`: a GRU's bias rows) are dealt with their
//! variables, whose lanes hold their shares.

use super::ops::laid_order;
use super::{Lane, Vector};
use crate::backend::wafer::form::{constant, view_of, Class, End, Kind};
use crate::backend::wafer::lower;
use crate::ir::{Graph, NodeIndex, Op};
use std::collections::BTreeMap;

/// How a value is dealt to a heads kernel's lanes: along `axis`, whose entries are
/// `groups` equal runs, each split evenly over the lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deal {
    pub axis: usize,
    pub groups: u32,
}

/// A heads kernel's head count and how each of its values is dealt (a value absent is
/// whole on every lane).
#[derive(Debug, Clone, PartialEq)]
pub struct Heads {
    pub count: u32,
    /// Whether they are gates (`gate_seeds`), each unit a head: the layers on either
    /// side are over a sample's features (`[B, N]`), not over tokens.
    pub gates: bool,
    pub deal: BTreeMap<NodeIndex, Deal>,
}

/// A lane of a heads kernel as its local program sees it: the graph whose types it
/// has, which lane of how many, and the heads analysis.
#[derive(Debug, Clone)]
pub struct Dealt<'a> {
    pub global: &'a Graph,
    pub heads: Heads,
    pub lanes: u32,
    pub lane: u32,
}

/// Why a kernel deals no heads (none of its reshapes splits heads, or a value could not
/// be dealt consistently): not an error, the kernel runs on one lane.
type NoHeads = ();

impl Vector<'_> {
    /// Its heads analysis, if it is a heads kernel (worked out once).
    pub fn heads(&self) -> Option<&Heads> {
        if self.dealt.is_some() {
            return None;
        }
        self.heads_memo
            .get_or_init(|| self.find_heads().ok())
            .as_ref()
    }

    /// Lane `lane` of `lanes` of heads kernel `h`: the one lane of its local view, a
    /// vector kernel over the lane's local graph (`Heads::local`).
    pub(super) fn dealt_lane(&self, h: &Heads, lanes: u32, lane: u32) -> Result<Lane, String> {
        let local = (h.local(self.g, self.f, lanes))
            .ok_or_else(|| format!("{} heads do not split over {lanes} lanes", h.count))?;
        let v = Vector {
            g: &local,
            f: self.f,
            k: self.k,
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            window: self.window,
            fifo: self.fifo,
            rows: None,
            halo: None,
            across: self.across,
            widths: Default::default(),
            heads_memo: Default::default(),
            dealt: Some(Dealt {
                global: self.g,
                heads: h.clone(),
                lanes,
                lane,
            }),
        };
        v.build(1, 0, None)
    }

    /// The groups of its input from the layer before (`Deal::groups` of that layer's
    /// output), when it deals heads: the layer's columns regroup so.
    pub fn input_groups(&self) -> Option<u32> {
        let h = self.heads()?;
        let layer = self.k.checked_sub(1)?;
        let Kind::Dense { fwd, .. } = self.f.kernels[layer].kind else {
            return None;
        };
        h.deal.get(&self.f.resolve(fwd)).map(|d| d.groups)
    }

    /// The analysis: the head count from the reshapes that split (or merge) a
    /// sequence's features into heads, then every value's deal by its ops' rules, to a
    /// fixed point; then each stream's deal checked against what its other end sends.
    fn find_heads(&self) -> Result<Heads, NoHeads> {
        let (g, f) = (self.g, self.f);
        let b = f.batch as usize;
        let mut count = None;
        let mut deal = BTreeMap::new();
        for &n in self.nodes() {
            if !matches!(g.node(n).op, Op::Reshape) {
                continue;
            }
            let (a, o) = (&g.ty(g.operands(n)[0]).shape, &g.ty(n).shape);
            let heads = match (a.as_slice(), o.as_slice()) {
                (&[b0, t, w], &[b1, t1, h, d]) | (&[b0, t, h, d], &[b1, t1, w])
                    if b0 == b && b1 == b && t == t1 && w == h * d && h > 1 =>
                {
                    h
                }
                _ => continue,
            };
            if count.is_some_and(|c| c != heads) {
                return Err(());
            }
            count = Some(heads);
            deal.insert(n, Deal { axis: 2, groups: 1 });
        }
        // (no heads: gates, equal slices of a product's features, as a recurrent step's)
        let (count, gates) = match count {
            Some(c) => (c as u32, false),
            None => {
                let seeds = self.gate_seeds();
                let (units, seeds) = seeds.ok_or(())?;
                deal.extend(seeds);
                (units, true)
            }
        };
        let kr = &f.kernels[self.k];
        let mut nodes: Vec<NodeIndex> = (self.nodes().iter().chain(&kr.steps)).copied().collect();
        // (and the views of variables its nodes read in place, reshapes and slices of
        // a variable's words, which the lane reads from its share of the variable: a
        // GRU's bias rows, `view_of`)
        for i in 0..nodes.len() {
            for o in g.operands(nodes[i]) {
                let mut v = o;
                while matches!(g.node(v).op, Op::Reshape | Op::Slice { .. })
                    && view_of(g, v).is_some()
                {
                    if !nodes.contains(&v) {
                        nodes.push(v);
                    }
                    v = g.operands(v)[0];
                }
            }
        }
        // (a value passed on, past the kernel: its features dealt as the layers on
        // either side deal theirs)
        if let Some(c) = f.passed(self.k) {
            for x in std::iter::once(c.x).chain(c.grad) {
                let x = f.resolve(x);
                let axis = g.ty(x).rank().checked_sub(1).ok_or(())?;
                deal.insert(x, Deal { axis, groups: 1 });
            }
        }
        // a step node replaces its variable: the two deal alike
        let commits: Vec<(NodeIndex, NodeIndex)> = (kr.commits.iter())
            .filter_map(|(name, s)| Some((f.resolve(*s), g.variable(name)?)))
            .collect();
        let mut heads = Heads { count, gates, deal };
        for _ in 0..=nodes.len() {
            let mut changed = false;
            for &n in &nodes {
                changed |= heads.relate(g, f, (n, &nodes))?;
            }
            for &(s, v) in &commits {
                changed |= heads.same(s, v)?;
            }
            if !changed {
                self.check_streams(&heads)?;
                return Ok(heads);
            }
        }
        Err(())
    }

    /// The gates of a kernel that slices a sample's features into equal runs (a
    /// recurrent step's `x W + b` and `h U + b` cut into its gates): the units a gate
    /// has, and each sliced value dealt in as many groups as it has gates, so that lane
    /// `l` holds its units of every gate. `None` when no value is sliced so, or two are
    /// sliced into gates of other sizes.
    fn gate_seeds(&self) -> Option<(u32, Vec<(NodeIndex, Deal)>)> {
        let (g, f) = (self.g, self.f);
        let nodes = self.nodes();
        let mut runs: BTreeMap<NodeIndex, Vec<(usize, usize)>> = BTreeMap::new();
        for &n in nodes {
            let Op::Slice {
                axis: 1,
                start,
                end,
            } = g.node(n).op
            else {
                continue;
            };
            let o = f.resolve(g.operands(n)[0]);
            let sample = matches!(f.class[o.index()], Class::Sample);
            if sample && g.ty(o).rank() == 2 {
                runs.entry(o).or_default().push((start, end));
            }
        }
        let mut units = None;
        let mut seeds = Vec::new();
        for (o, rs) in runs {
            let size = rs[0].1 - rs[0].0;
            let whole = g.ty(o).shape[1];
            let even = rs
                .iter()
                .all(|&(a, b)| b - a == size && a.is_multiple_of(size));
            if size == 0 || !even || !whole.is_multiple_of(size) || whole == size {
                return None;
            }
            if units.is_some_and(|u| u != size) {
                return None;
            }
            units = Some(size);
            seeds.push((
                o,
                Deal {
                    axis: 1,
                    groups: (whole / size) as u32,
                },
            ));
        }
        Some((units? as u32, seeds))
    }

    /// Whether each stream's deal agrees with its other end: a sequence from or to a
    /// layer dealt along its features, in one group but the layer before's input and
    /// its gradient (which agree); nothing dealt to the host.
    fn check_streams(&self, h: &Heads) -> Result<(), NoHeads> {
        let f = self.f;
        let last = |n: NodeIndex| self.g.ty(n).rank().checked_sub(1);
        let before = self.k.checked_sub(1).and_then(|l| match f.kernels[l].kind {
            Kind::Dense { fwd, .. } => Some(f.resolve(fwd)),
            _ => None,
        });
        let groups = before.and_then(|x| h.deal.get(&x)).map(|d| d.groups);
        // (a layer of several products sums its parts' columns into its own by place:
        // its columns stay plain; a side part's outputs, beside the layer's, are
        // dealt in its groups too)
        let layer_before = self.k.checked_sub(1).map(|l| &f.kernels[l].kind);
        let parts = layer_before.is_some_and(|kind| match kind {
            Kind::Dense { more, .. } => more.iter().any(|p| !p.beside()),
            Kind::Vector { .. } => false,
        });
        let beside = |n: NodeIndex| match layer_before {
            Some(Kind::Dense { more, .. }) => more.iter().any(|p| {
                p.beside() && (f.resolve(p.out) == n || p.dy.map(|d| f.resolve(d)) == Some(n))
            }),
            _ => false,
        };
        if parts && groups.is_some_and(|g| g > 1) {
            return Err(());
        }
        // (a layer on either side over tokens, which deals each token's features as
        // its lanes do: not one that reads the sequence flattened)
        let over_tokens = |j: usize| match f.kernels[j].kind {
            Kind::Dense { x, fwd, .. } => {
                let rank = self.g.ty(if j > self.k { x } else { fwd }).rank();
                rank == 3 || (h.gates && rank == 2)
            }
            Kind::Vector { .. } => false,
        };
        // (or, for gates, a recurrent step's state carried past the layer between two
        // steps' gates, which its rows pass on as they deal their features)
        let ends_over_tokens = |s: &crate::backend::wafer::form::Stream| {
            let ours = s.from == End::Kernel(self.k);
            let ends = match ours {
                true => s.to.clone(),
                false => vec![s.from],
            };
            let carried = |j: usize| match ours {
                true => f.carried(s.node, j),
                false => f.carried(s.node, self.k),
            };
            ends.iter().all(|e| match e {
                End::Kernel(j) => over_tokens(*j) || (h.gates && carried(*j)),
                End::Host => true,
            })
        };
        for s in &f.streams {
            let n = f.resolve(s.node);
            let d = h.deal.get(&n).copied();
            let ours = s.from == End::Kernel(self.k);
            if !ours && !s.to.contains(&End::Kernel(self.k)) {
                continue;
            }
            let from_host = s.from == End::Host;
            let to_host = ours && s.to.contains(&End::Host);
            let ok = match d {
                None => from_host,
                Some(_) if to_host => false,
                Some(_) if from_host => true,
                Some(d) => {
                    let along = Some(d.axis) == last(n);
                    // the layer before's input and its gradient back, in its groups
                    let to_before = ours && s.bwd;
                    along
                        && ends_over_tokens(s)
                        && (d.groups == 1
                            || ((Some(n) == before || to_before || beside(n))
                                && Some(d.groups) == groups))
                }
            };
            if !ok {
                return Err(());
            }
        }
        Ok(())
    }

    /// The lane's share of value `n` as runs of its flat (laid) words: a sample's, or a
    /// variable's or sum's (`None` when `n` is whole on every lane).
    pub(super) fn dealt_runs(&self, n: NodeIndex) -> Option<(u32, Vec<(u32, u32)>)> {
        let d = self.dealt.as_ref()?;
        let n = self.f.resolve(n);
        let deal = *d.heads.deal.get(&n)?;
        let shape = &d.global.ty(n).shape;
        let sample = matches!(self.f.class[n.index()], Class::Sample | Class::SampleT);
        // the axes as they lie, a sample's without its batch
        let (laid, at) = match sample {
            true => {
                let order = laid_order(shape.len());
                let at = order.iter().position(|&a| a == deal.axis)?.checked_sub(1)?;
                let laid: Vec<usize> = order[1..].iter().map(|&a| shape[a]).collect();
                (laid, at)
            }
            false => (shape.to_vec(), deal.axis),
        };
        let outer: usize = laid[..at].iter().product();
        let inner: usize = laid[at + 1..].iter().product();
        let size = laid[at];
        let group = size / deal.groups as usize;
        let share = group / d.lanes as usize;
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for o in 0..outer {
            for q in 0..deal.groups as usize {
                let start = (o * size + q * group + d.lane as usize * share) * inner;
                let len = share * inner;
                match runs.last_mut() {
                    Some(r) if (r.0 + r.1) as usize == start => r.1 += len as u32,
                    _ => runs.push((start as u32, len as u32)),
                }
            }
        }
        Some(((outer * size * inner) as u32, runs))
    }
}

impl Heads {
    /// The graph a lane of `lanes` works on: every dealt value's type with its dealt
    /// axis's share, a slice along it cut to the lane's groups; `None` when a dealt axis
    /// does not split evenly.
    pub fn local(
        &self,
        g: &Graph,
        f: &crate::backend::wafer::form::Formed,
        lanes: u32,
    ) -> Option<Graph> {
        let lanes = lanes as usize;
        if !(self.count as usize).is_multiple_of(lanes) {
            return None;
        }
        let mut local = g.clone();
        for (&n, d) in &self.deal {
            let size = g.ty(n).shape[d.axis];
            if !size.is_multiple_of(d.groups as usize * lanes) {
                return None;
            }
        }
        let nodes: Vec<NodeIndex> = g.g.node_indices().collect();
        for n in nodes {
            // (a node dealt, or one that names such a value of its shape)
            let r = f.resolve(n);
            let same = g.ty(n).shape == g.ty(r).shape;
            let deal = (self.deal.get(&n)).or_else(|| self.deal.get(&r).filter(|_| same));
            if let Some(d) = deal {
                *local.g[n].ty.shape.get_mut(d.axis)? /= lanes;
            }
            // a slice along its operand's dealt axis: the lane's groups of it
            let Op::Slice { axis, start, end } = g.node(n).op else {
                continue;
            };
            let src = f.resolve(g.operands(n)[0]);
            if self.deal.get(&src).is_some_and(|d| d.axis == axis) {
                local.g[n].op = Op::Slice {
                    axis,
                    start: start / lanes,
                    end: end / lanes,
                };
            }
        }
        Some(local)
    }

    /// `a` and `b` dealt alike: whichever is known given to the other. Whether that
    /// changed anything; an error when both are known and differ.
    fn same(&mut self, a: NodeIndex, b: NodeIndex) -> Result<bool, NoHeads> {
        self.link(a, b, Some)
    }

    /// `b`'s deal is `map` of `a`'s (and `a`'s the inverse of `b`'s, where `map` is one
    /// to one on axes: callers pass maps that are).
    fn link(
        &mut self,
        a: NodeIndex,
        b: NodeIndex,
        map: impl Fn(Deal) -> Option<Deal>,
    ) -> Result<bool, NoHeads> {
        match (self.deal.get(&a).copied(), self.deal.get(&b).copied()) {
            (Some(da), Some(db)) => match map(da) == Some(db) {
                true => Ok(false),
                false => Err(()),
            },
            (Some(da), None) => {
                let db = map(da).filter(|d| d.groups > 0).ok_or(())?;
                self.deal.insert(b, db);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Whether `n` is dealt.
    fn has(&self, n: NodeIndex) -> bool {
        self.deal.contains_key(&n)
    }

    /// Node `n`'s rule, applied both ways between it and its operands where it can be:
    /// whether it changed a deal; an error when a dealt value meets an op that would
    /// mix heads (a reduction or a product along its dealt axis, an op with no rule).
    fn relate(
        &mut self,
        g: &Graph,
        f: &crate::backend::wafer::form::Formed,
        (n, inside): (NodeIndex, &[NodeIndex]),
    ) -> Result<bool, NoHeads> {
        // each operand by the value it names, but one whose own shape is not that
        // value's (a reshape that keeps its operand's words: `form`'s alias) by its own
        // node, so that the rules read its own axes: dealt, it must be one of the
        // kernel's nodes, whose reshape rule links it to the value
        let own = |o: NodeIndex| {
            let v = f.resolve(o);
            if g.ty(o).shape == g.ty(v).shape {
                v
            } else {
                o
            }
        };
        let ops: Vec<NodeIndex> = g.operands(n).iter().map(|&o| own(o)).collect();
        let changed = self.rule(g, n, &ops)?;
        let stray = |o: &NodeIndex| f.resolve(*o) != *o && !inside.contains(o) && self.has(*o);
        if ops.iter().any(stray) {
            return Err(());
        }
        Ok(changed)
    }

    /// The rule of node `n`'s op over operands `ops` (see `relate`).
    fn rule(&mut self, g: &Graph, n: NodeIndex, ops: &[NodeIndex]) -> Result<bool, NoHeads> {
        let node = g.node(n);
        let so = &node.ty.shape;
        let r = so.len();
        let mut changed = false;
        match &node.op {
            op if lower::elementwise(op) || matches!(op, Op::BroadcastTo) => {
                changed |= self.spread_rule(g, (n, ops))?;
            }
            Op::Reshape => {
                let (a, o) = (ops[0], n);
                let (sa, sb) = (&g.ty(a).shape, so);
                let map = |from: &[usize], to: &[usize], d: Deal| -> Option<Deal> {
                    let pre: usize = from[..d.axis].iter().product();
                    let tail: usize = from[d.axis..].iter().product();
                    (0..to.len())
                        .find(|&b| {
                            to[..b].iter().product::<usize>() == pre
                                && to[b..].iter().product::<usize>() == tail
                                && to[b] > 1
                        })
                        .filter(|&b| d.groups == 1 || to[b] == from[d.axis])
                        .map(|b| Deal {
                            axis: b,
                            groups: d.groups,
                        })
                };
                changed |= self.link(a, o, |d| map(sa, sb, d))?;
                changed |= self.link(o, a, |d| map(sb, sa, d))?;
            }
            Op::Transpose { perm } => {
                let p = perm.clone();
                changed |= self.link(ops[0], n, |d| {
                    let axis = p.iter().position(|&x| x == d.axis)?;
                    Some(Deal { axis, ..d })
                })?;
                changed |= self.link(n, ops[0], |d| {
                    Some(Deal {
                        axis: *p.get(d.axis)?,
                        ..d
                    })
                })?;
            }
            Op::Slice { axis, start, end } => {
                changed |= self.slice_rule(g, (n, ops), *axis, *start, *end)?;
            }
            Op::Concat { axis } => {
                changed |= self.concat_rule(g, (n, ops), *axis)?;
            }
            Op::MatMul if r >= 3 => {
                changed |= self.product_rule(g, (n, ops))?;
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                let axis = *axis;
                let keep = |d: Deal| (d.axis != axis).then_some(d);
                changed |= self.link(ops[0], n, keep)?;
                changed |= self.link(n, ops[0], keep)?;
            }
            Op::Reduce {
                axes, keep_dims, ..
            } => {
                changed |= self.reduce_rule((n, ops), axes, *keep_dims)?;
            }
            _ => {
                if self.has(n) || ops.iter().any(|o| self.has(*o)) {
                    return Err(());
                }
            }
        }
        Ok(changed)
    }

    /// Spread alike: right-aligned operands of the same extent along the dealt axis
    /// deal alike, those of one entry there (or without it) are whole (elementwise
    /// ops, `broadcast_to`).
    fn spread_rule(
        &mut self,
        g: &Graph,
        (n, ops): (NodeIndex, &[NodeIndex]),
    ) -> Result<bool, NoHeads> {
        let so = &g.ty(n).shape;
        let r = so.len();
        let mut changed = false;
        let aligned = |o: NodeIndex, axis: usize| -> Option<usize> {
            let ro = g.ty(o).rank();
            let a = axis.checked_sub(r - ro.min(r))?;
            (g.ty(o).shape[a] == so[axis] && so[axis] > 1).then_some(a)
        };
        // the deal, from the node or an operand that has it
        let known = self.deal.get(&n).copied().or_else(|| {
            ops.iter().find_map(|&o| {
                let d = *self.deal.get(&o)?;
                let shift = r.checked_sub(g.ty(o).rank())?;
                Some(Deal {
                    axis: d.axis + shift,
                    groups: d.groups,
                })
            })
        });
        let Some(d) = known else {
            return Ok(false);
        };
        changed |= self.link_to(n, d)?;
        for &o in ops {
            if constant(g, o).is_some() && g.ty(o).elements() == 1 {
                continue;
            }
            match aligned(o, d.axis) {
                Some(a) => {
                    let od = Deal {
                        axis: a,
                        groups: d.groups,
                    };
                    changed |= self.link_to(o, od)?;
                }
                None if self.has(o) => return Err(()),
                None => {}
            }
        }
        Ok(changed)
    }

    /// A slice: along another axis dealt alike; along the dealt one, whole groups of it.
    fn slice_rule(
        &mut self,
        g: &Graph,
        (n, ops): (NodeIndex, &[NodeIndex]),
        axis: usize,
        start: usize,
        end: usize,
    ) -> Result<bool, NoHeads> {
        let mut changed = false;
        let whole = g.ty(ops[0]).shape[axis];
        changed |= self.link(ops[0], n, |d| {
            if d.axis != axis {
                return Some(d);
            }
            let group = whole / d.groups as usize;
            let even = group > 0 && start.is_multiple_of(group) && end.is_multiple_of(group);
            even.then(|| Deal {
                axis,
                groups: ((end - start) / group) as u32,
            })
        })?;
        changed |= self.link(n, ops[0], |d| {
            if d.axis != axis {
                return Some(d);
            }
            let group = (end - start) / d.groups as usize;
            let even = group > 0 && start.is_multiple_of(group) && whole.is_multiple_of(group);
            even.then(|| Deal {
                axis,
                groups: (whole / group) as u32,
            })
        })?;
        Ok(changed)
    }

    /// A concat: along the dealt axis, each operand so many groups of one size (the
    /// zeros the slices' gradients pad with among them); along another, dealt
    /// alike.
    fn concat_rule(
        &mut self,
        g: &Graph,
        (n, ops): (NodeIndex, &[NodeIndex]),
        axis: usize,
    ) -> Result<bool, NoHeads> {
        let so = &g.ty(n).shape;
        let mut changed = false;
        // the size of a group: from the result, or from a dealt operand
        let group = (self.deal.get(&n))
            .map(|d| (d.axis, so[d.axis] / d.groups as usize))
            .or_else(|| {
                ops.iter().find_map(|o| {
                    let d = self.deal.get(o)?;
                    Some((d.axis, g.ty(*o).shape[d.axis] / d.groups as usize))
                })
            });
        let Some((at, group)) = group else {
            return Ok(false);
        };
        if group == 0 {
            return Err(());
        }
        let deal_of = |size: usize| -> Option<Deal> {
            match at == axis {
                true => (group > 0 && size.is_multiple_of(group)).then(|| Deal {
                    axis,
                    groups: (size / group) as u32,
                }),
                false => Some(Deal {
                    axis: at,
                    groups: (so[at] / group) as u32,
                }),
            }
        };
        changed |= self.link_to(n, deal_of(so[axis]).ok_or(())?)?;
        for &o in ops {
            let d = deal_of(g.ty(o).shape[axis]).ok_or(())?;
            changed |= self.link_to(o, d)?;
        }
        Ok(changed)
    }

    /// A product of two sample values: along an axis before the matrices' (a
    /// head's), the operands alike.
    fn product_rule(
        &mut self,
        g: &Graph,
        (n, ops): (NodeIndex, &[NodeIndex]),
    ) -> Result<bool, NoHeads> {
        let so = &g.ty(n).shape;
        let r = so.len();
        let mut changed = false;
        // (an operand dealt along its matrices' axes would sum a lane's share alone)
        let on_matrix =
            |o: &NodeIndex| (self.deal.get(o)).is_some_and(|d| d.axis + 2 >= g.ty(*o).rank());
        if ops.iter().any(on_matrix) {
            return Err(());
        }
        let d = self.deal.get(&n).copied().or_else(|| {
            ops.iter()
                .find_map(|o| self.deal.get(o).copied().filter(|d| d.axis + 2 < r))
        });
        let Some(d) = d else {
            return Ok(false);
        };
        if d.axis + 2 >= r || d.axis == 0 {
            return Err(());
        }
        changed |= self.link_to(n, d)?;
        for &o in ops {
            match g.ty(o).shape.get(d.axis) == Some(&so[d.axis]) && g.ty(o).rank() == r {
                true => changed |= self.link_to(o, d)?,
                false if self.has(o) => return Err(()),
                false => {}
            }
        }
        Ok(changed)
    }

    /// A reduction: the dealt axis kept (not reduced), renumbered past those reduced.
    fn reduce_rule(
        &mut self,
        (n, ops): (NodeIndex, &[NodeIndex]),
        axes: &[usize],
        keep: bool,
    ) -> Result<bool, NoHeads> {
        let mut changed = false;
        let out = |d: Deal| {
            if axes.contains(&d.axis) {
                return None;
            }
            let gone = match keep {
                true => 0,
                false => axes.iter().filter(|&&a| a < d.axis).count(),
            };
            Some(Deal {
                axis: d.axis - gone,
                ..d
            })
        };
        let back = |d: Deal| {
            let mut axis = d.axis;
            if !keep {
                for a in axes
                    .iter()
                    .copied()
                    .collect::<std::collections::BTreeSet<_>>()
                {
                    if a <= axis {
                        axis += 1;
                    }
                }
            }
            (!axes.contains(&axis)).then_some(Deal { axis, ..d })
        };
        changed |= self.link(ops[0], n, out)?;
        changed |= self.link(n, ops[0], back)?;
        Ok(changed)
    }

    /// `n` dealt `d`: whether that is new; an error when it is dealt otherwise.
    fn link_to(&mut self, n: NodeIndex, d: Deal) -> Result<bool, NoHeads> {
        if d.groups == 0 {
            return Err(());
        }
        match self.deal.get(&n) {
            Some(&e) if e == d => Ok(false),
            Some(_) => Err(()),
            None => {
                self.deal.insert(n, d);
                Ok(true)
            }
        }
    }
}
