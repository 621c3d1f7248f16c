//! Data-parallel runs across processes: the ranks of one job, each a replica of the
//! Estimator, that agree on the program, share the train step's averages and the
//! evaluation's batches, and leave the writing to rank 0.
//!
//! ```text
//! Comm                    the seam: rank, size, all-gather, all-to-all
//!   threads::group(n)     ranks as threads of one process (tests, embedding)
//!   mpi::World            ranks as processes of an MPI job (`mpirun -n N estc train`)
//! Group                   what the runtime holds: a Comm, and the time its steps'
//!                         exchanges took
//!   .all_gather(bytes)    every rank's bytes, in rank order
//!   .sum(buf)             the element-wise sum over the ranks, added in rank order
//! ```
//!
//! Sums are deterministic: a reduce-scatter hands each rank one chunk of every rank's
//! buffer, which it adds in rank order (rank 0 first), and an all-gather returns the
//! summed chunks. The result has the same bits whatever the timing, and with one
//! shard per rank it equals the sum a single process makes over its shards in shard
//! order: `mpirun -n 2` with one shard each trains bit for bit as one process with two.

#[cfg(feature = "mpi")]
pub mod mpi;
pub mod threads;

use crate::tensor::Tensor;

/// The ranks of a job, as seen from one of them. Every rank calls the collective
/// methods in the same order with buffers of agreeing sizes.
pub trait Comm: Send {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// Every rank's bytes (of any length), in rank order.
    fn all_gather(&mut self, mine: &[u8]) -> Vec<Vec<u8>>;
    /// Sends `send[displ(j)..][..send_counts[j]]` to rank `j`; `recv` receives
    /// `recv_counts[i]` values from each rank `i`, in rank order.
    fn all_to_all_f32(
        &mut self,
        send: &[f32],
        send_counts: &[usize],
        recv: &mut [f32],
        recv_counts: &[usize],
    );
    /// Every rank's `mine` (`counts[i]` values from rank `i`), concatenated in rank
    /// order into `all`.
    fn all_gather_f32(&mut self, mine: &[f32], all: &mut [f32], counts: &[usize]);
}

/// A rank's place in a data-parallel run: its communicator.
pub struct Group {
    comm: Box<dyn Comm>,
    /// Time spent in train steps' exchanges (kept by the runtime's `Peers::reduce`).
    pub spent: std::time::Duration,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group(rank {} of {})", self.rank(), self.size())
    }
}

impl Group {
    pub fn new(comm: Box<dyn Comm>) -> Group {
        Group {
            comm,
            spent: std::time::Duration::ZERO,
        }
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// Whether this rank writes (checkpoints, summaries, predictions, logs): rank 0.
    pub fn chief(&self) -> bool {
        self.rank() == 0
    }

    /// Every rank's bytes, in rank order.
    pub fn all_gather(&mut self, mine: &[u8]) -> Vec<Vec<u8>> {
        self.comm.all_gather(mine)
    }

    /// Replaces `buf` by its element-wise sum over the ranks, added in rank order.
    pub fn sum(&mut self, buf: &mut [f32]) {
        if self.size() == 1 {
            return;
        }
        // (in pieces that MPI's `i32` counts and displacements can address)
        for piece in buf.chunks_mut(1 << 30) {
            self.sum_piece(piece);
        }
    }

    fn sum_piece(&mut self, buf: &mut [f32]) {
        let n = self.size();
        let me = self.rank();
        let counts = chunks(buf.len(), n);
        let c = counts[me];
        let mut recv = vec![0f32; c * n];
        self.comm
            .all_to_all_f32(buf, &counts, &mut recv, &vec![c; n]);
        let (acc, rest) = recv.split_at_mut(c);
        for part in rest.chunks_exact(c.max(1)).take(n - 1) {
            acc.iter_mut().zip(part).for_each(|(a, &x)| *a += x);
        }
        self.comm.all_gather_f32(acc, buf, &counts);
    }
}

/// `len` split into `n` chunks as evenly as possible, the longer ones first.
fn chunks(len: usize, n: usize) -> Vec<usize> {
    (0..n).map(|i| len / n + usize::from(i < len % n)).collect()
}

/// Tensors as bytes, for the all-gathers of evaluation and prediction: per tensor its
/// dtype, rank, dimensions and little-endian data.
pub fn encode(ts: &[Tensor], out: &mut Vec<u8>) {
    out.extend((ts.len() as u64).to_le_bytes());
    for t in ts {
        let code = crate::ir::DType::ALL
            .iter()
            .position(|&d| d == t.dtype)
            .unwrap_or(0);
        out.push(code as u8);
        out.push(t.shape().len() as u8);
        for &d in t.shape() {
            out.extend((d as u64).to_le_bytes());
        }
        let data = t.to_le_bytes();
        out.extend((data.len() as u64).to_le_bytes());
        out.extend(data);
    }
}

/// The little-endian `u64` at `*at` of `b`, moving `*at` past it; `None` past the end.
pub fn read_u64(b: &[u8], at: &mut usize) -> Option<u64> {
    let s = b.get(*at..at.checked_add(8)?)?;
    *at += 8;
    Some(u64::from_le_bytes(s.try_into().ok()?))
}

/// `n` bytes at `*at` of `b`, moving `*at` past them; `None` past the end.
pub fn read_bytes<'b>(b: &'b [u8], at: &mut usize, n: usize) -> Option<&'b [u8]> {
    let s = b.get(*at..at.checked_add(n)?)?;
    *at += n;
    Some(s)
}

/// The inverse of `encode`, reading from `*at` on; `None` for bytes it did not write.
pub fn decode(b: &[u8], at: &mut usize) -> Option<Vec<Tensor>> {
    let count = read_u64(b, at)? as usize;
    let mut out = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let head = read_bytes(b, at, 2)?;
        let dtype = *crate::ir::DType::ALL.get(head[0] as usize)?;
        let rank = head[1] as usize;
        let mut dims = Vec::with_capacity(rank);
        for _ in 0..rank {
            dims.push(read_u64(b, at)? as usize);
        }
        let len = read_u64(b, at)? as usize;
        let data = read_bytes(b, at, len)?;
        let ty = crate::ir::TensorType::new(dtype, dims);
        out.push(Tensor::from_le_bytes(&ty, data)?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_in_rank_order_on_every_rank() {
        // values whose sum depends on the order it is added in
        let data = |r: usize| -> Vec<f32> {
            (0..11)
                .map(|i| match (r + i) % 3 {
                    0 => 1e8,
                    1 => 1.0,
                    _ => -1e8 + i as f32,
                })
                .collect()
        };
        let n = 3;
        let want: Vec<f32> = (0..11)
            .map(|i| {
                let mut a = data(0)[i];
                for r in 1..n {
                    a += data(r)[i];
                }
                a
            })
            .collect();
        let got = threads::run(n, |mut g| {
            let mut b = data(g.rank());
            g.sum(&mut b);
            b
        });
        for b in got {
            assert_eq!(b, want);
        }
    }

    #[test]
    fn all_gather_gives_every_rank_all_bytes_in_rank_order() {
        let got = threads::run(3, |mut g| g.all_gather(&vec![g.rank() as u8 + 7; g.rank()]));
        for all in got {
            assert_eq!(all, vec![vec![], vec![8], vec![9, 9]]);
        }
    }

    #[test]
    fn tensors_round_trip() {
        use crate::ir::{DType, TensorType};
        let ts = vec![
            Tensor::from_f64(&TensorType::new(DType::F32, vec![2, 3]), vec![1.5; 6]),
            Tensor::from_f64(
                &TensorType::new(DType::I32, vec![4]),
                vec![-3.0, 0.0, 7.0, 9.0],
            ),
            Tensor::from_f64(&TensorType::new(DType::Bool, vec![]), vec![1.0]),
        ];
        let mut b = Vec::new();
        encode(&ts, &mut b);
        let mut at = 0;
        assert_eq!(decode(&b, &mut at), Some(ts));
        assert_eq!(at, b.len());
        assert_eq!(decode(&b[..b.len() - 1], &mut 0), None);
    }
}
