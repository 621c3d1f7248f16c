//! Writing files so that a reader never sees half of one and a failure leaves nothing
//! behind: the bytes go to a temporary file beside the target, which is flushed,
//! synced and renamed into place; when any of that fails the temporary file is removed
//! (a full disk stays no fuller than before).
//!
//! What a user names as an output (`-o`, `--output`, `data convert`'s prefix) goes
//! through `write_output`, which follows symbolic links to the file they name and
//! writes through a character device or a FIFO (`-o /dev/null`, `-o /dev/stdout`)
//! instead of replacing it; anything else that is not a regular file is refused.
//! `rewrite_in_place` (for `estc fmt`) keeps the file itself: its owner, mode and hard
//! links.

use std::io::{BufWriter, Write};
use std::os::unix::fs::FileTypeExt;
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

/// The PID of the process writing the temporary file `name` (`.NAME.tmp-PID[-TAG]`).
fn temp_writer(name: &str) -> Option<i32> {
    let rest = &name[name.rfind(".tmp-")? + ".tmp-".len()..];
    rest.split('-').next()?.parse().ok()
}

/// How long a temporary file must have gone unwritten before a sweep may take it: a
/// writer on another machine (a cache directory shared over NFS) has a PID this
/// machine does not know, but its file keeps changing while it writes.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes the temporary files in `dir` that no running process is writing: their
/// writer's PID is gone from this machine and they have not changed for
/// `STALE_AFTER`, where other processes may be writing at the same time (a cache shared
/// by runs); returns the bytes of those left, which a size cap counts.
pub fn sweep_stale_temps(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut left = 0;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !is_temp_name(&name) {
            continue;
        }
        // SAFETY: kill with signal 0 only asks whether the process exists.
        let gone = temp_writer(&name).is_some_and(|pid| unsafe {
            libc::kill(pid, 0) != 0
                && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        });
        let meta = e.metadata().ok();
        let idle = (meta.as_ref())
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if gone && idle && std::fs::remove_file(e.path()).is_ok() {
            continue;
        }
        left += meta.map_or(0, |m| m.len());
    }
    left
}

/// Opens `path` for reading if it is a regular file (not following a final symbolic
/// link, and without blocking on a FIFO): `Ok(None)` when it does not exist, an error
/// when it is something else. For files this program wrote itself (caches), which a
/// device, a FIFO or a link put in their place must not hang or flood.
pub fn open_regular(path: &Path) -> std::io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if !f.metadata()?.file_type().is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    Ok(Some(f))
}

/// What a path named as an output is, once its symbolic links are followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A regular file, or nothing yet: written atomically at this path.
    File(PathBuf),
    /// A character device or a FIFO: written through, in place.
    Stream(PathBuf),
}

/// How many symbolic links a path may pass through (Linux's own limit).
const MAX_LINKS: usize = 40;

/// Whether `p` names an open file descriptor (`/dev/stdout`, `/dev/fd/3`,
/// `/proc/self/fd/1`): the file behind it is the descriptor's, to be written through,
/// never replaced (a shell's `> out.ll` or `| cat` holds it open).
fn is_descriptor(p: &Path) -> bool {
    let s = p.to_string_lossy();
    matches!(&*s, "/dev/stdout" | "/dev/stderr")
        || s.starts_with("/dev/fd/")
        || (s.starts_with("/proc/") && s.contains("/fd/"))
}

/// Where a write to `path` goes: the file its symbolic links lead to (a link to
/// nothing leads to the file it names, which is made), written atomically; a character
/// device, a FIFO or an open descriptor (`/dev/stdout`), written through. A directory,
/// a block device or a socket is an error that says what it is, as is a loop of links.
pub fn output(path: &Path) -> std::io::Result<Output> {
    let mut at = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        if is_descriptor(&at) {
            // (its link's text is the descriptor's description, `pipe:[N]`, not a path)
            return match std::fs::metadata(&at) {
                Ok(m) if m.is_dir() => Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "it is a directory, not a file",
                )),
                Ok(_) => Ok(Output::Stream(path.to_path_buf())),
                Err(e) => Err(e),
            };
        }
        let meta = match std::fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Output::File(at)),
            Err(e) => return Err(e),
        };
        let t = meta.file_type();
        if t.is_symlink() {
            let to = std::fs::read_link(&at)?;
            at = at.parent().unwrap_or(Path::new("")).join(to);
            continue;
        }
        let refuse = |what: &str| {
            let m = if at == path {
                format!("it is {what}, not a file")
            } else {
                format!("it leads to {}, {what}, not a file", at.display())
            };
            Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, m))
        };
        return if t.is_file() {
            Ok(Output::File(at))
        } else if t.is_char_device() || t.is_fifo() {
            Ok(Output::Stream(at))
        } else if t.is_dir() {
            refuse("a directory")
        } else if t.is_block_device() {
            refuse("a block device")
        } else {
            refuse("a socket")
        };
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("it is a loop of symbolic links (or a chain of more than {MAX_LINKS})"),
    ))
}

/// Writes an output the user named (see `output`): a regular file atomically, keeping
/// the permissions of the file it replaces; a character device or FIFO through.
pub fn write_output(
    path: &Path,
    fill: impl FnOnce(&mut BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    match output(path)? {
        Output::File(p) => {
            let kept = std::fs::metadata(&p).ok().map(|m| m.permissions());
            write_with(&p, None, |w| {
                if let Some(perm) = kept {
                    w.get_ref().set_permissions(perm)?;
                }
                fill(w)
            })
        }
        // (appending: a descriptor a shell opened with `>` is at its end already, one
        // opened with `>>` must keep what it holds; devices and FIFOs do not mind)
        Output::Stream(p) => {
            let f = std::fs::OpenOptions::new().append(true).open(&p)?;
            let mut w = BufWriter::with_capacity(1 << 20, f);
            fill(&mut w)?;
            w.flush()
        }
    }
}

/// Writes `bytes` as an output the user named (see `write_output`).
pub fn write_output_bytes(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_output(path, |w| w.write_all(bytes))
}

/// Replaces the text of the existing regular file `path` (its links followed) with
/// `text`, in place, as gofmt and rustfmt do: the file keeps its inode, so its owner,
/// mode and hard links. A file without write permission is refused (root too), before
/// anything is written. The file is first copied to a temporary file beside it; when
/// writing fails, the old text is written back into the file from the copy (or, when
/// even that fails, the copy is renamed over it), so nothing is lost.
pub fn rewrite_in_place(path: &Path, text: &[u8]) -> std::io::Result<()> {
    use std::io::{Seek, SeekFrom};
    let target = match output(path)? {
        Output::File(p) => p,
        Output::Stream(p) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("it leads to {}, a device or FIFO, not a file", p.display()),
            ))
        }
    };
    if std::fs::metadata(&target)?.permissions().readonly() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            "it is read-only (give it write permission to format it)",
        ));
    }
    // (opened before anything else is written: a file this user may not write is
    // refused as it is)
    let mut f = std::fs::OpenOptions::new().write(true).open(&target)?;
    let backup = temp_path(&target, None);
    let copied = std::fs::copy(&target, &backup)
        .and_then(|_| std::fs::File::open(&backup))
        .and_then(|b| b.sync_all());
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&backup);
        return Err(e);
    }
    let put = |f: &mut std::fs::File, bytes: &[u8]| {
        f.seek(SeekFrom::Start(0))?;
        f.write_all(bytes)?;
        f.set_len(bytes.len() as u64)?;
        f.sync_all()
    };
    match put(&mut f, text) {
        Ok(()) => {
            let _ = std::fs::remove_file(&backup);
            Ok(())
        }
        Err(e) => {
            let restored = std::fs::read(&backup).and_then(|old| put(&mut f, &old));
            match restored {
                Ok(()) => {
                    let _ = std::fs::remove_file(&backup);
                }
                Err(_) => {
                    let _ = std::fs::rename(&backup, &target);
                }
            }
            Err(e)
        }
    }
}
