//! The table shapes downstream has been told of, and which of them the
//! next checkpoint must keep.
//!
//! Owns the memory of schema changes across restarts: the assembler starts
//! from the shapes the state file kept for the pipeline (so a column added
//! while the host was down is still reported, before the first row of the
//! new shape), and every shape it shows for the first time — a schema
//! change, or a table seen for the first time — is recorded here under its
//! transaction's commit LSN. The commit loop writes those at or below a
//! checkpoint in the same commit as the checkpoint (`docs/schema.md`), so
//! the state file's shapes are always the ones the delivered stream
//! described up to its position: a crash before the checkpoint shows the
//! change again on replay, never loses it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::event::{Lsn, Relation};

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Shapes {
    /// What the state file held when the pipeline started.
    known: Vec<Arc<Relation>>,
    /// Shapes first shown by the transaction committing at the key, not yet
    /// in a checkpoint.
    pending: Mutex<BTreeMap<Lsn, Vec<Arc<Relation>>>>,
}

impl Shapes {
    /// Shapes starting from those the state file kept.
    pub fn new(known: Vec<Relation>) -> Arc<Shapes> {
        Arc::new(Shapes {
            known: known.into_iter().map(Arc::new).collect(),
            pending: Mutex::default(),
        })
    }

    /// The shapes the pipeline started from.
    pub(crate) fn known(&self) -> &[Arc<Relation>] {
        &self.known
    }

    /// `relation` was shown downstream by the transaction committing at
    /// `commit_lsn`.
    pub(crate) fn shown(&self, commit_lsn: Lsn, relation: Arc<Relation>) {
        self.lock().entry(commit_lsn).or_default().push(relation);
    }

    /// The shapes to keep with a checkpoint at `end_lsn`: those shown by
    /// transactions that committed before it, the latest per table.
    pub(crate) fn upto(&self, end_lsn: Lsn) -> Vec<Arc<Relation>> {
        let pending = self.lock();
        let mut latest: BTreeMap<u32, Arc<Relation>> = BTreeMap::new();
        for relation in pending.range(..end_lsn).flat_map(|(_, r)| r) {
            latest.insert(relation.oid, relation.clone());
        }
        latest.into_values().collect()
    }

    /// A checkpoint at `end_lsn` is durable with its shapes.
    pub(crate) fn committed(&self, end_lsn: Lsn) {
        let mut pending = self.lock();
        let rest = pending.split_off(&end_lsn);
        *pending = rest;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Lsn, Vec<Arc<Relation>>>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::ReplicaIdentity;

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
        shapes.shown(Lsn(10), relation(1, &["a"]));
        shapes.shown(Lsn(20), relation(1, &["a", "b"]));
        shapes.shown(Lsn(20), relation(2, &["x"]));
        shapes.shown(Lsn(30), relation(1, &["a", "b", "c"]));
        // A checkpoint at 20 is the end of a transaction that committed
        // before 20: the one at 20 is not in it.
        let upto: Vec<usize> = shapes
            .upto(Lsn(20))
            .iter()
            .map(|r| r.columns.len())
            .collect();
        assert_eq!(upto, [1]);
        let upto: Vec<(u32, usize)> = shapes
            .upto(Lsn(25))
            .iter()
            .map(|r| (r.oid, r.columns.len()))
            .collect();
        assert_eq!(upto, [(1, 2), (2, 1)]);
        shapes.committed(Lsn(25));
        let rest: Vec<usize> = shapes
            .upto(Lsn(100))
            .iter()
            .map(|r| r.columns.len())
            .collect();
        assert_eq!(rest, [3], "only what the checkpoint did not cover is left");
    }
}
