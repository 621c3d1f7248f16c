//! The thread pool a device runs its kernels on: `threads - 1` workers plus the calling
//! thread, one pool per device (so per run: the runtime owns it through its device, and
//! no library underneath starts threads of its own).
//!
//! `run(tasks, f)` calls `f(0)`, ..., `f(tasks - 1)`, task `i` on thread `i % threads`,
//! and returns when all are done. Work is split statically by the caller (each task a
//! fixed range), so which thread computes which element never depends on timing, and a
//! split that gives every output element to one task gives the same bits at any thread
//! count.
//!
//! A dispatch costs about a microsecond while the workers are awake: after a task they
//! spin for a short while (kernels of one step follow each other closely), then park on
//! a condition variable, leaving the cores to the input pipeline between steps; a step
//! wakes them as it starts (`wake`), ahead of its first kernel.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The work (multiply-adds, or elements moved or scanned) below which a job runs on
/// one thread: a dispatch to the pool costs about as much as this much work.
pub const MIN_SPLIT: usize = 1 << 15;

/// How long an idle worker spins before it parks.
const SPIN: Duration = Duration::from_micros(100);

type Job = *const (dyn Fn(usize) + Sync);

struct Shared {
    /// Bumped for every job; a worker runs the job of each epoch it sees.
    epoch: AtomicU64,
    /// The current job: set before `epoch` is bumped, valid until `pending` is 0.
    job: UnsafeCell<Option<Job>>,
    tasks: AtomicUsize,
    /// The threads running the job (task `i` on thread `i % stride`).
    stride: AtomicUsize,
    /// Workers that have not finished the current job.
    pending: AtomicUsize,
    /// Workers parked on `wake`.
    parked: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    stop: AtomicBool,
}

// SAFETY: `job` is written only by the pool's owner while no worker reads it (between
// jobs: every worker has finished the previous one), and read by workers only after
// they see the new epoch (Acquire after the owner's Release).
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct Pool {
    threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool running tasks on `threads` threads (the caller and `threads - 1`
    /// workers; at least 1).
    pub fn new(threads: usize) -> Pool {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            tasks: AtomicUsize::new(0),
            stride: AtomicUsize::new(1),
            pending: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let mut workers = Vec::new();
        for id in 1..threads {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("est-worker-{id}"))
                .spawn(move || worker(&s, id));
            match spawned {
                Ok(h) => workers.push(h),
                // fewer threads than asked: the tasks of the missing ones run on the
                // caller (see `run`)
                Err(_) => break,
            }
        }
        Pool {
            threads: workers.len() + 1,
            shared,
            workers,
        }
    }

    /// The threads that run tasks (the caller included).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Wakes parked workers, so that they spin (for `SPIN`) ready for the next job:
    /// called as a step starts, it hides their wake-up behind the feeding of the
    /// batch instead of leaving it to the step's first kernel. fc_mnist at two
    /// threads: +2.5% steps/s, the median of 7 alternating pairs of runs (5 of them
    /// faster), on a machine whose speed swung from 595 to 929 steps/s meanwhile.
    pub fn wake(&self) {
        let s = &*self.shared;
        if self.threads > 1 && s.parked.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.wake.notify_all();
        }
    }

    /// Runs `f(lo, hi)` over a static split of `0..len` into one part per thread, or
    /// as one part on this thread when `len` is below `min` (too little work to repay
    /// a dispatch, as `MIN_SPLIT`).
    pub fn split(&self, len: usize, min: usize, f: &(dyn Fn(usize, usize) + Sync)) {
        let parts = if len < min { 1 } else { self.threads };
        self.run(parts, &|i| {
            let (lo, hi) = part(len, parts, i);
            f(lo, hi)
        });
    }

    /// Runs `f(i)` for every `i < tasks`; task `i` on thread `i % threads`.
    pub fn run(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if self.threads == 1 || tasks <= 1 {
            (0..tasks).for_each(f);
            return;
        }
        let s = &*self.shared;
        // SAFETY: no worker reads `job` now (the previous job is finished: `pending`
        // was 0 when the last `run` returned), and `f` outlives this call, which
        // returns only after every worker has finished with it.
        unsafe {
            let erased: Job = std::mem::transmute::<&(dyn Fn(usize) + Sync), Job>(f);
            *s.job.get() = Some(erased);
        }
        s.tasks.store(tasks, Ordering::Relaxed);
        s.stride.store(self.threads, Ordering::Relaxed);
        s.pending.store(self.threads - 1, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.parked.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.wake.notify_all();
        }
        let mut t = 0;
        while t < tasks {
            f(t);
            t += self.threads;
        }
        let started = Instant::now();
        while s.pending.load(Ordering::Acquire) != 0 {
            if started.elapsed() < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

fn worker(s: &Shared, id: usize) {
    let mut seen = 0u64;
    loop {
        // wait for a new epoch: spin, then park
        let mut started = Instant::now();
        loop {
            if s.stop.load(Ordering::Acquire) {
                return;
            }
            if s.epoch.load(Ordering::Acquire) != seen {
                break;
            }
            if started.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let g = s.lock.lock().unwrap_or_else(|p| p.into_inner());
            s.parked.fetch_add(1, Ordering::SeqCst);
            // re-check under the lock: `run` notifies under it after bumping the epoch
            let g = if s.epoch.load(Ordering::SeqCst) == seen && !s.stop.load(Ordering::SeqCst) {
                s.wake.wait(g).unwrap_or_else(|p| p.into_inner())
            } else {
                g
            };
            s.parked.fetch_sub(1, Ordering::SeqCst);
            drop(g);
            // woken (by a job, or by `wake` ahead of one): spin again before parking
            started = Instant::now();
        }
        seen = s.epoch.load(Ordering::Acquire);
        // SAFETY: the job was set before the epoch was bumped and stays valid until
        // this worker decrements `pending`.
        if let Some(job) = unsafe { *s.job.get() } {
            let (tasks, threads) = (
                s.tasks.load(Ordering::Relaxed),
                s.stride.load(Ordering::Relaxed),
            );
            let f = unsafe { &*job };
            let mut t = id;
            while t < tasks {
                f(t);
                t += threads;
            }
        }
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// The bounds of part `i` of `n` equal parts of `0..len`.
pub fn part(len: usize, n: usize, i: usize) -> (usize, usize) {
    (len * i / n, len * (i + 1) / n)
}

/// The most threads a pool runs (`--threads`, `EST_NUM_THREADS`): beyond a few per core
/// they only cost, and tens of thousands exhaust the process's memory for their stacks.
pub const MAX_THREADS: usize = 1024;

/// The thread count `EST_NUM_THREADS` asks for, if it is set: an error saying what is
/// wrong when it is not a count from 1 to `MAX_THREADS` (`estc` stops with it before
/// running anything).
pub fn env_threads() -> Result<Option<usize>, String> {
    let Some(v) = std::env::var_os("EST_NUM_THREADS") else {
        return Ok(None);
    };
    let text = v.to_string_lossy();
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(Some(n)),
        _ => Err(format!(
            "EST_NUM_THREADS={text:?} is not a thread count from 1 to {MAX_THREADS}"
        )),
    }
}

/// The threads a run uses when none is asked for: `EST_NUM_THREADS`, else every core
/// (at most `MAX_THREADS`). A value `env_threads` refuses counts as unset here: `estc`
/// has refused it already, and a program embedding est may check it with
/// `env_threads`.
pub fn default_threads() -> usize {
    env_threads().ok().flatten().unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        cores.min(MAX_THREADS)
    })
}
