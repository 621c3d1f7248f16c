//! The update a train step applies: the gradients under a loss scale (fixed or
//! dynamic), the cross-shard mean, global-norm clipping, each optimiser's rule with its
//! slot variables, and the global step's increment.

use super::Ad;
use crate::ir::{
    name_matches, BinaryOp, DType, Init, LossScale, Op, Optimizer, Output, ReduceOp, Role,
    TensorType, UnaryOp, AVERAGE_SUFFIX, GOOD_STEPS, LOSS_SCALE,
};
use crate::span::Span;
use petgraph::stable_graph::NodeIndex;
use rustc_hash::FxHashMap;

/// (variable, gradient) pairs.
type Grads = Vec<(NodeIndex, NodeIndex)>;

/// A dynamic loss scale's state: its scale and good-steps variables and growth
/// interval, for `apply` to skip non-finite steps and update the scale.
pub(super) struct Gate {
    scale: NodeIndex,
    good: NodeIndex,
    growth_interval: u64,
}

impl Ad<'_> {
    /// The gradients of `loss` times the scale `how`, divided by it again (in each
    /// gradient's dtype), and for a dynamic scale its state (the `k`-th optimiser's).
    pub(super) fn scaled_gradients(
        &mut self,
        loss: NodeIndex,
        how: LossScale,
        k: usize,
        sp: Span,
    ) -> Option<(Grads, Option<Gate>)> {
        // `LossScaleOptimizer/current_loss_scale`, `/k` after the first optimiser's
        let suffix = if k == 0 {
            String::new()
        } else {
            format!("/{k}")
        };
        let scalar = TensorType::scalar(DType::F32);
        let var = |ad: &mut Self, full: &str, init: f64| {
            let (owner, slot) = full.split_once('/').unwrap_or(("", full));
            ad.slot_from(
                owner,
                &format!("{slot}{suffix}"),
                &scalar,
                constant(init),
                sp,
            )
        };
        let (scale, gate) = match how {
            LossScale::Fixed(s) => (self.konst(s, DType::F32, sp), None),
            LossScale::Dynamic {
                initial,
                growth_interval,
            } => {
                let scale = var(self, LOSS_SCALE, initial);
                let good = var(self, GOOD_STEPS, 0.0);
                let gate = Gate {
                    scale,
                    good,
                    growth_interval,
                };
                (scale, Some(gate))
            }
        };
        let dt = self.g.ty(loss).dtype;
        let s = self.cast(scale, dt, sp);
        let s = self.reshape(s, &self.g.ty(loss).shape.clone(), sp);
        let scaled = self.bin(BinaryOp::Mul, loss, s, sp);
        let grads = self.backward(scaled)?;
        let one = self.konst(1.0, DType::F32, sp);
        let inverse = self.bin(BinaryOp::Div, one, scale, sp);
        let grads = grads
            .into_iter()
            .map(|(v, d)| {
                let dt = self.g.ty(d).dtype;
                let r = self.cast(inverse, dt, sp);
                (v, self.bin(BinaryOp::Mul, d, r, sp))
            })
            .collect();
        Some((grads, gate))
    }

    /// With a dynamic loss scale, each update kept only when every gradient is
    /// finite (else the variable or slot keeps its value), and the scale's own
    /// updates: halved on a non-finite step (not below 1), doubled after
    /// `growth_interval` finite steps in a row.
    fn gated(
        &mut self,
        gate: &Gate,
        gs: &[(NodeIndex, NodeIndex)],
        updates: Vec<(String, NodeIndex)>,
        sp: Span,
    ) -> Vec<(String, NodeIndex)> {
        // a NaN or infinity anywhere makes the sum of (gradient * 0) NaN
        let f32s = DType::F32;
        let zero = self.konst(0.0, f32s, sp);
        let mut total = zero;
        for &(_, d) in gs {
            let z = self.konst(0.0, self.g.ty(d).dtype, sp);
            let p = self.bin(BinaryOp::Mul, d, z, sp);
            let r = self.g.ty(p).rank();
            let s = self.reduce(ReduceOp::Sum, p, (0..r).collect(), false, sp);
            let s = self.cast(s, f32s, sp);
            total = self.bin(BinaryOp::Add, total, s, sp);
        }
        let finite = self.bin(BinaryOp::Eq, total, zero, sp);
        // each variable's value as the graph reads it, by name
        let mut read: FxHashMap<String, NodeIndex> = FxHashMap::default();
        for n in self.g.g.node_indices() {
            if let Op::Variable { name, .. } = &self.g.node(n).op {
                read.entry(name.clone()).or_insert(n);
            }
        }
        let mut out: Vec<(String, NodeIndex)> = updates
            .into_iter()
            .map(|(name, new)| match read.get(&name).copied() {
                Some(old) => (name, self.select(finite, new, old, sp)),
                None => (name, new),
            })
            .collect();
        let (one, two, half) = (
            self.konst(1.0, f32s, sp),
            self.konst(2.0, f32s, sp),
            self.konst(0.5, f32s, sp),
        );
        let interval = self.konst(gate.growth_interval as f64, f32s, sp);
        let next = self.bin(BinaryOp::Add, gate.good, one, sp);
        let due = self.bin(BinaryOp::Ge, next, interval, sp);
        let doubled = self.bin(BinaryOp::Mul, gate.scale, two, sp);
        // a doubled scale past f32's range is not taken (Keras's `_assign_if_finite`)
        let largest = self.konst(f64::from(f32::MAX), f32s, sp);
        let fits = self.bin(BinaryOp::Le, doubled, largest, sp);
        let due = self.bin(BinaryOp::And, due, fits, sp);
        let grow = self.bin(BinaryOp::And, finite, due, sp);
        let halved = self.bin(BinaryOp::Mul, gate.scale, half, sp);
        let halved = self.bin(BinaryOp::Max, halved, one, sp);
        let kept = self.select(grow, doubled, gate.scale, sp);
        let scale = self.select(finite, kept, halved, sp);
        let counted = self.select(grow, zero, next, sp);
        let good = self.select(finite, counted, zero, sp);
        for (var, value) in [(gate.scale, scale), (gate.good, good)] {
            if let Op::Variable { name, .. } = &self.g.node(var).op {
                out.push((name.clone(), value));
            }
        }
        out
    }

    /// Averages the gradients across shards, clips them, and adds the optimiser's
    /// update of every variable and slot, as outputs (kept only on finite steps with
    /// a dynamic loss scale's `gate`).
    pub(super) fn apply(
        &mut self,
        opt: &Optimizer,
        lr: NodeIndex,
        grads: Vec<(NodeIndex, NodeIndex)>,
        gate: Option<Gate>,
    ) {
        let sp = opt.span;
        let role = if gate.is_some() {
            Role::ScaledGradient
        } else {
            Role::Gradient
        };
        let mut gs: Vec<(NodeIndex, NodeIndex)> = grads
            .into_iter()
            .map(|(v, d)| {
                let t = self.ty(d);
                let m = self.mk(Op::CrossShardMean, &[d], t, sp);
                if let Op::Variable { name, .. } = &self.g.node(v).op {
                    self.g.outputs.push(Output {
                        name: name.clone(),
                        role,
                        node: m,
                    });
                }
                (v, m)
            })
            .collect();
        // a dynamic loss scale checks the gradients before clipping (as Keras's
        // LossScaleOptimizer does before its inner optimiser): clipping an overflowing
        // norm would make them finite zeros
        let checked = if gate.is_some() {
            gs.clone()
        } else {
            Vec::new()
        };
        if let Some(clip) = opt.clip_global_norm {
            // g * clip / max(norm, clip), norm = sqrt(sum of all squares)
            let mut total: Option<NodeIndex> = None;
            for &(_, d) in &gs {
                let sq = self.un(UnaryOp::Square, d, sp);
                let r = self.g.ty(sq).rank();
                let s = self.reduce(ReduceOp::Sum, sq, (0..r).collect(), false, sp);
                let s = self.cast(s, DType::F32, sp);
                total = Some(match total {
                    Some(t) => self.bin(BinaryOp::Add, t, s, sp),
                    None => s,
                });
            }
            if let Some(total) = total {
                let norm = self.un(UnaryOp::Sqrt, total, sp);
                let c = self.konst(clip, DType::F32, sp);
                let m = self.bin(BinaryOp::Max, norm, c, sp);
                let scale = self.bin(BinaryOp::Div, c, m, sp);
                for (_, d) in gs.iter_mut() {
                    let dt = self.g.ty(*d).dtype;
                    let s = self.cast(scale, dt, sp);
                    *d = self.bin(BinaryOp::Mul, *d, s, sp);
                }
            }
        }
        let step = self.global_step(sp);
        let mut corrections: FxHashMap<DType, (NodeIndex, NodeIndex)> = FxHashMap::default();
        let mut rates: FxHashMap<DType, NodeIndex> = FxHashMap::default();
        let mut averaging: FxHashMap<DType, NodeIndex> = FxHashMap::default();
        let hyper = |k: &str, default: f64| {
            opt.hyper
                .iter()
                .find(|(n, _)| n == k)
                .map_or(default, |(_, v)| *v)
        };
        let mut updates: Vec<(String, NodeIndex)> = Vec::new();
        for (v, grad) in gs {
            let Op::Variable { name, .. } = self.g.node(v).op.clone() else {
                continue;
            };
            let dt = self.g.ty(v).dtype;
            let vt = self.ty(v);
            let lr_v = match rates.get(&dt) {
                Some(&r) => r,
                None => {
                    let r = self.cast(lr, dt, sp);
                    let r = self.reshape(r, &[], sp);
                    rates.insert(dt, r);
                    r
                }
            };
            let k = |ad: &mut Self, x: f64| ad.konst(x, dt, sp);
            let new_w = match opt.kind.as_str() {
                "momentum" => {
                    let mom = hyper("momentum", 0.9);
                    let nesterov = hyper("nesterov", 0.0) != 0.0;
                    let slot = self.slot(&name, "momentum", &vt, sp);
                    let km = k(self, mom);
                    let mv = self.bin(BinaryOp::Mul, slot, km, sp);
                    let nv = self.bin(BinaryOp::Add, mv, grad, sp);
                    updates.push((format!("{name}/momentum"), nv));
                    let step_dir = if nesterov {
                        let t = self.bin(BinaryOp::Mul, nv, km, sp);
                        self.bin(BinaryOp::Add, grad, t, sp)
                    } else {
                        nv
                    };
                    let t = self.bin(BinaryOp::Mul, step_dir, lr_v, sp);
                    self.bin(BinaryOp::Sub, v, t, sp)
                }
                "adam" | "adamw" | "tf_adam" => {
                    let (b1, b2) = (hyper("beta1", 0.9), hyper("beta2", 0.999));
                    let eps = hyper("epsilon", 1e-7);
                    let decays = !opt.decay_exclude.iter().any(|p| name_matches(p, &name));
                    let w = if opt.kind == "adamw" && decays {
                        let wd = hyper("weight_decay", 0.01);
                        // w * (1 - lr * wd), as PyTorch's AdamW
                        let kwd = k(self, wd);
                        let t = self.bin(BinaryOp::Mul, lr_v, kwd, sp);
                        let one = k(self, 1.0);
                        let f = self.bin(BinaryOp::Sub, one, t, sp);
                        self.bin(BinaryOp::Mul, v, f, sp)
                    } else {
                        v
                    };
                    let m = self.slot(&name, "adam_m", &vt, sp);
                    let s = self.slot(&name, "adam_v", &vt, sp);
                    let kb1 = k(self, b1);
                    let k1b1 = k(self, 1.0 - b1);
                    let t0 = self.bin(BinaryOp::Mul, m, kb1, sp);
                    let t1 = self.bin(BinaryOp::Mul, grad, k1b1, sp);
                    let nm = self.bin(BinaryOp::Add, t0, t1, sp);
                    let kb2 = k(self, b2);
                    let k1b2 = k(self, 1.0 - b2);
                    let g2 = self.un(UnaryOp::Square, grad, sp);
                    let t0 = self.bin(BinaryOp::Mul, s, kb2, sp);
                    let t1 = self.bin(BinaryOp::Mul, g2, k1b2, sp);
                    let ns = self.bin(BinaryOp::Add, t0, t1, sp);
                    updates.push((format!("{name}/adam_m"), nm));
                    updates.push((format!("{name}/adam_v"), ns));
                    // bias corrections 1 - beta^t with t = step + 1
                    // bias corrections 1 - beta^t with t = step + 1: made once for all
                    // variables (shared nodes keep the graph small for CSE)
                    let (c1, c2) = match corrections.get(&dt) {
                        Some(&c) => c,
                        None => {
                            let t = self.cast(step, DType::F32, sp);
                            let one32 = self.konst(1.0, DType::F32, sp);
                            let t = self.bin(BinaryOp::Add, t, one32, sp);
                            let c1 = self.bias_correction(b1, t, sp);
                            let c2 = self.bias_correction(b2, t, sp);
                            let c = (self.cast(c1, dt, sp), self.cast(c2, dt, sp));
                            corrections.insert(dt, c);
                            c
                        }
                    };
                    let keps = k(self, eps);
                    if opt.kind == "tf_adam" {
                        // epsilon-hat: lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
                        let r2 = self.un(UnaryOp::Sqrt, c2, sp);
                        let f = self.bin(BinaryOp::Div, r2, c1, sp);
                        let rate = self.bin(BinaryOp::Mul, lr_v, f, sp);
                        let r = self.un(UnaryOp::Sqrt, ns, sp);
                        let den = self.bin(BinaryOp::Add, r, keps, sp);
                        let q = self.bin(BinaryOp::Div, nm, den, sp);
                        let t = self.bin(BinaryOp::Mul, q, rate, sp);
                        self.bin(BinaryOp::Sub, w, t, sp)
                    } else {
                        // without bias correction (BERT's AdamWeightDecay), m and v as they are
                        let (mh, vh) = if hyper("bias_correction", 1.0) != 0.0 {
                            (
                                self.bin(BinaryOp::Div, nm, c1, sp),
                                self.bin(BinaryOp::Div, ns, c2, sp),
                            )
                        } else {
                            (nm, ns)
                        };
                        let r = self.un(UnaryOp::Sqrt, vh, sp);
                        let den = self.bin(BinaryOp::Add, r, keps, sp);
                        let q = self.bin(BinaryOp::Div, mh, den, sp);
                        let t = self.bin(BinaryOp::Mul, q, lr_v, sp);
                        self.bin(BinaryOp::Sub, w, t, sp)
                    }
                }
                "rmsprop" => {
                    let rho = hyper("rho", 0.9);
                    let mom = hyper("momentum", 0.0);
                    let eps = hyper("epsilon", 1e-7);
                    let ms = self.slot(&name, "rms", &vt, sp);
                    let g2 = self.un(UnaryOp::Square, grad, sp);
                    let nms = self.decayed(ms, g2, rho, sp);
                    updates.push((format!("{name}/rms"), nms));
                    let r = self.un(UnaryOp::Sqrt, nms, sp);
                    let keps = k(self, eps);
                    let den = self.bin(BinaryOp::Add, r, keps, sp);
                    let q = self.bin(BinaryOp::Div, grad, den, sp);
                    let dir = self.with_momentum(&name, "rms_momentum", mom, q, &mut updates, sp);
                    let t = self.bin(BinaryOp::Mul, dir, lr_v, sp);
                    self.bin(BinaryOp::Sub, v, t, sp)
                }
                "tf_rmsprop" => {
                    // TF1: ms from 1, mom = momentum mom + lr g / sqrt(ms + eps), w -= mom
                    let rho = hyper("rho", 0.9);
                    let mom = hyper("momentum", 0.0);
                    let eps = hyper("epsilon", 1e-10);
                    let ms = self.slot_from(&name, "rms", &vt, Init::Ones, sp);
                    let g2 = self.un(UnaryOp::Square, grad, sp);
                    let nms = self.decayed(ms, g2, rho, sp);
                    updates.push((format!("{name}/rms"), nms));
                    let keps = k(self, eps);
                    let d = self.bin(BinaryOp::Add, nms, keps, sp);
                    let r = self.un(UnaryOp::Sqrt, d, sp);
                    let q = self.bin(BinaryOp::Div, grad, r, sp);
                    let q = self.bin(BinaryOp::Mul, q, lr_v, sp);
                    let dir = self.with_momentum(&name, "momentum", mom, q, &mut updates, sp);
                    self.bin(BinaryOp::Sub, v, dir, sp)
                }
                "adagrad" => {
                    // acc += g^2; w -= lr g / sqrt(acc + eps)
                    let init = hyper("initial_accumulator_value", 0.1);
                    let eps = hyper("epsilon", 1e-7);
                    let acc = self.slot_from(&name, "accumulator", &vt, constant(init), sp);
                    let g2 = self.un(UnaryOp::Square, grad, sp);
                    let na = self.bin(BinaryOp::Add, acc, g2, sp);
                    updates.push((format!("{name}/accumulator"), na));
                    let keps = k(self, eps);
                    let d = self.bin(BinaryOp::Add, na, keps, sp);
                    let r = self.un(UnaryOp::Sqrt, d, sp);
                    let q = self.bin(BinaryOp::Div, grad, r, sp);
                    let t = self.bin(BinaryOp::Mul, q, lr_v, sp);
                    self.bin(BinaryOp::Sub, v, t, sp)
                }
                "ftrl" => self.ftrl(&name, v, grad, lr_v, &hyper, &mut updates, sp),
                _ => {
                    let t = self.bin(BinaryOp::Mul, grad, lr_v, sp);
                    self.bin(BinaryOp::Sub, v, t, sp)
                }
            };
            if let Some((decay, ramp)) = opt.moving_average {
                // avg -= (1 - d) (avg - w'), the average of the new weights
                let init = match &self.g.node(v).op {
                    Op::Variable { init, .. } => init.clone(),
                    _ => Init::Zeros,
                };
                let avg = self.slot_from(
                    &name,
                    &AVERAGE_SUFFIX[1..],
                    &vt,
                    Init::As {
                        init: Box::new(init),
                        name: name.clone(),
                    },
                    sp,
                );
                let keep = match averaging.get(&dt) {
                    Some(&k) => k,
                    None => {
                        let one = self.konst(1.0, DType::F32, sp);
                        let d = self.konst(decay, DType::F32, sp);
                        let d = if ramp {
                            // min(decay, (1 + t) / (10 + t)), t the new global step
                            let t = self.cast(step, DType::F32, sp);
                            let t = self.bin(BinaryOp::Add, t, one, sp);
                            let a = self.bin(BinaryOp::Add, t, one, sp);
                            let ten = self.konst(10.0, DType::F32, sp);
                            let b = self.bin(BinaryOp::Add, t, ten, sp);
                            let r = self.bin(BinaryOp::Div, a, b, sp);
                            self.bin(BinaryOp::Min, d, r, sp)
                        } else {
                            d
                        };
                        let k = self.bin(BinaryOp::Sub, one, d, sp);
                        let k = self.cast(k, dt, sp);
                        averaging.insert(dt, k);
                        k
                    }
                };
                let diff = self.bin(BinaryOp::Sub, avg, new_w, sp);
                let t = self.bin(BinaryOp::Mul, diff, keep, sp);
                let na = self.bin(BinaryOp::Sub, avg, t, sp);
                updates.push((format!("{name}{AVERAGE_SUFFIX}"), na));
            }
            updates.push((name, new_w));
        }
        if let Some(gate) = &gate {
            updates = self.gated(gate, &checked, updates, sp);
        }
        for (name, node) in updates {
            self.g.outputs.push(Output {
                name,
                role: Role::Update,
                node,
            });
        }
    }

    /// The global step plus one, as the `next_step` output.
    pub(super) fn next_step(&mut self, sp: Span) {
        let step = self.global_step(sp);
        let one = self.konst(1.0, DType::I64, sp);
        let next = self.g.add(
            Op::Binary(BinaryOp::Add),
            &[step, one],
            TensorType::scalar(DType::I64),
            sp,
        );
        self.g.outputs.push(Output {
            name: "global_step".into(),
            role: Role::NextStep,
            node: next,
        });
    }

    /// `beta * acc + (1 - beta) * x`: a slot's exponential average.
    fn decayed(&mut self, acc: NodeIndex, x: NodeIndex, beta: f64, sp: Span) -> NodeIndex {
        let dt = self.g.ty(acc).dtype;
        let kb = self.konst(beta, dt, sp);
        let k1b = self.konst(1.0 - beta, dt, sp);
        let t0 = self.bin(BinaryOp::Mul, acc, kb, sp);
        let t1 = self.bin(BinaryOp::Mul, x, k1b, sp);
        self.bin(BinaryOp::Add, t0, t1, sp)
    }

    /// With `momentum` > 0, the momentum slot `VAR/slot` updated to
    /// `momentum * buf + q` (pushed to `updates`) as the direction; else `q`.
    fn with_momentum(
        &mut self,
        name: &str,
        slot: &str,
        momentum: f64,
        q: NodeIndex,
        updates: &mut Vec<(String, NodeIndex)>,
        sp: Span,
    ) -> NodeIndex {
        if momentum <= 0.0 {
            return q;
        }
        let vt = self.ty(q);
        let buf = self.slot(name, slot, &vt, sp);
        let km = self.konst(momentum, vt.dtype, sp);
        let t = self.bin(BinaryOp::Mul, buf, km, sp);
        let nb = self.bin(BinaryOp::Add, t, q, sp);
        updates.push((format!("{name}/{slot}"), nb));
        nb
    }

    /// FTRL-Proximal's update of variable `v` (TensorFlow's `ApplyFtrlV2`, as Keras
    /// writes it): the new weight, with the accumulator and linear slots' updates
    /// pushed to `updates`.
    #[allow(clippy::too_many_arguments)]
    fn ftrl(
        &mut self,
        name: &str,
        v: NodeIndex,
        grad: NodeIndex,
        lr: NodeIndex,
        hyper: &dyn Fn(&str, f64) -> f64,
        updates: &mut Vec<(String, NodeIndex)>,
        sp: Span,
    ) -> NodeIndex {
        let vt = self.ty(v);
        let dt = vt.dtype;
        let k = |ad: &mut Self, x: f64| ad.konst(x, dt, sp);
        let power = hyper("learning_rate_power", -0.5);
        let (l1, l2) = (hyper("l1", 0.0), hyper("l2", 0.0));
        let (shrink, beta) = (hyper("l2_shrinkage", 0.0), hyper("beta", 0.0));
        let init = hyper("initial_accumulator_value", 0.1);
        let acc = self.slot_from(name, "accumulator", &vt, constant(init), sp);
        let linear = self.slot(name, "linear", &vt, sp);
        // the gradient with shrinkage, g + 2 shrink w, feeds the linear term only
        let g_lin = if shrink > 0.0 {
            let ks = k(self, 2.0 * shrink);
            let t = self.bin(BinaryOp::Mul, v, ks, sp);
            self.bin(BinaryOp::Add, grad, t, sp)
        } else {
            grad
        };
        let g2 = self.un(UnaryOp::Square, grad, sp);
        let na = self.bin(BinaryOp::Add, acc, g2, sp);
        let kp = k(self, -power);
        let pn = self.bin(BinaryOp::Pow, na, kp, sp);
        let po = self.bin(BinaryOp::Pow, acc, kp, sp);
        // sigma = (na^-p - acc^-p) / lr; linear += g_lin - sigma w
        let dp = self.bin(BinaryOp::Sub, pn, po, sp);
        let sigma = self.bin(BinaryOp::Div, dp, lr, sp);
        let sw = self.bin(BinaryOp::Mul, sigma, v, sp);
        let t = self.bin(BinaryOp::Sub, g_lin, sw, sp);
        let nl = self.bin(BinaryOp::Add, linear, t, sp);
        // quadratic = na^-p / lr + 2 (l2 + beta / (2 lr))
        let q0 = self.bin(BinaryOp::Div, pn, lr, sp);
        let kl2 = k(self, 2.0 * l2);
        let q1 = self.bin(BinaryOp::Add, q0, kl2, sp);
        let quad = if beta > 0.0 {
            let kb = k(self, beta);
            let b = self.bin(BinaryOp::Div, kb, lr, sp);
            self.bin(BinaryOp::Add, q1, b, sp)
        } else {
            q1
        };
        // w = (clip(linear, -l1, l1) - linear) / quadratic: 0 where |linear| <= l1
        let kl1 = k(self, l1);
        let kml1 = k(self, -l1);
        let c = self.bin(BinaryOp::Min, nl, kl1, sp);
        let c = self.bin(BinaryOp::Max, c, kml1, sp);
        let num = self.bin(BinaryOp::Sub, c, nl, sp);
        updates.push((format!("{name}/accumulator"), na));
        updates.push((format!("{name}/linear"), nl));
        self.bin(BinaryOp::Div, num, quad, sp)
    }

    /// 1 - beta^t, as an f32 scalar.
    fn bias_correction(&mut self, beta: f64, t: NodeIndex, sp: Span) -> NodeIndex {
        let kb = self.konst(beta, DType::F32, sp);
        let p = self.bin(BinaryOp::Pow, kb, t, sp);
        let one = self.konst(1.0, DType::F32, sp);
        self.bin(BinaryOp::Sub, one, p, sp)
    }

    fn global_step(&mut self, sp: Span) -> NodeIndex {
        let existing = self
            .g
            .g
            .node_indices()
            .find(|&n| matches!(self.g.node(n).op, Op::GlobalStep));
        existing.unwrap_or_else(|| {
            self.g
                .add(Op::GlobalStep, &[], TensorType::scalar(DType::I64), sp)
        })
    }

    /// A slot variable of the optimiser (zeros, not trainable), `<var>/<slot>`.
    fn slot(&mut self, var: &str, slot: &str, ty: &TensorType, sp: Span) -> NodeIndex {
        self.slot_from(var, slot, ty, Init::Zeros, sp)
    }

    /// A slot variable starting at `init`.
    fn slot_from(
        &mut self,
        var: &str,
        slot: &str,
        ty: &TensorType,
        init: Init,
        sp: Span,
    ) -> NodeIndex {
        self.g.add(
            Op::Variable {
                name: format!("{var}/{slot}"),
                init,
                trainable: false,
            },
            &[],
            ty.clone(),
            sp,
        )
    }
}

/// A constant initialiser of `x`.
fn constant(x: f64) -> Init {
    Init::Constant {
        bits: (x as f32).to_bits(),
    }
}
