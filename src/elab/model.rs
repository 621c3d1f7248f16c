//! Elaboration of a model for one mode: its signature bound to the input's element
//! shapes, its body, and the section of the mode, which say what the graph outputs.

use super::data::Elem;
use super::value::{MetricVal, OptimizerVal, Value};
use super::Elab;
use crate::diag::{Code, Diag};
use crate::ir::{Metric, NodeIndex, Op, Optimizer, Output, Role, TensorType};
use crate::program::ModId;
use crate::span::Span;
use crate::syntax::ast::*;
use rustc_hash::FxHashMap;
use std::rc::Rc;

/// What the sections of a model produced in one mode.
#[derive(Default)]
struct Sections<'p> {
    minimize: Option<(Value<'p>, Span, Value<'p>, Span)>,
    metrics: Vec<(String, Value<'p>, Span)>,
    predictions: Vec<(String, Value<'p>, Span)>,
    has_predict: bool,
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
                    format!("model `{}` must take (features, labels)", f.name.name),
                )
                .label(format!("{} parameters", f.params.len()))
                .help("declare `model m(features: f32[B, n], labels: i32[B])`"),
            );
            return;
        }
        let mut locals: Vec<(String, Value<'p>)> = Vec::new();
        let mut dims: FxHashMap<String, usize> = FxHashMap::default();
        let elems = [Some(features), labels];
        let mut ok = true;
        for (k, param) in f.params.iter().enumerate() {
            let value = match elems[k] {
                Some(e) => self.bind_param(m, param, e, &mut dims, input_span),
                None => Some(Value::Absent(param.name.span)),
            };
            match value {
                Some(v) => locals.push((param.name.name.clone(), v)),
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
    /// dimensions. Returns the input tensor, or `None` after a diagnostic.
    fn bind_param(
        &mut self,
        m: ModId,
        param: &'p Param,
        e: &Elem,
        dims: &mut FxHashMap<String, usize>,
        input_span: Span,
    ) -> Option<Value<'p>> {
        let Elem::Tensor { dtype, dims: edims } = e else {
            self.diags.push(
                Diag::new(
                    Code::InputNotDataset,
                    input_span,
                    format!(
                        "`{}` must be a tensor, but the input yields {e}",
                        param.name.name
                    ),
                )
                .label("the input")
                .with(param.name.span, "the model parameter")
                .help(
                    "make the input's elements `(features, labels)` pairs of tensors with a `map`",
                ),
            );
            return None;
        };
        let Some(TypeExpr::Named {
            name,
            dims: Some(tdims),
            span,
        }) = &param.ty
        else {
            self.diags.push(
                Diag::new(
                    Code::InvalidModel,
                    param.name.span,
                    format!("model parameter `{}` needs a tensor type", param.name.name),
                )
                .label("no type")
                .help(format!("declare it, e.g. `{}: {e}`", param.name.name)),
            );
            return None;
        };
        let declared = crate::ir::DType::from_name(&name.name);
        if declared == Some(crate::ir::DType::I64) {
            self.int64_type(*span);
            return None;
        }
        let mismatch = |el: &mut Self, why: String| {
            el.diags.push(
                Diag::new(
                    Code::InputModelMismatch,
                    *span,
                    format!(
                        "the input yields {e} for `{}`, but the model declares {}",
                        param.name.name,
                        el.p.sources.text(*span)
                    ),
                )
                .label(why)
                .with(input_span, format!("this input yields {e}"))
                .help("change the model's signature or the input pipeline so that they agree"),
            );
        };
        if declared != Some(*dtype) || tdims.len() != edims.len() {
            let why = if declared != Some(*dtype) {
                format!("dtype {} vs {dtype}", name.name)
            } else {
                format!("rank {} vs {}", tdims.len(), edims.len())
            };
            mismatch(self, why);
            return None;
        }
        let mut shape = Vec::with_capacity(edims.len());
        for (dexpr, ed) in tdims.iter().zip(edims) {
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
            let size = match (want, ed) {
                (Some(w), Some(a)) if w != *a => {
                    mismatch(self, format!("dimension {w} vs {a}"));
                    return None;
                }
                (_, Some(a)) => *a,
                (Some(w), None) => w,
                (None, None) => {
                    self.diags.push(
                        Diag::new(Code::UnboundDimension, dexpr.span, format!("dimension `{}` cannot be determined", named.clone().unwrap_or_default()))
                            .label("not fixed by the input")
                            .with(input_span, format!("this input yields {e}"))
                            .help("write the size as a number in the model's signature, or give the pipeline a fixed length (e.g. `decode_raw(x, u8, length: 784)`)"),
                    );
                    return None;
                }
            };
            if let Some(n) = named {
                dims.insert(n, size);
            }
            shape.push(size);
        }
        let site = param.name.span;
        let node = self.graph.add(
            Op::Input {
                name: param.name.name.clone(),
            },
            &[],
            TensorType::new(*dtype, shape),
            site,
        );
        Some(Value::Tensor(node))
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
                    if let Some((_, prev, _, _)) = &out.minimize {
                        self.diags.push(
                            Diag::new(Code::InvalidModel, s.span, "a second `minimize`")
                                .label("second")
                                .with(*prev, "first")
                                .help("a model minimizes one loss; add losses together to train on several"),
                        );
                        continue;
                    }
                    out.minimize = Some((l, loss.span, o, optimizer.span));
                }
                StmtKind::Metric { name, value } if kind != SectionKind::Predict => {
                    if loss_only {
                        continue;
                    }
                    let v = self.expr(value);
                    out.metrics.push((name.name.clone(), v, value.span));
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
                match s.minimize {
                    Some((loss, ls, opt, os)) => {
                        if let Some(l) = self.loss_node(loss, ls) {
                            self.graph.outputs.push(Output {
                                name: "loss".into(),
                                role: Role::Loss,
                                node: l,
                            });
                        }
                        self.optimizer(opt, os);
                    }
                    None => self.diags.push(
                        Diag::new(
                            Code::InvalidModel,
                            model_span,
                            format!("model `{}` does not say how it trains", f.name.name),
                        )
                        .label("no `minimize` in a train section")
                        .help("add `train { minimize loss with sgd(lr: 0.01) }`"),
                    ),
                }
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
                if let Some((loss, ls, _, _)) = s.minimize {
                    if let Some(l) = self.loss_node(loss, ls) {
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

    fn loss_node(&mut self, loss: Value<'p>, span: Span) -> Option<NodeIndex> {
        match loss {
            Value::Tensor(n) => {
                let ty = self.graph.ty(n).clone();
                if ty.rank() == 0 && ty.dtype.is_float() {
                    return Some(n);
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

    fn optimizer(&mut self, opt: Value<'p>, span: Span) {
        let o: Rc<OptimizerVal<'p>> = match opt {
            Value::Optimizer(o) => o,
            Value::Error => return,
            other => {
                self.diags.push(
                    Diag::new(
                        Code::InvalidModel,
                        span,
                        format!("expected an optimizer, found {}", other.kind()),
                    )
                    .label(other.kind())
                    .help("use one of std.optim's: sgd, momentum, adam, adamw, rmsprop"),
                );
                return;
            }
        };
        let lr = match &o.lr {
            Value::Tensor(n) => *n,
            v => {
                let x = match v {
                    Value::Int(i) => *i as f64,
                    Value::Float(f) => *f,
                    _ => return,
                };
                self.constant(x, crate::ir::DType::F32, span)
            }
        };
        self.graph.outputs.push(Output {
            name: "learning_rate".into(),
            role: Role::LearningRate,
            node: lr,
        });
        self.graph.optimizer = Some(Optimizer {
            kind: o.kind.to_string(),
            hyper: o.hyper.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            clip_global_norm: o.clip_global_norm,
            span: o.span,
        });
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
