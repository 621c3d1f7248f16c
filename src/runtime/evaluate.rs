//! Evaluation and prediction over an input read once, with a partial last batch
//! evaluated exactly: it is padded to the graph's batch size with copies of its last
//! row, the graph's mask input says which rows are real (`passes::mask_padding` makes
//! the reductions across the batch skip the others), metrics accumulate the real rows
//! only, the loss is averaged over the real examples, and predict writes one row per
//! real example.

use super::replicas::Phase;
use super::{
    mode_name, restore::Need, run_diag, summary, Estimator, EvalReport, PredictReport, Res,
    RunFailure,
};
use crate::backend::interp::{self, OpEnv};
use crate::backend::{Feeds, RunExe, StepCtx};
use crate::data::{pipeline, records};
use crate::diag::{Code, Diag};
use crate::ir::{BatchMask, Graph, NodeIndex, Op, Role, TensorType, MASK_INPUT};
use crate::span::Span;
use crate::syntax::ast::SectionKind;
use crate::tensor::Tensor;
use pipeline::Element;
use rustc_hash::FxHashMap;
use std::path::Path;

/// How a graph's inputs are fed from the batches of its input pipeline.
pub(super) struct Feeder {
    /// The graph's inputs in element order (features, then labels).
    names: Vec<String>,
    /// How the graph masks a partial last batch, when it may have one.
    mask: Option<BatchMask>,
    /// The input's span, for errors about its batches.
    at: Span,
}

/// One batch's inputs, and how many of its rows are real examples.
pub(super) struct Fed {
    pub feeds: Feeds,
    pub real: usize,
}

impl Feeder {
    pub fn new(g: &Graph, at: Span) -> Feeder {
        Feeder {
            names: input_names(g),
            mask: g.batch_mask.clone(),
            at,
        }
    }

    /// The graph's input names, in the element's order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The inputs of one batch (`when` in the run): padded to the batch size, with the
    /// mask of its real rows, when the graph takes a partial batch; E0916 when a partial
    /// batch arrives for a graph whose outputs padding would change.
    pub fn feed(&self, batch: Element, when: &str) -> Res<Fed> {
        let real = batch
            .first()
            .and_then(|t| t.shape().first().copied())
            .unwrap_or(0);
        let Some(mask) = &self.mask else {
            let feeds = self.names.iter().cloned().zip(batch).collect();
            return Ok(Fed { feeds, real });
        };
        let size = mask.size;
        if real < size && !mask.inexact.is_empty() {
            return Err(Diag::new(
                Code::InexactPartialBatch,
                self.at,
                format!(
                    "{when}: a partial batch of {real} (of {size}) arrived, and {} would come out differently with padding",
                    mask.inexact.join(", ")
                ),
            )
            .label("this input")
            .help("write them per example (the loss as a mean over the batch), or drop the partial batch with `batch(n, drop_remainder: true)`; `estc check` lists them (W0513)")
            .into());
        }
        let mut feeds = FxHashMap::default();
        for (name, t) in self.names.iter().zip(batch) {
            let padded = pad_rows(t, real, size)
                .map_err(|m| Diag::new(Code::BadData, self.at, m).label("this input"))?;
            feeds.insert(name.clone(), padded);
        }
        let mask: Vec<f64> = (0..size).map(|i| f64::from(u8::from(i < real))).collect();
        let ty = TensorType::new(crate::ir::DType::Bool, vec![size]);
        feeds.insert(MASK_INPUT.to_string(), Tensor::from_f64(&ty, mask));
        Ok(Fed { feeds, real })
    }
}

/// The model's input names in the order of the element's leaves (features, then
/// labels); the mask is fed apart.
pub(super) fn input_names(g: &Graph) -> Vec<String> {
    if !g.feeds.is_empty() {
        return g.feeds.clone();
    }
    let mut v: Vec<(NodeIndex, String)> =
        g.g.node_indices()
            .filter_map(|n| match &g.node(n).op {
                Op::Input { name } if name != MASK_INPUT => Some((n, name.clone())),
                _ => None,
            })
            .collect();
    v.sort();
    v.into_iter().map(|x| x.1).collect()
}

fn env() -> OpEnv {
    OpEnv {
        step: 0,
        seed: 0,
        shard: 0,
    }
}

/// `t` (a batch of `real` rows) with copies of its last row up to `size` rows.
fn pad_rows(t: Tensor, real: usize, size: usize) -> Result<Tensor, String> {
    let shape = t.shape().to_vec();
    match shape.first() {
        Some(&n) if n == size => return Ok(t),
        Some(&n) if n == real && n > 0 && n < size => {}
        _ => {
            return Err(format!(
                "a batch of {} is not a batch of {real} rows (at most {size})",
                t.ty()
            ))
        }
    }
    let mut last_shape = shape.clone();
    last_shape[0] = 1;
    let last = interp::ops::eval(
        &Op::Slice {
            axis: 0,
            start: real - 1,
            end: real,
        },
        &[&t],
        &TensorType::new(t.dtype, last_shape),
        &env(),
    )?;
    let mut fill_shape = shape.clone();
    fill_shape[0] = size - real;
    let fill = interp::ops::eval(
        &Op::BroadcastTo,
        &[&last],
        &TensorType::new(t.dtype, fill_shape),
        &env(),
    )?;
    let mut full = shape;
    full[0] = size;
    interp::ops::eval(
        &Op::Concat { axis: 0 },
        &[&t, &fill],
        &TensorType::new(t.dtype, full),
        &env(),
    )
}

/// The first `n` rows of a batched tensor.
pub(super) fn first_rows(t: &Tensor, n: usize) -> Tensor {
    let mut shape = t.shape().to_vec();
    if shape.first().is_none_or(|&r| r <= n) {
        return t.clone();
    }
    shape[0] = n;
    interp::ops::eval(
        &Op::Slice {
            axis: 0,
            start: 0,
            end: n,
        },
        &[t],
        &TensorType::new(t.dtype, shape),
        &env(),
    )
    .unwrap_or_else(|_| t.clone())
}

impl Estimator {
    /// Runs `exe` on one batch (padded if partial) as shard `shard`; returns its
    /// values and the number of real rows.
    pub(super) fn run_fed(
        &mut self,
        exe: RunExe,
        feeder: &Feeder,
        batch: Element,
        shard: usize,
        when: &str,
    ) -> Res<(Vec<Tensor>, usize)> {
        let fed = feeder.feed(batch, when)?;
        let ctx = StepCtx {
            step: self.step,
            seed: self.seed,
        };
        let values = self
            .dev()?
            .device
            .run(exe, fed.feeds, ctx, shard)
            .map_err(|e| run_diag(e, when))?;
        Ok((values, fed.real))
    }

    /// E0913: an evaluation or prediction that saw no example.
    fn no_examples(&self, mode: SectionKind, steps: Option<u64>, at: Span) -> RunFailure {
        let why = match steps {
            Some(0) => "--steps 0 asks for no batch".to_string(),
            _ => format!(
                "the {} input yielded no batch{}",
                mode_name(mode),
                if self.info.config.num_shards > 1 {
                    " for any shard"
                } else {
                    ""
                }
            ),
        };
        Diag::new(
            Code::NoExamples,
            at,
            format!(
                "the {} ran over no examples: {why}",
                if mode == SectionKind::Eval {
                    "evaluation"
                } else {
                    "prediction"
                }
            ),
        )
        .label("this input")
        .help(
            "nothing was written; check the input's files and filters, or give a positive --steps",
        )
        .into()
    }

    /// Evaluates the latest checkpoint: metrics over `steps` batches or the whole input.
    pub fn evaluate(&mut self, steps: Option<u64>) -> Res<EvalReport> {
        self.prepare(Need::Checkpoint)?;
        let (c, ds) = self.input(SectionKind::Eval)?;
        let steps = steps.or(self.info.eval_steps.map(|s| s as u64));
        if steps.is_none() && ds.repeats_forever() {
            return Err(Diag::new(Code::EndlessEval, ds.span(), "the eval input repeats forever and no eval steps are given")
                .label("this input never ends")
                .help("set `eval_steps` in the estimator or pass --steps N, or remove `repeat` from the eval input")
                .into());
        }
        if steps == Some(0) {
            return Err(self.no_examples(SectionKind::Eval, steps, ds.span()));
        }
        let g = &c.graph;
        let shards = self.info.config.num_shards.max(1) as usize;
        let feeder = Feeder::new(g, ds.span());
        let per_example: &[usize] = feeder.mask.as_ref().map_or(&[], |m| &m.per_example);
        let loss_at = g.outputs.iter().position(|o| o.role == Role::Loss);
        let targets: Vec<NodeIndex> = g.outputs.iter().map(|o| o.node).collect();
        let exe = self.run_exe(&c, SectionKind::Eval, &targets)?;
        // one set of reducers per shard of every rank, merged at the end
        let (_, ranks) = self.rank();
        let mut reducers: Vec<Vec<Box<dyn super::Reducer>>> = Vec::new();
        for _ in 0..shards * ranks {
            let mut rs = Vec::new();
            for m in &g.metrics {
                rs.push(self.reducer(&m.reducer, m.span)?);
            }
            reducers.push(rs);
        }
        let mut pipe = self.start_pipeline(&ds, SectionKind::Eval)?;
        let (mut loss_sum, mut examples, mut count) = (0.0, 0u64, 0u64);
        while steps.is_none_or(|s| count < s) {
            let (present, batches) = self.read_shared(&mut pipe, shards, Phase::Eval)?;
            if present == 0 {
                break;
            }
            // this rank's batches, then every rank's in order (alone: its own)
            let mut items = Vec::with_capacity(batches.len());
            let mut failure = None;
            for (shard, batch) in batches {
                let when = if shards * ranks > 1 {
                    format!("in eval batch {} (shard {shard})", count + 1)
                } else {
                    format!("in eval batch {}", count + 1)
                };
                match self.run_fed(exe, &feeder, batch, shard, &when) {
                    Ok((values, real)) => {
                        let args: Vec<Vec<Tensor>> = (g.metrics.iter())
                            .map(|m| {
                                (m.args.iter())
                                    .map(|&i| {
                                        let t = &values[i];
                                        if per_example.contains(&i) {
                                            first_rows(t, real)
                                        } else {
                                            t.clone()
                                        }
                                    })
                                    .collect()
                            })
                            .collect();
                        items.push(EvalItem {
                            shard,
                            real,
                            loss: loss_at.map_or(0.0, |l| values[l].scalar()),
                            args,
                        });
                    }
                    Err(f) => {
                        failure = Some(f);
                        break;
                    }
                }
            }
            let items = self.gather_items(Phase::Eval, items, failure, count)?;
            for it in items {
                if loss_at.is_some() {
                    loss_sum += it.loss * it.real as f64;
                }
                for (r, args) in reducers[it.shard].iter_mut().zip(&it.args) {
                    r.accumulate(&args.iter().collect::<Vec<_>>());
                }
                examples += it.real as u64;
            }
            count += 1;
        }
        if examples == 0 {
            return Err(self.no_examples(SectionKind::Eval, steps, ds.span()));
        }
        // Reduce across shards.
        let mut first = reducers.remove(0);
        for other in &reducers {
            for (r, o) in first.iter_mut().zip(other) {
                r.merge(o.as_ref());
            }
        }
        let metrics: Vec<(String, f64)> = g
            .metrics
            .iter()
            .zip(&first)
            .map(|(m, r)| (m.name.clone(), r.result()))
            .collect();
        let loss = loss_sum / examples as f64;
        self.note_skipped(&pipe);
        if self.chief() {
            self.write_eval_summaries(&metrics, loss);
        }
        Ok(EvalReport {
            global_step: self.step,
            steps: count,
            examples,
            loss,
            metrics,
        })
    }

    /// The evaluation's scalars in `model_dir/eval`; a failure to write them is a
    /// warning, not a lost evaluation.
    fn write_eval_summaries(&mut self, metrics: &[(String, f64)], loss: f64) {
        let dir = self.model_dir.join("eval");
        let mut scalars: Vec<(&str, f32)> = metrics
            .iter()
            .map(|(k, v)| (k.as_str(), *v as f32))
            .collect();
        scalars.push(("loss", loss as f32));
        let written =
            summary::EventWriter::create(&dir).and_then(|mut w| w.scalars(self.step, &scalars));
        if let Err(e) = written {
            let d = Diag::new(
                Code::SummariesNotWritten,
                self.info.span,
                format!("cannot write the evaluation's summaries in {}: {e}", dir.display()),
            )
            .label("this estimator's model_dir")
            .help("the metrics are reported all the same; make the directory writable to keep them for TensorBoard");
            self.warn(d);
        }
    }

    /// Runs the predict section over the predict input and writes `predictions.jsonl`
    /// (one object per example) and one `.npy` per output into `out`.
    pub fn predict(&mut self, out: &Path, steps: Option<u64>) -> Res<PredictReport> {
        let (c, ds) = self.input(SectionKind::Predict)?;
        if !c.graph.outputs.iter().any(|o| o.role == Role::Prediction) {
            return Err(Diag::new(
                Code::InvalidModel,
                self.info.span,
                "the model has no predictions: its predict section is missing or empty",
            )
            .label("this estimator's model")
            .help("add `predict { name = value }` to the model, one line per prediction (e.g. `predict { classes = argmax(logits, 1) }`)")
            .into());
        }
        self.prepare(Need::Checkpoint)?;
        if steps.is_none() && ds.repeats_forever() {
            return Err(Diag::new(
                Code::EndlessEval,
                ds.span(),
                "the predict input repeats forever and no step count is given",
            )
            .label("this input never ends")
            .help("pass --steps N, or remove `repeat` from the predict input")
            .into());
        }
        let g = &c.graph;
        let feeder = Feeder::new(g, ds.span());
        let outs = g.outputs_with(Role::Prediction);
        let targets: Vec<NodeIndex> = outs.iter().map(|o| o.1).collect();
        let exe = self.run_exe(&c, SectionKind::Predict, &targets)?;
        let mut pipe = self.start_pipeline(&ds, SectionKind::Predict)?;
        let (_, ranks) = self.rank();
        let mut lines = String::new();
        let mut acc: Vec<Vec<Tensor>> = vec![Vec::new(); outs.len()];
        let mut examples = 0u64;
        let mut count = 0u64;
        while steps.is_none_or(|s| count < s) {
            // one batch (of each rank, in rank order)
            let (present, batches) = self.read_shared(&mut pipe, 1, Phase::Predict)?;
            if present == 0 {
                break;
            }
            let mut items = Vec::with_capacity(1);
            let mut failure = None;
            for (i, mut batch) in batches {
                batch.truncate(feeder.names.len());
                let when = format!("in predict batch {}", count * ranks as u64 + i as u64 + 1);
                match self.run_fed(exe, &feeder, batch, 0, &when) {
                    // Predictions keep the batch dimension (the front end checks): one
                    // line per real example.
                    Ok((values, real)) => items.push(EvalItem {
                        shard: i,
                        real,
                        loss: 0.0,
                        args: vec![values.iter().map(|t| first_rows(t, real)).collect()],
                    }),
                    Err(f) => failure = Some(f),
                }
            }
            let items = self.gather_items(Phase::Predict, items, failure, count)?;
            for it in items {
                let Some(vals) = it.args.into_iter().next() else {
                    continue;
                };
                let rows = vals
                    .first()
                    .map_or(0, |t| t.shape().first().copied().unwrap_or(1));
                for r in 0..rows {
                    let mut obj = serde_json::Map::new();
                    for ((name, _), t) in outs.iter().zip(&vals) {
                        obj.insert(name.clone(), row(t, r).to_json());
                    }
                    lines.push_str(&serde_json::Value::Object(obj).to_string());
                    lines.push('\n');
                }
                examples += rows as u64;
                for (a, t) in acc.iter_mut().zip(vals) {
                    a.push(t);
                }
            }
            count += 1;
        }
        if examples == 0 {
            return Err(self.no_examples(SectionKind::Predict, steps, ds.span()));
        }
        if !self.chief() {
            // rank 0 writes them
            self.note_skipped(&pipe);
            return Ok(PredictReport {
                examples,
                files: Vec::new(),
            });
        }
        std::fs::create_dir_all(out)
            .map_err(|e| self.io_diag(format!("cannot create {}: {e}", out.display())))?;
        let mut files = Vec::new();
        let p = out.join("predictions.jsonl");
        crate::atomic::write_output_bytes(&p, lines.as_bytes())
            .map_err(|e| self.io_diag(format!("cannot write {}: {e}", p.display())))?;
        files.push(p);
        for ((name, _), parts) in outs.iter().zip(acc) {
            if parts.is_empty() {
                continue;
            }
            let items: Vec<Element> = parts.into_iter().map(|t| vec![t]).collect();
            let all = concat_rows(&items);
            let p = out.join(format!("{}.npy", name.replace('/', "_")));
            crate::atomic::write_output_bytes(&p, &records::npy_bytes(&all))
                .map_err(|e| self.io_diag(format!("cannot write {}: {e}", p.display())))?;
            files.push(p);
        }
        self.note_skipped(&pipe);
        Ok(PredictReport { examples, files })
    }
}

/// Row `r` of a batched tensor.
fn row(t: &Tensor, r: usize) -> Tensor {
    if t.shape().is_empty() {
        return t.clone();
    }
    let sub = |d: &interp::Data| -> interp::Data {
        match d {
            interp::Data::F(a) => {
                interp::Data::F(a.index_axis(ndarray::Axis(0), r).to_owned().into_shared())
            }
            interp::Data::I(a) => {
                interp::Data::I(a.index_axis(ndarray::Axis(0), r).to_owned().into_shared())
            }
            interp::Data::B(a) => {
                interp::Data::B(a.index_axis(ndarray::Axis(0), r).to_owned().into_shared())
            }
            interp::Data::S(a) => {
                interp::Data::S(a.index_axis(ndarray::Axis(0), r).to_owned().into_shared())
            }
        }
    };
    Tensor {
        dtype: t.dtype,
        data: sub(&t.data),
    }
}

/// Batches concatenated along their first axis.
fn concat_rows(items: &[Element]) -> Tensor {
    let first = &items[0][0];
    if items.len() == 1 {
        return first.clone();
    }
    let all: Vec<&Tensor> = items.iter().map(|e| &e[0]).collect();
    let mut shape = first.shape().to_vec();
    shape[0] = all.iter().map(|t| t.shape()[0]).sum();
    interp::ops::eval(
        &Op::Concat { axis: 0 },
        &all,
        &TensorType::new(first.dtype, shape),
        &env(),
    )
    .unwrap_or_else(|_| first.clone())
}

/// What one batch of an evaluation (or prediction) adds: its shard (of every rank's),
/// real rows, loss, and each metric's arguments (a prediction's outputs).
struct EvalItem {
    shard: usize,
    real: usize,
    loss: f64,
    args: Vec<Vec<Tensor>>,
}

impl Estimator {
    /// The next group of an evaluation's or prediction's input (`read_group`); a
    /// rank whose input fails tells the others, which wait in `phase`'s exchange.
    fn read_shared(
        &mut self,
        pipe: &mut pipeline::Pipeline,
        per_rank: usize,
        phase: Phase,
    ) -> Res<(usize, Vec<(usize, Element)>)> {
        let read = self.read_group(pipe, per_rank);
        if read.is_err() && self.rank().1 > 1 {
            let _ = self.exchange(phase, &[0]);
        }
        read
    }

    /// Every rank's items of one group of batches, in rank order (a collective;
    /// alone, this rank's). A rank that failed its batches (`failure`, here) reports
    /// its own failure, and the others E0924.
    fn gather_items(
        &mut self,
        phase: Phase,
        items: Vec<EvalItem>,
        failure: Option<RunFailure>,
        count: u64,
    ) -> Res<Vec<EvalItem>> {
        if self.rank().1 == 1 {
            return failure.map_or(Ok(items), Err);
        }
        let mut b = vec![u8::from(failure.is_none())];
        b.extend((items.len() as u64).to_le_bytes());
        for it in &items {
            for x in [
                it.shard as u64,
                it.real as u64,
                it.loss.to_bits(),
                it.args.len() as u64,
            ] {
                b.extend(x.to_le_bytes());
            }
            for a in &it.args {
                crate::dist::encode(a, &mut b);
            }
        }
        let all = self.exchange(phase, &b);
        if let Some(f) = failure {
            return Err(f);
        }
        let all = all?;
        let what = if phase == Phase::Eval {
            "eval"
        } else {
            "predict"
        };
        let when = format!("in {what} batch {}", count + 1);
        let mut out = Vec::new();
        for (r, b) in all.iter().enumerate() {
            if b.first() != Some(&1) {
                return Err(self.rank_failed(r, &when));
            }
            decode_items(b, &mut out).ok_or_else(|| {
                self.io_diag(format!(
                    "rank {r} sent results that could not be read {when}"
                ))
            })?;
        }
        Ok(out)
    }
}

fn decode_items(b: &[u8], out: &mut Vec<EvalItem>) -> Option<()> {
    let mut at = 1;
    let u = |at: &mut usize| crate::dist::read_u64(b, at);
    let n = u(&mut at)?;
    for _ in 0..n {
        let (shard, real, loss, k) = (u(&mut at)?, u(&mut at)?, u(&mut at)?, u(&mut at)?);
        let mut args = Vec::with_capacity(k.min(1 << 16) as usize);
        for _ in 0..k {
            args.push(crate::dist::decode(b, &mut at)?);
        }
        out.push(EvalItem {
            shard: shard as usize,
            real: real as usize,
            loss: f64::from_bits(loss),
            args,
        });
    }
    Some(())
}
