//! The `.estw` artifact: a laid-out program as a file. JSON, with every map in a fixed
//! order, so that the same input gives the same bytes:
//!
//! - `format`: `"estw 1"`;
//! - `stamp`: the fabric's name and fingerprint, the compiler's version and the hash of
//!   the graph it was compiled from;
//! - `batch`, `kernels` (name, rectangle, orientation), `block`;
//! - `programs`: each distinct PE program once (with its initial memory), and `pes`:
//!   which one each PE runs;
//! - `routes`: `(x, y, colour)` and the route;
//! - `tensors`: where each variable, gradient and host value lives;
//! - `inputs`, `outputs`: the host's streams;
//! - `report`: what a simulated step measured, when the build measured one.
//!
//! Loading checks the format and the stamp's fabric against the fabric it is to run
//! on; a damaged or foreign file is an error saying so.

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
pub const FORMAT: &str = "estw 1";

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
    pub inputs: Vec<HostStream>,
    pub outputs: Vec<HostStream>,
    pub report: Option<Report>,
}

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
            inputs: l.inputs.clone(),
            outputs: l.outputs.clone(),
            report,
        }
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// An artifact read back, checked against the fabric it is to run on.
    pub fn from_bytes(bytes: &[u8], fabric: &Fabric) -> Result<Artifact, String> {
        #[derive(Deserialize)]
        struct Head {
            format: String,
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
        let a: Artifact =
            serde_json::from_slice(bytes).map_err(|e| format!("it is damaged: {e}"))?;
        let mine = format!("{:016x}", fabric.fingerprint());
        if a.stamp.fabric_fingerprint != mine {
            return Err(format!(
                "it was compiled for the fabric `{}` (fingerprint {}), not for `{}` (fingerprint {mine})",
                a.stamp.fabric, a.stamp.fabric_fingerprint, fabric.name
            ));
        }
        if let Some(&(x, y, p)) = a
            .pes
            .iter()
            .find(|&&(x, y, p)| x >= fabric.width || y >= fabric.height || p >= a.programs.len())
        {
            return Err(format!(
                "it is damaged: PE ({x}, {y}) runs program {p}, off the fabric or missing"
            ));
        }
        Ok(a)
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
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            kernels: self.kernels.clone(),
            block: self.block,
        }
    }
}
