//! Embedding est in a Rust program: load a program, override a param, choose the
//! target, register a hook and a custom reducer, then train, evaluate and predict.
//!
//! Run it with `cargo run --release --example embed` (from the repository root).

use est::runtime::{Action, Estimator, Reducer, RunHook, RunOptions, StepInfo, Steps};
use est::tensor::Tensor;
use est::{elab::Target, Program};
use std::sync::Arc;

/// A hook: prints the loss every 250 steps and stops once the loss is tiny.
struct Watch;

impl RunHook for Watch {
    fn after_step(&mut self, i: &StepInfo) -> Action {
        if i.global_step % 250 == 0 {
            println!(
                "step {:>5}  loss {:.5}  {:.0} steps/s",
                i.global_step, i.loss, i.steps_per_sec
            );
        }
        if i.loss < 1e-6 {
            Action::Stop
        } else {
            Action::Continue
        }
    }
}

/// A custom metric: the mean of the largest softmax probability (the model's
/// confidence). It accumulates per batch and merges across shards.
#[derive(Default)]
struct Confidence {
    sum: f64,
    n: f64,
}

impl Reducer for Confidence {
    fn accumulate(&mut self, args: &[&Tensor]) {
        for v in args[0].to_f64() {
            self.sum += v;
            self.n += 1.0;
        }
    }
    fn merge(&mut self, other: &dyn Reducer) {
        if let Some(o) = other.as_any().downcast_ref::<Confidence>() {
            self.sum += o.sum;
            self.n += o.n;
        }
    }
    fn result(&self) -> f64 {
        self.sum / self.n.max(1.0)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The digits MLP of examples/digits_mlp.est, with a custom metric in its eval section.
const PROGRAM: &str = r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
use std.metrics.{accuracy, reducer}

params { batch_size: int = 32  learning_rate: float = 0.1  hidden: int = 128 }

input digits(split: string, batch_size: int, training: bool) {
  let rows = csv("data/digits_{split}.csv", columns: { pixels: f32[64], label: i32 })
    |> map |r| (r.pixels / 16.0, r.label)
  let rows = if training { rows |> shuffle(2_000) |> repeat } else { rows }
  rows |> batch(batch_size, drop_remainder: true)
}

model mlp(features: f32[B, 64], labels: i32[B]) {
  let logits = dense(dense(features, params.hidden, activation: relu), 10)
  let loss = softmax_cross_entropy(labels, logits)
  train   { minimize loss with momentum(lr: params.learning_rate, momentum: 0.9) }
  eval    {
    metric accuracy = accuracy(labels, argmax(logits, 1))
    metric confidence = reducer("confidence", reduce_max(softmax(logits), axis: 1))
  }
  predict { classes = argmax(logits, 1) }
}

estimator digits {
  model = mlp
  train_input = digits("train", params.batch_size, training: true)
  eval_input = digits("test", 40, training: false)
  train_steps = 1000
  config { random_seed = 11  save_checkpoint_steps = 500 }
}
"#;

fn main() {
    let mut program = Program::from_source("embedded.est", PROGRAM, None);
    program.add_override("hidden", "96", "embed.rs");
    let dir = std::env::temp_dir().join(format!("est-embed-{}", std::process::id()));
    let options = RunOptions {
        target: Target::Interp,
        model_dir: Some(dir.clone()),
        data_dir: Some(concat!(env!("CARGO_MANIFEST_DIR"), "/examples").into()),
        ..Default::default()
    };
    let mut est = match Estimator::new(&program, &options) {
        Ok(e) => e,
        Err(failure) => {
            // Diagnostics render against the program's sources, as estc shows them.
            let style = est::diag::render::Style {
                color: false,
                width: 100,
            };
            eprint!(
                "{}",
                est::diag::render::render_all(&failure.diags, &program.sources, style)
            );
            std::process::exit(1);
        }
    };
    est.add_hook(Box::new(Watch))
        .expect("hooks run on the interpreter");
    est.register_reducer(
        "confidence",
        Arc::new(|| Box::new(Confidence::default()) as Box<dyn Reducer>),
    );

    let run = |r: Result<(), est::runtime::RunFailure>| {
        if let Err(f) = r {
            for d in &f.diags {
                eprintln!("{}: {}", d.code.id(), d.message);
            }
            std::process::exit(1);
        }
    };
    run(est.train(Steps::Default).map(|r| {
        println!(
            "trained to step {} (loss {:.5})",
            r.global_step, r.final_loss
        )
    }));
    run(est.evaluate(None).map(|e| {
        for (name, value) in &e.metrics {
            println!("{name} = {value:.4}");
        }
    }));
    run(est
        .predict(&dir.join("predictions"), Some(1))
        .map(|p| println!("{} predictions in {}", p.examples, dir.display())));
    let _ = std::fs::remove_dir_all(&dir);
}
