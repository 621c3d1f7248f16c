//! Fuzzes the whole front end: any bytes, as a program, are lexed, parsed, resolved,
//! elaborated for every mode on both targets and run through the passes with the IR
//! verifier on. Nothing may panic, and no pass may break the IR.

#![no_main]

use est::elab::Target;
use est::{check, CheckOptions, Program};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let program = Program::from_source("fuzz.est", text, None);
    for target in [Target::Host, Target::Wafer] {
        // A small step budget keeps every input fast; the budget itself is under test.
        let opts = CheckOptions { target, verify: true, max_steps: 200_000, ..CheckOptions::default() };
        let checked = check(&program, &opts);
        assert!(checked.bug.is_none(), "{:?}", checked.bug);
    }
});
