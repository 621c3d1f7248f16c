//! Reductions along a sample's features across the lanes of a vector kernel (a layer
//! norm's mean and variance, their gradients' sums; a word a sample, or a word a token
//! of a sequence): each lane reduces its share, the
//! partial results go down the strip lane to lane, each adding its own (on two colours
//! that alternate, as a dense layer's chains do: a router passes one colour one way),
//! and the last lane sends the whole back up to every other (a third colour, multicast
//! along the strip). Every lane of a strip runs the same tasks in the same order (the
//! same window, `pipeline::admits`), so the `k`th reduction of each lane is the same
//! sample's same value, and the colours serve every reduction of both passes.

use super::super::isa::{Colour, Dsd, Instr, Src, VecOp};
use super::super::lower::Val;
use super::super::sim::Dir;
use super::{Laid, Orient};

/// The colours of a strip's reductions: the two of the chain down the strip, and the
/// one the total comes back up on.
pub type RowColours = [Colour; 3];

/// `acc` (on each lane its share's reduction by `op`: one word, or one a token of a
/// sequence) made the reduction of every lane's, on lane `lane` of `lanes`.
pub fn across(op: VecOp, acc: Val, (lanes, lane): (u32, u32), c: RowColours) -> Vec<Instr> {
    if lanes < 2 {
        return Vec::new();
    }
    let len = acc.elements();
    let Some(mine) = acc.dsd(len) else {
        return Vec::new();
    };
    let on = |l: u32| c[(l % 2) as usize];
    let out = |colour| Dsd::Out { colour, len };
    let inp = |colour| Src::V(Dsd::In { colour, len });
    let last = lanes - 1;
    let mut body = Vec::new();
    match lane {
        0 => body.push(Instr::Vec {
            op: VecOp::Mov,
            dst: out(on(0)),
            srcs: vec![Src::V(mine.clone())],
        }),
        l if l < last => body.push(Instr::Vec {
            op,
            dst: out(on(l)),
            srcs: vec![Src::V(mine.clone()), inp(on(l - 1))],
        }),
        l => body.push(Instr::Vec {
            op,
            dst: mine.clone(),
            srcs: vec![Src::V(mine.clone()), inp(on(l - 1))],
        }),
    }
    if lane == last {
        body.push(Instr::Vec {
            op: VecOp::Mov,
            dst: out(c[2]),
            srcs: vec![Src::V(mine)],
        });
    } else {
        body.push(Instr::Vec {
            op: VecOp::Mov,
            dst: mine,
            srcs: vec![inp(c[2])],
        });
    }
    body
}

/// The routes of a strip of `lanes` at `origin`, oriented `o`, for its reductions:
/// lane `l`'s partial down to lane `l + 1` on `c[l % 2]`, and the total from the last
/// lane up to every other on `c[2]`.
pub fn routes(
    laid: &mut Laid,
    origin: (u32, u32),
    o: Orient,
    lanes: u32,
    c: RowColours,
) -> Result<(), String> {
    if lanes < 2 {
        return Ok(());
    }
    let at = |l: u32| o.at(origin, 0, l);
    let last = lanes - 1;
    for l in 0..lanes {
        if l < last {
            laid.route(at(l), c[(l % 2) as usize], o.route(Dir::Ramp, &[Dir::S]))?;
        }
        if l > 0 {
            laid.route(
                at(l),
                c[((l - 1) % 2) as usize],
                o.route(Dir::N, &[Dir::Ramp]),
            )?;
        }
        let up = match l {
            l if l == last => o.route(Dir::Ramp, &[Dir::N]),
            0 => o.route(Dir::S, &[Dir::Ramp]),
            _ => o.route(Dir::S, &[Dir::Ramp, Dir::N]),
        };
        laid.route(at(l), c[2], up)?;
    }
    Ok(())
}
