//! A dense layer `y = x W` (`k` inputs, `n` outputs) on a `w x h` rectangle, one sample
//! at a time, on the checkerboard GEMV mapping of `../shared/wafer/design.md` §1.3:
//! PE `(i, j)` holds the block of `W` whose rows are column `i`'s inputs and whose
//! columns are row `j`'s outputs. Column `i`'s slice of a sample enters at the north
//! edge and is multicast down the column; each PE stashes it (for the weight gradient)
//! and multiplies it by its block into a partial `y`; the partials of a row are summed
//! along a chain from west to east on two alternating colours (a PE cannot receive and
//! send one colour on a fixed route), and row `j`'s outputs leave at the east edge.

use super::super::isa::{Colour, Dsd, Instr, Program, Src, Task, Trigger, VecOp};
use super::super::sim::{Dir, Route};
use super::{split, Laid, Rect};
use std::sync::Arc;

/// The layer's sizes and the samples of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dense {
    pub k: u32,
    pub n: u32,
    pub batch: u32,
}

/// The colours the forward pass uses: the inputs' multicast and the chain's two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Colours {
    pub x: Colour,
    pub chain: [Colour; 2],
}

impl Dense {
    /// The columns and rows of a `w x h` rectangle that hold a block (each part gets
    /// `ceil(k / w)` inputs, so fewer columns may do).
    pub fn used(&self, w: u32, h: u32) -> (u32, u32) {
        let per_col = self.k.div_ceil(w.max(1));
        let per_row = self.n.div_ceil(h.max(1));
        (self.k.div_ceil(per_col), self.n.div_ceil(per_row))
    }

    /// The colour the outputs leave on (row by row, at the east edge).
    pub fn out_colour(&self, w: u32, c: Colours) -> Colour {
        let (wc, _) = self.used(w, 1);
        c.chain[(wc % 2) as usize]
    }

    /// The forward pass on `r` with weights `weights` (`k x n`, row-major). Column `i`
    /// takes inputs `split(k, w, i)` from the north on `c.x`; row `j` gives outputs
    /// `split(n, h, j)` to the east on `out_colour`, one sample after another.
    pub fn forward(&self, r: Rect, c: Colours, weights: &[f32]) -> Laid {
        let (wc, hr) = self.used(r.w, r.h);
        let mut laid = Laid::default();
        for i in 0..wc {
            let ks = split(self.k, wc, i);
            let a = ks.len() as u32;
            let (recv, send) = (c.chain[(i % 2) as usize], c.chain[((i + 1) % 2) as usize]);
            for j in 0..hr {
                let ns = split(self.n, hr, j);
                let b = ns.len() as u32;
                let mut p = Program::default();
                let w = p.alloc("W", a * b);
                let xs = p.alloc("x stash", self.batch * a);
                let y = p.alloc("y", b);
                let mut body = vec![
                    Instr::Vec {
                        op: VecOp::Mov,
                        dst: Dsd::Mem {
                            base: xs,
                            len: a,
                            stride: 1,
                            step: vec![],
                            by: Some((0, a as i32)),
                        },
                        srcs: vec![Src::V(Dsd::In {
                            colour: c.x,
                            len: a,
                        })],
                    },
                    Instr::Vec {
                        op: VecOp::Mov,
                        dst: Dsd::mem(y, b),
                        srcs: vec![Src::Imm(0.0)],
                    },
                    Instr::Loop {
                        count: a,
                        body: vec![Instr::Vec {
                            op: VecOp::Fmac,
                            dst: Dsd::mem(y, b),
                            srcs: vec![
                                Src::V(Dsd::mem(y, b)),
                                Src::V(Dsd::Mem {
                                    base: w,
                                    len: b,
                                    stride: 1,
                                    step: vec![b as i32],
                                    by: None,
                                }),
                                Src::V(Dsd::Mem {
                                    base: xs,
                                    len: b,
                                    stride: 0,
                                    step: vec![1],
                                    by: Some((0, a as i32)),
                                }),
                            ],
                        }],
                    },
                ];
                let out = Dsd::Out {
                    colour: send,
                    len: b,
                };
                body.push(if i == 0 {
                    Instr::Vec {
                        op: VecOp::Mov,
                        dst: out,
                        srcs: vec![Src::V(Dsd::mem(y, b))],
                    }
                } else {
                    Instr::Vec {
                        op: VecOp::Add,
                        dst: out,
                        srcs: vec![
                            Src::V(Dsd::mem(y, b)),
                            Src::V(Dsd::In {
                                colour: recv,
                                len: b,
                            }),
                        ],
                    }
                });
                body.push(Instr::Count {
                    counter: 0,
                    every: self.batch,
                    then: None,
                });
                p.tasks.push(Task {
                    id: 0,
                    name: "dense forward".into(),
                    trigger: Trigger::Data(c.x),
                    body,
                });
                let mut mem = vec![0.0; p.words() as usize];
                for (kk, k) in ks.clone().enumerate() {
                    for (nn, n) in ns.clone().enumerate() {
                        mem[w as usize + kk * b as usize + nn] = weights[(k * self.n + n) as usize];
                    }
                }
                let (x, yy) = (r.x + i, r.y + j);
                laid.pes.insert((x, yy), (Arc::new(p), mem));
                // the inputs come down the column
                let down: &[Dir] = if j + 1 < hr {
                    &[Dir::Ramp, Dir::S]
                } else {
                    &[Dir::Ramp]
                };
                laid.routes.insert((x, yy, c.x), Route::new(Dir::N, down));
                // the partial sums go east
                laid.routes
                    .insert((x, yy, send), Route::new(Dir::Ramp, &[Dir::E]));
                if i > 0 {
                    laid.routes
                        .insert((x, yy, recv), Route::new(Dir::W, &[Dir::Ramp]));
                }
            }
        }
        laid
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::wafer::fabric::Fabric;
    use crate::backend::wafer::sim::{HostIn, Setup, Sim};
    use proptest::prelude::*;

    /// Runs the forward pass of `d` on a `w x h` rectangle against the fabric's north
    /// and east edges: the outputs, sample-major, and the cycles.
    fn run(d: Dense, w: u32, h: u32, x: &[f32], weights: &[f32]) -> (Vec<f32>, u64) {
        let f = Fabric::named("test32").unwrap();
        let (wc, hr) = d.used(w, h);
        let r = Rect {
            x: f.width - wc,
            y: 0,
            w,
            h,
        };
        let c = Colours {
            x: 0,
            chain: [1, 2],
        };
        let laid = d.forward(r, c, weights);
        let mut setup = Setup {
            pes: laid.pes,
            routes: laid.routes,
            inputs: Vec::new(),
        };
        for i in 0..wc {
            let ks = split(d.k, wc, i);
            let values = (0..d.batch)
                .flat_map(|s| ks.clone().map(move |k| (s, k)))
                .map(|(s, k)| x[(s * d.k + k) as usize])
                .collect();
            setup.inputs.push(HostIn {
                x: r.x + i,
                y: 0,
                colour: c.x,
                values,
            });
        }
        let mut sim = Sim::new(&f, &setup).unwrap();
        let cycles = sim.run().unwrap();
        let mut y = vec![f32::NAN; (d.batch * d.n) as usize];
        let oc = d.out_colour(w, c);
        for j in 0..hr {
            let ns = split(d.n, hr, j);
            let out = sim.output(f.width - 1, j, Dir::E, oc);
            assert_eq!(out.len() as u32, d.batch * ns.len() as u32);
            for (t, &(_, v)) in out.iter().enumerate() {
                let (s, m) = (t as u32 / ns.len() as u32, t as u32 % ns.len() as u32);
                y[(s * d.n + ns.start + m) as usize] = v;
            }
        }
        (y, cycles)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]
        /// Against the product in f64: within 1e-5 of the sum of the terms' magnitudes
        /// (the wafer sums each PE's inputs in order, then the PEs' partials along the
        /// row: another order than a CPU's, so not the same bits).
        #[test]
        fn forward_equals_the_product(
            k in 1u32..40, n in 1u32..40, batch in 1u32..4, w in 1u32..9, h in 1u32..9,
            seed in 0u64..1000,
        ) {
            let d = Dense { k, n, batch };
            let r = crate::rng::Stream::new(seed, 0);
            let x: Vec<f32> = r.uniforms(0, (batch * k) as usize, 0).iter().map(|u| u * 2.0 - 1.0).collect();
            let wt: Vec<f32> = r.uniforms(1 << 20, (k * n) as usize, 0).iter().map(|u| u * 2.0 - 1.0).collect();
            let (y, _) = run(d, w, h, &x, &wt);
            for s in 0..batch {
                for m in 0..n {
                    let terms = (0..k).map(|kk| f64::from(x[(s * k + kk) as usize]) * f64::from(wt[(kk * n + m) as usize]));
                    let exact: f64 = terms.clone().sum();
                    let scale: f64 = terms.map(f64::abs).sum();
                    let got = f64::from(y[(s * n + m) as usize]);
                    prop_assert!((got - exact).abs() <= 1e-5 * scale + 1e-7, "y[{s}][{m}] = {got}, not {exact}");
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
        let d = Dense {
            k: 2,
            n: 3,
            batch: 1,
        };
        let (y, cycles) = run(d, 1, 1, &[1.0, 2.0], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(y, [9.0, 12.0, 15.0]);
        assert_eq!(cycles, 4 + 48 + 3);
    }
}
