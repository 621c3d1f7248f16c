//! `estc export --verify`: the exported model run by onnxruntime (in Python, with
//! `verify.py`) on batches est has predicted, at the model's batch size and a smaller
//! one, after `onnx.checker`'s full check. Differences beyond `TOLERANCE` (relative to
//! an output's largest magnitude) are E0923.

use crate::data::records::npy_bytes;
use crate::diag::{Code, Diag};
use crate::runtime::Sample;
use crate::span::Span;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The largest difference from est's predictions an exported model may show, relative
/// to each output's largest magnitude (as the native library's tests use).
pub const TOLERANCE: f64 = 1e-5;

const SCRIPT: &str = include_str!("verify.py");

/// The pinned Python packages the verification needs (`bench/requirements-test.txt`,
/// which `scripts/setup.sh` installs), as pip's arguments.
pub fn requirements() -> String {
    include_str!("../../bench/requirements-test.txt")
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty() && !l.starts_with("numpy"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What `verify.py` prints: `missing` or `refused` when it could not verify, else the
/// rest (maps sort by name).
#[derive(Deserialize)]
struct Report {
    missing: Option<String>,
    refused: Option<String>,
    #[serde(default)]
    onnxruntime: String,
    #[serde(default)]
    batch_sizes: Vec<usize>,
    #[serde(default)]
    outputs: BTreeMap<String, Difference>,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    shapes: BTreeMap<String, Vec<serde_json::Value>>,
}

#[derive(Deserialize)]
struct Difference {
    max_abs: f64,
    max_rel: f64,
    /// The batch sizes the output was compared at.
    #[serde(default)]
    sizes: Vec<usize>,
}

/// How long the verifier may take before it counts as hung (`EST_VERIFY_TIMEOUT`
/// seconds, default 300): importing onnxruntime and running a model take seconds.
fn timeout() -> std::time::Duration {
    let secs = std::env::var("EST_VERIFY_TIMEOUT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(300);
    std::time::Duration::from_secs(secs)
}

/// Runs `cmd` to its end, its output gathered, or kills it after `limit` (`None`).
fn output_within(
    mut cmd: Command,
    limit: std::time::Duration,
) -> std::io::Result<Option<std::process::Output>> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    // (a group of its own, so that whatever it started goes with it)
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if start.elapsed() >= limit {
            // SAFETY: kill(2) of the process group this function started.
            unsafe {
                libc::kill(-(child.id() as i32), libc::SIGKILL);
            }
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Ok(Some(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }))
}

/// What onnxruntime computed against est.
#[derive(Debug, Clone)]
pub struct Verified {
    pub python: PathBuf,
    pub onnxruntime: String,
    /// The batch sizes the model ran at.
    pub batch_sizes: Vec<usize>,
    /// Per output: the largest absolute and relative difference from est's.
    pub outputs: Vec<(String, f64, f64)>,
    /// The model's `metadata_props`, as onnx reads them.
    pub metadata: Vec<(String, String)>,
    /// The shape of each graph input and output as onnx reads it: a size, or the
    /// name of a symbolic dimension.
    pub shapes: Vec<(String, Vec<String>)>,
}

impl Verified {
    /// The largest relative difference over every output.
    pub fn worst(&self) -> f64 {
        self.outputs.iter().map(|o| o.2).fold(0.0, f64::max)
    }
}

/// The Python that runs onnxruntime: `EST_PYTHON`, else `bench/.venv/bin/python` in
/// the working directory or one above it (the repository's bench virtualenv), else
/// `python3`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("EST_PYTHON") {
        return PathBuf::from(p);
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors() {
            let p = dir.join("bench/.venv/bin/python");
            if p.is_file() {
                return p;
            }
        }
    }
    PathBuf::from("python3")
}

/// E0923 at `at`.
fn fail(at: Span, m: String, help: &str) -> Diag {
    Diag::new(Code::ExportVerify, at, m)
        .label("this estimator")
        .help(help.to_string())
}

/// Runs `model` on `samples` with onnxruntime (in the Python of `python()`) and
/// compares with est's predictions.
pub fn verify(model: &Path, samples: &[Sample], at: Span) -> Result<Verified, Diag> {
    verify_with(&python(), model, samples, at)
}

/// `verify` with a given Python.
pub fn verify_with(
    python: &Path,
    model: &Path,
    samples: &[Sample],
    at: Span,
) -> Result<Verified, Diag> {
    verify_within(python, model, samples, at, timeout())
}

/// `verify_with`, the verifier given `limit` to answer in.
pub fn verify_within(
    python: &Path,
    model: &Path,
    samples: &[Sample],
    at: Span,
    limit: std::time::Duration,
) -> Result<Verified, Diag> {
    if samples.is_empty() {
        return Err(fail(
            at,
            "the eval input gave no batch to verify the model with: it was written but not verified".into(),
            "give the estimator an eval (or predict) input that yields a batch, or leave out --verify",
        ));
    }
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = std::env::temp_dir().join(format!("est-verify-{}-{stamp}", std::process::id()));
    let result = std::fs::create_dir_all(&dir)
        .map_err(|e| io(at, e))
        .and_then(|()| run(python, model, samples, &dir, at, limit));
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn io(at: Span, e: std::io::Error) -> Diag {
    fail(
        at,
        format!("cannot write the verification's files: {e}"),
        "make the temporary directory writable (TMPDIR)",
    )
}

fn run(
    python: &Path,
    model: &Path,
    samples: &[Sample],
    dir: &Path,
    at: Span,
    limit: std::time::Duration,
) -> Result<Verified, Diag> {
    let io = |e| io(at, e);
    let fail = |m: String, help: &str| fail(at, m, help);
    let mut list = Vec::new();
    for (i, s) in samples.iter().enumerate() {
        let files = |kind: &str, ts: &[(String, crate::tensor::Tensor)]| {
            let mut out = Vec::new();
            for (k, (name, t)) in ts.iter().enumerate() {
                let p = dir.join(format!("{kind}_{i}_{k}.npy"));
                std::fs::write(&p, npy_bytes(t))?;
                out.push(serde_json::json!([name, p.display().to_string()]));
            }
            Ok::<_, std::io::Error>(out)
        };
        let inputs = files("in", &s.inputs).map_err(io)?;
        let outputs = files("out", &s.outputs).map_err(io)?;
        list.push(serde_json::json!({"inputs": inputs, "outputs": outputs}));
    }
    let model = std::fs::canonicalize(model).unwrap_or_else(|_| model.to_path_buf());
    let manifest = serde_json::json!({"model": model.display().to_string(), "samples": list});
    let mpath = dir.join("manifest.json");
    std::fs::write(&mpath, manifest.to_string()).map_err(io)?;
    let spath = dir.join("verify.py");
    std::fs::write(&spath, SCRIPT).map_err(io)?;
    let python = python.to_path_buf();
    let pins = requirements();
    let mut cmd = Command::new(&python);
    cmd.arg(&spath).arg(&mpath);
    let out = output_within(cmd, limit).map_err(|e| {
        fail(
            format!("cannot run {} to verify the model: {e}", python.display()),
            &format!("install onnxruntime for a Python (`pip install {pins}`) and name it with EST_PYTHON, or leave out --verify"),
        )
    })?;
    let Some(out) = out else {
        return Err(fail(
            format!(
                "{} did not finish verifying the model within {} s: the model was written but not verified",
                python.display(),
                limit.as_secs()
            ),
            "run it again with a working Python (EST_PYTHON), or give it longer with EST_VERIFY_TIMEOUT=SECONDS",
        ));
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Report = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| {
            fail(
                format!(
                    "{} failed to verify the model: {}",
                    python.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
                "run the verification again with a working Python (EST_PYTHON); this is a problem of est or of that Python",
            )
        })?;
    if let Some(m) = report.missing {
        return Err(fail(
            format!(
                "onnxruntime is not available to {} ({m}): the model was written but not verified",
                python.display()
            ),
            &format!("install it: `bench/.venv/bin/pip install {pins}` (scripts/setup.sh makes that virtualenv), or name a Python that has it with EST_PYTHON"),
        ));
    }
    if let Some(m) = report.refused {
        return Err(fail(
            format!("the exported model was refused: {m}"),
            "the export wrote a model onnx or onnxruntime cannot run: report it with the program",
        ));
    }
    // every prediction compared at two batch sizes, or the answer proves nothing
    let wanted = samples.first().map(|s| &s.outputs[..]).unwrap_or_default();
    for (name, _) in wanted {
        let sizes = report.outputs.get(name).map_or(0, |d| d.sizes.len());
        if sizes < 2 {
            return Err(fail(
                format!(
                    "{}'s answer compared `{name}` at {sizes} batch size{} (two are needed): the model was written but not verified",
                    python.display(),
                    if sizes == 1 { "" } else { "s" }
                ),
                "run the verification again with a working Python (EST_PYTHON); this is a problem of est or of that Python",
            ));
        }
    }
    let dim = |d: serde_json::Value| d.as_str().map_or_else(|| d.to_string(), str::to_string);
    let verified = Verified {
        python,
        onnxruntime: report.onnxruntime,
        batch_sizes: report.batch_sizes,
        outputs: (report.outputs.into_iter())
            .map(|(k, d)| (k, d.max_abs, d.max_rel))
            .collect(),
        metadata: report.metadata.into_iter().collect(),
        shapes: (report.shapes.into_iter())
            .map(|(k, dims)| (k, dims.into_iter().map(dim).collect()))
            .collect(),
    };
    if let Some(bad) = verified
        .outputs
        .iter()
        .find(|o| o.2.is_nan() || o.2 > TOLERANCE)
    {
        return Err(fail(
            format!(
                "the exported model's `{}` differs from est's by {:.3e} ({:.3e} relative; the tolerance is {TOLERANCE:e})",
                bad.0, bad.1, bad.2
            ),
            "onnxruntime computes the exported model differently from est: report it with the program",
        ));
    }
    Ok(verified)
}
