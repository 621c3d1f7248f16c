//! `estc export`: the predict graph with a checkpoint's weights, for serving without
//! est: an ONNX model (`--format onnx`, checked with onnxruntime by `--verify`) or the
//! host backend's native library (`--format native`).

use super::{load_with_run, log, print_diags, print_result, MessageFormat, OutputArgs};
use super::{ProgramArgs, RunTarget};
use clap::{Parser, ValueEnum};
use est::export::{onnx, verify};
use est::ir::TensorType;
use est::runtime::{Estimator, ExportFormat, ExportOptions, RunOptions};
use std::path::PathBuf;

#[derive(Parser)]
pub struct ExportArgs {
    #[command(flatten)]
    program: ProgramArgs,
    /// The estimator to export (needed when the program has several).
    #[arg(long)]
    estimator: Option<String>,
    /// Overrides the estimator's model_dir (whose newest checkpoint is exported).
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// Export this checkpoint (`ckpt-N.safetensors`, or a directory of checkpoints)
    /// instead of the newest of model_dir.
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// `onnx`: one file whose batch size is symbolic; `native`: a directory with the
    /// shared library, its C header and the checkpoint's weights.
    #[arg(long, value_enum, default_value_t = Format::Onnx)]
    format: Format,
    /// The file (onnx) or directory (native) to write.
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Run the exported ONNX model with onnxruntime on the eval input's first batches
    /// (at the model's batch size and a smaller one) and compare it with est's
    /// predictions (Python from EST_PYTHON, else bench/.venv, else python3).
    #[arg(long)]
    verify: bool,
    /// The batches `--verify` runs.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    verify_batches: u64,
    /// Where est computes the predictions `--verify` compares with.
    #[arg(long, value_enum, default_value_t = RunTarget::default())]
    target: RunTarget,
    /// Generate the native library's code for this CPU (an LLVM CPU name).
    #[arg(long)]
    cpu: Option<String>,
    #[command(flatten)]
    out: OutputArgs,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Format {
    Onnx,
    Native,
}

pub fn export(a: ExportArgs) -> i32 {
    let (program, config, run) = match load_with_run(&a.program) {
        Ok(x) => x,
        Err(code) => return code,
    };
    if a.verify && a.format == Format::Native {
        return super::usage(
            "--verify runs an ONNX model with onnxruntime: use it with --format onnx",
        );
    }
    if a.target == RunTarget::Wafer {
        return super::usage(
            "export's predictions run on the host or the interpreter: leave out --target wafer",
        );
    }
    let opts = RunOptions {
        estimator: a.estimator.clone(),
        target: a.target.target(),
        config,
        model_dir: a.model_dir.clone().or(run.model_dir),
        memory_limit: a.program.memory_limit,
        ..RunOptions::default()
    };
    let json = a.out.message_format == MessageFormat::Json;
    let fmt = a.out.message_format;
    let mut est = match Estimator::new(&program, &opts) {
        Ok(e) => e,
        Err(f) => return print_diags(&program, &f.diags, fmt, a.out.color),
    };
    if !json {
        est.log = Some(Box::new(|s: &str| log(s)));
    }
    let eo = ExportOptions {
        format: match a.format {
            Format::Onnx => ExportFormat::Onnx,
            Format::Native => ExportFormat::Native,
        },
        out: a.output.clone(),
        checkpoint: a.checkpoint.clone(),
        cpu: a.cpu.clone(),
    };
    let r = match est.export(&eo) {
        Ok(r) => r,
        Err(f) => return print_diags(&program, &f.diags, fmt, a.out.color).max(1),
    };
    let verified = if a.verify {
        let samples = match est.predict_samples(a.verify_batches) {
            Ok(s) => s,
            Err(f) => return print_diags(&program, &f.diags, fmt, a.out.color).max(1),
        };
        match verify::verify(&a.output, &samples, est.info.span) {
            Ok(v) => Some(v),
            Err(d) => {
                let written = format!("wrote {} (not verified)", a.output.display());
                log(&written);
                return print_diags(&program, &[d], fmt, a.out.color).max(1);
            }
        }
    } else {
        None
    };
    let sig = |ports: &[(String, TensorType)]| -> String {
        ports
            .iter()
            .map(|(n, t)| {
                let dims: Vec<String> = t
                    .shape
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        if i == 0 && a.format == Format::Onnx {
                            onnx::BATCH.to_string()
                        } else {
                            d.to_string()
                        }
                    })
                    .collect();
                format!("{n} {}[{}]", t.dtype, dims.join(", "))
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let text = if json {
        let v = serde_json::json!({
            "format": match a.format { Format::Onnx => "onnx", Format::Native => "native" },
            "files": r.files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "checkpoint": r.checkpoint.display().to_string(),
            "global_step": r.global_step,
            "inputs": sig(&r.inputs),
            "outputs": sig(&r.outputs),
            "verify": verified.as_ref().map(|v| serde_json::json!({
                "onnxruntime": v.onnxruntime,
                "batch_sizes": v.batch_sizes,
                "largest_difference": v.worst(),
                "outputs": v.outputs.iter().map(|o| serde_json::json!({"name": o.0, "max_abs": o.1, "max_rel": o.2})).collect::<Vec<_>>(),
            })),
        });
        format!("{v}\n")
    } else {
        let mut t = format!(
            "exported {} at global step {} ({})\n  inputs:  {}\n  outputs: {}\n",
            est.info.name,
            r.global_step,
            r.checkpoint.display(),
            sig(&r.inputs),
            sig(&r.outputs)
        );
        if a.format == Format::Onnx {
            t.push_str(&format!(
                "wrote {} (ONNX IR version {}, opset {}, {} nodes)\n",
                a.output.display(),
                onnx::IR_VERSION,
                onnx::OPSET,
                r.nodes
            ));
        } else {
            for f in &r.files {
                t.push_str(&format!("wrote {}\n", f.display()));
            }
        }
        if let Some(v) = &verified {
            let sizes: Vec<String> = v.batch_sizes.iter().map(|s| s.to_string()).collect();
            let worst = v
                .outputs
                .iter()
                .max_by(|x, y| x.2.total_cmp(&y.2))
                .map_or(String::new(), |o| {
                    format!(" (`{}`, {:.2e} absolute)", o.0, o.1)
                });
            t.push_str(&format!(
                "verified with onnxruntime {} at batch sizes {}: largest difference from est {:.2e} relative{worst}, within {:e}\n",
                v.onnxruntime,
                sizes.join(" and "),
                v.worst(),
                verify::TOLERANCE
            ));
        }
        t
    };
    match print_result(&text) {
        Ok(()) => 0,
        Err(code) => code,
    }
}
