//! CSV and TSV sources: a file's rows read into elements, one tensor per column group,
//! with missing values, defaults, `skip_invalid`, and every number checked against its
//! column's dtype (out of range, f64's range included, is an error naming the file, the
//! line and the field).

use super::pipeline::io_diag;
use super::pipeline::Element;
use super::sources::bytes_scalar;
use crate::diag::{Code, Diag};
use crate::elab::data::CsvValue;
use crate::ir::{DType, TensorType};
use crate::span::Span;
use crate::tensor::Tensor;
use std::path::Path;

/// Reads the CSV file `path` by `how`: its elements and the rows `skip_invalid`
/// skipped, or E0904/E0905 at the source's `span` (a file that is not UTF-8 named by
/// line and byte, as `data convert` names it).
pub(super) fn load(path: &Path, how: &CsvRules, span: Span) -> Result<(Vec<Element>, u64), Diag> {
    let text = match crate::program::read_text(path, u64::MAX) {
        Ok(text) => text,
        Err(crate::program::ReadError::Io(e)) => return Err(io_diag(span, path, &e)),
        Err(crate::program::ReadError::NotUtf8 { line, byte }) => {
            return Err(Diag::new(
                Code::BadData,
                span,
                format!(
                    "{}:{line}: not UTF-8 text (the byte at offset {byte})",
                    path.display()
                ),
            )
            .label("this source")
            .help("save the file as UTF-8 (in Excel: CSV UTF-8)"))
        }
        Err(e) => {
            return Err(Diag::new(Code::BadData, span, e.describe("CSV file")).label("this source"))
        }
    };
    read_csv(path, &text, how)
        .map_err(|msg| Diag::new(Code::BadData, span, msg).label("this source"))
}

/// Why a finite number read from text does not fit `d` (it would wrap, saturate or
/// round to infinity), with the range `d` holds; `None` when it fits. A float fits when
/// it rounds to a finite value (so `3.4028235e38`, f32's largest as printed, does).
fn out_of_range(x: f64, d: DType) -> Option<String> {
    if !x.is_finite() {
        return None;
    }
    let ints = |lo: i64, hi: i64| (x < lo as f64 || x > hi as f64).then(|| format!("[{lo}, {hi}]"));
    match d {
        DType::F32 => (x as f32).is_infinite().then(|| format!("±{:e}", f32::MAX)),
        DType::F16 => half::f16::from_f64(x)
            .is_infinite()
            .then(|| format!("±{}", half::f16::MAX)),
        DType::BF16 => half::bf16::from_f64(x)
            .is_infinite()
            .then(|| format!("±{:e}", f32::from(half::bf16::MAX))),
        DType::I32 => ints(i64::from(i32::MIN), i64::from(i32::MAX)),
        DType::U8 => ints(0, 255),
        DType::Bool => ints(0, 1),
        DType::I64 => ints(i64::MIN, i64::MAX),
        DType::Bytes => None,
    }
}

/// Whether a field that parsed as an infinity says so (`inf`, `-Infinity`), rather than
/// being a finite number too large for f64.
pub fn names_infinity(field: &str) -> bool {
    let t = field.trim().trim_start_matches(['+', '-']);
    t.eq_ignore_ascii_case("inf") || t.eq_ignore_ascii_case("infinity")
}

/// How to read a CSV source's rows.
pub(super) struct CsvRules<'a> {
    pub(super) header: bool,
    pub(super) columns: &'a [(String, DType, usize)],
    pub(super) shapes: &'a [Vec<usize>],
    pub(super) delimiter: u8,
    pub(super) defaults: &'a [Option<CsvValue>],
    pub(super) missing: &'a [String],
    pub(super) skip_invalid: bool,
}

/// Reads a CSV text into elements, one tensor per column group (`n` values of a vector
/// column take `n` fields), and says how many rows `skip_invalid` skipped.
fn read_csv(path: &Path, text: &str, how: &CsvRules) -> Result<(Vec<Element>, u64), String> {
    // A byte order mark (Excel writes one) is not part of the first field.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut rows = Vec::new();
    let mut skipped = 0;
    for (line_no, line) in text.lines().enumerate().skip(usize::from(how.header)) {
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        match csv_row(path, line_no, line, how) {
            Ok(elem) => rows.push(elem),
            Err(_) if how.skip_invalid => skipped += 1,
            Err(e) => return Err(e),
        }
    }
    if rows.is_empty() {
        return Err(if skipped > 0 {
            format!("{} has no valid rows ({skipped} skipped)", path.display())
        } else {
            format!("{} has no rows", path.display())
        });
    }
    Ok((rows, skipped))
}

/// One row of a CSV text: its columns' tensors.
fn csv_row(path: &Path, line_no: usize, line: &str, how: &CsvRules) -> Result<Element, String> {
    let want: usize = how.columns.iter().map(|(_, _, n)| (*n).max(1)).sum();
    let fields: Vec<&str> = line.split(how.delimiter as char).collect();
    if fields.len() != want {
        return Err(format!(
            "{}:{}: {} fields, but the columns need {want}",
            path.display(),
            line_no + 1,
            fields.len()
        ));
    }
    let mut at = 0;
    let mut elem = Vec::with_capacity(how.columns.len());
    for (((name, dtype, n), shape), default) in how.columns.iter().zip(how.shapes).zip(how.defaults)
    {
        let count = (*n).max(1);
        let ty = TensorType::new(*dtype, shape.clone());
        let fs = &fields[at..at + count];
        at += count;
        let missing = |f: &str| how.missing.iter().any(|m| m == f.trim());
        if *dtype == DType::Bytes {
            let text = match default {
                Some(CsvValue::Text(d)) if missing(fs[0]) => d.as_bytes().to_vec(),
                _ => fs[0].as_bytes().to_vec(),
            };
            elem.push(bytes_scalar(text));
            continue;
        }
        let mut v = Vec::with_capacity(count);
        for (k, f) in fs.iter().enumerate() {
            // file:line:column, the column counted in fields from 1 (made only for an
            // error: this runs for every field of every row)
            let at = || format!("{}:{}:{}", path.display(), line_no + 1, at - count + k + 1);
            if missing(f) {
                match default {
                    Some(CsvValue::Number(x)) => {
                        v.push(*x);
                        continue;
                    }
                    _ => {
                        return Err(format!(
                            "{}: column `{name}`: `{}` is a missing value, and the column has no default (give one in `defaults`, or skip such rows with `skip_invalid: true`)",
                            at(),
                            f.trim()
                        ))
                    }
                }
            }
            let x: f64 = f
                .trim()
                .parse()
                .map_err(|_| format!("{}: column `{name}`: `{f}` is not a number", at()))?;
            // (a finite number too large for f64, `1e400` or 310 digits, parses as
            // infinity: out of range for every dtype, as one beyond f32's is)
            let x_or_overflow = if x.is_infinite() && !names_infinity(f) {
                f64::MAX.copysign(x)
            } else {
                x
            };
            if dtype.is_int() && x_or_overflow.fract() != 0.0 {
                return Err(format!(
                    "{}: column `{name}`: `{f}` is not an integer ({dtype})",
                    at()
                ));
            }
            if let Some(range) = out_of_range(x_or_overflow, *dtype) {
                return Err(format!(
                    "{}: column `{name}`: {} is out of range for {dtype} ({range})",
                    at(),
                    f.trim()
                ));
            }
            v.push(x);
        }
        elem.push(Tensor::from_f64(&ty, v));
    }
    Ok(elem)
}
