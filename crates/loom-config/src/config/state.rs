//! Stage 2 rules of session state: the keys an agent declares (`state:`) and the contexts that
//! read them (`main.context`, a role's `context`, `{{ context.session_state }}`).
//!
//! A key's schema must compile, `required` and `default` exclude each other, a default (and a
//! fixed `from.value`) follows the schema and the limits of `sessions.state`, `from.tool` names
//! a tool of the agent, and `from` gives exactly one of `path` (a JSON pointer) and `value`.

use loom_core::ids::is_valid_name;
use serde_json::Value;

use super::Doc;
use super::delegation::ToolNames;
use crate::error::{ConfigError, ConfigErrorKind};
use crate::guards::ContextItem;
use crate::model::AgentSpec;
use crate::sessions::StateLimits;
use crate::yaml::KeyPath;

fn invalid(doc: &Doc, path: &KeyPath, message: impl Into<String>) -> ConfigError {
    doc.error(path, ConfigErrorKind::Invalid, message)
}

/// The bytes of `value`'s compact JSON (what the limits of `sessions.state` count).
fn json_bytes(value: &Value) -> u64 {
    u64::try_from(value.to_string().len()).unwrap_or(u64::MAX)
}

/// The agent's `state` keys: names, schemas, `required`/`default`, defaults within the limits,
/// and their `from` sources (`tools`: the names the agent's tools have for the model).
pub(super) fn check_keys(
    doc: &Doc,
    p: &KeyPath,
    spec: &AgentSpec,
    tools: &ToolNames,
    limits: &StateLimits,
) -> Result<(), ConfigError> {
    let sp = p.key("state");
    let mut total = 2u64; // `{}`
    for (name, key) in &spec.state {
        let kp = sp.key(name);
        if !is_valid_name(name) {
            return Err(invalid(
                doc,
                &kp,
                format!("invalid state key '{name}' (expected ^[A-Za-z0-9_-]{{1,64}}$)"),
            ));
        }
        let schema = Value::Object(key.schema.clone());
        let validator = loom_schema::compile(&schema).map_err(|err| {
            let inside = err.instance_path().as_str();
            let inside = if inside.is_empty() {
                String::new()
            } else {
                format!(" at {inside}")
            };
            invalid(
                doc,
                &kp.key("schema"),
                format!("state key '{name}': invalid JSON Schema{inside}: {err}"),
            )
        })?;
        let fits = |value: &Value, at: &KeyPath, what: &str| -> Result<(), ConfigError> {
            if let Some(problem) = validator.iter_errors(value).next() {
                let path = problem.instance_path().to_string();
                let path = if path.is_empty() {
                    "(root)".into()
                } else {
                    path
                };
                return Err(invalid(
                    doc,
                    at,
                    format!(
                        "{what} of state key '{name}' does not follow its schema: {path}: {}",
                        problem.masked()
                    ),
                ));
            }
            let bytes = json_bytes(value);
            if bytes > limits.max_value_bytes {
                return Err(invalid(
                    doc,
                    at,
                    format!(
                        "{what} of state key '{name}' is {bytes} bytes of JSON, more than \
                         sessions.state.max_value_bytes ({})",
                        limits.max_value_bytes
                    ),
                ));
            }
            Ok(())
        };
        if key.required && key.default.is_some() {
            return Err(invalid(
                doc,
                &kp.key("default"),
                format!(
                    "state key '{name}' is required and has a default: a required key must be \
                     given a value, a default makes it optional (keep one of them)"
                ),
            ));
        }
        if let Some(default) = &key.default {
            fits(default, &kp.key("default"), "the default")?;
            // `"name":value` in the state's compact JSON (commas counted below).
            total += json_bytes(&Value::String(name.clone())) + 1 + json_bytes(default);
        }
        for (f, source) in key.from.iter().enumerate() {
            let fp = kp.key("from").index(f);
            if !tools.has(&source.tool) {
                return Err(doc.error(
                    &fp.key("tool"),
                    ConfigErrorKind::Reference,
                    format!(
                        "state key '{name}' is filled from '{}', which is not a tool of this \
                         agent (its tools: {})",
                        source.tool,
                        tools.describe()
                    ),
                ));
            }
            match (&source.path, &source.value) {
                (Some(_), Some(_)) => {
                    return Err(invalid(
                        doc,
                        &fp,
                        format!(
                            "state key '{name}': a source gives either 'path' (a JSON pointer \
                             into the result) or 'value' (a fixed value), not both"
                        ),
                    ));
                }
                (None, None) => {
                    return Err(invalid(
                        doc,
                        &fp,
                        format!(
                            "state key '{name}': a source needs 'path' (a JSON pointer into the \
                             result, such as /client/id) or 'value' (a fixed value)"
                        ),
                    ));
                }
                (Some(path), None) if !path.is_empty() && !path.starts_with('/') => {
                    return Err(invalid(
                        doc,
                        &fp.key("path"),
                        format!(
                            "state key '{name}': '{path}' is not a JSON pointer (it starts with \
                             '/', such as /{path}; \"\" is the whole result)"
                        ),
                    ));
                }
                (None, Some(value)) => fits(value, &fp.key("value"), "the fixed value")?,
                (Some(_), None) => {}
            }
        }
    }
    let defaults = spec.state.values().filter(|k| k.default.is_some()).count();
    if defaults > 1 {
        total += u64::try_from(defaults - 1).unwrap_or(u64::MAX); // commas
    }
    if defaults > 0 && total > limits.max_total_bytes {
        return Err(invalid(
            doc,
            &sp,
            format!(
                "the defaults of the state keys make {total} bytes of JSON, more than \
                 sessions.state.max_total_bytes ({})",
                limits.max_total_bytes
            ),
        ));
    }
    Ok(())
}

/// `main.context`: only `session_state` or `{session_state: [keys]}` (the orchestrator already
/// sees the conversation), once, naming declared keys.
pub(super) fn check_main_context(
    doc: &Doc,
    p: &KeyPath,
    spec: &AgentSpec,
) -> Result<(), ConfigError> {
    let cp = p.key("main").key("context");
    for (j, item) in spec.main.context.iter().enumerate() {
        let ip = cp.index(j);
        let Some(keys) = item.state_keys() else {
            return Err(invalid(
                doc,
                &ip,
                format!(
                    "main.context accepts only session_state or {{session_state: [keys]}}: the \
                     orchestrator already sees the conversation, '{}' is for roles and judges",
                    item.key()
                ),
            ));
        };
        if j > 0 {
            return Err(invalid(
                doc,
                &ip,
                "session_state is listed twice in main.context",
            ));
        }
        let declared: Vec<String> = spec.state.keys().cloned().collect();
        check_state_item(
            doc,
            &ip,
            (&spec.name, &declared),
            keys,
            "the orchestrator (main)",
        )?;
    }
    Ok(())
}

/// A `session_state` context item of `owner`: the agent declares state, and
/// `{session_state: [keys]}` names declared keys, each once.
pub(super) fn check_state_item(
    doc: &Doc,
    ip: &KeyPath,
    (agent, declared): (&str, &[String]),
    keys: Option<&[String]>,
    owner: &str,
) -> Result<(), ConfigError> {
    if declared.is_empty() {
        return Err(invalid(
            doc,
            ip,
            format!(
                "{owner} reads session_state, but agent '{agent}' declares no state keys (state:)"
            ),
        ));
    }
    let Some(keys) = keys else {
        return Ok(());
    };
    let kp = ip.key("session_state");
    if keys.is_empty() {
        return Err(invalid(doc, &kp, "at least one state key is needed"));
    }
    for (k, key) in keys.iter().enumerate() {
        if !declared.contains(key) {
            return Err(doc.error(
                &kp.index(k),
                ConfigErrorKind::Reference,
                format!(
                    "unknown state key '{key}' in session_state (keys of agent '{agent}': {})",
                    declared.join(", ")
                ),
            ));
        }
        if keys[..k].contains(key) {
            return Err(invalid(
                doc,
                &kp.index(k),
                format!("state key '{key}' listed twice"),
            ));
        }
    }
    Ok(())
}

/// The state keys a context gives a template (`context.session_state.<key>`): `None` when it
/// declares no `session_state` item.
pub(super) fn template_keys<'a>(
    spec_keys: &'a [String],
    context: &'a [ContextItem],
) -> Option<Vec<&'a str>> {
    context
        .iter()
        .find_map(ContextItem::state_keys)
        .map(|keys| match keys {
            Some(keys) => keys.iter().map(String::as_str).collect(),
            None => spec_keys.iter().map(String::as_str).collect(),
        })
}
