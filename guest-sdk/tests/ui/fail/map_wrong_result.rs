use datum_guest::{Change, Result, map};

#[map]
fn split(change: Change) -> Result<Vec<Change>> {
    Ok(vec![change])
}

fn main() {}
