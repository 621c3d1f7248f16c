//! TensorBoard event files: TFRecord-framed `Event` protobufs with scalar summaries, in
//! `model_dir` for training and `model_dir/eval` for evaluations (TensorBoard's usual
//! layout). Each file starts with the `brain.Event:2` version event.

use super::records::{frame, unframe, varint as read_varint};
use std::io::Write;
use std::path::{Path, PathBuf};

fn key(field: u32, wire: u32, out: &mut Vec<u8>) {
    varint(u64::from(field << 3 | wire), out);
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(field: u32, b: &[u8], out: &mut Vec<u8>) {
    key(field, 2, out);
    varint(b.len() as u64, out);
    out.extend(b);
}

/// An `Event` with a wall time, a step and either a file version or scalar values.
pub fn event(wall_time: f64, step: i64, version: Option<&str>, scalars: &[(&str, f32)]) -> Vec<u8> {
    let mut e = Vec::new();
    key(1, 1, &mut e);
    e.extend(wall_time.to_le_bytes());
    key(2, 0, &mut e);
    varint(step as u64, &mut e);
    if let Some(v) = version {
        bytes_field(3, v.as_bytes(), &mut e);
    }
    if !scalars.is_empty() {
        let mut summary = Vec::new();
        for (tag, v) in scalars {
            let mut value = Vec::new();
            bytes_field(1, tag.as_bytes(), &mut value);
            key(2, 5, &mut value);
            value.extend(v.to_le_bytes());
            bytes_field(1, &value, &mut summary);
        }
        bytes_field(5, &summary, &mut e);
    }
    e
}

/// An open event file.
pub struct EventWriter {
    file: std::fs::File,
    pub path: PathBuf,
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl EventWriter {
    /// A new event file in `dir` (created if needed).
    pub fn create(dir: &Path) -> std::io::Result<EventWriter> {
        std::fs::create_dir_all(dir)?;
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let t = now();
        let mut n = 0;
        let path = loop {
            let p = dir.join(format!(
                "events.out.tfevents.{}.{host}.{}.{n}",
                t as u64,
                std::process::id()
            ));
            if !p.exists() {
                break p;
            }
            n += 1;
        };
        let mut w = EventWriter {
            file: std::fs::File::create(&path)?,
            path,
        };
        w.write(&event(t, 0, Some("brain.Event:2"), &[]))?;
        Ok(w)
    }

    fn write(&mut self, e: &[u8]) -> std::io::Result<()> {
        self.file.write_all(&frame(e))?;
        self.file.flush()
    }

    pub fn scalars(&mut self, step: i64, values: &[(&str, f32)]) -> std::io::Result<()> {
        self.write(&event(now(), step, None, values))
    }
}

/// Reads the scalars of an event file back: (step, tag, value) in file order.
pub fn read_scalars(path: &Path) -> Result<Vec<(i64, String, f32)>, String> {
    let b = std::fs::read(path).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for rec in unframe(&b)? {
        let mut step = 0i64;
        let mut at = 0;
        let mut values = Vec::new();
        while at < rec.len() {
            let k = read_varint(rec, &mut at).ok_or("bad key")?;
            match (k >> 3, k & 7) {
                (2, 0) => step = read_varint(rec, &mut at).ok_or("bad step")? as i64,
                (_, 0) => {
                    read_varint(rec, &mut at).ok_or("bad varint")?;
                }
                (_, 1) => at += 8,
                (_, 5) => at += 4,
                (f, 2) => {
                    let n = read_varint(rec, &mut at).ok_or("bad length")? as usize;
                    let body = rec.get(at..at + n).ok_or("truncated")?;
                    at += n;
                    if f == 5 {
                        values.extend(summary_values(body).ok_or("bad summary")?);
                    }
                }
                _ => return Err("bad wire type".into()),
            }
        }
        out.extend(values.into_iter().map(|(t, v)| (step, t, v)));
    }
    Ok(out)
}

fn summary_values(b: &[u8]) -> Option<Vec<(String, f32)>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let _k = read_varint(b, &mut at)?;
        let n = read_varint(b, &mut at)? as usize;
        let v = b.get(at..at + n)?;
        at += n;
        let (mut tag, mut val) = (String::new(), 0f32);
        let mut i = 0;
        while i < v.len() {
            let k = read_varint(v, &mut i)?;
            match (k >> 3, k & 7) {
                (1, 2) => {
                    let n = read_varint(v, &mut i)? as usize;
                    tag = String::from_utf8_lossy(v.get(i..i + n)?).into_owned();
                    i += n;
                }
                (2, 5) => {
                    val = f32::from_le_bytes(v.get(i..i + 4)?.try_into().ok()?);
                    i += 4;
                }
                _ => return None,
            }
        }
        out.push((tag, val));
    }
    Some(out)
}
