//! The transform stage: a thread of its own (modules are CPU-bound and must
//! not stall the async workers) that takes the source's batches in stream
//! order, takes snapshot watermarks out and places each copied chunk at its
//! high watermark (`snapshot.rs`), puts schema changes in
//! (`source/shapes.rs`), runs the active module chain and hands what it made
//! to the sink stage.
//!
//! **A copy does not hold up the live stream.** A placed chunk carries up to
//! `chunk_size` rows. Run and written as one, it would keep every live
//! transaction behind it waiting for all of them. Instead the chunk waits in
//! a *held* queue and goes through the chain and to the sink in parts of
//! [`PART_ROWS`] rows. A later batch that touches none of the held batches'
//! tables passes them: it is transformed and handed on at once. A batch
//! that touches a held table (or is a later chunk of a held transaction, or
//! carries a logical message, which names no table) joins the queue behind
//! them, so one table's changes reach the sink in stream order and its
//! copied rows never come after a later change of theirs. With
//! `snapshot.order = "commit"` nothing passes (`Held::commit_order`).
//!
//! While live batches pass, a part goes to the sink stage only once that
//! stage has taken the part before it from the channel, so a live batch
//! queues behind at most one part there (a part also goes when the held
//! queue waited [`PART_WAIT_MAX`] behind a flood of live batches). With no
//! live traffic, parts follow each other at once and the sink writes them
//! in groups.
//!
//! Delivery order across tables is then not commit order, and need not be:
//! the feedback coordinator checkpoints only the prefix in commit order of
//! what was acknowledged (`feedback.rs`), and a batch split into parts is
//! acknowledged by its last part ([`Ack`]). After a crash, a batch that
//! passed a chunk is delivered again with it: at least once, as always.
//! A new module version is adopted only when nothing is held, between
//! transactions.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::channel;
use crate::config::SnapshotOrder;
use crate::daemon::canary::{Canary, Tap};
use crate::daemon::hotswap::ActiveChain;
use crate::daemon::pipeline::{GROUP_MAX_BATCHES, PipelineConfig, PipelineStats};
use crate::daemon::snapshot::Snapshots;
use crate::event::{Batch, BatchLimits, Change, Lsn};
use crate::source::shapes::Tracker;
use crate::transform::Transformed;
use crate::transform::chain::{Chain, ChainError};
use datum_guest::Txn;

/// Rows of a held batch run through the chain and handed to the sink at a
/// time: about 1 ms of work for the `identity` module and the file sink.
pub(crate) const PART_ROWS: usize = 1_000;

/// Longest the held queue waits for its next part while live batches keep
/// coming.
pub(crate) const PART_WAIT_MAX: Duration = Duration::from_millis(20);

/// How long after a live batch the stage still spaces parts out for live
/// traffic.
const LIVE_RECENT: Duration = Duration::from_millis(100);

/// Whether delivering something acknowledges its source batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ack {
    /// The whole batch: delivered, it is acknowledged.
    Batch,
    /// A part before the last: its batch is acknowledged with the last part
    /// (parts of a batch reach the sink stage in order).
    Later,
    /// The last part of a batch cut into parts: delivered, the batch is
    /// acknowledged as the transaction chunk it came as, this one (the
    /// parts carry chunk numbers of their own).
    LastPart(u32),
}

impl Ack {
    /// The transaction chunk that delivering `txn`'s batch or part
    /// acknowledges, if any.
    pub(crate) fn acknowledges(self, txn: &Txn) -> Option<Txn> {
        match self {
            Ack::Batch => Some(*txn),
            Ack::Later => None,
            Ack::LastPart(chunk) => Some(Txn { chunk, ..*txn }),
        }
    }
}

/// What the sink stage keeps with a transformed batch until it is
/// delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Receipt {
    /// What delivering it acknowledges.
    pub(crate) ack: Ack,
    /// The version of the chain's last module, which made the output, as
    /// this thread ran it (0: no modules, or one outside the registry): a
    /// dead letter of the sink's refusal names it.
    pub(crate) version: u64,
}

/// What the transform stage hands the sink stage.
pub(crate) enum Staged {
    /// Through the chain.
    Ready(Transformed, Receipt),
    /// A module failed on it: the error, and the failing module's version
    /// as this thread ran it (the sink stage, some batches behind, may see
    /// a newer version in force by the time it handles the failure).
    Failed(Batch, ChainError, Ack, u64),
}

/// Starts the transform thread: batches from `input`, results to `output`,
/// resuming after `resume_after`.
pub(crate) fn spawn(
    config: &PipelineConfig,
    active: &Arc<ActiveChain>,
    resume_after: Lsn,
    (input, output): (channel::Receiver<Batch>, channel::Sender<Staged>),
    snapshots: &Arc<Snapshots>,
    shapes: Tracker,
) -> std::thread::JoinHandle<()> {
    let name = config.name.clone();
    let runtime = tokio::runtime::Handle::current();
    let span = tracing::info_span!("transforms", pipeline = %name);
    let (chain, empty) = active.attach(resume_after);
    let stage = Stage {
        tap: Tap::new(&chain),
        chain,
        empty,
        last_version: last_version(active),
        active: active.clone(),
        canary: config.canary.clone(),
        counters: config.stats.clone(),
        limits: config.source.limits,
    };
    let lanes = Lanes {
        input,
        output,
        snapshots: snapshots.clone(),
        shapes,
        held: Held {
            commit_order: config.snapshot.order == SnapshotOrder::Commit,
            ..Held::default()
        },
        boundary: resume_after,
        settled: resume_after,
        received_last: true,
        last_live: None,
        last_part: Instant::now(),
        part_slot: Arc::new(Semaphore::new(1)),
        ended: false,
    };
    std::thread::Builder::new()
        .name(format!("datum-transform-{name}"))
        .stack_size(crate::transform::engine::CALLER_STACK)
        .spawn(move || {
            let _entered = span.enter();
            let _abandon = AbandonOnPanic(stage.active.clone());
            lanes.run(stage, &runtime);
        })
        .expect("spawning the transform thread")
}

/// Tells the chain when the transform thread dies by a panic, so that a
/// swap waiting for the thread to adopt it is answered instead of waiting
/// for ever (and holding the chain's turn to swap).
struct AbandonOnPanic(Arc<ActiveChain>);

impl Drop for AbandonOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.abandon();
        }
    }
}

/// The module chain and what it reports to.
struct Stage {
    chain: Chain,
    /// The chain has no modules: batches pass untouched.
    empty: bool,
    /// The version of the chain's last module (0: none).
    last_version: u64,
    /// A canary of a new version is fed from here (`canary.rs`).
    tap: Tap,
    active: Arc<ActiveChain>,
    canary: Arc<Canary>,
    counters: Arc<PipelineStats>,
    limits: BatchLimits,
}

impl Stage {
    /// Between transactions, with nothing held: adopts a version waiting to
    /// be, and follows a canary started or ended.
    fn between(&mut self, boundary: Lsn) {
        if self.active.pending() {
            self.chain = self.active.adopt(boundary);
            self.empty = self.chain.modules().next().is_none();
            self.last_version = last_version(&self.active);
            self.tap.adopted(&self.chain);
        }
        self.tap.boundary(&self.canary, boundary);
    }

    /// Runs `batch` through the chain; what to hand on and its size.
    fn run(&mut self, batch: Batch, ack: Ack) -> (Staged, usize) {
        let bytes = batch.cost(self.limits);
        let receipt = Receipt {
            ack,
            version: self.last_version,
        };
        if self.empty {
            return (Staged::Ready(Transformed::untouched(batch), receipt), bytes);
        }
        let started = Instant::now();
        let result = self.chain.run_ref(&batch);
        let took = started.elapsed();
        self.counters.observe_transform(took.as_micros() as u64);
        if self.tap.feeding() {
            let output = result.as_deref().map_err(|_| ());
            self.tap.offer(&batch, output, took, bytes);
        }
        let staged = match result {
            Ok(items) => Staged::Ready(
                Transformed {
                    source: batch,
                    items,
                },
                receipt,
            ),
            Err(error) => {
                let version = self.active.version_in_force(&error.module);
                Staged::Failed(batch, error, ack, version)
            }
        };
        (staged, bytes)
    }
}

/// The version of the last module in force in `active` (0: none).
fn last_version(active: &ActiveChain) -> u64 {
    active.info().last().map_or(0, |s| s.version)
}

/// What is handed to the sink stage: the item, its size, and for a part the
/// slot it holds until the sink stage takes it.
type Outgoing = (Staged, usize, Option<OwnedSemaphorePermit>);

/// What the thread does next.
enum Next {
    /// A batch from the source.
    Batch(Batch),
    /// A part of the first held batch.
    Part,
    /// A new version or a canary may wait to be taken up.
    Woken,
    /// The source sent everything it will.
    Ended,
}

/// The stream through the stage: the live lane and the held queue.
struct Lanes {
    input: channel::Receiver<Batch>,
    output: channel::Sender<Staged>,
    snapshots: Arc<Snapshots>,
    shapes: Tracker,
    held: Held,
    /// The end of the last whole transaction received.
    boundary: Lsn,
    /// `boundary` when nothing was last held: everything before it went
    /// through the chain.
    settled: Lsn,
    /// The last batch received ended its transaction.
    received_last: bool,
    /// When a batch with changes last went the live lane.
    last_live: Option<Instant>,
    /// When the last part was handed on.
    last_part: Instant,
    /// Held by a part handed on until the sink stage takes it from the
    /// channel: while live batches pass, the next part waits for it.
    part_slot: Arc<Semaphore>,
    /// The source ended: the held queue drains, nothing more comes.
    ended: bool,
}

impl Lanes {
    fn run(mut self, mut stage: Stage, runtime: &tokio::runtime::Handle) {
        // What was made since the last send, handed on together so that the
        // sink wakes once for all of it.
        let mut outputs: Vec<Outgoing> = Vec::new();
        loop {
            if self.held.is_empty() {
                self.settled = self.boundary;
                if self.ended {
                    break;
                }
            }
            match self.next(&stage, runtime) {
                Next::Ended => self.ended = true,
                Next::Woken => {
                    if self.between() {
                        stage.between(self.boundary);
                    }
                }
                Next::Part => {
                    if let Some((part, ack)) = self.held.take_part(stage.limits) {
                        let (staged, bytes) = stage.run(part, ack);
                        let slot = self.part_slot.clone().try_acquire_owned().ok();
                        outputs.push((staged, bytes, slot));
                        self.last_part = Instant::now();
                    }
                    // The held queue may just have emptied: a version
                    // published meanwhile is adopted now, not at the next
                    // batch (which an idle stream may not send).
                    if self.between() {
                        stage.between(self.boundary);
                    }
                }
                Next::Batch(batch) => {
                    let mut bytes = self.take(batch, &mut stage, &mut outputs);
                    // Whatever else waits, up to a group.
                    while outputs.len() < GROUP_MAX_BATCHES
                        && bytes < stage.limits.max_bytes
                        && self.room(stage.limits)
                    {
                        match self.input.try_recv() {
                            Some(batch) => bytes += self.take(batch, &mut stage, &mut outputs),
                            None => break,
                        }
                    }
                }
            }
            for (staged, bytes, slot) in outputs.drain(..) {
                let sent = runtime.block_on(async {
                    let permit = self.output.reserve(bytes).await?;
                    match slot {
                        Some(slot) => permit.send_holding(staged, slot),
                        None => permit.send(staged),
                    }
                    Ok::<(), channel::Closed>(())
                });
                if sent.is_err() {
                    // The sink stage is gone.
                    stage.active.detach(self.settled);
                    return;
                }
            }
        }
        stage.active.detach(self.settled);
    }

    /// Nothing held and the last batch received ended its transaction.
    fn between(&self) -> bool {
        self.held.is_empty() && self.received_last
    }

    /// Whether to take more from the source: a bounded amount is held.
    fn room(&self, limits: BatchLimits) -> bool {
        !self.ended && self.held.cost < limits.max_bytes.saturating_mul(2)
    }

    /// Chooses what to do next, waiting when there is nothing: a batch
    /// from the source comes first; a part when one is due.
    fn next(&mut self, stage: &Stage, runtime: &tokio::runtime::Handle) -> Next {
        let held = !self.held.is_empty();
        let starved = held && self.last_part.elapsed() >= PART_WAIT_MAX;
        if starved || (held && self.ended) {
            return Next::Part;
        }
        let room = self.room(stage.limits);
        if room && let Some(batch) = self.input.try_recv() {
            return Next::Batch(batch);
        }
        let live = self.last_live.is_some_and(|at| at.elapsed() < LIVE_RECENT);
        if held && (!live || self.part_slot.available_permits() > 0) {
            return Next::Part;
        }
        let between = self.between();
        let part_at = tokio::time::Instant::from_std(self.last_part + PART_WAIT_MAX);
        let (input, slot, active) = (&mut self.input, &self.part_slot, &stage.active);
        runtime.block_on(async {
            tokio::select! {
                biased;
                () = active.woken(), if between => Next::Woken,
                batch = input.recv(), if room => batch.map_or(Next::Ended, Next::Batch),
                _ = slot.acquire(), if held => Next::Part,
                () = tokio::time::sleep_until(part_at), if held => Next::Part,
            }
        })
    }

    /// Takes one batch from the source: watermarks out and chunks placed,
    /// schema changes in; then it runs at once or joins the held queue.
    /// The bytes handed on.
    fn take(&mut self, mut batch: Batch, stage: &mut Stage, outputs: &mut Vec<Outgoing>) -> usize {
        if self.between() {
            stage.between(self.boundary);
        }
        self.received_last = batch.txn.last;
        if batch.txn.last {
            self.boundary = Lsn(batch.txn.end_lsn);
        }
        self.snapshots.observe(&mut batch);
        let announced = self.shapes.observe(&mut batch);
        if announced > 0 {
            stage
                .counters
                .schema_changes
                .fetch_add(announced as u64, Ordering::Relaxed);
        }
        if self.held.holds(&batch) {
            self.held.push(batch, stage.limits);
            return 0;
        }
        if !batch.changes.is_empty() {
            self.last_live = Some(Instant::now());
        }
        let (staged, bytes) = stage.run(batch, Ack::Batch);
        outputs.push((staged, bytes, None));
        bytes
    }
}

/// Batches waiting behind a placed chunk, in stream order.
#[derive(Default)]
struct Held {
    batches: VecDeque<Batch>,
    /// Each table a held batch touches, with how many held batches do.
    tables: HashMap<u32, usize>,
    /// How many held batches carry a logical message.
    messages: usize,
    /// What the held batches count against the stage's budget.
    cost: usize,
    /// `snapshot.order = "commit"`: nothing passes what is held.
    commit_order: bool,
    /// The first held batch's transaction chunk number as it came, once
    /// parts of it went.
    parted: Option<u32>,
}

/// The tables a batch touches, each once; `None` when it carries a logical
/// message, which may concern any table.
fn tables(batch: &Batch) -> Option<Vec<u32>> {
    (!batch.has_message()).then(|| batch.tables())
}

/// Whether a batch carries rows of a copy.
fn copied(batch: &Batch) -> bool {
    batch
        .changes
        .iter()
        .any(|c| matches!(c, Change::Snapshot { .. }))
}

impl Held {
    fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    /// Whether `batch` must wait behind the held batches (or, carrying rows
    /// of a copy, be held itself to go in parts).
    fn holds(&self, batch: &Batch) -> bool {
        if copied(batch) {
            return true;
        }
        let Some(newest) = self.batches.back() else {
            return false;
        };
        if self.commit_order
            || self.messages > 0
            || (newest.txn.commit_lsn == batch.txn.commit_lsn && newest.txn.xid == batch.txn.xid)
        {
            return true;
        }
        match tables(batch) {
            None => true,
            Some(oids) => oids.iter().any(|oid| self.tables.contains_key(oid)),
        }
    }

    fn push(&mut self, batch: Batch, limits: BatchLimits) {
        match tables(&batch) {
            None => self.messages += 1,
            Some(oids) => {
                for oid in oids {
                    *self.tables.entry(oid).or_default() += 1;
                }
            }
        }
        self.cost += batch.cost(limits);
        self.batches.push_back(batch);
    }

    /// The next part of the first held batch: its first `PART_ROWS`
    /// changes when it carries rows of a copy and more than that, else the
    /// whole batch.
    fn take_part(&mut self, limits: BatchLimits) -> Option<(Batch, Ack)> {
        let first = self.batches.front_mut()?;
        if first.changes.len() > PART_ROWS && copied(first) {
            let before = first.cost(limits);
            let rest = first.changes.split_off(PART_ROWS);
            let changes = std::mem::replace(&mut first.changes, rest);
            let share = first.bytes / (changes.len() + first.changes.len()).max(1);
            let bytes = share.saturating_mul(changes.len()).min(first.bytes);
            first.bytes -= bytes;
            self.cost = self.cost.saturating_sub(before) + first.cost(limits);
            // Parts are numbered like the chunks of a large transaction:
            // each its own chunk number, only the last with `last` and
            // `end_lsn`. Sinks name a message by its transaction, chunk and
            // place (NATS's message id, HTTP's idempotency key), and parts
            // that shared one chunk number were taken for replays of the
            // first and dropped. A copy's rows ride in the batch of the
            // high watermark's own one-change transaction, so no later
            // chunk of it can have these numbers.
            let part = Batch {
                txn: Txn {
                    last: false,
                    end_lsn: 0,
                    ..first.txn
                },
                changes,
                bytes,
            };
            self.parted.get_or_insert(first.txn.chunk);
            first.txn.chunk = first.txn.chunk.saturating_add(1);
            return Some((part, Ack::Later));
        }
        let batch = self.batches.pop_front()?;
        self.cost = self.cost.saturating_sub(batch.cost(limits));
        match tables(&batch) {
            None => self.messages = self.messages.saturating_sub(1),
            Some(oids) => {
                for oid in oids {
                    if let Some(count) = self.tables.get_mut(&oid) {
                        *count = count.saturating_sub(1);
                        if *count == 0 {
                            self.tables.remove(&oid);
                        }
                    }
                }
            }
        }
        let ack = self.parted.take().map_or(Ack::Batch, Ack::LastPart);
        Some((batch, ack))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Column, Relation, ReplicaIdentity};
    use datum_guest::{Txn, Value};

    /// A transform thread that panicked left a swap waiting for it for
    /// ever, holding the chain's turn: every later swap, rollback and
    /// promotion hung too.
    #[test]
    fn a_swap_waiting_for_a_transform_thread_that_panics_is_answered() {
        let engine =
            crate::transform::Engine::new(crate::transform::engine::EngineOptions::default())
                .expect("engine");
        let slot = crate::daemon::hotswap::test_slot(&engine, 1, "(i64.const 0)");
        let active = ActiveChain::new(vec![slot.clone()], Lsn(16));
        let _ = active.attach(Lsn(32));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let (started_tx, started_rx) = std::sync::mpsc::channel::<()>();
        let thread = {
            let active = active.clone();
            std::thread::spawn(move || {
                let _abandon = AbandonOnPanic(active);
                let _ = started_rx.recv();
                panic!("the transform thread fails");
            })
        };
        let answered = runtime.block_on(async {
            let publish = active.publish(crate::daemon::hotswap::Slot { version: 2, ..slot });
            tokio::pin!(publish);
            // Waiting for the thread to adopt it...
            let waiting = tokio::time::timeout(Duration::from_millis(50), &mut publish).await;
            assert!(waiting.is_err(), "the swap waits for the thread");
            // ...which panics.
            let _ = started_tx.send(());
            tokio::time::timeout(Duration::from_secs(5), publish).await
        });
        assert!(thread.join().is_err(), "the thread panicked");
        assert_eq!(answered, Ok(Some(Lsn(32))), "the swap was answered");
    }

    fn table(oid: u32) -> Arc<Relation> {
        Arc::new(Relation {
            oid,
            schema: "public".into(),
            table: format!("t{oid}"),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![Column::new("id", "int4", true)],
        })
    }

    fn batch(xid: u32, commit_lsn: u64, changes: Vec<Change>) -> Batch {
        let bytes = changes.len() * 10;
        Batch {
            txn: Txn::committed(xid, commit_lsn),
            changes,
            bytes,
        }
    }

    fn insert(oid: u32) -> Change {
        Change::Insert {
            relation: table(oid),
            new: vec![Value::Int(1)],
        }
    }

    fn chunk(oid: u32, rows: usize) -> Batch {
        let relation = table(oid);
        let rows = (0..rows)
            .map(|i| Change::Snapshot {
                relation: relation.clone(),
                new: vec![Value::Int(i as i64)],
            })
            .collect();
        batch(7, 100, rows)
    }

    #[test]
    fn live_batches_of_other_tables_pass_a_held_chunk_and_its_own_tables_wait() {
        let limits = BatchLimits::default();
        let mut held = Held::default();
        assert!(!held.holds(&batch(1, 50, vec![insert(1)])), "nothing held");
        let copy = chunk(1, 10);
        assert!(held.holds(&copy), "a copy's rows go in parts");
        held.push(copy, limits);
        assert!(
            !held.holds(&batch(8, 110, vec![insert(2)])),
            "another table passes"
        );
        assert!(
            held.holds(&batch(9, 120, vec![insert(2), insert(1)])),
            "the copied table waits"
        );
        let truncate = Change::Truncate {
            relations: vec![table(3), table(1)],
            cascade: false,
            restart_identity: false,
        };
        assert!(
            held.holds(&batch(10, 130, vec![truncate])),
            "a truncate of it waits"
        );
        let message = Change::Message {
            transactional: true,
            lsn: Lsn(140),
            prefix: "app".into(),
            content: Vec::new(),
        };
        assert!(
            held.holds(&batch(11, 140, vec![insert(2), message])),
            "a message waits"
        );
        assert!(
            !held.holds(&batch(12, 150, Vec::new())),
            "an empty batch passes"
        );

        // A live transaction of table 2 held behind it (its first chunk
        // touched table 1): its later chunks wait too, whatever they touch.
        let mut first = batch(13, 160, vec![insert(1)]);
        first.txn.last = false;
        first.txn.end_lsn = 0;
        held.push(first, limits);
        let mut second = batch(13, 160, vec![insert(2)]);
        second.txn.chunk = 1;
        assert!(held.holds(&second), "a later chunk of a held transaction");
        assert!(!held.holds(&batch(14, 170, vec![insert(2)])));

        // `snapshot.order = "commit"`: nothing passes.
        let mut strict = Held {
            commit_order: true,
            ..Held::default()
        };
        assert!(
            !strict.holds(&batch(1, 50, vec![insert(2)])),
            "nothing held"
        );
        strict.push(chunk(1, 10), limits);
        assert!(strict.holds(&batch(8, 110, vec![insert(2)])));
        assert!(strict.holds(&batch(12, 150, Vec::new())));
    }

    #[test]
    fn a_chunk_goes_in_parts_and_only_its_last_part_acknowledges_it() {
        let limits = BatchLimits::default();
        let mut held = Held::default();
        let rows = PART_ROWS * 2 + PART_ROWS / 2;
        let copy = chunk(1, rows);
        let (bytes, txn) = (copy.bytes, copy.txn);
        held.push(copy, limits);
        held.push(batch(8, 110, vec![insert(1)]), limits);
        let mut parts = Vec::new();
        while let Some(part) = held.take_part(limits) {
            parts.push(part);
        }
        let sizes: Vec<(usize, Ack)> = parts.iter().map(|(b, a)| (b.changes.len(), *a)).collect();
        assert_eq!(
            sizes,
            vec![
                (PART_ROWS, Ack::Later),
                (PART_ROWS, Ack::Later),
                (PART_ROWS / 2, Ack::LastPart(txn.chunk)),
                (1, Ack::Batch),
            ]
        );
        // Parts keep their transaction and are numbered like its chunks:
        // only the last says it is, with the end LSN.
        let txns: Vec<(u32, u64, u32, bool, u64)> = parts[..3]
            .iter()
            .map(|(b, _)| {
                (
                    b.txn.xid,
                    b.txn.commit_lsn,
                    b.txn.chunk,
                    b.txn.last,
                    b.txn.end_lsn,
                )
            })
            .collect();
        assert_eq!(
            txns,
            vec![
                (txn.xid, txn.commit_lsn, 0, false, 0),
                (txn.xid, txn.commit_lsn, 1, false, 0),
                (txn.xid, txn.commit_lsn, 2, true, txn.end_lsn),
            ]
        );
        // The last part acknowledges the batch as the chunk it came as.
        assert_eq!(parts[2].1.acknowledges(&parts[2].0.txn), Some(txn));
        assert_eq!(parts[1].1.acknowledges(&parts[1].0.txn), None);
        assert_eq!(
            parts[..3].iter().map(|(b, _)| b.bytes).sum::<usize>(),
            bytes
        );
        // The rows, in their order.
        let ids: Vec<i64> = parts[..3]
            .iter()
            .flat_map(|(b, _)| &b.changes)
            .filter_map(|c| match c {
                Change::Snapshot { new, .. } => match new.first() {
                    Some(Value::Int(i)) => Some(*i),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        assert_eq!(ids, (0..rows as i64).collect::<Vec<_>>());
        assert!(held.is_empty());
        assert_eq!(held.cost, 0);
        assert!(held.tables.is_empty());
        assert!(
            !held.holds(&batch(9, 120, vec![insert(1)])),
            "nothing held any more"
        );
    }
}
