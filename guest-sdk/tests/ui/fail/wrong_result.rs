use datum_guest::{Change, Result, filter};

#[filter]
fn keep(change: &Change) -> Result<String> {
    Ok(change.table.clone())
}

fn main() {}
