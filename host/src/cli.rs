//! The command line: parsing only. What each command does lives in the
//! library; `main` maps the outcome to an exit code.

use clap::Parser;

/// Stream PostgreSQL changes through WebAssembly transforms.
///
/// The commands (`run`, `test`, `new`, `check`, `demo`) arrive with the issues
/// that build them.
#[derive(Debug, Parser)]
#[command(name = "datum", version, about)]
pub struct Cli {}
