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
    let d = (d as usize, ds as isize);
    match op {
        VecOp::Fmac | VecOp::Fmach => kinds(mem, at, d, n, |a, b, c| a + b * c),
        VecOp::Mov => kinds(mem, at, d, n, |a, _, _| a),
        VecOp::Add => kinds(mem, at, d, n, |a, b, _| a + b),
        VecOp::Sub => kinds(mem, at, d, n, |a, b, _| a - b),
        VecOp::Mul | VecOp::Mulh => kinds(mem, at, d, n, |a, b, _| a * b),
        op => run(mem, at, d, n, |a, b, c| op.apply(a, b, c)),
    }
    true
}

/// A swept operand: words of memory from a place at a stride, or a constant.
#[derive(Clone, Copy)]
enum At {
    Mem(usize, isize),
    Const(f32),
}

/// An operand whose kind is known where the sweep is compiled (`kinds`), so that the
/// loop over the elements does not ask each element's operands what they are.
trait Get: Copy {
    fn get(self, mem: &[f32], i: isize) -> f32;
}

#[derive(Clone, Copy)]
struct Words(usize, isize);

impl Get for Words {
    #[inline(always)]
    fn get(self, mem: &[f32], i: isize) -> f32 {
        mem[(self.0 as isize + i * self.1) as usize]
    }
}

impl Get for f32 {
    #[inline(always)]
    fn get(self, _: &[f32], _: isize) -> f32 {
        self
    }
}

impl Get for At {
    #[inline(always)]
    fn get(self, mem: &[f32], i: isize) -> f32 {
        match self {
            At::Mem(b, st) => Words(b, st).get(mem, i),
            At::Const(x) => x,
        }
    }
}

/// `run` for the operations most sweeps are (a convolution's taps, a layer's
/// products, moves): over slices where the destination is contiguous (`contiguous`),
/// else with each operand's kind (words or a constant) fixed, so that the loop over
/// the elements does not ask each element's operands what they are.
fn kinds(
    mem: &mut [f32],
    at: [At; 3],
    d: (usize, isize),
    n: u32,
    f: impl Fn(f32, f32, f32) -> f32 + Copy,
) {
    use At::{Const as C, Mem as M};
    if contiguous(mem, at, d, n, f) || accumulated(mem, at, d, n, f) {
        return;
    }
    match at {
        [M(a, sa), M(b, sb), M(c, sc)] => {
            run(mem, [Words(a, sa), Words(b, sb), Words(c, sc)], d, n, f)
        }
        [M(a, sa), C(b), M(c, sc)] => run3(mem, (Words(a, sa), b, Words(c, sc)), d, n, f),
        [M(a, sa), M(b, sb), C(c)] => run3(mem, (Words(a, sa), Words(b, sb), c), d, n, f),
        [M(a, sa), C(b), C(c)] => run3(mem, (Words(a, sa), b, c), d, n, f),
        [C(a), M(b, sb), M(c, sc)] => run3(mem, (a, Words(b, sb), Words(c, sc)), d, n, f),
        at => run(mem, at, d, n, f),
    }
}

/// A sweep into one word that is also its first operand (a sum of products into an
/// accumulator: a filter's gradient), whose other operands never read that word: the
/// running value kept out of memory until the end, in the same order (so the same
/// sums). False (nothing done) for any other shape.
fn accumulated(
    mem: &mut [f32],
    at: [At; 3],
    (d, ds): (usize, isize),
    n: u32,
    f: impl Fn(f32, f32, f32) -> f32 + Copy,
) -> bool {
    if ds != 0 || !matches!(at[0], At::Mem(a, 0) if a == d) {
        return false;
    }
    let apart = |x: At| match x {
        At::Const(_) => true,
        At::Mem(b, st) => {
            let last = b as isize + (n.max(1) as isize - 1) * st;
            let (lo, hi) = (last.min(b as isize), last.max(b as isize));
            (d as isize) < lo || (d as isize) > hi
        }
    };
    if !(apart(at[1]) && apart(at[2])) {
        return false;
    }
    // (two runs of words, the common shape, with their kinds fixed)
    mem[d] = match (at[1], at[2]) {
        (At::Mem(b, sb), At::Mem(c, sc)) => sum(mem, d, (Words(b, sb), Words(c, sc)), n, f),
        (b, c) => sum(mem, d, (b, c), n, f),
    };
    true
}

/// `f` of the running value (from word `d`'s) and the operands' elements, in order.
fn sum<B: Get, C: Get>(
    mem: &[f32],
    d: usize,
    (b, c): (B, C),
    n: u32,
    f: impl Fn(f32, f32, f32) -> f32,
) -> f32 {
    (0..n as isize).fold(mem[d], |acc, i| f(acc, b.get(mem, i), c.get(mem, i)))
}

/// An operand of a sweep over slices: the destination's own element (an operation in
/// place), a run of words beside the destination (where it starts, then its slice),
/// or one value.
#[derive(Clone, Copy)]
enum Lane<R> {
    Own,
    Run(R),
    One(f32),
}

trait Elem: Copy {
    fn at(self, i: usize, own: f32) -> f32;
}

impl Elem for f32 {
    #[inline(always)]
    fn at(self, _: usize, _: f32) -> f32 {
        self
    }
}

impl Elem for &[f32] {
    #[inline(always)]
    fn at(self, i: usize, _: f32) -> f32 {
        self[i]
    }
}

#[derive(Clone, Copy)]
struct Own;

impl Elem for Own {
    #[inline(always)]
    fn at(self, _: usize, own: f32) -> f32 {
        own
    }
}

/// A sweep whose destination is a contiguous run and whose operands are each that run
/// itself, a contiguous run apart from it, or one value (a constant, or a word outside
/// the destination, read once): over slices, which the compiler vectorises (each
/// element's arithmetic is the same, so the results are). False (nothing done) for
/// any other shape.
fn contiguous(
    mem: &mut [f32],
    at: [At; 3],
    (d, ds): (usize, isize),
    n: u32,
    f: impl Fn(f32, f32, f32) -> f32 + Copy,
) -> bool {
    let n = n as usize;
    if ds != 1 || n == 0 {
        return false;
    }
    let end = d + n;
    // (each operand's kind, a run by where it starts in memory)
    let mut operands = [Lane::Own; 3];
    for (k, a) in at.iter().enumerate() {
        operands[k] = match *a {
            At::Const(x) => Lane::One(x),
            At::Mem(b, 0) if b < d || b >= end => Lane::One(mem[b]),
            At::Mem(b, 1) if b == d => Lane::Own,
            At::Mem(b, 1) if b + n <= d || b >= end => Lane::Run(b),
            _ => return false,
        };
    }
    let (before, rest) = mem.split_at_mut(d);
    let (dst, after) = rest.split_at_mut(n);
    let lane = |kind: Lane<usize>| match kind {
        Lane::Own => Lane::Own,
        Lane::Run(b) if b < d => Lane::Run(&before[b..b + n]),
        Lane::Run(b) => Lane::Run(&after[b - end..b - end + n]),
        Lane::One(x) => Lane::One(x),
    };
    match (lane(operands[0]), lane(operands[1]), lane(operands[2])) {
        (Lane::Own, Lane::One(b), Lane::Run(c)) => over(dst, (Own, b, c), f),
        (Lane::Own, Lane::Run(b), Lane::One(c)) => over(dst, (Own, b, c), f),
        (Lane::Own, Lane::Run(b), Lane::Run(c)) => over(dst, (Own, b, c), f),
        (Lane::Own, Lane::One(b), Lane::One(c)) => over(dst, (Own, b, c), f),
        (Lane::Run(a), Lane::One(b), Lane::Run(c)) => over(dst, (a, b, c), f),
        (Lane::Run(a), Lane::Run(b), Lane::One(c)) => over(dst, (a, b, c), f),
        (Lane::Run(a), Lane::Run(b), Lane::Run(c)) => over(dst, (a, b, c), f),
        (Lane::Run(a), Lane::One(b), Lane::One(c)) => over(dst, (a, b, c), f),
        (Lane::One(a), Lane::Run(b), Lane::Run(c)) => over(dst, (a, b, c), f),
        (Lane::One(a), Lane::One(b), Lane::Run(c)) => over(dst, (a, b, c), f),
        (Lane::One(a), Lane::Run(b), Lane::One(c)) => over(dst, (a, b, c), f),
        (Lane::One(a), Lane::One(b), Lane::One(c)) => over(dst, (a, b, c), f),
        _ => return false,
    }
    true
}

fn over<A: Elem, B: Elem, C: Elem>(
    dst: &mut [f32],
    (a, b, c): (A, B, C),
    f: impl Fn(f32, f32, f32) -> f32,
) {
    for (i, y) in dst.iter_mut().enumerate() {
        let own = *y;
        *y = f(a.at(i, own), b.at(i, own), c.at(i, own));
    }
}

/// Element by element: `f` of the operands' elements into the destination's.
fn run<G: Get>(
    mem: &mut [f32],
    at: [G; 3],
    d: (usize, isize),
    n: u32,
    f: impl Fn(f32, f32, f32) -> f32,
) {
    run3(mem, (at[0], at[1], at[2]), d, n, f)
}

fn run3<A: Get, B: Get, C: Get>(
    mem: &mut [f32],
    (a, b, c): (A, B, C),
    (d, ds): (usize, isize),
    n: u32,
    f: impl Fn(f32, f32, f32) -> f32,
) {
    for i in 0..n as isize {
        let v = f(a.get(mem, i), b.get(mem, i), c.get(mem, i));
        mem[(d as isize + i * ds) as usize] = v;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An operand drawn: words from a place at a stride (backward too), or a constant.
    fn opnd() -> impl Strategy<Value = Opnd> {
        prop_oneof![
            (0i64..48, -1i64..3).prop_map(|(a, st)| Opnd::Mem(a, st)),
            (-2.0f32..2.0).prop_map(Opnd::Const),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// A sweep (over slices, into an accumulator, or with its operands' kinds
        /// fixed) leaves memory as the element-by-element reference does, bit for bit,
        /// whatever overlaps the operands and the destination have.
        #[test]
        fn a_sweep_is_the_elements_in_order(
            op in prop::sample::select(vec![VecOp::Fmac, VecOp::Mov, VecOp::Add, VecOp::Sub, VecOp::Mul, VecOp::Max]),
            ops in (opnd(), opnd(), opnd()), dst in (0i64..48, 0i64..3), n in 1u32..16,
            seed in 0u64..1000,
        ) {
            let mem = crate::rng::Stream::new(seed, 0).uniforms(0, 64, 0);
            let ops = [ops.0, ops.1, ops.2];
            let mut want = mem.clone();
            for i in 0..n {
                let v = element(&want, op, &ops, i, &[], None);
                store(&mut want, Some(dst), i, v);
            }
            let mut got = mem;
            if sweep(&mut got, op, &ops, Some(dst), n) {
                let bits = |m: &[f32]| m.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&got), bits(&want));
            }
        }
    }

    /// A convolution's taps (outputs in place plus a weight times a run of inputs) and
    /// its filter's gradient (a sum of products into one word) take the fast sweeps.
    #[test]
    fn taps_and_gradients_sweep_fast() {
        let mem = crate::rng::Stream::new(3, 0).uniforms(0, 64, 0);
        let taps = [Opnd::Mem(0, 1), Opnd::Mem(40, 0), Opnd::Mem(20, 1)];
        let sum = [Opnd::Mem(40, 0), Opnd::Mem(0, 1), Opnd::Mem(20, 1)];
        for (ops, dst) in [(taps, (0, 1)), (sum, (40, 0))] {
            let at = |o: Opnd| match o {
                Opnd::Mem(a, st) => At::Mem(a as usize, st as isize),
                _ => At::Const(0.0),
            };
            let mut got = mem.clone();
            let f = |a: f32, b: f32, c: f32| a + b * c;
            let d = (dst.0 as usize, dst.1 as isize);
            let fast = contiguous(&mut got, ops.map(at), d, 16, f)
                || accumulated(&mut got, ops.map(at), d, 16, f);
            assert!(fast, "{dst:?}");
            let mut want = mem.clone();
            for i in 0..16 {
                let v = element(&want, VecOp::Fmac, &ops, i, &[], None);
                store(&mut want, Some(dst), i, v);
            }
            assert_eq!(got, want);
        }
    }
}
