//! A Datum transform (`#[flat_map]`): sends every insert on twice, the
//! second time to the `audit` route.
//!
//! `README.md` says how to build and test it.

use datum_guest::{Change, Op, Result, flat_map};

/// The route the copies of inserts take.
const AUDIT_ROUTE: &str = "audit";

/// Answers each insert with itself and a copy whose `route` is `audit`;
/// every other change passes once, as it is.
#[flat_map]
pub fn copy_inserts(change: Change) -> Result<Vec<Change>> {
    if change.op == Op::Insert {
        let copy = change.clone().routed(AUDIT_ROUTE);
        Ok(vec![change, copy])
    } else {
        Ok(vec![change])
    }
}

#[cfg(test)]
mod tests {
    use datum_guest::{Batch, Txn, row, testing};

    use super::*;

    #[test]
    fn inserts_are_copied_to_the_audit_route() {
        let batch = Batch::new(
            Txn::committed(1, 10),
            vec![
                Change::insert("public", "users").new_row(row! { "id" => 1 }),
                Change::delete("public", "users").old_row(row! { "id" => 1 }),
            ],
        );
        // Runs the function the way the module does: the batch is encoded,
        // expanded, and the answer decoded as the host reads it.
        let answer = testing::run_flat_map(copy_inserts, &batch).expect("the flat map runs");
        let routes: Vec<_> = answer
            .changes()
            .iter()
            .map(|c| (c.op, c.route.clone()))
            .collect();
        assert_eq!(
            routes,
            [
                (Op::Insert, None),
                (Op::Insert, Some(AUDIT_ROUTE.to_owned())),
                (Op::Delete, None),
            ]
        );
        // The unchanged changes go back to the host as indexes.
        assert_eq!(answer.kept(), [0, 1]);
    }
}
