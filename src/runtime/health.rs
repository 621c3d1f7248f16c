//! Numerical health of training. Every step, the loss, the gradient of every trainable
//! variable and every updated variable must be finite; the first NaN or infinity stops
//! training with E0902 before it reaches the variables, so no checkpoint ever holds one.
//! The diagnostic says what was checked about the last checkpoint, which may be finite
//! and still diverging.

use crate::backend::Bad;
use crate::diag::{Code, Diag};
use crate::span::Span;
use crate::tensor::{Data, Tensor};
use rustc_hash::FxHashMap;
use std::path::PathBuf;

/// What is known of the last checkpoint saved or restored: every variable in it was
/// finite (checked every step before it was written, and when it was restored).
#[derive(Debug, Clone)]
pub struct Checked {
    pub path: PathBuf,
    pub step: i64,
    /// The loss of the step that made it (unknown for a restored checkpoint).
    pub loss: Option<f64>,
    /// The largest magnitude among its float variables.
    pub max_abs: f64,
    /// The variable holding it.
    pub max_name: String,
}

impl Checked {
    pub fn new(
        path: PathBuf,
        step: i64,
        loss: Option<f64>,
        vars: &FxHashMap<String, Tensor>,
    ) -> Checked {
        let (max_name, max_abs) = largest(vars);
        Checked {
            path,
            step,
            loss,
            max_abs,
            max_name,
        }
    }
}

/// Weights this large are a sign that training diverged before they were saved.
const LARGE: f64 = 1e6;

/// The float variable with the largest finite magnitude, and that magnitude.
fn largest(vars: &FxHashMap<String, Tensor>) -> (String, f64) {
    let mut best = (String::new(), 0.0f64);
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    for name in names {
        if let Data::F(a) = &vars[name].data {
            let m = a
                .iter()
                .filter(|v| v.is_finite())
                .fold(0.0f32, |m, v| m.max(v.abs()));
            if f64::from(m) > best.1 {
                best = (name.clone(), f64::from(m));
            }
        }
    }
    best
}

/// E0902 for a non-finite value found at the step that would have made `step`.
pub fn diag(bad: &Bad, found: (usize, f32), step: i64, span: Span, last: Option<&Checked>) -> Diag {
    let what = match bad {
        Bad::Loss => "the loss is".to_string(),
        Bad::Gradient(v) => format!("the gradient of `{v}` holds"),
        Bad::Update(v) => format!("the updated value of `{v}` holds"),
    };
    let at = match bad {
        Bad::Loss => String::new(),
        _ => format!(" (element {})", found.0),
    };
    let label = match bad {
        Bad::Loss => "this loss",
        Bad::Gradient(_) => "this variable's gradient",
        Bad::Update(_) => "this variable's update",
    };
    let fix = "lower the learning rate, clip gradients (`clip_by_global_norm(opt, 1.0)`) or look for NaN and infinite values in the input";
    let help = match last {
        None => format!("no checkpoint has been saved yet; {fix}, then train again"),
        Some(c) => {
            let mut h = format!(
                "the last checkpoint, {} (global step {}), holds only finite values: every variable was checked when it was {}, and its largest weight is |{}| = {:.3e}; {fix}, then train again to resume from it",
                c.path.display(),
                c.step,
                match c.loss {
                    Some(l) => format!("saved (loss {l:.6})"),
                    None => "restored".to_string(),
                },
                c.max_name,
                c.max_abs
            );
            if c.max_abs > LARGE {
                h.push_str(". Weights that large suggest training was already diverging when it was saved: an earlier checkpoint, or a fresh --model-dir, may be needed");
            }
            h
        }
    };
    Diag::new(
        Code::NonFiniteLoss,
        span,
        format!(
            "{what} {}{at} at global step {step}; training stopped before the step was applied",
            found.1
        ),
    )
    .label(label)
    .help(help)
}
