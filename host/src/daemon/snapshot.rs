//! Snapshots and backfills: each table's existing rows, copied in chunks
//! along its key and placed in the live stream between watermarks
//! (`docs/snapshots.md`).
//!
//! Three parts meet here:
//!
//! * the copy tasks (`run`, one task per table copying, at most
//!   `parallel_tables` at once): write a low watermark, read a chunk
//!   (`crate::source::snapshot`), hand its rows over, write a high
//!   watermark, wait until the chunk is placed, move the cursor;
//! * the transform thread calls [`Snapshots::observe`] on every batch, in
//!   stream order: between a chunk's two watermarks it remembers every key
//!   of that table the stream changes; at the high watermark it appends the
//!   chunk's rows minus those keys to that batch as `Change::Snapshot`, and
//!   notes the table's new progress under the batch's end LSN;
//! * the commit loop takes the progress notes at or below the checkpoint it
//!   commits and writes them in the same state-file commit
//!   ([`Snapshots::progress_upto`]), so a table's progress never runs ahead
//!   of, or behind, the stream position it is consistent with.
//!
//! Nothing here holds the stream back: batches flow through `observe`
//! whether or not a copy is running, and a table that is done is simply no
//! longer watched.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datum_guest::Value;
use serde_json::{Value as Json, json};
use tokio::sync::{mpsc, oneshot};

use crate::checkpoint::{ALL_TABLES, SnapshotProgress, Store, TableState, now_micros};
use crate::config::{SnapshotMode, SnapshotOrder};
use crate::daemon::pace::Pace;
use crate::daemon::visibility::Delivered;
use crate::event::{Batch, Change, Lsn, Relation};
use crate::retry::Backoff;
use crate::source::snapshot::{self as reader, SnapshotTable, WATERMARK_PREFIX};
use crate::source::{SourceConfig, SourceError};

/// How a pipeline copies existing rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// Whether a pipeline whose slot Datum creates starts with its tables'
    /// existing rows.
    pub mode: SnapshotMode,
    /// Rows per chunk.
    pub chunk_rows: usize,
    /// Tables copied at once.
    pub parallel_tables: usize,
    /// Rows all copies read per second at most, on average; `None` for no
    /// limit.
    pub max_rows_per_second: Option<u64>,
    /// Whether live changes of other tables pass a copy's rows.
    pub order: SnapshotOrder,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy {
            mode: SnapshotMode::Initial,
            chunk_rows: crate::config::DEFAULT_CHUNK_ROWS,
            parallel_tables: crate::config::DEFAULT_PARALLEL_TABLES,
            max_rows_per_second: None,
            order: SnapshotOrder::Table,
        }
    }
}

/// What the copy tasks, the transform thread, the commit loop and the admin
/// API share about one run of a pipeline.
#[derive(Debug)]
pub struct Snapshots {
    pipeline: String,
    /// Tells this run's watermarks from those of an earlier run still in
    /// the WAL.
    nonce: u64,
    next_id: AtomicU64,
    inner: Mutex<Inner>,
    requests: mpsc::Sender<Backfill>,
    /// Taken by `run`.
    requests_rx: Mutex<Option<mpsc::Receiver<Backfill>>>,
    /// The latest checkpoint made durable: a copy reads ahead only so far
    /// past it (`CHUNKS_IN_FLIGHT`).
    durable: tokio::sync::watch::Sender<Lsn>,
}

/// A backfill asked for on a running pipeline (the admin API).
#[derive(Debug)]
struct Backfill {
    tables: Vec<String>,
    from: Option<Vec<String>>,
    reply: oneshot::Sender<Result<Vec<String>, BackfillError>>,
}

/// Why a backfill was not started.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BackfillError {
    /// The request names something that cannot be copied.
    #[error("{0}")]
    Invalid(String),
    /// The table is being copied already, or cannot be published.
    #[error("{0}")]
    Conflict(String),
    /// The pipeline is not streaming, or the source cannot be reached.
    #[error("{0}")]
    Unavailable(String),
}

#[derive(Debug, Default)]
struct Inner {
    /// Chunks between their low watermark's writing and their placing.
    chunks: HashMap<u64, Chunk>,
    /// Progress to commit with the checkpoint, by the end LSN of the batch
    /// that carried the chunk.
    ledger: BTreeMap<Lsn, Vec<SnapshotProgress>>,
    /// Each table's copy as this run sees it.
    live: BTreeMap<String, Live>,
    /// Tables whose copy failed in this run: a chunk of theirs placed
    /// after the failure must not record progress over it.
    failed: HashSet<String>,
    /// The transactions the stream delivered, for the chunks read too
    /// early to see them.
    delivered: Delivered,
}

impl Inner {
    /// Forgets the delivered transactions no pending chunk can miss.
    fn forget_seen(&mut self) {
        self.delivered.forget_seen(self.chunks.keys().copied());
    }
}

#[derive(Debug)]
struct Chunk {
    oid: u32,
    key_names: Vec<String>,
    /// The low watermark was seen: keys are being collected.
    open: bool,
    /// The number the stream's transactions had reached at the low
    /// watermark ([`Delivered::now`]).
    low: u64,
    /// The table was truncated between the watermarks.
    truncated: bool,
    touched: HashSet<Vec<u8>>,
    /// Positions of the key in the stream's relation (by the relation's
    /// address, which changes when the stream describes it again).
    positions: Option<(usize, Vec<Option<usize>>)>,
    /// The stream's latest description of the table between the
    /// watermarks: a chunk read with other columns is read again.
    live: Option<Arc<Relation>>,
    ready: Option<Ready>,
    answer: Option<oneshot::Sender<Placed>>,
}

/// A chunk's rows, handed over before its high watermark is written.
#[derive(Debug)]
struct Ready {
    relation: Arc<Relation>,
    key: Vec<usize>,
    rows: Vec<Vec<Value>>,
    bytes: usize,
    progress: SnapshotProgress,
    /// The snapshot the rows were read under.
    snapshot: reader::ReadSnapshot,
}

/// What became of a chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Placed {
    /// Its rows went into the stream; `dropped` of them were left out
    /// because the stream changed their keys between the watermarks.
    Emitted {
        emitted: u64,
        dropped: u64,
        /// The end of the batch that carries them.
        at: Lsn,
    },
    /// Its low watermark was not seen in this run: read it again.
    Lost,
    /// It was read under a snapshot that did not see these transactions,
    /// which the stream delivered before its low watermark: read it again
    /// once the server sees them.
    TooEarly(Vec<u64>),
}

/// A table's copy as this run sees it.
#[derive(Debug, Clone)]
pub(crate) struct Live {
    pub state: TableState,
    /// The progress of the last chunk placed (durable once the checkpoint
    /// passes it).
    pub placed: Option<SnapshotProgress>,
    /// Rows copied by this run.
    pub rows_this_run: u64,
    /// `pg_class.reltuples` when the copy last looked.
    pub estimate: u64,
    /// When this run started copying it.
    pub started: Instant,
    pub error: Option<String>,
}

/// A watermark's content.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Mark {
    pipeline: String,
    run: String,
    chunk: u64,
    mark: String,
    table: String,
}

impl Snapshots {
    pub(crate) fn new(pipeline: &str) -> Arc<Snapshots> {
        let nonce = (now_micros() as u64) ^ (u64::from(std::process::id()) << 40);
        let (requests, requests_rx) = mpsc::channel(16);
        Arc::new(Snapshots {
            pipeline: pipeline.to_owned(),
            nonce,
            next_id: AtomicU64::new(1),
            inner: Mutex::new(Inner::default()),
            requests,
            requests_rx: Mutex::new(Some(requests_rx)),
            durable: tokio::sync::watch::Sender::new(Lsn::ZERO),
        })
    }

    /// Copies `tables` (again), from the first row or from after the key
    /// `from` (one table only), on the running pipeline. Returns the tables
    /// as `schema.table` once each is recorded as pending.
    pub(crate) async fn backfill(
        &self,
        tables: Vec<String>,
        from: Option<Vec<String>>,
    ) -> Result<Vec<String>, BackfillError> {
        let (reply, answer) = oneshot::channel();
        let gone = || BackfillError::Unavailable("the pipeline is not streaming".into());
        self.requests
            .send(Backfill {
                tables,
                from,
                reply,
            })
            .await
            .map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every table this run copies or copied, as it sees it.
    pub(crate) fn live_all(&self) -> Vec<(String, Live)> {
        self.lock()
            .live
            .iter()
            .map(|(t, l)| (t.clone(), l.clone()))
            .collect()
    }

    /// The copy of `table` as this run sees it, if it copies it.
    pub(crate) fn live(&self, table: &str) -> Option<Live> {
        self.lock().live.get(table).cloned()
    }

    /// Watches the stream for `table`'s next chunk; the content of its
    /// low and high watermarks, and where to learn what became of it.
    fn begin_chunk(
        &self,
        table: &SnapshotTable,
    ) -> (u64, String, String, oneshot::Receiver<Placed>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let key_names = table
            .key
            .iter()
            .map(|i| table.relation.columns[*i].name.clone())
            .collect();
        self.lock().chunks.insert(
            id,
            Chunk {
                oid: table.oid,
                key_names,
                open: false,
                low: 0,
                truncated: false,
                touched: HashSet::new(),
                positions: None,
                live: None,
                ready: None,
                answer: Some(tx),
            },
        );
        let mark = |kind: &str| {
            serde_json::to_string(&Mark {
                pipeline: self.pipeline.clone(),
                run: format!("{:016x}", self.nonce),
                chunk: id,
                mark: kind.to_owned(),
                table: table.name.clone(),
            })
            .unwrap_or_default()
        };
        (id, mark("low"), mark("high"), rx)
    }

    fn chunk_read(&self, id: u64, ready: Ready) {
        let mut inner = self.lock();
        // Chunks registered from here on read after this read ended.
        let registered_from = self.next_id.load(Ordering::Relaxed);
        let snapshot = ready.snapshot.clone();
        if let Some(chunk) = inner.chunks.get_mut(&id) {
            chunk.ready = Some(ready);
            inner.delivered.read(id, registered_from, snapshot);
        }
        inner.forget_seen();
    }

    fn abandon(&self, id: u64) {
        let mut inner = self.lock();
        inner.chunks.remove(&id);
        inner.forget_seen();
    }

    /// Starts showing `progress`'s table as this run copies it. The
    /// progress of an earlier copy of the table that is not committed yet
    /// (its last chunk placed, the status saying done) is dropped: committed
    /// with a later checkpoint, it would land over this copy's start, and
    /// after a crash the table would not be copied again.
    fn watch(&self, progress: &SnapshotProgress) {
        let mut inner = self.lock();
        inner.failed.remove(&progress.table);
        for notes in inner.ledger.values_mut() {
            notes.retain(|note| note.table != progress.table);
        }
        inner.live.insert(
            progress.table.clone(),
            Live {
                state: progress.state,
                placed: None,
                rows_this_run: 0,
                estimate: 0,
                started: Instant::now(),
                error: None,
            },
        );
    }

    fn set_live(&self, table: &str, update: impl FnOnce(&mut Live)) {
        let mut inner = self.lock();
        if let Some(live) = inner.live.get_mut(table) {
            update(live);
        }
    }

    /// Called by the transform thread on every batch, in stream order,
    /// before the modules: takes watermarks out, collects the keys the
    /// stream changes while a chunk of their table is between watermarks,
    /// and places each chunk at its high watermark.
    pub(crate) fn observe(&self, batch: &mut Batch) {
        let marked = batch
            .changes
            .iter()
            .any(|c| matches!(c, Change::Message { prefix, .. } if prefix == WATERMARK_PREFIX));
        let mut inner = self.lock();
        inner.delivered.note(batch.txn.xid);
        if !marked && !inner.chunks.values().any(|c| c.open) {
            return;
        }
        let end_lsn = Lsn(batch.txn.end_lsn);
        let changes = std::mem::take(&mut batch.changes);
        let mut out = Vec::with_capacity(changes.len());
        for change in changes {
            match &change {
                Change::Message {
                    prefix, content, ..
                } if prefix == WATERMARK_PREFIX => {
                    // Watermarks never reach modules or sinks, whichever
                    // run or pipeline wrote them.
                    if let Some(mark) = self.ours(content) {
                        match mark.mark.as_str() {
                            "low" => {
                                let now = inner.delivered.now();
                                if let Some(chunk) = inner.chunks.get_mut(&mark.chunk) {
                                    chunk.open = true;
                                    chunk.low = now;
                                }
                            }
                            _ => {
                                if let Some(chunk) = inner.chunks.remove(&mark.chunk) {
                                    let oid = chunk.oid;
                                    match place(&mut inner, chunk, end_lsn, &mut out) {
                                        Some(bytes) => batch.bytes += bytes,
                                        // The table's later chunks were read
                                        // after this one: none may be placed
                                        // before it is read again.
                                        None => lose_table(&mut inner, oid),
                                    }
                                    inner.forget_seen();
                                }
                            }
                        }
                    }
                    continue;
                }
                Change::Insert { relation, new } => touch(&mut inner, relation, new),
                Change::Update { relation, old, new } => {
                    touch(&mut inner, relation, new);
                    if let Some(old) = old {
                        touch(&mut inner, relation, &old.values);
                    }
                }
                Change::Delete { relation, old } => touch(&mut inner, relation, &old.values),
                Change::Truncate { relations, .. } => {
                    for chunk in inner.chunks.values_mut().filter(|c| c.open) {
                        if relations.iter().any(|r| r.oid == chunk.oid) {
                            chunk.truncated = true;
                        }
                    }
                }
                Change::Snapshot { .. } | Change::Message { .. } | Change::Schema { .. } => {}
            }
            out.push(change);
        }
        batch.changes = out;
    }

    fn ours(&self, content: &[u8]) -> Option<Mark> {
        let mark: Mark = serde_json::from_slice(content).ok()?;
        (mark.pipeline == self.pipeline && mark.run == format!("{:016x}", self.nonce))
            .then_some(mark)
    }

    /// The progress to commit with a checkpoint at `lsn`: the latest note
    /// of each table at or below it.
    pub(crate) fn progress_upto(&self, lsn: Lsn) -> Vec<SnapshotProgress> {
        let inner = self.lock();
        let mut latest: BTreeMap<&str, &SnapshotProgress> = BTreeMap::new();
        for notes in inner.ledger.range(..=lsn).map(|(_, n)| n) {
            for note in notes.iter().filter(|n| !inner.failed.contains(&n.table)) {
                latest.insert(&note.table, note);
            }
        }
        latest.into_values().cloned().collect()
    }

    /// A checkpoint at `lsn` is durable, with its progress.
    pub(crate) fn committed(&self, lsn: Lsn) {
        let mut inner = self.lock();
        let later = inner.ledger.split_off(&Lsn(lsn.0.saturating_add(1)));
        inner.ledger = later;
        drop(inner);
        self.durable.send_if_modified(|durable| {
            let moved = lsn > *durable;
            *durable = (*durable).max(lsn);
            moved
        });
    }
}

/// The stream changed a row of `relation`: its key counts as touched for
/// every chunk of that table between its watermarks.
fn touch(inner: &mut Inner, relation: &Arc<Relation>, values: &[Value]) {
    let address = Arc::as_ptr(relation) as usize;
    for chunk in inner.chunks.values_mut() {
        if !chunk.open || chunk.oid != relation.oid {
            continue;
        }
        if chunk.positions.as_ref().map(|(a, _)| *a) != Some(address) {
            chunk.live = Some(relation.clone());
            let positions = chunk
                .key_names
                .iter()
                .map(|name| relation.columns.iter().position(|c| &c.name == name))
                .collect();
            chunk.positions = Some((address, positions));
        }
        let Some((_, positions)) = &chunk.positions else {
            continue;
        };
        let key: Option<Vec<&Value>> = positions
            .iter()
            .map(|p| p.and_then(|p| values.get(p)))
            .collect();
        if let Some(key) = key {
            chunk.touched.insert(key_bytes(key));
        }
    }
}

/// A key as bytes, for equality only (never for order: PostgreSQL orders).
fn key_bytes<'a>(key: impl IntoIterator<Item = &'a Value>) -> Vec<u8> {
    let mut bytes = Vec::new();
    for value in key {
        // Serialising a value into memory does not fail.
        let _ = rmp_serde::encode::write(&mut bytes, value);
    }
    bytes
}

/// Answers every chunk of table `oid` still waiting as lost.
fn lose_table(inner: &mut Inner, oid: u32) {
    let lost: Vec<u64> = inner
        .chunks
        .iter()
        .filter(|(_, c)| c.oid == oid)
        .map(|(id, _)| *id)
        .collect();
    for id in lost {
        if let Some(answer) = inner.chunks.remove(&id).and_then(|c| c.answer) {
            let _ = answer.send(Placed::Lost);
        }
    }
}

/// The chunk's high watermark: its rows minus the touched keys go out,
/// and its progress is noted under `lsn`. Returns the bytes added; `None`
/// when the chunk cannot be placed (its low watermark was not seen).
fn place(inner: &mut Inner, chunk: Chunk, lsn: Lsn, out: &mut Vec<Change>) -> Option<usize> {
    let Chunk {
        open,
        low,
        truncated,
        touched,
        ready,
        answer,
        live,
        ..
    } = chunk;
    // A table whose columns changed between the watermarks may have been
    // read with the old ones: its rows would follow rows of the new shape
    // (and its schema change) in the stream. Read it again.
    let stale = |ready: &Ready| {
        live.as_ref()
            .is_some_and(|l| !l.same_columns(&ready.relation))
    };
    let (Some(ready), true) = (ready.filter(|r| !stale(r)), open) else {
        if let Some(answer) = answer {
            let _ = answer.send(Placed::Lost);
        }
        return None;
    };
    let unseen = inner.delivered.unseen_before(&ready.snapshot, low);
    if !unseen.is_empty() {
        if let Some(answer) = answer {
            let _ = answer.send(Placed::TooEarly(unseen));
        }
        return None;
    }
    let total = ready.rows.len() as u64;
    let mut emitted = 0u64;
    if !truncated {
        for row in ready.rows {
            if !touched.is_empty()
                && touched.contains(&key_bytes(ready.key.iter().filter_map(|i| row.get(*i))))
            {
                continue;
            }
            out.push(Change::Snapshot {
                relation: ready.relation.clone(),
                new: row,
            });
            emitted += 1;
        }
    }
    let progress = ready.progress;
    if inner.failed.contains(&progress.table) {
        // Read before its table's copy failed: the rows are true, the
        // progress is not to be recorded over the failure.
        if let Some(answer) = answer {
            let _ = answer.send(Placed::Emitted {
                emitted,
                dropped: total - emitted,
                at: lsn,
            });
        }
        return Some(ready.bytes);
    }
    if let Some(live) = inner.live.get_mut(&progress.table) {
        live.rows_this_run += total;
        live.state = progress.state;
        live.placed = Some(progress.clone());
    }
    inner.ledger.entry(lsn).or_default().push(progress);
    if let Some(answer) = answer {
        let _ = answer.send(Placed::Emitted {
            emitted,
            dropped: total - emitted,
            at: lsn,
        });
    }
    Some(ready.bytes)
}

/// Runs the pipeline's copies: turns the request for every table into one
/// per table, then copies the tables still pending or copying, at most
/// `parallel_tables` at once, and takes backfills asked for meanwhile. A
/// table that fails is stored as failed, with the error; the others go on.
pub(crate) async fn run(
    snapshots: Arc<Snapshots>,
    source: SourceConfig,
    store: Arc<Store>,
    policy: SnapshotPolicy,
) {
    let Some(mut requests) = snapshots
        .requests_rx
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    else {
        return;
    };
    let name = snapshots.pipeline.clone();
    let mut backoff = Backoff::new(source.reconnect_initial, source.reconnect_max);
    let todo = loop {
        match plan(&snapshots, &source, &store).await {
            Ok(todo) => break todo,
            Err(err) => {
                let wait = backoff.next_wait();
                tracing::warn!(pipeline = %name, error = %err, retry_in = ?wait, "cannot plan the snapshot yet; retrying");
                tokio::time::sleep(wait).await;
            }
        }
    };
    if !todo.is_empty() {
        tracing::info!(pipeline = %name, tables = todo.len(), parallel = policy.parallel_tables, max_rows_per_second = ?policy.max_rows_per_second, "snapshot: copying tables");
    }
    let pace = Arc::new(Pace::new(policy.max_rows_per_second));
    let mut queue: VecDeque<SnapshotProgress> = VecDeque::new();
    for progress in todo {
        snapshots.watch(&progress);
        queue.push_back(progress);
    }
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < policy.parallel_tables.max(1) {
            let Some(progress) = queue.pop_front() else {
                break;
            };
            running.spawn(copy_table(
                snapshots.clone(),
                source.clone(),
                policy,
                pace.clone(),
                progress,
            ));
        }
        tokio::select! {
            Some(done) = running.join_next(), if !running.is_empty() => {
                if let Ok((progress, Err(err))) = done {
                    fail(&snapshots, &store, progress, &err);
                }
            }
            request = requests.recv() => {
                let Some(request) = request else { return };
                let answer = accept(&snapshots, &source, &store, &request).await;
                if let Ok(accepted) = &answer {
                    for progress in accepted {
                        snapshots.watch(progress);
                        queue.push_back(progress.clone());
                    }
                }
                let _ = request
                    .reply
                    .send(answer.map(|a| a.into_iter().map(|p| p.table).collect()));
            }
        }
    }
}

/// A table's copy stopped for good: stored as failed, with the error.
fn fail(snapshots: &Snapshots, store: &Store, mut progress: SnapshotProgress, err: &SourceError) {
    let name = &snapshots.pipeline;
    tracing::error!(pipeline = %name, table = %progress.table, error = %err, "snapshot of the table failed; the others go on");
    progress.state = TableState::Failed;
    progress.error = Some(err.to_string());
    progress.updated_at = now_micros();
    {
        let mut inner = snapshots.lock();
        inner.failed.insert(progress.table.clone());
        if let Some(live) = inner.live.get_mut(&progress.table) {
            live.state = TableState::Failed;
            live.error = Some(err.to_string());
        }
    }
    if let Err(err) = store.put_snapshot_progress(name, &[progress]) {
        tracing::error!(pipeline = %name, error = %err, "cannot record the failed snapshot");
    }
}

/// Checks a backfill and records its tables as pending: each must exist,
/// have a key to walk along, not be copying already, and be published
/// (Datum adds it to the publication when the configuration lists the
/// tables, that is when Datum manages the publication).
async fn accept(
    snapshots: &Snapshots,
    source: &SourceConfig,
    store: &Store,
    request: &Backfill,
) -> Result<Vec<SnapshotProgress>, BackfillError> {
    if request.tables.is_empty() {
        return Err(BackfillError::Invalid("name at least one table".into()));
    }
    if request.from.is_some() && request.tables.len() != 1 {
        return Err(BackfillError::Invalid(
            "`from` is a key of one table: name exactly one table with it".into(),
        ));
    }
    let unavailable = |e: SourceError| BackfillError::Unavailable(format!("the source: {e}"));
    let client = reader::connect(&source.conninfo)
        .await
        .map_err(unavailable)?;
    let published = reader::publication_tables(&client, &source.publication)
        .await
        .map_err(unavailable)?;
    let mut accepted = Vec::new();
    for name in &request.tables {
        let table = reader::resolve_table(&client, name)
            .await
            .map_err(|e| BackfillError::Invalid(e.to_string()))?;
        if let Some(live) = snapshots.live(&table)
            && matches!(live.state, TableState::Pending | TableState::Copying)
        {
            return Err(BackfillError::Conflict(format!(
                "{table} is being copied already ({} rows so far); backfill it again once it is done",
                live.placed.map_or(0, |p| p.rows)
            )));
        }
        let described = reader::describe(&client, &table, Some(&source.publication))
            .await
            .map_err(|e| BackfillError::Invalid(e.to_string()))?;
        if let Some(from) = &request.from
            && from.len() != described.key.len()
        {
            return Err(BackfillError::Invalid(format!(
                "`from` has {} values, but the key of {table} has {} columns ({})",
                from.len(),
                described.key.len(),
                described
                    .key
                    .iter()
                    .map(|i| described.relation.columns[*i].name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        if !published.contains(&table) {
            if source.tables.is_empty() {
                return Err(BackfillError::Conflict(format!(
                    "{table} is not in publication {}, which Datum did not create: add it \
                     (ALTER PUBLICATION ... ADD TABLE {table}), then backfill again",
                    source.publication
                )));
            }
            reader::publish(&client, &source.publication, &table)
                .await
                .map_err(|e| BackfillError::Conflict(e.to_string()))?;
            tracing::info!(pipeline = %snapshots.pipeline, table = %table, publication = %source.publication, "backfill: added the table to the publication");
        }
        accepted.push(SnapshotProgress::pending(&table, request.from.clone()));
    }
    store
        .put_snapshot_progress(&snapshots.pipeline, &accepted)
        .map_err(|e| BackfillError::Unavailable(format!("the state file: {e}")))?;
    tracing::info!(pipeline = %snapshots.pipeline, tables = ?accepted.iter().map(|p| &p.table).collect::<Vec<_>>(), from = ?request.from, "backfill requested");
    Ok(accepted)
}

/// The tables to copy: the request for every table becomes one pending
/// row per table of the publication (in one commit), then every table
/// pending or copying.
async fn plan(
    snapshots: &Snapshots,
    source: &SourceConfig,
    store: &Store,
) -> Result<Vec<SnapshotProgress>, SourceError> {
    let name = &snapshots.pipeline;
    let stored = store
        .snapshot_progress(name)
        .map_err(|e| SourceError::Protocol(format!("state file: {e}")))?;
    let stored = if stored.iter().any(|p| p.table == ALL_TABLES) {
        let client = reader::connect(&source.conninfo).await?;
        let tables = reader::publication_tables(&client, &source.publication).await?;
        let pending: Vec<SnapshotProgress> = tables
            .iter()
            .map(|t| SnapshotProgress::pending(t, None))
            .collect();
        store
            .replace_snapshot_progress(name, &[ALL_TABLES], &pending)
            .map_err(|e| SourceError::Protocol(format!("state file: {e}")))?;
        tracing::info!(pipeline = %name, tables = pending.len(), "snapshot: every table of the publication is pending");
        store
            .snapshot_progress(name)
            .map_err(|e| SourceError::Protocol(format!("state file: {e}")))?
    } else {
        stored
    };
    Ok(stored
        .into_iter()
        .filter(|p| matches!(p.state, TableState::Pending | TableState::Copying))
        .collect())
}

/// Copies one table from its cursor to its end, reconnecting with back-off
/// while the failure is passing. Returns its last progress and how it
/// ended.
async fn copy_table(
    snapshots: Arc<Snapshots>,
    source: SourceConfig,
    policy: SnapshotPolicy,
    pace: Arc<Pace>,
    mut progress: SnapshotProgress,
) -> (SnapshotProgress, Result<(), SourceError>) {
    let mut backoff = Backoff::new(source.reconnect_initial, source.reconnect_max);
    snapshots.set_live(&progress.table, |live| live.state = TableState::Copying);
    loop {
        match copy_chunks(&snapshots, &source, policy, &pace, &mut progress).await {
            Ok(()) => return (progress, Ok(())),
            Err(err) if err.is_transient() => {
                let wait = backoff.next_wait();
                tracing::warn!(pipeline = %snapshots.pipeline, table = %progress.table, error = %err, retry_in = ?wait, "snapshot chunk failed; retrying");
                tokio::time::sleep(wait).await;
            }
            Err(err) => return (progress, Err(err)),
        }
    }
}

/// Chunks of one table between the start of their reading and the
/// checkpoint that carries them: the next chunk is read while the previous
/// one travels the stream, the modules and the sink, but no further ahead,
/// so live changes queue behind at most this many chunks. Three copied
/// about an eighth faster here, but live changes of other tables during the
/// copy looked slower in the same hour (docs/benchmarks.md).
const CHUNKS_IN_FLIGHT: usize = 2;

/// How long a table's description serves a copy before it is read again.
const DESCRIBE_EVERY: Duration = Duration::from_secs(1);

/// Chunk after chunk until a short one: low watermark, read, high
/// watermark; up to `CHUNKS_IN_FLIGHT` chunks are read and not yet
/// checkpointed at once.
/// `progress` moves only once a chunk is placed, in order, so a retry reads
/// again from the last chunk placed (a chunk placed twice is harmless: its
/// rows are the same or newer).
async fn copy_chunks(
    snapshots: &Snapshots,
    source: &SourceConfig,
    policy: SnapshotPolicy,
    pace: &Pace,
    progress: &mut SnapshotProgress,
) -> Result<(), SourceError> {
    let connection = reader::CopyConnection::open(&source.conninfo).await?;
    let limit = policy.chunk_rows.max(1);
    // The table as last described, and when: each chunk's read checks that
    // its columns are unchanged, so it is described again only after a
    // read found them changed, or now and then for its estimate (and a
    // key that changed without its columns).
    let mut described: Option<(reader::SnapshotTable, Instant)> = None;
    let mut last_log = Instant::now();
    // Where reading has got to (ahead of `progress` by the chunks in flight).
    let mut read = progress.clone();
    let mut in_flight: VecDeque<(u64, oneshot::Receiver<Placed>, SnapshotProgress)> =
        VecDeque::new();
    let mut estimate = 0;
    // Chunks placed, by the end of the batch that carries them, until the
    // checkpoint passes it.
    let mut placed_at: VecDeque<Lsn> = VecDeque::new();
    let mut durable = snapshots.durable.subscribe();
    loop {
        let checkpointed = *durable.borrow_and_update();
        placed_at.retain(|at| *at > checkpointed);
        if read.state != TableState::Done
            && in_flight.is_empty()
            && placed_at.len() >= CHUNKS_IN_FLIGHT
        {
            if durable.changed().await.is_err() {
                // The pipeline is stopping.
                return Ok(());
            }
            continue;
        }
        if read.state != TableState::Done && in_flight.len() + placed_at.len() < CHUNKS_IN_FLIGHT {
            pace.wait(limit).await;
            let (table, at) = match described.take() {
                Some((table, at)) if at.elapsed() < DESCRIBE_EVERY => (table, at),
                _ => {
                    let table = reader::describe(
                        connection.client(),
                        &read.table,
                        Some(&source.publication),
                    )
                    .await?;
                    estimate = table.estimate;
                    snapshots.set_live(&read.table, |live| live.estimate = table.estimate);
                    (table, Instant::now())
                }
            };
            let (id, low, high, placed) = snapshots.begin_chunk(&table);
            match read_one(
                snapshots,
                &connection,
                &table,
                id,
                (&low, &high),
                &read,
                limit,
            )
            .await
            {
                Ok(Some(next)) => {
                    read = next.clone();
                    in_flight.push_back((id, placed, next));
                    described = Some((table, at));
                }
                // The table changed while the chunk was read: its low
                // watermark is left without a chunk, and the next round
                // describes the table again.
                Ok(None) => snapshots.abandon(id),
                Err(err) => {
                    snapshots.abandon(id);
                    return Err(err);
                }
            }
            continue;
        }
        let Some((_, placed, next)) = in_flight.pop_front() else {
            return Ok(());
        };
        match placed.await {
            Ok(Placed::Emitted {
                emitted,
                dropped,
                at,
            }) => {
                tracing::debug!(pipeline = %snapshots.pipeline, table = %progress.table, emitted, dropped, "snapshot chunk placed");
                *progress = next;
                placed_at.push_back(at);
            }
            // Its low watermark was not seen: read again from the last
            // chunk placed (the chunks after it were dropped with it).
            Ok(Placed::Lost) => {
                for (id, _, _) in in_flight.drain(..) {
                    snapshots.abandon(id);
                }
                read = progress.clone();
                continue;
            }
            // Read before transactions the stream delivered ahead of it
            // were visible: the same, once they are.
            Ok(Placed::TooEarly(unseen)) => {
                for (id, _, _) in in_flight.drain(..) {
                    snapshots.abandon(id);
                }
                read = progress.clone();
                tracing::debug!(pipeline = %snapshots.pipeline, table = %progress.table, transactions = ?unseen, "a chunk was read before transactions committed ahead of it were visible; reading it again once they are");
                reader::wait_seen(connection.client(), &unseen, &progress.table).await?;
                continue;
            }
            // The pipeline is stopping.
            Err(_) => return Ok(()),
        }
        if last_log.elapsed() >= Duration::from_secs(10) || progress.state == TableState::Done {
            last_log = Instant::now();
            tracing::info!(pipeline = %snapshots.pipeline, table = %progress.table, rows = progress.rows, estimate, state = progress.state.name(), "snapshot progress");
        }
        if progress.state == TableState::Done {
            return Ok(());
        }
    }
}

/// One chunk after `after`: low watermark, the rows handed over, high
/// watermark. Returns the table's progress once the chunk is placed, or
/// `None` when DDL changed the table's columns since it was described (no
/// high watermark is written: the chunk is read again).
async fn read_one(
    snapshots: &Snapshots,
    connection: &reader::CopyConnection,
    table: &SnapshotTable,
    id: u64,
    (low, high): (&str, &str),
    after: &SnapshotProgress,
    limit: usize,
) -> Result<Option<SnapshotProgress>, SourceError> {
    let key: Vec<String> = table
        .key
        .iter()
        .filter_map(|i| table.relation.columns.get(*i))
        .map(|c| c.name.clone())
        .collect();
    if let (Some(_), Some(was)) = (&after.cursor, &after.key)
        && *was != key
    {
        // The cursor holds values of other columns: read as values of the
        // new key, it would skip rows (or copy some again) without a word.
        return Err(SourceError::Requirement {
            problem: format!(
                "the key of {} changed during its copy, from ({}) to ({}): the copy cannot \
                 go on from its stored position",
                table.name,
                was.join(", "),
                key.join(", ")
            ),
            fix: format!("backfill {} again from the start", table.name),
        });
    }
    connection.emit_watermark(low).await?;
    let rows = match reader::read_chunk(connection.client(), table, after.cursor.as_deref(), limit)
        .await
    {
        Ok(rows) => rows,
        // A column the copy described is gone (dropped or renamed since
        // it was described): described anew, the chunk is read again.
        Err(SourceError::Sql(err))
            if err.as_db_error().map(|d| d.code().code()) == Some("42703") =>
        {
            return Ok(None);
        }
        Err(err) => return Err(err),
    };
    if !connection.unchanged(table).await? {
        // DDL since the table was described: read again, described anew.
        return Ok(None);
    }
    let read = rows.rows.len() as u64;
    let mut next = after.clone();
    next.rows += read;
    next.chunks += 1;
    next.updated_at = now_micros();
    next.error = None;
    if rows.last_key.is_some() {
        next.cursor = rows.last_key;
        next.key = Some(key);
    }
    next.state = if read < limit as u64 {
        TableState::Done
    } else {
        TableState::Copying
    };
    snapshots.chunk_read(
        id,
        Ready {
            relation: table.relation.clone(),
            key: table.key.clone(),
            rows: rows.rows,
            bytes: rows.bytes,
            progress: next.clone(),
            snapshot: rows.snapshot,
        },
    );
    connection.emit_watermark(high).await?;
    Ok(Some(next))
}

/// Each table's snapshot state and rows copied, for the metrics: durable
/// progress, or this run's when it has placed a chunk since.
pub(crate) fn tables(pipeline: &str, live: Option<&Snapshots>, store: &Store) -> Vec<TableRows> {
    store
        .snapshot_progress(pipeline)
        .unwrap_or_default()
        .into_iter()
        .map(|stored| {
            let live = live.and_then(|s| s.live(&stored.table));
            let (progress, state) = current(&stored, live.as_ref());
            TableRows {
                table: progress.table.clone(),
                state,
                rows: progress.rows,
            }
        })
        .collect()
}

/// A table's progress as it stands: the last chunk this run placed (not
/// yet durable, perhaps) over what the state file holds, and this run's
/// state over the stored one.
fn current<'a>(
    stored: &'a SnapshotProgress,
    live: Option<&'a Live>,
) -> (&'a SnapshotProgress, TableState) {
    let progress = live.and_then(|l| l.placed.as_ref()).unwrap_or(stored);
    (progress, live.map_or(stored.state, |l| l.state))
}

/// A table's snapshot state and rows copied.
#[derive(Debug, Clone)]
pub(crate) struct TableRows {
    pub table: String,
    pub state: TableState,
    pub rows: u64,
}

/// A table's snapshot in the status endpoint: its durable progress, with
/// this run's rate and an estimate of what is left when it is copying.
pub(crate) fn status(stored: &SnapshotProgress, live: Option<Live>) -> Json {
    let (progress, state) = current(stored, live.as_ref());
    let rows = progress.rows;
    let mut error = progress.error.clone();
    let (mut estimate, mut rate, mut eta) = (Json::Null, Json::Null, Json::Null);
    if let Some(live) = live.as_ref() {
        if live.error.is_some() {
            error = live.error.clone();
        }
        estimate = json!(live.estimate.max(rows));
        let elapsed = live.started.elapsed().as_secs_f64();
        if elapsed > 0.0 && live.rows_this_run > 0 {
            let per_second = live.rows_this_run as f64 / elapsed;
            rate = json!((per_second * 10.0).round() / 10.0);
            if state == TableState::Copying && per_second > 0.0 {
                let left = live.estimate.saturating_sub(rows) as f64;
                eta = json!((left / per_second).ceil());
            }
        }
    }
    json!({
        "table": progress.table,
        "state": state.name(),
        "rows": rows,
        "estimated_rows": estimate,
        "rows_per_second": rate,
        "eta_seconds": eta,
        "chunks": progress.chunks,
        "cursor": progress.cursor,
        "error": error,
        "started_at": progress.started_at,
        "updated_at": progress.updated_at,
        "checkpointed": {"state": stored.state.name(), "rows": stored.rows, "chunks": stored.chunks},
    })
}

/// Draws a progress bar per table copying, on standard error, until the
/// task is aborted: `datum run` at a terminal.
pub(crate) async fn draw_progress(pipelines: Vec<Arc<crate::daemon::PipelineControl>>) {
    use indicatif::{ProgressBar, ProgressStyle};
    let style = ProgressStyle::with_template(
        "{prefix} [{bar:30}] {human_pos}/{human_len} rows, ETA {eta} {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    let mut bars: HashMap<(String, String), ProgressBar> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        for control in &pipelines {
            let Some(handles) = control.handles() else {
                continue;
            };
            for (table, live) in handles.snapshots.live_all() {
                let key = (control.name.clone(), table.clone());
                let rows = live.placed.as_ref().map_or(0, |p| p.rows);
                let bar = bars.entry(key).or_insert_with(|| {
                    let bar = crate::console::bars().add(ProgressBar::new(live.estimate.max(1)));
                    bar.set_style(style.clone());
                    bar.set_prefix(format!("{} {table}", control.name));
                    bar
                });
                if bar.is_finished() {
                    continue;
                }
                bar.set_length(live.estimate.max(rows).max(1));
                bar.set_position(rows);
                match live.state {
                    TableState::Done => bar.finish_with_message("done"),
                    TableState::Failed => bar.abandon_with_message("failed (see the log)"),
                    TableState::Pending | TableState::Copying => {}
                }
            }
        }
    }
}

/// Records, in the state file, that every table of the publication is to
/// be copied: before the slot is created, or when it was recreated.
pub(crate) fn request_all(
    store: &Store,
    pipeline: &str,
) -> Result<(), crate::checkpoint::CheckpointError> {
    let stored: Vec<String> = store
        .snapshot_progress(pipeline)?
        .into_iter()
        .map(|p| p.table)
        .collect();
    let remove: Vec<&str> = stored.iter().map(String::as_str).collect();
    store.replace_snapshot_progress(
        pipeline,
        &remove,
        &[SnapshotProgress::pending(ALL_TABLES, None)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Column, ReplicaIdentity};
    use datum_guest::Txn;

    fn relation(columns: &[&str]) -> Arc<Relation> {
        Arc::new(Relation {
            oid: 9,
            schema: "public".into(),
            table: "t".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: columns
                .iter()
                .map(|c| Column::new(c, "int4", *c == "id"))
                .collect(),
        })
    }

    fn watermark(content: &str) -> Change {
        Change::Message {
            transactional: true,
            lsn: Lsn(1),
            prefix: WATERMARK_PREFIX.into(),
            content: content.as_bytes().to_vec(),
        }
    }

    fn batch(commit_lsn: u64, changes: Vec<Change>) -> Batch {
        Batch {
            txn: Txn::committed(1, commit_lsn),
            changes,
            bytes: 0,
        }
    }

    /// A chunk of `t` read with columns `(id, v)`, between watermarks that
    /// have a live insert described by `live` in between: the snapshot rows
    /// that come out at the high watermark, and what the copier learns.
    fn place_with_live_change(live: Arc<Relation>) -> (usize, Placed) {
        let snapshots = Snapshots::new("p");
        let read = relation(&["id", "v"]);
        let (id, low, high, mut placed) = snapshots.begin_chunk(&table_t(&read));
        let mut first = batch(10, vec![watermark(&low)]);
        snapshots.observe(&mut first);
        snapshots.chunk_read(id, row_1(read, Default::default()));
        let values = live.columns.iter().map(|_| Value::Int(5)).collect();
        let mut last = batch(
            20,
            vec![
                Change::Insert {
                    relation: live,
                    new: values,
                },
                watermark(&high),
            ],
        );
        snapshots.observe(&mut last);
        (copied(&last), placed.try_recv().expect("an answer"))
    }

    /// Table `public.t` as a copy reads it, with columns `read`.
    fn table_t(read: &Arc<Relation>) -> SnapshotTable {
        SnapshotTable {
            name: "public.t".into(),
            oid: 9,
            relation: read.clone(),
            key: vec![0],
            only: true,
            column_list: None,
            row_filter: None,
            estimate: 1,
            role: "r".into(),
        }
    }

    /// A chunk of `t` read with columns `read` under `snapshot`: row 1.
    fn row_1(read: Arc<Relation>, snapshot: reader::ReadSnapshot) -> Ready {
        Ready {
            relation: read,
            key: vec![0],
            rows: vec![vec![Value::Int(1), Value::Int(1)]],
            bytes: 8,
            progress: SnapshotProgress::pending("public.t", None),
            snapshot,
        }
    }

    /// The copied rows `batch` carries.
    fn copied(batch: &Batch) -> usize {
        batch
            .changes
            .iter()
            .filter(|c| matches!(c, Change::Snapshot { .. }))
            .count()
    }

    #[test]
    fn a_chunk_read_with_other_columns_than_the_stream_has_since_is_read_again() {
        // The stream describes the table as the chunk was read: placed.
        let (rows, placed) = place_with_live_change(relation(&["id", "v"]));
        assert_eq!(rows, 1);
        assert!(
            matches!(placed, Placed::Emitted { emitted: 1, .. }),
            "{placed:?}"
        );
        // A column was added between the watermarks: the chunk's rows may
        // lack it, and would follow the new shape's first row.
        let (rows, placed) = place_with_live_change(relation(&["id", "v", "note"]));
        assert_eq!(rows, 0);
        assert_eq!(placed, Placed::Lost);
    }

    /// Transaction 42 is delivered before a chunk's low watermark; the
    /// chunk is read under `read_under`: the snapshot rows that come out
    /// at the high watermark, and what the copier learns.
    fn place_after_transaction_42(read_under: &str) -> (usize, Placed) {
        let snapshots = Snapshots::new("p");
        let read = relation(&["id", "v"]);
        let (id, low, high, mut placed) = snapshots.begin_chunk(&table_t(&read));
        let mut delivered = Batch {
            txn: Txn::committed(42, 5),
            changes: vec![Change::Insert {
                relation: read.clone(),
                new: vec![Value::Int(7), Value::Int(7)],
            }],
            bytes: 0,
        };
        snapshots.observe(&mut delivered);
        snapshots.observe(&mut batch(10, vec![watermark(&low)]));
        let snapshot = reader::ReadSnapshot::parse(read_under).expect("a snapshot");
        snapshots.chunk_read(id, row_1(read, snapshot));
        let mut last = batch(20, vec![watermark(&high)]);
        snapshots.observe(&mut last);
        (copied(&last), placed.try_recv().expect("an answer"))
    }

    #[test]
    fn a_chunk_read_before_a_transaction_delivered_ahead_of_it_was_visible_is_read_again() {
        let (rows, placed) = place_after_transaction_42("40:50:");
        assert_eq!(rows, 1);
        assert!(matches!(placed, Placed::Emitted { .. }), "{placed:?}");
        // Committed before the low watermark, not yet visible to the read:
        // its rows could undo transaction 42.
        let (rows, placed) = place_after_transaction_42("40:50:42,45");
        assert_eq!(rows, 0);
        assert_eq!(placed, Placed::TooEarly(vec![42]));
        // Nor when its id is past every one that had ended (the snapshot
        // does not list it as running).
        let (rows, placed) = place_after_transaction_42("40:42:40");
        assert_eq!(rows, 0);
        assert_eq!(placed, Placed::TooEarly(vec![42]));
    }

    /// Regression: a backfill accepted once a copy's last chunk was placed,
    /// before its progress was committed: that progress, committed with a
    /// later checkpoint, recorded the table as done over the backfill's
    /// pending state, and a crash then lost the backfill.
    #[test]
    fn a_backfill_right_after_a_copy_is_not_recorded_over_by_that_copy() {
        let snapshots = Snapshots::new("p");
        let mut done = SnapshotProgress::pending("public.t", None);
        done.state = TableState::Done;
        let other = SnapshotProgress::pending("public.u", None);
        snapshots
            .lock()
            .ledger
            .insert(Lsn(10), vec![done.clone(), other.clone()]);
        assert_eq!(snapshots.progress_upto(Lsn(20)), [done, other.clone()]);
        snapshots.watch(&SnapshotProgress::pending("public.t", None));
        assert_eq!(snapshots.progress_upto(Lsn(20)), [other], "only u's");
    }
}
