//! Static values: what elaboration computes. Everything is known at compile time except
//! tensors, which are nodes of the graph being built.

use super::data::Dataset;
use crate::ir::{DType, Init, NodeIndex};
use crate::program::ModId;
use crate::span::Span;
use crate::syntax::ast::{Expr, Pat, SectionKind};
use std::fmt;
use std::rc::Rc;

/// The kind of a static `params` field or function parameter annotation.
#[derive(Debug, Clone, PartialEq)]
pub enum StaticTy {
    Int,
    Float,
    Bool,
    Str,
    List(Box<StaticTy>),
}

impl fmt::Display for StaticTy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StaticTy::Int => f.write_str("int"),
            StaticTy::Float => f.write_str("float"),
            StaticTy::Bool => f.write_str("bool"),
            StaticTy::Str => f.write_str("string"),
            StaticTy::List(t) => write!(f, "[{t}]"),
        }
    }
}

/// A tensor type as a value (`f32[64]`), with possibly unknown dimensions.
#[derive(Debug, Clone, PartialEq)]
pub struct TypeVal {
    pub dtype: DType,
    pub dims: Vec<Option<usize>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Host,
    Wafer,
    Interp,
}

impl Target {
    /// Where `train`, `eval`, `predict` and `perf-input` run when no target is named:
    /// the host when this build has it (the `llvm` feature), else the interpreter.
    pub const fn run_default() -> Target {
        if cfg!(feature = "llvm") {
            Target::Host
        } else {
            Target::Interp
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Target::Host => "host",
            Target::Wafer => "wafer",
            Target::Interp => "interp",
        }
    }
}

/// A closure: parameters, body, and the locals it captured.
#[derive(Debug)]
pub struct Closure<'p> {
    pub params: &'p [Pat],
    pub body: &'p Expr,
    pub env: Vec<(String, Value<'p>)>,
    pub module: ModId,
}

/// An optimiser made by one of `std.optim`'s functions.
#[derive(Debug, Clone)]
pub struct OptimizerVal<'p> {
    pub kind: &'static str,
    pub lr: Value<'p>,
    pub hyper: Vec<(&'static str, f64)>,
    pub clip_global_norm: Option<f64>,
    pub decay_exclude: Vec<String>,
    /// The variables `only(...)` restricts it to, and where.
    pub variables: Option<(Vec<String>, Span)>,
    /// `moving_average(...)`'s decay and whether it ramps up with the step.
    pub moving_average: Option<(f64, bool)>,
    /// `loss_scale(...)`.
    pub loss_scale: Option<crate::ir::LossScale>,
    pub span: Span,
}

/// A metric made by one of `std.metrics`' functions: a reducer over tensors.
#[derive(Debug, Clone)]
pub struct MetricVal {
    pub reducer: String,
    pub args: Vec<(&'static str, NodeIndex)>,
    pub span: Span,
}

/// A run hook made by one of `std.hooks`' functions.
#[derive(Debug, Clone, PartialEq)]
pub struct HookVal {
    pub kind: &'static str,
    pub args: Vec<(&'static str, i64)>,
    /// Its string and float arguments (`early_stopping`'s metric, mode and min_delta).
    pub strings: Vec<(&'static str, String)>,
    pub floats: Vec<(&'static str, f64)>,
    pub span: Span,
}

impl HookVal {
    /// A string argument ("" when it has none of that name).
    pub fn string(&self, k: &str) -> &str {
        self.strings
            .iter()
            .find(|a| a.0 == k)
            .map_or("", |a| a.1.as_str())
    }

    /// A float argument (0 when it has none of that name).
    pub fn float(&self, k: &str) -> f64 {
        self.floats.iter().find(|a| a.0 == k).map_or(0.0, |a| a.1)
    }
}

#[derive(Debug, Clone)]
pub enum Value<'p> {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(Rc<str>),
    List(Rc<Vec<Value<'p>>>),
    Tuple(Rc<Vec<Value<'p>>>),
    Record(Rc<Vec<(String, Value<'p>)>>),
    None,
    DType(DType),
    Type(Rc<TypeVal>),
    StaticType(StaticTy),
    Mode(SectionKind),
    Target(Target),
    Padding(crate::ir::Padding),
    Init(Init),
    Tensor(NodeIndex),
    /// A function item (or `extern fn`) of a module.
    Func(ModId, usize),
    /// An `input` item: calling it elaborates its pipeline.
    InputFn(ModId, usize),
    /// A `model` item, as named by an estimator.
    ModelFn(ModId, usize),
    Closure(Rc<Closure<'p>>),
    Module(ModId),
    Dataset(Rc<Dataset>),
    Optimizer(Rc<OptimizerVal<'p>>),
    Metric(Rc<MetricVal>),
    Hook(Rc<HookVal>),
    /// Labels in predict mode: absent. Anything computed from it is absent too; using
    /// it in a prediction is an error.
    Absent(Span),
    /// The result of an expression that already failed with a diagnostic. Operations on
    /// it give `Error` silently, so one mistake is reported once.
    Error,
}

impl Value<'_> {
    /// What kind of value this is, for "expected X, found Y" messages.
    pub fn kind(&self) -> String {
        match self {
            Value::Int(_) => "an integer".into(),
            Value::Float(_) => "a float".into(),
            Value::Bool(_) => "a bool".into(),
            Value::Str(_) => "a string".into(),
            Value::List(_) => "a list".into(),
            Value::Tuple(_) => "a tuple".into(),
            Value::Record(_) => "a record".into(),
            Value::None => "`none`".into(),
            Value::DType(_) => "a dtype".into(),
            Value::Type(_) => "a tensor type".into(),
            Value::StaticType(_) => "a type".into(),
            Value::Mode(_) => "a mode".into(),
            Value::Target(_) => "a target".into(),
            Value::Padding(_) => "a padding".into(),
            Value::Init(_) => "an initialiser".into(),
            Value::Tensor(_) => "a tensor".into(),
            Value::Func(..) | Value::Closure(_) => "a function".into(),
            Value::InputFn(..) => "an input".into(),
            Value::ModelFn(..) => "a model".into(),
            Value::Module(_) => "a module".into(),
            Value::Dataset(_) => "a dataset".into(),
            Value::Optimizer(_) => "an optimizer".into(),
            Value::Metric(_) => "a metric".into(),
            Value::Hook(_) => "a hook".into(),
            Value::Absent(_) => "labels (absent in predict mode)".into(),
            Value::Error => "an erroneous value".into(),
        }
    }

    pub fn is_poison(&self) -> bool {
        matches!(self, Value::Error | Value::Absent(_))
    }

    /// Static equality (for `==` on static values). `None` if the values are not
    /// comparable statically.
    pub fn static_eq(&self, other: &Value<'_>) -> Option<bool> {
        Some(match (self, other) {
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a == b,
            (Value::Int(a), Value::Float(b)) | (Value::Float(b), Value::Int(a)) => {
                (*a as f64) == *b
            }
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Str(a), Value::Str(b)) => a == b,
            (Value::None, Value::None) => true,
            (Value::DType(a), Value::DType(b)) => a == b,
            (Value::Mode(a), Value::Mode(b)) => a == b,
            (Value::Target(a), Value::Target(b)) => a == b,
            (Value::Padding(a), Value::Padding(b)) => a == b,
            (Value::List(a), Value::List(b)) | (Value::Tuple(a), Value::Tuple(b)) => {
                if a.len() != b.len() {
                    return Some(false);
                }
                for (x, y) in a.iter().zip(b.iter()) {
                    if !x.static_eq(y)? {
                        return Some(false);
                    }
                }
                true
            }
            (Value::Func(m1, i1), Value::Func(m2, i2)) => m1 == m2 && i1 == i2,
            (Value::Tensor(_), _) | (_, Value::Tensor(_)) => return None,
            (Value::Closure(a), Value::Closure(b)) => Rc::ptr_eq(a, b),
            _ => false,
        })
    }
}

/// A static value written back as est source (for `--emit` dumps and messages).
pub fn show(v: &Value<'_>) -> String {
    match v {
        Value::Int(i) => i.to_string(),
        Value::Float(f) => crate::ir::fmt_f64(*f),
        Value::Bool(b) => b.to_string(),
        Value::Str(s) => format!("{s:?}"),
        Value::List(xs) => format!("[{}]", xs.iter().map(show).collect::<Vec<_>>().join(", ")),
        Value::Tuple(xs) => format!("({})", xs.iter().map(show).collect::<Vec<_>>().join(", ")),
        Value::Record(fs) => {
            format!(
                "{{{}}}",
                fs.iter()
                    .map(|(k, v)| format!("{k}: {}", show(v)))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
        Value::None => "none".into(),
        Value::DType(d) => d.name().into(),
        Value::Mode(m) => m.name().into(),
        Value::Target(t) => t.name().into(),
        Value::Padding(p) => crate::ir::padding_name(*p).into(),
        other => other.kind(),
    }
}
