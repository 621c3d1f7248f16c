//! The schedule of a train step: one forward, one backward (1F1B).
//!
//! Samples stream through the kernels as a pipeline. A kernel that has a forward and a
//! backward pass stashes what its backward pass reads of a sample (a layer's input, an
//! activation's mask) from the sample's forward until its backward: a stash of `window`
//! slots, sample `s` in slot `s mod window`, not one per sample of the step. So a PE runs
//! its passes in a fixed order (`Pipeline`): `window` forwards, then a backward and a
//! forward in turn, then the last `window` backwards:
//!
//! ```text
//! F0 F1 .. F(w-1)  B0 Fw  B1 F(w+1) ..  B(n-w) .. B(n-1)
//! ```
//!
//! The weight gradients still sum every sample of the step, in the samples' order, and
//! the update runs once after the step's last backward, so a step computes what the
//! interpreter does. A window of the whole batch is the schedule of every forward before
//! any backward.
//!
//! **Why the order is fixed.** Every PE of a kernel runs the same sequence, so no PE
//! waits, inside one pass, for a neighbour that chose the other pass (a row's chain of
//! partial sums forward, a column's backward: with a free choice, a PE inside a forward
//! waiting for its west neighbour's partial sums, which waits inside a backward for the
//! output gradient that the first PE's full queue holds back, is a deadlock).
//!
//! **Windows along the chain** (`plan`). The kernel that ends the chain (the loss, which
//! computes its gradient in its forward pass) has a window of 1: it sends each sample's
//! gradient back as soon as it has it. Each kernel before it has `WINDOW_STEP` more
//! than the kernel after it (as a 1F1B pipeline's stages have one more), up to the
//! batch: so its backward of sample `s` does not wait for the next kernel's, which
//! comes sooner. The next kernel's input gradient of sample `s` then arrives while this
//! kernel still runs up to `w - w'` forwards (its window and the next one's), and a PE
//! cannot take it meanwhile: so it keeps a FIFO of that many samples' output gradients
//! in SRAM (`Program::fifos`), into which they arrive while it runs those forwards. With
//! it, each kernel's next pass needs only what was sent before it, and a step cannot
//! deadlock. A window never grows along the chain: the next kernel would wait for
//! forwards this one runs only after a backward that waits for it.
//!
//! **A dealer's returns.** A loss that runs as `R` replicas has a window of `2R` at its
//! dealer: the dealer's backward tasks are one per replica, taken in turn, each passing
//! a sample's gradient on toward the layers, and it deals a replica a sample only after
//! its gradient of two samples before came back. A replica keeps a FIFO of the sample
//! that waits while it computes one, and the dealer one of two gradients per replica,
//! so neither waits for the other's turn.

use super::isa::TaskId;
use std::fmt;

/// The order a PE runs its passes in, within each step of `samples` samples (see the
/// module's doc).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pipeline {
    /// The forward pass's data task.
    pub forward: TaskId,
    /// The backward pass's data tasks, run in turn (one, or a dealer's one per replica).
    pub backward: Vec<TaskId>,
    /// The most samples between a forward and its backward: the stash's slots.
    pub window: u32,
    pub samples: u32,
}

/// Where a PE is in its pipeline's step: forwards and backwards started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Passes {
    pub forwards: u32,
    pub backwards: u32,
}

impl Pipeline {
    /// Whether task `id` may start now; `true` for a task not in the pipeline.
    pub fn admits(&self, id: TaskId, at: Passes) -> bool {
        let Passes {
            forwards: f,
            backwards: b,
        } = at;
        if id == self.forward {
            return f < self.samples && f - b < self.window;
        }
        let Some(turn) = self.backward.iter().position(|&t| t == id) else {
            return true;
        };
        // a backward waits for the window to fill (or the forwards to end)
        let ready = f - b >= self.window || f == self.samples;
        b < f && ready && turn == b as usize % self.backward.len()
    }

    /// `at` after task `id` started (back to the step's start after its last backward).
    pub fn started(&self, id: TaskId, mut at: Passes) -> Passes {
        if id == self.forward {
            at.forwards += 1;
        } else if self.backward.contains(&id) {
            at.backwards += 1;
            if at.backwards == self.samples {
                at = Passes::default();
            }
        }
        at
    }

    /// Why it cannot run, if it cannot: an empty window or step, no backward task, the
    /// forward task among the backward ones, or a task the program lacks.
    pub fn check(&self, known: impl Fn(TaskId) -> bool) -> Result<(), String> {
        if self.window == 0 || self.samples == 0 {
            return Err("a pipeline of no samples".into());
        }
        if self.backward.is_empty() || self.backward.contains(&self.forward) {
            return Err("a pipeline's backward tasks must be others than its forward one".into());
        }
        match std::iter::once(&self.forward)
            .chain(&self.backward)
            .find(|&&t| !known(t))
        {
            Some(t) => Err(format!("the pipeline's task {t} does not exist")),
            None => Ok(()),
        }
    }
}

impl fmt::Display for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let back: Vec<String> = self.backward.iter().map(|t| format!("t{t}")).collect();
        write!(
            f,
            "pipeline: forward t{}, backward {} in turn, window {} of {} samples",
            self.forward,
            back.join(" "),
            self.window,
            self.samples
        )
    }
}

/// How many samples a kernel's window holds beyond the next kernel's: one for the
/// sample it runs forward while the next one sends a gradient back, and two for the
/// time a sample takes through the next kernel's chains and back, which in a wide
/// layer of light blocks is longer than its period. (Measured, `cargo bench --bench
/// wafer`: with 1, the digits MLP's step took 42% longer than with 3, which no program
/// there loses to; with 5, the unrolled RNN's took 7% longer.)
pub const WINDOW_STEP: u32 = 3;

/// How wide windows may grow: `step` samples more than the next kernel's, at most `cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Widths {
    pub step: u32,
    pub cap: u32,
}

impl Widths {
    /// As wide as keeps every kernel busy.
    pub const WIDEST: Widths = Widths {
        step: WINDOW_STEP,
        cap: u32::MAX,
    };

    /// Narrower windows, for when memory was short with these, whose widest held
    /// `widest` samples: a smaller step first (some latency exposed), then a lower cap
    /// (the kernels before the cap's wait for each sample's way back); `None` at one
    /// sample.
    pub fn narrower(self, widest: u32) -> Option<Widths> {
        // (a kernel at or before a barrier keeps the batch whatever the cap: the cap
        // falls from where it was)
        let widest = widest.min(self.cap);
        if self.step > 1 {
            Some(Widths {
                step: self.step - 1,
                ..self
            })
        } else if widest > 1 {
            Some(Widths {
                step: 1,
                cap: (widest * 3 / 4).min(widest - 1),
            })
        } else {
            None
        }
    }
}

/// A kernel whose samples read a statistic of the whole batch (`form::statistics`):
/// none of its backward passes can start before its last forward, so it and every
/// kernel before it keep the whole batch.
pub const BARRIER: u32 = u32::MAX;

/// The windows of a chain of kernels, first to last: `Some(end)` for a kernel that
/// ends the chain (its window: 1, or a dealer's samples out), `Some(0)` for a kernel
/// with a backward pass (its window is `widths.step` more than the next one's),
/// `Some(BARRIER)` for one that keeps the batch, as every kernel before it does,
/// `None` for a kernel that has none; each at most the batch and `widths.cap` (but
/// at or before a barrier). And each kernel's FIFO, in samples: its window less the
/// next one's.
pub fn plan(chain: &[Option<u32>], batch: u32, widths: Widths) -> Vec<(u32, u32)> {
    let top = batch.min(widths.cap).max(1);
    let mut out = vec![(0, 0); chain.len()];
    let mut next: Option<u32> = None;
    let mut whole = false;
    for (k, c) in chain.iter().enumerate().rev() {
        let Some(end) = *c else { continue };
        whole |= end == BARRIER;
        let w = match (end, next) {
            _ if whole => batch.max(1),
            (0, Some(n)) => (n + widths.step).min(top),
            (0, None) => 1,
            (e, _) => e.min(top),
        };
        out[k] = (w, next.map_or(0, |n| w.saturating_sub(n)));
        next = Some(w);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The order its tasks run in when every wavelet is there at once.
    fn order(p: &Pipeline) -> Vec<String> {
        let mut at = Passes::default();
        let mut out = Vec::new();
        for _ in 0..2 * p.samples {
            let t = std::iter::once(p.forward)
                .chain(p.backward.iter().copied())
                .filter(|&t| p.admits(t, at))
                .min_by_key(|&t| if p.forward == t { 1 } else { 0 })
                .unwrap();
            out.push(if t == p.forward { "F" } else { "B" }.to_string());
            at = p.started(t, at);
        }
        assert_eq!(at, Passes::default(), "the step ends where it began");
        out
    }

    fn pipe(window: u32, samples: u32) -> Pipeline {
        Pipeline {
            forward: 0,
            backward: vec![1],
            window,
            samples,
        }
    }

    #[test]
    fn passes_alternate_after_the_window_fills() {
        assert_eq!(order(&pipe(2, 5)).concat(), "FFBFBFBFBB");
        assert_eq!(order(&pipe(1, 3)).concat(), "FBFBFB");
        // a window of the batch: every forward, then every backward
        assert_eq!(order(&pipe(4, 4)).concat(), "FFFFBBBB");
        assert_eq!(order(&pipe(9, 3)).concat(), "FFFBBB");
    }

    #[test]
    fn a_dealer_takes_its_returns_in_turn() {
        let p = Pipeline {
            forward: 4,
            backward: vec![5, 6],
            window: 2,
            samples: 4,
        };
        let mut at = Passes::default();
        assert!(p.admits(4, at) && !p.admits(5, at));
        at = p.started(4, at);
        assert!(
            !p.admits(5, at) && p.admits(4, at),
            "the window fills first"
        );
        at = p.started(4, at);
        // sample 0's gradient comes back from replica 0, not 1
        assert!(!p.admits(4, at), "a third sample waits for a return");
        assert!(p.admits(5, at) && !p.admits(6, at));
        at = p.started(5, at);
        assert!(p.admits(4, at) && !p.admits(6, at));
        at = p.started(4, at);
        assert!(p.admits(6, at) && !p.admits(5, at));
        assert_eq!(p.check(|t| t < 7), Ok(()));
        assert!(p.check(|t| t < 6).unwrap_err().contains("task 6"));
    }

    #[test]
    fn windows_shrink_toward_the_loss() {
        let (b, e) = (Some(0), Some(1));
        let w = Widths::WIDEST;
        assert_eq!(
            plan(&[b, b, None, b, e], 128, w),
            vec![(10, 3), (7, 3), (0, 0), (4, 3), (1, 0)]
        );
        // a dealer of 8 samples out ends the chain
        assert_eq!(
            plan(&[b, b, Some(8)], 128, w),
            vec![(14, 3), (11, 3), (8, 0)]
        );
        // capped by the batch, or by memory: equal windows need no FIFO
        assert_eq!(
            plan(&[b, b, b, e], 2, w),
            vec![(2, 0), (2, 0), (2, 1), (1, 0)]
        );
        let w = Widths { step: 1, cap: 3 };
        assert_eq!(plan(&[b, b, Some(4)], 128, w), vec![(3, 0), (3, 0), (3, 0)]);
        assert_eq!(plan(&[b, b, e], 128, w), vec![(3, 1), (2, 1), (1, 0)]);
        // a barrier keeps the batch, and so does every kernel before it, whatever
        // the cap; those after it are as before
        let s = Some(BARRIER);
        assert_eq!(
            plan(&[b, None, s, b, e], 16, w),
            vec![(16, 0), (0, 0), (16, 14), (2, 1), (1, 0)]
        );
    }

    #[test]
    fn windows_narrow_by_step_then_by_cap() {
        let mut w = Widths::WIDEST;
        let mut seen = Vec::new();
        while let Some(n) = w.narrower(9.min(w.cap)) {
            seen.push((n.step, n.cap));
            w = n;
        }
        assert_eq!(
            seen,
            [
                (2, u32::MAX),
                (1, u32::MAX),
                (1, 6),
                (1, 4),
                (1, 3),
                (1, 2),
                (1, 1)
            ]
        );
    }
}
