//! A guest for the hot-swap tests, not an example to copy: it sets the
//! column `tag` of every new row to its configuration's `tag` (required), so
//! the output shows which version handled each batch. `tag = "refuse"` makes
//! `datum_init` fail, for tests of a configuration a module rejects.

use std::sync::OnceLock;

use datum_guest::{Change, Config, Error, Result, init, map};

static TAG: OnceLock<String> = OnceLock::new();

/// Reads `tag`.
#[init]
pub fn configure(config: Config) -> Result<()> {
    let tag: String = config.require("tag")?;
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
    change.set_column("tag", "text", tag);
    Ok(change)
}
