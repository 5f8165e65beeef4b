//! Questions for the source database's catalog, asked over an ordinary
//! tokio-postgres connection (never the replication connection: some managed
//! services refuse `SHOW` there, `docs/architecture.md`, pitfall 3).
//!
//! Owns opening that connection with the same TLS settings as the replication
//! connection, resolving non-built-in column types (enums, domains, arrays of
//! them), and reading slot state. Requirement checks live in
//! [`super::check`].

use std::collections::HashMap;

use tokio_postgres::Client;

use super::assembler::ResolvedType;
use super::{RowColumns, SourceError};
use crate::event::{Lsn, TypeKind};
use crate::pg::{self, ConnInfo};

/// Opens an ordinary SQL connection to the source database.
pub(crate) async fn connect(info: &ConnInfo) -> Result<Client, SourceError> {
    Ok(pg::connect(info).await?)
}

/// Resolves type OIDs that are not built in: enums become text, domains their
/// base type, arrays of such types arrays. A type the catalog no longer knows
/// stays unresolved (the caller falls back to its name from the stream).
pub(crate) async fn resolve_types(
    client: &Client,
    oids: &[u32],
) -> Result<HashMap<u32, ResolvedType>, SourceError> {
    if oids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows = client
        .query(
            "WITH RECURSIVE t(oid) AS (
                 SELECT unnest($1::oid[])
                 UNION
                 SELECT CASE WHEN p.typtype = 'd' THEN p.typbasetype ELSE p.typelem END
                 FROM pg_type p JOIN t ON p.oid = t.oid
                 WHERE p.typtype = 'd' OR (p.typcategory = 'A' AND p.typelem <> 0)
             )
             SELECT p.oid, n.nspname, p.typname, p.typtype::text, p.typbasetype,
                    p.typelem, p.typcategory::text, p.typdelim::text
             FROM t JOIN pg_type p ON p.oid = t.oid
             JOIN pg_namespace n ON n.oid = p.typnamespace",
            &[&oids.to_vec()],
        )
        .await
        .map_err(SourceError::Sql)?;
    let mut raw: HashMap<u32, RawType> = HashMap::new();
    for row in rows {
        let oid: u32 = row.col(0)?;
        raw.insert(
            oid,
            RawType {
                namespace: row.col(1)?,
                name: row.col(2)?,
                typtype: row.col(3)?,
                base: row.col(4)?,
                element: row.col(5)?,
                category: row.col(6)?,
                delimiter: row.col::<&str>(7)?.bytes().next().unwrap_or(b','),
            },
        );
    }
    Ok(oids
        .iter()
        .filter(|oid| raw.contains_key(oid))
        .map(|&oid| {
            let name = display_name(&raw, oid);
            (
                oid,
                ResolvedType {
                    kind: kind_of(&raw, oid, 0),
                    name,
                },
            )
        })
        .collect())
}

#[derive(Debug)]
struct RawType {
    namespace: String,
    name: String,
    typtype: String,
    base: u32,
    element: u32,
    category: String,
    delimiter: u8,
}

fn display_name(raw: &HashMap<u32, RawType>, oid: u32) -> String {
    let Some(t) = raw.get(&oid) else {
        return format!("oid:{oid}");
    };
    if t.category == "A" && t.element != 0 && t.name.starts_with('_') {
        return format!("{}[]", display_name(raw, t.element));
    }
    match t.namespace.as_str() {
        "pg_catalog" | "public" => t.name.clone(),
        ns => format!("{ns}.{}", t.name),
    }
}

fn kind_of(raw: &HashMap<u32, RawType>, oid: u32, depth: u32) -> TypeKind {
    if let Some(kind) = TypeKind::builtin(oid) {
        return kind;
    }
    let other = || TypeKind::Other {
        type_name: display_name(raw, oid),
    };
    let Some(t) = raw.get(&oid) else {
        return other();
    };
    if depth > 16 {
        return other();
    }
    match t.typtype.as_str() {
        "e" => TypeKind::Text,
        "d" => kind_of(raw, t.base, depth + 1),
        _ if t.category == "A" && t.element != 0 => TypeKind::Array {
            element: Box::new(kind_of(raw, t.element, depth + 1)),
            delimiter: t.delimiter,
        },
        _ => other(),
    }
}

/// A replication slot as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotState {
    /// The output plugin (`pgoutput` for ours).
    pub plugin: Option<String>,
    /// `logical` or `physical`.
    pub slot_type: String,
    /// The database a logical slot belongs to.
    pub database: Option<String>,
    /// Whether a walsender streams from it now.
    pub active: bool,
    /// The process that holds it.
    pub active_pid: Option<i32>,
    /// Where a restart begins: everything before was acknowledged.
    pub confirmed_flush: Option<Lsn>,
    /// The oldest WAL the slot keeps.
    pub restart_lsn: Option<Lsn>,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
    /// Bytes of WAL the slot holds back, from `restart_lsn` to the current
    /// WAL position.
    pub retained_bytes: Option<i64>,
}

/// Reads a slot's state; `None` if there is no such slot.
pub(crate) async fn slot_state(
    client: &Client,
    slot: &str,
) -> Result<Option<SlotState>, SourceError> {
    let row = client
        .query_opt(
            "SELECT plugin::text, slot_type, database::text, active, active_pid,
                    confirmed_flush_lsn::text, restart_lsn::text, wal_status,
                    (pg_current_wal_lsn() - restart_lsn)::int8
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(SourceError::Sql)?;
    let Some(row) = row else {
        return Ok(None);
    };
    let lsn = |i: usize| -> Result<Option<Lsn>, SourceError> {
        Ok(row
            .col::<Option<&str>>(i)?
            .and_then(|text| text.parse::<Lsn>().ok()))
    };
    Ok(Some(SlotState {
        plugin: row.col(0)?,
        slot_type: row.col(1)?,
        database: row.col(2)?,
        active: row.col(3)?,
        active_pid: row.col(4)?,
        confirmed_flush: lsn(5)?,
        restart_lsn: lsn(6)?,
        wal_status: row.col(7)?,
        retained_bytes: row.col(8)?,
    }))
}

/// The server's system identifier (`pg_control_system()`, which PostgreSQL
/// lets everyone run unless it was revoked): made by `initdb`, so shared by
/// every cluster made from a base backup of it (a standby promoted in its
/// place, a restored backup) and by no other.
pub(crate) async fn system_identifier(client: &Client) -> Result<String, tokio_postgres::Error> {
    client
        .query_one(
            "SELECT system_identifier::text FROM pg_control_system()",
            &[],
        )
        .await
        .and_then(|row| row.try_get(0))
}

/// A setting as `SHOW` reports it.
pub(crate) async fn show(client: &Client, setting: &str) -> Result<String, SourceError> {
    let row = client
        .query_one("SELECT current_setting($1)", &[&setting])
        .await
        .map_err(SourceError::Sql)?;
    row.col(0)
}
