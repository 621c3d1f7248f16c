//! Element types and static shapes of IR values.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    U8,
    Bool,
    /// Only the global step may have this type (checked by the `dtypes` pass).
    I64,
    /// A byte string: serialized records and text lines in input pipelines.
    Bytes,
}

impl DType {
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U8,
        DType::Bool,
        DType::I64,
        DType::Bytes,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::Bool => "bool",
            DType::I64 => "i64",
            DType::Bytes => "bytes",
        }
    }

    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::U8 | DType::I64)
    }

    pub fn is_numeric(self) -> bool {
        self.is_float() || self.is_int()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A concrete shape: every dimension is known. Stored inline up to rank 4, so that a
/// node's type needs no allocation of its own (graphs reach millions of nodes).
pub type Shape = smallvec::SmallVec<[usize; 4]>;

/// A dimension a pipeline's `map` closure learns from each record (`decode_png` without
/// `size`): printed `?`.
pub const UNKNOWN_DIM: usize = 1 << 31;

/// The type of an IR value: a dtype and a concrete shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> TensorType {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    pub fn scalar(dtype: DType) -> TensorType {
        TensorType {
            dtype,
            shape: Shape::new(),
        }
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements (saturating: pipeline graphs may hold unknown sizes).
    pub fn elements(&self) -> usize {
        self.shape.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// Whether a dimension is one each record gives (`UNKNOWN_DIM`).
    pub fn has_unknown(&self) -> bool {
        self.shape.contains(&UNKNOWN_DIM)
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            if *d == UNKNOWN_DIM {
                f.write_str("?")?;
            } else {
                write!(f, "{d}")?;
            }
        }
        f.write_str("]")
    }
}

/// Numpy broadcasting of two shapes, aligned from the right. `None` if they do not fit.
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Shape> {
    let n = a.len().max(b.len());
    let mut out: Shape = smallvec::smallvec![0; n];
    for i in 0..n {
        let da = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let db = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}
