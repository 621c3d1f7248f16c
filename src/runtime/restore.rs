//! The Estimator's side of its `model_dir`: the lock of a training run, restoring the
//! newest intact checkpoint (setting damaged ones aside, with a warning), initialising
//! when there is none, and saving checkpoints.

use super::model_dir::{self, DirError};
use super::{checkpoint, health, Estimator, Res, RunFailure};
use crate::diag::{Code, Diag};
use crate::elab::WarmStart;
use crate::ir::{name_matches, TensorType};
use crate::{rng, tensor::Tensor};
use rustc_hash::FxHashMap;
use std::path::PathBuf;

/// The names of the slots the optimisers add to a variable `VAR` (`VAR/momentum`):
/// a warm start leaves them to start again.
const SLOTS: &[&str] = &[
    "momentum",
    "adam_m",
    "adam_v",
    "rms",
    "rms_momentum",
    "accumulator",
    "linear",
    "ExponentialMovingAverage",
];

/// What a run needs of `model_dir`'s checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Need {
    /// Training: the newest intact checkpoint, or fresh variables when there is none.
    ResumeOrInit,
    /// Evaluation and prediction: a checkpoint (evaluating untrained weights would
    /// print numbers that mean nothing).
    Checkpoint,
}

impl Estimator {
    /// Restores the newest intact checkpoint of `model_dir`, or initialises every
    /// variable when there is none.
    pub fn restore_or_init(&mut self) -> Res<()> {
        self.prepare(Need::ResumeOrInit)
    }

    /// `prepare` on this process alone (rank 0's part in a run across ranks).
    pub(super) fn prepare_here(&mut self, need: Need) -> Res<()> {
        self.dev()?;
        if self.ready {
            return Ok(());
        }
        self.refuse_foreign()?;
        match checkpoint::restore(&self.model_dir) {
            Ok(Some(r)) => self.restored(r)?,
            Ok(None) if need == Need::ResumeOrInit => self.init_variables()?,
            Ok(None) => {
                return Err(Diag::new(
                    Code::NoCheckpoint,
                    self.info.span,
                    format!("{} holds no checkpoint", self.model_dir.display()),
                )
                .label("this estimator's model_dir")
                .help("train first (`estc train`), or point --model-dir at the directory of a training run")
                .into())
            }
            Err(checkpoint::RestoreError::Io(m)) => return Err(self.io_diag(m).into()),
            Err(checkpoint::RestoreError::NoneIntact(damaged)) => {
                let why: Vec<String> = damaged
                    .iter()
                    .map(|(c, why)| format!("ckpt-{}: {why}", c.step))
                    .collect();
                return Err(Diag::new(
                    Code::NoCheckpoint,
                    self.info.span,
                    format!(
                        "every checkpoint in {} is damaged: {}",
                        self.model_dir.display(),
                        why.join("; ")
                    ),
                )
                .label("this estimator's model_dir")
                .help("nothing was changed; train from scratch in a fresh --model-dir (the damaged files stay where they are)")
                .into());
            }
        }
        self.ready = true;
        Ok(())
    }

    /// E0912 when `model_dir` holds another framework's checkpoints: est would treat
    /// the directory as empty and write beside them.
    fn refuse_foreign(&self) -> Res<()> {
        let foreign = model_dir::foreign_files(&self.model_dir);
        let Some(first) = foreign.first() else {
            return Ok(());
        };
        let names: Vec<String> = foreign
            .iter()
            .take(4)
            .map(|p| {
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        Err(Diag::new(
            Code::ForeignModelDir,
            self.info.span,
            format!(
                "{} holds checkpoint files est did not write ({}{})",
                self.model_dir.display(),
                names.join(", "),
                if foreign.len() > 4 { ", ..." } else { "" }
            ),
        )
        .label("this estimator's model_dir")
        .help(format!(
            "est cannot read them and will not write beside them: use a fresh --model-dir (they look like {}'s)",
            framework(first)
        ))
        .into())
    }

    /// Adopts a restored checkpoint, after warning about (and, when this run holds the
    /// lock, setting aside) the damaged checkpoints newer than it.
    pub(super) fn restored(&mut self, r: checkpoint::Restored) -> Res<()> {
        self.note_seen();
        for (c, why) in &r.damaged {
            let moved = match &self.lock {
                Some(_) => self.set_aside(c)?,
                None => {
                    self.damaged_seen.push(c.clone());
                    Vec::new()
                }
            };
            let kept = if moved.is_empty() {
                "its files are left as they are".to_string()
            } else {
                format!(
                    "its files are kept as {}",
                    moved
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(" and ")
                )
            };
            let d = Diag::new(
                Code::DamagedCheckpoint,
                self.info.span,
                format!(
                    "the checkpoint of global step {} is damaged ({why}); using the newest intact one, global step {}",
                    c.step, r.meta.global_step
                ),
            )
            .label("this estimator's model_dir")
            .help(if self.lock.is_some() {
                format!("{kept}; steps after {} are trained again", r.meta.global_step)
            } else {
                format!("{kept}; a training run will set them aside")
            });
            self.warn(d);
        }
        if r.meta.unverified() {
            self.say(&format!(
                "note: {} was written by an est without checksums; its tensors are not verified",
                r.found.meta.display()
            ));
        }
        let want: Vec<(String, TensorType)> = self
            .all_variables()
            .into_iter()
            .map(|(n, _, t)| (n, t))
            .collect();
        let bad = checkpoint::mismatches(&want, &r.vars);
        if !bad.is_empty() {
            let help = if r.meta.program_hash != self.program_hash {
                "the checkpoint was written by another version of the program; use a fresh --model-dir, or restore that program"
            } else {
                "use a fresh --model-dir, or the program that wrote the checkpoint"
            };
            return Err(Diag::new(
                Code::CheckpointMismatch,
                self.info.span,
                format!(
                    "the checkpoint {} does not fit this program: {}",
                    r.found.tensors.display(),
                    bad.join("; ")
                ),
            )
            .label("this estimator's model_dir")
            .help(help)
            .into());
        }
        let meta = r.meta;
        let path = r.found.tensors;
        self.last_checked = Some(health::Checked::new(
            path.clone(),
            meta.global_step,
            None,
            &r.vars,
        ));
        self.bind(r.vars)?;
        self.step = meta.global_step;
        self.seed = meta.seed;
        self.input_position = meta.input_position;
        self.max_shards = meta.max_shards.unwrap_or(1);
        self.last_checkpoint = Some(path.clone());
        self.say(&format!(
            "restored {} (global step {})",
            path.display(),
            meta.global_step
        ));
        for h in &mut self.hooks {
            h.checkpoint_loaded(meta.global_step, &path);
        }
        Ok(())
    }

    pub(super) fn init_variables(&mut self) -> Res<()> {
        let mut vars = rustc_hash::FxHashMap::default();
        for (name, init, ty) in self.all_variables() {
            // The initial values are drawn into a vector of f32 and may pass through
            // another (uniform draws, then scaled) before they are the variable's:
            // reserve both (an i64 tensor is as large), so that a variable too large for
            // the process's memory (`ulimit -v`) is this error, not an abort.
            let wide = TensorType::new(crate::ir::DType::I64, ty.shape.clone());
            crate::backend::interp::reserve(&wide).map_err(|m| {
                Diag::new(
                    Code::RunFailed,
                    self.info.span,
                    format!("variable `{name}` cannot be initialised: {m}"),
                )
                .label("this estimator's model")
                .help("make the variable smaller; `estc check` estimates the memory a program needs (E0602)")
            })?;
            let v = rng::init_values(&init, &name, &ty, self.seed);
            let t = if ty.dtype.is_float() {
                let a = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&ty.shape), v)
                    .map_err(|e| self.io_diag(format!("variable `{name}`: {e}")))?;
                Tensor::float(ty.dtype, a.into_shared())
            } else {
                Tensor::from_f64(&ty, v.into_iter().map(f64::from).collect())
            };
            vars.insert(name, t);
        }
        if let Some(ws) = self.info.warm_start.clone() {
            self.warm_start(&ws, &mut vars)?;
        }
        self.bind(vars)?;
        self.step = 0;
        self.input_position = 0;
        self.max_shards = 1;
        self.note_seen();
        Ok(())
    }

    /// Starts the model's variables of a fresh run from another run's checkpoint
    /// (`warm_start_from`): every variable the model made (not an optimiser's slot:
    /// those start again, as TensorFlow's warm start leaves them) that matches `vars`
    /// and no `skip` pattern, read under its `rename`d name; a moving average starts
    /// at its variable's new value. E0921 names a variable the checkpoint lacks or
    /// holds with another type.
    fn warm_start(&mut self, ws: &WarmStart, vars: &mut FxHashMap<String, Tensor>) -> Res<()> {
        let fail = |m: String, help: &str| -> RunFailure {
            Diag::new(Code::WarmStart, ws.span, m)
                .label("this warm start")
                .help(help)
                .into()
        };
        let path = self.base.join(&ws.from);
        let found = if path.is_dir() {
            match checkpoint::restore(&path) {
                Ok(Some(r)) => Ok((r.found, r.vars)),
                Ok(None) => Err(format!("{} holds no checkpoint", path.display())),
                Err(checkpoint::RestoreError::Io(m)) => Err(m),
                Err(checkpoint::RestoreError::NoneIntact(d)) => Err(format!(
                    "every checkpoint in {} is damaged ({} of them)",
                    path.display(),
                    d.len()
                )),
            }
        } else {
            let step = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("ckpt-"))
                .and_then(|n| n.strip_suffix(".safetensors"))
                .and_then(|n| n.parse::<i64>().ok());
            match (step, path.parent()) {
                (Some(step), Some(dir)) => {
                    let f = checkpoint::Found {
                        step,
                        tensors: checkpoint::tensors_path(dir, step),
                        meta: checkpoint::meta_path(dir, step),
                    };
                    checkpoint::load(&f)
                        .map(|(_, v)| (f, v))
                        .map_err(|e| match e {
                            checkpoint::LoadError::Io(m) | checkpoint::LoadError::Damaged(m) => m,
                            checkpoint::LoadError::Gone => format!("{} is gone", path.display()),
                        })
                }
                _ => Err(format!(
                    "{} is neither a model directory nor a checkpoint (`ckpt-N.safetensors`)",
                    path.display()
                )),
            }
        };
        let (found, from) = found.map_err(|m| {
            fail(
                format!("cannot warm-start from {}: {m}", ws.from),
                "point `warm_start_from` at the model_dir of a training run, or at one of its ckpt-N.safetensors files; the path is relative to the program's directory",
            )
        })?;
        let mut names: Vec<String> = vars.keys().cloned().collect();
        names.sort_unstable();
        // an optimiser's slot is named after its variable: `VAR/momentum`
        let slot = |n: &str| {
            n.rsplit_once('/')
                .is_some_and(|(base, s)| vars.contains_key(base) && SLOTS.contains(&s))
        };
        let mut warmed = Vec::new();
        for name in names.iter().filter(|n| !slot(n)) {
            let wanted = (ws.vars.is_empty() || name_matches(&ws.vars, name))
                && !ws.skip.iter().any(|p| name_matches(p, name));
            if !wanted {
                continue;
            }
            let src =
                (ws.rename.iter().find(|r| &r.0 == name)).map_or(name.as_str(), |r| r.1.as_str());
            let here = &vars[name];
            let Some(t) = from.get(src) else {
                let mut names: Vec<&str> = from.keys().map(|k| k.as_str()).collect();
                names.sort_unstable();
                let close = crate::diag::did_you_mean(src, names.iter().copied())
                    .map(|h| format!(" ({h})"))
                    .unwrap_or_default();
                return Err(fail(
                    format!("cannot warm-start `{name}`: ckpt-{} of {} has no `{src}`{close}", found.step, ws.from),
                    &format!("map it to its name there with `rename: [(\"{name}\", \"...\")]`, or leave it to its initialiser with `skip: [\"{name}\"]`"),
                ));
            };
            if t.ty() != here.ty() {
                return Err(fail(
                    format!("cannot warm-start `{name}` ({}) from `{src}`, which is {}", here.ty(), t.ty()),
                    &format!("the checkpoint's variable has another shape: leave `{name}` to its initialiser with `skip: [\"{name}\"]` (a new head), or map it to a variable of its shape with `rename`"),
                ));
            }
            warmed.push((name.clone(), t.clone()));
        }
        let n = warmed.len();
        if n == 0 {
            return Err(fail(
                format!("the warm start from {} matches no variable of the model", ws.from),
                "`vars` is a name pattern, not a regular expression: a part of the names (`encoder`), `*` for any characters; leave it empty for every variable",
            ));
        }
        for (name, t) in warmed {
            let avg = format!("{name}{}", crate::ir::AVERAGE_SUFFIX);
            if vars.contains_key(&avg) {
                vars.insert(avg, t.clone());
            }
            vars.insert(name, t);
        }
        self.say(&format!(
            "warm-started {n} variables from {} (ckpt-{})",
            ws.from, found.step
        ));
        Ok(())
    }

    /// Runs `f` holding the lock of `model_dir` (taking it unless this estimator holds
    /// it already, and releasing what it took). Refuses a directory of another
    /// framework before writing anything into it.
    pub(super) fn locked<T>(&mut self, f: impl FnOnce(&mut Self) -> Res<T>) -> Res<T> {
        // (the other ranks of a run across ranks leave model_dir to rank 0)
        if self.lock.is_some() || !self.chief() {
            return f(self);
        }
        if let Err(e) = self.refuse_foreign() {
            return Err(self.tell_restore_failed(e));
        }
        let lock = model_dir::lock(&self.model_dir).map_err(|e| match e {
            DirError::Locked { pid } => Diag::new(
                Code::ModelDirLocked,
                self.info.span,
                format!(
                    "{} is in use by another training run{}",
                    self.model_dir.display(),
                    match pid {
                        Some(p) => format!(" (PID {p})"),
                        None => String::new(),
                    }
                ),
            )
            .label("this estimator's model_dir")
            .help("wait for that run to finish, or train in another --model-dir; `estc eval` and `estc predict` may run alongside it"),
            DirError::Unwritable(m) => Diag::new(Code::RunIo, self.info.span, format!("cannot train in this model_dir: {m}"))
                .label("this estimator's model_dir")
                .help("pass a writable directory with --model-dir"),
        });
        let lock = match lock {
            Ok(l) => l,
            Err(d) => return Err(self.tell_restore_failed(d.into())),
        };
        self.lock = Some(lock);
        let r = match self.catch_up().and_then(|()| self.sync_index()) {
            Ok(()) => f(self),
            Err(e) => Err(self.tell_restore_failed(e)),
        };
        self.lock = None;
        r
    }

    /// On taking the lock: when this estimator already holds state, checks that
    /// `model_dir` is as it was when the state was read or saved. Another run may have
    /// trained there since (while no lock was held, between two `train` calls of an
    /// embedding program): then the state is read again from its newest checkpoint,
    /// instead of overwriting that run's checkpoints with older weights. Damaged
    /// checkpoints found by a restore without the lock are set aside now.
    fn catch_up(&mut self) -> Res<()> {
        if !self.ready {
            return Ok(());
        }
        let now = checkpoint::steps(&self.model_dir).map_err(|e| self.io_diag(e.to_string()))?;
        if self.seen.as_deref() != Some(now.as_slice()) {
            self.say(&format!(
                "{} changed since this estimator read it; restoring its newest checkpoint",
                self.model_dir.display()
            ));
            self.ready = false;
            self.damaged_seen.clear();
            return Ok(());
        }
        for c in std::mem::take(&mut self.damaged_seen) {
            self.set_aside(&c)?;
        }
        self.note_seen();
        Ok(())
    }

    /// Notes the checkpoints of `model_dir` as they are now (see `catch_up`; a listing
    /// that fails notes nothing, so that `catch_up` lists again and says why).
    fn note_seen(&mut self) {
        self.seen = checkpoint::steps(&self.model_dir).ok();
    }

    /// Rewrites `checkpoint.json` when it disagrees with the checkpoints `model_dir`
    /// holds (this run holds the lock).
    fn sync_index(&self) -> Res<()> {
        checkpoint::sync_index(&self.model_dir).map_err(|e| {
            self.io_diag(format!(
                "cannot bring {}'s checkpoint.json up to date: {e}",
                self.model_dir.display()
            ))
            .into()
        })
    }

    /// Moves a damaged checkpoint's files aside (this run holds the lock).
    fn set_aside(&self, c: &checkpoint::Found) -> Res<Vec<PathBuf>> {
        Ok(checkpoint::set_aside(c).map_err(|e| {
            self.io_diag(format!("cannot set aside the damaged ckpt-{}: {e}", c.step))
        })?)
    }

    /// Saves a checkpoint of the current state.
    pub fn save_checkpoint(&mut self) -> Res<PathBuf> {
        self.locked(|s| s.save_locked())
    }

    fn save_locked(&mut self) -> Res<PathBuf> {
        if !self.chief() {
            // rank 0 writes it
            let p = checkpoint::tensors_path(&self.model_dir, self.step);
            self.last_checkpoint = Some(p.clone());
            return Ok(p);
        }
        let vars = self.variables();
        let meta = checkpoint::Meta {
            global_step: self.step,
            seed: self.seed,
            input_position: self.input_position,
            max_shards: Some(self.max_shards),
            program_hash: self.program_hash.clone(),
            variables: {
                let mut v: Vec<String> = vars
                    .iter()
                    .map(|(k, t)| format!("{k}: {}", t.ty()))
                    .collect();
                v.sort();
                v
            },
            checksums: None,
            meta_checksum: None,
        };
        let keep = self.info.config.keep_checkpoint_max.max(1) as usize;
        let p = checkpoint::save(&self.model_dir, &vars, &meta, keep).map_err(|e| {
            self.io_diag(format!(
                "cannot write a checkpoint in {}: {e}",
                self.model_dir.display()
            ))
        })?;
        self.last_checkpoint = Some(p.clone());
        self.last_checked = Some(health::Checked::new(
            p.clone(),
            self.step,
            self.last_loss,
            &vars,
        ));
        self.note_seen();
        for h in &mut self.hooks {
            h.checkpoint_saved(self.step, &p);
        }
        let msg = format!("saved {} (global step {})", p.display(), self.step);
        self.say(&msg);
        Ok(p)
    }

    /// Records a warning (see `warnings`) and says it in the log.
    pub(super) fn warn(&mut self, d: Diag) {
        let help = d
            .help
            .as_deref()
            .map_or(String::new(), |h| format!(" ({h})"));
        self.say(&format!(
            "warning[{}]: {}{help}",
            d.code.info().id,
            d.message
        ));
        self.warnings.push(d);
    }

    /// The warnings of the runs so far (damaged checkpoints skipped, summaries that
    /// could not be written), taken out.
    pub fn take_warnings(&mut self) -> Vec<Diag> {
        std::mem::take(&mut self.warnings)
    }
}

/// Whose checkpoint a foreign file looks like.
fn framework(p: &std::path::Path) -> &'static str {
    let n = p.file_name().unwrap_or_default().to_string_lossy();
    if n.ends_with(".pt") || n.ends_with(".pth") {
        "PyTorch"
    } else if n.ends_with(".h5") || n.ends_with(".keras") {
        "Keras"
    } else {
        "TensorFlow"
    }
}
