//! est: a compiler for declarative machine-learning programs.

pub mod diag;
pub mod span;
pub mod syntax;
