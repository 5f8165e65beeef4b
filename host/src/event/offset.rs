//! A pipeline's position: the last transaction delivered, as the state file
//! keeps it and the feedback coordinator moves it.

use super::lsn::Lsn;

/// Where a pipeline resumes: the last transaction whose changes every module
/// and the sink accepted, or a position with nothing to deliver before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offset {
    /// Resume after this LSN: the transaction's end LSN.
    pub end_lsn: Lsn,
    /// The transaction's commit LSN (equal to `end_lsn` when the position was
    /// reached by an idle keepalive or a logical message).
    pub commit_lsn: Lsn,
    /// The transaction id (0 when there was no transaction).
    pub xid: u32,
    /// Its commit time, µs since the Unix epoch (0 when none).
    pub commit_time: i64,
    /// When the offset was written, µs since the Unix epoch.
    pub written_at: i64,
}
