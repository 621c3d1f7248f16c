//! Backends: what executes checked graphs. The runtime (the Estimator loop) asks one
//! `Device` for everything it runs and never learns which backend it is:
//!
//! ```text
//! backend::open(target)            a Device for the run's target
//!   .compile_train(graph)           the train step, with its phase split for shards
//!   .compile_run(graph, targets)    an executable computing some values (eval, predict)
//!   .bind(variables)                once, after initialising or restoring: they stay
//!                                   resident in the device and steps update them there
//!   .train_step(exe, batches, ctx, peers)
//!                                   one replicated step: loss, gradients, checks, update
//!   .run(exe, feeds, ctx, shard)    the outputs of one batch
//!   .variables() / .variable(name)  read out, only for checkpoints, hooks and export
//! ```
//!
//! A train step follows one contract on every backend (`TrainSpec` is its analysis of
//! the graph): each shard runs phase A (the loss, the gradients, and the updates that do
//! not depend on a `cross_shard_mean`) on its own batch; the float values of phase A are
//! averaged over the shards, shard 0 first, in shard order, and over the replicas of a
//! data-parallel run (`Peers`: the ranks of an MPI job), replica 0 first, in replica
//! order (`shard_mean`); the loss and every gradient
//! must be finite; phase B applies the optimiser once; every update of a trained
//! variable (or of its optimiser slots) must be finite and every other update free of
//! NaN. The first value that fails a check is `StepError::NonFinite`, and the variables
//! stay as they were before the step.
//!
//! Backends: `interp` (the reference interpreter, the oracle the others are tested
//! against), `host` (native code through LLVM, behind the `llvm` feature), `wafer` (the
//! simulated wafer-scale engine).

#[cfg(feature = "llvm")]
pub mod host;
pub mod interp;
pub mod pool;
pub mod wafer;
pub mod window;

use crate::diag::{Code, Diag};
use crate::elab::Target;
use crate::ir::{Graph, NodeIndex, Op, Role};
use crate::span::Span;
use crate::tensor::Tensor;
use petgraph::visit::NodeIndexable;
use rustc_hash::FxHashMap;
use std::sync::Arc;

/// One batch's inputs, by input name (`features`, `labels`, the padding mask).
pub type Feeds = FxHashMap<String, Tensor>;

/// Where a step is in the run: what random ops draw from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepCtx {
    /// The global step before the step runs.
    pub step: i64,
    /// The run seed.
    pub seed: u64,
}

impl StepCtx {
    /// What the ops of shard `shard` see of the step.
    pub fn op_env(self, shard: usize) -> interp::OpEnv {
        interp::OpEnv {
            step: self.step,
            seed: self.seed,
            shard,
        }
    }
}

/// A compiled train step of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TrainExe(pub usize);

/// A compiled executable of a device computing some of a graph's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunExe(pub usize);

/// What a train step reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepOut {
    /// The loss, averaged over the shards.
    pub loss: f64,
    pub learning_rate: f64,
    /// The global step after the step (the graph's `NextStep` output), when it has one.
    pub next_step: Option<i64>,
}

/// An op that failed on the values it met (an index out of range, a division by zero).
#[derive(Debug, Clone, PartialEq)]
pub struct RunError {
    pub span: Span,
    pub op: &'static str,
    pub message: String,
}

/// What was not finite in a train step.
#[derive(Debug, Clone, PartialEq)]
pub enum Bad {
    Loss,
    /// The gradient of this variable.
    Gradient(String),
    /// The new value of this variable (or optimiser slot).
    Update(String),
}

/// Why a step did not complete. The variables are as they were before it.
#[derive(Debug, Clone, PartialEq)]
pub enum StepError {
    /// An op failed (in this shard's phase A, when there are several).
    Run {
        shard: Option<usize>,
        error: RunError,
    },
    /// The first non-finite value met: what it was, its flat index and value, and
    /// where the program makes it.
    NonFinite {
        bad: Bad,
        index: usize,
        value: f32,
        span: Span,
    },
    /// Another replica's phase A failed (it reports why itself).
    Peer { replica: usize },
}

/// The replicas a train step is averaged with: the ranks of a data-parallel run, each
/// running the same step on its own shards. A device alone has `Alone`.
pub trait Peers {
    /// How many replicas run the step, and this one's index among them.
    fn replicas(&self) -> (usize, usize);

    /// This replica's outcome of phase A, shared with the others: `Some(values)` (its
    /// sum over its shards of phase A's float values, concatenated), which becomes
    /// their sum over every replica, added in replica order; `None` when its phase A
    /// failed. `Err(r)` when replica `r` (the first, in order) failed.
    fn reduce(&mut self, local: Option<&mut [f32]>) -> Result<(), usize>;

    /// Tells the other replicas that this one's phase A failed with `e`, and returns it.
    fn fail(&mut self, e: StepError) -> StepError {
        if self.replicas().0 > 1 {
            let _ = self.reduce(None);
        }
        e
    }
}

/// A device with no other replica.
#[derive(Debug, Clone, Copy, Default)]
pub struct Alone;

impl Peers for Alone {
    fn replicas(&self) -> (usize, usize) {
        (1, 0)
    }

    fn reduce(&mut self, _: Option<&mut [f32]>) -> Result<(), usize> {
        Ok(())
    }
}

/// The mean of phase A's float values over every shard of every replica: `sums[i]`
/// holds this replica's sum of value `i` over its `shards` shards, added in shard
/// order, and becomes the mean. Alone, the sums are only divided (by the shards,
/// when there are several).
pub fn shard_mean(
    peers: &mut dyn Peers,
    sums: &mut [Vec<f32>],
    shards: usize,
) -> Result<(), StepError> {
    let (replicas, _) = peers.replicas();
    let total = shards * replicas;
    if replicas > 1 {
        let mut flat: Vec<f32> = Vec::with_capacity(sums.iter().map(Vec::len).sum());
        for s in sums.iter() {
            flat.extend_from_slice(s);
        }
        peers
            .reduce(Some(&mut flat))
            .map_err(|replica| StepError::Peer { replica })?;
        let mut at = 0;
        for s in sums.iter_mut() {
            let k = s.len();
            s.copy_from_slice(&flat[at..at + k]);
            at += k;
        }
    }
    if total > 1 {
        for s in sums.iter_mut() {
            s.iter_mut().for_each(|x| *x /= total as f32);
        }
    }
    Ok(())
}

/// What a device computes of a mode's graph, phase by phase: the train step's two
/// phases (`TrainSpec`), every output for eval, the predictions for predict.
pub fn phases(
    graph: &Graph,
    mode: crate::syntax::ast::SectionKind,
    at: Span,
) -> Result<Vec<Vec<NodeIndex>>, Diag> {
    use crate::syntax::ast::SectionKind;
    Ok(match mode {
        SectionKind::Train => {
            let spec = TrainSpec::new(graph, at)?;
            vec![spec.a_targets.clone(), spec.b_targets()]
        }
        SectionKind::Eval => vec![graph.outputs.iter().map(|o| o.node).collect()],
        SectionKind::Predict => vec![graph
            .outputs_with(Role::Prediction)
            .into_iter()
            .map(|o| o.1)
            .collect()],
    })
}

/// A backend's executor of one estimator's graphs, holding its variables.
pub trait Device: Send {
    /// Compiles a checked train graph into its train step. `at` is where to point
    /// diagnostics about the whole graph (the estimator).
    fn compile_train(&mut self, graph: Arc<Graph>, at: Span) -> Result<TrainExe, Diag>;

    /// Compiles a checked graph into an executable computing `targets` (`run` returns
    /// their values in this order).
    fn compile_run(
        &mut self,
        graph: Arc<Graph>,
        targets: Vec<NodeIndex>,
        at: Span,
    ) -> Result<RunExe, Diag>;

    /// Binds every variable and optimiser slot, replacing what was bound; an error
    /// when the device cannot hold them.
    fn bind(&mut self, vars: FxHashMap<String, Tensor>) -> Result<(), String>;

    /// Every variable's current value, read out.
    fn variables(&self) -> FxHashMap<String, Tensor>;

    /// One variable's current value, read out.
    fn variable(&self, name: &str) -> Option<Tensor>;

    /// Replaces one bound variable's value (the caller checked its type).
    fn set_variable(&mut self, name: &str, value: Tensor) -> Result<(), String>;

    /// One train step on one batch per shard, averaged with `peers` (see the module's
    /// contract).
    fn train_step(
        &mut self,
        exe: TrainExe,
        batches: Vec<Feeds>,
        ctx: StepCtx,
        peers: &mut dyn Peers,
    ) -> Result<StepOut, StepError>;

    /// The values of a `compile_run` executable on one batch, as shard `shard`.
    fn run(
        &mut self,
        exe: RunExe,
        feeds: Feeds,
        ctx: StepCtx,
        shard: usize,
    ) -> Result<Vec<Tensor>, RunError>;
}

/// Whether `EST_PROFILE` asks devices for their profiles.
pub fn host_profile_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("EST_PROFILE").is_ok_and(|v| !v.is_empty()))
}

/// A device for `target` (E0908 for a target that cannot run programs in this build);
/// the host runs its kernels on `threads` threads (the
/// interpreter, the reference, on one).
pub fn open(target: Target, at: Span, threads: usize) -> Result<Box<dyn Device>, Diag> {
    let _ = threads;
    match target {
        Target::Interp => Ok(Box::new(interp::Device::default())),
        #[cfg(feature = "llvm")]
        Target::Host => Ok(Box::new(host::Device::new(at, threads)?)),
        #[cfg(not(feature = "llvm"))]
        Target::Host => Err(Diag::new(
            Code::NoRuntime,
            at,
            "this estc was built without the host backend (the `llvm` cargo feature)",
        )
        .label("this estimator")
        .help("rebuild with `cargo build --features llvm` (it needs LLVM 19: `scripts/setup.sh` installs it), or run it with `--target interp`")),
        Target::Wafer => Ok(open_wafer(wafer::fabric::Fabric::test32())),
    }
}

/// A wafer device on fabric `f`.
pub fn open_wafer(f: wafer::fabric::Fabric) -> Box<dyn Device> {
    Box::new(wafer::device::Device::new(f))
}

/// The analysis of a train graph every backend's train step follows: its phases, the
/// values averaged over shards, the values checked before anything is applied.
#[derive(Debug, Clone)]
pub struct TrainSpec {
    pub loss: NodeIndex,
    pub learning_rate: NodeIndex,
    pub next_step: Option<NodeIndex>,
    /// Each `cross_shard_mean` node and its operand (whose shard mean it is).
    pub cross: Vec<(NodeIndex, NodeIndex)>,
    /// What phase A computes per shard: the `cross` operands, the loss, the learning
    /// rate and the updates of phase A.
    pub a_targets: Vec<NodeIndex>,
    /// The new value of each variable.
    pub updates: Vec<Update>,
    /// The gradient of each trainable variable (averaged over shards), by its name.
    pub gradients: Vec<(String, NodeIndex)>,
    /// Where the loss is made, and each variable (for `StepError::NonFinite`).
    loss_span: Span,
    spans: FxHashMap<String, Span>,
}

/// The new value of a variable after a train step.
#[derive(Debug, Clone)]
pub struct Update {
    /// The variable (or optimiser slot) it replaces.
    pub name: String,
    pub node: NodeIndex,
    /// Whether phase A makes it (it does not depend on a `cross_shard_mean`).
    pub in_a: bool,
    /// Whether it is a trained weight or one of its optimiser slots, which must stay
    /// finite; the state a model keeps itself (`assign`) may hold an infinity (a
    /// running maximum that starts at -inf), never a NaN.
    pub trained: bool,
}

/// How a checked value must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finite {
    /// No NaN and no infinity.
    All,
    /// No NaN.
    NoNan,
}

impl Finite {
    /// The first element of `t` that is not as wanted: (flat index, value).
    pub fn first_bad(self, t: &Tensor) -> Option<(usize, f32)> {
        match self {
            Finite::All => crate::tensor::first_non_finite(t),
            Finite::NoNan => crate::tensor::first_nan(t),
        }
    }
}

impl TrainSpec {
    /// The spec of a train graph; an error (at `at`) when it has no loss to minimise.
    pub fn new(g: &Graph, at: Span) -> Result<TrainSpec, Diag> {
        let (Some(loss), Some(learning_rate)) =
            (g.output(Role::Loss), g.output(Role::LearningRate))
        else {
            return Err(Diag::new(
                Code::InvalidModel,
                at,
                "the train graph has no loss to minimize",
            )
            .label("this estimator's model")
            .help("write `train { minimize loss with sgd(lr: 0.1) }` in the model"));
        };
        let next_step = g.output(Role::NextStep);
        let cross: Vec<(NodeIndex, NodeIndex)> =
            g.g.node_indices()
                .filter(|&n| matches!(g.node(n).op, Op::CrossShardMean))
                .map(|n| (n, g.operands(n)[0]))
                .collect();
        let mut after = vec![false; g.g.node_bound()];
        for n in g.topo_order() {
            after[n.index()] = matches!(g.node(n).op, Op::CrossShardMean)
                || g.operands(n).iter().any(|o| after[o.index()]);
        }
        let gradients = g.outputs_with(Role::Gradient);
        let scaled = g.outputs_with(Role::ScaledGradient);
        let trained = |name: &str| {
            gradients.iter().chain(&scaled).any(|(v, _)| {
                name == v
                    || name
                        .strip_prefix(v.as_str())
                        .is_some_and(|s| s.starts_with('/'))
            })
        };
        let updates: Vec<Update> = g
            .outputs_with(Role::Update)
            .into_iter()
            .map(|(name, node)| Update {
                trained: trained(&name),
                in_a: !after[node.index()],
                name,
                node,
            })
            .collect();
        let mut a_targets: Vec<NodeIndex> = cross.iter().map(|c| c.1).collect();
        a_targets.push(loss);
        a_targets.push(learning_rate);
        a_targets.extend(updates.iter().filter(|u| u.in_a).map(|u| u.node));
        let spans =
            g.g.node_indices()
                .filter_map(|n| match &g.node(n).op {
                    Op::Variable { name, .. } => Some((name.clone(), g.node(n).span)),
                    _ => None,
                })
                .collect();
        Ok(TrainSpec {
            loss,
            learning_rate,
            next_step,
            cross,
            a_targets,
            updates,
            gradients,
            loss_span: g.node(loss).span,
            spans,
        })
    }

    /// What phase B computes once, from phase A's values: the updates that depend on
    /// a `cross_shard_mean`, and the next step.
    pub fn b_targets(&self) -> Vec<NodeIndex> {
        let mut t: Vec<NodeIndex> = self
            .updates
            .iter()
            .filter(|u| !u.in_a)
            .map(|u| u.node)
            .collect();
        t.extend(self.next_step);
        t
    }

    /// Where the variable `name` (or the variable of an optimiser slot `name/slot`) is
    /// made.
    pub fn variable_span(&self, name: &str) -> Span {
        self.spans
            .get(name)
            .or_else(|| {
                name.rsplit_once('/')
                    .and_then(|(base, _)| self.spans.get(base))
            })
            .copied()
            .unwrap_or_default()
    }

    /// Checks the loss and every gradient after phase A; `scan` finds the first
    /// element of a node's value that is not as wanted (flat index and value).
    pub fn check_a(
        &self,
        scan: impl Fn(NodeIndex, Finite) -> Option<(usize, f32)>,
    ) -> Result<(), StepError> {
        if let Some((index, value)) = scan(self.loss, Finite::All) {
            return Err(StepError::NonFinite {
                bad: Bad::Loss,
                index,
                value,
                span: self.loss_span,
            });
        }
        for (name, node) in &self.gradients {
            if let Some((index, value)) = scan(*node, Finite::All) {
                return Err(StepError::NonFinite {
                    bad: Bad::Gradient(name.clone()),
                    index,
                    value,
                    span: self.variable_span(name),
                });
            }
        }
        Ok(())
    }

    /// Checks every update after phase B (see `check_a`).
    pub fn check_b(
        &self,
        scan: impl Fn(NodeIndex, Finite) -> Option<(usize, f32)>,
    ) -> Result<(), StepError> {
        for u in &self.updates {
            let want = if u.trained {
                Finite::All
            } else {
                Finite::NoNan
            };
            if let Some((index, value)) = scan(u.node, want) {
                return Err(StepError::NonFinite {
                    bad: Bad::Update(u.name.clone()),
                    index,
                    value,
                    span: self.variable_span(&u.name),
                });
            }
        }
        Ok(())
    }
}
