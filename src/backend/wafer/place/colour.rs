//! Colours: each stream takes the lowest colour no router on its way uses yet (a dense
//! layer's chains use the four below the streams'); the host's streams run on paths to
//! and from the fabric's edges (an input several kernels read, a leg to each); a
//! one-lane kernel's dealer has a colour to each replica and one back, and one for each
//! row of the layer before whose outputs it gathers.

use super::host::{edge_path, host_legs, part_columns, parts_of, Leg};
use super::lanes::Lanes;
use super::sizer::Sizer;
use super::{unsupported, ColoursShort, LayoutError, Placed, CHAIN_COLOURS};
use crate::backend::wafer::form::{self, End, Formed, Kind};
use crate::backend::wafer::isa::Colour;
use crate::backend::wafer::kernels::rows::RowColours;
use crate::backend::wafer::kernels::vector::HaloColours;
use crate::ir::{Graph, NodeIndex, Op};
use std::collections::{BTreeMap, BTreeSet};

/// The colours and paths of a layout's streams.
#[derive(Default)]
pub(super) struct Colouring {
    /// Each stream's colour (but a host input's), and its path to the host (an output's).
    pub colour_of: BTreeMap<NodeIndex, Colour>,
    pub paths: BTreeMap<NodeIndex, Vec<(u32, u32)>>,
    /// Each host input's leg to each kernel that reads it.
    pub legs: BTreeMap<(NodeIndex, usize), Leg>,
    /// A one-lane kernel's replicas: a colour to each from the dealer and one back.
    pub reps: BTreeMap<usize, Vec<(Colour, Colour)>>,
    /// The rows past the first of the layer before a one-lane kernel whose outputs its
    /// dealer gathers: a colour for each row's outputs and one for their gradient.
    pub fans: BTreeMap<usize, Vec<(Colour, Colour)>>,
    /// The colours of a vector kernel's reductions along a sample's features across
    /// its lanes (`kernels::rows`).
    pub rows: BTreeMap<usize, RowColours>,
    /// The colours of a vector kernel's halos along each channel's lanes, in bands
    /// (`Vector::halos`).
    pub halos: BTreeMap<usize, HaloColours>,
}

impl Colouring {
    /// Stream `n`'s colour into kernel `k` (a host input's leg to it, or the stream's).
    pub fn into(&self, n: NodeIndex, k: usize) -> Option<Colour> {
        (self.legs.get(&(n, k)).map(|l| l.0)).or_else(|| self.colour_of.get(&n).copied())
    }

    /// `into` of the value `n` is, 0 for none.
    pub fn of(&self, f: &Formed, n: Option<NodeIndex>, k: usize) -> Colour {
        n.and_then(|n| self.into(f.resolve(n), k)).unwrap_or(0)
    }
}

/// The routers of a placed kernel.
pub(super) fn pes_of(p: &Placed) -> Vec<(u32, u32)> {
    (p.x..p.x + p.w)
        .flat_map(|x| (p.y..p.y + p.h).map(move |y| (x, y)))
        .collect()
}

/// The colours of a sizing's streams on its placed kernels, or how many it would need.
pub(super) fn colour(
    sizer: &Sizer,
    lanes: &Lanes,
    placed: &[Placed],
) -> Result<Colouring, LayoutError> {
    let f = sizer.f;
    let program_colours = sizer.fab.program_colours() as Colour;
    let mut palette = Palette {
        used: BTreeMap::new(),
        need: CHAIN_COLOURS.min(program_colours),
        have: program_colours,
        short: None,
    };
    for (k, p) in placed.iter().enumerate() {
        if matches!(f.kernels[k].kind, Kind::Dense { .. }) {
            for r in pes_of(p) {
                *palette.used.entry(r).or_default() |= (1u64 << CHAIN_COLOURS) - 1;
            }
        }
    }
    let mut c = Colouring::default();
    streams(sizer, lanes, placed, &mut palette, &mut c)?;
    replicas(sizer, lanes, placed, &mut palette, &mut c)?;
    // a vector kernel that reduces along its samples' features on several lanes: three
    // colours along its strip (`kernels::rows`)
    for (k, p) in placed.iter().enumerate() {
        if (sizer.reduces_rows[k] || sizer.sums_in_bands(k, lanes.out[k])) && lanes.out[k] > 1 {
            let routers = pes_of(p);
            let name = || format!("the reductions of {}", p.name);
            let mut take = || palette.take(&routers, name);
            c.rows.insert(k, [take()?, take()?, take()?]);
        }
        // one whose lanes exchange halos: four (`kernels::vector::halo`)
        if sizer.halos(k, lanes.out[k]) {
            let routers = pes_of(p);
            let name = || format!("the halos of {}", p.name);
            let mut take = || palette.take(&routers, name);
            c.halos.insert(k, [take()?, take()?, take()?, take()?]);
        }
    }
    if let Some(stream) = palette.short {
        return Err(LayoutError::Colours(ColoursShort {
            stream,
            need: u32::from(palette.need),
            have: u32::from(program_colours),
        }));
    }
    Ok(c)
}

/// Each stream's colour (a host input's: a leg's to each kernel that reads it) and the
/// paths to and from the host: the host's inputs come down a column from the north edge
/// to their kernel (the first kernel's come straight in; a further part's straight to
/// each of its columns), and per-sample outputs run east to the east edge.
pub(super) fn streams(
    sizer: &Sizer,
    lanes: &Lanes,
    placed: &[Placed],
    colours: &mut Palette,
    out: &mut Colouring,
) -> Result<(), LayoutError> {
    let (g, f, fab) = (sizer.g, sizer.f, sizer.fab);
    let pes_of = |k: usize| pes_of(&placed[k]);
    for (st, leg) in f.streams.iter().flat_map(|st| {
        let legs: Vec<Option<usize>> = match st.from {
            End::Host => host_legs(st).map(Some).collect(),
            End::Kernel(_) => vec![None],
        };
        legs.into_iter().map(move |l| (st, l))
    }) {
        // (a stream carried to a kernel goes there on its carrier's colour; one
        // carried to every kernel it reaches has no colour of its own, but a shortcut's
        // outputs, which carry its input to the layer after it: `Carry::first`)
        let direct = |b: usize| !f.carried(st.node, b);
        let shortcut = match st.from {
            End::Kernel(a) => f.carries_first(a) && f.kernels[a].fwd() == Some(st.node),
            End::Host => false,
        };
        if !shortcut
            && st
                .to
                .iter()
                .all(|t| matches!(t, End::Kernel(b) if !direct(*b)))
        {
            continue;
        }
        let mut routers: BTreeSet<(u32, u32)> = BTreeSet::new();
        if let End::Kernel(a) = st.from {
            routers.extend(pes_of(a));
            if let Some(strip) = passes_over(f, st) {
                routers.extend(pes_of(strip));
            }
            if shortcut {
                routers.extend(pes_of(a + 1));
            }
        }
        for t in &st.to {
            if let End::Kernel(b) = t {
                if leg.is_none_or(|l| l == *b) && direct(*b) {
                    routers.extend(pes_of(*b));
                }
            }
        }
        // paths to and from the host
        let mut path = Vec::new();
        if let Some((b, (_, cols))) =
            leg.and_then(|b| part_columns(f, lanes, b, st.node).map(|c| (b, c)))
        {
            // a further part's input: straight in from the fabric's edge to each
            // of its columns
            let p = &placed[b];
            for col in cols {
                path.extend(edge_path(p, col).2);
            }
        } else if let Some(b) = leg {
            let p = &placed[b];
            if !(b == 0 && matches!(f.kernels[b].kind, Kind::Dense { .. })) {
                if matches!(f.kernels[b].kind, Kind::Dense { .. }) {
                    return Err(unsupported(
                        g,
                        st.node,
                        "an input into a layer past the first has no wafer layout yet".into(),
                        "the wafer lays out chains of layers so far",
                    ));
                }
                // down the column to the strip's first lane (then along the strip)
                path = (0..p.y).map(|y| (p.x, y)).collect();
            }
        }
        if leg.is_none() && st.to.contains(&End::Host) {
            let End::Kernel(a) = st.from else { continue };
            let p = &placed[a];
            // (a sample's scalar, which every lane of a strip has whole, goes from its
            // first: an argmax across the lanes)
            let per = g.ty(st.node).elements() / f.batch.max(1) as usize;
            let scalar = per == 1 && matches!(f.kernels[a].kind, Kind::Vector { .. });
            if p.w * p.h != 1 && !scalar {
                return Err(unsupported(
                    g,
                    st.node,
                    "a per-sample output from a kernel of several lanes has no wafer layout yet"
                        .into(),
                    "the wafer lays out chains of layers so far",
                ));
            }
            path.extend((p.x + 1..fab.width).map(|x| (x, p.y)));
        }
        routers.extend(path.iter().copied());
        let routers: Vec<(u32, u32)> = routers.into_iter().collect();
        let c = colours.take(&routers, || stream_name(g, st.node))?;
        match leg {
            Some(b) => {
                out.legs.insert((st.node, b), (c, path));
            }
            None => {
                out.colour_of.insert(st.node, c);
                out.paths.insert(st.node, path);
            }
        }
    }
    Ok(())
}

/// A one-lane kernel's replicas: a colour from the dealer to each, and one back, free
/// on the lanes between; and the rows of the layer before whose outputs the dealer
/// gathers: from each row's east end up the strip to the dealer, and its share of their
/// gradient back down and west along the row, a colour each beside the first row's.
pub(super) fn replicas(
    sizer: &Sizer,
    lanes: &Lanes,
    placed: &[Placed],
    colours: &mut Palette,
    out: &mut Colouring,
) -> Result<(), LayoutError> {
    let f = sizer.f;
    for (k, p) in placed.iter().enumerate() {
        if lanes.reps[k] < 2 {
            continue;
        }
        let mut cs = Vec::new();
        for j in 0..lanes.reps[k] {
            let routers: Vec<(u32, u32)> =
                (0..=j + 1).map(|l| p.orient.at((p.x, p.y), 0, l)).collect();
            let mut take = || {
                colours.take(&routers, || {
                    format!("the samples dealt to {}'s replicas", p.name)
                })
            };
            cs.push((take()?, take()?));
        }
        out.reps.insert(k, cs);
        // the rows of the layer before whose outputs the dealer gathers: from each
        // row's east end up the strip to the dealer, and its share of their gradient
        // back down and west along the row, a colour each beside the first row's
        let fan = fan_of(f, lanes, k);
        let Some((_, grad)) = sizer.fanned[k].filter(|_| fan > 1) else {
            continue;
        };
        let l = &placed[k - 1];
        let cols = lanes.columns(k - 1);
        let mut fc = Vec::new();
        for j in 1..fan {
            let strip = (0..=j).map(|m| p.orient.at((p.x, p.y), 0, m));
            let mut routers: Vec<(u32, u32)> = strip.clone().collect();
            routers.push(l.orient.at((l.x, l.y), cols - 1, j));
            let name = || format!("the outputs {} gathers", p.name);
            let y = colours.take(&routers, name)?;
            let dy = match grad {
                Some(_) => {
                    let mut routers: Vec<(u32, u32)> = strip.collect();
                    routers.extend((0..cols).map(|i| l.orient.at((l.x, l.y), i, j)));
                    colours.take(&routers, || format!("the gradients {} sends back", p.name))?
                }
                None => 0,
            };
            fc.push((y, dy));
        }
        out.fans.insert(k, fc);
    }
    Ok(())
}

/// The colours a layout's streams take, router by router.
pub(super) struct Palette {
    /// Per router: the colours streams through it use (a bit each).
    used: BTreeMap<(u32, u32), u64>,
    /// The colours needed so far, and the programs' budget.
    need: Colour,
    have: Colour,
    /// The first stream past the budget.
    short: Option<String>,
}

impl Palette {
    /// The lowest colour no router of `routers` uses yet, now theirs; beyond the
    /// budget only to count how many are needed (`name`: the stream, for the
    /// diagnostic).
    fn take(
        &mut self,
        routers: &[(u32, u32)],
        name: impl FnOnce() -> String,
    ) -> Result<Colour, LayoutError> {
        let busy = (routers.iter()).fold(0u64, |m, r| m | self.used.get(r).copied().unwrap_or(0));
        let Some(c) = (CHAIN_COLOURS..64).find(|&c| busy & (1 << c) == 0) else {
            return Err(LayoutError::DoesNotFit(
                "a router would carry more than 64 streams".into(),
            ));
        };
        if c >= self.have && self.short.is_none() {
            self.short = Some(name());
        }
        self.need = self.need.max(c + 1);
        for r in routers {
            *self.used.entry(*r).or_default() |= 1 << c;
        }
        Ok(c)
    }
}

/// The input one-lane kernel `k` takes from layer `l` before it, and that input's
/// gradient it sends back, when its dealer can gather them from the layer's rows
/// (`vector::Fan`): the layer's rows carry its outputs alone (no residual's features,
/// passed on or its own, no side part's outputs).
pub(super) fn fanned(f: &Formed, l: usize, k: usize) -> Option<(NodeIndex, Option<NodeIndex>)> {
    if f.carried_past(l).is_some() || parts_of(f, l).iter().any(|p| p.side) {
        return None;
    }
    let input = (f.streams.iter())
        .find(|s| !s.bwd && s.from == End::Kernel(l) && s.to == [End::Kernel(k)])?
        .node;
    let grad = (f.streams.iter())
        .find(|s| s.bwd && s.from == End::Kernel(k) && s.to.contains(&End::Kernel(l)))
        .map(|s| s.node);
    Some((input, grad))
}

/// The rows of the layer before one-lane kernel `k` whose outputs its dealer gathers
/// on a sizing (1: it takes them from one).
pub(super) fn fan_of(f: &Formed, lanes: &Lanes, k: usize) -> u32 {
    match k.checked_sub(1) {
        Some(l) if lanes.out[k] == 1 && matches!(f.kernels[l].kind, Kind::Dense { .. }) => {
            lanes.out[l].max(1)
        }
        _ => 1,
    }
}

/// The strip a backward stream passes on its way from a layer to the one before it.
pub(super) fn passes_over(f: &Formed, st: &form::Stream) -> Option<usize> {
    let End::Kernel(a) = st.from else {
        return None;
    };
    let strip = a.checked_sub(1)?;
    (st.bwd
        && a >= 2
        && st.to.contains(&End::Kernel(a - 2))
        && matches!(f.kernels[strip].kind, Kind::Vector { .. }))
    .then_some(strip)
}

/// Whether node `n` streams from the host.
pub(super) fn st_from_host(f: &Formed, n: NodeIndex) -> bool {
    f.streams.iter().any(|s| s.node == n && s.from == End::Host)
}

/// What a host stream carries: its input's name, or its op.
pub(super) fn stream_name(g: &Graph, n: NodeIndex) -> String {
    match &g.node(n).op {
        Op::Input { name } => name.clone(),
        op => format!("{} %{}", op.name(), n.index()),
    }
}
