//! Load-time rules of `server`: the limits of `server.http` (timeouts, connections) and who may
//! reach the API from a browser (`allowed_hosts`, `allowed_origins` of `server.http` and
//! `server.mcp`), and MCP over HTTP only with API keys.

use super::{Doc, NOT_POSITIVE};
use crate::access::{HostPattern, OriginPattern};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::model::LoomConfig;
use crate::yaml::KeyPath;

/// `server.http`: positive timeouts, at least one connection, readable hosts and origins.
pub(super) fn check_http_limits(doc: &Doc, raw: &LoomConfig) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    let http = &raw.server.http;
    let hp = KeyPath::root().key("server").key("http");
    for (key, seconds) in [
        ("header_timeout", http.header_timeout),
        ("body_timeout", http.body_timeout),
    ] {
        if !(seconds.is_finite() && seconds > 0.0)
            || std::time::Duration::try_from_secs_f64(seconds).is_err()
        {
            return Err(invalid(&hp.key(key), NOT_POSITIVE.into()));
        }
    }
    if http.max_connections == 0 {
        return Err(invalid(&hp.key("max_connections"), NOT_POSITIVE.into()));
    }
    check_origins(doc, &hp, &http.allowed_origins)?;
    check_hosts(doc, &hp, &http.allowed_hosts)
}

/// `server.mcp`: HTTP only with API keys, readable origins and hosts, usable file roots.
pub(super) fn check_mcp_access(doc: &Doc, raw: &LoomConfig) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    let mcp = &raw.server.mcp;
    let mp = KeyPath::root().key("server").key("mcp");
    if mcp.http && raw.security.api_keys.is_empty() {
        return Err(invalid(
            &mp.key("http"),
            "MCP over HTTP needs at least one API key in security.api_keys (every request to \
             /mcp must carry one); create one with 'loom keys create <id>'"
                .into(),
        ));
    }
    for (i, root) in mcp.file_roots.iter().enumerate() {
        if root.as_os_str().is_empty() {
            return Err(invalid(
                &mp.key("file_roots").index(i),
                "a file root must not be empty".into(),
            ));
        }
    }
    check_origins(doc, &mp, &mcp.allowed_origins)?;
    check_hosts(doc, &mp, &mcp.allowed_hosts)
}

/// Every entry of `<at>.allowed_origins` reads as an [`OriginPattern`].
fn check_origins(doc: &Doc, at: &KeyPath, origins: &[String]) -> Result<(), ConfigError> {
    for (i, origin) in origins.iter().enumerate() {
        if let Err(reason) = OriginPattern::parse(origin) {
            return Err(doc.error(
                &at.key("allowed_origins").index(i),
                ConfigErrorKind::Invalid,
                reason,
            ));
        }
    }
    Ok(())
}

/// Every entry of `<at>.allowed_hosts` reads as a [`HostPattern`].
fn check_hosts(doc: &Doc, at: &KeyPath, hosts: &[String]) -> Result<(), ConfigError> {
    for (i, host) in hosts.iter().enumerate() {
        if let Err(reason) = HostPattern::parse(host) {
            return Err(doc.error(
                &at.key("allowed_hosts").index(i),
                ConfigErrorKind::Invalid,
                reason,
            ));
        }
    }
    Ok(())
}
