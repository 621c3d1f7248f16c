//! Every backend against the interpreter, op by op: each case builds a small graph over
//! random values (random shapes from proptest: odd sizes that do not divide the vector
//! width, size-1 axes, broadcasting), runs it on the interpreter and on each other
//! backend this build has through the `backend::Device` seam, and compares.
//!
//! Tolerances: elementwise results within 1e-5 relative (|a - b| <= 1e-5 |b|; the host's
//! exp, log and tanh are polynomials within 2 ulp); a reduction, a softmax row or a
//! matrix product within 1e-5 of the sum of the magnitudes of its terms (backends may
//! add in another order, and each order is exact to n·ε of that sum); gradients within
//! 1e-4 of their largest magnitude (or of 1e-2, the scale below which a gradient of an
//! O(1) loss is a cancellation); integers and booleans exactly; NaN where the
//! interpreter has NaN.

use est::backend::{self, Feeds, StepCtx};
use est::elab::Target;
use est::ir::{
    infer, BinaryOp, Conv, DType, Graph, Init, NodeIndex, Op, Padding, Pool, ReduceOp, TensorType,
    UnaryOp,
};
use est::span::{FileId, Span};
use est::tensor::{Data, Tensor};
use proptest::prelude::*;
use rustc_hash::FxHashMap;
use std::sync::Arc;

const SPAN: Span = Span {
    file: FileId(0),
    lo: 0,
    hi: 0,
};

/// The backends compared with the interpreter in this build.
fn backends() -> Vec<Target> {
    if cfg!(feature = "llvm") {
        vec![Target::Host]
    } else {
        Vec::new()
    }
}

struct Case {
    g: Graph,
    vars: FxHashMap<String, Tensor>,
    seed: u64,
}

/// How a result is compared.
#[derive(Clone, Copy, Debug)]
enum Tol {
    /// Elementwise: 1e-5 relative.
    Elem,
    /// Each output sums terms: 1e-5 of `scale` (the sum of their magnitudes).
    Sum(f64),
    /// Gradients (sums of sums): 1e-4 of the tensor's largest magnitude, or of 1e-2
    /// when that is smaller.
    Grad,
}

impl Case {
    fn new(seed: u64) -> Case {
        Case {
            g: Graph::new(),
            vars: FxHashMap::default(),
            seed,
        }
    }

    fn next(&mut self) -> f64 {
        // splitmix64
        self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A variable of random values in [lo, hi) (integers: whole numbers).
    fn value(&mut self, dtype: DType, shape: &[usize], lo: f64, hi: f64) -> NodeIndex {
        self.variable(dtype, shape, lo, hi, false)
    }

    fn variable(
        &mut self,
        dtype: DType,
        shape: &[usize],
        lo: f64,
        hi: f64,
        trainable: bool,
    ) -> NodeIndex {
        let name = format!("v{}", self.vars.len());
        let ty = TensorType::new(dtype, shape.to_vec());
        let n: usize = shape.iter().product();
        let vals: Vec<f64> = (0..n)
            .map(|_| {
                let x = lo + (hi - lo) * self.next();
                if dtype.is_float() {
                    x
                } else {
                    x.floor()
                }
            })
            .collect();
        self.vars.insert(name.clone(), Tensor::from_f64(&ty, vals));
        self.g.add(
            Op::Variable {
                name,
                init: Init::Zeros,
                trainable,
            },
            &[],
            ty,
            SPAN,
        )
    }

    fn op(&mut self, op: Op, args: &[NodeIndex], declared: TensorType) -> NodeIndex {
        let tys: Vec<&TensorType> = args.iter().map(|&a| self.g.ty(a)).collect();
        let ty =
            infer(&op, &tys, &declared).unwrap_or_else(|e| panic!("{}: {}", op.name(), e.message));
        self.g.add(op, args, ty, SPAN)
    }

    fn f(&mut self, op: Op, args: &[NodeIndex]) -> NodeIndex {
        self.op(op, args, TensorType::scalar(DType::F32))
    }

    /// Runs `targets` on every backend and compares each with the interpreter.
    fn check(&self, targets: &[(NodeIndex, Tol)]) -> Result<(), TestCaseError> {
        let nodes: Vec<NodeIndex> = targets.iter().map(|t| t.0).collect();
        // an op's failure (an integer division by zero) must be the same failure
        let run = |target: Target| -> Result<Vec<Tensor>, String> {
            // two threads, so that the kernels that split over threads do
            let mut d = backend::open(target, SPAN, 2).expect("a device");
            let exe = d
                .compile_run(Arc::new(self.g.clone()), nodes.clone(), SPAN)
                .unwrap_or_else(|e| panic!("{}: {}", target.name(), e.message));
            d.bind(self.vars.clone()).expect("the variables fit");
            d.run(exe, Feeds::default(), StepCtx { step: 3, seed: 7 }, 0)
                .map_err(|e| format!("{}: {}", e.op, e.message))
        };
        let want = run(Target::Interp);
        for target in backends() {
            let got = run(target);
            let (want, got) = match (&want, got) {
                (Ok(w), Ok(g)) => (w, g),
                (Err(w), Err(g)) if *w == g => continue,
                (w, g) => {
                    return Err(TestCaseError::fail(format!(
                        "{}: {g:?} where the interpreter has {w:?}",
                        target.name()
                    )))
                }
            };
            for ((t, tol), (w, h)) in targets.iter().zip(want.iter().zip(&got)) {
                let what = format!("{} on {}", self.g.node(*t).op.name(), target.name());
                compare(w, h, *tol).map_err(|m| TestCaseError::fail(format!("{what}: {m}")))?;
            }
        }
        Ok(())
    }
}

fn compare(want: &Tensor, got: &Tensor, tol: Tol) -> Result<(), String> {
    if want.dtype != got.dtype || want.shape() != got.shape() {
        return Err(format!("{} vs {}", want.ty(), got.ty()));
    }
    match (&want.data, &got.data) {
        (Data::F(a), Data::F(b)) => {
            let largest = a.iter().fold(0f64, |m, &x| m.max(f64::from(x).abs()));
            for (i, (&x, &y)) in a.iter().zip(b.iter()).enumerate() {
                let ok = if x.is_nan() {
                    y.is_nan()
                } else {
                    let bound = match tol {
                        // (no finer than two steps of f32 where it is subnormal,
                        // below 1.2e-38, where a step is 1.4e-45 whatever the value)
                        Tol::Elem => {
                            (1e-5 * f64::from(x).abs()).max(2.0 * f64::from(f32::from_bits(1)))
                        }
                        Tol::Sum(s) => 1e-5 * s,
                        // a gradient far below the loss's scale (1) is the
                        // cancellation of terms of that scale, rounded to ε of them
                        Tol::Grad => 1e-4 * largest.max(1e-2),
                    };
                    x == y || (f64::from(x) - f64::from(y)).abs() <= bound
                };
                if !ok {
                    return Err(format!("element {i}: {y} where the interpreter has {x}"));
                }
            }
            Ok(())
        }
        _ if want.data == got.data => Ok(()),
        _ => Err(format!(
            "{:?} where the interpreter has {:?}",
            got.to_f64(),
            want.to_f64()
        )),
    }
}

fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(prop_oneof![Just(1usize), 2usize..6, 15usize..20], 0..4)
}

/// A shape that broadcasts to `s`: a suffix of it, with some axes set to 1.
fn broadcast_of(s: &[usize], drop: usize, ones: u32) -> Vec<usize> {
    s[drop.min(s.len())..]
        .iter()
        .enumerate()
        .map(|(k, &d)| if ones >> k & 1 == 1 { 1 } else { d })
        .collect()
}

const UNARY: [UnaryOp; 16] = [
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Sqrt,
    UnaryOp::Rsqrt,
    UnaryOp::Square,
    UnaryOp::Tanh,
    UnaryOp::Sigmoid,
    UnaryOp::Relu,
    UnaryOp::Floor,
    UnaryOp::Sign,
    UnaryOp::Sin,
    UnaryOp::Cos,
    UnaryOp::Erf,
    UnaryOp::StopGradient,
];

const BINARY: [BinaryOp; 8] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Max,
    BinaryOp::Min,
    BinaryOp::Lt,
    BinaryOp::Ge,
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Unary float ops, fused in a chain after a broadcast add, over wide ranges
    /// (including values where exp overflows and log's argument is negative: NaN).
    #[test]
    fn unary_ops(s in shape(), seed in any::<u64>(), which in 0..UNARY.len(), wide in any::<bool>()) {
        let mut c = Case::new(seed);
        let r = if wide { 120.0 } else { 4.0 };
        let x = c.value(DType::F32, &s, -r, r);
        let bs = broadcast_of(&s, 1, 1);
        let b = c.value(DType::F32, &bs, -1.0, 1.0);
        let sum = c.f(Op::Binary(BinaryOp::Add), &[x, b]);
        let y = c.f(Op::Unary(UNARY[which]), &[sum]);
        c.check(&[(y, Tol::Elem)])?;
    }

    /// Binary ops with broadcasting on either side, integer ones too.
    #[test]
    fn binary_ops(s in shape(), seed in any::<u64>(), which in 0..BINARY.len(), drop in 0usize..3, ones in any::<u32>(), int in any::<bool>()) {
        let mut c = Case::new(seed);
        let dtype = if int { DType::I32 } else { DType::F32 };
        let x = c.value(dtype, &s, -50.0, 50.0);
        let y = c.value(dtype, &broadcast_of(&s, drop, ones), 1.0, 9.0);
        let op = BINARY[which];
        let z = c.op(Op::Binary(op), &[y, x], TensorType::scalar(dtype));
        c.check(&[(z, Tol::Elem)])?;
    }

    /// Reductions over random axes, with and without keep_dims, of an elemental
    /// operand.
    #[test]
    fn reductions(s in shape(), seed in any::<u64>(), mask in any::<u32>(), keep in any::<bool>(), which in 0usize..4) {
        let mut c = Case::new(seed);
        let x = c.value(DType::F32, &s, -2.0, 2.0);
        let e = c.f(Op::Unary(UnaryOp::Square), &[x]);
        let axes: Vec<usize> = (0..s.len()).filter(|k| mask >> k & 1 == 1).collect();
        let op = [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min][which];
        let r = c.f(Op::Reduce { op, axes: axes.clone(), keep_dims: keep }, &[e]);
        let n: usize = axes.iter().map(|&a| s[a]).product();
        c.check(&[(r, Tol::Sum(4.0 * n as f64))])?;
    }

    /// Softmax and log-softmax along any axis.
    #[test]
    fn softmax_rows(s in shape(), seed in any::<u64>(), axis in 0usize..4, log in any::<bool>()) {
        prop_assume!(!s.is_empty());
        let mut c = Case::new(seed);
        let axis = axis % s.len();
        let x = c.value(DType::F32, &s, -5.0, 5.0);
        let op = if log { Op::LogSoftmax { axis } } else { Op::Softmax { axis } };
        let y = c.f(op, &[x]);
        c.check(&[(y, Tol::Sum(10.0))])?;
    }

    /// Matrix products, with either operand transposed (a strided view) and batched.
    #[test]
    fn matmuls(m in 1usize..40, k in 1usize..40, n in 1usize..40, batch in 0usize..3, ta in any::<bool>(), tb in any::<bool>(), seed in any::<u64>()) {
        let mut c = Case::new(seed);
        let lead: Vec<usize> = if batch == 0 { vec![] } else { vec![batch] };
        let dims = |r: usize, cc: usize, t: bool| -> Vec<usize> {
            let mut v = lead.clone();
            if t { v.extend([cc, r]) } else { v.extend([r, cc]) }
            v
        };
        let swap = |c: &mut Case, x: NodeIndex, t: bool| -> NodeIndex {
            if !t { return x; }
            let r = c.g.ty(x).shape.len();
            let mut perm: Vec<usize> = (0..r).collect();
            perm.swap(r - 2, r - 1);
            c.f(Op::Transpose { perm }, &[x])
        };
        let a = c.value(DType::F32, &dims(m, k, ta), -1.0, 1.0);
        let b = c.value(DType::F32, &dims(k, n, tb), -1.0, 1.0);
        let (a, b) = (swap(&mut c, a, ta), swap(&mut c, b, tb));
        let y = c.f(Op::MatMul, &[a, b]);
        c.check(&[(y, Tol::Sum(k as f64))])?;
    }

    /// Index ops: one_hot of checked labels, argmax, gather, concat, slice, transpose,
    /// select and casts between every dtype.
    #[test]
    fn index_ops(rows in 1usize..20, cols in 1usize..20, seed in any::<u64>(), to in 0usize..5) {
        let mut c = Case::new(seed);
        let labels = c.value(DType::I32, &[rows], 0.0, cols as f64);
        let checked = c.op(Op::CheckIndices { depth: cols }, &[labels], TensorType::scalar(DType::I32));
        let oh = c.op(Op::OneHot { depth: cols }, &[checked], TensorType::scalar(DType::F32));
        let x = c.value(DType::F32, &[rows, cols], -3.0, 3.0);
        let am = c.op(Op::ArgMax { axis: 1 }, &[x], TensorType::scalar(DType::I32));
        let table = c.value(DType::F32, &[cols, 3], -1.0, 1.0);
        let g = c.op(Op::Gather, &[table, checked], TensorType::scalar(DType::F32));
        let cat = c.f(Op::Concat { axis: 1 }, &[x, oh]);
        let sl = c.f(Op::Slice { axis: 1, start: cols / 2, end: cols }, &[x]);
        let tr = c.f(Op::Transpose { perm: vec![1, 0] }, &[x]);
        let pos = c.f(Op::Binary(BinaryOp::Gt), &[x, oh]);
        let sel = c.f(Op::Select, &[pos, x, oh]);
        let dt = [DType::I32, DType::U8, DType::Bool, DType::F16, DType::BF16][to];
        let big = c.value(DType::F32, &[rows, cols], -400.0, 400.0);
        let cast = c.op(Op::Cast, &[big], TensorType::scalar(dt));
        c.check(&[
            (oh, Tol::Elem),
            (am, Tol::Elem),
            (g, Tol::Elem),
            (cat, Tol::Elem),
            (sl, Tol::Elem),
            (tr, Tol::Elem),
            (sel, Tol::Elem),
            (cast, Tol::Elem),
        ])?;
    }

    /// Gradients (made by autodiff) of an MLP-like chain: a matmul, a broadcast add,
    /// an activation, a softmax or log-softmax, a mean or a maximum over the batch.
    #[test]
    fn gradients(b in 1usize..20, k in 1usize..20, n in 2usize..12, seed in any::<u64>(), act in 0usize..5, log in any::<bool>(), max in any::<bool>()) {
        let mut c = Case::new(seed);
        let x = c.value(DType::F32, &[b, k], -1.0, 1.0);
        // weights scaled as Glorot's, so that pre-activations stay O(1) (exp of a sum
        // of 20 unit terms would make every gradient a cancellation of huge ones)
        let scale = 1.0 / (k as f64).sqrt();
        let w = c.variable(DType::F32, &[k, n], -scale, scale, true);
        let bias = c.variable(DType::F32, &[n], -0.5, 0.5, true);
        let h = c.f(Op::MatMul, &[x, w]);
        let h = c.f(Op::Binary(BinaryOp::Add), &[h, bias]);
        let a = [UnaryOp::Relu, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Exp, UnaryOp::Square][act];
        let h = c.f(Op::Unary(a), &[h]);
        let sm = if log { Op::LogSoftmax { axis: 1 } } else { Op::Softmax { axis: 1 } };
        let p = c.f(sm, &[h]);
        let y = c.value(DType::F32, &[b, n], 0.0, 1.0);
        let t = c.f(Op::Binary(BinaryOp::Mul), &[p, y]);
        let r = c.f(Op::Reduce { op: ReduceOp::Sum, axes: vec![1], keep_dims: false }, &[t]);
        let op = if max { ReduceOp::Max } else { ReduceOp::Mean };
        let loss = c.f(Op::Reduce { op, axes: vec![0], keep_dims: false }, &[r]);
        let mut diags = est::diag::Diags::default();
        let grads = est::passes::autodiff::gradients(&mut c.g, loss, &mut diags).expect("differentiable");
        let mut targets: Vec<(NodeIndex, Tol)> = grads.iter().map(|&(_, g)| (g, Tol::Grad)).collect();
        targets.push((loss, Tol::Sum(n as f64)));
        c.check(&targets)?;
    }

    /// Convolutions and pooling, forward and (through autodiff) both gradients of the
    /// convolution and the pooling's gradient, over random geometry: strides, dilation,
    /// SAME and VALID padding, max or average pooling, rows of up to 38 pixels (the
    /// host's direct kernels then have blocks inside and at the borders). Random ops (uniform and normal)
    /// draw the interpreter's bits exactly.
    #[test]
    fn window_ops(n in 1usize..3, h in 1usize..9, w in 1usize..9, ci in 1usize..6, co in 1usize..7, wide in 0usize..4, k in 1usize..4, stride in 1usize..3, dil in 1usize..3, same in any::<bool>(), max in any::<bool>(), seed in any::<u64>()) {
        let padding = if same { Padding::Same } else { Padding::Valid };
        // channels in multiples of 16 take the host's direct convolutions
        let co = if wide & 1 == 1 { 16 * (1 + co % 2) } else { co };
        let ci = if wide & 2 == 2 { 16 } else { ci };
        // rows wide enough for blocks of pixels clear of the padding on both sides
        let w = if wide == 1 && seed % 2 == 0 { 30 + w } else { w };
        prop_assume!(same || (k - 1) * dil < h.min(w));
        let mut c = Case::new(seed);
        let x = c.variable(DType::F32, &[n, h, w, ci], -1.0, 1.0, true);
        let f = c.variable(DType::F32, &[k, k, ci, co], -1.0, 1.0, true);
        let conv = Conv { strides: [stride, stride], padding, dilation: [dil, dil] };
        let y = c.f(Op::Conv2d(conv), &[x, f]);
        // overlapping windows with padding, or windows tiling the input
        let ys = c.g.ty(y).shape.to_vec();
        let tile = seed % 3 == 0 && ys[1] >= 2 && ys[2] >= 2;
        let pool = if tile {
            Pool { window: [2, 2], strides: [2, 2], padding: Padding::Valid }
        } else {
            Pool { window: [2, 2], strides: [2, 1], padding: Padding::Same }
        };
        let p = c.f(if max { Op::MaxPool2d(pool) } else { Op::AvgPool2d(pool) }, &[y]);
        let ps = c.g.ty(p).shape.to_vec();
        let r = c.op(Op::RandomUniform { stream: seed }, &[], TensorType::new(DType::F32, ps.clone()));
        let z = c.op(Op::RandomNormal { stream: seed ^ 1 }, &[], TensorType::new(DType::F32, ps));
        let t = c.f(Op::Binary(BinaryOp::Mul), &[p, r]);
        let all: Vec<usize> = (0..4).collect();
        let loss = c.f(Op::Reduce { op: ReduceOp::Sum, axes: all, keep_dims: false }, &[t]);
        let mut diags = est::diag::Diags::default();
        let grads = est::passes::autodiff::gradients(&mut c.g, loss, &mut diags).expect("differentiable");
        let terms = (k * k * ci) as f64;
        let mut targets = vec![(y, Tol::Sum(terms)), (p, Tol::Sum(terms)), (r, Tol::Elem), (z, Tol::Elem)];
        targets.extend(grads.iter().map(|&(_, g)| (g, Tol::Grad)));
        c.check(&targets)?;
    }
}

/// The layers of the MNIST CNN at batch 8 (conv 5x5 1->32 on 28x28 and 32->64 on
/// 14x14, SAME), forward and both gradients: large enough for the GEMM's blocked paths
/// and for the splits over threads.
#[test]
fn mnist_sized_convolutions() {
    for (h, ci, co) in [(28, 1, 32), (14, 32, 64)] {
        let mut c = Case::new(h as u64);
        let x = c.variable(DType::F32, &[8, h, h, ci], -1.0, 1.0, true);
        let f = c.variable(DType::F32, &[5, 5, ci, co], -0.2, 0.2, true);
        let conv = Conv {
            strides: [1, 1],
            padding: Padding::Same,
            dilation: [1, 1],
        };
        let y = c.f(Op::Conv2d(conv), &[x, f]);
        let ys = c.g.ty(y).shape.to_vec();
        let r = c.value(DType::F32, &ys, -1.0, 1.0);
        let t = c.f(Op::Binary(BinaryOp::Mul), &[y, r]);
        let loss = c.f(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: vec![0, 1, 2, 3],
                keep_dims: false,
            },
            &[t],
        );
        let mut diags = est::diag::Diags::default();
        let grads = est::passes::autodiff::gradients(&mut c.g, loss, &mut diags).unwrap();
        let mut targets = vec![(y, Tol::Sum((25 * ci) as f64 * 0.2))];
        targets.extend(grads.iter().map(|&(_, g)| (g, Tol::Grad)));
        c.check(&targets).unwrap();
    }
}
