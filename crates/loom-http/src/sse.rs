//! `GET /runs/{run_id}/events`: a run's events as Server-Sent Events, built on
//! [`loom_ia::Loom::follow`].
//!
//! Each event is sent with `id:` its seq, `event:` its type and `data:` its JSON. Events
//! already written with `seq > after_seq` come first (the `Last-Event-ID` header, when
//! present, wins over `after_seq`), then the new ones; the stream ends after the run's
//! terminal event. A keep-alive comment is sent every [`crate::KEEP_ALIVE`]. An error while
//! following is sent as an `error` event (`{"error": {kind, message}}`) and ends the stream;
//! so does the server's shutdown.
//!
//! With `subruns=true` (the default) the events of the runs it opened (sub-agents) come too, in
//! their place in the shared session journal (same `id:` seq). When one of them runs an agent
//! the caller's key is not allowed on, an `error` event `{"detail": …, "error": {kind:
//! "agent_not_allowed", message}}` is sent instead and the stream ends. Without
//! `read_content`, each event's content fields are removed and listed in `redacted`.
//!
//! With `deltas=true` the text the models stream comes too, as `text_delta` events (`data:`
//! `{"run_id", "text"}`, no `id:`: they are not journaled, so a resumed stream does not replay
//! them), for the run (and its sub-runs with `subruns`) while this server process drives it
//! ([`loom_ia::Loom::text_deltas`]; a run driven by a worker streams none here). The order
//! is best effort: a model's deltas are written before its answer is journaled
//! (`model.responded`), and each is sent as it is read, journal events first when both wait,
//! so a delta may come just before or just after the journal events written around it; a
//! client slower than the buffer ([`loom_ia::LIVE_BUFFER`] deltas) loses the oldest. It needs
//! `read_content` (text is content): without it the flag is ignored. Without the flag nothing
//! changes.

use std::{collections::HashSet, convert::Infallible};

use axum::{
    extract::{Path, State},
    http::HeaderMap,
    response::{
        IntoResponse, Response,
        sse::{Event as SseEvent, KeepAlive, Sse},
    },
};
use futures_util::StreamExt;
use loom_ia::config::Scope;
use loom_ia::{Event, FollowOptions, LiveDelta, LoomError, Redact, RunRef, core::BoxStream};
use tokio::sync::broadcast;

use crate::{
    AppState, KEEP_ALIVE,
    auth::Caller,
    error::{ApiError, ErrorKind},
    openapi::ErrorBody,
    params::Params,
    routes::lease_seconds,
};

/// The query of the events route.
#[derive(Debug, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub(crate) struct EventsQuery {
    /// The run's session. Without it, the run is looked up in the session named after it
    /// (where a run opened without `session_id` lives), as in Loom-IA: a run of a named session
    /// must be asked with its session, else it is unknown (404).
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]
    session_id: Option<String>,
    /// Send the events with a greater seq (`Last-Event-ID` wins when both are given).
    #[param(minimum = 0)]
    after_seq: Option<u64>,
    /// Whether the events of the run's sub-runs come too (default `true`).
    subruns: Option<bool>,
    /// Whether the text the models stream comes too, as `text_delta` events without `id:`
    /// (default `false`; needs `read_content`, ignored without it).
    deltas: Option<bool>,
}

/// One event of the stream, as an SSE client reads it (keep-alive comments are not events).
#[derive(Debug, utoipa::ToSchema)]
#[allow(dead_code)]
pub(crate) struct StreamEvent {
    /// The event's seq (absent on an `error` event).
    #[schema(pattern = "^[0-9]+$")]
    id: Option<String>,
    /// The event's type (`run.started`, `model.responded`, …), `error`, or with `deltas=true`
    /// `text_delta` (data `{"run_id", "text"}`, no `id`).
    event: String,
    /// The event's JSON as the journal holds it (the envelope: `event_id`, `ts`, `seq`,
    /// `type`, `payload`, …), or for `error` the error body `{"error": {kind, message}}`.
    #[schema(content_media_type = "application/json")]
    data: String,
}

/// The resume point a `Last-Event-ID` header gives: 1 to 18 digits.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let invalid = || {
        ApiError::new(
            ErrorKind::InvalidHeader,
            "Last-Event-ID must be an event seq (1 to 18 digits)",
        )
    };
    let text = value.to_str().map_err(|_| invalid())?.trim();
    if text.is_empty() || text.len() > 18 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    text.parse().map(Some).map_err(|_| invalid())
}

fn sse_event(event: &Event, content: bool) -> SseEvent {
    let data = serde_json::to_string(&event.view(content)).unwrap_or_else(|error| {
        ApiError::new(
            ErrorKind::Engine,
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

/// `GET /runs/{run_id}/events`.
#[utoipa::path(
    get,
    path = "/runs/{run_id}/events",
    tag = "runs",
    operation_id = "run_events",
    summary = "A run's events as Server-Sent Events",
    description = "Each journal event of the run as one SSE event: `id:` its seq, `event:` its \
type, `data:` the event's JSON (the journal's envelope: `event_id`, `ts`, `seq`, `type`, \
`payload`, …). Events already written come first, then new ones as they are written; the \
stream ends after the run's closing event (`run.completed`, `run.failed`, `run.cancelled`) \
or when the server shuts down. A comment is sent every 15 s. A reconnecting client sends \
`Last-Event-ID` and resumes exactly after it. An error while following is sent as an \
`error` event whose data is the error body, and ends the stream. With `deltas=true` (and \
the scope `read_content`), the text the models stream while this server drives the run comes \
too, as `text_delta` events without `id:` (data `{\"run_id\", \"text\"}`; not journaled, not \
replayed on resume; sent as they come, so a delta may come before a journal event the run wrote \
just before it). Scope `read`.",
    params(
        ("run_id" = String, Path, description = "The run."),
        EventsQuery,
        ("Last-Event-ID" = Option<String>, Header, pattern = "^[0-9]{1,18}$", description = "The seq of the last event seen (1 to 18 digits): resume after it."),
    ),
    responses(
        (status = 200, description = "The event stream: each item is one SSE event.", content_type = "text/event-stream", body = StreamEvent),
        (status = 403, description = "The key lacks the scope, or may not use the run's agent.", body = ErrorBody),
        (status = 404, description = "No such run in the session (`session_id`, else the session named after the run) of the caller's tenant.", body = ErrorBody),
        (status = 422, description = "The query string, the session id or `Last-Event-ID` is unusable.", body = ErrorBody),
    ),
    security(("bearer" = []), ("api_key" = [])),
)]
pub(crate) async fn events(
    State(state): State<AppState>,
    caller: Caller,
    Path(run_id): Path<String>,
    params: Params,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    caller.require(Scope::Read)?;
    let params = params.only::<EventsQuery>()?;
    let after_seq = params.number::<u64>("after_seq")?;
    let subruns = params.flag("subruns")?.unwrap_or(true);
    let deltas = params.flag("deltas")?.unwrap_or(false) && caller.reads_content();
    let session = params.text("session_id")?;
    let after = last_event_id(&headers)?.or(after_seq).unwrap_or(0);
    let loom = state.loom.clone();
    let run = caller
        .addressed_run(&state, &run_id, session.as_deref())
        .await?;
    let lease = lease_seconds(&loom);
    let content = caller.reads_content();
    let options = FollowOptions {
        after_seq: after,
        subruns,
        ..FollowOptions::default()
    };
    // Subscribed before following: no delta written after the first event read is missed.
    let live = deltas.then(|| loom.text_deltas());
    let followed = loom.follow_with(&run, options);
    let follower = Follower {
        followed,
        live,
        run,
        subruns,
        runs: HashSet::new(),
        caller,
        content,
        lease,
        ended: false,
    };
    let stream = futures_util::stream::unfold(follower, |mut follower| async move {
        let frame = follower.next_frame().await?;
        Some((Ok::<_, Infallible>(frame), follower))
    })
    .take_until(AppState::closed(state.closing.clone()));
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}

/// What the events route follows: the journal's events, and with `deltas=true` the text
/// deltas of the runs this process drives.
struct Follower {
    followed: BoxStream<'static, Result<Event, LoomError>>,
    /// The deltas of every run this process drives (`None`: not asked, or the channel closed).
    live: Option<broadcast::Receiver<LiveDelta>>,
    run: RunRef,
    subruns: bool,
    /// The runs whose events were sent (the run and its sub-runs): their deltas are sent.
    runs: HashSet<String>,
    caller: Caller,
    content: bool,
    lease: u64,
    /// A refusal ended the stream.
    ended: bool,
}

/// What came first: an event of the journal, or a text delta.
enum Next {
    Event(Option<Result<Box<Event>, LoomError>>),
    Delta(Option<LiveDelta>),
}

impl Follower {
    /// The next frame, or `None` when the stream ends (after the run's terminal event, or a
    /// refusal).
    async fn next_frame(&mut self) -> Option<SseEvent> {
        loop {
            if self.ended {
                return None;
            }
            let next = match self.live.as_mut() {
                Some(live) => tokio::select! {
                    biased;
                    event = self.followed.next() => Next::Event(event.map(|e| e.map(Box::new))),
                    delta = next_delta(live) => Next::Delta(delta),
                },
                None => Next::Event(self.followed.next().await.map(|e| e.map(Box::new))),
            };
            match next {
                Next::Event(None) => return None,
                Next::Event(Some(Ok(event))) => {
                    if let Some(refusal) = refused_agent(&self.caller, &event) {
                        // The stream ends right after a refusal, without waiting for the run's
                        // next event.
                        self.ended = true;
                        return Some(refusal);
                    }
                    self.runs.insert(event.run_id.clone());
                    return Some(sse_event(&event, self.content));
                }
                Next::Event(Some(Err(error))) => {
                    return Some(error_event(&ApiError::from_loom(&error, self.lease)));
                }
                Next::Delta(None) => self.live = None,
                Next::Delta(Some(delta)) => {
                    if self.wants(&delta) {
                        let data = serde_json::json!({"run_id": delta.run_id, "text": delta.text});
                        return Some(
                            SseEvent::default()
                                .event("text_delta")
                                .data(data.to_string()),
                        );
                    }
                }
            }
        }
    }

    /// Whether `delta` belongs to the followed run (or, with `subruns`, to one of its
    /// sub-runs, known by their events already sent).
    fn wants(&self, delta: &LiveDelta) -> bool {
        delta.tenant_id == self.run.tenant_id
            && delta.session_id == self.run.session_id
            && (delta.run_id == self.run.run_id
                || (self.subruns && self.runs.contains(&delta.run_id)))
    }
}

/// The next delta of `live`, skipping over those a slow reader lost; `None` once closed.
async fn next_delta(live: &mut broadcast::Receiver<LiveDelta>) -> Option<LiveDelta> {
    loop {
        match live.recv().await {
            Ok(delta) => return Some(delta),
            Err(broadcast::error::RecvError::Lagged(lost)) => {
                tracing::debug!(lost, "a slow events stream lost text deltas");
            }
            Err(broadcast::error::RecvError::Closed) => return None,
        }
    }
}

/// The `error` event that ends the stream when `event` belongs to a run of an agent the
/// caller may not use (a sub-agent of the followed run).
fn refused_agent(caller: &Caller, event: &Event) -> Option<SseEvent> {
    let agent = event.agent.as_deref()?;
    let error = caller.agent(agent).err()?;
    let mut body = error.body();
    if let Some(object) = body.as_object_mut() {
        object.insert(
            "detail".into(),
            serde_json::Value::String(format!(
                "run {} runs the agent '{agent}', which this key may not read: the stream ends",
                event.run_id
            )),
        );
    }
    Some(SseEvent::default().event("error").data(body.to_string()))
}
