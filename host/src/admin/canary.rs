//! The canary routes (`docs/canary.md`): start a canary of an uploaded
//! version, read its report and its differences as fixtures, promote it or
//! abort it. The runs themselves are `daemon/canary.rs`.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, Request, State};
use axum::http::StatusCode;
use axum::response::Response;

use super::{
    ApiError, App, boolean, check_announced_length, find_slot, ok, query_pairs, read_upload, reply,
    vet,
};
use crate::daemon::canary::{self, KEEP_DEFAULT, KEEP_MAX, Options};
use crate::daemon::hotswap;

/// `promote_after=N`, `stop_on_difference=true`, `abort_on_failure=true`,
/// `keep=N`.
fn options(query: Option<&str>) -> Result<Options, ApiError> {
    let mut options = Options::default();
    let count = |name: &str, value: &str| {
        value.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
            ApiError::bad_request(format!("{name}={value}: use a whole number above 0"))
        })
    };
    let known = [
        "promote_after",
        "stop_on_difference",
        "abort_on_failure",
        "keep",
    ];
    for (key, value) in query_pairs(query, &known)? {
        match key {
            "promote_after" => options.promote_after = Some(count(key, value)?),
            "stop_on_difference" => options.stop_on_difference = boolean(key, value)?,
            "abort_on_failure" => options.abort_on_failure = boolean(key, value)?,
            _ => {
                let keep = count(key, value)?;
                if keep > KEEP_MAX as u64 {
                    return Err(ApiError::bad_request(format!(
                        "keep={keep}: a canary keeps at most {KEEP_MAX} differences \
                         (default {KEEP_DEFAULT})"
                    )));
                }
                options.keep = keep as usize;
            }
        }
    }
    Ok(options)
}

/// `POST /v1/pipelines/{pipeline}/modules/{module}/canary`: the body is an
/// upload, as for a new version.
pub(super) async fn start(
    State(app): State<Arc<App>>,
    Path((pipeline, module)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Result<Response, ApiError> {
    check_announced_length(&app, request.headers())?;
    let options = options(query.as_deref())?;
    let control = app.pipeline(&pipeline)?.clone();
    let slot = find_slot(&control, &pipeline, &module)?;
    if let Some(busy) = control.canary.busy() {
        return Err(ApiError::new(StatusCode::CONFLICT, "conflict", busy));
    }
    let upload = read_upload(&app, request).await?;
    let store = app.host.store.clone();
    let engine = app.host.engine.clone();
    // In a task of its own, like a swap: a request that times out leaves no
    // canary half started.
    let work = tokio::spawn(async move {
        let key = slot.key.clone();
        let hotswap::Candidate {
            wasm,
            config,
            module: compiled,
            fixtures,
        } = vet(engine, slot, upload).await?;
        let version =
            hotswap::store_version(&store, &key, wasm, &config, "canary", fixtures).await?;
        let candidate = canary::Candidate {
            transform: module,
            version,
            module: compiled,
            config,
            fixtures,
        };
        let report = canary::start(
            &store,
            &control.chain,
            &control.canary,
            &pipeline,
            candidate,
            options,
        )?;
        Ok(reply(StatusCode::CREATED, &report))
    });
    work.await.map_err(|e| ApiError::internal(e.to_string()))?
}

/// `GET /v1/pipelines/{pipeline}/canary`: the report, with the differences
/// kept.
pub(super) async fn show(
    State(app): State<Arc<App>>,
    Path(pipeline): Path<String>,
) -> Result<Response, ApiError> {
    let control = app.pipeline(&pipeline)?;
    let report = control.canary.report(true).ok_or_else(|| {
        ApiError::not_found(format!(
            "pipeline `{pipeline}` has run no canary since the host started: start one with \
             `datum admin swap --canary`"
        ))
    })?;
    ok(report)
}

/// `GET /v1/pipelines/{pipeline}/canary/differences/{index}`: a kept
/// difference as a fixture (input, the canary's output, configuration).
pub(super) async fn difference(
    State(app): State<Arc<App>>,
    Path((pipeline, index)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let control = app.pipeline(&pipeline)?;
    let index: usize = index
        .parse()
        .map_err(|_| ApiError::bad_request(format!("`{index}` is not a difference's index")))?;
    ok(control.canary.fixture(index)?)
}

/// `POST /v1/pipelines/{pipeline}/canary/promote`.
pub(super) async fn promote(
    State(app): State<Arc<App>>,
    Path(pipeline): Path<String>,
) -> Result<Response, ApiError> {
    let control = app.pipeline(&pipeline)?.clone();
    let store = app.host.store.clone();
    let work = tokio::spawn(async move {
        canary::promote(
            &store,
            &control.chain,
            &control.canary,
            &pipeline,
            "promoted over the admin API",
        )
        .await
    });
    let swapped: hotswap::Swapped = work
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    ok(serde_json::to_value(&swapped).unwrap_or_default())
}

/// `POST /v1/pipelines/{pipeline}/canary/abort`.
pub(super) async fn abort(
    State(app): State<Arc<App>>,
    Path(pipeline): Path<String>,
) -> Result<Response, ApiError> {
    let control = app.pipeline(&pipeline)?;
    ok(control.canary.abort()?)
}
