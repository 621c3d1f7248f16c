//! The per-target op table. The host (and the interpreter) run every op; the wafer runs
//! what a layer-pipelined wafer can: matmul, convolution, elementwise ops, reductions,
//! pooling, softmax, embeddings (gather, whose gradient is scatter_add), random numbers,
//! and moving a sample's elements (slice, concat, transpose, reshape, and `pad`, made of
//! concats and slices); their gradients
//! are made of the same ops.

use super::PassCtx;
use crate::diag::{Code, Diag, Diags};
use crate::elab::Target;
use crate::ir::{Graph, Op};

/// The op names the wafer supports.
pub const WAFER_OPS: &[&str] = &[
    "input",
    "variable",
    "const",
    // (computed by the host, as constants are: `form::per_sample_constant`)
    "iota",
    "global_step",
    "neg",
    "not",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "square",
    "tanh",
    "sigmoid",
    "relu",
    "floor",
    "sign",
    "sin",
    "cos",
    "erf",
    "stop_gradient",
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "maximum",
    "minimum",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "and",
    "or",
    "select",
    "cast",
    "reduce_sum",
    "reduce_mean",
    "reduce_max",
    "reduce_min",
    "argmax",
    "argmin",
    "matmul",
    "transpose",
    "reshape",
    "slice",
    "concat",
    "broadcast_to",
    "one_hot",
    "check_indices",
    "gather",
    "scatter_add",
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "softmax",
    "log_softmax",
    "random_uniform",
    "random_normal",
    "conv2d_backprop_input",
    "conv2d_backprop_filter",
    "max_pool2d_grad",
    "avg_pool2d_grad",
    "cross_shard_mean",
];

/// Whether `target` can run `op`.
pub fn supported(op: &Op, target: Target) -> bool {
    match target {
        Target::Host | Target::Interp => true,
        Target::Wafer => WAFER_OPS.contains(&op.name()),
    }
}

pub fn run(g: &mut Graph, ctx: &PassCtx, diags: &mut Diags) {
    for n in g.topo_order() {
        let node = g.node(n);
        if supported(&node.op, ctx.target) {
            continue;
        }
        diags.push(
            Diag::new(Code::UnsupportedOp, node.span, format!("`{}` is not supported on the {} target", node.op.name(), ctx.target.name()))
                .label(format!("makes a {}", node.op.name()))
                .help(format!("the wafer runs: matmul, convolution, elementwise ops, reductions, pooling, softmax, embeddings (`gather` from a variable table), random numbers and moves within a sample (slice, concat, pad, transpose, reshape); express `{}` with those or use `--target host`", node.op.name())),
        );
    }
}
