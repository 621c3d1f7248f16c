//! Run hooks: code that runs around the train loop (the Estimator's `SessionRunHook`).
//! The runtime calls them on the host between steps, so the wafer target, which runs a
//! whole loop of steps on the device, refuses user hooks (E0903).

use std::path::{Path, PathBuf};

/// What a hook sees of the run.
#[derive(Debug, Clone)]
pub struct StepInfo {
    pub global_step: i64,
    pub loss: f64,
    pub learning_rate: f64,
    /// The step the run trains to.
    pub last_step: i64,
    pub steps_per_sec: f64,
}

/// What a hook sees of an evaluation during train-and-evaluate.
#[derive(Debug, Clone)]
pub struct EvalInfo {
    /// The global step of the checkpoint evaluated.
    pub global_step: i64,
    /// The evaluation's loss and metrics (the loss under the name `loss`).
    pub metrics: Vec<(String, f64)>,
    /// The checkpoint evaluated, and the run's model_dir.
    pub checkpoint: PathBuf,
    pub model_dir: PathBuf,
}

impl EvalInfo {
    /// The value of a metric, or of the loss (`"loss"`).
    pub fn metric(&self, name: &str) -> Option<f64> {
        self.metrics.iter().find(|m| m.0 == name).map(|m| m.1)
    }
}

/// Which way a metric improves: `"max"`, `"min"`, or `"auto"`: down for a loss or an
/// error (a name containing `loss` or `error`, or `mse`, `rmse`, `mae`), else up
/// (accuracy, AUC, precision, recall).
pub fn higher_is_better(metric: &str, mode: &str) -> bool {
    match mode {
        "max" => true,
        "min" => false,
        _ => {
            let m = metric.to_ascii_lowercase();
            let lower = m.contains("loss")
                || m.contains("error")
                || ["mse", "rmse", "mae"].contains(&m.as_str());
            !lower
        }
    }
}

/// Whether `value` improves on `best` by more than `min_delta` (a NaN never does).
fn improves(value: f64, best: Option<f64>, higher: bool, min_delta: f64) -> bool {
    match best {
        _ if value.is_nan() => false,
        None => true,
        Some(b) if higher => value > b + min_delta,
        Some(b) => value < b - min_delta,
    }
}

/// `std.hooks.early_stopping`: stops train-and-evaluate when `metric` has not improved
/// by more than `min_delta` for `patience` evaluations in a row (Keras's
/// `EarlyStopping`, TensorFlow's `stop_if_no_increase_hook`), counting from global
/// step `min_steps` on.
pub struct EarlyStopping {
    pub metric: String,
    pub patience: u64,
    pub min_delta: f64,
    pub higher: bool,
    pub min_steps: i64,
    best: Option<f64>,
    waited: u64,
}

impl EarlyStopping {
    pub fn new(
        metric: &str,
        patience: u64,
        min_delta: f64,
        mode: &str,
        min_steps: i64,
    ) -> EarlyStopping {
        EarlyStopping {
            metric: metric.to_string(),
            patience,
            min_delta: min_delta.abs(),
            higher: higher_is_better(metric, mode),
            min_steps,
            best: None,
            waited: 0,
        }
    }
}

impl RunHook for EarlyStopping {
    fn after_eval(&mut self, info: &EvalInfo) -> Action {
        let Some(v) = info.metric(&self.metric) else {
            return Action::Continue;
        };
        if improves(v, self.best, self.higher, self.min_delta) {
            self.best = Some(v);
            self.waited = 0;
            return Action::Continue;
        }
        self.waited += 1;
        if self.waited >= self.patience.max(1) && info.global_step >= self.min_steps {
            crate::diag::log(&format!(
                "early stopping at global step {}: `{}` has not improved on {} for {} evaluations",
                info.global_step,
                self.metric,
                self.best
                    .map_or("nothing".to_string(), |b| format!("{b:.6}")),
                self.waited
            ));
            Action::Stop
        } else {
            Action::Continue
        }
    }
}

/// `std.hooks.keep_best`: keeps the checkpoint with the best `metric` so far in
/// `MODEL_DIR/best/` (a model_dir of its own, so `--model-dir .../best` evaluates or
/// predicts with it), with `best.json` saying which it is (TensorFlow's
/// `BestExporter`). Its files are copied when an evaluation improves on it.
pub struct KeepBest {
    pub metric: String,
    pub higher: bool,
    best: Option<f64>,
}

impl KeepBest {
    pub fn new(metric: &str, mode: &str) -> KeepBest {
        KeepBest {
            metric: metric.to_string(),
            higher: higher_is_better(metric, mode),
            best: None,
        }
    }

    /// The best value recorded in `dir` by an earlier run, if any.
    fn recorded(&self, dir: &Path) -> Option<f64> {
        let text = std::fs::read_to_string(dir.join("best.json")).ok()?;
        let v: serde_json::Value = serde_json::from_str(&text).ok()?;
        (v["metric"] == self.metric.as_str() && v["higher_is_better"] == self.higher)
            .then(|| v["value"].as_f64())?
    }

    fn keep(&self, info: &EvalInfo, v: f64) -> std::io::Result<()> {
        let dir = info.model_dir.join("best");
        std::fs::create_dir_all(&dir)?;
        let step = info.global_step;
        let from_meta = super::checkpoint::meta_path(&info.model_dir, step);
        let tensors = std::fs::read(&info.checkpoint)?;
        let meta = std::fs::read(&from_meta)?;
        // tensors, then metadata (a checkpoint is whole once its metadata is there),
        // then the record; older best checkpoints go
        crate::atomic::write(&super::checkpoint::tensors_path(&dir, step), &tensors)?;
        crate::atomic::write(&super::checkpoint::meta_path(&dir, step), &meta)?;
        for old in super::checkpoint::list(&dir)? {
            if old.step != step {
                let _ = std::fs::remove_file(&old.meta);
                let _ = std::fs::remove_file(&old.tensors);
            }
        }
        let record = serde_json::json!({
            "metric": self.metric,
            "value": v,
            "global_step": step,
            "higher_is_better": self.higher,
        });
        crate::atomic::write(&dir.join("best.json"), format!("{record:#}\n").as_bytes())
    }
}

impl RunHook for KeepBest {
    fn writes(&self) -> bool {
        true
    }

    fn after_eval(&mut self, info: &EvalInfo) -> Action {
        let Some(v) = info.metric(&self.metric) else {
            return Action::Continue;
        };
        if self.best.is_none() {
            self.best = self.recorded(&info.model_dir.join("best"));
        }
        if improves(v, self.best, self.higher, 0.0) {
            match self.keep(info, v) {
                Ok(()) => {
                    self.best = Some(v);
                    crate::diag::log(&format!(
                        "best `{}` so far: {v:.6} at global step {} (kept in {})",
                        self.metric,
                        info.global_step,
                        info.model_dir.join("best").display()
                    ));
                }
                Err(e) => crate::diag::log(&format!(
                    "warning: cannot keep the best checkpoint in {}: {e}",
                    info.model_dir.join("best").display()
                )),
            }
        }
        Action::Continue
    }
}

/// What a hook asks of the loop after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    /// Stop training after this step (a checkpoint is still saved).
    Stop,
}

pub trait RunHook: Send {
    /// Whether the hook writes files (it then runs on rank 0 alone in a run across
    /// ranks; the others must not depend on it to stop).
    fn writes(&self) -> bool {
        false
    }
    /// Before the first step; `global_step` is where the run starts (after a restore).
    fn begin(&mut self, _global_step: i64, _last_step: i64) {}
    fn before_step(&mut self, _global_step: i64) {}
    fn after_step(&mut self, _info: &StepInfo) -> Action {
        Action::Continue
    }
    fn checkpoint_saved(&mut self, _global_step: i64, _path: &Path) {}
    /// After an evaluation of train-and-evaluate (`Estimator::train_and_evaluate`):
    /// `Stop` ends training there (early stopping).
    fn after_eval(&mut self, _info: &EvalInfo) -> Action {
        Action::Continue
    }
    fn checkpoint_loaded(&mut self, _global_step: i64, _path: &Path) {}
    fn end(&mut self, _global_step: i64) {}
}

/// `std.hooks.stop_at_step_hook(last_step)`.
pub struct StopAtStep(pub i64);

impl RunHook for StopAtStep {
    fn after_step(&mut self, info: &StepInfo) -> Action {
        if info.global_step >= self.0 {
            Action::Stop
        } else {
            Action::Continue
        }
    }
}

/// `std.hooks.logging_hook(every_n_steps)`: the loss on stderr.
pub struct Logging(pub i64);

impl RunHook for Logging {
    fn after_step(&mut self, info: &StepInfo) -> Action {
        if self.0 > 0 && info.global_step % self.0 == 0 {
            crate::diag::log(&format!(
                "step {}: loss = {:.6}",
                info.global_step, info.loss
            ));
        }
        Action::Continue
    }
}
