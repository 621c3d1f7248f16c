//! Nothing lost, on the surfaces added since the first hardening (`tests/reliability.rs`):
//! each test here is the regression test of a finding of issue 43's hostile probes about
//! files, resources and crashes (output paths, `estc fmt` in place, model_dir listing and
//! its index, symlink loops, memory limits, thread counts, standard input, cache
//! entries); those about results and messages are `tests/hardening_results.rs`'. Each
//! test's comment names the finding it guards.

mod common;
#[path = "common/estc.rs"]
mod estc;
use estc::{estc, ok, root, s, stderr};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("est-hardening-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A FIFO at `p`, with a thread that reads it to its end.
fn fifo(p: &Path) -> std::thread::JoinHandle<Vec<u8>> {
    ok(Command::new("mkfifo").arg(p).output().unwrap());
    let p = p.to_path_buf();
    std::thread::spawn(move || std::fs::read(p).unwrap())
}

/// digits_mlp trained 5 steps in `dir/md`.
fn trained(dir: &Path) -> PathBuf {
    let md = dir.join("md");
    ok(estc(&[
        "train",
        "examples/digits_mlp.est",
        "--target",
        "interp",
        "--max-steps",
        "5",
        "--model-dir",
        s(&md),
    ]));
    md
}

/// Finding 1: every writer of a user-named output follows symbolic links (the link stays
/// a link, its file gets the bytes), writes through a FIFO or a character device instead
/// of replacing it, and refuses a directory, saying what it is.
#[test]
fn outputs_follow_links_and_write_through_devices() {
    let d = tmp("outputs");
    let md = trained(&d);
    let export = |to: &Path| {
        estc(&[
            "export",
            "examples/digits_mlp.est",
            "--model-dir",
            s(&md),
            "-o",
            s(to),
        ])
    };
    // a regular file: the reference bytes
    ok(export(&d.join("plain.onnx")));
    let want = std::fs::read(d.join("plain.onnx")).unwrap();
    // a link to a file in another directory: followed
    std::fs::create_dir(d.join("real")).unwrap();
    std::os::unix::fs::symlink(d.join("real/model.onnx"), d.join("link.onnx")).unwrap();
    ok(export(&d.join("link.onnx")));
    let link = std::fs::symlink_metadata(d.join("link.onnx")).unwrap();
    assert!(link.file_type().is_symlink(), "the link was replaced");
    assert_eq!(std::fs::read(d.join("real/model.onnx")).unwrap(), want);
    // a FIFO: written through, to its reader
    let reader = fifo(&d.join("pipe"));
    ok(export(&d.join("pipe")));
    assert_eq!(reader.join().unwrap(), want);
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(d.join("pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
    // a character device (as root: a null device of our own, /dev/null's numbers)
    if is_root() {
        let null = d.join("null");
        ok(Command::new("mknod")
            .arg(&null)
            .args(["c", "1", "3"])
            .output()
            .unwrap());
        ok(export(&null));
        let t = std::fs::symlink_metadata(&null).unwrap().file_type();
        assert!(t.is_char_device(), "the device was replaced by {t:?}");
    }
    // a directory: refused, as it is
    let o = export(&d.join("real"));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("it is a directory, not a file"),
        "{}",
        stderr(&o)
    );
    assert!(d.join("real/model.onnx").exists());
    // predict's files through a link inside the output directory
    let out = d.join("p");
    std::fs::create_dir(&out).unwrap();
    std::os::unix::fs::symlink(
        d.join("real/predictions.jsonl"),
        out.join("predictions.jsonl"),
    )
    .unwrap();
    ok(estc(&[
        "predict",
        "examples/digits_mlp.est",
        "--target",
        "interp",
        "--model-dir",
        s(&md),
        "--output",
        s(&out),
    ]));
    assert!(std::fs::symlink_metadata(out.join("predictions.jsonl"))
        .unwrap()
        .file_type()
        .is_symlink());
    let lines = std::fs::read_to_string(d.join("real/predictions.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 360);
    // data convert's shard through a link
    std::os::unix::fs::symlink(d.join("real/digits.tfrecord"), d.join("digits.tfrecord")).unwrap();
    ok(estc(&[
        "data",
        "convert",
        "--from",
        "csv",
        "examples/data/digits_test.csv",
        "-o",
        s(&d.join("digits")),
    ]));
    assert!(std::fs::symlink_metadata(d.join("digits.tfrecord"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(
        std::fs::metadata(d.join("real/digits.tfrecord"))
            .unwrap()
            .len()
            > 10_000
    );
    // build's wafer artifact through a FIFO
    let reader = fifo(&d.join("artifact"));
    ok(estc(&[
        "build",
        "examples/digits_mlp.est",
        "--target",
        "wafer",
        "-o",
        s(&d.join("artifact")),
    ]));
    assert!(reader.join().unwrap().len() > 1000);
    // standard output, a pipe here: written through (its link's text is `pipe:[N]`,
    // no path to replace)
    let o = ok(estc(&[
        "build",
        "examples/digits_mlp.est",
        "--target",
        "wafer",
        "-o",
        "/dev/stdout",
    ]));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("\"format\":\"estw 3\""),
        "{}",
        &out[..out.len().min(300)]
    );
}

/// Finding 24 (in part): a native export whose `-o` is an existing file says that the
/// native format writes a directory, and writes nothing.
#[cfg(feature = "llvm")]
#[test]
fn a_native_export_into_a_file_says_it_writes_a_directory() {
    let d = tmp("native-file");
    let md = trained(&d);
    std::fs::write(d.join("served"), "keep").unwrap();
    let export = |to: &Path| {
        estc(&[
            "export",
            "examples/digits_mlp.est",
            "--model-dir",
            s(&md),
            "--format",
            "native",
            "-o",
            s(to),
        ])
    };
    let o = export(&d.join("served"));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("E0904")
            && e.contains("--format native writes a directory")
            && e.contains("give -o a directory"),
        "{e}"
    );
    assert_eq!(std::fs::read_to_string(d.join("served")).unwrap(), "keep");
    // a checkpoint of an est that wrote no checksums: its library could never load it
    let meta = md.join("ckpt-5.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    let fields = m.as_object_mut().unwrap();
    fields.remove("checksums");
    fields.remove("meta_checksum");
    std::fs::write(&meta, serde_json::to_vec(&m).unwrap()).unwrap();
    let o = export(&d.join("lib"));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("has no checksums beside it") && !d.join("lib").exists(),
        "{}",
        stderr(&o)
    );
}

/// Finding 5: `estc fmt` writes a file in place, as gofmt and rustfmt do: it keeps the
/// file's inode (so its hard links), its mode and its owner; it refuses a file without
/// write permission (as root too), leaving it as it is.
#[test]
fn fmt_writes_in_place_keeping_owner_mode_and_links() {
    let d = tmp("fmt");
    let messy = "fn f(x) {x*2.0}\n";
    let tidy = "fn f(x) { x * 2.0 }\n";
    let file = d.join("a.est");
    std::fs::write(&file, messy).unwrap();
    std::fs::hard_link(&file, d.join("b.est")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    if is_root() {
        std::os::unix::fs::chown(&file, Some(1234), Some(1234)).unwrap();
    }
    let before = std::fs::metadata(&file).unwrap();
    ok(estc(&["fmt", s(&file)]));
    let after = std::fs::metadata(&file).unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), tidy);
    assert_eq!(std::fs::read_to_string(d.join("b.est")).unwrap(), tidy);
    assert_eq!(after.ino(), before.ino());
    assert_eq!(after.nlink(), 2);
    assert_eq!(after.mode() & 0o7777, 0o640);
    assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    // no temporary file is left beside it
    let names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // a read-only file is refused and kept
    let ro = d.join("ro.est");
    std::fs::write(&ro, messy).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    let o = estc(&["fmt", s(&ro)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("read-only"), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&ro).unwrap(), messy);
    assert_eq!(std::fs::metadata(&ro).unwrap().mode() & 0o7777, 0o444);
    // (as root: a file another user may not write, in a directory open to all, is
    // refused before anything is written, and keeps its owner and inode)
    if is_root() {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let theirs = d.join("theirs.est");
        std::fs::write(&theirs, messy).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o644)).unwrap();
        let before = std::fs::metadata(&theirs).unwrap();
        let o = estc_unprivileged(&d, &["fmt", "theirs.est"]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        let after = std::fs::metadata(&theirs).unwrap();
        assert_eq!((after.ino(), after.uid()), (before.ino(), before.uid()));
        assert_eq!(std::fs::read_to_string(&theirs).unwrap(), messy);
    }
}

/// digits_mlp with its data, in `dir` (readable by anyone, for a run as another user).
fn digits_copy(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir.join("data")).unwrap();
    for f in ["digits_train.csv", "digits_test.csv"] {
        std::fs::copy(
            root().join("examples/data").join(f),
            dir.join("data").join(f),
        )
        .unwrap();
    }
    let p = dir.join("digits.est");
    std::fs::copy(root().join("examples/digits_mlp.est"), &p).unwrap();
    for e in [dir.to_path_buf(), dir.join("data")] {
        std::fs::set_permissions(e, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    p
}

/// `estc ARGS` as an unprivileged user (`nobody`) when this test runs as root, so that
/// file permissions apply; as this user otherwise. The binary is copied where that user
/// can run it when the build directory is closed to others.
fn estc_unprivileged(dir: &Path, args: &[&str]) -> Output {
    if !is_root() {
        return estc(args);
    }
    let drop = ["--reuid=65534", "--regid=65534", "--clear-groups", "--"];
    let mut bin = PathBuf::from(env!("CARGO_BIN_EXE_estc"));
    let runs = Command::new("setpriv")
        .args(drop)
        .arg(&bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !runs {
        let copy = dir.join("estc");
        std::fs::copy(&bin, &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
        bin = copy;
    }
    Command::new("setpriv")
        .args(drop)
        .arg(&bin)
        .args(args)
        .current_dir(dir)
        .env("EST_CACHE_DIR", dir.join("cache"))
        .output()
        .unwrap()
}

/// The names and bytes of a directory's files, but its lock (which holds the PID of
/// the run that took it last).
fn contents(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .filter(|(n, _)| n != ".est.lock")
        .collect();
    v.sort();
    v
}

fn names(files: &[(String, Vec<u8>)]) -> Vec<&str> {
    files.iter().map(|f| f.0.as_str()).collect()
}

/// Finding 4: a model_dir that can be written but not listed (here: no read
/// permission) is an error that stops training before anything is written, not an
/// empty directory (which trained from step 0 and overwrote its checkpoints); eval and
/// predict say the same instead of "no checkpoint".
#[test]
fn a_model_dir_that_cannot_be_listed_stops_before_writing() {
    let d = tmp("unlistable");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let program = digits_copy(&d);
    let md = d.join("md");
    ok(estc(&[
        "train",
        s(&program),
        "--target",
        "interp",
        "--max-steps",
        "10",
        "--model-dir",
        s(&md),
    ]));
    std::fs::set_permissions(md.join(".est.lock"), std::fs::Permissions::from_mode(0o666)).unwrap();
    let before = contents(&md);
    std::fs::set_permissions(&md, std::fs::Permissions::from_mode(0o333)).unwrap();
    let args = |cmd: &'static str| {
        let mut v = vec![cmd, "digits.est", "--target", "interp", "--model-dir", "md"];
        if cmd == "train" {
            v.extend(["--max-steps", "20"]);
        }
        v
    };
    let o = estc_unprivileged(&d, &args("train"));
    std::fs::set_permissions(&md, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("E0904") && stderr(&o).contains("cannot list"),
        "{}",
        stderr(&o)
    );
    let after = contents(&md);
    assert!(
        after == before,
        "the model_dir changed: {:?} -> {:?}",
        names(&before),
        names(&after)
    );
    std::fs::set_permissions(&md, std::fs::Permissions::from_mode(0o333)).unwrap();
    for cmd in ["eval", "predict"] {
        let o = estc_unprivileged(&d, &args(cmd));
        assert_eq!(o.status.code(), Some(1), "{cmd}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("cannot list") && !stderr(&o).contains("E0911"),
            "{cmd}: {}",
            stderr(&o)
        );
    }
    std::fs::set_permissions(&md, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Finding 18: `checkpoint.json` left stale by a run stopped between its last save and
/// the index's write is rewritten by the next run that takes the model_dir, to what
/// the directory holds.
#[test]
fn a_stale_checkpoint_index_is_rewritten() {
    let d = tmp("index");
    let md = d.join("md");
    let train = |steps: &str| {
        ok(estc(&[
            "train",
            "examples/digits_mlp.est",
            "--target",
            "interp",
            "--max-steps",
            steps,
            "--model-dir",
            s(&md),
        ]))
    };
    train("10");
    // (finding 16: a resumed run says where its input resumes)
    let o = estc(&[
        "train",
        "examples/digits_mlp.est",
        "--target",
        "interp",
        "--max-steps",
        "12",
        "--model-dir",
        s(&md),
    ]);
    assert!(
        stderr(&o)
            .contains("resuming the train input at element 10 (passing over what 10 steps read)"),
        "{}",
        stderr(&o)
    );
    train("10");
    let index = || -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(md.join("checkpoint.json")).unwrap()).unwrap()
    };
    assert_eq!(index(), serde_json::json!({"latest": 12, "all": [10, 12]}));
    std::fs::write(md.join("checkpoint.json"), r#"{"latest": 5, "all": [5]}"#).unwrap();
    // a run with nothing to train still brings it up to date
    train("10");
    assert_eq!(index(), serde_json::json!({"latest": 12, "all": [10, 12]}));
}

/// Finding 10: under a process memory limit (`ulimit -v`, as batch schedulers set) a run
/// that cannot allocate what it needs ends with a diagnostic and status 1, never an
/// abort (SIGABRT, status 134, with Rust's bare "memory allocation of N bytes failed"):
/// a large variable (initialised, bound to the device, read out for its checkpoint) on
/// the interpreter and the host, and a pipeline of large elements batched, each at a
/// sweep of limits from below what the binary needs to start to above what the run
/// needs.
#[test]
fn memory_limits_give_diagnostics_not_aborts() {
    let d = tmp("ulimit");
    let mut failed_with = std::collections::BTreeSet::new();
    let mut succeeded = 0;
    for (program, target) in [
        ("big_variable", "interp"),
        ("big_variable", "host"),
        ("big_elements", "interp"),
    ] {
        if target == "host" && !cfg!(feature = "llvm") {
            continue;
        }
        for limit_mb in (300u64..=2400).step_by(300) {
            let md = d.join(format!("{program}-{target}-{limit_mb}"));
            let o = Command::new("prlimit")
                .arg(format!("--as={}", limit_mb * 1_000_000))
                .arg(env!("CARGO_BIN_EXE_estc"))
                .args(["train", &format!("tests/fixtures/hardening/{program}.est")])
                .args([
                    "--target",
                    target,
                    "--max-steps",
                    "2",
                    "--model-dir",
                    s(&md),
                ])
                .current_dir(root())
                .output()
                .unwrap();
            let e = stderr(&o);
            // (each run's checkpoints take hundreds of MB: gone before the next)
            let _ = std::fs::remove_dir_all(&md);
            let case = format!("{program} on {target} under {limit_mb} MB");
            if e.contains("error while loading shared libraries") {
                continue; // below what the binary needs to start at all
            }
            assert!(!e.contains("memory allocation of"), "{case}: {e}");
            match o.status.code() {
                Some(0) => succeeded += 1,
                Some(1) => {
                    let code = ["E0602", "E0905", "E0906"]
                        .into_iter()
                        .find(|c| e.contains(c));
                    assert!(code.is_some(), "{case}: {e}");
                    failed_with.extend(code);
                }
                other => panic!("{case}: status {other:?}: {e}"),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    assert!(
        succeeded > 0 && !failed_with.is_empty(),
        "{succeeded} {failed_with:?}"
    );
}

/// Finding 12: a thread count beyond `MAX_THREADS` (1024), from `--threads` or
/// `EST_NUM_THREADS`, and a value of `EST_NUM_THREADS` that is not a count, are one clear
/// usage error before anything runs (100,000 threads panicked for their stacks; garbage
/// was ignored).
#[test]
fn thread_counts_are_bounded_and_checked() {
    let d = tmp("threads");
    let md = d.join("md");
    let run = |threads: Option<&str>, env: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_estc"));
        // (the host's pool, where it is built)
        let target = if cfg!(feature = "llvm") {
            "host"
        } else {
            "interp"
        };
        c.args([
            "train",
            "examples/digits_mlp.est",
            "--target",
            target,
            "--max-steps",
            "1",
            "--model-dir",
            s(&md),
        ])
        .current_dir(root());
        if let Some(t) = threads {
            c.args(["--threads", t]);
        }
        match env {
            Some(v) => c.env("EST_NUM_THREADS", v),
            None => c.env_remove("EST_NUM_THREADS"),
        };
        c.output().unwrap()
    };
    let o = run(Some("5000"), None);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("5000 is not in 1..=1024"),
        "{}",
        stderr(&o)
    );
    for bad in ["100000", "abc", "0", "-3", ""] {
        let o = run(None, Some(bad));
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!(
                "EST_NUM_THREADS={bad:?} is not a thread count from 1 to 1024"
            )),
            "{bad:?}: {}",
            stderr(&o)
        );
        assert!(!md.exists(), "{bad:?}: something was written");
    }
    ok(run(None, Some("3")));
    ok(run(Some("1024"), None));
}

/// `estc fmt` with `input` on its standard input.
fn fmt_stdin(input: &[u8]) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_estc"))
        .arg("fmt")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // (a writer thread: estc stops reading at the limit, and the pipe then breaks)
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let o = child.wait_with_output().unwrap();
    writer.join().unwrap();
    o
}

/// Findings 13 and 19: `estc fmt` reads standard input as it reads a file: at most
/// 16 MiB (`< /dev/zero` grew to 18 GB), and UTF-8, or an error naming the line and the
/// byte (a `csv()` source's bad byte: `tests/hardening_results.rs`).
#[test]
fn fmt_standard_input_is_bounded_and_located() {
    let o = fmt_stdin(&vec![b' '; (16 << 20) + 10]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("larger than 16 MiB"), "{}", stderr(&o));
    let o = fmt_stdin(b"fn f(x) {\n x }\n// caf\xe9\n");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not UTF-8 text (line 3, byte 21)"),
        "{}",
        stderr(&o)
    );
}

/// Makes `f` look unwritten for two hours (a killed writer's file).
#[cfg(feature = "llvm")]
fn idle(f: &Path) {
    ok(Command::new("touch")
        .args(["-d", "2 hours ago"])
        .arg(f)
        .output()
        .unwrap());
}

/// A PID no process has: that of a child that has ended.
#[cfg(feature = "llvm")]
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

/// Runs `estc args` with `EST_CACHE_DIR=cache`, failing the test if it takes more than
/// a minute (a FIFO read as a cache entry hung forever).
#[cfg(feature = "llvm")]
fn estc_within_a_minute(args: &[&str], cache: &Path) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_estc"))
        .args(args)
        .env("EST_CACHE_DIR", cache)
        .current_dir(root())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            panic!("estc {args:?} hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Findings 14 and 17: a code-cache entry is opened only if it is a regular file and
/// read only as far as its header promises: a FIFO in an entry's place (it hung) and a
/// link to `/dev/zero` (it filled the memory) are compiled again and replaced, as is an
/// entry whose size disagrees with its header. Temporary files of killed writers (of the
/// code cache and of `cache()` files) are removed by the next write; a live writer's
/// are kept, and counted by the size cap.
#[cfg(feature = "llvm")]
#[test]
fn cache_entries_that_are_not_files_are_rebuilt_and_stale_temps_swept() {
    let d = tmp("code-cache");
    let cache = d.join("cache");
    let build = |cache: &Path| {
        let o = estc_within_a_minute(&["build", "examples/digits_mlp.est", "--report"], cache);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    build(&cache);
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "obj"))
        .collect();
    entries.sort();
    assert_eq!(entries.len(), 2, "{entries:?}");
    std::fs::remove_file(&entries[0]).unwrap();
    ok(Command::new("mkfifo").arg(&entries[0]).output().unwrap());
    std::fs::remove_file(&entries[1]).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &entries[1]).unwrap();
    let dead = cache.join(format!(".x.obj.tmp-{}", dead_pid()));
    let live = cache.join(format!(".y.obj.tmp-{}", std::process::id()));
    // (a PID this machine does not know, written to a moment ago: another machine's
    // writer, on a cache shared over NFS)
    let elsewhere = cache.join(format!(".z.obj.tmp-{}", dead_pid()));
    for f in [&dead, &live, &elsewhere] {
        std::fs::write(f, vec![0u8; 1000]).unwrap();
    }
    idle(&dead);
    let out = build(&cache);
    assert_eq!(
        out.matches("compiled again: the cached entry").count(),
        2,
        "{out}"
    );
    assert!(out.contains("not a regular file"), "{out}");
    for e in &entries {
        assert!(std::fs::symlink_metadata(e).unwrap().file_type().is_file());
    }
    assert!(!dead.exists() && live.exists() && elsewhere.exists());
    // an entry longer than its header says
    let mut bytes = std::fs::read(&entries[0]).unwrap();
    bytes.extend_from_slice(b"more");
    std::fs::write(&entries[0], bytes).unwrap();
    let out = build(&cache);
    assert!(out.contains("bytes of code)"), "{out}");
    // cache() files: a FIFO in the place of one is rebuilt over; a dead writer's
    // temporary file goes
    let data = d.join("data-cache");
    std::fs::create_dir_all(&data).unwrap();
    let program = d.join("digits_tfrecord.est");
    std::fs::copy(root().join("examples/digits_tfrecord.est"), &program).unwrap();
    let train = || {
        estc_within_a_minute(
            &[
                "train",
                s(&program),
                "--max-steps",
                "2",
                "--model-dir",
                s(&d.join("md")),
            ],
            &data,
        )
    };
    common::digits_tfrecord(&d);
    ok(train());
    let files: Vec<PathBuf> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "estcache"))
        .collect();
    assert!(!files.is_empty());
    for f in &files {
        std::fs::remove_file(f).unwrap();
        ok(Command::new("mkfifo").arg(f).output().unwrap());
    }
    let dead = data.join(format!(".z.estcache.tmp-{}-0", dead_pid()));
    std::fs::write(&dead, b"half").unwrap();
    idle(&dead);
    let _ = std::fs::remove_dir_all(d.join("md"));
    ok(train());
    assert!(!dead.exists());
    for f in &files {
        assert!(std::fs::symlink_metadata(f).unwrap().file_type().is_file());
    }
}

/// (Review of issue 43) an argument that is not UTF-8 is clap's ordinary error, not a
/// panic of the allocator's set-up reading the arguments.
#[test]
fn an_argument_that_is_not_utf8_is_an_error_not_a_panic() {
    use std::os::unix::ffi::OsStrExt;
    let o = Command::new(env!("CARGO_BIN_EXE_estc"))
        .arg("check")
        .arg(std::ffi::OsStr::from_bytes(b"caf\xe9.est"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}

/// Finding 24 (in part): a model_dir that is a loop of symbolic links is said to be one
/// (it was "a link to a directory which does not exist").
#[test]
fn a_model_dir_link_loop_is_named_as_one() {
    let d = tmp("link-loop");
    let (a, b) = (d.join("a"), d.join("b"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    let o = estc(&[
        "train",
        "examples/digits_mlp.est",
        "--target",
        "interp",
        "--max-steps",
        "1",
        "--model-dir",
        s(&a),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("which leads back to itself (a loop of symbolic links)"),
        "{}",
        stderr(&o)
    );
}
