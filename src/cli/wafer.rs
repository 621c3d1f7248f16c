//! `estc build --target wafer` (the laid-out program as text, an `.estw` artifact, a
//! measured report and its SVG picture) and `estc sim` (an artifact run on generated
//! data).

use super::{print_diags, print_result, OutputArgs};
use clap::Parser;
use est::backend::wafer::artifact::{self, Artifact};
use est::backend::wafer::diagnose::layout_diag;
use est::backend::wafer::fabric::{self, Fabric};
use est::backend::wafer::place::Layout;
use est::backend::wafer::{form, place, report};
use est::diag::{Code, Diag};
use est::elab::Compiled;
use est::span::Span;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The steps a report simulates.
const REPORT_STEPS: u32 = 2;

/// What `estc build --target wafer` makes of one graph.
pub struct Built {
    pub text: String,
    pub artifact: Option<Vec<u8>>,
    pub svg: Option<(PathBuf, String)>,
}

/// Lays out a checked graph on `fab`: the text of `--emit wafer` when `emit`, the
/// artifact when `artifact`, and the measured report with its picture when `report`.
pub fn build(
    c: &Compiled,
    at: Span,
    fab: &Fabric,
    emit: bool,
    artifact: Option<&Path>,
    report: bool,
) -> Result<Built, Diag> {
    let graph = form::prepared(&c.graph);
    let formed =
        form::form(&graph).map_err(|u| layout_diag(place::LayoutError::Unsupported(u), fab, at))?;
    let layout = place::layout(&graph, &formed, fab).map_err(|e| layout_diag(e, fab, at))?;
    let mut text = String::new();
    if emit {
        text.push_str(&dump(c, &layout));
    }
    let measured = if report {
        let sim = report::simulate(&layout, REPORT_STEPS).map_err(|e| {
            Diag::new(
                Code::WaferArtifact,
                at,
                format!("the wafer program did not run: {e}"),
            )
            .label("this estimator")
            .help("this is a bug in estc's wafer compiler; please report it with the program")
        })?;
        let r = report::measure(&layout, &sim, REPORT_STEPS);
        let _ = write!(text, "{r}");
        Some(r)
    } else {
        None
    };
    let svg = measured.as_ref().map(|r| {
        let path = match artifact {
            Some(p) => p.with_extension("svg"),
            None => PathBuf::from(format!("{}.wafer.svg", c.estimator)),
        };
        (path, report::svg(&layout, r))
    });
    let bytes = artifact
        .map(|_| Artifact::new(&layout, artifact::graph_hash(&c.graph), measured).to_bytes());
    Ok(Built {
        text,
        artifact: bytes,
        svg,
    })
}

/// The laid-out program, readably: kernels, each program class with the PEs that run
/// it, the routes router by router.
fn dump(c: &Compiled, l: &Layout) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "wafer program of {} ({}) on {} ({}x{}): {} PEs, batch {}, {}",
        c.estimator,
        c.mode.name(),
        l.fabric.name,
        l.fabric.width,
        l.fabric.height,
        l.setup.pes.len(),
        l.batch,
        place::sizing(l.block)
    );
    t.push_str("kernels:\n");
    for k in &l.kernels {
        let _ = writeln!(
            t,
            "  {:<24} at ({}, {}), {}x{} PEs, {:?}",
            k.name, k.x, k.y, k.w, k.h, k.orient
        );
    }
    for s in &l.inputs {
        let lanes: Vec<String> = s
            .lanes
            .iter()
            .map(|l| {
                format!(
                    "({},{}) c{} [{}..{})",
                    l.x, l.y, l.colour, l.elems.start, l.elems.end
                )
            })
            .collect();
        let _ = writeln!(
            t,
            "host input `{}` ({} per sample): {}",
            s.name,
            s.per_sample,
            lanes.join(" ")
        );
    }
    for s in &l.outputs {
        let lanes: Vec<String> = s
            .lanes
            .iter()
            .map(|l| format!("({},{}) {} c{}", l.x, l.y, l.dir.name(), l.colour))
            .collect();
        let _ = writeln!(
            t,
            "host output `{}` ({} per sample): {}",
            s.name,
            s.per_sample,
            lanes.join(" ")
        );
    }
    // programs by class
    let mut classes: Vec<(&est::backend::wafer::isa::Program, Vec<(u32, u32)>)> = Vec::new();
    for (&at, (p, _)) in &l.setup.pes {
        match classes.iter_mut().find(|(q, _)| *q == p.as_ref()) {
            Some((_, pes)) => pes.push(at),
            None => classes.push((p.as_ref(), vec![at])),
        }
    }
    for (i, (p, pes)) in classes.iter().enumerate() {
        let shown: Vec<String> = pes
            .iter()
            .take(6)
            .map(|(x, y)| format!("({x},{y})"))
            .collect();
        let more = if pes.len() > 6 {
            format!(" and {} more", pes.len() - 6)
        } else {
            String::new()
        };
        let _ = writeln!(
            t,
            "\nprogram class {i}, on {} PEs: {}{more}",
            pes.len(),
            shown.join(" ")
        );
        let _ = write!(t, "{p}");
    }
    t.push_str("\nroutes (router, colour: from -> to):\n");
    let mut last = None;
    let mut line = String::new();
    for (&(x, y, c), r) in &l.setup.routes {
        if last != Some((x, y)) {
            if !line.is_empty() {
                let _ = writeln!(t, "{line}");
            }
            line = format!("  ({x},{y})");
            last = Some((x, y));
        }
        let tx: Vec<&str> = r.tx().map(|d| d.name()).collect();
        let _ = write!(line, "  c{c}: {} -> {}", r.rx.name(), tx.join("+"));
    }
    if !line.is_empty() {
        let _ = writeln!(t, "{line}");
    }
    t
}

#[derive(Parser)]
pub struct SimArgs {
    /// The artifact `estc build --target wafer -o` wrote.
    file: PathBuf,
    /// The fabric to run it on (default: the one it was compiled for, when that is a
    /// named config).
    #[arg(long)]
    wafer: Option<String>,
    /// Steps to simulate (at least 1).
    #[arg(long, default_value_t = REPORT_STEPS, value_parser = clap::value_parser!(u32).range(1..))]
    steps: u32,
    #[command(flatten)]
    out: OutputArgs,
}

fn refuse(file: &Path, why: String) -> Diag {
    Diag::new(
        Code::WaferArtifact,
        Span::default(),
        format!("cannot run `{}`: {why}", file.display()),
    )
    .label("this artifact")
    .help("rebuild it with `estc build FILE --target wafer --wafer CONFIG -o OUT.estw` for the fabric you run it on")
}

/// `estc sim FILE.estw`: runs an artifact on generated data and prints its report.
pub fn sim(a: SimArgs) -> i32 {
    let empty = est::Program::from_source("artifact", "", None);
    let fail = |d: Diag| print_diags(&empty, &[d], a.out.message_format, a.out.color);
    let bytes = match std::fs::read(&a.file) {
        Ok(b) => b,
        Err(e) => return fail(refuse(&a.file, format!("it cannot be read: {e}"))),
    };
    // the fabric: the one named, else the artifact's own
    let named = match &a.wafer {
        Some(w) => w.clone(),
        None => {
            #[derive(serde::Deserialize)]
            struct Head {
                stamp: artifact::Stamp,
            }
            match serde_json::from_slice::<Head>(&bytes) {
                Ok(h) => h.stamp.fabric,
                Err(_) => return fail(refuse(&a.file, "it is not an estw artifact (not the JSON `estc build --target wafer -o` writes)".into())),
            }
        }
    };
    let fab = match fabric::resolve(&named) {
        Ok(f) => f,
        Err(e) => {
            return fail(refuse(
                &a.file,
                format!("its fabric: {e}; name one with --wafer"),
            ))
        }
    };
    let art = match Artifact::from_bytes(&bytes, &fab) {
        Ok(x) => x,
        Err(e) => return fail(refuse(&a.file, e)),
    };
    let layout = art.layout(&fab);
    let sim = match report::simulate(&layout, a.steps) {
        Ok(s) => s,
        Err(e) => return fail(refuse(&a.file, format!("it did not run: {e}"))),
    };
    let r = report::measure(&layout, &sim, a.steps);
    match print_result(&r.to_string()) {
        Ok(()) => 0,
        Err(code) => code,
    }
}
