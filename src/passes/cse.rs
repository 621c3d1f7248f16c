//! Common subexpression elimination: two pure nodes with the same op, operands and type
//! compute the same value; uses of the later one move to the earlier, which is removed.
//! Sources and random ops are never merged.

use super::PassCtx;
use crate::diag::Diags;
use crate::ir::{Graph, NodeIndex, Op, TensorType};
use rustc_hash::FxHashMap;

pub fn run(g: &mut Graph, _ctx: &PassCtx, _diags: &mut Diags) {
    let mut seen: FxHashMap<(Op, Vec<NodeIndex>, TensorType), NodeIndex> = FxHashMap::default();
    for n in g.topo_order() {
        if g.node(n).op.is_stateful() {
            continue;
        }
        let key = (g.node(n).op.clone(), g.operands(n), g.ty(n).clone());
        match seen.get(&key) {
            Some(&canon) => {
                g.replace_uses(n, canon);
                g.g.remove_node(n);
            }
            None => {
                seen.insert(key, n);
            }
        }
    }
}
