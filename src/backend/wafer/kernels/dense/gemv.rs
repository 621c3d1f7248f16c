//! A product's forward and backward bodies on a PE (`y = x W` a sample, the input
//! gradient and the weight gradient).

use super::super::super::isa::{Dsd, Instr, Program, Src, VecOp};
use super::chain::{link, macs, products, receive, row_gradient, zero};
use super::{Back, Block, Dense};

impl Dense {
    /// A product's forward and backward bodies on a PE with `a` inputs and `b` outputs.
    pub(super) fn gemv(
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
        // (after its outputs, or ahead of the row's: a shortcut's, `Dense::first`)
        let carried_at = if self.first { chain } else { y + b };
        if carry.mine > 0 {
            fwd.push(Instr::Vec {
                op: VecOp::Mov,
                dst: Dsd::mem(carried_at + carry.to, carry.mine),
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
        // the row's output gradient: this PE's at `row.back_at`
        let (grads, take_dy) = row_gradient(p, row.back_len, c.dy);
        let dy = grads + row.back_at;
        // (where the row's carried gradient starts: after the output gradient, ahead of
        // the row's for a shortcut, or the output gradient itself)
        let skip = match self.carry {
            Some(Back::Beside) if self.first => Some(grads),
            Some(Back::Beside) => Some(dy + b),
            Some(Back::Same) => Some(dy),
            _ => None,
        };
        let mut bwd = vec![take_dy];
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
                    srcs: vec![Src::V(part), Src::V(Dsd::mem(at + carry.to, carry.mine))],
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
}
