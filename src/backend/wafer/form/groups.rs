//! The vector kernels: the sample and batch nodes no layer takes, in connected groups
//! (with the nodes on either side of a layer that belong together, and the groups one
//! update reads), a residual's group split in two around its layer, a shortcut beside
//! another layer of its input (ResNet's projection) carrying that input to it, and the
//! kernels in dataflow order.

use super::{Carry, Class, Cx, Kernel, Kind};
use crate::ir::{Graph, NodeIndex, Op, Role};
use std::collections::BTreeSet;

/// Union-find over node indices.
fn find(p: &mut [usize], mut i: usize) -> usize {
    while p[i] != i {
        p[i] = p[p[i]];
        i = p[i];
    }
    i
}

fn union(p: &mut [usize], a: usize, b: usize) {
    let (a, b) = (find(p, a), find(p, b));
    p[a.max(b)] = a.min(b);
}

/// The free nodes (`Cx::free`) that read `n`, through its other names.
fn readers(cx: &Cx, n: NodeIndex, owner: &[Option<usize>]) -> Vec<NodeIndex> {
    let mut out = Vec::new();
    let mut stack = vec![n];
    while let Some(v) = stack.pop() {
        for u in cx.g.g.neighbors_directed(v, petgraph::Direction::Outgoing) {
            if cx.alias[u.index()].is_some() {
                stack.push(u);
            } else if cx.free(u, owner) {
                out.push(u);
            }
        }
    }
    out
}

/// The group (its root's index) of each free node: the nodes connected through values,
/// the nodes on either side of a layer, and the groups one step node reads from.
pub(super) fn groups(cx: &Cx, kernels: &[Kernel], owner: &[Option<usize>]) -> Vec<usize> {
    let (g, class, order, bound) = (cx.g, &cx.class, &cx.order, cx.bound);
    let resolve = |n: NodeIndex| cx.resolve(n);
    let is_var = |n: NodeIndex| cx.is_var(n);
    let free = |n: NodeIndex, owner: &[Option<usize>]| cx.free(n, owner);
    let readers = |n: NodeIndex, owner: &[Option<usize>]| readers(cx, n, owner);
    let mut parent: Vec<usize> = (0..bound).collect();
    for &n in order {
        if !free(n, owner) {
            continue;
        }
        for o in g.operands(n) {
            // through values under other names (a reshape that keeps the words)
            let o = resolve(o);
            if free(o, owner) {
                union(&mut parent, n.index(), o.index());
            }
        }
    }
    // a layer's neighbours in both directions are one: what makes its input with what
    // reads its input gradient, what makes its output gradient with what reads its
    // output (a linear op, such as a mean over a sample's axis, and its gradient share
    // no value, but they sit between the same two layers)
    for kr in kernels {
        let Kind::Dense {
            x, fwd, dy, bwd, ..
        } = kr.kind
        else {
            continue;
        };
        let pairs = [(Some(x), bwd), (dy, Some(fwd))];
        for (made, read) in pairs {
            let (Some(made), Some(read)) = (made.map(resolve), read) else {
                continue;
            };
            if !free(made, owner) {
                continue;
            }
            for u in readers(read, owner) {
                union(&mut parent, made.index(), u.index());
            }
        }
        // what reads a layer's outputs sits after it, in one kernel (the loss and a
        // metric of the logits)
        let after = readers(fwd, owner);
        for w in after.windows(2) {
            union(&mut parent, w[0].index(), w[1].index());
        }
    }
    // and the groups one step node reads from are one (a bias added in one group and
    // its gradient summed in another, when no activation links them, update together):
    // a step node's anchors are the batch nodes and the readers of the variables it
    // reads, through other step nodes; a scalar computed from scalars (a global norm
    // from each layer's sum of squares) ties no groups together (the host computes it
    // when it mixes groups: see `steps::steps`); nor does the update of a variable
    // several kernels hold (a weight of several layers, a bias added at every time
    // step), which the host makes from their gradients
    let mut anchors: Vec<Vec<usize>> = vec![Vec::new(); bound];
    let by_host = shared_updates(g, class, kernels, |n| free(n, owner));
    for &n in order {
        if class[n.index()] != Class::Step
            || is_var(n)
            || by_host.contains(&n)
            || cx.scalar_of_scalars(n)
        {
            continue;
        }
        let mut mine: Vec<usize> = Vec::new();
        for o in g.operands(n) {
            let o = resolve(o);
            if free(o, owner) {
                mine.push(o.index());
            } else if is_var(o) {
                mine.extend(
                    g.g.neighbors_directed(o, petgraph::Direction::Outgoing)
                        .filter(|&u| free(u, owner))
                        .map(|u| u.index()),
                );
            } else {
                mine.extend(anchors[o.index()].iter().copied());
            }
        }
        mine.sort_unstable();
        mine.dedup();
        for w in mine.windows(2) {
            union(&mut parent, w[0], w[1]);
        }
        anchors[n.index()] = mine;
    }
    (0..bound).map(|i| find(&mut parent, i)).collect()
}

/// A residual: a group that makes a layer's input and reads its output (through the sum
/// `h + f(h W)`) is two, the nodes before the layer and those after it; the layer
/// carries its input to the kernel after it, and the skip's gradient back into its input
/// gradient (see `Carry`).
pub(super) fn residuals(
    cx: &Cx,
    kernels: &mut [Kernel],
    owner: &mut [Option<usize>],
    group: &mut [usize],
) {
    let (g, order, bound) = (cx.g, &cx.order, cx.bound);
    let resolve = |n: NodeIndex| cx.resolve(n);
    let free = |n: NodeIndex, owner: &[Option<usize>]| cx.free(n, owner);
    let reach = |from: NodeIndex, dir: petgraph::Direction| {
        let mut seen = vec![false; bound];
        seen[from.index()] = true;
        let mut stack = vec![from];
        while let Some(v) = stack.pop() {
            for u in g.g.neighbors_directed(v, dir) {
                if !seen[u.index()] {
                    seen[u.index()] = true;
                    stack.push(u);
                }
            }
        }
        seen
    };
    for (k, kr) in kernels.iter_mut().enumerate() {
        let Kind::Dense {
            x,
            fwd,
            bwd,
            ref more,
            ..
        } = kr.kind
        else {
            continue;
        };
        let x = resolve(x);
        if !more.is_empty() || !free(x, owner) {
            continue;
        }
        let before = group[x.index()];
        // after: what the output makes (directly, or through the kernels after the
        // layer: a skip of several) but not the input gradient, and what only such
        // nodes read (the labels' share of a loss); before: the rest (what makes the
        // input, what its gradient makes, an activation's mask for its gradient)
        let after = bound + k;
        let to_x = reach(x, petgraph::Direction::Incoming);
        let from_fwd = reach(fwd, petgraph::Direction::Outgoing);
        let from_bwd = bwd.map_or_else(
            || vec![false; bound],
            |m| reach(m, petgraph::Direction::Outgoing),
        );
        for &n in order.iter().rev() {
            let i = n.index();
            if group[i] != before || from_bwd[i] || to_x[i] {
                continue;
            }
            let mut readers = (g.g.neighbors_directed(n, petgraph::Direction::Outgoing))
                .filter(|u| group[u.index()] == before || group[u.index()] == after)
                .peekable();
            let read_after = readers.peek().is_some() && readers.all(|u| group[u.index()] == after);
            if from_fwd[i] || read_after {
                group[i] = after;
            }
        }
        if !order.iter().any(|n| group[n.index()] == after) {
            continue;
        }
        // what crosses the cut: the values before it that nodes after it read (the
        // layer's input, or another value beside it: an LSTM's cell state), and the
        // gradients after it that nodes before it read
        let crossing = |from: usize, to: usize| {
            let mut vs: Vec<NodeIndex> = (order.iter())
                .filter(|u| group[u.index()] == to)
                .flat_map(|&u| g.operands(u))
                .map(resolve)
                .filter(|o| group[o.index()] == from)
                .collect();
            vs.sort();
            vs.dedup();
            vs
        };
        let (values, grads) = (crossing(before, after), crossing(after, before));
        if let [v] = values[..] {
            if v != x {
                // carried as a value passed on (`Formed::passed`), beside the input
                if let (Kind::Dense { carry, .. }, [] | [_]) = (&mut kr.kind, &grads[..]) {
                    *carry = Some(Carry {
                        x: v,
                        grad: grads.first().copied(),
                        first: false,
                    });
                }
                continue;
            }
        }
        // the skip's gradient summed with the layer's input gradient: the layer's
        let sum = bwd.and_then(|m| {
            let mut users = g.g.neighbors_directed(m, petgraph::Direction::Outgoing);
            let (u, None) = (users.next()?, users.next()) else {
                return None;
            };
            let ops = g.operands(u);
            let add = matches!(g.node(u).op, Op::Binary(crate::ir::BinaryOp::Add));
            let skip = *ops.iter().find(|&&o| o != m)?;
            let same = g.ty(skip).shape == g.ty(m).shape && g.ty(u).shape == g.ty(m).shape;
            (add && same && free(u, owner) && group[u.index()] == before && !from_bwd[skip.index()])
                .then_some((u, resolve(skip)))
        });
        if let Kind::Dense { bwd, carry, .. } = &mut kr.kind {
            *carry = Some(Carry {
                x,
                grad: sum.map(|(_, skip)| skip),
                first: false,
            });
            if let Some((u, _)) = sum {
                owner[u.index()] = Some(k);
                *bwd = Some(u);
            }
        }
    }
}

/// Makes each shortcut beside another layer of the same input a layer that carries
/// that input to the other ahead of its own outputs (`Carry::first`): two convolutions
/// (or two dense layers) of one value made on the fabric (ResNet's projection, a 1x1
/// convolution of a block's input beside the block's first convolution; two towers on
/// a hidden value), neither with further parts or a carry,
/// whose input gradients only their sum reads. The shortcut is the later of the two
/// (its outputs go further, past the other's branch, to the sum); it comes just before
/// the other (`in_order`) and owns the sum of their input gradients, the other's coming
/// back to it. Run before the vector kernels take their nodes.
pub(super) fn shortcuts(cx: &Cx, kernels: &mut [Kernel], owner: &mut [Option<usize>]) {
    let g = cx.g;
    let mut pos = vec![usize::MAX; cx.bound];
    for (i, n) in cx.order.iter().enumerate() {
        pos[n.index()] = i;
    }
    type Layer = (usize, (NodeIndex, NodeIndex, Option<NodeIndex>));
    let layers: Vec<Layer> = (kernels.iter().enumerate())
        .filter_map(|(k, kr)| match &kr.kind {
            Kind::Dense {
                x,
                fwd,
                bwd,
                more,
                carry: None,
                ..
            } if more.is_empty()
                && (matches!(g.node(*fwd).op, Op::Conv2d(_))
                    || (matches!(g.node(*fwd).op, Op::MatMul) && g.ty(*x).rank() == 2)) =>
            {
                Some((k, (cx.resolve(*x), *fwd, *bwd)))
            }
            _ => None,
        })
        .collect();
    for &(p, (x, fwd, dp)) in &layers {
        if !cx.free(x, owner) {
            continue;
        }
        // the other layer of `x`, before it
        let same = |fa: &NodeIndex| {
            std::mem::discriminant(&g.node(*fa).op) == std::mem::discriminant(&g.node(fwd).op)
        };
        let others: Vec<&Layer> = (layers.iter())
            .filter(|(a, (xa, fa, _))| {
                *a != p && *xa == x && pos[fa.index()] < pos[fwd.index()] && same(fa)
            })
            .collect();
        let [&(_, (_, _, da))] = others[..] else {
            continue;
        };
        // (training: the sum of the two input gradients, which only it reads)
        let only = |d: NodeIndex| {
            let mut users = g.g.neighbors_directed(d, petgraph::Direction::Outgoing);
            (users.next(), users.next())
        };
        let sum = match (dp, da) {
            (None, None) => None,
            (Some(dp), Some(da)) => {
                let (Some(u), None) = only(dp) else { continue };
                let sum = matches!(g.node(u).op, Op::Binary(crate::ir::BinaryOp::Add))
                    && only(da) == (Some(u), None)
                    && g.ty(u).shape == g.ty(dp).shape
                    && g.ty(u).shape == g.ty(da).shape
                    && cx.free(u, owner);
                if !sum {
                    continue;
                }
                Some((u, da))
            }
            _ => continue,
        };
        if let Kind::Dense { bwd, carry, .. } = &mut kernels[p].kind {
            if let Some((u, _)) = sum {
                owner[u.index()] = Some(p);
                *bwd = Some(u);
            }
            *carry = Some(Carry {
                x,
                grad: sum.map(|(_, da)| cx.resolve(da)),
                first: true,
            });
        }
    }
}

/// Makes a vector kernel of each group (`groups`) of free nodes.
pub(super) fn vectors(
    cx: &Cx,
    kernels: &mut Vec<Kernel>,
    owner: &mut [Option<usize>],
    group: &[usize],
) {
    let (order, free) = (&cx.order, |n: NodeIndex, owner: &[Option<usize>]| {
        cx.free(n, owner)
    });
    let mut group_of: std::collections::BTreeMap<usize, usize> = Default::default();
    for &n in order {
        if !free(n, owner) {
            continue;
        }
        let root = group[n.index()];
        let k = *group_of.entry(root).or_insert_with(|| {
            kernels.push(Kernel {
                kind: Kind::Vector { nodes: Vec::new() },
                vars: Vec::new(),
                steps: Vec::new(),
                commits: Vec::new(),
                hosts: Vec::new(),
            });
            kernels.len() - 1
        });
        owner[n.index()] = Some(k);
        if let Kind::Vector { nodes } = &mut kernels[k].kind {
            nodes.push(n);
        }
    }
}

/// The kernels in dataflow order (of their first node), `owner` renumbered; a value
/// under another name is owned where that value is.
pub(super) fn in_order(cx: &Cx, kernels: Vec<Kernel>, owner: &mut [Option<usize>]) -> Vec<Kernel> {
    let (g, order, alias, bound) = (cx.g, &cx.order, &cx.alias, cx.bound);
    let resolve = |n: NodeIndex| cx.resolve(n);
    let pos: Vec<usize> = {
        let mut p = vec![usize::MAX; bound];
        for (i, n) in order.iter().enumerate() {
            p[n.index()] = i;
        }
        p
    };
    // (a vector kernel just after the last layer whose outputs it reads: a side part's
    // nodes may come long before its layer's)
    let outputs: BTreeSet<NodeIndex> = (kernels.iter())
        .flat_map(|k| match &k.kind {
            Kind::Dense { fwd, more, .. } => std::iter::once(*fwd)
                .chain(more.iter().filter(|p| p.beside()).map(|p| p.out))
                .collect(),
            Kind::Vector { .. } => Vec::new(),
        })
        .collect();
    // (a shortcut just before the other layer of its input: `shortcuts`)
    let read_first = |x: NodeIndex| {
        (kernels.iter()).find_map(|k| match &k.kind {
            Kind::Dense {
                x: xa, fwd, carry, ..
            } if carry.is_none() && resolve(*xa) == x => Some(pos[fwd.index()]),
            _ => None,
        })
    };
    let first = |k: &Kernel| match &k.kind {
        Kind::Dense {
            carry: Some(c),
            fwd,
            ..
        } if c.first => (read_first(c.x).unwrap_or(pos[fwd.index()]), 0, 0),
        Kind::Dense { fwd, .. } => (pos[fwd.index()], 0, 1),
        Kind::Vector { nodes } => {
            let after = (nodes.iter())
                .flat_map(|&n| g.operands(n))
                .map(resolve)
                .filter(|o| outputs.contains(o))
                .map(|o| pos[o.index()])
                .max();
            let own = nodes.iter().map(|n| pos[n.index()]).min().unwrap_or(0);
            (after.unwrap_or(own), 1, 0)
        }
    };
    let mut perm: Vec<usize> = (0..kernels.len()).collect();
    perm.sort_by_key(|&k| first(&kernels[k]));
    let mut renum = vec![0; kernels.len()];
    for (new, &old) in perm.iter().enumerate() {
        renum[old] = new;
    }
    let mut sorted: Vec<Option<Kernel>> = kernels.into_iter().map(Some).collect();
    let kernels: Vec<Kernel> = perm.iter().filter_map(|&k| sorted[k].take()).collect();
    for o in owner.iter_mut().flatten() {
        *o = renum[*o];
    }
    // a value under another name is where that value is
    for &n in order {
        if alias[n.index()].is_some() {
            owner[n.index()] = owner[resolve(n).index()];
        }
    }
    kernels
}

/// The step nodes that make the new values of variables several kernels will hold
/// (from `kernels`, the layers alone, and `free`, whether a node will be in a vector
/// kernel): a weight of several layers, a variable that several vector nodes read.
fn shared_updates(
    g: &Graph,
    class: &[Class],
    kernels: &[Kernel],
    free: impl Fn(NodeIndex) -> bool,
) -> BTreeSet<NodeIndex> {
    let mut out = BTreeSet::new();
    for (name, node) in g.outputs_with(Role::Update) {
        let Some(v) = g.variable(&name) else { continue };
        let layers = (kernels.iter())
            .filter(|k| match &k.kind {
                Kind::Dense { w, more, .. } => *w == v || more.iter().any(|p| p.w == v),
                Kind::Vector { .. } => false,
            })
            .count();
        let readers = (g.g.neighbors_directed(v, petgraph::Direction::Outgoing))
            .filter(|&u| class[u.index()] == Class::Sample && free(u))
            .count();
        if layers < 2 && readers < 2 {
            continue;
        }
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            let step =
                class[n.index()] == Class::Step && !matches!(g.node(n).op, Op::Variable { .. });
            if step && out.insert(n) {
                stack.extend(g.operands(n));
            }
        }
    }
    out
}
