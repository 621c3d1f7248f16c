//! Document symbols: the outline of a document's items.

use super::analysis::Analysis;
use crate::span::Span;
use crate::syntax::ast::ItemKind;
use lsp_types as lt;

/// The document's items as symbols: params (with their fields), functions, inputs,
/// models, estimators.
pub fn symbols(a: &Analysis) -> lt::DocumentSymbolResponse {
    let mut out = Vec::new();
    for it in &a.program.root_module().ast.items {
        #[allow(deprecated)]
        let sym =
            |name: String,
             kind: lt::SymbolKind,
             detail: Option<String>,
             span: Span,
             sel: Span,
             children: Option<Vec<lt::DocumentSymbol>>| lt::DocumentSymbol {
                name,
                detail,
                kind,
                tags: None,
                deprecated: None,
                range: a.range(span),
                selection_range: a.range(sel),
                children,
            };
        let s = match &it.kind {
            ItemKind::Params(fs) => {
                let children = fs
                    .iter()
                    .map(|f| {
                        let span = f.name.span.to(f.default.span);
                        sym(
                            f.name.name.clone(),
                            lt::SymbolKind::FIELD,
                            None,
                            span,
                            f.name.span,
                            None,
                        )
                    })
                    .collect();
                sym(
                    "params".into(),
                    lt::SymbolKind::STRUCT,
                    None,
                    it.span,
                    it.span,
                    Some(children),
                )
            }
            ItemKind::Fn(f) | ItemKind::Input(f) | ItemKind::Model(f) => {
                let (kind, detail) = match &it.kind {
                    ItemKind::Fn(_) => (lt::SymbolKind::FUNCTION, "fn"),
                    ItemKind::Input(_) => (lt::SymbolKind::CONSTRUCTOR, "input"),
                    _ => (lt::SymbolKind::CLASS, "model"),
                };
                sym(
                    f.name.name.clone(),
                    kind,
                    Some(detail.into()),
                    it.span,
                    f.name.span,
                    None,
                )
            }
            ItemKind::Estimator(e) => sym(
                e.name.name.clone(),
                lt::SymbolKind::OBJECT,
                Some("estimator".into()),
                it.span,
                e.name.span,
                None,
            ),
            ItemKind::Use(_) | ItemKind::Error(_) => continue,
        };
        out.push(s);
    }
    lt::DocumentSymbolResponse::Nested(out)
}
