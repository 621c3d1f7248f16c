//! `estc lsp`: the language server. This module is the only place that knows the
//! Language Server Protocol or JSON-RPC; everything it reports comes from the same
//! pipeline as `estc check` (`crate::check`), run on the editor's text.
//!
//! - **Sync.** Full and incremental text sync; edits are applied strictly in order. A
//!   range is clamped as the protocol says (a position past the end of a line is its
//!   end); a range whose start comes after its end rejects that change, with an error
//!   message to the client, and the document keeps its text.
//! - **Diagnostics** are published on open and save at once, and after a change once no
//!   further change has come for `DEBOUNCE`. Each open document is checked as the root
//!   of its program, with the text of open documents in place of the files they import;
//!   a change re-checks every open document whose program reads the changed file. A
//!   result is published only if the document is still at the version it was computed
//!   for (a result for an older version is dropped).
//! - **Target**: `initializationOptions.target` or `workspace/didChangeConfiguration`
//!   (`{"settings": {"est": {"target": "host"}}}`), default `wafer`, the strictest.
//! - **Requests**: hover, definition, document symbols, completion. Requests for
//!   documents that are not open, malformed parameters, unknown methods and malformed
//!   JSON get JSON-RPC errors; the server never stops on bad input.

mod analysis;
mod complete;
mod rename;
mod symbols;
mod text;

use crate::elab::Target;
use crate::syntax::ast::SectionKind;
use analysis::Analysis;
pub use analysis::{TOKEN_MODIFIERS, TOKEN_TYPES};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use lsp_server::{ErrorCode, Message, Notification, Request, RequestId, Response};
use lsp_types as lt;
use rustc_hash::FxHashMap;
use serde_json::Value;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
pub use text::{apply_change, LineIndex};

/// How long the server waits after a change for more changes before checking.
pub const DEBOUNCE: Duration = Duration::from_millis(15);

/// An open document.
struct Doc {
    text: String,
    version: i32,
    path: PathBuf,
    /// Its latest analysis, and whether the text changed since.
    analysis: Option<Arc<Analysis>>,
    dirty: bool,
    /// The number of analyses made so far, and the number of the one last published:
    /// a request may analyse a changed document before the debounce ends, and its
    /// diagnostics must still go out.
    analyses: u64,
    published: u64,
}

/// The open documents' text by path, shared with the program loader.
type Texts = Arc<RwLock<FxHashMap<PathBuf, String>>>;

/// The server's state.
pub struct Server {
    out: Sender<Message>,
    docs: FxHashMap<String, Doc>,
    texts: Texts,
    target: Target,
    /// The mode whose graph inlay hints show (`train` by default).
    mode: SectionKind,
    initialized: bool,
    shutdown: bool,
    /// When the pending changes are to be checked.
    due: Option<Instant>,
    /// Whether the client can be asked to ask again for inlay hints and semantic
    /// tokens (after a change of mode or target), and the number of such requests.
    refresh_hints: bool,
    refresh_tokens: bool,
    refreshes: u64,
}

/// Serves one client over `input` and `output` until `exit` or the end of the input.
/// Returns the process exit status: 0 after `shutdown` then `exit`, 1 otherwise.
pub fn serve(input: Receiver<Message>, output: Sender<Message>) -> i32 {
    let mut s = Server {
        out: output,
        docs: FxHashMap::default(),
        texts: Arc::new(RwLock::new(FxHashMap::default())),
        target: Target::Wafer,
        mode: SectionKind::Train,
        initialized: false,
        shutdown: false,
        due: None,
        refresh_hints: false,
        refresh_tokens: false,
        refreshes: 0,
    };
    loop {
        let msg = match s.due {
            Some(due) => match input.recv_timeout(due.saturating_duration_since(Instant::now())) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => {
                    s.due = None;
                    if let Some(code) = s.check_dirty(&input) {
                        return code;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return 1,
            },
            None => match input.recv() {
                Ok(m) => m,
                Err(_) => return 1,
            },
        };
        if let Some(code) = s.handle(msg) {
            return code;
        }
    }
}

/// Runs the server on stdin and stdout (`estc lsp`).
pub fn run_stdio() -> i32 {
    let (to_server, input) = crossbeam_channel::unbounded::<Message>();
    let (output, from_server) = crossbeam_channel::unbounded::<Message>();
    let stdout = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let w = stdout.clone();
    let writer = std::thread::spawn(move || {
        for m in from_server {
            let mut out = w.lock().expect("stdout");
            if m.write(&mut *out).is_err() {
                return;
            }
        }
    });
    let reader_out = stdout.clone();
    std::thread::spawn(move || {
        let mut frames = text::FrameReader::new(std::io::stdin().lock());
        loop {
            match frames.next_body() {
                Ok(None) | Err(_) => return,
                Ok(Some(body)) => match decode(&body) {
                    Ok(m) => {
                        if to_server.send(m).is_err() {
                            return;
                        }
                    }
                    Err(reply) => {
                        // Not a message: answer with JSON-RPC's error, and read on, from
                        // the next frame's header if the body swallowed it.
                        frames.resync(&body);
                        let mut out = reader_out.lock().expect("stdout");
                        let _ = text::write_frame(&mut *out, reply.to_string().as_bytes());
                    }
                },
            }
        }
    });
    let code = serve(input, output);
    let _ = writer.join();
    code
}

/// A message from a frame's body, or the error response to send instead: -32700 (parse
/// error) for a body that is not JSON, -32600 (invalid request) for JSON that is not a
/// message. The response carries the message's id when it has one the protocol allows
/// (an integer or a string), and null otherwise, as JSON-RPC 2.0 says. A request with
/// an id of another kind (an object, a fraction, null) is refused, not taken for a
/// notification.
fn decode(body: &[u8]) -> Result<Message, Value> {
    let reply = |id: Value, code: i32, message: String| {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": code, "message": message},
        })
    };
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| reply(Value::Null, -32700, format!("malformed message: {e}")))?;
    let id = v.get("id").cloned();
    let echo = match &id {
        Some(i @ (Value::Number(_) | Value::String(_))) => i.clone(),
        _ => Value::Null,
    };
    let usable = match &id {
        None | Some(Value::String(_)) => true,
        Some(Value::Number(n)) => n.as_i64().is_some_and(|x| i32::try_from(x).is_ok()),
        Some(_) => false,
    };
    if !usable {
        return Err(reply(
            echo,
            -32600,
            "invalid request: an id must be a string or an integer of 32 bits".to_string(),
        ));
    }
    match serde_json::from_value::<Message>(v) {
        Ok(Message::Notification(_)) if id.is_some() => Err(reply(
            echo,
            -32600,
            "invalid request: a message with an id must be a request or a response".to_string(),
        )),
        Ok(m) => Ok(m),
        Err(e) => Err(reply(echo, -32600, format!("malformed message: {e}"))),
    }
}

fn err(id: RequestId, code: ErrorCode, msg: impl Into<String>) -> Response {
    Response::new_err(id, code as i32, msg.into())
}

impl Server {
    fn send(&self, m: impl Into<Message>) {
        let _ = self.out.send(m.into());
    }

    fn notify<N: lt::notification::Notification>(&self, params: N::Params) {
        self.send(Notification::new(N::METHOD.to_string(), params));
    }

    /// Asks the client to ask again for the inlay hints (and the semantic tokens, when
    /// `tokens`) of every document, if it can be asked.
    fn refresh(&mut self, tokens: bool) {
        let methods = [
            (self.refresh_hints, "workspace/inlayHint/refresh"),
            (
                self.refresh_tokens && tokens,
                "workspace/semanticTokens/refresh",
            ),
        ];
        for (_, method) in methods.into_iter().filter(|m| m.0) {
            self.refreshes += 1;
            let id = RequestId::from(format!("est-refresh-{}", self.refreshes));
            self.send(Request::new(id, method.to_string(), Value::Null));
        }
    }

    fn show_error(&self, message: String) {
        self.notify::<lt::notification::ShowMessage>(lt::ShowMessageParams {
            typ: lt::MessageType::ERROR,
            message,
        });
    }

    /// Handles one message; `Some(status)` when the server is to exit.
    fn handle(&mut self, msg: Message) -> Option<i32> {
        match msg {
            Message::Request(r) => self.request(r),
            Message::Notification(n) => return self.notification(n),
            Message::Response(_) => {}
        }
        None
    }

    fn request(&mut self, r: Request) {
        let id = r.id.clone();
        if r.method == "initialize" {
            if self.initialized {
                return self.send(err(id, ErrorCode::InvalidRequest, "already initialized"));
            }
            let params: lt::InitializeParams = match serde_json::from_value(r.params) {
                Ok(p) => p,
                Err(e) => return self.send(err(id, ErrorCode::InvalidParams, e.to_string())),
            };
            let workspace = params.capabilities.workspace.as_ref();
            self.refresh_hints = (workspace.and_then(|w| w.inlay_hint.as_ref()))
                .and_then(|h| h.refresh_support)
                .unwrap_or(false);
            self.refresh_tokens = (workspace.and_then(|w| w.semantic_tokens.as_ref()))
                .and_then(|t| t.refresh_support)
                .unwrap_or(false);
            if let Some(o) = &params.initialization_options {
                if let Some(t) = target_of(o) {
                    self.target = t;
                }
                if let Some(m) = mode_of(o) {
                    self.mode = m;
                }
            }
            self.initialized = true;
            let caps = lt::ServerCapabilities {
                text_document_sync: Some(lt::TextDocumentSyncCapability::Options(
                    lt::TextDocumentSyncOptions {
                        open_close: Some(true),
                        change: Some(lt::TextDocumentSyncKind::INCREMENTAL),
                        save: Some(lt::TextDocumentSyncSaveOptions::Supported(true)),
                        ..Default::default()
                    },
                )),
                hover_provider: Some(lt::HoverProviderCapability::Simple(true)),
                definition_provider: Some(lt::OneOf::Left(true)),
                document_symbol_provider: Some(lt::OneOf::Left(true)),
                completion_provider: Some(lt::CompletionOptions {
                    trigger_characters: Some(vec![".".into(), "(".into(), " ".into()]),
                    ..Default::default()
                }),
                inlay_hint_provider: Some(lt::OneOf::Left(true)),
                document_formatting_provider: Some(lt::OneOf::Left(true)),
                code_action_provider: Some(lt::CodeActionProviderCapability::Options(
                    lt::CodeActionOptions {
                        code_action_kinds: Some(vec![lt::CodeActionKind::QUICKFIX]),
                        ..Default::default()
                    },
                )),
                rename_provider: Some(lt::OneOf::Right(lt::RenameOptions {
                    prepare_provider: Some(true),
                    work_done_progress_options: Default::default(),
                })),
                signature_help_provider: Some(lt::SignatureHelpOptions {
                    trigger_characters: Some(vec!["(".into(), ",".into()]),
                    retrigger_characters: Some(vec![" ".into()]),
                    ..Default::default()
                }),
                semantic_tokens_provider: Some(
                    lt::SemanticTokensServerCapabilities::SemanticTokensOptions(
                        lt::SemanticTokensOptions {
                            legend: lt::SemanticTokensLegend {
                                token_types: (analysis::TOKEN_TYPES.iter())
                                    .map(|t| lt::SemanticTokenType::new(t))
                                    .collect(),
                                token_modifiers: (analysis::TOKEN_MODIFIERS.iter())
                                    .map(|t| lt::SemanticTokenModifier::new(t))
                                    .collect(),
                            },
                            full: Some(lt::SemanticTokensFullOptions::Bool(true)),
                            range: None,
                            ..Default::default()
                        },
                    ),
                ),
                position_encoding: Some(lt::PositionEncodingKind::UTF16),
                ..Default::default()
            };
            let result = lt::InitializeResult {
                capabilities: caps,
                server_info: Some(lt::ServerInfo {
                    name: "estc".into(),
                    version: Some(env!("CARGO_PKG_VERSION").into()),
                }),
            };
            return self.send(Response::new_ok(id, result));
        }
        if !self.initialized {
            return self.send(err(id, ErrorCode::ServerNotInitialized, "initialize first"));
        }
        // (a second `shutdown` is a request after `shutdown`: -32600, as the docs say)
        if r.method == "shutdown" && !self.shutdown {
            self.shutdown = true;
            return self.send(Response::new_ok(id, Value::Null));
        }
        if self.shutdown {
            return self.send(err(
                id,
                ErrorCode::InvalidRequest,
                "the server is shutting down",
            ));
        }
        // A compiler bug must not take the server down: the request gets an error.
        let method = r.method.clone();
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.answer(r)));
        let result = run.unwrap_or_else(|_| {
            Err((
                ErrorCode::InternalError,
                format!("internal compiler error while answering {method}; please report it"),
            ))
        });
        match result {
            Ok(v) => self.send(Response::new_ok(id, v)),
            Err((code, msg)) => self.send(err(id, code, msg)),
        }
    }

    /// The answer to a request other than the lifecycle's.
    fn answer(&mut self, r: Request) -> Result<Value, (ErrorCode, String)> {
        match r.method.as_str() {
            "textDocument/hover" => {
                self.at_position(&r.params, |a, pos| serde_json::to_value(hover(a, pos)))
            }
            "textDocument/definition" => {
                self.at_position(&r.params, |a, pos| serde_json::to_value(definition(a, pos)))
            }
            "textDocument/completion" => self.at_position(&r.params, |a, pos| {
                serde_json::to_value(complete::completion(a, pos))
            }),
            "textDocument/documentSymbol" => self.on_document(
                r.params,
                |p: &lt::DocumentSymbolParams| &p.text_document.uri,
                |a, _| Ok(serde_json::to_value(symbols::symbols(a)).unwrap_or(Value::Null)),
            ),
            "textDocument/inlayHint" => {
                let mode = self.mode;
                self.on_document(
                    r.params,
                    |p: &lt::InlayHintParams| &p.text_document.uri,
                    |a, p| Ok(inlay_hints(a, p.range, mode)),
                )
            }
            // (an error says why a name cannot be renamed, and the editor shows it)
            "textDocument/prepareRename" => self.on_document(
                r.params,
                |p: &lt::TextDocumentPositionParams| &p.text_document.uri,
                |a, p| match a.rename_target(a.offset(p.position)) {
                    Ok((at, _)) => Ok(serde_json::to_value(a.range(at)).unwrap_or(Value::Null)),
                    Err(why) => Err((ErrorCode::RequestFailed, why)),
                },
            ),
            "textDocument/rename" => self.on_document(
                r.params,
                |p: &lt::RenameParams| &p.text_document_position.text_document.uri,
                |a, p| {
                    let at = a.offset(p.text_document_position.position);
                    match a.rename(at, &p.new_name) {
                        Ok(edits) => Ok(workspace_edit(a, edits)),
                        Err(m) => Err((ErrorCode::RequestFailed, m)),
                    }
                },
            ),
            "textDocument/signatureHelp" => self.at_position(&r.params, |a, pos| {
                serde_json::to_value(signature_help(a, pos))
            }),
            "textDocument/semanticTokens/full" => self.on_document(
                r.params,
                |p: &lt::SemanticTokensParams| &p.text_document.uri,
                |a, _| Ok(semantic_tokens(a)),
            ),
            "textDocument/codeAction" => self.on_document(
                r.params,
                |p: &lt::CodeActionParams| &p.text_document.uri,
                |a, p| Ok(code_actions(a, p.range)),
            ),
            "textDocument/formatting" => {
                match serde_json::from_value::<lt::DocumentFormattingParams>(r.params) {
                    Err(e) => Err((ErrorCode::InvalidParams, e.to_string())),
                    Ok(p) => match self.docs.get(p.text_document.uri.as_str()) {
                        None => Err((
                            ErrorCode::InvalidParams,
                            format!("{} is not open", p.text_document.uri.as_str()),
                        )),
                        Some(d) => Ok(formatting(&d.text)),
                    },
                }
            }
            // est's own: the server's text of an open document (for tests and tools).
            "est/documentText" => match r.params.get("uri").and_then(Value::as_str) {
                None => Err((ErrorCode::InvalidParams, "give {\"uri\": ...}".to_string())),
                Some(u) => match self.docs.get(u) {
                    Some(d) => Ok(serde_json::json!({"text": d.text, "version": d.version})),
                    None => Err((ErrorCode::InvalidParams, format!("{u} is not open"))),
                },
            },
            m => Err((ErrorCode::MethodNotFound, format!("unknown method `{m}`"))),
        }
    }

    /// Runs a position request on an open document's up-to-date analysis.
    fn at_position(
        &mut self,
        params: &Value,
        f: impl FnOnce(&Analysis, usize) -> serde_json::Result<Value>,
    ) -> Result<Value, (ErrorCode, String)> {
        let p: lt::TextDocumentPositionParams = serde_json::from_value(params.clone())
            .map_err(|e| (ErrorCode::InvalidParams, e.to_string()))?;
        let (a, _) = self.analysed(p.text_document.uri.as_str())?;
        let offset = a.offset(p.position);
        Ok(f(&a, offset).unwrap_or(Value::Null))
    }

    /// Runs a request on the up-to-date analysis of the open document its params
    /// (`P`) name.
    fn on_document<P: serde::de::DeserializeOwned>(
        &mut self,
        params: Value,
        uri: impl Fn(&P) -> &lt::Uri,
        f: impl FnOnce(&Analysis, P) -> Result<Value, (ErrorCode, String)>,
    ) -> Result<Value, (ErrorCode, String)> {
        let p: P = serde_json::from_value(params)
            .map_err(|e| (ErrorCode::InvalidParams, e.to_string()))?;
        let (a, _) = self.analysed(uri(&p).as_str())?;
        f(&a, p)
    }

    /// The document's analysis, made now if its text changed since the last one.
    fn analysed(&mut self, uri: &str) -> Result<(Arc<Analysis>, i32), (ErrorCode, String)> {
        let target = self.target;
        let texts = self.texts.clone();
        let d = self
            .docs
            .get_mut(uri)
            .ok_or((ErrorCode::InvalidParams, format!("{uri} is not open")))?;
        if d.dirty || d.analysis.is_none() {
            // A compiler bug must not take the server down: the document then gets an
            // analysis of nothing, and the client an error message.
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                Analysis::new(&d.path, &d.text, texts.clone(), target)
            }));
            let a = match run {
                Ok(a) => a,
                Err(_) => {
                    let _ = self.out.send(Message::Notification(Notification::new(
                        "window/showMessage".into(),
                        lt::ShowMessageParams {
                            typ: lt::MessageType::ERROR,
                            message: format!(
                                "internal compiler error while checking {uri}; please report it"
                            ),
                        },
                    )));
                    Analysis::new(&d.path, "", texts, target)
                }
            };
            d.analysis = Some(Arc::new(a));
            d.dirty = false;
            d.analyses += 1;
        }
        Ok((d.analysis.clone().expect("made"), d.version))
    }

    fn notification(&mut self, n: Notification) -> Option<i32> {
        if n.method == "exit" {
            return Some(if self.shutdown { 0 } else { 1 });
        }
        if !self.initialized || self.shutdown {
            return None;
        }
        use lt::notification::Notification as _;
        match n.method.as_str() {
            lt::notification::DidOpenTextDocument::METHOD => {
                if let Ok(p) = serde_json::from_value::<lt::DidOpenTextDocumentParams>(n.params) {
                    let uri = p.text_document.uri.as_str().to_string();
                    let path = uri_path(&uri);
                    self.texts
                        .write()
                        .expect("texts")
                        .insert(path.clone(), p.text_document.text.clone());
                    self.docs.insert(
                        uri.clone(),
                        Doc {
                            text: p.text_document.text,
                            version: p.text_document.version,
                            path: path.clone(),
                            analysis: None,
                            dirty: true,
                            analyses: 0,
                            published: 0,
                        },
                    );
                    self.mark_dependents(&path);
                    self.publish(&uri);
                }
            }
            lt::notification::DidChangeTextDocument::METHOD => {
                match serde_json::from_value::<lt::DidChangeTextDocumentParams>(n.params) {
                    Ok(p) => self.change(p),
                    Err(e) => self.show_error(format!("bad didChange: {e}")),
                }
            }
            lt::notification::DidSaveTextDocument::METHOD => {
                if let Ok(p) = serde_json::from_value::<lt::DidSaveTextDocumentParams>(n.params) {
                    let uri = p.text_document.uri.as_str().to_string();
                    if self.docs.contains_key(&uri) {
                        self.check_dirty_now();
                        self.publish(&uri);
                    }
                }
            }
            lt::notification::DidCloseTextDocument::METHOD => {
                if let Ok(p) = serde_json::from_value::<lt::DidCloseTextDocumentParams>(n.params) {
                    let uri = p.text_document.uri.as_str().to_string();
                    if let Some(d) = self.docs.remove(&uri) {
                        self.texts.write().expect("texts").remove(&d.path);
                        self.mark_dependents(&d.path);
                        self.send_diagnostics(&uri, Vec::new(), None);
                    }
                }
            }
            lt::notification::DidChangeConfiguration::METHOD => {
                if let Ok(p) = serde_json::from_value::<lt::DidChangeConfigurationParams>(n.params)
                {
                    let est = p.settings.get("est").unwrap_or(&p.settings);
                    let mode = mode_of(est).filter(|&m| m != self.mode);
                    if let Some(m) = mode {
                        self.mode = m;
                    }
                    let target = target_of(est).filter(|&t| t != self.target);
                    if mode.is_some() || target.is_some() {
                        self.refresh(target.is_some());
                    }
                    if let Some(t) = target_of(est) {
                        if t != self.target {
                            self.target = t;
                            for d in self.docs.values_mut() {
                                d.dirty = true;
                            }
                            self.check_dirty_now();
                        }
                    }
                }
            }
            _ => {} // other notifications (`initialized`, `$/...`) need nothing
        }
        None
    }

    fn change(&mut self, p: lt::DidChangeTextDocumentParams) {
        let uri = p.text_document.uri.as_str().to_string();
        let Some(d) = self.docs.get_mut(&uri) else {
            return self.show_error(format!("didChange for {uri}, which is not open"));
        };
        let mut text = d.text.clone();
        for c in &p.content_changes {
            if let Err(m) = apply_change(&mut text, c) {
                let msg = format!(
                    "rejected an edit of {uri} (version {}): {m}; the document keeps version {}",
                    p.text_document.version, d.version
                );
                return self.show_error(msg);
            }
        }
        d.text = text;
        d.version = p.text_document.version;
        d.dirty = true;
        let path = d.path.clone();
        self.texts
            .write()
            .expect("texts")
            .insert(path.clone(), d.text.clone());
        self.mark_dependents(&path);
        self.due = Some(Instant::now() + DEBOUNCE);
    }

    /// Marks every open document whose program reads `path` for a new check.
    fn mark_dependents(&mut self, path: &std::path::Path) {
        for d in self.docs.values_mut() {
            if d.path == path
                || d.analysis
                    .as_ref()
                    .is_some_and(|a| a.files.iter().any(|f| f == path))
            {
                d.dirty = true;
            }
        }
        if self.due.is_none() {
            self.due = Some(Instant::now() + DEBOUNCE);
        }
    }

    /// Checks the changed documents and publishes their diagnostics, unless a newer
    /// change arrived meanwhile (then that result is dropped and the check waits again).
    /// Returns the exit status if an `exit` came meanwhile.
    fn check_dirty(&mut self, input: &Receiver<Message>) -> Option<i32> {
        for uri in self.pending() {
            let Ok((a, version)) = self.analysed(&uri) else {
                continue;
            };
            // Messages that came during the check go first: a newer version of this
            // document makes the result stale.
            while let Ok(m) = input.try_recv() {
                if let Some(code) = self.handle(m) {
                    return Some(code);
                }
            }
            if self
                .docs
                .get(&uri)
                .is_some_and(|d| d.version == version && !d.dirty)
            {
                self.publish_analysis(&uri, &a, version);
            }
        }
        None
    }

    fn check_dirty_now(&mut self) {
        for uri in self.pending() {
            self.publish(&uri);
        }
    }

    /// The open documents whose text or imports changed since their last check, or
    /// whose latest check was not published yet.
    fn pending(&self) -> Vec<String> {
        self.docs
            .iter()
            .filter(|(_, d)| d.dirty || d.published != d.analyses)
            .map(|(u, _)| u.clone())
            .collect()
    }

    fn publish(&mut self, uri: &str) {
        if let Ok((a, version)) = self.analysed(uri) {
            self.publish_analysis(uri, &a, version);
        }
    }

    fn publish_analysis(&mut self, uri: &str, a: &Analysis, version: i32) {
        self.send_diagnostics(uri, a.diagnostics(), Some(version));
        if let Some(d) = self.docs.get_mut(uri) {
            d.published = d.analyses;
        }
    }

    fn send_diagnostics(&self, uri: &str, diagnostics: Vec<lt::Diagnostic>, version: Option<i32>) {
        let Ok(uri) = lt::Uri::from_str(uri) else {
            return;
        };
        self.notify::<lt::notification::PublishDiagnostics>(lt::PublishDiagnosticsParams {
            uri,
            diagnostics,
            version,
        });
    }
}

fn hover(a: &Analysis, offset: usize) -> Option<lt::Hover> {
    let (text, span) = a.hover(offset)?;
    Some(lt::Hover {
        contents: lt::HoverContents::Markup(lt::MarkupContent {
            kind: lt::MarkupKind::Markdown,
            value: text,
        }),
        range: Some(a.range(span)),
    })
}

fn definition(a: &Analysis, offset: usize) -> Option<lt::GotoDefinitionResponse> {
    let (uri, range) = a.location(a.definition(offset)?)?;
    Some(lt::GotoDefinitionResponse::Scalar(lt::Location {
        uri,
        range,
    }))
}

/// Inlay hints in a range: each binding's type, or its static value where short.
fn inlay_hints(a: &Analysis, range: lt::Range, mode: SectionKind) -> Value {
    let (lo, hi) = (a.offset(range.start), a.offset(range.end));
    let hints: Vec<lt::InlayHint> = a
        .inlay_hints(lo, hi, mode)
        .into_iter()
        .map(|(at, label, is_type)| lt::InlayHint {
            position: a.position(at),
            label: lt::InlayHintLabel::String(label),
            kind: Some(if is_type {
                lt::InlayHintKind::TYPE
            } else {
                lt::InlayHintKind::PARAMETER
            }),
            text_edits: None,
            tooltip: None,
            padding_left: None,
            padding_right: None,
            data: None,
        })
        .collect();
    serde_json::to_value(hints).unwrap_or(Value::Null)
}

/// The quick fixes of the diagnostics shown in a range.
fn code_actions(a: &Analysis, range: lt::Range) -> Value {
    let actions: Vec<Value> = a
        .fixes(a.offset(range.start), a.offset(range.end))
        .into_iter()
        .map(|(diagnostic, fix)| {
            let action = lt::CodeAction {
                title: fix.title.clone(),
                kind: Some(lt::CodeActionKind::QUICKFIX),
                diagnostics: Some(vec![diagnostic]),
                is_preferred: Some(true),
                ..Default::default()
            };
            let mut action = serde_json::to_value(action).unwrap_or(Value::Null);
            let edits = fix.edits.iter().map(|e| (e.span, e.text.clone())).collect();
            action["edit"] = workspace_edit(a, edits);
            action
        })
        .collect();
    Value::Array(actions)
}

/// Rename's edits as a workspace edit: the edits of each file, by URI.
fn workspace_edit(a: &Analysis, edits: Vec<(crate::span::Span, String)>) -> Value {
    let mut changes: std::collections::BTreeMap<String, Vec<lt::TextEdit>> = Default::default();
    for (span, new_text) in edits {
        if let Some((uri, range)) = a.location(span) {
            changes
                .entry(uri.as_str().to_string())
                .or_default()
                .push(lt::TextEdit { range, new_text });
        }
    }
    serde_json::json!({ "changes": changes })
}

/// Signature help inside a call: the callee's signature and the parameter being
/// written.
fn signature_help(a: &Analysis, offset: usize) -> Option<lt::SignatureHelp> {
    let s = a.signature_help(offset)?;
    let utf16 = |b: usize| s.label[..b].encode_utf16().count() as u32;
    let parameters = s
        .params
        .iter()
        .map(|&(lo, hi)| lt::ParameterInformation {
            label: lt::ParameterLabel::LabelOffsets([utf16(lo), utf16(hi)]),
            documentation: None,
        })
        .collect();
    Some(lt::SignatureHelp {
        signatures: vec![lt::SignatureInformation {
            label: s.label.clone(),
            documentation: (!s.doc.is_empty()).then(|| {
                lt::Documentation::MarkupContent(lt::MarkupContent {
                    kind: lt::MarkupKind::Markdown,
                    value: s.doc.clone(),
                })
            }),
            parameters: Some(parameters),
            active_parameter: Some(s.active as u32),
        }],
        active_signature: Some(0),
        active_parameter: Some(s.active as u32),
    })
}

/// The document's semantic tokens, encoded as the protocol says: five numbers per
/// token (line and start relative to the previous token, length, type, modifiers),
/// in UTF-16 units.
fn semantic_tokens(a: &Analysis) -> Value {
    let mut data: Vec<u32> = Vec::new();
    let (mut line, mut start) = (0u32, 0u32);
    for (span, ty, mods) in a.semantic_tokens() {
        let r = a.range(span);
        if r.start.line != r.end.line {
            continue;
        }
        let delta_start = if r.start.line == line {
            r.start.character - start
        } else {
            r.start.character
        };
        data.extend([
            r.start.line - line,
            delta_start,
            r.end.character - r.start.character,
            ty,
            mods,
        ]);
        (line, start) = (r.start.line, r.start.character);
    }
    serde_json::json!({ "data": data })
}

/// The edit that formats a document (`estc fmt`): the part between the text's common
/// start and end with the formatted text, or none. Null when the text does not parse
/// (its diagnostics say why).
fn formatting(text: &str) -> Value {
    let Ok(out) = crate::syntax::format::format(crate::span::FileId(0), text) else {
        return Value::Null;
    };
    let mut lo = text
        .bytes()
        .zip(out.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    while !text.is_char_boundary(lo) || !out.is_char_boundary(lo) {
        lo -= 1;
    }
    let mut same_end = text[lo..]
        .bytes()
        .rev()
        .zip(out[lo..].bytes().rev())
        .take_while(|(a, b)| a == b)
        .count();
    while !text.is_char_boundary(text.len() - same_end)
        || !out.is_char_boundary(out.len() - same_end)
    {
        same_end -= 1;
    }
    if text == out {
        return serde_json::json!([]);
    }
    let index = LineIndex::new(text);
    let edit = lt::TextEdit {
        range: lt::Range {
            start: index.position(text, lo),
            end: index.position(text, text.len() - same_end),
        },
        new_text: out[lo..out.len() - same_end].to_string(),
    };
    serde_json::to_value(vec![edit]).unwrap_or(Value::Null)
}

/// A mode from `{"mode": "eval"}` (the graph inlay hints show).
fn mode_of(v: &Value) -> Option<SectionKind> {
    match v.get("mode")?.as_str()? {
        "train" => Some(SectionKind::Train),
        "eval" => Some(SectionKind::Eval),
        "predict" => Some(SectionKind::Predict),
        _ => None,
    }
}

/// A target from `{"target": "host"}`.
fn target_of(v: &Value) -> Option<Target> {
    match v.get("target")?.as_str()? {
        "host" => Some(Target::Host),
        "wafer" => Some(Target::Wafer),
        _ => None,
    }
}

/// The file system path of a `file://` URI (other URIs keep their text as a path).
pub fn uri_path(uri: &str) -> PathBuf {
    let Some(rest) = uri.strip_prefix("file://") else {
        return PathBuf::from(uri);
    };
    let mut out = Vec::with_capacity(rest.len());
    let b = rest.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(x) = u8::from_str_radix(&rest[i + 1..i + 3], 16) {
                out.push(x);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    PathBuf::from(String::from_utf8_lossy(&out).into_owned())
}

/// The `file://` URI of a path.
pub fn path_uri(p: &std::path::Path) -> String {
    let mut s = String::from("file://");
    for &c in p.to_string_lossy().as_bytes() {
        if c.is_ascii_alphanumeric() || b"/-_.~".contains(&c) {
            s.push(c as char);
        } else {
            s.push_str(&format!("%{c:02X}"));
        }
    }
    s
}
