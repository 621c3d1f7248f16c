//! Running a task: where it is in its loops (`Frame`, `Running`), its instructions in
//! turn (`Sim::advance`), and a vector instruction with operands on the fabric, element
//! by element (`Sim::vec_instr`, how far it got: `Progress`).

use super::engine::Wait;
use super::sram::{dest, element, on_sram, resolve, run_nest, sram_op, store, Opnd};
use super::stream::Room;
use super::Sim;
use crate::backend::wafer::cost;
use crate::backend::wafer::isa::{Dsd, Instr, Program, Src, VecOp};

/// Where a task is: per nesting level, the instruction and the loop's iteration.
#[derive(Debug, Clone)]
pub(super) struct Frame {
    pub(super) pc: usize,
    pub(super) iter: u32,
}

/// A task being run: where it is, and how far its current vector instruction got when
/// that one goes element by element (operands on the fabric).
#[derive(Debug, Clone)]
pub(super) struct Running {
    pub(super) task: usize,
    pub(super) frames: smallvec::SmallVec<[Frame; 4]>,
    pub(super) vec: Option<Progress>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Progress {
    /// The next element, the cycle it may be computed, and the scalar received for
    /// the instruction (a `Recv` operand).
    elem: u32,
    next: u64,
    scalar: Option<f32>,
    /// The cycle the instruction started, and the cycles its elements waited.
    start: u64,
    stalled: u64,
    /// Its sources and destination, resolved when it started (its loops' counters and
    /// the PE's counters stay as they are while it runs).
    ops: [Opnd; 3],
    dst: Option<(i64, i64)>,
}

/// How far a PE got.
pub(super) enum Step {
    /// On to the next instruction.
    Continue,
    /// The task ended.
    Done,
    /// Back at this cycle (it ran ahead and must decide then).
    Yield(u64),
    Wait(Wait),
}

impl Sim {
    /// Executes the current instruction of task `run` of PE `p` as far as it can go.
    pub(super) fn advance(&mut self, p: usize, prog: &Program, run: &mut Running, t: u64) -> Step {
        let pe = &mut self.pes[p];
        let task = &prog.tasks[run.task];
        let depth = run.frames.len() - 1;
        let body = body_at(&task.body, &run.frames[..depth]);
        let top = run.frames[depth].clone();
        if top.pc >= body.len() {
            // the end of a body: the loop's next iteration, past the loop, or the task's end
            run.frames.pop();
            if run.frames.is_empty() {
                return Step::Done;
            }
            let outer = body_at(&task.body, &run.frames[..depth - 1]);
            let pc = run.frames[depth - 1].pc;
            if matches!(&outer[pc], Instr::Loop { count, .. } if top.iter + 1 < *count) {
                run.frames.push(Frame {
                    pc: 0,
                    iter: top.iter + 1,
                });
            } else {
                run.frames[depth - 1].pc += 1;
            }
            return Step::Continue;
        }
        let loops: smallvec::SmallVec<[u32; 4]> =
            run.frames[1..].iter().map(|fr| fr.iter).collect();
        match &body[top.pc] {
            // one multi-dimensional operation on SRAM alone: all of it at once
            nest @ Instr::Loop { count, .. } if *count > 0 && on_sram(nest) => {
                let mut at = loops.clone();
                let pe = &mut self.pes[p];
                let (op, n, steps) = run_nest(&self.f, pe, nest, &mut at);
                let cycles = u64::from(self.f.dsd_startup) + steps;
                pe.time += cycles;
                pe.stats.busy += cycles;
                pe.stats.work += cost::work(&self.f, op, n);
                run.frames[depth].pc += 1;
                Step::Continue
            }
            Instr::Loop { count, .. } => {
                if *count > 0 {
                    run.frames.push(Frame { pc: 0, iter: 0 });
                } else {
                    run.frames[depth].pc += 1;
                }
                Step::Continue
            }
            Instr::Activate(id) => {
                pe.active |= 1u64 << id;
                run.frames[depth].pc += 1;
                Step::Continue
            }
            Instr::Count {
                counter,
                every,
                then,
                again,
            } => {
                let c = &mut pe.counters[*counter as usize];
                *c += 1;
                if *c >= *every {
                    *c = 0;
                    if let Some(then) = then {
                        pe.active |= 1u64 << then;
                    }
                } else if *again {
                    pe.active |= 1u64 << task.id;
                }
                run.frames[depth].pc += 1;
                Step::Continue
            }
            Instr::Vec { op, dst, srcs } => {
                let start = !continues(&task.body, &run.frames);
                let step = self.vec_instr(p, &mut run.vec, t, (*op, dst, srcs), &loops, start);
                if matches!(step, Step::Continue) {
                    // finished: on to the next instruction
                    run.frames[depth].pc += 1;
                }
                step
            }
        }
    }

    /// Executes (part of) a vector instruction of PE `p`, whose progress element by
    /// element is `progress`, paying the start-up if it `start`s an operation;
    /// `Continue` when it is done.
    fn vec_instr(
        &mut self,
        p: usize,
        progress: &mut Option<Progress>,
        t: u64,
        (op, dst, srcs): (VecOp, &Dsd, &[Src]),
        loops: &[u32],
        start: bool,
    ) -> Step {
        let f = &self.f;
        let n = dst.len();
        let reads = cost::reads(srcs);
        let writes = matches!(dst, Dsd::Mem { .. });
        let fabric = cost::on_fabric(dst, srcs);
        let step = cost::step(f, op, reads, writes).max(1);
        let lanes = if op.software() {
            1
        } else {
            cost::lanes(f, op).0
        };
        let startup = if start { u64::from(f.dsd_startup) } else { 0 };
        let pe = &mut self.pes[p];
        if !fabric {
            // on SRAM alone: all of it at once
            sram_op(pe, (op, dst, srcs), loops);
            let cycles = (cost::vec_op(f, op, n, reads, writes) + startup)
                .saturating_sub(u64::from(f.dsd_startup));
            pe.time += cycles;
            pe.stats.busy += cycles;
            pe.stats.work += cost::work(f, op, n);
            return Step::Continue;
        }
        let mut g = progress.unwrap_or_else(|| Progress {
            elem: 0,
            next: pe.time + startup,
            scalar: None,
            start: pe.time,
            stalled: 0,
            ops: resolve(srcs, &pe.mem, loops, &pe.counters),
            dst: dest(dst, loops, &pe.counters, &pe.mem),
        });
        while g.elem < n {
            // the wavelets this element needs must be queued, and its output needs room
            let pe = &self.pes[p];
            let mut at = g.next;
            for s in srcs {
                let c = match s {
                    Src::V(Dsd::In { colour, .. }) => *colour,
                    Src::Recv(c) if g.scalar.is_none() => *c,
                    _ => continue,
                };
                match pe.queues[c as usize].front() {
                    Some(&(arrive, _)) => at = at.max(arrive),
                    None => return self.wait(progress, g, t, Wait::In(c)),
                }
            }
            let out = match dst {
                Dsd::Out { colour, .. } => pe.sends[*colour as usize],
                _ => None,
            };
            if let Some(s) = out {
                match self.room(s, at) {
                    Room::Yes => {}
                    Room::At(later) => at = later,
                    Room::No => return self.wait(progress, g, t, Wait::Room(s)),
                }
            }
            // compute it at `at`
            let mut fab = [0.0f32; 3];
            let mut j = 0;
            for s in srcs {
                match s {
                    Src::V(Dsd::In { colour, .. }) => {
                        fab[j] = self.take(p, *colour, at);
                        j += 1;
                    }
                    Src::Recv(c) if g.scalar.is_none() => g.scalar = Some(self.take(p, *c, at)),
                    _ => {}
                }
            }
            let pe = &mut self.pes[p];
            let i = g.elem;
            let v = element(&pe.mem, op, &g.ops, i, &fab[..j], g.scalar);
            let stalled = at - g.next;
            g.stalled += stalled;
            g.elem += 1;
            // elements go `lanes` at a time, unless wavelets pace them
            g.next = if g.elem.is_multiple_of(lanes) || stalled > 0 || j > 0 || out.is_some() {
                at + step
            } else {
                at
            };
            match out {
                Some(s) => self.send(s, at, v),
                None => store(&mut pe.mem, g.dst, i, v),
            }
        }
        let pe = &mut self.pes[p];
        pe.stats.busy += g.next - g.start - g.stalled;
        pe.stats.work += cost::work(&self.f, op, n);
        pe.stats.stalled += g.stalled;
        pe.time = pe.time.max(g.next);
        *progress = None;
        Step::Continue
    }

    /// An instruction at `g` cannot go on before `w`. It waits for it, or, when the PE
    /// ran ahead of its event's cycle `t`, comes back at the cycle it needs it, to
    /// decide then.
    fn wait(&self, progress: &mut Option<Progress>, g: Progress, t: u64, w: Wait) -> Step {
        *progress = Some(g);
        if g.next > t {
            return Step::Yield(g.next);
        }
        Step::Wait(w)
    }
}

/// Whether the vector operation that `frames` lead to from `body` continues one
/// begun at an earlier iteration of the loops around it: those loops, from the
/// innermost out, that are one multi-dimensional operation with it (`Instr::dims`).
fn continues(body: &[Instr], frames: &[Frame]) -> bool {
    for k in (1..frames.len()).rev() {
        let around = &body_at(body, &frames[..k - 1])[frames[k - 1].pc];
        if around.dims().is_none() {
            return false;
        }
        if frames[k].iter > 0 {
            return true;
        }
    }
    false
}

/// The body that `frames` (each a position in a loop) lead to from `body`.
fn body_at<'a>(mut body: &'a [Instr], frames: &[Frame]) -> &'a [Instr] {
    for fr in frames {
        if let Instr::Loop { body: b, .. } = &body[fr.pc] {
            body = b;
        }
    }
    body
}
