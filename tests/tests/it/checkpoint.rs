//! Checkpoints and feedback against real processes and a real server: the
//! state file survives SIGKILL, PostgreSQL never hears of a position that
//! is not checkpointed, a killed host resumes with replays only from the
//! un-checkpointed tail, and an idle slot keeps advancing.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datum::{
    Change, Handles, Lsn, PipelineConfig, Sink, SinkError, SourceError, Store, Transformed,
};
use datum_guest::Value;
use datum_tests::stream::config;
use datum_tests::{cluster, connect};
use tokio::sync::oneshot;

/// A small deterministic generator, seeded from the clock and printed, so a
/// failing run can be repeated with `DATUM_TEST_SEED`.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = std::env::var("DATUM_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
            });
        eprintln!("DATUM_TEST_SEED={seed}");
        Rng(seed | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("datum-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn stored(path: &Path, pipeline: &str) -> u64 {
    Store::open(path)
        .expect("state file")
        .offset(pipeline)
        .expect("read")
        .map(|o| o.end_lsn.0)
        .unwrap_or(0)
}

#[test]
fn the_state_file_survives_sigkill_at_random_points_in_commits() {
    let dir = temp_dir("crash-store");
    let path = dir.join("state.redb");
    let mut rng = Rng::new();
    let mut floor = 0;
    for round in 0..20 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_checkpoint-writer"))
            .arg(&path)
            .stdout(Stdio::piped())
            .spawn()
            .expect("checkpoint-writer");
        let stdout = child.stdout.take().expect("stdout");
        // A writer killed before its first commit printed nothing: what it
        // had been handed last is still what the file held before.
        let acked = Arc::new(Mutex::new(floor));
        let reader = {
            let acked = acked.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if let Ok(n) = line.parse() {
                        *acked.lock().expect("lock") = n;
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20 + rng.below(150)));
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        reader.join().expect("reader");
        let acked = *acked.lock().expect("lock");
        let (p, q) = (stored(&path, "p"), stored(&path, "q"));
        assert!(
            p >= floor,
            "round {round}: offset went backwards: {p} < {floor}"
        );
        assert!(
            p >= acked,
            "round {round}: acknowledged {acked} but stored {p}"
        );
        assert!(
            p <= acked + 1,
            "round {round}: stored {p}, past the last offset handed to commit ({})",
            acked + 1
        );
        assert!(q + 1 >= p && q <= p, "round {round}: p={p} q={q}");
        floor = p;
    }
    assert!(floor > 20, "the writer made progress ({floor} commits)");
    std::fs::remove_dir_all(dir).ok();
}

/// A sink that records what it gets and acknowledges after a delay.
#[derive(Clone, Default)]
struct SlowSink {
    delay: Duration,
    seen: Arc<Mutex<Vec<i64>>>,
}

impl Sink for SlowSink {
    async fn write(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        let batch = &batch.source;
        tokio::time::sleep(self.delay).await;
        let mut seen = self.seen.lock().expect("lock");
        for change in &batch.changes {
            if let Change::Insert { new, .. } = change
                && let Some(Value::Int(id)) = new.first()
            {
                seen.push(*id);
            }
        }
        Ok(())
    }
}

/// The slot's `confirmed_flush_lsn` (0/0 while it has none).
pub(crate) async fn confirmed_flush(client: &tokio_postgres::Client, slot: &str) -> Lsn {
    let row = client
        .query_one(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .expect("slot");
    row.get::<_, Option<String>>(0)
        .and_then(|t| t.parse().ok())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_never_hears_of_a_position_that_is_not_checkpointed() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute("CREATE TABLE t (id int8 PRIMARY KEY)")
        .await
        .expect("table");
    let dir = temp_dir("slow-sink");
    let store = Arc::new(Store::open(dir.join("state.redb")).expect("store"));
    let mut source = config(&pg, "pub", "slot", &["t"]);
    source.status_interval = Some(Duration::from_millis(20));
    let sink = SlowSink {
        delay: Duration::from_millis(25),
        ..SlowSink::default()
    };
    let seen = sink.seen.clone();
    let (started_tx, started_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let running = tokio::spawn(datum::run_pipeline(
        PipelineConfig::new("p", source),
        store.clone(),
        sink,
        Some(started_tx),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let _handles: Handles = started_rx.await.expect("started");
    // A new slot starts confirmed at its creation point, which no
    // checkpoint covers: only what comes after is ours to report.
    let created_at = confirmed_flush(&client, "slot").await;
    for id in 1..=60 {
        client
            .batch_execute(&format!("INSERT INTO t VALUES ({id})"))
            .await
            .expect("insert");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut samples = 0;
    let mut advanced = false;
    loop {
        // Read PostgreSQL's position first: the checkpoint only grows, so
        // reading it second can only make the comparison easier to pass if
        // the order were wrong the other way round.
        let confirmed = confirmed_flush(&client, "slot").await;
        let checkpoint = store
            .offset("p")
            .expect("read")
            .map(|o| o.end_lsn)
            .unwrap_or_default();
        assert!(
            confirmed <= checkpoint.max(created_at),
            "PostgreSQL confirmed {confirmed}, past the checkpoint {checkpoint}"
        );
        samples += 1;
        advanced |= confirmed > created_at;
        let done = seen.lock().expect("lock").len() == 60;
        if done && confirmed == checkpoint && advanced {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stuck: confirmed {confirmed}, checkpoint {checkpoint}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(samples > 20, "the comparison was sampled {samples} times");
    assert_eq!(*seen.lock().expect("lock"), (1..=60).collect::<Vec<i64>>());
    let _ = stop_tx.send(());
    running.await.expect("task").expect("clean stop");
    std::fs::remove_dir_all(dir).ok();
}

#[derive(Debug)]
struct Line {
    commit: u64,
    end: u64,
    chunk: u32,
    last: bool,
    ids: Vec<i64>,
}

fn read_log(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let parts: Vec<&str> = l.split(' ').collect();
            Line {
                commit: parts[0].parse().expect("commit"),
                end: parts[1].parse().expect("end"),
                chunk: parts[2].parse().expect("chunk"),
                last: parts[3] == "true",
                ids: parts
                    .get(4)
                    .map(|ids| ids.split(',').filter_map(|i| i.parse().ok()).collect())
                    .unwrap_or_default(),
            }
        })
        .collect()
}

/// Starts the pipeline process and waits until it handles SIGINT; with
/// `catch_up`, it drains the slot through SQL in windows of that many rows
/// while it is behind at all.
fn spawn_pipeline(conninfo: &str, state: &Path, log: &Path, catch_up: Option<u32>) -> Child {
    let mut args = vec![
        conninfo.to_owned(),
        state.display().to_string(),
        log.display().to_string(),
        "2".to_owned(),
    ];
    args.extend(catch_up.map(|w| w.to_string()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_crash-pipeline"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("crash-pipeline");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("ready line");
    assert_eq!(line.trim(), "ready");
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_host_resumes_with_replays_only_from_the_unchecked_tail() {
    killed_host_resumes(None).await;
}

/// The same kills while the host drains the slot through SQL (`catch_up`),
/// from a backlog written before its first start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_killed_while_catching_up_through_sql_resumes_with_replays_only_from_the_unchecked_tail()
 {
    killed_host_resumes(Some(20)).await;
}

/// Kills the host at random moments while a writer runs, then lets it
/// finish: every row arrives, in commit order within each incarnation,
/// replays come only from after the checkpoint each resumed from, and the
/// slot is never confirmed past the state file's checkpoint.
async fn killed_host_resumes(catch_up: Option<u32>) {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute("CREATE TABLE t (id int8 PRIMARY KEY)")
        .await
        .expect("table");
    let dir = temp_dir("kill-host");
    let (state, log) = (dir.join("state.redb"), dir.join("sink.log"));
    let mut rng = Rng::new();
    // The slot must exist before the first write, as for any pipeline.
    datum::prepare_source(&config(&pg, "pub", "slot", &["t"]), None, || Ok(()))
        .await
        .expect("prepare");

    // The writer: 200 transactions of 1 to 7 rows (some chunked, the child
    // cuts at 3 rows), spread over the kills. For a catch-up, the first 100
    // are a backlog written before the first start.
    let writer_conninfo = pg.conninfo("postgres");
    let backlog = if catch_up.is_some() { 100 } else { 0 };
    let (written_tx, written_rx) = oneshot::channel();
    let writer = tokio::spawn(async move {
        let client = connect(&writer_conninfo).await;
        let mut next = 1i64;
        let mut sizes = Vec::new();
        let mut written_tx = Some(written_tx);
        for txn in 0..200 {
            if txn == backlog
                && let Some(tx) = written_tx.take()
            {
                let _ = tx.send(());
            }
            let rows = txn % 7 + 1;
            client
                .batch_execute(&format!(
                    "INSERT INTO t SELECT g FROM generate_series({next}, {}) g",
                    next + rows - 1
                ))
                .await
                .expect("insert");
            sizes.push(rows);
            next += rows;
            tokio::time::sleep(Duration::from_millis(8)).await;
        }
        next - 1
    });

    // Kill the host at random moments; note the checkpoint each restart
    // resumes from, and where in the log it restarted.
    let mut restarts = Vec::new();
    let mut catch_ups = 0;
    written_rx.await.expect("backlog written");
    for _ in 0..6 {
        let mut child = spawn_pipeline(&pg.conninfo("postgres"), &state, &log, catch_up);
        tokio::time::sleep(Duration::from_millis(150 + rng.below(350))).await;
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        let mut logs = String::new();
        if let Some(mut stderr) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut stderr, &mut logs);
        }
        catch_ups += logs.matches("draining it through SQL").count();
        // The slot's position first: the checkpoint only grows.
        let confirmed = confirmed_flush(&client, "slot").await;
        let checkpoint = stored(&state, "p");
        assert!(
            confirmed.0 <= checkpoint || checkpoint == 0,
            "the slot was confirmed at {confirmed}, past the checkpoint {}",
            Lsn(checkpoint)
        );
        restarts.push((read_log(&log).len(), checkpoint));
    }
    let total = writer.await.expect("writer");
    // The last incarnation starts from this checkpoint; a killed one may
    // already have written the last rows without checkpointing them, and
    // then the last incarnation must deliver them again before it is
    // stopped.
    let (final_start, final_from) = (read_log(&log).len(), stored(&state, "p"));
    let mut child = spawn_pipeline(&pg.conninfo("postgres"), &state, &log, catch_up);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lines = read_log(&log);
        let delivered = |from: usize| {
            lines[from.min(lines.len())..]
                .iter()
                .any(|l| l.ids.contains(&total))
        };
        let checkpointed_earlier = lines
            .iter()
            .any(|l| l.last && l.ids.contains(&total) && l.end <= final_from);
        let max = lines.iter().flat_map(|l| l.ids.clone()).max();
        if delivered(final_start) || checkpointed_earlier {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not everything arrived: {max:?} of {total}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let status = child.wait().expect("reap");
    assert!(status.success(), "a clean stop on SIGINT: {status:?}");
    if catch_up.is_some() {
        assert!(
            catch_ups >= 1,
            "no incarnation drained the backlog through SQL"
        );
    }

    let lines = read_log(&log);
    // Every row at least once.
    let mut ids: Vec<i64> = lines.iter().flat_map(|l| l.ids.clone()).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids, (1..=total).collect::<Vec<_>>(), "every row arrived");

    // Within each incarnation: commit order, chunks in order; and a replay
    // only of what lies after the checkpoint it resumed from.
    let mut bounds: Vec<(usize, u64)> = vec![(0, 0)];
    bounds.extend(restarts.iter().copied());
    let mut replayed = 0;
    for (k, window) in bounds
        .windows(2)
        .chain(std::iter::once(
            &[*bounds.last().expect("bounds"), (lines.len(), 0)][..],
        ))
        .enumerate()
    {
        let (start, checkpoint) = window[0];
        let end = window[1].0;
        let run = &lines[start..end];
        for line in run {
            assert!(
                line.commit >= checkpoint,
                "incarnation {k} delivered commit {} at or below its checkpoint {checkpoint}",
                line.commit
            );
        }
        for pair in run.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            let same_txn = a.commit == b.commit;
            assert!(
                b.commit > a.commit || (same_txn && b.chunk == a.chunk + 1 && !a.last),
                "incarnation {k}: out of order: {a:?} then {b:?}"
            );
        }
        // Count what this incarnation re-delivered.
        let earlier: std::collections::HashSet<(u64, u32)> =
            lines[..start].iter().map(|l| (l.commit, l.chunk)).collect();
        replayed += run
            .iter()
            .filter(|l| earlier.contains(&(l.commit, l.chunk)))
            .count();
    }
    eprintln!(
        "{} batches, {replayed} replayed across {} kills",
        lines.len(),
        restarts.len()
    );
    assert!(
        lines.iter().any(|l| !l.last),
        "some transactions were chunked"
    );
    let final_checkpoint = stored(&state, "p");
    let last_end = lines
        .iter()
        .filter(|l| l.last)
        .map(|l| l.end)
        .max()
        .unwrap_or(0);
    assert!(
        final_checkpoint >= last_end,
        "the clean stop checkpointed everything"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_slot_advances_while_other_databases_write() {
    let pg = cluster();
    pg.create_database("busy").expect("database");
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute("CREATE TABLE quiet (id int PRIMARY KEY)")
        .await
        .expect("table");
    let dir = temp_dir("idle");
    let store = Arc::new(Store::open(dir.join("state.redb")).expect("store"));
    let mut source = config(&pg, "pub", "slot", &["quiet"]);
    source.status_interval = Some(Duration::from_millis(100));
    let (started_tx, started_rx) = oneshot::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let running = tokio::spawn(datum::run_pipeline(
        PipelineConfig::new("p", source),
        store.clone(),
        SlowSink::default(),
        Some(started_tx),
        async move {
            let _ = stop_rx.await;
        },
    ));
    started_rx.await.expect("started");
    let initial = confirmed_flush(&client, "slot").await;
    let busy = connect(&pg.conninfo("busy")).await;
    busy.batch_execute("CREATE TABLE noise (x int)")
        .await
        .expect("noise");
    for _ in 0..20 {
        busy.batch_execute("INSERT INTO noise SELECT generate_series(1, 100)")
            .await
            .expect("noise");
    }
    let target: Lsn = busy
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await
        .expect("lsn")
        .get::<_, String>(0)
        .parse()
        .expect("lsn");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let confirmed = confirmed_flush(&client, "slot").await;
        if confirmed >= target {
            let checkpoint = store.offset("p").expect("read").map(|o| o.end_lsn);
            assert!(
                checkpoint >= Some(confirmed),
                "checkpointed before confirmed"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the idle slot is pinned at {confirmed} (started at {initial}, WAL is at {target})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop_tx.send(());
    running.await.expect("task").expect("clean stop");
    std::fs::remove_dir_all(dir).ok();
}

async fn run_until_one_batch(
    pg: &pg_throwaway::Cluster,
    store: Arc<Store>,
    recreate: bool,
) -> Result<(), datum::PipelineError> {
    let mut source = config(pg, "pub", "slot", &["t"]);
    source.recreate_slot = recreate;
    let sink = SlowSink::default();
    let seen = sink.seen.clone();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (started_tx, started_rx) = oneshot::channel();
    let running = tokio::spawn(datum::run_pipeline(
        PipelineConfig::new("p", source),
        store,
        sink,
        Some(started_tx),
        async move {
            let _ = stop_rx.await;
        },
    ));
    if started_rx.await.is_err() {
        return running.await.expect("task");
    }
    let client = connect(&pg.conninfo("postgres")).await;
    let id: i64 = client
        .query_one(
            "INSERT INTO t SELECT coalesce(max(id), 0) + 1 FROM t RETURNING id",
            &[],
        )
        .await
        .expect("insert")
        .get(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.lock().expect("lock").contains(&id) {
        assert!(Instant::now() < deadline, "row {id} did not arrive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(());
    running.await.expect("task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_slot_is_an_error_and_recreating_it_says_a_resync_is_needed() {
    let pg = pg_throwaway::Cluster::builder()
        .setting("max_slot_wal_keep_size", "1MB")
        .start()
        .expect("cluster");
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute("CREATE TABLE t (id int8 PRIMARY KEY)")
        .await
        .expect("table");
    let dir = temp_dir("lost-slot");
    let store = Arc::new(Store::open(dir.join("state.redb")).expect("store"));
    run_until_one_batch(&pg, store.clone(), false)
        .await
        .expect("first run");
    let checkpoint = stored_in(&store);
    assert!(checkpoint > 0);

    // Dropped (once its walsender, which exits just after the pipeline
    // disconnected, has let go of it).
    let deadline = Instant::now() + Duration::from_secs(10);
    while client
        .query_one(
            "SELECT active FROM pg_replication_slots WHERE slot_name = 'slot'",
            &[],
        )
        .await
        .expect("slot state")
        .get::<_, bool>(0)
    {
        assert!(Instant::now() < deadline, "the slot stayed active");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    client
        .query("SELECT pg_drop_replication_slot('slot')", &[])
        .await
        .expect("drop");
    let err = run_until_one_batch(&pg, store.clone(), false)
        .await
        .expect_err("the slot is gone");
    let text = err.to_string();
    assert!(text.contains("slot slot no longer exists"), "{text}");
    assert!(text.contains("recreate_slot = true"), "{text}");
    assert_eq!(stored_in(&store), checkpoint, "the checkpoint is untouched");
    run_until_one_batch(&pg, store.clone(), true)
        .await
        .expect("recreated");

    // Invalidated: more WAL than max_slot_wal_keep_size while nobody reads.
    client
        .batch_execute(
            "CREATE TABLE filler (x text);
             INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 40000);
             SELECT pg_switch_wal(); CHECKPOINT;",
        )
        .await
        .expect("filler");
    let status: String = client
        .query_one(
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'slot'",
            &[],
        )
        .await
        .expect("slot")
        .get(0);
    assert_eq!(status, "lost", "the slot was invalidated");
    let err = run_until_one_batch(&pg, store.clone(), false)
        .await
        .expect_err("the slot is lost");
    assert!(
        matches!(
            err,
            datum::PipelineError::Source(SourceError::Requirement { .. })
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("invalidated"), "{err}");
    run_until_one_batch(&pg, store.clone(), true)
        .await
        .expect("recreated");
    std::fs::remove_dir_all(dir).ok();
}

fn stored_in(store: &Store) -> u64 {
    store
        .offset("p")
        .expect("read")
        .map(|o| o.end_lsn.0)
        .unwrap_or(0)
}

/// A sink that records what it wrote, how many batches each write covered,
/// fails its first group write (transiently, writing nothing) and refuses
/// the batch holding `refuse` definitely, alone or in a group, and a group
/// holding `refuse_together` (but not that batch alone). Every write
/// takes 2 ms, as an fsync would: what arrives meanwhile waits for the next.
#[derive(Default)]
struct GroupSink {
    seen: Arc<Mutex<Vec<i64>>>,
    groups: Arc<Mutex<Vec<usize>>>,
    failed_once: bool,
    refuse: i64,
    refuse_together: i64,
}

fn ids(batch: &Transformed) -> Vec<i64> {
    batch
        .source
        .changes
        .iter()
        .filter_map(|change| match change {
            Change::Insert { new, .. } => match new.first() {
                Some(Value::Int(id)) => Some(*id),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

impl Sink for GroupSink {
    async fn write(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let ids = ids(batch);
        if ids.contains(&self.refuse) {
            return Err(SinkError::definite(format!("refusing {}", self.refuse)));
        }
        self.groups.lock().expect("lock").push(1);
        self.seen.lock().expect("lock").extend(ids);
        Ok(())
    }

    async fn write_group(&mut self, batches: &[Transformed]) -> Result<(), SinkError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        if !self.failed_once {
            self.failed_once = true;
            return Err(SinkError::transient("the first group fails"));
        }
        let ids: Vec<i64> = batches.iter().flat_map(ids).collect();
        if ids.contains(&self.refuse) {
            return Err(SinkError::definite(format!("refusing {}", self.refuse)));
        }
        if batches.len() > 1 && ids.contains(&self.refuse_together) {
            return Err(SinkError::definite(format!(
                "refusing {} with others",
                self.refuse_together
            )));
        }
        self.groups.lock().expect("lock").push(batches.len());
        self.seen.lock().expect("lock").extend(ids);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_transactions_share_sink_writes_and_a_failed_group_goes_batch_by_batch() {
    let sink = GroupSink {
        refuse: 1500,
        ..GroupSink::default()
    };
    let (seen, groups) = (sink.seen.clone(), sink.groups.clone());
    drain_3000_one_row_transactions("group-writes", sink).await;
    // Every row once, in commit order, but the refused one (skipped).
    let seen = seen.lock().expect("lock").clone();
    let expected: Vec<i64> = (1..=3000).filter(|id| *id != 1500).collect();
    assert_eq!(seen.len(), expected.len());
    assert_eq!(seen, expected);
    // Writes covered many transactions at a time (the batches of each
    // failed group went one at a time, so there are still many writes).
    let groups = groups.lock().expect("lock").clone();
    assert!(
        groups.len() < 3000 && groups.iter().any(|&n| n >= 10),
        "{} writes for 3,000 transactions: {groups:?}",
        groups.len()
    );
}

/// A group refused only as a group (each of its batches then written alone
/// at once) is said in the log, and batches go one at a time for a while
/// instead of every such group being written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_refused_only_as_a_group_pauses_grouping() {
    let sink = GroupSink {
        refuse_together: 1500,
        ..GroupSink::default()
    };
    let (seen, groups) = (sink.seen.clone(), sink.groups.clone());
    drain_3000_one_row_transactions("group-together", sink).await;
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen, (1..=3000).collect::<Vec<i64>>());
    // Each batch is one row: the write that took row 1500, alone, and
    // every write after it (within the pause) one batch each.
    let groups = groups.lock().expect("lock").clone();
    let mut written = 0;
    let at = groups
        .iter()
        .position(|&n| {
            written += n;
            written >= 1500
        })
        .expect("row 1500 written");
    assert!(
        groups[..at].iter().any(|&n| n >= 10),
        "writes were grouped before: {groups:?}"
    );
    assert!(
        groups[at..].iter().all(|&n| n == 1),
        "one at a time after the group failed only as a group: {:?}",
        &groups[at..]
    );
}

/// Runs a pipeline into `sink` over 3,000 one-row transactions waiting in
/// the slot before it starts (they arrive faster than one write each could
/// take them), until the checkpoint passes them all.
async fn drain_3000_one_row_transactions(name: &str, sink: GroupSink) {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    for statement in [
        "CREATE TABLE t (id int8 PRIMARY KEY)",
        "CREATE PUBLICATION pub FOR TABLE t",
        "SELECT pg_create_logical_replication_slot('slot', 'pgoutput')",
    ] {
        client.batch_execute(statement).await.expect(statement);
    }
    // 3,000 one-row transactions waiting in the slot before the pipeline
    // starts: they arrive faster than one fsync each could write them.
    client
        .batch_execute(
            "DO $$ BEGIN FOR i IN 1..3000 LOOP INSERT INTO t VALUES (i); COMMIT; END LOOP; END $$",
        )
        .await
        .expect("writes");
    let end: String = client
        .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
        .await
        .expect("lsn")
        .get(0);
    let end: Lsn = end.parse().expect("lsn");

    let dir = temp_dir(name);
    let store = Arc::new(Store::open(dir.join("state.redb")).expect("store"));

    let mut pipeline_config = PipelineConfig::new("p", config(&pg, "pub", "slot", &["t"]));
    pipeline_config.on_error = datum::OnError::Skip;
    pipeline_config.sink_retry_initial = Duration::from_millis(10);
    // The slot was made by hand above, before the state file existed.
    pipeline_config.adopt_slot = true;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let running = tokio::spawn(datum::run_pipeline(
        pipeline_config,
        store.clone(),
        sink,
        None,
        async move {
            let _ = stop_rx.await;
        },
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while stored_in(&store) < end.0 {
        assert!(
            Instant::now() < deadline,
            "the checkpoint did not reach {end}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(());
    running.await.expect("task").expect("clean stop");

    std::fs::remove_dir_all(dir).ok();
}
