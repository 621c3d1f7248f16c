//! The input pipeline: what runs an elaborated `Dataset` (its sources, transforms and
//! batching) and feeds a backend's steps, apart from the Estimator loop that consumes
//! it.
//!
//! - `pipeline`: the executor (stages, workers, prefetch, resume at an input position);
//! - `sources`: ranges, tensors, TFRecord, `.npy`, PNG directories;
//! - `csv`: CSV and TSV files read into elements;
//! - `image`: PNG and JPEG decoding, channel conversion and resizing;
//! - `records`: TFRecord framing, `tf.Example` and `.npy` encoding;
//! - `cache`: the storage of the `cache` transform;
//! - `convert`: `estc data convert`.

pub mod cache;
pub mod convert;
pub mod csv;
pub mod image;
pub mod pipeline;
pub mod records;
pub mod sources;
