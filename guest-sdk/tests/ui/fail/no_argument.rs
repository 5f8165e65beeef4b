use datum_guest::{Result, filter};

#[filter]
fn keep() -> Result<bool> {
    Ok(true)
}

fn main() {}
