//! The IR: a static dataflow graph per (mode, target). It holds no control flow: loops
//! were unrolled and conditions resolved by elaboration; every node has a concrete shape
//! and dtype.

mod dump;
pub mod float;
mod graph;
mod infer;
mod op;
mod types;

pub use dump::{dump_dot, dump_text};
pub use graph::{
    name_matches, read_averages, BatchMask, Graph, LossScale, Metric, Node, Operands, Optimizer,
    Output, Role, AVERAGE_SUFFIX, GOOD_STEPS, LOSS_SCALE, MASK_INPUT,
};
pub use infer::{arity, infer, window_out, window_pad, InferError, UNKNOWN_HELP};
pub use op::{
    fmt_f64, padding_name, BinaryOp, Conv, Distribution, FanMode, ImageFormat, Init, Op, Padding,
    Pool, ReduceOp, UnaryOp,
};
pub use petgraph::stable_graph::NodeIndex;
pub use types::{broadcast, DType, Shape, TensorType, UNKNOWN_DIM};
