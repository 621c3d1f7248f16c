//! The parser's entry points. `parse` never fails: it returns a tree (with `Error`
//! nodes where text did not parse) and a diagnostic for every syntax error, all mapped
//! from lalrpop's error type here, in one place.

use super::ast::{Expr, ExprKind, Ident, ItemKind, Module};
use super::lexer::{self, Tok};
use crate::diag::{Code, Diag};
use crate::span::{FileId, Span};
use lalrpop_util::{lalrpop_mod, ErrorRecovery, ParseError};
use std::convert::Infallible;

lalrpop_mod!(
    #[allow(clippy::all, clippy::pedantic, unused_parens, dead_code)]
    grammar,
    "/est.rs"
);

/// A literal the grammar accepted as a token but whose value is invalid.
#[derive(Debug, Clone, Copy)]
pub enum LiteralError {
    Int(Span),
    Float(Span),
    /// A string with an unknown escape at the given byte offset inside the token.
    Escape(Span, usize),
}

/// Parses one file. Never fails.
pub fn parse(file: FileId, src: &str) -> (Module, Vec<Diag>) {
    let mut recovered = Vec::new();
    let mut literals = Vec::new();
    let result =
        grammar::ModuleParser::new().parse(file, &mut recovered, &mut literals, lexer::tokens(src));
    let mut diags = Vec::new();
    let mut module = match result {
        Ok(m) => m,
        Err(e) => {
            diags.push(parse_error(file, src, e));
            Module::default()
        }
    };
    super::depth::limit(&mut module, &mut diags);
    name_broken_items(&mut module, file, src);
    module.continuations = continuations(&module, src);
    let mut all: Vec<Diag> = recovered
        .into_iter()
        .map(|r| recovery(file, src, r))
        .collect();
    all.extend(diags);
    all.extend(literals.into_iter().map(literal_error));
    (module, all)
}

/// Gives an item that failed to parse the name it was declared with (`model m ...`), so
/// that later stages know the name exists and do not report its uses as unknown.
fn name_broken_items(module: &mut Module, file: FileId, src: &str) {
    for item in &mut module.items {
        let ItemKind::Error(name) = &mut item.kind else {
            continue;
        };
        let text = src
            .get(item.span.lo as usize..item.span.hi as usize)
            .unwrap_or("");
        let toks = lexer::lex(text);
        // (Estimators are never referred to by name, and have a namespace of their own.)
        let kw = toks
            .iter()
            .position(|(_, t, _)| matches!(t, Tok::Fn | Tok::Input | Tok::Model));
        if let Some((lo, Tok::Ident(n), hi)) = kw.and_then(|k| toks.get(k + 1)) {
            let base = item.span.lo as usize;
            *name = Some(Ident {
                name: n.to_string(),
                span: Span::new(file, base + lo, base + hi),
            });
        }
    }
}

/// Parses a lone expression (used for `--param` values). Never fails.
pub fn parse_expr(file: FileId, src: &str) -> (Expr, Vec<Diag>) {
    let mut recovered = Vec::new();
    let mut literals = Vec::new();
    let result =
        grammar::ExprParser::new().parse(file, &mut recovered, &mut literals, lexer::tokens(src));
    let mut all: Vec<Diag> = recovered
        .into_iter()
        .map(|r| recovery(file, src, r))
        .collect();
    let expr = match result {
        Ok(e) => e,
        Err(e) => {
            all.push(parse_error(file, src, e));
            Expr::new(ExprKind::Error, Span::new(file, 0, src.len()))
        }
    };
    all.extend(literals.into_iter().map(literal_error));
    (expr, all)
}

fn recovery(file: FileId, src: &str, r: ErrorRecovery<usize, Tok<'_>, Infallible>) -> Diag {
    parse_error(file, src, r.error)
}

fn parse_error(file: FileId, src: &str, e: ParseError<usize, Tok<'_>, Infallible>) -> Diag {
    match e {
        ParseError::InvalidToken { location } => Diag::new(
            Code::InvalidCharacter,
            Span::new(file, location, location + 1),
            "invalid character",
        )
        .label("no token starts here"),
        ParseError::UnrecognizedEof { location, expected } => {
            let at = location.min(src.len());
            let mut d = Diag::new(
                Code::UnexpectedEof,
                Span::new(file, at, at),
                "unexpected end of file",
            )
            .label("the file ends here")
            .help(expected_help(&expected));
            if let Some((lo, open)) = unclosed(src) {
                d = d.with(
                    Span::new(file, lo, lo + 1),
                    format!("this `{open}` is not closed"),
                );
            }
            d
        }
        ParseError::UnrecognizedToken {
            token: (lo, Tok::Error, hi),
            ..
        } => invalid_char(file, src, lo, hi),
        ParseError::UnrecognizedToken {
            token: (lo, tok, hi),
            expected,
        } => {
            let d = Diag::new(
                Code::SyntaxError,
                Span::new(file, lo, hi),
                format!("unexpected {}", tok.describe()),
            )
            .label("unexpected here");
            let leads = matches!(tok, Tok::LBrace | Tok::LParen | Tok::LBracket);
            if leads && first_on_line(src, lo) && expected.iter().any(|e| e == "\";\"") {
                d.help(LEAD_HELP)
            } else {
                d.help(expected_help(&expected))
            }
        }
        ParseError::ExtraToken {
            token: (lo, tok, hi),
        } => Diag::new(
            Code::SyntaxError,
            Span::new(file, lo, hi),
            format!("unexpected {}", tok.describe()),
        )
        .label("expected the end of the file"),
        ParseError::User { error } => match error {},
    }
}

/// The help for a statement that starts with a bracket and needs `;` before it.
pub const LEAD_HELP: &str = "a statement that starts with `(`, `[`, `{` or `-` needs `;` before it: without one, its line continues the line above (`;(x + 1.0) |> relu`)";

/// Whether the text before byte `at` on its line is blank (`at` starts the line).
fn first_on_line(src: &str, at: usize) -> bool {
    let before = src.get(..at).unwrap_or("");
    let line = before.rsplit('\n').next().unwrap_or("");
    before.contains('\n') && line.trim().is_empty()
}

/// `s` after its leading white space and comments.
fn skip_blank(mut s: &str) -> &str {
    loop {
        s = s.trim_start();
        if let Some(rest) = s.strip_prefix("//") {
            s = rest.split_once('\n').map_or("", |x| x.1);
        } else if let Some(rest) = s.strip_prefix("/*") {
            s = rest.split_once("*/").map_or("", |x| x.1);
        } else {
            return s;
        }
    }
}

/// Where a call or an index continues on a line of its own (`let y = relu(x)` and then
/// `(y + 1.0) |> relu`, which is `relu(x)(y + 1.0) |> relu`): the `(` or `[` that starts
/// the line, and the whole call or index. A later stage's diagnostic there says so
/// (`lib.rs::continued`).
fn continuations(module: &Module, src: &str) -> Vec<(Span, Span)> {
    let mut out = Vec::new();
    for item in &module.items {
        super::depth::each_expr(item, |e| {
            // (a piped call's callee is its stage's function: `x |> relu` and a line
            // `(y + 1.0)` after it are `x |> relu(y + 1.0)`)
            let callee = match &e.kind {
                ExprKind::Call { callee, .. } => callee,
                ExprKind::Index(x, _) => x,
                _ => return,
            };
            let from = callee.span.hi as usize;
            let gap = src.get(from..e.span.hi as usize).unwrap_or("");
            let rest = skip_blank(gap);
            let at = from + (gap.len() - rest.len());
            if rest.starts_with(['(', '[']) && first_on_line(src, at) {
                out.push((Span::new(e.span.file, at, at + 1), e.span));
            }
        });
    }
    out
}

/// The innermost bracket still open at the end of the text, if any.
pub(crate) fn unclosed(src: &str) -> Option<(usize, char)> {
    let mut open: Vec<(usize, char)> = Vec::new();
    for (lo, tok, _) in lexer::lex(src) {
        match tok {
            Tok::LBrace => open.push((lo, '{')),
            Tok::LParen => open.push((lo, '(')),
            Tok::LBracket => open.push((lo, '[')),
            Tok::RBrace | Tok::RParen | Tok::RBracket => {
                open.pop();
            }
            _ => {}
        }
    }
    open.pop()
}

fn invalid_char(file: FileId, src: &str, lo: usize, hi: usize) -> Diag {
    let text = src.get(lo..hi).unwrap_or("");
    if text.starts_with(|c: char| c.is_ascii_digit()) {
        return Diag::new(Code::InvalidLiteral, Span::new(file, lo, hi), format!("invalid number `{text}`"))
            .label("a number followed by letters")
            .help("numbers are decimal, such as `16`, `1_000`, `0.5` or `1e-3`; put a space or an operator between a number and a name");
    }
    let help = if text.starts_with('"') {
        "strings end with `\"` on the same line"
    } else if text.starts_with("/*") {
        "close the block comment with `*/`"
    } else if text.starts_with('#') {
        "comments start with `//`"
    } else {
        "remove this character"
    };
    let mut shown: String = text.chars().take(12).collect();
    if text.chars().count() > 12 {
        shown.push('…');
    }
    Diag::new(
        Code::InvalidCharacter,
        Span::new(file, lo, hi),
        format!("invalid character `{shown}`"),
    )
    .label("no token starts here")
    .help(help)
}

/// "expected one of `,`, `)`", with lalrpop's token names made readable.
fn expected_help(expected: &[String]) -> String {
    let mut names: Vec<String> = expected.iter().map(|e| readable_token(e)).collect();
    names.sort();
    names.dedup();
    match names.len() {
        0 => "the construct is not complete".to_string(),
        1 => format!("expected {}", names[0]),
        n if n <= 8 => format!("expected one of {}", names.join(", ")),
        _ => format!("expected one of {}, …", names[..8].join(", ")),
    }
}

fn readable_token(t: &str) -> String {
    match t {
        "IdentTok" => "a name".to_string(),
        "IntTok" => "an integer".to_string(),
        "FloatTok" => "a float".to_string(),
        "StrTok" => "a string".to_string(),
        "ErrorTok" => "a character".to_string(),
        quoted => format!("`{}`", quoted.trim_matches('"')),
    }
}

fn literal_error(e: LiteralError) -> Diag {
    match e {
        LiteralError::Int(span) => {
            Diag::new(Code::InvalidLiteral, span, "integer literal too large")
                .label("does not fit in 64 bits")
                .help("integers range from -9223372036854775808 to 9223372036854775807")
        }
        LiteralError::Float(span) => {
            Diag::new(Code::InvalidLiteral, span, "float literal out of range")
                .label("not a finite number")
                .help("write a smaller number")
        }
        LiteralError::Escape(span, at) => {
            let s = Span {
                lo: span.lo + at as u32,
                hi: span.lo + at as u32 + 2,
                ..span
            };
            Diag::new(Code::InvalidLiteral, s, "unknown escape in string")
                .label("unknown escape")
                .help("known escapes are \\n, \\t, \\\\, \\\", \\{ and \\}")
        }
    }
}

/// The value of a string token (with its quotes): escapes resolved. On an unknown escape,
/// the byte offset of its backslash within the token.
pub fn unescape(token: &str) -> Result<String, usize> {
    let inner = &token[1..token.len() - 1];
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.char_indices();
    while let Some((i, c)) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next().map(|(_, e)| e) {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some('"') => out.push('"'),
            // Kept escaped so that interpolation sees a literal brace.
            Some('{') => out.push_str("\\{"),
            Some('}') => out.push_str("\\}"),
            _ => return Err(i + 1),
        }
    }
    Ok(out)
}
