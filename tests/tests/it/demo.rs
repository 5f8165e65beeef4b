//! `datum demo` as a newcomer runs it: the real binary, headless for a
//! bounded time, then again stopped with Ctrl-C (SIGINT) — both runs leave
//! no server and no cluster directory behind, and the output shows changes
//! going in with personal data and coming out masked.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use datum_tests::{datum_bin, example_wasm_path};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("datum-demo-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    // The server runs as an unprivileged user when the tests run as root;
    // it must be able to reach its cluster directory under this one.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// `datum demo ARGS` with its clusters under `pg_dir`.
fn demo(pg_dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(datum_bin());
    command
        .arg("demo")
        .args(args)
        .env("DATUM_PG_TMPDIR", pg_dir)
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// What the demo left under `pg_dir`: anything but the cached template,
/// and any process still using it.
fn leftovers(pg_dir: &Path) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir(pg_dir)
        .expect("pg dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("datum-pg-template-"))
        .collect();
    let needle = pg_dir.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(&needle)
        {
            left.push(format!(
                "process {}: {}",
                entry.file_name().to_string_lossy(),
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            ));
        }
    }
    left
}

/// The pairs of `in`/`out` lines the demo printed for inserts into
/// customers.
fn customer_pairs(stdout: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = stdout.lines().collect();
    lines
        .windows(2)
        .filter(|w| {
            w[0].trim_start().starts_with("in ")
                && w[0].contains("insert   customers")
                && w[1].trim_start().starts_with("out ")
        })
        .map(|w| (w[0].to_owned(), w[1].to_owned()))
        .collect()
}

/// The `email='…'` value of a line.
fn email(line: &str) -> &str {
    let start = line.find("email='").expect("an email column") + "email='".len();
    let rest = &line[start..];
    &rest[..rest.find('\'').expect("closing quote")]
}

#[test]
fn the_demo_shows_masked_changes_and_leaves_nothing_behind() {
    // The demo's default module is the one built in this tree.
    assert_eq!(
        example_wasm_path("mask_pii"),
        datum::default_module(),
        "the tests and the demo look for mask_pii in different places"
    );
    let pg_dir = temp_dir("headless");

    // Headless, for a bounded time: 20 s, of which starting the throwaway
    // server and compiling the module took up to 8 s under the suite's
    // load, leaving the writer too little time for its 10 transactions.
    let started = Instant::now();
    let output = demo(&pg_dir, &["--duration", "20s", "--no-color"])
        .output()
        .expect("datum demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    assert!(!stdout.contains('\x1b'), "colour despite --no-color");
    assert!(stdout.contains("txn "), "{stdout}");
    let pairs = customer_pairs(&stdout);
    assert!(!pairs.is_empty(), "no customer went in and out:\n{stdout}");
    for (input, output) in &pairs {
        // In: the real address. Out: a salted SHA-256 (cut for display),
        // the other columns as they were.
        assert!(email(input).contains("@example."), "{input}");
        assert!(!output.contains('@'), "{output}");
        assert!(
            email(output).len() >= 16
                && email(output)
                    .chars()
                    .take(16)
                    .all(|c| c.is_ascii_hexdigit()),
            "{output}"
        );
        let name = |l: &str| {
            l[l.find("name=").expect("name")..]
                .split('\'')
                .nth(1)
                .map(str::to_owned)
        };
        assert_eq!(name(input), name(output), "{input}\n{output}");
    }
    // Orders carry no personal data: mask_pii passes them on untouched.
    assert!(stdout.contains("in=out  insert   orders"), "{stdout}");
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("Stopped: the writer committed "))
        .unwrap_or_else(|| panic!("no summary:\n{stdout}"));
    let numbers: Vec<u64> = summary
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse().ok())
        .collect();
    let (written, shown) = (numbers[0], numbers[1]);
    assert!(written >= 10, "{summary}");
    assert!(shown >= written, "{summary}");
    assert_eq!(leftovers(&pg_dir), Vec::<String>::new());

    // Again, stopped with Ctrl-C once changes show: a second run works and
    // a signal cleans up as well as the clock does.
    let mut child = demo(
        &pg_dir,
        &[
            "--no-color",
            "--module",
            example_wasm_path("mask_pii").to_str().unwrap(),
        ],
    )
    .spawn()
    .expect("datum demo");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !seen.contains("\n  out ") {
        let mut line = String::new();
        if out.read_line(&mut line).expect("read") == 0 || Instant::now() > deadline {
            let _ = child.kill();
            panic!("no output before the end:\n{seen}");
        }
        seen.push_str(&line);
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("read");
    let status = child.wait().expect("wait");
    assert!(status.success(), "exit {status:?}:\n{seen}{rest}");
    assert!(rest.contains("Stopped: the writer committed"), "{rest}");
    assert_eq!(leftovers(&pg_dir), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&pg_dir);
}

#[test]
fn the_demo_says_what_to_install_or_build() {
    let pg_dir = temp_dir("missing");
    let nowhere = pg_dir.join("no-such-dir");
    let module = example_wasm_path("mask_pii");
    let output = demo(&pg_dir, &["--duration", "1s", "--module"])
        .arg(&module)
        .env("PG_BIN", &nowhere)
        .output()
        .expect("datum demo");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("apt-get install postgresql"), "{stderr}");

    let output = demo(&pg_dir, &["--duration", "1s", "--module"])
        .arg(&nowhere)
        .output()
        .expect("datum demo");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cargo build --release --target wasm32-wasip1 -p example-mask_pii"),
        "{stderr}"
    );
    assert_eq!(leftovers(&pg_dir), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&pg_dir);
}

/// Regression: `datum demo | head -2` panicked ("failed printing to stdout:
/// Broken pipe", exit 101 with a backtrace) once the reader went away, and
/// logs carried ANSI colours into files and pipes.
#[test]
fn a_closed_stdout_ends_the_demo_quietly_and_logs_have_no_colour_off_a_terminal() {
    let pg_dir = temp_dir("head");
    let started = Instant::now();
    let mut child = demo(&pg_dir, &["--no-color"])
        .env("RUST_LOG", "info")
        .spawn()
        .expect("datum demo");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    // Read the first two lines, as `head -2` does, then close the pipe.
    for _ in 0..2 {
        let mut line = String::new();
        assert!(out.read_line(&mut line).expect("read") > 0, "no output");
    }
    drop(out);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the demo kept running after its reader went away");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr)
        .expect("stderr");
    assert!(status.success(), "exit {status:?}:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("error:"), "{stderr}");
    assert!(
        stderr.contains("INFO"),
        "RUST_LOG=info shows log lines: {stderr}"
    );
    assert!(!stderr.contains('\x1b'), "colour in a pipe: {stderr:?}");
    assert!(started.elapsed() < Duration::from_secs(90));
    assert_eq!(leftovers(&pg_dir), Vec::<String>::new());
    let _ = std::fs::remove_dir_all(&pg_dir);
}
