//! Checkpoints in `model_dir`: `ckpt-<step>.safetensors` (every variable, optimiser slots
//! included) and `ckpt-<step>.json` (global step, run seed, input position, program
//! hash). Each file is written atomically (a temporary file, fsync, rename, fsync of
//! the directory) and the metadata only after the tensors, so a checkpoint whose
//! metadata exists is complete, whenever the process was killed. `checkpoint.json`
//! lists the checkpoints for people and tools; the runtime trusts the files themselves.

use crate::interp::Tensor;
use crate::ir::{DType, TensorType};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub global_step: i64,
    /// The run seed: with the step, the whole state of the random streams.
    pub seed: u64,
    /// Elements the train input has produced (the resumed input skips them).
    pub input_position: u64,
    /// A hash of the program text the checkpoint was written by.
    pub program_hash: String,
    /// Variables and their types, as `name: f32[3, 4]`.
    pub variables: Vec<String>,
}

/// A checkpoint found in a model directory.
#[derive(Debug, Clone)]
pub struct Found {
    pub step: i64,
    pub tensors: PathBuf,
    pub meta: PathBuf,
}

pub fn tensors_path(dir: &Path, step: i64) -> PathBuf {
    dir.join(format!("ckpt-{step}.safetensors"))
}

pub fn meta_path(dir: &Path, step: i64) -> PathBuf {
    dir.join(format!("ckpt-{step}.json"))
}

/// Writes `bytes` to `path` atomically.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn st_dtype(d: DType) -> safetensors::Dtype {
    match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
        DType::I32 => safetensors::Dtype::I32,
        DType::U8 => safetensors::Dtype::U8,
        DType::Bool => safetensors::Dtype::BOOL,
        DType::I64 | DType::Bytes => safetensors::Dtype::I64,
    }
}

fn from_st_dtype(d: safetensors::Dtype) -> Option<DType> {
    Some(match d {
        safetensors::Dtype::F32 => DType::F32,
        safetensors::Dtype::F16 => DType::F16,
        safetensors::Dtype::BF16 => DType::BF16,
        safetensors::Dtype::I32 => DType::I32,
        safetensors::Dtype::U8 => DType::U8,
        safetensors::Dtype::BOOL => DType::Bool,
        safetensors::Dtype::I64 => DType::I64,
        _ => return None,
    })
}

/// The safetensors bytes of a set of variables.
pub fn encode(vars: &FxHashMap<String, Tensor>) -> Result<Vec<u8>, String> {
    let bytes: Vec<(String, Vec<u8>, Tensor)> = vars
        .iter()
        .map(|(k, t)| (k.clone(), t.to_le_bytes(), t.clone()))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes
        .iter()
        .map(|(k, b, t)| {
            safetensors::tensor::TensorView::new(st_dtype(t.dtype), t.shape().to_vec(), b)
                .map(|v| (k.clone(), v))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    safetensors::serialize(views, None).map_err(|e| e.to_string())
}

/// Reads variables back from safetensors bytes.
pub fn decode(bytes: &[u8]) -> Result<FxHashMap<String, Tensor>, String> {
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| e.to_string())?;
    let mut out = FxHashMap::default();
    for (name, v) in st.tensors() {
        let dtype =
            from_st_dtype(v.dtype()).ok_or_else(|| format!("`{name}` has an unsupported dtype"))?;
        let ty = TensorType::new(dtype, v.shape().to_vec());
        let t = Tensor::from_le_bytes(&ty, v.data())
            .ok_or_else(|| format!("`{name}` has the wrong size"))?;
        out.insert(name, t);
    }
    Ok(out)
}

/// Saves a checkpoint: tensors, then metadata, then the index; prunes to `keep`.
pub fn save(
    dir: &Path,
    vars: &FxHashMap<String, Tensor>,
    meta: &Meta,
    keep: usize,
) -> std::io::Result<PathBuf> {
    let bytes = encode(vars).map_err(std::io::Error::other)?;
    let tp = tensors_path(dir, meta.global_step);
    fault_injection(dir, meta.global_step, &bytes);
    write_atomic(&tp, &bytes)?;
    let m = serde_json::to_vec_pretty(meta).map_err(std::io::Error::other)?;
    write_atomic(&meta_path(dir, meta.global_step), &m)?;
    let mut all = list(dir);
    while all.len() > keep.max(1) {
        let old = all.remove(0);
        let _ = std::fs::remove_file(&old.meta);
        let _ = std::fs::remove_file(&old.tensors);
    }
    let index = serde_json::json!({
        "latest": meta.global_step,
        "all": all.iter().map(|c| c.step).collect::<Vec<_>>(),
    });
    write_atomic(&dir.join("checkpoint.json"), index.to_string().as_bytes())?;
    Ok(tp)
}

/// For the crash tests: `EST_FAULT=checkpoint-write:STEP` makes the process die in the
/// middle of writing that step's checkpoint (half a temporary file written, nothing
/// renamed), as a power cut or SIGKILL would leave it.
fn fault_injection(dir: &Path, step: i64, bytes: &[u8]) {
    if std::env::var("EST_FAULT").ok().as_deref() == Some(&format!("checkpoint-write:{step}")) {
        let tmp = dir.join(format!(
            ".ckpt-{step}.safetensors.tmp-{}",
            std::process::id()
        ));
        let _ = std::fs::write(tmp, &bytes[..bytes.len() / 2]);
        std::process::abort();
    }
}

/// The complete checkpoints in `dir`, oldest first.
pub fn list(dir: &Path) -> Vec<Found> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<Found> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step: i64 = name
                .strip_prefix("ckpt-")?
                .strip_suffix(".json")?
                .parse()
                .ok()?;
            let tensors = tensors_path(dir, step);
            tensors.is_file().then(|| Found {
                step,
                tensors,
                meta: meta_path(dir, step),
            })
        })
        .collect();
    out.sort_by_key(|c| c.step);
    out
}

pub fn latest(dir: &Path) -> Option<Found> {
    list(dir).pop()
}

/// Reads a checkpoint's metadata and variables.
pub fn load(c: &Found) -> Result<(Meta, FxHashMap<String, Tensor>), String> {
    let m = std::fs::read(&c.meta).map_err(|e| format!("cannot read {}: {e}", c.meta.display()))?;
    let meta: Meta =
        serde_json::from_slice(&m).map_err(|e| format!("{}: {e}", c.meta.display()))?;
    let b = std::fs::read(&c.tensors)
        .map_err(|e| format!("cannot read {}: {e}", c.tensors.display()))?;
    let vars = decode(&b).map_err(|e| format!("{}: {e}", c.tensors.display()))?;
    Ok((meta, vars))
}

/// How the variables of a checkpoint differ from the program's: one line per variable.
pub fn mismatches(want: &[(String, TensorType)], have: &FxHashMap<String, Tensor>) -> Vec<String> {
    let mut out = Vec::new();
    for (name, ty) in want {
        match have.get(name) {
            None => out.push(format!("`{name}` ({ty}) is not in the checkpoint")),
            Some(t) if t.ty() != *ty => out.push(format!(
                "`{name}` is {} in the checkpoint but {ty} in the program",
                t.ty()
            )),
            Some(_) => {}
        }
    }
    let mut extra: Vec<&String> = have
        .keys()
        .filter(|k| !want.iter().any(|(n, _)| n == *k))
        .collect();
    extra.sort();
    for k in extra {
        out.push(format!("`{k}` is in the checkpoint but not in the program"));
    }
    out
}
