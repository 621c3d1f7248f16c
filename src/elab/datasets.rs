//! The `std.data` builtins: sources and transforms that build a `Dataset` value, and the
//! compilation of `map` and `filter` closures into small graphs of their own.

use super::builtins::Args;
use super::data::{CsvValue, Dataset, Elem, PngLabels, Stage, StageKind};
use super::expr::ArgVal;
use super::value::Value;
use super::Elab;
use crate::diag::{did_you_mean, Code, Diag};
use crate::ir::{DType, Graph, Op, Output, Role, TensorType};
use crate::program::ModId;
use crate::span::Span;
use crate::syntax::ast::ItemKind;
use std::rc::Rc;

/// A dimension the pipeline does not determine (the length of `decode_raw` without a
/// `length`), in the graphs of `map` closures. The model's signature resolves it.
pub use crate::ir::UNKNOWN_DIM;

impl<'p> Elab<'p> {
    /// Calls an `input` item: binds its arguments and evaluates its body.
    pub(super) fn call_input(
        &mut self,
        m: ModId,
        i: usize,
        args: Vec<ArgVal<'p>>,
        span: Span,
    ) -> Value<'p> {
        let p = self.p;
        let ItemKind::Input(f) = &p.item(m, i).kind else {
            return Value::Error;
        };
        let Some(slots) = self.bind_args(&f.params, &f.name.name, args, span) else {
            return Value::Error;
        };
        self.in_frame(m, Vec::new(), span, |el| {
            el.bind_params(&f.params, slots, span);
            match &f.body {
                Some(b) => el.block(b),
                None => Value::Error,
            }
        })
    }

    pub(super) fn data_builtin(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let call = self.site(a.call);
        let source = |kind: StageKind, elem: Elem| {
            Value::Dataset(Rc::new(Dataset {
                stages: vec![Stage {
                    kind,
                    span: call,
                    elem,
                }],
            }))
        };
        match name {
            "tfrecord" => {
                let (vs, ss) = a.get("skip_corrupt");
                let Value::Bool(skip_corrupt) = vs else {
                    return self.expected("bool", &vs, ss);
                };
                match self.paths(a, "paths") {
                    Some(paths) => source(
                        StageKind::TfRecord {
                            paths,
                            skip_corrupt,
                        },
                        Elem::scalar(DType::Bytes),
                    ),
                    None => Value::Error,
                }
            }
            "synthetic" => self.synthetic(a),
            "text" => match self.string(a, "path") {
                Some(path) => source(StageKind::Text { path }, Elem::scalar(DType::Bytes)),
                None => Value::Error,
            },
            "range" => match self.int_nonneg(a, "n") {
                Some(n) => source(StageKind::Range { n: n as i64 }, Elem::scalar(DType::I32)),
                None => Value::Error,
            },
            "fixed_length_record" => {
                let (Some(paths), Some(record_bytes)) =
                    (self.paths(a, "paths"), self.int_pos(a, "record_bytes"))
                else {
                    return Value::Error;
                };
                let (Some(header_bytes), Some(footer_bytes)) = (
                    self.int_nonneg(a, "header_bytes"),
                    self.int_nonneg(a, "footer_bytes"),
                ) else {
                    return Value::Error;
                };
                source(
                    StageKind::FixedLength {
                        paths,
                        record_bytes,
                        header_bytes,
                        footer_bytes,
                    },
                    Elem::scalar(DType::Bytes),
                )
            }
            "from_tensor_slices" => self.tensor_slices(a),
            "csv" | "tsv" => self.csv(name, a),
            "png" => self.png(a),
            "npy" => self.npy(a),
            _ => self.transform(name, a),
        }
    }

    /// `from_tensor_slices(values)`: the rows of static lists (numbers or strings,
    /// nested for more axes), or of a tuple or record of them with as many rows each.
    fn tensor_slices(&mut self, a: &Args<'p>) -> Value<'p> {
        let (v, sv) = a.get("values");
        let mut leaves: Vec<(Vec<usize>, StaticLeaf)> = Vec::new();
        let Some(shape_elem) = self.slices_elem(&v, sv, &mut leaves) else {
            return Value::Error;
        };
        let Some(n) = leaves.first().map(|l| l.0[0]) else {
            return self.error(
                Diag::new(
                    Code::InvalidShape,
                    self.site(sv),
                    "`from_tensor_slices` of no lists",
                )
                .label("no list here")
                .help("give a list, or a tuple or record of lists"),
            );
        };
        if let Some((shape, _)) = leaves.iter().find(|(s, _)| s[0] != n) {
            return self.error(
                Diag::new(
                    Code::InvalidShape,
                    self.site(sv),
                    format!("the parts have {n} and {} rows", shape[0]),
                )
                .label("parts of different lengths")
                .help("every part of `from_tensor_slices`'s value needs one row per element"),
            );
        }
        let mut rows = Vec::with_capacity(n);
        for i in 0..n {
            let mut row = Vec::with_capacity(leaves.len());
            for (shape, leaf) in &leaves {
                let per: usize = shape[1..].iter().product();
                row.push(leaf.row(i, per, &shape[1..]));
            }
            rows.push(row);
        }
        let call = self.site(a.call);
        Value::Dataset(Rc::new(Dataset {
            stages: vec![Stage {
                kind: StageKind::Slices { rows },
                span: call,
                elem: shape_elem,
            }],
        }))
    }

    /// The element type of `from_tensor_slices(v)`, its leaves gathered.
    fn slices_elem(
        &mut self,
        v: &Value<'p>,
        sv: Span,
        leaves: &mut Vec<(Vec<usize>, StaticLeaf)>,
    ) -> Option<Elem> {
        match v {
            Value::Tuple(xs) => Some(Elem::Tuple(
                xs.iter()
                    .map(|x| self.slices_elem(x, sv, leaves))
                    .collect::<Option<Vec<_>>>()?,
            )),
            Value::Record(fs) => Some(Elem::Record(
                fs.iter()
                    .map(|(k, x)| Some((k.clone(), self.slices_elem(x, sv, leaves)?)))
                    .collect::<Option<Vec<_>>>()?,
            )),
            Value::List(_) => {
                let mut shape = Vec::new();
                let mut flat = Vec::new();
                if let Err(why) = flatten_static(v, 0, &mut shape, &mut flat) {
                    self.error(
                        Diag::new(Code::InvalidShape, self.site(sv), why)
                            .label("in this value")
                            .help("give a list of numbers or strings, nested lists of equal lengths for more axes, or a tuple or record of such lists"),
                    );
                    return None;
                }
                let strings = flat.iter().filter(|v| matches!(v, Scalar::Str(_))).count();
                let bools = flat.iter().filter(|v| matches!(v, Scalar::Bool(_))).count();
                let wide = flat
                    .iter()
                    .any(|v| matches!(v, Scalar::Int(i) if i32::try_from(*i).is_err()));
                let why = if strings != 0 && strings != flat.len() {
                    Some("strings mixed with other values")
                } else if bools != 0 && bools != flat.len() {
                    Some("bools mixed with numbers")
                } else if wide {
                    Some("an integer beyond i32")
                } else {
                    None
                };
                if let Some(why) = why {
                    self.error(
                        Diag::new(Code::InvalidShape, self.site(sv), format!("`from_tensor_slices` of {why}"))
                            .label("in this list")
                            .help("a list's values make one tensor: all numbers (i32, or f32 with a float), all bools or all strings"),
                    );
                    return None;
                }
                let leaf = StaticLeaf::of(flat);
                let elem = Elem::Tensor {
                    dtype: leaf.dtype(),
                    dims: shape[1..].iter().map(|&d| Some(d)).collect(),
                };
                leaves.push((shape, leaf));
                Some(elem)
            }
            other => {
                self.expected("a list (or a tuple or record of lists)", other, sv);
                None
            }
        }
    }

    fn string(&mut self, a: &Args<'p>, name: &str) -> Option<String> {
        match a.get(name) {
            (Value::Str(s), _) => Some(s.to_string()),
            (v, s) => {
                self.expected("a string", &v, s);
                None
            }
        }
    }

    fn paths(&mut self, a: &Args<'p>, name: &str) -> Option<Vec<String>> {
        match a.get(name) {
            (Value::Str(s), _) => Some(vec![s.to_string()]),
            (Value::List(xs), s) => xs
                .iter()
                .map(|x| match x {
                    Value::Str(p) => Some(p.to_string()),
                    other => {
                        self.expected("a string", &other.clone(), s);
                        None
                    }
                })
                .collect(),
            (v, s) => {
                self.expected("a path or a list of paths", &v, s);
                None
            }
        }
    }

    fn int_nonneg(&mut self, a: &Args<'p>, name: &str) -> Option<usize> {
        let (v, s) = a.get(name);
        let i = self.as_int(&v, s)?;
        if i < 0 {
            self.diags.push(
                Diag::new(
                    Code::StaticEvalError,
                    self.site(s),
                    format!("`{name}` must not be negative"),
                )
                .label(format!("{i}"))
                .help("use 0 or more"),
            );
            return None;
        }
        Some(i as usize)
    }

    fn int_pos(&mut self, a: &Args<'p>, name: &str) -> Option<usize> {
        let (v, s) = a.get(name);
        let i = self.as_int(&v, s)?;
        if i <= 0 {
            self.diags.push(
                Diag::new(
                    Code::StaticEvalError,
                    self.site(s),
                    format!("`{name}` must be positive"),
                )
                .label(format!("{i}"))
                .help("use 1 or more"),
            );
            return None;
        }
        Some(i as usize)
    }

    /// A type for a column or feature: a dtype (a scalar) or a tensor type (`f32[64]`).
    fn feature_type(&mut self, v: &Value<'p>, s: Span) -> Option<(DType, Vec<usize>)> {
        let (d, dims) = match v {
            Value::DType(d) => (*d, Vec::new()),
            Value::Type(t) => (t.dtype, t.dims.iter().map(|d| d.unwrap_or(1)).collect()),
            other => {
                self.expected(
                    "a dtype or a tensor type such as `f32[64]`",
                    &other.clone(),
                    s,
                );
                return None;
            }
        };
        if d == DType::I64 {
            self.int64_type(s);
            return None;
        }
        Some((d, dims))
    }

    fn schema(&mut self, a: &Args<'p>, name: &str) -> Option<Vec<(String, DType, Vec<usize>)>> {
        let (v, s) = a.get(name);
        let Value::Record(fs) = v else {
            self.expected(
                "a record of types, such as `{ image: bytes, label: i32 }`",
                &v,
                s,
            );
            return None;
        };
        let mut out = Vec::new();
        for (k, t) in fs.iter() {
            let (d, dims) = self.feature_type(t, s)?;
            out.push((k.clone(), d, dims));
        }
        Some(out)
    }

    fn record_elem(schema: &[(String, DType, Vec<usize>)]) -> Elem {
        Elem::Record(
            schema
                .iter()
                .map(|(k, d, dims)| {
                    (
                        k.clone(),
                        Elem::Tensor {
                            dtype: *d,
                            dims: dims.iter().map(|&x| Some(x)).collect(),
                        },
                    )
                })
                .collect(),
        )
    }

    fn csv(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let (Some(path), Some(schema)) = (self.string(a, "path"), self.schema(a, "columns")) else {
            return Value::Error;
        };
        let (vh, sh) = a.get("header");
        let Value::Bool(header) = vh else {
            return self.expected("bool", &vh, sh);
        };
        let mut columns = Vec::new();
        for (k, d, dims) in &schema {
            if dims.len() > 1 || *d == DType::Bytes && !dims.is_empty() {
                return self.error(
                    Diag::new(
                        Code::InvalidShape,
                        self.site(a.get("columns").1),
                        format!("column `{k}` must be a scalar or a vector"),
                    )
                    .label("a CSV column group is one value or a run of values")
                    .help("write `f32` for one value or `f32[n]` for n consecutive values"),
                );
            }
            columns.push((k.clone(), *d, dims.first().copied().unwrap_or(1)));
        }
        let elem = Self::record_elem(&schema);
        let delimiter = if name == "tsv" { b'\t' } else { b',' };
        let Some(defaults) = self.csv_defaults(a, &columns) else {
            return Value::Error;
        };
        let (vm, sm) = a.get("na_values");
        let missing = match &vm {
            Value::List(xs) => {
                let mut out = Vec::new();
                for x in xs.iter() {
                    match x {
                        Value::Str(s) => out.push(s.trim().to_string()),
                        other => return self.expected("a list of strings", other, sm),
                    }
                }
                out
            }
            other => return self.expected("a list of strings", other, sm),
        };
        let (vs, ss) = a.get("skip_invalid");
        let Value::Bool(skip_invalid) = vs else {
            return self.expected("bool", &vs, ss);
        };
        let call = self.site(a.call);
        Value::Dataset(Rc::new(Dataset {
            stages: vec![Stage {
                kind: StageKind::Csv {
                    path,
                    header,
                    columns,
                    delimiter,
                    defaults,
                    missing,
                    skip_invalid,
                },
                span: call,
                elem,
            }],
        }))
    }

    /// `defaults`: `none`, or a record giving some columns the value of a missing field
    /// (a number for a number column, a string for a string one).
    fn csv_defaults(
        &mut self,
        a: &Args<'p>,
        columns: &[(String, DType, usize)],
    ) -> Option<Vec<Option<CsvValue>>> {
        let (v, sp) = a.get("defaults");
        let fields = match &v {
            Value::None => return Some(vec![None; columns.len()]),
            Value::Record(fs) => fs.clone(),
            other => {
                self.expected(
                    "a record of column defaults, e.g. `{ age: 0, workclass: \"?\" }`",
                    other,
                    sp,
                );
                return None;
            }
        };
        let mut out = vec![None; columns.len()];
        for (k, v) in fields.iter() {
            let Some(i) = columns.iter().position(|c| &c.0 == k) else {
                let names: Vec<&str> = columns.iter().map(|c| c.0.as_str()).collect();
                let mut d = Diag::new(
                    Code::UnknownField,
                    self.site(sp),
                    format!("`defaults` names `{k}`, which is not a column"),
                )
                .label("no such column");
                d = match did_you_mean(k, names.iter().copied()) {
                    Some(s) => d.help(format!(
                        "did you mean `{s}`? the columns are {}",
                        names.join(", ")
                    )),
                    None => d.help(format!("the columns are {}", names.join(", "))),
                };
                self.error(d);
                return None;
            };
            let bytes = columns[i].1 == DType::Bytes;
            out[i] = Some(match v {
                Value::Str(s) if bytes => CsvValue::Text(s.to_string()),
                Value::Int(n) if !bytes => CsvValue::Number(*n as f64),
                Value::Float(x) if !bytes && columns[i].1.is_float() => CsvValue::Number(*x),
                other => {
                    let want = if bytes {
                        "a string (the column is a string)".to_string()
                    } else {
                        format!("a number of the column's type, {}", columns[i].1)
                    };
                    self.expected(&want, other, sp);
                    return None;
                }
            });
        }
        Some(out)
    }

    fn png(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some(pattern) = self.string(a, "pattern") else {
            return Value::Error;
        };
        let (Some(height), Some(width), Some(channels)) = (
            self.int_pos(a, "height"),
            self.int_pos(a, "width"),
            self.int_pos(a, "channels"),
        ) else {
            return Value::Error;
        };
        if ![1, 2, 3, 4].contains(&channels) {
            return self.error(
                Diag::new(
                    Code::StaticEvalError,
                    self.site(a.get("channels").1),
                    format!("{channels} channels"),
                )
                .label("not 1, 2, 3 or 4")
                .help("PNG images have 1 (gray), 2 (gray+alpha), 3 (RGB) or 4 (RGBA) channels"),
            );
        }
        let Some(dtype) = self.dtype_arg(a, "dtype") else {
            return Value::Error;
        };
        let labels = match a.get("labels") {
            (Value::Str(s), _) if &*s == "folder" => PngLabels::Folder,
            (Value::Str(s), _) => PngLabels::Csv(s.to_string()),
            (v, s) => return self.expected("\"folder\" or the path of a CSV", &v, s),
        };
        let elem = Elem::Tuple(vec![
            Elem::Tensor {
                dtype,
                dims: vec![Some(height), Some(width), Some(channels)],
            },
            Elem::scalar(DType::I32),
        ]);
        let call = self.site(a.call);
        Value::Dataset(Rc::new(Dataset {
            stages: vec![Stage {
                kind: StageKind::Png {
                    pattern,
                    channels,
                    height,
                    width,
                    dtype,
                    labels,
                },
                span: call,
                elem,
            }],
        }))
    }

    /// `synthetic(features, labels, count, classes)`: random elements of the given types.
    fn synthetic(&mut self, a: &Args<'p>) -> Value<'p> {
        let mut leaves = Vec::new();
        let mut parts = Vec::new();
        for name in ["features", "labels"] {
            let (v, s) = a.get(name);
            if name == "labels" && matches!(v, Value::None) {
                continue;
            }
            let elem = match &v {
                Value::Record(_) => {
                    let Some(schema) = self.schema(a, name) else {
                        return Value::Error;
                    };
                    leaves.extend(schema.iter().map(|(_, d, dims)| (*d, dims.clone())));
                    Self::record_elem(&schema)
                }
                _ => {
                    let Some((d, dims)) = self.feature_type(&v, s) else {
                        return Value::Error;
                    };
                    leaves.push((d, dims.clone()));
                    Elem::Tensor {
                        dtype: d,
                        dims: dims.iter().map(|&x| Some(x)).collect(),
                    }
                }
            };
            parts.push(elem);
        }
        let count = match a.get("count") {
            (Value::None, _) => None,
            _ => match self.int_nonneg(a, "count") {
                Some(c) => Some(c),
                None => return Value::Error,
            },
        };
        let Some(classes) = self.int_pos(a, "classes") else {
            return Value::Error;
        };
        let elem = if parts.len() == 1 {
            parts.pop().expect("features")
        } else {
            Elem::Tuple(parts)
        };
        Value::Dataset(Rc::new(Dataset {
            stages: vec![Stage {
                kind: StageKind::Synthetic {
                    leaves,
                    count,
                    classes: classes as i64,
                },
                span: self.site(a.call),
                elem,
            }],
        }))
    }

    fn npy(&mut self, a: &Args<'p>) -> Value<'p> {
        let Some(path) = self.string(a, "path") else {
            return Value::Error;
        };
        let (v, s) = a.get("element");
        let Some((dtype, dims)) = self.feature_type(&v, s) else {
            return Value::Error;
        };
        let elem = Elem::Tensor {
            dtype,
            dims: dims.iter().map(|&d| Some(d)).collect(),
        };
        let call = self.site(a.call);
        Value::Dataset(Rc::new(Dataset {
            stages: vec![Stage {
                kind: StageKind::Npy { path, dtype, dims },
                span: call,
                elem,
            }],
        }))
    }

    fn transform(&mut self, name: &str, a: &Args<'p>) -> Value<'p> {
        let (vd, sd) = a.get("ds");
        let Value::Dataset(ds) = vd else {
            return self.error(
                Diag::new(
                    Code::TypeMismatch,
                    self.site(sd),
                    format!("`{name}` needs a dataset, found {}", vd.kind()),
                )
                .label(vd.kind())
                .help(format!(
                    "apply it to a dataset: `source(...) |> {name}(...)`"
                )),
            );
        };
        let before = ds.elem().clone();
        let (kind, elem) = match name {
            "parse" => {
                if before != Elem::scalar(DType::Bytes) {
                    return self.error(
                        Diag::new(Code::TypeMismatch, self.site(a.call), format!("`parse` reads serialized records, but the elements are {before}"))
                            .label("not bytes")
                            .help("apply `parse` to a `tfrecord(...)` source"),
                    );
                }
                let Some(features) = self.schema(a, "features") else { return Value::Error };
                let elem = Self::record_elem(&features);
                (StageKind::Parse { features }, elem)
            }
            "map" | "filter" => {
                let (vf, sf) = a.get("f");
                let Some((graph, out)) = self.compile_closure(&vf, sf, &before, a.call) else { return Value::Error };
                if name == "filter" {
                    if out != Elem::scalar(DType::Bool) {
                        return self.error(
                            Diag::new(Code::TypeMismatch, self.site(sf), format!("a `filter` closure must return a bool scalar, this returns {out}"))
                                .label("the predicate")
                                .help("compare something, e.g. `|r| r.label < 5`"),
                        );
                    }
                    (StageKind::Filter { graph: Box::new(graph) }, before)
                } else {
                    let Some(parallel) = self.int_nonneg(a, "parallel") else { return Value::Error };
                    (StageKind::Map { graph: Box::new(graph), parallel }, out)
                }
            }
            "shuffle" => {
                let Some(buffer) = self.int_pos(a, "buffer") else { return Value::Error };
                let seed = match a.get("seed") {
                    (Value::None, _) => None,
                    (v, s) => match self.as_int(&v, s) {
                        Some(x) => Some(x),
                        None => return Value::Error,
                    },
                };
                (StageKind::Shuffle { buffer, seed }, before)
            }
            "repeat" => {
                let count = match a.get("count") {
                    (Value::None, _) => None,
                    _ => match self.int_pos(a, "count") {
                        Some(c) => Some(c),
                        None => return Value::Error,
                    },
                };
                (StageKind::Repeat { count }, before)
            }
            "batch" | "padded_batch" => {
                // The batch becomes the leading dimension: the limits of a dimension apply.
                let (vs, ss) = a.get("size");
                let Some(size) = self.as_dim(&vs, ss) else { return Value::Error };
                let (vr, sr) = a.get("drop_remainder");
                let Value::Bool(drop_remainder) = vr else { return self.expected("bool", &vr, sr) };
                let padded = name == "padded_batch";
                let length = match a.get("length") {
                    (Value::None, _) => None,
                    _ if !padded => None,
                    (v, s) => match self.as_dim(&v, s) {
                        Some(l) => Some(l),
                        None => return Value::Error,
                    },
                };
                let (length, elem) = match length {
                    Some(l) => {
                        let fit = before.variable_leaves();
                        if !fit.contains(&true) {
                            let (_, s) = a.get("length");
                            return self.error(
                                Diag::new(Code::InvalidShape, self.site(s), format!("`length` cuts or pads variable-length sequences, and the elements ({before}) have none"))
                                    .label("nothing to cut or pad")
                                    .help("a leaf whose first axis is unknown (`?`, as `decode_raw` without a length makes) is a sequence; leave `length` out, or use `batch`"),
                            );
                        }
                        (Some((l, fit)), before.fixed(l).batched(Some(size)))
                    }
                    None => (None, before.batched(Some(size))),
                };
                (StageKind::Batch { size, drop_remainder, padded, length }, elem)
            }
            "cache" => {
                let id = match a.get("id") {
                    (Value::None, _) => None,
                    _ => match self.string(a, "id") {
                        Some(s) => Some(s),
                        None => return Value::Error,
                    },
                };
                let version = match a.get("version") {
                    (Value::None, _) => None,
                    _ => match self.string(a, "version") {
                        Some(s) => Some(s),
                        None => return Value::Error,
                    },
                };
                (StageKind::Cache { id, version }, before)
            }
            "prefetch" => match self.int_pos(a, "n") {
                Some(n) => (StageKind::Prefetch { n }, before),
                None => return Value::Error,
            },
            "shard" => {
                let (Some(n), Some(index)) = (self.int_pos(a, "n"), self.int_nonneg(a, "index")) else { return Value::Error };
                if index >= n {
                    return self.error(Diag::new(Code::StaticEvalError, self.site(a.get("index").1), format!("shard index {index} is not below the shard count {n}")).label("out of range").help(format!("use an index from 0 to {}", n - 1)));
                }
                (StageKind::Shard { n, index }, before)
            }
            "interleave" => match self.int_pos(a, "cycle_length") {
                Some(cycle_length) => (StageKind::Interleave { cycle_length }, before),
                None => return Value::Error,
            },
            "take" | "skip" => match self.int_nonneg(a, "n") {
                Some(n) if name == "take" => (StageKind::Take { n }, before),
                Some(n) => (StageKind::Skip { n }, before),
                None => return Value::Error,
            },
            "zip" => {
                let (vo, so) = a.get("other");
                let Value::Dataset(other) = vo else { return self.expected("a dataset", &vo, so) };
                let elem = Elem::Tuple(vec![before, other.elem().clone()]);
                (StageKind::Zip { other: Box::new((*other).clone()) }, elem)
            }
            _ => {
                return self.error(
                    Diag::new(Code::UnknownName, self.site(a.call), format!("`{name}` has no implementation"))
                        .label("extern function without a builtin")
                        .help("only the standard library may declare `extern fn`s, and only those the compiler implements"),
                )
            }
        };
        let stage = Stage {
            kind,
            span: self.site(a.call),
            elem,
        };
        Value::Dataset(Rc::new(ds.with(stage)))
    }

    /// Compiles a `map` or `filter` closure over one element into its own graph. The
    /// element's tensors are the graph's inputs; the result's are its outputs.
    fn compile_closure(
        &mut self,
        f: &Value<'p>,
        fs: Span,
        elem: &Elem,
        call: Span,
    ) -> Option<(Graph, Elem)> {
        if !matches!(f, Value::Closure(_) | Value::Func(..)) {
            self.expected("a closure such as `|r| r.x`", f, fs);
            return None;
        }
        let outer = std::mem::take(&mut self.graph);
        let outer_step = self.global_step_node.take();
        let arg = self.elem_value(elem, "", fs);
        let result = self.call(
            f.clone(),
            fs,
            vec![ArgVal {
                name: None,
                value: arg,
                span: fs,
            }],
            call,
        );
        let out = self.value_elem(&result, "", fs);
        let graph = std::mem::replace(&mut self.graph, outer);
        self.global_step_node = outer_step;
        out.map(|e| (graph, e))
    }

    fn elem_value(&mut self, e: &Elem, path: &str, span: Span) -> Value<'p> {
        match e {
            Elem::Tensor { dtype, dims } => {
                let shape: Vec<usize> = dims.iter().map(|d| d.unwrap_or(UNKNOWN_DIM)).collect();
                let name = if path.is_empty() {
                    "element".to_string()
                } else {
                    path.to_string()
                };
                let site = self.site(span);
                Value::Tensor(self.graph.add(
                    Op::Input { name },
                    &[],
                    TensorType::new(*dtype, shape),
                    site,
                ))
            }
            Elem::Tuple(xs) => Value::Tuple(Rc::new(
                xs.iter()
                    .enumerate()
                    .map(|(i, x)| self.elem_value(x, &join(path, &i.to_string()), span))
                    .collect(),
            )),
            Elem::Record(fs) => Value::Record(Rc::new(
                fs.iter()
                    .map(|(k, x)| (k.clone(), self.elem_value(x, &join(path, k), span)))
                    .collect(),
            )),
        }
    }

    fn value_elem(&mut self, v: &Value<'p>, path: &str, span: Span) -> Option<Elem> {
        match v {
            Value::Tensor(n) => {
                let ty = self.graph.ty(*n).clone();
                let name = if path.is_empty() {
                    "element".to_string()
                } else {
                    path.to_string()
                };
                self.graph.outputs.push(Output {
                    name,
                    role: Role::Element,
                    node: *n,
                });
                Some(Elem::Tensor {
                    dtype: ty.dtype,
                    dims: ty
                        .shape
                        .iter()
                        .map(|&d| (d != UNKNOWN_DIM).then_some(d))
                        .collect(),
                })
            }
            Value::Int(_) | Value::Float(_) | Value::Bool(_) => {
                let n = self.operand(v, span, None)?;
                self.value_elem(&Value::Tensor(n), path, span)
            }
            Value::Tuple(xs) => xs
                .iter()
                .enumerate()
                .map(|(i, x)| self.value_elem(x, &join(path, &i.to_string()), span))
                .collect::<Option<Vec<_>>>()
                .map(Elem::Tuple),
            Value::Record(fs) => fs
                .iter()
                .map(|(k, x)| Some((k.clone(), self.value_elem(x, &join(path, k), span)?)))
                .collect::<Option<Vec<_>>>()
                .map(Elem::Record),
            Value::Error => None,
            other => {
                self.expected("tensors (in a tuple or record)", &other.clone(), span);
                None
            }
        }
    }
}

fn join(path: &str, k: &str) -> String {
    if path.is_empty() {
        k.to_string()
    } else {
        format!("{path}.{k}")
    }
}

/// A static scalar of `from_tensor_slices`.
#[derive(Clone)]
enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

/// `v`'s scalars in row-major order and its shape (`depth` axes in), or why it is not
/// a rectangular list of scalars.
fn flatten_static(
    v: &Value<'_>,
    depth: usize,
    shape: &mut Vec<usize>,
    out: &mut Vec<Scalar>,
) -> Result<(), String> {
    match v {
        Value::List(xs) => {
            if xs.is_empty() {
                return Err("an empty list has no rows".into());
            }
            match shape.get(depth) {
                Some(&n) if n != xs.len() => {
                    return Err(format!(
                        "lists of {n} and {} elements at the same depth",
                        xs.len()
                    ))
                }
                None => shape.push(xs.len()),
                _ => {}
            }
            for x in xs.iter() {
                flatten_static(x, depth + 1, shape, out)?;
            }
            Ok(())
        }
        _ if depth < shape.len() => {
            Err("a number where a list was expected (lists of unequal depth)".into())
        }
        Value::Int(i) => {
            out.push(Scalar::Int(*i));
            Ok(())
        }
        Value::Float(f) => {
            out.push(Scalar::Float(*f));
            Ok(())
        }
        Value::Bool(b) => {
            out.push(Scalar::Bool(*b));
            Ok(())
        }
        Value::Str(s) => {
            out.push(Scalar::Str(s.to_string()));
            Ok(())
        }
        other => Err(format!("{} in a list of values", other.kind())),
    }
}

/// The scalars of one part of `from_tensor_slices`, as one dtype: i32 for integers,
/// f32 when any is a float, bool, or bytes for strings.
struct StaticLeaf {
    dtype: DType,
    values: Vec<Scalar>,
}

impl StaticLeaf {
    fn of(values: Vec<Scalar>) -> StaticLeaf {
        let dtype = if values.iter().any(|v| matches!(v, Scalar::Str(_))) {
            DType::Bytes
        } else if values.iter().any(|v| matches!(v, Scalar::Float(_))) {
            DType::F32
        } else if values.iter().all(|v| matches!(v, Scalar::Bool(_))) {
            DType::Bool
        } else {
            DType::I32
        };
        StaticLeaf { dtype, values }
    }

    fn dtype(&self) -> DType {
        self.dtype
    }

    /// Row `i` (of `per` scalars) as a tensor of `shape`.
    fn row(&self, i: usize, per: usize, shape: &[usize]) -> crate::tensor::Tensor {
        let part = &self.values[i * per..(i + 1) * per];
        let ty = TensorType::new(self.dtype, shape.to_vec());
        if self.dtype == DType::Bytes {
            let strings: Vec<Vec<u8>> = part
                .iter()
                .map(|v| match v {
                    Scalar::Str(s) => s.as_bytes().to_vec(),
                    _ => Vec::new(),
                })
                .collect();
            return crate::tensor::Tensor {
                dtype: DType::Bytes,
                data: crate::tensor::Data::S(
                    crate::tensor::Arr::from_shape_vec(ndarray::IxDyn(shape), strings)
                        .expect("the row's shape"),
                ),
            };
        }
        let nums: Vec<f64> = part
            .iter()
            .map(|v| match v {
                Scalar::Int(i) => *i as f64,
                Scalar::Float(f) => *f,
                Scalar::Bool(b) => f64::from(u8::from(*b)),
                Scalar::Str(_) => 0.0,
            })
            .collect();
        crate::tensor::Tensor::from_f64(&ty, nums)
    }
}
