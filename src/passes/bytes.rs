//! Byte strings belong to input pipelines (`parse`, `decode_raw` in a `map`), never to
//! a model: no op of a model computes with them, and a backend has no layout for them.
//! A `bytes` tensor in a model graph (a `cast(x, bytes)`, say) would run as zeros.

use super::PassCtx;
use crate::diag::{Code, Diag, Diags};
use crate::ir::{DType, Graph};

pub fn run(g: &mut Graph, _ctx: &PassCtx, diags: &mut Diags) {
    for n in g.g.node_indices() {
        let node = g.node(n);
        if node.ty.dtype != DType::Bytes {
            continue;
        }
        diags.push(
            Diag::new(
                Code::BytesInModel,
                node.span,
                format!("this {} makes a bytes tensor in a model", node.op.name()),
            )
            .label(format!("{}", node.ty))
            .help("bytes are for input pipelines: decode them in the input's `map` (`decode_raw`, `parse`) and give the model numbers"),
        );
    }
}
