//! The static memory plan of an executable: every buffer that is not a variable gets an
//! offset in one arena, and buffers whose lifetimes do not overlap share bytes.
//!
//! A buffer lives from the first step that touches it to the last one, in the order
//! the steps run (phase A, then phase B); a step is one kernel, or a chain of kernels
//! run slab by slab (`lower::chains`), whose buffers all live through the whole chain.
//! Steps always write their whole output before reading it, so a buffer dying at step
//! `i` and one born after `i` may share memory; one born *at* `i` may not (a kernel
//! never computes in place). Inputs, the
//! step and every value read after the kernels ran (the targets: losses, gradients
//! checked between phases, updates, predictions) live throughout. Offsets are chosen
//! greedily, largest buffer first, at the lowest address that no overlapping buffer
//! holds (TFLite's "greedy by size"), 64-byte aligned.

use super::lower::{Bufs, Kernel, Role};
use crate::ir::NodeIndex;

/// Where each buffer lies in the arena.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The byte offset of each buffer (`None` for variables, which the device holds).
    pub offsets: Vec<Option<usize>>,
    /// The arena's size in bytes: the peak of the plan.
    pub arena: usize,
    /// What the buffers would take whole (not one slab per part) and without sharing.
    pub unshared: usize,
    /// The node whose kernel first writes each buffer, when one does.
    pub producers: Vec<Option<NodeIndex>>,
}

const ALIGN: usize = 64;

pub fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(ALIGN).max(1) * ALIGN
}

/// Plans the buffers of steps (each one or more kernels) that run in the order given,
/// each buffer taking the bytes `sizes` gives, where the buffers in `pinned` are read
/// after the last step.
pub fn plan(bufs: &Bufs, sizes: &[usize], steps: &[Vec<&Kernel>], pinned: &[usize]) -> Plan {
    let n = bufs.bufs.len();
    let end = steps.len();
    // (first, last) step touching each buffer
    let mut life: Vec<Option<(usize, usize)>> = vec![None; n];
    let mut producers = vec![None; n];
    for (i, ks) in steps.iter().enumerate() {
        for (b, k) in ks
            .iter()
            .flat_map(|k| k.bufs().into_iter().map(move |b| (b, k)))
        {
            life[b] = Some(life[b].map_or((i, i), |(f, _)| (f, i)));
            if producers[b].is_none() {
                producers[b] = Some(k.node());
            }
        }
    }
    for &b in pinned {
        life[b] = Some((life[b].map_or(0, |l| l.0), end));
    }
    let mut order: Vec<(usize, usize, (usize, usize))> = Vec::new();
    let mut unshared = 0;
    for (i, b) in bufs.bufs.iter().enumerate() {
        let bytes = aligned(sizes[i]);
        let life = match b.role {
            Role::Var(_) | Role::Next(_) => continue,
            // read from outside the kernels: live throughout
            Role::Input(_) | Role::Decoded(..) | Role::Step => (0, end),
            // a buffer no kernel touches still gets bytes of its own
            Role::Temp => life[i].unwrap_or((0, end)),
        };
        unshared += aligned(b.len * b.elem.size());
        order.push((i, bytes, life));
    }
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut offsets = vec![None; n];
    let mut placed: Vec<(usize, usize, (usize, usize))> = Vec::new(); // offset, bytes, life
    let mut arena = 0;
    for (i, bytes, (first, last)) in order {
        let mut taken: Vec<(usize, usize)> = placed
            .iter()
            .filter(|p| p.2 .0 <= last && first <= p.2 .1)
            .map(|p| (p.0, p.0 + p.1))
            .collect();
        taken.sort_unstable();
        let mut at = 0;
        for (lo, hi) in taken {
            if at + bytes <= lo {
                break;
            }
            at = at.max(hi);
        }
        offsets[i] = Some(at);
        arena = arena.max(at + bytes);
        placed.push((at, bytes, (first, last)));
    }
    Plan {
        offsets,
        arena,
        unshared,
        producers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::host::lower::{Buf, Elem, View};

    fn buf(len: usize) -> Buf {
        Buf {
            elem: Elem::F32,
            len,
            role: Role::Temp,
        }
    }

    fn native(node: usize, args: &[usize], out: usize) -> Kernel {
        Kernel::Native {
            node: NodeIndex::new(node),
            args: args.iter().map(|&b| View::contiguous(b, &[1])).collect(),
            out: View::contiguous(out, &[1]),
        }
    }

    #[test]
    fn buffers_share_bytes_only_when_their_lives_do_not_overlap() {
        let mut bufs = Bufs::default();
        bufs.bufs = vec![buf(16), buf(16), buf(16), buf(16), buf(100)];
        // 0 -> 1 -> 2 -> 3; buffer 4 is the scratch of the second kernel
        let ks = [
            native(0, &[0], 1),
            native(1, &[1, 4], 2),
            native(2, &[2], 3),
        ];
        let refs: Vec<Vec<&Kernel>> = ks.iter().map(|k| vec![k]).collect();
        let sizes: Vec<usize> = bufs.bufs.iter().map(|b| b.len * 4).collect();
        let p = plan(&bufs, &sizes, &refs, &[3]);
        let at = |b: usize| p.offsets[b].expect("planned");
        let bytes = |b: usize| aligned(bufs.bufs[b].len * 4);
        let overlap = |a: usize, b: usize| at(a) < at(b) + bytes(b) && at(b) < at(a) + bytes(a);
        // (first, last) kernel of each buffer; 3 is read after the last kernel
        let life = [(0, 0), (0, 1), (1, 2), (2, 3), (1, 1)];
        let mut shared = 0;
        for a in 0..5 {
            for b in a + 1..5 {
                let live_together = life[a].0 <= life[b].1 && life[b].0 <= life[a].1;
                assert!(!(live_together && overlap(a, b)), "{a} and {b}: {p:?}");
                shared += usize::from(overlap(a, b));
            }
        }
        assert!(shared >= 2, "{p:?}");
        assert_eq!(p.unshared, 4 * 64 + 448);
        // the scratch buffer and the two live at kernel 1 beside it
        assert_eq!(p.arena, 448 + 2 * 64);
        assert_eq!(p.producers[2], Some(NodeIndex::new(1)));
    }
}
