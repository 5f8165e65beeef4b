//! The harness's TLS clusters: a server that speaks TLS with a certificate
//! clients can verify, and logins that it refuses without TLS. Checked with
//! `psql` (libpq), so the harness is proven against the reference client
//! rather than against Datum's own TLS code.

use std::process::Command;

use datum_tests::{Cluster, PasswordAuth};

const IS_ENCRYPTED: &str = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";

fn ssl_cluster() -> Cluster {
    Cluster::builder()
        .ssl(true)
        .start()
        .unwrap_or_else(|err| panic!("starting a throwaway PostgreSQL with TLS: {err}"))
}

/// Runs `sql` with psql connected by `conninfo`: its output, or what it
/// printed on failure. The caller's `PG*` variables are not passed on.
fn psql(pg: &Cluster, conninfo: &str, password: Option<&str>, sql: &str) -> Result<String, String> {
    let tool = pg.binaries().tool("psql");
    let mut cmd = Command::new(if tool.is_file() { tool } else { "psql".into() });
    cmd.args([
        "-X",
        "-A",
        "-t",
        "-v",
        "ON_ERROR_STOP=1",
        "-c",
        sql,
        "-d",
        conninfo,
    ])
    .env_clear()
    .env("PATH", std::env::var_os("PATH").unwrap_or_default());
    if let Some(password) = password {
        cmd.env("PGPASSWORD", password);
    }
    let out = cmd.output().expect("running psql");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[test]
fn ssl_cluster_is_verifiable_and_ssl_logins_need_tls() {
    let pg = ssl_cluster();
    let ca = pg.ca_cert().expect("an SSL cluster has a CA");
    assert!(ca.is_file(), "{} is missing", ca.display());
    let tls = |host: &str, user: &str| {
        format!(
            "host={host} port={} user={user} dbname=postgres sslmode=verify-full sslrootcert={}",
            pg.port(),
            ca.display()
        )
    };

    // verify-full: the certificate names the host and the address.
    for host in ["localhost", "127.0.0.1"] {
        let encrypted = psql(&pg, &tls(host, "postgres"), None, IS_ENCRYPTED);
        assert_eq!(encrypted.as_deref(), Ok("t"), "verify-full via {host}");
    }
    let ready_made = pg.ssl_conninfo("postgres").expect("ssl_conninfo");
    assert_eq!(
        psql(&pg, &ready_made, None, IS_ENCRYPTED).as_deref(),
        Ok("t")
    );
    // Ordinary logins may still connect without TLS.
    let plain = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=disable",
        pg.port()
    );
    assert_eq!(psql(&pg, &plain, None, IS_ENCRYPTED).as_deref(), Ok("f"));

    pg.create_login("sally", "s3cret", PasswordAuth::ScramSsl, "")
        .expect("creating an ssl-only login");
    let encrypted = psql(
        &pg,
        &tls("localhost", "sally"),
        Some("s3cret"),
        IS_ENCRYPTED,
    );
    assert_eq!(encrypted.as_deref(), Ok("t"), "sally over TLS");
    let wrong = psql(&pg, &tls("localhost", "sally"), Some("nope"), IS_ENCRYPTED).unwrap_err();
    assert!(wrong.contains("password authentication failed"), "{wrong}");

    let refused = [
        (
            "TCP without TLS",
            format!(
                "host=127.0.0.1 port={} user=sally dbname=postgres sslmode=disable",
                pg.port()
            ),
        ),
        (
            "the unix socket",
            format!(
                "host={} port={} user=sally dbname=postgres",
                pg.socket_dir().display(),
                pg.port()
            ),
        ),
    ];
    for (how, conninfo) in refused {
        let err = psql(&pg, &conninfo, Some("s3cret"), IS_ENCRYPTED)
            .expect_err(&format!("sally must not get in over {how}"));
        assert!(
            err.contains("pg_hba.conf rejects connection"),
            "{how}: {err}"
        );
    }
}

#[test]
fn cluster_without_ssl_has_no_ca_and_no_tls() {
    let pg =
        Cluster::start().unwrap_or_else(|err| panic!("starting a throwaway PostgreSQL: {err}"));
    assert_eq!(pg.ca_cert(), None);
    assert_eq!(pg.ssl_conninfo("postgres"), None);
    let require = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=require",
        pg.port()
    );
    let err = psql(&pg, &require, None, IS_ENCRYPTED).unwrap_err();
    assert!(err.contains("server does not support SSL"), "{err}");
}
