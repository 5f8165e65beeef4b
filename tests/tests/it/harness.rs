//! The throwaway-cluster harness itself: what every other test relies on.

use std::path::Path;
use std::time::{Duration, Instant};

use datum_tests::{PasswordAuth, cluster, connect, try_connect};

#[tokio::test]
async fn logical_slot_with_pgoutput_sees_committed_rows() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    // One statement at a time: a slot cannot be created in a transaction
    // that has written, and a multi-statement string is one transaction.
    for sql in [
        "CREATE TABLE item (id int PRIMARY KEY, name text NOT NULL)",
        "CREATE PUBLICATION pub FOR TABLE item",
        "SELECT pg_create_logical_replication_slot('slot', 'pgoutput')",
        "INSERT INTO item VALUES (1, 'one'), (2, 'two')",
        "UPDATE item SET name = 'deux' WHERE id = 2",
    ] {
        client.batch_execute(sql).await.expect(sql);
    }

    let rows = client
        .query(
            "SELECT data FROM pg_logical_slot_peek_binary_changes('slot', NULL, NULL,
                 'proto_version', '1', 'publication_names', 'pub')",
            &[],
        )
        .await
        .expect("peeking the slot");
    let kinds: String = rows
        .iter()
        .map(|row| row.get::<_, Vec<u8>>(0)[0] as char)
        .collect();
    // Begin, Relation, Insert, Insert, Commit; Begin, Update, Commit.
    assert_eq!(kinds, "BRIICBUC", "pgoutput message kinds");
    let insert = rows[2].get::<_, Vec<u8>>(0);
    assert!(
        insert.windows(3).any(|w| w == b"one"),
        "the first insert carries its row: {insert:?}"
    );

    let level: String = client
        .query_one("SHOW wal_level", &[])
        .await
        .expect("SHOW wal_level")
        .get(0);
    assert_eq!(level, "logical");
}

#[tokio::test]
async fn two_clusters_run_side_by_side() {
    let a = cluster();
    let b = cluster();
    assert_ne!(a.port(), b.port());
    assert_ne!(a.root_dir(), b.root_dir());
    let ca = connect(&a.conninfo("postgres")).await;
    let cb = connect(&b.socket_conninfo("postgres")).await;
    ca.batch_execute("CREATE TABLE only_in_a (x int)")
        .await
        .expect("create in a");
    let in_b: i64 = cb
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'",
            &[],
        )
        .await
        .expect("query b")
        .get(0);
    assert_eq!(in_b, 0, "the clusters share nothing");
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| !stat.contains(") Z "))
            .unwrap_or(false)
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn drop_leaves_no_process_and_no_directory() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    let backend: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("backend pid")
        .get(0);
    let postmaster = pg.pid().expect("a running server has a pid");
    let root = pg.root_dir().to_owned();
    assert!(process_exists(postmaster) && process_exists(backend as u32));
    assert!(root.join("data").join("PG_VERSION").is_file());

    drop(pg);
    assert!(!root.exists(), "{} is still there", root.display());
    assert!(
        !process_exists(postmaster),
        "postmaster {postmaster} still runs"
    );
    // The backend is a child of the postmaster and goes with it.
    wait_until("the backend is gone", || !process_exists(backend as u32));
    drop(client);
}

#[test]
fn a_panicking_test_still_cleans_up() {
    let mut seen = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let pg = cluster();
        seen = Some((pg.pid().expect("pid"), pg.root_dir().to_owned()));
        panic!("the test body fails");
    }));
    assert!(outcome.is_err());
    let (pid, root) = seen.expect("the cluster started");
    assert!(!process_exists(pid), "postmaster {pid} outlived the panic");
    assert!(!root.exists(), "{} outlived the panic", root.display());
}

#[tokio::test]
async fn scram_login_needs_the_right_password() {
    let pg = cluster();
    pg.create_login("alice", "s3cret 'quoted'", PasswordAuth::Scram, "")
        .expect("creating a SCRAM login");
    let base = format!(
        "host=127.0.0.1 port={} dbname=postgres user=alice",
        pg.port()
    );

    let ok = connect(&format!("{base} password='s3cret \\'quoted\\''")).await;
    let user: String = ok
        .query_one("SELECT current_user::text", &[])
        .await
        .expect("query as alice")
        .get(0);
    assert_eq!(user, "alice");
    let stored: String = connect(&pg.conninfo("postgres"))
        .await
        .query_one(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'alice'",
            &[],
        )
        .await
        .expect("stored password")
        .get(0);
    assert!(
        stored.starts_with("SCRAM-SHA-256$"),
        "stored as a SCRAM secret"
    );

    let err = try_connect(&format!("{base} password=wrong"))
        .await
        .expect_err("a wrong password must be refused");
    let text = err
        .as_db_error()
        .map(|db| db.message().to_owned())
        .unwrap_or_else(|| err.to_string());
    assert!(
        text.contains("password authentication failed"),
        "unexpected error: {text}"
    );

    let missing = try_connect(&base).await.expect_err("no password, no login");
    // tokio-postgres refuses client-side once the server asks for a password.
    assert!(
        format!("{missing:?}").contains("password missing"),
        "unexpected error: {missing:?}"
    );
}

#[tokio::test]
async fn md5_and_cleartext_logins_are_available() {
    let pg = cluster();
    pg.create_login("bob", "b0b", PasswordAuth::Md5, "")
        .expect("md5 login");
    pg.create_login("carol", "c4rol", PasswordAuth::Cleartext, "REPLICATION")
        .expect("cleartext login");
    let sock = pg.socket_dir().display().to_string();
    for (user, password) in [("bob", "b0b"), ("carol", "c4rol")] {
        let conninfo = format!(
            "host={sock} port={} dbname=postgres user={user} password={password}",
            pg.port()
        );
        connect(&conninfo).await;
        let wrong = format!(
            "host=127.0.0.1 port={} dbname=postgres user={user} password=x",
            pg.port()
        );
        assert!(
            try_connect(&wrong).await.is_err(),
            "{user} with a wrong password"
        );
    }
    let stored: String = connect(&pg.conninfo("postgres"))
        .await
        .query_one(
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'bob'",
            &[],
        )
        .await
        .expect("stored password")
        .get(0);
    assert!(stored.starts_with("md5"), "bob's password is stored as MD5");
}

#[test]
fn server_runs_unprivileged_when_we_are_root() {
    let pg = cluster();
    let pid = pg.pid().expect("pid");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let uid_line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("Uid line");
    let euid: u32 = uid_line
        .split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .expect("effective uid");
    let ours = nix_uid();
    if ours == 0 {
        assert_ne!(euid, 0, "postgres must not run as root");
    } else {
        assert_eq!(euid, ours, "without root, postgres runs as us");
    }
}

fn nix_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("proc status");
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|v| v.parse().ok())
        .expect("our uid")
}

/// Starts `hold-cluster` in a child process and returns it with the cluster's
/// directory and postmaster pid.
fn hold_cluster() -> (std::process::Child, std::path::PathBuf, u32) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hold-cluster"))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawning hold-cluster");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("reading hold-cluster's line");
    let (root, pid) = line
        .trim()
        .rsplit_once(' ')
        .unwrap_or_else(|| panic!("hold-cluster printed {line:?}"));
    (child, root.into(), pid.parse().expect("pid"))
}

#[test]
fn interrupted_process_removes_its_cluster() {
    for signal in ["INT", "TERM", "HUP"] {
        let (mut child, root, postmaster) = hold_cluster();
        assert!(root.exists() && process_exists(postmaster));
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let exit = child.wait().expect("waiting for hold-cluster");
        assert!(!exit.success(), "SIG{signal} ends the process: {exit:?}");
        assert!(
            !process_exists(postmaster),
            "postmaster survived SIG{signal}"
        );
        assert!(!root.exists(), "{} survived SIG{signal}", root.display());
    }
}

#[test]
fn killed_process_takes_its_server_along_and_the_next_run_sweeps_the_directory() {
    let (mut child, root, postmaster) = hold_cluster();
    child.kill().expect("SIGKILL");
    child.wait().expect("reaping hold-cluster");
    // The server got SIGQUIT from the kernel when its parent died.
    wait_until("the orphaned postmaster is gone", || {
        !process_exists(postmaster)
    });
    assert!(root.exists(), "nobody could clean up after SIGKILL yet");
    // The next process that starts a cluster sweeps what the dead one left.
    let (mut next, next_root, _) = hold_cluster();
    assert!(!root.exists(), "{} was not swept", root.display());
    next.kill().expect("SIGKILL");
    next.wait().expect("reaping");
    let (mut last, _, _) = hold_cluster();
    assert!(!next_root.exists());
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &last.id().to_string()])
        .status();
    last.wait().expect("reaping");
}
