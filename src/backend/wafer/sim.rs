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

use super::cost;
use super::fabric::Fabric;
use super::isa::{Colour, Dsd, Instr, Program, Src, Trigger, VecOp, COUNTERS};
use super::pipeline::Passes;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::fmt;
use std::sync::Arc;

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

/// Where a stream goes: the links of its route tree in order from the source, each
/// with its parent (an index into `links`, or none for the first hop), and the
/// destinations (PE or host output) with the tree node they hang from.
#[derive(Debug, Clone)]
struct Stream {
    src: Endpoint,
    colour: Colour,
    links: Vec<(usize, Option<usize>)>,
    dests: Vec<Dest>,
    /// Wavelets it may still send without asking its destinations for room: the
    /// least room any had when last asked (room only grows as they take).
    credit: u64,
    /// The destination its sender waits on (full, with nothing taken since): only a
    /// take there can give it room, so only that one wakes it.
    blocked: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Endpoint {
    Pe(usize),
    Host(usize),
}

#[derive(Debug, Clone)]
struct Dest {
    to: Sink,
    /// The index in `links` of the last link before it (none: the source's own router).
    after: Option<usize>,
    cap: u64,
    /// Wavelets sent to it; frees (takes from its queue) counted; the cycles of the
    /// takes not counted yet (a consumer may run ahead of its sender).
    sent: u64,
    counted: u64,
    frees: VecDeque<u64>,
}

impl Dest {
    fn new(to: Sink, after: Option<usize>, cap: u64) -> Dest {
        Dest {
            to,
            after,
            cap,
            sent: 0,
            counted: 0,
            frees: VecDeque::new(),
        }
    }

    /// Wavelets sent and not yet taken, whenever taken.
    fn held(&self) -> u64 {
        self.sent - self.counted - self.frees.len() as u64
    }
}

/// Whether a stream has room for a wavelet at a cycle.
enum Room {
    Yes,
    /// Not before this cycle (when its consumer takes one).
    At(u64),
    /// Not until its consumer takes one.
    No,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Sink {
    Pe(usize),
    /// Off the grid at `(x, y)` through a port: collected as an output.
    Out(usize),
}

/// What a waiting PE waits for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Wait {
    /// A wavelet on this colour.
    In(Colour),
    /// Room in this stream.
    Room(usize),
    /// Nothing to run: idle.
    Idle,
}

/// Where a task is: per nesting level, the instruction and the loop's iteration.
#[derive(Debug, Clone)]
struct Frame {
    pc: usize,
    iter: u32,
}

/// A task being run: where it is, and how far its current vector instruction got when
/// that one goes element by element (operands on the fabric).
#[derive(Debug, Clone)]
struct Running {
    task: usize,
    frames: smallvec::SmallVec<[Frame; 4]>,
    vec: Option<Progress>,
}

#[derive(Debug, Clone, Copy)]
struct Progress {
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
        let err = |m: String| Err(SetupError(m));
        let colours = f.colours as usize;
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
            let prog = &prog;
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
            let mut m = mem.clone();
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
            index.insert((x, y), pes.len());
            pes.push(Pe {
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
            });
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
        let mut links = BTreeMap::new();
        // every stream starts at a router whose route takes the colour from its ramp,
        // or from off the grid (a host input)
        for (&(x, y, c), r) in &setup.routes {
            if c as usize >= colours {
                return err(format!(
                    "router ({x}, {y}): colour {c} is beyond the fabric's {colours}"
                ));
            }
            let src = if r.rx == Dir::Ramp {
                match index.get(&(x, y)) {
                    Some(&p) => Endpoint::Pe(p),
                    None => return err(format!("router ({x}, {y}) takes colour {c} from its ramp, but no program runs there")),
                }
            } else if r.rx.step(x, y, f).is_none() {
                let Some(h) = setup
                    .inputs
                    .iter()
                    .position(|h| (h.x, h.y, h.colour) == (x, y, c))
                else {
                    return err(format!("router ({x}, {y}) takes colour {c} from off the grid ({}), but the host sends nothing there", r.rx.name()));
                };
                Endpoint::Host(h)
            } else {
                continue;
            };
            let id = sim.streams.len();
            let stream = sim.trace(src, x, y, c, &setup.routes, &index, &mut links)?;
            match src {
                Endpoint::Pe(p) => sim.pes[p].sends[c as usize] = Some(id),
                Endpoint::Host(h) => sim.hosts[h].stream = id,
            }
            for (d, dest) in stream.dests.iter().enumerate() {
                if let Sink::Pe(q) = dest.to {
                    let feed = &mut sim.pes[q].feeds[c as usize];
                    if feed.is_some() {
                        return err(format!(
                            "PE ({}, {}) receives colour {c} from two streams",
                            sim.pes[q].x, sim.pes[q].y
                        ));
                    }
                    *feed = Some((id, d));
                }
            }
            sim.streams.push(stream);
        }
        if let Some(h) = (0..setup.inputs.len())
            .find(|&h| !sim.streams.iter().any(|s| s.src == Endpoint::Host(h)))
        {
            let h = &setup.inputs[h];
            return err(format!("the host sends on colour {} at ({}, {}), where no route takes it from off the grid", h.colour, h.x, h.y));
        }
        sim.link_free = vec![0; links.len()];
        sim.link_sent = vec![0; links.len()];
        sim.link_at = vec![(0, 0, Dir::Ramp); links.len()];
        for (&at, &i) in &links {
            sim.link_at[i] = at;
        }
        sim.pending = vec![None; sim.pes.len() + sim.hosts.len()];
        for p in 0..sim.pes.len() {
            sim.schedule(p, 0);
        }
        for h in 0..sim.hosts.len() {
            sim.schedule(sim.pes.len() + h, 0);
        }
        Ok(sim)
    }

    /// Follows colour `c`'s routes from the router at `(x, y)`.
    #[allow(clippy::too_many_arguments)]
    fn trace(
        &mut self,
        src: Endpoint,
        x: u32,
        y: u32,
        c: Colour,
        routes: &BTreeMap<(u32, u32, Colour), Route>,
        index: &BTreeMap<(u32, u32), usize>,
        links: &mut BTreeMap<(u32, u32, Dir), usize>,
    ) -> Result<Stream, SetupError> {
        let f = &self.f;
        let mut s = Stream {
            src,
            colour: c,
            links: Vec::new(),
            dests: Vec::new(),
            credit: 0,
            blocked: None,
        };
        // (router, the link that reached it, hops)
        let mut todo = VecDeque::from([((x, y), None::<usize>, 0u32)]);
        let mut seen = std::collections::BTreeSet::new();
        while let Some(((x, y), via, hops)) = todo.pop_front() {
            if !seen.insert((x, y)) {
                return Err(SetupError(format!(
                    "colour {c}'s routes reach router ({x}, {y}) twice (a loop or a merge)"
                )));
            }
            let r = routes[&(x, y, c)];
            for d in r.tx() {
                if d == Dir::Ramp {
                    let Some(&q) = index.get(&(x, y)) else {
                        return Err(SetupError(format!(
                            "colour {c} is routed to the ramp of ({x}, {y}), where no program runs"
                        )));
                    };
                    if src == Endpoint::Pe(q) {
                        return Err(SetupError(format!(
                            "PE ({x}, {y}) sends colour {c} to itself"
                        )));
                    }
                    let cap = u64::from(f.queue_depth) * u64::from(hops + 1)
                        + u64::from(self.pes[q].prog.fifo_words(c));
                    s.dests.push(Dest::new(Sink::Pe(q), via, cap));
                    continue;
                }
                let n = links.len();
                let link = *links.entry((x, y, d)).or_insert(n);
                s.links.push((link, via));
                let here = s.links.len() - 1;
                match d.step(x, y, f) {
                    None => {
                        let port = (x, y, d, c);
                        let o = match self.outs.iter().position(|(k, _)| *k == port) {
                            Some(o) => o,
                            None => {
                                self.outs.push((port, Vec::new()));
                                self.outs.len() - 1
                            }
                        };
                        s.dests.push(Dest::new(Sink::Out(o), Some(here), u64::MAX));
                    }
                    Some((nx, ny)) => match routes.get(&(nx, ny, c)) {
                        Some(nr) if nr.rx == d.opposite() => {
                            todo.push_back(((nx, ny), Some(here), hops + 1))
                        }
                        _ => {
                            return Err(SetupError(format!("colour {c} leaves ({x}, {y}) {}, but router ({nx}, {ny}) does not take it from the {}", d.name(), d.opposite().name())))
                        }
                    },
                }
            }
        }
        Ok(s)
    }

    fn schedule(&mut self, who: usize, t: u64) {
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

    /// The cycle the last task ended or the last output left the fabric.
    fn end(&self) -> u64 {
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

    /// Sends one wavelet on stream `s` at cycle `t`: reserves its links and queues it
    /// at each destination (whose PE, if waiting for it, is woken).
    fn send(&mut self, s: usize, t: u64, v: f32) {
        let f = &self.f;
        let hop = u64::from(f.hop_latency);
        let ramp = u64::from(f.ramp_latency);
        self.streams[s].credit = self.streams[s].credit.saturating_sub(1);
        let st = &self.streams[s];
        // per link of the tree: the cycle the wavelet reaches the router it leads to
        let mut at = std::mem::take(&mut self.reach);
        at.clear();
        for &(link, parent) in &st.links {
            let reach = parent.map_or(t + ramp, |p| at[p]);
            let leave = reach.max(self.link_free[link]);
            self.link_free[link] = leave + 1;
            self.link_sent[link] += 1;
            at.push(leave + hop);
        }
        let c = st.colour as usize;
        let n = st.dests.len();
        for d in 0..n {
            let dest = &self.streams[s].dests[d];
            let reach = dest.after.map_or(t + ramp, |l| at[l]);
            match dest.to {
                Sink::Out(o) => self.outs[o].1.push((reach, v)),
                Sink::Pe(q) => {
                    let arrive = reach + ramp;
                    self.streams[s].dests[d].sent += 1;
                    self.pes[q].queues[c].push_back((arrive, v));
                    let pe = &self.pes[q];
                    let wake = match pe.wait {
                        Some(Wait::In(w)) if w as usize == c => true,
                        Some(Wait::Idle) => {
                            pe.triggers & 1u64.checked_shl(c as u32).unwrap_or(0) != 0
                        }
                        _ => false,
                    };
                    if wake {
                        let at = pe.time.max(arrive);
                        self.schedule(q, at);
                    }
                }
            }
        }
        self.reach = at;
    }

    /// Whether stream `s` has room for one more wavelet at every destination at cycle
    /// `t` (a sender asks at cycles that never go back).
    ///
    /// When it has none, the destination it waits on is kept (`Stream::blocked`);
    /// when it has, it may send the least room any destination has without asking
    /// again (`Stream::credit`).
    fn room(&mut self, s: usize, t: u64) -> Room {
        let st = &mut self.streams[s];
        if st.credit > 0 {
            return Room::Yes;
        }
        let mut room = Room::Yes;
        let mut least = u64::MAX;
        let mut blocked = None;
        for (i, d) in st.dests.iter_mut().enumerate() {
            while d.frees.front().is_some_and(|&at| at <= t) {
                d.frees.pop_front();
                d.counted += 1;
            }
            let held = d.sent - d.counted;
            if held >= d.cap {
                if d.frees.is_empty() && blocked.is_none() {
                    blocked = Some(i);
                }
                room = match (d.frees.front(), room) {
                    (None, _) | (_, Room::No) => Room::No,
                    (Some(&at), Room::At(b)) => Room::At(at.max(b)),
                    (Some(&at), Room::Yes) => Room::At(at),
                };
            } else {
                least = least.min(d.cap - held);
            }
        }
        st.blocked = blocked.filter(|_| matches!(room, Room::No));
        if matches!(room, Room::Yes) {
            st.credit = least;
        }
        room
    }

    /// Takes the wavelet at the head of PE `p`'s queue of colour `c` at cycle `t`,
    /// making room in its stream from then on (and waking a sender waiting for it).
    fn take(&mut self, p: usize, c: Colour, t: u64) -> f32 {
        let (_, v) = self.pes[p].queues[c as usize]
            .pop_front()
            .unwrap_or((0, f32::NAN));
        if let Some((s, d)) = self.pes[p].feeds[c as usize] {
            self.streams[s].dests[d].frees.push_back(t);
            // (a sender waiting on another destination still has no room)
            if self.streams[s].blocked.is_some_and(|b| b != d) {
                return v;
            }
            match self.streams[s].src {
                Endpoint::Pe(q) if self.pes[q].wait == Some(Wait::Room(s)) => {
                    let at = self.pes[q].time.max(t);
                    self.schedule(q, at);
                }
                Endpoint::Host(h) if self.hosts[h].waiting => {
                    let at = self.hosts[h].time.max(t);
                    self.schedule(self.pes.len() + h, at);
                }
                _ => {}
            }
        }
        v
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

    /// Executes the current instruction of task `run` of PE `p` as far as it can go.
    fn advance(&mut self, p: usize, prog: &Program, run: &mut Running, t: u64) -> Step {
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
                if op != VecOp::Mov {
                    pe.stats.work += u64::from(n);
                }
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
            } => {
                let c = &mut pe.counters[*counter as usize];
                *c += 1;
                if *c >= *every {
                    *c = 0;
                    if let Some(then) = then {
                        pe.active |= 1u64 << then;
                    }
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
        let lanes = if op.software() { 1 } else { f.fp32_lanes };
        let startup = if start { u64::from(f.dsd_startup) } else { 0 };
        let pe = &mut self.pes[p];
        if !fabric {
            // on SRAM alone: all of it at once
            sram_op(pe, (op, dst, srcs), loops);
            let cycles = cost::vec_op(f, op, n, reads, writes) + startup - u64::from(f.dsd_startup);
            pe.time += cycles;
            pe.stats.busy += cycles;
            if op != VecOp::Mov {
                pe.stats.work += u64::from(n);
            }
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
        if op != VecOp::Mov {
            pe.stats.work += u64::from(n);
        }
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

/// How far a PE got.
enum Step {
    /// On to the next instruction.
    Continue,
    /// The task ended.
    Done,
    /// Back at this cycle (it ran ahead and must decide then).
    Yield(u64),
    Wait(Wait),
}

/// Whether `nest` is a multi-dimensional operation (`Instr::dims`) on SRAM alone.
fn on_sram(nest: &Instr) -> bool {
    if nest.dims().is_none() {
        return false;
    }
    let mut i = nest;
    while let Instr::Loop { body, .. } = i {
        i = &body[0];
    }
    matches!(i, Instr::Vec { dst, srcs, .. } if !cost::on_fabric(dst, srcs))
}

/// Runs every iteration of `nest` (a loop nest around one operation on SRAM alone,
/// inside the loops at `at`, which it extends) on `pe`: its operation, elements, and
/// cycles past the start-up (`cost::body`'s).
fn run_nest(
    f: &Fabric,
    pe: &mut Pe,
    nest: &Instr,
    at: &mut smallvec::SmallVec<[u32; 4]>,
) -> (VecOp, u32, u64) {
    match nest {
        // the innermost loop: its operands resolved once, then moved by their steps
        Instr::Loop { count, body } if matches!(&body[..], [Instr::Vec { srcs, .. }] if !srcs.iter().any(|s| matches!(s, Src::Scalar(_)))) =>
        {
            let Instr::Vec { op, dst, srcs } = &body[0] else {
                return (VecOp::Mov, 0, 0);
            };
            let level = at.len();
            at.push(0);
            let ops = resolve(srcs, &pe.mem, at, &pe.counters);
            let d = dest(dst, at, &pe.counters, &pe.mem);
            at.pop();
            let moves = |x: &Dsd| match x {
                Dsd::Mem { step, .. } => i64::from(step.get(level).copied().unwrap_or(0)),
                _ => 0,
            };
            let mut by = [0i64; 3];
            for (k, s) in srcs.iter().enumerate().take(3) {
                if let Src::V(x) = s {
                    by[k] = moves(x);
                }
            }
            let dby = moves(dst);
            let n = dst.len();
            for i in 0..i64::from(*count) {
                let mut o = ops;
                for (k, x) in o.iter_mut().enumerate() {
                    if let Opnd::Mem(a, st) = *x {
                        *x = Opnd::Mem(a + i * by[k], st);
                    }
                }
                compute(&mut pe.mem, *op, &o, d.map(|(a, st)| (a + i * dby, st)), n);
            }
            let steps = cost::vec_op(f, *op, n, cost::reads(srcs), true) - u64::from(f.dsd_startup);
            (*op, n * count, steps * u64::from(*count))
        }
        Instr::Loop { count, body } => {
            let (mut op, mut n, mut steps) = (VecOp::Mov, 0, 0);
            at.push(0);
            for i in 0..*count {
                *at.last_mut().expect("pushed") = i;
                let r = run_nest(f, pe, &body[0], at);
                (op, n, steps) = (r.0, n + r.1, steps + r.2);
            }
            at.pop();
            (op, n, steps)
        }
        Instr::Vec { op, dst, srcs } => {
            sram_op(pe, (*op, dst, srcs), at);
            let n = dst.len();
            let steps = cost::vec_op(f, *op, n, cost::reads(srcs), true) - u64::from(f.dsd_startup);
            (*op, n, steps)
        }
        _ => (VecOp::Mov, 0, 0),
    }
}

/// An operation on SRAM alone, inside loops at `loops`, on `pe`'s memory.
fn sram_op(pe: &mut Pe, (op, dst, srcs): (VecOp, &Dsd, &[Src]), loops: &[u32]) {
    let ops = resolve(srcs, &pe.mem, loops, &pe.counters);
    let d = dest(dst, loops, &pe.counters, &pe.mem);
    compute(&mut pe.mem, op, &ops, d, dst.len());
}

/// An operation on SRAM alone over `n` elements of resolved operands: all at once
/// (`sweep`), or element by element where some word leaves memory.
fn compute(mem: &mut [f32], op: VecOp, ops: &[Opnd; 3], d: Option<(i64, i64)>, n: u32) {
    if !sweep(mem, op, ops, d, n) {
        for i in 0..n {
            let v = element(mem, op, ops, i, &[], None);
            store(mem, d, i, v);
        }
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

/// A source of a vector operation with its address resolved for the instruction's
/// loops and counters: element `i` of a memory source is at `start + i * stride`.
#[derive(Debug, Clone, Copy)]
enum Opnd {
    Mem(i64, i64),
    Fab,
    Const(f32),
    Recv,
    None,
}

/// The sources of an instruction, resolved.
fn resolve(srcs: &[Src], mem: &[f32], loops: &[u32], counters: &[u32]) -> [Opnd; 3] {
    let mut out = [Opnd::None; 3];
    for (k, s) in srcs.iter().enumerate().take(3) {
        out[k] = match s {
            Src::V(d @ Dsd::Mem { stride, .. }) => match d.word(0, loops, counters, mem) {
                Some(a) => Opnd::Mem(a, i64::from(*stride)),
                None => Opnd::Const(f32::NAN),
            },
            Src::V(Dsd::In { .. }) => Opnd::Fab,
            Src::V(Dsd::Out { .. }) => Opnd::Const(f32::NAN),
            Src::Scalar(a) => Opnd::Const(load(mem, Some(i64::from(*a)))),
            Src::Recv(_) => Opnd::Recv,
            Src::Imm(x) => Opnd::Const(*x),
        };
    }
    out
}

/// Where element 0 of a memory destination is, and its stride.
fn dest(dst: &Dsd, loops: &[u32], counters: &[u32], mem: &[f32]) -> Option<(i64, i64)> {
    match dst {
        Dsd::Mem { stride, .. } => dst
            .word(0, loops, counters, mem)
            .map(|a| (a, i64::from(*stride))),
        _ => None,
    }
}

/// The value of element `i` of an operation over resolved sources.
fn element(
    mem: &[f32],
    op: VecOp,
    srcs: &[Opnd; 3],
    i: u32,
    fab: &[f32],
    scalar: Option<f32>,
) -> f32 {
    let mut v = [0.0f32; 3];
    let mut j = 0;
    for (k, s) in srcs.iter().enumerate() {
        v[k] = match *s {
            Opnd::Mem(a, st) => load(mem, Some(a + i64::from(i) * st)),
            Opnd::Fab => {
                let x = fab.get(j).copied().unwrap_or(f32::NAN);
                j += 1;
                x
            }
            Opnd::Const(x) => x,
            Opnd::Recv => scalar.unwrap_or(f32::NAN),
            Opnd::None => 0.0,
        };
    }
    op.apply(v[0], v[1], v[2])
}

/// An operation on SRAM alone over `n` elements whose operands all lie within memory,
/// as `element` and `store` would compute it, with the operation chosen once and each
/// operand's place worked out once; false (nothing done) when some operand or the
/// destination leaves memory, which `element` and `store` handle word by word.
fn sweep(mem: &mut [f32], op: VecOp, ops: &[Opnd; 3], dst: Option<(i64, i64)>, n: u32) -> bool {
    #[derive(Clone, Copy)]
    enum At {
        Mem(usize, isize),
        Const(f32),
    }
    let len = mem.len() as i64;
    let last = i64::from(n.max(1) - 1);
    let within = |a: i64, st: i64| a >= 0 && a < len && a + last * st >= 0 && a + last * st < len;
    let Some((d, ds)) = dst.filter(|&(a, st)| within(a, st)) else {
        return false;
    };
    let mut at = [At::Const(0.0); 3];
    for (k, o) in ops.iter().enumerate() {
        at[k] = match *o {
            Opnd::Mem(a, st) if within(a, st) => At::Mem(a as usize, st as isize),
            Opnd::Const(x) => At::Const(x),
            Opnd::None => At::Const(0.0),
            _ => return false,
        };
    }
    fn run(
        mem: &mut [f32],
        at: [At; 3],
        (d, ds): (usize, isize),
        n: u32,
        f: impl Fn(f32, f32, f32) -> f32,
    ) {
        let get = |mem: &[f32], a: At, i: isize| match a {
            At::Mem(b, st) => mem[(b as isize + i * st) as usize],
            At::Const(x) => x,
        };
        for i in 0..n as isize {
            let v = f(get(mem, at[0], i), get(mem, at[1], i), get(mem, at[2], i));
            mem[(d as isize + i * ds) as usize] = v;
        }
    }
    let d = (d as usize, ds as isize);
    match op {
        VecOp::Fmac => run(mem, at, d, n, |a, b, c| a + b * c),
        VecOp::Mov => run(mem, at, d, n, |a, _, _| a),
        VecOp::Add => run(mem, at, d, n, |a, b, _| a + b),
        VecOp::Sub => run(mem, at, d, n, |a, b, _| a - b),
        VecOp::Mul => run(mem, at, d, n, |a, b, _| a * b),
        op => run(mem, at, d, n, |a, b, c| op.apply(a, b, c)),
    }
    true
}

fn load(mem: &[f32], a: Option<i64>) -> f32 {
    a.and_then(|a| usize::try_from(a).ok())
        .and_then(|a| mem.get(a))
        .copied()
        .unwrap_or(f32::NAN)
}

fn store(mem: &mut [f32], dst: Option<(i64, i64)>, i: u32, v: f32) {
    if let Some(m) = dst
        .and_then(|(a, st)| usize::try_from(a + i64::from(i) * st).ok())
        .and_then(|a| mem.get_mut(a))
    {
        *m = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::wafer::isa::{Task, TaskId};

    fn fabric() -> Fabric {
        Fabric::named("test32").unwrap()
    }

    fn task(id: TaskId, name: &str, trigger: Trigger, body: Vec<Instr>) -> Task {
        Task {
            id,
            name: name.into(),
            trigger,
            body,
        }
    }

    fn vec(op: VecOp, dst: Dsd, srcs: Vec<Src>) -> Instr {
        Instr::Vec { op, dst, srcs }
    }

    const START: Trigger = Trigger::Local { at_start: true };

    /// A PE that sends its first `n` words on colour 1 at start.
    fn sender(n: u32) -> Program {
        let mut p = Program::default();
        let x = p.alloc("x", n);
        p.tasks.push(task(
            0,
            "send",
            START,
            vec![vec(
                VecOp::Mov,
                Dsd::Out { colour: 1, len: n },
                vec![Src::V(Dsd::mem(x, n))],
            )],
        ));
        p
    }

    /// A PE that adds `n` wavelets of colour 1 into its first `n` words.
    fn receiver(n: u32) -> Program {
        let mut p = Program::default();
        let y = p.alloc("y", n);
        p.tasks.push(task(
            0,
            "receive",
            Trigger::Data(1),
            vec![vec(
                VecOp::Add,
                Dsd::mem(y, n),
                vec![
                    Src::V(Dsd::mem(y, n)),
                    Src::V(Dsd::In { colour: 1, len: n }),
                ],
            )],
        ));
        p
    }

    fn stats(sim: &Sim, x: u32, y: u32) -> PeStats {
        sim.stats().into_iter().find(|s| s.0 == (x, y)).unwrap().1
    }

    #[test]
    fn a_task_on_sram_costs_its_switch_start_up_and_elements() {
        let mut p = Program::default();
        let y = p.alloc("y", 64);
        let a = p.alloc("a", 64);
        p.tasks.push(task(
            0,
            "axpy",
            START,
            vec![vec(
                VecOp::Fmac,
                Dsd::mem(y, 64),
                vec![
                    Src::V(Dsd::mem(y, 64)),
                    Src::V(Dsd::mem(a, 64)),
                    Src::Imm(2.0),
                ],
            )],
        ));
        let mem: Vec<f32> = (0..128).map(|i| i as f32).collect();
        let mut setup = Setup::default();
        setup.pes.insert((3, 4), (Arc::new(p), mem));
        let mut sim = Sim::new(&fabric(), &setup).unwrap();
        // task switch 10, start-up 5, 64 elements at one per cycle
        assert_eq!(sim.run().unwrap(), 10 + 5 + 64);
        let m = sim.memory(3, 4).unwrap();
        assert_eq!(m[5], 5.0 + 2.0 * 69.0);
        assert_eq!(stats(&sim, 3, 4).busy, 79);
    }

    #[test]
    fn a_loop_around_one_operation_starts_it_once() {
        // y[0..4] += W[i][0..4] * x[i] for i in 0..3: one two-dimensional operation;
        // the same with a second operation in the loop's body starts both each time
        let fmacs = |two: bool| {
            let mut p = Program::default();
            let (y, w, x, z) = (
                p.alloc("y", 4),
                p.alloc("W", 12),
                p.alloc("x", 3),
                p.alloc("z", 1),
            );
            let mut body = vec![vec(
                VecOp::Fmac,
                Dsd::mem(y, 4),
                vec![
                    Src::V(Dsd::mem(y, 4)),
                    Src::V(Dsd::strided(w, 4, 1, &[4], None)),
                    Src::V(Dsd::strided(x, 4, 0, &[1], None)),
                ],
            )];
            if two {
                body.push(vec(VecOp::Mov, Dsd::mem(z, 1), vec![Src::Imm(1.0)]));
            }
            p.tasks
                .push(task(0, "gemv", START, vec![Instr::Loop { count: 3, body }]));
            let mem: Vec<f32> = (0..20)
                .map(|i| if i < 4 { 0.0 } else { i as f32 })
                .collect();
            let mut setup = Setup::default();
            setup.pes.insert((0, 0), (Arc::new(p), mem));
            let mut sim = Sim::new(&fabric(), &setup).unwrap();
            let end = sim.run().unwrap();
            (end, sim.memory(0, 0).unwrap()[..4].to_vec())
        };
        // switch 10, start-up 5, 3 x 4 elements
        let (end, y) = fmacs(false);
        assert_eq!(end, 10 + 5 + 12);
        // y[j] = sum_i W[i][j] x[i], W[i][j] = 4 + 4i + j, x[i] = 16 + i
        let want: Vec<f32> = (0..4)
            .map(|j| (0..3).map(|i| ((4 + 4 * i + j) * (16 + i)) as f32).sum())
            .collect();
        assert_eq!(y, want);
        // each iteration: start-up 5 + 4, start-up 5 + 1
        assert_eq!(fmacs(true), (10 + 3 * (9 + 6), want));
    }

    /// PE (0, 0) streams `n` words east to PE (1, 0), which adds them to its own.
    fn pair(n: u32) -> Sim {
        let xs: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
        let to = (receiver(n), vec![100.0; n as usize]);
        Sim::new(&fabric(), &east((sender(n), xs), to)).unwrap()
    }

    /// PE (0, 0) running `from` and PE (1, 0) running `to` (with their memories), colour
    /// 1 routed from the first to the second.
    fn east(from: (Program, Vec<f32>), to: (Program, Vec<f32>)) -> Setup {
        let mut setup = Setup::default();
        setup.pes.insert((0, 0), (Arc::new(from.0), from.1));
        setup.pes.insert((1, 0), (Arc::new(to.0), to.1));
        setup
            .routes
            .insert((0, 0, 1), Route::new(Dir::Ramp, &[Dir::E]));
        setup
            .routes
            .insert((1, 0, 1), Route::new(Dir::W, &[Dir::Ramp]));
        setup
    }

    /// A run that ends with wavelets in a queue that no task took (a receiver that takes
    /// 3 of the 8 sent, once) is an error naming the PE, the colour and the count.
    #[test]
    fn wavelets_left_over_are_reported() {
        let mut once = Program::default();
        let y = once.alloc("y", 3);
        once.tasks.push(task(
            0,
            "take three",
            START,
            vec![vec(
                VecOp::Mov,
                Dsd::mem(y, 3),
                vec![Src::V(Dsd::In { colour: 1, len: 3 })],
            )],
        ));
        let setup = east((sender(8), vec![1.0; 8]), (once, vec![0.0; 3]));
        let mut sim = Sim::new(&fabric(), &setup).unwrap();
        let e = sim.run().unwrap_err();
        assert_eq!(e.waiting, 0);
        assert_eq!(
            e.chain,
            ["PE (1, 0) holds 5 wavelets on colour 1 that no task took"]
        );
        assert!(e.to_string().contains("wavelets left over"), "{e}");
    }

    /// A data task that never ran (its stream lost) ends a run quietly; `short_runs`
    /// names its PE, and counts the runs of one that did.
    #[test]
    fn a_data_task_that_never_ran_is_found() {
        // 8 wavelets into a task that takes 4: it runs twice
        let setup = east((sender(8), vec![1.0; 8]), (receiver(4), vec![0.0; 4]));
        let mut sim = Sim::new(&fabric(), &setup).unwrap();
        let before = sim.data_runs();
        sim.run().unwrap();
        assert_eq!(sim.short_runs(&before, 2), None);
        assert_eq!(
            sim.short_runs(&before, 3).as_deref(),
            Some("PE (1, 0) started its 1 data tasks 2 times in all, not 3: a stream was lost")
        );
        // a receiver nothing sends to
        let mut setup = Setup::default();
        setup
            .pes
            .insert((1, 0), (Arc::new(receiver(4)), vec![0.0; 4]));
        let mut sim = Sim::new(&fabric(), &setup).unwrap();
        let before = sim.data_runs();
        assert_eq!(sim.run(), Ok(0));
        assert!(sim
            .short_runs(&before, 1)
            .is_some_and(|m| m.contains("0 times")));
    }

    #[test]
    fn a_stream_arrives_after_its_ramps_and_hop() {
        let mut sim = pair(8);
        let end = sim.run().unwrap();
        // sent at 15..22 (switch 10, start-up 5); queued at the receiver 5 cycles later
        // (2 + 1 + 2), 20..27; the receiver's task starts at 20, its elements at 35..42
        assert_eq!(stats(&sim, 0, 0).done, 23);
        assert_eq!(stats(&sim, 1, 0).done, 43);
        assert_eq!(end, 43);
        let m = sim.memory(1, 0).unwrap();
        assert_eq!(m[..3], [100.5, 101.5, 102.5]);
    }

    #[test]
    fn a_full_stream_holds_its_sender_back() {
        // room for 4 x (1 + 1) = 8 wavelets: the sender waits from its 9th until the
        // receiver takes the first at 35, then sends one per cycle (35..46); the
        // receiver takes #8 at 43 (it arrived at 40) and the last at 54
        let mut sim = pair(20);
        let end = sim.run().unwrap();
        let (s, r) = (stats(&sim, 0, 0), stats(&sim, 1, 0));
        assert_eq!(s.done, 47);
        assert_eq!(s.stalled, 35 - 23);
        assert_eq!(r.done, 55);
        assert_eq!(end, 55);
        assert_eq!(sim.memory(1, 0).unwrap()[19], 119.5);
    }

    #[test]
    fn a_multicast_reaches_every_consumer() {
        let mut setup = Setup::default();
        setup
            .pes
            .insert((0, 1), (Arc::new(sender(4)), vec![1.0, 2.0, 3.0, 4.0]));
        for x in 1..4 {
            setup
                .pes
                .insert((x, 1), (Arc::new(receiver(4)), vec![0.0; 4]));
        }
        setup
            .routes
            .insert((0, 1, 1), Route::new(Dir::Ramp, &[Dir::E]));
        setup
            .routes
            .insert((1, 1, 1), Route::new(Dir::W, &[Dir::Ramp, Dir::E]));
        setup
            .routes
            .insert((2, 1, 1), Route::new(Dir::W, &[Dir::Ramp, Dir::E]));
        setup
            .routes
            .insert((3, 1, 1), Route::new(Dir::W, &[Dir::Ramp]));
        let mut sim = Sim::new(&fabric(), &setup).unwrap();
        sim.run().unwrap();
        for x in 1..4 {
            assert_eq!(sim.memory(x, 1).unwrap(), [1.0, 2.0, 3.0, 4.0]);
            // the first wavelet left at 15 and arrives after 2 + x + 2 cycles; the
            // task starts then, and its last element is 10 + 5 + 3 cycles later
            assert_eq!(stats(&sim, x, 1).done, 15 + 4 + u64::from(x) + 10 + 5 + 4);
        }
    }

    #[test]
    fn host_streams_enter_and_leave_at_the_edges() {
        // the host sends 3 values into (0, 0) from the west; PE (0, 0) doubles each and
        // sends it on colour 2 east to (1, 0), whose router turns it off the north edge
        let mut p = Program::default();
        p.tasks.push(task(
            0,
            "double",
            Trigger::Data(1),
            vec![vec(
                VecOp::Mul,
                Dsd::Out { colour: 2, len: 3 },
                vec![Src::V(Dsd::In { colour: 1, len: 3 }), Src::Imm(2.0)],
            )],
        ));
        let mut setup = Setup::default();
        setup.pes.insert((0, 0), (Arc::new(p), vec![]));
        setup.inputs.push(HostIn {
            x: 0,
            y: 0,
            colour: 1,
            values: vec![1.0, 2.0, 3.0],
        });
        setup
            .routes
            .insert((0, 0, 1), Route::new(Dir::W, &[Dir::Ramp]));
        setup
            .routes
            .insert((0, 0, 2), Route::new(Dir::Ramp, &[Dir::E]));
        setup
            .routes
            .insert((1, 0, 2), Route::new(Dir::W, &[Dir::N]));
        let mut sim = Sim::new(&fabric(), &setup).unwrap();
        let end = sim.run().unwrap();
        let out = sim.output(1, 0, Dir::N, 2);
        let values: Vec<f32> = out.iter().map(|o| o.1).collect();
        assert_eq!(values, [2.0, 4.0, 6.0]);
        // in at 0, 1, 2 and queued at 4, 5, 6; the task starts at 4 and computes at
        // 19, 20, 21; each value reaches (1, 0) 2 + 1 cycles later and leaves north 1
        // cycle after that
        assert_eq!(out[0].0, 19 + 2 + 1 + 1);
        assert_eq!(end, 21 + 4);
    }

    #[test]
    fn a_deadlock_is_reported_with_its_chain_of_waits() {
        // each PE first waits for a wavelet from the other
        let prog = |from: Colour, to: Colour| {
            let mut p = Program::default();
            let y = p.alloc("y", 1);
            p.tasks.push(task(
                0,
                "exchange",
                START,
                vec![
                    vec(
                        VecOp::Mov,
                        Dsd::mem(y, 1),
                        vec![Src::V(Dsd::In {
                            colour: from,
                            len: 1,
                        })],
                    ),
                    vec(
                        VecOp::Mov,
                        Dsd::Out { colour: to, len: 1 },
                        vec![Src::V(Dsd::mem(y, 1))],
                    ),
                ],
            ));
            Arc::new(p)
        };
        let mut setup = Setup::default();
        setup.pes.insert((0, 0), (prog(1, 2), vec![]));
        setup.pes.insert((1, 0), (prog(2, 1), vec![]));
        setup
            .routes
            .insert((0, 0, 2), Route::new(Dir::Ramp, &[Dir::E]));
        setup
            .routes
            .insert((1, 0, 2), Route::new(Dir::W, &[Dir::Ramp]));
        setup
            .routes
            .insert((1, 0, 1), Route::new(Dir::Ramp, &[Dir::W]));
        setup
            .routes
            .insert((0, 0, 1), Route::new(Dir::E, &[Dir::Ramp]));
        let mut sim = Sim::new(&fabric(), &setup).unwrap();
        let d = sim.run().unwrap_err();
        assert_eq!(d.waiting, 2);
        assert_eq!(
            d.chain,
            [
                "PE (0, 0) in task `exchange` waits for a wavelet on colour 1 from PE (1, 0)",
                "PE (1, 0) in task `exchange` waits for a wavelet on colour 2 from PE (0, 0)",
                "PE (0, 0) in task `exchange` (a cycle)",
            ]
        );
    }

    #[test]
    fn broken_routes_are_refused_before_running() {
        let mut setup = Setup::default();
        setup
            .pes
            .insert((0, 0), (Arc::new(sender(2)), vec![1.0, 2.0]));
        setup
            .routes
            .insert((0, 0, 1), Route::new(Dir::Ramp, &[Dir::E]));
        setup
            .routes
            .insert((1, 0, 1), Route::new(Dir::N, &[Dir::Ramp]));
        let e = Sim::new(&fabric(), &setup).err().unwrap();
        assert!(e.0.contains("does not take it from the west"), "{}", e.0);
        setup
            .routes
            .insert((1, 0, 1), Route::new(Dir::W, &[Dir::Ramp]));
        let e = Sim::new(&fabric(), &setup).err().unwrap();
        assert!(e.0.contains("no program runs"), "{}", e.0);
    }
}
