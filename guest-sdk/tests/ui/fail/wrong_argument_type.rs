use datum_guest::{Result, Row, filter};

#[filter]
fn keep(row: &Row) -> Result<bool> {
    Ok(row.contains("id"))
}

fn main() {}
