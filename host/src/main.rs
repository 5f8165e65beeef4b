//! The `datum` binary: parse the command line, set up logging, run, and map
//! the outcome to an exit code.

mod cli;

use std::process::ExitCode;

use clap::Parser;
use datum::source::check;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::from(2);
        }
    };
    match cli.command {
        cli::Command::Check {
            url,
            publication,
            slot,
            tables,
        } => {
            let target = check::Target {
                publication,
                slot,
                tables,
            };
            match runtime.block_on(check::check_source(&url, &target)) {
                Ok(report) => {
                    print!("{report}");
                    if report.failed() {
                        ExitCode::from(1)
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(err) => {
                    eprintln!("error: {err:#}");
                    ExitCode::from(2)
                }
            }
        }
    }
}
