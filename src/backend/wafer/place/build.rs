//! A sizing's layout, pass by pass: the kernels placed as a staircase (`place`),
//! their streams coloured (`colour`), each kernel laid on its place (`lay`), the host's
//! streams routed (`host`), every PE's memory checked, and the whole checked legal.

use super::check::{check, memory};
use super::lanes::{staircase, Lanes};
use super::sizer::Sizer;
use super::{colour, host, kernel_name, kernel_span, lay};
use super::{Layout, LayoutError, PesShort, Placed, SramShort};
use crate::backend::wafer::form::{self, Formed, Kind};
use crate::backend::wafer::kernels::{Laid, Piece};
use crate::backend::wafer::sim::Setup;
use crate::ir::Graph;

/// The layout of a sizing (`s`, the block size it came from, or 0).
pub(super) fn try_lanes(sizer: &Sizer, lanes: &Lanes, s: u32) -> Result<Layout, LayoutError> {
    let placed = place(sizer, lanes, s)?;
    let colours = colour::colour(sizer, lanes, &placed)?;
    let mut all = lay::kernels(sizer, lanes, &placed, &colours)?;
    joined_pieces(sizer.g, sizer.f, &mut all);
    let inputs = host::inputs(sizer, lanes, &placed, &colours, &mut all)?;
    let outputs = host::outputs(sizer, &placed, &colours, &mut all)?;
    fits(sizer, &placed, &all, s)?;
    let setup = Setup {
        pes: all.pes,
        routes: all.routes,
        inputs: host::host_inputs(&inputs),
    };
    let l = Layout {
        fabric: sizer.fab.clone(),
        batch: sizer.f.batch,
        setup,
        tensors: all.tensors,
        summed: all.summed,
        inputs,
        outputs,
        kernels: placed,
        block: s,
        estimate: 0,
    };
    // every layout is checked: it is cheap beside the simulation it leads to
    check(&l)
        .map_err(|e| LayoutError::DoesNotFit(format!("an illegal layout (a bug in estc): {e}")))?;
    Ok(l)
}

/// Each variable a layer's joined weight holds (`form::joined`) by its own name, and
/// each of its slots: its columns of the pieces of the layer's joined storage
/// (`form::joined_storage`), which the device reads and writes.
fn joined_pieces(g: &Graph, f: &Formed, all: &mut Laid) {
    for (k, kr) in f.kernels.iter().enumerate() {
        let Kind::Dense { w, .. } = kr.kind else {
            continue;
        };
        let Some(parts) = form::joined_columns(g, w) else {
            continue;
        };
        // (each part's names of the storage: the variable, then its slots)
        let names: Vec<Vec<String>> = match form::joined_shares(g, f, k) {
            Some(shares) => (shares.iter())
                .map(|s| s.vars.iter().map(|&v| form::name_of(g, v)).collect())
                .collect(),
            None => parts
                .iter()
                .map(|&(v, _)| vec![form::name_of(g, v)])
                .collect(),
        };
        let width = g.ty(w).shape[1] as u32;
        for j in 0..names[0].len() {
            let Some(pieces) = all.tensors.get(&form::joined_storage(w, j)).cloned() else {
                continue;
            };
            for ((_, cols), mine) in parts.iter().zip(&names) {
                let cols = cols.start as u32..cols.end as u32;
                let columns = Piece::columns(&pieces, width, cols);
                all.tensors
                    .entry(mine[j].clone())
                    .or_default()
                    .extend(columns);
            }
        }
    }
}

/// The kernels of a sizing placed as a staircase, or by how much it misses the fabric.
fn place(sizer: &Sizer, lanes: &Lanes, s: u32) -> Result<Vec<Placed>, LayoutError> {
    let (g, f, fab) = (sizer.g, sizer.f, sizer.fab);
    let mut placed = Vec::new();
    let mut off = None;
    let (mut sw, mut sh) = (0, 0);
    for (k, (at, (fw, fh), orient)) in staircase(f, lanes).into_iter().enumerate() {
        if off.is_none() && (at.0 + fw > fab.width || at.1 + fh > fab.height) {
            off = Some(k);
        }
        sw = sw.max(at.0 + fw);
        sh = sh.max(at.1 + fh);
        placed.push(Placed {
            name: kernel_name(g, f, k),
            x: at.0,
            y: at.1,
            w: fw,
            h: fh,
            orient,
        });
    }
    if let Some(k) = off {
        return Err(LayoutError::Pes(PesShort {
            kernel: placed[k].name.clone(),
            span: kernel_span(g, f, k),
            floor: false,
            block: s,
            extent: (sw, sh),
            pes: placed.iter().map(|p| u64::from(p.w * p.h)).sum(),
        }));
    }
    Ok(placed)
}

/// Whether every PE's memory fits its SRAM (the fullest PE's, by what it holds, when
/// not).
fn fits(sizer: &Sizer, placed: &[Placed], all: &Laid, s: u32) -> Result<(), LayoutError> {
    let (g, f, fab) = (sizer.g, sizer.f, sizer.fab);
    let nk = f.kernels.len();
    let words = fab.usable_bytes() / crate::backend::wafer::cost::WORD;
    if let Some(((x, y), (prog, _))) = all.pes.iter().max_by_key(|(_, (p, _))| p.words()) {
        if prog.words() > words {
            if std::env::var_os("EST_WAFER_DEBUG").is_some() {
                eprintln!("{:?}", prog.symbols);
            }
            let k = placed
                .iter()
                .position(|k| *x >= k.x && *x < k.x + k.w && *y >= k.y && *y < k.y + k.h);
            let parts = memory(prog, fab);
            let one_lane = |j: usize| {
                matches!(f.kernels[j].kind, Kind::Vector { .. }) && sizer.width[j].is_none()
            };
            let pinned = k
                .filter(|&k| {
                    matches!(f.kernels[k].kind, Kind::Dense { .. })
                        && k > 0
                        && k + 1 < nk
                        && one_lane(k - 1)
                        && one_lane(k + 1)
                })
                .map(|k| placed[k - 1].name.clone());
            let keeps = k
                .filter(|&k| (k..nk).any(|j| f.barriers[j]) && sizer.sched[k].0 == f.batch)
                .map(|_| f.batch);
            return Err(LayoutError::Sram(SramShort {
                pinned,
                keeps,
                // (or a heads kernel with a head a lane)
                whole: k.is_some_and(|k| {
                    let lanes = u64::from(placed[k].w) * u64::from(placed[k].h);
                    one_lane(k) || sizer.heads[k].is_some_and(|h| u64::from(h) == lanes)
                }),
                kernel: k.map_or_else(|| "a kernel".to_string(), |k| placed[k].name.clone()),
                span: k.and_then(|k| kernel_span(g, f, k)),
                at: (*x, *y),
                block: s,
                pes: k.map_or(1, |k| u64::from(placed[k].w) * u64::from(placed[k].h)),
                parts,
                need: prog.words() * crate::backend::wafer::cost::WORD + fab.reserved_bytes,
                have: fab.sram_bytes,
            }));
        }
    }
    Ok(())
}
