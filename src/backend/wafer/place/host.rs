//! The host's streams on the fabric: each input's legs down from the north edge to the
//! kernels that read it (straight into the first layer's columns and a further part's,
//! down a column and along a vector strip otherwise), and each per-sample output east
//! to the east edge.

use super::colour::{stream_name, Colouring};
use super::lanes::Lanes;
use super::sizer::Sizer;
use super::{HostLane, HostStream, LayoutError, Placed};
use crate::backend::wafer::form::{self, image, End, Formed, Kind};
use crate::backend::wafer::isa::Colour;
use crate::backend::wafer::kernels::dense::Shape;
use crate::backend::wafer::kernels::{split, Laid};
use crate::backend::wafer::sim::{Dir, HostIn, Route};
use crate::ir::{NodeIndex, Op};

/// A host input's leg to one kernel that reads it: its colour, and the routers of its
/// path down to the kernel.
pub(super) type Leg = (Colour, Vec<(u32, u32)>);

/// The kernels a stream from the host is sent to, a leg each (none for another stream).
pub(super) fn host_legs(st: &form::Stream) -> impl Iterator<Item = usize> + '_ {
    st.to.iter().filter_map(|t| match (st.from, t) {
        (End::Host, End::Kernel(b)) => Some(*b),
        _ => None,
    })
}

/// Layer `k`'s further parts (none for another kernel).
pub(super) fn parts_of(f: &Formed, k: usize) -> &[form::Part] {
    match &f.kernels[k].kind {
        Kind::Dense { more, .. } => more,
        Kind::Vector { .. } => &[],
    }
}

/// The further part of layer `b` that reads host stream `node`, if one does, and its
/// columns (after the layer's own columns and the parts' before it).
pub(super) fn part_columns<'f>(
    f: &'f Formed,
    lanes: &Lanes,
    b: usize,
    node: NodeIndex,
) -> Option<(&'f form::Part, std::ops::Range<u32>)> {
    let parts = parts_of(f, b);
    let p = parts.iter().position(|p| f.resolve(p.x) == node)?;
    let first = lanes.inp[b] + lanes.more[b][..p].iter().sum::<u32>();
    Some((&parts[p], first..first + lanes.more[b][p]))
}

/// The way into column `col` of kernel `p` from the fabric's edge on its inputs'
/// side: the router a host lane enters at and the port it enters by, and the routers
/// before the kernel (each passing it on straight).
pub(super) fn edge_path(p: &Placed, col: u32) -> ((u32, u32), Dir, Vec<(u32, u32)>) {
    let at = p.orient.at((p.x, p.y), col, 0);
    let dir = p.orient.dir(Dir::N);
    if dir == Dir::N {
        ((at.0, 0), dir, (0..at.1).map(|y| (at.0, y)).collect())
    } else {
        ((0, at.1), dir, (0..at.0).map(|x| (x, at.1)).collect())
    }
}

/// The host's inputs: a leg to each kernel that reads one, its routes laid in `all`.
pub(super) fn inputs(
    sizer: &Sizer,
    lanes: &Lanes,
    placed: &[Placed],
    colours: &Colouring,
    all: &mut Laid,
) -> Result<Vec<HostStream>, LayoutError> {
    let f = sizer.f;
    let mut inputs = Vec::new();
    for st in &f.streams {
        for b in host_legs(st) {
            inputs.push(leg(sizer, lanes, &placed[b], (st.node, b), colours, all)?);
        }
    }
    Ok(inputs)
}

/// Host input `node`'s leg into kernel `b` (placed at `p`): its lanes, and its routes
/// laid in `all`.
pub(super) fn leg(
    sizer: &Sizer,
    lanes: &Lanes,
    p: &Placed,
    (node, b): (NodeIndex, usize),
    colours: &Colouring,
    all: &mut Laid,
) -> Result<HostStream, LayoutError> {
    let (g, f, dims) = (sizer.g, sizer.f, &sizer.dims);
    let per = (g.ty(node).elements() / f.batch.max(1) as usize) as u32;
    let (c, path) = &colours.legs[&(node, b)];
    let c = *c;
    let mut host_lanes = Vec::new();
    let mut channels = 0;
    let mut ids = None;
    if let Some((part, cols)) = part_columns(f, lanes, b, node) {
        // a further part's columns, each from the fabric's edge (an
        // embedding's each take every id)
        let n = cols.len() as u32;
        let k = per;
        let table = Some(part).filter(|p| matches!(g.node(p.mm).op, Op::Gather));
        if let Some(p) = table {
            ids = Some((p.mm.index() as u32, g.ty(p.w).shape[0] as u32));
        }
        for (i, col) in cols.enumerate() {
            let (entry, dir, path) = edge_path(p, col);
            for r in path {
                all.route(r, c, Route::new(dir, &[dir.opposite()]))
                    .map_err(LayoutError::DoesNotFit)?;
            }
            let groups = match table {
                Some(_) => 0..k,
                None => split(k, n, i as u32),
            };
            host_lanes.push(HostLane {
                x: entry.0,
                y: entry.1,
                dir,
                colour: c,
                elems: groups,
            });
        }
    } else if let (0, Some(d), Some(layer)) = (b, dims[b], sizer.dense[b].as_ref()) {
        if let (true, Some((_, _, c))) = (d.shape.images(), image(g, node)) {
            channels = c;
        }
        let cols = lanes.inp[b];
        let layer = layer.on_lanes(cols, lanes.out[b]);
        for i in 0..cols {
            let (x, y) = p.orient.at((p.x, p.y), i, 0);
            // a column's groups (or, in bands, a channel's band of rows), as the layer
            // takes them; an embedding's columns each take every id
            let elems = match d.shape {
                Shape::Gather { t } => 0..t,
                _ => layer.column_words(cols, i),
            };
            host_lanes.push(HostLane {
                x,
                y,
                dir: p.orient.dir(Dir::N),
                colour: c,
                elems,
            });
        }
        if let (Shape::Gather { .. }, Kind::Dense { fwd, .. }) = (d.shape, &f.kernels[b].kind) {
            ids = Some((fwd.index() as u32, d.k));
        }
    } else {
        // a vector kernel's images lie planar, as it computes them
        if let Some((_, _, c)) = image(g, node) {
            channels = c;
        }
        // down the column, then through every lane of the strip (each keeps
        // its share)
        for &(x, y) in path {
            all.route((x, y), c, Route::new(Dir::N, &[Dir::S]))
                .map_err(LayoutError::DoesNotFit)?;
        }
        let n = lanes.out[b];
        for l in 0..n {
            let at = p.orient.at((p.x, p.y), 0, l);
            let rx = if l == 0 { Dir::N } else { p.orient.dir(Dir::N) };
            let tx: &[Dir] = if l + 1 < n {
                &[Dir::Ramp, p.orient.dir(Dir::S)]
            } else {
                &[Dir::Ramp]
            };
            all.route(at, c, Route::new(rx, tx))
                .map_err(LayoutError::DoesNotFit)?;
        }
        host_lanes.push(HostLane {
            x: p.x,
            y: 0,
            dir: Dir::N,
            colour: c,
            elems: 0..per,
        });
    }
    Ok(HostStream {
        node: node.index() as u32,
        name: stream_name(g, node),
        per_sample: per,
        channels,
        ids,
        lanes: host_lanes,
    })
}

/// The per-sample outputs the host collects: east from their kernel to the fabric's
/// east edge, their routes laid in `all`.
pub(super) fn outputs(
    sizer: &Sizer,
    placed: &[Placed],
    colours: &Colouring,
    all: &mut Laid,
) -> Result<Vec<HostStream>, LayoutError> {
    let (g, f, fab) = (sizer.g, sizer.f, sizer.fab);
    let mut outputs = Vec::new();
    for st in &f.streams {
        let Some(&c) = colours.colour_of.get(&st.node) else {
            continue;
        };
        let per = (g.ty(st.node).elements() / f.batch.max(1) as usize) as u32;
        if st.to.contains(&End::Host) {
            let End::Kernel(a) = st.from else { continue };
            let p = &placed[a];
            all.route((p.x, p.y), c, Route::new(Dir::Ramp, &[Dir::E]))
                .map_err(LayoutError::DoesNotFit)?;
            for &(x, y) in &colours.paths[&st.node] {
                all.route((x, y), c, Route::new(Dir::W, &[Dir::E]))
                    .map_err(LayoutError::DoesNotFit)?;
            }
            let x = fab.width - 1;
            outputs.push(HostStream {
                node: st.node.index() as u32,
                name: stream_name(g, st.node),
                per_sample: per,
                // an image comes back planar, as kernels keep it
                channels: image(g, st.node).map_or(0, |(_, _, c)| c),
                ids: None,
                lanes: vec![HostLane {
                    x,
                    y: p.y,
                    dir: Dir::E,
                    colour: c,
                    elems: 0..per,
                }],
            });
        }
    }
    Ok(outputs)
}

/// The simulator's host inputs of the host's streams (empty: values come each step).
pub fn host_inputs(streams: &[HostStream]) -> Vec<HostIn> {
    (streams.iter().flat_map(|h| h.lanes.iter()))
        .map(|l| HostIn {
            x: l.x,
            y: l.y,
            colour: l.colour,
            values: Vec::new(),
        })
        .collect()
}
