//! `estc train`, `eval` and `predict` as one rank of an MPI job (`mpirun -n N`): the
//! launcher's variables say how many ranks there are; with the `mpi` cargo feature the
//! ranks join one group, and rank 0 alone prints results and progress.

#[cfg(feature = "mpi")]
use est::dist::mpi::World;
use est::dist::Group;

/// This rank and the number of ranks, once MPI has said (for the message on SIGTERM;
/// PMIx launchers do not put the size in the environment).
#[cfg(feature = "mpi")]
static PLACE: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();

/// This process's place in the job it was launched as part of.
pub struct Ranks {
    #[cfg(feature = "mpi")]
    world: Option<World>,
    rank: usize,
    size: usize,
}

/// The ranks of the job, from the launcher's variables (Open MPI's, then PMI's).
fn launched() -> (usize, usize) {
    let var = |names: &[&str]| {
        names
            .iter()
            .find_map(|n| std::env::var(n).ok()?.parse::<usize>().ok())
    };
    let size = var(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
        .unwrap_or(1)
        .max(1);
    let rank = var(&["OMPI_COMM_WORLD_RANK", "PMI_RANK"]).unwrap_or(0);
    (rank, size)
}

impl Ranks {
    /// Starts this process's part: alone, or (with the `mpi` feature) one rank of the
    /// job, with MPI initialised and SIGTERM turned into a message (status 2 when MPI
    /// cannot start).
    pub fn start() -> Result<Ranks, i32> {
        let (rank, size) = launched();
        // (PMIx launchers, such as `srun --mpi=pmix`, name the rank but not the size)
        #[cfg(feature = "mpi")]
        if size > 1 || est::dist::mpi::launched() {
            stop_message();
            let Some(world) = World::init() else {
                super::log("error: cannot initialise MPI (an MPI launcher started this process)");
                return Err(2);
            };
            let _ = PLACE.set((world.rank(), world.size()));
            return Ok(Ranks {
                rank: world.rank(),
                size: world.size(),
                world: Some(world),
            });
        }
        Ok(Ranks {
            #[cfg(feature = "mpi")]
            world: None,
            rank,
            size,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// The group of the job's ranks; `None` alone, or in a build without MPI.
    pub fn group(&mut self) -> Option<Group> {
        #[cfg(feature = "mpi")]
        if let Some(w) = self.world.take() {
            return Some(w.into_group());
        }
        None
    }

    /// Ends the whole job with `code`: this rank can no longer take part in it, and
    /// the others may be waiting for it.
    pub fn abort(&self, code: i32) -> i32 {
        #[cfg(feature = "mpi")]
        if self.size > 1 {
            est::dist::mpi::abort(code);
        }
        code
    }
}

/// What a rank says when the launcher stops it (another rank died or failed, or the
/// job was cancelled): SIGTERM is waited for by a thread of its own, which says so and
/// exits, instead of ending the process in silence.
#[cfg(feature = "mpi")]
fn stop_message() {
    // SAFETY: the signal mask is set before MPI or any other thread starts, so every
    // thread inherits it and SIGTERM reaches only `sigwait` below; the thread exits
    // the process with `_exit`, which is what a signal's default action does.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return;
        }
        std::thread::spawn(move || {
            let mut sig = 0;
            if libc::sigwait(&set, &mut sig) == 0 {
                let (rank, size) = PLACE.get().copied().unwrap_or_else(launched);
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "{}", format_args!(
                    "est: rank {rank} of {size} was stopped by the MPI launcher: another rank ended without finishing (it failed or was killed), or the job was cancelled; run the same command again to resume from the last checkpoint"
                ));
                libc::_exit(143);
            }
        });
    }
}
