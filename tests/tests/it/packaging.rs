//! What an operator installs: the systemd unit in `packaging/` passes
//! `systemd-analyze verify` (where systemd's tools are installed), runs the
//! `datum run` the docs describe, and keeps its sandboxing; the licence the
//! manifests name is in the repository.

use std::process::Command;

use datum_tests::{datum_bin, workspace_root};

#[test]
fn the_systemd_unit_verifies_and_keeps_its_sandbox() {
    let unit = std::fs::read_to_string(workspace_root().join("packaging/datum.service"))
        .expect("packaging/datum.service");
    for directive in [
        "ExecStart=/usr/local/bin/datum run /etc/datum/datum.toml",
        "DynamicUser=yes",
        "StateDirectory=datum",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=\n",
        "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
        "SystemCallFilter=@system-service",
    ] {
        assert!(unit.contains(directive), "{directive} in the unit");
    }
    // The JIT needs writable-then-executable memory: the unit must not deny it.
    assert!(
        !unit
            .lines()
            .any(|l| l.trim_start().starts_with("MemoryDenyWriteExecute")),
        "MemoryDenyWriteExecute breaks module compilation"
    );
    // The command it runs exists: `datum run --help` answers.
    let help = Command::new(datum_bin())
        .args(["run", "--help"])
        .output()
        .expect("datum run --help");
    assert!(help.status.success());

    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze is not installed: the unit's syntax is not verified here");
        return;
    };
    assert!(version.status.success());
    // verify checks that ExecStart's binary exists: point it at this build.
    let dir = std::env::temp_dir().join(format!("datum-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("datum.service");
    std::fs::write(
        &path,
        unit.replace(
            "/usr/local/bin/datum",
            datum_bin().to_str().expect("utf-8 path"),
        ),
    )
    .expect("unit copy");
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze verify");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(verify.status.success(), "systemd-analyze verify: {said}");
    assert!(
        !said.contains("Unknown key") && !said.contains("Failed to parse"),
        "{said}"
    );
}

#[test]
fn the_licence_the_manifests_name_is_in_the_repository() {
    let manifest =
        std::fs::read_to_string(workspace_root().join("Cargo.toml")).expect("Cargo.toml");
    assert!(manifest.contains(r#"license = "Apache-2.0""#));
    let licence = std::fs::read_to_string(workspace_root().join("LICENSE")).expect("LICENSE");
    assert!(licence.contains("Apache License") && licence.contains("Version 2.0, January 2004"));
}
