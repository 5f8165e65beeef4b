//! A guest for the runtime's tests, not an example to copy: it panics on the
//! row whose `id` is 3, so the tests can check that a panic reaches the host
//! as an error carrying the panic message and the change's index.

use datum_guest::{Change, Result, map};

/// Passes changes through, and panics on `id = 3`.
#[map]
pub fn panic_on_three(change: Change) -> Result<Change> {
    let id = change.new.as_ref().and_then(|row| row.get_i64("id"));
    if id == Some(3) {
        eprintln!("about to panic on id 3");
        panic!("boom on id 3");
    }
    Ok(change)
}
