//! `estc data convert`: raw data (CSV/TSV, PNG folders, `.npy` arrays) to sharded
//! TFRecord files of `tf.Example`s, offline, so that training reads the fast format.
//!
//! - CSV/TSV: one record per row; every column is a feature named by the header, an
//!   `int64_list` when all its values are integers, a `float_list` when they are
//!   numbers, a `bytes_list` otherwise. `--group NAME=FIRST:LAST` makes a run of
//!   columns one feature, `--type NAME=float|int|bytes` sets a feature's kind.
//! - PNG: one record per image: `image_raw` (the decoded samples, one byte each, or two
//!   little-endian bytes for 16-bit images), `height`, `width`, `channels` and `label`
//!   (from the folder name, or a `file,label` CSV given with `--labels`).
//! - npy: one record per row of each array, the feature named by the file's stem: u8
//!   rows as bytes, float rows as floats, integer and bool rows as int64s;
//!   `--labels FILE.npy` adds a `label`.
//!
//! Records are split into `shards` files of consecutive records:
//! `PREFIX-00000-of-00004.tfrecord`, or `PREFIX.tfrecord` for one shard.

use super::records::{self, encode_example, Feature};
use super::sources;
use crate::diag::Code;
use crate::ir::DType;
use crate::tensor::Data;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    Csv,
    Tsv,
    Png,
    Npy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Float,
    Int,
    Bytes,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Float => "float_list",
            Kind::Int => "int64_list",
            Kind::Bytes => "bytes_list",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ConvertOptions {
    pub from: From,
    pub inputs: Vec<PathBuf>,
    /// The output path without `.tfrecord` (and without the shard suffix).
    pub output: PathBuf,
    pub shards: usize,
    /// npy: a labels array; png: a `file,label` CSV.
    pub labels: Option<PathBuf>,
    /// CSV/TSV: (feature, first column, last column).
    pub groups: Vec<(String, String, String)>,
    /// A feature's kind, overriding the inferred one.
    pub kinds: Vec<(String, Kind)>,
}

/// What a conversion wrote.
#[derive(Debug, Clone)]
pub struct ConvertReport {
    pub records: u64,
    pub files: Vec<PathBuf>,
    pub bytes: u64,
    /// Each feature's name, kind and values per record.
    pub features: Vec<(String, Kind, usize)>,
}

/// An error of a conversion, with its code and a hint.
#[derive(Debug, Clone)]
pub struct ConvertError {
    pub code: Code,
    pub message: String,
    pub help: String,
}

fn err(code: Code, message: impl Into<String>, help: &str) -> ConvertError {
    ConvertError {
        code,
        message: message.into(),
        help: help.to_string(),
    }
}

/// A feature's values in one record.
enum Val {
    F(Vec<f32>),
    I(Vec<i64>),
    B(Vec<u8>),
}

struct Table {
    names: Vec<(String, Kind, usize)>,
    rows: Vec<Vec<Val>>,
}

/// Converts the inputs; `progress(done, total)` is called as records are written.
pub fn convert(
    o: &ConvertOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertReport, ConvertError> {
    if o.inputs.is_empty() {
        return Err(err(
            Code::RunIo,
            "no input given",
            "name the files to convert",
        ));
    }
    let table = match o.from {
        From::Csv | From::Tsv => csv_table(o)?,
        From::Png => png_table(o)?,
        From::Npy => npy_table(o)?,
    };
    if table.rows.is_empty() {
        return Err(err(
            Code::BadData,
            "the input has no records",
            "convert a file with at least one row or image",
        ));
    }
    write_shards(o, &table, progress)
}

fn io(path: &Path, e: &dyn std::fmt::Display) -> ConvertError {
    err(
        Code::RunIo,
        format!("cannot read {}: {e}", path.display()),
        "check the path",
    )
}

fn csv_table(o: &ConvertOptions) -> Result<Table, ConvertError> {
    let delim = if o.from == From::Tsv { '\t' } else { ',' };
    let mut header: Option<Vec<String>> = None;
    let mut cells: Vec<Vec<String>> = Vec::new();
    for path in &o.inputs {
        let bytes = std::fs::read(path).map_err(|e| io(path, &e))?;
        let lines = text_lines(path, &bytes)?;
        let mut lines = lines.into_iter();
        let Some((_, first)) = lines.next() else {
            return Err(err(
                Code::BadData,
                format!("{} is empty", path.display()),
                "a CSV file starts with a header line of column names",
            ));
        };
        let names: Vec<String> = first.split(delim).map(|s| s.trim().to_string()).collect();
        match &header {
            Some(h) if *h != names => {
                return Err(err(
                    Code::BadData,
                    format!(
                        "{}: its columns differ from the first file's",
                        path.display()
                    ),
                    "convert files with the same header together",
                ))
            }
            _ => header = Some(names.clone()),
        }
        for (i, line) in lines {
            // Blank: nothing but white space (a tab is a field separator in a TSV).
            if line.chars().all(|c| c.is_whitespace() && c != delim) {
                continue;
            }
            let fields: Vec<String> = line.split(delim).map(|s| s.trim().to_string()).collect();
            if fields.len() != names.len() {
                return Err(err(
                    Code::BadData,
                    format!(
                        "{}:{i}: {} fields, but the header names {}",
                        path.display(),
                        fields.len(),
                        names.len()
                    ),
                    "every row needs one field per column",
                ));
            }
            cells.push(fields);
        }
    }
    let header = header.unwrap_or_default();
    // Features: groups of columns, then every column not in a group.
    let col = |n: &str| {
        header.iter().position(|h| h == n).ok_or_else(|| {
            err(
                Code::BadData,
                format!("no column `{n}`"),
                "name columns as the header does",
            )
        })
    };
    let mut feats: Vec<(String, std::ops::Range<usize>)> = Vec::new();
    let mut used = vec![false; header.len()];
    for (name, a, b) in &o.groups {
        let (a, b) = (col(a)?, col(b)?);
        if b < a {
            return Err(err(
                Code::BadData,
                format!("group `{name}`: its last column comes before its first"),
                "write --group NAME=FIRST:LAST in header order",
            ));
        }
        used[a..=b].iter_mut().for_each(|u| *u = true);
        feats.push((name.clone(), a..b + 1));
    }
    for (i, h) in header.iter().enumerate() {
        if !used[i] {
            feats.push((h.clone(), i..i + 1));
        }
    }
    let mut names = Vec::new();
    for (name, r) in &feats {
        let vals = || cells.iter().flat_map(|row| row[r.clone()].iter());
        let inferred = if vals().all(|v| v.parse::<i64>().is_ok()) {
            Kind::Int
        } else if vals().all(|v| v.parse::<f64>().is_ok()) {
            Kind::Float
        } else {
            Kind::Bytes
        };
        let kind = o
            .kinds
            .iter()
            .find(|k| &k.0 == name)
            .map_or(inferred, |k| k.1);
        if kind == Kind::Bytes && r.len() > 1 {
            return Err(err(
                Code::BadData,
                format!("group `{name}` holds text"),
                "only numeric columns can be grouped",
            ));
        }
        names.push((name.clone(), kind, r.len()));
    }
    let mut rows = Vec::with_capacity(cells.len());
    for (i, row) in cells.iter().enumerate() {
        let mut rec = Vec::with_capacity(feats.len());
        for ((name, r), (_, kind, _)) in feats.iter().zip(&names) {
            let fs = &row[r.clone()];
            let bad = |f: &str| {
                err(
                    Code::BadData,
                    format!(
                        "row {}: column group `{name}`: `{f}` is not a {}",
                        i + 1,
                        kind.name()
                    ),
                    "use --type to read the feature as another kind",
                )
            };
            rec.push(match kind {
                Kind::Int => Val::I(
                    fs.iter()
                        .map(|f| f.parse::<i64>().map_err(|_| bad(f)))
                        .collect::<Result<_, _>>()?,
                ),
                Kind::Float => Val::F(
                    fs.iter()
                        .map(|f| match f.parse::<f32>() {
                            Ok(x) if x.is_infinite() && !super::csv::names_infinity(f) => {
                                Err(err(
                                    Code::BadData,
                                    format!(
                                        "row {}: column group `{name}`: {f} is out of range for a float (±{:e})",
                                        i + 1,
                                        f32::MAX
                                    ),
                                    "scale the column, or store it as text with --type",
                                ))
                            }
                            Ok(x) => Ok(x),
                            Err(_) => Err(bad(f)),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                Kind::Bytes => Val::B(fs[0].as_bytes().to_vec()),
            });
        }
        rows.push(rec);
    }
    Ok(Table { names, rows })
}

/// The lines of a CSV or TSV file, with their numbers (from 1), without their `\n` or
/// `\r\n`. A UTF-8 byte order mark at the start (Excel writes one) is not part of the
/// first line; a line that is not UTF-8 is an error naming the file, the line and the
/// offset of the bad byte in the file.
fn text_lines<'a>(path: &Path, bytes: &'a [u8]) -> Result<Vec<(usize, &'a str)>, ConvertError> {
    const BOM: &[u8] = b"\xef\xbb\xbf";
    let start = if bytes.starts_with(BOM) { BOM.len() } else { 0 };
    let mut lines = Vec::new();
    let mut at = start;
    for (i, line) in bytes[start..].split(|&b| b == b'\n').enumerate() {
        let end = at + line.len();
        if end == bytes.len() && line.is_empty() {
            break; // after the last line break
        }
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let text = std::str::from_utf8(line).map_err(|e| {
            err(
                Code::BadData,
                format!(
                    "{}:{}: not UTF-8 text (the byte at offset {})",
                    path.display(),
                    i + 1,
                    at + e.valid_up_to()
                ),
                "save the file as UTF-8 (in Excel: CSV UTF-8)",
            )
        })?;
        lines.push((i + 1, text));
        at = end + 1;
    }
    Ok(lines)
}

fn png_table(o: &ConvertOptions) -> Result<Table, ConvertError> {
    let mut files = Vec::new();
    for p in &o.inputs {
        files.extend(
            sources::png_files(p)
                .map_err(|m| err(Code::RunIo, m, "give a folder of .png files or a glob"))?,
        );
    }
    let labels = match &o.labels {
        Some(csv) => crate::elab::data::PngLabels::Csv(csv.to_string_lossy().into_owned()),
        None => crate::elab::data::PngLabels::Folder,
    };
    let (ids, _) = sources::png_labels(&files, &labels, Path::new(""))
        .map_err(|m| err(Code::BadData, m, "every image needs a label"))?;
    let mut rows = Vec::with_capacity(files.len());
    for (f, label) in files.iter().zip(ids) {
        let bytes = std::fs::read(f).map_err(|e| io(f, &e))?;
        let img = super::image::decode_png(&bytes, None).map_err(|m| {
            err(
                Code::BadData,
                format!("{}: not a readable PNG ({m})", f.display()),
                "remove or replace the file",
            )
        })?;
        let raw: Vec<u8> = if img.sixteen {
            img.samples.iter().flat_map(|s| s.to_le_bytes()).collect()
        } else {
            img.samples.iter().map(|&s| s as u8).collect()
        };
        rows.push(vec![
            Val::B(raw),
            Val::I(vec![img.height as i64]),
            Val::I(vec![img.width as i64]),
            Val::I(vec![img.channels as i64]),
            Val::I(vec![label]),
        ]);
    }
    let names = ["image_raw", "height", "width", "channels", "label"]
        .iter()
        .map(|n| {
            let k = if *n == "image_raw" {
                Kind::Bytes
            } else {
                Kind::Int
            };
            (n.to_string(), k, 1)
        })
        .collect();
    Ok(Table { names, rows })
}

fn npy_table(o: &ConvertOptions) -> Result<Table, ConvertError> {
    let mut cols: Vec<(String, Kind, usize, Vec<Val>)> = Vec::new();
    let mut inputs: Vec<(PathBuf, String)> = o
        .inputs
        .iter()
        .map(|p| {
            let stem = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "x".into());
            (p.clone(), stem)
        })
        .collect();
    if let Some(l) = &o.labels {
        inputs.push((l.clone(), "label".into()));
    }
    for (path, name) in inputs {
        let b = std::fs::read(&path).map_err(|e| io(&path, &e))?;
        let bad = |m: String| {
            err(
                Code::BadData,
                format!("{}: {m}", path.display()),
                "write the array with numpy.save",
            )
        };
        let (dtype, shape, _) = records::npy_header(&b).map_err(bad)?;
        if shape.is_empty() {
            return Err(bad("a scalar array has no rows".into()));
        }
        let dims = shape[1..].to_vec();
        let rows = records::npy_rows(&b, &path, dtype, &dims)
            .map_err(|m| err(Code::BadData, m, "write the array with numpy.save"))?;
        let per: usize = dims.iter().product();
        let kind = match dtype {
            DType::U8 => Kind::Bytes,
            d if d.is_float() => Kind::Float,
            _ => Kind::Int,
        };
        let vals = rows
            .into_iter()
            .map(|t| match (&t.data, kind) {
                (Data::I(a), Kind::Bytes) => Val::B(a.iter().map(|&x| x as u8).collect()),
                (Data::F(a), _) => Val::F(a.iter().copied().collect()),
                (Data::I(a), _) => Val::I(a.iter().copied().collect()),
                (Data::B(a), _) => Val::I(a.iter().map(|&x| i64::from(x)).collect()),
                (Data::S(_), _) => Val::B(Vec::new()),
            })
            .collect();
        if let Some(first) = cols.first() {
            if first.3.len() != shape[0] {
                return Err(bad(format!(
                    "{} rows, but {} has {}",
                    shape[0],
                    first.0,
                    first.3.len()
                )));
            }
        }
        cols.push((name, kind, if kind == Kind::Bytes { 1 } else { per }, vals));
    }
    let n = cols[0].3.len();
    let names = cols.iter().map(|c| (c.0.clone(), c.1, c.2)).collect();
    let mut iters: Vec<_> = cols.into_iter().map(|c| c.3.into_iter()).collect();
    let rows = (0..n)
        .map(|_| {
            iters
                .iter_mut()
                .map(|it| it.next().expect("same length"))
                .collect()
        })
        .collect();
    Ok(Table { names, rows })
}

/// Removes the shards an earlier conversion to the same prefix wrote with another shard
/// count, so that a `PREFIX-*` glob reads only the new ones. Only names of the shard
/// pattern (`PREFIX.tfrecord`, `PREFIX-NNNNN-of-MMMMM.tfrecord`) are touched.
fn remove_other_shards(prefix: &Path, keep: &[PathBuf]) {
    let dir = match prefix.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let Some(stem) = prefix.file_name().map(|s| s.to_string_lossy().into_owned()) else {
        return;
    };
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&stem) else {
            continue;
        };
        let is_shard = rest == ".tfrecord"
            || rest
                .strip_prefix('-')
                .and_then(|r| r.strip_suffix(".tfrecord"))
                .and_then(|r| r.split_once("-of-"))
                .is_some_and(|(a, b)| {
                    a.len() == 5
                        && b.len() == 5
                        && a.bytes().all(|c| c.is_ascii_digit())
                        && b.bytes().all(|c| c.is_ascii_digit())
                });
        let path = dir.join(&name);
        if is_shard && !keep.iter().any(|k| k.file_name() == path.file_name()) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// The file of shard `i` of `n`.
pub fn shard_path(prefix: &Path, i: usize, n: usize) -> PathBuf {
    let p = prefix.to_string_lossy();
    if n == 1 {
        PathBuf::from(format!("{p}.tfrecord"))
    } else {
        PathBuf::from(format!("{p}-{i:05}-of-{n:05}.tfrecord"))
    }
}

fn write_shards(
    o: &ConvertOptions,
    t: &Table,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ConvertReport, ConvertError> {
    let n = t.rows.len();
    let shards = o.shards.clamp(1, n);
    let total = n as u64;
    let mut files = Vec::new();
    let mut bytes = 0u64;
    let mut done = 0u64;
    if let Some(dir) = o.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, &e))?;
    }
    for s in 0..shards {
        let path = shard_path(&o.output, s, shards);
        let write_err = |e: std::io::Error| {
            err(
                Code::RunIo,
                format!("cannot write {}: {e}", path.display()),
                "check that the output directory is writable",
            )
        };
        crate::atomic::write_output(&path, |w| {
            for row in &t.rows[s * n / shards..(s + 1) * n / shards] {
                let feats: Vec<(&str, Feature<'_>)> = t
                    .names
                    .iter()
                    .zip(row)
                    .map(|((name, _, _), v)| {
                        let f = match v {
                            Val::F(x) => Feature::Floats(x),
                            Val::I(x) => Feature::Ints(x),
                            Val::B(x) => Feature::Bytes(x),
                        };
                        (name.as_str(), f)
                    })
                    .collect();
                let rec = records::frame(&encode_example(&feats));
                bytes += rec.len() as u64;
                w.write_all(&rec)?;
                done += 1;
                if done.is_multiple_of(1000) || done == total {
                    progress(done, total);
                }
            }
            Ok(())
        })
        .map_err(write_err)?;
        files.push(path);
    }
    remove_other_shards(&o.output, &files);
    Ok(ConvertReport {
        records: total,
        files,
        bytes,
        features: t.names.clone(),
    })
}
