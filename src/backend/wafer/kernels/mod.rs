//! The kernel library: each group of train-graph ops becomes a resizable kernel that,
//! given a rectangle, yields its per-PE programs, routes and the places of its tensors.
//!
//! - `dense`: `y = x W` with its input gradient, weight gradient and update, on the
//!   checkerboard GEMV mapping.
//!
//! A kernel is laid out in its own frame: `i` counts its input lanes and `j` its output
//! lanes, inputs enter at the north edge and outputs leave at the east edge. `Orient`
//! maps that frame onto the fabric, as it is or transposed (inputs from the west,
//! outputs to the south), so that a kernel's output edge can face the next one's input
//! edge lane for lane.

pub mod dense;
pub mod rows;
pub mod vector;

use super::isa::{Colour, Instr, Program, TaskId};
use super::sim::{Dir, Route};
use crate::ir::DType;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The task every PE with an update runs it as: the host launches it once per step,
/// after the samples.
pub const UPDATE: TaskId = 62;

/// The name of a layer's copy of variable `name` rounded to half precision `dtype` (a
/// half-precision layer's weight as its products read it: `Dense::half`), which the
/// host writes whenever it writes the variable, and the layer's update after it
/// updates it.
pub fn half_copy(name: &str, dtype: DType) -> String {
    format!("{name}#{dtype}")
}

/// Where the words of one tensor are: pieces, each on a PE from a word on, holding
/// runs of the tensor's flat elements (offset, length) one after another.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Piece {
    pub pe: (u32, u32),
    pub word: u32,
    pub runs: Vec<(u32, u32)>,
}

impl Piece {
    /// Where columns `cols` of a matrix of `width` columns whose pieces are `pieces`
    /// lie, as pieces of a matrix of those columns alone (a variable joined beside
    /// others as a layer's weight: `form::joined`).
    pub fn columns(pieces: &[Piece], width: u32, cols: std::ops::Range<u32>) -> Vec<Piece> {
        let mut out: Vec<Piece> = Vec::new();
        let narrow = cols.end - cols.start;
        for p in pieces {
            let mut word = p.word;
            for &(off, n) in &p.runs {
                // each row's share of the run, clipped to the columns
                let mut e = off;
                while e < off + n {
                    let (row, col) = (e / width, e % width);
                    let end = (off + n).min((row + 1) * width);
                    let (lo, hi) = (col.max(cols.start), (col + end - e).min(cols.end));
                    if lo < hi {
                        // (element `e` lies at word `word + e - off`)
                        let at = word + (e - off) + (lo - col);
                        let run = (row * narrow + lo - cols.start, hi - lo);
                        push_run(&mut out, p.pe, at, run);
                    }
                    e = end;
                }
                word += n;
            }
        }
        out
    }
}

/// Adds run `run` at word `at` of PE `pe` to `pieces`: into the last piece when it
/// follows on in both the PE's words and the tensor's elements.
fn push_run(pieces: &mut Vec<Piece>, pe: (u32, u32), at: u32, run: (u32, u32)) {
    if let Some(last) = pieces.last_mut() {
        let len: u32 = last.runs.iter().map(|r| r.1).sum();
        if last.pe == pe && last.word + len == at {
            match last.runs.last_mut() {
                Some(r) if r.0 + r.1 == run.0 => r.1 += run.1,
                _ => last.runs.push(run),
            }
            return;
        }
    }
    pieces.push(Piece {
        pe,
        word: at,
        runs: vec![run],
    });
}

/// A kernel laid out on its rectangle, in fabric coordinates.
#[derive(Debug, Clone, Default)]
pub struct Laid {
    /// `(x, y)` -> program and initial SRAM words.
    pub pes: BTreeMap<(u32, u32), (Arc<Program>, Vec<f32>)>,
    /// `(x, y, colour)` -> route.
    pub routes: BTreeMap<(u32, u32, Colour), Route>,
    /// Named tensors (variables, gradients, host values) and where they live.
    pub tensors: BTreeMap<String, Vec<Piece>>,
    /// The tensors whose pieces each hold a part of their value, which is the sum of
    /// them (`gather_sum`): the weight gradient of a layer in bands (`Dense::bands`),
    /// each PE's over its band. The host sums them and writes the sum back into every
    /// piece before the updates run, so that every copy of the weight stays equal.
    pub summed: std::collections::BTreeSet<String>,
}

impl Laid {
    /// Adds a route, refusing a second one for the same router and colour.
    pub fn route(&mut self, at: (u32, u32), c: Colour, r: Route) -> Result<(), String> {
        if let Some(old) = self.routes.insert((at.0, at.1, c), r) {
            if old != r {
                return Err(format!(
                    "router ({}, {}) has two routes for colour {c}",
                    at.0, at.1
                ));
            }
        }
        Ok(())
    }

    /// Adds what another layout holds (disjoint PEs; routes must agree).
    pub fn merge(&mut self, other: Laid) -> Result<(), String> {
        for (k, v) in other.pes {
            if self.pes.insert(k, v).is_some() {
                return Err(format!("PE ({}, {}) is laid out twice", k.0, k.1));
            }
        }
        for ((x, y, c), r) in other.routes {
            self.route((x, y), c, r)?;
        }
        for (k, mut v) in other.tensors {
            self.tensors.entry(k).or_default().append(&mut v);
        }
        self.summed.extend(other.summed);
        Ok(())
    }
}

/// A rectangle of PEs: its north-west corner and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
}

/// How a kernel's frame lies on the fabric.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub enum Orient {
    /// As it is: inputs from the north, outputs to the east.
    North,
    /// Transposed: inputs from the west, outputs to the south.
    West,
}

impl Orient {
    /// The fabric PE of frame position `(i, j)` for a frame whose origin is at `o`.
    pub fn at(self, o: (u32, u32), i: u32, j: u32) -> (u32, u32) {
        match self {
            Orient::North => (o.0 + i, o.1 + j),
            Orient::West => (o.0 + j, o.1 + i),
        }
    }

    /// The fabric direction of a frame direction.
    pub fn dir(self, d: Dir) -> Dir {
        match (self, d) {
            (Orient::North, d) => d,
            (Orient::West, Dir::N) => Dir::W,
            (Orient::West, Dir::W) => Dir::N,
            (Orient::West, Dir::S) => Dir::E,
            (Orient::West, Dir::E) => Dir::S,
            (Orient::West, Dir::Ramp) => Dir::Ramp,
        }
    }

    /// The fabric size of a `w x h` frame.
    pub fn size(self, w: u32, h: u32) -> (u32, u32) {
        match self {
            Orient::North => (w, h),
            Orient::West => (h, w),
        }
    }

    /// The other orientation.
    pub fn flip(self) -> Orient {
        match self {
            Orient::North => Orient::West,
            Orient::West => Orient::North,
        }
    }

    /// A route given in frame directions.
    pub fn route(self, rx: Dir, tx: &[Dir]) -> Route {
        let tx: Vec<Dir> = tx.iter().map(|&d| self.dir(d)).collect();
        Route::new(self.dir(rx), &tx)
    }
}

/// `loops` nested loops (outermost first) around `body`.
pub fn nest(loops: &[u32], body: Instr) -> Instr {
    loops.iter().rev().fold(body, |b, &count| Instr::Loop {
        count,
        body: vec![b],
    })
}

/// `n` items dealt to `parts` in contiguous runs of `ceil(n / parts)`: the range of
/// part `i` (empty for the parts past the end).
pub fn split(n: u32, parts: u32, i: u32) -> std::ops::Range<u32> {
    let per = n.div_ceil(parts.max(1));
    (i * per).min(n)..((i + 1) * per).min(n)
}

/// What lane `lane` of `lanes` holds of a sample of `groups` features or channels, of
/// `rows` rows each (an image's planes; 1 else), dealt in `bands` bands of rows: with
/// one band, its groups `split(groups, lanes, lane)` whole; with more (`lanes` is then
/// `groups * bands`), one channel, `lane / bands`, and its band of rows
/// `split(rows, bands, lane % bands)`. Either way a run of the sample's planar words,
/// the lanes' one after another.
pub fn share(groups: u32, rows: u32, bands: u32, lanes: u32, lane: u32) -> Share {
    if bands > 1 {
        let c = (lane / bands).min(groups);
        Share {
            groups: c..(c + 1).min(groups),
            rows: split(rows, bands, lane % bands),
        }
    } else {
        Share {
            groups: split(groups, lanes, lane),
            rows: 0..rows,
        }
    }
}

/// The bands of rows `lanes` lanes deal a sample of `groups` groups of `rows` rows in
/// (`share`): `lanes / groups` on more lanes than groups (an image's channels), else 1.
pub fn bands_of(groups: u32, rows: u32, lanes: u32) -> u32 {
    if lanes > groups && rows > 1 && groups > 0 {
        lanes / groups
    } else {
        1
    }
}

/// Whether `lanes` lanes each hold a share of a sample of `groups` groups of `rows`
/// rows (`share`): a run of whole groups each, or, in bands, each a band of at least a
/// row of one channel.
pub fn lanes_fit(groups: u32, rows: u32, lanes: u32) -> bool {
    match bands_of(groups, rows, lanes) {
        1 => lanes <= groups.max(1) && used(groups, lanes) == lanes,
        b => lanes == groups * b && used(rows, b) == b,
    }
}

/// The lane counts that each hold a share of a sample of `groups` groups of `rows`
/// rows (`lanes_fit`), fewest first, up to `most`.
pub fn lane_counts(groups: u32, rows: u32, most: u32) -> Vec<u32> {
    (1..=most).filter(|&l| lanes_fit(groups, rows, l)).collect()
}

/// A lane's share of a sample (`share`): its groups, and their rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Share {
    pub groups: std::ops::Range<u32>,
    pub rows: std::ops::Range<u32>,
}

impl Share {
    /// The rows it holds of a sample, each of its groups' (a group a unit where groups
    /// have one row).
    pub fn units(&self) -> u32 {
        self.groups.len() as u32 * self.rows.len() as u32
    }

    /// The sample's words it holds when each row has `row` words (a plane, `rows`
    /// of them, `rows * row` a group).
    pub fn words(&self, rows: u32, row: u32) -> std::ops::Range<u32> {
        if self.groups.is_empty() {
            let at = self.groups.start * rows * row;
            return at..at;
        }
        let last = self.groups.end - 1;
        (self.groups.start * rows + self.rows.start) * row..(last * rows + self.rows.end) * row
    }
}

/// The parts of `split(n, parts, _)` that are not empty.
pub fn used(n: u32, parts: u32) -> u32 {
    n.div_ceil(n.div_ceil(parts.max(1)).max(1))
}

/// Writes a tensor's flat `data` into its pieces (`write(pe, word, words)`).
pub fn scatter(pieces: &[Piece], data: &[f32], mut write: impl FnMut((u32, u32), u32, &[f32])) {
    for p in pieces {
        let mut word = p.word;
        for &(off, len) in &p.runs {
            if let Some(d) = data.get(off as usize..(off + len) as usize) {
                write(p.pe, word, d);
            }
            word += len;
        }
    }
}

/// Reads a tensor of `len` elements whose pieces each hold a part of it (a gradient of
/// a weight several PEs hold, each summing over its own share of a sample: `Laid::summed`):
/// the sum of every piece's (elements no piece holds are 0).
pub fn gather_sum<'a>(
    pieces: &[Piece],
    len: usize,
    read: impl Fn((u32, u32)) -> Option<&'a [f32]>,
) -> Vec<f32> {
    let mut out = vec![0.0; len];
    runs_of(
        pieces,
        read,
        |dst, src| (dst.iter_mut().zip(src)).for_each(|(d, s)| *d += s),
        &mut out,
    );
    out
}

/// Each run of `pieces` (read from `read(pe)`) with the elements of `out` it holds:
/// `f(those elements, the run's words)`.
fn runs_of<'a>(
    pieces: &[Piece],
    read: impl Fn((u32, u32)) -> Option<&'a [f32]>,
    mut f: impl FnMut(&mut [f32], &[f32]),
    out: &mut [f32],
) {
    for p in pieces {
        let Some(mem) = read(p.pe) else { continue };
        let mut word = p.word as usize;
        for &(off, n) in &p.runs {
            let (off, n) = (off as usize, n as usize);
            if let (Some(dst), Some(src)) = (out.get_mut(off..off + n), mem.get(word..word + n)) {
                f(dst, src);
            }
            word += n;
        }
    }
}

/// Reads a tensor of `len` elements from its pieces (`read(pe)`: the PE's memory);
/// elements no piece holds are NaN. Where pieces repeat an element (a value every PE
/// holds a copy of), the last one read wins.
pub fn gather<'a>(
    pieces: &[Piece],
    len: usize,
    read: impl Fn((u32, u32)) -> Option<&'a [f32]>,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; len];
    runs_of(pieces, read, |dst, src| dst.copy_from_slice(src), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::{gather, Piece};

    /// A joined weight of 3 rows by 5 columns whose blocks straddle its variables'
    /// columns (`1..4` of every row on one PE, `0` and `4` on another): the columns
    /// `2..5` of it, read through `Piece::columns`, are that variable's own matrix.
    #[test]
    fn a_variables_columns_of_a_joined_weight_read_as_its_own_matrix() {
        let (width, rows) = (5u32, 3u32);
        // PE (0, 0) holds columns 1..4 of each row; PE (1, 0) columns 0 and 4
        let a = Piece {
            pe: (0, 0),
            word: 2,
            runs: (0..rows).map(|r| (r * width + 1, 3)).collect(),
        };
        let b = Piece {
            pe: (1, 0),
            word: 0,
            runs: (0..rows)
                .flat_map(|r| [(r * width, 1), (r * width + 4, 1)])
                .collect(),
        };
        // each PE's words hold the joined weight's flat index of what it holds
        let memory = |p: &Piece| {
            let mut m = vec![-1.0f32; p.word as usize];
            for &(off, n) in &p.runs {
                m.extend((off..off + n).map(|e| e as f32));
            }
            m
        };
        let (ma, mb) = (memory(&a), memory(&b));
        let read = |pe: (u32, u32)| match pe {
            (0, 0) => Some(ma.as_slice()),
            (1, 0) => Some(mb.as_slice()),
            _ => None,
        };
        let cols = Piece::columns(&[a, b], width, 2..5);
        let got = gather(&cols, 9, read);
        let want: Vec<f32> = (0..rows)
            .flat_map(|r| (2..5).map(move |c| (r * width + c) as f32))
            .collect();
        assert_eq!(got, want);
        // (PE (0, 0)'s columns 2..4 of each row lie apart in its words: a piece a row)
        assert_eq!(cols.iter().filter(|p| p.pe == (0, 0)).count(), 3);
    }
}
