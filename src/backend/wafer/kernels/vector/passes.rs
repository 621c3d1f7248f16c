//! The tasks of a lane's passes. Each pass has a data task, run when a sample's inputs
//! of the pass arrive (in the order of the 1F1B schedule, `pipeline`), which computes
//! the pass's first level and sends what it makes; after the step's last sample a
//! finishing task divides the means. A pass with deeper levels (`levels`) then runs
//! each level as a task of its own, once per sample in turn (it activates itself
//! again until its count comes round), each after a task that divides the means the
//! level before summed and makes the step values the level reads.

use super::build::Layout;
use super::levels::At;
use super::ops::*;
use super::{Rep, Vector, BARRIER_BASE, SAMPLE_BASE, SLOT_BASE};
use crate::backend::wafer::form::{self, constant};
use crate::backend::wafer::isa::{Dsd, Instr, Src, Task, TaskId, Trigger, VecOp};
use crate::backend::wafer::lower::{self, vec, Val};
use crate::ir::{NodeIndex, Op};
use std::collections::BTreeMap;

/// The most levels a pass may have (its tasks' ids must stay below the update's).
const MAX_LEVELS: u8 = 7;

/// The counter of the slots of its stash that the code at `at` reads and writes: the
/// data task's, or its pass's levels' (each counts the samples in the same order, so
/// sample `s` is in slot `s mod slots` for each).
fn counter((pass, level): At) -> u8 {
    if level == 0 {
        SLOT_BASE + pass
    } else {
        BARRIER_BASE + pass
    }
}

impl Vector<'_> {
    /// Pass `pass`'s tasks (see the module's doc), its finishing and level tasks
    /// numbered from `first`, every other id (a pass's tasks are all even or all odd:
    /// `cost::per_pass`). Returns how many ids it numbered.
    pub(super) fn pass(
        &self,
        pass: u8,
        (lanes, lane): (u32, u32),
        rep: Option<Rep>,
        m: &mut Layout,
        first: TaskId,
    ) -> Result<u8, String> {
        let deepest = m.levels.deepest[usize::from(pass)];
        if deepest > MAX_LEVELS {
            return Err(format!(
                "a pass of more than {MAX_LEVELS} levels of statistics of the batch"
            ));
        }
        // the finishing task, then each level's task and the task after it
        let id = |i: u8| first + 2 * i;
        let (fin_id, level_id, after_id) = (id(0), |l: u8| id(2 * l - 1), |l: u8| id(2 * l));
        m.scratch.reset();
        let mut cur = self.current(m, (pass, 0));
        // (the step values made from variables alone, at each sample)
        let mut body = self.mids((pass, 0), (lanes, lane), m)?;
        body.extend(self.receive(pass, (lanes, lane), rep, m, &mut cur)?);
        let (code, means) = self.code((pass, 0), (lanes, lane), rep, m, &mut cur)?;
        body.extend(code);
        let mut fin = Vec::new();
        if let (Some(r), 0) = (rep, pass) {
            fin.extend(exchanged(r, m));
        }
        let first_level = (deepest > 0).then(|| level_id(1));
        fin.extend(self.after_level(&means, ((pass, 1), first_level), (lanes, lane), m)?);
        if !m.stash.is_empty() {
            body.push(Instr::Count {
                counter: counter((pass, 0)),
                every: m.slots,
                then: None,
                again: false,
            });
        }
        if !fin.is_empty() {
            body.push(Instr::Count {
                counter: SAMPLE_BASE + pass,
                every: m.samples,
                then: Some(fin_id),
                again: false,
            });
        }
        let name = if pass == 0 { "forward" } else { "backward" };
        let colour = rep.map_or_else(
            || {
                (self.inputs.iter())
                    .find(|i| u8::from(i.bwd) == pass)
                    .map(|i| i.colour)
            },
            |r| Some(r.to),
        );
        m.p.tasks.push(Task {
            id: pass,
            name: name.into(),
            trigger: Trigger::Data(colour.ok_or("a vector kernel's phase without inputs")?),
            body,
        });
        let mut used = 0;
        if !fin.is_empty() {
            m.p.tasks.push(Task {
                id: fin_id,
                name: format!("{name} finish"),
                trigger: Trigger::Local { at_start: false },
                body: fin,
            });
            used = 1;
        }
        for l in 1..=deepest {
            m.scratch.reset();
            let mut cur = self.current(m, (pass, l));
            let (mut body, means) = self.code((pass, l), (lanes, lane), rep, m, &mut cur)?;
            let next = (l < deepest).then(|| level_id(l + 1));
            let after = self.after_level(&means, ((pass, l + 1), next), (lanes, lane), m)?;
            body.push(Instr::Count {
                counter: counter((pass, l)),
                every: m.samples,
                then: (!after.is_empty()).then(|| after_id(l)),
                again: true,
            });
            m.p.tasks.push(Task {
                id: level_id(l),
                name: format!("{name} level {l}"),
                trigger: Trigger::Local { at_start: false },
                body,
            });
            if !after.is_empty() {
                m.p.tasks.push(Task {
                    id: after_id(l),
                    name: format!("{name} after level {l}"),
                    trigger: Trigger::Local { at_start: false },
                    body: after,
                });
            }
            used = 2 * l + 1;
        }
        Ok(used)
    }

    /// What runs once a level's samples are all done: the level's means divided, and,
    /// when there is a next level (`next`, run by task `then`), the step values it reads
    /// made and its task started.
    fn after_level(
        &self,
        means: &[(Val, f32)],
        (next, then): (At, Option<TaskId>),
        lanes: (u32, u32),
        m: &Layout,
    ) -> Result<Vec<Instr>, String> {
        // (in bands: the sums a later level reads made whole on every lane of a
        // channel first)
        let done = (next.0, next.1.saturating_sub(1));
        let mut out = self.grouped_sums(done, lanes, m);
        out.extend(divided(means));
        if let Some(t) = then {
            out.extend(self.mids(next, lanes, m)?);
            out.push(Instr::Activate(t));
        }
        Ok(out)
    }

    /// In bands (`Vector::bands`), the sums over the batch accumulated at `at` that the
    /// step reads (`read_in_step`: a batch norm's statistics and their gradients'
    /// sums), each lane's over its band, summed over the lanes of its channel, which
    /// then each hold the whole (`rows::across` within each channel's lanes).
    fn grouped_sums(&self, at: At, (lanes, lane): (u32, u32), m: &Layout) -> Vec<Instr> {
        let bands = self.bands(lanes);
        if bands < 2 {
            return Vec::new();
        }
        let c = self.row_colours();
        (m.accs.iter())
            .filter(|&&a| m.levels.at.get(&a) == Some(&at) && self.read_in_step(&m.levels, a))
            .flat_map(|a| {
                super::super::rows::across(VecOp::Add, m.vals[a], (bands, lane % bands), c)
            })
            .collect()
    }

    /// What stays, with each stashed value at its slot for the code at `at`.
    fn current(&self, m: &Layout, at: At) -> BTreeMap<NodeIndex, Val> {
        let mut cur = m.vals.clone();
        for (&n, &(base, len)) in &m.stash {
            let slot = Some(counter(at));
            cur.insert(n, Val::Buf { base, len, slot });
        }
        cur
    }

    /// The values that die at each of `nodes` (read there last, or made there and
    /// never read), which give their scratch back: not a value it sends, stashes or
    /// reads as a softmax's (kept until the sends), nor an accumulator. A node computed
    /// again further on (a slice cut for each reader) is a new value there.
    fn deaths(
        &self,
        nodes: &[NodeIndex],
        in_place: impl Fn(NodeIndex) -> Option<NodeIndex>,
    ) -> Vec<Vec<NodeIndex>> {
        let (g, f) = (self.g, self.f);
        // (a slice read in place lives in its operand's words, which live as long)
        let root = |mut n: NodeIndex| {
            while let Some(o) = in_place(n) {
                n = o;
            }
            n
        };
        let mut dies: Vec<Vec<NodeIndex>> = vec![Vec::new(); nodes.len()];
        let mut last: BTreeMap<NodeIndex, usize> = BTreeMap::new();
        for (i, &n) in nodes.iter().enumerate() {
            for o in g.operands(n) {
                last.insert(f.resolve(o), i);
                last.insert(root(f.resolve(o)), i);
            }
            if let Some(l) = last.insert(n, i) {
                dies[l].push(n);
            }
        }
        for (n, l) in last {
            dies[l].push(n);
        }
        let sent: Vec<NodeIndex> = (self.outputs.iter())
            .flat_map(|o| [f.resolve(o.node), root(f.resolve(o.node))])
            .collect();
        for d in &mut dies {
            d.retain(|o| {
                !sent.contains(o)
                    && in_place(*o).is_none()
                    && f.class[o.index()] == form::Class::Sample
                    && !matches!(g.node(*o).op, Op::Softmax { .. } | Op::LogSoftmax { .. })
            });
            d.sort();
            d.dedup();
        }
        dies
    }

    /// The data task's receives of pass `pass`'s inputs (into their stash, if kept).
    fn receive(
        &self,
        pass: u8,
        (lanes, lane): (u32, u32),
        rep: Option<Rep>,
        m: &mut Layout,
        cur: &mut BTreeMap<NodeIndex, Val>,
    ) -> Result<Vec<Instr>, String> {
        let mut body = Vec::new();
        for i in self.inputs.iter().filter(|i| u8::from(i.bwd) == pass) {
            let colour = rep.map_or(i.colour, |r| r.to);
            let ext = self.extent(i.node, lanes, lane);
            let dst = match cur.get(&i.node) {
                Some(&v) if m.stash.contains_key(&i.node) => v,
                _ => m.scratch.alloc(ext),
            };
            // a whole sample: the words before and after this lane's share dropped; of
            // a sequence, each token's, token by token (a value per token, which every
            // lane keeps whole, aside)
            // (of a heads kernel's dealt value, its heads' runs: one in each of so
            // many equal stretches of the sample)
            let dealt = self.dealt_runs(i.node).filter(|_| i.whole);
            let (count, all) = match (self.tokens(i.node), &dealt) {
                (_, Some((words, runs))) => (runs.len() as u32, words / runs.len() as u32),
                (Some((t, w)), _) if i.whole && lanes > 1 && w > 1 => (t, w),
                _ => (1, self.extent(i.node, 1, 0)),
            };
            let take = ext / count;
            let (before, after) = if i.whole {
                let start = self.runs(i.node, lanes, lane).first().map_or(0, |r| r.0);
                (start % all, all - start % all - take)
            } else {
                (0, 0)
            };
            if let Some((_, runs)) = &dealt {
                let even = runs
                    .iter()
                    .enumerate()
                    .all(|(j, r)| r.1 == take && r.0 == j as u32 * all + before);
                if !even {
                    return Err(format!("a value the host sends whole, of which a lane keeps runs of unequal stretches ({runs:?})"));
                }
            }
            let drop = |len: u32| {
                mov(
                    Dsd::strided(m.junk, len, 0, &[], None),
                    Dsd::In { colour, len },
                )
            };
            let into = match count {
                1 => dst.dsd(ext).unwrap_or_else(|| Dsd::mem(0, ext)),
                _ => at(dst, 0, take, 1, &[take]),
            };
            let mut each = Vec::new();
            if before > 0 {
                each.push(drop(before));
            }
            each.push(mov(into, Dsd::In { colour, len: take }));
            if after > 0 {
                each.push(drop(after));
            }
            match count {
                1 => body.extend(each),
                _ => body.push(Instr::Loop { count, body: each }),
            }
            // (a half-precision value, a layer's sums of its products among them)
            body.extend(lower::rounded(dst, ext, self.g.ty(i.node).dtype));
            cur.insert(i.node, dst);
        }
        Ok(body)
    }

    /// The code of the nodes at `at` for one sample, and the sends of what goes out
    /// there; and the means among the sums it adds to (to divide once they are whole).
    #[allow(clippy::type_complexity)]
    fn code(
        &self,
        at: At,
        (lanes, lane): (u32, u32),
        rep: Option<Rep>,
        m: &mut Layout,
        cur: &mut BTreeMap<NodeIndex, Val>,
    ) -> Result<(Vec<Instr>, Vec<(Val, f32)>), String> {
        let f = self.f;
        let has_bwd = self.has_backward();
        let (mut body, mut means) = (Vec::new(), Vec::new());
        let mut soft = BTreeMap::new();
        let nodes = m.levels.code.get(&at).cloned().unwrap_or_default();
        // (in bands, the rows of its images the code computes, and those of the values
        // it holds a band of widened first: `halo`)
        let halo = self.halo_at(at, &nodes, (lanes, lane), m, cur, &mut body)?;
        let in_place = |n| match halo {
            None => self.in_place(n, (lanes, lane), &m.stash),
            Some(_) => None,
        };
        let dies = self.deaths(&nodes, in_place);
        for (i, &n) in nodes.iter().enumerate() {
            self.node(
                n,
                (lanes, lane),
                cur,
                (&m.stash, counter(at), halo.as_ref()),
                &mut m.scratch,
                m.iota,
                &mut body,
                &mut means,
                &mut soft,
            )?;
            // (a value no later node reads gives its scratch back: a tap's window of a
            // convolution is dead once multiplied)
            for o in &dies[i] {
                if let Some(v) = cur.remove(o) {
                    m.scratch.release(v);
                }
            }
        }
        for o in &self.outputs {
            if self.sent_at(o, &m.levels, has_bwd) != at
                || (lane > 0 && self.sent_by_first_lane(o.node))
            {
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
            // (in bands, its band among the rows the code holds: `halo`)
            let from = halo
                .as_ref()
                .map_or(0, |h| self.band_within(f.resolve(o.node), h, (lanes, lane)));
            body.push(Instr::Vec {
                op: VecOp::Mov,
                dst: Dsd::Out { colour, len: ext },
                srcs: vec![match from {
                    0 => v.src(ext),
                    _ => Src::V(super::ops::at(v, from, ext, 1, &[])),
                }],
            });
        }
        Ok((body, means))
    }

    /// The code of the step values made from its sums (`Levels::mids`) that level `at`
    /// reads first, into the words they stay in: elementwise ops over the lane's share
    /// (a channel's statistics), or a reshape.
    fn mids(&self, at: At, (lanes, lane): (u32, u32), m: &Layout) -> Result<Vec<Instr>, String> {
        let (g, f) = (self.g, self.f);
        let mut out = Vec::new();
        for &(n, _) in m.levels.mids.iter().filter(|x| x.1 == at) {
            let node = g.node(n);
            let ext = self.extent(n, lanes, lane);
            let dst = m.vals[&n];
            let ops = g.operands(n);
            let args = (ops.iter())
                .map(|&o| {
                    let o = f.resolve(o);
                    constant(g, o)
                        .map(Val::Imm)
                        .or_else(|| m.vals.get(&o).copied())
                        .ok_or_else(|| {
                            format!(
                                "`{}` of a statistic of the batch reads a value its kernel does not have",
                                node.op.name()
                            )
                        })
                })
                .collect::<Result<Vec<Val>, String>>()?;
            match &node.op {
                Op::Reshape => out.push(vec(VecOp::Mov, dst, &args[..1], ext)),
                op if lower::elementwise(op) => {
                    let from = ops.first().map_or(node.ty.dtype, |&o| g.ty(o).dtype);
                    lower::emit(op, dst, &args, ext, (from, node.ty.dtype), &mut out)?;
                }
                op => {
                    return Err(format!(
                        "`{}` of a statistic of the batch has no wafer kernel yet",
                        op.name()
                    ))
                }
            }
        }
        Ok(out)
    }
}

/// The means among sums over the batch: each divided by its count once its sum is
/// whole.
fn divided(means: &[(Val, f32)]) -> Vec<Instr> {
    (means.iter())
        .map(|&(a, scale)| vec(VecOp::Mul, a, &[a, Val::Imm(scale)], a.elements()))
        .collect()
}

/// A replica's sums over the batch sent to its dealer, and every replica's total
/// taken back.
fn exchanged(r: Rep, m: &Layout) -> Vec<Instr> {
    let sums: Vec<Dsd> = (m.accs.iter())
        .filter_map(|a| m.vals[a].dsd(m.vals[a].elements()))
        .collect();
    let mut out = Vec::new();
    for d in &sums {
        let len = d.len();
        out.push(mov(
            Dsd::Out {
                colour: r.back,
                len,
            },
            d.clone(),
        ));
    }
    for d in sums {
        let len = d.len();
        out.push(mov(d, Dsd::In { colour: r.to, len }));
    }
    out
}
