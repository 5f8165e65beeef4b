//! Schema changes against a real server and the real binary: a column
//! added, dropped, renamed and retyped, between and inside transactions,
//! while a writer runs; the `schema` change before the first row of each
//! new shape, with the DDL that caused it; the postgres sink following an
//! added column and a widened type, or stopping at the right batch and
//! going on once the target is fixed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use datum_tests::{cluster, connect, example_wasm_path, free_port};
use serde_json::Value as Json;

use crate::run::{Host, temp_dir, toml_string};
use crate::snapshot::{config, status, two_databases, wait_equal};

/// A host configuration: pipeline `p` streams `public.t` of `url` into
/// the file `dir/out.jsonl`, with the state file in `dir`; `extra` lines
/// join the pipeline's table. The configuration and the output file.
fn file_pipeline(dir: &Path, url: &str, extra: &str) -> (String, PathBuf) {
    let out = dir.join("out.jsonl");
    let config = format!(
        r#"
state = {state}

[[pipeline]]
name = "p"
source.url = {url}
source.tables = ["public.t"]
sink = {{ type = "file", path = {out} }}
{extra}
"#,
        state = toml_string(dir.join("state.redb").to_str().expect("utf-8")),
        url = toml_string(url),
        out = toml_string(out.to_str().expect("utf-8")),
    );
    (config, out)
}

/// Inserts `(id, v)` rows into `t` one transaction at a time, ids from
/// `from`, until `stop`; the next id.
async fn inserter(url: String, from: i64, stop: tokio::sync::watch::Receiver<bool>) -> i64 {
    let client = connect(&url).await;
    let mut id = from;
    while !*stop.borrow() {
        client
            .batch_execute(&format!("INSERT INTO t (id, v) VALUES ({id}, {id})"))
            .await
            .unwrap_or_else(|e| panic!("insert {id}: {e:?}"));
        id += 1;
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    id
}

fn names(columns: &Json) -> Vec<String> {
    columns
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_owned))
        .collect()
}

/// The column names of a row.
fn row_columns(row: &Json) -> Vec<String> {
    row.as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

/// Every shape change (a column added, dropped, renamed, retyped; the
/// replica identity) reaches the file sink as a `schema` change before
/// the first row of the new shape — through a module built with the SDK,
/// which passes it on — whether the DDL ran between the writer's
/// transactions or inside one of its own, each with the statement that
/// caused it; no row ever has columns its last schema change did not
/// announce.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_schema_change_arrives_before_the_first_row_of_its_new_shape() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v int, note text); \
             INSERT INTO t VALUES (0, 0, 'before')",
        )
        .await
        .expect("table");
    let dir = temp_dir("schema-events");
    let (config, out) = file_pipeline(
        &dir,
        &pg.conninfo("postgres"),
        &format!(
            "source.capture_ddl = true\nsnapshot.mode = \"never\"\n\n\
             [[pipeline.transforms]]\nmodule = {}",
            toml_string(example_wasm_path("identity").to_str().expect("utf-8"))
        ),
    );
    let host = Host::start(&dir, &config);
    crate::run::wait_for_slots(&client, &["datum_p"], &host).await;
    client
        .batch_execute("INSERT INTO t VALUES (1, 1, 'first')")
        .await
        .expect("insert");

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(inserter(pg.conninfo("postgres"), 100, stopped));
    let pause = || tokio::time::sleep(Duration::from_millis(150));
    pause().await;
    // Between the writer's transactions.
    client
        .batch_execute("ALTER TABLE t ADD COLUMN extra text")
        .await
        .expect("add");
    pause().await;
    // Inside a transaction, between two of its rows.
    client
        .batch_execute(
            "BEGIN; INSERT INTO t (id, v, note) VALUES (2, 2, 'old shape'); \
             ALTER TABLE t DROP COLUMN note; \
             INSERT INTO t (id, v, extra) VALUES (3, 3, 'new shape'); COMMIT",
        )
        .await
        .expect("drop inside a transaction");
    pause().await;
    client
        .batch_execute("ALTER TABLE t RENAME COLUMN extra TO label")
        .await
        .expect("rename");
    pause().await;
    client
        .batch_execute("ALTER TABLE t ALTER COLUMN v TYPE bigint")
        .await
        .expect("retype");
    pause().await;
    client
        .batch_execute("ALTER TABLE t REPLICA IDENTITY FULL")
        .await
        .expect("replica identity");
    pause().await;
    let _ = stop.send(true);
    let next = writer.await.expect("writer");
    client
        .batch_execute("INSERT INTO t (id, v) VALUES (-1, -1)")
        .await
        .expect("last row");

    let lines = tokio::task::spawn_blocking({
        let out = out.clone();
        move || crate::run::wait_for_line(&out, &host, |l| l["new"]["id"] == -1)
    })
    .await
    .expect("lines");
    assert!(
        next > 150,
        "the writer ran throughout ({} rows)",
        next - 100
    );

    // Replay the file: every row has exactly the columns of the shape the
    // last schema change announced (the first row sets the starting one).
    // Compared as sorted names: the parsed rows do not keep their order.
    let sorted = |mut names: Vec<String>| {
        names.sort();
        names
    };
    let mut shape: Option<Vec<String>> = None;
    let mut events = Vec::new();
    let mut rows = 0;
    for line in &lines {
        match line["op"].as_str() {
            Some("schema") => {
                let change = &line["schema_change"];
                let before = sorted(names(&change["before"]["columns"]));
                if let Some(shape) = &shape {
                    assert_eq!(
                        &before, shape,
                        "the event's old shape is the rows' shape: {line}"
                    );
                }
                shape = Some(sorted(names(&change["after"]["columns"])));
                events.push(change.clone());
            }
            Some("insert") => {
                rows += 1;
                let columns = sorted(row_columns(&line["new"]));
                match &shape {
                    Some(shape) => {
                        assert_eq!(&columns, shape, "a row of an unannounced shape: {line}")
                    }
                    None => shape = Some(columns),
                }
            }
            _ => {}
        }
    }
    assert!(rows > 50, "{rows} rows");
    let shapes: Vec<Vec<String>> = events
        .iter()
        .map(|e| names(&e["after"]["columns"]))
        .collect();
    assert_eq!(
        shapes,
        [
            vec!["id", "v", "note", "extra"],
            vec!["id", "v", "extra"],
            vec!["id", "v", "label"],
            vec!["id", "v", "label"],
            vec!["id", "v", "label"],
        ],
        "{events:#?}"
    );
    let retyped = &events[3]["after"]["columns"][1];
    assert_eq!(retyped["type"], "int8", "{retyped}");
    // REPLICA IDENTITY FULL: every column is part of the identity now.
    let identity = &events[4];
    assert_eq!(
        (
            identity["before"]["replica_identity"].as_str(),
            identity["after"]["replica_identity"].as_str()
        ),
        (Some("default"), Some("full")),
        "{identity}"
    );
    assert!(
        identity["after"]["columns"]
            .as_array()
            .is_some_and(|c| c.iter().all(|c| c["key"] == true)),
        "{identity}"
    );
    let ddl: Vec<String> = events
        .iter()
        .map(|e| {
            e["ddl"]
                .as_array()
                .map(|d| {
                    d.iter()
                        .filter_map(Json::as_str)
                        .collect::<Vec<_>>()
                        .join(" | ")
                })
                .unwrap_or_default()
        })
        .collect();
    for (statement, wanted) in ddl.iter().zip([
        "ADD COLUMN extra",
        "DROP COLUMN note",
        "RENAME COLUMN extra TO label",
        "TYPE bigint",
        "REPLICA IDENTITY FULL",
    ]) {
        assert!(statement.contains(wanted), "{ddl:#?}");
    }
    // The transaction with the DROP: its old-shape row, the schema change,
    // its new-shape row, all in one batch.
    let position = |id: i64| {
        lines
            .iter()
            .position(|l| l["new"]["id"] == id)
            .unwrap_or_else(|| panic!("no row {id}"))
    };
    let (two, three) = (position(2), position(3));
    assert_eq!(lines[two]["txn"]["xid"], lines[three]["txn"]["xid"]);
    assert!(
        lines[two + 1..three].iter().any(|l| l["op"] == "schema"),
        "the schema change sits between the two rows of its transaction"
    );
    // The captured DDL itself travels as messages, in commit order.
    let messages = lines
        .iter()
        .filter(|l| l["op"] == "message" && l["message"]["prefix"] == "datum.ddl")
        .count();
    // One per command: the DROP COLUMN is an ALTER TABLE and a dropped
    // object.
    assert_eq!(messages, 6, "one message per DDL command");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Databases `src` and `dst`, each with table `t` made by `create`, and a
/// host configuration (in a new directory named after `name`, its admin
/// API on the port returned) streaming `t` from one into the other with
/// the postgres sink's `schema_changes` set to `policy`.
async fn into_postgres(
    pg: &datum_tests::Cluster,
    create: &str,
    name: &str,
    policy: &str,
) -> (
    tokio_postgres::Client,
    tokio_postgres::Client,
    PathBuf,
    u16,
    String,
) {
    let (src, dst) = two_databases(pg).await;
    for db in [&src, &dst] {
        db.batch_execute(create).await.expect("table");
    }
    let dir = temp_dir(name);
    let port = free_port();
    let config = config(
        &pg.conninfo("src"),
        &pg.conninfo("dst"),
        &dir,
        port,
        &["public.t"],
        "",
    )
    .replace(
        r#"type = "postgres","#,
        &format!(r#"type = "postgres", schema_changes = "{policy}","#),
    );
    (src, dst, dir, port, config)
}

/// With `schema_changes = "apply"`, the target gains the added column and
/// the widened type in the batch's transaction while a writer runs, and
/// ends equal to the source row for row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_apply_the_target_follows_an_added_column_and_a_widened_type() {
    let pg = cluster();
    let (src, dst, dir, port, config) = into_postgres(
        &pg,
        "CREATE TABLE t (id int PRIMARY KEY, v int, note varchar(10))",
        "schema-apply",
        "apply",
    )
    .await;
    src.batch_execute("INSERT INTO t SELECT g, g, 'n' || g FROM generate_series(1, 1000) g")
        .await
        .expect("rows");
    let host = Host::start(&dir, &config);
    wait_equal(&src, &dst, "SELECT * FROM t ORDER BY id", &host, 60).await;

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(inserter(pg.conninfo("src"), 2000, stopped));
    tokio::time::sleep(Duration::from_millis(200)).await;
    src.batch_execute(
        "ALTER TABLE t ADD COLUMN extra text; \
         UPDATE t SET extra = 'x' || id WHERE id % 3 = 0",
    )
    .await
    .expect("add");
    tokio::time::sleep(Duration::from_millis(200)).await;
    src.batch_execute(
        "BEGIN; ALTER TABLE t ALTER COLUMN note TYPE varchar(40); \
         UPDATE t SET note = repeat('w', 30) WHERE id % 7 = 0; COMMIT",
    )
    .await
    .expect("widen");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = stop.send(true);
    writer.await.expect("writer");

    let count = wait_equal(&src, &dst, "SELECT * FROM t ORDER BY id", &host, 60).await;
    assert!(count > 1000, "{count} rows");
    let note: String = dst
        .query_one(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = 't'::regclass AND attname = 'note'",
            &[],
        )
        .await
        .expect("type")
        .get(0);
    assert_eq!(note, "character varying(40)");
    let log = host.log();
    assert!(log.contains("changing the target table"), "{log}");
    let status = status(port).await.expect("status");
    assert_eq!(status["state"], "running");
    assert_eq!(status["totals"]["schema_changes"], 2, "{status}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A column of a type whose name is not all lowercase (an enum named
/// `"Mood"`, as ORMs make them): the type went into `ADD COLUMN` unquoted,
/// the target folded it to `mood`, and the pipeline stopped at "type does
/// not exist".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_apply_a_column_of_a_mixed_case_type_is_added() {
    let pg = cluster();
    let (src, dst, dir, _port, config) = into_postgres(
        &pg,
        "CREATE TYPE \"Mood\" AS ENUM ('ok', 'sad'); CREATE TABLE t (id int PRIMARY KEY)",
        "schema-mixed-case",
        "apply",
    )
    .await;
    src.batch_execute("INSERT INTO t VALUES (1)")
        .await
        .expect("row");
    let host = Host::start(&dir, &config);
    wait_equal(&src, &dst, "SELECT * FROM t ORDER BY id", &host, 60).await;
    src.batch_execute(
        "ALTER TABLE t ADD COLUMN m \"Mood\", ADD COLUMN ms \"Mood\"[]; \
         INSERT INTO t VALUES (2, 'sad', '{ok,sad}')",
    )
    .await
    .expect("add");
    let count = wait_equal(&src, &dst, "SELECT * FROM t ORDER BY id", &host, 60).await;
    assert_eq!(count, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Under the default `schema_changes = "fail"`, an added column stops the
/// pipeline at the batch that announces it, with the statement to run; the
/// rows before it are in the target, the ones after are not. Once the
/// statement ran on the target, a restart goes on with nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_fail_the_pipeline_stops_at_the_change_and_goes_on_once_the_target_is_fixed() {
    let pg = cluster();
    let (src, dst, dir, port, config) = into_postgres(
        &pg,
        "CREATE TABLE t (id int PRIMARY KEY, v int)",
        "schema-fail",
        "fail",
    )
    .await;
    let host = Host::start(&dir, &config);
    crate::run::wait_for_slots(&src, &["datum_p"], &host).await;
    src.batch_execute("INSERT INTO t SELECT g, g FROM generate_series(1, 10) g")
        .await
        .expect("rows");
    wait_equal(&src, &dst, "SELECT * FROM t ORDER BY id", &host, 60).await;
    src.batch_execute(
        "ALTER TABLE t ADD COLUMN extra text; \
         INSERT INTO t VALUES (11, 11, 'eleven'); \
         INSERT INTO t VALUES (12, 12, 'twelve')",
    )
    .await
    .expect("add");

    // Its only pipeline failed: the host ends, with status 1.
    let (status_code, error) = tokio::task::spawn_blocking(move || host.wait(60))
        .await
        .expect("host");
    assert_eq!(status_code.code(), Some(1), "{error}");
    assert!(
        error.contains(r#"ALTER TABLE "public"."t" ADD COLUMN IF NOT EXISTS "extra" text;"#),
        "{error}"
    );
    assert!(error.contains("schema_changes = \"apply\""), "{error}");
    let ids: Vec<i32> = dst
        .query("SELECT id FROM t ORDER BY id", &[])
        .await
        .expect("ids")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        ids,
        (1..=10).collect::<Vec<_>>(),
        "stopped before the new shape"
    );

    // Fixed by hand, as the error said; then the same host goes on.
    dst.batch_execute("ALTER TABLE t ADD COLUMN extra text")
        .await
        .expect("fix");
    let host = Host::start(&dir, &config);
    src.batch_execute("INSERT INTO t VALUES (13, 13, 'thirteen')")
        .await
        .expect("after");
    let count = wait_equal(&src, &dst, "SELECT * FROM t ORDER BY id", &host, 60).await;
    assert_eq!(count, 13);
    assert_eq!(status(port).await.expect("status")["state"], "running");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The shapes downstream was told of are kept with the checkpoint: a
/// column added while the host is stopped is announced when it starts
/// again, against the shape from before the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_added_while_the_host_was_stopped_is_announced_after_the_restart() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute("CREATE TABLE t (id int PRIMARY KEY, v int)")
        .await
        .expect("table");
    let dir = temp_dir("schema-restart");
    let (config, out) = file_pipeline(&dir, &pg.conninfo("postgres"), "snapshot.mode = \"never\"");
    let host = Host::start(&dir, &config);
    crate::run::wait_for_slots(&client, &["datum_p"], &host).await;
    client
        .batch_execute("INSERT INTO t VALUES (1, 1)")
        .await
        .expect("insert");
    crate::run::wait_for_line(&out, &host, |l| l["new"]["id"] == 1);
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");

    client
        .batch_execute("ALTER TABLE t ADD COLUMN note text; INSERT INTO t VALUES (2, 2, 'two')")
        .await
        .expect("while stopped");
    let host = Host::start(&dir, &config);
    let lines = crate::run::wait_for_line(&out, &host, |l| l["new"]["id"] == 2);
    let last = lines.len() - 1;
    assert_eq!(lines[last - 1]["op"], "schema", "{lines:#?}");
    let change = &lines[last - 1]["schema_change"];
    assert_eq!(names(&change["before"]["columns"]), ["id", "v"]);
    assert_eq!(names(&change["after"]["columns"]), ["id", "v", "note"]);
    let schema_changes = lines.iter().filter(|l| l["op"] == "schema").count();
    assert_eq!(schema_changes, 1, "{lines:#?}");
    drop(host);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Regression: a column dropped or renamed while a table was being copied
/// failed its copy ("column does not exist"), since the next chunk's
/// `SELECT` still named it. The table is described anew and the chunk read
/// again: every row arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_dropped_or_renamed_during_a_copy_does_not_fail_it() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    const ROWS: usize = 200_000;
    client
        .batch_execute(&format!(
            "CREATE TABLE t (id int PRIMARY KEY, v int, w int, x int); \
             INSERT INTO t SELECT g, g, g, g FROM generate_series(1, {ROWS}) g"
        ))
        .await
        .expect("table");
    let dir = temp_dir("schema-copy-drop");
    let (config, out) = file_pipeline(&dir, &pg.conninfo("postgres"), "snapshot.chunk_size = 2000");
    let host = Host::start(&dir, &config);
    crate::run::wait_for_line(&out, &host, |l| l["op"] == "snapshot");
    client
        .batch_execute("ALTER TABLE t DROP COLUMN w")
        .await
        .expect("drop");
    tokio::time::sleep(Duration::from_millis(200)).await;
    client
        .batch_execute("ALTER TABLE t RENAME COLUMN x TO y")
        .await
        .expect("rename");
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let copied: std::collections::HashSet<i64> = crate::run::lines(&out)
                .iter()
                .filter(|l| l["op"] == "snapshot")
                .filter_map(|l| l["new"]["id"].as_i64())
                .collect();
            if copied.len() == ROWS {
                break;
            }
            let log = host.log();
            assert!(
                !log.contains("snapshot of the table failed"),
                "the copy failed after {} rows\n{log}",
                copied.len()
            );
            assert!(
                std::time::Instant::now() < deadline,
                "{} rows copied\n{log}",
                copied.len()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .expect("every row copied");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A column added while a table is being copied: snapshot rows read with
/// the old columns never follow the schema change (a chunk read across the
/// change is read again), and snapshot rows read with the new columns are
/// announced even before a live change tells of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_column_added_during_a_copy_never_lets_old_rows_follow_the_schema_change() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    const ROWS: i64 = 200_000;
    client
        .batch_execute(&format!(
            "CREATE TABLE t (id int PRIMARY KEY, v int); \
             INSERT INTO t SELECT g, g FROM generate_series(1, {ROWS}) g"
        ))
        .await
        .expect("table");
    let dir = temp_dir("schema-copy");
    let (config, out) = file_pipeline(&dir, &pg.conninfo("postgres"), "snapshot.chunk_size = 2000");
    let host = Host::start(&dir, &config);
    // Some chunks copied, then the change, with live rows around it.
    crate::run::wait_for_line(&out, &host, |l| l["op"] == "snapshot");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(inserter(pg.conninfo("postgres"), ROWS + 1, stopped));
    tokio::time::sleep(Duration::from_millis(100)).await;
    client
        .batch_execute("ALTER TABLE t ADD COLUMN extra text")
        .await
        .expect("add");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = stop.send(true);
    writer.await.expect("writer");
    client
        .batch_execute("INSERT INTO t VALUES (-1, -1, 'last')")
        .await
        .expect("last");
    let lines = tokio::task::spawn_blocking({
        let out = out.clone();
        move || {
            let host = host;
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            loop {
                let lines = crate::run::lines(&out);
                let copied = lines.iter().filter(|l| l["op"] == "snapshot").count();
                let last = lines.iter().any(|l| l["new"]["id"] == -1);
                if last && copied as i64 >= ROWS {
                    return lines;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{copied} rows copied\n{}",
                    host.log()
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    })
    .await
    .expect("lines");
    let schema_at = lines
        .iter()
        .position(|l| l["op"] == "schema")
        .expect("a schema change");
    assert_eq!(lines.iter().filter(|l| l["op"] == "schema").count(), 1);
    let has_extra = |l: &Json| l["new"].get("extra").is_some();
    let rows = |l: &&Json| l["op"] == "snapshot" || l["op"] == "insert";
    assert!(
        lines[..schema_at]
            .iter()
            .filter(rows)
            .all(|l| !has_extra(l)),
        "a row of the new shape before its schema change"
    );
    let after: Vec<&Json> = lines[schema_at..].iter().filter(rows).collect();
    assert!(
        after.iter().all(|l| has_extra(l)),
        "a row of the old shape after the schema change: {:?}",
        after.iter().find(|l| !has_extra(l))
    );
    let _ = std::fs::remove_dir_all(&dir);
}
