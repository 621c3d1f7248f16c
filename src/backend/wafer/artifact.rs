//! The `.estw` artifact: a laid-out program as a file. JSON, with every map in a fixed
//! order, so that the same input gives the same bytes:
//!
//! - `format`: `"estw 3"`;
//! - `stamp`: the fabric's name and fingerprint, the compiler's version and the hash of
//!   the graph it was compiled from;
//! - `batch`, `kernels` (name, rectangle, orientation), `block`;
//! - `programs`: each distinct PE program once (with its initial memory), and `pes`:
//!   which one each PE runs;
//! - `routes`: `(x, y, colour)` and the route;
//! - `tensors`: where each variable, gradient and host value lives;
//! - `inputs`, `outputs`: the host's streams;
//! - `report`: what a simulated step measured, when the build measured one;
//! - `checksum`: the CRC32C of every byte before `,"checksum":`, last.
//!
//! Loading checks the checksum, the format, the stamp's fabric against the fabric it is
//! to run on, and that every place and count fits that fabric (a PE, a router, a
//! program's words, a tensor's runs, a stream's elements), before anything is
//! allocated from them; a damaged or foreign file is an error saying so.

use super::fabric::Fabric;
use super::isa::{Colour, Program};
use super::kernels::Piece;
use super::place::{HostStream, Layout, Placed};
use super::report::Report;
use super::sim::{Route, Setup};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The format line of this version.
pub const FORMAT: &str = "estw 3";

/// The most values a host stream may carry in a step (batch times a sample's
/// elements): 2^30, 4 GiB of f32; beyond it an artifact is refused as damaged.
const MAX_STEP_VALUES: u64 = 1 << 30;

/// What an artifact was made from and for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub fabric: String,
    pub fabric_fingerprint: String,
    pub compiler: String,
    pub graph: String,
}

/// A program and the initial memory of the PEs that run it: its words that are not
/// zero, as (word, f32 bits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgramClass {
    pub program: Program,
    pub memory: Vec<(u32, u32)>,
}

fn sparse(m: &[f32]) -> Vec<(u32, u32)> {
    (m.iter().enumerate())
        .filter(|(_, v)| v.to_bits() != 0)
        .map(|(i, v)| (i as u32, v.to_bits()))
        .collect()
}

/// A laid-out program, as the file holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Artifact {
    pub format: String,
    pub stamp: Stamp,
    pub batch: u32,
    pub block: u32,
    pub kernels: Vec<Placed>,
    pub programs: Vec<ProgramClass>,
    /// `(x, y, program)`.
    pub pes: Vec<(u32, u32, usize)>,
    pub routes: Vec<(u32, u32, Colour, Route)>,
    pub tensors: BTreeMap<String, Vec<Piece>>,
    /// The tensors whose pieces each hold a part of their value (`Laid::summed`).
    #[serde(default)]
    pub summed: Vec<String>,
    pub inputs: Vec<HostStream>,
    pub outputs: Vec<HostStream>,
    pub report: Option<Report>,
    /// The compiler's estimate of a step's cycles (`Layout::estimate`).
    #[serde(default)]
    pub estimate: u64,
    /// CRC32C of the file's bytes before `,"checksum":`, in hex (set by `to_bytes`).
    #[serde(default)]
    pub checksum: String,
}

/// What ends every artifact's JSON after its checksum's eight hex digits.
const CHECKSUM_KEY: &[u8] = b",\"checksum\":\"";

/// The hash of a graph: FNV-1a of its text dump.
pub fn graph_hash(g: &crate::ir::Graph) -> String {
    let text = crate::ir::dump_text(g, "");
    format!(
        "{:016x}",
        crate::hash::fnv1a(0xcbf2_9ce4_8422_2325, text.as_bytes())
    )
}

impl Artifact {
    /// The artifact of a layout of the graph hashed `graph`.
    pub fn new(l: &Layout, graph: String, report: Option<Report>) -> Artifact {
        let mut programs: Vec<ProgramClass> = Vec::new();
        let mut pes = Vec::new();
        for (&(x, y), (p, m)) in &l.setup.pes {
            let class = ProgramClass {
                program: p.as_ref().clone(),
                memory: sparse(m),
            };
            let i = match programs.iter().position(|c| *c == class) {
                Some(i) => i,
                None => {
                    programs.push(class);
                    programs.len() - 1
                }
            };
            pes.push((x, y, i));
        }
        Artifact {
            format: FORMAT.into(),
            stamp: Stamp {
                fabric: l.fabric.name.clone(),
                fabric_fingerprint: format!("{:016x}", l.fabric.fingerprint()),
                compiler: env!("CARGO_PKG_VERSION").into(),
                graph,
            },
            batch: l.batch,
            block: l.block,
            kernels: l.kernels.clone(),
            programs,
            pes,
            routes: l
                .setup
                .routes
                .iter()
                .map(|(&(x, y, c), &r)| (x, y, c, r))
                .collect(),
            tensors: l.tensors.clone(),
            summed: l.summed.iter().cloned().collect(),
            inputs: l.inputs.clone(),
            outputs: l.outputs.clone(),
            report,
            estimate: l.estimate,
            checksum: String::new(),
        }
    }

    /// The file's bytes, ending with the checksum of the bytes before it.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut a = self.clone();
        a.checksum = String::new();
        let mut v = serde_json::to_vec(&a).unwrap_or_default();
        // `...,"checksum":""}`: the checksum goes between the quotes
        v.truncate(v.len().saturating_sub(CHECKSUM_KEY.len() + 2));
        let crc = crc32c::crc32c(&v);
        v.extend_from_slice(CHECKSUM_KEY);
        v.extend_from_slice(format!("{crc:08x}\"}}\n").as_bytes());
        v
    }

    /// The checksum at the end of `bytes` and the bytes before it, if it ends with one.
    fn split_sum(bytes: &[u8]) -> Option<(&[u8], u32)> {
        let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
        let end = body.len().checked_sub(CHECKSUM_KEY.len() + 10)?;
        let (before, tail) = body.split_at(end);
        let hex = tail.strip_prefix(CHECKSUM_KEY)?.strip_suffix(b"\"}")?;
        let want = u32::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
        Some((before, want))
    }

    /// An artifact read back, checked against the fabric it is to run on.
    pub fn from_bytes(bytes: &[u8], fabric: &Fabric) -> Result<Artifact, String> {
        #[derive(Deserialize)]
        struct Head {
            format: String,
        }
        let sum = Artifact::split_sum(bytes);
        if let Some((before, want)) = sum {
            let got = crc32c::crc32c(before);
            if got != want {
                return Err(format!(
                    "it is damaged: its bytes do not match its checksum (CRC32C {got:08x}, expected {want:08x})"
                ));
            }
        }
        let head: Head = serde_json::from_slice(bytes).map_err(|_| {
            "it is not an estw artifact (not the JSON `estc build --target wafer -o` writes)"
                .to_string()
        })?;
        if head.format != FORMAT {
            return Err(format!(
                "it is in format `{}`; this estc reads `{FORMAT}`",
                head.format
            ));
        }
        if sum.is_none() {
            return Err("it is damaged: it does not end with its checksum".to_string());
        }
        let a: Artifact =
            serde_json::from_slice(bytes).map_err(|e| format!("it is damaged: {e}"))?;
        let mine = format!("{:016x}", fabric.fingerprint());
        if a.stamp.fabric_fingerprint != mine {
            return Err(format!(
                "it was compiled for the fabric `{}` (fingerprint {}), not for `{}` (fingerprint {mine})",
                a.stamp.fabric, a.stamp.fabric_fingerprint, fabric.name
            ));
        }
        a.check_bounds(fabric)
            .map_err(|why| format!("it is damaged: {why}"))?;
        Ok(a)
    }

    /// That every place and count fits `fabric`, so that nothing is allocated or
    /// indexed from a number the file made up: PEs and routers on the fabric, each
    /// program within a PE's memory (its initial words inside it), each kernel's
    /// rectangle, each tensor's runs within the memory of their PEs and its elements
    /// within what they hold, each stream's lanes on the fabric and its values a step
    /// bounded (`MAX_STEP_VALUES`).
    fn check_bounds(&self, fabric: &Fabric) -> Result<(), String> {
        let words = fabric.sram_bytes / 4;
        let on = |x: u32, y: u32| x < fabric.width && y < fabric.height;
        for (k, c) in self.programs.iter().enumerate() {
            let mut end = 0u32;
            for sym in &c.program.symbols {
                end = end.max(sym.base.saturating_add(sym.len));
            }
            if end > words {
                return Err(format!(
                    "program {k} needs {end} words of memory; a PE of `{}` has {words}",
                    fabric.name
                ));
            }
            if let Some(&(w, _)) = c.memory.iter().find(|&&(w, _)| w >= end) {
                return Err(format!("program {k} sets word {w}, past its {end} words"));
            }
        }
        if let Some(&(x, y, p)) =
            (self.pes.iter()).find(|&&(x, y, p)| !on(x, y) || p >= self.programs.len())
        {
            return Err(format!(
                "PE ({x}, {y}) runs program {p}, off the fabric or missing"
            ));
        }
        if let Some(&(x, y, c, _)) = self.routes.iter().find(|r| !on(r.0, r.1)) {
            return Err(format!(
                "a route of colour {c} at ({x}, {y}) is off the fabric"
            ));
        }
        for k in &self.kernels {
            let fits = (k.x.checked_add(k.w)).is_some_and(|r| r <= fabric.width)
                && (k.y.checked_add(k.h)).is_some_and(|b| b <= fabric.height);
            if !fits {
                return Err(format!("kernel `{}` is placed off the fabric", k.name));
            }
        }
        for (name, pieces) in &self.tensors {
            check_tensor(name, pieces, words, &on)?;
        }
        for s in self.inputs.iter().chain(&self.outputs) {
            let values = u64::from(self.batch) * u64::from(s.per_sample);
            if values > MAX_STEP_VALUES {
                return Err(format!(
                    "stream `{}` carries {values} values a step (batch {} of {}), beyond {MAX_STEP_VALUES}",
                    s.name, self.batch, s.per_sample
                ));
            }
            for l in &s.lanes {
                if !on(l.x, l.y) || l.elems.start > l.elems.end || l.elems.end > s.per_sample {
                    return Err(format!(
                        "a lane of stream `{}` at ({}, {}) is off the fabric or outside its {} elements",
                        s.name, l.x, l.y, s.per_sample
                    ));
                }
            }
        }
        Ok(())
    }

    /// The layout it holds, on `fabric`.
    pub fn layout(&self, fabric: &Fabric) -> Layout {
        let mut setup = Setup::default();
        let classes: Vec<Arc<Program>> = self
            .programs
            .iter()
            .map(|c| Arc::new(c.program.clone()))
            .collect();
        for &(x, y, p) in &self.pes {
            let class = &self.programs[p];
            let mut m = vec![0.0; class.program.words() as usize];
            for &(i, bits) in &class.memory {
                if let Some(w) = m.get_mut(i as usize) {
                    *w = f32::from_bits(bits);
                }
            }
            setup.pes.insert((x, y), (classes[p].clone(), m));
        }
        for &(x, y, c, r) in &self.routes {
            setup.routes.insert((x, y, c), r);
        }
        setup.inputs = super::place::host_inputs(&self.inputs);
        Layout {
            fabric: fabric.clone(),
            batch: self.batch,
            setup,
            tensors: self.tensors.clone(),
            summed: self.summed.iter().cloned().collect(),
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            kernels: self.kernels.clone(),
            block: self.block,
            estimate: self.estimate,
        }
    }
}

/// That a tensor's pieces lie on the fabric within their PEs' `words`, and that its
/// runs reach no element beyond the values its pieces hold (a replicated tensor holds
/// some elements several times; a made-up offset reaches past them all).
fn check_tensor(
    name: &str,
    pieces: &[Piece],
    words: u32,
    on: &dyn Fn(u32, u32) -> bool,
) -> Result<(), String> {
    let (mut total, mut end) = (0u64, 0u64);
    for p in pieces {
        let held: u64 = p.runs.iter().map(|r| u64::from(r.1)).sum();
        if !on(p.pe.0, p.pe.1) || u64::from(p.word) + held > u64::from(words) {
            return Err(format!(
                "tensor `{name}` has a piece of {held} values at word {} of PE ({}, {}), off the fabric or past its {words} words",
                p.word, p.pe.0, p.pe.1
            ));
        }
        total += held;
        for &(offset, len) in &p.runs {
            end = end.max(u64::from(offset) + u64::from(len));
        }
    }
    if end > total {
        return Err(format!(
            "tensor `{name}` has elements up to {end}, but its pieces hold {total} values"
        ));
    }
    Ok(())
}
