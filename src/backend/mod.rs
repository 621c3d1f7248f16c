//! Backends: what executes checked graphs.

pub mod interp;
