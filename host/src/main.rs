//! The `datum` binary: parse the command line, set up logging, run the
//! command, and map how it ended to an exit code (0 success, 1 a check, test
//! or pipeline failed, 2 the command could not do its work).

use std::process::ExitCode;

use clap::Parser;
use datum::{Cli, Command, CommandOutcome, LogFormat};

fn main() -> ExitCode {
    // A child this binary started to compile a module (host/src/transform/
    // compiler.rs): it reads the module and writes its compiled form.
    let args: Vec<String> = std::env::args_os()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if args.get(1).map(String::as_str) == Some(datum::COMPILE_SUBCOMMAND) {
        return datum::compile_child_main(args.get(2..).unwrap_or_default());
    }
    // Modules compile in such children: the compiler's code and memory stay
    // out of this process.
    if let Ok(executable) = std::env::current_exe() {
        datum::compile_in_child_processes(executable);
    }
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
