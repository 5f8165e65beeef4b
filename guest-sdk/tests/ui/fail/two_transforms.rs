use datum_guest::{Change, Result, filter, map};

#[filter]
fn keep(change: &Change) -> Result<bool> {
    Ok(change.table == "users")
}

#[map]
fn route(change: Change) -> Result<Change> {
    Ok(change.routed("out"))
}

fn main() {}
