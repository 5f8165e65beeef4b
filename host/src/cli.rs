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
    /// Check that a source database can feed a pipeline: server version,
    /// wal_level, replication privilege, encoding, tables and their replica
    /// identity, publication coverage, slot state. Exits 1 if a requirement
    /// fails.
    Check {
        /// Connection string: a postgres:// URL or libpq key=value pairs.
        /// A password is better given in PGPASSWORD than on the command line.
        url: String,
        /// The publication the pipeline reads.
        #[arg(long)]
        publication: Option<String>,
        /// The replication slot the pipeline reads.
        #[arg(long)]
        slot: Option<String>,
        /// Tables the pipeline needs, `schema.table` or `table` (in public).
        #[arg(long, value_delimiter = ',', num_args = 1..)]
        tables: Vec<String>,
    },
}
