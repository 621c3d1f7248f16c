//! TensorBoard event files: TFRecord-framed `Event` protobufs with scalar summaries, in
//! `model_dir` for training and `model_dir/eval` for evaluations (TensorBoard's usual
//! layout). Each file starts with the `brain.Event:2` version event.

use crate::data::records::{fields, frame, put_bytes, put_key, put_varint, unframe, Field};
use std::io::Write;
use std::path::{Path, PathBuf};

/// An `Event` with a wall time, a step and either a file version or scalar values.
pub fn event(wall_time: f64, step: i64, version: Option<&str>, scalars: &[(&str, f32)]) -> Vec<u8> {
    let mut e = Vec::new();
    put_key(1, 1, &mut e);
    e.extend(wall_time.to_le_bytes());
    put_key(2, 0, &mut e);
    put_varint(step as u64, &mut e);
    if let Some(v) = version {
        put_bytes(3, v.as_bytes(), &mut e);
    }
    if !scalars.is_empty() {
        let mut summary = Vec::new();
        for (tag, v) in scalars {
            let mut value = Vec::new();
            put_bytes(1, tag.as_bytes(), &mut value);
            put_key(2, 5, &mut value);
            value.extend(v.to_le_bytes());
            put_bytes(1, &value, &mut summary);
        }
        put_bytes(5, &summary, &mut e);
    }
    e
}

/// An image for an image summary: its size, channels (1 grey, 3 RGB, 4 RGBA) and PNG
/// bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub height: u32,
    pub width: u32,
    pub channels: u32,
    pub png: Vec<u8>,
}

impl Image {
    /// Encodes 8-bit `pixels` (height x width x channels, row-major) as a PNG.
    pub fn encode(height: u32, width: u32, channels: u32, pixels: &[u8]) -> Result<Image, String> {
        let mut png = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut png, width, height);
            enc.set_color(match channels {
                1 => png::ColorType::Grayscale,
                3 => png::ColorType::Rgb,
                _ => png::ColorType::Rgba,
            });
            enc.set_depth(png::BitDepth::Eight);
            let mut w = enc.write_header().map_err(|e| e.to_string())?;
            w.write_image_data(pixels).map_err(|e| e.to_string())?;
        }
        Ok(Image {
            height,
            width,
            channels,
            png,
        })
    }
}

/// An `Event` at `step` with image summaries (`Summary.Value.image`).
pub fn image_event(wall_time: f64, step: i64, images: &[(String, Image)]) -> Vec<u8> {
    let mut e = event(wall_time, step, None, &[]);
    let mut summary = Vec::new();
    for (tag, im) in images {
        let mut img = Vec::new();
        put_key(1, 0, &mut img);
        put_varint(u64::from(im.height), &mut img);
        put_key(2, 0, &mut img);
        put_varint(u64::from(im.width), &mut img);
        put_key(3, 0, &mut img);
        put_varint(u64::from(im.channels), &mut img);
        put_bytes(4, &im.png, &mut img);
        let mut value = Vec::new();
        put_bytes(1, tag.as_bytes(), &mut value);
        put_bytes(4, &img, &mut value);
        put_bytes(1, &value, &mut summary);
    }
    put_bytes(5, &summary, &mut e);
    e
}

/// Reads the image summaries of an event file back: (step, tag, image) in file order.
pub fn read_images(path: &Path) -> Result<Vec<(i64, String, Image)>, String> {
    let mut out = Vec::new();
    each_value(path, |step, value| {
        let mut tag = String::new();
        let mut image = None;
        for f in fields(value).ok_or("malformed Summary.Value")? {
            match f {
                (1, Field::Bytes(t)) => tag = String::from_utf8_lossy(t).into_owned(),
                (4, Field::Bytes(im)) => {
                    let mut i = Image {
                        height: 0,
                        width: 0,
                        channels: 0,
                        png: Vec::new(),
                    };
                    for g in fields(im).ok_or("malformed Image")? {
                        match g {
                            (1, Field::Varint(v)) => i.height = v as u32,
                            (2, Field::Varint(v)) => i.width = v as u32,
                            (3, Field::Varint(v)) => i.channels = v as u32,
                            (4, Field::Bytes(p)) => i.png = p.to_vec(),
                            _ => {}
                        }
                    }
                    image = Some(i);
                }
                _ => {}
            }
        }
        if let Some(i) = image {
            out.push((step, tag, i));
        }
        Ok(())
    })?;
    Ok(out)
}

/// Calls `f` with the step and bytes of every `Summary.Value` of an event file, in
/// file order.
fn each_value(
    path: &Path,
    mut f: impl FnMut(i64, &[u8]) -> Result<(), String>,
) -> Result<(), String> {
    let b = std::fs::read(path).map_err(|e| e.to_string())?;
    for rec in unframe(&b).map_err(|e| e.to_string())? {
        let event = fields(&rec).ok_or("malformed Event")?;
        let step = event
            .iter()
            .find_map(|f| match f {
                (2, Field::Varint(s)) => Some(*s as i64),
                _ => None,
            })
            .unwrap_or(0);
        for (_, summary) in event.iter().filter(|f| f.0 == 5) {
            let Field::Bytes(summary) = summary else {
                return Err("malformed Summary".into());
            };
            for (_, value) in fields(summary).ok_or("malformed Summary")? {
                let Field::Bytes(value) = value else {
                    return Err("malformed Summary.Value".into());
                };
                f(step, value)?;
            }
        }
    }
    Ok(())
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

    pub fn images(&mut self, step: i64, images: &[(String, Image)]) -> std::io::Result<()> {
        if images.is_empty() {
            return Ok(());
        }
        self.write(&image_event(now(), step, images))
    }

    /// A `SessionLog` START event at `step`, written when a training run starts (as
    /// TensorFlow's Estimator does): TensorBoard then purges the events at `step` and
    /// later that earlier runs wrote, so the steps a crashed run did after its last
    /// checkpoint, which the resumed run does again, are not shown twice. (Checked with
    /// TensorBoard 2.21's `EventAccumulator`, which reports "Purging expired events".)
    pub fn session_start(&mut self, step: i64) -> std::io::Result<()> {
        let mut e = event(now(), step, None, &[]);
        let mut log = Vec::new();
        put_key(1, 0, &mut log);
        put_varint(SESSION_START, &mut log);
        put_bytes(SESSION_LOG, &log, &mut e);
        self.write(&e)
    }
}

/// `Event.session_log`, the field number of TensorFlow's `event.proto`.
const SESSION_LOG: u32 = 7;

/// `SessionLog.SessionStatus.START`.
const SESSION_START: u64 = 1;

/// The steps of the `SessionLog` START events of an event file, in file order.
pub fn read_session_starts(path: &Path) -> Result<Vec<i64>, String> {
    let b = std::fs::read(path).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for rec in unframe(&b).map_err(|e| e.to_string())? {
        let event = fields(&rec).ok_or("malformed Event")?;
        let step = event.iter().find_map(|f| match f {
            (2, Field::Varint(s)) => Some(*s as i64),
            _ => None,
        });
        for (_, log) in event.iter().filter(|f| f.0 == SESSION_LOG) {
            let Field::Bytes(log) = log else {
                return Err("malformed SessionLog".into());
            };
            let status = fields(log)
                .ok_or("malformed SessionLog")?
                .into_iter()
                .find_map(|f| match f {
                    (1, Field::Varint(s)) => Some(s),
                    _ => None,
                });
            if status == Some(SESSION_START) {
                out.push(step.unwrap_or(0));
            }
        }
    }
    Ok(out)
}

/// Reads the scalars of an event file back: (step, tag, value) in file order.
pub fn read_scalars(path: &Path) -> Result<Vec<(i64, String, f32)>, String> {
    let mut out = Vec::new();
    each_value(path, |step, value| {
        let (mut tag, mut v) = (String::new(), None);
        for f in fields(value).ok_or("malformed Summary.Value")? {
            match f {
                (1, Field::Bytes(t)) => tag = String::from_utf8_lossy(t).into_owned(),
                (2, Field::Fixed32(bits)) => v = Some(f32::from_bits(bits)),
                _ => {}
            }
        }
        if let Some(v) = v {
            out.push((step, tag, v));
        }
        Ok(())
    })?;
    Ok(out)
}
