//! Streams: a colour's route tree from its source (a PE or the host) to its
//! destinations, traced from the setup's routes; a wavelet's way across its links; and
//! end-to-end flow control (a stream's room, its credit, a destination's takes).

use super::engine::Wait;
use super::{Dir, Route, Setup, SetupError, Sim};
use crate::backend::wafer::fabric::Fabric;
use crate::backend::wafer::isa::Colour;
use std::collections::{BTreeMap, VecDeque};

/// Where a stream goes: the links of its route tree in order from the source, each
/// with its parent (an index into `links`, or none for the first hop), and the
/// destinations (PE or host output) with the tree node they hang from.
#[derive(Debug, Clone)]
pub(super) struct Stream {
    pub(super) src: Endpoint,
    pub(super) colour: Colour,
    links: Vec<(usize, Option<usize>)>,
    pub(super) dests: Vec<Dest>,
    /// Wavelets it may still send without asking its destinations for room: the
    /// least room any had when last asked (room only grows as they take).
    credit: u64,
    /// The destination its sender waits on (full, with nothing taken since): only a
    /// take there can give it room, so only that one wakes it.
    blocked: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Endpoint {
    Pe(usize),
    Host(usize),
}

#[derive(Debug, Clone)]
pub(super) struct Dest {
    pub(super) to: Sink,
    /// The index in `links` of the last link before it (none: the source's own router).
    after: Option<usize>,
    pub(super) cap: u64,
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
    pub(super) fn held(&self) -> u64 {
        self.sent - self.counted - self.frees.len() as u64
    }
}

/// Whether a stream has room for a wavelet at a cycle.
pub(super) enum Room {
    Yes,
    /// Not before this cycle (when its consumer takes one).
    At(u64),
    /// Not until its consumer takes one.
    No,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Sink {
    Pe(usize),
    /// Off the grid at `(x, y)` through a port: collected as an output.
    Out(usize),
}

impl Sim {
    /// Follows every stream of `setup`'s routes from the router where it starts
    /// (`trace`), ties each to its source and its destinations' queues, and numbers
    /// the links they cross.
    pub(super) fn connect(
        &mut self,
        f: &Fabric,
        setup: &Setup,
        index: &BTreeMap<(u32, u32), usize>,
    ) -> Result<(), SetupError> {
        let err = |m: String| Err(SetupError(m));
        let colours = f.colours as usize;
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
            let id = self.streams.len();
            let stream = self.trace(src, x, y, c, &setup.routes, index, &mut links)?;
            match src {
                Endpoint::Pe(p) => self.pes[p].sends[c as usize] = Some(id),
                Endpoint::Host(h) => self.hosts[h].stream = id,
            }
            for (d, dest) in stream.dests.iter().enumerate() {
                if let Sink::Pe(q) = dest.to {
                    let feed = &mut self.pes[q].feeds[c as usize];
                    if feed.is_some() {
                        return err(format!(
                            "PE ({}, {}) receives colour {c} from two streams",
                            self.pes[q].x, self.pes[q].y
                        ));
                    }
                    *feed = Some((id, d));
                }
            }
            self.streams.push(stream);
        }
        if let Some(h) = (0..setup.inputs.len())
            .find(|&h| !self.streams.iter().any(|s| s.src == Endpoint::Host(h)))
        {
            let h = &setup.inputs[h];
            return err(format!("the host sends on colour {} at ({}, {}), where no route takes it from off the grid", h.colour, h.x, h.y));
        }
        self.link_free = vec![0; links.len()];
        self.link_sent = vec![0; links.len()];
        self.link_at = vec![(0, 0, Dir::Ramp); links.len()];
        for (&at, &i) in &links {
            self.link_at[i] = at;
        }
        Ok(())
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

    /// Sends one wavelet on stream `s` at cycle `t`: reserves its links and queues it
    /// at each destination (whose PE, if waiting for it, is woken).
    pub(super) fn send(&mut self, s: usize, t: u64, v: f32) {
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
    pub(super) fn room(&mut self, s: usize, t: u64) -> Room {
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
    pub(super) fn take(&mut self, p: usize, c: Colour, t: u64) -> f32 {
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
}
