//! `datum check`: what the source database must provide, one requirement at
//! a time, each failure with what to do (the checks are
//! `source/check.rs`'s).

use super::{CommandError, Outcome, block_on, say};
use crate::source::check::{Target, check_source};

/// Checks the database at `url` for `target`; prints the report.
pub(crate) fn command(url: &str, target: &Target) -> Result<Outcome, CommandError> {
    let report = block_on(check_source(url, target))?.map_err(CommandError::Check)?;
    say(&report.to_string());
    Ok(Outcome::from_ok(!report.failed()))
}
