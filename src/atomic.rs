//! Writing files so that a reader never sees half of one and a failure leaves nothing
//! behind: the bytes go to a temporary file beside the target, which is flushed,
//! synced and renamed into place; when any of that fails the temporary file is removed
//! (a full disk stays no fuller than before).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The temporary name of `path` for this process: `.NAME.tmp-PID`, plus `-TAG` when
/// several writers of one process may write the same file at once.
pub fn temp_path(path: &Path, tag: Option<u64>) -> PathBuf {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let pid = std::process::id();
    dir.join(match tag {
        Some(t) => format!(".{name}.tmp-{pid}-{t}"),
        None => format!(".{name}.tmp-{pid}"),
    })
}

/// Writes `path` atomically with `fill`, which writes the contents. `tag` keeps the
/// temporary files of concurrent writers apart.
pub fn write_with(
    path: &Path,
    tag: Option<u64>,
    fill: impl FnOnce(&mut BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = temp_path(path, tag);
    let written = (|| {
        let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(&tmp)?);
        fill(&mut w)?;
        w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_with(path, None, |w| w.write_all(bytes))
}

/// Whether `name` is a temporary file of an interrupted atomic write of this module.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with('.') && name.contains(".tmp-")
}
