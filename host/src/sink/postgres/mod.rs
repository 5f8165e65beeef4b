//! The `postgres` sink: changes applied to tables of a target database, one
//! transaction per batch or per group of batches written together,
//! idempotently.
//!
//! Owns turning each change into statements on the target: inserts, updates
//! and snapshot rows as upserts on the key (`INSERT ... ON CONFLICT (key) DO
//! UPDATE`), deletes by key, truncates; which target table a change goes to
//! (a module's `route`, else the `tables` mapping, else the `schema` override
//! with the source's table name, else the same `schema.table`); and telling
//! a passing failure (the connection, a serialization failure) from one that
//! needs a person (a missing table, a constraint); and what a `schema`
//! change does to the target (`schema_changes`: by default a change the
//! target does not reflect yet is an error naming the statement to run;
//! `apply` adds columns and widens types in the write's transaction). It
//! does not create tables, and it does not retry: the pipeline does.
//!
//! Replaying the un-checkpointed tail after a crash: what the target
//! applied before is left out, by a record of each source table's last
//! transaction applied, written in the same target transactions
//! ([`applied`], `track_applied`). Without that record, idempotence does
//! most of it: an upsert writes the whole row whatever the target holds; a
//! delete of an absent row does nothing; an update whose key changed
//! deletes the old key first. An update that left a TOASTed value out
//! (`Value::Unchanged`) cannot be written as a whole row, so it becomes an
//! `UPDATE` of the columns it has, which does nothing when the row is
//! absent: the row is then absent because a later change (replayed too)
//! deleted or moved it, and inventing it with a NULL would be wrong. But
//! when it also moved the row to a new key and a later transaction put a
//! new row at the old key, it moves that row instead: only the record
//! avoids that.
//!
//! Values travel as text-format parameters, each in PostgreSQL's text form;
//! the server infers every parameter's type from the target column, so any
//! type the target can read from text works (numeric, timestamps, json,
//! bytea, arrays, uuid, interval, enums, domains, extension types).
//! Statements are prepared once per connection and SQL text. A write's
//! statements (a batch's, or a group's in the order of its batches) are
//! planned first, then sent pipelined (up to `PIPELINE` before the first
//! answer is awaited, in order, in the write's one transaction), so a
//! batch of many rows costs the server's work, not a round trip per row,
//! and a group of small batches one commit.

mod applied;
mod schema;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::error::Error as _;
use std::fmt;

use datum_guest::wire::{Change, Column, Op, Row, Value};
use tokio_postgres::types::{Format, IsNull, ToSql, Type, to_sql_checked};
use tokio_postgres::{Client, Statement, Transaction};

use super::{Sink, SinkError};
use crate::config::SchemaChanges;
use crate::event::json::JsonValue;
use crate::pg::ConnInfo;
use crate::pg::quote_ident;
use crate::transform::Transformed;
use crate::transform::encode::ChangeRef;
use schema::TargetColumn;

/// See the module documentation.
pub struct PostgresSink {
    info: ConnInfo,
    routes: Routes,
    client: Option<Client>,
    /// Prepared statements of the live connection, by SQL text.
    statements: HashMap<String, Statement>,
    /// The primary key of target tables whose changes flag every column as
    /// key (empty: none), by target, until a write fails.
    primary_keys: HashMap<Target, Vec<String>>,
    /// What a `schema` change does.
    schema_changes: SchemaChanges,
    /// This host's claim on the target, under the leader lock.
    fence: Option<Fence>,
    /// The fence check, prepared on the live connection.
    fence_check: Option<Statement>,
    /// Whether to record what was applied (`track_applied`): always
    /// (`Some(true)`, writes wait while the record cannot be used), never,
    /// or when the sink's user may (`None`).
    track_applied: Option<bool>,
    /// What was applied, once the pipeline named its stream.
    applied: Option<applied::Applied>,
}

/// This host's claim on the target while it leads the pipeline
/// (`docs/scaling.md`): a row of the fence table, keyed by the pipeline's
/// holder key (the source's system identifier and the slot's name),
/// whose term each host that takes the leader lock raises before it reads
/// the slot. Every write's transaction first reads that row `FOR SHARE`
/// and goes on only if the term is still this host's; a host that takes
/// over waits, raising the term, for the writes that read it before, and
/// refuses every later write of the host it overtook.
#[derive(Debug)]
struct Fence {
    /// The fence table, quoted.
    table: String,
    /// The row's key, the same on every host: `SYSTEMID/SLOT`.
    holder: String,
    /// The term this host took.
    term: i64,
    /// A write found a newer term: another host took over.
    overtaken: bool,
}

/// The fence table's name, in the sink's `schema` or else `public`.
const FENCE_TABLE: &str = "datum_fence";

/// Its columns, after `CREATE TABLE name`.
const FENCE_COLUMNS: &str =
    "(holder text PRIMARY KEY, term bigint NOT NULL, taken_at timestamptz NOT NULL DEFAULT now())";

/// How long raising the term may wait for the writes of the host that led
/// before (each holds the fence row until its transaction ends) before
/// the attempt fails, to be tried again.
const TAKE_OVER_WAIT: &str = "10s";

/// How long a fenced session may sit in an open transaction. A host frozen
/// in the middle of a write (a hung process, a paused virtual machine)
/// holds the fence row, and with it the next leader's claim, until the
/// server ends that session.
const IDLE_IN_TRANSACTION: &str = "10s";

impl fmt::Debug for PostgresSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the connection string: it may hold a password.
        f.debug_struct("PostgresSink")
            .field("target", &target_name(&self.info))
            .field("schema", &self.routes.schema)
            .field("tables", &self.routes.tables)
            .field("connected", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

fn target_name(info: &ConnInfo) -> String {
    format!("{} as {}", info.dbname, info.user)
}

impl PostgresSink {
    /// Connects to the target database at `url` (a URL or a `key=value`
    /// connection string). `schema` overrides the target schema of every
    /// table; `tables` maps a source `schema.table` to a target
    /// `schema.table` (or a bare table name, in the `schema` override or the
    /// source's schema).
    pub async fn connect(
        url: &str,
        schema: Option<String>,
        tables: BTreeMap<String, String>,
    ) -> Result<PostgresSink, SinkError> {
        let info: ConnInfo = url.parse().map_err(|e| {
            SinkError::definite(format!("the postgres sink's url does not parse: {e}"))
        })?;
        let mut sink = PostgresSink {
            info,
            routes: Routes { schema, tables },
            client: None,
            statements: HashMap::new(),
            primary_keys: HashMap::new(),
            schema_changes: SchemaChanges::default(),
            fence: None,
            fence_check: None,
            track_applied: Some(false),
            applied: None,
        };
        sink.reconnect().await?;
        Ok(sink)
    }

    /// Sets what a `schema` change does to the target (default: `fail`).
    pub fn with_schema_changes(mut self, policy: SchemaChanges) -> PostgresSink {
        self.schema_changes = policy;
        self
    }

    /// Records what is applied in the target and skips what it has when a
    /// stream is followed ([`Sink::follow`]): `Some(true)` always (writes
    /// wait while the sink's user may not use the record), `None` when the
    /// sink's user may (a warning says what to grant otherwise). Default:
    /// `Some(false)`, never.
    pub fn tracking_applied(mut self, track: Option<bool>) -> PostgresSink {
        self.track_applied = track;
        self
    }

    /// Leaves the target session, with what was kept for it: its prepared
    /// statements, and the keys looked up (a person may fix the target
    /// before the next one).
    fn leave_session(&mut self) -> Option<Client> {
        self.statements.clear();
        self.primary_keys.clear();
        self.fence_check = None;
        if let Some(applied) = &mut self.applied {
            applied.forget();
        }
        self.client.take()
    }

    async fn reconnect(&mut self) -> Result<(), SinkError> {
        self.leave_session();
        let client = crate::pg::connect(&self.info).await.map_err(|e| {
            let message = format!(
                "connecting to the target database {}: {e}; check that the server is up and \
                 that the sink's url (host, port, user, password, database) is right",
                target_name(&self.info)
            );
            if e.is_transient() {
                SinkError::transient(message)
            } else {
                SinkError::definite(message)
            }
        })?;
        if self.fence.is_some() {
            bound_transactions(&client).await?;
        }
        self.client = Some(client);
        Ok(())
    }

    /// The fence table, quoted.
    fn fence_table(&self) -> String {
        self.own_table(FENCE_TABLE)
    }

    /// A table of Datum's own in the target, quoted: in the sink's
    /// `schema`, else in `public`.
    fn own_table(&self, table: &str) -> String {
        Target {
            schema: self
                .routes
                .schema
                .clone()
                .unwrap_or_else(|| "public".to_owned()),
            table: table.to_owned(),
        }
        .sql()
    }

    /// Raises the fence row's term of `holder`, creating the table when it
    /// is missing; see [`Fence`].
    async fn claim(&mut self, holder: &str) -> Result<i64, SinkError> {
        let table = self.fence_table();
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| SinkError::transient("not connected to the target database"))?;
        bound_transactions(client).await?;
        let claim_failed = |e: tokio_postgres::Error| {
            let mut err = failure(e, "raising the leader's term in the fence table", None).error;
            if let SinkError::Refused(message) = &mut err {
                message.push_str(&format!(
                    "; a pipeline with source.leader_lock writes through a fence table: \
                     create it, or let the sink's user create it, with CREATE TABLE {table} \
                     {FENCE_COLUMNS} and GRANT SELECT, INSERT, UPDATE on it to the sink's user"
                ));
            }
            err
        };
        create_own_table(client, &table, FENCE_COLUMNS, claim_failed).await?;
        let tx = client.transaction().await.map_err(claim_failed)?;
        tx.batch_execute(&format!("SET LOCAL lock_timeout = '{TAKE_OVER_WAIT}'"))
            .await
            .map_err(claim_failed)?;
        let term: i64 = tx
            .query_one(
                &format!(
                    "INSERT INTO {table} AS f (holder, term) VALUES ($1, 1) \
                     ON CONFLICT (holder) DO UPDATE SET term = f.term + 1, taken_at = now() \
                     RETURNING term"
                ),
                &[&holder],
            )
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| {
                if e.as_db_error().map(|d| d.code().code()) == Some("55P03") {
                    SinkError::transient(format!(
                        "the host that led before still has a write open on the target \
                         (it holds {table}'s row {holder}); waiting for it to end"
                    ))
                } else {
                    claim_failed(e)
                }
            })?;
        tx.commit().await.map_err(claim_failed)?;
        Ok(term)
    }

    /// Applies `batches` in one target transaction, in order: those the
    /// target has already left out, and what it applies recorded
    /// ([`applied`]).
    async fn apply(&mut self, batches: &[Transformed]) -> Result<(), Failure> {
        let record_table = self.own_table(applied::APPLIED_TABLE);
        if let Some(applied) = self.applied.as_mut().filter(|a| !a.loaded()) {
            let client = self.client.as_ref().ok_or_else(not_connected)?;
            match applied::read(client, &record_table, applied).await {
                Ok(()) => {}
                Err(applied::Unusable::Denied(why)) if self.track_applied.is_none() => {
                    tracing::warn!(target = %target_name(&self.info), "{why}: writing without a record of what was applied, so a replay after a crash relies on the writes being idempotent, which an update that moves a row's key and leaves a TOASTed value out is not; grant it, or set track_applied = false to write without the record and without this warning");
                    self.applied = None;
                }
                Err(applied::Unusable::Denied(why)) => {
                    return Err(Failure::from(SinkError::transient(format!(
                        "{why} (track_applied = true)"
                    ))));
                }
                Err(applied::Unusable::Failed(failed)) => return Err(failed),
            }
        }
        // The tables each batch touches, walked once: only with a record.
        let touched: Vec<Vec<&std::sync::Arc<crate::event::Relation>>> = batches
            .iter()
            .map(|b| match &self.applied {
                Some(_) => b.source.relations(),
                None => Vec::new(),
            })
            .collect();
        let skipped: Vec<bool> = batches
            .iter()
            .zip(&touched)
            .map(|(b, tables)| {
                self.applied
                    .as_ref()
                    .is_some_and(|a| a.has(&b.source.txn, tables))
            })
            .collect();
        if skipped.iter().any(|s| *s) {
            tracing::debug!(
                target = %target_name(&self.info),
                skipped = skipped.iter().filter(|s| **s).count(),
                "left out batches the target applied before (a replay after a restart)"
            );
        }
        let mut plan = Vec::new();
        // What the target tables looked like, read once per transaction
        // and then kept as the planned DDL leaves them.
        let mut targets: HashMap<Target, Option<Vec<TargetColumn>>> = HashMap::new();
        let kept = batches.iter().zip(&skipped).filter(|(_, s)| !**s);
        for change in kept.flat_map(|(b, _)| b.changes()) {
            let change = change.to_wire();
            if change.op == Op::Schema {
                self.plan_schema(&change, &mut targets, &mut plan).await?;
            } else {
                let primary = self.primary_key_for(&change).await?;
                plan_change(&self.routes, &change, primary.as_deref(), &mut plan)?;
            }
        }
        let mut plan = coalesce(plan);
        let recorded = self
            .applied
            .as_ref()
            .map(|a| a.plan(batches, &touched, &skipped));
        if let (Some(applied), Some(recorded)) = (&self.applied, &recorded) {
            for (oid, (name, at)) in &recorded.completed {
                plan.push(Planned {
                    sql: applied::record_sql(&record_table),
                    params: applied::record_params(&applied.stream, *oid, name, *at),
                    target: None,
                    simple: false,
                    ddl: false,
                    upsert: None,
                    record: Some(record_table.clone()),
                });
            }
        }
        let client = self.client.as_mut().ok_or_else(not_connected)?;
        let tx = client
            .transaction()
            .await
            .map_err(|e| failure(e, "starting a transaction", None))?;
        // The fence check goes first in the transaction, and its answer
        // is read beside the batch's statements rather than before them:
        // no round trip of its own. Nothing is committed before it said
        // this host still leads.
        let check = match &self.fence {
            Some(fence) => {
                let statement = match &self.fence_check {
                    Some(check) => check.clone(),
                    None => {
                        let check = tx
                            .prepare(&format!(
                                "SELECT term FROM {} WHERE holder = $1 FOR SHARE",
                                fence.table
                            ))
                            .await
                            .map_err(fence_failure)?;
                        self.fence_check = Some(check.clone());
                        check
                    }
                };
                Some((statement, &fence.holder))
            }
            None => None,
        };
        let checked = async {
            let (statement, holder) = check.as_ref()?;
            let params: [&(dyn ToSql + Sync); 1] = [holder];
            Some(
                tx.query_opt(statement, &params)
                    .await
                    .and_then(|row| row.map(|row| row.try_get::<_, i64>(0)).transpose()),
            )
        };
        let statements = &mut self.statements;
        let applied = async {
            let mut rest = plan.as_slice();
            while let Some(first) = rest.first() {
                if first.simple {
                    tx.batch_execute(&first.sql)
                        .await
                        .map_err(|e| failure(e, first.doing(), first.target.as_ref()))?;
                    if first.ddl {
                        // Statements prepared before know the old columns'
                        // types: prepare again after a table changed.
                        statements.clear();
                    }
                    rest = &rest[1..];
                    continue;
                }
                let run = rest.iter().take(PIPELINE).take_while(|p| !p.simple).count();
                if statements.len() + run > MAX_STATEMENTS {
                    // Each is kept by the target's session: forget them all
                    // (dropping one closes it on the server) rather than
                    // keep one per statement text ever sent.
                    statements.clear();
                }
                // Prepared here, not before the batch: a statement may name a
                // column that DDL earlier in this transaction added.
                for planned in &rest[..run] {
                    if !statements.contains_key(&planned.sql) {
                        let statement = tx.prepare(&planned.sql).await.map_err(|e| {
                            failure(e, "preparing a statement", planned.target.as_ref())
                        })?;
                        statements.insert(planned.sql.clone(), statement);
                    }
                }
                pipeline(&tx, statements, &rest[..run]).await?;
                rest = &rest[run..];
            }
            Ok::<(), Failure>(())
        };
        // Polled together, the check first: it is sent first, and neither
        // answer waits unread behind the other's.
        let (checked, applied) = both(checked, applied).await;
        if let (Some(checked), Some(fence)) = (checked, &mut self.fence) {
            // The check's answer comes before the statements': after a
            // failed check they only say that the transaction was aborted.
            let term = checked.map_err(fence_failure)?;
            if term != Some(fence.term) {
                fence.overtaken = true;
                let now = term.map_or_else(|| "none".to_owned(), |t| t.to_string());
                return Err(Failure::from(SinkError::Fenced(format!(
                    "another host took over the target {}: the leader's term in {} is {now}, \
                     this host's {}; this host writes no more and stands by",
                    target_name(&self.info),
                    fence.table,
                    fence.term
                ))));
            }
        }
        applied?;
        tx.commit()
            .await
            .map_err(|e| failure(e, "committing", None))?;
        if let (Some(applied), Some(recorded)) = (&mut self.applied, recorded) {
            applied.committed(recorded);
        }
        Ok(())
    }
}

impl PostgresSink {
    /// The key to apply `change` by when it is not the key its columns
    /// flag: a change that flags every column (`REPLICA IDENTITY FULL` on
    /// the source) would need a unique index over every column of the
    /// target (and `=` on each, which `json` has not), so it is applied by
    /// the target table's primary key, when the target has one and the
    /// change carries its columns. Looked up once per table and connection.
    async fn primary_key_for(&mut self, change: &Change) -> Result<Option<Vec<String>>, Failure> {
        let every_column_key = matches!(
            change.op,
            Op::Insert | Op::Update | Op::Snapshot | Op::Delete
        ) && !change.columns.is_empty()
            && change.columns.iter().all(|c| c.key);
        if !every_column_key {
            return Ok(None);
        }
        let target = self
            .routes
            .target(&change.schema, &change.table, change.route.as_deref());
        if !self.primary_keys.contains_key(&target) {
            let client = self.client.as_ref().ok_or_else(|| Failure {
                error: SinkError::transient("not connected to the target database"),
                lost: true,
            })?;
            let rows = client
                .query(
                    "SELECT a.attname::text FROM pg_index i \
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
                     WHERE i.indrelid = to_regclass($1::text) AND i.indisprimary \
                     ORDER BY array_position(i.indkey::int2[], a.attnum)",
                    &[&target.sql()],
                )
                .await
                .map_err(|e| failure(e, "reading the primary key", Some(&target)))?;
            let mut names = Vec::with_capacity(rows.len());
            for row in &rows {
                names.push(schema::column::<String>(row, 0, &target)?);
            }
            // Empty: the table is missing or has no primary key; the
            // write then fails, which clears this.
            self.primary_keys.insert(target.clone(), names);
        }
        let primary = self
            .primary_keys
            .get(&target)
            .map(Vec::as_slice)
            .filter(|names| !names.is_empty());
        Ok(primary
            .filter(|names| {
                names
                    .iter()
                    .all(|n| change.columns.iter().any(|c| c.name == *n))
            })
            .map(<[String]>::to_vec))
    }
}

/// Runs `first` and `second` to completion on this task, polling `first`
/// first each time; both results.
async fn both<A: Future, B: Future>(first: A, second: B) -> (A::Output, B::Output) {
    let (mut first, mut second) = (std::pin::pin!(first), std::pin::pin!(second));
    let (mut a, mut b) = (None, None);
    std::future::poll_fn(|cx| {
        if a.is_none()
            && let std::task::Poll::Ready(out) = first.as_mut().poll(cx)
        {
            a = Some(out);
        }
        if b.is_none()
            && let std::task::Poll::Ready(out) = second.as_mut().poll(cx)
        {
            b = Some(out);
        }
        match (a.take(), b.take()) {
            (Some(a), Some(b)) => std::task::Poll::Ready((a, b)),
            (left, right) => {
                (a, b) = (left, right);
                std::task::Poll::Pending
            }
        }
    })
    .await
}

/// Statements sent before the first answer is awaited: one round trip per
/// this many rows instead of one per row.
const PIPELINE: usize = 64;

/// Prepared statements kept per connection at most; more are prepared
/// afresh. A table's changes take a handful (an insert, update and delete
/// per column set, and the multi-row upserts of `flush`).
const MAX_STATEMENTS: usize = 512;

/// Sends `run` (prepared statements) one after the other without waiting
/// for answers in between, and reports the first that failed. Order is
/// kept: each is sent when first polled, and they are first polled in
/// order; the server runs them in the order received, and after a failure
/// the rest fail as part of the aborted transaction.
async fn pipeline(
    tx: &Transaction<'_>,
    statements: &HashMap<String, Statement>,
    run: &[Planned],
) -> Result<(), Failure> {
    let mut sends = Vec::with_capacity(run.len());
    for planned in run {
        let statement = statements.get(&planned.sql).ok_or_else(|| {
            Failure::from(SinkError::transient(
                "a statement was not prepared before it was sent",
            ))
        })?;
        sends.push(Box::pin(async move {
            let params: Vec<&(dyn ToSql + Sync)> = planned
                .params
                .iter()
                .map(|p| p as &(dyn ToSql + Sync))
                .collect();
            tx.execute(statement, &params).await
        }));
    }
    let mut done: Vec<Option<Result<u64, tokio_postgres::Error>>> =
        sends.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (send, slot) in sends.iter_mut().zip(done.iter_mut()) {
            if slot.is_none() {
                match send.as_mut().poll(cx) {
                    std::task::Poll::Ready(result) => *slot = Some(result),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    for (result, planned) in done.into_iter().zip(run) {
        if let Some(Err(e)) = result {
            if let Some(table) = &planned.record {
                return Err(applied::record_failure(e, table));
            }
            return Err(failure(e, "writing", planned.target.as_ref()));
        }
    }
    Ok(())
}

impl Sink for PostgresSink {
    async fn write(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        self.write_group(std::slice::from_ref(batch)).await
    }

    /// The batches of a group in one target transaction: a stream of
    /// small source transactions costs the target a commit (and the host
    /// the round trips of one) per group, not per transaction. A group
    /// that fails is written again batch by batch (`Sink::write_group`).
    async fn write_group(&mut self, batches: &[Transformed]) -> Result<(), SinkError> {
        let applies = batches
            .iter()
            .flat_map(Transformed::changes)
            .any(|c| match c {
                ChangeRef::Source(change) => {
                    !matches!(change, crate::event::Change::Message { .. })
                }
                ChangeRef::Wire(change) => change.op != Op::Message,
            });
        // A transaction's last chunk with nothing to apply still records
        // the tables of the chunks before it.
        let completes = self.applied.as_ref().is_some_and(|a| a.completes(batches));
        if !applies && !completes {
            return Ok(());
        }
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.reconnect().await?;
        }
        match self.apply(batches).await {
            Ok(()) => Ok(()),
            Err(Failure { error, lost }) => {
                if lost || self.client.as_ref().is_none_or(Client::is_closed) {
                    // The next write connects afresh.
                    self.leave_session();
                }
                // A person may fix the target (add a primary key) before
                // the batch comes again: look the keys up afresh, prepare
                // the fence check again, and read what it applied again.
                self.primary_keys.clear();
                self.fence_check = None;
                if let Some(applied) = &mut self.applied {
                    applied.forget();
                }
                Err(error)
            }
        }
    }

    async fn take_over(&mut self, holder: &str) -> Result<(), SinkError> {
        if self.client.as_ref().is_none_or(Client::is_closed) {
            self.reconnect().await?;
        }
        let claimed = self.claim(holder).await;
        let term = match claimed {
            Ok(term) => term,
            Err(err) => {
                if self.client.as_ref().is_none_or(Client::is_closed) {
                    self.leave_session();
                }
                return Err(err);
            }
        };
        tracing::info!(target = %target_name(&self.info), holder = %holder, term, "claimed the target: writes of hosts that led before are refused");
        // Hosts that led before may have applied more since this one read.
        if let Some(applied) = &mut self.applied {
            applied.forget();
        }
        self.fence = Some(Fence {
            table: self.fence_table(),
            holder: holder.to_owned(),
            term,
            overtaken: false,
        });
        Ok(())
    }

    fn overtaken(&self) -> bool {
        self.fence.as_ref().is_some_and(|f| f.overtaken)
    }

    fn follow(&mut self, stream: Option<&str>, fresh: bool) {
        self.applied = stream
            .filter(|_| self.track_applied != Some(false))
            .map(|stream| applied::Applied::new(stream, fresh));
    }

    /// Neither left out nor recorded: see [`Sink::write_outside`].
    async fn write_outside(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        let applied = self.applied.take();
        let written = self.write_group(std::slice::from_ref(batch)).await;
        self.applied = applied;
        if written.is_err()
            && let Some(applied) = &mut self.applied
        {
            applied.forget();
        }
        written
    }

    /// Cancels the statement the given-up write left running on the target
    /// (its transaction then rolls back), and leaves that session: the
    /// next write connects afresh.
    async fn abandon(&mut self) {
        let Some(client) = self.leave_session() else {
            return;
        };
        if !client.is_closed() {
            crate::pg::cancel(&self.info, &client, CANCEL_WITHIN).await;
        }
    }
}

/// Ends the session's transactions that sit idle for longer than
/// `IDLE_IN_TRANSACTION` (see there).
async fn bound_transactions(client: &Client) -> Result<(), SinkError> {
    client
        .batch_execute(&format!(
            "SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'"
        ))
        .await
        .map_err(|e| {
            failure(
                e,
                "setting the session's idle_in_transaction_session_timeout",
                None,
            )
            .error
        })
}

/// How long asking the target to cancel a given-up write may take (the
/// drain deadline has passed: the host is on its way out).
const CANCEL_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// A failed batch, and whether the connection is gone with it.
struct Failure {
    error: SinkError,
    lost: bool,
}

/// Creates a table of Datum's own (`table`, quoted; `columns`, its
/// definition) when it is missing. `failed` says what a failure means.
async fn create_own_table<E: From<SinkError>>(
    client: &Client,
    table: &str,
    columns: &str,
    failed: impl Fn(tokio_postgres::Error) -> E,
) -> Result<(), E> {
    let exists: bool = client
        .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&table])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(&failed)?;
    if exists {
        return Ok(());
    }
    client
        .batch_execute(&format!("CREATE TABLE IF NOT EXISTS {table} {columns}"))
        .await
        .map_err(|e| {
            // Two sessions creating it at once: one of them wins.
            let code = e.as_db_error().map(|d| d.code().code());
            if matches!(code, Some("23505" | "42P07")) {
                E::from(SinkError::transient(format!(
                    "another session created {table} at the same moment; trying again"
                )))
            } else {
                failed(e)
            }
        })
}

/// A write without a connection.
fn not_connected() -> Failure {
    Failure {
        error: SinkError::transient("not connected to the target database"),
        lost: true,
    }
}

impl From<SinkError> for Failure {
    fn from(error: SinkError) -> Failure {
        Failure { error, lost: false }
    }
}

/// A failed fence check: never a refusal of the batch (which `on_error`
/// could skip, acknowledging it unwritten), but a wait until the fence can
/// be read again (a person restores the table or the grant).
fn fence_failure(err: tokio_postgres::Error) -> Failure {
    let mut failed = failure(err, "checking the fence table", None);
    if let SinkError::Refused(message) = &failed.error {
        failed.error = SinkError::transient(format!(
            "{message}; a pipeline with source.leader_lock writes only once the fence table \
             says this host leads: restore the table or the sink's SELECT and UPDATE on it"
        ));
    }
    failed
}

/// Classifies a target error. `table` names the target table the statement
/// was for, to say what to fix.
fn failure(err: tokio_postgres::Error, what: &str, table: Option<&Target>) -> Failure {
    let on = table.map(|t| format!(" on {t}")).unwrap_or_default();
    let Some(db) = err.as_db_error() else {
        let cause = err.source().map(|s| format!(": {s}")).unwrap_or_default();
        return Failure {
            error: SinkError::transient(format!(
                "{what}{on}: the connection to the target database failed: {err}{cause}"
            )),
            lost: true,
        };
    };
    let code = db.code().code();
    let mut server = db.message().to_owned();
    if let Some(detail) = db.detail() {
        server.push_str(&format!(" ({detail})"));
    }
    let class = crate::pg::sqlstate_class(code);
    let transient = matches!(class, "08" | "40" | "53" | "57" | "58") || code == "55P03";
    let message = match (code, table) {
        ("42P01", Some(t)) => format!(
            "target table {t} does not exist: create it in the target database (Datum does \
             not create tables); the server said: {server}"
        ),
        ("42703", Some(t)) => format!(
            "target table {t} lacks a column the change has: add it (Datum does not alter \
             tables); the server said: {server}"
        ),
        ("42P10", Some(t)) => format!(
            "target table {t} has no primary key or unique index on the source's key \
             columns: add one; the server said: {server}"
        ),
        _ => format!("{what}{on}: {server} (SQLSTATE {code})"),
    };
    Failure {
        error: if transient {
            SinkError::transient(message)
        } else {
            SinkError::definite(message)
        },
        lost: matches!(class, "08" | "57"),
    }
}

// ---------------------------------------------------------------------------
// Where a change goes.

#[derive(Debug)]
struct Routes {
    schema: Option<String>,
    tables: BTreeMap<String, String>,
}

/// A target table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Target {
    schema: String,
    table: String,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

impl Target {
    fn sql(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.table))
    }
}

impl Routes {
    /// `schema.table`, or a bare `table` in the override schema or
    /// `default_schema`.
    fn parse(&self, name: &str, default_schema: &str) -> Target {
        match name.split_once('.') {
            Some((schema, table)) => Target {
                schema: schema.to_owned(),
                table: table.to_owned(),
            },
            None => Target {
                schema: self
                    .schema
                    .clone()
                    .unwrap_or_else(|| default_schema.to_owned()),
                table: name.to_owned(),
            },
        }
    }

    fn target(&self, schema: &str, table: &str, route: Option<&str>) -> Target {
        if let Some(route) = route {
            return self.parse(route, schema);
        }
        if let Some(mapped) = self.tables.get(&format!("{schema}.{table}")) {
            return self.parse(mapped, schema);
        }
        Target {
            schema: self.schema.clone().unwrap_or_else(|| schema.to_owned()),
            table: table.to_owned(),
        }
    }
}

// ---------------------------------------------------------------------------
// Statements.

/// Appends the statements that apply `change` to `plan`, by the key its
/// columns flag or by `primary` (`PostgresSink::primary_key_for`).
fn plan_change(
    routes: &Routes,
    change: &Change,
    primary: Option<&[String]>,
    plan: &mut Vec<Planned>,
) -> Result<(), Failure> {
    match change.op {
        Op::Message | Op::Schema => Ok(()),
        Op::Truncate => {
            let Some(truncate) = &change.truncate else {
                return Err(SinkError::definite("a truncate change without its tables").into());
            };
            let mut targets: Vec<Target> = Vec::new();
            for t in &truncate.tables {
                let target = routes.target(&t.schema, &t.table, change.route.as_deref());
                if !targets.contains(&target) {
                    targets.push(target);
                }
            }
            if targets.is_empty() {
                return Ok(());
            }
            let mut sql = format!(
                "TRUNCATE {}",
                targets
                    .iter()
                    .map(Target::sql)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if truncate.restart_identity {
                sql.push_str(" RESTART IDENTITY");
            }
            if truncate.cascade {
                sql.push_str(" CASCADE");
            }
            plan.push(Planned {
                sql,
                params: Vec::new(),
                target: (targets.len() == 1).then(|| targets[0].clone()),
                simple: true,
                ddl: false,
                upsert: None,
                record: None,
            });
            Ok(())
        }
        Op::Insert | Op::Update | Op::Snapshot | Op::Delete => {
            let target = routes.target(&change.schema, &change.table, change.route.as_deref());
            let keys: Vec<&Column> = match primary {
                Some(names) => names
                    .iter()
                    .filter_map(|n| change.columns.iter().find(|c| c.name == *n))
                    .collect(),
                None => change.columns.iter().filter(|c| c.key).collect(),
            };
            if keys.is_empty() {
                return Err(SinkError::definite(format!(
                    "{}.{} has no key columns, so its changes cannot be applied to {target}: \
                     give the source table a primary key or a replica identity \
                     (ALTER TABLE ... REPLICA IDENTITY USING INDEX ...)",
                    change.schema, change.table
                ))
                .into());
            }
            let mut exec = Exec {
                plan,
                target: &target,
            };
            if change.op == Op::Delete {
                let old = row(change, change.old.as_ref(), "old")?;
                return exec.delete(&keys, old);
            }
            let new = row(change, change.new.as_ref(), "new")?;
            let old = change.old.as_ref();
            let key_changed = old.is_some_and(|old| {
                keys.iter().any(|k| {
                    old.get(&k.name)
                        .is_some_and(|v| Some(v) != new.get(&k.name))
                })
            });
            let partial = new.fields().any(|(_, v)| *v == Value::Unchanged);
            match (partial, key_changed, old) {
                (true, true, Some(old)) => exec.update(&keys, Some(old), new),
                (true, _, _) => exec.update(&keys, None, new),
                (false, true, Some(old)) => {
                    exec.delete(&keys, old)?;
                    exec.upsert(&keys, new)
                }
                (false, _, _) => exec.upsert(&keys, new),
            }
        }
    }
}

fn row<'a>(change: &Change, row: Option<&'a Row>, which: &str) -> Result<&'a Row, SinkError> {
    row.ok_or_else(|| {
        SinkError::definite(format!(
            "a {:?} change of {}.{} without its {which} row",
            change.op, change.schema, change.table
        ))
    })
}

/// One statement of a batch, planned before any is sent.
struct Planned {
    sql: String,
    params: Vec<PgText>,
    /// The target table, to say what to fix when it fails.
    target: Option<Target>,
    /// Sent as a simple query on its own (a truncate, DDL), not prepared.
    simple: bool,
    /// DDL: statements prepared before it may be stale.
    ddl: bool,
    /// A one-row upsert's parts, to join it with the next ones.
    upsert: Option<Upsert>,
    /// It records what was applied ([`applied`]) in this table: its
    /// failure is never the batch's.
    record: Option<String>,
}

impl Planned {
    /// What running it is, for an error.
    fn doing(&self) -> &'static str {
        if self.ddl {
            "changing the target table"
        } else {
            "truncating"
        }
    }
}

/// A one-row upsert is `{head}($1, ...){tail}`; `key` are the positions of
/// the key's values among its parameters.
struct Upsert {
    head: String,
    tail: String,
    key: Vec<usize>,
}

/// Rows at most in one upsert statement (fewer when the row has so many
/// columns that the parameters would pass the protocol's 65,535).
const ROWS_PER_UPSERT: usize = 128;

/// Joins runs of one-row upserts of the same SQL into multi-row upserts
/// (`VALUES (...), (...)`): one statement for up to `ROWS_PER_UPSERT`
/// rows. A run is cut before a key it already holds, since one statement
/// may not upsert a row twice; order is kept, since only consecutive
/// statements are joined.
fn coalesce(plan: Vec<Planned>) -> Vec<Planned> {
    let mut out = Vec::with_capacity(plan.len());
    let mut run: Vec<Planned> = Vec::new();
    let mut keys: HashSet<Vec<Option<String>>> = HashSet::new();
    for planned in plan {
        let key = planned.upsert.as_ref().map(|u| {
            u.key
                .iter()
                .map(|i| planned.params.get(*i).and_then(|p| p.0.clone()))
                .collect::<Vec<_>>()
        });
        let joins = run.first().is_some_and(|first| {
            first.sql == planned.sql
                && run.len() < ROWS_PER_UPSERT.min(65_535 / planned.params.len().max(1))
                && key.as_ref().is_some_and(|k| !keys.contains(k))
        });
        if !joins {
            flush(&mut run, &mut out);
            keys.clear();
        }
        match key {
            Some(key) => {
                keys.insert(key);
                run.push(planned);
            }
            None => out.push(planned),
        }
    }
    flush(&mut run, &mut out);
    out
}

/// Appends `run` (one-row upserts of one SQL) to `out` as statements of a
/// power of two rows each (100 rows: 64, 32 and 4), so that a table's
/// upserts take at most eight statement texts, not one per run length:
/// each text is prepared on the target, and kept there.
fn flush(run: &mut Vec<Planned>, out: &mut Vec<Planned>) {
    while run.len() >= 2 {
        let rows = 1 << run.len().ilog2();
        let Some(Planned {
            upsert: Some(Upsert { head, tail, .. }),
            target,
            params,
            ..
        }) = run.first()
        else {
            break;
        };
        let columns = params.len();
        let mut sql = head.clone();
        let tail = tail.clone();
        let target = target.clone();
        let mut params = Vec::with_capacity(rows * columns);
        for (r, planned) in run.drain(..rows).enumerate() {
            sql.push_str(if r == 0 { "(" } else { ", (" });
            for c in 0..columns {
                if c > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!("${}", r * columns + c + 1));
            }
            sql.push(')');
            params.extend(planned.params);
        }
        sql.push_str(&tail);
        out.push(Planned {
            sql,
            params,
            target,
            simple: false,
            ddl: false,
            upsert: None,
            record: None,
        });
    }
    out.append(run);
}

struct Exec<'a> {
    plan: &'a mut Vec<Planned>,
    target: &'a Target,
}

impl Exec<'_> {
    fn run(&mut self, sql: String, params: Vec<PgText>) -> Result<(), Failure> {
        self.plan.push(Planned {
            sql,
            params,
            target: Some(self.target.clone()),
            simple: false,
            ddl: false,
            upsert: None,
            record: None,
        });
        Ok(())
    }

    /// `WHERE k1 = $n AND ...` with the key's values from `row`, numbering
    /// parameters after `params`.
    fn key_filter(
        &self,
        keys: &[&Column],
        row: &Row,
        params: &mut Vec<PgText>,
    ) -> Result<String, SinkError> {
        let mut filter = Vec::with_capacity(keys.len());
        for key in keys {
            let value = row.get(&key.name).ok_or_else(|| {
                SinkError::definite(format!(
                    "a change for {} lacks the value of its key column `{}`",
                    self.target, key.name
                ))
            })?;
            params.push(PgText::of(value));
            filter.push(format!("{} = ${}", quote_ident(&key.name), params.len()));
        }
        Ok(filter.join(" AND "))
    }

    fn delete(&mut self, keys: &[&Column], old: &Row) -> Result<(), Failure> {
        let mut params = Vec::new();
        let filter = self.key_filter(keys, old, &mut params)?;
        let sql = format!("DELETE FROM {} WHERE {filter}", self.target.sql());
        self.run(sql, params)
    }

    fn upsert(&mut self, keys: &[&Column], new: &Row) -> Result<(), Failure> {
        for key in keys {
            if !new.contains(&key.name) {
                return Err(SinkError::definite(format!(
                    "a change for {} lacks the value of its key column `{}`",
                    self.target, key.name
                ))
                .into());
            }
        }
        let names: Vec<String> = new.names().map(quote_ident).collect();
        let params: Vec<PgText> = new.fields().map(|(_, v)| PgText::of(v)).collect();
        let placeholders: Vec<String> = (1..=params.len()).map(|i| format!("${i}")).collect();
        let conflict: Vec<String> = keys.iter().map(|k| quote_ident(&k.name)).collect();
        let set: Vec<String> = new
            .names()
            .filter(|n| !keys.iter().any(|k| k.name == *n))
            .map(|n| {
                let n = quote_ident(n);
                format!("{n} = EXCLUDED.{n}")
            })
            .collect();
        let action = if set.is_empty() {
            "NOTHING".to_owned()
        } else {
            format!("UPDATE SET {}", set.join(", "))
        };
        let head = format!(
            "INSERT INTO {} ({}) VALUES ",
            self.target.sql(),
            names.join(", ")
        );
        let tail = format!(" ON CONFLICT ({}) DO {action}", conflict.join(", "));
        let key = keys
            .iter()
            .filter_map(|k| new.names().position(|n| n == k.name))
            .collect();
        self.plan.push(Planned {
            sql: format!("{head}({}){tail}", placeholders.join(", ")),
            params,
            target: Some(self.target.clone()),
            simple: false,
            ddl: false,
            upsert: Some(Upsert { head, tail, key }),
            record: None,
        });
        Ok(())
    }

    /// Sets the columns `new` has (leaving unchanged TOAST values alone) on
    /// the row with the key of `moved_from` (a key change), else of `new`.
    ///
    /// When the key changes, a row already at the new key is deleted first,
    /// but only if the row at the old key exists: then a replay recreated
    /// the old row (with the TOAST value as of then) and the row at the new
    /// key is a later state that the replay rebuilds. Without an old row the
    /// move already happened, and the row at the new key is the only holder
    /// of the unchanged value.
    fn update(
        &mut self,
        keys: &[&Column],
        moved_from: Option<&Row>,
        new: &Row,
    ) -> Result<(), Failure> {
        if let Some(at) = moved_from {
            let mut params = Vec::new();
            let at_new = self.key_filter(keys, new, &mut params)?;
            let at_old = self.key_filter(keys, at, &mut params)?;
            let table = self.target.sql();
            let sql = format!(
                "DELETE FROM {table} WHERE {at_new} AND EXISTS (SELECT 1 FROM {table} WHERE {at_old})"
            );
            self.run(sql, params)?;
        }
        let mut params = Vec::new();
        let mut set = Vec::new();
        for (name, value) in new.fields() {
            if *value == Value::Unchanged {
                continue;
            }
            params.push(PgText::of(value));
            set.push(format!("{} = ${}", quote_ident(name), params.len()));
        }
        let filter = self.key_filter(keys, moved_from.unwrap_or(new), &mut params)?;
        let sql = format!(
            "UPDATE {} SET {} WHERE {filter}",
            self.target.sql(),
            set.join(", ")
        );
        self.run(sql, params)
    }
}

// ---------------------------------------------------------------------------
// Values.

/// A parameter in PostgreSQL's text form, sent as text so that the server
/// parses it with the target column's input function.
#[derive(Debug)]
struct PgText(Option<String>);

impl PgText {
    fn of(value: &Value) -> PgText {
        PgText(pg_text(value))
    }
}

impl ToSql for PgText {
    fn to_sql(
        &self,
        _ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match &self.0 {
            Some(text) => {
                out.extend_from_slice(text.as_bytes());
                Ok(IsNull::No)
            }
            None => Ok(IsNull::Yes),
        }
    }

    fn accepts(_ty: &Type) -> bool {
        true
    }

    fn encode_format(&self, _ty: &Type) -> Format {
        Format::Text
    }

    to_sql_checked!();
}

/// A value's PostgreSQL text form; `None` for NULL (and for an unchanged
/// TOAST value, which callers leave out).
fn pg_text(value: &Value) -> Option<String> {
    Some(match value {
        Value::Null | Value::Unchanged => return None,
        Value::Bool(b) => if *b { "t" } else { "f" }.to_owned(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) if f.is_nan() => "NaN".to_owned(),
        Value::Float(f) if f.is_infinite() => {
            if *f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
        }
        Value::Float(f) => format!("{f:?}"),
        Value::Numeric(text) | Value::Text(text) | Value::Json(text) => text.clone(),
        Value::Other { text, .. } => text.clone(),
        Value::Bytes(bytes) => {
            let mut text = String::with_capacity(2 + bytes.len() * 2);
            text.push_str("\\x");
            for b in bytes {
                text.push_str(&format!("{b:02x}"));
            }
            text
        }
        Value::Array(items) => {
            let mut text = String::new();
            push_array(&mut text, items);
            text
        }
        // The JSON form writes these as PostgreSQL's text forms inside a tag.
        Value::Timestamp(_)
        | Value::TimestampTz(_)
        | Value::Date(_)
        | Value::Time(_)
        | Value::Uuid(_)
        | Value::Interval(_) => tagged_text(value)?,
    })
}

fn tagged_text(value: &Value) -> Option<String> {
    match serde_json::to_value(JsonValue(value.clone())).ok()? {
        serde_json::Value::Object(map) => map.into_iter().next()?.1.as_str().map(str::to_owned),
        _ => None,
    }
}

/// An array literal: `{"a","b",NULL}`, nested for several dimensions.
fn push_array(out: &mut String, items: &[Value]) {
    out.push('{');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match item {
            Value::Array(inner) => push_array(out, inner),
            other => match pg_text(other) {
                None => out.push_str("NULL"),
                Some(text) => {
                    out.push('"');
                    for c in text.chars() {
                        if c == '"' || c == '\\' {
                            out.push('\\');
                        }
                        out.push(c);
                    }
                    out.push('"');
                }
            },
        }
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use datum_guest::wire::{Interval, Timestamp};

    use super::*;

    /// Every run length of upserts made a statement text of its own, each
    /// prepared and kept on the target's session: about a hundred per table
    /// and column set, without end over many tables.
    #[test]
    fn upserts_of_any_run_length_take_few_statement_texts() {
        let upsert = |key: usize| Planned {
            sql: "INSERT INTO t (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE".into(),
            params: vec![PgText(Some(key.to_string())), PgText(Some("v".into()))],
            target: None,
            simple: false,
            ddl: false,
            upsert: Some(Upsert {
                head: "INSERT INTO t (k, v) VALUES ".into(),
                tail: " ON CONFLICT (k) DO UPDATE".into(),
                key: vec![0],
            }),
            record: None,
        };
        let mut texts = HashSet::new();
        for rows in 1..=300 {
            let plan = coalesce((0..rows).map(upsert).collect());
            let sent: usize = plan.iter().map(|p| p.params.len() / 2).sum();
            assert_eq!(sent, rows, "every row is sent once");
            let mut next = 0;
            for planned in &plan {
                for (i, pair) in planned.params.chunks(2).enumerate() {
                    assert_eq!(pair[0].0.as_deref(), Some(&*(next + i).to_string()));
                }
                next += planned.params.len() / 2;
                let last = planned.params.len();
                assert!(
                    planned.sql.contains(&format!("${last})")),
                    "{}",
                    planned.sql
                );
                texts.insert(planned.sql.clone());
            }
        }
        assert!(texts.len() <= 8, "{} statement texts", texts.len());
    }

    #[test]
    fn values_print_as_postgres_reads_them() {
        assert_eq!(pg_text(&Value::Null), None);
        assert_eq!(pg_text(&Value::Bool(true)).as_deref(), Some("t"));
        assert_eq!(pg_text(&Value::Float(0.1)).as_deref(), Some("0.1"));
        assert_eq!(
            pg_text(&Value::Float(f64::NEG_INFINITY)).as_deref(),
            Some("-Infinity")
        );
        assert_eq!(
            pg_text(&Value::Bytes(vec![0, 255])).as_deref(),
            Some("\\x00ff")
        );
        assert_eq!(
            pg_text(&Value::TimestampTz(Timestamp::Micros(1_500_000))).as_deref(),
            Some("1970-01-01 00:00:01.5+00")
        );
        assert_eq!(
            pg_text(&Value::Interval(Interval {
                months: 14,
                days: 0,
                micros: 0
            }))
            .as_deref(),
            Some("P1Y2M")
        );
        assert_eq!(
            pg_text(&Value::Array(vec![
                Value::Text("a\"b\\".into()),
                Value::Null,
                Value::Array(vec![]),
            ]))
            .as_deref(),
            Some(r#"{"a\"b\\",NULL,{}}"#)
        );
    }

    #[test]
    fn targets_follow_route_then_mapping_then_schema() {
        let routes = Routes {
            schema: Some("copy".into()),
            tables: BTreeMap::from([
                ("public.a".into(), "other.b".into()),
                ("public.c".into(), "d".into()),
            ]),
        };
        let t = |s: &str, t: &str, r: Option<&str>| routes.target(s, t, r).to_string();
        assert_eq!(t("public", "a", Some("x.y")), "x.y");
        assert_eq!(t("public", "a", Some("y")), "copy.y");
        assert_eq!(t("public", "a", None), "other.b");
        assert_eq!(t("public", "c", None), "copy.d");
        assert_eq!(t("public", "e", None), "copy.e");
        let plain = Routes {
            schema: None,
            tables: BTreeMap::new(),
        };
        assert_eq!(plain.target("s", "t", None).to_string(), "s.t");
        assert_eq!(plain.target("s", "t", Some("u")).to_string(), "s.u");
    }
}
