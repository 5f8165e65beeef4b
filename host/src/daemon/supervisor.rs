//! The lives of a host's pipelines: each runs independently (one failing
//! stops only itself) under a supervisor that pauses and resumes it on
//! request ([`PipelineControl`], what the admin API drives); shutdown reaches
//! all of them, and the host ends when the last one has.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tracing::Instrument;

use crate::checkpoint::Store;
use crate::event::Lsn;
use crate::sink::{AnySink, Sink as _};
use crate::source::stream::SourceStats;

use super::hotswap::ActiveChain;
use super::pipeline::{self, Handles, PipelineConfig, PipelineError, PipelineStats};
use super::prepare::Prepared;

/// How each pipeline ended.
#[derive(Debug, Default)]
pub(crate) struct Report {
    /// `(pipeline, outcome)`, in configuration order.
    pub pipelines: Vec<(String, Result<(), PipelineError>)>,
}

impl Report {
    /// Whether every pipeline stopped cleanly.
    pub(crate) fn ok(&self) -> bool {
        self.pipelines.iter().all(|(_, r)| r.is_ok())
    }
}

/// Where a pipeline is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PipelineState {
    /// Connecting, preparing the slot.
    Starting,
    /// Waiting for the leader lock another host holds (`leader_lock`).
    Standby,
    /// Streaming.
    Running,
    /// Paused on request: drained, checkpointed, disconnected.
    Paused,
    /// Stopped by an error (see the last error).
    Failed,
    /// Stopped by shutdown.
    Stopped,
}

impl PipelineState {
    /// The name the API and metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            PipelineState::Starting => "starting",
            PipelineState::Standby => "standby",
            PipelineState::Running => "running",
            PipelineState::Paused => "paused",
            PipelineState::Failed => "failed",
            PipelineState::Stopped => "stopped",
        }
    }
}

/// Rates over the last sampling interval, and since when nothing waited.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    batches: u64,
    changes: u64,
    batches_per_second: f64,
    changes_per_second: f64,
    caught_up_at: Instant,
}

/// A running pipeline, as the admin API sees and drives it.
#[derive(Debug)]
pub struct PipelineControl {
    /// The pipeline's name.
    pub name: String,
    /// The modules in force.
    pub chain: Arc<ActiveChain>,
    /// The canary beside them.
    pub canary: Arc<crate::daemon::canary::Canary>,
    /// The source's counters, across pauses.
    pub source_stats: Arc<SourceStats>,
    /// The pipeline's counters, across pauses.
    pub stats: Arc<PipelineStats>,
    state: watch::Sender<PipelineState>,
    pause: watch::Sender<bool>,
    handles: Mutex<Option<Handles>>,
    sample: Mutex<Sample>,
}

impl PipelineControl {
    fn new(config: &PipelineConfig) -> Arc<PipelineControl> {
        let now = Instant::now();
        let chain = config
            .chain
            .clone()
            .unwrap_or_else(|| ActiveChain::new(Vec::new(), Lsn::ZERO));
        Arc::new(PipelineControl {
            name: config.name.clone(),
            chain,
            canary: config.canary.clone(),
            source_stats: config.source_stats.clone(),
            stats: config.stats.clone(),
            state: watch::channel(PipelineState::Starting).0,
            pause: watch::channel(false).0,
            handles: Mutex::new(None),
            sample: Mutex::new(Sample {
                at: now,
                batches: 0,
                changes: 0,
                batches_per_second: 0.0,
                changes_per_second: 0.0,
                caught_up_at: now,
            }),
        })
    }

    /// The state now.
    pub fn state(&self) -> PipelineState {
        *self.state.borrow()
    }

    /// The current run's handles (None while paused or stopped).
    pub fn handles(&self) -> Option<Handles> {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Asks the pipeline to pause; returns once it has (or has ended).
    pub async fn pause(&self) -> PipelineState {
        self.pause.send_replace(true);
        let mut state = self.state.subscribe();
        let _ = state
            .wait_for(|s| {
                matches!(
                    s,
                    PipelineState::Paused | PipelineState::Failed | PipelineState::Stopped
                )
            })
            .await;
        self.state()
    }

    /// Asks a paused pipeline to resume; returns once it streams again (or
    /// has ended). `Err` with the state if it cannot resume.
    pub async fn resume(&self) -> Result<PipelineState, PipelineState> {
        let now = self.state();
        if matches!(now, PipelineState::Failed | PipelineState::Stopped) {
            return Err(now);
        }
        self.pause.send_replace(false);
        let mut state = self.state.subscribe();
        let _ = state
            .wait_for(|s| {
                matches!(
                    s,
                    PipelineState::Running | PipelineState::Failed | PipelineState::Stopped
                )
            })
            .await;
        Ok(self.state())
    }

    /// Rates (batches/s, changes/s) and seconds changes have waited.
    pub fn rates(&self) -> (f64, f64, f64) {
        let sample = *self.sample.lock().unwrap_or_else(|p| p.into_inner());
        let waiting = match self.handles() {
            Some(h) if !h.feedback.idle() => sample.caught_up_at.elapsed().as_secs_f64(),
            _ => 0.0,
        };
        (
            sample.batches_per_second,
            sample.changes_per_second,
            waiting,
        )
    }

    /// Samples the counters (called every second).
    fn tick(&self) {
        let now = Instant::now();
        let batches = self.stats.batches_written.load(Ordering::Relaxed);
        let changes = self.stats.changes_written.load(Ordering::Relaxed);
        let idle = self.handles().is_none_or(|h| h.feedback.idle());
        let mut sample = self.sample.lock().unwrap_or_else(|p| p.into_inner());
        let secs = now.duration_since(sample.at).as_secs_f64().max(1e-3);
        sample.batches_per_second = batches.saturating_sub(sample.batches) as f64 / secs;
        sample.changes_per_second = changes.saturating_sub(sample.changes) as f64 / secs;
        sample.batches = batches;
        sample.changes = changes;
        sample.at = now;
        if idle {
            sample.caught_up_at = now;
        }
    }

    fn set_state(&self, state: PipelineState) {
        self.state.send_replace(state);
    }
}

/// Runs one pipeline until `stop`, pausing and resuming it on request.
/// How often each pipeline's server is asked for its WAL position and
/// what its slot retains (for the lag in status and metrics).
const SERVER_POLL: Duration = Duration::from_secs(2);

/// Polls the source server, paused or not: `pg_current_wal_lsn()` and the
/// WAL the pipeline's slot retains, into `stats`. A failure is logged at
/// debug level and retried at the next poll on a new connection (the
/// pipeline reports its own connection problems).
async fn poll_server(conninfo: crate::pg::ConnInfo, slot: String, stats: Arc<SourceStats>) {
    let mut tick = tokio::time::interval(SERVER_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut client = None;
    loop {
        tick.tick().await;
        if client
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            client = crate::source::catalog::connect(&conninfo).await.ok();
        }
        let Some(connected) = &client else {
            continue;
        };
        let row = connected
            .query_one(
                "SELECT (pg_current_wal_lsn() - '0/0')::int8, \
                 (SELECT (pg_current_wal_lsn() - restart_lsn)::int8 \
                  FROM pg_replication_slots WHERE slot_name = $1)",
                &[&slot],
            )
            .await;
        match row {
            Ok(row) => {
                let server: i64 = row.try_get(0).unwrap_or(0);
                let retained: Option<i64> = row.try_get(1).unwrap_or(None);
                stats
                    .server_lsn
                    .fetch_max(u64::try_from(server).unwrap_or(0), Ordering::Relaxed);
                stats.slot_retained_bytes.store(
                    retained.and_then(|r| u64::try_from(r).ok()).unwrap_or(0),
                    Ordering::Relaxed,
                );
                stats
                    .server_polled_at
                    .store(crate::checkpoint::now_micros(), Ordering::Relaxed);
            }
            // A closed connection is replaced at the next poll.
            Err(err) => tracing::debug!(error = %err, "polling the server's WAL position failed"),
        }
    }
}

async fn supervise(
    control: Arc<PipelineControl>,
    config: PipelineConfig,
    store: Arc<Store>,
    mut sink: AnySink,
    mut stop: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let mut pause = control.pause.subscribe();
    // When another host last claimed the sink while this one still held
    // the lock: see `contested`.
    let mut overtaken_holding: Option<Instant> = None;
    // The lock, kept for the next run when this host was overtaken while
    // it still held it (it claims the sink again at once).
    let mut kept: Option<super::leader::Lease> = None;
    loop {
        if *pause.borrow() {
            // A paused host leaves the lead to a standby.
            kept = None;
            control.set_state(PipelineState::Paused);
            tracing::info!("paused");
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {
                    control.set_state(PipelineState::Stopped);
                    return Ok(());
                }
                _ = pause.wait_for(|p| !*p) => {}
            }
            tracing::info!("resuming");
        }
        if *stop.borrow() {
            control.set_state(PipelineState::Stopped);
            return Ok(());
        }
        let mut lease = kept.take();
        if config.leader_lock && lease.is_none() {
            control.set_state(PipelineState::Standby);
            let (mut stop_rx, mut pause_rx) = (stop.clone(), pause.clone());
            let cancel = async move {
                tokio::select! {
                    _ = stop_rx.wait_for(|s| *s) => {}
                    _ = pause_rx.wait_for(|p| *p) => {}
                }
            };
            let stats = control.stats.clone();
            lease = super::leader::acquire(
                &config.source.conninfo,
                &config.source.slot,
                &config.name,
                sink.fenced(),
                |why| stats.record_error(format!("standby: {why}")),
                cancel,
            )
            .await;
            if lease.is_none() {
                // Stopped or paused while standing by: the loop's top says
                // which.
                continue;
            }
        }
        if let Some(held) = lease.as_mut() {
            // Before the slot is read: the target refuses, from here on,
            // the writes of any host that led before.
            control.set_state(PipelineState::Starting);
            match take_over(&mut sink, &config, held, &stop, &pause, &control.stats).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(err) => {
                    control.set_state(PipelineState::Failed);
                    return Err(err);
                }
            }
        }
        control.set_state(PipelineState::Starting);
        let (started_tx, started_rx) = oneshot::channel();
        let (mut stop_rx, mut pause_rx) = (stop.clone(), pause.clone());
        let lost = lease.as_mut();
        let shutdown = async move {
            let lost = async move {
                match lost {
                    Some(lease) => lease.lost().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = stop_rx.wait_for(|s| *s) => {}
                _ = pause_rx.wait_for(|p| *p) => {}
                _ = lost => {}
            }
        };
        let started = async {
            if let Ok(handles) = started_rx.await {
                *control.handles.lock().unwrap_or_else(|p| p.into_inner()) = Some(handles);
                control.set_state(PipelineState::Running);
            }
        };
        let run = pipeline::run(
            config.clone(),
            store.clone(),
            &mut sink,
            Some(started_tx),
            shutdown,
        );
        let (outcome, ()) = tokio::join!(run, started);
        *control.handles.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if let Err(err) = outcome {
            // A drain cut short by its deadline after the lock was lost or
            // a pause asked for: what it left comes again; stand by or
            // pause as asked rather than fail.
            let interrupted = matches!(err, PipelineError::DrainTimeout { .. })
                && !*stop.borrow()
                && (lease.as_ref().is_some_and(|l| l.is_lost())
                    || sink.overtaken()
                    || *pause.borrow());
            control.stats.record_error(err.to_string());
            if !interrupted {
                control.set_state(PipelineState::Failed);
                return Err(err);
            }
            tracing::warn!(pipeline = %config.name, error = %err, "stopped with batches undelivered; they come again when it runs again");
        }
        let overtaken = sink.overtaken();
        if overtaken && !*stop.borrow() {
            // Another host claimed the target since. If this host no
            // longer holds the lock, that host leads: stand by. If it
            // still does, no host of this source could claim since, but
            // one that took the lock before it and froze before claiming
            // (once), or another source with the same fence (again and
            // again): claim again at once, and stop the second time.
            let holding = match lease.as_ref() {
                Some(held) => held.confirm().await,
                None => false,
            };
            if let Some(held) = lease.as_ref().filter(|_| holding) {
                if overtaken_holding.is_some_and(|at| at.elapsed() < CONTESTED_WITHIN) {
                    let err = contested(&config, held);
                    control.stats.record_error(err.to_string());
                    control.set_state(PipelineState::Failed);
                    return Err(err);
                }
                overtaken_holding = Some(Instant::now());
                tracing::warn!(pipeline = %config.name, "another host claimed the sink while this one holds the leader lock: claiming it again");
                if !*pause.borrow() {
                    kept = lease;
                    continue;
                }
            } else {
                tracing::warn!(pipeline = %config.name, "another host took over the sink: standing by");
            }
        }
        if (overtaken || lease.as_ref().is_some_and(|l| l.is_lost())) && !*stop.borrow() {
            // Drained and checkpointed after losing the lock: stand by.
            drop(lease);
            continue;
        }
        if *stop.borrow() || !*pause.borrow() {
            // Stopped by shutdown, or ended by itself (its sink's reader
            // went away): not to be restarted.
            control.set_state(PipelineState::Stopped);
            return Ok(());
        }
    }
}

/// Overtaken twice within this while holding the lock: not a host of this
/// pipeline that froze between taking the lock and claiming the sink
/// (a moment's window, and that host then stands by), but another source
/// claiming the same fence, or the fence's row deleted again and again.
const CONTESTED_WITHIN: Duration = Duration::from_secs(600);

/// The error of a fence that two sources claim (see `CONTESTED_WITHIN`).
fn contested(config: &PipelineConfig, lease: &super::leader::Lease) -> PipelineError {
    let holder = lease.holder_key(&config.source.slot);
    PipelineError::Sink(crate::sink::SinkError::definite(format!(
        "the sink's fence {holder} (the source's system identifier and the slot) was claimed \
         twice within {} minutes by a host that does not hold this pipeline's leader lock, \
         while this host held it: another source writes into the same target under the same \
         fence (a clone of this source, which keeps its system identifier, with a slot of the \
         same name). Give one of them another slot name (source.slot) and start it again; if \
         it was the fence's row that was deleted, start this pipeline again",
        CONTESTED_WITHIN.as_secs() / 60
    )))
}

/// Claims the sink for this host, which just took the leader lock
/// ([`crate::sink::Sink::take_over`]), retrying with back-off while the
/// target cannot be reached or the host that led before still writes.
/// False: stopped, paused or the lock lost first (the supervisor's loop
/// says what next); an error: the target refused the claim for good.
async fn take_over(
    sink: &mut AnySink,
    config: &PipelineConfig,
    lease: &mut super::leader::Lease,
    stop: &watch::Receiver<bool>,
    pause: &watch::Receiver<bool>,
    stats: &PipelineStats,
) -> Result<bool, PipelineError> {
    let (mut stop, mut pause) = (stop.clone(), pause.clone());
    let mut backoff = crate::retry::Backoff::new(config.sink_retry_initial, config.sink_retry_max);
    let holder = lease.holder_key(&config.source.slot);
    loop {
        let claimed = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return Ok(false),
            _ = pause.wait_for(|p| *p) => return Ok(false),
            _ = lease.lost() => return Ok(false),
            claimed = sink.take_over(&holder) => claimed,
        };
        match claimed {
            Ok(()) => return Ok(true),
            Err(err) if err.is_transient() => {
                let wait = backoff.next_wait();
                tracing::warn!(pipeline = %config.name, error = %err, retry_in = ?wait, "cannot claim the sink yet; retrying");
                stats.record_error(format!("claiming the sink: {err}"));
                tokio::select! {
                    biased;
                    _ = stop.wait_for(|s| *s) => return Ok(false),
                    _ = pause.wait_for(|p| *p) => return Ok(false),
                    _ = lease.lost() => return Ok(false),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            Err(err) => {
                let err = PipelineError::Sink(err);
                stats.record_error(err.to_string());
                return Err(err);
            }
        }
    }
}

/// Every pipeline of a host, each under its supervisor, the sampler of
/// their rates and the pollers of their servers.
#[derive(Debug)]
pub(crate) struct Supervisors {
    controls: Vec<Arc<PipelineControl>>,
    tasks: Vec<(String, tokio::task::JoinHandle<Result<(), PipelineError>>)>,
    sampler: tokio::task::JoinHandle<()>,
    pollers: Vec<tokio::task::JoinHandle<()>>,
}

impl Supervisors {
    /// Starts every pipeline; each runs until `stop` turns true.
    pub(crate) fn start(
        prepared: Vec<Prepared>,
        store: &Arc<Store>,
        stop: &watch::Receiver<bool>,
    ) -> Supervisors {
        let mut tasks = Vec::new();
        let mut controls = Vec::new();
        let mut pollers = Vec::new();
        for Prepared { config, sink } in prepared {
            let name = config.name.clone();
            let control = PipelineControl::new(&config);
            controls.push(control.clone());
            pollers.push(tokio::spawn(
                poll_server(
                    config.source.conninfo.clone(),
                    config.source.slot.clone(),
                    control.source_stats.clone(),
                )
                .instrument(tracing::info_span!("pipeline", pipeline = %name)),
            ));
            let span = tracing::info_span!("pipeline", pipeline = %name);
            let task = tokio::spawn(
                supervise(control, config, store.clone(), sink, stop.clone()).instrument(span),
            );
            tasks.push((name, task));
        }
        let sampler = {
            let controls = controls.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    for control in &controls {
                        control.tick();
                    }
                }
            })
        };
        Supervisors {
            controls,
            tasks,
            sampler,
            pollers,
        }
    }

    /// What the admin API drives: one control per pipeline.
    pub(crate) fn controls(&self) -> Vec<Arc<PipelineControl>> {
        self.controls.clone()
    }

    /// Waits until every pipeline has ended; how each did.
    pub(crate) async fn wait(self) -> Report {
        let mut report = Report::default();
        for (name, task) in self.tasks {
            let outcome = match task.await {
                Ok(outcome) => outcome,
                Err(err) => Err(PipelineError::Panicked {
                    stage: "pipeline",
                    message: super::pipeline::panic_message(err),
                }),
            };
            match &outcome {
                Ok(()) => tracing::info!(pipeline = %name, "pipeline ended"),
                Err(err) => tracing::error!(pipeline = %name, error = %err, "pipeline failed"),
            }
            report.pipelines.push((name, outcome));
        }
        self.sampler.abort();
        for poller in self.pollers {
            poller.abort();
        }
        report
    }
}
