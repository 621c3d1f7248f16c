//! The Estimator runtime: train, evaluate and predict a checked program on the reference
//! interpreter, with everything around the loop: the input pipeline, loops of
//! `iterations_per_loop` steps, checkpoints and exact resume, TensorBoard summaries,
//! metrics as reducers, replicated steps over `num_shards`, hooks, smoke runs and
//! numerical health.
//!
//! ```text
//! Estimator::new(program, options)      check, pick the estimator, find model_dir
//!   .train(Steps::Max(n))               restore or initialise, then loops of steps
//!   .evaluate(None)                     metrics over the eval input
//!   .predict(out_dir)                   predictions as JSON lines and .npy files
//! ```
//!
//! A train step is the autodiff'd train graph run in two phases: every shard computes
//! its loss and gradients (phase A) on its own batch, the runtime averages what feeds
//! each `cross_shard_mean`, and phase B applies the optimiser once.

pub mod checkpoint;
mod evaluate;
mod export;
pub mod health;
pub mod hooks;
pub mod metrics;
pub mod model_dir;
mod replicas;
mod restore;
pub mod summary;

pub use export::{ExportFormat, ExportOptions, ExportReport, Sample};
pub use replicas::{end_failed, join_failed};

use crate::backend::{self, Device, Feeds, RunError, RunExe, StepCtx, StepError, TrainExe};
use crate::data::pipeline;
use crate::diag::{Code, Diag};
use crate::elab::data::Dataset;
use crate::elab::{Compiled, EstimatorInfo, Target};
use crate::hash::{fnv1a, FNV_OFFSET};
use crate::ir::{Graph, NodeIndex, Op, Role, TensorType};
use crate::span::Span;
use crate::syntax::ast::SectionKind;
use crate::tensor::Tensor;
use crate::Program;
pub use hooks::{Action, EarlyStopping, EvalInfo, KeepBest, RunHook, StepInfo};
pub use metrics::{Reducer, ReducerFactory};
use pipeline::{PipeOptions, Pipeline};
use rustc_hash::{FxHashMap, FxHashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Tunes glibc's allocator for training: large blocks come from the heap instead of
/// fresh `mmap`s, and freed memory is kept for the next step instead of being returned
/// to the system. Each step allocates the same large tensors again, and without this
/// every one of them page-faults in anew (it made the MNIST CNN 1.6x slower). Process
/// wide, so `estc` calls it at start-up and an embedding program may choose to.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator thresholds; called before heavy allocation.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 30);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// How to build an `Estimator`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The estimator to run; may be left out when the program has one.
    pub estimator: Option<String>,
    pub target: Target,
    /// `--config key=value` overrides.
    pub config: Vec<(String, i64)>,
    /// Overrides the estimator's `model_dir`.
    pub model_dir: Option<PathBuf>,
    /// Where relative data paths start (default: the directory of the program's file).
    pub data_dir: Option<PathBuf>,
    /// Where `cache("id")` files go (default: `EST_CACHE_DIR`, else `~/.cache/est`).
    pub cache_dir: Option<PathBuf>,
    /// The memory a run may need (see `CheckOptions::memory_limit`).
    pub memory_limit: Option<u64>,
    /// The threads a step runs on (the host target): `None` is `EST_NUM_THREADS`,
    /// else every core.
    pub threads: Option<usize>,
    /// The fabric the wafer target runs on (`None`: `test32`).
    pub wafer: Option<crate::backend::wafer::fabric::Fabric>,
    /// The ranks of the data-parallel run this estimator joins (`Estimator::join`):
    /// `params.batch_size` is divided by them and `num_shards`.
    pub ranks: u64,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            estimator: None,
            target: Target::run_default(),
            config: Vec::new(),
            model_dir: None,
            data_dir: None,
            cache_dir: None,
            memory_limit: None,
            threads: None,
            wafer: None,
            ranks: 1,
        }
    }
}

/// Why a run could not go on: diagnostics, with spans into the program.
#[derive(Debug)]
pub struct RunFailure {
    pub diags: Vec<Diag>,
}

impl From<Diag> for RunFailure {
    fn from(d: Diag) -> RunFailure {
        RunFailure { diags: vec![d] }
    }
}

type Res<T> = Result<T, RunFailure>;

/// How many steps to train.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steps {
    /// The estimator's `train_steps` (a total, like `max_steps`).
    Default,
    /// This many more steps (`--steps`).
    Add(u64),
    /// Up to this global step (`--max-steps`).
    Max(u64),
}

#[derive(Debug, Clone)]
pub struct TrainReport {
    pub start_step: i64,
    pub global_step: i64,
    pub final_loss: f64,
    pub steps_per_sec: f64,
    pub seconds: f64,
    /// Why training ended before its last step, if it did.
    pub stopped_early: Option<String>,
    pub checkpoint: Option<PathBuf>,
    /// Of `seconds`, those spent in the train steps' exchanges with the other ranks
    /// (the all-reduce, and waiting there for the slowest rank); 0 alone.
    pub allreduce_seconds: f64,
}

/// A watching hook's `mode`, with "auto" decided by what it watches: the loss and the
/// error metrics improve downwards, accuracy, AUC, precision and recall upwards; a mean
/// or a custom reducer stays "auto" (which `check_eval_hooks` refuses).
fn resolved_mode(h: &crate::elab::value::HookVal, graphs: &[Arc<Compiled>]) -> &'static str {
    let monitor = h.string("monitor");
    match h.string("mode") {
        "max" => return "max",
        "min" => return "min",
        _ => {}
    }
    if monitor == "loss" {
        return "min";
    }
    let kind = graphs
        .iter()
        .filter(|c| c.mode == SectionKind::Eval)
        .flat_map(|c| c.graph.metrics.iter())
        .find(|m| m.name == monitor)
        .map(|m| m.reducer.as_str());
    match kind {
        Some("accuracy" | "auc" | "auc_pr" | "precision" | "recall" | "accuracy_baseline") => "max",
        Some("mean_squared_error" | "root_mean_squared_error" | "mean_absolute_error") => "min",
        _ => "auto",
    }
}

/// What train-and-evaluate did: its training, and each evaluation by global step.
#[derive(Debug, Clone)]
pub struct TrainEvalReport {
    pub train: TrainReport,
    pub evals: Vec<EvalReport>,
}

#[derive(Debug, Clone)]
pub struct EvalReport {
    pub global_step: i64,
    pub steps: u64,
    /// The real examples evaluated (a padded last batch counts its real rows).
    pub examples: u64,
    pub loss: f64,
    /// Metric name and value, in program order.
    pub metrics: Vec<(String, f64)>,
}

#[derive(Debug, Clone)]
pub struct PredictReport {
    pub examples: u64,
    pub files: Vec<PathBuf>,
}

/// The run's device (opened on first use) and what was compiled for it.
struct Dev {
    device: Box<dyn Device>,
    train: Option<TrainExe>,
    runs: Vec<(SectionKind, RunExe)>,
}

/// The train summaries of one step: scalars and encoded images, by tag.
#[derive(Default)]
struct Summaries {
    scalars: Vec<(String, f32)>,
    images: Vec<(String, summary::Image)>,
}

/// Where the runtime's log lines go.
pub type LogFn = Box<dyn FnMut(&str) + Send>;

/// A program's estimator, ready to run.
pub struct Estimator {
    pub info: EstimatorInfo,
    pub model_dir: PathBuf,
    base: PathBuf,
    program_hash: String,
    /// The checked graphs, shared so that a run borrows them without copying.
    graphs: Vec<Arc<Compiled>>,
    target: Target,
    threads: usize,
    wafer: Option<crate::backend::wafer::fabric::Fabric>,
    /// The device running this estimator's graphs; it holds the variables.
    dev: Option<Dev>,
    step: i64,
    seed: u64,
    input_position: u64,
    cache_dir: Option<PathBuf>,
    skipped_records: u64,
    ready: bool,
    hooks: Vec<Box<dyn RunHook>>,
    reducers: FxHashMap<String, ReducerFactory>,
    last_checkpoint: Option<PathBuf>,
    /// The train summaries' event file, kept across calls of `train` (the stretches of
    /// train-and-evaluate write one file, as one run).
    train_events: Option<summary::EventWriter>,
    /// Whether training runs inside train-and-evaluate (whose hooks then run).
    evaluating: bool,
    /// What was checked of the last checkpoint saved or restored (for E0902's help).
    last_checked: Option<health::Checked>,
    /// The loss of the last train step.
    last_loss: Option<f64>,
    /// The most shards any run that trained the current state used (recorded in
    /// checkpoints to bound their input position).
    max_shards: u64,
    /// The lock of `model_dir`, while training holds it.
    lock: Option<model_dir::Lock>,
    /// The checkpoint steps of `model_dir` when the state was last read or saved
    /// (`None` before): a training run that finds them changed reads the state again.
    seen: Option<Vec<i64>>,
    /// Damaged checkpoints a restore without the lock skipped, to set aside once the
    /// lock is held.
    damaged_seen: Vec<checkpoint::Found>,
    /// Warnings of the runs so far (`take_warnings`).
    warnings: Vec<Diag>,
    /// The ranks of the data-parallel run this estimator is one of (`join`).
    group: Option<crate::dist::Group>,
    /// The ranks it was checked for.
    ranks: u64,
    /// Log lines (restores, checkpoints, summaries) go here; `None` is silent.
    pub log: Option<LogFn>,
}

impl Estimator {
    /// Checks the program for the target and prepares its estimator.
    pub fn new(program: &Program, opts: &RunOptions) -> Res<Estimator> {
        let copts = crate::CheckOptions {
            target: opts.target,
            estimator: opts.estimator.clone(),
            config: opts.config.clone(),
            memory_limit: opts.memory_limit,
            fabric: opts.wafer.clone(),
            ranks: opts.ranks.max(1),
            ..Default::default()
        };
        let checked = crate::check(program, &copts);
        if checked.has_errors() {
            return Err(RunFailure {
                diags: checked.diags,
            });
        }
        let root_file = program.sources.get(program.root_module().file);
        let root_span = Span {
            file: program.root_module().file,
            lo: 0,
            hi: 0,
        };
        let info = match (&opts.estimator, checked.estimators.as_slice()) {
            (_, [one]) => one.clone(),
            (Some(name), all) => {
                all.iter()
                    .find(|e| &e.name == name)
                    .cloned()
                    .ok_or_else(|| {
                        Diag::new(
                            Code::UnknownName,
                            root_span,
                            format!("no estimator `{name}`"),
                        )
                        .label("in this program")
                    })?
            }
            (None, []) => {
                return Err(
                    Diag::new(Code::UnknownName, root_span, "the program has no estimator")
                        .label("in this program")
                        .help("add an `estimator` item naming the model and its inputs")
                        .into(),
                )
            }
            (None, all) => {
                let names: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
                return Err(Diag::new(
                    Code::UnknownName,
                    all[0].span,
                    format!("the program has {} estimators; choose one", all.len()),
                )
                .label("one of them")
                .help(format!(
                    "pass `--estimator NAME` with one of: {}",
                    names.join(", ")
                ))
                .into());
            }
        };
        let base = opts.data_dir.clone().unwrap_or_else(|| {
            Path::new(&root_file.name)
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default()
        });
        let model_dir = opts
            .model_dir
            .clone()
            .or_else(|| info.model_dir.as_ref().map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(format!("runs/{}", info.name)));
        let mut h = FNV_OFFSET;
        for (_, f) in program.sources.files() {
            h = fnv1a(h, f.text.as_bytes());
        }
        for (k, v) in &info.params {
            h = fnv1a(h, format!("{k}={v}").as_bytes());
        }
        let graphs: Vec<Arc<Compiled>> = checked
            .graphs
            .into_iter()
            .filter(|c| c.estimator == info.name)
            .map(Arc::new)
            .collect();
        // The program's own hooks (`hooks = [...]` with std.hooks).
        let mut hooks: Vec<Box<dyn RunHook>> = Vec::new();
        for h in &info.hooks {
            let arg = |k: &str| h.args.iter().find(|a| a.0 == k).map_or(0, |a| a.1);
            match h.kind {
                "logging_hook" => hooks.push(Box::new(hooks::Logging(arg("every_n_steps")))),
                "stop_at_step_hook" => hooks.push(Box::new(hooks::StopAtStep(arg("last_step")))),
                "early_stopping" => hooks.push(Box::new(hooks::EarlyStopping::new(
                    h.string("monitor"),
                    arg("patience").max(1) as u64,
                    h.float("min_delta"),
                    resolved_mode(h, &graphs),
                    arg("min_steps"),
                ))),
                "keep_best" => hooks.push(Box::new(hooks::KeepBest::new(
                    h.string("monitor"),
                    resolved_mode(h, &graphs),
                ))),
                // NaN and Inf losses always stop training (E0902).
                _ => {}
            }
        }
        Ok(Estimator {
            seed: info
                .config
                .random_seed
                .map_or_else(fresh_seed, |s| s as u64),
            info,
            model_dir,
            base: if base.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                base
            },
            program_hash: format!("{h:016x}"),
            graphs,
            target: opts.target,
            threads: (opts.threads).map_or_else(backend::pool::default_threads, |n| {
                n.clamp(1, backend::pool::MAX_THREADS)
            }),
            wafer: opts.wafer.clone(),
            dev: None,
            step: 0,
            input_position: 0,
            cache_dir: opts.cache_dir.clone(),
            skipped_records: 0,
            ready: false,
            hooks,
            reducers: FxHashMap::default(),
            last_checkpoint: None,
            train_events: None,
            evaluating: false,
            last_checked: None,
            last_loss: None,
            max_shards: 1,
            lock: None,
            seen: None,
            damaged_seen: Vec::new(),
            warnings: Vec::new(),
            group: None,
            ranks: opts.ranks.max(1),
            log: None,
        })
    }

    fn say(&mut self, s: &str) {
        if let Some(l) = &mut self.log {
            l(s);
        }
    }

    fn io_diag(&self, m: String) -> Diag {
        Diag::new(Code::RunIo, self.info.span, m).label("this estimator")
    }

    /// Where the run's checkpoints, summaries and predictions go.
    pub fn model_dir(&self) -> &std::path::Path {
        &self.model_dir
    }

    pub fn global_step(&self) -> i64 {
        self.step
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The current value of every variable (weights and optimiser slots), read out of
    /// the device (empty before the first restore or initialisation).
    pub fn variables(&self) -> FxHashMap<String, Tensor> {
        self.dev
            .as_ref()
            .map(|d| d.device.variables())
            .unwrap_or_default()
    }

    /// Replaces a variable's value (a warm start, or a test's fixed starting point).
    /// Call after `restore_or_init`; the value must have the variable's type.
    pub fn set_variable(&mut self, name: &str, value: Tensor) -> Res<()> {
        let old = self.dev.as_ref().and_then(|d| d.device.variable(name));
        match old {
            Some(old) if old.ty() == value.ty() => {
                let held = match &mut self.dev {
                    Some(d) => d.device.set_variable(name, value),
                    None => Ok(()),
                };
                held.map_err(|m| self.too_large(m).into())
            }
            Some(old) => Err(Diag::new(
                Code::CheckpointMismatch,
                self.info.span,
                format!("`{name}` is {}, not {}", old.ty(), value.ty()),
            )
            .label("this estimator")
            .into()),
            None => Err(Diag::new(
                Code::UnknownName,
                self.info.span,
                format!("no variable `{name}`"),
            )
            .label("this estimator")
            .into()),
        }
    }

    /// The device, opened for the run's target on first use (E0908 for a target
    /// this build cannot run).
    fn dev(&mut self) -> Res<&mut Dev> {
        if self.dev.is_none() {
            let device = match (self.target, &self.wafer) {
                (Target::Wafer, Some(f)) => backend::open_wafer(f.clone()),
                _ => backend::open(self.target, self.info.span, self.threads)?,
            };
            self.dev = Some(Dev {
                device,
                train: None,
                runs: Vec::new(),
            });
        }
        Ok(self.dev.as_mut().expect("opened"))
    }

    /// Binds a fresh state (initialised or restored) to the device.
    fn bind(&mut self, vars: FxHashMap<String, Tensor>) -> Res<()> {
        let held = self.dev()?.device.bind(vars);
        held.map_err(|m| self.too_large(m).into())
    }

    /// E0602 for variables the device cannot hold.
    fn too_large(&self, m: String) -> Diag {
        Diag::new(
            Code::OutOfMemory,
            self.info.span,
            format!("the variables do not fit in the device's memory: {m}"),
        )
        .label("this estimator")
        .help("make the model smaller; `estc check` estimates the memory a program needs")
    }

    /// The train step, compiled on first use.
    fn train_exe(&mut self, c: &Arc<Compiled>) -> Res<TrainExe> {
        let at = self.info.span;
        let dev = self.dev()?;
        if let Some(e) = dev.train {
            return Ok(e);
        }
        let e = crate::diag::timed("compile train", || {
            dev.device.compile_train(c.graph.clone(), at)
        })?;
        dev.train = Some(e);
        Ok(e)
    }

    /// A mode's executable computing `targets`, compiled on first use.
    fn run_exe(
        &mut self,
        c: &Arc<Compiled>,
        mode: SectionKind,
        targets: &[NodeIndex],
    ) -> Res<RunExe> {
        let at = self.info.span;
        let dev = self.dev()?;
        if let Some((_, e)) = dev.runs.iter().find(|r| r.0 == mode) {
            return Ok(*e);
        }
        let e = dev
            .device
            .compile_run(c.graph.clone(), targets.to_vec(), at)?;
        dev.runs.push((mode, e));
        Ok(e)
    }

    pub fn graph(&self, mode: SectionKind) -> Option<&Graph> {
        self.compiled(mode).map(|c| &*c.graph)
    }

    fn compiled(&self, mode: SectionKind) -> Option<&Arc<Compiled>> {
        self.graphs.iter().find(|c| c.mode == mode)
    }

    /// Registers a user hook. The wafer runs whole loops on the device and refuses them.
    pub fn add_hook(&mut self, hook: Box<dyn RunHook>) -> Res<()> {
        if self.target == Target::Wafer {
            return Err(Diag::new(Code::HooksOnWafer, self.info.span, "the wafer target does not run user hooks")
                .label("this estimator")
                .help("use --target interp or host to run hooks, or rely on summaries and checkpoints at loop boundaries")
                .into());
        }
        self.hooks.push(hook);
        Ok(())
    }

    /// Registers an observer of the run (a progress display): a hook that only watches.
    /// Unlike user hooks it is allowed on every target; on the wafer it would see the
    /// steps of a loop when the loop returns.
    pub fn add_observer(&mut self, hook: Box<dyn RunHook>) {
        self.hooks.push(hook);
    }

    /// Registers a custom reducer for `std.metrics.reducer(name, ...)` metrics.
    pub fn register_reducer(&mut self, name: &str, f: ReducerFactory) {
        self.reducers.insert(name.to_string(), f);
    }

    fn reducer(&self, name: &str, span: Span) -> Res<Box<dyn Reducer>> {
        let f = self
            .reducers
            .get(name)
            .cloned()
            .or_else(|| metrics::builtin(name))
            .ok_or_else(|| {
                Diag::new(
                    Code::UnknownName,
                    span,
                    format!("no reducer named `{name}` is registered"),
                )
                .label("this metric")
                .help("register it with `Estimator::register_reducer` before evaluating")
            })?;
        Ok(f())
    }

    /// Every variable of every graph, with its initialiser and type.
    fn all_variables(&self) -> Vec<(String, crate::ir::Init, TensorType)> {
        let mut seen = FxHashSet::default();
        let mut out = Vec::new();
        for c in &self.graphs {
            for n in c.graph.g.node_indices() {
                let node = c.graph.node(n);
                if let Op::Variable { name, init, .. } = &node.op {
                    if seen.insert(name.clone()) {
                        out.push((name.clone(), init.clone(), node.ty.clone()));
                    }
                }
            }
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn input(&self, mode: SectionKind) -> Res<(Arc<Compiled>, Dataset)> {
        let c = self.compiled(mode).cloned().ok_or_else(|| {
            Diag::new(
                Code::InvalidEstimator,
                self.info.span,
                format!("the model has no {} section", mode_name(mode)),
            )
            .label("this estimator")
        })?;
        let ds = c.input.clone().ok_or_else(|| {
            Diag::new(
                Code::InvalidEstimator,
                self.info.span,
                format!("the estimator has no input for {}", mode_name(mode)),
            )
            .label("this estimator")
        })?;
        Ok((c, ds))
    }

    /// How this estimator runs a mode's input pipeline: the run seed, the cache
    /// directory, and `input_workers` for training (evaluation and prediction read
    /// their input once, with one worker, so that every element counts once).
    pub fn pipe_options(&self, mode: SectionKind) -> PipeOptions {
        let mut o = PipeOptions::new(self.seed, &self.base);
        if mode == SectionKind::Train {
            o.workers = self.info.config.input_workers.max(1) as usize;
        }
        let (rank, ranks) = self.rank();
        if ranks > 1 {
            // this rank computes its own elements of each group and passes over the rest
            let per_rank = match mode {
                SectionKind::Predict => 1,
                _ => self.info.config.num_shards.max(1) as usize,
            };
            o.share = Some(pipeline::Share {
                rank,
                ranks,
                per_rank,
            });
        }
        if let Some(d) = &self.cache_dir {
            o.cache_dir = d.clone();
        }
        o
    }

    /// Starts a mode's pipeline, after checking its files.
    fn start_pipeline(&self, ds: &Dataset, mode: SectionKind) -> Res<Pipeline> {
        Ok(Pipeline::new(ds, &self.pipe_options(mode))?)
    }

    /// Counts the damaged records a finished pipeline skipped, and says so.
    fn note_skipped(&mut self, pipe: &Pipeline) {
        let n = pipe.skipped();
        if n > 0 {
            self.skipped_records += n;
            self.say(&format!(
                "skipped {n} damaged input record(s) (skip_corrupt, skip_invalid)"
            ));
        }
    }

    /// Damaged input records skipped so far by this estimator's pipelines.
    pub fn skipped_records(&self) -> u64 {
        self.skipped_records
    }

    /// The input dataset of a mode, as elaborated.
    pub fn input_dataset(&self, mode: SectionKind) -> Res<Dataset> {
        Ok(self.input(mode)?.1)
    }

    /// The input pipeline of a mode, started from its beginning with the run seed (as
    /// `estc perf-input` runs it), with the names of its element's leaves.
    pub fn input_pipeline(&self, mode: SectionKind) -> Res<(Pipeline, Vec<String>)> {
        let (_, ds) = self.input(mode)?;
        let names = pipeline::leaf_paths(ds.elem());
        Ok((self.start_pipeline(&ds, mode)?, names))
    }

    fn feeds(names: &[String], batch: pipeline::Element) -> Feeds {
        names.iter().cloned().zip(batch).collect()
    }

    /// The train graph's summaries (`Role::Summary`: the regularisation loss) on one
    /// batch, before the step that batch feeds, as TensorFlow computes them with the
    /// step: by the device, or on the wafer by the interpreter from the variables the
    /// wafer holds (its layouts are of whole train steps).
    fn train_summaries(&mut self, c: &Arc<Compiled>, feeds: &Feeds) -> Res<Summaries> {
        let outs: Vec<(String, NodeIndex)> = c.graph.outputs_with(Role::Summary);
        if outs.is_empty() {
            return Ok(Summaries::default());
        }
        let targets: Vec<NodeIndex> = outs.iter().map(|o| o.1).collect();
        let ctx = StepCtx {
            step: self.step,
            seed: self.seed,
        };
        let at = self.info.span;
        let values = if self.target == Target::Wafer {
            let mut interp: Box<dyn Device> = Box::new(crate::backend::interp::Device::default());
            interp
                .bind(self.variables())
                .map_err(|m| Diag::new(Code::RunFailed, at, m))?;
            let exe = interp.compile_run(c.graph.clone(), targets, at)?;
            interp.run(exe, feeds.clone(), ctx, 0)
        } else {
            let exe = self.run_exe(c, SectionKind::Train, &targets)?;
            self.dev()?.device.run(exe, feeds.clone(), ctx, 0)
        }
        .map_err(|e| {
            run_diag(
                e,
                &format!("the summaries at global step {}", self.step + 1),
            )
        })?;
        let mut out = Summaries::default();
        for ((name, _), t) in outs.into_iter().zip(values) {
            if t.shape().is_empty() {
                out.scalars.push((name, t.scalar() as f32));
                continue;
            }
            // [n, height, width, channels]: `name/image/i`, as TensorFlow tags them
            let s = t.shape().to_vec();
            let (n, h, w, ch) = (s[0], s[1], s[2], s[3]);
            let scale = if t.dtype.is_float() { 255.0 } else { 1.0 };
            let px: Vec<u8> = (t.to_f64().iter())
                .map(|v| (v * scale).round().clamp(0.0, 255.0) as u8)
                .collect();
            let per = h * w * ch;
            for i in 0..n {
                let tag = if n == 1 {
                    format!("{name}/image")
                } else {
                    format!("{name}/image/{i}")
                };
                let im = summary::Image::encode(
                    h as u32,
                    w as u32,
                    ch as u32,
                    &px[i * per..(i + 1) * per],
                )
                .map_err(|m| {
                    self.io_diag(format!("cannot encode the image summary `{name}`: {m}"))
                })?;
                out.images.push((tag, im));
            }
        }
        Ok(out)
    }

    /// The train steps of `epochs` passes over the train input's examples (before its
    /// `repeat`), for `--epochs`, with how they were counted: whole batches of one pass
    /// when the input batches before its `repeat`, else the examples of all passes in
    /// batches; divided by the shards a step reads. The size is read
    /// from the source (a `range`, a counted `synthetic`, the rows of a CSV or lines
    /// of a text file, a `.npy`'s first dimension, `take` and `skip`); E0510 when it
    /// cannot be known before the run (a `filter`, a TFRecord or PNG source).
    pub fn epoch_steps(&self, epochs: u64) -> Res<(u64, String)> {
        use crate::elab::data::StageKind as K;
        let (_, ds) = self.input(SectionKind::Train)?;
        let unknown = |why: String| -> RunFailure {
            Diag::new(
                Code::InvalidEstimator,
                ds.span(),
                format!("the train input's size is not known before the run: {why}"),
            )
            .label("this input")
            .help("give the steps instead: `--steps N` (an epoch is the examples divided by the global batch)")
            .into()
        };
        let count_lines = |path: &str, header: bool| -> Res<u64> {
            let p = self.base.join(path);
            let text = std::fs::read(&p)
                .map_err(|e| self.io_diag(format!("cannot read {}: {e}", p.display())))?;
            let lines = text
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty() && *l != b"\r")
                .count() as u64;
            Ok(lines.saturating_sub(u64::from(header)))
        };
        let mut n: Option<u64> = None;
        let mut batch: Option<(u64, bool)> = None;
        let mut how = String::new();
        let mut repeated = false;
        let mut batch_after = false;
        for s in &ds.stages {
            // after the `repeat`, only stages that keep every element may come
            if repeated {
                match &s.kind {
                    K::Batch { .. } => batch_after = true,
                    K::Map { .. }
                    | K::Parse { .. }
                    | K::Shuffle { .. }
                    | K::Cache { .. }
                    | K::Prefetch { .. } => continue,
                    k => {
                        return Err(unknown(format!(
                            "a `{}` after the `repeat` changes what a pass is",
                            k.name()
                        )))
                    }
                }
            }
            match &s.kind {
                K::Range { n: r } => n = Some((*r).max(0) as u64),
                K::Slices { rows } => n = Some(rows.len() as u64),
                K::Synthetic { count: Some(c), .. } => n = Some(*c as u64),
                K::Csv { path, header, .. } => {
                    n = Some(count_lines(path, *header)?);
                    how = format!(" (the rows of {path})");
                }
                K::Text { path } => {
                    n = Some(count_lines(path, false)?);
                    how = format!(" (the lines of {path})");
                }
                K::Npy { path, .. } => {
                    let p = self.base.join(path);
                    let b = std::fs::read(&p)
                        .map_err(|e| self.io_diag(format!("cannot read {}: {e}", p.display())))?;
                    let (_, shape, _) = crate::data::records::npy_header(&b)
                        .map_err(|m| self.io_diag(format!("{}: {m}", p.display())))?;
                    n = Some(shape.first().copied().unwrap_or(0) as u64);
                    how = format!(" (the rows of {path})");
                }
                K::Take { n: t } => n = n.map(|x| x.min(*t as u64)),
                K::Skip { n: k } => n = n.map(|x| x.saturating_sub(*k as u64)),
                K::Shard { n: k, index } => {
                    n = n.map(|x| x / *k as u64 + u64::from((*index as u64) < x % *k as u64))
                }
                K::Filter { .. } => {
                    return Err(unknown("a `filter` drops an unknown number".into()))
                }
                K::Zip { .. } | K::Interleave { .. } => {
                    return Err(unknown(format!("`{}` combines sources", s.kind.name())))
                }
                K::Batch {
                    size,
                    drop_remainder,
                    ..
                } => batch = Some((*size as u64, *drop_remainder)),
                K::Repeat { .. } => repeated = true,
                K::TfRecord { .. } | K::Png { .. } | K::Synthetic { count: None, .. } => {
                    return Err(unknown(format!(
                        "a `{}` source is not counted",
                        s.kind.name()
                    )))
                }
                _ => {}
            }
        }
        let (Some(n), Some((b, drop))) = (n, batch) else {
            return Err(unknown("it has no size or no batch".into()));
        };
        // (a step reads a batch per shard of every rank)
        let shards = self.info.config.num_shards.max(1) as u64 * self.rank().1 as u64;
        // a pass's batches end with it when it batches first; else batches run on
        let batches = if batch_after {
            epochs.saturating_mul(n) / b
        } else {
            epochs.saturating_mul(if drop { n / b } else { n.div_ceil(b) })
        };
        let steps = batches / shards;
        if steps == 0 {
            return Err(unknown(format!(
                "{epochs} passes over {n} examples make no step of {shards} batches of {b}"
            )));
        }
        Ok((
            steps,
            format!(
                "{epochs} epoch{} of {n} examples{how} in batches of {b}{}",
                if epochs == 1 { "" } else { "s" },
                if shards > 1 {
                    format!(" on {shards} shards")
                } else {
                    String::new()
                }
            ),
        ))
    }

    /// Pulls one batch per shard (of every rank: this rank's are returned); `None`
    /// when the input has ended.
    fn next_batches(
        &mut self,
        pipe: &mut Pipeline,
        shards: usize,
    ) -> Res<Option<Vec<pipeline::Element>>> {
        let (present, mine) = self.read_group(pipe, shards)?;
        if present < shards * self.rank().1 {
            return Ok(None);
        }
        Ok(Some(mine.into_iter().map(|(_, e)| e).collect()))
    }

    /// Train-and-evaluate (`tf.estimator.train_and_evaluate`): trains in stretches of
    /// `every` steps (to the next multiple of `every`), each ending with a checkpoint
    /// that the eval input evaluates (its metrics written to `MODEL_DIR/eval`), until
    /// the last step, the end of the train input, or a hook's `after_eval` asking to
    /// stop (`early_stopping`); `keep_best` keeps the best checkpoint. The hooks'
    /// metrics must be the eval section's or `loss`.
    pub fn train_and_evaluate(&mut self, steps: Steps, every: u64) -> Res<TrainEvalReport> {
        self.locked(|s| s.train_and_evaluate_locked(steps, every))
    }

    fn train_and_evaluate_locked(&mut self, steps: Steps, every: u64) -> Res<TrainEvalReport> {
        self.evaluating = true;
        let r = self.train_and_evaluate_stretches(steps, every);
        self.evaluating = false;
        r
    }

    fn train_and_evaluate_stretches(&mut self, steps: Steps, every: u64) -> Res<TrainEvalReport> {
        let every = i64::try_from(every.max(1)).unwrap_or(i64::MAX);
        self.check_eval_hooks()?;
        self.restore_or_init()?;
        let last = self.last_step(steps);
        let start = self.step;
        let t0 = Instant::now();
        let reduced = self.reduce_seconds();
        let mut evals = Vec::new();
        let mut report: Option<TrainReport> = None;
        let mut stopped: Option<String> = None;
        while self.step < last && stopped.is_none() {
            let to = ((self.step / every).saturating_add(1))
                .saturating_mul(every)
                .min(last);
            let before = self.step;
            let r = self.train(Steps::Max(to as u64))?;
            stopped = r.stopped_early.clone();
            if r.global_step == before {
                // the input ended at the last evaluation's step: nothing new to evaluate
                if let Some(last) = &mut report {
                    last.stopped_early = stopped.clone();
                }
                break;
            }
            let e = self.evaluate(None)?;
            let mut metrics = vec![("loss".to_string(), e.loss)];
            metrics.extend(e.metrics.iter().cloned());
            let shown: Vec<String> = metrics
                .iter()
                .map(|(k, v)| format!("{k} = {v:.6}"))
                .collect();
            crate::diag::log(&format!(
                "eval at global step {}: {}",
                e.global_step,
                shown.join(", ")
            ));
            let info = EvalInfo {
                global_step: e.global_step,
                metrics,
                checkpoint: self.last_checkpoint.clone().unwrap_or_default(),
                model_dir: self.model_dir.clone(),
            };
            let mut stop = false;
            for h in &mut self.hooks {
                stop |= h.after_eval(&info) == Action::Stop;
            }
            if stop && stopped.is_none() {
                stopped = Some(format!(
                    "a hook stopped training after the evaluation at global step {}",
                    e.global_step
                ));
            }
            evals.push(e);
            report = Some(r);
        }
        let secs = t0.elapsed().as_secs_f64();
        let train = match report {
            Some(r) => TrainReport {
                start_step: start,
                steps_per_sec: (self.step - start) as f64 / secs.max(1e-9),
                seconds: secs,
                stopped_early: stopped,
                allreduce_seconds: self.reduce_seconds() - reduced,
                ..r
            },
            None => TrainReport {
                start_step: start,
                global_step: self.step,
                final_loss: self.last_loss.unwrap_or(f64::NAN),
                steps_per_sec: 0.0,
                seconds: secs,
                stopped_early: None,
                checkpoint: self.last_checkpoint.clone(),
                allreduce_seconds: 0.0,
            },
        };
        Ok(TrainEvalReport { train, evals })
    }

    /// Every metric an evaluation hook watches is the eval section's, or `loss`
    /// (E0201 naming the ones there are).
    fn check_eval_hooks(&self) -> Res<()> {
        let eval = self.graphs.iter().find(|c| c.mode == SectionKind::Eval);
        let names: Vec<String> = eval.map_or_else(Vec::new, |c| {
            c.graph.metrics.iter().map(|m| m.name.clone()).collect()
        });
        for h in &self.info.hooks {
            if !matches!(h.kind, "early_stopping" | "keep_best") {
                continue;
            }
            let m = h.string("monitor");
            if resolved_mode(h, &self.graphs) == "auto" && names.iter().any(|n| n == m) {
                return Err(Diag::new(Code::InvalidEstimator, h.span, format!("`{}` cannot tell which way `{m}` improves", h.kind))
                    .label("mode \"auto\"")
                    .help("`mode: \"auto\"` knows the loss and the built-in metrics (accuracy, AUC, precision, recall up; errors down); for a `mean` or a custom reducer, say `mode: \"max\"` or `mode: \"min\"`")
                    .into());
            }
            if m != "loss" && !names.iter().any(|n| n == m) {
                let mut there = vec!["`loss`".to_string()];
                there.extend(names.iter().map(|n| format!("`{n}`")));
                let mut d = Diag::new(
                    Code::UnknownName,
                    h.span,
                    format!(
                        "`{}` watches the metric `{m}`, which the eval section does not report",
                        h.kind
                    ),
                )
                .label("no such metric")
                .help(format!("the evaluation reports {}", there.join(", ")));
                if let Some(s) =
                    crate::diag::did_you_mean(m, names.iter().map(String::as_str).chain(["loss"]))
                {
                    d = d.help(format!(
                        "did you mean `{s}`? the evaluation reports {}",
                        there.join(", ")
                    ));
                }
                return Err(d.into());
            }
        }
        Ok(())
    }

    /// Trains: restores or initialises, then runs loops of steps until the last step,
    /// the end of the input, or a hook's request to stop.
    pub fn train(&mut self, steps: Steps) -> Res<TrainReport> {
        if !self.evaluating {
            if let Some(h) = self
                .info
                .hooks
                .iter()
                .find(|h| matches!(h.kind, "early_stopping" | "keep_best"))
            {
                let d = Diag::new(Code::UnusedValue, h.span, format!("`{}` watches evaluations, and this run trains without any", h.kind))
                    .label("never runs")
                    .help("evaluate while training: `estc train --eval-every N`, the estimator's `eval_every`, or `Estimator::train_and_evaluate`");
                self.warn(d);
            }
        }
        self.locked(|s| s.train_locked(steps))
    }

    /// The global step a run of `steps` trains to, from the restored step.
    fn last_step(&self, steps: Steps) -> i64 {
        match steps {
            Steps::Default => self
                .info
                .train_steps
                .unwrap_or(self.step.saturating_add(1000)),
            Steps::Add(n) => self
                .step
                .saturating_add(i64::try_from(n).unwrap_or(i64::MAX)),
            Steps::Max(n) => i64::try_from(n).unwrap_or(i64::MAX),
        }
    }

    fn train_locked(&mut self, steps: Steps) -> Res<TrainReport> {
        self.restore_or_init()?;
        let (c, ds) = self.input(SectionKind::Train)?;
        let last = self.last_step(steps);
        let start = self.step;
        let cfg = self.info.config.clone();
        let shards = cfg.num_shards.max(1) as usize;
        self.max_shards = self.max_shards.max((shards * self.rank().1) as u64);
        // (a rank that cannot start tells the others, waiting in the first step)
        let exe = self.train_exe(&c).inspect_err(|_| self.tell_failure())?;
        let names = evaluate::input_names(&c.graph);
        // (passing over the elements a resumed run's steps read: say so, and how long
        // it took when it was long, instead of a silent wait)
        let resumed_at = Instant::now();
        if self.input_position > 0 {
            self.say(&format!(
                "resuming the train input at element {} (passing over what {} steps read)",
                self.input_position, self.step
            ));
        }
        let mut pipe = Pipeline::new_at(
            &ds,
            &self.pipe_options(SectionKind::Train),
            self.input_position,
        )
        .map_err(|d| {
            self.tell_failure();
            RunFailure::from(d)
        })?;
        if resumed_at.elapsed() > Duration::from_secs(1) {
            self.say(&format!(
                "the train input resumed in {:.1} s",
                resumed_at.elapsed().as_secs_f64()
            ));
        }
        let mut summaries = self.train_events.take();
        for h in &mut self.hooks {
            h.begin(start, last);
        }
        let t0 = Instant::now();
        let reduced = self.reduce_seconds();
        let mut loop_t = Instant::now();
        let mut loop_start = self.step;
        let mut final_loss = f64::NAN;
        let mut lr = 0.0;
        let mut stopped = None;
        let ipl = cfg.iterations_per_loop.max(1);
        let crossed = |every: i64, from: i64, to: i64| every > 0 && to / every > from / every;
        let mut extra: Summaries;
        while self.step < last && stopped.is_none() {
            // One loop: up to `iterations_per_loop` steps without a round trip.
            let loop_end = self.step.saturating_add(ipl).min(last);
            // (the summaries of this loop's last step, when it gets there)
            extra = Summaries::default();
            while self.step < loop_end {
                for h in &mut self.hooks {
                    h.before_step(self.step);
                }
                let next = match self.next_batches(&mut pipe, shards) {
                    Ok(n) => n,
                    Err(f) => {
                        self.tell_failure();
                        return Err(self.keep_progress(f, start));
                    }
                };
                let Some(batches) = next else {
                    stopped = Some(format!(
                        "the train input ended at global step {}",
                        self.step
                    ));
                    break;
                };
                // the summaries of the loop's last step, when it writes them
                let step_end = self.step + 1;
                if step_end == loop_end
                    && self.chief()
                    && (crossed(cfg.save_summary_steps, loop_start, step_end) || step_end == last)
                {
                    let feeds = Self::feeds(&names, batches[0].clone());
                    extra = self.train_summaries(&c, &feeds)?;
                }
                let (loss, rate) = match self.train_step(exe, &names, batches) {
                    Ok(x) => x,
                    // Bad data in a batch (a label out of range, an index a gather
                    // cannot take) leaves the variables of the last step intact: keep
                    // them. A NaN or infinity may come from weights already diverging,
                    // so E0902 saves nothing (its help says what the last checkpoint
                    // holds).
                    Err(f) if f.diags.iter().any(|d| d.code == Code::NonFiniteLoss) => {
                        return Err(f)
                    }
                    Err(f) => return Err(self.keep_progress(f, start)),
                };
                self.input_position = pipe.position;
                final_loss = loss;
                self.last_loss = Some(loss);
                lr = rate;
                let info = StepInfo {
                    global_step: self.step,
                    loss,
                    learning_rate: rate,
                    last_step: last,
                    steps_per_sec: (self.step - start) as f64
                        / t0.elapsed().as_secs_f64().max(1e-9),
                };
                let mut stop = false;
                for h in &mut self.hooks {
                    stop |= h.after_step(&info) == Action::Stop;
                }
                if stop {
                    stopped = Some(format!(
                        "a hook stopped training at global step {}",
                        self.step
                    ));
                    break;
                }
            }
            // Loop boundary: summaries and checkpoints.
            let secs = loop_t.elapsed().as_secs_f64().max(1e-9);
            let rate = (self.step - loop_start) as f64 / secs;
            loop_t = Instant::now();
            if (crossed(cfg.save_summary_steps, loop_start, self.step) || self.step == last)
                && self.chief()
            {
                let w = match &mut summaries {
                    Some(w) => w,
                    None => {
                        // The run's first event: TensorBoard drops what earlier runs
                        // wrote after the step this run starts from (the steps a
                        // crashed run did after its checkpoint, redone now), and keeps
                        // that step's own summary, which the checkpoint agrees with.
                        let w = summary::EventWriter::create(&self.model_dir)
                            .and_then(|mut w| w.session_start(start + 1).map(|_| w))
                            .map_err(|e| {
                                self.io_diag(format!(
                                    "cannot write summaries in {}: {e}",
                                    self.model_dir.display()
                                ))
                            })?;
                        summaries.insert(w)
                    }
                };
                let mut scalars = vec![
                    ("loss", final_loss as f32),
                    ("learning_rate", lr as f32),
                    ("global_step/sec", rate as f32),
                ];
                scalars.extend(extra.scalars.iter().map(|(k, v)| (k.as_str(), *v)));
                w.scalars(self.step, &scalars)
                    .and_then(|_| w.images(self.step, &extra.images))
                    .map_err(|e| self.io_diag(format!("cannot write summaries: {e}")))?;
            }
            let at_end = self.step >= last || stopped.is_some();
            if (crossed(cfg.save_checkpoint_steps, loop_start, self.step) || at_end)
                && self.step > start
            {
                self.save_checkpoint()?;
            }
            loop_start = self.step;
        }
        for h in &mut self.hooks {
            h.end(self.step);
        }
        self.train_events = summaries;
        let secs = t0.elapsed().as_secs_f64();
        self.note_skipped(&pipe);
        Ok(TrainReport {
            start_step: start,
            global_step: self.step,
            final_loss,
            steps_per_sec: (self.step - start) as f64 / secs.max(1e-9),
            seconds: secs,
            stopped_early: stopped,
            checkpoint: self.last_checkpoint.clone(),
            allreduce_seconds: self.reduce_seconds() - reduced,
        })
    }

    /// After the input (or a step, on bad data) failed in the middle of training: saves
    /// a checkpoint of the last complete step (with the input position of the elements
    /// it used), so the work done is not lost, and says so in the failure's help.
    fn keep_progress(&mut self, mut f: RunFailure, start: i64) -> RunFailure {
        if self.step <= start {
            return f;
        }
        let note = match self.save_checkpoint() {
            Ok(p) => format!(
                "training stopped after global step {}; its checkpoint {} keeps the work done, and the next run resumes from it",
                self.step,
                p.display()
            ),
            Err(_) => format!("training stopped after global step {}", self.step),
        };
        if let Some(d) = f.diags.first_mut() {
            d.help = Some(match d.help.take() {
                Some(h) => format!("{h}; {note}"),
                None => note,
            });
        }
        f
    }

    /// One replicated train step; returns (mean loss, learning rate).
    fn train_step(
        &mut self,
        exe: TrainExe,
        names: &[String],
        batches: Vec<pipeline::Element>,
    ) -> Res<(f64, f64)> {
        let feeds: Vec<Feeds> = batches.into_iter().map(|b| Self::feeds(names, b)).collect();
        let ctx = StepCtx {
            step: self.step,
            seed: self.seed,
        };
        let next = self.step + 1;
        self.dev()?;
        let mut alone = backend::Alone;
        let peers: &mut dyn backend::Peers = match &mut self.group {
            Some(g) => g,
            None => &mut alone,
        };
        let stepped = match &mut self.dev {
            Some(d) => d.device.train_step(exe, feeds, ctx, peers),
            None => return Err(self.io_diag("no device to run the step on".into()).into()),
        };
        match stepped {
            Ok(out) => {
                self.step = out.next_step.unwrap_or(next);
                Ok((out.loss, out.learning_rate))
            }
            Err(StepError::Run { shard, error }) => {
                let when = match shard {
                    Some(s) => format!("at global step {next} (shard {s})"),
                    None => format!("at global step {next}"),
                };
                Err(run_diag(error, &when))
            }
            Err(StepError::NonFinite {
                bad,
                index,
                value,
                span,
            }) => Err(
                health::diag(&bad, (index, value), next, span, self.last_checked.as_ref()).into(),
            ),
            Err(StepError::Peer { replica }) => {
                Err(self.rank_failed(replica, &format!("at global step {next}")))
            }
        }
    }

    /// Smoke run: one train step, a checkpoint saved and restored (compared bit for
    /// bit), one eval step, all in a temporary model directory.
    pub fn smoke(&mut self) -> Res<Vec<String>> {
        let dir = std::env::temp_dir().join(format!(
            "est-smoke-{}-{}",
            std::process::id(),
            fresh_seed() % 100_000
        ));
        let saved_dir = std::mem::replace(&mut self.model_dir, dir.clone());
        let result = self.smoke_in();
        let _ = std::fs::remove_dir_all(&dir);
        self.model_dir = saved_dir;
        self.ready = false;
        self.dev = None;
        self.step = 0;
        result
    }

    fn smoke_in(&mut self) -> Res<Vec<String>> {
        let mut lines = Vec::new();
        self.ready = false;
        self.init_variables()?;
        self.ready = true;
        let r = self.train(Steps::Add(1))?;
        lines.push(format!("train: 1 step, loss {:.6}", r.final_loss));
        let saved = self.variables();
        let step = self.step;
        self.ready = false;
        self.dev = None;
        self.restore_or_init()?;
        if self.variables() != saved || self.step != step {
            return Err(self
                .io_diag("the checkpoint did not restore the saved state".into())
                .into());
        }
        lines.push(format!(
            "checkpoint: saved and restored {} variables at global step {step}",
            saved.len()
        ));
        if self.compiled(SectionKind::Eval).is_some() {
            let e = self.evaluate(Some(1))?;
            let m: Vec<String> = e
                .metrics
                .iter()
                .map(|(k, v)| format!("{k} {v:.4}"))
                .collect();
            lines.push(format!(
                "eval: 1 step, loss {:.6}{}{}",
                e.loss,
                if m.is_empty() { "" } else { ", " },
                m.join(", ")
            ));
        }
        Ok(lines)
    }
}

fn mode_name(m: SectionKind) -> &'static str {
    match m {
        SectionKind::Train => "train",
        SectionKind::Eval => "eval",
        SectionKind::Predict => "predict",
    }
}

/// The diagnostic of an op that failed at run time, `when` being where in the run
/// (`at global step 12`, `in eval batch 3`).
fn run_diag(e: RunError, when: &str) -> RunFailure {
    if e.op == (Op::CheckIndices { depth: 0 }).name() {
        return Diag::new(Code::LabelOutOfRange, e.span, format!("{when}: {}", e.message))
            .label("the labels of this")
            .help("class labels must lie in [0, classes): fix the data (or its `map`), or give the model as many classes as the labels need")
            .into();
    }
    Diag::new(
        Code::RunFailed,
        e.span,
        format!("{} failed {when}: {}", e.op, e.message),
    )
    .label(format!("this {}", e.op))
    .into()
}

/// A seed for runs without `random_seed` (recorded in checkpoints, so a resume keeps it).
fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    fnv1a(u64::from(std::process::id()), &t.to_le_bytes())
}
