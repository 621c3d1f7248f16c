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

//!
//! Here: the layer, its rows, colours and the program of a PE; `shape` what it
//! computes (a product, a convolution's geometry, ...); `chain` the
//! instructions the bodies share (receives, partial sums along a chain); `gemv`,
//! `conv`, `gather` and `tokens` the forward and backward bodies of a product, a
//! convolution (or a transposed one), an embedding and a product over each token;
//! `half` a layer's bodies in half precision; `lanes` what its columns and rows hold
//! of a sample (in bands of rows, too).
use super::super::isa::{Colour, Dsd, Instr, Program, Task, Trigger};
use super::super::lower::{self, Scratch, Update, Val};
use super::super::pipeline::Pipeline;
use super::super::sim::Dir;
use super::{split, used, Laid, Orient, Piece, Share, UPDATE};
use crate::ir::DType;

mod chain;
mod conv;
mod gather;
mod gemv;
mod half;
mod lanes;
mod shape;
#[cfg(test)]
mod tests;
mod tokens;

use chain::receive;
pub use shape::{Geom, Shape};
use std::sync::Arc;

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
    /// Whether it carries its input ahead of its outputs (a shortcut's, which the layer
    /// after reads as its input: `form::Carry::first`), and takes that input's gradient
    /// ahead of its output gradient.
    pub first: bool,
    /// The words a sample of a value it passes on for a skip of several kernels (its
    /// input is another: `form::Formed::passed`; 0: none), carried as its input is, by
    /// units of `pass_px` words: column `i` takes its share `split(units, w, i)` after
    /// its inputs, row `j` sends `split(units, h, j)` after its outputs, and the
    /// value's gradient goes back after each column's input gradient.
    pub pass: u32,
    /// The words of each unit of the value it passes on (a channel's plane of an image
    /// a convolution passes on, split by channels as its own input is; 1 for features).
    pub pass_px: u32,
    /// The rows of each unit of the value it passes on (an image's planes; 1 else):
    /// what its bands of rows split (`bands`).
    pub pass_rows: u32,
    /// Whether it is a side part (`form::Part::side`), and how its outputs' gradient
    /// comes back: its outputs travel in the rows' chains after the layer's (and a
    /// residual's), not summed into them; so do their gradients, after the layer's
    /// output gradient, unless they are the layer's (`Back::Same`: the two summed).
    pub side: Option<Back>,
    /// Whether, a side part, it adds its outputs into those of the side part before it
    /// (a side layer of several products: `form::Part::joined`).
    pub joined: bool,
    /// Its outputs' columns as so many equal groups, each dealt over its rows (1:
    /// the plain split): row `j` of `h` holds columns `split(n / groups, h, j)` of each
    /// group, one after another (the fused `q | k | v` projection before heads dealt
    /// to lanes, `vector::Heads`: lane `j` takes its heads of each).
    pub groups: u32,
    /// Its half precision (f16, bf16) when it computes in one (mixed precision,
    /// `halved`): its weight's f32 values stay the update's, and its products read a
    /// copy rounded after each update.
    pub half: Option<DType>,
    /// A convolution's bands of rows, of its input image and of its output (1: whole
    /// planes): with more, column `i` takes one channel's band of rows and row `j`
    /// gives one channel's (`kernels::share`), so that a PE keeps only its band of a
    /// sample, however large the image. PE `(i, j)` adds what its input band gives
    /// its output band (`Geom::band`), or, where it gives nothing, passes its row's
    /// and its column's partial sums on (`relay`). The PEs of one pair of channels
    /// each hold the pair's filter, and sum its gradient over their bands: the host
    /// sums those and writes the sum back before the update (`Laid::summed`).
    pub bands: (u32, u32),
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
            first: false,
            pass: 0,
            pass_px: 1,
            pass_rows: 1,
            side: None,
            joined: false,
            groups: 1,
            half: None,
            bands: (1, 1),
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

    /// The units (features, or an image's channels) of what it carries past itself:
    /// its input, or the value it passes on.
    fn carried(&self) -> u32 {
        if self.pass > 0 {
            self.pass / self.pass_px.max(1)
        } else {
            self.k
        }
    }

    /// The rows of a unit of what it carries past itself (`carried`): an image's.
    fn carried_rows(&self) -> u32 {
        if self.pass > 0 {
            self.pass_rows.max(1)
        } else {
            self.shape.rows().0
        }
    }

    /// The words of a unit of what it carries past itself (`carried`).
    fn carried_px(&self) -> u32 {
        if self.pass > 0 {
            self.pass_px.max(1)
        } else {
            self.shape.per_in()
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
        // (a shortcut's carried input goes ahead of its outputs, that input's gradient
        // ahead of its output gradient: `first`)
        let (mut at, mut back_at) = if self.first { (carried, back) } else { (0, 0) };
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
        // (in bands, each PE of a pair of channels sums the filter's gradient over its
        // band)
        if self.bands != (1, 1) && self.train {
            laid.summed.insert(self.grad.clone());
        }
        for (d, part, first, cols, c) in parts {
            for i in 0..cols {
                let ks = d.column(cols, i);
                let col = first + i;
                for j in 0..hr {
                    let c = c.row(j, fan);
                    // a side part's own outputs; the others', the layer's
                    let ns = if d.side.is_some() { d } else { self }.out_row(hr, j);
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

    /// The program of PE `(i, j)` of a `wc x hr` frame, holding input share `ks` and
    /// output share `ns` (the tensors it holds added to `laid`, at PE `at`).
    #[allow(clippy::too_many_arguments)]
    pub fn program(
        &self,
        i: u32,
        j: u32,
        (wc, hr): (u32, u32),
        c: Colours,
        laid: &mut Laid,
        at: (u32, u32),
        (share_in, share_out): (&Share, &Share),
        row: Row,
    ) -> Result<Program, String> {
        self.plain()?;
        let (ks, ns) = (&share_in.groups, &share_out.groups);
        let b = ns.len() as u32;
        // (in bands: the part of the convolution its input band gives its output
        // band, or nothing)
        let shape = match self.shape {
            Shape::Conv(g) if self.bands != (1, 1) => {
                match g.band(share_in.rows.clone(), share_out.rows.clone()) {
                    Some(g) => Shape::Conv(g),
                    None => {
                        let carry = self.carrying((i, j), hr, ks, row.cols)?;
                        let shares = (share_in, share_out);
                        return Ok(self.relay((i, j), (wc, hr), c, shares, carry));
                    }
                }
            }
            shape => shape,
        };
        let mut p = Program::default();
        let rows = self.rows(ks);
        let block = match self.shape {
            Shape::ConvT(g) => self.transposed_block(g, ks, ns),
            _ => self.block(&rows, ns, hr)?,
        };
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
        // (in half precision: the weight's rounded copy, which the products read)
        let w = match self.half {
            Some(dtype) => {
                let name = super::half_copy(&self.vars[0], dtype);
                let base = p.alloc(&name, size);
                piece(laid, &name, base, block.clone());
                base
            }
            None => w,
        };
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
        let carry = self.carrying((i, j), hr, ks, row.cols)?;
        let plain = Row {
            len: b,
            at: 0,
            back_len: b,
            back_at: 0,
            cols: row.cols,
        };
        self.supported(row != plain, carry)?;
        let blk = Block {
            w,
            dw,
            c,
            links,
            carry,
            row,
        };
        let (fwd, bwd) = match shape {
            Shape::Conv(g) => self.conv(&mut p, g, (a, b), blk),
            Shape::ConvT(g) => self.conv_t(&mut p, g, (a, b), blk),
            Shape::Gather { t } => self.gather(&mut p, (t, ks.start), (a, b), blk),
            Shape::Tokens { t } => self.tokens(&mut p, t, (a, b), blk)?,
            _ => self.gemv(&mut p, a * self.shape.per_in(), b, blk),
        };
        let (fwd, bwd) = self.halved((fwd, bwd), c);
        let kind = match self.shape {
            Shape::Conv(_) => "conv",
            Shape::ConvT(_) => "transposed conv",
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
        self.backward(&mut p, &format!("{kind} backward"), bwd, c.dy);
        // the update, over the blocks
        let mut scratch = Scratch::new(p.words());
        let acc = [Val::buf(dw, size)];
        let mut body = self.update.code(&vars, &acc, &hosts, size, &mut scratch)?;
        body.extend(lower::zeroed(&acc));
        body.extend(self.refreshed(w, vars[0], size));
        if scratch.high > 0 {
            p.alloc("scratch", scratch.high);
        }
        p.tasks.push(Task {
            id: UPDATE,
            name: format!("{kind} update"),
            trigger: Trigger::Local { at_start: false },
            body,
        });
        Ok(p)
    }

    /// A PE's backward task (`bwd`, named `name`, run by its output gradients on `dy`)
    /// after its forward one, in the 1F1B order of its window (`Pipeline`), with room
    /// for the output gradients that come while it runs forwards.
    fn backward(&self, p: &mut Program, name: &str, bwd: Vec<Instr>, dy: Colour) {
        p.tasks.push(Task {
            id: 1,
            name: name.into(),
            trigger: Trigger::Data(dy),
            body: bwd,
        });
        p.pipeline = Some(Pipeline {
            forward: 0,
            backward: vec![1],
            window: self.window,
            samples: self.batch,
        });
        let words = p.receives(1, dy) as u32;
        p.fifo(dy, self.fifo * words);
    }

    /// Whether a layer that carries nothing and has no further parts is all its PEs have
    /// a body for (a transposed convolution, a layer in half precision), and a layer in
    /// bands one that may be (`can_band`): an error for what else it has.
    fn plain(&self) -> Result<(), String> {
        if self.bands != (1, 1) {
            return match self.can_band() {
                true => Ok(()),
                false => Err("in bands of rows the wafer has kernels for convolutions in f32 without further parts alone".into()),
            };
        }
        let what = match (self.shape, self.half) {
            (Shape::ConvT(_), _) => "a transposed convolution",
            (_, Some(_)) => "a half-precision layer",
            _ => return Ok(()),
        };
        let sides = self.more.iter().any(|d| d.side.is_some());
        if self.carry.is_some() || self.first || self.pass > 0 || !self.more.is_empty() || sides {
            return Err(format!("{what} that carries a value or has further parts (a residual, a shortcut, a side part) has no wafer kernel yet"));
        }
        Ok(())
    }

    /// Whether a PE of this layer has a body: an error for what it has none of yet
    /// (`extra`: its row's chain carries more than its outputs).
    fn supported(&self, extra: bool, carry: Carrying) -> Result<(), String> {
        // (an embedding of one id a sample may share its row's chain: a side part, or a
        // layer with side parts)
        let shares = matches!(self.shape, Shape::Matmul | Shape::Gather { t: 1 });
        // (a convolution's carried image travels after its outputs in links of its own)
        let sides = self.more.iter().any(|d| d.side.is_some());
        let conv_carries = matches!(self.shape, Shape::Conv(_)) && !sides;
        // (a layer over tokens carries in its own chain: `tokens`)
        let token_carries = matches!(self.shape, Shape::Tokens { .. }) && !sides;
        if extra
            && (!shares || carry.mine > 0 || carry.pass > 0)
            && self.shape != Shape::Matmul
            && !conv_carries
            && !token_carries
        {
            return Err("a side part or a residual of a convolution or an embedding of several ids has no wafer kernel yet".into());
        }
        if self.first && !matches!(self.shape, Shape::Conv(_) | Shape::Matmul) {
            return Err(
                "a shortcut beside another layer of a flattened image or an embedding has no wafer kernel yet"
                    .into(),
            );
        }
        Ok(())
    }

    /// The slot counter `k`'s stash descriptor offset for slots of `len` words (none
    /// when the layer does not train: one slot).
    fn by(&self, k: u8, len: u32) -> Option<(u8, i32)> {
        self.train.then_some((k, len as i32))
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
            again: false,
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
/// carried units (`row` of them: features, or channels of `px` words), its column's
/// (`mine`: from input `at` of its column, to place `to` of its row's, after the
/// layer's outputs); `pass`, its column's share of a value it passes on (then `at` is
/// in that share). Nothing for another layer.
#[derive(Debug, Clone, Copy, Default)]
struct Carrying {
    mine: u32,
    at: u32,
    to: u32,
    pass: u32,
    px: u32,
    row: u32,
    /// Whether its units are rows of an image in bands (`carrying_in_bands`), not
    /// channels' planes.
    rows: bool,
}

impl Carrying {
    /// Where unit `u` starts in planes of `per` rows, `plane` words apart, a row `row`
    /// words (a row's place in its channel's plane, when its units are rows; a
    /// plane's, else), and the distance from one unit to the next.
    fn place(&self, u: u32, (per, plane, row): (u32, u32, u32)) -> (u32, u32) {
        match self.rows {
            true => ((u / per) * plane + (u % per) * row, row),
            false => (u * plane, plane),
        }
    }
}

/// A PE's links in the forward chain and in the input gradients' chain: the colours it
/// sends on and receives on.
#[derive(Debug, Clone, Copy)]
struct Links {
    fwd: (Colour, Option<Colour>),
    bwd: (Colour, Option<Colour>),
}
