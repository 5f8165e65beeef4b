//! A Datum transform (`#[map]`): trims the whitespace around every text
//! value of each change's new row.
//!
//! `README.md` says how to build and test it.

use datum_guest::{Change, Result, Value, map};

/// Trims leading and trailing whitespace from the text values of the new row
/// (inserts, updates, snapshots). Other values, the old row, truncates and
/// messages are left as they are; a change with nothing to trim goes back to
/// the host unchanged, which costs no re-encoding.
#[map]
pub fn trim_text(mut change: Change) -> Result<Change> {
    if let Some(row) = change.new_mut() {
        for (_, value) in row.values_mut() {
            if let Value::Text(text) = value {
                let trimmed = text.trim();
                if trimmed.len() != text.len() {
                    *text = trimmed.to_owned();
                }
            }
        }
    }
    Ok(change)
}

#[cfg(test)]
mod tests {
    use datum_guest::{Batch, Output, Txn, row, testing};

    use super::*;

    #[test]
    fn trims_text_of_the_new_row() {
        let batch = Batch::new(
            Txn::committed(1, 10),
            vec![
                Change::insert("public", "users").new_row(
                    row! { "id" => 1, "name" => "  Ada Lovelace\n", "note" => Value::Null },
                ),
                Change::insert("public", "users").new_row(row! { "id" => 2, "name" => "Grace" }),
            ],
        );
        // Runs the function the way the module does: the batch is encoded,
        // mapped, and the answer decoded as the host reads it.
        let answer = testing::run_map(trim_text, &batch).expect("the map runs");
        let changes = answer.changes();
        let first = changes[0].new.as_ref().expect("an insert has a new row");
        assert_eq!(first.get_str("name"), Some("Ada Lovelace"));
        assert!(first.is_null("note"));
        // Nothing to trim: the host gets the input change back by its index.
        assert_eq!(answer.outputs[1], Output::Keep(1));
    }
}
