//! `datum admin canary` and `datum admin swap --canary` (`docs/canary.md`):
//! the canary's report as a reader wants it, and its differences written
//! as fixtures for `datum test`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::summary::{field, list, short_sha};
use crate::event::ordered::to_pretty;

/// How a canary started by `swap --canary` ends by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CanaryStart {
    /// Promote it after this many batches compared with no difference.
    pub promote_after: Option<u64>,
    /// Stop it at the first difference.
    pub stop_on_difference: bool,
    /// Stop it at the first failure of any kind.
    pub abort_on_failure: bool,
    /// Differences to keep (the host's default when None).
    pub keep: Option<u64>,
}

/// The path (with its query) that starts a canary of a module.
pub(crate) fn start_path(module_path: &str, start: &CanaryStart) -> String {
    let mut query = Vec::new();
    if let Some(n) = start.promote_after {
        query.push(format!("promote_after={n}"));
    }
    if start.stop_on_difference {
        query.push("stop_on_difference=true".to_owned());
    }
    if start.abort_on_failure {
        query.push("abort_on_failure=true".to_owned());
    }
    if let Some(n) = start.keep {
        query.push(format!("keep={n}"));
    }
    let mut path = format!("{module_path}/canary");
    if !query.is_empty() {
        path.push('?');
        path.push_str(&query.join("&"));
    }
    path
}

/// `{"a": 1, "b": 2}` as `a 1, b 2`.
fn counts(map: Option<&Value>) -> String {
    map.and_then(Value::as_object)
        .map(|entries| {
            entries
                .iter()
                .map(|(key, n)| format!("{key} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// The canary's line in `datum admin status`.
pub(crate) fn status_line(canary: &Value) -> String {
    let n = |key: &str| {
        canary
            .pointer(&format!("/batches/{key}"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    format!(
        "  canary    {} v{} beside v{}, {}: {} batches compared, {} different, {} failed, {} \
         not compared (`datum admin canary` for the diffs)",
        field(canary, &["module"]),
        field(canary, &["version"]),
        field(canary, &["active_version"]),
        field(canary, &["state"]),
        n("compared"),
        n("different"),
        n("failed"),
        n("not_compared")
    )
}

/// The human summary of a canary report.
pub(crate) fn render(report: &Value) -> String {
    let f = |path: &[&str]| field(report, path);
    let n = |path: &[&str]| {
        let mut value = report;
        for key in path {
            value = match value.get(key) {
                Some(next) => next,
                None => return 0,
            };
        }
        value.as_u64().unwrap_or(0)
    };
    let mut out = format!(
        "canary of {} version {} (sha256 {}) beside version {}: {}\n",
        f(&["module"]),
        f(&["version"]),
        short_sha(report.get("sha256")),
        f(&["active_version"]),
        f(&["state"])
    );
    if let Some(reason) = report.get("reason").and_then(Value::as_str) {
        let _ = writeln!(out, "  why       {reason}");
    }
    match report.get("compared_after").and_then(Value::as_str) {
        Some("0/0") => out.push_str("  from      the first transaction streamed\n"),
        Some(lsn) => {
            let _ = writeln!(out, "  from      the transaction after {lsn}");
        }
        None => out.push_str("  from      the next transaction boundary (none reached yet)\n"),
    }
    if let Some(lsn) = report.get("effective_after").and_then(Value::as_str) {
        let _ = writeln!(out, "  promoted  in force after {lsn}");
    }
    let _ = writeln!(
        out,
        "  batches   {} compared: {} equal, {} different; {} failed in the canary; {} not \
         compared (the canary was behind), {} the active chain failed on",
        n(&["batches", "compared"]),
        n(&["batches", "equal"]),
        n(&["batches", "different"]),
        n(&["batches", "failed"]),
        n(&["batches", "not_compared"]),
        n(&["batches", "active_failed"])
    );
    let by_table = counts(report.pointer("/changes/different_by_table"));
    let _ = writeln!(
        out,
        "  changes   {} compared, {} different{}",
        n(&["changes", "compared"]),
        n(&["changes", "different"]),
        if by_table.is_empty() {
            String::new()
        } else {
            format!(" ({by_table})")
        }
    );
    let failures = counts(report.get("failures"));
    match report.get("failure").filter(|f| !f.is_null()) {
        Some(failure) => {
            let _ = writeln!(out, "  failures  {failures}");
            let _ = writeln!(
                out,
                "  last      {} in module `{}` on transaction {} (commit {}): {}",
                field(failure, &["kind"]),
                field(failure, &["module"]),
                field(failure, &["xid"]),
                field(failure, &["commit_lsn"]),
                field(failure, &["message"])
                    .lines()
                    .next()
                    .unwrap_or_default()
            );
        }
        None => out.push_str("  failures  none\n"),
    }
    let seconds = |name: &str| {
        report
            .pointer(&format!("/cpu/{name}"))
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
    };
    let _ = writeln!(
        out,
        "  cpu       canary {:.3} s; the active chain took {:.3} s on the same batches",
        seconds("canary_seconds"),
        seconds("active_seconds")
    );
    for d in report
        .get("differences")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let _ = writeln!(
            out,
            "\ndifference {}: transaction {} (commit {}, chunk {}), {} different in {}",
            field(d, &["index"]),
            field(d, &["xid"]),
            field(d, &["commit_lsn"]),
            field(d, &["chunk"]),
            match d.get("changes_different").and_then(Value::as_u64) {
                Some(1) => "1 change".to_owned(),
                Some(n) => format!("{n} changes"),
                None => "? changes".to_owned(),
            },
            list(d.get("tables"))
        );
        for line in field(d, &["diff"]).lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    out
}

/// The indices of the differences in `report` (the body of the report's
/// answer) that can be recorded, and how many cannot (too large).
pub(crate) fn recordable(report: &str) -> Result<(Vec<String>, usize), String> {
    let report: Value =
        serde_json::from_str(report).map_err(|e| format!("the canary report is not JSON: {e}"))?;
    let differences = report
        .get("differences")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let (fit, too_large): (Vec<&Value>, Vec<&Value>) = differences
        .iter()
        .partition(|d| d.get("recordable").and_then(Value::as_bool) == Some(true));
    Ok((
        fit.iter().map(|d| field(d, &["index"])).collect(),
        too_large.len(),
    ))
}

/// Writes `fixtures` (each as the API gives a difference) into `dir` as
/// golden cases: `NAME.input.json` (the canary's input batch),
/// `NAME.expected.json` (its output) and `NAME.config.toml`; returns what
/// to print. `skipped` differences were too large to record.
pub(crate) fn write_fixtures(
    dir: &Path,
    fixtures: &[Value],
    skipped: usize,
) -> Result<String, String> {
    if fixtures.is_empty() {
        return Ok(format!(
            "no difference to record in {}{}\n",
            dir.display(),
            if skipped > 0 {
                format!(" ({skipped} too large: only their diffs were kept)")
            } else {
                String::new()
            }
        ));
    }
    let io = |path: &Path, e: std::io::Error| format!("cannot write {}: {e}", path.display());
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    for fixture in fixtures {
        let name: String = field(fixture, &["name"])
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = |suffix: &str| dir.join(format!("{name}{suffix}"));
        let json = |key: &str| fixture.get(key).map(to_pretty).unwrap_or_default();
        files.push((path(crate::golden::INPUT_SUFFIX), json("input")));
        files.push((path(crate::golden::EXPECTED_SUFFIX), json("expected")));
        files.push((
            path(crate::golden::CONFIG_SUFFIX),
            field(fixture, &["config"]),
        ));
    }
    // Check every name before writing any, so a refusal leaves nothing half done.
    if let Some((existing, _)) = files.iter().find(|(p, _)| p.exists()) {
        return Err(format!(
            "{} exists: record into another directory, or move it away",
            existing.display()
        ));
    }
    for (path, text) in &files {
        std::fs::write(path, text).map_err(|e| io(path, e))?;
    }
    Ok(format!(
        "\n{} difference{} recorded in {} (NAME.input.json, NAME.expected.json with the \
         canary's output, NAME.config.toml); check them with `datum test MODULE.wasm {}`\n",
        fixtures.len(),
        if fixtures.len() == 1 { "" } else { "s" },
        dir.display(),
        dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_canary_start_says_its_options_in_the_query() {
        let base = "/v1/pipelines/p/modules/m";
        assert_eq!(
            start_path(base, &CanaryStart::default()),
            "/v1/pipelines/p/modules/m/canary"
        );
        let all = CanaryStart {
            promote_after: Some(50),
            stop_on_difference: true,
            abort_on_failure: true,
            keep: Some(3),
        };
        assert_eq!(
            start_path(base, &all),
            "/v1/pipelines/p/modules/m/canary?promote_after=50&stop_on_difference=true&\
             abort_on_failure=true&keep=3"
        );
    }

    #[test]
    fn a_stopped_canary_reads_with_its_failure_and_counts() {
        let report = serde_json::json!({
            "module": "mask", "version": 4, "sha256": "0123456789abcdef", "active_version": 3,
            "state": "stopped", "reason": "failed (timeout) on transaction 9",
            "compared_after": "0/16B3F28", "effective_after": null,
            "batches": {"compared": 5, "equal": 4, "different": 1, "failed": 1,
                        "not_compared": 2, "active_failed": 0},
            "changes": {"compared": 9, "different": 1,
                        "different_by_table": {"public.users": 1}},
            "failures": {"timeout": 1},
            "failure": {"kind": "timeout", "module": "mask", "xid": 9,
                        "commit_lsn": "0/16B4000", "message": "ran past 1s\nmore"},
            "cpu": {"canary_seconds": 0.25, "active_seconds": 0.125},
        });
        assert_eq!(
            status_line(&report),
            "  canary    mask v4 beside v3, stopped: 5 batches compared, 1 different, 1 failed, \
             2 not compared (`datum admin canary` for the diffs)"
        );
        let text = render(&report);
        assert!(
            text.starts_with(
                "canary of mask version 4 (sha256 0123456789ab) beside version 3: stopped\n"
            ),
            "{text}"
        );
        for line in [
            "  why       failed (timeout) on transaction 9\n",
            "  from      the transaction after 0/16B3F28\n",
            "  batches   5 compared: 4 equal, 1 different; 1 failed in the canary; 2 not compared",
            "  failures  timeout 1\n",
            "  changes   9 compared, 1 different (public.users 1)\n",
            "  last      timeout in module `mask` on transaction 9 (commit 0/16B4000): ran past 1s\n",
            "  cpu       canary 0.250 s; the active chain took 0.125 s",
        ] {
            assert!(text.contains(line), "{line:?} in:\n{text}");
        }
    }
}
