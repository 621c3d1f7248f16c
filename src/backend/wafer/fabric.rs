//! The machine model: one fabric configuration, every figure a field. Named configs
//! (`test32`, `test64`, `wse2`, `wse3`) follow DESIGN.md §4 and
//! `../shared/wafer/hardware.md` §6; a `FILE.toml` names every field itself. The
//! fingerprint (a stable hash of every field) stamps each artifact compiled for it.

use crate::hash::{fnv1a, FNV_OFFSET};
use serde::{Deserialize, Serialize};

/// A simulated wafer: a `width` x `height` rectangle of processing elements (PEs), each
/// with its SRAM, SIMD units and a router on a 2-D mesh.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fabric {
    /// The config's name (reports and diagnostics).
    pub name: String,
    /// PE columns of the program rectangle.
    pub width: u32,
    /// PE rows of the program rectangle.
    pub height: u32,
    /// SRAM bytes per PE.
    pub sram_bytes: u32,
    /// Of which code and runtime hold this many (not available to buffers).
    pub reserved_bytes: u32,
    /// fp16 multiply-accumulates per PE per cycle (the SIMD width).
    pub fp16_lanes: u32,
    /// fp32 multiply-accumulates per PE per cycle.
    pub fp32_lanes: u32,
    /// SRAM bytes a PE reads per cycle (two 64-bit ports).
    pub sram_read_bytes: u32,
    /// SRAM bytes a PE writes per cycle (one 64-bit port).
    pub sram_write_bytes: u32,
    /// Cycles to start a vector (DSD) operation.
    pub dsd_startup: u32,
    /// Cycles to activate or switch to a task.
    pub task_switch: u32,
    /// Cycles per element of an operation done in software (exp, log, division, ...).
    pub software_op: u32,
    /// Cycles for a wavelet to cross one link.
    pub hop_latency: u32,
    /// Cycles between a PE and its router, each way.
    pub ramp_latency: u32,
    /// Wavelets each PE's input queue of one colour holds.
    pub queue_depth: u32,
    /// Routable colours (virtual channels).
    pub colours: u32,
    /// Of which the runtime keeps this many (programs get the rest).
    pub reserved_colours: u32,
    /// The clock that converts cycles into seconds in reports.
    pub clock_ghz: f64,
    /// Host I/O streams into and out of the fabric.
    pub io_channels: u32,
}

/// The configs `--wafer` names.
pub const NAMES: &[&str] = &["test32", "test64", "wse2", "wse3"];

impl Fabric {
    /// The config runs use when `--wafer` names none: `test32`.
    pub fn test32() -> Fabric {
        Fabric::cerebras_like("test32", 32, 32, 4)
    }

    /// A Cerebras-like PE on a `width` x `height` grid (hardware.md §6's defaults).
    fn cerebras_like(name: &str, width: u32, height: u32, fp16_lanes: u32) -> Fabric {
        Fabric {
            name: name.to_string(),
            width,
            height,
            sram_bytes: 48 * 1024,
            reserved_bytes: 6 * 1024,
            fp16_lanes,
            fp32_lanes: 1,
            sram_read_bytes: 16,
            sram_write_bytes: 8,
            dsd_startup: 5,
            task_switch: 10,
            software_op: 20,
            hop_latency: 1,
            ramp_latency: 2,
            queue_depth: 4,
            colours: 24,
            reserved_colours: 6,
            clock_ghz: 0.85,
            io_channels: 16,
        }
    }

    /// A named config, or `None`.
    pub fn named(name: &str) -> Option<Fabric> {
        Some(match name {
            "test32" => Fabric::test32(),
            "test64" => Fabric::cerebras_like(name, 64, 64, 4),
            "wse2" => Fabric::cerebras_like(name, 750, 994, 4),
            "wse3" => Fabric::cerebras_like(name, 755, 1170, 8),
            _ => return None,
        })
    }

    /// A config written as TOML (every field named), checked.
    pub fn from_toml(text: &str) -> Result<Fabric, String> {
        let f: Fabric = toml::from_str(text).map_err(|e| e.message().to_string())?;
        f.check()?;
        Ok(f)
    }

    /// The config as TOML (what `from_toml` reads back).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// Why the config describes no machine a program could run on, if it does not.
    pub fn check(&self) -> Result<(), String> {
        let positive = [
            ("width", self.width),
            ("height", self.height),
            ("sram_bytes", self.sram_bytes),
            ("fp16_lanes", self.fp16_lanes),
            ("fp32_lanes", self.fp32_lanes),
            ("sram_read_bytes", self.sram_read_bytes),
            ("sram_write_bytes", self.sram_write_bytes),
            ("hop_latency", self.hop_latency),
            ("queue_depth", self.queue_depth),
            ("colours", self.colours),
        ];
        if let Some((field, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("`{field}` must be at least 1"));
        }
        if self.reserved_bytes >= self.sram_bytes {
            return Err(format!(
                "`reserved_bytes` ({}) leaves nothing of `sram_bytes` ({})",
                self.reserved_bytes, self.sram_bytes
            ));
        }
        if !self.sram_bytes.is_multiple_of(4) {
            return Err(format!(
                "`sram_bytes` ({}) is not a whole number of 32-bit words",
                self.sram_bytes
            ));
        }
        if self.reserved_colours >= self.colours {
            return Err(format!(
                "`reserved_colours` ({}) leaves no colour of `colours` ({}) to programs",
                self.reserved_colours, self.colours
            ));
        }
        if self.colours > 64 {
            return Err(format!(
                "`colours` ({}) is more than the 64 a router's colour mask holds",
                self.colours
            ));
        }
        if !(self.clock_ghz.is_finite() && self.clock_ghz > 0.0) {
            return Err(format!(
                "`clock_ghz` ({}) must be a positive number",
                self.clock_ghz
            ));
        }
        if self.width.checked_mul(self.height).is_none() {
            return Err("`width` x `height` is too many PEs".into());
        }
        Ok(())
    }

    /// The PEs of the program rectangle.
    pub fn pes(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }

    /// The SRAM bytes per PE that programs' buffers may use.
    pub fn usable_bytes(&self) -> u32 {
        self.sram_bytes - self.reserved_bytes
    }

    /// The colours programs may use.
    pub fn program_colours(&self) -> u32 {
        self.colours - self.reserved_colours
    }

    /// A stable fingerprint of every field: the same config gives the same value on
    /// every machine and in every version of est that keeps these fields.
    pub fn fingerprint(&self) -> u64 {
        fnv1a(FNV_OFFSET, self.canonical().as_bytes())
    }

    /// Every field as `name=value` lines in declaration order (the fingerprint's input).
    fn canonical(&self) -> String {
        let Fabric {
            name,
            width,
            height,
            sram_bytes,
            reserved_bytes,
            fp16_lanes,
            fp32_lanes,
            sram_read_bytes,
            sram_write_bytes,
            dsd_startup,
            task_switch,
            software_op,
            hop_latency,
            ramp_latency,
            queue_depth,
            colours,
            reserved_colours,
            clock_ghz,
            io_channels,
        } = self;
        format!(
            "name={name}\nwidth={width}\nheight={height}\nsram_bytes={sram_bytes}\n\
             reserved_bytes={reserved_bytes}\nfp16_lanes={fp16_lanes}\nfp32_lanes={fp32_lanes}\n\
             sram_read_bytes={sram_read_bytes}\nsram_write_bytes={sram_write_bytes}\n\
             dsd_startup={dsd_startup}\ntask_switch={task_switch}\nsoftware_op={software_op}\n\
             hop_latency={hop_latency}\nramp_latency={ramp_latency}\nqueue_depth={queue_depth}\n\
             colours={colours}\nreserved_colours={reserved_colours}\nclock_ghz={:016x}\n\
             io_channels={io_channels}\n",
            clock_ghz.to_bits()
        )
    }

    /// Peak multiply-accumulates per cycle of `pes` PEs in fp32.
    pub fn fp32_peak(&self, pes: u64) -> u64 {
        pes * u64::from(self.fp32_lanes)
    }
}

/// What `--wafer` names: a config's name or a TOML file.
pub fn resolve(arg: &str) -> Result<Fabric, String> {
    if let Some(f) = Fabric::named(arg) {
        return Ok(f);
    }
    if arg.ends_with(".toml") {
        let text = std::fs::read_to_string(arg).map_err(|e| format!("cannot read `{arg}`: {e}"))?;
        return Fabric::from_toml(&text).map_err(|e| format!("`{arg}`: {e}"));
    }
    Err(format!(
        "`{arg}` is neither a fabric config ({}) nor a `.toml` file",
        NAMES.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_configs_are_valid_and_distinct() {
        let all: Vec<Fabric> = NAMES.iter().map(|n| Fabric::named(n).unwrap()).collect();
        for f in &all {
            f.check().unwrap();
        }
        let t = &all[0];
        assert_eq!((t.width, t.height, t.pes()), (32, 32, 1024));
        assert_eq!(t.usable_bytes(), 42 * 1024);
        assert_eq!(t.program_colours(), 18);
        assert_eq!(all[2].pes(), 745_500);
        assert_eq!(all[3].fp16_lanes, 8);
        let mut prints: Vec<u64> = all.iter().map(Fabric::fingerprint).collect();
        prints.sort_unstable();
        prints.dedup();
        assert_eq!(prints.len(), NAMES.len());
    }

    #[test]
    fn toml_round_trips_with_the_same_fingerprint() {
        let f = Fabric::named("wse3").unwrap();
        let back = Fabric::from_toml(&f.to_toml()).unwrap();
        assert_eq!(back, f);
        assert_eq!(back.fingerprint(), f.fingerprint());
        let mut g = f.clone();
        g.queue_depth += 1;
        assert_ne!(g.fingerprint(), f.fingerprint());
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        let f = Fabric::named("test32").unwrap();
        let text = f.to_toml().replace("colours = 24", "colours = 6");
        let e = Fabric::from_toml(&text).unwrap_err();
        assert!(e.contains("reserved_colours"), "{e}");
        let text = f.to_toml().replace("width = 32", "width = 0");
        assert!(Fabric::from_toml(&text).unwrap_err().contains("`width`"));
        let text = f.to_toml() + "speed = 3\n";
        assert!(Fabric::from_toml(&text).unwrap_err().contains("speed"));
        let e = resolve("wse9").unwrap_err();
        assert!(e.contains("test32, test64, wse2, wse3"), "{e}");
    }
}
