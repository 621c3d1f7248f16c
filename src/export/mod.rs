//! Export for serving (issue 14): the predict graph as an ONNX model that onnxruntime
//! runs (`onnx`), written with a protobuf writer of our own (`proto`). The runtime's
//! `Estimator::export` picks the checkpoint and writes the file; the native library
//! comes from the host backend (`backend::host::library`).

pub mod onnx;
pub mod proto;
pub mod verify;
