//! `datum test`, the golden-file runner: every example module passes its own
//! fixtures through the command line a user runs; a changed, missing,
//! malformed or filtered case, a module that does not load and a
//! configuration given on the command line are reported as they should be;
//! and `datum::run_suite` works in-process, as in a module's own
//! `cargo test`.
//!
//! Failure cases run on temporary copies of the examples' fixtures, so the
//! committed files are never written. PostgreSQL is not needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use datum::Outcome;
use datum_tests::{datum_bin, example_wasm_path, workspace_root};

/// Every example module: each directory of `examples-wasm/`, which must
/// have a `fixtures/` directory (Rust crates and the C module alike).
fn examples() -> Vec<String> {
    let dir = workspace_root().join("examples-wasm");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("reading {}: {err}", dir.display()))
        .filter_map(|entry| {
            let entry = entry.expect("a directory entry");
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            is_dir.then(|| entry.file_name().to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    names
}

fn fixtures(example: &str) -> PathBuf {
    workspace_root()
        .join("examples-wasm")
        .join(example)
        .join("fixtures")
}

/// How many cases a directory holds: its `*.input.json` files.
fn case_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap_or_else(|err| panic!("reading {}: {err}", dir.display()))
        .filter(|entry| {
            entry.as_ref().is_ok_and(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.ends_with(datum::INPUT_SUFFIX))
            })
        })
        .count()
}

/// What a `datum test` run printed, and its exit code.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The last line of stdout: the tally.
    fn tally(&self) -> &str {
        self.stdout.lines().last().unwrap_or_default()
    }

    /// The lines of the diffs: `-` and `+` lines, indented by the runner,
    /// without the `---` / `+++` headers.
    fn diff_lines(&self, sign: char) -> Vec<&str> {
        self.stdout
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with(sign) && !l.starts_with(&sign.to_string().repeat(3)))
            .collect()
    }
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit code {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `datum test WASM DIR ARGS...`.
fn datum_test(wasm: &Path, dir: &Path, args: &[&str]) -> Run {
    let output = Command::new(datum_bin())
        .arg("test")
        .arg(wasm)
        .arg(dir)
        .args(args)
        .output()
        .expect("running datum");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// A directory of its own under the system's temporary directory, removed
/// when the test passes and kept (for a look) when it fails.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("datum-golden-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
        Scratch(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    /// Copies case `case` of `example` (input, expected file, own
    /// configuration, and the directory's `config.toml`) here.
    fn copy_case(&self, example: &str, case: &str) {
        let from = fixtures(example);
        for file in [
            format!("{case}{}", datum::INPUT_SUFFIX),
            format!("{case}{}", datum::EXPECTED_SUFFIX),
            format!("{case}{}", datum::CONFIG_SUFFIX),
            datum::DIR_CONFIG.to_owned(),
        ] {
            if from.join(&file).exists() {
                self.copy(&from.join(&file), &file);
            }
        }
    }

    fn copy(&self, from: &Path, to: &str) {
        std::fs::copy(from, self.0.join(to))
            .unwrap_or_else(|err| panic!("copying {}: {err}", from.display()));
    }

    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.0.join(file), text).expect("writing a scratch file");
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.0.join(file))
            .unwrap_or_else(|err| panic!("reading {file}: {err}"))
    }

    /// Edits a file by replacing `from` (which must be there) with `to`.
    fn replace(&self, file: &str, from: &str, to: &str) {
        let text = self.read(file);
        assert!(text.contains(from), "{file} lacks `{from}`:\n{text}");
        self.write(file, &text.replacen(from, to, 1));
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept {} for a look", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn every_example_passes_its_fixtures() {
    // Build first (cargo runs one build at a time anyway), then run the
    // suites side by side.
    let examples = examples();
    for known in ["identity", "filter_rows", "drop_columns_c"] {
        assert!(
            examples.iter().any(|e| e == known),
            "{known} is not among {examples:?}"
        );
    }
    let wasm: Vec<PathBuf> = examples.iter().map(|e| example_wasm_path(e)).collect();
    datum_bin();
    let runs: Vec<Run> = std::thread::scope(|scope| {
        let handles: Vec<_> = examples
            .iter()
            .zip(&wasm)
            .map(|(example, wasm)| scope.spawn(move || datum_test(wasm, &fixtures(example), &[])))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a datum test run"))
            .collect()
    });
    for (example, run) in examples.iter().zip(runs) {
        let cases = case_count(&fixtures(example));
        assert!(cases >= 4, "{example} has {cases} golden cases");
        assert_eq!(run.code, Some(0), "{example}: {run}");
        assert_eq!(
            run.tally(),
            format!("{cases} passed, 0 failed"),
            "{example}: every *.input.json is a case, and each one passes: {run}"
        );
    }
}

#[test]
fn a_changed_expected_value_fails_with_a_unified_diff() {
    let scratch = Scratch::new("changed");
    scratch.copy_case("identity", "keeps_row_changes_in_order");
    let expected = "keeps_row_changes_in_order.expected.json";
    scratch.replace(expected, "ada@lovelace.org", "ada@lovelace.com");

    let run = datum_test(&example_wasm_path("identity"), scratch.path(), &[]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stdout
            .contains("test keeps_row_changes_in_order ... FAILED"),
        "{run}"
    );
    assert!(
        run.stdout.contains("--- expected") && run.stdout.contains("+++ actual"),
        "{run}"
    );
    // Only the line that differs is marked: the rest of the file is context.
    assert_eq!(
        run.diff_lines('-'),
        [r#"-      "new": {"id": 1, "email": "ada@lovelace.com"}"#],
        "{run}"
    );
    assert_eq!(
        run.diff_lines('+'),
        [r#"+      "new": {"id": 1, "email": "ada@lovelace.org"}"#],
        "{run}"
    );
    assert_eq!(run.tally(), "0 passed, 1 failed", "{run}");
    assert!(
        scratch.read(expected).contains("ada@lovelace.com"),
        "without --bless the expected file is left alone"
    );
}

#[test]
fn a_missing_expected_file_fails_suggesting_bless_which_writes_it() {
    let scratch = Scratch::new("missing");
    let case = "keeps_typed_values_and_nulls";
    scratch.copy(
        &fixtures("identity").join(format!("{case}.input.json")),
        &format!("{case}.input.json"),
    );
    let wasm = example_wasm_path("identity");

    let run = datum_test(&wasm, scratch.path(), &[]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stdout.contains(&format!(
            "{case}.expected.json does not exist; run with --bless"
        )),
        "{run}"
    );
    assert_eq!(run.tally(), "0 passed, 1 failed", "{run}");

    let run = datum_test(&wasm, scratch.path(), &["--bless"]);
    assert_eq!(run.code, Some(0), "{run}");
    let written = scratch.path().join(format!("{case}.expected.json"));
    assert!(
        run.stdout.contains(&format!(
            "test {case} ... blessed: wrote {}",
            written.display()
        )),
        "--bless names the file it wrote: {run}"
    );
    assert_eq!(run.tally(), "1 passed, 0 failed (1 blessed)", "{run}");
    let committed =
        std::fs::read_to_string(fixtures("identity").join(format!("{case}.expected.json")))
            .expect("the committed expected file");
    assert_eq!(
        scratch.read(&format!("{case}.expected.json")),
        committed,
        "--bless writes what the committed file says, byte for byte"
    );

    let run = datum_test(&wasm, scratch.path(), &[]);
    assert_eq!(run.code, Some(0), "{run}");
    assert_eq!(run.tally(), "1 passed, 0 failed", "{run}");

    // A stale expected file is rewritten, and said so; a matching one is
    // left alone and not named.
    std::fs::write(&written, "{\"changes\": []}\n").expect("stale expected file");
    let run = datum_test(&wasm, scratch.path(), &["--bless"]);
    assert!(
        run.stdout
            .contains(&format!("blessed: rewrote {}", written.display())),
        "{run}"
    );
    let run = datum_test(&wasm, scratch.path(), &["--bless"]);
    assert!(!run.stdout.contains("blessed"), "{run}");
}

#[test]
fn filter_runs_only_the_matching_cases() {
    let wasm = example_wasm_path("identity");
    let run = datum_test(&wasm, &fixtures("identity"), &["--filter", "keeps_t"]);
    assert_eq!(run.code, Some(0), "{run}");
    let ran: Vec<&str> = run
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("test "))
        .filter_map(|l| l.split(" ... ").next())
        .collect();
    assert_eq!(
        ran,
        ["keeps_truncate_and_message", "keeps_typed_values_and_nulls"],
        "{run}"
    );
    assert_eq!(run.tally(), "2 passed, 0 failed", "{run}");

    let run = datum_test(&wasm, &fixtures("identity"), &["--filter", "no_such_case"]);
    assert_eq!(
        run.code,
        Some(2),
        "a filter matching nothing cannot run: {run}"
    );
    assert!(run.stderr.contains("no cases"), "{run}");
    assert!(run.stderr.contains("matching `no_such_case`"), "{run}");
}

#[test]
fn a_malformed_input_fails_its_case_naming_the_file_line_and_field() {
    let scratch = Scratch::new("malformed");
    scratch.copy_case("identity", "keeps_row_changes_in_order");
    scratch.copy_case("identity", "keeps_truncate_and_message");
    // The 13th month, on line 3.
    scratch.write(
        "bad_date.input.json",
        r#"{
  "changes": [
    {"op": "insert", "table": "people", "key": ["id"], "new": {"id": 1, "born": {"date": "1815-13-10"}}}
  ]
}
"#,
    );

    let run = datum_test(&example_wasm_path("identity"), scratch.path(), &[]);
    assert_eq!(run.code, Some(1), "{run}");
    let failure = run
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("test bad_date ... FAILED"))
        .nth(1)
        .unwrap_or_else(|| panic!("no failure for bad_date: {run}"));
    let file = scratch.path().join("bad_date.input.json");
    assert!(
        failure.contains(&file.display().to_string()),
        "names the file: {run}"
    );
    assert!(failure.contains("line 3,"), "names the line: {run}");
    assert!(
        failure.contains("field `changes[0].new.born`"),
        "names the field: {run}"
    );
    assert!(
        failure.contains("`1815-13-10` is not a date"),
        "says what is wrong: {run}"
    );
    assert!(
        run.stdout
            .contains("test keeps_row_changes_in_order ... ok")
            && run
                .stdout
                .contains("test keeps_truncate_and_message ... ok"),
        "the other cases still run: {run}"
    );
    assert_eq!(run.tally(), "2 passed, 1 failed", "{run}");
}

#[test]
fn a_file_that_is_not_a_module_cannot_run() {
    let scratch = Scratch::new("not-wasm");
    for (name, bytes) in [
        ("text.wasm", &b"this is not a module\n"[..]),
        ("binary.wasm", &b"\x7fELF\x02\x01\x01\0\0\0\0\0"[..]),
    ] {
        std::fs::write(scratch.path().join(name), bytes).expect("writing");
        let run = datum_test(&scratch.path().join(name), &fixtures("identity"), &[]);
        assert_eq!(run.code, Some(2), "{name}: {run}");
        assert!(
            run.stderr.contains(name) && run.stderr.contains("does not load"),
            "{name}: {run}"
        );
        assert!(!run.stdout.contains("passed"), "no case ran: {run}");
    }
}

#[test]
fn an_expected_error_kind_mismatch_shows_in_the_diff() {
    let scratch = Scratch::new("error-kind");
    let case = "fails_comparing_text_with_a_number";
    scratch.copy_case("filter_rows", case);
    scratch.replace(
        &format!("{case}.expected.json"),
        r#""kind": "guest_error""#,
        r#""kind": "trap""#,
    );

    let run = datum_test(&example_wasm_path("filter_rows"), scratch.path(), &[]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.diff_lines('-')
            .iter()
            .any(|l| l.contains(r#""kind": "trap""#)),
        "{run}"
    );
    assert!(
        run.diff_lines('+')
            .iter()
            .any(|l| l.contains(r#""kind": "guest_error""#)),
        "{run}"
    );
    assert_eq!(run.tally(), "0 passed, 1 failed", "{run}");
}

#[test]
fn an_error_diff_marks_only_the_lines_that_differ() {
    let scratch = Scratch::new("error-diff");
    let case = "fails_comparing_text_with_a_number";
    scratch.copy_case("filter_rows", case);
    scratch.replace(
        &format!("{case}.expected.json"),
        r#""kind": "guest_error""#,
        r#""kind": "trap""#,
    );
    let run = datum_test(&example_wasm_path("filter_rows"), scratch.path(), &[]);
    assert_eq!(run.diff_lines('-'), [r#"-    "kind": "trap","#], "{run}");
    assert_eq!(
        run.diff_lines('+'),
        [r#"+    "kind": "guest_error","#],
        "{run}"
    );
}

#[test]
fn a_blessed_file_pins_the_columns_of_a_change_without_a_key() {
    let scratch = Scratch::new("blessed-columns");
    let wasm = example_wasm_path("identity");
    scratch.write(
        "no_key.input.json",
        r#"{"changes": [{"op": "insert", "table": "t", "new": {"name": "Ada"}}]}"#,
    );
    let run = datum_test(&wasm, scratch.path(), &["--bless"]);
    assert_eq!(run.code, Some(0), "{run}");
    // The same row, but the columns now say something else: a key the row
    // lacks, and another type.
    scratch.write(
        "no_key.input.json",
        r#"{"changes": [{"op": "insert", "table": "t",
            "columns": [{"name": "ssn", "type": "text", "key": true}, {"name": "name", "type": "int4"}],
            "new": {"name": "Ada"}}]}"#,
    );
    let run = datum_test(&wasm, scratch.path(), &[]);
    assert_eq!(run.code, Some(1), "the blessed file must notice: {run}");
}

#[test]
fn the_config_flag_overrides_the_directory_config_but_not_a_case_config() {
    let scratch = Scratch::new("config");
    scratch.copy_case("filter_rows", "keeps_paid_inserts_and_snapshots");
    scratch.copy_case("filter_rows", "fails_comparing_text_with_a_number");
    scratch.write(
        "new_orders.toml",
        "column = \"status\"\nop = \"eq\"\nvalue = \"new\"\n",
    );
    let wasm = example_wasm_path("filter_rows");

    let run = datum_test(&wasm, scratch.path(), &[]);
    assert_eq!(run.code, Some(0), "with the directory's config.toml: {run}");

    let config = scratch.path().join("new_orders.toml");
    let config = config.to_str().expect("a UTF-8 path");
    let run = datum_test(&wasm, scratch.path(), &["--config", config]);
    assert_eq!(run.code, Some(1), "{run}");
    assert!(
        run.stdout
            .contains("test keeps_paid_inserts_and_snapshots ... FAILED"),
        "{run}"
    );
    assert!(
        run.diff_lines('+')
            .iter()
            .any(|l| l.contains(r#""new": {"id": 2, "status": "new"}"#)),
        "the module kept the new orders instead: {run}"
    );
    assert!(
        run.stdout
            .contains("test fails_comparing_text_with_a_number ... ok"),
        "a case's own NAME.config.toml wins over --config: {run}"
    );
    assert_eq!(run.tally(), "1 passed, 1 failed", "{run}");
}

#[test]
fn run_suite_works_in_process() {
    let dir = fixtures("mask_pii");
    let mut out = Vec::new();
    let summary = datum::run_suite(
        &example_wasm_path("mask_pii"),
        &dir,
        &datum::GoldenOptions::default(),
        &mut out,
    )
    .expect("the module and the fixtures load");
    let out = String::from_utf8(out).expect("UTF-8 output");

    let cases = case_count(&dir);
    assert_eq!(summary.failed, 0, "{summary}\n{out}");
    assert_eq!(summary.passed, cases, "{summary}\n{out}");
    assert_eq!(summary.blessed, 0);
    assert_eq!(summary.to_string(), format!("{cases} passed, 0 failed"));
    assert_eq!(out.lines().last(), Some(summary.to_string().as_str()));
    assert_eq!(summary.results.len(), cases);
    assert!(
        summary.results.iter().all(|r| r.outcome == Outcome::Passed),
        "{out}"
    );
    let masked = summary
        .results
        .iter()
        .find(|r| r.name == "masks_email_in_new_and_old")
        .expect("the case ran");
    assert!(
        masked.fuel.is_some_and(|fuel| fuel > 0),
        "fuel is reported: {:?}",
        masked.fuel
    );
    let rejected = summary
        .results
        .iter()
        .find(|r| r.name == "rejects_empty_columns")
        .expect("the case ran");
    assert!(
        matches!(&rejected.actual, datum::Actual::Error { kind, .. } if kind == "init_failed"),
        "{:?}",
        rejected.actual
    );
}

/// A configuration the module refuses is reported once, before the cases,
/// with the file and the module's message; each case that uses it fails on
/// one line with no diff, and --bless writes nothing for them. A case with
/// its own configuration still runs, and one that expects exactly that
/// refusal passes.
#[test]
fn a_refused_configuration_fails_once_up_front_not_as_a_diff_per_case() {
    let scratch = Scratch::new("refused-config");
    for case in [
        "masks_email_in_new_and_old",
        "keeps_nulls_and_unchanged_toast_values",
        "masks_only_the_listed_tables",
    ] {
        scratch.copy_case("mask_pii", case);
    }
    // The same refusal as `rejects_empty_columns` expects, but shared.
    std::fs::write(scratch.path().join(datum::DIR_CONFIG), "columns = []\n").expect("config");
    scratch.copy(
        &fixtures("mask_pii").join("rejects_empty_columns.input.json"),
        "expects_the_refusal.input.json",
    );
    scratch.copy(
        &fixtures("mask_pii").join("rejects_empty_columns.expected.json"),
        "expects_the_refusal.expected.json",
    );
    scratch.copy(
        &fixtures("mask_pii").join("rejects_empty_columns.input.json"),
        "not_yet_expected.input.json",
    );
    let wasm = example_wasm_path("mask_pii");

    for args in [&[][..], &["--bless"][..]] {
        let run = datum_test(&wasm, scratch.path(), args);
        assert_eq!(run.code, Some(1), "{run}");
        let config = scratch.path().join(datum::DIR_CONFIG);
        let refusal = format!(
            "the module refused the configuration {} (init_failed): module initialisation \
             failed: `columns` names no column to mask",
            config.display()
        );
        assert_eq!(run.stdout.matches(&refusal).count(), 1, "{run}");
        for case in [
            "masks_email_in_new_and_old",
            "keeps_nulls_and_unchanged_toast_values",
            "not_yet_expected",
        ] {
            assert!(
                run.stdout.contains(&format!(
                    "test {case} ... FAILED: the module refused the configuration (above)\n"
                )),
                "{case}: {run}"
            );
        }
        assert!(run.diff_lines('-').is_empty(), "no diffs: {run}");
        assert!(
            run.stdout
                .contains("test masks_only_the_listed_tables ... ok"),
            "{run}"
        );
        assert!(
            run.stdout.contains("test expects_the_refusal ... ok"),
            "{run}"
        );
        assert_eq!(run.tally(), "2 passed, 3 failed", "{run}");
        assert!(
            !scratch
                .path()
                .join("not_yet_expected.expected.json")
                .exists(),
            "nothing blessed from a refused configuration: {run}"
        );
    }
}
