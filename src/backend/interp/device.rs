//! The interpreter as a `backend::Device`: executables are plans over the graph, the
//! variables a map of tensors (shared arrays, so reading them out copies nothing), and
//! the shards of a train step run on scoped threads.

use super::{execute, Env, Plan, Values};
use crate::backend::{
    self, Feeds, Finite, Peers, RunError, RunExe, StepCtx, StepError, StepOut, TrainExe, TrainSpec,
};
use crate::diag::Diag;
use crate::ir::{Graph, NodeIndex};
use crate::span::Span;
use crate::tensor::{Data, Tensor};
use petgraph::visit::NodeIndexable;
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

/// The interpreter's device.
#[derive(Default)]
pub struct Device {
    vars: FxHashMap<String, Tensor>,
    train: Vec<Train>,
    runs: Vec<Run>,
}

/// A train step: the plans of its two phases.
struct Train {
    graph: Arc<Graph>,
    spec: TrainSpec,
    a: Plan,
    b: Plan,
}

struct Run {
    graph: Arc<Graph>,
    plan: Plan,
    targets: Vec<NodeIndex>,
}

impl backend::Device for Device {
    fn compile_train(&mut self, graph: Arc<Graph>, at: Span) -> Result<TrainExe, Diag> {
        let spec = TrainSpec::new(&graph, at)?;
        let a = Plan::new(&graph, &spec.a_targets, &FxHashSet::default());
        let mut provided: FxHashSet<NodeIndex> = spec.a_targets.iter().copied().collect();
        provided.extend(spec.cross.iter().map(|c| c.0));
        let b = Plan::new(&graph, &spec.b_targets(), &provided);
        self.train.push(Train { graph, spec, a, b });
        Ok(TrainExe(self.train.len() - 1))
    }

    fn compile_run(
        &mut self,
        graph: Arc<Graph>,
        targets: Vec<NodeIndex>,
        _at: Span,
    ) -> Result<RunExe, Diag> {
        let plan = Plan::new(&graph, &targets, &FxHashSet::default());
        self.runs.push(Run {
            graph,
            plan,
            targets,
        });
        Ok(RunExe(self.runs.len() - 1))
    }

    fn bind(&mut self, vars: FxHashMap<String, Tensor>) -> Result<(), String> {
        self.vars = vars;
        Ok(())
    }

    fn variables(&self) -> FxHashMap<String, Tensor> {
        self.vars.clone()
    }

    fn variable(&self, name: &str) -> Option<Tensor> {
        self.vars.get(name).cloned()
    }

    fn set_variable(&mut self, name: &str, value: Tensor) -> Result<(), String> {
        self.vars.insert(name.to_string(), value);
        Ok(())
    }

    fn train_step(
        &mut self,
        exe: TrainExe,
        batches: Vec<Feeds>,
        ctx: StepCtx,
        peers: &mut dyn Peers,
    ) -> Result<StepOut, StepError> {
        let Train { graph, spec, a, b } = &self.train[exe.0];
        let g: &Graph = graph;
        let n = batches.len();
        let (replicas, me) = peers.replicas();
        // the shards of every replica are numbered in replica order
        let first = me * n;
        let vars = &self.vars;
        let run_a = |shard: usize, feeds: Feeds| -> Result<Values, RunError> {
            let env = Env {
                feeds: &feeds,
                vars,
                op: ctx.op_env(first + shard),
            };
            let mut values = Values::new(g.g.node_bound());
            execute(g, a, &env, &mut values)?;
            Ok(values)
        };
        let results: Vec<Result<Values, RunError>> = if n == 1 {
            vec![run_a(0, batches.into_iter().next().expect("one batch"))]
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = batches
                    .into_iter()
                    .enumerate()
                    .map(|(i, b)| {
                        let run_a = &run_a;
                        s.spawn(move || run_a(i, b))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| h.join().expect("shard thread"))
                    .collect()
            })
        };
        let mut shard_values = Vec::with_capacity(n);
        for (shard, r) in results.into_iter().enumerate() {
            match r {
                Ok(v) => shard_values.push(v),
                Err(error) => {
                    return Err(peers.fail(StepError::Run {
                        shard: (n * replicas > 1).then_some(first + shard),
                        error,
                    }))
                }
            }
        }
        // The mean over shards (and replicas) of every phase-A target, then phase B
        // once. Float values (gradients, the loss, float state updates) are averaged;
        // others (an integer counter a model assigns) are shard 0's.
        let mut values = shard_values.remove(0);
        if n * replicas > 1 {
            let floats: Vec<NodeIndex> = (spec.a_targets.iter().copied())
                .filter(|&t| matches!(values.get(t).map(|v| &v.data), Some(Data::F(_))))
                .collect();
            let mut sums: Vec<Vec<f32>> = floats
                .iter()
                .map(|&t| {
                    let mut acc = values.get(t).expect("target").f().to_owned();
                    for sv in &shard_values {
                        acc += sv.get(t).expect("target").f();
                    }
                    acc.iter().copied().collect()
                })
                .collect();
            backend::shard_mean(peers, &mut sums, n)?;
            for (t, mean) in floats.into_iter().zip(sums) {
                let first = values.get(t).expect("target");
                let mut a = first.f().to_owned();
                // (in the order the sums were read out)
                a.iter_mut().zip(mean).for_each(|(x, m)| *x = m);
                values.set(t, Tensor::float(first.dtype, a.into_shared()));
            }
        }
        for &(cross, operand) in &spec.cross {
            let v = values.get(operand).expect("gradient").clone();
            values.set(cross, v);
        }
        spec.check_a(|node, want| scan(&values, node, want))?;
        let no_feeds = FxHashMap::default();
        let env = Env {
            feeds: &no_feeds,
            vars: &self.vars,
            op: ctx.op_env(0),
        };
        execute(g, b, &env, &mut values).map_err(|error| StepError::Run { shard: None, error })?;
        spec.check_b(|node, want| scan(&values, node, want))?;
        let out = StepOut {
            loss: values.get(spec.loss).expect("loss").scalar(),
            learning_rate: values.get(spec.learning_rate).expect("lr").scalar(),
            next_step: spec
                .next_step
                .map(|n| values.get(n).expect("next step").scalar() as i64),
        };
        for u in &spec.updates {
            let v = values.take(u.node).expect("update");
            self.vars.insert(u.name.clone(), v);
        }
        Ok(out)
    }

    fn run(
        &mut self,
        exe: RunExe,
        feeds: Feeds,
        ctx: StepCtx,
        shard: usize,
    ) -> Result<Vec<Tensor>, RunError> {
        let Run {
            graph,
            plan,
            targets,
        } = &self.runs[exe.0];
        let env = Env {
            feeds: &feeds,
            vars: &self.vars,
            op: ctx.op_env(shard),
        };
        let mut values = Values::new(graph.g.node_bound());
        execute(graph, plan, &env, &mut values)?;
        Ok(targets
            .iter()
            .map(|&t| values.get(t).cloned().expect("target"))
            .collect())
    }
}

fn scan(values: &Values, node: NodeIndex, want: Finite) -> Option<(usize, f32)> {
    want.first_bad(values.get(node).expect("checked value"))
}
