//! A convolution's forward and backward bodies on a PE: its channels padded into planes,
//! one vector operation per filter tap, input channel and output channel (in bands of
//! rows, its band's part: `Geom::band`; or, a PE whose bands meet no output, a relay of
//! the chains); and a transposed convolution's, the same operations with the passes'
//! roles swapped.

use super::super::super::isa::{Colour, Dsd, Instr, Program, Src, Task, Trigger, VecOp};
use super::super::{nest, Share};
use super::chain::{link, receive, taps, zero};
use super::shape::Planes;
use super::{Back, Block, Carrying, Colours, Dense, Geom, Shape};

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
        let (wp, sw) = (g.wp(), g.stride.1);
        // (the taps run over the output rows the input reaches, `at` words in)
        let (at, span) = g.reached_span();
        // (an output row's strided outputs are `sw` apart, the rows `row`)
        let Planes {
            pad,
            out,
            inner,
            top,
            row,
        } = g.planes();
        let (plane_in, plane_pad, plane_out) = (g.h * g.w, pad, out);
        let (xs, take) = self.stash(p, "x stash", a * plane_in, c.x);
        // the padded input (its border stays zero), also the input gradient's planes
        let xp = p.alloc("padded x", a * plane_pad);
        // the output planes at pitch wp, also the output gradient's
        let y = p.alloc("y", b * plane_out);
        // the stashed slot's channels into the padded planes' interiors
        let into_pad = Dsd::strided(xp + inner, g.w, 1, &[plane_pad, wp], None);
        let pad = |k: u8| self.slot_planes((xs, k), (a, g.h, g.w), into_pad.clone());
        let tap_loops = [g.r, g.s, a, b];
        let wt = Dsd::strided(w, span, 0, &[g.s * a * b, a * b, b, 1], None);
        let xin = Dsd::strided(
            xp + top + at,
            span,
            1,
            &[g.dil.0 * wp, g.dil.1, plane_pad, 0],
            None,
        );
        let yout = Dsd::strided(y + at, span, 1, &[0, 0, 0, plane_out], None);
        let mut fwd = vec![take];
        let (passed, carried) = self.carried_image(p, carry, (xs, a * plane_in), c.x, links.fwd);
        fwd.extend(passed);
        fwd.extend([
            pad(0),
            zero(y, b * plane_out),
            taps(&tap_loops, yout.clone(), wt.clone(), xin.clone()),
        ]);
        let (send, recv) = links.fwd;
        let outputs = link(y, (g.wo, sw), &[(b, plane_out), (g.ho, row)], send, recv);
        // (a shortcut's input goes ahead of its outputs: `Dense::first`)
        fwd.extend(self.in_order(outputs, carried));
        if self.train {
            fwd.push(self.count(0));
        }
        let Some(dw) = dw else {
            return (fwd, Vec::new());
        };
        // the output gradient into the output planes (the words past each row zero)
        let mut bwd = vec![zero(y, b * plane_out)];
        let dy = nest(
            &[b, g.ho],
            receive(
                Dsd::strided(y, g.wo, sw as i32, &[plane_out, row], None),
                c.dy,
            ),
        );
        // the residual's image's gradient, received after the output gradient (a
        // shortcut's: before it) or the output gradient itself
        let (px, banded) = (carry.px, carry.rows);
        let (skip, take) = match self.carry {
            Some(Back::Beside) if carry.row > 0 => {
                let d = p.alloc("skip dy", carry.row * px);
                let take = receive(Dsd::mem(d, carry.row * px), c.dy);
                (Some(Skip::Beside(d)), Some(take))
            }
            Some(Back::Same) => (Some(Skip::Same((y, (g.ho, plane_out, row)))), None),
            _ => (None, None),
        };
        bwd.extend(self.in_order(dy, take.into_iter().collect()));
        if self.dx {
            // the input gradient: each output's gradient back through every tap
            bwd.push(zero(xp, a * plane_pad));
            bwd.push(taps(&tap_loops, xin.clone(), wt, yout.clone()));
            if let (Some(skip), 0, 1..) = (skip, carry.pass, carry.mine) {
                // (its own input carried: the skip's gradient of its column's channels,
                // or rows, in their padded planes)
                let (start, unit) = carry.place(carry.at, (g.h, plane_pad, wp));
                let dst = Dsd::strided(xp + inner + start, g.w, 1, &[unit, wp], None);
                let (w, h) = match skip {
                    Skip::Same(_) => (g.wo, g.ho),
                    Skip::Beside(_) => (g.w, g.h),
                };
                let h = if banded { 1 } else { h };
                bwd.push(skip.added(carry, dst, (w, h)));
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
            if let (Some(skip), 1..) = (skip, carry.pass) {
                // (a value passed on: its gradient after the input gradient, this
                // column's channels from this PE's row, zeros elsewhere)
                let words = carry.pass * px;
                let d = p.alloc("passed dx", words);
                bwd.push(zero(d, words));
                if carry.mine > 0 {
                    // (its channels' planes as rows: the output planes' for the output
                    // gradient itself)
                    let (w, h) = match skip {
                        Skip::Same(_) => (g.wo, if banded { 1 } else { g.ho }),
                        Skip::Beside(_) => (px, 1),
                    };
                    let dst = Dsd::strided(d + carry.at * px, w, 1, &[px, w], None);
                    bwd.push(skip.added(carry, dst, (w, h)));
                }
                bwd.push(link(d, (words, 1), &[], send, recv));
            }
        }
        // the filter's gradient: per tap, the dot product of the shifted input and the
        // output gradient
        bwd.push(pad(1));
        let acc = Dsd::strided(dw, span, 0, &[g.s * a * b, a * b, b, 1], None);
        bwd.push(taps(&tap_loops, acc, xin, yout));
        bwd.push(self.count(1));
        (fwd, bwd)
    }

    /// A transposed convolution's forward and backward bodies on a PE with `a` input
    /// channels and `b` output channels: the input gradient of the convolution `g`
    /// (whose outputs are this layer's inputs, and whose inputs its outputs; filter
    /// block as `[r][s][b][a]`, that convolution's `[r][s][in][out]`). Forward, that
    /// convolution's backward body: the input at its strided places in output planes,
    /// every tap into padded planes whose interior is the output. Backward, its
    /// forward body from the output gradient in the padded planes (the input gradient),
    /// and its filter gradient with the stashed input as its output gradient.
    pub(super) fn conv_t(
        &self,
        p: &mut Program,
        g: Geom,
        (a, b): (u32, u32),
        Block {
            w, dw, c, links, ..
        }: Block,
    ) -> (Vec<Instr>, Vec<Instr>) {
        let (wp, span, sw) = (g.wp(), g.span(), g.stride.1);
        let Planes {
            pad,
            out,
            inner,
            top,
            row,
        } = g.planes();
        let (plane_in, plane_pad, plane_out) = (g.ho * g.wo, pad, out);
        let (xs, take) = self.stash(p, "x stash", a * plane_in, c.x);
        // the outputs at the padding (the border is computed and never sent), also
        // the output gradient's planes
        let yp = p.alloc("padded y", b * plane_pad);
        // the inputs at their strided places, zeros between, at pitch wp
        let x = p.alloc("strided x", a * plane_out);
        // the stashed slot's planes at their strided places
        let strided = Dsd::strided(x, g.wo, sw as i32, &[plane_out, row], None);
        let spread = |k: u8| self.slot_planes((xs, k), (a, g.ho, g.wo), strided.clone());
        let tap_loops = [g.r, g.s, b, a];
        let wt = Dsd::strided(w, span, 0, &[g.s * b * a, b * a, a, 1], None);
        let ypad = Dsd::strided(
            yp + top,
            span,
            1,
            &[g.dil.0 * wp, g.dil.1, plane_pad, 0],
            None,
        );
        let xin = Dsd::strided(x, span, 1, &[0, 0, 0, plane_out], None);
        let mut fwd = vec![
            take,
            zero(x, a * plane_out),
            spread(0),
            zero(yp, b * plane_pad),
            taps(&tap_loops, ypad.clone(), wt.clone(), xin.clone()),
        ];
        let (send, recv) = links.fwd;
        fwd.push(link(
            yp + inner,
            (g.w, 1),
            &[(b, plane_pad), (g.h, wp)],
            send,
            recv,
        ));
        if self.train {
            fwd.push(self.count(0));
        }
        let Some(dw) = dw else {
            return (fwd, Vec::new());
        };
        // the output gradient into the padded planes' interior
        let mut bwd = vec![
            zero(yp, b * plane_pad),
            nest(
                &[b, g.h],
                receive(
                    Dsd::strided(yp + inner, g.w, 1, &[plane_pad, wp], None),
                    c.dy,
                ),
            ),
        ];
        if self.dx {
            // the input gradient: the convolution's forward body, its strided outputs
            bwd.push(zero(x, a * plane_out));
            bwd.push(taps(&tap_loops, xin.clone(), wt, ypad.clone()));
            let (send, recv) = links.bwd;
            bwd.push(link(
                x,
                (g.wo, sw),
                &[(a, plane_out), (g.ho, row)],
                send,
                recv,
            ));
        }
        // the filter's gradient: per tap, the dot product of the shifted output
        // gradient and the input at its strided places
        bwd.extend([zero(x, a * plane_out), spread(1)]);
        let acc = Dsd::strided(dw, span, 0, &[g.s * b * a, b * a, a, 1], None);
        bwd.push(taps(&tap_loops, acc, ypad, xin));
        bwd.push(self.count(1));
        (fwd, bwd)
    }

    /// PE `(i, j)` of a `wc x hr` convolution in bands whose input band gives its
    /// output band nothing (`Geom::band`): it takes its column's inputs and its row's
    /// output gradients as the others do, keeping none, and passes its row's and its
    /// column's partial sums on (zeros where a chain starts). Of an image the layer
    /// carries (`carry`), it passes its row's chain on too, adding the rows it holds
    /// (`Carrying::mine`: kept from the sample's input, or from the share of an image
    /// passed on), and their gradient to its column's input gradient (or to the passed
    /// image's).
    pub(super) fn relay(
        &self,
        (i, j): (u32, u32),
        (wc, hr): (u32, u32),
        c: Colours,
        (ins, outs): (&Share, &Share),
        carry: Carrying,
    ) -> Program {
        let (w, wo) = match self.shape {
            Shape::Conv(g) => (g.w, g.wo),
            _ => (1, 1),
        };
        let (x, y) = (ins.units() * w, outs.units() * wo);
        let mut p = Program::default();
        let sink = p.alloc("dropped", 1);
        let drop = |len: u32, colour: Colour| Instr::Vec {
            op: VecOp::Mov,
            dst: Dsd::strided(sink, len, 0, &[], None),
            srcs: vec![Src::V(Dsd::In { colour, len })],
        };
        let pass = |len: u32, (send, recv): (Colour, Option<Colour>)| Instr::Vec {
            op: VecOp::Mov,
            dst: Dsd::Out { colour: send, len },
            srcs: vec![recv.map_or(Src::Imm(0.0), |colour| Src::V(Dsd::In { colour, len }))],
        };
        let (px, mine) = (carry.px, carry.mine > 0);
        // a received value kept (when it holds rows of the carried image) or dropped
        let take = |p: &mut Program, name: &str, len: u32, colour: Colour, keep: bool| match keep {
            false => (sink, drop(len, colour)),
            true => {
                let buf = p.alloc(name, len);
                (buf, receive(Dsd::mem(buf, len), colour))
            }
        };
        // (its input, for its rows of the carried input; an image passed on comes after
        // it, which `carried_image` takes)
        let (held, take_x) = take(&mut p, "x", x, c.x, mine && carry.pass == 0);
        let mut fwd = vec![take_x];
        let links = c.forward_link(i, wc);
        let (passed, carried) = self.carried_image(&mut p, carry, (held, x), c.x, links);
        fwd.extend(passed);
        fwd.extend(self.in_order(pass(y, links), carried));
        p.tasks.push(Task {
            id: 0,
            name: "conv relay forward".into(),
            trigger: Trigger::Data(c.x),
            body: fwd,
        });
        if !self.train {
            return p;
        }
        // the output gradient (kept when it is the carried image's: `Back::Same`),
        // and the carried image's gradient after it (a shortcut's: before it)
        let same = self.carry == Some(Back::Same);
        let (dy, take_dy) = take(&mut p, "dy", y, c.dy, mine && same);
        let chain = carry.row * px;
        let (skip, take_skip) = match self.carry {
            Some(Back::Beside) if chain > 0 => {
                let (d, t) = take(&mut p, "skip dy", chain, c.dy, mine);
                (mine.then_some(Skip::Beside(d)), Some(t))
            }
            // (its rows, a row of `wo` words, in the output gradient)
            Some(Back::Same) if mine => {
                let per = outs.rows.len() as u32;
                (Some(Skip::Same((dy, (per, per * wo, wo)))), None)
            }
            _ => (None, None),
        };
        let mut bwd = self.in_order(take_dy, take_skip.into_iter().collect());
        if self.dx {
            let links = c.backward_link(j, hr);
            // the input gradient's (or the passed image's) part: its rows' gradient
            let added = |p: &mut Program, len: u32| match skip {
                Some(skip) => {
                    let buf = p.alloc("relayed dx", len);
                    let dst = Dsd::strided(buf + carry.at * px, px, 1, &[px, px], None);
                    vec![
                        zero(buf, len),
                        skip.added(carry, dst, (px, 1)),
                        link(buf, (len, 1), &[], links.0, links.1),
                    ]
                }
                None => vec![pass(len, links)],
            };
            match carry.pass {
                0 => bwd.extend(added(&mut p, x)),
                n => {
                    bwd.push(pass(x, links));
                    bwd.extend(added(&mut p, n * px));
                }
            }
        }
        self.backward(&mut p, "conv relay backward", bwd, c.dy);
        p
    }

    /// `own` and what the PE carries with it (`carried`) in the order they travel: a
    /// shortcut's carried input ahead of its own values (`first`), another's after.
    fn in_order(&self, own: Instr, carried: Vec<Instr>) -> Vec<Instr> {
        match self.first {
            true => carried.into_iter().chain([own]).collect(),
            false => std::iter::once(own).chain(carried).collect(),
        }
    }

    /// The `a` planes of `h x w` of counter `k`'s slot of a stash at `xs`, moved row by
    /// row into `dst` (which `nest`s channels, then rows).
    fn slot_planes(&self, (xs, k): (u32, u8), (a, h, w): (u32, u32, u32), dst: Dsd) -> Instr {
        let plane = h * w;
        let src = Dsd::strided(xs, w, 1, &[plane, w], self.by(k, a * plane));
        nest(
            &[a, h],
            Instr::Vec {
                op: VecOp::Mov,
                dst,
                srcs: vec![Src::V(src)],
            },
        )
    }

    /// A residual's image that the PE carries (its input's, or one it passes on, which
    /// comes after its input; `carry`): the receive of its column's share of an image
    /// passed on, to follow the input's (`xs`, slots of `slot` words, on colour `x`);
    /// and, after the output planes' link, its row's channels sent on the same chain
    /// (`link`), this PE adding its column's, zeros elsewhere.
    fn carried_image(
        &self,
        p: &mut Program,
        carry: Carrying,
        (xs, slot): (u32, u32),
        x: Colour,
        (send, recv): (Colour, Option<Colour>),
    ) -> (Option<Instr>, Vec<Instr>) {
        let px = carry.px;
        let mut passed = None;
        let mine = if carry.pass > 0 {
            let buf = p.alloc("passed", carry.pass * px);
            passed = Some(receive(Dsd::mem(buf, carry.pass * px), x));
            Dsd::mem(buf + carry.at * px, carry.mine * px)
        } else {
            Dsd::strided(
                xs + carry.at * px,
                carry.mine * px,
                1,
                &[],
                self.by(0, slot),
            )
        };
        let words = carry.row * px;
        if words == 0 {
            return (passed, Vec::new());
        }
        let chain = p.alloc("carried", words);
        let mut out = vec![zero(chain, words)];
        if carry.mine > 0 {
            out.push(Instr::Vec {
                op: VecOp::Mov,
                dst: Dsd::mem(chain + carry.to * px, carry.mine * px),
                srcs: vec![Src::V(mine)],
            });
        }
        out.push(link(chain, (words, 1), &[], send, recv));
        (passed, out)
    }
}

/// Where a convolution that carries a residual's image finds that image's gradient: in
/// its own buffer (at a word), after the output gradient; or in the output gradient's
/// planes (`Back::Same`: where they start, and a plane's rows, its words and the rows'
/// distance, `Carrying::place`'s).
#[derive(Debug, Clone, Copy)]
enum Skip {
    Beside(u32),
    Same((u32, (u32, u32, u32))),
}

impl Skip {
    /// The gradient of the PE's carried channels (`carry.mine` of them, from its row's
    /// `carry.to`), as rows of `w` words `h` deep a channel, added into `dst` (which
    /// `nest`s channels, then rows).
    fn added(self, carry: Carrying, dst: Dsd, (w, h): (u32, u32)) -> Instr {
        let px = carry.px;
        let src = match self {
            Skip::Beside(d) => Dsd::strided(d + carry.to * px, w, 1, &[px, w], None),
            Skip::Same((y, planes)) => {
                let (start, unit) = carry.place(carry.to, planes);
                Dsd::strided(y + start, w, 1, &[unit, planes.2], None)
            }
        };
        nest(
            &[carry.mine, h],
            Instr::Vec {
                op: VecOp::Add,
                dst: dst.clone(),
                srcs: vec![Src::V(dst), Src::V(src)],
            },
        )
    }
}
