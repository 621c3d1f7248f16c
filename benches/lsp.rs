//! The language server's latency on a 2,000-line file: the time from an edit
//! (`didChange`) to the diagnostics of the new version (including the server's
//! `DEBOUNCE` wait), from an edit to the document's inlay hints (asked for at once:
//! the server checks the new text first), and the time to answer a hover, a formatting
//! request and semantic tokens. The server runs on its own thread behind an in-memory
//! connection, as an editor would see it minus the pipe.
//!
//! Run: `cargo bench --bench lsp` (`EST_BENCH_EDITS`, default 40; `EST_BENCH_HOVERS`,
//! default 200).

use crossbeam_channel::{unbounded, Receiver, Sender};
use lsp_server::{Message, Notification, Request, RequestId};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A 2,000-line program: a params block, 180 layer functions of ten lines, an input,
/// a model that stacks twelve of them, and an estimator.
fn program() -> String {
    let mut s = String::from(
        "use std.nn.dense\nuse std.losses.softmax_cross_entropy\nuse std.metrics.accuracy\n\n",
    );
    s.push_str("params {\n");
    for i in 0..40 {
        s.push_str(&format!(
            "  /// Width of layer group {i}.\n  width_{i}: int = {}\n",
            16 + i
        ));
    }
    s.push_str("}\n\n");
    for i in 0..180 {
        s.push_str(&format!(
            "/// Block {i}: two dense layers with a residual sum.\n\
             fn block_{i}(x, units: int) {{\n\
             \x20 let h = dense(x, units, activation: relu)\n\
             \x20 let g = dense(h, units)\n\
             \x20 let s = g + h\n\
             \x20 let t = relu(s)\n\
             \x20 let u = t * 0.5\n\
             \x20 u + t\n\
             }}\n\n"
        ));
    }
    s.push_str(
        "input digits() {\n  synthetic(features: f32[64], labels: i32, classes: 10)\n    |> batch(32, drop_remainder: true)\n}\n\n",
    );
    s.push_str("model m(features: f32[B, 64], labels: i32[B]) {\n  let x = features\n");
    for i in 0..12 {
        s.push_str(&format!("  x = block_{i}(x, params.width_{i})\n"));
    }
    s.push_str(
        "  let logits = dense(x, 10)\n  let loss = softmax_cross_entropy(labels, logits)\n\
         \x20 train { minimize loss with sgd(lr: 0.1) }\n\
         \x20 eval { metric accuracy = accuracy(labels, argmax(logits, 1)) }\n\
         \x20 predict { classes = argmax(logits, 1) }\n}\n\n",
    );
    s.push_str("estimator e { model = m  train_input = digits()  train_steps = 100 }\n");
    while s.lines().count() < 2000 {
        s.push_str("// padding comment to reach two thousand lines\n");
    }
    s
}

struct Client {
    tx: Sender<Message>,
    rx: Receiver<Message>,
    id: i32,
}

impl Client {
    fn request(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        let id = RequestId::from(self.id);
        self.tx
            .send(Request::new(id.clone(), method.into(), params).into())
            .unwrap();
        loop {
            match self.rx.recv_timeout(Duration::from_secs(60)).unwrap() {
                Message::Response(r) if r.id == id => return serde_json::to_value(r).unwrap(),
                _ => {}
            }
        }
    }

    fn notify(&self, method: &str, params: Value) {
        self.tx
            .send(Notification::new(method.into(), params).into())
            .unwrap();
    }

    fn diagnostics_for(&self, version: i32) -> Value {
        loop {
            if let Message::Notification(n) = self.rx.recv_timeout(Duration::from_secs(60)).unwrap()
            {
                if n.method == "textDocument/publishDiagnostics" && n.params["version"] == version {
                    return n.params;
                }
            }
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let edits: usize = std::env::var("EST_BENCH_EDITS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let hovers: usize = std::env::var("EST_BENCH_HOVERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let text = program();
    let lines: Vec<&str> = text.lines().collect();
    let (tx, server_rx) = unbounded();
    let (server_tx, rx) = unbounded();
    std::thread::spawn(move || est::lsp::serve(server_rx, server_tx));
    let mut c = Client { tx, rx, id: 0 };
    c.request(
        "initialize",
        json!({"capabilities": {}, "initializationOptions": {"target": "host"}}),
    );
    c.notify("initialized", json!({}));
    let uri = "file:///est-bench/big.est";
    let t = Instant::now();
    c.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "est", "version": 1, "text": text}}),
    );
    let d = c.diagnostics_for(1);
    let open_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(
        d["diagnostics"],
        json!([]),
        "the benchmark program must check clean"
    );
    // The edit: the factor in block 3's body, `t * 0.5` -> `t * 0.6` and back.
    let line = lines
        .iter()
        .position(|l| l.contains("let u = t * 0.5"))
        .unwrap()
        + 10 * 3;
    assert!(lines[line].contains("t * 0.5"));
    let col = lines[line].find("0.5").unwrap() as u32;
    let change = |c: &Client, version: i32, new: &str| {
        c.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": [
                {"range": {"start": {"line": line, "character": col}, "end": {"line": line, "character": col + 3}}, "text": new}
            ]}),
        );
    };
    let mut edit_ms = Vec::new();
    for k in 0..edits {
        let version = k as i32 + 2;
        let new = if k % 2 == 0 { "0.6" } else { "0.5" };
        let t = Instant::now();
        change(&c, version, new);
        let d = c.diagnostics_for(version);
        edit_ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(d["diagnostics"], json!([]));
    }
    // Hover on a tensor expression in the model (the analysis is up to date).
    let hline = lines
        .iter()
        .position(|l| l.contains("x = block_5(x"))
        .unwrap() as u32;
    let mut hover_ms = Vec::new();
    for _ in 0..hovers {
        let t = Instant::now();
        let h = c.request(
            "textDocument/hover",
            json!({"textDocument": {"uri": uri}, "position": {"line": hline, "character": 8}}),
        );
        hover_ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(
            h["result"]["contents"]["value"]
                .as_str()
                .unwrap()
                .contains("fn block_5"),
            "{h}"
        );
    }
    // Inlay hints right after an edit: the server checks the new text, then answers.
    let whole =
        json!({"start": {"line": 0, "character": 0}, "end": {"line": lines.len(), "character": 0}});
    let mut hints_ms = Vec::new();
    for k in 0..edits {
        let version = (edits + k) as i32 + 2;
        let new = if k % 2 == 0 { "0.6" } else { "0.5" };
        let t = Instant::now();
        change(&c, version, new);
        let h = c.request(
            "textDocument/inlayHint",
            json!({"textDocument": {"uri": uri}, "range": whole}),
        );
        hints_ms.push(t.elapsed().as_secs_f64() * 1e3);
        // a type for each of the model's 24 bindings besides the params'
        let n = h["result"].as_array().map_or(0, Vec::len);
        assert!(n >= 14, "{n} hints: {h}");
    }
    let mut format_ms = Vec::new();
    let mut tokens_ms = Vec::new();
    for _ in 0..edits {
        let t = Instant::now();
        let f = c.request(
            "textDocument/formatting",
            json!({"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": true}}),
        );
        format_ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(f["result"].is_array(), "{f}");
        let t = Instant::now();
        let s = c.request(
            "textDocument/semanticTokens/full",
            json!({"textDocument": {"uri": uri}}),
        );
        tokens_ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert!(
            s["result"]["data"]
                .as_array()
                .is_some_and(|d| !d.is_empty()),
            "{s}"
        );
    }
    println!(
        "language server on a {}-line file (target host)",
        lines.len()
    );
    println!("| measure | median | p90 | budget |");
    println!("|---|---|---|---|");
    let p90 = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v[(v.len() * 9) / 10]
    };
    println!("| open -> diagnostics | {open_ms:.1} ms | | |");
    let row = |what: String, v: &[f64], budget: &str| {
        let digits = if v.iter().all(|&x| x < 0.1) { 3 } else { 1 };
        println!(
            "| {what} | {:.digits$} ms | {:.digits$} ms | {budget} |",
            median(v.to_vec()),
            p90(v)
        );
    };
    let debounce = est::lsp::DEBOUNCE.as_millis();
    row(
        format!("edit -> diagnostics ({edits} edits, {debounce} ms debounce included)"),
        &edit_ms,
        "50 ms",
    );
    row(
        format!("edit -> inlay hints ({edits} edits, asked for at once)"),
        &hints_ms,
        "50 ms",
    );
    row(
        format!("formatting ({edits} requests)"),
        &format_ms,
        "50 ms",
    );
    row(
        format!("semantic tokens ({edits} requests)"),
        &tokens_ms,
        "",
    );
    row(format!("hover ({hovers} requests)"), &hover_ms, "10 ms");
}
