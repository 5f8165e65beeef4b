//! Table shapes: telling downstream when a table's shape changes, and
//! remembering what it was told across restarts.
//!
//! Owns the [`Tracker`], which walks each batch in stream order (live
//! changes and the snapshot rows placed among them) and puts a `schema`
//! change before the first change of a table whose shape differs from the
//! one shown before, with the DDL statements captured for the table since
//! (`source/ddl.rs`); and [`Shapes`], the memory of shown shapes across
//! restarts. The tracker starts from the shapes the state file kept for the
//! pipeline, so a column added while the host was down is still reported,
//! before the first row of the new shape. Every shape it shows for the first
//! time — a schema change, or a table seen for the first time — is recorded
//! under its transaction's commit LSN; the commit loop writes those at or
//! below a checkpoint in the same commit as the checkpoint
//! (`docs/schema.md`), so the state file's shapes are always the ones the
//! delivered stream described up to its position: a crash before the
//! checkpoint shows the change again on replay, never loses it.
//!
//! A snapshot row's relation is described from the catalog as the stream
//! would describe it, except that a table whose replica identity has no
//! key is given the key the copy walks along, and a copy may read a table
//! while its replica identity changes: snapshot rows are compared by name
//! and columns only.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use super::ddl::DDL_PREFIX;
use crate::event::{Batch, Change, Lsn, Relation};

/// Shapes shown for the first time, by the commit LSN of the transaction
/// that showed them, each with whether it was a snapshot's description.
type Pending = BTreeMap<Lsn, Vec<(Arc<Relation>, bool)>>;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Shapes {
    /// What the state file held when the pipeline started, each with
    /// whether it was a snapshot's description.
    known: Vec<(Arc<Relation>, bool)>,
    /// Shapes first shown by the transaction committing at the key, not yet
    /// in a checkpoint.
    pending: Mutex<Pending>,
}

impl Shapes {
    /// Shapes starting from those the state file kept.
    pub(crate) fn new(known: Vec<(Relation, bool)>) -> Arc<Shapes> {
        Arc::new(Shapes {
            known: known
                .into_iter()
                .map(|(relation, from_snapshot)| (Arc::new(relation), from_snapshot))
                .collect(),
            pending: Mutex::default(),
        })
    }

    /// The shapes the pipeline started from.
    pub(crate) fn known(&self) -> &[(Arc<Relation>, bool)] {
        &self.known
    }

    /// `relation` (a snapshot's description when `from_snapshot`) was
    /// shown downstream by the transaction committing at `commit_lsn`.
    pub(crate) fn shown(&self, commit_lsn: Lsn, relation: Arc<Relation>, from_snapshot: bool) {
        self.lock()
            .entry(commit_lsn)
            .or_default()
            .push((relation, from_snapshot));
    }

    /// The shapes to keep with a checkpoint at `end_lsn`: those shown by
    /// transactions that committed before it, the latest per table.
    pub(crate) fn upto(&self, end_lsn: Lsn) -> Vec<(Arc<Relation>, bool)> {
        let pending = self.lock();
        let mut latest: BTreeMap<u32, (Arc<Relation>, bool)> = BTreeMap::new();
        for (relation, from_snapshot) in pending.range(..end_lsn).flat_map(|(_, r)| r) {
            latest.insert(relation.oid, (relation.clone(), *from_snapshot));
        }
        latest.into_values().collect()
    }

    /// A checkpoint at `end_lsn` is durable with its shapes.
    pub(crate) fn committed(&self, end_lsn: Lsn) {
        let mut pending = self.lock();
        let rest = pending.split_off(&end_lsn);
        *pending = rest;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The shape last shown of one table.
#[derive(Debug)]
struct Shown {
    relation: Arc<Relation>,
    /// It came from a snapshot row: key flags and replica identity are not
    /// the stream's, and a live change that differs only in those is the
    /// same shape.
    from_snapshot: bool,
    /// Other relations of the table found to be the same shape (each
    /// snapshot chunk describes its table anew): compared by address.
    same: Vec<Arc<Relation>>,
}

/// Most relations remembered per table as the same shape.
const SAME_KEPT: usize = 4;

/// Most captured statements waiting for a schema change (DDL that changes
/// no table's shape, such as `CREATE INDEX`, waits forever).
const DDL_KEPT: usize = 256;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    shown: HashMap<u32, Shown>,
    /// The relation of the last change checked, to skip the lookup for a
    /// run of changes of one table.
    last: Option<Arc<Relation>>,
    /// DDL statements captured and not yet attached to a schema change, by
    /// the OID of the object they changed; the oldest are forgotten first.
    ddl: VecDeque<(u32, String)>,
    /// Where shapes shown for the first time are recorded for the state file.
    shapes: Option<Arc<Shapes>>,
}

impl Tracker {
    /// A tracker that starts from the shapes of `shapes` (what the state
    /// file kept) and records there each shape shown for the first time;
    /// with `None`, from nothing and for this process only.
    pub(crate) fn new(shapes: Option<Arc<Shapes>>) -> Tracker {
        let mut shown = HashMap::new();
        for (relation, from_snapshot) in shapes.iter().flat_map(|s| s.known()) {
            shown.insert(
                relation.oid,
                Shown {
                    relation: relation.clone(),
                    from_snapshot: *from_snapshot,
                    same: Vec::new(),
                },
            );
        }
        Tracker {
            shown,
            shapes,
            ..Tracker::default()
        }
    }

    /// Puts a `schema` change before each change of `batch` whose table's
    /// shape differs from the one shown before, and notes captured DDL; how
    /// many schema changes it put in.
    pub(crate) fn observe(&mut self, batch: &mut Batch) -> usize {
        let commit_lsn = Lsn(batch.txn.commit_lsn);
        let mut inserted: Vec<(usize, Change)> = Vec::new();
        for (index, change) in batch.changes.iter().enumerate() {
            match change {
                Change::Insert { relation, .. }
                | Change::Update { relation, .. }
                | Change::Delete { relation, .. } => {
                    if let Some(schema) = self.check(relation, false, commit_lsn) {
                        inserted.push((index, schema));
                    }
                }
                Change::Snapshot { relation, .. } => {
                    if let Some(schema) = self.check(relation, true, commit_lsn) {
                        inserted.push((index, schema));
                    }
                }
                Change::Truncate { relations, .. } => {
                    for relation in relations {
                        if let Some(schema) = self.check(relation, false, commit_lsn) {
                            inserted.push((index, schema));
                        }
                    }
                }
                Change::Message {
                    transactional: true,
                    prefix,
                    content,
                    ..
                } if prefix == DDL_PREFIX => self.captured_ddl(content),
                Change::Message { .. } | Change::Schema { .. } => {}
            }
        }
        if inserted.is_empty() {
            return 0;
        }
        let announced = inserted.len();
        let changes = std::mem::take(&mut batch.changes);
        let mut out = Vec::with_capacity(changes.len() + inserted.len());
        let mut inserted = inserted.into_iter().peekable();
        for (index, change) in changes.into_iter().enumerate() {
            while let Some((_, schema)) = inserted.next_if(|(at, _)| *at == index) {
                batch.bytes += 64;
                out.push(schema);
            }
            out.push(change);
        }
        batch.changes = out;
        announced
    }

    /// A schema change when `relation` is not the shape shown before.
    fn check(
        &mut self,
        relation: &Arc<Relation>,
        snapshot: bool,
        commit_lsn: Lsn,
    ) -> Option<Change> {
        if self
            .last
            .as_ref()
            .is_some_and(|last| Arc::ptr_eq(last, relation))
        {
            return None;
        }
        self.last = Some(relation.clone());
        let Some(shown) = self.shown.get_mut(&relation.oid) else {
            self.shown.insert(
                relation.oid,
                Shown {
                    relation: relation.clone(),
                    from_snapshot: snapshot,
                    same: Vec::new(),
                },
            );
            self.record(commit_lsn, relation, snapshot);
            return None;
        };
        if Arc::ptr_eq(&shown.relation, relation)
            || shown.same.iter().any(|s| Arc::ptr_eq(s, relation))
        {
            return None;
        }
        let same = if snapshot || shown.from_snapshot {
            shown.relation.same_columns(relation)
        } else {
            shown.relation.same_shape(relation)
        };
        if same {
            if shown.from_snapshot && !snapshot {
                // The stream's own description replaces the copy's, here
                // and in the state file.
                shown.relation = relation.clone();
                shown.from_snapshot = false;
                shown.same.clear();
                self.record(commit_lsn, relation, false);
            } else {
                if shown.same.len() >= SAME_KEPT {
                    shown.same.remove(0);
                }
                shown.same.push(relation.clone());
            }
            return None;
        }
        let before = std::mem::replace(&mut shown.relation, relation.clone());
        shown.from_snapshot = snapshot;
        shown.same.clear();
        self.record(commit_lsn, relation, snapshot);
        let mut ddl: Vec<String> = Vec::new();
        self.ddl.retain(|(oid, statement)| {
            if *oid != relation.oid {
                return true;
            }
            // One statement can report several commands (a dropped column
            // is an ALTER TABLE and a dropped object).
            if ddl.last() != Some(statement) {
                ddl.push(statement.clone());
            }
            false
        });
        Some(Change::Schema {
            relation: relation.clone(),
            before,
            ddl,
        })
    }

    fn record(&self, commit_lsn: Lsn, relation: &Arc<Relation>, from_snapshot: bool) {
        if let Some(shapes) = &self.shapes {
            shapes.shown(commit_lsn, relation.clone(), from_snapshot);
        }
    }

    /// A captured DDL statement (`{"objid": OID, "statement": TEXT, ...}`),
    /// kept for the schema change of the table it changed. Content that
    /// does not read so is left alone: the message still goes downstream.
    fn captured_ddl(&mut self, content: &[u8]) {
        #[derive(serde::Deserialize)]
        struct Captured {
            objid: serde_json::Value,
            statement: String,
        }
        let Ok(captured) = serde_json::from_slice::<Captured>(content) else {
            return;
        };
        // A number from Datum's trigger; text from one written by hand.
        let objid = match &captured.objid {
            serde_json::Value::Number(n) => n.as_u64(),
            serde_json::Value::String(s) => s.parse().ok(),
            _ => None,
        };
        if let Some(objid) = objid.and_then(|o| u32::try_from(o).ok()) {
            if self.ddl.len() >= DDL_KEPT {
                self.ddl.pop_front();
            }
            self.ddl.push_back((objid, captured.statement));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Column, ReplicaIdentity};
    use datum_guest::{Txn, Value};

    /// `public.item` (OID 7) with `columns` as `(name, type, key)`.
    fn item(columns: &[(&str, &str, bool)]) -> Arc<Relation> {
        Arc::new(Relation {
            oid: 7,
            schema: "public".into(),
            table: "item".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: columns
                .iter()
                .map(|(name, type_name, key)| Column::new(name, type_name, *key))
                .collect(),
        })
    }

    fn insert(relation: &Arc<Relation>) -> Change {
        Change::Insert {
            relation: relation.clone(),
            new: relation.columns.iter().map(|_| Value::Null).collect(),
        }
    }

    fn snapshot(relation: &Arc<Relation>) -> Change {
        Change::Snapshot {
            relation: relation.clone(),
            new: relation.columns.iter().map(|_| Value::Null).collect(),
        }
    }

    fn batch(commit_lsn: u64, changes: Vec<Change>) -> Batch {
        Batch {
            txn: Txn::committed(1, commit_lsn),
            changes,
            bytes: 0,
        }
    }

    fn ops(batch: &Batch) -> Vec<&'static str> {
        batch
            .changes
            .iter()
            .map(|c| match c {
                Change::Insert { .. } => "insert",
                Change::Snapshot { .. } => "snapshot",
                Change::Schema { .. } => "schema",
                Change::Message { .. } => "message",
                _ => "other",
            })
            .collect()
    }

    #[test]
    fn a_new_shape_gets_a_schema_change_before_its_first_change() {
        let shapes = Shapes::new(Vec::new());
        let mut tracker = Tracker::new(Some(shapes.clone()));
        let v1 = item(&[("id", "int4", true), ("body", "text", false)]);
        // First sight: nothing to compare with, but kept for the state file.
        let mut first = batch(100, vec![insert(&v1)]);
        tracker.observe(&mut first);
        assert_eq!(ops(&first), ["insert"]);
        assert_eq!(shapes.upto(Lsn(101)).len(), 1);
        // The same shape described again (a reconnect): nothing.
        let again = item(&[("id", "int4", true), ("body", "text", false)]);
        let mut second = batch(200, vec![insert(&again)]);
        tracker.observe(&mut second);
        assert_eq!(ops(&second), ["insert"]);
        // A new shape between two rows of one transaction, its DDL captured
        // (reported twice, listed once).
        let v2 = item(&[
            ("id", "int4", true),
            ("body", "varchar", false),
            ("note", "text", false),
        ]);
        let ddl = |statement: &str| Change::Message {
            transactional: true,
            lsn: Lsn(290),
            prefix: DDL_PREFIX.into(),
            content: format!(
                r#"{{"objid": 7, "command": "ALTER TABLE", "statement": "{statement}"}}"#
            )
            .into_bytes(),
        };
        let mut third = batch(
            300,
            vec![
                insert(&again),
                ddl("ALTER TABLE item ADD note text"),
                ddl("ALTER TABLE item ADD note text"),
                insert(&v2),
                insert(&v2),
            ],
        );
        tracker.observe(&mut third);
        assert_eq!(
            ops(&third),
            ["insert", "message", "message", "schema", "insert", "insert"]
        );
        let Change::Schema {
            relation,
            before,
            ddl,
        } = &third.changes[3]
        else {
            panic!("not a schema change");
        };
        assert_eq!((before.columns.len(), relation.columns.len()), (2, 3));
        assert_eq!(ddl, &["ALTER TABLE item ADD note text".to_owned()]);
        let kept = shapes.upto(Lsn(301));
        assert_eq!(kept.len(), 1);
        assert_eq!(
            kept[0].0.columns.len(),
            3,
            "the newest shape is the one to keep"
        );
    }

    #[test]
    fn a_restart_compares_with_the_shapes_the_state_file_kept() {
        let kept = item(&[("id", "int4", true)]);
        let mut tracker = Tracker::new(Some(Shapes::new(vec![((*kept).clone(), false)])));
        let altered = item(&[("id", "int4", true), ("note", "text", false)]);
        let mut first = batch(100, vec![insert(&altered)]);
        tracker.observe(&mut first);
        assert_eq!(ops(&first), ["schema", "insert"]);
    }

    #[test]
    fn snapshot_rows_are_compared_by_their_columns_only() {
        let mut tracker = Tracker::new(None);
        let live = item(&[("id", "int4", false), ("code", "text", false)]);
        // A copy of a table without a replica identity key flags the key it
        // walks along: the same shape.
        let chunk = item(&[("id", "int4", false), ("code", "text", true)]);
        let mut b = batch(100, vec![insert(&live), snapshot(&chunk), insert(&live)]);
        tracker.observe(&mut b);
        assert_eq!(ops(&b), ["insert", "snapshot", "insert"]);
        // A chunk read after a column was added, before any live change
        // told of it: announced before the chunk's rows.
        let wider = item(&[
            ("id", "int4", false),
            ("code", "text", true),
            ("n", "int8", false),
        ]);
        let mut b = batch(200, vec![snapshot(&wider), snapshot(&wider)]);
        tracker.observe(&mut b);
        assert_eq!(ops(&b), ["schema", "snapshot", "snapshot"]);
        // The live description of that shape, with the stream's key flags:
        // no second announcement.
        let wider_live = item(&[
            ("id", "int4", false),
            ("code", "text", false),
            ("n", "int8", false),
        ]);
        let mut b = batch(
            300,
            vec![insert(&wider_live), snapshot(&wider), insert(&wider_live)],
        );
        tracker.observe(&mut b);
        assert_eq!(ops(&b), ["insert", "snapshot", "insert"]);
        // And a key change the stream makes is one.
        let keyed = item(&[
            ("id", "int4", true),
            ("code", "text", false),
            ("n", "int8", false),
        ]);
        let mut b = batch(400, vec![insert(&keyed)]);
        tracker.observe(&mut b);
        assert_eq!(ops(&b), ["schema", "insert"]);
    }

    fn relation(oid: u32, columns: &[&str]) -> Arc<Relation> {
        Arc::new(Relation {
            oid,
            schema: "public".into(),
            table: format!("t{oid}"),
            replica_identity: ReplicaIdentity::Default,
            columns: columns
                .iter()
                .map(|c| crate::event::Column::new(c, "int4", false))
                .collect(),
        })
    }

    #[test]
    fn a_checkpoint_keeps_the_latest_shape_of_each_table_committed_before_it() {
        let shapes = Shapes::new(Vec::new());
        shapes.shown(Lsn(10), relation(1, &["a"]), false);
        shapes.shown(Lsn(20), relation(1, &["a", "b"]), false);
        shapes.shown(Lsn(20), relation(2, &["x"]), true);
        shapes.shown(Lsn(30), relation(1, &["a", "b", "c"]), false);
        // A checkpoint at 20 is the end of a transaction that committed
        // before 20: the one at 20 is not in it.
        let upto: Vec<usize> = shapes
            .upto(Lsn(20))
            .iter()
            .map(|(r, _)| r.columns.len())
            .collect();
        assert_eq!(upto, [1]);
        let upto: Vec<(u32, usize, bool)> = shapes
            .upto(Lsn(25))
            .iter()
            .map(|(r, snapshot)| (r.oid, r.columns.len(), *snapshot))
            .collect();
        assert_eq!(upto, [(1, 2, false), (2, 1, true)]);
        shapes.committed(Lsn(25));
        let rest: Vec<usize> = shapes
            .upto(Lsn(100))
            .iter()
            .map(|(r, _)| r.columns.len())
            .collect();
        assert_eq!(rest, [3], "only what the checkpoint did not cover is left");
    }
}
