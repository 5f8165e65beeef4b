//! `datum record`: real batches as golden-test inputs, so that fixtures come
//! from real traffic instead of being written by hand.
//!
//! Three sources. A replication slot: a temporary copy of the slot is made
//! (`pg_copy_logical_replication_slot`) and its pending changes are peeked
//! through pgoutput's SQL interface, decoded by the same decoder and
//! assembler the pipeline uses — the slot itself is never read, advanced or
//! held, so recording works while a pipeline streams from it. Or a state
//! file's dead letters: the batches a pipeline set aside under
//! `on_error = "dead_letter"`, exactly as its first module received them.
//! Or tables' existing rows as a snapshot hands them to modules
//! (`op = "snapshot"`), read by the snapshot's own reader: the first chunk
//! of each table, one batch per table.
//!
//! Either way the files hold real rows. The command line warns about it;
//! this module only writes what it is given.

use std::path::{Path, PathBuf};

use datum_guest::wire;

use crate::checkpoint::Store;
use crate::event::BatchLimits;
use crate::event::Lsn;
use crate::event::json::BatchJson;
use crate::pg::ConnInfo;
use crate::pg::quote_literal;
use crate::source::assembler::Assembler;
use crate::source::shapes::Tracker;
use crate::source::snapshot as reader;
use crate::source::{RowColumns, SourceError, catalog, pgoutput};
use crate::transform::encode::to_wire;

/// Messages peeked at most: bounds the work the server does for one record.
pub(crate) const MAX_MESSAGES: i64 = 200_000;

/// Where and how much to write.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Directory for the `NAME.input.json` files (created if missing).
    pub out: PathBuf,
    /// Most batches to write.
    pub limit: usize,
    /// File name prefix.
    pub prefix: String,
    /// Replace existing files.
    pub force: bool,
}

/// Why recording failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Something needed was not given.
    #[error("{0}")]
    Usage(String),
    /// The source database.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The slot cannot be recorded from.
    #[error("{0}")]
    Slot(String),
    /// The state file.
    #[error(transparent)]
    State(#[from] crate::checkpoint::CheckpointError),
    /// A dead letter's batch does not decode.
    #[error("dead letter {pipeline}/{id}: its batch does not decode: {reason}")]
    DeadLetter {
        /// The pipeline.
        pipeline: String,
        /// The id.
        id: u64,
        /// Why.
        reason: String,
    },
    /// Nothing to record.
    #[error("{0}")]
    Empty(String),
    /// A file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What happened.
        source: std::io::Error,
    },
    /// A file exists.
    #[error("{} exists; pass --force to replace it, or choose another --prefix", .0.display())]
    Exists(PathBuf),
}

/// Where `datum record` takes batches from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Source {
    /// A database whose slot is peeked (`--url`).
    pub url: Option<String>,
    /// The slot (`--slot`).
    pub slot: Option<String>,
    /// The publication (`--publication`).
    pub publication: Option<String>,
    /// A state file whose dead letters are read (`--state`).
    pub state: Option<std::path::PathBuf>,
    /// The pipeline whose dead letters (`--pipeline`).
    pub pipeline: Option<String>,
    /// Tables whose first rows are recorded as snapshot rows (`--table`).
    pub tables: Vec<String>,
    /// Rows per table (`--rows`).
    pub rows: usize,
}

/// `datum record`: writes the fixtures and says what to do with them.
pub(crate) fn command(
    source: Source,
    options: &Options,
) -> Result<super::Outcome, super::CommandError> {
    eprintln!(
        "warning: recorded fixtures hold real rows from your database; review and scrub \
         them before you commit or share them"
    );
    let files = match (source.url, source.state) {
        (Some(url), _) if !source.tables.is_empty() => {
            super::block_on(from_tables(&url, &source.tables, source.rows, options))??
        }
        (Some(url), _) => super::block_on(from_slot(
            &url,
            source.slot.as_deref(),
            source.publication.as_deref(),
            options,
        ))??,
        (None, Some(state)) => from_dead_letters(&state, source.pipeline.as_deref(), options)?,
        (None, None) => {
            return Err(super::CommandError::Usage(
                "give --url (a slot to peek) or --state (dead letters)".into(),
            ));
        }
    };
    for file in &files {
        super::say(&format!("wrote {}\n", file.display()));
    }
    super::say(&format!(
        "{} fixture{} recorded; write NAME.expected.json beside each, or run \
         `datum test MODULE.wasm {} --bless` and review what it writes\n",
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        options.out.display()
    ));
    Ok(super::Outcome::Success)
}

/// Records up to `options.limit` pending transactions of `slot`, decoded
/// with `publication`, without consuming them.
pub(crate) async fn from_slot(
    conninfo: &str,
    slot: Option<&str>,
    publication: Option<&str>,
    options: &Options,
) -> Result<Vec<PathBuf>, RecordError> {
    let (Some(slot), Some(publication)) = (slot, publication) else {
        return Err(RecordError::Usage(
            "recording from a database needs --slot and --publication (those of the pipeline)"
                .into(),
        ));
    };
    let info: ConnInfo = conninfo
        .parse()
        .map_err(|e| RecordError::Usage(format!("{e}")))?;
    let client = catalog::connect(&info).await?;
    let plugin: Option<String> = client
        .query_opt(
            "SELECT plugin::text FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()",
            &[&slot],
        )
        .await
        .map_err(SourceError::Sql)?
        .map(|row| row.col(0))
        .transpose()?;
    match plugin.as_deref() {
        None => {
            return Err(RecordError::Slot(format!(
                "slot `{slot}` does not exist in this database (`datum check URL --slot {slot}` \
                 shows what a pipeline needs)"
            )));
        }
        Some("pgoutput") => {}
        Some(other) => {
            return Err(RecordError::Slot(format!(
                "slot `{slot}` uses the `{other}` plugin; Datum reads pgoutput slots"
            )));
        }
    }
    // A temporary copy, dropped when this session ends: the real slot is
    // neither read nor held.
    let copy = format!("datum_record_{}", std::process::id());
    client
        .execute(
            "SELECT pg_copy_logical_replication_slot($1, $2, true)",
            &[&slot, &copy],
        )
        .await
        .map_err(|e| {
            RecordError::Slot(format!(
                "cannot make a temporary copy of slot `{slot}` to peek at: {} (it needs one \
                 free replication slot: raise max_replication_slots if they are all used)",
                crate::pg::error_chain(&e)
            ))
        })?;
    let rows = client
        .query(
            &format!(
                "SELECT data FROM pg_logical_slot_peek_binary_changes($1, NULL, $2::int, \
                 'proto_version', '1', 'publication_names', {})",
                quote_literal(publication)
            ),
            &[&copy, &(MAX_MESSAGES as i32)],
        )
        .await
        .map_err(|e| {
            RecordError::Slot(format!(
                "cannot read slot `{slot}` with publication `{publication}`: {}",
                crate::pg::error_chain(&e)
            ))
        })?;
    let mut assembler = Assembler::new(BatchLimits::default(), Lsn::ZERO);
    // Schema changes as a pipeline shows them, from the recording's start.
    let mut shapes = Tracker::new(None);
    let mut batches = Vec::new();
    for row in &rows {
        let data: &[u8] = row.col(0)?;
        let message = pgoutput::decode(data).map_err(SourceError::from)?;
        if let pgoutput::Message::Relation(relation) = &message {
            let missing = assembler.missing_types(relation);
            if !missing.is_empty() {
                assembler.add_types(catalog::resolve_types(&client, &missing).await?);
            }
        }
        if let Some(mut batch) = assembler.push(message)? {
            shapes.observe(&mut batch);
            // Snapshot watermarks never reach modules: a transaction that
            // holds nothing else is not recorded.
            let changes: Vec<wire::Change> = batch
                .changes
                .iter()
                .filter(|c| !matches!(c, crate::event::Change::Message { prefix, .. } if prefix == reader::WATERMARK_PREFIX))
                .map(to_wire)
                .collect();
            if changes.is_empty() && !batch.changes.is_empty() {
                continue;
            }
            batches.push(wire::Batch {
                txn: batch.txn,
                changes,
            });
            if batches.len() >= options.limit {
                break;
            }
        }
    }
    let _ = client
        .execute("SELECT pg_drop_replication_slot($1)", &[&copy])
        .await;
    if batches.is_empty() {
        return Err(RecordError::Empty(format!(
            "slot `{slot}` holds no pending transaction that publication `{publication}` \
             publishes; make some changes to its tables and record again"
        )));
    }
    let named: Vec<(String, wire::Batch)> = batches
        .into_iter()
        .enumerate()
        .map(|(i, b)| (format!("{}-{:03}", options.prefix, i + 1), b))
        .collect();
    write_all(&named, options)
}

/// Records the first `rows` rows of each table in key order, as a
/// snapshot of it hands them to modules: one batch per table, `op =
/// "snapshot"`, values read and parsed by the snapshot's reader. The
/// batch's transaction is the server's position when the rows were read
/// (a pipeline's snapshot batch carries its high watermark's instead).
pub(crate) async fn from_tables(
    conninfo: &str,
    tables: &[String],
    rows: usize,
    options: &Options,
) -> Result<Vec<PathBuf>, RecordError> {
    let info: ConnInfo = conninfo
        .parse()
        .map_err(|e| RecordError::Usage(format!("{e}")))?;
    let client = reader::connect(&info).await?;
    let mut named = Vec::new();
    for name in tables.iter().take(options.limit) {
        let name = reader::resolve_table(&client, name).await?;
        let table = reader::describe(&client, &name, None).await?;
        let chunk = reader::read_chunk(&client, &table, None, rows.max(1)).await?;
        let position = client
            .query_one(
                "SELECT (pg_current_wal_lsn() - '0/0')::text,                  (extract(epoch FROM now()) * 1000000)::int8",
                &[],
            )
            .await
            .map_err(SourceError::Sql)?;
        let lsn: u64 = position
            .try_get::<_, String>(0)
            .ok()
            .and_then(|lsn| lsn.parse().ok())
            .unwrap_or(0);
        let txn = wire::Txn {
            xid: 0,
            commit_lsn: lsn,
            end_lsn: lsn,
            commit_time: position.try_get(1).unwrap_or(0),
            chunk: 0,
            last: true,
        };
        let changes = chunk
            .rows
            .into_iter()
            .map(|new| {
                to_wire(&crate::event::Change::Snapshot {
                    relation: table.relation.clone(),
                    new,
                })
            })
            .collect();
        let file = format!("{}-{}", options.prefix, name.replace(['"', '/'], "_"));
        named.push((file, wire::Batch { txn, changes }));
    }
    write_all(&named, options)
}

/// Records the dead letters of `pipeline` (of every pipeline when None) from
/// a state file. The pipeline must not be running: the state file has one
/// user at a time.
pub(crate) fn from_dead_letters(
    state: &Path,
    pipeline: Option<&str>,
    options: &Options,
) -> Result<Vec<PathBuf>, RecordError> {
    if !state.exists() {
        return Err(RecordError::Usage(format!(
            "{}: no such state file (the `state` path of the host's configuration)",
            state.display()
        )));
    }
    let store = Store::open(state)?;
    let letters = store.dead_letters(pipeline)?;
    if letters.is_empty() {
        return Err(RecordError::Empty(match pipeline {
            Some(p) => format!("pipeline `{p}` has no dead letters in {}", state.display()),
            None => format!("{} holds no dead letters", state.display()),
        }));
    }
    let mut named = Vec::new();
    for letter in letters.into_iter().take(options.limit) {
        let batch: wire::Batch =
            wire::from_msgpack(&letter.batch).map_err(|e| RecordError::DeadLetter {
                pipeline: letter.pipeline.clone(),
                id: letter.id,
                reason: e.to_string(),
            })?;
        tracing::info!(
            pipeline = %letter.pipeline,
            id = letter.id,
            error = %letter.error,
            "recording dead letter"
        );
        named.push((
            format!("{}-{}-{}", options.prefix, letter.pipeline, letter.id),
            batch,
        ));
    }
    write_all(&named, options)
}

fn write_all(
    batches: &[(String, wire::Batch)],
    options: &Options,
) -> Result<Vec<PathBuf>, RecordError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| RecordError::Io { path, source }
    };
    std::fs::create_dir_all(&options.out).map_err(io(&options.out))?;
    let paths: Vec<PathBuf> = batches
        .iter()
        .map(|(name, _)| {
            options
                .out
                .join(format!("{name}{}", crate::golden::INPUT_SUFFIX))
        })
        .collect();
    // Check every name before writing any, so a refusal leaves nothing half done.
    if !options.force
        && let Some(existing) = paths.iter().find(|p| p.exists())
    {
        return Err(RecordError::Exists(existing.clone()));
    }
    for ((_, batch), path) in batches.iter().zip(&paths) {
        std::fs::write(path, crate::event::ordered::to_pretty(&BatchJson(batch)))
            .map_err(io(path))?;
    }
    Ok(paths)
}
