//! `estc build`: compile one estimator's graph for a target without running it, and
//! write a stage (`--emit llvm-ir|asm|obj`) or report its kernels and memory plan
//! (`--report`). `estc check --emit llvm-ir|asm` prints the same stages per graph.

use super::{check_options, check_program, load, print_diags, print_result, usage};
use super::{write_failed, ModeArg, OutputArgs, ProgramArgs, Target};
use clap::{Parser, ValueEnum};
use est::elab::Compiled;
use est::Program;
use std::path::PathBuf;

#[derive(Parser)]
pub struct BuildArgs {
    #[command(flatten)]
    program: ProgramArgs,
    /// The target to compile for.
    #[arg(long, value_enum, default_value_t = BuildTarget::Host)]
    target: BuildTarget,
    /// The fabric of the wafer target: a config (`test32`, `test64`, `wse2`, `wse3`) or
    /// a `.toml` file. Default: test32.
    #[arg(long, value_parser = super::parse_fabric)]
    wafer: Option<est::backend::wafer::fabric::Fabric>,
    /// The graph to compile: the train step, the eval step or predict.
    #[arg(long, value_enum, default_value_t = ModeArg::Train)]
    mode: ModeArg,
    /// The estimator (needed when the program has several).
    #[arg(long)]
    estimator: Option<String>,
    /// Write a stage of the compilation: the optimised LLVM module, assembly, or an
    /// object file (which needs -o).
    #[arg(long, value_enum)]
    emit: Option<Stage>,
    /// Print the kernels, the memory plan (the arena's peak and every buffer, largest
    /// first) and whether the code came from the on-disk cache.
    #[arg(long)]
    report: bool,
    /// Generate code for this CPU (an LLVM CPU name such as `x86-64-v3`) instead of
    /// the one this runs on.
    #[arg(long)]
    cpu: Option<String>,
    /// Write the predict graph as a shared library and a C header into the directory
    /// -o names (`lib<ESTIMATOR>.so`, `<ESTIMATOR>.h`); `--mode` is then predict.
    #[arg(long, conflicts_with_all = ["emit", "report"])]
    lib: bool,
    /// Where to write the stage (default: stdout, for llvm-ir and asm), or the
    /// library's directory.
    #[arg(short = 'o', long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum BuildTarget {
    Host,
    /// The simulated wafer: a laid-out program (`--emit wafer`, `-o FILE.estw`, a
    /// measured `--report` and its SVG).
    Wafer,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
pub enum Stage {
    LlvmIr,
    Asm,
    Obj,
    /// The wafer program: kernels, programs by class, routes, memory maps.
    Wafer,
}

pub fn build(a: BuildArgs) -> i32 {
    let (program, config) = match load(&a.program) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let wafer = a.target == BuildTarget::Wafer;
    if wafer && a.lib {
        return usage("--lib builds a native library for the host: leave out --target wafer");
    }
    if wafer != (a.emit == Some(Stage::Wafer)) && a.emit.is_some() {
        return usage(if wafer {
            "the wafer target emits `--emit wafer`"
        } else {
            "--emit wafer needs --target wafer"
        });
    }
    if a.emit == Some(Stage::Obj) && a.output.is_none() {
        return usage("--emit obj writes an object file: name it with -o FILE");
    }
    if a.lib && a.output.is_none() {
        return usage("--lib writes a library and its header: name their directory with -o DIR");
    }
    let mode = if a.lib { ModeArg::Predict } else { a.mode };
    let [mode] = mode.modes()[..] else {
        return usage("build compiles one graph: --mode train, eval or predict");
    };
    let target = if wafer { Target::Wafer } else { Target::Host };
    let opts = check_options(
        &a.program,
        target,
        vec![mode],
        &a.estimator,
        config,
        a.wafer.clone(),
    );
    let checked = match check_program(&program, &opts) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if checked.has_errors() {
        return print_diags(&program, &checked.diags, a.out.message_format, a.out.color);
    }
    let c = match checked.graphs.as_slice() {
        [c] => c,
        [] => {
            return usage(&format!(
                "the program has no estimator with a {} graph",
                mode.name()
            ))
        }
        several => {
            let names: Vec<&str> = several.iter().map(|c| c.estimator.as_str()).collect();
            return usage(&format!(
                "the program has several estimators ({}): choose one with --estimator",
                names.join(", ")
            ));
        }
    };
    let at = checked.estimator_span(c);
    if wafer {
        let fab = a
            .wafer
            .clone()
            .unwrap_or_else(est::backend::wafer::fabric::Fabric::test32);
        let emit = a.emit == Some(Stage::Wafer);
        let b = match super::wafer::build(c, at, &fab, emit, a.output.as_deref(), a.report) {
            Ok(b) => b,
            Err(d) => return print_diags(&program, &[d], a.out.message_format, a.out.color),
        };
        let mut text = b.text;
        if let (Some(p), Some(bytes)) = (&a.output, &b.artifact) {
            if let Err(e) = est::atomic::write_output_bytes(p, bytes) {
                return write_failed(&p.display().to_string(), &e);
            }
            text.push_str(&format!("wrote {}\n", p.display()));
        }
        if let Some((p, svg)) = &b.svg {
            if let Err(e) = est::atomic::write_output_bytes(p, svg.as_bytes()) {
                return write_failed(&p.display().to_string(), &e);
            }
            text.push_str(&format!("wrote {}\n", p.display()));
        }
        return match print_result(&text) {
            Ok(()) => 0,
            Err(code) => code,
        };
    }
    let built = match (a.lib, &a.output) {
        (true, Some(dir)) => library(c, at, a.cpu.as_deref(), dir).map(|t| (t, None)),
        _ => host(&program, c, at, a.cpu.as_deref(), a.emit, a.report),
    };
    match built {
        Ok((text, stage)) => {
            if let Some(bytes) = stage {
                let written = match &a.output {
                    Some(p) => est::atomic::write_output_bytes(p, &bytes)
                        .map_err(|e| write_failed(&p.display().to_string(), &e)),
                    None => print_result(&String::from_utf8_lossy(&bytes)),
                };
                if let Err(code) = written {
                    return code;
                }
            }
            match print_result(&text) {
                Ok(()) => 0,
                Err(code) => code,
            }
        }
        Err(d) => print_diags(&program, &[d], a.out.message_format, a.out.color),
    }
}

/// The stage `emit` of one compiled graph, for `estc check --emit`.
pub fn stage(
    program: &Program,
    c: &Compiled,
    at: est::span::Span,
    emit: Stage,
) -> Result<Vec<u8>, est::diag::Diag> {
    host(program, c, at, None, Some(emit), false).map(|(_, s)| s.unwrap_or_default())
}

/// Compiles a graph for the host; returns the report's text (empty without
/// `report`) and the stage asked for.
#[cfg(feature = "llvm")]
fn host(
    program: &Program,
    c: &Compiled,
    at: est::span::Span,
    cpu: Option<&str>,
    emit: Option<Stage>,
    report: bool,
) -> Result<(String, Option<Vec<u8>>), est::diag::Diag> {
    use est::backend::host;
    let phases = est::backend::phases(&c.graph, c.mode, at)?;
    let emit = match emit {
        Some(Stage::LlvmIr) => Some(host::Emit::LlvmIr),
        Some(Stage::Asm) => Some(host::Emit::Asm),
        Some(Stage::Obj) => Some(host::Emit::Obj),
        Some(Stage::Wafer) | None => None,
    };
    let (r, stage) = host::build(&c.graph, &phases, at, cpu, emit)?;
    if !report {
        return Ok((String::new(), stage));
    }
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let mut t = format!(
        "{} ({}) for the host, CPU {}\n",
        c.estimator,
        c.mode.name(),
        r.cpu
    );
    t.push_str(&format!(
        "kernels: {} generated, {} native\n",
        r.generated, r.native
    ));
    for (outer, ops) in &r.chains {
        t.push_str(&format!(
            "chain, slab by slab over {outer}: {}\n",
            ops.join(", ")
        ));
    }
    t.push_str(&format!(
        "arena: {:.2} MiB peak ({} bytes; {:.2} MiB whole and unshared)\n",
        mib(r.arena),
        r.arena,
        mib(r.unshared)
    ));
    t.push_str(&format!(
        "variables: {:.2} MiB, resident in the device\n",
        mib(r.variables)
    ));
    t.push_str("largest buffers:\n");
    for b in r.buffers.iter().take(10) {
        let at = b.span.map_or(String::new(), |s| {
            let f = program.sources.get(s.file);
            let (line, col) = f.line_col(s.lo as usize);
            format!("  {}:{line}:{col}", f.name)
        });
        t.push_str(&format!(
            "  {:>10.3} MiB  {:<22} {}{at}\n",
            mib(b.bytes),
            b.op,
            b.what
        ));
    }
    for o in &r.origins {
        t.push_str(&format!("code: {o}\n"));
    }
    Ok((t, stage))
}

/// Writes the predict graph's shared library and header into `dir`; returns what
/// was written, for the user.
#[cfg(feature = "llvm")]
fn library(
    c: &Compiled,
    at: est::span::Span,
    cpu: Option<&str>,
    dir: &std::path::Path,
) -> Result<String, est::diag::Diag> {
    let lib = est::backend::host::library(&c.graph, at, cpu, &c.estimator, dir)?;
    let mut t = format!(
        "{} (predict): {} kernels, {:.2} MiB per loaded model\n",
        c.estimator,
        lib.kernels,
        lib.bytes as f64 / (1 << 20) as f64
    );
    for f in &lib.files {
        t.push_str(&format!("wrote {}\n", f.display()));
    }
    Ok(t)
}

#[cfg(not(feature = "llvm"))]
fn library(
    _: &Compiled,
    at: est::span::Span,
    _: Option<&str>,
    _: &std::path::Path,
) -> Result<String, est::diag::Diag> {
    est::backend::open(Target::Host, at, 1).map(|_| String::new())
}

#[cfg(not(feature = "llvm"))]
fn host(
    _: &Program,
    _: &Compiled,
    at: est::span::Span,
    _: Option<&str>,
    _: Option<Stage>,
    _: bool,
) -> Result<(String, Option<Vec<u8>>), est::diag::Diag> {
    est::backend::open(Target::Host, at, 1).map(|_| (String::new(), None))
}
