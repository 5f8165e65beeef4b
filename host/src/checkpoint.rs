//! The host's durable state, in one redb file: where each pipeline resumes,
//! per-table snapshot progress, the module registry and dead letters.
//!
//! Owns the file format (tables, value layouts, a format version checked on
//! open), durable commits, and the commit loop that turns a pipeline's
//! acknowledged watermark into a checkpoint — grouping many small
//! transactions into one fsync with a bounded, configurable added latency.
//! Nothing else in the host touches redb: the source, transforms and sinks
//! go through the typed API here.
//!
//! It never recreates a file it cannot read: a corrupt file, one written by
//! a newer format, or one that is not Datum's, is an error that says what to
//! do, because the positions it holds decide whether data is lost.
//!
//! Format version 1 (every value a fixed tuple, so the layout is explicit):
//!
//! | table | key | value |
//! | --- | --- | --- |
//! | `meta` | `&str` | `u64` (`format_version`, `created_at`) |
//! | `offsets` | pipeline | (end LSN, commit LSN, xid, commit time µs, written at µs) |
//! | `snapshot_progress` | (pipeline, table) | (state, detail bytes, rows copied, updated at µs) |
//! | `module_versions` | (module, version) | (sha256, wasm bytes, uploaded at µs, note) |
//! | `module_active` | module | active version |
//! | `module_activations` | (module, seq) | (version, at µs, effective after LSN) |
//! | `dead_letters` | (pipeline, id) | (batch bytes, error, module version, at µs) |
//! | `relation_shapes` | (pipeline, relation OID) | shape bytes |
//!
//! A module is keyed `PIPELINE/NAME` (the transform's name in the pipeline);
//! a version's note is JSON: `{"config": TOML text, "origin": "config" |
//! "upload", "fixtures": N}`. `module_activations` was added without a format
//! change: older builds ignore it, and it is created on open.
//!
//! A shape is a MessagePack map (`schema`, `table`, `replica_identity`,
//! `columns`: `name`, `type_oid`, `type_name`, `type_modifier`, `key`;
//! `from_snapshot`): the
//! table's shape as the stream last described it up to the pipeline's
//! checkpoint, written in the checkpoint's commit (`docs/schema.md`).
//! `relation_shapes` was added without a format change, like
//! `module_activations`.
//!
//! A snapshot's state is 0 pending, 1 copying, 2 done, 3 failed; its detail
//! is a MessagePack map with named fields (`cursor`: the text of the last
//! key copied, one entry per key column; `key`: those columns' names, absent
//! in files written before it was added; `chunks`; `error`; `started_at`),
//! so that fields can be added. The table `*` of a pipeline stands for
//! "every table of the publication", recorded before the slot is created.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

pub(crate) use crate::event::Offset;
use crate::event::{Column, Lsn, Relation, ReplicaIdentity};

/// The format this build writes and the newest it reads.
pub(crate) const FORMAT_VERSION: u64 = 1;

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const OFFSETS: TableDefinition<&str, (u64, u64, u32, i64, i64)> = TableDefinition::new("offsets");
/// Per-table snapshot progress: (state, detail, rows copied, updated at).
type SnapshotRow = (u8, &'static [u8], u64, i64);
pub(crate) const SNAPSHOT_PROGRESS: TableDefinition<(&str, &str), SnapshotRow> =
    TableDefinition::new("snapshot_progress");
/// Module versions: (sha256, wasm, uploaded at, note). Filled by hot swap.
type ModuleRow = (&'static [u8], &'static [u8], i64, &'static str);
pub(crate) const MODULE_VERSIONS: TableDefinition<(&str, u64), ModuleRow> =
    TableDefinition::new("module_versions");
/// The active version of each module. Filled by hot swap.
pub(crate) const MODULE_ACTIVE: TableDefinition<&str, u64> = TableDefinition::new("module_active");
/// Each activation of a module version: (version, at, effective after LSN).
pub(crate) const MODULE_ACTIVATIONS: TableDefinition<(&str, u64), (u64, i64, u64)> =
    TableDefinition::new("module_activations");
/// Dead letters: (batch, error, module version, at). Filled by `on_error`.
type DeadLetterRow = (&'static [u8], &'static str, u64, i64);
/// Shapes are (pipeline, relation OID) → MessagePack (see the module
/// documentation).
const RELATION_SHAPES: TableDefinition<(&str, u32), &[u8]> =
    TableDefinition::new("relation_shapes");
pub(crate) const DEAD_LETTERS: TableDefinition<(&str, u64), DeadLetterRow> =
    TableDefinition::new("dead_letters");

/// What can go wrong with the state file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Written by a newer Datum.
    #[error(
        "{}: written by a newer Datum (state format {found}; this build reads up to \
         {FORMAT_VERSION}): upgrade Datum, or point it at another state file",
        path.display()
    )]
    NewerFormat {
        /// The file.
        path: PathBuf,
        /// Its format version.
        found: u64,
    },
    /// Unreadable: damaged, or not a redb file.
    #[error(
        "{} is corrupt, truncated or not a Datum state file ({detail}); Datum will not recreate it, \
         since it holds where each pipeline resumes: restore it from a backup, or move it \
         aside to start over (each pipeline then starts from its slot's position, and its \
         target may need a resync)",
        path.display()
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What redb reported.
        detail: String,
    },
    /// Another process has the file open.
    #[error(
        "{} is in use by another process: is a second Datum host running with the same \
         state file?",
        path.display()
    )]
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// Reading or writing failed.
    #[error("{}: {detail}", path.display())]
    Storage {
        /// The file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
}

/// The state file.
///
/// After an I/O error (a full disk, a failing device) redb refuses every
/// later commit on the same handle, so the handle is closed and the file
/// opened again before the next use: once the cause is gone (space freed),
/// commits go through again. Until then each use fails with the error, and
/// [`Store::health`] says so.
#[derive(Debug)]
pub struct Store {
    db: std::sync::RwLock<Option<Arc<Database>>>,
    path: PathBuf,
    commits: std::sync::atomic::AtomicU64,
    /// Set by an I/O error: reopen before the next use.
    reopen: std::sync::atomic::AtomicBool,
    health: std::sync::Mutex<Health>,
}

/// How the state file has fared since the host started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    /// Reads and writes that failed with an I/O error.
    pub io_errors: u64,
    /// Times the file was reopened after one.
    pub reopens: u64,
    /// The last I/O error, and when (µs since the Unix epoch).
    pub last_error: Option<(String, i64)>,
    /// Whether the last use failed (cleared by the next that succeeds).
    pub failing: bool,
}

pub(crate) fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

impl Store {
    /// Opens the state file, creating it when it does not exist (or is empty,
    /// as a crash during creation leaves it). An existing file is checked
    /// page by page before it is trusted.
    ///
    /// A file that cannot be opened is left exactly as it was: redb may write
    /// to a file while it tries to repair it, so when the attempt fails, the
    /// bytes read before it are put back.
    pub fn open(path: impl AsRef<Path>) -> Result<Store, CheckpointError> {
        let path = path.as_ref().to_owned();
        let fresh = std::fs::metadata(&path)
            .map(|m| m.len() == 0)
            .unwrap_or(true);
        let before = if fresh {
            None
        } else {
            Some(std::fs::read(&path).map_err(|e| CheckpointError::Storage {
                path: path.clone(),
                detail: format!("reading it: {e}"),
            })?)
        };
        let result = Store::open_file(&path, fresh);
        if let (Err(err), Some(before)) = (&result, before)
            && !matches!(err, CheckpointError::InUse { .. })
            && std::fs::read(&path).ok().as_deref() != Some(&before[..])
        {
            restore(&path, &before);
        }
        result
    }

    fn open_file(path: &Path, fresh: bool) -> Result<Store, CheckpointError> {
        let mut builder = Database::builder();
        let db = if fresh {
            builder.create(path)
        } else {
            builder.set_check_integrity_on_open(true).open(path)
        }
        .map_err(|err| open_error(path, err))?;
        let store = Store {
            db: std::sync::RwLock::new(Some(Arc::new(db))),
            path: path.to_owned(),
            commits: Default::default(),
            reopen: Default::default(),
            health: Default::default(),
        };
        store.init(fresh)?;
        Ok(store)
    }

    /// The open database, reopened first if an I/O error closed it.
    fn db(&self) -> Result<Arc<Database>, CheckpointError> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.reopen.load(Relaxed) {
            let mut slot = self.db.write().unwrap_or_else(|p| p.into_inner());
            if self.reopen.load(Relaxed) {
                // The old handle must be gone before the file can be
                // opened again (a reader still holding it makes this
                // attempt fail; the next one succeeds).
                drop(slot.take());
                let db = Database::builder()
                    .open(&self.path)
                    .map_err(|err| self.failed(open_error(&self.path, err)))?;
                *slot = Some(Arc::new(db));
                self.reopen.store(false, Relaxed);
                self.health_mut().reopens += 1;
                tracing::info!(path = %self.path.display(), "state file reopened after an I/O error");
            }
        }
        self.db
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| CheckpointError::Storage {
                path: self.path.clone(),
                detail: "closed after an I/O error; reopening on the next use".into(),
            })
    }

    fn health_mut(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a failure (and whether it calls for a reopen).
    fn failed(&self, err: CheckpointError) -> CheckpointError {
        let mut health = self.health_mut();
        health.io_errors += 1;
        health.failing = true;
        health.last_error = Some((err.to_string(), now_micros()));
        err
    }

    /// Records that a use succeeded.
    fn succeeded(&self) {
        let mut health = self.health_mut();
        if health.failing {
            health.failing = false;
        }
    }

    /// I/O errors, reopens and the last error since the host started.
    pub fn health(&self) -> Health {
        self.health_mut().clone()
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Durable offset commits made through this handle.
    pub fn commits(&self) -> u64 {
        self.commits.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn storage(&self, err: impl std::fmt::Display) -> CheckpointError {
        let detail = err.to_string();
        if detail.contains("orrupt") || detail.contains("fill whole buffer") {
            CheckpointError::Corrupt {
                path: self.path.clone(),
                detail,
            }
        } else if detail.contains("I/O error") {
            // redb refuses the handle from now on ("Previous I/O error
            // occurred"): reopen before the next use.
            self.reopen
                .store(true, std::sync::atomic::Ordering::Relaxed);
            self.failed(CheckpointError::Storage {
                path: self.path.clone(),
                detail,
            })
        } else {
            CheckpointError::Storage {
                path: self.path.clone(),
                detail,
            }
        }
    }

    fn init(&self, fresh: bool) -> Result<(), CheckpointError> {
        let txn = self.db()?.begin_write().map_err(|e| self.storage(e))?;
        {
            let mut meta = txn.open_table(META).map_err(|e| self.storage(e))?;
            let version = meta
                .get("format_version")
                .map_err(|e| self.storage(e))?
                .map(|v| v.value());
            match version {
                Some(found) if found > FORMAT_VERSION => {
                    return Err(CheckpointError::NewerFormat {
                        path: self.path.clone(),
                        found,
                    });
                }
                Some(_) => {}
                None if fresh => {
                    meta.insert("format_version", FORMAT_VERSION)
                        .map_err(|e| self.storage(e))?;
                    meta.insert("created_at", now_micros() as u64)
                        .map_err(|e| self.storage(e))?;
                }
                None => {
                    return Err(CheckpointError::Corrupt {
                        path: self.path.clone(),
                        detail: "a redb file without Datum's format version".into(),
                    });
                }
            }
            // Create every table now so that the layout is fixed with the
            // version, whichever features a host uses.
            txn.open_table(OFFSETS).map_err(|e| self.storage(e))?;
            txn.open_table(SNAPSHOT_PROGRESS)
                .map_err(|e| self.storage(e))?;
            txn.open_table(MODULE_VERSIONS)
                .map_err(|e| self.storage(e))?;
            txn.open_table(MODULE_ACTIVE).map_err(|e| self.storage(e))?;
            txn.open_table(MODULE_ACTIVATIONS)
                .map_err(|e| self.storage(e))?;
            txn.open_table(DEAD_LETTERS).map_err(|e| self.storage(e))?;
            txn.open_table(RELATION_SHAPES)
                .map_err(|e| self.storage(e))?;
        }
        txn.commit().map_err(|e| self.storage(e))
    }

    /// The format version recorded in the file.
    pub fn format_version(&self) -> Result<u64, CheckpointError> {
        let txn = self.db()?.begin_read().map_err(|e| self.storage(e))?;
        let meta = txn.open_table(META).map_err(|e| self.storage(e))?;
        Ok(meta
            .get("format_version")
            .map_err(|e| self.storage(e))?
            .map(|v| v.value())
            .unwrap_or(0))
    }

    /// Where `pipeline` resumes, if it ever checkpointed.
    pub fn offset(&self, pipeline: &str) -> Result<Option<Offset>, CheckpointError> {
        let txn = self.db()?.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(OFFSETS).map_err(|e| self.storage(e))?;
        Ok(table.get(pipeline).map_err(|e| self.storage(e))?.map(|v| {
            let (end, commit, xid, commit_time, written_at) = v.value();
            Offset {
                end_lsn: Lsn(end),
                commit_lsn: Lsn(commit),
                xid,
                commit_time,
                written_at,
            }
        }))
    }

    /// Durably records where `pipeline` resumes; returns once it is on disk.
    /// An offset never moves backwards: an older one is ignored.
    pub fn commit_offset(&self, pipeline: &str, offset: Offset) -> Result<(), CheckpointError> {
        self.write_offset(pipeline, offset, Move::Forward, &[], &[])
    }

    /// Durably records where `pipeline` resumes together with what is
    /// consistent with that position, in one commit: a crash keeps all or
    /// nothing (`docs/snapshots.md`, `docs/schema.md`). `progress` is the
    /// snapshot progress, `shapes` the table shapes the stream described up
    /// to it (`source/shapes.rs`); both are written even when the offset
    /// does not move.
    pub(crate) fn commit_checkpoint(
        &self,
        pipeline: &str,
        offset: Offset,
        progress: &[SnapshotProgress],
        shapes: &[(Arc<Relation>, bool)],
    ) -> Result<(), CheckpointError> {
        self.write_offset(pipeline, offset, Move::Forward, progress, shapes)
    }

    /// The table shapes kept for `pipeline`, each with whether it was a
    /// snapshot's description (`source/shapes.rs`). A shape that does not read
    /// (a damaged entry) is left out with a warning: the table's next
    /// change is then compared with nothing, and no schema change is
    /// reported for it.
    pub(crate) fn relation_shapes(
        &self,
        pipeline: &str,
    ) -> Result<Vec<(Relation, bool)>, CheckpointError> {
        let txn = self.db()?.begin_read().map_err(|e| self.storage(e))?;
        let table = txn
            .open_table(RELATION_SHAPES)
            .map_err(|e| self.storage(e))?;
        let mut shapes = Vec::new();
        for entry in table.range((pipeline, 0)..).map_err(|e| self.storage(e))? {
            let (key, value) = entry.map_err(|e| self.storage(e))?;
            let (name, oid) = key.value();
            if name != pipeline {
                break;
            }
            match rmp_serde::from_slice::<StoredShape>(value.value()) {
                Ok(shape) => shapes.push(shape.into_relation(oid)),
                Err(err) => {
                    tracing::warn!(pipeline, oid, error = %err, "a kept table shape does not read; it is ignored");
                }
            }
        }
        Ok(shapes)
    }

    /// Durably replaces `pipeline`'s offset, also backwards: for a slot that
    /// was recreated (whose positions have nothing to do with the old), or
    /// one another host streamed past this host's checkpoint.
    pub fn reset_offset(&self, pipeline: &str, offset: Offset) -> Result<(), CheckpointError> {
        self.write_offset(pipeline, offset, Move::Reset, &[], &[])
    }

    /// Durably moves `pipeline`'s offset back to `offset` and forgets its
    /// table shapes, in one commit: the shapes were kept with a later
    /// position, and the changes replayed from `offset` may carry older
    /// ones, which compared with them would look like columns dropped.
    /// The tables' next Relation messages are their shapes again.
    pub(crate) fn rewind_offset(
        &self,
        pipeline: &str,
        offset: Offset,
    ) -> Result<(), CheckpointError> {
        self.write_offset(pipeline, offset, Move::Rewind, &[], &[])
    }

    fn write_offset(
        &self,
        pipeline: &str,
        offset: Offset,
        how: Move,
        progress: &[SnapshotProgress],
        shapes: &[(Arc<Relation>, bool)],
    ) -> Result<(), CheckpointError> {
        let txn = self.db()?.begin_write().map_err(|e| self.storage(e))?;
        if how == Move::Rewind {
            txn.open_table(RELATION_SHAPES)
                .map_err(|e| self.storage(e))?
                .retain_in((pipeline, 0)..=(pipeline, u32::MAX), |_, _| false)
                .map_err(|e| self.storage(e))?;
        }
        if !progress.is_empty() {
            self.write_progress(&txn, pipeline, progress)?;
        }
        if !shapes.is_empty() {
            let mut table = txn
                .open_table(RELATION_SHAPES)
                .map_err(|e| self.storage(e))?;
            for (relation, from_snapshot) in shapes {
                let bytes = rmp_serde::to_vec_named(&StoredShape::of(relation, *from_snapshot))
                    .map_err(|e| self.storage(e))?;
                table
                    .insert((pipeline, relation.oid), bytes.as_slice())
                    .map_err(|e| self.storage(e))?;
            }
        }
        {
            let mut table = txn.open_table(OFFSETS).map_err(|e| self.storage(e))?;
            let current = table
                .get(pipeline)
                .map_err(|e| self.storage(e))?
                .map(|v| v.value().0);
            let stale = how == Move::Forward && current.is_some_and(|end| end >= offset.end_lsn.0);
            if stale && progress.is_empty() && shapes.is_empty() {
                return Ok(());
            }
            if !stale {
                table
                    .insert(
                        pipeline,
                        (
                            offset.end_lsn.0,
                            offset.commit_lsn.0,
                            offset.xid,
                            offset.commit_time,
                            now_micros(),
                        ),
                    )
                    .map_err(|e| self.storage(e))?;
            }
        }
        // redb's default durability: on disk when commit returns.
        txn.commit().map_err(|e| self.storage(e))?;
        self.commits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.succeeded();
        Ok(())
    }
}

/// How a pipeline's offset may move in a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    /// Forward only: an older offset is not written.
    Forward,
    /// To the offset given, also backwards.
    Reset,
    /// Backwards, forgetting the table shapes kept with the later offset.
    Rewind,
}

/// A batch a pipeline set aside under `on_error = "dead_letter"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The pipeline.
    pub pipeline: String,
    /// Its number within the pipeline, from 1, in the order set aside.
    pub id: u64,
    /// The batch as the failing pipeline's first module receives it: the
    /// MessagePack input envelope `{txn, changes}` of `docs/abi.md`.
    pub batch: Vec<u8>,
    /// What went wrong.
    pub error: String,
    /// The version of the module that failed (0 when not from the module
    /// registry).
    pub module_version: u64,
    /// When it was set aside, µs since the Unix epoch.
    pub at: i64,
}

impl Store {
    /// Durably stores a dead letter; returns its id.
    pub fn add_dead_letter(
        &self,
        pipeline: &str,
        batch: &[u8],
        error: &str,
        module_version: u64,
    ) -> Result<u64, CheckpointError> {
        let txn = self.db()?.begin_write().map_err(|e| self.storage(e))?;
        let id = {
            // Ids never repeat, even after the newest letters were replayed
            // or discarded: the last id handed out is kept in `meta`.
            let mut meta = txn.open_table(META).map_err(|e| self.storage(e))?;
            let key = format!("dead_letter_last/{pipeline}");
            let issued = meta
                .get(key.as_str())
                .map_err(|e| self.storage(e))?
                .map_or(0, |v| v.value());
            let mut table = txn.open_table(DEAD_LETTERS).map_err(|e| self.storage(e))?;
            let stored = table
                .range((pipeline, 0)..=(pipeline, u64::MAX))
                .map_err(|e| self.storage(e))?
                .next_back()
                .transpose()
                .map_err(|e| self.storage(e))?
                .map_or(0, |(k, _)| k.value().1);
            let id = issued.max(stored) + 1;
            meta.insert(key.as_str(), id).map_err(|e| self.storage(e))?;
            table
                .insert((pipeline, id), (batch, error, module_version, now_micros()))
                .map_err(|e| self.storage(e))?;
            id
        };
        txn.commit().map_err(|e| self.storage(e))?;
        Ok(id)
    }

    /// The dead letters of `pipeline` (of every pipeline when None), in
    /// pipeline then id order.
    pub fn dead_letters(&self, pipeline: Option<&str>) -> Result<Vec<DeadLetter>, CheckpointError> {
        let txn = self.db()?.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(DEAD_LETTERS).map_err(|e| self.storage(e))?;
        let mut letters = Vec::new();
        for entry in table.iter().map_err(|e| self.storage(e))? {
            let (key, value) = entry.map_err(|e| self.storage(e))?;
            let (name, id) = key.value();
            if pipeline.is_some_and(|p| p != name) {
                continue;
            }
            let (batch, error, module_version, at) = value.value();
            letters.push(DeadLetter {
                pipeline: name.to_owned(),
                id,
                batch: batch.to_vec(),
                error: error.to_owned(),
                module_version,
                at,
            });
        }
        Ok(letters)
    }
}

impl Store {
    /// One dead letter.
    pub fn dead_letter(
        &self,
        pipeline: &str,
        id: u64,
    ) -> Result<Option<DeadLetter>, CheckpointError> {
        let txn = self.db()?.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(DEAD_LETTERS).map_err(|e| self.storage(e))?;
        Ok(table
            .get((pipeline, id))
            .map_err(|e| self.storage(e))?
            .map(|v| {
                let (batch, error, module_version, at) = v.value();
                DeadLetter {
                    pipeline: pipeline.to_owned(),
                    id,
                    batch: batch.to_vec(),
                    error: error.to_owned(),
                    module_version,
                    at,
                }
            }))
    }

    /// Durably removes a dead letter; whether it existed.
    pub fn remove_dead_letter(&self, pipeline: &str, id: u64) -> Result<bool, CheckpointError> {
        let txn = self.db()?.begin_write().map_err(|e| self.storage(e))?;
        let existed = {
            let mut table = txn.open_table(DEAD_LETTERS).map_err(|e| self.storage(e))?;
            table
                .remove((pipeline, id))
                .map_err(|e| self.storage(e))?
                .is_some()
        };
        txn.commit().map_err(|e| self.storage(e))?;
        Ok(existed)
    }
}

/// Where a table's snapshot stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableState {
    /// Asked for, not started.
    Pending,
    /// Chunks are being copied; `cursor` is the last key copied.
    Copying,
    /// Every row was copied; the table streams live only.
    Done,
    /// The copy stopped with `error`; a backfill starts it again.
    Failed,
}

impl TableState {
    fn code(self) -> u8 {
        match self {
            TableState::Pending => 0,
            TableState::Copying => 1,
            TableState::Done => 2,
            TableState::Failed => 3,
        }
    }

    fn from_code(code: u8) -> Option<TableState> {
        Some(match code {
            0 => TableState::Pending,
            1 => TableState::Copying,
            2 => TableState::Done,
            3 => TableState::Failed,
            _ => return None,
        })
    }

    /// As the status endpoint and the metrics name it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TableState::Pending => "pending",
            TableState::Copying => "copying",
            TableState::Done => "done",
            TableState::Failed => "failed",
        }
    }
}

/// A table's snapshot progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SnapshotProgress {
    /// `schema.table`, or [`ALL_TABLES`].
    pub table: String,
    /// Where it stands.
    pub state: TableState,
    /// The text of the last key copied, one entry per key column (`None`:
    /// from the first row).
    pub cursor: Option<Vec<String>>,
    /// The names of the key columns `cursor` holds values of (`None`: not
    /// known, as for a backfill asked to start from given values, until its
    /// first chunk).
    pub key: Option<Vec<String>>,
    /// Rows copied so far.
    pub rows: u64,
    /// Chunks copied so far.
    pub chunks: u64,
    /// Why it failed.
    pub error: Option<String>,
    /// When the copy was asked for, µs since the Unix epoch.
    pub started_at: i64,
    /// When it last moved, µs since the Unix epoch.
    pub updated_at: i64,
}

/// The table name that stands for every table of the publication.
pub(crate) const ALL_TABLES: &str = "*";

impl SnapshotProgress {
    /// A table (or [`ALL_TABLES`]) to copy, from `cursor` onwards.
    pub(crate) fn pending(table: &str, cursor: Option<Vec<String>>) -> SnapshotProgress {
        let now = now_micros();
        SnapshotProgress {
            table: table.to_owned(),
            state: TableState::Pending,
            cursor,
            key: None,
            rows: 0,
            chunks: 0,
            error: None,
            started_at: now,
            updated_at: now,
        }
    }
}

/// A `relation_shapes` value.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StoredShape {
    schema: String,
    table: String,
    replica_identity: String,
    columns: Vec<StoredColumn>,
    /// A snapshot's description (key flags and replica identity are not
    /// the stream's); absent in shapes written before it existed.
    #[serde(default)]
    from_snapshot: bool,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StoredColumn {
    name: String,
    type_oid: u32,
    type_name: String,
    type_modifier: i32,
    key: bool,
}

impl StoredShape {
    fn of(relation: &Relation, from_snapshot: bool) -> StoredShape {
        StoredShape {
            schema: relation.schema.clone(),
            table: relation.table.clone(),
            replica_identity: relation.replica_identity.name().to_owned(),
            columns: relation
                .columns
                .iter()
                .map(|c| StoredColumn {
                    name: c.name.clone(),
                    type_oid: c.type_oid,
                    type_name: c.type_name.clone(),
                    type_modifier: c.type_modifier,
                    key: c.key,
                })
                .collect(),
            from_snapshot,
        }
    }

    /// The relation, for comparing and for a schema change's `before` (its
    /// columns are never used to read values).
    fn into_relation(self, oid: u32) -> (Relation, bool) {
        let relation = Relation {
            oid,
            schema: self.schema,
            table: self.table,
            replica_identity: ReplicaIdentity::from_name(&self.replica_identity)
                .unwrap_or(ReplicaIdentity::Default),
            columns: self
                .columns
                .into_iter()
                .map(|c| {
                    let mut column = Column::new(&c.name, &c.type_name, c.key);
                    column.type_oid = c.type_oid;
                    column.type_modifier = c.type_modifier;
                    column
                })
                .collect(),
        };
        (relation, self.from_snapshot)
    }
}

/// The detail bytes of a `snapshot_progress` row.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
struct ProgressDetail {
    cursor: Option<Vec<String>>,
    key: Option<Vec<String>>,
    chunks: u64,
    error: Option<String>,
    started_at: i64,
}

impl Store {
    /// The snapshot progress of each table of `pipeline`.
    pub(crate) fn snapshot_progress(
        &self,
        pipeline: &str,
    ) -> Result<Vec<SnapshotProgress>, CheckpointError> {
        let txn = self.db()?.begin_read().map_err(|e| self.storage(e))?;
        let table = txn
            .open_table(SNAPSHOT_PROGRESS)
            .map_err(|e| self.storage(e))?;
        let mut progress = Vec::new();
        let range = table.range((pipeline, "")..).map_err(|e| self.storage(e))?;
        for entry in range {
            let (key, value) = entry.map_err(|e| self.storage(e))?;
            let (name, table_name) = key.value();
            if name != pipeline {
                break;
            }
            let (state, detail, rows, updated_at) = value.value();
            let state = TableState::from_code(state).ok_or_else(|| CheckpointError::Corrupt {
                path: self.path.clone(),
                detail: format!("snapshot state {state} of {pipeline}/{table_name} is unknown"),
            })?;
            let detail: ProgressDetail =
                rmp_serde::from_slice(detail).map_err(|e| CheckpointError::Corrupt {
                    path: self.path.clone(),
                    detail: format!("snapshot progress of {pipeline}/{table_name}: {e}"),
                })?;
            progress.push(SnapshotProgress {
                table: table_name.to_owned(),
                state,
                cursor: detail.cursor,
                key: detail.key,
                rows,
                chunks: detail.chunks,
                error: detail.error,
                started_at: detail.started_at,
                updated_at,
            });
        }
        Ok(progress)
    }

    /// Durably records snapshot progress that does not depend on the stream
    /// position: a table asked for (pending), or one that failed.
    pub(crate) fn put_snapshot_progress(
        &self,
        pipeline: &str,
        progress: &[SnapshotProgress],
    ) -> Result<(), CheckpointError> {
        self.replace_snapshot_progress(pipeline, &[], progress)
    }

    /// In one commit: forgets the progress of `remove` and records
    /// `progress` (the request for every table becoming one row per table).
    pub(crate) fn replace_snapshot_progress(
        &self,
        pipeline: &str,
        remove: &[&str],
        progress: &[SnapshotProgress],
    ) -> Result<(), CheckpointError> {
        let txn = self.db()?.begin_write().map_err(|e| self.storage(e))?;
        {
            let mut table = txn
                .open_table(SNAPSHOT_PROGRESS)
                .map_err(|e| self.storage(e))?;
            for name in remove {
                table
                    .remove((pipeline, *name))
                    .map_err(|e| self.storage(e))?;
            }
        }
        self.write_progress(&txn, pipeline, progress)?;
        txn.commit().map_err(|e| self.storage(e))?;
        self.succeeded();
        Ok(())
    }

    fn write_progress(
        &self,
        txn: &redb::WriteTransaction,
        pipeline: &str,
        progress: &[SnapshotProgress],
    ) -> Result<(), CheckpointError> {
        let mut table = txn
            .open_table(SNAPSHOT_PROGRESS)
            .map_err(|e| self.storage(e))?;
        for p in progress {
            let detail = rmp_serde::to_vec_named(&ProgressDetail {
                cursor: p.cursor.clone(),
                key: p.key.clone(),
                chunks: p.chunks,
                error: p.error.clone(),
                started_at: p.started_at,
            })
            .map_err(|e| self.storage(e))?;
            table
                .insert(
                    (pipeline, p.table.as_str()),
                    (p.state.code(), detail.as_slice(), p.rows, p.updated_at),
                )
                .map_err(|e| self.storage(e))?;
        }
        Ok(())
    }
}

/// A stored version of a module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleVersion {
    /// The version, from 1, per module.
    pub version: u64,
    /// Lowercase hex SHA-256 of the wasm bytes.
    pub sha256: String,
    /// The module.
    pub wasm: Vec<u8>,
    /// Its configuration, as TOML text (the table `datum_init` receives).
    pub config: String,
    /// `config` (from the configuration file) or `upload` (admin API).
    pub origin: String,
    /// Golden cases it passed before it was stored.
    pub fixtures: u64,
    /// When it was stored, µs since the Unix epoch.
    pub stored_at: i64,
}

/// One activation of a module version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activation {
    /// The version.
    pub version: u64,
    /// When, µs since the Unix epoch.
    pub at: i64,
    /// Every transaction ending after this LSN went through this version
    /// (until the next activation).
    pub effective_after: Lsn,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct VersionNote {
    config: String,
    origin: String,
    #[serde(default)]
    fixtures: u64,
}

impl Store {
    /// Stores a new version of `module` (`PIPELINE/NAME`); returns its number.
    /// Versions older than the newest `keep` are pruned, so rollback has
    /// somewhere to go and the file does not grow without bound; never the
    /// active one, the newest the configuration file deployed (a restart
    /// compares the file with it: pruned, the file would count as changed
    /// and replace the active version), or the newest canary (promoted
    /// later, it becomes the active one).
    pub fn add_module_version(
        &self,
        module: &str,
        wasm: &[u8],
        config: &str,
        origin: &str,
        fixtures: u64,
        keep: usize,
    ) -> Result<ModuleVersion, CheckpointError> {
        let sha256 = crate::digest::sha256_hex(wasm);
        let note = serde_json::to_string(&VersionNote {
            config: config.to_owned(),
            origin: origin.to_owned(),
            fixtures,
        })
        .map_err(|e| self.storage(e))?;
        let stored_at = now_micros();
        let txn = self.db()?.begin_write().map_err(|e| self.storage(e))?;
        let version = {
            let active = txn
                .open_table(MODULE_ACTIVE)
                .map_err(|e| self.storage(e))?
                .get(module)
                .map_err(|e| self.storage(e))?
                .map(|v| v.value());
            let mut table = txn
                .open_table(MODULE_VERSIONS)
                .map_err(|e| self.storage(e))?;
            // Each stored version's number and origin.
            let existing: Vec<(u64, String)> = table
                .range((module, 0)..=(module, u64::MAX))
                .map_err(|e| self.storage(e))?
                .map(|entry| {
                    entry.map(|(k, v)| {
                        let origin = serde_json::from_str::<VersionNote>(v.value().3)
                            .map(|n| n.origin)
                            .unwrap_or_default();
                        (k.value().1, origin)
                    })
                })
                .collect::<Result<_, _>>()
                .map_err(|e| self.storage(e))?;
            let version = existing.last().map_or(0, |(v, _)| *v) + 1;
            table
                .insert(
                    (module, version),
                    (sha256.as_bytes(), wasm, stored_at, note.as_str()),
                )
                .map_err(|e| self.storage(e))?;
            let newest = |of: &str| {
                (origin != of)
                    .then(|| {
                        existing
                            .iter()
                            .rev()
                            .find(|(_, o)| o == of)
                            .map(|(v, _)| *v)
                    })
                    .flatten()
            };
            let kept = [active, newest("config"), newest("canary")];
            // Keep the newest `keep` (the new one among them) and those.
            let keep = keep.max(2);
            let cut = (existing.len() + 1).saturating_sub(keep);
            for (old, _) in &existing[..cut.min(existing.len())] {
                if !kept.contains(&Some(*old)) {
                    table.remove((module, *old)).map_err(|e| self.storage(e))?;
                }
            }
            version
        };
        txn.commit().map_err(|e| self.storage(e))?;
        Ok(ModuleVersion {
            version,
            sha256,
            wasm: wasm.to_vec(),
            config: config.to_owned(),
            origin: origin.to_owned(),
            fixtures,
            stored_at,
        })
    }

    /// The stored versions of `module`, oldest first.
    pub fn module_versions(&self, module: &str) -> Result<Vec<ModuleVersion>, CheckpointError> {
        let txn = self.db()?.begin_read().map_err(|e| self.storage(e))?;
        let table = txn
            .open_table(MODULE_VERSIONS)
            .map_err(|e| self.storage(e))?;
        let mut versions = Vec::new();
        for entry in table
            .range((module, 0)..=(module, u64::MAX))
            .map_err(|e| self.storage(e))?
        {
            let (key, value) = entry.map_err(|e| self.storage(e))?;
            let (sha256, wasm, stored_at, note) = value.value();
            let note: VersionNote = serde_json::from_str(note).map_err(|e| self.storage(e))?;
            versions.push(ModuleVersion {
                version: key.value().1,
                sha256: String::from_utf8_lossy(sha256).into_owned(),
                wasm: wasm.to_vec(),
                config: note.config,
                origin: note.origin,
                fixtures: note.fixtures,
                stored_at,
            });
        }
        Ok(versions)
    }

    /// The active version of `module`, if one was ever activated.
    pub fn active_module_version(&self, module: &str) -> Result<Option<u64>, CheckpointError> {
        let txn = self.db()?.begin_read().map_err(|e| self.storage(e))?;
        let table = txn.open_table(MODULE_ACTIVE).map_err(|e| self.storage(e))?;
        Ok(table
            .get(module)
            .map_err(|e| self.storage(e))?
            .map(|v| v.value()))
    }

    /// Durably makes `version` the active version of `module` and records
    /// the activation.
    pub fn activate_module_version(
        &self,
        module: &str,
        version: u64,
        effective_after: Lsn,
    ) -> Result<Activation, CheckpointError> {
        let activation = Activation {
            version,
            at: now_micros(),
            effective_after,
        };
        let txn = self.db()?.begin_write().map_err(|e| self.storage(e))?;
        {
            txn.open_table(MODULE_ACTIVE)
                .map_err(|e| self.storage(e))?
                .insert(module, version)
                .map_err(|e| self.storage(e))?;
            let mut table = txn
                .open_table(MODULE_ACTIVATIONS)
                .map_err(|e| self.storage(e))?;
            let seq = table
                .range((module, 0)..=(module, u64::MAX))
                .map_err(|e| self.storage(e))?
                .next_back()
                .transpose()
                .map_err(|e| self.storage(e))?
                .map_or(0, |(k, _)| k.value().1)
                + 1;
            table
                .insert((module, seq), (version, activation.at, effective_after.0))
                .map_err(|e| self.storage(e))?;
        }
        txn.commit().map_err(|e| self.storage(e))?;
        Ok(activation)
    }

    /// Every activation of `module`, oldest first.
    pub fn module_activations(&self, module: &str) -> Result<Vec<Activation>, CheckpointError> {
        let txn = self.db()?.begin_read().map_err(|e| self.storage(e))?;
        let table = txn
            .open_table(MODULE_ACTIVATIONS)
            .map_err(|e| self.storage(e))?;
        let mut activations = Vec::new();
        for entry in table
            .range((module, 0)..=(module, u64::MAX))
            .map_err(|e| self.storage(e))?
        {
            let (_, value) = entry.map_err(|e| self.storage(e))?;
            let (version, at, lsn) = value.value();
            activations.push(Activation {
                version,
                at,
                effective_after: Lsn(lsn),
            });
        }
        Ok(activations)
    }
}

/// Puts a file's bytes back after a failed open changed them.
fn restore(path: &Path, bytes: &[u8]) {
    use std::io::Write;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(path)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        });
    match written {
        Ok(()) => {
            tracing::warn!(path = %path.display(), "the failed open changed the state file; its bytes were put back")
        }
        Err(err) => {
            tracing::error!(path = %path.display(), error = %err, "the failed open changed the state file, and putting its bytes back failed")
        }
    }
}

fn open_error(path: &Path, err: redb::DatabaseError) -> CheckpointError {
    match err {
        redb::DatabaseError::DatabaseAlreadyOpen => CheckpointError::InUse {
            path: path.to_owned(),
        },
        redb::DatabaseError::Storage(redb::StorageError::Corrupted(detail)) => {
            CheckpointError::Corrupt {
                path: path.to_owned(),
                detail,
            }
        }
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::InvalidData =>
        {
            CheckpointError::Corrupt {
                path: path.to_owned(),
                detail: io.to_string(),
            }
        }
        // A file shorter than its header says ("failed to fill whole
        // buffer"): truncated.
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::UnexpectedEof =>
        {
            CheckpointError::Corrupt {
                path: path.to_owned(),
                detail: format!("truncated: {io}"),
            }
        }
        other => CheckpointError::Storage {
            path: path.to_owned(),
            detail: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offset(end: u64) -> Offset {
        Offset {
            end_lsn: Lsn(end),
            commit_lsn: Lsn(end - 1),
            xid: 7,
            commit_time: 1,
            written_at: 0,
        }
    }

    /// Uploads beyond the versions kept used to prune the version the
    /// configuration file deployed (a restart then took the file for a
    /// new deploy and replaced the active module with it) and a canary's
    /// version before its promotion.
    #[test]
    fn pruning_keeps_the_active_the_file_s_and_the_canary_s_versions() {
        let dir = tempdir();
        let store = Store::open(dir.join("state.redb")).expect("create");
        let add = |origin: &str| {
            store
                .add_module_version("p/m", b"\0asm", "", origin, 0, 3)
                .expect("add")
                .version
        };
        let from_file = add("config");
        store
            .activate_module_version("p/m", from_file, Lsn(1))
            .expect("activate");
        let canary = add("canary");
        let active = add("upload");
        store
            .activate_module_version("p/m", active, Lsn(2))
            .expect("activate");
        let mut newest = 0;
        for _ in 0..12 {
            newest = add("upload");
        }
        let kept = || -> Vec<u64> {
            store
                .module_versions("p/m")
                .expect("versions")
                .iter()
                .map(|v| v.version)
                .collect()
        };
        assert_eq!(
            kept(),
            vec![from_file, canary, active, newest - 2, newest - 1, newest]
        );
        // A newer deploy through the file frees the older one.
        let again = add("config");
        assert_eq!(kept(), vec![canary, active, newest - 1, newest, again]);
    }

    #[test]
    fn table_shapes_are_kept_with_the_checkpoint_per_pipeline() {
        let dir = tempdir();
        let path = dir.join("state.redb");
        let mut id = Column::new("id", "int4", true);
        id.type_oid = 23;
        let mut note = Column::new("note", "varchar", false);
        note.type_oid = 1043;
        note.type_modifier = 24;
        let relation = Arc::new(Relation {
            oid: 16384,
            schema: "public".into(),
            table: "t".into(),
            replica_identity: ReplicaIdentity::Full,
            columns: vec![id, note],
        });
        {
            let store = Store::open(&path).expect("create");
            store
                .commit_checkpoint("a", offset(10), &[], &[(relation.clone(), true)])
                .expect("commit");
        }
        let store = Store::open(&path).expect("reopen");
        assert!(store.relation_shapes("b").expect("read").is_empty());
        let kept = store.relation_shapes("a").expect("read");
        assert_eq!(kept.len(), 1);
        let (shape, from_snapshot) = &kept[0];
        assert!(from_snapshot);
        assert!(shape.same_shape(&relation), "{shape:?}");
        assert_eq!(shape.columns[1].sql_type(), "varchar(20)");
        assert_eq!(
            store.offset("a").expect("offset").map(|o| o.end_lsn),
            Some(Lsn(10))
        );
    }

    #[test]
    fn dead_letters_are_numbered_per_pipeline_and_survive_reopening() {
        let dir = tempdir();
        let path = dir.join("state.redb");
        {
            let store = Store::open(&path).expect("create");
            assert_eq!(store.add_dead_letter("a", b"one", "e1", 3).expect("add"), 1);
            assert_eq!(store.add_dead_letter("b", b"x", "e", 1).expect("add"), 1);
            assert_eq!(store.add_dead_letter("a", b"two", "e2", 4).expect("add"), 2);
        }
        let store = Store::open(&path).expect("reopen");
        let a = store.dead_letters(Some("a")).expect("list");
        assert_eq!(
            a.iter()
                .map(|d| (d.id, d.batch.as_slice(), d.error.as_str(), d.module_version))
                .collect::<Vec<_>>(),
            [(1, &b"one"[..], "e1", 3), (2, &b"two"[..], "e2", 4)]
        );
        assert!(a.iter().all(|d| d.pipeline == "a" && d.at > 0));
        assert_eq!(store.dead_letters(None).expect("all").len(), 3);
        assert_eq!(store.add_dead_letter("a", b"3", "e3", 4).expect("add"), 3);
    }

    /// Regression: ids were the newest stored id plus one, so discarding or
    /// replaying the newest letter handed its id to the next one.
    #[test]
    fn dead_letter_ids_never_repeat_after_a_discard() {
        let dir = tempdir();
        let path = dir.join("state.redb");
        {
            let store = Store::open(&path).expect("create");
            assert_eq!(store.add_dead_letter("a", b"1", "e", 1).expect("add"), 1);
            assert_eq!(store.add_dead_letter("a", b"2", "e", 1).expect("add"), 2);
            assert!(store.remove_dead_letter("a", 2).expect("discard"));
            assert_eq!(store.add_dead_letter("a", b"3", "e", 1).expect("add"), 3);
            assert!(store.remove_dead_letter("a", 3).expect("discard"));
            assert!(store.remove_dead_letter("a", 1).expect("discard"));
        }
        let store = Store::open(&path).expect("reopen");
        assert_eq!(store.add_dead_letter("a", b"4", "e", 1).expect("add"), 4);
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn offsets_survive_reopening_and_never_go_backwards() {
        let dir = tempdir();
        let path = dir.join("state.redb");
        {
            let store = Store::open(&path).expect("create");
            assert_eq!(store.offset("p").expect("read"), None);
            store.commit_offset("p", offset(100)).expect("commit");
            store
                .commit_offset("p", offset(50))
                .expect("older is ignored");
            store.commit_offset("q", offset(10)).expect("commit");
        }
        let store = Store::open(&path).expect("reopen");
        assert_eq!(store.format_version().expect("version"), FORMAT_VERSION);
        let p = store.offset("p").expect("read").expect("present");
        assert_eq!((p.end_lsn, p.commit_lsn, p.xid), (Lsn(100), Lsn(99), 7));
        assert!(p.written_at > 0);
        assert_eq!(
            store.offset("q").expect("read").map(|o| o.end_lsn),
            Some(Lsn(10))
        );
        store.reset_offset("p", offset(20)).expect("reset");
        assert_eq!(
            store.offset("p").expect("read").map(|o| o.end_lsn),
            Some(Lsn(20))
        );
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_newer_format_is_refused() {
        let dir = tempdir();
        let path = dir.join("state.redb");
        {
            let db = Database::create(&path).expect("create");
            let txn = db.begin_write().expect("write");
            txn.open_table(META)
                .expect("meta")
                .insert("format_version", FORMAT_VERSION + 1)
                .expect("insert");
            txn.commit().expect("commit");
        }
        let err = Store::open(&path).expect_err("newer");
        assert!(
            matches!(err, CheckpointError::NewerFormat { found: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("upgrade Datum"), "{err}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_foreign_or_damaged_file_is_reported_and_left_alone() {
        let dir = tempdir();
        let path = dir.join("state.redb");
        std::fs::write(&path, b"this is not a database, but it matters to someone").expect("write");
        let err = Store::open(&path).expect_err("not redb");
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err:?}");
        assert!(err.to_string().contains("will not recreate"), "{err}");
        assert_eq!(
            std::fs::read(&path).expect("read"),
            b"this is not a database, but it matters to someone",
            "the file was not touched"
        );

        // A real state file with flipped bytes in its pages.
        std::fs::remove_file(&path).expect("rm");
        {
            let store = Store::open(&path).expect("create");
            for i in 1..200 {
                store
                    .commit_offset(&format!("p{i}"), offset(i + 1))
                    .expect("commit");
            }
        }
        let mut bytes = std::fs::read(&path).expect("read");
        // Damage every page past the header, as a failing disk might.
        for page in bytes.chunks_mut(4096).skip(1) {
            for b in &mut page[64..96] {
                *b ^= 0xff;
            }
        }
        std::fs::write(&path, &bytes).expect("write");
        let err = Store::open(&path).expect_err("damaged");
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err:?}");

        // A redb file that is not Datum's.
        let other = dir.join("other.redb");
        Database::create(&other).expect("create");
        let err = Store::open(&other).expect_err("foreign");
        assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err:?}");
        std::fs::remove_dir_all(dir).ok();
    }

    /// Regression: a failed open of a damaged file changed the file (redb
    /// writes while it tries a repair), and a truncated file was reported
    /// as "failed to fill whole buffer" without the corruption advice.
    #[test]
    fn a_failed_open_leaves_a_damaged_or_truncated_file_byte_identical() {
        let dir = tempdir();
        let path = dir.join("state.redb");
        {
            let store = Store::open(&path).expect("create");
            for i in 1..300 {
                store
                    .commit_offset(&format!("p{i}"), offset(i + 1))
                    .expect("commit");
            }
        }
        let good = std::fs::read(&path).expect("read");
        // Damage pages here and there, as a failing disk might.
        for (n, at) in [(1usize, 100usize), (3, 20), (5, 2000)] {
            let mut bytes = good.clone();
            for page in bytes.chunks_mut(4096).skip(1).step_by(n) {
                let end = (at + 64).min(page.len());
                for b in &mut page[at.min(end)..end] {
                    *b ^= 0x5a;
                }
            }
            std::fs::write(&path, &bytes).expect("write");
            let digest = crate::digest::sha256_hex(&bytes);
            let opened = Store::open(&path);
            let after = crate::digest::sha256_hex(&std::fs::read(&path).expect("read"));
            assert_eq!(
                after,
                digest,
                "the open (ok: {}) changed the file",
                opened.is_ok()
            );
            if let Err(err) = opened {
                assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err:?}");
            }
        }
        // Truncated to a part of its header, and to half its pages.
        for len in [100, good.len() / 2] {
            std::fs::write(&path, &good[..len]).expect("write");
            let err = Store::open(&path).expect_err("truncated");
            let text = err.to_string();
            assert!(matches!(err, CheckpointError::Corrupt { .. }), "{text}");
            assert!(text.contains("will not recreate"), "{text}");
            assert_eq!(std::fs::read(&path).expect("read"), &good[..len]);
        }
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn a_second_opener_is_told_the_file_is_in_use() {
        let dir = tempdir();
        let path = dir.join("state.redb");
        let _first = Store::open(&path).expect("create");
        let err = Store::open(&path).expect_err("in use");
        assert!(matches!(err, CheckpointError::InUse { .. }), "{err:?}");
        std::fs::remove_dir_all(dir).ok();
    }

    fn tempdir() -> PathBuf {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "datum-checkpoint-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }
}
