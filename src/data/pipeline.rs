//! Runs an input pipeline (`elab::data::Dataset`) on host threads: a chain of
//! pull-based stages, one per `Stage`, producing elements as flat lists of tensors (the
//! leaves of the element's structure, in order).
//!
//! Threads and back-pressure:
//! - Every input worker runs its whole chain on a thread of its own and hands elements
//!   to the consumer through a bounded channel (`prefetch`), so the pipeline runs
//!   ahead of training by at most that many elements and then waits.
//! - `prefetch(n)` inside a chain does the same for the stages above it.
//! - `map` runs its closure on a pool of threads (`parallel`, 0 for one per core) with
//!   a bounded window of elements in flight; results are handed on in input order. A
//!   `parse` right before a parallel `map` runs in the same pool.
//!
//! Determinism: the order of elements depends only on the seed, never on thread
//! timing. Randomness (`shuffle`, random ops in closures, `synthetic`) comes from the
//! counter-based generator keyed by the worker's seed, the stage, the epoch and the
//! element index. Worker `w` of `input_workers` shuffles with a seed derived from the
//! run seed and `w` (worker 0 with the run seed itself); the consumer takes elements
//! from the workers in turn. A resumed run rebuilds the pipeline and skips the
//! elements already consumed, so it continues with the next element.

use super::cache::{self, CacheData};
use super::csv;
use super::records;
use super::sources::{self, bytes_scalar, RangeSource, TfRecordSource, VecSource};
use crate::backend::interp::{self, OpEnv};
use crate::diag::{Code, Diag};
use crate::elab::data::{Dataset, Elem, Stage, StageKind};
use crate::ir::{DType, Graph};
use crate::rng::Stream as Rng;
use crate::tensor::{Arr, Data, Tensor};
use ndarray::IxDyn;
use petgraph::visit::NodeIndexable;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

/// One element: its leaf tensors, in the order of `leaf_paths`.
pub type Element = Vec<Tensor>;

pub type Next = Result<Option<Element>, Diag>;

/// Where an element came from: a record of a file.
#[derive(Debug, Clone)]
pub struct Origin {
    pub file: Arc<Path>,
    pub index: u64,
    pub offset: u64,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: record {} at byte {}",
            self.file.display(),
            self.index,
            self.offset
        )
    }
}

/// One running stage.
pub trait Stream: Send {
    /// The next element; `Ok(None)` at the end.
    fn next(&mut self) -> Next;
    /// The next `n` elements as one batch, when the stage holds them contiguously and
    /// can hand them out without copying; `None` (consuming nothing) otherwise.
    fn next_rows(&mut self, _n: usize) -> Option<Element> {
        None
    }
    /// Where the element last returned came from, for errors.
    fn origin(&self) -> Option<Origin> {
        None
    }
    /// Passes over the next `n` elements, as `next` would have given them (the same
    /// elements, the same random numbers after them), doing no more work than it must;
    /// returns how many there were.
    fn skip(&mut self, n: u64) -> Result<u64, Diag> {
        let mut k = 0;
        while k < n && self.next()?.is_some() {
            k += 1;
        }
        Ok(k)
    }
}

type Src = Box<dyn Stream>;

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

/// How to run a pipeline.
#[derive(Debug, Clone)]
pub struct PipeOptions {
    /// The run seed.
    pub seed: u64,
    /// Where relative data paths start.
    pub base: PathBuf,
    /// Input workers: copies of the pipeline, each on its own thread with its own seed.
    pub workers: usize,
    /// Threads of a `map` with `parallel: 0`.
    pub threads: usize,
    /// Where `cache("id")` files go.
    pub cache_dir: PathBuf,
    /// Elements each worker prepares ahead of the consumer.
    pub prefetch: usize,
    /// The part of the elements this rank of a run across ranks computes.
    pub share: Option<Share>,
}

/// The elements one rank of a data-parallel run computes: of each group of
/// `ranks * per_rank` elements (counted from where the pipeline starts), the
/// `per_rank` from `rank * per_rank` on. Every rank
/// walks the same elements (so that all agree on where the input ends and resume at
/// one position), passing over the others' without computing them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub rank: usize,
    pub ranks: usize,
    pub per_rank: usize,
}

impl Share {
    /// Whether element `p` is this rank's, of a pipeline started at `start`.
    pub fn keeps(&self, start: u64, p: u64) -> bool {
        let group = (self.ranks * self.per_rank).max(1) as u64;
        (p.saturating_sub(start) % group) / self.per_rank.max(1) as u64 == self.rank as u64
    }
}

/// A worker's stream under a `Share`: its elements for other ranks are skipped
/// upstream (no `map` runs for them) and stand as empty elements.
struct Pass {
    up: Src,
    share: Share,
    /// The position of the worker's next element, the distance between its
    /// elements (the workers), and where the pipeline started (its groups count from
    /// there).
    at: u64,
    step: u64,
    start: u64,
}

impl Stream for Pass {
    fn next(&mut self) -> Next {
        let e = if self.share.keeps(self.start, self.at) {
            self.up.next()?
        } else if self.up.skip(1)? == 1 {
            Some(Vec::new())
        } else {
            None
        };
        if e.is_some() {
            self.at += self.step;
        }
        Ok(e)
    }
}

impl PipeOptions {
    pub fn new(seed: u64, base: &Path) -> PipeOptions {
        PipeOptions {
            seed,
            base: base.to_path_buf(),
            workers: 1,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cache_dir: cache::default_dir(base),
            prefetch: 2,
            share: None,
        }
    }
}

/// The seed of input worker `w`: the run seed for worker 0, and a mix of the two for
/// the others, so that every worker shuffles differently.
pub fn worker_seed(seed: u64, w: usize) -> u64 {
    if w == 0 {
        seed
    } else {
        mix(seed, w as u64)
    }
}

/// The most elements a `prefetch` (or a worker) prepares ahead, and the most threads a
/// `map` runs on, whatever the program asks for.
const MAX_AHEAD: usize = 1 << 16;
const MAX_THREADS: usize = 64;

/// The error for a panic in a pipeline thread (a bug): reported, never a silent end.
fn thread_panic(what: &str) -> Diag {
    Diag::new(
        Code::RunFailed,
        crate::span::Span::default(),
        format!("internal error: an input pipeline thread failed ({what})"),
    )
    .help("this is a bug in est; please report it with the program and its data")
}

/// A cache stage and the file its chain is restricted to (under `interleave`).
type CacheKey = (u64, usize, Option<usize>);

/// A list of stages: the pipeline's own (scope 0), or a zipped dataset's, whose scope
/// tells its stages' caches and random streams apart from those of the main list.
struct Chain {
    stages: Vec<Stage>,
    scope: u64,
}

/// Mixes two numbers into a seed (splitmix64).
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of the closure of stage `k` in repetition `epoch`: the worker's seed mixed
/// with the stage, its chain and the epoch, so that random ops in a `map` draw new
/// numbers every epoch.
fn closure_seed(seed: u64, chain: &Chain, k: usize, epoch: u64) -> u64 {
    let s = seed ^ k as u64;
    if chain.scope == 0 && epoch == 0 {
        s
    } else {
        mix(mix(s, chain.scope), epoch)
    }
}

/// What the stages of one worker share.
struct Ctx {
    seed: u64,
    base: PathBuf,
    threads: usize,
    cache_dir: PathBuf,
    /// Finished in-memory caches, by stage and file restriction; they outlive the
    /// repetitions of the stages above them.
    caches: Mutex<FxHashMap<CacheKey, Arc<CacheData>>>,
    /// Damaged records skipped (shared by all workers).
    skipped: Arc<AtomicU64>,
}

/// A running pipeline.
pub struct Pipeline {
    workers: Vec<Src>,
    /// How many elements it has produced.
    pub position: u64,
    skipped: Arc<AtomicU64>,
}

impl Pipeline {
    /// Starts a pipeline after checking that its files exist and are not empty.
    pub fn new(ds: &Dataset, opts: &PipeOptions) -> Result<Pipeline, Diag> {
        Pipeline::new_at(ds, opts, 0)
    }

    /// Starts a pipeline at element `position` (to resume from a checkpoint). Each
    /// worker passes over its share of the elements before its thread starts: stages
    /// that need not compute a skipped element do not (a `map` runs no closure, a batch
    /// stacks nothing, a cache replay just moves on), and the rest pull as usual.
    pub fn new_at(ds: &Dataset, opts: &PipeOptions, position: u64) -> Result<Pipeline, Diag> {
        sources::check_sources(ds, &opts.base)?;
        let chain = Arc::new(Chain {
            stages: ds.stages.clone(),
            scope: 0,
        });
        let skipped = Arc::new(AtomicU64::new(0));
        let n = opts.workers.max(1) as u64;
        let workers = (0..n as usize)
            .map(|w| {
                let ctx = Arc::new(Ctx {
                    seed: worker_seed(opts.seed, w),
                    base: opts.base.clone(),
                    threads: opts.threads.max(1),
                    cache_dir: opts.cache_dir.clone(),
                    caches: Mutex::new(FxHashMap::default()),
                    skipped: skipped.clone(),
                });
                let mut src = build(&chain, chain.stages.len(), &ctx, 0, None);
                // positions p < position with p % n == w
                let share = (position + n - 1 - w as u64) / n;
                src.skip(share)?;
                if let Some(s) = opts.share {
                    src = Box::new(Pass {
                        up: src,
                        share: s,
                        at: w as u64 + share * n,
                        step: n,
                        start: position,
                    });
                }
                Ok(Box::new(Prefetch::spawn(src, opts.prefetch.clamp(1, MAX_AHEAD))) as Src)
            })
            .collect::<Result<Vec<_>, Diag>>()?;
        Ok(Pipeline {
            workers,
            position,
            skipped,
        })
    }

    /// The next element; under a `Share`, another rank's is empty (it was not
    /// computed).
    pub fn next_element(&mut self) -> Next {
        let w = (self.position % self.workers.len() as u64) as usize;
        let e = self.workers[w].next()?;
        if e.is_some() {
            self.position += 1;
        }
        Ok(e)
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

    /// Damaged records skipped so far (`skip_corrupt: true`).
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }
}

struct ErrSrc(Option<Diag>);

impl Stream for ErrSrc {
    fn next(&mut self) -> Next {
        match self.0.take() {
            Some(d) => Err(d),
            None => Ok(None),
        }
    }
}

fn err_src(d: Diag) -> Src {
    Box::new(ErrSrc(Some(d)))
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

/// The chain of the first `upto` stages, in repetition `epoch`, reading only file
/// `file` of its source when given (for `interleave`).
fn build(chain: &Arc<Chain>, upto: usize, ctx: &Arc<Ctx>, epoch: u64, file: Option<usize>) -> Src {
    if upto == 0 {
        return Box::new(VecSource::new(Vec::new()));
    }
    let stages = &chain.stages;
    let k = upto - 1;
    let stage = &stages[k];
    let span = stage.span;
    let up = || build(chain, k, ctx, epoch, file);
    match &stage.kind {
        StageKind::TfRecord { skip_corrupt, .. } => match sources::files(stage, &ctx.base) {
            Ok(mut files) => {
                if let Some(i) = file {
                    files = files.into_iter().skip(i).take(1).collect();
                }
                Box::new(TfRecordSource::new(
                    files,
                    *skip_corrupt,
                    ctx.skipped.clone(),
                    span,
                ))
            }
            Err(d) => err_src(d),
        },
        _ if stage_is_source(stage) && file.is_some_and(|i| i > 0) => {
            Box::new(VecSource::new(Vec::new()))
        }
        StageKind::Csv {
            path,
            header,
            columns,
            delimiter,
            defaults,
            missing,
            skip_invalid,
        } => {
            let full = sources::resolve(&ctx.base, path);
            let how = csv::CsvRules {
                header: *header,
                columns,
                shapes: &leaf_shapes(&stage.elem),
                delimiter: *delimiter,
                defaults,
                missing,
                skip_invalid: *skip_invalid,
            };
            match csv::load(&full, &how, span) {
                Ok((rows, skipped)) => {
                    ctx.skipped.fetch_add(skipped, Ordering::Relaxed);
                    Box::new(VecSource::new(rows))
                }
                Err(d) => err_src(d),
            }
        }
        StageKind::Text { path } => {
            let full = sources::resolve(&ctx.base, path);
            match std::fs::read(&full) {
                Ok(bytes) => {
                    let lines: Vec<Element> = bytes
                        .split(|&b| b == b'\n')
                        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
                        .filter(|l| !l.is_empty())
                        .map(|l| vec![bytes_scalar(l.to_vec())])
                        .collect();
                    Box::new(VecSource::new(lines))
                }
                Err(e) => err_src(io_diag(span, &full, &e)),
            }
        }
        StageKind::Range { n } => Box::new(RangeSource::new(*n)),
        StageKind::Slices { rows } => Box::new(VecSource::new(rows.clone())),
        StageKind::FixedLength {
            record_bytes,
            header_bytes,
            footer_bytes,
            ..
        } => match sources::files(stage, &ctx.base) {
            Err(d) => err_src(d),
            Ok(files) => {
                let mut rows = Vec::new();
                let mut failed = None;
                for f in &files {
                    match std::fs::read(f) {
                        Err(e) => {
                            failed = Some(io_diag(span, f, &e));
                            break;
                        }
                        Ok(bytes) => {
                            let body = bytes.len().saturating_sub(header_bytes + footer_bytes);
                            if bytes.len() < header_bytes + footer_bytes || body % record_bytes != 0
                            {
                                failed = Some(
                                    Diag::new(Code::BadData, span, format!("{}: {} bytes are no header of {header_bytes}, whole records of {record_bytes} and a footer of {footer_bytes}", f.display(), bytes.len()))
                                        .label("this source")
                                        .help("check `record_bytes`, `header_bytes` and `footer_bytes` against the file's format"),
                                );
                                break;
                            }
                            let body = &bytes[*header_bytes..header_bytes + body];
                            rows.extend(
                                body.chunks(*record_bytes)
                                    .map(|r| vec![bytes_scalar(r.to_vec())]),
                            );
                        }
                    }
                }
                match failed {
                    Some(d) => err_src(d),
                    None => Box::new(VecSource::new(rows)),
                }
            }
        },
        StageKind::Npy { path, dtype, dims } => {
            let full = sources::resolve(&ctx.base, path);
            match records::read_npy(&full, *dtype, dims) {
                Ok(rows) => Box::new(VecSource::new(rows.into_iter().map(|t| vec![t]).collect())),
                Err(msg) => err_src(Diag::new(Code::BadData, span, msg).label("this source")),
            }
        }
        StageKind::Png { .. } => match sources::files(stage, &ctx.base)
            .and_then(|f| sources::PngSource::new(stage, &ctx.base, f))
        {
            Ok(s) => Box::new(s),
            Err(d) => err_src(d),
        },
        StageKind::Synthetic {
            leaves,
            count,
            classes,
        } => Box::new(sources::SyntheticSource::new(
            leaves.clone(),
            *count,
            *classes,
            ctx.seed,
            (k as u64 ^ chain.scope) as usize,
        )),
        StageKind::Parse { features } => {
            let f = parse_fn(features.clone(), span);
            Box::new(Inline { up: up(), f, i: 0 })
        }
        StageKind::Map { graph, parallel } => {
            let paths = leaf_paths(&stages[k - 1].elem);
            let runner = Arc::new(ClosureRunner::new(
                (**graph).clone(),
                paths,
                closure_seed(ctx.seed, chain, k, epoch),
            ));
            let threads = if *parallel == 0 {
                ctx.threads
            } else {
                *parallel
            }
            .min(MAX_THREADS);
            let map: ElemFn = Arc::new(move |e, i| runner.run(e, i));
            if threads <= 1 {
                return Box::new(Inline {
                    up: up(),
                    f: map,
                    i: 0,
                });
            }
            // A parse right before a parallel map runs in the map's pool.
            let (upstream, f) = match &stages[k - 1].kind {
                StageKind::Parse { features } => {
                    let parse = parse_fn(features.clone(), stages[k - 1].span);
                    let both: ElemFn = Arc::new(move |e, i| map(parse(e, i)?, i));
                    (build(chain, k - 1, ctx, epoch, file), both)
                }
                _ => (up(), map),
            };
            Box::new(ParMap::spawn(upstream, f, threads))
        }
        StageKind::Filter { graph } => {
            let paths = leaf_paths(&stages[k - 1].elem);
            Box::new(Filter {
                up: up(),
                runner: ClosureRunner::new(
                    (**graph).clone(),
                    paths,
                    closure_seed(ctx.seed, chain, k, epoch),
                ),
                i: 0,
            })
        }
        StageKind::Shuffle { buffer, seed } => {
            let seed = seed.map_or(ctx.seed, |s| s as u64);
            Box::new(Shuffle {
                up: up(),
                buf: Vec::with_capacity((*buffer).min(1 << 20)),
                size: (*buffer).max(1),
                rng: Rng::new(seed, 0x5348_5546 ^ (k as u64) ^ chain.scope),
                epoch,
                drawn: 0,
                done: false,
            })
        }
        StageKind::Repeat { count } => Box::new(Repeat {
            chain: chain.clone(),
            k,
            ctx: ctx.clone(),
            epoch,
            file,
            count: *count,
            rep: 0,
            cur: None,
            produced_any: false,
        }),
        StageKind::Batch {
            size,
            drop_remainder,
            padded,
            length,
        } => Box::new(Batch {
            up: up(),
            size: *size,
            drop_remainder: *drop_remainder,
            padded: *padded,
            length: length.clone(),
            span,
        }),
        StageKind::Cache { id, version } => {
            let key = (chain.scope, k, file);
            if let Some(data) = ctx.caches.lock().expect("cache lock").get(&key).cloned() {
                return Box::new(CacheReplay { data, at: 0 });
            }
            let disk = id.as_ref().map(|id| {
                let (fp, random) = cache::fingerprint(stages, k, &ctx.base, ctx.seed, file);
                let mut slot = file.map_or(String::new(), |f| format!("f{f}"));
                if random {
                    slot.push_str(&format!("s{:x}", ctx.seed));
                }
                let (path, id) =
                    cache::file_name(&ctx.cache_dir, id, &slot, version.as_deref(), fp);
                (path, id, fp)
            });
            if let Some((path, _, fp)) = &disk {
                if let Some(elems) = cache::load(path, *fp) {
                    let data = Arc::new(CacheData::new(elems));
                    ctx.caches
                        .lock()
                        .expect("cache lock")
                        .insert(key, data.clone());
                    return Box::new(CacheReplay { data, at: 0 });
                }
            }
            Box::new(CacheFill {
                up: up(),
                acc: Vec::new(),
                ctx: ctx.clone(),
                key,
                disk,
                span,
                done: false,
            })
        }
        StageKind::Prefetch { n } => Box::new(Prefetch::spawn(up(), (*n).clamp(1, MAX_AHEAD))),
        StageKind::Shard { n, index } => Box::new(Shard {
            up: up(),
            n: *n,
            index: *index,
            at: 0,
        }),
        StageKind::Interleave { cycle_length } => {
            // files of a tfrecord source; other sources read one file (or images)
            let nfiles = match &stages[0].kind {
                StageKind::TfRecord { .. } => {
                    sources::files(&stages[0], &ctx.base).map_or(1, |f| f.len().max(1))
                }
                _ => 1,
            };
            if file.is_some() || nfiles <= 1 {
                return up();
            }
            Box::new(Interleave {
                chain: chain.clone(),
                k,
                ctx: ctx.clone(),
                epoch,
                nfiles,
                next_file: 0,
                cycle: *cycle_length,
                slots: Vec::new(),
                cur: 0,
                last: None,
            })
        }
        StageKind::Take { n } => Box::new(Take { up: up(), left: *n }),
        StageKind::Skip { n } => Box::new(Skip { up: up(), left: *n }),
        StageKind::Zip { other } => {
            let oc = Arc::new(Chain {
                stages: other.stages.clone(),
                scope: mix(chain.scope, k as u64 + 1),
            });
            Box::new(Zip {
                a: up(),
                b: build(&oc, oc.stages.len(), ctx, epoch, None),
            })
        }
    }
}

fn stage_is_source(s: &Stage) -> bool {
    matches!(
        s.kind,
        StageKind::Csv { .. }
            | StageKind::Text { .. }
            | StageKind::Npy { .. }
            | StageKind::Png { .. }
            | StageKind::Range { .. }
            | StageKind::Slices { .. }
            | StageKind::FixedLength { .. }
            | StageKind::Synthetic { .. }
    )
}

/// A per-element function: its input element and index within the stage.
type ElemFn = Arc<dyn Fn(Element, u64) -> Result<Element, Diag> + Send + Sync>;

fn parse_fn(features: Vec<(String, DType, Vec<usize>)>, span: crate::span::Span) -> ElemFn {
    Arc::new(move |e, _| {
        let rec = e.first().and_then(|t| match &t.data {
            Data::S(a) => a.iter().next(),
            _ => None,
        });
        records::parse_example(rec.map_or(&[][..], |v| v), &features).map_err(|m| {
            Diag::new(Code::BadData, span, m)
                .label("in this parse")
                .help("the features must match the records: check the names, types and lengths")
        })
    })
}

/// Adds where an element came from to an error about it.
fn with_origin(mut d: Diag, o: Option<&Origin>) -> Diag {
    if let Some(o) = o {
        d.message = format!("{o}: {}", d.message);
    }
    d
}

/// A per-element stage run on the consumer's thread (`parse`, a sequential `map`).
struct Inline {
    up: Src,
    f: ElemFn,
    i: u64,
}

impl Stream for Inline {
    fn next(&mut self) -> Next {
        let Some(e) = self.up.next()? else {
            return Ok(None);
        };
        self.i += 1;
        (self.f)(e, self.i - 1)
            .map(Some)
            .map_err(|d| with_origin(d, self.up.origin().as_ref()))
    }

    fn origin(&self) -> Option<Origin> {
        self.up.origin()
    }

    fn skip(&mut self, n: u64) -> Result<u64, Diag> {
        // one element in, one out: the function need not run
        let k = self.up.skip(n)?;
        self.i += k;
        Ok(k)
    }
}

/// Elements go to the pool in chunks, so that the hand-off costs little per element.
const CHUNK: usize = 16;

/// A chunk's number, the index of its first element, and its elements.
type Job = (u64, u64, Vec<(Element, Option<Origin>)>);
type Done = (u64, Vec<Result<Element, Diag>>);

/// A per-element function on a pool of threads. The consumer keeps at most `window`
/// chunks in flight and hands results on in input order.
struct ParMap {
    up: Src,
    jobs: Option<SyncSender<Job>>,
    done: Receiver<Done>,
    pending: BTreeMap<u64, Vec<Result<Element, Diag>>>,
    ready: std::vec::IntoIter<Result<Element, Diag>>,
    /// The index of the next element to send (skipped elements count too), and the
    /// chunks sent and handed on.
    sent_elems: u64,
    sent: u64,
    next: u64,
    window: u64,
    up_done: bool,
    up_err: Option<Diag>,
}

impl ParMap {
    fn spawn(up: Src, f: ElemFn, threads: usize) -> ParMap {
        let window = (threads * 4) as u64;
        let (jobs, rx) = mpsc::sync_channel::<Job>(window as usize);
        let (tx, done) = mpsc::channel::<Done>();
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..threads {
            let rx = rx.clone();
            let tx = tx.clone();
            let f = f.clone();
            std::thread::spawn(move || loop {
                let job = rx.lock().map(|r| r.recv());
                let Ok(Ok((c, first, items))) = job else {
                    return;
                };
                let out = items
                    .into_iter()
                    .enumerate()
                    .map(|(j, (e, origin))| {
                        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            f(e, first + j as u64)
                        }));
                        run.unwrap_or_else(|_| Err(thread_panic("map")))
                            .map_err(|d| with_origin(d, origin.as_ref()))
                    })
                    .collect();
                if tx.send((c, out)).is_err() {
                    return;
                }
            });
        }
        ParMap {
            up,
            jobs: Some(jobs),
            done,
            pending: BTreeMap::new(),
            ready: Vec::new().into_iter(),
            sent_elems: 0,
            sent: 0,
            next: 0,
            window,
            up_done: false,
            up_err: None,
        }
    }

    /// Sends chunks to the pool until `window` are in flight or the input ends.
    fn top_up(&mut self) {
        while !self.up_done && self.sent - self.next < self.window {
            let mut items = Vec::with_capacity(CHUNK);
            while items.len() < CHUNK {
                match self.up.next() {
                    Ok(Some(e)) => items.push((e, self.up.origin())),
                    Ok(None) => {
                        self.up_done = true;
                        break;
                    }
                    Err(d) => {
                        self.up_done = true;
                        self.up_err = Some(d);
                        break;
                    }
                }
            }
            if items.is_empty() {
                break;
            }
            let first = self.sent_elems;
            self.sent_elems += items.len() as u64;
            if let Some(j) = &self.jobs {
                if j.send((self.sent, first, items)).is_err() {
                    self.up_done = true;
                }
            }
            self.sent += 1;
        }
    }
}

impl Stream for ParMap {
    fn skip(&mut self, n: u64) -> Result<u64, Diag> {
        if self.sent > self.next || self.ready.len() > 0 {
            // elements in flight: take them as they come
            let mut k = 0;
            while k < n && self.next()?.is_some() {
                k += 1;
            }
            return Ok(k);
        }
        let k = self.up.skip(n)?;
        self.sent_elems += k;
        Ok(k)
    }

    fn next(&mut self) -> Next {
        loop {
            if let Some(r) = self.ready.next() {
                return r.map(Some);
            }
            self.top_up();
            if self.next == self.sent {
                self.jobs = None; // lets the pool's threads end
                return match self.up_err.take() {
                    Some(d) => Err(d),
                    None => Ok(None),
                };
            }
            while !self.pending.contains_key(&self.next) {
                match self.done.recv() {
                    Ok((c, r)) => {
                        self.pending.insert(c, r);
                    }
                    Err(_) => {
                        return Err(Diag::new(
                            Code::RunFailed,
                            crate::span::Span::default(),
                            "an input thread stopped unexpectedly",
                        ))
                    }
                }
            }
            let chunk = self.pending.remove(&self.next).expect("present");
            self.next += 1;
            self.ready = chunk.into_iter();
        }
    }
}

/// Runs its upstream on a thread of its own, at most `n` elements ahead.
struct Prefetch {
    rx: Receiver<Next>,
    ended: bool,
}

impl Prefetch {
    fn spawn(mut up: Src, n: usize) -> Prefetch {
        let (tx, rx) = mpsc::sync_channel::<Next>(n);
        std::thread::spawn(move || loop {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| up.next()))
                .unwrap_or_else(|_| Err(thread_panic("prefetch")));
            let last = !matches!(r, Ok(Some(_)));
            if tx.send(r).is_err() || last {
                return;
            }
        });
        Prefetch { rx, ended: false }
    }
}

impl Stream for Prefetch {
    fn next(&mut self) -> Next {
        if self.ended {
            return Ok(None);
        }
        match self.rx.recv() {
            Ok(Ok(Some(e))) => Ok(Some(e)),
            Ok(r) => {
                self.ended = true;
                r
            }
            Err(_) => {
                // the thread always sends its last result: a silent end is a failure
                self.ended = true;
                Err(thread_panic("prefetch ended early"))
            }
        }
    }
}

struct Filter {
    up: Src,
    runner: ClosureRunner,
    i: u64,
}

impl Stream for Filter {
    fn next(&mut self) -> Next {
        loop {
            let Some(e) = self.up.next()? else {
                return Ok(None);
            };
            self.i += 1;
            let out = self
                .runner
                .run(e.clone(), self.i - 1)
                .map_err(|d| with_origin(d, self.up.origin().as_ref()))?;
            if out[0].scalar() != 0.0 {
                return Ok(Some(e));
            }
        }
    }

    fn origin(&self) -> Option<Origin> {
        self.up.origin()
    }
}

/// A shuffle buffer: fills up to `size`, then yields a random element of it per pull.
struct Shuffle {
    up: Src,
    buf: Vec<Element>,
    size: usize,
    rng: Rng,
    epoch: u64,
    drawn: u64,
    done: bool,
}

impl Stream for Shuffle {
    fn next(&mut self) -> Next {
        while !self.done && self.buf.len() < self.size {
            match self.up.next()? {
                Some(e) => self.buf.push(e),
                None => self.done = true,
            }
        }
        if self.buf.is_empty() {
            return Ok(None);
        }
        let u = self.rng.uniform(self.drawn, self.epoch);
        self.drawn += 1;
        let i = ((u as f64) * self.buf.len() as f64) as usize;
        Ok(Some(self.buf.swap_remove(i.min(self.buf.len() - 1))))
    }
}

/// Rebuilds the stages above it for every repetition.
struct Repeat {
    chain: Arc<Chain>,
    k: usize,
    ctx: Arc<Ctx>,
    epoch: u64,
    file: Option<usize>,
    count: Option<usize>,
    rep: u64,
    cur: Option<Src>,
    produced_any: bool,
}

impl Repeat {
    fn current(&mut self) -> Option<&mut Src> {
        if self.count.is_some_and(|c| self.rep >= c as u64) {
            return None;
        }
        let epoch = self.epoch * 1_000_003 + self.rep;
        Some(
            self.cur
                .get_or_insert_with(|| build(&self.chain, self.k, &self.ctx, epoch, self.file)),
        )
    }
}

impl Stream for Repeat {
    fn next(&mut self) -> Next {
        loop {
            let Some(it) = self.current() else {
                return Ok(None);
            };
            match it.next()? {
                Some(x) => {
                    self.produced_any = true;
                    return Ok(Some(x));
                }
                None => {
                    self.cur = None;
                    self.rep += 1;
                    if !self.produced_any {
                        return Ok(None); // an empty dataset repeated is empty
                    }
                }
            }
        }
    }

    fn next_rows(&mut self, n: usize) -> Option<Element> {
        let b = self.current()?.next_rows(n)?;
        self.produced_any = true;
        Some(b)
    }

    fn skip(&mut self, n: u64) -> Result<u64, Diag> {
        let mut done = 0;
        while done < n {
            let Some(it) = self.current() else {
                break;
            };
            let k = it.skip(n - done)?;
            done += k;
            if k > 0 {
                self.produced_any = true;
            }
            if done < n {
                // this repetition ended
                self.cur = None;
                self.rep += 1;
                if !self.produced_any {
                    break;
                }
            }
        }
        Ok(done)
    }

    fn origin(&self) -> Option<Origin> {
        self.cur.as_ref().and_then(|c| c.origin())
    }
}

struct Batch {
    up: Src,
    size: usize,
    drop_remainder: bool,
    padded: bool,
    length: Option<(usize, Vec<bool>)>,
    span: crate::span::Span,
}

impl Stream for Batch {
    fn next(&mut self) -> Next {
        if !self.padded {
            if let Some(b) = self.up.next_rows(self.size) {
                return Ok(Some(b));
            }
        }
        let mut items = Vec::with_capacity(self.size);
        while items.len() < self.size {
            match self.up.next()? {
                Some(e) => items.push(e),
                None => break,
            }
        }
        if items.is_empty() || (self.drop_remainder && items.len() < self.size) {
            return Ok(None);
        }
        if let Some((l, fit)) = &self.length {
            for e in &mut items {
                for (t, _) in e.iter_mut().zip(fit).filter(|(_, f)| **f) {
                    *t = fit_length(t, *l);
                }
            }
        }
        stack(&items, self.padded)
            .map(Some)
            .map_err(|m| Diag::new(Code::BadData, self.span, m).label("in this batch"))
    }

    fn skip(&mut self, n: u64) -> Result<u64, Diag> {
        // the elements of n batches, stacked into nothing
        let size = self.size as u64;
        let m = self.up.skip(n.saturating_mul(size))?;
        Ok(if self.drop_remainder {
            m / size
        } else {
            m.div_ceil(size)
        })
    }
}

/// The first pass of a cache: hands elements on and keeps them; at the end of the pass
/// the cache is complete (and written to disk for `cache("id")`).
struct CacheFill {
    up: Src,
    acc: Vec<Element>,
    ctx: Arc<Ctx>,
    key: CacheKey,
    disk: Option<(PathBuf, String, u64)>,
    span: crate::span::Span,
    done: bool,
}

impl Stream for CacheFill {
    fn next(&mut self) -> Next {
        if self.done {
            return Ok(None);
        }
        match self.up.next()? {
            Some(e) => {
                self.acc.push(e.clone());
                Ok(Some(e))
            }
            None => {
                self.done = true;
                let elems = std::mem::take(&mut self.acc);
                if let Some((path, id, fp)) = &self.disk {
                    cache::store(path, id, *fp, &elems).map_err(|e| {
                        Diag::new(
                            Code::RunIo,
                            self.span,
                            format!("cannot write the cache {}: {e}", path.display()),
                        )
                        .label("this cache")
                        .help("set EST_CACHE_DIR to a writable directory")
                    })?;
                }
                let data = Arc::new(CacheData::new(elems));
                self.ctx
                    .caches
                    .lock()
                    .expect("cache lock")
                    .insert(self.key, data);
                Ok(None)
            }
        }
    }

    fn origin(&self) -> Option<Origin> {
        self.up.origin()
    }
}

/// A later pass over a complete cache.
struct CacheReplay {
    data: Arc<CacheData>,
    at: usize,
}

impl Stream for CacheReplay {
    fn next(&mut self) -> Next {
        if self.at >= self.data.rows {
            return Ok(None);
        }
        self.at += 1;
        Ok(Some(self.data.row(self.at - 1)))
    }

    fn skip(&mut self, n: u64) -> Result<u64, Diag> {
        let k = n.min((self.data.rows - self.at) as u64);
        self.at += k as usize;
        Ok(k)
    }

    fn next_rows(&mut self, n: usize) -> Option<Element> {
        if self.at + n > self.data.rows {
            return None;
        }
        let b = self.data.rows_batch(self.at, self.at + n)?;
        self.at += n;
        Some(b)
    }
}

struct Shard {
    up: Src,
    n: usize,
    index: usize,
    at: usize,
}

impl Stream for Shard {
    fn next(&mut self) -> Next {
        loop {
            let Some(e) = self.up.next()? else {
                return Ok(None);
            };
            self.at += 1;
            if (self.at - 1) % self.n == self.index {
                return Ok(Some(e));
            }
        }
    }

    fn origin(&self) -> Option<Origin> {
        self.up.origin()
    }
}

/// Reads `cycle` files at a time, one element from each in turn; when a file ends, the
/// next unopened file takes its place.
struct Interleave {
    chain: Arc<Chain>,
    k: usize,
    ctx: Arc<Ctx>,
    epoch: u64,
    nfiles: usize,
    next_file: usize,
    cycle: usize,
    slots: Vec<Src>,
    cur: usize,
    last: Option<usize>,
}

impl Stream for Interleave {
    fn next(&mut self) -> Next {
        loop {
            while self.slots.len() < self.cycle && self.next_file < self.nfiles {
                let f = self.next_file;
                self.next_file += 1;
                self.slots
                    .push(build(&self.chain, self.k, &self.ctx, self.epoch, Some(f)));
            }
            if self.slots.is_empty() {
                return Ok(None);
            }
            let i = self.cur % self.slots.len();
            match self.slots[i].next()? {
                Some(e) => {
                    self.last = Some(i);
                    self.cur = i + 1;
                    return Ok(Some(e));
                }
                None if self.next_file < self.nfiles => {
                    let f = self.next_file;
                    self.next_file += 1;
                    self.slots[i] = build(&self.chain, self.k, &self.ctx, self.epoch, Some(f));
                }
                None => {
                    self.slots.remove(i);
                    self.last = None;
                    self.cur = i;
                }
            }
        }
    }

    fn origin(&self) -> Option<Origin> {
        self.last
            .and_then(|i| self.slots.get(i))
            .and_then(|s| s.origin())
    }
}

struct Take {
    up: Src,
    left: usize,
}

impl Stream for Take {
    fn next(&mut self) -> Next {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        self.up.next()
    }

    fn origin(&self) -> Option<Origin> {
        self.up.origin()
    }

    fn skip(&mut self, n: u64) -> Result<u64, Diag> {
        let k = self.up.skip(n.min(self.left as u64))?;
        self.left -= k as usize;
        Ok(k)
    }
}

struct Skip {
    up: Src,
    left: usize,
}

impl Stream for Skip {
    fn next(&mut self) -> Next {
        while self.left > 0 {
            self.left -= 1;
            if self.up.next()?.is_none() {
                return Ok(None);
            }
        }
        self.up.next()
    }

    fn origin(&self) -> Option<Origin> {
        self.up.origin()
    }
}

struct Zip {
    a: Src,
    b: Src,
}

impl Stream for Zip {
    fn next(&mut self) -> Next {
        let (Some(mut x), Some(y)) = (self.a.next()?, self.b.next()?) else {
            return Ok(None);
        };
        x.extend(y);
        Ok(Some(x))
    }

    fn skip(&mut self, n: u64) -> Result<u64, Diag> {
        let a = self.a.skip(n)?;
        let b = self.b.skip(a)?;
        Ok(a.min(b))
    }
}

/// Runs a `map` or `filter` closure graph on one element. Random ops in a closure
/// draw from the worker's seed (mixed with the stage) with the element's index as the
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
        let mut values = interp::Values::new(self.graph.g.node_bound());
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

/// `t` cut or zero-padded to `l` along its first axis.
fn fit_length(t: &Tensor, l: usize) -> Tensor {
    fn fit<T: Clone>(a: &Arr<T>, l: usize, zero: T) -> Arr<T> {
        let mut shape = a.shape().to_vec();
        let k = shape[0].min(l);
        shape[0] = l;
        let mut out = ndarray::ArrayD::from_elem(IxDyn(&shape), zero);
        out.slice_axis_mut(ndarray::Axis(0), ndarray::Slice::from(0..k))
            .assign(&a.slice_axis(ndarray::Axis(0), ndarray::Slice::from(0..k)));
        out.into_shared()
    }
    if t.shape().is_empty() {
        return t.clone();
    }
    let data = match &t.data {
        Data::F(a) => Data::F(fit(a, l, 0.0)),
        Data::I(a) => Data::I(fit(a, l, 0)),
        Data::B(a) => Data::B(fit(a, l, false)),
        Data::S(a) => Data::S(fit(a, l, Vec::new())),
    };
    Tensor {
        dtype: t.dtype,
        data,
    }
}

/// Stacks elements into a batch (with `padded`, shorter leaves are zero-padded to the
/// longest along every axis).
pub fn stack(items: &[Element], padded: bool) -> Result<Element, String> {
    (0..items[0].len())
        .map(|l| {
            let leaf: Vec<&Tensor> = items.iter().map(|e| &e[l]).collect();
            stack_leaf(&leaf, padded)
        })
        .collect()
}

/// Stacks one leaf of several elements along a new first axis.
pub fn stack_leaf(items: &[&Tensor], padded: bool) -> Result<Tensor, String> {
    let first = items[0];
    let mut shape: Vec<usize> = first.shape().to_vec();
    for it in items {
        let s = it.shape();
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
    let per: usize = shape.iter().product();
    macro_rules! st {
        ($get:ident, $zero:expr, $wrap:expr) => {{
            let mut v = Vec::new();
            reserve_batch(&mut v, items.len(), per, &shape)?;
            for it in items {
                let a = it.$get();
                if a.shape() == shape.as_slice() {
                    match a.as_slice() {
                        Some(s) => v.extend_from_slice(s),
                        None => v.extend(a.iter().cloned()),
                    }
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
    let dtype = first.dtype;
    Ok(match &first.data {
        Data::F(_) => st!(f, 0f32, |a| Tensor {
            dtype,
            data: Data::F(a)
        }),
        Data::I(_) => st!(i, 0i64, |a| Tensor {
            dtype,
            data: Data::I(a)
        }),
        Data::B(_) => st!(b, false, Tensor::bool),
        Data::S(_) => st!(s, Vec::new(), |a| Tensor {
            dtype: DType::Bytes,
            data: Data::S(a)
        }),
    })
}

/// Reserves a batch's `count * per` values in `v`, fallibly: a batch too large for the
/// process's memory (under `ulimit -v`, as batch schedulers set) is an error of the
/// pipeline, not an abort.
fn reserve_batch<T>(
    v: &mut Vec<T>,
    count: usize,
    per: usize,
    shape: &[usize],
) -> Result<(), String> {
    let n = count.saturating_mul(per);
    crate::oom::try_reserve(v, n).map_err(|_| {
        format!(
            "cannot allocate {} for a batch of {count} elements of shape {shape:?}",
            crate::passes::memory::human(n as u128 * std::mem::size_of::<T>() as u128)
        )
    })
}
