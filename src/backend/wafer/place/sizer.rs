//! The sizer: what a graph's kernels cost on so many lanes, measured on their programs
//! (a layer's cycles per sample and memory at its fullest and busiest PE, a vector
//! kernel's period on lanes or replicas), each kernel's floor and fan, the windows of
//! the 1F1B schedule, and a sizing's estimated step (the schedule replayed over the
//! kernels' cycles a sample: `replay`).

use super::colour::{fan_of, fanned};
use super::host::parts_of;
use super::lanes::*;
use super::lay::dense_kernel;
use super::search::MAX_REPS;
use super::{LayoutError, CHAIN_COLOURS};
use crate::backend::wafer::fabric::Fabric;
use crate::backend::wafer::form::{End, Formed, Kind};
use crate::backend::wafer::isa::Colour;
use crate::backend::wafer::kernels::dense::{self, Dense, Shape};
use crate::backend::wafer::kernels::vector::{Fan, Rep};
use crate::backend::wafer::kernels::Laid;
use crate::backend::wafer::pipeline::Widths;
use crate::ir::{Graph, NodeIndex};
use std::collections::BTreeMap;

/// What sizing needs of a formed graph, worked out once: each kernel's dense sizes,
/// vector width and whether it hands its outputs to a one-lane kernel, and the vector
/// kernels' periods as they are asked for (each one a generated program).
pub(super) struct Sizer<'a> {
    pub(super) g: &'a Graph,
    pub(super) f: &'a Formed,
    pub(super) fab: &'a Fabric,
    pub(super) dims: Vec<Option<Dims>>,
    /// A vector kernel's width on several lanes (`None`: one lane only; dense: `None`).
    pub(super) width: Vec<Option<u32>>,
    pub(super) single_next: Vec<bool>,
    /// A layer's fewest output lanes: those the vector kernel after it needs for its
    /// lanes' memory to fit (1 when none does).
    pub(super) floor: Vec<u32>,
    /// Each layer kernel with its tensors and update (`None` for a vector kernel).
    pub(super) dense: Vec<Option<Dense>>,
    /// Further parts' first PEs by (kernel, part, columns, rows), as they are asked
    /// for: cycles per sample, and whether the memory fits.
    pub(super) part_pes: std::cell::RefCell<BTreeMap<(usize, usize, u32, u32), Measured>>,
    /// Vector kernels' cycles per sample and their updates' cycles a step, by sizing.
    pub(super) periods: std::cell::RefCell<BTreeMap<VectorSizing, Option<(Cost, u64)>>>,
    /// Whether a one-lane kernel can run as replicas (`Vector::replicable`).
    pub(super) replicable: Vec<bool>,
    /// Whether a vector kernel reduces along its samples' features (on several lanes
    /// it needs the colours of `kernels::rows`: `Vector::reduces_rows`).
    pub(super) reduces_rows: Vec<bool>,
    /// A replicable one-lane kernel's input from the layer before it and that input's
    /// gradient, when its dealer can gather them from the layer's rows (`fanned`).
    pub(super) fanned: Vec<Option<(NodeIndex, Option<NodeIndex>)>>,
    /// Layers' first PEs by (kernel, columns, rows), as they are asked for: cycles per
    /// sample, and whether the memory fits.
    pub(super) layers: std::cell::RefCell<BTreeMap<KernelLanes, Measured>>,
    /// How wide windows may be (memory's limit), and each kernel's window and FIFO
    /// with as many replicas as a loss may have (`schedule`).
    pub(super) widths: Widths,
    pub(super) sched: Vec<(u32, u32)>,
    /// Whether vector kernels softmax across their lanes (`Vector::across`).
    pub(super) across: bool,
    /// A heads kernel's heads (`Vector::heads`), whose lanes must divide them.
    pub(super) heads: Vec<Option<u32>>,
}

/// The samples a dealer keeps out at each of its replicas: one computed, one waiting
/// in the replica's FIFO (`Vector::dealer`).
pub(super) const DEALT: u32 = 2;

/// Each kernel's window and FIFO (`pipeline::plan`) as wide as `widths` lets them,
/// when a kernel that ends the backward pass runs as `reps(k)` replicas.
pub(super) fn schedule(f: &Formed, widths: Widths, reps: impl Fn(usize) -> u32) -> Vec<(u32, u32)> {
    let chain: Vec<Option<u32>> = (0..f.kernels.len())
        .map(|k| match f.backward_role(k) {
            Some(_) if f.barriers[k] => Some(crate::backend::wafer::pipeline::BARRIER),
            Some(1) => Some(match reps(k) {
                0 | 1 => 1,
                r => DEALT * r,
            }),
            role => role,
        })
        .collect();
    crate::backend::wafer::pipeline::plan(&chain, f.batch, widths)
}

/// A kernel's cycles per sample in the forward pass and in the backward pass. In the
/// 1F1B schedule (`pipeline`) each kernel alternates the two, so a step goes at the
/// pace of the kernel whose two take longest (`Sizer::step`).
pub(super) type Cost = [u64; 2];

/// A cost that rules a kernel out.
pub(super) const NEVER: Cost = [u64::MAX / 4, 0];

/// What a sizing allows each kernel: cycles per sample in all, and in each pass.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    pub(super) total: u64,
    pub(super) pass: Cost,
}

impl Budget {
    pub(super) fn admits(&self, c: Cost) -> bool {
        c[0].saturating_add(c[1]) <= self.total && c[0] <= self.pass[0] && c[1] <= self.pass[1]
    }
}

/// A kind of budget: one period for both passes together, or one for each pass, the
/// backward's `num / den` of the forward's, or the forward pass's fixed (at what a
/// one-lane kernel takes: no layer need be faster) and the backward's the period.
#[derive(Debug, Clone, Copy)]
pub(super) enum Pace {
    Together,
    Passes(u64, u64),
    Back(u64),
}

impl Pace {
    /// The budget of period `t`.
    pub(super) fn at(self, t: u64) -> Budget {
        match self {
            Pace::Together => Budget {
                total: t,
                pass: [u64::MAX; 2],
            },
            Pace::Passes(num, den) => Budget {
                total: u64::MAX,
                pass: [t, t.saturating_mul(num) / den],
            },
            Pace::Back(forward) => Budget {
                total: u64::MAX,
                pass: [forward, t],
            },
        }
    }
}

/// A layer's first PE as measured: cycles per sample, whether its memory fits, and its
/// update's cycles a step (`cost::update_cycles`).
pub(super) type Measured = (Cost, bool, u64);

/// A vector kernel on lanes, replicas, and rows it gathers: (kernel, lanes, reps, fan).
pub(super) type VectorSizing = (usize, u32, u32, u32);

/// A kernel on `w x h` lanes: (kernel, w, h).
pub(super) type KernelLanes = (usize, u32, u32);

impl<'a> Sizer<'a> {
    /// The sizer of `f`, its vector kernels softmaxing `across` their lanes or not; an
    /// error when a layer has no kernel (its update, or no output).
    pub(super) fn new(
        g: &'a Graph,
        f: &'a Formed,
        fab: &'a Fabric,
        (widths, across): (Widths, bool),
    ) -> Result<Sizer<'a>, LayoutError> {
        let nk = f.kernels.len();
        let dims: Vec<_> = f
            .kernels
            .iter()
            .map(|k| dense_dims(g, f, &k.kind))
            .collect();
        // each vector kernel's width, whether it may run as replicas, and whether it
        // reduces along its samples' features
        let unscheduled = (f.batch, 0);
        // (a heads kernel: its heads, and the groups of the layer before's columns)
        type HeadsGroups = Option<(u32, u32)>;
        let vectors: Vec<(Option<u32>, bool, bool, HeadsGroups)> = (0..nk)
            .map(|k| match dims[k] {
                Some(_) => (None, false, false, None),
                None => {
                    let v = vector_of(g, f, k, (unscheduled, across), |_| 0);
                    let heads = (v.heads()).map(|h| (h.count, v.input_groups().unwrap_or(1)));
                    (v.width(), v.replicable(), v.reduces_rows(), heads)
                }
            })
            .collect();
        let heads: Vec<Option<u32>> = vectors.iter().map(|v| v.3.map(|h| h.0)).collect();
        let groups = |k: usize| (vectors.get(k + 1)).and_then(|v| v.3).map_or(1, |h| h.1);
        let width: Vec<Option<u32>> = vectors.iter().map(|v| v.0).collect();
        let replicable: Vec<bool> = vectors.iter().map(|v| v.1).collect();
        let reduces_rows: Vec<bool> = vectors.iter().map(|v| v.2).collect();
        // the windows with as many replicas as a loss may have: the most memory
        let sched = schedule(f, widths, |k| if replicable[k] { MAX_REPS } else { 1 });
        let dense = (0..nk)
            .map(|k| match f.kernels[k].kind {
                Kind::Dense { .. } => {
                    dense_kernel(g, f, k, (dims[k], groups(k)), sched[k]).map(Some)
                }
                Kind::Vector { .. } => Ok(None),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let fanned = (0..nk)
            .map(|k| {
                let plain = |l: usize| {
                    dims[l].is_some_and(|d| matches!(d.shape, Shape::Matmul | Shape::Planar { .. }))
                };
                k.checked_sub(1)
                    .filter(|&l| replicable[k] && plain(l))
                    .and_then(|l| fanned(f, l, k))
            })
            .collect();
        let single_next = (0..nk)
            .map(|k| k + 1 < nk && dims[k + 1].is_none() && width[k + 1].is_none())
            .collect();
        let words = fab.usable_bytes() / crate::backend::wafer::cost::WORD;
        let floor = (0..nk)
            .map(|k| match (dims[k], width.get(k + 1).copied().flatten()) {
                (Some(d), Some(wd)) => (crate::backend::wafer::kernels::lane_counts(
                    wd,
                    band_rows((dense[k].as_ref(), Some(d))).1,
                    fab.width.max(fab.height),
                )
                .into_iter())
                .filter(|&l| heads[k + 1].is_none_or(|h| h % l == 0))
                .find(|&l| {
                    vector_of(g, f, k + 1, (sched[k + 1], across), |_| CHAIN_COLOURS)
                        .lane(l, 0)
                        .is_ok_and(|lane| lane.program.words() <= words)
                })
                .unwrap_or(wd),
                _ => 1,
            })
            .collect();
        Ok(Sizer {
            g,
            f,
            fab,
            dims,
            width,
            single_next,
            floor,
            dense,
            replicable,
            reduces_rows,
            fanned,
            part_pes: Default::default(),
            periods: Default::default(),
            layers: Default::default(),
            widths,
            sched,
            across,
            heads,
        })
    }

    /// Layer `k`'s cycles per sample on `w x h` lanes, stalls aside: a product's by
    /// formula, a convolution's from its first PE's program.
    pub(super) fn layer_period(&self, k: usize, d: Dims, w: u32, h: u32) -> Cost {
        // (a row that carries more than the layer's outputs, a residual's features or
        // side parts' outputs, is zeroed first: measured from the program)
        let carries =
            self.f.carried_past(k).is_some() || parts_of(self.f, k).iter().any(|p| p.side);
        if matches!(d.shape, Shape::Matmul | Shape::Planar { .. }) && !carries {
            return dense_period(self.fab, d, w, h);
        }
        self.first_pe(k, w, h).0
    }

    /// Whether layer `k`'s first PE (the one with the largest share) fits its memory on
    /// `w x h` lanes.
    pub(super) fn layer_fits(&self, k: usize, w: u32, h: u32) -> bool {
        self.first_pe(k, w, h).1
    }

    /// Layer `k`'s first PE on `w x h` lanes, from its program: its cycles per sample,
    /// and whether its memory fits (memoised).
    pub(super) fn first_pe(&self, k: usize, w: u32, h: u32) -> Measured {
        *self
            .layers
            .borrow_mut()
            .entry((k, w, h))
            .or_insert_with(|| match &self.dense[k] {
                Some(layer) => self.measure(layer, w, h),
                None => (NEVER, false, 0),
            })
    }

    /// `layer` on `w x h` lanes, from the programs of its fullest PE and its busiest
    /// (`Dense::heaviest`): its cycles per sample, and whether its memory fits.
    pub(super) fn measure(&self, layer: &Dense, w: u32, h: u32) -> Measured {
        let layer = &layer.on_lanes(w, h);
        let (wc, hr) = layer.used(w, h);
        let c = dense::Colours::with_streams(4, 5, 6, 7);
        let words = self.fab.usable_bytes() / crate::backend::wafer::cost::WORD;
        let [fullest, busiest] = layer.heaviest((wc, hr));
        let pe = |(i, j): (u32, u32)| {
            let ranges = (&layer.column(wc, i), &layer.out_row(hr, j));
            let row = layer.row(j, (wc, hr), None);
            let mut scratch = Laid::default();
            (layer.program(i, j, (wc, hr), c, &mut scratch, (0, 0), ranges, row)).map_or(
                (NEVER, false, 0),
                |p| {
                    let (t, u) = self.costed(&p);
                    (t, p.words() <= words, u)
                },
            )
        };
        let (t, fits, tu) = pe(fullest);
        if busiest == fullest || !fits {
            return (t, fits, tu);
        }
        let (u, _, uu) = pe(busiest);
        ([t[0].max(u[0]), t[1].max(u[1])], fits, tu.max(uu))
    }

    /// A PE program's cycles per sample in each pass, stalls aside, and its update's
    /// cycles a step.
    fn costed(&self, p: &crate::backend::wafer::isa::Program) -> (Cost, u64) {
        use crate::backend::wafer::{cost, kernels::UPDATE};
        (
            cost::per_pass(self.fab, p, self.f.batch, UPDATE),
            cost::update_cycles(self.fab, p, UPDATE),
        )
    }

    /// A vector kernel's cycles per sample on `lanes` lanes (its first, widest lane's
    /// program), or on one lane as `reps` replicas (the slower of the dealer and a
    /// replica; the dealer gathering its input from `fan` rows of the layer before),
    /// stalls aside but its waits for reductions across its lanes
    /// (`cost::strip_waits`); `None` when it cannot run so.
    pub(super) fn vector_period(&self, k: usize, lanes: u32, reps: u32, fan: u32) -> Option<Cost> {
        self.vector_measure(k, lanes, reps, fan).map(|m| m.0)
    }

    /// `vector_period` and the cycles of the kernel's update a step (of its first lane,
    /// or the slower of the dealer and a replica), memoised.
    fn vector_measure(&self, k: usize, lanes: u32, reps: u32, fan: u32) -> Option<(Cost, u64)> {
        *self
            .periods
            .borrow_mut()
            .entry((k, lanes, reps, fan))
            .or_insert_with(|| {
                let v = vector_of(self.g, self.f, k, (self.sched[k], self.across), |_| {
                    CHAIN_COLOURS
                });
                if reps > 1 {
                    let c = CHAIN_COLOURS;
                    let to: Vec<(Colour, Colour)> =
                        (0..reps as u8).map(|r| (c, c + 1 + r)).collect();
                    let fan = if fan > 1 {
                        let (input, grad) = self.fanned[k]?;
                        let colours = (0..fan as u8).map(|l| (c + 2 * l, c + 2 * l + 1)).collect();
                        Some(Fan {
                            input,
                            grad,
                            colours,
                        })
                    } else {
                        None
                    };
                    let dealer = self.costed(&v.dealer(&to, fan.as_ref()).ok()?);
                    let rep = v
                        .replica(Rep {
                            of: reps,
                            to: c,
                            back: c + 1,
                        })
                        .ok()?;
                    let one = self.costed(&rep.program);
                    let t = [dealer.0[0].max(one.0[0]), dealer.0[1].max(one.0[1])];
                    return Some((t, dealer.1.max(one.1)));
                }
                // (lane 0, costed; and where halos reach the bands beside a lane's, a
                // lane in the middle of a channel's and the one next to its last, which
                // may be thinner: `halo`; each once, as few bands make them one lane)
                let bands = v.bands(lanes);
                let mut built = vec![0];
                if v.halos(lanes) {
                    built.extend([bands / 2, bands.saturating_sub(2)]);
                    built.sort_unstable();
                    built.dedup();
                }
                let mut first = None;
                for l in built {
                    match v.lane(lanes, l) {
                        Ok(lane) => {
                            first.get_or_insert(lane);
                        }
                        Err(e) => {
                            if std::env::var_os("EST_WAFER_DEBUG").is_some() {
                                eprintln!("kernel {k} on {lanes} lanes (lane {l}): {e}");
                            }
                            return None;
                        }
                    }
                }
                // (and its waits for the reductions across its strip, which the
                // program's cycles leave out)
                let p = &first?.program;
                let total = v.row_colours()[2];
                let waits = crate::backend::wafer::cost::strip_waits(
                    self.fab,
                    p,
                    self.f.batch,
                    total,
                    lanes,
                );
                let (t, u) = self.costed(p);
                Some(([t[0] + waits[0], t[1] + waits[1]], u))
            })
    }

    /// The replicas one-lane kernel `k` may run as, fewest first: 1 (when it need
    /// gather no rows), and when it can run as replicas (`Vector::replicable`), each
    /// count up to `MAX_REPS` that divides the batch, reaches the `fan` rows of the
    /// layer before whose outputs its dealer gathers (the replicas lie along them), and
    /// whose two colours each (to a replica and back) the dealer's router has beside
    /// the chains', the kernel's streams and two for each row past the first.
    pub(super) fn reps(&self, k: usize, fan: u32) -> Vec<u32> {
        let mut out = if fan > 1 { vec![] } else { vec![1] };
        if self.replicable[k] {
            let streams = (self.f.streams.iter())
                .filter(|s| s.from == End::Kernel(k) || s.to.contains(&End::Kernel(k)))
                .filter(|s| !self.f.carried(s.node, k))
                .count() as u32;
            let room = (self.fab.program_colours())
                .saturating_sub(u32::from(CHAIN_COLOURS) + streams + 2 * (fan - 1))
                / 2;
            out.extend(
                (2.max(fan - 1)..=MAX_REPS.min(room)).filter(|&r| self.f.batch.is_multiple_of(r)),
            );
        }
        out
    }

    /// Each kernel's estimated cycles per sample on a sizing.
    pub(super) fn periods(&self, lanes: &Lanes) -> Vec<Cost> {
        (0..self.f.kernels.len())
            .map(|k| self.kernel_on(k, lanes).0)
            .collect()
    }

    /// Kernel `k`'s estimated cycles per sample on a sizing, and its update's cycles a
    /// step (a layer's the slowest of its parts').
    fn kernel_on(&self, k: usize, lanes: &Lanes) -> (Cost, u64) {
        match self.dims[k] {
            Some(d) => {
                let h = lanes.out[k];
                let layer = (
                    self.layer_period(k, d, lanes.inp[k], h),
                    self.first_pe(k, lanes.inp[k], h).2,
                );
                let parts = (lanes.more[k].iter().enumerate()).map(|(p, &l)| {
                    let (t, _, u) = self.part_pe(k, p, l, h);
                    (t, u)
                });
                parts.fold(layer, |(a, ua), (b, ub)| {
                    ([a[0].max(b[0]), a[1].max(b[1])], ua.max(ub))
                })
            }
            None => self
                .vector_measure(k, lanes.out[k], lanes.reps[k], fan_of(self.f, lanes, k))
                .unwrap_or((NEVER, 0)),
        }
    }

    /// Layer `k`'s further parts, each with its dimensions.
    pub(super) fn parts(&self, k: usize) -> impl Iterator<Item = (&Dense, Dims)> + '_ {
        let dims = |p: &Dense| Dims {
            k: p.k,
            n: p.n,
            train: p.train,
            dx: false,
            shape: p.shape,
            half: p.half,
        };
        (self.dense[k].iter().flat_map(|d| &d.more)).map(move |p| (p, dims(p)))
    }

    /// The fewest lanes each further part of layer `k` needs on `h` rows to reach
    /// budget `t` with its memory fitting (`None` when one cannot on the fabric).
    pub(super) fn part_lanes(&self, k: usize, h: u32, t: Budget) -> Option<Vec<u32>> {
        let used = crate::backend::wafer::kernels::used;
        let most = self.fab.width.max(self.fab.height);
        (self.parts(k).enumerate())
            .map(|(p, (_, pd))| {
                (1..=pd.k.min(most))
                    .filter(|&l| used(pd.k, l) == l)
                    .find(|&l| {
                        let (period, fits, _) = self.part_pe(k, p, l, h);
                        t.admits(period) && fits
                    })
            })
            .collect()
    }

    /// Further part `p` of layer `k` on `l x h` lanes, from its first PE's program (a
    /// product's period by formula, as `layer_period`): its cycles per sample, and
    /// whether its memory fits (memoised).
    pub(super) fn part_pe(&self, k: usize, p: usize, l: u32, h: u32) -> Measured {
        *self
            .part_pes
            .borrow_mut()
            .entry((k, p, l, h))
            .or_insert_with(|| {
                let Some((part, d)) = self.parts(k).nth(p) else {
                    return (NEVER, false, 0);
                };
                let (t, fits, u) = self.measure(part, l, h);
                match d.shape {
                    Shape::Matmul => (dense_period(self.fab, d, l, h), fits, u),
                    _ => (t, fits, u),
                }
            })
    }

    /// The estimated cycles of a step of a sizing: the 1F1B schedule replayed over
    /// each kernel's cycles a sample (`replay`), then the slowest update (the updates
    /// run side by side once the last backward pass is done: a table's Adam update on
    /// one PE, thousands of cycles, can take as long as the samples).
    pub(super) fn step(&self, lanes: &Lanes) -> u64 {
        let each: Vec<(Cost, u64)> = (0..self.f.kernels.len())
            .map(|k| self.kernel_on(k, lanes))
            .collect();
        let update = each.iter().map(|e| e.1).max().unwrap_or(0);
        let sched = schedule(self.f, self.widths, |k| lanes.reps[k]);
        let servers: Vec<super::replay::Server> = (each.iter().enumerate())
            .map(|(k, (c, _))| super::replay::Server {
                fwd: c[0],
                bwd: c[1],
                window: sched[k].0,
                sends: match self.dims[k] {
                    Some(_) => c[1] / 2,
                    None => c[1],
                },
            })
            .collect();
        super::replay::replay(&servers, self.f.batch) + update
    }

    /// The lanes of vector kernel `k` after a kernel with `prev` output lanes (or, first
    /// in the chain, `first` when it can run on several); `None` when its width does not
    /// split over them.
    pub(super) fn vector_lanes(&self, k: usize, prev: Option<u32>, first: u32) -> Option<u32> {
        match (self.width[k], prev) {
            (None, _) => Some(1),
            (Some(_), None) => self.heads[k]
                .is_none_or(|h| h % first == 0)
                .then_some(first),
            (Some(w), Some(l)) => {
                (crate::backend::wafer::kernels::lanes_fit(w, self.image_rows(k), l)
                    && self.heads[k].is_none_or(|h| h % l == 0))
                .then_some(l)
            }
        }
    }

    /// Whether layer `k` takes one row: before a one-lane kernel, an embedding of
    /// several ids a sample (whose rows would each send a part of every id's row), or
    /// a dense layer over tokens before a layer that is not one.
    pub(super) fn one_row(&self, k: usize) -> bool {
        // (a dense layer over tokens whose rows would each send a share of every
        // token to a layer that reads them flattened, as runs of the flat words)
        let flattened = self.over_tokens(k)
            && self.dims.get(k + 1).is_some_and(Option::is_some)
            && !self.over_tokens(k + 1);
        self.single_next[k]
            || flattened
            || self.dims[k].is_some_and(|d| matches!(d.shape, Shape::Gather { t } if t > 1))
    }

    /// Whether layer `k` takes one column: a dense layer over tokens that the host
    /// feeds, whose column takes every token whole (the host sends a column a run of
    /// a sample's words, and a column's share of each token is a strided part of it;
    /// a kernel's lanes send each its share of every token).
    pub(super) fn one_column(&self, k: usize) -> bool {
        let from_host = match self.f.kernels[k].kind {
            Kind::Dense { x, .. } => {
                (self.f.streams.iter()).any(|s| s.node == self.f.resolve(x) && s.from == End::Host)
            }
            Kind::Vector { .. } => false,
        };
        from_host && self.over_tokens(k)
    }

    /// Whether kernel `k` is a dense layer over tokens.
    fn over_tokens(&self, k: usize) -> bool {
        (self.dims.get(k).copied().flatten())
            .is_some_and(|d| matches!(d.shape, Shape::Tokens { .. }))
    }

    /// The output lanes a dense layer may take: 1 before a one-lane kernel, or up to
    /// one more than its most replicas when its dealer gathers them (`fanned`); else
    /// at least its floor.
    pub(super) fn rows(&self, k: usize, n: u32) -> Vec<u32> {
        let most = self.fab.height.max(self.fab.width);
        if self.fanned.get(k + 1).is_some_and(Option::is_some) {
            (1..=n.min(1 + MAX_REPS)).collect()
        } else if self.one_row(k) {
            vec![1]
        } else {
            // (a convolution's rows may also give its channels in bands of rows)
            let bands = crate::backend::wafer::kernels::lane_counts(n, self.band_rows(k).1, most);
            let whole = self.floor[k]..=n.min(most);
            whole
                .chain(bands.into_iter().filter(|&l| l > n && l >= self.floor[k]))
                .collect()
        }
    }

    /// Whether layer `k` may take `w` input lanes: a run of whole input groups each,
    /// or, a convolution's, a channel's band of rows each (`kernels::lanes_fit`).
    pub(super) fn takes(&self, k: usize, w: u32) -> bool {
        let rows = self.band_rows(k).0;
        self.dims[k].is_some_and(|d| crate::backend::wafer::kernels::lanes_fit(d.k, rows, w))
    }

    /// The input lane counts layer `k` may take (`takes`), fewest first.
    pub(super) fn column_counts(&self, k: usize) -> Vec<u32> {
        let most = self.fab.width.max(self.fab.height);
        let rows = self.band_rows(k).0;
        self.dims[k].map_or(Vec::new(), |d| {
            crate::backend::wafer::kernels::lane_counts(d.k, rows, most)
        })
    }

    /// Whether vector kernel `k` on `lanes` lanes sums statistics of the batch over the
    /// lanes of each channel (`Vector::sums_in_bands`).
    pub(super) fn sums_in_bands(&self, k: usize, lanes: u32) -> bool {
        self.dims[k].is_none()
            && vector_of(self.g, self.f, k, ((self.f.batch, 0), self.across), |_| 0)
                .sums_in_bands(lanes)
    }

    /// Whether vector kernel `k` on `lanes` lanes exchanges halos along the lanes of
    /// each channel (`Vector::halos`).
    pub(super) fn halos(&self, k: usize, lanes: u32) -> bool {
        self.dims[k].is_none()
            && vector_of(self.g, self.f, k, ((self.f.batch, 0), self.across), |_| 0).halos(lanes)
    }

    /// The rows layer `k` may deal its input and output in bands of (`Dense::bands`):
    /// a convolution's planes' when it may run in bands (`Dense::can_band`), else 1.
    pub(super) fn band_rows(&self, k: usize) -> (u32, u32) {
        band_rows((self.dense[k].as_ref(), self.dims[k]))
    }

    /// The rows of the images vector kernel `k` deals (those the layer before gives;
    /// 1 when that is no convolution): what bands of its lanes may split.
    pub(super) fn image_rows(&self, k: usize) -> u32 {
        k.checked_sub(1).map_or(1, |l| self.band_rows(l).1)
    }
}

/// `Sizer::band_rows` of a layer (its kernel and dimensions).
fn band_rows((layer, dims): (Option<&Dense>, Option<Dims>)) -> (u32, u32) {
    match (layer, dims) {
        (Some(layer), Some(d)) if layer.can_band() => d.shape.rows(),
        _ => (1, 1),
    }
}
