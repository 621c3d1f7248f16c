//! Record formats the runtime reads and writes: TFRecord framing (with masked CRC32C of
//! the length and of the data), `tf.Example` protobufs, and `.npy` arrays.

use super::pipeline::Element;
use crate::ir::{DType, TensorType};
use crate::tensor::{dtype_size, Arr, Data, Tensor};
use ndarray::IxDyn;
use std::io::Read;
use std::path::{Path, PathBuf};

/// TFRecord's CRC mask.
pub fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One record in TFRecord framing.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 16);
    let len = (data.len() as u64).to_le_bytes();
    out.extend(len);
    out.extend(masked_crc(&len).to_le_bytes());
    out.extend(data);
    out.extend(masked_crc(data).to_le_bytes());
    out
}

/// Why a TFRecord frame could not be read. `offset` is the frame's first byte and
/// `index` its record number in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// The file ends inside the frame's header or data.
    Truncated {
        offset: u64,
        index: u64,
        what: &'static str,
    },
    /// The length does not match its CRC: the rest of the file cannot be trusted.
    LengthCrc { offset: u64, index: u64 },
    /// The data does not match its CRC; the next frame can still be read.
    DataCrc { offset: u64, index: u64 },
}

impl FrameError {
    /// Whether reading can go on with the next frame of the same file.
    pub fn resumable(&self) -> bool {
        matches!(self, FrameError::DataCrc { .. })
    }
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Truncated {
                offset,
                index,
                what,
            } => {
                write!(f, "record {index} at byte {offset}: truncated {what}")
            }
            FrameError::LengthCrc { offset, index } => {
                write!(f, "record {index} at byte {offset}: length CRC mismatch")
            }
            FrameError::DataCrc { offset, index } => {
                write!(f, "record {index} at byte {offset}: data CRC mismatch")
            }
        }
    }
}

/// Reads TFRecord frames one by one from a byte stream of known length, checking both
/// CRCs. A length beyond the end of the stream is reported as truncation before any
/// memory is reserved for it.
pub struct RecordReader<R: Read> {
    r: R,
    remaining: u64,
    /// Where the next frame starts.
    pub offset: u64,
    /// The index of the next frame.
    pub index: u64,
}

impl<R: Read> RecordReader<R> {
    pub fn new(r: R, len: u64) -> RecordReader<R> {
        RecordReader {
            r,
            remaining: len,
            offset: 0,
            index: 0,
        }
    }

    fn fill(&mut self, buf: &mut [u8], what: &'static str, at: u64) -> Result<(), FrameError> {
        let trunc = FrameError::Truncated {
            offset: at,
            index: self.index,
            what,
        };
        if (buf.len() as u64) > self.remaining {
            return Err(trunc);
        }
        self.r.read_exact(buf).map_err(|_| trunc)?;
        self.remaining -= buf.len() as u64;
        Ok(())
    }

    /// Reads the next record into `data`; `Ok(false)` at the end of the stream.
    pub fn next_into(&mut self, data: &mut Vec<u8>) -> Result<bool, FrameError> {
        if self.remaining == 0 {
            return Ok(false);
        }
        let at = self.offset;
        let mut head = [0u8; 12];
        self.fill(&mut head, "header", at)?;
        let len_bytes: [u8; 8] = head[..8].try_into().expect("8 bytes");
        let crc = u32::from_le_bytes(head[8..].try_into().expect("4 bytes"));
        if crc != masked_crc(&len_bytes) {
            return Err(FrameError::LengthCrc {
                offset: at,
                index: self.index,
            });
        }
        let len = u64::from_le_bytes(len_bytes);
        if len.saturating_add(4) > self.remaining {
            return Err(FrameError::Truncated {
                offset: at,
                index: self.index,
                what: "data",
            });
        }
        data.clear();
        data.resize(len as usize, 0);
        self.fill(data, "data", at)?;
        let mut tail = [0u8; 4];
        self.fill(&mut tail, "data", at)?;
        self.offset = at + 16 + len;
        self.index += 1;
        if u32::from_le_bytes(tail) != masked_crc(data) {
            return Err(FrameError::DataCrc {
                offset: at,
                index: self.index - 1,
            });
        }
        Ok(true)
    }
}

/// Splits TFRecord bytes into records, checking both CRCs. Errors name the byte offset
/// and the record index.
pub fn unframe(bytes: &[u8]) -> Result<Vec<Vec<u8>>, FrameError> {
    let mut r = RecordReader::new(bytes, bytes.len() as u64);
    let mut out = Vec::new();
    let mut rec = Vec::new();
    while r.next_into(&mut rec)? {
        out.push(std::mem::take(&mut rec));
    }
    Ok(out)
}

/// The files a path names: itself, or the matches of a `*` pattern in its last part.
pub fn glob(path: &Path) -> Result<Vec<PathBuf>, String> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.contains('*') {
        if !path.is_file() {
            return Err(format!("{} does not exist", path.display()));
        }
        return Ok(vec![path.to_path_buf()]);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let (pre, post) = name.split_once('*').expect("has *");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            let n = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            n.len() >= pre.len() + post.len() && n.starts_with(pre) && n.ends_with(post)
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("no file matches {}", path.display()));
    }
    Ok(files)
}

/// Reads a protobuf varint at `at`, moving past it.
pub fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The fields of a protobuf message: (field number, value), in order.
pub(crate) fn fields(b: &[u8]) -> Option<Vec<(u32, Field<'_>)>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let key = varint(b, &mut at)?;
        let (num, wt) = ((key >> 3) as u32, key & 7);
        let f = match wt {
            0 => Field::Varint(varint(b, &mut at)?),
            1 => {
                let s = b.get(at..at + 8)?;
                at += 8;
                let _ = s;
                Field::Fixed64
            }
            2 => {
                let len = usize::try_from(varint(b, &mut at)?).ok()?;
                let s = b.get(at..at.checked_add(len)?)?;
                at += len;
                Field::Bytes(s)
            }
            5 => {
                let s = b.get(at..at + 4)?;
                at += 4;
                Field::Fixed32(u32::from_le_bytes(s.try_into().ok()?))
            }
            _ => return None,
        };
        out.push((num, f));
    }
    Some(out)
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Field<'a> {
    Varint(u64),
    Fixed64,
    Bytes(&'a [u8]),
    Fixed32(u32),
}

/// A feature's values.
enum Values {
    Bytes(Vec<Vec<u8>>),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
}

fn parse_feature(b: &[u8]) -> Option<Values> {
    for (num, f) in fields(b)? {
        let Field::Bytes(list) = f else { continue };
        let items = fields(list)?;
        return Some(match num {
            1 => Values::Bytes(
                items
                    .iter()
                    .filter_map(|(_, f)| match f {
                        Field::Bytes(s) => Some(s.to_vec()),
                        _ => None,
                    })
                    .collect(),
            ),
            2 => {
                let mut v = Vec::new();
                for (_, f) in items {
                    match f {
                        Field::Fixed32(x) => v.push(f32::from_bits(x)),
                        Field::Bytes(p) => v.extend(
                            p.chunks_exact(4)
                                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))),
                        ),
                        _ => return None,
                    }
                }
                Values::Floats(v)
            }
            3 => {
                let mut v = Vec::new();
                for (_, f) in items {
                    match f {
                        Field::Varint(x) => v.push(x as i64),
                        Field::Bytes(p) => {
                            let mut at = 0;
                            while at < p.len() {
                                v.push(varint(p, &mut at)? as i64);
                            }
                        }
                        _ => return None,
                    }
                }
                Values::Ints(v)
            }
            _ => return None,
        });
    }
    None
}

/// A feature to write into a `tf.Example`.
#[derive(Debug, Clone, Copy)]
pub enum Feature<'a> {
    Bytes(&'a [u8]),
    Floats(&'a [f32]),
    Ints(&'a [i64]),
}

/// Protobuf writing: a varint.
pub(crate) fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Protobuf writing: a field's key (number and wire type).
pub(crate) fn put_key(field: u32, wire: u32, out: &mut Vec<u8>) {
    put_varint(u64::from(field << 3 | wire), out);
}

/// Protobuf writing: a length-delimited field.
pub(crate) fn put_bytes(field: u32, b: &[u8], out: &mut Vec<u8>) {
    put_key(field, 2, out);
    put_varint(b.len() as u64, out);
    out.extend(b);
}

/// A serialized `tf.Example` with the given features (lists packed, as TensorFlow
/// writes them).
pub fn encode_example(features: &[(&str, Feature<'_>)]) -> Vec<u8> {
    let mut map = Vec::new();
    for (name, f) in features {
        let (field, list) = match f {
            Feature::Bytes(b) => {
                let mut l = Vec::new();
                put_bytes(1, b, &mut l);
                (1, l)
            }
            Feature::Floats(v) => {
                let packed: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                let mut l = Vec::new();
                put_bytes(1, &packed, &mut l);
                (2, l)
            }
            Feature::Ints(v) => {
                let mut packed = Vec::new();
                for &x in v.iter() {
                    put_varint(x as u64, &mut packed);
                }
                let mut l = Vec::new();
                put_bytes(1, &packed, &mut l);
                (3, l)
            }
        };
        let mut feature = Vec::new();
        put_bytes(field, &list, &mut feature);
        let mut entry = Vec::new();
        put_bytes(1, name.as_bytes(), &mut entry);
        put_bytes(2, &feature, &mut entry);
        put_bytes(1, &entry, &mut map);
    }
    let mut ex = Vec::new();
    put_bytes(1, &map, &mut ex);
    ex
}

/// Parses a serialized `tf.Example` into the named features, in order.
pub fn parse_example(b: &[u8], want: &[(String, DType, Vec<usize>)]) -> Result<Element, String> {
    let mut found: Vec<(String, Values)> = Vec::new();
    let top = fields(b).ok_or("the record is not a tf.Example protobuf")?;
    for (num, f) in top {
        let (1, Field::Bytes(features)) = (num, f) else {
            continue;
        };
        for (num, f) in fields(features).ok_or("malformed Features")? {
            let (1, Field::Bytes(entry)) = (num, f) else {
                continue;
            };
            let mut key = None;
            let mut value = None;
            for (n, f) in fields(entry).ok_or("malformed feature entry")? {
                match (n, f) {
                    (1, Field::Bytes(k)) => key = Some(String::from_utf8_lossy(k).into_owned()),
                    (2, Field::Bytes(v)) => value = Some(v),
                    _ => {}
                }
            }
            if let (Some(k), Some(v)) = (key, value) {
                let vals = parse_feature(v).ok_or_else(|| format!("feature `{k}` is malformed"))?;
                found.push((k, vals));
            }
        }
    }
    let mut out = Vec::with_capacity(want.len());
    for (name, dtype, dims) in want {
        let Some((_, vals)) = found.iter().find(|(k, _)| k == name) else {
            return Err(format!("feature `{name}` is missing"));
        };
        let ty = TensorType::new(*dtype, dims.clone());
        let n = ty.elements();
        let t = match (vals, dtype) {
            (Values::Bytes(v), DType::Bytes) => Tensor {
                dtype: DType::Bytes,
                data: Data::S(Arr::from_elem(
                    IxDyn(&[]),
                    v.first().cloned().unwrap_or_default(),
                )),
            },
            (Values::Floats(v), d) if d.is_float() && v.len() == n => {
                Tensor::from_f64(&ty, v.iter().map(|&x| f64::from(x)).collect())
            }
            (Values::Ints(v), d) if d.is_int() && v.len() == n => {
                if let Some(&bad) = v.iter().find(|&&x| !fits(*d, x)) {
                    return Err(format!("feature `{name}`: {bad} does not fit {d}"));
                }
                Tensor::from_f64(&ty, v.iter().map(|&x| x as f64).collect())
            }
            (v, d) => {
                let (kind, len) = match v {
                    Values::Bytes(x) => ("bytes_list", x.len()),
                    Values::Floats(x) => ("float_list", x.len()),
                    Values::Ints(x) => ("int64_list", x.len()),
                };
                return Err(format!(
                    "feature `{name}` is a {kind} of {len} values, but the program parses it as {ty}",
                    ty = if d == &DType::Bytes { "bytes".to_string() } else { ty.to_string() }
                ));
            }
        };
        out.push(t);
    }
    Ok(out)
}

fn fits(d: DType, x: i64) -> bool {
    match d {
        DType::I32 => i32::try_from(x).is_ok(),
        DType::U8 => u8::try_from(x).is_ok(),
        _ => true,
    }
}

fn npy_descr(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::I32 => "<i4",
        DType::U8 => "|u1",
        DType::I64 => "<i8",
        DType::Bool => "|b1",
        DType::BF16 | DType::Bytes => return None,
    })
}

/// A tensor as a `.npy` file (bf16 is written as f32, which numpy reads).
pub fn npy_bytes(t: &Tensor) -> Vec<u8> {
    let (descr, data) = match npy_descr(t.dtype) {
        Some(d) => (d, t.to_le_bytes()),
        None => (
            "<f4",
            t.to_f64()
                .iter()
                .flat_map(|&x| (x as f32).to_le_bytes())
                .collect(),
        ),
    };
    let shape: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    let shape = match shape.len() {
        1 => format!("({},)", shape[0]),
        _ => format!("({})", shape.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((header.len() as u16).to_le_bytes());
    out.extend(header.as_bytes());
    out.extend(data);
    out
}

/// Reads a `.npy` file as rows: the first axis is the dataset's, the rest must be `dims`.
/// The dtype, shape and data offset of a `.npy` file's bytes.
pub fn npy_header(b: &[u8]) -> Result<(DType, Vec<usize>, usize), String> {
    if b.len() < 10 || &b[..6] != b"\x93NUMPY" {
        return Err("not a .npy file".into());
    }
    let (hlen, start): (usize, usize) = if b[6] == 1 {
        (u16::from_le_bytes([b[8], b[9]]) as usize, 10)
    } else {
        if b.len() < 12 {
            return Err("truncated header".into());
        }
        (u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize, 12)
    };
    let header = b
        .get(start..start.saturating_add(hlen))
        .map(String::from_utf8_lossy)
        .ok_or("truncated header")?;
    let dtype = [
        DType::F32,
        DType::F16,
        DType::I32,
        DType::U8,
        DType::I64,
        DType::Bool,
    ]
    .into_iter()
    .find(|&d| npy_descr(d).is_some_and(|x| header.contains(&format!("'{x}'"))))
    .ok_or("unsupported dtype (f32, f16, i32, u8, i64 and bool arrays are read)")?;
    if header.contains("'fortran_order': True") {
        return Err("Fortran-ordered arrays are not supported".into());
    }
    let shape_text = header
        .split("'shape':")
        .nth(1)
        .and_then(|s| s.split('(').nth(1))
        .and_then(|s| s.split(')').next())
        .ok_or("no shape in header")?;
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| "bad shape".to_string()))
        .collect::<Result<_, _>>()?;
    Ok((dtype, shape, start + hlen))
}

/// The rows of a `.npy` file whose elements must be `dtype[dims]`.
pub fn read_npy(path: &Path, dtype: DType, dims: &[usize]) -> Result<Vec<Tensor>, String> {
    let b = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    npy_rows(&b, path, dtype, dims)
}

/// The rows of `.npy` bytes (read from `path`) whose elements must be `dtype[dims]`.
pub fn npy_rows(
    b: &[u8],
    path: &Path,
    dtype: DType,
    dims: &[usize],
) -> Result<Vec<Tensor>, String> {
    let bad = |m: &str| format!("{}: {m}", path.display());
    let (got, shape, start) = npy_header(b).map_err(|m| bad(&m))?;
    if got != dtype {
        return Err(bad(&format!("the array's dtype is {got}, not {dtype}")));
    }
    if shape.is_empty() || shape[1..] != *dims {
        return Err(bad(&format!(
            "shape {shape:?} does not give elements of shape {dims:?}"
        )));
    }
    let per = dims
        .iter()
        .try_fold(dtype_size(dtype).unwrap_or(1), |a, &d| a.checked_mul(d))
        .ok_or_else(|| bad("the shape is too large"))?;
    let data = &b[start..];
    if Some(data.len()) != per.checked_mul(shape[0]) {
        return Err(bad("data size does not match the shape"));
    }
    let ty = TensorType::new(dtype, dims.to_vec());
    (0..shape[0])
        .map(|i| {
            Tensor::from_le_bytes(&ty, &data[i * per..(i + 1) * per]).ok_or_else(|| bad("bad data"))
        })
        .collect()
}
