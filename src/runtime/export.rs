//! Export for serving (`estc export`, `Estimator::export`): the predict graph with the
//! weights of a checkpoint, as an ONNX model (`crate::export::onnx`) or as the host
//! backend's native library with the checkpoint beside it. The checkpoint is checked
//! against the program as `eval` checks it (E0901).

use super::evaluate::{first_rows, Feeder};
use super::{checkpoint, restore::Need, Estimator, Res};
use crate::diag::{Code, Diag};
use crate::export::onnx;
use crate::ir::{Role, TensorType};
use crate::syntax::ast::SectionKind;
use crate::tensor::Tensor;
use std::path::{Path, PathBuf};

/// What `export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportFormat {
    /// One `.onnx` file, its batch size symbolic.
    Onnx,
    /// A directory: the native library, its C header and the checkpoint's tensors.
    Native,
}

#[derive(Debug, Clone)]
pub struct ExportOptions {
    pub format: ExportFormat,
    /// The file (ONNX) or directory (native) to write.
    pub out: PathBuf,
    /// The checkpoint to export (a `ckpt-N.safetensors`, its `.json`, or a directory
    /// of checkpoints); `None`: the newest of `model_dir`.
    pub checkpoint: Option<PathBuf>,
    /// The CPU the native library's code is generated for (`None`: this one).
    pub cpu: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ExportReport {
    pub files: Vec<PathBuf>,
    /// The checkpoint's tensors file and global step.
    pub checkpoint: PathBuf,
    pub global_step: i64,
    /// The model's inputs and outputs, at the graph's static batch size.
    pub inputs: Vec<(String, TensorType)>,
    pub outputs: Vec<(String, TensorType)>,
    /// ONNX nodes written (0 for the native library).
    pub nodes: usize,
}

/// One batch of the eval input through est's predict graph: the model's inputs (its
/// real rows) and its predictions, by name.
#[derive(Debug, Clone)]
pub struct Sample {
    pub inputs: Vec<(String, Tensor)>,
    pub outputs: Vec<(String, Tensor)>,
}

impl Estimator {
    /// Restores the checkpoint `path` names (`ckpt-N.safetensors`, `ckpt-N.json`,
    /// `ckpt-N`, or a directory, whose newest one it is), checked against the program
    /// as `eval` checks `model_dir`'s (E0901).
    pub fn restore_from(&mut self, path: &Path) -> Res<()> {
        if path.is_dir() {
            let mut dir = path.to_path_buf();
            std::mem::swap(&mut self.model_dir, &mut dir);
            self.ready = false;
            let r = self.prepare(Need::Checkpoint);
            std::mem::swap(&mut self.model_dir, &mut dir);
            return r;
        }
        let Some(found) = checkpoint::named(path) else {
            return Err(Diag::new(
                Code::NoCheckpoint,
                self.info.span,
                format!("{} is not an est checkpoint", path.display()),
            )
            .label("this estimator")
            .help("name a checkpoint's `ckpt-N.safetensors` (or its directory), as a training run writes them")
            .into());
        };
        let (meta, vars) = checkpoint::load(&found).map_err(|e| {
            let why = match e {
                checkpoint::LoadError::Io(m) | checkpoint::LoadError::Damaged(m) => m,
                checkpoint::LoadError::Gone => format!("{} does not exist", found.meta.display()),
            };
            Diag::new(
                Code::NoCheckpoint,
                self.info.span,
                format!("cannot use the checkpoint {}: {why}", path.display()),
            )
            .label("this estimator")
            .help("name an intact checkpoint of a training run of this program")
        })?;
        self.dev()?;
        self.restored(checkpoint::Restored {
            found,
            meta,
            vars,
            damaged: Vec::new(),
        })?;
        self.ready = true;
        Ok(())
    }

    /// Writes the predict graph for serving, with the weights of the newest checkpoint
    /// (or `opts.checkpoint`). Nothing is written when it fails.
    pub fn export(&mut self, opts: &ExportOptions) -> Res<ExportReport> {
        let at = self.info.span;
        let c = self
            .compiled(SectionKind::Predict)
            .cloned()
            .ok_or_else(|| {
                Diag::new(
                    Code::InvalidModel,
                    at,
                    "the model has no predict graph to export",
                )
                .label("this estimator's model")
                .help("add `predict { name = value }` to the model, one line per prediction")
            })?;
        match &opts.checkpoint {
            Some(p) => self.restore_from(p)?,
            None => self.prepare(Need::Checkpoint)?,
        }
        let Some(checkpoint) = self.last_checkpoint.clone() else {
            return Err(Diag::new(
                Code::NoCheckpoint,
                at,
                "the variables were initialised, not restored from a checkpoint",
            )
            .label("this estimator")
            .help("export a trained model: train first, or save a checkpoint (`save_checkpoint`)")
            .into());
        };
        let g = &c.graph;
        let (files, inputs, outputs, nodes) = match opts.format {
            ExportFormat::Onnx => {
                let meta = onnx::Meta {
                    estimator: self.info.name.clone(),
                    program_hash: self.program_hash.clone(),
                    global_step: self.step,
                };
                let e = onnx::export(g, &self.variables(), &meta, at)?;
                if let Some(d) = opts.out.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(d).map_err(|e| {
                        write_failed(at, format!("cannot create {}: {e}", d.display()))
                    })?;
                }
                crate::atomic::write_output_bytes(&opts.out, &e.bytes).map_err(|err| {
                    write_failed(at, format!("cannot write {}: {err}", opts.out.display()))
                })?;
                (vec![opts.out.clone()], e.inputs, e.outputs, e.nodes)
            }
            ExportFormat::Native => {
                // Built in a directory of its own inside the output and moved in once
                // whole, so that a failed export leaves nothing behind.
                if opts.out.exists() && !opts.out.is_dir() {
                    return Err(Diag::new(
                        Code::RunIo,
                        at,
                        format!(
                            "{} is a file, and --format native writes a directory (the header, the library and its weights)",
                            opts.out.display()
                        ),
                    )
                    .label("this estimator")
                    .help("give -o a directory, new or existing (`-o served/`), or export ONNX into a file with --format onnx")
                    .into());
                }
                let fresh = !opts.out.exists();
                let staging = staging_dir(&opts.out);
                let built = native(g, at, opts, &self.info.name, &staging, &checkpoint);
                let _ = std::fs::remove_dir_all(&staging);
                if built.is_err() && fresh {
                    let _ = std::fs::remove_dir_all(&opts.out);
                }
                let inputs = super::evaluate::input_names(g)
                    .into_iter()
                    .filter_map(|n| g.input(&n).map(|x| (n, g.ty(x).clone())))
                    .collect();
                let outputs = g
                    .outputs_with(Role::Prediction)
                    .into_iter()
                    .map(|(n, x)| (n, g.ty(x).clone()))
                    .collect();
                (built?, inputs, outputs, 0)
            }
        };
        Ok(ExportReport {
            files,
            checkpoint,
            global_step: self.step,
            inputs,
            outputs,
            nodes,
        })
    }

    /// The first `batches` batches of the eval input (the predict input when there is
    /// no eval input, or its features have other types than the predict graph's) through the predict graph, as `estc predict` computes them: what
    /// `estc export --verify` compares an exported model with.
    pub fn predict_samples(&mut self, batches: u64) -> Res<Vec<Sample>> {
        let (c, own) = self.input(SectionKind::Predict)?;
        let ds = match self.input(SectionKind::Eval) {
            Ok((e, ds)) if same_features(&c.graph, &e.graph) => ds,
            _ => own,
        };
        self.prepare(Need::Checkpoint)?;
        let g = &c.graph;
        let feeder = Feeder::new(g, ds.span());
        let names = feeder.names().to_vec();
        let outs = g.outputs_with(Role::Prediction);
        let targets: Vec<_> = outs.iter().map(|o| o.1).collect();
        let exe = self.run_exe(&c, SectionKind::Predict, &targets)?;
        let mut pipe = self.start_pipeline(&ds, SectionKind::Eval)?;
        let mut samples = Vec::new();
        while (samples.len() as u64) < batches {
            let Some(mut batch) = pipe.next_element()? else {
                break;
            };
            batch.truncate(names.len());
            let inputs: Vec<(String, Tensor)> = names.iter().cloned().zip(batch.clone()).collect();
            let when = format!("in batch {} of the samples", samples.len() + 1);
            let (values, real) = self.run_fed(exe, &feeder, batch, 0, &when)?;
            let outputs = outs
                .iter()
                .zip(values)
                .map(|((n, _), t)| (n.clone(), first_rows(&t, real)))
                .collect();
            samples.push(Sample { inputs, outputs });
        }
        Ok(samples)
    }
}

/// E0904 for an export that cannot be written.
fn write_failed(at: crate::span::Span, m: String) -> Diag {
    Diag::new(Code::RunIo, at, m)
        .label("this estimator")
        .help("make the output's directory writable, or write elsewhere with -o")
}

/// Whether the eval graph's model inputs have the predict graph's types (so that the
/// eval input's batches can feed predict).
fn same_features(predict: &crate::ir::Graph, eval: &crate::ir::Graph) -> bool {
    super::evaluate::input_names(predict)
        .iter()
        .all(|n| match (predict.input(n), eval.input(n)) {
            (Some(p), Some(e)) => predict.ty(p) == eval.ty(e),
            (None, _) => true,
            (Some(_), None) => false,
        })
}

/// A fresh directory inside `out` to build an export in (on `out`'s filesystem, so that
/// its files move in by renaming; unique per export).
fn staging_dir(out: &Path) -> PathBuf {
    static EXPORTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let k = EXPORTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    out.join(format!(".est-export-{}-{k}", std::process::id()))
}

/// Builds the native library and copies `checkpoint` beside it (as
/// `<library id>.safetensors`, with its metadata as `<library id>.json`) in `staging`,
/// then moves every file into `opts.out`.
fn native(
    g: &crate::ir::Graph,
    at: crate::span::Span,
    opts: &ExportOptions,
    name: &str,
    staging: &Path,
    checkpoint: &Path,
) -> Result<Vec<PathBuf>, Diag> {
    let mut files = native_library(g, at, opts, name, staging)?;
    let id = files
        .iter()
        .find(|f| f.extension().is_some_and(|e| e == "h"))
        .and_then(|f| f.file_stem())
        .map_or_else(|| name.to_string(), |s| s.to_string_lossy().into_owned());
    // the weights, and their metadata with the checksums the library's loader checks
    // (a checkpoint of an est that wrote none could never be loaded: refused here)
    let meta: Option<checkpoint::Meta> = std::fs::read(checkpoint.with_extension("json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    if meta.is_none_or(|m| m.unverified()) {
        return Err(write_failed(
            at,
            format!(
                "{} has no checksums beside it for the library's loader to check",
                checkpoint.display()
            ),
        )
        .help("save the checkpoint again with this est (train one more step), then export it"));
    }
    for (from, to) in [
        (
            checkpoint.to_path_buf(),
            staging.join(format!("{id}.safetensors")),
        ),
        (
            checkpoint.with_extension("json"),
            staging.join(format!("{id}.json")),
        ),
    ] {
        std::fs::copy(&from, &to).map_err(|e| {
            let m = format!("cannot copy {} to {}: {e}", from.display(), to.display());
            write_failed(at, m)
        })?;
        files.push(to);
    }
    let mut moved = Vec::with_capacity(files.len());
    for f in &files {
        let to = opts.out.join(f.file_name().unwrap_or_default());
        move_out(f, &to).map_err(|e| {
            write_failed(
                at,
                format!("cannot move {} to {}: {e}", f.display(), to.display()),
            )
        })?;
        moved.push(to);
    }
    Ok(moved)
}

/// Moves a staged file to the output `to` names (see `atomic::output`): renamed onto a
/// regular file (or where none is), copied when a link leads it to another file
/// system, written through a device or FIFO.
fn move_out(f: &Path, to: &Path) -> std::io::Result<()> {
    let copy = |to: &Path| {
        let mut from = std::fs::File::open(f)?;
        crate::atomic::write_output(to, |w| std::io::copy(&mut from, w).map(|_| ()))
    };
    match crate::atomic::output(to)? {
        crate::atomic::Output::File(p) => match std::fs::rename(f, &p) {
            Err(e) if e.raw_os_error() == Some(libc::EXDEV) => copy(&p),
            r => r,
        },
        crate::atomic::Output::Stream(p) => copy(&p),
    }
}

#[cfg(feature = "llvm")]
fn native_library(
    g: &crate::ir::Graph,
    at: crate::span::Span,
    opts: &ExportOptions,
    name: &str,
    dir: &Path,
) -> Result<Vec<PathBuf>, Diag> {
    crate::backend::host::library(g, at, opts.cpu.as_deref(), name, dir).map(|l| l.files)
}

#[cfg(not(feature = "llvm"))]
fn native_library(
    _: &crate::ir::Graph,
    at: crate::span::Span,
    _: &ExportOptions,
    _: &str,
    _: &Path,
) -> Result<Vec<PathBuf>, Diag> {
    let unbuilt = Diag::new(
        Code::NoRuntime,
        at,
        "this estc was built without the host backend, which makes the native library",
    )
    .label("this estimator")
    .help("build est with the `llvm` feature (the default), or export ONNX with --format onnx");
    Err(crate::backend::open(crate::elab::Target::Host, at, 1)
        .err()
        .unwrap_or(unbuilt))
}
