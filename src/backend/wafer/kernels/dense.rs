//! A dense layer `y = x W` (`k` inputs, `n` outputs) on a `w x h` frame, one sample at
//! a time, on the checkerboard GEMV mapping of `../shared/wafer/design.md` §1.3: PE
//! `(i, j)` holds the block of `W` whose rows are column `i`'s inputs and whose columns
//! are row `j`'s outputs.
//!
//! - **Forward.** Column `i`'s slice of a sample enters at the north edge and is
//!   multicast down the column; each PE stashes it (for the weight gradient) and
//!   multiplies it by its block into a partial `y`; the partials of a row are summed
//!   along a chain from west to east on two alternating colours (a PE cannot receive
//!   and send one colour on a fixed route), and row `j`'s outputs leave at the east
//!   edge.
//! - **Backward.** Row `j`'s slice of `dy` enters at the east edge and is multicast west
//!   along the row; each PE multiplies its block by it into a partial `dx` (summed along
//!   a chain from south to north, leaving at the north edge: the input gradient) and
//!   adds the outer product of the stashed `x` slice and `dy` to its block of `dW`.
//! - **Update.** Once per step, launched by the host: the optimiser's elementwise code
//!   over the PE's blocks of `W`, its slots and `dW` (which it then zeroes).

use super::super::isa::{Colour, Dsd, Instr, Program, Src, Task, Trigger, VecOp};
use super::super::lower::{Scratch, Update, Val};
use super::super::sim::Dir;
use super::{split, used, Laid, Orient, Piece, UPDATE};
use std::sync::Arc;

/// The layer's sizes, the samples of a step, and what it computes besides the forward
/// pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Dense {
    pub k: u32,
    pub n: u32,
    pub batch: u32,
    /// Whether it trains: the backward pass, the weight gradient and the update.
    pub train: bool,
    /// Whether it sends the input gradient back (not for a first layer).
    pub dx: bool,
    /// The tensors' names: the weight, then its optimiser slots (the update's
    /// variables, in order); the weight gradient; the host's values the update reads.
    pub vars: Vec<String>,
    pub grad: String,
    pub hosts: Vec<String>,
    pub update: Update,
}

/// The colours a dense kernel uses: its streams (inputs in, outputs out, output
/// gradients in, input gradients out) and the two pairs its chains alternate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Colours {
    pub x: Colour,
    pub y: Colour,
    pub dy: Colour,
    pub dx: Colour,
    pub chain: [Colour; 2],
    pub dchain: [Colour; 2],
}

impl Colours {
    /// Column `i` of `wc`'s link in the forward chain: the colour it sends its partial
    /// sums on (the outputs' at the east end), and the one it receives them on (none at
    /// the west end).
    fn forward_link(&self, i: u32, wc: u32) -> (Colour, Option<Colour>) {
        let send = if i + 1 == wc {
            self.y
        } else {
            self.chain[(i % 2) as usize]
        };
        (send, i.checked_sub(1).map(|p| self.chain[(p % 2) as usize]))
    }

    /// Row `j` of `hr`'s link in the input gradients' chain, south to north: the colour
    /// it sends on (the input gradients' at the north end), and the one it receives on
    /// (none at the south end).
    fn backward_link(&self, j: u32, hr: u32) -> (Colour, Option<Colour>) {
        let send = if j == 0 {
            self.dx
        } else {
            self.dchain[(j % 2) as usize]
        };
        (
            send,
            (j + 1 < hr).then(|| self.dchain[((j + 1) % 2) as usize]),
        )
    }
}

/// `len` words at `acc` set to zero.
fn zero(acc: u32, len: u32) -> Instr {
    Instr::Vec {
        op: VecOp::Mov,
        dst: Dsd::mem(acc, len),
        srcs: vec![Src::Imm(0.0)],
    }
}

/// `acc[..len] += w * x` over `count` iterations of a loop whose counter moves the
/// descriptors `w` and `x` (a product's partial sums, one input at a time).
fn macs(acc: u32, len: u32, count: u32, w: Dsd, x: Dsd) -> Instr {
    let a = Dsd::mem(acc, len);
    Instr::Loop {
        count,
        body: vec![Instr::Vec {
            op: VecOp::Fmac,
            dst: a.clone(),
            srcs: vec![Src::V(a), Src::V(w), Src::V(x)],
        }],
    }
}

/// A chain's link: the `len` partial sums at `part`, plus those received on `recv` if
/// any, sent on `send`.
fn link(part: u32, len: u32, send: Colour, recv: Option<Colour>) -> Instr {
    let dst = Dsd::Out { colour: send, len };
    let mine = Src::V(Dsd::mem(part, len));
    match recv {
        None => Instr::Vec {
            op: VecOp::Mov,
            dst,
            srcs: vec![mine],
        },
        Some(colour) => Instr::Vec {
            op: VecOp::Add,
            dst,
            srcs: vec![mine, Src::V(Dsd::In { colour, len })],
        },
    }
}

impl Dense {
    /// A forward-only layer (eval, predict, tests).
    pub fn forward_only(k: u32, n: u32, batch: u32) -> Dense {
        Dense {
            k,
            n,
            batch,
            train: false,
            dx: false,
            vars: vec!["W".into()],
            grad: "dW".into(),
            hosts: Vec::new(),
            update: Update::default(),
        }
    }

    /// The columns and rows of a `w x h` frame that hold a block (each part gets
    /// `ceil(k / w)` inputs, so fewer columns may do).
    pub fn used(&self, w: u32, h: u32) -> (u32, u32) {
        (used(self.k, w), used(self.n, h))
    }

    /// Lays the layer out on a `w x h` frame at `origin`, oriented `o`. Column `i`
    /// takes inputs `split(k, w, i)`; row `j` gives outputs `split(n, h, j)`, one
    /// sample after another.
    pub fn lay(
        &self,
        origin: (u32, u32),
        o: Orient,
        (w, h): (u32, u32),
        c: Colours,
    ) -> Result<Laid, String> {
        let (wc, hr) = self.used(w, h);
        let mut laid = Laid::default();
        for i in 0..wc {
            let ks = split(self.k, wc, i);
            let a = ks.len() as u32;
            for j in 0..hr {
                let ns = split(self.n, hr, j);
                let b = ns.len() as u32;
                let at = o.at(origin, i, j);
                let p = self.program(i, j, (wc, hr), (a, b), c, &mut laid, at, &ks, &ns)?;
                let words = p.words() as usize;
                laid.pes.insert(at, (Arc::new(p), vec![0.0; words]));
                self.routes(i, j, (wc, hr), c, o, at, &mut laid)?;
            }
        }
        Ok(laid)
    }

    #[allow(clippy::too_many_arguments)]
    fn program(
        &self,
        i: u32,
        j: u32,
        (wc, hr): (u32, u32),
        (a, b): (u32, u32),
        c: Colours,
        laid: &mut Laid,
        at: (u32, u32),
        ks: &std::ops::Range<u32>,
        ns: &std::ops::Range<u32>,
    ) -> Result<Program, String> {
        let mut p = Program::default();
        let block = |k0: u32| -> Vec<(u32, u32)> {
            (0..a)
                .map(|kk| ((k0 + kk) * self.n + ns.start, b))
                .collect()
        };
        let nvars = if self.train { self.vars.len() } else { 1 };
        let mut vars = Vec::new();
        for name in &self.vars[..nvars] {
            let base = p.alloc(name, a * b);
            laid.tensors.entry(name.clone()).or_default().push(Piece {
                pe: at,
                word: base,
                runs: block(ks.start),
            });
            vars.push(Val::buf(base, a * b));
        }
        let w = match vars[0] {
            Val::Buf { base, .. } => base,
            Val::Imm(_) => 0,
        };
        let mut hosts = Vec::new();
        let dw = if self.train {
            let base = p.alloc(&self.grad, a * b);
            laid.tensors
                .entry(self.grad.clone())
                .or_default()
                .push(Piece {
                    pe: at,
                    word: base,
                    runs: block(ks.start),
                });
            for name in &self.hosts {
                let base = p.alloc(name, 1);
                laid.tensors.entry(name.clone()).or_default().push(Piece {
                    pe: at,
                    word: base,
                    runs: vec![(0, 1)],
                });
                hosts.push(Val::buf(base, 1));
            }
            Some(base)
        } else {
            None
        };
        let slots = if self.train { self.batch } else { 1 };
        let xs = p.alloc("x stash", slots * a);
        let y = p.alloc("y", b);
        let by = |k: u8| self.train.then_some((k, a as i32));
        // forward
        let mut body = vec![
            Instr::Vec {
                op: VecOp::Mov,
                dst: Dsd::Mem {
                    base: xs,
                    len: a,
                    stride: 1,
                    step: vec![],
                    by: by(0),
                },
                srcs: vec![Src::V(Dsd::In {
                    colour: c.x,
                    len: a,
                })],
            },
            zero(y, b),
            macs(
                y,
                b,
                a,
                Dsd::Mem {
                    base: w,
                    len: b,
                    stride: 1,
                    step: vec![b as i32],
                    by: None,
                },
                Dsd::Mem {
                    base: xs,
                    len: b,
                    stride: 0,
                    step: vec![1],
                    by: by(0),
                },
            ),
        ];
        let (send, recv) = c.forward_link(i, wc);
        body.push(link(y, b, send, recv));
        if self.train {
            body.push(Instr::Count {
                counter: 0,
                every: self.batch,
                then: None,
            });
        }
        p.tasks.push(Task {
            id: 0,
            name: "dense forward".into(),
            trigger: Trigger::Data(c.x),
            body,
        });
        let Some(dw) = dw else {
            return Ok(p);
        };
        // backward
        let dy = p.alloc("dy", b);
        let mut body = vec![Instr::Vec {
            op: VecOp::Mov,
            dst: Dsd::mem(dy, b),
            srcs: vec![Src::V(Dsd::In {
                colour: c.dy,
                len: b,
            })],
        }];
        if self.dx {
            let dxp = p.alloc("dx", a);
            body.push(zero(dxp, a));
            body.push(macs(
                dxp,
                a,
                b,
                Dsd::Mem {
                    base: w,
                    len: a,
                    stride: b as i32,
                    step: vec![1],
                    by: None,
                },
                Dsd::Mem {
                    base: dy,
                    len: a,
                    stride: 0,
                    step: vec![1],
                    by: None,
                },
            ));
            let (send, recv) = c.backward_link(j, hr);
            body.push(link(dxp, a, send, recv));
        }
        body.push(Instr::Loop {
            count: a,
            body: vec![Instr::Vec {
                op: VecOp::Fmac,
                dst: Dsd::Mem {
                    base: dw,
                    len: b,
                    stride: 1,
                    step: vec![b as i32],
                    by: None,
                },
                srcs: vec![
                    Src::V(Dsd::Mem {
                        base: dw,
                        len: b,
                        stride: 1,
                        step: vec![b as i32],
                        by: None,
                    }),
                    Src::V(Dsd::mem(dy, b)),
                    Src::V(Dsd::Mem {
                        base: xs,
                        len: b,
                        stride: 0,
                        step: vec![1],
                        by: by(1),
                    }),
                ],
            }],
        });
        body.push(Instr::Count {
            counter: 1,
            every: self.batch,
            then: None,
        });
        p.tasks.push(Task {
            id: 1,
            name: "dense backward".into(),
            trigger: Trigger::Data(c.dy),
            body,
        });
        // the update, over the blocks
        let mut scratch = Scratch::new(p.words());
        let body = self
            .update
            .code(&vars, &[Val::buf(dw, a * b)], &hosts, a * b, &mut scratch)?;
        if scratch.high > 0 {
            p.alloc("scratch", scratch.high);
        }
        p.tasks.push(Task {
            id: UPDATE,
            name: "dense update".into(),
            trigger: Trigger::Local { at_start: false },
            body,
        });
        Ok(p)
    }

    #[allow(clippy::too_many_arguments)]
    fn routes(
        &self,
        i: u32,
        j: u32,
        (wc, hr): (u32, u32),
        c: Colours,
        o: Orient,
        at: (u32, u32),
        laid: &mut Laid,
    ) -> Result<(), String> {
        // the inputs come down the column
        let down: &[Dir] = if j + 1 < hr {
            &[Dir::Ramp, Dir::S]
        } else {
            &[Dir::Ramp]
        };
        laid.route(at, c.x, o.route(Dir::N, down))?;
        // the partial sums go east, the last ones out
        let (send, recv) = c.forward_link(i, wc);
        laid.route(at, send, o.route(Dir::Ramp, &[Dir::E]))?;
        if let Some(r) = recv {
            laid.route(at, r, o.route(Dir::W, &[Dir::Ramp]))?;
        }
        if !self.train {
            return Ok(());
        }
        // the output gradients come west along the row
        let west: &[Dir] = if i > 0 {
            &[Dir::Ramp, Dir::W]
        } else {
            &[Dir::Ramp]
        };
        laid.route(at, c.dy, o.route(Dir::E, west))?;
        if self.dx {
            // the input gradients' partial sums go north, the last ones out
            let (send, recv) = c.backward_link(j, hr);
            laid.route(at, send, o.route(Dir::Ramp, &[Dir::N]))?;
            if let Some(r) = recv {
                laid.route(at, r, o.route(Dir::S, &[Dir::Ramp]))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::wafer::fabric::Fabric;
    use crate::backend::wafer::kernels::{gather, scatter};
    use crate::backend::wafer::lower::{Operand, UpdateOp};
    use crate::backend::wafer::sim::{HostIn, Setup, Sim};
    use crate::ir::{BinaryOp, DType, Op};
    use proptest::prelude::*;

    const C: Colours = Colours {
        x: 4,
        y: 5,
        dy: 6,
        dx: 7,
        chain: [0, 1],
        dchain: [2, 3],
    };

    /// SGD: `W - lr * dW`, lr the host's value 0.
    fn sgd() -> Update {
        let op = |op, args: Vec<Operand>, full| UpdateOp {
            op,
            args,
            full,
            types: (DType::F32, DType::F32),
        };
        Update {
            ops: vec![
                op(
                    Op::Binary(BinaryOp::Mul),
                    vec![Operand::Acc(0), Operand::Host(0)],
                    true,
                ),
                op(
                    Op::Binary(BinaryOp::Sub),
                    vec![Operand::Var(0), Operand::Val(0)],
                    true,
                ),
            ],
            commits: vec![(0, Operand::Val(1))],
        }
    }

    struct Run {
        y: Vec<f32>,
        dx: Vec<f32>,
        dw: Vec<f32>,
        w: Vec<f32>,
        /// The cycle the forward pass ended.
        forward: u64,
    }

    /// Runs `d` on a `w x h` frame against the fabric's edges (oriented `o`): the
    /// forward pass over the samples `x`, then (training) the backward pass over `dy`
    /// and the update with learning rate `lr`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        d: &Dense,
        o: Orient,
        (w, h): (u32, u32),
        x: &[f32],
        dy: &[f32],
        weights: &[f32],
        lr: f32,
    ) -> Run {
        let f = Fabric::named("test32").unwrap();
        let (wc, hr) = d.used(w, h);
        let (fw, fh) = o.size(wc, hr);
        // inputs at the fabric's edge, outputs off the opposite one
        let origin = match o {
            Orient::North => (f.width - fw, 0),
            Orient::West => (0, f.height - fh),
        };
        let laid = d.lay(origin, o, (w, h), C).unwrap();
        let mut setup = Setup {
            pes: laid.pes.clone(),
            routes: laid.routes.clone(),
            inputs: Vec::new(),
        };
        for i in 0..wc {
            let (px, py) = o.at(origin, i, 0);
            setup.inputs.push(HostIn {
                x: px,
                y: py,
                colour: C.x,
                values: vec![],
            });
        }
        if d.train {
            for j in 0..hr {
                let (px, py) = o.at(origin, wc - 1, j);
                setup.inputs.push(HostIn {
                    x: px,
                    y: py,
                    colour: C.dy,
                    values: vec![],
                });
            }
        }
        let mut sim = Sim::new(&f, &setup).unwrap();
        scatter(&laid.tensors["W"], weights, |(x, y), a, v| {
            assert!(sim.write(x, y, a, v))
        });
        if d.train {
            scatter(&laid.tensors["lr"], &[lr], |(x, y), a, v| {
                assert!(sim.write(x, y, a, v))
            });
        }
        for i in 0..wc {
            let ks = split(d.k, wc, i);
            let values: Vec<f32> = (0..d.batch)
                .flat_map(|s| ks.clone().map(move |k| x[(s * d.k + k) as usize]))
                .collect();
            let (px, py) = o.at(origin, i, 0);
            assert!(sim.feed(px, py, C.x, &values));
        }
        let forward = sim.run().unwrap();
        let mut y = vec![f32::NAN; (d.batch * d.n) as usize];
        for j in 0..hr {
            let ns = split(d.n, hr, j);
            let (px, py) = o.at(origin, wc - 1, j);
            let out = sim.output(px, py, o.dir(Dir::E), C.y);
            assert_eq!(out.len() as u32, d.batch * ns.len() as u32);
            for (t, &(_, v)) in out.iter().enumerate() {
                let (s, m) = (t as u32 / ns.len() as u32, t as u32 % ns.len() as u32);
                y[(s * d.n + ns.start + m) as usize] = v;
            }
        }
        let mut r = Run {
            y,
            dx: vec![],
            dw: vec![],
            w: vec![],
            forward,
        };
        if !d.train {
            return r;
        }
        for j in 0..hr {
            let ns = split(d.n, hr, j);
            let values: Vec<f32> = (0..d.batch)
                .flat_map(|s| ns.clone().map(move |n| dy[(s * d.n + n) as usize]))
                .collect();
            let (px, py) = o.at(origin, wc - 1, j);
            assert!(sim.feed(px, py, C.dy, &values));
        }
        sim.run().unwrap();
        if d.dx {
            r.dx = vec![f32::NAN; (d.batch * d.k) as usize];
            for i in 0..wc {
                let ks = split(d.k, wc, i);
                let (px, py) = o.at(origin, i, 0);
                let out = sim.output(px, py, o.dir(Dir::N), C.dx);
                assert_eq!(out.len() as u32, d.batch * ks.len() as u32);
                for (t, &(_, v)) in out.iter().enumerate() {
                    let (s, m) = (t as u32 / ks.len() as u32, t as u32 % ks.len() as u32);
                    r.dx[(s * d.k + ks.start + m) as usize] = v;
                }
            }
        }
        let kn = (d.k * d.n) as usize;
        r.dw = gather(&laid.tensors["dW"], kn, |(x, y)| sim.memory(x, y));
        for (x, y) in laid.pes.keys() {
            assert!(sim.launch(*x, *y, UPDATE));
        }
        sim.run().unwrap();
        r.w = gather(&laid.tensors["W"], kn, |(x, y)| sim.memory(x, y));
        // the gradient is zeroed for the next step
        assert!(gather(&laid.tensors["dW"], kn, |(x, y)| sim.memory(x, y))
            .iter()
            .all(|&v| v == 0.0));
        r
    }

    fn trained(k: u32, n: u32, batch: u32, dx: bool) -> Dense {
        Dense {
            k,
            n,
            batch,
            train: true,
            dx,
            vars: vec!["W".into()],
            grad: "dW".into(),
            hosts: vec!["lr".into()],
            update: sgd(),
        }
    }

    /// Within `tol` of the sum of the terms' magnitudes (the wafer sums in another
    /// order than a CPU: each PE's terms in order, then the PEs' partials along the
    /// chain).
    fn close(got: f32, terms: impl Iterator<Item = f64> + Clone, tol: f64) -> Result<(), String> {
        let exact: f64 = terms.clone().sum();
        let scale: f64 = terms.map(f64::abs).sum();
        let got = f64::from(got);
        if (got - exact).abs() <= tol * scale + 1e-7 {
            Ok(())
        } else {
            Err(format!("{got}, not {exact}"))
        }
    }

    fn uniforms(seed: u64, at: u64, n: u32) -> Vec<f32> {
        crate::rng::Stream::new(seed, 0)
            .uniforms(at, n as usize, 0)
            .iter()
            .map(|u| u * 2.0 - 1.0)
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]
        /// The forward pass, the input and weight gradients and an SGD update, against
        /// the same products in f64: within 1e-5 of the sum of the terms' magnitudes.
        #[test]
        fn training_equals_the_products(
            k in 1u32..30, n in 1u32..30, batch in 1u32..4, w in 1u32..7, h in 1u32..7,
            seed in 0u64..1000, west in any::<bool>(), dx in any::<bool>(),
        ) {
            let d = trained(k, n, batch, dx);
            let x = uniforms(seed, 0, batch * k);
            let wt = uniforms(seed, 1 << 20, k * n);
            let dy = uniforms(seed, 2 << 20, batch * n);
            let lr = 0.25;
            let o = if west { Orient::West } else { Orient::North };
            let r = run(&d, o, (w, h), &x, &dy, &wt, lr);
            let (x64, w64, dy64) = (|i: u32| f64::from(x[i as usize]), |i: u32| f64::from(wt[i as usize]), |i: u32| f64::from(dy[i as usize]));
            for s in 0..batch {
                for m in 0..n {
                    close(r.y[(s * n + m) as usize], (0..k).map(|kk| x64(s * k + kk) * w64(kk * n + m)), 1e-5)
                        .map_err(|e| TestCaseError::fail(format!("y[{s}][{m}] = {e}")))?;
                }
                if dx {
                    for kk in 0..k {
                        close(r.dx[(s * k + kk) as usize], (0..n).map(|m| dy64(s * n + m) * w64(kk * n + m)), 1e-5)
                            .map_err(|e| TestCaseError::fail(format!("dx[{s}][{kk}] = {e}")))?;
                    }
                }
            }
            for kk in 0..k {
                for m in 0..n {
                    let g = (0..batch).map(|s| x64(s * k + kk) * dy64(s * n + m));
                    close(r.dw[(kk * n + m) as usize], g.clone(), 1e-5)
                        .map_err(|e| TestCaseError::fail(format!("dW[{kk}][{m}] = {e}")))?;
                    let after = std::iter::once(w64(kk * n + m)).chain(g.map(|v| -0.25 * v));
                    close(r.w[(kk * n + m) as usize], after, 1e-5)
                        .map_err(|e| TestCaseError::fail(format!("W[{kk}][{m}] = {e}")))?;
                }
            }
        }
    }

    #[test]
    fn a_one_pe_layer_takes_hand_computed_cycles() {
        // k = 2, n = 3 on one PE, one sample: the inputs arrive at 4, 5 (the host sends
        // at 0, 1; ramp 2 + ramp 2); the task starts at 4 and runs 10 (switch) + 7
        // (receive 2: start-up 5, elements at 19, 20) + 8 (zero y: 5 + 3) + 2 x 8 (two
        // fmacs of 3) + 8 (send 3) = 49 cycles: the last output leaves at 4 + 48 and
        // crosses the east link (ramp 2, hop 1)
        let d = Dense::forward_only(2, 3, 1);
        let r = run(
            &d,
            Orient::North,
            (1, 1),
            &[1.0, 2.0],
            &[],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            0.0,
        );
        assert_eq!(r.y, [9.0, 12.0, 15.0]);
        assert_eq!(r.forward, 4 + 48 + 3);
    }
}
