//! Dead-node elimination: removes every node that no root (output or variable) depends
//! on.

use super::PassCtx;
use crate::diag::Diags;
use crate::ir::Graph;
use petgraph::visit::NodeIndexable;
use petgraph::Direction;

pub fn run(g: &mut Graph, _ctx: &PassCtx, _diags: &mut Diags) {
    let mut live = vec![false; g.g.node_bound()];
    let mut stack = g.roots();
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut live[n.index()], true) {
            continue;
        }
        stack.extend(g.g.neighbors_directed(n, Direction::Incoming));
    }
    let dead: Vec<_> = g.g.node_indices().filter(|n| !live[n.index()]).collect();
    g.remove_nodes(&dead);
}
