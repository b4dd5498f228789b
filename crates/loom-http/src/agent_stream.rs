//! `POST <base_path>/agents/{name}/stream`: a run of the agent as Server-Sent Events, built on
//! [`loom_ia::Loom::stream`] (the engine's observer: journaled events and the model's text
//! deltas as they are written).
//!
//! Exactly five event names, on the `event:` line (never inside the data, which is JSON):
//!
//! | event | data |
//! |---|---|
//! | `text_delta` | `{"run_id", "text"}`: text the model streams, before its answer is journaled |
//! | `tool_call` | `{"run_id", "call_id", "tool_name", "arguments"}` (`tool.called`) |
//! | `tool_result` | `{"run_id", "call_id", "tool_name", "is_error", "model_view", "full", "artifacts"}` (`tool.completed`): `model_view` is the text the model read, `full` the tool's full payload for interfaces (its second view; else its structured data; else `null`), which the model never saw |
//! | `final` | the run's result (`RunResult`, as `POST /v1/agents/{name}/runs` answers it): the run completed, paused for an approval, or was cancelled |
//! | `error` | `{"error": {"kind", "message"}, …}`: the run failed (`kind: run_failed`, with `run_id`, `session_id` and the `result`), or could not be opened or driven (the kinds of the API's errors) |
//!
//! Exactly one terminal frame, `final` or `error`, ends every stream (also when the run's task
//! ends abnormally). An idle stream sends a heartbeat comment (`: heartbeat`) every
//! `expose.http.heartbeat_ms` (default 15 s). Events of sub-runs come too, with their own
//! `run_id`. With a job queue (`storage.queue: rabbitmq`) a worker drives the run and this
//! process follows its journal: the stream then has the tool events and the terminal frame but
//! no `text_delta` (the deltas stay in the worker). A client that goes away does not stop the run: it goes on and closes in its
//! journal. When the server shuts down the run stops at a safe point and the stream ends with
//! an `error` frame `interrupted` (the run resumes at the next start).

use std::{convert::Infallible, time::Duration};

use axum::{
    body::Bytes,
    extract::{Path, State, rejection::BytesRejection},
    http::HeaderMap,
    response::{
        IntoResponse, Response,
        sse::{Event as SseEvent, KeepAlive, Sse},
    },
};
use futures_util::StreamExt;
use loom_ia::{
    Event, LoomError, Redact, RunResult, RunStatus, StreamItem, config::Scope, core::Payload,
};
use serde_json::{Value, json};

use crate::{
    AppState,
    agent_http::{caller, exposed, request},
    error::{ApiError, ErrorKind},
    routes::lease_seconds,
};

/// `POST <base_path>/agents/{name}/stream`.
pub(crate) async fn stream(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let http = exposed(&state.loom, &name)?;
    let caller = caller(
        &state,
        &name,
        &http,
        &headers,
        &[Scope::Run, Scope::ReadContent],
    )
    .await?;
    let mut request = request(body)?;
    let options = request.options(&caller);
    let lease = lease_seconds(&state.loom);
    let items = state.loom.stream(&name, request.message, options);
    // `ended`: the terminal frame was sent, nothing follows it.
    let frames =
        futures_util::stream::unfold((items, false), move |(mut items, ended)| async move {
            if ended {
                return None;
            }
            loop {
                let Some(item) = items.next().await else {
                    // The run's task ended without a result: still one terminal frame.
                    let error =
                        ApiError::new(ErrorKind::Engine, "the run's task ended without a result");
                    return Some((
                        Ok::<_, Infallible>(error_frame(&error.body())),
                        (items, true),
                    ));
                };
                match item {
                    Ok(StreamItem::TextDelta { run_id, text }) => {
                        let frame = frame("text_delta", &json!({"run_id": run_id, "text": text}));
                        return Some((Ok(frame), (items, false)));
                    }
                    Ok(StreamItem::Event(event)) => {
                        if let Some(frame) = event_frame(&event) {
                            return Some((Ok(frame), (items, false)));
                        }
                    }
                    Ok(StreamItem::Finished(result)) => {
                        return Some((Ok(terminal_frame(&result)), (items, true)));
                    }
                    Err(error) => {
                        let frame = error_frame(&loom_error_body(&error, lease));
                        return Some((Ok(frame), (items, true)));
                    }
                }
            }
        });
    let heartbeat = Duration::from_millis(http.heartbeat_ms());
    Ok(Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(heartbeat).text("heartbeat"))
        .into_response())
}

/// A frame named `event` with `data` as its JSON.
fn frame(event: &str, data: &Value) -> SseEvent {
    SseEvent::default().event(event).data(data.to_string())
}

/// The `error` frame of an error body.
fn error_frame(body: &Value) -> SseEvent {
    frame("error", body)
}

/// The error body of a run that could not be opened or driven (with its run when the server
/// interrupted it).
fn loom_error_body(error: &LoomError, lease: u64) -> Value {
    ApiError::from_loom(error, lease).body()
}

/// The `tool_call` or `tool_result` frame of a journaled event; `None` for the other events.
fn event_frame(event: &Event) -> Option<SseEvent> {
    match &event.payload {
        Payload::ToolCalled(called) => Some(frame(
            "tool_call",
            &json!({
                "run_id": event.run_id,
                "call_id": called.call_id,
                "tool_name": called.tool_name,
                "arguments": called.arguments,
            }),
        )),
        Payload::ToolCompleted(completed) => {
            let output = &completed.output;
            let full = output
                .full
                .clone()
                .or_else(|| output.data.clone())
                .unwrap_or(Value::Null);
            Some(frame(
                "tool_result",
                &json!({
                    "run_id": event.run_id,
                    "call_id": completed.call_id,
                    "tool_name": completed.tool_name,
                    "is_error": output.is_error,
                    "model_view": output.visible_text(),
                    "full": full,
                    "artifacts": output.artifacts,
                }),
            ))
        }
        _ => None,
    }
}

/// The terminal frame of a run's result: `error` (`run_failed`) when it failed, else `final`.
fn terminal_frame(result: &RunResult) -> SseEvent {
    let view = result.view(true);
    if result.status == RunStatus::Failed {
        let message = result
            .error
            .clone()
            .unwrap_or_else(|| "the run failed".to_owned());
        return frame(
            "error",
            &json!({
                "error": {"kind": "run_failed", "message": message},
                "run_id": result.run_id,
                "session_id": result.session_id,
                "result": view,
            }),
        );
    }
    frame("final", &view)
}
