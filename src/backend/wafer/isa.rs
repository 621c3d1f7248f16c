//! The PE instruction set, in the spirit of Cerebras's CSL: a program is a set of tasks
//! over a memory map of named buffers; a task runs when a wavelet waits on its colour
//! (a data task) or when another task activated it (a local task); its body is vector
//! operations over descriptors (DSDs) of SRAM (base, length, stride) or of the fabric
//! (the next wavelets to receive on, or send on, a colour).
//!
//! SRAM holds 32-bit words (f32 values); addresses and lengths count words. A memory
//! descriptor's address is affine in the counters of the loops around it:
//! element `i` of `Mem { base, len, stride, step, by }` inside loops with counters
//! `c0, c1, ...` (outermost first) is at `base + i * stride + sum_d c_d * step[d]`,
//! plus `n * s` when `by` is `Some((k, s))` and the PE's counter `k` is at `n` (a
//! task's runs, counted with `Count`: which sample's slot of a buffer it uses), plus
//! `scale * v` when it has an `index` whose word holds `v` (a gather's row: the word's
//! address is affine in the loops' counters too, and `v` is read as an integer).

use super::pipeline::Pipeline;
use crate::ir::{float, DType};
use crate::tensor::round_float;

/// The task ids of a PE (0 to 63; lower ids run first).
pub const TASKS: u8 = 64;

/// The counters of a PE (`Count`).
pub const COUNTERS: u8 = 8;

/// A colour (virtual channel) of the fabric.
pub type Colour = u8;

/// A task's number within its program: also its priority (lower runs first).
pub type TaskId = u8;

/// A vector operand or destination.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Dsd {
    /// `len` words of SRAM (see the module's doc for the address).
    Mem {
        base: u32,
        len: u32,
        stride: i32,
        /// Per enclosing loop (outermost first): how far the base moves per iteration.
        step: Vec<i32>,
        /// A PE counter, and how far the base moves per count.
        by: Option<(u8, i32)>,
        /// A word whose value moves the base (an indexed row).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        index: Option<Index>,
    },
    /// The next `len` wavelets that arrive on `colour`.
    In { colour: Colour, len: u32 },
    /// `len` wavelets sent on `colour`.
    Out { colour: Colour, len: u32 },
}

impl Dsd {
    /// `len` contiguous words at `base`.
    pub fn mem(base: u32, len: u32) -> Dsd {
        Dsd::strided(base, len, 1, &[], None)
    }

    /// `len` words at `base`, `stride` apart, moved `step[d]` per iteration of the
    /// `d`th loop around it (and `by.1` words per count of the PE's counter `by.0`).
    pub fn strided(base: u32, len: u32, stride: i32, step: &[u32], by: Option<(u8, i32)>) -> Dsd {
        Dsd::Mem {
            base,
            len,
            stride,
            step: step.iter().map(|&s| s as i32).collect(),
            by,
            index: None,
        }
    }

    /// `len` contiguous words at `base + scale * v`, `v` the value of the word at `at`,
    /// moved `step[d]` words per iteration of the `d`th loop around it (a row of a
    /// table, chosen by a word the PE computed).
    pub fn indexed(base: u32, len: u32, at: u32, step: &[u32], scale: u32) -> Dsd {
        Dsd::Mem {
            base,
            len,
            stride: 1,
            step: Vec::new(),
            by: None,
            index: Some(Index {
                at,
                step: step.iter().map(|&s| s as i32).collect(),
                scale: scale as i32,
            }),
        }
    }

    /// The loops a memory descriptor steps over (0 for the fabric's).
    pub fn depth(&self) -> usize {
        match self {
            Dsd::Mem { step, index, .. } => {
                step.len().max(index.as_ref().map_or(0, |x| x.step.len()))
            }
            _ => 0,
        }
    }

    /// The elements it describes.
    pub fn len(&self) -> u32 {
        match self {
            Dsd::Mem { len, .. } | Dsd::In { len, .. } | Dsd::Out { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The word of element `i` of a memory descriptor inside loops at `loops`, on a
    /// PE whose counters are at `counters` and whose memory is `mem` (`None` for the
    /// fabric's descriptors, and for an index word outside memory or not a number).
    pub fn word(&self, i: u32, loops: &[u32], counters: &[u32], mem: &[f32]) -> Option<i64> {
        let Dsd::Mem {
            base,
            stride,
            step,
            by,
            index,
            ..
        } = self
        else {
            return None;
        };
        let affine = |base: i64, step: &[i32]| {
            step.iter()
                .zip(loops)
                .fold(base, |a, (s, c)| a + i64::from(*s) * i64::from(*c))
        };
        let mut a = affine(i64::from(*base) + i64::from(i) * i64::from(*stride), step);
        if let Some((k, s)) = by {
            a += i64::from(*s) * i64::from(counters.get(*k as usize).copied().unwrap_or(0));
        }
        if let Some(x) = index {
            let at = usize::try_from(affine(i64::from(x.at), &x.step)).ok()?;
            let v = mem.get(at).copied().filter(|v| v.is_finite())?;
            a += i64::from(x.scale) * v.trunc() as i64;
        }
        Some(a)
    }
}

/// The word of SRAM that moves a memory descriptor's base: `scale` words per unit of
/// its value (truncated to an integer), the word at `at + sum_d c_d * step[d]` in loops
/// with counters `c0, c1, ...`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Index {
    pub at: u32,
    pub step: Vec<i32>,
    pub scale: i32,
}

/// A scalar or vector source.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Src {
    /// A vector, element by element.
    V(Dsd),
    /// One SRAM word, the same for every element.
    Scalar(u32),
    /// One wavelet received on a colour, the same for every element.
    Recv(Colour),
    /// A constant.
    Imm(#[serde(with = "super::text::f32_json")] f32),
}

/// What a vector operation computes per element from its sources `a, b, c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum VecOp {
    /// `a`
    Mov,
    /// `a + b * c` (multiply-accumulate)
    Fmac,
    Add,
    Sub,
    Mul,
    Max,
    Min,
    /// `-a`
    Neg,
    /// `max(a, 0)` (NaN stays NaN)
    Relu,
    /// `if a > 0 { b } else { 0 }`: a gradient through ReLU (`a` the ReLU's output)
    ReluGrad,
    /// `a / b` (in software)
    Div,
    /// `exp(a)` (in software)
    Exp,
    /// `ln(a)` (in software)
    Log,
    /// `sqrt(a)`, `1 / sqrt(a)`, `tanh(a)`, `1 / (1 + exp(-a))`, `a` to the power `b`,
    /// `floor(a)`, `a` rounded toward zero (in software)
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Pow,
    Floor,
    Trunc,
    /// The sign of `a` (-1, 0 or 1; NaN stays NaN)
    Sign,
    /// `sin(a)`, `cos(a)`, `erf(a)` (in software)
    Sin,
    Cos,
    Erf,
    /// Comparisons: 1 when `a` and `b` compare so, else 0
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `if a != 0 { b } else { c }`
    Sel,
    /// `a + b * c` of half-precision `b` and `c` (f16 or bf16 values, whose products
    /// f32 holds exactly), accumulated in f32 (CSL's mixed `@fmachs`): on the fp16
    /// lanes.
    Fmach,
    /// `a * b` of half-precision values, in f32: on the fp16 lanes.
    Mulh,
    /// `a` rounded to f16, or to bf16 (to nearest, ties to even): free in the cost
    /// model (it stands for the half-precision write of the operation before it).
    ToF16,
    ToBf16,
}

impl VecOp {
    /// The sources it reads.
    pub fn arity(self) -> usize {
        match self {
            VecOp::Mov
            | VecOp::Neg
            | VecOp::Relu
            | VecOp::Exp
            | VecOp::Log
            | VecOp::Sqrt
            | VecOp::Rsqrt
            | VecOp::Tanh
            | VecOp::Sigmoid
            | VecOp::Floor
            | VecOp::Trunc
            | VecOp::Sign
            | VecOp::Sin
            | VecOp::Cos
            | VecOp::Erf
            | VecOp::ToF16
            | VecOp::ToBf16 => 1,
            VecOp::Fmac | VecOp::Fmach | VecOp::Sel => 3,
            _ => 2,
        }
    }

    /// Whether the PE computes it in software, element by element, rather than on its
    /// SIMD units.
    pub fn software(self) -> bool {
        matches!(
            self,
            VecOp::Div
                | VecOp::Exp
                | VecOp::Log
                | VecOp::Sqrt
                | VecOp::Rsqrt
                | VecOp::Tanh
                | VecOp::Sigmoid
                | VecOp::Pow
                | VecOp::Floor
                | VecOp::Trunc
                | VecOp::Sin
                | VecOp::Cos
                | VecOp::Erf
        )
    }

    /// Whether it runs on the fp16 lanes, its operands 16-bit words.
    pub fn half(self) -> bool {
        matches!(self, VecOp::Fmach | VecOp::Mulh)
    }

    /// Whether it rounds to half precision (`ToF16`, `ToBf16`).
    pub fn rounds(self) -> bool {
        matches!(self, VecOp::ToF16 | VecOp::ToBf16)
    }

    /// The op that computes the same on half-precision operands on the fp16 lanes,
    /// where there is one (a product's: `Fmac`, `Mul`); else itself.
    pub fn halved(self) -> VecOp {
        match self {
            VecOp::Fmac => VecOp::Fmach,
            VecOp::Mul => VecOp::Mulh,
            op => op,
        }
    }

    /// The op that rounds to `dtype`, a half-precision float (none for another).
    pub fn round_to(dtype: DType) -> Option<VecOp> {
        match dtype {
            DType::F16 => Some(VecOp::ToF16),
            DType::BF16 => Some(VecOp::ToBf16),
            _ => None,
        }
    }

    /// The value of one element, computed in f32 as the interpreter does.
    pub fn apply(self, a: f32, b: f32, c: f32) -> f32 {
        match self {
            VecOp::Mov => a,
            VecOp::Fmac | VecOp::Fmach => a + b * c,
            VecOp::Mulh => a * b,
            VecOp::ToF16 => round_float(DType::F16, a),
            VecOp::ToBf16 => round_float(DType::BF16, a),
            VecOp::Add => a + b,
            VecOp::Sub => a - b,
            VecOp::Mul => a * b,
            VecOp::Max => float::maximum(a, b),
            VecOp::Min => float::minimum(a, b),
            VecOp::Neg => -a,
            VecOp::Relu => float::relu(a),
            VecOp::ReluGrad => {
                if a > 0.0 {
                    b
                } else {
                    0.0
                }
            }
            VecOp::Div => a / b,
            VecOp::Exp => a.exp(),
            VecOp::Log => a.ln(),
            VecOp::Sqrt => a.sqrt(),
            VecOp::Rsqrt => 1.0 / a.sqrt(),
            VecOp::Tanh => a.tanh(),
            VecOp::Sigmoid => 1.0 / (1.0 + (-a).exp()),
            VecOp::Pow => a.powf(b),
            VecOp::Floor => a.floor(),
            VecOp::Trunc => a.trunc(),
            VecOp::Sign => float::sign(a),
            VecOp::Sin => a.sin(),
            VecOp::Cos => a.cos(),
            VecOp::Erf => float::erf(f64::from(a)) as f32,
            VecOp::Eq => f32::from(u8::from(a == b)),
            VecOp::Ne => f32::from(u8::from(a != b)),
            VecOp::Lt => f32::from(u8::from(a < b)),
            VecOp::Le => f32::from(u8::from(a <= b)),
            VecOp::Gt => f32::from(u8::from(a > b)),
            VecOp::Ge => f32::from(u8::from(a >= b)),
            VecOp::Sel => {
                if a != 0.0 {
                    b
                } else {
                    c
                }
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            VecOp::Mov => "mov",
            VecOp::Fmac => "fmac",
            VecOp::Add => "add",
            VecOp::Sub => "sub",
            VecOp::Mul => "mul",
            VecOp::Max => "max",
            VecOp::Min => "min",
            VecOp::Neg => "neg",
            VecOp::Relu => "relu",
            VecOp::ReluGrad => "relu_grad",
            VecOp::Div => "div",
            VecOp::Exp => "exp",
            VecOp::Log => "log",
            VecOp::Sqrt => "sqrt",
            VecOp::Rsqrt => "rsqrt",
            VecOp::Tanh => "tanh",
            VecOp::Sigmoid => "sigmoid",
            VecOp::Pow => "pow",
            VecOp::Floor => "floor",
            VecOp::Trunc => "trunc",
            VecOp::Sign => "sign",
            VecOp::Sin => "sin",
            VecOp::Cos => "cos",
            VecOp::Erf => "erf",
            VecOp::Eq => "eq",
            VecOp::Ne => "ne",
            VecOp::Lt => "lt",
            VecOp::Le => "le",
            VecOp::Gt => "gt",
            VecOp::Ge => "ge",
            VecOp::Sel => "sel",
            VecOp::Fmach => "fmach",
            VecOp::Mulh => "mulh",
            VecOp::ToF16 => "to_f16",
            VecOp::ToBf16 => "to_bf16",
        }
    }
}

/// The most dimensions one vector operation's memory descriptors span (CSL's
/// `mem4d_dsd`): the operation's own, and up to three loops around it.
pub const DSD_DIMS: usize = 4;

/// One instruction of a task's body.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Instr {
    /// `dst[i] = op(srcs[0][i], srcs[1][i], srcs[2][i])` for every element of `dst`.
    Vec { op: VecOp, dst: Dsd, srcs: Vec<Src> },
    /// `body`, `count` times; the memory descriptors inside advance by their `step`.
    Loop { count: u32, body: Vec<Instr> },
    /// Marks a local task ready to run.
    Activate(TaskId),
    /// Adds one to counter `counter`; when it reaches `every`, resets it and activates
    /// `then`, if any (a task that runs once per `every` runs of this one); else, when
    /// `again`, activates the task it is in once more (a task run `every` times in a
    /// row: a pass over a step's samples, each run one sample's).
    Count {
        counter: u8,
        every: u32,
        then: Option<TaskId>,
        #[serde(default, skip_serializing_if = "is_false")]
        again: bool,
    },
}

/// What starts a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Trigger {
    /// A wavelet waiting on this colour.
    Data(Colour),
    /// An `Activate` (or `Count`) of another task, or the program's start.
    Local { at_start: bool },
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Task {
    pub id: TaskId,
    pub name: String,
    pub trigger: Trigger,
    pub body: Vec<Instr>,
}

/// A named buffer of a PE's memory map.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Symbol {
    pub name: String,
    pub base: u32,
    pub len: u32,
}

/// A PE's program: its tasks and memory map.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct Program {
    pub tasks: Vec<Task>,
    pub symbols: Vec<Symbol>,
    /// A replica's share of the samples: its data tasks run for one sample in `deal`
    /// (0 or 1: for every sample; see `kernels/vector/`, replicas).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deal: u32,
    /// The order its forward and backward tasks run in (`pipeline.rs`), when it has
    /// both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<Pipeline>,
    /// Buffers of SRAM that take a colour's wavelets as they arrive, beside the
    /// router's queue (CSL's FIFOs, filled by a microthread while a task runs): a
    /// sender sees that many more words of room. Each is a symbol of the memory map.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fifos: Vec<Fifo>,
}

/// A buffer of `words` on colour `colour`'s input (`Program::fifos`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fifo {
    pub colour: Colour,
    pub words: u32,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Program {
    /// One sample in how many its data tasks run for.
    pub fn share(&self) -> u32 {
        self.deal.max(1)
    }

    /// The SRAM words its memory map spans.
    pub fn words(&self) -> u32 {
        self.symbols
            .iter()
            .map(|s| s.base + s.len)
            .max()
            .unwrap_or(0)
    }

    /// Adds a FIFO of `words` on colour `colour`'s input (none for 0 words).
    pub fn fifo(&mut self, colour: Colour, words: u32) {
        if words > 0 {
            self.alloc(&format!("c{colour} fifo"), words);
            self.fifos.push(Fifo { colour, words });
        }
    }

    /// The words its FIFOs hold on colour `colour`'s input.
    pub fn fifo_words(&self, colour: Colour) -> u32 {
        (self.fifos.iter())
            .filter(|f| f.colour == colour)
            .map(|f| f.words)
            .sum()
    }

    /// The wavelets a run of task `id` receives on `colour`.
    pub fn receives(&self, id: TaskId, colour: Colour) -> u64 {
        fn body(b: &[Instr], colour: Colour) -> u64 {
            b.iter()
                .map(|i| match i {
                    Instr::Vec { srcs, .. } => (srcs.iter())
                        .map(|s| match s {
                            Src::V(Dsd::In { colour: c, len }) if *c == colour => u64::from(*len),
                            Src::Recv(c) if *c == colour => 1,
                            _ => 0,
                        })
                        .sum(),
                    Instr::Loop { count, body: b } => u64::from(*count) * body(b, colour),
                    _ => 0,
                })
                .sum()
        }
        (self.tasks.iter())
            .filter(|t| t.id == id)
            .map(|t| body(&t.body, colour))
            .sum()
    }

    /// Adds a buffer of `len` words after the last one; returns its base.
    pub fn alloc(&mut self, name: &str, len: u32) -> u32 {
        let base = self.words();
        self.symbols.push(Symbol {
            name: name.to_string(),
            base,
            len,
        });
        base
    }

    /// The buffer holding word `addr`, if any.
    pub fn symbol_at(&self, addr: u32) -> Option<&Symbol> {
        self.symbols
            .iter()
            .find(|s| addr >= s.base && addr < s.base + s.len)
    }

    /// Why the program is malformed, if it is: a task id used twice or not found, a
    /// loop deeper than its descriptors' steps say, an operation with the wrong number
    /// of sources or lengths that disagree.
    pub fn check(&self) -> Result<(), String> {
        for (i, t) in self.tasks.iter().enumerate() {
            if t.id >= TASKS {
                return Err(format!("task {} is beyond the PE's {TASKS} task ids", t.id));
            }
            if self.tasks[..i].iter().any(|u| u.id == t.id) {
                return Err(format!("task {} is defined twice", t.id));
            }
        }
        let known = |id: TaskId| self.tasks.iter().any(|t| t.id == id);
        fn walk(
            body: &[Instr],
            depth: usize,
            known: &dyn Fn(TaskId) -> bool,
        ) -> Result<(), String> {
            for ins in body {
                match ins {
                    Instr::Vec { op, dst, srcs } => {
                        if srcs.len() != op.arity() {
                            return Err(format!(
                                "`{}` takes {} sources, not {}",
                                op.name(),
                                op.arity(),
                                srcs.len()
                            ));
                        }
                        if matches!(dst, Dsd::In { .. }) {
                            return Err(format!("`{}` writes to a fabric input", op.name()));
                        }
                        for s in srcs {
                            match s {
                                Src::V(Dsd::Out { .. }) => {
                                    return Err(format!(
                                        "`{}` reads from a fabric output",
                                        op.name()
                                    ))
                                }
                                Src::V(d) if d.len() != dst.len() => {
                                    return Err(format!(
                                        "`{}` has a source of {} elements for {}",
                                        op.name(),
                                        d.len(),
                                        dst.len()
                                    ))
                                }
                                _ => {}
                            }
                        }
                        let deep = std::iter::once(dst)
                            .chain(srcs.iter().filter_map(|s| match s {
                                Src::V(d) => Some(d),
                                _ => None,
                            }))
                            .any(|d| d.depth() > depth);
                        if deep {
                            return Err(format!(
                                "`{}` steps over more loops than the {depth} around it",
                                op.name()
                            ));
                        }
                    }
                    Instr::Loop { body, .. } => walk(body, depth + 1, known)?,
                    Instr::Activate(id) | Instr::Count { then: Some(id), .. } => {
                        if !known(*id) {
                            return Err(format!("task {id} does not exist"));
                        }
                    }
                    Instr::Count { counter, .. } if *counter >= COUNTERS => {
                        return Err(format!("counter {counter} is beyond the PE's {COUNTERS}"));
                    }
                    Instr::Count { .. } => {}
                }
            }
            Ok(())
        }
        for t in &self.tasks {
            walk(&t.body, 0, &known).map_err(|e| format!("task {}: {e}", t.name))?;
        }
        let data = |id: TaskId| {
            (self.tasks.iter()).any(|t| t.id == id && matches!(t.trigger, Trigger::Data(_)))
        };
        self.pipeline.as_ref().map_or(Ok(()), |p| p.check(data))
    }
}

impl Instr {
    /// The dimensions of the one vector operation this instruction is, if it is one: a
    /// vector operation (1), or a loop whose body is one such operation (one more), up
    /// to `DSD_DIMS`. Its descriptors then move affinely with the loops, as a
    /// multi-dimensional descriptor's, so the machine starts it once. A descriptor
    /// moved by a word of SRAM (an indexed row), a source received or read once per
    /// operation (a scalar), and a loop that runs no iteration are not affine in the
    /// loops: such an operation starts at every iteration.
    pub fn dims(&self) -> Option<usize> {
        let d = match self {
            Instr::Vec { dst, srcs, .. } => {
                let indexed = |d: &Dsd| matches!(d, Dsd::Mem { index: Some(_), .. });
                let ok = !indexed(dst)
                    && srcs.iter().all(|s| match s {
                        Src::V(d) => !indexed(d),
                        Src::Recv(_) | Src::Scalar(_) => false,
                        Src::Imm(_) => true,
                    });
                ok.then_some(1)?
            }
            Instr::Loop { count, body } => match &body[..] {
                [one] if *count > 0 => one.dims()? + 1,
                _ => return None,
            },
            _ => return None,
        };
        (d <= DSD_DIMS).then_some(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gemv_column() -> Program {
        // y[0..4] += W[k][0..4] * x_k for the 3 values x_k arriving on colour 1
        let mut p = Program::default();
        let w = p.alloc("W", 12);
        let y = p.alloc("y", 4);
        p.tasks.push(Task {
            id: 0,
            name: "forward".into(),
            trigger: Trigger::Data(1),
            body: vec![Instr::Loop {
                count: 3,
                body: vec![Instr::Vec {
                    op: VecOp::Fmac,
                    dst: Dsd::mem(y, 4),
                    srcs: vec![
                        Src::V(Dsd::mem(y, 4)),
                        Src::V(Dsd::strided(w, 4, 1, &[4], None)),
                        Src::Recv(1),
                    ],
                }],
            }],
        });
        p
    }

    #[test]
    fn programs_print_their_memory_map_and_tasks() {
        let p = gemv_column();
        p.check().unwrap();
        assert_eq!(
            p.to_string(),
            "memory (16 words):\n       0 .. 12     W\n      12 .. 16     y\n\
             task t0 forward (on c1):\n  loop i0 in 0..3\n    \
             fmac      mem[12; 4], mem[12; 4], mem[0 + 4*i0; 4], recv(c1)\n"
        );
        assert_eq!(p.symbol_at(13).map(|s| s.name.as_str()), Some("y"));
    }

    #[test]
    fn malformed_programs_are_refused() {
        let mut p = gemv_column();
        p.tasks[0].body = match p.tasks[0].body.remove(0) {
            Instr::Loop { body, .. } => body,
            _ => unreachable!(),
        };
        assert!(p.check().unwrap_err().contains("more loops"));
        let mut p = gemv_column();
        p.tasks[0].body.push(Instr::Activate(7));
        assert!(p.check().unwrap_err().contains("task 7"));
        let mut p = gemv_column();
        p.tasks[0].id = 64;
        assert!(p.check().unwrap_err().contains("beyond"));
    }
}
