mod a {
    use datum_guest::{Change, Result, filter};

    #[filter]
    fn keep(change: &Change) -> Result<bool> {
        Ok(change.table == "users")
    }
}

mod b {
    use datum_guest::{Batch, Change, Result, transform};

    #[transform]
    fn all(batch: Batch) -> Result<Vec<Change>> {
        Ok(batch.changes)
    }
}

fn main() {}
