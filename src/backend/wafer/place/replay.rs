//! The samples' part of the estimated step (the updates after it: `Sizer::step`): the
//! 1F1B schedule replayed kernel by kernel (`replay`), each kernel a server of its
//! measured cycles a sample in each pass, in the order its pipeline admits its passes
//! (`pipeline::Pipeline::admits`), each pass waiting for what it reads: a sample's
//! forward for the kernel before's, its backward for the input gradient of the next
//! kernel that has a backward pass. Round trips between kernels of near-equal windows,
//! the fill and the drain, and the barriers of the batch (a window of the whole batch)
//! all follow from the order, with no formula of their own.

/// One kernel of a replay: its cycles a sample forward and backward, its window (0 for
/// a kernel with no backward pass: forwards alone), and the cycles into its backward
/// at which it sends the input gradient on (a layer's first half, before its filter's
/// gradient; a vector kernel's whole).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Server {
    pub(super) fwd: u64,
    pub(super) bwd: u64,
    pub(super) window: u32,
    pub(super) sends: u64,
}

/// A pass of one sample at one kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    F(u32),
    B(u32),
}

/// The passes of a kernel of `window` (0: forwards alone) in the order it runs them
/// over `batch` samples: `window` forwards, then a backward and a forward in turn, then
/// the last backwards.
fn order(window: u32, batch: u32) -> Vec<Pass> {
    if window == 0 {
        return (0..batch).map(Pass::F).collect();
    }
    let (mut f, mut b) = (0, 0);
    let mut out = Vec::with_capacity(2 * batch as usize);
    while b < batch {
        if f < batch && f - b < window {
            out.push(Pass::F(f));
            f += 1;
        } else {
            out.push(Pass::B(b));
            b += 1;
        }
    }
    out
}

/// The cycles of a step of `batch` samples through the chain `kernels` (first to last),
/// the last one with a backward pass taking each sample's gradient from its own
/// forward (the loss's).
pub(super) fn replay(kernels: &[Server], batch: u32) -> u64 {
    let n = kernels.len();
    let b = batch as usize;
    let orders: Vec<Vec<Pass>> = (kernels.iter()).map(|k| order(k.window, batch)).collect();
    // each sample's forward end and backward send, per kernel (`None` until run)
    let mut fwd_end: Vec<Vec<Option<u64>>> = vec![vec![None; b]; n];
    let mut sent: Vec<Vec<Option<u64>>> = vec![vec![None; b]; n];
    // the next kernel after each that has a backward pass
    let next_back: Vec<Option<usize>> = (0..n)
        .map(|k| (k + 1..n).find(|&j| kernels[j].window > 0))
        .collect();
    let mut at = vec![0usize; n];
    let mut free = vec![0u64; n];
    let mut end = 0;
    loop {
        let mut progressed = false;
        for k in 0..n {
            while let Some(&pass) = orders[k].get(at[k]) {
                let ready = match pass {
                    Pass::F(s) => match k {
                        0 => Some(0),
                        _ => fwd_end[k - 1][s as usize],
                    },
                    Pass::B(s) => match next_back[k] {
                        Some(j) => sent[j][s as usize],
                        None => fwd_end[k][s as usize],
                    },
                };
                let Some(ready) = ready else { break };
                let start = free[k].max(ready);
                let kr = &kernels[k];
                match pass {
                    Pass::F(s) => {
                        free[k] = start + kr.fwd;
                        fwd_end[k][s as usize] = Some(free[k]);
                    }
                    Pass::B(s) => {
                        free[k] = start + kr.bwd;
                        sent[k][s as usize] = Some(start + kr.sends.min(kr.bwd));
                    }
                }
                end = end.max(free[k]);
                at[k] += 1;
                progressed = true;
            }
        }
        if !progressed {
            // every kernel done (the orders cannot wait on each other in a cycle: a
            // backward waits only for kernels after it, a forward for the one before)
            return end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(fwd: u64, bwd: u64, window: u32) -> Server {
        Server {
            fwd,
            bwd,
            window,
            sends: bwd,
        }
    }

    #[test]
    fn passes_run_in_the_pipelines_order() {
        let s = |o: Vec<Pass>| {
            o.iter()
                .map(|p| match p {
                    Pass::F(_) => 'F',
                    Pass::B(_) => 'B',
                })
                .collect::<String>()
        };
        assert_eq!(s(order(2, 5)), "FFBFBFBFBB");
        assert_eq!(s(order(4, 4)), "FFFFBBBB");
        assert_eq!(s(order(0, 3)), "FFF");
    }

    #[test]
    fn one_kernel_runs_its_samples_back_to_back() {
        // a loss of window 1: F0 B0 F1 B1 F2 B2
        assert_eq!(replay(&[server(3, 2, 1)], 3), 15);
    }

    #[test]
    fn a_chain_goes_at_its_slowest_kernels_pace_after_the_fill() {
        // a layer of window 4 before a loss of window 1: the layer's forwards of
        // samples 0..3 (10 each), the loss's of sample 0 at 10..11 and its backward at
        // 11..12, the layer's backward of 0 at 40 (after its 4 forwards), ...
        let k = [server(10, 10, 4), server(1, 1, 1)];
        let step = replay(&k, 8);
        // every pass of the layer back to back: 16 passes of 10
        assert_eq!(step, 160);
        // a slow loss paces the layer's backwards instead
        let k = [server(1, 1, 4), server(20, 20, 1)];
        // the loss: F0 at 1..21, B0 21..41, F1 41..61, ... its 8 samples 320 cycles
        // from cycle 1, and the layer's last backward right after the loss's
        assert_eq!(replay(&k, 8), 1 + 320 + 1);
    }

    #[test]
    fn equal_windows_wait_for_the_round_trip() {
        // two layers and a loss, the first two windows equal (capped): the first
        // layer's forward of sample 2 waits for its backward of 0, which waits for the
        // second layer's, which waits for the loss
        let capped = [server(5, 5, 2), server(5, 5, 2), server(5, 5, 1)];
        let stepped = [server(5, 5, 4), server(5, 5, 2), server(5, 5, 1)];
        assert!(replay(&capped, 16) > replay(&stepped, 16));
        // a gradient sent halfway through a layer's backward shortens the trip
        let mut half = capped;
        half[1].sends = 2;
        assert!(replay(&half, 16) < replay(&capped, 16));
    }

    #[test]
    fn a_window_of_the_batch_is_a_barrier() {
        // every forward of the batch at the first kernel before any backward: the
        // second kernel's backwards run after its forwards, then the first's
        let k = [server(2, 2, 4), server(3, 3, 4), server(1, 1, 1)];
        // kernel 1 runs F0..F3 (2..14) then B0..B3 (14..26): its backwards start only
        // after its last forward, though the loss sent back sample 0's gradient at 7;
        // the first kernel's last backward then ends at 28
        assert_eq!(replay(&k, 4), 28);
    }
}
