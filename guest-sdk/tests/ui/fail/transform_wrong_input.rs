use datum_guest::{Change, Result, transform};

#[transform]
fn all(changes: Vec<Change>) -> Result<Vec<Change>> {
    Ok(changes)
}

fn main() {}
