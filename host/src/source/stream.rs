//! The streaming loop: connect, `START_REPLICATION`, turn frames into batches,
//! send them downstream, keep the walsender informed, and reconnect when the
//! connection is lost.
//!
//! Owns the session lifecycle and its timing: status updates on a timer (a
//! fraction of `wal_sender_timeout`, `docs/architecture.md`, pitfall 3), also while waiting on a full
//! downstream channel, immediate answers to reply requests, capped exponential
//! back-off with jitter between attempts, and the fast-forward check after
//! every start (`docs/architecture.md`, pitfall 4). A definite error (see
//! [`SourceError::is_transient`]) ends the loop instead of retrying forever.
//!
//! Positions: every batch is registered with the feedback coordinator before
//! it is sent downstream. `flush` and `apply` in status updates are what the
//! coordinator says is checkpointed; nothing else is ever reported as
//! flushed. A keepalive received with no transaction open and nothing
//! pending lets the coordinator move to its WAL end (the idle rule). A
//! reconnect starts from the checkpoint, and the assembler skips whatever had
//! already been sent downstream, so the consumer sees no duplicate and no gap
//! across reconnects.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::retry::Backoff;
use tokio::time::{Interval, MissedTickBehavior};

use super::assembler::Assembler;
use super::catalog;
use super::catchup::{self, Outcome};
use super::pgoutput::{self, Message};
use super::replication::{Connection, Frame};
use super::{Positions, RowColumns, SourceConfig, SourceError};
use crate::event::Batch;
use crate::event::Lsn;
use crate::pg::{quote_ident, quote_literal};

/// Counters a running source keeps, for status pages and tests.
#[derive(Debug, Default)]
pub struct SourceStats {
    /// The furthest WAL position received.
    pub received_lsn: AtomicU64,
    /// Sessions that ended in a transient error and were retried.
    pub reconnects: AtomicU64,
    /// Batches sent downstream.
    pub batches: AtomicU64,
    /// Changes sent downstream.
    pub changes: AtomicU64,
    /// pgoutput bytes received.
    pub bytes: AtomicU64,
    /// Status updates sent.
    pub status_updates: AtomicU64,
    /// The flush position the last status update reported to PostgreSQL.
    pub confirmed_lsn: AtomicU64,
    /// The walsender's process id in the current session.
    pub walsender_pid: AtomicU64,
    /// The server's WAL position: the furthest its walsender reported, or
    /// `pg_current_wal_lsn()` as last polled (`crate::daemon` polls it
    /// every `SERVER_POLL`, paused or not).
    pub server_lsn: AtomicU64,
    /// WAL the slot holds back on the server (`pg_current_wal_lsn() -
    /// restart_lsn`), as last polled.
    pub slot_retained_bytes: AtomicU64,
    /// When the server was last polled, µs since the Unix epoch (0: never).
    pub server_polled_at: std::sync::atomic::AtomicI64,
    /// The newest commit time among the transactions received, µs since
    /// the Unix epoch.
    pub newest_commit_time: std::sync::atomic::AtomicI64,
    /// Draining the slot through SQL now (`super::catchup`), not streaming.
    pub catching_up: std::sync::atomic::AtomicBool,
    /// Times the source began to drain the slot through SQL.
    pub catch_ups: AtomicU64,
    /// Changes sent downstream from SQL peeks.
    pub catch_up_changes: AtomicU64,
}

/// How often the source looks whether the checkpoint moved past what the
/// server was last told, and tells it: at most this often, so that
/// `confirmed_flush_lsn` follows the state file closely without an update
/// per transaction.
const CONFIRM_PROMPTLY: Duration = Duration::from_millis(100);

/// Ticks of `CONFIRM_PROMPTLY` in a row a stream must be far behind the
/// server, with data arriving, before it leaves for a catch-up.
const BEHIND_TICKS: u32 = 10;

/// Most batches held back to go downstream together.
pub(super) const PENDING_MAX: usize = 256;

/// How long after a delivery downstream the next one waits for more batches
/// to come with it. Each delivery wakes the transform thread, which wakes
/// the sink, which writes and fsyncs: at a high rate of small transactions,
/// delivering each as it arrives made those wake-ups and fsyncs most of the
/// host's work. A transaction arriving after a quiet spell (longer than
/// this) goes at once, so at low rates nothing waits; at high rates the
/// stages wake at most about once per `LINGER` (tokio's timer rounds up to
/// the millisecond), each time for everything that arrived meanwhile.
const LINGER: Duration = Duration::from_millis(1);

type Shutdown<'a> = Pin<&'a mut (dyn Future<Output = ()> + Send)>;

/// Streams from the slot until `shutdown` completes, the receiver of `out`
/// goes away, or a definite error occurs.
///
/// `resume_after` is the end LSN of the last transaction already processed
/// (the checkpoint), or [`Lsn::ZERO`] to start from the slot's confirmed
/// position. `positions` learns of every batch sent and says what is
/// checkpointed.
///
/// After `shutdown`, `out` is dropped (the stages downstream end) and the
/// connection stays open until `settled` completes — the caller's final
/// checkpoint — so that the slot is confirmed up to it before the
/// connection closes. A clean stop thus leaves the slot where the state
/// file is, and a restart without the state file (an adopted slot) does
/// not deliver the last transactions again.
pub async fn run(
    config: SourceConfig,
    resume_after: Lsn,
    out: crate::channel::Sender<Batch>,
    positions: Arc<dyn Positions>,
    stats: Arc<SourceStats>,
    shutdown: impl Future<Output = ()> + Send,
    settled: impl Future<Output = ()> + Send,
) -> Result<(), SourceError> {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut shutdown: Shutdown<'_> = shutdown.as_mut();
    let mut assembler = Assembler::new(config.limits, resume_after);
    let mut backoff = Backoff::new(config.reconnect_initial, config.reconnect_max);
    let mut requested = resume_after;
    // Until when a catch-up is not tried again, after the server refused
    // the copy it needs.
    let mut refused_until: Option<Instant> = None;
    loop {
        if let Some(catch_up) = config.catch_up
            && refused_until.is_none_or(|until| Instant::now() >= until)
        {
            let mut reader = catchup::Reader {
                config: &config,
                catch_up,
                assembler: &mut assembler,
                out: &out,
                positions: &*positions,
                stats: &stats,
                requested,
            };
            match reader.run(shutdown.as_mut()).await {
                Ok(outcome @ (Outcome::Caught | Outcome::Unavailable)) => {
                    if let Outcome::Unavailable = outcome {
                        refused_until = Some(Instant::now() + catch_up.retry_refused_after);
                    }
                    let checkpoint = positions.flushed();
                    requested = requested.max(checkpoint);
                    assembler.reconnected(checkpoint);
                }
                Ok(Outcome::Stopped(client)) => {
                    drop(out);
                    settled.await;
                    catchup::confirm(&client, &config, positions.flushed(), &stats).await;
                    return Ok(());
                }
                Err(err) if err.is_transient() => {
                    if !retry_after(&config, &stats, &mut backoff, &err, shutdown.as_mut()).await {
                        return Ok(());
                    }
                    let checkpoint = positions.flushed();
                    requested = requested.max(checkpoint);
                    assembler.reconnected(checkpoint);
                    continue;
                }
                Err(err) => return Err(err),
            }
        }
        let mut session = Session {
            config: &config,
            assembler: &mut assembler,
            out: &out,
            positions: &*positions,
            stats: &stats,
            // A catch-up read the slot up to here (perhaps finding nothing).
            received: requested.max(Lsn(stats.received_lsn.load(Ordering::Relaxed))),
            streaming: false,
            idle_at: None,
            data_seen: false,
            behind_ticks: 0,
            catch_up_from: refused_until,
        };
        let outcome = session.run(requested, shutdown.as_mut()).await;
        let streamed = session.streaming;
        let received = session.received;
        match outcome {
            Ok(Exit::Behind(conn)) => {
                // Far behind the server: the next round drains it through
                // SQL, from the checkpoint.
                conn.close().await;
                let checkpoint = positions.flushed();
                requested = requested.max(checkpoint);
                assembler.reconnected(checkpoint);
            }
            Ok(Exit::Stopped(mut conn)) => {
                // Stopped: nothing more goes downstream. The connection
                // stays open until what is in flight is checkpointed, so
                // that the slot hears of the final checkpoint.
                drop(out);
                settled.await;
                let flushed = positions.flushed();
                stats.status_updates.fetch_add(1, Ordering::Relaxed);
                let sent = conn
                    .send_status(received.max(flushed), flushed, flushed, false)
                    .await;
                if sent.is_ok() {
                    stats.confirmed_lsn.store(flushed.0, Ordering::Relaxed);
                    tracing::debug!(slot = %config.slot, confirmed = %flushed, "final position confirmed");
                }
                conn.close().await;
                return Ok(());
            }
            Err(err) if err.is_transient() => {
                if streamed {
                    backoff.reset();
                }
                if !retry_after(&config, &stats, &mut backoff, &err, shutdown.as_mut()).await {
                    return Ok(());
                }
                let checkpoint = positions.flushed();
                requested = requested.max(checkpoint);
                assembler.reconnected(checkpoint);
            }
            Err(err) => return Err(err),
        }
    }
}

/// After a transient failure: counts it, logs it and waits the back-off;
/// false when shutdown came first.
async fn retry_after(
    config: &SourceConfig,
    stats: &SourceStats,
    backoff: &mut Backoff,
    err: &SourceError,
    mut shutdown: Shutdown<'_>,
) -> bool {
    stats.reconnects.fetch_add(1, Ordering::Relaxed);
    let wait = backoff.next_wait();
    tracing::warn!(
        slot = %config.slot,
        error = %err,
        retry_in = ?wait,
        "replication interrupted; reconnecting"
    );
    tokio::select! {
        _ = shutdown.as_mut() => false,
        _ = tokio::time::sleep(wait) => true,
    }
}

/// How a streaming session ended without an error.
enum Exit {
    /// Shutdown: the connection is kept for the final status update.
    Stopped(Connection),
    /// The slot fell behind the server by more than `source.catch_up`.
    Behind(Connection),
}

/// One pgoutput message: decoded (the types of a new relation looked up
/// in the catalog through `client`) and assembled; a batch when one is
/// complete.
pub(super) async fn assemble(
    assembler: &mut Assembler,
    client: &tokio_postgres::Client,
    stats: &SourceStats,
    data: &[u8],
) -> Result<Option<Batch>, SourceError> {
    stats.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
    let message = pgoutput::decode(data)?;
    if let Message::Relation(relation) = &message {
        let missing = assembler.missing_types(relation);
        if !missing.is_empty() {
            let types = catalog::resolve_types(client, &missing).await?;
            assembler.add_types(types);
        }
    }
    assembler.push(message)
}

/// Registers `batch` with the coordinator and sends it downstream: from
/// here on the coordinator knows it is in flight.
pub(super) fn hand_over(
    permit: crate::channel::Permit<'_, Batch>,
    batch: Batch,
    positions: &dyn Positions,
    stats: &SourceStats,
) -> Result<(), SourceError> {
    let changes = batch.changes.len() as u64;
    positions.register(&batch.txn)?;
    stats
        .newest_commit_time
        .fetch_max(batch.txn.commit_time, Ordering::Relaxed);
    permit.send(batch);
    stats.batches.fetch_add(1, Ordering::Relaxed);
    stats.changes.fetch_add(changes, Ordering::Relaxed);
    Ok(())
}

/// Where a source sends its batches, and who learns of them.
#[derive(Clone, Copy)]
pub(super) struct Downstream<'a> {
    pub out: &'a crate::channel::Sender<Batch>,
    pub positions: &'a dyn Positions,
    pub stats: &'a SourceStats,
    pub limits: crate::event::BatchLimits,
}

impl Downstream<'_> {
    /// Hands `pending` over in order, each once there is room downstream;
    /// false when shutdown came first or the consumer is gone.
    pub(super) async fn deliver_all(
        self,
        pending: &mut Vec<Batch>,
        mut shutdown: Shutdown<'_>,
    ) -> Result<bool, SourceError> {
        for batch in pending.drain(..) {
            let permit = tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Ok(false),
                permit = self.out.reserve(batch.cost(self.limits)) => permit,
            };
            let Ok(permit) = permit else {
                return Ok(false);
            };
            hand_over(permit, batch, self.positions, self.stats)?;
        }
        Ok(true)
    }

    /// How a session ended, `result`, once what it read is downstream: a
    /// session that failed may have left batches assembled before the
    /// failure in `pending`. They are whole transactions (or whole chunks
    /// of one), and the assembler counts them as sent, so that the
    /// reconnect skips what it sends again: they go downstream now, or they
    /// would be lost. A shutdown meanwhile ends the source, and its restart
    /// reads them again from the checkpoint.
    pub(super) async fn settle<T>(
        self,
        result: Result<T, SourceError>,
        pending: &mut Vec<Batch>,
        shutdown: Shutdown<'_>,
    ) -> Result<T, SourceError> {
        let err = match result {
            Ok(done) => return Ok(done),
            Err(err) if pending.is_empty() => return Err(err),
            Err(err) => err,
        };
        let held = pending.len();
        match self.deliver_all(pending, shutdown).await {
            Ok(_) => {
                tracing::debug!(batches = held, error = %err, "batches read before the failure went downstream");
                Err(err)
            }
            Err(delivering) => {
                tracing::warn!(error = %err, "the session failed, then handing over what it had read failed too");
                Err(delivering)
            }
        }
    }
}

struct Session<'a> {
    config: &'a SourceConfig,
    assembler: &'a mut Assembler,
    out: &'a crate::channel::Sender<Batch>,
    positions: &'a dyn Positions,
    stats: &'a SourceStats,
    received: Lsn,
    streaming: bool,
    /// The WAL end of the last keepalive that came between transactions:
    /// where the idle rule may move the checkpoint once nothing is pending.
    idle_at: Option<Lsn>,
    /// Data arrived since the last `CONFIRM_PROMPTLY` tick.
    data_seen: bool,
    /// Consecutive ticks with data arriving and the slot more than
    /// `source.catch_up` behind the server.
    behind_ticks: u32,
    /// No catch-up before then (the server refused the last one's copy).
    catch_up_from: Option<Instant>,
}

enum Flow {
    Continue,
    Stop,
}

impl<'a> Session<'a> {
    /// Streams until `shutdown`, then hands back the open connection for
    /// the final status update. On a failure, what was read before it goes
    /// downstream first ([`Downstream::settle`]).
    async fn run(
        &mut self,
        requested: Lsn,
        mut shutdown: Shutdown<'_>,
    ) -> Result<Exit, SourceError> {
        let mut pending = Vec::new();
        let result = self
            .stream(requested, &mut pending, shutdown.as_mut())
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

    /// The session's loop; on an error, `pending` holds the batches read
    /// and not yet handed over, in order.
    async fn stream(
        &mut self,
        requested: Lsn,
        pending: &mut Vec<Batch>,
        mut shutdown: Shutdown<'_>,
    ) -> Result<Exit, SourceError> {
        let config = self.config;
        let (client, mut conn, interval) = self.start(requested).await?;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut prompt = tokio::time::interval(CONFIRM_PROMPTLY);
        prompt.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut pending_cost = 0usize;
        // When the last delivery went downstream, and a timer for the end
        // of the linger after it (armed only while batches wait).
        let mut delivered_at: Option<tokio::time::Instant> = None;
        let linger = tokio::time::sleep(Duration::ZERO);
        let mut linger = std::pin::pin!(linger);
        let mut lingering = false;
        loop {
            // Batches go downstream together: those assembled from what one
            // read brought, and those that arrived during the linger after
            // the previous delivery. At most PENDING_MAX batches or one full
            // batch's cost.
            if !pending.is_empty() {
                let full = pending.len() >= PENDING_MAX || pending_cost >= config.limits.max_bytes;
                // Nothing more buffered: the next step would wait for the
                // socket.
                let idle = !conn.has_message();
                let waited = delivered_at.is_none_or(|at| at.elapsed() >= LINGER);
                if full || (idle && waited) {
                    lingering = false;
                    delivered_at = Some(tokio::time::Instant::now());
                    if let Flow::Stop = self
                        .deliver_pending(
                            pending,
                            &mut pending_cost,
                            &mut conn,
                            &mut tick,
                            shutdown.as_mut(),
                        )
                        .await?
                    {
                        return self.finish(conn).await.map(Exit::Stopped);
                    }
                } else if idle
                    && !lingering
                    && let Some(at) = delivered_at
                {
                    lingering = true;
                    linger.as_mut().reset(at + LINGER);
                }
            }
            // What one read brought is taken frame by frame without
            // waiting; only then does the loop wait for the socket, the
            // status timer, the linger or shutdown.
            let frame = match conn.try_recv()? {
                Some(frame) => frame,
                None => tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => return self.finish(conn).await.map(Exit::Stopped),
                    _ = tick.tick() => {
                        self.send_status(&mut conn, false).await?;
                        continue;
                    }
                    _ = prompt.tick() => {
                        // A keepalive that came while batches were still
                        // in flight could not move the checkpoint then. The
                        // walsender pings again only once it has read WAL
                        // past what this session reported: it may never
                        // send another on a quiet server. Nothing after it
                        // was open, so once those batches are acknowledged
                        // its position holds.
                        if let Some(at) = self.idle_at
                            && !self.assembler.in_transaction()
                        {
                            self.positions.idle(at);
                        }
                        // The checkpoint moved since the last update: say
                        // so now, not at the next scheduled update.
                        let confirmed = Lsn(self.stats.confirmed_lsn.load(Ordering::Relaxed));
                        if self.positions.flushed() > confirmed {
                            self.send_status(&mut conn, false).await?;
                        }
                        if self.behind() {
                            // Between transactions, with what was read
                            // delivered: the catch-up starts cleanly.
                            if let Flow::Stop = self
                                .deliver_pending(
                                    pending,
                                    &mut pending_cost,
                                    &mut conn,
                                    &mut tick,
                                    shutdown.as_mut(),
                                )
                                .await?
                            {
                                return self.finish(conn).await.map(Exit::Stopped);
                            }
                            let lag = self.stats.server_lsn.load(Ordering::Relaxed).saturating_sub(self.received.0);
                            tracing::info!(slot = %config.slot, lag_bytes = lag, "the stream fell far behind the server");
                            return self.finish(conn).await.map(Exit::Behind);
                        }
                        continue;
                    }
                    () = linger.as_mut(), if lingering => {
                        lingering = false;
                        continue;
                    }
                    frame = conn.recv() => frame?,
                },
            };
            self.streaming = true;
            match frame {
                Frame::XLogData { wal_end, data } => {
                    self.data_seen = true;
                    if let Some(batch) = self.take(&client, wal_end, &data).await? {
                        pending_cost += batch.cost(config.limits);
                        pending.push(batch);
                    }
                }
                Frame::Keepalive { wal_end, reply } => {
                    // Batches before it are delivered (registered
                    // with the coordinator) before an idle position
                    // can pass them.
                    if let Flow::Stop = self
                        .deliver_pending(
                            pending,
                            &mut pending_cost,
                            &mut conn,
                            &mut tick,
                            shutdown.as_mut(),
                        )
                        .await?
                    {
                        return self.finish(conn).await.map(Exit::Stopped);
                    }
                    if !self.assembler.in_transaction() {
                        self.advance(wal_end);
                        // `docs/architecture.md`, rule 4: nothing open, nothing
                        // pending: an idle slot must not pin WAL.
                        self.positions.idle(wal_end);
                        self.idle_at = Some(wal_end);
                    }
                    if reply {
                        self.send_status(&mut conn, false).await?;
                    }
                }
                Frame::CopyDone => {
                    // Transient: a restarting server ends streams this way.
                    return Err(SourceError::Io(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the server ended the replication stream (shutting down or restarting?)",
                    )));
                }
            }
        }
    }

    /// Connects, starts replication at `requested` and reads the slot back:
    /// a start before `confirmed_flush_lsn` silently begins there
    /// (`docs/architecture.md`, pitfall 4), which is an error. The SQL
    /// connection (for type lookups), the replication connection, and how
    /// often to send status updates.
    async fn start(
        &mut self,
        requested: Lsn,
    ) -> Result<(tokio_postgres::Client, Connection, Duration), SourceError> {
        let config = self.config;
        let client = catalog::connect(&config.conninfo).await?;
        let interval = match config.status_interval {
            Some(interval) => interval,
            None => status_interval(&client).await?,
        };
        let mut conn = Connection::connect(&config.conninfo).await?;
        self.stats
            .walsender_pid
            .store(conn.backend_pid() as u64, Ordering::Relaxed);
        let command = format!(
            "START_REPLICATION SLOT {} LOGICAL {requested} (proto_version '1', \
             publication_names {}, messages 'true')",
            quote_ident(&config.slot),
            quote_literal(&quote_ident(&config.publication)),
        );
        conn.start_replication(&command).await?;
        if requested != Lsn::ZERO
            && let Some(state) = catalog::slot_state(&client, &config.slot).await?
            && let Some(confirmed) = state.confirmed_flush
            && confirmed > requested
        {
            if config.follow_slot {
                // Another host's last confirmation landed between this
                // host reading the slot and starting it (a takeover):
                // everything before it is in that host's sink.
                tracing::info!(slot = %config.slot, requested = %requested, %confirmed, "the slot was confirmed past the start by another host: streaming from the slot's position");
            } else {
                conn.close().await;
                return Err(SourceError::FastForward {
                    slot: config.slot.clone(),
                    requested,
                    confirmed,
                });
            }
        }
        tracing::info!(slot = %config.slot, start = %requested, pid = conn.backend_pid(), "replication started");
        Ok((client, conn, interval))
    }

    /// One pgoutput message: decoded (the types of a new relation looked up
    /// in the catalog) and assembled; a batch when one is complete.
    async fn take(
        &mut self,
        client: &tokio_postgres::Client,
        wal_end: Lsn,
        data: &[u8],
    ) -> Result<Option<Batch>, SourceError> {
        self.advance(wal_end);
        assemble(self.assembler, client, self.stats, data).await
    }

    /// Whether to leave streaming for a catch-up, asked every
    /// `CONFIRM_PROMPTLY`: configured, between transactions, and for
    /// `BEHIND_TICKS` ticks in a row data kept arriving while the server
    /// (as last polled) was further ahead of what was read than the
    /// threshold. A quiet slot is never behind: its position follows the
    /// walsender's keepalives, and other databases' WAL is not its backlog.
    fn behind(&mut self) -> bool {
        let Some(catch_up) = self.config.catch_up else {
            return false;
        };
        if self.catch_up_from.is_some_and(|from| Instant::now() < from) {
            return false;
        }
        let server = self.stats.server_lsn.load(Ordering::Relaxed);
        let far = server.saturating_sub(self.received.0) > catch_up.threshold;
        if far && self.data_seen {
            self.behind_ticks = self.behind_ticks.saturating_add(1);
        } else {
            self.behind_ticks = 0;
        }
        self.data_seen = false;
        self.behind_ticks >= BEHIND_TICKS && !self.assembler.in_transaction()
    }

    fn advance(&mut self, lsn: Lsn) {
        if lsn > self.received {
            self.received = lsn;
            self.stats.received_lsn.store(lsn.0, Ordering::Relaxed);
            self.stats.server_lsn.fetch_max(lsn.0, Ordering::Relaxed);
        }
    }

    /// Tells the server what is checkpointed so far and hands the
    /// connection back: the caller confirms the final position.
    async fn finish(&mut self, mut conn: Connection) -> Result<Connection, SourceError> {
        self.send_status(&mut conn, false).await?;
        Ok(conn)
    }

    async fn send_status(&mut self, conn: &mut Connection, reply: bool) -> Result<(), SourceError> {
        // Exactly what is checkpointed: never more.
        let flushed = self.positions.flushed();
        self.stats.status_updates.fetch_add(1, Ordering::Relaxed);
        conn.send_status(self.received.max(flushed), flushed, flushed, reply)
            .await?;
        self.stats.confirmed_lsn.store(flushed.0, Ordering::Relaxed);
        Ok(())
    }

    /// Sends every pending batch downstream, in order.
    async fn deliver_pending(
        &mut self,
        pending: &mut Vec<Batch>,
        pending_cost: &mut usize,
        conn: &mut Connection,
        tick: &mut Interval,
        mut shutdown: Shutdown<'_>,
    ) -> Result<Flow, SourceError> {
        *pending_cost = 0;
        let mut batches = pending.drain(..);
        while let Some(batch) = batches.next() {
            let permit = match self
                .room(
                    batch.cost(self.config.limits),
                    conn,
                    tick,
                    shutdown.as_mut(),
                )
                .await
            {
                Ok(Some(permit)) => permit,
                Ok(None) => return Ok(Flow::Stop),
                Err(err) => {
                    // Kept, in order, for `run` to hand over.
                    let rest: Vec<Batch> = std::iter::once(batch).chain(batches.by_ref()).collect();
                    drop(batches);
                    *pending = rest;
                    return Err(err);
                }
            };
            hand_over(permit, batch, self.positions, self.stats)?;
        }
        Ok(Flow::Continue)
    }

    /// Room downstream for a batch of `cost`, answering the server on
    /// schedule while the channel is full; `None` on shutdown or when the
    /// consumer is gone (nothing left to stream for).
    async fn room(
        &mut self,
        cost: usize,
        conn: &mut Connection,
        tick: &mut Interval,
        mut shutdown: Shutdown<'_>,
    ) -> Result<Option<crate::channel::Permit<'a, Batch>>, SourceError> {
        let out = self.out;
        let reserve = out.reserve(cost);
        let mut reserve = std::pin::pin!(reserve);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Ok(None),
                permit = reserve.as_mut() => return Ok(permit.ok()),
                _ = tick.tick() => self.send_status(conn, false).await?,
            }
        }
    }
}

/// A sixth of `wal_sender_timeout`, at most 10 s, at least 100 ms.
async fn status_interval(client: &tokio_postgres::Client) -> Result<Duration, SourceError> {
    let row = client
        .query_one(
            "SELECT setting::int8 FROM pg_settings WHERE name = 'wal_sender_timeout'",
            &[],
        )
        .await
        .map_err(SourceError::Sql)?;
    let timeout_ms: i64 = row.col(0)?;
    Ok(interval_for(timeout_ms))
}

fn interval_for(wal_sender_timeout_ms: i64) -> Duration {
    let ceiling = Duration::from_secs(10);
    if wal_sender_timeout_ms <= 0 {
        return ceiling;
    }
    (Duration::from_millis(wal_sender_timeout_ms as u64) / 6)
        .clamp(Duration::from_millis(100), ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_interval_stays_well_inside_the_timeout() {
        assert_eq!(interval_for(60_000), Duration::from_secs(10));
        assert_eq!(interval_for(6_000), Duration::from_secs(1));
        assert_eq!(interval_for(0), Duration::from_secs(10), "timeout disabled");
        assert_eq!(interval_for(60), Duration::from_millis(100));
    }
}
