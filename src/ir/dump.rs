//! Deterministic dumps of a graph: text (what IR tests assert on with CHECK lines) and
//! GraphViz DOT. Nodes are numbered `%0, %1, ...` in topological order, so the numbers
//! do not depend on how passes reused node slots.

use super::{Graph, NodeIndex, Role};
use std::collections::HashMap;
use std::fmt::Write;

fn numbering(g: &Graph) -> (Vec<NodeIndex>, HashMap<NodeIndex, usize>) {
    let order = g.topo_order();
    let num = order.iter().enumerate().map(|(i, &n)| (n, i)).collect();
    (order, num)
}

fn role_name(r: &Role) -> &'static str {
    match r {
        Role::Loss => "loss",
        Role::LearningRate => "learning_rate",
        Role::Prediction => "prediction",
        Role::MetricInput => "metric_input",
        Role::Update => "update",
        Role::Element => "element",
        Role::NextStep => "next_step",
        Role::Gradient => "gradient",
        Role::ScaledGradient => "scaled_gradient",
        Role::Summary => "summary",
    }
}

/// The text dump: one line per node, then the outputs, metrics and optimiser.
pub fn dump_text(g: &Graph, title: &str) -> String {
    let (order, num) = numbering(g);
    let mut out = format!("graph {title} {{\n");
    for n in order {
        let node = g.node(n);
        let operands: Vec<String> = g
            .operands(n)
            .iter()
            .map(|o| format!("%{}", num[o]))
            .collect();
        let mut line = format!("  %{} = {}", num[&n], node.op.name());
        let attrs = node.op.attrs();
        if !attrs.is_empty() {
            let _ = write!(line, " {attrs}");
        }
        if !operands.is_empty() {
            let _ = write!(line, " ({})", operands.join(", "));
        }
        let _ = writeln!(out, "{line} : {}", node.ty);
    }
    for o in &g.outputs {
        let _ = writeln!(
            out,
            "  output {} {} = %{}",
            role_name(&o.role),
            o.name,
            num[&o.node]
        );
    }
    for m in &g.metrics {
        let args: Vec<&str> = m.args.iter().map(|&i| g.outputs[i].name.as_str()).collect();
        let _ = writeln!(
            out,
            "  metric {} = {}({})",
            m.name,
            m.reducer,
            args.join(", ")
        );
    }
    for opt in &g.optimizers {
        let hyper: Vec<String> = opt
            .hyper
            .iter()
            .map(|(k, v)| format!("{k}={}", super::fmt_f64(*v)))
            .collect();
        let clip = opt
            .clip_global_norm
            .map(|c| format!(" clip_global_norm={}", super::fmt_f64(c)))
            .unwrap_or_default();
        let of = if opt.loss == "loss" {
            String::new()
        } else {
            format!(" minimizing {}", opt.loss)
        };
        let only = opt
            .variables
            .as_ref()
            .map(|v| format!(" only({})", v.join(", ")))
            .unwrap_or_default();
        let scale = match opt.loss_scale {
            None => String::new(),
            Some(super::LossScale::Fixed(s)) => format!(" loss_scale={}", super::fmt_f64(s)),
            Some(super::LossScale::Dynamic {
                initial,
                growth_interval,
            }) => format!(
                " loss_scale=dynamic(initial={}, growth_interval={growth_interval})",
                super::fmt_f64(initial)
            ),
        };
        let _ = writeln!(
            out,
            "  optimizer {}({}){}{scale}{of}{only}",
            opt.kind,
            hyper.join(", "),
            clip
        );
    }
    out.push_str("}\n");
    out
}

/// The GraphViz dump.
pub fn dump_dot(g: &Graph, title: &str) -> String {
    let (order, num) = numbering(g);
    let mut out = format!(
        "digraph \"{}\" {{\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n",
        title
    );
    for n in &order {
        let node = g.node(*n);
        let attrs = node.op.attrs().replace('"', "\\\"");
        let shape = if node.op.is_source() {
            ", style=rounded"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  n{} [label=\"%{} {}{}{}\\n{}\"{}];",
            num[n],
            num[n],
            node.op.name(),
            if attrs.is_empty() { "" } else { " " },
            attrs,
            node.ty,
            shape
        );
    }
    for n in &order {
        for (i, o) in g.operands(*n).iter().enumerate() {
            let _ = writeln!(out, "  n{} -> n{} [label=\"{}\"];", num[o], num[n], i);
        }
    }
    for (i, o) in g.outputs.iter().enumerate() {
        let _ = writeln!(
            out,
            "  out{i} [label=\"{} {}\", shape=ellipse];",
            role_name(&o.role),
            o.name
        );
        let _ = writeln!(out, "  n{} -> out{i};", num[&o.node]);
    }
    out.push_str("}\n");
    out
}
