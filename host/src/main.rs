//! The `datum` binary: parse the command line, set up logging, run the
//! command, and map how it ended to an exit code (0 success, 1 a check, test
//! or pipeline failed, 2 the command could not do its work).

use std::process::ExitCode;

use clap::Parser;
use datum::{Cli, Command, CommandOutcome, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    logs(&cli);
    let outcome = datum::dispatch(cli.command);
    if datum::stdout_closed() {
        // The reader of standard output went away (`datum … | head`): end
        // quietly, as a filter does.
        return ExitCode::SUCCESS;
    }
    match outcome {
        Ok(CommandOutcome::Success) => ExitCode::SUCCESS,
        Ok(CommandOutcome::Failed) => ExitCode::from(1),
        Err(err) => {
            if let Some(body) = err.body() {
                datum::say(body);
            }
            eprintln!("error: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

/// Logs to standard error; colour only for a person at a terminal.
fn logs(cli: &Cli) {
    // The demo's screen is its output: only warnings go to the log unless
    // RUST_LOG asks for more.
    let default_level = match cli.command {
        Command::Demo { .. } => "warn",
        _ => "info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(|| datum::LogWriter);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
}
