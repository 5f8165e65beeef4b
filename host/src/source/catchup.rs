//! Catch-up: a slot far behind the server is drained through the SQL
//! interface instead of the walsender's stream.
//!
//! The walsender sends each change as a message of its own and flushes its
//! socket per message, so most of its CPU goes to the kernel and its
//! streaming rate stays far below the rate at which PostgreSQL decodes.
//! `pg_logical_slot_peek_binary_changes` decodes the same pgoutput messages
//! into rows of an ordinary query, which the server sends in full buffers.
//! While the slot is behind by more than `source.catch_up`, the source reads
//! bounded windows of it that way (`upto_nchanges`; the rows are streamed,
//! never the whole result in memory) through the same decoder and
//! assembler, and moves the slot with `pg_replication_slot_advance` only to
//! what is durably checkpointed. Once within half the threshold, or when a
//! window comes back empty, the source streams again.
//!
//! The delivery contract is the streaming path's (`docs/architecture.md`,
//! "The delivery contract"): batches are registered with the feedback
//! coordinator in commit order before they go downstream; the slot never
//! passes the checkpoint; a peek starts at the slot's confirmed position, so
//! a window may begin with transactions already sent downstream, and the
//! assembler skips them as it does after a reconnect.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use futures_util::TryStreamExt;
use tokio_postgres::Client;
use tokio_postgres::types::{PgLsn, ToSql};

use super::assembler::Assembler;
use super::stream::{SourceStats, assemble, hand_over};
use super::{Positions, SourceConfig, SourceError, catalog};
use crate::event::{Batch, Lsn};
use crate::pg::quote_ident;

/// When and how a slot is drained through the SQL interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatchUp {
    /// Bytes of WAL between the server's position and the slot's beyond
    /// which the source drains through SQL; it streams again once within
    /// half of it.
    pub threshold: u64,
    /// `upto_nchanges` of each peek: the server stops decoding at the
    /// first commit after this many rows (each a pgoutput message).
    pub window: i32,
}

impl CatchUp {
    /// Rows per peek unless configured otherwise.
    pub const DEFAULT_WINDOW: i32 = 200_000;

    /// A catch-up beyond `threshold` bytes of lag, with the default window.
    pub fn beyond(threshold: u64) -> CatchUp {
        CatchUp {
            threshold,
            window: CatchUp::DEFAULT_WINDOW,
        }
    }
}

/// What one peek brought.
struct Window {
    /// Rows (pgoutput messages) read.
    rows: u64,
    /// Batches sent downstream: those not sent before.
    sent: u64,
    /// How long the server took to send the first row.
    first_row: Option<std::time::Duration>,
}

/// How a catch-up ended.
pub(crate) enum Outcome {
    /// Within half the threshold (or nothing left): stream from here.
    Caught,
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

/// The peek: the slot's pgoutput messages from its confirmed position, with
/// the options the streaming path sends.
const PEEK: &str = "SELECT lsn, data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2, \
                    'proto_version', '1', 'publication_names', $3, 'messages', 'true')";

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
        // The lag is read on one connection at every session start; the
        // rest is set up only for a catch-up that happens.
        let peek = tokio::select! {
            biased;
            _ = shutdown.as_mut() => return Ok(Outcome::Caught),
            client = catalog::connect(&config.conninfo) => client?,
        };
        let names = quote_ident(&config.publication);
        // Type lookups for new relations, on a second connection (the
        // first reads the peek's rows while they stream), and the peek.
        let mut reading: Option<(Client, tokio_postgres::Statement)> = None;
        let mut entered = false;
        loop {
            // A peek starts at the slot's confirmed position, which may not
            // pass the checkpoint: peeking before the previous window is
            // checkpointed would have the server decode, and the source
            // skip, what is still in flight. (Measured both ways: the
            // drain took as long; the server did less.)
            if entered
                && !self
                    .checkpoint_reaches(self.assembler.resume_after(), shutdown.as_mut())
                    .await
            {
                return Ok(Outcome::Stopped(peek));
            }
            let flushed = self.positions.flushed();
            self.advance_slot(&peek, flushed).await?;
            // Flushed WAL: a peek decodes at least up to here.
            let server = flushed_wal(&peek).await?;
            self.stats.server_lsn.fetch_max(server.0, Ordering::Relaxed);
            let from = flushed
                .max(self.assembler.resume_after())
                .max(Lsn(self.stats.received_lsn.load(Ordering::Relaxed)));
            let lag = server.0.saturating_sub(from.0);
            // Enter beyond the threshold; once in, leave within half of it.
            let limit = if entered {
                self.catch_up.threshold / 2
            } else {
                self.catch_up.threshold
            };
            if lag <= limit {
                break;
            }
            let (lookups, statement) = match reading.take() {
                Some(set_up) => set_up,
                None => {
                    let setup = async {
                        // A window of a large transaction takes the server a
                        // while to decode before its first row: no statement
                        // timeout applies.
                        peek.batch_execute("SET statement_timeout = 0")
                            .await
                            .map_err(SourceError::Sql)?;
                        let statement = peek.prepare(PEEK).await.map_err(SourceError::Sql)?;
                        let lookups = catalog::connect(&config.conninfo).await?;
                        Ok::<_, SourceError>((lookups, statement))
                    };
                    tokio::select! {
                        biased;
                        _ = shutdown.as_mut() => return Ok(Outcome::Stopped(peek)),
                        set_up = setup => set_up?,
                    }
                }
            };
            if !entered {
                entered = true;
                self.stats.catching_up.store(true, Ordering::Relaxed);
                self.stats.catch_ups.fetch_add(1, Ordering::Relaxed);
                tracing::info!(slot = %config.slot, lag_bytes = lag, from = %from, "the slot is far behind: draining it through SQL");
            }
            // The server starts again at a transaction boundary and sends
            // Relation messages anew; what was already sent is skipped.
            self.assembler.reconnected(flushed);
            let began = std::time::Instant::now();
            let window = self
                .window(&peek, &lookups, &statement, &names, shutdown.as_mut())
                .await;
            reading = Some((lookups, statement));
            if let Ok(Some(w)) = &window {
                tracing::debug!(slot = %config.slot, rows = w.rows, sent = w.sent, first_row_ms = w.first_row.map(|d| d.as_millis() as u64), took_ms = began.elapsed().as_millis() as u64, from = %flushed, "peeked");
            }
            match window {
                Ok(Some(Window { rows: 0, .. })) => {
                    // Nothing for this slot up to `server`: with nothing
                    // in flight the checkpoint may move there (the idle
                    // rule), as after a walsender's keepalive.
                    self.stats
                        .received_lsn
                        .fetch_max(server.0, Ordering::Relaxed);
                    self.positions.idle(server);
                    break;
                }
                Ok(Some(_)) => {}
                Ok(None) => return Ok(Outcome::Stopped(peek)),
                Err(err) => return Err(err),
            }
        }
        if entered {
            tracing::info!(slot = %config.slot, received = %Lsn(self.stats.received_lsn.load(Ordering::Relaxed)), "caught up: streaming");
        }
        // The walsender starts where the checkpoint is; the slot must not
        // be confirmed past it, nor (for the fast-forward check) behind
        // the position it was last told.
        self.advance_slot(&peek, self.positions.flushed()).await?;
        Ok(Outcome::Caught)
    }

    /// Waits until the checkpoint reaches `target`; false on shutdown.
    async fn checkpoint_reaches(&self, target: Lsn, mut shutdown: Shutdown<'_>) -> bool {
        while self.positions.flushed() < target {
            tokio::select! {
                biased;
                _ = shutdown.as_mut() => return false,
                _ = tokio::time::sleep(std::time::Duration::from_millis(2)) => {}
            }
        }
        true
    }

    /// Reads one window and sends its batches downstream; `None` on
    /// shutdown.
    async fn window(
        &mut self,
        peek: &Client,
        lookups: &Client,
        statement: &tokio_postgres::Statement,
        names: &str,
        mut shutdown: Shutdown<'_>,
    ) -> Result<Option<Window>, SourceError> {
        let limits = self.config.limits;
        let params: [&(dyn ToSql + Sync); 3] = [&self.config.slot, &self.catch_up.window, &names];
        let rows = tokio::select! {
            biased;
            _ = shutdown.as_mut() => return Ok(None),
            rows = peek.query_raw(statement, params.iter().map(|p| *p as &dyn ToSql)) => {
                rows.map_err(SourceError::Sql)?
            }
        };
        let mut rows = std::pin::pin!(rows);
        let asked = std::time::Instant::now();
        let mut count = Window {
            rows: 0,
            sent: 0,
            first_row: None,
        };
        let mut pending: Vec<Batch> = Vec::new();
        let mut pending_cost = 0usize;
        loop {
            let row = tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Ok(None),
                row = rows.try_next() => row.map_err(SourceError::Sql)?,
            };
            let Some(row) = row else { break };
            count.rows += 1;
            count.first_row.get_or_insert_with(|| asked.elapsed());
            let lsn: PgLsn = row.try_get(0).map_err(SourceError::Sql)?;
            let data: &[u8] = row.try_get(1).map_err(SourceError::Sql)?;
            let lsn = Lsn(u64::from(lsn));
            self.stats.received_lsn.fetch_max(lsn.0, Ordering::Relaxed);
            self.stats.server_lsn.fetch_max(lsn.0, Ordering::Relaxed);
            if let Some(batch) = assemble(self.assembler, lookups, self.stats, data).await? {
                self.stats
                    .catch_up_changes
                    .fetch_add(batch.changes.len() as u64, Ordering::Relaxed);
                count.sent += 1;
                pending_cost += batch.cost(limits);
                pending.push(batch);
                // Delivered together, as the streaming path does with what
                // one read brought: fewer wake-ups downstream.
                if pending.len() >= super::stream::PENDING_MAX || pending_cost >= limits.max_bytes {
                    pending_cost = 0;
                    if !self.deliver(&mut pending, shutdown.as_mut()).await? {
                        return Ok(None);
                    }
                }
            }
        }
        if !self.deliver(&mut pending, shutdown.as_mut()).await? {
            return Ok(None);
        }
        Ok(Some(count))
    }

    /// Sends `pending` downstream in order; false on shutdown or when the
    /// consumer is gone.
    async fn deliver(
        &mut self,
        pending: &mut Vec<Batch>,
        mut shutdown: Shutdown<'_>,
    ) -> Result<bool, SourceError> {
        for batch in pending.drain(..) {
            let permit = tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Ok(false),
                permit = self.out.reserve(batch.cost(self.config.limits)) => permit,
            };
            let Ok(permit) = permit else {
                return Ok(false);
            };
            hand_over(permit, batch, self.positions, self.stats)?;
        }
        Ok(true)
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
            client
                .query(
                    "SELECT pg_replication_slot_advance($1, $2)",
                    &[&config.slot, &PgLsn::from(flushed.0)],
                )
                .await
                .map_err(SourceError::Sql)?;
            self.stats.confirmed_lsn.store(flushed.0, Ordering::Relaxed);
            self.stats.status_updates.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
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
    let moved = client
        .query(
            "SELECT pg_replication_slot_advance($1, $2)",
            &[&config.slot, &PgLsn::from(flushed.0)],
        )
        .await;
    match moved {
        Ok(_) => {
            stats.confirmed_lsn.store(flushed.0, Ordering::Relaxed);
            tracing::debug!(slot = %config.slot, confirmed = %flushed, "final position confirmed");
        }
        Err(err) => {
            tracing::warn!(slot = %config.slot, error = %crate::pg::error_chain(&err), "could not move the slot to the final checkpoint; the next start replays from the slot's position")
        }
    }
}

async fn flushed_wal(client: &Client) -> Result<Lsn, SourceError> {
    let row = client
        .query_one("SELECT pg_current_wal_flush_lsn()", &[])
        .await
        .map_err(SourceError::Sql)?;
    let lsn: PgLsn = row.try_get(0).map_err(SourceError::Sql)?;
    Ok(Lsn(u64::from(lsn)))
}
