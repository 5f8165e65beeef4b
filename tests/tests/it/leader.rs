//! Two hosts with the same pipeline (`source.leader_lock`), as on two
//! machines: one streams, the other stands by and takes over when the
//! active one is killed. The target must end equal to the source, and at
//! no moment may both hosts stream.

use std::path::Path;
use std::time::{Duration, Instant};

use datum_tests::{cluster, connect, free_port};
use serde_json::Value as Json;

use crate::run::{Host, temp_dir, toml_string};
use crate::snapshot::{two_databases, wait_equal, writer};

/// One machine's configuration: its own state file and admin port, the
/// same pipeline as the other's.
fn config(src: &str, dst: &str, dir: &Path, port: u16) -> String {
    config_with(src, dst, "", dir, port, "")
}

/// `config`, with `sink` settings of the postgres sink (`, key = value`
/// each) and `extra` settings of the pipeline.
fn config_with(src: &str, dst: &str, sink: &str, dir: &Path, port: u16, extra: &str) -> String {
    crate::snapshot::config_sink(
        src,
        dst,
        sink,
        dir,
        port,
        &["public.t"],
        &format!("source.leader_lock = true\nsnapshot.mode = \"never\"\n{extra}"),
    )
}

/// The pipeline's state on the host at `port` (`None`: no answer).
async fn state(port: u16) -> Option<String> {
    let response = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/v1/pipelines/p"))
        .bearer_auth(crate::snapshot::TOKEN)
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .ok()?;
    let body: Json = serde_json::from_str(&response.text().await.ok()?).ok()?;
    body["state"].as_str().map(str::to_owned)
}

/// One machine: its directory, admin port and running host.
struct Machine {
    dir: std::path::PathBuf,
    port: u16,
    config: String,
    host: Option<Host>,
}

impl Drop for Machine {
    /// Ends the host (if still running), then removes its directory.
    fn drop(&mut self) {
        drop(self.host.take());
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Machine {
    fn new(name: &str, src: &str, dst: &str) -> Machine {
        Machine::with(name, src, dst, "")
    }

    /// A machine whose pipeline has `extra` settings.
    fn with(name: &str, src: &str, dst: &str, extra: &str) -> Machine {
        Machine::with_sink(name, src, dst, "", extra)
    }

    /// A machine whose postgres sink has `sink` settings (`, key = value`
    /// each) and whose pipeline has `extra` settings.
    fn with_sink(name: &str, src: &str, dst: &str, sink: &str, extra: &str) -> Machine {
        let dir = temp_dir(name);
        let port = free_port();
        let config = config_with(src, dst, sink, &dir, port, extra);
        let host = Some(Host::start(&dir, &config));
        Machine {
            dir,
            port,
            config,
            host,
        }
    }

    fn kill(&mut self) {
        if let Some(host) = self.host.take() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(host.pid() as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .expect("kill -9");
        }
    }

    /// Stops the host cleanly (SIGTERM): its checkpoint and the slot's
    /// confirmed position then agree. Its log.
    fn stop(&mut self) -> String {
        let host = self.host.take().expect("a running host");
        let (status, log) = host.stop(30);
        assert!(status.success(), "{log}");
        log
    }

    /// Waits until the host streams.
    async fn wait_running(&self) {
        self.wait_state("running", 60).await;
    }

    /// Waits (`secs` at most) until the pipeline's state is `want`.
    async fn wait_state(&self, want: &str, secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while state(self.port).await.as_deref() != Some(want) {
            assert!(
                Instant::now() < deadline,
                "not {want} after {secs} s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Host `name`-a streaming from `src` into `a_dst`, and `name`-b
    /// standing by, with `b_dst`.
    async fn leader_and_standby(
        name: &str,
        src: &str,
        (a_dst, a_extra): (&str, &str),
        b_dst: &str,
    ) -> (Machine, Machine) {
        let a = Machine::with(&format!("{name}-a"), src, a_dst, a_extra);
        a.wait_running().await;
        let b = Machine::new(&format!("{name}-b"), src, b_dst);
        b.wait_state("standby", 30).await;
        (a, b)
    }

    fn restart(&mut self) {
        self.host = Some(Host::start(&self.dir, &self.config));
    }

    fn log(&self) -> String {
        self.host.as_ref().map(Host::log).unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_active_host_killed_ten_times_hands_over_to_the_standby_and_the_target_ends_equal() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    // The same rows on both sides to start with (no initial copy), then
    // the changes of the snapshot tests' writer.
    for (db, what) in [(&src, "source"), (&dst, "target")] {
        db.batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
             INSERT INTO t SELECT g, 0, 'row ' || g FROM generate_series(1, 1000) g;",
        )
        .await
        .expect(what);
    }
    let (src_url, dst_url) = (pg.conninfo("src"), pg.conninfo("dst"));
    let mut machines = [
        Machine::new("leader-a", &src_url, &dst_url),
        Machine::new("leader-b", &src_url, &dst_url),
    ];

    // Watches both hosts: never both streaming; counts the takeovers.
    let ports = [machines[0].port, machines[1].port];
    let (stop_watch, watching) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(async move {
        let mut both = Vec::new();
        let mut standby_seen = false;
        while !*watching.borrow() {
            let states = [state(ports[0]).await, state(ports[1]).await];
            let running = states
                .iter()
                .filter(|s| s.as_deref() == Some("running"))
                .count();
            if running > 1 {
                both.push(format!("{states:?}"));
            }
            standby_seen |= states.iter().any(|s| s.as_deref() == Some("standby"));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (both, standby_seen)
    });

    let active =
        |states: &[Option<String>; 2]| states.iter().position(|s| s.as_deref() == Some("running"));
    let wait_active = async |machines: &[Machine; 2]| -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let states = [state(machines[0].port).await, state(machines[1].port).await];
            if let Some(i) = active(&states) {
                return i;
            }
            assert!(
                Instant::now() < deadline,
                "no host streaming within 60 s ({states:?}):\n{}\n---\n{}",
                machines[0].log(),
                machines[1].log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };

    let first = wait_active(&machines).await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writing = tokio::spawn(writer(src_url.clone(), 1000, stopped));
    let mut takeovers = Vec::new();
    for round in 0..10 {
        let was = wait_active(&machines).await;
        tokio::time::sleep(Duration::from_millis(300 + 137 * round)).await;
        machines[was].kill();
        let now = wait_active(&machines).await;
        takeovers.push((was, now));
        // The killed machine comes back, as the standby.
        machines[was].restart();
    }
    let _ = stop.send(true);
    let statements = writing.await.expect("writer");
    assert!(statements > 200, "the writer ran ({statements} statements)");
    let live = wait_active(&machines).await;
    let host = machines[live].host.as_ref().expect("a host");
    wait_equal(&src, &dst, "SELECT * FROM t ORDER BY id", host, 90).await;

    let _ = stop_watch.send(true);
    let (both, standby_seen) = watcher.await.expect("watcher");
    assert!(both.is_empty(), "both hosts streamed at once: {both:?}");
    assert!(standby_seen, "no host was ever seen standing by");
    // Each kill handed the slot to the other host.
    assert!(
        takeovers.iter().all(|(was, now)| was != now),
        "first {first}, takeovers {takeovers:?}"
    );
}

/// The lock's query failing on a connection that works (here: EXECUTE of
/// `pg_try_advisory_lock` revoked from the host's role) made the host
/// reconnect at once, again and again, as fast as the server accepted
/// connections. It now waits with back-off, as for a source it cannot
/// reach, and says why in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_lock_query_is_retried_with_back_off_not_in_a_loop() {
    let pg = cluster();
    let (src, _dst) = two_databases(&pg).await;
    src.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY);
         CREATE ROLE stander LOGIN REPLICATION;
         GRANT SELECT ON t TO stander;
         CREATE PUBLICATION datum_p FOR TABLE t;
         REVOKE EXECUTE ON FUNCTION pg_try_advisory_lock(bigint) FROM PUBLIC",
    )
    .await
    .expect("role and revoke");
    let dir = temp_dir("leader-revoked");
    let source = pg.conninfo("src").replace("user=postgres", "user=stander");
    assert!(source.contains("user=stander"), "{source}");
    let host = Host::start(
        &dir,
        &config(&source, &pg.conninfo("dst"), &dir, free_port()),
    );
    // Each attempt ends with this line, in the old wording and the new.
    let failed = "; reconnecting";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host.log().contains(failed) {
        assert!(Instant::now() < deadline, "{}", host.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let log = host.log();
    let attempts = log.matches(failed).count();
    assert!(
        attempts <= 10,
        "{attempts} attempts within about 3 s: a reconnect loop\n{}",
        log.lines().take(20).collect::<Vec<_>>().join("\n")
    );
    assert!(log.contains("permission denied"), "{log}");
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The value of `v` in row `id` of `db`'s `t`.
async fn value(db: &tokio_postgres::Client, id: i32) -> Option<i32> {
    db.query_opt("SELECT v FROM t WHERE id = $1", &[&id])
        .await
        .expect("select")
        .map(|row| row.get(0))
}

/// Waits until row `id` of the target has `v`.
async fn wait_value(dst: &tokio_postgres::Client, id: i32, v: i32, machine: &Machine) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while value(dst, id).await != Some(v) {
        assert!(
            Instant::now() < deadline,
            "row {id} never reached v = {v}:\n{}",
            machine.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Both sides with rows 1..=10, `v = 0`.
async fn same_rows(src: &tokio_postgres::Client, dst: &tokio_postgres::Client) {
    for (db, what) in [(src, "source"), (dst, "target")] {
        db.batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
             INSERT INTO t SELECT g, 0, 'row ' || g FROM generate_series(1, 10) g;",
        )
        .await
        .expect(what);
    }
}

/// A host that stopped after its checkpoint but before confirming it to
/// the slot, while another host replayed from the slot into the target
/// and died before catching up: the target then holds older values than
/// this host's checkpoint says. Resuming from its own checkpoint left
/// them there for good; under the leader lock the slot's position is
/// where every host resumes.
///
/// The slot behind the checkpoint is made with a copy of the slot taken
/// before the changes (what a crash between checkpoint and confirmation
/// leaves); the other host's partial replay is written to the target by
/// hand (the first change again, not the second). A sink that records
/// what it applied leaves a replay of it out, so the target goes back
/// only when that record is off (`track_applied = false`), as here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_checkpoint_is_ahead_of_the_shared_slot_resumes_from_the_slot() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    same_rows(&src, &dst).await;
    let (src_url, dst_url) = (pg.conninfo("src"), pg.conninfo("dst"));
    let mut a = Machine::with_sink(
        "behind-a",
        &src_url,
        &dst_url,
        ", track_applied = false",
        "",
    );
    a.wait_running().await;
    src.batch_execute("SELECT pg_copy_logical_replication_slot('datum_p', 'kept')")
        .await
        .expect("copy the slot");
    src.batch_execute("UPDATE t SET v = 1 WHERE id = 1")
        .await
        .expect("first change");
    // A column added between the two changes: the host keeps the table's
    // new shape with its checkpoint, and the replay from the slot brings
    // the old one first, which must not read as the column dropped.
    for db in [&src, &dst] {
        db.batch_execute("ALTER TABLE t ADD COLUMN extra int")
            .await
            .expect("add column");
    }
    src.batch_execute("UPDATE t SET v = 2, extra = 7 WHERE id = 1")
        .await
        .expect("second change");
    wait_value(&dst, 1, 2, &a).await;
    a.stop();

    // The slot as a crash before the confirmation leaves it; the target as
    // another host's replay from there leaves it.
    src.batch_execute(
        "SELECT pg_drop_replication_slot('datum_p');
         SELECT pg_copy_logical_replication_slot('kept', 'datum_p');
         SELECT pg_drop_replication_slot('kept');",
    )
    .await
    .expect("slot behind the checkpoint");
    dst.batch_execute("UPDATE t SET v = 1 WHERE id = 1")
        .await
        .expect("replayed first change");

    a.restart();
    a.wait_running().await;
    src.batch_execute("UPDATE t SET v = 3 WHERE id = 2")
        .await
        .expect("third change");
    wait_value(&dst, 2, 3, &a).await;
    // Applied in commit order: the second change came before the third.
    assert_eq!(value(&dst, 1).await, Some(2), "{}", a.log());
    let extra: Option<i32> = dst
        .query_one("SELECT extra FROM t WHERE id = 1", &[])
        .await
        .expect("extra")
        .get(0);
    assert_eq!(extra, Some(7));
    let log = a.stop();
    assert!(
        log.contains("the slot is behind this host's checkpoint"),
        "{log}"
    );
}

/// `recreate_slot = true` is for a slot that lost changes. Under the
/// leader lock, a slot past this host's checkpoint is the normal takeover
/// (another host streamed it), but it counted as lost: the host dropped
/// the slot every host shares and created a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_with_recreate_slot_set_keeps_the_shared_slot() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    same_rows(&src, &dst).await;
    let (src_url, dst_url) = (pg.conninfo("src"), pg.conninfo("dst"));
    let extra = "source.recreate_slot = true\n";
    let mut a = Machine::with("recreate-a", &src_url, &dst_url, extra);
    a.wait_running().await;
    src.batch_execute("UPDATE t SET v = 1 WHERE id = 1")
        .await
        .expect("first change");
    wait_value(&dst, 1, 1, &a).await;
    a.stop();

    // The other host streams the slot past the first one's checkpoint.
    let mut b = Machine::with("recreate-b", &src_url, &dst_url, extra);
    b.wait_running().await;
    src.batch_execute("UPDATE t SET v = 2 WHERE id = 2")
        .await
        .expect("second change");
    wait_value(&dst, 2, 2, &b).await;
    b.stop();

    a.restart();
    a.wait_running().await;
    src.batch_execute("UPDATE t SET v = 3 WHERE id = 3")
        .await
        .expect("third change");
    wait_value(&dst, 3, 3, &a).await;
    let log = a.stop();
    assert!(!log.contains("recreate"), "{log}");
    assert!(
        log.contains("taking over the slot at its position"),
        "{log}"
    );
}

/// A holder that freezes (SIGSTOP: a hung process, a paused virtual
/// machine) keeps its connections open, and the server kept its lock
/// session, and so the lock, until TCP keepalive gave up: two hours by
/// default, with no host streaming. The session now ends once its holder
/// stops probing it, and the standby takes over within seconds; the
/// frozen host, thawed, finds its lock gone and stands by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_releases_the_lock_and_the_standby_takes_over() {
    use nix::sys::signal::{Signal, kill};
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    same_rows(&src, &dst).await;
    let (src_url, dst_url) = (pg.conninfo("src"), pg.conninfo("dst"));
    let (a, b) = Machine::leader_and_standby("frozen", &src_url, (&dst_url, ""), &dst_url).await;
    let pid = freeze(&a);
    let frozen = Instant::now();
    // The session's idle limit (10 s) and a second's retry of the standby,
    // with room for a slow machine.
    wait_takeover(&b, pid, 40).await;
    let took = frozen.elapsed();
    src.batch_execute("UPDATE t SET v = 1 WHERE id = 1")
        .await
        .expect("change");
    wait_value(&dst, 1, 1, &b).await;
    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    a.wait_state("standby", 30).await;
    assert!(took < Duration::from_secs(30), "took over after {took:?}");
    ends_equal(&src, &dst, a, b).await;
}

/// Freezes the host (SIGSTOP), as a hung process or a paused virtual
/// machine is; its pid, to thaw it with SIGCONT.
fn freeze(m: &Machine) -> nix::unistd::Pid {
    let pid = nix::unistd::Pid::from_raw(m.host.as_ref().expect("a host").pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    pid
}

/// Waits (`secs` at most) until `standby` streams; thaws `frozen` before
/// failing.
async fn wait_takeover(standby: &Machine, frozen: nix::unistd::Pid, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while state(standby.port).await.as_deref() != Some("running") {
        if Instant::now() > deadline {
            let _ = nix::sys::signal::kill(frozen, nix::sys::signal::Signal::SIGCONT);
            panic!("the standby never took over:\n{}", standby.log());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Ends a test of two hosts: one more change, after which the target,
/// written by `b`, equals the source; both stop cleanly.
async fn ends_equal(
    src: &tokio_postgres::Client,
    dst: &tokio_postgres::Client,
    mut a: Machine,
    mut b: Machine,
) {
    src.batch_execute("UPDATE t SET v = v + 10 WHERE id = 2")
        .await
        .expect("change");
    let host = b.host.as_ref().expect("b");
    wait_equal(src, dst, "SELECT * FROM t ORDER BY id", host, 60).await;
    a.stop();
    b.stop();
}

/// A host that lost its lock session while one of its writes waited on
/// the target went on retrying that write while it drained, after the
/// standby had taken over and written newer values; once the target let
/// it in again, its retry took the row back to an older value. The target
/// now refuses the writes of a host that another has taken over from
/// (the fence table), and that host stands by without writing.
///
/// Host A writes as a role of its own, so that the test can keep it out
/// of the target (`CONNECTION LIMIT 0`) while B, the standby, writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_write_of_a_host_that_lost_the_lock_is_refused_after_the_takeover() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    same_rows(&src, &dst).await;
    dst.batch_execute(
        "CREATE ROLE late_writer LOGIN;
         GRANT SELECT, INSERT, UPDATE, DELETE ON t TO late_writer;
         GRANT CREATE ON SCHEMA public TO late_writer;",
    )
    .await
    .expect("role");
    let (src_url, dst_url) = (pg.conninfo("src"), pg.conninfo("dst"));
    let a_url = dst_url.replace("user=postgres", "user=late_writer");
    assert!(a_url.contains("user=late_writer"), "{a_url}");
    let (a, b) = Machine::leader_and_standby(
        "late",
        &src_url,
        (&a_url, "drain_timeout = \"180s\""),
        &dst_url,
    )
    .await;

    // A's write of v = 1 waits for the table lock.
    let locker = crate::faults::lock_t(&dst_url).await;
    src.batch_execute("UPDATE t SET v = 1 WHERE id = 1")
        .await
        .expect("change");
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE usename = 'late_writer' AND wait_event_type = 'Lock'";
    let deadline = Instant::now() + Duration::from_secs(30);
    while dst
        .query_one(waiting, &[])
        .await
        .expect("activity")
        .get::<_, i64>(0)
        == 0
    {
        assert!(Instant::now() < deadline, "a never wrote:\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A loses its lock session; it drains, retrying the write, which
    // cannot reach the target while B takes over.
    dst.batch_execute("ALTER ROLE late_writer CONNECTION LIMIT 0")
        .await
        .expect("keep a out");
    src.batch_execute(
        "SELECT pg_terminate_backend(pid) FROM pg_locks \
         WHERE locktype = 'advisory' AND granted",
    )
    .await
    .expect("end a's lock session");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a.log().contains("lost the leader lock's connection") {
        assert!(Instant::now() < deadline, "a kept its lock:\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    dst.batch_execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'late_writer'",
    )
    .await
    .expect("end a's write");
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    b.wait_running().await;
    wait_value(&dst, 1, 1, &b).await;
    src.batch_execute("UPDATE t SET v = 2 WHERE id = 1")
        .await
        .expect("change");
    wait_value(&dst, 1, 2, &b).await;
    assert!(
        a.log().contains("sink write failed; retrying"),
        "a was not retrying its write:\n{}",
        a.log()
    );

    // A reaches the target again, with its write of v = 1 still to do; its
    // next retry comes within its back-off (at most 30 s), well inside its
    // drain_timeout.
    dst.batch_execute("ALTER ROLE late_writer CONNECTION LIMIT -1")
        .await
        .expect("let a in");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !a.log().contains("another host took over the target") {
        if value(&dst, 1).await == Some(1) {
            panic!("a's late write took the row back:\n{}", a.log());
        }
        assert!(Instant::now() < deadline, "a never wrote:\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.wait_state("standby", 60).await;
    assert_eq!(value(&dst, 1).await, Some(2), "{}", a.log());
    ends_equal(&src, &dst, a, b).await;
}

/// A host frozen in the middle of a write holds the fence row of the
/// target, which the standby's claim waits for; the target ends that
/// host's session once its transaction has sat idle for 10 s, so the
/// standby takes over and streams, and the thawed host's retry is
/// refused. (The standby takes the lock once the source ends the frozen
/// host's lock session: `idle_session_timeout`, PostgreSQL 14 and later.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_frozen_inside_a_write_does_not_hold_the_standby_up() {
    use nix::sys::signal::{Signal, kill};
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    same_rows(&src, &dst).await;
    let (src_url, dst_url) = (pg.conninfo("src"), pg.conninfo("dst"));
    let (a, b) = Machine::leader_and_standby("inside", &src_url, (&dst_url, ""), &dst_url).await;
    let locker = crate::faults::lock_t(&dst_url).await;
    src.batch_execute("UPDATE t SET v = 1 WHERE id = 1")
        .await
        .expect("change");
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE wait_event_type = 'Lock' AND datname = 'dst'";
    let deadline = Instant::now() + Duration::from_secs(30);
    while dst
        .query_one(waiting, &[])
        .await
        .expect("activity")
        .get::<_, i64>(0)
        == 0
    {
        assert!(Instant::now() < deadline, "a never wrote:\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = freeze(&a);
    // A's statements now run and its transaction waits, idle, for a
    // COMMIT that a frozen host does not send.
    locker.batch_execute("ROLLBACK").await.expect("unlock");
    wait_takeover(&b, pid, 45).await;
    src.batch_execute("UPDATE t SET v = 2 WHERE id = 1")
        .await
        .expect("change");
    wait_value(&dst, 1, 2, &b).await;
    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    a.wait_state("standby", 60).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(value(&dst, 1).await, Some(2), "{}", a.log());
    ends_equal(&src, &dst, a, b).await;
}

/// A target where the sink's user may not create the fence table, and
/// nobody made it: the pipeline fails before it streams, with an error
/// that gives the statements to run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_without_the_fence_table_says_how_to_make_it() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    same_rows(&src, &dst).await;
    dst.batch_execute(
        "CREATE ROLE plain_writer LOGIN;
         GRANT SELECT, INSERT, UPDATE, DELETE ON t TO plain_writer;
         REVOKE CREATE ON SCHEMA public FROM PUBLIC;",
    )
    .await
    .expect("role");
    let dst_url = pg
        .conninfo("dst")
        .replace("user=postgres", "user=plain_writer");
    let mut a = Machine::new("unfenced", &pg.conninfo("src"), &dst_url);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !a.log().contains("pipeline failed") {
        assert!(Instant::now() < deadline, "did not fail:\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, log) = a.host.take().expect("a").stop(30);
    assert!(!status.success(), "{log}");
    for needed in [
        "permission denied for schema public",
        r#"CREATE TABLE "public"."datum_fence" (holder text PRIMARY KEY"#,
        "GRANT SELECT, INSERT, UPDATE",
    ] {
        assert!(log.contains(needed), "{needed}:\n{log}");
    }
}

/// Two sources with a pipeline alike (same name, same slot name: one
/// configuration for two shards), each with its leader lock, writing into
/// one target. The fence is keyed by the source's system identifier and
/// the slot's name, so sources made apart never share it; these two are
/// copies of one cluster (the harness copies a template, as a shard restored
/// from another's base backup is), which keep its identifier. Each host's
/// claim then refused the other's writes, over and over: now one of them
/// stops with an error that says to give it another slot name, and with
/// that both stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_cloned_sources_with_the_same_slot_name_are_told_apart_by_the_slot() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    same_rows(&src, &dst).await;
    let other = cluster();
    connect(&other.conninfo("postgres"))
        .await
        .batch_execute("CREATE DATABASE src")
        .await
        .expect("database");
    let src2 = connect(&other.conninfo("src")).await;
    src2.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY, v int NOT NULL, note text);
         INSERT INTO t SELECT g, 0, 'row ' || g FROM generate_series(11, 20) g;",
    )
    .await
    .expect("second source");
    let id = "SELECT system_identifier FROM pg_control_system()";
    let ids = (
        src.query_one(id, &[]).await.expect("id").get::<_, i64>(0),
        src2.query_one(id, &[]).await.expect("id").get::<_, i64>(0),
    );
    assert_eq!(ids.0, ids.1, "the two clusters are copies of one");
    dst.batch_execute("INSERT INTO t SELECT g, 0, 'row ' || g FROM generate_series(11, 20) g")
        .await
        .expect("target");
    let dst_url = pg.conninfo("dst");
    let (src_url, src2_url) = (pg.conninfo("src"), other.conninfo("src"));
    let mut a = Machine::new("shard-a", &src_url, &dst_url);
    a.wait_running().await;
    let mut b = Machine::new("shard-b", &src2_url, &dst_url);
    let told = "another source writes into the same target under the same fence";
    let deadline = Instant::now() + Duration::from_secs(90);
    let a_port = a.port;
    let (failed, kept) = loop {
        if a.log().contains(told) {
            break (&mut a, &mut b);
        }
        if b.log().contains(told) {
            break (&mut b, &mut a);
        }
        // Writes, which find the fence claimed by the other.
        for (db, id) in [(&src, 2), (&src2, 12)] {
            db.batch_execute(&format!("UPDATE t SET v = v + 1 WHERE id = {id}"))
                .await
                .expect("change");
        }
        assert!(
            Instant::now() < deadline,
            "neither stopped:\n{}\n{}",
            a.log(),
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let log = failed.log();
    assert!(log.contains("source.slot"), "{log}");
    let (status, _) = failed.host.take().expect("the failed host").stop(30);
    assert!(!status.success(), "{log}");
    let (source, name) = if failed.port == a_port {
        (&src_url, "shard-a2")
    } else {
        (&src2_url, "shard-b2")
    };
    kept.wait_running().await;
    let mut renamed = Machine::with(name, source, &dst_url, "source.slot = \"datum_other\"");
    renamed.wait_running().await;
    let overtaken = |m: &Machine| m.log().matches("another host took over").count();
    let before = overtaken(kept);
    for round in 1..=3 {
        src.batch_execute(&format!("UPDATE t SET v = {round} WHERE id = 1"))
            .await
            .expect("change");
        src2.batch_execute(&format!("UPDATE t SET v = {round} WHERE id = 11"))
            .await
            .expect("change");
        wait_value(&dst, 1, round, kept).await;
        wait_value(&dst, 11, round, kept).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(overtaken(kept), before, "{}", kept.log());
    assert_eq!(overtaken(&renamed), 0, "{}", renamed.log());
    for m in [&*kept, &renamed] {
        assert_eq!(
            state(m.port).await.as_deref(),
            Some("running"),
            "{}",
            m.log()
        );
    }
    kept.stop();
    renamed.stop();
}

/// The fence table dropped under a running pipeline with `on_error =
/// "skip"`: a failed fence check is not the target refusing a batch, so
/// the change is not skipped; the pipeline waits, saying why, and once the
/// table is back (without its row, which counts as another host's claim)
/// the host claims it again and the change arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_fence_table_holds_writes_back_rather_than_skipping_them() {
    let pg = cluster();
    let (src, dst) = two_databases(&pg).await;
    same_rows(&src, &dst).await;
    let mut a = Machine::with(
        "fence-dropped",
        &pg.conninfo("src"),
        &pg.conninfo("dst"),
        "on_error = \"skip\"",
    );
    a.wait_running().await;
    dst.batch_execute("DROP TABLE datum_fence")
        .await
        .expect("drop");
    src.batch_execute("UPDATE t SET v = 1 WHERE id = 1")
        .await
        .expect("change");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = crate::snapshot::status(a.port).await.unwrap_or_default();
        let error = status["last_error"]["message"].as_str().unwrap_or_default();
        if error.contains("fence table") {
            break;
        }
        assert!(Instant::now() < deadline, "{status}\n{}", a.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(value(&dst, 1).await, Some(0), "{}", a.log());
    assert!(!a.log().contains("batch skipped"), "{}", a.log());
    dst.batch_execute(
        "CREATE TABLE datum_fence (holder text PRIMARY KEY, term bigint NOT NULL, \
         taken_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .expect("create");
    wait_value(&dst, 1, 1, &a).await;
    assert!(!a.log().contains("batch skipped"), "{}", a.log());
    a.wait_running().await;
    a.stop();
}

/// A source where the pipeline's user may not read the system
/// identifier (which keys the sink's fence): the host stands by, says
/// what to grant, and never holds the lock meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_that_hides_its_system_identifier_says_what_to_grant() {
    let pg = cluster();
    let (src, _dst) = two_databases(&pg).await;
    src.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY);
         CREATE ROLE hidden LOGIN REPLICATION;
         GRANT SELECT ON t TO hidden;
         CREATE PUBLICATION datum_p FOR TABLE t;
         REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC",
    )
    .await
    .expect("role and revoke");
    let dir = temp_dir("leader-hidden");
    let source = pg.conninfo("src").replace("user=postgres", "user=hidden");
    assert!(source.contains("user=hidden"), "{source}");
    let host = Host::start(
        &dir,
        &config(&source, &pg.conninfo("dst"), &dir, free_port()),
    );
    let told = "GRANT EXECUTE ON FUNCTION pg_control_system() TO the source's user";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host.log().contains(told) {
        let locks: i64 = src
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'",
                &[],
            )
            .await
            .expect("locks")
            .get(0);
        assert_eq!(locks, 0, "{}", host.log());
        assert!(Instant::now() < deadline, "{}", host.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, log) = host.stop(30);
    assert!(status.success(), "{log}");
    let _ = std::fs::remove_dir_all(&dir);

    // A sink that is not fenced does not need it.
    let dir = temp_dir("leader-hidden-file");
    let port = free_port();
    let dst = pg.conninfo("dst");
    let postgres = format!("{{ type = \"postgres\", url = {} }}", toml_string(&dst));
    let out = toml_string(dir.join("out.jsonl").to_str().expect("utf-8"));
    let file = config(&source, &dst, &dir, port)
        .replace(&postgres, &format!("{{ type = \"file\", path = {out} }}"));
    assert!(file.contains("type = \"file\""), "{file}");
    let mut m = Machine {
        dir: dir.clone(),
        port,
        config: file.clone(),
        host: Some(Host::start(&dir, &file)),
    };
    m.wait_running().await;
    m.stop();
}
