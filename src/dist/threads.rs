//! Ranks as threads of one process: a `Comm` over shared memory, for tests and for
//! programs that run replicas side by side without MPI.

use super::{Comm, Group};
use std::sync::{Arc, Barrier, Mutex};

/// What the ranks post to each other: `posts[from][to]`.
struct Board {
    posts: Mutex<Vec<Vec<Vec<u8>>>>,
    barrier: Barrier,
}

/// One rank of a group of threads.
pub struct Rank {
    rank: usize,
    size: usize,
    board: Arc<Board>,
}

/// `n` ranks, to hand one to each thread (rank `i` at index `i`).
pub fn group(n: usize) -> Vec<Group> {
    let board = Arc::new(Board {
        posts: Mutex::new(vec![vec![Vec::new(); n]; n]),
        barrier: Barrier::new(n),
    });
    (0..n)
        .map(|rank| {
            Group::new(Box::new(Rank {
                rank,
                size: n,
                board: board.clone(),
            }))
        })
        .collect()
}

/// Runs `f` on `n` ranks, each on its own thread; their results in rank order.
pub fn run<T: Send>(n: usize, f: impl Fn(Group) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let handles: Vec<_> = group(n)
            .into_iter()
            .map(|g| {
                let f = &f;
                s.spawn(move || f(g))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(v) => v,
                Err(p) => std::panic::resume_unwind(p),
            })
            .collect()
    })
}

impl Rank {
    /// Sends `parts[j]` to rank `j`; what each rank sent this one, in rank order.
    fn exchange(&mut self, parts: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
        {
            let mut posts = self.board.posts.lock().unwrap_or_else(|p| p.into_inner());
            posts[self.rank] = parts;
        }
        self.board.barrier.wait();
        let got = {
            let posts = self.board.posts.lock().unwrap_or_else(|p| p.into_inner());
            posts.iter().map(|from| from[self.rank].clone()).collect()
        };
        // nobody posts again before everyone has read
        self.board.barrier.wait();
        got
    }
}

fn to_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn put_f32s(b: &[u8], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(b.chunks_exact(4)) {
        *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

impl Comm for Rank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_gather(&mut self, mine: &[u8]) -> Vec<Vec<u8>> {
        let n = self.size();
        self.exchange(vec![mine.to_vec(); n])
    }

    fn all_to_all_f32(
        &mut self,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    ) {
        let mut at = 0;
        let parts = send_counts
            .iter()
            .map(|&c| {
                let p = to_bytes(&send[at..at + c]);
                at += c;
                p
            })
            .collect();
        let got = self.exchange(parts);
        let mut at = 0;
        for (b, &c) in got.iter().zip(recv_counts) {
            put_f32s(b, &mut recv[at..at + c]);
            at += c;
        }
    }

    fn all_gather_f32(&mut self, mine: &[f32], all: &mut [f32], counts: &[usize]) {
        let got = self.all_gather(&to_bytes(mine));
        let mut at = 0;
        for (b, &c) in got.iter().zip(counts) {
            put_f32s(b, &mut all[at..at + c]);
            at += c;
        }
    }
}
