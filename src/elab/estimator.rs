//! Elaboration of estimators: params (with overrides), the `config` block and its rules,
//! the inputs of each mode with the wafer Estimator's input rules, and the model graph
//! of each mode. This is the entry point of elaboration.

use super::data::{Dataset, Elem, StageKind};
use super::value::{HookVal, Target, Value};
use super::Elab;
use crate::diag::{did_you_mean, Code, Diag, Diags};
use crate::ir::Graph;
use crate::program::{ModId, Program};
use crate::span::Span;
use crate::syntax::ast::*;
use std::rc::Rc;

/// A `--param key=value` (or a params-file entry), parsed.
#[derive(Debug, Clone)]
pub struct ParamOverride {
    pub key: String,
    pub value: Expr,
}

#[derive(Debug, Clone)]
pub struct ElabOptions {
    pub target: Target,
    pub modes: Vec<SectionKind>,
    /// Only this estimator, or all of them.
    pub estimator: Option<String>,
    /// Overrides of `config` keys (`--config key=value`), applied after the block.
    pub config: Vec<(String, i64)>,
    /// The step budget of each elaboration (see `MAX_STEPS`).
    pub max_steps: u64,
    /// Record what every expression of a user file evaluates to (`hovers`).
    pub hover: bool,
    /// The ranks of a data-parallel run (`mpirun -n N`), each running `num_shards`
    /// shards: `params.batch_size` is divided by both.
    pub ranks: u64,
}

/// The run configuration of an estimator, with defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub iterations_per_loop: i64,
    pub num_shards: i64,
    pub save_checkpoint_steps: i64,
    pub save_summary_steps: i64,
    pub keep_checkpoint_max: i64,
    pub random_seed: Option<i64>,
    pub input_workers: i64,
    pub log_step_count_steps: i64,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            iterations_per_loop: 100,
            num_shards: 1,
            save_checkpoint_steps: 1000,
            save_summary_steps: 100,
            keep_checkpoint_max: 5,
            random_seed: None,
            input_workers: 1,
            log_step_count_steps: 100,
        }
    }
}

/// The keys of the `config` block of an estimator.
pub const CONFIG_KEYS: &[&str] = &[
    "iterations_per_loop",
    "num_shards",
    "save_checkpoint_steps",
    "save_summary_steps",
    "keep_checkpoint_max",
    "random_seed",
    "input_workers",
    "log_step_count_steps",
];

const UNSUPPORTED_KEYS: &[(&str, &str)] = &[
    (
        "save_checkpoint_secs",
        "use `save_checkpoint_steps`: checkpoints are taken at step boundaries",
    ),
    (
        "save_checkpoints_secs",
        "use `save_checkpoint_steps`: checkpoints are taken at step boundaries",
    ),
    (
        "keep_checkpoint_every_n_hours",
        "use `keep_checkpoint_max`: est keeps the newest checkpoints by count",
    ),
    (
        "train_distribute",
        "use `num_shards` to replicate the step over shards",
    ),
    (
        "device_fn",
        "placement is the compiler's job; choose a target with `--target`",
    ),
    ("protocol", "est chooses its own transport"),
    (
        "eval_distribute",
        "use `num_shards` to replicate the step over shards",
    ),
    (
        "experimental_distribute",
        "use `num_shards` to replicate the step over shards",
    ),
    (
        "experimental_max_worker_delay_secs",
        "shards run synchronously; there is no worker delay",
    ),
];

/// TensorFlow's names (its `Estimator`, `RunConfig`, `TrainSpec` and `EvalSpec`
/// arguments) for what est names otherwise: TF's, est's, and whether est's is a config
/// key (else an estimator field).
const TF_NAMES: &[(&str, &str, bool)] = &[
    ("max_steps", "train_steps", false),
    ("steps", "eval_steps", false),
    ("model_fn", "model", false),
    ("input_fn", "train_input", false),
    ("train_input_fn", "train_input", false),
    ("eval_input_fn", "eval_input", false),
    ("predict_input_fn", "predict_input", false),
    ("save_checkpoints_steps", "save_checkpoint_steps", true),
    ("tf_random_seed", "random_seed", true),
];

/// The help for `name`, an unknown field or config key, when it is TensorFlow's name for
/// one of est's: what est calls it, and where it goes.
fn tf_name(name: &str) -> Option<String> {
    let &(_, ours, key) = TF_NAMES.iter().find(|(tf, ..)| *tf == name)?;
    let place = if key {
        format!("a key of the `config` block: `config {{ {ours} = ... }}`")
    } else {
        format!("an estimator field: `{ours} = ...`")
    };
    Some(format!("TensorFlow's `{name}` is est's `{ours}`, {place}"))
}

const FIELDS: &[&str] = &[
    "model",
    "train_input",
    "eval_input",
    "predict_input",
    "model_dir",
    "train_steps",
    "eval_steps",
    "hooks",
    "config",
    "warm_start_from",
    "eval_every",
];

/// What `estc` needs to run an estimator, besides its graphs.
#[derive(Debug, Clone)]
pub struct EstimatorInfo {
    pub name: String,
    pub span: Span,
    pub model: Option<String>,
    pub model_dir: Option<String>,
    pub train_steps: Option<i64>,
    pub eval_steps: Option<i64>,
    pub config: Config,
    pub hooks: Vec<HookVal>,
    /// The params as the model sees them (per-shard batch size).
    pub params: Vec<(String, String)>,
    /// Expressions of the estimator's fields and params, with their values (hover).
    pub hovers: Vec<super::Hover>,
    /// `warm_start_from`: where a fresh run takes its first weights.
    pub warm_start: Option<WarmStart>,
    /// `eval_every`: training evaluates every this many steps (train-and-evaluate).
    pub eval_every: Option<i64>,
}

/// TensorFlow's `WarmStartSettings`: a fresh training run (no checkpoint in its
/// model_dir) starts the model's variables from another run's checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmStart {
    /// A model directory (its newest intact checkpoint) or a `ckpt-N.safetensors` file,
    /// relative to the program's directory.
    pub from: String,
    /// The variables warm-started: those whose names match (`ir::name_matches`); all
    /// the model's when empty.
    pub vars: String,
    /// (name in this model, name in the checkpoint).
    pub rename: Vec<(String, String)>,
    /// Patterns of variables left to their initialisers.
    pub skip: Vec<String>,
    pub span: Span,
}

/// The graph of one (estimator, mode, target), with the input that feeds it.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub estimator: String,
    pub mode: SectionKind,
    pub target: Target,
    /// Shared, so that a backend keeps it without a copy.
    pub graph: std::sync::Arc<Graph>,
    pub input: Option<Dataset>,
    /// Expressions and bindings evaluated for this mode, with their types or values
    /// (hover, inlay hints).
    pub hovers: Vec<super::Hover>,
}

impl Compiled {
    /// The graph's name in dumps: `estimator/mode/target`.
    pub fn title(&self) -> String {
        format!(
            "{}/{}/{}",
            self.estimator,
            self.mode.name(),
            self.target.name()
        )
    }

    /// The graph as `estc check --emit ir` prints it.
    pub fn dump(&self) -> String {
        crate::ir::dump_text(&self.graph, &self.title())
    }
}

/// Elaborates the program's estimators for the given modes and target.
pub fn elaborate(p: &Program, opts: &ElabOptions) -> (Vec<EstimatorInfo>, Vec<Compiled>, Diags) {
    let mut diags = Diags::default();
    let mut infos = Vec::new();
    let mut out = Vec::new();
    let root = p.root_module();
    let estimators: Vec<&EstimatorItem> = root
        .ast
        .items
        .iter()
        .filter_map(|i| match &i.kind {
            ItemKind::Estimator(e) => Some(e),
            _ => None,
        })
        .collect();
    if let Some(want) = &opts.estimator {
        if !estimators.iter().any(|e| &e.name.name == want) {
            let names: Vec<&str> = estimators.iter().map(|e| e.name.name.as_str()).collect();
            let span = crate::span::Span::new(root.file, 0, 0);
            let mut d = Diag::new(
                Code::InvalidEstimator,
                span,
                format!("no estimator named `{want}`"),
            )
            .label("in this file");
            d = match did_you_mean(want, names.iter().copied()) {
                Some(h) => d.help(h),
                None => d.help(format!(
                    "the estimators are: {}",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                )),
            };
            diags.push(d);
        }
    }
    let mut used_models = Vec::new();
    for e in &estimators {
        if opts.estimator.as_ref().is_some_and(|w| *w != e.name.name) {
            continue;
        }
        let (info, compiled, ds) = estimator(p, e, opts);
        diags.extend(ds.iter().cloned());
        used_models.extend(info.model.clone());
        infos.push(info);
        out.extend(compiled);
    }
    shared_model_dirs(&estimators, &infos, &mut diags);
    // After a syntax error an estimator may be missing: do not call its model unused.
    let parse_failed = p
        .diags
        .iter()
        .any(|d| d.primary.span.file == root.file && d.code.id().starts_with("E01"));
    if opts.estimator.is_none() && !parse_failed {
        for item in &root.ast.items {
            if let ItemKind::Model(f) = &item.kind {
                if !estimators.iter().any(|e| {
                    field(e, "model")
                        .is_some_and(|x| matches!(&x.kind, ExprKind::Name(n) if *n == f.name.name))
                }) {
                    diags.push(
                        Diag::new(
                            Code::UnusedModel,
                            f.name.span,
                            format!("model `{}` is not used by any estimator", f.name.name),
                        )
                        .label("not checked")
                        .help(format!(
                            "add `estimator e {{ model = {} train_input = ... }}` to check it",
                            f.name.name
                        )),
                    );
                }
            }
        }
    }
    (infos, out, diags)
}

/// W0514 for estimators that share a `model_dir`: their training runs would write
/// checkpoints of different models into one directory (and the second refuses the
/// first's checkpoints, or restores them into the wrong model).
fn shared_model_dirs(estimators: &[&EstimatorItem], infos: &[EstimatorInfo], diags: &mut Diags) {
    // `runs/a`, `./runs/a` and `runs/./a/` name one directory.
    let dir_of = |i: &EstimatorInfo| {
        i.model_dir.clone().map(|d| {
            std::path::Path::new(&d)
                .components()
                .filter(|c| *c != std::path::Component::CurDir)
                .collect::<std::path::PathBuf>()
        })
    };
    for (k, later) in infos.iter().enumerate() {
        let Some(dir) = dir_of(later) else { continue };
        let Some(first) = infos[..k].iter().find(|i| dir_of(i).as_ref() == Some(&dir)) else {
            continue;
        };
        let at = |info: &EstimatorInfo| {
            estimators
                .iter()
                .find(|e| e.name.name == info.name)
                .and_then(|e| field(e, "model_dir"))
                .map_or(info.span, |x| x.span)
        };
        diags.push(
            Diag::new(
                Code::SharedModelDir,
                at(later),
                format!(
                    "estimators `{}` and `{}` share the model_dir \"{}\"",
                    first.name,
                    later.name,
                    dir.display()
                ),
            )
            .label(format!("`{}`'s model_dir", later.name))
            .with(at(first), format!("`{}`'s model_dir", first.name))
            .help("give each estimator its own model_dir: their checkpoints would overwrite each other's"),
        );
    }
}

fn field<'a>(e: &'a EstimatorItem, name: &str) -> Option<&'a Expr> {
    e.fields.iter().find_map(|f| match &f.value {
        FieldValue::Expr(x) if f.name.name == name => Some(x),
        _ => None,
    })
}

fn estimator<'p>(
    p: &'p Program,
    e: &'p EstimatorItem,
    opts: &ElabOptions,
) -> (EstimatorInfo, Vec<Compiled>, Diags) {
    let mut el = Elab::new(p, SectionKind::Train, opts.target);
    el.max_steps = opts.max_steps;
    el.hovers = opts.hover.then(Vec::new);
    let global = params(&mut el);
    el.params = global.clone();
    check_fields(&mut el, e);
    let (config, config_spans) = config(&mut el, e, opts);
    let ranks = i64::try_from(opts.ranks.clamp(1, 1 << 20)).unwrap_or(1);
    rules_of_config(&mut el, e, &config, &config_spans, &global, ranks);
    let per_shard = per_shard_params(&global, config.num_shards.saturating_mul(ranks));
    el.params = per_shard.clone();
    let model_dir = field(e, "model_dir").and_then(|x| match el.expr(x) {
        Value::Str(s) => Some(s.to_string()),
        Value::Error => None,
        other => {
            el.expected("a string", &other, x.span);
            None
        }
    });
    let train_steps = steps(&mut el, e, "train_steps");
    let eval_steps = steps(&mut el, e, "eval_steps");
    let eval_every = steps(&mut el, e, "eval_every");
    let hooks = hooks(&mut el, e);
    let warm_start = warm_start(&mut el, e);
    let model = model_ref(&mut el, e);
    let mut diags = std::mem::take(&mut el.diags);
    let info_hovers = el.hovers.take().unwrap_or_default();
    let mut compiled = Vec::new();
    let fixable = train_input_item(p, e);
    for &mode in &opts.modes {
        // Eval falls back to the train input, predict to the eval and then the train
        // input, so that every mode's graph is checked.
        let candidates: &[&str] = match mode {
            SectionKind::Train => &["train_input"],
            SectionKind::Eval => &["eval_input", "train_input"],
            SectionKind::Predict => &["predict_input", "eval_input", "train_input"],
        };
        let Some((input_field, input_expr)) =
            candidates.iter().find_map(|f| field(e, f).map(|x| (*f, x)))
        else {
            if mode == SectionKind::Train {
                diags.push(
                    Diag::new(
                        Code::InvalidEstimator,
                        e.name.span,
                        format!("estimator `{}` has no `train_input`", e.name.name),
                    )
                    .label("nothing to train on")
                    .help("add `train_input = my_input(...)`"),
                );
            }
            continue;
        };
        let mut el = Elab::new(p, mode, opts.target);
        el.max_steps = opts.max_steps;
        el.hovers = opts.hover.then(Vec::new);
        el.params = per_shard.clone();
        // (the hooks that watch evaluations run between loops, on every target)
        let step_hooks: Vec<&HookVal> = hooks
            .iter()
            .filter(|h| !matches!(h.kind, "early_stopping" | "keep_best"))
            .collect();
        if mode == SectionKind::Train && opts.target == Target::Wafer && !step_hooks.is_empty() {
            for h in step_hooks {
                el.diags.push(
                    Diag::new(
                        Code::WaferTrainingExtras,
                        h.span,
                        format!("hook `{}` in a wafer training run", h.kind),
                    )
                    .label("user hooks do not run while training on the wafer")
                    .help(
                        "drop the hook for wafer training, or train on the host (`--target host`)",
                    ),
                );
            }
        }
        let input = el.expr(input_expr);
        let dataset = match input {
            Value::Dataset(d) => Some(d),
            Value::Error => None,
            other => {
                el.diags.push(
                    Diag::new(
                        Code::InputNotDataset,
                        input_expr.span,
                        format!("`{input_field}` must be a dataset, found {}", other.kind()),
                    )
                    .label(other.kind())
                    .help("name an `input` item: `train_input = my_input(\"train\")`"),
                );
                None
            }
        };
        let mut graph_input = None;
        if let (Some(ds), Some((mm, mi))) = (dataset, model) {
            let mut ds = (*ds).clone();
            if let Some((features, labels)) =
                input_rules(&mut el, &ds, mode, &config, input_expr.span, fixable)
            {
                let labels = if mode == SectionKind::Predict {
                    None
                } else {
                    labels
                };
                let takes = match &p.item(mm, mi).kind {
                    ItemKind::Model(f) => Some(f),
                    _ => None,
                }
                .filter(|f| f.params.len() == 2);
                if let (Some(f), true) = (takes, mode != SectionKind::Predict && labels.is_none()) {
                    el.diags.push(
                        Diag::new(
                            Code::InputNotDataset,
                            input_expr.span,
                            format!(
                                "the {input_field} yields features only, but model `{}` takes labels",
                                f.name.name
                            ),
                        )
                        .label("no labels")
                        .with(f.params[1].name.span, "the labels parameter")
                        .help(match &features {
                            Elem::Record(fs) if fs.len() >= 2 => format!(
                                "make the elements `(features, labels)` pairs with a `map` (`|> map |r| (r.{}, r.{})`), or drop the model's labels parameter if it learns from the features alone",
                                fs[0].0,
                                fs[fs.len() - 1].0
                            ),
                            _ => "make the elements `(features, labels)` pairs with a `map`, or drop the model's labels parameter if it learns from the features alone".to_string(),
                        }),
                    );
                } else {
                    el.elaborate_model(mm, mi, &features, labels.as_ref(), input_expr.span);
                    if let Some(size) = bound_unknown_dim(&el.graph, &features) {
                        resolve_unknown_dim(&mut ds, size);
                    }
                }
            }
            graph_input = Some(ds);
        }
        if std::env::var_os("EST_TIME_PASSES").is_some() {
            crate::diag::log(&format!("elaborate {:<7}  {} steps", mode.name(), el.steps));
        }
        diags.extend(el.diags.iter().cloned());
        compiled.push(Compiled {
            estimator: e.name.name.clone(),
            mode,
            target: opts.target,
            hovers: el.hovers.take().unwrap_or_default(),
            graph: std::sync::Arc::new(el.graph),
            input: graph_input,
        });
    }
    let params_shown = match &per_shard {
        Value::Record(fs) => fs
            .iter()
            .map(|(k, v)| (k.clone(), super::value::show(v)))
            .collect(),
        _ => Vec::new(),
    };
    let info = EstimatorInfo {
        name: e.name.name.clone(),
        span: e.name.span,
        model: field(e, "model").and_then(|x| match &x.kind {
            ExprKind::Name(n) => Some(n.clone()),
            _ => None,
        }),
        model_dir,
        train_steps,
        eval_steps,
        config,
        hooks,
        params: params_shown,
        hovers: info_hovers,
        warm_start,
        eval_every,
    };
    (info, compiled, diags)
}

/// The params record: declared defaults, then overrides, each checked against its type.
fn params<'p>(el: &mut Elab<'p>) -> Value<'p> {
    let p = el.p;
    let mut fields: Vec<(String, Value<'p>)> = Vec::new();
    let mut decls: Vec<&'p ParamField> = Vec::new();
    for item in &p.root_module().ast.items {
        if let ItemKind::Params(fs) = &item.kind {
            for f in fs {
                if decls.iter().any(|d| d.name.name == f.name.name) {
                    continue;
                }
                // A default may use the fields declared before it.
                el.params = Value::Record(Rc::new(fields.clone()));
                let v = el.expr(&f.default);
                let v = check_static_type(el, v, f.default.span, &f.ty);
                el.record_binding(&f.name, &v);
                fields.push((f.name.name.clone(), v));
                decls.push(f);
            }
        }
    }
    for o in &p.overrides {
        // `model.depth` names a field of the record-typed field `model`
        let path: Vec<&str> = o.key.split('.').collect();
        let Some(i) = decls.iter().position(|d| d.name.name == path[0]) else {
            let names = decls.iter().map(|d| d.name.name.as_str());
            let mut d = Diag::new(
                Code::InvalidParamOverride,
                o.value.span,
                format!("no params field `{}`", path[0]),
            )
            .label("overridden here");
            d = match did_you_mean(path[0], names) {
                Some(h) => d.help(h),
                None => d.help("override fields declared in the program's `params` block"),
            };
            el.diags.push(d);
            continue;
        };
        let ty = match field_type(&decls[i].ty, &path, o.value.span) {
            Ok(t) => t,
            Err(d) => {
                el.diags.push(*d);
                continue;
            }
        };
        let ty_text = p.sources.text(ty.span());
        let v = if is_literal(&o.value) {
            el.expr(&o.value)
        } else {
            Value::Error
        };
        match conforms(&v, ty) {
            Some(v) => fields[i].1 = set_field(&fields[i].1, &path[1..], v),
            None => el.diags.push(
                Diag::new(
                    Code::InvalidParamOverride,
                    o.value.span,
                    format!(
                        "`{}` is not a value of `{}`'s type, {ty_text}",
                        crate::diag::excerpt(p.sources.text(o.value.span), 60),
                        o.key
                    ),
                )
                .label(format!("expected {ty_text}"))
                .with(ty.span(), "declared here")
                .help(format!("give a literal {ty_text}, e.g. {}", example_of(ty))),
            ),
        }
    }
    Value::Record(Rc::new(fields))
}

/// The declared type of the field `path[1..]` names within a params field of type `ty`
/// (`model.depth`: `depth` of `model`'s record type), or E0306 at `span`.
fn field_type<'t>(
    mut ty: &'t TypeExpr,
    path: &[&str],
    span: Span,
) -> Result<&'t TypeExpr, Box<Diag>> {
    for (n, part) in path.iter().enumerate().skip(1) {
        let within = path[..n].join(".");
        let TypeExpr::Record { fields, .. } = ty else {
            return Err(Box::new(
                Diag::new(
                    Code::InvalidParamOverride,
                    span,
                    format!("`params.{within}` is not a record, so it has no field `{part}`"),
                )
                .label("overridden here")
                .with(ty.span(), "declared here")
                .help(format!("override `{within}` itself")),
            ));
        };
        let Some((_, t)) = fields.iter().find(|(k, _)| k.name == *part) else {
            let names: Vec<&str> = fields.iter().map(|(k, _)| k.name.as_str()).collect();
            let d = Diag::new(
                Code::InvalidParamOverride,
                span,
                format!("`params.{within}` has no field `{part}`"),
            )
            .label("overridden here")
            .with(ty.span(), "declared here");
            return Err(Box::new(match did_you_mean(part, names.iter().copied()) {
                Some(h) => d.help(h),
                None => d.help(format!("its fields: {}", names.join(", "))),
            }));
        };
        ty = t;
    }
    Ok(ty)
}

/// `record` with the field at `path` (a field of a field ...) replaced by `v`.
fn set_field<'p>(record: &Value<'p>, path: &[&str], v: Value<'p>) -> Value<'p> {
    match (path.split_first(), record) {
        (None, _) => v,
        (Some((first, rest)), Value::Record(fs)) => Value::Record(Rc::new(
            fs.iter()
                .map(|(k, x)| {
                    let x = if k == first {
                        set_field(x, rest, v.clone())
                    } else {
                        x.clone()
                    };
                    (k.clone(), x)
                })
                .collect(),
        )),
        // the declared value did not elaborate (an error already said so)
        _ => record.clone(),
    }
}

/// Override values are literals: numbers (possibly negative), strings, bools, lists
/// and records of them.
fn is_literal(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Int(_) | ExprKind::Float(_) | ExprKind::Str(_) | ExprKind::Bool(_) => true,
        ExprKind::Unary(UnaryOp::Neg, x) => matches!(x.kind, ExprKind::Int(_) | ExprKind::Float(_)),
        ExprKind::List(xs) => xs.iter().all(is_literal),
        ExprKind::Record(fs) => fs.iter().all(|(_, x)| is_literal(x)),
        _ => false,
    }
}

/// The value converted to a params field's static type, if it is one.
fn conforms<'p>(v: &Value<'p>, ty: &TypeExpr) -> Option<Value<'p>> {
    match (ty, v) {
        (TypeExpr::List { elem, .. }, Value::List(xs)) => xs
            .iter()
            .map(|x| conforms(x, elem))
            .collect::<Option<Vec<_>>>()
            .map(|xs| Value::List(Rc::new(xs))),
        (TypeExpr::Record { fields, .. }, Value::Record(vs)) => {
            if vs.len() != fields.len() {
                return None;
            }
            fields
                .iter()
                .map(|(k, t)| {
                    let (_, x) = vs.iter().find(|(n, _)| *n == k.name)?;
                    Some((k.name.clone(), conforms(x, t)?))
                })
                .collect::<Option<Vec<_>>>()
                .map(|fs| Value::Record(Rc::new(fs)))
        }
        (
            TypeExpr::Named {
                name, dims: None, ..
            },
            _,
        ) => match (name.name.as_str(), v) {
            ("int", Value::Int(_))
            | ("float", Value::Float(_))
            | ("bool", Value::Bool(_))
            | ("string", Value::Str(_)) => Some(v.clone()),
            ("float", Value::Int(i)) => Some(Value::Float(*i as f64)),
            _ => None,
        },
        _ => None,
    }
}

fn example_of(ty: &TypeExpr) -> String {
    match ty {
        TypeExpr::List { elem, .. } => format!("[{}, {}]", example_of(elem), example_of(elem)),
        TypeExpr::Record { fields, .. } => format!(
            "{{ {} }}",
            fields
                .iter()
                .map(|(k, t)| format!("{}: {}", k.name, example_of(t)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        TypeExpr::Tuple { .. } => "a literal".into(),
        TypeExpr::Named { name, .. } => match name.name.as_str() {
            "int" => "32".into(),
            "float" => "0.5".into(),
            "bool" => "true".into(),
            _ => "\"text\"".into(),
        },
    }
}

/// Checks a params value against its declared static type (`int`, `[int]`, ...).
fn check_static_type<'p>(
    el: &mut Elab<'p>,
    v: Value<'p>,
    span: Span,
    ty: &'p TypeExpr,
) -> Value<'p> {
    if let TypeExpr::List { elem, .. } = ty {
        return match v {
            Value::List(xs) => {
                let checked: Vec<Value<'p>> = xs
                    .iter()
                    .map(|x| check_static_type(el, x.clone(), span, elem))
                    .collect();
                Value::List(Rc::new(checked))
            }
            Value::Error => Value::Error,
            other => el.expected("a list", &other, span),
        };
    }
    el.check_annotation(v, span, ty)
}

/// `params.batch_size` as the input and model see it: the per-shard batch.
fn per_shard_params<'p>(global: &Value<'p>, shards: i64) -> Value<'p> {
    match global {
        Value::Record(fs) if shards > 1 => Value::Record(Rc::new(
            fs.iter()
                .map(|(k, v)| match (k.as_str(), v) {
                    ("batch_size", Value::Int(b)) => (k.clone(), Value::Int(b / shards)),
                    _ => (k.clone(), v.clone()),
                })
                .collect(),
        )),
        other => other.clone(),
    }
}

fn check_fields<'p>(el: &mut Elab<'p>, e: &'p EstimatorItem) {
    for f in &e.fields {
        if FIELDS.contains(&f.name.name.as_str()) {
            if f.name.name == "config" && !matches!(f.value, FieldValue::Block(..)) {
                el.diags.push(
                    Diag::new(Code::InvalidEstimator, f.name.span, "`config` is a block")
                        .label("not a block")
                        .help("write `config { key = value ... }`"),
                );
            }
            continue;
        }
        let mut d = Diag::new(
            Code::UnknownConfig,
            f.name.span,
            format!("unknown estimator field `{}`", f.name.name),
        )
        .label("unknown field");
        d = match tf_name(&f.name.name)
            .or_else(|| did_you_mean(&f.name.name, FIELDS.iter().copied()))
        {
            Some(h) => d.help(h),
            None => d.help(format!("estimator fields: {}", FIELDS.join(", "))),
        };
        el.diags.push(d);
    }
    if field(e, "model").is_none() {
        el.diags.push(
            Diag::new(
                Code::InvalidEstimator,
                e.name.span,
                format!("estimator `{}` has no `model`", e.name.name),
            )
            .label("no model")
            .help("add `model = my_model`"),
        );
    }
}

/// Config keys with where they were set.
type ConfigSpans = Vec<(String, Span)>;

fn config<'p>(
    el: &mut Elab<'p>,
    e: &'p EstimatorItem,
    opts: &ElabOptions,
) -> (Config, ConfigSpans) {
    let mut c = Config::default();
    let mut spans = Vec::new();
    let entries: Vec<&Field> = e
        .fields
        .iter()
        .filter_map(|f| match &f.value {
            FieldValue::Block(fs, _) if f.name.name == "config" => Some(fs.iter()),
            _ => None,
        })
        .flatten()
        .collect();
    let mut values: Vec<(String, i64)> = Vec::new();
    for f in entries {
        let key = f.name.name.as_str();
        if let Some((_, help)) = UNSUPPORTED_KEYS.iter().find(|(k, _)| *k == key) {
            el.diags.push(
                Diag::new(
                    Code::UnsupportedConfig,
                    f.name.span,
                    format!("`{key}` is not supported"),
                )
                .label("unsupported config key")
                .help(*help),
            );
            continue;
        }
        if !CONFIG_KEYS.contains(&key) {
            let mut d = Diag::new(
                Code::UnknownConfig,
                f.name.span,
                format!("unknown config key `{key}`"),
            )
            .label("unknown key");
            d = match tf_name(key).or_else(|| did_you_mean(key, CONFIG_KEYS.iter().copied())) {
                Some(h) => d.help(h),
                None => d.help(format!("config keys: {}", CONFIG_KEYS.join(", "))),
            };
            el.diags.push(d);
            continue;
        }
        let FieldValue::Expr(x) = &f.value else {
            continue;
        };
        let v = el.expr(x);
        let Some(i) = el.as_int(&v, x.span) else {
            continue;
        };
        let min = if key == "random_seed" { 0 } else { 1 };
        if i < min {
            el.diags.push(
                Diag::new(
                    Code::InvalidEstimator,
                    x.span,
                    format!("`{key}` must be at least {min}"),
                )
                .label(format!("{i}"))
                .help(format!("use {min} or more")),
            );
            continue;
        }
        values.push((key.to_string(), i));
        spans.push((key.to_string(), f.name.span.to(x.span)));
    }
    values.extend(opts.config.iter().cloned());
    // a key `--config` (or a params file's `runconfig:`) set is labelled where it was set
    for (key, _) in &opts.config {
        if let Some(&(_, at)) = el.p.config_sources.iter().rev().find(|(k, _)| k == key) {
            spans.retain(|(k, _)| k != key);
            spans.push((key.clone(), at));
        }
    }
    for (key, i) in values {
        if let Some(&(_, max, why)) = CONFIG_MAX.iter().find(|(k, _, _)| *k == key) {
            if i > max {
                let at = span_of(&spans, &key, e.name.span);
                el.diags.push(
                    Diag::new(
                        Code::InvalidEstimator,
                        at,
                        format!("`{key}` = {i} is more than {max}"),
                    )
                    .label(format!("at most {max}"))
                    .help(format!("use {max} or fewer: {why}")),
                );
                continue;
            }
        }
        match key.as_str() {
            "iterations_per_loop" => c.iterations_per_loop = i,
            "num_shards" => c.num_shards = i,
            "save_checkpoint_steps" => c.save_checkpoint_steps = i,
            "save_summary_steps" => c.save_summary_steps = i,
            "keep_checkpoint_max" => c.keep_checkpoint_max = i,
            "random_seed" => c.random_seed = Some(i),
            "input_workers" => c.input_workers = i,
            _ => c.log_step_count_steps = i,
        }
    }
    (c, spans)
}

/// The most shards a step may have (`config { num_shards }`).
pub const MAX_NUM_SHARDS: i64 = 4096;

/// Upper bounds of config keys whose value is a number of threads or copies of
/// something, with why: beyond them a run would exhaust the machine, not go faster.
const CONFIG_MAX: &[(&str, i64, &str)] = &[
    (
        "input_workers",
        64,
        "each worker is a thread running its own copy of the whole input pipeline, buffers and caches included",
    ),
    (
        "num_shards",
        MAX_NUM_SHARDS,
        "each shard of a step runs as a thread of its own on the host",
    ),
    (
        "keep_checkpoint_max",
        100_000,
        "every kept checkpoint stays on disk",
    ),
];

/// `batch(n)` or `batch(n, drop_remainder: false)` at `call` becomes
/// `batch(n, drop_remainder: true)`: the diagnostic with that fix.
fn drop_remainder_fix(p: &Program, d: Diag, call: Span) -> Diag {
    // (a piped stage's span starts at its `|>`)
    let text = p.sources.text(call);
    if !text
        .trim_start_matches("|>")
        .trim_start()
        .starts_with("batch")
        || !text.ends_with(')')
    {
        return d;
    }
    let edit = match text.find("drop_remainder: false") {
        Some(i) => {
            let lo = call.lo as usize + i + "drop_remainder: ".len();
            (
                Span::new(call.file, lo, lo + "false".len()),
                "true".to_string(),
            )
        }
        None if !text.contains("drop_remainder") => {
            // after the last argument (and its trailing comma, if it has one)
            let args = text[..text.len() - 1].trim_end();
            let at = call.lo as usize + args.len();
            let sep = if args.ends_with(',') { " " } else { ", " };
            (
                Span::new(call.file, at, at),
                format!("{sep}drop_remainder: true"),
            )
        }
        None => return d,
    };
    d.fix("add `drop_remainder: true`", vec![edit])
}

fn span_of(spans: &ConfigSpans, key: &str, fallback: Span) -> Span {
    spans
        .iter()
        .find(|(k, _)| k == key)
        .map_or(fallback, |(_, s)| *s)
}

fn rules_of_config(
    el: &mut Elab<'_>,
    e: &EstimatorItem,
    c: &Config,
    spans: &ConfigSpans,
    global: &Value<'_>,
    ranks: i64,
) {
    let ckpt = span_of(spans, "save_checkpoint_steps", e.name.span);
    if c.iterations_per_loop > 0 && c.save_checkpoint_steps % c.iterations_per_loop != 0 {
        let multiple =
            (c.save_checkpoint_steps / c.iterations_per_loop).max(1) * c.iterations_per_loop;
        let mut d = Diag::new(
            Code::CheckpointSteps,
            ckpt,
            format!(
                "save_checkpoint_steps = {} is not a multiple of iterations_per_loop = {}",
                c.save_checkpoint_steps, c.iterations_per_loop
            ),
        )
        .label("checkpoints are taken at loop boundaries")
        .with(
            span_of(spans, "iterations_per_loop", e.name.span),
            "the loop length",
        )
        .help(format!(
            "use a multiple of {}, such as {multiple}",
            c.iterations_per_loop,
        ));
        // the number written after `save_checkpoint_steps =` (not one from `--config`)
        let from_override = el.p.config_sources.iter().any(|(_, s)| s.file == ckpt.file);
        let written = el.p.sources.text(ckpt);
        if let Some(eq) = written.find('=').filter(|_| !from_override) {
            let value = written[eq + 1..].trim_start();
            // (not when `--config` overrides it: the file's number is not the one used)
            if value.parse::<i64>() == Ok(c.save_checkpoint_steps) {
                let lo = ckpt.hi as usize - value.len();
                d = d.fix(
                    format!("use save_checkpoint_steps = {multiple}"),
                    vec![(
                        Span::new(ckpt.file, lo, ckpt.hi as usize),
                        multiple.to_string(),
                    )],
                );
            }
        }
        el.diags.push(d);
    }
    if el.target == Target::Wafer && c.save_checkpoint_steps < WAFER_MIN_CHECKPOINT_STEPS {
        el.diags.push(
            Diag::new(Code::CheckpointSteps, ckpt, format!("save_checkpoint_steps = {} is below the wafer's lower bound of {WAFER_MIN_CHECKPOINT_STEPS}", c.save_checkpoint_steps))
                .label("checkpoints this frequent stall the wafer")
                .help(format!("save every {WAFER_MIN_CHECKPOINT_STEPS} steps or more on the wafer")),
        );
    }
    let replicas = c.num_shards.saturating_mul(ranks);
    if replicas > 1 {
        let p = el.p;
        let batch = match global {
            Value::Record(fs) => fs.iter().find_map(|(k, v)| match v {
                Value::Int(b) if k == "batch_size" => Some(*b),
                _ => None,
            }),
            _ => None,
        };
        if let Some(b) = batch {
            if b % replicas != 0 {
                let decl = p
                    .root_module()
                    .ast
                    .items
                    .iter()
                    .find_map(|i| match &i.kind {
                        ItemKind::Params(fs) => fs
                            .iter()
                            .find(|f| f.name.name == "batch_size")
                            .map(|f| f.name.span.to(f.default.span)),
                        _ => None,
                    });
                let (what, each) = if ranks > 1 {
                    (
                        format!("{ranks} ranks x num_shards = {}", c.num_shards),
                        "ranks x num_shards",
                    )
                } else {
                    (format!("num_shards = {}", c.num_shards), "num_shards")
                };
                let mut d = Diag::new(Code::ShardDivisibility, span_of(spans, "num_shards", e.name.span), format!("the global batch of {b} is not divisible by {what}"))
                    .label(format!("{replicas} shards"))
                    .help(format!("each shard reads params.batch_size / {each} examples; use a batch size divisible by {replicas}, such as {}", (b / replicas).max(1) * replicas));
                if let Some(s) = decl {
                    d = d.with(s, format!("global batch {b}"));
                }
                el.diags.push(d);
            }
        }
    }
}

/// The wafer's lower bound on `save_checkpoint_steps`.
pub const WAFER_MIN_CHECKPOINT_STEPS: i64 = 100;

fn steps<'p>(el: &mut Elab<'p>, e: &'p EstimatorItem, name: &str) -> Option<i64> {
    let x = field(e, name)?;
    let v = el.expr(x);
    let i = el.as_int(&v, x.span)?;
    if i <= 0 {
        el.diags.push(
            Diag::new(
                Code::InvalidEstimator,
                x.span,
                format!("`{name}` must be positive"),
            )
            .label(format!("{i}"))
            .help("give a number of steps of 1 or more"),
        );
        return None;
    }
    Some(i)
}

fn hooks<'p>(el: &mut Elab<'p>, e: &'p EstimatorItem) -> Vec<HookVal> {
    let Some(x) = field(e, "hooks") else {
        return Vec::new();
    };
    match el.expr(x) {
        Value::List(xs) => xs
            .iter()
            .filter_map(|h| match h {
                Value::Hook(h) => Some((**h).clone()),
                Value::Error => None,
                other => {
                    el.expected("a hook (from std.hooks)", other, x.span);
                    None
                }
            })
            .collect(),
        Value::Error => Vec::new(),
        other => {
            el.expected("a list of hooks", &other, x.span);
            Vec::new()
        }
    }
}

/// `warm_start_from = "dir"` or `= warm_start("dir", vars: ..., rename: [...], skip: [...])`;
/// `none` (as from an `if` on a param) starts from scratch.
fn warm_start<'p>(el: &mut Elab<'p>, e: &'p EstimatorItem) -> Option<WarmStart> {
    let x = field(e, "warm_start_from")?;
    let v = el.expr(x);
    let strings = |el: &mut Elab<'p>, v: &Value<'p>| -> Option<Vec<String>> {
        match v {
            Value::List(xs) => xs
                .iter()
                .map(|x| match x {
                    Value::Str(s) => Some(s.to_string()),
                    other => {
                        el.expected("a name pattern (a string)", other, x_span(e));
                        None
                    }
                })
                .collect(),
            other => {
                el.expected("a list of name patterns", other, x_span(e));
                None
            }
        }
    };
    let mut ws = WarmStart {
        from: String::new(),
        vars: String::new(),
        rename: Vec::new(),
        skip: Vec::new(),
        span: x.span,
    };
    match &v {
        Value::Str(s) => ws.from = s.to_string(),
        Value::Record(fs) => {
            for (k, f) in fs.iter() {
                match (k.as_str(), f) {
                    ("from", Value::Str(s)) => ws.from = s.to_string(),
                    ("vars", Value::Str(s)) => ws.vars = s.to_string(),
                    ("skip", v) => ws.skip = strings(el, v)?,
                    ("rename", Value::List(xs)) => {
                        for p in xs.iter() {
                            match p {
                                Value::Tuple(t) if t.len() == 2 => match (&t[0], &t[1]) {
                                    (Value::Str(a), Value::Str(b)) => {
                                        ws.rename.push((a.to_string(), b.to_string()))
                                    }
                                    _ => {
                                        el.expected("a pair of names (\"in this model\", \"in the checkpoint\")", p, x.span);
                                        return None;
                                    }
                                },
                                other => {
                                    el.expected("a pair of names (\"in this model\", \"in the checkpoint\")", other, x.span);
                                    return None;
                                }
                            }
                        }
                    }
                    (_, Value::Error) => return None,
                    (k, other) => {
                        el.expected(&format!("`{k}` of a warm start"), other, x.span);
                        return None;
                    }
                }
            }
        }
        Value::Error | Value::None => return None,
        other => {
            el.expected("a checkpoint directory or `warm_start(...)`", other, x.span);
            return None;
        }
    }
    Some(ws)
}

fn x_span(e: &EstimatorItem) -> Span {
    field(e, "warm_start_from").map_or(e.name.span, |x| x.span)
}

fn model_ref<'p>(el: &mut Elab<'p>, e: &'p EstimatorItem) -> Option<(ModId, usize)> {
    let x = field(e, "model")?;
    match el.expr(x) {
        Value::ModelFn(m, i) => Some((m, i)),
        Value::Error => None,
        other => {
            el.diags.push(
                Diag::new(
                    Code::InvalidEstimator,
                    x.span,
                    format!("`model` must name a model, found {}", other.kind()),
                )
                .label(other.kind())
                .help("name a `model` item: `model = my_model`"),
            );
            None
        }
    }
}

/// The text a fix of the train input may edit: the `input` item that `train_input`
/// calls, when no other mode reads it (`eval_input` and `predict_input` call other
/// items). A fix elsewhere (a helper, or an input evaluation reads too) could make
/// evaluation drop its last batch, or never end.
fn train_input_item(p: &Program, e: &EstimatorItem) -> Option<Span> {
    let callee = |x: &Expr| match &x.kind {
        ExprKind::Call { callee, .. } => match &callee.kind {
            ExprKind::Name(n) => Some(n.clone()),
            _ => None,
        },
        _ => None,
    };
    let train = callee(field(e, "train_input")?)?;
    // (each other input there is must call another item; an estimator without them
    // trains only)
    for x in [field(e, "eval_input"), field(e, "predict_input")]
        .into_iter()
        .flatten()
    {
        match callee(x) {
            Some(n) if n != train => {}
            _ => return None,
        }
    }
    match p.lookup(p.root, &train)? {
        crate::program::Def::Item(m, i) => Some(p.item(m, i).span),
        crate::program::Def::Module(_) => None,
    }
}

/// The wafer Estimator's input rules. Returns the element types of features and
/// labels (labels absent when the elements are features only). The fixes of the
/// train input's `batch` edit only inside `fixable` (`train_input_item`).
fn input_rules(
    el: &mut Elab<'_>,
    ds: &Dataset,
    mode: SectionKind,
    c: &Config,
    at: Span,
    fixable: Option<Span>,
) -> Option<(Elem, Option<Elem>)> {
    let fixable =
        |s: Span| fixable.is_some_and(|f| f.file == s.file && f.lo <= s.lo && s.hi <= f.hi);
    let elem = ds.elem().clone();
    // TensorFlow's rule: a pair is (features, labels); anything else is features alone
    let (features, labels) = match &elem {
        Elem::Tuple(xs) if xs.len() == 2 => (xs[0].clone(), Some(xs[1].clone())),
        Elem::Tuple(_) => {
            el.diags.push(
                Diag::new(
                    Code::InputNotDataset,
                    at,
                    format!("the input's elements are {elem}, neither (features, labels) nor features"),
                )
                .label("this input")
                .with(
                    ds.stages[ds.stages.len() - 1].span,
                    "the pipeline ends here",
                )
                .help("a tuple of two is (features, labels); make the features a record or a tuple inside the pair: `|> map |(a, b, y)| ({ a: a, b: b }, y)`"),
            );
            return None;
        }
        _ => (elem.clone(), None),
    };
    let wafer = el.target == Target::Wafer;
    match ds.batch() {
        None => {
            el.diags.push(
                Diag::new(
                    Code::BatchNotFixed,
                    at,
                    "the input does not batch its elements",
                )
                .label("no `batch` in this pipeline")
                .with(
                    ds.stages[ds.stages.len() - 1].span,
                    "the pipeline ends here",
                )
                .help("add `|> batch(params.batch_size, drop_remainder: true)`"),
            );
            return None;
        }
        Some(b) => {
            if let StageKind::Batch {
                drop_remainder: false,
                ..
            } = b.kind
            {
                if mode == SectionKind::Train {
                    let why = if wafer {
                        "the wafer needs the same batch size at every step"
                    } else {
                        "the train graph has a static batch size"
                    };
                    let d = Diag::new(
                        Code::BatchNotFixed,
                        b.span,
                        "batch size is not fixed: the last batch may be smaller",
                    )
                    .label(why)
                    .with(at, "used here")
                    .help("write `batch(n, drop_remainder: true)`; evaluation and prediction take a partial last batch (padded and masked), training does not");
                    let d = if fixable(b.span) {
                        drop_remainder_fix(el.p, d, b.span)
                    } else {
                        d
                    };
                    el.diags.push(d);
                } else {
                    // The runtime pads the last batch; `mask_padding` masks it.
                    el.graph.partial_batches = true;
                }
            }
        }
    }
    if mode == SectionKind::Train && wafer && !ds.repeats_forever() {
        let mut d = Diag::new(
            Code::NoRepeat,
            at,
            "the train input has no `repeat`: it would run out before the steps are done",
        )
        .label("ends after one pass")
        .with(
            ds.stages[ds.stages.len() - 1].span,
            "the pipeline ends here",
        )
        .help("training runs for steps, not epochs: add `|> repeat` before `batch`");
        // `|> batch(...)` (a stage's span starts at its `|>`) becomes
        // `|> repeat |> batch(...)`
        if let Some(b) = ds.batch().map(|b| b.span).filter(|&b| fixable(b)) {
            let stage = el.p.sources.text(b);
            if stage.starts_with("|>") && stage[2..].trim_start().starts_with("batch") {
                d = d.fix(
                    "add `|> repeat` before `batch`",
                    vec![(Span { hi: b.lo, ..b }, "|> repeat ".into())],
                );
            }
        }
        el.diags.push(d);
    }
    if mode == SectionKind::Train && c.input_workers > 1 {
        for s in ds.shuffles() {
            if let StageKind::Shuffle {
                seed: Some(seed), ..
            } = s.kind
            {
                el.diags.push(
                    Diag::new(Code::IdenticalShuffle, s.span, format!("{} input workers all shuffle with seed {seed}", c.input_workers))
                        .label("fixed seed")
                        .help("drop the seed: each worker then shuffles with a seed derived from `random_seed` and its index"),
                );
            }
        }
    }
    Some((features, labels))
}

/// The size the model's signature gave the dimensions the pipeline left unknown (the
/// length of `decode_raw` without `length`), if they all got one size.
fn bound_unknown_dim(g: &crate::ir::Graph, features: &Elem) -> Option<usize> {
    fn leaves<'e>(e: &'e Elem, out: &mut Vec<&'e [Option<usize>]>) {
        match e {
            Elem::Tensor { dims, .. } => out.push(dims),
            Elem::Tuple(xs) => xs.iter().for_each(|x| leaves(x, out)),
            Elem::Record(fs) => fs.iter().for_each(|(_, x)| leaves(x, out)),
        }
    }
    let mut dims = Vec::new();
    leaves(features, &mut dims);
    // the model's inputs, made in the order of the element's leaves
    let inputs =
        g.g.node_indices()
            .filter(|&n| matches!(g.node(n).op, crate::ir::Op::Input { .. }));
    let mut sizes = dims.into_iter().zip(inputs).flat_map(|(d, n)| {
        d.iter()
            .zip(g.ty(n).shape.iter())
            .filter(|(d, _)| d.is_none())
            .map(|(_, &b)| b)
            .collect::<Vec<_>>()
    });
    let first = sizes.next()?;
    sizes.all(|s| s == first).then_some(first)
}

/// Gives the unknown dimension its bound size everywhere in the pipeline: in the element
/// types of the stages and in the graphs of `map` and `filter` closures, so that every
/// node of those graphs has a concrete shape too.
fn resolve_unknown_dim(ds: &mut Dataset, size: usize) {
    use super::datasets::UNKNOWN_DIM;
    fn fix_elem(e: &mut Elem, size: usize) {
        match e {
            Elem::Tensor { dims, .. } => dims
                .iter_mut()
                .filter(|d| d.is_none())
                .for_each(|d| *d = Some(size)),
            Elem::Tuple(xs) => xs.iter_mut().for_each(|x| fix_elem(x, size)),
            Elem::Record(fs) => fs.iter_mut().for_each(|(_, x)| fix_elem(x, size)),
        }
    }
    for stage in &mut ds.stages {
        fix_elem(&mut stage.elem, size);
        if let StageKind::Map { graph, .. } | StageKind::Filter { graph } = &mut stage.kind {
            let nodes: Vec<_> = graph.g.node_indices().collect();
            for n in nodes {
                for d in graph.g[n]
                    .ty
                    .shape
                    .iter_mut()
                    .filter(|d| **d == UNKNOWN_DIM)
                {
                    *d = size;
                }
            }
        }
    }
}
