//! The interpreter's forward pass of every op against values computed by hand.

use est::backend::interp::{ops, OpEnv, Tensor};
use est::ir::{BinaryOp, Conv, DType, Init, Op, Padding, Pool, ReduceOp, TensorType, UnaryOp};

const ENV: OpEnv = OpEnv {
    step: 7,
    seed: 1,
    shard: 0,
};

fn t(dtype: DType, shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f64(&TensorType::new(dtype, shape.to_vec()), v.to_vec())
}

fn f(shape: &[usize], v: &[f64]) -> Tensor {
    t(DType::F32, shape, v)
}

/// Runs `op` and compares the result's shape and values (within 1e-6 relative).
fn expect(op: Op, args: &[&Tensor], dtype: DType, shape: &[usize], want: &[f64]) {
    let ty = TensorType::new(dtype, shape.to_vec());
    let got = ops::eval(&op, args, &ty, &ENV).unwrap_or_else(|e| panic!("{}: {e}", op.name()));
    assert_eq!(got.dtype, dtype, "{}: dtype", op.name());
    assert_eq!(got.shape(), shape, "{}: shape", op.name());
    let g = got.to_f64();
    assert_eq!(g.len(), want.len(), "{}: length", op.name());
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
            "{} [{i}]: got {a}, want {b} (all: {g:?})",
            op.name()
        );
    }
}

#[test]
fn unary_ops() {
    let x = f(&[4], &[-2.0, -0.5, 0.0, 1.5]);
    let cases: [(UnaryOp, [f64; 4]); 12] = [
        (UnaryOp::Neg, [2.0, 0.5, 0.0, -1.5]),
        (UnaryOp::Abs, [2.0, 0.5, 0.0, 1.5]),
        (UnaryOp::Square, [4.0, 0.25, 0.0, 2.25]),
        (UnaryOp::Relu, [0.0, 0.0, 0.0, 1.5]),
        (UnaryOp::Floor, [-2.0, -1.0, 0.0, 1.0]),
        (UnaryOp::Sign, [-1.0, -1.0, 0.0, 1.0]),
        (
            UnaryOp::Tanh,
            [
                -0.964_027_580_075_817,
                -0.462_117_157_260_01,
                0.0,
                0.905_148_253_644_866_6,
            ],
        ),
        (
            UnaryOp::Sigmoid,
            [
                0.119_202_922_022_117_6,
                0.377_540_668_798_145_4,
                0.5,
                0.817_574_476_193_643_7,
            ],
        ),
        (
            UnaryOp::Sin,
            [
                -0.909_297_426_825_681_7,
                -0.479_425_538_604_203,
                0.0,
                0.997_494_986_604_054_4,
            ],
        ),
        (
            UnaryOp::Cos,
            [
                -0.416_146_836_547_142_4,
                0.877_582_561_890_372_8,
                1.0,
                0.070_737_201_667_702_9,
            ],
        ),
        (
            UnaryOp::Erf,
            [
                -0.995_322_265_018_952_7,
                -0.520_499_877_813_046_5,
                0.0,
                0.966_105_146_475_310_8,
            ],
        ),
        (UnaryOp::StopGradient, [-2.0, -0.5, 0.0, 1.5]),
    ];
    for (u, want) in cases {
        expect(Op::Unary(u), &[&x], DType::F32, &[4], &want);
    }
    let p = f(&[3], &[1.0, 4.0, 0.25]);
    expect(
        Op::Unary(UnaryOp::Sqrt),
        &[&p],
        DType::F32,
        &[3],
        &[1.0, 2.0, 0.5],
    );
    expect(
        Op::Unary(UnaryOp::Rsqrt),
        &[&p],
        DType::F32,
        &[3],
        &[1.0, 0.5, 2.0],
    );
    expect(
        Op::Unary(UnaryOp::Log),
        &[&p],
        DType::F32,
        &[3],
        &[0.0, 4f64.ln(), 0.25f64.ln()],
    );
    expect(
        Op::Unary(UnaryOp::Exp),
        &[&f(&[2], &[0.0, 1.0])],
        DType::F32,
        &[2],
        &[1.0, std::f64::consts::E],
    );
    let b = t(DType::Bool, &[2], &[1.0, 0.0]);
    expect(
        Op::Unary(UnaryOp::Not),
        &[&b],
        DType::Bool,
        &[2],
        &[0.0, 1.0],
    );
    let i = t(DType::I32, &[3], &[-3.0, 0.0, 5.0]);
    expect(
        Op::Unary(UnaryOp::Neg),
        &[&i],
        DType::I32,
        &[3],
        &[3.0, 0.0, -5.0],
    );
}

#[test]
fn binary_ops_broadcast() {
    let a = f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = f(&[2], &[10.0, -1.0]);
    expect(
        Op::Binary(BinaryOp::Add),
        &[&a, &b],
        DType::F32,
        &[2, 2],
        &[11.0, 1.0, 13.0, 3.0],
    );
    expect(
        Op::Binary(BinaryOp::Sub),
        &[&a, &b],
        DType::F32,
        &[2, 2],
        &[-9.0, 3.0, -7.0, 5.0],
    );
    expect(
        Op::Binary(BinaryOp::Mul),
        &[&a, &b],
        DType::F32,
        &[2, 2],
        &[10.0, -2.0, 30.0, -4.0],
    );
    expect(
        Op::Binary(BinaryOp::Div),
        &[&a, &b],
        DType::F32,
        &[2, 2],
        &[0.1, -2.0, 0.3, -4.0],
    );
    expect(
        Op::Binary(BinaryOp::Max),
        &[&a, &b],
        DType::F32,
        &[2, 2],
        &[10.0, 2.0, 10.0, 4.0],
    );
    expect(
        Op::Binary(BinaryOp::Min),
        &[&a, &b],
        DType::F32,
        &[2, 2],
        &[1.0, -1.0, 3.0, -1.0],
    );
    let two = f(&[], &[2.0]);
    expect(
        Op::Binary(BinaryOp::Pow),
        &[&a, &two],
        DType::F32,
        &[2, 2],
        &[1.0, 4.0, 9.0, 16.0],
    );
    expect(
        Op::Binary(BinaryOp::Rem),
        &[&a, &two],
        DType::F32,
        &[2, 2],
        &[1.0, 0.0, 1.0, 0.0],
    );
    let col = f(&[2, 1], &[2.0, 3.0]);
    expect(
        Op::Binary(BinaryOp::Lt),
        &[&a, &col],
        DType::Bool,
        &[2, 2],
        &[1.0, 0.0, 0.0, 0.0],
    );
    expect(
        Op::Binary(BinaryOp::Ge),
        &[&a, &col],
        DType::Bool,
        &[2, 2],
        &[0.0, 1.0, 1.0, 1.0],
    );
    expect(
        Op::Binary(BinaryOp::Eq),
        &[&a, &col],
        DType::Bool,
        &[2, 2],
        &[0.0, 1.0, 1.0, 0.0],
    );
    expect(
        Op::Binary(BinaryOp::Ne),
        &[&a, &col],
        DType::Bool,
        &[2, 2],
        &[1.0, 0.0, 0.0, 1.0],
    );
    expect(
        Op::Binary(BinaryOp::Le),
        &[&a, &col],
        DType::Bool,
        &[2, 2],
        &[1.0, 1.0, 1.0, 0.0],
    );
    expect(
        Op::Binary(BinaryOp::Gt),
        &[&a, &col],
        DType::Bool,
        &[2, 2],
        &[0.0, 0.0, 0.0, 1.0],
    );
    let p = t(DType::Bool, &[2], &[1.0, 0.0]);
    let q = t(DType::Bool, &[2, 1], &[1.0, 0.0]);
    expect(
        Op::Binary(BinaryOp::And),
        &[&p, &q],
        DType::Bool,
        &[2, 2],
        &[1.0, 0.0, 0.0, 0.0],
    );
    expect(
        Op::Binary(BinaryOp::Or),
        &[&p, &q],
        DType::Bool,
        &[2, 2],
        &[1.0, 1.0, 1.0, 0.0],
    );
    // integers: truncating division, wrapping to i32
    let i = t(DType::I32, &[3], &[7.0, -7.0, 2_147_483_647.0]);
    let j = t(DType::I32, &[3], &[2.0, 2.0, 1.0]);
    expect(
        Op::Binary(BinaryOp::Div),
        &[&i, &j],
        DType::I32,
        &[3],
        &[3.0, -3.0, 2_147_483_647.0],
    );
    expect(
        Op::Binary(BinaryOp::Rem),
        &[&i, &j],
        DType::I32,
        &[3],
        &[1.0, -1.0, 0.0],
    );
    expect(
        Op::Binary(BinaryOp::Add),
        &[&i, &j],
        DType::I32,
        &[3],
        &[9.0, -5.0, -2_147_483_648.0],
    );
    let zero = t(DType::I32, &[3], &[1.0, 0.0, 1.0]);
    let e = ops::eval(
        &Op::Binary(BinaryOp::Div),
        &[&i, &zero],
        &TensorType::new(DType::I32, vec![3]),
        &ENV,
    );
    assert_eq!(e.unwrap_err(), "integer division by zero");
}

#[test]
fn select_cast_and_low_precision() {
    let c = t(DType::Bool, &[3], &[1.0, 0.0, 1.0]);
    let a = f(&[3], &[1.0, 2.0, 3.0]);
    let b = f(&[], &[-1.0]);
    expect(
        Op::Select,
        &[&c, &a, &b],
        DType::F32,
        &[3],
        &[1.0, -1.0, 3.0],
    );
    let x = f(&[4], &[-1.7, 0.0, 2.9, 300.0]);
    expect(Op::Cast, &[&x], DType::I32, &[4], &[-1.0, 0.0, 2.0, 300.0]);
    expect(Op::Cast, &[&x], DType::U8, &[4], &[255.0, 0.0, 2.0, 44.0]);
    expect(Op::Cast, &[&x], DType::Bool, &[4], &[1.0, 0.0, 1.0, 1.0]);
    // f16 keeps 11 significant bits, bf16 8: 1/3 rounds to the nearest of each
    let third = f(&[1], &[1.0 / 3.0]);
    expect(Op::Cast, &[&third], DType::F16, &[1], &[0.333_251_953_125]);
    expect(Op::Cast, &[&third], DType::BF16, &[1], &[0.333_984_375]);
    // arithmetic in f16 rounds every result
    let h = t(DType::F16, &[1], &[2048.0]);
    let one = t(DType::F16, &[1], &[1.0]);
    expect(
        Op::Binary(BinaryOp::Add),
        &[&h, &one],
        DType::F16,
        &[1],
        &[2048.0],
    );
}

#[test]
fn reductions_and_arg_extrema() {
    let x = f(&[2, 3], &[1.0, 5.0, 2.0, -4.0, 0.5, 3.0]);
    let r = |op, axes: Vec<usize>, keep| Op::Reduce {
        op,
        axes,
        keep_dims: keep,
    };
    expect(
        r(ReduceOp::Sum, vec![1], false),
        &[&x],
        DType::F32,
        &[2],
        &[8.0, -0.5],
    );
    expect(
        r(ReduceOp::Sum, vec![0], true),
        &[&x],
        DType::F32,
        &[1, 3],
        &[-3.0, 5.5, 5.0],
    );
    expect(
        r(ReduceOp::Mean, vec![0, 1], false),
        &[&x],
        DType::F32,
        &[],
        &[7.5 / 6.0],
    );
    expect(
        r(ReduceOp::Max, vec![1], false),
        &[&x],
        DType::F32,
        &[2],
        &[5.0, 3.0],
    );
    expect(
        r(ReduceOp::Min, vec![0], false),
        &[&x],
        DType::F32,
        &[3],
        &[-4.0, 0.5, 2.0],
    );
    expect(
        r(ReduceOp::Prod, vec![1], false),
        &[&x],
        DType::F32,
        &[2],
        &[10.0, -6.0],
    );
    expect(Op::ArgMax { axis: 1 }, &[&x], DType::I32, &[2], &[1.0, 2.0]);
    expect(
        Op::ArgMin { axis: 0 },
        &[&x],
        DType::I32,
        &[3],
        &[1.0, 1.0, 0.0],
    );
    // ties: the first index
    let tie = f(&[3], &[2.0, 2.0, 1.0]);
    expect(Op::ArgMax { axis: 0 }, &[&tie], DType::I32, &[], &[0.0]);
}

#[test]
fn matmul_plain_and_batched() {
    let a = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = f(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    expect(
        Op::MatMul,
        &[&a, &b],
        DType::F32,
        &[2, 2],
        &[58.0, 64.0, 139.0, 154.0],
    );
    let ab = f(&[2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
    let m = f(&[2, 2], &[1.0, 0.0, 1.0, 1.0]);
    expect(
        Op::MatMul,
        &[&ab, &m],
        DType::F32,
        &[2, 1, 2],
        &[3.0, 2.0, 7.0, 4.0],
    );
    let ia = t(DType::I32, &[1, 2], &[2.0, 3.0]);
    let ib = t(DType::I32, &[2, 1], &[4.0, 5.0]);
    expect(Op::MatMul, &[&ia, &ib], DType::I32, &[1, 1], &[23.0]);
}

#[test]
fn shape_ops() {
    let x = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    expect(
        Op::Transpose { perm: vec![1, 0] },
        &[&x],
        DType::F32,
        &[3, 2],
        &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0],
    );
    expect(
        Op::Reshape,
        &[&x],
        DType::F32,
        &[3, 2],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
    );
    // a reshape of a transposed (non-contiguous) value reads it in logical order
    let xt = ops::eval(
        &Op::Transpose { perm: vec![1, 0] },
        &[&x],
        &TensorType::new(DType::F32, vec![3, 2]),
        &ENV,
    )
    .unwrap();
    expect(
        Op::Reshape,
        &[&xt],
        DType::F32,
        &[6],
        &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0],
    );
    let row = f(&[3], &[1.0, 2.0, 3.0]);
    expect(
        Op::BroadcastTo,
        &[&row],
        DType::F32,
        &[2, 3],
        &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0],
    );
    let y = f(&[2, 1], &[9.0, 8.0]);
    expect(
        Op::Concat { axis: 1 },
        &[&x, &y],
        DType::F32,
        &[2, 4],
        &[1.0, 2.0, 3.0, 9.0, 4.0, 5.0, 6.0, 8.0],
    );
    expect(
        Op::Slice {
            axis: 1,
            start: 1,
            end: 3,
        },
        &[&x],
        DType::F32,
        &[2, 2],
        &[2.0, 3.0, 5.0, 6.0],
    );
    let idx = t(DType::I32, &[3], &[2.0, 0.0, 5.0]);
    expect(
        Op::OneHot { depth: 3 },
        &[&idx],
        DType::F32,
        &[3, 3],
        &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    );
    let rows = t(DType::I32, &[2], &[1.0, 1.0]);
    expect(
        Op::Gather,
        &[&x, &rows],
        DType::F32,
        &[2, 3],
        &[4.0, 5.0, 6.0, 4.0, 5.0, 6.0],
    );
    let bad = t(DType::I32, &[1], &[2.0]);
    let e = ops::eval(
        &Op::Gather,
        &[&x, &bad],
        &TensorType::new(DType::F32, vec![1, 3]),
        &ENV,
    );
    assert!(e.unwrap_err().contains("out of range"));
    let dy = f(&[2, 3], &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    expect(
        Op::ScatterAdd,
        &[&rows, &dy],
        DType::F32,
        &[2, 3],
        &[0.0, 0.0, 0.0, 3.0, 3.0, 3.0],
    );
}

#[test]
fn softmax_and_log_softmax() {
    let x = f(&[1, 3], &[1.0, 2.0, 3.0]);
    let z: f64 = [1f64, 2.0, 3.0].iter().map(|v| v.exp()).sum();
    let want: Vec<f64> = [1f64, 2.0, 3.0].iter().map(|v| v.exp() / z).collect();
    expect(Op::Softmax { axis: 1 }, &[&x], DType::F32, &[1, 3], &want);
    let lw: Vec<f64> = want.iter().map(|v| v.ln()).collect();
    expect(Op::LogSoftmax { axis: 1 }, &[&x], DType::F32, &[1, 3], &lw);
    // large logits do not overflow
    let big = f(&[2], &[1000.0, 1000.0]);
    expect(
        Op::Softmax { axis: 0 },
        &[&big],
        DType::F32,
        &[2],
        &[0.5, 0.5],
    );
}

#[test]
fn conv_and_pools() {
    // 1x3x3x1 input, 2x2x1x1 filter of ones
    let x = f(
        &[1, 3, 3, 1],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
    );
    let w = f(&[2, 2, 1, 1], &[1.0, 1.0, 1.0, 1.0]);
    let conv = |padding, strides| {
        Op::Conv2d(Conv {
            strides,
            padding,
            dilation: [1, 1],
        })
    };
    expect(
        conv(Padding::Valid, [1, 1]),
        &[&x, &w],
        DType::F32,
        &[1, 2, 2, 1],
        &[12.0, 16.0, 24.0, 28.0],
    );
    // SAME pads after (TensorFlow puts the odd pixel at the end)
    expect(
        conv(Padding::Same, [1, 1]),
        &[&x, &w],
        DType::F32,
        &[1, 3, 3, 1],
        &[12.0, 16.0, 9.0, 24.0, 28.0, 15.0, 15.0, 17.0, 9.0],
    );
    expect(
        conv(Padding::Same, [2, 2]),
        &[&x, &w],
        DType::F32,
        &[1, 2, 2, 1],
        &[12.0, 9.0, 15.0, 9.0],
    );
    // two output channels: identity and negation
    let w2 = f(&[1, 1, 1, 2], &[1.0, -1.0]);
    let y = ops::eval(
        &conv(Padding::Valid, [1, 1]),
        &[&x, &w2],
        &TensorType::new(DType::F32, vec![1, 3, 3, 2]),
        &ENV,
    )
    .unwrap();
    assert_eq!(y.to_f64()[..4], [1.0, -1.0, 2.0, -2.0]);
    let pool = |padding, window, strides| {
        (
            Op::MaxPool2d(Pool {
                window,
                strides,
                padding,
            }),
            Op::AvgPool2d(Pool {
                window,
                strides,
                padding,
            }),
        )
    };
    let (mx, av) = pool(Padding::Valid, [2, 2], [1, 1]);
    expect(mx, &[&x], DType::F32, &[1, 2, 2, 1], &[5.0, 6.0, 8.0, 9.0]);
    expect(av, &[&x], DType::F32, &[1, 2, 2, 1], &[3.0, 4.0, 6.0, 7.0]);
    // SAME average pooling divides by the window positions inside the input
    let (mx, av) = pool(Padding::Same, [2, 2], [2, 2]);
    expect(mx, &[&x], DType::F32, &[1, 2, 2, 1], &[5.0, 6.0, 8.0, 9.0]);
    expect(av, &[&x], DType::F32, &[1, 2, 2, 1], &[3.0, 4.5, 7.5, 9.0]);
    // gradients route to the first maximum / spread over the window
    let dy = f(&[1, 2, 2, 1], &[1.0, 2.0, 3.0, 4.0]);
    let g = Op::MaxPool2dGrad(Pool {
        window: [2, 2],
        strides: [2, 2],
        padding: Padding::Same,
    });
    expect(
        g,
        &[&x, &dy],
        DType::F32,
        &[1, 3, 3, 1],
        &[0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 3.0, 4.0],
    );
    let g = Op::AvgPool2dGrad(Pool {
        window: [2, 2],
        strides: [2, 2],
        padding: Padding::Same,
    });
    expect(
        g,
        &[&dy],
        DType::F32,
        &[1, 3, 3, 1],
        &[0.25, 0.25, 1.0, 0.25, 0.25, 1.0, 1.5, 1.5, 4.0],
    );
}

#[test]
fn random_ops_are_keyed_by_seed_stream_step_and_shard() {
    let ty = TensorType::new(DType::F32, vec![1000]);
    let run = |op: &Op, env: &OpEnv| ops::eval(op, &[], &ty, env).unwrap().to_f64();
    let u = Op::RandomUniform { stream: 5 };
    let a = run(&u, &ENV);
    assert_eq!(a, run(&u, &ENV), "a pure function of its key");
    assert!(a.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = a.iter().sum::<f64>() / 1000.0;
    assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
    assert_ne!(
        a,
        run(&u, &OpEnv { step: 8, ..ENV }),
        "the step moves the stream"
    );
    assert_ne!(
        a,
        run(&Op::RandomUniform { stream: 6 }, &ENV),
        "streams differ"
    );
    assert_ne!(a, run(&u, &OpEnv { seed: 2, ..ENV }), "seeds differ");
    // shard 1 of 2 draws what one shard draws for the second half of a 2x batch
    let half = TensorType::new(DType::F32, vec![500]);
    let s1 = ops::eval(&u, &[], &half, &OpEnv { shard: 1, ..ENV })
        .unwrap()
        .to_f64();
    let whole = ops::eval(&u, &[], &TensorType::new(DType::F32, vec![1000]), &ENV)
        .unwrap()
        .to_f64();
    assert_eq!(s1, whole[500..]);
    let n = run(&Op::RandomNormal { stream: 5 }, &ENV);
    let m = n.iter().sum::<f64>() / 1000.0;
    let var = n.iter().map(|x| (x - m).powi(2)).sum::<f64>() / 1000.0;
    assert!(
        m.abs() < 0.1 && (var - 1.0).abs() < 0.15,
        "mean {m} var {var}"
    );
}

#[test]
fn initialisers_follow_keras() {
    use est::rng::init_values;
    let ty = TensorType::new(DType::F32, vec![3, 3, 16, 32]);
    // glorot: fans count the receptive field: 144 in, 288 out
    let limit = (6.0f64 / (144.0 + 288.0)).sqrt();
    let v = init_values(&Init::GlorotUniform, "k", &ty, 1);
    assert!(v.iter().all(|&x| (x as f64).abs() <= limit));
    let var = v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / v.len() as f64;
    assert!(
        (var - limit * limit / 3.0).abs() < 0.05 * limit * limit,
        "var {var}"
    );
    // truncated normals stay within two standard deviations
    let sd = (2.0f64 / 144.0).sqrt() / 0.879_625_661_034_239_8;
    let h = init_values(&Init::HeNormal, "k", &ty, 1);
    assert!(h.iter().all(|&x| (x as f64).abs() <= 2.0 * sd + 1e-6));
    assert_eq!(h, init_values(&Init::HeNormal, "k", &ty, 1));
    assert_ne!(
        h,
        init_values(&Init::HeNormal, "k2", &ty, 1),
        "each variable has its own stream"
    );
    assert_eq!(
        init_values(
            &Init::Constant {
                bits: 0.5f32.to_bits()
            },
            "c",
            &TensorType::new(DType::F32, vec![2]),
            1
        ),
        [0.5, 0.5]
    );
}

#[test]
fn decode_raw_checks_lengths() {
    let bytes = Tensor {
        dtype: DType::Bytes,
        data: est::tensor::Data::S(ndarray::ArcArray::from_elem(
            ndarray::IxDyn(&[]),
            vec![1u8, 0, 255],
        )),
    };
    expect(
        Op::DecodeRaw,
        &[&bytes],
        DType::U8,
        &[3],
        &[1.0, 0.0, 255.0],
    );
    let e = ops::eval(
        &Op::DecodeRaw,
        &[&bytes],
        &TensorType::new(DType::U8, vec![4]),
        &ENV,
    );
    assert!(e.unwrap_err().contains("has 3 bytes"));
}

/// A value fed from outside the graph must have the type inference gave its node: a
/// wrong shape or dtype is an error at the input, never a panic in a later op.
#[test]
fn feeds_are_checked_against_the_graph() {
    use est::ir::{Graph, Output, Role};
    use est::span::Span;
    let mut g = Graph::new();
    let ty = TensorType::new(DType::F32, vec![2, 3]);
    let x = g.add(
        Op::Input { name: "x".into() },
        &[],
        ty.clone(),
        Span::default(),
    );
    let y = g.add(Op::Binary(BinaryOp::Add), &[x, x], ty, Span::default());
    g.outputs.push(Output {
        name: "y".into(),
        role: Role::Prediction,
        node: y,
    });
    let run = |v: Tensor| {
        let feeds = [("x".to_string(), v)].into_iter().collect();
        let env = OpEnv {
            step: 0,
            seed: 0,
            shard: 0,
        };
        est::backend::interp::run_outputs(&g, &feeds, &Default::default(), env)
    };
    let out = run(f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])).unwrap();
    assert_eq!(out[0].1.to_f64(), [2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
    let e = run(f(&[3, 2], &[0.0; 6])).unwrap_err();
    assert_eq!(
        e.message,
        "input `x`: the value is f32[3, 2], but the graph needs f32[2, 3]"
    );
    let e = run(t(DType::I32, &[2, 3], &[0.0; 6])).unwrap_err();
    assert_eq!(
        e.message,
        "input `x`: the value is i32[2, 3], but the graph needs f32[2, 3]"
    );
}

/// Runs `op` and returns which elements of the result are NaN.
fn nan_mask(op: Op, args: &[&Tensor], dtype: DType, shape: &[usize]) -> Vec<bool> {
    let ty = TensorType::new(dtype, shape.to_vec());
    let got = ops::eval(&op, args, &ty, &ENV).unwrap_or_else(|e| panic!("{}: {e}", op.name()));
    got.to_f64().iter().map(|v| v.is_nan()).collect()
}

/// NaN propagates through every float op as in NumPy (and TensorFlow, PyTorch, JAX):
/// an element computed from a NaN is NaN, never a number.
#[test]
fn nan_propagates_through_every_float_op() {
    let nan = f64::NAN;
    let x = f(&[4], &[-2.0, nan, 0.5, 3.0]);
    for u in [
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
    ] {
        let m = nan_mask(Op::Unary(u), &[&x], DType::F32, &[4]);
        assert!(m[1], "{} of NaN is NaN", Op::Unary(u).name());
    }
    let y = f(&[4], &[1.0, 1.0, nan, 1.0]);
    for b in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Max,
        BinaryOp::Min,
    ] {
        let m = nan_mask(Op::Binary(b), &[&x, &y], DType::F32, &[4]);
        assert_eq!(
            m,
            [false, true, true, false],
            "{}: NaN in either operand",
            Op::Binary(b).name()
        );
    }
    // Reductions over a lane with a NaN are NaN; the other lane is untouched.
    let r = f(&[2, 3], &[1.0, nan, 3.0, 4.0, 5.0, 6.0]);
    for op in [
        ReduceOp::Sum,
        ReduceOp::Mean,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
    ] {
        let red = Op::Reduce {
            op,
            axes: vec![1],
            keep_dims: false,
        };
        let name = red.name();
        assert_eq!(
            nan_mask(red, &[&r], DType::F32, &[2]),
            [true, false],
            "{name}"
        );
    }
    // Arg-reductions pick the first NaN, as NumPy's argmax and argmin do.
    expect(Op::ArgMax { axis: 1 }, &[&r], DType::I32, &[2], &[1.0, 2.0]);
    expect(Op::ArgMin { axis: 1 }, &[&r], DType::I32, &[2], &[1.0, 0.0]);
    for op in [Op::Softmax { axis: 1 }, Op::LogSoftmax { axis: 1 }] {
        let name = op.name();
        assert_eq!(
            nan_mask(op, &[&r], DType::F32, &[2, 3]),
            [true, true, true, false, false, false],
            "{name}"
        );
    }
    // matmul: a NaN in row 0 of a spoils row 0 of the product.
    let a = f(&[2, 2], &[nan, 1.0, 2.0, 3.0]);
    let w = f(&[2, 2], &[1.0, 0.0, 0.0, 1.0]);
    assert_eq!(
        nan_mask(Op::MatMul, &[&a, &w], DType::F32, &[2, 2]),
        [true, true, false, false]
    );
    // Pooling: a window holding a NaN gives NaN (max pooling picks it).
    let img = f(&[1, 2, 4, 1], &[1.0, 2.0, 5.0, 6.0, nan, 4.0, 7.0, 8.0]);
    let pool = Pool {
        window: [2, 2],
        strides: [2, 2],
        padding: Padding::Valid,
    };
    for op in [Op::MaxPool2d(pool), Op::AvgPool2d(pool)] {
        let name = op.name();
        assert_eq!(
            nan_mask(op, &[&img], DType::F32, &[1, 1, 2, 1]),
            [true, false],
            "{name}"
        );
    }
    // The gradient of max pooling goes to the NaN the window picked.
    let dy = f(&[1, 1, 2, 1], &[10.0, 20.0]);
    expect(
        Op::MaxPool2dGrad(pool),
        &[&img, &dy],
        DType::F32,
        &[1, 2, 4, 1],
        &[0.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0, 20.0],
    );
    let conv = Conv {
        strides: [1, 1],
        padding: Padding::Valid,
        dilation: [1, 1],
    };
    let k = f(&[1, 1, 1, 1], &[2.0]);
    let m = nan_mask(Op::Conv2d(conv), &[&img, &k], DType::F32, &[1, 2, 4, 1]);
    assert_eq!(m.iter().filter(|&&b| b).count(), 1, "conv2d: {m:?}");
    assert!(m[4], "conv2d: {m:?}");
    // A cast to an integer cannot keep a NaN: it becomes i32's smallest value (NumPy's
    // and TensorFlow's INT_MIN on x86, as are infinities and values beyond i32), so a
    // NaN label is out of range, never class 0.
    let c = f(&[5], &[nan, f64::INFINITY, f64::NEG_INFINITY, 1e10, -2.7]);
    let min = f64::from(i32::MIN);
    expect(
        Op::Cast,
        &[&c],
        DType::I32,
        &[5],
        &[min, min, min, min, -2.0],
    );
    expect(
        Op::Cast,
        &[&c],
        DType::U8,
        &[5],
        &[0.0, 0.0, 0.0, 0.0, 254.0],
    );
}
