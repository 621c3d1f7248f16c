//! Ranks as the processes of an MPI job (rsmpi over the system's Open MPI), behind the
//! `mpi` cargo feature: `mpirun -n N estc train FILE`.

use super::{Comm, Group};
use mpi::datatype::{Partition, PartitionMut};
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Count;

/// The most bytes one all-gather round carries in all (MPI's counts and displacements
/// are `i32`).
const ROUND: usize = 1 << 30;

/// The MPI job this process is a rank of. MPI is finalised when it is dropped, which
/// waits for the other ranks: on a failure, `abort` instead.
pub struct World {
    // (dropped first: the communicator before the universe that finalises MPI)
    comm: SimpleCommunicator,
    _universe: mpi::environment::Universe,
}

// SAFETY: MPI is initialised at `Threading::Serialized` (checked in `init`), under
// which any thread may call MPI as long as no two calls overlap; every call goes
// through `&mut self` or happens before the `World` is shared.
unsafe impl Send for World {}

/// Whether this process was started by an MPI launcher (`mpirun`, `srun`), from the
/// variables they set; a process started otherwise does not initialise MPI.
pub fn launched() -> bool {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

impl World {
    /// Initialises MPI; `None` when it cannot be, or cannot serve calls from any thread.
    pub fn init() -> Option<World> {
        let (universe, level) =
            mpi::initialize_with_threading(mpi::environment::Threading::Serialized)?;
        if level < mpi::environment::Threading::Serialized {
            return None;
        }
        Some(World {
            comm: universe.world(),
            _universe: universe,
        })
    }

    pub fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    pub fn size(&self) -> usize {
        self.comm.size() as usize
    }

    /// Ends the whole job now with `code` (`MPI_Abort`): the other ranks may be
    /// waiting in a collective that this rank will not join.
    pub fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }

    /// The group of this job's ranks.
    pub fn into_group(self) -> Group {
        Group::new(Box::new(self))
    }
}

fn counts(xs: &[usize]) -> (Vec<Count>, Vec<Count>) {
    let c: Vec<Count> = xs.iter().map(|&x| x as Count).collect();
    let mut d = Vec::with_capacity(c.len());
    let mut at: Count = 0;
    for &x in &c {
        d.push(at);
        at += x;
    }
    (c, d)
}

impl Comm for World {
    fn rank(&self) -> usize {
        World::rank(self)
    }

    fn size(&self) -> usize {
        World::size(self)
    }

    fn all_gather(&mut self, mine: &[u8]) -> Vec<Vec<u8>> {
        let n = self.size();
        let mut lens = vec![0u64; n];
        self.comm
            .all_gather_into(&(mine.len() as u64), &mut lens[..]);
        let mut out: Vec<Vec<u8>> = lens
            .iter()
            .map(|&l| Vec::with_capacity(l as usize))
            .collect();
        // in rounds of at most ROUND bytes per rank, until every rank has sent all
        let mut sent = 0usize;
        let most = lens.iter().copied().max().unwrap_or(0) as usize;
        let round = (ROUND / n.max(1)).max(1);
        while sent < most {
            let part: Vec<usize> = lens
                .iter()
                .map(|&l| (l as usize).saturating_sub(sent).min(round))
                .collect();
            let (c, d) = counts(&part);
            let mut recv = vec![0u8; part.iter().sum()];
            let mut p = PartitionMut::new(&mut recv[..], c, &d[..]);
            let me = part[self.rank()];
            self.comm
                .all_gather_varcount_into(&mine[sent.min(mine.len())..][..me], &mut p);
            for (o, (&k, &at)) in out.iter_mut().zip(part.iter().zip(&d)) {
                o.extend_from_slice(&recv[at as usize..at as usize + k]);
            }
            sent += round;
        }
        out
    }

    fn all_to_all_f32(
        &mut self,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    ) {
        let (sc, sd) = counts(send_counts);
        let (rc, rd) = counts(recv_counts);
        let s = Partition::new(send, sc, sd);
        let mut r = PartitionMut::new(recv, rc, rd);
        self.comm.all_to_all_varcount_into(&s, &mut r);
    }

    fn all_gather_f32(&mut self, mine: &[f32], all: &mut [f32], counts_: &[usize]) {
        let (c, d) = counts(counts_);
        let mut r = PartitionMut::new(all, c, d);
        self.comm.all_gather_varcount_into(mine, &mut r);
    }
}

/// Ends the whole job now with `code` (`MPI_Abort` on the world), from anywhere.
pub fn abort(code: i32) -> ! {
    SimpleCommunicator::world().abort(code)
}
