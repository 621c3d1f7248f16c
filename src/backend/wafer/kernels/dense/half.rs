//! A layer in half precision (`Dense::half`, mixed precision): its products on the
//! fp16 lanes from a copy of its weight rounded to the precision, and what it receives
//! rounded where it lands.

use super::super::super::isa::{Colour, Dsd, Instr, Src, VecOp};
use super::super::super::lower::Val;
use super::{Colours, Dense};

impl Dense {
    /// Its forward and backward bodies (`fwd`, `bwd`) in its precision: as they are for
    /// an f32 layer; in half precision, `halved` on its inputs' and output gradient's
    /// colours (an error for a layer that carries a value or has further parts).
    pub(super) fn halved(
        &self,
        (fwd, bwd): (Vec<Instr>, Vec<Instr>),
        c: Colours,
    ) -> Result<(Vec<Instr>, Vec<Instr>), String> {
        let Some(round) = self.half else {
            return Ok((fwd, bwd));
        };
        if self.carry.is_some() || self.first || self.pass > 0 || !self.more.is_empty() {
            return Err("a half-precision layer that carries a value or has further parts has no wafer kernel yet".into());
        }
        Ok((halved(fwd, round, c.x), halved(bwd, round, c.dy)))
    }

    /// In half precision, the update's last instruction: the weight's copy at `copy`
    /// (`size` words) rounded again from the weight (`w`) the update changed.
    pub(super) fn refreshed(&self, copy: u32, w: Val, size: u32) -> Option<Instr> {
        let round = self.half?;
        Some(Instr::Vec {
            op: round,
            dst: Dsd::mem(copy, size),
            srcs: vec![w.src(size)],
        })
    }
}

/// A half-precision layer's body (`Dense::half`): its products on the fp16 lanes
/// (`VecOp::halved`), and what it receives on `colour` (its inputs, or its output
/// gradient) rounded to its precision where it lands (a layer's sums of products come
/// in f32).
fn halved(body: Vec<Instr>, round: VecOp, colour: Colour) -> Vec<Instr> {
    let mut out = Vec::with_capacity(body.len());
    for i in body {
        match i {
            Instr::Vec { op, dst, srcs } => {
                let lands = matches!(dst, Dsd::Mem { .. })
                    && (srcs.iter())
                        .any(|s| matches!(s, Src::V(Dsd::In { colour: c, .. }) if *c == colour));
                let rounded = lands.then(|| Instr::Vec {
                    op: round,
                    dst: dst.clone(),
                    srcs: vec![Src::V(dst.clone())],
                });
                out.push(Instr::Vec {
                    op: op.halved(),
                    dst,
                    srcs,
                });
                out.extend(rounded);
            }
            Instr::Loop { count, body } => out.push(Instr::Loop {
                count,
                body: halved(body, round, colour),
            }),
            other => out.push(other),
        }
    }
    out
}
