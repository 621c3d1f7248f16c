//! Runs an input pipeline (`elab::data::Dataset`) on the host: a chain of pull-based
//! stages, one per `Stage`, producing elements as flat lists of tensors (the leaves of
//! the element's structure, in order).
//!
//! Randomness (`shuffle`) comes from the counter-based generator keyed by the run seed,
//! the stage and the epoch, so a pipeline's order is a pure function of the seed, and a
//! resumed run gets the same stream by skipping the elements already consumed.
//!
//! This is the simple single-threaded executor the runtime needs to train; sources:
//! csv/tsv, text, range, npy, tfrecord with `parse`; every transform.

use super::records;
use crate::diag::{Code, Diag};
use crate::elab::data::{Dataset, Elem, Stage, StageKind};
use crate::interp::rng::Stream;
use crate::interp::tensor::{Arr, Data, Tensor};
use crate::interp::{self, OpEnv};
use crate::ir::{DType, Graph, TensorType};
use ndarray::IxDyn;
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// One element: its leaf tensors, in the order of `leaf_paths`.
pub type Element = Vec<Tensor>;

type Next = Result<Option<Element>, Diag>;

/// The names of an element's leaves: `0`, `1` for tuples, `r.x` for records, `element`
/// for a lone tensor (as closure graphs name their inputs).
pub fn leaf_paths(e: &Elem) -> Vec<String> {
    fn go(e: &Elem, path: &str, out: &mut Vec<String>) {
        match e {
            Elem::Tensor { .. } => out.push(if path.is_empty() {
                "element".to_string()
            } else {
                path.to_string()
            }),
            Elem::Tuple(xs) => {
                for (i, x) in xs.iter().enumerate() {
                    go(x, &join(path, &i.to_string()), out);
                }
            }
            Elem::Record(fs) => {
                for (k, x) in fs {
                    go(x, &join(path, k), out);
                }
            }
        }
    }
    let mut out = Vec::new();
    go(e, "", &mut out);
    out
}

/// The shapes of an element's leaves (unknown dimensions as 0).
pub fn leaf_shapes(e: &Elem) -> Vec<Vec<usize>> {
    match e {
        Elem::Tensor { dims, .. } => vec![dims.iter().map(|d| d.unwrap_or(0)).collect()],
        Elem::Tuple(xs) => xs.iter().flat_map(leaf_shapes).collect(),
        Elem::Record(fs) => fs.iter().flat_map(|(_, x)| leaf_shapes(x)).collect(),
    }
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

/// What a pipeline run shares: the seed, where relative paths start, and the in-memory
/// caches (which outlive the repetitions of the stages above them).
pub struct PipeCtx {
    pub seed: u64,
    pub base: PathBuf,
    caches: RefCell<FxHashMap<usize, Rc<Vec<Element>>>>,
}

impl PipeCtx {
    pub fn new(seed: u64, base: &Path) -> Rc<PipeCtx> {
        Rc::new(PipeCtx {
            seed,
            base: base.to_path_buf(),
            caches: RefCell::new(FxHashMap::default()),
        })
    }

    fn path(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.base.join(p)
        }
    }
}

/// A running pipeline.
pub struct Pipeline {
    it: Box<dyn Iterator<Item = Result<Element, Diag>>>,
    /// How many elements it has produced.
    pub position: u64,
}

impl Pipeline {
    pub fn new(ds: &Dataset, ctx: Rc<PipeCtx>) -> Pipeline {
        Pipeline {
            it: build(Rc::new(ds.stages.clone()), ds.stages.len(), ctx, 0),
            position: 0,
        }
    }

    pub fn next_element(&mut self) -> Next {
        match self.it.next() {
            Some(Ok(e)) => {
                self.position += 1;
                Ok(Some(e))
            }
            Some(Err(d)) => Err(d),
            None => Ok(None),
        }
    }

    /// Skips `n` elements (to resume at a saved position).
    pub fn skip_to(&mut self, n: u64) -> Result<(), Diag> {
        while self.position < n {
            if self.next_element()?.is_none() {
                break;
            }
        }
        Ok(())
    }
}

type It = Box<dyn Iterator<Item = Result<Element, Diag>>>;

/// The iterator of the first `upto` stages, in repetition `epoch`.
fn build(stages: Rc<Vec<Stage>>, upto: usize, ctx: Rc<PipeCtx>, epoch: u64) -> It {
    if upto == 0 {
        return Box::new(std::iter::empty());
    }
    let k = upto - 1;
    let stage = stages[k].clone();
    let span = stage.span;
    let input_elem = if k > 0 {
        Some(stages[k - 1].elem.clone())
    } else {
        None
    };
    let upstream =
        |stages: &Rc<Vec<Stage>>, ctx: &Rc<PipeCtx>| build(stages.clone(), k, ctx.clone(), epoch);
    match stage.kind {
        StageKind::Csv {
            path,
            header,
            columns,
            delimiter,
        } => {
            let full = ctx.path(&path);
            match std::fs::read_to_string(&full) {
                Err(e) => err_iter(io_diag(span, &full, &e)),
                Ok(text) => match read_csv(
                    &full,
                    &text,
                    header,
                    &columns,
                    &leaf_shapes(&stage.elem),
                    delimiter,
                ) {
                    Ok(rows) => Box::new(rows.into_iter().map(Ok)),
                    Err(msg) => err_iter(Diag::new(Code::BadData, span, msg).label("this source")),
                },
            }
        }
        StageKind::Text { path } => match std::fs::read(ctx.path(&path)) {
            Ok(bytes) => {
                let lines: Vec<Element> = bytes
                    .split(|&b| b == b'\n')
                    .filter(|l| !l.is_empty())
                    .map(|l| vec![bytes_scalar(l.strip_suffix(b"\r").unwrap_or(l).to_vec())])
                    .collect();
                Box::new(lines.into_iter().map(Ok))
            }
            Err(e) => err_iter(io_diag(span, &ctx.path(&path), &e)),
        },
        StageKind::Range { n } => Box::new(
            (0..n).map(|i| Ok(vec![Tensor::int(DType::I32, Arr::from_elem(IxDyn(&[]), i))])),
        ),
        StageKind::Npy { path, dtype, dims } => {
            let full = ctx.path(&path);
            if let Err(e) = std::fs::metadata(&full) {
                return err_iter(io_diag(span, &full, &e));
            }
            match records::read_npy(&full, dtype, &dims) {
                Ok(rows) => Box::new(rows.into_iter().map(|t| Ok(vec![t]))),
                Err(msg) => err_iter(Diag::new(Code::BadData, span, msg).label("this source")),
            }
        }
        StageKind::TfRecord { paths } => {
            let mut files = Vec::new();
            for p in &paths {
                let full = ctx.path(p);
                match records::glob(&full) {
                    Ok(mut f) => files.append(&mut f),
                    Err(msg) => {
                        return err_iter(Diag::new(Code::RunIo, span, msg).label("this source"))
                    }
                }
            }
            Box::new(records::TfRecordReader::new(files, span))
        }
        StageKind::Png { .. } => err_iter(
            Diag::new(
                Code::RunIo,
                span,
                "the runtime does not read `png` sources yet",
            )
            .label("this source")
            .help("convert the images to a csv or npy file, or use `estc check` only"),
        ),
        StageKind::Parse { features } => {
            let up = upstream(&stages, &ctx);
            Box::new(up.map(move |e| {
                let e = e?;
                records::parse_example(e[0].s().iter().next().map_or(&[][..], |v| v), &features)
                    .map_err(|m| Diag::new(Code::BadData, span, m).label("in this parse"))
            }))
        }
        StageKind::Map { graph, .. } => {
            let paths = leaf_paths(input_elem.as_ref().expect("map follows a source"));
            let up = upstream(&stages, &ctx);
            let runner = ClosureRunner::new(*graph, paths, ctx.seed ^ (k as u64));
            Box::new(up.enumerate().map(move |(i, e)| runner.run(e?, i as u64)))
        }
        StageKind::Filter { graph } => {
            let paths = leaf_paths(input_elem.as_ref().expect("filter follows a source"));
            let up = upstream(&stages, &ctx);
            let runner = ClosureRunner::new(*graph, paths, ctx.seed ^ (k as u64));
            Box::new(up.enumerate().filter_map(move |(i, e)| match e {
                Err(d) => Some(Err(d)),
                Ok(e) => match runner.run(e.clone(), i as u64) {
                    Err(d) => Some(Err(d)),
                    Ok(out) => (out[0].scalar() != 0.0).then_some(Ok(e)),
                },
            }))
        }
        StageKind::Shuffle { buffer, seed } => {
            let seed = seed.map_or(ctx.seed, |s| s as u64);
            let stream = Stream::new(seed, 0x5348_5546 ^ (k as u64));
            Box::new(Shuffle {
                up: upstream(&stages, &ctx),
                buf: Vec::with_capacity(buffer.min(1 << 20)),
                size: buffer.max(1),
                stream,
                epoch,
                drawn: 0,
                done: false,
            })
        }
        StageKind::Repeat { count } => {
            let stages2 = stages.clone();
            let ctx2 = ctx.clone();
            let mut rep: u64 = 0;
            let mut cur: Option<It> = None;
            let mut produced_any = false;
            Box::new(std::iter::from_fn(move || loop {
                if let Some(limit) = count {
                    if rep >= limit as u64 {
                        return None;
                    }
                }
                let it = cur.get_or_insert_with(|| {
                    build(stages2.clone(), k, ctx2.clone(), epoch * 1_000_003 + rep)
                });
                match it.next() {
                    Some(x) => {
                        produced_any = true;
                        return Some(x);
                    }
                    None => {
                        cur = None;
                        rep += 1;
                        if !produced_any {
                            return None; // an empty dataset repeated is empty
                        }
                    }
                }
            }))
        }
        StageKind::Batch {
            size,
            drop_remainder,
            padded,
        } => {
            let mut up = upstream(&stages, &ctx);
            Box::new(std::iter::from_fn(move || {
                let mut items = Vec::with_capacity(size);
                while items.len() < size {
                    match up.next() {
                        Some(Ok(e)) => items.push(e),
                        Some(Err(d)) => return Some(Err(d)),
                        None => break,
                    }
                }
                if items.is_empty() || (drop_remainder && items.len() < size) {
                    return None;
                }
                Some(
                    stack(&items, padded)
                        .map_err(|m| Diag::new(Code::BadData, span, m).label("in this batch")),
                )
            }))
        }
        StageKind::Cache { .. } => {
            let cached = ctx.caches.borrow().get(&k).cloned();
            match cached {
                Some(all) => Box::new((0..all.len()).map(move |i| Ok(all[i].clone()))),
                None => {
                    let mut up = upstream(&stages, &ctx);
                    let mut acc: Vec<Element> = Vec::new();
                    let ctx2 = ctx.clone();
                    let mut done = false;
                    Box::new(std::iter::from_fn(move || {
                        if done {
                            return None;
                        }
                        match up.next() {
                            Some(Ok(e)) => {
                                acc.push(e.clone());
                                Some(Ok(e))
                            }
                            Some(Err(d)) => Some(Err(d)),
                            None => {
                                done = true;
                                ctx2.caches
                                    .borrow_mut()
                                    .insert(k, Rc::new(std::mem::take(&mut acc)));
                                None
                            }
                        }
                    }))
                }
            }
        }
        StageKind::Prefetch { .. } | StageKind::Interleave { .. } => upstream(&stages, &ctx),
        StageKind::Shard { n, index } => Box::new(
            upstream(&stages, &ctx)
                .enumerate()
                .filter(move |(i, _)| i % n == index)
                .map(|(_, e)| e),
        ),
        StageKind::Take { n } => Box::new(upstream(&stages, &ctx).take(n)),
        StageKind::Skip { n } => Box::new(upstream(&stages, &ctx).skip(n)),
        StageKind::Zip { other } => {
            let a = upstream(&stages, &ctx);
            let b = build(
                Rc::new(other.stages.clone()),
                other.stages.len(),
                ctx.clone(),
                epoch,
            );
            Box::new(a.zip(b).map(|(x, y)| {
                let mut x = x?;
                x.extend(y?);
                Ok(x)
            }))
        }
    }
}

fn err_iter(d: Diag) -> It {
    Box::new(std::iter::once(Err(d)))
}

pub fn io_diag(span: crate::span::Span, path: &Path, e: &std::io::Error) -> Diag {
    Diag::new(
        Code::RunIo,
        span,
        format!("cannot read {}: {e}", path.display()),
    )
    .label("this source")
    .help("paths in a program are relative to the directory of its .est file")
}

fn bytes_scalar(b: Vec<u8>) -> Tensor {
    Tensor {
        dtype: DType::Bytes,
        data: Data::S(Arr::from_elem(IxDyn(&[]), b)),
    }
}

/// A shuffle buffer: fills up to `size`, then yields a random element of it per pull.
struct Shuffle {
    up: It,
    buf: Vec<Element>,
    size: usize,
    stream: Stream,
    epoch: u64,
    drawn: u64,
    done: bool,
}

impl Iterator for Shuffle {
    type Item = Result<Element, Diag>;
    fn next(&mut self) -> Option<Self::Item> {
        while !self.done && self.buf.len() < self.size {
            match self.up.next() {
                Some(Ok(e)) => self.buf.push(e),
                Some(Err(d)) => return Some(Err(d)),
                None => self.done = true,
            }
        }
        if self.buf.is_empty() {
            return None;
        }
        let u = self.stream.uniform(self.drawn, self.epoch);
        self.drawn += 1;
        let i = ((u as f64) * self.buf.len() as f64) as usize;
        Some(Ok(self.buf.swap_remove(i.min(self.buf.len() - 1))))
    }
}

/// Runs a `map` or `filter` closure graph on one element. Random ops in a closure
/// draw from the run seed (mixed with the stage) with the element's index as the
/// step, so every element gets its own numbers, the same in every run.
struct ClosureRunner {
    graph: Graph,
    paths: Vec<String>,
    plan: interp::Plan,
    seed: u64,
}

impl ClosureRunner {
    fn new(graph: Graph, paths: Vec<String>, seed: u64) -> ClosureRunner {
        let targets: Vec<_> = graph.outputs.iter().map(|o| o.node).collect();
        let plan = interp::Plan::new(&graph, &targets, &Default::default());
        ClosureRunner {
            graph,
            paths,
            plan,
            seed,
        }
    }

    fn run(&self, e: Element, index: u64) -> Result<Element, Diag> {
        let feeds: FxHashMap<String, Tensor> = self.paths.iter().cloned().zip(e).collect();
        let vars = FxHashMap::default();
        let env = interp::Env {
            feeds: &feeds,
            vars: &vars,
            op: OpEnv {
                step: index as i64,
                seed: self.seed,
                shard: 0,
            },
        };
        let mut values = interp::Values::new(0);
        interp::execute(&self.graph, &self.plan, &env, &mut values).map_err(|e| {
            Diag::new(Code::BadData, e.span, format!("{}: {}", e.op, e.message))
                .label("in this closure")
        })?;
        Ok(self
            .graph
            .outputs
            .iter()
            .map(|o| values.get(o.node).cloned().expect("target"))
            .collect())
    }
}

/// Stacks elements into a batch (with `padded`, shorter leaves are zero-padded to the
/// longest along every axis).
pub fn stack(items: &[Element], padded: bool) -> Result<Element, String> {
    let leaves = items[0].len();
    let mut out = Vec::with_capacity(leaves);
    for l in 0..leaves {
        let first = &items[0][l];
        let mut shape: Vec<usize> = first.shape().to_vec();
        for it in items {
            let s = it[l].shape();
            if s.len() != shape.len() {
                return Err(format!(
                    "elements of ranks {} and {} cannot be batched",
                    shape.len(),
                    s.len()
                ));
            }
            for (d, &x) in shape.iter_mut().zip(s) {
                if x != *d {
                    if !padded {
                        return Err(format!(
                            "elements of shapes {:?} and {:?} cannot be batched; use `padded_batch`",
                            first.shape(),
                            s
                        ));
                    }
                    *d = (*d).max(x);
                }
            }
        }
        let mut full = vec![items.len()];
        full.extend(&shape);
        let ty = TensorType::new(first.dtype, full.clone());
        let per: usize = shape.iter().product();
        macro_rules! st {
            ($get:ident, $zero:expr, $wrap:expr) => {{
                let mut v = Vec::with_capacity(items.len() * per);
                for it in items {
                    let a = it[l].$get();
                    if a.shape() == shape.as_slice() {
                        v.extend(a.iter().cloned());
                    } else {
                        let mut p = ndarray::ArrayD::from_elem(IxDyn(&shape), $zero);
                        let sl: Vec<ndarray::SliceInfoElem> = a
                            .shape()
                            .iter()
                            .map(|&n| ndarray::SliceInfoElem::from(0..n))
                            .collect();
                        p.slice_mut(sl.as_slice()).assign(a);
                        v.extend(p.iter().cloned());
                    }
                }
                $wrap(Arr::from_shape_vec(IxDyn(&full), v).map_err(|e| e.to_string())?)
            }};
        }
        let t = match &first.data {
            Data::F(_) => st!(f, 0f32, |a| Tensor::float(ty.dtype, a)),
            Data::I(_) => st!(i, 0i64, |a| Tensor::int(ty.dtype, a)),
            Data::B(_) => st!(b, false, Tensor::bool),
            Data::S(_) => st!(s, Vec::new(), |a| Tensor {
                dtype: DType::Bytes,
                data: Data::S(a)
            }),
        };
        out.push(t);
    }
    Ok(out)
}

/// Reads a CSV file into elements: one tensor per column group (`n` values of a vector
/// column take `n` fields).
fn read_csv(
    path: &Path,
    text: &str,
    header: bool,
    columns: &[(String, DType, usize)],
    shapes: &[Vec<usize>],
    delimiter: u8,
) -> Result<Vec<Element>, String> {
    let want: usize = columns.iter().map(|(_, _, n)| (*n).max(1)).sum();
    let mut rows = Vec::new();
    for (line_no, line) in text.lines().enumerate().skip(usize::from(header)) {
        let line = line.trim_end_matches('\r');
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(delimiter as char).collect();
        if fields.len() != want {
            return Err(format!(
                "{}:{}: {} fields, but the columns need {want}",
                path.display(),
                line_no + 1,
                fields.len()
            ));
        }
        let mut at = 0;
        let mut elem = Vec::with_capacity(columns.len());
        for ((name, dtype, n), shape) in columns.iter().zip(shapes) {
            let count = (*n).max(1);
            let ty = TensorType::new(*dtype, shape.clone());
            let fs = &fields[at..at + count];
            at += count;
            if *dtype == DType::Bytes {
                elem.push(bytes_scalar(fs[0].as_bytes().to_vec()));
                continue;
            }
            let mut v = Vec::with_capacity(count);
            for f in fs {
                let x: f64 = f.trim().parse().map_err(|_| {
                    format!(
                        "{}:{}: column `{name}`: `{f}` is not a number",
                        path.display(),
                        line_no + 1
                    )
                })?;
                v.push(x);
            }
            elem.push(Tensor::from_f64(&ty, v));
        }
        rows.push(elem);
    }
    if rows.is_empty() {
        return Err(format!("{} has no rows", path.display()));
    }
    Ok(rows)
}
