//! The wafer target's figures: for each program, the compile time (kernel formation and
//! layout, median of 5), and two simulated train steps on generated data: cycles per
//! step, samples per second at the fabric's clock, the utilisation of the used PEs and
//! of each dense layer, the slowest kernel against the balanced period (the busy
//! cycles per sample of every PE, spread evenly over them), the simulator's speed
//! in simulated PE-cycles per second of wall time, and the fullest PE's memory by
//! what it holds; last, how long a check takes to refuse programs that do not fit.
//! There is no peer to run beside: no
//! public wafer compiler or simulator exists.
//!
//! `cargo bench --bench wafer`; `EST_BENCH_STEPS` (default 2) simulated steps;
//! `EST_BENCH_ONLY=NAME` runs the programs whose name contains `NAME`.

use est::backend::wafer::fabric::Fabric;
use est::backend::wafer::{form, place, report};
use est::elab::Target;
use est::syntax::ast::SectionKind;
use est::{check, CheckOptions, Program};
use std::time::Instant;

/// An MLP with one large layer: 1024 -> 1024 (relu) -> 10, batch 32 (and, replaced,
/// 64).
const LARGE_DENSE: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
model large(features: f32[B, 1024], labels: i32[B]) {
  let h = dense(features, 1024, activation: relu)
  let logits = dense(h, 10)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with sgd(lr: 0.01) }
}
input data() { range(64) |> map |i| (broadcast_to(cast(i, f32), [1024]), i % 10) |> repeat |> batch(32, drop_remainder: true) }
estimator large { model = large  train_input = data() }
"#;

/// An unrolled recurrent network: 8 steps of 16 features, a state of 128 shared by
/// every step (each step one layer summing `x_t Wx + h Wh`), batch 16.
const UNROLLED_RNN: &str = r#"
use std.losses.softmax_cross_entropy
model rnn(features: f32[B, 128], labels: i32[B]) {
  let x = reshape(features, [B, 8, 16])
  let wx = variable("wx", [16, 128], init: init_normal(0.1))
  let wh = variable("wh", [128, 128], init: init_normal(0.1))
  let b = variable("b", [128], init: "zeros")
  let wo = variable("wo", [128, 10], init: init_normal(0.1))
  let h = tanh(matmul(reshape(slice(x, axis: 1, start: 0, end: 1), [B, 16]), wx) + b)
  for t in [1, 2, 3, 4, 5, 6, 7] {
    h = tanh(matmul(reshape(slice(x, axis: 1, start: t, end: t + 1), [B, 16]), wx) + matmul(h, wh) + b)
  }
  let loss = softmax_cross_entropy(labels, matmul(h, wo))
  train { minimize loss with sgd(lr: 0.1) }
}
input data() { range(64) |> map |i| (broadcast_to(cast(i, f32), [128]), i % 10) |> repeat |> batch(16, drop_remainder: true) }
estimator rnn { model = rnn  train_input = data() }
"#;

/// A GRU classifier (`std.nn.gru`, Keras's reset-after form): 16 steps of 8 features,
/// 16 units, its last state into 10 classes, batch 16. (A step's gates are dealt to
/// lanes, each lane its units of every gate: `kernels/vector/heads.rs`.)
const GRU_CLASSIFIER: &str = include_str!("../tests/fixtures/wafer/gru_classifier.est");

/// ResNet's basic blocks on 8x8 images: a convolution with batch norm, then two
/// residual blocks of two convolutions with batch norm each (16 channels, no
/// projection), global average pooling and a dense layer; batch 16.
const RESIDUAL_CNN: &str = r#"
use std.nn.{batch_norm, conv2d, dense}
use std.losses.softmax_cross_entropy
fn conv_bn(x) { batch_norm(conv2d(x, 16, 3, padding: same, use_bias: false), momentum: 0.9) }
model r(features: f32[B, 64], labels: i32[B]) {
  let x = relu(conv_bn(reshape(features, [B, 8, 8, 1])))
  for i in 0..2 { x = relu(x + conv_bn(relu(conv_bn(x)))) }
  let loss = softmax_cross_entropy(labels, dense(reduce_mean(x, axis: [1, 2]), 10))
  train { minimize loss with sgd(lr: 0.1) }
}
input data() { range(64) |> map |i| (broadcast_to(cast(i, f32) / 64.0, [64]), i % 10) |> repeat |> batch(16, drop_remainder: true) }
estimator r { model = r  train_input = data() }
"#;

/// A ResNet-8 on 8x8 images: a stem, then three basic blocks of 16, 32 and 64 channels,
/// the last two strided by 2 with projection shortcuts (1x1 convolutions with batch
/// norm); batch 16, momentum.
const RESNET8: &str = r#"
use std.nn.{batch_norm, conv2d, dense}
use std.losses.softmax_cross_entropy
fn conv_bn(x, filters: int, strides: int, kernel: int = 3) {
  batch_norm(conv2d(x, filters, kernel, strides: strides, padding: same, use_bias: false), momentum: 0.9)
}
fn block(x, filters: int, strides: int, project: bool) {
  let y = conv_bn(relu(conv_bn(x, filters, strides)), filters, 1)
  let shortcut = if project { conv_bn(x, filters, strides, kernel: 1) } else { x }
  relu(y + shortcut)
}
model r(features: f32[B, 64], labels: i32[B]) {
  let x = relu(conv_bn(reshape(features, [B, 8, 8, 1]), 16, 1))
  let x = block(x, 16, 1, false)
  let x = block(x, 32, 2, true)
  let x = block(x, 64, 2, true)
  let loss = softmax_cross_entropy(labels, dense(reduce_mean(x, axis: [1, 2]), 10))
  train { minimize loss with momentum(lr: 0.1, momentum: 0.9) }
}
input data() { range(64) |> map |i| (broadcast_to(cast(i, f32) / 64.0, [64]), i % 10) |> repeat |> batch(16, drop_remainder: true) }
estimator r { model = r  train_input = data() }
"#;

/// A transformer's feed-forward block over 16 tokens of 16 features (an embedding of
/// 64 ids, normalised per token, `dense(32, gelu) -> dense(16)`, normalised again),
/// pooled over the tokens into 4 classes, batch 16: dense layers over tokens
/// (`Shape::Tokens`) dealt through the GELU kernel's lanes between them, the layer
/// norms on one lane each.
const TOKEN_FFN: &str = include_str!("../tests/fixtures/wafer/token_ffn.est");

/// Multi-head self-attention over an embedding: 16 tokens of 16 features, the query,
/// key and value from one layer over each token (GPT-2's fused projection), 2 heads of
/// 8, the context through a layer over each token, normalised and pooled, batch 16.
const TOKEN_ATTENTION: &str = r#"
use std.nn.{dense, embedding, layer_norm}
use std.losses.softmax_cross_entropy
model t(features: i32[B, 16], labels: i32[B]) {
  let x = layer_norm(embedding(features, 64, 16))
  let qkv = dense(x, 48)
  let q = reshape(slice(qkv, 2, 0, 16), [B, 16, 2, 8])
  let k = reshape(slice(qkv, 2, 16, 32), [B, 16, 2, 8])
  let v = reshape(slice(qkv, 2, 32, 48), [B, 16, 2, 8])
  let p = softmax(einsum("bqhd,bkhd->bhqk", q, k) * 0.35355, axis: 3)
  let c = reshape(einsum("bhqk,bkhd->bqhd", p, v), [B, 16, 16])
  let y = layer_norm(dense(c, 16))
  let loss = softmax_cross_entropy(labels, dense(reduce_mean(y, axis: 1), 4))
  train { minimize loss with adam(lr: 0.001) }
}
input data() { range(64) |> map |i| (broadcast_to(i, [16]), i % 4) |> repeat |> batch(16, drop_remainder: true) }
estimator t { model = t  train_input = data() }
"#;

/// GPT-2's pre-LayerNorm blocks, small: token and position embeddings, two blocks of
/// `x + attention(layer_norm(x))` (2 heads of 8, the fused projection) and `x +
/// ffn(layer_norm(x))` (GELU, 32), normalised and pooled, 16 tokens of 16, batch 16.
const GPT_BLOCKS: &str = include_str!("../tests/ui/pass/gpt_blocks.est");

/// A classifier of 1,000 classes: 256 features -> 256 (relu) -> 1,000, batch 32; its
/// loss runs across the last layer's rows (on one lane, the layer fits no fabric).
const THOUSAND_CLASSES: &str = include_str!("../tests/fixtures/wafer/thousand_classes.est");

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `program` with `params` and the options of a train check on `fab`; `None` when
/// `EST_BENCH_ONLY` leaves `name` out.
fn setup(
    name: &str,
    mut program: Program,
    params: &[(&str, &str)],
    fab: &Fabric,
) -> Option<(Program, CheckOptions)> {
    if std::env::var("EST_BENCH_ONLY").is_ok_and(|only| !name.contains(&only)) {
        return None;
    }
    for (k, v) in params {
        program.add_override(k, v, "bench");
    }
    let opts = CheckOptions {
        target: Target::Wafer,
        modes: vec![SectionKind::Train],
        fabric: Some(fab.clone()),
        ..Default::default()
    };
    Some((program, opts))
}

fn bench(name: &str, program: Program, params: &[(&str, &str)], fab: &Fabric, steps: u32) {
    let Some((program, opts)) = setup(name, program, params, fab) else {
        return;
    };
    let checked = check(&program, &opts);
    let Some(c) = checked.graphs.first().filter(|_| !checked.has_errors()) else {
        println!(
            "{name:<28} {:<7} does not check: {:?}",
            fab.name,
            checked
                .diags
                .first()
                .map(|d| format!("{}: {}", d.code.id(), d.message))
        );
        return;
    };
    let g = &c.graph;
    let mut times = Vec::new();
    let mut laid = None;
    for _ in 0..5 {
        let t = Instant::now();
        let g = form::prepared(g);
        let r = form::form(&g)
            .map_err(|u| u.message)
            .and_then(|f| place::layout(&g, &f, fab).map_err(|e| format!("{e:?}")));
        times.push(t.elapsed().as_secs_f64());
        laid = Some(r);
    }
    let compile = median(times);
    let l = match laid {
        Some(Ok(l)) => l,
        Some(Err(e)) => {
            println!(
                "{name:<28} {:<7} compile {:>7.1} ms, not laid out: {e}",
                fab.name,
                compile * 1e3
            );
            return;
        }
        None => return,
    };
    let t = Instant::now();
    let sim = match report::simulate(&l, steps) {
        Ok(s) => s,
        Err(e) => {
            println!("{name:<28} {:<7} did not run: {e}", fab.name);
            return;
        }
    };
    let wall = t.elapsed().as_secs_f64();
    let r = report::measure(&l, &sim, steps);
    let s = sim.summary();
    let pe_cycles = s.cycles as f64 * s.pes as f64;
    let samples = f64::from(steps * r.batch);
    let busy: f64 = sim.stats().iter().map(|(_, p)| p.busy as f64).sum::<f64>() / samples;
    let balanced = busy / f64::from(r.pes.max(1));
    let slowest = &r.kernels[r.slowest];
    let dense: Vec<String> = (r.kernels.iter())
        .filter(|k| !k.name.contains(' '))
        .map(|k| format!("{} {}x{} {:.1}%", k.name, k.w, k.h, 100.0 * k.utilisation))
        .collect();
    let fullest = r.fullest.as_ref().map_or(String::new(), |m| {
        let parts: Vec<String> = (m.parts.iter())
            .map(|(w, b)| format!("{:.1}K {w}", f64::from(*b) / 1024.0))
            .collect();
        format!(" | fullest PE ({}): {}", m.kernel, parts.join(", "))
    });
    println!(
        "{name:<28} {:<7} compile {:>6.1} ms | step {:>8.0} cycles, {:>9.0} samples/s, {:>5} PEs at {:>5.1}% | slowest {} {:.1} cyc/sample = {:.2}x balanced | sim {:.2e} PE-cycles/s | dense: {}{fullest}",
        fab.name,
        compile * 1e3,
        r.step_cycles,
        r.samples_per_second,
        r.pes,
        100.0 * r.utilisation,
        slowest.name,
        slowest.cycles_per_sample,
        slowest.cycles_per_sample / balanced.max(1e-9),
        pe_cycles / wall,
        dense.join(", ")
    );
}

/// How long the wafer takes to refuse a program that does not fit (`estc check
/// --target wafer`: every sizing tried before the diagnostic; median of 3), and the
/// code it refuses it with; or to check one that fits (`fits`).
fn refusal(name: &str, program: Program, params: &[(&str, &str)], fab: &Fabric) {
    let Some((program, opts)) = setup(name, program, params, fab) else {
        return;
    };
    let mut times = Vec::new();
    let mut codes = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let checked = check(&program, &opts);
        times.push(t.elapsed().as_secs_f64());
        codes = (checked.diags.iter()).map(|d| d.code.id()).collect();
    }
    // (a program that fits: the time its check takes)
    let (verb, codes) = match codes.is_empty() {
        true => ("checked", "fits".to_string()),
        false => ("refused", codes.join(", ")),
    };
    println!(
        "{name:<28} {:<7} {verb} in {:>7.1} ms: {codes}",
        fab.name,
        median(times) * 1e3,
    );
}

fn main() {
    let steps: u32 = std::env::var("EST_BENCH_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let load = |f: &str| Program::load(&root.join("examples").join(f)).expect("example");
    let (t32, t64) = (Fabric::test32(), Fabric::named("test64").expect("test64"));
    bench("digits_mlp", load("digits_mlp.est"), &[], &t32, steps);
    bench("digits_mlp", load("digits_mlp.est"), &[], &t64, steps);
    bench("fc_mnist", load("fc_mnist.est"), &[], &t32, steps);
    bench("fc_mnist", load("fc_mnist.est"), &[], &t64, steps);
    // the same in mixed precision (Cerebras's `mixed_precision`), its layers on the
    // fp16 lanes
    let mixed = [("mixed_precision", "true")];
    bench(
        "fc_mnist mixed precision",
        load("fc_mnist.est"),
        &mixed,
        &t32,
        steps,
    );
    bench(
        "fc_mnist mixed precision",
        load("fc_mnist.est"),
        &mixed,
        &t64,
        steps,
    );
    bench(
        "linear_regression",
        load("linear_regression.est"),
        &[],
        &t32,
        steps,
    );
    // the TPU example as it is: hidden [256, 256], batch 128 (1F1B windows)
    bench("mnist_cnn", load("mnist_cnn.est"), &[], &t64, steps);
    bench(
        "mnist_cnn hidden=[128], batch 8",
        load("mnist_cnn.est"),
        &[("hidden", "[128]"), ("batch_size", "8")],
        &t64,
        steps,
    );
    let large = Program::from_source("large_dense.est", LARGE_DENSE, None);
    bench("dense 1024x1024, batch 32", large, &[], &t64, steps);
    // the same at batch 64: a step's fill, drain and update over twice the samples
    let src = LARGE_DENSE.replace("batch(32,", "batch(64,");
    let large = Program::from_source("large_dense.est", &src, None);
    bench("dense 1024x1024, batch 64", large, &[], &t64, steps);
    let rnn = Program::from_source("unrolled_rnn.est", UNROLLED_RNN, None);
    bench("unrolled rnn 8x16->128, b16", rnn, &[], &t64, steps);
    let gru = Program::from_source("gru_classifier.est", GRU_CLASSIFIER, None);
    bench("gru 16x8->16, b16", gru, &[], &t64, steps);
    let classes = Program::from_source("thousand_classes.est", THOUSAND_CLASSES, None);
    bench("256->256->1000 classes, b32", classes, &[], &t64, steps);
    bench("wide_deep", load("wide_deep.est"), &[], &t32, steps);
    // batch norm in training: two convolutions, each with its batch's statistics (the
    // kernels up to the second barrier keep the batch of 32)
    let bn = Program::load(&root.join("tests/ui/pass/cnn_batch_norm.est")).expect("cnn_batch_norm");
    bench("cnn_batch_norm b32", bn, &[], &t32, steps);
    // residuals around convolutions with batch norm (ResNet's basic block)
    let res = Program::from_source("residual_cnn.est", RESIDUAL_CNN, None);
    bench("residual cnn 2 blocks, b16", res, &[], &t64, steps);
    // ResNet's stages: projection shortcuts beside strided blocks
    let resnet8 = Program::from_source("resnet8.est", RESNET8, None);
    bench("resnet-8 16/32/64 on 8x8, b16", resnet8, &[], &t64, steps);
    // a transformer's feed-forward block over tokens
    let ffn = Program::from_source("token_ffn.est", TOKEN_FFN, None);
    bench("token ffn 16x16->32, b16", ffn, &[], &t32, steps);
    // multi-head self-attention, its products on one lane
    let attention = Program::from_source("token_attention.est", TOKEN_ATTENTION, None);
    bench("attention 16x16 2 heads, b16", attention, &[], &t32, steps);
    // GPT-2's pre-LayerNorm blocks: each layer norm's kernel relays the block's input
    let gpt = Program::from_source("gpt_blocks.est", GPT_BLOCKS, None);
    bench("gpt 2 pre-LN blocks 16x16, b16", gpt, &[], &t32, steps);
    // the BERT example at its default 32 tokens of 32 features and at 16 of 16 (its
    // attention's heads dealt to lanes)
    bench("bert 32x32, b16", load("bert.est"), &[], &t32, steps);
    let small = [("length", "16"), ("hidden", "16"), ("ffn", "32")];
    bench("bert 16x16, b16", load("bert.est"), &small, &t32, steps);
    // programs the wafer refuses, and how long it takes to say so
    let huge = [("hidden", "[4096, 4096]")];
    refusal(
        "digits_mlp hidden=[4096, 4096]",
        load("digits_mlp.est"),
        &huge,
        &t32,
    );
    let wse2 = Fabric::named("wse2").expect("wse2");
    refusal("mobilenet, batch 32", load("mobilenet.est"), &[], &wse2);
    let deep = Program::load(&root.join("tests/ui/wafer/E0604_too_many_layers.est"))
        .expect("E0604_too_many_layers");
    refusal("40 layers", deep, &[], &t32);
}
