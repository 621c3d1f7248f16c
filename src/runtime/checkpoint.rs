//! Checkpoints in `model_dir`: `ckpt-<step>.safetensors` (every variable, optimiser slots
//! included) and `ckpt-<step>.json` (global step, run seed, input position, program
//! hash, a CRC32C per tensor and one of the metadata itself). Each file is written
//! atomically (`atomic`) and the metadata only after the tensors, so a checkpoint whose
//! metadata exists is complete, whenever the process was killed. `checkpoint.json`
//! lists the checkpoints for people and tools; the runtime trusts the files themselves,
//! and verifies them: a checkpoint whose metadata is inconsistent, whose tensors file is
//! missing or whose bytes do not match their checksums is damaged (`load`), and
//! `restore` falls back to the newest intact one, saying which it skipped and why.

use crate::atomic;
use crate::ir::{DType, TensorType};
use crate::tensor::Tensor;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub global_step: i64,
    /// The run seed: with the step, the whole state of the random streams.
    pub seed: u64,
    /// Elements the train input has produced (the resumed input skips them).
    pub input_position: u64,
    /// The most shards any run that trained this state used: the train input produced
    /// at most `global_step * max_shards` elements. (Absent in checkpoints of est
    /// before checksums.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_shards: Option<u64>,
    /// A hash of the program text the checkpoint was written by.
    pub program_hash: String,
    /// Variables and their types, as `name: f32[3, 4]`.
    pub variables: Vec<String>,
    /// The CRC32C of each variable's little-endian bytes, by name (TensorFlow's
    /// checkpoints keep one per tensor too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksums: Option<BTreeMap<String, u32>>,
    /// The CRC32C of this metadata as compact JSON without this field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta_checksum: Option<u32>,
}

impl Meta {
    /// Sets `meta_checksum` to the checksum of the other fields.
    pub fn seal(&mut self) {
        self.meta_checksum = None;
        self.meta_checksum = Some(self.own_checksum());
    }

    /// The checksum of every field but `meta_checksum`.
    fn own_checksum(&self) -> u32 {
        let mut m = self.clone();
        m.meta_checksum = None;
        crc32c::crc32c(&serde_json::to_vec(&m).unwrap_or_default())
    }

    /// Whether this metadata comes from an est that wrote no checksums.
    pub fn unverified(&self) -> bool {
        self.checksums.is_none()
    }
}

/// A checkpoint found in a model directory: its metadata file exists (its tensors
/// file may not, which makes it damaged).
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

/// The CRC32C of every variable's little-endian bytes, as `Meta::checksums` holds them.
pub fn checksums(vars: &FxHashMap<String, Tensor>) -> BTreeMap<String, u32> {
    vars.iter()
        .map(|(k, t)| (k.clone(), crc32c::crc32c(&t.to_le_bytes())))
        .collect()
}

/// Saves a checkpoint: tensors, then metadata (with the checksums of both), then the
/// index; prunes to `keep`.
pub fn save(
    dir: &Path,
    vars: &FxHashMap<String, Tensor>,
    meta: &Meta,
    keep: usize,
) -> std::io::Result<PathBuf> {
    let bytes = encode(vars).map_err(std::io::Error::other)?;
    let tp = tensors_path(dir, meta.global_step);
    fault_injection(dir, meta.global_step, &bytes);
    atomic::write(&tp, &bytes)?;
    let mut meta = meta.clone();
    meta.checksums = Some(checksums(vars));
    meta.seal();
    let m = serde_json::to_vec_pretty(&meta).map_err(std::io::Error::other)?;
    atomic::write(&meta_path(dir, meta.global_step), &m)?;
    let mut all = list(dir)?;
    while all.len() > keep.max(1) {
        let old = all.remove(0);
        let _ = std::fs::remove_file(&old.meta);
        let _ = std::fs::remove_file(&old.tensors);
    }
    atomic::write(
        &dir.join("checkpoint.json"),
        index(&all).to_string().as_bytes(),
    )?;
    Ok(tp)
}

/// For the crash tests: `EST_FAULT=checkpoint-write:STEP` makes the process die in the
/// middle of writing that step's checkpoint (half a temporary file written, nothing
/// renamed), as a power cut or SIGKILL would leave it.
fn fault_injection(dir: &Path, step: i64, bytes: &[u8]) {
    if std::env::var("EST_FAULT").ok().as_deref() == Some(&format!("checkpoint-write:{step}")) {
        let tmp = atomic::temp_path(&tensors_path(dir, step), None);
        let _ = std::fs::write(tmp, &bytes[..bytes.len() / 2]);
        std::process::abort();
    }
}

/// The checkpoints in `dir` (every `ckpt-<step>.json` with a step written as est
/// writes it), oldest first; none when `dir` does not exist. Whether each is intact is
/// for `load` to say. A directory that cannot be listed (no read permission, an I/O
/// error from the disk) is an error, never "no checkpoints": a run that took it for
/// an empty directory would train from step 0 and overwrite the checkpoints.
pub fn list(dir: &Path) -> std::io::Result<Vec<Found>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(listing(dir, e)),
    };
    let mut out = Vec::new();
    for e in rd {
        let e = e.map_err(|e| listing(dir, e))?;
        if e.file_name().to_string_lossy().ends_with(".json") {
            out.extend(named(&e.path()));
        }
    }
    out.sort_by_key(|c| c.step);
    Ok(out)
}

/// An error listing `dir`, naming it.
fn listing(dir: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("cannot list {}: {e}", dir.display()))
}

/// `checkpoint.json`: the newest checkpoint's step and every kept one's.
fn index(all: &[Found]) -> serde_json::Value {
    serde_json::json!({
        "latest": all.last().map(|c| c.step),
        "all": all.iter().map(|c| c.step).collect::<Vec<_>>(),
    })
}

/// Rewrites `checkpoint.json` when it disagrees with the checkpoints `dir` holds (a run
/// stopped between saving a checkpoint and writing the index, or files were removed
/// by hand); leaves it alone when it agrees, and when `dir` holds no checkpoint.
pub fn sync_index(dir: &Path) -> std::io::Result<()> {
    let all = list(dir)?;
    if all.is_empty() {
        return Ok(());
    }
    let path = dir.join("checkpoint.json");
    let want = index(&all);
    let have: Option<serde_json::Value> = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    if have.as_ref() != Some(&want) {
        atomic::write(&path, want.to_string().as_bytes())?;
    }
    Ok(())
}

/// The checkpoint a path names: its `ckpt-<step>.json`, its `ckpt-<step>.safetensors`,
/// or `ckpt-<step>`, with the step written as est writes it (`None`: another file).
pub fn named(path: &Path) -> Option<Found> {
    let name = path.file_name()?.to_string_lossy();
    let stem = name
        .strip_suffix(".json")
        .or_else(|| name.strip_suffix(".safetensors"))
        .unwrap_or(&name);
    let step: i64 = stem.strip_prefix("ckpt-")?.parse().ok()?;
    let dir = path.parent().unwrap_or(Path::new(""));
    (stem == format!("ckpt-{step}")).then(|| Found {
        step,
        tensors: tensors_path(dir, step),
        meta: meta_path(dir, step),
    })
}

/// The steps of the checkpoints in `dir`, oldest first.
pub fn steps(dir: &Path) -> std::io::Result<Vec<i64>> {
    Ok(list(dir)?.iter().map(|c| c.step).collect())
}

/// The newest checkpoint in `dir`, if any.
pub fn latest(dir: &Path) -> std::io::Result<Option<Found>> {
    Ok(list(dir)?.pop())
}

/// Why a checkpoint could not be loaded.
#[derive(Debug, Clone, PartialEq)]
pub enum LoadError {
    /// A file could not be read (permissions, an I/O error): nothing is known of the
    /// checkpoint itself, so nothing falls back.
    Io(String),
    /// The checkpoint is damaged: the reason.
    Damaged(String),
    /// The checkpoint was deleted while it was being read: a training run alongside
    /// pruned it (`keep_checkpoint_max`). Not damage: a newer one exists.
    Gone,
}

/// Reads a checkpoint's metadata and variables and verifies them: the metadata's own
/// checksum and fields, the tensors file, each tensor's checksum, the variable list,
/// and that every float value is finite.
pub fn load(c: &Found) -> Result<(Meta, FxHashMap<String, Tensor>), LoadError> {
    let name = |p: &Path| {
        p.file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned())
    };
    let damaged = |why: String| LoadError::Damaged(why);
    let m = std::fs::read(&c.meta).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LoadError::Gone,
        _ => LoadError::Io(format!("cannot read {}: {e}", c.meta.display())),
    })?;
    let meta: Meta = serde_json::from_slice(&m)
        .map_err(|e| damaged(format!("{} is not valid metadata: {e}", name(&c.meta))))?;
    check_meta(&meta, c.step).map_err(|e| damaged(format!("{}: {e}", name(&c.meta))))?;
    let b = match std::fs::read(&c.tensors) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if !c.meta.exists() {
                return Err(LoadError::Gone);
            }
            return Err(damaged(format!(
                "{} is missing (its metadata {} is there)",
                name(&c.tensors),
                name(&c.meta)
            )));
        }
        Err(e) => {
            return Err(LoadError::Io(format!(
                "cannot read {}: {e}",
                c.tensors.display()
            )))
        }
    };
    let vars = decode(&b).map_err(|e| damaged(format!("{}: {e}", name(&c.tensors))))?;
    check_tensors(&meta, &vars).map_err(|e| damaged(format!("{}: {e}", name(&c.tensors))))?;
    Ok((meta, vars))
}

/// The metadata's own checksum and the consistency and range of its fields.
fn check_meta(meta: &Meta, step: i64) -> Result<(), String> {
    if let Some(want) = meta.meta_checksum {
        if meta.own_checksum() != want {
            return Err("the metadata does not match its checksum".into());
        }
    } else if !meta.unverified() {
        return Err("the metadata has tensor checksums but no checksum of its own".into());
    }
    if meta.global_step != step {
        return Err(format!(
            "global_step is {}, but the file is the checkpoint of step {step}",
            meta.global_step
        ));
    }
    if step < 0 {
        return Err(format!("the global step {step} is negative"));
    }
    let most_shards = crate::elab::MAX_NUM_SHARDS as u64;
    let shards = match meta.max_shards {
        Some(0) => return Err("max_shards is 0".into()),
        // (a run of more shards cannot be: its input position would send a resume
        // passing over input for minutes)
        Some(s) if s > most_shards => {
            return Err(format!(
                "max_shards is {s}, more than any run has ({most_shards})"
            ))
        }
        Some(s) => s,
        // Written before `max_shards` was: any run may have used the most shards.
        None => most_shards,
    };
    let most = (step as u64).saturating_mul(shards);
    if meta.input_position > most {
        return Err(format!(
            "input_position {} is more than the train input can have produced in {step} steps of {shards} shard{} ({most})",
            meta.input_position,
            if shards == 1 { "" } else { "s" }
        ));
    }
    Ok(())
}

/// The tensors against the metadata: the same variables and types, each matching its
/// checksum, and no NaN (training never saves one; an infinity may be the state a model
/// keeps, such as a running maximum that starts at -inf).
fn check_tensors(meta: &Meta, vars: &FxHashMap<String, Tensor>) -> Result<(), String> {
    let mut listed: Vec<String> = vars
        .iter()
        .map(|(k, t)| format!("{k}: {}", t.ty()))
        .collect();
    listed.sort();
    let mut want = meta.variables.clone();
    want.sort();
    if listed != want {
        let missing: Vec<&String> = want.iter().filter(|v| !listed.contains(v)).collect();
        let extra: Vec<&String> = listed.iter().filter(|v| !want.contains(v)).collect();
        return Err(format!(
            "the tensors do not match the metadata's variable list (listed but not stored: {missing:?}; stored but not listed: {extra:?})"
        ));
    }
    if let Some(sums) = &meta.checksums {
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        for name in names {
            let got = crc32c::crc32c(&vars[name].to_le_bytes());
            match sums.get(name) {
                Some(&want) if want == got => {}
                Some(&want) => {
                    return Err(format!(
                        "the data of `{name}` does not match its checksum (CRC32C {got:08x}, expected {want:08x})"
                    ))
                }
                None => return Err(format!("`{name}` has no checksum")),
            }
        }
    }
    for (name, t) in vars {
        if let Some((i, v)) = crate::tensor::first_nan(t) {
            return Err(format!("`{name}` holds {v} (element {i})"));
        }
    }
    Ok(())
}

/// The checkpoint a run resumes from.
#[derive(Debug)]
pub struct Restored {
    pub found: Found,
    pub meta: Meta,
    pub vars: FxHashMap<String, Tensor>,
    /// Newer checkpoints that are damaged, with why (newest first).
    pub damaged: Vec<(Found, String)>,
}

/// Why no checkpoint could be restored.
#[derive(Debug)]
pub enum RestoreError {
    Io(String),
    /// Every checkpoint is damaged: each with why (newest first).
    NoneIntact(Vec<(Found, String)>),
}

/// The newest intact checkpoint of `dir`, with the damaged ones newer than it; `None`
/// when `dir` has no checkpoint at all.
pub fn restore(dir: &Path) -> Result<Option<Restored>, RestoreError> {
    // A training run alongside may prune checkpoints while they are read: those are
    // skipped, and when every one listed went away, the directory is listed again.
    for _ in 0..8 {
        let all = list(dir).map_err(|e| RestoreError::Io(e.to_string()))?;
        if all.is_empty() {
            return Ok(None);
        }
        let mut damaged = Vec::new();
        for found in all.into_iter().rev() {
            match load(&found) {
                Ok((meta, vars)) => {
                    return Ok(Some(Restored {
                        found,
                        meta,
                        vars,
                        damaged,
                    }))
                }
                Err(LoadError::Io(e)) => return Err(RestoreError::Io(e)),
                Err(LoadError::Damaged(why)) => damaged.push((found, why)),
                Err(LoadError::Gone) => {}
            }
        }
        if !damaged.is_empty() {
            return Err(RestoreError::NoneIntact(damaged));
        }
    }
    Err(RestoreError::Io(format!(
        "the checkpoints of {} kept disappearing while they were read",
        dir.display()
    )))
}

/// Moves a damaged checkpoint's files aside (`ckpt-N.json.damaged`, ...), where no run
/// reads or prunes them and a person can still look at them.
pub fn set_aside(c: &Found) -> std::io::Result<Vec<PathBuf>> {
    let mut moved = Vec::new();
    for p in [&c.meta, &c.tensors] {
        if p.exists() {
            let mut to = p.clone().into_os_string();
            to.push(".damaged");
            let to = PathBuf::from(to);
            std::fs::rename(p, &to)?;
            moved.push(to);
        }
    }
    Ok(moved)
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
