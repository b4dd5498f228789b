//! `GET /runs/{run_id}/events`: a run's events as Server-Sent Events, built on
//! [`loom_ia::Loom::follow`].
//!
//! Each event is sent with `id:` its seq, `event:` its type and `data:` its JSON. Events
//! already written with `seq > after_seq` come first (the `Last-Event-ID` header, when
//! present, wins over `after_seq`), then the new ones; the stream ends after the run's
//! terminal event. A keep-alive comment is sent every [`crate::KEEP_ALIVE`]. An error while
//! following is sent as an `error` event (`{"error": {kind, message}}`) and ends the stream;
//! so does the server's shutdown.

use std::convert::Infallible;

use axum::{
    extract::{Path, Query, State, rejection::QueryRejection},
    http::{HeaderMap, StatusCode},
    response::{
        IntoResponse, Response,
        sse::{Event as SseEvent, KeepAlive, Sse},
    },
};
use futures_util::StreamExt;
use loom_ia::Event;
use serde::Deserialize;

use loom_ia::config::Scope;

use crate::{AppState, KEEP_ALIVE, auth::Caller, error::ApiError, routes::lease_seconds};

/// The query of the events route.
#[derive(Debug, Deserialize)]
pub(crate) struct EventsQuery {
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    after_seq: Option<u64>,
}

/// The resume point a `Last-Event-ID` header gives: 1 to 18 digits.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_header",
            "Last-Event-ID must be an event seq (1 to 18 digits)",
        )
    };
    let text = value.to_str().map_err(|_| invalid())?.trim();
    if text.is_empty() || text.len() > 18 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    text.parse().map(Some).map_err(|_| invalid())
}

fn sse_event(event: &Event) -> SseEvent {
    let data = serde_json::to_string(event).unwrap_or_else(|error| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "engine",
            format!("event {} could not be serialized: {error}", event.seq),
        )
        .body()
        .to_string()
    });
    SseEvent::default()
        .id(event.seq.to_string())
        .event(event.event_type.as_str())
        .data(data)
}

fn error_event(error: &ApiError) -> SseEvent {
    SseEvent::default()
        .event("error")
        .data(error.body().to_string())
}

pub(crate) async fn events(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    query: Result<Query<EventsQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let Query(query) = query?;
    let after = last_event_id(&headers)?.or(query.after_seq).unwrap_or(0);
    let loom = state.loom.clone();
    let run = caller
        .run(&state, &run_id, query.session_id.as_deref())
        .await?;
    let lease = lease_seconds(&loom);
    let stream = loom
        .follow(&run, after)
        .map(move |item| {
            Ok::<_, Infallible>(match item {
                Ok(event) => sse_event(&event),
                Err(error) => error_event(&ApiError::from_loom(&error, lease)),
            })
        })
        .take_until(AppState::closed(state.closing.clone()));
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}
