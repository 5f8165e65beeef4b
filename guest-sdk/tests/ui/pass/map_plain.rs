use datum_guest::{Change, map};

// Any error type that converts into `datum_guest::Error` will do.
#[map]
fn route(change: Change) -> std::result::Result<Change, String> {
    Ok(change.routed("out"))
}

fn main() {
    let change = route(datum_guest::Change::insert("s", "t")).unwrap();
    assert_eq!(change.route.as_deref(), Some("out"));
}
