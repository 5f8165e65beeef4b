//! Where batches go after the transforms: one trait, one module per sink.
//!
//! Owns the contract every sink keeps: `write` returns only once the batch is
//! durable at the destination (that return is the acknowledgement that lets
//! the checkpoint advance), and an error says whether retrying may help. It
//! does not own retries or the checkpoint: the pipeline does.

pub mod file;
pub mod http;
pub mod jsonl;
pub mod postgres;
pub mod pretty;
pub mod stdout;

use std::future::Future;

use crate::transform::Transformed;

/// A sink's failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SinkError {
    /// What went wrong.
    pub message: String,
    /// Whether trying again may succeed (the destination is down, a
    /// timeout) rather than never (a refused request).
    pub transient: bool,
    /// Whether the destination went away for good, on purpose (the reader
    /// of standard output closed it): the pipeline then stops as on a
    /// shutdown, acknowledging nothing, rather than failing.
    pub gone: bool,
}

impl SinkError {
    /// A failure worth retrying.
    pub fn transient(message: impl Into<String>) -> SinkError {
        SinkError {
            message: message.into(),
            transient: true,
            gone: false,
        }
    }

    /// A failure that retrying will not fix.
    pub fn definite(message: impl Into<String>) -> SinkError {
        SinkError {
            message: message.into(),
            transient: false,
            gone: false,
        }
    }

    /// The destination's reader went away (a closed pipe).
    pub fn gone(message: impl Into<String>) -> SinkError {
        SinkError {
            message: message.into(),
            transient: false,
            gone: true,
        }
    }
}

/// A destination for batches.
pub trait Sink: Send {
    /// Writes a batch — the transforms' output, with the source batch it
    /// came from — and returns once it is durable at the destination.
    /// Batches arrive in commit order; after a crash the un-checkpointed tail
    /// arrives again, so a sink should be idempotent or tolerate replays.
    fn write(&mut self, batch: &Transformed) -> impl Future<Output = Result<(), SinkError>> + Send;

    /// Writes several batches, in order, and returns once all of them are
    /// durable: one flush or fsync for the lot where the destination allows
    /// it (the pipeline groups the batches that are waiting when the sink is
    /// free, so many small transactions share one fsync). On an error any
    /// prefix of them may have been written; the pipeline then writes them
    /// again one at a time, with retries and `on_error` per batch. The
    /// default writes them one by one.
    fn write_group(
        &mut self,
        batches: &[Transformed],
    ) -> impl Future<Output = Result<(), SinkError>> + Send {
        async move {
            for batch in batches {
                self.write(batch).await?;
            }
            Ok(())
        }
    }

    /// Bytes written so far, for sinks that count them (0 otherwise).
    fn bytes_written(&self) -> u64 {
        0
    }
}

impl<S: Sink> Sink for &mut S {
    fn write(&mut self, batch: &Transformed) -> impl Future<Output = Result<(), SinkError>> + Send {
        (**self).write(batch)
    }

    fn write_group(
        &mut self,
        batches: &[Transformed],
    ) -> impl Future<Output = Result<(), SinkError>> + Send {
        (**self).write_group(batches)
    }

    fn bytes_written(&self) -> u64 {
        (**self).bytes_written()
    }
}
