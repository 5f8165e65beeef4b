use datum_guest::{Change, Result, map};

#[map]
fn tag<T: Default>(change: Change) -> Result<Change> {
    let _ = T::default();
    Ok(change)
}

fn main() {}
