//! A lane's program (or a replica's): its memory, stashes, and the tasks of its
//! passes, finishing and update.

use super::ops::*;
use super::{Lane, Port, Rep, Vector, SAMPLE_BASE, SLOT_BASE};
use crate::backend::wafer::form::{self, key, Class, End, Kind};
use crate::backend::wafer::isa::{Colour, Dsd, Instr, Program, Src, Task, Trigger, VecOp};
use crate::backend::wafer::kernels::{split, Piece, UPDATE};
use crate::backend::wafer::lower::{vec, Scratch, Val};
use crate::backend::wafer::pipeline::Pipeline;
use crate::ir::{NodeIndex, Op};
use std::collections::BTreeMap;

impl Vector<'_> {
    /// Lane `lane` of `lanes`, or a replica of the one lane.
    pub(super) fn build(&self, lanes: u32, lane: u32, rep: Option<Rep>) -> Result<Lane, String> {
        let g = self.g;
        let f = self.f;
        let kr = &f.kernels[self.k];
        let batch = f.batch;
        // the samples it takes in a step
        let samples = rep.map_or(batch, |r| batch / r.of.max(1));
        let mut p = Program::default();
        if let Some(r) = rep {
            p.deal = r.of;
        }
        let mut tensors = Vec::new();
        let mut init: Vec<(u32, Vec<f32>)> = Vec::new();
        let phases = self.phases();
        let name = |n: NodeIndex| match &g.node(n).op {
            Op::Variable { name, .. } => name.clone(),
            _ => key(n),
        };
        // what stays: variables, sums over the batch, the host's values
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
        // counting 0, 1, 2, ... (one-hot, argmax); on several lanes, from the lane's
        // share's first feature (`across`: every such op's features are the width's)
        let iota_len = (self.nodes().iter())
            .map(|&n| match g.node(n).op {
                Op::OneHot { depth } => depth,
                Op::ArgMax { .. } | Op::ArgMin { .. } => {
                    g.ty(g.operands(n)[0]).shape.last().copied().unwrap_or(1)
                }
                _ => 0,
            })
            .max()
            .unwrap_or(0) as u32;
        let (from, iota_len) = match (lanes, self.width()) {
            (1, _) | (_, None) => (0, iota_len),
            (_, Some(w)) => {
                let share = split(w, lanes, lane);
                (share.start, share.len() as u32)
            }
        };
        let iota = (iota_len > 0).then(|| {
            let base = p.alloc("iota", iota_len);
            init.push((base, (from..from + iota_len).map(|i| i as f32).collect()));
            base
        });
        // stashes: values of the forward phase the backward task reads
        let has_bwd = self.inputs.iter().any(|i| i.bwd);
        let late: Vec<NodeIndex> = {
            let mut late = Vec::new();
            for &n in self.nodes() {
                for o in g.operands(n) {
                    let o = f.resolve(o);
                    if phases.get(&o) == Some(&0)
                        && phases.get(&n) == Some(&1)
                        && !late.contains(&o)
                    {
                        late.push(o);
                    }
                }
            }
            // gradients computed going forward go back in the backward pass, if any
            for out in &self.outputs {
                let early = out.bwd && phases.get(&out.node) == Some(&0);
                if early && has_bwd && !late.contains(&out.node) {
                    late.push(out.node);
                }
            }
            late
        };
        let mut stash: BTreeMap<NodeIndex, (u32, u32)> = BTreeMap::new();
        for &n in &late {
            let ext = self.extent(n, lanes, lane);
            stash.insert(
                n,
                (
                    p.alloc(&format!("{} stash", key(n)), self.window * ext),
                    ext,
                ),
            );
        }
        let junk = if self.inputs.iter().any(|i| i.whole) {
            p.alloc("dropped", 1)
        } else {
            0
        };
        let mut scratch = Scratch::new(p.words());
        // the values sent on one colour go in one phase (a carried gradient with
        // what carries it: each sample's together)
        let sent_when = |o: &Port| {
            // (a value it passes on goes in the pass it comes in)
            let ph = (phases.get(&o.node).copied()).unwrap_or(u8::from(o.bwd && has_bwd));
            (o.bwd, ph)
        };
        // (each beside the value that carries it: a gradient beside the layer before's
        // output gradient, a value passed on beside the layer after's input)
        let layer = |k: Option<usize>| {
            k.and_then(|k| match &f.kernels.get(k)?.kind {
                Kind::Dense { x, dy, .. } => Some((f.resolve(*x), dy.map(|d| f.resolve(d)))),
                Kind::Vector { .. } => None,
            })
        };
        let (before, after) = (layer(self.k.checked_sub(1)), layer(Some(self.k + 1)));
        for o in self.outputs.iter().filter(|o| o.carried > 0) {
            let by = match o.bwd {
                true => before.and_then(|l| l.1),
                false => after.map(|l| l.0),
            };
            let carrier = (self.outputs.iter()).find(|c| Some(c.node) == by && c.carried == 0);
            if carrier.is_some_and(|c| sent_when(c) != sent_when(o)) {
                return Err("a gradient carried beside another that is computed in the other pass has no wafer kernel yet".into());
            }
        }
        for phase in 0..=u8::from(has_bwd) {
            scratch.reset();
            let mut body = Vec::new();
            let mut cur = vals.clone();
            let slot = SLOT_BASE + phase;
            for (&n, &(base, ext)) in &stash {
                cur.insert(
                    n,
                    Val::Buf {
                        base,
                        len: ext,
                        slot: Some(slot),
                    },
                );
            }
            let ins: Vec<Port> = self
                .inputs
                .iter()
                .filter(|i| u8::from(i.bwd) == phase)
                .copied()
                .collect();
            let Some(first) = ins.first() else {
                return Err("a vector kernel's phase without inputs".into());
            };
            for i in &ins {
                let colour = rep.map_or(i.colour, |r| r.to);
                let ext = self.extent(i.node, lanes, lane);
                let dst = match cur.get(&i.node) {
                    Some(&v) if stash.contains_key(&i.node) => v,
                    _ => scratch.alloc(ext),
                };
                // a whole sample: the words before and after this lane's share dropped
                let (before, after) = if i.whole {
                    let all = self.extent(i.node, 1, 0);
                    let start = self.runs(i.node, lanes, lane).first().map_or(0, |r| r.0);
                    (start, all - start - ext)
                } else {
                    (0, 0)
                };
                let drop = |len: u32| Instr::Vec {
                    op: VecOp::Mov,
                    dst: Dsd::strided(junk, len, 0, &[], None),
                    srcs: vec![Src::V(Dsd::In { colour, len })],
                };
                if before > 0 {
                    body.push(drop(before));
                }
                body.push(Instr::Vec {
                    op: VecOp::Mov,
                    dst: dst.dsd(ext).unwrap_or_else(|| Dsd::mem(0, ext)),
                    srcs: vec![Src::V(Dsd::In { colour, len: ext })],
                });
                if after > 0 {
                    body.push(drop(after));
                }
                cur.insert(i.node, dst);
            }
            let mut means = Vec::new();
            let mut soft = BTreeMap::new();
            for &n in self.nodes() {
                if phases.get(&n) != Some(&phase) {
                    continue;
                }
                self.node(
                    n,
                    (lanes, lane),
                    &mut cur,
                    &stash,
                    &mut scratch,
                    iota,
                    &mut body,
                    &mut means,
                    &mut soft,
                )?;
            }
            for o in &self.outputs {
                // (a gradient computed going forward goes back in the backward pass,
                // from its stash; without one, as soon as it is computed)
                let ph = phases.get(&o.node).copied().unwrap_or(0);
                let now = if o.bwd && has_bwd {
                    phase == 1
                } else {
                    ph == phase
                };
                // (a sample's scalar for the host, which every lane has, from the
                // first lane alone)
                let to_host = (f.streams.iter()).any(|s| s.node == o.node && s.to == [End::Host]);
                if !now || (to_host && lane > 0 && self.extent(o.node, 1, 0) == 1) {
                    continue;
                }
                let ext = self.extent(o.node, lanes, lane);
                let v = cur
                    .get(&f.resolve(o.node))
                    .copied()
                    .ok_or("a stream of a value not computed")?;
                let colour = match rep {
                    Some(r) if o.bwd => r.back,
                    _ => o.colour,
                };
                body.push(Instr::Vec {
                    op: VecOp::Mov,
                    dst: Dsd::Out { colour, len: ext },
                    srcs: vec![v.src(ext)],
                });
            }
            // after the step's last sample: the means, and the gradients held back
            let mut fin = Vec::new();
            if let (Some(r), 0) = (rep, phase) {
                // every replica's sums, through the dealer
                let sums = accs.iter().filter_map(|a| vals[a].dsd(vals[a].elements()));
                let sums: Vec<Dsd> = sums.collect();
                for d in &sums {
                    let len = d.len();
                    fin.push(mov(
                        Dsd::Out {
                            colour: r.back,
                            len,
                        },
                        d.clone(),
                    ));
                }
                for d in sums {
                    let len = d.len();
                    fin.push(mov(d, Dsd::In { colour: r.to, len }));
                }
            }
            for (a, scale) in means {
                fin.push(vec(VecOp::Mul, a, &[a, Val::Imm(scale)], a.elements()));
            }
            let fin_id = 2 + phase;
            if !stash.is_empty() {
                body.push(Instr::Count {
                    counter: slot,
                    every: self.window,
                    then: None,
                });
            }
            if !fin.is_empty() {
                body.push(Instr::Count {
                    counter: SAMPLE_BASE + phase,
                    every: samples,
                    then: Some(fin_id),
                });
            }
            let pass = if phase == 0 { "forward" } else { "backward" };
            p.tasks.push(Task {
                id: phase,
                name: pass.into(),
                trigger: Trigger::Data(rep.map_or(first.colour, |r| r.to)),
                body,
            });
            if !fin.is_empty() {
                p.tasks.push(Task {
                    id: fin_id,
                    name: format!("{pass} finish"),
                    trigger: Trigger::Local { at_start: false },
                    body: fin,
                });
            }
        }
        // the update
        if !kr.steps.is_empty() || !kr.commits.is_empty() || !accs.is_empty() {
            scratch.reset();
            let block: Vec<usize> = kr
                .vars
                .first()
                .map_or(Vec::new(), |&v| g.ty(v).shape.to_vec());
            let u = form::update_of(g, f, self.k, (&kr.vars, &accs, &kr.hosts), &block)
                .map_err(|e| e.message)?;
            let n = kr.vars.first().map_or(1, |&v| self.extent(v, lanes, lane));
            let at = |ns: &[NodeIndex]| -> Vec<Val> { ns.iter().map(|n| vals[n]).collect() };
            let body = u.code(&at(&kr.vars), &at(&accs), &at(&kr.hosts), n, &mut scratch)?;
            p.tasks.push(Task {
                id: UPDATE,
                name: "update".into(),
                trigger: Trigger::Local { at_start: false },
                body,
            });
        }
        if scratch.high > 0 {
            p.alloc("scratch", scratch.high);
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
}
