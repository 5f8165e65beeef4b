//! The replication source: reads a PostgreSQL logical replication slot
//! (pgoutput, protocol version 1) natively and hands out batches.
//!
//! Owns everything between the server and the first channel of the pipeline:
//! the replication connection (`replication`), the requirement checks
//! ([`check`]), preparing the publication and slot ([`prepare`]), decoding
//! ([`pgoutput`]; values become typed in `crate::event::values`),
//! assembling batches (`assembler`), the table shapes downstream was told
//! of (`shapes`), and the streaming loop with keepalives
//! and reconnection ([`stream`]), and draining a slot that is far behind
//! through the SQL interface ([`catchup`]). Connection strings and TLS are
//! [`crate::pg`]'s.
//!
//! It does not own durability: it reports as flushed only what its
//! [`Positions`] (the daemon's feedback coordinator) says is checkpointed.
//!
//! LSN rules it keeps (`docs/architecture.md`, "The delivery contract"):
//! * a batch's position is its transaction's *end* LSN, never the commit LSN;
//! * `flush` in a status update never exceeds what the caller published as
//!   checkpointed;
//! * status updates go out on a timer well inside `wal_sender_timeout`, also
//!   while downstream applies back-pressure;
//! * after `START_REPLICATION` the slot is read back, and a start past the
//!   requested LSN is an error.

pub(crate) mod assembler;
pub(crate) mod catalog;
pub(crate) mod catchup;
pub(crate) mod check;
mod copy_text;
pub(crate) mod ddl;
pub(crate) mod pgoutput;
pub(crate) mod replication;
pub(crate) mod shapes;
pub(crate) mod snapshot;
pub(crate) mod stream;

use std::time::Duration;

use datum_guest::Txn;
pub(crate) use replication::ServerError;

use tokio_postgres::Client;

use crate::event::{BatchLimits, Lsn};
use crate::pg::{self, ConnInfo, TlsError, transient_sqlstate};

/// What the source needs of whoever tracks positions downstream (the
/// daemon's feedback coordinator): the source registers each batch before
/// sending it, reports an idle WAL end, and tells the server as flushed only
/// what [`Positions::flushed`] says is checkpointed.
pub trait Positions: Send + Sync {
    /// A batch of `txn` is about to go downstream; refused when it breaks
    /// commit order.
    fn register(&self, txn: &Txn) -> Result<(), OrderError>;
    /// Nothing is open or pending at `wal_end` (a keepalive's position): a
    /// quiet slot may move there.
    fn idle(&self, wal_end: Lsn);
    /// The position durably checkpointed: the only one reported as flushed.
    fn flushed(&self) -> Lsn;
}

/// A batch registered out of commit order: an invariant of the stream was
/// broken (by the server or by the source), so the pipeline stops rather
/// than checkpoint past a transaction it has not delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrderError {
    /// A transaction whose commit LSN is before the previous one's.
    #[error(
        "transaction xid {xid} (commit {commit_lsn}) arrived after xid {previous_xid} \
         (commit {previous_commit_lsn}): commit positions went backwards"
    )]
    Backwards {
        /// The transaction registered.
        xid: u32,
        /// Its commit LSN.
        commit_lsn: Lsn,
        /// The transaction before it.
        previous_xid: u32,
        /// Its commit LSN.
        previous_commit_lsn: Lsn,
    },
    /// A transaction first seen at a chunk other than its first.
    #[error("transaction xid {xid} (commit {commit_lsn}) began at chunk {chunk}, not at chunk 0")]
    MidTransaction {
        /// The transaction.
        xid: u32,
        /// Its commit LSN.
        commit_lsn: Lsn,
        /// The chunk it began with.
        chunk: u32,
    },
}

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
    Tls(#[from] TlsError),
    /// The connection broke.
    #[error("connection lost: {0}")]
    Io(#[source] std::io::Error),
    /// The server reported an error on the replication connection.
    #[error("server error: {0}")]
    Server(ServerError),
    /// An ordinary SQL query failed.
    #[error("query failed: {}", pg::error_chain(.0))]
    Sql(#[source] tokio_postgres::Error),
    /// The server broke the protocol, or sent what we cannot read.
    #[error("replication protocol: {0}")]
    Protocol(String),
    /// A pgoutput message could not be decoded.
    #[error(transparent)]
    Decode(#[from] pgoutput::DecodeError),
    /// The stream broke the commit order the delivery contract rests on.
    #[error("replication stream out of order: {0}")]
    Order(#[from] OrderError),
    /// The source database lacks something the pipeline needs.
    #[error("{problem}; to fix: {fix}")]
    Requirement {
        /// What is wrong.
        problem: String,
        /// What to do.
        fix: String,
    },
    /// PostgreSQL started the slot past the requested position, silently
    /// skipping changes (`docs/architecture.md`, pitfall 4).
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

/// Reading a column of a query's row without trusting the server: a value
/// of another type than the query asks for, or one not valid in it, is an
/// error that says so, where `Row::get` would panic.
pub(crate) trait RowColumns {
    /// Column `idx` as `T`.
    fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
        &'a self,
        idx: usize,
    ) -> Result<T, SourceError>;
}

impl RowColumns for tokio_postgres::Row {
    fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
        &'a self,
        idx: usize,
    ) -> Result<T, SourceError> {
        self.try_get(idx).map_err(|e| SourceError::Requirement {
            problem: format!(
                "the server answered a catalog query with a column Datum cannot read ({e})"
            ),
            fix: "connect to PostgreSQL itself, with a search_path that puts no schema of \
                  your own ahead of pg_catalog"
                .into(),
        })
    }
}

impl From<pg::ConnectError> for SourceError {
    fn from(err: pg::ConnectError) -> SourceError {
        match err {
            pg::ConnectError::Refused {
                target,
                reason,
                transient,
            } => SourceError::Connect {
                target,
                reason,
                transient,
            },
            pg::ConnectError::Auth { user, reason } => SourceError::Auth { user, reason },
            pg::ConnectError::Tls(err) => SourceError::Tls(err),
        }
    }
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
    /// A slot confirmed past the checkpoint is where another host left it
    /// (several hosts with one pipeline, `leader_lock`): stream from it
    /// instead of refusing.
    pub follow_slot: bool,
    /// Capture DDL statements into the stream with an event trigger
    /// (installed when missing; `source/ddl.rs`).
    pub capture_ddl: bool,
    /// Drain a slot that is far behind through the SQL interface
    /// (`source/catchup.rs`); `None`: always stream.
    pub catch_up: Option<catchup::CatchUp>,
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
            follow_slot: false,
            capture_ddl: false,
            catch_up: None,
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
    /// The server's system identifier; `None` when the source's user may
    /// not read it (the error, said once in the log).
    pub system_identifier: Option<String>,
}

/// Checks the requirements and creates what is missing: the publication
/// first, then the slot (a publication created after its slot may not be
/// seen by it, `docs/architecture.md`, pitfall 12). Refuses, saying what to change, when a
/// requirement fails.
///
/// `checkpoint` is where the pipeline resumes, if it ever checkpointed. A
/// slot that is gone, invalidated (`docs/architecture.md`, pitfall 5) or confirmed past the
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
    // The slot is read once; everything after follows from what it said.
    let found = catalog::slot_state(&client, &config.slot).await?;
    let plan = plan_slot(config, checkpoint, found)?;
    let target = check::Target {
        publication: Some(config.publication.clone()),
        slot: Some(config.slot.clone()),
        tables: config.tables.clone(),
        capture_ddl: config.capture_ddl,
        catch_up: config.catch_up.is_some(),
    };
    // A slot about to be recreated is checked as the new one it will be.
    let checked = match &plan {
        SlotPlan::Use(state) => Some(state),
        SlotPlan::Create | SlotPlan::Recreate(_) => None,
    };
    let report = check::run_with_slot(&client, &target, checked)
        .await?
        .into_result()?;
    let created_publication = ensure_publication(&client, config).await?;
    // Before a new slot exists, so that no DDL after its start is missed.
    if config.capture_ddl {
        ddl::ensure(&client).await?;
    }
    let resync_needed = matches!(plan, SlotPlan::Recreate(_))
        || (matches!(plan, SlotPlan::Create) && checkpoint.is_some_and(|c| c != Lsn::ZERO));
    let (confirmed_flush, created_slot) = match plan {
        SlotPlan::Use(state) => {
            if state.active {
                release_slot(&client, config, state.active_pid).await?;
            }
            (state.confirmed_flush, false)
        }
        SlotPlan::Recreate(state) => {
            if state.active {
                release_slot(&client, config, state.active_pid).await?;
            }
            client
                .query("SELECT pg_drop_replication_slot($1)", &[&config.slot])
                .await
                .map_err(SourceError::Sql)?;
            (
                Some(create_slot(&client, config, before_create).await?),
                true,
            )
        }
        SlotPlan::Create => (
            Some(create_slot(&client, config, before_create).await?),
            true,
        ),
    };
    let system_identifier = match catalog::system_identifier(&client).await {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::warn!(error = %crate::pg::error_chain(&e), "cannot read the source's system identifier (GRANT EXECUTE ON FUNCTION pg_control_system() TO the source's user): a postgres sink does not record what it applied, and a replay after a crash relies on its writes being idempotent");
            None
        }
    };
    Ok(Prepared {
        report,
        created_publication,
        created_slot,
        confirmed_flush,
        resync_needed,
        system_identifier,
    })
}

/// What to do with the slot, decided from one reading of it.
#[derive(Debug)]
enum SlotPlan {
    /// Stream from it as it is.
    Use(catalog::SlotState),
    /// It does not exist: create it.
    Create,
    /// It lost changes the pipeline needs and `recreate_slot` allows a new
    /// one: drop and create it (the target needs a resync).
    Recreate(catalog::SlotState),
}

/// Decides what to do with the slot `found` (`None`: it does not exist),
/// given the pipeline's checkpoint. A slot that is invalidated
/// (`docs/architecture.md`, pitfall 5), confirmed past the checkpoint, or
/// gone after the pipeline checkpointed means changes were lost to the
/// pipeline: an error, unless `recreate_slot` is set.
fn plan_slot(
    config: &SourceConfig,
    checkpoint: Option<Lsn>,
    found: Option<catalog::SlotState>,
) -> Result<SlotPlan, SourceError> {
    // A checkpoint of 0/0 was recorded before the slot was created and
    // never advanced: the slot's own position is where it starts.
    let checkpoint = checkpoint.filter(|c| *c != Lsn::ZERO);
    let Some(state) = found else {
        return match checkpoint {
            None => Ok(SlotPlan::Create),
            Some(checkpoint) if config.recreate_slot => {
                tracing::warn!(slot = %config.slot, %checkpoint, "the slot is gone; recreating it: the target needs a resync");
                Ok(SlotPlan::Create)
            }
            Some(checkpoint) => Err(SourceError::Requirement {
                problem: format!(
                    "slot {} no longer exists, but the pipeline checkpointed at {checkpoint}: \
                     the changes since are lost to it",
                    config.slot
                ),
                fix: "restore the slot, or set recreate_slot = true to create a new one and \
                      resynchronise the target"
                    .into(),
            }),
        };
    };
    let lost = state.wal_status.as_deref() == Some("lost");
    let ahead = match (checkpoint, state.confirmed_flush) {
        (Some(checkpoint), Some(confirmed)) => confirmed > checkpoint,
        _ => false,
    };
    if ahead && !lost && config.follow_slot {
        // Another host streamed the slot: the normal takeover, never a
        // reason to recreate it, whatever `recreate_slot` says.
        tracing::info!(
            slot = %config.slot,
            checkpoint = %checkpoint.unwrap_or_default(),
            confirmed = %state.confirmed_flush.unwrap_or_default(),
            "the slot is past this host's checkpoint (another host streamed it): resuming from the slot"
        );
        return Ok(SlotPlan::Use(state));
    }
    if (lost || ahead) && config.recreate_slot {
        tracing::warn!(
            slot = %config.slot,
            lost,
            ahead,
            "dropping the slot to recreate it: the target needs a resync"
        );
        return Ok(SlotPlan::Recreate(state));
    }
    if ahead {
        return Err(SourceError::FastForward {
            slot: config.slot.clone(),
            requested: checkpoint.unwrap_or_default(),
            confirmed: state.confirmed_flush.unwrap_or_default(),
        });
    }
    Ok(SlotPlan::Use(state))
}

/// Creates the slot (after `before_create` recorded the intent); its
/// confirmed position.
async fn create_slot(
    client: &Client,
    config: &SourceConfig,
    before_create: impl FnOnce() -> Result<(), SourceError>,
) -> Result<Lsn, SourceError> {
    before_create()?;
    let row = client
        .query_one(
            "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&config.slot],
        )
        .await
        .map_err(SourceError::Sql)?;
    tracing::info!(slot = %config.slot, "created replication slot");
    let text: String = row.col(0)?;
    text.parse().map_err(|_| {
        SourceError::Protocol(format!("the new slot's position `{text}` is not an LSN"))
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
        .map(|t| check::quoted_table(t))
        .collect();
    let mut sql = format!(
        "CREATE PUBLICATION {} FOR TABLE {}",
        pg::quote_ident(&config.publication),
        tables.join(", ")
    );
    if config.publish_via_partition_root {
        sql.push_str(" WITH (publish_via_partition_root = true)");
    }
    if let Err(err) = client.batch_execute(&sql).await {
        // Refused for a privilege: the same advice `datum check` gives.
        if err.as_db_error().map(|d| d.code().code()) == Some("42501") {
            let target = check::Target {
                publication: Some(config.publication.clone()),
                slot: None,
                tables: config.tables.clone(),
                capture_ddl: false,
                catch_up: false,
            };
            check::run(client, &target).await?.into_result()?;
        }
        return Err(SourceError::Sql(err));
    }
    tracing::info!(publication = %config.publication, tables = ?config.tables, "created publication");
    Ok(true)
}

/// A slot held by another process: wait briefly for a dying walsender to
/// let go, terminate it when configured to, else refuse.
pub(crate) async fn release_slot(
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
