//! `estc train`, `eval` and `predict`: the runtime behind a progress bar (on a terminal)
//! or plain log lines (otherwise), and a final summary.

use super::ranks::Ranks;
use super::{
    load, load_with_run, log, print_diags, print_result, InputArg, MessageFormat, PerfArgs, RunArgs,
};
use est::runtime::{Action, Estimator, RunHook, RunOptions, StepInfo, Steps};
use est::syntax::ast::SectionKind;
use std::io::{IsTerminal, Write};
use std::time::Instant;

pub fn run(mut a: RunArgs, mode: SectionKind) -> i32 {
    let mut ranks = match Ranks::start() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let (program, config, run) = match load_with_run(&a.program) {
        Ok(x) => x,
        Err(code) => return code,
    };
    // a params file's `runconfig:` stands where the command line says nothing
    if a.steps.is_none()
        && a.max_steps.is_none()
        && a.epochs.is_none()
        && mode == SectionKind::Train
    {
        a.max_steps = run.max_steps;
    }
    a.model_dir = a.model_dir.take().or(run.model_dir);
    let opts = RunOptions {
        estimator: a.estimator.clone(),
        target: a.target.target(),
        config,
        model_dir: a.model_dir.clone(),
        data_dir: None,
        cache_dir: None,
        memory_limit: a.program.memory_limit,
        threads: a.threads.map(usize::from),
        wafer: a.wafer.clone(),
        ranks: ranks.size() as u64,
    };
    let json = a.out.message_format == MessageFormat::Json;
    let mut est = match Estimator::new(&program, &opts) {
        Ok(e) => e,
        Err(f) => {
            // the other ranks, waiting for this one to join them, stop too; of ranks
            // that failed alike, the first says why
            let mut group = ranks.group();
            let says = match &mut group {
                Some(g) => {
                    let text: String = (f.diags.iter())
                        .map(|d| est::diag::render::to_json(d, &program.sources).to_string())
                        .collect();
                    est::runtime::join_failed(
                        g,
                        est::hash::fnv1a(est::hash::FNV_OFFSET, text.as_bytes()),
                    )
                }
                None => true,
            };
            let status = if says {
                print_diags(&program, &f.diags, a.out.message_format, a.out.color)
            } else {
                1
            };
            // (the job ends once every rank has said why)
            if let Some(g) = &mut group {
                est::runtime::end_failed(g);
            }
            return status.max(1);
        }
    };
    if ranks.size() > 1 {
        let joined = match ranks.group() {
            Some(g) => est.join(g),
            None => Err(est::diag::Diag::new(
                est::diag::Code::NoRuntime,
                est.info.span,
                format!(
                    "this estc was built without MPI, and was started as one of {} ranks",
                    ranks.size()
                ),
            )
            .label("this estimator")
            .help("every rank would train alone: rebuild with `cargo build --release --features mpi` (scripts/setup.sh installs Open MPI), or run one estc without mpirun")
            .into()),
        };
        if let Err(f) = joined {
            // every rank found the same (rank 0 says it); the job ends once it has
            if ranks.rank() == 0 {
                print_diags(&program, &f.diags, a.out.message_format, a.out.color);
            }
            est.finish(false);
            return 1;
        }
    }
    let chief = ranks.rank() == 0;
    // the other ranks' lines and results would repeat rank 0's
    est::diag::set_quiet(!chief);
    if !json && chief {
        // On a terminal a log line first clears the progress bar's line.
        let tty = std::io::stderr().is_terminal();
        est.log = Some(Box::new(move |s: &str| {
            if tty {
                log(&format!("\r\x1b[2K{s}"));
            } else {
                log(s);
            }
        }));
    }
    let result = if a.smoke {
        est.smoke().map(|lines| {
            let mut out: String = lines.iter().map(|l| format!("smoke: {l}\n")).collect();
            out.push_str("smoke: ok\n");
            out
        })
    } else {
        match mode {
            SectionKind::Train => train(&mut est, &a, json),
            SectionKind::Eval => eval(&mut est, &a, json),
            SectionKind::Predict => predict(&mut est, &a, json),
        }
    };
    // every rank ends the command together, or the job ends
    let together = est.finish(result.is_ok());
    let result = match (result, together) {
        (Ok(_), Some(false)) => {
            log("error: another rank of this job failed (its own message says why)");
            return 1;
        }
        (r, Some(_)) => r,
        (r, None) => {
            if let Err(f) = &r {
                print_diags(&program, &f.diags, a.out.message_format, a.out.color);
            }
            log("error: the ranks of this job fell out of step; ending the job");
            return ranks.abort(1);
        }
    };
    if !chief {
        return match result {
            Ok(_) => 0,
            Err(f) => print_diags(&program, &f.diags, a.out.message_format, a.out.color).max(1),
        };
    }
    // Warnings were logged as they happened; with JSON output they go to stderr as
    // JSON lines, so that stdout keeps the one result object.
    if json {
        let mut err = std::io::stderr().lock();
        for d in est.take_warnings() {
            let _ = writeln!(err, "{}", est::diag::render::to_json(&d, &program.sources));
        }
    }
    match result {
        Ok(out) => match print_result(&out) {
            Ok(()) => 0,
            Err(code) => code,
        },
        Err(f) => print_diags(&program, &f.diags, a.out.message_format, a.out.color).max(1),
    }
}

/// The result a command prints on stdout, or the run's failure.
type Res = Result<String, est::runtime::RunFailure>;

fn train(est: &mut Estimator, a: &RunArgs, json: bool) -> Res {
    let chief = est.chief();
    let steps = match (a.steps, a.max_steps, a.epochs) {
        (Some(n), _, _) => Steps::Add(n),
        (_, Some(n), _) => Steps::Max(n),
        (_, _, Some(e)) => {
            let (total, how) = est.epoch_steps(e)?;
            log(&format!("{how}: {total} steps"));
            Steps::Add(total)
        }
        _ => Steps::Default,
    };
    if !json && chief {
        let every = est.info.config.log_step_count_steps.max(1);
        est.add_observer(Box::new(Progress::new(every)));
    }
    let every = a
        .eval_every
        .or(est.info.eval_every.map(|e| e.max(1) as u64));
    let (r, evals) = match every {
        Some(n) => {
            let te = est.train_and_evaluate(steps, n)?;
            (te.train, te.evals)
        }
        None => (est.train(steps)?, Vec::new()),
    };
    let best = est.model_dir().join("best").join("best.json");
    let best: Option<serde_json::Value> = std::fs::read_to_string(&best)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .filter(|_| !evals.is_empty() && est.info.hooks.iter().any(|h| h.kind == "keep_best"));
    if json {
        let v = serde_json::json!({
            "global_step": r.global_step,
            "start_step": r.start_step,
            "loss": r.final_loss,
            "steps_per_sec": r.steps_per_sec,
            "seconds": r.seconds,
            "stopped_early": r.stopped_early,
            "checkpoint": r.checkpoint.as_ref().map(|p| p.display().to_string()),
            "ranks": est.rank().1,
            "allreduce_seconds": r.allreduce_seconds,
            "evaluations": evals.iter().map(|e| {
                let mut m = serde_json::Map::new();
                m.insert("global_step".into(), e.global_step.into());
                m.insert("loss".into(), e.loss.into());
                for (k, v) in &e.metrics {
                    m.insert(k.clone(), (*v).into());
                }
                serde_json::Value::Object(m)
            }).collect::<Vec<_>>(),
            "best": best,
        });
        return Ok(format!("{v}\n"));
    }
    if let Some(why) = &r.stopped_early {
        log(&format!("stopped early: {why}"));
    }
    let mut out = if r.global_step == r.start_step {
        format!(
            "nothing to do: global step {} is already at the last step\n",
            r.global_step
        )
    } else {
        format!(
            "trained {} steps (global step {} -> {}) in {:.1} s, {:.1} steps/sec; final loss {:.6}\n",
            r.global_step - r.start_step,
            r.start_step,
            r.global_step,
            r.seconds,
            r.steps_per_sec,
            r.final_loss
        )
    };
    let (_, ranks) = est.rank();
    if ranks > 1 {
        out.push_str(&format!(
            "on {ranks} ranks; the all-reduce (and waiting there for the slowest rank) took {:.2} s ({:.0}% of the time)\n",
            r.allreduce_seconds,
            100.0 * r.allreduce_seconds / r.seconds.max(1e-9)
        ));
    }
    if let Some(p) = &r.checkpoint {
        out.push_str(&format!("checkpoint: {}\n", p.display()));
    }
    if !evals.is_empty() {
        let n = evals.len();
        out.push_str(&format!(
            "evaluated {n} time{}\n",
            if n == 1 { "" } else { "s" }
        ));
    }
    if let Some(b) = best {
        out.push_str(&format!(
            "best: {} = {:.6} at global step {} ({})\n",
            b["metric"].as_str().unwrap_or("?"),
            b["value"].as_f64().unwrap_or(f64::NAN),
            b["global_step"],
            est.model_dir().join("best").display()
        ));
    }
    Ok(out)
}

/// `--epochs` counts train steps; evaluation and prediction read their input once.
fn no_epochs(est: &Estimator, a: &RunArgs, what: &str) -> Result<(), est::runtime::RunFailure> {
    match a.epochs {
        Some(_) => Err(est::diag::Diag::new(
            est::diag::Code::InvalidEstimator,
            est.info.span,
            format!("`--epochs` is for training; {what} reads its input once"),
        )
        .label("this estimator")
        .help(format!(
            "drop `--epochs`, or give `--steps N` to {what} N batches"
        ))
        .into()),
        None => Ok(()),
    }
}

fn eval(est: &mut Estimator, a: &RunArgs, json: bool) -> Res {
    no_epochs(est, a, "evaluation")?;
    let r = est.evaluate(a.steps)?;
    if json {
        let mut m = serde_json::Map::new();
        for (k, v) in &r.metrics {
            m.insert(k.clone(), serde_json::json!(v));
        }
        m.insert("loss".into(), serde_json::json!(r.loss));
        m.insert("global_step".into(), serde_json::json!(r.global_step));
        m.insert("steps".into(), serde_json::json!(r.steps));
        m.insert("examples".into(), serde_json::json!(r.examples));
        return Ok(format!("{}\n", serde_json::Value::Object(m)));
    }
    let mut out = format!(
        "eval at global step {} over {} batches ({} examples):\n",
        r.global_step, r.steps, r.examples
    );
    for (k, v) in &r.metrics {
        out.push_str(&format!("  {k} = {v:.4}\n"));
    }
    out.push_str(&format!("  loss = {:.6}\n", r.loss));
    Ok(out)
}

fn predict(est: &mut Estimator, a: &RunArgs, json: bool) -> Res {
    no_epochs(est, a, "prediction")?;
    let out = a
        .output
        .clone()
        .unwrap_or_else(|| est.model_dir.join("predictions"));
    let r = est.predict(&out, a.steps)?;
    if json {
        let files: Vec<String> = r.files.iter().map(|p| p.display().to_string()).collect();
        let v = serde_json::json!({"examples": r.examples, "files": files});
        return Ok(format!("{v}\n"));
    }
    let mut out = format!("{} predictions written:\n", r.examples);
    for f in &r.files {
        out.push_str(&format!("  {}\n", f.display()));
    }
    Ok(out)
}

/// The progress display: a bar redrawn in place on a terminal, a log line every
/// `every` steps otherwise.
struct Progress {
    every: i64,
    tty: bool,
    start: Instant,
    first: i64,
    last: i64,
    drawn: Instant,
}

impl Progress {
    fn new(every: i64) -> Progress {
        Progress {
            every,
            tty: std::io::stderr().is_terminal(),
            start: Instant::now(),
            first: 0,
            last: 0,
            drawn: Instant::now(),
        }
    }
}

impl RunHook for Progress {
    fn begin(&mut self, global_step: i64, last_step: i64) {
        self.first = global_step;
        self.last = last_step;
        self.start = Instant::now();
    }

    fn after_step(&mut self, i: &StepInfo) -> Action {
        let done = i.global_step - self.first;
        let total = (self.last - self.first).max(1);
        let secs = self.start.elapsed().as_secs_f64();
        let rate = done as f64 / secs.max(1e-9);
        let eta = (self.last - i.global_step) as f64 / rate.max(1e-9);
        if self.tty {
            if self.drawn.elapsed().as_millis() < 100 && i.global_step != self.last {
                return Action::Continue;
            }
            self.drawn = Instant::now();
            let width = 30usize;
            let filled = (width as i64 * done / total) as usize;
            let bar: String =
                "#".repeat(filled.min(width)) + &"-".repeat(width - filled.min(width));
            let mut e = std::io::stderr().lock();
            let _ = write!(
                e,
                "\r[{bar}] step {}/{} loss {:.4} {:.1} steps/s ETA {:.0}s   ",
                i.global_step, self.last, i.loss, rate, eta
            );
            if i.global_step == self.last {
                let _ = writeln!(e);
            }
        } else if i.global_step % self.every == 0 || i.global_step == self.last {
            log(&format!(
                "step {}/{}: loss = {:.6}, lr = {:.6}, {:.1} steps/sec, ETA {:.0} s",
                i.global_step, self.last, i.loss, i.learning_rate, rate, eta
            ));
        }
        Action::Continue
    }

    fn end(&mut self, _global_step: i64) {
        if self.tty {
            let _ = std::io::stderr().flush();
        }
    }
}

/// `estc perf-input`: the input pipeline alone, timed.
pub fn perf_input(a: PerfArgs) -> i32 {
    let (program, config) = match load(&a.program) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let opts = RunOptions {
        estimator: a.estimator.clone(),
        config,
        memory_limit: a.program.memory_limit,
        ..Default::default()
    };
    let est = match Estimator::new(&program, &opts) {
        Ok(e) => e,
        Err(f) => return print_diags(&program, &f.diags, a.out.message_format, a.out.color),
    };
    let mode = match a.input {
        InputArg::Train => SectionKind::Train,
        InputArg::Eval => SectionKind::Eval,
        InputArg::Predict => SectionKind::Predict,
    };
    let (mut pipe, names) = match est.input_pipeline(mode) {
        Ok(x) => x,
        Err(f) => return print_diags(&program, &f.diags, a.out.message_format, a.out.color),
    };
    // (features, labels) pairs are named as a model sees them
    let names: Vec<String> = if names == ["0", "1"] {
        vec!["features".into(), "labels".into()]
    } else {
        names
    };
    // `--time` is finite and at least 0 (clap checks); beyond Duration's range it is
    // for ever, which the input's end cuts short.
    let limit = std::time::Duration::try_from_secs_f64(a.time.unwrap_or(10.0))
        .unwrap_or(std::time::Duration::MAX);
    let start = Instant::now();
    let mut first: Option<f64> = None;
    let mut steps = 0u64;
    let mut shapes: Vec<String> = Vec::new();
    loop {
        if a.steps.is_some_and(|n| steps >= n) || (a.steps.is_none() && start.elapsed() >= limit) {
            break;
        }
        let batch = match pipe.next_element() {
            Ok(Some(b)) => b,
            Ok(None) => break,
            Err(d) => return print_diags(&program, &[d], a.out.message_format, a.out.color).max(1),
        };
        if first.is_none() {
            first = Some(start.elapsed().as_secs_f64());
            shapes = batch.iter().map(|t| t.ty().to_string()).collect();
        }
        if a.show.is_some_and(|n| steps < n) {
            let mut obj = serde_json::Map::new();
            for (k, t) in names.iter().zip(&batch) {
                obj.insert(k.clone(), t.to_json());
            }
            if let Err(code) = print_result(&format!("{}\n", serde_json::Value::Object(obj))) {
                return code;
            }
        }
        steps += 1;
    }
    let total = start.elapsed().as_secs_f64();
    let first_s = first.unwrap_or(0.0);
    let rate = steps as f64 / total.max(1e-9);
    let rest = if steps > 1 {
        (steps - 1) as f64 / (total - first_s).max(1e-9)
    } else {
        0.0
    };
    let workers = est.pipe_options(mode).workers;
    let skipped = pipe.skipped();
    let out = if a.out.message_format == MessageFormat::Json {
        let v = serde_json::json!({
            "steps": steps,
            "seconds": total,
            "steps_per_sec": rate,
            "steps_per_sec_per_worker": rate / workers as f64,
            "steps_per_sec_after_first": rest,
            "steps_per_sec_per_worker_after_first": rest / workers as f64,
            "skipped_records": skipped,
            "first_step_seconds": first_s,
            "workers": workers,
            "shapes": names.iter().cloned().zip(shapes.iter().map(|s| serde_json::json!(s))).collect::<serde_json::Map<String, serde_json::Value>>(),
        });
        format!("{v}\n")
    } else if a.show.is_none() {
        let mut out = format!("{steps} batches in {total:.3} s: {rate:.1} batches/sec ({:.1} per worker, {workers} worker{})\n", rate / workers as f64, if workers == 1 { "" } else { "s" });
        out.push_str(&format!(
            "without the first batch: {rest:.1} batches/sec ({:.1} per worker); the first took {:.3} s\n",
            rest / workers as f64,
            first_s
        ));
        if skipped > 0 {
            out.push_str(&format!(
                "skipped {skipped} damaged record(s) (skip_corrupt)\n"
            ));
        }
        for (n, s) in names.iter().zip(&shapes) {
            out.push_str(&format!("  {n}: {s}\n"));
        }
        out
    } else {
        String::new()
    };
    match print_result(&out) {
        Ok(()) => 0,
        Err(code) => code,
    }
}
