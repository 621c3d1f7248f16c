//! Diagnostics: every problem a user can cause is a `Diag` with a unique code, a primary
//! span and label, secondary labels, and a help line. Stages push them into a `Diags`
//! sink and go on, so one run reports every independent problem.

mod codes;
mod explain_check;
mod explain_run;
pub mod render;

pub use codes::{Code, CodeInfo};

use crate::span::Span;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// A span with a short text that says what is there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Label {
    pub span: Span,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Diag {
    pub code: Code,
    pub message: String,
    pub primary: Label,
    pub secondary: Vec<Label>,
    pub help: Option<String>,
    /// Mechanical changes that resolve it (an editor's quick fixes).
    pub fixes: Vec<Fix>,
}

/// A change that resolves a diagnostic: what it does, and its edits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fix {
    pub title: String,
    pub edits: Vec<Edit>,
}

/// Replace the text of `span` (empty: insert there) with `text`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Edit {
    pub span: Span,
    pub text: String,
}

impl Diag {
    pub fn new(code: Code, span: Span, message: impl Into<String>) -> Diag {
        Diag {
            code,
            message: message.into(),
            primary: Label {
                span,
                text: String::new(),
            },
            secondary: Vec::new(),
            help: None,
            fixes: Vec::new(),
        }
    }

    pub fn severity(&self) -> Severity {
        self.code.info().severity
    }

    /// The text under the primary span.
    pub fn label(mut self, text: impl Into<String>) -> Diag {
        self.primary.text = text.into();
        self
    }

    /// Another span involved, with what it is.
    pub fn with(mut self, span: Span, text: impl Into<String>) -> Diag {
        self.secondary.push(Label {
            span,
            text: text.into(),
        });
        self
    }

    pub fn help(mut self, text: impl Into<String>) -> Diag {
        self.help = Some(text.into());
        self
    }

    /// A mechanical change that resolves it: replace each span with its text.
    pub fn fix(mut self, title: impl Into<String>, edits: Vec<(Span, String)>) -> Diag {
        self.fixes.push(Fix {
            title: title.into(),
            edits: (edits.into_iter())
                .map(|(span, text)| Edit { span, text })
                .collect(),
        });
        self
    }
}

/// Where stages put what they found. Keeps the first diagnostic of a code at a span (a
/// function inlined many times, or a model elaborated for three modes, must report a
/// problem once; and two stages that notice the same problem report it once).
#[derive(Debug, Default, Clone)]
pub struct Diags {
    list: Vec<Diag>,
    seen: rustc_hash::FxHashSet<(Code, Span)>,
}

impl Diags {
    pub fn push(&mut self, d: Diag) {
        if self.seen.insert((d.code, d.primary.span)) {
            self.list.push(d);
        }
    }

    pub fn extend(&mut self, ds: impl IntoIterator<Item = Diag>) {
        for d in ds {
            self.push(d);
        }
    }

    pub fn has_errors(&self) -> bool {
        self.list.iter().any(|d| d.severity() == Severity::Error)
    }

    pub fn error_count(&self) -> usize {
        self.list
            .iter()
            .filter(|d| d.severity() == Severity::Error)
            .count()
    }

    pub fn warning_count(&self) -> usize {
        self.list.len() - self.error_count()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Diag> {
        self.list.iter()
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The diagnostics in source order (file, then position), for stable output.
    pub fn sorted(&self) -> Vec<Diag> {
        let mut v = self.list.clone();
        v.sort_by(|a, b| {
            (a.primary.span.file, a.primary.span.lo, a.code).cmp(&(
                b.primary.span.file,
                b.primary.span.lo,
                b.code,
            ))
        });
        v
    }
}

/// The name a help that starts "did you mean `x`?" suggests.
pub fn suggested_name(help: &str) -> Option<&str> {
    Some(help.strip_prefix("did you mean `")?.split_once("`?")?.0)
}

/// `text` to quote in a message: whole when short, else its first `max` characters,
/// `…` and its length (a 6 MB override value is not printed whole).
pub fn excerpt(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_string(),
        Some((end, _)) => format!("{}… ({} bytes)", &text[..end], text.len()),
    }
}

/// "did you mean `x`?" for the closest of `candidates`, if any is close enough.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = edit_distance(name, c);
        let limit = (name.chars().count().max(c.chars().count()) / 3).max(1);
        if d <= limit && best.is_none_or(|(bd, bc)| d < bd || (d == bd && c < bc)) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| format!("did you mean `{c}`?"))
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The diagnostics catalogue as Markdown: `docs/diagnostics.md` is exactly this.
pub fn catalogue_markdown() -> String {
    let mut out = String::from(
        "# Diagnostics catalogue\n\n\
         Every problem `estc` reports has a code. `E` codes are errors (the program does not\n\
         compile; `estc check` exits with 1), `W` codes warnings. `estc explain CODE` prints the\n\
         entry of one code. This file is generated by `estc explain --markdown`; a test keeps it\n\
         in step with the compiler.\n\n| code | severity | title |\n| --- | --- | --- |\n",
    );
    for c in Code::all() {
        out.push_str(&format!(
            "| [{}](#{}) | {} | {} |\n",
            c.id,
            c.id.to_lowercase(),
            c.severity.name(),
            c.title
        ));
    }
    for c in Code::all() {
        out.push_str(&format!(
            "\n## {}\n\n**{}** ({})\n\n```text\n{}\n```\n",
            c.id,
            c.title,
            c.severity.name(),
            c.explanation
        ));
    }
    out
}

/// Writes a line of a log (timings, a logging hook's losses) to stderr. A failed write
/// (a full disk, a closed terminal) is ignored: a log must not stop the work it reports.
pub fn log(line: &str) {
    use std::io::Write;
    if QUIET.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let _ = writeln!(std::io::stderr(), "{line}");
}

static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Silences `log` (the ranks of a run across ranks other than rank 0, whose lines would
/// repeat rank 0's); diagnostics are still printed.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
}

/// Runs `f`, and when `EST_TIME_PASSES` is set logs how long it took as `what`.
pub fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !*ON.get_or_init(|| std::env::var_os("EST_TIME_PASSES").is_some()) {
        return f();
    }
    let t = std::time::Instant::now();
    let out = f();
    log(&format!(
        "{what:<17}{:>9.3} ms",
        t.elapsed().as_secs_f64() * 1e3
    ));
    out
}
