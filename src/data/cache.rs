//! The `cache` transform's storage. After its first pass a cache holds its elements
//! column by column: every leaf whose elements share one shape is one stacked tensor,
//! so a later pass hands out an element, or a run of consecutive elements as a batch,
//! as a view of that tensor without copying.
//!
//! `cache("id", version: "v1")` also writes the elements to
//! `CACHE_DIR/ID-VERSION-FINGERPRINT.estcache` (TFRecord framing: a header record, then
//! one record per element), where the fingerprint covers the element type, the stages
//! before the cache and the size and modification time of every source file. A later
//! run with the same fingerprint loads the file instead of running those stages; a
//! changed version or source file gives another name, and the stale file is removed
//! when the new one is written.

use super::pipeline::{stack_leaf, Element};
use super::records::{self, RecordReader};
use super::sources;
use crate::elab::data::{Stage, StageKind};
use crate::ir::{DType, TensorType};
use crate::tensor::{Arr, Data, Tensor};
use ndarray::{Axis, IxDyn, Slice};
use std::io::Write;
use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"estcache1";

/// One leaf of the cached elements.
pub enum Column {
    /// All elements' values stacked along a new first axis.
    Stacked(Tensor),
    /// Elements of different shapes, or byte strings, kept one by one.
    Rows(Vec<Tensor>),
}

pub struct CacheData {
    pub rows: usize,
    pub cols: Vec<Column>,
}

impl CacheData {
    pub fn new(elems: Vec<Element>) -> CacheData {
        let rows = elems.len();
        let leaves = elems.first().map_or(0, Vec::len);
        let mut cols = Vec::with_capacity(leaves);
        for l in 0..leaves {
            let items: Vec<&Tensor> = elems.iter().map(|e| &e[l]).collect();
            let same = items.iter().all(|t| t.shape() == items[0].shape());
            let col = match (same && items[0].dtype != DType::Bytes)
                .then(|| stack_leaf(&items, false).ok())
                .flatten()
            {
                Some(t) => Column::Stacked(t),
                None => Column::Rows(items.into_iter().cloned().collect()),
            };
            cols.push(col);
        }
        CacheData { rows, cols }
    }

    /// Element `i`.
    pub fn row(&self, i: usize) -> Element {
        self.cols
            .iter()
            .map(|c| match c {
                Column::Stacked(t) => index_rows(t, i),
                Column::Rows(v) => v[i].clone(),
            })
            .collect()
    }

    /// Elements `a..b` as one batch, if every leaf is stacked.
    pub fn rows_batch(&self, a: usize, b: usize) -> Option<Element> {
        self.cols
            .iter()
            .map(|c| match c {
                Column::Stacked(t) => Some(slice_rows(t, a, b)),
                Column::Rows(_) => None,
            })
            .collect()
    }
}

macro_rules! on_data {
    ($t:expr, $a:ident => $e:expr) => {
        Tensor {
            dtype: $t.dtype,
            data: match &$t.data {
                Data::F($a) => Data::F($e),
                Data::I($a) => Data::I($e),
                Data::B($a) => Data::B($e),
                Data::S($a) => Data::S($e),
            },
        }
    };
}

/// Row `i` of a stacked tensor, sharing its data.
fn index_rows(t: &Tensor, i: usize) -> Tensor {
    on_data!(t, a => a.clone().index_axis_move(Axis(0), i))
}

/// Rows `a..b` of a stacked tensor, sharing its data.
fn slice_rows(t: &Tensor, a: usize, b: usize) -> Tensor {
    on_data!(t, x => {
        let mut v = x.clone();
        v.slice_axis_inplace(Axis(0), Slice::from(a..b));
        v
    })
}

/// The directory on-disk caches go to: `EST_CACHE_DIR`, else `$XDG_CACHE_HOME/est`,
/// else `~/.cache/est`, else `.est-cache` beside the program.
pub fn default_dir(base: &Path) -> PathBuf {
    if let Some(d) = std::env::var_os("EST_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("est");
    }
    if let Some(h) = std::env::var_os("HOME") {
        return PathBuf::from(h).join(".cache").join("est");
    }
    base.join(".est-cache")
}

/// What a cache at stage `k` holds, as a fingerprint, and whether it depends on the
/// seed. The fingerprint covers the element type and every stage before the cache in
/// full: its parameters, a closure's graph (without source positions), a zipped
/// dataset's stages, the size and modification time of every file a source reads, and
/// the seed when any of those stages draws random numbers (a shuffle without its own
/// seed, random ops in a closure, `synthetic`).
pub fn fingerprint(
    stages: &[Stage],
    k: usize,
    base: &Path,
    seed: u64,
    file: Option<usize>,
) -> (u64, bool) {
    let mut s = format!("{}|{file:?}", stages[k].elem);
    let random = describe(&stages[..k], base, &mut s);
    if random {
        s.push_str(&format!("|seed={seed}"));
    }
    (
        crate::hash::fnv1a(crate::hash::FNV_OFFSET, s.as_bytes()),
        random,
    )
}

/// Writes a description of stages into `out`; true if any of them is random.
fn describe(stages: &[Stage], base: &Path, out: &mut String) -> bool {
    let mut random = false;
    for st in stages {
        out.push('|');
        match &st.kind {
            StageKind::Map { graph, .. } | StageKind::Filter { graph } => {
                out.push_str(st.kind.name());
                out.push_str(&crate::ir::dump_text(graph, "closure"));
                random |= graph
                    .g
                    .node_indices()
                    .any(|n| graph.node(n).op.is_stateful() && !graph.node(n).op.is_source());
            }
            StageKind::Zip { other } => {
                out.push_str("zip(");
                random |= describe(&other.stages, base, out);
                out.push(')');
            }
            StageKind::Shuffle { seed: None, .. } | StageKind::Synthetic { .. } => {
                random = true;
                out.push_str(&format!("{:?}", st.kind));
            }
            kind => out.push_str(&format!("{kind:?}")),
        }
        out.push_str(&st.elem.to_string());
        for f in sources::files(st, base).unwrap_or_default() {
            let meta = std::fs::metadata(&f).ok();
            let mtime = meta
                .as_ref()
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            out.push_str(&format!(
                "{}:{}:{mtime}",
                f.display(),
                meta.map_or(0, |m| m.len())
            ));
        }
    }
    random
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The file of a cache (`ID-VERSION-FINGERPRINT.estcache`), and its id as written in
/// file names. `slot` tells apart the caches one `cache("id")` makes side by side (one
/// per file under `interleave`, one per seed when its contents are random): it joins
/// the id (`ID.SLOT`), so that writing one never removes another.
pub fn file_name(
    dir: &Path,
    id: &str,
    slot: &str,
    version: Option<&str>,
    fp: u64,
) -> (PathBuf, String) {
    let mut id = sanitize(id);
    if !slot.is_empty() {
        id = format!("{id}.{slot}");
    }
    let name = format!(
        "{id}-{}-{fp:016x}.estcache",
        sanitize(version.unwrap_or("v0"))
    );
    (dir.join(name), id)
}

/// Dtypes are written as their index in `DType::ALL`.
const DTYPES: [DType; 8] = DType::ALL;

fn encode(e: &Element, out: &mut Vec<u8>) {
    out.clear();
    for t in e {
        let code = DTYPES
            .iter()
            .position(|&d| d == t.dtype)
            .expect("known dtype") as u8;
        out.push(code);
        out.push(t.shape().len() as u8);
        for &d in t.shape() {
            out.extend((d as u64).to_le_bytes());
        }
        if let Data::S(a) = &t.data {
            for x in a.iter() {
                out.extend((x.len() as u64).to_le_bytes());
                out.extend(x);
            }
        } else {
            out.extend(t.to_le_bytes());
        }
    }
}

fn decode(mut b: &[u8]) -> Option<Element> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (x, rest) = b.split_at(n);
        *b = rest;
        Some(x)
    }
    fn u64_of(b: &mut &[u8]) -> Option<usize> {
        usize::try_from(u64::from_le_bytes(take(b, 8)?.try_into().ok()?)).ok()
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let head = take(&mut b, 2)?;
        let dtype = *DTYPES.get(head[0] as usize)?;
        let mut dims = Vec::new();
        for _ in 0..head[1] {
            dims.push(u64_of(&mut b)?);
        }
        let ty = TensorType::new(dtype, dims.clone());
        let n = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
        if dtype == DType::Bytes {
            let mut v = Vec::with_capacity(n.min(b.len()));
            for _ in 0..n {
                let len = u64_of(&mut b)?;
                v.push(take(&mut b, len)?.to_vec());
            }
            out.push(Tensor {
                dtype,
                data: Data::S(Arr::from_shape_vec(IxDyn(&dims), v).ok()?),
            });
        } else {
            let size = crate::tensor::dtype_size(dtype)?;
            let payload = take(&mut b, n.checked_mul(size)?)?;
            out.push(Tensor::from_le_bytes(&ty, payload)?);
        }
    }
    Some(out)
}

/// Loads a cache file written for fingerprint `fp`; `None` if it is missing, for
/// another fingerprint, or damaged (the cache is then rebuilt).
pub fn load(path: &Path, fp: u64) -> Option<Vec<Element>> {
    // (only a regular file: a FIFO or a device in its place is rebuilt over, not read)
    let f = crate::atomic::open_regular(path).ok()??;
    let len = f.metadata().ok()?.len();
    let mut r = RecordReader::new(std::io::BufReader::with_capacity(1 << 20, f), len);
    let mut rec = Vec::new();
    if !r.next_into(&mut rec).ok()? || rec.len() != MAGIC.len() + 16 || &rec[..MAGIC.len()] != MAGIC
    {
        return None;
    }
    let got = u64::from_le_bytes(rec[MAGIC.len()..MAGIC.len() + 8].try_into().ok()?);
    let rows = u64::from_le_bytes(rec[MAGIC.len() + 8..].try_into().ok()?);
    if got != fp {
        return None;
    }
    let mut out = Vec::with_capacity(usize::try_from(rows).ok()?.min(1 << 24));
    while r.next_into(&mut rec).ok()? {
        out.push(decode(&rec)?);
    }
    (out.len() as u64 == rows).then_some(out)
}

/// Writes a cache file atomically (a temporary file renamed into place), then removes
/// the temporary files of killed writers and the files of the same id with other
/// versions or fingerprints.
pub fn store(path: &Path, id: &str, fp: u64, elems: &[Element]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    // Unique per writer: input workers may write the same cache at the same time.
    static WRITER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    crate::atomic::write_with(path, Some(n), |w| {
        let mut head = MAGIC.to_vec();
        head.extend(fp.to_le_bytes());
        head.extend((elems.len() as u64).to_le_bytes());
        w.write_all(&records::frame(&head))?;
        let mut buf = Vec::new();
        for e in elems {
            encode(e, &mut buf);
            w.write_all(&records::frame(&buf))?;
        }
        Ok(())
    })?;
    crate::atomic::sweep_stale_temps(dir);
    let keep = path.file_name().map(|n| n.to_os_string());
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.filter_map(|e| e.ok()) {
            let n = e.file_name();
            let s = n.to_string_lossy();
            let parts: Vec<&str> = s.split('-').collect();
            if Some(&n) != keep.as_ref()
                && parts.len() == 3
                && parts[0] == id
                && s.ends_with(".estcache")
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}
