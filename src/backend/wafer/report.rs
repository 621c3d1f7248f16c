//! What a laid-out program does on the fabric, measured by the simulator: per kernel its
//! PEs, cycles per sample, utilisation, memory and colours; per step its cycles, the
//! samples per second at the fabric's clock and the slowest kernel. `simulate` runs
//! steps on generated data to measure them; `svg` draws the placement.

use super::fabric::Fabric;
use super::isa::Colour;
use super::kernels::{scatter, UPDATE};
use super::place::{Layout, CHAIN_COLOURS};
use super::sim::{Dir, Sim};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// One kernel's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelReport {
    pub name: String,
    pub x: u32,
    pub y: u32,
    pub w: u32,
    pub h: u32,
    /// PEs that run a program.
    pub pes: u32,
    /// The busiest PE's busy cycles per sample.
    pub cycles_per_sample: f64,
    /// Arithmetic elements over what its PEs could compute in the step's cycles.
    pub utilisation: f64,
    /// The largest memory map of its PEs, in bytes.
    pub sram_bytes: u32,
    /// The samples between a forward and its backward (`pipeline.rs`; 0: it has no
    /// backward pass).
    #[serde(default)]
    pub window: u32,
    pub colours: Vec<Colour>,
}

/// The fullest PE's memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fullest {
    pub x: u32,
    pub y: u32,
    pub kernel: String,
    pub parts: Vec<(String, u32)>,
}

/// A step's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub fabric: String,
    pub batch: u32,
    /// The PE with the largest memory map, and its bytes by what they hold
    /// (`place::memory`).
    #[serde(default)]
    pub fullest: Option<Fullest>,
    pub steps: u32,
    pub step_cycles: f64,
    /// The compiler's estimate of a step's cycles before simulating it
    /// (`Layout::estimate`; 0: none).
    #[serde(default)]
    pub estimate: u64,
    pub samples_per_second: f64,
    /// Over every PE that runs a program.
    pub utilisation: f64,
    pub pes: u32,
    pub kernels: Vec<KernelReport>,
    /// The kernel with the most cycles per sample.
    pub slowest: usize,
    /// The link that carried the most wavelets (its router and the port they left by),
    /// and how many a sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busiest_link: Option<(u32, u32, Dir, f64)>,
}

/// Runs `steps` steps of `l` on generated data (inputs uniform in [0, 1), labels and
/// indices 0, weights small): the simulator after them.
pub fn simulate(l: &Layout, steps: u32) -> Result<Sim, String> {
    let mut sim = Sim::new(&l.fabric, &l.setup).map_err(|e| e.0)?;
    let rng = crate::rng::Stream::new(7, 0);
    for (name, pieces) in &l.tensors {
        let len = pieces
            .iter()
            .flat_map(|p| p.runs.iter())
            .map(|r| (r.0 + r.1) as usize)
            .max()
            .unwrap_or(0);
        let v: Vec<f32> = if name.starts_with('%') {
            // a host value (a learning rate) or a sum the step starts from zero
            vec![
                if pieces.iter().all(|p| p.runs == [(0, 1)]) {
                    0.01
                } else {
                    0.0
                };
                len
            ]
        } else {
            rng.uniforms(0, len, 0)
                .iter()
                .map(|u| (u - 0.5) * 0.1)
                .collect()
        };
        scatter(pieces, &v, |(x, y), a, w| {
            sim.write(x, y, a, w);
        });
    }
    let train = l
        .setup
        .pes
        .values()
        .any(|(p, _)| p.tasks.iter().any(|t| t.id == UPDATE));
    for step in 0..steps {
        for (k, s) in l.inputs.iter().enumerate() {
            let labels = s.name == "labels" || s.name.starts_with("labels.");
            for lane in &s.lanes {
                let n = lane.elems.len() * l.batch as usize;
                let v: Vec<f32> = if labels {
                    vec![0.0; n]
                } else {
                    rng.uniforms((u64::from(step) << 32) + ((k as u64) << 24), n, 0)
                };
                sim.feed(lane.x, lane.y, lane.colour, &v);
            }
        }
        sim.run().map_err(|d| d.to_string())?;
        if train {
            for &(x, y) in l.setup.pes.keys() {
                sim.launch(x, y, UPDATE);
            }
            sim.run().map_err(|d| d.to_string())?;
        }
        sim.clear_outputs();
    }
    Ok(sim)
}

/// The report of `steps` simulated steps of `l`.
pub fn measure(l: &Layout, sim: &Sim, steps: u32) -> Report {
    let f: &Fabric = &l.fabric;
    let total = sim.now().max(1) as f64;
    let stats = sim.stats();
    let lanes = f64::from(f.fp32_lanes);
    let samples = f64::from(steps.max(1) * l.batch.max(1));
    let mut kernels = Vec::new();
    let mut all_work = 0u64;
    for k in &l.kernels {
        let inside = |x: u32, y: u32| x >= k.x && x < k.x + k.w && y >= k.y && y < k.y + k.h;
        let mine: Vec<_> = stats.iter().filter(|((x, y), _)| inside(*x, *y)).collect();
        let pes = mine.len() as u32;
        let work: u64 = mine.iter().map(|(_, s)| s.work).sum();
        all_work += work;
        let busiest = mine.iter().map(|(_, s)| s.busy).max().unwrap_or(0);
        let sram = (l.setup.pes.iter())
            .filter(|((x, y), _)| inside(*x, *y))
            .map(|(_, (p, _))| p.words() * super::cost::WORD)
            .max()
            .unwrap_or(0);
        let window = (l.setup.pes.iter())
            .filter(|((x, y), _)| inside(*x, *y))
            .filter_map(|(_, (p, _))| p.pipeline.as_ref().map(|q| q.window))
            .max()
            .unwrap_or(0);
        let mut colours: Vec<Colour> = (l.setup.routes.keys())
            .filter(|(x, y, _)| inside(*x, *y))
            .map(|k| k.2)
            .collect();
        colours.sort_unstable();
        colours.dedup();
        kernels.push(KernelReport {
            name: k.name.clone(),
            x: k.x,
            y: k.y,
            w: k.w,
            h: k.h,
            pes,
            cycles_per_sample: busiest as f64 / samples,
            utilisation: work as f64 / (f64::from(pes.max(1)) * total * lanes),
            sram_bytes: sram,
            window,
            colours,
        });
    }
    let slowest = (0..kernels.len())
        .max_by(|&a, &b| {
            kernels[a]
                .cycles_per_sample
                .total_cmp(&kernels[b].cycles_per_sample)
        })
        .unwrap_or(0);
    let pes = stats.len() as u32;
    let step_cycles = total / f64::from(steps.max(1));
    let busiest_link = (sim.link_loads().into_iter())
        .max_by_key(|&(_, n)| n)
        .map(|((x, y, d), n)| (x, y, d, n as f64 / samples));
    let fullest = (l.setup.pes.iter())
        .max_by_key(|(_, (p, _))| p.words())
        .map(|(&(x, y), (p, _))| Fullest {
            x,
            y,
            kernel: (l.kernels.iter())
                .find(|k| x >= k.x && x < k.x + k.w && y >= k.y && y < k.y + k.h)
                .map_or_else(String::new, |k| k.name.clone()),
            parts: (super::place::memory(p, f).into_iter())
                .map(|(w, b)| (w.to_string(), b))
                .collect(),
        });
    Report {
        fabric: f.name.clone(),
        batch: l.batch,
        fullest,
        steps,
        step_cycles,
        estimate: l.estimate,
        samples_per_second: f64::from(l.batch) * f.clock_ghz * 1e9 / step_cycles,
        utilisation: all_work as f64 / (f64::from(pes.max(1)) * total * lanes),
        pes,
        kernels,
        slowest,
        busiest_link,
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "wafer step on {} (batch {}, {} simulated steps): {:.0} cycles, {:.0} samples/s at the clock, {} PEs at {:.1}% of their peak",
            self.fabric,
            self.batch,
            self.steps,
            self.step_cycles,
            self.samples_per_second,
            self.pes,
            100.0 * self.utilisation
        )?;
        if self.estimate > 0 {
            let off = 100.0 * (self.estimate as f64 / self.step_cycles.max(1.0) - 1.0);
            writeln!(
                f,
                "  estimated before simulating: {} cycles a step ({off:+.1}%)",
                self.estimate
            )?;
        }
        writeln!(
            f,
            "  {:<24} {:>9} {:>11} {:>10} {:>6} {:>9} {:>6}  colours",
            "kernel", "at", "PEs (wxh)", "cyc/sample", "util", "SRAM", "window"
        )?;
        for (i, k) in self.kernels.iter().enumerate() {
            let colours: Vec<String> = k.colours.iter().map(|c| c.to_string()).collect();
            writeln!(
                f,
                "  {:<24} {:>9} {:>11} {:>10.1} {:>5.1}% {:>8.1}K {:>6}  {}{}",
                k.name,
                format!("({},{})", k.x, k.y),
                format!("{} ({}x{})", k.pes, k.w, k.h),
                k.cycles_per_sample,
                100.0 * k.utilisation,
                f64::from(k.sram_bytes) / 1024.0,
                if k.window > 0 {
                    k.window.to_string()
                } else {
                    "-".into()
                },
                colours.join(","),
                if i == self.slowest {
                    "  <- slowest"
                } else {
                    ""
                }
            )?;
        }
        if let Some(m) = &self.fullest {
            let parts: Vec<String> = (m.parts.iter())
                .map(|(w, b)| format!("{:.1}K {w}", f64::from(*b) / 1024.0))
                .collect();
            let all: u32 = m.parts.iter().map(|p| p.1).sum();
            writeln!(
                f,
                "  fullest PE: ({},{}) of `{}`, {:.1}K: {}",
                m.x,
                m.y,
                m.kernel,
                f64::from(all) / 1024.0,
                parts.join(", ")
            )?;
        }
        if let Some((x, y, d, n)) = self.busiest_link {
            let per_sample = self.step_cycles / f64::from(self.batch.max(1));
            writeln!(
                f,
                "  busiest link: out of ({x},{y}) {}, {n:.1} wavelets a sample ({:.1}% of a sample's cycles)",
                d.name(),
                100.0 * n / per_sample.max(1.0)
            )?;
        }
        Ok(())
    }
}

/// The placement as SVG: the fabric's grid, each kernel a rectangle coloured by its
/// utilisation (red 0% to green 100%) and labelled, and the streams' routes between
/// PEs drawn as lines.
pub fn svg(l: &Layout, r: &Report) -> String {
    let f = &l.fabric;
    let cell = (960.0 / f64::from(f.width.max(f.height))).clamp(0.5, 24.0);
    let (w, h) = (f64::from(f.width) * cell, f64::from(f.height) * cell);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{:.0}" height="{:.0}" viewBox="0 0 {w:.1} {:.1}" font-family="sans-serif">"#,
        w,
        h + 40.0,
        h + 40.0
    );
    let _ = writeln!(
        s,
        r##"<rect x="0" y="0" width="{w:.1}" height="{h:.1}" fill="#f4f4f4" stroke="#999"/>"##
    );
    for k in &r.kernels {
        let u = k.utilisation.clamp(0.0, 1.0);
        let hue = 120.0 * u;
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="hsl({hue:.0},70%,60%)" stroke="#333" stroke-width="1"><title>{}: {} PEs, {:.1} cycles/sample, {:.1}% utilisation</title></rect>"##,
            f64::from(k.x) * cell,
            f64::from(k.y) * cell,
            f64::from(k.w) * cell,
            f64::from(k.h) * cell,
            k.name,
            k.pes,
            k.cycles_per_sample,
            100.0 * u
        );
    }
    // the streams' links between kernels, and to and from the fabric's edges
    let kernel_at = |x: u32, y: u32| {
        r.kernels
            .iter()
            .position(|k| x >= k.x && x < k.x + k.w && y >= k.y && y < k.y + k.h)
    };
    for (&(x, y, c), route) in &l.setup.routes {
        if c < CHAIN_COLOURS {
            continue;
        }
        let (cx, cy) = ((f64::from(x) + 0.5) * cell, (f64::from(y) + 0.5) * cell);
        for d in route.tx() {
            let (dx, dy): (i64, i64) = match d {
                Dir::N => (0, -1),
                Dir::S => (0, 1),
                Dir::E => (1, 0),
                Dir::W => (-1, 0),
                Dir::Ramp => continue,
            };
            let (nx, ny) = (i64::from(x) + dx, i64::from(y) + dy);
            let inside = nx >= 0 && ny >= 0 && {
                let here = kernel_at(x, y);
                here.is_some() && here == kernel_at(nx as u32, ny as u32)
            };
            if inside {
                continue;
            }
            let _ = writeln!(
                s,
                r##"<line x1="{cx:.1}" y1="{cy:.1}" x2="{:.1}" y2="{:.1}" stroke="#1f4e9a" stroke-width="{:.2}"/>"##,
                cx + dx as f64 * cell,
                cy + dy as f64 * cell,
                (cell / 4.0).max(0.5)
            );
        }
    }
    for k in &r.kernels {
        let size = (cell * 0.9).clamp(6.0, 12.0);
        let (x0, y0) = (f64::from(k.x) * cell, f64::from(k.y) * cell);
        let label = format!("{} {:.0}%", xml(&k.name), 100.0 * k.utilisation);
        if k.h > k.w {
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" font-size="{size:.1}" fill="#000" transform="rotate(90 {:.1} {:.1})">{label}</text>"##,
                x0 + 2.0,
                y0 + 2.0,
                x0 + 2.0,
                y0 + 2.0
            );
        } else {
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" font-size="{size:.1}" fill="#000">{label}</text>"##,
                x0 + 2.0,
                y0 + size + 1.0
            );
        }
    }
    let _ = writeln!(
        s,
        r##"<text x="4" y="{:.1}" font-size="13" fill="#000">{}: {:.0} cycles per step of {}, {:.0} samples/s, {:.1}% of the used PEs' peak</text>"##,
        h + 24.0,
        xml(&r.fabric),
        r.step_cycles,
        r.batch,
        r.samples_per_second,
        100.0 * r.utilisation
    );
    s.push_str("</svg>\n");
    s
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
