//! The streams of a formed graph (the sample values that cross from one kernel to
//! others, and the host's inputs and outputs), and the reshapes between kernels that
//! the wafer's planar images allow.

use super::{planes, unsupported, Carry, Class, Cx, End, Kernel, Kind, Stream, Unsupported};
use crate::ir::{NodeIndex, Op, Role};
use std::collections::BTreeSet;

/// Each node's users (by index).
fn users(cx: &Cx) -> Vec<Vec<NodeIndex>> {
    let mut users: Vec<Vec<NodeIndex>> = vec![Vec::new(); cx.bound];
    for &n in &cx.order {
        for o in cx.g.operands(n) {
            users[o.index()].push(n);
        }
    }
    users
}

/// The sample values crossing kernels (or coming from the host, or wanted by it as a
/// prediction or a metric's input), each marked when it is part of the backward pass.
pub(super) fn streams(cx: &Cx, kernels: &[Kernel], owner: &[Option<usize>]) -> Vec<Stream> {
    let (g, class, order, alias) = (cx.g, &cx.class, &cx.order, &cx.alias);
    let resolve = |n: NodeIndex| cx.resolve(n);
    let users = users(cx);
    let mut streams: Vec<Stream> = Vec::new();
    let wants: BTreeSet<NodeIndex> = g
        .outputs
        .iter()
        .filter(|o| matches!(o.role, Role::Prediction | Role::MetricInput))
        .map(|o| resolve(o.node))
        .collect();
    for &n in order {
        let n = resolve(n);
        if !matches!(class[n.index()], Class::Sample) || streams.iter().any(|s| s.node == n) {
            continue;
        }
        let from = owner[n.index()].map_or(End::Host, End::Kernel);
        let mut to: BTreeSet<End> = BTreeSet::new();
        let mut stack = users[n.index()].clone();
        while let Some(u) = stack.pop() {
            // through its other names (a reshape of a reshape of it too)
            if alias[u.index()].is_some() && resolve(u) == n {
                stack.extend(users[u.index()].iter().copied());
                continue;
            }
            if let Some(k) = owner[u.index()] {
                if End::Kernel(k) != from {
                    to.insert(End::Kernel(k));
                }
            }
        }
        if wants.contains(&n) && from != End::Host {
            to.insert(End::Host);
        }
        if to.is_empty() {
            continue;
        }
        let bwd = kernels.iter().any(|k| match &k.kind {
            Kind::Dense {
                dy,
                bwd,
                carry,
                more,
                ..
            } => {
                // (under any of their names: a gradient reshaped into a layer's)
                let is = |m: Option<NodeIndex>| m.map(resolve) == Some(n);
                is(*dy)
                    || is(*bwd)
                    || is(carry.and_then(|c| c.grad))
                    || more.iter().any(|p| p.side && is(p.dy))
            }
            Kind::Vector { .. } => false,
        });
        streams.push(Stream {
            node: n,
            from,
            to: to.into_iter().collect(),
            bwd,
        });
    }
    streams
}

/// Checks the reshapes between kernels: an image is flattened for dense layers only, and
/// made again only from their input gradients (planar both ways); an image of one pixel
/// is its channels in either order.
pub(super) fn check_reshapes(
    cx: &Cx,
    kernels: &[Kernel],
    owner: &[Option<usize>],
) -> Result<(), Unsupported> {
    let (g, order, alias) = (cx.g, &cx.order, &cx.alias);
    let resolve = |n: NodeIndex| cx.resolve(n);
    let users = users(cx);
    let image = |n: NodeIndex| planes(g, n).is_some_and(|(pixels, c)| c > 1 && pixels > 1);
    for &n in order {
        let Some(src) = alias[n.index()] else {
            continue;
        };
        if !matches!(g.node(n).op, Op::Reshape) {
            continue;
        }
        let dense_x = |k: Option<usize>| {
            k.is_some_and(|k| matches!(kernels[k].kind, Kind::Dense { x, .. } if x == n))
        };
        if image(src) && !image(n) && !users[n.index()].iter().all(|u| dense_x(owner[u.index()])) {
            return Err(unsupported(g, n, "an image flattened for anything but a dense layer has no wafer kernel yet".into(), "the wafer keeps images planar (channel by channel): flatten an image only into a dense layer"));
        }
        let from_dense = kernels.iter().any(|k| match k.kind {
            Kind::Dense { x, bwd, .. } => {
                bwd == Some(src) && g.ty(resolve(x)).shape == g.ty(n).shape
            }
            Kind::Vector { .. } => false,
        });
        if image(n) && !image(src) && !from_dense {
            return Err(unsupported(g, n, "a vector reshaped into an image of several channels has no wafer kernel yet".into(), "the wafer keeps images planar (channel by channel): make images of one channel from vectors"));
        }
    }
    Ok(())
}

/// Each value carried past the kernel after the one that makes it, with the kernel that
/// reads it there (the last, when several do; see `Formed::skips`): a layer's carried
/// input, and a shortcut's outputs (`Carry::first`), which the kernels after it pass on
/// to the sum.
pub(super) fn skips(cx: &Cx, kernels: &[Kernel], streams: &[Stream]) -> Vec<(usize, usize, Carry)> {
    let reader = |n: NodeIndex, l: usize| {
        let st = streams.iter().find(|s| s.node == n);
        (st.into_iter().flat_map(|s| &s.to))
            .filter_map(|t| match t {
                End::Kernel(b) if *b > l => Some(*b),
                _ => None,
            })
            .max()
    };
    let mut out = Vec::new();
    for (l, kr) in kernels.iter().enumerate() {
        let Kind::Dense {
            carry: Some(c),
            fwd,
            dy,
            ..
        } = &kr.kind
        else {
            continue;
        };
        if c.first {
            let outputs = Carry {
                x: *fwd,
                grad: dy.map(|d| cx.resolve(d)),
                first: false,
            };
            out.extend(reader(*fwd, l).map(|r| (l, r, outputs)));
        } else {
            out.extend(reader(c.x, l).map(|r| (l, r, *c)));
        }
    }
    out
}
