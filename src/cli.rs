//! The command line: argument parsing, output formats and exit codes (0 clean, 1
//! errors in the program, 2 usage or I/O errors). Everything else is the library's.

mod build;
mod data;
mod export;
mod fmt;
mod ranks;
mod run;
mod wafer;

use clap::{Parser, Subcommand, ValueEnum};
// `log` writes a line to stderr and ignores a failed write: a full disk or a closed
// terminal must not stop training. Results go through `print_result`.
use est::diag::{log, render, Code, Diag};
use est::elab::Target;
use est::syntax::ast::SectionKind;
use est::{CheckOptions, Program};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "estc",
    version,
    about = "The est compiler: checks, trains, evaluates and exports declarative ML programs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check a program: parse, resolve, elaborate every estimator for every mode and run
    /// every static rule, without running the model.
    Check(CheckArgs),
    /// Train an estimator: restore the latest checkpoint of its model_dir (or initialise),
    /// then run loops of steps with checkpoints and summaries.
    Train(RunArgs),
    /// Evaluate the latest checkpoint over the eval input and print its metrics.
    Eval(RunArgs),
    /// Write predictions of the latest checkpoint (JSON lines and one .npy per output).
    Predict(RunArgs),
    /// Compile one estimator's graph for a target without running it: write a stage
    /// (`--emit llvm-ir|asm|obj`) or report its kernels and memory plan (`--report`).
    Build(build::BuildArgs),
    /// Write the predict graph with a checkpoint's weights for serving: an ONNX model
    /// whose batch size is symbolic (`--format onnx`, checked against est with
    /// onnxruntime by `--verify`), or the native library and C header (`--format native`).
    Export(export::ExportArgs),
    /// Run a wafer artifact (`estc build --target wafer -o FILE.estw`) on generated data in
    /// the simulator and print its report: cycles per step, samples per second, each
    /// kernel's PEs, cycles per sample, utilisation, memory and colours
    Sim(wafer::SimArgs),
    /// Run an estimator's input pipeline alone and report its speed and the shapes of
    /// its batches (`--show N` prints the first N batches as JSON lines).
    PerfInput(PerfArgs),
    /// Work on data files: `estc data convert` turns CSV/TSV, PNG folders and .npy arrays
    /// into sharded TFRecord files of tf.Examples.
    Data(DataArgs),
    /// Serve the Language Server Protocol over stdin/stdout: diagnostics as you type,
    /// hover, go to definition, symbols and completion (see docs/editors.md).
    Lsp(LspArgs),
    /// Explain a diagnostic code (such as E0401) at length, with an example.
    Explain(ExplainArgs),
    /// Format .est files in place in the one canonical layout, comments kept (`--check`
    /// lists the files that are not formatted instead, for CI); with no file, format
    /// standard input to standard output.
    Fmt(fmt::FmtArgs),
}

/// The program to load, with its overrides (shared by every command that loads one).
#[derive(clap::Args)]
struct ProgramArgs {
    /// The program's root file.
    file: PathBuf,
    /// Override a params field: `--param learning_rate=0.01` (the value is est syntax).
    #[arg(long = "param", value_name = "KEY=VALUE")]
    params: Vec<String>,
    /// Override params fields from a YAML file of `key: value` lines (nested for record
    /// fields; a Cerebras-style `runconfig:` section sets config, max_steps, model_dir).
    #[arg(long = "params", value_name = "FILE")]
    params_file: Option<PathBuf>,
    /// Override an estimator config key: `--config num_shards=2`.
    #[arg(long = "config", value_name = "KEY=VALUE")]
    config: Vec<String>,
    /// The memory a run may need (`16G`, `512M`, `none`); a program estimated beyond it
    /// is E0602. Default: this machine's memory.
    #[arg(long, value_name = "SIZE", value_parser = memory_size)]
    memory_limit: Option<u64>,
}

/// How to print diagnostics and results.
#[derive(clap::Args)]
struct OutputArgs {
    /// How to print diagnostics and results.
    #[arg(long, value_enum, default_value_t = MessageFormat::Human)]
    message_format: MessageFormat,
    /// Colour in human output.
    #[arg(long, value_enum, default_value_t = Color::Auto)]
    color: Color,
}

#[derive(Parser)]
struct PerfArgs {
    #[command(flatten)]
    program: ProgramArgs,
    /// The estimator whose input to run (needed when the program has several).
    #[arg(long)]
    estimator: Option<String>,
    /// Which of the estimator's inputs: train, eval or predict.
    #[arg(long, value_enum, default_value_t = InputArg::Train)]
    input: InputArg,
    /// Run for this many seconds (default 10, or until the input ends).
    #[arg(long, conflicts_with = "steps", value_parser = seconds, allow_hyphen_values = true)]
    time: Option<f64>,
    /// Run for this many batches.
    #[arg(long)]
    steps: Option<u64>,
    /// Print the first N batches as JSON lines ({"features": ..., "labels": ...}).
    #[arg(long, value_name = "N")]
    show: Option<u64>,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Parser)]
struct LspArgs {
    /// Talk over stdin/stdout (the only transport; accepted for clients that pass it).
    #[arg(long)]
    stdio: bool,
}

#[derive(Parser)]
struct DataArgs {
    #[command(subcommand)]
    command: DataCommand,
}

#[derive(Subcommand)]
enum DataCommand {
    /// Convert raw data to TFRecord files of tf.Examples, offline, with progress.
    Convert(ConvertArgs),
}

#[derive(Parser)]
struct ConvertArgs {
    /// The format of the inputs.
    #[arg(long, value_enum)]
    from: FromArg,
    /// The format to write (TFRecord of tf.Examples).
    #[arg(long, value_enum, default_value_t = ToArg::Tfrecord)]
    to: ToArg,
    /// The files (or, for png, folders or globs) to convert.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    /// Where to write: PREFIX.tfrecord, or PREFIX-00000-of-0000N.tfrecord with --shards N.
    #[arg(long, short)]
    output: PathBuf,
    /// How many files to split the records into (consecutive records per file).
    #[arg(long, default_value_t = 1)]
    shards: usize,
    /// npy: an array of labels (feature `label`); png: a `file,label` CSV instead of
    /// folder names.
    #[arg(long)]
    labels: Option<PathBuf>,
    /// csv/tsv: make the columns FIRST to LAST one feature: `--group pixels=p0:p63`.
    #[arg(long = "group", value_name = "NAME=FIRST:LAST")]
    groups: Vec<String>,
    /// Set a feature's kind instead of inferring it: `--type pixels=float`
    /// (float, int or bytes).
    #[arg(long = "type", value_name = "NAME=KIND")]
    kinds: Vec<String>,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum FromArg {
    Csv,
    Tsv,
    Png,
    Npy,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum ToArg {
    Tfrecord,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum InputArg {
    Train,
    Eval,
    Predict,
}

/// `--wafer CONFIG`: a named fabric config or a `.toml` file.
fn parse_fabric(arg: &str) -> Result<est::backend::wafer::fabric::Fabric, String> {
    est::backend::wafer::fabric::resolve(arg)
}

#[derive(Parser)]
struct RunArgs {
    #[command(flatten)]
    program: ProgramArgs,
    /// The estimator to run (needed when the program has several).
    #[arg(long)]
    estimator: Option<String>,
    /// Where to run: native code for this CPU through LLVM (the default when estc is
    /// built with the `llvm` feature), the reference interpreter, or the wafer.
    #[arg(long, value_enum, default_value_t = RunTarget::default())]
    target: RunTarget,
    /// The fabric the wafer target runs on: a config (`test32`, `test64`, `wse2`,
    /// `wse3`) or a `.toml` file with every figure (see docs/wafer.md). Default: test32.
    #[arg(long, value_parser = parse_fabric)]
    wafer: Option<est::backend::wafer::fabric::Fabric>,
    /// Overrides the estimator's model_dir.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// The threads a step runs on (host target; default: EST_NUM_THREADS, else every
    /// core). Results are the same bits at any thread count.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=est::backend::pool::MAX_THREADS as i64))]
    threads: Option<u16>,
    /// Steps to add to the global step (train), or batches to run (eval, predict).
    #[arg(long, conflicts_with = "max_steps")]
    steps: Option<u64>,
    /// Train up to this global step (a total, as the Estimator API's max_steps).
    #[arg(long)]
    max_steps: Option<u64>,
    /// Train this many passes over the train input: converted to steps from the
    /// input's size (read from its source; an error when it cannot be known).
    #[arg(long, conflicts_with_all = ["steps", "max_steps"], value_parser = clap::value_parser!(u64).range(1..))]
    epochs: Option<u64>,
    /// Train-and-evaluate: evaluate the eval input every N steps (each time from a
    /// fresh checkpoint), as the estimator's `eval_every` field does; the `early_stopping`
    /// and `keep_best` hooks watch these evaluations.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    eval_every: Option<u64>,
    /// One train step, one checkpoint save and restore, one eval step, in a temporary
    /// directory: finds errors in seconds.
    #[arg(long)]
    smoke: bool,
    /// Where predict writes (default: MODEL_DIR/predictions).
    #[arg(long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum RunTarget {
    Interp,
    Host,
    Wafer,
}

impl RunTarget {
    fn target(self) -> Target {
        match self {
            RunTarget::Interp => Target::Interp,
            RunTarget::Host => Target::Host,
            RunTarget::Wafer => Target::Wafer,
        }
    }
}

impl Default for RunTarget {
    fn default() -> RunTarget {
        match Target::run_default() {
            Target::Host => RunTarget::Host,
            _ => RunTarget::Interp,
        }
    }
}

#[derive(Parser)]
struct CheckArgs {
    #[command(flatten)]
    program: ProgramArgs,
    /// The target whose rules to check.
    #[arg(long, value_enum, default_value_t = TargetArg::Host)]
    target: TargetArg,
    /// The fabric `--target wafer` lays the program out on: a config (`test32`,
    /// `test64`, `wse2`, `wse3`) or a `.toml` file. Default: test32.
    #[arg(long, value_parser = parse_fabric)]
    wafer: Option<est::backend::wafer::fabric::Fabric>,
    /// The modes to elaborate.
    #[arg(long, value_enum, default_value_t = ModeArg::All)]
    mode: ModeArg,
    /// Only this estimator (default: all of them).
    #[arg(long)]
    estimator: Option<String>,
    /// Print a stage instead of the diagnostics summary.
    #[arg(long, value_enum)]
    emit: Option<Emit>,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Parser)]
struct ExplainArgs {
    /// The code, such as E0401 or W0701.
    code: Option<String>,
    /// List every code with its title.
    #[arg(long)]
    list: bool,
    /// Print the whole catalogue as Markdown (this is docs/diagnostics.md).
    #[arg(long)]
    markdown: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum TargetArg {
    Host,
    Wafer,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum ModeArg {
    Train,
    Eval,
    Predict,
    All,
}

impl ModeArg {
    fn modes(self) -> Vec<SectionKind> {
        match self {
            ModeArg::Train => vec![SectionKind::Train],
            ModeArg::Eval => vec![SectionKind::Eval],
            ModeArg::Predict => vec![SectionKind::Predict],
            ModeArg::All => vec![SectionKind::Train, SectionKind::Eval, SectionKind::Predict],
        }
    }
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Emit {
    Tokens,
    Ast,
    Ir,
    IrDot,
    /// The host's optimised LLVM module of each graph.
    LlvmIr,
    /// The host's assembly of each graph.
    Asm,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum MessageFormat {
    Human,
    Json,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Color {
    Auto,
    Always,
    Never,
}

/// Runs the CLI and returns the exit status.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // `--help` and `--version` are results: a failed write of them is an error.
            return match e.print() {
                Err(io) if !e.use_stderr() => write_failed("stdout", &io),
                _ if e.use_stderr() => 2,
                _ => 0,
            };
        }
    };
    if let Err(m) = est::backend::pool::env_threads() {
        return usage(&m);
    }
    match cli.command {
        Command::Check(a) => check(a),
        Command::Train(a) => run::run(a, SectionKind::Train),
        Command::Eval(a) => run::run(a, SectionKind::Eval),
        Command::Predict(a) => run::run(a, SectionKind::Predict),
        Command::Build(a) => build::build(a),
        Command::Export(a) => export::export(a),
        Command::Sim(a) => wafer::sim(a),
        Command::PerfInput(a) => run::perf_input(a),
        Command::Data(a) => data::run(a),
        Command::Lsp(_) => est::lsp::run_stdio(),
        Command::Explain(a) => explain(a),
        Command::Fmt(a) => fmt::fmt(a),
    }
}

fn usage(msg: &str) -> i32 {
    log(&format!("error: {msg}"));
    2
}

/// Writes a command's result to stdout. A failed write (`estc eval > /dev/full`) is an
/// I/O error, reported on stderr: a lost result is not a clean run.
fn print_result(text: &str) -> Result<(), i32> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| write_failed("stdout", &e))
}

/// Reports a failed write of a result; returns the exit status, 2.
fn write_failed(to: &str, e: &std::io::Error) -> i32 {
    log(&format!("error: cannot write to {to}: {e}"));
    2
}

/// Loads a program with its `--param`/`--params` overrides and parses `--config`
/// (applied after a params file's `runconfig:` section).
fn load(a: &ProgramArgs) -> Result<(Program, Vec<(String, i64)>), i32> {
    load_with_run(a).map(|(p, c, _)| (p, c))
}

/// A loaded program, its config overrides, and what its params file's `runconfig:`
/// section sets besides config.
type Loaded = (Program, Vec<(String, i64)>, RunConfigFile);

/// `load`, with what the params file's `runconfig:` section sets besides config.
fn load_with_run(a: &ProgramArgs) -> Result<Loaded, i32> {
    let mut program = match Program::load(&a.file) {
        Ok(p) => p,
        Err(e) => return Err(usage(&e.0)),
    };
    let mut run = RunConfigFile::default();
    if let Some(f) = &a.params_file {
        match add_params_file(&mut program, f) {
            Ok(r) => run = r,
            Err(e) => return Err(usage(&e)),
        }
    }
    for kv in &a.params {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(usage(&format!("--param takes KEY=VALUE, found `{kv}`")));
        };
        program.add_override(k.trim(), v.trim(), &format!("--param {}", k.trim()));
    }
    let mut config = std::mem::take(&mut run.config);
    if let Some(f) = &a.params_file {
        for (k, v) in &config {
            let origin = format!("--params {}", f.display());
            program.add_config_source(k, &format!("runconfig: {k}: {v}"), &origin);
        }
    }
    for kv in &a.config {
        match config_override(kv) {
            Ok(p) => {
                program.add_config_source(&p.0, kv, "--config");
                config.push(p);
            }
            Err(e) => return Err(usage(&e)),
        }
    }
    Ok((program, config, run))
}

fn check(a: CheckArgs) -> i32 {
    let (program, config) = match load(&a.program) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if let Some(Emit::Tokens | Emit::Ast) = a.emit {
        return emit_syntax(&program, a.emit);
    }
    let target = match a.target {
        TargetArg::Host => Target::Host,
        TargetArg::Wafer => Target::Wafer,
    };
    let opts = check_options(
        &a.program,
        target,
        a.mode.modes(),
        &a.estimator,
        config,
        a.wafer,
    );
    let checked = match check_program(&program, &opts) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut failed = Vec::new();
    for c in &checked.graphs {
        let dump = match a.emit {
            Some(Emit::Ir) => c.dump(),
            Some(Emit::IrDot) => est::ir::dump_dot(&c.graph, &c.title()),
            Some(e @ (Emit::LlvmIr | Emit::Asm)) => {
                let stage = if e == Emit::Asm {
                    build::Stage::Asm
                } else {
                    build::Stage::LlvmIr
                };
                match build::stage(&program, c, checked.estimator_span(c), stage) {
                    Ok(bytes) => {
                        format!("; {}\n{}", c.title(), String::from_utf8_lossy(&bytes))
                    }
                    Err(d) => {
                        failed.push(d);
                        continue;
                    }
                }
            }
            _ => break,
        };
        if let Err(code) = print_result(&dump) {
            return code;
        }
    }
    let diags: Vec<Diag> = checked.diags.iter().cloned().chain(failed).collect();
    report(
        &program,
        &diags,
        a.out.message_format,
        a.out.color,
        a.emit.is_none(),
        checked.graphs.len(),
    )
}

/// What `check` and `build` check: the program's estimators (or one), in `modes`.
fn check_options(
    a: &ProgramArgs,
    target: Target,
    modes: Vec<SectionKind>,
    estimator: &Option<String>,
    config: Vec<(String, i64)>,
    fabric: Option<est::backend::wafer::fabric::Fabric>,
) -> CheckOptions {
    CheckOptions {
        target,
        modes,
        estimator: estimator.clone(),
        config,
        verify: cfg!(debug_assertions),
        max_steps: est::elab::MAX_STEPS,
        hover: false,
        memory_limit: a.memory_limit,
        fabric,
        ranks: 1,
    }
}

/// Checks a program; a pass that broke the IR is an internal compiler error (status 2).
fn check_program(program: &Program, opts: &CheckOptions) -> Result<est::Checked, i32> {
    let checked = est::check(program, opts);
    if let Some(b) = &checked.bug {
        log(&format!(
            "internal compiler error: pass `{}` broke the IR: {}",
            b.pass, b.message
        ));
        return Err(2);
    }
    Ok(checked)
}

/// `--time`: a finite number of seconds, at least 0.
/// `--memory-limit`: bytes, with an optional K, M, G or T (powers of 1024), or `none`.
fn memory_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("none") {
        return Ok(u64::MAX);
    }
    let (num, unit) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => (&t[..i], t[i..].trim_end_matches(['B', 'b', 'i'])),
        None => (t, ""),
    };
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => {
            return Err(format!(
                "`{s}`: use bytes, or a number with K, M, G or T, or none"
            ))
        }
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a size such as 16G or 512M"))?;
    let bytes = v * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 1.0 {
        return Err(format!("`{s}` is not a positive size"));
    }
    Ok(bytes.min(u64::MAX as f64) as u64)
}

fn seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        _ => Err("expected a number of seconds, finite and at least 0".to_string()),
    }
}

/// `--config key=value`: a known key and an integer in its range.
fn config_override(kv: &str) -> Result<(String, i64), String> {
    let Some((k, v)) = kv.split_once('=') else {
        return Err(format!("--config takes KEY=INTEGER, found `{kv}`"));
    };
    let key = k.trim();
    if !est::elab::CONFIG_KEYS.contains(&key) {
        return Err(format!(
            "--config: unknown key `{key}`; config keys: {}",
            est::elab::CONFIG_KEYS.join(", ")
        ));
    }
    let value: i64 = v
        .trim()
        .replace('_', "")
        .parse()
        .map_err(|_| format!("--config {key}: `{}` is not an integer", v.trim()))?;
    let min = if key == "random_seed" { 0 } else { 1 };
    if value < min {
        return Err(format!(
            "--config {key}: must be at least {min}, found {value}"
        ));
    }
    Ok((key.to_string(), value))
}

/// Prints diagnostics (human or JSON) without a summary; returns the exit status.
fn print_diags(program: &Program, diags: &[Diag], format: MessageFormat, color: Color) -> i32 {
    report(program, diags, format, color, false, 0)
}

/// Prints the diagnostics and a summary; returns the exit status (2 when they cannot
/// be written).
fn report(
    program: &Program,
    diags: &[Diag],
    format: MessageFormat,
    color: Color,
    summary: bool,
    graphs: usize,
) -> i32 {
    let errors = diags
        .iter()
        .filter(|d| d.severity() == est::diag::Severity::Error)
        .count();
    let warnings = diags.len() - errors;
    if format == MessageFormat::Json {
        let mut out = String::new();
        for d in diags {
            out.push_str(&render::to_json(d, &program.sources).to_string());
            out.push('\n');
        }
        if let Err(code) = print_result(&out) {
            return code;
        }
    } else {
        let stderr = std::io::stderr();
        let mut text = render::render_all(diags, &program.sources, stderr_style(color));
        if summary {
            let file = &program.sources.get(program.root_module().file).name;
            text.push_str(&match (errors, warnings) {
                (0, 0) => format!("{file}: ok ({graphs} graph{} checked)\n", plural(graphs)),
                (0, w) => format!(
                    "{file}: ok with {w} warning{} ({graphs} graph{} checked)\n",
                    plural(w),
                    plural(graphs)
                ),
                (e, w) => format!("{file}: {e} error{}, {w} warning{}\n", plural(e), plural(w)),
            });
        }
        let mut err = stderr.lock();
        if let Err(e) = err.write_all(text.as_bytes()).and_then(|()| err.flush()) {
            drop(err);
            return write_failed("stderr", &e);
        }
    }
    i32::from(errors > 0)
}

/// How diagnostics are drawn on stderr: in colour as `--color` says (`auto`: on a
/// terminal, unless `NO_COLOR` is set), 120 columns wide on a terminal, 100 otherwise.
fn stderr_style(color: Color) -> render::Style {
    let tty = std::io::stderr().is_terminal();
    let color = match color {
        Color::Always => true,
        Color::Never => false,
        Color::Auto => tty && std::env::var_os("NO_COLOR").is_none(),
    };
    render::Style {
        color,
        width: if tty { 120 } else { 100 },
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn emit_syntax(program: &Program, emit: Option<Emit>) -> i32 {
    let root = program.root_module();
    let file = program.sources.get(root.file);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = match emit {
        Some(Emit::Tokens) => write_tokens(&mut out, file),
        _ => writeln!(out, "{:#?}", root.ast),
    };
    if let Err(e) = written.and_then(|()| out.flush()) {
        return write_failed("stdout", &e);
    }
    drop(out);
    let errors = program
        .diags
        .iter()
        .filter(|d| d.severity() == est::diag::Severity::Error)
        .count();
    if errors > 0 {
        let text = render::render_all(
            &program.diags.sorted(),
            &program.sources,
            render::Style::plain(),
        );
        if let Err(e) = std::io::stderr().write_all(text.as_bytes()) {
            return write_failed("stderr", &e);
        }
    }
    i32::from(errors > 0)
}

/// `--emit tokens`: one line per token, `LINE:COLUMN Token "text"`. The position is
/// carried from token to token (tokens come in order), so a long line costs its length
/// once, not once per token.
fn write_tokens(out: &mut impl Write, file: &est::span::SourceFile) -> std::io::Result<()> {
    let text = &*file.text;
    let (mut at, mut line, mut col) = (0, 1, 1);
    for (lo, tok, hi) in est::syntax::lexer::lex(text) {
        for c in text[at..lo].chars() {
            if c == '\n' {
                line += 1;
                col = 1;
            } else {
                col += 1;
            }
        }
        at = lo;
        writeln!(out, "{line}:{col} {:?} {:?}", tok, &text[lo..hi])?;
    }
    Ok(())
}

/// The deepest a params file may nest (a list in a list, ...). serde_yaml's parser
/// takes time quadratic in the depth (20 s at 100,000 levels), so deeper files are
/// refused before it runs; a params file needs a few levels at most.
const MAX_PARAMS_DEPTH: usize = 64;

/// What a params file sets besides params: its Cerebras-style `runconfig:` section.
#[derive(Default)]
pub(crate) struct RunConfigFile {
    pub config: Vec<(String, i64)>,
    pub max_steps: Option<u64>,
    pub model_dir: Option<PathBuf>,
}

/// The keys of a `runconfig:` section and what they set: an estimator config key (a
/// Cerebras or TensorFlow spelling on the left), or `max_steps` and `model_dir`.
const RUNCONFIG_KEYS: &[(&str, &str)] = &[
    ("max_steps", "max_steps"),
    ("model_dir", "model_dir"),
    ("checkpoint_steps", "save_checkpoint_steps"),
    ("save_checkpoints_steps", "save_checkpoint_steps"),
    ("save_checkpoint_steps", "save_checkpoint_steps"),
    ("save_summary_steps", "save_summary_steps"),
    ("keep_checkpoint_max", "keep_checkpoint_max"),
    ("seed", "random_seed"),
    ("tf_random_seed", "random_seed"),
    ("random_seed", "random_seed"),
    ("log_steps", "log_step_count_steps"),
    ("log_step_count_steps", "log_step_count_steps"),
    ("iterations_per_loop", "iterations_per_loop"),
    ("num_shards", "num_shards"),
    ("input_workers", "input_workers"),
];

/// Reads a YAML params file as params overrides: `key: value` lines, each value written
/// as est syntax and parsed like a `--param`, and nested mappings for record-typed
/// params fields (`model:` with `depth: 10` under it overrides `params.model.depth`),
/// as Cerebras's params.yaml is written. A `runconfig:` section, unless the program has
/// a params field of that name, sets the estimator's config, `max_steps` and
/// `model_dir` instead.
fn add_params_file(program: &mut Program, path: &std::path::Path) -> Result<RunConfigFile, String> {
    let text = est::program::read_text(path, est::program::MAX_SOURCE_BYTES).map_err(|e| {
        format!(
            "cannot read {}: {}",
            path.display(),
            e.describe("params file")
        )
    })?;
    if let Some(line) = yaml_too_deep(&text, MAX_PARAMS_DEPTH) {
        return Err(format!(
            "{}:{line}: nested more than {MAX_PARAMS_DEPTH} levels deep, the limit of a params file; write `key: value` lines",
            path.display()
        ));
    }
    let yaml: serde_yaml::Value = serde_yaml::from_str(&text)
        .map_err(|e| format!("{}: invalid YAML: {e}", path.display()))?;
    let serde_yaml::Value::Mapping(map) = yaml else {
        return Err(format!(
            "{}: expected a mapping of params fields to values",
            path.display()
        ));
    };
    let declared = |program: &Program, name: &str| {
        program
            .root_module()
            .ast
            .items
            .iter()
            .any(|i| match &i.kind {
                est::syntax::ast::ItemKind::Params(fs) => fs.iter().any(|f| f.name.name == name),
                _ => false,
            })
    };
    let mut run = RunConfigFile::default();
    let mut leaves = Vec::new();
    for (k, v) in &map {
        let key = yaml_key(k, path)?;
        if key == "runconfig" && !declared(program, "runconfig") {
            run = runconfig(v, path)?;
        } else {
            flatten(&key, v, path, &mut leaves)?;
        }
    }
    for (key, v) in leaves {
        let value = yaml_to_est(v).ok_or_else(|| {
            format!(
                "{}: the value of `{key}` is not a number, bool, string or list",
                path.display()
            )
        })?;
        program.add_override(&key, &value, &format!("{}: {key}", path.display()));
    }
    Ok(run)
}

fn yaml_key(k: &serde_yaml::Value, path: &std::path::Path) -> Result<String, String> {
    match k {
        serde_yaml::Value::String(s) => Ok(s.clone()),
        other => Err(format!(
            "{}: keys must be strings, found {other:?}",
            path.display()
        )),
    }
}

/// The leaves of a params value: nested mappings become dotted keys (`model.depth`).
fn flatten<'y>(
    key: &str,
    v: &'y serde_yaml::Value,
    path: &std::path::Path,
    out: &mut Vec<(String, &'y serde_yaml::Value)>,
) -> Result<(), String> {
    match v {
        serde_yaml::Value::Mapping(m) => {
            for (k, x) in m {
                flatten(&format!("{key}.{}", yaml_key(k, path)?), x, path, out)?;
            }
        }
        _ => out.push((key.to_string(), v)),
    }
    Ok(())
}

/// A `runconfig:` section: see `RUNCONFIG_KEYS`.
fn runconfig(v: &serde_yaml::Value, path: &std::path::Path) -> Result<RunConfigFile, String> {
    let serde_yaml::Value::Mapping(m) = v else {
        return Err(format!(
            "{}: `runconfig` must be a mapping of keys to values",
            path.display()
        ));
    };
    let mut run = RunConfigFile::default();
    for (k, x) in m {
        let key = yaml_key(k, path)?;
        let Some(&(_, to)) = RUNCONFIG_KEYS.iter().find(|(from, _)| *from == key) else {
            let known: Vec<&str> = RUNCONFIG_KEYS.iter().map(|k| k.0).collect();
            return Err(format!(
                "{}: `runconfig.{key}` is not a key est reads; it reads {}",
                path.display(),
                known.join(", ")
            ));
        };
        match to {
            "model_dir" => match x {
                serde_yaml::Value::String(s) => run.model_dir = Some(PathBuf::from(s)),
                _ => {
                    return Err(format!(
                        "{}: `runconfig.model_dir` must be a string",
                        path.display()
                    ))
                }
            },
            _ => {
                let n = x.as_i64().filter(|n| *n >= 0).ok_or_else(|| {
                    format!(
                        "{}: `runconfig.{key}` must be a non-negative integer",
                        path.display()
                    )
                })?;
                if to == "max_steps" {
                    run.max_steps = Some(n as u64);
                } else {
                    run.config.push((to.to_string(), n));
                }
            }
        }
    }
    Ok(run)
}

/// The first line (1-based) where a YAML text may nest deeper than `max`, found in one
/// pass without parsing. The depth counted is an upper bound of the real one: the open
/// flow brackets (`[`, `{`) outside quoted strings and comments, plus, on a line
/// outside brackets, twice its number of indentation levels (a mapping's value may be
/// a sequence at the same indentation) and the block indicators on it (`- `, `? `,
/// `: `). A quote, a comment or a bracket read where YAML sees none can only count
/// too much, never too little.
fn yaml_too_deep(text: &str, max: usize) -> Option<usize> {
    let mut flow = 0usize;
    let mut indents: Vec<usize> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let content = line.trim_start_matches(' ');
        if content.trim().is_empty() || content.starts_with('#') {
            continue;
        }
        let mut block = 0;
        if flow == 0 {
            let indent = line.len() - content.len();
            while indents.last().is_some_and(|&i| i > indent) {
                indents.pop();
            }
            if indents.last() != Some(&indent) {
                indents.push(indent);
            }
            block = 2 * indents.len();
        }
        let b = line.as_bytes();
        let mut quote: Option<u8> = None;
        // the last character that is not a space: a quote opens a string only where a
        // value starts
        let mut last = b' ';
        let mut i = 0;
        while i < b.len() {
            let c = b[i];
            let next = b.get(i + 1).copied().unwrap_or(b' ');
            match quote {
                Some(b'"') if c == b'\\' => i += 1,
                Some(q) if c == q && q == b'\'' && next == b'\'' => i += 1,
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None => match c {
                    b'#' if i == 0 || b[i - 1] == b' ' || b[i - 1] == b'\t' => break,
                    b'"' | b'\'' if b" [{,:-?".contains(&last) => quote = Some(c),
                    b'[' | b'{' => flow += 1,
                    b']' | b'}' => flow = flow.saturating_sub(1),
                    b'-' | b'?' | b':' if flow == 0 && (next == b' ' || next == b'\t') => {
                        block += 1
                    }
                    _ => {}
                },
            }
            if block + flow > max {
                return Some(n + 1);
            }
            if c != b' ' && c != b'\t' {
                last = c;
            }
            i += 1;
        }
    }
    None
}

fn yaml_to_est(v: &serde_yaml::Value) -> Option<String> {
    Some(match v {
        serde_yaml::Value::Bool(b) => b.to_string(),
        serde_yaml::Value::Number(n) => {
            let s = n.to_string();
            if n.is_f64()
                && !s.contains(['.', 'e', 'E'])
                && !s.contains("inf")
                && !s.contains("NaN")
            {
                format!("{s}.0")
            } else {
                s
            }
        }
        serde_yaml::Value::String(s) => serde_json::to_string(s).ok()?,
        serde_yaml::Value::Sequence(xs) => format!(
            "[{}]",
            xs.iter()
                .map(yaml_to_est)
                .collect::<Option<Vec<_>>>()?
                .join(", ")
        ),
        _ => return None,
    })
}

fn explain(a: ExplainArgs) -> i32 {
    let text = if a.markdown {
        est::diag::catalogue_markdown()
    } else if a.list || a.code.is_none() {
        Code::all()
            .iter()
            .map(|c| format!("{}  {:<8} {}\n", c.id, c.severity.name(), c.title))
            .collect()
    } else {
        let code = a.code.unwrap_or_default();
        let Some(c) = Code::from_id(&code) else {
            return usage(&format!(
                "no diagnostic code `{code}`; `estc explain --list` lists them"
            ));
        };
        let info = c.info();
        format!(
            "{} ({}): {}\n\n{}\n",
            info.id,
            info.severity.name(),
            info.title,
            info.explanation
        )
    };
    match print_result(&text) {
        Ok(()) => 0,
        Err(code) => code,
    }
}
