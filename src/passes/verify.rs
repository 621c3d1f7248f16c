//! The IR verifier: the invariants every pass must keep. A failure is a compiler bug.

use crate::ir::{arity, infer, Graph, Op};
use petgraph::visit::{EdgeRef, IntoEdgeReferences};
use petgraph::Direction;

/// Checks that operand indices are 0..n without gaps, that each op has its arity, that
/// each node's type is what inference gives, that outputs name live nodes, and that the
/// graph has no cycle.
pub fn verify(g: &Graph) -> Result<(), String> {
    let order = g.topo_order();
    if order.len() != g.node_count() {
        return Err(format!(
            "the graph has a cycle ({} of {} nodes ordered)",
            order.len(),
            g.node_count()
        ));
    }
    for n in g.g.node_indices() {
        let node = g.node(n);
        let mut idx: Vec<u32> =
            g.g.edges_directed(n, Direction::Incoming)
                .map(|e| *e.weight())
                .collect();
        idx.sort_unstable();
        if idx.iter().enumerate().any(|(i, &x)| x as usize != i) {
            return Err(format!(
                "node {} ({}) has operand indices {idx:?}",
                n.index(),
                node.op.name()
            ));
        }
        let want = arity(&node.op);
        if want != usize::MAX && want != idx.len() {
            return Err(format!(
                "node {} ({}) has {} operands, wants {want}",
                n.index(),
                node.op.name(),
                idx.len()
            ));
        }
        if matches!(node.op, Op::Concat { .. }) && idx.is_empty() {
            return Err(format!("node {} (concat) has no operands", n.index()));
        }
        let ops = g.operands(n);
        let tys: Vec<_> = ops.iter().map(|&o| g.ty(o)).collect();
        match infer(&node.op, &tys, &node.ty) {
            Ok(t) if t == node.ty => {}
            Ok(t) => {
                return Err(format!(
                    "node {} ({}) has type {} but its operands give {t}",
                    n.index(),
                    node.op.name(),
                    node.ty
                ))
            }
            Err(e) => {
                return Err(format!(
                    "node {} ({}) is ill-typed: {}",
                    n.index(),
                    node.op.name(),
                    e.message
                ))
            }
        }
    }
    for o in &g.outputs {
        if !g.g.contains_node(o.node) {
            return Err(format!("output `{}` names a removed node", o.name));
        }
    }
    for e in g.g.edge_references() {
        if !g.g.contains_node(e.source()) || !g.g.contains_node(e.target()) {
            return Err("an edge names a removed node".to_string());
        }
    }
    Ok(())
}
