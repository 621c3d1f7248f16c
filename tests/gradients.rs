//! Every differentiable op's gradient (made by the autodiff pass, run by the
//! interpreter) against central finite differences of the interpreter's forward pass.
//!
//! Each case builds `loss = reduce_sum(op(x...) * w)` with fixed weights `w`, so every
//! output element matters. Inputs are distinct values spaced 0.1 apart, so no finite
//! difference (eps = 1e-2) crosses a kink of relu, max or a pooling window. Tolerance:
//! |analytic - numeric| <= 2e-2 * max(1, |numeric|) (f32 forward passes).

use est::backend::interp::{self, OpEnv, Tensor};
use est::diag::Diags;
use est::ir::{
    infer, BinaryOp, Conv, DType, Graph, Init, Op, Output, Padding, Pool, ReduceOp, Role,
    TensorType, UnaryOp,
};
use est::span::{FileId, Span};
use petgraph::stable_graph::NodeIndex;
use rustc_hash::FxHashMap;

const SPAN: Span = Span {
    file: FileId(0),
    lo: 0,
    hi: 0,
};

struct Case {
    g: Graph,
    vars: Vec<(String, TensorType)>,
    /// The finite-difference step: 1e-2, or larger for ops without kinks whose
    /// many-term sums make small steps noisy in f32.
    eps: f64,
}

impl Case {
    fn new() -> Case {
        Case {
            g: Graph::new(),
            vars: Vec::new(),
            eps: 1e-2,
        }
    }

    fn var(&mut self, name: &str, shape: &[usize]) -> NodeIndex {
        let ty = TensorType::new(DType::F32, shape.to_vec());
        self.vars.push((name.to_string(), ty.clone()));
        self.g.add(
            Op::Variable {
                name: name.into(),
                init: Init::Zeros,
                trainable: true,
            },
            &[],
            ty,
            SPAN,
        )
    }

    fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> NodeIndex {
        self.g.add(
            Op::Input { name: name.into() },
            &[],
            TensorType::new(dtype, shape.to_vec()),
            SPAN,
        )
    }

    fn op(&mut self, op: Op, args: &[NodeIndex]) -> NodeIndex {
        self.op_as(op, args, TensorType::scalar(DType::F32))
    }

    fn op_as(&mut self, op: Op, args: &[NodeIndex], declared: TensorType) -> NodeIndex {
        let tys: Vec<&TensorType> = args.iter().map(|&a| self.g.ty(a)).collect();
        let ty =
            infer(&op, &tys, &declared).unwrap_or_else(|e| panic!("{}: {}", op.name(), e.message));
        self.g.add(op, args, ty, SPAN)
    }
}

/// Distinct values spaced 0.1 apart (a fixed permutation), shifted by `lo`.
fn spaced(n: usize, lo: f64, salt: usize) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..n).collect();
    // a deterministic shuffle: multiply by a unit mod n
    let step = (0..n)
        .map(|k| 7 + 2 * k + salt)
        .find(|&s| gcd(s, n) == 1)
        .unwrap_or(1);
    for (i, v) in idx.iter_mut().enumerate() {
        *v = (i * step + salt) % n;
    }
    idx.into_iter()
        .map(|k| lo + 0.1 * k as f64 + 0.05)
        .collect()
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn forward(
    g: &Graph,
    loss: NodeIndex,
    vars: &FxHashMap<String, Tensor>,
    feeds: &FxHashMap<String, Tensor>,
) -> f64 {
    let plan = interp::Plan::new(g, &[loss], &Default::default());
    let mut values = interp::Values::new(0);
    let env = interp::Env {
        feeds,
        vars,
        op: OpEnv {
            step: 0,
            seed: 1,
            shard: 0,
        },
    };
    interp::execute(g, &plan, &env, &mut values).expect("forward");
    values.get(loss).expect("loss").scalar()
}

/// The analytic gradients of `reduce_sum(out * w)` for every variable of the case (`w`
/// fixed weights, fed as `__w`), as the autodiff pass makes them and the interpreter
/// runs them: per variable, its name, type, values and gradient; with the graph, the
/// loss, the variables and the feeds, to run the forward pass again.
struct Analytic {
    g: Graph,
    loss: NodeIndex,
    vars: FxHashMap<String, Tensor>,
    feeds: FxHashMap<String, Tensor>,
    grads: Vec<(String, TensorType, Vec<f64>)>,
}

/// `lo` is where each variable's values start (positive for log, sqrt, ...).
fn analytic(
    name: &str,
    mut c: Case,
    out: NodeIndex,
    lo: f64,
    feeds: FxHashMap<String, Tensor>,
) -> Analytic {
    let oty = c.g.ty(out).clone();
    let w = c.input("__w", DType::F32, &oty.shape);
    let prod = c.op(Op::Binary(BinaryOp::Mul), &[out, w]);
    let axes: Vec<usize> = (0..oty.rank()).collect();
    let loss = c.op(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes,
            keep_dims: false,
        },
        &[prod],
    );
    let mut feeds = feeds;
    let wv = spaced(oty.elements(), -0.9, 3);
    feeds.insert(
        "__w".into(),
        Tensor::from_f64(&TensorType::new(DType::F32, oty.shape.clone()), wv),
    );
    let mut diags = Diags::default();
    let grads =
        est::passes::autodiff::gradients(&mut c.g, loss, &mut diags).expect("differentiable");
    assert!(diags.is_empty(), "{name}: {diags:?}");
    est::passes::verify(&c.g).unwrap_or_else(|e| panic!("{name}: autodiff broke the graph: {e}"));
    let mut vars = FxHashMap::default();
    for (i, (v, ty)) in c.vars.iter().enumerate() {
        // each variable offset by 0.03 so that two variables never tie
        let vals = spaced(ty.elements(), lo + 0.03 * i as f64, i);
        vars.insert(v.clone(), Tensor::from_f64(ty, vals));
    }
    for (vnode, gnode) in &grads {
        c.g.outputs.push(Output {
            name: format!("{}", vnode.index()),
            role: Role::Update,
            node: *gnode,
        });
    }
    let results = interp::run_outputs(
        &c.g,
        &feeds,
        &vars,
        OpEnv {
            step: 0,
            seed: 1,
            shard: 0,
        },
    )
    .expect("gradients");
    assert_eq!(
        grads.len(),
        c.vars.len(),
        "{name}: every variable gets a gradient"
    );
    let mut out = Vec::new();
    for ((vnode, _), (_, gt)) in grads
        .iter()
        .zip(results.iter().skip(results.len() - grads.len()))
    {
        let Op::Variable { name: vname, .. } = &c.g.node(*vnode).op else {
            unreachable!()
        };
        let ty = c.g.ty(*vnode).clone();
        assert_eq!(
            gt.shape(),
            ty.shape.as_slice(),
            "{name}: gradient shape of {vname}"
        );
        out.push((vname.clone(), ty, gt.to_f64()));
    }
    Analytic {
        g: c.g,
        loss,
        vars,
        feeds,
        grads: out,
    }
}

/// Checks the gradients of `reduce_sum(out * w)` for every variable of the case
/// against central finite differences.
fn check(name: &str, c: Case, out: NodeIndex, lo: f64, feeds: FxHashMap<String, Tensor>) {
    let eps = c.eps;
    let a = analytic(name, c, out, lo, feeds);
    for (vname, ty, analytic) in &a.grads {
        let base = a.vars[vname].to_f64();
        for i in 0..base.len() {
            let at = |d: f64| {
                let mut v = base.clone();
                v[i] += d;
                let mut vs = a.vars.clone();
                vs.insert(vname.clone(), Tensor::from_f64(ty, v));
                forward(&a.g, a.loss, &vs, &a.feeds)
            };
            let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
            let tol = 2e-2 * numeric.abs().max(1.0);
            assert!(
                (analytic[i] - numeric).abs() <= tol,
                "{name}: d/d{vname}[{i}] analytic {} vs numeric {numeric}",
                analytic[i]
            );
        }
    }
}

fn none() -> FxHashMap<String, Tensor> {
    FxHashMap::default()
}

#[test]
fn unary_gradients() {
    let cases = [
        (UnaryOp::Neg, -1.0),
        (UnaryOp::Abs, -1.0),
        (UnaryOp::Exp, -1.0),
        (UnaryOp::Log, 0.5),
        (UnaryOp::Sqrt, 0.5),
        (UnaryOp::Rsqrt, 0.5),
        (UnaryOp::Square, -1.0),
        (UnaryOp::Tanh, -1.0),
        (UnaryOp::Sigmoid, -1.0),
        (UnaryOp::Relu, -1.0),
        (UnaryOp::Sin, -1.0),
        (UnaryOp::Cos, -1.0),
        (UnaryOp::Erf, -1.0),
    ];
    for (u, lo) in cases {
        let mut c = Case::new();
        let x = c.var("x", &[3, 4]);
        let y = c.op(Op::Unary(u), &[x]);
        check(Op::Unary(u).name(), c, y, lo, none());
    }
}

/// `stop_gradient(x)` is a constant to the train step: the gradient of
/// `reduce_sum(x * stop_gradient(x) * w)` is `x * w`, not the `2 x w` finite
/// differences see.
#[test]
fn stop_gradient_stops_gradients() {
    let mut c = Case::new();
    let x = c.var("x", &[3, 4]);
    let s = c.op(Op::Unary(UnaryOp::StopGradient), &[x]);
    let y = c.op(Op::Binary(BinaryOp::Mul), &[x, s]);
    let a = analytic("stop_gradient", c, y, -1.0, none());
    let xs = a.vars["x"].to_f64();
    let w = a.feeds["__w"].to_f64();
    let (_, _, g) = &a.grads[0];
    for i in 0..xs.len() {
        let want = xs[i] * w[i];
        assert!((g[i] - want).abs() <= 1e-6, "d/dx[{i}] {} vs {want}", g[i]);
    }
}

#[test]
fn binary_gradients_with_broadcasting() {
    let ops = [
        (BinaryOp::Add, -1.0),
        (BinaryOp::Sub, -1.0),
        (BinaryOp::Mul, -1.0),
        (BinaryOp::Div, 0.5),
        (BinaryOp::Pow, 0.5),
        (BinaryOp::Max, -1.0),
        (BinaryOp::Min, -1.0),
    ];
    for (b, lo) in ops {
        for (sa, sb) in [
            (vec![3, 4], vec![3, 4]),
            (vec![3, 4], vec![4]),
            (vec![3, 1], vec![1, 4]),
            (vec![2, 3, 4], vec![]),
        ] {
            let mut c = Case::new();
            let x = c.var("a", &sa);
            let y = c.var("b", &sb);
            let z = c.op(Op::Binary(b), &[x, y]);
            check(
                &format!("{} {sa:?} {sb:?}", Op::Binary(b).name()),
                c,
                z,
                lo,
                none(),
            );
        }
    }
}

#[test]
fn select_and_cast_gradients() {
    let mut c = Case::new();
    let x = c.var("a", &[2, 3]);
    let y = c.var("b", &[2, 3]);
    let cond = c.input("cond", DType::Bool, &[2, 3]);
    let z = c.op(Op::Select, &[cond, x, y]);
    let mut feeds = none();
    feeds.insert(
        "cond".into(),
        Tensor::from_f64(
            &TensorType::new(DType::Bool, vec![2, 3]),
            vec![1.0, 0.0, 1.0, 1.0, 0.0, 0.0],
        ),
    );
    check("select", c, z, -1.0, feeds);

    let mut c = Case::new();
    let x = c.var("a", &[2, 3]);
    let h = c.op_as(Op::Cast, &[x], TensorType::new(DType::F16, vec![2, 3]));
    let back = c.op_as(Op::Cast, &[h], TensorType::new(DType::F32, vec![2, 3]));
    let sq = c.op(Op::Unary(UnaryOp::Square), &[back]);
    check("cast f32 -> f16 -> f32", c, sq, -1.0, none());
}

#[test]
fn reduction_gradients() {
    for op in [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
    ] {
        for (axes, keep) in [(vec![1], false), (vec![0, 2], true), (vec![0, 1, 2], false)] {
            let mut c = Case::new();
            let x = c.var("x", &[2, 3, 2]);
            let y = c.op(
                Op::Reduce {
                    op,
                    axes: axes.clone(),
                    keep_dims: keep,
                },
                &[x],
            );
            let lo = if op == ReduceOp::Prod { 0.5 } else { -0.6 };
            check(&format!("{op:?} {axes:?} keep={keep}"), c, y, lo, none());
        }
    }
}

#[test]
fn matmul_gradients() {
    for (sa, sb) in [
        (vec![3, 4], vec![4, 2]),
        (vec![2, 3, 4], vec![4, 5]),
        (vec![2, 3, 4], vec![2, 4, 2]),
    ] {
        let mut c = Case::new();
        let a = c.var("a", &sa);
        let b = c.var("b", &sb);
        let y = c.op(Op::MatMul, &[a, b]);
        check(&format!("matmul {sa:?} {sb:?}"), c, y, -1.0, none());
    }
}

#[test]
fn shape_op_gradients() {
    let mut c = Case::new();
    let x = c.var("x", &[2, 3, 4]);
    let y = c.op(
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        &[x],
    );
    check("transpose", c, y, -1.0, none());

    let mut c = Case::new();
    let x = c.var("x", &[2, 6]);
    let y = c.op_as(Op::Reshape, &[x], TensorType::new(DType::F32, vec![3, 4]));
    check("reshape", c, y, -1.0, none());

    let mut c = Case::new();
    let x = c.var("x", &[3, 1]);
    let y = c.op_as(
        Op::BroadcastTo,
        &[x],
        TensorType::new(DType::F32, vec![2, 3, 4]),
    );
    check("broadcast_to", c, y, -1.0, none());

    let mut c = Case::new();
    let a = c.var("a", &[2, 3]);
    let b = c.var("b", &[2, 2]);
    let y = c.op(Op::Concat { axis: 1 }, &[a, b]);
    check("concat", c, y, -1.0, none());

    let mut c = Case::new();
    let x = c.var("x", &[4, 5]);
    let y = c.op(
        Op::Slice {
            axis: 1,
            start: 1,
            end: 3,
        },
        &[x],
    );
    check("slice", c, y, -1.0, none());

    let mut c = Case::new();
    let t = c.var("table", &[5, 3]);
    let idx = c.input("idx", DType::I32, &[4]);
    let y = c.op(Op::Gather, &[t, idx]);
    let mut feeds = none();
    feeds.insert(
        "idx".into(),
        Tensor::from_f64(
            &TensorType::new(DType::I32, vec![4]),
            vec![4.0, 0.0, 4.0, 2.0],
        ),
    );
    check("gather (repeated rows)", c, y, -1.0, feeds);

    let mut c = Case::new();
    let x = c.var("x", &[2, 3]);
    let y = c.op(Op::CrossShardMean, &[x]);
    check("cross_shard_mean", c, y, -1.0, none());
}

/// A case of slices of one `[3, 8]` variable along its last axis, each through an op of
/// its own, set side by side (as a recurrent step's gates are cut from one product).
fn sliced(runs: &[(usize, usize)]) -> (Case, NodeIndex) {
    let mut c = Case::new();
    let x = c.var("x", &[3, 8]);
    let parts: Vec<NodeIndex> = (runs.iter().enumerate())
        .map(|(i, &(start, end))| {
            let s = c.op(
                Op::Slice {
                    axis: 1,
                    start,
                    end,
                },
                &[x],
            );
            match i % 3 {
                0 => c.op(Op::Unary(UnaryOp::Exp), &[s]),
                1 => c.op(Op::Unary(UnaryOp::Sin), &[s]),
                _ => s,
            }
        })
        .collect();
    let y = c.op(Op::Concat { axis: 1 }, &parts);
    (c, y)
}

/// The `add`s among a graph's nodes.
fn adds(g: &Graph) -> usize {
    (g.g.node_indices())
        .filter(|&n| matches!(g.node(n).op, Op::Binary(BinaryOp::Add)))
        .count()
}

#[test]
fn slices_of_one_value_send_back_their_pieces_side_by_side() {
    // apart (with a gap, which takes zeros): the pieces concatenated, no sum
    let apart = [(0, 2), (5, 8), (2, 4)];
    let (c, y) = sliced(&apart);
    check("slices apart", c, y, -1.0, none());
    let (c, y) = sliced(&apart);
    assert_eq!(adds(&analytic("slices apart", c, y, -1.0, none()).g), 0);
    // each overlapping each: summed
    let overlapping = [(0, 4), (2, 6), (3, 8)];
    let (c, y) = sliced(&overlapping);
    check("slices overlapping", c, y, -1.0, none());
    let (c, y) = sliced(&overlapping);
    assert_eq!(
        adds(&analytic("slices overlapping", c, y, -1.0, none()).g),
        2
    );
}

#[test]
fn softmax_gradients() {
    for axis in [0, 1] {
        let mut c = Case::new();
        let x = c.var("x", &[3, 4]);
        let y = c.op(Op::Softmax { axis }, &[x]);
        check("softmax", c, y, -1.0, none());
        let mut c = Case::new();
        let x = c.var("x", &[3, 4]);
        let y = c.op(Op::LogSoftmax { axis }, &[x]);
        check("log_softmax", c, y, -1.0, none());
    }
}

#[test]
fn conv_and_pool_gradients() {
    for (padding, strides, dilation) in [
        (Padding::Same, [1, 1], [1, 1]),
        (Padding::Valid, [1, 1], [1, 1]),
        (Padding::Same, [2, 2], [1, 1]),
        (Padding::Valid, [1, 2], [2, 1]),
    ] {
        let mut c = Case::new();
        c.eps = 0.25; // linear in each operand: any step is exact but for rounding
        let x = c.var("x", &[2, 5, 5, 2]);
        let w = c.var("w", &[3, 3, 2, 3]);
        let y = c.op(
            Op::Conv2d(Conv {
                strides,
                padding,
                dilation,
            }),
            &[x, w],
        );
        check(
            &format!("conv2d {padding:?} {strides:?} {dilation:?}"),
            c,
            y,
            -2.0,
            none(),
        );
    }
    for (padding, window, strides) in [
        (Padding::Valid, [2, 2], [2, 2]),
        (Padding::Same, [3, 3], [2, 2]),
        (Padding::Same, [2, 2], [1, 1]),
    ] {
        let mut c = Case::new();
        let x = c.var("x", &[2, 5, 5, 2]);
        let y = c.op(
            Op::MaxPool2d(Pool {
                window,
                strides,
                padding,
            }),
            &[x],
        );
        check(
            &format!("max_pool2d {padding:?} {window:?}"),
            c,
            y,
            -2.0,
            none(),
        );
        let mut c = Case::new();
        let x = c.var("x", &[2, 5, 5, 2]);
        let y = c.op(
            Op::AvgPool2d(Pool {
                window,
                strides,
                padding,
            }),
            &[x],
        );
        check(
            &format!("avg_pool2d {padding:?} {window:?}"),
            c,
            y,
            -2.0,
            none(),
        );
    }
}

#[test]
fn a_path_through_argmax_is_e0801() {
    let mut c = Case::new();
    let x = c.var("x", &[2, 3]);
    let a = c.op(Op::ArgMax { axis: 1 }, &[x]);
    let f = c.op_as(Op::Cast, &[a], TensorType::new(DType::F32, vec![2]));
    let loss = c.op(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0],
            keep_dims: false,
        },
        &[f],
    );
    let mut diags = Diags::default();
    assert!(est::passes::autodiff::gradients(&mut c.g, loss, &mut diags).is_none());
    let codes: Vec<&str> = diags.iter().map(|d| d.code.id()).collect();
    assert_eq!(codes, ["E0801"]);
}

/// The gradients of ops that pick among their inputs (relu, maximum, minimum, the
/// extremum reductions) go to the NaN their forward pass propagated, so a NaN input is
/// seen in the gradient instead of turning into a zero.
#[test]
fn gradients_follow_nan() {
    let nan = f64::NAN;
    let grad_of = |build: &dyn Fn(&mut Case, NodeIndex) -> NodeIndex, x: Vec<f64>| -> Vec<f64> {
        let mut c = Case::new();
        let v = c.var("x", &[x.len()]);
        let y = build(&mut c, v);
        let r = c.g.ty(y).rank();
        let loss = c.op(
            Op::Reduce {
                op: ReduceOp::Sum,
                axes: (0..r).collect(),
                keep_dims: false,
            },
            &[y],
        );
        let mut diags = Diags::default();
        let grads = est::passes::autodiff::gradients(&mut c.g, loss, &mut diags).expect("grads");
        c.g.outputs.push(Output {
            name: "dx".into(),
            role: Role::Update,
            node: grads[0].1,
        });
        let mut vars = FxHashMap::default();
        let ty = TensorType::new(DType::F32, vec![x.len()]);
        vars.insert("x".to_string(), Tensor::from_f64(&ty, x));
        let env = OpEnv {
            step: 0,
            seed: 1,
            shard: 0,
        };
        let out = interp::run_outputs(&c.g, &none(), &vars, env).expect("run");
        out[0].1.to_f64()
    };
    let relu = |c: &mut Case, v| c.op(Op::Unary(UnaryOp::Relu), &[v]);
    let g = grad_of(&relu, vec![-1.0, nan, 2.0]);
    assert_eq!((g[0], g[2]), (0.0, 1.0));
    assert_eq!(g[1], 1.0, "relu's gradient passes through a NaN input");
    for b in [BinaryOp::Max, BinaryOp::Min] {
        let op = move |c: &mut Case, v: NodeIndex| {
            let one = c.op(
                Op::Const {
                    bits: 1f64.to_bits(),
                },
                &[],
            );
            c.op(Op::Binary(b), &[v, one])
        };
        let g = grad_of(&op, vec![nan, 5.0, -5.0]);
        let want = if b == BinaryOp::Max {
            [1.0, 1.0, 0.0]
        } else {
            [1.0, 0.0, 1.0]
        };
        assert_eq!(g, want, "{}: to the NaN operand", Op::Binary(b).name());
    }
    for r in [ReduceOp::Max, ReduceOp::Min] {
        let op = move |c: &mut Case, v: NodeIndex| {
            c.op(
                Op::Reduce {
                    op: r,
                    axes: vec![0],
                    keep_dims: false,
                },
                &[v],
            )
        };
        let g = grad_of(&op, vec![3.0, nan, 1.0]);
        assert_eq!(g, [0.0, 1.0, 0.0], "reduce {r:?}: to the NaN");
    }
}

/// The gradient of conv2d_transpose (conv2d's input gradient as a forward op): its
/// input's is a convolution, its filter's conv2d's filter gradient with the roles of
/// input and output gradient exchanged.
#[test]
fn conv2d_transpose_gradients() {
    for (padding, strides, out) in [
        (Padding::Same, [2, 2], [2, 6, 6, 3]),
        (Padding::Valid, [2, 1], [2, 7, 5, 3]),
        (Padding::Same, [1, 1], [2, 3, 3, 3]),
    ] {
        let mut c = Case::new();
        c.eps = 0.25; // linear in each operand
        let x = c.var("x", &[2, 3, 3, 2]);
        let w = c.var("w", &[3, 3, 3, 2]);
        let y = c.op_as(
            Op::Conv2dBackpropInput(Conv {
                strides,
                padding,
                dilation: [1, 1],
            }),
            &[x, w],
            TensorType::new(DType::F32, out.to_vec()),
        );
        check(
            &format!("conv2d_transpose {padding:?} {strides:?}"),
            c,
            y,
            -2.0,
            none(),
        );
    }
}

/// The op an est expression makes of `x`, a variable of `shape`: the predict graph of
/// a program whose one prediction is `expr` (flattened and repeated for each example),
/// as a case (its trainable variables the case's), and the prediction's node.
fn elaborated(shape: &[usize], expr: &str) -> (Case, NodeIndex) {
    let src = format!(
        r#"
use std.image
use std.nn.{{unrolled_lstm, unrolled_gru, layer_norm}}
input ones() {{ range(2) |> map |i| (broadcast_to(cast(i, f32), [1]), 0.0) |> batch(2) }}
model m(features: f32[B, 1], labels: f32[B]) {{
  let x = variable("x", {shape:?}, init: "zeros")
  let loss = reduce_mean(features)
  train {{ minimize loss with sgd(lr: 0.1) }}
  predict {{
    let e = {expr}
    let n = 1
    for d in e.shape {{ n = n * d }}
    // every element of `e`, for each example of the batch
    y = broadcast_to(reshape(e, [1, n]), [features.shape[0], n])
  }}
}}
estimator m {{
  model = m
  train_input = ones()
  predict_input = ones()
  config {{ save_checkpoint_steps = 100 }}
}}
"#
    );
    let p = est::Program::from_source("grad.est", &src, None);
    let opts = est::CheckOptions {
        target: est::elab::Target::Interp,
        modes: vec![est::syntax::ast::SectionKind::Predict],
        ..Default::default()
    };
    let checked = est::check(&p, &opts);
    assert!(!checked.has_errors(), "{expr}: {:?}", checked.diags);
    let mut g: Graph = (*checked.graphs[0].graph).clone();
    let y = g.outputs.iter().find(|o| o.name == "y").expect("y").node;
    g.outputs.clear();
    let mut vars = Vec::new();
    for n in g.g.node_indices() {
        if let Op::Variable {
            name,
            trainable: true,
            ..
        } = &g.node(n).op
        {
            vars.push((name.clone(), g.ty(n).clone()));
        }
    }
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(vars.iter().any(|v| v.0 == "x"), "{expr}: the variable x");
    (Case { g, vars, eps: 1e-2 }, y)
}

/// Fixed values of `shape` for an est expression: sines of the flat index.
fn sines(shape: &[usize]) -> String {
    let n: usize = shape.iter().product();
    format!("reshape(sin(cast(iota([{n}]), f32) * 0.7 + 0.3), {shape:?})")
}

/// The ops made of primitives (`std.prim`'s `reverse`, `tile`, `cumsum`, `top_k`,
/// `einsum`, `depthwise_conv`, grouped `conv`, `conv_transpose`; `std.image`'s
/// `resize`, `random_crop`, `per_image_standardization`; `std.nn`'s LSTM, GRU and
/// `layer_norm` over an axis), differentiated through.
#[test]
fn composite_op_gradients() {
    let cases: Vec<(&str, Vec<usize>, String)> = vec![
        ("reverse", vec![3, 4], "reverse(x, axis: [0, 1])".into()),
        (
            "tile",
            vec![2, 3],
            "tile(x, [2, 3]) * tile(x, [2, 3])".into(),
        ),
        ("cumsum", vec![3, 5], "cumsum(x, axis: 1)".into()),
        (
            "cumsum exclusive reverse",
            vec![5, 3],
            "cumsum(x, axis: 0, exclusive: true, reverse: true)".into(),
        ),
        ("top_k", vec![3, 6], "top_k(x, k: 3)[0]".into()),
        (
            "einsum batched",
            vec![2, 3, 4],
            format!("einsum(\"bij,bkj->bki\", x, {})", sines(&[2, 5, 4])),
        ),
        ("einsum sum", vec![3, 4], "einsum(\"ij->j\", x)".into()),
        (
            "resize bilinear",
            vec![1, 4, 5, 2],
            "image.resize(x, [7, 3])".into(),
        ),
        (
            "resize nearest",
            vec![1, 4, 5, 2],
            "image.resize(x, [6, 2], method: \"nearest\")".into(),
        ),
        (
            "random_crop",
            vec![2, 5, 4, 2],
            "image.random_crop(x, [2, 3, 3, 2])".into(),
        ),
        (
            "per_image_standardization",
            vec![2, 3, 3, 2],
            "image.per_image_standardization(x)".into(),
        ),
        (
            "conv_transpose input",
            vec![1, 3, 3, 2],
            format!("conv_transpose(x, {}, strides: 2)", sines(&[3, 3, 4, 2])),
        ),
        (
            "conv_transpose filter",
            vec![3, 3, 4, 2],
            format!(
                "conv_transpose({}, x, strides: 2, padding: valid)",
                sines(&[1, 3, 3, 2])
            ),
        ),
        (
            "depthwise_conv input",
            vec![1, 5, 5, 2],
            format!("depthwise_conv(x, {}, strides: 2)", sines(&[3, 3, 2, 2])),
        ),
        (
            "depthwise_conv filter",
            vec![3, 2, 2, 3],
            format!(
                "depthwise_conv({}, x, padding: valid, dilation: [1, 2])",
                sines(&[1, 5, 6, 2])
            ),
        ),
        (
            "grouped conv",
            vec![3, 3, 2, 4],
            format!("conv({}, x, groups: 2)", sines(&[1, 4, 4, 4])),
        ),
        (
            "lstm input, with lengths",
            vec![2, 3, 2],
            format!(
                "unrolled_lstm(x, {}, {}, {}, lengths: iota([2]) + 2, return_sequences: true)",
                sines(&[2, 8]),
                sines(&[2, 8]),
                sines(&[8])
            ),
        ),
        (
            "lstm recurrent kernel",
            vec![2, 8],
            format!(
                "unrolled_lstm({}, {}, x, {})",
                sines(&[2, 3, 2]),
                sines(&[2, 8]),
                sines(&[8])
            ),
        ),
        (
            "gru input, with lengths",
            vec![2, 3, 2],
            format!(
                "unrolled_gru(x, {}, {}, {}, lengths: iota([2]) + 2, return_sequences: true)",
                sines(&[2, 6]),
                sines(&[2, 6]),
                sines(&[2, 6])
            ),
        ),
        (
            "gru bias",
            vec![2, 6],
            format!(
                "unrolled_gru({}, {}, {}, x)",
                sines(&[2, 3, 2]),
                sines(&[2, 6]),
                sines(&[2, 6])
            ),
        ),
        (
            "layer_norm over a middle axis",
            vec![2, 3, 4],
            "layer_norm(x, axis: 1)".into(),
        ),
    ];
    for (name, shape, expr) in cases {
        let (mut c, y) = elaborated(&shape, &expr);
        if name.starts_with("conv") || name.starts_with("depthwise") || name.starts_with("grouped")
        {
            c.eps = 0.25; // linear
        }
        check(name, c, y, -1.0, none());
    }
}
