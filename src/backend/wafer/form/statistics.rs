//! Statistics of the whole batch that a step's samples read (batch norm in training:
//! each sample normalised by the mean and variance of every sample of the step). A
//! vector kernel that reads one runs its pass in levels: the samples' values before
//! the statistic as they arrive, then, once the step's last sample is in, a pass over
//! every sample again for what reads it (`kernels/vector/`). So the kernel and every
//! kernel before it keep every sample of the step between its forward and its
//! backward (`pipeline::plan`, `BARRIER`).

use super::{unsupported, Class, Cx, Kernel, Kind, Unsupported};
use crate::ir::NodeIndex;
use std::collections::{BTreeMap, BTreeSet};

/// Whether step node `n` is made from a sum over the batch (through other step nodes,
/// not variables): a statistic, or a value computed from one (`1 / sqrt(var + eps)`).
pub(super) fn of_statistics(cx: &Cx, n: NodeIndex, memo: &mut BTreeMap<NodeIndex, bool>) -> bool {
    let n = cx.resolve(n);
    if let Some(&m) = memo.get(&n) {
        return m;
    }
    let yes = match cx.class[n.index()] {
        Class::Batch => true,
        Class::Step if !cx.is_var(n) => {
            (cx.g.operands(n).into_iter()).any(|o| of_statistics(cx, o, memo))
        }
        _ => false,
    };
    memo.insert(n, yes);
    yes
}

/// For each kernel, whether its samples read a statistic of the batch (see the
/// module's doc). A statistic that another kernel makes, or that the host computes
/// (it mixes kernels), is E0601: the kernel whose sums make it must be the one whose
/// samples read it.
pub(super) fn barriers(
    cx: &Cx,
    kernels: &[Kernel],
    owner: &[Option<usize>],
) -> Result<Vec<bool>, Unsupported> {
    let g = cx.g;
    let mut memo = BTreeMap::new();
    let mut out = vec![false; kernels.len()];
    for (k, kr) in kernels.iter().enumerate() {
        let Kind::Vector { nodes } = &kr.kind else {
            continue;
        };
        // the statistics its samples read and the step values between them, each once
        let mut seen = BTreeSet::new();
        for &n in nodes {
            if cx.class[n.index()] != Class::Sample {
                continue;
            }
            let mut stack: Vec<NodeIndex> = g.operands(n).to_vec();
            while let Some(s) = stack.pop() {
                let s = cx.resolve(s);
                if !of_statistics(cx, s, &mut memo) || !seen.insert(s) {
                    continue;
                }
                if owner[s.index()] != Some(k) {
                    return Err(unsupported(g, n, "a sample's value made from a statistic of the batch that another kernel makes has no wafer kernel yet".into(), "the wafer computes a statistic of the batch (a batch norm's mean and variance) in the kernel whose samples it normalises: keep the statistic and its use between the same two layers, or train this model on the host (`--target host`)"));
                }
                out[k] = true;
                stack.extend(g.operands(s));
            }
        }
    }
    Ok(out)
}
