//! Common subexpression elimination: two pure nodes with the same op, operands and type
//! compute the same value; uses of the later one move to the earlier, which is removed.
//! Sources and random ops are never merged.

use super::PassCtx;
use crate::diag::Diags;
use crate::ir::{Graph, NodeIndex};
use rustc_hash::{FxHashMap, FxHasher};
use std::hash::{Hash, Hasher};

pub fn run(g: &mut Graph, _ctx: &PassCtx, _diags: &mut Diags) {
    // Buckets of candidate nodes by the hash of (op, operands, type); equal keys are
    // confirmed by comparison, so the map never clones an op or a type.
    let mut seen: FxHashMap<u64, Vec<NodeIndex>> = FxHashMap::default();
    let mut merged = Vec::new();
    for n in g.topo_order() {
        if g.node(n).op.is_stateful() {
            continue;
        }
        let operands = g.operands(n);
        let mut h = FxHasher::default();
        g.node(n).op.hash(&mut h);
        operands.hash(&mut h);
        g.ty(n).hash(&mut h);
        let bucket = seen.entry(h.finish()).or_default();
        let same = bucket.iter().copied().find(|&c| {
            let (a, b) = (g.node(c), g.node(n));
            a.op == b.op && a.ty == b.ty && g.operands(c) == operands
        });
        match same {
            Some(canon) => {
                g.move_users(n, canon);
                merged.push((n, canon));
            }
            None => bucket.push(n),
        }
    }
    // Outputs move once at the end (a scan per merge would be quadratic).
    let canon: FxHashMap<NodeIndex, NodeIndex> = merged.iter().copied().collect();
    for o in &mut g.outputs {
        if let Some(&c) = canon.get(&o.node) {
            o.node = c;
        }
    }
    let dead: Vec<NodeIndex> = merged.into_iter().map(|(n, _)| n).collect();
    g.remove_nodes(&dead);
}
