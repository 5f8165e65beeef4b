//! The process's standard output as the commands use it: text written
//! whole, and a reader that went away (`datum demo | head -2`) noticed
//! instead of panicking.
//!
//! Owns one fact: whether standard output was found closed. Whoever writes
//! to standard output (the commands' reports, the `stdout` sink) reports a
//! broken pipe here; `main` then ends the program quietly, with no error
//! line and no backtrace, as a well-behaved filter does.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` to standard output and flushes it. A closed pipe is
/// remembered ([`closed`]) and otherwise ignored; other errors are returned.
pub(crate) fn print(text: &str) -> std::io::Result<()> {
    write(text.as_bytes())
}

/// [`print()`] for bytes.
pub(crate) fn write(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    let result = out.write_all(bytes).and_then(|()| out.flush());
    match result {
        Err(err) if is_broken_pipe(&err) => {
            CLOSED.store(true, Ordering::Relaxed);
            Ok(())
        }
        other => other,
    }
}

/// Whether `err` says the reader of the pipe went away; if so, it is
/// remembered.
pub(crate) fn note(err: &std::io::Error) -> bool {
    let broken = is_broken_pipe(err);
    if broken {
        CLOSED.store(true, Ordering::Relaxed);
    }
    broken
}

fn is_broken_pipe(err: &std::io::Error) -> bool {
    err.kind() == std::io::ErrorKind::BrokenPipe
}

/// Whether standard output was found closed.
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// The progress bars drawn on standard error, once a command draws any.
static BARS: std::sync::OnceLock<indicatif::MultiProgress> = std::sync::OnceLock::new();

/// The bars of a command on a terminal (created on first use).
pub(crate) fn bars() -> &'static indicatif::MultiProgress {
    BARS.get_or_init(indicatif::MultiProgress::new)
}

/// Standard error for log lines: a line is written with the progress bars,
/// if any, cleared first and drawn again after it, so the two never mix.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match BARS.get() {
            Some(bars) => bars.suspend(|| std::io::stderr().write(buf)),
            None => std::io::stderr().write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
