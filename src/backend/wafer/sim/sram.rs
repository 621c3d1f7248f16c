//! Vector operations on SRAM: a loop nest that is one operation on memory alone run
//! all at once (`run_nest`), sources and destinations resolved to addresses (`Opnd`),
//! and elements computed (`element`), swept (`sweep`), loaded and stored.

use super::Pe;
use crate::backend::wafer::cost;
use crate::backend::wafer::fabric::Fabric;
use crate::backend::wafer::isa::{Dsd, Instr, Src, VecOp};

/// Whether `nest` is a multi-dimensional operation (`Instr::dims`) on SRAM alone.
pub(super) fn on_sram(nest: &Instr) -> bool {
    if nest.dims().is_none() {
        return false;
    }
    let mut i = nest;
    while let Instr::Loop { body, .. } = i {
        i = &body[0];
    }
    matches!(i, Instr::Vec { dst, srcs, .. } if !cost::on_fabric(dst, srcs))
}

/// Runs every iteration of `nest` (a loop nest around one operation on SRAM alone,
/// inside the loops at `at`, which it extends) on `pe`: its operation, elements, and
/// cycles past the start-up (`cost::body`'s).
pub(super) fn run_nest(
    f: &Fabric,
    pe: &mut Pe,
    nest: &Instr,
    at: &mut smallvec::SmallVec<[u32; 4]>,
) -> (VecOp, u32, u64) {
    match nest {
        // the innermost loop: its operands resolved once, then moved by their steps
        Instr::Loop { count, body } if matches!(&body[..], [Instr::Vec { srcs, .. }] if !srcs.iter().any(|s| matches!(s, Src::Scalar(_)))) =>
        {
            let Instr::Vec { op, dst, srcs } = &body[0] else {
                return (VecOp::Mov, 0, 0);
            };
            let level = at.len();
            at.push(0);
            let ops = resolve(srcs, &pe.mem, at, &pe.counters);
            let d = dest(dst, at, &pe.counters, &pe.mem);
            at.pop();
            let moves = |x: &Dsd| match x {
                Dsd::Mem { step, .. } => i64::from(step.get(level).copied().unwrap_or(0)),
                _ => 0,
            };
            let mut by = [0i64; 3];
            for (k, s) in srcs.iter().enumerate().take(3) {
                if let Src::V(x) = s {
                    by[k] = moves(x);
                }
            }
            let dby = moves(dst);
            let n = dst.len();
            for i in 0..i64::from(*count) {
                let mut o = ops;
                for (k, x) in o.iter_mut().enumerate() {
                    if let Opnd::Mem(a, st) = *x {
                        *x = Opnd::Mem(a + i * by[k], st);
                    }
                }
                compute(&mut pe.mem, *op, &o, d.map(|(a, st)| (a + i * dby, st)), n);
            }
            let steps = cost::vec_op(f, *op, n, cost::reads(srcs), true)
                .saturating_sub(u64::from(f.dsd_startup));
            (*op, n * count, steps * u64::from(*count))
        }
        Instr::Loop { count, body } => {
            let (mut op, mut n, mut steps) = (VecOp::Mov, 0, 0);
            at.push(0);
            for i in 0..*count {
                *at.last_mut().expect("pushed") = i;
                let r = run_nest(f, pe, &body[0], at);
                (op, n, steps) = (r.0, n + r.1, steps + r.2);
            }
            at.pop();
            (op, n, steps)
        }
        Instr::Vec { op, dst, srcs } => {
            sram_op(pe, (*op, dst, srcs), at);
            let n = dst.len();
            let steps = cost::vec_op(f, *op, n, cost::reads(srcs), true)
                .saturating_sub(u64::from(f.dsd_startup));
            (*op, n, steps)
        }
        _ => (VecOp::Mov, 0, 0),
    }
}

/// An operation on SRAM alone, inside loops at `loops`, on `pe`'s memory.
pub(super) fn sram_op(pe: &mut Pe, (op, dst, srcs): (VecOp, &Dsd, &[Src]), loops: &[u32]) {
    let ops = resolve(srcs, &pe.mem, loops, &pe.counters);
    let d = dest(dst, loops, &pe.counters, &pe.mem);
    compute(&mut pe.mem, op, &ops, d, dst.len());
}

/// An operation on SRAM alone over `n` elements of resolved operands: all at once
/// (`sweep`), or element by element where some word leaves memory.
fn compute(mem: &mut [f32], op: VecOp, ops: &[Opnd; 3], d: Option<(i64, i64)>, n: u32) {
    if !sweep(mem, op, ops, d, n) {
        for i in 0..n {
            let v = element(mem, op, ops, i, &[], None);
            store(mem, d, i, v);
        }
    }
}

/// A source of a vector operation with its address resolved for the instruction's
/// loops and counters: element `i` of a memory source is at `start + i * stride`.
#[derive(Debug, Clone, Copy)]
pub(super) enum Opnd {
    Mem(i64, i64),
    Fab,
    Const(f32),
    Recv,
    None,
}

/// The sources of an instruction, resolved.
pub(super) fn resolve(srcs: &[Src], mem: &[f32], loops: &[u32], counters: &[u32]) -> [Opnd; 3] {
    let mut out = [Opnd::None; 3];
    for (k, s) in srcs.iter().enumerate().take(3) {
        out[k] = match s {
            Src::V(d @ Dsd::Mem { stride, .. }) => match d.word(0, loops, counters, mem) {
                Some(a) => Opnd::Mem(a, i64::from(*stride)),
                None => Opnd::Const(f32::NAN),
            },
            Src::V(Dsd::In { .. }) => Opnd::Fab,
            Src::V(Dsd::Out { .. }) => Opnd::Const(f32::NAN),
            Src::Scalar(a) => Opnd::Const(load(mem, Some(i64::from(*a)))),
            Src::Recv(_) => Opnd::Recv,
            Src::Imm(x) => Opnd::Const(*x),
        };
    }
    out
}

/// Where element 0 of a memory destination is, and its stride.
pub(super) fn dest(dst: &Dsd, loops: &[u32], counters: &[u32], mem: &[f32]) -> Option<(i64, i64)> {
    match dst {
        Dsd::Mem { stride, .. } => dst
            .word(0, loops, counters, mem)
            .map(|a| (a, i64::from(*stride))),
        _ => None,
    }
}

/// The value of element `i` of an operation over resolved sources.
pub(super) fn element(
    mem: &[f32],
    op: VecOp,
    srcs: &[Opnd; 3],
    i: u32,
    fab: &[f32],
    scalar: Option<f32>,
) -> f32 {
    let mut v = [0.0f32; 3];
    let mut j = 0;
    for (k, s) in srcs.iter().enumerate() {
        v[k] = match *s {
            Opnd::Mem(a, st) => load(mem, Some(a + i64::from(i) * st)),
            Opnd::Fab => {
                let x = fab.get(j).copied().unwrap_or(f32::NAN);
                j += 1;
                x
            }
            Opnd::Const(x) => x,
            Opnd::Recv => scalar.unwrap_or(f32::NAN),
            Opnd::None => 0.0,
        };
    }
    op.apply(v[0], v[1], v[2])
}

/// An operation on SRAM alone over `n` elements whose operands all lie within memory,
/// as `element` and `store` would compute it, with the operation chosen once and each
/// operand's place worked out once; false (nothing done) when some operand or the
/// destination leaves memory, which `element` and `store` handle word by word.
fn sweep(mem: &mut [f32], op: VecOp, ops: &[Opnd; 3], dst: Option<(i64, i64)>, n: u32) -> bool {
    #[derive(Clone, Copy)]
    enum At {
        Mem(usize, isize),
        Const(f32),
    }
    let len = mem.len() as i64;
    let last = i64::from(n.max(1) - 1);
    let within = |a: i64, st: i64| a >= 0 && a < len && a + last * st >= 0 && a + last * st < len;
    let Some((d, ds)) = dst.filter(|&(a, st)| within(a, st)) else {
        return false;
    };
    let mut at = [At::Const(0.0); 3];
    for (k, o) in ops.iter().enumerate() {
        at[k] = match *o {
            Opnd::Mem(a, st) if within(a, st) => At::Mem(a as usize, st as isize),
            Opnd::Const(x) => At::Const(x),
            Opnd::None => At::Const(0.0),
            _ => return false,
        };
    }
    fn run(
        mem: &mut [f32],
        at: [At; 3],
        (d, ds): (usize, isize),
        n: u32,
        f: impl Fn(f32, f32, f32) -> f32,
    ) {
        let get = |mem: &[f32], a: At, i: isize| match a {
            At::Mem(b, st) => mem[(b as isize + i * st) as usize],
            At::Const(x) => x,
        };
        for i in 0..n as isize {
            let v = f(get(mem, at[0], i), get(mem, at[1], i), get(mem, at[2], i));
            mem[(d as isize + i * ds) as usize] = v;
        }
    }
    let d = (d as usize, ds as isize);
    match op {
        VecOp::Fmac | VecOp::Fmach => run(mem, at, d, n, |a, b, c| a + b * c),
        VecOp::Mov => run(mem, at, d, n, |a, _, _| a),
        VecOp::Add => run(mem, at, d, n, |a, b, _| a + b),
        VecOp::Sub => run(mem, at, d, n, |a, b, _| a - b),
        VecOp::Mul | VecOp::Mulh => run(mem, at, d, n, |a, b, _| a * b),
        op => run(mem, at, d, n, |a, b, c| op.apply(a, b, c)),
    }
    true
}

fn load(mem: &[f32], a: Option<i64>) -> f32 {
    a.and_then(|a| usize::try_from(a).ok())
        .and_then(|a| mem.get(a))
        .copied()
        .unwrap_or(f32::NAN)
}

pub(super) fn store(mem: &mut [f32], dst: Option<(i64, i64)>, i: u32, v: f32) {
    if let Some(m) = dst
        .and_then(|(a, st)| usize::try_from(a + i64::from(i) * st).ok())
        .and_then(|a| mem.get_mut(a))
    {
        *m = v;
    }
}
