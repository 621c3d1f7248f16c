//! The legality check of a layout (every kernel on the fabric and apart, memory,
//! colours, routes, link loads) and the measures reports print (memory by what it
//! holds, sizes).

use super::Layout;
use crate::backend::wafer::fabric::Fabric;
use crate::backend::wafer::isa::Colour;
use crate::backend::wafer::isa::Program;
use crate::backend::wafer::kernels::UPDATE;
use crate::backend::wafer::sim::Dir;
use std::collections::{BTreeMap, BTreeSet};

/// Why a layout is not legal, if it is not: a kernel off the fabric or over another,
/// a PE whose memory map exceeds its SRAM, a colour beyond the programs' budget, a
/// route that leads nowhere, loops or merges (what `Sim::new` refuses), or a link that
/// carries more wavelets a step (`link_loads`) than the busiest PE has cycles in one (a
/// link carries one a cycle: the fabric, not the kernels, would bound the step).
pub fn check(l: &Layout) -> Result<(), String> {
    let f = &l.fabric;
    for (i, k) in l.kernels.iter().enumerate() {
        if k.x + k.w > f.width || k.y + k.h > f.height {
            return Err(format!(
                "kernel {} runs off the {}x{} fabric",
                k.name, f.width, f.height
            ));
        }
        for o in &l.kernels[..i] {
            let apart =
                k.x + k.w <= o.x || o.x + o.w <= k.x || k.y + k.h <= o.y || o.y + o.h <= k.y;
            if !apart {
                return Err(format!("kernels {} and {} overlap", o.name, k.name));
            }
        }
    }
    let words = f.usable_bytes() / crate::backend::wafer::cost::WORD;
    for ((x, y), (p, _)) in &l.setup.pes {
        if p.words() > words {
            return Err(format!(
                "PE ({x}, {y}) needs {} words of SRAM, more than its {words}",
                p.words()
            ));
        }
        let inside = l
            .kernels
            .iter()
            .any(|k| *x >= k.x && *x < k.x + k.w && *y >= k.y && *y < k.y + k.h);
        if !inside {
            return Err(format!("PE ({x}, {y}) runs a program outside every kernel"));
        }
    }
    for ((x, y), (p, _)) in &l.setup.pes {
        let brought = |c: Colour| {
            l.setup
                .routes
                .get(&(*x, *y, c))
                .is_some_and(|r| r.tx().any(|d| d == Dir::Ramp))
        };
        for t in &p.tasks {
            if let crate::backend::wafer::isa::Trigger::Data(c) = t.trigger {
                if !brought(c) {
                    return Err(format!(
                        "PE ({x}, {y}): task `{}` runs on colour {c}, which no route brings",
                        t.name
                    ));
                }
            }
        }
    }
    let budget = f.program_colours();
    if let Some((x, y, c)) = l.setup.routes.keys().find(|k| u32::from(k.2) >= budget) {
        return Err(format!(
            "router ({x}, {y}) routes colour {c}, beyond the {budget} programs may use"
        ));
    }
    crate::backend::wafer::sim::Sim::new(f, &l.setup).map_err(|e| e.0)?;
    let batch = l.batch.max(1);
    let busiest = (l.setup.pes.values())
        .map(|(p, _)| {
            crate::backend::wafer::cost::per_sample(f, p, batch, UPDATE) * u64::from(batch)
        })
        .max()
        .unwrap_or(0);
    if let Some(((x, y, d), n)) = link_loads(l).into_iter().max_by_key(|&(_, n)| n) {
        if n > busiest {
            return Err(format!(
                "the link leaving router ({x}, {y}) {} carries {n} wavelets a step, more than the {busiest} cycles a step of the busiest PE",
                d.name()
            ));
        }
    }
    Ok(())
}

/// Per link (a router, and the port wavelets leave it by): the wavelets a step sends
/// across it. Each stream's are counted at its source (a PE's program's, `cost::sends`;
/// a host lane's elements of every sample) and cross every link of its route tree.
pub fn link_loads(l: &Layout) -> BTreeMap<(u32, u32, Dir), u64> {
    let f = &l.fabric;
    let batch = u64::from(l.batch.max(1));
    let routes = &l.setup.routes;
    let mut load = BTreeMap::new();
    for (&(x, y, c), r) in routes {
        let sent = if r.rx == Dir::Ramp {
            (l.setup.pes.get(&(x, y)))
                .map_or(0, |(p, _)| crate::backend::wafer::cost::sends(p, c, batch))
        } else if r.rx.step(x, y, f).is_none() {
            (l.inputs.iter().flat_map(|s| &s.lanes))
                .filter(|h| (h.x, h.y, h.colour) == (x, y, c))
                .map(|h| h.elems.len() as u64 * batch)
                .sum()
        } else {
            continue;
        };
        let mut todo = vec![(x, y)];
        let mut seen = BTreeSet::new();
        while let Some((x, y)) = todo.pop() {
            let Some(r) = routes.get(&(x, y, c)) else {
                continue;
            };
            if !seen.insert((x, y)) {
                continue;
            }
            for d in r.tx().filter(|&d| d != Dir::Ramp) {
                *load.entry((x, y, d)).or_default() += sent;
                todo.extend(d.step(x, y, f));
            }
        }
    }
    load.retain(|_, n| *n > 0);
    load
}

pub fn bytes(b: u32) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", f64::from(b) / f64::from(1u32 << 20))
    } else {
        format!("{:.1} KiB", f64::from(b) / 1024.0)
    }
}

/// A program's memory by what it holds: weights, gradients, optimiser state, stashed
/// activations, buffers (streams in flight, temporaries, constants); the non-zero ones.
/// A PE's memory by what it holds, in bytes (code and runtime first), the non-zero
/// parts.
pub fn memory(p: &Program, fab: &Fabric) -> Vec<(&'static str, u32)> {
    let mut parts = vec![("code and runtime", fab.reserved_bytes)];
    parts.extend(breakdown(p));
    parts
}

fn breakdown(p: &Program) -> Vec<(&'static str, u32)> {
    let mut parts = [0u32; 6];
    for s in &p.symbols {
        let i = if s.name.ends_with(" fifo") {
            5
        } else if s.name.contains("stash") {
            3
        } else if s.name.starts_with('%') {
            1
        } else if s.name.contains('/')
            && p.symbols
                .iter()
                .any(|o| o.name != s.name && s.name.starts_with(&format!("{}/", o.name)))
        {
            2
        } else if s.name.contains('/') {
            0
        } else {
            4
        };
        parts[i] += s.len * crate::backend::wafer::cost::WORD;
    }
    let names = [
        "weights",
        "gradients",
        "optimiser state",
        "stashed activations",
        "buffers",
        "FIFOs",
    ];
    names
        .into_iter()
        .zip(parts)
        .filter(|(_, b)| *b > 0)
        .collect()
}

/// How a layout sized its kernels: one block size, or each to a common period (0).
pub fn sizing(block: u32) -> String {
    if block == 0 {
        "each kernel sized to a common period".to_string()
    } else {
        format!("with blocks of {block}")
    }
}
