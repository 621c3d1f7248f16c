//! Export for serving (issue 14, in progress): ONNX files that onnxruntime runs. So far
//! the protobuf writer that ONNX's messages are written with (`proto`); the graph
//! translation, `estc export` and `Estimator::export` come next.

pub mod proto;
