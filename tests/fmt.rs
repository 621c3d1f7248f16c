//! `estc fmt` over the whole corpus: every example, standard library file, test program
//! and fuzz seed. Formatting is idempotent, and never changes a program: each program
//! checked with every file formatted (its own, its imports' and the standard
//! library's) has the same IR graphs, in every mode, and the same diagnostics, as
//! before.

use est::span::FileId;
use est::syntax::format::{format, FormatError};
use est::{CheckOptions, Program};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn est_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            est_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "est") {
            out.push(p);
        }
    }
}

fn corpus() -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in ["examples", "stdlib", "tests/ui", "tests/ir", "fuzz/seeds"] {
        est_files(Path::new(d), &mut out);
    }
    out
}

/// What a check gives, without places: each graph's IR, and each diagnostic's code,
/// message and labels.
fn outcome(p: &Program) -> Vec<String> {
    let checked = est::check(p, &CheckOptions::default());
    let mut out: Vec<String> = checked
        .graphs
        .iter()
        .map(|c| est::ir::dump_text(&c.graph, &format!("{}/{}", c.estimator, c.mode.name())))
        .collect();
    for d in &checked.diags {
        let labels: Vec<&str> = std::iter::once(&d.primary)
            .chain(&d.secondary)
            .map(|l| l.text.as_str())
            .collect();
        out.push(format!(
            "{} {} {labels:?} {:?}",
            d.code.id(),
            d.message,
            d.help
        ));
    }
    out
}

#[test]
fn formatting_the_corpus_is_idempotent_and_keeps_every_program() {
    let files = corpus();
    assert!(files.len() > 150, "{} files", files.len());
    let mut formatted: HashMap<PathBuf, String> = HashMap::new();
    let (mut changed, mut unparsed) = (0, 0);
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        match format(FileId(0), &text) {
            Ok(out) => {
                let again = format(FileId(0), &out).unwrap_or_else(|e| panic!("{f:?}: {e:?}"));
                assert_eq!(again, out, "{f:?}: formatting twice changed it");
                changed += usize::from(out != text);
                // the indentation is the formatter's: the text without it formats alike
                if !text.contains("/*") {
                    let flat: String = text
                        .lines()
                        .map(|l| format!("{}\n", l.trim_start()))
                        .collect();
                    let again = format(FileId(0), &flat).unwrap_or_else(|e| panic!("{f:?}: {e:?}"));
                    assert_eq!(again, out, "{f:?}: the indentation depends on the input's");
                }
                formatted.insert(f.canonicalize().unwrap(), out);
            }
            // only programs that test syntax errors do not parse
            Err(FormatError::Syntax(d)) => {
                assert!(f.starts_with("tests/ui"), "{f:?}: {d:?}");
                assert!(d.iter().all(|d| d.code.id().starts_with("E01")), "{d:?}");
                unparsed += 1;
            }
            Err(e) => panic!("{f:?}: {e:?}"),
        }
    }
    // (the test programs are not all written in the canonical layout, so formatting
    // them is tested)
    assert!(changed > 10, "{changed} files changed");
    assert!(unparsed < 20, "{unparsed} files do not parse");
    let std_text: HashMap<String, String> = est::program::STDLIB
        .iter()
        .map(|(_, file, _)| {
            let path = Path::new(file).canonicalize().unwrap();
            (file.to_string(), formatted[&path].clone())
        })
        .collect();
    let all = Arc::new(formatted);
    let mut programs = 0;
    for f in files.iter().filter(|f| !f.starts_with("stdlib")) {
        let Some(text) = all.get(&f.canonicalize().unwrap()) else {
            continue;
        };
        let before = Program::load(f).unwrap_or_else(|e| panic!("{f:?}: {}", e.0));
        let (files, std) = (all.clone(), std_text.clone());
        let overlay: est::program::Overlay = Arc::new(move |p: &Path| {
            let key = p.to_string_lossy();
            std.get(key.as_ref())
                .cloned()
                .or_else(|| files.get(&p.canonicalize().ok()?).cloned())
        });
        let after = Program::load_with(f, text, overlay);
        assert_eq!(
            after.sources.files().count(),
            before.sources.files().count(),
            "{f:?}"
        );
        assert_eq!(outcome(&before), outcome(&after), "{f:?}");
        programs += 1;
    }
    assert!(programs > 130, "{programs} programs compared");
}
