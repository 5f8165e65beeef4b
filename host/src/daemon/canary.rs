//! Canary runs (`docs/canary.md`): a candidate version of one transform
//! runs beside the active chain on every live batch, its output compared
//! change by change with the active chain's, and then discarded.
//!
//! The transform thread hands each batch it transformed, with the active
//! output, to the canary's own thread through a bounded queue ([`Tap`]).
//! It never waits: when the canary falls behind, a batch is counted as not
//! compared, so the live stream's latency and checkpoint never depend on
//! the canary. The canary thread runs the pipeline's chain with the
//! candidate in its transform's place (the other transforms as they are
//! active, on instances of its own), compares the output with the active
//! output, and keeps the report. A failure of the candidate (a trap, a
//! timeout, memory) stops the canary and is reported; the pipeline goes
//! on. Promotion activates the candidate through the hot-swap path
//! (`hotswap.rs`), at the next transaction boundary, with the usual
//! activation record.
//!
//! The canary lives in the running host: a restart ends it (its version
//! stays in the registry, marked `canary`, and can be activated by a
//! rollback to it).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use datum_guest::wire::{Batch as WireBatch, Change as WireChange};
use serde_json::{Value as Json, json};

use super::hotswap::{self, ActiveChain, SwapError, Swapped};
use crate::checkpoint::Store;
use crate::event::{Batch, Lsn};
use crate::transform::chain::ChainError;
use crate::transform::chain::resolve;
use crate::transform::encode::Item;
use crate::transform::{Chain, Module, TransformError};

/// Batches that may wait for the canary; more are not compared.
const QUEUE_BATCHES: usize = 32;
/// Bytes (as batches count against the stage budgets) that may wait.
const QUEUE_BYTES: usize = 64 * 1024 * 1024;
/// Differences kept by default, and at most.
pub(crate) const KEEP_DEFAULT: usize = 10;
pub(crate) const KEEP_MAX: usize = 100;
/// A kept difference's diff is cut after this many bytes.
const DIFF_MAX: usize = 64 * 1024;
/// A difference whose batch is larger keeps its diff but not its fixture.
const FIXTURE_MAX_BYTES: usize = 8 * 1024 * 1024;

/// How a canary run ends by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Options {
    /// Promote after this many batches compared with no difference and no
    /// failure.
    pub promote_after: Option<u64>,
    /// Stop at the first difference.
    pub stop_on_difference: bool,
    /// Stop at the first failure of any kind (a trap, a timeout or running
    /// out of memory or fuel always stops it).
    pub abort_on_failure: bool,
    /// Differences kept with their diff and fixture.
    pub keep: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            promote_after: None,
            stop_on_difference: false,
            abort_on_failure: false,
            keep: KEEP_DEFAULT,
        }
    }
}

/// A canary's batches by result, for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batches {
    /// The transform.
    pub module: String,
    /// The canary's version.
    pub version: u64,
    /// `equal`, `different`, `failed` and `not_compared`, with their counts.
    pub results: [(&'static str, u64); 4],
}

/// A candidate, compiled, checked and stored as a version.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// The transform it is a version of.
    pub transform: String,
    /// Its version in the registry.
    pub version: u64,
    /// Compiled, with its configuration.
    pub module: Module,
    /// Its configuration, TOML text.
    pub config: String,
    /// Golden cases it passed when uploaded.
    pub fixtures: u64,
}

/// Where a canary run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Running,
    Promoting,
    Promoted,
    Stopped,
    Aborted,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Promoting => "promoting",
            State::Promoted => "promoted",
            State::Stopped => "stopped",
            State::Aborted => "aborted",
        }
    }
}

/// The canary of one pipeline (at most one at a time), beside its
/// [`ActiveChain`]; the last one's report stays until another starts.
#[derive(Debug, Default)]
pub struct Canary {
    /// Bumped whenever a run starts or stops feeding: the transform thread
    /// looks again at its next transaction boundary.
    generation: AtomicU64,
    next_id: AtomicU64,
    run: Mutex<Option<Run>>,
}

#[derive(Debug)]
struct Run {
    id: u64,
    candidate: Candidate,
    /// The transform's active version when the canary started.
    active_version: u64,
    options: Options,
    started_at: i64,
    /// The end LSN of the transaction after which batches were fed.
    after: Option<Lsn>,
    state: State,
    /// Why it ended.
    reason: Option<String>,
    /// When promoted: every transaction ending after this LSN goes through
    /// the candidate.
    effective_after: Option<Lsn>,
    queue: Arc<Queue>,
    report: Report,
}

impl Run {
    fn busy(&self) -> Option<String> {
        matches!(self.state, State::Running | State::Promoting).then(|| {
            format!(
                "a canary of `{}` (version {}) is {}: promote or abort it first",
                self.candidate.transform,
                self.candidate.version,
                self.state.name()
            )
        })
    }
}

#[derive(Debug, Default)]
struct Report {
    batches_compared: u64,
    batches_different: u64,
    changes_compared: u64,
    changes_different: u64,
    /// Differing changes per table (`schema.table`).
    by_table: BTreeMap<String, u64>,
    /// Batches the active chain failed on (not compared).
    active_failed: u64,
    /// Batches the canary's chain failed on (not compared).
    batches_failed: u64,
    failures: BTreeMap<&'static str, u64>,
    failure: Option<Json>,
    canary_cpu: Duration,
    active_time: Duration,
    differences: Vec<Difference>,
}

#[derive(Debug)]
struct Difference {
    xid: u32,
    commit_lsn: Lsn,
    chunk: u32,
    changes_different: u64,
    tables: Vec<String>,
    diff: String,
    /// The candidate's input and output, as a fixture records them.
    fixture: Option<(WireBatch, Vec<WireChange>)>,
}

impl Canary {
    fn lock(&self) -> MutexGuard<'_, Option<Run>> {
        self.run.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why another canary cannot start now: one runs, or is being
    /// promoted.
    pub(crate) fn busy(&self) -> Option<String> {
        self.lock().as_ref().and_then(Run::busy)
    }

    /// For the transform thread at a transaction boundary: the queue to
    /// feed, if a canary runs; a new one starts after `boundary`.
    fn attach(&self, boundary: Lsn) -> Option<Arc<Queue>> {
        let mut run = self.lock();
        let run = run.as_mut().filter(|r| r.state == State::Running)?;
        if run.after.is_none() {
            run.after = Some(boundary);
            tracing::info!(module = %run.candidate.transform, version = run.candidate.version, after = %boundary, "canary compares from here");
        }
        Some(run.queue.clone())
    }

    /// Ends run `id` (if it is still the current one and not ended), with
    /// `state` and `reason`.
    fn end(&self, id: u64, state: State, reason: String) {
        let mut run = self.lock();
        if let Some(run) = run.as_mut().filter(|r| r.id == id)
            && matches!(run.state, State::Running | State::Promoting)
        {
            run.state = state;
            run.reason = Some(reason);
            run.queue.close();
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Aborts the running canary.
    pub(crate) fn abort(&self) -> Result<Json, SwapError> {
        let id = {
            let run = self.lock();
            match run.as_ref() {
                Some(r) if r.state == State::Running => r.id,
                _ => return Err(nothing_running(run.as_ref())),
            }
        };
        self.end(id, State::Aborted, "aborted over the admin API".into());
        tracing::info!("canary aborted");
        self.report(false)
            .ok_or_else(|| SwapError::Internal("the canary's report vanished".into()))
    }

    /// For `/metrics`: the last canary's batches by result; None if no
    /// canary ran since the host started.
    pub(crate) fn batches(&self) -> Option<Batches> {
        let run = self.lock();
        let run = run.as_ref()?;
        let r = &run.report;
        Some(Batches {
            module: run.candidate.transform.clone(),
            version: run.candidate.version,
            results: [
                (
                    "equal",
                    r.batches_compared.saturating_sub(r.batches_different),
                ),
                ("different", r.batches_different),
                ("failed", r.batches_failed),
                ("not_compared", run.queue.behind()),
            ],
        })
    }

    /// The report: None if no canary ran since the host started.
    pub(crate) fn report(&self, with_differences: bool) -> Option<Json> {
        let run = self.lock();
        let run = run.as_ref()?;
        let behind = run.queue.behind();
        let r = &run.report;
        let seconds = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e6;
        let mut value = json!({
            "module": run.candidate.transform,
            "version": run.candidate.version,
            "sha256": run.candidate.module.sha256(),
            "active_version": run.active_version,
            "state": run.state.name(),
            "reason": run.reason,
            "started_at": run.started_at,
            "compared_after": run.after.map(|l| l.to_string()),
            "effective_after": run.effective_after.map(|l| l.to_string()),
            "options": {
                "promote_after": run.options.promote_after,
                "stop_on_difference": run.options.stop_on_difference,
                "abort_on_failure": run.options.abort_on_failure,
                "keep": run.options.keep,
            },
            "batches": {
                "compared": r.batches_compared,
                "equal": r.batches_compared.saturating_sub(r.batches_different),
                "different": r.batches_different,
                "not_compared": behind,
                "failed": r.batches_failed,
                "active_failed": r.active_failed,
            },
            "changes": {
                "compared": r.changes_compared,
                "different": r.changes_different,
                "different_by_table": r.by_table,
            },
            "failures": r.failures,
            "failure": r.failure,
            "cpu": {
                "canary_seconds": seconds(r.canary_cpu),
                "active_seconds": seconds(r.active_time),
            },
            "differences_kept": r.differences.len(),
        });
        if with_differences {
            value["differences"] = r
                .differences
                .iter()
                .enumerate()
                .map(|(index, d)| {
                    json!({
                        "index": index,
                        "xid": d.xid,
                        "commit_lsn": d.commit_lsn.to_string(),
                        "chunk": d.chunk,
                        "changes_different": d.changes_different,
                        "tables": d.tables,
                        "diff": d.diff,
                        "recordable": d.fixture.is_some(),
                    })
                })
                .collect();
        }
        Some(value)
    }

    /// Difference `index` as a fixture: the candidate's input batch and
    /// its output, and its configuration.
    pub(crate) fn fixture(&self, index: usize) -> Result<Json, SwapError> {
        let run = self.lock();
        let run = run.as_ref().ok_or_else(|| {
            SwapError::NotFound("no canary has run since the host started".into())
        })?;
        let difference = run.report.differences.get(index).ok_or_else(|| {
            SwapError::NotFound(format!(
                "the canary kept {} differences; there is no difference {index}",
                run.report.differences.len()
            ))
        })?;
        let (input, output) = difference.fixture.as_ref().ok_or_else(|| {
            SwapError::NotFound(format!(
                "difference {index}'s batch was larger than {FIXTURE_MAX_BYTES} bytes: only its \
                 diff was kept"
            ))
        })?;
        let expected: Json = serde_json::from_str(
            &crate::golden::Actual::Changes(output.clone()).to_expected_json(),
        )
        .unwrap_or_default();
        Ok(json!({
            "name": format!("canary-{}-v{}-{}", run.candidate.transform, run.candidate.version, index),
            "input": serde_json::to_value(crate::event::json::BatchJson(input)).unwrap_or_default(),
            "expected": expected,
            "config": run.candidate.config,
        }))
    }
}

fn nothing_running(run: Option<&Run>) -> SwapError {
    SwapError::Conflict(match run {
        None => "no canary runs: start one with `datum admin swap --canary`".into(),
        Some(r) => format!(
            "the canary of `{}` (version {}) is {}, not running",
            r.candidate.transform,
            r.candidate.version,
            r.state.name()
        ),
    })
}

/// Starts a canary of `candidate` on `chain`'s pipeline; its report.
pub(crate) fn start(
    store: &Arc<Store>,
    chain: &Arc<ActiveChain>,
    canary: &Arc<Canary>,
    pipeline: &str,
    candidate: Candidate,
    options: Options,
) -> Result<Json, SwapError> {
    let active_version = chain
        .info()
        .iter()
        .find(|s| s.name == candidate.transform)
        .map(|s| s.version)
        .ok_or_else(|| {
            SwapError::NotFound(format!(
                "pipeline `{pipeline}` has no transform named `{}`",
                candidate.transform
            ))
        })?;
    let runtime = tokio::runtime::Handle::try_current()
        .map_err(|e| SwapError::Internal(format!("starting a canary outside the runtime: {e}")))?;
    let queue = Arc::new(Queue::default());
    let id = canary.next_id.fetch_add(1, Ordering::Relaxed);
    {
        let mut run = canary.lock();
        if let Some(busy) = run.as_ref().and_then(Run::busy) {
            return Err(SwapError::Conflict(busy));
        }
        *run = Some(Run {
            id,
            candidate: candidate.clone(),
            active_version,
            options,
            started_at: crate::checkpoint::now_micros(),
            after: None,
            state: State::Running,
            reason: None,
            effective_after: None,
            queue: queue.clone(),
            report: Report::default(),
        });
    }
    let transform = candidate.transform.clone();
    let worker = Worker {
        chain: chain.clone(),
        canary: canary.clone(),
        store: store.clone(),
        pipeline: pipeline.to_owned(),
        runtime,
        id,
        candidate,
        queue,
        options,
    };
    let spawned = std::thread::Builder::new()
        .name(format!("datum-canary-{pipeline}"))
        .stack_size(crate::transform::engine::CALLER_STACK)
        .spawn(move || {
            // A panic in the canary's thread ends the canary, said so in its
            // report; the stream never depended on it.
            let (canary, id) = (worker.canary.clone(), worker.id);
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.run()));
            if let Err(panic) = ran {
                let message = super::pipeline::payload_message(panic.as_ref());
                tracing::error!(%message, "the canary's thread panicked; the canary is stopped");
                canary.end(
                    id,
                    State::Stopped,
                    format!("its thread panicked: {message}"),
                );
            }
        });
    if let Err(e) = spawned {
        canary.end(
            id,
            State::Stopped,
            format!("could not start its thread: {e}"),
        );
        return Err(SwapError::Internal(format!(
            "starting the canary's thread: {e}"
        )));
    }
    canary.generation.fetch_add(1, Ordering::AcqRel);
    tracing::info!(pipeline, module = %transform, "canary started");
    canary
        .report(false)
        .ok_or_else(|| SwapError::Internal("the canary's report vanished".into()))
}

/// Promotes the running canary: it becomes the transform's active version
/// at the next transaction boundary.
pub(crate) async fn promote(
    store: &Arc<Store>,
    chain: &ActiveChain,
    canary: &Canary,
    pipeline: &str,
    why: &str,
) -> Result<Swapped, SwapError> {
    let (id, candidate) = {
        let mut run = canary.lock();
        let Some(r) = run.as_mut().filter(|r| r.state == State::Running) else {
            return Err(nothing_running(run.as_ref()));
        };
        r.state = State::Promoting;
        r.queue.close();
        (r.id, r.candidate.clone())
    };
    canary.generation.fetch_add(1, Ordering::AcqRel);
    let slot = chain
        .slots()
        .into_iter()
        .find(|s| s.name == candidate.transform);
    let result = match slot {
        Some(slot) => {
            hotswap::activate(
                store,
                chain,
                pipeline,
                slot,
                candidate.module,
                candidate.version,
                candidate.config,
                candidate.fixtures,
            )
            .await
        }
        None => Err(SwapError::NotFound(format!(
            "pipeline `{pipeline}` has no transform named `{}`",
            candidate.transform
        ))),
    };
    let mut run = canary.lock();
    if let Some(r) = run.as_mut().filter(|r| r.id == id) {
        match &result {
            Ok(swapped) => {
                r.state = State::Promoted;
                r.reason = Some(why.to_owned());
                r.effective_after = swapped.effective_after.parse().ok();
            }
            Err(e) => {
                r.state = State::Stopped;
                r.reason = Some(format!("promotion failed: {e}"));
            }
        }
    }
    result
}

/// The transform thread's side: feeds the canary, never waiting for it.
#[derive(Debug)]
pub(crate) struct Tap {
    generation: u64,
    queue: Option<Arc<Queue>>,
    modules: Arc<[Module]>,
}

impl Tap {
    /// A tap for a transform thread running `chain`.
    pub(crate) fn new(chain: &Chain) -> Tap {
        Tap {
            generation: u64::MAX,
            queue: None,
            modules: chain.modules().cloned().collect(),
        }
    }

    /// The transform thread adopted `chain`.
    pub(crate) fn adopted(&mut self, chain: &Chain) {
        self.modules = chain.modules().cloned().collect();
    }

    /// Between transactions: follows a canary started or ended since.
    pub(crate) fn boundary(&mut self, canary: &Canary, boundary: Lsn) {
        let generation = canary.generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.generation = generation;
            self.queue = canary.attach(boundary);
        }
    }

    /// Whether a canary is fed.
    pub(crate) fn feeding(&self) -> bool {
        self.queue.is_some()
    }

    /// Offers a transformed batch: its source, the active output (or the
    /// active chain's failure) and the time the active chain took.
    pub(crate) fn offer(
        &mut self,
        batch: &Batch,
        active: Result<&[Item], ()>,
        took: Duration,
        bytes: usize,
    ) {
        let Some(queue) = &self.queue else {
            return;
        };
        let modules = &self.modules;
        let open = queue.push(bytes, || Job {
            batch: batch.clone(),
            active: active.map(<[Item]>::to_vec),
            took,
            modules: modules.clone(),
            bytes,
        });
        if !open {
            self.queue = None;
        }
    }
}

#[derive(Debug)]
struct Job {
    batch: Batch,
    /// The active chain's output; Err when it failed on the batch.
    active: Result<Vec<Item>, ()>,
    took: Duration,
    modules: Arc<[Module]>,
    bytes: usize,
}

#[derive(Debug, Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Debug, Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    bytes: usize,
    closed: bool,
    behind: u64,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues the job `make` makes if there is room (else counts a batch
    /// not compared); false once the queue is closed.
    fn push(&self, bytes: usize, make: impl FnOnce() -> Job) -> bool {
        let mut state = self.lock();
        if state.closed {
            return false;
        }
        // One batch larger than the budget still goes when nothing waits.
        let room = state.jobs.is_empty()
            || (state.jobs.len() < QUEUE_BATCHES && state.bytes + bytes <= QUEUE_BYTES);
        if !room {
            state.behind += 1;
            return true;
        }
        state.bytes += bytes;
        state.jobs.push_back(make());
        drop(state);
        self.ready.notify_one();
        true
    }

    /// The next job; None once closed (what waits is dropped).
    fn pop(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.closed {
                state.jobs.clear();
                state.bytes = 0;
                return None;
            }
            if let Some(job) = state.jobs.pop_front() {
                state.bytes = state.bytes.saturating_sub(job.bytes);
                return Some(job);
            }
            state = self.ready.wait(state).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    fn behind(&self) -> u64 {
        self.lock().behind
    }
}

/// The canary's thread.
struct Worker {
    chain: Arc<ActiveChain>,
    canary: Arc<Canary>,
    store: Arc<Store>,
    pipeline: String,
    runtime: tokio::runtime::Handle,
    id: u64,
    candidate: Candidate,
    queue: Arc<Queue>,
    options: Options,
}

/// The chain with the candidate in its transform's place, in three parts so
/// the candidate's own input and output can be kept for a fixture.
struct Parts {
    /// The active chain these parts were made from.
    from: Arc<[Module]>,
    before: Chain,
    candidate: Chain,
    after: Chain,
}

/// What the candidate's chain made of one batch.
struct Outcome {
    input: Vec<Item>,
    output: Vec<Item>,
    last: Vec<Item>,
}

impl Worker {
    fn run(self) {
        let span = tracing::info_span!("canary", pipeline = %self.pipeline, module = %self.candidate.transform, version = self.candidate.version);
        let _entered = span.enter();
        let mut parts: Option<Parts> = None;
        while let Some(job) = self.queue.pop() {
            let Ok(active) = &job.active else {
                self.update(|r| r.active_failed += 1);
                continue;
            };
            if !parts
                .as_ref()
                .is_some_and(|p| Arc::ptr_eq(&p.from, &job.modules))
            {
                match self.parts(&job.modules) {
                    Some(made) => parts = Some(made),
                    None => {
                        let reason = format!(
                            "the pipeline no longer runs a transform named `{}`",
                            self.candidate.transform
                        );
                        self.canary.end(self.id, State::Stopped, reason);
                        return;
                    }
                }
            }
            let Some(p) = parts.as_mut() else {
                return;
            };
            let started = thread_cpu();
            let outcome = run_parts(p, &job.batch);
            let cpu = thread_cpu().saturating_sub(started);
            match outcome {
                Err(error) => {
                    if !self.failed(&job, &error, cpu) {
                        return;
                    }
                }
                Ok(outcome) => {
                    if !self.compared(&job, active, outcome, cpu) {
                        return;
                    }
                }
            }
        }
    }

    fn parts(&self, modules: &Arc<[Module]>) -> Option<Parts> {
        let at = modules
            .iter()
            .position(|m| m.name() == self.candidate.transform)?;
        Some(Parts {
            from: modules.clone(),
            before: Chain::new(&modules[..at]),
            candidate: Chain::new(std::slice::from_ref(&self.candidate.module)),
            after: Chain::new(&modules[at + 1..]),
        })
    }

    fn update(&self, f: impl FnOnce(&mut Report)) {
        let mut run = self.canary.lock();
        if let Some(run) = run.as_mut().filter(|r| r.id == self.id) {
            f(&mut run.report);
        }
    }

    /// Records a failure of the canary's chain; false once that ended the
    /// run: always for a trap, a timeout or running out of memory or fuel,
    /// and for anything with `abort_on_failure`.
    fn failed(&self, job: &Job, error: &ChainError, cpu: Duration) -> bool {
        let kind = error.error.kind();
        let stop = self.options.abort_on_failure
            || matches!(
                error.error,
                TransformError::Trap { .. }
                    | TransformError::Timeout(_)
                    | TransformError::OutOfMemory(_)
                    | TransformError::OutOfFuel(_)
            );
        let txn = &job.batch.txn;
        let failure = json!({
            "kind": kind,
            "module": error.module,
            "message": error.error.to_string(),
            "xid": txn.xid,
            "commit_lsn": Lsn(txn.commit_lsn).to_string(),
        });
        self.update(|r| {
            *r.failures.entry(kind).or_default() += 1;
            r.batches_failed += 1;
            r.failure = Some(failure);
            r.canary_cpu += cpu;
            r.active_time += job.took;
        });
        if !stop {
            tracing::debug!(error = %error, xid = txn.xid, "the canary failed on a batch; counted, and it goes on");
            return true;
        }
        tracing::warn!(error = %error, xid = txn.xid, commit_lsn = %Lsn(txn.commit_lsn), "the canary failed and is stopped; the pipeline goes on");
        self.canary.end(
            self.id,
            State::Stopped,
            format!("failed ({kind}) on transaction {}", txn.xid),
        );
        false
    }

    /// Compares and records; false once the run is over.
    fn compared(&self, job: &Job, active: &[Item], outcome: Outcome, cpu: Duration) -> bool {
        let batch = &job.batch;
        let compared = compare(batch, active, &outcome.last);
        let keep = compared.different > 0 && {
            let run = self.canary.lock();
            run.as_ref()
                .is_some_and(|r| r.id == self.id && r.report.differences.len() < self.options.keep)
        };
        let difference = keep.then(|| self.difference(batch, active, &outcome, &compared));
        let mut next = Next::Continue;
        {
            let mut run = self.canary.lock();
            let Some(run) = run.as_mut().filter(|r| r.id == self.id) else {
                return false;
            };
            let r = &mut run.report;
            r.batches_compared += 1;
            r.changes_compared += compared.changes;
            r.canary_cpu += cpu;
            r.active_time += job.took;
            if compared.different > 0 {
                r.batches_different += 1;
                r.changes_different += compared.different;
                for (table, n) in compared.tables {
                    *r.by_table.entry(table).or_default() += n;
                }
                if let Some(d) = difference {
                    r.differences.push(d);
                }
                if self.options.stop_on_difference {
                    next = Next::Stop(format!(
                        "stopped at the first difference (transaction {})",
                        batch.txn.xid
                    ));
                }
            } else if let Some(after) = self.options.promote_after
                && r.batches_different == 0
                && r.batches_failed == 0
                && r.batches_compared >= after
            {
                next = Next::Promote;
            }
        }
        match next {
            Next::Continue => true,
            Next::Stop(reason) => {
                tracing::info!(%reason, "canary stopped");
                self.canary.end(self.id, State::Stopped, reason);
                false
            }
            Next::Promote => {
                let (store, chain, canary, pipeline) = (
                    self.store.clone(),
                    self.chain.clone(),
                    self.canary.clone(),
                    self.pipeline.clone(),
                );
                let why = format!(
                    "promoted automatically after {} batches with no difference",
                    self.options.promote_after.unwrap_or_default()
                );
                self.runtime.spawn(async move {
                    match promote(&store, &chain, &canary, &pipeline, &why).await {
                        Ok(s) => {
                            tracing::info!(pipeline = %pipeline, version = s.version, after = %s.effective_after, "{why}")
                        }
                        Err(e) => {
                            tracing::warn!(pipeline = %pipeline, error = %e, "automatic promotion of the canary failed")
                        }
                    }
                });
                false
            }
        }
    }

    fn difference(
        &self,
        batch: &Batch,
        active: &[Item],
        outcome: &Outcome,
        compared: &Compared,
    ) -> Difference {
        let wire = |items: &[Item]| -> Vec<WireChange> {
            items.iter().map(|i| resolve(i, batch).to_wire()).collect()
        };
        let active_label = format!("active (version {})", self.active_version_label());
        let canary_label = format!("canary (version {})", self.candidate.version);
        let mut diff = crate::golden::diff_outputs(
            (&active_label, &wire(active)),
            (&canary_label, &wire(&outcome.last)),
        );
        if diff.len() > DIFF_MAX {
            let mut cut = DIFF_MAX;
            while !diff.is_char_boundary(cut) {
                cut -= 1;
            }
            let more = diff[cut..].lines().count();
            diff.truncate(cut);
            diff.push_str(&format!("\n... ({more} more lines)\n"));
        }
        let fixture = (batch.bytes <= FIXTURE_MAX_BYTES).then(|| {
            (
                WireBatch {
                    txn: batch.txn,
                    changes: wire(&outcome.input),
                },
                wire(&outcome.output),
            )
        });
        Difference {
            xid: batch.txn.xid,
            commit_lsn: Lsn(batch.txn.commit_lsn),
            chunk: batch.txn.chunk,
            changes_different: compared.different,
            tables: compared.tables.keys().cloned().collect(),
            diff,
            fixture,
        }
    }

    fn active_version_label(&self) -> String {
        self.chain
            .info()
            .iter()
            .find(|s| s.name == self.candidate.transform)
            .map_or_else(|| "?".into(), |s| s.version.to_string())
    }
}

enum Next {
    Continue,
    Stop(String),
    Promote,
}

fn run_parts(parts: &mut Parts, batch: &Batch) -> Result<Outcome, ChainError> {
    let all = (0..batch.changes.len()).map(Item::Source).collect();
    let input = parts.before.run_on(batch, all)?;
    let output = parts.candidate.run_on(batch, input.clone())?;
    let last = if parts.after.modules().next().is_none() {
        output.clone()
    } else {
        parts.after.run_on(batch, output.clone())?
    };
    Ok(Outcome {
        input,
        output,
        last,
    })
}

/// How two outputs of one batch differ, position by position.
#[derive(Debug, Default, PartialEq, Eq)]
struct Compared {
    /// Positions compared: the longer output's length.
    changes: u64,
    /// Positions whose changes differ (or that one output lacks).
    different: u64,
    /// Differing positions per table.
    tables: BTreeMap<String, u64>,
}

fn compare(batch: &Batch, active: &[Item], canary: &[Item]) -> Compared {
    let mut compared = Compared {
        changes: active.len().max(canary.len()) as u64,
        ..Compared::default()
    };
    for i in 0..active.len().max(canary.len()) {
        let (a, c) = (active.get(i), canary.get(i));
        let same = match (a, c) {
            (Some(a), Some(c)) if a == c => true,
            (Some(a), Some(c)) => crate::golden::same_change(
                &resolve(a, batch).to_wire(),
                &resolve(c, batch).to_wire(),
            ),
            _ => false,
        };
        if !same {
            compared.different += 1;
            if let Some(item) = a.or(c) {
                let change = resolve(item, batch).to_wire();
                *compared
                    .tables
                    .entry(format!("{}.{}", change.schema, change.table))
                    .or_default() += 1;
            }
        }
    }
    compared
}

/// CPU time this thread used.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Change, Column, Relation, ReplicaIdentity};
    use datum_guest::{Txn, Value};

    fn relation(table: &str) -> Arc<Relation> {
        Arc::new(Relation {
            oid: 1,
            schema: "public".into(),
            table: table.into(),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![Column::new("id", "int4", true)],
        })
    }

    fn insert(table: &str, id: i64) -> Change {
        Change::Insert {
            relation: relation(table),
            new: vec![Value::Int(id)],
        }
    }

    fn batch(changes: Vec<Change>) -> Batch {
        Batch {
            txn: Txn::committed(7, 100),
            changes,
            bytes: 10,
        }
    }

    #[test]
    fn outputs_are_compared_position_by_position_and_blamed_on_their_table() {
        let b = batch(vec![insert("a", 1), insert("b", 2), insert("a", 3)]);
        let same = [Item::Source(0), Item::Source(1), Item::Source(2)];
        assert_eq!(
            compare(&b, &same, &same),
            Compared {
                changes: 3,
                ..Compared::default()
            }
        );
        // A module's change equal to the source change is the same change.
        let rebuilt = [
            Item::Wire(Box::new(crate::transform::encode::to_wire(&b.changes[0]))),
            Item::Source(1),
            Item::Source(2),
        ];
        assert_eq!(compare(&b, &same, &rebuilt).different, 0);
        // One output drops the last change and swaps the first: two
        // positions differ, both blamed on `a` (the active side's table).
        let other = [Item::Source(2), Item::Source(1)];
        let compared = compare(&b, &same, &other);
        assert_eq!(compared.changes, 3);
        assert_eq!(compared.different, 2);
        assert_eq!(
            compared.tables,
            BTreeMap::from([("public.a".to_owned(), 2)])
        );
        // An output the active chain lacks is blamed on the canary's table.
        let more = [
            Item::Source(0),
            Item::Source(1),
            Item::Source(2),
            Item::Source(1),
        ];
        let compared = compare(&b, &same, &more);
        assert_eq!(
            compared.tables,
            BTreeMap::from([("public.b".to_owned(), 1)])
        );
    }

    fn job(bytes: usize) -> Job {
        Job {
            batch: batch(Vec::new()),
            active: Ok(Vec::new()),
            took: Duration::ZERO,
            modules: Arc::from(Vec::new()),
            bytes,
        }
    }

    #[test]
    fn a_full_queue_counts_batches_not_compared_and_a_closed_one_says_so() {
        let queue = Queue::default();
        for _ in 0..QUEUE_BATCHES {
            assert!(queue.push(1, || job(1)));
        }
        assert!(queue.push(1, || panic!("no job is made when there is no room")));
        assert_eq!(queue.behind(), 1);
        assert!(queue.pop().is_some());
        assert!(queue.push(1, || job(1)));
        assert_eq!(queue.behind(), 1);
        queue.close();
        assert!(!queue.push(1, || job(1)));
        assert!(queue.pop().is_none(), "what waited is dropped");
    }

    #[test]
    fn one_batch_larger_than_the_byte_budget_goes_when_nothing_waits() {
        let queue = Queue::default();
        assert!(queue.push(QUEUE_BYTES * 2, || job(QUEUE_BYTES * 2)));
        assert!(queue.push(1, || panic!("over the byte budget")));
        assert_eq!(queue.behind(), 1);
        assert!(queue.pop().is_some());
        assert_eq!(queue.lock().bytes, 0);
    }
}
