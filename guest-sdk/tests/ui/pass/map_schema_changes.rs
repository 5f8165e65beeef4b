use datum_guest::{Change, Op, Result, map};

/// Sees `schema` changes too, and tags them with a route.
#[map(schema_changes)]
fn tag(change: Change) -> Result<Change> {
    if change.op == Op::Schema {
        return Ok(change.routed("schema_log"));
    }
    Ok(change)
}

fn main() {
    let change = tag(Change::new(Op::Schema, "public", "t")).unwrap();
    assert_eq!(change.route.as_deref(), Some("schema_log"));
}
