//! The input pipeline: what runs an elaborated `Dataset` (its sources, transforms and
//! batching) and feeds a backend's steps, apart from the Estimator loop that consumes
//! it.
//!
//! - `pipeline`: the executor (stages, workers, prefetch, resume at an input position);
//! - `sources`: ranges, tensors, CSV, TFRecord, `.npy`, PNG directories;
//! - `image`: PNG and JPEG decoding, channel conversion and resizing;
//! - `records`: TFRecord framing, `tf.Example` and `.npy` encoding;
//! - `cache`: the storage of the `cache` transform;
//! - `convert`: `estc data convert`.

pub mod cache;
pub mod convert;
pub mod image;
pub mod pipeline;
pub mod records;
pub mod sources;
