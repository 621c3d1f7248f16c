//! The language server at the protocol level: an in-memory connection carries
//! requests and notifications to `est::lsp::serve` on a thread of its own, and the
//! responses are compared with snapshots (tests/snapshots/lsp__*.snap). One test runs
//! the real `estc lsp` binary over its stdio; a property test applies thousands of
//! random edits and checks every answer and the document's text.

use crossbeam_channel::{unbounded, Receiver, Sender};
use lsp_server::{Message, Notification, Request, RequestId};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::time::Duration;

struct Client {
    tx: Sender<Message>,
    rx: Receiver<Message>,
    next_id: i32,
    /// Notifications that came while waiting for a response.
    pending: Vec<Notification>,
}

const MAIN: &str = "file:///est-test/main.est";
const LIB: &str = "file:///est-test/lib.est";

impl Client {
    fn start(init: Value) -> Client {
        let (tx, server_rx) = unbounded();
        let (server_tx, rx) = unbounded();
        std::thread::spawn(move || est::lsp::serve(server_rx, server_tx));
        let mut c = Client {
            tx,
            rx,
            next_id: 0,
            pending: Vec::new(),
        };
        let r = c.request(
            "initialize",
            json!({"capabilities": {}, "initializationOptions": init}),
        );
        assert_eq!(r["result"]["serverInfo"]["name"], "estc");
        c.notify("initialized", json!({}));
        c
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = RequestId::from(self.next_id);
        self.tx
            .send(Message::Request(Request::new(
                id.clone(),
                method.into(),
                params,
            )))
            .unwrap();
        loop {
            match self
                .rx
                .recv_timeout(Duration::from_secs(30))
                .expect("a reply")
            {
                Message::Response(r) if r.id == id => return serde_json::to_value(r).unwrap(),
                Message::Notification(n) => self.pending.push(n),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    fn notify(&self, method: &str, params: Value) {
        self.tx
            .send(Message::Notification(Notification::new(
                method.into(),
                params,
            )))
            .unwrap();
    }

    /// The next notification with this method.
    fn next(&mut self, method: &str) -> Value {
        if let Some(i) = self.pending.iter().position(|n| n.method == method) {
            return self.pending.remove(i).params;
        }
        loop {
            match self
                .rx
                .recv_timeout(Duration::from_secs(30))
                .expect("a notification")
            {
                Message::Notification(n) if n.method == method => return n.params,
                Message::Notification(n) => self.pending.push(n),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    /// The next diagnostics published for `uri`.
    fn diagnostics(&mut self, uri: &str) -> Value {
        loop {
            let p = self.next("textDocument/publishDiagnostics");
            if p["uri"] == uri {
                return p;
            }
        }
    }

    fn open(&mut self, uri: &str, text: &str) -> Value {
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "est", "version": 1, "text": text}}),
        );
        self.diagnostics(uri)
    }

    fn change(&self, uri: &str, version: i32, changes: Value) {
        self.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": changes}),
        );
    }

    fn at(&mut self, method: &str, uri: &str, line: u32, character: u32) -> Value {
        self.request(
            method,
            json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}),
        )
    }

    fn text(&mut self, uri: &str) -> String {
        let r = self.request("est/documentText", json!({"uri": uri}));
        r["result"]["text"].as_str().unwrap().to_string()
    }
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap()
}

/// A program with a typo (`dense_` for `dense`) and a non-ASCII comment before it on
/// the same line, so that the range's UTF-16 columns differ from byte columns.
const PROGRAM: &str = "use std.nn.dense
use std.losses.softmax_cross_entropy

params {
  /// Hidden units of the first layer.
  hidden: int = 32
}

/// Reads the digits.
input digits() {
  csv(\"digits.csv\", columns: { pixels: f32[64], label: i32 })
    |> map |r| (r.pixels / 16.0, r.label)
    |> repeat
    |> batch(32, drop_remainder: true)
}

/// Two dense layers.
fn block(x, units: int) { dense(x, units) |> relu }

model mlp(features: f32[B, 64], labels: i32[B]) {
  let h = block(features, params.hidden)
  let logits = /* é😀 */ dense_(h, 10)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with sgd(lr: 0.1) }
}

estimator e { model = mlp  train_input = digits()  train_steps = 10 }
";

#[test]
fn diagnostics_on_open_and_after_edits() {
    let mut c = Client::start(json!({"target": "host"}));
    let d = c.open(MAIN, PROGRAM);
    insta::assert_snapshot!("open_diagnostics", pretty(&d));
    let diag = &d["diagnostics"][0];
    assert_eq!(diag["code"], "E0201");
    // `/* é😀 */ ` is 12 bytes but 10 UTF-16 units: `dense_` starts at column 25
    assert_eq!(diag["range"]["start"], json!({"line": 21, "character": 25}));
    // fix the typo incrementally: delete the `_` (UTF-16 columns 30..31)
    c.change(
        MAIN,
        2,
        json!([{"range": {"start": {"line": 21, "character": 30}, "end": {"line": 21, "character": 31}}, "text": ""}]),
    );
    let d = c.diagnostics(MAIN);
    assert_eq!(d["version"], 2);
    assert_eq!(d["diagnostics"], json!([]));
    assert!(c.text(MAIN).contains("/* é😀 */ dense(h, 10)"));
    // a full replacement
    c.change(
        MAIN,
        3,
        json!([{"text": PROGRAM.replace("params.hidden", "params.hiden")}]),
    );
    let d = c.diagnostics(MAIN);
    assert_eq!(d["version"], 3);
    let msgs: Vec<&str> = d["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["message"].as_str().unwrap())
        .collect();
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("`params` has no field `hiden`")),
        "{msgs:?}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.contains("help: did you mean `hidden`?")),
        "{msgs:?}"
    );
}

#[test]
fn a_request_during_the_debounce_does_not_swallow_diagnostics() {
    let mut c = Client::start(json!({"target": "host"}));
    let good = PROGRAM.replace("dense_", "dense");
    assert_eq!(c.open(MAIN, &good)["diagnostics"], json!([]));
    // an edit that adds an error, then at once a completion (typing `.`)
    c.change(MAIN, 2, json!([{"text": PROGRAM}]));
    let r = c.at("textDocument/completion", MAIN, 20, 33);
    assert!(r.get("result").is_some());
    let d = c.diagnostics(MAIN);
    assert_eq!(d["version"], 2);
    assert_eq!(d["diagnostics"][0]["code"], "E0201");
}

#[test]
fn lines_end_at_lf_crlf_and_lone_cr() {
    use est::lsp::LineIndex;
    use lsp_types::Position;
    let text = "a\rb\r\nc\nd";
    let idx = LineIndex::new(text);
    let pos = |line, character| Position { line, character };
    assert_eq!(idx.offset(text, pos(1, 0)), Some(2));
    assert_eq!(idx.offset(text, pos(1, 9)), Some(3));
    assert_eq!(idx.offset(text, pos(2, 0)), Some(5));
    assert_eq!(idx.offset(text, pos(3, 1)), Some(8));
    assert_eq!(idx.position(text, 5), pos(2, 0));
}

#[test]
fn rapid_changes_publish_only_the_latest_version() {
    let mut c = Client::start(json!({"target": "host"}));
    c.open(MAIN, PROGRAM);
    for v in 2..=6 {
        c.change(MAIN, v, json!([{"range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 0}}, "text": "\n"}]));
    }
    let d = c.diagnostics(MAIN);
    assert_eq!(
        d["version"], 6,
        "a result for an older version was published"
    );
    assert_eq!(d["diagnostics"][0]["range"]["start"]["line"], 26);
}

#[test]
fn target_from_configuration() {
    // without `repeat`, training runs out: an error on the wafer only (E0503)
    let program = PROGRAM
        .replace("    |> repeat\n", "")
        .replace("dense_", "dense");
    let mut c = Client::start(json!(null));
    let d = c.open(MAIN, &program);
    let codes: Vec<&str> = d["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["code"].as_str().unwrap())
        .collect();
    assert!(
        codes.contains(&"E0503"),
        "the default target is the wafer: {codes:?}"
    );
    c.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": {"est": {"target": "host"}}}),
    );
    let d = c.diagnostics(MAIN);
    assert_eq!(d["diagnostics"], json!([]));
}

#[test]
fn importers_are_rechecked() {
    let mut c = Client::start(json!({"target": "host"}));
    let lib = "/// Doubles.\npub fn twice(x) { x * 2.0 }\n";
    c.open(LIB, lib);
    let main = PROGRAM
        .replace("use std.nn.dense\n", "use std.nn.dense\nuse lib.twice\n")
        .replace("dense_(h, 10)", "dense(twice(h), 10)");
    let d = c.open(MAIN, &main);
    assert_eq!(d["diagnostics"], json!([]));
    // hover and definition across files
    let h = c.at("textDocument/hover", MAIN, 22, 33);
    assert!(
        h["result"]["contents"]["value"]
            .as_str()
            .unwrap()
            .contains("pub fn twice(x)"),
        "{h}"
    );
    let def = c.at("textDocument/definition", MAIN, 22, 33);
    assert_eq!(def["result"]["uri"], LIB);
    // renaming the function in the library breaks the importer
    c.change(LIB, 2, json!([{"text": lib.replace("twice", "thrice")}]));
    let mut found = false;
    for _ in 0..4 {
        let d = c.diagnostics(MAIN);
        if d["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["message"].as_str().unwrap().contains("twice"))
        {
            found = true;
            break;
        }
    }
    assert!(found, "main.est was not re-checked after lib.est changed");
    // an error in the library that only checking main finds (a shape error where
    // main calls it) shows at main's `use`, with where it is
    c.change(
        LIB,
        3,
        json!([{"text": "pub fn twice(x) { reshape(x, [7]) }\n"}]),
    );
    let mut shown = None;
    for _ in 0..4 {
        let d = c.diagnostics(MAIN);
        if let Some(x) = d["diagnostics"].as_array().unwrap().iter().find(|d| {
            d["message"]
                .as_str()
                .unwrap()
                .starts_with("/est-test/lib.est:1:")
        }) {
            shown = Some(x.clone());
            break;
        }
    }
    let shown = shown.expect("the library's shape error is shown in main.est");
    assert_eq!(shown["range"]["start"], json!({"line": 1, "character": 0}));
    assert_eq!(shown["relatedInformation"][0]["location"]["uri"], LIB);
}

#[test]
fn hover_definition_symbols_completion() {
    let mut c = Client::start(json!({"target": "host"}));
    let program = PROGRAM.replace("dense_", "dense");
    c.open(MAIN, &program);
    // hover on an expression (the call `dense(h, 10)`): its tensor type
    let h = c.at("textDocument/hover", MAIN, 21, 36);
    insta::assert_snapshot!("hover_tensor", pretty(&h["result"]));
    // hover on a params field: its declaration and doc comment, and its value
    let h = c.at("textDocument/hover", MAIN, 20, 35);
    insta::assert_snapshot!("hover_params_field", pretty(&h["result"]));
    // hover on a function: its signature and doc comment
    let h = c.at("textDocument/hover", MAIN, 20, 11);
    insta::assert_snapshot!("hover_function", pretty(&h["result"]));
    // go to definition: a local, a function, a params field, a std item
    let local = c.at("textDocument/definition", MAIN, 21, 31);
    assert_eq!(
        local["result"]["range"]["start"],
        json!({"line": 20, "character": 6})
    );
    let func = c.at("textDocument/definition", MAIN, 20, 11);
    assert_eq!(
        func["result"]["range"]["start"],
        json!({"line": 17, "character": 3})
    );
    let field = c.at("textDocument/definition", MAIN, 20, 35);
    assert_eq!(
        field["result"]["range"]["start"],
        json!({"line": 5, "character": 2})
    );
    let std_item = c.at("textDocument/definition", MAIN, 17, 27);
    let uri = std_item["result"]["uri"].as_str().unwrap();
    assert!(uri.ends_with("stdlib/nn.est"), "{uri}");
    let path = est::lsp::uri_path(uri);
    assert!(std::fs::read_to_string(path).unwrap().contains("fn dense("));
    // document symbols
    let s = c.request(
        "textDocument/documentSymbol",
        json!({"textDocument": {"uri": MAIN}}),
    );
    insta::assert_snapshot!("symbols", pretty(&s["result"]));
    // completion: std modules after `use`, params fields, named arguments, names in scope
    let labels = |v: &Value| -> Vec<String> {
        v["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["label"].as_str().unwrap().to_string())
            .collect()
    };
    c.change(MAIN, 2, json!([{"text": format!("use std.\n{program}")}]));
    let l = labels(&c.at("textDocument/completion", MAIN, 0, 8));
    assert!(
        l.contains(&"std.nn".to_string()) && l.contains(&"std.losses".to_string()),
        "{l:?}"
    );
    c.change(
        MAIN,
        3,
        json!([{"text": format!("use std.nn.\n{program}")}]),
    );
    let l = labels(&c.at("textDocument/completion", MAIN, 0, 11));
    assert!(l.contains(&"conv2d".to_string()), "{l:?}");
    c.change(MAIN, 4, json!([{"text": program.clone()}]));
    let l = labels(&c.at("textDocument/completion", MAIN, 20, 34));
    assert_eq!(l, ["hidden"]);
    // inside `block(features, |)`: its parameters first, then the names in scope
    let l = labels(&c.at("textDocument/completion", MAIN, 20, 25));
    assert_eq!(&l[..2], ["units:", "x:"]);
    assert!(
        l.contains(&"features".to_string())
            && l.contains(&"labels".to_string())
            && l.contains(&"dense".to_string()),
        "{l:?}"
    );
    let l = labels(&c.at("textDocument/completion", MAIN, 23, 2));
    assert!(
        l.contains(&"logits".to_string()) && l.contains(&"h".to_string()),
        "{l:?}"
    );
}

#[test]
fn bad_input_gets_errors_and_loses_nothing() {
    let mut c = Client::start(json!({"target": "host"}));
    c.open(MAIN, PROGRAM);
    let r = c.request("textDocument/unknownThing", json!({}));
    assert_eq!(r["error"]["code"], -32601);
    let r = c.request("textDocument/hover", json!({"textDocument": 3}));
    assert_eq!(r["error"]["code"], -32602);
    let r = c.at("textDocument/hover", "file:///never/opened.est", 0, 0);
    assert_eq!(r["error"]["code"], -32602);
    assert_eq!(
        r["error"]["message"],
        "file:///never/opened.est is not open"
    );
    // an edit whose range ends before it starts is refused; the text stays
    c.change(MAIN, 2, json!([{"range": {"start": {"line": 3, "character": 0}, "end": {"line": 1, "character": 0}}, "text": "x"}]));
    let m = c.next("window/showMessage");
    assert!(
        m["message"]
            .as_str()
            .unwrap()
            .starts_with("rejected an edit of file:///est-test/main.est (version 2)"),
        "{m}"
    );
    assert_eq!(c.text(MAIN), PROGRAM);
    // positions past a line's end or the text's end are clamped, as the protocol says
    c.change(MAIN, 3, json!([{"range": {"start": {"line": 900, "character": 0}, "end": {"line": 901, "character": 5}}, "text": "// end\n"}]));
    assert_eq!(c.text(MAIN), format!("{PROGRAM}// end\n"));
    // requests before initialize, after shutdown
    let r = c.request("shutdown", json!(null));
    assert_eq!(r["result"], json!(null));
    let r = c.at("textDocument/hover", MAIN, 0, 0);
    assert_eq!(r["error"]["code"], -32600);
    // (issue 43, finding 24: a second shutdown too, as docs/cli.md says; it was null)
    let r = c.request("shutdown", json!(null));
    assert_eq!(r["error"]["code"], -32600, "{r}");
}

#[test]
fn the_binary_speaks_json_rpc_over_stdio() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_estc"))
        .arg("lsp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let send = |stdin: &mut std::process::ChildStdin, v: Value| {
        let b = v.to_string();
        write!(stdin, "Content-Length: {}\r\n\r\n{b}", b.len()).unwrap();
        stdin.flush().unwrap();
    };
    let mut recv = || -> Value {
        let mut len = 0;
        loop {
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            let line = line.trim();
            if line.is_empty() {
                break;
            }
            if let Some(v) = line.strip_prefix("Content-Length: ") {
                len = v.parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        stdout.read_exact(&mut body).unwrap();
        serde_json::from_slice(&body).unwrap()
    };
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}),
    );
    let r = recv();
    assert_eq!(r["result"]["capabilities"]["hoverProvider"], true);
    assert_eq!(r["result"]["capabilities"]["textDocumentSync"]["change"], 2);
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}),
    );
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": MAIN, "languageId": "est", "version": 1, "text": PROGRAM}}}),
    );
    let d = recv();
    assert_eq!(d["method"], "textDocument/publishDiagnostics");
    assert_eq!(d["params"]["diagnostics"][0]["code"], "E0201");
    // malformed JSON: a parse error, and the server reads on
    write!(stdin, "Content-Length: 5\r\n\r\n{{bad}}").unwrap();
    stdin.flush().unwrap();
    let e = recv();
    assert_eq!(e["error"]["code"], -32700);
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}),
    );
    assert_eq!(recv()["id"], 2);
    send(&mut stdin, json!({"jsonrpc": "2.0", "method": "exit"}));
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// The real `estc lsp` over pipes, for tests of the framing: raw bytes in, framed
/// messages out (read on a thread, so that a missing answer fails instead of hanging).
struct Stdio {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    rx: Receiver<Value>,
}

impl Stdio {
    fn start() -> Stdio {
        use std::io::{BufRead, BufReader, Read};
        use std::process::{Command, Stdio as Pipe};
        let mut child = Command::new(env!("CARGO_BIN_EXE_estc"))
            .arg("lsp")
            .stdin(Pipe::piped())
            .stdout(Pipe::piped())
            .stderr(Pipe::null())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, rx) = unbounded();
        std::thread::spawn(move || loop {
            let mut len = None;
            loop {
                let mut line = String::new();
                if stdout.read_line(&mut line).unwrap_or(0) == 0 {
                    return;
                }
                let line = line.trim();
                if line.is_empty() {
                    break;
                }
                if let Some(v) = line.strip_prefix("Content-Length: ") {
                    len = v.parse().ok();
                }
            }
            let mut body = vec![0; len.expect("a Content-Length from the server")];
            stdout.read_exact(&mut body).unwrap();
            if tx.send(serde_json::from_slice(&body).unwrap()).is_err() {
                return;
            }
        });
        Stdio { child, stdin, rx }
    }

    fn raw(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.stdin.write_all(bytes).unwrap();
        self.stdin.flush().unwrap();
    }

    fn send(&mut self, v: Value) {
        let b = v.to_string();
        self.raw(format!("Content-Length: {}\r\n\r\n{b}", b.len()).as_bytes());
    }

    fn recv(&mut self) -> Value {
        self.rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the server answers")
    }

    /// A request the server answers with the text of `MAIN`, to see that it still
    /// serves.
    fn text_request(id: i32, pad: usize) -> String {
        json!({"jsonrpc": "2.0", "id": id, "method": "est/documentText", "params": {"uri": MAIN, "pad": "x".repeat(pad)}})
            .to_string()
    }

    fn assert_serves(&mut self, id: i32) {
        self.send(serde_json::from_str(&Stdio::text_request(id, 0)).unwrap());
        let r = self.recv();
        assert_eq!(r["id"], id, "{r}");
        assert_eq!(r["result"]["text"], "fn f() { 1 }\n", "{r}");
    }
}

/// Bad framing costs one message, never the connection: after a header block without
/// a valid `Content-Length`, a non-UTF-8 header line, or a body of the wrong length,
/// the server reads on from the next `Content-Length:` header. A request whose id is
/// neither a number nor a string gets -32600 with a null id.
#[test]
fn the_binary_resynchronises_after_bad_frames() {
    let mut s = Stdio::start();
    s.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}, "initializationOptions": {"target": "host"}}}));
    assert_eq!(s.recv()["id"], 1);
    s.send(json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": MAIN, "languageId": "est", "version": 1, "text": "fn f() { 1 }\n"}}}));
    assert_eq!(s.recv()["method"], "textDocument/publishDiagnostics");
    s.assert_serves(2);
    // a Content-Length that is not a number, then one that is missing
    let body = Stdio::text_request(100, 0);
    s.raw(format!("Content-Length: many\r\n\r\n{body}").as_bytes());
    s.assert_serves(3);
    s.raw(format!("Content-Type: application/json\r\n\r\n{body}").as_bytes());
    s.assert_serves(4);
    // a header line that is not UTF-8
    s.raw(b"X-Note: \xff\xfe\xfd\r\n");
    s.assert_serves(5);
    // a Content-Length beyond the body swallows the next frame's header: a parse
    // error, then the server finds that header in what it read
    s.raw(format!("Content-Length: {}\r\n\r\n{body}", body.len() + 40).as_bytes());
    let next = Stdio::text_request(6, 100);
    s.raw(format!("Content-Length: {}\r\n\r\n{next}", next.len()).as_bytes());
    let e = s.recv();
    assert_eq!(
        (e["error"]["code"].as_i64(), &e["id"]),
        (Some(-32700), &Value::Null),
        "{e}"
    );
    let r = s.recv();
    assert_eq!(
        (r["id"].as_i64(), &r["result"]["text"]),
        (Some(6), &json!("fn f() { 1 }\n")),
        "{r}"
    );
    // a body longer than its Content-Length: the rest is read as headers, and skipped
    s.raw(format!("Content-Length: 10\r\n\r\n{body}").as_bytes());
    let e = s.recv();
    assert_eq!(e["error"]["code"], -32700, "{e}");
    s.assert_serves(7);
    // ids that are neither numbers nor strings: -32600 with a null id
    for id in [json!({"a": 1}), json!([8]), json!(null), json!(true)] {
        s.send(json!({"jsonrpc": "2.0", "id": id, "method": "shutdown"}));
        let e = s.recv();
        assert_eq!(e["error"]["code"], -32600, "{id}: {e}");
        assert_eq!(e["id"], Value::Null, "{id}: {e}");
    }
    // numbers that LSP does not allow as ids (a fraction, beyond 32 bits): -32600 with
    // the id, which JSON-RPC allows
    for id in [json!(1.5), json!(1_u64 << 40)] {
        s.send(json!({"jsonrpc": "2.0", "id": id, "method": "shutdown"}));
        let e = s.recv();
        assert_eq!(e["error"]["code"], -32600, "{id}: {e}");
        assert_eq!(e["id"], id, "{id}: {e}");
    }
    // the shutdown requests above were refused, not run
    s.assert_serves(8);
    s.send(json!({"jsonrpc": "2.0", "id": 9, "method": "shutdown"}));
    assert_eq!(s.recv()["id"], 9);
    s.send(json!({"jsonrpc": "2.0", "method": "exit"}));
    assert_eq!(s.child.wait().unwrap().code(), Some(0));
}

/// The protocol's view of an edit: UTF-16 positions, clamped, applied to `text` by an
/// independent oracle.
fn oracle_apply(text: &mut String, sl: u32, sc: u32, el: u32, ec: u32, new: &str) -> bool {
    let offset = |line: u32, ch: u32| -> usize {
        let mut at = 0;
        for (i, l) in text.split('\n').enumerate() {
            if i as u32 == line {
                let mut units = 0;
                for (j, c) in l.char_indices() {
                    if units >= ch {
                        return at + j;
                    }
                    units += c.len_utf16() as u32;
                }
                return at + l.len();
            }
            at += l.len() + 1;
        }
        text.len()
    };
    let (a, b) = (offset(sl, sc), offset(el, ec));
    if a > b {
        return false;
    }
    text.replace_range(a..b, new);
    true
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    /// Random edits, many breaking the syntax mid-token, some with non-ASCII text and
    /// ranges past the ends: the server answers every request and its text is the
    /// text the edits produce.
    #[test]
    fn random_edits_keep_the_text_and_the_server_answers(
        edits in proptest::collection::vec(
            (0u32..30, 0u32..60, 0u32..4, 0u32..60, prop_oneof![
                Just(String::new()), Just("x".to_string()), Just("(".to_string()),
                Just("}".to_string()), Just("\n".to_string()), Just("é😀".to_string()),
                Just("let y = ".to_string()), Just("|> batch(".to_string()), "[a-z ]{0,6}",
            ]),
            250..400,
        )
    ) {
        let mut c = Client::start(json!({"target": "host"}));
        c.open(MAIN, PROGRAM);
        let mut text = PROGRAM.to_string();
        for (k, (sl, sc, dl, ec, new)) in edits.iter().enumerate() {
            let el = sl + dl;
            let applied = oracle_apply(&mut text, *sl, *sc, el, *ec, new);
            c.change(MAIN, k as i32 + 2, json!([{"range": {"start": {"line": sl, "character": sc}, "end": {"line": el, "character": ec}}, "text": new}]));
            if !applied {
                let m = c.next("window/showMessage");
                prop_assert!(m["message"].as_str().unwrap().starts_with("rejected an edit"));
            }
            if k % 25 == 0 {
                let h = c.at("textDocument/hover", MAIN, *sl, *sc);
                prop_assert!(h.get("result").is_some(), "{}", h);
                let s = c.at("textDocument/completion", MAIN, *sl, *sc);
                prop_assert!(s.get("result").is_some(), "{}", s);
                let h = c.request("textDocument/inlayHint", json!({"textDocument": {"uri": MAIN}, "range": {"start": {"line": 0, "character": 0}, "end": {"line": 99, "character": 0}}}));
                prop_assert!(h["result"].is_array(), "{}", h);
                // formatting: the edits give `estc fmt`'s text, or none if it does not parse
                let f = c.request("textDocument/formatting", json!({"textDocument": {"uri": MAIN}, "options": {"tabSize": 2, "insertSpaces": true}}));
                let want = est::syntax::format::format(est::span::FileId(0), &text).ok();
                prop_assert_eq!(formatted(&text, &f["result"]), want);
                // signature help, semantic tokens and rename answer (a rename with an
                // error when there is nothing to rename), and rename's edits apply
                let h = c.at("textDocument/signatureHelp", MAIN, *sl, *sc);
                prop_assert!(h.get("result").is_some(), "{}", h);
                let t = c.request("textDocument/semanticTokens/full", json!({"textDocument": {"uri": MAIN}}));
                prop_assert!(t["result"]["data"].as_array().is_some_and(|d| d.len() % 5 == 0), "{}", t);
                let r = c.request("textDocument/rename", json!({"textDocument": {"uri": MAIN}, "position": {"line": sl, "character": sc}, "newName": "renamed"}));
                prop_assert!(r.get("result").is_some() || r["error"]["code"] == -32803, "{}", r);
                if let Some(edits) = r["result"]["changes"][MAIN].as_array() {
                    let mut t = text.clone();
                    for e in edits.iter().rev() {
                        let n = |v: &Value| v.as_u64().unwrap() as u32;
                        let g = &e["range"];
                        prop_assert!(oracle_apply(&mut t, n(&g["start"]["line"]), n(&g["start"]["character"]), n(&g["end"]["line"]), n(&g["end"]["character"]), "renamed"));
                    }
                }
            }
        }
        prop_assert_eq!(c.text(MAIN), text);
        let s = c.request("textDocument/documentSymbol", json!({"textDocument": {"uri": MAIN}}));
        prop_assert!(s.get("result").is_some());
    }
}

/// A program whose train and eval graphs differ in their batch (32 and 16), with a
/// loop, a function called with several shapes, and a closure.
const SHAPES: &str = "use std.nn.dense
use std.losses.softmax_cross_entropy

params {
  hidden: int = 32
  layers: [int] = [16, 8]
}

input digits(size: int) {
  csv(\"digits.csv\", columns: { pixels: f32[64], label: i32 })
    |> map |r| (r.pixels / 16.0, r.label)
    |> repeat
    |> batch(size, drop_remainder: true)
}

fn block(x, units: int) { dense(x, units) |> relu }

model mlp(features: f32[B, 64], labels: i32[B]) {
  let width = params.hidden * 2
  let h = block(features, width)
  for units in params.layers { h = block(h, units) }
  let logits = dense(h, 10)
  let loss = softmax_cross_entropy(labels, logits)
  train { minimize loss with sgd(lr: 0.1) }
  predict { classes = argmax(logits, 1) }
}

estimator e { model = mlp  train_input = digits(32)  eval_input = digits(16)  train_steps = 10 }
";

/// The inlay hints of the whole document, as `line:character label`.
fn hints(c: &mut Client, uri: &str) -> Vec<String> {
    let r = c.request(
        "textDocument/inlayHint",
        json!({"textDocument": {"uri": uri}, "range": {"start": {"line": 0, "character": 0}, "end": {"line": 999, "character": 0}}}),
    );
    r["result"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|h| {
            format!(
                "{}:{} {}",
                h["position"]["line"],
                h["position"]["character"],
                h["label"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn inlay_hints_show_each_bindings_shape_in_the_chosen_mode() {
    let mut c = Client::start(json!({"target": "host"}));
    let d = c.open(MAIN, SHAPES);
    assert_eq!(d["diagnostics"], json!([]), "{d}");
    let train = hints(&mut c, MAIN);
    insta::assert_snapshot!("inlay_hints_train", train.join("\n"));
    c.notify(
        "workspace/didChangeConfiguration",
        json!({"settings": {"est": {"mode": "eval"}}}),
    );
    let eval = hints(&mut c, MAIN);
    insta::assert_snapshot!("inlay_hints_eval", eval.join("\n"));
}

#[test]
fn hover_answers_on_every_name_being_bound() {
    let mut c = Client::start(json!({"target": "host"}));
    c.open(MAIN, SHAPES);
    let value = |c: &mut Client, line: u32, character: u32| -> String {
        let h = c.at("textDocument/hover", MAIN, line, character);
        h["result"]["contents"]["value"]
            .as_str()
            .unwrap_or_else(|| panic!("no hover at {line}:{character}: {h}"))
            .to_string()
    };
    // a `let`, in each mode's graph (the batch differs)
    insta::assert_snapshot!("hover_let", value(&mut c, 19, 6));
    // a model parameter, a function parameter bound by three calls, a loop variable
    insta::assert_snapshot!("hover_model_param", value(&mut c, 17, 12));
    insta::assert_snapshot!("hover_fn_param", value(&mut c, 15, 9));
    insta::assert_snapshot!("hover_loop_var", value(&mut c, 20, 8));
    // a params field at its declaration, and a closure's parameter
    insta::assert_snapshot!("hover_params_decl", value(&mut c, 4, 3));
    insta::assert_snapshot!("hover_closure_param", value(&mut c, 10, 12));
    // in a file with an error, the bindings before and beside it still answer
    let broken = SHAPES.replace("let logits = dense(h, 10)", "let logits = dense_(h, 10)");
    c.change(MAIN, 2, json!([{"text": broken}]));
    assert!(value(&mut c, 19, 6).contains("`f32[32, 64]`"));
    assert!(value(&mut c, 18, 6).contains("`int = 64`"));
    let after = c.at("textDocument/hover", MAIN, 21, 6);
    assert_eq!(after["result"], Value::Null, "{after}");
    // a syntax error in another function: the model still elaborates, and answers
    let broken = SHAPES.replace("\nmodel mlp", "\nfn unused(x) { x + }\nmodel mlp");
    c.change(MAIN, 3, json!([{"text": broken}]));
    let d = loop {
        let d = c.diagnostics(MAIN);
        if d["version"] == 3 {
            break d;
        }
    };
    assert_eq!(d["diagnostics"][0]["code"], "E0101", "{d}");
    assert!(
        value(&mut c, 20, 6).contains("`f32[32, 64]`"),
        "{}",
        value(&mut c, 20, 6)
    );
}

/// A text with the edits of a formatting response applied (`None` for a null result).
fn formatted(text: &str, edits: &Value) -> Option<String> {
    let edits = edits.as_array()?;
    let mut out = text.to_string();
    for e in edits.iter().rev() {
        let r = &e["range"];
        let n = |v: &Value| v.as_u64().unwrap() as u32;
        assert!(oracle_apply(
            &mut out,
            n(&r["start"]["line"]),
            n(&r["start"]["character"]),
            n(&r["end"]["line"]),
            n(&r["end"]["character"]),
            e["newText"].as_str().unwrap(),
        ));
    }
    Some(out)
}

#[test]
fn formatting_gives_the_edit_to_the_canonical_layout() {
    let mut c = Client::start(json!({"target": "host"}));
    let messy = SHAPES
        .replace(
            "  let width = params.hidden * 2",
            "      let width=params.hidden*2   // doubled",
        )
        .replace("{ minimize", "{minimize");
    let messy = format!("// é😀 first\n\n\n{messy}");
    c.open(MAIN, &messy);
    let format = |c: &mut Client| {
        c.request(
            "textDocument/formatting",
            json!({"textDocument": {"uri": MAIN}, "options": {"tabSize": 2, "insertSpaces": true}}),
        )
    };
    let f = format(&mut c);
    insta::assert_snapshot!("formatting", pretty(&f["result"]));
    let want = est::syntax::format::format(est::span::FileId(0), &messy).unwrap();
    assert!(
        want.contains("  let width = params.hidden * 2  // doubled\n"),
        "{want}"
    );
    assert!(want.starts_with("// é😀 first\n\nuse"), "{want}");
    assert_eq!(
        formatted(&messy, &f["result"]).as_deref(),
        Some(want.as_str())
    );
    // one edit, from the first change to the last
    assert_eq!(f["result"].as_array().unwrap().len(), 1, "{f}");
    // formatted text needs no edit; text that does not parse gets none
    c.change(MAIN, 2, json!([{"text": want}]));
    assert_eq!(format(&mut c)["result"], json!([]));
    c.change(MAIN, 3, json!([{"text": "fn f( {"}]));
    assert_eq!(format(&mut c)["result"], Value::Null);
}

/// A program of two files: `lib.est` defines a function the main file imports and
/// calls with a named argument; the main file's input uses its parameter in a string.
const LIB_TEXT: &str = "/// Scales.\npub fn twice(x, scale: float = 2.0) { x * scale }\n";

fn main_text() -> String {
    SHAPES
        .replace("use std.nn.dense\n", "use std.nn.dense\nuse lib.twice\n")
        .replace(
            "csv(\"digits.csv\"",
            "csv(\"digits_{ size }_\\{size}_{params.hidden}.csv\"",
        )
        .replace(
            "let logits = dense(h, 10)",
            "let logits = dense(twice((h), scale: 3.0), 10)",
        )
}

/// Applies a workspace edit's changes to the texts they name.
fn apply_workspace_edit(texts: &mut std::collections::HashMap<String, String>, edit: &Value) {
    for (uri, edits) in edit["changes"]
        .as_object()
        .unwrap_or_else(|| panic!("{edit}"))
    {
        let text = texts
            .get_mut(uri)
            .unwrap_or_else(|| panic!("an edit of {uri}"));
        *text = formatted(text, edits).unwrap();
    }
}

#[test]
fn rename_changes_every_use_across_the_programs_files() {
    let mut c = Client::start(json!({"target": "host"}));
    let mut texts = std::collections::HashMap::new();
    texts.insert(LIB.to_string(), LIB_TEXT.to_string());
    texts.insert(MAIN.to_string(), main_text());
    c.open(LIB, LIB_TEXT);
    let d = c.open(MAIN, &main_text());
    assert_eq!(d["diagnostics"], json!([]), "{d}");
    let mut version = 1;
    // line:character of a name in the main text (its n-th occurrence)
    let at = |texts: &std::collections::HashMap<String, String>, uri: &str, pat: &str, n: usize| {
        let t = &texts[uri];
        let i = t
            .match_indices(pat)
            .nth(n)
            .unwrap_or_else(|| panic!("{pat} in {t}"))
            .0;
        let line = t[..i].matches('\n').count() as u32;
        let col = (i - t[..i].rfind('\n').map_or(0, |k| k + 1)) as u32;
        (line, col)
    };
    let mut rename = |c: &mut Client,
                      texts: &mut std::collections::HashMap<String, String>,
                      uri: &str,
                      (line, character): (u32, u32),
                      new: &str| {
        let p = c.request(
            "textDocument/prepareRename",
            json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}}),
        );
        assert!(p["result"]["start"].is_object(), "{p}");
        let r = c.request(
            "textDocument/rename",
            json!({"textDocument": {"uri": uri}, "position": {"line": line, "character": character}, "newName": new}),
        );
        insta::assert_snapshot!(format!("rename_to_{new}"), pretty(&r["result"]));
        apply_workspace_edit(texts, &r["result"]);
        version += 1;
        for (u, t) in texts.iter() {
            c.change(u, version, json!([{"text": t}]));
        }
        let d = c.diagnostics(MAIN);
        assert_eq!(
            d["diagnostics"],
            json!([]),
            "after renaming to {new}: {d}\n{}",
            texts[MAIN]
        );
    };
    // a local, from its binding
    let p = at(&texts, MAIN, "let h", 0);
    rename(&mut c, &mut texts, MAIN, (p.0, p.1 + 4), "hidden_state");
    assert_eq!(
        texts[MAIN].matches("hidden_state").count(),
        4,
        "{}",
        texts[MAIN]
    );
    assert!(
        !texts[MAIN].contains("(h,") && !texts[MAIN].contains(" h "),
        "{}",
        texts[MAIN]
    );
    // a function of the other file, from its call: its definition, the `use` and the call
    let p = at(&texts, MAIN, "twice(", 0);
    rename(&mut c, &mut texts, MAIN, p, "scaled");
    assert!(texts[LIB].contains("pub fn scaled(x"), "{}", texts[LIB]);
    assert!(
        texts[MAIN].contains("use lib.scaled\n")
            && texts[MAIN].contains("dense(scaled((hidden_state)")
    );
    // a parameter, from a named argument in the other file: the argument, the
    // parameter and its use in the body
    // (with the cursor right after the name, as editors put it)
    let p = at(&texts, MAIN, "scale:", 0);
    rename(&mut c, &mut texts, MAIN, (p.0, p.1 + 5), "factor");
    assert_eq!(
        texts[LIB],
        "/// Scales.\npub fn scaled(x, factor: float = 2.0) { x * factor }\n"
    );
    assert!(texts[MAIN].contains("scaled((hidden_state), factor: 3.0)"));
    // a params field, from a use: its declaration and every `params.` use
    let p = at(&texts, MAIN, "params.hidden", 1);
    rename(&mut c, &mut texts, MAIN, (p.0, p.1 + 8), "base_width");
    assert!(
        texts[MAIN].contains("  base_width: int = 32\n")
            && texts[MAIN].contains("params.base_width * 2")
    );
    // an input's parameter, used inside a string
    let p = at(&texts, MAIN, "size: int", 0);
    rename(&mut c, &mut texts, MAIN, p, "rows");
    // (and inside a string, but not where `\{` is no interpolation)
    assert!(
        texts[MAIN].contains("digits(rows: int)")
            && texts[MAIN].contains("\"digits_{ rows }_\\{size}_{params.base_width}.csv\"")
            && texts[MAIN].contains("batch(rows, "),
        "{}",
        texts[MAIN]
    );
    // refused: a standard library name, a keyword, nothing
    let p = at(&texts, MAIN, "dense(", 0);
    let r = c.request("textDocument/rename", json!({"textDocument": {"uri": MAIN}, "position": {"line": p.0, "character": p.1}, "newName": "dense2"}));
    assert_eq!(r["error"]["code"], -32803, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("standard library"),
        "{r}"
    );
    // refused: names that would clash, where the name is bound or used
    let p = at(&texts, MAIN, "let width", 0);
    for (new, why) in [
        ("logits", "`logits` is already bound in `mlp`"),
        ("block", "`block` already names an item"),
        ("relu", "`relu` already names an item"),
        ("mode", "`mode` is a built-in name"),
    ] {
        let r = c.request("textDocument/rename", json!({"textDocument": {"uri": MAIN}, "position": {"line": p.0, "character": p.1 + 4}, "newName": new}));
        assert_eq!(r["error"]["code"], -32803, "{r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(why), "{r}");
    }
    let q = at(&texts, MAIN, "  base_width: int", 0);
    let r = c.request("textDocument/rename", json!({"textDocument": {"uri": MAIN}, "position": {"line": q.0, "character": q.1 + 3}, "newName": "layers"}));
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`params` already has a field `layers`"),
        "{r}"
    );
    let r = c.request("textDocument/rename", json!({"textDocument": {"uri": MAIN}, "position": {"line": p.0, "character": p.1 + 4}, "newName": "model"}));
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not a name"),
        "{r}"
    );
    let r = c.request(
        "textDocument/prepareRename",
        json!({"textDocument": {"uri": MAIN}, "position": {"line": p.0, "character": p.1}}),
    );
    assert_eq!(r["error"]["code"], -32803, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no name here"),
        "{r}"
    );
}

#[test]
fn signature_help_names_the_parameter_being_written() {
    let mut c = Client::start(json!({"target": "host"}));
    let text = SHAPES.replace(
        "  let width = params.hidden * 2\n",
        "  let width = params.hidden * 2\n  let probe = block(features, \n",
    );
    c.open(MAIN, &text);
    let help = |c: &mut Client, line: u32, character: u32| {
        let r = c.at("textDocument/signatureHelp", MAIN, line, character);
        let s = &r["result"]["signatures"][0];
        let label = s["label"]
            .as_str()
            .unwrap_or_else(|| panic!("{r}"))
            .to_string();
        let active = r["result"]["activeParameter"].as_u64().unwrap() as usize;
        let [lo, hi] =
            [0, 1].map(|k| s["parameters"][active]["label"][k].as_u64().unwrap() as usize);
        (label.clone(), label[lo..hi].to_string())
    };
    // a function of the file, while its call is being written (the text does not parse)
    assert_eq!(
        help(&mut c, 19, 30),
        ("block(x, units: int)".to_string(), "units: int".to_string())
    );
    let r = c.at("textDocument/signatureHelp", MAIN, 19, 30);
    insta::assert_snapshot!("signature_help", pretty(&r["result"]));
    // a named argument of a standard function, and a piped call's first argument
    c.change(MAIN, 2, json!([{"text": SHAPES}]));
    let (label, param) = help(&mut c, 12, 35);
    assert!(label.starts_with("batch(ds, "), "{label}");
    assert_eq!(param, "drop_remainder: bool = false");
    let (_, param) = help(&mut c, 12, 15);
    assert_eq!(param, "size: int");
    // outside a call: nothing
    let r = c.at("textDocument/signatureHelp", MAIN, 18, 4);
    assert_eq!(r["result"], Value::Null, "{r}");
}

#[test]
fn semantic_tokens_tell_tensors_from_static_values() {
    let mut c = Client::start(json!({"target": "host"}));
    c.open(MAIN, SHAPES);
    let r = c.request(
        "textDocument/semanticTokens/full",
        json!({"textDocument": {"uri": MAIN}}),
    );
    let data: Vec<u64> = r["result"]["data"]
        .as_array()
        .unwrap_or_else(|| panic!("{r}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    let (types, mods) = (est::lsp::TOKEN_TYPES, est::lsp::TOKEN_MODIFIERS);
    let lines: Vec<&str> = SHAPES.lines().collect();
    let (mut line, mut col) = (0, 0);
    let mut shown = Vec::new();
    for t in data.chunks(5) {
        if t[0] > 0 {
            col = 0;
        }
        line += t[0] as usize;
        col += t[1] as usize;
        let name = &lines[line][col..col + t[2] as usize];
        let m: Vec<&str> = (0..4)
            .filter(|k| t[4] & (1 << k) != 0)
            .map(|k| mods[k])
            .collect();
        shown.push(format!(
            "{}:{col} {name} {} {}",
            line,
            types[t[3] as usize],
            m.join(",")
        ));
    }
    insta::assert_snapshot!("semantic_tokens", shown.join("\n"));
}

/// Opens `text`, takes the quick fix of its diagnostic `code`, applies it, and returns
/// the fixed text (whose diagnostics no longer have `code`) with the code action.
fn quick_fix(init: Value, text: &str, code: &str) -> (String, Value) {
    let mut c = Client::start(init);
    let d = c.open(MAIN, text);
    let diag = d["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["code"] == code)
        .unwrap_or_else(|| panic!("no {code} in {d}"))
        .clone();
    let r = c.request(
        "textDocument/codeAction",
        json!({"textDocument": {"uri": MAIN}, "range": diag["range"], "context": {"diagnostics": [diag]}}),
    );
    let action = r["result"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["diagnostics"][0]["code"] == code))
        .unwrap_or_else(|| panic!("no fix for {code}: {r}"))
        .clone();
    assert_eq!(action["kind"], "quickfix");
    let mut texts = std::collections::HashMap::new();
    texts.insert(MAIN.to_string(), text.to_string());
    apply_workspace_edit(&mut texts, &action["edit"]);
    let fixed = texts[MAIN].clone();
    c.change(MAIN, 2, json!([{"text": fixed}]));
    let d = c.diagnostics(MAIN);
    assert!(
        d["diagnostics"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["code"] != code),
        "{code} after its fix: {d}\n{fixed}"
    );
    (fixed, action)
}

/// SHAPES with an eval input of its own (`digits_eval`), so that fixes of the train
/// input's pipeline change nothing evaluation reads.
fn own_train_input(text: &str) -> String {
    let start = SHAPES.find("input digits(").unwrap();
    let end = start + SHAPES[start..].find("\n}\n").unwrap() + 3;
    let eval = SHAPES[start..end].replace("input digits(", "input digits_eval(");
    let text = text.replace("eval_input = digits(16)", "eval_input = digits_eval(16)");
    format!("{text}\n{eval}")
}

#[test]
fn quick_fixes_resolve_their_diagnostics() {
    let host = json!({"target": "host"});
    // a fix of the train input's pipeline is offered only when evaluation does not
    // read it too (it would drop eval's last batch, or never end)
    let mut c = Client::start(host.clone());
    let shared = SHAPES.replace("batch(size, drop_remainder: true)", "batch(size)");
    let d = c.open(MAIN, &shared);
    let diag = d["diagnostics"][0].clone();
    assert_eq!(diag["code"], "E0502", "{d}");
    let r = c.request(
        "textDocument/codeAction",
        json!({"textDocument": {"uri": MAIN}, "range": diag["range"], "context": {"diagnostics": [diag]}}),
    );
    assert_eq!(r["result"], json!([]), "{r}");
    // a partial last batch in training
    let (t, action) = quick_fix(
        host.clone(),
        &own_train_input(&SHAPES.replace("batch(size, drop_remainder: true)", "batch(size)")),
        "E0502",
    );
    assert!(t.contains("batch(size, drop_remainder: true)"), "{t}");
    assert_eq!(action["title"], "add `drop_remainder: true`");
    insta::assert_snapshot!("code_action", pretty(&action));
    let (t, _) = quick_fix(
        host.clone(),
        &own_train_input(&SHAPES.replace("drop_remainder: true", "drop_remainder: false")),
        "E0502",
    );
    assert!(t.contains("batch(size, drop_remainder: true)"), "{t}");
    // after a trailing comma
    let (t, _) = quick_fix(
        host.clone(),
        &own_train_input(&SHAPES.replace("batch(size, drop_remainder: true)", "batch(size,)")),
        "E0502",
    );
    assert!(t.contains("batch(size, drop_remainder: true)"), "{t}");
    // a train input without `repeat`, on the wafer
    let (t, _) = quick_fix(
        json!({"target": "wafer"}),
        &own_train_input(&SHAPES.replace("    |> repeat\n", "")),
        "E0503",
    );
    assert!(t.contains("|> repeat |> batch(size"), "{t}");
    // a misspelled name
    let (t, action) = quick_fix(
        host.clone(),
        &SHAPES.replace("let logits = dense(h", "let logits = dense_(h"),
        "E0201",
    );
    assert!(t.contains("let logits = dense(h"), "{t}");
    assert_eq!(action["title"], "replace `dense_` with `dense`");
    // a 64-bit integer
    let (t, _) = quick_fix(
        host.clone(),
        &SHAPES.replace("label: i32 }", "label: i64 }"),
        "E0403",
    );
    assert!(t.contains("label: i32 }"), "{t}");
    // a line that continues the expression above it
    let (t, _) = quick_fix(
        host.clone(),
        &SHAPES.replace(
            "  let loss = ",
            "  let twice = logits * 2.0\n  (twice + 1.0) |> relu\n  let loss = ",
        ),
        "E0305",
    );
    assert!(t.contains("let twice = logits * 2.0;\n"), "{t}");
    // inside a call's parentheses `;` cannot go: no fix
    let mut c = Client::start(host.clone());
    let inside = SHAPES.replace("dense(h, 10)", "dense(h\n    (h), 10)");
    let d = c.open(MAIN, &inside);
    let diag = (d["diagnostics"].as_array().unwrap().iter())
        .find(|d| d["code"] == "E0305")
        .unwrap_or_else(|| panic!("{d}"))
        .clone();
    let r = c.request(
        "textDocument/codeAction",
        json!({"textDocument": {"uri": MAIN}, "range": diag["range"], "context": {"diagnostics": [diag]}}),
    );
    assert_eq!(r["result"], json!([]), "{r}");
    // checkpoints between loop boundaries
    let (t, action) = quick_fix(
        host,
        &SHAPES.replace("train_steps = 10 }", "train_steps = 1000  config { iterations_per_loop = 100  save_checkpoint_steps = 250 } }"),
        "E0506",
    );
    assert!(t.contains("save_checkpoint_steps = 200 }"), "{t}");
    assert_eq!(action["title"], "use save_checkpoint_steps = 200");
}

/// The graphs of the program at `path` whose text is `text` (its imports from disk), as
/// `estc check --emit ir --target host` prints them.
fn ir_dumps(path: &std::path::Path, text: &str) -> Vec<String> {
    let overlay: est::program::Overlay = std::sync::Arc::new(|_| None);
    let program = est::Program::load_with(path, text, overlay);
    let opts = est::CheckOptions {
        target: est::elab::Target::Host,
        ..Default::default()
    };
    est::check(&program, &opts)
        .graphs
        .iter()
        .map(|c| c.dump())
        .collect()
}

/// The LSP position (line, UTF-16 column) of a byte offset.
fn lsp_position(text: &str, at: usize) -> (u32, u32) {
    let line_start = text[..at].rfind('\n').map_or(0, |k| k + 1);
    let line = text[..at].matches('\n').count() as u32;
    (line, text[line_start..at].encode_utf16().count() as u32)
}

/// Rename never changes what a program computes: every name of every example that the
/// server agrees to rename (one rename per definition, from its first occurrence) is
/// renamed, and the program's IR (every graph, as `--emit ir` prints it) is the same
/// before and after. What would change the IR is refused: a function that creates
/// variables (their names are its name), an estimator (its graphs' names). A local
/// named `loss` renames without touching an eval section's `loss = ...`.
#[test]
fn renaming_any_name_of_any_example_leaves_the_ir_unchanged() {
    let mut c = Client::start(json!({"target": "host"}));
    let (mut renamed, mut refused_for_meaning) = (0, 0);
    for path in est_examples() {
        let text = std::fs::read_to_string(&path).unwrap();
        let uri = format!("file://{}", path.display());
        c.open(&uri, &text);
        let before = ir_dumps(&path, &text);
        assert!(!before.is_empty(), "{}", path.display());
        let mut done: Vec<(u32, u32)> = Vec::new();
        let mut renamed_here = 0;
        for (k, (lo, tok, _)) in est::syntax::lexer::lex(&text).into_iter().enumerate() {
            if !matches!(tok, est::syntax::lexer::Tok::Ident(_)) {
                continue;
            }
            let (line, character) = lsp_position(&text, lo);
            if done.contains(&(line, character)) {
                continue;
            }
            let pos = json!({"line": line, "character": character});
            let p = c.request(
                "textDocument/prepareRename",
                json!({"textDocument": {"uri": uri}, "position": pos}),
            );
            if p.get("error").is_some() {
                continue;
            }
            let new = format!("renamed_{k}");
            let r = c.request(
                "textDocument/rename",
                json!({"textDocument": {"uri": uri}, "position": pos, "newName": new}),
            );
            if let Some(e) = r.get("error") {
                let m = e["message"].as_str().unwrap_or_default();
                assert_eq!(e["code"], -32803, "{r}");
                refused_for_meaning += usize::from(m.contains("would change the compiled program"));
                continue;
            }
            let edits = &r["result"]["changes"][&uri];
            for e in edits.as_array().unwrap() {
                let s = &e["range"]["start"];
                done.push((
                    s["line"].as_u64().unwrap() as u32,
                    s["character"].as_u64().unwrap() as u32,
                ));
            }
            let after_text = formatted(&text, edits).unwrap();
            assert!(
                ir_dumps(&path, &after_text) == before,
                "{}: renaming the name at {line}:{character} to {new} changed the IR:\n{after_text}",
                path.display()
            );
            renamed_here += 1;
        }
        assert!(
            renamed_here >= 5,
            "{}: only {renamed_here} renames",
            path.display()
        );
        renamed += renamed_here;
    }
    eprintln!("{renamed} renames left the IR unchanged; {refused_for_meaning} were refused as they would change it");
    assert!(refused_for_meaning > 0);
    // resnet20: the local `loss`, not the eval section's setting; `conv_bn` names variables
    let path = common_root().join("examples/resnet20.est");
    let text = std::fs::read_to_string(&path).unwrap();
    let uri = format!("file://{}", path.display());
    let at = |pat: &str| {
        let (line, character) = lsp_position(&text, text.find(pat).unwrap());
        json!({"line": line, "character": character})
    };
    let r = c.request(
        "textDocument/rename",
        json!({"textDocument": {"uri": uri}, "position": at("loss = cross_entropy +"), "newName": "total"}),
    );
    let out = formatted(&text, &r["result"]["changes"][&uri]).unwrap();
    assert!(
        out.contains("let total = cross_entropy +")
            && out.contains("minimize total with")
            && out.contains("    loss = cross_entropy\n"),
        "{out}"
    );
    let r = c.request(
        "textDocument/rename",
        json!({"textDocument": {"uri": uri}, "position": at("conv_bn("), "newName": "cbn"}),
    );
    let m = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        m.contains("would change the compiled program")
            && m.contains("conv_bn/conv2d/kernel")
            && m.contains("cbn/conv2d/kernel"),
        "{r}"
    );
}

/// The example programs, sorted.
fn est_examples() -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(common_root().join("examples"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "est"))
        .collect();
    v.sort();
    v
}

fn common_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
