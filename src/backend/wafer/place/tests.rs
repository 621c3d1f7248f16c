use super::build::try_lanes;
use super::*;
use crate::backend::wafer::isa::{Dsd, Instr, Program, Src, Task, Trigger, VecOp};
use crate::backend::wafer::kernels::UPDATE;
use crate::backend::wafer::sim::Route;
use std::sync::Arc;

/// A program that sends `n` words on colour `c` at start, or (`recv`) adds `n`
/// wavelets of colour `c` into its words when they come.
fn pe(c: Colour, n: u32, recv: bool) -> Arc<Program> {
    let mut p = Program::default();
    let x = p.alloc("x", n);
    let (trigger, dst, srcs) = if recv {
        let srcs = vec![
            Src::V(Dsd::mem(x, n)),
            Src::V(Dsd::In { colour: c, len: n }),
        ];
        (Trigger::Data(c), Dsd::mem(x, n), srcs)
    } else {
        let srcs = vec![Src::V(Dsd::mem(x, n))];
        (
            Trigger::Local { at_start: true },
            Dsd::Out { colour: c, len: n },
            srcs,
        )
    };
    let op = if recv { VecOp::Add } else { VecOp::Mov };
    p.tasks.push(Task {
        id: 0,
        name: "t".into(),
        trigger,
        body: vec![Instr::Vec { op, dst, srcs }],
    });
    Arc::new(p)
}

/// PEs along row 0 from column 0; `streams` as (colour, from, to) columns, routed
/// east.
fn row(pes: &[(u32, Arc<Program>)], streams: &[(Colour, u32, u32)]) -> Layout {
    let fabric = Fabric::named("test32").unwrap();
    let mut setup = Setup::default();
    for (x, p) in pes {
        setup
            .pes
            .insert((*x, 0), (p.clone(), vec![0.0; p.words() as usize]));
    }
    for &(c, a, b) in streams {
        for x in a..=b {
            let route = match (x == a, x == b) {
                (true, _) => Route::new(Dir::Ramp, &[Dir::E]),
                (false, true) => Route::new(Dir::W, &[Dir::Ramp]),
                (false, false) => Route::new(Dir::W, &[Dir::E]),
            };
            setup.routes.insert((x, 0, c), route);
        }
    }
    Layout {
        fabric,
        batch: 1,
        setup,
        tensors: BTreeMap::new(),
        summed: Default::default(),
        inputs: Vec::new(),
        outputs: Vec::new(),
        kernels: vec![Placed {
            name: "row".into(),
            x: 0,
            y: 0,
            w: 4,
            h: 1,
            orient: Orient::North,
        }],
        block: 0,
        estimate: 0,
    }
}

/// A link that two streams share carries both; the checker refuses a link that
/// carries more wavelets a step than the busiest PE has cycles (here 75: a task
/// switch of 10, a start-up of 5 and 60 elements).
#[test]
fn a_link_carries_its_streams_and_an_overloaded_one_is_refused() {
    // PE 0 sends 60 words to PE 3 through PEs 1 and 2
    let alone = row(&[(0, pe(1, 60, false)), (3, pe(1, 60, true))], &[(1, 0, 3)]);
    let loads: Vec<_> = link_loads(&alone).into_iter().collect();
    assert_eq!(
        loads,
        [
            ((0, 0, Dir::E), 60),
            ((1, 0, Dir::E), 60),
            ((2, 0, Dir::E), 60)
        ]
    );
    check(&alone).unwrap();
    // and PE 1 sends 60 more to PE 2 on the link out of it
    let shared = row(
        &[
            (0, pe(1, 60, false)),
            (1, pe(2, 60, false)),
            (2, pe(2, 60, true)),
            (3, pe(1, 60, true)),
        ],
        &[(1, 0, 3), (2, 1, 2)],
    );
    assert_eq!(link_loads(&shared)[&(1, 0, Dir::E)], 120);
    let e = check(&shared).unwrap_err();
    assert!(
        e.contains("router (1, 0) east carries 120 wavelets a step, more than the 75 cycles"),
        "{e}"
    );
}

/// A loss run as replicas (a dealer dealing the samples, the step's sums gathered
/// and sent back, the gradients put back in order) computes what it computes on
/// one lane: the same sizing but for the loss's replicas, the same weights and
/// inputs, one train step and its update in the simulator; every tensor within
/// 1e-6 of its largest magnitude (the sums over the batch add the replicas'
/// shares in another order). Counts of 2, 3, 4 and 6 replicas of a batch of 12,
/// the dealer taking the logits from one row of the last layer, or gathering them
/// from 2 to 5 rows (and sending each row its share of their gradient).
#[test]
fn a_loss_as_replicas_computes_what_it_does_on_one_lane() {
    use crate::backend::wafer::kernels::{gather, scatter};
    use crate::backend::wafer::sim::Sim;
    let src = crate::backend::wafer::testing::mlp(7, 9, 5, 12);
    let g = crate::backend::wafer::testing::graph(&src, crate::syntax::ast::SectionKind::Train);
    let f = form::form(&g).unwrap();
    // a fabric with colours for six replicas gathering five rows
    let mut fab = Fabric::named("test32").unwrap();
    fab.colours += 10;
    let sizer = Sizer::new(&g, &f, &fab, (Widths::WIDEST, false)).unwrap();
    let last = f.kernels.len() - 1;
    assert!(sizer.replicable[last]);
    let base = sizer.block(4).unwrap();
    let value = |seed: usize| {
        let z = (seed as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    // (the last layer's rows, whose outputs the dealer gathers)
    let run = |reps: u32, rows: u32| -> BTreeMap<String, Vec<f32>> {
        let mut lanes = base.clone();
        lanes.reps[last] = reps;
        lanes.out[last - 1] = rows;
        let l = try_lanes(&sizer, &lanes, 4).unwrap();
        let mut sim = Sim::new(&fab, &l.setup).unwrap();
        let len = |pieces: &[Piece]| {
            (pieces.iter().flat_map(|p| &p.runs))
                .map(|&(o, n)| (o + n) as usize)
                .max()
                .unwrap_or(0)
        };
        // the variables (sums over the batch start at zero, as the update leaves
        // them)
        for (t, (name, pieces)) in l.tensors.iter().enumerate() {
            if name.starts_with('%') {
                continue;
            }
            let data: Vec<f32> = (0..len(pieces)).map(|i| value(1000 * t + i)).collect();
            scatter(pieces, &data, |(x, y), a, v| {
                sim.write(x, y, a, v);
            });
        }
        for s in &l.inputs {
            for lane in &s.lanes {
                let v: Vec<f32> = (0..l.batch)
                    .flat_map(|b| lane.elems.clone().map(move |e| (b, e)))
                    .map(|(b, e)| match s.name.as_str() {
                        "labels" => ((b * 3 + 1) % 5) as f32,
                        _ => value((b * 7 + e) as usize + 77),
                    })
                    .collect();
                sim.feed(lane.x, lane.y, lane.colour, &v);
            }
        }
        sim.run().unwrap();
        for &(x, y) in l.setup.pes.keys() {
            sim.launch(x, y, UPDATE);
        }
        sim.run().unwrap();
        (l.tensors.iter())
            .map(|(name, pieces)| {
                let v = gather(pieces, len(pieces), |(x, y)| sim.memory(x, y));
                (name.clone(), v)
            })
            .collect()
    };
    let one = run(1, 1);
    assert!(one.len() >= 6, "{:?}", one.keys());
    // (rows a layer of 5 outputs uses all of)
    let cases = [
        (2, 1),
        (3, 1),
        (4, 1),
        (6, 1),
        (2, 2),
        (2, 3),
        (3, 3),
        (4, 5),
        (6, 5),
    ];
    for (reps, rows) in cases {
        let many = run(reps, rows);
        for (name, a) in &one {
            let b = &many[name];
            let scale = a.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-6 * scale,
                    "{reps} replicas, {rows} rows: {name}: {x} against {y} on one lane"
                );
            }
        }
    }
}
