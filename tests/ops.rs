//! The ops ported from TensorFlow (`reverse`, `tile`, `cumsum`, `top_k`, `in_top_k`,
//! `einsum`, `pad`, `conv_transpose`, `depthwise_conv`, grouped `conv`, and
//! `std.image`'s `resize`, flips and `per_image_standardization`) predicted on every
//! target this build has, against TensorFlow's own outputs on the same inputs
//! (`tests/fixtures/tf_ops_reference.json`, written by `scripts/tf_ops_reference.py`
//! with TensorFlow 2.21). Tolerance: 1e-5 of `max(1, |value|)`: the inputs are f32
//! sines (libm's on the host, Rust's in the interpreter, numpy's in the fixture), and
//! sums of up to 18 products reorder their roundings. Indices and booleans are exact.
//!
//! `std.nn`'s LSTM and GRU (unrolled over given weights, with and without sequence
//! lengths) against Keras's layers with the same weights.
//!
//! The wafer runs the ops made of moves within a sample (`reverse`, `tile`, `cumsum`,
//! `pad`, flips); the others count with `iota` or mix a sample's axes in ways its
//! kernels do not, and are E0601 there (checked below).

mod common;
use est::elab::Target;
use est::runtime::{Estimator, RunOptions, Steps};
use est::Program;

/// The inputs (see the script), the ops, and an estimator. `OUTPUTS` is spliced into
/// the predict section.
const SRC: &str = r#"
use std.image
use std.nn.dense

fn grid(shape, i) {
  let a = cast(iota(shape, axis: 0), f32)
  let b = cast(iota(shape, axis: 1), f32)
  let c = cast(iota(shape, axis: 2), f32)
  sin(a * 0.37 + b * 0.71 + c * 1.3 + cast(i, f32) * 0.5)
}

input xs(repeats: bool) {
  let d = range(4) |> map |i| (grid([6, 5, 3], i), 0.0)
  let d = if repeats { d |> repeat } else { d }
  d |> batch(4, drop_remainder: true)
}

model m(features: f32[B, 6, 5, 3], labels: f32[B]) {
  let x = features
  let loss = reduce_mean(square(dense(reshape(x, [x.shape[0], 90]), 1)))
  train { minimize loss with sgd(lr: 0.1) }
  predict {
OUTPUTS
  }
}

estimator m {
  model = m
  train_input = xs(true)
  predict_input = xs(false)
  config { save_checkpoint_steps = 100  random_seed = 7 }
}
"#;

/// What the wafer runs: moves within a sample.
const MOVES: &[(&str, &str)] = &[
    ("rev", "reverse(x, axis: [1, 2])"),
    ("cs", "cumsum(x, axis: 2)"),
    ("cse", "cumsum(x, axis: 1, exclusive: true, reverse: true)"),
    ("fl", "image.flip_left_right(x)"),
    (
        "pad_reflect",
        "pad(x, [[0, 0], [2, 1], [1, 3], [0, 0]], mode: \"reflect\")",
    ),
];

/// What the wafer does not run (E0601 there).
const OTHERS: &[(&str, &str)] = &[
    ("tiled", "tile(x, [1, 2, 1, 2])"),
    ("tk", "top_k(reshape(x, [4, 90]), k: 3)[0]"),
    ("tki", "top_k(reshape(x, [4, 90]), k: 3)[1]"),
    ("ein", "einsum(\"bhwc,bhvc->bwv\", x, x)"),
    (
        "ein_dense",
        "einsum(\"bhwc,cd->bhwd\", x, reshape(slice(grid([3, 3, 6], 2), 0, 0, 1) |> slice(1, 0, 1), [3, 2]))",
    ),
    ("rs", "image.resize(x, [9, 4])"),
    ("rs_down", "image.resize(x, [4, 3])"),
    ("rsn", "image.resize(x, [9, 4], method: \"nearest\")"),
    (
        "ct",
        "conv_transpose(x, tile(reshape(grid([3, 3, 2], 1), [3, 3, 2, 1]), [1, 1, 1, 3]), strides: 2)",
    ),
    (
        "ct_valid",
        "conv_transpose(x, tile(reshape(grid([3, 3, 2], 1), [3, 3, 2, 1]), [1, 1, 1, 3]), strides: 2, padding: valid)",
    ),
    (
        "dw",
        "depthwise_conv(x, reshape(grid([3, 3, 6], 2), [3, 3, 3, 2]), strides: 2)",
    ),
    (
        "dw_valid",
        "depthwise_conv(x, reshape(grid([3, 3, 6], 2), [3, 3, 3, 2]), padding: valid, dilation: [2, 1])",
    ),
    (
        "gc",
        "conv(x, reshape(grid([3, 3, 6], 3), [3, 3, 1, 6]), groups: 3)",
    ),
    (
        "gc2",
        "conv(tile(x, [1, 1, 1, 2]), reshape(grid([3, 3, 12], 4), [3, 3, 3, 4]), groups: 2, strides: 2, padding: valid)",
    ),
    (
        "itk",
        "cast(in_top_k(cast(abs(reduce_sum(x, axis: [1, 2, 3])) * 10.0, i32) % 3, reshape(x, [4, 90]), 10), f32)",
    ),
    ("pis", "image.per_image_standardization(x)"),
];

fn source(outputs: &[(&str, &str)]) -> String {
    let lines: Vec<String> = outputs
        .iter()
        .map(|(n, e)| format!("    {n} = {e}"))
        .collect();
    SRC.replace("OUTPUTS", &lines.join("\n"))
}

fn reference() -> serde_json::Value {
    let path = common::root().join("tests/fixtures/tf_ops_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn flat(v: &serde_json::Value, out: &mut Vec<f64>) {
    match v {
        serde_json::Value::Array(xs) => xs.iter().for_each(|x| flat(x, out)),
        serde_json::Value::Bool(b) => out.push(f64::from(u8::from(*b))),
        x => out.push(x.as_f64().unwrap()),
    }
}

/// The predictions of program `src` on `target` after one train step, by row.
fn predicted(target: Target, tag: &str, src: &str) -> Vec<serde_json::Value> {
    let dir = common::scratch("ops", &format!("{tag}-{target:?}"));
    let p = Program::from_source("ops.est", src, None);
    let opts = RunOptions {
        target,
        model_dir: Some(dir.clone()),
        ..Default::default()
    };
    let mut e = Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{target:?}: {:?}", f.diags));
    e.train(Steps::Max(1)).unwrap();
    let out = dir.join("pred");
    let p = e.predict(&out, None).unwrap();
    assert_eq!(p.examples, 4, "{target:?}");
    std::fs::read_to_string(out.join("predictions.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Each prediction of `names` against TensorFlow's.
fn compare(target: Target, rows: &[serde_json::Value], names: &[&str]) {
    let want = reference();
    for name in names {
        for (i, row) in rows.iter().enumerate() {
            let mut got = Vec::new();
            flat(&row[*name], &mut got);
            let mut w = Vec::new();
            flat(&want[*name][i], &mut w);
            assert_eq!(got.len(), w.len(), "{target:?}: {name} of example {i}");
            for (k, (g, w)) in got.iter().zip(&w).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{target:?}: {name}[{k}] of example {i}: {g} against TensorFlow's {w}"
                );
            }
        }
    }
}

/// Predicts `outputs` on `target` and compares each with TensorFlow's.
fn matches_tensorflow(target: Target, tag: &str, outputs: &[(&str, &str)]) {
    let rows = predicted(target, tag, &source(outputs));
    let names: Vec<&str> = outputs.iter().map(|(n, _)| *n).collect();
    compare(target, &rows, &names);
}

#[test]
fn moves_match_tensorflow_on_every_target() {
    let mut targets = vec![Target::Interp, Target::Wafer];
    if cfg!(feature = "llvm") {
        targets.push(Target::Host);
    }
    for t in targets {
        matches_tensorflow(t, "moves", MOVES);
    }
}

#[test]
fn counting_and_mixing_ops_match_tensorflow() {
    let mut targets = vec![Target::Interp];
    if cfg!(feature = "llvm") {
        targets.push(Target::Host);
    }
    for t in targets {
        matches_tensorflow(t, "others", OTHERS);
    }
}

/// The recurrent layers' program: sequences `[4, 5, 3]` of lengths [5, 2, 4, 1], and
/// weights `sines(shape, a, b)` as the script's.
const RNN: &str = r#"
use std.nn.{unrolled_lstm, unrolled_gru, dense}

fn sines(shape, a: float, b: float) {
  let n = 1
  for d in shape { n = n * d }
  reshape(sin(cast(iota([n]), f32) * a + b), shape) * 0.5
}

fn example(i) {
  let t = cast(iota([5, 3], axis: 0), f32)
  let f = cast(iota([5, 3], axis: 1), f32)
  let seq = sin(t * 0.37 + f * 0.71 + cast(i, f32) * 0.5);
  ({ seq: seq, len: cast(5 - (i * 3) % 5, i32) }, 0.0)
}

input seqs(repeats: bool) {
  let d = range(4) |> map |i| example(i)
  let d = if repeats { d |> repeat } else { d }
  d |> batch(4, drop_remainder: true)
}

model r(features: { seq: f32[B, 5, 3], len: i32[B] }, labels: f32[B]) {
  let x = features.seq
  let n = features.len
  let lk = sines([3, 16], 0.7, 0.3)
  let lr = sines([4, 16], 0.45, 1.1)
  let lb = sines([16], 0.9, 0.2)
  let gk = sines([3, 12], 0.6, 0.5)
  let gr = sines([4, 12], 0.35, 0.8)
  let gb = sines([2, 12], 0.8, 0.1)
  let loss = reduce_mean(square(dense(reshape(x, [x.shape[0], 15]), 1)))
  train { minimize loss with sgd(lr: 0.1) }
  predict {
    lstm_seq = unrolled_lstm(x, lk, lr, lb, return_sequences: true)
    lstm_masked = unrolled_lstm(x, lk, lr, lb, lengths: n, return_sequences: true)
    lstm_last = unrolled_lstm(x, lk, lr, lb, lengths: n)
    gru_seq = unrolled_gru(x, gk, gr, gb, return_sequences: true)
    gru_masked = unrolled_gru(x, gk, gr, gb, lengths: n, return_sequences: true)
    gru_last = unrolled_gru(x, gk, gr, gb, lengths: n)
  }
}

estimator r {
  model = r
  train_input = seqs(true)
  predict_input = seqs(false)
  config { save_checkpoint_steps = 100  random_seed = 7 }
}
"#;

#[test]
fn lstm_and_gru_match_keras() {
    let mut targets = vec![Target::Interp];
    if cfg!(feature = "llvm") {
        targets.push(Target::Host);
    }
    let names = [
        "lstm_seq",
        "lstm_masked",
        "lstm_last",
        "gru_seq",
        "gru_masked",
        "gru_last",
    ];
    for target in targets {
        let rows = predicted(target, "rnn", RNN);
        compare(target, &rows, &names);
    }
}

/// `grid([6, 5, 3], i)` of the programs here, in f32 as the interpreter computes it:
/// element `[a, b, c]` at `(a * 5 + b) * 3 + c`.
fn grid(i: usize) -> Vec<f64> {
    let mut v = Vec::new();
    for a in 0..6 {
        for b in 0..5 {
            for c in 0..3 {
                let t = a as f32 * 0.37 + b as f32 * 0.71 + c as f32 * 1.3 + i as f32 * 0.5;
                v.push(f64::from(t.sin()));
            }
        }
    }
    v
}

/// The window `[h, w, 3]` of `img` (`[6, 5, 3]`) at `(oh, ow)`.
fn window(img: &[f64], (oh, ow): (usize, usize), (h, w): (usize, usize)) -> Vec<f64> {
    let mut v = Vec::new();
    for a in oh..oh + h {
        for b in ow..ow + w {
            for c in 0..3 {
                v.push(img[(a * 5 + b) * 3 + c]);
            }
        }
    }
    v
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5)
}

/// Where `got` is a window of `img`, if it is one.
fn offset_of(img: &[f64], got: &[f64], size: (usize, usize)) -> Option<(usize, usize)> {
    (0..=6 - size.0)
        .flat_map(|a| (0..=5 - size.1).map(move |b| (a, b)))
        .find(|&o| close(&window(img, o, size), got))
}

/// Random flips and crops in the model: a coin per image (the same draws on every
/// target), and one window for the whole batch (`tf.image.random_crop`'s one offset
/// per axis).
#[test]
fn random_flips_and_crops_in_the_model() {
    let outputs = [
        ("rf", "image.random_flip_left_right(x)"),
        ("crop", "image.random_crop(x, [4, 4, 3, 3])"),
    ];
    let mut targets = vec![Target::Interp];
    if cfg!(feature = "llvm") {
        targets.push(Target::Host);
    }
    let mut flips = Vec::new();
    for target in targets {
        let rows = predicted(target, "random", &source(&outputs));
        let mut these = Vec::new();
        let mut offsets = Vec::new();
        for (i, row) in rows.iter().enumerate() {
            let img = grid(i);
            let mut rf = Vec::new();
            flat(&row["rf"], &mut rf);
            let mirrored: Vec<f64> = (0..6)
                .flat_map(|a| (0..5).rev().map(move |b| (a, b)))
                .flat_map(|(a, b)| (0..3).map(move |c| (a * 5 + b) * 3 + c))
                .map(|k| img[k])
                .collect();
            let flipped = close(&rf, &mirrored);
            assert!(
                flipped || close(&rf, &img),
                "{target:?}: example {i} neither flipped nor kept"
            );
            these.push(flipped);
            let mut crop = Vec::new();
            flat(&row["crop"], &mut crop);
            let o = offset_of(&img, &crop, (4, 3));
            assert!(
                o.is_some(),
                "{target:?}: example {i}'s crop is no window of it"
            );
            offsets.push(o);
        }
        assert!(
            offsets.windows(2).all(|w| w[0] == w[1]),
            "{target:?}: one window for the batch: {offsets:?}"
        );
        flips.push(these);
    }
    assert!(
        flips.windows(2).all(|w| w[0] == w[1]),
        "the same coins on every target: {flips:?}"
    );
}

/// Random crops and flips in an input pipeline's `map`, as TensorFlow programs augment:
/// each element gets its own window, and new draws in each epoch.
#[test]
fn random_crops_in_a_pipeline_vary_by_element_and_epoch() {
    let src = SRC
        .replace(
            "let d = range(4) |> map |i| (grid([6, 5, 3], i), 0.0)",
            "let d = range(4) |> map |i| (image.random_crop(grid([6, 5, 3], i), [4, 3, 3]), 0.0)",
        )
        .replace("f32[B, 6, 5, 3]", "f32[B, 4, 3, 3]")
        .replace("[x.shape[0], 90]", "[x.shape[0], 36]")
        .replace("OUTPUTS", "    crop = x");
    let rows = predicted(Target::Interp, "pipeline-crop", &src);
    let offsets: Vec<(usize, usize)> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let mut crop = Vec::new();
            flat(&row["crop"], &mut crop);
            offset_of(&grid(i), &crop, (4, 3))
                .unwrap_or_else(|| panic!("example {i}'s crop is no window of it"))
        })
        .collect();
    assert!(
        offsets.iter().any(|&o| o != offsets[0]),
        "each element draws its own window: {offsets:?}"
    );
}

/// The train input pipeline of the program `src`, written to `dir` beside a copy of
/// `tests/fixtures/images.tfrecord`, and its leaves' names.
fn image_pipeline(
    dir: &std::path::Path,
    src: &str,
) -> (est::data::pipeline::Pipeline, Vec<String>) {
    std::fs::copy(
        common::root().join("tests/fixtures/images.tfrecord"),
        dir.join("images.tfrecord"),
    )
    .unwrap();
    let path = dir.join("p.est");
    std::fs::write(&path, src).unwrap();
    let p = Program::load(&path).unwrap();
    let e = Estimator::new(
        &p,
        &RunOptions {
            target: Target::Interp,
            model_dir: Some(dir.join("run")),
            ..Default::default()
        },
    )
    .unwrap_or_else(|f| {
        panic!(
            "{:?}",
            f.diags.iter().map(|d| &d.message).collect::<Vec<_>>()
        )
    });
    e.input_pipeline(est::syntax::ast::SectionKind::Train)
        .unwrap()
}

/// `decode_png` and `decode_jpeg` in a pipeline's `map`, on the images of
/// `tests/fixtures/images.tfrecord`, against TensorFlow's decodings of them
/// (`tests/fixtures/tf_image_reference.json`, both written by
/// `scripts/tf_image_reference.py`): PNG exactly (8-bit RGB to 3, 1 and 4 channels,
/// 16-bit gray to 8 bits), resized PNG within 1e-4. JPEG is not exact: TensorFlow's
/// libjpeg-turbo and est's zune-jpeg round their IDCTs differently (gray within 1
/// level, half the pixels off by one) and upsample the subsampled chroma differently
/// (colour within 6 levels, 1.5 on average; measured 5 and 1.24 on these noisy 12x12
/// images).
#[test]
fn decoded_images_match_tensorflow() {
    let dir = common::scratch("ops", "decode-images");
    let src = r#"
use std.nn.dense
input images() {
  tfrecord("images.tfrecord")
    |> parse { png_rgb: bytes, png_rgba: bytes, png_gray16: bytes, jpeg_rgb: bytes, label: i32 }
    |> map |r| ({
      png3: cast(decode_png(r.png_rgb), f32),
      png1: cast(decode_png(r.png_rgb, channels: 1), f32),
      png4: cast(decode_png(r.png_rgba, channels: 4), f32),
      gray16: cast(decode_png(r.png_gray16, channels: 1), f32),
      jpeg3: cast(decode_jpeg(r.jpeg_rgb), f32),
      jpeg1: cast(decode_jpeg(r.jpeg_rgb, channels: 1), f32),
      resized: decode_png(r.png_rgb, size: [7, 9]),
      jpeg_resized: decode_jpeg(r.jpeg_rgb, size: [7, 9]),
    }, r.label)
    |> batch(2, drop_remainder: true)
}
model m(features: { png3: f32[B, 12, 12, 3], png1: f32[B, 12, 12, 1], png4: f32[B, 12, 12, 4], gray16: f32[B, 12, 12, 1], jpeg3: f32[B, 12, 12, 3], jpeg1: f32[B, 12, 12, 1], resized: f32[B, 7, 9, 3], jpeg_resized: f32[B, 7, 9, 3] }, labels: i32[B]) {
  let logits = dense(reshape(features.resized, [B, 189]), 2)
  let loss = reduce_mean(square(logits))
  train { minimize loss with sgd(lr: 0.1) }
}
estimator e { model = m  train_input = images()  config { random_seed = 1 } }
"#;
    let (mut pipe, names) = image_pipeline(&dir, src);
    let batch = pipe.next_element().unwrap().expect("a batch");
    let reference = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(common::root().join("tests/fixtures/tf_image_reference.json"))
            .unwrap(),
    )
    .unwrap();
    let examples = reference["examples"].as_array().unwrap();
    assert_eq!(names.len(), 9, "{names:?}");
    for (name, t) in names.iter().zip(&batch) {
        let Some(key) = name.strip_prefix("0.") else {
            continue;
        };
        let got = t.to_f64();
        let want: Vec<f64> = examples
            .iter()
            .flat_map(|ex| {
                ex[key]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
            })
            .collect();
        assert_eq!(got.len(), want.len(), "{key}");
        let diffs: Vec<f64> = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).collect();
        let worst = diffs.iter().cloned().fold(0.0, f64::max);
        let mean = diffs.iter().sum::<f64>() / diffs.len() as f64;
        if key == "jpeg1" {
            assert!(worst <= 1.0, "{key}: worst {worst}, mean {mean}");
        } else if key.starts_with("jpeg") {
            assert!(
                worst <= 6.0 && mean <= 1.5,
                "{key}: worst {worst}, mean {mean}"
            );
        } else {
            assert!(worst <= 1e-4, "{key}: worst {worst}");
        }
    }
}

/// What a pipeline says when an image does not decode, or has another size than the
/// model reads: E0905, with the way out.
#[test]
fn undecodable_and_missized_images_are_e0905() {
    let dir = common::scratch("ops", "decode-errors");
    for (decode, side, says) in [
        ("decode_png(r.jpeg_rgb)", 12, "not a readable PNG"),
        ("decode_jpeg(r.png_rgb)", 12, "not a readable JPEG"),
        (
            "decode_png(r.png_rgb)",
            10,
            "the image is 12x12, but the pipeline reads 10x10 images: give `size: [10, 10]`",
        ),
    ] {
        let src = format!(
            "use std.nn.dense
input images() {{
  tfrecord(\"images.tfrecord\")
    |> parse {{ png_rgb: bytes, jpeg_rgb: bytes, label: i32 }}
    |> map |r| (cast({decode}, f32), r.label)
    |> batch(2, drop_remainder: true)
}}
model m(features: f32[B, {side}, {side}, 3], labels: i32[B]) {{
  let loss = reduce_mean(square(dense(reshape(features, [B, {n}]), 2)))
  train {{ minimize loss with sgd(lr: 0.1) }}
}}
estimator e {{ model = m  train_input = images()  config {{ random_seed = 1 }} }}
",
            n = side * side * 3
        );
        let (mut pipe, _) = image_pipeline(&dir, &src);
        let d = pipe.next_element().expect_err("an error");
        assert_eq!(d.code, est::diag::Code::BadData, "{decode}: {}", d.message);
        assert!(d.message.contains(says), "{decode}: {}", d.message);
    }
}
