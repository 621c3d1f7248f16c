//! The wafer target: a Cerebras-like wafer-scale engine, simulated. A train step is
//! laid out on a 2-D mesh of processing elements (PEs), each kernel on a rectangle of
//! its own, and runs as a dataflow program of per-PE tasks.
//!
//! - `fabric`: the machine model (named configs and TOML), with its fingerprint;
//! - `isa`: the PE instruction set (tasks, vector operations over descriptors, memory
//!   maps); `text` prints it;
//! - `cost`: the cycle formulas every other part uses;
//! - `sim`: the cycle-level simulator, running PE programs on real data through routers
//!   and links;
//! - `form`, `pipeline`, `kernels`, `lower`, `place`: a graph formed into kernels, the
//!   schedule of a train step's samples through them (one forward, one backward), each
//!   kernel's PE programs, and their layout on the fabric;
//! - `device`, `artifact`, `report`: running a layout, saving it, measuring it;
//! - `diagnose`: why a graph has no layout, as diagnostics that say what would fit.

pub mod artifact;
pub mod cost;
pub mod device;
pub mod diagnose;
pub mod fabric;
pub mod form;
pub mod isa;
pub mod kernels;
pub mod lower;
pub mod pipeline;
pub mod place;
pub mod report;
pub mod sim;
pub mod text;

/// Graphs of small programs for the tests of the wafer's parts.
#[cfg(test)]
pub mod testing {
    use crate::ir::Graph;
    use crate::syntax::ast::SectionKind;

    /// The checked graph of `mode` of the one estimator of `src`, for the wafer.
    pub fn graph(src: &str, mode: SectionKind) -> Graph {
        let p = crate::Program::from_source("t.est", src, None);
        let opts = crate::CheckOptions {
            target: crate::elab::Target::Wafer,
            modes: vec![mode],
            ..Default::default()
        };
        let c = crate::check(&p, &opts);
        assert!(!c.has_errors(), "{:?}", c.diags);
        c.graphs[0].graph.as_ref().clone()
    }

    /// A classifier of `k` features through a ReLU layer of `n` to `c` classes, trained
    /// with momentum on batches of `batch` made up from a counter.
    pub fn mlp(k: usize, n: usize, c: usize, batch: usize) -> String {
        format!(
            r#"
use std.nn.dense
use std.losses.softmax_cross_entropy
model m(features: f32[B, {k}], labels: i32[B]) {{
  let h = dense(features, {n}, activation: relu)
  let logits = dense(h, {c})
  let loss = softmax_cross_entropy(labels, logits)
  train {{ minimize loss with momentum(lr: 0.1, momentum: 0.9) }}
}}
input data() {{ range(64) |> map |i| (broadcast_to(cast(i, f32), [{k}]), i % {c}) |> repeat |> batch({batch}, drop_remainder: true) }}
estimator e {{ model = m  train_input = data() }}
"#
        )
    }
}
