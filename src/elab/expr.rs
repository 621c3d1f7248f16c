//! Evaluation of expressions and statements, and calls of functions and closures.

use super::value::{Closure, StaticTy, TypeVal, Value};
use super::{Elab, MAX_DEPTH};
use crate::diag::{did_you_mean, Code, Diag};
use crate::ir::DType;
use crate::program::Def;
use crate::span::Span;
use crate::syntax::ast::*;
use std::rc::Rc;

/// An evaluated call argument.
#[derive(Debug, Clone)]
pub struct ArgVal<'p> {
    pub name: Option<&'p Ident>,
    pub value: Value<'p>,
    pub span: Span,
}

impl<'p> Elab<'p> {
    pub fn expr(&mut self, e: &'p Expr) -> Value<'p> {
        let v = self.expr_value(e);
        if self.hovers.is_some() {
            self.record_hover(e.span, &v);
        }
        v
    }

    /// Notes what an expression in a user file evaluated to, for the language server's
    /// hover: a tensor's type, a dataset's elements, a static value.
    fn record_hover(&mut self, span: Span, v: &Value<'p>) {
        if self.p.is_std_file(span.file) {
            return;
        }
        let text = match v {
            Value::Error | Value::Absent(_) => return,
            Value::Int(_) => format!("int = {}", super::value::show(v)),
            Value::Float(_) => format!("float = {}", super::value::show(v)),
            Value::Bool(_) => format!("bool = {}", super::value::show(v)),
            Value::Str(_) => format!("string = {}", super::value::show(v)),
            other => self.describe(other),
        };
        if let Some(h) = &mut self.hovers {
            h.push(super::Hover {
                span,
                text,
                hint: None,
                binding: false,
                tensor: false,
                is_static: false,
            });
        }
    }

    /// Notes the value a name of a user file is bound to (`let`, a parameter, a loop
    /// variable, a params field), for hover and inlay hints on the name itself.
    pub(super) fn record_binding(&mut self, name: &Ident, v: &Value<'p>) {
        if self.hovers.is_none() || self.p.is_std_file(name.span.file) {
            return;
        }
        self.record_hover(name.span, v);
        // the inlay hint: a tensor's type (or a tuple's or record's of tensors), or a
        // short static value (`= 256`)
        const SHORT: usize = 24;
        let (tensor, is_static) = (Self::tensors(v), Self::statics(v));
        let hint = if tensor {
            Some(self.describe(v))
        } else {
            let shown = super::value::show(v);
            (is_static && shown.len() <= SHORT).then(|| format!("= {shown}"))
        };
        if let Some(h) = self.hovers.as_mut().and_then(|h| h.last_mut()) {
            if h.span == name.span {
                h.binding = true;
                h.hint = hint;
                h.tensor = tensor;
                h.is_static = is_static;
            }
        }
    }

    /// A value as hover shows it, with tensors' types inside tuples, records and lists.
    fn describe(&self, v: &Value<'p>) -> String {
        let parts = |xs: &[Value<'p>]| xs.iter().map(|x| self.describe(x)).collect::<Vec<_>>();
        match v {
            Value::Tensor(n) => self.graph.ty(*n).to_string(),
            Value::Dataset(d) => format!("dataset of {}", d.elem()),
            Value::Tuple(xs) => format!("({})", parts(xs).join(", ")),
            Value::List(xs) => format!("[{}]", parts(xs).join(", ")),
            Value::Record(fs) => format!(
                "{{{}}}",
                fs.iter()
                    .map(|(k, x)| format!("{k}: {}", self.describe(x)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            other => super::value::show(other),
        }
    }

    /// A tensor, or a tuple or record of tensors.
    fn tensors(v: &Value<'_>) -> bool {
        match v {
            Value::Tensor(_) => true,
            Value::Tuple(xs) => !xs.is_empty() && xs.iter().all(Self::tensors),
            Value::Record(fs) => !fs.is_empty() && fs.iter().all(|(_, x)| Self::tensors(x)),
            _ => false,
        }
    }

    /// A static number, string or boolean, or a list of them.
    fn statics(v: &Value<'_>) -> bool {
        match v {
            Value::Int(_) | Value::Float(_) | Value::Bool(_) | Value::Str(_) => true,
            Value::List(xs) => xs.iter().all(Self::statics),
            _ => false,
        }
    }

    fn expr_value(&mut self, e: &'p Expr) -> Value<'p> {
        if !self.step(e.span) {
            return Value::Error;
        }
        match &e.kind {
            ExprKind::Int(i) => Value::Int(*i),
            ExprKind::Float(f) => Value::Float(*f),
            ExprKind::Bool(b) => Value::Bool(*b),
            ExprKind::Str(s) => self.interpolate(s, e.span),
            ExprKind::Name(n) => self.name(n, e.span),
            ExprKind::List(xs) => Value::List(Rc::new(xs.iter().map(|x| self.expr(x)).collect())),
            ExprKind::Tuple(xs) => Value::Tuple(Rc::new(xs.iter().map(|x| self.expr(x)).collect())),
            ExprKind::Record(fs) => self.record(fs),
            ExprKind::Field(base, f) => {
                let b = self.expr(base);
                self.field(b, f, e.span)
            }
            ExprKind::Index(base, ix) => {
                let b = self.expr(base);
                let ix: Vec<(Value<'p>, Span)> =
                    ix.iter().map(|x| (self.expr(x), x.span)).collect();
                self.index(b, base.span, ix, e.span)
            }
            ExprKind::Call { callee, args, .. } => {
                let f = self.expr(callee);
                let args = args
                    .iter()
                    .map(|a| ArgVal {
                        name: a.name.as_ref(),
                        value: self.expr(&a.value),
                        span: a.value.span,
                    })
                    .collect();
                self.call(f, callee.span, args, e.span)
            }
            ExprKind::Unary(op, x) => {
                let v = self.expr(x);
                self.unary(*op, v, e.span)
            }
            ExprKind::Binary(op, a, b) => self.binary_expr(*op, a, b, e.span),
            ExprKind::Range(a, b) => {
                let (va, vb) = (self.expr(a), self.expr(b));
                self.range(va, a.span, vb, b.span)
            }
            ExprKind::Closure { params, body } => Value::Closure(Rc::new(Closure {
                params,
                body,
                env: self.capture(),
                module: self.module,
            })),
            ExprKind::If(i) => self.if_value(i),
            ExprKind::Error => Value::Error,
        }
    }

    fn record(&mut self, fs: &'p [(Ident, Expr)]) -> Value<'p> {
        let mut out: Vec<(String, Value<'p>)> = Vec::with_capacity(fs.len());
        for (k, x) in fs {
            let v = self.expr(x);
            if out.iter().any(|(n, _)| *n == k.name) {
                self.diags.push(
                    Diag::new(
                        Code::DuplicateDefinition,
                        k.span,
                        format!("field `{}` is given twice", k.name),
                    )
                    .label("second time")
                    .help("remove one of them"),
                );
                continue;
            }
            out.push((k.name.clone(), v));
        }
        Value::Record(Rc::new(out))
    }

    /// `&&` and `||` on static bools short-circuit; everything else evaluates both sides.
    fn binary_expr(&mut self, op: BinOp, a: &'p Expr, b: &'p Expr, span: Span) -> Value<'p> {
        let va = self.expr(a);
        match (op, &va) {
            (BinOp::And, Value::Bool(false)) => return Value::Bool(false),
            (BinOp::Or, Value::Bool(true)) => return Value::Bool(true),
            _ => {}
        }
        let vb = self.expr(b);
        self.binary(op, (va, a.span), (vb, b.span), span)
    }

    /// The value a name has here: locals, then module items and imports, then the
    /// prelude, then built-in values.
    pub fn name(&mut self, n: &str, span: Span) -> Value<'p> {
        if let Some(v) = self.local(n) {
            return v.clone();
        }
        match self.p.lookup(self.module, n) {
            Some(Def::Item(m, i)) => match &self.p.item(m, i).kind {
                ItemKind::Fn(_) => Value::Func(m, i),
                ItemKind::Input(_) => Value::InputFn(m, i),
                ItemKind::Model(_) => Value::ModelFn(m, i),
                // An item that did not parse: already reported.
                ItemKind::Error(_) => Value::Error,
                _ => self.error(
                    Diag::new(
                        Code::TypeMismatch,
                        self.site(span),
                        format!("`{n}` is an estimator, not a value"),
                    )
                    .label("used as a value")
                    .help("estimators are run by `estc`, not used in expressions"),
                ),
            },
            Some(Def::Module(m)) => Value::Module(m),
            None => self.builtin_value(n, span),
        }
    }

    fn builtin_value(&mut self, n: &str, span: Span) -> Value<'p> {
        use super::value::Target;
        if let Some(d) = DType::from_name(n) {
            return Value::DType(d);
        }
        match n {
            "params" => self.params.clone(),
            "mode" => Value::Mode(self.mode),
            "target" => Value::Target(self.target),
            "global_step" => self.global_step(span),
            "train" => Value::Mode(SectionKind::Train),
            "eval" => Value::Mode(SectionKind::Eval),
            "predict" => Value::Mode(SectionKind::Predict),
            "host" => Value::Target(Target::Host),
            "wafer" => Value::Target(Target::Wafer),
            "interp" => Value::Target(Target::Interp),
            "none" => Value::None,
            "int" => Value::StaticType(StaticTy::Int),
            "float" => Value::StaticType(StaticTy::Float),
            "string" => Value::StaticType(StaticTy::Str),
            "same" => Value::Padding(crate::ir::Padding::Same),
            "valid" => Value::Padding(crate::ir::Padding::Valid),
            // Unknown names were reported by name resolution.
            _ => Value::Error,
        }
    }

    pub fn field(&mut self, base: Value<'p>, f: &Ident, span: Span) -> Value<'p> {
        match &base {
            Value::Record(fs) => {
                if let Some((_, v)) = fs.iter().find(|(k, _)| *k == f.name) {
                    return v.clone();
                }
                let names: Vec<&str> = fs.iter().map(|(k, _)| k.as_str()).collect();
                let mut d = Diag::new(
                    Code::UnknownField,
                    self.site(f.span),
                    format!("no field `{}`", f.name),
                )
                .label(format!(
                    "the record has fields {}",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ));
                if let Some(h) = did_you_mean(&f.name, names.iter().copied()) {
                    d = d.help(h);
                }
                self.error(d)
            }
            Value::Module(m) => match self.p.member(*m, &f.name) {
                Some(Def::Item(m2, i)) => {
                    let saved = std::mem::replace(&mut self.module, m2);
                    let name = self
                        .p
                        .item(m2, i)
                        .name()
                        .map(|n| n.name.clone())
                        .unwrap_or_default();
                    let v = self.name(&name, span);
                    self.module = saved;
                    v
                }
                Some(Def::Module(m2)) => Value::Module(m2),
                None => Value::Error,
            },
            Value::Tensor(n) => {
                let ty = self.graph.ty(*n).clone();
                match f.name.as_str() {
                    "shape" => Value::List(Rc::new(
                        ty.shape.iter().map(|&d| Value::Int(d as i64)).collect(),
                    )),
                    "dtype" => Value::DType(ty.dtype),
                    "rank" => Value::Int(ty.rank() as i64),
                    _ => self.error(
                        Diag::new(
                            Code::UnknownField,
                            self.site(f.span),
                            format!("tensors have no field `{}`", f.name),
                        )
                        .label(format!("a tensor of type {ty}"))
                        .help("tensors have `shape`, `dtype` and `rank`"),
                    ),
                }
            }
            Value::Type(t) => match f.name.as_str() {
                "dtype" => Value::DType(t.dtype),
                "rank" => Value::Int(t.dims.len() as i64),
                _ => self.no_field(&base, f),
            },
            Value::Absent(_) | Value::Error => base,
            _ => self.no_field(&base, f),
        }
    }

    fn no_field(&mut self, base: &Value<'p>, f: &Ident) -> Value<'p> {
        self.error(
            Diag::new(Code::UnknownField, self.site(f.span), format!("{} has no field `{}`", base.kind(), f.name))
                .label("no such field")
                .help("fields exist on records, modules (their items), params and tensors (`shape`, `dtype`, `rank`)"),
        )
    }

    fn index(
        &mut self,
        base: Value<'p>,
        base_span: Span,
        ix: Vec<(Value<'p>, Span)>,
        span: Span,
    ) -> Value<'p> {
        match &base {
            Value::DType(d) => self.tensor_type(*d, ix),
            Value::List(xs) | Value::Tuple(xs) => {
                if ix.len() != 1 {
                    return self.error(
                        Diag::new(
                            Code::TypeMismatch,
                            self.site(span),
                            "a list takes one index",
                        )
                        .label(format!("{} indices", ix.len()))
                        .help("write `list[i]`"),
                    );
                }
                let (v, s) = &ix[0];
                let Some(i) = self.as_int(v, *s) else {
                    return Value::Error;
                };
                let len = xs.len() as i64;
                let j = if i < 0 { i + len } else { i };
                if (0..len).contains(&j) {
                    xs[j as usize].clone()
                } else {
                    self.error(
                        Diag::new(
                            Code::StaticEvalError,
                            self.site(*s),
                            format!("index {i} is out of range for a list of {len}"),
                        )
                        .label("out of range")
                        .with(
                            self.site(base_span),
                            format!("this list has {len} elements"),
                        )
                        .help(format!(
                            "indices run from {} to {}",
                            -len,
                            len - 1
                        )),
                    )
                }
            }
            Value::Tensor(_) => self.error(
                Diag::new(
                    Code::TypeMismatch,
                    self.site(span),
                    "tensors cannot be indexed with `[]`",
                )
                .label("indexing a tensor")
                .help("use `slice(x, axis, start, end)`, `gather(x, indices)` or `reshape`"),
            ),
            Value::Error | Value::Absent(_) => base,
            other => {
                let kind = other.kind();
                self.error(
                    Diag::new(
                        Code::TypeMismatch,
                        self.site(base_span),
                        format!("{kind} cannot be indexed"),
                    )
                    .label(kind)
                    .help(
                        "lists, tuples and dtypes (for tensor types such as `f32[64]`) take `[]`",
                    ),
                )
            }
        }
    }

    /// `f32[64, 10]`: a tensor type as a value.
    fn tensor_type(&mut self, d: DType, ix: Vec<(Value<'p>, Span)>) -> Value<'p> {
        let mut dims = Vec::with_capacity(ix.len());
        for (k, (v, s)) in ix.into_iter().enumerate() {
            match self.as_axis_dim(&v, s, Some(k)) {
                Some(n) => dims.push(Some(n)),
                None => return Value::Error,
            }
        }
        Value::Type(Rc::new(TypeVal { dtype: d, dims }))
    }

    fn range(&mut self, a: Value<'p>, sa: Span, b: Value<'p>, sb: Span) -> Value<'p> {
        for (v, s) in [(&a, sa), (&b, sb)] {
            if matches!(v, Value::Tensor(_)) {
                return self.error(
                    Diag::new(Code::TensorLoopBound, self.site(s), "range bound depends on a tensor")
                        .label("a tensor: its value is only known when the model runs")
                        .help("ranges are unrolled at compile time: use a static integer, such as a params field; to choose elementwise between tensors use `where(cond, a, b)`"),
                );
            }
        }
        let (Some(lo), Some(hi)) = (self.as_int(&a, sa), self.as_int(&b, sb)) else {
            return Value::Error;
        };
        if hi.saturating_sub(lo) > 1_000_000 {
            return self.error(
                Diag::new(
                    Code::StaticEvalError,
                    self.site(sa.to(sb)),
                    format!("range {lo}..{hi} is too long to unroll"),
                )
                .label(format!("{} elements", hi.saturating_sub(lo)))
                .help("ranges are unrolled at compile time; keep them under 1,000,000 elements"),
            );
        }
        if lo > hi {
            return self.error(
                Diag::new(Code::StaticEvalError, self.site(sa.to(sb)), format!("range {lo}..{hi} runs backwards"))
                    .label("the start is after the end")
                    .help("ranges count up: write `lo..hi` with lo <= hi (an empty range `n..n` is allowed)"),
            );
        }
        Value::List(Rc::new((lo..hi).map(Value::Int).collect()))
    }

    // ------------------------------------------------------------ statements

    /// Evaluates a block in a new scope; its value is its tail expression, or the value
    /// of a final `if` whose branches have values.
    pub fn block(&mut self, b: &'p Block) -> Value<'p> {
        self.push_scope();
        let v = self.block_inner(b);
        self.pop_scope();
        v
    }

    fn block_inner(&mut self, b: &'p Block) -> Value<'p> {
        let n = b.stmts.len();
        for (i, s) in b.stmts.iter().enumerate() {
            if i + 1 == n && b.tail.is_none() {
                if let StmtKind::If(ifs) = &s.kind {
                    return self.if_value(ifs);
                }
            }
            self.stmt(s);
        }
        match &b.tail {
            Some(t) => self.expr(t),
            None => Value::None,
        }
    }

    pub fn stmt(&mut self, s: &'p Stmt) {
        match &s.kind {
            StmtKind::Let { name, ty, value } => {
                let v = self.expr(value);
                let v = match ty {
                    Some(t) => self.check_annotation(v, value.span, t),
                    None => v,
                };
                self.record_binding(name, &v);
                self.bind(&name.name, v);
            }
            StmtKind::Assign { name, value } => {
                let v = self.expr(value);
                // Undefined targets were reported by name resolution.
                self.assign(&name.name, v);
            }
            StmtKind::For { var, iter, body } => self.for_stmt(var, iter, body),
            StmtKind::If(i) => {
                self.if_value(i);
            }
            StmtKind::Expr(e) => {
                // A call made for its effect (`assign`, `static_assert`) returns `none`;
                // any other value in statement position is dropped by mistake.
                let v = self.expr(e);
                if !matches!(v, Value::None | Value::Error | Value::Absent(_)) {
                    self.diags.push(
                        Diag::new(
                            Code::MisplacedStatement,
                            self.site(e.span),
                            "this value is not used",
                        )
                        .label(format!("computes {} and drops it", v.kind()))
                        .help("bind it with `let`, or make it the last expression of the block"),
                    );
                }
            }
            StmtKind::Section { kind, kw_span, .. } => {
                self.diags.push(
                    Diag::new(
                        Code::MisplacedStatement,
                        self.site(*kw_span),
                        format!("a `{}` section outside a model body", kind.name()),
                    )
                    .label("not at the top level of a model")
                    .help("sections belong directly in a `model` body, once each"),
                );
            }
            StmtKind::Minimize { .. } => {
                self.diags.push(
                    Diag::new(
                        Code::MisplacedStatement,
                        self.site(s.span),
                        "`minimize` outside a train section",
                    )
                    .label("here")
                    .help("write it in the model's `train { ... }` section"),
                );
            }
            StmtKind::Metric { .. } => {
                self.diags.push(
                    Diag::new(
                        Code::MisplacedStatement,
                        self.site(s.span),
                        "`metric` outside an eval or train section",
                    )
                    .label("here")
                    .help("write metrics in the model's `eval { ... }` section"),
                );
            }
            StmtKind::Error => {}
        }
    }

    fn for_stmt(&mut self, var: &'p Ident, iter: &'p Expr, body: &'p Block) {
        let it = self.expr(iter);
        let items = match it {
            Value::List(xs) | Value::Tuple(xs) => xs,
            Value::Tensor(_) => {
                self.diags.push(
                    Diag::new(Code::TensorLoopBound, self.site(iter.span), "loop bound depends on a tensor")
                        .label("a tensor: its value is only known when the model runs")
                        .help("`for` is unrolled at compile time: iterate over a static list or range; to choose elementwise between tensors use `where(cond, a, b)`"),
                );
                return;
            }
            Value::Error | Value::Absent(_) => return,
            other => {
                let kind = other.kind();
                self.diags.push(
                    Diag::new(
                        Code::TypeMismatch,
                        self.site(iter.span),
                        format!("cannot iterate over {kind}"),
                    )
                    .label(kind)
                    .help("iterate over a list (`[64, 32]`) or a range (`0..n`)"),
                );
                return;
            }
        };
        for v in items.iter() {
            if !self.step(iter.span) {
                return;
            }
            self.push_scope();
            self.record_binding(var, v);
            self.bind(&var.name, v.clone());
            self.block(body);
            self.pop_scope();
        }
    }

    /// Resolves an `if` statically and evaluates the branch taken.
    pub fn if_value(&mut self, i: &'p IfStmt) -> Value<'p> {
        let c = self.expr(&i.cond);
        let taken = match c {
            Value::Bool(b) => b,
            Value::Tensor(_) => {
                return self.error(
                    Diag::new(Code::TensorCondition, self.site(i.cond.span), "condition depends on a tensor")
                        .label("a tensor: its value is only known when the model runs")
                        .help("`if` is resolved at compile time from static values (mode, target, params); to choose elementwise between tensors use `where(cond, a, b)`"),
                )
            }
            Value::Error => return Value::Error,
            Value::Absent(s) => return Value::Absent(s),
            other => {
                let kind = other.kind();
                return self.error(
                    Diag::new(Code::TypeMismatch, self.site(i.cond.span), format!("expected a bool condition, found {kind}"))
                        .label(kind)
                        .help("compare values to make a bool, e.g. `mode == train`"),
                );
            }
        };
        if taken {
            self.block(&i.then)
        } else {
            match &i.otherwise {
                Some(Else::Block(b)) => self.block(b),
                Some(Else::If(inner, _)) => self.if_value(inner),
                None => Value::None,
            }
        }
    }

    // ------------------------------------------------------------ calls

    pub fn call(
        &mut self,
        f: Value<'p>,
        f_span: Span,
        args: Vec<ArgVal<'p>>,
        span: Span,
    ) -> Value<'p> {
        if self.depth >= MAX_DEPTH {
            return self.recursion_error(span);
        }
        match f {
            Value::Func(m, i) => self.call_item(m, i, args, span),
            Value::InputFn(m, i) => self.call_input(m, i, args, span),
            Value::Closure(c) => self.call_closure(&c, args, span),
            Value::Error => Value::Error,
            Value::ModelFn(..) => self.error(
                Diag::new(
                    Code::TypeMismatch,
                    self.site(f_span),
                    "models cannot be called",
                )
                .label("a model")
                .help("name the model in an estimator: `model = my_model`"),
            ),
            other => {
                let kind = other.kind();
                self.error(
                    Diag::new(
                        Code::TypeMismatch,
                        self.site(f_span),
                        format!("{kind} is not callable"),
                    )
                    .label(kind)
                    .help("only functions, inputs and closures can be called"),
                )
            }
        }
    }

    /// Matches arguments to parameters: positional first, then named; missing ones take
    /// their defaults (evaluated in the callee's frame). `None` after reporting an error.
    pub fn bind_args(
        &mut self,
        params: &'p [Param],
        fname: &str,
        args: Vec<ArgVal<'p>>,
        span: Span,
    ) -> Option<Vec<Option<(Value<'p>, Span)>>> {
        let mut slots: Vec<Option<(Value<'p>, Span)>> = vec![None; params.len()];
        let mut ok = true;
        let mut pos = 0;
        let mut named_seen = false;
        let mut misnamed = false;
        for a in args {
            match a.name {
                None if named_seen => {
                    self.diags.push(
                        Diag::new(
                            Code::WrongArity,
                            self.site(a.span),
                            "a positional argument after a named one",
                        )
                        .label("positional")
                        .help(format!(
                            "name it too; the signature is {}",
                            signature(fname, params)
                        )),
                    );
                    ok = false;
                }
                None => {
                    if pos >= params.len() {
                        self.diags.push(
                            Diag::new(
                                Code::WrongArity,
                                self.site(a.span),
                                format!(
                                    "`{fname}` takes {} argument{}",
                                    params.len(),
                                    if params.len() == 1 { "" } else { "s" }
                                ),
                            )
                            .label("one too many")
                            .help(format!("the signature is {}", signature(fname, params))),
                        );
                        ok = false;
                        continue;
                    }
                    slots[pos] = Some((a.value, a.span));
                    pos += 1;
                }
                Some(n) => match params
                    .iter()
                    .position(|p| p.name.name == n.name)
                    .inspect(|_| named_seen = true)
                {
                    Some(i) if slots[i].is_none() => slots[i] = Some((a.value, a.span)),
                    Some(_) => {
                        self.diags.push(
                            Diag::new(
                                Code::UnknownArgument,
                                self.site(n.span),
                                format!("argument `{}` is given twice", n.name),
                            )
                            .label("already given")
                            .help(format!("the signature is {}", signature(fname, params))),
                        );
                        ok = false;
                    }
                    None => {
                        let mut d = Diag::new(
                            Code::UnknownArgument,
                            self.site(n.span),
                            format!("`{fname}` has no parameter `{}`", n.name),
                        )
                        .label("unknown parameter");
                        d = match did_you_mean(&n.name, params.iter().map(|p| p.name.name.as_str()))
                        {
                            Some(h) => {
                                d.help(format!("{h} the signature is {}", signature(fname, params)))
                            }
                            None => {
                                d.help(format!("the signature is {}", signature(fname, params)))
                            }
                        };
                        self.diags.push(d);
                        ok = false;
                        misnamed = true;
                    }
                },
            }
        }
        // A misspelled named argument usually is the missing one: report it once.
        for (i, p) in params.iter().enumerate() {
            if slots[i].is_none() && p.default.is_none() && !misnamed {
                self.diags.push(
                    Diag::new(
                        Code::WrongArity,
                        self.site(span),
                        format!("missing argument `{}` of `{fname}`", p.name.name),
                    )
                    .label(format!("`{}` not given", p.name.name))
                    .with(p.name.span, "declared here")
                    .help(format!("the signature is {}", signature(fname, params))),
                );
                ok = false;
            }
        }
        ok.then_some(slots)
    }

    fn call_item(
        &mut self,
        m: crate::program::ModId,
        i: usize,
        args: Vec<ArgVal<'p>>,
        span: Span,
    ) -> Value<'p> {
        let p = self.p;
        let ItemKind::Fn(f) = &p.item(m, i).kind else {
            return Value::Error;
        };
        // In predict mode, whatever is computed from the labels is absent too.
        if let Some(a) = args.iter().find(|a| matches!(a.value, Value::Absent(_))) {
            return a.value.clone();
        }
        let Some(slots) = self.bind_args(&f.params, &f.name.name, args, span) else {
            return Value::Error;
        };
        let name = f.name.name.clone();
        self.in_frame(m, Vec::new(), span, |el| {
            let bound = el.bind_params(&f.params, slots, span);
            match &f.body {
                None => el.builtin(&name, &f.params, bound, span),
                Some(body) => {
                    el.enter_name_scope(&name);
                    let v = el.block(body);
                    el.leave_name_scope();
                    v
                }
            }
        })
    }

    /// Binds a function's parameters in the current (callee's) frame: the matched
    /// arguments, or the defaults, checked against their annotations.
    pub(super) fn bind_params(
        &mut self,
        params: &'p [Param],
        slots: Vec<Option<(Value<'p>, Span)>>,
        span: Span,
    ) -> Vec<(Value<'p>, Span)> {
        let mut bound = Vec::with_capacity(slots.len());
        for (param, slot) in params.iter().zip(slots) {
            let (v, s) = match slot {
                Some(x) => x,
                None => match &param.default {
                    Some(d) => (self.expr(d), d.span),
                    None => (Value::Error, span),
                },
            };
            let v = match &param.ty {
                Some(t) => self.check_annotation(v, s, t),
                None => v,
            };
            self.record_binding(&param.name, &v);
            self.bind(&param.name.name, v.clone());
            bound.push((v, s));
        }
        bound
    }

    pub fn call_closure(
        &mut self,
        c: &Closure<'p>,
        args: Vec<ArgVal<'p>>,
        span: Span,
    ) -> Value<'p> {
        if args.len() != c.params.len() || args.iter().any(|a| a.name.is_some()) {
            let n = c.params.len();
            // (a pipeline's stage passes each element as one value, a tuple of the
            // features and the labels)
            let help = match args.as_slice() {
                [a] if matches!(&a.value, Value::Tuple(t) if t.len() == n) => {
                    let names: Vec<String> = c
                        .params
                        .iter()
                        .flat_map(Pat::names)
                        .map(|p| p.name.clone())
                        .collect();
                    format!(
                        "it gets one value, a tuple of {n}: take it apart with `|({})| ...`",
                        names.join(", ")
                    )
                }
                _ => "pass one positional argument per closure parameter".into(),
            };
            return self.error(
                Diag::new(
                    Code::WrongArity,
                    self.site(span),
                    format!(
                        "the closure takes {n} positional argument{}",
                        if n == 1 { "" } else { "s" }
                    ),
                )
                .label(format!("called with {}", args.len()))
                .with(c.body.span, "the closure")
                .help(help),
            );
        }
        let mut locals = c.env.clone();
        for (p, a) in c.params.iter().zip(args) {
            self.bind_pat(p, a.value, &mut locals);
        }
        self.in_frame(c.module, locals, span, |el| el.expr(c.body))
    }

    /// Binds the names of closure parameter `p` to the parts of `v` (a tuple pattern
    /// takes a tuple of as many values apart; anything else is E0305 there, and its
    /// names are bound to the error).
    fn bind_pat(&mut self, p: &'p Pat, v: Value<'p>, locals: &mut Vec<(String, Value<'p>)>) {
        let ps = match p {
            Pat::Name(id) => {
                self.record_binding(id, &v);
                locals.push((id.name.clone(), v));
                return;
            }
            Pat::Tuple(ps, _) => ps,
        };
        let parts = match &v {
            Value::Tuple(t) if t.len() == ps.len() => t.as_ref().clone(),
            Value::Error => vec![Value::Error; ps.len()],
            other => {
                let found = match other {
                    Value::Tuple(t) => format!("a tuple of {}", t.len()),
                    _ => other.kind(),
                };
                self.diags.push(
                    Diag::new(
                        Code::TypeMismatch,
                        p.span(),
                        format!("this pattern takes a tuple of {} apart, but the value is {found}", ps.len()),
                    )
                    .label(format!("a tuple of {}", ps.len()))
                    .help("match the pattern to the value: one name per part of the tuple, or one name for the whole value"),
                );
                vec![Value::Error; ps.len()]
            }
        };
        for (q, part) in ps.iter().zip(parts) {
            self.bind_pat(q, part, locals);
        }
    }

    /// Checks a value against a declared type (`units: int`, `x: f32[B, 10]`), converting
    /// an int to a float where a float is declared.
    pub fn check_annotation(&mut self, v: Value<'p>, span: Span, t: &'p TypeExpr) -> Value<'p> {
        if v.is_poison() {
            return v;
        }
        match t {
            TypeExpr::Named {
                name, dims: None, ..
            } => match (name.name.as_str(), &v) {
                ("int", Value::Int(_))
                | ("bool", Value::Bool(_))
                | ("string", Value::Str(_))
                | ("float", Value::Float(_)) => v,
                ("float", Value::Int(i)) => Value::Float(*i as f64),
                ("int" | "bool" | "string" | "float", _) => {
                    self.expected(name.name.as_str(), &v, span)
                }
                ("i64", _) => self.int64_type(t.span()),
                _ => v,
            },
            TypeExpr::Named {
                name,
                dims: Some(dims),
                ..
            } => {
                let Some(dtype) = DType::from_name(&name.name) else {
                    return v;
                };
                if dtype == DType::I64 {
                    return self.int64_type(t.span());
                }
                let Value::Tensor(n) = v else {
                    return self.expected(&format!("a tensor {}", name.name), &v, span);
                };
                let ty = self.graph.ty(n).clone();
                let mut ok = ty.dtype == dtype && ty.rank() == dims.len();
                if ok {
                    for (d, &actual) in dims.iter().zip(&ty.shape) {
                        let want = match &d.kind {
                            ExprKind::Name(dn) if self.local(dn).is_none() => {
                                self.bind(dn, Value::Int(actual as i64));
                                continue;
                            }
                            _ => self.expr(d),
                        };
                        if let Value::Int(w) = want {
                            ok &= w as usize == actual;
                        }
                    }
                }
                if ok {
                    v
                } else {
                    self.error(
                        Diag::new(
                            Code::ShapeMismatch,
                            self.site(span),
                            format!(
                                "expected a tensor of type {}, found {ty}",
                                self.p.sources.text(t.span())
                            ),
                        )
                        .label(format!("this is {ty}"))
                        .with(self.site(t.span()), "declared here")
                        .help("fix the declared type or the value"),
                    )
                }
            }
            TypeExpr::List { .. } => match v {
                Value::List(_) => v,
                _ => self.expected("a list", &v, span),
            },
            TypeExpr::Record { fields, .. } => {
                let Value::Record(fs) = &v else {
                    return self.expected("a record", &v, span);
                };
                let have: Vec<&str> = fs.iter().map(|(k, _)| k.as_str()).collect();
                let want: Vec<&str> = fields.iter().map(|(k, _)| k.name.as_str()).collect();
                let (mut a, mut b) = (have.clone(), want.clone());
                a.sort_unstable();
                b.sort_unstable();
                if a != b {
                    return self.error(
                        Diag::new(
                            Code::TypeMismatch,
                            self.site(span),
                            format!(
                                "expected a record with fields {}, found one with {}",
                                want.join(", "),
                                have.join(", ")
                            ),
                        )
                        .label("this record")
                        .with(self.site(t.span()), "declared here")
                        .help("give the record the declared fields"),
                    );
                }
                let out = fields
                    .iter()
                    .map(|(k, ft)| {
                        let x = fs.iter().find(|(n, _)| *n == k.name).expect("same fields");
                        (k.name.clone(), self.check_annotation(x.1.clone(), span, ft))
                    })
                    .collect();
                Value::Record(Rc::new(out))
            }
            TypeExpr::Tuple { elems, .. } => match &v {
                Value::Tuple(xs) if xs.len() == elems.len() => {
                    let out = xs
                        .iter()
                        .zip(elems)
                        .map(|(x, et)| self.check_annotation(x.clone(), span, et))
                        .collect();
                    Value::Tuple(Rc::new(out))
                }
                _ => self.expected(&format!("a tuple of {}", elems.len()), &v, span),
            },
        }
    }

    pub fn expected(&mut self, what: &str, v: &Value<'p>, span: Span) -> Value<'p> {
        let what = match what {
            "int" => "an integer",
            "float" => "a float",
            "bool" => "a bool",
            "string" => "a string",
            w => w,
        };
        self.error(
            Diag::new(
                Code::TypeMismatch,
                self.site(span),
                format!("expected {what}, found {}", v.kind()),
            )
            .label(v.kind())
            .help(format!("pass {what} here")),
        )
    }

    pub fn int64_type(&mut self, span: Span) -> Value<'p> {
        let at = self.site(span);
        let mut d = Diag::new(Code::Int64, at, "64-bit integers are not supported")
            .label("i64")
            .help("use `i32`; integer features read from records are narrowed to i32 at `parse`");
        // every `i64` written there becomes `i32`
        let edits: Vec<(Span, String)> = crate::syntax::lexer::lex(self.p.sources.text(at))
            .into_iter()
            .filter(|(_, t, _)| *t == crate::syntax::lexer::Tok::Ident("i64"))
            .map(|(lo, _, hi)| {
                let base = at.lo as usize;
                (Span::new(at.file, base + lo, base + hi), "i32".to_string())
            })
            .collect();
        if !edits.is_empty() {
            d = d.fix("use i32", edits);
        }
        self.error(d)
    }

    pub fn as_int(&mut self, v: &Value<'p>, span: Span) -> Option<i64> {
        match v {
            Value::Int(i) => Some(*i),
            Value::Error | Value::Absent(_) => None,
            Value::Tensor(_) => {
                self.diags.push(
                    Diag::new(
                        Code::TypeMismatch,
                        self.site(span),
                        "expected a static integer, found a tensor",
                    )
                    .label("a tensor: its value is only known when the model runs")
                    .help(
                        "shapes, sizes and counts must be static: use a literal or a params field",
                    ),
                );
                None
            }
            other => {
                self.expected("int", &other.clone(), span);
                None
            }
        }
    }

    /// A dimension: a positive static integer.
    pub fn as_dim(&mut self, v: &Value<'p>, span: Span) -> Option<usize> {
        self.as_axis_dim(v, span, None)
    }

    /// Dimension `axis` of a shape (when known, the message names it): a positive
    /// static integer.
    pub fn as_axis_dim(&mut self, v: &Value<'p>, span: Span, axis: Option<usize>) -> Option<usize> {
        let i = self.as_int(v, span)?;
        if i <= 0 {
            let message = match axis {
                Some(k) => format!("axis {k} of the shape is {i}: a dimension must be positive"),
                None => format!("dimension {i} is not positive"),
            };
            self.diags.push(
                Diag::new(Code::InvalidShape, self.site(span), message)
                    .label("must be 1 or more")
                    .help("every dimension of a tensor is a positive integer"),
            );
            return None;
        }
        if i >= crate::elab::datasets::UNKNOWN_DIM as i64 {
            self.diags.push(
                Diag::new(
                    Code::InvalidShape,
                    self.site(span),
                    format!("dimension {i} is too large"),
                )
                .label("above 2^31 - 1")
                .help("dimensions are below 2^31"),
            );
            return None;
        }
        Some(i as usize)
    }

    pub fn as_float(&mut self, v: &Value<'p>, span: Span) -> Option<f64> {
        match v {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            Value::Error | Value::Absent(_) => None,
            other => {
                self.expected("float", &other.clone(), span);
                None
            }
        }
    }

    /// `"data/{split}.csv"`: replaces `{name}` and `{a.b}` with static values.
    fn interpolate(&mut self, s: &str, span: Span) -> Value<'p> {
        if !s.contains('{') {
            return Value::Str(Rc::from(s));
        }
        let mut out = String::with_capacity(s.len());
        let mut rest = s;
        while let Some(i) = rest.find(['{', '\\']) {
            out.push_str(&rest[..i]);
            if rest[i..].starts_with('\\') {
                out.push_str(rest.get(i + 1..i + 2).unwrap_or(""));
                rest = rest.get(i + 2..).unwrap_or("");
                continue;
            }
            let Some(j) = rest[i..].find('}') else {
                return self.error(
                    Diag::new(
                        Code::InvalidLiteral,
                        self.site(span),
                        "unclosed `{` in string",
                    )
                    .label("interpolation without `}`")
                    .help("close it with `}`, or write `\\{` for a literal brace"),
                );
            };
            let path = &rest[i + 1..i + j];
            let mut parts = path.split('.').map(str::trim);
            let first = parts.next().unwrap_or("");
            if first.is_empty() {
                return self.error(
                    Diag::new(
                        Code::InvalidLiteral,
                        self.site(span),
                        "empty interpolation `{}` in string",
                    )
                    .label("nothing between the braces")
                    .help(
                        "name a static value, as in `{split}`, or write `\\{` for a literal brace",
                    ),
                );
            }
            let mut v = if self.local(first).is_some()
                || self.p.lookup(self.module, first).is_some()
                || crate::resolve::BUILTIN_VALUES.contains(&first)
            {
                self.name(first, span)
            } else {
                // Name resolution reported it.
                return Value::Error;
            };
            for p in parts {
                v = self.field(
                    v,
                    &Ident {
                        name: p.to_string(),
                        span,
                    },
                    span,
                );
            }
            if v.is_poison() {
                return v;
            }
            let shown = match &v {
                Value::Str(s) => s.to_string(),
                Value::Int(_)
                | Value::Float(_)
                | Value::Bool(_)
                | Value::List(_)
                | Value::DType(_)
                | Value::Mode(_)
                | Value::Target(_) => super::value::show(&v),
                other => {
                    let kind = other.kind();
                    return self.error(
                        Diag::new(Code::TypeMismatch, self.site(span), format!("cannot interpolate {kind} into a string"))
                            .label(format!("`{{{path}}}` is {kind}"))
                            .help("interpolate static values: strings, numbers, bools, lists, dtypes, `mode` or `target`"),
                    );
                }
            };
            out.push_str(&shown);
            rest = &rest[i + j + 1..];
        }
        out.push_str(rest);
        Value::Str(Rc::from(out.as_str()))
    }
}

/// `dense(x, units: int, use_bias: bool = true)`, for help lines.
pub fn signature(name: &str, params: &[Param]) -> String {
    let ps: Vec<String> = params
        .iter()
        .map(|p| {
            let mut s = p.name.name.clone();
            if let Some(TypeExpr::Named {
                name, dims: None, ..
            }) = &p.ty
            {
                s.push_str(&format!(": {}", name.name));
            }
            if p.default.is_some() {
                s.push_str(" = …");
            }
            s
        })
        .collect();
    format!("`{name}({})`", ps.join(", "))
}
