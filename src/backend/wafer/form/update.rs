//! A kernel's step nodes as its PEs' update: the ops over each PE's block of its
//! variables, and the share of a layer's update each of its parts makes.

use super::super::lower::{self, Operand, Update, UpdateOp};
use super::{constant, joined, key, name_of, unsupported, Formed, Kind, Unsupported};
use crate::ir::{Graph, NodeIndex, Op};
use std::collections::BTreeSet;

/// The share of layer `k`'s update that part `p` makes (0: its own product, then each
/// of `more`): its variables (the weight, then the optimiser's slots), its step nodes
/// and its commits. A layer of one part has it all.
#[allow(clippy::type_complexity)]
pub fn part_update(
    g: &Graph,
    f: &Formed,
    k: usize,
    p: usize,
) -> (Vec<NodeIndex>, Vec<NodeIndex>, Vec<(String, NodeIndex)>) {
    let kr = &f.kernels[k];
    let (w, dw, more) = match &kr.kind {
        Kind::Dense { w, dw, more, .. } if !more.is_empty() => (w, dw, more),
        _ => return (kr.vars.clone(), kr.steps.clone(), kr.commits.clone()),
    };
    let (w, dw) = match p {
        0 => (*w, *dw),
        _ => (more[p - 1].w, more[p - 1].dw),
    };
    let name = |v: NodeIndex| match &g.node(v).op {
        Op::Variable { name, .. } => Some(name.clone()),
        _ => None,
    };
    // what the weight and its gradient lead to, then what those commits read
    let reads = |n: NodeIndex| g.operands(n).into_iter().map(|o| f.resolve(o));
    let mut ahead: BTreeSet<NodeIndex> = [w].into_iter().chain(dw).collect();
    while let Some(n) =
        (kr.steps.iter()).find(|&&n| !ahead.contains(&n) && reads(n).any(|o| ahead.contains(&o)))
    {
        ahead.insert(*n);
    }
    let commits: Vec<(String, NodeIndex)> = (kr.commits.iter())
        .filter(|(c, n)| ahead.contains(n) || name(w).as_ref() == Some(c))
        .cloned()
        .collect();
    let mut needed: BTreeSet<NodeIndex> = commits.iter().map(|c| c.1).collect();
    while let Some(n) =
        (kr.steps.iter()).find(|&&n| needed.contains(&n) && reads(n).any(|o| !needed.contains(&o)))
    {
        needed.extend(reads(*n));
    }
    let steps: Vec<NodeIndex> = (kr.steps.iter())
        .copied()
        .filter(|n| needed.contains(n))
        .collect();
    let committed = |v: &NodeIndex| commits.iter().any(|c| name(*v).as_ref() == Some(&c.0));
    let mut vars = vec![w];
    vars.extend(
        (kr.vars.iter())
            .filter(|&&v| v != w && (needed.contains(&v) || committed(&v)))
            .filter(|&&v| !matches!(&kr.kind, Kind::Dense { more, .. } if more.iter().any(|q| q.w == v)))
            .copied(),
    );
    (vars, steps, commits)
}

/// The step nodes among `steps` that `commits` read (through each other), in order.
pub fn feeding(
    g: &Graph,
    f: &Formed,
    steps: &[NodeIndex],
    commits: &[(String, NodeIndex)],
) -> Vec<NodeIndex> {
    let mut needed: BTreeSet<NodeIndex> = commits.iter().map(|c| f.resolve(c.1)).collect();
    for &n in steps.iter().rev() {
        if needed.contains(&n) {
            needed.extend(g.operands(n).into_iter().map(|o| f.resolve(o)));
        }
    }
    steps
        .iter()
        .copied()
        .filter(|n| needed.contains(n))
        .collect()
}

/// Kernel `k`'s step nodes as an update over its blocks: `vars`, `accs` and `hosts` number
/// the operands of those kinds; a value shaped `block` is a whole block, a scalar one
/// word.
pub fn update_of(
    g: &Graph,
    f: &Formed,
    k: usize,
    (vars, accs, hosts): (&[NodeIndex], &[NodeIndex], &[NodeIndex]),
    block: &[usize],
) -> Result<Update, Unsupported> {
    let kr = &f.kernels[k];
    update_over(g, f, (&kr.steps, &kr.commits), (vars, accs, hosts), block)
}

/// `update_of` over the step nodes `steps` and the commits `commits` (a part's).
pub fn update_over(
    g: &Graph,
    f: &Formed,
    (steps, commits): (&[NodeIndex], &[(String, NodeIndex)]),
    (vars, accs, hosts): (&[NodeIndex], &[NodeIndex], &[NodeIndex]),
    block: &[usize],
) -> Result<Update, Unsupported> {
    let mut u = Update::default();
    let mut done: Vec<NodeIndex> = Vec::new();
    let operand = |o: NodeIndex, done: &[NodeIndex]| -> Option<Operand> {
        let o = f.resolve(o);
        if let Some(v) = constant(g, o) {
            return Some(Operand::Imm(v));
        }
        if let Some(i) = vars.iter().position(|&v| v == o) {
            return Some(Operand::Var(i));
        }
        if let Some(i) = accs.iter().position(|&v| v == o) {
            return Some(Operand::Acc(i));
        }
        if let Some(i) = hosts.iter().position(|&v| v == o) {
            return Some(Operand::Host(i));
        }
        done.iter().position(|&v| v == o).map(Operand::Val)
    };
    for &n in steps {
        let node = g.node(n);
        if !lower::elementwise(&node.op) {
            return Err(unsupported(
                g,
                n,
                format!("`{}` in an update has no wafer kernel", node.op.name()),
                "the wafer updates variables with elementwise ops over each PE's block",
            ));
        }
        // (the same words as the block under another shape: a depthwise filter of one
        // tap, `[1, 1, C, 1]`, and its gradient per channel, `[C]`)
        let words = node.ty.rank() > 0 && node.ty.elements() == block.iter().product::<usize>();
        let full = if node.ty.shape.as_slice() == block || words {
            true
        } else if node.ty.rank() == 0 {
            false
        } else {
            return Err(unsupported(
                g,
                n,
                format!(
                    "`{}` of shape {} in the update of a layer whose variables are {:?}",
                    node.op.name(),
                    node.ty,
                    block
                ),
                "the wafer updates variables with elementwise ops over each PE's block",
            ));
        };
        let ops = g.operands(n);
        let mut args = Vec::new();
        for &o in &ops {
            args.push(operand(o, &done).ok_or_else(|| {
                unsupported(
                    g,
                    n,
                    format!(
                        "`{}` reads a value its layer's PEs do not hold",
                        node.op.name()
                    ),
                    "update each layer from its own variables and gradients",
                )
            })?);
        }
        let from = ops.first().map_or(node.ty.dtype, |&o| g.ty(o).dtype);
        u.ops.push(UpdateOp {
            op: node.op.clone(),
            args,
            full,
            types: (from, node.ty.dtype),
        });
        done.push(n);
    }
    for (name, node) in commits {
        let var = vars
            .iter()
            .position(|&v| matches!(&g.node(v).op, Op::Variable { name: m, .. } if m == name));
        let (Some(var), Some(a)) = (var, operand(*node, &done)) else {
            return Err(unsupported(
                g,
                *node,
                format!("the update of `{name}` is made away from the PEs that hold it"),
                "update each layer from its own variables and gradients",
            ));
        };
        u.commits.push((var, a));
    }
    Ok(u)
}

/// One variable's share of the update of a layer whose weight is joined (`joined`): the
/// step nodes and commits of the variable and its slots, the variables they read (the
/// variable first, then its slots in the order the steps first read them), and its
/// share of the layer's weight gradient (its columns, `steps::joined_share`), which the
/// update reads as the layer's accumulator.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    pub vars: Vec<NodeIndex>,
    pub steps: Vec<NodeIndex>,
    pub commits: Vec<(String, NodeIndex)>,
    pub grad: NodeIndex,
}

/// Each variable's share of layer `k`'s update when its weight is joined and it trains
/// (none otherwise). The shares are alike (one optimiser's step of each variable:
/// `passes::fuse_products` fuses only those), so the layer runs the first over its
/// whole blocks, whose variables' columns hold every share's operands.
pub fn joined_shares(g: &Graph, f: &Formed, k: usize) -> Option<Vec<Share>> {
    let kr = &f.kernels[k];
    let Kind::Dense { w, .. } = kr.kind else {
        return None;
    };
    let mut shares = Vec::new();
    for v in joined(g, w)? {
        let own = name_of(g, v);
        let commits: Vec<(String, NodeIndex)> = (kr.commits.iter())
            .filter(|(c, _)| *c == own || c.starts_with(&format!("{own}/")))
            .cloned()
            .collect();
        let (grads, steps): (Vec<NodeIndex>, Vec<NodeIndex>) = feeding(g, f, &kr.steps, &commits)
            .into_iter()
            .partition(|&n| matches!(g.node(n).op, Op::Slice { .. }));
        let mut vars = vec![v];
        for &n in &steps {
            for o in g.operands(n).into_iter().map(|o| f.resolve(o)) {
                if matches!(g.node(o).op, Op::Variable { .. }) && !vars.contains(&o) {
                    vars.push(o);
                }
            }
        }
        shares.push(Share {
            vars,
            steps,
            commits,
            grad: *grads.first()?,
        });
    }
    Some(shares)
}

/// The name under which a joined weight `w`'s layer keeps its `j`th variable of a
/// share (0: the weight, then its slots), each PE its block of them all.
pub fn joined_storage(w: NodeIndex, j: usize) -> String {
    match j {
        0 => key(w),
        _ => format!("{}/{j}", key(w)),
    }
}
