//! The command line: parsing only. What each command does lives in the
//! library; `main` maps the outcome to an exit code.

use clap::{Parser, Subcommand};

/// Stream PostgreSQL changes through WebAssembly transforms.
#[derive(Debug, Parser)]
#[command(name = "datum", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run everything on a throwaway local PostgreSQL (not built yet).
    Demo,
}
