//! Support for Datum's integration tests: connecting to throwaway clusters.
//!
//! The cluster harness itself is the `pg-throwaway` crate, because `datum
//! demo` and the benchmarks use it too; this crate adds what only tests need.

pub use pg_throwaway::{Cluster, PasswordAuth};

/// Connects with tokio-postgres and drives the connection on a task.
/// Panics with the server's message if the connection fails: tests want the
/// reason, not an `Err` to unwrap.
pub async fn connect(conninfo: &str) -> tokio_postgres::Client {
    try_connect(conninfo)
        .await
        .unwrap_or_else(|err| panic!("connecting with `{conninfo}`: {err}"))
}

/// Like [`connect`], but returns the error (for authentication tests).
pub async fn try_connect(conninfo: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        // The connection ends when the client is dropped or the server goes.
        let _ = connection.await;
    });
    Ok(client)
}

/// A query's rows in text form, one line per row (`a | b | NULL`).
pub async fn rows(client: &tokio_postgres::Client, query: &str) -> Vec<String> {
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

/// The Prometheus text a host's admin API at `base` (`http://HOST:PORT`)
/// serves at `/metrics`, asked with `token`.
pub async fn metrics_text(http: &reqwest::Client, base: &str, token: &str) -> String {
    http.get(format!("{base}/metrics"))
        .bearer_auth(token)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text")
}

/// Starts a cluster with the default settings, panicking with the harness's
/// explanation (e.g. which packages to install) if it cannot.
pub fn cluster() -> Cluster {
    Cluster::start().unwrap_or_else(|err| panic!("starting a throwaway PostgreSQL: {err}"))
}

pub mod browser;
pub mod hostile;
pub mod nats;

/// A TCP port on the loopback interface that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}
pub mod stream;

/// The workspace's root directory.
pub fn workspace_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}

/// The directory cargo builds into.
pub fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Runs `cargo build --quiet ARGS` in the workspace once per process for
/// each distinct `args` (a no-op when up to date).
/// What `just test` builds before the tests run: every binary and test of
/// the workspace, with one feature resolution.
pub const BUILD_FOR_TESTS: [&str; 3] = ["--workspace", "--bins", "--tests"];

fn cargo_build_once(args: &[&str], what: &str) {
    use std::sync::Mutex;
    static BUILT: Mutex<Vec<Vec<String>>> = Mutex::new(Vec::new());
    if prebuilt() {
        return;
    }
    let key: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if built.contains(&key) {
        return;
    }
    let mut cargo = std::process::Command::new(env!("CARGO"));
    cargo
        .args(["build", "--quiet"])
        .args(args)
        .current_dir(workspace_root());
    // A test process carries the variables cargo sets for the test's own
    // package (CARGO_MANIFEST_DIR, CARGO_PKG_NAME, ...). Some build scripts
    // (ring's) declare them with `rerun-if-env-changed`, so passing them on
    // would make this build differ from `just test`'s and recompile half the
    // workspace, once per switch, while other tests wait for the build lock.
    for (name, _) in std::env::vars_os() {
        if let Some(name) = name.to_str()
            && is_package_variable(name)
        {
            cargo.env_remove(name);
        }
    }
    let status = cargo.status().expect("running cargo");
    assert!(status.success(), "building {what} failed");
    built.push(key);
}

/// Whether `just test` built the binaries and modules just before the
/// tests (it sets `DATUM_TESTS_PREBUILT=1`): then no test process asks
/// cargo again. Each ask is a no-op costing most of a CPU-second, and the
/// suite starts hundreds of test processes on two cores.
fn prebuilt() -> bool {
    std::env::var_os("DATUM_TESTS_PREBUILT").is_some_and(|v| v == "1")
}

/// Whether `name` is one of the variables cargo sets for a package it
/// compiles or runs (not one that configures cargo itself).
fn is_package_variable(name: &str) -> bool {
    const PREFIXES: [&str; 4] = [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
    ];
    const NAMES: [&str; 3] = ["CARGO_PRIMARY_PACKAGE", "CARGO_TARGET_TMPDIR", "OUT_DIR"];
    PREFIXES.iter().any(|p| name.starts_with(p)) || NAMES.contains(&name)
}

/// The path of an example module from `examples-wasm/`, built for
/// `wasm32-wasip1` in release mode first (once per test process; a no-op
/// when it is up to date), so that tests never run a stale module. An
/// example with a `build.sh` instead of a crate (the C one) is built by it.
pub fn example_wasm_path(name: &str) -> std::path::PathBuf {
    let script = workspace_root()
        .join("examples-wasm")
        .join(name)
        .join("build.sh");
    if script.exists() {
        let path = target_dir().join(format!("wasm32-wasip1/release/{name}.wasm"));
        script_build_once(&script, &path);
        return path;
    }
    let package = format!("example-{name}");
    cargo_build_once(
        &["--release", "--target", "wasm32-wasip1", "-p", &package],
        &format!(
            "{package} for wasm32-wasip1 (is the target installed? `rustup target add wasm32-wasip1`)"
        ),
    );
    target_dir().join(format!("wasm32-wasip1/release/{name}.wasm"))
}

/// Runs `script OUT` once per process for each script; the script prints
/// what to install when its compiler is missing.
fn script_build_once(script: &std::path::Path, out: &std::path::Path) {
    use std::sync::Mutex;
    static BUILT: Mutex<Vec<std::path::PathBuf>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if prebuilt() || built.iter().any(|s| s == script) {
        return;
    }
    let status = std::process::Command::new(script)
        .arg(out)
        .current_dir(workspace_root())
        .status()
        .unwrap_or_else(|err| panic!("running {}: {err}", script.display()));
    assert!(status.success(), "{} failed", script.display());
    built.push(script.to_owned());
}

/// The bytes of an example module (see [`example_wasm_path`]).
pub fn example_wasm(name: &str) -> Vec<u8> {
    let path = example_wasm_path(name);
    std::fs::read(&path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

/// The `datum` binary, built first (debug profile, like the tests), so that
/// tests run the command line a user runs.
///
/// Built with the arguments `just test` builds with before running the
/// tests: the same features resolve as for the test binaries, so this is a
/// no-op there. (`-p datum --bin datum` resolves its dependencies' features
/// differently and would compile wasmtime a second time.)
pub fn datum_bin() -> std::path::PathBuf {
    cargo_build_once(&BUILD_FOR_TESTS, "the datum binary");
    target_dir().join("debug/datum")
}

/// A new build of `module` as an edit makes one: `i32.const n; drop` put
/// at the start of every `every`-th function body (a different set for
/// each `n`), so those functions' code is new and must be compiled, while
/// the rest are as they were; the module behaves as before. `None` for a
/// module this cannot parse (locals of types other than the numeric and
/// reference ones Rust emits).
pub fn edited_build(module: &[u8], n: u64, every: usize) -> Option<Vec<u8>> {
    let leb = leb128;
    fn read_leb(bytes: &[u8], at: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *bytes.get(*at)?;
            *at += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
    let mut out = module.get(..8)?.to_vec();
    let mut at = 8;
    while at < module.len() {
        let id = module[at];
        at += 1;
        let size = read_leb(module, &mut at)? as usize;
        let content = module.get(at..at + size)?;
        at += size;
        if id != 10 {
            wasm_section(id, content, &mut out);
            continue;
        }
        let mut pos = 0;
        let count = read_leb(content, &mut pos)?;
        let mut section = Vec::new();
        leb(count, &mut section);
        for i in 0..count as usize {
            let len = read_leb(content, &mut pos)? as usize;
            let body = content.get(pos..pos + len)?;
            pos += len;
            if !(i + n as usize).is_multiple_of(every) {
                leb(len as u64, &mut section);
                section.extend_from_slice(body);
                continue;
            }
            let mut b = 0;
            let groups = read_leb(body, &mut b)?;
            for _ in 0..groups {
                read_leb(body, &mut b)?;
                match body.get(b)? {
                    0x7f | 0x7e | 0x7d | 0x7c | 0x7b | 0x70 | 0x6f => b += 1,
                    _ => return None,
                }
            }
            let mut edited = body[..b].to_vec();
            edited.push(0x41); // i32.const
            leb(n & 0x3f, &mut edited); // one byte, non-negative
            edited.push(0x1a); // drop
            edited.extend_from_slice(&body[b..]);
            leb(edited.len() as u64, &mut section);
            section.extend_from_slice(&edited);
        }
        wasm_section(id, &section, &mut out);
    }
    Some(distinct_build(&out, n))
}

/// Appends `value` as unsigned LEB128, WebAssembly's integer encoding.
pub fn leb128(mut value: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Appends a WebAssembly section: its id, its size and `body`.
pub fn wasm_section(id: u8, body: &[u8], out: &mut Vec<u8>) {
    out.push(id);
    leb128(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// `module` with a custom section appended that makes its bytes (and its
/// SHA-256) unique without changing what it does: a new build, as far as
/// the host can tell, so every upload is compiled.
pub fn distinct_build(module: &[u8], n: u64) -> Vec<u8> {
    let name = b"datum-bench";
    let mut payload = vec![name.len() as u8];
    payload.extend_from_slice(name);
    payload.extend_from_slice(&n.to_le_bytes());
    let mut out = module.to_vec();
    out.push(0); // custom section
    out.push(payload.len() as u8); // < 128: one LEB128 byte
    out.extend_from_slice(&payload);
    out
}
