use datum_guest::{Change, Result, filter};

#[filter]
fn keep(change: &mut Change) -> Result<bool> {
    change.route = None;
    Ok(true)
}

fn main() {}
