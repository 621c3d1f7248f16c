//! The layer kernels run on the simulator against hand-computed and interpreted values.

use super::*;
use crate::backend::wafer::fabric::Fabric;
use crate::backend::wafer::kernels::{gather, gather_sum, scatter};
use crate::backend::wafer::lower::{Operand, UpdateOp};
use crate::backend::wafer::sim::{HostIn, Setup, Sim};
use crate::ir::{BinaryOp, DType, Op};
use proptest::prelude::*;

const C: Colours = Colours::with_streams(4, 5, 6, 7);

/// SGD: `W - lr * dW`, lr the host's value 0.
fn sgd() -> Update {
    let op = |op, args: Vec<Operand>, full| UpdateOp {
        op,
        args,
        full,
        types: (DType::F32, DType::F32),
    };
    Update {
        ops: vec![
            op(
                Op::Binary(BinaryOp::Mul),
                vec![Operand::Acc(0), Operand::Host(0)],
                true,
            ),
            op(
                Op::Binary(BinaryOp::Sub),
                vec![Operand::Var(0), Operand::Val(0)],
                true,
            ),
        ],
        commits: vec![(0, Operand::Val(1))],
    }
}

struct Run {
    y: Vec<f32>,
    dx: Vec<f32>,
    dw: Vec<f32>,
    w: Vec<f32>,
    /// The cycle the forward pass ended.
    forward: u64,
}

/// Runs `d` on a `w x h` frame against the fabric's edges (oriented `o`): the
/// forward pass over the samples `x` (training: and the backward pass over `dy`, in
/// the pipeline's order), then the update with learning rate `lr`.
#[allow(clippy::too_many_arguments)]
fn run(
    d: &Dense,
    o: Orient,
    (w, h): (u32, u32),
    x: &[f32],
    dy: &[f32],
    weights: &[f32],
    lr: f32,
) -> Run {
    let f = Fabric::named("test32").unwrap();
    let (wc, hr) = d.used(w, h);
    // a sample's inputs and outputs, and each lane's
    let (pi, po) = (d.shape.per_in(), d.shape.per_out());
    let (kk, nn) = (d.k * pi, d.n * po);
    // each column's inputs of a sample: its share, or an embedding's every id
    let column = |i: u32| match d.shape {
        Shape::Gather { t } => 0..t,
        _ => d.column_words(wc, i),
    };
    let kk = match d.shape {
        Shape::Gather { t } => t,
        _ => kk,
    };
    let (fw, fh) = o.size(wc, hr);
    // inputs at the fabric's edge, outputs off the opposite one
    let origin = match o {
        Orient::North => (f.width - fw, 0),
        Orient::West => (0, f.height - fh),
    };
    let laid = d.lay(origin, o, (w, h), C).unwrap();
    let mut setup = Setup {
        pes: laid.pes.clone(),
        routes: laid.routes.clone(),
        inputs: Vec::new(),
    };
    for i in 0..wc {
        let (px, py) = o.at(origin, i, 0);
        setup.inputs.push(HostIn {
            x: px,
            y: py,
            colour: C.x,
            values: vec![],
        });
    }
    if d.train {
        for j in 0..hr {
            let (px, py) = o.at(origin, wc - 1, j);
            setup.inputs.push(HostIn {
                x: px,
                y: py,
                colour: C.dy,
                values: vec![],
            });
        }
    }
    let mut sim = Sim::new(&f, &setup).unwrap();
    scatter(&laid.tensors["W"], weights, |(x, y), a, v| {
        assert!(sim.write(x, y, a, v))
    });
    if d.train {
        scatter(&laid.tensors["lr"], &[lr], |(x, y), a, v| {
            assert!(sim.write(x, y, a, v))
        });
    }
    for i in 0..wc {
        let ks = column(i);
        let values: Vec<f32> = (0..d.batch)
            .flat_map(|s| ks.clone().map(move |k| x[(s * kk + k) as usize]))
            .collect();
        let (px, py) = o.at(origin, i, 0);
        assert!(sim.feed(px, py, C.x, &values));
    }
    // (training: the output gradients too, which the PEs take in the pipeline's
    // order, a backward after each forward once the window is full)
    for j in 0..hr {
        if !d.train {
            break;
        }
        let ns = d.row_words(hr, j);
        let values: Vec<f32> = (0..d.batch)
            .flat_map(|s| ns.clone().map(move |n| dy[(s * nn + n) as usize]))
            .collect();
        let (px, py) = o.at(origin, wc - 1, j);
        assert!(sim.feed(px, py, C.dy, &values));
    }
    let forward = sim.run().unwrap();
    let mut y = vec![f32::NAN; (d.batch * nn) as usize];
    for j in 0..hr {
        let ns = d.row_words(hr, j);
        let (px, py) = o.at(origin, wc - 1, j);
        let out = sim.output(px, py, o.dir(Dir::E), C.y);
        assert_eq!(out.len() as u32, d.batch * ns.len() as u32);
        for (t, &(_, v)) in out.iter().enumerate() {
            let (s, m) = (t as u32 / ns.len() as u32, t as u32 % ns.len() as u32);
            y[(s * nn + ns.start + m) as usize] = v;
        }
    }
    let mut r = Run {
        y,
        dx: vec![],
        dw: vec![],
        w: vec![],
        forward,
    };
    if !d.train {
        return r;
    }
    if d.dx {
        r.dx = vec![f32::NAN; (d.batch * kk) as usize];
        for i in 0..wc {
            let ks = d.column_words(wc, i);
            let (px, py) = o.at(origin, i, 0);
            let out = sim.output(px, py, o.dir(Dir::N), C.dx);
            assert_eq!(out.len() as u32, d.batch * ks.len() as u32);
            for (t, &(_, v)) in out.iter().enumerate() {
                let (s, m) = (t as u32 / ks.len() as u32, t as u32 % ks.len() as u32);
                r.dx[(s * kk + ks.start + m) as usize] = v;
            }
        }
    }
    let kn = weights.len();
    let dw = &laid.tensors["dW"];
    if laid.summed.contains("dW") {
        // (each PE's part of the gradient, summed and written back into every one,
        // as the device does before the updates)
        r.dw = gather_sum(dw, kn, |(x, y)| sim.memory(x, y));
        scatter(dw, &r.dw, |(x, y), a, v| assert!(sim.write(x, y, a, v)));
    } else {
        r.dw = gather(dw, kn, |(x, y)| sim.memory(x, y));
    }
    for ((x, y), (p, _)) in &laid.pes {
        let has = p.tasks.iter().any(|t| t.id == UPDATE);
        assert_eq!(sim.launch(*x, *y, UPDATE), has);
    }
    sim.run().unwrap();
    r.w = gather(&laid.tensors["W"], kn, |(x, y)| sim.memory(x, y));
    // the gradient is zeroed for the next step
    assert!(gather(&laid.tensors["dW"], kn, |(x, y)| sim.memory(x, y))
        .iter()
        .all(|&v| v == 0.0));
    r
}

/// A layer that trains on `batch` samples a step, `window` of them in flight.
fn trained(k: u32, n: u32, (batch, window): (u32, u32), dx: bool) -> Dense {
    Dense {
        k,
        n,
        shape: Shape::Matmul,
        batch,
        window: window.clamp(1, batch),
        fifo: 0,
        train: true,
        dx,
        vars: vec!["W".into()],
        grad: "dW".into(),
        hosts: vec!["lr".into()],
        update: sgd(),
        more: Vec::new(),
        carry: None,
        first: false,
        pass: 0,
        pass_px: 1,
        pass_rows: 1,
        side: None,
        joined: false,
        groups: 1,
        half: None,
        bands: (1, 1),
    }
}

/// Within `tol` of the sum of the terms' magnitudes (the wafer sums in another
/// order than a CPU: each PE's terms in order, then the PEs' partials along the
/// chain).
fn close(got: f32, terms: impl Iterator<Item = f64> + Clone, tol: f64) -> Result<(), String> {
    let exact: f64 = terms.clone().sum();
    let scale: f64 = terms.map(f64::abs).sum();
    let got = f64::from(got);
    if (got - exact).abs() <= tol * scale + 1e-7 {
        Ok(())
    } else {
        Err(format!("{got}, not {exact}"))
    }
}

fn uniforms(seed: u64, at: u64, n: u32) -> Vec<f32> {
    crate::rng::Stream::new(seed, 0)
        .uniforms(at, n as usize, 0)
        .iter()
        .map(|u| u * 2.0 - 1.0)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    /// The forward pass, the input and weight gradients and an SGD update, against
    /// the same products in f64: within 1e-5 of the sum of the terms' magnitudes.
    #[test]
    fn training_equals_the_products(
        k in 1u32..30, n in 1u32..30, batch in 1u32..5, window in 1u32..5, w in 1u32..7,
        h in 1u32..7, seed in 0u64..1000, west in any::<bool>(), dx in any::<bool>(),
    ) {
        let d = trained(k, n, (batch, window), dx);
        let x = uniforms(seed, 0, batch * k);
        let wt = uniforms(seed, 1 << 20, k * n);
        let dy = uniforms(seed, 2 << 20, batch * n);
        let lr = 0.25;
        let o = if west { Orient::West } else { Orient::North };
        let r = run(&d, o, (w, h), &x, &dy, &wt, lr);
        let (x64, w64, dy64) = (|i: u32| f64::from(x[i as usize]), |i: u32| f64::from(wt[i as usize]), |i: u32| f64::from(dy[i as usize]));
        for s in 0..batch {
            for m in 0..n {
                close(r.y[(s * n + m) as usize], (0..k).map(|kk| x64(s * k + kk) * w64(kk * n + m)), 1e-5)
                    .map_err(|e| TestCaseError::fail(format!("y[{s}][{m}] = {e}")))?;
            }
            if dx {
                for kk in 0..k {
                    close(r.dx[(s * k + kk) as usize], (0..n).map(|m| dy64(s * n + m) * w64(kk * n + m)), 1e-5)
                        .map_err(|e| TestCaseError::fail(format!("dx[{s}][{kk}] = {e}")))?;
                }
            }
        }
        for kk in 0..k {
            for m in 0..n {
                let g = (0..batch).map(|s| x64(s * k + kk) * dy64(s * n + m));
                close(r.dw[(kk * n + m) as usize], g.clone(), 1e-5)
                    .map_err(|e| TestCaseError::fail(format!("dW[{kk}][{m}] = {e}")))?;
                let after = std::iter::once(w64(kk * n + m)).chain(g.map(|v| -0.25 * v));
                close(r.w[(kk * n + m) as usize], after, 1e-5)
                    .map_err(|e| TestCaseError::fail(format!("W[{kk}][{m}] = {e}")))?;
            }
        }
    }
}

/// The input pixel under output `(oh, ow)` at filter tap `(r, s)`, if inside.
fn under(g: &Geom, (oh, ow): (u32, u32), (r, s): (u32, u32)) -> Option<(u32, u32)> {
    let ih = (oh * g.stride.0 + r * g.dil.0)
        .checked_sub(g.pad.0)
        .filter(|&v| v < g.h)?;
    let iw = (ow * g.stride.1 + s * g.dil.1)
        .checked_sub(g.pad.1)
        .filter(|&v| v < g.w)?;
    Some((ih, iw))
}

/// The products of convolution `g` (`a` input channels, `b` output channels): for each
/// tap, channel pair and output pixel over an input pixel, that input's index in a
/// sample's planes, the filter tap's `(t, in, out)`, and the output's index.
fn convolution(g: &Geom, (a, b): (u32, u32)) -> Vec<(u32, (u32, u32, u32), u32)> {
    let mut out = Vec::new();
    for t in 0..g.r * g.s {
        for c in 0..a {
            for m in 0..b {
                for oh in 0..g.ho {
                    for ow in 0..g.wo {
                        if let Some((ih, iw)) = under(g, (oh, ow), (t / g.s, t % g.s)) {
                            let x = (c * g.h + ih) * g.w + iw;
                            out.push((x, (t, c, m), (m * g.ho + oh) * g.wo + ow));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Checks a run's outputs, input gradient (when `dx`), weight gradient and SGD update
/// (lr 0.25) against the sums in f64 of a layer's products (`links`: the input, weight
/// and output index of each, within a sample of `per` inputs and outputs): within 1e-5
/// of the sum of the terms' magnitudes.
fn sums_of(
    r: &Run,
    links: &[(u32, u32, u32)],
    (x, wt, dy): (&[f32], &[f32], &[f32]),
    (batch, per): (u32, (u32, u32)),
    dx: bool,
) -> Result<(), TestCaseError> {
    let (px, py) = (per.0 as usize, per.1 as usize);
    let (mut y, mut dxs) = (
        vec![Vec::new(); batch as usize * py],
        vec![Vec::new(); batch as usize * px],
    );
    let mut dw = vec![Vec::new(); wt.len()];
    for s in 0..batch as usize {
        for &(i, w, o) in links {
            let (i, w, o) = (s * px + i as usize, w as usize, s * py + o as usize);
            let (xv, wv, dyv) = (f64::from(x[i]), f64::from(wt[w]), f64::from(dy[o]));
            y[o].push(xv * wv);
            dxs[i].push(dyv * wv);
            dw[w].push(xv * dyv);
        }
    }
    let check = |what: &str, got: &[f32], sums: &[Vec<f64>]| {
        for (q, terms) in sums.iter().enumerate() {
            close(got[q], terms.iter().copied(), 1e-5)
                .map_err(|e| TestCaseError::fail(format!("{what}[{q}] = {e}")))?;
        }
        Ok::<(), TestCaseError>(())
    };
    check("y", &r.y, &y)?;
    if dx {
        check("dx", &r.dx, &dxs)?;
    }
    check("dW", &r.dw, &dw)?;
    let after: Vec<Vec<f64>> = (dw.iter().zip(wt))
        .map(|(g, &w)| {
            std::iter::once(f64::from(w))
                .chain(g.iter().map(|v| -0.25 * v))
                .collect()
        })
        .collect();
    check("W", &r.w, &after)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    /// A convolution's (any strides, dilations, padding) forward pass, input and filter
    /// gradients and an SGD update, against the same sums in f64 (planar images, an
    /// HWIO filter): within 1e-5 of the sum of the terms' magnitudes.
    #[test]
    fn a_convolution_equals_the_sums(
        k in 1u32..5, n in 1u32..5, h in 1u32..9, w in 1u32..9, r in 1u32..4, s in 1u32..4,
        dil in (1u32..3, 1u32..3), stride in (1u32..4, 1u32..4), same in any::<bool>(), batch in 1u32..4,
        window in 1u32..3, fw in 1u32..4, fh in 1u32..4, seed in 0u64..1000, west in any::<bool>(), dx in any::<bool>(),
    ) {
        let Some(g) = Geom::new(h, w, (r, s), dil, stride, same) else {
            return Ok(());
        };
        let mut d = trained(k, n, (batch, window), dx);
        d.shape = Shape::Conv(g);
        let (pi, po) = (h * w, g.ho * g.wo);
        let x = uniforms(seed, 0, batch * k * pi);
        let wt = uniforms(seed, 1 << 20, r * s * k * n);
        let dy = uniforms(seed, 2 << 20, batch * n * po);
        let o = if west { Orient::West } else { Orient::North };
        let run = run(&d, o, (fw, fh), &x, &dy, &wt, 0.25);
        // (HWIO: tap, input channel, output channel)
        let links: Vec<_> = (convolution(&g, (k, n)).into_iter())
            .map(|(x, (t, c, m), y)| (x, (t * k + c) * n + m, y))
            .collect();
        sums_of(&run, &links, (&x, &wt, &dy), (batch, (k * pi, n * po)), dx)?;
    }

    /// A convolution in bands of rows (each column a channel's band of the input, each
    /// row a channel's band of the output; any strides, dilations, padding), against
    /// the same sums in f64 as one of whole planes: within 1e-5 of the sum of the
    /// terms' magnitudes.
    #[test]
    fn a_convolution_in_bands_equals_the_sums(
        k in 1u32..4, n in 1u32..4, h in 1u32..12, w in 1u32..6, r in 1u32..4, s in 1u32..4,
        dil in (1u32..3, 1u32..3), stride in (1u32..4, 1u32..3), same in any::<bool>(), batch in 1u32..4,
        window in 1u32..3, bands in (1u32..5, 1u32..5), seed in 0u64..1000, west in any::<bool>(), dx in any::<bool>(),
    ) {
        let Some(g) = Geom::new(h, w, (r, s), dil, stride, same) else {
            return Ok(());
        };
        // (bands that each hold a row)
        let bands = (used(h, bands.0), used(g.ho, bands.1));
        if bands == (1, 1) {
            return Ok(());
        }
        let mut d = trained(k, n, (batch, window), dx);
        d.shape = Shape::Conv(g);
        d.bands = bands;
        let (pi, po) = (h * w, g.ho * g.wo);
        let x = uniforms(seed, 0, batch * k * pi);
        let wt = uniforms(seed, 1 << 20, r * s * k * n);
        let dy = uniforms(seed, 2 << 20, batch * n * po);
        let o = if west { Orient::West } else { Orient::North };
        let run = run(&d, o, (1, 1), &x, &dy, &wt, 0.25);
        let links: Vec<_> = (convolution(&g, (k, n)).into_iter())
            .map(|(x, (t, c, m), y)| (x, (t * k + c) * n + m, y))
            .collect();
        sums_of(&run, &links, (&x, &wt, &dy), (batch, (k * pi, n * po)), dx)?;
    }

    /// A transposed convolution's (the input gradient of a convolution of any strides
    /// and padding) forward pass, input and filter gradients and an SGD update, against
    /// the same sums in f64 (planar images; the filter `[r, s, out, in]`, as
    /// TensorFlow's): within 1e-5 of the sum of the terms' magnitudes.
    #[test]
    fn a_transposed_convolution_equals_the_sums(
        k in 1u32..5, n in 1u32..5, h in 1u32..9, w in 1u32..9, r in 1u32..4, s in 1u32..4,
        stride in (1u32..4, 1u32..4), same in any::<bool>(), batch in 1u32..4,
        window in 1u32..3, fw in 1u32..4, fh in 1u32..4, seed in 0u64..1000, west in any::<bool>(), dx in any::<bool>(),
    ) {
        // the convolution whose input gradient it is: its `n` channels of `h x w` in,
        // the layer's `k` of `ho x wo` out
        let Some(g) = Geom::new(h, w, (r, s), (1, 1), stride, same) else {
            return Ok(());
        };
        let mut d = trained(k, n, (batch, window), dx);
        d.shape = Shape::ConvT(g);
        let (pi, po) = (g.ho * g.wo, h * w);
        let x = uniforms(seed, 0, batch * k * pi);
        let wt = uniforms(seed, 1 << 20, r * s * k * n);
        let dy = uniforms(seed, 2 << 20, batch * n * po);
        let o = if west { Orient::West } else { Orient::North };
        let run = run(&d, o, (fw, fh), &x, &dy, &wt, 0.25);
        // (the convolution's input is the layer's output, its output the layer's input)
        let links: Vec<_> = (convolution(&g, (n, k)).into_iter())
            .map(|(y, (t, m, c), x)| (x, (t * n + m) * k + c, y))
            .collect();
        sums_of(&run, &links, (&x, &wt, &dy), (batch, (k * pi, n * po)), dx)?;
    }
}

proptest! {
    /// The output rows a band's taps run over (`Geom::reached`) hold every one whose
    /// window reads a row of the band, and, without dilation, no more (a dilated
    /// filter's taps may step over a thin band: such rows add zeros).
    #[test]
    fn a_band_reaches_the_rows_that_read_it(
        h in 1u32..30, r in 1u32..6, dil in 1u32..3, stride in 1u32..4, same in any::<bool>(),
        cut in (0u32..30, 0u32..30), outs in (0u32..30, 0u32..30),
    ) {
        let Some(g) = Geom::new(h, 4, (r, 1), (dil, 1), (stride, 1), same) else {
            return Ok(());
        };
        let (lo, hi) = (cut.0.min(cut.1) % h, (cut.0.max(cut.1) % h) + 1);
        let (o0, o1) = (outs.0.min(outs.1) % g.ho, (outs.0.max(outs.1) % g.ho) + 1);
        let Some(b) = g.band(lo..hi.max(lo + 1), o0..o1) else {
            return Ok(());
        };
        let band = b.pad.0..b.pad.0 + b.h;
        let reads = |u: u32| (0..b.r).any(|t| band.contains(&(b.top + u + t * b.dil.0)));
        let all: Vec<u32> = (0..b.h1()).filter(|&u| reads(u)).collect();
        let (first, rows) = b.reached();
        let last = first + rows - 1;
        prop_assert!(first <= all[0] && last >= *all.last().unwrap() && last < b.h1());
        if b.dil.0 == 1 {
            prop_assert_eq!((first, last), (all[0], *all.last().unwrap()));
        }
        // (a whole image: every row)
        prop_assert_eq!(g.reached(), (0, g.h1()));
    }
}

#[test]
fn bands_of_the_mnist_convolution_reach_their_rows_and_their_halos() {
    // 28 rows under a 5x5 filter, `same`: a band of 14 of 2 reaches 16 output rows
    // (two past it), a middle band of 9 of 3 reaches 13 (two each side)
    let g = Geom::new(28, 28, (5, 5), (1, 1), (1, 1), true).unwrap();
    assert_eq!(g.reached(), (0, 28));
    let rows = |ins: std::ops::Range<u32>| g.band(ins, 0..28).unwrap().reached();
    assert_eq!(rows(0..14), (0, 16));
    assert_eq!(rows(14..28), (12, 16));
    assert_eq!(rows(10..19), (8, 13));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]
    /// An embedding of `t` ids a sample from a `v x n` table: the rows it looks up,
    /// the rows' gradients added into the table's (an id met twice, twice) and an
    /// SGD update, exactly.
    #[test]
    fn an_embedding_looks_up_and_adds_its_rows(
        v in 1u32..40, n in 1u32..12, t in 1u32..4, batch in 1u32..4, window in 1u32..4,
        w in 1u32..7, h in 1u32..4, seed in 0u64..1000, west in any::<bool>(),
    ) {
        let mut d = trained(v, n, (batch, window), false);
        d.shape = Shape::Gather { t };
        // several ids a sample come out of one row of PEs (in the sample's order)
        let h = if t > 1 { 1 } else { h };
        let ids: Vec<f32> = uniforms(seed, 0, batch * t)
            .iter()
            .map(|u| ((u + 1.0) / 2.0 * v as f32).floor().min(v as f32 - 1.0))
            .collect();
        let wt = uniforms(seed, 1 << 20, v * n);
        let dy = uniforms(seed, 2 << 20, batch * t * n);
        let o = if west { Orient::West } else { Orient::North };
        let r = run(&d, o, (w, h), &ids, &dy, &wt, 0.25);
        let mut dw = vec![0.0f32; (v * n) as usize];
        for (q, &id) in ids.iter().enumerate() {
            for m in 0..n as usize {
                let row = id as usize * n as usize + m;
                prop_assert_eq!(r.y[q * n as usize + m], wt[row], "y[{}][{}]", q, m);
                dw[row] += dy[q * n as usize + m];
            }
        }
        prop_assert_eq!(&r.dw, &dw);
        let after: Vec<f32> = wt.iter().zip(&dw).map(|(w, g)| w - 0.25 * g).collect();
        prop_assert_eq!(&r.w, &after);
    }
}

#[test]
fn a_one_pe_layer_takes_hand_computed_cycles() {
    // k = 2, n = 3 on one PE, one sample: the inputs arrive at 4, 5 (the host sends
    // at 0, 1; ramp 2 + ramp 2); the task starts at 4 and runs 10 (switch) + 7
    // (receive 2: start-up 5, elements at 19, 20) + 8 (the first input's products:
    // a multiply of 3, 5 + 3) + 8 (the second's: a multiply-add of 3, 5 + 3) + 8
    // (send 3) = 41 cycles: the last output leaves at 4 + 40 and crosses the east
    // link (ramp 2, hop 1)
    let d = Dense::forward_only(2, 3, 1);
    let r = run(
        &d,
        Orient::North,
        (1, 1),
        &[1.0, 2.0],
        &[],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        0.0,
    );
    assert_eq!(r.y, [9.0, 12.0, 15.0]);
    assert_eq!(r.forward, 4 + 40 + 3);
}

/// A layer's columns in groups (the fused `q | k | v` before heads dealt to lanes): a
/// PE of row 1 of 2 holds its half of each group, a run per group in each weight row;
/// in one group, a run a weight row.
#[test]
fn grouped_columns_are_a_run_per_group() {
    let mut d = trained(2, 12, (4, 1), false);
    d.groups = 3;
    // 12 columns in 3 groups of 4: row 1 holds columns 2..4 of each
    let runs = vec![(2, 2), (6, 2), (10, 2), (14, 2), (18, 2), (22, 2)];
    assert_eq!(d.block(&[0, 1], &(6..12), 2), Ok(runs));
    // (over 3 rows, the groups of 4 do not split)
    assert!(d.block(&[0, 1], &(8..12), 3).is_err());
    d.groups = 1;
    assert_eq!(d.block(&[0, 1], &(6..12), 2), Ok(vec![(6, 6), (18, 6)]));
}
