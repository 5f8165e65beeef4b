use datum_guest::{Result, init};

#[init]
fn setup(config: String) -> Result<()> {
    let _ = config;
    Ok(())
}

fn main() {}
