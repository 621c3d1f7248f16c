//! The passes over an IR graph, in order. Each lives in its own file; `PIPELINE` lists
//! them, and `run` applies them with the verifier between every two in tests and debug
//! builds. Checks come first, so diagnostics never depend on the optimisations.

pub mod autodiff;
mod check_labels;
mod const_fold;
mod cse;
mod dce;
mod dtypes;
mod fuse_products;
mod mask_padding;
pub mod memory;
mod shape_infer;
mod target_ops;
mod verify;

pub use target_ops::{supported, WAFER_OPS};
pub use verify::verify;

use crate::diag::Diags;
use crate::elab::Target;
use crate::ir::Graph;

/// What passes may need to know besides the graph.
#[derive(Debug, Clone, Copy)]
pub struct PassCtx {
    pub target: Target,
}

pub struct Pass {
    pub name: &'static str,
    pub run: fn(&mut Graph, &PassCtx, &mut Diags),
}

/// The passes, in the order they run.
pub const PIPELINE: &[Pass] = &[
    // Re-derives every node's type from its operands (the elaborator's types must agree).
    Pass {
        name: "shape_infer",
        run: shape_infer::run,
    },
    // i64 anywhere but the global step; bytes anywhere (they belong to input pipelines).
    Pass {
        name: "dtypes",
        run: dtypes::run,
    },
    // Class labels of a loss's one_hot and of accuracy checked at run time.
    Pass {
        name: "check_labels",
        run: check_labels::run,
    },
    // Eval and predict graphs whose last batch may be partial: reductions across the
    // examples skip the padding rows; outputs that padding would change are W0513.
    Pass {
        name: "mask_padding",
        run: mask_padding::run,
    },
    // The wafer's: dense layers of one value become one layer of their variables
    // side by side, its outputs sliced apart.
    Pass {
        name: "fuse_products",
        run: fuse_products::run,
    },
    // The train step: gradients of the loss, the optimiser's updates, the step increment.
    Pass {
        name: "autodiff",
        run: autodiff::run,
    },
    // Ops the target cannot run.
    Pass {
        name: "target_ops",
        run: target_ops::run,
    },
    // Elementwise ops on constants become constants.
    Pass {
        name: "const_fold",
        run: const_fold::run,
    },
    // Identical pure nodes become one.
    Pass {
        name: "cse",
        run: cse::run,
    },
    // Nodes nothing reads are removed.
    Pass {
        name: "dce",
        run: dce::run,
    },
];

/// `g` without its train summaries (`Role::Summary` outputs) and the nodes only they
/// read: for a backend that computes the summaries apart (the wafer).
pub fn without_summaries(g: &Graph) -> std::borrow::Cow<'_, Graph> {
    if g.outputs.iter().all(|o| o.role != crate::ir::Role::Summary) {
        return std::borrow::Cow::Borrowed(g);
    }
    let mut g = g.clone();
    g.outputs.retain(|o| o.role != crate::ir::Role::Summary);
    let ctx = PassCtx {
        target: crate::elab::Target::Wafer,
    };
    dce::run(&mut g, &ctx, &mut Diags::default());
    std::borrow::Cow::Owned(g)
}

/// A pass broke an invariant of the IR: a compiler bug, reported with the pass's name.
#[derive(Debug, Clone, PartialEq)]
pub struct PassBug {
    pub pass: &'static str,
    pub message: String,
}

/// Runs the whole pipeline. With `check`, the verifier runs before the first pass and
/// after each one; a failure names the pass that broke the graph.
pub fn run(g: &mut Graph, ctx: &PassCtx, diags: &mut Diags, check: bool) -> Result<(), PassBug> {
    if check {
        verify(g).map_err(|message| PassBug {
            pass: "elaborate",
            message,
        })?;
    }
    let timing = std::env::var_os("EST_TIME_PASSES").is_some();
    for pass in PIPELINE {
        let t = std::time::Instant::now();
        (pass.run)(g, ctx, diags);
        if timing {
            crate::diag::log(&format!(
                "pass {:<12} {:>9.3} ms  {} nodes",
                pass.name,
                t.elapsed().as_secs_f64() * 1e3,
                g.node_count()
            ));
        }
        if check {
            verify(g).map_err(|message| PassBug {
                pass: pass.name,
                message,
            })?;
        }
    }
    Ok(())
}
