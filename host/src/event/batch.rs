//! The host's in-memory batch: what the source produces and the transforms
//! and sinks consume.
//!
//! Owns the shape of changes inside the host: rows are values aligned with
//! their relation's columns, and the relation (names, types, key flags) is
//! shared by every change of that table instead of being copied per row. It
//! does not own how a batch crosses to a module or a sink (that is the wire
//! format's job), nor where batches come from.

use std::sync::Arc;

use datum_guest::{Txn, Value};

use super::lsn::Lsn;
use super::values::TypeKind;

/// When a transaction is cut into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most changes in one batch.
    pub max_rows: usize,
    /// A batch is closed once its data reaches this many bytes.
    pub max_bytes: usize,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            max_rows: 10_000,
            max_bytes: 8 * 1024 * 1024,
        }
    }
}

/// What a batch of `rows` changes and `bytes` bytes counts against a budget:
/// its bytes, but at least its share of a full batch by rows, so that a
/// batch at the row limit costs as much as one at the byte limit (row data
/// in memory is several times its wire size) and a budget of `n` full
/// batches holds `n` of them, whichever limit they reached.
pub(crate) fn cost(bytes: usize, rows: usize, limits: BatchLimits) -> usize {
    let per_row = limits.max_bytes / limits.max_rows.max(1);
    bytes.max(rows.saturating_mul(per_row))
}

/// Which old values PostgreSQL sends for updates and deletes of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaIdentity {
    /// The primary key.
    Default,
    /// Nothing: updates and deletes cannot be replicated.
    Nothing,
    /// Every column.
    Full,
    /// The columns of a chosen unique index.
    Index,
}

/// A table as the replication stream describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Relation {
    /// The table's OID on the source server.
    pub oid: u32,
    /// Schema name.
    pub schema: String,
    /// Table name.
    pub table: String,
    /// Replica identity.
    pub replica_identity: ReplicaIdentity,
    /// Columns, in the order of row values.
    pub columns: Vec<Column>,
}

/// A column of a [`Relation`].
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// Column name.
    pub name: String,
    /// Type OID on the source server.
    pub type_oid: u32,
    /// Type name: built-in names as in `pg_catalog` (`int4`, `text[]`),
    /// others schema-qualified unless in `public`.
    pub type_name: String,
    /// Type modifier (`atttypmod`), -1 if none.
    pub type_modifier: i32,
    /// Part of the replica identity (the key).
    pub key: bool,
    /// How the column's text becomes a value.
    pub(crate) kind: TypeKind,
}

impl Column {
    /// A column described by name and type name (for tests and tools that
    /// build batches by hand; the source fills in type OIDs).
    pub fn new(name: &str, type_name: &str, key: bool) -> Column {
        Column {
            name: name.to_owned(),
            type_oid: 0,
            type_name: type_name.to_owned(),
            type_modifier: -1,
            key,
            kind: TypeKind::Other {
                type_name: type_name.to_owned(),
            },
        }
    }
}

impl Column {
    /// The type as DDL writes it, with its modifier: `varchar(10)`,
    /// `numeric(12,2)`, `timestamptz(3)`, `bpchar(4)[]`; the bare type name
    /// when there is no modifier or it is not one of the built-in types
    /// whose modifier has a known form.
    pub fn sql_type(&self) -> String {
        sql_type(&self.type_name, self.type_modifier)
    }

    /// Whether two columns hold the same thing: name and type.
    fn same_as(&self, other: &Column) -> bool {
        self.name == other.name
            && self.type_oid == other.type_oid
            && self.type_name == other.type_name
            && self.type_modifier == other.type_modifier
    }
}

/// `type_name` with the modifier `typmod` (`atttypmod`) in DDL's form.
pub(crate) fn sql_type(type_name: &str, typmod: i32) -> String {
    if typmod < 0 {
        return type_name.to_owned();
    }
    let (base, array) = match type_name.strip_suffix("[]") {
        Some(base) => (base, "[]"),
        None => (type_name, ""),
    };
    let modifier = match base {
        "varchar" | "bpchar" if typmod >= 4 => format!("({})", typmod - 4),
        "numeric" if typmod >= 4 => {
            let t = typmod - 4;
            let precision = (t >> 16) & 0xffff;
            // Since PostgreSQL 15 the scale may be negative: 11 bits, signed.
            let scale = ((t & 0x7ff) ^ 1024) - 1024;
            format!("({precision},{scale})")
        }
        "timestamp" | "timestamptz" | "time" | "timetz" | "bit" | "varbit" => {
            format!("({typmod})")
        }
        // The range of fields (`YEAR TO MONTH`) is left out: only the
        // precision, when one was given.
        "interval" if typmod & 0xffff != 0xffff => format!("({})", typmod & 0xffff),
        _ => return type_name.to_owned(),
    };
    format!("{base}{modifier}{array}")
}

/// What an encoder makes once per table and reuses for each change of
/// that table (its fixed parts): found by the relation's address, the last
/// one found first, since a batch touches few tables, mostly in runs. `R`
/// is how an entry holds its relation: borrowed for one call (`&Relation`:
/// the call borrows every relation it holds, so no address is reused while
/// it runs) or shared (`Arc<Relation>`: the entry keeps its relation alive,
/// so its address cannot be reused while the entry is there).
pub(crate) struct PerTable<R, T> {
    entries: Vec<(R, T)>,
    last: usize,
}

impl<R, T> Default for PerTable<R, T> {
    fn default() -> Self {
        PerTable {
            entries: Vec::new(),
            last: 0,
        }
    }
}

impl<R: std::ops::Deref<Target = Relation> + Clone, T> PerTable<R, T> {
    /// `relation`'s entry, made by `make` the first time it is asked for.
    pub(crate) fn get_or_try_insert_with<E: From<&'static str>>(
        &mut self,
        relation: &R,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<&T, E> {
        let same = |seen: &R| std::ptr::eq::<Relation>(&**seen, &**relation);
        let found = match self.entries.get(self.last) {
            Some((seen, _)) if same(seen) => Some(self.last),
            _ => self.entries.iter().position(|(seen, _)| same(seen)),
        };
        self.last = match found {
            Some(index) => index,
            None => {
                self.entries.push((relation.clone(), make()?));
                self.entries.len() - 1
            }
        };
        self.entries
            .get(self.last)
            .map(|(_, entry)| entry)
            .ok_or_else(|| E::from("a table's entry went missing"))
    }

    /// How many tables have an entry.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Forgets every entry.
    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.last = 0;
    }
}

impl Relation {
    /// Whether `other` describes the same shape: names, replica identity and
    /// columns (names, types, modifiers, key flags). A Relation message sent
    /// again with nothing changed is the same shape.
    pub fn same_shape(&self, other: &Relation) -> bool {
        self.replica_identity == other.replica_identity
            && self.same_columns(other)
            && self
                .columns
                .iter()
                .zip(&other.columns)
                .all(|(a, b)| a.key == b.key)
    }

    /// Whether `other` has the same names and columns (names, types,
    /// modifiers), whatever its key flags and replica identity.
    pub fn same_columns(&self, other: &Relation) -> bool {
        self.schema == other.schema
            && self.table == other.table
            && self.columns.len() == other.columns.len()
            && self
                .columns
                .iter()
                .zip(&other.columns)
                .all(|(a, b)| a.same_as(b))
    }
}

impl ReplicaIdentity {
    /// Its name: `default`, `nothing`, `full` or `index`.
    pub fn name(self) -> &'static str {
        match self {
            ReplicaIdentity::Default => "default",
            ReplicaIdentity::Nothing => "nothing",
            ReplicaIdentity::Full => "full",
            ReplicaIdentity::Index => "index",
        }
    }

    /// The identity a name gives (as [`ReplicaIdentity::name`] writes it).
    pub fn from_name(name: &str) -> Option<ReplicaIdentity> {
        Some(match name {
            "default" => ReplicaIdentity::Default,
            "nothing" => ReplicaIdentity::Nothing,
            "full" => ReplicaIdentity::Full,
            "index" => ReplicaIdentity::Index,
            _ => return None,
        })
    }
}

/// The old values of an updated or deleted row.
#[derive(Debug, Clone, PartialEq)]
pub struct OldRow {
    /// Only the key columns carry values (`REPLICA IDENTITY DEFAULT` or
    /// `INDEX`); the others are `Null`, meaning "not sent", not SQL NULL.
    pub key_only: bool,
    /// Values aligned with the relation's columns.
    pub values: Vec<Value>,
}

/// One change.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A row was inserted.
    Insert {
        /// The table.
        relation: Arc<Relation>,
        /// The new row.
        new: Vec<Value>,
    },
    /// An existing row, read by a snapshot or a backfill: the row as it
    /// was when its chunk was read (`docs/snapshots.md`).
    Snapshot {
        /// The table.
        relation: Arc<Relation>,
        /// The row.
        new: Vec<Value>,
    },
    /// A row was updated.
    Update {
        /// The table.
        relation: Arc<Relation>,
        /// The old row, when the replica identity supplies it (the key when it
        /// changed, or every column under `REPLICA IDENTITY FULL`).
        old: Option<OldRow>,
        /// The new row; unchanged TOAST values are `Unchanged` unless the old
        /// row supplied them.
        new: Vec<Value>,
    },
    /// A row was deleted.
    Delete {
        /// The table.
        relation: Arc<Relation>,
        /// The old row (its key, or every column under FULL).
        old: OldRow,
    },
    /// Tables were truncated, in one statement.
    Truncate {
        /// The tables.
        relations: Vec<Arc<Relation>>,
        /// `TRUNCATE ... CASCADE`.
        cascade: bool,
        /// `TRUNCATE ... RESTART IDENTITY`.
        restart_identity: bool,
    },
    /// A table's shape changed: columns added, dropped, renamed or
    /// retyped, its replica identity or its name changed. It comes before
    /// the first change of the new shape (`docs/abi.md`).
    Schema {
        /// The new shape.
        relation: Arc<Relation>,
        /// The shape before.
        before: Arc<Relation>,
        /// The DDL statements that caused it, oldest first, when the source
        /// captures them (`source.capture_ddl`).
        ddl: Vec<String>,
    },
    /// A `pg_logical_emit_message` payload.
    Message {
        /// Emitted inside the transaction (else it arrives on its own).
        transactional: bool,
        /// Where it was written.
        lsn: Lsn,
        /// The message's prefix.
        prefix: String,
        /// The payload.
        content: Vec<u8>,
    },
}

/// A transaction, or one chunk of a large one.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The transaction's identity and this chunk's place in it.
    pub txn: Txn,
    /// The changes, in WAL order.
    pub changes: Vec<Change>,
    /// Approximate size of the changes' data, in bytes.
    pub bytes: usize,
}

impl Batch {
    /// What this batch counts against the byte budgets between stages
    /// (the free function `cost` beside it).
    pub fn cost(&self, limits: crate::event::BatchLimits) -> usize {
        cost(self.bytes, self.changes.len(), limits)
    }

    /// The tables its changes touch (their OIDs), each once, in order of
    /// OID. A logical message names none ([`Batch::has_message`]).
    pub fn tables(&self) -> Vec<u32> {
        self.relations().iter().map(|r| r.oid).collect()
    }

    /// The relations its changes touch, one per table (the first seen),
    /// in order of OID.
    pub fn relations(&self) -> Vec<&Arc<Relation>> {
        let mut relations: Vec<&Arc<Relation>> = Vec::new();
        for change in &self.changes {
            match change {
                Change::Insert { relation, .. }
                | Change::Snapshot { relation, .. }
                | Change::Update { relation, .. }
                | Change::Delete { relation, .. }
                | Change::Schema { relation, .. } => {
                    if relations.last().is_none_or(|r| r.oid != relation.oid) {
                        relations.push(relation);
                    }
                }
                Change::Truncate {
                    relations: truncated,
                    ..
                } => relations.extend(truncated),
                Change::Message { .. } => {}
            }
        }
        relations.sort_by_key(|r| r.oid);
        relations.dedup_by_key(|r| r.oid);
        relations
    }

    /// Whether it carries a logical message.
    pub fn has_message(&self) -> bool {
        self.changes
            .iter()
            .any(|c| matches!(c, Change::Message { .. }))
    }
}
