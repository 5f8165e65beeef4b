//! A guest for the hot-swap tests, not an example to copy: it sets the
//! column `tag` of every new row to its configuration's `tag` (required), so
//! the output shows which version handled each batch. `tag = "refuse"` makes
//! `datum_init` fail, for tests of a configuration a module rejects.
//! `spin = N` (optional) makes each change cost N million loop turns, for
//! tests of the time limit. `panic = "text"` makes `datum_init` panic with
//! that text.

use std::sync::OnceLock;

use datum_guest::{Change, Config, Error, Result, init, map};

static TAG: OnceLock<String> = OnceLock::new();
static SPIN: OnceLock<u64> = OnceLock::new();

/// Reads `tag`.
#[init]
pub fn configure(config: Config) -> Result<()> {
    let tag: String = config.require("tag")?;
    let spin: Option<i64> = config.get("spin")?;
    if let Some(text) = config.get::<String>("panic")? {
        panic!("{text}");
    }
    let _ = SPIN.set(spin.unwrap_or(0).max(0) as u64 * 1_000_000);
    if tag == "refuse" {
        return Err(Error::new("tag = \"refuse\": refusing, as asked"));
    }
    TAG.set(tag)
        .map_err(|_| Error::new("tagger is configured twice"))
}

/// Stamps the tag.
#[map]
pub fn tag(mut change: Change) -> Result<Change> {
    let tag = TAG.get().cloned().unwrap_or_default();
    let mut turns = 0u64;
    while turns < SPIN.get().copied().unwrap_or(0) {
        turns = std::hint::black_box(turns + 1);
    }
    change.set_column("tag", "text", tag);
    Ok(change)
}
