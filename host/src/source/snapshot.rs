//! Reading a table's existing rows, chunk by chunk along a key, on an
//! ordinary SQL connection, and the watermarks that place each chunk in the
//! replication stream (`docs/snapshots.md`).
//!
//! Owns describing a table as the stream would (columns, types, key flags)
//! plus the key a copy walks along, reading one chunk in one short
//! request, and writing a watermark. It does not decide which rows of a
//! chunk reach the sink, nor when progress is durable: the daemon's
//! snapshot coordinator does (`host/src/daemon/snapshot.rs`).
//!
//! Values are read in text form, with the session settings of the
//! replication connection, and parsed by the same code as the stream's, so
//! a key read here equals the same key decoded from the stream.

use std::sync::Arc;

use datum_guest::Value;
use futures_util::StreamExt;
use tokio_postgres::{Client, SimpleQueryMessage, Statement};

use super::catalog;
use super::check::quoted_table;
use super::copy_text;
use super::{RowColumns, SourceError};
use crate::event::values::{self, TypeKind};
use crate::event::{Column, Relation, ReplicaIdentity};
use crate::pg::{self, ConnInfo, quote_ident, quote_literal};
use crate::retry::Backoff;

/// The prefix of the logical messages that carry watermarks.
pub(crate) const WATERMARK_PREFIX: &str = "datum.snapshot";

/// A table as a copy reads it.
#[derive(Debug, Clone)]
pub(crate) struct SnapshotTable {
    /// `schema.table`.
    pub name: String,
    /// Its OID (what the stream's changes carry).
    pub oid: u32,
    /// Columns as the stream describes them.
    pub relation: Arc<Relation>,
    /// Positions in `relation.columns` of the key the copy walks along, in
    /// the key's order: the replica identity index under REPLICA IDENTITY
    /// USING INDEX, else the primary key, else the replica identity index,
    /// else the narrowest unique index over NOT NULL columns.
    pub key: Vec<usize>,
    /// A plain table (not partitioned): read without the tables that
    /// inherit from it, which the stream reports as themselves.
    pub only: bool,
    /// The columns the publication publishes, when it lists them.
    pub column_list: Option<Vec<String>>,
    /// The publication's row filter, as PostgreSQL prints it.
    pub row_filter: Option<String>,
    /// The planner's estimate of its rows (`pg_class.reltuples`; 0 when
    /// never analysed).
    pub estimate: u64,
    /// The role that reads it (for the GRANT to run when it may not).
    pub role: String,
}

/// Rows of one chunk, in key order.
#[derive(Debug, Default)]
pub(crate) struct ChunkRows {
    /// Values aligned with the relation's columns.
    pub rows: Vec<Vec<Value>>,
    /// The text of the last row's key, one entry per key column: where the
    /// next chunk starts.
    pub last_key: Option<Vec<String>>,
    /// Approximate size of the rows' text, in bytes.
    pub bytes: usize,
    /// A snapshot taken just before the chunk's statement: the statement's
    /// own is never older, so whatever this one sees, the rows reflect.
    pub snapshot: ReadSnapshot,
}

/// A snapshot as `pg_current_snapshot()` writes it, `xmin:xmax:xip,...`:
/// every transaction below `xmin` had ended, those in `xip` were running,
/// and none from `xmax` on had started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ReadSnapshot {
    pub xmin: u64,
    pub xmax: u64,
    /// Sorted.
    pub xip: Vec<u64>,
}

impl ReadSnapshot {
    pub(crate) fn parse(text: &str) -> Option<ReadSnapshot> {
        let mut parts = text.trim().splitn(3, ':');
        let xmin = parts.next()?.parse().ok()?;
        let xmax = parts.next()?.parse().ok()?;
        let mut xip = parts
            .next()?
            .split(',')
            .filter(|x| !x.is_empty())
            .map(|x| x.parse().ok())
            .collect::<Option<Vec<u64>>>()?;
        xip.sort_unstable();
        (xmin <= xmax).then_some(ReadSnapshot { xmin, xmax, xip })
    }

    /// Whether the snapshot sees transaction `xid` as ended (committed or
    /// not), `xid` given as the stream gives it: the low 32 bits, taken
    /// as the nearest full id to `xmax`.
    pub(crate) fn sees(&self, xid: u32) -> bool {
        let Some(full) = self.full(xid) else {
            return true;
        };
        full < self.xmin || (full < self.xmax && self.xip.binary_search(&full).is_err())
    }

    /// `xid` as the stream gives it (the low 32 bits) as the full id
    /// nearest to `xmax`.
    pub(crate) fn full(&self, xid: u32) -> Option<u64> {
        let offset = i64::from(xid.wrapping_sub(self.xmax as u32) as i32);
        self.xmax.checked_add_signed(offset)
    }
}

/// Opens an ordinary SQL connection whose values print as the replication
/// connection's do.
pub(crate) async fn connect(info: &ConnInfo) -> Result<Client, SourceError> {
    let client = catalog::connect(info).await?;
    let settings: String = super::replication::SESSION_SETTINGS
        .iter()
        .map(|(name, value)| format!("SET {name} = {};", quote_literal(value)))
        .collect();
    client
        .batch_execute(&settings)
        .await
        .map_err(SourceError::Sql)?;
    Ok(client)
}

/// The tables a publication publishes, as `schema.table`.
pub(crate) async fn publication_tables(
    client: &Client,
    publication: &str,
) -> Result<Vec<String>, SourceError> {
    let rows = client
        .query(
            "SELECT schemaname::text, tablename::text FROM pg_publication_tables \
             WHERE pubname = $1 ORDER BY 1, 2",
            &[&publication],
        )
        .await
        .map_err(SourceError::Sql)?;
    rows.iter()
        .map(|r| Ok(format!("{}.{}", r.col::<&str>(0)?, r.col::<&str>(1)?)))
        .collect()
}

/// The `schema.table` a user's table name means (`orders`, `sales.orders`,
/// `"Mixed Case"`), as PostgreSQL resolves it.
pub(crate) async fn resolve_table(client: &Client, name: &str) -> Result<String, SourceError> {
    let row = client
        .query_opt(
            "SELECT n.nspname::text, c.relname::text FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)",
            &[&name],
        )
        .await
        .map_err(SourceError::Sql)?;
    match row {
        Some(row) => Ok(format!("{}.{}", row.col::<&str>(0)?, row.col::<&str>(1)?)),
        None => Err(SourceError::Requirement {
            problem: format!("table {name} does not exist"),
            fix: "name an existing table (schema.table)".into(),
        }),
    }
}

/// Describes `schema.table` for a copy: its columns as the stream would
/// describe them and the key to walk along. Through `publication` (from
/// PostgreSQL 15), only the columns and rows it publishes: a column list
/// leaves the others out of the stream's description, and a row filter
/// leaves rows out of the stream, so a copy of them would send what the
/// publication withholds, and rows the stream never changes again.
pub(crate) async fn describe(
    client: &Client,
    name: &str,
    publication: Option<&str>,
) -> Result<SnapshotTable, SourceError> {
    let (schema, table) = super::check::split_table(name);
    let row = client
        .query_opt(
            "SELECT c.oid, c.relreplident::text, greatest(c.reltuples, 0)::float8, \
                    has_table_privilege(c.oid, 'SELECT'), current_user::text, \
                    c.relkind = 'r', current_setting('server_version_num')::int4 \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'p')",
            &[&schema, &table],
        )
        .await
        .map_err(SourceError::Sql)?
        .ok_or_else(|| SourceError::Requirement {
            problem: format!("table {name} does not exist (was it dropped or renamed?)"),
            fix: format!(
                "re-create {name} and backfill it, or remove it from the pipeline's tables"
            ),
        })?;
    let oid: u32 = row.col(0)?;
    let replident: String = row.col(1)?;
    let estimate: f64 = row.col(2)?;
    let role: String = row.col(4)?;
    let plain: bool = row.col(5)?;
    let version: i32 = row.col(6)?;
    if !row.col::<bool>(3)? {
        return Err(unreadable(name, &role));
    }
    let (mut column_list, row_filter) = match publication {
        Some(publication) if version >= 150_000 => {
            published(client, publication, &schema, &table).await?
        }
        _ => (None, None),
    };
    let mut columns = client
        .query(
            "SELECT attnum, attname::text, atttypid, atttypmod FROM pg_attribute \
             WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped AND attgenerated = '' \
             ORDER BY attnum",
            &[&oid],
        )
        .await
        .map_err(SourceError::Sql)?;
    let listed = |c: &tokio_postgres::Row, list: &[String]| {
        c.col::<&str>(1)
            .is_ok_and(|name| list.iter().any(|l| l == name))
    };
    // A list of every column is no list: a column added later is published
    // too, and the copy's check of the columns must see it come.
    if column_list
        .as_ref()
        .is_some_and(|list| columns.iter().all(|c| listed(c, list)))
    {
        column_list = None;
    }
    if let Some(list) = &column_list {
        columns.retain(|c| listed(c, list));
    }
    let indexes = client
        .query(
            "SELECT i.indisprimary, i.indisreplident, \
                    (SELECT array_agg(k ORDER BY n) FROM unnest(i.indkey::int2[]) \
                       WITH ORDINALITY AS u(k, n) WHERE n <= i.indnkeyatts), \
                    bool_and(a.attnotnull) \
             FROM pg_index i \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
             WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid \
               AND i.indexprs IS NULL AND i.indpred IS NULL \
             GROUP BY i.indexrelid, i.indisprimary, i.indisreplident, i.indkey, i.indnkeyatts \
             ORDER BY i.indexrelid",
            &[&oid],
        )
        .await
        .map_err(SourceError::Sql)?;
    let attnums = columns
        .iter()
        .map(|c| c.col::<i16>(0))
        .collect::<Result<Vec<_>, _>>()?;
    let position = |attnum: i16| attnums.iter().position(|a| *a == attnum);
    // Each unique index: primary, replica identity, all NOT NULL, and its
    // key's positions among the columns (None for an expression).
    struct Unique {
        primary: bool,
        identity: bool,
        not_null: bool,
        columns: Option<Vec<usize>>,
    }
    let indexes = indexes
        .iter()
        .map(|i| {
            Ok(Unique {
                primary: i.col(0)?,
                identity: i.col(1)?,
                not_null: i.col::<Option<bool>>(3)? == Some(true),
                columns: i
                    .col::<Option<Vec<i16>>>(2)?
                    .and_then(|keys| keys.into_iter().map(position).collect()),
            })
        })
        .collect::<Result<Vec<_>, SourceError>>()?;
    let primary = indexes
        .iter()
        .find(|i| i.primary)
        .and_then(|i| i.columns.clone());
    let identity_index = indexes
        .iter()
        .find(|i| i.identity)
        .and_then(|i| i.columns.clone());
    // The oldest of the narrowest, so that every description of the table
    // (a copy resumed after a restart, say) walks the same one.
    let unique_not_null = indexes
        .iter()
        .filter(|i| i.not_null)
        .filter_map(|i| i.columns.clone())
        .min_by_key(Vec::len);
    let gone = client
        .query_opt("SELECT 1 FROM pg_class WHERE oid = $1", &[&oid])
        .await
        .map_err(SourceError::Sql)?
        .is_none();
    if gone {
        return Err(dropped(name));
    }
    // The key the stream identifies rows by, so that the keys a chunk's
    // changes carry are the chunk's: under REPLICA IDENTITY USING INDEX a
    // delete carries only that index's columns, and an update that changes
    // the primary key but not them carries no old key at all.
    let identity_first = replident == "i" && identity_index.is_some();
    let key = if identity_first {
        identity_index.clone()
    } else {
        primary.clone().or_else(|| identity_index.clone())
    }
    .or(unique_not_null)
    .ok_or_else(|| SourceError::Requirement {
        problem: format!(
            "table {name} has neither a primary key nor a unique index over NOT NULL \
                 columns, so its rows cannot be copied in chunks without going back in time"
        ),
        fix: format!(
            "add one (ALTER TABLE {} ADD PRIMARY KEY (...)), or leave {name} out of the \
                 snapshot",
            quoted_table(name)
        ),
    })?;

    let type_oids = columns
        .iter()
        .map(|c| c.col::<u32>(2))
        .collect::<Result<Vec<_>, _>>()?;
    let custom: Vec<u32> = type_oids
        .iter()
        .copied()
        .filter(|oid| TypeKind::builtin(*oid).is_none())
        .collect();
    let resolved = catalog::resolve_types(client, &custom).await?;
    // Key flags as pgoutput sets them for this replica identity, so that a
    // copied row and a streamed one look alike to modules and sinks; when
    // the identity flags nothing, the copy's key.
    let (replica_identity, flagged): (ReplicaIdentity, Vec<usize>) = match replident.as_str() {
        "f" => (ReplicaIdentity::Full, (0..columns.len()).collect()),
        "i" => (ReplicaIdentity::Index, identity_index.unwrap_or_default()),
        "n" => (ReplicaIdentity::Nothing, Vec::new()),
        _ => (ReplicaIdentity::Default, primary.unwrap_or_default()),
    };
    let flagged = if flagged.is_empty() {
        key.clone()
    } else {
        flagged
    };
    let columns = columns
        .iter()
        .zip(type_oids)
        .enumerate()
        .map(|(i, (c, type_oid))| {
            let (type_name, kind) = super::assembler::column_type(type_oid, &resolved, None);
            Ok(Column {
                name: c.col(1)?,
                type_oid,
                type_name,
                type_modifier: c.col(3)?,
                key: flagged.contains(&i),
                kind,
            })
        })
        .collect::<Result<_, SourceError>>()?;
    Ok(SnapshotTable {
        name: name.to_owned(),
        oid,
        relation: Arc::new(Relation {
            oid,
            schema,
            table,
            replica_identity,
            columns,
        }),
        key,
        only: plain,
        column_list,
        row_filter,
        estimate: estimate as u64,
        role,
    })
}

/// The source role may not (or no longer) read the table.
fn unreadable(name: &str, role: &str) -> SourceError {
    SourceError::Requirement {
        problem: format!("the source role {role} may not read {name}"),
        fix: format!(
            "GRANT SELECT ON {} TO {}, then backfill {name}",
            quoted_table(name),
            quote_ident(role)
        ),
    }
}

/// What `publication` publishes of `schema.table` (PostgreSQL 15 and
/// later): its column list (every column when it has none) and its row
/// filter. Nothing when it does not publish the table by that name (a
/// partition published through its root, say).
async fn published(
    client: &Client,
    publication: &str,
    schema: &str,
    table: &str,
) -> Result<(Option<Vec<String>>, Option<String>), SourceError> {
    let row = client
        .query_opt(
            "SELECT attnames::text[], rowfilter FROM pg_publication_tables \
             WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&publication, &schema, &table],
        )
        .await
        .map_err(SourceError::Sql)?;
    match row {
        Some(row) => Ok((row.col(0)?, row.col(1)?)),
        None => Ok((None, None)),
    }
}

/// The table went away between two statements of its copy.
fn dropped(name: &str) -> SourceError {
    SourceError::Requirement {
        problem: format!("table {name} was dropped during its copy"),
        fix: format!("re-create {name} and backfill it, or remove it from the pipeline's tables"),
    }
}

/// Reads the next chunk: at most `limit` rows whose key is above `after`
/// (from the first row when `None`), in key order, with one `COPY (SELECT
/// ...) TO STDOUT` (its own short transaction), and a snapshot taken just
/// before it. Ordering is PostgreSQL's: the key is compared here only for
/// equality. Rows are parsed as they arrive, while the server still sends
/// the rest.
///
/// `COPY` rather than a query: the server writes its rows with less work
/// than a query's, and each row arrives as one line to split at its tabs,
/// checked as UTF-8 once (docs/benchmarks.md, "Chunks read with COPY").
pub(crate) async fn read_chunk(
    client: &Client,
    table: &SnapshotTable,
    after: Option<&[String]>,
    limit: usize,
) -> Result<ChunkRows, SourceError> {
    let columns = &table.relation.columns;
    let key_list = table
        .key
        .iter()
        .map(|i| quote_ident(&columns[*i].name))
        .collect::<Vec<_>>()
        .join(", ");
    let mut sql = format!(
        "SELECT {} FROM {}{}",
        columns
            .iter()
            .map(|c| quote_ident(&c.name))
            .collect::<Vec<_>>()
            .join(", "),
        if table.only { "ONLY " } else { "" },
        quoted_table(&table.name)
    );
    let mut conditions = Vec::new();
    if let Some(filter) = &table.row_filter {
        conditions.push(format!("({filter})"));
    }
    if let Some(after) = after {
        if after.len() != table.key.len() {
            return Err(SourceError::Requirement {
                problem: format!(
                    "the stored position of {}'s copy has {} key values, but its key now has \
                     {} columns (the key changed during the copy)",
                    table.name,
                    after.len(),
                    table.key.len()
                ),
                fix: format!("backfill {} again from the start", table.name),
            });
        }
        let values = after
            .iter()
            .map(|v| quote_literal(v))
            .collect::<Vec<_>>()
            .join(", ");
        conditions.push(format!("({key_list}) > ({values})"));
    }
    if !conditions.is_empty() {
        sql.push_str(" WHERE ");
        sql.push_str(&conditions.join(" AND "));
    }
    sql.push_str(&format!(" ORDER BY {key_list} LIMIT {limit}"));
    let sql = format!("COPY ({sql}) TO STDOUT");
    let failed = |e: tokio_postgres::Error| match e.as_db_error().map(|d| d.code().code()) {
        Some("42P01") => dropped(&table.name),
        Some("42501") => unreadable(&table.name, &table.role),
        _ => SourceError::Sql(e),
    };
    let unreadable_row = |problem: String| {
        SourceError::Protocol(format!("{problem}, in the copy of {}", table.name))
    };
    // The snapshot first, in one round trip with the copy's preparation:
    // the copy's own snapshot, taken after it, is never older.
    let (snapshot, statement) = futures_util::future::try_join(
        client.simple_query("SELECT pg_current_snapshot()::text"),
        client.prepare(&sql),
    )
    .await
    .map_err(failed)?;
    let snapshot = snapshot.iter().find_map(|message| match message {
        SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
        _ => None,
    });
    let rows = client.copy_out(&statement).await.map_err(failed)?;
    let mut rows = std::pin::pin!(rows);
    let mut chunk = ChunkRows {
        rows: Vec::with_capacity(limit.min(ROWS_RESERVED)),
        ..ChunkRows::default()
    };
    let mut last = None;
    let mut scratch = Vec::new();
    while let Some(data) = rows.next().await {
        let data = data.map_err(failed)?;
        let line = copy_text::line(&data).map_err(unreadable_row)?;
        let mut fields = copy_text::fields(line);
        let mut values = Vec::with_capacity(columns.len());
        for column in columns {
            let raw = fields.next().ok_or_else(|| {
                unreadable_row(format!(
                    "a row of the copy has no value for {}",
                    column.name
                ))
            })?;
            values.push(
                match copy_text::decode(raw, &mut scratch).map_err(unreadable_row)? {
                    Some(text) => values::parse_str(&column.kind, text),
                    None => Value::Null,
                },
            );
        }
        if fields.next().is_some() {
            return Err(unreadable_row(format!(
                "a row of the copy has more than the {} values asked for",
                columns.len()
            )));
        }
        chunk.bytes += line.len();
        chunk.rows.push(values);
        last = Some(data);
    }
    if let Some(data) = last {
        let line = copy_text::line(&data).map_err(unreadable_row)?;
        let raw: Vec<&str> = copy_text::fields(line).collect();
        let mut key = Vec::with_capacity(table.key.len());
        for i in &table.key {
            let text = raw
                .get(*i)
                .map(|raw| copy_text::decode(raw, &mut scratch))
                .transpose()
                .map_err(unreadable_row)?
                .flatten()
                .ok_or_else(|| SourceError::Requirement {
                    problem: format!("a key column of {} holds NULL", table.name),
                    fix: "make the key columns NOT NULL, or give the table a primary key".into(),
                })?;
            key.push(text.to_owned());
        }
        chunk.last_key = Some(key);
    }
    chunk.snapshot = snapshot
        .as_deref()
        .and_then(ReadSnapshot::parse)
        .ok_or_else(|| {
            SourceError::Protocol(format!(
                "the server answered pg_current_snapshot() with {snapshot:?}, not a snapshot \
                 Datum can read; connect to PostgreSQL 14 or newer"
            ))
        })?;
    Ok(chunk)
}

/// Waits until a new snapshot sees every transaction of `xids` (which
/// have committed): a chunk read before then could undo them.
pub(crate) async fn wait_seen(
    client: &Client,
    xids: &[u64],
    table: &str,
) -> Result<(), SourceError> {
    let ids: Vec<String> = xids.iter().map(u64::to_string).collect();
    let started = std::time::Instant::now();
    let mut warned = false;
    let mut pause = Backoff::new(
        std::time::Duration::from_millis(5),
        std::time::Duration::from_millis(200),
    );
    loop {
        let row = client
            .query_one(
                "SELECT count(*) FROM unnest($1::text[]) AS x \
                 WHERE NOT pg_visible_in_snapshot(x::xid8, pg_current_snapshot())",
                &[&ids],
            )
            .await
            .map_err(SourceError::Sql)?;
        if row.col::<i64>(0)? == 0 {
            return Ok(());
        }
        if !warned && started.elapsed() >= UNSEEN_WARN_AFTER {
            warned = true;
            tracing::warn!(
                table,
                transactions = ?xids,
                "the copy waits for transactions that have committed but are not visible yet, \
                 so that it does not undo them; a commit waiting this long usually waits for a \
                 synchronous standby (synchronous_standby_names) that does not answer"
            );
        }
        tokio::time::sleep(pause.next_wait()).await;
    }
}

/// How long a copy waits for committed transactions to become visible
/// before it says so.
const UNSEEN_WARN_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

/// Rows a chunk's vector is made for at once (a larger chunk grows it).
const ROWS_RESERVED: usize = 16_384;

/// A copy's connection, with the statements it runs for every chunk
/// prepared once: each then takes one round trip instead of two.
pub(crate) struct CopyConnection {
    client: Client,
    watermark: Statement,
    columns: Statement,
}

impl CopyConnection {
    /// Opens it as [`connect`] does and prepares its statements.
    ///
    /// Its commits (the watermarks, which carry no data) wait for the local
    /// WAL flush only, never for synchronous standbys: the stream sends
    /// what is flushed locally, so waiting for a standby would only add its
    /// round trip to every chunk, and stall the copy while it is down.
    pub(crate) async fn open(info: &ConnInfo) -> Result<CopyConnection, SourceError> {
        let client = connect(info).await?;
        client
            .batch_execute("SET synchronous_commit = local")
            .await
            .map_err(SourceError::Sql)?;
        Ok(CopyConnection {
            watermark: client
                .prepare("SELECT pg_logical_emit_message(true, $1::text, $2::text)")
                .await
                .map_err(SourceError::Sql)?,
            columns: client
                .prepare(
                    "SELECT n.nspname::text, c.relname::text, a.attname::text, a.atttypid, \
                            a.atttypmod \
                     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                     JOIN pg_attribute a ON a.attrelid = c.oid \
                     WHERE c.oid = $1 AND a.attnum > 0 AND NOT a.attisdropped \
                       AND a.attgenerated = '' \
                       AND ($2::text[] IS NULL OR a.attname = ANY ($2::text[])) \
                     ORDER BY a.attnum",
                )
                .await
                .map_err(SourceError::Sql)?,
            client,
        })
    }

    /// The connection, for the statements that are not prepared.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// Writes a watermark: a transactional logical message of its own
    /// transaction, so that it is decoded at its commit's place in the
    /// stream.
    pub(crate) async fn emit_watermark(&self, content: &str) -> Result<(), SourceError> {
        self.client
            .execute(&self.watermark, &[&WATERMARK_PREFIX, &content])
            .await
            .map_err(SourceError::Sql)?;
        Ok(())
    }

    /// Whether `table` still has the name and columns (names, types,
    /// modifiers) it was described with. A chunk read with a description
    /// that DDL made stale in the meantime must be read again: its rows
    /// would otherwise follow rows of the new shape in the stream
    /// (`docs/schema.md`).
    pub(crate) async fn unchanged(&self, table: &SnapshotTable) -> Result<bool, SourceError> {
        let rows = self
            .client
            .query(&self.columns, &[&table.oid, &table.column_list])
            .await
            .map_err(SourceError::Sql)?;
        let relation = &table.relation;
        if rows.len() != relation.columns.len() {
            return Ok(false);
        }
        for (row, column) in rows.iter().zip(&relation.columns) {
            let same = row.col::<&str>(0)? == relation.schema
                && row.col::<&str>(1)? == relation.table
                && row.col::<&str>(2)? == column.name
                && row.col::<u32>(3)? == column.type_oid
                && row.col::<i32>(4)? == column.type_modifier;
            if !same {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Adds `table` to `publication` (when Datum created it and a backfill
/// names a table it does not publish yet).
pub(crate) async fn publish(
    client: &Client,
    publication: &str,
    table: &str,
) -> Result<(), SourceError> {
    client
        .batch_execute(&format!(
            "ALTER PUBLICATION {} ADD TABLE {}",
            quote_ident(publication),
            quoted_table(table)
        ))
        .await
        .map_err(|e| SourceError::Requirement {
            problem: format!(
                "cannot add {table} to publication {publication}: {}",
                pg::error_chain(&e)
            ),
            fix: format!(
                "add it yourself (ALTER PUBLICATION {} ADD TABLE {}) as the publication's owner",
                quote_ident(publication),
                quoted_table(table)
            ),
        })
}
