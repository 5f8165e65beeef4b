//! What the source database must provide, checked one requirement at a time,
//! each failure with what to do about it. `datum check` prints the report;
//! [`super::prepare`] refuses to start on any failure.
//!
//! Owns the requirement logic: server version, `wal_level`, the REPLICATION
//! privilege, UTF-8 encoding, tables and their replica identity, publication
//! coverage, and the slot's state. It changes nothing on the server.

use std::fmt;

use tokio_postgres::Client;

use super::catalog::{self, SlotState};
use super::{RowColumns, SourceError};
use crate::pg::quote_ident;

/// The oldest server Datum supports: `messages` in pgoutput needs 14.
pub(crate) const MIN_SERVER_VERSION: i32 = 140_000;

/// The outcome of one requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Met.
    Pass,
    /// Not met in a way that may be intended or that Datum will fix (for
    /// example a slot it will create).
    Warn,
    /// Not met: the pipeline cannot run.
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What was checked.
    pub requirement: String,
    /// The outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What to do, for `Warn` and `Fail`.
    pub fix: Option<String>,
}

/// All findings, in the order checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// The findings.
    pub findings: Vec<Finding>,
}

impl Report {
    fn push(&mut self, requirement: &str, status: Status, detail: String, fix: Option<String>) {
        self.findings.push(Finding {
            requirement: requirement.to_owned(),
            status,
            detail,
            fix,
        });
    }

    fn pass(&mut self, requirement: &str, detail: String) {
        self.push(requirement, Status::Pass, detail, None);
    }

    fn fail(&mut self, requirement: &str, detail: String, fix: String) {
        self.push(requirement, Status::Fail, detail, Some(fix));
    }

    fn warn(&mut self, requirement: &str, detail: String, fix: String) {
        self.push(requirement, Status::Warn, detail, Some(fix));
    }

    /// Whether any requirement failed.
    pub fn failed(&self) -> bool {
        self.findings.iter().any(|f| f.status == Status::Fail)
    }

    /// The first failure as an error.
    pub fn into_result(self) -> Result<Report, SourceError> {
        match self.findings.iter().find(|f| f.status == Status::Fail) {
            Some(f) => Err(SourceError::Requirement {
                problem: format!("{}: {}", f.requirement, f.detail),
                fix: f.fix.clone().unwrap_or_default(),
            }),
            None => Ok(self),
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for finding in &self.findings {
            let mark = match finding.status {
                Status::Pass => "pass",
                Status::Warn => "warn",
                Status::Fail => "FAIL",
            };
            writeln!(f, "[{mark}] {}: {}", finding.requirement, finding.detail)?;
            if let Some(fix) = &finding.fix {
                writeln!(f, "       fix: {fix}")?;
            }
        }
        Ok(())
    }
}

/// What to check.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// The publication to read.
    pub publication: Option<String>,
    /// The slot to read from.
    pub slot: Option<String>,
    /// Tables (`schema.table` or `table` for `public`) the pipeline needs.
    pub tables: Vec<String>,
    /// The pipeline captures DDL (`source.capture_ddl`): a role that cannot
    /// install its event trigger fails the check.
    pub capture_ddl: bool,
    /// The pipeline may drain through SQL (`source.catch_up`), which needs
    /// a replication slot beside the pipeline's for a temporary copy of it:
    /// the check warns when none would be free.
    pub catch_up: bool,
}

/// A table's identity in the catalog.
#[derive(Debug, Clone)]
pub(crate) struct TableInfo {
    pub(crate) qualified: String,
    pub(crate) oid: u32,
    /// The role is (a member of) its owner.
    pub(crate) owned: bool,
    pub(crate) owner: String,
    pub(crate) kind: char,
    pub(crate) leaves: Vec<u32>,
}

/// `schema.table` → (`schema`, `table`); a bare name is in `public`.
pub(crate) fn split_table(name: &str) -> (String, String) {
    match name.split_once('.') {
        Some((schema, table)) => (schema.to_owned(), table.to_owned()),
        None => ("public".to_owned(), name.to_owned()),
    }
}

/// Connects to `conninfo` (a URL or libpq key=value string) and runs every
/// check: what `datum check` does.
pub async fn check_source(conninfo: &str, target: &Target) -> anyhow::Result<Report> {
    let info: super::ConnInfo = conninfo.parse()?;
    let client = catalog::connect(&info).await?;
    Ok(run(&client, target).await?)
}

/// Runs every check. Errors only when the catalog cannot be read at all.
pub(crate) async fn run(client: &Client, target: &Target) -> Result<Report, SourceError> {
    let state = match &target.slot {
        Some(slot) => catalog::slot_state(client, slot).await?,
        None => None,
    };
    run_with_slot(client, target, state.as_ref()).await
}

/// [`run`], with the slot's state already read (`None`: it does not exist,
/// or will be created).
pub(crate) async fn run_with_slot(
    client: &Client,
    target: &Target,
    slot_state: Option<&SlotState>,
) -> Result<Report, SourceError> {
    let mut report = Report::default();

    let version: i32 = catalog::show(client, "server_version_num")
        .await?
        .parse()
        .unwrap_or(0);
    let version_text = catalog::show(client, "server_version").await?;
    if version >= MIN_SERVER_VERSION {
        report.pass("server version", format!("PostgreSQL {version_text}"));
    } else {
        report.fail(
            "server version",
            format!("PostgreSQL {version_text} is older than 14"),
            "upgrade the source server to PostgreSQL 14 or newer".into(),
        );
    }

    let wal_level = catalog::show(client, "wal_level").await?;
    if wal_level == "logical" {
        report.pass("wal_level", "logical".into());
    } else {
        report.fail(
            "wal_level",
            format!("`{wal_level}`; logical replication needs `logical`"),
            "run `ALTER SYSTEM SET wal_level = logical` (or set it in postgresql.conf) and \
             restart PostgreSQL"
                .into(),
        );
    }

    let row = client
        .query_one(
            "SELECT current_user::text, rolreplication OR rolsuper,
                    pg_encoding_to_char((SELECT encoding FROM pg_database
                                         WHERE datname = current_database()))
             FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .await
        .map_err(SourceError::Sql)?;
    let (user, can_replicate, encoding): (String, bool, String) =
        (row.col(0)?, row.col(1)?, row.col(2)?);
    if can_replicate {
        report.pass(
            "replication privilege",
            format!("role `{user}` may replicate"),
        );
    } else {
        report.fail(
            "replication privilege",
            format!("role `{user}` lacks the REPLICATION attribute"),
            format!("run `ALTER ROLE \"{user}\" REPLICATION` as a superuser"),
        );
    }
    if encoding == "UTF8" {
        report.pass("database encoding", "UTF8".into());
    } else {
        report.fail(
            "database encoding",
            format!("`{encoding}`; Datum reads UTF8 databases only"),
            "replicate from a database created with ENCODING 'UTF8'".into(),
        );
    }

    let mut tables = Vec::new();
    for name in &target.tables {
        match check_table(client, name, &mut report).await? {
            Some(info) => tables.push(info),
            None => continue,
        }
    }

    if let Some(publication) = &target.publication {
        let configured = !target.tables.is_empty();
        check_publication(client, publication, &tables, configured, &mut report).await?;
    }
    check_ddl_capture(client, target.capture_ddl, &mut report).await?;
    if let Some(slot) = &target.slot {
        let database: String = client
            .query_one("SELECT current_database()::text", &[])
            .await
            .map_err(SourceError::Sql)?
            .col(0)?;
        check_slot(slot, &database, slot_state, &mut report);
        check_capacity(client, slot_state, target.catch_up, &mut report).await?;
    }
    Ok(report)
}

async fn check_table(
    client: &Client,
    name: &str,
    report: &mut Report,
) -> Result<Option<TableInfo>, SourceError> {
    let (schema, table) = split_table(name);
    let requirement = format!("table {schema}.{table}");
    let row = client
        .query_opt(
            "SELECT c.oid, c.relkind::text, c.relreplident::text,
                    EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
                    has_table_privilege(c.oid, 'SELECT'), pg_has_role(c.relowner, 'USAGE'),
                    pg_get_userbyid(c.relowner)::text, current_user::text
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&schema, &table],
        )
        .await
        .map_err(SourceError::Sql)?;
    let Some(row) = row else {
        report.fail(
            &requirement,
            "does not exist".into(),
            "create the table, or correct its name in the pipeline's `tables`".into(),
        );
        return Ok(None);
    };
    let oid: u32 = row.col(0)?;
    let kind = row.col::<&str>(1)?.chars().next().unwrap_or('?');
    if kind != 'r' && kind != 'p' {
        report.fail(
            &requirement,
            format!("is not a table (relkind `{kind}`)"),
            "only ordinary and partitioned tables can be published".into(),
        );
        return Ok(None);
    }
    // A partitioned table's changes come from its leaf partitions, whose
    // replica identity is what counts.
    let leaves: Vec<(String, String, bool, u32)> = if kind == 'p' {
        client
            .query(
                "SELECT format('%I.%I', n.nspname, c.relname), c.relreplident::text,
                        EXISTS (SELECT 1 FROM pg_index i
                                WHERE i.indrelid = c.oid AND i.indisprimary),
                        c.oid
                 FROM pg_partition_tree($1::oid::regclass) t
                 JOIN pg_class c ON c.oid = t.relid
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE t.isleaf",
                &[&oid],
            )
            .await
            .map_err(SourceError::Sql)?
            .iter()
            .map(|r| Ok((r.col(0)?, r.col(1)?, r.col(2)?, r.col(3)?)))
            .collect::<Result<_, SourceError>>()?
    } else {
        vec![(format!("{schema}.{table}"), row.col(2)?, row.col(3)?, oid)]
    };
    let mut problems = Vec::new();
    for (leaf, identity, has_pk, _) in &leaves {
        match identity.as_str() {
            "d" if !has_pk => problems.push(format!("{leaf} has no primary key")),
            "n" => problems.push(format!("{leaf} has REPLICA IDENTITY NOTHING")),
            _ => {}
        }
    }
    if problems.is_empty() {
        let identity = match row.col::<&str>(2)? {
            "f" => "full",
            "i" => "index",
            _ if kind == 'p' => "of its partitions",
            _ => "primary key",
        };
        report.pass(
            &requirement,
            format!("replica identity {identity}, updates and deletes replicate"),
        );
    } else {
        report.fail(
            &requirement,
            format!(
                "{}, so its updates and deletes cannot be replicated",
                problems.join("; ")
            ),
            format!(
                "add a primary key, or run `ALTER TABLE {schema}.{table} REPLICA IDENTITY FULL` \
                 (or USING INDEX a unique index on NOT NULL columns)"
            ),
        );
    }
    let (readable, owned, owner, user): (bool, bool, String, String) =
        (row.col(4)?, row.col(5)?, row.col(6)?, row.col(7)?);
    let quoted = format!("{}.{}", quote_ident(&schema), quote_ident(&table));
    if readable {
        report.pass(
            &format!("{requirement} SELECT"),
            format!("role `{user}` may read it (the snapshot copies its rows)"),
        );
    } else {
        report.warn(
            &format!("{requirement} SELECT"),
            format!(
                "role `{user}` may not read it, so its existing rows cannot be copied                  (snapshot.mode = \"initial\" and backfills fail for it)"
            ),
            format!("run `GRANT SELECT ON {quoted} TO {}`", quote_ident(&user)),
        );
    }
    Ok(Some(TableInfo {
        qualified: format!("{schema}.{table}"),
        oid,
        owned,
        owner,
        kind,
        leaves: leaves.into_iter().map(|(_, _, _, oid)| oid).collect(),
    }))
}

async fn check_publication(
    client: &Client,
    publication: &str,
    tables: &[TableInfo],
    configured: bool,
    report: &mut Report,
) -> Result<(), SourceError> {
    let requirement = format!("publication {publication}");
    let row = client
        .query_opt(
            "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate,
                    pubviaroot
             FROM pg_publication WHERE pubname = $1",
            &[&publication],
        )
        .await
        .map_err(SourceError::Sql)?;
    let Some(row) = row else {
        if !configured {
            report.fail(
                &requirement,
                "does not exist and no tables are configured to create it for".into(),
                format!(
                    "run `CREATE PUBLICATION \"{publication}\" FOR TABLE ...`, or list the \
                     pipeline's tables so that Datum creates it"
                ),
            );
        } else {
            check_can_create_publication(client, publication, tables, report).await?;
        }
        return Ok(());
    };
    let (all, insert, update, delete, truncate): (bool, bool, bool, bool, bool) = (
        row.col(0)?,
        row.col(1)?,
        row.col(2)?,
        row.col(3)?,
        row.col(4)?,
    );
    let published: Vec<u32> = client
        .query(
            "SELECT c.oid FROM pg_publication_tables p
             JOIN pg_namespace n ON n.nspname = p.schemaname
             JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = p.tablename
             WHERE p.pubname = $1",
            &[&publication],
        )
        .await
        .map_err(SourceError::Sql)?
        .iter()
        .map(|r| r.col(0))
        .collect::<Result<_, _>>()?;
    let missing: Vec<&TableInfo> = tables
        .iter()
        .filter(|t| {
            // Without publish_via_partition_root a partitioned table is
            // listed through its leaves.
            let leaves_covered = t.kind == 'p'
                && !t.leaves.is_empty()
                && t.leaves.iter().all(|l| published.contains(l));
            !all && !published.contains(&t.oid) && !leaves_covered
        })
        .collect();
    if missing.is_empty() {
        report.pass(
            &requirement,
            if all {
                "publishes all tables".into()
            } else {
                format!("covers {} configured table(s)", tables.len())
            },
        );
    } else {
        let names: Vec<String> = missing.iter().map(|t| t.qualified.clone()).collect();
        report.fail(
            &requirement,
            format!("does not cover {}", names.join(", ")),
            format!(
                "run `ALTER PUBLICATION \"{publication}\" ADD TABLE {}`",
                missing
                    .iter()
                    .map(|t| quoted_table(&t.qualified))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    let skipped: Vec<&str> = [
        ("insert", insert),
        ("update", update),
        ("delete", delete),
        ("truncate", truncate),
    ]
    .iter()
    .filter(|(_, on)| !on)
    .map(|(op, _)| *op)
    .collect();
    if !skipped.is_empty() {
        report.warn(
            &format!("{requirement} operations"),
            format!("does not publish {}", skipped.join(", ")),
            format!(
                "if that is not intended, run `ALTER PUBLICATION \"{publication}\" SET \
                 (publish = 'insert, update, delete, truncate')`"
            ),
        );
    }
    Ok(())
}

/// Datum will run `CREATE PUBLICATION ... FOR TABLE ...`: that needs CREATE
/// on the database and ownership of every table.
async fn check_can_create_publication(
    client: &Client,
    publication: &str,
    tables: &[TableInfo],
    report: &mut Report,
) -> Result<(), SourceError> {
    let requirement = format!("publication {publication}");
    let row = client
        .query_one(
            "SELECT current_user::text, current_database()::text,
                    has_database_privilege(current_database(), 'CREATE')",
            &[],
        )
        .await
        .map_err(SourceError::Sql)?;
    let (user, database, may_create): (String, String, bool) =
        (row.col(0)?, row.col(1)?, row.col(2)?);
    let create_sql = format!(
        "CREATE PUBLICATION {} FOR TABLE {}",
        quote_ident(publication),
        tables
            .iter()
            .map(|t| quoted_table(&t.qualified))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut problems = Vec::new();
    let mut fixes = Vec::new();
    if !may_create {
        problems.push(format!(
            "role `{user}` lacks CREATE on database `{database}`"
        ));
        fixes.push(format!(
            "`GRANT CREATE ON DATABASE {} TO {}`",
            quote_ident(&database),
            quote_ident(&user)
        ));
    }
    for table in tables.iter().filter(|t| !t.owned) {
        problems.push(format!(
            "{} is owned by `{}`, not by `{user}` (a publication for a table needs its owner)",
            table.qualified, table.owner
        ));
        fixes.push(format!(
            "`ALTER TABLE {} OWNER TO {}`",
            quoted_table(&table.qualified),
            quote_ident(&user)
        ));
    }
    if problems.is_empty() {
        report.warn(
            &requirement,
            "does not exist".into(),
            format!(
                "Datum creates it when the pipeline starts (`{create_sql}`; role `{user}` may)"
            ),
        );
    } else {
        report.fail(
            &requirement,
            format!(
                "does not exist, and Datum cannot create it: {}",
                problems.join("; ")
            ),
            format!(
                "run {}; or have the tables' owner run `{create_sql}` and start again",
                fixes.join(" and ")
            ),
        );
    }
    Ok(())
}

/// `schema.table` (or `table` in `public`) quoted for SQL.
/// Whether DDL is captured (`source.capture_ddl`), or could be.
async fn check_ddl_capture(
    client: &Client,
    wanted: bool,
    report: &mut Report,
) -> Result<(), SourceError> {
    use super::ddl::Capture;
    let requirement = "DDL capture";
    match super::ddl::state(client).await? {
        Capture::Installed => report.pass(
            requirement,
            "the event trigger datum_capture_ddl is installed: DDL travels in the stream".into(),
        ),
        Capture::Installable => report.pass(
            requirement,
            if wanted {
                "this role will install the event trigger datum_capture_ddl".into()
            } else {
                "off; can be enabled (source.capture_ddl = true installs an event trigger)".into()
            },
        ),
        Capture::NeedsSuperuser if wanted => report.fail(
            requirement,
            "source.capture_ddl needs an event trigger, and only a superuser can create one"
                .into(),
            super::ddl::superuser_fix(),
        ),
        Capture::NeedsSuperuser => report.pass(
            requirement,
            "off; to enable it (source.capture_ddl), a superuser installs its event trigger once              (docs/schema.md)"
                .into(),
        ),
    }
    Ok(())
}

pub(crate) fn quoted_table(qualified: &str) -> String {
    let (schema, table) = split_table(qualified);
    format!("{}.{}", quote_ident(&schema), quote_ident(&table))
}

/// A slot to be created needs a free one (`max_replication_slots`); the
/// stream needs a free walsender (`max_wal_senders`).
async fn check_capacity(
    client: &Client,
    slot: Option<&SlotState>,
    catch_up: bool,
    report: &mut Report,
) -> Result<(), SourceError> {
    let slot_exists = slot.is_some();
    let row = client
        .query_one(
            "SELECT current_setting('max_replication_slots')::int8,
                    (SELECT count(*) FROM pg_replication_slots),
                    current_setting('max_wal_senders')::int8,
                    (SELECT count(*) FROM pg_stat_replication)",
            &[],
        )
        .await
        .map_err(SourceError::Sql)?;
    let (max_slots, slots, max_senders, senders): (i64, i64, i64, i64) =
        (row.col(0)?, row.col(1)?, row.col(2)?, row.col(3)?);
    // A walsender still holding the pipeline's own slot (left by a crash)
    // is replaced, not added to.
    let senders = senders - i64::from(slot.is_some_and(|s| s.active));
    if slot_exists || slots < max_slots {
        report.pass(
            "replication slots",
            format!("{slots} of max_replication_slots = {max_slots} in use"),
        );
    } else {
        report.fail(
            "replication slots",
            format!(
                "all {max_slots} (max_replication_slots) are in use, and the pipeline's slot \
                 must be created"
            ),
            format!(
                "drop a slot nothing uses (`SELECT slot_name, active FROM \
                 pg_replication_slots`, then `SELECT pg_drop_replication_slot('NAME')`), or run \
                 `ALTER SYSTEM SET max_replication_slots = {}` and restart PostgreSQL",
                max_slots + 1
            ),
        );
    }
    if catch_up {
        check_catch_up_slot(max_slots, slots + i64::from(!slot_exists), report);
    }
    if senders < max_senders {
        report.pass(
            "walsenders",
            format!("{senders} of max_wal_senders = {max_senders} in use"),
        );
    } else {
        report.fail(
            "walsenders",
            format!("all {max_senders} (max_wal_senders) are in use"),
            format!(
                "stop an unused replication client, or run `ALTER SYSTEM SET max_wal_senders \
                 = {}` and restart PostgreSQL",
                max_senders + 1
            ),
        );
    }
    Ok(())
}

/// A catch-up copies the pipeline's slot while it drains (the copy lives
/// as long as the catch-up): with no slot free once the pipeline's own
/// exists, the server refuses the copy and the pipeline streams instead.
fn check_catch_up_slot(max_slots: i64, with_pipelines: i64, report: &mut Report) {
    let requirement = "slot for a catch-up";
    if with_pipelines < max_slots {
        report.pass(
            requirement,
            format!(
                "{} of max_replication_slots = {max_slots} free for the temporary copy \
                 source.catch_up makes",
                max_slots - with_pipelines
            ),
        );
    } else {
        report.warn(
            requirement,
            format!(
                "none of max_replication_slots = {max_slots} is left beside the pipeline's \
                 own: source.catch_up needs one for a temporary copy of the slot, and \
                 without it the pipeline streams instead of catching up"
            ),
            format!(
                "run `ALTER SYSTEM SET max_replication_slots = {}` and restart PostgreSQL, \
                 or drop a slot nothing uses",
                with_pipelines + 1
            ),
        );
    }
}

fn check_slot(slot: &str, database: &str, state: Option<&SlotState>, report: &mut Report) {
    let requirement = format!("slot {slot}");
    let Some(state) = state else {
        report.warn(
            &requirement,
            "does not exist".into(),
            "Datum creates it (pgoutput) when the pipeline starts".into(),
        );
        return;
    };
    if state.slot_type != "logical" || state.plugin.as_deref() != Some("pgoutput") {
        report.fail(
            &requirement,
            format!(
                "is a {} slot with plugin {}; Datum needs a logical pgoutput slot",
                state.slot_type,
                state.plugin.as_deref().unwrap_or("none")
            ),
            "give the pipeline another slot name, or drop this slot".into(),
        );
        return;
    }
    if state.database.as_deref() != Some(database) {
        report.fail(
            &requirement,
            format!(
                "belongs to database {}, not {database}",
                state.database.as_deref().unwrap_or("?")
            ),
            "connect to the slot's database, or use another slot name".into(),
        );
        return;
    }
    if state.wal_status.as_deref() == Some("lost") {
        report.fail(
            &requirement,
            "was invalidated (wal_status = lost): the WAL it needed is gone".into(),
            "set recreate_slot = true (a new slot; the target then needs a resync); raise \
             max_slot_wal_keep_size to avoid a repeat"
                .into(),
        );
        return;
    }
    let retained = state
        .retained_bytes
        .map(|b| format!("{:.1} MiB of WAL retained", b as f64 / (1024.0 * 1024.0)))
        .unwrap_or_else(|| "no WAL retained".into());
    let position = state
        .confirmed_flush
        .map(|l| format!("confirmed up to {l}"))
        .unwrap_or_else(|| "nothing confirmed yet".into());
    if state.active {
        report.warn(
            &requirement,
            format!(
                "in use by process {} ({position}, {retained})",
                state.active_pid.unwrap_or(0)
            ),
            "stop the other consumer; a walsender left by a crash goes away after \
             wal_sender_timeout, or set terminate_stale_holder = true"
                .into(),
        );
    } else {
        report.pass(&requirement, format!("pgoutput, {position}, {retained}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_table_names_are_in_public() {
        assert_eq!(split_table("t"), ("public".into(), "t".into()));
        assert_eq!(split_table("s.t"), ("s".into(), "t".into()));
    }

    #[test]
    fn report_turns_the_first_failure_into_an_error_with_its_fix() {
        let mut report = Report::default();
        report.pass("a", "ok".into());
        report.fail("wal_level", "`replica`".into(), "set it".into());
        let text = report.to_string();
        assert!(text.contains("[FAIL] wal_level: `replica`"), "{text}");
        assert!(text.contains("fix: set it"), "{text}");
        let err = report.into_result().expect_err("failed");
        assert_eq!(err.to_string(), "wal_level: `replica`; to fix: set it");
    }
}
