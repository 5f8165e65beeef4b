use datum_guest::{Change, Result, map};

#[map]
fn copy(change: &Change) -> Result<Change> {
    Ok(change.clone())
}

fn main() {}
