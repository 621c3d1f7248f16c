//! The layers of a graph: the products with a variable (dense layers, convolutions,
//! embeddings), their gradients, the values the host computes for them, and the
//! layers that merge into others as further parts (sums of products, side parts).

use super::image;
use super::{product, read_only_by, unsupported, Class, Cx, Kernel, Kind, Part, Unsupported};
use crate::ir::{Graph, NodeIndex, Op};
use std::collections::BTreeSet;

/// The layers: `x W` with a variable `W` of rank 2 (dense), a convolution with a
/// variable filter, and rows of a variable table of rank 2 chosen per sample (an
/// embedding), each with its forward node in `owner`.
pub(super) fn layers(cx: &Cx, owner: &mut [Option<usize>]) -> Vec<Kernel> {
    let (g, class, order) = (cx.g, &cx.class, &cx.order);
    // (a convolution's input gradient is a transposed convolution's op, and a
    // transposed convolution's a convolution's: a layer is of the forward pass)
    let forward = super::classify::forward(g);
    let mut kernels: Vec<Kernel> = Vec::new();
    for &n in order {
        if class[n.index()] != Class::Sample || !forward[n.index()] {
            continue;
        }
        let ops = g.operands(n);
        // its input and weight
        let (x, w) = match &g.node(n).op {
            // (a dense layer over each token of a sequence, `[B, T, D] x [D, N]`, too)
            Op::MatMul if matches!(g.ty(ops[0]).rank(), 2 | 3) => (ops[0], ops[1]),
            Op::Conv2d(_) | Op::Conv2dBackpropInput(_) if g.ty(ops[0]).rank() == 4 => {
                (ops[0], ops[1])
            }
            Op::Gather if g.ty(ops[0]).rank() == 2 && class[ops[1].index()] == Class::Sample => {
                (ops[1], ops[0])
            }
            _ => continue,
        };
        // (an embedding's table as stored: its ids are no half-precision values)
        let gather = matches!(g.node(n).op, Op::Gather);
        let Some(var) = cx.weight(w).filter(|&v| v == w || !gather) else {
            continue;
        };
        // (a weight cast to half precision: the layer rounds its own copy)
        if var != w {
            owner[w.index()] = Some(kernels.len());
        }
        let w = var;
        // a weight several products use (across the time steps of an unrolled
        // recurrent network, a table looked up twice) is held by each of their layers:
        // a replica each, which the host keeps equal (see `Formed::host_commits`)
        let k = kernels.len();
        owner[n.index()] = Some(k);
        owner[w.index()].get_or_insert(k);
        kernels.push(Kernel {
            kind: Kind::Dense {
                w,
                x,
                fwd: n,
                dy: None,
                bwd: None,
                dw: None,
                more: Vec::new(),
                carry: None,
            },
            vars: vec![w],
            steps: Vec::new(),
            commits: Vec::new(),
            hosts: Vec::new(),
        });
    }
    kernels
}

/// Ties each gradient node to its layer: `dy W^T` and `x^T dy` (a convolution's: the
/// gradients of its input, from `dy` and the filter, and of its filter, from `x` and
/// `dy`; an embedding's: `dy`'s rows added into its table's).
pub(super) fn gradients(
    cx: &Cx,
    kernels: &mut [Kernel],
    owner: &mut [Option<usize>],
) -> Result<(), Unsupported> {
    let (g, class, order) = (cx.g, &cx.class, &cx.order);
    // the weight gradients first, which tie each replica of a shared weight to its
    // output gradient
    let gradients = (order.iter().filter(|n| class[n.index()] == Class::Batch))
        .chain(order.iter().filter(|n| class[n.index()] != Class::Batch));
    for &n in gradients {
        let ops = g.operands(n);
        if matches!(g.node(n).op, Op::ScatterAdd) && class[n.index()] == Class::Batch {
            let (ids, dy) = (ops[0], ops[1]);
            let table = (kernels.iter().enumerate()).find_map(|(k, kr)| match kr.kind {
                Kind::Dense { x, fwd, .. } if x == ids && matches!(g.node(fwd).op, Op::Gather) => {
                    Some(k)
                }
                _ => None,
            });
            let Some(k) = table else {
                return Err(unsupported(g, n, "a `scatter_add` that is no embedding's gradient has no wafer kernel".into(), "the wafer adds rows into a table only as the gradient of `gather` from a variable as it is stored (an embedding; not a table cast to f16 or bf16: gather from the f32 table and cast the rows)"));
            };
            if let Kind::Dense { dy: d, dw, .. } = &mut kernels[k].kind {
                if d.is_some() || dw.is_some() {
                    return Err(unsupported(
                        g,
                        n,
                        "an embedding with two gradients has no wafer kernel".into(),
                        "look each table up once in the forward pass",
                    ));
                }
                *d = Some(dy);
                *dw = Some(n);
            }
            owner[n.index()] = Some(k);
            continue;
        }
        if class[n.index()] == Class::Batch && token_layer(g, class, n, kernels, owner)? {
            continue;
        }
        // (a layer's forward node is its own: a convolution, a transposed one)
        if owner[n.index()].is_some()
            || !matches!(
                g.node(n).op,
                Op::MatMul
                    | Op::Conv2d(_)
                    | Op::Conv2dBackpropInput(_)
                    | Op::Conv2dBackpropFilter(_)
            )
        {
            continue;
        }
        let (mut a, mut b) = (ops[0], ops[1]);
        let conv = !matches!(g.node(n).op, Op::MatMul);
        // a transposed convolution's filter gradient reads its output gradient first
        let transposed = |x: NodeIndex| {
            kernels.iter().any(|kr| {
                matches!(kr.kind, Kind::Dense { x: v, fwd, .. }
                    if v == x && matches!(g.node(fwd).op, Op::Conv2dBackpropInput(_)))
            })
        };
        if matches!(g.node(n).op, Op::Conv2dBackpropFilter(_)) && transposed(b) {
            (a, b) = (b, a);
        }
        let transposed_var = |t: NodeIndex| match g.node(t).op {
            Op::Transpose { .. } => cx.weight(g.operands(t)[0]),
            _ if conv => cx.weight(t),
            _ => None,
        };
        if class[n.index()] == Class::Sample {
            if let Some(w) = transposed_var(b) {
                // the layer of `w` whose output gradient this is (of its replicas,
                // the one whose weight gradient reads the same)
                let layers: Vec<usize> = (kernels.iter().enumerate())
                    .filter(|(_, kr)| matches!(kr.kind, Kind::Dense { w: v, .. } if v == w))
                    .map(|(k, _)| k)
                    .collect();
                let mine = layers.iter().copied().find(
                    |&k| matches!(kernels[k].kind, Kind::Dense { dy: Some(d), .. } if d == a),
                );
                let k = match (mine, layers.as_slice()) {
                    (Some(k), _) | (None, &[k]) => k,
                    (None, []) => continue,
                    (None, _) => {
                        return Err(unsupported(
                            g,
                            n,
                            "a frozen weight shared by several layers has no wafer kernel yet"
                                .into(),
                            "train the shared weight, or give each layer its own",
                        ));
                    }
                };
                if let Kind::Dense { dy, bwd, .. } = &mut kernels[k].kind {
                    if bwd.is_some_and(|o| o != n) || dy.is_some_and(|d| d != a) {
                        return Err(unsupported(
                            g,
                            n,
                            "a layer with two input gradients has no wafer kernel".into(),
                            "use each weight once in the forward pass",
                        ));
                    }
                    *bwd = Some(n);
                    *dy = Some(a);
                }
                owner[n.index()] = Some(k);
                if !conv {
                    owner[b.index()] = Some(k);
                }
            }
        } else if class[n.index()] == Class::Batch {
            let xt = if conv { a } else { g.operands(a)[0] };
            // of the layers that read `x` (several: two towers on the features), the
            // one whose weight the update of this gradient reads
            let updated = updates_read(g, class, n);
            let all: Vec<usize> = (kernels.iter().enumerate())
                .filter(|(_, kr)| matches!(kr.kind, Kind::Dense { x, .. } if x == xt))
                .map(|(k, _)| k)
                .collect();
            let mine: Vec<usize> = if all.len() > 1 {
                (all.iter().copied())
                    .filter(|&k| matches!(kernels[k].kind, Kind::Dense { w, .. } if updates(g, &updated, w)))
                    .collect()
            } else {
                all
            };
            let mut readers = mine.into_iter();
            let found = readers.next();
            if readers.next().is_some() {
                return Err(unsupported(
                    g,
                    xt,
                    "a value that several layers read has no wafer layout yet".into(),
                    "the wafer lays out chains of layers so far: feed each value to one layer",
                ));
            }
            let Some(k) = found else {
                return Err(unsupported(g, n, "a product over the batch that is no layer's weight gradient has no wafer kernel".into(), "the wafer computes `transpose(x) @ dy` only as the gradient of a dense layer's weight"));
            };
            if let Kind::Dense { dy, dw, .. } = &mut kernels[k].kind {
                if dy.is_some_and(|d| d != b) || dw.is_some() {
                    return Err(unsupported(g, n, "a layer whose weight gradient and input gradient disagree has no wafer kernel".into(), "use each weight once in the forward pass"));
                }
                *dy = Some(b);
                *dw = Some(n);
            }
            owner[n.index()] = Some(k);
            if !conv {
                owner[a.index()] = Some(k);
            }
        }
    }
    Ok(())
}

/// Ties `n` to its layer when it is the weight gradient of a dense layer over tokens
/// (`token_gradient`: `reduce_sum(transpose(x) @ dy, [0])`), with the product and the
/// transpose it sums; whether it is.
fn token_layer(
    g: &Graph,
    class: &[Class],
    n: NodeIndex,
    kernels: &mut [Kernel],
    owner: &mut [Option<usize>],
) -> Result<bool, Unsupported> {
    let Some((m, t, x, dy)) = token_gradient(g, n) else {
        return Ok(false);
    };
    // (of the layers over `x`, several when they are towers of one sequence, the one
    // whose weight the update of this gradient reads)
    let updated = updates_read(g, class, n);
    let k = (kernels.iter()).position(|kr| {
        matches!(kr.kind, Kind::Dense { x: v, w, dw: None, .. } if v == x && updates(g, &updated, w))
    });
    let Some(k) = k else {
        return Ok(false);
    };
    if let Kind::Dense { dy: d, dw, .. } = &mut kernels[k].kind {
        if d.is_some_and(|d| d != dy) {
            return Err(unsupported(
                g,
                n,
                "a layer whose weight gradient and input gradient disagree has no wafer kernel"
                    .into(),
                "use each weight once in the forward pass",
            ));
        }
        *d = Some(dy);
        *dw = Some(n);
    }
    for v in [n, m, t] {
        owner[v.index()] = Some(k);
    }
    Ok(true)
}

/// The weight gradient of a dense layer over tokens, `n = reduce_sum(m, [0])` with
/// `m = t @ dy` and `t = transpose(x, [0, 2, 1])` (each sample's `x^T dy`, summed over
/// the batch): `(m, t, x, dy)`.
fn token_gradient(g: &Graph, n: NodeIndex) -> Option<(NodeIndex, NodeIndex, NodeIndex, NodeIndex)> {
    let Op::Reduce {
        op: crate::ir::ReduceOp::Sum,
        axes,
        ..
    } = &g.node(n).op
    else {
        return None;
    };
    let m = g.operands(n)[0];
    if axes.as_slice() != [0] || !matches!(g.node(m).op, Op::MatMul) || g.ty(m).rank() != 3 {
        return None;
    }
    let (t, dy) = (g.operands(m)[0], g.operands(m)[1]);
    match &g.node(t).op {
        Op::Transpose { perm } if perm.as_slice() == [0, 2, 1] => {
            Some((m, t, g.operands(t)[0], dy))
        }
        _ => None,
    }
}

/// The sample values the host computes and streams: a layer's input computed from the
/// inputs alone (a time step's slice of the features, ids computed from others), as
/// it streams random numbers, and what only such values read.
pub(super) fn hosted(cx: &Cx, kernels: &[Kernel]) -> Vec<bool> {
    let (g, class, order) = (cx.g, &cx.class, &cx.order);
    let source = |n: NodeIndex| cx.source(n);
    let resolve = |n: NodeIndex| cx.resolve(n);
    let bound = cx.bound;
    let inputs_only = &cx.inputs_only;
    let mut hosted = vec![false; bound];
    for kr in kernels {
        if let Kind::Dense { x, .. } = kr.kind {
            let x = resolve(x);
            hosted[x.index()] = inputs_only[x.index()] && !source(x);
        }
    }
    // and one read on both sides of a layer (a sequence's lengths, whose mask each
    // step's kernel makes): each kernel that reads it then takes it from the host.
    // A node's depth is the most layers' products on a way to it from the inputs;
    // the depths an inputs-only value is read at are its readers' (through the
    // inputs-only values they make).
    let fwds: BTreeSet<NodeIndex> = kernels.iter().filter_map(Kernel::fwd).collect();
    let mut depth = vec![0u32; bound];
    for &n in order {
        depth[n.index()] = (g.operands(n).into_iter())
            .map(|o| depth[o.index()] + u32::from(fwds.contains(&o)))
            .max()
            .unwrap_or(0);
    }
    let mut read_at: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); bound];
    let mut apart = vec![false; bound];
    for &n in order.iter().rev() {
        let mut at = BTreeSet::new();
        for u in g.g.neighbors_directed(n, petgraph::Direction::Outgoing) {
            if inputs_only[u.index()] && !hosted[u.index()] {
                at.extend(read_at[u.index()].iter().copied());
            } else if class[u.index()] == Class::Sample {
                at.insert(depth[u.index()]);
            }
        }
        apart[n.index()] = inputs_only[n.index()] && !source(n) && at.len() > 1;
        read_at[n.index()] = at;
    }
    // (and what is made from such values and the host's alone: each step's mask)
    for &n in order {
        let ops = g.operands(n);
        apart[n.index()] |= inputs_only[n.index()]
            && !source(n)
            && ops.iter().any(|o| apart[o.index()])
            && (ops.iter())
                .all(|&o| apart[o.index()] || source(o) || class[o.index()] == Class::Host);
        hosted[n.index()] |= apart[n.index()];
    }
    for &n in order.iter().rev() {
        if inputs_only[n.index()] && !source(n) && read_only_by(g, n, |u| hosted[u.index()]) {
            hosted[n.index()] = true;
        }
    }
    hosted
}

/// Merges the layers whose products are summed (`add(x W, h U)`, each product read
/// by the sum alone, with one output gradient) into one layer of several parts: the
/// layer whose input comes from another kernel keeps its place, the others (whose
/// inputs the host sends: `Cx::host_sends`) become its further parts, and `fwd` becomes the
/// sum. Sums of sums merge in turn.
pub(super) fn merge_sums(cx: &Cx, kernels: &mut Vec<Kernel>, owner: &mut [Option<usize>]) {
    let g = cx.g;
    let resolve = |n: NodeIndex| cx.resolve(n);
    let from_host = |x: NodeIndex| cx.host_sends(x);
    // a product of rank-2 values (a dense layer's, or an embedding's of each
    // sample's ids), or a sum of them already merged
    let plain = |fwd: NodeIndex| {
        matches!(
            g.node(fwd).op,
            Op::MatMul | Op::Gather | Op::Binary(crate::ir::BinaryOp::Add)
        )
    };
    let layer = |kr: &Kernel| {
        let Kind::Dense { x, fwd, dy, .. } = kr.kind else {
            return None;
        };
        let p = product(g, &kr.kind)?;
        let gather = matches!(g.node(p).op, Op::Gather);
        (plain(fwd) && (g.ty(x).rank() == 2 || gather) && image(g, x).is_none()).then_some((p, dy))
    };
    loop {
        let by_fwd = |n: NodeIndex, kernels: &[Kernel]| {
            kernels
                .iter()
                .position(|kr| matches!(kr.kind, Kind::Dense { fwd, .. } if fwd == n))
        };
        let mut found = None;
        for n in g.topo_order() {
            if !matches!(g.node(n).op, Op::Binary(crate::ir::BinaryOp::Add)) {
                continue;
            }
            let ops = g.operands(n);
            let (Some(a), Some(b)) = (by_fwd(ops[0], kernels), by_fwd(ops[1], kernels)) else {
                continue;
            };
            let (Some(pa), Some(pb)) = (layer(&kernels[a]), layer(&kernels[b])) else {
                continue;
            };
            let only_sum = |m: NodeIndex| {
                g.g.neighbors_directed(m, petgraph::Direction::Outgoing)
                    .all(|u| u == n)
            };
            let same = g.ty(ops[0]).shape == g.ty(n).shape && g.ty(ops[1]).shape == g.ty(n).shape;
            // the part: a plain product of a host input, with no input gradient
            let part_of = |k: usize| match &kernels[k].kind {
                Kind::Dense {
                    w,
                    x,
                    fwd,
                    dw,
                    bwd: None,
                    more,
                    ..
                } if more.is_empty()
                    && matches!(g.node(*fwd).op, Op::MatMul | Op::Gather)
                    && from_host(*x) =>
                {
                    Some(Part {
                        w: *w,
                        x: *x,
                        mm: *fwd,
                        dw: *dw,
                        side: false,
                        out: *fwd,
                        joined: false,
                        dy: None,
                    })
                }
                _ => None,
            };
            // the products alike (both dense layers' or both embeddings'), with one
            // output gradient
            let gather = |n: NodeIndex| matches!(g.node(n).op, Op::Gather);
            if a == b
                || !same
                || !only_sum(ops[0])
                || !only_sum(ops[1])
                || pa.1 != pb.1
                || gather(pa.0) != gather(pb.0)
            {
                continue;
            }
            let pick = match (part_of(b), part_of(a)) {
                (Some(p), _) => Some((a, b, p)),
                (None, Some(p)) => Some((b, a, p)),
                _ => None,
            };
            // a part's input is its own (the host sends each stream to one part's
            // columns): one the layer or another part reads stays a join
            let taken = |main: usize, part: &Part| match &kernels[main].kind {
                Kind::Dense { x, more, .. } => {
                    resolve(*x) == resolve(part.x)
                        || more.iter().any(|p| resolve(p.x) == resolve(part.x))
                }
                Kind::Vector { .. } => true,
            };
            if let Some((main, gone, part)) = pick.filter(|(m, _, p)| !taken(*m, p)) {
                found = Some((n, main, gone, part));
                break;
            }
        }
        let Some((sum, main, gone, part)) = found else {
            return;
        };
        let main = absorb(kernels, owner, (gone, main), |_| vec![part]);
        owner[sum.index()] = Some(main);
        if let Kind::Dense { fwd, .. } = &mut kernels[main].kind {
            *fwd = sum;
        }
    }
}

/// Removes layer `gone` and makes it further parts of layer `main` (those `parts` makes
/// of it): its nodes and variables become `main`'s. Returns `main`'s new index.
fn absorb(
    kernels: &mut Vec<Kernel>,
    owner: &mut [Option<usize>],
    (gone, main): (usize, usize),
    parts: impl FnOnce(&Kind) -> Vec<Part>,
) -> usize {
    let taken = kernels.remove(gone);
    let main = if gone < main { main - 1 } else { main };
    for o in owner.iter_mut() {
        match *o {
            Some(k) if k == gone => *o = Some(main),
            Some(k) if k > gone => *o = Some(k - 1),
            _ => {}
        }
    }
    let kr = &mut kernels[main];
    kr.vars.extend(taken.vars);
    if let Kind::Dense { more, .. } = &mut kr.kind {
        more.extend(parts(&taken.kind));
    }
    main
}

/// Makes each layer of the host's inputs (`Cx::host_sends`) whose product only a vector
/// kernel reads that also reads another layer's product a side part of that other
/// layer (see `Part::side`). Run before the step nodes find their kernels.
pub(super) fn side_parts(cx: &Cx, kernels: &mut Vec<Kernel>, owner: &mut [Option<usize>]) {
    let g = cx.g;
    let resolve = |n: NodeIndex| cx.resolve(n);
    let from_host = |x: NodeIndex| cx.host_sends(x);
    // the one kernel that reads node `n` (none when several do, or none)
    let reader = |n: NodeIndex, owner: &[Option<usize>]| {
        let ks: BTreeSet<Option<usize>> =
            (g.g.neighbors_directed(n, petgraph::Direction::Outgoing))
                .map(|u| owner[u.index()])
                .collect();
        match ks.into_iter().collect::<Vec<_>>().as_slice() {
            [Some(k)] => Some(*k),
            _ => None,
        }
    };
    // a product of one row a sample: a dense layer's of a vector, an embedding's of one
    // id (whose outputs can share a row's chain with others')
    let one_row = |mm: NodeIndex, x: NodeIndex| match g.node(mm).op {
        Op::MatMul => g.ty(x).rank() == 2,
        Op::Gather => g.ty(x).rank() == 1,
        _ => false,
    };
    let plain = |kr: &Kernel| match &kr.kind {
        Kind::Dense {
            x,
            fwd,
            bwd: None,
            more,
            carry: None,
            ..
        } => {
            // (its own product, and those of a sum of several: a side layer of them)
            let first = product(g, &kr.kind).unwrap_or(*fwd);
            one_row(first, *x)
                && from_host(*x)
                && (more.iter()).all(|p| !p.side && one_row(p.mm, p.x) && from_host(p.x))
        }
        _ => false,
    };
    loop {
        let vector = |k: usize| matches!(kernels[k].kind, Kind::Vector { .. });
        // the layer it joins: a product of its own input (the host sends an input to
        // one part of a layer), which trains if the side part does (its output
        // gradient brings the side part's)
        let joins = |l: usize, s: usize, v: usize| {
            let (
                Kind::Dense {
                    x: xs,
                    dy: ds,
                    more: ms,
                    ..
                },
                Kind::Dense {
                    x, fwd, dy, more, ..
                },
            ) = (&kernels[s].kind, &kernels[l].kind)
            else {
                return false;
            };
            let inputs = |x: NodeIndex, more: &[Part]| {
                let more: Vec<NodeIndex> = more.iter().map(|p| resolve(p.x)).collect();
                std::iter::once(resolve(x))
                    .chain(more)
                    .collect::<BTreeSet<_>>()
            };
            l != s
                && reader(*fwd, owner) == Some(v)
                && product(g, &kernels[l].kind).is_some_and(|p| one_row(p, *x))
                && inputs(*x, more).is_disjoint(&inputs(*xs, ms))
                && (ds.is_none() || dy.is_some())
        };
        let found = (0..kernels.len()).find_map(|s| {
            let Kind::Dense { fwd, .. } = kernels[s].kind else {
                return None;
            };
            if !plain(&kernels[s]) {
                return None;
            }
            let v = reader(fwd, owner).filter(|&v| vector(v))?;
            let l = (0..kernels.len()).find(|&l| joins(l, s, v))?;
            Some((s, l))
        });
        let Some((gone, main)) = found else {
            return;
        };
        // (a side layer of several products: its first part stands for their sum, the
        // others add into it)
        absorb(kernels, owner, (gone, main), |kind| match kind {
            Kind::Dense {
                w,
                x,
                fwd,
                dy,
                dw,
                more,
                ..
            } => {
                let side = |w, x, mm, dw, joined| Part {
                    w,
                    x,
                    mm,
                    dw,
                    side: true,
                    out: *fwd,
                    joined,
                    dy: dy.map(resolve),
                };
                let first = product(g, kind).unwrap_or(*fwd);
                std::iter::once(side(*w, *x, first, *dw, false))
                    .chain(more.iter().map(|p| side(p.w, p.x, p.mm, p.dw, true)))
                    .collect()
            }
            Kind::Vector { .. } => Vec::new(),
        });
    }
}

/// Whether the variables an update reads (`updates_read`) update weight `w`: hold it,
/// or one of the variables it joins (`super::joined`).
fn updates(g: &Graph, updated: &BTreeSet<NodeIndex>, w: NodeIndex) -> bool {
    updated.contains(&w)
        || super::joined(g, w).is_some_and(|p| p.iter().any(|v| updated.contains(v)))
}

/// The variables the step nodes after node `n` read (a weight gradient's: its
/// weight, and its optimiser's slots).
fn updates_read(g: &Graph, class: &[Class], n: NodeIndex) -> BTreeSet<NodeIndex> {
    let mut vars = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut stack = vec![n];
    while let Some(v) = stack.pop() {
        for u in g.g.neighbors_directed(v, petgraph::Direction::Outgoing) {
            // (through the batch values it makes: a mean across shards; not through
            // scalars, which may mix every layer's: a global norm)
            let tensor = g.ty(u).rank() > 0;
            if matches!(class[u.index()], Class::Step | Class::Batch) && tensor && seen.insert(u) {
                // (and a variable the update reads through a step value of it alone:
                // AdamW's decayed weight, `w * (1 - lr wd)`)
                for o in g.operands(u) {
                    let through = class[o.index()] == Class::Step && g.ty(o).rank() > 0;
                    let of = through.then(|| g.operands(o)).into_iter().flatten();
                    let reads = std::iter::once(o).chain(of);
                    vars.extend(reads.filter(|&v| matches!(g.node(v).op, Op::Variable { .. })));
                }
                stack.push(u);
            }
        }
    }
    vars
}
