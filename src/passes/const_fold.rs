//! Constant folding: an elementwise op, cast, reshape or broadcast whose operands are
//! all constants becomes a constant itself (rounded to its dtype). Nodes are rewritten
//! in place, so numbering and order stay stable; the old operands are left to DCE.

use super::PassCtx;
use crate::diag::Diags;
use crate::ir::{float, BinaryOp, DType, Graph, NodeIndex, Op, UnaryOp};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

pub fn run(g: &mut Graph, _ctx: &PassCtx, _diags: &mut Diags) {
    for n in g.topo_order() {
        let ops = g.operands(n);
        if ops.is_empty() {
            continue;
        }
        let Some(vals) = ops
            .iter()
            .map(|&o| const_value(g, o))
            .collect::<Option<Vec<f64>>>()
        else {
            continue;
        };
        // An integer division by zero is left to run, where it is an error.
        let int_div_by_zero = matches!(g.node(n).op, Op::Binary(BinaryOp::Div | BinaryOp::Rem))
            && g.ty(n).dtype.is_int()
            && vals.get(1) == Some(&0.0);
        if int_div_by_zero {
            continue;
        }
        let Some(v) = fold(&g.node(n).op, &vals) else {
            continue;
        };
        let v = round_to(v, g.ty(n).dtype);
        let incoming: Vec<_> =
            g.g.edges_directed(n, Direction::Incoming)
                .map(|e| e.id())
                .collect();
        for e in incoming {
            g.g.remove_edge(e);
        }
        g.g[n].op = Op::Const { bits: v.to_bits() };
    }
}

fn const_value(g: &Graph, n: NodeIndex) -> Option<f64> {
    match g.node(n).op {
        Op::Const { bits } => Some(f64::from_bits(bits)),
        _ => None,
    }
}

fn fold(op: &Op, v: &[f64]) -> Option<f64> {
    Some(match op {
        Op::Unary(u) => unary(*u, v[0]),
        Op::Binary(b) => binary(*b, v[0], v[1]),
        Op::Select => {
            if v[0] != 0.0 {
                v[1]
            } else {
                v[2]
            }
        }
        Op::Cast | Op::Reshape | Op::BroadcastTo => v[0],
        _ => return None,
    })
}

fn unary(u: UnaryOp, x: f64) -> f64 {
    u.eval(x).unwrap_or_else(|| f64::from(u8::from(x == 0.0)))
}

fn binary(b: BinaryOp, x: f64, y: f64) -> f64 {
    let t = |c: bool| f64::from(u8::from(c));
    match b {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Rem => x % y,
        BinaryOp::Pow => x.powf(y),
        BinaryOp::Max => float::maximum(x, y),
        BinaryOp::Min => float::minimum(x, y),
        BinaryOp::Eq => t(x == y),
        BinaryOp::Ne => t(x != y),
        BinaryOp::Lt => t(x < y),
        BinaryOp::Le => t(x <= y),
        BinaryOp::Gt => t(x > y),
        BinaryOp::Ge => t(x >= y),
        BinaryOp::And => t(x != 0.0 && y != 0.0),
        BinaryOp::Or => t(x != 0.0 || y != 0.0),
    }
}

/// The value as the dtype holds it (a float cast to an integer as `float::to_int`).
fn round_to(v: f64, d: DType) -> f64 {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => f64::from(v as f32),
        DType::I32 | DType::U8 | DType::I64 => float::to_int(v, d) as f64,
        DType::Bool => f64::from(u8::from(v != 0.0)),
        DType::Bytes => v,
    }
}
