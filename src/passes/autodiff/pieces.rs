//! Adjoints that meet at one value, summed. Slices of one value (a GRU's or an LSTM's
//! gates, cut from one product) each send back their gradient padded with zeros to the
//! value's shape; where the pieces do not overlap, their sum is the pieces set side by
//! side, one concatenation, with no zeros added and no sums.

use super::Ad;
use crate::ir::{BinaryOp, Op, TensorType};
use crate::span::Span;
use petgraph::stable_graph::NodeIndex;

/// Where a value lies along an axis: `(start, end, Some(piece))` for a piece of it,
/// `None` for a run of zeros.
type Runs = Vec<(usize, usize, Option<NodeIndex>)>;

impl Ad<'_> {
    /// `prev + d`, two adjoints of one value: a concatenation of their pieces where
    /// both are pieces padded with zeros along one axis that do not overlap.
    pub(super) fn sum_adjoints(&mut self, prev: NodeIndex, d: NodeIndex, span: Span) -> NodeIndex {
        match self.pieced(prev, d) {
            Some((axis, runs)) => self.set_side_by_side(prev, axis, &runs, span),
            None => self.bin(BinaryOp::Add, prev, d, span),
        }
    }

    /// `n` as runs along its concatenation's axis; `None` unless it is a concatenation
    /// with a run of zeros among its operands.
    fn runs(&self, n: NodeIndex) -> Option<(usize, Runs)> {
        let Op::Concat { axis } = self.g.node(n).op else {
            return None;
        };
        let mut at = 0;
        let mut runs = Runs::new();
        for o in self.g.operands(n) {
            let len = self.g.ty(o).shape[axis];
            let zero =
                matches!(self.g.node(o).op, Op::Const { bits } if f64::from_bits(bits) == 0.0);
            runs.push((at, at + len, (!zero).then_some(o)));
            at += len;
        }
        runs.iter().any(|r| r.2.is_none()).then_some((axis, runs))
    }

    /// The pieces of `a` and `b` together, in order, zeros between them, when both are
    /// pieces padded with zeros along one axis (`runs`) that do not overlap.
    fn pieced(&self, a: NodeIndex, b: NodeIndex) -> Option<(usize, Runs)> {
        let ((xa, ra), (xb, rb)) = (self.runs(a)?, self.runs(b)?);
        if xa != xb || self.g.ty(a) != self.g.ty(b) {
            return None;
        }
        let mut pieces: Runs = ra.into_iter().chain(rb).filter(|r| r.2.is_some()).collect();
        pieces.sort();
        if pieces.windows(2).any(|w| w[0].1 > w[1].0) {
            return None;
        }
        let whole = self.g.ty(a).shape[xa];
        let mut runs = Runs::new();
        let mut at = 0;
        for p in pieces.into_iter().chain([(whole, whole, None)]) {
            if p.0 > at {
                runs.push((at, p.0, None));
            }
            if p.2.is_some() {
                runs.push(p);
            }
            at = p.1;
        }
        Some((xa, runs))
    }

    /// `runs` along `axis` as one value of `like`'s type: its one piece, or their
    /// concatenation with zeros in the gaps.
    fn set_side_by_side(
        &mut self,
        like: NodeIndex,
        axis: usize,
        runs: &Runs,
        span: Span,
    ) -> NodeIndex {
        let ty = self.ty(like);
        if let [(_, _, Some(only))] = runs[..] {
            return only;
        }
        let parts: Vec<NodeIndex> = runs
            .iter()
            .map(|&(start, end, piece)| {
                piece.unwrap_or_else(|| {
                    let mut shape = ty.shape.clone();
                    shape[axis] = end - start;
                    self.zeros(TensorType::new(ty.dtype, shape), span)
                })
            })
            .collect();
        self.mk(Op::Concat { axis }, &parts, ty, span)
    }
}
