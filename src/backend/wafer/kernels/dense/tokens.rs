//! A dense layer over each token of a sequence on a PE: the forward and backward bodies
//! of `gemv`, each over a sample's `t` tokens in turn.

use super::super::super::isa::{Dsd, Instr, Program};
use super::chain::{link, row_gradient, taps, zero};
use super::{Block, Dense};

impl Dense {
    /// A dense layer over tokens on a PE with `a` inputs and `b` outputs of each of a
    /// sample's `t` tokens, which arrive (and leave) token by token: `[t, a]` in, the
    /// row's partial sums `[t, b]` out; backward, the output gradients `[t, b]` in and
    /// the input gradients' partial sums `[t, a]` out; the weight gradient adds each
    /// token's `x^T dy`. It carries nothing past itself.
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
        if carry.mine > 0 || carry.pass > 0 || row.len != b || row.back_len != b {
            return Err(
                "a residual, a side part or a value passed on around a dense layer over tokens has no wafer kernel yet"
                    .into(),
            );
        }
        let (xs, take) = self.stash(p, "x stash", t * a, c.x);
        let y = p.alloc("y", t * b);
        // y[t, :] += x[t, i] W[i, :], over the tokens and the inputs
        let mut fwd = vec![take, zero(y, t * b)];
        if a > 0 && b > 0 {
            fwd.push(taps(
                &[t, a],
                Dsd::strided(y, b, 1, &[b, 0], None),
                Dsd::strided(w, b, 1, &[0, b], None),
                Dsd::strided(xs, b, 0, &[a, 1], self.by(0, t * a)),
            ));
        }
        let (send, recv) = links.fwd;
        fwd.push(link(y, (t * b, 1), &[], send, recv));
        if self.train {
            fwd.push(self.count(0));
        }
        let Some(dw) = dw else {
            return Ok((fwd, Vec::new()));
        };
        let (dy, take_dy) = row_gradient(p, t * b, c.dy);
        let mut bwd = vec![take_dy];
        if self.dx {
            // dx[t, :] += W[:, o] dy[t, o], over the tokens and the outputs
            let dx = p.alloc("dx", t * a);
            bwd.push(zero(dx, t * a));
            if a > 0 && b > 0 {
                bwd.push(taps(
                    &[t, b],
                    Dsd::strided(dx, a, 1, &[a, 0], None),
                    Dsd::strided(w, a, b as i32, &[0, 1], None),
                    Dsd::strided(dy, a, 0, &[b, 1], None),
                ));
            }
            let (send, recv) = links.bwd;
            bwd.push(link(dx, (t * a, 1), &[], send, recv));
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
