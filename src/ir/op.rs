//! The operations of the IR: a plain enum (no trait objects), `Eq + Hash` so that CSE can
//! hash nodes. Float attributes are stored as bit patterns to keep `Eq` lawful. Shapes
//! that an op produces (reshape, broadcast, random) are the node's type, not the op's.

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    /// A value fed by the input pipeline: `features` or `labels`.
    Input {
        name: String,
    },
    /// A trainable weight (or non-trainable state), created with its initialiser.
    Variable {
        name: String,
        init: Init,
        trainable: bool,
    },
    /// A constant: one value (f64 bits) splatted over the node's shape.
    Const {
        bits: u64,
    },
    /// The global step counter, the one i64 value.
    GlobalStep,
    /// Each element's index along `axis`, in the node's dtype (`tf.range` broadcast over
    /// the node's shape): the counting that `cumsum`, `resize` and `reverse`'s masks use.
    Iota {
        axis: usize,
    },
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// `where(cond, a, b)`, elementwise with broadcasting.
    Select,
    Cast,
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        keep_dims: bool,
    },
    ArgMax {
        axis: usize,
    },
    ArgMin {
        axis: usize,
    },
    /// Matrix product over the last two axes (batched over leading ones).
    MatMul,
    Transpose {
        perm: Vec<usize>,
    },
    Reshape,
    BroadcastTo,
    Concat {
        axis: usize,
    },
    Slice {
        axis: usize,
        start: usize,
        end: usize,
    },
    OneHot {
        depth: usize,
    },
    /// The identity on integer class indices that must lie in `[0, depth)`: a label
    /// outside is a run-time error naming it and its batch position (added by the
    /// `check_labels` pass before the `one_hot` of a loss and the labels of `accuracy`).
    CheckIndices {
        depth: usize,
    },
    /// Rows of a table (operand 0) picked by indices (operand 1): embedding lookup.
    Gather,
    /// NHWC input, HWIO filter.
    Conv2d(Conv),
    MaxPool2d(Pool),
    AvgPool2d(Pool),
    Softmax {
        axis: usize,
    },
    LogSoftmax {
        axis: usize,
    },
    /// Uniform in [0, 1) or standard normal, from a counter-based generator keyed by
    /// the run seed, `stream` (the op's stable identity) and the global step.
    RandomUniform {
        stream: u64,
    },
    RandomNormal {
        stream: u64,
    },
    /// Reinterpret a byte string as a vector of `dtype` (input pipelines).
    DecodeRaw,
    /// One encoded image (a scalar of bytes) decoded to `[height, width, channels]`,
    /// the channels the node's (input pipelines): u8 of the image's own size (open
    /// dimensions, `UNKNOWN_DIM`, take it; fixed ones must match), or with `resize`, f32
    /// resized to the node's height and width (`tf.image.resize`, bilinear).
    DecodeImage {
        format: ImageFormat,
        resize: bool,
    },
    /// Each string's index in `vocab` (i32); a string not in it gets
    /// `vocab.len() + hash % oov` with `oov` buckets, else `default`
    /// (`tf.feature_column.categorical_column_with_vocabulary_list`). Input pipelines.
    Lookup {
        vocab: Vec<String>,
        oov: usize,
        default: i64,
    },
    /// Each string's hash modulo `buckets` (i32; FNV-1a 64, not TensorFlow's
    /// Fingerprint64). Input pipelines.
    HashBucket {
        buckets: usize,
    },
    /// Gradients made by autodiff. The gradient of conv2d's input: operands (dy, filter),
    /// result shaped like the input (the node's type).
    Conv2dBackpropInput(Conv),
    /// The gradient of conv2d's filter: operands (x, dy), result shaped like the filter.
    Conv2dBackpropFilter(Conv),
    /// The gradient of max pooling: operands (x, dy); dy goes to the first maximum of
    /// each window.
    MaxPool2dGrad(Pool),
    /// The gradient of average pooling: operand dy, result shaped like the input.
    AvgPool2dGrad(Pool),
    /// The gradient of gather: operands (indices, dy), rows of dy added into a zero table
    /// (the node's type).
    ScatterAdd,
    /// The mean of a value over the shards of a replicated step (the cross-shard
    /// optimiser averages gradients with it); the identity with one shard.
    CrossShardMean,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Not,
    Abs,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Square,
    Tanh,
    Sigmoid,
    Relu,
    Floor,
    Sign,
    Sin,
    Cos,
    /// The error function, `2 / sqrt(pi) * integral of exp(-t^2) from 0 to x`.
    Erf,
    /// The identity whose gradient is zero (`tf.stop_gradient`).
    StopGradient,
}

impl UnaryOp {
    /// The op on a number, in f64: what constant folding and static values compute
    /// (`None` for `!`, which is not arithmetic).
    pub fn eval(self, x: f64) -> Option<f64> {
        use super::float;
        Some(match self {
            UnaryOp::Neg => -x,
            UnaryOp::Not => return None,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Square => x * x,
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Relu => float::relu(x),
            UnaryOp::Floor => x.floor(),
            UnaryOp::Sign => float::sign(x),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Erf => float::erf(x),
            UnaryOp::StopGradient => x,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Pow,
    Max,
    Min,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinaryOp {
    pub fn is_comparison(self) -> bool {
        matches!(
            self,
            BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge
        )
    }

    pub fn is_logical(self) -> bool {
        matches!(self, BinaryOp::And | BinaryOp::Or)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

/// The geometry of a 2-D convolution (and of its gradients).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conv {
    pub strides: [usize; 2],
    pub padding: Padding,
    pub dilation: [usize; 2],
}

/// The geometry of a 2-D pooling window (and of its gradients).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pool {
    pub window: [usize; 2],
    pub strides: [usize; 2],
    pub padding: Padding,
}

/// The encodings `DecodeImage` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageFormat {
    Png,
    Jpeg,
}

impl ImageFormat {
    pub fn name(self) -> &'static str {
        match self {
            ImageFormat::Png => "PNG",
            ImageFormat::Jpeg => "JPEG",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Padding {
    Same,
    Valid,
}

/// How a variable starts. Scales are f32 bit patterns.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Init {
    Zeros,
    Ones,
    Constant {
        bits: u32,
    },
    GlorotUniform,
    GlorotNormal,
    HeUniform,
    HeNormal,
    LecunNormal,
    Uniform {
        lo_bits: u32,
        hi_bits: u32,
    },
    Normal {
        stddev_bits: u32,
    },
    TruncatedNormal {
        stddev_bits: u32,
    },
    /// Keras's `VarianceScaling`: variance `scale / n` for `n` the fan of `mode`.
    VarianceScaling {
        scale_bits: u32,
        mode: FanMode,
        distribution: Distribution,
    },
    /// Keras's `Orthogonal`: the kernel, flattened to `[fan, units]`, an orthogonal
    /// matrix (of a normal one's QR decomposition) times `gain`.
    Orthogonal {
        gain_bits: u32,
    },
    /// The initial values of another variable (`name`, made with `init`): a moving
    /// average starts where its variable starts.
    As {
        init: Box<Init>,
        name: String,
    },
}

/// Which fan a variance-scaling initialiser divides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FanMode {
    FanIn,
    FanOut,
    /// `(fan_in + fan_out) / 2`.
    FanAvg,
}

/// The distribution of a variance-scaling initialiser.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Distribution {
    /// A normal truncated at two deviations, rescaled to the variance.
    TruncatedNormal,
    UntruncatedNormal,
    Uniform,
}

impl FanMode {
    pub const NAMES: [&'static str; 3] = ["fan_in", "fan_out", "fan_avg"];

    pub fn from_name(s: &str) -> Option<FanMode> {
        Some(match s {
            "fan_in" => FanMode::FanIn,
            "fan_out" => FanMode::FanOut,
            "fan_avg" => FanMode::FanAvg,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

impl Distribution {
    pub const NAMES: [&'static str; 3] = ["truncated_normal", "untruncated_normal", "uniform"];

    pub fn from_name(s: &str) -> Option<Distribution> {
        Some(match s {
            "truncated_normal" => Distribution::TruncatedNormal,
            "untruncated_normal" | "normal" => Distribution::UntruncatedNormal,
            "uniform" => Distribution::Uniform,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        Self::NAMES[self as usize]
    }
}

impl Init {
    pub fn describe(&self) -> String {
        match self {
            Init::Zeros => "zeros".into(),
            Init::Ones => "ones".into(),
            Init::Constant { bits } => format!("constant({})", f32::from_bits(*bits)),
            Init::GlorotUniform => "glorot_uniform".into(),
            Init::GlorotNormal => "glorot_normal".into(),
            Init::HeUniform => "he_uniform".into(),
            Init::HeNormal => "he_normal".into(),
            Init::LecunNormal => "lecun_normal".into(),
            Init::Uniform { lo_bits, hi_bits } => {
                format!(
                    "uniform({}, {})",
                    f32::from_bits(*lo_bits),
                    f32::from_bits(*hi_bits)
                )
            }
            Init::Normal { stddev_bits } => format!("normal({})", f32::from_bits(*stddev_bits)),
            Init::TruncatedNormal { stddev_bits } => {
                format!("truncated_normal({})", f32::from_bits(*stddev_bits))
            }
            Init::VarianceScaling {
                scale_bits,
                mode,
                distribution,
            } => format!(
                "variance_scaling({}, {}, {})",
                f32::from_bits(*scale_bits),
                mode.name(),
                distribution.name()
            ),
            Init::Orthogonal { gain_bits } => {
                format!("orthogonal({})", f32::from_bits(*gain_bits))
            }
            Init::As { name, .. } => format!("as({name})"),
        }
    }
}

impl Op {
    /// The op's name as dumps and diagnostics show it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input { .. } => "input",
            Op::Variable { .. } => "variable",
            Op::Const { .. } => "const",
            Op::GlobalStep => "global_step",
            Op::Unary(u) => match u {
                UnaryOp::Neg => "neg",
                UnaryOp::Not => "not",
                UnaryOp::Abs => "abs",
                UnaryOp::Exp => "exp",
                UnaryOp::Log => "log",
                UnaryOp::Sqrt => "sqrt",
                UnaryOp::Rsqrt => "rsqrt",
                UnaryOp::Square => "square",
                UnaryOp::Tanh => "tanh",
                UnaryOp::Sigmoid => "sigmoid",
                UnaryOp::Relu => "relu",
                UnaryOp::Floor => "floor",
                UnaryOp::Sign => "sign",
                UnaryOp::Sin => "sin",
                UnaryOp::Cos => "cos",
                UnaryOp::Erf => "erf",
                UnaryOp::StopGradient => "stop_gradient",
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => "add",
                BinaryOp::Sub => "sub",
                BinaryOp::Mul => "mul",
                BinaryOp::Div => "div",
                BinaryOp::Rem => "rem",
                BinaryOp::Pow => "pow",
                BinaryOp::Max => "maximum",
                BinaryOp::Min => "minimum",
                BinaryOp::Eq => "eq",
                BinaryOp::Ne => "ne",
                BinaryOp::Lt => "lt",
                BinaryOp::Le => "le",
                BinaryOp::Gt => "gt",
                BinaryOp::Ge => "ge",
                BinaryOp::And => "and",
                BinaryOp::Or => "or",
            },
            Op::Select => "select",
            Op::Cast => "cast",
            Op::Reduce { op, .. } => match op {
                ReduceOp::Sum => "reduce_sum",
                ReduceOp::Mean => "reduce_mean",
                ReduceOp::Max => "reduce_max",
                ReduceOp::Min => "reduce_min",
                ReduceOp::Prod => "reduce_prod",
            },
            Op::ArgMax { .. } => "argmax",
            Op::ArgMin { .. } => "argmin",
            Op::MatMul => "matmul",
            Op::Transpose { .. } => "transpose",
            Op::Reshape => "reshape",
            Op::BroadcastTo => "broadcast_to",
            Op::Concat { .. } => "concat",
            Op::Slice { .. } => "slice",
            Op::OneHot { .. } => "one_hot",
            Op::Iota { .. } => "iota",
            Op::CheckIndices { .. } => "check_indices",
            Op::Gather => "gather",
            Op::Conv2d(_) => "conv2d",
            Op::MaxPool2d(_) => "max_pool2d",
            Op::AvgPool2d(_) => "avg_pool2d",
            Op::Softmax { .. } => "softmax",
            Op::LogSoftmax { .. } => "log_softmax",
            Op::RandomUniform { .. } => "random_uniform",
            Op::RandomNormal { .. } => "random_normal",
            Op::DecodeRaw => "decode_raw",
            Op::DecodeImage {
                format: ImageFormat::Png,
                ..
            } => "decode_png",
            Op::DecodeImage {
                format: ImageFormat::Jpeg,
                ..
            } => "decode_jpeg",
            Op::Lookup { .. } => "lookup",
            Op::HashBucket { .. } => "hash_bucket",
            Op::Conv2dBackpropInput(_) => "conv2d_backprop_input",
            Op::Conv2dBackpropFilter(_) => "conv2d_backprop_filter",
            Op::MaxPool2dGrad(_) => "max_pool2d_grad",
            Op::AvgPool2dGrad(_) => "avg_pool2d_grad",
            Op::ScatterAdd => "scatter_add",
            Op::CrossShardMean => "cross_shard_mean",
        }
    }

    /// The op's attributes for dumps, e.g. `axes=[1] keep_dims=false`.
    pub fn attrs(&self) -> String {
        match self {
            Op::Input { name } => format!("\"{name}\""),
            Op::Variable {
                name,
                init,
                trainable,
            } => {
                format!(
                    "\"{name}\" init={}{}",
                    init.describe(),
                    if *trainable { "" } else { " frozen" }
                )
            }
            Op::Const { bits } => fmt_f64(f64::from_bits(*bits)),
            Op::Reduce {
                axes, keep_dims, ..
            } => format!("axes={axes:?} keep_dims={keep_dims}"),
            Op::ArgMax { axis } | Op::ArgMin { axis } | Op::Concat { axis } | Op::Iota { axis } => {
                format!("axis={axis}")
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } => format!("axis={axis}"),
            Op::Transpose { perm } => format!("perm={perm:?}"),
            Op::Slice { axis, start, end } => format!("axis={axis} {start}..{end}"),
            Op::OneHot { depth } | Op::CheckIndices { depth } => format!("depth={depth}"),
            Op::Conv2d(c) | Op::Conv2dBackpropInput(c) | Op::Conv2dBackpropFilter(c) => {
                format!(
                    "strides={:?} padding={} dilation={:?}",
                    c.strides,
                    padding_name(c.padding),
                    c.dilation
                )
            }
            Op::MaxPool2d(p) | Op::AvgPool2d(p) | Op::MaxPool2dGrad(p) | Op::AvgPool2dGrad(p) => {
                format!(
                    "window={:?} strides={:?} padding={}",
                    p.window,
                    p.strides,
                    padding_name(p.padding)
                )
            }
            Op::RandomUniform { stream } | Op::RandomNormal { stream } => {
                format!("stream={stream:#x}")
            }
            Op::Lookup {
                vocab,
                oov,
                default,
            } => format!("vocab={} oov={oov} default={default}", vocab.len()),
            Op::HashBucket { buckets } => format!("buckets={buckets}"),
            Op::DecodeImage { resize, .. } => format!("resize={resize}"),
            _ => String::new(),
        }
    }

    /// Ops with no operands whose value comes from outside the graph or from state.
    pub fn is_source(&self) -> bool {
        matches!(
            self,
            Op::Input { .. } | Op::Variable { .. } | Op::GlobalStep
        )
    }

    /// Ops that must not be merged or folded: they read state or make random numbers.
    pub fn is_stateful(&self) -> bool {
        self.is_source() || matches!(self, Op::RandomUniform { .. } | Op::RandomNormal { .. })
    }
}

pub fn padding_name(p: Padding) -> &'static str {
    match p {
        Padding::Same => "same",
        Padding::Valid => "valid",
    }
}

/// A float printed so that it reads back exactly and integers look like floats (`2.0`).
pub fn fmt_f64(v: f64) -> String {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}
