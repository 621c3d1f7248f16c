//! Rendering diagnostics: as miette reports for people (with or without colour, at a
//! fixed width for snapshot tests) and as JSON objects for tools.

use super::{Diag, Label, Severity};
use crate::span::{SourceMap, Span};
use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, SourceSpan};
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

fn source_span(span: Span) -> SourceSpan {
    SourceSpan::new((span.lo as usize).into(), span.len())
}

/// A diagnostic prepared for miette: the labels in the primary file go on the report,
/// labels in other files become related reports with their own source.
struct Report {
    code: &'static str,
    severity: Severity,
    message: String,
    help: Option<String>,
    source: NamedSource<String>,
    labels: Vec<LabeledSpan>,
    related: Vec<Report>,
    /// A related location in another file: drawn as advice, with its label as message.
    advice: bool,
}

impl Report {
    fn new(diag: &Diag, sources: &SourceMap) -> Report {
        let file = diag.primary.span.file;
        let mut report = Report::at(
            &diag.primary,
            sources,
            diag.code.id(),
            diag.severity(),
            diag.message.clone(),
        );
        report.help = diag.help.clone();
        for l in &diag.secondary {
            if l.span.file == file {
                report.labels.push(LabeledSpan::new_with_span(
                    Some(l.text.clone()),
                    source_span(l.span),
                ));
            } else {
                let note = if l.text.is_empty() {
                    "related".to_string()
                } else {
                    l.text.clone()
                };
                let mut r = Report::at(l, sources, "", Severity::Warning, note);
                r.advice = true;
                report.related.push(r);
            }
        }
        report
    }

    fn at(
        label: &Label,
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
        Report {
            code,
            severity,
            message,
            help: None,
            source: NamedSource::new(f.name.clone(), f.text.to_string()),
            labels: vec![LabeledSpan::new_primary_with_span(
                text,
                source_span(label.span),
            )],
            related: Vec::new(),
            advice: false,
        }
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
