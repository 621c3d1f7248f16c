//! Metrics as reducers: each accumulates per batch, the shards' reducers are merged, and
//! the result is computed once at the end, so metrics such as AUC are exact under
//! sharded evaluation. Custom metrics implement `Reducer` and are registered by name
//! (`Estimator::register_reducer`); a program uses them with `std.metrics.reducer`.

use crate::tensor::Tensor;
use std::any::Any;
use std::sync::Arc;

pub trait Reducer: Send {
    /// Adds one batch; `args` are the metric's arguments in order.
    fn accumulate(&mut self, args: &[&Tensor]);
    /// Adds the state of another reducer of the same kind (another shard's).
    fn merge(&mut self, other: &dyn Reducer);
    /// The metric's value.
    fn result(&self) -> f64;
    fn as_any(&self) -> &dyn Any;
}

/// Makes a fresh reducer.
pub type ReducerFactory = Arc<dyn Fn() -> Box<dyn Reducer> + Send + Sync>;

/// The built-in reducers by name.
pub fn builtin(name: &str) -> Option<ReducerFactory> {
    Some(match name {
        "accuracy" => ratio(RatioKind::Accuracy),
        "precision" => ratio(RatioKind::Precision),
        "recall" => ratio(RatioKind::Recall),
        "mean" => ratio(RatioKind::Mean),
        "auc" => Arc::new(|| Box::new(Auc::default()) as Box<dyn Reducer>),
        "mean_squared_error" => ratio(RatioKind::SquaredError),
        "root_mean_squared_error" => ratio(RatioKind::RootSquaredError),
        "mean_absolute_error" => ratio(RatioKind::AbsoluteError),
        "accuracy_baseline" => ratio(RatioKind::Baseline),
        _ => return None,
    })
}

fn ratio(kind: RatioKind) -> ReducerFactory {
    Arc::new(move || Box::new(Ratio::new(kind)) as Box<dyn Reducer>)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum RatioKind {
    Accuracy,
    Precision,
    Recall,
    Mean,
    /// Of `(labels - predictions)^2`; its square root at the end; of their `|.|`.
    SquaredError,
    RootSquaredError,
    AbsoluteError,
    /// `max(m, 1 - m)` of the labels' mean `m`.
    Baseline,
}

/// A metric that is a sum over a count: accuracy, precision, recall, mean, the mean
/// squared or absolute error (and its root), the accuracy baseline.
#[derive(Debug, Clone)]
struct Ratio {
    kind: RatioKind,
    num: f64,
    den: f64,
}

impl Ratio {
    fn new(kind: RatioKind) -> Ratio {
        Ratio {
            kind,
            num: 0.0,
            den: 0.0,
        }
    }
}

impl Reducer for Ratio {
    fn accumulate(&mut self, args: &[&Tensor]) {
        if matches!(self.kind, RatioKind::Mean | RatioKind::Baseline) {
            for v in args[0].to_f64() {
                self.num += v;
                self.den += 1.0;
            }
            return;
        }
        let labels = args[0].to_f64();
        let preds = args[1].to_f64();
        for (l, p) in labels.into_iter().zip(preds) {
            match self.kind {
                RatioKind::Accuracy => {
                    self.den += 1.0;
                    self.num += f64::from(u8::from(l == p));
                }
                RatioKind::Precision if p != 0.0 => {
                    self.den += 1.0;
                    self.num += f64::from(u8::from(l != 0.0));
                }
                RatioKind::Recall if l != 0.0 => {
                    self.den += 1.0;
                    self.num += f64::from(u8::from(p != 0.0));
                }
                RatioKind::SquaredError | RatioKind::RootSquaredError => {
                    self.den += 1.0;
                    self.num += (l - p) * (l - p);
                }
                RatioKind::AbsoluteError => {
                    self.den += 1.0;
                    self.num += (l - p).abs();
                }
                _ => {}
            }
        }
    }

    fn merge(&mut self, other: &dyn Reducer) {
        if let Some(o) = other.as_any().downcast_ref::<Ratio>() {
            self.num += o.num;
            self.den += o.den;
        }
    }

    fn result(&self) -> f64 {
        let m = if self.den == 0.0 {
            0.0
        } else {
            self.num / self.den
        };
        match self.kind {
            RatioKind::RootSquaredError => m.sqrt(),
            RatioKind::Baseline => m.max(1.0 - m),
            _ => m,
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Exact ROC AUC: keeps every (score, label) and ranks them at the end (ties count
/// half, as in the Mann-Whitney statistic).
#[derive(Debug, Clone, Default)]
pub struct Auc {
    pairs: Vec<(f64, bool)>,
}

impl Reducer for Auc {
    fn accumulate(&mut self, args: &[&Tensor]) {
        let labels = args[0].to_f64();
        let scores = args[1].to_f64();
        self.pairs
            .extend(scores.into_iter().zip(labels.into_iter().map(|l| l != 0.0)));
    }

    fn merge(&mut self, other: &dyn Reducer) {
        if let Some(o) = other.as_any().downcast_ref::<Auc>() {
            self.pairs.extend(&o.pairs);
        }
    }

    fn result(&self) -> f64 {
        // A NaN score has no rank: the AUC is NaN, as any metric of a NaN is.
        if self.pairs.iter().any(|x| x.0.is_nan()) {
            return f64::NAN;
        }
        let mut p = self.pairs.clone();
        p.sort_by(|a, b| a.0.total_cmp(&b.0));
        let pos = p.iter().filter(|x| x.1).count() as f64;
        let neg = p.len() as f64 - pos;
        if pos == 0.0 || neg == 0.0 {
            return 0.0;
        }
        // Sum of the ranks of the positives, with tied scores sharing their mean rank.
        let mut rank_sum = 0.0;
        let mut i = 0;
        while i < p.len() {
            let mut j = i + 1;
            while j < p.len() && p[j].0 == p[i].0 {
                j += 1;
            }
            let mean_rank = (i + 1 + j) as f64 / 2.0;
            rank_sum += mean_rank * p[i..j].iter().filter(|x| x.1).count() as f64;
            i = j;
        }
        (rank_sum - pos * (pos + 1.0) / 2.0) / (pos * neg)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, TensorType};

    fn t(v: &[f64]) -> Tensor {
        Tensor::from_f64(&TensorType::new(DType::F32, vec![v.len()]), v.to_vec())
    }

    /// Two batches, the second merged in from another shard, against values by hand.
    fn two_batches(name: &str, a: [&[f64]; 2], b: [&[f64]; 2]) -> f64 {
        let make = builtin(name).unwrap();
        let (mut r, mut other) = (make(), make());
        r.accumulate(&[&t(a[0]), &t(a[1])]);
        other.accumulate(&[&t(b[0]), &t(b[1])]);
        r.merge(other.as_ref());
        r.result()
    }

    #[test]
    fn error_metrics_and_the_baseline_are_exact_over_merged_batches() {
        // errors 1, -2 | 3, 0, 0: squares 1, 4, 9, 0, 0; absolute 1, 2, 3, 0, 0
        let a: [&[f64]; 2] = [&[1.0, 0.0], &[0.0, 2.0]];
        let b: [&[f64]; 2] = [&[3.0, 1.0, 2.0], &[0.0, 1.0, 2.0]];
        let close = |x: f64, y: f64| (x - y).abs() <= 1e-12;
        assert!(close(two_batches("mean_squared_error", a, b), 14.0 / 5.0));
        assert!(close(
            two_batches("root_mean_squared_error", a, b),
            (14.0f64 / 5.0).sqrt()
        ));
        assert!(close(two_batches("mean_absolute_error", a, b), 6.0 / 5.0));
        // labels 1, 0 | 0, 0, 0 (no second argument read): mean 0.2, baseline 0.8
        let (x, y): ([&[f64]; 2], [&[f64]; 2]) = ([&[1.0, 0.0], &[]], [&[0.0, 0.0, 0.0], &[]]);
        assert!(close(two_batches("accuracy_baseline", x, y), 0.8));
    }
}
