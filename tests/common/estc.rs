//! Running the `estc` binary from the crate's root, for the suites that test it as a
//! user runs it (`tests/hardening.rs`, `tests/hardening_results.rs`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `estc args`, run from the crate's root.
pub fn estc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_estc"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("estc runs")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `o`, after checking that it succeeded.
pub fn ok(o: Output) -> Output {
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    o
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}
