//! The dtype rules of a model graph. No value may be i64 but the global step (as on
//! the TPU and the wafer): elaboration rejects `i64` where it is written, and this pass
//! catches any that reached the graph another way (E0403). No value may be bytes:
//! byte strings belong to input pipelines (`parse`, `decode_raw` in a `map`), no op of
//! a model computes with them, and a backend has no layout for them; a `cast(x,
//! bytes)` would run as zeros (E0408).

use super::PassCtx;
use crate::diag::{Code, Diag, Diags};
use crate::ir::{DType, Graph, Op};

pub fn run(g: &mut Graph, _ctx: &PassCtx, diags: &mut Diags) {
    for n in g.g.node_indices() {
        let node = g.node(n);
        let d = match node.ty.dtype {
            DType::I64 if !matches!(node.op, Op::GlobalStep) => Diag::new(
                Code::Int64,
                node.span,
                format!("this {} makes an i64 tensor", node.op.name()),
            )
            .help("only the global step may be i64; cast to i32 (or to f32 for the global step)"),
            DType::Bytes => Diag::new(
                Code::BytesInModel,
                node.span,
                format!("this {} makes a bytes tensor in a model", node.op.name()),
            )
            .help("bytes are for input pipelines: decode them in the input's `map` (`decode_raw`, `parse`) and give the model numbers"),
            _ => continue,
        };
        diags.push(d.label(format!("{}", node.ty)));
    }
}
