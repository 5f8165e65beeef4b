//! The `file` sink: JSON lines appended to a file, fsynced before each
//! acknowledgement, optionally rotated by size.
//!
//! A batch is never split across files: rotation happens before a batch (or
//! a group of batches written together) once the live file has reached the
//! limit. A group of batches shares one write and one fsync. The live file is always `PATH`; full
//! ones are renamed `PATH.1`, `PATH.2`, ... (the next free number), and the
//! directory is fsynced so the rename survives a crash. After a crash the
//! un-checkpointed tail is written again, so the file holds every transaction
//! in commit order, with duplicates only from that tail.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::json::Columns;
use super::{Sink, SinkError, jsonl};
use crate::transform::Transformed;

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct FileSink {
    state: Arc<Mutex<State>>,
    columns: Columns,
    buffer: Vec<u8>,
    written: u64,
}

#[derive(Debug)]
struct State {
    path: PathBuf,
    file: File,
    size: u64,
    rotate_at: Option<u64>,
    /// A write failed and its bytes may not all have been cut off yet.
    torn: bool,
}

fn io_error(path: &Path, what: &str) -> impl FnOnce(std::io::Error) -> SinkError {
    let path = path.display().to_string();
    let what = what.to_owned();
    move |e| SinkError::transient(format!("{what} {path}: {e}"))
}

fn open(path: &Path) -> Result<File, SinkError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_error(path, "opening"))
}

fn sync_dir(path: &Path) -> Result<(), SinkError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir, "syncing directory"))
}

impl FileSink {
    /// Opens (or creates) `path` for appending; the directory must exist.
    pub(crate) fn open(path: &Path, rotate_at: Option<u64>) -> Result<FileSink, SinkError> {
        let file = open(path)?;
        let size = drop_torn_tail(path, &file)?;
        sync_dir(path)?;
        Ok(FileSink {
            state: Arc::new(Mutex::new(State {
                path: path.to_owned(),
                file,
                size,
                rotate_at,
                torn: false,
            })),
            columns: Columns::Key,
            buffer: Vec::new(),
            written: 0,
        })
    }

    /// Writes the changes' columns as `columns` says.
    pub(crate) fn with_columns(mut self, columns: Columns) -> FileSink {
        self.columns = columns;
        self
    }
}

/// A crash in the middle of a write can leave a last line without its
/// newline: that batch was never acknowledged and will be written again, so
/// the torn bytes are cut off before anything is appended. Returns the size.
fn drop_torn_tail(path: &Path, file: &File) -> Result<u64, SinkError> {
    use std::io::{Read, Seek, SeekFrom};
    let size = file
        .metadata()
        .map_err(io_error(path, "reading the size of"))?
        .len();
    if size == 0 {
        return Ok(0);
    }
    let mut reader = File::open(path).map_err(io_error(path, "reading"))?;
    // Scan back in blocks for the last newline.
    let mut end = size;
    let mut block = vec![0u8; 64 << 10];
    let keep = loop {
        let start = end.saturating_sub(block.len() as u64);
        let len = (end - start) as usize;
        reader
            .seek(SeekFrom::Start(start))
            .and_then(|_| reader.read_exact(&mut block[..len]))
            .map_err(io_error(path, "reading"))?;
        if let Some(i) = block[..len].iter().rposition(|b| *b == b'\n') {
            break start + i as u64 + 1;
        }
        if start == 0 {
            break 0;
        }
        end = start;
    };
    if keep < size {
        tracing::warn!(path = %path.display(), bytes = size - keep, "cutting off a torn last line (a write interrupted by a crash; its batch is written again)");
        file.set_len(keep).map_err(io_error(path, "truncating"))?;
        file.sync_all().map_err(io_error(path, "syncing"))?;
    }
    Ok(keep)
}

impl State {
    fn rotate(&mut self) -> Result<(), SinkError> {
        // A rotation whose rename succeeded but whose new file could not be
        // created (no inode left) left no live file: only the new one is
        // missing then.
        if self.path.exists() {
            let mut n = 1u64;
            let target = loop {
                let candidate = PathBuf::from(format!("{}.{n}", self.path.display()));
                if !candidate.exists() {
                    break candidate;
                }
                n += 1;
            };
            std::fs::rename(&self.path, &target).map_err(io_error(&self.path, "rotating"))?;
        }
        self.file = open(&self.path)?;
        self.size = 0;
        sync_dir(&self.path)
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(), SinkError> {
        self.cut_back()?;
        if self
            .rotate_at
            .is_some_and(|limit| self.size >= limit && self.size > 0)
        {
            self.rotate()?;
        }
        let written = self
            .file
            .write_all(bytes)
            .map_err(io_error(&self.path, "writing"))
            .and_then(|()| {
                self.file
                    .sync_data()
                    .map_err(io_error(&self.path, "syncing"))
            });
        match written {
            Ok(()) => {
                self.size += bytes.len() as u64;
                Ok(())
            }
            Err(err) => {
                // Part of the group may have reached the file (a full disk
                // takes what fits): cut it off, or the group written again
                // would follow a torn line.
                self.torn = true;
                let _ = self.cut_back();
                Err(err)
            }
        }
    }

    /// Cuts the file back to its last whole, synced line after a failed
    /// write; a cut that fails now is tried again before the next write,
    /// which fails meanwhile rather than append after torn bytes.
    fn cut_back(&mut self) -> Result<(), SinkError> {
        if self.torn {
            self.file
                .set_len(self.size)
                .map_err(io_error(&self.path, "cutting a failed write off"))?;
            self.torn = false;
        }
        Ok(())
    }
}

impl Sink for FileSink {
    async fn write(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        self.write_group(std::slice::from_ref(batch)).await
    }

    /// One write and one fsync for the whole group; rotation treats the
    /// group as one batch (never split across files).
    async fn write_group(&mut self, batches: &[Transformed]) -> Result<(), SinkError> {
        self.buffer.clear();
        jsonl::render_group(batches, self.columns, &mut self.buffer);
        if self.buffer.is_empty() {
            return Ok(());
        }
        let bytes = std::mem::take(&mut self.buffer);
        let state = self.state.clone();
        // fsync blocks: keep it off the async workers.
        let (result, bytes) = tokio::task::spawn_blocking(move || {
            let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
            (state.append(&bytes), bytes)
        })
        .await
        .map_err(|e| SinkError::transient(format!("file writer task: {e}")))?;
        if result.is_ok() {
            self.written += bytes.len() as u64;
        }
        self.buffer = bytes;
        result
    }

    fn bytes_written(&self) -> u64 {
        self.written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_last_line_is_cut_off_on_open() {
        let dir = std::env::temp_dir().join(format!("datum-file-sink-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("out.jsonl");
        for (content, kept) in [
            ("", ""),
            ("{\"a\": 1}\n", "{\"a\": 1}\n"),
            ("{\"a\": 1}\n{\"b\"", "{\"a\": 1}\n"),
            ("{\"torn", ""),
        ] {
            std::fs::write(&path, content).expect("write");
            let sink = FileSink::open(&path, None).expect("open");
            assert_eq!(std::fs::read_to_string(&path).expect("read"), kept);
            let state = sink.state.lock().expect("lock");
            assert_eq!(state.size, kept.len() as u64);
        }
        // A long torn tail spanning several scan blocks.
        let mut long = String::from("{\"ok\": 1}\n");
        long.push_str(&"x".repeat(200_000));
        std::fs::write(&path, &long).expect("write");
        FileSink::open(&path, None).expect("open");
        assert_eq!(
            std::fs::read_to_string(&path).expect("read"),
            "{\"ok\": 1}\n"
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
