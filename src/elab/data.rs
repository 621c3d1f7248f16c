//! Datasets as elaboration sees them: a chain of stages (a source, then transforms),
//! with the element structure each stage yields and the facts the estimator rules need
//! (batching, repetition, shuffling). The input-pipeline runtime executes these stages.

use crate::ir::{DType, Graph};
use crate::span::Span;
use std::fmt;

/// The structure of a dataset element: tensors (with possibly unknown dimensions) in
/// tuples and records.
#[derive(Debug, Clone, PartialEq)]
pub enum Elem {
    Tensor {
        dtype: DType,
        dims: Vec<Option<usize>>,
    },
    Tuple(Vec<Elem>),
    Record(Vec<(String, Elem)>),
}

impl Elem {
    pub fn scalar(dtype: DType) -> Elem {
        Elem::Tensor {
            dtype,
            dims: Vec::new(),
        }
    }

    /// The element with a leading batch dimension on every tensor.
    /// Whether each leaf's first axis is of unknown length (a variable-length
    /// sequence), in leaf order.
    pub fn variable_leaves(&self) -> Vec<bool> {
        match self {
            Elem::Tensor { dims, .. } => vec![dims.first() == Some(&None)],
            Elem::Tuple(xs) => xs.iter().flat_map(Elem::variable_leaves).collect(),
            Elem::Record(fs) => fs.iter().flat_map(|(_, x)| x.variable_leaves()).collect(),
        }
    }

    /// The element with each variable-length leaf's first axis `n` long.
    pub fn fixed(&self, n: usize) -> Elem {
        match self {
            Elem::Tensor { dtype, dims } if dims.first() == Some(&None) => {
                let mut d = dims.clone();
                d[0] = Some(n);
                Elem::Tensor {
                    dtype: *dtype,
                    dims: d,
                }
            }
            Elem::Tensor { .. } => self.clone(),
            Elem::Tuple(xs) => Elem::Tuple(xs.iter().map(|x| x.fixed(n)).collect()),
            Elem::Record(fs) => {
                Elem::Record(fs.iter().map(|(k, x)| (k.clone(), x.fixed(n))).collect())
            }
        }
    }

    pub fn batched(&self, n: Option<usize>) -> Elem {
        match self {
            Elem::Tensor { dtype, dims } => {
                let mut d = vec![n];
                d.extend(dims.iter().copied());
                Elem::Tensor {
                    dtype: *dtype,
                    dims: d,
                }
            }
            Elem::Tuple(xs) => Elem::Tuple(xs.iter().map(|x| x.batched(n)).collect()),
            Elem::Record(fs) => {
                Elem::Record(fs.iter().map(|(k, x)| (k.clone(), x.batched(n))).collect())
            }
        }
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Elem::Tensor { dtype, dims } => {
                let d: Vec<String> = dims
                    .iter()
                    .map(|d| d.map_or("?".to_string(), |v| v.to_string()))
                    .collect();
                write!(f, "{dtype}[{}]", d.join(", "))
            }
            Elem::Tuple(xs) => {
                let s: Vec<String> = xs.iter().map(|x| x.to_string()).collect();
                write!(f, "({})", s.join(", "))
            }
            Elem::Record(fs) => {
                let s: Vec<String> = fs.iter().map(|(k, x)| format!("{k}: {x}")).collect();
                write!(f, "{{{}}}", s.join(", "))
            }
        }
    }
}

/// How a `png` source labels its images.
#[derive(Debug, Clone, PartialEq)]
pub enum PngLabels {
    /// The name of the folder an image is in, mapped to its index among the sorted names.
    Folder,
    /// A CSV with `file,label` rows.
    Csv(String),
}

/// A CSV column's default: a number, or a string for a string column.
#[derive(Debug, Clone, PartialEq)]
pub enum CsvValue {
    Number(f64),
    Text(String),
}

/// One stage of a pipeline. Sources come first; every other stage transforms the
/// stream of the stage before it.
#[derive(Debug, Clone)]
pub enum StageKind {
    TfRecord {
        paths: Vec<String>,
        /// Skip (and count) damaged records instead of failing.
        skip_corrupt: bool,
    },
    Csv {
        path: String,
        header: bool,
        columns: Vec<(String, DType, usize)>,
        delimiter: u8,
        /// What a missing field of each column becomes (`defaults`), by column.
        defaults: Vec<Option<CsvValue>>,
        /// The fields that are missing values (after trimming), as `na_values`.
        missing: Vec<String>,
        /// Skip (and count) a row that cannot be read, instead of failing.
        skip_invalid: bool,
    },
    Text {
        path: String,
    },
    Png {
        pattern: String,
        channels: usize,
        height: usize,
        width: usize,
        dtype: DType,
        labels: PngLabels,
    },
    Npy {
        path: String,
        dtype: DType,
        dims: Vec<usize>,
    },
    Range {
        n: i64,
    },
    /// In-memory elements (`from_tensor_slices` of static lists): each element's
    /// leaves, in leaf order.
    Slices {
        rows: Vec<Vec<crate::tensor::Tensor>>,
    },
    /// Records of `record_bytes` bytes from binary files, after `header_bytes` and
    /// before `footer_bytes` of each (CIFAR-10's; TensorFlow's
    /// `FixedLengthRecordDataset`).
    FixedLength {
        paths: Vec<String>,
        record_bytes: usize,
        header_bytes: usize,
        footer_bytes: usize,
    },
    /// Random elements of the given leaf types from the run seed; endless without a
    /// count. Integer leaves are uniform in `[0, classes)`.
    Synthetic {
        leaves: Vec<(DType, Vec<usize>)>,
        count: Option<usize>,
        classes: i64,
    },
    /// Parse serialized `tf.Example`s into the named features.
    Parse {
        features: Vec<(String, DType, Vec<usize>)>,
    },
    /// The closure compiled to a graph: its inputs are the element's tensors (named by
    /// their path, e.g. `0`, `r.image_raw`), its outputs the new element's.
    Map {
        graph: Box<Graph>,
        parallel: usize,
    },
    Filter {
        graph: Box<Graph>,
    },
    Shuffle {
        buffer: usize,
        seed: Option<i64>,
    },
    Repeat {
        count: Option<usize>,
    },
    Batch {
        size: usize,
        drop_remainder: bool,
        padded: bool,
        /// `padded_batch(length:)`: the length each variable-length leaf (one whose
        /// first axis is unknown, flagged by leaf) is cut or padded to.
        length: Option<(usize, Vec<bool>)>,
    },
    Cache {
        id: Option<String>,
        version: Option<String>,
    },
    Prefetch {
        n: usize,
    },
    Shard {
        n: usize,
        index: usize,
    },
    Interleave {
        cycle_length: usize,
    },
    Take {
        n: usize,
    },
    Skip {
        n: usize,
    },
    Zip {
        other: Box<Dataset>,
    },
}

impl StageKind {
    pub fn name(&self) -> &'static str {
        match self {
            StageKind::TfRecord { .. } => "tfrecord",
            StageKind::Csv {
                delimiter: b'\t', ..
            } => "tsv",
            StageKind::Csv { .. } => "csv",
            StageKind::Text { .. } => "text",
            StageKind::Png { .. } => "png",
            StageKind::Npy { .. } => "npy",
            StageKind::Range { .. } => "range",
            StageKind::Slices { .. } => "from_tensor_slices",
            StageKind::FixedLength { .. } => "fixed_length_record",
            StageKind::Synthetic { .. } => "synthetic",
            StageKind::Parse { .. } => "parse",
            StageKind::Map { .. } => "map",
            StageKind::Filter { .. } => "filter",
            StageKind::Shuffle { .. } => "shuffle",
            StageKind::Repeat { .. } => "repeat",
            StageKind::Batch { padded: false, .. } => "batch",
            StageKind::Batch { padded: true, .. } => "padded_batch",
            StageKind::Cache { .. } => "cache",
            StageKind::Prefetch { .. } => "prefetch",
            StageKind::Shard { .. } => "shard",
            StageKind::Interleave { .. } => "interleave",
            StageKind::Take { .. } => "take",
            StageKind::Skip { .. } => "skip",
            StageKind::Zip { .. } => "zip",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Stage {
    pub kind: StageKind,
    pub span: Span,
    /// The element this stage yields.
    pub elem: Elem,
}

/// A dataset: its stages in order. The facts below are derived from them.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub stages: Vec<Stage>,
}

impl Dataset {
    pub fn elem(&self) -> &Elem {
        &self.stages[self.stages.len() - 1].elem
    }

    pub fn span(&self) -> Span {
        let first = self.stages[0].span;
        first.to(self.stages[self.stages.len() - 1].span)
    }

    /// The last `batch` stage, if any.
    pub fn batch(&self) -> Option<&Stage> {
        self.stages
            .iter()
            .rev()
            .find(|s| matches!(s.kind, StageKind::Batch { .. }))
    }

    /// Whether the dataset repeats forever.
    /// Whether the stream never ends: an endless `repeat` (or `synthetic`) that no
    /// later `take` cuts short.
    pub fn repeats_forever(&self) -> bool {
        let endless = |s: &Stage| {
            matches!(
                s.kind,
                StageKind::Repeat { count: None } | StageKind::Synthetic { count: None, .. }
            )
        };
        match self.stages.iter().rposition(endless) {
            Some(i) => !self.stages[i..]
                .iter()
                .any(|s| matches!(s.kind, StageKind::Take { .. })),
            None => false,
        }
    }

    pub fn shuffles(&self) -> impl Iterator<Item = &Stage> {
        self.stages
            .iter()
            .filter(|s| matches!(s.kind, StageKind::Shuffle { .. }))
    }

    pub fn with(&self, stage: Stage) -> Dataset {
        let mut stages = self.stages.clone();
        stages.push(stage);
        Dataset { stages }
    }
}
