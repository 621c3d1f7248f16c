//! Lowering: a checked graph (the part of it that computes some targets) becomes a
//! fixed sequence of kernels over buffers, with every shape, stride and offset known.
//!
//! Each node is one of:
//! - a **source**: an input, a variable, the global step, or a value given from outside
//!   (phase B reads phase A's results): it has a buffer;
//! - a **view** of another node's buffer (`transpose`, `reshape` of a contiguous view,
//!   `broadcast_to`, `slice`, `cross_shard_mean`): the same buffer, other strides, no
//!   kernel and no copy;
//! - **elemental** (unary, binary, select, cast, constants, `one_hot`, and views of
//!   values that have no buffer): computed inside the loop of the kernel that consumes
//!   it, at the index that kernel needs (XLA's loop fusion). It gets a buffer of its own
//!   (a loop kernel whose root it is) only when it is a target, has several users, or
//!   feeds a kernel that needs its operands in memory;
//! - a **kernel root**: a reduction (a loop kernel whose elemental operand is fused
//!   into it), `softmax` and `log_softmax` (a row kernel), `matmul` (a GEMM over strided
//!   views), and the ops run by native kernels (`check_indices`, `argmax`, `argmin`,
//!   `gather`, `scatter_add`, `concat`).
//!
//! Ops with no host kernel yet are `Unsupported`, reported as a diagnostic before
//! anything runs.

use crate::backend::window::Geo;
use crate::ir::{Conv, DType, Graph, NodeIndex, Op, TensorType};
use crate::span::Span;
use petgraph::visit::NodeIndexable;
use rustc_hash::{FxHashMap, FxHashSet};
use std::ops::Range;

/// How a dtype's elements are stored in host memory. Floats of every width are held as
/// f32 (f16 and bf16 rounded to their precision after every op, as the interpreter
/// does), booleans as one byte 0 or 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Elem {
    F32,
    I32,
    U8,
    I64,
}

impl Elem {
    pub fn of(d: DType) -> Option<Elem> {
        Some(match d {
            DType::F32 | DType::F16 | DType::BF16 => Elem::F32,
            DType::I32 => Elem::I32,
            DType::U8 | DType::Bool => Elem::U8,
            DType::I64 => Elem::I64,
            DType::Bytes => return None,
        })
    }

    pub fn size(self) -> usize {
        match self {
            Elem::F32 | Elem::I32 => 4,
            Elem::U8 => 1,
            Elem::I64 => 8,
        }
    }
}

/// What a buffer holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// A value computed by a kernel.
    Temp,
    /// A variable (resident between steps).
    Var(String),
    /// An input fed each step.
    Input(String),
    /// A byte-string input decoded by `decode_raw` as it is fed (node: the decode).
    Decoded(String, NodeIndex),
    /// The global step before the step.
    Step,
    /// The new value of a variable, written by its update into the variable's spare
    /// storage: committing the step swaps the variable's two storages (double
    /// buffering) instead of copying the value.
    Next(String),
}

#[derive(Debug, Clone)]
pub struct Buf {
    pub elem: Elem,
    pub len: usize,
    pub role: Role,
}

/// Where a value's elements are: element `i` (a multi-index) of the value is element
/// `offset + Σ i[k] * strides[k]` of the buffer.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct View {
    pub buf: usize,
    pub offset: i64,
    pub shape: Vec<usize>,
    pub strides: Vec<i64>,
}

impl View {
    pub fn contiguous(buf: usize, shape: &[usize]) -> View {
        View {
            buf,
            offset: 0,
            shape: shape.to_vec(),
            strides: row_major(shape),
        }
    }

    pub fn is_contiguous(&self) -> bool {
        // the strides of `row_major`, compared without making them
        let mut acc = 1i64;
        let row_major = self.shape.iter().zip(&self.strides).rev().all(|(&d, &s)| {
            let want = if d == 1 { 0 } else { acc };
            acc *= d as i64;
            s == want
        });
        (row_major && self.shape.len() == self.strides.len()) || self.len() <= 1
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// The buffer positions of every element, in row-major order of the value.
    pub fn positions(&self) -> Vec<usize> {
        let n = self.len();
        let mut out = Vec::with_capacity(n);
        let rank = self.shape.len();
        let mut idx = vec![0usize; rank];
        for _ in 0..n {
            let p: i64 = self.offset
                + idx
                    .iter()
                    .zip(&self.strides)
                    .map(|(&i, &s)| i as i64 * s)
                    .sum::<i64>();
            out.push(p as usize);
            for k in (0..rank).rev() {
                idx[k] += 1;
                if idx[k] < self.shape[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
        out
    }
}

pub fn row_major(shape: &[usize]) -> Vec<i64> {
    let mut s = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for k in (0..shape.len()).rev() {
        s[k] = if shape[k] == 1 { 0 } else { acc };
        acc *= shape[k] as i64;
    }
    s
}

/// A kernel of the lowered program.
#[derive(Debug, Clone)]
pub enum Kernel {
    /// A generated loop computing `root` (fusing its elemental operands) into `out`;
    /// a reduction when `root` is one.
    Loop(Loop),
    /// A generated row kernel: softmax or log-softmax along `axis`.
    Softmax {
        node: NodeIndex,
        log: bool,
        axis: usize,
        x: View,
        out: View,
    },
    /// `out = a · b` over the last two axes, batched over the leading ones.
    MatMul {
        node: NodeIndex,
        a: View,
        b: View,
        out: View,
    },
    /// A native kernel for one op.
    Native {
        node: NodeIndex,
        args: Vec<View>,
        out: View,
    },
    /// A generated direct convolution over a zero-padded NHWC input `x` (see
    /// `Direct`): the forward pass with filter `k` (also the input gradient: the padded
    /// output gradient convolved with the flipped, transposed filter), or, when
    /// `filter`, the filter gradient with `k` the output gradient.
    Conv {
        node: NodeIndex,
        filter: bool,
        x: View,
        k: View,
        out: View,
        d: Direct,
    },
    /// A generated max pooling of `x` into `out`, or with `dy` its gradient.
    MaxPool {
        node: NodeIndex,
        x: View,
        dy: Option<View>,
        out: View,
        geo: Geo,
    },
    /// A generated copy of NHWC `x` into the middle of zeroed `out`, `top` rows and
    /// `left` columns in: the padded input of direct convolutions.
    Pad {
        node: NodeIndex,
        x: View,
        out: View,
        top: usize,
        left: usize,
    },
}

/// The lanes of a direct convolution's vectors (AVX-512's; LLVM splits them on
/// narrower CPUs): its output channels (forward) or filter outputs (filter gradient)
/// come in multiples of them.
pub const LANES: usize = 16;

/// A direct convolution: `out[n, oy, ox, o] = Σ x[n, oy·sh + ky·dh, ox·sw + kx·dw, c] ·
/// k[ky, kx, c, o]` over its input zero-padded to `ih()` x `iw()` (`g.pt` rows and
/// `g.pl` columns in); taps on the padding rows are skipped (they read zeros). The
/// filter gradient sums the same products into `out[ky, kx, c, o]` over every
/// `(n, oy, ox)`.
#[derive(Debug, Clone, Copy)]
pub struct Direct {
    /// The unpadded input, the output's pixels, the window, strides, dilation and
    /// padding.
    pub g: Geo,
    /// Output channels.
    pub o: usize,
}

impl Direct {
    /// Rows of the padded input: the real ones after the padding, and as many as the
    /// last window reaches.
    pub fn ih(&self) -> usize {
        let g = &self.g;
        (g.h + g.pt).max((g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1)
    }

    /// Columns of the padded input.
    pub fn iw(&self) -> usize {
        let g = &self.g;
        (g.w + g.pl).max((g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1)
    }

    /// The padded input's rows that hold input.
    pub fn rows(&self) -> (usize, usize) {
        (self.g.pt, self.g.pt + self.g.h)
    }

    /// The padded input's columns that hold input.
    pub fn cols(&self) -> (usize, usize) {
        (self.g.pl, self.g.pl + self.g.w)
    }

    /// Output-channel vectors per register block: two when they pair up.
    pub fn block(&self) -> usize {
        if (self.o / LANES).is_multiple_of(2) {
            2
        } else {
            1
        }
    }

    /// Register blocks along the output channels.
    pub fn blocks(&self) -> usize {
        self.o / LANES / self.block()
    }
}

impl Kernel {
    /// The node the kernel computes.
    pub fn node(&self) -> NodeIndex {
        match self {
            Kernel::Loop(l) => l.root,
            Kernel::Softmax { node, .. }
            | Kernel::MatMul { node, .. }
            | Kernel::Native { node, .. }
            | Kernel::Conv { node, .. }
            | Kernel::MaxPool { node, .. }
            | Kernel::Pad { node, .. } => *node,
        }
    }

    /// What kind of kernel it is, for profiles.
    pub fn kind(&self) -> &'static str {
        match self {
            Kernel::Loop(_) => "loop",
            Kernel::Softmax { .. } => "softmax",
            Kernel::MatMul { .. } => "gemm",
            Kernel::Native { .. } => "native",
            Kernel::Conv { filter: true, .. } => "conv filter grad",
            Kernel::Conv { .. } => "conv",
            Kernel::Pad { .. } => "pad",
            Kernel::MaxPool { dy: None, .. } => "max pool",
            Kernel::MaxPool { .. } => "max pool grad",
        }
    }

    /// The view the kernel writes.
    pub fn out(&self) -> &View {
        match self {
            Kernel::Loop(l) => &l.out,
            Kernel::Softmax { out, .. }
            | Kernel::MatMul { out, .. }
            | Kernel::Native { out, .. }
            | Kernel::Conv { out, .. }
            | Kernel::MaxPool { out, .. }
            | Kernel::Pad { out, .. } => out,
        }
    }

    /// Every buffer the kernel reads or writes.
    pub fn bufs(&self) -> Vec<usize> {
        let views: Vec<&View> = match self {
            Kernel::Loop(l) => l.leaves.iter().map(|x| &x.1).chain([&l.out]).collect(),
            Kernel::Softmax { x, out, .. } => vec![x, out],
            Kernel::MatMul { a, b, out, .. } => vec![a, b, out],
            Kernel::Native { args, out, .. } => args.iter().chain([out]).collect(),
            Kernel::Conv { x, k, out, .. } => vec![x, k, out],
            Kernel::Pad { x, out, .. } => vec![x, out],
            Kernel::MaxPool { x, dy, out, .. } => [x, out].into_iter().chain(dy).collect(),
        };
        views.iter().map(|v| v.buf).collect()
    }

    /// The extent of a generated kernel's outermost loop (1 for a kernel without loops).
    pub fn outer(&self, g: &Graph) -> usize {
        let first = |s: &[usize]| s.first().copied().unwrap_or(1);
        match self {
            Kernel::Loop(l) => match &g.node(l.root).op {
                // a reduction loops over its operand, or once when it reduces every axis
                Op::Reduce { axes, .. } if !l.is_copy() => {
                    let xs = &g.node(g.operands(l.root)[0]).ty.shape;
                    if axes.len() == xs.len() {
                        1
                    } else {
                        first(xs)
                    }
                }
                _ => first(&l.out.shape),
            },
            Kernel::Softmax { x, axis, .. } => {
                let rows: Vec<usize> = (0..x.shape.len())
                    .filter(|k| k != axis)
                    .map(|k| x.shape[k])
                    .collect();
                first(&rows)
            }
            Kernel::MatMul { .. } | Kernel::Native { .. } => 1,
            // the filter gradient's tasks: kernel rows x output-channel blocks
            Kernel::Conv {
                filter: true, d, ..
            } => d.g.kh * d.blocks(),
            Kernel::Conv { d, .. } => d.g.n,
            Kernel::Pad { out, .. } => out.shape[0],
            Kernel::MaxPool { geo, .. } => geo.n,
        }
    }
}

impl Loop {
    /// Whether the loop copies its root's (strided) view into contiguous memory rather
    /// than computing it.
    pub fn is_copy(&self) -> bool {
        self.leaves.iter().any(|x| x.0 == self.root)
    }

    /// The same loop over fewer axes, when it computes plain elementwise ops on
    /// values of its output's shape: the axes after the first (the one tasks and
    /// chains split) merge wherever every view steps through them as through one, and
    /// size-1 axes go. A relu over f32[n, 14, 14, 64] becomes a loop over
    /// [n, 12544]: one inner loop for LLVM to vectorise instead of three, which
    /// compiles in less time and runs without the inner loops' remainders.
    pub fn collapsed(&self, g: &Graph) -> Loop {
        let shape = &self.out.shape;
        let leaves: FxHashMap<NodeIndex, &View> =
            self.leaves.iter().map(|(n, v)| (*n, v)).collect();
        if shape.len() < 3 || !plain(g, self.root, &leaves, shape) {
            return self.clone();
        }
        let views: Vec<&View> = std::iter::once(&self.out)
            .chain(self.leaves.iter().map(|l| &l.1))
            .collect();
        if views.iter().any(|v| v.shape != *shape) {
            return self.clone();
        }
        // the axes of the result, as positions in the original: each a run of axes
        let mut runs: Vec<Range<usize>> = std::iter::once(0..1).collect();
        for (k, &d) in shape.iter().enumerate().skip(1) {
            if d == 1 {
                continue;
            }
            let last = runs.len() - 1;
            let joins = last > 0 && {
                let j = runs[last].end - 1;
                views
                    .iter()
                    .all(|v| v.strides[j] == v.strides[k] * d as i64)
            };
            if joins {
                runs[last].end = k + 1;
            } else {
                runs.push(k..k + 1);
            }
        }
        let merge = |v: &View| View {
            buf: v.buf,
            offset: v.offset,
            shape: runs
                .iter()
                .map(|r| shape[r.clone()].iter().product())
                .collect(),
            strides: runs.iter().map(|r| v.strides[r.end - 1]).collect(),
        };
        Loop {
            root: self.root,
            leaves: self.leaves.iter().map(|(n, v)| (*n, merge(v))).collect(),
            out: merge(&self.out),
        }
    }
}

/// Whether the tree under `n` (down to `leaves`) is elementwise ops on values of
/// `shape` (and constants), whose index is the output's whatever the axes.
fn plain(g: &Graph, n: NodeIndex, leaves: &FxHashMap<NodeIndex, &View>, shape: &[usize]) -> bool {
    let node = g.node(n);
    if leaves.contains_key(&n) {
        return node.ty.shape[..] == *shape;
    }
    match node.op {
        Op::Const { .. } => true,
        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast | Op::BroadcastTo => {
            node.ty.shape[..] == *shape && g.operands(n).iter().all(|&o| plain(g, o, leaves, shape))
        }
        _ => false,
    }
}

/// Whether a reduction over `axes` of a rank-`rank` value reduces its trailing axes
/// (every kept axis comes before every reduced one).
pub fn reduces_trailing(rank: usize, axes: &[usize]) -> bool {
    (0..rank)
        .filter(|k| !axes.contains(k))
        .enumerate()
        .all(|(i, k)| i == k)
}

#[derive(Debug, Clone)]
pub struct Loop {
    pub root: NodeIndex,
    /// The values it reads from memory, by node.
    pub leaves: Vec<(NodeIndex, View)>,
    pub out: View,
}

/// Every buffer of an executable, shared by its phases.
#[derive(Debug, Default, Clone)]
pub struct Bufs {
    pub bufs: Vec<Buf>,
    vars: FxHashMap<String, usize>,
    inputs: FxHashMap<String, usize>,
    decoded: FxHashMap<NodeIndex, usize>,
    step: Option<usize>,
}

impl Bufs {
    fn add(&mut self, elem: Elem, len: usize, role: Role) -> usize {
        self.bufs.push(Buf { elem, len, role });
        self.bufs.len() - 1
    }

    fn shared(&mut self, elem: Elem, len: usize, role: Role) -> usize {
        let existing = match &role {
            Role::Var(n) => self.vars.get(n).copied(),
            Role::Input(n) => self.inputs.get(n).copied(),
            Role::Decoded(_, node) => self.decoded.get(node).copied(),
            Role::Step => self.step,
            Role::Temp | Role::Next(_) => None,
        };
        if let Some(b) = existing {
            return b;
        }
        let b = self.add(elem, len, role.clone());
        match role {
            Role::Var(n) => {
                self.vars.insert(n, b);
            }
            Role::Input(n) => {
                self.inputs.insert(n, b);
            }
            Role::Decoded(_, node) => {
                self.decoded.insert(node, b);
            }
            Role::Step => self.step = Some(b),
            Role::Temp | Role::Next(_) => {}
        }
        b
    }
}

impl Bufs {
    /// The buffer of a variable, when a kernel of the program reads it.
    pub fn var(&self, name: &str) -> Option<usize> {
        self.vars.get(name).copied()
    }
}

/// An op the host backend has no kernel for (yet).
#[derive(Debug, Clone)]
pub struct Unsupported {
    pub span: Span,
    pub op: &'static str,
    pub why: String,
}

/// The kernels computing `targets` (given the views of `provided` nodes), appended to
/// `bufs`; returns the kernels and the view of every target.
pub fn lower(
    g: &Graph,
    targets: &[NodeIndex],
    provided: &FxHashMap<NodeIndex, View>,
    bufs: &mut Bufs,
) -> Result<(Vec<Kernel>, FxHashMap<NodeIndex, View>), Unsupported> {
    let bound = g.g.node_bound();
    let order = g.schedule(targets, |n| provided.contains_key(&n));
    // Users within the computed part; a target counts as one more.
    let mut users = vec![0usize; bound];
    let mut feeds_kernel = vec![false; bound];
    for &n in &order {
        for o in g.operands(n) {
            users[o.index()] += 1;
            if needs_memory(&g.node(n).op) {
                feeds_kernel[o.index()] = true;
            }
        }
    }
    for t in targets {
        users[t.index()] += 1;
    }
    let mut l = Lowering {
        g,
        bufs,
        views: provided.clone(),
        padded: FxHashMap::default(),
        kernels: Vec::new(),
    };
    for &n in &order {
        l.node(n, users[n.index()], feeds_kernel[n.index()])?;
    }
    let mut out = FxHashMap::default();
    for &t in targets {
        let v = l.materialize(t);
        out.insert(t, v);
    }
    Ok((l.kernels, out))
}

/// Whether an op reads its operands from memory (so that an elemental operand must be
/// given a buffer first).
fn needs_memory(op: &Op) -> bool {
    !matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast
            | Op::Const { .. }
            | Op::OneHot { .. }
            | Op::Iota { .. }
            | Op::Reduce { .. }
            | Op::Transpose { .. }
            | Op::BroadcastTo
            | Op::Slice { .. }
            | Op::CrossShardMean
            | Op::Reshape
    )
}

struct Lowering<'a> {
    g: &'a Graph,
    bufs: &'a mut Bufs,
    /// Nodes whose value is in memory.
    views: FxHashMap<NodeIndex, View>,
    /// Zero-padded copies of values, by node and (rows, columns, top, left).
    padded: FxHashMap<(NodeIndex, [usize; 4]), View>,
    kernels: Vec<Kernel>,
}

impl Lowering<'_> {
    fn ty(&self, n: NodeIndex) -> &TensorType {
        &self.g.node(n).ty
    }

    fn elem(&self, n: NodeIndex) -> Result<Elem, Unsupported> {
        Elem::of(self.ty(n).dtype).ok_or_else(|| self.unsupported(n, "byte strings"))
    }

    fn unsupported(&self, n: NodeIndex, why: &str) -> Unsupported {
        let node = self.g.node(n);
        Unsupported {
            span: node.span,
            op: node.op.name(),
            why: why.to_string(),
        }
    }

    /// A fresh contiguous buffer for `n`'s value.
    fn temp(&mut self, n: NodeIndex) -> View {
        let ty = self.ty(n).clone();
        let elem = Elem::of(ty.dtype).unwrap_or(Elem::U8);
        let b = self.bufs.add(elem, ty.shape.iter().product(), Role::Temp);
        View::contiguous(b, &ty.shape)
    }

    /// `n`'s value in memory: its view, or a loop kernel computing it into a buffer.
    fn materialize(&mut self, n: NodeIndex) -> View {
        if let Some(v) = self.views.get(&n) {
            return v.clone();
        }
        let out = self.temp(n);
        let leaves = self.leaves(n);
        self.kernels.push(Kernel::Loop(Loop {
            root: n,
            leaves,
            out: out.clone(),
        }));
        self.views.insert(n, out.clone());
        out
    }

    /// `n`'s value in memory, contiguous (copied when its view is not).
    fn contiguous(&mut self, n: NodeIndex) -> View {
        let v = self.materialize(n);
        if v.is_contiguous() && v.offset == 0 {
            return v;
        }
        let out = self.temp(n);
        self.kernels.push(Kernel::Loop(Loop {
            root: n,
            leaves: vec![(n, v)],
            out: out.clone(),
        }));
        out
    }

    /// The nodes in memory that a loop computing `n` reads (stopping at them).
    fn leaves(&self, n: NodeIndex) -> Vec<(NodeIndex, View)> {
        let mut seen = FxHashSet::default();
        let mut out = Vec::new();
        let mut stack: Vec<NodeIndex> = self.g.operands(n).into_iter().collect();
        while let Some(m) = stack.pop() {
            if !seen.insert(m) {
                continue;
            }
            if let Some(v) = self.views.get(&m) {
                out.push((m, v.clone()));
            } else {
                stack.extend(self.g.operands(m));
            }
        }
        out.sort_by_key(|x| x.0);
        out
    }

    fn node(&mut self, n: NodeIndex, users: usize, feeds_kernel: bool) -> Result<(), Unsupported> {
        let g = self.g;
        let node = g.node(n);
        let shape: Vec<usize> = node.ty.shape.to_vec();
        let ops = g.operands(n);
        match &node.op {
            // a byte-string input has no buffer: `decode_raw` decodes it as it is fed
            Op::Input { .. } if node.ty.dtype == DType::Bytes => {}
            Op::Input { name } => {
                let elem = self.elem(n)?;
                let b = self
                    .bufs
                    .shared(elem, shape.iter().product(), Role::Input(name.clone()));
                self.views.insert(n, View::contiguous(b, &shape));
            }
            Op::Variable { name, .. } => {
                let elem = self.elem(n)?;
                let b = self
                    .bufs
                    .shared(elem, shape.iter().product(), Role::Var(name.clone()));
                self.views.insert(n, View::contiguous(b, &shape));
            }
            Op::GlobalStep => {
                let b = self.bufs.shared(Elem::I64, 1, Role::Step);
                self.views.insert(n, View::contiguous(b, &shape));
            }
            Op::Transpose { perm } => {
                if let Some(v) = self.views.get(&ops[0]).cloned() {
                    self.views.insert(
                        n,
                        View {
                            buf: v.buf,
                            offset: v.offset,
                            shape: shape.clone(),
                            strides: perm.iter().map(|&p| v.strides[p]).collect(),
                        },
                    );
                } else if users > 1 || feeds_kernel {
                    self.materialize(n);
                }
            }
            Op::BroadcastTo => {
                if let Some(v) = self.views.get(&ops[0]).cloned() {
                    let lead = shape.len() - v.shape.len();
                    let strides = (0..shape.len())
                        .map(|k| {
                            if k < lead || v.shape[k - lead] != shape[k] {
                                0
                            } else {
                                v.strides[k - lead]
                            }
                        })
                        .collect();
                    self.views.insert(
                        n,
                        View {
                            buf: v.buf,
                            offset: v.offset,
                            shape: shape.clone(),
                            strides,
                        },
                    );
                } else if users > 1 || feeds_kernel {
                    self.materialize(n);
                }
            }
            Op::Slice { axis, start, .. } => {
                if let Some(v) = self.views.get(&ops[0]).cloned() {
                    self.views.insert(
                        n,
                        View {
                            buf: v.buf,
                            offset: v.offset + *start as i64 * v.strides[*axis],
                            shape: shape.clone(),
                            strides: v.strides.clone(),
                        },
                    );
                } else if users > 1 || feeds_kernel {
                    self.materialize(n);
                }
            }
            Op::CrossShardMean => {
                // The runtime's average over shards happens between the phases; within
                // a phase it is the identity.
                let v = self.materialize(ops[0]);
                self.views.insert(n, v);
            }
            Op::Reshape => {
                let v = self.contiguous(ops[0]);
                self.views.insert(
                    n,
                    View {
                        buf: v.buf,
                        offset: v.offset,
                        shape: shape.clone(),
                        strides: row_major(&shape),
                    },
                );
            }
            Op::Unary(_)
            | Op::Binary(_)
            | Op::Select
            | Op::Cast
            | Op::OneHot { .. }
            | Op::Iota { .. }
            | Op::Const { .. } => {
                self.elem(n)?;
                let konst = matches!(node.op, Op::Const { .. });
                if feeds_kernel || (users > 1 && !konst) {
                    self.materialize(n);
                }
            }
            Op::Reduce { .. } => {
                self.elem(n)?;
                self.materialize(n);
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                let x = self.materialize(ops[0]);
                let out = self.temp(n);
                self.kernels.push(Kernel::Softmax {
                    node: n,
                    log: matches!(node.op, Op::LogSoftmax { .. }),
                    axis: *axis,
                    x,
                    out: out.clone(),
                });
                self.views.insert(n, out);
            }
            Op::MatMul => {
                if node.ty.dtype.is_float() {
                    let a = self.materialize(ops[0]);
                    let b = self.materialize(ops[1]);
                    let out = self.temp(n);
                    self.kernels.push(Kernel::MatMul {
                        node: n,
                        a,
                        b,
                        out: out.clone(),
                    });
                    self.views.insert(n, out);
                } else {
                    self.native(n, &ops, 0)?;
                }
            }
            Op::CheckIndices { .. }
            | Op::Concat { .. }
            | Op::ArgMax { .. }
            | Op::ArgMin { .. }
            | Op::Gather
            | Op::ScatterAdd
            | Op::RandomUniform { .. }
            | Op::RandomNormal { .. }
            | Op::AvgPool2d(_)
            | Op::AvgPool2dGrad(_) => self.native(n, &ops, 0)?,
            Op::MaxPool2d(p) | Op::MaxPool2dGrad(p) => {
                if node.ty.dtype == DType::F32 {
                    let x = self.contiguous(ops[0]);
                    let dy = (ops.len() > 1).then(|| self.contiguous(ops[1]));
                    let pooled = dy.as_ref().map_or(&shape, |d| &d.shape);
                    let geo = Geo::pool(&x.shape, pooled, p);
                    let out = self.temp(n);
                    self.kernels.push(Kernel::MaxPool {
                        node: n,
                        x,
                        dy,
                        out: out.clone(),
                        geo,
                    });
                    self.views.insert(n, out);
                } else {
                    self.native(n, &ops, 0)?;
                }
            }
            Op::Conv2d(c) | Op::Conv2dBackpropInput(c) | Op::Conv2dBackpropFilter(c)
                if self.direct(n, c)? => {}
            // the GEMM of a convolution works on patch rows, in a scratch buffer of
            // [output pixels, kh * kw * c]
            Op::Conv2d(_) | Op::Conv2dBackpropInput(_) | Op::Conv2dBackpropFilter(_) => {
                let t = |i: usize| self.ty(ops[i]).shape.to_vec();
                let (pixels, window, c) = match &node.op {
                    Op::Conv2d(_) => (shape.clone(), t(1), t(0)[3]),
                    Op::Conv2dBackpropInput(_) => (t(0), t(1), shape[3]),
                    _ => (t(1), shape.clone(), t(0)[3]),
                };
                let len = pixels[..3].iter().product::<usize>() * window[0] * window[1] * c;
                self.native(n, &ops, len)?;
            }
            Op::Lookup { .. } | Op::HashBucket { .. } => {
                return Err(self.unsupported(
                    n,
                    "strings: look them up in the input pipeline's `map`, which gives the model integer ids",
                ));
            }
            Op::DecodeImage { .. } => {
                return Err(self.unsupported(
                    n,
                    "encoded images: decode them in the input pipeline's `map`, which gives the model pixels",
                ));
            }
            Op::DecodeRaw => {
                let input = ops[0];
                match &g.node(input).op {
                    Op::Input { name } => {
                        let elem = self.elem(n)?;
                        let b = self.bufs.shared(
                            elem,
                            shape.iter().product(),
                            Role::Decoded(name.clone(), n),
                        );
                        self.views.insert(n, View::contiguous(b, &shape));
                    }
                    _ => {
                        return Err(self.unsupported(
                            n,
                            "on the host, `decode_raw` decodes byte strings as they are fed, so its operand must be an input",
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    /// Lowers convolution `n` to a generated direct kernel when it fits one (f32, its
    /// vector channels a multiple of `LANES`; the input gradient at stride 1, the
    /// filter gradient at column dilation 1); false when it does not.
    fn direct(&mut self, n: NodeIndex, c: &Conv) -> Result<bool, Unsupported> {
        let g = self.g;
        let node = g.node(n);
        let ops = g.operands(n);
        let s = |i: usize| g.node(ops[i]).ty.shape.to_vec();
        let shape = node.ty.shape.to_vec();
        if node.ty.dtype != DType::F32 {
            return Ok(false);
        }
        // (input, output) NHWC shapes of the forward convolution and its window
        let (x, y, window) = match &node.op {
            Op::Conv2d(_) => (s(0), shape.clone(), s(1)),
            Op::Conv2dBackpropInput(_) => (shape.clone(), s(0), s(1)),
            _ => (s(0), s(1), shape.clone()),
        };
        let geo = Geo::conv(&x, &y, [window[0], window[1]], c);
        let fwd = Direct { g: geo, o: y[3] };
        let (filter, xv, kv, d) = match &node.op {
            Op::Conv2d(_) => {
                if !fwd.o.is_multiple_of(LANES) {
                    return Ok(false);
                }
                (
                    false,
                    self.padded(ops[0], &fwd),
                    self.contiguous(ops[1]),
                    fwd,
                )
            }
            Op::Conv2dBackpropFilter(_) => {
                if !fwd.o.is_multiple_of(LANES) || geo.dw != 1 {
                    return Ok(false);
                }
                (
                    true,
                    self.padded(ops[0], &fwd),
                    self.contiguous(ops[1]),
                    fwd,
                )
            }
            _ => {
                // dx is the stride-1 convolution of dy, padded by the rest of the
                // window, with the filter flipped and its channels swapped
                let (ek, ew) = ((geo.kh - 1) * geo.dh, (geo.kw - 1) * geo.dw);
                if !geo.c.is_multiple_of(LANES)
                    || geo.sh != 1
                    || geo.sw != 1
                    || geo.pt > ek
                    || geo.pl > ew
                {
                    return Ok(false);
                }
                let g = Geo {
                    h: geo.oh,
                    w: geo.ow,
                    c: y[3],
                    oh: geo.h,
                    ow: geo.w,
                    pt: ek - geo.pt,
                    pl: ew - geo.pl,
                    ..geo
                };
                let d = Direct { g, o: geo.c };
                // (the filter first: the padding then runs right before the kernel
                // and chains with it)
                let w = self.materialize(ops[1]);
                let st = &w.strides;
                let flipped = View {
                    buf: w.buf,
                    offset: w.offset + (geo.kh as i64 - 1) * st[0] + (geo.kw as i64 - 1) * st[1],
                    shape: vec![geo.kh, geo.kw, y[3], geo.c],
                    strides: vec![-st[0], -st[1], st[3], st[2]],
                };
                let b = self.bufs.add(Elem::F32, flipped.len(), Role::Temp);
                let kv = View::contiguous(b, &flipped.shape);
                self.kernels.push(Kernel::Loop(Loop {
                    root: ops[1],
                    leaves: vec![(ops[1], flipped)],
                    out: kv.clone(),
                }));
                (false, self.padded(ops[0], &d), kv, d)
            }
        };
        let out = self.temp(n);
        self.kernels.push(Kernel::Conv {
            node: n,
            filter,
            x: xv,
            k: kv,
            out: out.clone(),
            d,
        });
        self.views.insert(n, out);
        Ok(true)
    }

    /// NHWC value `n` zero-padded as direct convolution `d` reads it (its own buffer
    /// when it needs no padding); a forward convolution and its filter gradient share
    /// one.
    fn padded(&mut self, n: NodeIndex, d: &Direct) -> View {
        let x = self.contiguous(n);
        let s = x.shape.clone();
        let (top, left) = (d.g.pt, d.g.pl);
        let key = (n, [d.ih(), d.iw(), top, left]);
        if key.1 == [s[1], s[2], 0, 0] {
            return x;
        }
        if let Some(v) = self.padded.get(&key) {
            return v.clone();
        }
        let shape = [s[0], d.ih(), d.iw(), s[3]];
        let b = self.bufs.add(Elem::F32, shape.iter().product(), Role::Temp);
        let out = View::contiguous(b, &shape);
        self.kernels.push(Kernel::Pad {
            node: n,
            x,
            out: out.clone(),
            top,
            left,
        });
        self.padded.insert(key, out.clone());
        out
    }

    /// A native kernel for `n` over its operands in contiguous memory, and (when
    /// `scratch` is not 0) a scratch buffer of that many f32 as its last argument.
    fn native(
        &mut self,
        n: NodeIndex,
        ops: &[NodeIndex],
        scratch: usize,
    ) -> Result<(), Unsupported> {
        self.elem(n)?;
        let mut args = Vec::new();
        for &o in ops {
            self.elem(o)?;
            args.push(self.contiguous(o));
        }
        if scratch > 0 {
            let b = self.bufs.add(Elem::F32, scratch, Role::Temp);
            args.push(View::contiguous(b, &[scratch]));
        }
        let out = self.temp(n);
        self.kernels.push(Kernel::Native {
            node: n,
            args,
            out: out.clone(),
        });
        self.views.insert(n, out);
        Ok(())
    }
}

/// How a kernel's outer loop touches memory when each of its iterations `i` writes
/// only slab `i` (index `i` of the leading axis) of its output.
struct Rows<'a> {
    outer: usize,
    /// Views read only at index `i` of their leading axis by iteration `i`.
    rows: Vec<&'a View>,
    /// Views that any iteration may read anywhere.
    whole: Vec<&'a View>,
    out: &'a View,
}

impl Kernel {
    /// The kernel's slabs, when it is a generated kernel that works slab by slab over
    /// its output's leading axis: an elementwise loop, a forward convolution, a
    /// padding copy, a max pooling or its gradient.
    fn rows(&self, g: &Graph) -> Option<Rows<'_>> {
        if self.bufs().len() > MAX_TABLE {
            return None;
        }
        let (outer, rows, whole, out) = match self {
            Kernel::Loop(l) => {
                if matches!(g.node(l.root).op, Op::Reduce { .. }) && !l.is_copy() {
                    return None;
                }
                // a leaf of the output's shape under elementwise ops alone is read
                // at the output's own index
                let elementwise = |n: NodeIndex| {
                    matches!(
                        g.node(n).op,
                        Op::Unary(_) | Op::Binary(_) | Op::Select | Op::Cast | Op::Const { .. }
                    )
                };
                let mut aligned = true;
                let mut stack = vec![l.root];
                let mut seen = FxHashSet::default();
                while let Some(n) = stack.pop() {
                    if !seen.insert(n) || l.leaves.iter().any(|x| x.0 == n) {
                        continue;
                    }
                    aligned &= elementwise(n);
                    stack.extend(g.operands(n));
                }
                let (rows, whole) = l
                    .leaves
                    .iter()
                    .map(|x| &x.1)
                    .partition(|v| aligned && v.shape == l.out.shape);
                (*l.out.shape.first()?, rows, whole, &l.out)
            }
            Kernel::Conv {
                filter: false,
                x,
                k,
                out,
                d,
                ..
            } => (d.g.n, vec![x], vec![k], out),
            Kernel::Pad { x, out, .. } => (out.shape[0], vec![x], vec![], out),
            Kernel::MaxPool {
                x, dy, out, geo, ..
            } => (geo.n, [x].into_iter().chain(dy).collect(), vec![], out),
            _ => return None,
        };
        Some(Rows {
            outer,
            rows,
            whole,
            out,
        })
    }
}

/// The most buffers a kernel of a chain may have (the runtime patches a copy of its
/// table on the stack).
pub const MAX_TABLE: usize = 32;

/// A buffer that only one chain touches, held as one slab per part of a split: the
/// slab's bytes, and the distance between the parts' slabs (aligned).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Local {
    pub slab: usize,
    pub stride: usize,
}

/// Whether `v` is a whole buffer laid out as `outer` contiguous slabs.
fn slabs(v: &View, outer: usize) -> bool {
    v.offset == 0 && v.shape.first() == Some(&outer) && v.is_contiguous()
}

/// Orders the kernels in runs that may execute slab by slab: for each slab `i` of
/// their common outer loop, every kernel of the run in turn (a padding, a convolution,
/// its bias and activation, and a pooling, one image at a time while the image is in
/// cache: loop fusion along the outer axis, as TVM's `compute_at`). A kernel joins a
/// run when it has the same outer extent, reads what the run wrote only at its own
/// slab (through a view of the same slabs), and writes a fresh temporary that nothing
/// in the run read; it moves up to the run past kernels whose outputs it does not
/// read. Every element is computed by the same code as when the kernels run one after
/// the other, so results are the same bits. Returns each run as a range of the
/// reordered `kernels`; a kernel that joins nothing is a run of one.
pub fn chains(kernels: &mut Vec<Kernel>, g: &Graph, bufs: &Bufs) -> Vec<std::ops::Range<usize>> {
    let joins = |r: &Rows, outer: usize| {
        r.outer == outer
            && outer > 1
            && bufs.bufs[r.out.buf].role == Role::Temp
            && slabs(r.out, outer)
    };
    // whether kernel `k` may run slab by slab after `run`
    let fits = |run: &[Kernel], k: &Kernel, outer: usize| {
        let Some(r) = k.rows(g).filter(|r| joins(r, outer)) else {
            return false;
        };
        let rows: Vec<Rows> = run.iter().filter_map(|k| k.rows(g)).collect();
        let written = |b: usize| rows.iter().find(|r| r.out.buf == b).map(|r| r.out);
        let aligned = |v: &&View| {
            written(v.buf).is_none_or(|p| slabs(p, outer) && slabs(v, outer) && p.len() == v.len())
        };
        let read = |b: usize| {
            rows.iter()
                .any(|r| r.rows.iter().chain(&r.whole).any(|v| v.buf == b))
        };
        r.rows.iter().all(aligned)
            && r.whole.iter().all(|v| written(v.buf).is_none())
            && !read(r.out.buf)
            && written(r.out.buf).is_none()
    };
    // every kernel moves up to just after the kernels it reads from (its output is
    // fresh: nothing before it reads it), so that what a run needs from outside it is
    // ready before the run starts
    for m in 0..kernels.len() {
        let k = &kernels[m];
        if bufs.bufs[k.out().buf].role != Role::Temp {
            continue;
        }
        let reads = k.bufs();
        let to = (0..m)
            .rev()
            .find(|&p| reads.contains(&kernels[p].out().buf))
            .map_or(0, |p| p + 1);
        let k = kernels.remove(m);
        kernels.insert(to, k);
    }
    let mut runs = Vec::new();
    let mut i = 0;
    while i < kernels.len() {
        let mut j = i + 1;
        if let Some(outer) = kernels[i]
            .rows(g)
            .filter(|r| joins(r, r.outer))
            .map(|r| r.outer)
        {
            // the next kernel that fits, from those that need nothing skipped over
            while let Some(m) = (j..kernels.len())
                .scan(FxHashSet::default(), |skipped, m| {
                    let k = &kernels[m];
                    let free = k.bufs().iter().all(|b| !skipped.contains(b));
                    skipped.insert(k.out().buf);
                    Some((m, free && fits(&kernels[i..j], k, outer)))
                })
                .find_map(|(m, ok)| ok.then_some(m))
            {
                let k = kernels.remove(m);
                kernels.insert(j, k);
                j += 1;
            }
        }
        runs.push(i..j);
        i = j;
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::UnaryOp;

    /// relu(x) into `out`, with x read through `x`.
    fn relu(shape: &[usize], x: View, out: View) -> (Graph, Loop) {
        let mut g = Graph::new();
        let ty = TensorType::new(DType::F32, shape.to_vec());
        let at = Span::default();
        let xn = g.add(Op::Input { name: "x".into() }, &[], ty.clone(), at);
        let root = g.add(Op::Unary(UnaryOp::Relu), &[xn], ty, at);
        let l = Loop {
            root,
            leaves: vec![(xn, x)],
            out,
        };
        (g, l)
    }

    #[test]
    fn contiguous_axes_after_the_first_merge_and_size_one_axes_go() {
        let shape = [8, 14, 1, 14, 64];
        let (g, l) = relu(
            &shape,
            View::contiguous(0, &shape),
            View::contiguous(1, &shape),
        );
        let c = l.collapsed(&g);
        assert_eq!(c.out.shape, [8, 12544]);
        assert_eq!(c.out.strides, [12544, 1]);
        assert_eq!(c.leaves[0].1.shape, [8, 12544]);
    }

    #[test]
    fn axes_a_view_steps_through_apart_stay_apart() {
        // x is the transpose of a [8, 64, 14] value: its last two axes do not merge,
        // and neither do the output's, which every view must allow
        let shape = [8, 14, 64];
        let x = View {
            buf: 0,
            offset: 0,
            shape: shape.to_vec(),
            strides: vec![896, 1, 14],
        };
        let (g, l) = relu(&shape, x, View::contiguous(1, &shape));
        let c = l.collapsed(&g);
        assert_eq!(c.out.shape, [8, 14, 64]);
        assert_eq!(c.leaves[0].1.strides, [896, 1, 14]);
        // a padded row (stride 16 * 66 between rows of 64) keeps its rows apart
        let x = View {
            buf: 0,
            offset: 0,
            shape: shape.to_vec(),
            strides: vec![14 * 1056, 1056, 1],
        };
        let (g, l) = relu(&shape, x, View::contiguous(1, &shape));
        assert_eq!(l.collapsed(&g).out.shape, [8, 14, 64]);
    }
}
