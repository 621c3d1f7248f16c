//! The diagnostics of a graph the wafer cannot lay out: E0601 for what its kernels do
//! not do, and E0603, E0604 and E0605 for what does not fit (a PE's memory, the
//! fabric's PEs, its colours), each with a help that names what would (a block size, a
//! named fabric).

use super::fabric::Fabric;
use super::form::Unsupported;
use super::place::{self, LayoutError, SramShort};
use crate::diag::{Code, Diag};
use crate::span::Span;

/// E0601 for what the wafer's kernels do not do; E0603, E0604 and E0605 for what does
/// not fit (a PE's memory, the fabric's PEs, its colours).
pub fn layout_diag(e: LayoutError, fab: &Fabric, at: Span) -> Diag {
    let larger = larger_fabric(fab);
    match e {
        LayoutError::Unsupported(Unsupported {
            span,
            message,
            help,
        }) => Diag::new(Code::UnsupportedOp, span, message)
            .label("not on the wafer")
            .help(help),
        // a layer between two one-lane kernels: on one PE on any fabric
        LayoutError::Sram(SramShort {
            kernel,
            span: Some(span),
            pinned: Some(beside),
            need,
            have,
            ..
        }) => Diag::new(
            Code::UnsupportedOp,
            span,
            format!(
                "layer `{kernel}` has no wafer layout: the kernels on both sides of it (`{beside}` before it) run on one PE each, so it does too, and needs {} of SRAM there against {}",
                place::bytes(need),
                place::bytes(have)
            ),
        )
        .label("on one PE")
        .help("the wafer runs a reduction within a sample (`layer_norm`, a softmax) on one PE so far: move it off this layer's sides, use fewer units in this layer, or use the host target (`--target host`)"),
        LayoutError::Sram(s) => {
            let parts: Vec<String> = (s.parts.iter())
                .map(|(what, b)| format!("{} {what}", place::bytes(*b)))
                .collect();
            // the options that shrink a large part (a quarter of the whole or more)
            let large = |what: &str| {
                s.parts
                    .iter()
                    .any(|(w, b)| *w == what && u64::from(*b) * 4 >= u64::from(s.need))
            };
            let mut helps = Vec::new();
            if s.whole {
                // (more PEs would not divide a sample it holds whole)
                helps.push("fewer tokens, heads or features a sample (this kernel holds each sample, or each of its heads, whole on one PE, on any fabric: attention's products, whose scores grow as tokens x tokens a head, or a softmax over a sample's axes)".to_string());
                helps.push("the host target (`--target host`)".to_string());
            } else if s.keeps.is_some() && large("stashed activations") {
                helps.push(kept_batch(&s));
            } else {
                if large("stashed activations") {
                    helps.push(
                        "a smaller batch per step (it stashes fewer activations)".to_string(),
                    );
                }
                helps.push(spread(&s, fab).unwrap_or(larger));
            }
            if large("weights") || large("gradients") || large("optimiser state") {
                helps.push("fewer hidden units".to_string());
            }

            let layer = s.span.map(|l| (l, format!("{} per PE", place::bytes(s.need))));
            short(
                Code::WaferSram,
                (layer, at),
                format!(
                    "kernel `{}` needs {} of SRAM per PE on the {} fabric, which has {} ({} over): {} (at PE ({}, {}), {})",
                    s.kernel,
                    place::bytes(s.need),
                    fab.name,
                    place::bytes(s.have),
                    place::bytes(s.need - s.have.min(s.need)),
                    parts.join(", "),
                    s.at.0,
                    s.at.1,
                    place::sizing(s.block),
                ),
                &helps,
            )
        }
        LayoutError::Pes(p) => {
            let (dw, dh) = (
                p.extent.0.saturating_sub(fab.width),
                p.extent.1.saturating_sub(fab.height),
            );
            let mut missing = Vec::new();
            if dw > 0 {
                missing.push(format!("{dw} columns"));
            }
            if dh > 0 {
                missing.push(format!("{dh} rows"));
            }
            // (no named fabric holding it: the rectangle it needs, not a larger
            // fabric that would not hold it either)
            let beyond = || {
                format!(
                    "a fabric of at least {}x{} PEs (a `.toml` config: no named one is that large)",
                    p.extent.0, p.extent.1
                )
            };
            let mut helps = vec![holding(p.extent, fab).unwrap_or_else(beyond)];
            if p.floor {
                helps.push("a smaller batch per step (kernels take enough PEs to hold a step's stashed activations)".to_string());
            }
            helps.push("fewer layers".to_string());
            short(
                Code::WaferPes,
                (p.span.map(|l| (l, "runs off the fabric".into())), at),
                format!(
                    "the program needs more PEs than the {} fabric has: its smallest layout spans {}x{} PEs ({} in kernels, {}), the fabric {}x{}; {} short ({} PEs), and kernel `{}` runs off it first",
                    fab.name,
                    p.extent.0,
                    p.extent.1,
                    p.pes,
                    place::sizing(p.block),
                    fab.width,
                    fab.height,
                    missing.join(" and "),
                    p.missing(fab.width, fab.height),
                    p.kernel,
                ),
                &helps,
            )
        }
        LayoutError::Colours(c) => short(
            Code::WaferColours,
            (None, at),
            format!(
                "the program needs {} colours where its streams meet, and the {} fabric gives programs {}: {} short (the stream of `{}` found none free)",
                c.need,
                fab.name,
                c.have,
                c.need - c.have.min(c.need),
                c.stream
            ),
            &[format!("a fabric that gives programs at least {} colours (`colours` less `reserved_colours` in its .toml; the named configs give programs 18), or fewer separate inputs into the same layers", c.need)],
        ),
        LayoutError::DoesNotFit(why) => short(
            Code::WaferPes,
            (None, at),
            format!("the program does not fit the {} fabric: {why}", fab.name),
            &[larger, "fewer hidden units".to_string()],
        ),
    }
}

/// A does-not-fit diagnostic at the kernel's layer (with its label; the estimator
/// beside it), or at the estimator when the layer is not known; its help the options
/// that would help.
fn short(
    code: Code,
    (layer, at): (Option<(Span, String)>, Span),
    message: String,
    helps: &[String],
) -> Diag {
    let d = match layer {
        Some((span, label)) => Diag::new(code, span, message)
            .label(label)
            .with(at, "on the wafer: this estimator"),
        None => Diag::new(code, at, message).label("this estimator"),
    };
    d.help(format!("try {}", or_list(helps)))
}

/// The smallest named config of at least `w x h` PEs (the nearest layout's rectangle),
/// said as an option.
fn holding((w, h): (u32, u32), fab: &Fabric) -> Option<String> {
    let f = (super::fabric::NAMES.iter())
        .filter_map(|n| Fabric::named(n))
        .filter(|f| f.sram_bytes >= fab.sram_bytes)
        .find(|f| f.width >= w && f.height >= h)?;
    Some(format!(
        "a fabric of at least {w}x{h} PEs (`--wafer {}`, {}x{}, is the smallest named one)",
        f.name, f.width, f.height
    ))
}

/// The help of a kernel short of memory that keeps every sample of a step
/// (`SramShort::keeps`): its stash grows with the batch, so the largest batch its
/// sizing leaves room for (`SramShort::batch_that_fits`; other sizings, at a smaller
/// batch, may fit more). A larger fabric helps only where its images go in bands.
fn kept_batch(s: &place::SramShort) -> String {
    let why = "it keeps every sample of the step, since it (or a kernel after it) reads a statistic of the whole batch (batch norm in training); a larger fabric helps only where its images go in bands of rows (between convolutions, through residuals, projection shortcuts, depthwise convolutions and poolings), since a PE holding whole channels holds them for every sample";
    match s.batch_that_fits() {
        Some(fits) if fits >= 1 => format!("a batch of {fits} per step (or fewer), which this kernel has room for: {why}"),
        _ => format!("a model whose layers keep less of a sample before the batch's statistics: even one sample does not fit, and {why}"),
    }
}

/// Where kernel `s` would fit its PEs' memory, said as an option: its weights,
/// gradients and optimiser state shrink with the square of its block, its stash and
/// buffers with the block, its code not at all; so blocks `f` times as large fit when
/// `code + square f^2 + linear f <= have`, on `1 / f^2` times its PEs. `None` when no
/// block would (the code and what does not shrink fill the PE alone).
fn spread(s: &place::SramShort, fab: &Fabric) -> Option<String> {
    let part = |names: &[&str]| -> f64 {
        (s.parts.iter())
            .filter(|(w, _)| names.contains(w))
            .map(|(_, b)| f64::from(*b))
            .sum()
    };
    let square = part(&["weights", "gradients", "optimiser state"]);
    let linear = part(&["stashed activations", "buffers"]);
    let room = f64::from(s.have) - (f64::from(s.need) - square - linear);
    if room <= 0.0 || s.block <= 1 {
        return None;
    }
    let f = if square > 0.0 {
        (-linear + (linear * linear + 4.0 * square * room).sqrt()) / (2.0 * square)
    } else {
        room / linear
    };
    let block = (f64::from(s.block) * f).floor();
    if !(1.0..f64::from(s.block)).contains(&block) {
        return None;
    }
    let pes = (s.pes as f64 * (f64::from(s.block) / block).powi(2)).ceil() as u64;
    let on = (super::fabric::NAMES.iter())
        .filter_map(|n| Fabric::named(n))
        .filter(|f| f.sram_bytes >= fab.sram_bytes)
        .find(|f| f.pes() >= 2 * pes)
        .map_or(String::new(), |f| {
            format!(": `--wafer {}` has room for that", f.name)
        });
    Some(format!(
        "blocks of {block} or less for this kernel, about {pes} PEs instead of {}{on}",
        s.pes
    ))
}

/// The next larger named config, said as an option.
fn larger_fabric(fab: &Fabric) -> String {
    let next = super::fabric::NAMES
        .iter()
        .filter_map(|n| Fabric::named(n))
        .find(|f| f.pes() > fab.pes() && f.sram_bytes >= fab.sram_bytes);
    match next {
        Some(f) => format!("a larger fabric (`--wafer {}`)", f.name),
        None => "a fabric with more PEs or SRAM (a `.toml` config)".to_string(),
    }
}

/// "a, b or c".
fn or_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}
