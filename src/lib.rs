//! est: a compiler for declarative machine-learning programs (a model, its input
//! pipeline and its run configuration). One pipeline serves the CLI, the language
//! server, the embedding API and the tests:
//!
//! ```text
//! text -> tokens -> AST -> resolve -> elaborate (per estimator, mode, target) -> passes
//! ```
//!
//! `check` runs all of it and returns every diagnostic and the checked graphs. Then
//! `runtime::Estimator` runs them: `backend` compiles and executes graphs behind one
//! seam (the interpreter, the host through LLVM, the wafer), `data` is the input
//! pipeline that feeds them, and `runtime` is the Estimator loop around both.

pub mod atomic;
pub mod backend;
pub mod data;
pub mod diag;
pub mod dist;
pub mod elab;
pub mod export;
pub mod hash;
pub mod ir;
pub mod lsp;
pub mod oom;
pub mod passes;
pub mod program;
pub mod resolve;
pub mod rng;
pub mod runtime;
pub mod span;
pub mod syntax;
pub mod tensor;

use diag::Diag;
use elab::{Compiled, ElabOptions, EstimatorInfo, Target};
use passes::PassCtx;
pub use program::Program;
use syntax::ast::SectionKind;

/// What to check.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    pub target: Target,
    pub modes: Vec<SectionKind>,
    /// Only this estimator (all when `None`).
    pub estimator: Option<String>,
    /// `--config key=value` overrides of the estimators' config blocks.
    pub config: Vec<(String, i64)>,
    /// Run the IR verifier between passes (always on in debug builds).
    pub verify: bool,
    /// How many steps elaboration may take before it stops with E0308.
    pub max_steps: u64,
    /// Record every expression's type or value (for the language server's hover).
    pub hover: bool,
    /// The memory a graph's run may need (E0602 beyond it); `None` is this machine's
    /// memory, and no limit when that is unknown.
    pub memory_limit: Option<u64>,
    /// The fabric the wafer target lays programs out on (`None`: `test32`).
    pub fabric: Option<backend::wafer::fabric::Fabric>,
    /// The ranks of a data-parallel run (`mpirun -n N`): 1 for one process.
    pub ranks: u64,
}

impl Default for CheckOptions {
    fn default() -> CheckOptions {
        CheckOptions {
            target: Target::Host,
            modes: vec![SectionKind::Train, SectionKind::Eval, SectionKind::Predict],
            estimator: None,
            config: Vec::new(),
            verify: cfg!(debug_assertions),
            max_steps: elab::MAX_STEPS,
            hover: false,
            memory_limit: None,
            fabric: None,
            ranks: 1,
        }
    }
}

/// The result of checking a program.
#[derive(Debug)]
pub struct Checked {
    /// Every diagnostic, in source order.
    pub diags: Vec<Diag>,
    pub estimators: Vec<EstimatorInfo>,
    /// The graph of each (estimator, mode), after all passes.
    pub graphs: Vec<Compiled>,
    /// A pass that broke the IR's invariants (a compiler bug), if any.
    pub bug: Option<passes::PassBug>,
    /// Every resolved use of a name, with what it refers to.
    pub refs: Vec<(span::Span, resolve::Target)>,
}

impl Checked {
    /// Where the estimator of a compiled graph is declared (the place to point
    /// diagnostics about the whole graph).
    pub fn estimator_span(&self, c: &Compiled) -> span::Span {
        self.estimators
            .iter()
            .find(|e| e.name == c.estimator)
            .map(|e| e.span)
            .unwrap_or_default()
    }

    pub fn has_errors(&self) -> bool {
        self.diags
            .iter()
            .any(|d| d.severity() == diag::Severity::Error)
    }
}

/// Runs the front end on a loaded program: resolution, elaboration of every selected
/// estimator and mode for the target, and the passes on every graph.
pub fn check(program: &Program, opts: &CheckOptions) -> Checked {
    // Elaboration recurses through the program (and inlines up to 256 nested calls), so
    // it runs on a thread with a stack large enough for any program the parser accepts.
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .stack_size(STACK_SIZE)
            .spawn_scoped(s, || check_on_this_thread(program, opts));
        match worker.map(|h| h.join()) {
            Ok(Ok(checked)) => checked,
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => check_on_this_thread(program, opts),
        }
    })
}

/// The stack of the thread `check` runs on.
const STACK_SIZE: usize = 512 << 20;

fn check_on_this_thread(program: &Program, opts: &CheckOptions) -> Checked {
    let mut diags = program.diags.clone();
    let (resolved, refs) = resolve::resolve_with_refs(program);
    diags.extend(resolved.iter().cloned());
    let eopts = ElabOptions {
        target: opts.target,
        modes: opts.modes.clone(),
        estimator: opts.estimator.clone(),
        config: opts.config.clone(),
        max_steps: opts.max_steps,
        hover: opts.hover,
        ranks: opts.ranks,
    };
    let t = std::time::Instant::now();
    let (estimators, mut graphs, elab_diags) = elab::elaborate(program, &eopts);
    if std::env::var_os("EST_TIME_PASSES").is_some() {
        let ms = t.elapsed().as_secs_f64() * 1e3;
        diag::log(&format!("elaborate        {ms:>9.3} ms"));
    }
    diags.extend(elab_diags.iter().cloned());
    let ctx = PassCtx {
        target: opts.target,
    };
    let mut bug = None;
    for c in &mut graphs {
        if let Err(b) = passes::run(
            std::sync::Arc::make_mut(&mut c.graph),
            &ctx,
            &mut diags,
            opts.verify,
        ) {
            bug.get_or_insert(b);
        }
        if opts.verify {
            for g in c
                .input
                .iter()
                .flat_map(|d| d.stages.iter())
                .filter_map(stage_graph)
            {
                if let Err(message) = passes::verify(g) {
                    bug.get_or_insert(passes::PassBug {
                        pass: "elaborate (pipeline)",
                        message,
                    });
                }
            }
        }
    }
    read_moving_averages(&mut graphs);
    check_memory(&graphs, &estimators, opts, &mut diags);
    if opts.target == Target::Wafer && !diags.has_errors() {
        check_wafer(&graphs, &estimators, opts, &mut diags);
    }
    Checked {
        diags: with_suggested_names(program, continued(program, diags.sorted())),
        estimators,
        graphs,
        bug,
        refs,
    }
}

/// Each diagnostic inside a call or an index whose bracket starts a line of its own
/// (`ast::Module::continuations`), as `let y = relu(x)` followed by `(y + 1.0) |> relu`
/// makes, or later on that line: it points at that bracket, and (from the bracket on,
/// where the line was meant as a statement of its own) says to put `;` before it.
fn continued(program: &Program, diags: Vec<diag::Diag>) -> Vec<diag::Diag> {
    let all: Vec<&(span::Span, span::Span)> = (program.modules.iter())
        .flat_map(|m| &m.ast.continuations)
        .collect();
    diags
        .into_iter()
        .map(|mut d| {
            let p = d.primary.span;
            // within the call, or later on the line its bracket starts (`(a - b) * t`,
            // where `t` was the name the line above meant to bind)
            let inside = |(at, whole): &&&(span::Span, span::Span)| {
                let text = &program.sources.get(at.file).text;
                let same_line = p.lo >= at.lo
                    && text
                        .get(at.lo as usize..p.lo as usize)
                        .is_some_and(|t| !t.contains('\n'));
                at.file == p.file && ((p.lo >= whole.lo && p.hi <= whole.hi) || same_line)
            };
            if let Some((at, _)) = all.iter().find(inside) {
                let bracket = program.sources.text(*at).to_string();
                d = d.with(
                    *at,
                    format!("this `{bracket}` starts a line but continues the expression above it"),
                );
                if p.lo >= at.lo {
                    d.help = Some(syntax::parser::LEAD_HELP.to_string());
                }
                // the fix: `;` right after the last token before the bracket, where it
                // ends a statement (not inside a call's or a list's brackets)
                let before = &program.sources.get(at.file).text[..at.lo as usize];
                let in_brackets = matches!(syntax::parser::unclosed(before), Some((_, '(' | '[')));
                if let (Some(&(_, _, end)), false) =
                    (syntax::lexer::lex(before).last(), in_brackets)
                {
                    let semi = span::Span::new(at.file, end, end);
                    d = d.fix("end the line above with `;`", vec![(semi, ";".into())]);
                }
            }
            d
        })
        .collect()
}

/// Each diagnostic whose help suggests a name for the name it points at ("did you
/// mean `dense`?") gets the fix that writes it.
fn with_suggested_names(program: &Program, diags: Vec<diag::Diag>) -> Vec<diag::Diag> {
    diags
        .into_iter()
        .map(|d| {
            let name = d.help.as_deref().and_then(diag::suggested_name);
            let at = d.primary.span;
            let written = program.sources.text(at);
            // the span is the misspelled name itself: a name in a file of the program
            // (not an override's value) close to the suggestion (not a variable that
            // holds a misspelled string)
            let in_file = program.modules.iter().any(|m| m.file == at.file);
            match name {
                Some(n)
                    if syntax::lexer::is_name(written)
                        && in_file
                        && n != written
                        && diag::did_you_mean(written, [n]).is_some()
                        && d.fixes.is_empty() =>
                {
                    let title = format!("replace `{written}` with `{n}`");
                    let n = n.to_string();
                    d.fix(title, vec![(at, n)])
                }
                _ => d,
            }
        })
        .collect()
}

/// E0602 for each graph whose run would need more memory than the limit.
fn check_memory(
    graphs: &[Compiled],
    estimators: &[EstimatorInfo],
    opts: &CheckOptions,
    diags: &mut diag::Diags,
) {
    let Some(limit) = opts.memory_limit.or_else(passes::memory::machine_memory) else {
        return;
    };
    for c in graphs {
        let Some(info) = estimators.iter().find(|e| e.name == c.estimator) else {
            continue;
        };
        let train = c.mode == SectionKind::Train;
        let run = passes::memory::RunShape {
            train,
            shards: if train {
                info.config.num_shards.max(1) as u64
            } else {
                1
            },
            workers: if train {
                info.config.input_workers.max(1) as u64
            } else {
                1
            },
        };
        let e = passes::memory::estimate(&c.graph, c.input.as_ref(), run);
        let what = format!("the {} graph of `{}`", c.mode.name(), c.estimator);
        if let Some(d) = passes::memory::check(&e, limit, &what, info.span) {
            diags.push(d);
        }
    }
}

/// On the wafer target, lays each estimator's graphs out on the fabric: what does not
/// fit (E0603-E0605) or has no layout (E0601) is found here, before anything runs. One
/// diagnostic per estimator, from its first graph that fails (train, eval, predict).
fn check_wafer(
    graphs: &[Compiled],
    estimators: &[EstimatorInfo],
    opts: &CheckOptions,
    diags: &mut diag::Diags,
) {
    use backend::wafer::{diagnose, fabric::Fabric, form, place};
    let fab = opts.fabric.clone().unwrap_or_else(Fabric::test32);
    for info in estimators {
        let mine: Vec<_> = (graphs.iter())
            .filter(|c| c.estimator == info.name)
            .map(|c| form::prepared(&c.graph))
            .collect();
        // every construct a node alone shows has no layout, in every mode, each once;
        // else the first way the kernels do not meet or fit
        let surveys: Vec<form::Survey> = mine.iter().map(|g| form::survey(g)).collect();
        let mut blockers: Vec<form::Unsupported> = Vec::new();
        for u in surveys.iter().flat_map(|s| &s.blockers) {
            if !(blockers.iter()).any(|b| b.span == u.span && b.message == u.message) {
                blockers.push(u.clone());
            }
        }
        let failed: Vec<place::LayoutError> = if blockers.is_empty() {
            (mine.iter().zip(surveys))
                .find_map(|(g, s)| match form::form_surveyed(g, s) {
                    Err(u) => Some(place::LayoutError::Unsupported(u)),
                    // a graph with nothing to run on the fabric (a mode without sections)
                    Ok(f) if f.kernels.is_empty() => None,
                    Ok(f) => place::layout(g, &f, &fab).err(),
                })
                .into_iter()
                .collect()
        } else {
            blockers.sort_by_key(|u| (u.span.file, u.span.lo));
            blockers
                .into_iter()
                .map(place::LayoutError::Unsupported)
                .collect()
        };
        for e in failed {
            diags.push(diagnose::layout_diag(e, &fab, info.span));
        }
    }
}

fn stage_graph(s: &elab::data::Stage) -> Option<&ir::Graph> {
    match &s.kind {
        elab::data::StageKind::Map { graph, .. } | elab::data::StageKind::Filter { graph } => {
            Some(graph)
        }
        _ => None,
    }
}

/// Eval and predict graphs read the moving averages of the variables their estimator's
/// train graph averages (`moving_average(...)`), as TensorFlow restores
/// `ExponentialMovingAverage.variables_to_restore()` to evaluate.
fn read_moving_averages(graphs: &mut [elab::Compiled]) {
    use crate::syntax::ast::SectionKind;
    let averaged: Vec<(String, Vec<String>)> = graphs
        .iter()
        .filter(|c| c.mode == SectionKind::Train)
        .map(|c| {
            let names = c
                .graph
                .g
                .node_weights()
                .filter_map(|n| match &n.op {
                    ir::Op::Variable { name, .. } if name.ends_with(ir::AVERAGE_SUFFIX) => {
                        Some(name.clone())
                    }
                    _ => None,
                })
                .collect();
            (c.estimator.clone(), names)
        })
        .collect();
    for c in graphs.iter_mut().filter(|c| c.mode != SectionKind::Train) {
        if let Some((_, names)) = averaged.iter().find(|a| a.0 == c.estimator) {
            if !names.is_empty() {
                ir::read_averages(std::sync::Arc::make_mut(&mut c.graph), names);
            }
        }
    }
}
