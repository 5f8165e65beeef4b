//! What the sink has applied, recorded in the target itself: for each
//! source table, the commit position of the last transaction of it applied
//! in full, written in the same target transaction as that transaction's
//! rows (the table `datum_applied`, keyed by the stream, `SYSTEMID/SLOT`,
//! and the source table's OID).
//!
//! After a crash the pipeline delivers again the tail after its
//! checkpoint. Most of it the target reflects already, and applying it
//! again is harmless for whole rows, but not for an update that moved a
//! row to a new key and left a TOASTed value out: replayed after a later
//! transaction put a new row at the old key, it would move that new row's
//! value (`sink_postgres::a_replayed_key_change_does_not_move_a_later_row_s_toast_value`).
//! So a batch is skipped when every table it touches has a transaction at
//! or after its own recorded.
//!
//! Why per table: a table's batches reach the sink in commit order, but
//! with `snapshot.order = "table"` the batches of other tables may pass a
//! copy's rows (`docs/snapshots.md`), so positions are ordered within a
//! table only. Why whole transactions: a large transaction comes in chunks
//! whose bounds depend on the batch limits, which may change between runs,
//! while a checkpoint only ever falls between transactions; a transaction
//! applied in part is applied again from its first chunk, as before.
//!
//! What is not in the stream's order is neither left out nor recorded: a
//! dead letter replayed (`Sink::write_outside`). A run on a slot created
//! for it (new, or recreated) starts the record of its stream afresh: a
//! source restored from a backup keeps its system identifier but not its
//! positions. A failure to read or write the record is never the batch's
//! (which `on_error` could skip): the write is tried again, the error
//! saying what to grant. A sink's user who may not keep the record at all
//! writes without it, with a warning, unless `track_applied = true`.

use std::collections::{BTreeMap, HashMap};

use tokio_postgres::Client;

use super::{Failure, PgText};
use std::sync::Arc;

use datum_guest::Txn;

use crate::event::{Lsn, Relation};
use crate::sink::SinkError;
use crate::transform::Transformed;

/// The table's name, in the sink's `schema` or else `public`.
pub(super) const APPLIED_TABLE: &str = "datum_applied";

/// Its columns, after `CREATE TABLE name`.
const COLUMNS: &str = "(stream text NOT NULL, table_oid oid NOT NULL, \
                       source_table text NOT NULL, commit_lsn pg_lsn NOT NULL, \
                       applied_at timestamptz NOT NULL DEFAULT now(), \
                       PRIMARY KEY (stream, table_oid))";

/// Transactions applied in part kept in memory at most: one whose last
/// chunk never came (a module failed on it, it went to the dead letters)
/// would otherwise stay. One forgotten is recorded, when its last chunk
/// comes, for the tables of that chunk only: a replay then applies its
/// earlier chunks again, as without a record.
const OPEN_KEPT: usize = 256;

/// What this run knows of what the target has applied.
#[derive(Debug)]
pub(super) struct Applied {
    /// The stream's key, `SYSTEMID/SLOT`.
    pub stream: String,
    /// Each source table's last transaction applied in full (its commit
    /// LSN), by OID: read from the target on the live connection, `None`
    /// until then.
    done: Option<HashMap<u32, u64>>,
    /// The stream's slot was created for this run: its earlier record is
    /// cleared when first read.
    fresh: bool,
    /// Transactions some chunks of which were applied, by commit LSN: the
    /// tables those chunks touched.
    open: HashMap<u64, BTreeMap<u32, String>>,
}

/// What one write records, planned with its statements and kept once it
/// committed.
#[derive(Debug, Default)]
pub(super) struct Recorded {
    /// Tables whose transaction ends in this write: name and commit LSN.
    pub completed: BTreeMap<u32, (String, u64)>,
    /// Transactions still open after this write (their tables so far), or
    /// `None` for those this write completed.
    open: HashMap<u64, Option<BTreeMap<u32, String>>>,
}

impl Applied {
    pub(super) fn new(stream: &str, fresh: bool) -> Applied {
        Applied {
            stream: stream.to_owned(),
            done: None,
            fresh,
            open: HashMap::new(),
        }
    }

    /// Whether the record was read on the live connection.
    pub(super) fn loaded(&self) -> bool {
        self.done.is_some()
    }

    /// Reads the record again before the next write (a new connection, a
    /// failed write, another host that may have written since).
    pub(super) fn forget(&mut self) {
        self.done = None;
    }

    /// Whether writing `batches` completes a transaction some chunks of
    /// which were applied before.
    pub(super) fn completes(&self, batches: &[Transformed]) -> bool {
        batches.iter().any(|b| {
            let txn = &b.source.txn;
            txn.last && self.open.contains_key(&txn.commit_lsn)
        })
    }

    /// Whether the target has a batch of `txn` touching `tables` already:
    /// it touches tables, and for each of them a transaction at or after
    /// its own was applied in full. A batch without a position (made by
    /// hand: commit LSN 0) never is.
    pub(super) fn has(&self, txn: &Txn, tables: &[&Arc<Relation>]) -> bool {
        let Some(done) = &self.done else {
            return false;
        };
        let at = txn.commit_lsn;
        at != 0
            && !tables.is_empty()
            && tables
                .iter()
                .all(|r| done.get(&r.oid).is_some_and(|last| *last >= at))
    }

    /// What writing `batches` records, each with the tables it touches
    /// (`Batch::relations`), those in `skipped` left out.
    pub(super) fn plan(
        &self,
        batches: &[Transformed],
        touched: &[Vec<&Arc<Relation>>],
        skipped: &[bool],
    ) -> Recorded {
        let mut recorded = Recorded::default();
        let kept = batches
            .iter()
            .zip(touched)
            .zip(skipped)
            .filter(|(_, s)| !**s);
        for ((batch, relations), _) in kept {
            let txn = &batch.source.txn;
            if txn.commit_lsn == 0 {
                continue;
            }
            let mut tables = match recorded.open.remove(&txn.commit_lsn) {
                Some(open) => open.unwrap_or_default(),
                None => self.open.get(&txn.commit_lsn).cloned().unwrap_or_default(),
            };
            for relation in relations {
                tables
                    .entry(relation.oid)
                    .or_insert_with(|| format!("{}.{}", relation.schema, relation.table));
            }
            if txn.last {
                for (oid, name) in tables {
                    let entry = recorded.completed.entry(oid).or_insert((name, 0));
                    entry.1 = entry.1.max(txn.commit_lsn);
                }
                recorded.open.insert(txn.commit_lsn, None);
            } else {
                recorded.open.insert(txn.commit_lsn, Some(tables));
            }
        }
        recorded
    }

    /// Keeps what a committed write recorded.
    pub(super) fn committed(&mut self, recorded: Recorded) {
        if let Some(done) = &mut self.done {
            for (oid, (_, at)) in &recorded.completed {
                let last = done.entry(*oid).or_default();
                *last = (*last).max(*at);
            }
        }
        for (at, open) in recorded.open {
            match open {
                Some(tables) => self.open.insert(at, tables),
                None => self.open.remove(&at),
            };
        }
        while self.open.len() > OPEN_KEPT {
            let Some(oldest) = self.open.keys().min().copied() else {
                break;
            };
            self.open.remove(&oldest);
        }
    }
}

/// The statement that records one table's transaction; its parameters
/// are [`record_params`].
pub(super) fn record_sql(table: &str) -> String {
    format!(
        "INSERT INTO {table} AS a (stream, table_oid, source_table, commit_lsn) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (stream, table_oid) DO UPDATE SET \
         source_table = EXCLUDED.source_table, commit_lsn = EXCLUDED.commit_lsn, \
         applied_at = now() WHERE a.commit_lsn < EXCLUDED.commit_lsn"
    )
}

/// The parameters of [`record_sql`].
pub(super) fn record_params(stream: &str, oid: u32, name: &str, at: u64) -> Vec<PgText> {
    vec![
        PgText(Some(stream.to_owned())),
        PgText(Some(oid.to_string())),
        PgText(Some(name.to_owned())),
        PgText(Some(Lsn(at).to_string())),
    ]
}

/// What to grant or create when the record cannot be read or written.
fn hint(table: &str) -> String {
    format!(
        "the postgres sink records what it applied in {table}: let the sink's user create \
         it, or create it with CREATE TABLE {table} {COLUMNS} and GRANT SELECT, INSERT, \
         UPDATE on it to the sink's user; or set track_applied = false in the sink \
         (docs/config.md)"
    )
}

/// A failed read or write of the record: never a refusal of the batch
/// (which `on_error` could skip, acknowledging it unwritten), but a wait
/// until a person grants what is missing.
pub(super) fn record_failure(err: tokio_postgres::Error, table: &str) -> Failure {
    let mut failed = super::failure(err, "recording what the target applied", None);
    if let SinkError::Refused(message) = &failed.error {
        failed.error = SinkError::transient(format!("{message}; {}", hint(table)));
    }
    failed
}

/// Why the record cannot be read.
pub(super) enum Unusable {
    /// The sink's user may not create or use the table: what to grant.
    Denied(String),
    /// Anything else.
    Failed(Failure),
}

impl From<SinkError> for Unusable {
    fn from(error: SinkError) -> Unusable {
        Unusable::Failed(Failure::from(error))
    }
}

/// Reads `applied`'s record from `table` (cleared first when its slot is
/// new), creating the table when it is missing.
pub(super) async fn read(
    client: &Client,
    table: &str,
    applied: &mut Applied,
) -> Result<(), Unusable> {
    let denied = || {
        Unusable::Denied(format!(
            "the sink's user may not use {table}; {}",
            hint(table)
        ))
    };
    let failed = |e: tokio_postgres::Error| {
        if e.as_db_error().map(|d| d.code().code()) == Some("42501") {
            denied()
        } else {
            Unusable::Failed(record_failure(e, table))
        }
    };
    super::create_own_table(client, table, COLUMNS, failed).await?;
    let may: bool = client
        .query_one(
            "SELECT has_table_privilege($1::text, 'SELECT') \
                AND has_table_privilege($1::text, 'INSERT') \
                AND has_table_privilege($1::text, 'UPDATE')",
            &[&table],
        )
        .await
        .and_then(|row| row.try_get(0))
        .map_err(failed)?;
    if !may {
        return Err(denied());
    }
    if applied.fresh {
        // Cleared to 0/0 rather than deleted: the grants a record needs
        // anyway suffice.
        client
            .execute(
                &format!(
                    "UPDATE {table} SET commit_lsn = '0/0', applied_at = now() \
                     WHERE stream = $1"
                ),
                &[&applied.stream],
            )
            .await
            .map_err(failed)?;
        applied.fresh = false;
    }
    let rows = client
        .query(
            &format!(
                "SELECT table_oid, (commit_lsn - '0/0'::pg_lsn)::text FROM {table} \
                 WHERE stream = $1"
            ),
            &[&applied.stream],
        )
        .await
        .map_err(failed)?;
    let mut done = HashMap::new();
    for row in rows {
        let oid: u32 = row.try_get(0).map_err(failed)?;
        let at: &str = row.try_get(1).map_err(failed)?;
        let at = at.parse::<u64>().map_err(|_| {
            Unusable::from(SinkError::transient(format!(
                "{table} holds the position {at:?} for table OID {oid}, which is not one \
                 Datum wrote: delete that row (the tail after the checkpoint is then applied \
                 again, as without a record)"
            )))
        })?;
        done.insert(oid, at);
    }
    applied.done = Some(done);
    Ok(())
}
