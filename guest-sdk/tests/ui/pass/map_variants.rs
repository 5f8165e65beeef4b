mod masking {
    use datum_guest::{Change, Result, map};

    #[map]
    pub fn mask(mut change: Change) -> Result<Option<Change>> {
        if change.table == "secrets" {
            return Ok(None);
        }
        for row in change.rows_mut() {
            row.set("email", "***");
        }
        Ok(Some(change))
    }
}

fn main() {
    let change = datum_guest::Change::insert("public", "users");
    assert!(masking::mask(change).unwrap().is_some());
}
