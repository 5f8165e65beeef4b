use datum_guest::{LazyBatch, Output, Result, transform};

#[transform]
fn identity(batch: LazyBatch) -> Result<Vec<Output>> {
    Ok(batch.keep_all())
}

fn main() {
    let batch = datum_guest::Batch::new(datum_guest::Txn::default(), vec![]);
    let lazy = LazyBatch::from_batch(&batch).unwrap();
    assert!(identity(lazy).unwrap().is_empty());
}
