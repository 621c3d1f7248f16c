//! The predict graph as an ONNX model (IR version 8, opset 18: every onnxruntime since
//! 1.14 loads it) that serves any batch size.
//!
//! est's shapes are static; an exported model's batch is symbolic (`batch`). Each IR
//! value is written as an ONNX value whose axes are one of `Dim`: a fixed size, the
//! batch (times a factor, after a reshape merges it with other axes), or a broadcast
//! axis, held as size 1 and repeated by ONNX's broadcasting where est's value repeats
//! (constants and `broadcast_to` stay small, and never pin the batch). Ops that need a
//! broadcast axis at its real size (a reduction over it, a matrix product's inner
//! axis, a concatenation, an output) expand it first. An op that would pin the batch
//! to the static size (a fixed-size value meeting the batch, a reshape that has no
//! place for it) is a diagnostic naming it, never a file that serves only one size.
//!
//! Layouts: est's convolutions and pools are NHWC with HWIO filters; ONNX's are NCHW
//! with OIHW filters, so each is wrapped in transposes (onnxruntime's optimiser cancels
//! adjacent pairs). The opset mapping is in `docs/export.md`.

use super::proto::Message;
use crate::backend::window::Geo;
use crate::diag::{Code, Diag};
use crate::ir::{
    BinaryOp, DType, Graph, NodeIndex, Op, ReduceOp, Role, TensorType, UnaryOp, MASK_INPUT,
};
use crate::span::Span;
use crate::tensor::Tensor;
use petgraph::visit::NodeIndexable;
use rustc_hash::FxHashMap;

/// The ONNX IR version and opset written (ONNX 1.13's; see the module comment).
pub const IR_VERSION: i64 = 8;
pub const OPSET: i64 = 18;
/// The name of the symbolic batch dimension of inputs and outputs.
pub const BATCH: &str = "batch";

/// What the model's metadata records (`metadata_props`).
#[derive(Debug, Clone)]
pub struct Meta {
    pub estimator: String,
    pub program_hash: String,
    pub global_step: i64,
}

/// An exported model: its bytes and its interface.
#[derive(Debug, Clone)]
pub struct Exported {
    pub bytes: Vec<u8>,
    /// The graph's inputs and outputs with their types at est's static batch size
    /// (axis 0 is `batch` in the file).
    pub inputs: Vec<(String, TensorType)>,
    pub outputs: Vec<(String, TensorType)>,
    /// ONNX nodes written.
    pub nodes: usize,
}

/// One axis of an ONNX value, against the IR value's static size.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Dim {
    /// The IR size.
    Fixed(usize),
    /// `outer * batch * inner` entries, laid out as `[outer][batch][inner]` (a reshape
    /// that merges the batch with its neighbours); the IR size is that at the static
    /// batch.
    Batch { outer: usize, inner: usize },
    /// Size 1, standing for the IR size (over which the value repeats).
    Bcast,
}

/// The batch axis of the model's inputs: one row per example.
const ROWS: Dim = Dim::Batch { outer: 1, inner: 1 };

impl Dim {
    /// The factor of the batch in this axis's size (`None`: not the batch).
    fn factor(self) -> Option<usize> {
        match self {
            Dim::Batch { outer, inner } => Some(outer * inner),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
struct Val {
    name: String,
    dims: Vec<Dim>,
}

/// The model of `g`'s predictions, with `vars` as the variables' values and
/// `global_step` as the step. `at` is the estimator's span, for diagnostics about the
/// graph as a whole.
pub fn export(
    g: &Graph,
    vars: &FxHashMap<String, Tensor>,
    meta: &Meta,
    at: Span,
) -> Result<Exported, Diag> {
    let outs = g.outputs_with(Role::Prediction);
    if outs.is_empty() {
        return Err(Diag::new(
            Code::Export,
            at,
            "the model has no predictions to export: its predict section is missing or empty",
        )
        .label("this estimator's model")
        .help(
            "add `predict { name = value }` to the model; an exported model computes those values",
        ));
    }
    let targets: Vec<NodeIndex> = outs.iter().map(|o| o.1).collect();
    let order = g.schedule(&targets, |_| false);
    let inputs: Vec<NodeIndex> = order
        .iter()
        .copied()
        .filter(|&n| matches!(&g.node(n).op, Op::Input { name } if name != MASK_INPUT))
        .collect();
    let batch = inputs
        .first()
        .and_then(|&n| g.ty(n).shape.first().copied())
        .unwrap_or(1);
    let mut b = Builder {
        g,
        batch,
        vars,
        step: meta.global_step,
        nodes: Vec::new(),
        inits: Vec::new(),
        vals: vec![None; g.g.node_bound()],
        fresh: 0,
        batch_len: None,
        batch_src: inputs.first().map(|&n| input_name(g, n)),
        shared: FxHashMap::default(),
    };
    let mut graph_inputs = Vec::new();
    for &n in &inputs {
        let ty = g.ty(n);
        if ty.rank() == 0 {
            return Err(b.refuse(
                n,
                format!("the input `{}` is a scalar", input_name(g, n)),
                "an exported model takes batches: give the input a batch axis first",
            ));
        }
        graph_inputs.push((input_name(g, n), ty.clone()));
    }
    for &n in &order {
        let v = b.translate(n)?;
        b.vals[n.index()] = Some(v);
    }
    let mut graph_outputs = Vec::new();
    let mut out_msgs = Vec::new();
    for (name, n) in &outs {
        let ty = g.ty(*n).clone();
        let mut v = b.val(*n);
        // A prediction the same for every example (a constant, `fill([B], 3)`) has its
        // first axis broadcast: it follows the batch when expanded to it, as `estc
        // predict` writes one row of it per example.
        let constant_rows = matches!(v.dims.first(), Some(Dim::Bcast))
            || (v.dims.first() == Some(&Dim::Fixed(1)) && batch == 1);
        if constant_rows && !v.dims.iter().any(|d| d.factor().is_some()) && b.batch_src.is_some() {
            let mut target = v.dims.clone();
            target[0] = ROWS;
            v = b.expand_to(&v, &target, &ty.shape);
            v.dims[0] = ROWS;
        }
        if graph_inputs.iter().any(|i| &i.0 == name) {
            return Err(Diag::new(
                Code::Export,
                g.node(*n).span,
                format!("the prediction `{name}` has the name of an input of the model"),
            )
            .label(format!("`{name}`"))
            .help("rename the prediction: an ONNX model's values have one name each"));
        }
        let per_example = v.dims.first() == Some(&ROWS)
            && v.dims.iter().filter(|d| d.factor().is_some()).count() == 1;
        if !per_example {
            let why = match v.dims.first() {
                None => "is a scalar".to_string(),
                Some(_) => format!("does not have one row per example along its first axis ({ty})"),
            };
            return Err(Diag::new(
                Code::Export,
                g.node(*n).span,
                format!("the prediction `{name}` {why}: an exported model serves any batch size, so each prediction must follow the batch"),
            )
            .label(format!("`{name}`"))
            .help("predict one row per example (the batch first), as `estc predict` writes them"));
        }
        let full = b.materialize(&v, &ty.shape, |_| true);
        b.push_node("Identity", &[&full.name], &[name.as_str()], Vec::new());
        out_msgs.push(value_info(name, &ty));
        graph_outputs.push((name.clone(), ty));
    }
    let mut graph = Message::new();
    for n in &b.nodes {
        graph.message(1, n);
    }
    graph.string(2, &meta.estimator);
    for t in &b.inits {
        graph.message(5, t);
    }
    for (name, ty) in &graph_inputs {
        graph.message(11, &value_info(name, ty));
    }
    for o in &out_msgs {
        graph.message(12, o);
    }
    let mut model = Message::new();
    model
        .int(1, IR_VERSION)
        .string(2, "est")
        .string(3, env!("CARGO_PKG_VERSION"))
        .message(7, &graph);
    model.message(8, Message::new().string(1, "").int(2, OPSET));
    let props = [
        ("est.estimator", meta.estimator.clone()),
        ("est.program_hash", meta.program_hash.clone()),
        ("est.global_step", meta.global_step.to_string()),
        ("est.version", env!("CARGO_PKG_VERSION").to_string()),
    ];
    for (k, v) in props {
        model.message(14, Message::new().string(1, k).string(2, &v));
    }
    Ok(Exported {
        bytes: model.as_bytes().to_vec(),
        inputs: graph_inputs,
        outputs: graph_outputs,
        nodes: b.nodes.len(),
    })
}

/// The name a model input has in the file: its name in the program (`features`, or
/// `features.ids` for a field of a record).
fn input_name(g: &Graph, n: NodeIndex) -> String {
    match &g.node(n).op {
        Op::Input { name } => name.clone(),
        _ => String::new(),
    }
}

/// ONNX's element type of a dtype (`TensorProto.DataType`).
fn elem_type(d: DType) -> Option<i64> {
    Some(match d {
        DType::F32 => 1,
        DType::U8 => 2,
        DType::I32 => 6,
        DType::I64 => 7,
        DType::Bool => 9,
        DType::F16 | DType::BF16 | DType::Bytes => return None,
    })
}

/// The ONNX op of a unary op that is one, alone (`None`: `stop_gradient`, `square`
/// and `rsqrt`, written otherwise).
fn unary_op(u: UnaryOp) -> Option<&'static str> {
    Some(match u {
        UnaryOp::Neg => "Neg",
        UnaryOp::Not => "Not",
        UnaryOp::Abs => "Abs",
        UnaryOp::Exp => "Exp",
        UnaryOp::Log => "Log",
        UnaryOp::Sqrt => "Sqrt",
        UnaryOp::Tanh => "Tanh",
        UnaryOp::Sigmoid => "Sigmoid",
        UnaryOp::Relu => "Relu",
        UnaryOp::Floor => "Floor",
        UnaryOp::Sign => "Sign",
        UnaryOp::Sin => "Sin",
        UnaryOp::Cos => "Cos",
        UnaryOp::Erf => "Erf",
        UnaryOp::StopGradient | UnaryOp::Square | UnaryOp::Rsqrt => return None,
    })
}

/// The ONNX op of a binary op that is one, alone (`None`: `%` and `!=`, written
/// otherwise).
fn binary_op(b: BinaryOp) -> Option<&'static str> {
    Some(match b {
        BinaryOp::Add => "Add",
        BinaryOp::Sub => "Sub",
        BinaryOp::Mul => "Mul",
        BinaryOp::Div => "Div",
        BinaryOp::Pow => "Pow",
        BinaryOp::Max => "Max",
        BinaryOp::Min => "Min",
        BinaryOp::Eq => "Equal",
        BinaryOp::Lt => "Less",
        BinaryOp::Le => "LessOrEqual",
        BinaryOp::Gt => "Greater",
        BinaryOp::Ge => "GreaterOrEqual",
        BinaryOp::And => "And",
        BinaryOp::Or => "Or",
        BinaryOp::Ne | BinaryOp::Rem => return None,
    })
}

/// A graph input's or output's `ValueInfoProto`, axis 0 symbolic.
fn value_info(name: &str, ty: &TensorType) -> Message {
    let mut shape = Message::new();
    for (i, &d) in ty.shape.iter().enumerate() {
        let mut dim = Message::new();
        if i == 0 {
            dim.string(2, BATCH);
        } else {
            dim.int(1, d as i64);
        }
        shape.message(1, &dim);
    }
    let mut tensor = Message::new();
    tensor.int(1, elem_type(ty.dtype).unwrap_or(0));
    tensor.message(2, &shape);
    let mut vi = Message::new();
    vi.string(1, name);
    vi.message(2, Message::new().message(1, &tensor));
    vi
}

/// Attributes (`AttributeProto`, with their type as the checker wants).
fn attr_int(name: &str, v: i64) -> Message {
    let mut a = Message::new();
    a.string(1, name).int(3, v).int(20, 2);
    a
}

fn attr_ints(name: &str, vs: &[i64]) -> Message {
    let mut a = Message::new();
    a.string(1, name).repeated_int(8, vs).int(20, 7);
    a
}

fn ints(vs: &[usize]) -> Vec<i64> {
    vs.iter().map(|&v| v as i64).collect()
}

struct Builder<'a> {
    g: &'a Graph,
    /// The static batch size the graph was compiled for.
    batch: usize,
    vars: &'a FxHashMap<String, Tensor>,
    step: i64,
    nodes: Vec<Message>,
    inits: Vec<Message>,
    vals: Vec<Option<Val>>,
    fresh: usize,
    /// `int64[1]`: the batch size of the inputs at run time (made on first use).
    batch_len: Option<String>,
    /// The input it is read from.
    batch_src: Option<String>,
    /// Initializers by content, written once.
    shared: FxHashMap<(i64, Vec<i64>, Vec<u8>), String>,
}

impl Builder<'_> {
    fn val(&self, n: NodeIndex) -> Val {
        self.vals[n.index()].clone().unwrap_or(Val {
            name: String::new(),
            dims: Vec::new(),
        })
    }

    fn name(&mut self) -> String {
        self.fresh += 1;
        format!("#{}", self.fresh)
    }

    /// Adds a node writing `outputs`.
    fn push_node(&mut self, op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<Message>) {
        let mut m = Message::new();
        for i in inputs {
            m.string(1, i);
        }
        for o in outputs {
            m.string(2, o);
        }
        m.string(3, &format!("{op}_{}", self.nodes.len()));
        m.string(4, op);
        for a in &attrs {
            m.message(5, a);
        }
        self.nodes.push(m);
    }

    /// Adds a node with one fresh output; returns its name.
    fn node(&mut self, op: &str, inputs: &[&str], attrs: Vec<Message>) -> String {
        let out = self.name();
        self.push_node(op, inputs, &[out.as_str()], attrs);
        out
    }

    /// An initializer of `elem` with `dims` and little-endian `raw` data (written once
    /// per distinct content); returns its name.
    fn init(&mut self, elem: i64, dims: &[i64], raw: Vec<u8>) -> String {
        let key = (elem, dims.to_vec(), raw);
        if let Some(n) = self.shared.get(&key) {
            return n.clone();
        }
        let name = self.name();
        let mut t = Message::new();
        t.repeated_int(1, dims)
            .int(2, elem)
            .string(8, &name)
            .bytes(9, &key.2);
        self.inits.push(t);
        self.shared.insert(key, name.clone());
        name
    }

    /// A tensor's values as an initializer.
    fn tensor(&mut self, t: &Tensor) -> String {
        let elem = elem_type(t.ty().dtype).unwrap_or(1);
        self.init(elem, &ints(t.shape()), t.to_le_bytes())
    }

    /// A 1-D `int64` initializer (shapes, axes, slice bounds).
    fn i64s(&mut self, vs: &[i64]) -> String {
        let raw: Vec<u8> = vs.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.init(7, &[vs.len() as i64], raw)
    }

    fn refuse(&self, n: NodeIndex, msg: String, help: &str) -> Diag {
        Diag::new(Code::Export, self.g.node(n).span, msg)
            .label(format!("`{}`", self.g.node(n).op.name()))
            .help(help.to_string())
    }

    /// `v` with its broadcast axes that `which` selects expanded to their IR sizes
    /// (`ir`).
    fn materialize(&mut self, v: &Val, ir: &[usize], which: impl Fn(usize) -> bool) -> Val {
        let target: Vec<Dim> = (0..v.dims.len())
            .map(|i| match v.dims[i] {
                Dim::Bcast if which(i) => Dim::Fixed(ir[i]),
                d => d,
            })
            .collect();
        self.expand_to(v, &target, ir)
    }

    /// The batch size at run time, `int64[1]`.
    fn batch_len(&mut self) -> String {
        if let Some(b) = &self.batch_len {
            return b.clone();
        }
        let src = self.batch_src.clone().unwrap_or_default();
        let name = self.node(
            "Shape",
            &[&src],
            vec![attr_int("start", 0), attr_int("end", 1)],
        );
        self.batch_len = Some(name.clone());
        name
    }

    /// `v` expanded to `target` (every broadcast axis the target does not broadcast made
    /// the target's size, the batch read at run time where the target has it): an
    /// `Expand` to a shape that is 1 on the other axes, which keeps them.
    fn expand_to(&mut self, v: &Val, target: &[Dim], ir: &[usize]) -> Val {
        let need: Vec<bool> = (0..v.dims.len())
            .map(|i| match (v.dims[i], target[i]) {
                (Dim::Bcast, t) => t != Dim::Bcast,
                // a size-1 axis meeting the batch where nothing broadcasts (concat)
                (Dim::Fixed(1), t) => t.factor().is_some(),
                _ => false,
            })
            .collect();
        if !need.contains(&true) {
            return v.clone();
        }
        let mut pieces: Vec<String> = Vec::new();
        let mut run: Vec<i64> = Vec::new();
        for i in 0..v.dims.len() {
            match (need[i], target[i]) {
                (true, Dim::Batch { outer, inner }) => {
                    let k = outer * inner;
                    if !run.is_empty() {
                        pieces.push(self.i64s(&run));
                        run.clear();
                    }
                    let len = self.batch_len();
                    pieces.push(if k == 1 {
                        len
                    } else {
                        let f = self.i64s(&[k as i64]);
                        self.node("Mul", &[&len, &f], Vec::new())
                    });
                }
                (true, _) => run.push(ir[i] as i64),
                (false, _) => run.push(1),
            }
        }
        if !run.is_empty() {
            pieces.push(self.i64s(&run));
        }
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let shape = if refs.len() == 1 {
            pieces[0].clone()
        } else {
            self.node("Concat", &refs, vec![attr_int("axis", 0)])
        };
        let name = self.node("Expand", &[&v.name, &shape], Vec::new());
        let dims = (0..v.dims.len())
            .map(|i| {
                if need[i] {
                    match target[i] {
                        Dim::Bcast => Dim::Fixed(ir[i]),
                        d => d,
                    }
                } else {
                    v.dims[i]
                }
            })
            .collect();
        Val { name, dims }
    }

    /// The axes of an elementwise result of `n`, of IR shape `out`, from its operands'
    /// axes (numpy broadcasting, aligned on the right). A fixed size meeting the batch,
    /// and the batch broadcast to more rows, are refused.
    fn combine(
        &self,
        n: NodeIndex,
        operands: &[(NodeIndex, &[Dim])],
        out: &[usize],
    ) -> Result<Vec<Dim>, Diag> {
        let rank = out.len();
        let mut dims = Vec::with_capacity(rank);
        for (i, &size) in out.iter().enumerate() {
            let mut batch: Option<Dim> = None;
            let mut fixed: Option<(NodeIndex, usize)> = None;
            for &(o, od) in operands {
                let Some(j) = (i + od.len()).checked_sub(rank) else {
                    continue;
                };
                match od[j] {
                    d @ Dim::Batch { .. } => {
                        if batch.is_some_and(|b| b != d) {
                            return Err(self.mixes(
                                n,
                                "combines values whose batch axes are laid out differently",
                            ));
                        }
                        batch = Some(d);
                    }
                    Dim::Fixed(s) if s > 1 => fixed = Some((o, j)),
                    Dim::Fixed(_) | Dim::Bcast => {}
                }
            }
            dims.push(match (batch, fixed) {
                (Some(_), Some((o, j))) => return Err(self.pinned(n, o, j)),
                (Some(d), None) if Some(size) != d.factor().map(|k| k * self.batch) => {
                    return Err(self.mixes(n, "broadcasts the batch over more rows"))
                }
                (Some(d), None) => d,
                (None, Some(_)) => Dim::Fixed(size),
                (None, None) if size == 1 => Dim::Fixed(1),
                (None, None) => Dim::Bcast,
            });
        }
        Ok(dims)
    }

    /// The axes of an elementwise op's result from all its operands'.
    fn elementwise(&self, n: NodeIndex, xs: &[NodeIndex], vs: &[Val]) -> Result<Vec<Dim>, Diag> {
        let operands: Vec<(NodeIndex, &[Dim])> = xs
            .iter()
            .zip(vs)
            .map(|(&x, v)| (x, v.dims.as_slice()))
            .collect();
        self.combine(n, &operands, &self.g.ty(n).shape)
    }

    /// E0922 for an op that makes an example's result depend on the other examples of
    /// its batch.
    fn mixes(&self, n: NodeIndex, what: &str) -> Diag {
        self.refuse(
            n,
            format!(
                "`{}` {what}: each example's result would depend on the other examples of its batch, so a served batch of another size would change it",
                self.g.node(n).op.name()
            ),
            "compute each prediction from its own example (reductions, softmax and products over other axes than the batch); an exported model serves any batch size",
        )
    }

    /// E0922 for a value of fixed size (its axis `axis`) meeting the batch in `n`.
    fn pinned(&self, n: NodeIndex, operand: NodeIndex, axis: usize) -> Diag {
        let ty = self.g.ty(operand);
        let mut d = Diag::new(
            Code::Export,
            self.g.node(n).span,
            format!(
                "`{}` meets the batch with a value of fixed size ({ty}, axis {axis}): an exported model serves any batch size, and this value would not follow it",
                self.g.node(n).op.name()
            ),
        )
        .label(format!("`{}`", self.g.node(n).op.name()))
        .help("make the value follow the batch: compute it from the features (`x * 0.0`) or from constants (`zeros([B, 10])` follows the batch), not from a variable or a range whose size is the batch size");
        if self.g.node(operand).span != self.g.node(n).span {
            d = d.with(self.g.node(operand).span, format!("this is {ty}"));
        }
        d
    }

    fn translate(&mut self, n: NodeIndex) -> Result<Val, Diag> {
        let node = self.g.node(n);
        let ty = node.ty.clone();
        let rank = ty.rank();
        let xs: Vec<NodeIndex> = self.g.operands(n).into_iter().collect();
        let vs: Vec<Val> = xs.iter().map(|&x| self.val(x)).collect();
        if elem_type(ty.dtype).is_none() {
            let why = if ty.dtype == DType::Bytes {
                "byte strings belong to the input pipeline"
            } else {
                "onnxruntime's CPU provider computes few ops in it, so results would not match est's"
            };
            return Err(self.refuse(
                n,
                format!("`{}` computes a {} value ({ty}), which the export does not write: {why}", node.op.name(), ty.dtype),
                "export a model that computes in f32 (cast the features to f32 first), or serve it with `estc predict` or the native library",
            ));
        }
        self.dtypes_served(n, &xs)?;
        let fixed = |ty: &TensorType| ty.shape.iter().map(|&s| Dim::Fixed(s)).collect::<Vec<_>>();
        let same = |v: &Val, name: String| Val {
            name,
            dims: v.dims.clone(),
        };
        Ok(match &node.op {
            Op::Input { name } if name == MASK_INPUT => {
                // Every row is real in a served batch: the mask is `true`, batch long.
                let t = self.tensor(&Tensor::splat(&TensorType::new(DType::Bool, vec![1]), 1.0));
                let one = Val {
                    name: t,
                    dims: vec![Dim::Bcast],
                };
                if self.batch_src.is_none() {
                    return Ok(one);
                }
                self.expand_to(&one, &[ROWS], &ty.shape)
            }
            Op::Input { name } => {
                let mut dims = fixed(&ty);
                dims[0] = ROWS;
                Val {
                    name: name.clone(),
                    dims,
                }
            }
            Op::Variable { name, .. } => {
                let Some(t) = self.vars.get(name) else {
                    return Err(Diag::new(
                        Code::CheckpointMismatch,
                        node.span,
                        format!("no value is given for the variable `{name}`"),
                    )
                    .label("this variable")
                    .help("export from a checkpoint of this program"));
                };
                let t = t.clone();
                Val {
                    name: self.tensor(&t),
                    dims: fixed(&ty),
                }
            }
            Op::GlobalStep => {
                let t = Tensor::splat(&TensorType::scalar(DType::I64), self.step as f64);
                Val {
                    name: self.tensor(&t),
                    dims: Vec::new(),
                }
            }
            Op::Const { bits } => {
                let one = TensorType::new(ty.dtype, vec![1; rank]);
                let name = self.tensor(&Tensor::splat(&one, f64::from_bits(*bits)));
                let dims = ty
                    .shape
                    .iter()
                    .map(|&s| if s == 1 { Dim::Fixed(1) } else { Dim::Bcast })
                    .collect();
                Val { name, dims }
            }
            Op::Iota { axis } => {
                let len = ty.shape[*axis];
                let mut shape = vec![1; rank];
                shape[*axis] = len;
                let t = Tensor::from_f64(
                    &TensorType::new(ty.dtype, shape),
                    (0..len).map(|i| i as f64).collect(),
                );
                let dims = (0..rank)
                    .map(|i| match ty.shape[i] {
                        s if i == *axis || s == 1 => Dim::Fixed(s),
                        _ => Dim::Bcast,
                    })
                    .collect();
                Val {
                    name: self.tensor(&t),
                    dims,
                }
            }
            Op::Unary(u) => {
                let x = &vs[0];
                let name = match (u, unary_op(*u)) {
                    (_, Some(op)) => self.node(op, &[&x.name], Vec::new()),
                    (UnaryOp::StopGradient, None) => return Ok(x.clone()),
                    (UnaryOp::Square, None) => self.node("Mul", &[&x.name, &x.name], Vec::new()),
                    // rsqrt
                    (_, None) => {
                        let s = self.node("Sqrt", &[&x.name], Vec::new());
                        self.node("Reciprocal", &[&s], Vec::new())
                    }
                };
                same(x, name)
            }
            Op::Binary(op) => {
                let dims = self.elementwise(n, &xs, &vs)?;
                let (a, b) = (vs[0].name.as_str(), vs[1].name.as_str());
                let name = match (op, binary_op(*op)) {
                    (_, Some(name)) => self.node(name, &[a, b], Vec::new()),
                    (BinaryOp::Rem, None) => self.node("Mod", &[a, b], vec![attr_int("fmod", 1)]),
                    // `!=`
                    (_, None) => {
                        let e = self.node("Equal", &[a, b], Vec::new());
                        self.node("Not", &[&e], Vec::new())
                    }
                };
                Val { name, dims }
            }
            Op::Select => {
                let dims = self.elementwise(n, &xs, &vs)?;
                let refs: Vec<&str> = vs.iter().map(|v| v.name.as_str()).collect();
                Val {
                    name: self.node("Where", &refs, Vec::new()),
                    dims,
                }
            }
            Op::Cast => {
                let to = elem_type(ty.dtype).unwrap_or(1);
                let name = self.node("Cast", &[&vs[0].name], vec![attr_int("to", to)]);
                same(&vs[0], name)
            }
            Op::CheckIndices { .. } | Op::CrossShardMean => vs[0].clone(),
            Op::Reduce {
                op,
                axes,
                keep_dims,
            } => {
                if axes.is_empty() {
                    return Ok(vs[0].clone());
                }
                if axes.iter().any(|&a| vs[0].dims[a].factor().is_some()) {
                    return Err(self.mixes(n, "reduces over the batch"));
                }
                let in_shape = self.g.ty(xs[0]).shape.clone();
                let x = self.materialize(&vs[0], &in_shape, |i| axes.contains(&i));
                let onnx = match op {
                    ReduceOp::Sum => "ReduceSum",
                    ReduceOp::Mean => "ReduceMean",
                    ReduceOp::Max => "ReduceMax",
                    ReduceOp::Min => "ReduceMin",
                    ReduceOp::Prod => "ReduceProd",
                };
                let ax = self.i64s(&ints(axes));
                let keep = attr_int("keepdims", i64::from(*keep_dims));
                let name = self.node(onnx, &[&x.name, &ax], vec![keep]);
                let dims = x
                    .dims
                    .iter()
                    .enumerate()
                    .filter_map(|(i, &d)| match (axes.contains(&i), keep_dims) {
                        (false, _) => Some(d),
                        (true, true) => Some(Dim::Fixed(1)),
                        (true, false) => None,
                    })
                    .collect();
                Val { name, dims }
            }
            Op::ArgMax { axis } | Op::ArgMin { axis } => {
                if vs[0].dims[*axis].factor().is_some() {
                    return Err(self.mixes(n, "compares the examples of the batch"));
                }
                let in_shape = self.g.ty(xs[0]).shape.clone();
                let x = self.materialize(&vs[0], &in_shape, |i| i == *axis);
                let op = if matches!(node.op, Op::ArgMax { .. }) {
                    "ArgMax"
                } else {
                    "ArgMin"
                };
                let r = self.node(
                    op,
                    &[&x.name],
                    vec![attr_int("axis", *axis as i64), attr_int("keepdims", 0)],
                );
                let to = elem_type(ty.dtype).unwrap_or(6);
                let mut dims = x.dims.clone();
                dims.remove(*axis);
                Val {
                    name: self.node("Cast", &[&r], vec![attr_int("to", to)]),
                    dims,
                }
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => {
                if vs[0].dims[*axis].factor().is_some() {
                    return Err(self.mixes(n, "normalises over the batch"));
                }
                let x = self.materialize(&vs[0], &ty.shape, |i| i == *axis);
                let op = if matches!(node.op, Op::Softmax { .. }) {
                    "Softmax"
                } else {
                    "LogSoftmax"
                };
                let name = self.node(op, &[&x.name], vec![attr_int("axis", *axis as i64)]);
                same(&x, name)
            }
            Op::MatMul => {
                let (sa, sb) = (self.g.ty(xs[0]).shape.clone(), self.g.ty(xs[1]).shape.clone());
                let (ra, rb) = (sa.len(), sb.len());
                if ra < 2 || rb < 2 {
                    return Err(self.refuse(n, format!("`matmul` of a rank-{} and a rank-{} value", ra, rb), "give both operands two axes or more"));
                }
                let a = self.materialize(&vs[0], &sa, |i| i == ra - 1);
                let bv = self.materialize(&vs[1], &sb, |i| i == rb - 2);
                if a.dims[ra - 1].factor().is_some() || bv.dims[rb - 2].factor().is_some() {
                    return Err(self.mixes(n, "sums over the batch"));
                }
                // The leading (batched) axes broadcast as elementwise ops do.
                let lead = [(xs[0], &a.dims[..ra - 2]), (xs[1], &bv.dims[..rb - 2])];
                let mut dims = self.combine(n, &lead, &ty.shape[..rank - 2])?;
                dims.push(a.dims[ra - 2]);
                dims.push(bv.dims[rb - 1]);
                Val {
                    name: self.node("MatMul", &[&a.name, &bv.name], Vec::new()),
                    dims,
                }
            }
            Op::Transpose { perm } => {
                let dims = perm.iter().map(|&p| vs[0].dims[p]).collect();
                Val {
                    name: self.node("Transpose", &[&vs[0].name], vec![attr_ints("perm", &ints(perm))]),
                    dims,
                }
            }
            Op::Reshape => self.reshape(n, &xs, &vs[0])?,
            Op::BroadcastTo => {
                let x = &vs[0];
                let from = self.g.ty(xs[0]).shape.clone();
                let extra = rank - from.len();
                let name = if extra > 0 {
                    let axes: Vec<i64> = (0..extra as i64).collect();
                    let a = self.i64s(&axes);
                    self.node("Unsqueeze", &[&x.name, &a], Vec::new())
                } else {
                    x.name.clone()
                };
                let mut dims = Vec::with_capacity(rank);
                for i in 0..rank {
                    dims.push(match i.checked_sub(extra) {
                        Some(j) if from[j] == ty.shape[i] => x.dims[j],
                        Some(j) if x.dims[j].factor().is_some() => {
                            return Err(self.mixes(n, "broadcasts the batch over more rows"))
                        }
                        _ if ty.shape[i] == 1 => Dim::Fixed(1),
                        _ => Dim::Bcast,
                    });
                }
                Val { name, dims }
            }
            Op::Concat { axis } => {
                if vs.iter().any(|v| v.dims[*axis].factor().is_some()) {
                    return Err(self.mixes(n, "joins values along their batch axis"));
                }
                // Concat broadcasts nothing: every operand takes the result's axes (the
                // batch at run time where one has it), but along `axis`.
                let operands: Vec<(NodeIndex, &[Dim])> = xs
                    .iter()
                    .zip(&vs)
                    .map(|(&x, v)| (x, v.dims.as_slice()))
                    .collect();
                let mut target = self.combine(n, &operands, &ty.shape)?;
                for (i, d) in target.iter_mut().enumerate() {
                    if *d == Dim::Bcast || i == *axis {
                        *d = Dim::Fixed(ty.shape[i]);
                    }
                }
                let mut names = Vec::with_capacity(vs.len());
                for (&x, v) in xs.iter().zip(&vs) {
                    let shape = self.g.ty(x).shape.clone();
                    let mut t = target.clone();
                    t[*axis] = Dim::Fixed(shape[*axis]);
                    names.push(self.expand_to(v, &t, &shape).name);
                }
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                Val {
                    name: self.node("Concat", &refs, vec![attr_int("axis", *axis as i64)]),
                    dims: target,
                }
            }
            Op::Slice { axis, start, end } => {
                let x = &vs[0];
                match x.dims[*axis] {
                    Dim::Batch { .. } => return Err(self.mixes(n, "cuts the batch axis")),
                    Dim::Bcast => {
                        // Every entry along the axis is the same: nothing to cut.
                        let mut dims = x.dims.clone();
                        if end - start == 1 {
                            dims[*axis] = Dim::Fixed(1);
                        }
                        Val {
                            name: x.name.clone(),
                            dims,
                        }
                    }
                    Dim::Fixed(_) => {
                        let s = self.i64s(&[*start as i64]);
                        let e = self.i64s(&[*end as i64]);
                        let a = self.i64s(&[*axis as i64]);
                        let mut dims = x.dims.clone();
                        dims[*axis] = Dim::Fixed(end - start);
                        Val {
                            name: self.node("Slice", &[&x.name, &s, &e, &a], Vec::new()),
                            dims,
                        }
                    }
                }
            }
            Op::OneHot { depth } => {
                let idx = &vs[0];
                let it = self.g.ty(xs[0]).dtype;
                let range = Tensor::from_f64(
                    &TensorType::new(it, vec![*depth]),
                    (0..*depth).map(|i| i as f64).collect(),
                );
                let r = self.tensor(&range);
                let last = self.i64s(&[-1]);
                let u = self.node("Unsqueeze", &[&idx.name, &last], Vec::new());
                let eq = self.node("Equal", &[&u, &r], Vec::new());
                let name = if ty.dtype == DType::Bool {
                    eq
                } else {
                    let to = elem_type(ty.dtype).unwrap_or(1);
                    self.node("Cast", &[&eq], vec![attr_int("to", to)])
                };
                let mut dims = idx.dims.clone();
                dims.push(Dim::Fixed(*depth));
                Val { name, dims }
            }
            Op::Gather => {
                if vs[0].dims.iter().any(|d| d.factor().is_some()) {
                    return Err(self.mixes(n, "looks up rows of a table made from the examples"));
                }
                let ts = self.g.ty(xs[0]).shape.clone();
                let table = self.materialize(&vs[0], &ts, |_| true);
                let idx = &vs[1];
                let mut dims = idx.dims.clone();
                dims.extend(table.dims[1..].iter().copied());
                Val {
                    name: self.node("Gather", &[&table.name, &idx.name], vec![attr_int("axis", 0)]),
                    dims,
                }
            }
            Op::Conv2d(c) => {
                self.images(n, &vs)?;
                let xs_shape = self.g.ty(xs[0]).shape.clone();
                let x = self.materialize(&vs[0], &xs_shape, |i| i > 0);
                let geo = Geo::conv(&xs_shape, &ty.shape, self.window(xs[1]), c);
                let f = self.filter(xs[1], &vs[1]);
                let xt = self.nchw(&x.name);
                let mut attrs = window_attrs(&geo);
                attrs.push(attr_ints("dilations", &ints(&c.dilation)));
                let y = self.node("Conv", &[&xt, &f], attrs);
                self.nhwc(&y, x.dims[0], &ty)
            }
            Op::Conv2dBackpropInput(c) => {
                // The gradient of a convolution's input (`conv2d_transpose`): ONNX's
                // ConvTranspose of the convolution from this shape to dy's, its output
                // sized to est's by `output_padding`.
                self.images(n, &vs)?;
                let dys = self.g.ty(xs[0]).shape.clone();
                let dy = self.materialize(&vs[0], &dys, |i| i > 0);
                let geo = Geo::conv(&ty.shape, &dys, self.window(xs[1]), c);
                // the rows and columns the windows leave uncovered at the end
                let [eh, ew] = geo.extent();
                let extra = ints(&[
                    (geo.h + geo.pt).saturating_sub(eh),
                    (geo.w + geo.pl).saturating_sub(ew),
                ]);
                let f = self.filter(xs[1], &vs[1]);
                let dt = self.nchw(&dy.name);
                let mut attrs = window_attrs(&geo);
                attrs.push(attr_ints("dilations", &ints(&c.dilation)));
                attrs.push(attr_ints("output_padding", &extra));
                let y = self.node("ConvTranspose", &[&dt, &f], attrs);
                self.nhwc(&y, dy.dims[0], &ty)
            }
            Op::MaxPool2d(p) | Op::AvgPool2d(p) => {
                self.images(n, &vs)?;
                let xs_shape = self.g.ty(xs[0]).shape.clone();
                let x = self.materialize(&vs[0], &xs_shape, |i| i > 0);
                let geo = Geo::pool(&xs_shape, &ty.shape, p);
                let xt = self.nchw(&x.name);
                let op = if matches!(node.op, Op::MaxPool2d(_)) {
                    "MaxPool"
                } else {
                    "AveragePool"
                };
                let y = self.node(op, &[&xt], window_attrs(&geo));
                self.nhwc(&y, x.dims[0], &ty)
            }
            Op::RandomUniform { .. } | Op::RandomNormal { .. } => {
                return Err(self.refuse(
                    n,
                    format!("`{}` makes random numbers in the predict graph, which an ONNX model cannot reproduce", node.op.name()),
                    "make predictions deterministic (dropout and noise belong to training: `if mode == train`)",
                ))
            }
            Op::DecodeRaw | Op::DecodeImage { .. } | Op::Lookup { .. } | Op::HashBucket { .. } => {
                return Err(self.refuse(
                    n,
                    format!("`{}` belongs to the input pipeline, which the export does not write", node.op.name()),
                    "decode and look up in the input pipeline (`map`), so that the model takes numbers",
                ))
            }
            Op::Conv2dBackpropFilter(_)
            | Op::MaxPool2dGrad(_)
            | Op::AvgPool2dGrad(_)
            | Op::ScatterAdd => {
                return Err(self.refuse(
                    n,
                    format!("`{}` is a gradient, which a predict graph does not compute", node.op.name()),
                    "predict from the model's forward values",
                ))
            }
        })
    }

    /// E0922 unless the batch is at most the images' axis 0 (not a spatial or channel
    /// axis, nor in the filter).
    fn images(&self, n: NodeIndex, vs: &[Val]) -> Result<(), Diag> {
        let x_ok = vs[0].dims[1..].iter().all(|d| d.factor().is_none());
        let f_ok = vs[1..]
            .iter()
            .all(|v| v.dims.iter().all(|d| d.factor().is_none()));
        if x_ok && f_ok {
            Ok(())
        } else {
            Err(self.mixes(n, "slides its window over the batch"))
        }
    }

    /// E0922 for an op onnxruntime's CPU provider has no kernel for at these dtypes:
    /// arithmetic on u8, orderings of booleans.
    fn dtypes_served(&self, n: NodeIndex, xs: &[NodeIndex]) -> Result<(), Diag> {
        let op = &self.g.node(n).op;
        let computes = matches!(
            op,
            Op::Unary(_)
                | Op::Binary(_)
                | Op::Reduce { .. }
                | Op::ArgMax { .. }
                | Op::ArgMin { .. }
                | Op::MatMul
                | Op::Softmax { .. }
                | Op::LogSoftmax { .. }
                | Op::Conv2d(_)
                | Op::MaxPool2d(_)
                | Op::AvgPool2d(_)
        );
        let equality = matches!(op, Op::Binary(BinaryOp::Eq | BinaryOp::Ne));
        let ordered = matches!(
            op,
            Op::Binary(
                BinaryOp::Lt
                    | BinaryOp::Le
                    | BinaryOp::Gt
                    | BinaryOp::Ge
                    | BinaryOp::Max
                    | BinaryOp::Min
            )
        );
        let bad = xs
            .iter()
            .map(|&x| self.g.ty(x).dtype)
            .find(|&d| (computes && !equality && d == DType::U8) || (ordered && d == DType::Bool));
        match bad {
            None => Ok(()),
            Some(d) => Err(self.refuse(
                n,
                format!(
                    "`{}` computes on {d}, for which onnxruntime's CPU provider has no kernel of it",
                    op.name()
                ),
                "cast the operands to i32 (or f32) first",
            )),
        }
    }

    /// The (height, width) of the HWIO filter `f`.
    fn window(&self, f: NodeIndex) -> [usize; 2] {
        let s = &self.g.ty(f).shape;
        [s[0], s[1]]
    }

    /// An HWIO filter as ONNX's OIHW (ConvTranspose reads the same order as its
    /// input and output channels: est's filter is the forward convolution's).
    fn filter(&mut self, f: NodeIndex, v: &Val) -> String {
        let fs = self.g.ty(f).shape.clone();
        let f = self.materialize(v, &fs, |_| true);
        self.node(
            "Transpose",
            &[&f.name],
            vec![attr_ints("perm", &[3, 2, 0, 1])],
        )
    }

    fn nchw(&mut self, x: &str) -> String {
        self.node("Transpose", &[x], vec![attr_ints("perm", &[0, 3, 1, 2])])
    }

    /// An NCHW result back in est's NHWC, its batch axis `first`.
    fn nhwc(&mut self, y: &str, first: Dim, ty: &TensorType) -> Val {
        let name = self.node("Transpose", &[y], vec![attr_ints("perm", &[0, 2, 3, 1])]);
        let mut dims: Vec<Dim> = ty.shape.iter().map(|&s| Dim::Fixed(s)).collect();
        dims[0] = first;
        Val { name, dims }
    }

    /// A reshape: the batch (if any) keeps its place in the row-major layout, so that
    /// it is one output axis `outer * batch * inner` with the same elements before and
    /// after it as in the input, written `-1`.
    fn reshape(&mut self, n: NodeIndex, xs: &[NodeIndex], v: &Val) -> Result<Val, Diag> {
        let from = self.g.ty(xs[0]).shape.clone();
        let to = self.g.ty(n).shape.clone();
        let x = self.materialize(v, &from, |_| true);
        let batch_axes: Vec<usize> = (0..x.dims.len())
            .filter(|&i| x.dims[i].factor().is_some())
            .collect();
        let mut dims: Vec<Dim> = to.iter().map(|&s| Dim::Fixed(s)).collect();
        let mut shape: Vec<i64> = ints(&to);
        match batch_axes.as_slice() {
            [] => {}
            [a] => {
                let Dim::Batch { outer, inner } = x.dims[*a] else {
                    return Err(self.mixes(n, "reshapes the batch"));
                };
                let before = from[..*a].iter().product::<usize>() * outer;
                let after = inner * from[a + 1..].iter().product::<usize>();
                let b = self.batch.max(1);
                let place = (0..to.len()).find_map(|j| {
                    let pre = to[..j].iter().product::<usize>();
                    let post = to[j + 1..].iter().product::<usize>();
                    let fits = pre > 0 && post > 0 && before % pre == 0 && after % post == 0;
                    let (o, i) = if fits {
                        (before / pre, after / post)
                    } else {
                        (0, 0)
                    };
                    (fits && to[j] == o * b * i).then_some((j, o, i))
                });
                let Some((j, outer, inner)) = place else {
                    let what = format!(
                        "reshapes {} to {}, mixing the batch with other axes",
                        self.g.ty(xs[0]),
                        self.g.ty(n)
                    );
                    return Err(self.mixes(n, &what));
                };
                dims[j] = Dim::Batch { outer, inner };
                shape[j] = -1;
            }
            _ => return Err(self.mixes(n, "reshapes a value with the batch in several axes")),
        }
        let mut attrs = Vec::new();
        if to.contains(&0) {
            if shape.contains(&-1) {
                return Err(self.refuse(
                    n,
                    format!("`reshape` to an empty shape ({})", self.g.ty(n)),
                    "give every axis of a served value a size",
                ));
            }
            attrs.push(attr_int("allowzero", 1));
        }
        let s = self.i64s(&shape);
        Ok(Val {
            name: self.node("Reshape", &[&x.name, &s], attrs),
            dims,
        })
    }
}

/// The attributes every window op has: its kernel, strides and `pads` (the
/// padding before, then after, along H and W, as est's window geometry has them).
fn window_attrs(geo: &Geo) -> Vec<Message> {
    let after = geo.pads_after();
    vec![
        attr_ints("kernel_shape", &ints(&[geo.kh, geo.kw])),
        attr_ints("strides", &ints(&[geo.sh, geo.sw])),
        attr_ints("pads", &ints(&[geo.pt, geo.pl, after[0], after[1]])),
    ]
}
