//! Helpers shared by the data-driven test suites: reading a test file's directives and
//! checking it the way `estc check` would.

#![allow(dead_code)]

use est::elab::Target;
use est::syntax::ast::SectionKind;
use est::{check, CheckOptions, Checked, Program};
use std::path::Path;

/// `// target: wafer`, `// mode: train`, `// param: k=v` lines at the top of a file.
pub struct Directives {
    pub targets: Vec<Target>,
    pub modes: Vec<SectionKind>,
    pub params: Vec<(String, String)>,
    /// `// max_steps: N`, the elaboration budget (to test it without waiting).
    pub max_steps: Option<u64>,
    /// `// max_source_bytes: N`, the size limit of imported files (to test it without
    /// files of 16 MiB).
    pub max_source_bytes: Option<u64>,
    /// `// memory_limit: BYTES`, the memory a graph's run may need (E0602); 16 GiB
    /// otherwise, so that results do not depend on the machine.
    pub memory_limit: u64,
    /// `// wafer: CONFIG`, the fabric `target: wafer` lays the program out on: a named
    /// config or a `.toml` file relative to the crate's root (`test32` otherwise).
    pub fabric: Option<est::backend::wafer::fabric::Fabric>,
}

/// The memory limit of the tests (see `Directives::memory_limit`).
pub const TEST_MEMORY_LIMIT: u64 = 16 << 30;

pub fn directives(text: &str) -> Directives {
    let mut d = Directives {
        targets: Vec::new(),
        modes: Vec::new(),
        params: Vec::new(),
        max_steps: None,
        max_source_bytes: None,
        memory_limit: TEST_MEMORY_LIMIT,
        fabric: None,
    };
    for line in text
        .lines()
        .take_while(|l| l.trim_start().starts_with("//"))
    {
        let line = line.trim_start().trim_start_matches('/').trim();
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "target" => d.targets.push(if v == "wafer" {
                Target::Wafer
            } else {
                Target::Host
            }),
            "mode" => d.modes.push(match v {
                "train" => SectionKind::Train,
                "eval" => SectionKind::Eval,
                _ => SectionKind::Predict,
            }),
            "wafer" => {
                let arg = if v.ends_with(".toml") {
                    root().join(v).to_string_lossy().into_owned()
                } else {
                    v.to_string()
                };
                d.fabric = Some(est::backend::wafer::fabric::resolve(&arg).expect("a fabric"));
            }
            "max_steps" => d.max_steps = v.parse().ok(),
            "max_source_bytes" => d.max_source_bytes = v.parse().ok(),
            "memory_limit" => d.memory_limit = v.parse().unwrap_or(TEST_MEMORY_LIMIT),
            "param" => {
                if let Some((pk, pv)) = v.split_once('=') {
                    d.params
                        .push((pk.trim().to_string(), pv.trim().to_string()));
                }
            }
            _ => {}
        }
    }
    if d.targets.is_empty() {
        d.targets.push(Target::Host);
    }
    if d.modes.is_empty() {
        d.modes = vec![SectionKind::Train, SectionKind::Eval, SectionKind::Predict];
    }
    d
}

/// Loads `path` under the display name `name` and checks it for one target.
pub fn check_file(path: &Path, name: &str, target: Target, d: &Directives) -> (Program, Checked) {
    let text = std::fs::read_to_string(path).expect("test file is readable");
    let limit = d.max_source_bytes.unwrap_or(est::program::MAX_SOURCE_BYTES);
    let mut program =
        Program::from_source_with_limit(name, &text, path.parent().map(Path::to_path_buf), limit);
    for (k, v) in &d.params {
        program.add_override(k, v, &format!("--param {k}"));
    }
    let mut opts = CheckOptions {
        target,
        modes: d.modes.clone(),
        verify: true,
        memory_limit: Some(d.memory_limit),
        fabric: d.fabric.clone(),
        ..CheckOptions::default()
    };
    if let Some(m) = d.max_steps {
        opts.max_steps = m;
    }
    let checked = check(&program, &opts);
    assert!(
        checked.bug.is_none(),
        "{name}: compiler bug: {:?}",
        checked.bug
    );
    (program, checked)
}

/// The path of `path` relative to the crate, with `/` separators (stable in snapshots).
pub fn rel(path: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// The crate's root directory.
pub fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The programs of `examples/`, sorted.
pub fn example_files() -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(root().join("examples"))
        .expect("examples/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "est"))
        .collect();
    v.sort();
    v
}

/// A fresh directory for one test of one suite (`suite` names it).
pub fn scratch(suite: &str, name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("est-{suite}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// An estimator of the program `file` (from the crate's root) on `target`, with its
/// model directory at `dir`; the codes of its diagnostics if it cannot be made.
pub fn estimator(
    file: &str,
    target: Target,
    dir: &Path,
) -> Result<est::runtime::Estimator, Vec<est::diag::Code>> {
    let p = Program::load(&root().join(file)).unwrap();
    let opts = est::runtime::RunOptions {
        target,
        model_dir: Some(dir.to_path_buf()),
        ..Default::default()
    };
    est::runtime::Estimator::new(&p, &opts).map_err(|f| f.diags.iter().map(|d| d.code).collect())
}

/// The largest difference between two sets of variables, relative to the largest
/// magnitude of each variable (so that a weight near zero is not held to a relative
/// bound its neighbours' rounding cannot meet).
pub fn worst(
    a: &rustc_hash::FxHashMap<String, est::tensor::Tensor>,
    b: &rustc_hash::FxHashMap<String, est::tensor::Tensor>,
) -> f64 {
    worst_above(a, b, 1e-6)
}

/// `worst`, each variable's magnitude taken as at least `floor`.
pub fn worst_above(
    a: &rustc_hash::FxHashMap<String, est::tensor::Tensor>,
    b: &rustc_hash::FxHashMap<String, est::tensor::Tensor>,
    floor: f64,
) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0f64;
    for (k, x) in a {
        let (x, y) = (x.to_f64(), b[k].to_f64());
        let scale = x.iter().fold(floor, |m, v| m.max(v.abs()));
        for (p, q) in x.iter().zip(&y) {
            worst = worst.max((p - q).abs() / scale);
        }
    }
    worst
}

/// The data each example reads in the example-wide tests: generated MNIST-shaped
/// records for the MNIST examples (written by the suite's `mnist::write`), the digits as
/// TFRecord shards for digits_tfrecord, and the examples' own files for the others.
pub struct ExampleData {
    mnist: std::path::PathBuf,
    shards: std::path::PathBuf,
}

impl ExampleData {
    pub fn new(suite: &str, write_mnist: fn(&Path, u32)) -> ExampleData {
        let mnist = scratch(suite, "mnist-data");
        write_mnist(&mnist, 320);
        let shards = scratch(suite, "digits-tfrecord");
        digits_tfrecord(&shards);
        ExampleData { mnist, shards }
    }

    /// The data directory of example `name` (`None`: its own).
    pub fn dir(&self, name: &str) -> Option<std::path::PathBuf> {
        if name.contains("mnist") {
            Some(self.mnist.clone())
        } else if name == "digits_tfrecord" {
            Some(self.shards.clone())
        } else {
            None
        }
    }
}

/// The digits CSVs as TFRecord shards in `dir/data/tfrecord` (what `make demo` writes
/// with `estc data convert`), for `examples/digits_tfrecord.est` with `dir` as its data
/// directory.
pub fn digits_tfrecord(dir: &Path) {
    for (split, shards) in [("train", "2"), ("test", "1")] {
        let st = std::process::Command::new(env!("CARGO_BIN_EXE_estc"))
            .args(["data", "convert", "--from", "csv"])
            .arg(root().join(format!("examples/data/digits_{split}.csv")))
            .args([
                "--shards",
                shards,
                "--group",
                "pixels=p0:p63",
                "--type",
                "pixels=float",
                "-o",
            ])
            .arg(dir.join(format!("data/tfrecord/digits_{split}")))
            .stdout(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
    }
}
