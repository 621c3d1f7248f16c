//! IR tests: each `tests/ir/*.est` ends in `// CHECK: text` and `// CHECK-NOT: text`
//! lines matched against the text dump of its graphs, in order (like LLVM's FileCheck):
//! every CHECK must appear after the previous one; a CHECK-NOT must not appear between
//! the CHECKs around it. `// mode:` and `// target:` directives choose the graphs.

mod common;

enum Check<'a> {
    Has(&'a str),
    Not(&'a str),
}

fn checks(text: &str) -> Vec<Check<'_>> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim();
            if let Some(s) = l.strip_prefix("// CHECK-NOT:") {
                Some(Check::Not(s.trim()))
            } else {
                l.strip_prefix("// CHECK:").map(|s| Check::Has(s.trim()))
            }
        })
        .collect()
}

fn file_check(name: &str, dump: &str, checks: &[Check<'_>]) {
    let mut pos = 0;
    let mut nots: Vec<&str> = Vec::new();
    for c in checks {
        match c {
            Check::Not(s) => nots.push(s),
            Check::Has(s) => {
                let Some(i) = dump[pos..].find(s) else {
                    panic!("{name}: CHECK `{s}` not found after byte {pos} of:\n{dump}");
                };
                for n in nots.drain(..) {
                    assert!(
                        !dump[pos..pos + i].contains(n),
                        "{name}: CHECK-NOT `{n}` found before `{s}` in:\n{dump}"
                    );
                }
                pos += i + s.len();
            }
        }
    }
    for n in nots {
        assert!(
            !dump[pos..].contains(n),
            "{name}: CHECK-NOT `{n}` found in:\n{dump}"
        );
    }
}

#[test]
fn ir() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ir");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/ir")
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    assert!(files.len() >= 4, "expected IR tests in {}", dir.display());
    for path in files
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "est"))
    {
        let name = common::rel(path);
        let text = std::fs::read_to_string(path).expect("readable");
        let d = common::directives(&text);
        let (_, checked) = common::check_file(path, &name, d.targets[0], &d);
        let errors: Vec<String> = checked
            .diags
            .iter()
            .map(|x| format!("{} {}", x.code.id(), x.message))
            .collect();
        assert!(!checked.has_errors(), "{name} has errors: {errors:?}");
        let mut dump = String::new();
        for c in &checked.graphs {
            dump.push_str(&est::ir::dump_text(
                &c.graph,
                &format!("{}/{}/{}", c.estimator, c.mode.name(), c.target.name()),
            ));
        }
        file_check(&name, &dump, &checks(&text));
    }
}
