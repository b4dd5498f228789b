//! The root-level sections: `version`, `models` (with their `pricing`), and the checks of
//! `storage`, `server`, `telemetry` and the other sections of `loom.yaml`.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::model::{EventsBackend, LoomConfig, ModelSpec, Sdk};
use crate::yaml::{KeyPath, Kind};

use super::{Doc, NOT_POSITIVE, positive_seconds, server};

/// `version` is checked before the rest, so that a newer file gets a clear message.
pub(super) fn check_version(doc: &Doc) -> Result<(), ConfigError> {
    let version = match doc.tree.get("version").map(|n| &n.kind) {
        Some(Kind::UInt(v)) => i128::from(*v),
        Some(Kind::Int(v)) => i128::from(*v),
        _ => return Ok(()),
    };
    if version == 1 {
        return Ok(());
    }
    Err(doc.error(
        &KeyPath::root().key("version"),
        ConfigErrorKind::Invalid,
        format!("unsupported config version {version} (expected 1)"),
    ))
}

pub(super) fn check_models(doc: &Doc, raw: &LoomConfig) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    for (i, model) in raw.models.iter().enumerate() {
        let p = KeyPath::root().key("models").index(i);
        if model.id.is_empty() {
            return Err(invalid(&p.key("id"), "must not be empty".into()));
        }
        if let Some(j) = raw.models[..i].iter().position(|m| m.id == model.id) {
            return Err(invalid(
                &p.key("id"),
                format!(
                    "duplicate model id '{}' (already declared at models[{j}])",
                    model.id
                ),
            ));
        }
        if model.model.is_empty() {
            return Err(invalid(&p.key("model"), "must not be empty".into()));
        }
        if model.api.is_some() && model.sdk != Sdk::Openai {
            return Err(invalid(
                &p.key("api"),
                format!(
                    "'api' is only valid with sdk 'openai' (model '{}' uses sdk '{}')",
                    model.id,
                    model.sdk.as_str()
                ),
            ));
        }
        if model.max_tokens == Some(0) {
            return Err(invalid(&p.key("max_tokens"), NOT_POSITIVE.into()));
        }
        if model.capabilities.context_window == Some(0) {
            return Err(invalid(
                &p.key("capabilities").key("context_window"),
                NOT_POSITIVE.into(),
            ));
        }
        check_pricing(doc, &p.key("pricing"), model)?;
        if model.cache.is_some() && model.sdk != Sdk::Anthropic {
            return Err(invalid(
                &p.key("cache"),
                format!(
                    "'cache' (prompt-cache breakpoints) is only valid with sdk 'anthropic' (model '{}')",
                    model.id
                ),
            ));
        }
        if let Some(ttl) = model.cache.as_ref().and_then(|c| c.ttl.as_deref())
            && ttl != "5m"
            && ttl != "1h"
        {
            return Err(invalid(
                &p.key("cache").key("ttl"),
                format!("unknown cache ttl '{ttl}' (expected 5m or 1h)"),
            ));
        }
        let tp = p.key("timeouts");
        for (key, value) in [
            ("first_token", model.timeouts.first_token),
            ("idle", model.timeouts.idle),
            ("total", model.timeouts.total),
        ] {
            if !positive_seconds(value) {
                return Err(invalid(&tp.key(key), NOT_POSITIVE.into()));
            }
        }
        let rp = p.key("retry");
        let retry = &model.retry;
        if retry.max_attempts == 0 {
            return Err(invalid(&rp.key("max_attempts"), NOT_POSITIVE.into()));
        }
        if !(retry.multiplier.is_finite() && retry.multiplier >= 1.0) {
            return Err(invalid(&rp.key("multiplier"), "must be at least 1".into()));
        }
        for (key, value) in [
            ("initial_delay", retry.initial_delay),
            ("max_delay", retry.max_delay),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(invalid(
                    &rp.key(key),
                    "must be a number of seconds, 0 or more".into(),
                ));
            }
        }
        if let Some(breaker) = &model.circuit_breaker {
            if breaker.failures == 0 {
                return Err(invalid(
                    &p.key("circuit_breaker").key("failures"),
                    NOT_POSITIVE.into(),
                ));
            }
            if !(breaker.cooldown.is_finite() && breaker.cooldown > 0.0) {
                return Err(invalid(
                    &p.key("circuit_breaker").key("cooldown"),
                    NOT_POSITIVE.into(),
                ));
            }
        }
    }
    Ok(())
}

fn check_pricing(doc: &Doc, p: &KeyPath, model: &ModelSpec) -> Result<(), ConfigError> {
    let pricing = &model.pricing;
    let bad_rate = |r: f64| r < 0.0 || !r.is_finite();
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    let rates = [
        ("input", pricing.input),
        ("output", pricing.output),
        ("cache_read", pricing.cache_read),
        ("cache_write", pricing.cache_write),
    ];
    for (name, rate) in rates {
        if bad_rate(rate) {
            return Err(invalid(
                &p.key(name),
                "prices must be finite and not negative".into(),
            ));
        }
    }
    for (t, tier) in pricing.tiers.iter().enumerate() {
        let tp = p.key("tiers").index(t);
        if tier.above == 0 {
            return Err(invalid(&tp.key("above"), NOT_POSITIVE.into()));
        }
        let rates = [
            ("input", tier.input),
            ("output", tier.output),
            ("cache_read", tier.cache_read),
            ("cache_write", tier.cache_write),
        ];
        for (name, rate) in rates {
            if rate.is_some_and(bad_rate) {
                return Err(invalid(
                    &tp.key(name),
                    "prices must be finite and not negative".into(),
                ));
            }
        }
    }
    if let Err(msg) = pricing.check() {
        // Point at the first tier that breaks the order.
        let at = pricing
            .tiers
            .windows(2)
            .position(|w| w[1].above <= w[0].above)
            .map_or_else(|| p.clone(), |t| p.key("tiers").index(t + 1).key("above"));
        let detail = pricing
            .tiers
            .windows(2)
            .find(|w| w[1].above <= w[0].above)
            .map(|w| format!(" ({} follows {})", w[1].above, w[0].above))
            .unwrap_or_default();
        return Err(invalid(&at, format!("{msg}{detail}")));
    }
    Ok(())
}

pub(super) fn check_sections(doc: &Doc, raw: &LoomConfig) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    let events = &raw.storage.events;
    let ep = KeyPath::root().key("storage").key("events");
    if events.backend == EventsBackend::Jsonl && events.path.is_none() {
        return Err(invalid(
            &ep.key("backend"),
            "backend 'jsonl' requires 'path' (the journal directory)".into(),
        ));
    }
    if events.backend == EventsBackend::Sqlite && events.path.is_none() {
        return Err(invalid(
            &ep.key("backend"),
            "backend 'sqlite' requires 'path' (the database file)".into(),
        ));
    }
    super::storage::check_postgres(doc, raw)?;
    super::services::check_services(doc, raw)?;
    if !(raw.execution.lease.is_finite() && raw.execution.lease > 0.0) {
        return Err(invalid(
            &KeyPath::root().key("execution").key("lease"),
            NOT_POSITIVE.into(),
        ));
    }
    let shutdown = raw.execution.shutdown_timeout;
    if !(shutdown.is_finite() && shutdown >= 0.0) {
        return Err(invalid(
            &KeyPath::root().key("execution").key("shutdown_timeout"),
            "must be a number of seconds, 0 or more".into(),
        ));
    }
    let tp = KeyPath::root().key("execution").key("tools");
    let tools = &raw.execution.tools;
    if !positive_seconds(tools.timeout) {
        return Err(invalid(&tp.key("timeout"), NOT_POSITIVE.into()));
    }
    if tools.offload_over == Some(0) {
        return Err(invalid(&tp.key("offload_over"), NOT_POSITIVE.into()));
    }
    let ap = KeyPath::root().key("execution").key("attachments");
    let attachments = &raw.execution.attachments;
    if attachments.max_bytes == 0 {
        return Err(invalid(&ap.key("max_bytes"), NOT_POSITIVE.into()));
    }
    for (i, media_type) in attachments.types.iter().enumerate() {
        if !is_media_type(media_type) {
            return Err(invalid(
                &ap.key("types").index(i),
                format!(
                    "'{media_type}' is not a media type (expected type/subtype, e.g. image/png)"
                ),
            ));
        }
        if attachments.types[..i].contains(media_type) {
            return Err(invalid(
                &ap.key("types").index(i),
                format!("media type '{media_type}' is listed twice"),
            ));
        }
    }
    if raw.telemetry.capture.raw_max_bytes == 0 {
        return Err(invalid(
            &KeyPath::root()
                .key("telemetry")
                .key("capture")
                .key("raw_max_bytes"),
            NOT_POSITIVE.into(),
        ));
    }
    let http = &raw.server.http;
    let hp = KeyPath::root().key("server").key("http");
    let usable_prefix = |path: &str| {
        path.starts_with('/') && !path.ends_with('/') && !path.contains(['?', '#', ' '])
    };
    if !http.base_path.is_empty() && !usable_prefix(&http.base_path) {
        return Err(invalid(
            &hp.key("base_path"),
            format!(
                "base_path '{}' must be empty or a path starting with '/' (without a trailing '/')",
                http.base_path
            ),
        ));
    }
    if http.host.trim().is_empty() {
        return Err(invalid(&hp.key("host"), "host must not be empty".into()));
    }
    if http.max_body_bytes == 0 {
        return Err(invalid(&hp.key("max_body_bytes"), NOT_POSITIVE.into()));
    }
    server::check_http_limits(doc, raw)?;
    server::check_mcp_access(doc, raw)?;
    let logging = &raw.telemetry.logging;
    if logging.level().is_none() {
        return Err(invalid(
            &KeyPath::root().key("telemetry").key("logging").key("level"),
            format!(
                "unknown log level '{}' (expected one of: ERROR, WARNING, WARN, INFO, DEBUG, TRACE)",
                logging.level
            ),
        ));
    }
    super::telemetry::check_telemetry(doc, raw)
}

/// Whether `text` reads as a media type `type/subtype` (RFC 6838 restricted names, lowercase).
fn is_media_type(text: &str) -> bool {
    let name = |part: &str| {
        part.chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && part.len() <= 127
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "!#$&^_.+-".contains(c))
    };
    text.split_once('/')
        .is_some_and(|(kind, sub)| name(kind) && name(sub))
}
