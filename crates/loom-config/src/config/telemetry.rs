//! `telemetry.exporters`, `telemetry.redaction` and `telemetry.capture.exports`: each bad value
//! refused where it is written.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::model::{
    CaptureExports, LoomConfig, OtlpProtocol, REDACTION_PATTERNS, RedactionPattern,
};
use crate::yaml::KeyPath;

use super::{Doc, positive_seconds, storage::env_name};

pub(super) fn check_telemetry(doc: &Doc, raw: &LoomConfig) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    let telemetry = &raw.telemetry;
    let tp = KeyPath::root().key("telemetry");
    for (i, exporter) in telemetry.exporters.iter().enumerate() {
        let ep = tp.key("exporters").index(i);
        if exporter.protocol == OtlpProtocol::Grpc {
            return Err(invalid(
                &ep.key("protocol"),
                "protocol 'grpc' is not supported: Loom exports over OTLP/HTTP \
                 (protocol: http/protobuf, port 4318)"
                    .into(),
            ));
        }
        if !env_name(&exporter.endpoint_env) {
            return Err(invalid(
                &ep.key("endpoint_env"),
                format!(
                    "'{}' is not an environment variable name",
                    exporter.endpoint_env
                ),
            ));
        }
        if let Some(headers) = &exporter.headers_env
            && !env_name(headers)
        {
            return Err(invalid(
                &ep.key("headers_env"),
                format!("'{headers}' is not an environment variable name"),
            ));
        }
        if exporter.service_name.trim().is_empty() {
            return Err(invalid(
                &ep.key("service_name"),
                "service_name must not be empty".into(),
            ));
        }
        if !positive_seconds(Some(exporter.timeout)) {
            return Err(invalid(
                &ep.key("timeout"),
                "timeout must be a positive number of seconds".into(),
            ));
        }
    }
    if telemetry.capture.exports == CaptureExports::Content && telemetry.exporters.is_empty() {
        return Err(invalid(
            &tp.key("capture").key("exports"),
            "exports: content without an exporter: declare telemetry.exporters, or leave \
             exports at metadata"
                .into(),
        ));
    }
    let rp = tp.key("redaction").key("patterns");
    let mut names: Vec<&str> = Vec::new();
    for (i, pattern) in telemetry.redaction.patterns.iter().enumerate() {
        let at = rp.index(i);
        let name = match pattern {
            RedactionPattern::Named(name) => {
                if !REDACTION_PATTERNS.contains(&name.as_str()) {
                    return Err(invalid(
                        &at,
                        format!(
                            "unknown redaction pattern '{name}' (built-in: {}; or {{name, regex}})",
                            REDACTION_PATTERNS.join(", ")
                        ),
                    ));
                }
                name.as_str()
            }
            RedactionPattern::Custom { name, regex } => {
                if !loom_core::ids::is_valid_name(name) {
                    return Err(invalid(
                        &at.key("name"),
                        format!("'{name}' is not a valid pattern name"),
                    ));
                }
                if let Err(error) = regex::Regex::new(regex) {
                    return Err(invalid(
                        &at.key("regex"),
                        format!("regex of pattern '{name}' does not compile: {error}"),
                    ));
                }
                name.as_str()
            }
        };
        if names.contains(&name) {
            return Err(invalid(
                &at,
                format!("redaction pattern '{name}' is listed twice"),
            ));
        }
        names.push(name);
    }
    Ok(())
}
