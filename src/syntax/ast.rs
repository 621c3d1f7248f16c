//! The abstract syntax tree: what the parser produces and every later stage reads. Every
//! node carries its span; a part that failed to parse is an `Error` node, so a tree always
//! exists, however broken the text.

use crate::span::Span;

/// A name as written, with where it was written.
#[derive(Debug, Clone, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

/// One parsed file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Module {
    pub items: Vec<Item>,
    /// Calls and indexing whose `(` or `[` starts a line of its own: that bracket, and
    /// the whole call (see `parser::continuations`).
    pub continuations: Vec<(Span, Span)>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub kind: ItemKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ItemKind {
    Use(UseItem),
    Params(Vec<ParamField>),
    Fn(FnItem),
    Input(FnItem),
    Model(FnItem),
    Estimator(EstimatorItem),
    /// A part of the file that did not parse; its diagnostic was already reported. When
    /// it began like an item, its name is kept so that uses of it are not reported too.
    Error(Option<Ident>),
}

impl Item {
    /// The item's declared name, if it has one.
    pub fn name(&self) -> Option<&Ident> {
        match &self.kind {
            ItemKind::Fn(f) | ItemKind::Input(f) | ItemKind::Model(f) => Some(&f.name),
            ItemKind::Estimator(e) => Some(&e.name),
            ItemKind::Error(name) => name.as_ref(),
            _ => None,
        }
    }
}

/// `use std.nn.{dense, conv2d}`, `use std.nn.dense`, `use std.nn as layers`.
#[derive(Debug, Clone, PartialEq)]
pub struct UseItem {
    pub public: bool,
    pub path: Vec<Ident>,
    /// The `{a, b}` list; `None` imports the last path segment itself.
    pub names: Option<Vec<Ident>>,
    pub alias: Option<Ident>,
}

/// `name: type = default` in the `params` block.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamField {
    pub name: Ident,
    pub ty: TypeExpr,
    pub default: Expr,
}

/// A function, an input pipeline or a model: a name, parameters and a body. `extern`
/// functions have no body: the compiler implements them.
#[derive(Debug, Clone, PartialEq)]
pub struct FnItem {
    pub name: Ident,
    pub params: Vec<Param>,
    pub body: Option<Block>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    pub name: Ident,
    pub ty: Option<TypeExpr>,
    pub default: Option<Expr>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EstimatorItem {
    pub name: Ident,
    pub fields: Vec<Field>,
}

/// `key = value`, or `key { key = value ... }` for nested blocks such as `config`.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: Ident,
    pub value: FieldValue,
}

#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Expr(Expr),
    Block(Vec<Field>, Span),
}

/// A type as written: `int`, `[int]`, `f32[B, 784]`.
#[derive(Debug, Clone, PartialEq)]
pub enum TypeExpr {
    Named {
        name: Ident,
        dims: Option<Vec<Expr>>,
        span: Span,
    },
    List {
        elem: Box<TypeExpr>,
        span: Span,
    },
    /// `{ ids: i32[B, T], len: i32[B] }`: a record of model inputs (or of params fields).
    Record {
        fields: Vec<(Ident, TypeExpr)>,
        span: Span,
    },
    /// `(f32[B, 4], i32[B])`: a tuple of at least two.
    Tuple {
        elems: Vec<TypeExpr>,
        span: Span,
    },
}

impl TypeExpr {
    pub fn span(&self) -> Span {
        match self {
            TypeExpr::Named { span, .. }
            | TypeExpr::List { span, .. }
            | TypeExpr::Record { span, .. }
            | TypeExpr::Tuple { span, .. } => *span,
        }
    }

    /// The types this one is made of, in order (a list's element, a record's fields,
    /// a tuple's parts).
    pub fn parts(&self) -> Vec<&TypeExpr> {
        match self {
            TypeExpr::Named { .. } => Vec::new(),
            TypeExpr::List { elem, .. } => vec![elem],
            TypeExpr::Record { fields, .. } => fields.iter().map(|(_, t)| t).collect(),
            TypeExpr::Tuple { elems, .. } => elems.iter().collect(),
        }
    }
}

/// Statements, optionally ended by a value.
#[derive(Debug, Clone, PartialEq)]
pub struct Block {
    pub stmts: Vec<Stmt>,
    pub tail: Option<Box<Expr>>,
    pub span: Span,
}

/// What the grammar collects inside `{ }` before it becomes a `Block`.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockElem {
    Stmt(Stmt),
    Expr(Expr),
    Semi,
}

impl Block {
    /// The last element, if it is an expression, is the block's value; an expression
    /// anywhere else becomes an `Expr` statement (which the checker reports as unused).
    pub fn from_elems(elems: Vec<BlockElem>, span: Span) -> Block {
        let mut elems: Vec<BlockElem> = elems
            .into_iter()
            .filter(|e| !matches!(e, BlockElem::Semi))
            .collect();
        let tail = match elems.last() {
            Some(BlockElem::Expr(_)) => match elems.pop() {
                Some(BlockElem::Expr(e)) => Some(Box::new(e)),
                _ => None,
            },
            _ => None,
        };
        let stmts = elems
            .into_iter()
            .filter_map(|e| match e {
                BlockElem::Stmt(s) => Some(s),
                BlockElem::Expr(e) => Some(Stmt {
                    span: e.span,
                    kind: StmtKind::Expr(e),
                }),
                BlockElem::Semi => None,
            })
            .collect();
        Block { stmts, tail, span }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Stmt {
    pub kind: StmtKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum StmtKind {
    Let {
        name: Ident,
        ty: Option<TypeExpr>,
        value: Expr,
    },
    Assign {
        name: Ident,
        value: Expr,
    },
    For {
        var: Ident,
        iter: Expr,
        body: Block,
    },
    If(IfStmt),
    /// `train { ... }`, `eval { ... }`, `predict { ... }` in a model body.
    Section {
        kind: SectionKind,
        kw_span: Span,
        body: Block,
    },
    /// `minimize loss with optimizer` in a train section.
    Minimize {
        loss: Expr,
        optimizer: Expr,
    },
    /// `metric name = expr` in an eval or train section.
    Metric {
        name: Ident,
        value: Expr,
    },
    /// An expression whose value nothing uses (not the last of its block).
    Expr(Expr),
    Error,
}

#[derive(Debug, Clone, PartialEq)]
pub struct IfStmt {
    pub cond: Expr,
    pub then: Block,
    pub otherwise: Option<Else>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Else {
    Block(Block),
    If(Box<IfStmt>, Span),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SectionKind {
    Train,
    Eval,
    Predict,
}

impl SectionKind {
    pub fn name(self) -> &'static str {
        match self {
            SectionKind::Train => "train",
            SectionKind::Eval => "eval",
            SectionKind::Predict => "predict",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ExprKind {
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
    Name(String),
    List(Vec<Expr>),
    Tuple(Vec<Expr>),
    Record(Vec<(Ident, Expr)>),
    Field(Box<Expr>, Ident),
    /// `x[i]`, and `f32[B, 784]` (a tensor type, as a static value).
    Index(Box<Expr>, Vec<Expr>),
    Call {
        callee: Box<Expr>,
        args: Vec<Arg>,
        piped: bool,
    },
    Unary(UnaryOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Range(Box<Expr>, Box<Expr>),
    Closure {
        params: Vec<Pat>,
        body: Box<Expr>,
    },
    If(Box<IfStmt>),
    Error,
}

/// A closure's parameter: a name, or a tuple of patterns that takes a tuple value apart
/// (`|(x, y)| ...`, as an input pipeline's `map` over `(features, labels)` elements).
#[derive(Debug, Clone, PartialEq)]
pub enum Pat {
    Name(Ident),
    Tuple(Vec<Pat>, Span),
}

impl Pat {
    /// The names it binds, in order.
    pub fn names(&self) -> Vec<&Ident> {
        match self {
            Pat::Name(id) => vec![id],
            Pat::Tuple(ps, _) => ps.iter().flat_map(Pat::names).collect(),
        }
    }

    pub fn span(&self) -> Span {
        match self {
            Pat::Name(id) => id.span,
            Pat::Tuple(_, s) => *s,
        }
    }
}

/// A call argument, positional or named (`padding: same`).
#[derive(Debug, Clone, PartialEq)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Not,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::Eq => "==",
            BinOp::Ne => "!=",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }
}

impl Expr {
    pub fn new(kind: ExprKind, span: Span) -> Expr {
        Expr { kind, span }
    }

    pub fn boxed(kind: ExprKind, span: Span) -> Box<Expr> {
        Box::new(Expr { kind, span })
    }
}
