//! A layer's lanes: the columns and rows of a frame it uses, what each column takes
//! and each row gives of a sample (groups of features or channels, or a channel's band
//! of rows: `kernels::share`), when a convolution runs in bands (`Dense::bands`), the
//! runs of its weight a PE holds, and what it adds to its row's chain of what the layer
//! carries (`Carrying`).

use super::super::{bands_of, lanes_fit, share, split, used, Share};
use super::{Back, Carrying, Dense, Geom, Shape};

impl Dense {
    /// The columns and rows of a `w x h` frame that hold a block (each part gets
    /// `ceil(k / w)` inputs, so fewer columns may do; in bands, a column a channel's
    /// band and a row a channel's).
    pub fn used(&self, w: u32, h: u32) -> (u32, u32) {
        let (bi, bo) = self.bands;
        (
            if bi > 1 { self.k * bi } else { used(self.k, w) },
            if bo > 1 { self.n * bo } else { used(self.n, h) },
        )
    }

    /// Whether it may run in bands of rows (`bands`): a convolution in f32 without
    /// further parts (what it carries, its input or an image it passes on, goes in
    /// bands too: `carrying_in_bands`).
    pub fn can_band(&self) -> bool {
        matches!(self.shape, Shape::Conv(_)) && self.half.is_none() && self.more.is_empty()
    }

    /// The PEs of a `wc x hr` frame with the most to hold and the most to do: the
    /// first, or, in bands, of the first channels' bands, the one whose part of the
    /// convolution (`Geom::band`) has the largest planes (an output band near the far
    /// edge of its input band reads past it), then the one whose taps run over the most
    /// output rows (`Geom::reached`: a band in the middle reaches rows on both sides).
    pub fn heaviest(&self, (wc, hr): (u32, u32)) -> [(u32, u32); 2] {
        let (Shape::Conv(g), (bi, bo)) = (self.shape, self.bands) else {
            return [(0, 0); 2];
        };
        if (bi, bo) == (1, 1) {
            return [(0, 0); 2];
        }
        let band = |(i, j): (u32, u32)| g.band(self.column(wc, i).rows, self.out_row(hr, j).rows);
        let pes = || (0..bi.min(wc)).flat_map(|i| (0..bo.min(hr)).map(move |j| (i, j)));
        let most = |key: &dyn Fn(Geom) -> u32| {
            pes()
                .max_by_key(|&ij| (band(ij).map_or(0, key), std::cmp::Reverse(ij)))
                .unwrap_or((0, 0))
        };
        [
            most(&|b| b.planes().pad + b.planes().out),
            most(&|b| b.reached().1),
        ]
    }

    /// This layer on `w` input lanes and `h` output lanes: a convolution on more lanes
    /// than its images have channels takes them in bands (`bands`, `kernels::bands_of`).
    pub fn on_lanes(&self, w: u32, h: u32) -> Dense {
        let (ri, ro) = self.shape.rows();
        Dense {
            bands: (bands_of(self.k, ri, w), bands_of(self.n, ro, h)),
            ..self.clone()
        }
    }

    /// What column `i` of `wc` takes of a sample: its input groups, or a channel's band.
    pub fn column(&self, wc: u32, i: u32) -> Share {
        share(self.k, self.shape.rows().0, self.bands.0, wc, i)
    }

    /// What row `j` of `hr` gives of a sample: its output groups, or a channel's band.
    pub fn out_row(&self, hr: u32, j: u32) -> Share {
        share(self.n, self.shape.rows().1, self.bands.1, hr, j)
    }

    /// The words of a sample's input that column `i` of `wc` takes, and of its output
    /// that row `j` of `hr` gives.
    pub fn column_words(&self, wc: u32, i: u32) -> std::ops::Range<u32> {
        let rows = self.shape.rows().0;
        self.column(wc, i).words(rows, self.shape.per_in() / rows)
    }
    pub fn row_words(&self, hr: u32, j: u32) -> std::ops::Range<u32> {
        let rows = self.shape.rows().1;
        self.out_row(hr, j).words(rows, self.shape.per_out() / rows)
    }

    /// The rows of `W` (seen as `[rows, n]`) that a column with input groups `ks`
    /// holds, in the order of its block: its features; its channels' pixels in NHWC
    /// order; or its filter taps (row, column), then its channels.
    pub(super) fn rows(&self, ks: &std::ops::Range<u32>) -> Vec<u32> {
        match self.shape {
            Shape::Matmul | Shape::Gather { .. } | Shape::Tokens { .. } => ks.clone().collect(),
            Shape::Planar { hw } => ks
                .clone()
                .flat_map(|c| (0..hw).map(move |p| p * self.k + c))
                .collect(),
            Shape::Conv(g) | Shape::ConvT(g) => (0..g.r * g.s)
                .flat_map(|t| ks.clone().map(move |c| t * self.k + c))
                .collect(),
        }
    }

    /// The runs of a transposed convolution's filter (`[r, s, n, k]`: its outputs'
    /// channels before its inputs') that a PE of input channels `ks` and output
    /// channels `ns` holds, in the order of its block (`[r][s][b][a]`): a run of its
    /// inputs' for each tap and output channel.
    pub(super) fn transposed_block(
        &self,
        g: Geom,
        ks: &std::ops::Range<u32>,
        ns: &std::ops::Range<u32>,
    ) -> Vec<(u32, u32)> {
        let (a, k, n) = (ks.len() as u32, self.k, self.n);
        (0..g.r * g.s)
            .flat_map(|t| ns.clone().map(move |o| ((t * n + o) * k + ks.start, a)))
            .collect()
    }

    /// The runs of its weight that a PE of input rows `rows` and output columns `ns`
    /// holds: a run of each row, or (its columns in `groups`) the PE's share of each
    /// group in each row; an error when its groups do not split evenly over `hr` rows.
    pub(super) fn block(
        &self,
        rows: &[u32],
        ns: &std::ops::Range<u32>,
        hr: u32,
    ) -> Result<Vec<(u32, u32)>, String> {
        let (b, g) = (ns.len() as u32, self.groups.max(1));
        if g > 1 && !self.n.is_multiple_of(g * hr.max(1)) {
            return Err(format!(
                "{} columns in {g} groups do not split over {hr} rows",
                self.n
            ));
        }
        let (per, start, len) = (self.n / g, ns.start / g, b / g);
        Ok((rows.iter())
            .flat_map(|&r| (0..g).map(move |q| (r * self.n + q * per + start, len)))
            .collect())
    }

    /// What PE `(i, j)` of a frame of `hr` rows, holding input groups `ks` of its row's
    /// `cols` columns, adds to its row's chain for what the layer carries past itself
    /// (`Carrying`; nothing when it carries nothing).
    pub(super) fn carrying(
        &self,
        (i, j): (u32, u32),
        hr: u32,
        ks: &std::ops::Range<u32>,
        cols: u32,
    ) -> Result<Carrying, String> {
        let Some(back) = self.carry else {
            return Ok(Carrying::default());
        };
        let conv = matches!(self.shape, Shape::Conv(_));
        let tokens = matches!(self.shape, Shape::Tokens { .. });
        if !conv && !tokens && self.shape != Shape::Matmul {
            return Err(
                "a residual around an embedding or a flattened image has no wafer kernel yet"
                    .into(),
            );
        }
        let same_plane = match self.shape {
            Shape::Conv(g) => self.carried_px() == g.ho * g.wo,
            _ => true,
        };
        if back == Back::Same && (self.carried() != self.n || !same_plane) {
            return Err("a residual whose sum has another shape than its layer's input".into());
        }
        // (in bands when its columns or its rows deal the image's channels in bands:
        // more lanes than channels; a shortcut's input to a layer that takes it so)
        let c = self.carried();
        if conv && self.carried_rows() > 1 && (hr > c || cols > c) {
            return self.carrying_in_bands((i, j), (cols, hr));
        }
        let rows = split(self.carried(), hr, j);
        // (a value passed on: this column's share of it, after its inputs)
        let ks = match self.pass {
            0 => ks.clone(),
            _ => split(self.carried(), cols, i),
        };
        let (lo, hi) = (ks.start.max(rows.start), ks.end.min(rows.end));
        Ok(Carrying {
            mine: hi.saturating_sub(lo),
            at: lo.saturating_sub(ks.start),
            to: lo.saturating_sub(rows.start),
            pass: if self.pass > 0 { ks.len() as u32 } else { 0 },
            px: self.carried_px(),
            row: rows.len() as u32,
            rows: false,
        })
    }

    /// `carrying` in bands of rows: the image it carries (its input, or one it passes
    /// on) dealt over its columns and over its rows as an image is over lanes
    /// (`kernels::share`: whole channels, or one channel's band of rows, a lane); PE
    /// `(i, j)` copies the rows its column's share and its row's share have in common
    /// (a row of the image's words a unit: a run of them, since where both shares hold
    /// several channels they hold them whole).
    fn carrying_in_bands(
        &self,
        (i, j): (u32, u32),
        (cols, hr): (u32, u32),
    ) -> Result<Carrying, String> {
        let (c, h) = (self.carried(), self.carried_rows());
        let px = self.carried_px() / h;
        if !lanes_fit(c, h, cols) || !lanes_fit(c, h, hr) || self.carried_px() != h * px {
            return Err(format!(
                "an image of {c} channels of {h} rows carried in bands over {cols} columns and {hr} rows has no wafer kernel"
            ));
        }
        let dealt = |lanes: u32, l: u32| share(c, h, bands_of(c, h, lanes), lanes, l);
        let (col, row) = (dealt(cols, i), dealt(hr, j));
        let groups = col.groups.start.max(row.groups.start)..col.groups.end.min(row.groups.end);
        let rows = col.rows.start.max(row.rows.start)..col.rows.end.min(row.rows.end);
        // (where the common run starts within a share: its channels' rows one after
        // another)
        let offset = |s: &Share| {
            (groups.start - s.groups.start) * s.rows.len() as u32 + rows.start - s.rows.start
        };
        let (mine, at, to) = match !groups.is_empty() && !rows.is_empty() {
            true => (
                groups.len() as u32 * rows.len() as u32,
                offset(&col),
                offset(&row),
            ),
            false => (0, 0, 0),
        };
        Ok(Carrying {
            mine,
            at,
            to,
            pass: if self.pass > 0 { col.units() } else { 0 },
            px,
            row: row.units(),
            rows: true,
        })
    }
}
