//! Name resolution: walks every body of every module once, whatever the mode or target,
//! and reports unknown names, assignments to undefined names, unused bindings and
//! imports, and locals that shadow items. Elaboration later looks names up the same way
//! (locals, module items, imports, prelude, built-in values) and can rely on them.

use crate::diag::{did_you_mean, Code, Diag, Diags};
use crate::program::{Def, ModId, Program};
use crate::span::Span;
use crate::syntax::ast::*;
use rustc_hash::{FxHashMap, FxHashSet};

/// Names that exist everywhere without an item behind them.
/// The names of static types.
const STATIC_TYPES: &[&str] = &["int", "float", "bool", "string"];

pub const BUILTIN_VALUES: &[&str] = &[
    "params",
    "mode",
    "target",
    "global_step",
    "train",
    "eval",
    "predict",
    "host",
    "wafer",
    "interp",
    "none",
    "f32",
    "f16",
    "bf16",
    "i32",
    "u8",
    "bool",
    "i64",
    "bytes",
    "int",
    "float",
    "string",
    "same",
    "valid",
];

struct Binding {
    name: String,
    span: Span,
    used: bool,
    /// Warn when unused (lets and fn parameters in user files).
    warn_unused: bool,
}

/// What a name in the source refers to (for go to definition and hover).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A `let`, a parameter or a loop variable, by the span of its binding.
    Local(Span),
    /// A module-level item, or a module.
    Def(Def),
    /// A field of the `params` block, by the span of its name.
    ParamsField(Span),
}

struct Resolver<'p> {
    p: &'p Program,
    /// Every name use resolved so far, with what it refers to.
    refs: Vec<(Span, Target)>,
    m: ModId,
    user: bool,
    scopes: Vec<Vec<Binding>>,
    diags: Diags,
    used_imports: FxHashSet<String>,
    params_fields: FxHashSet<String>,
    params_spans: FxHashMap<String, Span>,
}

/// Runs name resolution over the whole program.
pub fn resolve(p: &Program) -> Diags {
    resolve_with_refs(p).0
}

/// Runs name resolution, and also returns every resolved use of a name with what it
/// refers to, in source order per module.
pub fn resolve_with_refs(p: &Program) -> (Diags, Vec<(Span, Target)>) {
    let params_spans: FxHashMap<String, Span> = p
        .root_module()
        .ast
        .items
        .iter()
        .filter_map(|i| match &i.kind {
            ItemKind::Params(f) => Some(f.iter().map(|f| (f.name.name.clone(), f.name.span))),
            _ => None,
        })
        .flatten()
        .collect();
    let params_fields: FxHashSet<String> = p
        .root_module()
        .ast
        .items
        .iter()
        .filter_map(|i| match &i.kind {
            ItemKind::Params(f) => Some(f.iter().map(|f| f.name.name.clone())),
            _ => None,
        })
        .flatten()
        .collect();
    let mut all = Diags::default();
    let mut refs = Vec::new();
    for (i, module) in p.modules.iter().enumerate() {
        let mut r = Resolver {
            p,
            refs: Vec::new(),
            params_spans: params_spans.clone(),
            m: ModId(i as u32),
            user: !module.is_std,
            scopes: Vec::new(),
            diags: Diags::default(),
            used_imports: FxHashSet::default(),
            params_fields: params_fields.clone(),
        };
        r.module(&module.ast);
        // After a syntax error, items are missing and their imports look unused.
        let parse_failed = p
            .diags
            .iter()
            .any(|d| d.primary.span.file == module.file && d.code.id().starts_with("E01"));
        if r.user && !parse_failed {
            r.unused_imports();
        }
        all.extend(r.diags.iter().cloned());
        refs.append(&mut r.refs);
    }
    (all, refs)
}

impl<'p> Resolver<'p> {
    fn module(&mut self, m: &Module) {
        let mut params_seen: FxHashMap<String, Span> = FxHashMap::default();
        let mut params_block: Option<Span> = None;
        for item in &m.items {
            if let ItemKind::Params(_) = item.kind {
                if let Some(prev) = params_block.replace(item.span) {
                    self.diags.push(
                        Diag::new(
                            Code::DuplicateDefinition,
                            Span {
                                hi: item.span.lo + 6,
                                ..item.span
                            },
                            "a second `params` block",
                        )
                        .label("second block")
                        .with(
                            Span {
                                hi: prev.lo + 6,
                                ..prev
                            },
                            "first block",
                        )
                        .help("a program has one params dictionary: merge the blocks"),
                    );
                }
            }
            match &item.kind {
                ItemKind::Fn(f) | ItemKind::Input(f) => {
                    if f.body.is_none() && self.user {
                        self.diags.push(
                            Diag::new(Code::MisplacedStatement, f.name.span, format!("`extern fn {}` outside the standard library", f.name.name))
                                .label("no body")
                                .help("extern functions are implemented by the compiler; give this function a body"),
                        );
                    }
                    self.function(f, false)
                }
                ItemKind::Model(f) => self.function(f, true),
                ItemKind::Estimator(e) => self.fields(&e.fields),
                ItemKind::Params(fields) => {
                    for f in fields {
                        if let Some(prev) = params_seen.insert(f.name.name.clone(), f.name.span) {
                            self.diags.push(
                                Diag::new(
                                    Code::DuplicateDefinition,
                                    f.name.span,
                                    format!("params field `{}` is declared twice", f.name.name),
                                )
                                .label("second declaration")
                                .with(prev, "first declaration")
                                .help("remove one of them"),
                            );
                        }
                        self.type_name(&f.ty, true);
                        self.expr(&f.default);
                    }
                }
                ItemKind::Use(u) => self.use_item(u),
                ItemKind::Error(_) => {}
            }
        }
    }

    /// The names a `use` imports refer to their items (for rename and go to
    /// definition); an alias refers to the item too.
    fn use_item(&mut self, u: &UseItem) {
        let path: Vec<&str> = u.path.iter().map(|i| i.name.as_str()).collect();
        let module = |p: &[&str]| {
            let joined = p.join(".");
            (self.p.modules.iter())
                .position(|m| m.path == joined)
                .map(|i| ModId(i as u32))
        };
        let mut found = Vec::new();
        match &u.names {
            Some(names) => {
                if let Some(m) = module(&path) {
                    for n in names {
                        if let Some(d) = self.p.member(m, &n.name) {
                            found.push((n.span, d));
                        }
                    }
                }
            }
            None => {
                let (Some(last), Some((_, base))) = (u.path.last(), path.split_last()) else {
                    return;
                };
                let d = module(&path)
                    .map(Def::Module)
                    .or_else(|| module(base).and_then(|m| self.p.member(m, &last.name)));
                if let Some(d) = d {
                    found.push((last.span, d));
                    if let Some(a) = &u.alias {
                        found.push((a.span, d));
                    }
                }
            }
        }
        self.refs
            .extend(found.into_iter().map(|(s, d)| (s, Target::Def(d))));
    }

    /// The parameters of the item a call's callee names (`f` or `module.f`), if any.
    fn callee_params(&self, callee: &Expr) -> Option<&'p [Param]> {
        let (name, member) = match &callee.kind {
            ExprKind::Name(n) => (n, None),
            ExprKind::Field(base, f) => match &base.kind {
                ExprKind::Name(n) => (n, Some(f.name.as_str())),
                _ => return None,
            },
            _ => return None,
        };
        if self.local(name) {
            return None;
        }
        Some(&self.p.callee(self.m, name, member)?.params)
    }

    fn fields(&mut self, fields: &[Field]) {
        let mut seen: FxHashMap<&str, Span> = FxHashMap::default();
        for f in fields {
            if let Some(prev) = seen.insert(&f.name.name, f.name.span) {
                self.diags.push(
                    Diag::new(
                        Code::DuplicateDefinition,
                        f.name.span,
                        format!("`{}` is set twice", f.name.name),
                    )
                    .label("second setting")
                    .with(prev, "first setting")
                    .help("remove one of them"),
                );
            }
            match &f.value {
                FieldValue::Expr(e) => self.expr(e),
                FieldValue::Block(inner, _) => self.fields(inner),
            }
        }
    }

    fn function(&mut self, f: &FnItem, is_model: bool) {
        self.scopes.push(Vec::new());
        let mut seen: FxHashMap<&str, Span> = FxHashMap::default();
        for p in &f.params {
            if let Some(prev) = seen.insert(&p.name.name, p.name.span) {
                self.diags.push(
                    Diag::new(
                        Code::DuplicateDefinition,
                        p.name.span,
                        format!("parameter `{}` is declared twice", p.name.name),
                    )
                    .label("second declaration")
                    .with(prev, "first declaration")
                    .help("rename one of them"),
                );
            }
            if let Some(d) = &p.default {
                self.expr(d);
            }
            if let Some(t) = &p.ty {
                self.type_dims(t);
            }
        }
        for p in &f.params {
            let warn = self.user && f.body.is_some() && !is_model;
            if f.body.is_some() {
                self.shadow_check(&p.name, "parameter");
            }
            self.bind(&p.name, warn);
        }
        if let Some(b) = &f.body {
            self.block(b);
        }
        self.pop_scope();
    }

    /// Dimension names in a parameter's type: known names are uses; unknown ones are
    /// named dimensions, bound for the body.
    fn type_dims(&mut self, t: &TypeExpr) {
        self.dims_in(t);
        self.type_name(t, false);
    }

    fn dims_in(&mut self, t: &TypeExpr) {
        match t {
            TypeExpr::Named {
                dims: Some(dims), ..
            } => {
                for d in dims {
                    match &d.kind {
                        ExprKind::Name(n) if !self.known(n) => {
                            let id = Ident {
                                name: n.clone(),
                                span: d.span,
                            };
                            self.bind(&id, false);
                        }
                        _ => self.expr(d),
                    }
                }
            }
            TypeExpr::Named { dims: None, .. } => {}
            _ => t.parts().into_iter().for_each(|p| self.dims_in(p)),
        }
    }

    /// The name of a type must be a static type (`int`, `float`, `bool`, `string`) or,
    /// unless `static_only`, a dtype (`f32[B, 10]`).
    fn type_name(&mut self, t: &TypeExpr, static_only: bool) {
        let TypeExpr::Named { name, dims, span } = t else {
            if static_only && !matches!(t, TypeExpr::List { .. } | TypeExpr::Record { .. }) {
                self.diags.push(
                    Diag::new(
                        Code::TypeMismatch,
                        t.span(),
                        format!("`{}` is not allowed here", self.p.sources.text(t.span())),
                    )
                    .label("not a valid type here")
                    .help("params fields are static: int, float, bool, string, and lists and records of them"),
                );
                return;
            }
            if let TypeExpr::Record { fields, .. } = t {
                let mut seen: FxHashMap<&str, Span> = FxHashMap::default();
                for (k, _) in fields {
                    if let Some(prev) = seen.insert(&k.name, k.span) {
                        self.diags.push(
                            Diag::new(
                                Code::DuplicateDefinition,
                                k.span,
                                format!("field `{}` is declared twice", k.name),
                            )
                            .label("second declaration")
                            .with(prev, "first declaration")
                            .help("rename or remove one of them"),
                        );
                    }
                }
            }
            for p in t.parts() {
                self.type_name(p, static_only);
            }
            return;
        };
        let is_static = STATIC_TYPES.contains(&name.name.as_str());
        let is_dtype =
            crate::ir::DType::from_name(&name.name).is_some_and(|d| d != crate::ir::DType::Bytes);
        if (is_static && dims.is_none()) || (is_dtype && !static_only) {
            return;
        }
        if is_dtype || is_static {
            let what = if static_only {
                "params fields are static: int, float, bool, string, and lists and records of them"
            } else {
                "static types take no dimensions"
            };
            self.diags.push(
                Diag::new(
                    Code::TypeMismatch,
                    *span,
                    format!("`{}` is not allowed here", self.p.sources.text(*span)),
                )
                .label("not a valid type here")
                .help(what),
            );
            return;
        }
        let mut names: Vec<&str> = STATIC_TYPES.to_vec();
        if !static_only {
            names.extend(["f32", "f16", "bf16", "i32", "u8", "bool"]);
        }
        let mut d = Diag::new(
            Code::UnknownName,
            name.span,
            format!("unknown type `{}`", name.name),
        )
        .label("not a type");
        d = match did_you_mean(&name.name, names.iter().copied()) {
            Some(h) => d.help(h),
            None => d.help(format!("types are {}", names.join(", "))),
        };
        self.diags.push(d);
    }

    fn block(&mut self, b: &Block) {
        self.scopes.push(Vec::new());
        for s in &b.stmts {
            self.stmt(s);
        }
        if let Some(t) = &b.tail {
            self.expr(t);
        }
        self.pop_scope();
    }

    fn stmt(&mut self, s: &Stmt) {
        match &s.kind {
            StmtKind::Let { name, ty, value } => {
                if let Some(t) = ty {
                    self.type_dims(t);
                }
                self.expr(value);
                self.shadow_check(name, "local");
                self.bind(name, self.user);
            }
            StmtKind::Assign { name, value } => {
                self.expr(value);
                if !self.assign(name) {
                    let d = Diag::new(
                        Code::AssignUndefined,
                        name.span,
                        format!("`{}` is not defined", name.name),
                    )
                    .label("assigned here")
                    .help(format!("introduce it first with `let {} = ...`", name.name));
                    self.diags.push(d);
                }
            }
            StmtKind::For { var, iter, body } => {
                self.expr(iter);
                self.scopes.push(Vec::new());
                self.shadow_check(var, "loop variable");
                self.bind(var, false);
                self.block(body);
                self.pop_scope();
            }
            StmtKind::If(i) => self.if_stmt(i),
            StmtKind::Section { kind, body, .. } => self.section(*kind, body),
            StmtKind::Minimize { loss, optimizer } => {
                self.expr(loss);
                self.expr(optimizer);
            }
            StmtKind::Metric { value, .. } => self.expr(value),
            StmtKind::Expr(e) => self.expr(e),
            StmtKind::Error => {}
        }
    }

    /// In a predict section, `name = value` names a prediction rather than assigning,
    /// and in an eval section `loss = value` sets the loss evaluated (as elaboration
    /// reads them): neither refers to a local of that name.
    fn section(&mut self, kind: SectionKind, body: &Block) {
        self.scopes.push(Vec::new());
        for s in &body.stmts {
            match (&s.kind, kind) {
                (StmtKind::Assign { value, .. }, SectionKind::Predict) => self.expr(value),
                (StmtKind::Assign { name, value }, SectionKind::Eval) if name.name == "loss" => {
                    self.expr(value)
                }
                _ => self.stmt(s),
            }
        }
        if let Some(t) = &body.tail {
            self.expr(t);
        }
        self.pop_scope();
    }

    fn if_stmt(&mut self, i: &IfStmt) {
        self.expr(&i.cond);
        self.block(&i.then);
        match &i.otherwise {
            Some(Else::Block(b)) => self.block(b),
            Some(Else::If(inner, _)) => self.if_stmt(inner),
            None => {}
        }
    }

    fn expr(&mut self, e: &Expr) {
        match &e.kind {
            ExprKind::Name(n) => self.use_name(n, e.span),
            ExprKind::List(xs) | ExprKind::Tuple(xs) => xs.iter().for_each(|x| self.expr(x)),
            ExprKind::Record(fs) => fs.iter().for_each(|(_, x)| self.expr(x)),
            ExprKind::Field(base, f) => {
                self.expr(base);
                self.field(base, f);
            }
            ExprKind::Index(base, ix) => {
                self.expr(base);
                ix.iter().for_each(|x| self.expr(x));
            }
            ExprKind::Call { callee, args, .. } => {
                self.expr(callee);
                args.iter().for_each(|a| self.expr(&a.value));
                // a named argument refers to its parameter
                if let Some(params) = self.callee_params(callee) {
                    for n in args.iter().filter_map(|a| a.name.as_ref()) {
                        if let Some(p) = params.iter().find(|p| p.name.name == n.name) {
                            self.refs.push((n.span, Target::Local(p.name.span)));
                        }
                    }
                }
            }
            ExprKind::Unary(_, x) => self.expr(x),
            ExprKind::Binary(_, a, b) | ExprKind::Range(a, b) => {
                self.expr(a);
                self.expr(b);
            }
            ExprKind::Closure { params, body } => {
                self.scopes.push(Vec::new());
                for p in params.iter().flat_map(Pat::names) {
                    self.shadow_check(p, "closure parameter");
                    self.bind(p, false);
                }
                self.expr(body);
                self.pop_scope();
            }
            ExprKind::If(i) => self.if_stmt(i),
            ExprKind::Str(s) => {
                for path in interpolations(s) {
                    match path.as_slice() {
                        [(_, "params"), (_, f), ..] if !self.local("params") => {
                            if let Some(&at) = self.params_spans.get(*f) {
                                self.refs.push((e.span, Target::ParamsField(at)));
                            }
                            self.use_name("params", e.span);
                        }
                        [(_, n), ..] if !n.is_empty() => self.use_name(n, e.span),
                        _ => {}
                    }
                }
            }
            ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Bool(_) | ExprKind::Error => {}
        }
    }

    /// `params.x` must name a declared field; `module.item` an existing item.
    fn field(&mut self, base: &Expr, f: &Ident) {
        let ExprKind::Name(n) = &base.kind else {
            return;
        };
        if self.local(n) {
            return;
        }
        if n == "params" && self.p.lookup(self.m, "params").is_none() {
            if let Some(&at) = self.params_spans.get(&f.name) {
                self.refs.push((f.span, Target::ParamsField(at)));
            }
            if !self.params_fields.contains(&f.name) {
                let mut d = Diag::new(
                    Code::UnknownField,
                    f.span,
                    format!("`params` has no field `{}`", f.name),
                )
                .label("not declared");
                d = match did_you_mean(&f.name, self.params_fields.iter().map(String::as_str)) {
                    Some(h) => d.help(h),
                    None => d.help(format!(
                        "declare it in the `params` block: `{}: type = default`",
                        f.name
                    )),
                };
                self.diags.push(d);
            }
            return;
        }
        if let Some(Def::Module(m)) = self.p.lookup(self.m, n) {
            if let Some(d) = self.p.member(m, &f.name) {
                self.refs.push((f.span, Target::Def(d)));
            }
            if self.p.member(m, &f.name).is_none() {
                let module = self.p.module(m);
                let mut d = Diag::new(
                    Code::UnknownItem,
                    f.span,
                    format!("`{}` has no item `{}`", module.path, f.name),
                )
                .label("not found");
                if let Some(h) = did_you_mean(&f.name, module.items.keys().map(String::as_str)) {
                    d = d.help(h);
                }
                self.diags.push(d);
            }
        }
    }

    fn known(&self, n: &str) -> bool {
        self.local(n) || self.p.lookup(self.m, n).is_some() || BUILTIN_VALUES.contains(&n)
    }

    fn local(&self, n: &str) -> bool {
        self.scopes
            .iter()
            .rev()
            .any(|s| s.iter().any(|b| b.name == n))
    }

    fn use_name(&mut self, n: &str, span: Span) {
        for scope in self.scopes.iter_mut().rev() {
            if let Some(b) = scope.iter_mut().rev().find(|b| b.name == n) {
                b.used = true;
                self.refs.push((span, Target::Local(b.span)));
                return;
            }
        }
        if let Some(d) = self.p.lookup(self.m, n) {
            self.refs.push((span, Target::Def(d)));
            if self.p.module(self.m).imports.contains_key(n) {
                self.used_imports.insert(n.to_string());
            }
            return;
        }
        if BUILTIN_VALUES.contains(&n) || self.p.module(self.m).import_names.contains(n) {
            // (A name of a failed import: the import was reported.)
            return;
        }
        let mut d =
            Diag::new(Code::UnknownName, span, format!("unknown name `{n}`")).label("not defined");
        let candidates = self.candidates();
        d = match did_you_mean(n, candidates.iter().map(String::as_str)) {
            Some(h) => d.help(h),
            None => d.help("define it with `let`, or import it with `use`"),
        };
        self.diags.push(d);
    }

    fn candidates(&self) -> Vec<String> {
        let mut c: Vec<String> = self
            .scopes
            .iter()
            .flatten()
            .map(|b| b.name.clone())
            .collect();
        let module = self.p.module(self.m);
        c.extend(module.items.keys().cloned());
        c.extend(module.imports.keys().cloned());
        for pm in crate::program::PRELUDE {
            if let Some(m) = self.p.modules.iter().find(|m| m.path == *pm) {
                c.extend(m.items.keys().cloned());
            }
        }
        c.extend(BUILTIN_VALUES.iter().map(|s| s.to_string()));
        c
    }

    /// Marks an assignment target, a use of its binding. False if no local has that
    /// name.
    fn assign(&mut self, name: &Ident) -> bool {
        let bound = (self.scopes.iter().rev())
            .find_map(|s| s.iter().rev().find(|b| b.name == name.name))
            .map(|b| b.span);
        if let Some(at) = bound {
            self.refs.push((name.span, Target::Local(at)));
        }
        bound.is_some()
    }

    fn bind(&mut self, name: &Ident, warn_unused: bool) {
        let warn = warn_unused && !name.name.starts_with('_');
        if let Some(scope) = self.scopes.last_mut() {
            scope.push(Binding {
                name: name.name.clone(),
                span: name.span,
                used: false,
                warn_unused: warn,
            });
        }
    }

    /// W0702 when a binding (`kind`: a local, a parameter, a loop or closure variable)
    /// of a user file takes the name of an item in scope (the standard library's
    /// functions included), which it hides from there on.
    fn shadow_check(&mut self, name: &Ident, kind: &str) {
        if !self.user || self.local(&name.name) {
            return;
        }
        let what = match self.p.lookup(self.m, &name.name) {
            Some(Def::Item(m, i)) => match self.p.item(m, i).kind {
                ItemKind::Fn(_) => "the function",
                ItemKind::Input(_) => "the input",
                ItemKind::Model(_) => "the model",
                _ => return,
            },
            Some(Def::Module(_)) => "the module",
            None if BUILTIN_VALUES.contains(&name.name.as_str()) => "the built-in",
            None => return,
        };
        self.diags.push(
            Diag::new(
                Code::ShadowedItem,
                name.span,
                format!("{kind} `{}` shadows {what} `{}`", name.name, name.name),
            )
            .label(format!("this {kind}"))
            .help(format!(
                "rename the {kind}; where it is in scope, `{}` no longer means {what}",
                name.name
            )),
        );
    }

    fn pop_scope(&mut self) {
        let Some(scope) = self.scopes.pop() else {
            return;
        };
        for b in &scope {
            if b.warn_unused && !b.used {
                self.diags.push(
                    Diag::new(
                        Code::UnusedValue,
                        b.span,
                        format!("`{}` is never used", b.name),
                    )
                    .label("defined here")
                    .help(format!("remove it, or name it `_{}` to keep it", b.name)),
                );
            }
        }
    }

    fn unused_imports(&mut self) {
        let module = self.p.module(self.m);
        let mut unused: Vec<(&String, Span)> = module
            .imports
            .iter()
            .filter(|(n, (_, _, public))| !public && !self.used_imports.contains(*n))
            .map(|(n, (_, s, _))| (n, *s))
            .collect();
        unused.sort_by_key(|(_, s)| *s);
        for (n, s) in unused {
            self.diags.push(
                Diag::new(Code::UnusedValue, s, format!("import `{n}` is never used"))
                    .label("imported here")
                    .help("remove it from the `use`"),
            );
        }
    }
}

/// The interpolations of a string's text (`\{` is none): each `{a.b}`'s dotted
/// segments, trimmed, with the byte offset of each in `s`.
pub fn interpolations(s: &str) -> Vec<Vec<(usize, &str)>> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(k) = s[i..].find(['{', '\\']) {
        let at = i + k;
        if s[at..].starts_with('\\') {
            // the escaped character goes with it
            i = at + 1 + s[at + 1..].chars().next().map_or(0, char::len_utf8);
            continue;
        }
        let Some(len) = s[at..].find('}') else { break };
        let mut segments = Vec::new();
        let mut lo = at + 1;
        for seg in s[at + 1..at + len].split('.') {
            let lead = seg.len() - seg.trim_start().len();
            segments.push((lo + lead, seg.trim()));
            lo += seg.len() + 1;
        }
        out.push(segments);
        i = at + len + 1;
    }
    out
}
