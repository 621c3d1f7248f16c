//! A lane's program (or a replica's): its memory and stashes, the tasks of its passes
//! (`passes`), its update, FIFOs and pipeline.

use super::levels::{At, Levels};
use super::{Lane, Rep, Vector};
use crate::backend::wafer::form::{self, key, Class, End};
use crate::backend::wafer::isa::{Colour, Program, Task, Trigger};
use crate::backend::wafer::kernels::{split, Piece, UPDATE};
use crate::backend::wafer::lower::{Scratch, Val};
use crate::backend::wafer::pipeline::Pipeline;
use crate::ir::{NodeIndex, Op};
use std::collections::BTreeMap;

/// A shape of a kernel's variables and the commits of those of that shape.
type ShapeCommits = (Vec<usize>, Vec<(String, NodeIndex)>);

/// A lane's program as its tasks are written: its memory map, what stays in it and
/// the scratch its tasks share.
pub(super) struct Layout {
    pub p: Program,
    pub tensors: Vec<(String, Piece)>,
    /// Words to set before the first step (a counting buffer's).
    pub init: Vec<(u32, Vec<f32>)>,
    /// What stays, where: variables, sums over the batch, the host's values, the step
    /// values made from the sums (`Levels::mids`).
    pub vals: BTreeMap<NodeIndex, Val>,
    /// Its sums over the batch.
    pub accs: Vec<NodeIndex>,
    /// The values a later pass or level reads of each sample: where their slots start
    /// and a slot's words.
    pub stash: BTreeMap<NodeIndex, (u32, u32)>,
    /// The slots of its stash: its window, or every sample of the step when it reads a
    /// statistic of the batch.
    pub slots: u32,
    /// Counting 0, 1, 2, ... (one-hot, argmax), if it counts.
    pub iota: Option<u32>,
    /// A word that takes what a lane drops of a whole sample.
    pub junk: u32,
    pub scratch: Scratch,
    pub levels: Levels,
    /// The samples it takes in a step.
    pub samples: u32,
}

impl Vector<'_> {
    /// Lane `lane` of `lanes`, or a replica of the one lane.
    pub(super) fn build(&self, lanes: u32, lane: u32, rep: Option<Rep>) -> Result<Lane, String> {
        self.in_bands(lanes)?;
        let mut m = self.layout(lanes, lane, rep);
        let has_bwd = self.has_backward();
        if m.levels.deep() && has_bwd && self.window != m.samples {
            return Err("a kernel that reads a statistic of the batch keeps every sample of the step (its window is the batch)".into());
        }
        self.check_carried(&m.levels, has_bwd)?;
        // (the backward pass's tasks numbered after the forward's, which run first
        // when both are ready)
        let used = self.pass(0, (lanes, lane), rep, &mut m, 2)?;
        if has_bwd {
            self.pass(1, (lanes, lane), rep, &mut m, 2 * used.max(1) + 1)?;
        }
        self.update(&mut m, lanes, lane)?;
        let Layout {
            mut p,
            tensors,
            init,
            scratch,
            samples,
            ..
        } = m;
        if scratch.high > 0 {
            p.alloc("scratch", scratch.high);
        }
        if let Some(c) = self.halo {
            // room for the rows the lanes beside it send it in a task (`halo`)
            for colour in c {
                let most = (p.tasks.iter()).map(|t| p.receives(t.id, colour)).max();
                let words = most.unwrap_or(0) as u32;
                if words > 0 {
                    p.fifo(colour, words);
                }
            }
        }
        if let Some(r) = rep {
            // room for the samples dealt to it while it computes one
            let words = p.receives(0, r.to) as u32;
            let waiting = self.window.div_ceil(r.of.max(1)).saturating_sub(1);
            p.fifo(r.to, waiting * words);
        }
        if has_bwd {
            p.pipeline = Some(Pipeline {
                forward: 0,
                backward: vec![1],
                window: self.window,
                samples,
            });
            // room for the output gradients that come while it runs forwards
            let mut colours: Vec<Colour> = (self.inputs.iter())
                .filter(|i| i.bwd)
                .map(|i| i.colour)
                .collect();
            colours.dedup();
            for c in colours {
                let words = p.receives(1, c);
                p.fifo(c, self.fifo * words as u32);
            }
        }
        let mut memory = vec![0.0; p.words() as usize];
        for (base, v) in init {
            memory[base as usize..base as usize + v.len()].copy_from_slice(&v);
        }
        Ok(Lane {
            program: p,
            memory,
            tensors,
        })
    }

    /// Lane `lane`'s memory before its tasks: what stays, its counting buffer, its
    /// stashes.
    fn layout(&self, lanes: u32, lane: u32, rep: Option<Rep>) -> Layout {
        let g = self.g;
        let f = self.f;
        let kr = &f.kernels[self.k];
        let levels = self.levels();
        let mut p = Program::default();
        if let Some(r) = rep {
            p.deal = r.of;
        }
        let samples = rep.map_or(f.batch, |r| f.batch / r.of.max(1));
        let mut tensors = Vec::new();
        let name = |n: NodeIndex| match &g.node(n).op {
            Op::Variable { name, .. } => name.clone(),
            _ => key(n),
        };
        let accs: Vec<NodeIndex> = (self.nodes().iter())
            .copied()
            .filter(|&n| f.class[n.index()] == Class::Batch)
            .collect();
        let mut vals: BTreeMap<NodeIndex, Val> = BTreeMap::new();
        for &n in kr.vars.iter().chain(&accs).chain(&kr.hosts) {
            let ext = self.extent(n, lanes, lane);
            let base = p.alloc(&name(n), ext);
            let runs = self.runs(n, lanes, lane);
            tensors.push((
                name(n),
                Piece {
                    pe: (0, 0),
                    word: base,
                    runs,
                },
            ));
            vals.insert(n, Val::buf(base, ext));
        }
        // (the step values made from its sums stay too, but only its own code reads
        // them: no tensor of the host's)
        for &(n, _) in &levels.mids {
            let ext = self.extent(n, lanes, lane);
            vals.insert(n, Val::buf(p.alloc(&name(n), ext), ext));
        }
        let mut init = Vec::new();
        let iota = self.iota(&mut p, &mut init, lanes, lane);
        // stashes: values a later pass or level reads, with its samples' slots
        let slots = if levels.deep() { samples } else { self.window };
        let mut stash: BTreeMap<NodeIndex, (u32, u32)> = BTreeMap::new();
        for n in self.stashed(&levels) {
            let ext = self.extent(n, lanes, lane);
            let base = p.alloc(&format!("{} stash", key(n)), slots * ext);
            stash.insert(n, (base, ext));
        }
        let junk = if self.inputs.iter().any(|i| i.whole) {
            p.alloc("dropped", 1)
        } else {
            0
        };
        let scratch = Scratch::new(p.words());
        Layout {
            p,
            tensors,
            init,
            vals,
            accs,
            stash,
            slots,
            iota,
            junk,
            scratch,
            levels,
            samples,
        }
    }

    /// Its counting buffer (one-hot, argmax), if it counts: 0, 1, 2, ... or, on
    /// several lanes, from the lane's share's first feature (`across`: every such op's
    /// features are the width's).
    fn iota(
        &self,
        p: &mut Program,
        init: &mut Vec<(u32, Vec<f32>)>,
        lanes: u32,
        lane: u32,
    ) -> Option<u32> {
        let g = self.g;
        let len = (self.nodes().iter())
            .map(|&n| match g.node(n).op {
                Op::OneHot { depth } => depth,
                Op::ArgMax { .. } | Op::ArgMin { .. } => {
                    g.ty(g.operands(n)[0]).shape.last().copied().unwrap_or(1)
                }
                _ => 0,
            })
            .max()
            .unwrap_or(0) as u32;
        let (from, len) = match (lanes, self.width()) {
            (1, _) | (_, None) => (0, len),
            (_, Some(w)) => {
                let share = split(w, lanes, lane);
                (share.start, share.len() as u32)
            }
        };
        (len > 0).then(|| {
            let base = p.alloc("iota", len);
            init.push((base, (from..from + len).map(|i| i as f32).collect()));
            base
        })
    }

    /// The sample values a pass or level other than their own reads (or sends: a
    /// gradient computed going forward goes back in the backward pass).
    fn stashed(&self, lv: &Levels) -> Vec<NodeIndex> {
        let (g, f) = (self.g, self.f);
        let has_bwd = self.has_backward();
        let mut out: Vec<NodeIndex> = Vec::new();
        for (&at, code) in &lv.code {
            for o in code.iter().flat_map(|&n| g.operands(n)) {
                let o = f.resolve(o);
                let sample = f.class[o.index()] != Class::Batch || !self.nodes().contains(&o);
                let elsewhere = lv.at.get(&o).is_some_and(|&a| a != at);
                if sample && elsewhere && !lv.recomputed.contains(&o) && !out.contains(&o) {
                    out.push(o);
                }
            }
        }
        for o in &self.outputs {
            let made = lv.at.get(&o.node).copied();
            if made.is_some_and(|a| a != self.sent_at(o, lv, has_bwd)) && !out.contains(&o.node) {
                out.push(o.node);
            }
        }
        out
    }

    /// The pass and level output `o` is sent in: where it is made, but a gradient made
    /// going forward, which goes back in the backward pass (its first level), if the
    /// kernel has one; a value passed on, in the pass it comes in. A carried value goes
    /// with what carries it, kept (stashed) till then when it is made before: a
    /// residual's image passed on past a batch norm waits for the normalised samples.
    pub(super) fn sent_at(&self, o: &super::Port, lv: &Levels, has_bwd: bool) -> At {
        let made = self.made_at(o, lv, has_bwd);
        match self.carrier(o) {
            Some(c) => made.max(self.made_at(c, lv, has_bwd)),
            None => made,
        }
    }

    /// Where output `o` is ready to go (see `sent_at`).
    fn made_at(&self, o: &super::Port, lv: &Levels, has_bwd: bool) -> At {
        match lv.at.get(&o.node) {
            Some(&(0, _)) if o.bwd && has_bwd => (1, 0),
            Some(&a) => a,
            None => (u8::from(o.bwd && has_bwd), 0),
        }
    }

    /// The output that carries output `o` on its colour, if `o` is carried: the layer
    /// before's output gradient for a carried gradient, the layer after's input for a
    /// value passed on.
    fn carrier(&self, o: &super::Port) -> Option<&super::Port> {
        if o.carried == 0 {
            return None;
        }
        let f = self.f;
        let layer = |k: Option<usize>| {
            k.and_then(|k| match &f.kernels.get(k)?.kind {
                form::Kind::Dense { x, dy, .. } => Some((f.resolve(*x), dy.map(|d| f.resolve(d)))),
                form::Kind::Vector { .. } => None,
            })
        };
        let by = match o.bwd {
            true => layer(self.k.checked_sub(1)).and_then(|l| l.1),
            false => layer(Some(self.k + 1)).map(|l| l.0),
        };
        (self.outputs.iter()).find(|c| Some(c.node) == by && c.carried == 0)
    }

    /// Values sent on one colour go in one pass and level: a carried value with what
    /// carries it (a gradient beside the layer before's output gradient, a value
    /// passed on beside the layer after's input), each sample's together; so none may
    /// be made after what carries it.
    fn check_carried(&self, lv: &Levels, has_bwd: bool) -> Result<(), String> {
        for o in &self.outputs {
            if (self.carrier(o))
                .is_some_and(|c| self.made_at(c, lv, has_bwd) < self.made_at(o, lv, has_bwd))
            {
                return Err("a gradient carried beside another that is computed in a later pass (or level) has no wafer kernel yet".into());
            }
        }
        Ok(())
    }

    /// Its update, if it has one: the step nodes over its variables and sums (not the
    /// step values its samples read, made during the passes, which it reads as made).
    fn update(&self, m: &mut Layout, lanes: u32, lane: u32) -> Result<(), String> {
        let (g, f) = (self.g, self.f);
        let kr = &f.kernels[self.k];
        if kr.steps.is_empty() && kr.commits.is_empty() && m.accs.is_empty() {
            return Ok(());
        }
        m.scratch.reset();
        let mids: Vec<NodeIndex> = m.levels.mids.iter().map(|x| x.0).collect();
        let steps: Vec<NodeIndex> = (kr.steps.iter())
            .filter(|s| !mids.contains(s))
            .copied()
            .collect();
        let hosts: Vec<NodeIndex> = kr.hosts.iter().chain(&mids).copied().collect();
        let at = |ns: &[NodeIndex]| -> Vec<Val> { ns.iter().map(|n| m.vals[n]).collect() };
        let (vars, accs, host_vals) = (at(&kr.vars), at(&m.accs), at(&hosts));
        let mut body = Vec::new();
        // one update per shape of its variables (a depthwise filter `[k, k, C, 1]` and
        // its bias `[C]`), each over its own blocks
        let groups = self.by_shape();
        for (shape, commits) in &groups {
            let steps = match groups.len() {
                1 => steps.clone(),
                _ => form::feeding(g, f, &steps, commits),
            };
            let u = form::update_over(g, f, (&steps, commits), (&kr.vars, &m.accs, &hosts), shape)
                .map_err(|e| e.message)?;
            let first = (kr.vars.iter()).find(|&&v| g.ty(v).shape.as_slice() == shape.as_slice());
            let n = first.map_or(1, |&v| self.extent(v, lanes, lane));
            body.extend(u.code(&vars, &accs, &host_vals, n, &mut m.scratch)?);
        }
        body.extend(crate::backend::wafer::lower::zeroed(&accs));
        m.p.tasks.push(Task {
            id: UPDATE,
            name: "update".into(),
            trigger: Trigger::Local { at_start: false },
            body,
        });
        Ok(())
    }

    /// Its commits grouped by the shape of the variable each replaces (one group under
    /// its first variable's shape when it commits none: the host updates a filter
    /// several of its nodes read, and the kernel its bias alone).
    fn by_shape(&self) -> Vec<ShapeCommits> {
        let (g, kr) = (self.g, &self.f.kernels[self.k]);
        let shape_of = |name: &str| g.variable(name).map(|v| g.ty(v).shape.to_vec());
        let first = kr
            .vars
            .first()
            .map_or(Vec::new(), |&v| g.ty(v).shape.to_vec());
        let mut out: Vec<ShapeCommits> = Vec::new();
        for c in &kr.commits {
            let shape = shape_of(&c.0).unwrap_or_else(|| first.clone());
            match out.iter_mut().find(|(s, _)| *s == shape) {
                Some((_, cs)) => cs.push(c.clone()),
                None => out.push((shape, vec![c.clone()])),
            }
        }
        match out.len() {
            // (the shape of the variables it commits, or of its first)
            0 => vec![(first, Vec::new())],
            _ => out,
        }
    }

    /// Whether a value to the host is a sample's scalar every lane has, which the first
    /// lane alone sends.
    pub(super) fn sent_by_first_lane(&self, n: NodeIndex) -> bool {
        (self.f.streams.iter()).any(|s| s.node == n && s.to == [End::Host])
            && self.extent(n, 1, 0) == 1
    }
}
