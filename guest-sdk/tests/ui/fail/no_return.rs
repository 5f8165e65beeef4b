use datum_guest::{Change, filter};

#[filter]
fn keep(change: &Change) {
    let _ = change;
}

fn main() {}
