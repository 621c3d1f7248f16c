//! Every program in `examples/` checks with no diagnostic at all on both targets (on the
//! wafer, on a fabric and at a batch that hold it), and the standard library (`stdlib/`,
//! loaded by every program) is free of diagnostics.

mod common;

use est::elab::Target;

fn example_files() -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("examples/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "est"))
        .collect();
    v.sort();
    v
}

#[test]
fn examples_check_clean_on_both_targets() {
    let files = example_files();
    let names: Vec<String> = files.iter().map(|p| common::rel(p)).collect();
    for want in ["mnist_cnn", "fc_mnist", "digits_mlp", "linear_regression"] {
        assert!(
            names.iter().any(|n| n.contains(want)),
            "examples/{want}.est is missing"
        );
    }
    // what the larger example needs on the wafer (at its own batch, it is too large
    // for test32: only a does-not-fit code may say so)
    let wafer = |name: &str| match name {
        "examples/mnist_cnn.est" => {
            "// wafer: test64\n// param: batch_size=8\n// param: hidden=[128]\n"
        }
        _ => "",
    };
    for path in &files {
        let name = common::rel(path);
        for (target, d) in [
            (Target::Host, ""),
            (Target::Wafer, ""),
            (Target::Wafer, wafer(&name)),
        ] {
            let (_, checked) = common::check_file(path, &name, target, &common::directives(d));
            let found: Vec<String> = checked
                .diags
                .iter()
                .map(|x| format!("{}: {}", x.code.id(), x.message))
                .collect();
            let sizes = d.is_empty() && target == Target::Wafer && !wafer(&name).is_empty();
            // wide & deep adds its wide part after the deep layers, a value read past
            // the layer after it, which the wafer does not lay out yet
            let unlaid = target == Target::Wafer && name == "examples/wide_deep.est";
            if unlaid {
                assert!(
                    !found.is_empty() && found.iter().all(|f| f.starts_with("E0601")),
                    "{name} on the wafer: {found:?}"
                );
            } else if sizes {
                assert!(
                    !found.is_empty()
                        && found
                            .iter()
                            .all(|f| f.starts_with("E0603") || f.starts_with("E0604")),
                    "{name} on test32: {found:?}"
                );
            } else {
                assert!(
                    found.is_empty(),
                    "{name} on {} {d:?}: {found:?}",
                    target.name()
                );
            }
            assert_eq!(checked.graphs.len(), 3, "{name}: a graph per mode");
        }
    }
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
