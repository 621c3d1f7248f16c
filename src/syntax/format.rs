//! `estc fmt`: one canonical layout for `.est` files, as `gofmt` draws it. The line
//! breaks are the writer's (blank lines collapse to one); everything else is the
//! formatter's:
//!
//! - indentation: two spaces for each line that opened a bracket still open (however
//!   many it opened), and one more for a line that continues an expression (it starts
//!   with `|>`, `.`, `=` or a binary operator, or the line above ends with one);
//! - spacing: none inside brackets and around `.` and `..`, before `,` `;` `:` and
//!   after a unary operator or a closure's opening `|`; one around binary operators,
//!   after `,` `;` `:`, and inside braces (`{ a: 1 }`); two between estimator or
//!   params fields that share a line;
//! - comments: kept where they are, with their text (a block comment's lines end with
//!   LF, as every line does); a full-line comment takes the indentation of the code
//!   below it, and the trailing comments of consecutive lines line up two spaces
//!   after the longest of their code.
//!
//! It works on tokens, so it never changes the program: the formatted text is lexed
//! again and must have the same tokens and comments, or the formatter refuses
//! (`Unchanged`), a bug to report. A file with syntax errors is not formatted.

use super::ast::{Field, FieldValue, ItemKind, Module};
use super::lexer::{lex, Tok};
use crate::diag::{Diag, Severity};
use crate::span::FileId;

/// One indentation level.
const INDENT: &str = "  ";

/// Why a file was not formatted.
#[derive(Debug)]
pub enum FormatError {
    /// It has syntax errors (these).
    Syntax(Vec<Diag>),
    /// The formatted text would not lex to the same tokens and comments (a formatter
    /// bug): the 1-based line of the original where they part.
    Unchanged(usize),
}

/// Formats one file's text.
pub fn format(file: FileId, src: &str) -> Result<String, FormatError> {
    let (module, diags) = super::parse(file, src);
    let errors: Vec<Diag> = diags
        .into_iter()
        .filter(|d| d.severity() == Severity::Error)
        .collect();
    if !errors.is_empty() {
        return Err(FormatError::Syntax(errors));
    }
    let input = pieces(src);
    let out = layout(src, &input, &field_starts(&module));
    let (before, after) = (parts(&input), parts(&pieces(&out)));
    if before == after {
        return Ok(out);
    }
    // where they part: the first piece that differs, or the end of the shorter
    let at = before.iter().zip(&after).position(|(a, b)| a != b);
    let lo = input
        .get(at.unwrap_or(before.len().min(after.len())))
        .map_or(src.len(), |p| p.lo);
    Err(FormatError::Unchanged(1 + src[..lo].matches('\n').count()))
}

/// The byte offsets where estimator and params fields start (two spaces set apart
/// fields that share a line).
fn field_starts(m: &Module) -> Vec<usize> {
    fn fields(fs: &[Field], out: &mut Vec<usize>) {
        for f in fs {
            out.push(f.name.span.lo as usize);
            if let FieldValue::Block(inner, _) = &f.value {
                fields(inner, out);
            }
        }
    }
    let mut out = Vec::new();
    for it in &m.items {
        match &it.kind {
            ItemKind::Estimator(e) => fields(&e.fields, &mut out),
            ItemKind::Params(ps) => out.extend(ps.iter().map(|p| p.name.span.lo as usize)),
            _ => {}
        }
    }
    out.sort_unstable();
    out
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind<'s> {
    Tok(Tok<'s>),
    LineComment,
    BlockComment,
}

/// A token or a comment, with its text and where it starts.
#[derive(Debug, Clone, Copy)]
struct Piece<'s> {
    kind: Kind<'s>,
    text: &'s str,
    lo: usize,
}

impl Piece<'_> {
    fn tok(&self) -> Option<Tok<'_>> {
        match self.kind {
            Kind::Tok(t) => Some(t),
            _ => None,
        }
    }
}

/// What formatting must keep: every token, and every comment's text (without the
/// spaces that end a line comment).
fn parts<'s>(pieces: &[Piece<'s>]) -> Vec<(Kind<'s>, std::borrow::Cow<'s, str>)> {
    pieces.iter().map(|p| (p.kind, written(p))).collect()
}

/// A piece as the formatter writes it: a line comment without the spaces that end it,
/// a block comment's lines ended by LF.
fn written<'s>(p: &Piece<'s>) -> std::borrow::Cow<'s, str> {
    match p.kind {
        Kind::LineComment => p.text.trim_end().into(),
        Kind::BlockComment if p.text.contains('\r') => p.text.replace("\r\n", "\n").into(),
        _ => p.text.into(),
    }
}

/// The tokens and comments of a text, in order.
fn pieces(src: &str) -> Vec<Piece<'_>> {
    let mut out = Vec::new();
    let mut at = 0;
    for (lo, tok, hi) in lex(src) {
        comments(src, at, lo, &mut out);
        out.push(Piece {
            kind: Kind::Tok(tok),
            text: &src[lo..hi],
            lo,
        });
        at = hi;
    }
    comments(src, at, src.len(), &mut out);
    out
}

/// The comments between two tokens (the lexer skips them with the white space).
fn comments<'s>(src: &'s str, lo: usize, hi: usize, out: &mut Vec<Piece<'s>>) {
    let gap = &src[lo..hi];
    let mut i = 0;
    while i < gap.len() {
        let rest = &gap[i..];
        let (kind, len) = if rest.starts_with("//") {
            (Kind::LineComment, rest.find('\n').unwrap_or(rest.len()))
        } else if let Some(body) = rest.strip_prefix("/*") {
            (
                Kind::BlockComment,
                body.find("*/").map_or(rest.len(), |e| e + 4),
            )
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        out.push(Piece {
            kind,
            text: &rest[..len],
            lo: lo + i,
        });
        i += len;
    }
}

/// A line of the input: its pieces, and whether blank lines came before it.
struct Line<'s> {
    pieces: Vec<Piece<'s>>,
    blank_before: bool,
}

/// The input's lines, with the pieces (of `src`) each has.
fn lines<'s>(src: &str, pieces: &[Piece<'s>]) -> Vec<Line<'s>> {
    let mut out: Vec<Line<'s>> = Vec::new();
    let mut end = 0;
    for &p in pieces {
        let breaks = src[end..p.lo].matches('\n').count();
        match out.last_mut() {
            Some(l) if breaks == 0 => l.pieces.push(p),
            _ => out.push(Line {
                pieces: vec![p],
                blank_before: breaks > 1,
            }),
        }
        end = p.lo + p.text.len();
    }
    out
}

fn is_open(t: Tok<'_>) -> bool {
    matches!(t, Tok::LParen | Tok::LBracket | Tok::LBrace)
}

fn is_close(t: Tok<'_>) -> bool {
    matches!(t, Tok::RParen | Tok::RBracket | Tok::RBrace)
}

fn is_binary(t: Tok<'_>) -> bool {
    matches!(
        t,
        Tok::Plus
            | Tok::Minus
            | Tok::Star
            | Tok::Slash
            | Tok::Percent
            | Tok::EqEq
            | Tok::Ne
            | Tok::Lt
            | Tok::Le
            | Tok::Gt
            | Tok::Ge
            | Tok::AndAnd
            | Tok::OrOr
            | Tok::Pipe
            | Tok::Eq
            | Tok::Dot
            | Tok::DotDot
            | Tok::With
    )
}

/// Whether a token ends an operand (so that a `-` after it is binary).
fn ends_operand(t: Tok<'_>) -> bool {
    matches!(
        t,
        Tok::Ident(_)
            | Tok::Int(_)
            | Tok::Float(_)
            | Tok::Str(_)
            | Tok::True
            | Tok::False
            | Tok::Params
            | Tok::Model
            | Tok::Input
            | Tok::Parse
            | Tok::Train
            | Tok::Eval
            | Tok::Predict
            | Tok::RParen
            | Tok::RBracket
            | Tok::RBrace
    )
}

/// What the spacing before a piece depends on besides the two pieces.
#[derive(Clone, Copy, Default)]
struct Around {
    /// The previous piece is a unary `-` or `!`.
    after_unary: bool,
    /// The previous piece opens a closure's parameters; this one closes them.
    after_open_bar: bool,
    closing_bar: bool,
    /// This piece starts a field that shares its line with another.
    field: bool,
    /// The previous piece opens a `use` list (`std.nn.{dense, relu}`), or this one
    /// closes it: no space inside.
    after_list: bool,
    closing_list: bool,
}

/// The space between two pieces of one line.
fn space(prev: &Piece<'_>, next: &Piece<'_>, at: Around) -> &'static str {
    let (p, n) = (prev.tok(), next.tok());
    if p.is_some_and(|t| matches!(t, Tok::LParen | Tok::LBracket)) {
        return "";
    }
    if n.is_some_and(|t| {
        matches!(
            t,
            Tok::RParen | Tok::RBracket | Tok::Comma | Tok::Semi | Tok::Colon
        )
    }) {
        return "";
    }
    let (Some(p), Some(n)) = (p, n) else {
        return " ";
    };
    if p == Tok::Bar && n == Tok::Bar {
        return " "; // `| |`, an empty parameter list, is not `||`
    }
    if at.after_open_bar || at.closing_bar || at.after_unary || at.after_list || at.closing_list {
        return "";
    }
    match (p, n) {
        (_, Tok::LParen | Tok::LBracket) => {
            if matches!(
                p,
                Tok::Ident(_) | Tok::Parse | Tok::RParen | Tok::RBracket | Tok::Str(_)
            ) {
                ""
            } else {
                " "
            }
        }
        (Tok::Dot | Tok::DotDot, _) | (_, Tok::Dot | Tok::DotDot) => "",
        (Tok::LBrace, Tok::RBrace) => "",
        _ if at.field && !matches!(p, Tok::LBrace | Tok::Semi | Tok::Comma) => "  ",
        _ => " ",
    }
}

/// A line laid out: its indentation level, its code, its trailing line comment, and
/// whether it ends by opening a bracket or starts by closing one.
struct Laid<'s> {
    level: usize,
    code: String,
    trailing: Option<&'s str>,
    opens: bool,
    closes: bool,
}

impl Laid<'_> {
    /// Its width without the trailing comment.
    fn width(&self) -> usize {
        self.level * INDENT.len() + self.code.chars().count()
    }
}

/// Lays out the text whose pieces are `pieces` (see the module's documentation).
fn layout(src: &str, pieces: &[Piece<'_>], fields: &[usize]) -> String {
    let lines = lines(src, pieces);
    let mut laid: Vec<Laid<'_>> = Vec::with_capacity(lines.len());
    // the open brackets: the level of the line that opened each, and whether it is a
    // `use` list
    let mut stack: Vec<(usize, bool)> = Vec::new();
    let mut last: Option<Tok<'_>> = None;
    let mut in_params = false;
    // comment-only lines wait for the next line of code, whose indentation they take
    let mut waiting: Vec<usize> = Vec::new();
    for line in &lines {
        let first = line.pieces.iter().find_map(Piece::tok);
        let inner = stack.last().map_or(0, |s| s.0 + 1);
        let level = match first {
            None => inner,
            Some(t) if is_close(t) => stack.last().map_or(0, |s| s.0),
            // (a `-` after a comma or a bracket is a negation, not a continuation)
            Some(t)
                if (is_binary(t) && (t != Tok::Minus || last.is_some_and(ends_operand)))
                    || last.is_some_and(is_binary) =>
            {
                inner + 1
            }
            Some(_) => inner,
        };
        if first.is_some() {
            for w in waiting.drain(..) {
                laid[w].level = if first.is_some_and(is_close) {
                    inner
                } else {
                    level
                };
            }
        }
        let mut code = String::new();
        let mut trailing = None;
        let mut prev: Option<Piece<'_>> = None;
        let mut after_unary = false;
        let mut after_open_bar = false;
        let mut after_list = false;
        for (k, p) in line.pieces.iter().enumerate() {
            if p.kind == Kind::LineComment && k + 1 == line.pieces.len() && k > 0 {
                trailing = Some(p.text.trim_end());
                break;
            }
            let tok = p.tok();
            let mut at = Around {
                after_unary,
                after_open_bar,
                after_list,
                closing_list: tok == Some(Tok::RBrace) && stack.last().is_some_and(|s| s.1),
                ..Around::default()
            };
            if tok == Some(Tok::Bar) {
                at.closing_bar = in_params;
            }
            at.field = k > 0 && fields.binary_search(&p.lo).is_ok();
            if let Some(q) = &prev {
                code.push_str(space(q, p, at));
            }
            code.push_str(&written(p));
            after_unary = false;
            after_open_bar = false;
            after_list = false;
            if let Some(t) = tok {
                match t {
                    Tok::Minus => after_unary = !last.is_some_and(ends_operand),
                    Tok::Bang => after_unary = true,
                    Tok::Bar => {
                        after_open_bar = !in_params;
                        in_params = !in_params;
                    }
                    _ if is_open(t) => {
                        after_list = t == Tok::LBrace && last == Some(Tok::Dot);
                        stack.push((level, after_list));
                    }
                    _ if is_close(t) => {
                        stack.pop();
                    }
                    _ => {}
                }
                last = Some(t);
            }
            prev = Some(*p);
        }
        if first.is_none() {
            waiting.push(laid.len());
        }
        let opens = (line.pieces.iter().rev())
            .find_map(Piece::tok)
            .is_some_and(is_open);
        laid.push(Laid {
            level,
            code,
            trailing,
            opens,
            closes: first.is_some_and(is_close),
        });
    }
    // a blank line stays before a line, unless it follows a line that opens a bracket
    // or comes before one that closes one (nor at the start)
    let blank: Vec<bool> = (0..laid.len())
        .map(|k| k > 0 && lines[k].blank_before && !laid[k - 1].opens && !laid[k].closes)
        .collect();
    // trailing comments of consecutive lines (in the output) line up
    let mut column = vec![0; laid.len()];
    let mut i = 0;
    while i < laid.len() {
        let mut j = i;
        while j < laid.len() && laid[j].trailing.is_some() && (j == i || !blank[j]) {
            j += 1;
        }
        if j == i {
            i += 1;
            continue;
        }
        let col = laid[i..j].iter().map(Laid::width).max().unwrap_or(0) + 2;
        column[i..j].fill(col);
        i = j;
    }
    let mut out = String::with_capacity(src.len() + src.len() / 8);
    for (k, l) in laid.iter().enumerate() {
        if blank[k] {
            out.push('\n');
        }
        for _ in 0..l.level {
            out.push_str(INDENT);
        }
        out.push_str(&l.code);
        if let Some(c) = l.trailing {
            let pad = column[k].saturating_sub(l.width()).max(1);
            out.extend(std::iter::repeat_n(' ', pad));
            out.push_str(c);
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fmt(src: &str) -> String {
        match format(FileId(0), src) {
            Ok(s) => s,
            Err(e) => panic!("{e:?}"),
        }
    }

    #[test]
    fn spacing_indentation_and_comments() {
        let src = "use std.nn.{ dense,relu }\nfn g() { [\n-1,\n  - 2] }\nparams {   // the params\n  batch_size:int=128   // per run\n     hidden: [int] = [ 256,256 ]\n}\n\n\n\nfn f( x ,y:int ) {x*-1+y |>relu}\nmodel m(features: f32[B,4]) {\n        let a=features\n    |> map |r|r\n// a comment\n        let b = a .. 3\ntrain{minimize a with sgd(lr:0.1)}\n}\nestimator e {model=m  train_input=i()   train_steps=1}\n";
        let want = "use std.nn.{dense, relu}\nfn g() { [\n  -1,\n  -2] }\nparams {                 // the params\n  batch_size: int = 128  // per run\n  hidden: [int] = [256, 256]\n}\n\nfn f(x, y: int) { x * -1 + y |> relu }\nmodel m(features: f32[B, 4]) {\n  let a = features\n    |> map |r| r\n  // a comment\n  let b = a..3\n  train { minimize a with sgd(lr: 0.1) }\n}\nestimator e { model = m  train_input = i()  train_steps = 1 }\n";
        assert_eq!(fmt(src), want);
        assert_eq!(fmt(want), want);
    }

    #[test]
    fn trailing_comments_line_up_as_the_output_has_them() {
        // the blank line after `{` goes, so the two comments become neighbours
        let src = "params {  // the params\n\n  batch_size: int = 8  // per run\n}\n";
        let want = "params {               // the params\n  batch_size: int = 8  // per run\n}\n";
        assert_eq!(fmt(src), want);
        assert_eq!(fmt(want), want);
        // a block comment, CRLF line ends, a byte-order mark, a comment at the end
        let src = "\u{feff}fn f(x) {\r\n  /* a\r\n b */ x\r\n}\r\n// end";
        let want = "fn f(x) {\n  /* a\n b */ x\n}\n// end\n";
        assert_eq!(fmt(src), want);
        assert_eq!(fmt(want), want);
    }

    #[test]
    fn refuses_syntax_errors() {
        assert!(matches!(
            format(FileId(0), "fn f( {"),
            Err(FormatError::Syntax(d)) if !d.is_empty()
        ));
    }
}
