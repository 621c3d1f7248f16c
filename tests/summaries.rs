//! Train summaries declared in a model (issue 13 §5): `summary_scalar` and
//! `summary_image`, computed on the batch of the step they describe (before it) and
//! written to TensorBoard every `save_summary_steps`, on every target. The expected
//! values are computed here from the input's rows.

mod common;
use est::elab::Target;
use est::runtime::{summary, Estimator, RunOptions, Steps};
use est::Program;

const SRC: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy

// row i: four features of i / 16; the batches of 4 come in order
input rows() {
  range(16) |> map |i| (broadcast_to(cast(i, f32) / 16.0, [4]), i % 2) |> repeat |> batch(4, drop_remainder: true)
}

model m(features: f32[B, 4], labels: i32[B]) {
  let logits = dense(features, 2)
  summary_scalar("mean_feature", reduce_mean(features))
  summary_image("inputs", reshape(features, [B, 2, 2, 1]), max_outputs: 2)
  train { minimize softmax_cross_entropy(labels, logits) with sgd(lr: 0.1) }
}

estimator e {
  model = m
  train_input = rows()
  config { save_summary_steps = 2  iterations_per_loop = 1  random_seed = 2 }
}
"#;

fn targets() -> Vec<Target> {
    let mut t = vec![Target::Interp, Target::Wafer];
    if cfg!(feature = "llvm") {
        t.push(Target::Host);
    }
    t
}

#[test]
fn declared_summaries_are_written_every_save_summary_steps() {
    for target in targets() {
        let dir = common::scratch("summaries", &format!("{target:?}"));
        let p = Program::from_source("s.est", SRC, None);
        let opts = RunOptions {
            target,
            model_dir: Some(dir.clone()),
            ..Default::default()
        };
        let mut e =
            Estimator::new(&p, &opts).unwrap_or_else(|f| panic!("{target:?}: {:?}", f.diags));
        e.train(Steps::Max(4)).unwrap();
        let file = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|d| d.path())
            .find(|p| p.to_string_lossy().contains("tfevents"))
            .unwrap();
        let scalars = summary::read_scalars(&file).unwrap();
        let means: Vec<(i64, f32)> = scalars
            .iter()
            .filter(|s| s.1 == "mean_feature")
            .map(|s| (s.0, s.2))
            .collect();
        // step s runs batch s - 1 (rows 4(s-1) .. 4s - 1), whose mean is (4s - 2.5) / 16
        let want: Vec<(i64, f32)> = [2i64, 4]
            .iter()
            .map(|&s| (s, (4.0 * s as f32 - 2.5) / 16.0))
            .collect();
        assert_eq!(means.len(), 2, "{target:?}: {scalars:?}");
        for ((s, v), (ws, wv)) in means.iter().zip(&want) {
            assert_eq!(s, ws, "{target:?}");
            assert!(
                (v - wv).abs() < 1e-6,
                "{target:?}: step {s}: {v} against {wv}"
            );
        }
        let images = summary::read_images(&file).unwrap();
        let tags: Vec<(i64, &str)> = images.iter().map(|i| (i.0, i.1.as_str())).collect();
        assert_eq!(
            tags,
            [
                (2, "inputs/image/0"),
                (2, "inputs/image/1"),
                (4, "inputs/image/0"),
                (4, "inputs/image/1")
            ],
            "{target:?}"
        );
        for (step, tag, im) in &images {
            assert_eq!((im.height, im.width, im.channels), (2, 2, 1));
            let dec = png::Decoder::new(std::io::Cursor::new(im.png.clone()));
            let mut r = dec.read_info().unwrap();
            let mut buf = vec![0; r.output_buffer_size().unwrap()];
            let info = r.next_frame(&mut buf).unwrap();
            let k: i64 = tag.rsplit('/').next().unwrap().parse().unwrap();
            let row = 4 * (step - 1) + k;
            let want = (row as f64 / 16.0 * 255.0).round() as u8;
            assert_eq!(
                &buf[..info.buffer_size()],
                &[want; 4],
                "{target:?}: {tag} at {step}"
            );
        }
    }
}
