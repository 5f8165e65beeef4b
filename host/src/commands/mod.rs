//! The commands of the `datum` binary, one file each, named as the user
//! types them: `run`, `demo`, `check`, `test`, `record`, `new`, `admin`.
//!
//! [`dispatch`] runs the command the command line names and says how it
//! ended; `main` maps that to the exit code, once.

pub(crate) mod admin;
pub(crate) mod canary;
pub(crate) mod check;
pub(crate) mod cli;
pub(crate) mod demo;
pub(crate) mod new;
pub(crate) mod record;
pub(crate) mod run;
pub(crate) mod summary;
pub(crate) mod test;

use std::future::Future;

/// How a command that did its work ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything succeeded (exit 0).
    Success,
    /// A check, a test or a pipeline failed (exit 1): the command said
    /// which.
    Failed,
}

impl Outcome {
    fn from_ok(ok: bool) -> Outcome {
        if ok {
            Outcome::Success
        } else {
            Outcome::Failed
        }
    }
}

/// Why a command could not do its work (exit 2, unless the error says
/// otherwise).
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The async runtime could not start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The configuration file.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// `datum run` could not start.
    #[error(transparent)]
    Start(#[from] crate::daemon::StartError),
    /// The admin API of `datum run` could not start.
    #[error("admin API: {0}")]
    AdminApi(#[from] crate::admin::ServeError),
    /// `datum demo`.
    #[error(transparent)]
    Demo(#[from] demo::DemoError),
    /// `datum check` could not reach the database.
    #[error("{0:#}")]
    Check(anyhow::Error),
    /// `datum test`.
    #[error(transparent)]
    Test(#[from] crate::golden::GoldenError),
    /// `datum record`.
    #[error(transparent)]
    Record(#[from] record::RecordError),
    /// `datum new`.
    #[error(transparent)]
    New(#[from] new::ScaffoldError),
    /// `datum admin`.
    #[error(transparent)]
    Admin(#[from] admin::ClientError),
    /// The command line asked for something that cannot be done.
    #[error("{0}")]
    Usage(String),
}

impl CommandError {
    /// The process's exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CommandError::Admin(err) => err.exit_code(),
            _ => 2,
        }
    }

    /// A body to print on standard output before the error (the admin
    /// API's answer, as it came).
    pub fn body(&self) -> Option<&str> {
        match self {
            CommandError::Admin(err) => err.json(),
            _ => None,
        }
    }
}

/// Runs the command `command` names.
pub fn dispatch(command: cli::Command) -> Result<Outcome, CommandError> {
    match command {
        cli::Command::Run { config } => run::command(&config),
        cli::Command::Demo {
            duration,
            no_color,
            rate,
            module,
        } => demo::command(demo::Options {
            duration: duration.map(|d| d.0),
            color: if no_color { Some(false) } else { None },
            module,
            rate,
        }),
        cli::Command::Check {
            url,
            publication,
            slot,
            tables,
            capture_ddl,
            catch_up,
        } => check::command(
            &url,
            &crate::source::check::Target {
                publication,
                slot,
                tables,
                capture_ddl,
                catch_up,
            },
        ),
        cli::Command::Test {
            module,
            fixtures,
            config,
            bless,
            filter,
        } => test::command(
            &module,
            &fixtures,
            &crate::golden::Options {
                config,
                bless,
                filter,
                limits: None,
            },
        ),
        cli::Command::Record {
            out,
            url,
            slot,
            publication,
            tables,
            rows,
            state,
            pipeline,
            limit,
            prefix,
            force,
        } => record::command(
            record::Source {
                url,
                slot,
                publication,
                state,
                pipeline,
                tables,
                rows,
            },
            &record::Options {
                out,
                limit,
                prefix,
                force,
            },
        ),
        cli::Command::New {
            name,
            kind,
            path,
            sdk,
            sdk_git,
            sdk_rev,
        } => new::command(new::Options {
            dir: path.unwrap_or_else(|| name.clone().into()),
            name,
            kind: match kind {
                cli::Kind::Filter => new::Kind::Filter,
                cli::Kind::Map => new::Kind::Map,
                cli::Kind::FlatMap => new::Kind::FlatMap,
                cli::Kind::Transform => new::Kind::Transform,
            },
            sdk,
            sdk_git,
            sdk_rev,
        }),
        cli::Command::Admin {
            config,
            url,
            token,
            json,
            command,
        } => admin::command(admin::Args {
            connection: admin::Connection { config, url, token },
            json,
            request: command.into_request().map_err(CommandError::Usage)?,
        }),
    }
}

/// Runs `future` on a new runtime. The runtime is then shut down without
/// waiting on blocking work still running (a module call that outlived its
/// pipeline's drain, a commit stuck on a failing disk): the command's
/// outcome is already decided, and the process exits.
pub(crate) fn block_on<F: Future>(future: F) -> Result<F::Output, CommandError> {
    // Admin requests and hot swaps call modules on its blocking threads.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(crate::transform::engine::CALLER_STACK)
        .build()
        .map_err(CommandError::Runtime)?;
    let output = runtime.block_on(future);
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    Ok(output)
}

/// Watches SIGINT and SIGTERM from the moment it is called, and completes
/// on the first. Call it as soon as the runtime runs: a signal that comes
/// while the host is still starting (compiling modules, preparing slots)
/// then stops it cleanly once started, where a handler installed later left
/// the signal's default action to kill it.
pub(crate) fn signalled() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let interrupt = signal(SignalKind::interrupt());
    async move {
        match (term, interrupt) {
            (Ok(mut term), Ok(mut interrupt)) => tokio::select! {
                _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
                _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            },
            (Ok(mut term), Err(err)) => {
                tracing::error!(error = %err, "cannot watch SIGINT");
                term.recv().await;
                tracing::info!("SIGTERM: stopping");
            }
            (Err(err), Ok(mut interrupt)) => {
                tracing::error!(error = %err, "cannot watch SIGTERM");
                interrupt.recv().await;
                tracing::info!("SIGINT: stopping");
            }
            (Err(err), Err(_)) => {
                tracing::error!(error = %err, "cannot watch SIGINT or SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    }
}

/// Standard output for text a command prints; a closed pipe is noted by
/// `console`, never a panic.
pub fn say(text: &str) {
    if let Err(err) = crate::console::print(text) {
        eprintln!("error: writing to standard output: {err}");
    }
}

/// [`std::io::Write`] onto [`say`], for reports written incrementally.
#[derive(Debug)]
pub(crate) struct Stdout;

impl std::io::Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        crate::console::write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
