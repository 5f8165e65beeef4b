//! A Datum transform (`#[transform]`): passes every change on, and ends each
//! batch with a logical message that counts its row changes per table.
//!
//! `README.md` says how to build and test it.

use std::collections::BTreeMap;

use datum_guest::{Batch, Change, Output, Result, transform};

/// The prefix of the message this module adds.
pub const PREFIX: &str = "row_counts";

/// Keeps the batch's changes in order, then adds a transactional logical
/// message with prefix `row_counts` whose content counts the row changes of
/// each table, such as `public.orders=2 public.users=1`. A batch without row
/// changes gets no message. A large transaction arrives in several batches,
/// each counted on its own.
#[transform]
pub fn count_rows(batch: Batch) -> Result<Vec<Output>> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for change in batch.changes.iter().filter(|c| c.is_row_change()) {
        *counts.entry(change.qualified_table()).or_default() += 1;
    }
    // Every input change, unchanged: the host is answered with indexes only.
    let mut output: Vec<Output> = (0..batch.changes.len())
        .map(|i| Output::Keep(i as u32))
        .collect();
    if !counts.is_empty() {
        let content: Vec<String> = counts
            .iter()
            .map(|(table, n)| format!("{table}={n}"))
            .collect();
        let message = Change::logical_message(PREFIX, content.join(" "), true);
        output.push(Output::Change(Box::new(message)));
    }
    Ok(output)
}

#[cfg(test)]
mod tests {
    use datum_guest::{Txn, row, testing};

    use super::*;

    #[test]
    fn counts_row_changes_per_table() {
        let batch = Batch::new(
            Txn::committed(1, 10),
            vec![
                Change::insert("public", "users").new_row(row! { "id" => 1 }),
                Change::insert("public", "orders").new_row(row! { "id" => 7 }),
                Change::update("public", "users").new_row(row! { "id" => 1 }),
            ],
        );
        // Runs the function the way the module does: the batch is encoded,
        // transformed, and the answer decoded as the host reads it.
        let answer = testing::run_transform(count_rows, &batch).expect("the transform runs");
        assert_eq!(answer.kept(), [0, 1, 2]);
        let changes = answer.changes();
        let message = changes[3].message.as_ref().expect("a logical message");
        assert_eq!(message.prefix, PREFIX);
        assert_eq!(message.content, b"public.orders=1 public.users=2");
    }

    #[test]
    fn a_batch_without_rows_gets_no_message() {
        let batch = Batch::new(
            Txn::committed(1, 10),
            vec![Change::logical_message("app", "hello", true)],
        );
        let answer = testing::run_transform(count_rows, &batch).expect("the transform runs");
        assert_eq!(answer.kept(), [0]);
        assert_eq!(answer.outputs.len(), 1);
    }
}
