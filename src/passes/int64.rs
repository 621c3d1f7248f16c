//! The int64 rule: no value of the graph may be i64 except the global step (as on the
//! TPU and the wafer). Elaboration rejects `i64` where it is written; this pass catches
//! any i64 that reached the graph another way.

use super::PassCtx;
use crate::diag::{Code, Diag, Diags};
use crate::ir::{DType, Graph, Op};

pub fn run(g: &mut Graph, _ctx: &PassCtx, diags: &mut Diags) {
    for n in g.g.node_indices() {
        let node = g.node(n);
        if node.ty.dtype != DType::I64 || matches!(node.op, Op::GlobalStep) {
            continue;
        }
        diags.push(
            Diag::new(
                Code::Int64,
                node.span,
                format!("this {} makes an i64 tensor", node.op.name()),
            )
            .label(format!("{}", node.ty))
            .help("only the global step may be i64; cast to i32 (or to f32 for the global step)"),
        );
    }
}
