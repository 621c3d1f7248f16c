//! UI tests: every `tests/ui/**/*.est` is checked and its rendered diagnostics compared
//! with a snapshot (`tests/snapshots/`; bless with `INSTA_UPDATE=always` or
//! `cargo insta review`). A file named after a code (`E0401_...est`) must report that
//! code; a file under `ui/pass/` must report nothing on the host, and on the wafer
//! nothing but E0601 (what the wafer compiler cannot lay out yet: those programs'
//! snapshots list it, so that closing a gap shows in them).

mod common;

use est::diag::render::{render_all, Style};
use est::elab::Target;

#[test]
fn ui() {
    insta::glob!("ui/**/*.est", |path| {
        let name = common::rel(path);
        let text = std::fs::read_to_string(path).expect("readable");
        let d = common::directives(&text);
        let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let must_pass = name.contains("/ui/pass/");
        let targets = if must_pass {
            vec![Target::Host, Target::Wafer]
        } else {
            d.targets.clone()
        };
        let mut out = String::new();
        for target in targets {
            let (program, checked) = common::check_file(path, &name, target, &d);
            if must_pass {
                let codes: Vec<&str> = checked.diags.iter().map(|x| x.code.id()).collect();
                let clean = match target {
                    Target::Wafer => codes.iter().all(|&c| c == "E0601"),
                    _ => codes.is_empty(),
                };
                assert!(
                    clean,
                    "{name} must check clean on {}, got {codes:?}",
                    target.name()
                );
            }
            let code = stem.split('_').next().unwrap_or("");
            if est::diag::Code::from_id(code).is_some() {
                assert!(
                    checked.diags.iter().any(|x| x.code.id() == code),
                    "{name} must report {code}, got {:?}",
                    checked
                        .diags
                        .iter()
                        .map(|x| x.code.id())
                        .collect::<Vec<_>>()
                );
            }
            out.push_str(&render_all(
                &checked.diags,
                &program.sources,
                Style::plain(),
            ));
        }
        insta::assert_snapshot!(out);
    });
}

/// Every code of the catalogue has at least one failing UI program, but the run-time
/// codes (E09xx and W09xx), which tests/runtime.rs and tests/reliability.rs cover.
#[test]
fn every_code_has_a_ui_test() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui");
    let mut stems = Vec::new();
    let mut dirs = vec![root];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("ui dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if let Some(s) = p.file_stem().and_then(|s| s.to_str()) {
                stems.push(s.to_string());
            }
        }
    }
    let missing: Vec<&str> = est::diag::Code::all()
        .iter()
        .map(|c| c.id)
        .filter(|id| !id[1..].starts_with("09"))
        .filter(|id| !stems.iter().any(|s| s.starts_with(id)))
        .collect();
    assert!(missing.is_empty(), "codes without a UI test: {missing:?}");
}
