use datum_guest::{Batch, Change, Result, transform};

#[transform]
fn reverse(batch: Batch) -> Result<Vec<Change>> {
    let mut changes = batch.changes;
    changes.reverse();
    Ok(changes)
}

fn main() {
    let batch = Batch::new(datum_guest::Txn::default(), vec![Change::insert("s", "a")]);
    assert_eq!(reverse(batch).unwrap().len(), 1);
}
