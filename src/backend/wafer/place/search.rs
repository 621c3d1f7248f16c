//! The search over sizings: one block size for every layer, and sizings balanced to
//! each budget of each pace; the layout of the best (the fewest PEs for about the
//! shortest estimated step).

use super::build::try_lanes;
use super::lanes::Lanes;
use super::sizer::Sizer;
use super::{kernel_name, PesShort};
use super::{Layout, LayoutError};

/// The sizings of `sizer`'s graph: one block size for every layer (the smallest that
/// fits), and each kernel sized to the tightest budget of each pace whose staircase
/// fits (`balanced`); of the layouts within 2% of the shortest estimated step, the one
/// with the fewest PEs wins (`thrifty`), its estimated step kept (`Layout::estimate`).
pub(super) fn search(sizer: &Sizer) -> Result<Layout, LayoutError> {
    let (g, f, fab) = (sizer.g, sizer.f, sizer.fab);
    let n = f.kernels.len();
    let debug = std::env::var_os("EST_WAFER_DEBUG").is_some();
    if debug {
        for k in 0..n {
            eprintln!(
                "kernel {k} {}: {:?}, width {:?}, floor {}",
                kernel_name(g, f, k),
                sizer.dims[k],
                sizer.width[k],
                sizer.floor[k]
            );
        }
    }
    // what no sizing had enough of: a PE's memory (the smallest blocks that got that
    // far), colours, PEs (the staircase nearest to fitting), something else
    let mut sram: Option<super::SramShort> = None;
    let mut colours = None;
    let mut pes: Option<PesShort> = None;
    let mut other = None;
    // the sizings that fit, by (estimated step, PEs), with their block size: a layout
    // holds every PE's program and memory (gigabytes on a large fabric), so only the
    // winner's is made again, not each one kept
    let mut fit: Vec<((u64, usize), Lanes, u32)> = Vec::new();
    let mut consider =
        |r: Result<(Lanes, Layout), LayoutError>, s: u32| -> Result<(), LayoutError> {
            if debug {
                if let Err(e) = &r {
                    eprintln!("does not fit: {e:?}");
                }
            }
            match r {
                Ok((lanes, l)) => {
                    let key = (sizer.step(&lanes), l.setup.pes.len());
                    if debug {
                        let each = sizer.periods(&lanes);
                        eprintln!(
                            "sizing {lanes:?}: step {} on {} PEs ({each:?})",
                            key.0, key.1
                        );
                    }
                    fit.push((key, lanes, s));
                }
                // (of kernels that keep the batch, the sizing that fits the most:
                // in bands, more lanes hold less of each sample)
                Err(LayoutError::Sram(e)) => {
                    if sram
                        .as_ref()
                        .is_none_or(|s| e.batch_that_fits() > s.batch_that_fits())
                    {
                        sram = Some(e);
                    }
                }
                Err(LayoutError::Colours(e)) => {
                    colours.get_or_insert(e);
                }
                Err(LayoutError::Pes(mut e)) => {
                    e.floor = sizer.floor.iter().any(|&l| l > 1);
                    let area = |p: &PesShort| p.missing(fab.width, fab.height);
                    if pes.as_ref().is_none_or(|p| area(&e) < area(p)) {
                        pes = Some(e);
                    }
                }
                Err(LayoutError::DoesNotFit(why)) => other = Some(why),
                Err(e) => return Err(e),
            }
            Ok(())
        };
    for s in [
        1u32, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024, 2048, 4096,
    ] {
        let r = sizer
            .block(s)
            .and_then(|lanes| try_lanes(sizer, &lanes, s).map(|l| (lanes, l)));
        // (past a kernel that keeps the batch short of memory, larger blocks only
        // give its PEs more of it)
        let stop = r.as_ref().map_or_else(LayoutError::keeps_batch, |_| true);
        consider(r, s)?;
        if stop {
            break;
        }
    }
    for lanes in sizer.balanced() {
        let r = try_lanes(sizer, &lanes, 0).map(|l| (lanes, l));
        consider(r, 0)?;
    }
    if let Some(i) = thrifty(fit.iter().map(|f| f.0)) {
        let ((step, _), lanes, s) = fit.swap_remove(i);
        return try_lanes(sizer, &lanes, s).map(|l| Layout {
            estimate: step,
            ..l
        });
    }
    Err(if let Some(e) = sram {
        LayoutError::Sram(e)
    } else if let Some(e) = colours {
        LayoutError::Colours(e)
    } else if let Some(e) = pes {
        LayoutError::Pes(e)
    } else {
        LayoutError::DoesNotFit(other.unwrap_or_default())
    })
}

/// The most replicas a one-lane kernel runs as (its dealer counts each one's samples
/// on a counter of its own, and one the batch's).
pub(super) const MAX_REPS: u32 = 6;

/// How much longer (in 1/1000) an estimated step may be to save PEs: the estimates
/// are not closer than that to what the simulator measures.
pub(super) const STEP_SLACK: u64 = 20;

/// Of sizings as (estimated step, PEs), the one with the fewest PEs of those whose
/// step is within `STEP_SLACK` of the shortest (then the shorter step, then the
/// first).
pub(super) fn thrifty(keys: impl Iterator<Item = (u64, usize)> + Clone) -> Option<usize> {
    let shortest = keys.clone().map(|k| k.0).min()?;
    let limit = shortest + shortest * STEP_SLACK / 1000;
    (keys.enumerate())
        .filter(|(_, k)| k.0 <= limit)
        .min_by_key(|&(i, (step, pes))| (pes, step, i))
        .map(|(i, _)| i)
}
