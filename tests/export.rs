//! Export for serving (`estc export`, `Estimator::export`): every example and every op a
//! predict graph can hold, exported to ONNX and run by onnxruntime (the bench
//! virtualenv's, which `scripts/setup.sh` makes) at two batch sizes, agree with est's
//! predictions within 1e-5 of each output's largest magnitude, and pass
//! `onnx.checker.check_model(full_check=True)`; what ONNX cannot serve is E0922, and a
//! checkpoint of another program E0901.

#[path = "common/mnist.rs"]
mod mnist;

mod common;

use common::root;
use est::backend::{self, Feeds, StepCtx};
use est::diag::Code;
use est::elab::Target;
use est::export::{onnx, verify};
use est::ir::{
    infer, BinaryOp, Conv, DType, Graph, Init, NodeIndex, Op, Output, Padding, Pool, ReduceOp,
    Role, TensorType, UnaryOp, MASK_INPUT,
};
use est::runtime::{Estimator, ExportFormat, ExportOptions, RunOptions, Sample, Steps};
use est::span::{FileId, Span};
use est::tensor::Tensor;
use est::Program;
use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const SPAN: Span = Span {
    file: FileId(0),
    lo: 0,
    hi: 0,
};

const SUITE: &str = "export";

fn tmp(name: &str) -> PathBuf {
    common::scratch(SUITE, name)
}

/// Whether onnxruntime can be run: `EST_PYTHON`, or the bench virtualenv (which
/// `make test` makes). Without either the ONNX comparisons are skipped, saying so.
fn no_python(test: &str) -> bool {
    let venv = root().join("bench/.venv/bin/python");
    let none = std::env::var_os("EST_PYTHON").is_none() && !venv.exists();
    if none {
        eprintln!("{test}: skipped: no bench/.venv with onnxruntime (run scripts/setup.sh) and no EST_PYTHON");
    }
    none
}

/// Checks what onnxruntime made of an exported model: within the tolerance at two batch
/// sizes, its batch symbolic, its metadata est's.
fn assert_served(v: &verify::Verified, what: &str, outputs: usize, step: i64) {
    assert!(v.worst() <= verify::TOLERANCE, "{what}: {:?}", v.outputs);
    assert_eq!(v.outputs.len(), outputs, "{what}: {:?}", v.outputs);
    assert_eq!(v.batch_sizes.len(), 2, "{what}: {:?}", v.batch_sizes);
    for (name, dims) in &v.shapes {
        assert_eq!(
            dims.first().map(String::as_str),
            Some("batch"),
            "{what}: {name} {dims:?}"
        );
    }
    let meta = |k: &str| v.metadata.iter().find(|m| m.0 == k).map(|m| m.1.clone());
    assert_eq!(meta("est.global_step"), Some(step.to_string()), "{what}");
    assert_eq!(
        meta("est.program_hash").map(|h| h.len()),
        Some(16),
        "{what}"
    );
    assert_eq!(
        meta("est.version").as_deref(),
        Some(env!("CARGO_PKG_VERSION"))
    );
}

/// Every example (each estimator of it), trained 20 steps, exported from its newest
/// checkpoint, and served by onnxruntime on two batches of its eval input as est
/// predicts them. The MNIST examples run at batch 16 on generated MNIST-shaped data,
/// resnet20 at learning rate 0 (trained for 20 steps its batch-norm averages have not
/// settled and its softmax saturates, which would compare ones and zeros), the text
/// classifier small.
#[test]
fn every_example_exports_and_onnxruntime_serves_it_like_est() {
    if no_python("every_example_exports_and_onnxruntime_serves_it_like_est") {
        return;
    }
    let files = common::example_files();
    assert!(files.len() >= 8, "{files:?}");
    let data = common::ExampleData::new(SUITE, mnist::write);
    for file in files {
        let name = file.file_stem().unwrap().to_string_lossy().to_string();
        let mnist = name.contains("mnist");
        let data_dir = data.dir(&name);
        let (estimators, params): (&[Option<&str>], &[(&str, &str)]) = match name.as_str() {
            "resnet20" => (&[None], &[("learning_rates", "[0.0, 0.0, 0.0]")]),
            "text_classifier" => (
                &[Some("text_lm"), Some("sentiment")],
                &[("pretrained", "\"\""), ("length", "24"), ("units", "8")],
            ),
            _ if mnist => (&[None], &[("batch_size", "16")]),
            _ => (&[None], &[]),
        };
        for estimator in estimators {
            let what = format!("{name} {}", estimator.unwrap_or(""));
            let mut p = Program::load(&file).unwrap();
            for (k, v) in params {
                p.add_override(k, v, "test");
            }
            let dir = tmp(&format!("{name}-{}", estimator.unwrap_or("")));
            let opts = RunOptions {
                target: Target::run_default(),
                estimator: estimator.map(str::to_string),
                model_dir: Some(dir.clone()),
                data_dir: data_dir.clone(),
                ..Default::default()
            };
            let mut e =
                Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{what}: {:?}", f.diags));
            e.train(Steps::Max(20))
                .unwrap_or_else(|f| panic!("{what}: {:?}", f.diags));
            let out = dir.join("model.onnx");
            let r = e
                .export(&onnx_to(&out))
                .unwrap_or_else(|f| panic!("{what}: {:?}", f.diags));
            assert_eq!(r.global_step, 20);
            let samples = e
                .predict_samples(2)
                .unwrap_or_else(|f| panic!("{what}: {:?}", f.diags));
            assert_eq!(samples.len(), 2, "{what}");
            let v = verify::verify(&out, &samples, SPAN)
                .unwrap_or_else(|d| panic!("{what}: {}", d.message));
            assert_served(&v, &what, r.outputs.len(), 20);
            eprintln!(
                "{what}: {} ONNX nodes, largest difference {:.2e} at batch sizes {:?}",
                r.nodes,
                v.worst(),
                v.batch_sizes
            );
        }
    }
}

fn onnx_to(out: &Path) -> ExportOptions {
    ExportOptions {
        format: ExportFormat::Onnx,
        out: out.to_path_buf(),
        checkpoint: None,
        cpu: None,
    }
}

/// A predict graph built op by op: inputs fed with random values, variables, and one
/// prediction per op under test.
struct Case {
    g: Graph,
    vars: FxHashMap<String, Tensor>,
    feeds: Vec<(String, Tensor)>,
    seed: u64,
    /// The static batch size of the inputs.
    batch: usize,
}

const B: usize = 8;

impl Case {
    fn new() -> Case {
        Case {
            g: Graph::new(),
            vars: FxHashMap::default(),
            feeds: Vec::new(),
            seed: 17,
            batch: B,
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

    fn values(&mut self, ty: &TensorType, lo: f64, hi: f64) -> Tensor {
        let n = ty.elements();
        let v: Vec<f64> = (0..n)
            .map(|_| {
                let x = lo + (hi - lo) * self.next();
                if ty.dtype.is_float() {
                    x
                } else {
                    x.floor()
                }
            })
            .collect();
        Tensor::from_f64(ty, v)
    }

    /// A model input of `dtype[B, shape...]` with values in `[lo, hi)`.
    fn input(&mut self, name: &str, dtype: DType, shape: &[usize], lo: f64, hi: f64) -> NodeIndex {
        let mut s = vec![self.batch];
        s.extend_from_slice(shape);
        let ty = TensorType::new(dtype, s);
        let t = self.values(&ty, lo, hi);
        self.feeds.push((name.to_string(), t));
        self.g.add(Op::Input { name: name.into() }, &[], ty, SPAN)
    }

    fn variable(&mut self, shape: &[usize]) -> NodeIndex {
        let name = format!("w{}", self.vars.len());
        let ty = TensorType::new(DType::F32, shape.to_vec());
        let t = self.values(&ty, -1.0, 1.0);
        self.vars.insert(name.clone(), t);
        let init = Init::Zeros;
        self.g.add(
            Op::Variable {
                name,
                init,
                trainable: true,
            },
            &[],
            ty,
            SPAN,
        )
    }

    fn constant(&mut self, v: f64, dtype: DType, shape: &[usize]) -> NodeIndex {
        let ty = TensorType::new(dtype, shape.to_vec());
        self.g.add(Op::Const { bits: v.to_bits() }, &[], ty, SPAN)
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

    fn reduce(&mut self, op: ReduceOp, axes: &[usize], keep_dims: bool, x: NodeIndex) -> NodeIndex {
        let axes = axes.to_vec();
        self.f(
            Op::Reduce {
                op,
                axes,
                keep_dims,
            },
            &[x],
        )
    }

    fn shaped(&mut self, op: Op, args: &[NodeIndex], dtype: DType, shape: &[usize]) -> NodeIndex {
        self.op(op, args, TensorType::new(dtype, shape.to_vec()))
    }

    fn predict(&mut self, name: &str, n: NodeIndex) {
        self.g.outputs.push(Output {
            name: name.into(),
            role: Role::Prediction,
            node: n,
        });
    }

    /// The predictions as the interpreter computes them.
    fn interpret(&self) -> Vec<(String, Tensor)> {
        let outs = self.g.outputs_with(Role::Prediction);
        let targets: Vec<NodeIndex> = outs.iter().map(|o| o.1).collect();
        let mut d = backend::open(Target::Interp, SPAN, 1).expect("the interpreter");
        let exe = d
            .compile_run(Arc::new(self.g.clone()), targets, SPAN)
            .unwrap_or_else(|e| panic!("{}", e.message));
        d.bind(self.vars.clone()).expect("the variables fit");
        let feeds: Feeds = self.feeds.iter().cloned().collect();
        let got = d
            .run(exe, feeds, StepCtx { step: 5, seed: 1 }, 0)
            .unwrap_or_else(|e| panic!("{}: {}", e.op, e.message));
        outs.into_iter().map(|o| o.0).zip(got).collect()
    }

    fn export(&self) -> Result<onnx::Exported, est::diag::Diag> {
        let meta = onnx::Meta {
            estimator: "ops".into(),
            program_hash: "0123456789abcdef".into(),
            global_step: 5,
        };
        onnx::export(&self.g, &self.vars, &meta, SPAN)
    }
}

/// Every op a predict graph can hold, one prediction each (with broadcasting against
/// constants and variables, integer and boolean forms, and the reshapes that merge the
/// batch with another axis and split it again), in one model: exported, checked, and run
/// by onnxruntime at batch 8 and at 4 against the interpreter.
#[test]
fn every_op_of_a_predict_graph_exports_and_runs_like_the_interpreter() {
    if no_python("every_op_of_a_predict_graph_exports_and_runs_like_the_interpreter") {
        return;
    }
    let mut c = Case::new();
    let f32 = DType::F32;
    let x = c.input("x", f32, &[6], -2.0, 2.0);
    let p = c.input("p", f32, &[6], 0.5, 2.0);
    let img = c.input("img", f32, &[7, 7, 3], -1.0, 1.0);
    let ids = c.input("ids", DType::I32, &[5], 0.0, 10.0);
    let k = c.input("k", DType::I32, &[6], -20.0, 20.0);
    let d = c.input("d", DType::I32, &[6], 1.0, 4.0);
    let e = c.input("e", DType::I32, &[6], 0.0, 3.0);
    let seq = c.input("seq", f32, &[4, 6], -1.0, 1.0);
    let half = c.constant(0.5, f32, &[B, 6]);
    let flag = c.f(Op::Binary(BinaryOp::Gt), &[x, half]);
    // a negative divisor too: d * sign(k - 0.5)
    let kf = c.shaped(Op::Cast, &[k], f32, &[B, 6]);
    let s = c.f(Op::Binary(BinaryOp::Sub), &[kf, half]);
    let s = c.f(Op::Unary(UnaryOp::Sign), &[s]);
    let s = c.shaped(Op::Cast, &[s], DType::I32, &[B, 6]);
    let d = c.f(Op::Binary(BinaryOp::Mul), &[d, s]);

    for (name, u, on) in [
        ("neg", UnaryOp::Neg, x),
        ("abs", UnaryOp::Abs, x),
        ("exp", UnaryOp::Exp, x),
        ("square", UnaryOp::Square, x),
        ("tanh", UnaryOp::Tanh, x),
        ("sigmoid", UnaryOp::Sigmoid, x),
        ("relu", UnaryOp::Relu, x),
        ("floor", UnaryOp::Floor, x),
        ("sign", UnaryOp::Sign, x),
        ("sin", UnaryOp::Sin, x),
        ("cos", UnaryOp::Cos, x),
        ("erf", UnaryOp::Erf, x),
        ("stop_gradient", UnaryOp::StopGradient, x),
        ("log", UnaryOp::Log, p),
        ("sqrt", UnaryOp::Sqrt, p),
        ("rsqrt", UnaryOp::Rsqrt, p),
        ("int_neg", UnaryOp::Neg, k),
        ("int_abs", UnaryOp::Abs, k),
        ("int_sign", UnaryOp::Sign, k),
        ("int_square", UnaryOp::Square, k),
    ] {
        let y = c.f(Op::Unary(u), &[on]);
        c.predict(name, y);
    }
    let not = c.f(Op::Unary(UnaryOp::Not), &[flag]);
    c.predict("not", not);
    let bias = c.variable(&[6]);
    for (name, b, l, r) in [
        ("add", BinaryOp::Add, x, bias),
        ("sub", BinaryOp::Sub, x, p),
        ("mul", BinaryOp::Mul, x, half),
        ("div", BinaryOp::Div, x, p),
        ("rem", BinaryOp::Rem, x, p),
        ("pow", BinaryOp::Pow, p, x),
        ("maximum", BinaryOp::Max, x, p),
        ("minimum", BinaryOp::Min, x, bias),
        ("eq", BinaryOp::Eq, k, d),
        ("ne", BinaryOp::Ne, k, d),
        ("lt", BinaryOp::Lt, x, p),
        ("le", BinaryOp::Le, k, d),
        ("gt", BinaryOp::Gt, x, bias),
        ("ge", BinaryOp::Ge, x, half),
        ("int_add", BinaryOp::Add, k, d),
        ("int_mul", BinaryOp::Mul, k, d),
        ("int_div", BinaryOp::Div, k, d),
        ("int_rem", BinaryOp::Rem, k, d),
        ("int_pow", BinaryOp::Pow, k, e),
        ("int_max", BinaryOp::Max, k, d),
        ("int_min", BinaryOp::Min, k, d),
        ("and", BinaryOp::And, flag, not),
        ("or", BinaryOp::Or, flag, not),
    ] {
        let y = c.f(Op::Binary(b), &[l, r]);
        c.predict(name, y);
    }
    let sel = c.f(Op::Select, &[flag, x, p]);
    c.predict("select", sel);
    for (name, from, to) in [
        ("cast_f32_i32", x, DType::I32),
        ("cast_i32_f32", k, f32),
        ("cast_bool_f32", flag, f32),
        ("cast_f32_bool", x, DType::Bool),
    ] {
        let y = c.shaped(Op::Cast, &[from], to, &[B, 6]);
        c.predict(name, y);
    }
    for (name, op) in [
        ("reduce_sum", ReduceOp::Sum),
        ("reduce_mean", ReduceOp::Mean),
        ("reduce_max", ReduceOp::Max),
        ("reduce_min", ReduceOp::Min),
        ("reduce_prod", ReduceOp::Prod),
    ] {
        let y = c.reduce(op, &[1], false, x);
        c.predict(name, y);
    }
    let r = c.reduce(ReduceOp::Mean, &[1, 2], true, seq);
    c.predict("reduce_keep_dims", r);
    let r = c.reduce(ReduceOp::Sum, &[1], false, k);
    c.predict("int_reduce_sum", r);
    // a reduction over a broadcast constant's axis (a count of the row's entries)
    let ones = c.constant(1.0, f32, &[B, 6]);
    let xo = c.f(Op::Binary(BinaryOp::Mul), &[x, ones]);
    let cnt = c.reduce(ReduceOp::Sum, &[1], true, ones);
    let mean = c.f(Op::Binary(BinaryOp::Div), &[xo, cnt]);
    c.predict("sum_over_constant", mean);
    let empty = c.reduce(ReduceOp::Sum, &[], false, x);
    c.predict("reduce_no_axes", empty);
    let am = c.shaped(Op::ArgMax { axis: 1 }, &[x], DType::I32, &[B]);
    c.predict("argmax", am);
    let an = c.shaped(Op::ArgMin { axis: 1 }, &[x], DType::I32, &[B]);
    c.predict("argmin", an);
    let w = c.variable(&[6, 3]);
    let mm = c.f(Op::MatMul, &[x, w]);
    c.predict("matmul", mm);
    let seqt = c.f(
        Op::Transpose {
            perm: vec![0, 2, 1],
        },
        &[seq],
    );
    c.predict("transpose", seqt);
    let gram = c.f(Op::MatMul, &[seq, seqt]);
    c.predict("batched_matmul", gram);
    let proj = c.f(Op::MatMul, &[seq, w]);
    c.predict("matmul_broadcast", proj);
    let flat = c.shaped(Op::Reshape, &[img], f32, &[B, 147]);
    c.predict("reshape_flatten", flat);
    let rows = c.shaped(Op::Reshape, &[seq], f32, &[B * 4, 6]);
    let rw = c.f(Op::MatMul, &[rows, w]);
    let back = c.shaped(Op::Reshape, &[rw], f32, &[B, 12]);
    c.predict("reshape_merge_and_split", back);
    let x3 = c.shaped(Op::Reshape, &[x], f32, &[B, 1, 6]);
    let wide = c.shaped(Op::BroadcastTo, &[x3], f32, &[B, 5, 6]);
    c.predict("broadcast_to", wide);
    let bb = c.shaped(Op::BroadcastTo, &[bias], f32, &[B, 6]);
    let bx = c.f(Op::Binary(BinaryOp::Mul), &[bb, x]);
    c.predict("broadcast_variable", bx);
    let cat = c.f(Op::Concat { axis: 1 }, &[x, p]);
    c.predict("concat", cat);
    let pad = c.constant(-1.0, f32, &[B, 2]);
    let cat = c.f(Op::Concat { axis: 1 }, &[x, pad]);
    c.predict("concat_constant", cat);
    let sl = c.f(
        Op::Slice {
            axis: 1,
            start: 2,
            end: 5,
        },
        &[x],
    );
    c.predict("slice", sl);
    let oh = c.shaped(Op::OneHot { depth: 10 }, &[ids], f32, &[B, 5, 10]);
    c.predict("one_hot", oh);
    let ci = c.f(Op::CheckIndices { depth: 10 }, &[ids]);
    let table = c.variable(&[10, 4]);
    let gathered = c.f(Op::Gather, &[table, ci]);
    c.predict("gather", gathered);
    let iota = c.shaped(Op::Iota { axis: 1 }, &[], f32, &[B, 6]);
    let xi = c.f(Op::Binary(BinaryOp::Add), &[x, iota]);
    c.predict("iota", xi);
    let step =
        c.g.add(Op::GlobalStep, &[], TensorType::scalar(DType::I64), SPAN);
    let stepf = c.shaped(Op::Cast, &[step], f32, &[]);
    let xs = c.f(Op::Binary(BinaryOp::Add), &[x, stepf]);
    c.predict("global_step", xs);
    let filt = c.variable(&[3, 3, 3, 4]);
    let conv = |strides, padding, dilation| Conv {
        strides,
        padding,
        dilation,
    };
    for (name, cv, out) in [
        ("conv_same", conv([1, 1], Padding::Same, [1, 1]), [7, 7, 4]),
        (
            "conv_strided",
            conv([2, 2], Padding::Same, [1, 1]),
            [4, 4, 4],
        ),
        (
            "conv_dilated",
            conv([1, 1], Padding::Valid, [2, 2]),
            [3, 3, 4],
        ),
        (
            "conv_valid",
            conv([2, 1], Padding::Valid, [1, 1]),
            [3, 5, 4],
        ),
    ] {
        let y = c.shaped(
            Op::Conv2d(cv),
            &[img, filt],
            f32,
            &[B, out[0], out[1], out[2]],
        );
        c.predict(name, y);
    }
    let cv = conv([2, 2], Padding::Same, [1, 1]);
    let dy = c.shaped(Op::Conv2d(cv), &[img, filt], f32, &[B, 4, 4, 4]);
    let ct = c.shaped(Op::Conv2dBackpropInput(cv), &[dy, filt], f32, &[B, 7, 7, 3]);
    c.predict("conv_transpose", ct);
    let pool = |window, strides, padding| Pool {
        window,
        strides,
        padding,
    };
    for (name, pl, avg, out) in [
        (
            "max_pool",
            pool([2, 2], [2, 2], Padding::Valid),
            false,
            [3, 3],
        ),
        (
            "max_pool_same",
            pool([3, 3], [2, 2], Padding::Same),
            false,
            [4, 4],
        ),
        (
            "avg_pool",
            pool([2, 2], [2, 2], Padding::Valid),
            true,
            [3, 3],
        ),
        (
            "avg_pool_same",
            pool([3, 3], [2, 2], Padding::Same),
            true,
            [4, 4],
        ),
    ] {
        let op = if avg {
            Op::AvgPool2d(pl)
        } else {
            Op::MaxPool2d(pl)
        };
        let y = c.shaped(op, &[img], f32, &[B, out[0], out[1], 3]);
        c.predict(name, y);
    }
    // the mask of a graph that takes a partial last batch: every served row is real
    let mask = c.input(MASK_INPUT, DType::Bool, &[], 1.0, 2.0);
    let mask = c.shaped(Op::Reshape, &[mask], DType::Bool, &[B, 1]);
    let mask = c.shaped(Op::Cast, &[mask], f32, &[B, 1]);
    let masked = c.f(Op::Binary(BinaryOp::Mul), &[x, mask]);
    c.predict("mask", masked);
    let sm = c.f(Op::Softmax { axis: 1 }, &[x]);
    c.predict("softmax", sm);
    let lsm = c.f(Op::LogSoftmax { axis: 2 }, &[seq]);
    c.predict("log_softmax", lsm);

    let want = c.interpret();
    let exported = c.export().unwrap_or_else(|d| panic!("{}", d.message));
    let dir = tmp("ops");
    let path = dir.join("ops.onnx");
    std::fs::write(&path, &exported.bytes).unwrap();
    let samples = [Sample {
        inputs: c.feeds.clone(),
        outputs: want,
    }];
    let v = verify::verify(&path, &samples, SPAN).unwrap_or_else(|d| panic!("{}", d.message));
    assert_served(&v, "ops", c.g.outputs.len(), 5);
    assert_eq!(v.batch_sizes, vec![B, B / 2]);
    for (name, abs, rel) in &v.outputs {
        eprintln!("{name}: {abs:.2e} absolute, {rel:.2e} relative");
    }
    // every op under test was written (none fell back to a refusal or vanished)
    let names: Vec<&str> = v.outputs.iter().map(|o| o.0.as_str()).collect();
    for o in &c.g.outputs {
        assert!(names.contains(&o.name.as_str()), "{} missing", o.name);
    }
}

/// What an ONNX model cannot serve is E0922, naming the op: random numbers, a value of
/// the static batch size meeting the batch, ops that make an example's result depend
/// on the other examples of its batch (a reduction or softmax over it, a reshape that
/// mixes it with other axes), a prediction without one row per example or named as an
/// input, u8 arithmetic onnxruntime has no kernel for, and f16.
#[test]
fn what_onnx_cannot_serve_is_a_diagnostic_naming_the_op() {
    type Build = fn(&mut Case, NodeIndex);
    let cases: [(&str, Build, &str); 10] = [
        (
            "random",
            |c, x| {
                let r = c.shaped(Op::RandomUniform { stream: 1 }, &[], DType::F32, &[B, 6]);
                let y = c.f(Op::Binary(BinaryOp::Add), &[x, r]);
                c.predict("y", y);
            },
            "random numbers",
        ),
        (
            "pinned",
            |c, x| {
                let v = c.variable(&[B, 6]);
                let y = c.f(Op::Binary(BinaryOp::Add), &[x, v]);
                c.predict("y", y);
            },
            "meets the batch with a value of fixed size (f32[8, 6], axis 0)",
        ),
        (
            "batch mean",
            |c, x| {
                let m = c.reduce(ReduceOp::Mean, &[0], true, x);
                let y = c.f(Op::Binary(BinaryOp::Sub), &[x, m]);
                c.predict("centred", y);
            },
            "`reduce_mean` reduces over the batch",
        ),
        (
            "softmax over the batch",
            |c, x| {
                let y = c.f(Op::Softmax { axis: 0 }, &[x]);
                c.predict("y", y);
            },
            "`softmax` normalises over the batch",
        ),
        (
            "reshape",
            |c, x| {
                let y = c.shaped(Op::Reshape, &[x], DType::F32, &[6, B]);
                let y = c.f(Op::Transpose { perm: vec![1, 0] }, &[y]);
                c.predict("y", y);
            },
            "mixing the batch with other axes",
        ),
        (
            "scalar",
            |c, _| {
                let v = c.variable(&[6]);
                let y = c.reduce(ReduceOp::Sum, &[0], false, v);
                c.predict("total", y);
            },
            "the prediction `total` is a scalar",
        ),
        (
            "not per example",
            |c, x| {
                let y = c.f(Op::Transpose { perm: vec![1, 0] }, &[x]);
                c.predict("columns", y);
            },
            "the prediction `columns` does not have one row per example",
        ),
        (
            "named as an input",
            |c, x| {
                let y = c.f(Op::Unary(UnaryOp::Relu), &[x]);
                c.predict("x", y);
            },
            "has the name of an input",
        ),
        (
            "u8",
            |c, x| {
                let b = c.shaped(Op::Cast, &[x], DType::U8, &[B, 6]);
                let y = c.f(Op::Binary(BinaryOp::Add), &[b, b]);
                c.predict("y", y);
            },
            "computes on u8",
        ),
        (
            "f16",
            |c, x| {
                let y = c.shaped(Op::Cast, &[x], DType::F16, &[B, 6]);
                c.predict("y", y);
            },
            "f16",
        ),
    ];
    for (what, build, says) in cases {
        let mut c = Case::new();
        let x = c.input("x", DType::F32, &[6], -1.0, 1.0);
        build(&mut c, x);
        let d = match c.export() {
            Ok(_) => panic!("{what}: exported"),
            Err(d) => d,
        };
        assert_eq!([d.code], [Code::Export], "{what}: {}", d.message);
        assert!(d.message.contains(says), "{what}: {}", d.message);
        assert!(d.help.is_some(), "{what}");
    }
}

/// `--verify` fails with E0923, the model written all the same, when onnxruntime
/// computes something else than est (here: est's predictions altered by 1e-4 of their
/// scale) and when the Python it runs has no onnxruntime.
#[test]
fn a_verification_that_fails_is_e0923() {
    if no_python("a_verification_that_fails_is_e0923") {
        return;
    }
    let mut c = Case::new();
    let x = c.input("x", DType::F32, &[6], -1.0, 1.0);
    let y = c.f(Op::Unary(UnaryOp::Tanh), &[x]);
    c.predict("y", y);
    let path = tmp("e0923").join("m.onnx");
    std::fs::write(&path, c.export().unwrap().bytes).unwrap();
    let mut want = c.interpret();
    let sample = |outputs| Sample {
        inputs: c.feeds.clone(),
        outputs,
    };
    let v = verify::verify(&path, &[sample(want.clone())], SPAN).unwrap();
    assert!(v.worst() < 1e-6, "{:?}", v.outputs);
    let altered: Vec<f64> = want[0].1.to_f64().iter().map(|v| v + 1e-4).collect();
    want[0].1 = Tensor::from_f64(&want[0].1.ty(), altered);
    let d = verify::verify(&path, &[sample(want)], SPAN).unwrap_err();
    assert_eq!([d.code], [Code::ExportVerify]);
    assert!(
        d.message.contains("`y` differs from est's by 1.00"),
        "{}",
        d.message
    );
    // issue 43, findings 15 and 23: a verifier that never answers is stopped after its
    // time (E0923), and an answer that compared no outputs, or one output at one batch
    // size, is refused; so is verifying with no batch at all
    let d = tmp("e0923-fake");
    let fake = |name: &str, body: &str| {
        let p = d.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        p
    };
    let hung = fake("hung", "sleep 600");
    let started = std::time::Instant::now();
    let d1 = verify::verify_within(
        &hung,
        &path,
        &[sample(c.interpret())],
        SPAN,
        std::time::Duration::from_secs(2),
    )
    .unwrap_err();
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    assert_eq!([d1.code], [Code::ExportVerify]);
    assert!(
        d1.message
            .contains("did not finish verifying the model within 2 s"),
        "{}",
        d1.message
    );
    let answer = |outputs: &str| {
        format!(
            "echo '{{\"checker\": \"ok\", \"onnxruntime\": \"1.31.1\", \"batch_sizes\": [8, 4], \"outputs\": {outputs}, \"metadata\": {{}}, \"shapes\": {{}}}}'"
        )
    };
    for (name, outputs, says) in [
        ("empty", "{}".to_string(), "compared `y` at 0 batch sizes"),
        (
            "one_size",
            "{\"y\": {\"max_abs\": 0.0, \"max_rel\": 0.0, \"sizes\": [8]}}".to_string(),
            "compared `y` at 1 batch size (two are needed)",
        ),
    ] {
        let py = fake(name, &answer(&outputs));
        let e = verify::verify_with(&py, &path, &[sample(c.interpret())], SPAN).unwrap_err();
        assert!(e.message.contains(says), "{name}: {}", e.message);
    }
    let e = verify::verify(&path, &[], SPAN).unwrap_err();
    assert!(
        e.message.contains("gave no batch to verify"),
        "{}",
        e.message
    );
    // a Python without onnxruntime (Debian's own), unless it has one
    let system = Path::new("/usr/bin/python3");
    let has = std::process::Command::new(system)
        .args(["-c", "import onnxruntime"])
        .status()
        .is_ok_and(|s| s.success());
    if system.exists() && !has {
        let d = verify::verify_with(system, &path, &[sample(c.interpret())], SPAN).unwrap_err();
        assert_eq!([d.code], [Code::ExportVerify]);
        assert!(
            d.message.contains("onnxruntime is not available"),
            "{}",
            d.message
        );
        assert!(
            d.help
                .as_deref()
                .unwrap_or("")
                .contains("onnxruntime==1.31.1"),
            "{:?}",
            d.help
        );
    }
}

/// A graph compiled at batch 1 serves other batch sizes too: its constants of one row
/// meet the batch where nothing broadcasts (a `concat`), and `--verify` runs the one row
/// twice over.
#[test]
fn a_graph_compiled_at_batch_one_serves_any_batch() {
    if no_python("a_graph_compiled_at_batch_one_serves_any_batch") {
        return;
    }
    let mut c = Case::new();
    c.batch = 1;
    let x = c.input("x", DType::F32, &[6], -1.0, 1.0);
    let pad = c.constant(-1.0, DType::F32, &[1, 2]);
    let cat = c.f(Op::Concat { axis: 1 }, &[x, pad]);
    c.predict("padded", cat);
    let y = c.f(Op::Unary(UnaryOp::Tanh), &[x]);
    c.predict("y", y);
    let path = tmp("batch-one").join("m.onnx");
    std::fs::write(&path, c.export().unwrap().bytes).unwrap();
    let samples = [Sample {
        inputs: c.feeds.clone(),
        outputs: c.interpret(),
    }];
    let v = verify::verify(&path, &samples, SPAN).unwrap_or_else(|d| panic!("{}", d.message));
    assert_served(&v, "batch one", 2, 5);
    assert_eq!(v.batch_sizes, vec![2, 1]);
}

/// Issue 43, finding 9: a prediction the same for every example (a constant of the
/// batch's length, `fill([B], 3)`) exports, following the batch at any size, as
/// `estc predict` writes it (it was E0922), at the static batch and at batch 1.
#[test]
fn a_constant_prediction_follows_the_batch() {
    for batch in [B, 1] {
        let mut c = Case::new();
        c.batch = batch;
        let x = c.input("x", DType::F32, &[3], -1.0, 1.0);
        let version = c.constant(3.0, DType::F32, &[batch]);
        c.predict("version", version);
        let rows = c.constant(0.5, DType::F32, &[batch, 2]);
        c.predict("rows", rows);
        let y = c.f(Op::Unary(UnaryOp::Tanh), &[x]);
        c.predict("y", y);
        let exported = c.export().unwrap_or_else(|d| panic!("{}", d.message));
        if no_python("a_constant_prediction_follows_the_batch") {
            return;
        }
        let path = tmp(&format!("constant-{batch}")).join("m.onnx");
        std::fs::write(&path, exported.bytes).unwrap();
        let samples = [Sample {
            inputs: c.feeds.clone(),
            outputs: c.interpret(),
        }];
        let v = verify::verify(&path, &samples, SPAN).unwrap_or_else(|d| panic!("{}", d.message));
        assert_served(&v, "constant predictions", 3, 5);
    }
}

/// A checkpoint that another program wrote (other variables) is refused as `eval`
/// refuses it (E0901), with `--checkpoint` naming it as with model_dir holding it; and
/// `--checkpoint` exports the step it names, not the newest.
#[test]
fn a_checkpoint_of_another_program_is_refused() {
    let dir = tmp("foreign");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_estc"))
            .args(args)
            .current_dir(root())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    };
    let md = dir.join("lr").display().to_string();
    let (code, out) = run(&[
        "train",
        "examples/linear_regression.est",
        "--model-dir",
        &md,
        "--steps",
        "5",
    ]);
    assert_eq!(code, Some(0), "{out}");
    let onnx_path = dir.join("m.onnx").display().to_string();
    let (code, out) = run(&[
        "export",
        "examples/digits_mlp.est",
        "--model-dir",
        &md,
        "-o",
        &onnx_path,
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("E0901") && out.contains("does not fit this program"),
        "{out}"
    );
    assert!(!dir.join("m.onnx").exists());
    let ckpt = dir.join("lr/ckpt-5.safetensors").display().to_string();
    let (code, out) = run(&[
        "export",
        "examples/digits_mlp.est",
        "--checkpoint",
        &ckpt,
        "-o",
        &onnx_path,
    ]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("E0901"), "{out}");
    // the program's own checkpoints: the one named, at its step
    let (code, out) = run(&[
        "train",
        "examples/linear_regression.est",
        "--model-dir",
        &md,
        "--steps",
        "5",
    ]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = run(&[
        "export",
        "examples/linear_regression.est",
        "--model-dir",
        &md,
        "--checkpoint",
        &ckpt,
        "-o",
        &onnx_path,
        "--message-format",
        "json",
    ]);
    assert_eq!(code, Some(0), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(out.lines().next().unwrap_or("")).unwrap_or_default();
    assert_eq!(v["global_step"], 5, "{out}");
    assert!(dir.join("m.onnx").exists());
    let (code, out) = run(&[
        "export",
        "examples/linear_regression.est",
        "--model-dir",
        &md,
        "-o",
        &onnx_path,
        "--message-format",
        "json",
    ]);
    assert_eq!(code, Some(0), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(out.lines().next().unwrap_or("")).unwrap_or_default();
    assert_eq!(v["global_step"], 10, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `estc export --verify` prints the largest difference, and the model serves a batch
/// size the program never ran.
#[test]
fn estc_export_verify_prints_the_largest_difference() {
    if no_python("estc_export_verify_prints_the_largest_difference") {
        return;
    }
    let dir = tmp("verify");
    let md = dir.join("run").display().to_string();
    let out_path = dir.join("digits.onnx").display().to_string();
    for args in [
        &[
            "train",
            "examples/digits_mlp.est",
            "--model-dir",
            &md,
            "--steps",
            "30",
        ][..],
        &[
            "export",
            "examples/digits_mlp.est",
            "--model-dir",
            &md,
            "-o",
            &out_path,
            "--verify",
        ],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_estc"))
            .args(args)
            .current_dir(root())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if args[0] == "export" {
            assert!(text.contains("inputs:  features f32[batch, 64]"), "{text}");
            assert!(
                text.contains("outputs: classes i32[batch], probabilities f32[batch, 10]"),
                "{text}"
            );
            assert!(
                text.contains("verified with onnxruntime 1.31.1 at batch sizes 40 and 20"),
                "{text}"
            );
            let worst: f64 = text
                .split("largest difference from est ")
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .and_then(|s| s.parse().ok())
                .unwrap_or(f64::INFINITY);
            assert!(worst <= 1e-5, "{text}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
