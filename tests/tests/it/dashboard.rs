//! The dashboard in a real headless browser (Debian's Chromium through
//! chromedriver) against the real binary and a real server: the page asks
//! for the token and refuses to show or do anything without the right one;
//! with it, it shows a running pipeline's lag and a table copy in progress,
//! rolls a module back and replays a dead letter, uploads a canary,
//! promotes it, reads another's differences and aborts it, each through the
//! API.
//! Screenshots are kept in `target/test-artifacts/` (`dashboard.png`, and
//! `dashboard-canary.png` with a canary's differences open).

use datum_tests::browser::Browser;
use datum_tests::{cluster, connect, example_wasm, example_wasm_path, free_port, workspace_root};
use serde_json::json;

use crate::admin::{Admin, TOKEN};
use crate::run::{Host, temp_dir, toml_string};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_a_pipeline_and_acts_only_with_the_token() {
    let pg = cluster();
    let client = connect(&pg.conninfo("postgres")).await;
    client
        .batch_execute(
            "CREATE TABLE t (id int PRIMARY KEY, tag text); \
             CREATE TABLE big (id int PRIMARY KEY, v text); \
             INSERT INTO big SELECT g, 'row ' || g FROM generate_series(1, 1000000) g; \
             ANALYZE big",
        )
        .await
        .expect("tables");
    let dir = temp_dir("dashboard");
    let port = free_port();
    let config = format!(
        r#"
state = "state.redb"

[admin]
listen = "127.0.0.1:{port}"
token = "{TOKEN}"

[[pipeline]]
name = "p"
source.url = {url}
source.tables = ["public.t", "public.big"]
sink = {{ type = "file", path = "out.jsonl" }}
on_error = "dead_letter"
# Small chunks: the copy of `big` is still running when the page opens.
snapshot.chunk_size = 500

[[pipeline.transforms]]
module = {tagger}
config = {{ tag = "v0" }}
"#,
        url = toml_string(&pg.conninfo("postgres")),
        tagger = toml_string(example_wasm_path("tagger").to_str().expect("utf-8")),
    );
    let host = Host::start(&dir, &config);
    let admin = Admin::new(port);
    admin.wait_running(&host).await;
    let page = format!("http://127.0.0.1:{port}/");
    // The page needs no token, holds no data, and may load only its own
    // script and style.
    let response = reqwest::get(&page).await.expect("the page");
    assert_eq!(response.status(), 200);
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    assert!(header("content-type").starts_with("text/html"));
    assert!(
        header("content-security-policy").contains("script-src 'self'"),
        "{}",
        header("content-security-policy")
    );
    assert_eq!(header("x-frame-options"), "DENY");
    let browser = Browser::start().await;
    browser.goto(&page).await;

    // No token: the form, nothing else; the API refuses the page's calls.
    browser
        .wait_for(
            "the token form",
            "return !document.getElementById('login').hidden",
            20,
        )
        .await;
    let refused = browser
        .eval(
            "return fetch('/v1/pipelines/p/modules/tagger/rollback', {method: 'POST'}) \
               .then(r => r.status)",
            vec![],
        )
        .await;
    assert_eq!(refused, 401);
    // A wrong token: refused, and still nothing shown.
    browser
        .eval(
            "document.getElementById('token').value = arguments[0]; \
             document.getElementById('login').requestSubmit();",
            vec![json!("not-the-token")],
        )
        .await;
    let error = browser
        .wait_for(
            "the refusal",
            "const e = document.getElementById('error'); return !e.hidden && e.textContent",
            20,
        )
        .await;
    assert!(
        error
            .as_str()
            .unwrap_or_default()
            .contains("token is wrong"),
        "{error}"
    );
    let shown = browser
        .eval(
            "return document.querySelectorAll('[data-pipeline], button.rollback').length",
            vec![],
        )
        .await;
    assert_eq!(shown, 0, "nothing is shown without the right token");

    // The right token: the pipeline, its lag, and the copy in progress.
    browser
        .eval(
            "document.getElementById('token').value = arguments[0]; \
             document.getElementById('login').requestSubmit();",
            vec![json!(TOKEN)],
        )
        .await;
    let lag = browser
        .wait_for(
            "a running pipeline's lag",
            "const p = document.querySelector('[data-pipeline=\"p\"][data-state=\"running\"]'); \
             return p && p.querySelector('.lag-bytes b').textContent",
            30,
        )
        .await;
    assert!(lag.as_str().unwrap_or_default().ends_with('B'), "{lag}");
    let copying = browser
        .wait_for(
            "the copy of public.big in progress",
            "const r = document.querySelector('tr[data-table=\"public.big\"][data-state=\"copying\"]'); \
             return r && Number(r.querySelector('progress').value) > 0 && r.querySelector('.rows').textContent",
            30,
        )
        .await;
    assert!(!copying.as_str().unwrap_or_default().is_empty());
    let shot = workspace_root().join("target/test-artifacts/dashboard.png");
    browser.screenshot(&shot).await;
    let png = std::fs::read(&shot).expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");

    // A new module version that fails on id 3: that batch becomes a dead
    // letter. Then, from the page: roll back, and replay it.
    let path = "/v1/pipelines/p/modules/tagger/versions";
    let (status, body) = admin.upload(path, &example_wasm("panicker"), "").await;
    assert_eq!(status, 201, "{body}");
    let (second, _) = admin.active_version("tagger").await;
    assert_eq!(second, 2);
    client
        .batch_execute("INSERT INTO t VALUES (3, 'three')")
        .await
        .expect("insert");
    let letter = browser
        .wait_for(
            "the dead letter on the page",
            "const r = document.querySelector('tr[data-dead-letter]'); \
             return r && r.getAttribute('data-dead-letter')",
            30,
        )
        .await;
    let id = letter.as_str().unwrap_or_default().to_owned();
    // The failure is the pipeline's last error on the page.
    let last_error = browser
        .wait_for(
            "the last error",
            "const e = document.querySelector('[data-pipeline=\"p\"] > .last-error'); \
             return e && e.textContent",
            30,
        )
        .await;
    assert!(
        last_error
            .as_str()
            .unwrap_or_default()
            .contains("boom on id 3"),
        "{last_error}"
    );
    // A second failure of the same row, discarded from the page.
    client
        .batch_execute("UPDATE t SET tag = 'again' WHERE id = 3")
        .await
        .expect("update");
    let second = browser
        .wait_for(
            "a second dead letter",
            "const r = document.querySelectorAll('tr[data-dead-letter]'); \
             return r.length === 2 && r[1].getAttribute('data-dead-letter')",
            30,
        )
        .await;
    let second = second.as_str().unwrap_or_default().to_owned();
    browser
        .eval(
            "window.confirm = () => true; \
             document.querySelector(`tr[data-dead-letter=\"${arguments[0]}\"] button.discard`).click();",
            vec![json!(second)],
        )
        .await;
    browser
        .wait_for(
            "the discarded dead letter gone",
            "return document.querySelectorAll('tr[data-dead-letter]').length === 1",
            30,
        )
        .await;
    browser
        .eval(
            "document.querySelector('tr[data-dead-letter] button.show').click();",
            vec![],
        )
        .await;
    browser
        .wait_for(
            "the dead letter's batch and error",
            "const d = document.getElementById('detail');              return !d.hidden && d.textContent.includes('boom on id 3')                && d.textContent.includes('\"three\"')",
            30,
        )
        .await;
    browser
        .eval(
            "window.confirm = () => true; \
             document.querySelector('[data-pipeline=\"p\"] button.rollback[data-module=\"tagger\"]').click();",
            vec![],
        )
        .await;
    browser
        .wait_for(
            "the rolled back version on the page",
            "const v = document.querySelector('tr[data-module=\"tagger\"] .active-version'); \
             return v && v.textContent === '1'",
            30,
        )
        .await;
    assert_eq!(admin.active_version("tagger").await.0, 1);
    browser
        .eval(
            "document.querySelector(`tr[data-dead-letter=\"${arguments[0]}\"] button.replay`).click();",
            vec![json!(id)],
        )
        .await;
    browser
        .wait_for(
            "no dead letter left on the page",
            "return document.querySelector('.no-dead-letters') !== null",
            30,
        )
        .await;
    let (status, body) = admin.get("/v1/pipelines/p/dead-letters").await;
    assert_eq!(status, 200);
    assert_eq!(
        body["dead_letters"].as_array().map(Vec::len),
        Some(0),
        "{body}"
    );
    // The replayed row went through the rolled-back module into the sink.
    crate::run::wait_for_line(&dir.join("out.jsonl"), &host, |l| {
        l["new"]["id"] == 3 && l["new"]["tag"] == "v0"
    });

    // A canary uploaded from the page (the tagger again, keeping the active
    // configuration): it compares equal, and is promoted from the page.
    use base64::Engine as _;
    let tagger = base64::engine::general_purpose::STANDARD.encode(example_wasm("tagger"));
    browser
        .eval(
            "const bytes = Uint8Array.from(atob(arguments[0]), (c) => c.charCodeAt(0)); \
             const files = new DataTransfer(); \
             files.items.add(new File([bytes], 'tagger.wasm', { type: 'application/wasm' })); \
             const input = document.querySelector('input.canary-file[data-module=\"tagger\"]'); \
             input.files = files.files; \
             input.dispatchEvent(new Event('change'));",
            vec![json!(tagger)],
        )
        .await;
    // Rows written while the canary still compiles are not compared: write
    // them once it runs.
    browser
        .wait_for(
            "the canary running on the page",
            "return document.querySelector('[data-pipeline=\"p\"] .canary[data-state=\"running\"]') !== null",
            30,
        )
        .await;
    for i in 10..20 {
        client
            .batch_execute(&format!("INSERT INTO t VALUES ({i}, 'x')"))
            .await
            .expect("insert");
    }
    browser
        .wait_for(
            "the canary compared on the page, with no difference",
            "const c = document.querySelector('[data-pipeline=\"p\"] .canary[data-state=\"running\"]'); \
             return c && Number(c.querySelector('.canary-compared b').textContent) > 0 \
               && c.querySelector('.canary-different b').textContent === '0'",
            30,
        )
        .await;
    browser
        .eval(
            "window.confirm = () => true; \
             document.querySelector('[data-pipeline=\"p\"] .canary button.promote').click();",
            vec![],
        )
        .await;
    browser
        .wait_for(
            "the promoted canary on the page",
            "const c = document.querySelector('[data-pipeline=\"p\"] .canary'); \
             const v = document.querySelector('tr[data-module=\"tagger\"] .active-version'); \
             return c && c.dataset.state === 'promoted' && v && v.textContent === '3'",
            30,
        )
        .await;
    assert_eq!(admin.active_version("tagger").await.0, 3);

    // A canary that tags differently, started over the API: its
    // differences read on the page, then it is aborted from the page.
    let (status, body) = admin
        .upload(
            "/v1/pipelines/p/modules/tagger/canary",
            &example_wasm("tagger"),
            "tag = \"v9\"",
        )
        .await;
    assert_eq!(status, 201, "{body}");
    client
        .batch_execute("INSERT INTO t VALUES (30, 'y')")
        .await
        .expect("insert");
    browser
        .wait_for(
            "the differing canary on the page",
            "const c = document.querySelector('[data-pipeline=\"p\"] .canary[data-state=\"running\"]'); \
             return c && Number(c.querySelector('.canary-different b').textContent) > 0",
            30,
        )
        .await;
    browser
        .eval(
            "document.querySelector('[data-pipeline=\"p\"] .canary button.differences').click();",
            vec![],
        )
        .await;
    browser
        .wait_for(
            "the canary's diff",
            "const d = document.getElementById('detail'); \
             return !d.hidden && d.textContent.includes('+++ canary (version 4)') \
               && d.textContent.includes('\"v9\"')",
            30,
        )
        .await;
    browser
        .screenshot(&workspace_root().join("target/test-artifacts/dashboard-canary.png"))
        .await;
    browser
        .eval(
            "document.querySelector('[data-pipeline=\"p\"] .canary button.abort').click();",
            vec![],
        )
        .await;
    browser
        .wait_for(
            "the aborted canary",
            "const c = document.querySelector('[data-pipeline=\"p\"] .canary'); \
             return c && c.dataset.state === 'aborted'",
            30,
        )
        .await;
    assert_eq!(admin.active_version("tagger").await.0, 3);
    browser.close().await;
    let _ = std::fs::remove_dir_all(&dir);
}
