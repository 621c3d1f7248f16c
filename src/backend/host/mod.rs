//! The host backend (`--target host`): graphs compiled through LLVM 19 to native code
//! for the CPU this process runs on.
//!
//! ```text
//! lower     graph -> kernels over buffers with static views (fusion, views, GEMMs)
//! codegen   loop and row kernels -> LLVM IR (inkwell), vectorisable loops
//! jit       optimise, emit an object, link it with ORC LLJIT
//! Device    variables resident in aligned storage; a step runs the kernels in order
//! ```
//!
//! A compiled step is a fixed list of kernels run by a plain loop: generated kernels
//! are called through their table of buffer addresses, GEMMs and index work run as
//! native kernels (`native.rs`).

mod cache;
mod codegen;
mod jit;
mod library;
mod lower;
mod mem;
mod native;
mod plan;
mod profile;

use crate::backend::interp::OpEnv;
use crate::backend::pool::{part, Pool, MIN_SPLIT};
use crate::backend::{
    self, Feeds, Finite, Peers, RunError, RunExe, StepCtx, StepError, StepOut, TrainExe, TrainSpec,
};
use crate::diag::{timed, Code, Diag};
use crate::ir::{Graph, NodeIndex, Op, TensorType};
use crate::span::Span;
use crate::tensor::Tensor;
pub use cache::Origin;
use codegen::{Codegen, KernelFn};
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::targets::FileType;
use jit::Machine;
pub use library::{library, Library};
use lower::{Bufs, Elem, Kernel, Role, View};
use mem::{Mem, Storage};
use plan::Plan;
use rustc_hash::FxHashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// A resident variable.
struct Var {
    ty: TensorType,
    data: Storage,
    elem: Elem,
    /// Where a train step writes the variable's next value (`Role::Next`), made when
    /// a program first does; committing the step swaps it with `data`.
    spare: Option<Storage>,
}

impl Var {
    /// The variable's storage as a one-buffer memory, and its value's view.
    fn mem(&self) -> (Mem, View) {
        (
            Mem::new(vec![self.data.ptr()], vec![self.elem]),
            View::contiguous(0, &self.ty.shape),
        )
    }
}

/// The host device.
pub struct Device {
    machine: Machine,
    pool: Pool,
    vars: FxHashMap<String, Var>,
    /// Changes whenever a variable's storage does (programs then renew their tables
    /// of addresses).
    epoch: u64,
    train: Vec<Train>,
    runs: Vec<Run>,
}

impl Drop for Device {
    fn drop(&mut self) {
        if profile::on() {
            profile::print();
        }
    }
}

/// A graph lowered for the host: the kernels of each phase over buffers placed by a
/// memory plan, and where each phase leaves its targets.
struct Lowered {
    bufs: Bufs,
    phases: Vec<Vec<Kernel>>,
    /// Each phase's kernels as the runs that execute slab by slab (`lower::chains`).
    chains: Vec<Vec<Range<usize>>>,
    /// The buffers that hold one slab per part of a split (`lower_phases`).
    local: Vec<Option<lower::Local>>,
    views: FxHashMap<NodeIndex, View>,
    plan: Plan,
}

/// A compiled step: kernels, the code they call, and the executable's own storage.
struct Program {
    graph: Arc<Graph>,
    bufs: Bufs,
    plan: Plan,
    /// Every buffer that is not a variable, at its offset of the plan.
    arena: Storage,
    /// Each input's buffer (as a view of its value, or of its decoded value), name and
    /// node, and the `decode_raw` node that decodes it as it is fed (a byte-string
    /// input); the global step's buffer.
    inputs: Vec<(View, String, NodeIndex, Option<NodeIndex>)>,
    step: Option<View>,
    /// The address of every buffer, as of the device's `epoch` of variables.
    mem: Mem,
    epoch: Option<u64>,
    _jit: jit::Jit,
}

/// A program with the steps of each of its phases and where each target lies.
struct Compiled {
    p: Program,
    phases: Vec<Vec<Step>>,
    views: FxHashMap<NodeIndex, View>,
}

/// One kernel ready to run.
enum Step {
    /// A generated kernel: its function, its buffers and their addresses (renewed with
    /// the program's), the extent of its outer loop, and whether that loop may be
    /// split over threads.
    Gen {
        node: NodeIndex,
        kind: &'static str,
        f: KernelPtr,
        bufs: Vec<usize>,
        table: Vec<usize>,
        outer: i64,
        split: bool,
        /// The table entries of buffers held one slab per part (`Lowered::local`).
        local: Vec<(usize, lower::Local)>,
    },
    /// A native kernel (a GEMM, index work).
    Call(Box<Kernel>),
    /// Generated kernels run slab by slab: for each iteration of their common outer
    /// loop, each of them in turn (`lower::chains`).
    Chain {
        steps: Vec<Step>,
        outer: i64,
        split: bool,
    },
}

type KernelPtr = unsafe extern "C" fn(*const *mut u8, i64, i64) -> i64;

struct Train {
    p: Program,
    spec: TrainSpec,
    a: Vec<Step>,
    b: Vec<Step>,
    /// Where phase A leaves each of its targets, and phase B each update and the
    /// next step.
    views: FxHashMap<NodeIndex, View>,
    /// For each of `spec.updates`, how it reaches its variable.
    commits: Vec<Commit>,
}

/// How a step's update reaches its variable.
enum Commit {
    /// The update is in the variable's spare storage (`Role::Next`): swap the two.
    Swap(String),
    /// Copied into the variable's buffer, through this view.
    Copy(View),
    /// Through a tensor, after the others: it reads another variable's storage (which
    /// must not change under it), or no kernel reads its own.
    Later,
}

struct Run {
    p: Program,
    steps: Vec<Step>,
    targets: Vec<(NodeIndex, View)>,
}

impl Device {
    /// A host device running its kernels on `threads` threads.
    pub fn new(at: Span, threads: usize) -> Result<Device, Diag> {
        Ok(Device {
            machine: host_machine(at, None)?,
            pool: Pool::new(threads),
            vars: FxHashMap::default(),
            epoch: 0,
            train: Vec::new(),
            runs: Vec::new(),
        })
    }

    fn compile(
        &self,
        graph: &Arc<Graph>,
        phases: &[Vec<NodeIndex>],
        next: &[(NodeIndex, String)],
        at: Span,
    ) -> Result<Compiled, Diag> {
        let lowered = timed("host lower", || {
            lower_phases(graph, phases, next, self.pool.threads())
        })?;
        let llvm = |m: String| llvm_failed(at, m);
        let (objects, fns) = timed("host code", || {
            // on every core, whatever the step's threads: compiling is over before a
            // step runs, and the parts (so the cache entries) are the same at any --threads
            compile_parts(&self.machine, graph, &lowered, cores())
        })
        .map_err(llvm)?;
        let jit = timed("host jit", || -> Result<_, String> {
            let mut jit = jit::Jit::new()?;
            for (mut object, _) in objects {
                // For the tests of E0917: `EST_FAULT=host-object` damages the object file.
                if std::env::var("EST_FAULT").ok().as_deref() == Some("host-object") {
                    object.truncate(object.len() / 3);
                }
                jit.add_object(&object)?;
            }
            Ok(jit)
        })
        .map_err(llvm)?;
        let Lowered {
            bufs,
            phases: kernels,
            chains,
            local,
            views,
            plan,
        } = lowered;
        let mut fns = fns.into_iter();
        let mut phases_out = Vec::new();
        for (ks, runs) in kernels.into_iter().zip(chains) {
            let mut steps = Vec::new();
            for k in ks {
                let f = fns.next().expect("one per kernel");
                steps.push(match (k, f) {
                    (k, Some(f)) => {
                        let addr = jit.lookup(&f.name).map_err(llvm)?;
                        // SAFETY: the symbol is a kernel of the signature codegen emits.
                        let ptr: KernelPtr =
                            unsafe { std::mem::transmute::<usize, KernelPtr>(addr) };
                        Step::Gen {
                            node: k.node(),
                            kind: k.kind(),
                            outer: k.outer(graph) as i64,
                            split: splits(&k, graph),
                            f: ptr,
                            table: Vec::new(),
                            local: (f.bufs.iter().enumerate())
                                .filter_map(|(e, &b)| local[b].map(|l| (e, l)))
                                .collect(),
                            bufs: f.bufs,
                        }
                    }
                    (k, None) => Step::Call(Box::new(k)),
                });
            }
            phases_out.push(chained(steps, &runs));
        }
        let arena = timed("host arena", || Storage::new(plan.arena)).map_err(|m| {
            Diag::new(Code::OutOfMemory, at, format!("the buffers of this graph do not fit in memory: {m}"))
                .label("this estimator")
                .help("make the model or its batch smaller; `estc check` estimates the memory a program needs")
        })?;
        let inputs = bufs
            .bufs
            .iter()
            .enumerate()
            .filter_map(|(i, b)| {
                let (name, decode) = match &b.role {
                    Role::Input(name) => (name, None),
                    Role::Decoded(name, node) => (name, Some(*node)),
                    _ => return None,
                };
                let n = graph.input(name)?;
                let shape = &graph.node(decode.unwrap_or(n)).ty.shape;
                Some((View::contiguous(i, shape), name.clone(), n, decode))
            })
            .collect();
        let step =
            (bufs.bufs.iter().position(|b| b.role == Role::Step)).map(|b| View::contiguous(b, &[]));
        Ok(Compiled {
            p: Program {
                graph: graph.clone(),
                mem: Mem::new(Vec::new(), Vec::new()),
                epoch: None,
                bufs,
                plan,
                arena,
                inputs,
                step,
                _jit: jit,
            },
            phases: phases_out,
            views,
        })
    }
}

/// A phase's steps with each run of `runs` longer than one made a chain.
fn chained(steps: Vec<Step>, runs: &[Range<usize>]) -> Vec<Step> {
    let mut steps = steps.into_iter();
    let mut out = Vec::new();
    for r in runs {
        let run: Vec<Step> = steps.by_ref().take(r.len()).collect();
        let outer = match run.first() {
            Some(Step::Gen { outer, .. }) if run.len() > 1 => *outer,
            _ => {
                out.extend(run);
                continue;
            }
        };
        // the chain splits when its kernels together have the work of one that does
        let split = run
            .iter()
            .any(|s| matches!(s, Step::Gen { split: true, .. }));
        out.push(Step::Chain {
            steps: run,
            outer,
            split,
        });
    }
    out
}

/// A code generator for this CPU, or for the named one (`x86-64-v3`).
fn host_machine(at: Span, cpu: Option<&str>) -> Result<Machine, Diag> {
    let m = match cpu {
        None => Machine::host(),
        Some(name) => match Machine::named(name) {
            Ok(Some(m)) => Ok(m),
            Ok(None) => {
                return Err(Diag::new(
                    Code::UnknownCpu,
                    at,
                    format!("LLVM 19 does not know the CPU `{name}`"),
                )
                .label("compiled for `--cpu`")
                .help("`llc-19 -mcpu=help` lists the CPUs LLVM knows (`x86-64-v3`, `znver4`, ...); without `--cpu`, code is made for this machine"))
            }
            Err(m) => Err(m),
        },
    };
    m.map_err(|m| {
        Diag::new(
            Code::HostCompile,
            at,
            format!("LLVM cannot generate code for this CPU: {m}"),
        )
        .label("this estimator")
        .help("run it with `--target interp`")
    })
}

fn llvm_failed(at: Span, m: String) -> Diag {
    Diag::new(
        Code::HostCompile,
        at,
        format!("LLVM failed to compile the graph: {m}"),
    )
    .label("this estimator")
    .help("this is a compiler bug; run it with `--target interp` meanwhile")
}

/// The updates of a train step whose new values can be written into their variables'
/// spare storage (`Role::Next`): those computed in phase B (phase A's may be averaged
/// over shards). Each with its variable's name.
fn swapped(spec: &TrainSpec) -> Vec<(NodeIndex, String)> {
    spec.updates
        .iter()
        .filter(|u| !spec.a_targets.contains(&u.node))
        .map(|u| (u.node, u.name.clone()))
        .collect()
}

/// Lowers the nodes computing each phase's targets (a phase may read the targets of
/// the ones before it) and plans their memory. The values of `next` (update nodes and
/// their variables) that a kernel writes whole into a temporary of their own become
/// the variables' next values (`Role::Next`), outside the arena. With `parts` > 0, a
/// buffer that only one chain touches (`lower::chains`) gets one slab for each of
/// `parts` parts of a split instead of its whole size (`Lowered::local`): the chain's
/// kernels write and read it one slab at a time, and it stays in cache.
fn lower_phases(
    graph: &Graph,
    phases: &[Vec<NodeIndex>],
    next: &[(NodeIndex, String)],
    parts: usize,
) -> Result<Lowered, Diag> {
    let mut bufs = Bufs::default();
    let mut views: FxHashMap<NodeIndex, View> = FxHashMap::default();
    let mut kernels = Vec::new();
    let mut chains = Vec::new();
    for targets in phases {
        let (mut ks, vs) = lower::lower(graph, targets, &views, &mut bufs).map_err(|u| {
            Diag::new(
                Code::UnsupportedOp,
                u.span,
                format!("the host target cannot run `{}` yet: {}", u.op, u.why),
            )
            .label(format!("this {}", u.op))
            .help("run it with `--target interp`")
        })?;
        views.extend(vs);
        chains.push(
            if std::env::var("EST_HOST_CHAINS").as_deref() == Ok("off") {
                (0..ks.len()).map(|i| i..i + 1).collect()
            } else {
                lower::chains(&mut ks, graph, &bufs)
            },
        );
        kernels.push(ks);
    }
    // (not a buffer an earlier phase writes: phase A's are averaged over shards)
    let earlier: Vec<usize> = (kernels.iter().rev().skip(1))
        .flat_map(|ks| ks.iter().map(|k| k.out().buf))
        .collect();
    for (node, name) in next {
        let (Some(v), Some(var)) = (views.get(node), bufs.var(name)) else {
            continue;
        };
        let (b, var) = (&bufs.bufs[v.buf], &bufs.bufs[var]);
        let whole = v.offset == 0 && v.is_contiguous() && v.len() == b.len;
        if whole
            && b.role == Role::Temp
            && b.len == var.len
            && b.elem == var.elem
            && !earlier.contains(&v.buf)
        {
            bufs.bufs[v.buf].role = Role::Next(name.clone());
        }
    }
    // every target is read after the kernels (checks, averages, the next phase)
    let pinned: Vec<usize> = views.values().map(|v| v.buf).collect();
    let order: Vec<Vec<&Kernel>> = kernels
        .iter()
        .zip(&chains)
        .flat_map(|(ks, runs)| runs.iter().map(|r| ks[r.clone()].iter().collect()))
        .collect();
    let mut local = vec![None; bufs.bufs.len()];
    if parts > 0 {
        // the step (or chain) touching each buffer, when only one does
        let mut touched: Vec<Option<Option<usize>>> = vec![None; bufs.bufs.len()];
        for (i, ks) in order.iter().enumerate() {
            for b in ks.iter().flat_map(|k| k.bufs()) {
                touched[b] = match touched[b] {
                    None => Some(Some(i)),
                    Some(Some(j)) if j == i => Some(Some(i)),
                    _ => Some(None),
                };
            }
        }
        for (b, t) in touched.iter().enumerate() {
            let buf = &bufs.bufs[b];
            if let (Some(Some(i)), Role::Temp) = (t, &buf.role) {
                if order[*i].len() > 1 && !pinned.contains(&b) {
                    let outer = order[*i][0].outer(graph);
                    local[b] = Some(lower::Local {
                        slab: buf.len / outer * buf.elem.size(),
                        stride: plan::aligned(buf.len / outer * buf.elem.size()),
                    });
                }
            }
        }
    }
    let sizes: Vec<usize> = bufs
        .bufs
        .iter()
        .zip(&local)
        .map(|(b, l)| l.map_or(b.len * b.elem.size(), |l: lower::Local| l.stride * parts))
        .collect();
    let plan = plan::plan(&bufs, &sizes, &order, &pinned);
    Ok(Lowered {
        bufs,
        phases: kernels,
        chains,
        local,
        views,
        plan,
    })
}

/// The LLVM module of the kernels of a lowered graph that `mine` picks (by their
/// position in the order they run), and their functions (`None` for native kernels
/// and the ones not picked).
fn generate<'c>(
    ctx: &'c Context,
    machine: &Machine,
    graph: &Graph,
    l: &Lowered,
    mine: impl Fn(usize) -> bool,
) -> Result<(Codegen<'c>, Vec<Option<KernelFn>>), String> {
    let mut cg = Codegen::new(ctx, "est", &machine.cpu, &machine.features);
    let mut fns = Vec::new();
    for (p, ks) in l.phases.iter().enumerate() {
        for (i, k) in ks.iter().enumerate() {
            fns.push(if mine(fns.len()) {
                cg.kernel(&format!("k{p}_{i}"), k, graph, &l.bufs)?
            } else {
                None
            });
        }
    }
    Ok((cg, fns))
}

/// The code of a lowered graph as `parts` modules compiled at once on as many threads,
/// each with its own LLVM context and target machine and each cached on its own;
/// returns their objects and every kernel's function. The kernels are dealt out by
/// their compile cost (`cost`), heaviest first to the lightest part, so that the parts
/// finish together; the deal depends only on the kernels, so a program's parts, and
/// their cache entries, are the same at every run.
#[allow(clippy::type_complexity)]
fn compile_parts(
    machine: &Machine,
    graph: &Graph,
    l: &Lowered,
    parts: usize,
) -> Result<(Vec<(Vec<u8>, Origin)>, Vec<Option<KernelFn>>), String> {
    let all: Vec<&Kernel> = l.phases.iter().flatten().collect();
    let parts = parts.clamp(1, all.len().max(1));
    let owner = deal(&all.iter().map(|k| cost(k)).collect::<Vec<_>>(), parts);
    let (cpu, features) = (machine.cpu.as_str(), machine.features.as_str());
    let owner = &owner;
    let part = move |k: usize| -> Result<_, String> {
        let m = Machine::with(cpu, features)?;
        let ctx = Context::create();
        let (cg, fns) = timed("host generate", || {
            generate(&ctx, &m, graph, l, |i| owner[i] == k)
        })?;
        Ok((object(&m, &cg.module)?, fns))
    };
    let done: Vec<Result<_, String>> = std::thread::scope(|s| {
        let running: Vec<_> = (1..parts).map(|k| s.spawn(move || part(k))).collect();
        let mut done = vec![part(0)];
        done.extend(running.into_iter().map(|h| {
            h.join()
                .unwrap_or_else(|_| Err("the compiling thread panicked".into()))
        }));
        done
    });
    let mut objects = Vec::new();
    let mut fns: Vec<Option<KernelFn>> = vec![None; all.len()];
    for d in done {
        let (object, part_fns) = d?;
        objects.push(object);
        for (f, mine) in fns.iter_mut().zip(part_fns) {
            if mine.is_some() {
                *f = mine;
            }
        }
    }
    Ok((objects, fns))
}

/// The threads code compiles on: this machine's cores.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A kernel's compile time, roughly, in units of a small fused loop's (measured with
/// `llc` and `opt` on mnist_cnn's kernels one by one: a direct convolution's register
/// blocks cost about five loops, a max pooling's unrolled taps two).
fn cost(k: &Kernel) -> usize {
    match k {
        Kernel::Conv { .. } => 5,
        Kernel::MaxPool { .. } | Kernel::Softmax { .. } => 2,
        Kernel::Loop(l) => 1 + l.leaves.len() / 4,
        Kernel::Pad { .. } => 1,
        Kernel::MatMul { .. } | Kernel::Native { .. } => 0,
    }
}

/// The part of each job when jobs of these costs are dealt to `parts` workers, the
/// costliest first, each to the worker with the least so far (ties: the first job, the
/// first worker).
fn deal(costs: &[usize], parts: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..costs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(costs[i]));
    let mut load = vec![0; parts.max(1)];
    let mut owner = vec![0; costs.len()];
    for i in order {
        let w = (0..load.len()).min_by_key(|&w| load[w]).unwrap_or(0);
        owner[i] = w;
        load[w] += costs[i];
    }
    owner
}

/// The object code of a module: read from the on-disk cache, or optimised and emitted
/// (and then cached).
fn object(machine: &Machine, module: &Module) -> Result<(Vec<u8>, Origin), String> {
    let compile = || -> Result<Vec<u8>, String> {
        timed("host optimise", || machine.optimize(module))?;
        timed("host emit", || machine.emit(module, FileType::Object))
    };
    let Some(dir) = cache::dir() else {
        return Ok((compile()?, Origin::Compiled));
    };
    let key = timed("host cache key", || {
        cache::Key::new(&module.print_to_string().to_string(), machine)
    });
    let path = cache::path(&dir, &key);
    let bad = match timed("host cache get", || cache::get(&path, &key)) {
        cache::Lookup::Hit(object) => return Ok((object, Origin::Cached(path))),
        cache::Lookup::Miss => None,
        cache::Lookup::Bad(why) => Some(why),
    };
    let object = compile()?;
    let stored = cache::put(&path, &key, &object).err();
    Ok((
        object,
        match (bad, stored) {
            (Some(why), None) => Origin::Rebuilt(path, why),
            (_, stored) => Origin::Stored(path, stored),
        },
    ))
}

/// Renews a program's table of addresses (and its generated steps') when the
/// variables' storage changed since it was made.
fn refresh(
    vars: &mut FxHashMap<String, Var>,
    epoch: u64,
    p: &mut Program,
    phases: &mut [&mut Vec<Step>],
) -> Result<(), RunError> {
    if p.epoch == Some(epoch) {
        return Ok(());
    }
    let missing = |name: &str| RunError {
        span: Span::default(),
        op: "variable",
        message: format!("variable `{name}` has no value"),
    };
    // in place once the tables exist: a train step whose updates swap storages
    // renews them every step, without allocating
    let fresh = p.mem.len() != p.bufs.bufs.len();
    if fresh {
        p.mem = Mem::new(
            vec![std::ptr::null_mut(); p.bufs.bufs.len()],
            p.bufs.bufs.iter().map(|b| b.elem).collect(),
        );
    }
    for (i, (b, off)) in p.bufs.bufs.iter().zip(&p.plan.offsets).enumerate() {
        let ptr = match (&b.role, off) {
            (Role::Var(name), _) => vars.get(name).ok_or_else(|| missing(name))?.data.ptr(),
            (Role::Next(name), _) => {
                let v = vars.get_mut(name).ok_or_else(|| missing(name))?;
                let spare = match &mut v.spare {
                    Some(s) => s,
                    None => {
                        let bytes = v.ty.shape.iter().product::<usize>() * v.elem.size();
                        v.spare.insert(Storage::new(bytes).map_err(|m| RunError {
                            message: format!("variable `{name}`'s next value: {m}"),
                            ..missing(name)
                        })?)
                    }
                };
                spare.ptr()
            }
            // SAFETY: the plan's offsets lie within the arena.
            (_, Some(off)) => unsafe { p.arena.ptr().add(*off) },
            (_, None) => unreachable!("every other buffer is planned"),
        };
        p.mem.set_ptr(i, ptr);
    }
    fn tables(steps: &mut [Step], mem: &Mem) {
        for s in steps {
            match s {
                Step::Chain { steps, .. } => tables(steps, mem),
                // (allocates only the first time: the table keeps its capacity)
                Step::Gen { bufs, table, .. } => {
                    table.clear();
                    table.extend(bufs.iter().map(|&b| mem.ptr(b) as usize));
                }
                Step::Call(_) => {}
            }
        }
    }
    for steps in phases {
        tables(steps, &p.mem);
    }
    p.epoch = Some(epoch);
    Ok(())
}

/// Whether a generated kernel's outer loop may be split over threads: every iteration
/// of it writes its own outputs (so the split changes no result), and it has enough
/// work to pay for a dispatch.
fn splits(k: &Kernel, g: &Graph) -> bool {
    let work = match k {
        Kernel::Loop(l) => match &g.node(l.root).op {
            Op::Reduce { axes, .. } if !l.is_copy() => {
                let x = &g.node(g.operands(l.root)[0]).ty.shape;
                // a trailing reduction loops over the kept axes; any other one
                // accumulates into its whole output from every iteration
                if !lower::reduces_trailing(x.len(), axes) || axes.len() == x.len() {
                    return false;
                }
                x.iter().product()
            }
            _ => l.out.len(),
        },
        Kernel::Softmax { x, .. } => x.len(),
        Kernel::MatMul { .. } | Kernel::Native { .. } => return false,
        // every task of a convolution writes its own outputs; a filter gradient's
        // work is in its sum over every output pixel
        Kernel::Conv {
            filter: true, k, ..
        } => k.len(),
        Kernel::Conv { out, .. } | Kernel::Pad { out, .. } | Kernel::MaxPool { out, .. } => {
            out.len()
        }
    };
    work >= MIN_SPLIT && k.outer(g) > 1
}

/// Runs steps; an op's failure is a `RunError` naming it.
fn run_steps(
    g: &Graph,
    steps: &[Step],
    mem: &Mem,
    env: &OpEnv,
    pool: &Pool,
) -> Result<(), RunError> {
    let fail = |n: NodeIndex, message: String| {
        let node = g.node(n);
        RunError {
            span: node.span,
            op: node.op.name(),
            message,
        }
    };
    for s in steps {
        let started = profile::on().then(std::time::Instant::now);
        let (gens, outer, split, slabs) = match s {
            Step::Call(k) => {
                native::call(k, g, mem, env, pool).map_err(|m| fail(k.node(), m))?;
                if let Some(t) = started {
                    profile::add(g, k.node(), k.kind(), t.elapsed());
                }
                continue;
            }
            Step::Gen { outer, split, .. } => (std::slice::from_ref(s), *outer, *split, false),
            Step::Chain {
                steps,
                outer,
                split,
            } => (&steps[..], *outer, *split, true),
        };
        let parts = if split {
            pool.threads().min(outer as usize)
        } else {
            1
        };
        // the kernel that failed, plus one; with a profile, each kernel's nanoseconds
        let failed = AtomicUsize::new(0);
        let spent: Vec<AtomicU64> = match started {
            Some(_) => gens.iter().map(|_| AtomicU64::new(0)).collect(),
            None => Vec::new(),
        };
        let call = |k: usize, (lo, hi): (usize, usize), part: usize| {
            let Step::Gen {
                f, table, local, ..
            } = &gens[k]
            else {
                return;
            };
            let t = started.map(|_| std::time::Instant::now());
            // a buffer held one slab per part: its address for this slab is the
            // part's own slab, less the offset of slab `lo` that the kernel adds
            let mut patched = [0usize; lower::MAX_TABLE];
            let at = if local.is_empty() {
                table.as_ptr()
            } else {
                patched[..table.len()].copy_from_slice(table);
                for (e, l) in local {
                    patched[*e] = table[*e]
                        .wrapping_add(part * l.stride)
                        .wrapping_sub(lo * l.slab);
                }
                patched.as_ptr()
            };
            // SAFETY: the kernel reads and writes only the buffers of its table,
            // within the views lowering gave it; the parts of a split write disjoint
            // outputs, and a chain's kernels read only the slabs that the kernels
            // before them wrote in the same iteration (`lower::chains`), so a buffer
            // held one slab per part is addressed only at the slab it is given.
            if unsafe { f(at as *const *mut u8, lo as i64, hi as i64) } != 0 {
                failed.store(k + 1, Ordering::Relaxed);
            }
            if let Some(t) = t {
                spent[k].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
        };
        pool.run(parts, &|i| {
            let (lo, hi) = part(outer as usize, parts, i);
            if slabs {
                for n in lo..hi {
                    (0..gens.len()).for_each(|k| call(k, (n, n + 1), i));
                }
            } else {
                call(0, (lo, hi), i);
            }
        });
        let node = |k: usize| match &gens[k] {
            Step::Gen { node, kind, .. } => (*node, *kind),
            _ => unreachable!("chains hold generated kernels"),
        };
        if let k @ 1.. = failed.load(Ordering::Relaxed) {
            return Err(fail(node(k - 1).0, "integer division by zero".into()));
        }
        if let Some(t) = started {
            // the step's time, shared among its kernels as they spent it
            let took = t.elapsed();
            let ns: Vec<u64> = spent.iter().map(|s| s.load(Ordering::Relaxed)).collect();
            let all = ns.iter().sum::<u64>().max(1) as f64;
            for (k, ns) in ns.iter().enumerate() {
                let (n, kind) = node(k);
                profile::add(g, n, kind, took.mul_f64(*ns as f64 / all));
            }
        }
    }
    Ok(())
}

/// Checks a value given from outside against its node's type.
fn fits(t: &Tensor, ty: &TensorType) -> Result<(), String> {
    if t.dtype != ty.dtype || t.shape() != ty.shape.as_slice() {
        return Err(format!("the value is {}, but the graph needs {ty}", t.ty()));
    }
    Ok(())
}

/// Writes the feeds and the step into a program's input buffers.
fn feed(p: &Program, mem: &Mem, feeds: &Feeds, step: i64, pool: &Pool) -> Result<(), RunError> {
    for (view, name, node, decode) in &p.inputs {
        let node = p.graph.node(*node);
        let fail = |message: String| RunError {
            span: node.span,
            op: "input",
            message,
        };
        let t = feeds
            .get(name)
            .ok_or_else(|| fail(format!("input `{name}` was not fed")))?;
        fits(t, &node.ty).map_err(|m| fail(format!("input `{name}`: {m}")))?;
        match decode {
            Some(d) => {
                let d = p.graph.node(*d);
                let value = crate::tensor::decode_raw(t, &d.ty).map_err(|message| RunError {
                    span: d.span,
                    op: d.op.name(),
                    message,
                })?;
                mem.write(view, &value, pool);
            }
            None => mem.write(view, t, pool),
        }
    }
    if let Some(v) = &p.step {
        mem.put_int_iter(v, std::iter::once(step));
    }
    Ok(())
}

fn scan(mem: &Mem, v: &View, want: Finite, pool: &Pool) -> Option<(usize, f32)> {
    match want {
        Finite::All => mem.first(v, |x| !x.is_finite(), pool),
        Finite::NoNan => mem.first(v, f32::is_nan, pool),
    }
}

impl backend::Device for Device {
    fn compile_train(&mut self, graph: Arc<Graph>, at: Span) -> Result<TrainExe, Diag> {
        let spec = TrainSpec::new(&graph, at)?;
        let Compiled {
            p,
            mut phases,
            mut views,
        } = self.compile(
            &graph,
            &[spec.a_targets.clone(), spec.b_targets()],
            &swapped(&spec),
            at,
        )?;
        for &(cross, operand) in &spec.cross {
            if let Some(v) = views.get(&operand).cloned() {
                views.insert(cross, v);
            }
        }
        let b = phases.pop().expect("phase b");
        let a = phases.pop().expect("phase a");
        let commits = (spec.updates.iter())
            .map(|u| {
                let from = &views[&u.node];
                match &p.bufs.bufs[from.buf].role {
                    Role::Next(n) if *n == u.name => return Commit::Swap(n.clone()),
                    Role::Var(n) if *n != u.name => return Commit::Later,
                    _ => {}
                }
                p.bufs.var(&u.name).map_or(Commit::Later, |var| {
                    Commit::Copy(View::contiguous(var, &from.shape))
                })
            })
            .collect();
        self.train.push(Train {
            p,
            spec,
            a,
            b,
            views,
            commits,
        });
        Ok(TrainExe(self.train.len() - 1))
    }

    fn compile_run(
        &mut self,
        graph: Arc<Graph>,
        targets: Vec<NodeIndex>,
        at: Span,
    ) -> Result<RunExe, Diag> {
        let Compiled {
            p,
            mut phases,
            views,
        } = self.compile(&graph, std::slice::from_ref(&targets), &[], at)?;
        let targets = targets.iter().map(|t| (*t, views[t].clone())).collect();
        self.runs.push(Run {
            p,
            steps: phases.pop().expect("one phase"),
            targets,
        });
        Ok(RunExe(self.runs.len() - 1))
    }

    fn bind(&mut self, vars: FxHashMap<String, Tensor>) -> Result<(), String> {
        let before = self.vars.len();
        self.vars.retain(|name, _| vars.contains_key(name));
        if self.vars.len() != before {
            self.epoch += 1;
        }
        for (name, t) in vars {
            self.set_variable(&name, t)?;
        }
        Ok(())
    }

    fn variables(&self) -> FxHashMap<String, Tensor> {
        self.vars
            .iter()
            .map(|(k, v)| {
                let (mem, view) = v.mem();
                (k.clone(), mem.read(&view, v.ty.dtype))
            })
            .collect()
    }

    fn variable(&self, name: &str) -> Option<Tensor> {
        let v = self.vars.get(name)?;
        let (mem, view) = v.mem();
        Some(mem.read(&view, v.ty.dtype))
    }

    fn set_variable(&mut self, name: &str, value: Tensor) -> Result<(), String> {
        let ty = value.ty();
        let elem = Elem::of(ty.dtype).ok_or_else(|| {
            format!("variable `{name}` holds byte strings, which the host cannot")
        })?;
        // a variable of the same type keeps its storage (and the programs their tables)
        if let Some(v) = self.vars.get(name).filter(|v| v.ty == ty) {
            let (mem, view) = v.mem();
            mem.write(&view, &value, &self.pool);
            return Ok(());
        }
        let n: usize = ty.shape.iter().product();
        let data = Storage::new(n * elem.size()).map_err(|m| format!("variable `{name}`: {m}"))?;
        let v = Var {
            ty,
            data,
            elem,
            spare: None,
        };
        let (mem, view) = v.mem();
        mem.write(&view, &value, &self.pool);
        self.vars.insert(name.to_string(), v);
        self.epoch += 1;
        Ok(())
    }

    fn train_step(
        &mut self,
        exe: TrainExe,
        batches: Vec<Feeds>,
        ctx: StepCtx,
        peers: &mut dyn Peers,
    ) -> Result<StepOut, StepError> {
        self.pool.wake();
        let t = &mut self.train[exe.0];
        refresh(
            &mut self.vars,
            self.epoch,
            &mut t.p,
            &mut [&mut t.a, &mut t.b],
        )
        .map_err(|error| peers.fail(StepError::Run { shard: None, error }))?;
        let t = &self.train[exe.0];
        let g: &Graph = &t.p.graph;
        let mem = &t.p.mem;
        let n = batches.len();
        let (replicas, me) = peers.replicas();
        // the shards of every replica are numbered in replica order
        let first = me * n;
        let mut acc: Vec<(NodeIndex, Vec<f32>)> = Vec::new();
        for (shard, feeds) in batches.iter().enumerate() {
            let on = |error| StepError::Run {
                shard: (n * replicas > 1).then_some(first + shard),
                error,
            };
            let env = ctx.op_env(first + shard);
            let ran = feed(&t.p, mem, feeds, ctx.step, &self.pool)
                .and_then(|_| run_steps(g, &t.a, mem, &env, &self.pool));
            if let Err(error) = ran {
                return Err(peers.fail(on(error)));
            }
            if n * replicas > 1 {
                // the sum over shards of every float phase-A value, shard 0 first
                for &target in &t.spec.a_targets {
                    let v = &t.views[&target];
                    if mem.elem(v) != Elem::F32 || t.p.bufs.bufs[v.buf].role != Role::Temp {
                        continue;
                    }
                    let x = mem.f32s(v);
                    if shard == 0 {
                        acc.push((target, x.to_vec()));
                    } else if let Some(a) = acc.iter_mut().find(|a| a.0 == target) {
                        a.1.iter_mut().zip(x).for_each(|(s, &y)| *s += y);
                    }
                }
            }
        }
        if n * replicas > 1 {
            let mut sums: Vec<Vec<f32>> =
                acc.iter_mut().map(|a| std::mem::take(&mut a.1)).collect();
            backend::shard_mean(peers, &mut sums, n)?;
            for ((target, _), mean) in acc.iter().zip(&sums) {
                mem.put_f32s(&t.views[target], mean);
            }
        }
        let check = |node: NodeIndex, want: Finite| scan(mem, &t.views[&node], want, &self.pool);
        t.spec.check_a(check)?;
        let env = ctx.op_env(0);
        run_steps(g, &t.b, mem, &env, &self.pool)
            .map_err(|error| StepError::Run { shard: None, error })?;
        t.spec.check_b(check)?;
        let scalar = |node: NodeIndex| mem.scalar(&t.views[&node]);
        let out = StepOut {
            loss: scalar(t.spec.loss),
            learning_rate: scalar(t.spec.learning_rate),
            next_step: t.spec.next_step.map(|n| scalar(n) as i64),
        };
        // commit: copy each update into its variable; one that reads another
        // variable (or whose variable no kernel reads) goes through a tensor, written
        // after the others so that it sees the old values
        let mut later = Vec::new();
        let mut swapped = false;
        for (u, to) in t.spec.updates.iter().zip(&t.commits) {
            let from = &t.views[&u.node];
            match to {
                Commit::Copy(to) => mem.copy(from, to, &self.pool),
                Commit::Swap(name) => {
                    // (`refresh` made the spare storage this step's kernels wrote)
                    if let Some(v) = self.vars.get_mut(name) {
                        if let Some(spare) = &mut v.spare {
                            std::mem::swap(&mut v.data, spare);
                            swapped = true;
                        }
                    }
                }
                Commit::Later => {
                    later.push((u.name.clone(), mem.read(from, g.node(u.node).ty.dtype)))
                }
            }
        }
        if swapped {
            // every program renews its addresses of the swapped storages
            self.epoch += 1;
        }
        for (name, value) in later {
            if let Some(v) = self.vars.get(&name) {
                let (mem, view) = v.mem();
                mem.write(&view, &value, &self.pool);
            }
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
        self.pool.wake();
        let r = &mut self.runs[exe.0];
        refresh(&mut self.vars, self.epoch, &mut r.p, &mut [&mut r.steps])?;
        let r = &self.runs[exe.0];
        let g: &Graph = &r.p.graph;
        let mem = &r.p.mem;
        feed(&r.p, mem, &feeds, ctx.step, &self.pool)?;
        let env = ctx.op_env(shard);
        run_steps(g, &r.steps, mem, &env, &self.pool)?;
        Ok(r.targets
            .iter()
            .map(|(n, v)| mem.read(v, g.node(*n).ty.dtype))
            .collect())
    }
}

/// What `estc build --emit` writes: a stage of one graph's compilation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emit {
    /// The optimised LLVM module.
    LlvmIr,
    Asm,
    Obj,
}

/// A buffer of an executable's memory, for the report.
#[derive(Debug, Clone)]
pub struct BufferInfo {
    pub bytes: usize,
    /// Its type (`f32[128, 24, 24, 32]`), or its length for a kernel's scratch.
    pub what: String,
    /// The op whose kernel writes it (or `input`), and where the program makes it.
    pub op: &'static str,
    pub span: Option<Span>,
}

/// What one graph compiles to: its kernels, its memory plan, its code.
#[derive(Debug, Clone)]
pub struct Report {
    pub cpu: String,
    /// Kernels generated through LLVM, and native ones (GEMMs, windows, index work).
    pub generated: usize,
    pub native: usize,
    /// The chains of kernels run slab by slab: each one's outer extent and ops.
    pub chains: Vec<(usize, Vec<&'static str>)>,
    /// The arena's bytes (the peak of the plan), and what its buffers would take
    /// whole (not one slab per thread) and without sharing.
    pub arena: usize,
    pub unshared: usize,
    /// Bytes of the variables the kernels read (resident in the device).
    pub variables: usize,
    /// Every buffer of the arena, largest first.
    pub buffers: Vec<BufferInfo>,
    /// Where the code of each part came from (with `--emit`, one module is compiled,
    /// not cached).
    pub origins: Vec<Origin>,
}

/// Compiles the kernels computing `phases` (each phase's targets, as a device does)
/// for this CPU or the named one; returns the report and the stage `emit` asks for.
pub fn build(
    graph: &Arc<Graph>,
    phases: &[Vec<NodeIndex>],
    at: Span,
    cpu: Option<&str>,
    emit: Option<Emit>,
) -> Result<(Report, Option<Vec<u8>>), Diag> {
    let machine = host_machine(at, cpu)?;
    let parts = crate::backend::pool::default_threads();
    // a train step's phases (A and B) as a device lowers them
    let next = match phases.len() {
        2 => swapped(&TrainSpec::new(graph, at)?),
        _ => Vec::new(),
    };
    let lowered = lower_phases(graph, phases, &next, parts)?;
    let llvm = |m: String| llvm_failed(at, m);
    let ctx = Context::create();
    let (origins, stage, fns) = match emit {
        None => {
            // as a device compiles it, in parts on every core
            let (objects, fns) = compile_parts(&machine, graph, &lowered, cores()).map_err(llvm)?;
            (objects.into_iter().map(|o| o.1).collect(), None, fns)
        }
        Some(e) => {
            let (cg, fns) = generate(&ctx, &machine, graph, &lowered, |_| true).map_err(llvm)?;
            machine.optimize(&cg.module).map_err(llvm)?;
            let bytes = match e {
                Emit::LlvmIr => cg.module.print_to_string().to_bytes().to_vec(),
                Emit::Asm => machine.emit(&cg.module, FileType::Assembly).map_err(llvm)?,
                Emit::Obj => machine.emit(&cg.module, FileType::Object).map_err(llvm)?,
            };
            (Vec::new(), Some(bytes), fns)
        }
    };
    let generated = fns.iter().filter(|f| f.is_some()).count();
    let (bufs, plan) = (&lowered.bufs, &lowered.plan);
    let chains = lowered
        .phases
        .iter()
        .zip(&lowered.chains)
        .flat_map(|(ks, runs)| {
            runs.iter()
                .filter(|r| r.len() > 1)
                .map(move |r| &ks[r.clone()])
        })
        .map(|ks| {
            let ops = ks
                .iter()
                .map(|k| match k {
                    Kernel::Pad { .. } => "pad",
                    k => graph.node(k.node()).op.name(),
                })
                .collect();
            (ks[0].outer(graph), ops)
        })
        .collect();
    let mut buffers = Vec::new();
    let mut variables = 0;
    for (i, b) in bufs.bufs.iter().enumerate() {
        let local = lowered.local[i];
        let bytes = local.map_or(b.len * b.elem.size(), |l| l.stride * parts);
        let node = plan.producers[i].map(|n| graph.node(n));
        let (what, op, span) = match (&b.role, node) {
            // a variable, or its spare storage for the next value
            (Role::Var(_) | Role::Next(_), _) => {
                variables += bytes;
                continue;
            }
            (Role::Input(name) | Role::Decoded(name, _), _) => {
                (format!("input `{name}`"), "input", None)
            }
            (Role::Step, _) => ("the global step".to_string(), "input", None),
            (Role::Temp, Some(n)) if local.is_some() => (
                format!("{}, a slab per thread", n.ty),
                n.op.name(),
                Some(n.span),
            ),
            (Role::Temp, Some(n)) if n.ty.shape.iter().product::<usize>() == b.len => {
                (n.ty.to_string(), n.op.name(), Some(n.span))
            }
            (Role::Temp, Some(n)) => (
                format!("scratch of {} elements", b.len),
                n.op.name(),
                Some(n.span),
            ),
            (Role::Temp, None) => (format!("{} elements", b.len), "", None),
        };
        buffers.push(BufferInfo {
            bytes,
            what,
            op,
            span,
        });
    }
    buffers.sort_by_key(|b| std::cmp::Reverse(b.bytes));
    Ok((
        Report {
            cpu: machine.cpu.clone(),
            generated,
            native: fns.len() - generated,
            chains,
            arena: plan.arena,
            unshared: plan.unshared,
            variables,
            buffers,
            origins,
        },
        stage,
    ))
}

#[cfg(test)]
mod tests {
    use super::deal;

    #[test]
    fn kernels_are_dealt_heaviest_first_to_the_lightest_part() {
        // the 5s go to parts 0 and 1, the 2 to part 0 (the first of equals), then both
        // 1s to part 1: 7 each
        let owner = deal(&[1, 5, 2, 5, 1], 2);
        assert_eq!(owner, [1, 0, 0, 1, 1]);
        let load = |p| {
            owner
                .iter()
                .zip([1, 5, 2, 5, 1])
                .filter(|(&o, _)| o == p)
                .map(|(_, c)| c)
                .sum::<usize>()
        };
        assert_eq!((load(0), load(1)), (7, 7));
        assert_eq!(deal(&[3, 3], 1), [0, 0]);
    }
}
