use datum_guest::{Change, Result, filter};

#[filter]
async fn keep(change: &Change) -> Result<bool> {
    Ok(change.table == "users")
}

fn main() {}
