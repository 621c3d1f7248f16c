//! Completion: the names an editor offers where the cursor is (std modules after `use`,
//! members after `module.` and `params.`, named arguments inside a call, the names in
//! scope otherwise).

use super::analysis::{open_call, Analysis};
use crate::program::Def;
use lsp_types as lt;

fn item(label: impl Into<String>, kind: lt::CompletionItemKind) -> lt::CompletionItem {
    lt::CompletionItem {
        label: label.into(),
        kind: Some(kind),
        ..Default::default()
    }
}

/// Completions at an offset: std modules (and their items) after `use`, members after
/// `module.` or `params.`, named arguments inside a call, otherwise the names in scope.
pub fn completion(a: &Analysis, offset: usize) -> lt::CompletionResponse {
    let text = a.text(a.root);
    let offset = offset.min(text.len());
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = &text[line_start..offset];
    let mut items: Vec<lt::CompletionItem> = Vec::new();
    let trimmed = line.trim_start();
    if let Some(rest) = trimmed.strip_prefix("use ") {
        let rest = rest.trim();
        match rest.rsplit_once('.') {
            Some((module, _)) if crate::program::STDLIB.iter().any(|(p, _, _)| *p == module) => {
                if let Some(m) = a.program.modules.iter().find(|m| m.path == module) {
                    items.extend(
                        m.items
                            .keys()
                            .map(|n| item(n, lt::CompletionItemKind::FUNCTION)),
                    );
                }
            }
            _ => items.extend(
                crate::program::STDLIB
                    .iter()
                    .map(|(p, _, _)| item(*p, lt::CompletionItemKind::MODULE)),
            ),
        }
        return lt::CompletionResponse::Array(sorted(items));
    }
    // `name.` : a module's items or the params fields
    let before_word = line.trim_end_matches(|c: char| c.is_alphanumeric() || c == '_');
    if let Some(base) = before_word.strip_suffix('.') {
        let name = last_word(base);
        if name == "params" {
            items.extend(
                a.params_fields()
                    .map(|f| item(&f.name.name, lt::CompletionItemKind::FIELD)),
            );
        } else if let Some(Def::Module(m)) = a.program.lookup(a.program.root, &name) {
            items.extend(
                a.program
                    .module(m)
                    .items
                    .keys()
                    .map(|n| item(n, lt::CompletionItemKind::FUNCTION)),
            );
        }
        return lt::CompletionResponse::Array(sorted(items));
    }
    // inside a call: its named arguments first
    if let Some(f) = open_call(&text[..offset]).and_then(|(_, callee)| a.callee(&callee)) {
        for p in &f.params {
            let mut c = item(
                format!("{}:", p.name.name),
                lt::CompletionItemKind::PROPERTY,
            );
            c.insert_text = Some(format!("{}: ", p.name.name));
            c.sort_text = Some(format!("0{}", p.name.name));
            items.push(c);
        }
    }
    for (n, k) in a.item_names() {
        items.push(item(n, k));
    }
    for n in locals(&text[..offset]) {
        items.push(item(n, lt::CompletionItemKind::VARIABLE));
    }
    lt::CompletionResponse::Array(sorted(items))
}

fn sorted(mut items: Vec<lt::CompletionItem>) -> Vec<lt::CompletionItem> {
    items.sort_by(|a, b| {
        (a.sort_text.as_ref().unwrap_or(&a.label), &a.label)
            .cmp(&(b.sort_text.as_ref().unwrap_or(&b.label), &b.label))
    });
    items.dedup_by(|a, b| a.label == b.label);
    items
}

/// The identifier that `text` ends with (empty if none).
fn last_word(text: &str) -> String {
    let start = text
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| {
            i + text[i..].chars().next().map_or(1, char::len_utf8)
        });
    text[start..].to_string()
}

/// Names bound before the end of `text` in the item it ends in: `let` names, `for`
/// variables, closure and item parameters.
fn locals(text: &str) -> Vec<String> {
    let start = ["\nfn ", "\nmodel ", "\ninput ", "\nestimator ", "\nparams "]
        .iter()
        .filter_map(|k| text.rfind(k))
        .max()
        .unwrap_or(0);
    let body = &text[start..];
    let mut out = Vec::new();
    let word = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for kw in ["let ", "for "] {
        for (i, _) in body.match_indices(kw) {
            let w = word(&body[i + kw.len()..]);
            if !w.is_empty() {
                out.push(w);
            }
        }
    }
    // parameters of the item: the first (...) after its name
    if let Some(open) = body.find('(') {
        if let Some(close) = body[open..].find(')') {
            for p in body[open + 1..open + close].split(',') {
                let w = word(p);
                if !w.is_empty() {
                    out.push(w);
                }
            }
        }
    }
    // closure parameters |a, b|
    let mut parts = body.split('|');
    parts.next();
    for (k, p) in parts.enumerate() {
        if k % 2 == 0 && !p.contains('\n') && p.len() < 80 {
            for w in p.split(',').map(word).filter(|w| !w.is_empty()) {
                out.push(w);
            }
        }
    }
    out
}
