//! Operators on values: static arithmetic on static values, graph nodes when a tensor
//! is involved. Every node goes through `op`, which infers its type and turns an
//! inference failure into a diagnostic with a label on each operand.

use super::value::Value;
use super::Elab;
use crate::diag::{Code, Diag};
use crate::ir::{self, BinaryOp, DType, NodeIndex, Op, TensorType, UnaryOp};
use crate::span::Span;
use crate::syntax::ast::{BinOp, UnaryOp as AstUnary};
use std::rc::Rc;

impl<'p> Elab<'p> {
    /// Adds a node. `declared` is the result type for ops that take it from the node
    /// (see `ir::infer`); other ops pass any type (it is replaced by the inferred one).
    pub fn op(
        &mut self,
        op: Op,
        args: &[(NodeIndex, Span)],
        declared: TensorType,
        span: Span,
    ) -> Value<'p> {
        let tys: Vec<&TensorType> = args.iter().map(|(n, _)| self.graph.ty(*n)).collect();
        match ir::infer(&op, &tys, &declared) {
            Ok(ty) => {
                let operands: Vec<NodeIndex> = args.iter().map(|(n, _)| *n).collect();
                let site = self.site(span);
                Value::Tensor(self.graph.add(op, &operands, ty, site))
            }
            Err(e) => {
                let mut d = Diag::new(e.code, self.site(span), e.message)
                    .label(format!("in this {}", op.name()));
                for (n, s) in args {
                    let site = self.site(*s);
                    if site != self.site(span) {
                        d = d.with(site, format!("this is {}", self.graph.ty(*n)));
                    }
                }
                // (a size each record gives, `?`, is what is wrong more often than not)
                let unknown = args.iter().any(|(n, _)| self.graph.ty(*n).has_unknown());
                match e.help {
                    _ if unknown => d = d.help(ir::UNKNOWN_HELP),
                    Some(h) => d = d.help(h),
                    None => {}
                }
                self.error(d)
            }
        }
    }

    /// A scalar constant of `dtype`.
    pub fn constant(&mut self, v: f64, dtype: DType, span: Span) -> NodeIndex {
        let site = self.site(span);
        self.graph.add(
            Op::Const { bits: v.to_bits() },
            &[],
            TensorType::scalar(dtype),
            site,
        )
    }

    pub fn global_step(&mut self, span: Span) -> Value<'p> {
        let site = self.site(span);
        let node = match self.global_step_node {
            Some(n) => n,
            None => self
                .graph
                .add(Op::GlobalStep, &[], TensorType::scalar(DType::I64), site),
        };
        self.global_step_node = Some(node);
        Value::Tensor(node)
    }

    /// A value as a tensor operand: tensors as they are, static numbers as constants of
    /// `like`'s dtype. `None` (after a diagnostic) when that is not possible.
    pub fn operand(&mut self, v: &Value<'p>, span: Span, like: Option<DType>) -> Option<NodeIndex> {
        match v {
            Value::Tensor(n) => Some(*n),
            Value::Int(i) => Some(self.constant(*i as f64, like.unwrap_or(DType::I32), span)),
            Value::Float(f) => {
                let d = like.unwrap_or(DType::F32);
                if !d.is_float() {
                    self.diags.push(
                        Diag::new(
                            Code::DtypeMismatch,
                            self.site(span),
                            format!("a float cannot combine with a {d} tensor"),
                        )
                        .label("a float")
                        .help(format!(
                            "cast the tensor with `cast(x, f32)`, or write an integer for {d}"
                        )),
                    );
                    return None;
                }
                Some(self.constant(*f, d, span))
            }
            Value::Bool(b) => Some(self.constant(f64::from(u8::from(*b)), DType::Bool, span)),
            Value::Error | Value::Absent(_) => None,
            other => {
                self.expected("a tensor or a number", &other.clone(), span);
                None
            }
        }
    }

    pub fn binary(
        &mut self,
        op: BinOp,
        a: (Value<'p>, Span),
        b: (Value<'p>, Span),
        span: Span,
    ) -> Value<'p> {
        let (va, sa) = a;
        let (vb, sb) = b;
        if let Value::Absent(s) = va {
            return Value::Absent(s);
        }
        if let Value::Absent(s) = vb {
            return Value::Absent(s);
        }
        if matches!(va, Value::Error) || matches!(vb, Value::Error) {
            return Value::Error;
        }
        // `x == none` asks whether an optional argument was given, whatever `x` is.
        if matches!(op, BinOp::Eq | BinOp::Ne)
            && (matches!(va, Value::None) || matches!(vb, Value::None))
        {
            let same = matches!(va, Value::None) && matches!(vb, Value::None);
            return Value::Bool(same == (op == BinOp::Eq));
        }
        if matches!(va, Value::Tensor(_)) || matches!(vb, Value::Tensor(_)) {
            return self.tensor_binary(op, (&va, sa), (&vb, sb), span);
        }
        self.static_binary(op, (&va, sa), (&vb, sb), span)
    }

    fn tensor_binary(
        &mut self,
        op: BinOp,
        a: (&Value<'p>, Span),
        b: (&Value<'p>, Span),
        span: Span,
    ) -> Value<'p> {
        let like = match (a.0, b.0) {
            (Value::Tensor(n), _) | (_, Value::Tensor(n)) => Some(self.graph.ty(*n).dtype),
            _ => None,
        };
        let (Some(x), Some(y)) = (self.operand(a.0, a.1, like), self.operand(b.0, b.1, like))
        else {
            return Value::Error;
        };
        let bop = match op {
            BinOp::Add => BinaryOp::Add,
            BinOp::Sub => BinaryOp::Sub,
            BinOp::Mul => BinaryOp::Mul,
            BinOp::Div => BinaryOp::Div,
            BinOp::Rem => BinaryOp::Rem,
            BinOp::Eq => BinaryOp::Eq,
            BinOp::Ne => BinaryOp::Ne,
            BinOp::Lt => BinaryOp::Lt,
            BinOp::Le => BinaryOp::Le,
            BinOp::Gt => BinaryOp::Gt,
            BinOp::Ge => BinaryOp::Ge,
            BinOp::And => BinaryOp::And,
            BinOp::Or => BinaryOp::Or,
        };
        let at = self.operator_span(a.1, b.1).unwrap_or(span);
        self.op(
            Op::Binary(bop),
            &[(x, a.1), (y, b.1)],
            TensorType::scalar(DType::F32),
            at,
        )
    }

    /// The operator between two operands (`+` in `a + b`), so that a diagnostic's labels
    /// on the operator and on each operand do not overlap.
    fn operator_span(&self, a: Span, b: Span) -> Option<Span> {
        if a.file != b.file || a.hi >= b.lo || self.p.is_std_file(a.file) {
            return None;
        }
        let gap = self.p.sources.text(Span {
            lo: a.hi,
            hi: b.lo,
            ..a
        });
        // Parentheses around an operand are not the operator.
        let op = gap
            .trim()
            .trim_start_matches(')')
            .trim_end_matches('(')
            .trim();
        if op.is_empty() || op.len() > 2 {
            return None;
        }
        let lo = a.hi + gap.find(op)? as u32;
        Some(Span {
            lo,
            hi: lo + op.len() as u32,
            ..a
        })
    }

    fn static_binary(
        &mut self,
        op: BinOp,
        a: (&Value<'p>, Span),
        b: (&Value<'p>, Span),
        span: Span,
    ) -> Value<'p> {
        use Value::*;
        let r = match (op, a.0, b.0) {
            (BinOp::Eq, x, y) => x.static_eq(y).map(Bool),
            (BinOp::Ne, x, y) => x.static_eq(y).map(|e| Bool(!e)),
            (BinOp::And, Bool(x), Bool(y)) => Some(Bool(*x && *y)),
            (BinOp::Or, Bool(x), Bool(y)) => Some(Bool(*x || *y)),
            (_, Int(x), Int(y)) => Some(self.int_op(op, *x, *y, span)),
            (_, Int(_) | Float(_), Int(_) | Float(_)) => {
                let (x, y) = (num(a.0), num(b.0));
                float_op(op, x, y)
            }
            (BinOp::Add, Str(x), Str(y)) => Some(Str(Rc::from(format!("{x}{y}").as_str()))),
            (BinOp::Add, List(x), List(y)) => {
                Some(List(Rc::new(x.iter().chain(y.iter()).cloned().collect())))
            }
            (BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge, Str(x), Str(y)) => {
                Some(Bool(cmp(op, x.cmp(y))))
            }
            _ => Option::None,
        };
        match r {
            Some(v) => v,
            Option::None => self.error(
                Diag::new(
                    Code::TypeMismatch,
                    self.site(span),
                    format!(
                        "`{}` cannot combine {} and {}",
                        op.symbol(),
                        a.0.kind(),
                        b.0.kind()
                    ),
                )
                .label("here")
                .with(self.site(a.1), a.0.kind())
                .with(self.site(b.1), b.0.kind())
                .help("arithmetic works on numbers and tensors; `+` also joins strings and lists"),
            ),
        }
    }

    fn int_op(&mut self, op: BinOp, x: i64, y: i64, span: Span) -> Value<'p> {
        let r = match op {
            BinOp::Add => x.checked_add(y).map(Value::Int),
            BinOp::Sub => x.checked_sub(y).map(Value::Int),
            BinOp::Mul => x.checked_mul(y).map(Value::Int),
            BinOp::Div => x.checked_div(y).map(Value::Int),
            BinOp::Rem => x.checked_rem(y).map(Value::Int),
            _ => float_op(op, x as f64, y as f64),
        };
        r.unwrap_or_else(|| {
            let what = if y == 0 && matches!(op, BinOp::Div | BinOp::Rem) {
                "division by zero"
            } else {
                "integer overflow"
            };
            self.error(
                Diag::new(
                    Code::StaticEvalError,
                    self.site(span),
                    format!("{what} in `{x} {} {y}`", op.symbol()),
                )
                .label(what)
                .help("fix the static values involved"),
            )
        })
    }

    pub fn unary(&mut self, op: AstUnary, v: Value<'p>, span: Span) -> Value<'p> {
        match (op, &v) {
            (_, Value::Error | Value::Absent(_)) => v,
            (AstUnary::Neg, Value::Int(i)) => match i.checked_neg() {
                Some(n) => Value::Int(n),
                None => self.error(
                    Diag::new(
                        Code::StaticEvalError,
                        self.site(span),
                        format!("integer overflow in `-{i}`"),
                    )
                    .label("integer overflow")
                    .help("fix the static values involved"),
                ),
            },
            (AstUnary::Neg, Value::Float(f)) => Value::Float(-f),
            (AstUnary::Not, Value::Bool(b)) => Value::Bool(!b),
            (AstUnary::Neg, Value::Tensor(n)) => {
                let n = *n;
                self.op(
                    Op::Unary(UnaryOp::Neg),
                    &[(n, span)],
                    TensorType::scalar(DType::F32),
                    span,
                )
            }
            (AstUnary::Not, Value::Tensor(n)) => {
                let n = *n;
                self.op(
                    Op::Unary(UnaryOp::Not),
                    &[(n, span)],
                    TensorType::scalar(DType::Bool),
                    span,
                )
            }
            _ => {
                let sym = if op == AstUnary::Neg { "-" } else { "!" };
                self.error(
                    Diag::new(
                        Code::TypeMismatch,
                        self.site(span),
                        format!("`{sym}` cannot apply to {}", v.kind()),
                    )
                    .label(v.kind())
                    .help(if op == AstUnary::Neg {
                        "negate numbers or tensors"
                    } else {
                        "`!` negates bools"
                    }),
                )
            }
        }
    }
}

fn num(v: &Value<'_>) -> f64 {
    match v {
        Value::Int(i) => *i as f64,
        Value::Float(f) => *f,
        _ => f64::NAN,
    }
}

fn cmp(op: BinOp, o: std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::*;
    match op {
        BinOp::Lt => o == Less,
        BinOp::Le => o != Greater,
        BinOp::Gt => o == Greater,
        BinOp::Ge => o != Less,
        _ => false,
    }
}

fn float_op<'p>(op: BinOp, x: f64, y: f64) -> Option<Value<'p>> {
    Some(match op {
        BinOp::Add => Value::Float(x + y),
        BinOp::Sub => Value::Float(x - y),
        BinOp::Mul => Value::Float(x * y),
        BinOp::Div => Value::Float(x / y),
        BinOp::Rem => Value::Float(x % y),
        BinOp::Lt => Value::Bool(x < y),
        BinOp::Le => Value::Bool(x <= y),
        BinOp::Gt => Value::Bool(x > y),
        BinOp::Ge => Value::Bool(x >= y),
        BinOp::Eq => Value::Bool(x == y),
        BinOp::Ne => Value::Bool(x != y),
        BinOp::And | BinOp::Or => return None,
    })
}
