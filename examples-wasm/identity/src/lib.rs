//! `identity`: keeps every change unchanged.
//!
//! The benchmark baseline for the transform path: it answers `[0, 1, ...,
//! n-1]` from a [`LazyBatch`], which splits the batch into changes without
//! decoding any, so the module's cost is the ABI's own.

use datum_guest::{LazyBatch, Output, Result, transform};

/// Keeps every change of the batch, by index.
#[transform]
pub fn identity(batch: LazyBatch) -> Result<Vec<Output>> {
    Ok(batch.keep_all())
}

#[cfg(test)]
mod tests {
    use datum_guest::{Batch, Change, Txn, row, testing};

    use super::identity;

    #[test]
    fn keeps_every_change_in_order() {
        let batch = Batch::new(
            Txn::committed(1, 10),
            vec![
                Change::insert("public", "a").new_row(row! { "id" => 1 }),
                Change::truncate_tables([("public", "a")]),
                Change::logical_message("p", b"x".to_vec(), false),
            ],
        );
        let answer = testing::run_transform(identity, &batch).expect("identity");
        assert_eq!(answer.kept(), [0, 1, 2]);
        assert_eq!(answer.changes(), batch.changes);
    }

    #[test]
    fn an_empty_batch_stays_empty() {
        let answer = testing::run_transform(identity, &Batch::new(Txn::default(), vec![]))
            .expect("identity");
        assert!(answer.outputs.is_empty());
    }
}
