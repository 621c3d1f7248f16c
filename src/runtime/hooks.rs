//! Run hooks: code that runs around the train loop (the Estimator's `SessionRunHook`).
//! The runtime calls them on the host between steps, so the wafer target, which runs a
//! whole loop of steps on the device, refuses user hooks (E0903).

use std::path::Path;

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

/// What a hook asks of the loop after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Continue,
    /// Stop training after this step (a checkpoint is still saved).
    Stop,
}

pub trait RunHook: Send {
    /// Before the first step; `global_step` is where the run starts (after a restore).
    fn begin(&mut self, _global_step: i64, _last_step: i64) {}
    fn before_step(&mut self, _global_step: i64) {}
    fn after_step(&mut self, _info: &StepInfo) -> Action {
        Action::Continue
    }
    fn checkpoint_saved(&mut self, _global_step: i64, _path: &Path) {}
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
