//! A run's `model_dir`: the exclusive lock a training run holds on it, the check that it
//! can be written (before the first step, not after a loop of training), and the
//! refusal of a directory that holds another framework's checkpoints.
//!
//! The lock is `flock(2)` on `.est.lock`, which holds the PID of its holder. The kernel
//! releases it when the process exits, however it exits, so a crashed run's lock is
//! simply taken over. Only training (which writes checkpoints) takes it; `eval` and
//! `predict` read alongside a training run.

use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name.
pub const LOCK_FILE: &str = ".est.lock";

/// An exclusive lock on a model directory, held until dropped.
#[derive(Debug)]
pub struct Lock {
    _file: std::fs::File,
}

/// Why a model directory cannot be used for training.
#[derive(Debug, Clone, PartialEq)]
pub enum DirError {
    /// Another process holds the lock (its PID, when the lock file names one).
    Locked { pid: Option<u32> },
    /// The directory cannot be created or written: what went wrong, said for a person.
    Unwritable(String),
}

/// Creates `dir` if needed, checks that it is a writable directory, and takes its lock.
pub fn lock(dir: &Path) -> Result<Lock, DirError> {
    usable_dir(dir)?;
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| unwritable(dir, &e))?;
    match flock_patiently(&file) {
        Ok(true) => {}
        Ok(false) => {
            let mut text = String::new();
            let _ = file.read_to_string(&mut text);
            return Err(DirError::Locked {
                pid: text.trim().parse().ok(),
            });
        }
        Err(e) => {
            return Err(DirError::Unwritable(format!(
                "{} cannot be locked: {e} (est needs a file system with flock)",
                path.display()
            )))
        }
    }
    // Ours now: record our PID for whoever finds it taken.
    let pid = std::process::id().to_string();
    let written = file
        .set_len(0)
        .and_then(|_| file.rewind())
        .and_then(|_| file.write_all(pid.as_bytes()));
    written.map_err(|e| unwritable(dir, &e))?;
    // The lock file may have been there before: prove that new files can be made.
    let probe = crate::atomic::temp_path(&dir.join(".est-write-test"), None);
    std::fs::write(&probe, b"")
        .and_then(|_| std::fs::remove_file(&probe))
        .map_err(|e| unwritable(dir, &e))?;
    remove_stale_temps(dir);
    Ok(Lock { _file: file })
}

/// How long a held lock is waited for before it counts as another run's: a process
/// that forks (another thread of an embedding program starting a compiler or linker)
/// holds a copy of every open file until its child execs, and with it the lock this
/// process just released.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_millis(1500);

/// `try_flock`, retried for `LOCK_PATIENCE` while another open file holds the lock.
fn flock_patiently(f: &std::fs::File) -> std::io::Result<bool> {
    let start = std::time::Instant::now();
    loop {
        if try_flock(f)? {
            return Ok(true);
        }
        if start.elapsed() >= LOCK_PATIENCE {
            return Ok(false);
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: whether the lock was taken (`false` when another open
/// file holds it); an error when the file system cannot lock at all.
fn try_flock(f: &std::fs::File) -> std::io::Result<bool> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on a file descriptor this function borrows; no memory is involved.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.kind() == std::io::ErrorKind::WouldBlock {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Creates `dir` if needed and checks that it is a directory.
pub fn usable_dir(dir: &Path) -> Result<(), DirError> {
    if let (Ok(link), Err(e)) = (std::fs::read_link(dir), std::fs::metadata(dir)) {
        let why = if e.kind() == std::io::ErrorKind::NotFound {
            "which does not exist".to_string()
        } else if e.raw_os_error() == Some(libc::ELOOP) {
            "which leads back to itself (a loop of symbolic links)".to_string()
        } else {
            format!("which cannot be followed ({e})")
        };
        return Err(DirError::Unwritable(format!(
            "{} is a symbolic link to {}, {why}",
            dir.display(),
            link.display()
        )));
    }
    if dir.exists() && !dir.is_dir() {
        return Err(DirError::Unwritable(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    // A missing parent that is a file says "Not a directory", a directory that cannot
    // be made says why.
    std::fs::create_dir_all(dir).map_err(|e| {
        let blocker = dir
            .ancestors()
            .skip(1)
            .find(|a| a.exists() && !a.is_dir() && !a.as_os_str().is_empty());
        match blocker {
            Some(b) => DirError::Unwritable(format!(
                "cannot create {}: {} is a file, not a directory",
                dir.display(),
                b.display()
            )),
            None => DirError::Unwritable(format!("cannot create {}: {e}", dir.display())),
        }
    })
}

fn unwritable(dir: &Path, e: &std::io::Error) -> DirError {
    DirError::Unwritable(format!("{} is not writable: {e}", dir.display()))
}

/// Removes the temporary files of saves that a killed process left (`.NAME.tmp-PID`):
/// with the lock held no other process is writing them.
fn remove_stale_temps(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        if crate::atomic::is_temp_name(&e.file_name().to_string_lossy()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Files of another framework's checkpoints in `dir`: TensorFlow's (`checkpoint`,
/// `*.index`, `*.data-?????-of-?????`, `saved_model.pb`), Keras's (`*.h5`, `*.keras`)
/// and PyTorch's (`*.pt`, `*.pth`). est writes none of them.
pub fn foreign_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .filter(|e| is_foreign(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

fn is_foreign(name: &str) -> bool {
    let ext = |e: &str| name.ends_with(e) && name.len() > e.len();
    name == "checkpoint"
        || name == "saved_model.pb"
        || name == "saved_model.pbtxt"
        || ext(".index")
        || (name.contains(".data-") && name.contains("-of-"))
        || ext(".h5")
        || ext(".keras")
        || ext(".pt")
        || ext(".pth")
}
