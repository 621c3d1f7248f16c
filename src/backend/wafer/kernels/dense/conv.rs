//! A convolution's forward and backward bodies on a PE: its channels padded into planes,
//! one vector operation per filter tap, input channel and output channel.

use super::super::super::isa::{Dsd, Instr, Program, Src, VecOp};
use super::super::nest;
use super::chain::{link, receive, taps, zero};
use super::Geom;
use super::{Block, Dense};

impl Dense {
    /// A convolution's forward and backward bodies on a PE with `a` input channels and
    /// `b` output channels (filter block as `[r][s][a][b]`).
    pub(super) fn conv(
        &self,
        p: &mut Program,
        g: Geom,
        (a, b): (u32, u32),
        Block {
            w, dw, c, links, ..
        }: Block,
    ) -> (Vec<Instr>, Vec<Instr>) {
        let (hp, wp, span) = (g.hp(), g.wp(), g.span());
        let (plane_in, plane_pad, plane_out) = (g.h * g.w, hp * wp, g.h1() * wp);
        // an output row's strided outputs, and the rows' distance, in the planes
        let (sw, row) = (g.stride.1, g.stride.0 * wp);
        let (xs, take) = self.stash(p, "x stash", a * plane_in, c.x);
        // the padded input (its border stays zero), also the input gradient's planes
        let xp = p.alloc("padded x", a * plane_pad);
        // the output planes at pitch wp, also the output gradient's
        let y = p.alloc("y", b * plane_out);
        let inner = g.pad.0 * wp + g.pad.1;
        // the stashed slot's channels into the padded planes' interiors
        let pad = |k: u8| {
            nest(
                &[a, g.h],
                Instr::Vec {
                    op: VecOp::Mov,
                    dst: Dsd::strided(xp + inner, g.w, 1, &[plane_pad, wp], None),
                    srcs: vec![Src::V(Dsd::strided(
                        xs,
                        g.w,
                        1,
                        &[plane_in, g.w],
                        self.by(k, a * plane_in),
                    ))],
                },
            )
        };
        let tap_loops = [g.r, g.s, a, b];
        let wt = Dsd::strided(w, span, 0, &[g.s * a * b, a * b, b, 1], None);
        let xin = Dsd::strided(xp, span, 1, &[g.dil.0 * wp, g.dil.1, plane_pad, 0], None);
        let yout = Dsd::strided(y, span, 1, &[0, 0, 0, plane_out], None);
        let mut fwd = vec![
            take,
            pad(0),
            zero(y, b * plane_out),
            taps(tap_loops, yout.clone(), wt.clone(), xin.clone()),
        ];
        let (send, recv) = links.fwd;
        fwd.push(link(
            y,
            (g.wo, sw),
            &[(b, plane_out), (g.ho, row)],
            send,
            recv,
        ));
        if self.train {
            fwd.push(self.count(0));
        }
        let Some(dw) = dw else {
            return (fwd, Vec::new());
        };
        // the output gradient into the output planes (the words past each row zero)
        let mut bwd = vec![
            zero(y, b * plane_out),
            nest(
                &[b, g.ho],
                receive(
                    Dsd::strided(y, g.wo, sw as i32, &[plane_out, row], None),
                    c.dy,
                ),
            ),
        ];
        if self.dx {
            // the input gradient: each output's gradient back through every tap
            bwd.push(zero(xp, a * plane_pad));
            bwd.push(taps(tap_loops, xin.clone(), wt, yout.clone()));
            let (send, recv) = links.bwd;
            bwd.push(link(
                xp + inner,
                (g.w, 1),
                &[(a, plane_pad), (g.h, wp)],
                send,
                recv,
            ));
            bwd.push(zero(xp, a * plane_pad));
        }
        // the filter's gradient: per tap, the dot product of the shifted input and the
        // output gradient
        bwd.push(pad(1));
        let acc = Dsd::strided(dw, span, 0, &[g.s * a * b, a * b, b, 1], None);
        bwd.push(taps(tap_loops, acc, xin, yout));
        bwd.push(self.count(1));
        (fwd, bwd)
    }
}
