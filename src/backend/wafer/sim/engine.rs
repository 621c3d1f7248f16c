//! The engine: the event loop (`Sim::run`), each PE's and host input's step from its
//! event, the choice of a PE's next task, and the chain of waits a deadlock reports.

use super::stream::{Endpoint, Room, Sink};
use super::task::{Frame, Running, Step};
use super::{Deadlock, Sim};
use crate::backend::wafer::isa::{Colour, Trigger};
use std::cmp::Reverse;
use std::sync::Arc;

/// What a waiting PE waits for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Wait {
    /// A wavelet on this colour.
    In(Colour),
    /// Room in this stream.
    Room(usize),
    /// Nothing to run: idle.
    Idle,
}

impl Sim {
    pub(super) fn schedule(&mut self, who: usize, t: u64) {
        if self.pending[who].is_some_and(|p| p <= t) {
            return;
        }
        self.pending[who] = Some(t);
        self.events.push(Reverse((t, who)));
    }

    /// Runs until nothing is left to do; the cycle of the last event, or the deadlock.
    pub fn run(&mut self) -> Result<u64, Deadlock> {
        while let Some(Reverse((t, who))) = self.events.pop() {
            if self.pending[who] != Some(t) {
                continue;
            }
            self.pending[who] = None;
            self.now = t;
            if who < self.pes.len() {
                self.step_pe(who, t);
            } else {
                self.step_host(who - self.pes.len(), t);
            }
        }
        let waiting: Vec<usize> = (0..self.pes.len())
            .filter(|&p| self.pes[p].run.is_some())
            .collect();
        if waiting.is_empty() {
            // a wavelet no task took is a program that sends more than it receives
            let left: Vec<String> = (self.pes.iter())
                .flat_map(|pe| {
                    (pe.queues.iter().enumerate())
                        .filter(|(_, q)| !q.is_empty())
                        .map(move |(c, q)| {
                            format!(
                                "PE ({}, {}) holds {} wavelets on colour {c} that no task took",
                                pe.x,
                                pe.y,
                                q.len()
                            )
                        })
                })
                .collect();
            if left.is_empty() {
                return Ok(self.end());
            }
            return Err(Deadlock {
                cycle: self.now,
                chain: left,
                waiting: 0,
            });
        }
        Err(Deadlock {
            cycle: self.now,
            chain: self.chain(waiting[0]),
            waiting: waiting.len(),
        })
    }

    /// The cycle the last task ended or the last output left the fabric.
    pub(super) fn end(&self) -> u64 {
        let pes = self.pes.iter().map(|p| p.stats.done);
        let outs = self.outs.iter().filter_map(|(_, v)| v.last().map(|o| o.0));
        pes.chain(outs).max().unwrap_or(0)
    }

    /// The chain of waits from PE `p`.
    fn chain(&self, mut p: usize) -> Vec<String> {
        let mut seen = Vec::new();
        let mut out = Vec::new();
        loop {
            let pe = &self.pes[p];
            let task = pe.run.as_ref().map(|r| pe.prog.tasks[r.task].name.as_str());
            let who = match task {
                Some(t) => format!("PE ({}, {}) in task `{t}`", pe.x, pe.y),
                None => format!("PE ({}, {}) (idle)", pe.x, pe.y),
            };
            if seen.contains(&p) {
                out.push(format!("{who} (a cycle)"));
                return out;
            }
            seen.push(p);
            let next = match (pe.run.is_some(), pe.wait) {
                (true, Some(Wait::In(c))) => match pe.feeds[c as usize] {
                    Some((s, _)) => {
                        let from = self.streams[s].src;
                        out.push(format!(
                            "{who} waits for a wavelet on colour {c} from {}",
                            self.name(from)
                        ));
                        match from {
                            Endpoint::Pe(q) => Some(q),
                            Endpoint::Host(_) => None,
                        }
                    }
                    None => {
                        out.push(format!(
                            "{who} waits for a wavelet on colour {c}, which no route brings"
                        ));
                        None
                    }
                },
                (true, Some(Wait::Room(s))) => {
                    let full = self.streams[s].dests.iter().find(|d| d.held() >= d.cap);
                    match full.map(|d| d.to) {
                        Some(Sink::Pe(q)) => {
                            let c = self.streams[s].colour;
                            out.push(format!(
                                "{who} waits for room on colour {c} toward PE ({}, {})",
                                self.pes[q].x, self.pes[q].y
                            ));
                            Some(q)
                        }
                        _ => {
                            out.push(format!("{who} waits for room downstream"));
                            None
                        }
                    }
                }
                _ => {
                    out.push(format!("{who} waits for nothing"));
                    None
                }
            };
            match next {
                Some(q) => p = q,
                None => return out,
            }
        }
    }

    fn name(&self, e: Endpoint) -> String {
        match e {
            Endpoint::Pe(q) => format!("PE ({}, {})", self.pes[q].x, self.pes[q].y),
            Endpoint::Host(h) => {
                let s = &self.streams[self.hosts[h].stream];
                format!("the host (colour {}), which has sent everything", s.colour)
            }
        }
    }

    fn step_host(&mut self, h: usize, t: u64) {
        let s = self.hosts[h].stream;
        let mut time = self.hosts[h].time.max(t);
        self.hosts[h].waiting = false;
        while let Some(&v) = self.hosts[h].values.front() {
            match self.room(s, time) {
                Room::Yes => {}
                Room::At(at) => {
                    self.hosts[h].time = time;
                    self.schedule(self.pes.len() + h, at);
                    return;
                }
                Room::No => {
                    self.hosts[h].waiting = true;
                    break;
                }
            }
            self.hosts[h].values.pop_front();
            self.send(s, time, v);
            time += 1;
        }
        self.hosts[h].time = time;
    }

    /// Runs PE `p` from its event at cycle `t` until it must wait.
    fn step_pe(&mut self, p: usize, t: u64) {
        let pe = &mut self.pes[p];
        pe.time = pe.time.max(t);
        pe.wait = None;
        // the task runs outside the PE, which its instructions change
        let mut run = pe.run.take();
        let prog = Arc::clone(&pe.prog);
        loop {
            let Some(r) = run.as_mut() else {
                // choose a task, only at an event of this PE's own time
                if self.pes[p].time > t {
                    self.schedule(p, self.pes[p].time);
                    return;
                }
                match self.ready(p) {
                    Ok(task) => {
                        let pe = &mut self.pes[p];
                        if matches!(pe.prog.tasks[task].trigger, Trigger::Data(_)) {
                            pe.stats.data_runs += 1;
                        }
                        if let Some(pipe) = &pe.prog.pipeline {
                            pe.passes = pipe.started(pe.prog.tasks[task].id, pe.passes);
                        }
                        pe.active &= !(1u64 << pe.prog.tasks[task].id);
                        pe.time += u64::from(self.f.task_switch);
                        pe.stats.busy += u64::from(self.f.task_switch);
                        run = Some(Running {
                            task,
                            frames: smallvec::smallvec![Frame { pc: 0, iter: 0 }],
                            vec: None,
                        });
                    }
                    Err(at) => {
                        // idle; a wavelet queued for later makes a task ready then,
                        // unless one sent meanwhile comes first
                        self.pes[p].wait = Some(Wait::Idle);
                        if let Some(at) = at {
                            self.schedule(p, at);
                        }
                        return;
                    }
                }
                continue;
            };
            match self.advance(p, &prog, r, t) {
                Step::Continue => {}
                Step::Done => {
                    let pe = &mut self.pes[p];
                    pe.stats.done = pe.time;
                    run = None;
                }
                Step::Yield(at) => {
                    self.pes[p].run = run;
                    self.schedule(p, at);
                    return;
                }
                Step::Wait(w) => {
                    let pe = &mut self.pes[p];
                    pe.run = run;
                    pe.wait = Some(w);
                    return;
                }
            }
        }
    }

    /// The ready task of PE `p` with the lowest id (that its pipeline admits); else the
    /// cycle a queued wavelet arrives that will make one ready, if any.
    fn ready(&self, p: usize) -> Result<usize, Option<u64>> {
        let pe = &self.pes[p];
        let mut best: Option<(u8, usize)> = None;
        let mut soonest: Option<u64> = None;
        for (i, task) in pe.prog.tasks.iter().enumerate() {
            if (pe.prog.pipeline.as_ref()).is_some_and(|pipe| !pipe.admits(task.id, pe.passes)) {
                continue;
            }
            let ok = match task.trigger {
                Trigger::Local { .. } => pe.active & (1 << task.id) != 0,
                Trigger::Data(c) => match pe.queues[c as usize].front() {
                    Some(&(arrive, _)) if arrive <= pe.time => true,
                    Some(&(arrive, _)) => {
                        soonest = Some(soonest.map_or(arrive, |s: u64| s.min(arrive)));
                        false
                    }
                    None => false,
                },
            };
            if ok && best.is_none_or(|(id, _)| task.id < id) {
                best = Some((task.id, i));
            }
        }
        best.map(|b| b.1).ok_or(soonest)
    }
}
