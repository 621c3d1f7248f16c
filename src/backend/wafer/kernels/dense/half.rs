//! A layer in half precision (`Dense::half`, mixed precision): its products on the
//! fp16 lanes from a copy of its weight rounded to the precision, and what it receives
//! rounded where it lands.

use super::super::super::isa::{Colour, Dsd, Instr, Src, VecOp};
use super::super::super::lower::{self, Val};
use super::{Colours, Dense};

impl Dense {
    /// Its forward and backward bodies (`fwd`, `bwd`) in its precision: as they are for
    /// an f32 layer; in half precision, `on_half_lanes` on its inputs' and output
    /// gradient's colours (`Dense::plain` refused what it carries besides).
    pub(super) fn halved(
        &self,
        (fwd, bwd): (Vec<Instr>, Vec<Instr>),
        c: Colours,
    ) -> (Vec<Instr>, Vec<Instr>) {
        match self.half.and_then(VecOp::round_to) {
            Some(round) => (
                on_half_lanes(fwd, round, c.x),
                on_half_lanes(bwd, round, c.dy),
            ),
            None => (fwd, bwd),
        }
    }

    /// In half precision, the update's last instruction: the weight's copy at `copy`
    /// (`size` words) rounded again from the weight (`w`) the update changed.
    pub(super) fn refreshed(&self, copy: u32, w: Val, size: u32) -> Option<Instr> {
        let round = self.half.and_then(VecOp::round_to)?;
        Some(lower::vec(round, Val::buf(copy, size), &[w], size))
    }
}

/// A half-precision layer's body: its products on the fp16 lanes (`VecOp::halved`), and
/// what it receives on `colour` (its inputs, or its output gradient) rounded by `round`
/// where it lands (a layer's sums of products come in f32).
fn on_half_lanes(body: Vec<Instr>, round: VecOp, colour: Colour) -> Vec<Instr> {
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
                body: on_half_lanes(body, round, colour),
            }),
            other => out.push(other),
        }
    }
    out
}
