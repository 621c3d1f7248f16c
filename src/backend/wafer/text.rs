//! PE programs as text: the listing `estc build --emit wafer` prints (a program's
//! pipeline, FIFOs, memory map and tasks; its descriptors and sources), and f32s in the
//! artifact's JSON.

use super::isa::{Dsd, Instr, Program, Src, Trigger};
use std::fmt;

impl fmt::Display for Dsd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dsd::Mem {
                base,
                len,
                stride,
                step,
                by,
                index,
            } => {
                let steps = |f: &mut fmt::Formatter<'_>, step: &[i32]| {
                    for (d, s) in step.iter().enumerate() {
                        if *s != 0 {
                            write!(f, " + {s}*i{d}")?;
                        }
                    }
                    Ok(())
                };
                write!(f, "mem[{base}")?;
                steps(f, step)?;
                if let Some((k, s)) = by {
                    write!(f, " + {s}*n{k}")?;
                }
                if let Some(x) = index {
                    write!(f, " + {}*mem[{}", x.scale, x.at)?;
                    steps(f, &x.step)?;
                    write!(f, "]")?;
                }
                write!(f, "; {len}")?;
                if *stride != 1 {
                    write!(f, " by {stride}")?;
                }
                write!(f, "]")
            }
            Dsd::In { colour, len } => write!(f, "in(c{colour}; {len})"),
            Dsd::Out { colour, len } => write!(f, "out(c{colour}; {len})"),
        }
    }
}

impl fmt::Display for Src {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Src::V(d) => write!(f, "{d}"),
            Src::Scalar(a) => write!(f, "mem[{a}]"),
            Src::Recv(c) => write!(f, "recv(c{c})"),
            Src::Imm(v) => write!(f, "{v:?}"),
        }
    }
}

fn write_body(f: &mut fmt::Formatter<'_>, body: &[Instr], indent: usize) -> fmt::Result {
    write_nest(f, body, indent, false)
}

/// `write_body`, `inside` a loop nest that is one operation (whose outermost loop says
/// so).
fn write_nest(
    f: &mut fmt::Formatter<'_>,
    body: &[Instr],
    indent: usize,
    inside: bool,
) -> fmt::Result {
    let pad = "  ".repeat(indent);
    for ins in body {
        match ins {
            Instr::Vec { op, dst, srcs } => {
                write!(f, "{pad}{:<9} {dst}", op.name())?;
                for s in srcs {
                    write!(f, ", {s}")?;
                }
                writeln!(f)?;
            }
            Instr::Loop { count, body } => {
                let dims = ins.dims();
                let one = match dims {
                    Some(d) if !inside => format!(" ({d}-d operation)"),
                    _ => String::new(),
                };
                writeln!(f, "{pad}loop i{} in 0..{count}{one}", indent - 1)?;
                write_nest(f, body, indent + 1, dims.is_some())?;
            }
            Instr::Activate(t) => writeln!(f, "{pad}activate  t{t}")?,
            Instr::Count {
                counter,
                every,
                then,
                again,
            } => {
                let then = then.map_or(String::new(), |t| format!(" -> t{t}"));
                let again = if *again { ", else again" } else { "" };
                writeln!(f, "{pad}count     n{counter}, every {every}{then}{again}")?;
            }
        }
    }
    Ok(())
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.share() > 1 {
            writeln!(f, "one sample in {} dealt to it", self.share())?;
        }
        if let Some(p) = &self.pipeline {
            writeln!(f, "{p}")?;
        }
        for q in &self.fifos {
            writeln!(f, "fifo of {} words on c{}", q.words, q.colour)?;
        }
        writeln!(f, "memory ({} words):", self.words())?;
        for s in &self.symbols {
            writeln!(f, "  {:>6} .. {:<6} {}", s.base, s.base + s.len, s.name)?;
        }
        for t in &self.tasks {
            let trigger = match t.trigger {
                Trigger::Data(c) => format!("on c{c}"),
                Trigger::Local { at_start: true } => "local, at start".into(),
                Trigger::Local { at_start: false } => "local".into(),
            };
            writeln!(f, "task t{} {} ({trigger}):", t.id, t.name)?;
            write_body(f, &t.body, 1)?;
        }
        Ok(())
    }
}

/// An f32 in JSON: a number, or `"inf"`, `"-inf"`, `"nan"` (which JSON numbers cannot
/// be).
pub mod f32_json {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f32, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f32(*v)
        } else if v.is_nan() {
            s.serialize_str("nan")
        } else if *v > 0.0 {
            s.serialize_str("inf")
        } else {
            s.serialize_str("-inf")
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f32, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum F {
            N(f32),
            S(String),
        }
        match F::deserialize(d)? {
            F::N(v) => Ok(v),
            F::S(s) => match s.as_str() {
                "nan" => Ok(f32::NAN),
                "inf" => Ok(f32::INFINITY),
                "-inf" => Ok(f32::NEG_INFINITY),
                _ => Err(serde::de::Error::custom(format!("`{s}` is not a number"))),
            },
        }
    }
}
