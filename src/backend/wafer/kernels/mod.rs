//! The kernel library: each group of train-graph ops becomes a resizable kernel that,
//! given a rectangle, yields its per-PE programs, initial memory and routes.
//!
//! - `dense`: `y = x W` (the forward pass so far) on the checkerboard GEMV mapping.

pub mod dense;

use super::isa::{Colour, Program};
use super::sim::Route;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A kernel laid out on its rectangle, in fabric coordinates: what a `sim::Setup`
/// is made of.
#[derive(Debug, Clone, Default)]
pub struct Laid {
    /// `(x, y)` -> program and initial SRAM words.
    pub pes: BTreeMap<(u32, u32), (Arc<Program>, Vec<f32>)>,
    /// `(x, y, colour)` -> route.
    pub routes: BTreeMap<(u32, u32, Colour), Route>,
}

/// A rectangle of PEs: its north-west corner and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
}

/// `n` items dealt to `parts` in contiguous runs of `ceil(n / parts)`: the range of
/// part `i` (empty for the parts past the end).
pub fn split(n: u32, parts: u32, i: u32) -> std::ops::Range<u32> {
    let per = n.div_ceil(parts.max(1));
    (i * per).min(n)..((i + 1) * per).min(n)
}
