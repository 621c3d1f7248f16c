//! What a layer computes with its inputs (`Shape`): a product, a flattened image's,
//! a convolution or a transposed one (their geometry, `Geom`), an embedding or a
//! product over each token.

use crate::ir::{window_out, window_pad, Padding};

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
    /// A transposed convolution of an image of `k` channels into one of `n`: the input
    /// gradient of the convolution `Geom` describes, whose input plane (`h x w`) is
    /// this layer's output and whose output plane (`ho x wo`) its input.
    ConvT(Geom),
    /// An embedding: each of a sample's `t` ids picks a row of the `k x n` table (`W`).
    Gather { t: u32 },
    /// `y = x W` of each of a sample's `t` tokens (`[t, k]` in, `[t, n]` out, token by
    /// token: a dense layer over a sequence).
    Tokens { t: u32 },
}

/// A convolution's geometry: input plane, filter, dilation, strides, the padding
/// before the first row and column, output plane. A PE computes the outputs of every
/// position from the first to the last strided one (`h1 x w1`, stride 1) and sends
/// those `stride` apart. The first output's window starts `top` rows into the padded
/// plane: 0 for a whole image; a band's (`band`) may start further down.
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
    pub top: u32,
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
            top: 0,
        })
    }

    /// The geometry of the part of this convolution that input rows `ins` add to output
    /// rows `outs` (a band of each: a PE of a layer split into bands of rows,
    /// `Dense::bands`): the band's `ins.len()` rows at `pad` in a padded plane whose
    /// row `top` is the first that output row `outs.start` reads; none when no output
    /// of the band reads a row of the input band.
    pub fn band(&self, ins: std::ops::Range<u32>, outs: std::ops::Range<u32>) -> Option<Geom> {
        let (sh, dh, pt) = (
            i64::from(self.stride.0),
            i64::from(self.dil.0),
            i64::from(self.pad.0),
        );
        let first = i64::from(outs.start) * sh - pt;
        let (lo, hi) = (i64::from(ins.start), i64::from(ins.end));
        let reads = (outs.clone()).any(|o| {
            (0..i64::from(self.r)).any(|t| (lo..hi).contains(&(i64::from(o) * sh - pt + t * dh)))
        });
        if !reads {
            return None;
        }
        let start = first.min(lo);
        Some(Geom {
            h: ins.len() as u32,
            ho: outs.len() as u32,
            pad: ((lo - start) as u32, self.pad.1),
            top: (first - start) as u32,
            ..*self
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
        (self.top + self.h1() + (self.r - 1) * self.dil.0).max(self.pad.0 + self.h)
    }
    pub fn wp(&self) -> u32 {
        (self.w1() + (self.s - 1) * self.dil.1).max(self.pad.1 + self.w)
    }

    /// The words an output plane spans at pitch `wp`: one vector operation's length.
    pub fn span(&self) -> u32 {
        (self.h1() - 1) * self.wp() + self.w1()
    }

    /// The stride-1 output rows whose windows reach the input's rows (the first, and
    /// how many): all `h1` of a whole image; of a band (`band`), from the first whose
    /// window reaches its rows to the last (a dilated filter's taps may step over a
    /// thin band, and rows between add zeros), the others reading padding alone. A
    /// PE's taps run over these rows only (`reached_span`), which is exact: the rows
    /// left out add zeros to the outputs and the filter's gradient, and their input
    /// gradient falls outside the band.
    pub fn reached(&self) -> (u32, u32) {
        let (top, pad, h1) = (
            i64::from(self.top),
            i64::from(self.pad.0),
            i64::from(self.h1()),
        );
        let reach = i64::from((self.r - 1) * self.dil.0);
        let first = (pad - top - reach).clamp(0, h1 - 1);
        let last = (pad + i64::from(self.h) - 1 - top).clamp(first, h1 - 1);
        (first as u32, (last - first + 1) as u32)
    }

    /// The words of the output rows `reached` spans at pitch `wp`, and where they
    /// start: the taps' vector operation.
    pub fn reached_span(&self) -> (u32, u32) {
        let (first, rows) = self.reached();
        let wp = self.wp();
        (first * wp, (rows - 1) * wp + self.w1())
    }

    /// The words of a padded input plane, and of an output plane at pitch `wp`; where
    /// the padded plane's interior starts, and the first output's window; the distance
    /// of two strided output rows.
    pub fn planes(&self) -> Planes {
        let wp = self.wp();
        Planes {
            pad: self.hp() * wp,
            out: self.h1() * wp,
            inner: self.pad.0 * wp + self.pad.1,
            top: self.top * wp,
            row: self.stride.0 * wp,
        }
    }
}

/// A convolution's planes as a PE lays them out (`Geom::planes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planes {
    pub pad: u32,
    pub out: u32,
    pub inner: u32,
    pub top: u32,
    pub row: u32,
}

impl Shape {
    /// A sample's elements per input group (feature or channel), and per output group.
    pub fn per_in(&self) -> u32 {
        match self {
            Shape::Matmul | Shape::Gather { .. } => 1,
            Shape::Planar { hw } => *hw,
            Shape::Conv(g) => g.h * g.w,
            Shape::ConvT(g) => g.ho * g.wo,
            Shape::Tokens { t } => *t,
        }
    }
    pub fn per_out(&self) -> u32 {
        match self {
            Shape::Conv(g) => g.ho * g.wo,
            Shape::ConvT(g) => g.h * g.w,
            Shape::Gather { t } | Shape::Tokens { t } => *t,
            _ => 1,
        }
    }

    /// The rows of a sample's input planes and of its output's (a convolution's,
    /// which it may take and give in bands of rows, `Dense::bands`; a transposed
    /// one's); 1 else.
    pub fn rows(&self) -> (u32, u32) {
        match self {
            Shape::Conv(g) => (g.h, g.ho),
            Shape::ConvT(g) => (g.ho, g.h),
            _ => (1, 1),
        }
    }

    /// Whether it reads and makes images (planar channels): a convolution, or a
    /// transposed one.
    pub fn images(&self) -> bool {
        matches!(self, Shape::Conv(_) | Shape::ConvT(_))
    }
}
