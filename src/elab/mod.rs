//! Elaboration: evaluates everything static (params, mode, target, lists, functions)
//! and builds the IR graph of one (estimator, mode, target). Loops are unrolled, `if`s
//! resolved and functions inlined as they are met; only tensor operations become nodes.
//!
//! Errors are values: a failed expression reports a diagnostic and yields
//! `Value::Error`, which later operations pass on silently.

mod builtins;
pub mod data;
mod datasets;
mod estimator;
mod expr;
mod model;
mod tensor;
pub mod value;

pub use datasets::UNKNOWN_DIM;
pub use estimator::{
    elaborate, Compiled, Config, ElabOptions, EstimatorInfo, ParamOverride, WarmStart, CONFIG_KEYS,
    MAX_NUM_SHARDS,
};
pub use value::{Target, Value};

use crate::diag::{Code, Diag, Diags};
use crate::ir::{Graph, NodeIndex};
use crate::program::{ModId, Program};
use crate::span::Span;
use crate::syntax::ast::SectionKind;
use rustc_hash::FxHashMap;

/// Inlining deeper than this is reported as unbounded recursion.
const MAX_DEPTH: usize = 256;

/// The most expression evaluations and loop iterations one elaboration may take: about
/// 4.6 times what the 1M-node program of `benches/check.rs` needs (4.3M per mode), so it
/// bounds the time of any program, whatever its loops and recursion multiply to.
/// (`EST_TIME_PASSES=1` prints the steps of each mode.)
pub const MAX_STEPS: u64 = 20_000_000;

/// What the language server shows of an expression or of a name being bound, from one
/// elaboration: its type or value.
#[derive(Debug, Clone, PartialEq)]
pub struct Hover {
    pub span: Span,
    /// As hover shows it: `f32[32, 10]`, `int = 3`, `dataset of (f32[784], i32)`.
    pub text: String,
    /// For a name being bound (`let`, a parameter, a loop variable, a params field): the
    /// inlay hint after it, for a tensor (or a tuple or record of them) or a short static
    /// value (`f32[32, 10]`, `= 256`). `None` for expressions and other values.
    pub hint: Option<String>,
    /// Whether `span` is a name being bound rather than an expression.
    pub binding: bool,
    /// For a name being bound: whether the value is a tensor (or a tuple or record of
    /// them), or static (a number, a string, a boolean, a list of them); neither for
    /// other values (datasets, functions).
    pub tensor: bool,
    pub is_static: bool,
}

/// A local binding.
struct Local<'p> {
    name: String,
    value: Value<'p>,
}

/// The state of one elaboration: the graph being built and where evaluation is.
pub(crate) struct Elab<'p> {
    pub p: &'p Program,
    pub diags: Diags,
    pub graph: Graph,
    pub mode: SectionKind,
    pub target: Target,
    pub params: Value<'p>,
    /// Local scopes of the function being evaluated (innermost last).
    scopes: Vec<Vec<Local<'p>>>,
    /// Scopes of the callers, saved while a function body runs.
    saved: Vec<Vec<Vec<Local<'p>>>>,
    module: ModId,
    /// The innermost call site in user code, for spans of nodes made inside `std`.
    call_sites: Vec<Span>,
    depth: usize,
    /// Variable-name scopes (`block_1/dense`), with per-scope call counters.
    name_scopes: Vec<String>,
    name_counts: FxHashMap<(String, String), usize>,
    /// Variables made so far, by full name.
    variables: FxHashMap<String, NodeIndex>,
    /// Pending assignments to non-trainable variables (batch-norm moving averages).
    pub updates: Vec<(String, NodeIndex)>,
    /// The penalties of regularised variables: (variable, l1, l2).
    pub regularizers: Vec<(NodeIndex, f64, f64)>,
    random_count: u64,
    /// Set once unbounded recursion has been reported, so it is reported once.
    recursion_reported: bool,
    /// Steps of elaboration so far, and whether elaboration was stopped.
    steps: u64,
    aborted: bool,
    /// The graph's one global-step node, once made.
    global_step_node: Option<NodeIndex>,
    pub max_steps: u64,
    /// What each expression and binding of a user file evaluated to, when asked for
    /// (hover, inlay hints).
    pub hovers: Option<Vec<Hover>>,
}

impl<'p> Elab<'p> {
    pub fn new(p: &'p Program, mode: SectionKind, target: Target) -> Elab<'p> {
        Elab {
            p,
            diags: Diags::default(),
            graph: Graph::new(),
            mode,
            target,
            params: Value::Record(Default::default()),
            scopes: vec![Vec::new()],
            saved: Vec::new(),
            module: p.root,
            call_sites: Vec::new(),
            depth: 0,
            name_scopes: Vec::new(),
            name_counts: FxHashMap::default(),
            variables: FxHashMap::default(),
            updates: Vec::new(),
            regularizers: Vec::new(),
            random_count: 0,
            recursion_reported: false,
            steps: 0,
            aborted: false,
            global_step_node: None,
            max_steps: MAX_STEPS,
            hovers: None,
        }
    }

    pub fn error(&mut self, d: Diag) -> Value<'p> {
        self.diags.push(d);
        Value::Error
    }

    /// The span to attach to a node or diagnostic: `span` itself in user code, the
    /// user's call site when `span` is inside the standard library.
    pub fn site(&self, span: Span) -> Span {
        if self.p.is_std_file(span.file) {
            self.call_sites.last().copied().unwrap_or(span)
        } else {
            span
        }
    }

    fn push_scope(&mut self) {
        self.scopes.push(Vec::new());
    }

    fn pop_scope(&mut self) {
        self.scopes.pop();
    }

    pub fn bind(&mut self, name: &str, value: Value<'p>) {
        if let Some(s) = self.scopes.last_mut() {
            s.push(Local {
                name: name.to_string(),
                value,
            });
        }
    }

    fn local(&self, name: &str) -> Option<&Value<'p>> {
        self.scopes
            .iter()
            .rev()
            .find_map(|s| s.iter().rev().find(|l| l.name == name).map(|l| &l.value))
    }

    /// Updates the innermost binding of `name`. False if there is none.
    fn assign(&mut self, name: &str, value: Value<'p>) -> bool {
        for s in self.scopes.iter_mut().rev() {
            if let Some(l) = s.iter_mut().rev().find(|l| l.name == name) {
                l.value = value;
                return true;
            }
        }
        false
    }

    /// Every visible local, innermost last (for closures to capture).
    fn capture(&self) -> Vec<(String, Value<'p>)> {
        self.scopes
            .iter()
            .flatten()
            .map(|l| (l.name.clone(), l.value.clone()))
            .collect()
    }

    /// Runs `f` in a fresh function frame of module `m` whose locals are `locals`.
    fn in_frame<T>(
        &mut self,
        m: ModId,
        locals: Vec<(String, Value<'p>)>,
        call: Span,
        f: impl FnOnce(&mut Self) -> T,
    ) -> T {
        let frame = locals
            .into_iter()
            .map(|(name, value)| Local { name, value })
            .collect();
        let outer = std::mem::replace(&mut self.scopes, vec![frame]);
        self.saved.push(outer);
        let prev_module = std::mem::replace(&mut self.module, m);
        let user_call = !self.p.is_std_file(call.file);
        if user_call {
            self.call_sites.push(call);
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        if user_call {
            self.call_sites.pop();
        }
        self.module = prev_module;
        self.scopes = self.saved.pop().unwrap_or_default();
        r
    }

    /// Enters a variable-name scope for a call of `name` (`dense`, `dense_1`, ...).
    fn enter_name_scope(&mut self, name: &str) {
        let parent = self.name_scopes.join("/");
        let count = self
            .name_counts
            .entry((parent, name.to_string()))
            .or_insert(0);
        let scoped = if *count == 0 {
            name.to_string()
        } else {
            format!("{name}_{count}")
        };
        *count += 1;
        self.name_scopes.push(scoped);
    }

    fn leave_name_scope(&mut self) {
        self.name_scopes.pop();
    }

    /// The full name of a variable made in the current name scope.
    pub fn variable_name(&self, name: &str) -> String {
        if self.name_scopes.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.name_scopes.join("/"))
        }
    }

    /// A stable identity for the next random op: its name scope and position, so that
    /// the same op gets the same stream in every mode and every run.
    pub fn random_stream(&mut self) -> u64 {
        self.random_count += 1;
        let key = format!("{}#{}", self.name_scopes.join("/"), self.random_count);
        crate::hash::fnv1a(crate::hash::FNV_OFFSET, key.as_bytes())
    }

    /// Counts one step of elaboration. False once the program has been stopped (too many
    /// steps, or unbounded recursion): everything after evaluates to an error silently,
    /// so that a runaway program ends quickly with one diagnostic.
    pub fn step(&mut self, span: Span) -> bool {
        if self.aborted {
            return false;
        }
        self.steps += 1;
        if self.steps > self.max_steps {
            self.aborted = true;
            self.diags.push(
                Diag::new(Code::StaticEvalError, self.site(span), format!("elaboration took more than {} steps", self.max_steps))
                    .label("still unrolling here")
                    .help("loops and recursion unroll at compile time: the program builds an enormous graph; use fewer iterations or a smaller recursion"),
            );
            return false;
        }
        true
    }

    pub fn recursion_error(&mut self, span: Span) -> Value<'p> {
        self.aborted = true;
        if std::mem::replace(&mut self.recursion_reported, true) {
            return Value::Error;
        }
        self.error(
            Diag::new(Code::RecursionLimit, self.site(span), "recursion too deep")
                .label(format!("more than {MAX_DEPTH} nested calls"))
                .help("give the recursion a static base case, or use a `for` loop"),
        )
    }
}
