//! One check of an open document, and the answers drawn from it: diagnostics, quick
//! fixes, hover, definitions, inlay hints, signature help and semantic tokens (rename,
//! completion and symbols, in modules of their own, draw on it too).

use super::text::LineIndex;
use super::{path_uri, Texts};
use crate::diag::{Diag, Severity};
use crate::elab::{Hover, Target};
use crate::program::{Def, Program};
use crate::resolve::Target as Ref;
use crate::span::{FileId, Span};
use crate::syntax::ast::{ItemKind, SectionKind};
use crate::syntax::lexer::is_name;
use lsp_types as lt;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

pub struct Analysis {
    pub(super) program: Program,
    pub(super) root: FileId,
    /// The document's path, and where the files it imports are read from (the
    /// editor's open documents, then the file system), on the target checked.
    pub(super) path: PathBuf,
    pub(super) overlay: crate::program::Overlay,
    pub(super) target: Target,
    /// The user files the program read (the document and what it imports).
    pub files: Vec<PathBuf>,
    pub(super) diags: Vec<Diag>,
    pub(super) refs: Vec<(Span, Ref)>,
    /// The graph of each (estimator, mode) that elaborated.
    pub(super) graphs: Vec<crate::elab::Compiled>,
    /// Expressions with their types or values, shortest first.
    hovers: Vec<(Span, String)>,
    /// Names being bound, by the span of the name, with their values in each mode
    /// that elaborated them.
    pub(super) bindings: BTreeMap<Span, Vec<Binding>>,
    index: LineIndex,
}

/// What a name being bound (`let`, a parameter, a loop variable, a params field) was
/// bound to: in one mode's graph, or for the estimator (`mode: None`: params). A name
/// bound several times (a loop, a function called twice, two estimators) has each
/// distinct value once, in the order they were met.
#[derive(Debug, Clone)]
pub struct Binding {
    pub mode: Option<SectionKind>,
    pub texts: Vec<String>,
    pub hints: Vec<String>,
    /// Whether it was bound to a tensor, or to a static value, in this mode.
    pub tensor: bool,
    pub is_static: bool,
}

/// Groups the bindings of one elaboration's hovers into `out`, in `mode`.
fn gather(out: &mut BTreeMap<Span, Vec<Binding>>, hovers: &[Hover], mode: Option<SectionKind>) {
    for h in hovers.iter().filter(|h| h.binding) {
        let modes = out.entry(h.span).or_default();
        let i = match modes.iter().position(|b| b.mode == mode) {
            Some(i) => i,
            None => {
                modes.push(Binding {
                    mode,
                    texts: Vec::new(),
                    hints: Vec::new(),
                    tensor: false,
                    is_static: false,
                });
                modes.len() - 1
            }
        };
        let b = &mut modes[i];
        b.tensor |= h.tensor;
        b.is_static |= h.is_static;
        if !b.texts.contains(&h.text) {
            b.texts.push(h.text.clone());
        }
        if let Some(hint) = &h.hint {
            if !b.hints.contains(hint) {
                b.hints.push(hint.clone());
            }
        }
    }
}

/// Distinct values joined as alternatives, at most `MAX_SHOWN` of them.
fn alternatives(xs: &[String]) -> String {
    const MAX_SHOWN: usize = 3;
    let mut out = xs[..xs.len().min(MAX_SHOWN)].join(" | ");
    if xs.len() > MAX_SHOWN {
        out.push_str(" | …");
    }
    out
}

impl Analysis {
    /// Checks the program rooted at `path` with text `text`, on `target`, every mode.
    pub fn new(path: &Path, text: &str, texts: Texts, target: Target) -> Analysis {
        let overlay: crate::program::Overlay =
            Arc::new(move |p: &Path| texts.read().ok()?.get(p).cloned());
        let program = Program::load_with(path, text, overlay.clone());
        let opts = crate::CheckOptions {
            target,
            verify: false,
            hover: true,
            ..Default::default()
        };
        let checked = crate::check(&program, &opts);
        let mut hovers: Vec<(Span, String)> = checked
            .estimators
            .iter()
            .flat_map(|e| e.hovers.iter())
            .chain(checked.graphs.iter().flat_map(|g| g.hovers.iter()))
            .filter(|h| !h.binding)
            .map(|h| (h.span, h.text.clone()))
            .collect();
        let mut bindings = BTreeMap::new();
        for e in &checked.estimators {
            gather(&mut bindings, &e.hovers, None);
        }
        for g in &checked.graphs {
            gather(&mut bindings, &g.hovers, Some(g.mode));
        }
        hovers.sort_by_key(|(s, _)| (s.file, s.len(), s.lo));
        hovers.dedup_by(|a, b| a.0 == b.0);
        let root = program.root_module().file;
        let files = program.user_files().into_iter().map(|f| f.1).collect();
        Analysis {
            index: LineIndex::new(text),
            root,
            path: path.to_path_buf(),
            overlay,
            target,
            files,
            diags: checked.diags,
            refs: checked.refs,
            graphs: checked.graphs,
            hovers,
            bindings,
            program,
        }
    }

    /// The byte offset of a position in the document (clamped).
    pub fn offset(&self, p: lt::Position) -> usize {
        let text = self.text(self.root);
        self.index.offset(text, p).unwrap_or(text.len())
    }

    pub(super) fn text(&self, f: FileId) -> &str {
        &self.program.sources.get(f).text
    }

    /// The position of a byte offset of the document.
    pub fn position(&self, offset: usize) -> lt::Position {
        self.index.position(self.text(self.root), offset)
    }

    /// The range of a span of the document.
    pub fn range(&self, s: Span) -> lt::Range {
        let (idx, text);
        let index = if s.file == self.root {
            &self.index
        } else {
            text = self.text(s.file);
            idx = LineIndex::new(text);
            &idx
        };
        let text = self.text(s.file);
        lt::Range {
            start: index.position(text, s.lo as usize),
            end: index.position(text, s.hi as usize),
        }
    }

    /// The URI and range of a span. Standard library files are written out (once per
    /// version) under the system's temporary directory, so that editors can open them.
    pub fn location(&self, s: Span) -> Option<(lt::Uri, lt::Range)> {
        let file = self.program.sources.get(s.file);
        let path = if self.program.is_std_file(s.file) {
            let p = std::env::temp_dir()
                .join(format!("est-{}", env!("CARGO_PKG_VERSION")))
                .join(&file.name);
            if std::fs::read_to_string(&p).ok().as_deref() != Some(&*file.text) {
                std::fs::create_dir_all(p.parent()?).ok()?;
                std::fs::write(&p, &*file.text).ok()?;
            }
            p
        } else {
            PathBuf::from(&file.name)
        };
        let uri = lt::Uri::from_str(&path_uri(&path)).ok()?;
        Some((uri, self.range(s)))
    }

    /// Where a diagnostic shows in the document: its own span, or, for one in an
    /// imported user file that only checking this program finds (elaboration, not
    /// syntax or names, which that file's own check shows), the `use` that imports it.
    fn place(&self, d: &Diag) -> Option<Span> {
        let s = d.primary.span;
        if s.file == self.root {
            return Some(s);
        }
        let id = d.code.id();
        if self.program.is_std_file(s.file) || id.starts_with("E01") || id.starts_with("E02") {
            return None;
        }
        let module = self.program.modules.iter().find(|m| m.file == s.file)?;
        self.program
            .root_module()
            .ast
            .items
            .iter()
            .find_map(|it| match &it.kind {
                ItemKind::Use(u) => {
                    let path: Vec<&str> = u.path.iter().map(|i| i.name.as_str()).collect();
                    let joined = path.join(".");
                    (joined == module.path || joined.starts_with(&format!("{}.", module.path)))
                        .then_some(it.span)
                }
                _ => None,
            })
    }

    /// The document's diagnostics, with everything the command line shows.
    pub fn diagnostics(&self) -> Vec<lt::Diagnostic> {
        self.diags
            .iter()
            .filter_map(|d| self.place(d).map(|at| self.diagnostic(d, at)))
            .collect()
    }

    /// The fixes of the diagnostics shown between two offsets, with the diagnostic
    /// each resolves. A fix with an edit in the standard library is left out.
    pub fn fixes(&self, lo: usize, hi: usize) -> Vec<(lt::Diagnostic, &crate::diag::Fix)> {
        let mut out = Vec::new();
        for d in &self.diags {
            let Some(at) = self.place(d) else { continue };
            if at.file != self.root || (at.hi as usize) < lo || (at.lo as usize) > hi {
                continue;
            }
            for f in &d.fixes {
                if f.edits
                    .iter()
                    .all(|e| !self.program.is_std_file(e.span.file))
                {
                    out.push((self.diagnostic(d, at), f));
                }
            }
        }
        out
    }

    /// A diagnostic as the protocol shows it, at `at`.
    fn diagnostic(&self, d: &Diag, at: Span) -> lt::Diagnostic {
        let mut related = Vec::new();
        for l in &d.secondary {
            if self.program.is_std_file(l.span.file) {
                continue;
            }
            if let Some((uri, range)) = self.location(l.span) {
                related.push(lt::DiagnosticRelatedInformation {
                    location: lt::Location { uri, range },
                    message: l.text.clone(),
                });
            }
        }
        let mut message = d.message.clone();
        if at != d.primary.span {
            // shown at the `use`: say where it is, and link to it
            if let Some((uri, range)) = self.location(d.primary.span) {
                message = format!(
                    "{}:{}:{}: {message}",
                    self.program.sources.get(d.primary.span.file).name,
                    range.start.line + 1,
                    range.start.character + 1
                );
                related.insert(
                    0,
                    lt::DiagnosticRelatedInformation {
                        location: lt::Location { uri, range },
                        message: d.primary.text.clone(),
                    },
                );
            }
        }
        if !d.primary.text.is_empty() {
            message.push_str(&format!("\n{}", d.primary.text));
        }
        if let Some(h) = &d.help {
            message.push_str(&format!("\nhelp: {h}"));
        }
        lt::Diagnostic {
            range: self.range(at),
            severity: Some(match d.severity() {
                Severity::Error => lt::DiagnosticSeverity::ERROR,
                Severity::Warning => lt::DiagnosticSeverity::WARNING,
            }),
            code: Some(lt::NumberOrString::String(d.code.id().to_string())),
            source: Some("estc".into()),
            message,
            related_information: (!related.is_empty()).then_some(related),
            ..Default::default()
        }
    }

    /// Whether the character at `offset` is in a span of the document.
    pub(super) fn contains(&self, s: Span, offset: usize) -> bool {
        s.file == self.root && (s.lo as usize) <= offset && offset < s.hi as usize
    }

    /// The name use at an offset, with what it refers to.
    pub(super) fn reference(&self, offset: usize) -> Option<(Span, Ref)> {
        self.refs
            .iter()
            .filter(|(s, _)| self.contains(*s, offset))
            .min_by_key(|(s, _)| s.len())
            .copied()
    }

    /// The span a reference's definition has.
    pub(super) fn def_span(&self, r: Ref) -> Option<Span> {
        match r {
            Ref::Local(s) | Ref::ParamsField(s) => Some(s),
            Ref::Def(Def::Item(m, i)) => {
                let item = self.program.item(m, i);
                Some(item.name().map_or(item.span, |n| n.span))
            }
            Ref::Def(Def::Module(m)) => {
                let f = self.program.module(m).file;
                Some(Span::new(f, 0, 0))
            }
        }
    }

    /// Where the name at an offset is defined.
    pub fn definition(&self, offset: usize) -> Option<Span> {
        let (_, r) = self.reference(offset)?;
        self.def_span(r)
    }

    /// Hover text at an offset: for a name, its definition's signature and doc
    /// comment; for an expression, its type or static value.
    pub fn hover(&self, offset: usize) -> Option<(String, Span)> {
        if let Some(h) = self.binding_hover(offset) {
            return Some(h);
        }
        let expr = self
            .hovers
            .iter()
            .find(|(s, _)| self.contains(*s, offset))
            .cloned();
        let name = self.reference(offset);
        match (name, expr) {
            (Some((at, r)), e) => {
                let def = self.def_span(r)?;
                let (sig, doc) = self.signature(r, def);
                let mut out = format!("```est\n{sig}\n```");
                // the value, unless it is only a kind ("a function")
                if let Some((_, ty)) =
                    e.filter(|(s, t)| *s == at && !t.starts_with("a ") && !t.starts_with("an "))
                {
                    out.push_str(&format!("\n\n`{ty}`"));
                }
                if !doc.is_empty() {
                    out.push_str(&format!("\n\n{doc}"));
                }
                Some((out, at))
            }
            (None, Some((s, ty))) => Some((format!("`{ty}`"), s)),
            (None, None) => None,
        }
    }

    /// Hover on a name being bound: its line, and its values in each mode (one line
    /// when every mode agrees).
    fn binding_hover(&self, offset: usize) -> Option<(String, Span)> {
        let (&at, all) = (self.bindings.iter()).find(|(s, _)| self.contains(**s, offset))?;
        let (sig, doc) = self.signature(Ref::Local(at), at);
        let mut out = format!("```est\n{sig}\n```\n");
        let same = all.iter().all(|b| b.texts == all[0].texts);
        for b in all {
            let values: Vec<String> = b.texts.iter().map(|t| format!("`{t}`")).collect();
            match b.mode {
                Some(m) if !same => {
                    out.push_str(&format!("\n{}: {}", m.name(), values.join(" or ")))
                }
                _ => {
                    out.push_str(&format!("\n{}", values.join(" or ")));
                    break;
                }
            }
            out.push_str("  ");
        }
        let mut out = out.trim_end().to_string();
        if !doc.is_empty() {
            out.push_str(&format!("\n\n{doc}"));
        }
        Some((out, at))
    }

    /// The inlay hints of the document's bindings within `range` (byte offsets), as
    /// the graph of `mode` has them; a binding that mode does not elaborate (a `let`
    /// in another mode's section) shows the first mode's that does (train, eval,
    /// predict). Each is the hint's offset (the end of the name), its label, and
    /// whether it is a type (rather than a value).
    pub fn inlay_hints(
        &self,
        lo: usize,
        hi: usize,
        mode: SectionKind,
    ) -> Vec<(usize, String, bool)> {
        let text = self.text(self.root);
        let order = |m: Option<SectionKind>| match m {
            Some(x) if x == mode => 0,
            None => 1,
            Some(x) => 2 + x as usize,
        };
        (self.bindings.iter())
            .filter(|(s, _)| s.file == self.root && (lo..=hi).contains(&(s.hi as usize)))
            .filter_map(|(s, modes)| {
                let b = (modes.iter())
                    .filter(|b| !b.hints.is_empty())
                    .min_by_key(|b| order(b.mode))?;
                let end = s.hi as usize;
                let (values, types): (Vec<&String>, Vec<&String>) =
                    b.hints.iter().partition(|h| h.starts_with("= "));
                let values: Vec<String> = values.iter().map(|h| h[2..].to_string()).collect();
                if !types.is_empty() {
                    // (a name bound to tensors and to static values shows both)
                    let all: Vec<String> = types.into_iter().cloned().chain(values).collect();
                    return Some((end, format!(": {}", alternatives(&all)), true));
                }
                // a static value written out where it is bound needs no hint
                let written = written_value(&text[end..]);
                (values.len() > 1 || Some(values[0].as_str()) != written)
                    .then(|| (end, format!(" = {}", alternatives(&values)), false))
            })
            .collect()
    }

    /// The function, input or model a callee written in the document names (`f`,
    /// `module.f`).
    pub(super) fn callee(&self, written: &str) -> Option<&crate::syntax::ast::FnItem> {
        let (name, member) = match written.split_once('.') {
            Some((name, member)) => (name, Some(member)),
            None => (written, None),
        };
        self.program.callee(self.program.root, name, member)
    }

    /// Signature help at an offset inside a call's parentheses: the callee's
    /// signature, its parameters' ranges in it, its doc comment and the parameter
    /// the argument at the offset is for.
    pub fn signature_help(&self, offset: usize) -> Option<Signature> {
        let text = self.text(self.root);
        let offset = offset.min(text.len());
        let (open, callee) = open_call(&text[..offset])?;
        let f = self.callee(&callee)?;
        let src = self.text(f.name.span.file);
        let mut label = format!("{}(", f.name.name);
        let mut params = Vec::new();
        for (k, p) in f.params.iter().enumerate() {
            if k > 0 {
                label.push_str(", ");
            }
            let end = (p.default.as_ref().map(|d| d.span.hi))
                .or(p.ty.as_ref().map(|t| t.span().hi))
                .unwrap_or(p.name.span.hi);
            let lo = label.len();
            label.push_str(&src[p.name.span.lo as usize..end as usize]);
            params.push((lo, label.len()));
        }
        label.push(')');
        // the argument the offset is in: a named one is its parameter's; a positional
        // one counts the commas before it (and a piped value is the first)
        let args = &text[open + 1..offset];
        let (commas, current) = split_args(args);
        let named = current
            .trim_start()
            .split_once(':')
            .map(|(n, _)| n.trim())
            .filter(|n| is_name(n));
        let piped = text[..open]
            .trim_end()
            .strip_suffix(callee.as_str())
            .is_some_and(|t| t.trim_end().ends_with("|>"));
        let active = match named.and_then(|n| f.params.iter().position(|p| p.name.name == n)) {
            Some(k) => k,
            None => commas + usize::from(piped),
        };
        // (the doc comment above the line the item starts on)
        let line_start = src[..f.name.span.lo as usize]
            .rfind('\n')
            .map_or(0, |i| i + 1);
        let doc = doc_above(src, line_start);
        Some(Signature {
            label,
            params,
            doc,
            active: active.min(f.params.len().saturating_sub(1)),
        })
    }

    /// The document's names as semantic tokens, in order: each one's span, type and
    /// modifiers (see `TOKEN_TYPES` and `TOKEN_MODIFIERS`).
    pub fn semantic_tokens(&self) -> Vec<(Span, u32, u32)> {
        // the parameters of the document's functions, inputs, models and closures
        let mut params: Vec<Span> = Vec::new();
        for it in &self.program.root_module().ast.items {
            if let ItemKind::Fn(f) | ItemKind::Input(f) | ItemKind::Model(f) = &it.kind {
                params.extend(f.params.iter().map(|p| p.name.span));
            }
            crate::syntax::depth::each_expr(it, |e| {
                if let crate::syntax::ast::ExprKind::Closure { params: ps, .. } = &e.kind {
                    params.extend(ps.iter().flat_map(|p| p.names()).map(|n| n.span));
                }
            });
        }
        let kind_of = |def: Span, r: Option<Ref>| -> (u32, u32) {
            match r {
                Some(Ref::Def(Def::Module(_))) => (TT_NAMESPACE, 0),
                Some(Ref::Def(Def::Item(m, _))) => {
                    let lib = if self.program.module(m).is_std {
                        TM_DEFAULT_LIBRARY
                    } else {
                        0
                    };
                    (TT_FUNCTION, lib)
                }
                Some(Ref::ParamsField(_)) => (TT_PROPERTY, TM_READONLY),
                _ => {
                    let bound = self.bindings.get(&def).map_or(&[][..], Vec::as_slice);
                    let ty = if params.contains(&def) {
                        TT_PARAMETER
                    } else {
                        TT_VARIABLE
                    };
                    if bound.iter().any(|b| b.tensor) {
                        (ty, 0)
                    } else if !bound.is_empty() && bound.iter().all(|b| b.is_static) {
                        (ty, TM_READONLY | TM_STATIC)
                    } else {
                        (ty, 0)
                    }
                }
            }
        };
        let text = self.text(self.root);
        let mut out: Vec<(Span, u32, u32)> = Vec::new();
        for (s, r) in &self.refs {
            if s.file != self.root || !is_name(self.program.sources.text(*s)) {
                continue;
            }
            let Some(def) = self.def_span(*r) else {
                continue;
            };
            // (a use followed by `:` is a named argument)
            let named = text[s.hi as usize..].trim_start().starts_with(':');
            let (t, m) = if named {
                (TT_PARAMETER, 0)
            } else {
                kind_of(def, Some(*r))
            };
            out.push((*s, t, m));
        }
        // definitions in the document: items, params fields and bindings
        let root = self.program.root_module();
        for it in &root.ast.items {
            match &it.kind {
                ItemKind::Params(fs) => out.extend(
                    fs.iter()
                        .map(|f| (f.name.span, TT_PROPERTY, TM_READONLY | TM_DECLARATION)),
                ),
                ItemKind::Estimator(e) => out.push((e.name.span, TT_CLASS, TM_DECLARATION)),
                _ => {
                    if let Some(n) = it.name() {
                        out.push((n.span, TT_FUNCTION, TM_DECLARATION));
                    }
                }
            }
        }
        for &s in self.bindings.keys().filter(|s| s.file == self.root) {
            let (t, m) = kind_of(s, None);
            out.push((s, t, m | TM_DECLARATION));
        }
        out.sort_by_key(|(s, _, _)| (s.lo, s.hi));
        out.dedup_by_key(|(s, _, _)| s.lo);
        out
    }

    /// A definition's first line (up to its body) and the `///` comment above it.
    fn signature(&self, r: Ref, def: Span) -> (String, String) {
        let text = self.text(def.file);
        let start = match r {
            Ref::Def(Def::Item(m, i)) => self.program.item(m, i).span.lo as usize,
            Ref::Def(Def::Module(m)) => {
                return (
                    format!("module {}", self.program.module(m).path),
                    String::new(),
                )
            }
            _ => def.lo as usize,
        };
        let line_start = text[..start.min(text.len())]
            .rfind('\n')
            .map_or(0, |i| i + 1);
        let line_end = text[line_start..]
            .find('\n')
            .map_or(text.len(), |i| line_start + i);
        let mut sig = text[line_start..line_end].trim().to_string();
        if let Some(i) = sig.find(" {") {
            if matches!(r, Ref::Def(_)) {
                sig.truncate(i);
            }
        }
        (sig, doc_above(text, line_start))
    }

    pub(super) fn item_names(&self) -> Vec<(String, lt::CompletionItemKind)> {
        let mut out = Vec::new();
        let root = self.program.root_module();
        let kind_of = |k: &ItemKind| match k {
            ItemKind::Fn(_) => lt::CompletionItemKind::FUNCTION,
            ItemKind::Input(_) => lt::CompletionItemKind::CONSTRUCTOR,
            ItemKind::Model(_) => lt::CompletionItemKind::CLASS,
            _ => lt::CompletionItemKind::VALUE,
        };
        for (n, &i) in &root.items {
            out.push((n.clone(), kind_of(&root.ast.items[i].kind)));
        }
        for (n, (d, _, _)) in &root.imports {
            let k = match d {
                Def::Module(_) => lt::CompletionItemKind::MODULE,
                Def::Item(m, i) => kind_of(&self.program.item(*m, *i).kind),
            };
            out.push((n.clone(), k));
        }
        for pm in crate::program::PRELUDE {
            if let Some(m) = self.program.modules.iter().find(|m| m.path == *pm) {
                for (n, &i) in &m.items {
                    out.push((n.clone(), kind_of(&m.ast.items[i].kind)));
                }
            }
        }
        out.push(("params".into(), lt::CompletionItemKind::STRUCT));
        for b in crate::resolve::BUILTIN_VALUES {
            out.push((b.to_string(), lt::CompletionItemKind::KEYWORD));
        }
        out
    }
}

/// The `///` comment on the lines just above the line that starts at `line_start`.
fn doc_above(text: &str, line_start: usize) -> String {
    let mut doc: Vec<&str> = Vec::new();
    let mut at = line_start;
    while at > 0 {
        let prev_start = text[..at - 1].rfind('\n').map_or(0, |i| i + 1);
        let line = text[prev_start..at - 1].trim();
        match line.strip_prefix("///") {
            Some(d) => doc.push(d.trim()),
            None => break,
        }
        at = prev_start;
    }
    doc.reverse();
    doc.join("\n")
}

/// Signature help: a callee's signature, each parameter's byte range in it, its doc
/// comment, and the parameter being written.
pub struct Signature {
    pub label: String,
    pub params: Vec<(usize, usize)>,
    pub doc: String,
    pub active: usize,
}

/// The semantic token types the server uses, in the legend's order.
pub const TOKEN_TYPES: &[&str] = &[
    "namespace",
    "function",
    "variable",
    "property",
    "parameter",
    "class",
];
const TT_NAMESPACE: u32 = 0;
const TT_FUNCTION: u32 = 1;
const TT_VARIABLE: u32 = 2;
const TT_PROPERTY: u32 = 3;
/// A parameter of a function, input, model or closure, and a named argument's name
/// (`padding:` in a call).
const TT_PARAMETER: u32 = 4;
/// An estimator's name.
const TT_CLASS: u32 = 5;
/// The semantic token modifiers, in the legend's order (bit k is modifier k). A static
/// value is `readonly` and `static`; a tensor is a plain variable.
pub const TOKEN_MODIFIERS: &[&str] = &["declaration", "readonly", "static", "defaultLibrary"];
const TM_DECLARATION: u32 = 1;
const TM_READONLY: u32 = 2;
const TM_STATIC: u32 = 4;
const TM_DEFAULT_LIBRARY: u32 = 8;

/// The innermost call whose `(` is open at the end of `text`: the offset of its `(`
/// and its callee (`f` or `module.f`).
pub(super) fn open_call(text: &str) -> Option<(usize, String)> {
    let mut depth = 0i32;
    for (i, c) in text.char_indices().rev() {
        match c {
            ')' | ']' | '}' => depth += 1,
            '[' | '{' if depth > 0 => depth -= 1,
            '(' if depth > 0 => depth -= 1,
            '(' => {
                let before = &text[..i];
                let start = (before.char_indices().rev())
                    .find(|&(_, c)| !(c.is_alphanumeric() || c == '_' || c == '.'))
                    .map_or(0, |(k, c)| k + c.len_utf8());
                let name = &before[start..];
                return (!name.is_empty() && !name.starts_with('.')).then(|| (i, name.to_string()));
            }
            '[' | '{' => return None,
            _ => {}
        }
    }
    None
}

/// The commas at depth 0 in a call's arguments so far, and the text of the last one.
fn split_args(args: &str) -> (usize, &str) {
    let (mut depth, mut commas, mut start) = (0i32, 0, 0);
    let mut in_str = false;
    for (i, c) in args.char_indices() {
        match c {
            '"' => in_str = !in_str,
            _ if in_str => {}
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                commas += 1;
                start = i + 1;
            }
            _ => {}
        }
    }
    (commas, &args[start..])
}

/// The value written after a name being bound, up to the end of its line, a `;` or a
/// comment (`= 128` in `batch_size: int = 128`), if it is written there.
fn written_value(after: &str) -> Option<&str> {
    let line = after.split('\n').next()?;
    let line = line.split("//").next()?.split(';').next()?;
    let (_, v) = line.split_once('=')?;
    let v = v.trim().trim_end_matches('}').trim();
    (!v.is_empty()).then_some(v)
}
