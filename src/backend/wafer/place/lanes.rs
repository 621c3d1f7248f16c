//! A sizing's lanes (each kernel's columns, rows, replicas and further parts' columns),
//! the kernels' shapes on them (a vector kernel's ops, a layer's dimensions and the
//! cycles of a layer on `w x h` PEs), and the staircase they are placed in.

use super::sizer::Cost;
use crate::backend::wafer::fabric::Fabric;
use crate::backend::wafer::form::{self, image, End, Formed, Kind};
use crate::backend::wafer::isa::{Colour, VecOp};
use crate::backend::wafer::kernels::dense::{Geom, Shape};
use crate::backend::wafer::kernels::vector::{Port, Vector};
use crate::backend::wafer::kernels::Orient;
use crate::ir::{DType, Graph, NodeIndex, Op, Padding};

/// Each kernel's input and output lanes.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Lanes {
    pub(super) inp: Vec<u32>,
    pub(super) out: Vec<u32>,
    /// A layer's further parts' input lanes (columns beside its own).
    pub(super) more: Vec<Vec<u32>>,
    /// A one-lane kernel's replicas (1: it runs on its lane; more: a dealer on the
    /// lane deals the samples to them, in the lanes after it).
    pub(super) reps: Vec<u32>,
}

impl Lanes {
    pub(super) fn new(kernels: usize) -> Lanes {
        Lanes {
            inp: vec![0; kernels],
            out: vec![0; kernels],
            more: vec![Vec::new(); kernels],
            reps: vec![1; kernels],
        }
    }

    /// Vector kernel `k`'s PEs along its layer's output edge: its lanes, or its
    /// dealer and replicas.
    pub(super) fn strip(&self, k: usize) -> u32 {
        match self.reps[k] {
            0 | 1 => self.out[k],
            r => 1 + r,
        }
    }

    /// Kernel `k`'s input lanes: its own and its further parts'.
    pub(super) fn columns(&self, k: usize) -> u32 {
        self.inp[k] + self.more[k].iter().sum::<u32>()
    }
}

/// The vector kernels of `f` that run on several lanes only when they softmax across
/// them (`Vector::across`).
pub(super) fn across_widens(g: &Graph, f: &Formed) -> Vec<usize> {
    (0..f.kernels.len())
        .filter(|&k| {
            matches!(f.kernels[k].kind, Kind::Vector { .. })
                && vector_of(g, f, k, ((f.batch, 0), false), |_| 0)
                    .width()
                    .is_none()
                && vector_of(g, f, k, ((f.batch, 0), true), |_| 0)
                    .width()
                    .is_some()
        })
        .collect()
}

/// Whether the layer before one-lane kernel `k` cannot fit on the rows it may then
/// take (one, or as many as a dealer of the most replicas gathers) on any PE of `fab`:
/// its weights (and their gradients) alone are more than a PE's memory when spread
/// over as many columns as the fabric has.
pub(super) fn one_lane_hopeless(g: &Graph, f: &Formed, fab: &Fabric, k: usize) -> bool {
    let Some(d) = k
        .checked_sub(1)
        .and_then(|l| dense_dims(g, f, &f.kernels[l].kind))
    else {
        return false;
    };
    let rows = 1 + super::search::MAX_REPS;
    let cols = fab.width.max(fab.height);
    let words = d.k.div_ceil(cols) as u64 * d.n.div_ceil(rows) as u64 * (1 + u64::from(d.train));
    words * crate::backend::wafer::cost::WORD as u64 > u64::from(fab.usable_bytes())
}

/// The vector kernel `k` with its streams (colours from `colour`), its softmaxes
/// across its lanes or not (`Vector::across`).
pub(super) fn vector_of<'a>(
    g: &'a Graph,
    f: &'a Formed,
    k: usize,
    ((window, fifo), across): ((u32, u32), bool),
    colour: impl Fn(NodeIndex) -> Colour,
) -> Vector<'a> {
    let mut v = Vector {
        g,
        f,
        k,
        inputs: Vec::new(),
        outputs: Vec::new(),
        window,
        fifo,
        rows: None,
        halo: None,
        across,
        widths: Default::default(),
        heads_memo: Default::default(),
        dealt: None,
    };
    // a residual's value and a side part's outputs come in after the outputs of the
    // layer before, which carries them; their gradients go out after that layer's
    // output gradient, in the same order
    let layer = k.checked_sub(1).and_then(|l| match &f.kernels[l].kind {
        Kind::Dense {
            fwd,
            dy,
            carry,
            more,
            ..
        } => Some((*fwd, *dy, carry.or(f.passed(l).copied()), more)),
        Kind::Vector { .. } => None,
    });
    // the layer after: its input and input gradient (a value it carries beside its
    // input goes to it after that input, and its gradient comes back after the input
    // gradient)
    let next = |k: usize| match f.kernels.get(k).map(|kr| &kr.kind) {
        Some(Kind::Dense { x, bwd, .. }) => Some((f.resolve(*x), bwd.map(|b| f.resolve(b)))),
        _ => None,
    };
    let beside = f.carries_beside(k + 1).map(|c| c.x);
    for st in &f.streams {
        let c = colour(st.node);
        if st.to.contains(&End::Kernel(k)) {
            let carried = f.carried_rank(st.node, k);
            let colour = match (layer, next(k + 1)) {
                (_, Some((_, Some(bwd)))) if carried > 0 && st.bwd => colour(bwd),
                (Some((fwd, ..)), _) if carried > 0 => colour(fwd),
                _ => c,
            };
            v.inputs.push(Port {
                node: st.node,
                colour,
                bwd: st.bwd,
                whole: st.from == End::Host,
                carried,
            });
        }
        if st.from == End::Kernel(k) && !(k > 0 && f.carried(st.node, k - 1)) {
            let (colour, carried) = match next(k + 1) {
                Some((x, _)) if beside == Some(st.node) => (colour(x), 1),
                _ => (c, 0),
            };
            v.outputs.push(Port {
                node: st.node,
                colour,
                bwd: st.bwd,
                whole: false,
                carried,
            });
        }
    }
    // a skip it passes on: its value in from the layer before beside that layer's
    // outputs and out to the layer after beside its own, its gradient the other way
    if let (Some(c), Some((fwd, ..)), Some((x, bwd))) = (f.passed(k), layer, next(k + 1)) {
        let port = |node, colour, bwd| Port {
            node,
            colour,
            bwd,
            whole: false,
            carried: 1,
        };
        v.inputs.push(port(c.x, colour(fwd), false));
        v.outputs.push(port(c.x, colour(x), false));
        if let (Some(skip), Some(bwd)) = (c.grad, bwd) {
            v.inputs.push(port(skip, colour(bwd), true));
        }
    }
    if let Some((_, Some(dy), carry, more)) = layer {
        let dy = f.resolve(dy);
        let skip = carry.and_then(|c| c.grad);
        let sides = more
            .iter()
            .filter(|p| p.beside() && p.dw.is_some())
            .filter_map(|p| p.dy);
        // (a residual's gradient that is the layer's output gradient is sent once)
        for (rank, node) in (1u8..).zip(std::iter::once(skip).chain(sides.map(Some))) {
            match node {
                Some(node) if node != dy => v.outputs.push(Port {
                    node,
                    colour: colour(dy),
                    bwd: true,
                    whole: false,
                    carried: rank,
                }),
                _ => {}
            }
        }
    }
    sorted(v)
}

/// Vector kernel `v` with each carried stream after what carries it.
pub(super) fn sorted(mut v: Vector<'_>) -> Vector<'_> {
    v.inputs.sort_by_key(|p| p.carried);
    v.outputs.sort_by_key(|p| p.carried);
    v
}

/// A layer's input and output groups (features or channels), whether it trains and
/// whether it sends `dx`, and what it computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Dims {
    pub(super) k: u32,
    pub(super) n: u32,
    pub(super) train: bool,
    pub(super) dx: bool,
    pub(super) shape: Shape,
    /// Its half precision when it computes in one (mixed precision).
    pub(super) half: Option<DType>,
}

/// A layer kernel's dimensions (`None` for a vector kernel).
pub(super) fn dense_dims(g: &Graph, f: &Formed, kind: &Kind) -> Option<Dims> {
    let Kind::Dense {
        w, x, fwd, dw, bwd, ..
    } = kind
    else {
        return None;
    };
    let ws: Vec<u32> = g.ty(*w).shape.iter().map(|&d| d as u32).collect();
    let made = form::product(g, kind).unwrap_or(*fwd);
    let (k, n, shape) = match (&g.node(made).op, image(g, *x), image(g, f.resolve(*x))) {
        (Op::Gather, _, _) => {
            let t = g.ty(*x).elements() / f.batch.max(1) as usize;
            (ws[0], ws[1], Shape::Gather { t: t as u32 })
        }
        (Op::Conv2d(c), Some((h, wd, _)), _) => {
            let dil = (c.dilation[0] as u32, c.dilation[1] as u32);
            let same = c.padding == Padding::Same;
            let stride = (c.strides[0] as u32, c.strides[1] as u32);
            let geom = Geom::new(h, wd, (ws[0], ws[1]), dil, stride, same)?;
            (ws[2], ws[3], Shape::Conv(geom))
        }
        // a transposed convolution: the geometry of the convolution whose input
        // gradient it is (its output plane that convolution's input)
        (Op::Conv2dBackpropInput(c), Some((h, wd, _)), _) => {
            let (ho, wo) = (g.ty(made).shape[1] as u32, g.ty(made).shape[2] as u32);
            let dil = (c.dilation[0] as u32, c.dilation[1] as u32);
            let same = c.padding == Padding::Same;
            let stride = (c.strides[0] as u32, c.strides[1] as u32);
            let geom = Geom::new(ho, wo, (ws[0], ws[1]), dil, stride, same)?;
            if (geom.ho, geom.wo) != (h, wd) {
                return None;
            }
            (ws[3], ws[2], Shape::ConvT(geom))
        }
        // each token of a sequence
        (Op::MatMul, _, _) if g.ty(*x).rank() == 3 => {
            let t = g.ty(*x).shape[1] as u32;
            (ws[0], ws[1], Shape::Tokens { t })
        }
        // an image flattened: its channels split over the columns
        (_, _, Some((h, wd, c))) => (c, ws[1], Shape::Planar { hw: h * wd }),
        _ => (ws[0], ws[1], Shape::Matmul),
    };
    Some(Dims {
        k,
        n,
        train: dw.is_some(),
        dx: bwd.is_some(),
        shape,
        half: Some(g.ty(made).dtype).filter(|d| VecOp::round_to(*d).is_some()),
    })
}

/// A product layer's cycles per sample on `w x h` lanes in the forward and the
/// backward pass, stalls aside (its program's operations, as `kernels/dense/` makes
/// them for a row of its own outputs alone).
pub(super) fn dense_period(fab: &Fabric, d: Dims, w: u32, h: u32) -> Cost {
    use crate::backend::wafer::cost::vec_op;
    use crate::backend::wafer::isa::VecOp::{Add, Fmac, Mov, Mul};
    let Dims {
        k, n, train, dx, ..
    } = d;
    // (a layer in half precision multiplies on the fp16 lanes)
    let (fmac, mul) = match d.half {
        Some(_) => (Fmac.halved(), Mul.halved()),
        None => (Fmac, Mul),
    };
    let (a, b) = (
        k.div_ceil(w.max(1)) * d.shape.per_in(),
        n.div_ceil(h.max(1)),
    );
    let sw = u64::from(fab.task_switch);
    // `count` multiply-adds of `len` elements: one two-dimensional operation
    let macs = |count: u32, len: u32| match count {
        0 => 0,
        _ => vec_op(fab, fmac, count * len, 3, true),
    };
    // `count` products of `len` elements summed: a multiply, then the multiply-adds
    let products = |count: u32, len: u32| match count {
        0 => vec_op(fab, Mov, len, 0, true),
        _ => vec_op(fab, mul, len, 2, true) + macs(count - 1, len),
    };
    let fwd = sw + vec_op(fab, Mov, a, 0, true) + products(a, b) + vec_op(fab, Add, b, 1, false);
    if !train {
        return [fwd, 0];
    }
    let back = if dx {
        products(b, a) + vec_op(fab, Add, a, 1, false)
    } else {
        0
    };
    [fwd, sw + vec_op(fab, Mov, b, 0, true) + back + macs(a, b)]
}

/// A kernel's place on a staircase: its north-west corner, its size on the fabric, its
/// orientation.
pub(super) type Stair = ((u32, u32), (u32, u32), Orient);

/// Each kernel's place on the staircase of a sizing (layers alternate orientation; a
/// strip keeps its layer's).
pub(super) fn staircase(f: &Formed, lanes: &Lanes) -> Vec<Stair> {
    let mut walk = Walk::default();
    (f.kernels.iter().enumerate())
        .map(|(k, kr)| match kr.kind {
            Kind::Dense { .. } => walk.layer(lanes.columns(k), lanes.out[k]),
            Kind::Vector { .. } => walk.strip(lanes.strip(k)),
        })
        .collect()
}

/// A staircase laid kernel by kernel: where the next kernel goes, the orientation of
/// the last, whether one is laid yet, and the extent so far (the sizer's chains keep
/// one as they size each kernel, and try a kernel's shape on a copy).
#[derive(Debug, Clone, Copy)]
pub(super) struct Walk {
    at: (u32, u32),
    orient: Orient,
    laid: bool,
    pub(super) extent: (u32, u32),
}

impl Default for Walk {
    fn default() -> Walk {
        Walk {
            at: (0, 0),
            orient: Orient::North,
            laid: false,
            extent: (0, 0),
        }
    }
}

impl Walk {
    /// A layer of `cols x rows` lanes laid next (turned from the kernel before's
    /// orientation, but for the first kernel).
    pub(super) fn layer(&mut self, cols: u32, rows: u32) -> Stair {
        if self.laid {
            self.orient = self.orient.flip();
        }
        self.lay(self.orient.size(cols, rows))
    }

    /// A strip of `lanes` lanes laid next, in the layer before's orientation.
    pub(super) fn strip(&mut self, lanes: u32) -> Stair {
        self.lay(self.orient.size(1, lanes))
    }

    fn lay(&mut self, size: (u32, u32)) -> Stair {
        let stair = (self.at, size, self.orient);
        self.at = match self.orient {
            Orient::North => (self.at.0 + size.0, self.at.1),
            Orient::West => (self.at.0, self.at.1 + size.1),
        };
        self.extent = (
            self.extent.0.max(stair.0 .0 + size.0),
            self.extent.1.max(stair.0 .1 + size.1),
        );
        self.laid = true;
        stair
    }
}
