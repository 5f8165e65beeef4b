//! The `datum` binary: parse the command line, set up logging, run, and map
//! the outcome to an exit code (0 success, 1 a check or test failed, 2 the
//! command could not do its work).

mod cli;

use std::process::ExitCode;

use clap::Parser;
use datum::source::check;
use datum::{golden, record, scaffold};

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    // The demo's screen is its output: only warnings go to the log unless
    // RUST_LOG asks for more.
    let default_level = match cli.command {
        cli::Command::Demo { .. } => "warn",
        _ => "info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Colour only for a person at a terminal: never in a file or a pipe.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    match cli.log_format {
        cli::LogFormat::Text => logs.init(),
        cli::LogFormat::Json => logs.json().init(),
    }
    let code = command(cli.command);
    if datum::console::closed() {
        // The reader of standard output went away (`datum … | head`): end
        // quietly, as a filter does.
        return ExitCode::SUCCESS;
    }
    code
}

fn command(command: cli::Command) -> ExitCode {
    match command {
        cli::Command::Run { config } => {
            let config = match datum::config::Config::load(&config) {
                Ok(config) => config,
                Err(err) => return fail(err),
            };
            match datum::run::raise_open_file_limit() {
                Ok((soft, hard)) if soft < hard => {
                    tracing::info!(from = soft, to = hard, "open file limit raised")
                }
                Ok(_) => {}
                Err(err) => tracing::warn!(error = %err, "open file limit unchanged"),
            }
            let result = block_on(datum::run::run(&config, signalled()))
                .and_then(|r| r.map_err(|e| e.to_string()));
            match result {
                Ok(report) if report.ok() => ExitCode::SUCCESS,
                Ok(_) => ExitCode::from(1),
                Err(err) => fail(err),
            }
        }
        cli::Command::Demo {
            duration,
            no_color,
            rate,
            module,
        } => {
            let options = datum::demo::Options {
                duration: duration.map(|d| d.0),
                color: if no_color { Some(false) } else { None },
                module,
                rate,
            };
            let result = block_on(datum::demo::run(options, signalled()))
                .and_then(|r| r.map_err(|e| e.to_string()));
            match result {
                Ok(_) => ExitCode::SUCCESS,
                Err(err) => fail(err),
            }
        }
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
            let result = block_on(check::check_source(&url, &target))
                .and_then(|r| r.map_err(|e| format!("{e:#}")));
            match result {
                Ok(report) => {
                    say(&report.to_string());
                    if report.failed() {
                        ExitCode::from(1)
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(err) => fail(err),
            }
        }
        cli::Command::Test {
            module,
            fixtures,
            config,
            bless,
            filter,
        } => {
            let options = golden::Options {
                config,
                bless,
                filter,
            };
            match golden::run_suite(&module, &fixtures, &options, &mut Stdout) {
                Ok(summary) if summary.failed > 0 => ExitCode::from(1),
                Ok(_) => ExitCode::SUCCESS,
                Err(err) => fail(err),
            }
        }
        cli::Command::Record {
            out,
            url,
            slot,
            publication,
            state,
            pipeline,
            limit,
            prefix,
            force,
        } => {
            let options = record::Options {
                out,
                limit,
                prefix,
                force,
            };
            eprintln!(
                "warning: recorded fixtures hold real rows from your database; review and scrub \
                 them before you commit or share them"
            );
            let result = match (url, state) {
                (Some(url), _) => block_on(record::from_slot(
                    &url,
                    slot.as_deref(),
                    publication.as_deref(),
                    &options,
                ))
                .and_then(|r| r.map_err(|e| e.to_string())),
                (None, Some(state)) => {
                    record::from_dead_letters(&state, pipeline.as_deref(), &options)
                        .map_err(|e| e.to_string())
                }
                (None, None) => Err("give --url (a slot to peek) or --state (dead letters)".into()),
            };
            match result {
                Ok(files) => {
                    for file in &files {
                        say(&format!("wrote {}\n", file.display()));
                    }
                    say(&format!(
                        "{} fixture{} recorded; write NAME.expected.json beside each, or run \
                         `datum test MODULE.wasm {} --bless` and review what it writes\n",
                        files.len(),
                        if files.len() == 1 { "" } else { "s" },
                        options.out.display()
                    ));
                    ExitCode::SUCCESS
                }
                Err(err) => fail(err),
            }
        }
        cli::Command::New {
            name,
            kind,
            path,
            sdk,
        } => {
            let options = scaffold::Options {
                dir: path.unwrap_or_else(|| name.clone().into()),
                name,
                kind: match kind {
                    cli::Kind::Filter => scaffold::Kind::Filter,
                    cli::Kind::Map => scaffold::Kind::Map,
                    cli::Kind::FlatMap => scaffold::Kind::FlatMap,
                    cli::Kind::Transform => scaffold::Kind::Transform,
                },
                sdk,
            };
            match scaffold::create(&options) {
                Ok(created) => {
                    say(&created.to_string());
                    ExitCode::SUCCESS
                }
                Err(err) => fail(err),
            }
        }
        cli::Command::Admin {
            config,
            url,
            token,
            json,
            command,
        } => {
            let request = match command.into_request() {
                Ok(request) => request,
                Err(err) => return fail(err),
            };
            let args = datum::admin_client::Args {
                connection: datum::admin_client::Connection { config, url, token },
                json,
                request,
            };
            match block_on(datum::admin_client::run(&args)) {
                Ok(Ok(output)) => {
                    say(&output.to_string());
                    ExitCode::SUCCESS
                }
                Ok(Err(err)) => {
                    if let Some(body) = err.json() {
                        say(body);
                    }
                    eprintln!("error: {err}");
                    ExitCode::from(err.exit_code())
                }
                Err(err) => fail(err),
            }
        }
    }
}

/// Completes on the first SIGINT or SIGTERM.
async fn signalled() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(err) => {
            tracing::error!(error = %err, "cannot watch SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        _ = term.recv() => tracing::info!("SIGTERM: stopping"),
    }
}

/// Runs `future` on a new runtime. The runtime is then shut down without
/// waiting on blocking work still running (a module call that outlived its
/// pipeline's drain, a commit stuck on a failing disk): the command's
/// outcome is already decided, and the process exits.
fn block_on<F: std::future::Future>(future: F) -> Result<F::Output, String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|err| format!("cannot start the async runtime: {err}"))?;
    let output = runtime.block_on(future);
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    Ok(output)
}

/// Standard output for text a command prints; a closed pipe is noted by
/// [`datum::console`], never a panic.
fn say(text: &str) {
    if let Err(err) = datum::console::print(text) {
        eprintln!("error: writing to standard output: {err}");
    }
}

/// [`std::io::Write`] onto [`say`], for reports written incrementally.
struct Stdout;

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        datum::console::write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn fail(err: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {err}");
    ExitCode::from(2)
}
