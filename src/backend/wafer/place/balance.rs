//! Balancing: each kernel sized to a budget of cycles per sample (the fewest lanes
//! that meet it and leave the next kernel able to), the staircase that fits the
//! fabric, and the sizing of one block size for every layer.

use super::lanes::*;
use super::search::{thrifty, STEP_SLACK};
use super::sizer::*;
use super::{kernel_name, LayoutError};
use std::cell::RefCell;
use std::collections::HashMap;

/// How many of the first layer's smallest shapes a budget's chains are tried from.
const SHAPES: usize = 8;

impl Sizer<'_> {
    /// Each kernel sized to budget `t`: every layer gets the fewest lanes whose cost `t`
    /// admits and that leave the next layer able to meet `t`, and the staircase fits the
    /// fabric; `None` when some kernel cannot meet `t` on the lanes its neighbours leave
    /// it, or no staircase fits. The first layer's rows are
    /// the next layer's columns, so its shape decides the chain's: of its few smallest
    /// shapes, the one whose chain takes the fewest PEs for about the shortest
    /// estimated step (`thrifty`).
    pub(super) fn for_period(&self, t: Budget) -> Option<Lanes> {
        let mut shapes = Vec::new();
        let first = self.chain(t, None, &mut shapes);
        let others = shapes.into_iter().skip(1).take(SHAPES - 1);
        let chains = others.filter_map(|s| self.chain(t, Some(s), &mut Vec::new()));
        let mut all: Vec<Lanes> = first.into_iter().chain(chains).collect();
        let keys: Vec<(u64, usize)> = (all.iter())
            .map(|l| (self.step(l), self.area(l) as usize))
            .collect();
        thrifty(keys.into_iter()).map(|i| all.swap_remove(i))
    }

    /// `lanes` with the first layer given the fewest columns that keep the estimated step
    /// within half of `STEP_SLACK` (its columns are its own: no other kernel's size
    /// depends on them). A budget sizes every kernel to the pass it bounds; a layer
    /// faster than a pass's slowest kernel gains nothing from its extra PEs.
    pub(super) fn trim(&self, mut lanes: Lanes) -> Lanes {
        if self.dims.first().copied().flatten().is_none() {
            return lanes;
        }
        let step = self.step(&lanes);
        let limit = step + step * STEP_SLACK / 2000;
        let h = lanes.out[0];
        let fewest = (1..lanes.inp[0])
            .filter(|&w| self.takes(0, w) && self.layer_fits(0, w, h))
            .find(|&w| {
                let mut l = lanes.clone();
                l.inp[0] = w;
                self.step(&l) <= limit
            });
        if let Some(w) = fewest {
            lanes.inp[0] = w;
        }
        lanes
    }

    /// The PEs a sizing's kernels take.
    pub(super) fn area(&self, lanes: &Lanes) -> u32 {
        (0..self.f.kernels.len())
            .map(|k| match self.dims[k] {
                Some(_) => {
                    let more: u32 = lanes.more[k].iter().sum();
                    (lanes.inp[k] + more) * lanes.out[k]
                }
                None => lanes.strip(k),
            })
            .sum()
    }

    /// `for_period` with the first layer's shape `first`, or (none given) its
    /// smallest (the fewest PEs, then the fewest rows), its shapes that meet `t` put in
    /// `shapes` smallest first.
    pub(super) fn chain(
        &self,
        t: Budget,
        first: Option<(u32, u32)>,
        shapes: &mut Vec<(u32, u32)>,
    ) -> Option<Lanes> {
        let nk = self.f.kernels.len();
        let mut lanes = Lanes::new(nk);
        // (the staircase of the kernels sized so far)
        let mut walk = Walk::default();
        for k in 0..nk {
            // (a staircase that runs off the fabric already does with every kernel
            // still to size: they only add to it)
            if !self.holds(walk.extent) {
                return None;
            }
            let prev = k.checked_sub(1).map(|p| lanes.out[p]);
            let Some(d) = self.dims[k] else {
                let l = self.vector_lanes(k, prev, 1)?;
                // (a one-lane kernel's dealer may gather the rows of the layer before)
                let fan = match prev {
                    Some(p) if p != l && l == 1 && self.fanned[k].is_some() => p,
                    Some(p) if p != l => return None,
                    _ => 1,
                };
                // (a one-lane kernel as the fewest replicas that meet `t`)
                let reps = if l == 1 { self.reps(k, fan) } else { vec![1] };
                let r = reps.into_iter().find(|&r| {
                    self.vector_period(k, l, r, fan)
                        .is_some_and(|c| t.admits(c))
                })?;
                lanes.inp[k] = l;
                lanes.out[k] = l;
                lanes.reps[k] = r;
                walk.strip(lanes.strip(k));
                continue;
            };
            let nn = d.n;
            let hs = self.rows(k, nn);
            // the next layer (past a strip) takes these rows as its columns: it must
            // still reach `t` on them
            // (asked of every shape tried: the rows it may take remembered per column
            // count)
            let reached = RefCell::new(HashMap::new());
            let ok = |w: u32, h: u32| {
                t.admits(self.layer_period(k, d, w, h))
                    && self.layer_fits(k, w, h)
                    && self.lanes_after_meet(k, h, t)
                    && self.next_reaches(walk, (k, w, h), t, &reached)
                    && self.part_lanes(k, h, t).is_some()
            };
            let (w, h) = match (prev, first) {
                (None, Some(shape)) => shape,
                (None, None) => {
                    // (kept smallest first, the fewest rows first among equals; only
                    // the smallest `SHAPES` are wanted, so a shape larger than every
                    // one of them is not looked for; each column count once, as
                    // `used` never falls)
                    let key = |&(w, h): &(u32, u32)| (w * h, h);
                    let (mut last, low) = (0, hs.first().map_or(1, |&h| lanes_used(nn, h)));
                    let widths = match self.one_column(k) {
                        true => vec![1],
                        false => self.column_counts(k),
                    };
                    for w in widths {
                        let bound = shapes.get(SHAPES - 1).map_or(u32::MAX, |s| key(s).0);
                        if w == last || w.saturating_mul(low) > bound {
                            continue;
                        }
                        last = w;
                        let h = (hs.iter().map(|&h| lanes_used(nn, h)))
                            .take_while(|&h| w.saturating_mul(h) <= bound)
                            .find(|&h| ok(w, h));
                        if let Some(h) = h {
                            let at = shapes.partition_point(|s| key(s) <= key(&(w, h)));
                            shapes.insert(at, (w, h));
                        }
                    }
                    *shapes.first()?
                }
                (Some(w), _) => {
                    if !self.takes(k, w) || (self.one_column(k) && w != 1) {
                        return None;
                    }
                    let h = *hs.iter().find(|&&h| ok(w, lanes_used(nn, h)))?;
                    (w, lanes_used(nn, h))
                }
            };
            lanes.inp[k] = w;
            lanes.out[k] = h;
            lanes.more[k] = self.part_lanes(k, h, t)?;
            walk.layer(lanes.columns(k), h);
        }
        self.holds(walk.extent).then_some(lanes)
    }

    /// Whether the layer after layer `k` (past the vector kernels between) can meet
    /// budget `t` on the `h` rows `k` gives it as its columns, with rows the kernels
    /// after it take, and the staircase (`walk`, the kernels before `k`; then `k` on
    /// `w x h` lanes, the vector kernels on `h`, and the next layer on its fewest rows)
    /// still on the fabric: the first row count of the next layer that meets `t` may
    /// run in bands off the fabric where more columns would not. The row counts that
    /// meet `t` are remembered in `reached` by column count (the fewest of them, whose
    /// staircase is the smallest).
    fn next_reaches(
        &self,
        mut walk: Walk,
        (k, w, h): (usize, u32, u32),
        t: Budget,
        reached: &RefCell<HashMap<u32, Option<u32>>>,
    ) -> bool {
        let nk = self.f.kernels.len();
        let Some((j, d2)) = (k + 1..nk).find_map(|j| self.dims[j].map(|d| (j, d))) else {
            return true;
        };
        let mut reached = reached.borrow_mut();
        let rows = reached.entry(h).or_insert_with(|| {
            if !self.takes(j, h) || (h > 1 && self.one_column(j)) {
                return None;
            }
            // (rows the layer after that takes: no bands for one that is no
            // convolution)
            let then = (j + 1..nk).find(|&i| self.dims[i].is_some());
            // (the fewest: the rows are tried fewest first)
            (self.rows(j, d2.n).into_iter())
                .map(|h2| lanes_used(d2.n, h2))
                .find(|&h2| {
                    t.admits(self.layer_period(j, d2, h, h2))
                        && self.layer_fits(j, h, h2)
                        && self.lanes_after_meet(j, h2, t)
                        && then.is_none_or(|i| self.takes(i, h2))
                })
        });
        let Some(fewest) = *rows else {
            return false;
        };
        walk.layer(w, h);
        for _ in k + 1..j {
            walk.strip(h);
        }
        walk.layer(h, fewest);
        self.holds(walk.extent)
    }

    /// Whether the vector kernels of several lanes just after layer `k` meet budget `t`
    /// on the `h` lanes it gives them (they take its rows as theirs: a layer with too
    /// few rows for them is no sizing at `t`, where one with more may be).
    fn lanes_after_meet(&self, k: usize, h: u32, t: Budget) -> bool {
        (k + 1..self.f.kernels.len())
            .take_while(|&j| self.dims[j].is_none() && self.width[j].is_some())
            .all(|j| {
                (self.vector_lanes(j, Some(h), 1).filter(|&l| l == h))
                    .is_some_and(|l| self.vector_period(j, l, 1, 1).is_some_and(|c| t.admits(c)))
            })
    }

    /// Whether the fabric holds a staircase of extent `(w, h)`.
    fn holds(&self, (w, h): (u32, u32)) -> bool {
        w <= self.fab.width && h <= self.fab.height
    }

    /// The sizings of the tightest budgets whose staircases fit the fabric: a common
    /// period for both passes together, and periods for each pass at several ratios
    /// of the backward pass's to the forward's (a step's passes go one after the
    /// other, each at its slowest kernel's pace: a kernel whose work is all in one
    /// pass, as a loss, leaves the layers room in the other). Each pace's budgets are
    /// tried from the least that admits every one-lane kernel up in steps of 2% (the
    /// greedy sizing is not monotone in the budget, so no bisection).
    pub(super) fn balanced(&self) -> Vec<Lanes> {
        // (each at its fastest: on its most replicas)
        let fastest = |k: usize| {
            (self.reps(k, 1).into_iter())
                .filter_map(|r| self.vector_period(k, 1, r, 1))
                .min_by_key(|c| c[0] + c[1])
        };
        let ones = (0..self.f.kernels.len())
            .filter(|&k| self.dims[k].is_none() && self.width[k].is_none());
        let single: Vec<Cost> = ones.clone().filter_map(fastest).collect();
        let on_one: Vec<Cost> = ones
            .filter_map(|k| self.vector_period(k, 1, 1, 1))
            .collect();
        // every kernel on one lane: a budget that admits them all sizes each kernel to
        // its fewest lanes, as every looser budget does
        let slowest: Vec<Cost> = (0..self.f.kernels.len())
            .filter_map(|k| match self.dims[k] {
                Some(d) => Some(self.layer_period(k, d, 1, 1)),
                None => self.vector_period(k, 1, 1, 1),
            })
            .collect();
        // the smallest period at which a pace admits all of `costs`
        let least = |pace: Pace, costs: &[Cost]| {
            let ok = |t: u64| costs.iter().all(|&c| pace.at(t).admits(c));
            let (mut lo, mut hi) = (0u64, 1u64 << 24);
            while lo + 1 < hi {
                let mid = (lo + hi) / 2;
                if ok(mid) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            hi
        };
        // the forward pass fixed at the one-lane kernels' pace, at their fastest and
        // on one PE each
        let forward = |s: &[Cost]| s.iter().map(|c| c[0]).max().filter(|&f| f > 0);
        let mut fixed: Vec<u64> = [forward(&single), forward(&on_one)]
            .into_iter()
            .flatten()
            .collect();
        fixed.dedup();
        let paces = [Pace::Together]
            .into_iter()
            .chain([(1, 2), (3, 4), (1, 1), (4, 3), (2, 1)].map(|(n, d)| Pace::Passes(n, d)))
            .chain(fixed.into_iter().map(Pace::Back));
        let mut found: Vec<Lanes> = Vec::new();
        for pace in paces {
            let (mut t, loosest) = (least(pace, &single), least(pace, &slowest));
            while t < 1 << 24 {
                if let Some(l) = self.for_period(pace.at(t)) {
                    let l = self.trim(l);
                    if !found.contains(&l) {
                        found.push(l);
                    }
                    break;
                }
                if t >= loosest {
                    break;
                }
                t += (t / 50).max(1);
            }
        }
        found
    }

    /// One block size `s` for every layer.
    pub(super) fn block(&self, s: u32) -> Result<Lanes, LayoutError> {
        let (g, f, nk) = (self.g, self.f, self.f.kernels.len());
        let used = crate::backend::wafer::kernels::used;
        let mut lanes = Lanes::new(nk);
        for k in 0..nk {
            let prev = k.checked_sub(1).map(|p| lanes.out[p]);
            match self.dims[k] {
                Some(Dims { k: kk, n: nn, .. }) => {
                    lanes.inp[k] = match prev {
                        Some(p) => p,
                        None if self.one_column(k) => 1,
                        None => used(kk, kk.div_ceil(s)),
                    };
                    lanes.out[k] = if self.one_row(k) {
                        1
                    } else {
                        // as many as the block size gives, or the floor, split evenly
                        // (a floor past the outputs in bands of rows, where the layer
                        // gives them)
                        let l = used(nn, nn.div_ceil(s)).max(self.floor[k]);
                        (l..=nn)
                            .find(|&l| used(nn, l) == l)
                            .or_else(|| (self.rows(k, nn).into_iter()).find(|&h| h > nn && h >= l))
                            .unwrap_or(nn)
                    };
                    lanes.more[k] = (self.parts(k))
                        .map(|(_, pd)| used(pd.k, pd.k.div_ceil(s)))
                        .collect();
                    if !self.takes(k, lanes.inp[k]) || (self.one_column(k) && lanes.inp[k] != 1) {
                        return Err(LayoutError::DoesNotFit(format!(
                            "layer {} cannot split its {kk} inputs over {} lanes",
                            kernel_name(g, f, k),
                            lanes.inp[k]
                        )));
                    }
                }
                None => {
                    let first = self.width[k].map_or(1, |w| w.div_ceil(s));
                    let l = self
                        .vector_lanes(k, prev, first)
                        .filter(|&l| prev.is_none_or(|p| p == l));
                    let Some(l) = l else {
                        return Err(LayoutError::DoesNotFit(format!(
                            "{} cannot take the {} lanes of the kernel before it",
                            kernel_name(g, f, k),
                            prev.unwrap_or_default()
                        )));
                    };
                    lanes.inp[k] = l;
                    lanes.out[k] = l;
                }
            }
        }
        Ok(lanes)
    }
}

/// The output lanes `h` lanes of a layer of `n` outputs come to: `used(n, h)`, or in
/// bands (more lanes than outputs: `kernels::lanes_fit`), `h` itself.
fn lanes_used(n: u32, h: u32) -> u32 {
    if h > n {
        h
    } else {
        crate::backend::wafer::kernels::used(n, h)
    }
}
