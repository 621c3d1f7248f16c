//! Elementwise code: IR ops over the values a PE holds, as vector operations. Every
//! kernel uses it for what is elementwise in its part of the graph: the fused chains of
//! the vector kernels (per sample) and the optimiser's update (once per step, over the
//! PE's block of each variable).
//!
//! A value on a PE is a buffer of SRAM words (`len` words; one word broadcasts over any
//! length) or a constant. A buffer may be one of `slots` per-sample slots chosen by a
//! PE counter (a value stashed between a sample's forward and backward tasks).
//! Temporaries come from a scratch area that every task of the PE shares (tasks run one
//! at a time, to their end), reused once their last reader is done.

use super::isa::{Dsd, Instr, Src, VecOp};
use crate::ir::{BinaryOp, DType, Op, UnaryOp};

/// Where a value lives on a PE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Val {
    /// `len` words at `base`; with `slot`, the slot (of `len` words) that counter
    /// `slot` picks.
    Buf {
        base: u32,
        len: u32,
        slot: Option<u8>,
    },
    Imm(f32),
}

impl Val {
    pub fn buf(base: u32, len: u32) -> Val {
        Val::Buf {
            base,
            len,
            slot: None,
        }
    }

    /// The elements it holds (1 for a constant).
    pub fn elements(self) -> u32 {
        match self {
            Val::Buf { len, .. } => len,
            Val::Imm(_) => 1,
        }
    }

    /// Its `n` elements as a descriptor (a one-word buffer repeats its word); `None`
    /// for a constant.
    pub fn dsd(self, n: u32) -> Option<Dsd> {
        match self {
            Val::Buf { base, len, slot } => Some(words(base, len, slot, n)),
            Val::Imm(_) => None,
        }
    }

    /// Its `n` elements as a source.
    pub fn src(self, n: u32) -> Src {
        match self {
            Val::Buf { base, len, slot } => Src::V(words(base, len, slot, n)),
            Val::Imm(v) => Src::Imm(v),
        }
    }
}

/// `n` elements of a buffer of `len` words at `base` (in counter `slot`'s slot).
fn words(base: u32, len: u32, slot: Option<u8>, n: u32) -> Dsd {
    Dsd::strided(
        base,
        n,
        i32::from(len != 1),
        &[],
        slot.map(|c| (c, len as i32)),
    )
}

/// The scratch area of a PE's tasks: temporaries placed at offsets from `base`, freed
/// and reused; `high` is the words it needs.
#[derive(Debug, Clone, Default)]
pub struct Scratch {
    pub base: u32,
    /// Free runs (offset, length), sorted by offset.
    free: Vec<(u32, u32)>,
    top: u32,
    pub high: u32,
}

impl Scratch {
    pub fn new(base: u32) -> Scratch {
        Scratch {
            base,
            ..Scratch::default()
        }
    }

    /// A temporary of `len` words.
    pub fn alloc(&mut self, len: u32) -> Val {
        let len = len.max(1);
        if let Some(i) = self.free.iter().position(|&(_, l)| l >= len) {
            let (off, l) = self.free[i];
            if l == len {
                self.free.remove(i);
            } else {
                self.free[i] = (off + len, l - len);
            }
            return Val::buf(self.base + off, len);
        }
        let off = self.top;
        self.top += len;
        self.high = self.high.max(self.top);
        Val::buf(self.base + off, len)
    }

    /// Gives back a temporary of this scratch (anything else is ignored).
    pub fn release(&mut self, v: Val) {
        let Val::Buf {
            base,
            len,
            slot: None,
        } = v
        else {
            return;
        };
        if base < self.base || base + len > self.base + self.top {
            return;
        }
        let off = base - self.base;
        let at = self.free.partition_point(|&(o, _)| o < off);
        self.free.insert(at, (off, len));
        // merge neighbours
        let mut merged: Vec<(u32, u32)> = Vec::with_capacity(self.free.len());
        for &(o, l) in &self.free {
            match merged.last_mut() {
                Some((po, pl)) if *po + *pl == o => *pl += l,
                _ => merged.push((o, l)),
            }
        }
        if let Some(&(o, l)) = merged.last() {
            if o + l == self.top {
                self.top = o;
                merged.pop();
            }
        }
        self.free = merged;
    }

    /// Starts a new task: nothing is live (the high-water mark stays).
    pub fn reset(&mut self) {
        self.free.clear();
        self.top = 0;
    }
}

/// `dst = op(srcs)` over `n` elements.
pub fn vec(op: VecOp, dst: Val, srcs: &[Val], n: u32) -> Instr {
    Instr::Vec {
        op,
        dst: dst.dsd(n).unwrap_or_else(|| Dsd::mem(0, n)),
        srcs: srcs.iter().map(|s| s.src(n)).collect(),
    }
}

/// Whether an op is elementwise (with broadcasting of one-element operands) and what
/// `emit` makes of it.
pub fn elementwise(op: &Op) -> bool {
    match op {
        Op::Unary(_) | Op::Select | Op::Cast | Op::CrossShardMean => true,
        Op::Binary(b) => !matches!(b, BinaryOp::Rem),
        _ => false,
    }
}

/// The code of an elementwise op (see `elementwise`) writing `dst` (`n` elements) from
/// `args`, each of `n` elements or one; `to` is the result's dtype (for casts) and
/// `from` the first operand's.
pub fn emit(
    op: &Op,
    dst: Val,
    args: &[Val],
    n: u32,
    (from, to): (DType, DType),
    out: &mut Vec<Instr>,
) -> Result<(), String> {
    if let Some(a) = args.iter().find(|a| a.elements() != 1 && a.elements() != n) {
        return Err(format!(
            "`{}` of {} elements from an operand of {}",
            op.name(),
            n,
            a.elements()
        ));
    }
    let un = |v: VecOp| vec(v, dst, &args[..1], n);
    let ins = match op {
        Op::Unary(u) => match u {
            UnaryOp::Neg => un(VecOp::Neg),
            UnaryOp::Exp => un(VecOp::Exp),
            UnaryOp::Log => un(VecOp::Log),
            UnaryOp::Sqrt => un(VecOp::Sqrt),
            UnaryOp::Rsqrt => un(VecOp::Rsqrt),
            UnaryOp::Tanh => un(VecOp::Tanh),
            UnaryOp::Sigmoid => un(VecOp::Sigmoid),
            UnaryOp::Relu => un(VecOp::Relu),
            UnaryOp::Floor => un(VecOp::Floor),
            UnaryOp::Sign => un(VecOp::Sign),
            UnaryOp::Sin => un(VecOp::Sin),
            UnaryOp::Cos => un(VecOp::Cos),
            UnaryOp::Erf => un(VecOp::Erf),
            UnaryOp::StopGradient => un(VecOp::Mov),
            UnaryOp::Square => vec(VecOp::Mul, dst, &[args[0], args[0]], n),
            UnaryOp::Not => vec(VecOp::Eq, dst, &[args[0], Val::Imm(0.0)], n),
            UnaryOp::Abs => {
                // max(a, -a) through dst, which must not be a itself
                if args[0] == dst {
                    return Err("`abs` in place".into());
                }
                out.push(vec(VecOp::Neg, dst, &args[..1], n));
                vec(VecOp::Max, dst, &[args[0], dst], n)
            }
        },
        Op::Binary(b) => {
            let v = match b {
                BinaryOp::Add => VecOp::Add,
                BinaryOp::Sub => VecOp::Sub,
                BinaryOp::Mul | BinaryOp::And => VecOp::Mul,
                BinaryOp::Div => VecOp::Div,
                BinaryOp::Pow => VecOp::Pow,
                BinaryOp::Max | BinaryOp::Or => VecOp::Max,
                BinaryOp::Min => VecOp::Min,
                BinaryOp::Eq => VecOp::Eq,
                BinaryOp::Ne => VecOp::Ne,
                BinaryOp::Lt => VecOp::Lt,
                BinaryOp::Le => VecOp::Le,
                BinaryOp::Gt => VecOp::Gt,
                BinaryOp::Ge => VecOp::Ge,
                BinaryOp::Rem => return Err("`%` has no wafer kernel".into()),
            };
            vec(v, dst, &args[..2], n)
        }
        Op::Select => vec(VecOp::Sel, dst, &args[..3], n),
        Op::Cast => {
            if to == DType::Bool {
                vec(VecOp::Ne, dst, &[args[0], Val::Imm(0.0)], n)
            } else if to.is_float() || !from.is_float() {
                un(VecOp::Mov)
            } else {
                un(VecOp::Trunc)
            }
        }
        Op::CrossShardMean => un(VecOp::Mov),
        other => return Err(format!("`{}` is not elementwise", other.name())),
    };
    out.push(ins);
    out.extend(rounded(dst, n, to));
    Ok(())
}

/// `dst` (`n` elements) rounded in place to `dtype` when it is a half-precision float
/// (computed in f32, as the interpreter computes it, then rounded); nothing else.
pub fn rounded(dst: Val, n: u32, dtype: DType) -> Option<Instr> {
    let op = VecOp::round_to(dtype)?;
    dst.dsd(n).map(|d| Instr::Vec {
        op,
        dst: d.clone(),
        srcs: vec![Src::V(d)],
    })
}

/// An operand of an update's op: a variable the kernel holds, a gradient it
/// accumulated, a value the host writes each step, a constant, or an earlier op's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operand {
    Var(usize),
    Acc(usize),
    Host(usize),
    Imm(f32),
    Val(usize),
}

/// One elementwise op of an update, over the PE's block (`full`) or one word.
#[derive(Debug, Clone, PartialEq)]
pub struct UpdateOp {
    pub op: Op,
    pub args: Vec<Operand>,
    pub full: bool,
    /// The first operand's dtype and the result's (for casts).
    pub types: (DType, DType),
}

/// What a kernel does once per step after the samples: elementwise ops over its blocks
/// (the optimiser), then each variable replaced by a value.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Update {
    pub ops: Vec<UpdateOp>,
    pub commits: Vec<(usize, Operand)>,
}

impl Update {
    /// The code of the update over blocks of `n` words: `vars`, `accs` and `hosts` are
    /// where the operands of those kinds live. The accumulators are not zeroed
    /// (`zeroed`, once after every update of a kernel: one of several over blocks of
    /// different shapes reads the same sums).
    pub fn code(
        &self,
        vars: &[Val],
        accs: &[Val],
        hosts: &[Val],
        n: u32,
        scratch: &mut Scratch,
    ) -> Result<Vec<Instr>, String> {
        let missing = || "an update reads a value the kernel does not hold".to_string();
        let mut last = vec![0usize; self.ops.len()];
        let uses = self
            .ops
            .iter()
            .enumerate()
            .flat_map(|(i, o)| o.args.iter().map(move |a| (i, *a)))
            .chain(self.commits.iter().map(|&(_, a)| (self.ops.len(), a)));
        for (i, a) in uses {
            if let Operand::Val(v) = a {
                *last.get_mut(v).ok_or_else(missing)? = i;
            }
        }
        // a product read once, by the sum or difference right after it, is one
        // multiply-add with it (`w - lr g`, `0.9 m + g`): at the sum, its other operand,
        // the product's two, and whether the product is subtracted
        let mut fused: Vec<Option<[Operand; 3]>> = vec![None; self.ops.len()];
        let mut negated = vec![false; self.ops.len()];
        // an operand's elements (a value of an earlier op: a block's or one)
        let elements = |a: Operand| match a {
            Operand::Var(i) => vars.get(i).map(|v| v.elements()),
            Operand::Acc(i) => accs.get(i).map(|v| v.elements()),
            Operand::Host(i) => hosts.get(i).map(|v| v.elements()),
            Operand::Imm(_) => Some(1),
            Operand::Val(i) => self.ops.get(i).map(|o| if o.full { n } else { 1 }),
        };
        for i in 1..self.ops.len() {
            let (m, o) = (&self.ops[i - 1], &self.ops[i]);
            let f32s = (DType::F32, DType::F32);
            if m.op != Op::Binary(BinaryOp::Mul)
                || last[i - 1] != i
                || m.full != o.full
                || m.types != f32s
                || o.types != f32s
            {
                continue;
            }
            let t = Operand::Val(i - 1);
            let (c, neg) = match (&o.op, o.args.as_slice()) {
                (Op::Binary(BinaryOp::Add), &[a, b]) if b == t && a != t => (a, false),
                (Op::Binary(BinaryOp::Add), &[a, b]) if a == t && b != t => (b, false),
                (Op::Binary(BinaryOp::Sub), &[a, b]) if b == t && a != t => (a, true),
                _ => continue,
            };
            let [x, y] = [m.args[0], m.args[1]];
            // (each operand of a block's length or one word, as `emit` requires)
            let len = if o.full { n } else { 1 };
            if ![c, x, y]
                .into_iter()
                .all(|a| elements(a).is_some_and(|e| e == 1 || e == len))
            {
                continue;
            }
            fused[i] = Some([c, x, y]);
            negated[i] = neg;
            // the product's operands are read at the sum now
            for a in [x, y] {
                if let Operand::Val(v) = a {
                    last[v] = last[v].max(i);
                }
            }
        }
        // an op whose value replaces a variable is computed straight into the
        // variable's words when nothing after it reads the old value (and its code is
        // one instruction, which reads an element before it writes it)
        let mut into: Vec<Option<usize>> = vec![None; self.ops.len()];
        for &(v, a) in &self.commits {
            let Operand::Val(i) = a else { continue };
            let old_read_later = self.ops[i + 1..]
                .iter()
                .any(|o| o.args.contains(&Operand::Var(v)))
                || self.commits.iter().any(|c| c.1 == Operand::Var(v));
            let once = self.commits.iter().filter(|c| c.1 == a).count() == 1;
            let len = if self.ops[i].full { n } else { 1 };
            let fits = vars.get(v).is_some_and(|w| w.elements() == len);
            let single = !matches!(self.ops[i].op, Op::Unary(UnaryOp::Abs));
            if !old_read_later && once && fits && single && into[i].is_none() {
                into[i] = Some(v);
            }
        }
        let mut vals: Vec<Val> = Vec::with_capacity(self.ops.len());
        let mut out = Vec::new();
        // a half-precision gradient, summed over the batch in f32, rounded once before
        // its first reader (as the interpreter rounds the product over the batch)
        let mut rounded_acc = vec![false; accs.len()];
        for o in &self.ops {
            if let Some(&Operand::Acc(i)) = o.args.first() {
                let acc = accs.get(i).copied().ok_or_else(missing)?;
                if !std::mem::replace(&mut rounded_acc[i], true) {
                    out.extend(rounded(acc, acc.elements(), o.types.0));
                }
            }
        }
        let get = |a: Operand, vals: &[Val]| -> Result<Val, String> {
            match a {
                Operand::Var(i) => vars.get(i).copied(),
                Operand::Acc(i) => accs.get(i).copied(),
                Operand::Host(i) => hosts.get(i).copied(),
                Operand::Imm(v) => Some(Val::Imm(v)),
                Operand::Val(i) => vals.get(i).copied(),
            }
            .ok_or_else(missing)
        };
        for (i, o) in self.ops.iter().enumerate() {
            let len = if o.full { n } else { 1 };
            if fused.get(i + 1).is_some_and(|f| f.is_some()) {
                // computed in the multiply-add after it
                vals.push(Val::Imm(f32::NAN));
                continue;
            }
            let args = (o.args.iter())
                .map(|&a| get(a, &vals))
                .collect::<Result<Vec<Val>, String>>()?;
            let dst = match into[i].and_then(|v| vars.get(v)) {
                Some(&w) => w,
                None => scratch.alloc(len),
            };
            match fused[i] {
                Some([c, x, y]) => {
                    let (c, mut x, mut y) = (get(c, &vals)?, get(x, &vals)?, get(y, &vals)?);
                    let mut temp = None;
                    if negated[i] {
                        // the constant, or the shorter, negated
                        if x.elements() < y.elements() {
                            (x, y) = (y, x);
                        }
                        if let Val::Imm(v) = x {
                            (x, y) = (y, Val::Imm(-v));
                        } else if let Val::Imm(v) = y {
                            y = Val::Imm(-v);
                        } else {
                            let t = scratch.alloc(y.elements());
                            out.push(vec(VecOp::Neg, t, &[y], y.elements()));
                            (y, temp) = (t, Some(t));
                        }
                    }
                    out.push(vec(VecOp::Fmac, dst, &[c, x, y], len));
                    if let Some(t) = temp {
                        scratch.release(t);
                    }
                }
                None => emit(&o.op, dst, &args, len, o.types, &mut out)?,
            }
            vals.push(dst);
            let product = fused[i].map_or(&[][..], |_| &self.ops[i - 1].args[..]);
            let mut read: Vec<usize> = (o.args.iter().chain(product))
                .filter_map(|a| match *a {
                    Operand::Val(v) if last[v] == i => Some(v),
                    _ => None,
                })
                .collect();
            read.sort_unstable();
            read.dedup();
            for v in read {
                scratch.release(vals[v]);
            }
        }
        for &(v, a) in &self.commits {
            if matches!(a, Operand::Val(i) if into[i] == Some(v)) {
                continue;
            }
            let dst = *vars.get(v).ok_or_else(missing)?;
            out.push(vec(VecOp::Mov, dst, &[get(a, &vals)?], dst.elements()));
        }
        Ok(out)
    }
}

/// The accumulators zeroed for the next step, at an update's end.
pub fn zeroed(accs: &[Val]) -> Vec<Instr> {
    (accs.iter())
        .map(|&a| vec(VecOp::Mov, a, &[Val::Imm(0.0)], a.elements()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_reuses_what_is_released() {
        let mut s = Scratch::new(100);
        let a = s.alloc(4);
        let b = s.alloc(2);
        assert_eq!((a, b), (Val::buf(100, 4), Val::buf(104, 2)));
        s.release(a);
        assert_eq!(s.alloc(3), Val::buf(100, 3));
        s.release(b);
        s.release(Val::buf(100, 3));
        // everything is free again: the next one starts at the base
        assert_eq!(s.alloc(6), Val::buf(100, 6));
        assert_eq!(s.high, 6);
        s.reset();
        assert_eq!(s.alloc(1), Val::buf(100, 1));
    }

    /// Momentum (`m = 0.9 m + g; w = w - lr m`) writes its new slot and weight in place,
    /// each product fused with the sum that reads it into one multiply-add (the
    /// learning rate negated first, into one word of scratch), and no copies at the
    /// end.
    #[test]
    fn updates_write_variables_in_place() {
        let op = |b, args: Vec<Operand>| UpdateOp {
            op: Op::Binary(b),
            args,
            full: true,
            types: (DType::F32, DType::F32),
        };
        let u = Update {
            ops: vec![
                op(BinaryOp::Mul, vec![Operand::Var(1), Operand::Imm(0.9)]),
                op(BinaryOp::Add, vec![Operand::Val(0), Operand::Acc(0)]),
                op(BinaryOp::Mul, vec![Operand::Val(1), Operand::Host(0)]),
                op(BinaryOp::Sub, vec![Operand::Var(0), Operand::Val(2)]),
            ],
            commits: vec![(1, Operand::Val(1)), (0, Operand::Val(3))],
        };
        let (w, m, g, lr) = (
            Val::buf(0, 8),
            Val::buf(8, 8),
            Val::buf(16, 8),
            Val::buf(24, 1),
        );
        let mut s = Scratch::new(32);
        let mut code = u.code(&[w, m], &[g], &[lr], 8, &mut s).unwrap();
        code.extend(zeroed(&[g]));
        let text: Vec<String> = code
            .iter()
            .map(|i| match i {
                Instr::Vec { op, dst, srcs } => {
                    let srcs: Vec<String> = srcs.iter().map(|s| s.to_string()).collect();
                    format!("{} {dst} {}", op.name(), srcs.join(" "))
                }
                _ => String::new(),
            })
            .collect();
        assert_eq!(
            text,
            [
                "fmac mem[8; 8] mem[16; 8] mem[8; 8] 0.9",
                "neg mem[32; 1 by 0] mem[24; 1 by 0]",
                "fmac mem[0; 8] mem[0; 8] mem[8; 8] mem[32; 8 by 0]",
                "mov mem[16; 8] 0.0",
            ]
        );
        assert_eq!(s.high, 1);
    }

    #[test]
    fn one_word_values_broadcast() {
        let v = Val::buf(8, 1);
        assert_eq!(v.dsd(5), Some(Dsd::strided(8, 5, 0, &[], None)));
        let s = Val::Buf {
            base: 8,
            len: 3,
            slot: Some(1),
        };
        assert_eq!(s.dsd(3).unwrap().to_string(), "mem[8 + 3*n1; 3]");
    }
}
