//! One pipeline: the source, the sink, and the acknowledgements between them
//! that move the checkpoint (DESIGN.md §1–§2).
//!
//! Owns the wiring and the order of events: read the checkpoint, prepare the
//! slot (refusing when changes were lost, unless told to recreate it), stream
//! batches through the sink, acknowledge each to the feedback coordinator
//! once the sink has it durably, and let the commit loop persist the
//! watermark before PostgreSQL hears of it. A sink error is retried with
//! back-off and never advances the checkpoint.
//!
//! It does not own the stages themselves; transforms join between source and
//! sink with the WebAssembly runtime.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::checkpoint::{self, CheckpointError, CommitPolicy, Offset, Store};
use crate::feedback::Feedback;
use crate::sink::{Sink, SinkError};
use crate::source::stream::SourceStats;
use crate::source::{self, SourceConfig, SourceError};

/// How a pipeline runs.
#[derive(Debug, Clone)]
pub struct PipelineConfig {
    /// The pipeline's name: its key in the state file, and in logs.
    pub name: String,
    /// Where changes come from.
    pub source: SourceConfig,
    /// Batches buffered between source and sink.
    pub channel_capacity: usize,
    /// How checkpoints are committed.
    pub commit: CommitPolicy,
    /// First delay before retrying a failed sink write; doubles up to
    /// `sink_retry_max`.
    pub sink_retry_initial: Duration,
    /// Longest delay between sink retries.
    pub sink_retry_max: Duration,
}

impl PipelineConfig {
    /// A pipeline with default buffering, commit policy and retries.
    pub fn new(name: &str, source: SourceConfig) -> PipelineConfig {
        PipelineConfig {
            name: name.to_owned(),
            source,
            channel_capacity: 4,
            commit: CommitPolicy::default(),
            sink_retry_initial: Duration::from_millis(100),
            sink_retry_max: Duration::from_secs(30),
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
}

/// What a running pipeline exposes.
#[derive(Debug, Clone)]
pub struct Handles {
    /// The feedback coordinator (watermark, flushed position).
    pub feedback: Arc<Feedback>,
    /// The source's counters.
    pub stats: Arc<SourceStats>,
}

/// Runs the pipeline until `shutdown` completes or it fails definitely.
/// `started` receives the pipeline's handles once streaming begins.
pub async fn run<S: Sink>(
    config: PipelineConfig,
    store: Arc<Store>,
    mut sink: S,
    started: Option<tokio::sync::oneshot::Sender<Handles>>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), PipelineError> {
    let name = config.name.clone();
    let checkpoint = store.offset(&name)?;
    let prepared = source::prepare(&config.source, checkpoint.map(|o| o.end_lsn)).await?;
    let mut offset = checkpoint.unwrap_or_default();
    if prepared.resync_needed {
        tracing::warn!(pipeline = %name, "the slot was recreated: resynchronise the target");
        offset = Offset::default();
        store.reset_offset(&name, offset)?;
    }
    tracing::info!(pipeline = %name, resume_after = %offset.end_lsn, "pipeline starting");

    let feedback = Feedback::new(offset);
    let stats = Arc::new(SourceStats::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let committer = tokio::spawn(checkpoint::commit_loop(
        store.clone(),
        name.clone(),
        feedback.clone(),
        config.commit,
        stopped(stop_rx.clone()),
    ));
    let (tx, mut rx) = mpsc::channel(config.channel_capacity.max(1));
    let mut source_task = tokio::spawn(source::stream::run(
        config.source.clone(),
        offset.end_lsn,
        tx,
        feedback.clone(),
        stats.clone(),
        stopped(stop_rx.clone()),
    ));
    if let Some(started) = started {
        let _ = started.send(Handles {
            feedback: feedback.clone(),
            stats: stats.clone(),
        });
    }

    let mut shutdown = std::pin::pin!(shutdown);
    let outcome: Result<(), PipelineError> = loop {
        let batch = tokio::select! {
            biased;
            _ = shutdown.as_mut() => break Ok(()),
            batch = rx.recv() => batch,
        };
        let Some(batch) = batch else {
            // The source ended: a definite error, or it was stopped.
            break match (&mut source_task).await {
                Ok(result) => result.map_err(PipelineError::from),
                Err(err) => Err(PipelineError::Source(SourceError::Protocol(format!(
                    "the source task failed: {err}"
                )))),
            };
        };
        let mut delay = config.sink_retry_initial;
        let written = loop {
            match sink.write(&batch).await {
                Ok(()) => break Ok(()),
                Err(err) if err.transient => {
                    tracing::warn!(pipeline = %name, error = %err, retry_in = ?delay, "sink write failed; retrying");
                    tokio::select! {
                        biased;
                        _ = shutdown.as_mut() => break Err(None),
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2).min(config.sink_retry_max);
                }
                Err(err) => break Err(Some(err)),
            }
        };
        match written {
            Ok(()) => feedback.ack(&batch.txn),
            Err(None) => break Ok(()),
            Err(Some(err)) => break Err(PipelineError::Sink(err)),
        }
    };

    // Stop reading, then commit what the sink acknowledged.
    let _ = stop_tx.send(true);
    drop(rx);
    if !source_task.is_finished() {
        let _ = source_task.await;
    }
    let _ = committer.await;
    tracing::info!(pipeline = %name, checkpoint = %feedback.flushed(), "pipeline stopped");
    outcome
}
