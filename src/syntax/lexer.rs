//! The lexer: turns source text into tokens with byte spans. It never fails: bytes it
//! does not understand become an `Error` token, which the parser reports and skips.

use logos::Logos;

/// A token of est. Keywords are reserved words; `train`, `eval` and `predict` are both
/// section keywords and the static values of `mode`.
#[derive(Logos, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[logos(skip r"[ \t\r\n\f]+")]
#[logos(skip(r"//[^\n]*", allow_greedy = true))]
#[logos(skip r"/\*([^*]|\*+[^*/])*\*+/")]
#[logos(skip "\u{feff}")]
pub enum Tok<'s> {
    #[token("use")]
    Use,
    #[token("pub")]
    Pub,
    #[token("as")]
    As,
    #[token("params")]
    Params,
    #[token("fn")]
    Fn,
    #[token("extern")]
    Extern,
    #[token("input")]
    Input,
    #[token("model")]
    Model,
    #[token("estimator")]
    Estimator,
    #[token("let")]
    Let,
    #[token("for")]
    For,
    #[token("in")]
    In,
    #[token("if")]
    If,
    #[token("else")]
    Else,
    #[token("train")]
    Train,
    #[token("eval")]
    Eval,
    #[token("predict")]
    Predict,
    #[token("minimize")]
    Minimize,
    #[token("with")]
    With,
    #[token("metric")]
    Metric,
    #[token("parse")]
    Parse,
    #[token("true")]
    True,
    #[token("false")]
    False,

    #[regex(r"[A-Za-z_][A-Za-z0-9_]*")]
    Ident(&'s str),
    #[regex(r"[0-9][0-9_]*")]
    Int(&'s str),
    #[regex(r"[0-9][0-9_]*\.[0-9][0-9_]*([eE][+-]?[0-9]+)?")]
    #[regex(r"[0-9][0-9_]*[eE][+-]?[0-9]+")]
    Float(&'s str),
    #[regex(r#""([^"\\\n]|\\.)*""#)]
    Str(&'s str),

    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token(",")]
    Comma,
    #[token(":")]
    Colon,
    #[token(";")]
    Semi,
    #[token(".")]
    Dot,
    #[token("..")]
    DotDot,
    #[token("=")]
    Eq,
    #[token("==")]
    EqEq,
    #[token("!=")]
    Ne,
    #[token("<")]
    Lt,
    #[token("<=")]
    Le,
    #[token(">")]
    Gt,
    #[token(">=")]
    Ge,
    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("*")]
    Star,
    #[token("/")]
    Slash,
    #[token("%")]
    Percent,
    #[token("|>")]
    Pipe,
    #[token("|")]
    Bar,
    #[token("&&")]
    AndAnd,
    #[token("||")]
    OrOr,
    #[token("!")]
    Bang,

    /// Anything the lexer does not recognise: a stray character, an unterminated string
    /// or block comment. The parser turns it into a diagnostic.
    #[regex(r"/\*([^*]|\*+[^*/])*\**", allow_greedy = true)]
    #[regex(r"[0-9][0-9_]*(\.[0-9][0-9_]*)?[A-Za-z_][A-Za-z0-9_]*", priority = 1)]
    Error,
}

impl Tok<'_> {
    /// How the token is named in "expected ..." messages.
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("identifier `{s}`"),
            Tok::Int(s) | Tok::Float(s) => format!("number `{s}`"),
            Tok::Str(_) => "a string".to_string(),
            Tok::Error => "an unrecognised character".to_string(),
            other => format!("`{}`", other.text()),
        }
    }

    /// The fixed text of a keyword or punctuation token.
    pub fn text(&self) -> &str {
        match self {
            Tok::Use => "use",
            Tok::Pub => "pub",
            Tok::As => "as",
            Tok::Params => "params",
            Tok::Fn => "fn",
            Tok::Extern => "extern",
            Tok::Input => "input",
            Tok::Model => "model",
            Tok::Estimator => "estimator",
            Tok::Let => "let",
            Tok::For => "for",
            Tok::In => "in",
            Tok::If => "if",
            Tok::Else => "else",
            Tok::Train => "train",
            Tok::Eval => "eval",
            Tok::Predict => "predict",
            Tok::Minimize => "minimize",
            Tok::With => "with",
            Tok::Metric => "metric",
            Tok::Parse => "parse",
            Tok::True => "true",
            Tok::False => "false",
            Tok::Ident(s) | Tok::Int(s) | Tok::Float(s) | Tok::Str(s) => s,
            Tok::LBrace => "{",
            Tok::RBrace => "}",
            Tok::LParen => "(",
            Tok::RParen => ")",
            Tok::LBracket => "[",
            Tok::RBracket => "]",
            Tok::Comma => ",",
            Tok::Colon => ":",
            Tok::Semi => ";",
            Tok::Dot => ".",
            Tok::DotDot => "..",
            Tok::Eq => "=",
            Tok::EqEq => "==",
            Tok::Ne => "!=",
            Tok::Lt => "<",
            Tok::Le => "<=",
            Tok::Gt => ">",
            Tok::Ge => ">=",
            Tok::Plus => "+",
            Tok::Minus => "-",
            Tok::Star => "*",
            Tok::Slash => "/",
            Tok::Percent => "%",
            Tok::Pipe => "|>",
            Tok::Bar => "|",
            Tok::AndAnd => "&&",
            Tok::OrOr => "||",
            Tok::Bang => "!",
            Tok::Error => "<error>",
        }
    }
}

/// A token with its byte range in the source.
pub type Spanned<'s> = (usize, Tok<'s>, usize);

/// Lexes the whole source. Never fails: unknown bytes become `Tok::Error`.
pub fn lex(src: &str) -> Vec<Spanned<'_>> {
    let mut lexer = Tok::lexer(src);
    let mut out = Vec::new();
    while let Some(tok) = lexer.next() {
        let span = lexer.span();
        let tok = tok.unwrap_or(Tok::Error);
        out.push((span.start, tok, span.end));
    }
    out
}

/// Whether a text is exactly one name (an identifier that is not a keyword).
pub fn is_name(text: &str) -> bool {
    matches!(lex(text).as_slice(), [(0, Tok::Ident(n), _)] if n.len() == text.len())
}

/// The lexer as the iterator lalrpop wants: it never yields an error of its own.
pub fn tokens(src: &str) -> impl Iterator<Item = Result<Spanned<'_>, std::convert::Infallible>> {
    lex(src).into_iter().map(Ok)
}
