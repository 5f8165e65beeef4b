//! `datum test`: a module's golden fixtures, run and compared (the runner
//! is `golden/`).

use std::path::Path;

use super::{CommandError, Outcome, Stdout};
use crate::golden::{self, Options};

/// Runs the fixtures in `fixtures` against `module`, printing each case.
pub(crate) fn command(
    module: &Path,
    fixtures: &Path,
    options: &Options,
) -> Result<Outcome, CommandError> {
    let summary = golden::run_suite(module, fixtures, options, &mut Stdout)?;
    Ok(Outcome::from_ok(summary.failed == 0))
}
