//! `/v1/openapi.json`: the admin API described as an OpenAPI 3.0 document,
//! built from [`ROUTES`] — the same table the tests hold the router to, so
//! the document cannot forget a route.

use serde_json::{Map, Value as Json, json};

/// A route: method, path (OpenAPI template syntax), summary, whether it
/// needs the token, the success status, and what it takes.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// `get`, `post`, `delete`.
    pub method: &'static str,
    /// The path, `{name}` for parameters.
    pub path: &'static str,
    /// What it does.
    pub summary: &'static str,
    /// Whether `Authorization: Bearer` is required.
    pub auth: bool,
    /// The status of a success.
    pub status: u16,
    /// The request body, if any.
    pub body: Body,
}

/// A route's request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// None.
    None,
    /// A module upload: wasm bytes or multipart.
    Upload,
    /// A module upload that starts a canary.
    Canary,
    /// Optional JSON `{"version": N}`.
    Rollback,
    /// JSON `{"tables": [...], "from": [...]}`.
    Backfill,
}

const fn route(
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    auth: bool,
    status: u16,
    body: Body,
) -> Route {
    Route {
        method,
        path,
        summary,
        auth,
        status,
        body,
    }
}

/// Every route the admin API serves.
pub const ROUTES: &[Route] = &[
    route("get", "/v1/health", "Liveness", false, 200, Body::None),
    route(
        "get",
        "/v1/ready",
        "Readiness: every pipeline running or paused (503 otherwise)",
        false,
        200,
        Body::None,
    ),
    route(
        "get",
        "/v1/openapi.json",
        "This document",
        false,
        200,
        Body::None,
    ),
    route(
        "get",
        "/metrics",
        "Prometheus metrics (text format 0.0.4)",
        true,
        200,
        Body::None,
    ),
    route(
        "get",
        "/v1/pipelines",
        "Every pipeline's status",
        true,
        200,
        Body::None,
    ),
    route(
        "get",
        "/v1/pipelines/{pipeline}",
        "A pipeline's status",
        true,
        200,
        Body::None,
    ),
    route(
        "post",
        "/v1/pipelines/{pipeline}/pause",
        "Pause: drain, checkpoint, disconnect; answers once paused",
        true,
        200,
        Body::None,
    ),
    route(
        "post",
        "/v1/pipelines/{pipeline}/resume",
        "Resume from the checkpoint; answers once streaming",
        true,
        200,
        Body::None,
    ),
    route(
        "post",
        "/v1/pipelines/{pipeline}/backfill",
        "Copy tables' existing rows on the running pipeline: new tables (published first when Datum manages the publication), or again, optionally from a key on",
        true,
        202,
        Body::Backfill,
    ),
    route(
        "get",
        "/v1/pipelines/{pipeline}/modules",
        "Every transform's versions and activations",
        true,
        200,
        Body::None,
    ),
    route(
        "get",
        "/v1/pipelines/{pipeline}/modules/{module}",
        "One transform's versions and activations",
        true,
        200,
        Body::None,
    ),
    route(
        "post",
        "/v1/pipelines/{pipeline}/modules/{module}/versions",
        "Upload a version: compile, check, run fixtures, store, activate at the next transaction boundary",
        true,
        201,
        Body::Upload,
    ),
    route(
        "post",
        "/v1/pipelines/{pipeline}/modules/{module}/rollback",
        "Re-activate the previous or a named version",
        true,
        200,
        Body::Rollback,
    ),
    route(
        "post",
        "/v1/pipelines/{pipeline}/modules/{module}/canary",
        "Upload a version as a canary: compile, check, run fixtures, store, then run it beside the active version on every live batch and compare (its output is discarded)",
        true,
        201,
        Body::Canary,
    ),
    route(
        "get",
        "/v1/pipelines/{pipeline}/canary",
        "The canary's report: batches compared, equal and different, failures, CPU time, the first differences as diffs",
        true,
        200,
        Body::None,
    ),
    route(
        "get",
        "/v1/pipelines/{pipeline}/canary/differences/{index}",
        "A kept difference as a fixture: the canary's input batch, its output, its configuration",
        true,
        200,
        Body::None,
    ),
    route(
        "post",
        "/v1/pipelines/{pipeline}/canary/promote",
        "Make the running canary the active version at the next transaction boundary",
        true,
        200,
        Body::None,
    ),
    route(
        "post",
        "/v1/pipelines/{pipeline}/canary/abort",
        "Stop the running canary; the active version stays",
        true,
        200,
        Body::None,
    ),
    route(
        "get",
        "/v1/pipelines/{pipeline}/dead-letters",
        "List dead letters",
        true,
        200,
        Body::None,
    ),
    route(
        "get",
        "/v1/pipelines/{pipeline}/dead-letters/{id}",
        "A dead letter with its batch",
        true,
        200,
        Body::None,
    ),
    route(
        "delete",
        "/v1/pipelines/{pipeline}/dead-letters/{id}",
        "Discard a dead letter",
        true,
        200,
        Body::None,
    ),
    route(
        "post",
        "/v1/pipelines/{pipeline}/dead-letters/{id}/replay",
        "Replay a dead letter through the current modules into the sink",
        true,
        200,
        Body::None,
    ),
];

fn error_response(description: &str) -> Json {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    })
}

fn parameters(path: &str) -> Vec<Json> {
    path.split('/')
        .filter_map(|part| part.strip_prefix('{').and_then(|p| p.strip_suffix('}')))
        .map(|name| {
            let schema = if name == "id" {
                json!({"type": "integer", "format": "int64", "minimum": 1})
            } else if name == "index" {
                json!({"type": "integer", "minimum": 0})
            } else {
                json!({"type": "string"})
            };
            json!({"name": name, "in": "path", "required": true, "schema": schema})
        })
        .collect()
}

fn operation(r: &Route) -> Json {
    let mut responses = Map::new();
    let success = if r.path == "/metrics" {
        json!({"description": "Prometheus text", "content": {"text/plain": {"schema": {"type": "string"}}}})
    } else {
        json!({"description": "Success", "content": {"application/json": {"schema": {"type": "object"}}}})
    };
    responses.insert(r.status.to_string(), success);
    if r.auth {
        responses.insert("401".into(), error_response("Missing or wrong token"));
    }
    if r.path.contains('{') {
        responses.insert(
            "404".into(),
            error_response("No such pipeline, transform, version or dead letter"),
        );
    }
    match r.body {
        Body::Upload | Body::Canary => {
            if r.body == Body::Upload {
                responses.insert("200".into(), json!({"description": "dry_run: the module would be accepted", "content": {"application/json": {"schema": {"type": "object"}}}}));
            } else {
                responses.insert(
                    "400".into(),
                    error_response(
                        "A query parameter that is not a whole number above 0, or keep over 100",
                    ),
                );
                responses.insert("409".into(), error_response("A canary runs already"));
            }
            responses.insert(
                "413".into(),
                error_response("Body larger than admin.max_upload"),
            );
            responses.insert("415".into(), error_response("Neither wasm nor multipart"));
            responses.insert(
                "422".into(),
                error_response("invalid_module or fixtures_failed"),
            );
        }
        Body::Rollback => {
            responses.insert(
                "422".into(),
                error_response("The stored version no longer loads"),
            );
        }
        Body::Backfill => {
            responses.insert(
                "400".into(),
                error_response(
                    "No such table, no key to copy along, or a `from` that does not fit the key",
                ),
            );
            responses.insert(
                "409".into(),
                error_response("The table is being copied already, is not published, or the pipeline is not running"),
            );
            responses.insert("503".into(), error_response("The source cannot be reached"));
        }
        Body::None => {}
    }
    if r.path.ends_with("/replay") {
        responses.insert("409".into(), error_response("The pipeline is paused"));
        responses.insert(
            "422".into(),
            error_response("The modules failed on it again"),
        );
        responses.insert("502".into(), error_response("The sink refused it"));
    }
    if r.path.ends_with("/canary/promote") || r.path.ends_with("/canary/abort") {
        responses.insert("409".into(), error_response("No canary is running"));
    }
    if r.path.ends_with("/resume") {
        responses.insert("409".into(), error_response("The pipeline failed"));
    }
    if r.path == "/v1/ready" {
        responses.insert("503".into(), json!({"description": "Not every pipeline is running or paused", "content": {"application/json": {"schema": {"type": "object"}}}}));
    }
    responses.insert("default".into(), error_response("Any other error"));
    let mut op = json!({
        "summary": r.summary,
        "operationId": operation_id(r),
        "parameters": parameters(r.path),
        "responses": responses,
    });
    if !r.auth {
        op["security"] = json!([]);
    }
    if r.body == Body::Upload || r.body == Body::Canary {
        let query = if r.body == Body::Upload {
            vec![
                json!({"name": "dry_run", "in": "query", "required": false, "schema": {"type": "boolean"}}),
            ]
        } else {
            vec![
                json!({"name": "promote_after", "in": "query", "required": false, "description": "promote after this many batches compared with no difference and no failure", "schema": {"type": "integer", "minimum": 1}}),
                json!({"name": "stop_on_difference", "in": "query", "required": false, "description": "stop at the first difference", "schema": {"type": "boolean"}}),
                json!({"name": "abort_on_failure", "in": "query", "required": false, "description": "stop at the first failure of any kind (a trap, a timeout, memory or fuel always stops it)", "schema": {"type": "boolean"}}),
                json!({"name": "keep", "in": "query", "required": false, "description": "differences kept with their diff and fixture (default 10)", "schema": {"type": "integer", "minimum": 1, "maximum": 100}}),
            ]
        };
        if let Some(parameters) = op["parameters"].as_array_mut() {
            parameters.extend(query);
        }
        op["requestBody"] = json!({
            "required": true,
            "content": {
                "application/wasm": {"schema": {"type": "string", "format": "binary"}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                "multipart/form-data": {"schema": {
                    "type": "object",
                    "required": ["module"],
                    "properties": {
                        "module": {"type": "string", "format": "binary"},
                        "config": {"type": "string", "description": "the module's configuration, TOML"},
                        "fixture": {"type": "array", "items": {"type": "string", "format": "binary"},
                                    "description": "golden fixtures, by file name: NAME.input.json, NAME.expected.json, NAME.config.toml, config.toml"}
                    }
                }}
            }
        });
    }
    if r.body == Body::Backfill {
        op["requestBody"] = json!({
            "required": true,
            "content": {"application/json": {"schema": {
                "type": "object",
                "required": ["tables"],
                "properties": {
                    "tables": {"type": "array", "items": {"type": "string"}, "description": "schema.table, or a table in public"},
                    "from": {"type": "array", "items": {"type": "string"}, "description": "copy from after this key (one text value per key column); one table only"}
                }
            }}}
        });
    }
    if r.body == Body::Rollback {
        op["requestBody"] = json!({
            "required": false,
            "content": {"application/json": {"schema": {
                "type": "object",
                "properties": {"version": {"type": "integer", "format": "int64", "minimum": 1}}
            }}}
        });
    }
    op
}

fn operation_id(r: &Route) -> String {
    let mut id = r.method.to_owned();
    for part in r.path.split('/').filter(|p| !p.is_empty() && *p != "v1") {
        let part = part.trim_matches(|c| c == '{' || c == '}');
        id.push('_');
        id.push_str(&part.replace(['-', '.'], "_"));
    }
    id
}

/// The document.
pub(crate) fn document() -> Json {
    let mut paths = Map::new();
    for r in ROUTES {
        let item = paths.entry(r.path.to_owned()).or_insert_with(|| json!({}));
        item[r.method] = operation(r);
    }
    json!({
        "openapi": "3.0.3",
        "info": {
            "title": "Datum admin API",
            "version": "1",
            "description": "Manage a running datum host: status, metrics, pause and resume, hot swap of modules, dead letters. See docs/admin.md."
        },
        "servers": [{"url": "http://127.0.0.1:7070"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {"error": {
                        "type": "object",
                        "required": ["code", "message"],
                        "properties": {
                            "code": {"type": "string"},
                            "message": {"type": "string"}
                        }
                    }}
                }
            }
        }
    })
}
