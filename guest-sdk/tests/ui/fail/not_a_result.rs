use datum_guest::{Change, filter};

#[filter]
fn keep(change: &Change) -> bool {
    change.table == "users"
}

fn main() {}
