//! The only cycle formulas: what a vector operation and a fabric stream cost on a
//! fabric (`../shared/wafer/design.md` §1.2). The simulator times every operation with
//! them, and the kernels' cost models (which size the rectangles) are built from them,
//! so that the two cannot disagree about a primitive.

use super::fabric::Fabric;
use super::isa::{Colour, Dsd, Instr, Program, Src, Task, TaskId, Trigger, VecOp};

/// Bytes per SRAM word (f32).
pub const WORD: u32 = 4;

/// Bytes of an element of a half-precision operation's operands (f16, bf16).
pub const HALF: u32 = 2;

/// Cycles per step of `lanes` elements of `bytes` each of an operation reading `reads`
/// vectors from SRAM and writing `writes` (0 or 1): one, or more when the SRAM ports
/// cannot feed it.
pub fn cycles_per_step(f: &Fabric, (lanes, bytes): (u32, u32), reads: u32, writes: u32) -> u64 {
    let read = (reads * lanes * bytes).div_ceil(f.sram_read_bytes);
    let write = (writes * lanes * bytes).div_ceil(f.sram_write_bytes);
    u64::from(read.max(write).max(1))
}

/// The elements a step of `op` takes, and their bytes: `fp32_lanes` f32 words, or a
/// half-precision operation's `fp16_lanes` 16-bit ones (`VecOp::half`).
pub fn lanes(f: &Fabric, op: VecOp) -> (u32, u32) {
    if op.half() {
        (f.fp16_lanes, HALF)
    } else {
        (f.fp32_lanes, WORD)
    }
}

/// The work of an operation over `n` elements, in f32 lane steps (what utilisation
/// counts against `fp32_lanes` a cycle): a half-precision operation's elements count
/// `fp32_lanes / fp16_lanes` each; moves and roundings count none.
pub fn work(f: &Fabric, op: VecOp, n: u32) -> u64 {
    match op {
        op if op == VecOp::Mov || op.rounds() => 0,
        op if op.half() => {
            (u64::from(n) * u64::from(f.fp32_lanes)).div_ceil(u64::from(f.fp16_lanes.max(1)))
        }
        _ => u64::from(n),
    }
}

/// Cycles of a vector operation over `n` elements, `reads` of whose sources are SRAM
/// vectors and whose result goes to SRAM when `writes` (else to the fabric), with
/// every fabric operand ready: the start-up, then one step per `fp32_lanes` f32
/// elements or `fp16_lanes` half-precision ones (or `software_op` cycles per element
/// for the operations done in software). A rounding to half precision costs nothing:
/// it stands for the operation before it writing half-precision words, as the PE's
/// half-precision operations do (the simulator computes in f32, then rounds).
pub fn vec_op(f: &Fabric, op: VecOp, n: u32, reads: u32, writes: bool) -> u64 {
    if op.rounds() {
        return 0;
    }
    let start = u64::from(f.dsd_startup);
    if op.software() {
        return start + u64::from(n) * u64::from(f.software_op);
    }
    let step = lanes(f, op);
    start + u64::from(n.div_ceil(step.0)) * cycles_per_step(f, step, reads, u32::from(writes))
}

/// The sources of an operation that are vectors in SRAM (what its steps read).
pub fn reads(srcs: &[Src]) -> u32 {
    srcs.iter()
        .filter(|s| matches!(s, Src::V(Dsd::Mem { .. })))
        .count() as u32
}

/// Whether an operation writing `dst` from `srcs` uses the fabric: it sends, or it
/// receives (a stream or one wavelet); else it runs on SRAM alone.
pub fn on_fabric(dst: &Dsd, srcs: &[Src]) -> bool {
    !matches!(dst, Dsd::Mem { .. })
        || srcs
            .iter()
            .any(|s| matches!(s, Src::V(Dsd::In { .. }) | Src::Recv(_)))
}

/// Cycles between element steps of an operation: `vec_op` without its start-up, per
/// step of its lanes' elements (`lanes`).
pub fn step(f: &Fabric, op: VecOp, reads: u32, writes: bool) -> u64 {
    if op.software() {
        u64::from(f.software_op)
    } else {
        cycles_per_step(f, lanes(f, op), reads, u32::from(writes))
    }
}

/// Cycles from a wavelet leaving a PE to its arrival in the input queue of a PE `hops`
/// links away: up the source's ramp, across the links, down the destination's ramp.
pub fn latency(f: &Fabric, hops: u32) -> u64 {
    2 * u64::from(f.ramp_latency) + u64::from(hops) * u64::from(f.hop_latency)
}

/// Cycles of a stream of `n` f32 values over `hops` links without contention: one
/// wavelet per cycle, the last one arriving `latency` after it left.
pub fn stream(f: &Fabric, n: u32, hops: u32) -> u64 {
    if n == 0 {
        return 0;
    }
    u64::from(n - 1) + latency(f, hops) + 1
}

/// Cycles of a task body with every fabric operand ready and every stream room: its
/// vector operations (`vec_op`), loops counted; a loop nest that is one
/// multi-dimensional operation (`Instr::dims`) pays its start-up once. The simulator
/// takes at least this long; stalls come on top.
pub fn body(f: &Fabric, instrs: &[Instr]) -> u64 {
    instrs
        .iter()
        .map(|i| match i {
            Instr::Vec { op, dst, srcs } => vec_op(
                f,
                *op,
                dst.len(),
                reads(srcs),
                matches!(dst, Dsd::Mem { .. }),
            ),
            // one multi-dimensional operation: started once
            Instr::Loop { count, body: b } if *count > 0 && i.dims().is_some() => {
                let start = u64::from(f.dsd_startup);
                start + u64::from(*count) * body(f, b).saturating_sub(start)
            }
            Instr::Loop { count, body: b } => u64::from(*count) * body(f, b),
            _ => 0,
        })
        .sum()
}

/// A program's cycles per sample, stalls aside: its tasks' cycles with their switches,
/// each as many times as it runs in a step (`runs`), over the step's `batch` samples;
/// the update (the step's finishing task, launched by the host) aside.
pub fn per_sample(f: &Fabric, p: &Program, batch: u32, update: TaskId) -> u64 {
    per_pass(f, p, batch, update).iter().sum()
}

/// `per_sample` split between the forward pass and the backward pass: kernels number
/// the tasks of the forward pass (a sample's, then the step's finishing one) even and
/// those of the backward pass odd.
pub fn per_pass(f: &Fabric, p: &Program, batch: u32, update: TaskId) -> [u64; 2] {
    let switch = u64::from(f.task_switch);
    by_pass(p, batch, |t| match t.id == update {
        true => 0,
        false => switch + body(f, &t.body),
    })
}

/// `each` task's cycles a run, times its runs in a step of `batch` samples (`runs`),
/// summed per pass (forward tasks even, backward odd) over the samples.
fn by_pass(p: &Program, batch: u32, each: impl Fn(&Task) -> u64) -> [u64; 2] {
    let mut all = [0; 2];
    for (t, n) in p.tasks.iter().zip(runs(p, batch)) {
        all[usize::from(t.id % 2)] += n * each(t);
    }
    let b = u64::from(batch.max(1));
    [all[0] / b, all[1] / b]
}

/// The cycles lane 0 of a strip of `lanes` waits a sample in each pass for its
/// reductions across the strip (`kernels::rows`): each read of the strip's total (on
/// colour `total`) waits for the partial sums to go down the strip, a lane adding its
/// own at each hop, and the total to come back up. `body` leaves such waits out, as it
/// does every stall; this one is the same every sample, and on a strip of tens of
/// lanes it outlasts the lane's own work (a softmax of 1,000 classes across 59 lanes:
/// about 750 cycles a reduction).
pub fn strip_waits(f: &Fabric, p: &Program, batch: u32, total: Colour, lanes: u32) -> [u64; 2] {
    if lanes < 2 {
        return [0; 2];
    }
    // one reduction of `len` words: a hop and the words added per lane down (each
    // lane's add has started, waiting on its input, as the lanes run in step), the
    // way back up
    let trip = |len: u32| {
        u64::from(lanes - 1) * (latency(f, 1) + u64::from(len))
            + latency(f, lanes - 1)
            + u64::from(len)
    };
    fn waits(instrs: &[Instr], total: Colour, trip: &dyn Fn(u32) -> u64) -> u64 {
        instrs
            .iter()
            .map(|i| match i {
                Instr::Vec { srcs, .. } => (srcs.iter())
                    .map(|s| match s {
                        Src::V(Dsd::In { colour, len }) if *colour == total => trip(*len),
                        _ => 0,
                    })
                    .sum(),
                Instr::Loop { count, body } => u64::from(*count) * waits(body, total, trip),
                _ => 0,
            })
            .sum()
    }
    by_pass(p, batch, |t| waits(&t.body, total, &trip))
}

/// The cycles of a program's update (`update`, the step's finishing task, which runs
/// once a step after the last sample's backward pass), with its switch: 0 when it has
/// none.
pub fn update_cycles(f: &Fabric, p: &Program, update: TaskId) -> u64 {
    (p.tasks.iter())
        .filter(|t| t.id == update)
        .map(|t| u64::from(f.task_switch) + body(f, &t.body))
        .sum()
}

/// How many times each task of `p` (in its order) runs in a step of `batch` samples:
/// a data task once for each sample dealt to it (`Program::share`), shared with the
/// other backward tasks of its pipeline that it takes turns with; a local task as
/// often as the tasks that activate it do, over a count's `every`; one that nothing
/// activates (the host's launches, the update, a task at start) once.
pub fn runs(p: &Program, batch: u32) -> Vec<u64> {
    // the data tasks' runs, before any activation
    let data: Vec<u64> = (p.tasks.iter())
        .map(|t| match t.trigger {
            Trigger::Data(_) => {
                let turns = (p.pipeline.iter())
                    .find(|q| q.backward.contains(&t.id))
                    .map_or(1, |q| q.backward.len() as u32);
                u64::from(batch / p.share() / turns)
            }
            Trigger::Local { .. } => 0,
        })
        .collect();
    let mut n = data.clone();
    fn activations(body: &[Instr], times: u64, out: &mut Vec<(TaskId, u64)>) {
        for i in body {
            match i {
                Instr::Activate(t) => out.push((*t, times)),
                Instr::Count {
                    every,
                    then: Some(t),
                    ..
                } => out.push((*t, times / u64::from((*every).max(1)))),
                Instr::Loop { count, body } => activations(body, times * u64::from(*count), out),
                _ => {}
            }
        }
    }
    // a task that runs itself again until its count comes round runs that many times
    // for each activation from elsewhere
    let repeats: Vec<u64> = (p.tasks.iter())
        .map(|t| {
            (t.body.iter())
                .find_map(|i| match i {
                    Instr::Count {
                        every, again: true, ..
                    } => Some(u64::from(*every)),
                    _ => None,
                })
                .unwrap_or(1)
        })
        .collect();
    // tasks activate ones after them in a chain (data, then finishing): a few passes
    // settle it
    for _ in 0..p.tasks.len().min(8) {
        let mut add = Vec::new();
        for (t, &times) in p.tasks.iter().zip(&n) {
            activations(&t.body, times, &mut add);
        }
        let mut next = data.clone();
        for (id, times) in add {
            if let Some(i) = p.tasks.iter().position(|t| t.id == id) {
                next[i] += times * repeats[i];
            }
        }
        // a local task nothing activates runs once (the host launches it, or it
        // starts with the program: counted once a step, an upper bound)
        for (i, t) in p.tasks.iter().enumerate() {
            if matches!(t.trigger, Trigger::Local { .. }) && next[i] == 0 {
                next[i] = 1;
            }
        }
        if next == n {
            break;
        }
        n = next;
    }
    n
}

/// The wavelets a program sends on colour `c` in a step of `batch` samples: each
/// task's sends as many times as it runs (`runs`).
pub fn sends(p: &Program, c: Colour, batch: u64) -> u64 {
    fn out(body: &[Instr], c: Colour) -> u64 {
        body.iter()
            .map(|i| match i {
                Instr::Vec {
                    dst: Dsd::Out { colour, len },
                    ..
                } if *colour == c => u64::from(*len),
                Instr::Loop { count, body } => u64::from(*count) * out(body, c),
                _ => 0,
            })
            .sum()
    }
    let batch = u32::try_from(batch).unwrap_or(u32::MAX);
    (p.tasks.iter())
        .zip(runs(p, batch))
        .map(|(t, n)| out(&t.body, c) * n)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primitives_match_hand_computed_cycles() {
        let f = Fabric::named("test32").unwrap();
        // fp32, one lane: start-up 5, then one cycle per element (3 x 4 bytes read fit
        // the 16-byte ports)
        assert_eq!(vec_op(&f, VecOp::Fmac, 64, 3, true), 5 + 64);
        // software exp: 20 cycles per element
        assert_eq!(vec_op(&f, VecOp::Exp, 10, 1, true), 5 + 200);
        // a 4-lane unit reading 3 vectors of f32 needs 48 bytes per step from 16-byte
        // ports
        assert_eq!(cycles_per_step(&f, (4, WORD), 3, 1), 3);
        assert_eq!(cycles_per_step(&f, (4, WORD), 2, 1), 2);
        // half precision on the 4 fp16 lanes: 3 vectors of 16-bit words, 24 bytes a
        // step (2 cycles); 2 vectors, one; 64 multiply-adds, 16 steps
        assert_eq!(cycles_per_step(&f, (4, HALF), 3, 1), 2);
        assert_eq!(vec_op(&f, VecOp::Fmach, 64, 3, true), 5 + 32);
        assert_eq!(vec_op(&f, VecOp::Mulh, 64, 2, true), 5 + 16);
        // a rounding stands for the half-precision write before it: free
        assert_eq!(vec_op(&f, VecOp::ToF16, 64, 1, true), 0);
        // the work utilisation counts: a half-precision element a quarter of an f32 one
        assert_eq!(work(&f, VecOp::Fmach, 64), 16);
        assert_eq!(work(&f, VecOp::Fmac, 64), 64);
        // 2 ramps of 2 cycles and 3 hops
        assert_eq!(latency(&f, 3), 7);
        assert_eq!(stream(&f, 10, 3), 9 + 7 + 1);
    }
}
