//! Rendering diagnostics: as miette reports for people (with or without colour, at a
//! fixed width for snapshot tests) and as JSON objects for tools.

use super::{Diag, Label, Severity};
use crate::span::{SourceMap, Span};
use miette::{
    GraphicalReportHandler, GraphicalTheme, LabeledSpan, MietteError, MietteSpanContents,
    SourceCode, SourceSpan, SpanContents,
};
use std::fmt;

/// How to draw a report.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
    pub width: usize,
}

impl Style {
    /// The style of snapshot tests: no colour, 100 columns.
    pub fn plain() -> Style {
        Style {
            color: false,
            width: 100,
        }
    }
}

/// Renders one diagnostic as a miette report.
pub fn render(diag: &Diag, sources: &SourceMap, style: Style) -> String {
    let theme = if style.color {
        GraphicalTheme::unicode()
    } else {
        GraphicalTheme::unicode_nocolor()
    };
    let handler = GraphicalReportHandler::new_themed(theme).with_width(style.width);
    let report = Report::new(diag, sources);
    let mut out = String::new();
    if handler.render_report(&mut out, &report).is_err() {
        out = format!(
            "{}[{}]: {}\n",
            diag.severity().name(),
            diag.code.id(),
            diag.message
        );
    }
    out
}

/// Renders a list of diagnostics followed by a summary line, as `estc check` prints them.
pub fn render_all(diags: &[Diag], sources: &SourceMap, style: Style) -> String {
    let mut out = String::new();
    for d in diags {
        out.push_str(&render(d, sources, style));
        out.push('\n');
    }
    out
}

/// One diagnostic as a JSON object (see docs/cli.md for the fields).
pub fn to_json(diag: &Diag, sources: &SourceMap) -> serde_json::Value {
    let mut obj = location_json(&diag.primary, sources);
    obj.insert("code".into(), diag.code.id().into());
    obj.insert("severity".into(), diag.severity().name().into());
    obj.insert("message".into(), diag.message.clone().into());
    obj.insert(
        "help".into(),
        diag.help
            .clone()
            .map_or(serde_json::Value::Null, Into::into),
    );
    let related: Vec<serde_json::Value> = diag
        .secondary
        .iter()
        .map(|l| serde_json::Value::Object(location_json(l, sources)))
        .collect();
    obj.insert("related".into(), related.into());
    let fixes: Vec<serde_json::Value> = diag
        .fixes
        .iter()
        .map(|f| {
            let edits: Vec<serde_json::Value> = f
                .edits
                .iter()
                .map(|e| {
                    let mut m = location_json(
                        &Label {
                            span: e.span,
                            text: String::new(),
                        },
                        sources,
                    );
                    m.remove("label");
                    m.insert("text".into(), e.text.clone().into());
                    serde_json::Value::Object(m)
                })
                .collect();
            serde_json::json!({"title": f.title, "edits": edits})
        })
        .collect();
    obj.insert("fixes".into(), fixes.into());
    serde_json::Value::Object(obj)
}

fn location_json(label: &Label, sources: &SourceMap) -> serde_json::Map<String, serde_json::Value> {
    let file = sources.get(label.span.file);
    let (line, column) = file.line_col(label.span.lo as usize);
    let (end_line, end_column) = file.line_col(label.span.hi as usize);
    let mut m = serde_json::Map::new();
    m.insert("file".into(), file.name.clone().into());
    m.insert("line".into(), line.into());
    m.insert("column".into(), column.into());
    m.insert("end_line".into(), end_line.into());
    m.insert("end_column".into(), end_column.into());
    m.insert("label".into(), label.text.clone().into());
    m
}

/// A diagnostic prepared for miette: the labels in the primary file go on the report,
/// labels in other files become related reports with their own source.
struct Report {
    code: &'static str,
    severity: Severity,
    message: String,
    help: Option<String>,
    source: Excerpt,
    labels: Vec<LabeledSpan>,
    related: Vec<Report>,
    /// A related location in another file: drawn as advice, with its label as message.
    advice: bool,
}

impl Report {
    fn new(diag: &Diag, sources: &SourceMap) -> Report {
        let file = diag.primary.span.file;
        let (here, elsewhere): (Vec<&Label>, Vec<&Label>) =
            diag.secondary.iter().partition(|l| l.span.file == file);
        // a primary label around labels of its own parts (a call around its arguments)
        // is drawn on the first of its text that they leave: miette draws nested labels
        // at the end of the outer one
        let drawn = Label {
            span: uncovered(
                diag.primary.span,
                &here.iter().map(|l| l.span).collect::<Vec<_>>(),
                &sources.get(file).text,
            ),
            text: diag.primary.text.clone(),
        };
        let mut report = Report::at(
            &drawn,
            &here,
            sources,
            diag.code.id(),
            diag.severity(),
            diag.message.clone(),
        );
        report.help = diag.help.clone();
        for l in here {
            report.labels.push(LabeledSpan::new_with_span(
                Some(l.text.clone()),
                report.source.span(l.span),
            ));
        }
        for l in elsewhere {
            let note = if l.text.is_empty() {
                "related".to_string()
            } else {
                l.text.clone()
            };
            let mut r = Report::at(l, &[], sources, "", Severity::Warning, note);
            r.advice = true;
            report.related.push(r);
        }
        report
    }

    /// A report of `label` in its file; `others` are the other labels that will be
    /// drawn in the same file, so that the excerpt keeps their text too.
    fn at(
        label: &Label,
        others: &[&Label],
        sources: &SourceMap,
        code: &'static str,
        severity: Severity,
        message: String,
    ) -> Report {
        let f = sources.get(label.span.file);
        let text = if label.text.is_empty() {
            None
        } else {
            Some(label.text.clone())
        };
        let spans: Vec<Span> = std::iter::once(label.span)
            .chain(others.iter().map(|l| l.span))
            .collect();
        let source = Excerpt::new(&f.name, &f.text, &spans);
        let primary = source.span(label.span);
        Report {
            code,
            severity,
            message,
            help: None,
            source,
            labels: vec![LabeledSpan::new_primary_with_span(text, primary)],
            related: Vec::new(),
            advice: false,
        }
    }
}

/// `outer`, or, when some of `inner` lie within it, the first stretch of its text that
/// none of them covers, without blanks and the punctuation around arguments: the
/// callee of `matmul(x, w)` (`matmul`), the operator of `a + b`.
fn uncovered(outer: Span, inner: &[Span], text: &str) -> Span {
    let within = |s: &&Span| s.lo >= outer.lo && s.hi <= outer.hi && s.len() < outer.len();
    let mut inside: Vec<Span> = inner.iter().filter(within).copied().collect();
    if inside.is_empty() {
        return outer;
    }
    inside.sort_by_key(|s| s.lo);
    let trim = |lo: u32, hi: u32| -> Option<Span> {
        let part = text.get(lo as usize..hi as usize)?;
        let junk = |c: char| c.is_whitespace() || "(),[]{}".contains(c);
        let start = part.len() - part.trim_start_matches(junk).len();
        let kept = part.trim_start_matches(junk).trim_end_matches(junk);
        (!kept.is_empty()).then(|| Span {
            file: outer.file,
            lo: lo + start as u32,
            hi: lo + (start + kept.len()) as u32,
        })
    };
    let mut at = outer.lo;
    for s in &inside {
        if s.lo > at {
            if let Some(found) = trim(at, s.lo) {
                return found;
            }
        }
        at = at.max(s.hi);
    }
    trim(at, outer.hi).unwrap_or(outer)
}

/// Lines longer than this (in bytes) are drawn as windows around the labels on them:
/// miette pads with `{:width$}`, which panics past column 65,535, and nobody reads a
/// line of 70,000 characters anyway.
const LONG_LINE: usize = 400;
/// How much of a long line is kept on either side of a label's start and end.
const MARGIN: usize = 60;
/// What stands for the text left out of a long line.
const ELLIPSIS: &str = "…";

/// The text miette draws for one file: the file's own text, except that long lines
/// keep only windows around the labels' ends (or their start, when no label is on
/// them), with `…` for what is left out. Line numbers stay as they are, and the
/// position in the header is the original one.
struct Excerpt {
    name: String,
    text: String,
    original: std::sync::Arc<str>,
    /// The byte ranges of the original text left out, in order; each became `…`.
    cuts: Vec<std::ops::Range<usize>>,
}

impl Excerpt {
    fn new(name: &str, original: &std::sync::Arc<str>, spans: &[Span]) -> Excerpt {
        let mut points: Vec<usize> = spans
            .iter()
            .flat_map(|s| [s.lo as usize, s.hi as usize])
            .map(|p| p.min(original.len()))
            .collect();
        points.sort_unstable();
        let mut cuts = Vec::new();
        let mut start = 0;
        for line in original.split_inclusive('\n') {
            let body = line.trim_end_matches(['\n', '\r']);
            if body.len() > LONG_LINE {
                let end = start + body.len();
                let here: Vec<usize> = points
                    .iter()
                    .copied()
                    .filter(|&p| p >= start && p <= end)
                    .collect();
                cuts.extend(line_cuts(original, start, end, &here));
            }
            start += line.len();
        }
        let mut text = String::with_capacity(original.len().min(1 << 20));
        let mut at = 0;
        for c in &cuts {
            text.push_str(&original[at..c.start]);
            text.push_str(ELLIPSIS);
            at = c.end;
        }
        text.push_str(&original[at..]);
        Excerpt {
            name: name.to_string(),
            text,
            original: original.clone(),
            cuts,
        }
    }

    /// Where an offset of the original text is in the excerpt (an offset left out is
    /// at its `…`).
    fn offset(&self, p: usize) -> usize {
        let mut shift = 0isize;
        for c in &self.cuts {
            if p < c.start {
                break;
            }
            if p < c.end {
                return (c.start as isize + shift) as usize;
            }
            shift += ELLIPSIS.len() as isize - c.len() as isize;
        }
        (p as isize + shift) as usize
    }

    /// Where an offset of the excerpt is in the original text.
    fn original_offset(&self, q: usize) -> usize {
        let mut shift = 0isize;
        for c in &self.cuts {
            let marker = (c.start as isize + shift) as usize;
            if q < marker {
                break;
            }
            if q < marker + ELLIPSIS.len() {
                return c.start;
            }
            shift += ELLIPSIS.len() as isize - c.len() as isize;
        }
        (q as isize - shift) as usize
    }

    fn span(&self, s: Span) -> SourceSpan {
        let lo = self.offset(s.lo as usize);
        let hi = self.offset(s.hi as usize).max(lo);
        SourceSpan::new(lo.into(), hi - lo)
    }
}

/// The ranges of one long line (`start..end`, without its line break) to leave out:
/// everything but `MARGIN` bytes around each point, or but the first `2 * MARGIN`
/// bytes when there is no point on it.
fn line_cuts(
    text: &str,
    start: usize,
    end: usize,
    points: &[usize],
) -> Vec<std::ops::Range<usize>> {
    let mut keep: Vec<(usize, usize)> = if points.is_empty() {
        vec![(start, start + 2 * MARGIN)]
    } else {
        points
            .iter()
            .map(|&p| (p.saturating_sub(MARGIN).max(start), (p + MARGIN).min(end)))
            .collect()
    };
    for k in &mut keep {
        k.0 = text.floor_char_boundary(k.0);
        k.1 = text.ceil_char_boundary(k.1);
    }
    let mut merged: Vec<(usize, usize)> = Vec::new();
    for (lo, hi) in keep {
        match merged.last_mut() {
            // a gap no longer than the `…` that would replace it is kept
            Some(last) if lo <= last.1 + ELLIPSIS.len() => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    let mut cuts = Vec::new();
    let mut at = start;
    for (lo, hi) in merged {
        if lo > at {
            cuts.push(at..lo);
        }
        at = at.max(hi);
    }
    if at < end {
        cuts.push(at..end);
    }
    cuts
}

impl SourceCode for Excerpt {
    fn read_span<'a>(
        &'a self,
        span: &SourceSpan,
        context_lines_before: usize,
        context_lines_after: usize,
    ) -> Result<Box<dyn SpanContents<'a> + 'a>, MietteError> {
        let inner = self
            .text
            .read_span(span, context_lines_before, context_lines_after)?;
        // Without context, this is the position of the header: the column in the
        // original line (in bytes, as miette counts).
        let column = if context_lines_before == 0 && !self.cuts.is_empty() {
            let p = self.original_offset(span.offset());
            let line_start = self.original[..p].rfind('\n').map_or(0, |i| i + 1);
            p - line_start
        } else {
            inner.column()
        };
        Ok(Box::new(MietteSpanContents::new_named(
            self.name.clone(),
            inner.data(),
            *inner.span(),
            inner.line(),
            column,
            inner.line_count(),
        )))
    }
}

impl fmt::Debug for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for Report {}

impl miette::Diagnostic for Report {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        if self.code.is_empty() {
            None
        } else {
            Some(Box::new(self.code))
        }
    }

    fn severity(&self) -> Option<miette::Severity> {
        if self.advice {
            return Some(miette::Severity::Advice);
        }
        Some(match self.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
        })
    }

    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }

    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        Some(&self.source)
    }

    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        Some(Box::new(self.labels.iter().cloned()))
    }

    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        if self.related.is_empty() {
            None
        } else {
            Some(Box::new(
                self.related.iter().map(|r| r as &dyn miette::Diagnostic),
            ))
        }
    }
}
