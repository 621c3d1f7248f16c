//! Where the rest of a step lives: the variables each kernel holds, the step nodes (the
//! optimiser) each kernel runs after the samples, the values the host computes between
//! the backward pass and the updates (`mixed`: what mixes kernels), the variables the
//! host updates, and the host's scalars each kernel reads.

use super::{
    joined, joined_columns, read_only_by, unsupported, view_of, Class, Cx, Kernel, Unsupported,
};
use crate::ir::{NodeIndex, Op, Role};
use std::collections::BTreeSet;

/// Variables read per sample belong to the kernel that reads them (each kernel that
/// reads one holds a replica: a bias shared across time steps).
fn variables(cx: &Cx, kernels: &mut [Kernel], owner: &mut [Option<usize>]) {
    let (g, class, order) = (cx.g, &cx.class, &cx.order);
    let is_var = |n: NodeIndex| cx.is_var(n);
    for &n in order {
        if let (Some(k), Class::Sample) = (owner[n.index()], class[n.index()]) {
            // (the variable of a view it reads, `view_of`, or of a cast to half
            // precision, which the kernel computes from its copy)
            let ops = g.operands(n).into_iter();
            let var = |o: NodeIndex| view_of(g, o).map(|v| v.0).or_else(|| cx.weight(o));
            for o in ops.map(|o| var(o).unwrap_or(o)) {
                let elsewhere = owner[o.index()].is_some_and(|k2| k2 != k)
                    && matches!(g.node(n).op, Op::MatMul | Op::Transpose { .. });
                if is_var(o) && !kernels[k].vars.contains(&o) && !elsewhere {
                    owner[o.index()].get_or_insert(k);
                    kernels[k].vars.push(o);
                }
            }
        }
    }
}

/// The variables whose new value is made with more than elementwise ops over their
/// blocks (a GRU's bias, its gradient put together from each gate's): the host updates
/// them, as it updates a variable several kernels hold. A variable of a joined weight
/// reads its columns of the layer's weight gradient (`joined_share`), which are its
/// PEs' blocks of it: its layer updates it.
fn updated_by_host(cx: &Cx) -> BTreeSet<NodeIndex> {
    let (g, class) = (cx.g, &cx.class);
    let joins: Vec<NodeIndex> = (cx.order.iter().copied())
        .filter(|&n| joined(g, n).is_some())
        .collect();
    let mut by_host: BTreeSet<NodeIndex> = BTreeSet::new();
    for (name, node) in g.outputs_with(Role::Update) {
        let Some(v) = g.variable(&name) else { continue };
        let mut stack = vec![node];
        let mut seen = BTreeSet::new();
        while let Some(n) = stack.pop() {
            let n = cx.resolve(n);
            if class[n.index()] != Class::Step || cx.is_var(n) || !seen.insert(n) {
                continue;
            }
            if joined_share(cx, &joins, n) {
                continue;
            }
            if !crate::backend::wafer::lower::elementwise(&g.node(n).op) {
                by_host.insert(v);
                break;
            }
            stack.extend(g.operands(n));
        }
    }
    by_host
}

/// Whether step node `n` is one variable's share of a joined weight's gradient: a
/// slice along the columns of a weight gradient shaped as one of `joins` (the joined
/// weights), at one of its variables' columns.
pub(super) fn joined_share(cx: &Cx, joins: &[NodeIndex], n: NodeIndex) -> bool {
    let g = cx.g;
    let Op::Slice {
        axis: 1,
        start,
        end,
    } = g.node(n).op
    else {
        return false;
    };
    let d = cx.resolve(g.operands(n)[0]);
    let at = |p: &[(NodeIndex, std::ops::Range<usize>)]| p.iter().any(|(_, c)| *c == (start..end));
    cx.class[d.index()] == Class::Batch
        && (joins.iter()).any(|&w| {
            g.ty(w).shape == g.ty(d).shape && joined_columns(g, w).is_some_and(|p| at(&p))
        })
}

/// What a kernel would compute only for the host's `mixed` values, the host computes
/// itself from the gradients (a layer's sum of squares for a global norm).
fn only_for_host(
    cx: &Cx,
    kernels: &mut [Kernel],
    owner: &mut [Option<usize>],
    mixed: &mut BTreeSet<NodeIndex>,
) {
    if mixed.is_empty() {
        return;
    }
    for &n in cx.order.iter().rev() {
        let Some(k) = owner[n.index()] else { continue };
        if cx.class[n.index()] != Class::Step || cx.is_var(n) {
            continue;
        }
        if read_only_by(cx.g, n, |u| mixed.contains(&u)) {
            owner[n.index()] = None;
            kernels[k].steps.retain(|&m| m != n);
            mixed.insert(n);
        }
    }
}

/// Gives each step node (and the optimiser's slots) to the kernel whose values it
/// reads, or to the host when it mixes kernels, and each variable's new value to the
/// kernel that holds it (the host's for a variable several kernels hold). Returns the
/// host's mixed values and its commits.
#[allow(clippy::type_complexity)]
pub(super) fn steps(
    cx: &Cx,
    kernels: &mut [Kernel],
    owner: &mut [Option<usize>],
) -> Result<(BTreeSet<NodeIndex>, Vec<(String, NodeIndex)>), Unsupported> {
    variables(cx, kernels, owner);
    let (g, class, order, bound) = (cx.g, &cx.class, &cx.order, cx.bound);
    let is_var = |n: NodeIndex| cx.is_var(n);
    let resolve = |n: NodeIndex| cx.resolve(n);
    // the variables several kernels hold: their updates are the host's
    let mut holders: Vec<usize> = vec![0; bound];
    for kr in kernels.iter() {
        for v in &kr.vars {
            holders[v.index()] += 1;
        }
    }
    let by_host = updated_by_host(cx);
    let shared = |v: NodeIndex| holders[v.index()] > 1 || by_host.contains(&v);
    // a view of a variable read per sample (`view_of`): its kernels read it in place;
    // and variables joined as a layer's weight (`joined`), which its layer holds
    let view = |n: NodeIndex| {
        joined(g, n).is_some()
            || view_of(g, n).is_some()
                && g.g
                    .neighbors_directed(n, petgraph::Direction::Outgoing)
                    .all(|u| class[u.index()] == Class::Sample || view_of(g, u).is_some())
    };
    // step nodes (and the optimiser's slots) belong to the kernel whose values they
    // read; repeat until the slots, read only by step nodes, have found theirs
    let claim = |n: NodeIndex, k: usize, owner: &mut [Option<usize>], kernels: &mut [Kernel]| {
        owner[n.index()] = Some(k);
        kernels[k].steps.push(n);
        for o in g.operands(n) {
            if is_var(o) && owner[o.index()].is_none() {
                owner[o.index()] = Some(k);
                kernels[k].vars.push(o);
            }
        }
    };
    // a step node that reads the values of several kernels (a global norm) is the
    // host's, and so is one that reads such a node and no kernel's
    let mut mixed: BTreeSet<NodeIndex> = BTreeSet::new();
    loop {
        let mut changed = false;
        for &n in order {
            if class[n.index()] != Class::Step
                || is_var(n)
                || view(n)
                || owner[n.index()].is_some()
                || mixed.contains(&n)
            {
                continue;
            }
            // a variable cast to half precision belongs to the kernel holding the
            // variable, which computes it from its copy (one the host may update)
            if let Some(k) = cx.weight(n).and_then(|v| owner[v.index()]) {
                claim(n, k, owner, kernels);
                changed = true;
                continue;
            }
            let ops = g.operands(n);
            let owners: BTreeSet<usize> = ops
                .iter()
                .filter_map(|o| owner[resolve(*o).index()])
                .collect();
            let reads_mixed = ops.iter().any(|o| mixed.contains(&resolve(*o)));
            // (or a tensor of such: a sum of a shared weight's gradients, in steps)
            let reads_shared = ops.iter().any(|&o| {
                (is_var(o) && shared(o)) || (mixed.contains(&resolve(o)) && g.ty(o).rank() > 0)
            });
            // and a scalar computed from scalars (a running sum of the layers' sums of
            // squares, whichever layer comes last, or of two parts' of one layer): the
            // host's, as it ties no groups together
            if owners.len() > 1
                || (owners.is_empty() && reads_mixed)
                || reads_shared
                || cx.scalar_of_scalars(n)
            {
                mixed.insert(n);
                changed = true;
                continue;
            }
            if let Some(&k) = owners.first() {
                claim(n, k, owner, kernels);
                changed = true;
            }
        }
        // and a step node that reads only slots and constants belongs to its users'
        // (the host's, when they are all the host's: a shared weight's slots)
        for &n in order.iter().rev() {
            if class[n.index()] != Class::Step
                || is_var(n)
                || view(n)
                || owner[n.index()].is_some()
                || mixed.contains(&n)
            {
                continue;
            }
            if read_only_by(g, n, |u| mixed.contains(&u)) {
                mixed.insert(n);
                changed = true;
                continue;
            }
            let users: BTreeSet<usize> =
                g.g.neighbors_directed(n, petgraph::Direction::Outgoing)
                    .filter_map(|u| owner[u.index()])
                    .collect();
            if let (1, Some(&k)) = (users.len(), users.first()) {
                claim(n, k, owner, kernels);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    only_for_host(cx, kernels, owner, &mut mixed);
    for k in kernels.iter_mut() {
        k.steps.sort_by_key(|&n| n.index());
    }
    // the variables' new values (the host's for a shared variable and its slots)
    let mut host_commits = Vec::new();
    for (name, node) in g.outputs_with(Role::Update) {
        let var = g.variable(&name);
        if mixed.contains(&node) || var.is_some_and(|v| shared(v) && node != v) {
            // the host computes it (and what it reads that no kernel holds)
            mixed.insert(node);
            host_commits.push((name, node));
            continue;
        }
        let k = var.and_then(|v| owner[v.index()]);
        let Some(k) = k else {
            return Err(unsupported(
                g,
                node,
                format!("the variable `{name}` is updated but no kernel holds it"),
                "the wafer updates a variable on the PEs that read it",
            ));
        };
        if owner[node.index()] != Some(k) && !(is_var(node) && node == var.unwrap_or(node)) {
            return Err(unsupported(
                g,
                node,
                format!("the update of `{name}` is made away from the kernel that holds it"),
                "update each variable from its own layer's values",
            ));
        }
        kernels[k].commits.push((name, node));
    }
    Ok((mixed, host_commits))
}

/// The host's values each kernel reads (`Kernel::hosts`), and what the host computes
/// each step (in order) and between the backward pass and the updates (the mixed
/// values a kernel or a commit reads).
#[allow(clippy::type_complexity)]
pub(super) fn host_values(
    cx: &Cx,
    kernels: &mut [Kernel],
    owner: &[Option<usize>],
    mixed: BTreeSet<NodeIndex>,
    host_commits: &[(String, NodeIndex)],
) -> Result<(Vec<NodeIndex>, Vec<NodeIndex>), Unsupported> {
    let (g, class, order) = (cx.g, &cx.class, &cx.order);
    // the host's values the kernels read
    let mut host = BTreeSet::new();
    for (k, kr) in kernels.iter_mut().enumerate() {
        let mut mine = BTreeSet::new();
        for &n in order {
            if owner[n.index()] != Some(k) {
                continue;
            }
            for o in g.operands(n) {
                let computed =
                    class[o.index()] == Class::Host && !matches!(g.node(o).op, Op::Const { .. });
                if computed || mixed.contains(&o) {
                    if g.ty(o).elements() != 1 {
                        return Err(unsupported(g, o, format!("a computed tensor (`{}` of {}) the host would send each step has no wafer kernel", g.node(o).op.name(), g.ty(o)), "the host sends scalars (a learning rate, a global norm's clipping factor) each step; compute tensors from the samples or the variables"));
                    }
                    mine.insert(o);
                }
            }
        }
        kr.hosts = mine.iter().copied().collect();
        // (a mixed value made from the variables alone, as a dynamic loss scale's seed
        // of the backward pass: the host computes it before the step, for the
        // samples may read it)
        host.extend(
            mine.into_iter()
                .filter(|&o| !mixed.contains(&o) || !reads_batch(cx, o)),
        );
    }
    // the mixed values the kernels read, which the host computes after the gradients
    let mixed: Vec<NodeIndex> = (mixed.into_iter())
        .filter(|m| !host.contains(m))
        .filter(|m| {
            kernels.iter().any(|k| k.hosts.contains(m)) || host_commits.iter().any(|(_, c)| c == m)
        })
        .collect();
    for o in &g.outputs {
        if class[o.node.index()] == Class::Host {
            host.insert(o.node);
        }
    }
    let host = g.schedule(&host.into_iter().collect::<Vec<_>>(), |_| false);
    Ok((host, mixed))
}

/// Whether `n` reads a sum over the batch (a gradient), directly or through the values
/// it is made of.
fn reads_batch(cx: &Cx, n: NodeIndex) -> bool {
    let mut stack = vec![n];
    let mut seen = BTreeSet::new();
    while let Some(m) = stack.pop() {
        let m = cx.resolve(m);
        if !seen.insert(m) {
            continue;
        }
        if cx.class[m.index()] == Class::Batch {
            return true;
        }
        stack.extend(cx.g.operands(m));
    }
    false
}
