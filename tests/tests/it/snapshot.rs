//! Snapshots against a real server and the real binary: a table's existing
//! rows copied in chunks while a writer changes it, into the postgres sink,
//! which must end equal to the source row for row; keys of every kind;
//! tables without a usable key; kill -9 in the middle of a copy.

use std::path::Path;
use std::time::{Duration, Instant};

use datum_tests::{cluster, connect};
use serde_json::Value as Json;

use crate::run::{Host, temp_dir, toml_string};

const TOKEN: &str = "snapshot-admin-token-0123456789abcdef";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A host with pipeline `p` from database `src` into database `dst` (the
/// postgres sink), its admin API on `port`; `extra` goes at the end.
fn config(src: &str, dst: &str, dir: &Path, port: u16, tables: &[&str], extra: &str) -> String {
    let tables: Vec<String> = tables.iter().map(|t| toml_string(t)).collect();
    format!(
        r#"
state = {state}

[admin]
listen = "127.0.0.1:{port}"
token = "{TOKEN}"

[[pipeline]]
name = "p"
source.url = {src}
source.tables = [{tables}]
sink = {{ type = "postgres", url = {dst} }}
{extra}
"#,
        state = toml_string(dir.join("state.redb").to_str().expect("utf-8")),
        src = toml_string(src),
        dst = toml_string(dst),
        tables = tables.join(", "),
    )
}

async fn status(port: u16) -> Option<Json> {
    let response = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/v1/pipelines/p"))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    serde_json::from_str(&response.text().await.ok()?).ok()
}

/// Each table's snapshot entry in the status of pipeline `p`.
async fn snapshots(port: u16) -> Vec<Json> {
    status(port)
        .await
        .and_then(|s| s["snapshots"].as_array().cloned())
        .unwrap_or_default()
}

/// Waits until every table named has reached `done` in the status.
async fn wait_done(port: u16, host: &Host, tables: &[&str], secs: u64) -> Vec<Json> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let entries = snapshots(port).await;
        let done = tables.iter().all(|t| {
            entries
                .iter()
                .any(|e| e["table"] == *t && e["state"] == "done")
        });
        if done {
            return entries;
        }
        assert!(
            Instant::now() < deadline,
            "snapshot of {tables:?} not done within {secs}s: {entries:?}\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A query's rows in text form, one line per row.
async fn rows(client: &tokio_postgres::Client, query: &str) -> Vec<String> {
    client
        .simple_query(query)
        .await
        .unwrap_or_else(|err| panic!("{query}: {err}"))
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                (0..row.len())
                    .map(|i| row.get(i).unwrap_or("NULL").to_owned())
                    .collect::<Vec<_>>()
                    .join(" | "),
            ),
            _ => None,
        })
        .collect()
}

/// Waits until `query` answers the same on both sides.
async fn wait_equal(
    src: &tokio_postgres::Client,
    dst: &tokio_postgres::Client,
    query: &str,
    host: &Host,
    secs: u64,
) -> usize {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let expected = rows(src, query).await;
        let actual = rows(dst, query).await;
        if expected == actual {
            return expected.len();
        }
        if Instant::now() > deadline {
            let missing: Vec<_> = expected
                .iter()
                .filter(|r| !actual.contains(r))
                .take(5)
                .collect();
            let extra: Vec<_> = actual
                .iter()
                .filter(|r| !expected.contains(r))
                .take(5)
                .collect();
            panic!(
                "{query}: target differs from source after {secs}s ({} vs {} rows); \
                 missing {missing:?}, extra {extra:?}\n{}",
                expected.len(),
                actual.len(),
                host.log()
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A small deterministic generator (no dependency for one test).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Random inserts, updates (some moving the key) and deletes of `t` until
/// `stop` says so; how many statements ran.
async fn writer(url: String, rows: u64, stop: tokio::sync::watch::Receiver<bool>) -> u64 {
    let client = connect(&url).await;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut statements = 0;
    let mut next_id = rows as i64 + 1;
    while !*stop.borrow() {
        let id = rng.below(rows) as i64 + 1;
        let sql = match rng.below(10) {
            0..=3 => format!("UPDATE t SET v = v + 1, note = 'u{statements}' WHERE id = {id}"),
            4 => {
                next_id += 1;
                format!("UPDATE t SET id = {next_id} WHERE id = {id}")
            }
            5 | 6 => format!("DELETE FROM t WHERE id = {id}"),
            _ => {
                next_id += 1;
                format!("INSERT INTO t VALUES ({next_id}, 0, 'new')")
            }
        };
        client
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        statements += 1;
        // A busy application, not a flood: the sink keeps up with it.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    statements
}

/// The whole promise: a table copied while a writer inserts, updates
/// (moving keys too) and deletes random rows of it ends equal to the source
/// in the postgres sink, row for row — no change lost, no row brought back
/// from before a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_copied_while_a_writer_changes_it_ends_equal_to_the_source() {
    let pg = cluster();
    let admin = connect(&pg.conninfo("postgres")).await;
    for db in ["src", "dst"] {
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .expect("database");
    }
    let src = connect(&pg.conninfo("src")).await;
    let dst = connect(&pg.conninfo("dst")).await;
    const ROWS: u64 = 200_000;
    src.batch_execute(&format!(
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text); \
         INSERT INTO t SELECT g, g % 97, 'row ' || g FROM generate_series(1, {ROWS}) g"
    ))
    .await
    .expect("source table");
    dst.batch_execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text)")
        .await
        .expect("target table");

    let dir = temp_dir("snapshot-writer");
    let port = free_port();
    let host = Host::start(
        &dir,
        &config(
            &pg.conninfo("src"),
            &pg.conninfo("dst"),
            &dir,
            port,
            &["public.t"],
            "[pipeline.snapshot]\nchunk_size = 2000\n",
        ),
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writing = tokio::spawn(writer(pg.conninfo("src"), ROWS, stopped));
    let entries = wait_done(port, &host, &["public.t"], 240).await;
    let _ = stop.send(true);
    let statements = writing.await.expect("writer");
    assert!(
        statements > 100,
        "the writer ran during the copy ({statements} statements)"
    );
    let entry = entries
        .iter()
        .find(|e| e["table"] == "public.t")
        .expect("an entry");
    assert!(
        entry["chunks"].as_u64().unwrap_or(0) >= ROWS / 2000,
        "copied in chunks: {entry}"
    );
    let count = wait_equal(&src, &dst, "SELECT * FROM t ORDER BY id", &host, 120).await;
    assert!(count as u64 > ROWS / 2, "{count} rows compared");
}
