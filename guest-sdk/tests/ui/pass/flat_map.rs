use datum_guest::{Change, Result, flat_map, row};

#[flat_map]
fn with_audit(change: Change) -> Result<Vec<Change>> {
    let audit = Change::insert("public", "audit").new_row(row! { "table" => change.table.clone() });
    Ok(vec![change, audit])
}

fn main() {
    assert_eq!(with_audit(Change::delete("s", "t")).unwrap().len(), 2);
}
