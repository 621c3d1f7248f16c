//! LLVM IR for the generated kernels (through inkwell): fused loops (elementwise chains
//! and reductions), softmax rows, direct convolutions (`conv`) and max pooling (`pool`).
//!
//! Every kernel is `i64 NAME(ptr table, i64 start, i64 end)`: `table` holds the
//! addresses of its buffers, `[start, end)` is the range of its outermost loop (so a
//! kernel can be split across threads), and the result is 0, or 1 after an integer
//! division by zero. Its body is an inner function taking each buffer as a `noalias`
//! pointer, always inlined, so that LLVM knows the buffers do not overlap and
//! vectorises the innermost loops. Values live in registers as f32 (every float dtype;
//! f16 and bf16 are rounded after every op), i64 (every integer dtype, wrapped to its
//! width after every op, as the interpreter does) or i1 (booleans).
//!
//! `exp`, `log` and `tanh` are emitted as polynomials (Cephes' single-precision
//! approximations, within 2 ulp): LLVM does not vectorise calls to `llvm.exp`.

mod conv;
mod pool;
mod portable;

use super::lower::{Bufs, Elem, Kernel, Loop, View};
use crate::ir::{BinaryOp, DType, Graph, NodeIndex, Op, ReduceOp, UnaryOp};
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::types::{BasicType, BasicTypeEnum};
use inkwell::values::{
    BasicValue, BasicValueEnum, FloatValue, FunctionValue, IntValue, PointerValue,
};
use inkwell::{FloatPredicate, IntPredicate};
use rustc_hash::FxHashMap;

/// A value in registers.
#[derive(Clone, Copy)]
enum Val<'c> {
    F(FloatValue<'c>),
    I(IntValue<'c>),
    B(IntValue<'c>),
}

impl<'c> Val<'c> {
    fn f(self) -> FloatValue<'c> {
        match self {
            Val::F(v) => v,
            _ => panic!("a float value"),
        }
    }

    fn i(self) -> IntValue<'c> {
        match self {
            Val::I(v) | Val::B(v) => v,
            Val::F(_) => panic!("an integer value"),
        }
    }
}

/// Builds one module of kernels.
pub struct Codegen<'c> {
    ctx: &'c Context,
    pub module: Module<'c>,
    b: Builder<'c>,
    cpu: String,
    features: String,
}

/// What a kernel function needs to be called: its symbol and its buffers, in order.
#[derive(Debug, Clone)]
pub struct KernelFn {
    pub name: String,
    pub bufs: Vec<usize>,
}

type R<T> = Result<T, String>;

fn e<T, E: std::fmt::Debug>(r: Result<T, E>) -> R<T> {
    r.map_err(|e| format!("{e:?}"))
}

/// The state of one kernel body being built.
struct Body<'c, 'g> {
    g: &'g Graph,
    f: FunctionValue<'c>,
    /// Buffer id -> its pointer parameter.
    ptrs: FxHashMap<usize, PointerValue<'c>>,
    /// Nodes read from memory.
    leaves: FxHashMap<NodeIndex, View>,
    bufs: &'g Bufs,
    status: PointerValue<'c>,
}

impl<'c> Codegen<'c> {
    pub fn new(ctx: &'c Context, name: &str, cpu: &str, features: &str) -> Codegen<'c> {
        Codegen {
            ctx,
            module: ctx.create_module(name),
            b: ctx.create_builder(),
            cpu: cpu.to_string(),
            features: features.to_string(),
        }
    }

    /// Emits `kernel` as function `name`; `None` for kernels that are not generated.
    pub fn kernel(
        &mut self,
        name: &str,
        kernel: &Kernel,
        g: &Graph,
        bufs: &Bufs,
    ) -> R<Option<KernelFn>> {
        match kernel {
            Kernel::Loop(l) => self.loop_kernel(name, l, g, bufs).map(Some),
            Kernel::Softmax {
                node,
                log,
                axis,
                x,
                out,
            } => {
                let dtype = g.node(*node).ty.dtype;
                self.softmax_kernel(name, *log, *axis, x, out, dtype, g, bufs)
                    .map(Some)
            }
            Kernel::Conv {
                filter,
                x,
                k,
                out,
                d,
                ..
            } => self
                .conv_kernel(name, *filter, [x, k, out], d, g, bufs)
                .map(Some),
            Kernel::Pad {
                x, out, top, left, ..
            } => self
                .pad_kernel(name, [x, out], [*top, *left], g, bufs)
                .map(Some),
            Kernel::MaxPool {
                x, dy, out, geo, ..
            } => self
                .max_pool_kernel(name, [x, out], dy.as_ref(), geo, g, bufs)
                .map(Some),
            Kernel::MatMul { .. } | Kernel::Native { .. } => Ok(None),
        }
    }

    fn attrs(&self, f: FunctionValue<'c>) {
        let s = |k: &str, v: &str| self.ctx.create_string_attribute(k, v);
        f.add_attribute(AttributeLoc::Function, s("target-cpu", &self.cpu));
        f.add_attribute(AttributeLoc::Function, s("target-features", &self.features));
        let nounwind = Attribute::get_named_enum_kind_id("nounwind");
        f.add_attribute(
            AttributeLoc::Function,
            self.ctx.create_enum_attribute(nounwind, 0),
        );
    }

    /// The outer function `name(table, start, end)` and the inner one taking `n`
    /// noalias pointers; returns the inner function, positioned at its entry.
    fn functions(&mut self, name: &str, n: usize) -> R<FunctionValue<'c>> {
        let i64t = self.ctx.i64_type();
        let ptr = self.ctx.ptr_type(inkwell::AddressSpace::default());
        let mut params: Vec<inkwell::types::BasicMetadataTypeEnum> = vec![ptr.into(); n];
        params.push(i64t.into());
        params.push(i64t.into());
        let inner = self.module.add_function(
            &format!("{name}.body"),
            i64t.fn_type(&params, false),
            Some(Linkage::Private),
        );
        self.attrs(inner);
        let noalias = Attribute::get_named_enum_kind_id("noalias");
        let inline = Attribute::get_named_enum_kind_id("alwaysinline");
        for k in 0..n {
            inner.add_attribute(
                AttributeLoc::Param(k as u32),
                self.ctx.create_enum_attribute(noalias, 0),
            );
        }
        inner.add_attribute(
            AttributeLoc::Function,
            self.ctx.create_enum_attribute(inline, 0),
        );
        let outer = self.module.add_function(
            name,
            i64t.fn_type(&[ptr.into(), i64t.into(), i64t.into()], false),
            None,
        );
        self.attrs(outer);
        let entry = self.ctx.append_basic_block(outer, "entry");
        self.b.position_at_end(entry);
        let table = outer.get_nth_param(0).expect("table").into_pointer_value();
        let mut args: Vec<inkwell::values::BasicMetadataValueEnum> = Vec::new();
        for k in 0..n {
            let at = unsafe {
                e(self.b.build_in_bounds_gep(
                    ptr,
                    table,
                    &[i64t.const_int(k as u64, false)],
                    "slot",
                ))?
            };
            args.push(e(self.b.build_load(ptr, at, "buf"))?.into());
        }
        args.push(outer.get_nth_param(1).expect("start").into());
        args.push(outer.get_nth_param(2).expect("end").into());
        let r = e(self.b.build_call(inner, &args, "r"))?;
        let rv = r.try_as_basic_value().basic().expect("a result");
        e(self.b.build_return(Some(&rv)))?;
        let entry = self.ctx.append_basic_block(inner, "entry");
        self.b.position_at_end(entry);
        Ok(inner)
    }

    fn body<'g>(
        &mut self,
        name: &str,
        g: &'g Graph,
        bufs: &'g Bufs,
        views: &[&View],
        leaves: FxHashMap<NodeIndex, View>,
    ) -> R<(Body<'c, 'g>, Vec<usize>)> {
        let mut ids: Vec<usize> = views.iter().map(|v| v.buf).collect();
        ids.extend(leaves.values().map(|v| v.buf));
        ids.sort_unstable();
        ids.dedup();
        let f = self.functions(name, ids.len())?;
        let ptrs = ids
            .iter()
            .enumerate()
            .map(|(k, &b)| {
                (
                    b,
                    f.get_nth_param(k as u32)
                        .expect("param")
                        .into_pointer_value(),
                )
            })
            .collect();
        let i64t = self.ctx.i64_type();
        let status = e(self.b.build_alloca(i64t, "status"))?;
        e(self.b.build_store(status, i64t.const_zero()))?;
        Ok((
            Body {
                g,
                f,
                ptrs,
                leaves,
                bufs,
                status,
            },
            ids,
        ))
    }

    /// Returns the kernel's status, ending kernel `name` over buffers `ids`.
    fn finish(&mut self, body: &Body<'c, '_>, name: &str, ids: Vec<usize>) -> R<KernelFn> {
        let s = e(self
            .b
            .build_load(self.ctx.i64_type(), body.status, "status"))?;
        e(self.b.build_return(Some(&s)))?;
        Ok(KernelFn {
            name: name.to_string(),
            bufs: ids,
        })
    }

    fn start_end(&self, body: &Body<'c, '_>, n: usize) -> (IntValue<'c>, IntValue<'c>) {
        let k = n as u32;
        (
            body.f.get_nth_param(k).expect("start").into_int_value(),
            body.f.get_nth_param(k + 1).expect("end").into_int_value(),
        )
    }

    fn loop_kernel(&mut self, name: &str, l: &Loop, g: &Graph, bufs: &Bufs) -> R<KernelFn> {
        let l = &l.collapsed(g);
        let leaves: FxHashMap<NodeIndex, View> = l.leaves.iter().cloned().collect();
        let (body, ids) = self.body(name, g, bufs, &[&l.out], leaves)?;
        let (start, end) = self.start_end(&body, ids.len());
        let root = g.node(l.root);
        match &root.op {
            Op::Reduce { op, axes, .. } if !l.is_copy() => {
                let x = g.operands(l.root)[0];
                self.reduce(&body, l.root, x, *op, axes, &l.out, start, end)?;
            }
            _ => {
                let shape = l.out.shape.clone();
                let dims = if shape.is_empty() {
                    vec![1]
                } else {
                    shape.clone()
                };
                self.nest(&body, &dims, start, end, &mut |cg, idx| {
                    let idx = if shape.is_empty() { &idx[..0] } else { idx };
                    let v = cg.gen(&body, l.root, idx)?;
                    cg.store(&body, &l.out, idx, v)
                })?;
            }
        }
        self.finish(&body, name, ids)
    }

    /// Loops over `dims` (the outermost over `[start, end)`), calling `f` with the
    /// index in the innermost body.
    fn nest(
        &mut self,
        body: &Body<'c, '_>,
        dims: &[usize],
        start: IntValue<'c>,
        end: IntValue<'c>,
        f: &mut dyn FnMut(&mut Self, &[IntValue<'c>]) -> R<()>,
    ) -> R<()> {
        let mut idx = Vec::with_capacity(dims.len());
        self.nest_at(body, dims, 0, Some((start, end)), &mut idx, f)
    }

    fn nest_at(
        &mut self,
        body: &Body<'c, '_>,
        dims: &[usize],
        k: usize,
        range: Option<(IntValue<'c>, IntValue<'c>)>,
        idx: &mut Vec<IntValue<'c>>,
        f: &mut dyn FnMut(&mut Self, &[IntValue<'c>]) -> R<()>,
    ) -> R<()> {
        if k == dims.len() {
            return f(self, idx);
        }
        let i64t = self.ctx.i64_type();
        let (lo, hi) = range.unwrap_or((i64t.const_zero(), i64t.const_int(dims[k] as u64, false)));
        self.counted(body.f, lo, hi, &mut |cg, i| {
            idx.push(i);
            let r = cg.nest_at(body, dims, k + 1, None, idx, f);
            idx.pop();
            r
        })
    }

    /// A loop `for i in lo..hi`, guarded and rotated (the form LLVM vectorises).
    fn counted(
        &mut self,
        f: FunctionValue<'c>,
        lo: IntValue<'c>,
        hi: IntValue<'c>,
        body: &mut dyn FnMut(&mut Self, IntValue<'c>) -> R<()>,
    ) -> R<()> {
        let i64t = self.ctx.i64_type();
        let pre = self.b.get_insert_block().expect("a block");
        let head = self.ctx.append_basic_block(f, "loop");
        let exit = self.ctx.append_basic_block(f, "done");
        let go = e(self.b.build_int_compare(IntPredicate::SLT, lo, hi, "go"))?;
        e(self.b.build_conditional_branch(go, head, exit))?;
        self.b.position_at_end(head);
        let phi = e(self.b.build_phi(i64t, "i"))?;
        phi.add_incoming(&[(&lo, pre)]);
        let i = phi.as_basic_value().into_int_value();
        body(self, i)?;
        let next = e(self.b.build_int_add(i, i64t.const_int(1, false), "i.next"))?;
        let more = e(self
            .b
            .build_int_compare(IntPredicate::SLT, next, hi, "more"))?;
        let latch = self.b.get_insert_block().expect("a block");
        e(self.b.build_conditional_branch(more, head, exit))?;
        phi.add_incoming(&[(&next, latch)]);
        self.b.position_at_end(exit);
        Ok(())
    }

    /// The address of element `idx` of a view.
    fn addr(&self, body: &Body<'c, '_>, v: &View, idx: &[IntValue<'c>]) -> R<PointerValue<'c>> {
        let i64t = self.ctx.i64_type();
        let mut off = i64t.const_int(v.offset as u64, true);
        for (i, &s) in idx.iter().zip(&v.strides) {
            if s == 0 {
                continue;
            }
            let t = e(self
                .b
                .build_int_mul(*i, i64t.const_int(s as u64, true), "t"))?;
            off = e(self.b.build_int_add(off, t, "off"))?;
        }
        let elem = body.bufs.bufs[v.buf].elem;
        let p = body.ptrs[&v.buf];
        unsafe {
            e(self
                .b
                .build_in_bounds_gep(self.elem_type(elem), p, &[off], "at"))
        }
    }

    fn elem_type(&self, elem: Elem) -> BasicTypeEnum<'c> {
        match elem {
            Elem::F32 => self.ctx.f32_type().as_basic_type_enum(),
            Elem::I32 => self.ctx.i32_type().as_basic_type_enum(),
            Elem::U8 => self.ctx.i8_type().as_basic_type_enum(),
            Elem::I64 => self.ctx.i64_type().as_basic_type_enum(),
        }
    }

    fn load(
        &self,
        body: &Body<'c, '_>,
        v: &View,
        idx: &[IntValue<'c>],
        dtype: DType,
    ) -> R<Val<'c>> {
        let elem = body.bufs.bufs[v.buf].elem;
        let at = self.addr(body, v, idx)?;
        let x = e(self.b.build_load(self.elem_type(elem), at, "x"))?;
        let i64t = self.ctx.i64_type();
        Ok(match (elem, dtype) {
            (Elem::F32, _) => Val::F(x.into_float_value()),
            (Elem::U8, DType::Bool) => Val::B(e(self.b.build_int_compare(
                IntPredicate::NE,
                x.into_int_value(),
                self.ctx.i8_type().const_zero(),
                "b",
            ))?),
            (Elem::U8, _) => Val::I(e(self.b.build_int_z_extend(x.into_int_value(), i64t, "z"))?),
            (Elem::I32, _) => Val::I(e(self.b.build_int_s_extend(x.into_int_value(), i64t, "s"))?),
            (Elem::I64, _) => Val::I(x.into_int_value()),
        })
    }

    fn store(&self, body: &Body<'c, '_>, v: &View, idx: &[IntValue<'c>], x: Val<'c>) -> R<()> {
        let elem = body.bufs.bufs[v.buf].elem;
        let at = self.addr(body, v, idx)?;
        let value: BasicValueEnum = match (elem, x) {
            (Elem::F32, Val::F(f)) => f.into(),
            (Elem::U8, Val::B(b)) => {
                e(self.b.build_int_z_extend(b, self.ctx.i8_type(), "b8"))?.into()
            }
            (Elem::U8, Val::I(i)) => {
                e(self.b.build_int_truncate(i, self.ctx.i8_type(), "t8"))?.into()
            }
            (Elem::I32, Val::I(i)) => {
                e(self.b.build_int_truncate(i, self.ctx.i32_type(), "t32"))?.into()
            }
            (Elem::I64, Val::I(i)) => i.into(),
            _ => return Err("a value stored into a buffer of another kind".into()),
        };
        e(self.b.build_store(at, value))?;
        Ok(())
    }

    fn f32c(&self, x: f64) -> FloatValue<'c> {
        self.ctx.f32_type().const_float(x)
    }

    fn i64c(&self, x: i64) -> IntValue<'c> {
        self.ctx.i64_type().const_int(x as u64, true)
    }

    /// Rounds a float result to its dtype's precision.
    fn round(&self, x: FloatValue<'c>, dtype: DType) -> R<FloatValue<'c>> {
        let narrow = match dtype {
            DType::F16 => self.ctx.f16_type(),
            DType::BF16 => return self.round_bf16(x),
            _ => return Ok(x),
        };
        let t = e(self.b.build_float_trunc(x, narrow, "n"))?;
        e(self.b.build_float_ext(t, self.ctx.f32_type(), "w"))
    }

    /// Rounds an f32 to bf16's precision (to nearest, ties to even; NaN stays NaN) with
    /// integer operations: LLVM lowers `fptrunc` to bf16 on CPUs without bf16
    /// instructions to a call of `__truncsfbf2`, which Debian 12's libgcc lacks.
    fn round_bf16(&self, x: FloatValue<'c>) -> R<FloatValue<'c>> {
        let i32t = self.ctx.i32_type();
        let k = |v: u64| i32t.const_int(v, false);
        let b = &self.b;
        let bits = e(b.build_bit_cast(x, i32t, "bits"))?.into_int_value();
        let high = e(b.build_right_shift(bits, k(16), false, "high"))?;
        let lsb = e(b.build_and(high, k(1), "lsb"))?;
        let bias = e(b.build_int_add(lsb, k(0x7fff), "bias"))?;
        let up = e(b.build_int_add(bits, bias, "up"))?;
        let kept = e(b.build_and(up, k(0xffff_0000), "kept"))?;
        let r = e(b.build_bit_cast(kept, self.ctx.f32_type(), "r"))?.into_float_value();
        let nan = e(b.build_float_compare(FloatPredicate::UNO, x, x, "nan"))?;
        Ok(e(b.build_select(nan, x, r, "bf16"))?.into_float_value())
    }

    /// Wraps an integer result to its dtype's width.
    fn wrap(&self, x: IntValue<'c>, dtype: DType) -> R<IntValue<'c>> {
        let i64t = self.ctx.i64_type();
        match dtype {
            DType::I32 => {
                let t = e(self.b.build_int_truncate(x, self.ctx.i32_type(), "t"))?;
                e(self.b.build_int_s_extend(t, i64t, "w"))
            }
            DType::U8 => {
                let t = e(self.b.build_int_truncate(x, self.ctx.i8_type(), "t"))?;
                e(self.b.build_int_z_extend(t, i64t, "w"))
            }
            _ => Ok(x),
        }
    }

    /// `n`'s value at `idx` (an index into `n`'s shape).
    fn gen(&self, body: &Body<'c, '_>, n: NodeIndex, idx: &[IntValue<'c>]) -> R<Val<'c>> {
        let node = body.g.node(n);
        let dtype = node.ty.dtype;
        if let Some(v) = body.leaves.get(&n) {
            let v = v.clone();
            return self.load(body, &v, idx, dtype);
        }
        let ops = body.g.operands(n);
        let b = &self.b;
        Ok(match &node.op {
            Op::Const { bits } => {
                let x = f64::from_bits(*bits);
                match dtype {
                    d if d.is_float() => {
                        Val::F(self.f32c(f64::from(crate::tensor::round_float(d, x as f32))))
                    }
                    DType::Bool => {
                        Val::B(self.ctx.bool_type().const_int(u64::from(x != 0.0), false))
                    }
                    d => Val::I(self.i64c(crate::tensor::wrap_int(d, x as i64))),
                }
            }
            Op::Unary(u) => {
                let x = self.gen(body, ops[0], idx)?;
                self.unary(*u, x, dtype)?
            }
            Op::Binary(op) => {
                let x = self.gen(body, ops[0], &self.operand_idx(body, ops[0], n, idx))?;
                let y = self.gen(body, ops[1], &self.operand_idx(body, ops[1], n, idx))?;
                self.binary(body, *op, x, y, dtype)?
            }
            Op::Select => {
                let c = self.gen(body, ops[0], &self.operand_idx(body, ops[0], n, idx))?;
                let x = self.gen(body, ops[1], &self.operand_idx(body, ops[1], n, idx))?;
                let y = self.gen(body, ops[2], &self.operand_idx(body, ops[2], n, idx))?;
                let r = match (x, y) {
                    (Val::F(a), Val::F(b2)) => {
                        Val::F(e(b.build_select(c.i(), a, b2, "sel"))?.into_float_value())
                    }
                    (Val::I(a), Val::I(b2)) => {
                        Val::I(e(b.build_select(c.i(), a, b2, "sel"))?.into_int_value())
                    }
                    (Val::B(a), Val::B(b2)) => {
                        Val::B(e(b.build_select(c.i(), a, b2, "sel"))?.into_int_value())
                    }
                    _ => return Err("select of mismatched operands".into()),
                };
                r
            }
            Op::Cast => {
                let x = self.gen(body, ops[0], idx)?;
                self.cast(x, dtype)?
            }
            Op::OneHot { .. } => {
                let r = idx.len();
                let k = self.gen(body, ops[0], &idx[..r - 1])?;
                let hit = e(b.build_int_compare(IntPredicate::EQ, k.i(), idx[r - 1], "hit"))?;
                if dtype.is_float() {
                    Val::F(e(b.build_unsigned_int_to_float(
                        hit,
                        self.ctx.f32_type(),
                        "oh",
                    ))?)
                } else if dtype == DType::Bool {
                    Val::B(hit)
                } else {
                    Val::I(e(b.build_int_z_extend(hit, self.ctx.i64_type(), "oh"))?)
                }
            }
            Op::Iota { axis } => self.cast(Val::I(idx[*axis]), dtype)?,
            Op::Transpose { perm } => {
                let mut j = idx.to_vec();
                for (k, &p) in perm.iter().enumerate() {
                    j[p] = idx[k];
                }
                self.gen(body, ops[0], &j)?
            }
            Op::BroadcastTo | Op::CrossShardMean => {
                let j = self.operand_idx(body, ops[0], n, idx);
                self.gen(body, ops[0], &j)?
            }
            Op::Slice { axis, start, .. } => {
                let mut j = idx.to_vec();
                j[*axis] = e(b.build_int_add(idx[*axis], self.i64c(*start as i64), "s"))?;
                self.gen(body, ops[0], &j)?
            }
            op => return Err(format!("{} is not elemental", op.name())),
        })
    }

    /// The index into operand `o` of `n` for `n`'s index `idx`, with numpy's
    /// broadcasting (leading axes dropped, size-1 axes at 0).
    fn operand_idx(
        &self,
        body: &Body<'c, '_>,
        o: NodeIndex,
        n: NodeIndex,
        idx: &[IntValue<'c>],
    ) -> Vec<IntValue<'c>> {
        let os = &body.g.node(o).ty.shape;
        let ns = &body.g.node(n).ty.shape;
        if os == ns {
            // also when the loop's axes are merged (`Loop::collapsed`)
            return idx.to_vec();
        }
        let lead = ns.len() - os.len();
        os.iter()
            .enumerate()
            .map(|(k, &d)| {
                if d == 1 && ns[lead + k] != 1 {
                    self.i64c(0)
                } else {
                    idx[lead + k]
                }
            })
            .collect()
    }

    fn unary(&self, u: UnaryOp, x: Val<'c>, dtype: DType) -> R<Val<'c>> {
        let b = &self.b;
        if u == UnaryOp::StopGradient {
            return Ok(x);
        }
        Ok(match x {
            Val::F(x) => {
                let zero = self.f32c(0.0);
                let one = self.f32c(1.0);
                let r = match u {
                    UnaryOp::Neg => e(b.build_float_neg(x, "neg"))?,
                    UnaryOp::Abs => self.intrinsic1("llvm.fabs", x)?,
                    UnaryOp::Exp => self.exp(x)?,
                    UnaryOp::Log => self.log(x)?,
                    UnaryOp::Sqrt => self.intrinsic1("llvm.sqrt", x)?,
                    UnaryOp::Rsqrt => {
                        let s = self.intrinsic1("llvm.sqrt", x)?;
                        e(b.build_float_div(one, s, "rsqrt"))?
                    }
                    UnaryOp::Square => e(b.build_float_mul(x, x, "sq"))?,
                    UnaryOp::Tanh => self.tanh(x)?,
                    UnaryOp::Sigmoid => {
                        let nx = e(self.b.build_float_neg(x, "nx"))?;
                        let ex = self.exp(nx)?;
                        let d = e(self.b.build_float_add(one, ex, "d"))?;
                        e(self.b.build_float_div(one, d, "sig"))?
                    }
                    UnaryOp::Relu => {
                        // x when x > 0 or NaN (unordered), else 0
                        let c = e(b.build_float_compare(FloatPredicate::UGT, x, zero, "c"))?;
                        e(b.build_select(c, x, zero, "relu"))?.into_float_value()
                    }
                    UnaryOp::Floor => self.intrinsic1("llvm.floor", x)?,
                    // (libm's, as the interpreter's `f32::sin` and `cos` are)
                    UnaryOp::Sin => self.libm("sinf", &[x])?,
                    UnaryOp::Cos => self.libm("cosf", &[x])?,
                    UnaryOp::Erf => self.libm("erff", &[x])?,
                    UnaryOp::Sign => {
                        let pos = e(b.build_float_compare(FloatPredicate::OGT, x, zero, "p"))?;
                        let neg = e(b.build_float_compare(FloatPredicate::OLT, x, zero, "n"))?;
                        let nan = e(b.build_float_compare(FloatPredicate::UNO, x, x, "nan"))?;
                        let r0 = e(b.build_select(nan, x, zero, "s0"))?.into_float_value();
                        let r1 =
                            e(b.build_select(neg, self.f32c(-1.0), r0, "s1"))?.into_float_value();
                        e(b.build_select(pos, one, r1, "sign"))?.into_float_value()
                    }
                    // (returned as it is above)
                    UnaryOp::StopGradient => x,
                    UnaryOp::Not => return Err("not of a float".into()),
                };
                Val::F(self.round(r, dtype)?)
            }
            Val::I(x) => {
                let zero = self.i64c(0);
                let r = match u {
                    UnaryOp::Neg => e(b.build_int_sub(zero, x, "neg"))?,
                    UnaryOp::Abs => {
                        let n = e(b.build_int_compare(IntPredicate::SLT, x, zero, "n"))?;
                        let m = e(b.build_int_sub(zero, x, "m"))?;
                        e(b.build_select(n, m, x, "abs"))?.into_int_value()
                    }
                    UnaryOp::Square => e(b.build_int_mul(x, x, "sq"))?,
                    UnaryOp::Sign => {
                        let p = e(b.build_int_compare(IntPredicate::SGT, x, zero, "p"))?;
                        let n = e(b.build_int_compare(IntPredicate::SLT, x, zero, "n"))?;
                        let r = e(b.build_select(n, self.i64c(-1), zero, "s"))?.into_int_value();
                        e(b.build_select(p, self.i64c(1), r, "sign"))?.into_int_value()
                    }
                    UnaryOp::Relu => {
                        let p = e(b.build_int_compare(IntPredicate::SGT, x, zero, "p"))?;
                        e(b.build_select(p, x, zero, "relu"))?.into_int_value()
                    }
                    UnaryOp::Floor => x,
                    _ => return Err(format!("{} of an integer", Op::Unary(u).name())),
                };
                Val::I(self.wrap(r, dtype)?)
            }
            Val::B(x) => Val::B(e(b.build_not(x, "not"))?),
        })
    }

    fn binary(
        &self,
        body: &Body<'c, '_>,
        op: BinaryOp,
        x: Val<'c>,
        y: Val<'c>,
        dtype: DType,
    ) -> R<Val<'c>> {
        let b = &self.b;
        Ok(match (x, y) {
            (Val::F(x), Val::F(y)) => {
                if op.is_comparison() {
                    let p = match op {
                        BinaryOp::Eq => FloatPredicate::OEQ,
                        BinaryOp::Ne => FloatPredicate::UNE,
                        BinaryOp::Lt => FloatPredicate::OLT,
                        BinaryOp::Le => FloatPredicate::OLE,
                        BinaryOp::Gt => FloatPredicate::OGT,
                        _ => FloatPredicate::OGE,
                    };
                    return Ok(Val::B(e(b.build_float_compare(p, x, y, "cmp"))?));
                }
                let r = match op {
                    BinaryOp::Add => e(b.build_float_add(x, y, "add"))?,
                    BinaryOp::Sub => e(b.build_float_sub(x, y, "sub"))?,
                    BinaryOp::Mul => e(b.build_float_mul(x, y, "mul"))?,
                    BinaryOp::Div => e(b.build_float_div(x, y, "div"))?,
                    BinaryOp::Rem => e(b.build_float_rem(x, y, "rem"))?,
                    BinaryOp::Pow => self.libm("powf", &[x, y])?,
                    BinaryOp::Max | BinaryOp::Min => self.fextremum(x, y, op == BinaryOp::Max)?,
                    _ => return Err(format!("{} of floats", Op::Binary(op).name())),
                };
                Val::F(self.round(r, dtype)?)
            }
            (Val::I(x), Val::I(y)) => {
                if op.is_comparison() {
                    return Ok(Val::B(e(b.build_int_compare(
                        int_pred(op, true),
                        x,
                        y,
                        "cmp",
                    ))?));
                }
                let zero = self.i64c(0);
                let r = match op {
                    BinaryOp::Add => e(b.build_int_add(x, y, "add"))?,
                    BinaryOp::Sub => e(b.build_int_sub(x, y, "sub"))?,
                    BinaryOp::Mul => e(b.build_int_mul(x, y, "mul"))?,
                    BinaryOp::Div | BinaryOp::Rem => {
                        let is0 = e(b.build_int_compare(IntPredicate::EQ, y, zero, "z"))?;
                        let s = e(b.build_load(self.ctx.i64_type(), body.status, "st"))?
                            .into_int_value();
                        let z64 = e(b.build_int_z_extend(is0, self.ctx.i64_type(), "z64"))?;
                        let s2 = e(b.build_or(s, z64, "st2"))?;
                        e(b.build_store(body.status, s2))?;
                        let m1 = e(b.build_int_compare(IntPredicate::EQ, y, self.i64c(-1), "m1"))?;
                        let odd = e(b.build_or(is0, m1, "odd"))?;
                        let safe =
                            e(b.build_select(odd, self.i64c(1), y, "safe"))?.into_int_value();
                        if op == BinaryOp::Div {
                            let q = e(b.build_int_signed_div(x, safe, "q"))?;
                            let nx = e(b.build_int_sub(zero, x, "nx"))?;
                            e(b.build_select(m1, nx, q, "div"))?.into_int_value()
                        } else {
                            let q = e(b.build_int_signed_rem(x, safe, "r"))?;
                            e(b.build_select(m1, zero, q, "rem"))?.into_int_value()
                        }
                    }
                    BinaryOp::Pow => self.ipow(x, y)?,
                    BinaryOp::Max | BinaryOp::Min => self.iextremum(x, y, op == BinaryOp::Max)?,
                    _ => return Err(format!("{} of integers", Op::Binary(op).name())),
                };
                Val::I(self.wrap(r, dtype)?)
            }
            (Val::B(x), Val::B(y)) => Val::B(match op {
                BinaryOp::And => e(b.build_and(x, y, "and"))?,
                BinaryOp::Or => e(b.build_or(x, y, "or"))?,
                op if op.is_comparison() => {
                    e(b.build_int_compare(int_pred(op, false), x, y, "cmp"))?
                }
                _ => return Err(format!("{} of booleans", Op::Binary(op).name())),
            }),
            _ => return Err("a binary op of mismatched operands".into()),
        })
    }

    /// `x.wrapping_pow(clamp(y, 0, u32::MAX))`, by 32 squarings.
    fn ipow(&self, x: IntValue<'c>, y: IntValue<'c>) -> R<IntValue<'c>> {
        let b = &self.b;
        let neg = e(b.build_int_compare(IntPredicate::SLT, y, self.i64c(0), "neg"))?;
        let big = e(b.build_int_compare(IntPredicate::SGT, y, self.i64c(u32::MAX as i64), "big"))?;
        let y1 = e(b.build_select(neg, self.i64c(0), y, "y1"))?.into_int_value();
        let mut ex = e(b.build_select(big, self.i64c(u32::MAX as i64), y1, "y2"))?.into_int_value();
        let mut r = self.i64c(1);
        let mut base = x;
        for _ in 0..32 {
            let bit = e(b.build_and(ex, self.i64c(1), "bit"))?;
            let on = e(b.build_int_compare(IntPredicate::NE, bit, self.i64c(0), "on"))?;
            let m = e(b.build_int_mul(r, base, "m"))?;
            r = e(b.build_select(on, m, r, "r"))?.into_int_value();
            base = e(b.build_int_mul(base, base, "b"))?;
            ex = e(b.build_right_shift(ex, self.i64c(1), false, "e"))?;
        }
        Ok(r)
    }

    fn cast(&self, x: Val<'c>, to: DType) -> R<Val<'c>> {
        let b = &self.b;
        let f32t = self.ctx.f32_type();
        let i64t = self.ctx.i64_type();
        Ok(match x {
            Val::F(v) if to.is_float() => Val::F(self.round(v, to)?),
            Val::F(v) if to == DType::Bool => Val::B(e(b.build_float_compare(
                FloatPredicate::UNE,
                v,
                self.f32c(0.0),
                "nz",
            ))?),
            Val::F(v) => {
                // float::to_int: truncation toward zero; beyond the dtype (NaN and
                // infinities too) the smallest value, for u8 the low byte (0 for NaN and
                // infinities).
                let d = e(b.build_float_ext(v, self.ctx.f64_type(), "d"))?;
                let f64t = self.ctx.f64_type();
                let (lo, hi, bad) = match to {
                    DType::I32 => (-2_147_483_649.0, 2_147_483_648.0, i64::from(i32::MIN)),
                    _ => (
                        -9.223_372_036_854_776e18,
                        9.223_372_036_854_776e18,
                        i64::MIN,
                    ),
                };
                if to == DType::U8 {
                    let sat = self.intrinsic_sat(d)?;
                    let abs = self
                        .intrinsic1_any("llvm.fabs", d.into())?
                        .into_float_value();
                    let fin = e(b.build_float_compare(
                        FloatPredicate::OLT,
                        abs,
                        f64t.const_float(f64::INFINITY),
                        "fin",
                    ))?;
                    let low = e(b.build_and(sat, self.i64c(255), "low"))?;
                    Val::I(e(b.build_select(fin, low, self.i64c(0), "u8"))?.into_int_value())
                } else {
                    let lo_ok = e(b.build_float_compare(
                        FloatPredicate::OGT,
                        d,
                        f64t.const_float(lo),
                        "lo",
                    ))?;
                    let hi_ok = e(b.build_float_compare(
                        FloatPredicate::OLT,
                        d,
                        f64t.const_float(hi),
                        "hi",
                    ))?;
                    let ok = e(b.build_and(lo_ok, hi_ok, "ok"))?;
                    let safe =
                        e(b.build_select(ok, d, f64t.const_float(0.0), "safe"))?.into_float_value();
                    let t = e(b.build_float_to_signed_int(safe, i64t, "t"))?;
                    Val::I(e(b.build_select(ok, t, self.i64c(bad), "int"))?.into_int_value())
                }
            }
            Val::I(v) if to.is_float() => {
                let f = e(b.build_signed_int_to_float(v, f32t, "f"))?;
                Val::F(self.round(f, to)?)
            }
            Val::I(v) if to == DType::Bool => Val::B(e(b.build_int_compare(
                IntPredicate::NE,
                v,
                self.i64c(0),
                "nz",
            ))?),
            Val::I(v) => Val::I(self.wrap(v, to)?),
            Val::B(v) if to.is_float() => Val::F(e(b.build_unsigned_int_to_float(v, f32t, "f"))?),
            Val::B(v) if to == DType::Bool => Val::B(v),
            Val::B(v) => Val::I(e(b.build_int_z_extend(v, i64t, "z"))?),
        })
    }

    fn intrinsic_sat(&self, d: FloatValue<'c>) -> R<IntValue<'c>> {
        let i64t = self.ctx.i64_type();
        let f = inkwell::intrinsics::Intrinsic::find("llvm.fptosi.sat").ok_or("no fptosi.sat")?;
        let decl = f
            .get_declaration(&self.module, &[i64t.into(), d.get_type().into()])
            .ok_or("fptosi.sat declaration")?;
        Ok(e(self.b.build_call(decl, &[d.into()], "sat"))?
            .try_as_basic_value()
            .basic()
            .expect("a value")
            .into_int_value())
    }

    fn intrinsic1(&self, name: &str, x: FloatValue<'c>) -> R<FloatValue<'c>> {
        Ok(self.intrinsic1_any(name, x.into())?.into_float_value())
    }

    fn intrinsic1_any(&self, name: &str, x: BasicValueEnum<'c>) -> R<BasicValueEnum<'c>> {
        let f = inkwell::intrinsics::Intrinsic::find(name).ok_or_else(|| format!("no {name}"))?;
        let decl = f
            .get_declaration(&self.module, &[x.get_type()])
            .ok_or_else(|| format!("{name} declaration"))?;
        Ok(e(self.b.build_call(decl, &[x.into()], "i"))?
            .try_as_basic_value()
            .basic()
            .expect("a value"))
    }

    /// A call of libm's f32 function `name` (`powf`, `sinf`, ...) on `args`.
    fn libm(&self, name: &str, args: &[FloatValue<'c>]) -> R<FloatValue<'c>> {
        let f = self.module.get_function(name).unwrap_or_else(|| {
            let f32t = self.ctx.f32_type();
            let params: Vec<_> = args.iter().map(|_| f32t.into()).collect();
            self.module
                .add_function(name, f32t.fn_type(&params, false), Some(Linkage::External))
        });
        let args: Vec<_> = args.iter().map(|&a| a.into()).collect();
        Ok(e(self.b.build_call(f, &args, name))?
            .try_as_basic_value()
            .basic()
            .ok_or("a libm call without a value")?
            .into_float_value())
    }

    fn fma(&self, a: FloatValue<'c>, x: FloatValue<'c>, c: f64) -> R<FloatValue<'c>> {
        let m = e(self.b.build_float_mul(a, x, "m"))?;
        e(self.b.build_float_add(m, self.f32c(c), "a"))
    }

    /// `float::maximum(x, y)` (`minimum` when `!max`): `x` when it is NaN or not
    /// beaten, so that NaN propagates and the first of equals is kept.
    fn fextremum(&self, x: FloatValue<'c>, y: FloatValue<'c>, max: bool) -> R<FloatValue<'c>> {
        let b = &self.b;
        let p = if max {
            FloatPredicate::OGE
        } else {
            FloatPredicate::OLE
        };
        let nan = e(b.build_float_compare(FloatPredicate::UNO, x, x, "nan"))?;
        let c = e(b.build_float_compare(p, x, y, "c"))?;
        let take = e(b.build_or(nan, c, "take"))?;
        Ok(e(b.build_select(take, x, y, "m"))?.into_float_value())
    }

    /// The larger (`max`) or smaller of two integers.
    fn iextremum(&self, x: IntValue<'c>, y: IntValue<'c>, max: bool) -> R<IntValue<'c>> {
        let p = if max {
            IntPredicate::SGE
        } else {
            IntPredicate::SLE
        };
        let c = e(self.b.build_int_compare(p, x, y, "c"))?;
        Ok(e(self.b.build_select(c, x, y, "m"))?.into_int_value())
    }

    /// `exp(x)` (Cephes `expf`): `2^n · p(r)` with `r = x - n·ln 2`.
    fn exp(&self, x: FloatValue<'c>) -> R<FloatValue<'c>> {
        let b = &self.b;
        let hi = self.f32c(88.722_84);
        let lo = self.f32c(-103.972_08);
        let over = e(b.build_float_compare(FloatPredicate::OGT, x, hi, "over"))?;
        let under = e(b.build_float_compare(FloatPredicate::OLT, x, lo, "under"))?;
        let nan = e(b.build_float_compare(FloatPredicate::UNO, x, x, "nan"))?;
        // clamp to the range where the reduction is exact
        let c1 = e(b.build_select(over, hi, x, "c1"))?.into_float_value();
        let xc = e(b.build_select(under, lo, c1, "xc"))?.into_float_value();
        let xc = e(b.build_select(nan, self.f32c(0.0), xc, "xn"))?.into_float_value();
        let t = self.fma(xc, self.f32c(std::f64::consts::LOG2_E), 0.5)?;
        let n = self.intrinsic1("llvm.floor", t)?;
        let r1 = e(b.build_float_sub(
            xc,
            e(b.build_float_mul(n, self.f32c(0.693_359_375), "a"))?,
            "r1",
        ))?;
        let r = e(b.build_float_sub(
            r1,
            e(b.build_float_mul(n, self.f32c(-2.121_944_4e-4), "b"))?,
            "r",
        ))?;
        let z = e(b.build_float_mul(r, r, "z"))?;
        let mut p = self.fma(self.f32c(1.987_569_1e-4), r, 1.398_199_9e-3)?;
        p = self.fma(p, r, 8.333_452e-3)?;
        p = self.fma(p, r, 4.166_579_6e-2)?;
        p = self.fma(p, r, 1.666_666_5e-1)?;
        p = self.fma(p, r, 5.000_000_1e-1)?;
        let pz = e(b.build_float_mul(p, z, "pz"))?;
        let y = e(b.build_float_add(e(b.build_float_add(pz, r, "y0"))?, self.f32c(1.0), "y"))?;
        // 2^n as two factors, so that n down to -150 stays exact (subnormal results)
        let i32t = self.ctx.i32_type();
        let ni = e(b.build_float_to_signed_int(n, i32t, "ni"))?;
        let half = e(b.build_right_shift(ni, i32t.const_int(1, false), true, "h"))?;
        let rest = e(b.build_int_sub(ni, half, "rest"))?;
        let pow2 = |k: IntValue<'c>| -> R<FloatValue<'c>> {
            let biased = e(b.build_int_add(k, i32t.const_int(127, false), "bias"))?;
            let bits = e(b.build_left_shift(biased, i32t.const_int(23, false), "bits"))?;
            Ok(e(b.build_bit_cast(bits, self.ctx.f32_type(), "p2"))?.into_float_value())
        };
        let y1 = e(b.build_float_mul(y, pow2(half)?, "y1"))?;
        let y2 = e(b.build_float_mul(y1, pow2(rest)?, "y2"))?;
        let r0 = e(b.build_select(under, self.f32c(0.0), y2, "r0"))?.into_float_value();
        let r1 = e(b.build_select(over, self.f32c(f64::INFINITY), r0, "r1"))?.into_float_value();
        Ok(e(b.build_select(nan, x, r1, "exp"))?.into_float_value())
    }

    /// `ln(x)` (Cephes `logf`): `x = m · 2^e` with `m` in `[√½, √2)`, a polynomial in
    /// `m - 1`.
    fn log(&self, x: FloatValue<'c>) -> R<FloatValue<'c>> {
        let b = &self.b;
        let i32t = self.ctx.i32_type();
        let f32t = self.ctx.f32_type();
        // subnormals: scale up by 2^23 first
        let tiny =
            e(b.build_float_compare(FloatPredicate::OLT, x, self.f32c(1.175_494_4e-38), "tiny"))?;
        let xs = e(b.build_float_mul(x, self.f32c(8_388_608.0), "xs"))?;
        let xn = e(b.build_select(tiny, xs, x, "xn"))?.into_float_value();
        let bias = e(b.build_select(tiny, i32t.const_int(23, false), i32t.const_zero(), "bias"))?
            .into_int_value();
        let bits = e(b.build_bit_cast(xn, i32t, "bits"))?.into_int_value();
        let ex = e(b.build_right_shift(bits, i32t.const_int(23, false), false, "ex"))?;
        let ex = e(b.build_and(ex, i32t.const_int(0xff, false), "ex8"))?;
        // frexp: mantissa in [0.5, 1), exponent ex - 126
        let mbits = e(b.build_and(bits, i32t.const_int(0x007f_ffff, false), "mb"))?;
        let mbits = e(b.build_or(mbits, i32t.const_int(0x3f00_0000, false), "mb1"))?;
        let m = e(b.build_bit_cast(mbits, f32t, "m"))?.into_float_value();
        let mut ei = e(b.build_int_sub(ex, i32t.const_int(126, false), "e"))?;
        ei = e(b.build_int_sub(ei, bias, "eb"))?;
        let small = e(b.build_float_compare(
            FloatPredicate::OLT,
            m,
            self.f32c(std::f64::consts::FRAC_1_SQRT_2),
            "small",
        ))?;
        let e1 = e(b.build_int_sub(ei, i32t.const_int(1, false), "e1"))?;
        ei = e(b.build_select(small, e1, ei, "es"))?.into_int_value();
        let m2 = e(b.build_float_add(m, m, "m2"))?;
        let mm = e(b.build_select(small, m2, m, "mm"))?.into_float_value();
        let r = e(b.build_float_sub(mm, self.f32c(1.0), "r"))?;
        let ef = e(b.build_signed_int_to_float(ei, f32t, "ef"))?;
        let z = e(b.build_float_mul(r, r, "z"))?;
        let mut p = self.fma(self.f32c(7.037_683_6e-2), r, -1.151_461_0e-1)?;
        for c in [
            1.167_699_9e-1,
            -1.242_014_1e-1,
            1.424_932_3e-1,
            -1.666_805_8e-1,
            2.000_071_4e-1,
            -2.499_999_4e-1,
            3.333_333_1e-1,
        ] {
            p = self.fma(p, r, c)?;
        }
        let mut y = e(b.build_float_mul(e(b.build_float_mul(p, r, "pr"))?, z, "y"))?;
        y = e(b.build_float_add(
            y,
            e(b.build_float_mul(ef, self.f32c(-2.121_944_4e-4), "t"))?,
            "y1",
        ))?;
        y = e(b.build_float_sub(y, e(b.build_float_mul(z, self.f32c(0.5), "hz"))?, "y2"))?;
        let mut l = e(b.build_float_add(r, y, "l"))?;
        l = e(b.build_float_add(
            l,
            e(b.build_float_mul(ef, self.f32c(0.693_359_375), "t2"))?,
            "l2",
        ))?;
        // special cases: 0 -> -inf, negative -> NaN, inf -> inf, NaN -> NaN
        let zero = e(b.build_float_compare(FloatPredicate::OEQ, x, self.f32c(0.0), "zero"))?;
        let neg = e(b.build_float_compare(FloatPredicate::OLT, x, self.f32c(0.0), "neg"))?;
        let inf =
            e(b.build_float_compare(FloatPredicate::OEQ, x, self.f32c(f64::INFINITY), "inf"))?;
        let nan = e(b.build_float_compare(FloatPredicate::UNO, x, x, "nan"))?;
        let mut out =
            e(b.build_select(zero, self.f32c(f64::NEG_INFINITY), l, "o1"))?.into_float_value();
        out = e(b.build_select(neg, self.f32c(f64::NAN), out, "o2"))?.into_float_value();
        out = e(b.build_select(inf, x, out, "o3"))?.into_float_value();
        Ok(e(b.build_select(nan, x, out, "log"))?.into_float_value())
    }

    /// `tanh(x)`: Cephes' polynomial below |x| = 0.625, `1 - 2/(e^{2|x|} + 1)` above.
    fn tanh(&self, x: FloatValue<'c>) -> R<FloatValue<'c>> {
        let b = &self.b;
        let ax = self.intrinsic1("llvm.fabs", x)?;
        let z = e(b.build_float_mul(x, x, "z"))?;
        let mut p = self.fma(self.f32c(-5.704_988_7e-3), z, 2.063_908_9e-2)?;
        for c in [-5.373_971_6e-2, 1.333_144_2e-1, -3.333_328_2e-1] {
            p = self.fma(p, z, c)?;
        }
        let small = e(b.build_float_add(
            e(b.build_float_mul(e(b.build_float_mul(p, z, "pz"))?, x, "pzx"))?,
            x,
            "small",
        ))?;
        let ax = e(b.build_select(
            e(b.build_float_compare(FloatPredicate::OGT, ax, self.f32c(20.0), "big"))?,
            self.f32c(20.0),
            ax,
            "axc",
        ))?
        .into_float_value();
        let two = e(b.build_float_add(ax, ax, "2x"))?;
        let ex = self.exp(two)?;
        let d = e(b.build_float_add(ex, self.f32c(1.0), "d"))?;
        let q = e(b.build_float_div(self.f32c(2.0), d, "q"))?;
        let big = e(b.build_float_sub(self.f32c(1.0), q, "t"))?;
        let neg = e(b.build_float_compare(FloatPredicate::OLT, x, self.f32c(0.0), "neg"))?;
        let nbig = e(b.build_float_neg(big, "nt"))?;
        let signed = e(b.build_select(neg, nbig, big, "sgn"))?.into_float_value();
        let lt = e(b.build_float_compare(
            FloatPredicate::OLT,
            self.intrinsic1("llvm.fabs", x)?,
            self.f32c(0.625),
            "lt",
        ))?;
        let r = e(b.build_select(lt, small, signed, "tanh"))?.into_float_value();
        let nan = e(b.build_float_compare(FloatPredicate::UNO, x, x, "nan"))?;
        Ok(e(b.build_select(nan, x, r, "tanhn"))?.into_float_value())
    }

    /// A reduction root: `out = reduce(op, x over axes)`.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &mut self,
        body: &Body<'c, '_>,
        root: NodeIndex,
        x: NodeIndex,
        op: ReduceOp,
        axes: &[usize],
        out: &View,
        start: IntValue<'c>,
        end: IntValue<'c>,
    ) -> R<()> {
        let g = body.g;
        let xs = g.node(x).ty.shape.clone();
        let dtype = g.node(root).ty.dtype;
        let xdt = g.node(x).ty.dtype;
        let r = xs.len();
        let kept: Vec<usize> = (0..r).filter(|k| !axes.contains(k)).collect();
        let count: usize = axes.iter().map(|&a| xs[a]).product();
        // The output index of an operand index: the kept axes (size-1 axes kept in
        // place when keep_dims).
        let out_rank = out.shape.len();
        let out_idx = |idx: &[IntValue<'c>], zero: IntValue<'c>| -> Vec<IntValue<'c>> {
            if out_rank == kept.len() {
                kept.iter().map(|&k| idx[k]).collect()
            } else {
                (0..r)
                    .map(|k| if axes.contains(&k) { zero } else { idx[k] })
                    .collect()
            }
        };
        let suffix = super::lower::reduces_trailing(r, axes);
        let ident = self.identity(op, xdt);
        let zero = self.i64c(0);
        if suffix {
            let outer: Vec<usize> = kept.iter().map(|&k| xs[k]).collect();
            let inner: Vec<usize> = (kept.len()..r).map(|k| xs[k]).collect();
            let dims = if outer.is_empty() {
                vec![1]
            } else {
                outer.clone()
            };
            let ty = self.val_type(ident);
            self.nest(body, &dims, start, end, &mut |cg, oi| {
                let oi: Vec<IntValue<'c>> = if outer.is_empty() {
                    Vec::new()
                } else {
                    oi.to_vec()
                };
                let acc = e(cg.b.build_alloca(ty, "acc"))?;
                cg.store_val(acc, ident)?;
                let mut idx = oi.clone();
                cg.inner_nest(body, &inner, &mut idx, &mut |cg, full| {
                    let v = cg.gen(body, x, full)?;
                    let a = cg.load_val(acc, ident)?;
                    let s = cg.combine(op, a, v, true)?;
                    cg.store_val(acc, s)
                })?;
                let a = cg.load_val(acc, ident)?;
                let fin = cg.finalize(op, a, count, dtype)?;
                let oidx = out_idx(&[oi.as_slice(), &vec![zero; inner.len()]].concat(), zero);
                cg.store(body, out, &oidx, fin)
            })?;
        } else {
            // initialise, accumulate in the operand's row-major order, finalise
            let odims = if out.shape.is_empty() {
                vec![1]
            } else {
                out.shape.clone()
            };
            let scalar = out.shape.is_empty();
            // a loop over every output element (once for a scalar output)
            let over_out =
                |cg: &mut Self, f: &mut dyn FnMut(&mut Self, &[IntValue<'c>]) -> R<()>| {
                    let (lo, hi) = (cg.i64c(0), cg.i64c(odims[0] as i64));
                    cg.nest(body, &odims, lo, hi, &mut |cg, oi| {
                        f(cg, if scalar { &oi[..0] } else { oi })
                    })
                };
            over_out(self, &mut |cg, oi| cg.store(body, out, oi, ident))?;
            self.nest(body, &xs, start, end, &mut |cg, idx| {
                let v = cg.gen(body, x, idx)?;
                let oidx = out_idx(idx, zero);
                let a = cg.load(body, out, &oidx, dtype)?;
                let s = cg.combine(op, a, v, false)?;
                cg.store(body, out, &oidx, s)
            })?;
            over_out(self, &mut |cg, oi| {
                let a = cg.load(body, out, oi, dtype)?;
                let fin = cg.finalize(op, a, count, dtype)?;
                cg.store(body, out, oi, fin)
            })?;
        }
        Ok(())
    }

    fn inner_nest(
        &mut self,
        body: &Body<'c, '_>,
        dims: &[usize],
        idx: &mut Vec<IntValue<'c>>,
        f: &mut dyn FnMut(&mut Self, &[IntValue<'c>]) -> R<()>,
    ) -> R<()> {
        if dims.is_empty() {
            return f(self, idx);
        }
        let hi = self.i64c(dims[0] as i64);
        let lo = self.i64c(0);
        self.counted(body.f, lo, hi, &mut |cg, i| {
            idx.push(i);
            let r = cg.inner_nest(body, &dims[1..], idx, f);
            idx.pop();
            r
        })
    }

    fn val_type(&self, v: Val<'c>) -> BasicTypeEnum<'c> {
        match v {
            Val::F(_) => self.ctx.f32_type().into(),
            Val::I(_) => self.ctx.i64_type().into(),
            Val::B(_) => self.ctx.bool_type().into(),
        }
    }

    fn store_val(&self, p: PointerValue<'c>, v: Val<'c>) -> R<()> {
        let bv: BasicValueEnum = match v {
            Val::F(f) => f.into(),
            Val::I(i) | Val::B(i) => i.into(),
        };
        e(self.b.build_store(p, bv))?;
        Ok(())
    }

    fn load_val(&self, p: PointerValue<'c>, like: Val<'c>) -> R<Val<'c>> {
        let x = e(self.b.build_load(self.val_type(like), p, "a"))?;
        Ok(match like {
            Val::F(_) => Val::F(x.into_float_value()),
            Val::I(_) => Val::I(x.into_int_value()),
            Val::B(_) => Val::B(x.into_int_value()),
        })
    }

    fn identity(&self, op: ReduceOp, dtype: DType) -> Val<'c> {
        if dtype.is_float() {
            Val::F(self.f32c(match op {
                ReduceOp::Sum | ReduceOp::Mean => 0.0,
                ReduceOp::Prod => 1.0,
                ReduceOp::Max => f64::NEG_INFINITY,
                ReduceOp::Min => f64::INFINITY,
            }))
        } else if dtype == DType::Bool {
            let all = matches!(op, ReduceOp::Min | ReduceOp::Prod);
            Val::B(self.ctx.bool_type().const_int(u64::from(all), false))
        } else {
            Val::I(self.i64c(match op {
                ReduceOp::Sum | ReduceOp::Mean => 0,
                ReduceOp::Prod => 1,
                ReduceOp::Max => i64::MIN,
                ReduceOp::Min => i64::MAX,
            }))
        }
    }

    fn combine(&self, op: ReduceOp, a: Val<'c>, v: Val<'c>, reassoc: bool) -> R<Val<'c>> {
        let b = &self.b;
        Ok(match (a, v) {
            (Val::F(a), Val::F(v)) => Val::F(match op {
                ReduceOp::Sum | ReduceOp::Mean => {
                    let s = e(b.build_float_add(a, v, "s"))?;
                    // a constant sum folds to a constant, which has no flags
                    if let Some(i) = s.as_instruction_value().filter(|_| reassoc) {
                        e(i.set_fast_math_flags(inkwell::values::FastMathFlags::AllowReassoc))?;
                    }
                    s
                }
                ReduceOp::Prod => e(b.build_float_mul(a, v, "p"))?,
                ReduceOp::Max | ReduceOp::Min => self.fextremum(a, v, op == ReduceOp::Max)?,
            }),
            (Val::I(a), Val::I(v)) => Val::I(match op {
                ReduceOp::Sum | ReduceOp::Mean => e(b.build_int_add(a, v, "s"))?,
                ReduceOp::Prod => e(b.build_int_mul(a, v, "p"))?,
                ReduceOp::Max | ReduceOp::Min => self.iextremum(a, v, op == ReduceOp::Max)?,
            }),
            (Val::B(a), Val::B(v)) => Val::B(match op {
                ReduceOp::Min | ReduceOp::Prod => e(b.build_and(a, v, "all"))?,
                _ => e(b.build_or(a, v, "any"))?,
            }),
            _ => return Err("a reduction of mismatched values".into()),
        })
    }

    fn finalize(&self, op: ReduceOp, a: Val<'c>, count: usize, dtype: DType) -> R<Val<'c>> {
        Ok(match a {
            Val::F(f) => {
                let f = if op == ReduceOp::Mean {
                    e(self
                        .b
                        .build_float_div(f, self.f32c(count.max(1) as f32 as f64), "mean"))?
                } else {
                    f
                };
                Val::F(self.round(f, dtype)?)
            }
            Val::I(i) => Val::I(self.wrap(i, dtype)?),
            b => b,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn softmax_kernel(
        &mut self,
        name: &str,
        log: bool,
        axis: usize,
        x: &View,
        out: &View,
        dtype: DType,
        g: &Graph,
        bufs: &Bufs,
    ) -> R<KernelFn> {
        let (body, ids) = self.body(name, g, bufs, &[x, out], FxHashMap::default())?;
        let (start, end) = self.start_end(&body, ids.len());
        let shape = x.shape.clone();
        let outer: Vec<usize> = (0..shape.len())
            .filter(|&k| k != axis)
            .map(|k| shape[k])
            .collect();
        let n = shape[axis];
        let dims = if outer.is_empty() {
            vec![1]
        } else {
            outer.clone()
        };
        let f32t = self.ctx.f32_type();
        self.nest(&body, &dims, start, end, &mut |cg, oi| {
            let oi: Vec<IntValue<'c>> = if outer.is_empty() {
                Vec::new()
            } else {
                oi.to_vec()
            };
            let at = |j: IntValue<'c>| -> Vec<IntValue<'c>> {
                let mut v = oi.clone();
                v.insert(axis, j);
                v
            };
            let lo = cg.i64c(0);
            let hi = cg.i64c(n as i64);
            let m = e(cg.b.build_alloca(f32t, "m"))?;
            cg.store_val(m, Val::F(cg.f32c(f64::NEG_INFINITY)))?;
            cg.counted(body.f, lo, hi, &mut |cg, j| {
                let v = cg.load(&body, x, &at(j), DType::F32)?;
                let a = cg.load_val(m, v)?;
                let r = cg.combine(ReduceOp::Max, a, v, false)?;
                cg.store_val(m, r)
            })?;
            let mx = cg.load_val(m, Val::F(cg.f32c(0.0)))?.f();
            let s = e(cg.b.build_alloca(f32t, "s"))?;
            cg.store_val(s, Val::F(cg.f32c(0.0)))?;
            cg.counted(body.f, lo, hi, &mut |cg, j| {
                let v = cg.load(&body, x, &at(j), DType::F32)?.f();
                let d = e(cg.b.build_float_sub(v, mx, "d"))?;
                let ex = cg.exp(d)?;
                if !log {
                    cg.store(&body, out, &at(j), Val::F(ex))?;
                }
                let a = cg.load_val(s, Val::F(ex))?;
                let r = cg.combine(ReduceOp::Sum, a, Val::F(ex), true)?;
                cg.store_val(s, r)
            })?;
            let sum = cg.load_val(s, Val::F(cg.f32c(0.0)))?.f();
            let l = if log {
                let ls = cg.log(sum)?;
                Some(e(cg.b.build_float_add(ls, mx, "l"))?)
            } else {
                None
            };
            cg.counted(body.f, lo, hi, &mut |cg, j| {
                let r = match l {
                    Some(l) => {
                        let v = cg.load(&body, x, &at(j), DType::F32)?.f();
                        e(cg.b.build_float_sub(v, l, "ls"))?
                    }
                    None => {
                        let v = cg.load(&body, out, &at(j), DType::F32)?.f();
                        e(cg.b.build_float_div(v, sum, "sm"))?
                    }
                };
                let r = cg.round(r, dtype)?;
                cg.store(&body, out, &at(j), Val::F(r))
            })
        })?;
        self.finish(&body, name, ids)
    }
}

fn int_pred(op: BinaryOp, signed: bool) -> IntPredicate {
    match (op, signed) {
        (BinaryOp::Eq, _) => IntPredicate::EQ,
        (BinaryOp::Ne, _) => IntPredicate::NE,
        (BinaryOp::Lt, true) => IntPredicate::SLT,
        (BinaryOp::Le, true) => IntPredicate::SLE,
        (BinaryOp::Gt, true) => IntPredicate::SGT,
        (BinaryOp::Ge, true) => IntPredicate::SGE,
        (BinaryOp::Lt, false) => IntPredicate::ULT,
        (BinaryOp::Le, false) => IntPredicate::ULE,
        (BinaryOp::Gt, false) => IntPredicate::UGT,
        _ => IntPredicate::UGE,
    }
}
