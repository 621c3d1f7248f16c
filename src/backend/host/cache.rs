//! The on-disk cache of compiled code: an executable's object file, keyed by everything
//! that decides its bytes, so that a second run links it without optimising or
//! generating code again.
//!
//! The key is a 128-bit hash of the unoptimised LLVM module (which the lowering and
//! codegen derive from the graph, its shapes and the memory plan), the CPU, its
//! features, the triple, the optimisation pipeline, LLVM's version and est's. An entry
//! is `est-obj1`, a JSON header line (the whole key, the object's length and CRC32C),
//! then the object. Entries are trusted only when every field matches and the checksum
//! holds; anything else (a truncated write, a flipped bit, a file from another machine
//! or compiler) is reported as a reason, compiled again and overwritten.
//!
//! The cache lives in `EST_CACHE_DIR`, else `$XDG_CACHE_HOME/est`, else
//! `$HOME/.cache/est`; `EST_CACHE_DIR=off` turns it off. It keeps at most
//! `MAX_BYTES`: after a write, the least recently written entries go first.

use super::jit::{recipe, Machine};
use crate::hash::{fnv1a, FNV_OFFSET};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"est-obj1\n";
const MAX_BYTES: u64 = 256 << 20;

/// Everything an object's bytes depend on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    /// The hash of the unoptimised module, 32 hex digits.
    pub module: String,
    pub triple: String,
    pub cpu: String,
    pub features: String,
    pub pipeline: String,
    pub llvm: String,
    pub est: String,
}

#[derive(Serialize, Deserialize)]
struct Header {
    key: Key,
    len: usize,
    crc32c: u32,
}

fn llvm_version() -> String {
    let (mut a, mut b, mut c) = (0u32, 0u32, 0u32);
    // SAFETY: writes three integers.
    unsafe { llvm_sys::core::LLVMGetVersion(&mut a, &mut b, &mut c) };
    format!("{a}.{b}.{c}")
}

impl Key {
    pub fn new(module_text: &str, m: &Machine) -> Key {
        let lo = fnv1a(FNV_OFFSET, module_text.as_bytes());
        let hi = fnv1a(fnv1a(FNV_OFFSET, b"est-cache"), module_text.as_bytes());
        Key {
            module: format!("{hi:016x}{lo:016x}"),
            triple: m.triple.clone(),
            cpu: m.cpu.clone(),
            features: m.features.clone(),
            pipeline: recipe(),
            llvm: llvm_version(),
            est: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// The entry's file name: a hash of the whole key.
    fn file_name(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        let h = fnv1a(fnv1a(FNV_OFFSET, self.module.as_bytes()), text.as_bytes());
        format!("{}-{h:016x}.obj", &self.module[..16])
    }
}

/// Where the code of an executable came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Compiled; the cache is off.
    Compiled,
    /// Compiled and written to the cache (or, with the reason, not written).
    Stored(PathBuf, Option<String>),
    /// Read from the cache.
    Cached(PathBuf),
    /// The cache's entry was not trusted (why): compiled again and overwritten.
    Rebuilt(PathBuf, String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Compiled => write!(f, "compiled (the cache is off)"),
            Origin::Stored(p, None) => write!(f, "compiled, cached in {}", p.display()),
            Origin::Stored(p, Some(why)) => {
                write!(f, "compiled, not cached in {}: {why}", p.display())
            }
            Origin::Cached(p) => write!(f, "from the cache, {}", p.display()),
            Origin::Rebuilt(p, why) => write!(
                f,
                "compiled again: the cached entry {} was {why}",
                p.display()
            ),
        }
    }
}

/// The cache directory, `None` when it is off.
pub fn dir() -> Option<PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = env("EST_CACHE_DIR") {
        return (d != "off").then(|| PathBuf::from(d));
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("est"));
    }
    env("HOME").map(|h| PathBuf::from(h).join(".cache").join("est"))
}

/// What the cache holds for a key.
pub enum Lookup {
    Hit(Vec<u8>),
    Miss,
    /// An entry exists but is not to be trusted, for this reason.
    Bad(String),
}

pub fn path(dir: &Path, key: &Key) -> PathBuf {
    dir.join(key.file_name())
}

/// The longest header an entry may have (the key and two numbers take a few hundred
/// bytes).
const MAX_HEADER: u64 = 64 << 10;

/// Reads the entry of `key`: only a regular file (a FIFO, a device or a link in its
/// place is not trusted, and not read), and only its header until that matches the key
/// and the file's size, so that no more is read than the header promises.
pub fn get(path: &Path, key: &Key) -> Lookup {
    let file = match crate::atomic::open_regular(path) {
        Ok(Some(f)) => f,
        Ok(None) => return Lookup::Miss,
        Err(e) => return Lookup::Bad(format!("unreadable ({e})")),
    };
    match read_entry(file, key) {
        Ok(object) => Lookup::Hit(object),
        Err(why) => Lookup::Bad(why),
    }
}

fn read_entry(file: std::fs::File, key: &Key) -> Result<Vec<u8>, String> {
    use std::io::{BufRead, Read};
    let size = file
        .metadata()
        .map_err(|e| format!("unreadable ({e})"))?
        .len();
    let mut r = std::io::BufReader::new(file);
    let mut line = Vec::new();
    let unreadable = |e: std::io::Error| format!("unreadable ({e})");
    (&mut r)
        .take(MAGIC.len() as u64)
        .read_to_end(&mut line)
        .map_err(unreadable)?;
    if line != MAGIC {
        return Err("not an est object entry".into());
    }
    line.clear();
    (&mut r)
        .take(MAX_HEADER)
        .read_until(b'\n', &mut line)
        .map_err(unreadable)?;
    let head = line.strip_suffix(b"\n").ok_or("truncated in its header")?;
    let h: Header =
        serde_json::from_slice(head).map_err(|e| format!("damaged in its header ({e})"))?;
    if h.key != *key {
        return Err("made for another module, CPU or compiler".into());
    }
    let have = size.saturating_sub((MAGIC.len() + line.len()) as u64);
    if have != h.len as u64 {
        return Err(format!("truncated ({have} of {} bytes of code)", h.len));
    }
    let mut object = Vec::with_capacity(h.len);
    r.take(have).read_to_end(&mut object).map_err(unreadable)?;
    if object.len() != h.len {
        return Err(format!(
            "truncated ({} of {} bytes of code)",
            object.len(),
            h.len
        ));
    }
    if crc32c::crc32c(&object) != h.crc32c {
        return Err("damaged (its checksum does not match)".into());
    }
    Ok(object)
}

/// Writes the entry of `key` (to a temporary file renamed into place, so a reader
/// never sees half of it), then trims the cache to its size.
pub fn put(path: &Path, key: &Key, object: &[u8]) -> Result<(), String> {
    let header = Header {
        key: key.clone(),
        len: object.len(),
        crc32c: crc32c::crc32c(object),
    };
    let mut bytes = MAGIC.to_vec();
    bytes.extend(serde_json::to_vec(&header).map_err(|e| e.to_string())?);
    bytes.push(b'\n');
    bytes.extend_from_slice(object);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    let tmp = crate::atomic::temp_path(path, None);
    let written = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.to_string());
    }
    trim(dir, MAX_BYTES);
    Ok(())
}

/// Removes the temporary files of writers that were killed, then the oldest entries
/// until the cache, with the temporary files still being written, holds at most `max`
/// bytes.
fn trim(dir: &Path, max: u64) {
    let writing = crate::atomic::sweep_stale_temps(dir);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".obj"))
        .filter_map(|e| {
            let m = e.metadata().ok()?;
            Some((m.modified().ok()?, m.len(), e.path()))
        })
        .collect();
    let mut total: u64 = writing + files.iter().map(|f| f.1).sum::<u64>();
    files.sort();
    for (_, len, p) in files {
        if total <= max {
            break;
        }
        if std::fs::remove_file(&p).is_ok() {
            total -= len;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key {
            module: "0123456789abcdef0123456789abcdef".into(),
            triple: "x86_64-pc-linux-gnu".into(),
            cpu: "znver3".into(),
            features: "+avx2".into(),
            pipeline: recipe(),
            llvm: "19.1.7".into(),
            est: "0.1.0".into(),
        }
    }

    #[test]
    fn an_entry_is_trusted_only_when_whole_and_for_its_key() {
        let dir = std::env::temp_dir().join(format!("est-cache-test-{}", std::process::id()));
        let k = key();
        let p = path(&dir, &k);
        assert!(matches!(get(&p, &k), Lookup::Miss));
        let object = b"\x7fELF and some code".to_vec();
        put(&p, &k, &object).expect("written");
        match get(&p, &k) {
            Lookup::Hit(o) => assert_eq!(o, object),
            _ => panic!("the entry just written is not read back"),
        }
        let bad = |bytes: &[u8]| {
            std::fs::write(&p, bytes).expect("written");
            match get(&p, &k) {
                Lookup::Bad(why) => why,
                _ => panic!("a bad entry is trusted"),
            }
        };
        let whole = {
            put(&p, &k, &object).expect("written");
            std::fs::read(&p).expect("read")
        };
        assert!(bad(&whole[..whole.len() - 3]).contains("truncated"));
        let mut flipped = whole.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert!(bad(&flipped).contains("checksum"));
        assert!(bad(b"garbage").contains("not an est object"));
        let mut other = k.clone();
        other.cpu = "skylake".into();
        put(&p, &other, &object).expect("written");
        assert!(matches!(get(&p, &k), Lookup::Bad(why) if why.contains("another")));
        assert_ne!(path(&dir, &k), path(&dir, &other));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
