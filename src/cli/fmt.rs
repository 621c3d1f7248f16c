//! `estc fmt`: formats `.est` files in place, checks that they are formatted
//! (`--check`, for CI), or formats standard input to standard output.

use super::{log, print_result, stderr_style, usage, write_failed, Color};
use clap::Parser;
use est::diag::render;
use est::program::{read_text, read_text_from, MAX_SOURCE_BYTES};
use est::span::{SourceFile, SourceMap};
use est::syntax::format::{format, FormatError};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Parser)]
pub struct FmtArgs {
    /// The files to format, and directories to format every `.est` file under. None:
    /// standard input, written formatted to standard output.
    files: Vec<PathBuf>,
    /// Write nothing: list the files that are not formatted, with their first line
    /// that differs, and exit with status 1 if there are any.
    #[arg(long)]
    check: bool,
    /// Colour in the diagnostics of files that do not parse.
    #[arg(long, value_enum, default_value_t = Color::Auto)]
    color: Color,
}

/// What happened to one file.
enum Outcome {
    Same,
    Changed,
    /// Not formatted: it does not parse, or the formatter failed (status 1 or 2).
    Failed(i32),
}

pub fn fmt(a: FmtArgs) -> i32 {
    if a.files.is_empty() {
        // (as a file is read: at most 16 MiB, and UTF-8, or an error naming the line
        // and the byte)
        let text = match read_text_from(std::io::stdin().lock(), MAX_SOURCE_BYTES) {
            Ok(t) => t,
            Err(e) => {
                return usage(&format!(
                    "cannot read standard input: {}",
                    e.describe("source file")
                ))
            }
        };
        return match formatted("<stdin>", &text, a.color) {
            Ok(out) if a.check => {
                if out != text {
                    report_difference("<stdin>", &text, &out);
                }
                i32::from(out != text)
            }
            Ok(out) => match print_result(&out) {
                Ok(()) => 0,
                Err(code) => code,
            },
            Err(code) => code,
        };
    }
    let mut files = Vec::new();
    for f in &a.files {
        if f.is_dir() {
            if let Err(e) = est_files(f, &mut files) {
                return usage(&format!("cannot list {}: {e}", f.display()));
            }
        } else {
            files.push(f.clone());
        }
    }
    let (mut changed, mut same, mut status) = (0, 0, 0);
    for f in &files {
        match one(f, a.check, a.color) {
            Outcome::Same => same += 1,
            Outcome::Changed => changed += 1,
            Outcome::Failed(code) => status = status.max(code),
        }
    }
    let files_word = |n: usize| if n == 1 { "file" } else { "files" };
    if a.check {
        if changed > 0 {
            log(&format!(
                "{changed} {} not formatted; run `estc fmt` on {}",
                files_word(changed),
                if changed == 1 { "it" } else { "them" }
            ));
            status = status.max(1);
        }
    } else if files.len() > 1 || changed > 0 {
        log(&format!(
            "formatted {changed} {}, {same} already formatted",
            files_word(changed)
        ));
    }
    status
}

/// Formats (or checks) one file.
fn one(path: &Path, check: bool, color: Color) -> Outcome {
    let text = match read_text(path, MAX_SOURCE_BYTES) {
        Ok(t) => t,
        Err(e) => {
            log(&format!(
                "error: cannot read {}: {}",
                path.display(),
                e.describe("source file")
            ));
            return Outcome::Failed(2);
        }
    };
    let name = path.display().to_string();
    let out = match formatted(&name, &text, color) {
        Ok(out) => out,
        Err(code) => return Outcome::Failed(code),
    };
    if out == text {
        return Outcome::Same;
    }
    if check {
        report_difference(&name, &text, &out);
    } else if let Err(e) = est::atomic::rewrite_in_place(path, out.as_bytes()) {
        return Outcome::Failed(write_failed(&name, &e));
    }
    Outcome::Changed
}

/// A text formatted, or the exit status after saying why not: 1 for syntax errors
/// (printed as diagnostics), 2 for a formatter bug.
fn formatted(name: &str, text: &str, color: Color) -> Result<String, i32> {
    let mut sources = SourceMap::default();
    let file = sources.add(SourceFile::new(name, text));
    match format(file, text) {
        Ok(out) => Ok(out),
        Err(FormatError::Syntax(diags)) => {
            let mut shown = render::render_all(&diags, &sources, stderr_style(color));
            shown.push_str(&format!("{name}: not formatted: it does not parse\n"));
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(shown.as_bytes()).and_then(|()| err.flush());
            Err(1)
        }
        Err(FormatError::Unchanged(line)) => {
            log(&format!(
                "internal error: formatting {name} would change its tokens or comments at line {line}; the file is left as it is; please report it"
            ));
            Err(2)
        }
    }
}

/// Says that a file is not formatted, with its first line that differs.
fn report_difference(name: &str, text: &str, out: &str) {
    let (mut old, mut new) = (text.lines(), out.lines());
    let mut n = 1;
    loop {
        match (old.next(), new.next()) {
            (Some(a), Some(b)) if a == b => n += 1,
            (a, b) => {
                let _ = print_result(&format!(
                    "{name}:{n}: not formatted\n  - {}\n  + {}\n",
                    a.unwrap_or(""),
                    b.unwrap_or("")
                ));
                return;
            }
        }
    }
}

/// The `.est` files under a directory, sorted, skipping hidden directories, `target`
/// and links to directories (which could loop).
fn est_files(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for p in entries {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
        let skip = name
            .as_deref()
            .is_none_or(|n| n.starts_with('.') || n == "target");
        let linked = p
            .symlink_metadata()
            .is_ok_and(|m| m.file_type().is_symlink());
        if p.is_dir() && !skip && !linked {
            est_files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "est") {
            out.push(p);
        }
    }
    Ok(())
}
