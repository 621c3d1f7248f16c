//! Rename (`prepareRename`, `rename`): the name at a position, every place that refers
//! to the same definition across the program's files (strings' `{name}` included), the
//! clashes that would change what a name refers to, and the check that the program
//! compiles to the same graphs afterwards.

use super::analysis::Analysis;
use crate::diag::Severity;
use crate::program::ModId;
use crate::span::Span;
use crate::syntax::ast::ItemKind;
use crate::syntax::lexer::{is_name, Tok};
use rustc_hash::FxHashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

impl Analysis {
    /// Every span that defines a name the program's user files refer to or declare:
    /// the targets of references, bindings, item names and params fields.
    fn definitions(&self) -> Vec<Span> {
        let mut out: Vec<Span> = self
            .refs
            .iter()
            .filter_map(|(_, r)| self.def_span(*r))
            .collect();
        out.extend(self.bindings.keys());
        for m in self.program.modules.iter().filter(|m| !m.is_std) {
            for it in &m.ast.items {
                if let Some(n) = it.name() {
                    out.push(n.span);
                }
                if let ItemKind::Params(fs) = &it.kind {
                    out.extend(fs.iter().map(|f| f.name.span));
                }
            }
        }
        out.retain(|s| !s.is_empty());
        out.sort_by_key(|s| (s.file, s.lo, s.hi));
        out.dedup();
        out
    }

    /// The name at an offset, and the span of the definition it stands for (itself,
    /// for a definition).
    fn name_at(&self, offset: usize) -> Option<(Span, Span)> {
        if let Some((at, r)) = self.reference(offset) {
            return Some((at, self.def_span(r)?));
        }
        let d = self
            .definitions()
            .into_iter()
            .find(|s| self.contains(*s, offset))?;
        Some((d, d))
    }

    /// The name a rename at `offset` would change: its span, or why there is none.
    pub fn rename_target(&self, offset: usize) -> Result<(Span, Span), String> {
        // (the cursor right after a name is on it)
        let (at, def) = (self.name_at(offset))
            .or_else(|| self.name_at(offset.checked_sub(1)?))
            .ok_or("there is no name here to rename")?;
        let old = self.program.sources.text(at);
        if def.is_empty() {
            return Err(format!(
                "`{old}` is a module, named by its file: rename the file"
            ));
        }
        if !is_name(old) {
            return Err("rename the name where it is declared or used, not in a string".into());
        }
        if self.program.is_std_file(def.file) {
            return Err(format!(
                "`{old}` is defined in the standard library, which cannot be renamed"
            ));
        }
        Ok((at, def))
    }

    /// The edits that rename the name at `offset` to `new` in every file of the
    /// program: its definition, and every use of it spelled as at `offset` (a `use`
    /// alias keeps its own name), in strings' `{name}` too.
    pub fn rename(&self, offset: usize, new: &str) -> Result<Vec<(Span, String)>, String> {
        let (at, def) = self.rename_target(offset)?;
        let old = self.program.sources.text(at).to_string();
        if !is_name(new) {
            return Err(format!(
                "`{new}` is not a name: a name is a letter or `_`, then letters, digits or `_`, and not a keyword"
            ));
        }
        if new == old {
            return Ok(Vec::new());
        }
        let mut spans = vec![def];
        spans.extend(
            self.refs
                .iter()
                .filter(|(_, r)| self.def_span(*r) == Some(def))
                .map(|(s, _)| *s),
        );
        // (a params field is the second segment of `{params.field}` in strings; anything
        // else the first)
        let field = self.params_fields().any(|f| f.name.span == def);
        if let Some(why) = self.clash(&spans, new, field) {
            return Err(format!(
                "{why}: renaming `{old}` to it would change what a name refers to; choose another name"
            ));
        }
        let mut edits = Vec::new();
        for s in spans {
            let text = self.program.sources.text(s);
            let base = s.lo as usize;
            for (lo, tok, hi) in crate::syntax::lexer::lex(text) {
                match tok {
                    // (the span of `(x)` is its parentheses')
                    Tok::Ident(n) if n == old => {
                        edits.push((Span::new(s.file, base + lo, base + hi), new.to_string()));
                    }
                    Tok::Str(raw) => {
                        for path in crate::resolve::interpolations(raw) {
                            let hit = match path.as_slice() {
                                [(_, "params"), f, ..] if field => Some(f),
                                [n, ..] if !field => Some(n),
                                _ => None,
                            };
                            if let Some(&(at, _)) = hit.filter(|h| h.1 == old) {
                                let lo = base + lo + at;
                                edits
                                    .push((Span::new(s.file, lo, lo + old.len()), new.to_string()));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        edits.sort_by_key(|(s, _)| (s.file, s.lo));
        edits.dedup_by_key(|(s, _)| *s);
        if let Some(why) = self.changes_meaning(&edits) {
            return Err(format!(
                "renaming `{old}` to `{new}` would change the compiled program: {why}; a rename never changes what a program computes or the names its checkpoints hold"
            ));
        }
        Ok(edits)
    }

    /// How the program with `edits` applied would compile differently, if it would: the
    /// first line of its IR (every graph, as `estc check --emit ir` prints it, the
    /// graphs' titles included) that differs, or an error it would have more of. A
    /// rename must change no graph: a variable's name is its function's name (the
    /// scope of its checkpoint entry), a model input's its parameter's, and an eval
    /// section's `loss = ...` is a setting, not a local.
    fn changes_meaning(&self, edits: &[(Span, String)]) -> Option<String> {
        let mut edited: FxHashMap<PathBuf, String> = FxHashMap::default();
        for (file, path) in self.program.user_files() {
            let mut text = self.program.sources.get(file).text.to_string();
            for (s, new) in edits.iter().rev().filter(|(s, _)| s.file == file) {
                text.replace_range(s.lo as usize..s.hi as usize, new);
            }
            edited.insert(path, text);
        }
        let root = self.program.root_module().file;
        let root_text = edited
            .get(&self.path)
            .cloned()
            .unwrap_or_else(|| self.text(root).to_string());
        let (others, fallback) = (edited.clone(), self.overlay.clone());
        let overlay: crate::program::Overlay =
            Arc::new(move |p: &Path| others.get(p).cloned().or_else(|| fallback(p)));
        let program = crate::Program::load_with(&self.path, &root_text, overlay);
        let opts = crate::CheckOptions {
            target: self.target,
            verify: false,
            ..Default::default()
        };
        let after = crate::check(&program, &opts);
        // (in the order they elaborate: the estimators' in the source, which a rename
        // keeps)
        let dumps = |graphs: &[crate::elab::Compiled]| -> Vec<String> {
            graphs.iter().map(|c| c.dump()).collect()
        };
        let (was, now) = (dumps(&self.graphs), dumps(&after.graphs));
        if was != now {
            let (a, b) = (was.join(""), now.join(""));
            let differ = a.lines().zip(b.lines()).find(|(x, y)| x != y);
            return Some(match differ {
                Some((x, y)) => format!("`{}` would become `{}`", x.trim(), y.trim()),
                None => "a graph would be added or dropped".to_string(),
            });
        }
        let errors = |ds: &[crate::diag::Diag]| {
            let mut codes: Vec<&str> = (ds.iter())
                .filter(|d| d.severity() == Severity::Error)
                .map(|d| d.code.id())
                .collect();
            codes.sort_unstable();
            codes
        };
        let (was, now) = (errors(&self.diags), errors(&after.diags));
        let new_error = now.iter().find(|c| {
            was.iter().filter(|w| w == c).count() < now.iter().filter(|n| n == c).count()
        });
        new_error.map(|c| format!("it would no longer check ({c})"))
    }

    /// The fields of the document's `params` blocks.
    pub(super) fn params_fields(&self) -> impl Iterator<Item = &crate::syntax::ast::ParamField> {
        (self.program.root_module().ast.items.iter()).flat_map(|it| match &it.kind {
            ItemKind::Params(fs) => fs.as_slice(),
            _ => &[],
        })
    }

    /// Why `new` would clash where a name is defined or used (`spans`), if it would:
    /// another params field of that name (for a params field), or a built-in name, an
    /// item in scope, or a binding in the same item (for anything else).
    fn clash(&self, spans: &[Span], new: &str, field: bool) -> Option<String> {
        if field {
            let taken = self.params_fields().any(|f| f.name.name == new);
            return taken.then(|| format!("`params` already has a field `{new}`"));
        }
        if crate::resolve::BUILTIN_VALUES.contains(&new) {
            return Some(format!("`{new}` is a built-in name"));
        }
        let defined = self.definitions();
        for s in spans {
            let Some(m) = self.program.modules.iter().position(|m| m.file == s.file) else {
                continue;
            };
            let module = &self.program.modules[m];
            if self.program.lookup(ModId(m as u32), new).is_some() {
                return Some(format!(
                    "`{new}` already names an item in `{}`",
                    module.path
                ));
            }
            let inside = |it: &crate::syntax::ast::Item, x: Span| {
                x.file == s.file && it.span.lo <= x.lo && x.hi <= it.span.hi
            };
            let item = module.ast.items.iter().find(|it| inside(it, *s));
            if let Some(it) = item {
                let bound = (defined.iter())
                    .any(|d| inside(it, *d) && self.program.sources.text(*d) == new);
                if bound {
                    let name = it.name().map_or("it", |n| n.name.as_str());
                    return Some(format!("`{new}` is already bound in `{name}`"));
                }
            }
        }
        None
    }
}
