//! An embedding's forward and backward bodies on a PE: each id's row of its block, or
//! zeros, into the chain of partial sums; each id's output gradient added into its row.

use super::super::super::isa::{Dsd, Instr, Program, Src, VecOp};
use super::chain::{link, row_gradient, zero};
use super::{Block, Dense};

impl Dense {
    /// An embedding's forward and backward bodies on a PE holding rows `lo..lo + a` of
    /// the table (`b` of its columns), for `t` ids a sample. Every column receives a
    /// sample's ids and stashes them; for each id, the PE whose rows hold it puts its
    /// row's part into the chain of partial sums (the others zeros), and the backward
    /// pass adds the row's gradient into that row. With one id a sample its part may
    /// lie among others in its row's chain (`Row`: a side part's, or a layer's with
    /// side parts).
    pub(super) fn gather(
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
        let (grads, take_dy) = row_gradient(p, back_len, c.dy);
        let yt = Dsd::strided(grads + back_at, b, 1, &[b], None);
        let mut bwd = vec![take_dy];
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
}
