//! Every program in `examples/` checks with no diagnostic at all on both targets (on the
//! wafer, on the default `test32` at its own batch), and the standard library
//! (`stdlib/`, loaded by every program) is free of diagnostics.

mod common;

use est::elab::Target;

/// The examples that use what the wafer does not lay out yet (E0601 says so, and the
/// Makefile's demo checks them on the host only), and why.
/// The examples the wafer refuses, with the codes it may refuse each with and why.
const HOST_ONLY: [(&str, &[&str], &str); 3] = [
    (
        "examples/mobilenet.est",
        &["E0603", "E0604"],
        "batch norm keeps every sample of its step, so its kernels deal their 32x32 planes of 32 samples in bands of rows, a depthwise convolution's lanes taking the rows its windows reach from the lanes beside them: it checks on wse2, but on a small fabric its kernels' lanes do not fit the PEs (E0604) or a PE (E0603)",
    ),
    (
        "examples/resnet20.est",
        &["E0603", "E0604"],
        "batch norm keeps every sample of its step: at 32 samples the first stage's kernels need 128 to 256 lanes each (a lane's band of 32x32 planes of every sample), and the staircase of its twenty layers at those widths spans 1118x1387 PEs, wider and taller than wse2 (E0604 on wse2; at 16 samples it checks), or, on a small fabric, its kernels' lanes do not fit the PEs (E0603 or E0604); its residuals and projection shortcuts have kernels, in bands of rows too",
    ),
    (
        "examples/text_classifier.est",
        &["E0601"],
        "an embedding's sequence into a GRU: each step of the unrolled GRU takes its input from the host, and a sequence the wafer makes does not reach every step",
    ),
];

#[test]
fn examples_check_clean_on_both_targets() {
    let files = common::example_files();
    let names: Vec<String> = files.iter().map(|p| common::rel(p)).collect();
    for want in ["mnist_cnn", "fc_mnist", "digits_mlp", "linear_regression"] {
        assert!(
            names.iter().any(|n| n.contains(want)),
            "examples/{want}.est is missing"
        );
    }
    for path in &files {
        let name = common::rel(path);
        for target in [Target::Host, Target::Wafer] {
            let (_, checked) = common::check_file(path, &name, target, &common::directives(""));
            let found: Vec<String> = checked
                .diags
                .iter()
                .map(|x| format!("{}: {}", x.code.id(), x.message))
                .collect();
            let unlaid = (HOST_ONLY.iter()).find(|h| target == Target::Wafer && h.0 == name);
            if let Some((_, codes, why)) = unlaid {
                assert!(
                    !found.is_empty()
                        && (found.iter()).all(|f| codes.iter().any(|c| f.starts_with(c))),
                    "{name} on the wafer ({why}): {found:?}"
                );
            } else {
                assert!(found.is_empty(), "{name} on {}: {found:?}", target.name());
            }
            let estimators = if name == "examples/text_classifier.est" {
                2
            } else {
                1
            };
            assert_eq!(
                checked.graphs.len(),
                3 * estimators,
                "{name}: a graph per mode and estimator"
            );
        }
    }
}

/// The Makefile's demo checks the same examples on the host only.
#[test]
fn the_demo_knows_the_host_only_examples() {
    let make = std::fs::read_to_string(common::root().join("Makefile")).unwrap();
    let line = make
        .lines()
        .find_map(|l| l.strip_prefix("HOST_ONLY_EXAMPLES = "))
        .expect("HOST_ONLY_EXAMPLES in the Makefile");
    let listed: Vec<String> = line
        .split_whitespace()
        .map(|n| format!("examples/{n}.est"))
        .collect();
    let here: Vec<String> = HOST_ONLY.iter().map(|h| h.0.to_string()).collect();
    assert_eq!(listed, here);
}

#[test]
fn stdlib_is_clean() {
    let text = "use std.nn\nuse std.losses\nuse std.metrics\nuse std.hooks\nuse std.optim\nuse std.data\nuse std.prim\nuse std.image\n";
    let program = est::Program::from_source("all_std.est", text, None);
    let resolved = est::resolve::resolve(&program);
    let in_std: Vec<String> = program
        .diags
        .iter()
        .chain(resolved.iter())
        .filter(|d| program.is_std_file(d.primary.span.file))
        .map(|d| {
            format!(
                "{}: {} at {}",
                d.code.id(),
                d.message,
                program.sources.get(d.primary.span.file).name
            )
        })
        .collect();
    assert!(in_std.is_empty(), "{in_std:?}");
    assert_eq!(
        program.modules.iter().filter(|m| m.is_std).count(),
        est::program::STDLIB.len()
    );
}

#[test]
fn mnist_cnn_graph_has_the_expected_shapes() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mnist_cnn.est");
    let d = common::directives("");
    let (_, checked) = common::check_file(&path, "mnist_cnn.est", Target::Host, &d);
    let train = &checked.graphs[0];
    let dump = est::ir::dump_text(&train.graph, "t");
    for line in [
        "input \"features\" : f32[128, 784]",
        "conv2d strides=[1, 1] padding=same dilation=[1, 1] (%2, %3) : f32[128, 28, 28, 32]",
        "max_pool2d window=[2, 2] strides=[2, 2] padding=valid (%13) : f32[128, 7, 7, 64]",
        "variable \"block_1/dense/kernel\" init=glorot_uniform : f32[256, 256]",
        "output learning_rate learning_rate",
    ] {
        assert!(dump.contains(line), "missing `{line}` in\n{dump}");
    }
}

/// `decode_raw` without a length leaves the pipeline's feature length open; the model's
/// `f32[B, 784]` fixes it, and the `map` graph then has concrete shapes throughout.
#[test]
fn pipeline_graphs_get_the_length_the_model_binds() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mnist_cnn.est");
    let d = common::directives("");
    let (_, checked) = common::check_file(&path, "mnist_cnn.est", Target::Host, &d);
    let input = checked.graphs[0]
        .input
        .as_ref()
        .expect("the train graph has its input");
    let map = input
        .stages
        .iter()
        .find_map(|s| match &s.kind {
            est::elab::data::StageKind::Map { graph, .. } => Some(graph),
            _ => None,
        })
        .expect("a map stage");
    let dump = est::ir::dump_text(map, "map");
    assert!(dump.contains("decode_raw (%0) : u8[784]"), "{dump}");
    assert!(dump.contains("output element 0 ="), "{dump}");
    assert!(
        !dump.contains("2147483648"),
        "an unknown length is left in:\n{dump}"
    );
    assert!(est::passes::verify(map).is_ok());
    assert_eq!(input.elem().to_string(), "(f32[128, 784], i32[128])");
}

/// `examples/wide_deep.est` trains a few steps on the interpreter (and the host), with
/// its evaluations and best checkpoint: CSV defaults, a vocabulary file, hashed,
/// bucketized and crossed columns, FTRL and Adagrad over disjoint variables.
#[test]
fn wide_deep_trains_a_few_steps() {
    let mut targets = vec![Target::Interp];
    if cfg!(feature = "llvm") {
        targets.push(Target::Host);
    }
    for target in targets {
        let dir = common::scratch("examples", &format!("wide-deep-{target:?}"));
        let mut e = common::estimator("examples/wide_deep.est", target, &dir)
            .unwrap_or_else(|c| panic!("{c:?}"));
        let r = e
            .train_and_evaluate(est::runtime::Steps::Max(20), 10)
            .unwrap();
        assert_eq!(r.train.global_step, 20);
        assert_eq!(r.evals.len(), 2);
        for ev in &r.evals {
            assert_eq!(ev.examples, 200, "{target:?}: the whole test split");
            let auc = ev.metrics.iter().find(|m| m.0 == "auc").unwrap().1;
            assert!(
                (0.0..=1.0).contains(&auc) && ev.loss.is_finite(),
                "{target:?}: {ev:?}"
            );
        }
        assert!(dir.join("best/best.json").exists(), "{target:?}: keep_best");
    }
}

/// An example's estimator (`name`, or its only one) with params overridden.
fn example(
    file: &str,
    name: Option<&str>,
    params: &[(&str, &str)],
    target: Target,
    dir: &std::path::Path,
) -> est::runtime::Estimator {
    let mut p = est::Program::load(&common::root().join(file)).unwrap();
    for (k, v) in params {
        p.add_override(k, v, &format!("--param {k}"));
    }
    let opts = est::runtime::RunOptions {
        target,
        estimator: name.map(str::to_string),
        model_dir: Some(dir.to_path_buf()),
        ..Default::default()
    };
    est::runtime::Estimator::new(&p, &opts).unwrap_or_else(|f| {
        panic!(
            "{file}: {:?}",
            f.diags.iter().map(|d| d.code).collect::<Vec<_>>()
        )
    })
}

/// An example's estimator (small `params`) trained `steps` steps from its initial
/// variables, on `target`: the estimator, those variables, and the run.
fn trained_a_few_steps(
    file: &str,
    params: &[(&str, &str)],
    steps: u64,
    target: Target,
) -> (
    est::runtime::Estimator,
    rustc_hash::FxHashMap<String, est::tensor::Tensor>,
    est::runtime::TrainReport,
) {
    let stem = std::path::Path::new(file)
        .file_stem()
        .unwrap()
        .to_string_lossy();
    let dir = common::scratch("examples", &format!("{stem}-{target:?}"));
    let mut e = example(file, None, params, target, &dir);
    e.restore_or_init().unwrap();
    let before = e.variables();
    let r = e.train(est::runtime::Steps::Max(steps)).unwrap();
    assert_eq!(r.global_step, steps as i64, "{file} on {target:?}");
    (e, before, r)
}

fn targets() -> Vec<Target> {
    let mut targets = vec![Target::Interp];
    if cfg!(feature = "llvm") {
        targets.push(Target::Host);
    }
    targets
}

/// `examples/resnet20.est` (at a batch of 4) trains a few steps and evaluates: CIFAR-10
/// binary records through `fixed_length_record`, padding, random crops and flips in the
/// pipeline, batch norm updating its moving averages, hand-written weight decay and a
/// piecewise-constant learning rate.
#[test]
fn resnet20_trains_a_few_steps() {
    for target in targets() {
        let (mut e, before, r) = trained_a_few_steps(
            "examples/resnet20.est",
            &[("batch_size", "4"), ("boundaries", "[1, 2]")],
            3,
            target,
        );
        assert!(
            r.final_loss.is_finite() && r.final_loss > 0.0,
            "{target:?}: {r:?}"
        );
        let after = e.variables();
        // twenty convolutions and their batch norms, and the dense head
        let kernels = after
            .keys()
            .filter(|k| k.ends_with("conv2d/kernel"))
            .count();
        assert_eq!(
            kernels,
            19 + 3,
            "{target:?}: 19 3x3 convolutions and 3 projections"
        );
        let mean = "conv_bn/batch_norm/moving_mean";
        assert!(
            before[mean].to_f64().iter().all(|&x| x == 0.0)
                && after[mean].to_f64().iter().any(|&x| x != 0.0),
            "{target:?}: batch norm's moving mean moves in training"
        );
        let ev = e.evaluate(Some(2)).unwrap();
        assert_eq!((ev.global_step, ev.examples), (3, 8), "{target:?}");
        let acc = ev.metrics.iter().find(|m| m.0 == "accuracy").unwrap().1;
        let top3 = ev.metrics.iter().find(|m| m.0 == "top_3").unwrap().1;
        assert!(
            acc <= top3 && (0.0..=1.0).contains(&top3),
            "{target:?}: {ev:?}"
        );
    }
}

/// `examples/bert.est` (tiny: batch 4, 16 tokens) trains a few steps and evaluates:
/// [CLS] prepended in the pipeline to a sequence of unknown length, token and position
/// embeddings, two post-LayerNorm encoder layers of masked multi-head attention and a
/// GELU feed-forward block, dropout, the pooled [CLS] state and a binary head, Adam under
/// a warm-up schedule.
#[test]
fn bert_trains_a_few_steps() {
    for target in targets() {
        let (mut e, before, r) = trained_a_few_steps(
            "examples/bert.est",
            &[("batch_size", "4"), ("length", "16"), ("warmup_steps", "2")],
            4,
            target,
        );
        // a binary cross-entropy near log 2 at the start
        assert!(
            r.final_loss > 0.3 && r.final_loss < 1.5,
            "{target:?}: {r:?}"
        );
        let after = e.variables();
        let trained: Vec<&String> = (after.keys())
            .filter(|k| !k.contains("/adam") && after[*k].shape().len() <= 2)
            .filter(|k| k.ends_with("kernel") || k.ends_with("embeddings"))
            .collect();
        // per layer the query, key and value's projection, the attention's output and
        // two feed-forward kernels; the pooler and the head; two embedding tables
        assert_eq!(trained.len(), 2 * 4 + 2 + 2, "{target:?}: {trained:?}");
        // the [CLS] row of the token table (id 256) learns; a byte no review has does not
        let table = (after.keys())
            .find(|k| k.ends_with("embeddings") && after[*k].shape() == [257, 32])
            .unwrap_or_else(|| panic!("{target:?}: no token table in {trained:?}"));
        let row = |t: &est::tensor::Tensor, i: usize| t.to_f64()[i * 32..(i + 1) * 32].to_vec();
        assert_ne!(
            row(&before[table], 256),
            row(&after[table], 256),
            "{target:?}"
        );
        assert_eq!(
            row(&before[table], 0x7f),
            row(&after[table], 0x7f),
            "{target:?}"
        );
        let ev = e.evaluate(Some(2)).unwrap();
        assert_eq!((ev.global_step, ev.examples), (4, 8), "{target:?}");
        let auc = ev.metrics.iter().find(|m| m.0 == "auc").unwrap().1;
        assert!(
            (0.0..=1.0).contains(&auc) && ev.loss.is_finite(),
            "{target:?}: {ev:?}"
        );
    }
}

/// `examples/mobilenet.est` (at a batch of 4) trains a few steps and evaluates: thirteen
/// depthwise separable blocks, each a depthwise and a pointwise convolution with batch
/// norm and ReLU6, global average pooling, RMSProp with momentum.
#[test]
fn mobilenet_trains_a_few_steps() {
    for target in targets() {
        let (mut e, before, r) =
            trained_a_few_steps("examples/mobilenet.est", &[("batch_size", "4")], 3, target);
        // ten classes: about log 10 at the start
        assert!(
            r.final_loss > 1.0 && r.final_loss < 5.0,
            "{target:?}: {r:?}"
        );
        let after = e.variables();
        let count = |suffix: &str| after.keys().filter(|k| k.ends_with(suffix)).count();
        assert_eq!(count("depthwise_kernel"), 13, "{target:?}");
        assert_eq!(
            count("conv2d/kernel"),
            14,
            "{target:?}: the first and 13 pointwise"
        );
        assert_eq!(
            count("moving_mean"),
            27,
            "{target:?}: a batch norm per convolution"
        );
        // the last block's depthwise filters: 3x3 over its 256 channels (width 8 x 32)
        let last = (after.keys())
            .filter(|k| k.ends_with("depthwise_kernel"))
            .find(|k| after[*k].shape() == [3, 3, 256, 1])
            .unwrap_or_else(|| panic!("{target:?}: no [3, 3, 256, 1] depthwise filter"));
        assert_ne!(
            before[last].to_f64(),
            after[last].to_f64(),
            "{target:?}: it trains"
        );
        let ev = e.evaluate(Some(2)).unwrap();
        assert_eq!((ev.global_step, ev.examples), (3, 8), "{target:?}");
        let acc = ev.metrics.iter().find(|m| m.0 == "accuracy").unwrap().1;
        assert!(
            (0.0..=1.0).contains(&acc) && ev.loss.is_finite(),
            "{target:?}: {ev:?}"
        );
    }
}

/// `examples/text_classifier.est`: the language model (record features, no labels)
/// trains a few steps on padded byte sequences; the classifier warm-starts its encoder
/// from that checkpoint, leaves its head to the initialiser, and trains.
#[test]
fn text_classifier_pretrains_then_fine_tunes() {
    for target in targets() {
        let lm_dir = common::scratch("examples", &format!("text-lm-{target:?}"));
        let small = [("batch_size", "4"), ("length", "24"), ("units", "8")];
        let mut lm = example(
            "examples/text_classifier.est",
            Some("text_lm"),
            &small,
            target,
            &lm_dir,
        );
        let r = lm.train(est::runtime::Steps::Max(3)).unwrap();
        assert_eq!(r.global_step, 3);
        // byte-level: about log(256) at the start
        assert!(
            r.final_loss > 3.0 && r.final_loss < 7.0,
            "{target:?}: {r:?}"
        );
        let pretrained = lm.variables();
        let ev = lm.evaluate(Some(1)).unwrap();
        assert_eq!(ev.examples, 4, "{target:?}");

        let dir = common::scratch("examples", &format!("text-sentiment-{target:?}"));
        let from = format!("{:?}", lm_dir.display().to_string());
        let mut params = small.to_vec();
        params.push(("pretrained", &from));
        let mut e = example(
            "examples/text_classifier.est",
            Some("sentiment"),
            &params,
            target,
            &dir,
        );
        e.restore_or_init().unwrap();
        let got = e.variables();
        let encoder: Vec<&String> = got
            .keys()
            .filter(|k| k.starts_with("encoder/") && !k.contains("/adam"))
            .collect();
        assert_eq!(
            encoder.len(),
            4,
            "{target:?}: embedding and the GRU's three: {encoder:?}"
        );
        for k in encoder {
            assert_eq!(got[k], pretrained[k], "{target:?}: {k} is warm-started");
        }
        // the head is the classifier's own: one logit, not the language model's 256
        assert_eq!(got["dense/kernel"].shape(), [8, 1], "{target:?}");
        assert_eq!(pretrained["dense/kernel"].shape(), [8, 256], "{target:?}");
        let r = e.train(est::runtime::Steps::Max(3)).unwrap();
        assert_eq!((r.start_step, r.global_step), (0, 3), "{target:?}");
        let ev = e.evaluate(Some(2)).unwrap();
        let auc = ev.metrics.iter().find(|m| m.0 == "auc").unwrap().1;
        assert!(
            (0.0..=1.0).contains(&auc) && ev.loss.is_finite(),
            "{target:?}: {ev:?}"
        );
    }
}
