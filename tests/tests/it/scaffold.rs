//! `datum new`, through the real binary: every kind scaffolds a crate that
//! builds for wasm32-wasip1 and passes its own golden fixture with
//! `datum test`, as the printed next steps say; one is also unit-tested
//! natively; a git dependency on the SDK builds outside the checkout. Wrong
//! names, directories and SDKs are refused with exit code 2 and nothing
//! written.
//!
//! The four crates build into one shared target directory
//! (`target/scaffold`), one after the other, so the SDK and its dependencies
//! compile once per kind of build, and stay compiled between runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use datum_tests::{datum_bin, target_dir};

/// A directory under the system's temporary directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "datum-scaffold-{what}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        std::fs::create_dir_all(&dir).expect("creating the scratch directory");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|err| panic!("running {command:?}: {err}"))
}

fn text(output: &Output) -> String {
    format!(
        "status: {}\n--- stdout\n{}--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn succeeds(command: &mut Command) -> String {
    let output = run(command);
    assert!(
        output.status.success(),
        "{command:?} failed\n{}",
        text(&output)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `cargo ARGS` in `dir`, into the shared target directory. `--offline`: the
/// crate's dependencies are the SDK's, which the workspace has fetched
/// already, so the test does not depend on reaching crates.io.
fn cargo(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO"));
    command
        .args(args)
        .args(["--quiet", "--offline"])
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target_dir().join("scaffold"));
    command
}

#[test]
fn every_kind_builds_and_passes_its_own_fixtures() {
    let datum = datum_bin();
    let scratch = Scratch::new("kinds");
    let kinds = [
        ("filter", "my-filter"),
        ("map", "my-map"),
        ("flat-map", "my-flat-map"),
        ("transform", "my-transform"),
    ];
    for (kind, name) in kinds {
        let dir = scratch.0.join(name);
        let lib = name.replace('-', "_");
        let printed = succeeds(
            Command::new(&datum)
                .args(["new", name, "--kind", kind, "--path"])
                .arg(&dir),
        );
        let build = "cargo build --release --target wasm32-wasip1";
        let test = format!("datum test target/wasm32-wasip1/release/{lib}.wasm fixtures");
        assert!(
            printed.starts_with(&format!("created {}", dir.display())),
            "{printed}"
        );
        for step in ["cargo test", build, &test] {
            assert!(
                printed.contains(&format!("\n  {step}\n")),
                "`datum new` prints the step `{step}`:\n{printed}"
            );
        }

        succeeds(&mut cargo(
            &dir,
            &["build", "--release", "--target", "wasm32-wasip1"],
        ));
        let wasm = target_dir().join(format!("scaffold/wasm32-wasip1/release/{lib}.wasm"));
        let tested = succeeds(
            Command::new(&datum)
                .arg("test")
                .arg(&wasm)
                .arg(dir.join("fixtures")),
        );
        assert!(
            tested.contains("test example ... ok") && tested.contains("1 passed, 0 failed"),
            "the {kind} template passes its fixture:\n{tested}"
        );

        if kind == "filter" {
            // A private `#[init]` function is used by the module's export,
            // which a native build does not have: no "never used" warning.
            let lib_rs = dir.join("src/lib.rs");
            let mut source = std::fs::read_to_string(&lib_rs).expect("lib.rs");
            source.push_str(
                "\n#[datum_guest::init]\nfn setup(config: datum_guest::Config) -> \
                 datum_guest::Result<()> {\n    let _ = config;\n    Ok(())\n}\n",
            );
            std::fs::write(&lib_rs, source).expect("lib.rs");
            let output = run(&mut cargo(&dir, &["test"]));
            assert!(output.status.success(), "{}", text(&output));
            assert!(!text(&output).contains("never used"), "{}", text(&output));
            // `git init`, as `cargo new` does (the scratch directory is
            // outside any repository).
            assert!(
                dir.join(".git").is_dir(),
                "no repository in {}",
                dir.display()
            );
        }
    }
}

/// `--sdk-git URL --sdk-rev REV` makes a crate that builds outside any
/// checkout: cargo fetches the SDK from the repository (here a bare clone
/// of this one, by file URL, at its HEAD commit).
#[test]
fn a_git_sdk_dependency_builds_outside_the_checkout() {
    let scratch = Scratch::new("git-sdk");
    let repo = scratch.0.join("datum.git");
    let root = datum_tests::workspace_root();
    succeeds(
        Command::new("git")
            .args(["clone", "--quiet", "--bare"])
            .arg(&root)
            .arg(&repo),
    );
    let head = succeeds(
        Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(&repo),
    );
    let url = format!("file://{}", repo.display());
    let dir = scratch.0.join("elsewhere");
    let printed = succeeds(
        Command::new(datum_bin())
            .args([
                "new",
                "git-filter",
                "--sdk-git",
                &url,
                "--sdk-rev",
                head.trim(),
            ])
            .arg("--path")
            .arg(&dir),
    );
    assert!(printed.contains(&format!("from git {url} at")), "{printed}");
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).expect("Cargo.toml");
    assert!(!manifest.contains("path ="), "{manifest}");
    // Not `--offline`: cargo must fetch the git dependency (by file URL; the
    // SDK's own dependencies are in the local registry cache already).
    let mut check = Command::new(env!("CARGO"));
    check
        .args(["check", "--quiet", "--lib"])
        .current_dir(&dir)
        .env("CARGO_TARGET_DIR", target_dir().join("scaffold"))
        // git itself, which also fetches from a shallow clone (a CI
        // checkout may be one).
        .env("CARGO_NET_GIT_FETCH_WITH_CLI", "true");
    succeeds(&mut check);
}

fn refused(args: &[&str], dir: &Path) -> String {
    let output = run(Command::new(datum_bin()).args(args).arg("--path").arg(dir));
    assert_eq!(
        output.status.code(),
        Some(2),
        "`datum {}` is refused\n{}",
        args.join(" "),
        text(&output)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn wrong_names_directories_and_sdks_are_refused() {
    let scratch = Scratch::new("refused");

    let taken = scratch.0.join("taken");
    std::fs::create_dir_all(&taken).expect("mkdir");
    std::fs::write(taken.join("notes.txt"), "mine").expect("write");
    let err = refused(&["new", "my-filter"], &taken);
    assert!(
        err.contains("already exists and is not empty") && err.contains("--path"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(taken.join("notes.txt")).expect("read"),
        "mine"
    );
    assert!(!taken.join("Cargo.toml").exists(), "nothing is written");

    let fresh = scratch.0.join("fresh");
    let err = refused(&["new", "9lives"], &fresh);
    assert!(
        err.contains("`9lives` is not a valid crate name: it starts with a digit")
            && err.contains("use ASCII letters, digits, `-` and `_`"),
        "{err}"
    );
    let err = refused(&["new", "my.filter"], &fresh);
    assert!(err.contains("'.' is not allowed"), "{err}");

    let nowhere = scratch.0.join("nowhere");
    let nowhere_arg = nowhere.to_str().expect("a UTF-8 temporary directory");
    let err = refused(&["new", "my-filter", "--sdk", nowhere_arg], &fresh);
    assert!(
        err.contains("it does not exist")
            && err.contains("pass the guest-sdk directory of a Datum checkout"),
        "{err}"
    );
    let not_the_sdk = datum_tests::workspace_root().join("host");
    let err = refused(
        &[
            "new",
            "my-filter",
            "--sdk",
            not_the_sdk.to_str().expect("a UTF-8 checkout path"),
        ],
        &fresh,
    );
    assert!(err.contains("not `datum-guest`"), "{err}");
    assert!(!fresh.exists(), "a refused `datum new` creates nothing");
}
