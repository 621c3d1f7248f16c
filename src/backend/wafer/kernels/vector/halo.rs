//! Halos. In bands of rows (`Vector::bands`: each lane a channel's band of an image),
//! an op that moves an image's pixels along its rows (a depthwise convolution's
//! padding, its taps' windows, a strided one's regrouping of rows, and their gradients)
//! reads rows of the bands beside a lane's. Each lane then computes every value of its
//! code on the rows its readers want (`Halo::rows`, worked out from the code's last
//! readers back: a window of the rows below, its gradient's of the rows above), and a
//! value it holds only its band of (received, stashed, or made at another level) but
//! reads past it is widened first (`Halo::widened`): the lane takes the rows past its
//! band from the lanes of the bands above and below, which send them from theirs.
//!
//! The exchange runs on four colours along a channel's lanes (`HaloColours`): down the
//! strip from an even lane and from an odd one, and up from each (a router passes one
//! colour one way). Every lane of a strip runs the same code in the same order, so the
//! lanes meet each widening in the same order; a lane sends before it takes, and its
//! FIFOs hold what its neighbours send it in one task (`build`), so no lane waits on
//! one that waits on it. A sizing whose windows reach past the bands beside a lane's
//! has no program; the sizer builds the lanes that would show it (`Sizer::vector_period`).

use super::build::Layout;
use super::levels::At;
use super::ops::{at, mov};
use super::pool::pooling;
use super::Vector;
use crate::backend::wafer::form::{planes, Class};
use crate::backend::wafer::isa::{Colour, Dsd, Instr};
use crate::backend::wafer::kernels::split;
use crate::backend::wafer::kernels::{Laid, Orient};
use crate::backend::wafer::lower::{self, Scratch, Val};
use crate::backend::wafer::sim::Dir;
use crate::ir::{NodeIndex, Op};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// Entries of a value's axis 1 (an image's rows, or its groups of rows when regrouped
/// by a stride: `[B, H/s, s, W/s, s, C]`).
pub(super) type Rows = Range<u32>;

/// The colours of a strip's halos: down from an even lane, down from an odd one, up
/// from an even lane, up from an odd one.
pub type HaloColours = [Colour; 4];

/// What a lane's code at one place (a pass and level) holds of its images in bands.
#[derive(Debug, Default, Clone)]
pub struct Halo {
    /// The rows of each value the code computes.
    pub rows: BTreeMap<NodeIndex, Rows>,
    /// The values the code reads past the band the lane holds: the rows it reads.
    pub widened: BTreeMap<NodeIndex, Rows>,
}

/// The hull of two runs of rows (an empty one adds nothing).
fn hull(a: Option<Rows>, b: Rows) -> Rows {
    match a {
        Some(a) if !a.is_empty() => {
            if b.is_empty() {
                a
            } else {
                a.start.min(b.start)..a.end.max(b.end)
            }
        }
        _ => b,
    }
}

impl Vector<'_> {
    /// A planar sample value's entries of axis 1 and words an entry (of one channel).
    pub(super) fn row_layout(&self, n: NodeIndex) -> Option<(u32, u32)> {
        let s = &self.g.ty(n).shape;
        let (pixels, _) = planes(self.g, n)?;
        (self.f.class[n.index()] == Class::Sample && s[1] > 0)
            .then(|| (s[1] as u32, pixels / s[1] as u32))
    }

    /// In bands, the rows of planar sample value `n` that lane `lane` of `lanes` holds
    /// (`kernels::share`'s band of its axis 1).
    pub(super) fn band_rows(&self, n: NodeIndex, lanes: u32, lane: u32) -> Option<Rows> {
        let bands = self.bands(lanes);
        let (entries, _) = self.row_layout(n).filter(|_| bands > 1)?;
        Some(split(entries, bands, lane % bands))
    }

    /// Whether node `n` moves an image's pixels along its rows: a slice or concat along
    /// axis 1, or a reshape that regroups the rows.
    fn moves_rows(&self, n: NodeIndex) -> bool {
        let g = self.g;
        match g.node(n).op {
            Op::Slice { axis, .. } | Op::Concat { axis } => {
                axis == 1 && self.row_layout(n).is_some()
            }
            Op::Reshape => {
                let src = self.f.resolve(g.operands(n)[0]);
                match (self.row_layout(src), self.row_layout(n)) {
                    (Some(a), Some(b)) => a.0 != b.0,
                    _ => false,
                }
            }
            // (its windows may reach past a band's rows)
            ref op if pooling(op) => self.row_layout(n).is_some(),
            _ => false,
        }
    }

    /// Whether on `lanes` lanes its lanes exchange halos (in bands, a node of it moves
    /// an image's pixels along its rows), on the colours of `HaloColours`.
    pub fn halos(&self, lanes: u32) -> bool {
        self.bands(lanes) > 1 && self.nodes().iter().any(|&n| self.moves_rows(n))
    }

    /// The rows of operand `o` that node `u` reads to make its rows `d` (none when `o`
    /// has no rows, or gives every row alike).
    fn wants(
        &self,
        u: NodeIndex,
        o: NodeIndex,
        d: &Rows,
        band: &dyn Fn(NodeIndex) -> Rows,
    ) -> Option<Rows> {
        let (g, f) = (self.g, self.f);
        let (entries, words) = self.row_layout(o)?;
        let node = g.node(u);
        if f.class[u.index()] != Class::Sample {
            return Some(band(o));
        }
        let clamp = |r: Rows| r.start.min(entries)..r.end.min(entries);
        match node.op {
            Op::Slice { axis: 1, start, .. } => {
                Some(clamp(d.start + start as u32..d.end + start as u32))
            }
            Op::Concat { axis: 1 } => {
                let mut off = 0;
                let mut want: Option<Rows> = None;
                for p in g.operands(u) {
                    let len = g.ty(p).shape[1] as u32;
                    if p == o {
                        let (a, b) = (d.start.max(off), d.end.min(off + len));
                        if a < b {
                            want = Some(hull(want, a - off..b - off));
                        }
                    }
                    off += len;
                }
                Some(want.unwrap_or(0..0))
            }
            Op::Reshape => {
                let (_, rw) = self.row_layout(u)?;
                let (ws, we) = (d.start * rw, d.end * rw);
                Some(clamp(ws / words..we.div_ceil(words)))
            }
            Op::Slice { .. } | Op::Concat { .. } | Op::BroadcastTo => {
                Some(d.clone()).filter(|_| self.row_layout(u).map(|r| r.0) == Some(entries))
            }
            ref op if pooling(op) => self.pool_wants(u, o, d),
            ref op if lower::elementwise(op) => match self.row_layout(u) {
                Some((e, _)) if e == entries => Some(d.clone()),
                _ => None,
            },
            _ => Some(band(o)),
        }
    }

    /// Lane `lane`'s `Halo` of the code `nodes` (in order) at one place: `anchored`
    /// says which values must hold at least their band (what is sent, stashed, or
    /// read where the code does not compute it again).
    pub(super) fn halo(
        &self,
        nodes: &[NodeIndex],
        anchored: &dyn Fn(NodeIndex) -> bool,
        (lanes, lane): (u32, u32),
    ) -> Result<Halo, String> {
        let (g, f) = (self.g, self.f);
        let band = |n: NodeIndex| self.band_rows(n, lanes, lane).unwrap_or(0..0);
        // (readers first: the code computes a node before its readers, so each at its
        // first place in the code, in reverse)
        let mut seen = BTreeSet::new();
        let first: Vec<NodeIndex> = nodes.iter().copied().filter(|&n| seen.insert(n)).collect();
        let mut want: BTreeMap<NodeIndex, Rows> = BTreeMap::new();
        let mut halo = Halo::default();
        for u in first.into_iter().rev() {
            if f.alias[u.index()].is_some() {
                continue;
            }
            if self.row_layout(u).is_none() {
                if f.class[u.index()] == Class::Batch {
                    for o in g.operands(u) {
                        let o = f.resolve(o);
                        if self.row_layout(o).is_some() {
                            let w = want.remove(&o);
                            want.insert(o, hull(w, band(o)));
                        }
                    }
                }
                continue;
            }
            let mut d = want.remove(&u);
            if anchored(u) {
                d = Some(hull(d, band(u)));
            }
            // (none: a part of a padding that reaches no row of this lane's, which
            // the lane does not compute)
            let d = d.unwrap_or(0..0);
            for raw in g.operands(u) {
                // (in the operand's rows as the node reads it: through a view that
                // regroups its rows, the rows of the value it views)
                let o = f.resolve(raw);
                let raw_band = |_: NodeIndex| self.as_read(o, raw, band(o));
                let Some(w) = self.wants(u, raw, &d, &raw_band) else {
                    continue;
                };
                let w = self.as_read(raw, o, w);
                let old = want.remove(&o);
                want.insert(o, hull(old, w));
            }
            halo.rows.insert(u, d);
        }
        // what it reads of the values it does not compute, past their bands
        for (o, w) in want {
            let b = band(o);
            if w.is_empty() || (w.start >= b.start && w.end <= b.end) {
                continue;
            }
            let (above, below) = (b.start.saturating_sub(w.start), w.end.saturating_sub(b.end));
            let bands = self.bands(lanes);
            let at = lane % bands;
            let next = |l: u32| self.band_rows(o, lanes, l).unwrap_or(0..0).len() as u32;
            let reach = (above > 0 && (at == 0 || above > next(lane - 1)))
                || (below > 0 && (at + 1 == bands || below > next(lane + 1)));
            if reach {
                return Err(format!(
                    "a window of {} rows above and {} below a band of {} rows reaches past the bands beside it",
                    above,
                    below,
                    b.len()
                ));
            }
            halo.widened.insert(o, hull(Some(w), b));
        }
        Ok(halo)
    }

    /// The code at `at`'s `Halo` on lane `lane` of `lanes` (none but where its lanes
    /// exchange halos, `halos`), with its widenings written into `body` and the
    /// widened values put in `cur`.
    pub(super) fn halo_at(
        &self,
        at: At,
        nodes: &[NodeIndex],
        (lanes, lane): (u32, u32),
        m: &mut Layout,
        cur: &mut BTreeMap<NodeIndex, Val>,
        body: &mut Vec<Instr>,
    ) -> Result<Option<Halo>, String> {
        if !self.halos(lanes) {
            return Ok(None);
        }
        let (g, f) = (self.g, self.f);
        let has_bwd = self.has_backward();
        let computed: BTreeSet<NodeIndex> = nodes.iter().copied().collect();
        let lv = &m.levels;
        // (what must hold its band: a value sent here, stashed, or read where it is
        // not computed again)
        let anchored = |n: NodeIndex| {
            let sent = (self.outputs.iter())
                .any(|o| f.resolve(o.node) == n && self.sent_at(o, lv, has_bwd) == at);
            let mut readers =
                g.g.neighbors_directed(n, petgraph::Direction::Outgoing)
                    .peekable();
            let none = readers.peek().is_none();
            let elsewhere = readers.any(|u| !computed.contains(&u) && !lv.recomputed.contains(&n));
            sent || none || elsewhere || m.stash.contains_key(&n)
        };
        let mine = self.halo(nodes, &anchored, (lanes, lane))?;
        let i = lane % self.bands(lanes);
        let up = match i {
            0 => None,
            _ => Some(self.halo(nodes, &anchored, (lanes, lane - 1))?),
        };
        let down = match i + 1 < self.bands(lanes) {
            true => Some(self.halo(nodes, &anchored, (lanes, lane + 1))?),
            false => None,
        };
        let c = self.halo.unwrap_or([0; 4]);
        let (code, wide) = self.widen(
            (&mine, up.as_ref(), down.as_ref()),
            (lanes, lane),
            cur,
            c,
            &mut m.scratch,
        )?;
        body.extend(code);
        cur.extend(wide);
        Ok(Some(mine))
    }

    /// Where value `n`'s band starts among the words of it the code whose `Halo` is
    /// `h` holds (0 for a value without rows).
    pub(super) fn band_within(&self, n: NodeIndex, h: &Halo, (lanes, lane): (u32, u32)) -> u32 {
        match (
            self.held_rows(n, h, lanes, lane),
            self.band_rows(n, lanes, lane),
            self.row_layout(n),
        ) {
            (Some(from), Some(b), Some((_, words))) => b.start.saturating_sub(from.start) * words,
            _ => 0,
        }
    }

    /// Rows `r` of value `o` in the rows of `raw`, a view of it (the same rows, but
    /// through a view that regroups them: the same words); or, the other way, rows of
    /// view `o` in those of the value `raw` it views.
    pub(super) fn as_read(&self, o: NodeIndex, raw: NodeIndex, r: Rows) -> Rows {
        match (self.row_layout(o), self.row_layout(raw)) {
            (Some((_, wo)), Some((_, wr))) if o != raw && wo != wr => {
                r.start * wo / wr..(r.end * wo).div_ceil(wr)
            }
            _ => r,
        }
    }

    /// The rows of value `o` the code whose `Halo` is `h` holds: those it computes or
    /// widens, else its band (none for a value without rows, or out of bands).
    pub(super) fn held_rows(&self, o: NodeIndex, h: &Halo, lanes: u32, lane: u32) -> Option<Rows> {
        (h.rows.get(&o).or_else(|| h.widened.get(&o)).cloned())
            .or_else(|| self.band_rows(o, lanes, lane))
    }

    /// Lane `lane`'s widenings at one place (`mine`, with those of the lanes of the
    /// bands above and below, `up` and `down`, to send them their rows): its band of
    /// each value it widens copied into the middle of scratch of the rows it reads,
    /// the rows above its band taken from the lane above and those below from the
    /// lane below. Returns the code and the widened values' scratch.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn widen(
        &self,
        (mine, up, down): (&Halo, Option<&Halo>, Option<&Halo>),
        (lanes, lane): (u32, u32),
        held: &BTreeMap<NodeIndex, Val>,
        c: HaloColours,
        scratch: &mut Scratch,
    ) -> Result<(Vec<Instr>, BTreeMap<NodeIndex, Val>), String> {
        let mut all: BTreeSet<NodeIndex> = mine.widened.keys().copied().collect();
        all.extend(up.iter().flat_map(|h| h.widened.keys().copied()));
        all.extend(down.iter().flat_map(|h| h.widened.keys().copied()));
        // (colours by the lane's place in its channel's strip, as `routes` lays them)
        let i = (lane % self.bands(lanes)) as usize;
        let (down_c, up_c) = (c[i % 2], c[2 + i % 2]);
        let (from_above, from_below) = (c[(i + 1) % 2], c[2 + (i + 1) % 2]);
        let mut body = Vec::new();
        let mut out = BTreeMap::new();
        for o in all {
            let (_, rw) = self.row_layout(o).ok_or("a widened value without rows")?;
            let b = self.band_rows(o, lanes, lane).unwrap_or(0..0);
            let v = *held
                .get(&o)
                .ok_or("a widened value the lane does not hold")?;
            // the rows the lane above reads below its band: this band's first; the
            // lane below's above its band: this band's last
            let to_up = up
                .and_then(|h| h.widened.get(&o))
                .zip(
                    lane.checked_sub(1)
                        .and_then(|l| self.band_rows(o, lanes, l)),
                )
                .map_or(0, |(w, nb)| w.end.saturating_sub(nb.end));
            let to_down = down
                .and_then(|h| h.widened.get(&o))
                .zip(self.band_rows(o, lanes, lane + 1))
                .map_or(0, |(w, nb)| nb.start.saturating_sub(w.start));
            let len = b.len() as u32;
            if to_up > 0 {
                let words = to_up * rw;
                body.push(mov(
                    Dsd::Out {
                        colour: up_c,
                        len: words,
                    },
                    at(v, 0, words, 1, &[]),
                ));
            }
            if to_down > 0 {
                let words = to_down * rw;
                // (no more than this band's rows: `halo` refuses windows past it)
                let from = (len - to_down) * rw;
                body.push(mov(
                    Dsd::Out {
                        colour: down_c,
                        len: words,
                    },
                    at(v, from, words, 1, &[]),
                ));
            }
            let Some(w) = mine.widened.get(&o) else {
                continue;
            };
            let t = scratch.alloc(w.len() as u32 * rw);
            let (above, below) = (b.start - w.start, w.end - b.end);
            body.push(mov(
                at(t, above * rw, len * rw, 1, &[]),
                at(v, 0, len * rw, 1, &[]),
            ));
            if above > 0 {
                let words = above * rw;
                body.push(mov(
                    at(t, 0, words, 1, &[]),
                    Dsd::In {
                        colour: from_above,
                        len: words,
                    },
                ));
            }
            if below > 0 {
                let words = below * rw;
                let to = (above + len) * rw;
                body.push(mov(
                    at(t, to, words, 1, &[]),
                    Dsd::In {
                        colour: from_below,
                        len: words,
                    },
                ));
            }
            out.insert(o, t);
        }
        Ok((body, out))
    }
}

/// `v`'s words `off..off + len` as a value of its own: in place, or (a slot of a
/// stash, whose words a counter picks) copied into scratch (`copies`, to release).
pub(super) fn part_of(
    v: Val,
    (off, len): (u32, u32),
    scratch: &mut Scratch,
    body: &mut Vec<Instr>,
    copies: &mut Vec<Val>,
) -> Val {
    match v {
        Val::Buf { len: whole, .. } if off == 0 && len == whole => v,
        Val::Buf {
            base, slot: None, ..
        } => Val::buf(base + off, len),
        Val::Buf { .. } => {
            let t = scratch.alloc(len);
            body.push(mov(at(t, 0, len, 1, &[]), at(v, off, len, 1, &[])));
            copies.push(t);
            t
        }
        Val::Imm(_) => v,
    }
}

/// The routes of a channel's strip of `lanes` at `origin`, oriented `o`, for its
/// halos: lane `l`'s rows down to lane `l + 1` on `c[l % 2]` and up to lane `l - 1` on
/// `c[2 + l % 2]`.
pub fn routes(
    laid: &mut Laid,
    origin: (u32, u32),
    o: Orient,
    lanes: u32,
    c: HaloColours,
) -> Result<(), String> {
    let at = |l: u32| o.at(origin, 0, l);
    for l in 0..lanes {
        let (down, up) = (c[(l % 2) as usize], c[2 + (l % 2) as usize]);
        if l + 1 < lanes {
            laid.route(at(l), down, o.route(Dir::Ramp, &[Dir::S]))?;
            laid.route(at(l + 1), down, o.route(Dir::N, &[Dir::Ramp]))?;
        }
        if l > 0 {
            laid.route(at(l), up, o.route(Dir::Ramp, &[Dir::N]))?;
            laid.route(at(l - 1), up, o.route(Dir::S, &[Dir::Ramp]))?;
        }
    }
    Ok(())
}
