//! The cycle-level simulator: runs PE programs on real data through routers and links,
//! counting cycles.
//!
//! **Model.** Each placed PE runs one task at a time (the lowest-numbered ready one
//! that its pipeline admits: `pipeline.rs`), paying `task_switch` cycles to start it. A vector operation costs `cost::vec_op`:
//! its start-up, then one step per `fp32_lanes` elements; a loop nest that is one
//! multi-dimensional operation (`Instr::dims`) pays the start-up once. Operands on the
//! fabric go
//! element by element, at most one wavelet per cycle: an element waits for its input
//! wavelet and for room downstream for its output. A wavelet sent at `t` crosses each
//! link of its colour's route tree `hop_latency` after the previous one, one wavelet
//! per link and direction per cycle (a link busy with another wavelet delays it), and
//! reaches each destination's input queue `ramp_latency` after its last link (and
//! leaves `ramp_latency` after `t`). Flow control is end to end: a stream holds at most
//! `queue_depth` wavelets per router between its source and each destination
//! (`queue_depth x (hops + 1)`, and the words of a FIFO its destination keeps in SRAM
//! for the colour: `Program::fifos`), and a sender waits while a destination is full.
//!
//! **Engine.** Event-driven: a PE is touched only when it has something to do, and a
//! vector operation on SRAM alone (or a nest of them that is one operation) is one
//! event however long it is. A PE may run ahead
//! of the others while it only uses what it has (its SRAM, wavelets already queued); it
//! decides to wait, or which task to run, only at an event of its own time, when every
//! wavelet that can arrive by then has been sent. So results and cycle counts are
//! exact and deterministic; the one approximation is the order in which two streams
//! crossing one link take it, which is the order the engine meets them (routes the
//! compiler makes share no link at once, so this does not arise in compiled
//! programs).
//!
//! **Ends.** A run ends when no event is left. PEs still inside a task then wait for
//! something that will never come: that is a deadlock, reported with the chain of
//! waits (which PE waits for which colour from which PE).
//!
//! **Files.** Here: the public types (`Dir`, `Route`, `Setup`, `HostIn`, the errors and
//! the stats), the `Sim` with its PEs' and host inputs' state, building it from a
//! `Setup`, and what the host asks of it between runs; `engine`: the event loop, a PE's
//! choice of task and a deadlock's chain of waits; `task`: running a task's
//! instructions, a vector operation with operands on the fabric element by element;
//! `stream`: streams along their route trees, their links and end-to-end flow control;
//! `sram`: vector operations on SRAM alone, all at once; `tests`.

mod engine;
mod sram;
mod stream;
mod task;
#[cfg(test)]
mod tests;

use super::cost;
use super::fabric::Fabric;
use super::isa::{Colour, Program, Trigger, COUNTERS};
use super::pipeline::Passes;
use engine::Wait;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::fmt;
use std::sync::Arc;
use stream::Stream;
use task::Running;

/// Where values leave the grid: a router `(x, y)`, its port off the grid, a colour.
pub type Port = (u32, u32, Dir, Colour);

/// A router port.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Dir {
    N,
    S,
    E,
    W,
    /// The router's own PE.
    Ramp,
}

impl Dir {
    pub const ALL: [Dir; 5] = [Dir::N, Dir::S, Dir::E, Dir::W, Dir::Ramp];

    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    /// The port of the neighbour that a wavelet leaving through `self` enters by.
    pub fn opposite(self) -> Dir {
        match self {
            Dir::N => Dir::S,
            Dir::S => Dir::N,
            Dir::E => Dir::W,
            Dir::W => Dir::E,
            Dir::Ramp => Dir::Ramp,
        }
    }

    /// The neighbour of `(x, y)` through this port (y grows southward), if on the grid.
    pub fn step(self, x: u32, y: u32, f: &Fabric) -> Option<(u32, u32)> {
        match self {
            Dir::N => y.checked_sub(1).map(|y| (x, y)),
            Dir::S => (y + 1 < f.height).then_some((x, y + 1)),
            Dir::W => x.checked_sub(1).map(|x| (x, y)),
            Dir::E => (x + 1 < f.width).then_some((x + 1, y)),
            Dir::Ramp => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dir::N => "north",
            Dir::S => "south",
            Dir::E => "east",
            Dir::W => "west",
            Dir::Ramp => "ramp",
        }
    }
}

/// A router's configuration for one colour: where its wavelets come from, and the set
/// of ports each one leaves by (several: multicast).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Route {
    pub rx: Dir,
    tx: u8,
}

impl Route {
    pub fn new(rx: Dir, tx: &[Dir]) -> Route {
        Route {
            rx,
            tx: tx.iter().fold(0, |m, d| m | d.bit()),
        }
    }

    pub fn tx(&self) -> impl Iterator<Item = Dir> + '_ {
        Dir::ALL.into_iter().filter(|d| self.tx & d.bit() != 0)
    }
}

/// Everything a run starts from: the PEs' programs and initial memory, the routes,
/// and the host's streams into the fabric.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// `(x, y)` -> program and initial SRAM words.
    pub pes: BTreeMap<(u32, u32), (Arc<Program>, Vec<f32>)>,
    /// `(x, y, colour)` -> route.
    pub routes: BTreeMap<(u32, u32, Colour), Route>,
    /// Values the host sends into the fabric at an edge router `(x, y)` on a colour
    /// (whose route there takes them from `rx`, the port facing off the grid).
    pub inputs: Vec<HostIn>,
}

#[derive(Debug, Clone)]
pub struct HostIn {
    pub x: u32,
    pub y: u32,
    pub colour: Colour,
    pub values: Vec<f32>,
}

/// Why a setup cannot run.
#[derive(Debug, Clone, PartialEq)]
pub struct SetupError(pub String);

/// A deadlock: the PEs waiting at the end, each with what it waits for; or (none
/// waiting) the wavelets left in queues that no task took.
#[derive(Debug, Clone, PartialEq)]
pub struct Deadlock {
    pub cycle: u64,
    /// The chain of waits from the first waiting PE: each line names a PE and what it
    /// waits for, ending at a PE already named (a cycle) or one that waits for nothing.
    pub chain: Vec<String>,
    /// Every waiting PE (0: the run ended with wavelets left over, which `chain` lists).
    pub waiting: usize,
}

impl fmt::Display for Deadlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.waiting == 0 {
            return write!(
                f,
                "the fabric went quiet at cycle {} with wavelets left over: {}",
                self.cycle,
                self.chain.join(", ")
            );
        }
        write!(
            f,
            "deadlock at cycle {}: {} PEs wait for ever; {}",
            self.cycle,
            self.waiting,
            self.chain.join(", ")
        )
    }
}

/// What a whole run did: its last cycle, and the PEs' busy and stalled cycles summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    pub cycles: u64,
    pub busy: u64,
    pub stalled: u64,
    pub pes: usize,
}

/// What a PE did over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeStats {
    /// Cycles spent on instructions and task switches.
    pub busy: u64,
    /// Cycles an element waited for a wavelet or for room downstream.
    pub stalled: u64,
    /// The cycle its last task ended.
    pub done: u64,
    /// Elements of arithmetic (every vector operation but a move) computed.
    pub work: u64,
    /// Tasks started by data.
    pub data_runs: u64,
}

struct Pe {
    x: u32,
    y: u32,
    prog: Arc<Program>,
    mem: Vec<f32>,
    /// Per colour: (arrival cycle, value), and the stream and destination feeding it.
    queues: Vec<VecDeque<(u64, f32)>>,
    feeds: Vec<Option<(usize, usize)>>,
    /// Per colour: the stream this PE sends on it.
    sends: Vec<Option<usize>>,
    /// The colours a data task runs on (bit per colour).
    triggers: u64,
    active: u64,
    counters: Vec<u32>,
    /// Where it is in its pipeline's step (`Program::pipeline`).
    passes: Passes,
    time: u64,
    run: Option<Running>,
    wait: Option<Wait>,
    stats: PeStats,
}

struct HostSrc {
    at: (u32, u32),
    values: VecDeque<f32>,
    stream: usize,
    time: u64,
    waiting: bool,
}

impl Pe {
    /// The PE at `(x, y)` running `prog` from the SRAM words `mem`, checked against the
    /// fabric: on the grid, its program sound, its memory and colours within the PE's.
    fn new(f: &Fabric, x: u32, y: u32, prog: &Arc<Program>, mem: &[f32]) -> Result<Pe, SetupError> {
        let err = |m: String| Err(SetupError(m));
        let colours = f.colours as usize;
        if x >= f.width || y >= f.height {
            return err(format!(
                "PE ({x}, {y}) is off the {}x{} fabric",
                f.width, f.height
            ));
        }
        prog.check()
            .map_err(|e| SetupError(format!("PE ({x}, {y}): {e}")))?;
        let words = (f.usable_bytes() / cost::WORD) as usize;
        let need = (prog.words() as usize).max(mem.len());
        if need > words {
            return err(format!(
                "PE ({x}, {y}) needs {need} words of SRAM, more than its {words}"
            ));
        }
        let mut m = mem.to_vec();
        m.resize(need, 0.0);
        for t in &prog.tasks {
            if let Trigger::Data(c) = t.trigger {
                if c as usize >= colours {
                    return err(format!(
                        "PE ({x}, {y}): colour {c} is beyond the fabric's {colours}"
                    ));
                }
            }
        }
        let active = prog
            .tasks
            .iter()
            .filter(|t| t.trigger == Trigger::Local { at_start: true })
            .fold(0u64, |m, t| m | 1 << t.id);
        Ok(Pe {
            x,
            y,
            prog: prog.clone(),
            mem: m,
            queues: vec![VecDeque::new(); colours],
            feeds: vec![None; colours],
            sends: vec![None; colours],
            active,
            triggers: (prog.tasks.iter())
                .filter_map(|t| match t.trigger {
                    Trigger::Data(c) => 1u64.checked_shl(u32::from(c)),
                    Trigger::Local { .. } => None,
                })
                .fold(0, |m, b| m | b),
            counters: vec![0; COUNTERS as usize],
            passes: Passes::default(),
            time: 0,
            run: None,
            wait: None,
            stats: PeStats::default(),
        })
    }
}

/// A running fabric.
pub struct Sim {
    f: Fabric,
    pes: Vec<Pe>,
    hosts: Vec<HostSrc>,
    streams: Vec<Stream>,
    /// Per link: the first cycle it is free.
    link_free: Vec<u64>,
    /// Per link: its router and the port wavelets leave by, and how many have crossed.
    link_at: Vec<(u32, u32, Dir)>,
    link_sent: Vec<u64>,
    /// Per output port `(x, y, dir, colour)`: the values that left, with their cycles.
    outs: Vec<(Port, Vec<(u64, f32)>)>,
    events: BinaryHeap<Reverse<(u64, usize)>>,
    /// Per event target (PEs, then hosts): the cycle of its pending event.
    pending: Vec<Option<u64>>,
    now: u64,
    /// A wavelet's cycles at its stream's links (kept to spare an allocation a send).
    reach: Vec<u64>,
}

impl Sim {
    /// Builds a fabric from a setup: follows every stream's routes, so that a route to
    /// nowhere, a loop or a colour beyond the fabric's is an error before anything runs.
    pub fn new(f: &Fabric, setup: &Setup) -> Result<Sim, SetupError> {
        let mut index = BTreeMap::new();
        let mut pes = Vec::new();
        // PEs with equal programs share one copy (fewer cache lines to fetch from)
        let mut shared: BTreeMap<(u32, usize, usize), Vec<Arc<Program>>> = BTreeMap::new();
        for (&(x, y), (prog, mem)) in &setup.pes {
            let alike =
                (shared.entry((prog.words(), prog.tasks.len(), prog.symbols.len()))).or_default();
            let prog = match alike
                .iter()
                .find(|s| Arc::ptr_eq(s, prog) || ***s == **prog)
            {
                Some(s) => s.clone(),
                None => {
                    alike.push(prog.clone());
                    prog.clone()
                }
            };
            let pe = Pe::new(f, x, y, &prog, mem)?;
            index.insert((x, y), pes.len());
            pes.push(pe);
        }
        let mut sim = Sim {
            f: f.clone(),
            pes,
            hosts: (setup.inputs.iter())
                .map(|h| HostSrc {
                    at: (h.x, h.y),
                    values: h.values.iter().copied().collect(),
                    stream: usize::MAX,
                    time: 0,
                    waiting: false,
                })
                .collect(),
            streams: Vec::new(),
            link_free: Vec::new(),
            reach: Vec::new(),
            link_at: Vec::new(),
            link_sent: Vec::new(),
            outs: Vec::new(),
            events: BinaryHeap::new(),
            pending: Vec::new(),
            now: 0,
        };
        sim.connect(f, setup, &index)?;
        sim.pending = vec![None; sim.pes.len() + sim.hosts.len()];
        for p in 0..sim.pes.len() {
            sim.schedule(p, 0);
        }
        for h in 0..sim.hosts.len() {
            sim.schedule(sim.pes.len() + h, 0);
        }
        Ok(sim)
    }

    /// Each PE's data tasks started so far.
    pub fn data_runs(&self) -> Vec<u64> {
        self.pes.iter().map(|p| p.stats.data_runs).collect()
    }

    /// The first PE whose data tasks did not each run `each` times since `before`
    /// (`data_runs` then; a replica's, for the samples dealt to it): a program that
    /// lost a stream, which a run that ends quiet would not show otherwise (a task
    /// never started waits for nothing).
    pub fn short_runs(&self, before: &[u64], batch: u64) -> Option<String> {
        let batch = u32::try_from(batch).unwrap_or(u32::MAX);
        self.pes.iter().zip(before).find_map(|(pe, &b)| {
            let data = (pe.prog.tasks.iter().zip(cost::runs(&pe.prog, batch)))
                .filter(|(t, _)| matches!(t.trigger, Trigger::Data(_)));
            let (tasks, want) = data.fold((0, 0), |(n, w), (_, r)| (n + 1, w + r));
            let ran = pe.stats.data_runs - b;
            (ran != want).then(|| {
                format!(
                    "PE ({}, {}) started its {tasks} data tasks {ran} times in all, not {want}: a stream was lost",
                    pe.x, pe.y
                )
            })
        })
    }

    /// The last cycle a run reached.
    pub fn now(&self) -> u64 {
        self.now.max(self.end())
    }

    fn pe_at(&self, x: u32, y: u32) -> Option<usize> {
        self.pes.iter().position(|p| (p.x, p.y) == (x, y))
    }

    /// Writes `values` into the SRAM of the PE at `(x, y)` from word `addr` on (the
    /// host's copy into the fabric between runs); false when there is no such PE or
    /// the words are past its memory.
    pub fn write(&mut self, x: u32, y: u32, addr: u32, values: &[f32]) -> bool {
        let Some(p) = self.pe_at(x, y) else {
            return false;
        };
        let mem = &mut self.pes[p].mem;
        let a = addr as usize;
        match mem.get_mut(a..a + values.len()) {
            Some(m) => {
                m.copy_from_slice(values);
                true
            }
            None => false,
        }
    }

    /// Makes local task `task` of the PE at `(x, y)` ready now (the host launching a
    /// function); false when there is no such PE or task.
    pub fn launch(&mut self, x: u32, y: u32, task: super::isa::TaskId) -> bool {
        let Some(p) = self.pe_at(x, y) else {
            return false;
        };
        let now = self.now();
        let pe = &mut self.pes[p];
        if !pe.prog.tasks.iter().any(|t| t.id == task) {
            return false;
        }
        pe.active |= 1u64 << task;
        let at = pe.time.max(now);
        self.schedule(p, at);
        true
    }

    /// Queues more values for the host to send at the edge router `(x, y)` on
    /// `colour` (one of the setup's inputs); false when the setup has no such input.
    pub fn feed(&mut self, x: u32, y: u32, colour: Colour, values: &[f32]) -> bool {
        let Some(h) = self.hosts.iter().position(|h| {
            let s = &self.streams[h.stream];
            h.at == (x, y) && s.colour == colour
        }) else {
            return false;
        };
        self.hosts[h].values.extend(values.iter().copied());
        let at = self.hosts[h].time.max(self.now());
        self.hosts[h].time = at;
        self.schedule(self.pes.len() + h, at);
        true
    }

    /// Forgets the values that left the fabric so far.
    pub fn clear_outputs(&mut self) {
        for (_, v) in &mut self.outs {
            v.clear();
        }
    }

    /// The run so far, summed over the PEs.
    pub fn summary(&self) -> Stats {
        Stats {
            cycles: self.now(),
            busy: self.pes.iter().map(|p| p.stats.busy).sum(),
            stalled: self.pes.iter().map(|p| p.stats.stalled).sum(),
            pes: self.pes.len(),
        }
    }

    /// Per link (a router, and the port wavelets leave it by): the wavelets that have
    /// crossed it.
    pub fn link_loads(&self) -> BTreeMap<(u32, u32, Dir), u64> {
        (self.link_at.iter().copied())
            .zip(self.link_sent.iter().copied())
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    /// Per PE at `(x, y)`: what it did.
    pub fn stats(&self) -> Vec<((u32, u32), PeStats)> {
        self.pes.iter().map(|p| ((p.x, p.y), p.stats)).collect()
    }

    /// The SRAM of the PE at `(x, y)`.
    pub fn memory(&self, x: u32, y: u32) -> Option<&[f32]> {
        self.pes
            .iter()
            .find(|p| (p.x, p.y) == (x, y))
            .map(|p| p.mem.as_slice())
    }

    /// What left the fabric at `(x, y)` through port `dir` on `colour`: (cycle, value).
    pub fn output(&self, x: u32, y: u32, dir: Dir, colour: Colour) -> &[(u64, f32)] {
        self.outs
            .iter()
            .find(|(k, _)| *k == (x, y, dir, colour))
            .map_or(&[], |(_, v)| v.as_slice())
    }
}
