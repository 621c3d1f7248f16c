//! The wafer as a `backend::Device`: each executable is a graph formed into kernels,
//! laid out on the fabric and loaded into a simulator that lives as long as the device,
//! with the variables resident in the PEs' memory.
//!
//! A train step, as the host drives it: write the host's values of the step (the
//! learning rate) into the PEs that read them; check the labels (the host has them);
//! stream the batch's samples in and run until the fabric is quiet (each sample's forward
//! and backward passes in the pipeline's order, the gradients accumulating in place); read the
//! loss and the gradients and check them; compute the step values that mix layers (a
//! global norm's clipping factor) from the gradients and write them into the PEs that
//! read them; launch every kernel's update and run again;
//! read the new variables and check them. A step that fails a check puts the variables
//! back. Reading and writing the PEs' memory stands for the host's copies over the
//! fabric's I/O channels, which the cycle counts do not include.

use super::diagnose::layout_diag;
use super::fabric::Fabric;
use super::form::{self, Formed};
use super::kernels::{gather, gather_sum, half_copy, scatter, UPDATE};
use super::place::{self, Layout, LayoutError};
use super::sim::Sim;
use crate::backend::interp::{execute, Env, Plan, Values};
use crate::backend::{
    self, Feeds, Finite, Peers, RunError, RunExe, StepCtx, StepError, StepOut, TrainExe, TrainSpec,
};
use crate::diag::{Code, Diag};
use crate::ir::{DType, Graph, NodeIndex, Op};
use crate::span::Span;
use crate::tensor::{round_float, Tensor};
use petgraph::visit::NodeIndexable;
use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

/// A graph loaded on the fabric.
struct Exe {
    graph: Arc<Graph>,
    formed: Formed,
    layout: Layout,
    sim: Sim,
    /// What the host computes: its values for the PEs and the outputs, and the label
    /// checks.
    host: Plan,
    /// What the host computes between the backward pass and the updates (`Formed::mixed`),
    /// and the gradients (batch values) it reads for that.
    mixed: Plan,
    mixed_reads: Vec<NodeIndex>,
    /// The variables' values the simulator holds are the device's (not stale).
    current: bool,
    /// Whether the tensors whose pieces hold parts of them (`Layout::summed`) hold
    /// their sum in every piece (`sum_parts`, until the next step's samples).
    whole: bool,
    /// Wall time spent simulating.
    wall: std::time::Duration,
}

/// The wafer's device.
pub struct Device {
    fabric: Fabric,
    vars: FxHashMap<String, Tensor>,
    train: Vec<(Exe, TrainSpec)>,
    runs: Vec<(Exe, Vec<NodeIndex>)>,
}

impl Device {
    pub fn new(fabric: Fabric) -> Device {
        Device {
            fabric,
            vars: FxHashMap::default(),
            train: Vec::new(),
            runs: Vec::new(),
        }
    }

    fn load(&self, graph: Arc<Graph>, at: Span) -> Result<Exe, Diag> {
        // the runtime computes the train summaries apart, on the interpreter (and
        // values a layer's next kernel passes on are relayed: `form::prepared`)
        let graph = match form::prepared(&graph) {
            std::borrow::Cow::Owned(g) => Arc::new(g),
            std::borrow::Cow::Borrowed(_) => graph,
        };
        let fab = &self.fabric;
        let formed =
            form::form(&graph).map_err(|u| layout_diag(LayoutError::Unsupported(u), fab, at))?;
        let layout = place::layout(&graph, &formed, fab).map_err(|e| layout_diag(e, fab, at))?;
        let sim = Sim::new(fab, &layout.setup).map_err(|e| {
            Diag::new(
                Code::HostCompile,
                at,
                format!("the wafer program is malformed: {}", e.0),
            )
            .label("this estimator")
            .help("this is a bug in estc's wafer compiler; please report it with the program")
        })?;
        let mut host_targets: Vec<NodeIndex> = formed.host.clone();
        // the random numbers the host draws and the values it computes from the inputs
        // (a layer's input made of the features alone), which it streams
        host_targets.extend(
            layout
                .inputs
                .iter()
                .map(|s| NodeIndex::new(s.node as usize))
                .filter(|&n| !matches!(graph.node(n).op, Op::Input { .. })),
        );
        host_targets.extend(
            graph
                .g
                .node_indices()
                .filter(|&n| matches!(graph.node(n).op, Op::CheckIndices { .. }))
                .filter(|&n| formed.resolve(n) != n),
        );
        let host = Plan::new(&graph, &host_targets, &FxHashSet::default());
        // the mixed values from the batch values (gradients) the PEs hold
        let batch: FxHashSet<NodeIndex> = (graph.g.node_indices())
            .filter(|n| formed.class[n.index()] == form::Class::Batch)
            .collect();
        let mixed = Plan::new(&graph, &formed.mixed, &batch);
        let mixed_reads = mixed.reads(&batch);
        Ok(Exe {
            graph,
            formed,
            layout,
            sim,
            host,
            mixed,
            mixed_reads,
            current: false,
            whole: false,
            wall: std::time::Duration::ZERO,
        })
    }

    /// Marks every executable's copy of the variables stale.
    fn stale(&mut self) {
        let exes = self.train.iter_mut().map(|t| &mut t.0);
        for e in exes.chain(self.runs.iter_mut().map(|r| &mut r.0)) {
            e.current = false;
        }
    }
}

impl Drop for Device {
    /// With `EST_PROFILE` set: what each executable's simulator did.
    fn drop(&mut self) {
        if !crate::backend::host_profile_on() {
            return;
        }
        let exes = (self.train.iter().map(|t| ("train", &t.0)))
            .chain(self.runs.iter().map(|r| ("run", &r.0)));
        for (what, e) in exes {
            let s = e.sim.summary();
            let secs = e.wall.as_secs_f64();
            let pe_cycles = s.cycles as f64 * s.pes as f64;
            eprintln!(
                "wafer profile ({what}, {}): {} cycles on {} PEs ({:.1}% busy, {:.1}% stalled); {:.3} s simulating, {:.3e} PE-cycles/s",
                place::sizing(e.layout.block),
                s.cycles,
                s.pes,
                100.0 * s.busy as f64 / pe_cycles.max(1.0),
                100.0 * s.stalled as f64 / pe_cycles.max(1.0),
                secs,
                pe_cycles / secs.max(1e-9)
            );
        }
    }
}

/// Writes the device's variables into an executable's PEs (once after they change).
fn sync(exe: &mut Exe, vars: &FxHashMap<String, Tensor>) {
    if exe.current {
        return;
    }
    for (name, t) in vars {
        write_tensor(&exe.layout, &mut exe.sim, name, t);
    }
    exe.current = true;
}

/// Writes tensor `t` into every PE that holds a piece of `name` (each replica), and
/// its rounded copies into the half-precision layers that hold one (`half_copy`).
fn write_tensor(layout: &Layout, sim: &mut Sim, name: &str, t: &Tensor) {
    let copies = [DType::F16, DType::BF16].map(|d| (half_copy(name, d), d));
    let held =
        std::iter::once((name, DType::F32)).chain(copies.iter().map(|(n, d)| (n.as_str(), *d)));
    for (key, dtype) in held {
        if let Some(pieces) = layout.tensors.get(key) {
            let data: Vec<f32> = (t.to_f64().iter())
                .map(|&v| round_float(dtype, v as f32))
                .collect();
            scatter(pieces, &data, |(x, y), a, v| {
                sim.write(x, y, a, v);
            });
        }
    }
}

/// Reads a tensor the PEs hold, shaped and typed as node `n`.
fn read(exe: &Exe, name: &str, n: NodeIndex) -> Option<Tensor> {
    let pieces = exe.layout.tensors.get(name)?;
    let ty = exe.graph.ty(n);
    let mem = |(x, y)| exe.sim.memory(x, y);
    let v = match exe.layout.summed.contains(name) && !exe.whole {
        true => gather_sum(pieces, ty.elements(), mem),
        false => gather(pieces, ty.elements(), mem),
    };
    Some(Tensor::from_f64(
        ty,
        v.iter().map(|&x| f64::from(x)).collect(),
    ))
}

/// The key under which a node's value is kept on the fabric.
fn kept(exe: &Exe, n: NodeIndex) -> String {
    let n = exe.formed.resolve(n);
    match &exe.graph.node(n).op {
        Op::Variable { name, .. } => name.clone(),
        _ => form::key(n),
    }
}

fn fail(g: &Graph, n: NodeIndex, message: String) -> RunError {
    RunError {
        span: g.node(n).span,
        op: g.node(n).op.name(),
        message,
    }
}

/// For a stream of `per` elements a sample, the NHWC element of planar position `e`
/// (an image sent channel by channel); the identity for other streams (`channels` 0).
fn planar_to_nhwc(per: usize, channels: u32) -> impl Fn(usize) -> usize + Copy {
    let c = (channels as usize).max(1);
    let hw = per / c;
    move |e| (e % hw) * c + e / hw
}

/// Runs one batch through an executable: the host's values (from the inputs, the
/// constants and the variables: a dynamic loss scale), the label checks, the samples,
/// until the fabric is quiet. The host's values, by node.
fn stream(
    exe: &mut Exe,
    (feeds, vars): (&Feeds, &FxHashMap<String, Tensor>),
    ctx: StepCtx,
    shard: usize,
) -> Result<Values, RunError> {
    let g = exe.graph.clone();
    exe.whole = false;
    let env = Env {
        feeds,
        vars,
        op: ctx.op_env(shard),
    };
    let mut values = Values::new(g.g.node_bound());
    execute(&g, &exe.host, &env, &mut values)?;
    write_scalars(&exe.layout, &mut exe.sim, &exe.formed.host, &values);
    let batch = exe.layout.batch as usize;
    for s in &exe.layout.inputs {
        let node = NodeIndex::new(s.node as usize);
        let t = match &g.node(node).op {
            Op::Input { name } => feeds
                .get(name)
                .ok_or_else(|| fail(&g, node, format!("input `{name}` was not fed")))?,
            _ => values
                .get(node)
                .ok_or_else(|| fail(&g, node, "a stream the host did not compute".into()))?,
        };
        let name = g.node(node).op.name();
        if t.shape().first() != Some(&batch) {
            return Err(fail(
                &g,
                node,
                format!(
                    "input `{name}` has {:?} rows, not the {batch} the wafer program streams",
                    t.shape().first()
                ),
            ));
        }
        let v = t.to_f64();
        if let Some((at, rows)) = s.ids {
            if let Some(&k) = v.iter().find(|&&k| !(0.0..f64::from(rows)).contains(&k)) {
                return Err(fail(
                    &g,
                    NodeIndex::new(at as usize),
                    format!("gather index {k} is out of range for a table of {rows} rows"),
                ));
            }
        }
        let per = s.per_sample as usize;
        let nhwc = planar_to_nhwc(per, s.channels);
        for l in &s.lanes {
            let lane: Vec<f32> = (0..batch)
                .flat_map(|b| l.elems.clone().map(move |e| b * per + nhwc(e as usize)))
                .map(|i| v.get(i).copied().unwrap_or(0.0) as f32)
                .collect();
            exe.sim.feed(l.x, l.y, l.colour, &lane);
        }
    }
    exe.sim.clear_outputs();
    let before = exe.sim.data_runs();
    quiet(exe)?;
    // every data task ran once a sample (else a task waits for a stream that never
    // came, and the step's results would be wrong without a deadlock to show it)
    if let Some(why) = exe.sim.short_runs(&before, batch as u64) {
        return Err(RunError {
            span: Span::default(),
            op: "wafer",
            message: why,
        });
    }
    Ok(values)
}

/// Runs the simulator until the fabric is quiet (a deadlock, a compiler bug, is an
/// error naming its chain of waits).
fn quiet(exe: &mut Exe) -> Result<(), RunError> {
    let t = std::time::Instant::now();
    let r = exe.sim.run();
    exe.wall += t.elapsed();
    r.map(|_| ()).map_err(|d| RunError {
        span: Span::default(),
        op: "wafer",
        message: d.to_string(),
    })
}

/// Computes the step values that mix layers (`Formed::mixed`) from the gradients the
/// PEs hold and the variables, and writes them into the PEs whose updates read them;
/// the variables the host updates (`Formed::host_commits`) are written into every PE
/// that holds them and returned by name.
fn mix(
    exe: &mut Exe,
    vars: &FxHashMap<String, Tensor>,
    ctx: StepCtx,
) -> Result<Vec<(String, Tensor)>, RunError> {
    if exe.formed.mixed.is_empty() {
        return Ok(Vec::new());
    }
    let g = exe.graph.clone();
    let mut values = Values::new(g.g.node_bound());
    for &n in &exe.mixed_reads {
        let t = read(exe, &kept(exe, n), n)
            .ok_or_else(|| fail(&g, n, "a gradient the PEs do not hold".into()))?;
        values.set(n, t);
    }
    let feeds = Feeds::default();
    let env = Env {
        feeds: &feeds,
        vars,
        op: ctx.op_env(0),
    };
    execute(&g, &exe.mixed, &env, &mut values)?;
    write_scalars(&exe.layout, &mut exe.sim, &exe.formed.mixed, &values);
    let mut commits = Vec::new();
    for (name, n) in &exe.formed.host_commits {
        let t = (values.get(*n).cloned())
            .ok_or_else(|| fail(&g, *n, "an update the host did not compute".into()))?;
        write_tensor(&exe.layout, &mut exe.sim, name, &t);
        commits.push((name.clone(), t));
    }
    Ok(commits)
}

/// Writes the host's scalar `values` of `nodes` into the PEs that hold them.
fn write_scalars(layout: &Layout, sim: &mut Sim, nodes: &[NodeIndex], values: &Values) {
    for &n in nodes {
        if let Some(t) = values.get(n) {
            write_tensor(layout, sim, &form::key(n), t);
        }
    }
}

/// Sums each tensor whose pieces hold a part of it (`Layout::summed`: a weight's
/// gradient over the bands of a convolution in bands) and writes the sum back into
/// every piece, so that the updates of every copy of the weight read the whole.
fn sum_parts(exe: &mut Exe) {
    exe.whole = true;
    for name in exe.layout.summed.clone() {
        let Some(pieces) = exe.layout.tensors.get(&name) else {
            continue;
        };
        let len = (pieces.iter().flat_map(|p| &p.runs))
            .map(|&(off, n)| (off + n) as usize)
            .max()
            .unwrap_or(0);
        let sum = gather_sum(pieces, len, |(x, y)| exe.sim.memory(x, y));
        scatter(pieces, &sum, |(x, y), a, v| {
            exe.sim.write(x, y, a, v);
        });
    }
}

/// Launches every update and runs it.
fn update(exe: &mut Exe) -> Result<(), RunError> {
    let pes: Vec<(u32, u32)> = exe.layout.setup.pes.keys().copied().collect();
    for (x, y) in pes {
        exe.sim.launch(x, y, UPDATE);
    }
    quiet(exe)
}

impl backend::Device for Device {
    fn compile_train(&mut self, graph: Arc<Graph>, at: Span) -> Result<TrainExe, Diag> {
        let spec = TrainSpec::new(&graph, at)?;
        let exe = self.load(graph, at)?;
        self.train.push((exe, spec));
        Ok(TrainExe(self.train.len() - 1))
    }

    fn compile_run(
        &mut self,
        graph: Arc<Graph>,
        targets: Vec<NodeIndex>,
        at: Span,
    ) -> Result<RunExe, Diag> {
        let exe = self.load(graph, at)?;
        self.runs.push((exe, targets));
        Ok(RunExe(self.runs.len() - 1))
    }

    fn bind(&mut self, vars: FxHashMap<String, Tensor>) -> Result<(), String> {
        self.vars = vars;
        self.stale();
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
        self.stale();
        Ok(())
    }

    fn train_step(
        &mut self,
        exe: TrainExe,
        batches: Vec<Feeds>,
        ctx: StepCtx,
        peers: &mut dyn Peers,
    ) -> Result<StepOut, StepError> {
        let (e, spec) = &mut self.train[exe.0];
        let g = e.graph.clone();
        let (replicas, me) = peers.replicas();
        // state a model keeps itself in phase A would need averaging across replicas
        // too, which the fabric's updates do not do
        let kept_state = spec.updates.iter().find(|u| u.in_a && replicas > 1);
        if batches.len() != 1 || kept_state.is_some() {
            let why = match kept_state {
                Some(u) => format!(
                    "the wafer does not average `{}` (state updated before the gradients' mean) across ranks",
                    u.name
                ),
                None => format!("the wafer runs a step as one shard, not {}", batches.len()),
            };
            return Err(peers.fail(StepError::Run {
                shard: None,
                error: fail(&g, spec.loss, why),
            }));
        }
        sync(e, &self.vars);
        let run = |error| StepError::Run { shard: None, error };
        let values = match stream(e, (&batches[0], &self.vars), ctx, me) {
            Ok(v) => v,
            Err(error) => return Err(peers.fail(run(error))),
        };
        sum_parts(e);
        let scan = |e: &Exe, n: NodeIndex, want: Finite| -> Option<(usize, f32)> {
            read(e, &kept(e, n), n).and_then(|t| want.first_bad(&t))
        };
        // the loss, read from the PEs, or (a loss the PEs do not hold: a mean plus a
        // regularisation penalty) computed by the host from the batch sums and the
        // variables before the step
        let loss_of = |e: &Exe, vars: &FxHashMap<String, Tensor>| match read(
            e,
            &kept(e, spec.loss),
            spec.loss,
        ) {
            Some(t) => Ok(t.scalar()),
            None => epilogue(e, spec.loss, &batches[0], vars, ctx).map(|t| t.scalar()),
        };
        let mut averaged = None;
        if replicas > 1 {
            // the gradients the PEs hold, and the loss, averaged over the replicas and
            // written back for the checks and the updates to read
            let held: Vec<(String, NodeIndex)> = (spec.gradients.iter())
                .map(|(_, n)| (kept(e, *n), *n))
                .chain([(kept(e, spec.loss), spec.loss)])
                .collect();
            let mut sums: Vec<Vec<f32>> = Vec::with_capacity(held.len());
            for (k, n) in &held {
                let got = match read(e, k, *n) {
                    Some(t) => Ok(t),
                    None if *n == spec.loss => {
                        loss_of(e, &self.vars).map(|l| Tensor::from_f64(g.ty(*n), vec![l]))
                    }
                    None => Err(fail(&g, *n, "a gradient the PEs do not hold".into())),
                };
                match got {
                    Ok(t) => sums.push(t.to_f64().iter().map(|&x| x as f32).collect()),
                    Err(error) => {
                        update_discarding(e, &self.vars);
                        return Err(peers.fail(run(error)));
                    }
                }
            }
            if let Err(err) = backend::shard_mean(peers, &mut sums, 1) {
                update_discarding(e, &self.vars);
                return Err(err);
            }
            for ((k, n), mean) in held.iter().zip(&sums) {
                let t = Tensor::from_f64(g.ty(*n), mean.iter().map(|&x| f64::from(x)).collect());
                write_tensor(&e.layout, &mut e.sim, k, &t);
            }
            averaged = sums.last().and_then(|s| s.first()).map(|&l| f64::from(l));
        }
        if let Err(err) = spec.check_a(|n, want| scan(e, n, want)) {
            // the gradients are dropped with the step
            update_discarding(e, &self.vars);
            return Err(err);
        }
        let loss = match averaged {
            Some(l) => l,
            None => loss_of(e, &self.vars).map_err(run)?,
        };
        // a failed mix or update leaves the PEs' variables unlike the device's
        let mixed = mix(e, &self.vars, ctx).and_then(|h| update(e).map(|_| h));
        let mut hosts = mixed.map_err(|err| {
            e.current = false;
            run(err)
        })?;
        let new: Vec<(String, Option<Tensor>)> = (spec.updates.iter())
            .map(|u| {
                let host = hosts.iter().position(|h| h.0 == u.name);
                let t = host.map(|i| hosts.swap_remove(i).1);
                (u.name.clone(), t.or_else(|| read(e, &u.name, u.node)))
            })
            .collect();
        if let Err(err) = spec.check_b(|n, want| {
            let i = spec.updates.iter().position(|u| u.node == n)?;
            new[i].1.as_ref().and_then(|t| want.first_bad(t))
        }) {
            e.current = false;
            sync(e, &self.vars);
            return Err(err);
        }
        for (name, t) in new {
            if let Some(t) = t {
                self.vars.insert(name, t);
            }
        }
        for (r, _) in &mut self.runs {
            r.current = false;
        }
        let host = |n: NodeIndex| values.get(n).map(|t| t.scalar());
        Ok(StepOut {
            loss,
            learning_rate: host(spec.learning_rate).unwrap_or(f64::NAN),
            next_step: spec.next_step.and_then(host).map(|v| v as i64),
        })
    }

    fn run(
        &mut self,
        exe: RunExe,
        feeds: Feeds,
        ctx: StepCtx,
        shard: usize,
    ) -> Result<Vec<Tensor>, RunError> {
        let (e, targets) = &mut self.runs[exe.0];
        sync(e, &self.vars);
        let values = stream(e, (&feeds, &self.vars), ctx, shard)?;
        let g = e.graph.clone();
        let batch = e.layout.batch as usize;
        let mut out = Vec::with_capacity(targets.len());
        for &t in targets.iter() {
            let n = e.formed.resolve(t);
            let ty = g.ty(t);
            if let Some(v) = values.get(t).or_else(|| values.get(n)) {
                out.push(v.clone());
                continue;
            }
            if let Op::Input { name } = &g.node(n).op {
                let v = feeds
                    .get(name)
                    .ok_or_else(|| fail(&g, n, format!("input `{name}` was not fed")))?;
                out.push(Tensor::from_f64(ty, v.to_f64()));
                continue;
            }
            if let Some(s) = e
                .layout
                .outputs
                .iter()
                .find(|s| s.node as usize == n.index())
            {
                let per = s.per_sample as usize;
                let mut v = vec![f64::NAN; batch * per];
                let nhwc = planar_to_nhwc(per, s.channels);
                for l in &s.lanes {
                    let got = e.sim.output(l.x, l.y, l.dir, l.colour);
                    let w = l.elems.len();
                    for (i, &(_, x)) in got.iter().enumerate() {
                        let (b, j) = (i / w.max(1), i % w.max(1));
                        let at = b * per + nhwc(l.elems.start as usize + j);
                        if let Some(slot) = v.get_mut(at) {
                            *slot = f64::from(x);
                        }
                    }
                }
                out.push(Tensor::from_f64(ty, v));
                continue;
            }
            match read(e, &kept(e, t), t) {
                Some(v) => out.push(v),
                None => out.push(epilogue(e, t, &feeds, &self.vars, ctx)?),
            }
        }
        // the sums over the batch start again for the next batch
        update(e)?;
        Ok(out)
    }
}

/// An output the fabric does not hold, computed on the host from the batch values the
/// PEs hold (a masked mean: the sum over the real rows divided by their count, both
/// sums over the batch), as the host computes the mixed values of a train step.
fn epilogue(
    e: &Exe,
    t: NodeIndex,
    feeds: &Feeds,
    vars: &FxHashMap<String, Tensor>,
    ctx: StepCtx,
) -> Result<Tensor, RunError> {
    let g = &e.graph;
    let held: FxHashSet<NodeIndex> = (g.g.node_indices())
        .filter(|&n| e.formed.class[n.index()] == form::Class::Batch)
        .filter(|&n| e.layout.tensors.contains_key(&kept(e, n)))
        .collect();
    let plan = Plan::new(g, &[t], &held);
    let fabric = |n: NodeIndex| {
        e.formed.class[n.index()] == form::Class::Sample
            || e.formed.class[n.index()] == form::Class::SampleT
    };
    if (plan.nodes()).any(fabric) {
        return Err(fail(
            g,
            t,
            format!("`{}` is not computed on the wafer", g.node(t).op.name()),
        ));
    }
    let mut values = Values::new(g.g.node_bound());
    for n in plan.reads(&held) {
        values.set(n, read(e, &kept(e, n), n).expect("held"));
    }
    let env = Env {
        feeds,
        vars,
        op: ctx.op_env(0),
    };
    execute(g, &plan, &env, &mut values)?;
    Ok(values.take(t).expect("computed"))
}

/// After a failed check: zero the step's accumulations (by running the update) and
/// put the variables back.
fn update_discarding(e: &mut Exe, vars: &FxHashMap<String, Tensor>) {
    let _ = update(e);
    e.current = false;
    sync(e, vars);
}
