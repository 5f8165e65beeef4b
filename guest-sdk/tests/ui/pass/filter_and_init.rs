use std::sync::OnceLock;

use datum_guest::{Change, Config, Result, filter, init};

static TABLE: OnceLock<String> = OnceLock::new();

#[init]
fn setup(config: Config) -> Result<()> {
    let table: String = config.require("table")?;
    TABLE.set(table).map_err(|_| "initialised twice")?;
    Ok(())
}

/// Doc comments and other attributes stay on the function.
#[filter]
#[inline]
pub fn keep(change: &Change) -> Result<bool> {
    Ok(TABLE.get().is_some_and(|t| *t == change.table))
}

fn main() {
    let config = Config::from_json(serde_json::json!({"table": "users"}));
    setup(config).unwrap();
    assert!(keep(&Change::insert("public", "users")).unwrap());
    assert!(!keep(&Change::insert("public", "audit")).unwrap());
}
