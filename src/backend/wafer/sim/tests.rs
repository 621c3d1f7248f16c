//! The simulator's tests: what tasks and loops cost, streams and their flow control,
//! multicast, the host's streams, and what a deadlock, wavelets left over, a lost
//! stream and broken routes report.

use super::*;
use crate::backend::wafer::isa::{Dsd, Instr, Src, Task, TaskId, VecOp};

fn fabric() -> Fabric {
    Fabric::named("test32").unwrap()
}

fn task(id: TaskId, name: &str, trigger: Trigger, body: Vec<Instr>) -> Task {
    Task {
        id,
        name: name.into(),
        trigger,
        body,
    }
}

fn vec(op: VecOp, dst: Dsd, srcs: Vec<Src>) -> Instr {
    Instr::Vec { op, dst, srcs }
}

const START: Trigger = Trigger::Local { at_start: true };

/// A PE that sends its first `n` words on colour 1 at start.
fn sender(n: u32) -> Program {
    let mut p = Program::default();
    let x = p.alloc("x", n);
    p.tasks.push(task(
        0,
        "send",
        START,
        vec![vec(
            VecOp::Mov,
            Dsd::Out { colour: 1, len: n },
            vec![Src::V(Dsd::mem(x, n))],
        )],
    ));
    p
}

/// A PE that adds `n` wavelets of colour 1 into its first `n` words.
fn receiver(n: u32) -> Program {
    let mut p = Program::default();
    let y = p.alloc("y", n);
    p.tasks.push(task(
        0,
        "receive",
        Trigger::Data(1),
        vec![vec(
            VecOp::Add,
            Dsd::mem(y, n),
            vec![
                Src::V(Dsd::mem(y, n)),
                Src::V(Dsd::In { colour: 1, len: n }),
            ],
        )],
    ));
    p
}

fn stats(sim: &Sim, x: u32, y: u32) -> PeStats {
    sim.stats().into_iter().find(|s| s.0 == (x, y)).unwrap().1
}

#[test]
fn a_task_on_sram_costs_its_switch_start_up_and_elements() {
    let mut p = Program::default();
    let y = p.alloc("y", 64);
    let a = p.alloc("a", 64);
    p.tasks.push(task(
        0,
        "axpy",
        START,
        vec![vec(
            VecOp::Fmac,
            Dsd::mem(y, 64),
            vec![
                Src::V(Dsd::mem(y, 64)),
                Src::V(Dsd::mem(a, 64)),
                Src::Imm(2.0),
            ],
        )],
    ));
    let mem: Vec<f32> = (0..128).map(|i| i as f32).collect();
    let mut setup = Setup::default();
    setup.pes.insert((3, 4), (Arc::new(p), mem));
    let mut sim = Sim::new(&fabric(), &setup).unwrap();
    // task switch 10, start-up 5, 64 elements at one per cycle
    assert_eq!(sim.run().unwrap(), 10 + 5 + 64);
    let m = sim.memory(3, 4).unwrap();
    assert_eq!(m[5], 5.0 + 2.0 * 69.0);
    assert_eq!(stats(&sim, 3, 4).busy, 79);
}

#[test]
fn a_loop_around_one_operation_starts_it_once() {
    // y[0..4] += W[i][0..4] * x[i] for i in 0..3: one two-dimensional operation;
    // the same with a second operation in the loop's body starts both each time
    let fmacs = |two: bool| {
        let mut p = Program::default();
        let (y, w, x, z) = (
            p.alloc("y", 4),
            p.alloc("W", 12),
            p.alloc("x", 3),
            p.alloc("z", 1),
        );
        let mut body = vec![vec(
            VecOp::Fmac,
            Dsd::mem(y, 4),
            vec![
                Src::V(Dsd::mem(y, 4)),
                Src::V(Dsd::strided(w, 4, 1, &[4], None)),
                Src::V(Dsd::strided(x, 4, 0, &[1], None)),
            ],
        )];
        if two {
            body.push(vec(VecOp::Mov, Dsd::mem(z, 1), vec![Src::Imm(1.0)]));
        }
        p.tasks
            .push(task(0, "gemv", START, vec![Instr::Loop { count: 3, body }]));
        let mem: Vec<f32> = (0..20)
            .map(|i| if i < 4 { 0.0 } else { i as f32 })
            .collect();
        let mut setup = Setup::default();
        setup.pes.insert((0, 0), (Arc::new(p), mem));
        let mut sim = Sim::new(&fabric(), &setup).unwrap();
        let end = sim.run().unwrap();
        (end, sim.memory(0, 0).unwrap()[..4].to_vec())
    };
    // switch 10, start-up 5, 3 x 4 elements
    let (end, y) = fmacs(false);
    assert_eq!(end, 10 + 5 + 12);
    // y[j] = sum_i W[i][j] x[i], W[i][j] = 4 + 4i + j, x[i] = 16 + i
    let want: Vec<f32> = (0..4)
        .map(|j| (0..3).map(|i| ((4 + 4 * i + j) * (16 + i)) as f32).sum())
        .collect();
    assert_eq!(y, want);
    // each iteration: start-up 5 + 4, start-up 5 + 1
    assert_eq!(fmacs(true), (10 + 3 * (9 + 6), want));
}

/// PE (0, 0) streams `n` words east to PE (1, 0), which adds them to its own.
fn pair(n: u32) -> Sim {
    let xs: Vec<f32> = (0..n).map(|i| i as f32 + 0.5).collect();
    let to = (receiver(n), vec![100.0; n as usize]);
    Sim::new(&fabric(), &east((sender(n), xs), to)).unwrap()
}

/// PE (0, 0) running `from` and PE (1, 0) running `to` (with their memories), colour
/// 1 routed from the first to the second.
fn east(from: (Program, Vec<f32>), to: (Program, Vec<f32>)) -> Setup {
    let mut setup = Setup::default();
    setup.pes.insert((0, 0), (Arc::new(from.0), from.1));
    setup.pes.insert((1, 0), (Arc::new(to.0), to.1));
    setup
        .routes
        .insert((0, 0, 1), Route::new(Dir::Ramp, &[Dir::E]));
    setup
        .routes
        .insert((1, 0, 1), Route::new(Dir::W, &[Dir::Ramp]));
    setup
}

/// A run that ends with wavelets in a queue that no task took (a receiver that takes
/// 3 of the 8 sent, once) is an error naming the PE, the colour and the count.
#[test]
fn wavelets_left_over_are_reported() {
    let mut once = Program::default();
    let y = once.alloc("y", 3);
    once.tasks.push(task(
        0,
        "take three",
        START,
        vec![vec(
            VecOp::Mov,
            Dsd::mem(y, 3),
            vec![Src::V(Dsd::In { colour: 1, len: 3 })],
        )],
    ));
    let setup = east((sender(8), vec![1.0; 8]), (once, vec![0.0; 3]));
    let mut sim = Sim::new(&fabric(), &setup).unwrap();
    let e = sim.run().unwrap_err();
    assert_eq!(e.waiting, 0);
    assert_eq!(
        e.chain,
        ["PE (1, 0) holds 5 wavelets on colour 1 that no task took"]
    );
    assert!(e.to_string().contains("wavelets left over"), "{e}");
}

/// A data task that never ran (its stream lost) ends a run quietly; `short_runs`
/// names its PE, and counts the runs of one that did.
#[test]
fn a_data_task_that_never_ran_is_found() {
    // 8 wavelets into a task that takes 4: it runs twice
    let setup = east((sender(8), vec![1.0; 8]), (receiver(4), vec![0.0; 4]));
    let mut sim = Sim::new(&fabric(), &setup).unwrap();
    let before = sim.data_runs();
    sim.run().unwrap();
    assert_eq!(sim.short_runs(&before, 2), None);
    assert_eq!(
        sim.short_runs(&before, 3).as_deref(),
        Some("PE (1, 0) started its 1 data tasks 2 times in all, not 3: a stream was lost")
    );
    // a receiver nothing sends to
    let mut setup = Setup::default();
    setup
        .pes
        .insert((1, 0), (Arc::new(receiver(4)), vec![0.0; 4]));
    let mut sim = Sim::new(&fabric(), &setup).unwrap();
    let before = sim.data_runs();
    assert_eq!(sim.run(), Ok(0));
    assert!(sim
        .short_runs(&before, 1)
        .is_some_and(|m| m.contains("0 times")));
}

#[test]
fn a_stream_arrives_after_its_ramps_and_hop() {
    let mut sim = pair(8);
    let end = sim.run().unwrap();
    // sent at 15..22 (switch 10, start-up 5); queued at the receiver 5 cycles later
    // (2 + 1 + 2), 20..27; the receiver's task starts at 20, its elements at 35..42
    assert_eq!(stats(&sim, 0, 0).done, 23);
    assert_eq!(stats(&sim, 1, 0).done, 43);
    assert_eq!(end, 43);
    let m = sim.memory(1, 0).unwrap();
    assert_eq!(m[..3], [100.5, 101.5, 102.5]);
}

#[test]
fn a_full_stream_holds_its_sender_back() {
    // room for 4 x (1 + 1) = 8 wavelets: the sender waits from its 9th until the
    // receiver takes the first at 35, then sends one per cycle (35..46); the
    // receiver takes #8 at 43 (it arrived at 40) and the last at 54
    let mut sim = pair(20);
    let end = sim.run().unwrap();
    let (s, r) = (stats(&sim, 0, 0), stats(&sim, 1, 0));
    assert_eq!(s.done, 47);
    assert_eq!(s.stalled, 35 - 23);
    assert_eq!(r.done, 55);
    assert_eq!(end, 55);
    assert_eq!(sim.memory(1, 0).unwrap()[19], 119.5);
}

#[test]
fn a_multicast_reaches_every_consumer() {
    let mut setup = Setup::default();
    setup
        .pes
        .insert((0, 1), (Arc::new(sender(4)), vec![1.0, 2.0, 3.0, 4.0]));
    for x in 1..4 {
        setup
            .pes
            .insert((x, 1), (Arc::new(receiver(4)), vec![0.0; 4]));
    }
    setup
        .routes
        .insert((0, 1, 1), Route::new(Dir::Ramp, &[Dir::E]));
    setup
        .routes
        .insert((1, 1, 1), Route::new(Dir::W, &[Dir::Ramp, Dir::E]));
    setup
        .routes
        .insert((2, 1, 1), Route::new(Dir::W, &[Dir::Ramp, Dir::E]));
    setup
        .routes
        .insert((3, 1, 1), Route::new(Dir::W, &[Dir::Ramp]));
    let mut sim = Sim::new(&fabric(), &setup).unwrap();
    sim.run().unwrap();
    for x in 1..4 {
        assert_eq!(sim.memory(x, 1).unwrap(), [1.0, 2.0, 3.0, 4.0]);
        // the first wavelet left at 15 and arrives after 2 + x + 2 cycles; the
        // task starts then, and its last element is 10 + 5 + 3 cycles later
        assert_eq!(stats(&sim, x, 1).done, 15 + 4 + u64::from(x) + 10 + 5 + 4);
    }
}

#[test]
fn host_streams_enter_and_leave_at_the_edges() {
    // the host sends 3 values into (0, 0) from the west; PE (0, 0) doubles each and
    // sends it on colour 2 east to (1, 0), whose router turns it off the north edge
    let mut p = Program::default();
    p.tasks.push(task(
        0,
        "double",
        Trigger::Data(1),
        vec![vec(
            VecOp::Mul,
            Dsd::Out { colour: 2, len: 3 },
            vec![Src::V(Dsd::In { colour: 1, len: 3 }), Src::Imm(2.0)],
        )],
    ));
    let mut setup = Setup::default();
    setup.pes.insert((0, 0), (Arc::new(p), vec![]));
    setup.inputs.push(HostIn {
        x: 0,
        y: 0,
        colour: 1,
        values: vec![1.0, 2.0, 3.0],
    });
    setup
        .routes
        .insert((0, 0, 1), Route::new(Dir::W, &[Dir::Ramp]));
    setup
        .routes
        .insert((0, 0, 2), Route::new(Dir::Ramp, &[Dir::E]));
    setup
        .routes
        .insert((1, 0, 2), Route::new(Dir::W, &[Dir::N]));
    let mut sim = Sim::new(&fabric(), &setup).unwrap();
    let end = sim.run().unwrap();
    let out = sim.output(1, 0, Dir::N, 2);
    let values: Vec<f32> = out.iter().map(|o| o.1).collect();
    assert_eq!(values, [2.0, 4.0, 6.0]);
    // in at 0, 1, 2 and queued at 4, 5, 6; the task starts at 4 and computes at
    // 19, 20, 21; each value reaches (1, 0) 2 + 1 cycles later and leaves north 1
    // cycle after that
    assert_eq!(out[0].0, 19 + 2 + 1 + 1);
    assert_eq!(end, 21 + 4);
}

#[test]
fn a_deadlock_is_reported_with_its_chain_of_waits() {
    // each PE first waits for a wavelet from the other
    let prog = |from: Colour, to: Colour| {
        let mut p = Program::default();
        let y = p.alloc("y", 1);
        p.tasks.push(task(
            0,
            "exchange",
            START,
            vec![
                vec(
                    VecOp::Mov,
                    Dsd::mem(y, 1),
                    vec![Src::V(Dsd::In {
                        colour: from,
                        len: 1,
                    })],
                ),
                vec(
                    VecOp::Mov,
                    Dsd::Out { colour: to, len: 1 },
                    vec![Src::V(Dsd::mem(y, 1))],
                ),
            ],
        ));
        Arc::new(p)
    };
    let mut setup = Setup::default();
    setup.pes.insert((0, 0), (prog(1, 2), vec![]));
    setup.pes.insert((1, 0), (prog(2, 1), vec![]));
    setup
        .routes
        .insert((0, 0, 2), Route::new(Dir::Ramp, &[Dir::E]));
    setup
        .routes
        .insert((1, 0, 2), Route::new(Dir::W, &[Dir::Ramp]));
    setup
        .routes
        .insert((1, 0, 1), Route::new(Dir::Ramp, &[Dir::W]));
    setup
        .routes
        .insert((0, 0, 1), Route::new(Dir::E, &[Dir::Ramp]));
    let mut sim = Sim::new(&fabric(), &setup).unwrap();
    let d = sim.run().unwrap_err();
    assert_eq!(d.waiting, 2);
    assert_eq!(
        d.chain,
        [
            "PE (0, 0) in task `exchange` waits for a wavelet on colour 1 from PE (1, 0)",
            "PE (1, 0) in task `exchange` waits for a wavelet on colour 2 from PE (0, 0)",
            "PE (0, 0) in task `exchange` (a cycle)",
        ]
    );
}

#[test]
fn broken_routes_are_refused_before_running() {
    let mut setup = Setup::default();
    setup
        .pes
        .insert((0, 0), (Arc::new(sender(2)), vec![1.0, 2.0]));
    setup
        .routes
        .insert((0, 0, 1), Route::new(Dir::Ramp, &[Dir::E]));
    setup
        .routes
        .insert((1, 0, 1), Route::new(Dir::N, &[Dir::Ramp]));
    let e = Sim::new(&fabric(), &setup).err().unwrap();
    assert!(e.0.contains("does not take it from the west"), "{}", e.0);
    setup
        .routes
        .insert((1, 0, 1), Route::new(Dir::W, &[Dir::Ramp]));
    let e = Sim::new(&fabric(), &setup).err().unwrap();
    assert!(e.0.contains("no program runs"), "{}", e.0);
}
