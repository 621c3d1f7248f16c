//! `estc data convert`: the command-line face of `runtime::convert`.

use super::{log, print_result, ConvertArgs, DataArgs, DataCommand, FromArg, MessageFormat};
use est::data::convert::{self, ConvertOptions, Kind};
use std::io::{IsTerminal, Write};

pub fn run(a: DataArgs) -> i32 {
    match a.command {
        DataCommand::Convert(c) => run_convert(c),
    }
}

fn run_convert(a: ConvertArgs) -> i32 {
    let mut groups = Vec::new();
    for g in &a.groups {
        let Some((name, range)) = g.split_once('=') else {
            return super::usage(&format!("--group {g}: write NAME=FIRST:LAST"));
        };
        let Some((first, last)) = range.split_once(':') else {
            return super::usage(&format!("--group {g}: write NAME=FIRST:LAST"));
        };
        groups.push((name.to_string(), first.to_string(), last.to_string()));
    }
    let mut kinds = Vec::new();
    for k in &a.kinds {
        let kind = match k.split_once('=') {
            Some((n, "float")) => (n, Kind::Float),
            Some((n, "int")) => (n, Kind::Int),
            Some((n, "bytes")) => (n, Kind::Bytes),
            _ => {
                return super::usage(&format!(
                    "--type {k}: write NAME=float, NAME=int or NAME=bytes"
                ))
            }
        };
        kinds.push((kind.0.to_string(), kind.1));
    }
    let opts = ConvertOptions {
        from: match a.from {
            FromArg::Csv => convert::From::Csv,
            FromArg::Tsv => convert::From::Tsv,
            FromArg::Png => convert::From::Png,
            FromArg::Npy => convert::From::Npy,
        },
        inputs: a.inputs.clone(),
        output: a.output.clone(),
        shards: a.shards,
        labels: a.labels.clone(),
        groups,
        kinds,
    };
    let json = a.out.message_format == MessageFormat::Json;
    let tty = std::io::stderr().is_terminal() && !json;
    // Progress is a courtesy: a failed write of it is ignored.
    let mut progress = |done: u64, total: u64| {
        if tty {
            let mut e = std::io::stderr();
            let _ = write!(e, "\rconverting: {done}/{total} records");
            let _ = e.flush();
        }
    };
    let report = match convert::convert(&opts, &mut progress) {
        Ok(r) => r,
        Err(e) => {
            if tty {
                log("");
            }
            let status = if e.code == est::diag::Code::RunIo {
                2
            } else {
                1
            };
            if json {
                let v = serde_json::json!({
                    "code": e.code.id(),
                    "message": e.message,
                    "help": e.help,
                });
                if let Err(code) = print_result(&format!("{v}\n")) {
                    return code;
                }
            } else {
                log(&format!(
                    "{}: {}\n  help: {}",
                    e.code.id(),
                    e.message,
                    e.help
                ));
            }
            return status;
        }
    };
    if tty {
        log("");
    }
    let out = if json {
        let v = serde_json::json!({
            "records": report.records,
            "bytes": report.bytes,
            "files": report.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
            "features": report.features.iter().map(|(n, k, len)| serde_json::json!({"name": n, "kind": k.name(), "values": len})).collect::<Vec<_>>(),
        });
        format!("{v}\n")
    } else {
        let mut out = format!(
            "wrote {} records ({} bytes) to {} file{}:\n",
            report.records,
            report.bytes,
            report.files.len(),
            if report.files.len() == 1 { "" } else { "s" }
        );
        for f in &report.files {
            out.push_str(&format!("  {}\n", f.display()));
        }
        out.push_str("features:\n");
        for (n, k, len) in &report.features {
            out.push_str(&format!("  {n}: {} of {len}\n", k.name()));
        }
        out
    };
    match print_result(&out) {
        Ok(()) => 0,
        Err(code) => code,
    }
}
