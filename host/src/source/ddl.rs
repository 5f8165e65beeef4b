//! Capturing DDL statements into the stream (`source.capture_ddl`).
//!
//! Owns the event trigger that writes each DDL command of the source
//! database as a transactional logical message with the prefix
//! [`DDL_PREFIX`], so that `CREATE`, `ALTER` and `DROP` travel in commit
//! order with the changes around them and a schema change can say which
//! statement caused it (`source/assembler.rs`); whether this role can
//! install it (`datum check`); and installing it once per database.
//!
//! The message's content is JSON: `objid` (the OID of the object the
//! command changed; for `ALTER TABLE`, the table), `command` (the command
//! tag, `ALTER TABLE`), `object_type`, `identity` (`public.orders`) and
//! `statement` (the text of the statement that ran it, as the client sent
//! it: several commands sent in one query string all carry that string).

use tokio_postgres::Client;

use super::{RowColumns, SourceError};

/// The prefix of the logical messages that carry captured DDL.
pub(crate) const DDL_PREFIX: &str = "datum.ddl";

/// The event trigger's name (one per database, shared by every pipeline).
const TRIGGER: &str = "datum_capture_ddl";

/// The function and the two event triggers, installed by a superuser.
pub(crate) const INSTALL_SQL: &str = r#"CREATE OR REPLACE FUNCTION public.datum_capture_ddl() RETURNS event_trigger
LANGUAGE plpgsql AS $datum$
DECLARE
  command record;
BEGIN
  IF TG_EVENT = 'sql_drop' THEN
    FOR command IN SELECT * FROM pg_catalog.pg_event_trigger_dropped_objects() WHERE original LOOP
      PERFORM pg_catalog.pg_logical_emit_message(true, 'datum.ddl', pg_catalog.json_build_object(
        'objid', command.objid::pg_catalog.int8, 'command', TG_TAG, 'object_type', command.object_type,
        'identity', command.object_identity, 'statement', pg_catalog.current_query())::text);
    END LOOP;
  ELSE
    FOR command IN SELECT * FROM pg_catalog.pg_event_trigger_ddl_commands() LOOP
      PERFORM pg_catalog.pg_logical_emit_message(true, 'datum.ddl', pg_catalog.json_build_object(
        'objid', command.objid::pg_catalog.int8, 'command', command.command_tag, 'object_type', command.object_type,
        'identity', command.object_identity, 'statement', pg_catalog.current_query())::text);
    END LOOP;
  END IF;
END
$datum$;
CREATE EVENT TRIGGER datum_capture_ddl ON ddl_command_end EXECUTE FUNCTION public.datum_capture_ddl();
CREATE EVENT TRIGGER datum_capture_ddl_drop ON sql_drop EXECUTE FUNCTION public.datum_capture_ddl();"#;

/// What the source database says about capturing DDL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Capture {
    /// The event trigger is there and enabled.
    Installed,
    /// It is not, and this role may install it (a superuser).
    Installable,
    /// It is not, and only a superuser may install it.
    NeedsSuperuser,
}

/// Whether DDL is captured in this database, or can be.
pub(crate) async fn state(client: &Client) -> Result<Capture, SourceError> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = $1 AND evtenabled <> 'D'), \
                    (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)",
            &[&TRIGGER],
        )
        .await
        .map_err(SourceError::Sql)?;
    let (installed, superuser): (bool, Option<bool>) = (row.col(0)?, row.col(1)?);
    Ok(if installed {
        Capture::Installed
    } else if superuser == Some(true) {
        Capture::Installable
    } else {
        Capture::NeedsSuperuser
    })
}

/// What to tell a role that cannot install the trigger.
pub(crate) fn superuser_fix() -> String {
    format!(
        "as a superuser, run once in the source database (docs/schema.md): {}",
        INSTALL_SQL.split_whitespace().collect::<Vec<_>>().join(" ")
    )
}

/// Installs the event trigger unless it is there; an error that says what
/// to run when this role may not.
pub(crate) async fn ensure(client: &Client) -> Result<(), SourceError> {
    match state(client).await? {
        Capture::Installed => Ok(()),
        Capture::NeedsSuperuser => Err(SourceError::Requirement {
            problem: "source.capture_ddl needs an event trigger in the source database, and only \
                      a superuser can create one"
                .into(),
            fix: superuser_fix(),
        }),
        Capture::Installable => {
            let install = format!("BEGIN; {INSTALL_SQL} COMMIT;");
            match client.batch_execute(&install).await {
                Ok(()) => {
                    tracing::info!(
                        trigger = TRIGGER,
                        "installed the event trigger that captures DDL"
                    );
                    Ok(())
                }
                // Another host installed it at the same moment.
                Err(err) if err.as_db_error().map(|d| d.code().code()) == Some("42710") => {
                    let _ = client.batch_execute("ROLLBACK").await;
                    Ok(())
                }
                Err(err) => {
                    let _ = client.batch_execute("ROLLBACK").await;
                    Err(SourceError::Sql(err))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trigger_writes_the_prefix_the_assembler_reads() {
        assert_eq!(INSTALL_SQL.matches(&format!("'{DDL_PREFIX}'")).count(), 2);
    }
}
