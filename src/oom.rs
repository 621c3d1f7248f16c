//! Running out of memory ends the process with a diagnostic, not an abort: `Guard`, a
//! global allocator over the system's, answers a large allocation that fails (under
//! `ulimit -v`, or a cgroup's limit, as batch schedulers set) by printing E0602 and
//! exiting with status 1, where Rust's default would print a bare line and abort
//! (SIGABRT, status 134). The places where a user's program decides the size of an
//! allocation (variables, batches, a kernel's result) reserve it fallibly first and
//! report a spanned diagnostic; this is the net under everything else (a checkpoint's
//! bytes, a device's variables read out). What a killed run leaves is what `kill -9`
//! leaves: the last checkpoint, whole.
//!
//! `estc` installs it (`#[global_allocator]` in `main.rs`); a program embedding est may
//! do the same.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Allocations at least this large that fail are reported; smaller ones fail as Rust's
/// do (there is then no memory left to say anything with).
const REPORTED: usize = 1 << 20;

static JSON: AtomicBool = AtomicBool::new(false);

std::thread_local! {
    /// Whether this thread is in a fallible reservation (`try_reserve`), whose failure
    /// the caller handles.
    static FALLIBLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `v.try_reserve_exact(n)`, whose failure is the caller's to report (the guard lets it
/// fail instead of ending the process).
pub fn try_reserve<T>(v: &mut Vec<T>, n: usize) -> Result<(), std::collections::TryReserveError> {
    FALLIBLE.with(|f| f.set(true));
    let r = v.try_reserve_exact(n);
    FALLIBLE.with(|f| f.set(false));
    r
}

/// Whether the report is a JSON line on standard output (`--message-format json`)
/// rather than text on standard error.
pub fn report_as_json(json: bool) {
    JSON.store(json, Ordering::Relaxed);
}

/// The system's allocator, reporting a failed large allocation (see the module).
pub struct Guard;

// SAFETY: every call is forwarded to `System` with the same arguments; a failure either
// returns what `System` returned or ends the process without unwinding.
unsafe impl GlobalAlloc for Guard {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        checked(System.alloc(layout), layout.size())
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        checked(System.alloc_zeroed(layout), layout.size())
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        checked(System.realloc(ptr, layout, new_size), new_size)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

fn checked(p: *mut u8, size: usize) -> *mut u8 {
    if p.is_null() && size >= REPORTED && !FALLIBLE.with(|f| f.get()) {
        out_of_memory(size);
    }
    p
}

/// Prints E0602 for a failed allocation of `size` bytes and exits with status 1. It
/// allocates nothing: the message is formatted into a buffer on the stack.
fn out_of_memory(size: usize) -> ! {
    let mut buf = [0u8; 1024];
    let mut w = std::io::Cursor::new(&mut buf[..]);
    let json = JSON.load(Ordering::Relaxed);
    let limit = address_space_limit();
    let _ = if json {
        write!(
            w,
            "{{\"code\":\"E0602\",\"severity\":\"error\",\"message\":\"out of memory: an allocation of {} failed",
            Human(size as u64)
        )
    } else {
        write!(
            w,
            "E0602\n\n  x out of memory: an allocation of {} failed",
            Human(size as u64)
        )
    };
    if let Some(l) = limit {
        let _ = write!(
            w,
            "; this process may use at most {} (`ulimit -v`)",
            Human(l)
        );
    }
    let help = "run with more memory, or make the model, its batch or its input's elements smaller; `estc check --memory-limit SIZE` estimates what a program needs";
    let _ = if json {
        writeln!(
            w,
            "\",\"help\":\"{help}\",\"label\":null,\"file\":null,\"line\":null,\"column\":null,\"end_line\":null,\"end_column\":null,\"related\":[],\"fixes\":[]}}"
        )
    } else {
        writeln!(w, "\n  help: {help}\n")
    };
    let n = w.position() as usize;
    let fd = if json { 1 } else { 2 };
    // SAFETY: writing a buffer this function owns to a standard stream, then ending the
    // process without running destructors or unwinding (which an allocator must not).
    unsafe {
        libc::write(fd, buf.as_ptr().cast(), n);
        libc::_exit(1)
    }
}

/// `RLIMIT_AS` when it is set (`ulimit -v`).
fn address_space_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

/// A byte count for people, without allocating.
struct Human(u64);

impl std::fmt::Display for Human {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = self.0 as f64;
        if b >= (1u64 << 30) as f64 {
            write!(f, "{:.1} GiB", b / (1u64 << 30) as f64)
        } else {
            write!(f, "{:.1} MiB", b / (1u64 << 20) as f64)
        }
    }
}
