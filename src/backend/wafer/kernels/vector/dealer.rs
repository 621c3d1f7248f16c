//! A one-lane kernel's dealer: the program that deals whole samples to its replicas
//! and takes their gradients and sums back.

use super::ops::*;
use super::{Fan, Port, Vector};
use crate::backend::wafer::form::{key, Class};
use crate::backend::wafer::isa::{Colour, Dsd, Instr, Program, Src, Task, Trigger, VecOp};
use crate::backend::wafer::lower::{vec, Val};
use crate::backend::wafer::pipeline::Pipeline;

impl Vector<'_> {
    /// The dealer of `to.len()` replicas (`to`: each one's colours to it and back):
    /// it takes each sample's inputs and sends them on to one replica in turn (a
    /// counter per replica, started so that each reaches its count on that replica's
    /// samples), and passes each sample's gradients on toward the layers as they come
    /// back, a task per replica taken in turn (its pipeline: it deals a replica a
    /// sample only once its previous one came back). After the step's last gradient it
    /// sums the replicas' sums over the batch and sends the total to each.
    /// With a `fan`, it gathers that input from the rows of the layer before it, and
    /// sends its gradient back to them in shares.
    pub fn dealer(&self, to: &[(Colour, Colour)], fan: Option<&Fan>) -> Result<Program, String> {
        let f = self.f;
        let r = to.len() as u32;
        if r < 2
            || r > u32::from(crate::backend::wafer::isa::COUNTERS) - 1
            || !f.batch.is_multiple_of(r)
        {
            return Err(format!("{r} replicas of a batch of {}", f.batch));
        }
        let phases = self.phases();
        let mut p = Program::default();
        let ins: Vec<(Port, u32, u32)> = (self.inputs.iter())
            .map(|i| {
                let ext = self.extent(i.node, 1, 0);
                (*i, ext, p.alloc(&format!("{} in", key(i.node)), ext))
            })
            .collect();
        let sums: u32 = (self.nodes().iter())
            .filter(|&&n| f.class[n.index()] == Class::Batch)
            .map(|&n| self.extent(n, 1, 0))
            .sum();
        let total = (sums > 0).then(|| p.alloc("sums", sums));
        let back: Vec<(Port, u32)> = (self.outputs.iter())
            .filter(|o| o.bwd && phases.get(&o.node) == Some(&0))
            .map(|o| (*o, self.extent(o.node, 1, 0)))
            .collect();
        // a stream's shares: (offset, length, colour), one for a stream no fan gathers
        let shares = |port: &Port, len: u32, bwd: bool| -> Vec<(u32, u32, Colour)> {
            let fanned = fan.filter(|f| {
                if bwd {
                    f.grad == Some(port.node)
                } else {
                    f.input == port.node
                }
            });
            match fanned {
                Some(f) => (f.shares(len))
                    .map(|(at, n, c)| (at, n, if bwd { c.1 } else { c.0 }))
                    .collect(),
                None => vec![(0, len, port.colour)],
            }
        };
        for (k, &(c, _)) in to.iter().enumerate() {
            p.tasks.push(Task {
                id: 2 * k as u8,
                name: format!("deal to replica {k}"),
                trigger: Trigger::Local { at_start: false },
                body: (ins.iter())
                    .map(|&(_, len, base)| mov(Dsd::Out { colour: c, len }, Dsd::mem(base, len)))
                    .collect(),
            });
        }
        let Some(first) = ins.first() else {
            return Err("a vector kernel without inputs".into());
        };
        let gather = (sums > 0).then_some(2 * r as u8 + 2);
        let mut take: Vec<Instr> = (ins.iter())
            .flat_map(|&(i, len, base)| {
                (shares(&i, len, false).into_iter()).map(move |(at, len, colour)| {
                    mov(Dsd::mem(base + at, len), Dsd::In { colour, len })
                })
            })
            .collect();
        take.extend((0..r).map(|k| Instr::Count {
            counter: k as u8,
            every: r,
            then: Some(2 * k as u8),
            again: false,
        }));
        // the step's end: after its last gradient passed, or its last sample
        let end = Instr::Count {
            counter: r as u8,
            every: f.batch,
            then: gather,
            again: false,
        };
        if back.is_empty() && gather.is_some() {
            take.push(end.clone());
        }
        let take_id = 2 * r as u8;
        p.tasks.push(Task {
            id: take_id,
            name: "take".into(),
            trigger: Trigger::Data(first.0.colour),
            body: take,
        });
        // each replica's gradients on toward the layers (odd ids: the backward pass)
        let returns: Vec<u8> = (0..r as u8).map(|k| take_id + 1 + 2 * k).collect();
        if !back.is_empty() {
            // (and room for the gradients a replica sends while the dealer deals the
            // others)
            let out = self.window.div_ceil(r);
            for (&(_, b), &id) in to.iter().zip(&returns) {
                let mut body: Vec<Instr> = (back.iter())
                    .flat_map(|(port, len)| {
                        (shares(port, *len, true).into_iter()).map(move |(_, len, c)| {
                            mov(Dsd::Out { colour: c, len }, Dsd::In { colour: b, len })
                        })
                    })
                    .collect();
                if gather.is_some() {
                    body.push(end.clone());
                }
                p.tasks.push(Task {
                    id,
                    name: format!("return from replica {}", (id - take_id) / 2),
                    trigger: Trigger::Data(b),
                    body,
                });
                let words = p.receives(id, b) as u32;
                p.fifo(b, out * words);
            }
            p.pipeline = Some(Pipeline {
                forward: take_id,
                backward: returns.clone(),
                window: self.window.max(1),
                samples: f.batch,
            });
        }
        if let Some(id) = gather {
            p.tasks.push(gathered(id, total.map(|t| (t, sums)), to));
        }
        // counter k reaches `r` on replica k's samples
        let prime = primed(r);
        if !prime.is_empty() {
            // (before any take, whatever the timing: the lowest id ready first)
            p.tasks.push(Task {
                id: 2 * r as u8 - 1,
                name: "prime".into(),
                trigger: Trigger::Local { at_start: true },
                body: prime,
            });
        }
        Ok(p)
    }
}

/// The dealer's task `id` at the step's end: every replica's sums over the batch (`sums`
/// words at `total`, if it has any) added up and the total sent to each.
fn gathered(id: u8, total: Option<(u32, u32)>, to: &[(Colour, Colour)]) -> Task {
    let mut body = Vec::new();
    if let Some((t, len)) = total {
        body.push(vec(VecOp::Mov, Val::buf(t, len), &[Val::Imm(0.0)], len));
        let t = Dsd::mem(t, len);
        for &(_, b) in to {
            body.push(Instr::Vec {
                op: VecOp::Add,
                dst: t.clone(),
                srcs: vec![Src::V(t.clone()), Src::V(Dsd::In { colour: b, len })],
            });
        }
        for &(c, _) in to {
            body.push(mov(Dsd::Out { colour: c, len }, t.clone()));
        }
    }
    Task {
        id,
        name: "gather".into(),
        trigger: Trigger::Local { at_start: false },
        body,
    }
}

/// The counts that start counter `k` of `r` so that it reaches `r` on replica `k`'s
/// samples.
fn primed(r: u32) -> Vec<Instr> {
    (0..r)
        .flat_map(|k| {
            (0..r - 1 - k).map(move |_| Instr::Count {
                counter: k as u8,
                every: r,
                then: None,
                again: false,
            })
        })
        .collect()
}
