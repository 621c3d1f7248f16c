//! Shape and dtype inference over the whole graph, in topological order: every node's
//! type is recomputed from its operands. Elaboration already inferred each node as it
//! was made, so on a fresh graph this finds nothing; after rewrites it re-establishes
//! the types, and an op whose operands no longer fit is reported at its span.

use super::PassCtx;
use crate::diag::{Diag, Diags};
use crate::ir::{infer, Graph};

pub fn run(g: &mut Graph, _ctx: &PassCtx, diags: &mut Diags) {
    for n in g.topo_order() {
        let ops = g.operands(n);
        let tys: Vec<_> = ops.iter().map(|&o| g.ty(o)).collect();
        let node = g.node(n);
        match infer(&node.op, &tys, &node.ty) {
            Ok(t) => g.g[n].ty = t,
            Err(e) => {
                let mut d = Diag::new(e.code, node.span, e.message)
                    .label(format!("in this {}", node.op.name()));
                if let Some(h) = e.help {
                    d = d.help(h);
                }
                diags.push(d);
            }
        }
    }
}
