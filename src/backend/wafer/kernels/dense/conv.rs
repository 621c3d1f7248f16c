//! A convolution's forward and backward bodies on a PE: its channels padded into planes,
//! one vector operation per filter tap, input channel and output channel.

use super::super::super::isa::{Dsd, Instr, Program, Src, VecOp};
use super::super::nest;
use super::chain::{link, receive, taps, zero};
use super::Geom;
use super::{Back, Block, Dense};

impl Dense {
    /// A convolution's forward and backward bodies on a PE with `a` input channels and
    /// `b` output channels (filter block as `[r][s][a][b]`).
    pub(super) fn conv(
        &self,
        p: &mut Program,
        g: Geom,
        (a, b): (u32, u32),
        Block {
            w,
            dw,
            c,
            links,
            carry,
            ..
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
        let mut fwd = vec![take];
        // a residual's image (its input's, or one it passes on, which comes after its
        // input): its row's channels after the outputs, each PE adding its column's
        let px = carry.px;
        let carried = if carry.pass > 0 {
            let buf = p.alloc("passed", carry.pass * px);
            fwd.push(receive(Dsd::mem(buf, carry.pass * px), c.x));
            Dsd::mem(buf + carry.at * px, carry.mine * px)
        } else {
            Dsd::strided(
                xs + carry.at * px,
                carry.mine * px,
                1,
                &[],
                self.by(0, a * plane_in),
            )
        };
        let cw = carry.row * px;
        let chain = (cw > 0).then(|| p.alloc("carried", cw));
        fwd.extend([
            pad(0),
            zero(y, b * plane_out),
            taps(tap_loops, yout.clone(), wt.clone(), xin.clone()),
        ]);
        let (send, recv) = links.fwd;
        fwd.push(link(
            y,
            (g.wo, sw),
            &[(b, plane_out), (g.ho, row)],
            send,
            recv,
        ));
        if let Some(chain) = chain {
            fwd.push(zero(chain, cw));
            if carry.mine > 0 {
                fwd.push(Instr::Vec {
                    op: VecOp::Mov,
                    dst: Dsd::mem(chain + carry.to * px, carry.mine * px),
                    srcs: vec![Src::V(carried)],
                });
            }
            fwd.push(link(chain, (cw, 1), &[], send, recv));
        }
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
        // the residual's gradient, channel `ch` of the row's carried ones as rows of `w`
        // words `h` deep (`nest`ed over channels, then rows): after the output gradient
        // (received beside it), or the output gradient itself
        let skip = match self.carry {
            Some(Back::Beside) if cw > 0 => {
                let d = p.alloc("skip dy", cw);
                bwd.push(receive(Dsd::mem(d, cw), c.dy));
                Some(Skip::Beside(d))
            }
            Some(Back::Same) => Some(Skip::Same),
            _ => None,
        };
        let skip_rows = |ch: u32, w: u32| match skip {
            Some(Skip::Beside(d)) => Dsd::strided(d + ch * px, w, 1, &[px, w], None),
            _ => Dsd::strided(y + ch * plane_out, w, 1, &[plane_out, row], None),
        };
        // (its channels' planes as rows: the output plane's for the gradient itself)
        let plane = match skip {
            Some(Skip::Same) => (g.wo, g.ho),
            _ => (px, 1),
        };
        let add_skip = |dst: Dsd, w: u32, h: u32| {
            nest(
                &[carry.mine, h],
                Instr::Vec {
                    op: VecOp::Add,
                    dst: dst.clone(),
                    srcs: vec![Src::V(dst), Src::V(skip_rows(carry.to, w))],
                },
            )
        };
        if self.dx {
            // the input gradient: each output's gradient back through every tap
            bwd.push(zero(xp, a * plane_pad));
            bwd.push(taps(tap_loops, xin.clone(), wt, yout.clone()));
            if skip.is_some() && carry.pass == 0 && carry.mine > 0 {
                // (its own input carried: the skip's gradient of its column's channels)
                let dst = Dsd::strided(
                    xp + inner + carry.at * plane_pad,
                    g.w,
                    1,
                    &[plane_pad, wp],
                    None,
                );
                let (w, h) = match skip {
                    Some(Skip::Same) => (g.wo, g.ho),
                    _ => (g.w, g.h),
                };
                bwd.push(add_skip(dst, w, h));
            }
            let (send, recv) = links.bwd;
            bwd.push(link(
                xp + inner,
                (g.w, 1),
                &[(a, plane_pad), (g.h, wp)],
                send,
                recv,
            ));
            bwd.push(zero(xp, a * plane_pad));
            if skip.is_some() && carry.pass > 0 {
                // (a value passed on: its gradient after the input gradient, this
                // column's channels from this PE's row, zeros elsewhere)
                let words = carry.pass * px;
                let d = p.alloc("passed dx", words);
                bwd.push(zero(d, words));
                if carry.mine > 0 {
                    let (w, h) = plane;
                    let dst = Dsd::strided(d + carry.at * px, w, 1, &[px, w], None);
                    bwd.push(add_skip(dst, w, h));
                }
                bwd.push(link(d, (words, 1), &[], send, recv));
            }
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

/// Where a convolution that carries a residual's image finds that image's gradient: in
/// its own buffer (at a word), after the output gradient; or in the output gradient's
/// planes (`Back::Same`).
#[derive(Debug, Clone, Copy)]
enum Skip {
    Beside(u32),
    Same,
}
