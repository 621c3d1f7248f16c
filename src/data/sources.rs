//! The sources of an input pipeline: where elements come from. TFRecord files are read
//! as a stream, frame by frame; CSV/TSV, text and `.npy` files are read whole; PNG
//! images are decoded one at a time; `range` and `synthetic` make their elements.
//!
//! `check_sources` runs before anything else: a missing or empty file is an error
//! before the first step, not in the middle of training.

use super::image::{convert_channels, decode_png, Luma};
use super::pipeline::{io_diag, Element, Next, Origin, Stream};
use super::records::{self, FrameError, RecordReader};
use crate::diag::{Code, Diag};
use crate::elab::data::{Dataset, PngLabels, Stage, StageKind};
use crate::ir::{DType, TensorType};
use crate::rng::Stream as Rng;
use crate::span::Span;
use crate::tensor::{Arr, Data, Tensor};
use ndarray::IxDyn;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Joins a program path onto the directory relative paths start from.
pub fn resolve(base: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

/// The files a source stage reads, in order (a glob expanded; PNG images listed).
pub fn files(stage: &Stage, base: &Path) -> Result<Vec<PathBuf>, Diag> {
    let one = |p: &str| Ok(vec![resolve(base, p)]);
    match &stage.kind {
        StageKind::TfRecord { paths, .. } | StageKind::FixedLength { paths, .. } => {
            let mut out = Vec::new();
            for p in paths {
                let mut f = records::glob(&resolve(base, p)).map_err(|m| {
                    Diag::new(Code::RunIo, stage.span, m)
                        .label("this source")
                        .help("paths in a program are relative to the directory of its .est file")
                })?;
                out.append(&mut f);
            }
            Ok(out)
        }
        StageKind::Csv { path, .. } | StageKind::Text { path } | StageKind::Npy { path, .. } => {
            one(path)
        }
        StageKind::Png { pattern, .. } => png_files(&resolve(base, pattern))
            .map_err(|m| Diag::new(Code::RunIo, stage.span, m).label("this source")),
        _ => Ok(Vec::new()),
    }
}

/// Checks that every file the dataset's sources read exists and is not empty.
pub fn check_sources(ds: &Dataset, base: &Path) -> Result<(), Diag> {
    for stage in &ds.stages {
        if let StageKind::Zip { other } = &stage.kind {
            check_sources(other, base)?;
        }
        for f in files(stage, base)? {
            let meta = std::fs::metadata(&f).map_err(|e| io_diag(stage.span, &f, &e))?;
            if meta.len() == 0 {
                return Err(Diag::new(
                    Code::BadData,
                    stage.span,
                    format!("{} is empty", f.display()),
                )
                .label("this source")
                .help("an input file must hold at least one record"));
            }
        }
    }
    Ok(())
}

/// How much of each end of a file `fingerprint` reads.
const FINGERPRINT_ENDS: u64 = 64 << 10;
/// How many files of a source `fingerprint` reads the ends of; of the others (a folder
/// of a million images) only paths and sizes count.
const FINGERPRINT_READS: usize = 256;

/// A fingerprint of the files `ds`'s sources read: each one's path as the program
/// names it (relative to `base`) and its size, and for the first `FINGERPRINT_READS`
/// files of each source a CRC32C of their first and last 64 KiB, so that ranks of a run
/// on other machines compare their copies of the data without reading more than a few
/// MiB. Files that cannot be read count as what they are (`check_sources` says why,
/// later).
pub fn fingerprint(ds: &Dataset, base: &Path) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    let mut h = crate::hash::FNV_OFFSET;
    let mut add = |b: &[u8]| h = crate::hash::fnv1a(h, b);
    let mut stack = vec![ds];
    while let Some(ds) = stack.pop() {
        for stage in &ds.stages {
            if let StageKind::Zip { other } = &stage.kind {
                stack.push(other);
            }
            for (i, f) in files(stage, base)
                .unwrap_or_default()
                .into_iter()
                .enumerate()
            {
                let shown = f.strip_prefix(base).unwrap_or(&f);
                add(shown.to_string_lossy().as_bytes());
                // (a FIFO in place of a file is not opened for reading: it would wait)
                let Ok(Some(mut file)) = crate::atomic::open_regular(&f) else {
                    add(b"unreadable");
                    continue;
                };
                let size = file.metadata().map_or(0, |m| m.len());
                add(&size.to_le_bytes());
                if i >= FINGERPRINT_READS {
                    continue;
                }
                let mut ends = Vec::new();
                let _ = (&mut file).take(FINGERPRINT_ENDS).read_to_end(&mut ends);
                if size > FINGERPRINT_ENDS
                    && file
                        .seek(SeekFrom::Start(
                            size.saturating_sub(FINGERPRINT_ENDS).max(FINGERPRINT_ENDS),
                        ))
                        .is_ok()
                {
                    let _ = file.take(FINGERPRINT_ENDS).read_to_end(&mut ends);
                }
                add(&crc32c::crc32c(&ends).to_le_bytes());
            }
        }
    }
    h
}

/// Elements held in memory, handed out in order.
pub struct VecSource {
    rows: std::vec::IntoIter<Element>,
}

impl VecSource {
    pub fn new(rows: Vec<Element>) -> VecSource {
        VecSource {
            rows: rows.into_iter(),
        }
    }
}

impl Stream for VecSource {
    fn next(&mut self) -> Next {
        Ok(self.rows.next())
    }

    fn skip(&mut self, n: u64) -> Result<u64, Diag> {
        let k = n.min(self.rows.len() as u64);
        if k > 0 {
            self.rows.nth(k as usize - 1);
        }
        Ok(k)
    }
}

/// The integers 0 to n - 1.
pub struct RangeSource {
    at: i64,
    n: i64,
}

impl RangeSource {
    pub fn new(n: i64) -> RangeSource {
        RangeSource { at: 0, n }
    }
}

impl Stream for RangeSource {
    fn next(&mut self) -> Next {
        if self.at >= self.n {
            return Ok(None);
        }
        self.at += 1;
        Ok(Some(vec![Tensor::int(
            DType::I32,
            Arr::from_elem(IxDyn(&[]), self.at - 1),
        )]))
    }

    fn skip(&mut self, n: u64) -> Result<u64, Diag> {
        let k = n.min(self.n.saturating_sub(self.at).max(0) as u64);
        self.at += k as i64;
        Ok(k)
    }
}

pub fn bytes_scalar(b: Vec<u8>) -> Tensor {
    Tensor {
        dtype: DType::Bytes,
        data: Data::S(Arr::from_elem(IxDyn(&[]), b)),
    }
}

/// Records of TFRecord files, one file after another, read as a stream. With
/// `skip_corrupt`, a record whose data CRC fails is skipped, and a file whose framing
/// breaks (a bad length CRC or a truncated tail) is read up to the break; each is
/// counted in `skipped`.
pub struct TfRecordSource {
    files: Vec<PathBuf>,
    next_file: usize,
    cur: Option<(Arc<Path>, RecordReader<BufReader<File>>)>,
    skip_corrupt: bool,
    skipped: Arc<AtomicU64>,
    span: Span,
    last: Option<Origin>,
    failed: bool,
}

impl TfRecordSource {
    pub fn new(
        files: Vec<PathBuf>,
        skip_corrupt: bool,
        skipped: Arc<AtomicU64>,
        span: Span,
    ) -> TfRecordSource {
        TfRecordSource {
            files,
            next_file: 0,
            cur: None,
            skip_corrupt,
            skipped,
            span,
            last: None,
            failed: false,
        }
    }

    fn frame_diag(span: Span, file: &Path, e: &FrameError) -> Diag {
        Diag::new(Code::BadData, span, format!("{}: {e}", file.display()))
            .label("this source")
            .help("the file is damaged; `tfrecord(..., skip_corrupt: true)` skips damaged records and counts them")
    }
}

impl Stream for TfRecordSource {
    fn next(&mut self) -> Next {
        loop {
            if self.failed {
                return Ok(None);
            }
            let Some((path, reader)) = &mut self.cur else {
                let Some(f) = self.files.get(self.next_file).cloned() else {
                    return Ok(None);
                };
                self.next_file += 1;
                let opened = File::open(&f).and_then(|h| Ok((h.metadata()?.len(), h)));
                match opened {
                    Ok((len, h)) => {
                        let r = RecordReader::new(BufReader::with_capacity(1 << 16, h), len);
                        self.cur = Some((Arc::from(f.as_path()), r));
                    }
                    Err(e) => {
                        self.failed = true;
                        return Err(io_diag(self.span, &f, &e));
                    }
                }
                continue;
            };
            let (offset, index) = (reader.offset, reader.index);
            let mut data = Vec::new();
            match reader.next_into(&mut data) {
                Ok(true) => {
                    self.last = Some(Origin {
                        file: path.clone(),
                        index,
                        offset,
                    });
                    return Ok(Some(vec![bytes_scalar(data)]));
                }
                Ok(false) => self.cur = None,
                Err(e) if self.skip_corrupt => {
                    self.skipped.fetch_add(1, Ordering::Relaxed);
                    if !e.resumable() {
                        self.cur = None;
                    }
                }
                Err(e) => {
                    let d = Self::frame_diag(self.span, path, &e);
                    self.failed = true;
                    return Err(d);
                }
            }
        }
    }

    fn origin(&self) -> Option<Origin> {
        self.last.clone()
    }
}

/// Random elements from the run seed: floats uniform in [0, 1), integers uniform in
/// [0, classes), booleans fair coins, bytes empty. Element `i` is the same in every
/// run with the same seed.
pub struct SyntheticSource {
    leaves: Vec<(DType, Vec<usize>)>,
    count: Option<usize>,
    classes: i64,
    rng: Rng,
    at: u64,
}

impl SyntheticSource {
    pub fn new(
        leaves: Vec<(DType, Vec<usize>)>,
        count: Option<usize>,
        classes: i64,
        seed: u64,
        stage: usize,
    ) -> SyntheticSource {
        SyntheticSource {
            leaves,
            count,
            classes,
            rng: Rng::new(seed, 0x5359_4e54 ^ stage as u64),
            at: 0,
        }
    }
}

impl Stream for SyntheticSource {
    fn skip(&mut self, n: u64) -> Result<u64, Diag> {
        let k = match self.count {
            Some(c) => n.min((c as u64).saturating_sub(self.at)),
            None => n,
        };
        self.at += k;
        Ok(k)
    }

    fn next(&mut self) -> Next {
        if self.count.is_some_and(|c| self.at >= c as u64) {
            return Ok(None);
        }
        let i = self.at;
        self.at += 1;
        let mut out = Vec::with_capacity(self.leaves.len());
        for (l, (dtype, dims)) in self.leaves.iter().enumerate() {
            let ty = TensorType::new(*dtype, dims.clone());
            let n = ty.elements();
            // Each leaf draws from its own part of the counter space.
            let u = self
                .rng
                .uniforms(0, n, i.wrapping_mul(64).wrapping_add(l as u64));
            let t = match dtype {
                d if d.is_float() => Tensor::from_f64(&ty, u.iter().map(|&x| x as f64).collect()),
                DType::Bool => Tensor::bool(
                    Arr::from_shape_vec(IxDyn(dims), u.iter().map(|&x| x < 0.5).collect())
                        .expect("shape"),
                ),
                DType::Bytes => bytes_scalar(Vec::new()),
                _ => {
                    let k = if *dtype == DType::U8 {
                        256
                    } else {
                        self.classes.max(1)
                    };
                    Tensor::from_f64(
                        &ty,
                        u.iter()
                            .map(|&x| ((x as f64 * k as f64) as i64).min(k - 1) as f64)
                            .collect(),
                    )
                }
            };
            out.push(t);
        }
        Ok(Some(out))
    }
}

/// The PNG files a pattern names: every `.png` under a folder (recursively, in sorted
/// order, following links), or the matches of a `*` pattern. Each directory is read
/// once, at the first path that reaches it in that order (so a link back up the tree is
/// no loop, and a linked folder is not read twice), and each file is listed once,
/// however many links lead to it.
pub fn png_files(p: &Path) -> Result<Vec<PathBuf>, String> {
    if !p.is_dir() {
        return records::glob(p);
    }
    use std::os::unix::fs::MetadataExt;
    let mut out = Vec::new();
    let mut dirs = rustc_hash::FxHashSet::default();
    let mut files = rustc_hash::FxHashSet::default();
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        let meta =
            std::fs::metadata(&d).map_err(|e| format!("cannot read {}: {e}", d.display()))?;
        if !dirs.insert((meta.dev(), meta.ino())) {
            continue;
        }
        let mut entries = Vec::new();
        for e in std::fs::read_dir(&d).map_err(|e| format!("cannot list {}: {e}", d.display()))? {
            entries.push(
                e.map_err(|e| format!("cannot list {}: {e}", d.display()))?
                    .path(),
            );
        }
        entries.sort();
        // (pushed in reverse, so that the stack pops them in order)
        for path in entries.into_iter().rev() {
            if path.is_dir() {
                stack.push(path);
            } else if path
                .extension()
                .is_some_and(|x| x.eq_ignore_ascii_case("png"))
            {
                out.push(path);
            }
        }
    }
    // each image once, at the first of its paths in sorted order
    out.sort();
    out.retain(|p| files.insert(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone())));
    if out.is_empty() {
        return Err(format!("no .png file under {}", p.display()));
    }
    Ok(out)
}

/// Labels for PNG images: by the name of their folder (its index among the sorted
/// folder names), or from a `file,label` CSV (matched by file name).
pub fn png_labels(
    files: &[PathBuf],
    labels: &PngLabels,
    base: &Path,
) -> Result<(Vec<i64>, Vec<String>), String> {
    match labels {
        PngLabels::Folder => {
            let folder = |f: &PathBuf| {
                f.parent()
                    .and_then(|p| p.file_name())
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            };
            let mut names: Vec<String> = files.iter().map(folder).collect();
            names.sort();
            names.dedup();
            let ids = files
                .iter()
                .map(|f| names.binary_search(&folder(f)).expect("listed") as i64)
                .collect();
            Ok((ids, names))
        }
        PngLabels::Csv(csv) => {
            let path = resolve(base, csv);
            let text = crate::program::read_text(&path, u64::MAX).map_err(|e| {
                format!(
                    "cannot read {}: {}",
                    path.display(),
                    e.describe("labels file")
                )
            })?;
            let mut map = rustc_hash::FxHashMap::default();
            // A UTF-8 byte order mark (Excel writes one) is not part of the first name.
            let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
            for (i, line) in text.lines().enumerate() {
                let line = line.trim_end_matches('\r');
                let Some((file, label)) = line.split_once(',') else {
                    continue;
                };
                let Ok(label) = label.trim().parse::<i64>() else {
                    if i == 0 {
                        continue; // a header
                    }
                    return Err(format!(
                        "{}:{}: `{}` is not an integer label",
                        path.display(),
                        i + 1,
                        label.trim()
                    ));
                };
                let name = Path::new(file.trim())
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                map.insert(name, label);
            }
            let ids = files
                .iter()
                .map(|f| {
                    let n = f
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    map.get(&n).copied().ok_or_else(|| {
                        format!("{} has no label in {}", f.display(), path.display())
                    })
                })
                .collect::<Result<_, _>>()?;
            Ok((ids, Vec::new()))
        }
    }
}

/// PNG images with their labels, decoded one per pull.
pub struct PngSource {
    files: Vec<PathBuf>,
    labels: Vec<i64>,
    at: usize,
    height: usize,
    width: usize,
    channels: usize,
    dtype: DType,
    span: Span,
}

impl PngSource {
    pub fn new(stage: &Stage, base: &Path, files: Vec<PathBuf>) -> Result<PngSource, Diag> {
        let StageKind::Png {
            channels,
            height,
            width,
            dtype,
            labels,
            ..
        } = &stage.kind
        else {
            unreachable!("a png stage")
        };
        let (ids, _) = png_labels(&files, labels, base)
            .map_err(|m| Diag::new(Code::BadData, stage.span, m).label("this source"))?;
        Ok(PngSource {
            files,
            labels: ids,
            at: 0,
            height: *height,
            width: *width,
            channels: *channels,
            dtype: *dtype,
            span: stage.span,
        })
    }
}

impl Stream for PngSource {
    fn next(&mut self) -> Next {
        let Some(f) = self.files.get(self.at) else {
            return Ok(None);
        };
        let label = self.labels[self.at];
        self.at += 1;
        let bytes = std::fs::read(f).map_err(|e| io_diag(self.span, f, &e))?;
        let bad = |m: String| {
            Diag::new(Code::BadData, self.span, format!("{}: {m}", f.display()))
                .label("this source")
        };
        let img = decode_png(&bytes, Some((self.height, self.width))).map_err(|m| {
            if m.starts_with("the image is") {
                bad(m).help("resize the images, or give `png` their height and width")
            } else {
                bad(format!("not a readable PNG ({m})"))
            }
        })?;
        let mut v = convert_channels(&img, self.channels, Luma::Rounded);
        if self.dtype == DType::U8 && img.sixteen {
            for x in &mut v {
                *x = (*x / 257.0).round();
            }
        }
        let ty = TensorType::new(self.dtype, vec![self.height, self.width, self.channels]);
        let image = Tensor::from_f64(&ty, v);
        let label = Tensor::int(DType::I32, Arr::from_elem(IxDyn(&[]), label));
        Ok(Some(vec![image, label]))
    }
}
