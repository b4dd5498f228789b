//! `GET /v1/healthz` (the process answers) and `GET /v1/readyz` (the services it needs answer:
//! [`loom_ia::Loom::readiness`]), without a key, for load balancers and orchestrators; the same
//! handlers answer `<base_path>/health` and `<base_path>/ready` beside `/v1` (`lib.rs`,
//! `front`).

use axum::{
    Json,
    extract::State,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde::Serialize;
use utoipa::ToSchema;

use crate::AppState;

/// The process is up.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    /// Always `ok`.
    status: &'static str,
}

/// Whether the services the server needs answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Ready {
    /// `ready`, or `unready` when a check failed.
    status: &'static str,
    /// Each service checked (`journal`, `queue`, `bus`, `limits`), in order.
    checks: Vec<ReadyCheck>,
}

/// One service checked.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ReadyCheck {
    /// The service.
    name: String,
    /// Whether it answered.
    ok: bool,
}

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    operation_id = "health",
    summary = "Whether the server process answers",
    description = "Liveness: `200` as long as the process serves requests. No key needed.",
    responses((status = 200, description = "The process answers.", body = Health)),
    security(()),
)]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    operation_id = "readiness",
    summary = "Whether the services the server needs answer",
    description = "Readiness: the journal, and the job queue, the event bus and the shared \
limits when the configuration declares them. `503` names the service that does not answer (its \
cause is in the server's log). No key needed.",
    responses(
        (status = 200, description = "Every service answers.", body = Ready),
        (status = 503, description = "A service does not answer.", body = Ready),
    ),
    security(()),
)]
pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
    let readiness = state.loom.readiness().await;
    let body = Ready {
        status: if readiness.ready { "ready" } else { "unready" },
        checks: readiness
            .checks
            .into_iter()
            .map(|c| ReadyCheck {
                name: c.name,
                ok: c.ok,
            })
            .collect(),
    };
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}
