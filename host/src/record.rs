//! `datum record`. (Being written.)

use std::path::{Path, PathBuf};

/// Where and how much to write.
#[derive(Debug, Clone)]
pub struct Options {
    /// Directory.
    pub out: PathBuf,
    /// Most batches.
    pub limit: usize,
    /// File name prefix.
    pub prefix: String,
    /// Overwrite.
    pub force: bool,
}

/// Why recording failed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RecordError(String);

/// From a slot.
pub async fn from_slot(
    _conninfo: &str,
    _slot: Option<&str>,
    _publication: Option<&str>,
    _options: &Options,
) -> Result<Vec<PathBuf>, RecordError> {
    Err(RecordError("not written yet".into()))
}

/// From dead letters.
pub fn from_dead_letters(
    _state: &Path,
    _pipeline: Option<&str>,
    _options: &Options,
) -> Result<Vec<PathBuf>, RecordError> {
    Err(RecordError("not written yet".into()))
}
