//! The replication source: reads a PostgreSQL logical replication slot
//! (pgoutput, protocol version 1) natively and hands out batches.
//!
//! Owns everything between the server and the first channel of the pipeline:
//! the connection ([`replication`], [`conninfo`], [`tls`]), the requirement
//! checks ([`check`]), preparing the publication and slot ([`prepare`]),
//! decoding ([`pgoutput`], [`values`]), assembling batches ([`assembler`]) and
//! the streaming loop with keepalives and reconnection ([`stream`]).
//!
//! It does not own durability: it reports as flushed only what the feedback
//! coordinator says is checkpointed, and nothing before that exists.
//!
//! LSN rules it keeps (DESIGN.md §2, PITFALLS 1, 3, 4):
//! * a batch's position is its transaction's *end* LSN, never the commit LSN;
//! * `flush` in a status update never exceeds what the caller published as
//!   checkpointed;
//! * status updates go out on a timer well inside `wal_sender_timeout`, also
//!   while downstream applies back-pressure;
//! * after `START_REPLICATION` the slot is read back, and a start past the
//!   requested LSN is an error.

pub mod assembler;
pub mod catalog;
pub mod check;
pub mod conninfo;
pub mod lsn;
pub mod pgoutput;
pub mod replication;
pub mod stream;
pub mod tls;
pub mod values;

use std::time::Duration;

pub use assembler::BatchLimits;
pub use conninfo::ConnInfo;
pub use lsn::Lsn;
pub use replication::ServerError;
pub use values::TypeKind;

use tokio_postgres::Client;

/// What went wrong in the source. [`SourceError::is_transient`] tells a
/// failure worth retrying (the network, a restarting server) from one that
/// needs a person (a wrong password, a dropped slot, a missing publication).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The server could not be reached, or the connection could not be set
    /// up.
    #[error("cannot connect to {target}: {reason}")]
    Connect {
        /// The connection target, without password.
        target: String,
        /// Why.
        reason: String,
        /// Whether trying again may help (an unreachable server may come
        /// back; a refused certificate or an SSL-less server will not).
        transient: bool,
    },
    /// The server refused our credentials, or asked for something we lack.
    #[error("authentication as `{user}` failed: {reason}")]
    Auth {
        /// The role.
        user: String,
        /// Why (never the password).
        reason: String,
    },
    /// TLS could not be set up as `sslmode` demands.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The connection broke.
    #[error("connection lost: {0}")]
    Io(#[source] std::io::Error),
    /// The server reported an error on the replication connection.
    #[error("server error: {0}")]
    Server(ServerError),
    /// An ordinary SQL query failed.
    #[error("query failed: {}", catalog::error_chain(.0))]
    Sql(#[source] tokio_postgres::Error),
    /// The server broke the protocol, or sent what we cannot read.
    #[error("replication protocol: {0}")]
    Protocol(String),
    /// A pgoutput message could not be decoded.
    #[error(transparent)]
    Decode(#[from] pgoutput::DecodeError),
    /// The stream broke the commit order the delivery contract rests on.
    #[error("replication stream out of order: {0}")]
    Order(#[from] crate::feedback::OrderError),
    /// The source database lacks something the pipeline needs.
    #[error("{problem}; to fix: {fix}")]
    Requirement {
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// PostgreSQL started the slot past the requested position, silently
    /// skipping changes (PITFALLS 4).
    #[error(
        "slot {slot} resumed at {confirmed}, past the requested {requested}: the changes \
         between were acknowledged to PostgreSQL by someone else and are gone for this \
         pipeline; resynchronise the target, or start from {confirmed} knowingly"
    )]
    FastForward {
        /// The slot.
        slot: String,
        /// Where we asked to start.
        requested: Lsn,
        /// Where the server starts.
        confirmed: Lsn,
    },
}

impl SourceError {
    /// Whether retrying (after a back-off) may succeed. Unknown failures
    /// count as transient; definite ones need a person.
    pub fn is_transient(&self) -> bool {
        match self {
            SourceError::Connect { transient, .. } => *transient,
            SourceError::Io(_) => true,
            SourceError::Server(err) => transient_sqlstate(&err.code),
            SourceError::Sql(err) => match err.as_db_error() {
                Some(db) => transient_sqlstate(db.code().code()),
                None => true,
            },
            SourceError::Tls(err) => err.is_transient(),
            SourceError::Auth { .. }
            | SourceError::Protocol(_)
            | SourceError::Decode(_)
            | SourceError::Order(_)
            | SourceError::Requirement { .. }
            | SourceError::FastForward { .. } => false,
        }
    }
}

/// SQLSTATE classes that describe a passing condition.
fn transient_sqlstate(code: &str) -> bool {
    matches!(
        &code[..code.len().min(2)],
        "08" // connection exception
        | "40" // transaction rollback
        | "53" // insufficient resources
        | "57" // operator intervention: shutdown, terminated backend
        | "58" // system error
    ) || code == "55006" // object in use: a slot still held by a dying walsender
}

/// How a pipeline reads its source.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// Where to connect.
    pub conninfo: ConnInfo,
    /// The publication to stream.
    pub publication: String,
    /// The replication slot.
    pub slot: String,
    /// Tables to publish, `schema.table` (a bare name is in `public`). With
    /// none, the publication must exist.
    pub tables: Vec<String>,
    /// When Datum creates the publication: publish partitions' changes under
    /// the partitioned table's name.
    pub publish_via_partition_root: bool,
    /// Terminate a walsender that holds the slot (after a crash the old one
    /// may linger until `wal_sender_timeout`).
    pub terminate_stale_holder: bool,
    /// When the slot was dropped or invalidated, or is ahead of the
    /// checkpoint: create a new one and start from it. Changes in between are
    /// lost to the pipeline and the target needs a resync.
    pub recreate_slot: bool,
    /// When transactions are cut into chunks.
    pub limits: BatchLimits,
    /// How often to send status updates; by default a sixth of the server's
    /// `wal_sender_timeout`, at most 10 s.
    pub status_interval: Option<Duration>,
    /// First delay before reconnecting; doubles up to `reconnect_max`.
    pub reconnect_initial: Duration,
    /// Longest delay between reconnection attempts.
    pub reconnect_max: Duration,
}

impl SourceConfig {
    /// A configuration with defaults for everything but the essentials.
    pub fn new(conninfo: ConnInfo, publication: &str, slot: &str) -> SourceConfig {
        SourceConfig {
            conninfo,
            publication: publication.to_owned(),
            slot: slot.to_owned(),
            tables: Vec::new(),
            publish_via_partition_root: false,
            terminate_stale_holder: false,
            recreate_slot: false,
            limits: BatchLimits::default(),
            status_interval: None,
            reconnect_initial: Duration::from_millis(250),
            reconnect_max: Duration::from_secs(30),
        }
    }
}

/// What [`prepare`] found and did.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The requirement report (passes and warnings).
    pub report: check::Report,
    /// Whether the publication was created now.
    pub created_publication: bool,
    /// Whether the slot was created now.
    pub created_slot: bool,
    /// The slot's confirmed position.
    pub confirmed_flush: Option<Lsn>,
    /// The slot was recreated (`recreate_slot`): the checkpoint no longer
    /// applies, and the target needs a resync.
    pub resync_needed: bool,
}

/// Checks the requirements and creates what is missing: the publication
/// first, then the slot (a publication created after its slot may not be
/// seen by it, PITFALLS 12). Refuses, saying what to change, when a
/// requirement fails.
///
/// `checkpoint` is where the pipeline resumes, if it ever checkpointed. A
/// slot that is gone, invalidated (PITFALLS 5) or confirmed past the
/// checkpoint means changes were lost to the pipeline: an error, unless
/// `recreate_slot` is set, in which case a new slot is created and
/// [`Prepared::resync_needed`] says so.
///
/// `before_create` runs just before the slot is created, so that the
/// caller can durably record that it is about to own one: a crash between
/// creating the slot and the first checkpoint then restarts cleanly, and a
/// slot that exists without any such record can be told apart.
pub async fn prepare(
    config: &SourceConfig,
    checkpoint: Option<Lsn>,
    before_create: impl FnOnce() -> Result<(), SourceError>,
) -> Result<Prepared, SourceError> {
    let client = catalog::connect(&config.conninfo).await?;
    let mut resync_needed = false;
    if let Some(state) = catalog::slot_state(&client, &config.slot).await? {
        let lost = state.wal_status.as_deref() == Some("lost");
        // A checkpoint of 0/0 was recorded before the slot was created and
        // never advanced: the slot's own position is where it starts.
        let ahead = match (checkpoint, state.confirmed_flush) {
            (Some(checkpoint), Some(confirmed)) if checkpoint != Lsn::ZERO => {
                confirmed > checkpoint
            }
            _ => false,
        };
        if (lost || ahead) && config.recreate_slot {
            tracing::warn!(
                slot = %config.slot,
                lost,
                ahead,
                "dropping the slot to recreate it: the target needs a resync"
            );
            if state.active {
                release_slot(&client, config, state.active_pid).await?;
            }
            client
                .query("SELECT pg_drop_replication_slot($1)", &[&config.slot])
                .await
                .map_err(SourceError::Sql)?;
            resync_needed = true;
        } else if ahead {
            return Err(SourceError::FastForward {
                slot: config.slot.clone(),
                requested: checkpoint.unwrap_or_default(),
                confirmed: state.confirmed_flush.unwrap_or_default(),
            });
        }
    } else if let Some(checkpoint) = checkpoint
        && checkpoint != Lsn::ZERO
    {
        if !config.recreate_slot {
            return Err(SourceError::Requirement {
                problem: format!(
                    "slot {} no longer exists, but the pipeline checkpointed at {checkpoint}:                      the changes since are lost to it",
                    config.slot
                ),
                fix: "restore the slot, or set recreate_slot = true to create a new one and                       resynchronise the target"
                    .into(),
            });
        }
        tracing::warn!(slot = %config.slot, %checkpoint, "the slot is gone; recreating it: the target needs a resync");
        resync_needed = true;
    }
    let target = check::Target {
        publication: Some(config.publication.clone()),
        slot: Some(config.slot.clone()),
        tables: config.tables.clone(),
    };
    let report = check::run(&client, &target).await?.into_result()?;

    let created_publication = ensure_publication(&client, config).await?;
    let mut created_slot = false;
    let state = match catalog::slot_state(&client, &config.slot).await? {
        Some(state) => state,
        None => {
            before_create()?;
            client
                .query(
                    "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                    &[&config.slot],
                )
                .await
                .map_err(SourceError::Sql)?;
            created_slot = true;
            tracing::info!(slot = %config.slot, "created replication slot");
            catalog::slot_state(&client, &config.slot)
                .await?
                .ok_or_else(|| SourceError::Protocol("the new slot vanished".into()))?
        }
    };
    if state.active {
        release_slot(&client, config, state.active_pid).await?;
    }
    Ok(Prepared {
        report,
        created_publication,
        created_slot,
        confirmed_flush: state.confirmed_flush,
        resync_needed,
    })
}

async fn ensure_publication(client: &Client, config: &SourceConfig) -> Result<bool, SourceError> {
    let exists = client
        .query_opt(
            "SELECT 1 FROM pg_publication WHERE pubname = $1",
            &[&config.publication],
        )
        .await
        .map_err(SourceError::Sql)?
        .is_some();
    if exists {
        return Ok(false);
    }
    let tables: Vec<String> = config
        .tables
        .iter()
        .map(|t| {
            let (schema, table) = check::split_table(t);
            format!(
                "{}.{}",
                replication::quote_ident(&schema),
                replication::quote_ident(&table)
            )
        })
        .collect();
    let mut sql = format!(
        "CREATE PUBLICATION {} FOR TABLE {}",
        replication::quote_ident(&config.publication),
        tables.join(", ")
    );
    if config.publish_via_partition_root {
        sql.push_str(" WITH (publish_via_partition_root = true)");
    }
    client.batch_execute(&sql).await.map_err(SourceError::Sql)?;
    tracing::info!(publication = %config.publication, tables = ?config.tables, "created publication");
    Ok(true)
}

/// A slot held by another process: wait briefly for a dying walsender to
/// let go, terminate it when configured to, else refuse.
async fn release_slot(
    client: &Client,
    config: &SourceConfig,
    pid: Option<i32>,
) -> Result<(), SourceError> {
    let pid = pid.unwrap_or(0);
    if config.terminate_stale_holder {
        tracing::warn!(slot = %config.slot, pid, "terminating the process that holds the slot");
        client
            .query("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .map_err(SourceError::Sql)?;
    }
    for _ in 0..50 {
        match catalog::slot_state(client, &config.slot).await? {
            Some(state) if state.active => tokio::time::sleep(Duration::from_millis(100)).await,
            _ => return Ok(()),
        }
    }
    Err(SourceError::Requirement {
        problem: format!("slot {} is in use by process {pid}", config.slot),
        fix: "stop the other consumer of this slot (a walsender left by a crash ends after \
              wal_sender_timeout), or set terminate_stale_holder = true to end it"
            .into(),
    })
}
