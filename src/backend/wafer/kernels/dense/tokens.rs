//! A dense layer over each token of a sequence on a PE: the forward and backward bodies
//! of `gemv`, each over a sample's `t` tokens in turn.

use super::super::super::isa::{Dsd, Instr, Program, Src, VecOp};
use super::super::nest;
use super::chain::{link, receive, row_gradient, taps, zero};
use super::{Back, Block, Dense};

impl Dense {
    /// A dense layer over tokens on a PE with `a` inputs and `b` outputs of each of a
    /// sample's `t` tokens, which arrive (and leave) token by token: `[t, a]` in, the
    /// row's partial sums `[t, b]` out; backward, the output gradients `[t, b]` in and
    /// the input gradients' partial sums `[t, a]` out; the weight gradient adds each
    /// token's `x^T dy`. What it carries past itself (a residual's input, or a value it
    /// passes on) follows every token's outputs in the row's chain, each token's share
    /// in turn, and its gradient comes back so (after the output gradient, or as it).
    pub(super) fn tokens(
        &self,
        p: &mut Program,
        t: u32,
        (a, b): (u32, u32),
        Block {
            w,
            dw,
            c,
            links,
            carry,
            row,
        }: Block,
    ) -> Result<(Vec<Instr>, Vec<Instr>), String> {
        // (a row's chain a token: its outputs, then the features it carries)
        let cr = row.len - b;
        if row.at != 0 || row.back_at != 0 || (row.back_len != b && row.back_len != row.len) {
            return Err(
                "a side part or a shortcut beside a dense layer over tokens has no wafer kernel yet"
                    .into(),
            );
        }
        let (xs, take) = self.stash(p, "x stash", t * a, c.x);
        let chain = p.alloc("y", t * row.len);
        let y = chain;
        // y[t, :] += x[t, i] W[i, :], over the tokens and the inputs
        let mut fwd = vec![take, zero(chain, t * row.len)];
        if a > 0 && b > 0 {
            fwd.push(taps(
                &[t, a],
                Dsd::strided(y, b, 1, &[b, 0], None),
                Dsd::strided(w, b, 1, &[0, b], None),
                Dsd::strided(xs, b, 0, &[a, 1], self.by(0, t * a)),
            ));
        }
        // what it carries, each token's share after every token's outputs: its own
        // input's, or a value passed on, which comes after its inputs (one sample's)
        if carry.mine > 0 {
            let src = if carry.pass > 0 {
                let buf = p.alloc("passed", t * carry.pass);
                fwd.push(receive(Dsd::mem(buf, t * carry.pass), c.x));
                Dsd::strided(buf + carry.at, carry.mine, 1, &[carry.pass], None)
            } else {
                Dsd::strided(xs + carry.at, carry.mine, 1, &[a], self.by(0, t * a))
            };
            fwd.push(nest(
                &[t],
                Instr::Vec {
                    op: VecOp::Mov,
                    dst: Dsd::strided(chain + t * b + carry.to, carry.mine, 1, &[cr], None),
                    srcs: vec![Src::V(src)],
                },
            ));
        } else if carry.pass > 0 {
            // (a column with none of its row's share still takes its part)
            let buf = p.alloc("passed", t * carry.pass);
            fwd.push(receive(Dsd::mem(buf, t * carry.pass), c.x));
        }
        let (send, recv) = links.fwd;
        fwd.push(link(chain, (t * row.len, 1), &[], send, recv));
        if self.train {
            fwd.push(self.count(0));
        }
        let Some(dw) = dw else {
            return Ok((fwd, Vec::new()));
        };
        let (dy, take_dy) = row_gradient(p, t * row.back_len, c.dy);
        // (where the carried gradient lies, a token's run how far from the next: after
        // every token's output gradient, or the output gradient itself)
        let skip = match self.carry {
            Some(Back::Beside) => Some((dy + t * b, cr)),
            Some(Back::Same) => Some((dy, b)),
            Some(Back::Not) | None => None,
        };
        let mut bwd = vec![take_dy];
        if self.dx {
            // dx[t, :] += W[:, o] dy[t, o], over the tokens and the outputs; then the
            // gradient of a value passed on, each token's share
            let pass = if skip.is_some() { carry.pass } else { 0 };
            let dx = p.alloc("dx", t * (a + pass));
            bwd.push(zero(dx, t * (a + pass)));
            if a > 0 && b > 0 {
                bwd.push(taps(
                    &[t, b],
                    Dsd::strided(dx, a, 1, &[a, 0], None),
                    Dsd::strided(w, a, b as i32, &[0, 1], None),
                    Dsd::strided(dy, a, 0, &[b, 1], None),
                ));
            }
            if let (Some((at, every)), true) = (skip, carry.mine > 0) {
                let (into, stride) = match carry.pass {
                    0 => (dx, a),
                    n => (dx + t * a, n),
                };
                let part = Dsd::strided(into + carry.at, carry.mine, 1, &[stride], None);
                bwd.push(nest(
                    &[t],
                    Instr::Vec {
                        op: VecOp::Add,
                        dst: part.clone(),
                        srcs: vec![
                            Src::V(part),
                            Src::V(Dsd::strided(at + carry.to, carry.mine, 1, &[every], None)),
                        ],
                    },
                ));
            }
            let (send, recv) = links.bwd;
            bwd.push(link(dx, (t * (a + pass), 1), &[], send, recv));
        }
        // dW[i, :] += x[t, i] dy[t, :], over the tokens and the inputs
        if a > 0 && b > 0 {
            bwd.push(taps(
                &[t, a],
                Dsd::strided(dw, b, 1, &[0, b], None),
                Dsd::strided(dy, b, 1, &[b, 0], None),
                Dsd::strided(xs, b, 0, &[a, 1], self.by(1, t * a)),
            ));
        }
        bwd.push(self.count(1));
        Ok((fwd, bwd))
    }
}
