//! One pipeline: source, transforms, sink, and the acknowledgements between
//! them that move the checkpoint (`docs/architecture.md`).
//!
//! Owns the wiring and the order of events: read the checkpoint, prepare the
//! slot (refusing when changes were lost, unless told to recreate it), stream
//! batches through the module chain and the sink, acknowledge each to the
//! feedback coordinator once the sink has it durably (or once `on_error` has
//! dealt with it), and let the commit loop persist the watermark before
//! PostgreSQL hears of it.
//!
//! Stages are joined by bounded channels, so back-pressure reaches the
//! socket: the source (a thread and runtime of its own, see
//! `spawn_source`), the transforms (a thread of their own: they are
//! CPU-bound and must not stall the async workers), the sink (a task).
//! Several batches are in flight at once; the feedback coordinator keeps
//! checkpoints in commit order whatever order acknowledgements come in.
//!
//! A sink error is retried with capped exponential back-off and never
//! advances the checkpoint. A module failure, or a batch the sink refuses
//! definitely (an HTTP 400), follows `on_error`: `fail`
//! stops the pipeline without acknowledging the batch, `skip` acknowledges
//! it unwritten, `dead_letter` stores it in the state file first. Shutdown
//! stops the source, drains what is in flight within `drain_timeout`,
//! commits the checkpoint and returns.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::channel;
use crate::checkpoint::{ALL_TABLES, CheckpointError, Offset, SnapshotProgress, Store};
use crate::config::OnError;
use crate::config::SnapshotMode;
use crate::daemon::canary::Canary;
use crate::daemon::commit::{self, CommitPolicy};
use crate::daemon::feedback::Feedback;
use crate::daemon::hotswap::{ActiveChain, Slot};
use crate::daemon::snapshot::{self, SnapshotPolicy, Snapshots};
use crate::daemon::transforms::{self, Ack, Receipt, Staged};
use crate::event::Batch;
use crate::retry::Backoff;
use crate::sink::{Sink, SinkError};
use crate::source::shapes::{Shapes, Tracker};
use crate::source::stream::SourceStats;
use crate::source::{self, SourceConfig, SourceError};
use crate::transform::chain::ChainError;
use crate::transform::encode::{ChangeRef, encode_input};
use crate::transform::{Module, Transformed};

/// How a pipeline runs.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The pipeline's name: its key in the state file, and in logs.
    pub name: String,
    /// Where changes come from.
    pub source: SourceConfig,
    /// The modules every batch goes through, in order (none: batches go to
    /// the sink as the source produced them).
    pub modules: Vec<Module>,
    /// What a module failure does.
    pub on_error: OnError,
    /// Batches buffered between each two stages.
    pub channel_capacity: usize,
    /// How checkpoints are committed.
    pub commit: CommitPolicy,
    /// First delay before retrying a failed sink write; doubles up to
    /// `sink_retry_max`.
    pub sink_retry_initial: Duration,
    /// Longest delay between sink retries.
    pub sink_retry_max: Duration,
    /// On shutdown, how long batches in flight may take to reach the sink.
    pub drain_timeout: Duration,
    /// When the slot exists but the state file has no record of the
    /// pipeline: stream from the slot's position instead of refusing.
    pub adopt_slot: bool,
    /// Stream only while holding the pipeline's leader lock
    /// (`daemon::leader`); the slot's position then outranks an older
    /// checkpoint in the state file (another host streamed meanwhile).
    pub leader_lock: bool,
    /// The hot-swappable chain (`crate::daemon::hotswap`); when `None`, one is made
    /// from `modules`, outside the registry (version 0).
    pub chain: Option<Arc<ActiveChain>>,
    /// The pipeline's canary (`crate::daemon::canary`), shared by clones
    /// of this configuration, so it outlives a pause.
    pub canary: Arc<Canary>,
    /// The source's counters (shared by clones of this configuration, so
    /// they outlive a pause).
    pub source_stats: Arc<SourceStats>,
    /// The pipeline's counters (likewise).
    pub stats: Arc<PipelineStats>,
    /// How existing rows are copied (`never` unless set: the configuration
    /// file's default, `initial`, is applied by `daemon::prepare`).
    pub snapshot: SnapshotPolicy,
}

impl PipelineConfig {
    /// The source's configuration as the pipeline runs it. Under the
    /// leader lock the slot is shared with other hosts: one that confirmed
    /// it past this host's position (before this host started, or while it
    /// was starting) is followed rather than refused.
    fn source_config(&self) -> SourceConfig {
        SourceConfig {
            follow_slot: self.source.follow_slot || self.leader_lock,
            ..self.source.clone()
        }
    }

    /// A pipeline without modules, with default buffering, commit policy,
    /// retries and error policy (`fail`).
    pub fn new(name: &str, source: SourceConfig) -> PipelineConfig {
        PipelineConfig {
            name: name.to_owned(),
            source,
            modules: Vec::new(),
            on_error: OnError::Fail,
            channel_capacity: 4,
            commit: CommitPolicy::default(),
            sink_retry_initial: Duration::from_millis(100),
            sink_retry_max: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(10),
            adopt_slot: false,
            leader_lock: false,
            chain: None,
            canary: Arc::default(),
            source_stats: Arc::default(),
            stats: Arc::default(),
            snapshot: SnapshotPolicy {
                mode: SnapshotMode::Never,
                ..SnapshotPolicy::default()
            },
        }
    }
}

/// Why a pipeline stopped.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The source failed definitely.
    #[error("source: {0}")]
    Source(#[from] SourceError),
    /// The state file failed.
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] CheckpointError),
    /// The sink refused a batch definitely.
    #[error("sink: {0}")]
    Sink(#[from] SinkError),
    /// Shutdown did not finish within `drain_timeout` (a module call, a
    /// sink write or a state-file commit that did not end); everything after `checkpoint`
    /// is delivered again after the next start.
    #[error(
        "did not stop within drain_timeout ({timeout:?}); the checkpoint stays at {checkpoint} \
         and what came after it is delivered again on the next start"
    )]
    DrainTimeout {
        /// The configured bound.
        timeout: Duration,
        /// The last durable checkpoint.
        checkpoint: crate::event::Lsn,
    },
    /// The slot exists, but the state file has no record of the pipeline.
    #[error(
        "replication slot {slot} already exists, but the state file {} has no record of this \
         pipeline: it is new, empty or not the file this pipeline used (its dead letters and \
         module versions would be missing too). If {} is the file you mean, set \
         source.adopt_slot = true to stream from the slot's position (what the slot already \
         confirmed is not delivered again); otherwise point `state` at the right file",
        state.display(),
        state.display()
    )]
    UnknownSlot {
        /// The slot.
        slot: String,
        /// The state file.
        state: std::path::PathBuf,
    },
    /// A stage of the pipeline panicked: a bug in Datum, never a reaction
    /// to data. Nothing after the checkpoint was acknowledged.
    #[error("the {stage} stage panicked: {message} (a bug in Datum; please report it)")]
    Panicked {
        /// The stage: `source`, `transforms`, `sink` or `pipeline`.
        stage: &'static str,
        /// What the panic said.
        message: String,
    },
    /// A module failed and `on_error` is `fail`.
    #[error("transform (batch xid {xid}, commit {commit_lsn}): {error}")]
    Transform {
        /// The failing batch's transaction.
        xid: u32,
        /// Its commit LSN.
        commit_lsn: crate::event::Lsn,
        /// The failure.
        error: ChainError,
    },
}

/// A running pipeline's counters.
#[derive(Debug, Default)]
pub struct PipelineStats {
    /// Batches the sink acknowledged.
    pub batches_written: AtomicU64,
    /// Changes in them (after the transforms).
    pub changes_written: AtomicU64,
    /// Batches a module failed on.
    pub module_failures: AtomicU64,
    /// Of those, skipped under `on_error = "skip"`.
    pub skipped: AtomicU64,
    /// Of those, stored under `on_error = "dead_letter"`.
    pub dead_letters: AtomicU64,
    /// Sink writes retried.
    pub sink_retries: AtomicU64,
    /// Schema changes put in the stream (`source/shapes.rs`).
    pub schema_changes: AtomicU64,
    /// Time spent in the modules, µs.
    pub transform_micros: AtomicU64,
    /// Batches by time spent in the modules: `TRANSFORM_BUCKETS[i]` µs or
    /// less (not cumulative); the last counts the rest.
    pub transform_hist: [AtomicU64; TRANSFORM_BUCKETS.len() + 1],
    /// Module failures by kind (`TransformError::kind`).
    pub failures_by_kind: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Bytes the sink wrote (for sinks that count them).
    pub bytes_written: AtomicU64,
    /// The last failure (a module's, or the sink's), with when it happened
    /// (µs since the Unix epoch).
    pub last_error: std::sync::Mutex<Option<(String, i64)>>,
}

/// Upper bounds of the transform-time histogram, µs.
pub(crate) const TRANSFORM_BUCKETS: [u64; 10] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 50_000, 250_000,
];

impl PipelineStats {
    pub(crate) fn observe_transform(&self, micros: u64) {
        self.transform_micros.fetch_add(micros, Ordering::Relaxed);
        let bucket = TRANSFORM_BUCKETS
            .iter()
            .position(|b| micros <= *b)
            .unwrap_or(TRANSFORM_BUCKETS.len());
        self.transform_hist[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// Records a failure as the last error.
    pub fn record_error(&self, message: String) {
        *self.last_error.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((message, crate::checkpoint::now_micros()));
    }
}

/// What a running pipeline exposes.
#[derive(Debug, Clone)]
pub struct Handles {
    /// The feedback coordinator (watermark, flushed position).
    pub feedback: Arc<Feedback>,
    /// The source's counters.
    pub stats: Arc<SourceStats>,
    /// The pipeline's counters.
    pub pipeline: Arc<PipelineStats>,
    /// The modules in force, for hot swap.
    pub chain: Arc<ActiveChain>,
    /// Writes a batch (a replayed dead letter) to the sink, outside the
    /// stream: no checkpoint moves.
    pub replay: mpsc::Sender<Replay>,
    /// The tables being copied.
    pub snapshots: Arc<Snapshots>,
}

/// A batch to write to the sink outside the stream, and where to say how
/// it went.
#[derive(Debug)]
pub struct Replay {
    /// The batch, transformed.
    pub batch: Transformed,
    /// The sink's answer (one attempt).
    pub done: tokio::sync::oneshot::Sender<Result<(), SinkError>>,
}

/// Most batches the sink writes as one group (a group also closes at one
/// full batch's cost, `channel::cost`).
pub(crate) const GROUP_MAX_BATCHES: usize = 1024;

/// Runs the pipeline until `shutdown` completes or it fails definitely.
/// `started` receives the pipeline's handles once streaming begins.
///
/// Three steps: find where to resume (`start_position`), start the
/// stages (`Stages::start`) and deliver what they produce to the sink
/// (`Delivery::run`), then stop the stages within the drain deadline
/// (`Stages::stop`).
pub async fn run<S: Sink>(
    config: PipelineConfig,
    store: Arc<Store>,
    mut sink: S,
    started: Option<tokio::sync::oneshot::Sender<Handles>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PipelineError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let Some((offset, source)) = start_position(&config, &store, shutdown.as_mut()).await? else {
        return Ok(());
    };
    let stream = source
        .system_identifier
        .map(|id| format!("{id}/{}", config.source.slot));
    sink.follow(stream.as_deref(), source.fresh);
    let chain = active_chain(&config, offset);
    tracing::info!(pipeline = %config.name, resume_after = %offset.end_lsn, modules = chain.info().len(), "pipeline starting");

    let (mut stages, staged) = Stages::start(&config, &store, &chain, offset);
    let (replay_tx, replays) = mpsc::channel::<Replay>(1);
    if let Some(started) = started {
        let _ = started.send(Handles {
            feedback: stages.feedback.clone(),
            stats: config.source_stats.clone(),
            pipeline: config.stats.clone(),
            chain: chain.clone(),
            replay: replay_tx,
            snapshots: stages.snapshots.clone(),
        });
    }
    let mut delivery = Delivery {
        config: &config,
        store: &store,
        feedback: &stages.feedback,
        counters: &config.stats,
        sink,
        staged,
        replays,
        queue: VecDeque::new(),
        singly: 0,
        group_failed: None,
        ungrouped_until: None,
        drain: Drain {
            stop_source: &stages.stop_source,
            deadline: None,
            gave_up: false,
        },
    };
    let outcome = delivery
        .run(shutdown.as_mut(), &mut stages.source_task)
        .await;
    let Drain {
        deadline, gave_up, ..
    } = delivery.drain;
    // The transform thread ends once nothing reads what it produces.
    drop(delivery);
    stages.stop(&config, deadline, gave_up, outcome).await
}

/// What the sink is told of the stream it receives ([`Sink::follow`]).
struct StreamSource {
    /// The source's system identifier, when it could be read.
    system_identifier: Option<String>,
    /// The slot was created (or recreated) for this run.
    fresh: bool,
}

/// Where the pipeline resumes: its checkpoint, once the source is prepared
/// (which retries while the server cannot be reached), and what the sink
/// is told of the stream. A slot the state file has never heard of is
/// refused unless `adopt_slot`; a recreated slot starts over. `None`:
/// shutdown came first.
async fn start_position(
    config: &PipelineConfig,
    store: &Store,
    shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<(Offset, StreamSource)>, PipelineError> {
    let name = &config.name;
    let checkpoint = store.offset(name)?;
    let Some(prepared) = prepare_source(config, store, checkpoint, shutdown).await? else {
        return Ok(None);
    };
    if checkpoint.is_none() && !prepared.created_slot {
        // The slot exists, but the state file has never heard of this
        // pipeline: a new or emptied file, or the wrong path. Starting over
        // silently would hide that (and the dead letters and module
        // versions the right file holds).
        if !config.adopt_slot && !config.leader_lock {
            return Err(PipelineError::UnknownSlot {
                slot: config.source.slot.clone(),
                state: store.path().to_owned(),
            });
        }
        tracing::warn!(pipeline = %name, slot = %config.source.slot, confirmed = ?prepared.confirmed_flush, "adopting the existing slot: streaming from its position (adopt_slot or leader_lock)");
        store.commit_offset(name, Offset::default())?;
    }
    let mut offset = checkpoint.unwrap_or_default();
    if config.leader_lock
        && let Some(confirmed) = prepared.confirmed_flush
        && confirmed != offset.end_lsn
    {
        // Under the leader lock the slot's position is the one the hosts
        // share: a host confirms it only once its sink has everything
        // before it. Past this host's checkpoint: another host streamed
        // since. Behind it: this host stopped before confirming, and
        // another may since have replayed from the slot into the target,
        // taking rows back to older values; resuming from this host's own
        // checkpoint would leave them there.
        let behind = confirmed < offset.end_lsn;
        offset = Offset {
            end_lsn: confirmed,
            commit_lsn: confirmed,
            ..Offset::default()
        };
        if behind {
            tracing::info!(pipeline = %name, checkpoint = %checkpoint.unwrap_or_default().end_lsn, %confirmed, "the slot is behind this host's checkpoint: resuming from the slot, delivering the changes between again (another host may have replayed them since)");
            store.rewind_offset(name, offset)?;
        } else {
            tracing::info!(pipeline = %name, checkpoint = %checkpoint.unwrap_or_default().end_lsn, %confirmed, "taking over the slot at its position");
            store.reset_offset(name, offset)?;
        }
    }
    if prepared.resync_needed {
        tracing::warn!(pipeline = %name, "the slot was recreated: resynchronise the target");
        offset = Offset::default();
        store.reset_offset(name, offset)?;
        if config.snapshot.mode == SnapshotMode::Initial {
            tracing::warn!(pipeline = %name, "the slot was recreated: every table is copied again (snapshot mode = \"initial\")");
            snapshot::request_all(store, name)?;
        }
    }
    let source = StreamSource {
        system_identifier: prepared.system_identifier,
        fresh: prepared.created_slot || prepared.resync_needed,
    };
    Ok(Some((offset, source)))
}

/// The modules in force: the hot-swappable chain the configuration brings,
/// or one made from its modules outside the registry (version 0).
fn active_chain(config: &PipelineConfig, offset: Offset) -> Arc<ActiveChain> {
    match &config.chain {
        Some(chain) => chain.clone(),
        None => ActiveChain::new(
            config
                .modules
                .iter()
                .map(|m| Slot {
                    name: m.name().to_owned(),
                    key: String::new(),
                    module: m.clone(),
                    version: 0,
                    config: String::new(),
                    limits: m.limits(),
                })
                .collect(),
            offset.end_lsn,
        ),
    }
}

/// Completes when `rx` says stop.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Sleeps until the drain deadline, if there is one; forever otherwise.
async fn drain_over(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The stages that run beside the sink: the source (a thread of its own),
/// the transforms (a thread of their own) and the commit loop (a task),
/// and the switches that stop them in order.
struct Stages {
    feedback: Arc<Feedback>,
    snapshots: Arc<Snapshots>,
    /// Copies tables (`daemon::snapshot::run`).
    copier: tokio::task::JoinHandle<()>,
    source_task: tokio::task::JoinHandle<Result<(), PipelineError>>,
    transformer: std::thread::JoinHandle<()>,
    committer: tokio::task::JoinHandle<()>,
    /// Stops the source reading.
    stop_source: watch::Sender<bool>,
    /// Makes the commit loop commit what is left and end.
    stop_commits: watch::Sender<bool>,
    /// Tells the source the final checkpoint is committed, so it confirms
    /// it to the slot and closes.
    settle_source: watch::Sender<bool>,
}

impl Stages {
    /// Starts the stages, resuming after `offset`; the receiver of what the
    /// transforms produce.
    fn start(
        config: &PipelineConfig,
        store: &Arc<Store>,
        chain: &Arc<ActiveChain>,
        offset: Offset,
    ) -> (Stages, channel::Receiver<Staged>) {
        let name = &config.name;
        let feedback = Feedback::new(offset);
        let snapshots = Snapshots::new(name);
        let shapes = Shapes::new(store.relation_shapes(name).unwrap_or_else(|err| {
            tracing::warn!(pipeline = %name, error = %err, "cannot read the table shapes kept in the state file; schema changes are compared from the next Relation messages");
            Vec::new()
        }));
        let (stop_source, source_stopped) = watch::channel(false);
        let (stop_commits, commits_stopped) = watch::channel(false);
        let (settle_source, source_settled) = watch::channel(false);
        let failures = config.stats.clone();
        let committer = tokio::spawn(commit::commit_loop(
            store.clone(),
            name.clone(),
            feedback.clone(),
            commit::Consistent {
                snapshots: snapshots.clone(),
                shapes: shapes.clone(),
            },
            config.commit,
            move |err| failures.record_error(format!("checkpoint: {err}")),
            stopped(commits_stopped),
        ));
        // Each channel holds `in_flight` batches' worth of bytes (at the
        // source's batch limit) rather than `in_flight` batches: small
        // transactions queue up while a stage is busy and are then taken in
        // one go — the sink writes them as one group, one fsync.
        let capacity = config.channel_capacity.max(1);
        let limits = config.source.limits;
        let bytes = capacity.saturating_mul(limits.max_bytes.max(1));
        let (source_tx, source_rx) = channel::channel(capacity * GROUP_MAX_BATCHES, bytes);
        let (staged_tx, staged_rx) = channel::channel(capacity * GROUP_MAX_BATCHES, bytes);
        let source_task = spawn_source(
            name,
            source::stream::run(
                config.source_config(),
                offset.end_lsn,
                source_tx,
                feedback.clone(),
                config.source_stats.clone(),
                stopped(source_stopped),
                stopped(source_settled),
            ),
        );
        let transformer = transforms::spawn(
            config,
            chain,
            offset.end_lsn,
            (source_rx, staged_tx),
            &snapshots,
            Tracker::new(Some(shapes)),
        );
        let copier = tokio::spawn(snapshot::run(
            snapshots.clone(),
            config.source.clone(),
            store.clone(),
            config.snapshot,
        ));
        let stages = Stages {
            feedback,
            snapshots,
            copier,
            source_task,
            transformer,
            committer,
            stop_source,
            stop_commits,
            settle_source,
        };
        (stages, staged_rx)
    }

    /// Stops reading (if not yet), lets the stages end and commits what the
    /// sink acknowledged — all before the drain deadline (set by shutdown,
    /// else `drain_timeout` from now): a module call or a state-file commit
    /// that does not end must not keep the host from exiting. What is not
    /// committed by then is delivered again after the next start. The
    /// source stays connected until the final commit, then confirms it to
    /// the slot.
    async fn stop(
        self,
        config: &PipelineConfig,
        deadline: Option<tokio::time::Instant>,
        gave_up: bool,
        outcome: Result<(), PipelineError>,
    ) -> Result<(), PipelineError> {
        let Stages {
            feedback,
            snapshots: _,
            copier,
            source_task,
            transformer,
            committer,
            stop_source,
            stop_commits,
            settle_source,
        } = self;
        copier.abort();
        let _ = stop_source.send(true);
        let deadline =
            deadline.unwrap_or_else(|| tokio::time::Instant::now() + config.drain_timeout);
        let committer_abort = committer.abort_handle();
        let mut transforms_panic = None;
        let teardown = async {
            if let Ok(Err(payload)) = tokio::task::spawn_blocking(move || transformer.join()).await
            {
                transforms_panic = Some(payload_message(payload.as_ref()));
            }
            let _ = stop_commits.send(true);
            let _ = committer.await;
            let _ = settle_source.send(true);
            if !source_task.is_finished() {
                let _ = source_task.await;
            }
        };
        if tokio::time::timeout_at(deadline, teardown).await.is_err() {
            committer_abort.abort();
            let checkpoint = feedback.flushed();
            tracing::error!(pipeline = %config.name, %checkpoint, drain_timeout = ?config.drain_timeout, "the pipeline did not stop within drain_timeout; leaving the rest for the next start");
            return Err(outcome.err().unwrap_or(PipelineError::DrainTimeout {
                timeout: config.drain_timeout,
                checkpoint,
            }));
        }
        tracing::info!(pipeline = %config.name, checkpoint = %feedback.flushed(), "pipeline stopped");
        if gave_up && outcome.is_ok() && transforms_panic.is_none() {
            // Stopped in time, but with batches the sink never took.
            return Err(PipelineError::DrainTimeout {
                timeout: config.drain_timeout,
                checkpoint: feedback.flushed(),
            });
        }
        match transforms_panic {
            // The transform thread's end closed the channel the sink stage
            // reads, so the outcome does not say why.
            Some(message) => Err(PipelineError::Panicked {
                stage: "transforms",
                message,
            }),
            None => outcome,
        }
    }
}

/// The sink stage: transformed batches in commit order to the sink — the
/// ones waiting together as one group write — with transient failures
/// retried, definite ones and module failures handed to `on_error`, and
/// each batch acknowledged to the feedback coordinator once dealt with.
struct Delivery<'a, S> {
    config: &'a PipelineConfig,
    store: &'a Arc<Store>,
    feedback: &'a Feedback,
    counters: &'a PipelineStats,
    sink: S,
    staged: channel::Receiver<Staged>,
    replays: mpsc::Receiver<Replay>,
    /// Batches taken from the channel but not yet delivered.
    queue: VecDeque<Staged>,
    /// How many at the front of `queue` go one at a time (a group write
    /// failed).
    singly: usize,
    /// A group's write was refused (definitely): whether its batches, one
    /// at a time, are all written at once.
    group_failed: Option<GroupFailed>,
    /// Until when batches go one at a time because a group failed only
    /// as a group (`GROUPS_PAUSED_FOR`).
    ungrouped_until: Option<tokio::time::Instant>,
    drain: Drain<'a>,
}

/// A group write refused definitely, while its batches go one at a time
/// (`singly` counts those not taken yet).
struct GroupFailed {
    error: String,
    batches: usize,
    /// Each so far written at its first attempt.
    clean: bool,
}

/// How long batches go one at a time after a group failed only as a group
/// (a refusal, then each of its batches written alone at once): a target
/// that refuses some batches together (a PostgreSQL target's deferred
/// trigger events and a `TRUNCATE` in one transaction, its lock table full
/// with many tables in one) would otherwise have every such group written
/// twice.
const GROUPS_PAUSED_FOR: Duration = Duration::from_secs(60);

/// Shutdown's drain: the source stops reading, and what is in flight has
/// until the deadline to reach the sink.
struct Drain<'a> {
    /// Tells the source to stop reading.
    stop_source: &'a watch::Sender<bool>,
    /// Set when shutdown began: when draining gives up.
    deadline: Option<tokio::time::Instant>,
    /// The deadline passed with batches undelivered.
    gave_up: bool,
}

impl Drain<'_> {
    /// Shutdown began: the source stops reading (what is in flight still
    /// reaches the sink) and the deadline starts.
    fn begin(&mut self, config: &PipelineConfig) {
        tracing::info!(pipeline = %config.name, "stopping: draining batches in flight");
        let _ = self.stop_source.send(true);
        self.deadline = Some(tokio::time::Instant::now() + config.drain_timeout);
    }

    /// Whether shutdown began.
    fn began(&self) -> bool {
        self.deadline.is_some()
    }
}

/// How often a sink write that has not returned is reported.
const SLOW_WRITE: Duration = Duration::from_secs(30);

/// Awaits a sink write while watching shutdown and the drain deadline.
/// Shutdown during the write begins the drain, and the write goes on; one
/// that has not returned by the deadline (a lock on the target, a receiver
/// that stopped answering) is given up: `None`, its batches are not
/// acknowledged and are written again at the next start. A write that
/// takes long is reported every `SLOW_WRITE`, in the log and the status.
async fn watched<T, F: Future<Output = ()>>(
    write: impl Future<Output = T>,
    mut shutdown: Pin<&mut F>,
    drain: &mut Drain<'_>,
    config: &PipelineConfig,
    counters: &PipelineStats,
) -> Option<T> {
    let mut write = std::pin::pin!(write);
    let started = tokio::time::Instant::now();
    let mut report = tokio::time::interval_at(started + SLOW_WRITE, SLOW_WRITE);
    loop {
        tokio::select! {
            biased;
            result = write.as_mut() => return Some(result),
            _ = shutdown.as_mut(), if !drain.began() => drain.begin(config),
            _ = drain_over(drain.deadline) => {
                drain.gave_up = true;
                tracing::warn!(pipeline = %config.name, "a sink write still unfinished at the drain timeout is given up; its batches are written again at the next start");
                return None;
            }
            _ = report.tick() => {
                let waited = started.elapsed().as_secs();
                tracing::warn!(pipeline = %config.name, waited_s = waited, "a sink write has not returned yet; still waiting (a lock on a target table, a receiver that stopped answering?)");
                counters.record_error(format!("sink: a write has not returned after {waited} s"));
            }
        }
    }
}

/// What the sink stage does next.
enum Step {
    /// Deliver this.
    Deliver(Staged),
    /// Look again (shutdown began).
    Again,
    /// Write a dead letter again, outside the stream.
    Replay(Replay),
    /// The drain deadline passed.
    DrainOver,
    /// The transforms passed on everything they had: the source ended.
    SourceEnded,
}

impl<S: Sink> Delivery<'_, S> {
    /// Delivers until the source ends (stopped, or a definite error), the
    /// drain deadline passes, the sink's reader goes away, or a batch fails
    /// definitely under `on_error = "fail"`.
    async fn run<F: Future<Output = ()>>(
        &mut self,
        mut shutdown: Pin<&mut F>,
        source_task: &mut tokio::task::JoinHandle<Result<(), PipelineError>>,
    ) -> Result<(), PipelineError> {
        loop {
            let staged = match self.queue.pop_front() {
                Some(staged) => staged,
                None => match self.next(shutdown.as_mut()).await {
                    Step::Deliver(staged) => staged,
                    Step::Again => continue,
                    Step::Replay(replay) => {
                        if !self.replay(replay, shutdown.as_mut()).await {
                            return Ok(());
                        }
                        continue;
                    }
                    Step::DrainOver => return Ok(()),
                    Step::SourceEnded if self.drain.began() => return Ok(()),
                    Step::SourceEnded => {
                        return match source_task.await {
                            Ok(result) => result,
                            Err(err) => Err(PipelineError::Panicked {
                                stage: "source",
                                message: panic_message(err),
                            }),
                        };
                    }
                },
            };
            let (transformed, receipt) = match staged {
                Staged::Failed(batch, error, ack, version) => {
                    self.module_failed(batch, error, ack, version).await?;
                    continue;
                }
                Staged::Ready(transformed, receipt) => (transformed, receipt),
            };
            if transformed.source.changes.is_empty() && transformed.is_empty() {
                // Nothing to write (a transaction that carried only a
                // snapshot watermark): acknowledged as written.
                self.written(std::slice::from_ref(&transformed), &[receipt]);
                continue;
            }
            let ungrouped = self
                .ungrouped_until
                .is_some_and(|until| tokio::time::Instant::now() < until);
            let (single, receipt) = if self.singly > 0 || ungrouped {
                self.singly = self.singly.saturating_sub(1);
                (transformed, receipt)
            } else {
                let (mut group, mut receipts) = self.take_group(transformed, receipt);
                if group.len() > 1 {
                    if !self.write_group(group, receipts, shutdown.as_mut()).await {
                        return Ok(());
                    }
                    continue;
                }
                match (group.pop(), receipts.pop()) {
                    (Some(transformed), Some(receipt)) => (transformed, receipt),
                    _ => continue,
                }
            };
            if !self.write_one(single, receipt, shutdown.as_mut()).await? {
                return Ok(());
            }
            self.one_of_a_failed_group_written();
        }
    }

    /// A batch was dealt with one at a time: once every batch of a refused
    /// group was written at its first attempt, the group failed only as a
    /// group; said in the log, and batches go one at a time for a while.
    fn one_of_a_failed_group_written(&mut self) {
        if self.singly > 0 {
            return;
        }
        let Some(failed) = self.group_failed.take() else {
            return;
        };
        if failed.clean {
            tracing::warn!(
                pipeline = %self.config.name,
                error = %failed.error,
                batches = failed.batches,
                pause = ?GROUPS_PAUSED_FOR,
                "the sink refused batches written together but took each alone; writing one \
                 at a time for a while (see the error for what the target refuses together)"
            );
            self.ungrouped_until = Some(tokio::time::Instant::now() + GROUPS_PAUSED_FOR);
        }
    }

    /// Waits for the next thing to do: a batch, shutdown (stop the source,
    /// start the drain deadline), the deadline, or a dead letter to replay.
    async fn next<F: Future<Output = ()>>(&mut self, shutdown: Pin<&mut F>) -> Step {
        tokio::select! {
            biased;
            _ = shutdown, if !self.drain.began() => {
                self.drain.begin(self.config);
                Step::Again
            }
            _ = drain_over(self.drain.deadline) => {
                self.drain.gave_up = true;
                tracing::warn!(pipeline = %self.config.name, "batches still in flight at the drain timeout are left for the next start");
                Step::DrainOver
            }
            Some(replay) = self.replays.recv() => Step::Replay(replay),
            staged = self.staged.recv() => match staged {
                Some(staged) => Step::Deliver(staged),
                None => Step::SourceEnded,
            },
        }
    }

    /// `first` and the transformed batches waiting behind it, up to a
    /// group's limits, each with what delivering it acknowledges; a batch a
    /// module failed on ends the group.
    fn take_group(
        &mut self,
        first: Transformed,
        receipt: Receipt,
    ) -> (Vec<Transformed>, Vec<Receipt>) {
        let limits = self.config.source.limits;
        let mut bytes = first.source.cost(limits);
        let mut group = vec![first];
        let mut receipts = vec![receipt];
        while group.len() < GROUP_MAX_BATCHES && bytes < limits.max_bytes {
            let next = match self.queue.pop_front() {
                Some(staged) => staged,
                None => match self.staged.try_recv() {
                    Some(staged) => staged,
                    None => break,
                },
            };
            match next {
                Staged::Ready(next, receipt) => {
                    bytes += next.source.cost(limits);
                    group.push(next);
                    receipts.push(receipt);
                }
                failed => {
                    self.queue.push_front(failed);
                    break;
                }
            }
        }
        (group, receipts)
    }

    /// Writes a dead letter again, at once and outside the stream (no
    /// checkpoint moves), answering the replay with the sink's answer.
    /// False: the drain deadline passed first, or another host took the
    /// sink over.
    async fn replay<F: Future<Output = ()>>(
        &mut self,
        replay: Replay,
        shutdown: Pin<&mut F>,
    ) -> bool {
        let write = self.sink.write_outside(&replay.batch);
        let Some(result) =
            watched(write, shutdown, &mut self.drain, self.config, self.counters).await
        else {
            self.sink.abandon().await;
            let _ = replay.done.send(Err(SinkError::transient(
                "the pipeline stopped before the sink answered; replay the dead letter again",
            )));
            return false;
        };
        if result.is_ok() {
            self.counters
                .bytes_written
                .store(self.sink.bytes_written(), Ordering::Relaxed);
        }
        let fenced = matches!(&result, Err(err) if err.is_fenced());
        if let Err(err) = &result
            && fenced
        {
            self.overtaken(err);
        }
        let _ = replay.done.send(result);
        !fenced
    }

    /// Writes a group as one. When that fails, its batches go back to the
    /// front of the queue to be written one at a time, each with its own
    /// retries and `on_error`. False: the drain deadline passed during the
    /// write, or another host took the sink over (nothing of the group is
    /// acknowledged).
    async fn write_group<F: Future<Output = ()>>(
        &mut self,
        group: Vec<Transformed>,
        receipts: Vec<Receipt>,
        shutdown: Pin<&mut F>,
    ) -> bool {
        let write = self.sink.write_group(&group);
        let Some(result) =
            watched(write, shutdown, &mut self.drain, self.config, self.counters).await
        else {
            self.sink.abandon().await;
            return false;
        };
        match result {
            Ok(()) => self.written(&group, &receipts),
            Err(err) if err.is_fenced() => {
                self.overtaken(&err);
                return false;
            }
            Err(err) => {
                self.counters.sink_retries.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(pipeline = %self.config.name, error = %err, batches = group.len(), "group write failed; writing its batches one at a time");
                self.singly = group.len();
                // A passing failure says nothing about the group itself.
                self.group_failed = (!err.is_transient()).then(|| GroupFailed {
                    error: err.to_string(),
                    batches: group.len(),
                    clean: true,
                });
                for (transformed, receipt) in group.into_iter().zip(receipts).rev() {
                    self.queue.push_front(Staged::Ready(transformed, receipt));
                }
            }
        }
        true
    }

    /// Writes one batch, retrying a transient failure with back-off, and
    /// acknowledges it once it is written or `on_error` dealt with a
    /// refusal. `Ok(false)`: the pipeline is stopping (shutdown or the drain
    /// deadline during a retry, the sink's reader went away, or another
    /// host took the sink over) and the batch is not acknowledged.
    async fn write_one<F: Future<Output = ()>>(
        &mut self,
        transformed: Transformed,
        receipt: Receipt,
        mut shutdown: Pin<&mut F>,
    ) -> Result<bool, PipelineError> {
        let name = &self.config.name;
        let mut backoff = Backoff::new(self.config.sink_retry_initial, self.config.sink_retry_max);
        let mut announced = false;
        let refused = loop {
            let write = self.sink.write(&transformed);
            let Some(result) = watched(
                write,
                shutdown.as_mut(),
                &mut self.drain,
                self.config,
                self.counters,
            )
            .await
            else {
                self.sink.abandon().await;
                return Ok(false);
            };
            match result {
                Ok(()) => {
                    self.written(std::slice::from_ref(&transformed), &[receipt]);
                    return Ok(true);
                }
                Err(err) if err.is_transient() => {
                    self.counters.sink_retries.fetch_add(1, Ordering::Relaxed);
                    if let Some(failed) = &mut self.group_failed {
                        failed.clean = false;
                    }
                    let wait = backoff.next_wait();
                    tracing::warn!(pipeline = %name, error = %err, retry_in = ?wait, "sink write failed; retrying");
                    if !announced {
                        // Once per write, so that an outage's retries do
                        // not bury what came before it.
                        self.counters
                            .record_error(format!("sink (retrying): {err}"));
                        announced = true;
                    }
                    let stop = tokio::select! {
                        biased;
                        _ = shutdown.as_mut(), if !self.drain.began() => true,
                        _ = drain_over(self.drain.deadline) => true,
                        _ = tokio::time::sleep(wait) => false,
                    };
                    if stop {
                        return Ok(false);
                    }
                }
                Err(err) if err.is_gone() => {
                    tracing::info!(pipeline = %name, reason = %err, "the sink's reader went away; stopping");
                    return Ok(false);
                }
                Err(err) if err.is_fenced() => {
                    self.overtaken(&err);
                    return Ok(false);
                }
                Err(err) => break err,
            }
        };
        // A definite refusal follows `on_error`, like a module failure.
        if let Some(failed) = &mut self.group_failed {
            failed.clean = false;
        }
        self.counters.record_error(format!("sink: {refused}"));
        handle_failure(
            self.config,
            self.store,
            self.counters,
            &transformed.source,
            Failure::Sink(refused, receipt.version),
        )
        .await?;
        if let Some(txn) = receipt.ack.acknowledges(transformed.txn()) {
            self.feedback.ack(&txn);
        }
        Ok(true)
    }

    /// Another host took the sink over (`SinkError::Fenced`): said in the
    /// log and the last error; the pipeline stops, acknowledging nothing
    /// more, and its supervisor stands it by.
    fn overtaken(&self, err: &SinkError) {
        tracing::warn!(pipeline = %self.config.name, reason = %err, "another host took over the sink; stopping");
        self.counters.record_error(format!("sink: {err}"));
    }

    /// Counts `batches` as written and acknowledges each whose receipt
    /// says so (a part before the last of a batch does not).
    fn written(&self, batches: &[Transformed], receipts: &[Receipt]) {
        self.counters
            .bytes_written
            .store(self.sink.bytes_written(), Ordering::Relaxed);
        for (transformed, receipt) in batches.iter().zip(receipts) {
            self.counters
                .changes_written
                .fetch_add(transformed.len() as u64, Ordering::Relaxed);
            if let Some(txn) = receipt.ack.acknowledges(transformed.txn()) {
                self.counters
                    .batches_written
                    .fetch_add(1, Ordering::Relaxed);
                self.feedback.ack(&txn);
            }
        }
    }

    /// A module failed on `batch`: counted, recorded, handed to
    /// `on_error`, and acknowledged when that dealt with it.
    async fn module_failed(
        &mut self,
        batch: Batch,
        error: ChainError,
        ack: Ack,
        version: u64,
    ) -> Result<(), PipelineError> {
        self.counters
            .module_failures
            .fetch_add(1, Ordering::Relaxed);
        *self
            .counters
            .failures_by_kind
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(error.error.kind())
            .or_default() += 1;
        self.counters.record_error(error.to_string());
        handle_failure(
            self.config,
            self.store,
            self.counters,
            &batch,
            Failure::Module(error, version),
        )
        .await?;
        if let Some(txn) = ack.acknowledges(&batch.txn) {
            self.feedback.ack(&txn);
        }
        Ok(())
    }
}

/// Prepares the publication and slot, retrying with back-off while the
/// source cannot be reached or is starting up (each attempt logged and
/// recorded as the pipeline's last error, so status and readiness say why it
/// is not streaming yet). A definite failure — authentication, a missing
/// database, `wal_level`, a lost slot — stops at once. `None`: shutdown came
/// first.
///
/// Before it creates a slot, the pipeline's position (0/0: the slot's own)
/// is committed to the state file, so the state file knows of every slot it
/// made.
async fn prepare_source(
    config: &PipelineConfig,
    store: &Store,
    checkpoint: Option<Offset>,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<source::Prepared>, PipelineError> {
    let mut backoff = Backoff::new(config.source.reconnect_initial, config.source.reconnect_max);
    let mut attempt = 1u64;
    let source_config = config.source_config();
    loop {
        let intent = || {
            if checkpoint.is_none() {
                // With `mode = "initial"`, the request to copy every table
                // is recorded in the same commit, before the slot exists.
                let request = match config.snapshot.mode {
                    SnapshotMode::Initial => vec![SnapshotProgress::pending(ALL_TABLES, None)],
                    SnapshotMode::Never => Vec::new(),
                };
                store
                    .commit_checkpoint(&config.name, Offset::default(), &request, &[])
                    .map_err(|err| SourceError::Requirement {
                        problem: format!("cannot record the new slot in the state file: {err}"),
                        fix: "make the state file writable (free space, permissions), then start again"
                            .into(),
                    })?;
            }
            Ok(())
        };
        let prepare = source::prepare(&source_config, checkpoint.map(|o| o.end_lsn), intent);
        let outcome = tokio::select! {
            biased;
            _ = shutdown.as_mut() => return Ok(None),
            outcome = prepare => outcome,
        };
        match outcome {
            Ok(prepared) => {
                if attempt > 1 {
                    tracing::info!(pipeline = %config.name, attempt, "source reached");
                }
                return Ok(Some(prepared));
            }
            Err(err) if err.is_transient() => {
                let wait = backoff.next_wait();
                tracing::warn!(pipeline = %config.name, attempt, error = %err, retry_in = ?wait, "cannot prepare the source yet; retrying");
                config.stats.record_error(format!(
                    "starting (attempt {attempt}, next in {:.1} s): {err}",
                    wait.as_secs_f64()
                ));
                tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return Ok(None),
                    _ = tokio::time::sleep(wait) => {}
                }
                attempt += 1;
            }
            Err(err) => return Err(err.into()),
        }
    }
}

/// Runs the source on a thread and runtime of its own; the handle resolves
/// to its result.
///
/// The reader must never wait behind other work: a unix socket holds only a
/// few hundred of the walsender's messages (the kernel counts each small
/// message at about a kilobyte), so while the reader waits for a worker that
/// is rendering a sink group, the walsender stalls on a full socket. On its
/// own thread the reader is scheduled by the kernel, which runs a thread
/// that mostly sleeps as soon as it wakes.
fn spawn_source(
    name: &str,
    source: impl Future<Output = Result<(), SourceError>> + Send + 'static,
) -> tokio::task::JoinHandle<Result<(), PipelineError>> {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let span = tracing::Span::current();
    let spawned = std::thread::Builder::new()
        .name(format!("datum-source-{name}"))
        .spawn(move || {
            let _entered = span.enter();
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(source).map_err(PipelineError::from),
                    Err(err) => Err(PipelineError::Source(SourceError::Io(err))),
                }
            }))
            .unwrap_or_else(|payload| {
                Err(PipelineError::Panicked {
                    stage: "source",
                    message: payload_message(payload.as_ref()),
                })
            });
            let _ = done_tx.send(result);
        });
    tokio::spawn(async move {
        if let Err(err) = spawned {
            return Err(PipelineError::Source(SourceError::Io(err)));
        }
        done_rx.await.unwrap_or_else(|_| {
            Err(PipelineError::Panicked {
                stage: "source",
                message: "the source thread ended without a result".into(),
            })
        })
    })
}

/// What a task's panic said (for [`PipelineError::Panicked`]).
pub(crate) fn panic_message(err: tokio::task::JoinError) -> String {
    match err.try_into_panic() {
        Ok(payload) => payload_message(payload.as_ref()),
        Err(err) => err.to_string(),
    }
}

/// The text of a panic's payload, when it has one.
pub(crate) fn payload_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// What went definitely wrong with a batch.
enum Failure {
    /// A module failed on it: the error, and the version that failed.
    Module(ChainError, u64),
    /// The sink refused it (and retrying will not help): the error, and
    /// the version of the last module, whose output it refused.
    Sink(SinkError, u64),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Module(e, _) => e.fmt(f),
            Failure::Sink(e, _) => write!(f, "sink: {e}"),
        }
    }
}

/// Applies `on_error` to a batch a module failed on or the sink refused;
/// Ok means the batch is dealt with and may be acknowledged.
async fn handle_failure(
    config: &PipelineConfig,
    store: &Arc<Store>,
    counters: &PipelineStats,
    batch: &Batch,
    error: Failure,
) -> Result<(), PipelineError> {
    let name = &config.name;
    let commit_lsn = crate::event::Lsn(batch.txn.commit_lsn);
    let what = match error {
        Failure::Module(..) => "module failed",
        Failure::Sink(..) => "sink refused the batch",
    };
    match config.on_error {
        OnError::Fail => {
            tracing::error!(pipeline = %name, xid = batch.txn.xid, commit_lsn = %commit_lsn, error = %error, "{what}; stopping the pipeline (on_error = \"fail\")");
            Err(match error {
                Failure::Module(error, _) => PipelineError::Transform {
                    xid: batch.txn.xid,
                    commit_lsn,
                    error,
                },
                Failure::Sink(error, _) => PipelineError::Sink(error),
            })
        }
        OnError::Skip => {
            counters.skipped.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(pipeline = %name, xid = batch.txn.xid, commit_lsn = %commit_lsn, changes = batch.changes.len(), error = %error, "{what}; batch skipped (on_error = \"skip\")");
            Ok(())
        }
        OnError::DeadLetter => {
            let bytes = encode_input(&batch.txn, batch.changes.iter().map(ChangeRef::Source))
                .map_err(|e| {
                    PipelineError::Checkpoint(CheckpointError::Storage {
                        path: store.path().to_owned(),
                        detail: format!("encoding a dead letter: {e}"),
                    })
                })?;
            // The failing module's version, as the transform thread ran it;
            // for a sink refusal, the version of the last module, whose
            // output the sink refused (0 without modules, or outside the
            // registry), as that thread ran it too.
            let (Failure::Module(_, version) | Failure::Sink(_, version)) = error;
            let message = error.to_string();
            let (store, pipeline, stored) = (store.clone(), name.clone(), message.clone());
            let id = tokio::task::spawn_blocking(move || {
                store.add_dead_letter(&pipeline, &bytes, &stored, version)
            })
            .await
            .map_err(|e| PipelineError::Panicked {
                stage: "dead letter",
                message: panic_message(e),
            })??;
            counters.dead_letters.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(pipeline = %name, xid = batch.txn.xid, commit_lsn = %commit_lsn, dead_letter = id, module_version = version, error = %message, "{what}; batch stored as a dead letter (on_error = \"dead_letter\")");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_source_thread_hands_back_its_result_and_its_panics() {
        let ok = spawn_source("ok", async {
            // Runs on its own runtime: timers and spawned tasks work there.
            tokio::time::sleep(Duration::from_millis(5)).await;
            tokio::spawn(async { 7 }).await.map(|_| ()).map_err(|e| {
                SourceError::Protocol(format!("a task on the source's runtime failed: {e}"))
            })
        });
        assert!(matches!(ok.await, Ok(Ok(()))));

        let failed = spawn_source("failed", async {
            Err(SourceError::Protocol("told to fail".into()))
        });
        match failed.await {
            Ok(Err(PipelineError::Source(SourceError::Protocol(message)))) => {
                assert_eq!(message, "told to fail")
            }
            other => panic!("{other:?}"),
        }

        let panicked = spawn_source("panicked", async {
            panic!("a bug in the source");
        });
        match panicked.await {
            Ok(Err(PipelineError::Panicked { stage, message })) => {
                assert_eq!(stage, "source");
                assert_eq!(message, "a bug in the source");
            }
            other => panic!("{other:?}"),
        }
    }
}
