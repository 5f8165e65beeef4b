//! A Datum transform (`#[filter]`): keeps every change except the rows of
//! tables named `audit_log`, in any schema.
//!
//! `README.md` says how to build and test it.

use datum_guest::{Change, Result, filter};

/// The table whose row changes are dropped.
const DROPPED_TABLE: &str = "audit_log";

/// Keeps a change unless it is an insert, update, delete or snapshot row of
/// a table named `audit_log`, or a truncate of nothing but such tables: the
/// sink never got their rows, so it need not truncate them either (the
/// `postgres` sink stops at a truncate of a table the target lacks).
///
/// A truncate that names other tables as well passes whole: dropping it
/// would leave their rows in the sink, and a filter cannot edit a change.
/// Where the target has no `audit_log`, a `#[map]` that takes it out of
/// `change.truncate`'s tables does that. Logical messages always pass.
#[filter]
pub fn keep(change: &Change) -> Result<bool> {
    if change.is_row_change() {
        return Ok(change.table != DROPPED_TABLE);
    }
    Ok(match &change.truncate {
        Some(truncate) => !truncate.tables.iter().all(|t| t.table == DROPPED_TABLE),
        None => true,
    })
}

#[cfg(test)]
mod tests {
    use datum_guest::{Batch, Txn, row, testing};

    use super::*;

    #[test]
    fn drops_audit_log_rows_only() {
        let batch = Batch::new(
            Txn::committed(1, 10),
            vec![
                Change::insert("public", "users").new_row(row! { "id" => 1 }),
                Change::insert("public", "audit_log").new_row(row! { "id" => 2 }),
                Change::delete("archive", "audit_log").old_row(row! { "id" => 3 }),
                Change::truncate_tables([("public", "audit_log"), ("public", "users")]),
                Change::truncate_tables([("public", "audit_log")]),
            ],
        );
        // Runs the function the way the module does: the batch is encoded,
        // filtered, and the answer decoded as the host reads it.
        let answer = testing::run_filter(keep, &batch).expect("the filter runs");
        assert_eq!(answer.kept(), [0, 3]);
    }
}
