//! Catch-up: a slot far behind the server is drained through the SQL
//! interface instead of the walsender's stream.
//!
//! The walsender sends each change as a message of its own and flushes its
//! socket per message, so most of its CPU goes to the kernel and its
//! streaming rate stays far below the rate at which PostgreSQL decodes.
//! `pg_logical_slot_get_binary_changes` decodes the same pgoutput messages
//! into rows of an ordinary query, which the server sends in full buffers.
//! While the slot is behind by more than `source.catch_up`, the source
//! makes a temporary copy of the slot (`pg_copy_logical_replication_slot`)
//! and reads bounded windows of the copy that way (`upto_nchanges`; rows
//! are streamed, never the whole result in memory) through the same
//! decoder and assembler. Each call moves the copy past what it returned,
//! so the next window can be asked for at once, on a thread of its own:
//! the server decodes it while the source still assembles the last. The
//! pipeline's own slot moves with `pg_replication_slot_advance`, only to
//! what is durably checkpointed. Once within half the threshold, or when a window comes
//! back empty, the source streams again from the checkpoint.
//!
//! The delivery contract is the streaming path's (`docs/architecture.md`,
//! "The delivery contract"): batches are registered with the feedback
//! coordinator in commit order before they go downstream, and the slot
//! never passes the checkpoint. The copy is the session's own: the server
//! drops it when the session ends, so a crash leaves only the slot, at or
//! behind the state file. The first window starts at the slot's confirmed
//! position and may begin with transactions already sent downstream; the
//! assembler skips them as it does after a reconnect.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures_util::TryStreamExt;
use tokio_postgres::Client;
use tokio_postgres::types::{PgLsn, ToSql};

use super::assembler::Assembler;
use super::stream::{Downstream, SourceStats, assemble};
use super::{Positions, RowColumns, SourceConfig, SourceError, catalog};
use crate::event::{Batch, Lsn};
use crate::pg::quote_ident;

/// When and how a slot is drained through the SQL interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatchUp {
    /// Bytes of WAL between the server's position and the slot's beyond
    /// which the source drains through SQL; it streams again once within
    /// half of it.
    pub threshold: u64,
    /// `upto_nchanges` of each window: the server stops decoding at the
    /// first commit after this many rows (each a pgoutput message).
    pub window: i32,
    /// After the server refused the temporary copy a catch-up needs (no
    /// replication slot free, say), how long the source streams before it
    /// may try again.
    pub retry_refused_after: Duration,
}

impl CatchUp {
    /// Rows per window unless configured otherwise.
    pub const DEFAULT_WINDOW: i32 = 200_000;

    /// How long the source streams after a refused copy, unless configured
    /// otherwise.
    pub const DEFAULT_RETRY_REFUSED: Duration = Duration::from_secs(300);

    /// A catch-up beyond `threshold` bytes of lag, with the defaults.
    pub fn beyond(threshold: u64) -> CatchUp {
        CatchUp {
            threshold,
            window: CatchUp::DEFAULT_WINDOW,
            retry_refused_after: CatchUp::DEFAULT_RETRY_REFUSED,
        }
    }
}

/// What the reading thread hands to the source, in order.
enum Read {
    /// The copy was made: windows follow.
    Ready {
        /// Its name.
        copy: String,
    },
    /// The server refused to make the copy (the error, in full).
    Refused(String),
    /// Rows of the current window.
    Rows(Vec<tokio_postgres::Row>),
    /// The window ended.
    End(Window),
    /// Within half the threshold of the server's flushed WAL (here):
    /// stream from here.
    Caught(Lsn),
    /// Reading failed.
    Failed(SourceError),
}

/// What one window brought.
struct Window {
    /// Rows (pgoutput messages) read.
    rows: u64,
    /// How long the server took to send the first row.
    first_row: Option<Duration>,
    /// From the call to the last row.
    took: Duration,
    /// The server's flushed WAL before the call: the window reached at
    /// least this far.
    server: Lsn,
}

/// How a catch-up ended.
pub(crate) enum Outcome {
    /// Within half the threshold (or nothing left): stream from here.
    Caught,
    /// The server would not make the slot's temporary copy (no free
    /// replication slot, say): the source streams, and tries a catch-up
    /// again only after [`CatchUp::retry_refused_after`].
    Unavailable,
    /// Shutdown came first. The client is kept to move the slot to the
    /// final checkpoint once it is written ([`confirm`]).
    Stopped(Client),
}

type Shutdown<'a> = Pin<&'a mut (dyn Future<Output = ()> + Send)>;

/// Where a catch-up reads and reports.
pub(crate) struct Reader<'a> {
    pub config: &'a SourceConfig,
    pub catch_up: CatchUp,
    pub assembler: &'a mut Assembler,
    pub out: &'a crate::channel::Sender<Batch>,
    pub positions: &'a dyn Positions,
    pub stats: &'a SourceStats,
    /// Where the pipeline asked to resume: the slot may not be past it (or
    /// past what was checkpointed since).
    pub requested: Lsn,
}

/// A temporary copy of the slot, made by the reading session: the server
/// drops it when that session ends, however it ends. Its name carries the
/// session's process id, unique among live sessions.
const COPY: &str = "SELECT slot_name::text \
                    FROM pg_copy_logical_replication_slot($1, 'datum_catchup_' || pg_backend_pid(), true)";

/// A window: the copy's pgoutput messages from where the last window
/// ended, with the options the streaming path sends. The call moves the
/// copy past what it returns; the pipeline's slot stays where it is.
const GET: &str = "SELECT lsn, data FROM pg_logical_slot_get_binary_changes($1, NULL, $2, \
                   'proto_version', '1', 'publication_names', $3, 'messages', 'true')";

/// Rows handed over from the reading connection at once, at most...
const ROWS_PER_READ: usize = 512;
/// ... or about this many bytes of them.
const BYTES_PER_READ: usize = 256 * 1024;
/// Reads held between the reading thread and the source: up to about
/// 64 MiB of rows the source has not assembled yet. The server sends a
/// window into them and decodes the next while the source works through
/// them.
const READS_AHEAD: usize = 256;

/// How often the pipeline's slot is moved to the checkpoint during a
/// catch-up, so that the server may release WAL as it goes.
const CONFIRM_EVERY: Duration = Duration::from_secs(1);

impl Reader<'_> {
    /// Drains the slot through SQL while it is behind by more than the
    /// threshold; returns at once when it is not.
    pub(crate) async fn run(&mut self, shutdown: Shutdown<'_>) -> Result<Outcome, SourceError> {
        let outcome = self.drain(shutdown).await;
        // However it ended, the source no longer reads through SQL.
        self.stats.catching_up.store(false, Ordering::Relaxed);
        outcome
    }

    async fn drain(&mut self, mut shutdown: Shutdown<'_>) -> Result<Outcome, SourceError> {
        let config = self.config;
        let stats = self.stats;
        let positions = self.positions;
        // The lag is read on one connection at every session start; the
        // rest is set up only for a catch-up that happens.
        let control = tokio::select! {
            biased;
            _ = shutdown.as_mut() => return Ok(Outcome::Caught),
            client = catalog::connect(&config.conninfo) => client?,
        };
        let flushed = positions.flushed();
        self.advance_slot(&control, flushed).await?;
        let server = flushed_wal(&control).await?;
        stats.server_lsn.fetch_max(server.0, Ordering::Relaxed);
        let from = flushed
            .max(self.assembler.resume_after())
            .max(Lsn(stats.received_lsn.load(Ordering::Relaxed)));
        let lag = server.0.saturating_sub(from.0);
        if lag <= self.catch_up.threshold {
            return Ok(Outcome::Caught);
        }
        // The windows are read on a thread of its own, so that the server
        // can send one while the source still assembles the last: the
        // server then decodes the next meanwhile.
        let (tx, mut rx) = tokio::sync::mpsc::channel(READS_AHEAD);
        let fetch = Fetch {
            config: config.clone(),
            names: quote_ident(&config.publication),
            window: self.catch_up.window,
            leave_within: self.catch_up.threshold / 2,
            received: from,
        };
        fetch.spawn(tx)?;
        let first = tokio::select! {
            biased;
            _ = shutdown.as_mut() => return Ok(Outcome::Stopped(control)),
            first = rx.recv() => first,
        };
        let copy = match first {
            Some(Read::Ready { copy }) => copy,
            Some(Read::Refused(error)) => {
                tracing::warn!(slot = %config.slot, error = %error, retry_in = ?self.catch_up.retry_refused_after, "a catch-up needs a temporary copy of the slot, which the server refused: streaming instead for now (raise max_replication_slots by one if no slot was free)");
                return Ok(Outcome::Unavailable);
            }
            Some(Read::Failed(err)) => return Err(err),
            _ => return Err(reader_gone()),
        };
        stats.catching_up.store(true, Ordering::Relaxed);
        stats.catch_ups.fetch_add(1, Ordering::Relaxed);
        tracing::info!(slot = %config.slot, lag_bytes = lag, from = %from, copy = %copy, "the slot is far behind: draining it through SQL");
        // The server starts at a transaction boundary and sends Relation
        // messages anew; what was already sent is skipped.
        self.assembler.reconnected(flushed);
        // Meanwhile the pipeline's slot follows the checkpoint (type lookups
        // share that connection).
        let consumed = tokio::select! {
            consumed = self.consume(&control, &mut rx, shutdown.as_mut()) => consumed,
            never = follow_checkpoint(&control, config, positions, stats) => match never {},
        };
        // The reading thread ends (and its session with the copy) once it
        // sees the channel closed, if it has not already.
        drop(rx);
        if !consumed? {
            return Ok(Outcome::Stopped(control));
        }
        tracing::info!(slot = %config.slot, received = %Lsn(stats.received_lsn.load(Ordering::Relaxed)), "caught up: streaming");
        // The walsender starts where the checkpoint is; the slot must not
        // be confirmed past it, nor (for the fast-forward check) behind
        // the position it was last told.
        self.advance_slot(&control, positions.flushed()).await?;
        Ok(Outcome::Caught)
    }

    /// Assembles what the reading connection hands over and sends it
    /// downstream: true once caught up, false on shutdown. On a failure,
    /// what was read before it goes downstream first
    /// ([`Downstream::settle`]).
    async fn consume(
        &mut self,
        lookups: &Client,
        rx: &mut tokio::sync::mpsc::Receiver<Read>,
        mut shutdown: Shutdown<'_>,
    ) -> Result<bool, SourceError> {
        let mut pending = Vec::new();
        let result = self
            .assemble_all(lookups, rx, &mut pending, shutdown.as_mut())
            .await;
        self.downstream()
            .settle(result, &mut pending, shutdown)
            .await
    }

    fn downstream(&self) -> Downstream<'_> {
        Downstream {
            out: self.out,
            positions: self.positions,
            stats: self.stats,
            limits: self.config.limits,
        }
    }

    /// `consume`'s loop; on an error, `pending` holds the batches read and
    /// not yet handed over, in order.
    async fn assemble_all(
        &mut self,
        lookups: &Client,
        rx: &mut tokio::sync::mpsc::Receiver<Read>,
        pending: &mut Vec<Batch>,
        mut shutdown: Shutdown<'_>,
    ) -> Result<bool, SourceError> {
        let limits = self.config.limits;
        let mut pending_cost = 0usize;
        loop {
            let read = tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Ok(false),
                read = rx.recv() => read,
            };
            let rows = match read {
                Some(Read::Rows(rows)) => rows,
                Some(Read::End(window)) => {
                    self.stats
                        .server_lsn
                        .fetch_max(window.server.0, Ordering::Relaxed);
                    if !self.deliver(pending, shutdown.as_mut()).await? {
                        return Ok(false);
                    }
                    pending_cost = 0;
                    tracing::debug!(slot = %self.config.slot, rows = window.rows, first_row_ms = window.first_row.map(|d| d.as_millis() as u64), took_ms = window.took.as_millis() as u64, "window read");
                    if window.rows == 0 {
                        // Nothing for this slot up to `server`: with nothing
                        // in flight the checkpoint may move there (the idle
                        // rule), as after a walsender's keepalive.
                        self.stats
                            .received_lsn
                            .fetch_max(window.server.0, Ordering::Relaxed);
                        self.positions.idle(window.server);
                        return Ok(true);
                    }
                    // Each window is decoded afresh: its first use of a
                    // relation comes with a Relation message again.
                    self.assembler.reconnected(Lsn::ZERO);
                    continue;
                }
                Some(Read::Caught(server)) => {
                    self.stats.server_lsn.fetch_max(server.0, Ordering::Relaxed);
                    return self.deliver(pending, shutdown.as_mut()).await;
                }
                Some(Read::Failed(err)) => return Err(err),
                Some(Read::Ready { .. } | Read::Refused(_)) | None => return Err(reader_gone()),
            };
            for row in &rows {
                let lsn: PgLsn = row.try_get(0).map_err(SourceError::Sql)?;
                let data: &[u8] = row.try_get(1).map_err(SourceError::Sql)?;
                let lsn = Lsn(u64::from(lsn));
                self.stats.received_lsn.fetch_max(lsn.0, Ordering::Relaxed);
                self.stats.server_lsn.fetch_max(lsn.0, Ordering::Relaxed);
                if let Some(batch) = assemble(self.assembler, lookups, self.stats, data).await? {
                    self.stats
                        .catch_up_changes
                        .fetch_add(batch.changes.len() as u64, Ordering::Relaxed);
                    pending_cost += batch.cost(limits);
                    pending.push(batch);
                    // Delivered together, as the streaming path does with
                    // what one read brought: fewer wake-ups downstream.
                    if pending.len() >= super::stream::PENDING_MAX
                        || pending_cost >= limits.max_bytes
                    {
                        pending_cost = 0;
                        if !self.deliver(pending, shutdown.as_mut()).await? {
                            return Ok(false);
                        }
                    }
                }
            }
            // What this read brought goes now if nothing more is waiting.
            if rx.is_empty() {
                pending_cost = 0;
                if !self.deliver(pending, shutdown.as_mut()).await? {
                    return Ok(false);
                }
            }
        }
    }

    /// Sends `pending` downstream in order; false on shutdown or when the
    /// consumer is gone.
    async fn deliver(
        &mut self,
        pending: &mut Vec<Batch>,
        shutdown: Shutdown<'_>,
    ) -> Result<bool, SourceError> {
        self.downstream().deliver_all(pending, shutdown).await
    }

    /// Moves the slot to `flushed` when it is behind it. A slot confirmed
    /// past both the requested start and the checkpoint was moved by
    /// someone else: the changes between are lost to the pipeline, as
    /// the streaming path reports after `START_REPLICATION`.
    async fn advance_slot(&mut self, client: &Client, flushed: Lsn) -> Result<(), SourceError> {
        let config = self.config;
        let Some(state) = catalog::slot_state(client, &config.slot).await? else {
            return Err(SourceError::Requirement {
                problem: format!("slot {} no longer exists", config.slot),
                fix: "restore the slot, or set recreate_slot = true to create a new one and \
                      resynchronise the target"
                    .into(),
            });
        };
        if state.active {
            // The walsender of a session just ended may not have gone yet.
            super::release_slot(client, config, state.active_pid).await?;
        }
        let confirmed = state.confirmed_flush.unwrap_or_default();
        if self.requested == Lsn::ZERO {
            // Asked to start wherever the slot is.
            self.requested = confirmed;
        }
        let allowed = self.requested.max(flushed);
        if confirmed > allowed && !config.follow_slot {
            return Err(SourceError::FastForward {
                slot: config.slot.clone(),
                requested: allowed,
                confirmed,
            });
        }
        if flushed > confirmed {
            move_slot(client, config, flushed, self.stats)
                .await
                .map_err(SourceError::Sql)?;
        }
        Ok(())
    }
}

/// The reading side: on a thread and connection of its own, makes the
/// slot's copy, then fetches windows of it one after another and hands
/// their rows over, until within `leave_within` of the server or a window
/// comes back empty.
struct Fetch {
    config: SourceConfig,
    names: String,
    window: i32,
    leave_within: u64,
    /// Where the slot was read up to: the last row's position.
    received: Lsn,
}

/// The source stopped listening.
struct Gone;

impl Fetch {
    /// Starts the thread; it ends when done or when `tx` is closed.
    fn spawn(self, tx: tokio::sync::mpsc::Sender<Read>) -> Result<(), SourceError> {
        let span = tracing::Span::current();
        std::thread::Builder::new()
            .name(format!("datum-catchup-{}", self.config.slot))
            .spawn(move || {
                let _entered = span.enter();
                let runtime = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(err) => {
                        let _ = tx.blocking_send(Read::Failed(SourceError::Io(err)));
                        return;
                    }
                };
                runtime.block_on(async {
                    tokio::select! {
                        biased;
                        _ = tx.closed() => {}
                        _ = self.run(&tx) => {}
                    }
                });
            })
            .map(drop)
            .map_err(SourceError::Io)
    }

    async fn run(mut self, tx: &tokio::sync::mpsc::Sender<Read>) {
        let (client, statement, copy) = match self.copy(tx).await {
            Ok(Some(set_up)) => set_up,
            Ok(None) => return,
            Err(err) => {
                let _ = tx.send(Read::Failed(err)).await;
                return;
            }
        };
        match self.windows(&client, &statement, &copy, tx).await {
            Ok(Ok(last)) => {
                // Done: the copy goes before the source hears of it (it
                // would with the session in any case).
                if let Err(err) = client
                    .execute("SELECT pg_drop_replication_slot($1)", &[&copy])
                    .await
                {
                    tracing::debug!(copy = %copy, error = %crate::pg::error_chain(&err), "could not drop the slot's copy");
                }
                let _ = tx.send(last).await;
            }
            Ok(Err(Gone)) => {}
            Err(err) => {
                let _ = tx.send(Read::Failed(err)).await;
            }
        }
    }

    /// Connects and makes the copy; `None` when refused (and said so).
    async fn copy(
        &self,
        tx: &tokio::sync::mpsc::Sender<Read>,
    ) -> Result<Option<(Client, tokio_postgres::Statement, String)>, SourceError> {
        let client = catalog::connect(&self.config.conninfo).await?;
        // A window of a large transaction takes the server a while to
        // decode before its first row: no statement timeout applies.
        client
            .batch_execute("SET statement_timeout = 0")
            .await
            .map_err(SourceError::Sql)?;
        let copy = match client.query_one(COPY, &[&self.config.slot]).await {
            Ok(row) => row.col::<String>(0)?,
            Err(err) => {
                // The connection failing is retried as ever; a refusal
                // (no slot free: insufficient resources) is not.
                let refused = err
                    .as_db_error()
                    .is_some_and(|db| !matches!(db.code().code().get(..2), Some("08" | "57")));
                if !refused {
                    return Err(SourceError::Sql(err));
                }
                let _ = tx.send(Read::Refused(crate::pg::error_chain(&err))).await;
                return Ok(None);
            }
        };
        let statement = client.prepare(GET).await.map_err(SourceError::Sql)?;
        if tx.send(Read::Ready { copy: copy.clone() }).await.is_err() {
            return Ok(None);
        }
        Ok(Some((client, statement, copy)))
    }

    /// Reads windows until done: the last message (not sent yet), or
    /// `Gone` when the source stopped listening.
    async fn windows(
        &mut self,
        client: &Client,
        statement: &tokio_postgres::Statement,
        copy: &str,
        tx: &tokio::sync::mpsc::Sender<Read>,
    ) -> Result<Result<Read, Gone>, SourceError> {
        let mut first = true;
        loop {
            let server = flushed_wal(client).await?;
            // The first window is read whatever: the lag was just seen.
            if !first && server.0.saturating_sub(self.received.0) <= self.leave_within {
                return Ok(Ok(Read::Caught(server)));
            }
            first = false;
            let params: [&(dyn ToSql + Sync); 3] = [&copy, &self.window, &self.names];
            let asked = Instant::now();
            let rows = client
                .query_raw(statement, params.iter().map(|p| *p as &dyn ToSql))
                .await
                .map_err(SourceError::Sql)?;
            let mut rows = std::pin::pin!(rows);
            let mut window = Window {
                rows: 0,
                first_row: None,
                took: Duration::ZERO,
                server,
            };
            let mut read = Vec::with_capacity(ROWS_PER_READ);
            let mut bytes = 0usize;
            while let Some(row) = rows.try_next().await.map_err(SourceError::Sql)? {
                window.rows += 1;
                window.first_row.get_or_insert_with(|| asked.elapsed());
                let lsn: PgLsn = row.try_get(0).map_err(SourceError::Sql)?;
                self.received = self.received.max(Lsn(u64::from(lsn)));
                bytes += row.try_get::<_, &[u8]>(1).map_or(0, <[u8]>::len);
                read.push(row);
                if read.len() >= ROWS_PER_READ || bytes >= BYTES_PER_READ {
                    bytes = 0;
                    let full = std::mem::replace(&mut read, Vec::with_capacity(ROWS_PER_READ));
                    if tx.send(Read::Rows(full)).await.is_err() {
                        return Ok(Err(Gone));
                    }
                }
            }
            window.took = asked.elapsed();
            if window.rows == 0 {
                return Ok(Ok(Read::End(window)));
            }
            if !read.is_empty() && tx.send(Read::Rows(read)).await.is_err() {
                return Ok(Err(Gone));
            }
            if tx.send(Read::End(window)).await.is_err() {
                return Ok(Err(Gone));
            }
        }
    }
}

/// The reading thread ended without saying why.
fn reader_gone() -> SourceError {
    SourceError::Io(std::io::Error::other(
        "the catch-up's reading thread ended unexpectedly",
    ))
}

/// Moves the pipeline's slot to the checkpoint about every
/// [`CONFIRM_EVERY`] while a catch-up runs; never returns. A failure is
/// logged and tried again: the slot then only keeps more WAL for a while.
async fn follow_checkpoint(
    client: &Client,
    config: &SourceConfig,
    positions: &dyn Positions,
    stats: &SourceStats,
) -> std::convert::Infallible {
    let mut confirmed = positions.flushed();
    loop {
        tokio::time::sleep(CONFIRM_EVERY).await;
        let flushed = positions.flushed();
        if flushed <= confirmed {
            continue;
        }
        match move_slot(client, config, flushed, stats).await {
            Ok(()) => confirmed = flushed,
            Err(err) => {
                tracing::warn!(slot = %config.slot, error = %crate::pg::error_chain(&err), "could not move the slot to the checkpoint; trying again")
            }
        }
    }
}

/// After a stop during catch-up: moves the slot to the final checkpoint,
/// so that the slot is where the state file is.
pub(crate) async fn confirm(
    client: &Client,
    config: &SourceConfig,
    flushed: Lsn,
    stats: &SourceStats,
) {
    let confirmed = catalog::slot_state(client, &config.slot)
        .await
        .ok()
        .flatten()
        .and_then(|s| s.confirmed_flush)
        .unwrap_or_default();
    if flushed <= confirmed {
        return;
    }
    match move_slot(client, config, flushed, stats).await {
        Ok(()) => {
            tracing::debug!(slot = %config.slot, confirmed = %flushed, "final position confirmed");
        }
        Err(err) => {
            tracing::warn!(slot = %config.slot, error = %crate::pg::error_chain(&err), "could not move the slot to the final checkpoint; the next start replays from the slot's position")
        }
    }
}

/// Moves the pipeline's slot to `flushed`, which the caller knows is
/// checkpointed, and counts the confirmation.
async fn move_slot(
    client: &Client,
    config: &SourceConfig,
    flushed: Lsn,
    stats: &SourceStats,
) -> Result<(), tokio_postgres::Error> {
    client
        .query(
            "SELECT pg_replication_slot_advance($1, $2)",
            &[&config.slot, &PgLsn::from(flushed.0)],
        )
        .await?;
    stats.confirmed_lsn.store(flushed.0, Ordering::Relaxed);
    stats.status_updates.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

async fn flushed_wal(client: &Client) -> Result<Lsn, SourceError> {
    let row = client
        .query_one("SELECT pg_current_wal_flush_lsn()", &[])
        .await
        .map_err(SourceError::Sql)?;
    let lsn: PgLsn = row.try_get(0).map_err(SourceError::Sql)?;
    Ok(Lsn(u64::from(lsn)))
}
