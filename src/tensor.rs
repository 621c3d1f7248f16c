//! Run-time tensor values. Floats (f32, f16, bf16) are held as f32, rounded to their
//! dtype's precision after every op; integers (i32, u8, i64) as i64, wrapped to their
//! width; booleans as bool; byte strings as `Vec<u8>`. Arrays are shared (`ArcArray`),
//! so cloning a tensor, transposing it or slicing it copies no data.

use crate::ir::{DType, Shape, TensorType};
use ndarray::{ArcArray, IxDyn};

pub type Arr<T> = ArcArray<T, IxDyn>;

#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    F(Arr<f32>),
    I(Arr<i64>),
    B(Arr<bool>),
    S(Arr<Vec<u8>>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub dtype: DType,
    pub data: Data,
}

/// Rounds an f32 to the precision of `dtype`.
pub fn round_float(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::F16 => half::f16::from_f32(x).to_f32(),
        DType::BF16 => half::bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// Wraps an integer to the width of `dtype`.
pub fn wrap_int(dtype: DType, x: i64) -> i64 {
    match dtype {
        DType::I32 => x as i32 as i64,
        DType::U8 => x as u8 as i64,
        _ => x,
    }
}

impl Tensor {
    /// A tensor of `dtype` from float data, rounded to the dtype's precision.
    pub fn float(dtype: DType, mut a: Arr<f32>) -> Tensor {
        if matches!(dtype, DType::F16 | DType::BF16) {
            a.mapv_inplace(|x| round_float(dtype, x));
        }
        Tensor {
            dtype,
            data: Data::F(a),
        }
    }

    pub fn f32(a: Arr<f32>) -> Tensor {
        Tensor {
            dtype: DType::F32,
            data: Data::F(a),
        }
    }

    /// A tensor of `dtype` from integer data, wrapped to the dtype's width.
    pub fn int(dtype: DType, mut a: Arr<i64>) -> Tensor {
        if matches!(dtype, DType::I32 | DType::U8) {
            a.mapv_inplace(|x| wrap_int(dtype, x));
        }
        Tensor {
            dtype,
            data: Data::I(a),
        }
    }

    pub fn bool(a: Arr<bool>) -> Tensor {
        Tensor {
            dtype: DType::Bool,
            data: Data::B(a),
        }
    }

    /// A tensor of `ty` from values given as f64 (converted to the dtype).
    pub fn from_f64(ty: &TensorType, v: Vec<f64>) -> Tensor {
        let shape = IxDyn(&ty.shape);
        match ty.dtype {
            d if d.is_float() => Tensor::float(
                d,
                Arr::from_shape_vec(shape, v.into_iter().map(|x| x as f32).collect())
                    .expect("shape"),
            ),
            DType::Bool => Tensor::bool(
                Arr::from_shape_vec(shape, v.into_iter().map(|x| x != 0.0).collect())
                    .expect("shape"),
            ),
            DType::Bytes => Tensor {
                dtype: DType::Bytes,
                data: Data::S(Arr::from_elem(shape, Vec::new())),
            },
            d => Tensor::int(
                d,
                Arr::from_shape_vec(shape, v.into_iter().map(|x| x as i64).collect())
                    .expect("shape"),
            ),
        }
    }

    /// `value` splatted over `ty`.
    pub fn splat(ty: &TensorType, value: f64) -> Tensor {
        let shape = IxDyn(&ty.shape);
        match ty.dtype {
            d if d.is_float() => Tensor::float(d, Arr::from_elem(shape, value as f32)),
            DType::Bool => Tensor::bool(Arr::from_elem(shape, value != 0.0)),
            DType::Bytes => Tensor {
                dtype: DType::Bytes,
                data: Data::S(Arr::from_elem(shape, Vec::new())),
            },
            d => Tensor::int(d, Arr::from_elem(shape, value as i64)),
        }
    }

    pub fn zeros(ty: &TensorType) -> Tensor {
        Tensor::splat(ty, 0.0)
    }

    pub fn shape(&self) -> &[usize] {
        match &self.data {
            Data::F(a) => a.shape(),
            Data::I(a) => a.shape(),
            Data::B(a) => a.shape(),
            Data::S(a) => a.shape(),
        }
    }

    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, Shape::from_slice(self.shape()))
    }

    pub fn len(&self) -> usize {
        self.shape().iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The float data (the interpreter only asks for it on float tensors: graphs are
    /// type-checked).
    pub fn f(&self) -> &Arr<f32> {
        match &self.data {
            Data::F(a) => a,
            _ => panic!("interp: {} tensor read as float", self.dtype),
        }
    }

    pub fn i(&self) -> &Arr<i64> {
        match &self.data {
            Data::I(a) => a,
            _ => panic!("interp: {} tensor read as integer", self.dtype),
        }
    }

    pub fn b(&self) -> &Arr<bool> {
        match &self.data {
            Data::B(a) => a,
            _ => panic!("interp: {} tensor read as bool", self.dtype),
        }
    }

    pub fn s(&self) -> &Arr<Vec<u8>> {
        match &self.data {
            Data::S(a) => a,
            _ => panic!("interp: {} tensor read as bytes", self.dtype),
        }
    }

    /// Every element as f64, in row-major order (bytes count as their length).
    pub fn to_f64(&self) -> Vec<f64> {
        match &self.data {
            Data::F(a) => a.iter().map(|&x| x as f64).collect(),
            Data::I(a) => a.iter().map(|&x| x as f64).collect(),
            Data::B(a) => a.iter().map(|&x| f64::from(u8::from(x))).collect(),
            Data::S(a) => a.iter().map(|x| x.len() as f64).collect(),
        }
    }

    /// The first element as f64 (the value of a scalar).
    pub fn scalar(&self) -> f64 {
        self.to_f64().first().copied().unwrap_or(0.0)
    }

    /// The little-endian bytes of the elements in row-major order, as safetensors
    /// stores them.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len() * 4);
        match (&self.data, self.dtype) {
            (Data::F(a), DType::F16) => {
                for &x in a.iter() {
                    out.extend(half::f16::from_f32(x).to_le_bytes());
                }
            }
            (Data::F(a), DType::BF16) => {
                for &x in a.iter() {
                    out.extend(half::bf16::from_f32(x).to_le_bytes());
                }
            }
            (Data::F(a), _) => {
                for &x in a.iter() {
                    out.extend(x.to_le_bytes());
                }
            }
            (Data::I(a), DType::I32) => {
                for &x in a.iter() {
                    out.extend((x as i32).to_le_bytes());
                }
            }
            (Data::I(a), DType::U8) => out.extend(a.iter().map(|&x| x as u8)),
            (Data::I(a), _) => {
                for &x in a.iter() {
                    out.extend(x.to_le_bytes());
                }
            }
            (Data::B(a), _) => out.extend(a.iter().map(|&x| u8::from(x))),
            (Data::S(a), _) => {
                for x in a.iter() {
                    out.extend(x);
                }
            }
        }
        out
    }

    /// The inverse of `to_le_bytes`; `None` if the byte count does not fit `ty`.
    pub fn from_le_bytes(ty: &TensorType, b: &[u8]) -> Option<Tensor> {
        let n = ty.elements();
        let size = dtype_size(ty.dtype)?;
        if b.len() != n * size {
            return None;
        }
        let shape = IxDyn(&ty.shape);
        let t = match ty.dtype {
            DType::F32 => Tensor::f32(
                Arr::from_shape_vec(
                    shape,
                    b.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                        .collect(),
                )
                .ok()?,
            ),
            DType::F16 | DType::BF16 => {
                let v = b
                    .chunks_exact(2)
                    .map(|c| {
                        let bits = [c[0], c[1]];
                        if ty.dtype == DType::F16 {
                            half::f16::from_le_bytes(bits).to_f32()
                        } else {
                            half::bf16::from_le_bytes(bits).to_f32()
                        }
                    })
                    .collect();
                Tensor::float(ty.dtype, Arr::from_shape_vec(shape, v).ok()?)
            }
            DType::I32 => Tensor::int(
                DType::I32,
                Arr::from_shape_vec(
                    shape,
                    b.chunks_exact(4)
                        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
                        .collect(),
                )
                .ok()?,
            ),
            DType::U8 => Tensor::int(
                DType::U8,
                Arr::from_shape_vec(shape, b.iter().map(|&x| x as i64).collect()).ok()?,
            ),
            DType::I64 => Tensor::int(
                DType::I64,
                Arr::from_shape_vec(
                    shape,
                    b.chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                        .collect(),
                )
                .ok()?,
            ),
            DType::Bool => {
                Tensor::bool(Arr::from_shape_vec(shape, b.iter().map(|&x| x != 0).collect()).ok()?)
            }
            DType::Bytes => return None,
        };
        Some(t)
    }

    /// The tensor as JSON: nested arrays of numbers (strings for bytes).
    pub fn to_json(&self) -> serde_json::Value {
        fn nest(shape: &[usize], flat: &[serde_json::Value]) -> serde_json::Value {
            match shape.split_first() {
                None => flat.first().cloned().unwrap_or(serde_json::Value::Null),
                Some((&n, rest)) => {
                    let step = rest.iter().product::<usize>();
                    serde_json::Value::Array(
                        (0..n)
                            .map(|i| nest(rest, &flat[i * step..(i + 1) * step]))
                            .collect(),
                    )
                }
            }
        }
        let flat: Vec<serde_json::Value> = match &self.data {
            Data::F(a) => a
                .iter()
                .map(|&x| {
                    serde_json::Number::from_f64(x as f64)
                        .map_or(serde_json::Value::Null, serde_json::Value::Number)
                })
                .collect(),
            Data::I(a) => a.iter().map(|&x| serde_json::json!(x)).collect(),
            Data::B(a) => a.iter().map(|&x| serde_json::json!(x)).collect(),
            Data::S(a) => a
                .iter()
                .map(|x| serde_json::json!(String::from_utf8_lossy(x)))
                .collect(),
        };
        nest(self.shape(), &flat)
    }
}

/// Bytes per element in checkpoints and `.npy` files.
pub fn dtype_size(d: DType) -> Option<usize> {
    Some(match d {
        DType::F32 | DType::I32 => 4,
        DType::F16 | DType::BF16 => 2,
        DType::U8 | DType::Bool => 1,
        DType::I64 => 8,
        DType::Bytes => return None,
    })
}

/// The first non-finite element of a float tensor: (flat index, value). Runs every
/// step over every gradient and variable, so the common case (all finite) is one
/// vectorised pass: `x * 0` is 0 for a finite `x` and NaN otherwise.
pub fn first_non_finite(t: &Tensor) -> Option<(usize, f32)> {
    let Data::F(a) = &t.data else {
        return None;
    };
    if a.as_slice_memory_order().is_some_and(all_finite) {
        return None;
    }
    first_where(t, |v| !v.is_finite())
}

/// Whether every element is finite, in one vectorised pass: `x * 0` is 0 for a finite
/// `x` and NaN otherwise, summed in 8 independent lanes.
pub fn all_finite(s: &[f32]) -> bool {
    let mut acc = [0f32; 8];
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        for (x, v) in acc.iter_mut().zip(c) {
            *x += v * 0.0;
        }
    }
    let tail: f32 = chunks.remainder().iter().map(|v| v * 0.0).sum();
    acc.iter().sum::<f32>() + tail == 0.0
}

/// The first NaN of a float tensor: (flat index, value).
pub fn first_nan(t: &Tensor) -> Option<(usize, f32)> {
    first_where(t, f32::is_nan)
}

/// The first element of a float tensor for which `bad` holds: (flat index, value).
fn first_where(t: &Tensor, bad: impl Fn(f32) -> bool) -> Option<(usize, f32)> {
    match &t.data {
        Data::F(a) => a
            .iter()
            .enumerate()
            .find(|(_, &v)| bad(v))
            .map(|(i, &v)| (i, v)),
        _ => None,
    }
}

/// The records of byte-string tensor `a` decoded as little-endian values of `ty`'s
/// dtype: one row of `ty`'s last axis per record.
pub fn decode_raw(a: &Tensor, ty: &TensorType) -> Result<Tensor, String> {
    let mut n = *ty.shape.last().unwrap_or(&1);
    let size = dtype_size(ty.dtype).ok_or("decode_raw to bytes")?;
    // a length left open (`decode_raw` without `length`, in a pipeline): the record's
    // own, when it holds whole values
    let mut ty = ty.clone();
    if n == crate::elab::UNKNOWN_DIM {
        let first = a.s().iter().next().map_or(0, |s| s.len());
        if !first.is_multiple_of(size) {
            return Err(format!(
                "decode_raw: a record of {first} bytes is no whole number of {} values",
                ty.dtype
            ));
        }
        n = first / size;
        if let Some(last) = ty.shape.last_mut() {
            *last = n;
        }
    }
    let ty = &ty;
    let mut flat = Vec::new();
    for (i, s) in a.s().iter().enumerate() {
        if s.len() != n * size {
            return Err(format!(
                "decode_raw: record {i} has {} bytes, but {n} values of {} need {}",
                s.len(),
                ty.dtype,
                n * size
            ));
        }
        flat.extend_from_slice(s);
    }
    Tensor::from_le_bytes(ty, &flat).ok_or_else(|| "decode_raw: wrong byte count".into())
}
