//! The instructions a layer's bodies share: receives, zeroes, products and
//! multiply-adds over a block, a convolution's taps, and a link of a chain of partial
//! sums.

use super::super::super::isa::{Colour, Dsd, Instr, Program, Src, VecOp};
use super::super::nest;

/// The next wavelets on `colour` into the words `dst` describes.
pub(super) fn receive(dst: Dsd, colour: Colour) -> Instr {
    let len = dst.len();
    Instr::Vec {
        op: VecOp::Mov,
        dst,
        srcs: vec![Src::V(Dsd::In { colour, len })],
    }
}

/// The room for a row's output gradient (`len` words, named `dy`) and the instruction
/// that receives a sample's on `colour`: where the room starts, and that instruction.
pub(super) fn row_gradient(p: &mut Program, len: u32, colour: Colour) -> (u32, Instr) {
    let grads = p.alloc("dy", len);
    (grads, receive(Dsd::mem(grads, len), colour))
}

/// `len` words at `acc` set to zero.
pub(super) fn zero(acc: u32, len: u32) -> Instr {
    Instr::Vec {
        op: VecOp::Mov,
        dst: Dsd::mem(acc, len),
        srcs: vec![Src::Imm(0.0)],
    }
}

/// `acc[..len] = sum of w * x` over `count` iterations of a loop whose counter moves
/// the descriptors `w` and `x` by their steps (a product's partial sums, one input at
/// a time): the first a multiply, the others one multi-dimensional multiply-add, so
/// that `acc` need not be zeroed first.
pub(super) fn products(acc: u32, len: u32, count: u32, w: Dsd, x: Dsd) -> Vec<Instr> {
    let a = Dsd::mem(acc, len);
    // a descriptor moved on by `n` iterations of its loop, in the loop or (`inside`
    // false) outside it
    let moved = |d: &Dsd, n: i32, inside: bool| {
        let mut d = d.clone();
        if let Dsd::Mem { base, step, .. } = &mut d {
            *base = base.wrapping_add_signed(n * step.first().copied().unwrap_or(0));
            if !inside {
                step.clear();
            }
        }
        d
    };
    let mut out = vec![Instr::Vec {
        op: VecOp::Mul,
        dst: a,
        srcs: vec![Src::V(moved(&w, 0, false)), Src::V(moved(&x, 0, false))],
    }];
    if count > 1 {
        out.push(macs(
            acc,
            len,
            count - 1,
            moved(&w, 1, true),
            moved(&x, 1, true),
        ));
    }
    out
}

/// `acc[..len] += w * x` over `count` iterations of a loop whose counter moves the
/// descriptors `w` and `x` (a product's partial sums, one input at a time).
pub(super) fn macs(acc: u32, len: u32, count: u32, w: Dsd, x: Dsd) -> Instr {
    let a = Dsd::mem(acc, len);
    Instr::Loop {
        count,
        body: vec![Instr::Vec {
            op: VecOp::Fmac,
            dst: a.clone(),
            srcs: vec![Src::V(a), Src::V(w), Src::V(x)],
        }],
    }
}

/// `dst += a * b` (element by element, `dst` and `a`/`b` as given) in `loops`,
/// outermost first, each descriptor moved by its steps: a convolution's taps (filter
/// row, filter column, input channel, output channel), or a sequence's tokens and a
/// PE's inputs or outputs.
pub(super) fn taps(loops: &[u32], dst: Dsd, a: Dsd, b: Dsd) -> Instr {
    nest(
        loops,
        Instr::Vec {
            op: VecOp::Fmac,
            dst: dst.clone(),
            srcs: vec![Src::V(dst), Src::V(a), Src::V(b)],
        },
    )
}

/// A chain's link: rows of `len` partial sums `stride` apart, plus those received on
/// `recv` if any, sent on `send`; `loops` nest the rows (their counts, and how far each
/// moves the row from `part`; one row at `part` without loops).
pub(super) fn link(
    part: u32,
    (len, stride): (u32, u32),
    loops: &[(u32, u32)],
    send: Colour,
    recv: Option<Colour>,
) -> Instr {
    let dst = Dsd::Out { colour: send, len };
    let steps: Vec<u32> = loops.iter().map(|l| l.1).collect();
    let mine = Src::V(Dsd::strided(part, len, stride as i32, &steps, None));
    let v = match recv {
        None => Instr::Vec {
            op: VecOp::Mov,
            dst,
            srcs: vec![mine],
        },
        Some(colour) => Instr::Vec {
            op: VecOp::Add,
            dst,
            srcs: vec![mine, Src::V(Dsd::In { colour, len })],
        },
    };
    nest(&loops.iter().map(|l| l.0).collect::<Vec<_>>(), v)
}
