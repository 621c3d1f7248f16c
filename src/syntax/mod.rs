//! Syntax: the lexer, the generated parser and the AST.

pub mod ast;
pub mod depth;
pub mod format;
pub mod lexer;
pub mod parser;

pub use parser::{parse, parse_expr};
