//! `OtlpExporter`: the SDK's OTLP/HTTP span exporter on a thread of its own. Its blocking HTTP
//! client is built, used and dropped on that thread, never on an async runtime's; a caller
//! hands it spans and waits for the receiver's answer.

use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use opentelemetry::InstrumentationScope;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanExporter as _};

use crate::{ExportSpan, OtelError, Redactor};

/// Where and how spans are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExporterSettings {
    /// The traces endpoint, in full (`http://localhost:4318/v1/traces`).
    pub endpoint: String,
    /// Headers of every request (authentication of a hosted receiver).
    pub headers: Vec<(String, String)>,
    /// The `service.name` resource attribute.
    pub service_name: String,
    /// How long one export may take.
    pub timeout: Duration,
}

type Batch = (Vec<SpanData>, mpsc::Sender<Result<(), String>>);

/// An OTLP/HTTP span exporter (protobuf), running on its own thread.
#[derive(Debug)]
pub struct OtlpExporter {
    jobs: Mutex<mpsc::Sender<Batch>>,
    endpoint: String,
    timeout: Duration,
    scope: InstrumentationScope,
}

impl OtlpExporter {
    /// Starts the exporter's thread and builds the SDK exporter on it.
    pub fn start(settings: ExporterSettings) -> Result<OtlpExporter, OtelError> {
        let endpoint = settings.endpoint.clone();
        let build_error = |reason: String| OtelError::Build {
            endpoint: endpoint.clone(),
            reason,
        };
        let (jobs, inbox) = mpsc::channel::<Batch>();
        let (ready, built) = mpsc::channel::<Result<(), String>>();
        let timeout = settings.timeout;
        // reqwest is built without a default rustls provider (no aws-lc): ring, installed once.
        loom_tls::install_crypto_provider();
        thread::Builder::new()
            .name("loom-otlp".into())
            .spawn(move || {
                let headers: HashMap<String, String> = settings.headers.into_iter().collect();
                let exporter = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_endpoint(settings.endpoint)
                    .with_timeout(settings.timeout)
                    .with_headers(headers)
                    .build();
                let mut exporter = match exporter {
                    Ok(exporter) => exporter,
                    Err(error) => {
                        let _ = ready.send(Err(error.to_string()));
                        return;
                    }
                };
                exporter.set_resource(
                    &Resource::builder_empty()
                        .with_service_name(settings.service_name)
                        .build(),
                );
                let _ = ready.send(Ok(()));
                // Ends when the `OtlpExporter` is dropped (its sender with it).
                for (spans, answer) in inbox {
                    let outcome = block_on(exporter.export(spans)).map_err(|e| e.to_string());
                    let _ = answer.send(outcome);
                }
            })
            .map_err(|error| build_error(error.to_string()))?;
        built
            .recv()
            .map_err(|_| build_error("the exporter thread ended".into()))?
            .map_err(build_error)?;
        Ok(OtlpExporter {
            jobs: Mutex::new(jobs),
            endpoint,
            timeout,
            scope: InstrumentationScope::builder("loom")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        })
    }

    /// The traces endpoint.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Exports `spans`, each text redacted by `redactor` before it is handed to the exporter's
    /// thread; blocks until the receiver answers (call it off the async runtime's workers).
    pub fn export(&self, spans: &[ExportSpan], redactor: &Redactor) -> Result<(), OtelError> {
        if spans.is_empty() {
            return Ok(());
        }
        let failed = |reason: String| OtelError::Export {
            endpoint: self.endpoint.clone(),
            reason,
        };
        let batch: Vec<SpanData> = spans
            .iter()
            .map(|span| span.to_span_data(redactor, &self.scope))
            .collect();
        let (answer, outcome) = mpsc::channel();
        self.jobs
            .lock()
            .map_err(|_| failed("the exporter is unusable".into()))?
            .send((batch, answer))
            .map_err(|_| failed("the exporter thread ended".into()))?;
        // The SDK's own timeout bounds the request; this one bounds a wedged thread.
        outcome
            .recv_timeout(self.timeout + Duration::from_secs(5))
            .map_err(|_| failed("no answer from the exporter thread".into()))?
            .map_err(failed)
    }
}

/// Reads `key=value` pairs separated by commas, as `OTEL_EXPORTER_OTLP_HEADERS` does
/// (`api-key=abc,x-tenant=1`); spaces around keys and values are trimmed.
pub fn parse_headers(text: &str) -> Result<Vec<(String, String)>, OtelError> {
    text.split(',')
        .filter(|pair| !pair.trim().is_empty())
        .map(|pair| {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| OtelError::Headers(format!("'{}' is not key=value", pair.trim())))?;
            let key = key.trim();
            if key.is_empty()
                || !key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(OtelError::Headers(format!("'{key}' is not a header name")));
            }
            Ok((key.to_owned(), value.trim().to_owned()))
        })
        .collect()
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` on this thread to its end (the exporter's future blocks inside its HTTP
/// client and is ready at its first poll; parking covers any other).
fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_read_as_pairs() {
        assert_eq!(
            parse_headers(" api-key = abc ,x-tenant=1,").unwrap(),
            vec![
                ("api-key".to_owned(), "abc".to_owned()),
                ("x-tenant".to_owned(), "1".to_owned())
            ]
        );
        assert!(parse_headers("novalue").is_err());
        assert!(parse_headers("bad key=1").is_err());
        assert!(parse_headers("").unwrap().is_empty());
    }

    #[test]
    fn an_unreachable_receiver_is_an_export_error() {
        // Port 9 (discard) on localhost: nothing listens, the connection is refused.
        let exporter = OtlpExporter::start(ExporterSettings {
            endpoint: "http://127.0.0.1:9/v1/traces".into(),
            headers: vec![],
            service_name: "t".into(),
            timeout: Duration::from_secs(2),
        })
        .unwrap();
        let at = chrono::Utc::now();
        let span = ExportSpan {
            trace_id: crate::trace_id("t", "r"),
            span_id: crate::span_id("s"),
            parent_span_id: None,
            name: "run".into(),
            kind: crate::OtelKind::Internal,
            start: at,
            end: at,
            status: crate::ExportStatus::Ok,
            attributes: vec![],
            events: vec![],
        };
        let error = exporter.export(&[span], &Redactor::default()).unwrap_err();
        assert!(matches!(error, OtelError::Export { .. }), "{error}");
        assert!(exporter.export(&[], &Redactor::default()).is_ok());
    }
}
