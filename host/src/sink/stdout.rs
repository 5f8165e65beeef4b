//! The `stdout` sink: JSON lines on standard output, flushed before each
//! acknowledgement. For trying things out and for piping into other tools;
//! a closed pipe is a definite failure.

use std::io::Write;

use super::{Sink, SinkError, jsonl};
use crate::transform::Transformed;

/// See the module documentation.
#[derive(Debug, Default)]
pub struct StdoutSink {
    buffer: Vec<u8>,
}

impl StdoutSink {
    /// A sink writing to the process's standard output.
    pub fn new() -> StdoutSink {
        StdoutSink::default()
    }
}

impl Sink for StdoutSink {
    async fn write(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        self.buffer.clear();
        jsonl::render(batch, &mut self.buffer);
        let mut out = std::io::stdout().lock();
        out.write_all(&self.buffer)
            .and_then(|()| out.flush())
            .map_err(|e| SinkError::definite(format!("writing to standard output: {e}")))
    }
}
