//! A layer that multiplies a sample by a resident weight: a dense layer `y = x W` (`k`
//! inputs, `n` outputs) or a 2-D convolution (`k` channels in, `n` out), on a `w x h`
//! frame, one sample at a time, on the checkerboard GEMV mapping of
//! `../shared/wafer/design.md` §1.3: PE `(i, j)` holds the block of `W` whose rows
//! are column `i`'s inputs (features, or channels with their filter taps) and whose
//! columns are row `j`'s outputs.
//!
//! - **Forward.** Column `i`'s slice of a sample enters at the north edge and is
//!   multicast down the column; each PE stashes it (for the weight gradient) and
//!   multiplies it by its block into a partial `y`; the partials of a row are summed
//!   along a chain from west to east on two alternating colours (a PE cannot receive
//!   and send one colour on a fixed route), and row `j`'s outputs leave at the east
//!   edge.
//! - **Backward.** Row `j`'s slice of `dy` enters at the east edge and is multicast west
//!   along the row; each PE multiplies its block by it into a partial `dx` (summed along
//!   a chain from south to north, leaving at the north edge: the input gradient) and
//!   adds the outer product of the stashed `x` slice and `dy` to its block of `dW`.
//! - **Update.** Once per step, launched by the host: the optimiser's elementwise code
//!   over the PE's blocks of `W`, its slots and `dW` (which it then zeroes).
//!
//! Images travel planar: a sample's channels one after another, each an `h x w` plane
//! row by row, so that a column's channels are one run of the stream. A convolution's
//! PE pads its channels into planes of pitch `wp` and computes each output plane as
//! one vector operation per (filter tap, input channel, output channel): the outputs
//! of a plane, `wp` apart row to row, read the padded input at one offset (stride 1;
//! the `wp - wo` words past each output row are computed and never sent).

use super::super::isa::{Colour, Dsd, Instr, Program, Src, Task, Trigger, VecOp};
use super::super::lower::{Scratch, Update, Val};
use super::super::pipeline::Pipeline;
use super::super::sim::Dir;
use super::{nest, split, used, Laid, Orient, Piece, UPDATE};
use crate::ir::{window_out, window_pad, Padding};
use std::sync::Arc;

/// What a layer computes with its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `y = x W`: `k` features in, `n` out.
    Matmul,
    /// `y = x W` of an image of `k` channels of `hw` pixels flattened in NHWC order
    /// (`W`'s rows), which arrives planar.
    Planar { hw: u32 },
    /// A convolution of an image of `k` channels into one of `n`.
    Conv(Geom),
    /// An embedding: each of a sample's `t` ids picks a row of the `k x n` table (`W`).
    Gather { t: u32 },
}

/// A convolution's geometry: input plane, filter, dilation, strides, the padding
/// before the first row and column, output plane. A PE computes the outputs of every
/// position from the first to the last strided one (`h1 x w1`, stride 1) and sends
/// those `stride` apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geom {
    pub h: u32,
    pub w: u32,
    pub r: u32,
    pub s: u32,
    pub dil: (u32, u32),
    pub stride: (u32, u32),
    pub pad: (u32, u32),
    pub ho: u32,
    pub wo: u32,
}

impl Geom {
    /// The geometry of an `h x w` input under an `r x s` filter at `stride`, `same` or
    /// valid padding (TensorFlow's: `ceil(h / stride)` outputs, the odd padding after);
    /// `None` when no output is left.
    pub fn new(
        h: u32,
        w: u32,
        (r, s): (u32, u32),
        dil: (u32, u32),
        stride: (u32, u32),
        same: bool,
    ) -> Option<Geom> {
        let padding = if same { Padding::Same } else { Padding::Valid };
        // along one axis of `len`: the outputs and the padding before them
        let axis = |len: u32, window: u32, dil: u32, stride: u32| {
            let (len, eff, stride) = (
                len as usize,
                ((window - 1) * dil + 1) as usize,
                stride as usize,
            );
            let out = window_out(len, eff, stride, padding).filter(|&o| o > 0)?;
            Some((
                out as u32,
                window_pad(len, out, eff, stride, padding) as u32,
            ))
        };
        let (ho, pt) = axis(h, r, dil.0, stride.0)?;
        let (wo, pl) = axis(w, s, dil.1, stride.1)?;
        Some(Geom {
            h,
            w,
            r,
            s,
            dil,
            stride,
            pad: (pt, pl),
            ho,
            wo,
        })
    }

    /// The stride-1 outputs a PE computes: from the first strided output to the last.
    pub fn h1(&self) -> u32 {
        (self.ho - 1) * self.stride.0 + 1
    }
    pub fn w1(&self) -> u32 {
        (self.wo - 1) * self.stride.1 + 1
    }

    /// The padded input plane's rows and pitch (also the output planes' pitch): what
    /// the outputs read, and room for the whole input at its padding.
    pub fn hp(&self) -> u32 {
        (self.h1() + (self.r - 1) * self.dil.0).max(self.pad.0 + self.h)
    }
    pub fn wp(&self) -> u32 {
        (self.w1() + (self.s - 1) * self.dil.1).max(self.pad.1 + self.w)
    }

    /// The words an output plane spans at pitch `wp`: one vector operation's length.
    pub fn span(&self) -> u32 {
        (self.h1() - 1) * self.wp() + self.w1()
    }
}

impl Shape {
    /// A sample's elements per input group (feature or channel), and per output group.
    pub fn per_in(&self) -> u32 {
        match self {
            Shape::Matmul | Shape::Gather { .. } => 1,
            Shape::Planar { hw } => *hw,
            Shape::Conv(g) => g.h * g.w,
        }
    }
    pub fn per_out(&self) -> u32 {
        match self {
            Shape::Conv(g) => g.ho * g.wo,
            Shape::Gather { t } => *t,
            _ => 1,
        }
    }
}

/// The layer's sizes, the samples of a step, and what it computes besides the forward
/// pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    pub k: u32,
    pub n: u32,
    pub shape: Shape,
    pub batch: u32,
    /// The samples between a forward and its backward (`pipeline.rs`): its stash's
    /// slots when it trains; and the samples of output gradients its FIFO holds.
    pub window: u32,
    pub fifo: u32,
    /// Whether it trains: the backward pass, the weight gradient and the update.
    pub train: bool,
    /// Whether it sends the input gradient back (not for a first layer).
    pub dx: bool,
    /// The tensors' names: the weight, then its optimiser slots (the update's
    /// variables, in order); the weight gradient; the host's values the update reads.
    pub vars: Vec<String>,
    pub grad: String,
    pub hosts: Vec<String>,
    pub update: Update,
    /// Further products summed into the outputs (`x W + h U`): each a layer of the
    /// same outputs over its own inputs, weight and update, whose columns lie east of
    /// this one's (after each other) in the rows' chains. They send no input gradient.
    pub more: Vec<Dense>,
    /// Whether it carries its input past itself (a residual, `form::Carry`), and how
    /// their gradient comes back: row `j` sends input features `split(k, h, j)` after
    /// its outputs, each PE adding in those of its column's; and takes their gradient,
    /// each PE adding those of its column's into its partial input gradient.
    pub carry: Option<Back>,
    /// The width of a value it passes on for a skip of several kernels (its input is
    /// another: `form::Formed::passed`; 0: none), carried as its input is: column `i`
    /// takes its share `split(pass, w, i)` after its inputs, row `j` sends
    /// `split(pass, h, j)` after its outputs, and the value's gradient goes back after
    /// each column's input gradient.
    pub pass: u32,
    /// Whether it is a side part (`form::Part::side`), and how its outputs' gradient
    /// comes back: its outputs travel in the rows' chains after the layer's (and a
    /// residual's), not summed into them; so do their gradients, after the layer's
    /// output gradient, unless they are the layer's (`Back::Same`: the two summed).
    pub side: Option<Back>,
    /// Whether, a side part, it adds its outputs into those of the side part before it
    /// (a side layer of several products: `form::Part::joined`).
    pub joined: bool,
}

/// Where a PE's values lie in its row's chain: the chain's words forward, and where
/// this PE's outputs go in them; the row's output gradient's words, and where this
/// PE's part of it is. A row carries the layer's outputs (those of its summed parts
/// too), then its carried inputs (a residual's), then each side part's outputs; its
/// output gradient the layer's, then the residual's (when it comes beside), then each
/// side part's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Row {
    pub len: u32,
    pub at: u32,
    pub back_len: u32,
    pub back_at: u32,
    /// The layer's own columns (a value it passes on comes over them, not its further
    /// parts').
    pub cols: u32,
}

/// How a layer that carries its input gets that input's gradient back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Back {
    /// Not at all (the layer sends no input gradient).
    Not,
    /// After its output gradient, in the same stream.
    Beside,
    /// As its output gradient (a residual's branch that passes gradients unchanged
    /// from its sum to the layer's outputs: `h + h W`, its sum's gradient both).
    Same,
}

/// The colours a dense kernel uses: its streams (inputs in, outputs out, output
/// gradients in, input gradients out) and the two pairs its chains alternate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Colours {
    pub x: Colour,
    pub y: Colour,
    pub dy: Colour,
    pub dx: Colour,
    pub chain: [Colour; 2],
    pub dchain: [Colour; 2],
}

impl Colours {
    /// A layer's colours for its streams; its chains take the four below them
    /// (`place::CHAIN_COLOURS`).
    pub const fn with_streams(x: Colour, y: Colour, dy: Colour, dx: Colour) -> Colours {
        Colours {
            x,
            y,
            dy,
            dx,
            chain: [0, 1],
            dchain: [2, 3],
        }
    }

    /// Row `j`'s colours when rows after the first send their outputs and take their
    /// output gradients on colours of their own (`fan[j - 1]`: a layer whose rows a
    /// one-lane kernel's dealer gathers, `place/colour.rs`).
    pub fn row(self, j: u32, fan: &[(Colour, Colour)]) -> Colours {
        match j.checked_sub(1).and_then(|l| fan.get(l as usize)) {
            Some(&(y, dy)) => Colours { y, dy, ..self },
            None => self,
        }
    }

    /// Column `i` of `wc`'s link in the forward chain: the colour it sends its partial
    /// sums on (the outputs' at the east end), and the one it receives them on (none at
    /// the west end).
    fn forward_link(&self, i: u32, wc: u32) -> (Colour, Option<Colour>) {
        let send = if i + 1 == wc {
            self.y
        } else {
            self.chain[(i % 2) as usize]
        };
        (send, i.checked_sub(1).map(|p| self.chain[(p % 2) as usize]))
    }

    /// Row `j` of `hr`'s link in the input gradients' chain, south to north: the colour
    /// it sends on (the input gradients' at the north end), and the one it receives on
    /// (none at the south end).
    fn backward_link(&self, j: u32, hr: u32) -> (Colour, Option<Colour>) {
        let send = if j == 0 {
            self.dx
        } else {
            self.dchain[(j % 2) as usize]
        };
        (
            send,
            (j + 1 < hr).then(|| self.dchain[((j + 1) % 2) as usize]),
        )
    }
}

/// The next wavelets on `colour` into the words `dst` describes.
fn receive(dst: Dsd, colour: Colour) -> Instr {
    let len = dst.len();
    Instr::Vec {
        op: VecOp::Mov,
        dst,
        srcs: vec![Src::V(Dsd::In { colour, len })],
    }
}

/// `len` words at `acc` set to zero.
fn zero(acc: u32, len: u32) -> Instr {
    Instr::Vec {
        op: VecOp::Mov,
        dst: Dsd::mem(acc, len),
        srcs: vec![Src::Imm(0.0)],
    }
}

/// `acc[..len] = sum of w * x` over `count` iterations of a loop whose counter moves
/// the descriptors `w` and `x` by their steps (a product's partial sums, one input at
/// a time): the first a multiply, the others one multi-dimensional multiply-add, so
/// that `acc` need not be zeroed first.
fn products(acc: u32, len: u32, count: u32, w: Dsd, x: Dsd) -> Vec<Instr> {
    let a = Dsd::mem(acc, len);
    // a descriptor moved on by `n` iterations of its loop, in the loop or (`inside`
    // false) outside it
    let moved = |d: &Dsd, n: i32, inside: bool| {
        let mut d = d.clone();
        if let Dsd::Mem { base, step, .. } = &mut d {
            *base = base.wrapping_add_signed(n * step.first().copied().unwrap_or(0));
            if !inside {
                step.clear();
            }
        }
        d
    };
    let mut out = vec![Instr::Vec {
        op: VecOp::Mul,
        dst: a,
        srcs: vec![Src::V(moved(&w, 0, false)), Src::V(moved(&x, 0, false))],
    }];
    if count > 1 {
        out.push(macs(
            acc,
            len,
            count - 1,
            moved(&w, 1, true),
            moved(&x, 1, true),
        ));
    }
    out
}

/// `acc[..len] += w * x` over `count` iterations of a loop whose counter moves the
/// descriptors `w` and `x` (a product's partial sums, one input at a time).
fn macs(acc: u32, len: u32, count: u32, w: Dsd, x: Dsd) -> Instr {
    let a = Dsd::mem(acc, len);
    Instr::Loop {
        count,
        body: vec![Instr::Vec {
            op: VecOp::Fmac,
            dst: a.clone(),
            srcs: vec![Src::V(a), Src::V(w), Src::V(x)],
        }],
    }
}

/// `dst += a * b` (element by element, `dst` and `a`/`b` as given) in the loops of a
/// convolution's taps: filter row, filter column, input channel, output channel.
fn taps(loops: [u32; 4], dst: Dsd, a: Dsd, b: Dsd) -> Instr {
    nest(
        &loops,
        Instr::Vec {
            op: VecOp::Fmac,
            dst: dst.clone(),
            srcs: vec![Src::V(dst), Src::V(a), Src::V(b)],
        },
    )
}

/// A chain's link: rows of `len` partial sums `stride` apart, plus those received on
/// `recv` if any, sent on `send`; `loops` nest the rows (their counts, and how far each
/// moves the row from `part`; one row at `part` without loops).
fn link(
    part: u32,
    (len, stride): (u32, u32),
    loops: &[(u32, u32)],
    send: Colour,
    recv: Option<Colour>,
) -> Instr {
    let dst = Dsd::Out { colour: send, len };
    let steps: Vec<u32> = loops.iter().map(|l| l.1).collect();
    let mine = Src::V(Dsd::strided(part, len, stride as i32, &steps, None));
    let v = match recv {
        None => Instr::Vec {
            op: VecOp::Mov,
            dst,
            srcs: vec![mine],
        },
        Some(colour) => Instr::Vec {
            op: VecOp::Add,
            dst,
            srcs: vec![mine, Src::V(Dsd::In { colour, len })],
        },
    };
    nest(&loops.iter().map(|l| l.0).collect::<Vec<_>>(), v)
}

impl Dense {
    /// A forward-only layer (eval, predict, tests).
    pub fn forward_only(k: u32, n: u32, batch: u32) -> Dense {
        Dense {
            k,
            n,
            shape: Shape::Matmul,
            batch,
            window: batch,
            fifo: 0,
            train: false,
            dx: false,
            vars: vec!["W".into()],
            grad: "dW".into(),
            hosts: Vec::new(),
            update: Update::default(),
            more: Vec::new(),
            carry: None,
            pass: 0,
            side: None,
            joined: false,
        }
    }

    /// This layer (and its further parts) with window and FIFO `(window, fifo)`.
    pub fn scheduled(&self, (window, fifo): (u32, u32)) -> Dense {
        let mut d = self.clone();
        (d.window, d.fifo) = (window, fifo);
        for p in &mut d.more {
            (p.window, p.fifo) = (window, fifo);
        }
        d
    }

    /// The columns and rows of a `w x h` frame that hold a block (each part gets
    /// `ceil(k / w)` inputs, so fewer columns may do).
    pub fn used(&self, w: u32, h: u32) -> (u32, u32) {
        (used(self.k, w), used(self.n, h))
    }

    /// The width of what it carries past itself: its input, or the value it passes on.
    fn carried(&self) -> u32 {
        if self.pass > 0 {
            self.pass
        } else {
            self.k
        }
    }

    /// Row `j` of `hr` as part `part` of this layer sees it (`None`: the layer's own
    /// columns; `Some(p)`: its further part `p`).
    pub fn row(&self, j: u32, (cols, hr): (u32, u32), part: Option<usize>) -> Row {
        let own = split(self.n, hr, j).len() as u32;
        let carried = match self.carry {
            Some(_) => split(self.carried(), hr, j).len() as u32,
            None => 0,
        };
        let back = if self.carry == Some(Back::Beside) {
            carried
        } else {
            0
        };
        let (mut len, mut back_len) = (own + carried, own + back);
        let (mut at, mut back_at) = (0, 0);
        // where the last side part's outputs lie (a joined part's add into them)
        let mut last = (0, 0);
        for (p, d) in self.more.iter().enumerate() {
            let Some(back) = d.side else {
                continue;
            };
            if !d.joined {
                last = (len, if back == Back::Beside { back_len } else { 0 });
            }
            if part == Some(p) {
                (at, back_at) = last;
            }
            if d.joined {
                continue;
            }
            let n = split(d.n, hr, j).len() as u32;
            len += n;
            if back == Back::Beside {
                back_len += n;
            }
        }
        Row {
            len,
            at,
            back_len,
            back_at,
            cols,
        }
    }

    /// The rows of `W` (seen as `[rows, n]`) that a column with input groups `ks`
    /// holds, in the order of its block: its features; its channels' pixels in NHWC
    /// order; or its filter taps (row, column), then its channels.
    fn rows(&self, ks: &std::ops::Range<u32>) -> Vec<u32> {
        match self.shape {
            Shape::Matmul | Shape::Gather { .. } => ks.clone().collect(),
            Shape::Planar { hw } => ks
                .clone()
                .flat_map(|c| (0..hw).map(move |p| p * self.k + c))
                .collect(),
            Shape::Conv(g) => (0..g.r * g.s)
                .flat_map(|t| ks.clone().map(move |c| t * self.k + c))
                .collect(),
        }
    }

    /// Lays the layer out on a `w x h` frame at `origin`, oriented `o`. Column `i`
    /// takes input groups `split(k, w, i)`; row `j` gives output groups
    /// `split(n, h, j)`, one sample after another.
    pub fn lay(
        &self,
        origin: (u32, u32),
        o: Orient,
        (w, h): (u32, u32),
        c: Colours,
    ) -> Result<Laid, String> {
        self.lay_parts(origin, o, (w, h), &[], c, &[])
    }

    /// `lay` with the further parts (`more`) on `lanes` columns each, their inputs
    /// arriving on the colours beside them: `(lanes, colour)` a part; and rows after
    /// the first on the output and output-gradient colours `fan` gives them
    /// (`Colours::row`).
    pub fn lay_parts(
        &self,
        origin: (u32, u32),
        o: Orient,
        (w, h): (u32, u32),
        more: &[(u32, Colour)],
        c: Colours,
        fan: &[(Colour, Colour)],
    ) -> Result<Laid, String> {
        if more.len() != self.more.len() {
            return Err(format!(
                "a layer of {} further parts laid out with lanes for {}",
                self.more.len(),
                more.len()
            ));
        }
        let (wc, hr) = self.used(w, h);
        // each part: its layer, its first column, its columns, its colours
        let mut parts = vec![(self, None, 0, wc, c)];
        let mut all = wc;
        for (p, (d, &(lanes, x))) in self.more.iter().zip(more).enumerate() {
            let cols = used(d.k, lanes);
            parts.push((d, Some(p), all, cols, Colours { x, ..c }));
            all += cols;
        }
        let mut laid = Laid::default();
        for (d, part, first, cols, c) in parts {
            for i in 0..cols {
                let ks = split(d.k, cols, i);
                let col = first + i;
                for j in 0..hr {
                    let c = c.row(j, fan);
                    // a side part's own outputs; the others', the layer's
                    let ns = split(if d.side.is_some() { d.n } else { self.n }, hr, j);
                    let at = o.at(origin, col, j);
                    let row = self.row(j, (wc, hr), part);
                    let p = d.program(col, j, (all, hr), c, &mut laid, at, (&ks, &ns), row)?;
                    let words = p.words() as usize;
                    laid.pes.insert(at, (Arc::new(p), vec![0.0; words]));
                    d.routes(col, j, (all, hr), c, o, at, &mut laid)?;
                }
            }
        }
        Ok(laid)
    }

    /// The program of PE `(i, j)` of a `wc x hr` frame, holding input groups `ks` and
    /// output groups `ns` (the tensors it holds added to `laid`, at PE `at`).
    #[allow(clippy::too_many_arguments)]
    pub fn program(
        &self,
        i: u32,
        j: u32,
        (wc, hr): (u32, u32),
        c: Colours,
        laid: &mut Laid,
        at: (u32, u32),
        (ks, ns): (&std::ops::Range<u32>, &std::ops::Range<u32>),
        row: Row,
    ) -> Result<Program, String> {
        let mut p = Program::default();
        let b = ns.len() as u32;
        let rows = self.rows(ks);
        let block: Vec<(u32, u32)> = rows.iter().map(|&r| (r * self.n + ns.start, b)).collect();
        let size = rows.len() as u32 * b;
        let piece = |laid: &mut Laid, name: &str, word: u32, runs: Vec<(u32, u32)>| {
            laid.tensors
                .entry(name.to_string())
                .or_default()
                .push(Piece { pe: at, word, runs });
        };
        let nvars = if self.train { self.vars.len() } else { 1 };
        // the weight first
        let w = p.words();
        let mut vars = Vec::new();
        for name in &self.vars[..nvars] {
            let base = p.alloc(name, size);
            piece(laid, name, base, block.clone());
            vars.push(Val::buf(base, size));
        }
        let mut hosts = Vec::new();
        let dw = if self.train {
            let base = p.alloc(&self.grad, size);
            piece(laid, &self.grad, base, block.clone());
            for name in &self.hosts {
                let base = p.alloc(name, 1);
                piece(laid, name, base, vec![(0, 1)]);
                hosts.push(Val::buf(base, 1));
            }
            Some(base)
        } else {
            None
        };
        let links = Links {
            fwd: c.forward_link(i, wc),
            bwd: c.backward_link(j, hr),
        };
        let a = ks.len() as u32;
        let carry = if let Some(back) = self.carry {
            if self.shape != Shape::Matmul {
                return Err(
                    "a residual around a convolution or an embedding has no wafer kernel yet"
                        .into(),
                );
            }
            if back == Back::Same && self.carried() != self.n {
                return Err("a residual whose sum has another width than its layer's input".into());
            }
            let rows = split(self.carried(), hr, j);
            // (a value passed on: this column's share of it, after its inputs)
            let ks = match self.pass {
                0 => ks.clone(),
                pass => split(pass, row.cols, i),
            };
            let (lo, hi) = (ks.start.max(rows.start), ks.end.min(rows.end));
            Carrying {
                mine: hi.saturating_sub(lo),
                at: lo.saturating_sub(ks.start),
                to: lo.saturating_sub(rows.start),
                pass: if self.pass > 0 { ks.len() as u32 } else { 0 },
            }
        } else {
            Carrying::default()
        };
        let plain = Row {
            len: b,
            at: 0,
            back_len: b,
            back_at: 0,
            cols: row.cols,
        };
        // (an embedding of one id a sample may share its row's chain: a side part, or a
        // layer with side parts)
        let shares = matches!(self.shape, Shape::Matmul | Shape::Gather { t: 1 });
        if row != plain
            && (!shares || carry.mine > 0 || carry.pass > 0)
            && self.shape != Shape::Matmul
        {
            return Err("a side part or a residual of a convolution or an embedding of several ids has no wafer kernel yet".into());
        }
        let blk = Block {
            w,
            dw,
            c,
            links,
            carry,
            row,
        };
        let (fwd, bwd) = match self.shape {
            Shape::Conv(g) => self.conv(&mut p, g, (a, b), blk),
            Shape::Gather { t } => self.gather(&mut p, (t, ks.start), (a, b), blk),
            _ => self.gemv(&mut p, a * self.shape.per_in(), b, blk),
        };
        let kind = match self.shape {
            Shape::Conv(_) => "conv",
            Shape::Gather { .. } => "embedding",
            _ => "dense",
        };
        p.tasks.push(Task {
            id: 0,
            name: format!("{kind} forward"),
            trigger: Trigger::Data(c.x),
            body: fwd,
        });
        let Some(dw) = dw else {
            return Ok(p);
        };
        p.tasks.push(Task {
            id: 1,
            name: format!("{kind} backward"),
            trigger: Trigger::Data(c.dy),
            body: bwd,
        });
        p.pipeline = Some(Pipeline {
            forward: 0,
            backward: vec![1],
            window: self.window,
            samples: self.batch,
        });
        // the update, over the blocks
        let mut scratch = Scratch::new(p.words());
        let body = self
            .update
            .code(&vars, &[Val::buf(dw, size)], &hosts, size, &mut scratch)?;
        if scratch.high > 0 {
            p.alloc("scratch", scratch.high);
        }
        p.tasks.push(Task {
            id: UPDATE,
            name: format!("{kind} update"),
            trigger: Trigger::Local { at_start: false },
            body,
        });
        // room for the output gradients that come while it runs forwards
        let words = p.receives(1, c.dy) as u32;
        p.fifo(c.dy, self.fifo * words);
        Ok(p)
    }

    /// The slot counter `k`'s stash descriptor offset for slots of `len` words (none
    /// when the layer does not train: one slot).
    fn by(&self, k: u8, len: u32) -> Option<(u8, i32)> {
        self.train.then_some((k, len as i32))
    }

    /// A product's forward and backward bodies on a PE with `a` inputs and `b` outputs.
    fn gemv(
        &self,
        p: &mut Program,
        a: u32,
        b: u32,
        Block {
            w,
            dw,
            c,
            links,
            carry,
            row,
        }: Block,
    ) -> (Vec<Instr>, Vec<Instr>) {
        let (xs, take) = self.stash(p, "x stash", a, c.x);
        // the row's chain: this PE's outputs at `row.at` (see `Row`)
        let chain = p.alloc("y", row.len);
        let y = chain + row.at;
        let (wy, xy) = (
            Dsd::strided(w, b, 1, &[b], None),
            Dsd::strided(xs, b, 0, &[1], self.by(0, a)),
        );
        let mut fwd = vec![take];
        // a value passed on comes after the inputs (one sample's, not stashed)
        let carried = if carry.pass > 0 {
            let buf = p.alloc("passed", carry.pass);
            fwd.push(receive(Dsd::mem(buf, carry.pass), c.x));
            Dsd::mem(buf + carry.at, carry.mine)
        } else {
            Dsd::strided(xs + carry.at, carry.mine, 1, &[], self.by(0, a))
        };
        if row.len == b && a > 0 {
            // the row is this layer's outputs alone: no zeros needed around them
            fwd.extend(products(y, b, a, wy, xy));
        } else {
            fwd.push(zero(chain, row.len));
            fwd.push(macs(y, b, a, wy, xy));
        }
        if carry.mine > 0 {
            fwd.push(Instr::Vec {
                op: VecOp::Mov,
                dst: Dsd::mem(y + b + carry.to, carry.mine),
                srcs: vec![Src::V(carried)],
            });
        }
        let (send, recv) = links.fwd;
        fwd.push(link(chain, (row.len, 1), &[], send, recv));
        if self.train {
            fwd.push(self.count(0));
        }
        let Some(dw) = dw else {
            return (fwd, Vec::new());
        };
        // the row's output gradient: this PE's at `row.back_at`, a residual's after
        // the layer's
        // where row `j`'s carried features' gradient is in `dy`
        let skip = match self.carry {
            Some(Back::Beside) => Some(b),
            Some(Back::Same) => Some(0),
            _ => None,
        };
        let grads = p.alloc("dy", row.back_len);
        let dy = grads + row.back_at;
        let mut bwd = vec![receive(Dsd::mem(grads, row.back_len), c.dy)];
        if self.dx {
            // (a value passed on: its gradient after the input gradient, each row's
            // share from this PE, zeros elsewhere, summed along the column)
            let pass = if skip.is_some() { carry.pass } else { 0 };
            let dxp = p.alloc("dx", a + pass);
            let (wt, dyt) = (
                Dsd::strided(w, a, b as i32, &[1], None),
                Dsd::strided(dy, a, 0, &[1], None),
            );
            if b > 0 {
                bwd.extend(products(dxp, a, b, wt, dyt));
            } else {
                bwd.push(zero(dxp, a));
            }
            if pass > 0 {
                bwd.push(zero(dxp + a, pass));
            }
            if let (Some(at), true) = (skip, carry.mine > 0) {
                let into = if carry.pass > 0 { dxp + a } else { dxp };
                let part = Dsd::mem(into + carry.at, carry.mine);
                bwd.push(Instr::Vec {
                    op: VecOp::Add,
                    dst: part.clone(),
                    srcs: vec![
                        Src::V(part),
                        Src::V(Dsd::mem(dy + at + carry.to, carry.mine)),
                    ],
                });
            }
            let (send, recv) = links.bwd;
            bwd.push(link(dxp, (a + pass, 1), &[], send, recv));
        }
        let g = Dsd::strided(dw, b, 1, &[b], None);
        bwd.push(Instr::Loop {
            count: a,
            body: vec![Instr::Vec {
                op: VecOp::Fmac,
                dst: g.clone(),
                srcs: vec![
                    Src::V(g),
                    Src::V(Dsd::mem(dy, b)),
                    Src::V(Dsd::strided(xs, b, 0, &[1], self.by(1, a))),
                ],
            }],
        });
        bwd.push(self.count(1));
        (fwd, bwd)
    }

    /// A convolution's forward and backward bodies on a PE with `a` input channels and
    /// `b` output channels (filter block as `[r][s][a][b]`).
    fn conv(
        &self,
        p: &mut Program,
        g: Geom,
        (a, b): (u32, u32),
        Block {
            w, dw, c, links, ..
        }: Block,
    ) -> (Vec<Instr>, Vec<Instr>) {
        let (hp, wp, span) = (g.hp(), g.wp(), g.span());
        let (plane_in, plane_pad, plane_out) = (g.h * g.w, hp * wp, g.h1() * wp);
        // an output row's strided outputs, and the rows' distance, in the planes
        let (sw, row) = (g.stride.1, g.stride.0 * wp);
        let (xs, take) = self.stash(p, "x stash", a * plane_in, c.x);
        // the padded input (its border stays zero), also the input gradient's planes
        let xp = p.alloc("padded x", a * plane_pad);
        // the output planes at pitch wp, also the output gradient's
        let y = p.alloc("y", b * plane_out);
        let inner = g.pad.0 * wp + g.pad.1;
        // the stashed slot's channels into the padded planes' interiors
        let pad = |k: u8| {
            nest(
                &[a, g.h],
                Instr::Vec {
                    op: VecOp::Mov,
                    dst: Dsd::strided(xp + inner, g.w, 1, &[plane_pad, wp], None),
                    srcs: vec![Src::V(Dsd::strided(
                        xs,
                        g.w,
                        1,
                        &[plane_in, g.w],
                        self.by(k, a * plane_in),
                    ))],
                },
            )
        };
        let tap_loops = [g.r, g.s, a, b];
        let wt = Dsd::strided(w, span, 0, &[g.s * a * b, a * b, b, 1], None);
        let xin = Dsd::strided(xp, span, 1, &[g.dil.0 * wp, g.dil.1, plane_pad, 0], None);
        let yout = Dsd::strided(y, span, 1, &[0, 0, 0, plane_out], None);
        let mut fwd = vec![
            take,
            pad(0),
            zero(y, b * plane_out),
            taps(tap_loops, yout.clone(), wt.clone(), xin.clone()),
        ];
        let (send, recv) = links.fwd;
        fwd.push(link(
            y,
            (g.wo, sw),
            &[(b, plane_out), (g.ho, row)],
            send,
            recv,
        ));
        if self.train {
            fwd.push(self.count(0));
        }
        let Some(dw) = dw else {
            return (fwd, Vec::new());
        };
        // the output gradient into the output planes (the words past each row zero)
        let mut bwd = vec![
            zero(y, b * plane_out),
            nest(
                &[b, g.ho],
                receive(
                    Dsd::strided(y, g.wo, sw as i32, &[plane_out, row], None),
                    c.dy,
                ),
            ),
        ];
        if self.dx {
            // the input gradient: each output's gradient back through every tap
            bwd.push(zero(xp, a * plane_pad));
            bwd.push(taps(tap_loops, xin.clone(), wt, yout.clone()));
            let (send, recv) = links.bwd;
            bwd.push(link(
                xp + inner,
                (g.w, 1),
                &[(a, plane_pad), (g.h, wp)],
                send,
                recv,
            ));
            bwd.push(zero(xp, a * plane_pad));
        }
        // the filter's gradient: per tap, the dot product of the shifted input and the
        // output gradient
        bwd.push(pad(1));
        let acc = Dsd::strided(dw, span, 0, &[g.s * a * b, a * b, b, 1], None);
        bwd.push(taps(tap_loops, acc, xin, yout));
        bwd.push(self.count(1));
        (fwd, bwd)
    }

    /// An embedding's forward and backward bodies on a PE holding rows `lo..lo + a` of
    /// the table (`b` of its columns), for `t` ids a sample. Every column receives a
    /// sample's ids and stashes them; for each id, the PE whose rows hold it puts its
    /// row's part into the chain of partial sums (the others zeros), and the backward
    /// pass adds the row's gradient into that row. With one id a sample its part may
    /// lie among others in its row's chain (`Row`: a side part's, or a layer's with
    /// side parts).
    fn gather(
        &self,
        p: &mut Program,
        (t, lo): (u32, u32),
        (a, b): (u32, u32),
        Block {
            w,
            dw,
            c,
            links,
            row: place,
            ..
        }: Block,
    ) -> (Vec<Instr>, Vec<Instr>) {
        let (ids, take) = self.stash(p, "ids stash", t, c.x);
        // per id: its row in this PE's block (clamped into it), and whether it is here
        let row = p.alloc("row", t);
        let here = p.alloc("here", t);
        let below = p.alloc("below", t);
        // the chain's words, and where this PE's outputs lie in them (and in the output
        // gradient's)
        let ((len, at), (back_len, back_at)) = match t {
            1 => ((place.len, place.at), (place.back_len, place.back_at)),
            _ => ((t * b, 0), (t * b, 0)),
        };
        let chain = p.alloc("y", len);
        let y = chain + at;
        let v = |base: u32| Src::V(Dsd::mem(base, t));
        let op = |op: VecOp, dst: u32, srcs: Vec<Src>| Instr::Vec {
            op,
            dst: Dsd::mem(dst, t),
            srcs,
        };
        // from the stashed ids of the slot of counter `k`
        let rows = |k: u8| {
            let slot = Src::V(Dsd::strided(ids, t, 1, &[], self.by(k, t)));
            vec![
                op(VecOp::Sub, row, vec![slot, Src::Imm(lo as f32)]),
                op(VecOp::Ge, here, vec![v(row), Src::Imm(0.0)]),
                op(VecOp::Lt, below, vec![v(row), Src::Imm(a as f32)]),
                op(VecOp::Sel, here, vec![v(here), v(below), Src::Imm(0.0)]),
                op(VecOp::Max, row, vec![v(row), Src::Imm(0.0)]),
                op(VecOp::Min, row, vec![v(row), Src::Imm(a as f32 - 1.0)]),
            ]
        };
        // each id's flag, spread over a row's `b` words; each id's row of `y`
        let flag = Src::V(Dsd::strided(here, b, 0, &[1], None));
        let yt = Dsd::strided(y, b, 1, &[b], None);
        let mut fwd = vec![take];
        fwd.extend(rows(0));
        if len != t * b {
            fwd.push(zero(chain, len));
        }
        fwd.push(Instr::Loop {
            count: t,
            body: vec![Instr::Vec {
                op: VecOp::Sel,
                dst: yt.clone(),
                srcs: vec![
                    flag.clone(),
                    Src::V(Dsd::indexed(w, b, row, &[1], b)),
                    Src::Imm(0.0),
                ],
            }],
        });
        let (send, recv) = links.fwd;
        let chained = match t {
            1 => link(chain, (len, 1), &[], send, recv),
            _ => link(y, (b, 1), &[(t, b)], send, recv),
        };
        fwd.push(chained);
        if self.train {
            fwd.push(self.count(0));
        }
        let Some(dw) = dw else {
            return (fwd, Vec::new());
        };
        // the output gradients, each id's (or zeros) added into its row
        let grads = p.alloc("dy", back_len);
        let yt = Dsd::strided(grads + back_at, b, 1, &[b], None);
        let mut bwd = vec![receive(Dsd::mem(grads, back_len), c.dy)];
        bwd.extend(rows(1));
        let g = Dsd::indexed(dw, b, row, &[1], b);
        bwd.push(Instr::Loop {
            count: t,
            body: vec![
                Instr::Vec {
                    op: VecOp::Sel,
                    dst: yt.clone(),
                    srcs: vec![flag, Src::V(yt.clone()), Src::Imm(0.0)],
                },
                Instr::Vec {
                    op: VecOp::Add,
                    dst: g.clone(),
                    srcs: vec![Src::V(g), Src::V(yt)],
                },
            ],
        });
        bwd.push(self.count(1));
        (fwd, bwd)
    }

    /// A stash of `len` words a slot (a slot per sample of its window when the layer
    /// trains, else one) named `name`, and the instruction that receives a sample's
    /// `len` inputs on `colour` into its slot (counter 0's).
    fn stash(&self, p: &mut Program, name: &str, len: u32, colour: Colour) -> (u32, Instr) {
        let slots = if self.train { self.window } else { 1 };
        let base = p.alloc(name, slots * len);
        let dst = Dsd::strided(base, len, 1, &[], self.by(0, len));
        (base, receive(dst, colour))
    }

    /// The count of counter `k` (0 forward, 1 backward) that moves the stash's slot.
    fn count(&self, k: u8) -> Instr {
        Instr::Count {
            counter: k,
            every: self.window,
            then: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn routes(
        &self,
        i: u32,
        j: u32,
        (wc, hr): (u32, u32),
        c: Colours,
        o: Orient,
        at: (u32, u32),
        laid: &mut Laid,
    ) -> Result<(), String> {
        // the inputs come down the column
        let down: &[Dir] = if j + 1 < hr {
            &[Dir::Ramp, Dir::S]
        } else {
            &[Dir::Ramp]
        };
        laid.route(at, c.x, o.route(Dir::N, down))?;
        // the partial sums go east, the last ones out
        let (send, recv) = c.forward_link(i, wc);
        laid.route(at, send, o.route(Dir::Ramp, &[Dir::E]))?;
        if let Some(r) = recv {
            laid.route(at, r, o.route(Dir::W, &[Dir::Ramp]))?;
        }
        if !self.train {
            return Ok(());
        }
        // the output gradients come west along the row
        let west: &[Dir] = if i > 0 {
            &[Dir::Ramp, Dir::W]
        } else {
            &[Dir::Ramp]
        };
        laid.route(at, c.dy, o.route(Dir::E, west))?;
        if self.dx {
            // the input gradients' partial sums go north, the last ones out
            let (send, recv) = c.backward_link(j, hr);
            laid.route(at, send, o.route(Dir::Ramp, &[Dir::N]))?;
            if let Some(r) = recv {
                laid.route(at, r, o.route(Dir::S, &[Dir::Ramp]))?;
            }
        }
        Ok(())
    }
}

/// What a PE's bodies work on: its weight block (at `w`) and that block's gradient (at
/// `dw`, when it trains), its colours and its links in the chains.
#[derive(Debug, Clone, Copy)]
struct Block {
    w: u32,
    dw: Option<u32>,
    c: Colours,
    links: Links,
    carry: Carrying,
    row: Row,
}

/// What a PE of a layer that carries its input adds to its row's chain: of its row's
/// carried features, its column's (`mine`: from input `at` of its column, to place `to`
/// of its row's, after the layer's outputs); `pass`, its column's share of a value it
/// passes on (then `at` is in that share). Nothing for another layer.
#[derive(Debug, Clone, Copy, Default)]
struct Carrying {
    mine: u32,
    at: u32,
    to: u32,
    pass: u32,
}

/// A PE's links in the forward chain and in the input gradients' chain: the colours it
/// sends on and receives on.
#[derive(Debug, Clone, Copy)]
struct Links {
    fwd: (Colour, Option<Colour>),
    bwd: (Colour, Option<Colour>),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::wafer::fabric::Fabric;
    use crate::backend::wafer::kernels::{gather, scatter};
    use crate::backend::wafer::lower::{Operand, UpdateOp};
    use crate::backend::wafer::sim::{HostIn, Setup, Sim};
    use crate::ir::{BinaryOp, DType, Op};
    use proptest::prelude::*;

    const C: Colours = Colours::with_streams(4, 5, 6, 7);

    /// SGD: `W - lr * dW`, lr the host's value 0.
    fn sgd() -> Update {
        let op = |op, args: Vec<Operand>, full| UpdateOp {
            op,
            args,
            full,
            types: (DType::F32, DType::F32),
        };
        Update {
            ops: vec![
                op(
                    Op::Binary(BinaryOp::Mul),
                    vec![Operand::Acc(0), Operand::Host(0)],
                    true,
                ),
                op(
                    Op::Binary(BinaryOp::Sub),
                    vec![Operand::Var(0), Operand::Val(0)],
                    true,
                ),
            ],
            commits: vec![(0, Operand::Val(1))],
        }
    }

    struct Run {
        y: Vec<f32>,
        dx: Vec<f32>,
        dw: Vec<f32>,
        w: Vec<f32>,
        /// The cycle the forward pass ended.
        forward: u64,
    }

    /// Runs `d` on a `w x h` frame against the fabric's edges (oriented `o`): the
    /// forward pass over the samples `x` (training: and the backward pass over `dy`, in
    /// the pipeline's order), then the update with learning rate `lr`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        d: &Dense,
        o: Orient,
        (w, h): (u32, u32),
        x: &[f32],
        dy: &[f32],
        weights: &[f32],
        lr: f32,
    ) -> Run {
        let f = Fabric::named("test32").unwrap();
        let (wc, hr) = d.used(w, h);
        // a sample's inputs and outputs, and each lane's
        let (pi, po) = (d.shape.per_in(), d.shape.per_out());
        let (kk, nn) = (d.k * pi, d.n * po);
        let scaled = |r: std::ops::Range<u32>, by: u32| r.start * by..r.end * by;
        // each column's inputs of a sample: its groups, or an embedding's every id
        let column = |i: u32| match d.shape {
            Shape::Gather { t } => 0..t,
            _ => scaled(split(d.k, wc, i), pi),
        };
        let kk = match d.shape {
            Shape::Gather { t } => t,
            _ => kk,
        };
        let (fw, fh) = o.size(wc, hr);
        // inputs at the fabric's edge, outputs off the opposite one
        let origin = match o {
            Orient::North => (f.width - fw, 0),
            Orient::West => (0, f.height - fh),
        };
        let laid = d.lay(origin, o, (w, h), C).unwrap();
        let mut setup = Setup {
            pes: laid.pes.clone(),
            routes: laid.routes.clone(),
            inputs: Vec::new(),
        };
        for i in 0..wc {
            let (px, py) = o.at(origin, i, 0);
            setup.inputs.push(HostIn {
                x: px,
                y: py,
                colour: C.x,
                values: vec![],
            });
        }
        if d.train {
            for j in 0..hr {
                let (px, py) = o.at(origin, wc - 1, j);
                setup.inputs.push(HostIn {
                    x: px,
                    y: py,
                    colour: C.dy,
                    values: vec![],
                });
            }
        }
        let mut sim = Sim::new(&f, &setup).unwrap();
        scatter(&laid.tensors["W"], weights, |(x, y), a, v| {
            assert!(sim.write(x, y, a, v))
        });
        if d.train {
            scatter(&laid.tensors["lr"], &[lr], |(x, y), a, v| {
                assert!(sim.write(x, y, a, v))
            });
        }
        for i in 0..wc {
            let ks = column(i);
            let values: Vec<f32> = (0..d.batch)
                .flat_map(|s| ks.clone().map(move |k| x[(s * kk + k) as usize]))
                .collect();
            let (px, py) = o.at(origin, i, 0);
            assert!(sim.feed(px, py, C.x, &values));
        }
        // (training: the output gradients too, which the PEs take in the pipeline's
        // order, a backward after each forward once the window is full)
        for j in 0..hr {
            if !d.train {
                break;
            }
            let ns = scaled(split(d.n, hr, j), po);
            let values: Vec<f32> = (0..d.batch)
                .flat_map(|s| ns.clone().map(move |n| dy[(s * nn + n) as usize]))
                .collect();
            let (px, py) = o.at(origin, wc - 1, j);
            assert!(sim.feed(px, py, C.dy, &values));
        }
        let forward = sim.run().unwrap();
        let mut y = vec![f32::NAN; (d.batch * nn) as usize];
        for j in 0..hr {
            let ns = scaled(split(d.n, hr, j), po);
            let (px, py) = o.at(origin, wc - 1, j);
            let out = sim.output(px, py, o.dir(Dir::E), C.y);
            assert_eq!(out.len() as u32, d.batch * ns.len() as u32);
            for (t, &(_, v)) in out.iter().enumerate() {
                let (s, m) = (t as u32 / ns.len() as u32, t as u32 % ns.len() as u32);
                y[(s * nn + ns.start + m) as usize] = v;
            }
        }
        let mut r = Run {
            y,
            dx: vec![],
            dw: vec![],
            w: vec![],
            forward,
        };
        if !d.train {
            return r;
        }
        if d.dx {
            r.dx = vec![f32::NAN; (d.batch * kk) as usize];
            for i in 0..wc {
                let ks = scaled(split(d.k, wc, i), pi);
                let (px, py) = o.at(origin, i, 0);
                let out = sim.output(px, py, o.dir(Dir::N), C.dx);
                assert_eq!(out.len() as u32, d.batch * ks.len() as u32);
                for (t, &(_, v)) in out.iter().enumerate() {
                    let (s, m) = (t as u32 / ks.len() as u32, t as u32 % ks.len() as u32);
                    r.dx[(s * kk + ks.start + m) as usize] = v;
                }
            }
        }
        let kn = weights.len();
        r.dw = gather(&laid.tensors["dW"], kn, |(x, y)| sim.memory(x, y));
        for (x, y) in laid.pes.keys() {
            assert!(sim.launch(*x, *y, UPDATE));
        }
        sim.run().unwrap();
        r.w = gather(&laid.tensors["W"], kn, |(x, y)| sim.memory(x, y));
        // the gradient is zeroed for the next step
        assert!(gather(&laid.tensors["dW"], kn, |(x, y)| sim.memory(x, y))
            .iter()
            .all(|&v| v == 0.0));
        r
    }

    /// A layer that trains on `batch` samples a step, `window` of them in flight.
    fn trained(k: u32, n: u32, (batch, window): (u32, u32), dx: bool) -> Dense {
        Dense {
            k,
            n,
            shape: Shape::Matmul,
            batch,
            window: window.clamp(1, batch),
            fifo: 0,
            train: true,
            dx,
            vars: vec!["W".into()],
            grad: "dW".into(),
            hosts: vec!["lr".into()],
            update: sgd(),
            more: Vec::new(),
            carry: None,
            pass: 0,
            side: None,
            joined: false,
        }
    }

    /// Within `tol` of the sum of the terms' magnitudes (the wafer sums in another
    /// order than a CPU: each PE's terms in order, then the PEs' partials along the
    /// chain).
    fn close(got: f32, terms: impl Iterator<Item = f64> + Clone, tol: f64) -> Result<(), String> {
        let exact: f64 = terms.clone().sum();
        let scale: f64 = terms.map(f64::abs).sum();
        let got = f64::from(got);
        if (got - exact).abs() <= tol * scale + 1e-7 {
            Ok(())
        } else {
            Err(format!("{got}, not {exact}"))
        }
    }

    fn uniforms(seed: u64, at: u64, n: u32) -> Vec<f32> {
        crate::rng::Stream::new(seed, 0)
            .uniforms(at, n as usize, 0)
            .iter()
            .map(|u| u * 2.0 - 1.0)
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]
        /// The forward pass, the input and weight gradients and an SGD update, against
        /// the same products in f64: within 1e-5 of the sum of the terms' magnitudes.
        #[test]
        fn training_equals_the_products(
            k in 1u32..30, n in 1u32..30, batch in 1u32..5, window in 1u32..5, w in 1u32..7,
            h in 1u32..7, seed in 0u64..1000, west in any::<bool>(), dx in any::<bool>(),
        ) {
            let d = trained(k, n, (batch, window), dx);
            let x = uniforms(seed, 0, batch * k);
            let wt = uniforms(seed, 1 << 20, k * n);
            let dy = uniforms(seed, 2 << 20, batch * n);
            let lr = 0.25;
            let o = if west { Orient::West } else { Orient::North };
            let r = run(&d, o, (w, h), &x, &dy, &wt, lr);
            let (x64, w64, dy64) = (|i: u32| f64::from(x[i as usize]), |i: u32| f64::from(wt[i as usize]), |i: u32| f64::from(dy[i as usize]));
            for s in 0..batch {
                for m in 0..n {
                    close(r.y[(s * n + m) as usize], (0..k).map(|kk| x64(s * k + kk) * w64(kk * n + m)), 1e-5)
                        .map_err(|e| TestCaseError::fail(format!("y[{s}][{m}] = {e}")))?;
                }
                if dx {
                    for kk in 0..k {
                        close(r.dx[(s * k + kk) as usize], (0..n).map(|m| dy64(s * n + m) * w64(kk * n + m)), 1e-5)
                            .map_err(|e| TestCaseError::fail(format!("dx[{s}][{kk}] = {e}")))?;
                    }
                }
            }
            for kk in 0..k {
                for m in 0..n {
                    let g = (0..batch).map(|s| x64(s * k + kk) * dy64(s * n + m));
                    close(r.dw[(kk * n + m) as usize], g.clone(), 1e-5)
                        .map_err(|e| TestCaseError::fail(format!("dW[{kk}][{m}] = {e}")))?;
                    let after = std::iter::once(w64(kk * n + m)).chain(g.map(|v| -0.25 * v));
                    close(r.w[(kk * n + m) as usize], after, 1e-5)
                        .map_err(|e| TestCaseError::fail(format!("W[{kk}][{m}] = {e}")))?;
                }
            }
        }
    }

    /// The input pixel under output `(oh, ow)` at filter tap `(r, s)`, if inside.
    fn under(g: &Geom, (oh, ow): (u32, u32), (r, s): (u32, u32)) -> Option<(u32, u32)> {
        let ih = (oh * g.stride.0 + r * g.dil.0)
            .checked_sub(g.pad.0)
            .filter(|&v| v < g.h)?;
        let iw = (ow * g.stride.1 + s * g.dil.1)
            .checked_sub(g.pad.1)
            .filter(|&v| v < g.w)?;
        Some((ih, iw))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]
        /// A convolution's (any strides, dilations, padding) forward pass, input and filter gradients and an SGD update,
        /// against the same sums in f64 (planar images, an HWIO filter): within 1e-5
        /// of the sum of the terms' magnitudes.
        #[test]
        fn a_convolution_equals_the_sums(
            k in 1u32..5, n in 1u32..5, h in 1u32..9, w in 1u32..9, r in 1u32..4, s in 1u32..4,
            dil in (1u32..3, 1u32..3), stride in (1u32..4, 1u32..4), same in any::<bool>(), batch in 1u32..4,
            window in 1u32..3, fw in 1u32..4, fh in 1u32..4, seed in 0u64..1000, west in any::<bool>(), dx in any::<bool>(),
        ) {
            let Some(g) = Geom::new(h, w, (r, s), dil, stride, same) else {
                return Ok(());
            };
            let mut d = trained(k, n, (batch, window), dx);
            d.shape = Shape::Conv(g);
            let (pi, po) = (h * w, g.ho * g.wo);
            let taps = r * s;
            let x = uniforms(seed, 0, batch * k * pi);
            let wt = uniforms(seed, 1 << 20, taps * k * n);
            let dy = uniforms(seed, 2 << 20, batch * n * po);
            let o = if west { Orient::West } else { Orient::North };
            let run = run(&d, o, (fw, fh), &x, &dy, &wt, 0.25);
            let xv = |b: u32, c: u32, (ih, iw): (u32, u32)| f64::from(x[(((b * k + c) * h + ih) * w + iw) as usize]);
            let wv = |t: u32, c: u32, m: u32| f64::from(wt[((t * k + c) * n + m) as usize]);
            let dyv = |b: u32, m: u32, oh: u32, ow: u32| f64::from(dy[(((b * n + m) * g.ho + oh) * g.wo + ow) as usize]);
            let at = |t: u32| (t / s, t % s);
            for b in 0..batch {
                for m in 0..n {
                    for oh in 0..g.ho {
                        for ow in 0..g.wo {
                            let terms: Vec<f64> = (0..taps).flat_map(|t| (0..k).filter_map(move |c| under(&g, (oh, ow), at(t)).map(|p| xv(b, c, p) * wv(t, c, m)))).collect();
                            close(run.y[(((b * n + m) * g.ho + oh) * g.wo + ow) as usize], terms.into_iter(), 1e-5)
                                .map_err(|e| TestCaseError::fail(format!("y[{b}][{m}][{oh}][{ow}] = {e}")))?;
                        }
                    }
                }
                if dx {
                    for c in 0..k {
                        for ih in 0..h {
                            for iw in 0..w {
                                let mut terms = Vec::new();
                                for t in 0..taps {
                                    for m in 0..n {
                                        for oh in 0..g.ho {
                                            for ow in 0..g.wo {
                                                if under(&g, (oh, ow), at(t)) == Some((ih, iw)) {
                                                    terms.push(dyv(b, m, oh, ow) * wv(t, c, m));
                                                }
                                            }
                                        }
                                    }
                                }
                                close(run.dx[(((b * k + c) * h + ih) * w + iw) as usize], terms.into_iter(), 1e-5)
                                    .map_err(|e| TestCaseError::fail(format!("dx[{b}][{c}][{ih}][{iw}] = {e}")))?;
                            }
                        }
                    }
                }
            }
            for t in 0..taps {
                for c in 0..k {
                    for m in 0..n {
                        let mut terms = Vec::new();
                        for b in 0..batch {
                            for oh in 0..g.ho {
                                for ow in 0..g.wo {
                                    if let Some(p) = under(&g, (oh, ow), at(t)) {
                                        terms.push(xv(b, c, p) * dyv(b, m, oh, ow));
                                    }
                                }
                            }
                        }
                        let i = ((t * k + c) * n + m) as usize;
                        close(run.dw[i], terms.iter().copied(), 1e-5)
                            .map_err(|e| TestCaseError::fail(format!("dW[{t}][{c}][{m}] = {e}")))?;
                        let after = std::iter::once(wv(t, c, m)).chain(terms.iter().map(|v| -0.25 * v));
                        close(run.w[i], after, 1e-5)
                            .map_err(|e| TestCaseError::fail(format!("W[{t}][{c}][{m}] = {e}")))?;
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]
        /// An embedding of `t` ids a sample from a `v x n` table: the rows it looks up,
        /// the rows' gradients added into the table's (an id met twice, twice) and an
        /// SGD update, exactly.
        #[test]
        fn an_embedding_looks_up_and_adds_its_rows(
            v in 1u32..40, n in 1u32..12, t in 1u32..4, batch in 1u32..4, window in 1u32..4,
            w in 1u32..7, h in 1u32..4, seed in 0u64..1000, west in any::<bool>(),
        ) {
            let mut d = trained(v, n, (batch, window), false);
            d.shape = Shape::Gather { t };
            // several ids a sample come out of one row of PEs (in the sample's order)
            let h = if t > 1 { 1 } else { h };
            let ids: Vec<f32> = uniforms(seed, 0, batch * t)
                .iter()
                .map(|u| ((u + 1.0) / 2.0 * v as f32).floor().min(v as f32 - 1.0))
                .collect();
            let wt = uniforms(seed, 1 << 20, v * n);
            let dy = uniforms(seed, 2 << 20, batch * t * n);
            let o = if west { Orient::West } else { Orient::North };
            let r = run(&d, o, (w, h), &ids, &dy, &wt, 0.25);
            let mut dw = vec![0.0f32; (v * n) as usize];
            for (q, &id) in ids.iter().enumerate() {
                for m in 0..n as usize {
                    let row = id as usize * n as usize + m;
                    prop_assert_eq!(r.y[q * n as usize + m], wt[row], "y[{}][{}]", q, m);
                    dw[row] += dy[q * n as usize + m];
                }
            }
            prop_assert_eq!(&r.dw, &dw);
            let after: Vec<f32> = wt.iter().zip(&dw).map(|(w, g)| w - 0.25 * g).collect();
            prop_assert_eq!(&r.w, &after);
        }
    }

    #[test]
    fn a_one_pe_layer_takes_hand_computed_cycles() {
        // k = 2, n = 3 on one PE, one sample: the inputs arrive at 4, 5 (the host sends
        // at 0, 1; ramp 2 + ramp 2); the task starts at 4 and runs 10 (switch) + 7
        // (receive 2: start-up 5, elements at 19, 20) + 8 (the first input's products:
        // a multiply of 3, 5 + 3) + 8 (the second's: a multiply-add of 3, 5 + 3) + 8
        // (send 3) = 41 cycles: the last output leaves at 4 + 40 and crosses the east
        // link (ramp 2, hop 1)
        let d = Dense::forward_only(2, 3, 1);
        let r = run(
            &d,
            Orient::North,
            (1, 1),
            &[1.0, 2.0],
            &[],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            0.0,
        );
        assert_eq!(r.y, [9.0, 12.0, 15.0]);
        assert_eq!(r.forward, 4 + 40 + 3);
    }
}
