//! Turns decoded pgoutput messages into batches: one per transaction, or
//! ordered chunks of one when a transaction exceeds the batch limits.
//!
//! Owns the relation cache (Relation messages arrive lazily, before the first
//! change after DDL, and replace what came before: `docs/architecture.md`, pitfall 9), the typing of
//! values, unchanged-TOAST handling, chunking, and skipping what was already
//! delivered: whole transactions at or below the resume point, and the
//! leading changes of a transaction that was cut off mid-way by a lost
//! connection and is being re-sent.
//!
//! Invariants (tested below):
//! * a batch's changes keep WAL order, batches keep commit order;
//! * chunks of one transaction share `xid` and `commit_lsn`, are numbered
//!   0, 1, 2, ... and only the last has `last = true` and an `end_lsn`;
//! * no chunk holds more than `max_rows` changes, and a chunk is closed as
//!   soon as it reaches `max_bytes`;
//! * a transaction whose end LSN is at or below the resume point is never
//!   emitted (`docs/architecture.md`, pitfall 1: PostgreSQL re-sends from the commit LSN).
//!
//! It does no I/O: the stream asks [`Assembler::missing_types`] before handing
//! over a Relation message and resolves those types from the catalog.

use std::collections::HashMap;
use std::sync::Arc;

use datum_guest::{Txn, Value};

use super::SourceError;
use super::pgoutput::{self, Datum, Message, OldTuple, Tuple};
use super::replication::PG_EPOCH_OFFSET_MICROS;
use crate::event::values::{self, TypeKind};
use crate::event::{Batch, Change, Column, OldRow, Relation, ReplicaIdentity};
use crate::event::{BatchLimits, Lsn};

/// A type the catalog told us about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResolvedType {
    /// The name to show (schema-qualified unless `pg_catalog` or `public`).
    pub name: String,
    /// How to parse it.
    pub kind: TypeKind,
}

#[derive(Debug)]
struct Open {
    xid: u32,
    commit_lsn: Lsn,
    commit_time: i64,
    chunk: u32,
    changes: Vec<Change>,
    bytes: usize,
    /// Changes of this transaction seen so far (delivered or not).
    seen: u64,
    /// Leading changes to drop: already delivered before a reconnect.
    skip: u64,
    /// The whole transaction is at or below the resume point.
    skip_all: bool,
}

/// Where the last transaction that was partly delivered stopped.
#[derive(Debug, Clone, Copy)]
struct Partial {
    commit_lsn: Lsn,
    delivered_changes: u64,
    next_chunk: u32,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Assembler {
    limits: BatchLimits,
    relations: HashMap<u32, Arc<Relation>>,
    types: HashMap<u32, ResolvedType>,
    stream_type_names: HashMap<u32, String>,
    open: Option<Open>,
    resume_after: Lsn,
    partial: Option<Partial>,
    /// Changes in the last batch made: a new transaction's list starts at
    /// that size (at most `CHANGES_RESERVED`), so a stream of transactions
    /// of one size does not grow each one's list from empty.
    last_changes: usize,
}

/// The most changes a batch's list is sized for before its changes come.
const CHANGES_RESERVED: usize = 1024;

impl Assembler {
    /// An assembler that emits only transactions ending after `resume_after`.
    pub(crate) fn new(limits: BatchLimits, resume_after: Lsn) -> Assembler {
        Assembler {
            limits: BatchLimits {
                max_rows: limits.max_rows.max(1),
                max_bytes: limits.max_bytes.max(1),
            },
            relations: HashMap::new(),
            types: HashMap::new(),
            stream_type_names: HashMap::new(),
            open: None,
            resume_after,
            partial: None,
            last_changes: 0,
        }
    }

    /// How many changes a new batch's list is sized for: the last batch's.
    fn changes_reserved(&self) -> usize {
        self.last_changes.min(CHANGES_RESERVED)
    }

    /// Prepares for a new connection: the server starts again at a
    /// transaction boundary and re-sends Relation messages. Changes of a
    /// transaction that was partly delivered will be skipped when it comes
    /// again. `resume_after` only ever moves forward.
    pub(crate) fn reconnected(&mut self, resume_after: Lsn) {
        if let Some(open) = self.open.take()
            && !open.skip_all
        {
            // A second cut before reaching the earlier cut point must not
            // forget what was delivered the first time.
            let delivered = (open.seen - open.changes.len() as u64).max(open.skip);
            if delivered > 0 {
                self.partial = Some(Partial {
                    commit_lsn: open.commit_lsn,
                    delivered_changes: delivered,
                    next_chunk: open.chunk,
                });
            }
        }
        self.resume_after = self.resume_after.max(resume_after);
        self.relations.clear();
    }

    /// The end LSN of the last complete transaction emitted, or the resume
    /// point given at the start.
    pub(crate) fn resume_after(&self) -> Lsn {
        self.resume_after
    }

    /// Whether a transaction is open (its Begin seen, its Commit not yet).
    pub(crate) fn in_transaction(&self) -> bool {
        self.open.is_some()
    }

    /// Type OIDs of a Relation message that are neither built in nor known.
    pub(crate) fn missing_types(&self, relation: &pgoutput::Relation<'_>) -> Vec<u32> {
        let mut missing: Vec<u32> = relation
            .columns
            .iter()
            .map(|c| c.type_oid)
            .filter(|oid| TypeKind::builtin(*oid).is_none() && !self.types.contains_key(oid))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        missing
    }

    /// Records types resolved from the catalog.
    pub(crate) fn add_types(&mut self, types: impl IntoIterator<Item = (u32, ResolvedType)>) {
        self.types.extend(types);
    }

    /// Feeds one message; returns a batch when one is complete.
    pub(crate) fn push(&mut self, message: Message<'_>) -> Result<Option<Batch>, SourceError> {
        match message {
            Message::Begin {
                final_lsn,
                commit_time,
                xid,
            } => self.begin(Lsn(final_lsn), commit_time, xid).map(|()| None),
            Message::Commit {
                commit_lsn,
                end_lsn,
                ..
            } => self.commit(Lsn(commit_lsn), end_lsn),
            Message::Origin { .. } => Ok(None),
            Message::Type {
                oid,
                namespace,
                name,
            } => {
                // Only a fallback for when the catalog no longer knows the
                // type: for a domain this names the base type, and it never
                // says whether a type is an enum or an array.
                self.stream_type_names
                    .insert(oid, qualified(namespace, name));
                Ok(None)
            }
            Message::Relation(relation) => {
                self.relation_message(&relation);
                Ok(None)
            }
            Message::Insert { relation, new } => {
                let relation = self.relation(relation)?;
                if !self.counts() {
                    return Ok(None);
                }
                let (new, bytes) = row(&relation, &new)?;
                self.add(Change::Insert { relation, new }, bytes)
            }
            Message::Update { relation, old, new } => self.update(relation, old.as_ref(), &new),
            Message::Delete { relation, old } => {
                let relation = self.relation(relation)?;
                if !self.counts() {
                    return Ok(None);
                }
                let (old, bytes) = old_row(&relation, &old)?;
                self.add(Change::Delete { relation, old }, bytes)
            }
            Message::Truncate {
                cascade,
                restart_identity,
                relations,
            } => self.truncate(&relations, cascade, restart_identity),
            Message::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => self.logical_message(transactional, Lsn(lsn), prefix, content),
        }
    }

    /// `B`: a transaction opens. One cut off by a reconnect resumes after
    /// the changes already delivered.
    fn begin(&mut self, commit_lsn: Lsn, commit_time: i64, xid: u32) -> Result<(), SourceError> {
        if self.open.is_some() {
            return Err(SourceError::Protocol(
                "Begin inside an open transaction".into(),
            ));
        }
        let mut open = Open {
            xid,
            commit_lsn,
            commit_time: commit_time.saturating_add(PG_EPOCH_OFFSET_MICROS),
            chunk: 0,
            changes: Vec::with_capacity(self.changes_reserved()),
            bytes: 0,
            seen: 0,
            skip: 0,
            // Its commit record starts before the resume point, so it also
            // ends at or before it.
            skip_all: commit_lsn < self.resume_after,
        };
        if let Some(partial) = self.partial.take() {
            if partial.commit_lsn == commit_lsn {
                open.skip = partial.delivered_changes;
                open.chunk = partial.next_chunk;
            } else {
                self.partial = Some(partial);
            }
        }
        self.open = Some(open);
        Ok(())
    }

    /// `C`: the open transaction ends; its last batch.
    fn commit(&mut self, commit_lsn: Lsn, end_lsn: u64) -> Result<Option<Batch>, SourceError> {
        let open = self
            .open
            .take()
            .ok_or_else(|| SourceError::Protocol("Commit without a transaction".into()))?;
        if commit_lsn != open.commit_lsn {
            return Err(SourceError::Protocol(format!(
                "Commit at {commit_lsn} does not match Begin's {}",
                open.commit_lsn
            )));
        }
        if open.skip_all {
            return Ok(None);
        }
        self.partial = None;
        self.resume_after = self.resume_after.max(Lsn(end_lsn));
        self.last_changes = open.changes.len();
        Ok(Some(Batch {
            txn: Txn {
                xid: open.xid,
                commit_lsn: open.commit_lsn.0,
                end_lsn,
                commit_time: open.commit_time,
                chunk: open.chunk,
                last: true,
            },
            changes: open.changes,
            bytes: open.bytes,
        }))
    }

    /// `R`: a relation's shape, replacing what came before for its OID.
    fn relation_message(&mut self, relation: &pgoutput::Relation<'_>) {
        let columns = relation
            .columns
            .iter()
            .map(|c| {
                let (type_name, kind) = self.type_of(c.type_oid);
                Column {
                    name: c.name.to_owned(),
                    type_oid: c.type_oid,
                    type_name,
                    type_modifier: c.type_modifier,
                    key: c.key,
                    kind,
                }
            })
            .collect();
        let replica_identity = match relation.replica_identity {
            pgoutput::ReplicaIdentity::Default => ReplicaIdentity::Default,
            pgoutput::ReplicaIdentity::Nothing => ReplicaIdentity::Nothing,
            pgoutput::ReplicaIdentity::Full => ReplicaIdentity::Full,
            pgoutput::ReplicaIdentity::Index => ReplicaIdentity::Index,
        };
        self.relations.insert(
            relation.oid,
            Arc::new(Relation {
                oid: relation.oid,
                schema: relation.namespace.to_owned(),
                table: relation.name.to_owned(),
                replica_identity,
                columns,
            }),
        );
    }

    /// `U`: an update, its unchanged TOAST values taken from a full old row
    /// when there is one.
    fn update(
        &mut self,
        relation: u32,
        old: Option<&OldTuple<'_>>,
        new: &Tuple<'_>,
    ) -> Result<Option<Batch>, SourceError> {
        let relation = self.relation(relation)?;
        if !self.counts() {
            return Ok(None);
        }
        let (mut new, mut bytes) = row(&relation, new)?;
        let old = match old {
            Some(old) => {
                let (old, old_bytes) = old_row(&relation, old)?;
                bytes += old_bytes;
                if !old.key_only {
                    // `docs/architecture.md`, pitfall 7: an unchanged TOAST
                    // value is taken from the full old row when there is one.
                    for (value, previous) in new.iter_mut().zip(&old.values) {
                        if *value == Value::Unchanged {
                            *value = previous.clone();
                        }
                    }
                }
                Some(old)
            }
            None => None,
        };
        self.add(Change::Update { relation, old, new }, bytes)
    }

    /// `T`: tables truncated together.
    fn truncate(
        &mut self,
        relations: &[u32],
        cascade: bool,
        restart_identity: bool,
    ) -> Result<Option<Batch>, SourceError> {
        let relations = relations
            .iter()
            .map(|oid| self.relation(*oid))
            .collect::<Result<Vec<_>, _>>()?;
        if !self.counts() {
            return Ok(None);
        }
        let bytes = 16 * relations.len();
        self.add(
            Change::Truncate {
                relations,
                cascade,
                restart_identity,
            },
            bytes,
        )
    }

    /// `M`: a logical message. A transactional one is a change of its
    /// transaction; any other is a batch of its own, resumed after like a
    /// transaction ending at its LSN.
    fn logical_message(
        &mut self,
        transactional: bool,
        lsn: Lsn,
        prefix: &str,
        content: &[u8],
    ) -> Result<Option<Batch>, SourceError> {
        let change = Change::Message {
            transactional,
            lsn,
            prefix: prefix.to_owned(),
            content: content.to_vec(),
        };
        let bytes = prefix.len() + content.len();
        if transactional {
            if !self.counts() {
                return Ok(None);
            }
            return self.add(change, bytes);
        }
        if self.open.is_some() {
            return Err(SourceError::Protocol(
                "non-transactional message inside a transaction".into(),
            ));
        }
        if lsn <= self.resume_after {
            return Ok(None);
        }
        self.resume_after = lsn;
        Ok(Some(Batch {
            txn: Txn {
                xid: 0,
                commit_lsn: lsn.0,
                end_lsn: lsn.0,
                commit_time: 0,
                chunk: 0,
                last: true,
            },
            changes: vec![change],
            bytes,
        }))
    }

    fn type_of(&self, oid: u32) -> (String, TypeKind) {
        column_type(oid, &self.types, self.stream_type_names.get(&oid))
    }

    fn relation(&self, oid: u32) -> Result<Arc<Relation>, SourceError> {
        self.relations.get(&oid).cloned().ok_or_else(|| {
            SourceError::Protocol(format!(
                "a change refers to relation {oid}, which no Relation message described"
            ))
        })
    }

    /// Counts a change of the open transaction; `false` if it is skipped.
    fn counts(&mut self) -> bool {
        let Some(open) = self.open.as_mut() else {
            return false;
        };
        open.seen += 1;
        !open.skip_all && open.seen > open.skip
    }

    fn add(&mut self, change: Change, bytes: usize) -> Result<Option<Batch>, SourceError> {
        let limits = self.limits;
        let reserved = self.changes_reserved();
        let open = self
            .open
            .as_mut()
            .ok_or_else(|| SourceError::Protocol("a change outside a transaction".into()))?;
        open.changes.push(change);
        open.bytes += bytes;
        if open.changes.len() < limits.max_rows && open.bytes < limits.max_bytes {
            return Ok(None);
        }
        let chunk = open.chunk;
        open.chunk += 1;
        let changes = std::mem::replace(&mut open.changes, Vec::with_capacity(reserved));
        self.last_changes = changes.len();
        let bytes = std::mem::take(&mut open.bytes);
        Ok(Some(Batch {
            txn: Txn {
                xid: open.xid,
                commit_lsn: open.commit_lsn.0,
                end_lsn: 0,
                commit_time: open.commit_time,
                chunk,
                last: false,
            },
            changes,
            bytes,
        }))
    }
}

/// A column type's name and how its text parses: built in, else as the
/// catalog resolved it (`types`), else an opaque type named `fallback` (or
/// by its OID). The stream and the snapshot reader name and parse alike.
pub(crate) fn column_type(
    oid: u32,
    types: &HashMap<u32, ResolvedType>,
    fallback: Option<&String>,
) -> (String, TypeKind) {
    if let Some(kind) = TypeKind::builtin(oid) {
        // A kind covers several types (int2/int4/int8 read alike): the name
        // comes from the OID.
        let name = values::builtin_name(oid)
            .map(str::to_owned)
            .unwrap_or_else(|| kind.name());
        return (name, kind);
    }
    match types.get(&oid) {
        Some(resolved) => (resolved.name.clone(), resolved.kind.clone()),
        None => {
            let name = fallback.cloned().unwrap_or_else(|| format!("oid:{oid}"));
            (name.clone(), TypeKind::Other { type_name: name })
        }
    }
}

fn qualified(namespace: &str, name: &str) -> String {
    if namespace.is_empty() || namespace == "pg_catalog" || namespace == "public" {
        name.to_owned()
    } else {
        format!("{namespace}.{name}")
    }
}

/// Rough in-memory cost of a value beyond its text: enough to bound memory.
const VALUE_OVERHEAD: usize = 24;

fn row(relation: &Relation, tuple: &Tuple<'_>) -> Result<(Vec<Value>, usize), SourceError> {
    if tuple.columns.len() != relation.columns.len() {
        return Err(SourceError::Protocol(format!(
            "a row of {}.{} has {} columns, its Relation message {}",
            relation.schema,
            relation.table,
            tuple.columns.len(),
            relation.columns.len()
        )));
    }
    let mut bytes = 0;
    // Sized up front: collecting through `Result` knows no length, and
    // grew every row's list again as it filled.
    let mut out = Vec::with_capacity(relation.columns.len());
    for (datum, column) in tuple.columns.iter().zip(&relation.columns) {
        out.push(match datum {
            Datum::Null => Value::Null,
            Datum::Unchanged => Value::Unchanged,
            Datum::Text(text) => {
                bytes += text.len() + VALUE_OVERHEAD;
                match values::parse(&column.kind, text) {
                    // Name what could not be typed after the column's own
                    // type, not the kind's generic one.
                    Value::Other { text, .. } => Value::Other {
                        type_name: column.type_name.clone(),
                        text,
                    },
                    value => value,
                }
            }
            Datum::Binary(_) => {
                return Err(SourceError::Protocol(format!(
                    "column {} arrived in binary form, which Datum does not request",
                    column.name
                )));
            }
        });
    }
    Ok((out, bytes + VALUE_OVERHEAD))
}

fn old_row(relation: &Relation, old: &OldTuple<'_>) -> Result<(OldRow, usize), SourceError> {
    let (key_only, tuple) = match old {
        OldTuple::Key(tuple) => (true, tuple),
        OldTuple::Full(tuple) => (false, tuple),
    };
    let (values, bytes) = row(relation, tuple)?;
    Ok((OldRow { key_only, values }, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::pgoutput::{RelationColumn, ReplicaIdentity as PgIdentity};

    fn relation_msg(oid: u32) -> Message<'static> {
        Message::Relation(pgoutput::Relation {
            oid,
            namespace: "public",
            name: "item",
            replica_identity: PgIdentity::Default,
            columns: vec![
                RelationColumn {
                    key: true,
                    name: "id",
                    type_oid: 23,
                    type_modifier: -1,
                },
                RelationColumn {
                    key: false,
                    name: "body",
                    type_oid: 25,
                    type_modifier: -1,
                },
            ],
        })
    }

    fn begin(lsn: u64, xid: u32) -> Message<'static> {
        Message::Begin {
            final_lsn: lsn,
            commit_time: 0,
            xid,
        }
    }

    fn commit(lsn: u64) -> Message<'static> {
        Message::Commit {
            flags: 0,
            commit_lsn: lsn,
            end_lsn: lsn + 8,
            commit_time: 0,
        }
    }

    fn insert(id: &'static str) -> Message<'static> {
        Message::Insert {
            relation: 1,
            new: Tuple {
                columns: vec![Datum::Text(id.as_bytes()), Datum::Text(b"x")],
            },
        }
    }

    fn ids(batch: &Batch) -> Vec<i64> {
        batch
            .changes
            .iter()
            .map(|c| match c {
                Change::Insert { new, .. } => match new[0] {
                    Value::Int(i) => i,
                    _ => panic!("not an int"),
                },
                _ => panic!("not an insert"),
            })
            .collect()
    }

    const IDS: [&str; 5] = ["1", "2", "3", "4", "5"];

    fn run(a: &mut Assembler, messages: Vec<Message<'static>>) -> Vec<Batch> {
        messages
            .into_iter()
            .filter_map(|m| a.push(m).expect("valid stream"))
            .collect()
    }

    fn txn(lsn: u64, xid: u32, n: usize) -> Vec<Message<'static>> {
        let mut m = vec![begin(lsn, xid), relation_msg(1)];
        m.extend(IDS[..n].iter().map(|id| insert(id)));
        m.push(commit(lsn));
        m
    }

    #[test]
    fn one_batch_per_transaction_with_typed_values() {
        let mut a = Assembler::new(BatchLimits::default(), Lsn::ZERO);
        let batches = run(&mut a, txn(100, 7, 2));
        assert_eq!(batches.len(), 1);
        let b = &batches[0];
        assert_eq!(
            b.txn,
            Txn {
                xid: 7,
                commit_lsn: 100,
                end_lsn: 108,
                commit_time: PG_EPOCH_OFFSET_MICROS,
                chunk: 0,
                last: true
            }
        );
        assert_eq!(ids(b), [1, 2]);
        assert_eq!(a.resume_after(), Lsn(108));
    }

    #[test]
    fn large_transactions_are_cut_into_ordered_chunks() {
        let limits = BatchLimits {
            max_rows: 2,
            max_bytes: usize::MAX,
        };
        let mut a = Assembler::new(limits, Lsn::ZERO);
        let batches = run(&mut a, txn(100, 7, 5));
        let shape: Vec<(u32, bool, u64, Vec<i64>)> = batches
            .iter()
            .map(|b| (b.txn.chunk, b.txn.last, b.txn.end_lsn, ids(b)))
            .collect();
        assert_eq!(
            shape,
            [
                (0, false, 0, vec![1, 2]),
                (1, false, 0, vec![3, 4]),
                (2, true, 108, vec![5])
            ]
        );
        assert!(
            batches
                .iter()
                .all(|b| b.txn.commit_lsn == 100 && b.txn.xid == 7)
        );
    }

    #[test]
    fn byte_limit_closes_a_chunk() {
        let limits = BatchLimits {
            max_rows: 1000,
            max_bytes: 1,
        };
        let mut a = Assembler::new(limits, Lsn::ZERO);
        let batches = run(&mut a, txn(100, 7, 3));
        assert_eq!(batches.len(), 4, "three full chunks and an empty last one");
        assert!(batches[3].changes.is_empty() && batches[3].txn.last);
    }

    #[test]
    fn transactions_at_or_below_the_resume_point_are_skipped() {
        // Checkpointed the end of the transaction at 100 (end 108).
        let mut a = Assembler::new(BatchLimits::default(), Lsn(108));
        let mut messages = txn(100, 7, 2);
        messages.extend(txn(200, 8, 1));
        let batches = run(&mut a, messages);
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].txn.xid, 8);
    }

    #[test]
    fn a_transaction_cut_off_by_a_reconnect_resumes_where_delivery_stopped() {
        let limits = BatchLimits {
            max_rows: 2,
            max_bytes: usize::MAX,
        };
        let mut a = Assembler::new(limits, Lsn::ZERO);
        // Chunk 0 (ids 1, 2) delivered, then the connection drops after id 3.
        let mut first = txn(100, 7, 5);
        first.truncate(5);
        let delivered = run(&mut a, first);
        assert_eq!(delivered.len(), 1);
        a.reconnected(Lsn::ZERO);
        let rest = run(&mut a, txn(100, 7, 5));
        let shape: Vec<(u32, Vec<i64>)> = rest.iter().map(|b| (b.txn.chunk, ids(b))).collect();
        assert_eq!(shape, [(1, vec![3, 4]), (2, vec![5])]);
    }

    #[test]
    fn a_second_cut_before_the_first_cut_point_forgets_nothing() {
        let limits = BatchLimits {
            max_rows: 2,
            max_bytes: usize::MAX,
        };
        let mut a = Assembler::new(limits, Lsn::ZERO);
        // Chunks 0 and 1 (ids 1-4) delivered, cut after id 5.
        let mut first = txn(100, 7, 5);
        first.truncate(7);
        assert_eq!(run(&mut a, first).len(), 2);
        a.reconnected(Lsn::ZERO);
        // Cut again after only id 2 of the resend.
        let mut second = txn(100, 7, 5);
        second.truncate(4);
        assert!(run(&mut a, second).is_empty());
        a.reconnected(Lsn::ZERO);
        let rest = run(&mut a, txn(100, 7, 5));
        let shape: Vec<(u32, Vec<i64>)> = rest.iter().map(|b| (b.txn.chunk, ids(b))).collect();
        assert_eq!(shape, [(2, vec![5])]);
    }

    #[test]
    fn unchanged_toast_is_taken_from_a_full_old_row_and_kept_otherwise() {
        let mut a = Assembler::new(BatchLimits::default(), Lsn::ZERO);
        let update = |old| Message::Update {
            relation: 1,
            old,
            new: Tuple {
                columns: vec![Datum::Text(b"1"), Datum::Unchanged],
            },
        };
        let full = OldTuple::Full(Tuple {
            columns: vec![Datum::Text(b"1"), Datum::Text(b"big")],
        });
        let batches = run(
            &mut a,
            vec![
                begin(100, 7),
                relation_msg(1),
                update(None),
                update(Some(full)),
                commit(100),
            ],
        );
        let news: Vec<Value> = batches[0]
            .changes
            .iter()
            .map(|c| match c {
                Change::Update { new, .. } => new[1].clone(),
                _ => panic!("not an update"),
            })
            .collect();
        assert_eq!(news, [Value::Unchanged, Value::Text("big".into())]);
    }

    #[test]
    fn non_transactional_messages_are_batches_of_their_own() {
        let mut a = Assembler::new(BatchLimits::default(), Lsn(50));
        let message = |lsn| Message::Message {
            transactional: false,
            lsn,
            prefix: "p",
            content: b"c",
        };
        let batches = run(&mut a, vec![message(40), message(60)]);
        assert_eq!(batches.len(), 1, "the one at 40 was already delivered");
        assert_eq!(batches[0].txn.end_lsn, 60);
        assert_eq!(batches[0].txn.xid, 0);
    }

    #[test]
    fn protocol_violations_are_errors_not_panics() {
        let mut a = Assembler::new(BatchLimits::default(), Lsn::ZERO);
        assert!(a.push(commit(1)).is_err());
        a.push(begin(1, 1)).expect("begin");
        assert!(a.push(begin(2, 2)).is_err());
        assert!(a.push(insert("1")).is_err(), "no Relation message yet");
        a.push(relation_msg(1)).expect("relation");
        let short = Message::Insert {
            relation: 1,
            new: Tuple {
                columns: vec![Datum::Text(b"1")],
            },
        };
        assert!(a.push(short).is_err());
        assert!(a.push(commit(99)).is_err(), "commit LSN mismatch");
    }
}
