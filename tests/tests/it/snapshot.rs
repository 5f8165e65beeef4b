//! Snapshots against a real server and the real binary: a table's existing
//! rows copied in chunks while a writer changes it, into the postgres sink,
//! which must end equal to the source row for row; keys of every kind;
//! tables without a usable key; kill -9 in the middle of a copy.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use datum_tests::{cluster, connect, free_port, rows};
use serde_json::Value as Json;

use crate::run::{Host, lines, temp_dir, toml_string, wait_for_line};

pub(crate) const TOKEN: &str = "snapshot-admin-token-0123456789abcdef";

/// A host with pipeline `p` from database `src` into database `dst` (the
/// postgres sink), its admin API on `port`; `extra` goes at the end.
pub(crate) fn config(
    src: &str,
    dst: &str,
    dir: &Path,
    port: u16,
    tables: &[&str],
    extra: &str,
) -> String {
    config_sink(src, dst, "", dir, port, tables, extra)
}

/// `config`, with `sink` settings of the postgres sink besides its url
/// (`, key = value` each).
pub(crate) fn config_sink(
    src: &str,
    dst: &str,
    sink: &str,
    dir: &Path,
    port: u16,
    tables: &[&str],
    extra: &str,
) -> String {
    let sink = format!(
        "{{ type = \"postgres\", url = {}{sink} }}",
        toml_string(dst)
    );
    host_config(src, dir, port, tables, &sink, extra)
}

/// A host with pipeline `p` from `src` into the file sink `DIR/out.jsonl`,
/// its admin API on `port`; `snapshot` is the body of its
/// `[pipeline.snapshot]` table.
fn file_config(src: &str, dir: &Path, port: u16, tables: &[&str], snapshot: &str) -> String {
    let out = toml_string(dir.join("out.jsonl").to_str().expect("utf-8"));
    let sink = format!("{{ type = \"file\", path = {out} }}");
    host_config(
        src,
        dir,
        port,
        tables,
        &sink,
        &format!("[pipeline.snapshot]\n{snapshot}"),
    )
}

/// A host with pipeline `p` from `src` over `tables` into `sink`, its state
/// in `dir`, its admin API on `port`; `extra` goes at the end.
fn host_config(
    src: &str,
    dir: &Path,
    port: u16,
    tables: &[&str],
    sink: &str,
    extra: &str,
) -> String {
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
sink = {sink}
{extra}
"#,
        state = toml_string(dir.join("state.redb").to_str().expect("utf-8")),
        src = toml_string(src),
        tables = tables.join(", "),
    )
}

/// Status of pipeline `p`, when the admin API answers.
pub(crate) async fn status(port: u16) -> Option<Json> {
    let response = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/v1/pipelines/p"))
        .bearer_auth(TOKEN)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    serde_json::from_str(&response.text().await.ok()?).ok()
}

/// Waits up to 30 s for pipeline `p` to be running.
async fn wait_running(port: u16, host: &Host) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while status(port).await.map(|s| s["state"] == "running") != Some(true) {
        assert!(Instant::now() < deadline, "not running\n{}", host.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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

/// Waits until each of `tables` is copying and has copied rows.
async fn wait_copying(port: u16, host: &Host, tables: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let entries = snapshots(port).await;
        let copying = |t: &str| {
            entries.iter().any(|e| {
                e["table"] == t && e["state"] == "copying" && e["rows"].as_u64().unwrap_or(0) > 0
            })
        };
        if tables.iter().all(|t| copying(t)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not all of {tables:?} copying: {entries:?}\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `table`'s copy has failed; its status entry.
async fn wait_failed(port: u16, host: &Host, table: &str) -> Json {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let entries = snapshots(port).await;
        if let Some(e) = entries
            .iter()
            .find(|e| e["table"] == table && e["state"] == "failed")
        {
            return e.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{table} did not fail: {entries:?}\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `query` answers the same on both sides.
pub(crate) async fn wait_equal(
    src: &tokio_postgres::Client,
    dst: &tokio_postgres::Client,
    query: &str,
    host: &Host,
    secs: u64,
) -> usize {
    let deadline = Instant::now() + Duration::from_secs(secs);
    // Polling compares a digest the servers compute (a count and a sum of
    // row hashes: cheap on a million rows, and it leaves the CPU to the
    // host); the rows themselves are compared once the digests agree, and
    // shown when time runs out.
    let digest = format!(
        "SELECT count(*)::text || ' ' || coalesce(sum(hashtext(q::text)::bigint), 0)::text \
         FROM ({query}) q"
    );
    loop {
        let late = Instant::now() > deadline;
        if late || rows(src, &digest).await == rows(dst, &digest).await {
            let expected = rows(src, query).await;
            let actual = rows(dst, query).await;
            if expected == actual {
                return expected.len();
            }
            if late {
                let (have, want): (HashSet<_>, HashSet<_>) =
                    (actual.iter().collect(), expected.iter().collect());
                let missing: Vec<_> = want.difference(&have).take(5).collect();
                let extra: Vec<_> = have.difference(&want).take(5).collect();
                panic!(
                    "{query}: target differs from source after {secs}s ({} vs {} rows); \
                     missing {missing:?}, extra {extra:?}\n{}",
                    expected.len(),
                    actual.len(),
                    host.log()
                );
            }
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
pub(crate) async fn writer(
    url: String,
    rows: u64,
    stop: tokio::sync::watch::Receiver<bool>,
) -> u64 {
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

/// Inserts a row into `small` (ids from `first`) every millisecond or so
/// until `stop` says so: live changes of another table than the one
/// copied. How many rows it inserted.
async fn inserter(url: String, first: i64, stop: tokio::sync::watch::Receiver<bool>) -> i64 {
    let client = connect(&url).await;
    let mut id = first;
    while !*stop.borrow() {
        client
            .batch_execute(&format!("INSERT INTO small (id) VALUES ({id})"))
            .await
            .unwrap_or_else(|e| panic!("inserting {id} into small: {e}"));
        id += 1;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    id - first
}

/// The whole promise: a table copied while a writer inserts, updates
/// (moving keys too) and deletes random rows of it ends equal to the source
/// in the postgres sink, row for row — no change lost, no row brought back
/// from before a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_copied_while_a_writer_changes_it_ends_equal_to_the_source() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    const ROWS: u64 = 1_000_000;
    src.batch_execute(&format!(
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text); \
         INSERT INTO t SELECT g, g % 97, 'row ' || g FROM generate_series(1, {ROWS}) g"
    ))
    .await
    .expect("source table");
    dst.batch_execute("CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text)")
        .await
        .expect("target table");

    let (host, port, _dir) = start(
        &pg,
        "snapshot-writer",
        &["public.t"],
        "[pipeline.snapshot]\nchunk_size = 5000\n",
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writing = tokio::spawn(writer(pg.conninfo("src"), ROWS, stopped));
    let entries = wait_done(port, &host, &["public.t"], 200).await;
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
        entry["chunks"].as_u64().unwrap_or(0) >= ROWS / 5000,
        "copied in chunks: {entry}"
    );
    let count = wait_equal(&src, &dst, "SELECT * FROM t ORDER BY id", &host, 60).await;
    assert!(count as u64 > ROWS / 2, "{count} rows compared");
}

/// `datum run` with pipeline `p` from `src` into `dst` (see `config`) in a
/// new directory named after `name`: the host, its admin port, the
/// directory.
fn start(
    pg: &datum_tests::Cluster,
    name: &str,
    tables: &[&str],
    extra: &str,
) -> (Host, u16, std::path::PathBuf) {
    let dir = temp_dir(name);
    let port = free_port();
    let config = config(
        &pg.conninfo("src"),
        &pg.conninfo("dst"),
        &dir,
        port,
        tables,
        extra,
    );
    (Host::start(&dir, &config), port, dir)
}

/// Creates databases `src` and `dst` in a new cluster; clients to both.
pub(crate) async fn two_databases(
    pg: &datum_tests::Cluster,
) -> (tokio_postgres::Client, tokio_postgres::Client) {
    let admin = connect(&pg.conninfo("postgres")).await;
    for db in ["src", "dst"] {
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await
            .expect("database");
    }
    (
        connect(&pg.conninfo("src")).await,
        connect(&pg.conninfo("dst")).await,
    )
}

/// Keys of every kind walk in chunks and arrive exactly: composite, text
/// (ordered by collation, compared by equality only), uuid, numeric, a
/// unique NOT NULL index instead of a primary key; an empty table; TOASTed
/// values. A table with no usable key fails with an error that names it and
/// says what to add, and the others are not held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_every_kind_are_copied_exactly_and_a_keyless_table_is_refused() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    let schema = [
        "CREATE TABLE composite (region text, n int, v text, PRIMARY KEY (region, n))",
        "CREATE TABLE texts (k text PRIMARY KEY, v int)",
        "CREATE TABLE uuids (id uuid PRIMARY KEY, v int)",
        "CREATE TABLE numerics (id numeric PRIMARY KEY, v text)",
        "CREATE TABLE uniq (code text NOT NULL, v int)",
        "CREATE UNIQUE INDEX uniq_code ON uniq (code)",
        "CREATE TABLE empty (id int PRIMARY KEY)",
        "CREATE TABLE toasted (id int PRIMARY KEY, big text)",
        "ALTER TABLE toasted ALTER COLUMN big SET STORAGE EXTERNAL",
    ];
    for sql in schema {
        src.batch_execute(sql).await.expect("source schema");
        dst.batch_execute(sql).await.expect("target schema");
    }
    src.batch_execute(
        "ALTER TABLE uniq REPLICA IDENTITY USING INDEX uniq_code;
         CREATE TABLE keyless (v int);
         ALTER TABLE keyless REPLICA IDENTITY FULL;
         INSERT INTO composite SELECT r, n, r || n FROM unnest(ARRAY['eu', 'us', 'ap', 'EU']) r,
             generate_series(1, 7) n;
         INSERT INTO texts VALUES ('a', 1), ('B', 2), ('é', 3), ('Z', 4), ('a b', 5), ('', 6),
             ('ä', 7), ('A', 8), ('b', 9), ('aa', 10), ('''quoted''', 11);
         INSERT INTO uuids SELECT md5(g::text)::uuid, g FROM generate_series(1, 25) g;
         INSERT INTO numerics SELECT g / 7.0, g::text FROM generate_series(-10, 10) g;
         INSERT INTO numerics VALUES (1e20, 'big'), (-0.000001, 'small');
         INSERT INTO uniq SELECT 'c' || g, g FROM generate_series(1, 12) g;
         INSERT INTO toasted SELECT g, repeat(md5(g::text), 300) FROM generate_series(1, 9) g;
         INSERT INTO keyless SELECT generate_series(1, 5);",
    )
    .await
    .expect("rows");
    let tables = [
        "public.composite",
        "public.texts",
        "public.uuids",
        "public.numerics",
        "public.uniq",
        "public.empty",
        "public.toasted",
        "public.keyless",
    ];
    let (host, port, _dir) = start(
        &pg,
        "snapshot-keys",
        &tables,
        "[pipeline.snapshot]\nchunk_size = 4\nparallel_tables = 3\n",
    );
    let entries = wait_done(port, &host, &tables[..7], 120).await;
    for (table, query) in [
        ("composite", "SELECT * FROM composite ORDER BY region, n"),
        ("texts", "SELECT * FROM texts ORDER BY k"),
        ("uuids", "SELECT * FROM uuids ORDER BY id"),
        ("numerics", "SELECT * FROM numerics ORDER BY id"),
        ("uniq", "SELECT * FROM uniq ORDER BY code"),
        ("empty", "SELECT * FROM empty"),
        (
            "toasted",
            "SELECT id, md5(big), length(big) FROM toasted ORDER BY id",
        ),
    ] {
        let n = wait_equal(&src, &dst, query, &host, 60).await;
        let entry = entries
            .iter()
            .find(|e| e["table"] == format!("public.{table}"))
            .expect("an entry");
        assert_eq!(entry["rows"].as_u64(), Some(n as u64), "{table}: {entry}");
    }
    // Several chunks each: the keyset walk crossed chunk boundaries.
    let chunks = |table: &str| {
        entries
            .iter()
            .find(|e| e["table"] == table)
            .and_then(|e| e["chunks"].as_u64())
            .unwrap_or(0)
    };
    assert!(chunks("public.composite") >= 7, "{entries:?}");
    assert!(chunks("public.texts") >= 3, "{entries:?}");

    let deadline = Instant::now() + Duration::from_secs(30);
    let keyless = loop {
        let entries = snapshots(port).await;
        if let Some(e) = entries
            .iter()
            .find(|e| e["table"] == "public.keyless" && e["state"] == "failed")
        {
            break e.clone();
        }
        assert!(
            Instant::now() < deadline,
            "keyless not refused: {entries:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let error = keyless["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("public.keyless") && error.contains("PRIMARY KEY"),
        "the error names the table and what to add: {error}"
    );
    // Live changes of the copied tables keep flowing.
    src.batch_execute("INSERT INTO texts VALUES ('after', 99); DELETE FROM uuids WHERE v = 3")
        .await
        .expect("live changes");
    wait_equal(&src, &dst, "SELECT * FROM texts ORDER BY k", &host, 30).await;
    wait_equal(&src, &dst, "SELECT * FROM uuids ORDER BY id", &host, 30).await;
}

/// A copy reads its chunks as `COPY`'s text rows, split at tabs, `\N` for
/// NULL, backslash escapes undone: keys and values holding tabs, newlines,
/// carriage returns, backslashes, the text `\N`, control characters and
/// emoji arrive exactly, in values of every text-printed kind (arrays and
/// json quote and escape inside, bytea prints a backslash first), and the
/// keyset walk carries such keys across chunk boundaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tabs_newlines_and_backslashes_in_keys_and_values_are_copied_exactly() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    let schema = "CREATE TABLE awkward (k text PRIMARY KEY, t text, j jsonb, a text[], \
                  b bytea, n numeric, f float8, ts timestamptz, i interval, c char(3))";
    src.batch_execute(schema).await.expect("source schema");
    dst.batch_execute(schema).await.expect("target schema");
    src.batch_execute(
        r#"INSERT INTO awkward (k, t) VALUES
             (E'tab\there', E'a\tb'), (E'line\nbreak', E'\n'), (E'back\\slash', E'\\'),
             ('\N', '\N'), (E'\\\\N', E'\\\\'), ('N', ''), (E'cr\r', E'\r\n'),
             ('', NULL), (E'ctl\x01\x08\x0b\x0c\x7f', E'\x01\x1f'), ('ü😀', 'ü😀'),
             (E'\\t', E'\\n'), (E'ends\\', E'ends\\');
           UPDATE awkward SET
             j = jsonb_build_object('v', t, 'k', k, 'nested', jsonb_build_array(k, NULL)),
             a = ARRAY[k, t, NULL, 'q"uote', E'\\', '{}'],
             b = convert_to(coalesce(t, '') || k, 'UTF8') || '\x005c09'::bytea,
             n = CASE WHEN k = '' THEN 'NaN' ELSE length(k) / 3.0 END,
             f = CASE WHEN k = '' THEN 'Infinity'::float8 ELSE -0.1 END,
             ts = CASE WHEN k = 'N' THEN 'infinity'::timestamptz
                       ELSE '2026-12-07 01:02:03.456789+00' END,
             i = '1 day 02:03:04.5',
             c = left(k, 3)
           WHERE k <> 'N';"#,
    )
    .await
    .expect("rows");
    let (host, port, _dir) = start(
        &pg,
        "snapshot-awkward",
        &["public.awkward"],
        "[pipeline.snapshot]\nchunk_size = 3\n",
    );
    let entries = wait_done(port, &host, &["public.awkward"], 60).await;
    let n = wait_equal(&src, &dst, "SELECT * FROM awkward ORDER BY k", &host, 60).await;
    assert_eq!(n, 12);
    let entry = entries
        .iter()
        .find(|e| e["table"] == "public.awkward")
        .expect("an entry");
    assert_eq!(entry["rows"].as_u64(), Some(12), "{entry}");
    assert!(entry["chunks"].as_u64().unwrap_or(0) >= 4, "{entry}");
    // The sink recorded the last transaction it applied of the table: the
    // copy's last high watermark.
    let recorded = dst
        .query(
            "SELECT stream FROM datum_applied WHERE source_table = 'public.awkward' \
             AND commit_lsn > '0/0'",
            &[],
        )
        .await
        .expect("the sink's record");
    assert_eq!(recorded.len(), 1);
    let stream: &str = recorded[0].get(0);
    assert!(stream.ends_with("/datum_p"), "{stream}");
}

/// kill -9 of the host at random moments during a copy, ten times, then a
/// run to the end, while one writer changes the copied table and another
/// inserts into a second one (whose changes pass the copy's rows): the
/// target equals the source, the copy resumed at its last checkpointed
/// chunk each time (never from the start), and a table that was done before
/// the first kill was never copied again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_copy_resumes_each_table_at_its_last_chunk() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    const ROWS: u64 = 300_000;
    for db in [&src, &dst] {
        db.batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
             CREATE TABLE small (id int PRIMARY KEY, v text)",
        )
        .await
        .expect("schema");
    }
    src.batch_execute(&format!(
        "INSERT INTO t SELECT g, g % 97, 'row ' || g FROM generate_series(1, {ROWS}) g;
         INSERT INTO small SELECT g, 'small ' || g FROM generate_series(1, 50) g"
    ))
    .await
    .expect("rows");
    let dir = temp_dir("snapshot-kill");
    let port = free_port();
    let config = config(
        &pg.conninfo("src"),
        &pg.conninfo("dst"),
        &dir,
        port,
        &["public.t", "public.small"],
        "[pipeline.snapshot]\nchunk_size = 2500\n",
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writing = tokio::spawn(writer(pg.conninfo("src"), ROWS, stopped.clone()));
    // Live changes of `small` pass the chunks of `t` (in parts: a chunk
    // is more than one part), between kills too.
    let inserting = tokio::spawn(inserter(pg.conninfo("src"), 1_000, stopped));
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut small_chunks = None;
    let mut resumed_at = Vec::new();
    for round in 0..10 {
        let host = Host::start(&dir, &config);
        // Wait for the API, then a random moment of the copy.
        let deadline = Instant::now() + Duration::from_secs(30);
        while status(port).await.is_none() {
            assert!(
                Instant::now() < deadline,
                "round {round}: no API\n{}",
                host.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let entries = snapshots(port).await;
        if let Some(t) = entries.iter().find(|e| e["table"] == "public.t") {
            resumed_at.push(t["checkpointed"]["rows"].as_u64().unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_millis(300 + rng.below(1200))).await;
        let entries = snapshots(port).await;
        if let Some(small) = entries
            .iter()
            .find(|e| e["table"] == "public.small" && e["checkpointed"]["state"] == "done")
        {
            let chunks = small["checkpointed"]["chunks"].as_u64();
            match small_chunks {
                None => small_chunks = chunks,
                Some(before) => assert_eq!(
                    chunks,
                    Some(before),
                    "round {round}: a completed table was copied again"
                ),
            }
        }
        drop(host); // SIGKILL
    }
    // Its deadlines end before the harness's (180 s), so a stall reports
    // the host's log; alone the whole test takes about 14 s.
    let host = Host::start(&dir, &config);
    wait_done(port, &host, &["public.t", "public.small"], 90).await;
    let _ = stop.send(true);
    writing.await.expect("writer");
    let inserted = inserting.await.expect("inserter");
    assert!(inserted > 100, "{inserted} rows inserted into small");
    wait_equal(&src, &dst, "SELECT * FROM t ORDER BY id", &host, 45).await;
    wait_equal(&src, &dst, "SELECT * FROM small ORDER BY id", &host, 30).await;
    assert!(
        resumed_at.windows(2).all(|w| w[0] <= w[1]),
        "each restart resumed at or after the last: {resumed_at:?}"
    );
    assert!(
        resumed_at.iter().any(|r| *r > 0),
        "some restart resumed mid-copy, not from the start: {resumed_at:?}"
    );
    let small = snapshots(port)
        .await
        .into_iter()
        .find(|e| e["table"] == "public.small")
        .expect("small");
    if let Some(before) = small_chunks {
        assert_eq!(small["chunks"].as_u64(), Some(before), "{small}");
    }
}

async fn post_backfill(port: u16, body: Json) -> (u16, Json) {
    let response = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/pipelines/p/backfill"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("the admin API answers");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Json::String(text)),
    )
}

/// Backfills on a running pipeline, without a restart: a table it did not
/// stream is added to the publication and copied, then streams live; a
/// table is copied again on demand (through `datum admin backfill`); a copy
/// from a key value onwards copies only the rows after it. Requests that
/// cannot be honoured say why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backfills_add_a_table_recopy_one_and_copy_from_a_key_on_a_running_pipeline() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    for db in [&src, &dst] {
        db.batch_execute(
            "CREATE TABLE a (id int PRIMARY KEY, v text);
             CREATE TABLE b (id int PRIMARY KEY, v text)",
        )
        .await
        .expect("schema");
    }
    src.batch_execute(
        "INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 100) g;
         INSERT INTO b SELECT g, 'b' || g FROM generate_series(1, 50) g",
    )
    .await
    .expect("rows");
    let (host, port, dir) = start(
        &pg,
        "snapshot-backfill",
        &["public.a"],
        "[pipeline.snapshot]\nmode = \"never\"\nchunk_size = 7\n",
    );
    wait_running(port, &host).await;
    // mode = "never": nothing copied, changes only.
    src.batch_execute("UPDATE a SET v = 'live' WHERE id = 1")
        .await
        .expect("update");
    wait_equal(&src, &dst, "SELECT * FROM a WHERE id = 1", &host, 30).await;
    assert_eq!(rows(&dst, "SELECT * FROM a").await.len(), 1);

    // Refusals say why.
    let (code, body) = post_backfill(port, serde_json::json!({"tables": ["nope"]})).await;
    assert_eq!(code, 400, "{body}");
    assert!(body.to_string().contains("nope"), "{body}");
    let (code, body) = post_backfill(
        port,
        serde_json::json!({"tables": ["a", "b"], "from": ["3"]}),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = post_backfill(
        port,
        serde_json::json!({"tables": ["b"], "from": ["1", "2"]}),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(body.to_string().contains("key of public.b"), "{body}");

    // A new table: published, copied, then live.
    let (code, body) = post_backfill(port, serde_json::json!({"tables": ["b"]})).await;
    assert_eq!(code, 202, "{body}");
    assert_eq!(body["tables"], serde_json::json!(["public.b"]));
    wait_done(port, &host, &["public.b"], 60).await;
    wait_equal(&src, &dst, "SELECT * FROM b ORDER BY id", &host, 30).await;
    let published = rows(
        &src,
        "SELECT tablename FROM pg_publication_tables WHERE pubname = 'datum_p' ORDER BY 1",
    )
    .await;
    assert_eq!(published, ["a", "b"]);
    src.batch_execute("INSERT INTO b VALUES (51, 'live'); DELETE FROM b WHERE id = 2")
        .await
        .expect("live changes to b");
    wait_equal(&src, &dst, "SELECT * FROM b ORDER BY id", &host, 30).await;

    // Copy `a` again, through the command line: the target had lost rows.
    dst.batch_execute("DELETE FROM a").await.expect("diverge");
    let output = std::process::Command::new(datum_tests::datum_bin())
        .args(["admin", "--config"])
        .arg(dir.join("datum.toml"))
        .args(["backfill", "p", "public.a"])
        .output()
        .expect("datum admin backfill");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && out.contains("public.a"),
        "{out}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    wait_done(port, &host, &["public.a"], 60).await;
    wait_equal(&src, &dst, "SELECT * FROM a ORDER BY id", &host, 30).await;

    // From a key on: only the rows after it.
    dst.batch_execute("DELETE FROM b WHERE id > 40")
        .await
        .expect("diverge");
    let (code, body) =
        post_backfill(port, serde_json::json!({"tables": ["b"], "from": ["40"]})).await;
    assert_eq!(code, 202, "{body}");
    let entries = wait_done(port, &host, &["public.b"], 60).await;
    wait_equal(&src, &dst, "SELECT * FROM b ORDER BY id", &host, 30).await;
    let b = entries
        .iter()
        .find(|e| e["table"] == "public.b")
        .expect("b");
    assert_eq!(b["rows"], 11, "ids 41..=51 only: {b}");
}

/// A server whose catalog answers with another column type than Datum's
/// query asks for gets a clear error, and the host goes on. The catalog
/// here is the source database's own: a view named `pg_attribute` ahead of
/// `pg_catalog` in the database's `search_path`, its `attnum` an `int8`.
/// Reading that answer used to panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_catalog_column_of_another_type_fails_the_backfill_with_an_error_not_a_panic() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    for db in [&src, &dst] {
        db.batch_execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
            .await
            .expect("schema");
    }
    src.batch_execute(
        "INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 20) g;
         CREATE SCHEMA shadow;
         CREATE VIEW shadow.pg_attribute AS
             SELECT attrelid, attnum::int8 AS attnum, attname, atttypid, atttypmod,
                    attisdropped, attgenerated, attnotnull
             FROM pg_catalog.pg_attribute",
    )
    .await
    .expect("rows and the view");
    let (host, port, _dir) = start(
        &pg,
        "snapshot-catalog-types",
        &["public.a"],
        "[pipeline.snapshot]\nmode = \"never\"\n",
    );
    wait_running(port, &host).await;
    // New sessions of the source database now read the view.
    src.batch_execute("ALTER DATABASE src SET search_path = shadow, pg_catalog, public")
        .await
        .expect("search_path");
    let (code, body) = post_backfill(port, serde_json::json!({"tables": ["a"]})).await;
    assert_eq!(code, 400, "{body}\n{}", host.log());
    assert!(
        body.to_string().contains("cannot read"),
        "the error says what the server sent: {body}"
    );
    assert!(
        !host.log().contains("panicked"),
        "no panic:\n{}",
        host.log()
    );

    // The pipeline goes on streaming, and once the catalog reads as it
    // should, the same backfill copies the table.
    src.batch_execute("INSERT INTO a VALUES (21, 'live')")
        .await
        .expect("insert");
    wait_equal(&src, &dst, "SELECT * FROM a WHERE id = 21", &host, 30).await;
    src.batch_execute("ALTER DATABASE src RESET search_path")
        .await
        .expect("reset");
    let (code, body) = post_backfill(port, serde_json::json!({"tables": ["a"]})).await;
    assert_eq!(code, 202, "{body}");
    wait_done(port, &host, &["public.a"], 60).await;
    wait_equal(&src, &dst, "SELECT * FROM a ORDER BY id", &host, 30).await;
}

/// One table never stalls the others: of three tables (1,000, 100,000 and
/// 3,000,000 rows), the two small ones are done and their live changes
/// reach the sink, within a second or two of their commit, while the large
/// one is still copying.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_tables_are_done_and_stream_live_while_a_large_one_is_still_copying() {
    let pg = cluster();
    let src = connect(&pg.conninfo("postgres")).await;
    src.batch_execute(
        "CREATE TABLE big (id int PRIMARY KEY, v int);
         CREATE TABLE medium (id int PRIMARY KEY, v int);
         CREATE TABLE small (id int PRIMARY KEY, v int);
         INSERT INTO small SELECT g, g FROM generate_series(1, 1000) g;
         INSERT INTO medium SELECT g, g FROM generate_series(1, 100000) g;
         INSERT INTO big SELECT g, g FROM generate_series(1, 3000000) g;
         ANALYZE big",
    )
    .await
    .expect("tables");
    let dir = temp_dir("snapshot-independent");
    let port = free_port();
    let out = dir.join("out.jsonl");
    let host = Host::start(
        &dir,
        &file_config(
            &pg.conninfo("postgres"),
            &dir,
            port,
            &["public.big", "public.medium", "public.small"],
            "chunk_size = 5000\nparallel_tables = 2\n",
        ),
    );
    let entries = wait_done(port, &host, &["public.small", "public.medium"], 120).await;
    let big = entries
        .iter()
        .find(|e| e["table"] == "public.big")
        .expect("big");
    assert_eq!(big["state"], "copying", "{big}");

    let mut latencies = Vec::new();
    for (i, table) in ["small", "medium", "small", "medium"].iter().enumerate() {
        let id = 10_000_000 + i as i64;
        let committed = Instant::now();
        src.batch_execute(&format!("INSERT INTO {table} VALUES ({id}, -1)"))
            .await
            .expect("live insert");
        let deadline = committed + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            if text.contains(&format!("\"id\":{id},")) {
                latencies.push(committed.elapsed());
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the live insert into {table} did not arrive\n{}",
                host.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let entries = snapshots(port).await;
    let big = entries
        .iter()
        .find(|e| e["table"] == "public.big")
        .expect("big");
    assert_eq!(
        big["state"], "copying",
        "still copying when the small tables' changes arrived: {big}"
    );
    eprintln!("live latency while a 3,000,000-row table copies: {latencies:?}");
    let worst = latencies.iter().max().copied().unwrap_or_default();
    assert!(
        worst < Duration::from_secs(5),
        "live changes of done tables waited {worst:?} behind the large copy"
    );
}

/// A copy does not hold up other tables' live changes: they pass the rows
/// of its chunks on the way to the sink, while the copied table's own
/// changes keep their place behind its rows, so the file sink, replayed,
/// ends equal to the source. Checked in the order of the sink's lines: some
/// live insert into `small` comes before rows of a chunk placed at an
/// earlier position, and no row of `t` comes after a live change of `t`
/// committed later than its chunk was placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_changes_of_other_tables_pass_a_copy_and_the_copied_tables_keep_their_order() {
    let passed = copy_beside_live_writers("table").await;
    assert!(
        passed > 0,
        "no live insert into small passed the rows of a chunk placed before it"
    );
}

/// With `snapshot.order = "commit"` nothing passes: every line of the sink
/// comes in commit order, copied rows at their chunk's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_order_commit_keeps_every_change_in_commit_order_across_tables() {
    let passed = copy_beside_live_writers("commit").await;
    assert_eq!(passed, 0, "chunks passed by a later insert into small");
}

/// Copies `t` (300,000 rows) into the file sink with `snapshot.order =
/// order` while one writer changes `t` and another inserts into `small`;
/// checks the sink's order (the rows of `t` never after a later change of
/// `t`; under `commit`, no line after a later one) and its final `t`
/// against the source. How many chunks a later insert into `small` passed.
async fn copy_beside_live_writers(order: &str) -> usize {
    let pg = cluster();
    let src = connect(&pg.conninfo("postgres")).await;
    const ROWS: u64 = 300_000;
    src.batch_execute(&format!(
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
         INSERT INTO t SELECT g, g % 97, 'row ' || g FROM generate_series(1, {ROWS}) g;
         CREATE TABLE small (id int PRIMARY KEY);
         ANALYZE t"
    ))
    .await
    .expect("tables");
    let dir = temp_dir(&format!("snapshot-order-{order}"));
    let port = free_port();
    let out = dir.join("out.jsonl");
    let host = Host::start(
        &dir,
        &file_config(
            &pg.conninfo("postgres"),
            &dir,
            port,
            &["public.t", "public.small"],
            &format!("chunk_size = 10000\norder = \"{order}\"\n"),
        ),
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writing = tokio::spawn(writer(pg.conninfo("postgres"), ROWS, stopped.clone()));
    let inserting = tokio::spawn(inserter(pg.conninfo("postgres"), 1, stopped));
    wait_done(port, &host, &["public.t", "public.small"], 120).await;
    let _ = stop.send(true);
    let statements = writing.await.expect("writer");
    let inserted = inserting.await.expect("inserts");
    src.batch_execute("INSERT INTO small VALUES (-1)")
        .await
        .expect("the last insert");
    wait_for_line(&out, &host, |l| {
        l["table"] == "small" && l["new"]["id"] == -1
    });
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");

    let lsn = |line: &Json| -> u64 {
        line["txn"]["commit_lsn"]
            .as_str()
            .and_then(|l| l.parse::<datum::Lsn>().ok())
            .map_or(0, |l| l.0)
    };
    let int = |value: &Json| {
        value
            .as_i64()
            .unwrap_or_else(|| panic!("an integer: {value}"))
    };
    // The newest live change seen so far in the sink's order, per table.
    let (mut small_newest, mut t_newest) = (0u64, 0u64);
    let mut passed: HashSet<u64> = HashSet::new();
    let mut replayed: std::collections::BTreeMap<i64, (i64, Json)> = Default::default();
    let mut copied_rows = 0u64;
    let mut newest = 0u64;
    for line in lines(&out) {
        let at = lsn(&line);
        if order == "commit" {
            assert!(
                at >= newest,
                "{line} came after a line committed at {newest:x}"
            );
        }
        newest = newest.max(at);
        match (line["table"].as_str(), line["op"].as_str()) {
            (Some("small"), Some("insert")) => small_newest = small_newest.max(at),
            (Some("t"), Some("snapshot")) => {
                copied_rows += 1;
                if at < small_newest {
                    passed.insert(at);
                }
                assert!(
                    at > t_newest,
                    "a row of t copied at {at:x} came after a live change of t committed at {t_newest:x}: {line}"
                );
                let new = &line["new"];
                replayed.insert(int(&new["id"]), (int(&new["v"]), new["note"].clone()));
            }
            (Some("t"), Some(op)) => {
                t_newest = t_newest.max(at);
                if let Some(old) = line["old"].as_object() {
                    replayed.remove(&int(&old["id"]));
                }
                if op != "delete" {
                    let new = &line["new"];
                    replayed.insert(int(&new["id"]), (int(&new["v"]), new["note"].clone()));
                }
            }
            _ => {}
        }
    }
    eprintln!(
        "{copied_rows} rows copied, {statements} changes of t, {inserted} inserts into small; \
         chunks passed by a later insert into small: {}",
        passed.len()
    );
    assert!(copied_rows >= ROWS / 2, "{copied_rows} rows copied");
    assert!(
        statements > 10 && inserted > 10,
        "the writers ran during the copy"
    );
    let source: Vec<(i64, i64, Json)> = src
        .query("SELECT id, v, note FROM t ORDER BY id", &[])
        .await
        .expect("the source")
        .iter()
        .map(|r| {
            let note: Option<String> = r.get(2);
            (
                i64::from(r.get::<_, i32>(0)),
                i64::from(r.get::<_, i32>(1)),
                note.map_or(Json::Null, Json::String),
            )
        })
        .collect();
    let sink: Vec<(i64, i64, Json)> = replayed
        .into_iter()
        .map(|(id, (v, note))| (id, v, note))
        .collect();
    assert_eq!(
        sink.len(),
        source.len(),
        "rows of t in the sink and the source"
    );
    assert!(sink == source, "the sink's t differs from the source");
    passed.len()
}

/// Pipeline `p` streaming `public.{table}` (nothing copied until a
/// backfill, chunks of `chunk_size` rows), after
/// [`with_a_standby_that_never_answers`].
async fn streaming_beside_a_standby_that_never_answers(
    pg: &datum_tests::Cluster,
    table: &str,
    chunk_size: usize,
) -> (Host, u16) {
    with_a_standby_that_never_answers(pg).await;
    let (host, port, _dir) = start(
        pg,
        &format!("snapshot-unseen-{table}"),
        &[&format!("public.{table}")],
        &format!("[pipeline.snapshot]\nmode = \"never\"\nchunk_size = {chunk_size}\n"),
    );
    wait_running(port, &host).await;
    (host, port)
}

/// Makes the commits of sessions that ask for it (`synchronous_commit =
/// on`) wait for a synchronous standby, `ghost`, that never connects;
/// every other session commits locally.
async fn with_a_standby_that_never_answers(pg: &datum_tests::Cluster) {
    let admin = connect(&pg.conninfo("postgres")).await;
    for statement in [
        "ALTER SYSTEM SET synchronous_standby_names = 'ghost'",
        "ALTER SYSTEM SET synchronous_commit = 'local'",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(statement).await.expect(statement);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let fresh = connect(&pg.conninfo("postgres")).await;
        if rows(&fresh, "SHOW synchronous_standby_names").await == ["ghost"] {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the configuration was not reloaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A transaction whose commit waits for the standby that never answers:
/// its commit record is in the WAL, and the stream delivers it, but other
/// sessions do not see it until it is released.
struct Stalled {
    pid: i32,
    done: tokio::task::JoinHandle<()>,
}

impl Stalled {
    async fn start(url: &str, statement: &'static str) -> Stalled {
        let client = connect(url).await;
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("pid")
            .get(0);
        client
            .batch_execute("SET synchronous_commit = on")
            .await
            .expect("synchronous_commit");
        let done = tokio::spawn(async move {
            client.batch_execute(statement).await.expect(statement);
        });
        Stalled { pid, done }
    }

    /// Cancels the wait: the transaction, committed all along, becomes
    /// visible.
    async fn release(self, admin: &tokio_postgres::Client) {
        admin
            .execute("SELECT pg_cancel_backend($1)", &[&self.pid])
            .await
            .expect("cancel");
        self.done.await.expect("the stalled statement");
    }
}

/// The state of `table` in the status of pipeline `p` once its copy is
/// done or its rows have not moved for two seconds (30 s at most).
async fn copy_done_or_waiting(port: u16, table: &str) -> Json {
    let entry = |entries: Vec<Json>| {
        entries
            .into_iter()
            .find(|e| e["table"] == table)
            .unwrap_or(Json::Null)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = entry(snapshots(port).await);
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = entry(snapshots(port).await);
        if now["state"] == "done" || Instant::now() > deadline {
            return now;
        }
        if now["rows"] != last["rows"] || now["state"] != last["state"] {
            since = Instant::now();
        } else if since.elapsed() >= Duration::from_secs(2) {
            return now;
        }
        last = now;
    }
}

/// A delete committed before a backfill starts but not yet visible (its
/// commit waits for a synchronous standby): the stream delivers it, and the
/// copy, which would read the row still there and bring it back, waits
/// until the delete is visible. A chunk read too early used to undo it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_committed_but_not_yet_visible_when_a_backfill_starts_is_not_undone_by_it() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    for db in [&src, &dst] {
        db.batch_execute(
            "CREATE TABLE a (id int PRIMARY KEY, v text);
             INSERT INTO a SELECT g, 'a' || g FROM generate_series(1, 100) g",
        )
        .await
        .expect("tables");
    }
    let (host, port) = streaming_beside_a_standby_that_never_answers(&pg, "a", 10).await;
    let stalled = Stalled::start(&pg.conninfo("src"), "DELETE FROM a WHERE id = 7").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !rows(&dst, "SELECT id FROM a WHERE id = 7").await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the stream did not deliver the delete\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        rows(&src, "SELECT id FROM a WHERE id = 7").await.len(),
        1,
        "the delete is not visible in the source yet"
    );

    let (code, body) = post_backfill(port, serde_json::json!({"tables": ["a"]})).await;
    assert_eq!(code, 202, "{body}");
    let copy = Copy {
        pg: &pg,
        src: &src,
        dst: &dst,
        host: &host,
        port,
    };
    copy.waits_for(stalled, "a", 7).await;
}

/// A copy on pipeline `p` from `src` into the postgres sink `dst`.
struct Copy<'a> {
    pg: &'a datum_tests::Cluster,
    src: &'a tokio_postgres::Client,
    dst: &'a tokio_postgres::Client,
    host: &'a Host,
    port: u16,
}

impl Copy<'_> {
    /// `stalled` deletes row `id` of `table`: the copy waits without
    /// bringing the row back, then, the delete released, ends with the
    /// sink equal to the source.
    async fn waits_for(&self, stalled: Stalled, table: &str, id: i32) {
        let waiting = copy_done_or_waiting(self.port, &format!("public.{table}")).await;
        let deleted = format!("SELECT id FROM {table} WHERE id = {id}");
        assert!(
            rows(self.dst, &deleted).await.is_empty(),
            "the copy brought back the row the delete removed: {waiting}"
        );
        assert_ne!(
            waiting["state"], "done",
            "the copy went on while a committed delete was not visible: {waiting}"
        );
        stalled
            .release(&connect(&self.pg.conninfo("postgres")).await)
            .await;
        wait_done(self.port, self.host, &[&format!("public.{table}")], 60).await;
        let all = format!("SELECT * FROM {table} ORDER BY id");
        wait_equal(self.src, self.dst, &all, self.host, 30).await;
    }
}

/// The same, the delete committed while the copy runs: every chunk read
/// before the delete is visible is read again, so the deleted row, still
/// ahead of the copy, never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_committed_but_not_yet_visible_during_a_copy_is_not_undone_by_its_chunks() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    for db in [&src, &dst] {
        db.batch_execute("CREATE TABLE b (id int PRIMARY KEY, v text)")
            .await
            .expect("tables");
    }
    src.batch_execute("INSERT INTO b SELECT g, 'b' || g FROM generate_series(1, 20000) g")
        .await
        .expect("rows");
    let (host, port) = streaming_beside_a_standby_that_never_answers(&pg, "b", 20).await;
    let (code, body) = post_backfill(port, serde_json::json!({"tables": ["b"]})).await;
    assert_eq!(code, 202, "{body}");
    wait_copying(port, &host, &["public.b"]).await;
    let stalled = Stalled::start(&pg.conninfo("src"), "DELETE FROM b WHERE id = 20000").await;
    let copy = Copy {
        pg: &pg,
        src: &src,
        dst: &dst,
        host: &host,
        port,
    };
    copy.waits_for(stalled, "b", 20000).await;
}

/// Regression: a copy read every column and row of a table whose
/// publication lists columns and filters rows (PostgreSQL 15 and later): it
/// sent the column the publication withholds and rows the stream never
/// changes again, and, its chunks never matching the stream's description
/// of the table, read a table written meanwhile again and again. It copies
/// what the publication publishes: replayed, the sink holds the published
/// columns of the published rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_s_column_list_and_row_filter_apply_to_the_copy() {
    const ROWS: i64 = 20_000;
    let pg = cluster();
    let src = connect(&pg.conninfo("postgres")).await;
    src.batch_execute(&format!(
        "CREATE TABLE t (id int PRIMARY KEY, v int, secret text);
         INSERT INTO t SELECT g, g, 'secret ' || g FROM generate_series(1, {ROWS}) g;
         CREATE PUBLICATION pub FOR TABLE t (id, v) WHERE (id % 2 = 0)"
    ))
    .await
    .expect("publication");
    let dir = temp_dir("snapshot-published");
    let port = free_port();
    let out = dir.join("out.jsonl");
    let sink = format!(
        "{{ type = \"file\", path = {} }}",
        toml_string(out.to_str().expect("utf-8"))
    );
    let host = Host::start(
        &dir,
        &host_config(
            &pg.conninfo("postgres"),
            &dir,
            port,
            &["public.t"],
            &sink,
            "source.publication = \"pub\"\n[pipeline.snapshot]\nchunk_size = 500\n",
        ),
    );
    // Published rows change while they are copied.
    let url = pg.conninfo("postgres");
    let writer = tokio::spawn(async move {
        let client = connect(&url).await;
        for i in 0..300i64 {
            let id = (i * 194) % ROWS + 2;
            client
                .execute("UPDATE t SET v = v + 1 WHERE id = $1", &[&(id as i32)])
                .await
                .expect("update");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    });
    wait_done(port, &host, &["public.t"], 60).await;
    writer.await.expect("writer");
    src.batch_execute("UPDATE t SET v = -1 WHERE id = 2")
        .await
        .expect("last");
    let deadline = Instant::now() + Duration::from_secs(30);
    let replayed = loop {
        let mut replayed = std::collections::BTreeMap::new();
        for line in lines(&out) {
            let new = &line["new"];
            assert!(
                new.get("secret").is_none(),
                "a column the publication does not publish: {line}"
            );
            if let (Some(id), Some(v)) = (new["id"].as_i64(), new["v"].as_i64()) {
                assert_eq!(id % 2, 0, "a row the publication filters out: {line}");
                replayed.insert(id, v);
            }
        }
        if replayed.get(&2) == Some(&-1) {
            break replayed;
        }
        assert!(
            Instant::now() < deadline,
            "the last update did not arrive\n{}",
            host.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let source: std::collections::BTreeMap<i64, i64> = src
        .query("SELECT id, v FROM t WHERE id % 2 = 0 ORDER BY id", &[])
        .await
        .expect("source")
        .iter()
        .map(|r| (i64::from(r.get::<_, i32>(0)), i64::from(r.get::<_, i32>(1))))
        .collect();
    assert_eq!(replayed.len(), source.len());
    assert!(
        replayed == source,
        "the sink, replayed, differs from the published rows"
    );
}

/// Regression: a copy read a table together with the tables that inherit
/// from it, so their rows reached the sink as rows of the parent (whose
/// key is not even unique across them). It reads the parent's own rows
/// only; a child is copied as itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_with_inheriting_children_is_copied_without_their_rows() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    for db in [&src, &dst] {
        db.batch_execute(
            "CREATE TABLE parent (id int PRIMARY KEY, v text);
             CREATE TABLE child (PRIMARY KEY (id)) INHERITS (parent)",
        )
        .await
        .expect("tables");
    }
    src.batch_execute(
        "INSERT INTO parent SELECT g, 'parent ' || g FROM generate_series(1, 100) g;
         INSERT INTO child SELECT g, 'child ' || g FROM generate_series(50, 150) g",
    )
    .await
    .expect("rows");
    let (host, port, _dir) = start(
        &pg,
        "snapshot-inherits",
        &["public.parent", "public.child"],
        "[pipeline.snapshot]\nchunk_size = 30\n",
    );
    wait_done(port, &host, &["public.parent", "public.child"], 60).await;
    for query in [
        "SELECT * FROM ONLY parent ORDER BY id",
        "SELECT * FROM child ORDER BY id",
    ] {
        wait_equal(&src, &dst, query, &host, 30).await;
    }
}

/// Regression: under REPLICA IDENTITY USING INDEX a copy walked the
/// primary key, but a delete carries only the identity index's columns
/// (and an update that changes the primary key alone, no old key), so the
/// copy could not tell which of its rows the stream had changed between a
/// chunk's watermarks, and placed them after the change: a deleted row came
/// back. It walks the index the stream identifies rows by: here the rows
/// arrive in `email` order, the reverse of `id`'s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_with_replica_identity_using_index_is_copied_along_that_index() {
    let pg = cluster();
    let src = connect(&pg.conninfo("postgres")).await;
    src.batch_execute(
        "CREATE TABLE ident (id int PRIMARY KEY, email text NOT NULL);
         CREATE UNIQUE INDEX ident_email ON ident (email);
         ALTER TABLE ident REPLICA IDENTITY USING INDEX ident_email;
         INSERT INTO ident SELECT g, 'user' || lpad((1000 - g)::text, 4, '0')
           FROM generate_series(1, 30) g",
    )
    .await
    .expect("table");
    let dir = temp_dir("snapshot-ident");
    let port = free_port();
    let host = Host::start(
        &dir,
        &file_config(
            &pg.conninfo("postgres"),
            &dir,
            port,
            &["public.ident"],
            "chunk_size = 7\n",
        ),
    );
    wait_done(port, &host, &["public.ident"], 60).await;
    let ids: Vec<i64> = lines(&dir.join("out.jsonl"))
        .into_iter()
        .filter(|line| line["op"] == "snapshot")
        .filter_map(|line| line["new"]["id"].as_i64())
        .collect();
    assert_eq!(ids, (1..=30).rev().collect::<Vec<i64>>(), "in email order");
}

/// `max_rows_per_second` paces a pipeline's copies, all tables together:
/// two tables of 2,000 rows in chunks of 500 at 2,000 rows/s make eight
/// chunks of rows, each with a quarter of a second of its own, so the last
/// cannot start before 1.75 s (without the limit the copy took 0.25 s
/// here). The rows all arrive, as without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_rows_per_second_paces_the_copies_of_all_tables_together() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    for db in [&src, &dst] {
        db.batch_execute(
            "CREATE TABLE p1 (id int PRIMARY KEY, v text);
             CREATE TABLE p2 (id int PRIMARY KEY, v text)",
        )
        .await
        .expect("tables");
    }
    src.batch_execute(
        "INSERT INTO p1 SELECT g, 'a' || g FROM generate_series(1, 2000) g;
         INSERT INTO p2 SELECT g, 'b' || g FROM generate_series(1, 2000) g",
    )
    .await
    .expect("rows");
    let (host, port, _dir) = start(
        &pg,
        "snapshot-paced",
        &["public.p1", "public.p2"],
        "[pipeline.snapshot]\nmode = \"never\"\nchunk_size = 500\nmax_rows_per_second = 2000\n",
    );
    wait_running(port, &host).await;
    let started = Instant::now();
    let (code, body) = post_backfill(port, serde_json::json!({"tables": ["p1", "p2"]})).await;
    assert_eq!(code, 202, "{body}");
    wait_done(port, &host, &["public.p1", "public.p2"], 60).await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1750),
        "4,000 rows at 2,000 rows/s in chunks of 500 copied in {took:?}"
    );
    for table in ["p1", "p2"] {
        let all = format!("SELECT * FROM {table} ORDER BY id");
        wait_equal(&src, &dst, &all, &host, 30).await;
    }
}

/// A synchronous standby that does not answer holds every commit that
/// waits for it, but not a copy: its watermarks carry no data and commit
/// once flushed locally, so the copy neither stalls while the standby is
/// down nor pays its round trip twice a chunk. With the server's default
/// (`synchronous_commit = on`) the first watermark used to wait for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_is_not_held_by_a_synchronous_standby_that_does_not_answer() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    for db in [&src, &dst] {
        db.batch_execute("CREATE TABLE c (id int PRIMARY KEY, v text)")
            .await
            .expect("tables");
    }
    src.batch_execute("INSERT INTO c SELECT g, 'c' || g FROM generate_series(1, 1000) g")
        .await
        .expect("rows");
    let (host, port) = streaming_beside_a_standby_that_never_answers(&pg, "c", 100).await;
    // From here every new session of `src` waits for the standby to commit,
    // as on a server whose standby is down.
    src.batch_execute("ALTER DATABASE src SET synchronous_commit = on")
        .await
        .expect("synchronous_commit for src");
    assert_eq!(
        rows(
            &connect(&pg.conninfo("src")).await,
            "SHOW synchronous_commit"
        )
        .await,
        ["on"]
    );

    let (code, body) = post_backfill(port, serde_json::json!({"tables": ["c"]})).await;
    assert_eq!(code, 202, "{body}");
    wait_done(port, &host, &["public.c"], 30).await;
    wait_equal(&src, &dst, "SELECT * FROM c ORDER BY id", &host, 30).await;
}

/// Errors a copy meets on the way: a table dropped during its copy fails
/// with an error that says what happened and what to do, and the pipeline
/// goes on; a table truncated during its copy ends equal to the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_dropped_or_truncated_during_its_copy() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    for db in [&src, &dst] {
        db.batch_execute(
            "CREATE TABLE dropped (id int PRIMARY KEY, v text);
             CREATE TABLE truncated (id int PRIMARY KEY, v text)",
        )
        .await
        .expect("schema");
    }
    src.batch_execute(
        "INSERT INTO dropped SELECT g, 'd' || g FROM generate_series(1, 500000) g;
         INSERT INTO truncated SELECT g, 't' || g FROM generate_series(1, 500000) g",
    )
    .await
    .expect("rows");
    let (host, port, _dir) = start(
        &pg,
        "snapshot-drop",
        &["public.dropped", "public.truncated"],
        "[pipeline.snapshot]\nchunk_size = 200\n",
    );
    // Both mid-copy.
    wait_copying(port, &host, &["public.dropped", "public.truncated"]).await;
    src.batch_execute(
        "TRUNCATE truncated; INSERT INTO truncated VALUES (1, 'after'); DROP TABLE dropped",
    )
    .await
    .expect("truncate and drop");

    wait_done(port, &host, &["public.truncated"], 120).await;
    wait_equal(&src, &dst, "SELECT * FROM truncated ORDER BY id", &host, 60).await;
    let failed = wait_failed(port, &host, "public.dropped").await;
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("public.dropped") && error.contains("backfill"),
        "the error says what happened and what to do: {error}"
    );
    // The pipeline goes on.
    src.batch_execute("INSERT INTO truncated VALUES (2, 'later')")
        .await
        .expect("insert");
    wait_equal(&src, &dst, "SELECT * FROM truncated ORDER BY id", &host, 30).await;
}

/// A table whose primary key moved to other columns of the same types
/// during its copy: the copy went on from its cursor, whose values were
/// then read as the new key's, and silently skipped rows (the table ended
/// `done` without them). It fails now, naming the change and the backfill
/// to run; that backfill copies the table whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_moved_to_other_columns_during_a_copy_fails_the_table_instead_of_skipping_rows() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    for db in [&src, &dst] {
        db.batch_execute("CREATE TABLE t (a int PRIMARY KEY, b int NOT NULL UNIQUE, v text)")
            .await
            .expect("schema");
    }
    src.batch_execute(
        "INSERT INTO t SELECT g, 20001 - g, 'v' || g FROM generate_series(1, 20000) g",
    )
    .await
    .expect("rows");
    let (host, port, _dir) = start(
        &pg,
        "snapshot-key-moved",
        &["public.t"],
        "[pipeline.snapshot]\nchunk_size = 200\nmax_rows_per_second = 2000\n",
    );
    wait_copying(port, &host, &["public.t"]).await;
    src.batch_execute("ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (b)")
        .await
        .expect("move the key");
    let failed = wait_failed(port, &host, "public.t").await;
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("key of public.t changed during its copy, from (a) to (b)")
            && error.contains("backfill"),
        "the error says what happened and what to do: {error}"
    );
    let (code, body) = post_backfill(port, serde_json::json!({"tables": ["t"]})).await;
    assert_eq!(code, 202, "{body}");
    wait_done(port, &host, &["public.t"], 60).await;
    wait_equal(&src, &dst, "SELECT * FROM t ORDER BY a", &host, 30).await;
}

/// A role that loses SELECT on a table during its copy: the table fails
/// with the GRANT to run, the pipeline goes on; once granted again, a
/// backfill finishes the copy and the sink equals the source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_that_loses_its_select_privilege_fails_with_the_grant_to_run() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    for db in [&src, &dst] {
        db.batch_execute("CREATE TABLE guarded (id int PRIMARY KEY, v text)")
            .await
            .expect("schema");
    }
    src.batch_execute(
        "INSERT INTO guarded SELECT g, 'g' || g FROM generate_series(1, 100000) g;
         CREATE ROLE copier LOGIN REPLICATION;
         GRANT SELECT ON guarded TO copier;
         CREATE PUBLICATION datum_p FOR TABLE guarded",
    )
    .await
    .expect("rows, role and publication");
    let dir = temp_dir("snapshot-revoked");
    let port = free_port();
    let source = pg.conninfo("src").replace("user=postgres", "user=copier");
    assert!(source.contains("user=copier"), "{source}");
    let config = config(
        &source,
        &pg.conninfo("dst"),
        &dir,
        port,
        &["public.guarded"],
        "[pipeline.snapshot]\nchunk_size = 200\n",
    );
    let host = Host::start(&dir, &config);
    wait_copying(port, &host, &["public.guarded"]).await;
    src.batch_execute("REVOKE SELECT ON guarded FROM copier")
        .await
        .expect("revoke");
    let failed = wait_failed(port, &host, "public.guarded").await;
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("copier may not read public.guarded")
            && error.contains(r#"GRANT SELECT ON "public"."guarded" TO "copier", then backfill"#),
        "the error names the role, the table and the GRANT: {error}"
    );
    // The pipeline goes on streaming.
    src.batch_execute("UPDATE guarded SET v = 'live' WHERE id = 1")
        .await
        .expect("update");
    // Granted again, a backfill finishes the table.
    src.batch_execute("GRANT SELECT ON guarded TO copier")
        .await
        .expect("grant");
    let (code, body) = post_backfill(port, serde_json::json!({"tables": ["public.guarded"]})).await;
    assert_eq!(code, 202, "{body}");
    wait_done(port, &host, &["public.guarded"], 120).await;
    wait_equal(&src, &dst, "SELECT * FROM guarded ORDER BY id", &host, 60).await;
}

/// `datum run` at a terminal draws a progress bar per table copying (the
/// log lines go above the bars, not through them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn datum_run_at_a_terminal_shows_a_progress_bar_per_table() {
    let pg = cluster();
    let src = connect(&pg.conninfo("postgres")).await;
    src.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);
         INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 300000) g;
         ANALYZE t",
    )
    .await
    .expect("table");
    let dir = temp_dir("snapshot-bars");
    let port = free_port();
    let config = dir.join("datum.toml");
    std::fs::write(
        &config,
        format!(
            r#"
state = {state}

[admin]
listen = "127.0.0.1:{port}"
token = "{TOKEN}"

[[pipeline]]
name = "p"
source.url = {url}
source.tables = ["public.t"]
sink = {{ type = "file", path = {out} }}

[pipeline.snapshot]
chunk_size = 1000
"#,
            state = toml_string(dir.join("state.redb").to_str().expect("utf-8")),
            url = toml_string(&pg.conninfo("postgres")),
            out = toml_string(dir.join("out.jsonl").to_str().expect("utf-8")),
        ),
    )
    .expect("config");
    let screen = dir.join("screen.txt");
    // `script` gives the host a terminal and records what it drew.
    let mut terminal = std::process::Command::new("script")
        .arg("-qfc")
        .arg(format!(
            "exec {} run {}",
            datum_tests::datum_bin().display(),
            config.display()
        ))
        .arg(&screen)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("script (util-linux)");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let entries = snapshots(port).await;
        if entries
            .iter()
            .any(|e| e["table"] == "public.t" && e["state"] == "done")
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not done: {entries:?}\n{}",
            std::fs::read_to_string(&screen).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the bar draw its end, then stop the host.
    tokio::time::sleep(Duration::from_millis(600)).await;
    // The host is the process whose command line names this configuration.
    let needle = config.to_str().expect("utf-8").as_bytes().to_vec();
    let host = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmd| {
                cmd.windows(needle.len()).any(|w| w == needle.as_slice())
                    && !cmd.starts_with(b"script")
            })
        })
        .expect("the host's process");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(host),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(30);
    while terminal.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the host did not stop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drawn = std::fs::read_to_string(&screen).expect("the screen");
    assert!(drawn.contains("p public.t ["), "no bar:\n{drawn}");
    assert!(drawn.contains("rows"), "{drawn}");
    assert!(drawn.contains("done"), "the bar ends done:\n{drawn}");
    assert!(
        drawn.contains("snapshot progress"),
        "log lines still show:\n{drawn}"
    );
}
