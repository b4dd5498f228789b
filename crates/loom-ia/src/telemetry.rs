//! Telemetry that leaves the process: the run's trace exported over OTLP/HTTP when a root run
//! closes or pauses (feature `otel`, adapter `loom-otel`), and one structured INFO log line per
//! model call and tool call.
//!
//! The export is a fold of the journal, like `loom inspect`: the run's [`Trace`] (its
//! sub-runs' spans under the tool calls that opened them), each span with the journal's times
//! as its explicit start and end, its ids derived from the run's ids
//! ([`loom_otel::trace_id`] of the tenant and the root run, [`loom_otel::span_id`] of the
//! journal's span id), so that a span is the same at every export and in every process. Content
//! (messages, arguments, results, reasons) is exported only with `telemetry.capture.exports:
//! content`, and every text goes through `telemetry.redaction` before it is handed to the
//! exporter. An export covers the spans that ended since the drive began (the first event
//! after the seq the journal had then), so that a run that pauses then resumes is not exported
//! twice. A failed export is a warning: it never fails the run.

use loom_core::Event;
use loom_core::event::Payload;

#[cfg(feature = "otel")]
pub(crate) use otel::{Telemetry, telemetry};

/// Without the `otel` feature there is nothing to export to: an instance has no telemetry.
#[cfg(not(feature = "otel"))]
#[derive(Debug)]
pub(crate) enum Telemetry {}

/// Without the `otel` feature, `telemetry.exporters` is a configuration error.
#[cfg(not(feature = "otel"))]
pub(crate) fn telemetry(
    config: &loom_config::Config,
) -> Result<Option<std::sync::Arc<Telemetry>>, crate::LoomError> {
    if config.raw().telemetry.exporters.is_empty() {
        Ok(None)
    } else {
        Err(config
            .error_at_root(
                "telemetry.exporters",
                "exporting traces needs the `otel` feature of loom-ia, which this build lacks \
                 (loom-cli enables it by default)",
            )
            .into())
    }
}

#[cfg(not(feature = "otel"))]
impl Telemetry {
    /// Nothing to export (no value of this type exists).
    pub(crate) async fn export(
        &self,
        _loom: &crate::Loom,
        _run: &loom_engine::RunRef,
        _after: u64,
    ) {
        match *self {}
    }
}

/// One INFO line per model call (`model.responded`) and tool call (`tool.completed`) among
/// `written`, on the target `loom::calls`: ids, model or tool, tokens, cost and latency; never
/// content.
pub(crate) fn log_calls(written: &[&Event]) {
    for event in written {
        match &event.payload {
            Payload::ModelResponded(call) => tracing::info!(
                target: "loom::calls",
                tenant_id = %event.tenant_id,
                session_id = %event.session_id,
                run_id = %event.run_id,
                agent = event.agent.as_deref().unwrap_or(""),
                role = event.role.as_deref().unwrap_or(""),
                model_id = %call.model_id,
                provider = %call.provider,
                input_tokens = call.usage.prompt_tokens(),
                output_tokens = call.usage.output_tokens,
                cost_usd = call.cost_usd,
                latency_ms = call.latency_ms,
                attempts = call.attempts,
                "model call"
            ),
            Payload::ToolCompleted(call) => tracing::info!(
                target: "loom::calls",
                tenant_id = %event.tenant_id,
                session_id = %event.session_id,
                run_id = %event.run_id,
                agent = event.agent.as_deref().unwrap_or(""),
                tool = %call.tool_name,
                call_id = %call.call_id,
                is_error = call.output.is_error,
                size = call.size,
                cost_usd = call.cost_usd,
                latency_ms = call.latency_ms,
                "tool call"
            ),
            _ => {}
        }
    }
}

#[cfg(feature = "otel")]
mod otel {
    use std::sync::Arc;
    use std::time::Duration;

    use loom_config::{CaptureExports, Config, RedactionPattern};
    use loom_engine::RunRef;
    use loom_otel::{
        ExportEvent, ExportSpan, ExportStatus, ExporterSettings, OtelKind, OtlpExporter, Pattern,
        Redactor,
    };

    use crate::report::{SpanKind, SpanStatus, Trace};
    use crate::{Loom, LoomError};

    /// The exporters `telemetry.exporters` declares, the redaction, and whether content goes.
    #[derive(Debug)]
    pub(crate) struct Telemetry {
        exporters: Vec<Arc<OtlpExporter>>,
        redactor: Arc<Redactor>,
        content: bool,
    }

    /// The OTLP base URL when the exporter's `endpoint_env` is unset (OpenTelemetry's default).
    const DEFAULT_ENDPOINT: &str = "http://localhost:4318";

    /// The telemetry of `config`: `None` without exporters. Each exporter's endpoint and
    /// headers are read from the variables it names (through the env file too).
    pub(crate) fn telemetry(config: &Config) -> Result<Option<Arc<Telemetry>>, LoomError> {
        let telemetry = &config.raw().telemetry;
        if telemetry.exporters.is_empty() {
            return Ok(None);
        }
        let at = |index: usize, key: &str, message: String| -> LoomError {
            config
                .error_at_root(&format!("telemetry.exporters[{index}].{key}"), message)
                .into()
        };
        let patterns: Vec<Pattern> = telemetry
            .redaction
            .patterns
            .iter()
            .filter_map(|pattern| match pattern {
                RedactionPattern::Named(name) => Pattern::named(name),
                RedactionPattern::Custom { name, regex } => Some(Pattern::Custom {
                    name: name.clone(),
                    regex: regex.clone(),
                }),
            })
            .collect();
        let redactor = Redactor::new(&patterns).map_err(|error| -> LoomError {
            config
                .error_at_root("telemetry.redaction.patterns", error.to_string())
                .into()
        })?;
        let mut exporters = Vec::new();
        for (index, exporter) in telemetry.exporters.iter().enumerate() {
            let base = crate::env::var(config, &exporter.endpoint_env)
                .filter(|value| !value.trim().is_empty())
                .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
            let headers = match &exporter.headers_env {
                Some(name) => {
                    let value = crate::env::var(config, name).unwrap_or_default();
                    loom_otel::parse_headers(&value)
                        .map_err(|error| at(index, "headers_env", format!("{name}: {error}")))?
                }
                None => Vec::new(),
            };
            let settings = ExporterSettings {
                endpoint: format!("{}/v1/traces", base.trim().trim_end_matches('/')),
                headers,
                service_name: exporter.service_name.clone(),
                timeout: Duration::try_from_secs_f64(exporter.timeout)
                    .unwrap_or(Duration::from_secs(10)),
            };
            let built = OtlpExporter::start(settings)
                .map_err(|error| at(index, "endpoint_env", error.to_string()))?;
            exporters.push(Arc::new(built));
        }
        Ok(Some(Arc::new(Telemetry {
            exporters,
            redactor: Arc::new(redactor),
            content: telemetry.capture.exports == CaptureExports::Content,
        })))
    }

    impl Telemetry {
        /// Exports the trace of the root run `run`: the spans that ended after the journal's
        /// seq `after` (what the drive that just ended wrote). Failures are warnings.
        pub(crate) async fn export(&self, loom: &Loom, run: &RunRef, after: u64) {
            let events = match loom.session_events_of(run).await {
                Ok(events) => events,
                Err(error) => {
                    tracing::warn!(run_id = %run.run_id, %error, "trace not exported: journal unreadable");
                    return;
                }
            };
            let Some(since) = events.iter().find(|e| e.seq > after).map(|e| e.ts) else {
                return;
            };
            let trace = match Trace::from_events(&run.run_id, &events) {
                Ok(trace) => trace,
                Err(error) => {
                    tracing::warn!(run_id = %run.run_id, %error, "trace not exported: fold failed");
                    return;
                }
            };
            let trace = if self.content {
                trace
            } else {
                trace.without_content()
            };
            let spans = export_spans(&trace, since);
            let count = spans.len();
            for exporter in &self.exporters {
                let (exporter, redactor, spans) =
                    (exporter.clone(), self.redactor.clone(), spans.clone());
                let endpoint = exporter.endpoint().to_owned();
                // The exporter blocks until its receiver answers: off the runtime's workers.
                let outcome =
                    tokio::task::spawn_blocking(move || exporter.export(&spans, &redactor)).await;
                match outcome {
                    Ok(Ok(())) => {
                        tracing::debug!(run_id = %run.run_id, %endpoint, spans = count, "trace exported")
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(run_id = %run.run_id, %error, "trace not exported")
                    }
                    Err(error) => {
                        tracing::warn!(run_id = %run.run_id, %error, "trace export task failed")
                    }
                }
            }
        }
    }

    /// The spans of `trace` that ended at or after `since`, as `loom-otel` exports them.
    pub(crate) fn export_spans(
        trace: &Trace,
        since: chrono::DateTime<chrono::Utc>,
    ) -> Vec<ExportSpan> {
        let trace_id = loom_otel::trace_id(&trace.tenant_id, &trace.trace_id);
        trace
            .spans
            .iter()
            .filter_map(|span| {
                let end = span.end_time.filter(|end| *end >= since)?;
                let mut attributes: Vec<(String, serde_json::Value)> = span
                    .attributes
                    .iter()
                    .map(|(key, value)| (key.clone(), value.clone()))
                    .collect();
                attributes.push(("loom.span_id".into(), span.span_id.clone().into()));
                if span.parent_span_id.is_none() {
                    attributes.push(("loom.session_id".into(), trace.session_id.clone().into()));
                }
                Some(ExportSpan {
                    trace_id,
                    span_id: loom_otel::span_id(&span.span_id),
                    parent_span_id: span.parent_span_id.as_deref().map(loom_otel::span_id),
                    name: span.name.clone(),
                    kind: match span.kind {
                        SpanKind::Chat | SpanKind::Judge | SpanKind::Model => OtelKind::Client,
                        SpanKind::Run | SpanKind::Step | SpanKind::Tool | SpanKind::Other => {
                            OtelKind::Internal
                        }
                    },
                    start: span.start_time,
                    end,
                    status: match span.status {
                        SpanStatus::Unset => ExportStatus::Unset,
                        SpanStatus::Ok => ExportStatus::Ok,
                        SpanStatus::Error => ExportStatus::Error(
                            span.text("loom.status").unwrap_or("error").to_owned(),
                        ),
                    },
                    attributes,
                    events: span
                        .events
                        .iter()
                        .map(|event| ExportEvent {
                            name: event.name.clone(),
                            time: event.time,
                            attributes: event
                                .attributes
                                .iter()
                                .map(|(key, value)| (key.clone(), value.clone()))
                                .collect(),
                        })
                        .collect(),
                })
            })
            .collect()
    }
}

#[cfg(all(test, feature = "otel"))]
mod tests {
    /// The engine gives a tool call the `traceparent` of the span this module exports: both
    /// derive the ids the same way.
    #[test]
    fn the_engines_traceparent_is_the_exported_span() {
        for (tenant, root, span) in [
            ("default", "t1", "01a2272b-2a45-79f4-99d5-b6d2b873ea2a"),
            ("acme", "run-2", "x"),
        ] {
            assert_eq!(
                loom_engine::traceparent(tenant, root, span),
                loom_otel::traceparent(loom_otel::trace_id(tenant, root), loom_otel::span_id(span))
            );
        }
    }
}
