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
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let stem = name
            .strip_suffix(".safetensors")
            .or_else(|| name.strip_suffix(".json"))
            .unwrap_or(&name);
        let step = stem
            .strip_prefix("ckpt-")
            .and_then(|s| s.parse::<i64>().ok());
        let Some(step) = step else {
            return Err(Diag::new(
                Code::NoCheckpoint,
                self.info.span,
                format!("{} is not an est checkpoint", path.display()),
            )
            .label("this estimator")
            .help("name a checkpoint's `ckpt-N.safetensors` (or its directory), as a training run writes them")
            .into());
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let found = checkpoint::Found {
            step,
            tensors: checkpoint::tensors_path(dir, step),
            meta: checkpoint::meta_path(dir, step),
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
    /// (or `opts.checkpoint`).
    pub fn export(&mut self, opts: &ExportOptions) -> Res<ExportReport> {
        let c = self
            .compiled(SectionKind::Predict)
            .cloned()
            .ok_or_else(|| {
                Diag::new(
                    Code::Export,
                    self.info.span,
                    "the model has no predict graph to export",
                )
                .label("this estimator's model")
                .help("add `predict { name = value }` to the model, one line per prediction")
            })?;
        match &opts.checkpoint {
            Some(p) => self.restore_from(p)?,
            None => self.prepare(Need::Checkpoint)?,
        }
        let checkpoint = self.last_checkpoint.clone().unwrap_or_default();
        let at = self.info.span;
        let fail = |m: String| -> Diag { Diag::new(Code::RunIo, at, m).label("this estimator") };
        match opts.format {
            ExportFormat::Onnx => {
                let meta = onnx::Meta {
                    estimator: self.info.name.clone(),
                    program_hash: self.program_hash.clone(),
                    global_step: self.step,
                };
                let e = onnx::export(&c.graph, &self.variables(), &meta, at)?;
                if let Some(d) = opts.out.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(d)
                        .map_err(|e| fail(format!("cannot create {}: {e}", d.display())))?;
                }
                checkpoint::write_atomic(&opts.out, &e.bytes)
                    .map_err(|err| fail(format!("cannot write {}: {err}", opts.out.display())))?;
                Ok(ExportReport {
                    files: vec![opts.out.clone()],
                    checkpoint,
                    global_step: self.step,
                    inputs: e.inputs,
                    outputs: e.outputs,
                    nodes: e.nodes,
                })
            }
            ExportFormat::Native => {
                let mut files = native_library(&c.graph, at, opts, &self.info.name)?;
                let weights = opts.out.join(format!("{}.safetensors", self.info.name));
                std::fs::copy(&checkpoint, &weights).map_err(|e| {
                    fail(format!(
                        "cannot copy {} to {}: {e}",
                        checkpoint.display(),
                        weights.display()
                    ))
                })?;
                files.push(weights);
                let g = &c.graph;
                let ports = |role: Role| -> Vec<(String, TensorType)> {
                    g.outputs_with(role)
                        .into_iter()
                        .map(|(n, x)| (n, g.ty(x).clone()))
                        .collect()
                };
                let inputs = super::evaluate::input_names(g)
                    .into_iter()
                    .filter_map(|n| g.input(&n).map(|x| (n, g.ty(x).clone())))
                    .collect();
                Ok(ExportReport {
                    files,
                    checkpoint,
                    global_step: self.step,
                    inputs,
                    outputs: ports(Role::Prediction),
                    nodes: 0,
                })
            }
        }
    }

    /// The first `batches` batches of the eval input (the predict input when there is
    /// no eval input) through the predict graph, as `estc predict` computes them: what
    /// `estc export --verify` compares an exported model with.
    pub fn predict_samples(&mut self, batches: u64) -> Res<Vec<Sample>> {
        let (c, _) = self.input(SectionKind::Predict)?;
        let ds = match self.input(SectionKind::Eval) {
            Ok((_, ds)) => ds,
            Err(_) => self.input(SectionKind::Predict)?.1,
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

#[cfg(feature = "llvm")]
fn native_library(
    g: &crate::ir::Graph,
    at: crate::span::Span,
    opts: &ExportOptions,
    name: &str,
) -> Result<Vec<PathBuf>, Diag> {
    crate::backend::host::library(g, at, opts.cpu.as_deref(), name, &opts.out).map(|l| l.files)
}

#[cfg(not(feature = "llvm"))]
fn native_library(
    _: &crate::ir::Graph,
    at: crate::span::Span,
    _: &ExportOptions,
    _: &str,
) -> Result<Vec<PathBuf>, Diag> {
    crate::backend::open(crate::elab::Target::Host, at, 1).map(|_| Vec::new())
}
