//! Every kernel laid out on its place: a dense layer's PEs (`kernels::dense`), a vector
//! kernel's lanes or its dealer and replicas (`kernels::vector`), and the routes of a
//! vector strip's ports.

use super::colour::{passes_over, st_from_host, Colouring};
use super::host::parts_of;
use super::lanes::{vector_of, Dims, Lanes};
use super::sizer::{schedule, Sizer};
use super::{unsupported, LayoutError, Placed};
use crate::backend::wafer::form::{self, End, Formed, Kind};
use crate::backend::wafer::isa::Colour;
use crate::backend::wafer::kernels::dense::{self, Dense, Shape};
use crate::backend::wafer::kernels::vector::{halo_routes, Fan, Rep, Vector};
use crate::backend::wafer::kernels::{rows, Laid};
use crate::backend::wafer::lower::Update;
use crate::backend::wafer::sim::Dir;
use crate::ir::{Graph, NodeIndex, Op};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Every kernel of a sizing laid out on its place, with the windows of its replicas.
pub(super) fn kernels(
    sizer: &Sizer,
    lanes: &Lanes,
    placed: &[Placed],
    c: &Colouring,
) -> Result<Laid, LayoutError> {
    let (g, f) = (sizer.g, sizer.f);
    let sched = schedule(f, sizer.widths, |k| lanes.reps[k]);
    let colour = |n: Option<NodeIndex>, k: usize| c.of(f, n, k);
    let mut all = Laid::default();
    for (k, p) in placed.iter().enumerate() {
        let kr = &f.kernels[k];
        let laid = match (&kr.kind, &sizer.dense[k]) {
            (
                Kind::Dense {
                    x, fwd, dy, bwd, ..
                },
                Some(d),
            ) => {
                // (a shortcut's input goes on to the layer after it ahead of its outputs,
                // on their colour, and that layer's input gradient comes back ahead of
                // the shortcut's output gradient, on its: `Carry::first`)
                let ahead = k > 0 && f.carries_first(k - 1);
                let after = |k: usize| match f.kernels.get(k).map(|kr| &kr.kind) {
                    Some(Kind::Dense { bwd, .. }) => *bwd,
                    _ => None,
                };
                let cs = dense::Colours::with_streams(
                    if ahead {
                        colour(f.kernels[k - 1].fwd(), k - 1)
                    } else {
                        colour(Some(*x), k)
                    },
                    colour(Some(*fwd), k),
                    if f.carries_first(k) {
                        colour(after(k + 1), k)
                    } else {
                        colour(*dy, k)
                    },
                    colour(*bwd, k),
                );
                let more: Vec<(u32, Colour)> = (lanes.more[k].iter())
                    .zip(parts_of(f, k))
                    .map(|(&l, part)| (l, colour(Some(part.x), k)))
                    .collect();
                let fan = c.fans.get(&(k + 1)).map_or(&[][..], Vec::as_slice);
                d.scheduled(sched[k])
                    .on_lanes(lanes.inp[k], lanes.out[k])
                    .lay_parts(
                        (p.x, p.y),
                        p.orient,
                        (lanes.inp[k], lanes.out[k]),
                        &more,
                        cs,
                        fan,
                    )
                    .map_err(|e| {
                        unsupported(g, *fwd, e, "the wafer's kernels for this form of layer are listed under Limits in docs/wafer.md; train it on the host (`--target host`)")
                    })?
            }
            (Kind::Dense { fwd, .. }, None) => {
                return Err(unsupported(
                    g,
                    *fwd,
                    "a layer the sizer did not make".into(),
                    "this is a bug in estc's wafer compiler",
                ))
            }
            (Kind::Vector { nodes }, _) => {
                let mut v = vector_of(g, f, k, (sched[k], sizer.across), |n| {
                    c.into(n, k).unwrap_or(0)
                });
                v.rows = c.rows.get(&k).copied();
                v.halo = c.halos.get(&k).copied();
                let no_kernel = |e: String| {
                    unsupported(g, nodes[0], e, "write it with the ops the wafer's vector kernels run: elementwise ops, reductions over a sample's last axes, softmax, argmax, one-hot")
                };
                let mut laid = Laid::default();
                vector(&v, p, lanes.out[k], c.reps.get(&k), &mut laid).map_err(no_kernel)?;
                if let Some(cs) = c.reps.get(&k) {
                    dealer(sizer, (k, p), &v, cs, c, &mut laid, &no_kernel)?;
                }
                ports(f, k, p, &v, lanes.out[k], c, &mut laid)?;
                if let Some(cs) = v.rows {
                    // (in bands, each channel's lanes apart: `Vector::sums_in_bands`)
                    let each = v.bands(lanes.out[k]);
                    let strip = if each > 1 { each } else { lanes.out[k] };
                    for group in 0..lanes.out[k] / strip {
                        let at = p.orient.at((p.x, p.y), 0, group * strip);
                        rows::routes(&mut laid, at, p.orient, strip, cs)
                            .map_err(LayoutError::DoesNotFit)?;
                    }
                }
                if let Some(cs) = v.halo {
                    // (along each channel's lanes, its bands)
                    let each = v.bands(lanes.out[k]);
                    for group in 0..lanes.out[k] / each.max(1) {
                        let at = p.orient.at((p.x, p.y), 0, group * each);
                        halo_routes(&mut laid, at, p.orient, each, cs)
                            .map_err(LayoutError::DoesNotFit)?;
                    }
                }
                laid
            }
        };
        all.merge(laid).map_err(LayoutError::DoesNotFit)?;
    }
    Ok(all)
}

/// A vector kernel's PE programs: on its lanes, or as replicas in the lanes after its
/// dealer's (`reps`: their colours).
pub(super) fn vector(
    v: &Vector,
    p: &Placed,
    lanes: u32,
    reps: Option<&Vec<(Colour, Colour)>>,
    laid: &mut Laid,
) -> Result<(), String> {
    let mut programs = Vec::new();
    match reps {
        None => {
            for l in 0..lanes {
                programs.push((l, v.lane(lanes, l)?));
            }
        }
        Some(cs) => {
            let of = cs.len() as u32;
            for (j, &(to, back)) in (1..).zip(cs) {
                let rep = Rep { of, to, back };
                programs.push((j, v.replica(rep)?));
            }
        }
    }
    if reps.is_none() {
        laid.summed.extend(v.summed(lanes));
    }
    for (l, lane) in programs {
        let at = p.orient.at((p.x, p.y), 0, l);
        for (name, mut piece) in lane.tensors {
            piece.pe = at;
            laid.tensors.entry(name).or_default().push(piece);
        }
        laid.pes.insert(at, (Arc::new(lane.program), lane.memory));
    }
    Ok(())
}

/// A one-lane kernel's dealer (lane 0) and its routes along the strip: each replica's
/// samples down to it and back (`cs`), and the rows of the layer before that it gathers,
/// each row past the first up the strip from its east end and its share of the gradient
/// back down and west along it.
pub(super) fn dealer(
    sizer: &Sizer,
    (k, p): (usize, &Placed),
    v: &Vector,
    cs: &[(Colour, Colour)],
    c: &Colouring,
    laid: &mut Laid,
    no_kernel: &dyn Fn(String) -> LayoutError,
) -> Result<(), LayoutError> {
    let o = p.orient;
    let at = |l: u32| o.at((p.x, p.y), 0, l);
    // (gathering the rows of the layer before, the first on the ports'
    // colours)
    let fan = match (c.fans.get(&k), sizer.fanned[k]) {
        (Some(more), Some((input, grad))) => {
            let port = |n: NodeIndex| c.into(n, k).unwrap_or(0);
            let first = (
                port(input),
                grad.map_or(0, |g| c.colour_of.get(&g).copied().unwrap_or(0)),
            );
            Some(Fan {
                input,
                grad,
                colours: std::iter::once(first).chain(more.iter().copied()).collect(),
            })
        }
        _ => None,
    };
    let dealer = v.dealer(cs, fan.as_ref()).map_err(no_kernel)?;
    let words = dealer.words() as usize;
    laid.pes.insert(at(0), (Arc::new(dealer), vec![0.0; words]));
    // colour `c` along the strip between the dealer (lane 0) and lane
    // `j`, entering at one end from `rx` and leaving at the other to `tx`:
    // down from the dealer, or up to it
    let along = |laid: &mut Laid, c: Colour, j: u32, down: bool, rx: Dir, tx: Dir| {
        let (first, last, on) = if down {
            (0, j, [Dir::N, Dir::S])
        } else {
            (j, 0, [Dir::S, Dir::N])
        };
        let mut hop = |l: u32, rx: Dir, tx: Dir| {
            laid.route(at(l), c, o.route(rx, &[tx]))
                .map_err(LayoutError::DoesNotFit)
        };
        hop(first, rx, on[1])?;
        for m in 1..j {
            hop(m, on[0], on[1])?;
        }
        hop(last, on[0], tx)
    };
    // each row past the first up the strip from its east end, and its
    // share of the gradient back down and west along it
    for (j, &(y, dy)) in (1..).zip(fan.iter().flat_map(|f| &f.colours[1..])) {
        along(laid, y, j, false, Dir::W, Dir::Ramp)?;
        if fan.as_ref().is_some_and(|f| f.grad.is_some()) {
            along(laid, dy, j, true, Dir::Ramp, Dir::W)?;
        }
    }
    // each replica's samples down the strip, and back
    for (j, &(to, back)) in (1..).zip(cs) {
        along(laid, to, j, true, Dir::Ramp, Dir::Ramp)?;
        along(laid, back, j, false, Dir::Ramp, Dir::Ramp)?;
    }
    Ok(())
}

/// The routes of a vector strip's ports on each of its lanes: forward inputs from the
/// frame's west and backward ones from its east (on to the kernel beyond when it reads
/// them too), the gradients that pass over the strip, and its outputs on.
pub(super) fn ports(
    f: &Formed,
    k: usize,
    p: &Placed,
    v: &Vector,
    lanes: u32,
    c: &Colouring,
    laid: &mut Laid,
) -> Result<(), LayoutError> {
    for l in 0..lanes {
        let at = p.orient.at((p.x, p.y), 0, l);
        let o = p.orient;
        for port in &v.inputs {
            // forward inputs from the frame's west, backward ones from its east
            let from = if port.bwd { Dir::E } else { Dir::W };
            if st_from_host(f, port.node) || port.carried > 0 {
                continue;
            }
            // a stream that goes on to the kernel beyond this strip (a
            // layer's input gradient that the bias before it also sums)
            // passes through
            let beyond = if port.bwd {
                k.checked_sub(1)
            } else {
                Some(k + 1)
            };
            let through = beyond.is_some_and(|b| {
                !f.carried(port.node, b)
                    && f.streams
                        .iter()
                        .any(|s| s.node == port.node && s.to.contains(&End::Kernel(b)))
            });
            let to = if port.bwd { Dir::W } else { Dir::E };
            let tx: &[Dir] = if through {
                &[Dir::Ramp, to]
            } else {
                &[Dir::Ramp]
            };
            laid.route(at, port.colour, o.route(from, tx))
                .map_err(LayoutError::DoesNotFit)?;
        }
        // a gradient that passes over the strip without it reading it
        for st in &f.streams {
            if passes_over(f, st) == Some(k) && !st.to.contains(&End::Kernel(k)) {
                let c = c.into(st.node, k).unwrap_or(0);
                laid.route(at, c, o.route(Dir::E, &[Dir::W]))
                    .map_err(LayoutError::DoesNotFit)?;
            }
        }
        for port in &v.outputs {
            if port.carried > 0
                || f.streams
                    .iter()
                    .any(|s| s.node == port.node && s.to.contains(&End::Host))
            {
                continue;
            }
            let to = if port.bwd { Dir::W } else { Dir::E };
            laid.route(at, port.colour, o.route(Dir::Ramp, &[to]))
                .map_err(LayoutError::DoesNotFit)?;
        }
    }
    Ok(())
}

/// The words a sample, and the words a unit, of the value layer `k` (of dims `dims`,
/// its forward node `fwd`) passes on for a skip of several kernels, or carries beside
/// its input (`Dense::pass`, `pass_px`): an image by channels, a sequence by features
/// (a word a token), as the kernels on either side deal it; `(0, 1)` for none.
fn passed_on(
    g: &Graph,
    f: &Formed,
    k: usize,
    fwd: NodeIndex,
    dims: Option<Dims>,
) -> Result<(u32, u32, u32), LayoutError> {
    let passed = f.passed(k);
    if passed.is_some() && f.carry(k).is_some() {
        return Err(unsupported(
            g,
            fwd,
            "a layer inside one residual that carries another (nested skips) has no wafer layout yet".into(),
            "end one residual before the next begins",
        ));
    }
    let beside = passed.or(f.carries_beside(k));
    let pass = beside.map_or(0, |c| {
        (g.ty(c.x).elements() / f.batch.max(1) as usize) as u32
    });
    let shape = dims.map(|d| d.shape);
    let pass_px = match beside {
        Some(c) if matches!(shape, Some(Shape::Conv(_))) => {
            form::planes(g, c.x).map_or(1, |(pixels, _)| pixels)
        }
        Some(c) if matches!(shape, Some(Shape::Tokens { .. })) && g.ty(c.x).rank() == 3 => {
            g.ty(c.x).shape[1] as u32
        }
        _ => 1,
    };
    // (an image's rows, which bands split)
    let rows = match beside {
        Some(c) if matches!(shape, Some(Shape::Conv(_))) => form::image(g, c.x).map_or(1, |i| i.0),
        _ => 1,
    };
    Ok((pass, pass_px, rows))
}

/// Dense kernel `k` (of dims `dims`, its columns in `groups`: `Dense::groups`) with its
/// variables, gradient, host values and update: all but its lanes.
pub(super) fn dense_kernel(
    g: &Graph,
    f: &Formed,
    k: usize,
    (dims, groups): (Option<Dims>, u32),
    (window, fifo): (u32, u32),
) -> Result<Dense, LayoutError> {
    let kr = &f.kernels[k];
    let Kind::Dense {
        w,
        fwd,
        dw,
        dy,
        ref more,
        ..
    } = kr.kind
    else {
        return Err(LayoutError::DoesNotFit(format!(
            "kernel {k} is not a layer"
        )));
    };
    let names =
        |vars: &[NodeIndex]| -> Vec<String> { vars.iter().map(|&v| form::name_of(g, v)).collect() };
    // how a carried value's gradient (a residual's, a side part's) comes back: not at
    // all, as the layer's output gradient itself, or beside it
    let back = |grad: Option<NodeIndex>| match grad {
        None => dense::Back::Not,
        Some(g) if dy.is_some_and(|d| f.resolve(d) == f.resolve(g)) => dense::Back::Same,
        Some(_) => dense::Back::Beside,
    };
    // each part's share of the update: its own weight, slots and gradient
    let shares: Vec<_> = (0..=more.len())
        .map(|p| form::part_update(g, f, k, p))
        .collect();
    let update = |p: usize, w: NodeIndex, dw: Option<NodeIndex>| -> Result<_, LayoutError> {
        let (vars, steps, commits) = &shares[p];
        let u = match dw {
            Some(dw) => form::update_over(
                g,
                f,
                (steps, commits),
                (vars, &[dw], &kr.hosts),
                &g.ty(w).shape,
            )?,
            None => Update::default(),
        };
        Ok((names(vars), u))
    };
    // the parts' updates partition the layer's: each step node and commit in one
    if !more.is_empty() {
        // each in exactly one: as many in all as in the layer, and all different
        let once = |all: Vec<NodeIndex>, want: usize| {
            let n = all.len();
            n == want && all.into_iter().collect::<BTreeSet<_>>().len() == n
        };
        let steps = shares.iter().flat_map(|s| s.1.iter().copied()).collect();
        let commits = shares
            .iter()
            .flat_map(|s| s.2.iter().map(|c| c.1))
            .collect();
        if !once(steps, kr.steps.len()) || !once(commits, kr.commits.len()) {
            return Err(unsupported(
                g,
                fwd,
                "a layer of several products whose updates share a value has no wafer kernel yet"
                    .into(),
                "update each product's weight from its own gradient and slots",
            ));
        }
    }
    let (vars, update_main) = match form::joined_shares(g, f, k) {
        Some(shares) => joined_update(g, f, k, w, &shares)?,
        None => update(0, w, dw)?,
    };
    let mut parts = Vec::new();
    for (p, part) in more.iter().enumerate() {
        let (vars, u) = update(p + 1, part.w, part.dw)?;
        let ws = &g.ty(part.w).shape;
        let shape = match g.node(part.mm).op {
            Op::Gather => Shape::Gather {
                t: (g.ty(part.x).elements() / f.batch.max(1) as usize) as u32,
            },
            _ => Shape::Matmul,
        };
        parts.push(Dense {
            k: ws[0] as u32,
            n: ws[1] as u32,
            shape,
            batch: f.batch,
            window,
            fifo,
            train: part.dw.is_some(),
            dx: false,
            vars,
            grad: part.dw.map(form::key).unwrap_or_default(),
            hosts: kr.hosts.iter().map(|&h| form::key(h)).collect(),
            update: u,
            more: Vec::new(),
            carry: None,
            first: false,
            pass: 0,
            pass_px: 1,
            pass_rows: 1,
            side: part.side.then(|| back(part.dy)),
            joined: part.joined,
            // (a side part's outputs lie beside the layer's, in its rows' groups)
            groups: if part.beside() { groups } else { 1 },
            half: None,
            bands: (1, 1),
        });
    }
    let update = update_main;
    // its own input carried past it, or a value it passes on (of its width a sample)
    let carried = f.carried_past(k);
    let (pass, pass_px, pass_rows) = passed_on(g, f, k, fwd, dims)?;
    let Some(d) = dims else {
        return Err(unsupported(
            g,
            fwd,
            "a layer without an output".into(),
            "give the convolution an output of at least one pixel",
        ));
    };
    Ok(Dense {
        k: d.k,
        n: d.n,
        shape: d.shape,
        batch: f.batch,
        window,
        fifo,
        train: d.train,
        dx: d.dx,
        vars,
        grad: dw.map(form::key).unwrap_or_default(),
        hosts: kr.hosts.iter().map(|&h| form::key(h)).collect(),
        update,
        more: parts,
        carry: carried.map(|c| back(c.grad)),
        first: f.carries_first(k),
        pass,
        pass_px,
        pass_rows,
        side: None,
        joined: false,
        groups,
        half: d.half,
        bands: (1, 1),
    })
}

/// The update of layer `k` whose weight `w` is joined (`form::joined`): the first
/// variable's share over the whole blocks, under the joined storage's names
/// (`form::joined_storage`), when every share compiles to the same update (each a
/// variable of one optimiser's step, its slots in the same order).
fn joined_update(
    g: &Graph,
    f: &Formed,
    k: usize,
    w: NodeIndex,
    shares: &[form::Share],
) -> Result<(Vec<String>, Update), LayoutError> {
    let hosts = &f.kernels[k].hosts;
    let mut first: Option<Update> = None;
    for s in shares {
        let shape = &g.ty(s.vars[0]).shape;
        let u = form::update_over(
            g,
            f,
            (&s.steps, &s.commits),
            (&s.vars, &[s.grad], hosts),
            shape,
        )?;
        match &first {
            Some(f0) if *f0 != u || s.vars.len() != shares[0].vars.len() => {
                return Err(unsupported(
                    g,
                    s.vars[0],
                    "variables fused into one layer whose updates differ have no wafer kernel"
                        .into(),
                    "train the layers of one value alike: one optimiser, and the same regulariser on each weight (or none)",
                ));
            }
            Some(_) => {}
            None => first = Some(u),
        }
    }
    let names = (0..shares[0].vars.len())
        .map(|j| form::joined_storage(w, j))
        .collect();
    Ok((names, first.unwrap_or_default()))
}
