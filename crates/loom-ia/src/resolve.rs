//! From configuration and registered code to what the engine runs.
//!
//! Models are built once, when the configuration is loaded. Agents are resolved against the
//! registered tools when first used (or by [`crate::Loom::validate`]), so tools can be
//! registered after loading; every refusal names the file, line and key of the reference.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use loom_config::{Config, ModelSpec, Sdk};
use loom_core::{
    model::ModelClient,
    tool::{Approval, OnUnknown, Tool, ToolDeclarations},
};
use loom_engine::{AgentRuntime, BoundTool, ModelBinding};
use loom_models::FakeModel;

use crate::LoomError;

/// Builds the client of every declared model.
pub(crate) fn models(config: &Config) -> Result<BTreeMap<String, Arc<dyn ModelClient>>, LoomError> {
    let mut clients: BTreeMap<String, Arc<dyn ModelClient>> = BTreeMap::new();
    for (index, spec) in config.raw().models.iter().enumerate() {
        let client: Arc<dyn ModelClient> = match spec.sdk {
            Sdk::Fake => {
                let model =
                    FakeModel::from_params(spec.model.clone(), &spec.params).map_err(|e| {
                        config.error_at_root(
                            &format!("models[{index}].params.script{}", e.path),
                            e.message,
                        )
                    })?;
                Arc::new(model)
            }
            Sdk::Anthropic | Sdk::Openai => {
                let sdk = spec.sdk.as_str();
                let compiled = match spec.sdk {
                    Sdk::Anthropic => cfg!(feature = "anthropic"),
                    _ => cfg!(feature = "openai"),
                };
                let message = if compiled {
                    format!(
                        "model '{}': the '{sdk}' adapter is not part of this version yet",
                        spec.id
                    )
                } else {
                    format!(
                        "model '{}': sdk '{sdk}' needs the Cargo feature '{sdk}' of loom-ia, \
                         which this build does not have",
                        spec.id
                    )
                };
                return Err(config
                    .error_at_root(&format!("models[{index}].sdk"), message)
                    .into());
            }
        };
        clients.insert(spec.id.clone(), client);
    }
    Ok(clients)
}

/// Resolves an agent for a tenant: rendered prompt, model binding, bound tools.
pub(crate) fn agent(
    config: &Config,
    models: &BTreeMap<String, Arc<dyn ModelClient>>,
    tools: &BTreeMap<String, Arc<dyn Tool>>,
    name: &str,
    tenant: &str,
) -> Result<AgentRuntime, LoomError> {
    let Some(spec) = config.agent(name) else {
        let known: Vec<&str> = config.agents().iter().map(|a| a.name.as_str()).collect();
        return Err(LoomError::UnknownAgent {
            name: name.to_owned(),
            known: if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            },
        });
    };
    let model_spec: &ModelSpec = config.model(&spec.main.model).ok_or_else(|| {
        config.error_at_agent(
            name,
            "main.model",
            format!("unknown model '{}'", spec.main.model),
        )
    })?;
    let client = models.get(&model_spec.id).cloned().ok_or_else(|| {
        config.error_at_agent(
            name,
            "main.model",
            format!("model '{}' has no client", model_spec.id),
        )
    })?;
    if !spec.tools.is_empty() && !model_spec.capabilities.tools {
        return Err(config
            .error_at_agent(
                name,
                "main.model",
                format!("model '{}' cannot call tools (capabilities.tools: false) but the agent has tools", model_spec.id),
            )
            .into());
    }
    let mut params = model_spec.params.clone();
    for (key, value) in &spec.main.llm.params {
        params.insert(key.clone(), value.clone());
    }
    let execution = &config.raw().execution.tools;
    let mut bound: Vec<BoundTool> = Vec::with_capacity(spec.tools.len());
    for (index, reference) in spec.tools.iter().enumerate() {
        let at = |key: &str, message: String| {
            LoomError::from(config.error_at_agent(name, &format!("tools[{index}].{key}"), message))
        };
        let Some(tool) = tools.get(&reference.tool) else {
            let registered: Vec<&str> = tools.keys().map(String::as_str).collect();
            let registered = if registered.is_empty() {
                "none".to_owned()
            } else {
                registered.join(", ")
            };
            return Err(at(
                "tool",
                format!(
                    "unknown tool '{}' (registered tools: {registered})",
                    reference.tool
                ),
            ));
        };
        if bound.iter().any(|b| b.name() == reference.tool) {
            return Err(at(
                "tool",
                format!("tool '{}' is listed twice", reference.tool),
            ));
        }
        let mut declarations: ToolDeclarations = tool.spec().declarations.clone();
        if let Some(side_effects) = reference.side_effects {
            declarations.side_effects = side_effects;
        }
        if let Some(approval) = reference.approval {
            declarations.approval = approval;
        }
        if let Some(idempotent) = reference.idempotent {
            declarations.idempotent = idempotent;
        }
        if let Some(timeout) = reference.timeout {
            let timeout = seconds(timeout)
                .ok_or_else(|| at("timeout", format!("{timeout} s is not a usable duration")))?;
            declarations.timeout = Some(timeout);
        }
        if let Some(offload_over) = reference.offload_over {
            declarations.offload_over = Some(offload_over);
        }
        let from_yaml = |yaml: bool, key: &'static str| if yaml { key } else { "tool" };
        if declarations.approval != Approval::Never {
            return Err(at(
                from_yaml(reference.approval.is_some(), "approval"),
                format!(
                    "tool '{}' requires human approval, which this version cannot provide yet \
                     (durable approvals are not implemented); use approval: never",
                    reference.tool
                ),
            ));
        }
        if declarations.on_unknown == OnUnknown::Pause {
            return Err(at(
                "tool",
                format!(
                    "tool '{}' declares on_unknown: pause, which needs human approvals (not implemented yet)",
                    reference.tool
                ),
            ));
        }
        if declarations.offload_over.is_some() {
            return Err(at(
                from_yaml(reference.offload_over.is_some(), "offload_over"),
                format!(
                    "tool '{}' declares offload_over, but moving large results out of the context \
                     is not implemented yet",
                    reference.tool
                ),
            ));
        }
        let description = reference
            .description
            .clone()
            .unwrap_or_else(|| tool.spec().description.clone());
        let bound_tool = BoundTool::new(tool.clone(), declarations, description)
            .map_err(|e| at("tool", e.to_string()))?;
        bound.push(bound_tool);
    }
    Ok(AgentRuntime {
        name: spec.name.clone(),
        system: config.render_system(name, tenant)?,
        main: ModelBinding {
            config_id: model_spec.id.clone(),
            model_id: model_spec.model.clone(),
            client,
            pricing: model_spec.pricing.clone(),
            max_tokens: spec.main.llm.max_tokens.or(model_spec.max_tokens),
            params,
        },
        tools: bound,
        max_iterations: spec.max_iterations,
        timeout: match spec.timeout {
            Some(secs) => Some(seconds(secs).ok_or_else(|| {
                config.error_at_agent(
                    name,
                    "timeout",
                    format!("{secs} s is not a usable duration"),
                )
            })?),
            None => None,
        },
        tool_timeout: match execution.timeout {
            Some(secs) => Some(seconds(secs).ok_or_else(|| {
                config.error_at_root("execution.tools.timeout", "not a usable duration")
            })?),
            None => None,
        },
        validate_arguments: execution.validate_arguments,
    })
}

/// A positive number of seconds as a duration, `None` when it cannot be one (too large).
fn seconds(secs: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
}
