use datum_guest::{Change, Result, map};

#[map]
fn merge(a: Change, b: Change) -> Result<Change> {
    let _ = b;
    Ok(a)
}

fn main() {}
