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
        "auc_pr" => Arc::new(|| {
            Box::new(Auc {
                pr: true,
                ..Auc::default()
            }) as Box<dyn Reducer>
        }),
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

/// The weights of a metric's batch: its argument after the `arity` values, or ones.
fn weights(args: &[&Tensor], arity: usize) -> Vec<f64> {
    match args.get(arity) {
        Some(w) => w.to_f64(),
        None => vec![1.0; args[0].shape().iter().product()],
    }
}

impl Reducer for Ratio {
    fn accumulate(&mut self, args: &[&Tensor]) {
        if matches!(self.kind, RatioKind::Mean | RatioKind::Baseline) {
            for (v, w) in args[0].to_f64().into_iter().zip(weights(args, 1)) {
                if w == 0.0 {
                    continue; // left out, even a NaN
                }
                self.num += w * v;
                self.den += w;
            }
            return;
        }
        let labels = args[0].to_f64();
        let preds = args[1].to_f64();
        for ((l, p), w) in labels.into_iter().zip(preds).zip(weights(args, 2)) {
            if w == 0.0 {
                continue; // left out, even a NaN
            }
            match self.kind {
                RatioKind::Accuracy => {
                    self.den += w;
                    self.num += w * f64::from(u8::from(l == p));
                }
                RatioKind::Precision if p != 0.0 => {
                    self.den += w;
                    self.num += w * f64::from(u8::from(l != 0.0));
                }
                RatioKind::Recall if l != 0.0 => {
                    self.den += w;
                    self.num += w * f64::from(u8::from(p != 0.0));
                }
                RatioKind::SquaredError | RatioKind::RootSquaredError => {
                    self.den += w;
                    self.num += w * (l - p) * (l - p);
                }
                RatioKind::AbsoluteError => {
                    self.den += w;
                    self.num += w * (l - p).abs();
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

/// Exact areas: keeps every (score, label, weight) and sorts them at the end. ROC AUC
/// is the weighted Mann-Whitney statistic (a positive above a negative counts the
/// product of their weights, a tie half of it); with `pr`, the area under the
/// precision-recall curve as the average precision (each distinct score's precision
/// times the recall it adds).
#[derive(Debug, Clone, Default)]
pub struct Auc {
    pairs: Vec<(f64, bool, f64)>,
    pr: bool,
}

impl Reducer for Auc {
    fn accumulate(&mut self, args: &[&Tensor]) {
        let labels = args[0].to_f64();
        let scores = args[1].to_f64();
        let w = weights(args, 2);
        self.pairs.extend(
            (scores.into_iter().zip(labels).zip(w))
                .filter(|x| x.1 != 0.0)
                .map(|((s, l), w)| (s, l != 0.0, w)),
        );
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
        let pos: f64 = p.iter().filter(|x| x.1).map(|x| x.2).sum();
        let neg: f64 = p.iter().filter(|x| !x.1).map(|x| x.2).sum();
        if pos == 0.0 || (neg == 0.0 && !self.pr) {
            return 0.0;
        }
        if self.pr {
            // from the highest score down: at each distinct score, the precision of
            // everything at or above it, times the recall that score adds
            p.sort_by(|a, b| b.0.total_cmp(&a.0));
            let (mut tp, mut fp, mut ap) = (0.0, 0.0, 0.0);
            let mut i = 0;
            while i < p.len() {
                let mut j = i;
                let mut added = 0.0;
                while j < p.len() && p[j].0 == p[i].0 {
                    if p[j].1 {
                        tp += p[j].2;
                        added += p[j].2;
                    } else {
                        fp += p[j].2;
                    }
                    j += 1;
                }
                if added > 0.0 {
                    ap += tp / (tp + fp) * added / pos;
                }
                i = j;
            }
            return ap;
        }
        // from the lowest score up: each positive beats the negative weight below it,
        // and ties with half its score group's negative weight
        p.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut below, mut sum) = (0.0, 0.0);
        let mut i = 0;
        while i < p.len() {
            let mut j = i;
            let (mut gp, mut gn) = (0.0, 0.0);
            while j < p.len() && p[j].0 == p[i].0 {
                if p[j].1 {
                    gp += p[j].2;
                } else {
                    gn += p[j].2;
                }
                j += 1;
            }
            sum += gp * (below + gn / 2.0);
            below += gn;
            i = j;
        }
        sum / (pos * neg)
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
        // (an empty second argument is none: the baseline's one argument)
        let args = |x: [&[f64]; 2]| -> Vec<Tensor> {
            x.iter().filter(|v| !v.is_empty()).map(|v| t(v)).collect()
        };
        let (ta, tb) = (args(a), args(b));
        r.accumulate(&ta.iter().collect::<Vec<_>>());
        other.accumulate(&tb.iter().collect::<Vec<_>>());
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

    /// Weighting an element by k is counting it k times, for every weighted metric;
    /// and the average precision of a small case by hand.
    #[test]
    fn a_weight_counts_an_element_that_many_times() {
        let labels = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0];
        let scores = [0.9, 0.8, 0.7, 0.7, 0.2, 0.4];
        let preds = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0];
        let w = [2.0, 1.0, 3.0, 0.0, 1.0, 2.0];
        // the same batch with each element repeated its weight's times
        let rep = |v: &[f64]| -> Vec<f64> {
            v.iter()
                .zip(&w)
                .flat_map(|(x, &k)| std::iter::repeat_n(*x, k as usize))
                .collect()
        };
        let one = |name: &str, args: &[&[f64]]| -> f64 {
            let mut r = builtin(name).unwrap()();
            let ts: Vec<Tensor> = args.iter().map(|a| t(a)).collect();
            r.accumulate(&ts.iter().collect::<Vec<_>>());
            r.result()
        };
        for (name, second) in [
            ("accuracy", &preds),
            ("precision", &preds),
            ("recall", &preds),
            ("mean_squared_error", &scores),
            ("mean_absolute_error", &scores),
            ("auc", &scores),
            ("auc_pr", &scores),
        ] {
            let weighted = one(name, &[&labels, second, &w]);
            let repeated = one(name, &[&rep(&labels), &rep(second)]);
            assert!(
                (weighted - repeated).abs() <= 1e-12,
                "{name}: weighted {weighted}, repeated {repeated}"
            );
        }
        let weighted = one("mean", &[&scores, &w]);
        assert!((weighted - one("mean", &[&rep(&scores)])).abs() <= 1e-12);
        // scores 0.9 (+), 0.8 (-), 0.7 (+), 0.6 (-): precision 1 at recall 1/2, then
        // 2/3 at recall 1
        let ap = one("auc_pr", &[&[1.0, 0.0, 1.0, 0.0], &[0.9, 0.8, 0.7, 0.6]]);
        assert!((ap - (0.5 + 2.0 / 3.0 * 0.5)).abs() <= 1e-12, "{ap}");
    }
}
