//! The Estimator as one rank of a data-parallel run (`mpirun -n N estc train`): every
//! rank runs the same program on its own shards of the input, the train step averages
//! over all of them (`backend::Peers`), and rank 0 alone reads and writes `model_dir`.
//!
//! ```text
//! join(group)          the ranks agree on the program; rank 0's seed is everyone's
//! prepare              rank 0 restores or initialises; every rank binds its state
//! read_group           the input's next ranks x shards elements: this rank's share
//!                      computed, the others' passed over
//! train step           phase A on this rank's shards, the rank-ordered sum, phase B
//! evaluate / predict   each rank runs its batches; the results are gathered in order
//! ```
//!
//! Every collective starts with a tag naming what it is, so that ranks that fell out of
//! step (one failed where the others could not see it) find out instead of pairing
//! unrelated exchanges.

use super::{Estimator, Res, RunFailure};
use crate::backend::Peers;
use crate::data::pipeline::{Element, Pipeline};
use crate::diag::{Code, Diag};
use crate::dist::Group;
use crate::syntax::ast::SectionKind;
use crate::tensor::Tensor;
use rustc_hash::FxHashMap;

/// Rank 0's readiness in `prepare` when it could not take or read `model_dir`.
const FAILED: u8 = 2;

/// What a collective exchange is, sent ahead of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Join = 1,
    State,
    Step,
    Eval,
    Predict,
    /// The end of a command: every rank's outcome.
    End,
}

impl Phase {
    fn name(b: u8) -> &'static str {
        match b {
            1 => "joining",
            2 => "restoring",
            3 => "a train step",
            4 => "evaluating",
            5 => "predicting",
            6 => "the end of the run",
            _ => "an unknown exchange",
        }
    }
}

/// Ranks found in different exchanges: the job cannot go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diverged {
    pub rank: usize,
    pub at: &'static str,
    pub here: &'static str,
}

impl std::fmt::Display for Diverged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the ranks fell out of step: rank {} is at {} while this rank is at {}",
            self.rank, self.at, self.here
        )
    }
}

/// Every rank's payload of one tagged exchange, in rank order.
pub fn exchange(g: &mut Group, phase: Phase, payload: &[u8]) -> Result<Vec<Vec<u8>>, Diverged> {
    let mut mine = Vec::with_capacity(payload.len() + 1);
    mine.push(phase as u8);
    mine.extend_from_slice(payload);
    let all = g.all_gather(&mine);
    let mut out = Vec::with_capacity(all.len());
    for (rank, mut b) in all.into_iter().enumerate() {
        if b.first() != Some(&(phase as u8)) {
            return Err(Diverged {
                rank,
                at: Phase::name(b.first().copied().unwrap_or(0)),
                here: Phase::name(phase as u8),
            });
        }
        b.remove(0);
        out.push(b);
    }
    Ok(out)
}

impl Peers for Group {
    fn replicas(&self) -> (usize, usize) {
        (self.size(), self.rank())
    }

    fn reduce(&mut self, local: Option<&mut [f32]>) -> Result<(), usize> {
        let t = std::time::Instant::now();
        let r = reduce(self, local);
        self.spent += t.elapsed();
        r
    }
}

/// `Peers::reduce` for a group.
fn reduce(g: &mut Group, local: Option<&mut [f32]>) -> Result<(), usize> {
    // (a rank at another exchange counts as failed: the job ends)
    let all = exchange(g, Phase::Step, &[u8::from(local.is_some())]).map_err(|d| d.rank)?;
    if let Some(r) = all.iter().position(|b| b.first() != Some(&1)) {
        return Err(r);
    }
    if let Some(b) = local {
        g.sum(b);
    }
    Ok(())
}

/// Takes part in `Estimator::join` as a rank whose program could not be checked (the
/// others stop with E0924 instead of waiting for it), `digest` standing for its
/// diagnostics: whether it should print them, that is, whether no rank before it
/// failed with the same.
///
/// The rank says why, then calls `end_failed`: no rank ends before every rank has
/// said what it has to say (a launcher stops a job's other ranks when one ends with
/// an error, and could stop one before it printed).
pub fn join_failed(group: &mut Group, digest: u64) -> bool {
    let mut mine = vec![0u8];
    mine.extend(digest.to_le_bytes());
    let me = group.rank();
    match exchange(group, Phase::Join, &mine) {
        Ok(all) => !all[..me].contains(&mine),
        Err(_) => true,
    }
}

/// The end of a command that failed to join (`join_failed`), with the other ranks'
/// `Estimator::finish`.
pub fn end_failed(group: &mut Group) {
    let _ = exchange(group, Phase::End, &[0]);
}

impl Estimator {
    /// Joins a data-parallel run as one of `group`'s ranks (every rank calls it, in
    /// the same order as everything after it). The ranks must run the same program,
    /// estimator, configuration and target, checked for as many ranks as the group
    /// has (`RunOptions::ranks`); E0925 otherwise, on every rank. Rank 0's seed
    /// becomes every rank's: it travels ahead of each rank's description.
    ///
    /// The estimator keeps the group even when the ranks refuse: after saying why,
    /// end with `finish(false)`, which every rank takes part in (so that no rank ends
    /// before the others have said why).
    pub fn join(&mut self, mut group: Group) -> Res<()> {
        let joined = self.join_group(&mut group);
        self.group = Some(group);
        joined
    }

    fn join_group(&mut self, group: &mut Group) -> Res<()> {
        let me = format!(
            "{}\n{}\n{:?}\n{:?}\n{}\n{}\n{}\n{}\n{}",
            self.program_hash,
            self.info.name,
            self.target,
            self.info.config,
            self.ranks,
            env!("CARGO_PKG_VERSION"),
            self.input_fingerprint(SectionKind::Train),
            self.input_fingerprint(SectionKind::Eval),
            self.input_fingerprint(SectionKind::Predict),
        );
        let mut mine = vec![1u8];
        mine.extend(self.seed.to_le_bytes());
        mine.extend(me.as_bytes());
        let all = exchange(group, Phase::Join, &mine).map_err(|d| self.diverged(&d))?;
        if let Some(r) = all.iter().position(|b| b.first() != Some(&1)) {
            return Err(self.rank_failed(r, "to check the program"));
        }
        let what = [
            "program (its files or params)",
            "estimator",
            "target",
            "config",
            "rank count",
            "est version",
            "train input's files (their sizes or contents)",
            "eval input's files (their sizes or contents)",
            "predict input's files (their sizes or contents)",
        ];
        let theirs =
            |b: &[u8]| String::from_utf8_lossy(b.get(9..).unwrap_or_default()).into_owned();
        let first = theirs(&all[0]);
        for (r, b) in all.iter().enumerate().skip(1) {
            let other = theirs(b);
            if other != first {
                let differs: Vec<&str> = (first.split('\n').zip(other.split('\n')))
                    .zip(what)
                    .filter(|((a, b), _)| a != b)
                    .map(|(_, w)| w)
                    .collect();
                return Err(Diag::new(
                    Code::RanksDisagree,
                    self.info.span,
                    format!(
                        "rank {r} runs another {} than rank 0",
                        differs.join(" and ")
                    ),
                )
                .label("this estimator, on rank 0")
                .help("every rank must run the same est, file, params, --config and --target on the same data: start them from one command line on identical copies of the files")
                .into());
            }
        }
        if group.size() as u64 != self.ranks {
            return Err(Diag::new(
                Code::RanksDisagree,
                self.info.span,
                format!(
                    "the estimator was checked for {} rank(s) and joins a run of {}",
                    self.ranks,
                    group.size()
                ),
            )
            .label("this estimator")
            .help("set `RunOptions::ranks` to the group's size")
            .into());
        }
        self.seed = crate::dist::read_u64(&all[0], &mut 1).unwrap_or(self.seed);
        if !group.chief() {
            self.hooks.retain(|h| !h.writes());
        }
        Ok(())
    }

    /// A fingerprint of the files the input of `mode` reads (`sources::fingerprint`;
    /// 0 when the mode has no input), which every rank of a run must share.
    fn input_fingerprint(&self, mode: SectionKind) -> u64 {
        (self.graphs.iter().find(|c| c.mode == mode))
            .and_then(|c| c.input.as_ref())
            .map_or(0, |ds| crate::data::sources::fingerprint(ds, &self.base))
    }

    /// The seconds this rank has spent in train steps' exchanges (`Peers::reduce`).
    pub(super) fn reduce_seconds(&self) -> f64 {
        self.group.as_ref().map_or(0.0, |g| g.spent.as_secs_f64())
    }

    /// This rank and the number of ranks: `(0, 1)` alone.
    pub fn rank(&self) -> (usize, usize) {
        self.group.as_ref().map_or((0, 1), |g| (g.rank(), g.size()))
    }

    /// Whether this estimator writes `model_dir`: alone, or as rank 0.
    pub fn chief(&self) -> bool {
        self.group.as_ref().is_none_or(Group::chief)
    }

    /// Tells the other ranks, waiting in a train step's exchange, that this rank
    /// failed before it (its input failed).
    pub(super) fn tell_failure(&mut self) {
        if let Some(g) = &mut self.group {
            let _ = g.reduce(None);
        }
    }

    /// Rank 0 could not take `model_dir` (or read it) before restoring: tells the other
    /// ranks, which wait for its state, and returns `f`.
    pub(super) fn tell_restore_failed(&mut self, f: RunFailure) -> RunFailure {
        if self.group.is_some() {
            // (in place of its readiness, the first exchange of `prepare`)
            let _ = self.exchange(Phase::State, &[FAILED]);
        }
        f
    }

    /// E0924: rank `r` failed `when`; it reports why itself.
    pub(super) fn rank_failed(&self, r: usize, when: &str) -> RunFailure {
        Diag::new(
            Code::RankFailed,
            self.info.span,
            format!("rank {r} failed {when}"),
        )
        .label("this estimator, on another rank")
        .help(format!("rank {r}'s own message says why; fix that and run the same command again (training resumes from the last checkpoint)"))
        .into()
    }

    pub(super) fn diverged(&self, d: &Diverged) -> RunFailure {
        Diag::new(Code::RankFailed, self.info.span, d.to_string())
            .label("this estimator")
            .help("a rank failed where the others could not see it; its own message says why")
            .into()
    }

    /// The next `ranks x per_rank` elements of the input, numbered from 0: how many
    /// there were (fewer at its end), and this rank's (rank-major: rank `r` takes
    /// `r * per_rank ..`), with their numbers. Alone, the next `per_rank`.
    pub(super) fn read_group(
        &self,
        pipe: &mut Pipeline,
        per_rank: usize,
    ) -> Res<(usize, Vec<(usize, Element)>)> {
        let (rank, ranks) = self.rank();
        let mine = rank * per_rank..(rank + 1) * per_rank;
        let mut out = Vec::with_capacity(per_rank);
        let mut present = 0;
        for i in 0..per_rank * ranks {
            match pipe.next_element()? {
                Some(e) => {
                    present += 1;
                    if mine.contains(&i) {
                        if e.is_empty() {
                            // (the pipeline's groups and these disagree: a bug)
                            return Err(self
                                .io_diag(format!(
                                    "element {i} of the input's group came without its values"
                                ))
                                .into());
                        }
                        out.push((i, e));
                    }
                }
                None => break,
            }
        }
        Ok((present, out))
    }

    /// Rank 0's state (after it restored or initialised it), as bytes.
    fn encode_state(&self) -> Vec<u8> {
        let vars = self.variables();
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        let mut out = Vec::new();
        for x in [
            self.step as u64,
            self.seed,
            self.input_position,
            self.max_shards,
            names.len() as u64,
        ] {
            out.extend(x.to_le_bytes());
        }
        for n in &names {
            out.extend((n.len() as u64).to_le_bytes());
            out.extend(n.as_bytes());
        }
        let ts: Vec<Tensor> = names.iter().map(|n| vars[*n].clone()).collect();
        crate::dist::encode(&ts, &mut out);
        out
    }

    /// Adopts rank 0's state (`encode_state`).
    fn adopt_state(&mut self, b: &[u8]) -> Res<()> {
        let bad = || self.io_diag("the state rank 0 sent could not be read".into());
        let mut at = 0;
        let mut next = || crate::dist::read_u64(b, &mut at).ok_or_else(bad);
        let (step, seed, pos, shards, n) = (next()?, next()?, next()?, next()?, next()?);
        let mut names = Vec::with_capacity(n.min(1 << 20) as usize);
        for _ in 0..n {
            let len = crate::dist::read_u64(b, &mut at).ok_or_else(bad)? as usize;
            let s = crate::dist::read_bytes(b, &mut at, len).ok_or_else(bad)?;
            names.push(String::from_utf8_lossy(s).into_owned());
        }
        let ts = crate::dist::decode(b, &mut at).ok_or_else(bad)?;
        let vars: FxHashMap<String, Tensor> = names.into_iter().zip(ts).collect();
        self.bind(vars)?;
        self.step = step as i64;
        self.seed = seed;
        self.input_position = pos;
        self.max_shards = shards;
        Ok(())
    }

    /// What a run needs of `model_dir` (`prepare_here`), on every rank: rank 0 restores
    /// or initialises, and the others take its state. A collective.
    pub(super) fn prepare(&mut self, need: super::restore::Need) -> Res<()> {
        let Some(chief) = self.group.as_ref().map(Group::chief) else {
            return self.prepare_here(need);
        };
        // every rank's readiness first: rank 0 sends its state to all when one lacks it
        let ready = self.exchange(Phase::State, &[u8::from(self.ready)])?;
        if ready[0].first() == Some(&FAILED) {
            return Err(self.rank_failed(0, "to take or read the model directory"));
        }
        let all_ready = ready.iter().all(|b| b.first() == Some(&1));
        let (mut msg, mut failure) = (Vec::new(), None);
        if chief {
            let was = self.ready;
            match self.prepare_here(need) {
                Ok(()) if was && all_ready => msg.push(1),
                Ok(()) => {
                    msg.push(2);
                    msg.extend(self.encode_state());
                }
                Err(f) => {
                    msg.push(0);
                    failure = Some(f);
                }
            }
        }
        let got = self.exchange(Phase::State, &msg)?;
        if let Some(f) = failure {
            return Err(f);
        }
        if chief {
            return Ok(());
        }
        let sent = &got[0];
        match sent.first() {
            Some(1) if self.ready => Ok(()),
            Some(2) => {
                self.dev()?;
                self.adopt_state(&sent[1..])?;
                self.ready = true;
                Ok(())
            }
            _ => Err(self.rank_failed(0, "to restore or initialise the model")),
        }
    }

    /// Every rank's payload of a tagged exchange (`exchange`); alone, this one's.
    pub(super) fn exchange(&mut self, phase: Phase, payload: &[u8]) -> Res<Vec<Vec<u8>>> {
        let Some(mut g) = self.group.take() else {
            return Ok(vec![payload.to_vec()]);
        };
        let got = exchange(&mut g, phase, payload);
        self.group = Some(g);
        got.map_err(|d| self.diverged(&d))
    }

    /// The end of a command on every rank (a collective): whether every rank
    /// completed it (`Some(true)`), or some failed (`Some(false)`); `None` when the
    /// ranks fell out of step and the job must end. Alone, `Some(ok)`.
    pub fn finish(&mut self, ok: bool) -> Option<bool> {
        let Some(g) = &mut self.group else {
            return Some(ok);
        };
        let all = exchange(g, Phase::End, &[u8::from(ok)]).ok()?;
        Some(all.iter().all(|b| b.first() == Some(&1)))
    }
}
