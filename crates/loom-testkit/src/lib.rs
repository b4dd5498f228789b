//! # loom-testkit
//!
//! Test doubles for Loom's ports: a manual clock, scripted and misbehaving models, and tools
//! that sleep, fail or panic. Deterministic by construction: no double reads the wall clock or
//! the network.
//!
//! [`conformance`] holds the scenarios every journal (`EventStore`) must pass,
//! [`bus_conformance`](mod@bus_conformance) those of every event bus (`EventBus`), [`shared`] finds
//! the reference files of `../shared` (and skips a test on a bare clone without them), and
//! [`postgres`] makes a fresh PostgreSQL database per test (skipped without
//! `LOOM_TEST_POSTGRES`, failed without it under `LOOM_REQUIRE_SERVICES=1`),
//! [`queue_conformance`](mod@queue_conformance) holds the scenarios every job queue must pass, and [`search_conformance`](mod@search_conformance) the event searches every indexed store must answer as a scan, and [`wait`] polls for what a test awaits with a deadline (the only wall-clock reads here).

pub mod bus_conformance;
pub mod conformance;
pub mod counting;
pub mod idempotency;
pub mod postgres;
pub mod queue_conformance;
pub mod search_conformance;
pub mod services;
pub mod shared;
pub mod wait;

use std::{
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, TimeZone, Utc};
pub use counting::CountingStore;
use futures_util::stream;
use loom_core::{
    BoxFuture, BoxStream,
    model::{ModelChunk, ModelClient, ModelError, ModelRequest},
    ports::Clock,
    tool::{FnTool, ToolDeclarations, ToolError, ToolKind, ToolOutput, ToolSpec},
};
pub use loom_models::FakeModel;
use serde_json::{Map, Value, json};

/// A clock that starts at a fixed instant and advances one microsecond per reading, so
/// timestamps are deterministic and strictly increasing.
#[derive(Debug)]
pub struct ManualClock {
    micros: AtomicI64,
}

impl ManualClock {
    /// A clock at 2026-11-29T12:00:00Z.
    pub fn new() -> ManualClock {
        let start = Utc
            .with_ymd_and_hms(2026, 11, 29, 12, 0, 0)
            .single()
            .map_or(0, |t| t.timestamp_micros());
        ManualClock {
            micros: AtomicI64::new(start),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.micros.fetch_add(
            i64::try_from(by.as_micros()).unwrap_or(i64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Default for ManualClock {
    fn default() -> ManualClock {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        let micros = self.micros.fetch_add(1, Ordering::SeqCst);
        DateTime::from_timestamp_micros(micros).unwrap_or_default()
    }
}

/// A fake model from a JSON script (see [`FakeModel`] for the reply keys).
pub fn scripted(name: &str, script: Value) -> Arc<dyn ModelClient> {
    let mut params = Map::new();
    params.insert("script".into(), script);
    match FakeModel::from_params(name, &params) {
        Ok(model) => Arc::new(model),
        Err(error) => panic!("invalid test script: {error}"),
    }
}

/// A model that never answers (until dropped): for cancellation and timeout tests.
#[derive(Debug, Default)]
pub struct HangingModel {
    /// How many calls reached it.
    pub calls: AtomicUsize,
}

impl ModelClient for HangingModel {
    fn provider(&self) -> &str {
        "fake"
    }

    fn stream(
        &self,
        _request: &ModelRequest,
    ) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(stream::pending())
    }
}

/// A model that records every request it receives and answers with an inner model.
pub struct RecordingModel {
    inner: Arc<dyn ModelClient>,
    /// The requests received, in order.
    pub requests: Mutex<Vec<ModelRequest>>,
}

impl fmt::Debug for RecordingModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordingModel").finish_non_exhaustive()
    }
}

impl RecordingModel {
    /// Records requests sent to `inner`.
    pub fn new(inner: Arc<dyn ModelClient>) -> RecordingModel {
        RecordingModel {
            inner,
            requests: Mutex::new(Vec::new()),
        }
    }

    /// A copy of the requests received.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl ModelClient for RecordingModel {
    fn provider(&self) -> &str {
        self.inner.provider()
    }

    fn stream(&self, request: &ModelRequest) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
        if let Ok(mut requests) = self.requests.lock() {
            requests.push(request.clone());
        }
        self.inner.stream(request)
    }
}

fn spec(name: &str, description: &str, input_schema: Value) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: description.into(),
        input_schema,
        kind: ToolKind::Python,
        declarations: ToolDeclarations::default(),
    }
}

/// A tool that sleeps `ms` milliseconds (argument `ms`, else `default_ms`) then answers its name.
pub fn sleep_tool(name: &str, default_ms: u64) -> FnTool {
    let label = name.to_owned();
    FnTool::new(
        spec(
            name,
            "Sleeps, then answers.",
            json!({"type": "object", "properties": {"ms": {"type": "integer"}}}),
        ),
        move |_, args| {
            let label = label.clone();
            Box::pin(async move {
                let ms = args.get("ms").and_then(Value::as_u64).unwrap_or(default_ms);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(ToolOutput::text(format!("{label} done")))
            })
        },
    )
}

/// A tool that adds `a` and `b` (both required numbers, nothing else allowed).
pub fn add_tool() -> FnTool {
    FnTool::new(
        spec(
            "add",
            "Adds two numbers.",
            json!({
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
                "additionalProperties": false
            }),
        ),
        |_, args| {
            Box::pin(async move {
                let a = args.get("a").and_then(Value::as_f64).unwrap_or_default();
                let b = args.get("b").and_then(Value::as_f64).unwrap_or_default();
                Ok(ToolOutput::text(format!("{}", a + b)))
            })
        },
    )
}

/// A tool that always returns a model-facing error.
pub fn failing_tool(name: &str, message: &str) -> FnTool {
    let message = message.to_owned();
    FnTool::new(
        spec(name, "Always fails.", json!({"type": "object"})),
        move |_, _| {
            let message = message.clone();
            Box::pin(async move { Err(ToolError::new(message)) })
        },
    )
}

/// A tool that panics.
pub fn panicking_tool(name: &str) -> FnTool {
    FnTool::new(spec(name, "Panics.", json!({"type": "object"})), |_, _| {
        Box::pin(async move { panic!("boom") })
    })
}

/// A tool that counts its calls and answers the call's idempotency key.
pub fn counting_tool(name: &str, counter: Arc<AtomicUsize>) -> FnTool {
    FnTool::new(
        spec(name, "Counts calls.", json!({"type": "object"})),
        move |ctx, _| {
            let counter = counter.clone();
            Box::pin(async move {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(ToolOutput::text(ctx.idempotency_key))
            })
        },
    )
}

/// A tool source that always gives the same tools, or always fails.
#[derive(Debug)]
pub struct FakeSource {
    name: String,
    tools: Vec<Arc<dyn loom_core::tool::Tool>>,
    failure: Option<loom_core::ports::SourceError>,
    /// How many times it was opened.
    pub opened: AtomicUsize,
    /// How many times it was released.
    pub released: AtomicUsize,
}

impl FakeSource {
    /// A source named `name` giving `tools`.
    pub fn with_tools(name: &str, tools: Vec<FnTool>) -> FakeSource {
        FakeSource {
            name: name.into(),
            tools: tools
                .into_iter()
                .map(|t| Arc::new(t) as Arc<dyn loom_core::tool::Tool>)
                .collect(),
            failure: None,
            opened: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
        }
    }

    /// A source named `name` that cannot be reached (its breaker opening if `circuit`).
    pub fn down(name: &str, message: &str, circuit: bool) -> FakeSource {
        FakeSource {
            name: name.into(),
            tools: Vec::new(),
            failure: Some(loom_core::ports::SourceError {
                message: message.into(),
                circuit: circuit.then(|| loom_core::ports::CircuitNotice {
                    target: format!("mcp:{name}"),
                    failures: 5,
                    cooldown_s: 60.0,
                    error: message.into(),
                }),
            }),
            opened: AtomicUsize::new(0),
            released: AtomicUsize::new(0),
        }
    }
}

impl loom_core::ports::ToolSource for FakeSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn open<'a>(
        &'a self,
        _ctx: &'a loom_core::ports::SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn loom_core::tool::Tool>>, loom_core::ports::SourceError>>
    {
        self.opened.fetch_add(1, Ordering::SeqCst);
        let outcome = match &self.failure {
            Some(error) => Err(error.clone()),
            None => Ok(self.tools.clone()),
        };
        Box::pin(async move { outcome })
    }

    fn release<'a>(&'a self, _ctx: &'a loom_core::ports::SourceContext) -> BoxFuture<'a, ()> {
        self.released.fetch_add(1, Ordering::SeqCst);
        Box::pin(async {})
    }
}

/// A tool that answers `chars` characters of text (for offload tests).
pub fn big_tool(name: &str, chars: usize) -> FnTool {
    FnTool::new(
        spec(name, "Answers a long text.", json!({"type": "object"})),
        move |_, _| {
            Box::pin(async move {
                let text: String = (0..chars)
                    .map(|i| char::from(b'a' + (i % 26) as u8))
                    .collect();
                Ok(ToolOutput::text(text))
            })
        },
    )
}

/// A model that fails some of its calls with a given error, and otherwise answers with an
/// inner model: the first `succeed_first` calls go through, the next `failures` fail (after
/// streaming `partial` text, if set), the rest go through.
pub struct FlakyModel {
    inner: Arc<dyn ModelClient>,
    error: ModelError,
    succeed_first: usize,
    failures: usize,
    partial: Option<String>,
    /// How many calls reached it.
    pub calls: AtomicUsize,
}

impl fmt::Debug for FlakyModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlakyModel")
            .field("error", &self.error)
            .field("succeed_first", &self.succeed_first)
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

impl FlakyModel {
    /// Fails the first `failures` calls with `error`, then answers with `inner`.
    pub fn new(inner: Arc<dyn ModelClient>, failures: usize, error: ModelError) -> FlakyModel {
        FlakyModel {
            inner,
            error,
            succeed_first: 0,
            failures,
            partial: None,
            calls: AtomicUsize::new(0),
        }
    }

    /// Fails every call with `error`.
    pub fn always(inner: Arc<dyn ModelClient>, error: ModelError) -> FlakyModel {
        FlakyModel::new(inner, usize::MAX, error)
    }

    /// Lets the first `calls` calls through before the failures start.
    pub fn after(mut self, calls: usize) -> FlakyModel {
        self.succeed_first = calls;
        self
    }

    /// Streams `text` before each failure (a stream that breaks midway).
    pub fn with_partial_text(mut self, text: &str) -> FlakyModel {
        self.partial = Some(text.to_owned());
        self
    }

    /// How many calls reached it.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl ModelClient for FlakyModel {
    fn provider(&self) -> &str {
        self.inner.provider()
    }

    fn stream(&self, request: &ModelRequest) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let failing = n >= self.succeed_first && n - self.succeed_first < self.failures;
        if !failing {
            return self.inner.stream(request);
        }
        let mut chunks = Vec::new();
        if let Some(text) = &self.partial {
            chunks.push(Ok(ModelChunk::TextDelta(text.clone())));
        }
        chunks.push(Err(self.error.clone()));
        Box::pin(stream::iter(chunks))
    }
}

/// A model that answers with an inner model, slowly: it waits `before_first` before the first
/// chunk and `between` before each of the others (optionally after an immediate usage chunk,
/// which is not content), for its first `slow_calls` calls.
pub struct SlowModel {
    inner: Arc<dyn ModelClient>,
    before_first: Duration,
    between: Duration,
    usage_first: bool,
    slow_calls: usize,
    /// How many calls reached it.
    pub calls: AtomicUsize,
}

impl fmt::Debug for SlowModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlowModel")
            .field("before_first", &self.before_first)
            .field("between", &self.between)
            .field("usage_first", &self.usage_first)
            .finish_non_exhaustive()
    }
}

impl SlowModel {
    /// `inner`, without delays yet.
    pub fn new(inner: Arc<dyn ModelClient>) -> SlowModel {
        SlowModel {
            inner,
            before_first: Duration::ZERO,
            between: Duration::ZERO,
            usage_first: false,
            slow_calls: usize::MAX,
            calls: AtomicUsize::new(0),
        }
    }

    /// Stalls `delay` before the first chunk.
    pub fn before_first(mut self, delay: Duration) -> SlowModel {
        self.before_first = delay;
        self
    }

    /// Stalls `delay` before every chunk after the first.
    pub fn between(mut self, delay: Duration) -> SlowModel {
        self.between = delay;
        self
    }

    /// Sends a usage chunk at once, before stalling.
    pub fn usage_first(mut self) -> SlowModel {
        self.usage_first = true;
        self
    }

    /// Only the first `calls` calls are slow.
    pub fn only_first(mut self, calls: usize) -> SlowModel {
        self.slow_calls = calls;
        self
    }

    /// How many calls reached it.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl ModelClient for SlowModel {
    fn provider(&self) -> &str {
        self.inner.provider()
    }

    fn stream(&self, request: &ModelRequest) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let inner = self.inner.stream(request);
        if n >= self.slow_calls {
            return inner;
        }
        let (before_first, between) = (self.before_first, self.between);
        let delayed = stream::unfold((inner, true), move |(mut inner, first)| async move {
            tokio::time::sleep(if first { before_first } else { between }).await;
            let chunk = futures_util::StreamExt::next(&mut inner).await?;
            Some((chunk, (inner, false)))
        });
        if self.usage_first {
            let usage = ModelChunk::Usage(loom_core::usage::Usage {
                input_tokens: 1,
                ..Default::default()
            });
            Box::pin(futures_util::StreamExt::chain(
                stream::iter([Ok(usage)]),
                delayed,
            ))
        } else {
            Box::pin(delayed)
        }
    }
}
