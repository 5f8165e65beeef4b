//! The `stdout` sink: JSON lines on standard output (or, with the `pretty`
//! format, a readable view of each change going in and coming out),
//! flushed before each acknowledgement. For trying things out and for
//! piping into other tools; a closed pipe is a definite failure.

use std::io::{IsTerminal, Write};

use super::json::Columns;
use super::pretty::{self, Style};
use super::{Sink, SinkError, jsonl};
use crate::transform::Transformed;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct StdoutSink {
    buffer: Vec<u8>,
    pretty: Option<Style>,
    columns: Columns,
    written: u64,
}

impl StdoutSink {
    /// A sink writing JSON lines to the process's standard output, with the
    /// changes' columns as `columns` says.
    pub(crate) fn new(columns: Columns) -> StdoutSink {
        StdoutSink {
            columns,
            ..StdoutSink::default()
        }
    }

    /// A sink writing the readable view of [`pretty`] instead; `color`
    /// `None` means colour when standard output is a terminal and
    /// `NO_COLOR` is not set.
    pub(crate) fn pretty(color: Option<bool>) -> StdoutSink {
        let color = color.unwrap_or_else(|| {
            std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none()
        });
        StdoutSink {
            buffer: Vec::new(),
            pretty: Some(Style { color }),
            columns: Columns::Key,
            written: 0,
        }
    }
}

impl Sink for StdoutSink {
    async fn write(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        self.write_group(std::slice::from_ref(batch)).await
    }

    /// One flush for the whole group.
    async fn write_group(&mut self, batches: &[Transformed]) -> Result<(), SinkError> {
        self.buffer.clear();
        match self.pretty {
            Some(style) => {
                for batch in batches {
                    let mut text = String::new();
                    pretty::render(batch, style, &mut text);
                    self.buffer.extend_from_slice(text.as_bytes());
                }
            }
            None => jsonl::render_group(batches, self.columns, &mut self.buffer),
        }
        let mut out = std::io::stdout().lock();
        out.write_all(&self.buffer)
            .and_then(|()| out.flush())
            .map_err(|e| {
                if crate::console::note(&e) {
                    SinkError::gone("standard output was closed by its reader")
                } else {
                    // A full disk, an I/O error, a pipe that would block:
                    // retried, like the file sink's, never skipped as a
                    // refusal of the batch.
                    SinkError::transient(format!("writing to standard output: {e}"))
                }
            })?;
        self.written += self.buffer.len() as u64;
        Ok(())
    }

    fn bytes_written(&self) -> u64 {
        self.written
    }
}
