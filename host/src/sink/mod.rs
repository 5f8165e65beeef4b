//! Where batches go after the transforms: one trait, one module per sink.
//!
//! Owns the contract every sink keeps: `write` returns only once the batch is
//! durable at the destination (that return is the acknowledgement that lets
//! the checkpoint advance), and an error says whether retrying may help. It
//! does not own retries or the checkpoint: the pipeline does.

pub(crate) mod file;
pub(crate) mod http;
pub(crate) mod json;
pub(crate) mod jsonl;
pub(crate) mod nats;
pub(crate) mod postgres;
pub(crate) mod pretty;
pub(crate) mod stdout;

use std::future::Future;
use std::path::Path;

use crate::config::{SinkSpec, StdoutFormat};
use crate::transform::Transformed;

use file::FileSink;
use http::HttpSink;
use json::Columns;
use nats::{NatsSettings, NatsSink};
use postgres::PostgresSink;
use stdout::StdoutSink;

/// A sink's failure, by what retrying can do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// The destination cannot take the batch now — down, unreachable,
    /// timed out, overloaded, a failing disk: trying again may succeed.
    #[error("{0}")]
    Unavailable(String),
    /// The destination refused the batch (a rejected request, a
    /// constraint, a value it cannot store): the same batch fails the same
    /// way however often it is tried.
    #[error("{0}")]
    Refused(String),
    /// The destination went away for good, on purpose (the reader of
    /// standard output closed it): the pipeline then stops as on a
    /// shutdown, acknowledging nothing, rather than failing.
    #[error("{0}")]
    Gone(String),
    /// Another host took the destination over (it leads the pipeline
    /// now, `docs/scaling.md`): this host's writes are refused from here
    /// on, and the pipeline stops as on a shutdown, acknowledging nothing,
    /// and stands by.
    #[error("{0}")]
    Fenced(String),
}

impl SinkError {
    /// A failure worth retrying ([`SinkError::Unavailable`]).
    pub fn transient(message: impl Into<String>) -> SinkError {
        SinkError::Unavailable(message.into())
    }

    /// A failure that retrying will not fix ([`SinkError::Refused`]).
    pub fn definite(message: impl Into<String>) -> SinkError {
        SinkError::Refused(message.into())
    }

    /// The destination's reader went away ([`SinkError::Gone`]).
    pub fn gone(message: impl Into<String>) -> SinkError {
        SinkError::Gone(message.into())
    }

    /// Whether trying again may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SinkError::Unavailable(_))
    }

    /// Whether the destination went away on purpose.
    pub fn is_gone(&self) -> bool {
        matches!(self, SinkError::Gone(_))
    }

    /// Whether another host took the destination over.
    pub fn is_fenced(&self) -> bool {
        matches!(self, SinkError::Fenced(_))
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

    /// Called after a write was given up unfinished (dropped at the drain
    /// deadline): a sink whose destination may still be working on it asks
    /// the destination to stop, so that it does not go on (a statement
    /// waiting for a lock, then running) after the host has left. The
    /// default does nothing.
    fn abandon(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Claims the destination for this host, which just took the leader
    /// lock of the pipeline that `holder` names (the source's system
    /// identifier and the slot, `docs/scaling.md`): from the moment this
    /// returns, writes of any host that claimed it before are refused
    /// ([`SinkError::Fenced`]), and a write of this host is refused once
    /// another claims it after. Called before the slot is read. The
    /// default claims nothing: such a sink is not fenced.
    fn take_over(&mut self, holder: &str) -> impl Future<Output = Result<(), SinkError>> + Send {
        let _ = holder;
        async { Ok(()) }
    }

    /// Whether a write was refused because another host claimed the
    /// destination since this one did.
    fn overtaken(&self) -> bool {
        false
    }

    /// Names the stream the next batches come from, before the first write
    /// of each run: the same on every host (the source's system identifier
    /// and the slot, `SYSTEMID/SLOT`), or `None` when the source's system
    /// identifier could not be read. `fresh`: the slot was created for this
    /// run (new, or recreated), so nothing recorded of the stream before
    /// applies (a source restored from a backup keeps its identifier, not
    /// its positions). A sink that records what it applied keys the record
    /// by it. The default records nothing.
    fn follow(&mut self, stream: Option<&str>, fresh: bool) {
        let _ = (stream, fresh);
    }

    /// Writes a batch from outside the stream (a dead letter replayed):
    /// out of the stream's order, so a sink that records what it applied
    /// neither records it nor leaves it out. The default is `write`.
    fn write_outside(
        &mut self,
        batch: &Transformed,
    ) -> impl Future<Output = Result<(), SinkError>> + Send {
        self.write(batch)
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

    fn abandon(&mut self) -> impl Future<Output = ()> + Send {
        (**self).abandon()
    }

    fn take_over(&mut self, holder: &str) -> impl Future<Output = Result<(), SinkError>> + Send {
        (**self).take_over(holder)
    }

    fn overtaken(&self) -> bool {
        (**self).overtaken()
    }

    fn follow(&mut self, stream: Option<&str>, fresh: bool) {
        (**self).follow(stream, fresh)
    }

    fn write_outside(
        &mut self,
        batch: &Transformed,
    ) -> impl Future<Output = Result<(), SinkError>> + Send {
        (**self).write_outside(batch)
    }
}

/// Every sink the configuration can name.
#[derive(Debug)]
pub(crate) enum AnySink {
    /// `stdout`.
    Stdout(StdoutSink),
    /// `file`.
    File(FileSink),
    /// `http`.
    Http(Box<HttpSink>),
    /// `postgres`.
    Postgres(Box<PostgresSink>),
    /// `nats`.
    Nats(Box<NatsSink>),
}

impl Sink for AnySink {
    async fn write(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        match self {
            AnySink::Stdout(sink) => sink.write(batch).await,
            AnySink::File(sink) => sink.write(batch).await,
            AnySink::Http(sink) => sink.write(batch).await,
            AnySink::Postgres(sink) => sink.write(batch).await,
            AnySink::Nats(sink) => sink.write(batch).await,
        }
    }

    async fn write_group(&mut self, batches: &[Transformed]) -> Result<(), SinkError> {
        match self {
            AnySink::Stdout(sink) => sink.write_group(batches).await,
            AnySink::File(sink) => sink.write_group(batches).await,
            AnySink::Http(sink) => sink.write_group(batches).await,
            AnySink::Postgres(sink) => sink.write_group(batches).await,
            AnySink::Nats(sink) => sink.write_group(batches).await,
        }
    }

    fn bytes_written(&self) -> u64 {
        match self {
            AnySink::Stdout(sink) => sink.bytes_written(),
            AnySink::File(sink) => sink.bytes_written(),
            AnySink::Http(sink) => sink.bytes_written(),
            AnySink::Postgres(sink) => sink.bytes_written(),
            AnySink::Nats(sink) => sink.bytes_written(),
        }
    }

    async fn abandon(&mut self) {
        match self {
            AnySink::Stdout(sink) => sink.abandon().await,
            AnySink::File(sink) => sink.abandon().await,
            AnySink::Http(sink) => sink.abandon().await,
            AnySink::Postgres(sink) => sink.abandon().await,
            AnySink::Nats(sink) => sink.abandon().await,
        }
    }

    async fn take_over(&mut self, holder: &str) -> Result<(), SinkError> {
        match self {
            AnySink::Postgres(sink) => sink.take_over(holder).await,
            AnySink::Stdout(_) | AnySink::File(_) | AnySink::Http(_) | AnySink::Nats(_) => Ok(()),
        }
    }

    fn overtaken(&self) -> bool {
        match self {
            AnySink::Postgres(sink) => sink.overtaken(),
            AnySink::Stdout(_) | AnySink::File(_) | AnySink::Http(_) | AnySink::Nats(_) => false,
        }
    }

    fn follow(&mut self, stream: Option<&str>, fresh: bool) {
        match self {
            AnySink::Postgres(sink) => sink.follow(stream, fresh),
            AnySink::Stdout(_) | AnySink::File(_) | AnySink::Http(_) | AnySink::Nats(_) => {}
        }
    }

    async fn write_outside(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        match self {
            AnySink::Postgres(sink) => sink.write_outside(batch).await,
            _ => self.write(batch).await,
        }
    }
}

impl AnySink {
    /// Whether [`Sink::take_over`] fences this sink (only `postgres`).
    pub(crate) fn fenced(&self) -> bool {
        matches!(self, AnySink::Postgres(_))
    }
}

/// Opens the sink `spec` names for pipeline `pipeline` (a `postgres` sink
/// connects to its target). The error says what is wrong with it.
pub(crate) async fn open(spec: &SinkSpec, pipeline: &str) -> Result<AnySink, String> {
    let name = pipeline;
    Ok(match spec {
        SinkSpec::Stdout {
            format: StdoutFormat::Json,
            column_types,
            ..
        } => AnySink::Stdout(StdoutSink::new(Columns::from_flag(*column_types))),
        SinkSpec::Stdout {
            format: StdoutFormat::Pretty,
            color,
            ..
        } => AnySink::Stdout(StdoutSink::pretty(*color)),
        SinkSpec::File {
            path,
            rotate_at,
            column_types,
        } => AnySink::File(
            FileSink::open(Path::new(&path.0), rotate_at.map(|s| s.0 as u64))
                .map_err(|e| e.to_string())?
                .with_columns(Columns::from_flag(*column_types)),
        ),
        SinkSpec::Http {
            url,
            headers,
            timeout,
            column_types,
            ..
        } => AnySink::Http(
            HttpSink::new(
                &url.0,
                headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect(),
                timeout.0,
            )
            .and_then(|sink| sink.with_key_prefix(name))
            .map(|sink| Box::new(sink.with_column_types(*column_types)))
            .map_err(|e| e.to_string())?,
        ),
        SinkSpec::Postgres {
            url,
            schema,
            tables,
            schema_changes,
            track_applied,
        } => AnySink::Postgres(Box::new(
            PostgresSink::connect(
                &url.0,
                schema.as_ref().map(|s| s.0.clone()),
                tables
                    .iter()
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect(),
            )
            .await
            .map_err(|e| e.to_string())?
            .with_schema_changes(*schema_changes)
            .tracking_applied(*track_applied),
        )),
        SinkSpec::Nats(nats) => {
            let settings = NatsSettings::from_spec(nats)?;
            AnySink::Nats(Box::new(
                NatsSink::open(name, settings)
                    .await
                    .map_err(|e| e.to_string())?,
            ))
        }
    })
}
