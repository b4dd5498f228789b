//! An agent's session state as the engine runs it ([`StateSpec`]): its `state:` keys (schemas
//! compiled once), the limits of `sessions.state`, and what `main.context` shows the
//! orchestrator.

use loom_config::{AgentSpec, Config, OnMissing};
use loom_engine::{StateFrom, StateKeySpec, StateSpec, StateValue, StateView};
use serde_json::Value;

use crate::LoomError;

/// The session state of agent `spec` (its keys were checked when the configuration loaded).
pub(crate) fn state_spec(config: &Config, spec: &AgentSpec) -> Result<StateSpec, LoomError> {
    let limits = &config.raw().sessions.state;
    let mut keys = Vec::with_capacity(spec.state.len());
    for (name, key) in &spec.state {
        let mut runtime = StateKeySpec::new(name.clone(), &Value::Object(key.schema.clone()))
            .map_err(|e| {
                LoomError::from(config.error_at_agent(
                    &spec.name,
                    &format!("state.{name}.schema"),
                    e.to_string(),
                ))
            })?;
        runtime.description.clone_from(&key.description);
        runtime.required = key.required;
        runtime.default.clone_from(&key.default);
        runtime.from = key
            .from
            .iter()
            .map(|source| StateFrom {
                tool: source.tool.clone(),
                value: match (&source.path, &source.value) {
                    (Some(path), _) => StateValue::Path(path.clone()),
                    (None, value) => StateValue::Fixed(value.clone().unwrap_or(Value::Null)),
                },
                refuse_missing: source.on_missing == OnMissing::Refuse,
            })
            .collect();
        keys.push(runtime);
    }
    let view = match spec.main.context.iter().find_map(|c| c.state_keys()) {
        None => StateView::Hidden,
        Some(None) => StateView::All,
        Some(Some(keys)) => StateView::Keys(keys.to_vec()),
    };
    Ok(StateSpec {
        keys,
        max_value_bytes: limits.max_value_bytes,
        max_total_bytes: limits.max_total_bytes,
        view,
    })
}
