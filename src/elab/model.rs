//! Elaboration of a model for one mode: its signature bound to the input's element
//! shapes, its body, and the section of the mode, which say what the graph outputs.

use super::data::Elem;
use super::value::{MetricVal, OptimizerVal, Value};
use super::Elab;
use crate::diag::{Code, Diag};
use crate::ir::{
    BinaryOp, Metric, NodeIndex, Op, Optimizer, Output, ReduceOp, Role, TensorType, UnaryOp,
};
use crate::program::ModId;
use crate::span::Span;
use crate::syntax::ast::*;
use rustc_hash::FxHashMap;
use std::rc::Rc;

/// What the sections of a model produced in one mode.
#[derive(Default)]
struct Sections<'p> {
    /// Each `minimize`: the loss, the optimiser and their spans.
    minimize: Vec<(Value<'p>, Span, Value<'p>, Span)>,
    metrics: Vec<(String, Value<'p>, Span)>,
    predictions: Vec<(String, Value<'p>, Span)>,
    has_predict: bool,
    /// `loss = EXPR` in the eval section: the loss evaluation reports, in place of the
    /// minimised one.
    eval_loss: Option<(Value<'p>, Span)>,
}

impl<'p> Elab<'p> {
    /// Elaborates model item `i` of module `m` with features (and labels, unless in
    /// predict mode) of the given element types. `input_span` is where the input was
    /// named, for diagnostics about the binding.
    pub(super) fn elaborate_model(
        &mut self,
        m: ModId,
        i: usize,
        features: &Elem,
        labels: Option<&Elem>,
        input_span: Span,
    ) {
        let p = self.p;
        let ItemKind::Model(f) = &p.item(m, i).kind else {
            return;
        };
        let Some(body) = &f.body else { return };
        if f.params.is_empty() || f.params.len() > 2 {
            self.diags.push(
                Diag::new(
                    Code::InvalidModel,
                    f.name.span,
                    format!("model `{}` must take features, and labels unless it learns without them", f.name.name),
                )
                .label(format!("{} parameters", f.params.len()))
                .help("declare `model m(features: f32[B, n], labels: i32[B])`, or `model m(features: f32[B, n])`; several features or labels are a record: `features: { ids: i32[B, T], len: i32[B] }`"),
            );
            return;
        }
        let mut locals: Vec<(String, Value<'p>)> = Vec::new();
        let mut dims: FxHashMap<String, usize> = FxHashMap::default();
        let elems = [Some(features), labels];
        let mut ok = true;
        for (k, param) in f.params.iter().enumerate() {
            let fed = self.graph.feeds.len();
            let value = match elems[k] {
                Some(e) => self.bind_param(m, param, e, &mut dims, input_span),
                None => Some(Value::Absent(param.name.span)),
            };
            if k == 1 {
                let labels = self.graph.feeds[fed..].to_vec();
                self.graph.label_feeds.extend(labels);
            }
            match value {
                Some(v) => {
                    self.record_binding(&param.name, &v);
                    locals.push((param.name.name.clone(), v))
                }
                None => ok = false,
            }
        }
        if !ok {
            return;
        }
        let mut d: Vec<(String, usize)> = dims.into_iter().collect();
        d.sort();
        locals.extend(d.into_iter().map(|(k, v)| (k, Value::Int(v as i64))));
        let model_span = f.name.span;
        let sections = self.in_frame(m, locals, model_span, |el| el.model_body(body));
        self.finish(sections, f, model_span);
    }

    /// Binds one model parameter to the input's element type, unifying named
    /// dimensions. Returns the parameter's value (a tensor, or a record or tuple of
    /// them), or `None` after a diagnostic.
    fn bind_param(
        &mut self,
        m: ModId,
        param: &'p Param,
        e: &Elem,
        dims: &mut FxHashMap<String, usize>,
        input_span: Span,
    ) -> Option<Value<'p>> {
        let Some(ty) = &param.ty else {
            self.diags.push(
                Diag::new(
                    Code::InvalidModel,
                    param.name.span,
                    format!("model parameter `{}` needs a type", param.name.name),
                )
                .label("no type")
                .help(format!("declare it, e.g. `{}: {e}`", param.name.name)),
            );
            return None;
        };
        let at = Binding {
            param: &param.name,
            input: input_span,
            whole: e,
        };
        self.bind_type(m, &param.name.name, ty, e, dims, &at)
    }

    /// Binds the part `path` of a model parameter, declared `ty`, to the element part
    /// `e`. Input nodes are made in the element's order, the order in which the
    /// pipeline's leaves arrive, each named by its path (`features.ids`).
    fn bind_type(
        &mut self,
        m: ModId,
        path: &str,
        ty: &'p TypeExpr,
        e: &Elem,
        dims: &mut FxHashMap<String, usize>,
        at: &Binding<'_>,
    ) -> Option<Value<'p>> {
        let agree = "change the model's signature or the input pipeline so that they agree";
        let mismatch = |el: &mut Self, why: String, help: String| {
            el.diags.push(
                Diag::new(
                    Code::InputModelMismatch,
                    ty.span(),
                    format!(
                        "the input yields {e} for `{path}`, but the model declares {}",
                        el.p.sources.text(ty.span())
                    ),
                )
                .label(why)
                .with(at.input, format!("this input yields {}", at.whole))
                .help(help),
            );
        };
        match (ty, e) {
            (
                TypeExpr::Named {
                    name,
                    dims: Some(tdims),
                    span,
                },
                Elem::Tensor { dtype, dims: edims },
            ) => {
                let declared = crate::ir::DType::from_name(&name.name);
                if declared == Some(crate::ir::DType::I64) {
                    self.int64_type(*span);
                    return None;
                }
                if declared != Some(*dtype) || tdims.len() != edims.len() {
                    let why = if declared != Some(*dtype) {
                        format!("dtype {} vs {dtype}", name.name)
                    } else {
                        format!("rank {} vs {}", tdims.len(), edims.len())
                    };
                    mismatch(self, why, agree.into());
                    return None;
                }
                let mut shape = Vec::with_capacity(edims.len());
                for (dexpr, ed) in tdims.iter().zip(edims) {
                    match self.bind_dim(m, dexpr, *ed, dims, at)? {
                        Ok(size) => shape.push(size),
                        Err(why) => {
                            mismatch(self, why, agree.into());
                            return None;
                        }
                    }
                }
                self.graph.feeds.push(path.to_string());
                let node = self.graph.add(
                    Op::Input {
                        name: path.to_string(),
                    },
                    &[],
                    TensorType::new(*dtype, shape),
                    at.param.span,
                );
                Some(Value::Tensor(node))
            }
            (TypeExpr::Record { fields, .. }, Elem::Record(efs)) => {
                let mut have: Vec<&str> = efs.iter().map(|(k, _)| k.as_str()).collect();
                let mut want: Vec<&str> = fields.iter().map(|(k, _)| k.name.as_str()).collect();
                have.sort_unstable();
                want.sort_unstable();
                if have != want {
                    let missing: Vec<&str> =
                        want.iter().filter(|k| !have.contains(k)).copied().collect();
                    let extra: Vec<&str> =
                        have.iter().filter(|k| !want.contains(k)).copied().collect();
                    let mut why = Vec::new();
                    if !missing.is_empty() {
                        why.push(format!("the input has no {}", ticks(&missing)));
                    }
                    if !extra.is_empty() {
                        why.push(format!("the model does not declare {}", ticks(&extra)));
                    }
                    mismatch(self, why.join("; "), agree.into());
                    return None;
                }
                let mut parts: Vec<Option<Value<'p>>> = vec![None; fields.len()];
                for (k, part) in efs {
                    let i = fields.iter().position(|(f, _)| f.name == *k)?;
                    parts[i] = Some(self.bind_type(
                        m,
                        &format!("{path}.{k}"),
                        &fields[i].1,
                        part,
                        dims,
                        at,
                    )?);
                }
                let out = fields
                    .iter()
                    .zip(parts)
                    .map(|((k, _), v)| Some((k.name.clone(), v?)))
                    .collect::<Option<Vec<_>>>()?;
                Some(Value::Record(Rc::new(out)))
            }
            (TypeExpr::Tuple { elems, .. }, Elem::Tuple(es)) if elems.len() == es.len() => {
                let mut out = Vec::with_capacity(es.len());
                for (i, (t, part)) in elems.iter().zip(es).enumerate() {
                    out.push(self.bind_type(m, &format!("{path}.{i}"), t, part, dims, at)?);
                }
                Some(Value::Tuple(Rc::new(out)))
            }
            _ => {
                let why = format!("{} vs {}", type_kind(ty), elem_kind(e));
                let help = format!(
                    "declare what the input yields, `{path}: {}`, or change the input's `map`",
                    declaration(e)
                );
                mismatch(self, why, help);
                None
            }
        }
    }

    /// The size of one declared dimension against the input's: `Ok(size)`, `Err(why)`
    /// when they differ, `None` after a diagnostic. A name the program does not define
    /// is a named dimension, bound by its first use.
    fn bind_dim(
        &mut self,
        m: ModId,
        dexpr: &'p Expr,
        actual: Option<usize>,
        dims: &mut FxHashMap<String, usize>,
        at: &Binding<'_>,
    ) -> Option<Result<usize, String>> {
        let named = match &dexpr.kind {
            ExprKind::Name(n)
                if self.p.lookup(m, n).is_none()
                    && !crate::resolve::BUILTIN_VALUES.contains(&n.as_str()) =>
            {
                Some(n.clone())
            }
            _ => None,
        };
        let want = match &named {
            Some(n) => dims.get(n).copied(),
            None => {
                let v = self.in_frame(m, Vec::new(), dexpr.span, |el| el.expr(dexpr));
                Some(self.as_dim(&v, dexpr.span)?)
            }
        };
        let size = match (want, actual) {
            (Some(w), Some(a)) if w != a => return Some(Err(format!("dimension {w} vs {a}"))),
            (_, Some(a)) => a,
            (Some(w), None) => w,
            (None, None) => {
                self.diags.push(
                    Diag::new(Code::UnboundDimension, dexpr.span, format!("dimension `{}` cannot be determined", named.clone().unwrap_or_default()))
                        .label("not fixed by the input")
                        .with(at.input, format!("this input yields {}", at.whole))
                        .help("write the size as a number in the model's signature, or give the pipeline a fixed length (e.g. `decode_raw(x, u8, length: 784)`)"),
                );
                return None;
            }
        };
        if let Some(n) = named {
            dims.insert(n, size);
        }
        Some(Ok(size))
    }

    fn model_body(&mut self, body: &'p Block) -> Sections<'p> {
        let mut out = Sections::default();
        let mut seen: FxHashMap<SectionKind, Span> = FxHashMap::default();
        for s in &body.stmts {
            let StmtKind::Section {
                kind,
                kw_span,
                body,
            } = &s.kind
            else {
                self.stmt(s);
                continue;
            };
            if let Some(prev) = seen.insert(*kind, *kw_span) {
                self.diags.push(
                    Diag::new(
                        Code::MisplacedStatement,
                        *kw_span,
                        format!("a second `{}` section", kind.name()),
                    )
                    .label("second section")
                    .with(prev, "first section")
                    .help("merge the two sections"),
                );
                continue;
            }
            if *kind == SectionKind::Predict {
                out.has_predict = true;
            }
            self.section(*kind, body, &mut out);
        }
        if let Some(t) = &body.tail {
            self.diags.push(
                Diag::new(
                    Code::MisplacedStatement,
                    t.span,
                    "a model body has no value",
                )
                .label("this value is not used")
                .help("bind it with `let` and use it in a section"),
            );
        }
        out
    }

    fn section(&mut self, kind: SectionKind, body: &'p Block, out: &mut Sections<'p>) {
        let active =
            kind == self.mode || (kind == SectionKind::Train && self.mode == SectionKind::Eval);
        if !active {
            return;
        }
        // In eval mode the train section contributes its loss only.
        let loss_only = kind == SectionKind::Train && self.mode == SectionKind::Eval;
        self.push_scope();
        for s in &body.stmts {
            match &s.kind {
                StmtKind::Minimize { loss, optimizer } => {
                    if kind != SectionKind::Train {
                        self.stmt(s);
                        continue;
                    }
                    let l = self.expr(loss);
                    let o = if loss_only {
                        Value::None
                    } else {
                        self.expr(optimizer)
                    };
                    out.minimize.push((l, loss.span, o, optimizer.span));
                }
                StmtKind::Metric { name, value } if kind != SectionKind::Predict => {
                    if loss_only {
                        continue;
                    }
                    let v = self.expr(value);
                    out.metrics.push((name.name.clone(), v, value.span));
                }
                StmtKind::Assign { name, value }
                    if kind == SectionKind::Eval && name.name == "loss" =>
                {
                    let v = self.expr(value);
                    out.eval_loss = Some((v, value.span));
                }
                StmtKind::Assign { name, value } if kind == SectionKind::Predict => {
                    let v = self.expr(value);
                    out.predictions
                        .push((name.name.clone(), v, name.span.to(value.span)));
                }
                _ => self.stmt(s),
            }
        }
        if let Some(t) = &body.tail {
            self.diags.push(
                Diag::new(
                    Code::MisplacedStatement,
                    t.span,
                    format!("a `{}` section has no value", kind.name()),
                )
                .label("this value is not used")
                .help("use `minimize`, `metric` or `name = value` statements"),
            );
        }
        self.pop_scope();
    }

    fn finish(&mut self, s: Sections<'p>, f: &'p FnItem, model_span: Span) {
        match self.mode {
            SectionKind::Train => {
                if s.minimize.is_empty() {
                    self.diags.push(
                        Diag::new(
                            Code::InvalidModel,
                            model_span,
                            format!("model `{}` does not say how it trains", f.name.name),
                        )
                        .label("no `minimize` in a train section")
                        .help("add `train { minimize loss with sgd(lr: 0.01) }`"),
                    );
                }
                self.minimize_all(s.minimize);
                if self.target == super::Target::Wafer {
                    for (name, _, span) in &s.metrics {
                        self.diags.push(
                            Diag::new(Code::WaferTrainingExtras, *span, format!("metric `{name}` in a wafer training run"))
                                .label("metrics are not computed while training on the wafer")
                                .help("move the metric to the `eval` section, or train on the host (`--target host`)"),
                        );
                    }
                }
                self.metrics(s.metrics);
                for (name, value) in std::mem::take(&mut self.updates) {
                    self.graph.outputs.push(Output {
                        name,
                        role: Role::Update,
                        node: value,
                    });
                }
            }
            SectionKind::Eval => {
                // the loss evaluated is the eval section's `loss = ...` as written, or
                // else the first `minimize`'s (with the regularizers' penalties)
                let explicit = s.eval_loss.is_some();
                let chosen = match s.eval_loss {
                    Some((v, span)) => Some((v, span)),
                    None => s.minimize.into_iter().next().map(|(l, ls, _, _)| (l, ls)),
                };
                let regs = if explicit {
                    std::mem::take(&mut self.regularizers)
                } else {
                    Vec::new()
                };
                if let Some((loss, ls)) = chosen {
                    let l = self.loss_node(loss, ls);
                    if explicit {
                        self.regularizers = regs;
                    }
                    if let Some(l) = l {
                        self.graph.outputs.push(Output {
                            name: "loss".into(),
                            role: Role::Loss,
                            node: l,
                        });
                    }
                }
                self.metrics(s.metrics);
            }
            SectionKind::Predict => {
                for (name, v, span) in s.predictions {
                    self.prediction(name, v, span);
                }
            }
        }
    }

    /// The batch size: the first dimension of the features, the model's first input.
    fn batch_size(&self) -> Option<usize> {
        let first = self
            .graph
            .g
            .node_indices()
            .find(|&n| matches!(self.graph.node(n).op, Op::Input { .. }))?;
        self.graph.ty(first).shape.first().copied()
    }

    /// The penalties of the regularised variables (`kernel_regularizer: l2(...)`)
    /// added to `loss`, as Keras adds its layers' losses; their sum is the summary
    /// `regularization_loss` of a train graph.
    fn regularized(&mut self, loss: NodeIndex, span: Span) -> NodeIndex {
        let regs = std::mem::take(&mut self.regularizers);
        if regs.is_empty() {
            return loss;
        }
        let dt = self.graph.ty(loss).dtype;
        let site = self.site(span);
        let mut total: Option<NodeIndex> = None;
        for (w, l1, l2) in regs {
            let wt = self.graph.ty(w).clone();
            let axes: Vec<usize> = (0..wt.rank()).collect();
            for (factor, op) in [(l1, UnaryOp::Abs), (l2, UnaryOp::Square)] {
                if factor == 0.0 {
                    continue;
                }
                let u = self.graph.add(Op::Unary(op), &[w], wt.clone(), site);
                let s = self.graph.add(
                    Op::Reduce {
                        op: ReduceOp::Sum,
                        axes: axes.clone(),
                        keep_dims: false,
                    },
                    &[u],
                    TensorType::scalar(wt.dtype),
                    site,
                );
                let s = if wt.dtype == dt {
                    s
                } else {
                    self.graph.add(Op::Cast, &[s], TensorType::scalar(dt), site)
                };
                let f = self.constant(factor, dt, span);
                let p = self.graph.add(
                    Op::Binary(BinaryOp::Mul),
                    &[s, f],
                    TensorType::scalar(dt),
                    site,
                );
                total = Some(match total {
                    Some(t) => self.graph.add(
                        Op::Binary(BinaryOp::Add),
                        &[t, p],
                        TensorType::scalar(dt),
                        site,
                    ),
                    None => p,
                });
            }
        }
        let Some(reg) = total else { return loss };
        let named = self
            .graph
            .outputs
            .iter()
            .any(|o| o.name == "regularization_loss");
        if self.mode == SectionKind::Train && !named {
            self.graph.outputs.push(Output {
                name: "regularization_loss".into(),
                role: Role::Summary,
                node: reg,
            });
        }
        self.graph.add(
            Op::Binary(BinaryOp::Add),
            &[loss, reg],
            TensorType::scalar(dt),
            site,
        )
    }

    fn loss_node(&mut self, loss: Value<'p>, span: Span) -> Option<NodeIndex> {
        match loss {
            Value::Tensor(n) => {
                let ty = self.graph.ty(n).clone();
                if ty.rank() == 0 && ty.dtype.is_float() {
                    return Some(self.regularized(n, span));
                }
                self.diags.push(
                    Diag::new(Code::InvalidModel, span, format!("the loss must be a scalar float, this is {ty}"))
                        .label(format!("this is {ty}"))
                        .help("reduce it to a scalar, e.g. with a loss function from `std.losses` or `reduce_mean`"),
                );
                None
            }
            Value::Error => None,
            other => {
                self.expected("a scalar float tensor as the loss", &other, span);
                None
            }
        }
    }

    /// The train graph's losses and optimisers, one per `minimize`: the first's loss
    /// and learning rate are the outputs `loss` and `learning_rate`, the k-th's (when
    /// it minimises another loss) `loss/k` and `learning_rate/k`. Each optimiser
    /// updates the variables its `only(...)` names, or, for one without, those no other
    /// names; no variable may be in two groups.
    fn minimize_all(&mut self, clauses: Vec<(Value<'p>, Span, Value<'p>, Span)>) {
        // (the loss as written, and its output's name)
        let mut losses: Vec<(NodeIndex, String)> = Vec::new();
        let mut claimed: FxHashMap<String, Span> = FxHashMap::default();
        let mut open: Option<Span> = None;
        let regs = self.regularizers.clone();
        for (k, (loss, ls, opt, os)) in clauses.into_iter().enumerate() {
            let suffix = if k == 0 {
                String::new()
            } else {
                format!("/{k}")
            };
            let written = match &loss {
                Value::Tensor(n) => Some(*n),
                _ => None,
            };
            let seen = losses
                .iter()
                .find(|x| Some(x.0) == written)
                .map(|x| x.1.clone());
            let loss_name = match seen {
                Some(name) => name,
                None => {
                    // each loss gets the penalties (a variable's counts for its group)
                    self.regularizers = regs.clone();
                    let Some(l) = self.loss_node(loss, ls) else {
                        continue;
                    };
                    let name = format!("loss{suffix}");
                    self.graph.outputs.push(Output {
                        name: name.clone(),
                        role: Role::Loss,
                        node: l,
                    });
                    losses.push((written.unwrap_or(l), name.clone()));
                    name
                }
            };
            let loss_node = self
                .graph
                .outputs
                .iter()
                .find(|o| o.name == loss_name)
                .map(|o| o.node);
            let Some(o) = self.optimizer(opt, os, &suffix, loss_name) else {
                continue;
            };
            if let (Some(_), Some(l)) = (o.loss_scale, loss_node) {
                let dt = self.graph.ty(l).dtype;
                if dt != crate::ir::DType::F32 {
                    self.diags.push(
                        Diag::new(
                            Code::DtypeMismatch,
                            ls,
                            format!("loss scaling needs an f32 loss, and this loss is {dt}"),
                        )
                        .label(format!("{dt}"))
                        .with(os, "scales it")
                        .help("compute the loss in f32: `cast(logits, f32)` before the loss function (a scaled f16 loss overflows past 65504)"),
                    );
                }
            }
            match &o.variables {
                Some(vars) => {
                    for v in vars {
                        if let Some(prev) = claimed.insert(v.clone(), os) {
                            self.diags.push(
                                Diag::new(Code::InvalidModel, os, format!("variable `{v}` is trained by two optimisers"))
                                    .label("second")
                                    .with(prev, "first")
                                    .help("give each variable one optimiser: make the `only(...)` lists disjoint"),
                            );
                        }
                    }
                }
                None => {
                    if let Some(prev) = open.replace(os) {
                        self.diags.push(
                            Diag::new(Code::InvalidModel, os, "two optimisers train every variable")
                                .label("second")
                                .with(prev, "first")
                                .help("say which variables each trains: `minimize loss with ftrl(lr: 0.1) |> only(trainable_variables(\"linear\"))`; one may be left to train the rest"),
                        );
                    }
                }
            }
            self.graph.optimizers.push(o);
        }
        self.regularizers.clear();
    }

    fn optimizer(
        &mut self,
        opt: Value<'p>,
        span: Span,
        suffix: &str,
        loss: String,
    ) -> Option<Optimizer> {
        let o: Rc<OptimizerVal<'p>> = match opt {
            Value::Optimizer(o) => o,
            Value::Error => return None,
            other => {
                self.diags.push(
                    Diag::new(
                        Code::InvalidModel,
                        span,
                        format!("expected an optimizer, found {}", other.kind()),
                    )
                    .label(other.kind())
                    .help("use one of std.optim's: sgd, momentum, adam, adamw, rmsprop, adagrad, ftrl, tf_rmsprop, tf_adam"),
                );
                return None;
            }
        };
        let lr = match &o.lr {
            Value::Tensor(n) => *n,
            v => {
                let x = match v {
                    Value::Int(i) => *i as f64,
                    Value::Float(f) => *f,
                    _ => return None,
                };
                self.constant(x, crate::ir::DType::F32, span)
            }
        };
        let learning_rate = format!("learning_rate{suffix}");
        self.graph.outputs.push(Output {
            name: learning_rate.clone(),
            role: Role::LearningRate,
            node: lr,
        });
        Some(Optimizer {
            kind: o.kind.to_string(),
            hyper: o.hyper.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            clip_global_norm: o.clip_global_norm,
            decay_exclude: o.decay_exclude.clone(),
            loss,
            learning_rate,
            variables: o.variables.as_ref().map(|v| v.0.clone()),
            moving_average: o.moving_average,
            loss_scale: o.loss_scale,
            span: o.span,
        })
    }

    fn metrics(&mut self, metrics: Vec<(String, Value<'p>, Span)>) {
        for (name, v, span) in metrics {
            let m: Rc<MetricVal> = match v {
                Value::Metric(m) => m,
                Value::Error => continue,
                Value::Absent(_) => continue,
                other => {
                    self.diags.push(
                        Diag::new(
                            Code::InvalidModel,
                            span,
                            format!("metric `{name}` is {}, not a metric", other.kind()),
                        )
                        .label(other.kind())
                        .help(
                            "make metrics with std.metrics: accuracy, mean, precision, recall, auc, reducer",
                        ),
                    );
                    continue;
                }
            };
            let mut args = Vec::new();
            for (arg, node) in &m.args {
                args.push(self.graph.outputs.len());
                self.graph.outputs.push(Output {
                    name: format!("{name}.{arg}"),
                    role: Role::MetricInput,
                    node: *node,
                });
            }
            self.graph.metrics.push(Metric {
                name,
                reducer: m.reducer.to_string(),
                args,
                span,
            });
        }
    }

    fn prediction(&mut self, name: String, v: Value<'p>, span: Span) {
        match v {
            Value::Tensor(n) => {
                let ty = self.graph.ty(n).clone();
                let batch = self.batch_size();
                if let Some(b) = batch {
                    if ty.shape.first() != Some(&b) {
                        self.diags.push(
                            Diag::new(Code::InvalidModel, span, format!("prediction `{name}` is {ty}: its first dimension is not the batch ({b})"))
                                .label(format!("this is {ty}"))
                                .help("predictions have one row per example; keep the batch dimension (reduce over the other axes only)"),
                        );
                        return;
                    }
                }
                self.graph.outputs.push(Output {
                    name,
                    role: Role::Prediction,
                    node: n,
                })
            }
            Value::Absent(labels) => self.diags.push(
                Diag::new(
                    Code::LabelsInPredict,
                    span,
                    format!("prediction `{name}` depends on the labels"),
                )
                .label("needs labels")
                .with(labels, "labels are absent in predict mode")
                .help("compute predictions from the features only"),
            ),
            Value::Error => {}
            other => {
                self.diags.push(
                    Diag::new(
                        Code::InvalidModel,
                        span,
                        format!("prediction `{name}` is {}, not a tensor", other.kind()),
                    )
                    .label(other.kind())
                    .help("predictions are tensors computed from the features"),
                );
            }
        }
    }
}

/// Where a model parameter is bound, for diagnostics about its parts.
struct Binding<'a> {
    param: &'a Ident,
    input: Span,
    whole: &'a Elem,
}

fn ticks(names: &[&str]) -> String {
    let v: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    v.join(", ")
}

fn type_kind(t: &TypeExpr) -> &'static str {
    match t {
        TypeExpr::Named { dims: Some(_), .. } => "a tensor",
        TypeExpr::Named { dims: None, .. } => "a type without dimensions",
        TypeExpr::List { .. } => "a list",
        TypeExpr::Record { .. } => "a record",
        TypeExpr::Tuple { .. } => "a tuple",
    }
}

fn elem_kind(e: &Elem) -> String {
    match e {
        Elem::Tensor { .. } => "a tensor".into(),
        Elem::Record(_) => "a record".into(),
        Elem::Tuple(xs) => format!("a tuple of {}", xs.len()),
    }
}

/// A model parameter's declaration for an element part, the batch dimension `B`.
fn declaration(e: &Elem) -> String {
    match e {
        Elem::Tensor { dtype, dims } => {
            let d: Vec<String> = (dims.iter().enumerate())
                .map(|(i, d)| match (i, d) {
                    (0, _) => "B".to_string(),
                    (_, Some(v)) => v.to_string(),
                    (_, None) => "?".to_string(),
                })
                .collect();
            format!("{dtype}[{}]", d.join(", "))
        }
        Elem::Tuple(xs) => {
            let v: Vec<String> = xs.iter().map(declaration).collect();
            format!("({})", v.join(", "))
        }
        Elem::Record(fs) => {
            let v: Vec<String> = (fs.iter())
                .map(|(k, x)| format!("{k}: {}", declaration(x)))
                .collect();
            format!("{{ {} }}", v.join(", "))
        }
    }
}
