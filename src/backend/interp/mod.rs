//! The reference interpreter (`--target interp`): runs any IR graph with ndarray. It is
//! the numerical oracle the host and wafer backends are tested against, so every kernel
//! is written plainly (see `ops`); matmul and convolution go through a GEMM.
//!
//! A `Plan` fixes, once per graph, which nodes to compute for the wanted values and
//! when each intermediate value can be dropped; `execute` runs it.

mod device;
pub mod ops;

pub use crate::backend::RunError;
pub use device::Device;

use crate::ir::{Graph, Op};
pub use crate::tensor::{Data, Tensor};
pub use ops::OpEnv;
use petgraph::stable_graph::NodeIndex;
use petgraph::visit::NodeIndexable;
use rustc_hash::{FxHashMap, FxHashSet};

/// The nodes to compute, in order, with their operands and what to drop after each.
#[derive(Debug, Clone)]
pub struct Plan {
    steps: Vec<PlanStep>,
    bound: usize,
}

#[derive(Debug, Clone)]
struct PlanStep {
    node: NodeIndex,
    operands: crate::ir::Operands,
    /// Values no later step reads (and that are not wanted).
    free: Vec<NodeIndex>,
}

impl Plan {
    /// A plan computing `targets`, given the values of `provided` nodes from outside.
    pub fn new(g: &Graph, targets: &[NodeIndex], provided: &FxHashSet<NodeIndex>) -> Plan {
        let bound = g.g.node_bound();
        let order = g.schedule(targets, |n| provided.contains(&n));
        let keep: FxHashSet<NodeIndex> = targets.iter().copied().collect();
        let mut last = vec![usize::MAX; bound];
        let mut steps: Vec<PlanStep> = order
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let operands = g.operands(n);
                for &o in &operands {
                    last[o.index()] = i;
                }
                PlanStep {
                    node: n,
                    operands,
                    free: Vec::new(),
                }
            })
            .collect();
        for (n, &i) in last.iter().enumerate() {
            let n = NodeIndex::new(n);
            if i != usize::MAX && !keep.contains(&n) && !provided.contains(&n) {
                steps[i].free.push(n);
            }
        }
        Plan { steps, bound }
    }

    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// The `provided` nodes its steps read, in index order.
    pub fn reads(&self, provided: &FxHashSet<NodeIndex>) -> Vec<NodeIndex> {
        let mut out: Vec<NodeIndex> = (self.steps.iter())
            .flat_map(|s| s.operands.iter().copied())
            .filter(|o| provided.contains(o))
            .collect();
        out.sort();
        out.dedup();
        out
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The nodes it computes, in order.
    pub fn nodes(&self) -> impl Iterator<Item = NodeIndex> + '_ {
        self.steps.iter().map(|s| s.node)
    }
}

/// Where sources get their values.
pub struct Env<'a> {
    /// Inputs by name (`features`, `labels`, or an element path in a pipeline graph).
    pub feeds: &'a FxHashMap<String, Tensor>,
    /// Variables by name.
    pub vars: &'a FxHashMap<String, Tensor>,
    pub op: OpEnv,
}

/// The values of a graph's nodes, by node index.
#[derive(Debug, Clone, Default)]
pub struct Values {
    v: Vec<Option<Tensor>>,
}

impl Values {
    pub fn new(bound: usize) -> Values {
        Values {
            v: vec![None; bound],
        }
    }

    pub fn get(&self, n: NodeIndex) -> Option<&Tensor> {
        self.v.get(n.index()).and_then(|x| x.as_ref())
    }

    pub fn set(&mut self, n: NodeIndex, t: Tensor) {
        if self.v.len() <= n.index() {
            self.v.resize(n.index() + 1, None);
        }
        self.v[n.index()] = Some(t);
    }

    pub fn take(&mut self, n: NodeIndex) -> Option<Tensor> {
        self.v.get_mut(n.index()).and_then(|x| x.take())
    }
}

/// Runs `plan` over `g`. `values` holds the provided nodes' values on entry and the
/// targets' on return.
pub fn execute(g: &Graph, plan: &Plan, env: &Env, values: &mut Values) -> Result<(), RunError> {
    if values.v.len() < plan.bound {
        values.v.resize(plan.bound, None);
    }
    for step in &plan.steps {
        let node = g.node(step.node);
        let fail = |message: String| RunError {
            span: node.span,
            op: node.op.name(),
            message,
        };
        let t = match &node.op {
            Op::Input { name } => {
                let t = env
                    .feeds
                    .get(name)
                    .ok_or_else(|| fail(format!("input `{name}` was not fed")))?;
                fits(t, &node.ty).map_err(|m| fail(format!("input `{name}`: {m}")))?;
                t.clone()
            }
            Op::Variable { name, .. } => {
                let t = env
                    .vars
                    .get(name)
                    .ok_or_else(|| fail(format!("variable `{name}` has no value")))?;
                fits(t, &node.ty).map_err(|m| fail(format!("variable `{name}`: {m}")))?;
                t.clone()
            }
            op => {
                let args: smallvec::SmallVec<[&Tensor; 4]> = step
                    .operands
                    .iter()
                    .map(|&o| values.v[o.index()].as_ref().expect("operand computed"))
                    .collect();
                let ty = actual_type(op, &args, &node.ty).map_err(fail)?;
                // a size still open (a decoder's) is the record's, known once decoded
                if !ty.shape.contains(&crate::elab::UNKNOWN_DIM) {
                    reserve(&ty).map_err(fail)?;
                }
                ops::eval(op, &args, &ty, &env.op).map_err(fail)?
            }
        };
        values.v[step.node.index()] = Some(t);
        for &f in &step.free {
            values.v[f.index()] = None;
        }
    }
    Ok(())
}

/// The type an op's result has: the node's own, or, where a dimension was left open
/// (`UNKNOWN_DIM`, a length the pipeline learns from each record, in a `map` closure's
/// graph), the type the operands' actual shapes give it.
fn actual_type<'t>(
    op: &Op,
    args: &[&Tensor],
    ty: &'t crate::ir::TensorType,
) -> Result<std::borrow::Cow<'t, crate::ir::TensorType>, String> {
    if !ty.shape.contains(&crate::elab::UNKNOWN_DIM) {
        return Ok(std::borrow::Cow::Borrowed(ty));
    }
    let types: smallvec::SmallVec<[crate::ir::TensorType; 4]> =
        args.iter().map(|a| a.ty()).collect();
    let refs: smallvec::SmallVec<[&crate::ir::TensorType; 4]> = types.iter().collect();
    crate::ir::infer(op, &refs, ty)
        .map(std::borrow::Cow::Owned)
        .map_err(|e| {
            format!(
                "{} (on a value whose length comes from the record)",
                e.message
            )
        })
}

/// Results at least this large are allocated only after a fallible reservation of
/// their size succeeded.
const LARGE_RESULT: u128 = 64 << 20;

/// Makes the allocation of a large result fallible: the kernels allocate with
/// ndarray, which aborts the process when the memory is not there, so a result of
/// `LARGE_RESULT` or more is first reserved (and released) with `try_reserve`. A failure
/// is an error of the op, not an abort. (`estc check` refuses programs estimated beyond
/// the machine's memory before they run: E0602.)
pub fn reserve(ty: &crate::ir::TensorType) -> Result<(), String> {
    let bytes = crate::passes::memory::bytes_of(ty);
    if bytes < LARGE_RESULT {
        return Ok(());
    }
    let mut probe: Vec<u8> = Vec::new();
    usize::try_from(bytes)
        .ok()
        .and_then(|n| crate::oom::try_reserve(&mut probe, n).ok())
        .ok_or_else(|| {
            format!(
                "cannot allocate {} for its result ({ty})",
                crate::passes::memory::human(bytes)
            )
        })
}

/// Checks a value given from outside the graph (a fed input, a variable) against the
/// type inference gave its node, so that every op sees the types it was checked for
/// (a dimension the pipeline left open, `UNKNOWN_DIM`, matches any size).
fn fits(t: &Tensor, ty: &crate::ir::TensorType) -> Result<(), String> {
    let open = crate::elab::UNKNOWN_DIM;
    let same_shape = t.shape().len() == ty.shape.len()
        && t.shape()
            .iter()
            .zip(ty.shape.iter())
            .all(|(&a, &b)| a == b || b == open);
    if t.dtype != ty.dtype || !same_shape {
        return Err(format!("the value is {}, but the graph needs {ty}", t.ty()));
    }
    Ok(())
}

/// Runs a whole graph for its outputs, by name: a convenience for tests and tools.
pub fn run_outputs(
    g: &Graph,
    feeds: &FxHashMap<String, Tensor>,
    vars: &FxHashMap<String, Tensor>,
    op: OpEnv,
) -> Result<Vec<(String, Tensor)>, RunError> {
    let targets: Vec<NodeIndex> = g.outputs.iter().map(|o| o.node).collect();
    let plan = Plan::new(g, &targets, &FxHashSet::default());
    let mut values = Values::new(g.g.node_bound());
    execute(g, &plan, &Env { feeds, vars, op }, &mut values)?;
    Ok(g.outputs
        .iter()
        .map(|o| (o.name.clone(), values.get(o.node).cloned().expect("target")))
        .collect())
}
