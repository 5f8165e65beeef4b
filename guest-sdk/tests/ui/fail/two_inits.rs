use datum_guest::{Change, Config, Result, filter, init};

#[init]
fn first(config: Config) -> Result<()> {
    config.reject_unknown(&[])
}

#[init]
fn second(config: Config) -> Result<()> {
    config.reject_unknown(&[])
}

#[filter]
fn keep(change: &Change) -> Result<bool> {
    Ok(change.table == "users")
}

fn main() {}
