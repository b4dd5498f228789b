//! From configuration and registered code to what the engine runs.
//!
//! Models are built once, when the configuration is loaded. Agents are resolved against the
//! registered tools when first used (or by [`crate::Loom::validate`]), so tools can be
//! registered after loading; every refusal names the file, line and key of the reference.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use loom_builtins::{FetchOptions, Folder, Right, Rights};
use loom_config::{Config, ConfigError, FolderRight, ModelSpec, Sdk};
use loom_core::{
    model::ModelClient,
    ports::ToolSource,
    tool::{Approval, OnUnknown, Tool, ToolDeclarations},
};
use loom_engine::{AgentRuntime, BoundSource, BoundTool, ModelBinding};

use crate::sources::AgentSource;
use loom_models::FakeModel;

use crate::LoomError;

/// The clients of the declared models; a provider that cannot be set up (a missing API key
/// variable) is only an error for the agents that use it.
pub(crate) type Models = BTreeMap<String, Result<Arc<dyn ModelClient>, ConfigError>>;

/// Builds the client of every declared model.
pub(crate) fn models(config: &Config) -> Result<Models, LoomError> {
    let mut clients: Models = BTreeMap::new();
    for (index, spec) in config.raw().models.iter().enumerate() {
        let client: Result<Arc<dyn ModelClient>, ConfigError> = match spec.sdk {
            Sdk::Fake => {
                let model =
                    FakeModel::from_params(spec.model.clone(), &spec.params).map_err(|e| {
                        config.error_at_root(
                            &format!("models[{index}].params.script{}", e.path),
                            e.message,
                        )
                    })?;
                Ok(Arc::new(model))
            }
            Sdk::Anthropic | Sdk::Openai => match provider(config, index, spec) {
                Ok(client) => Ok(client),
                Err(LoomError::Config(error)) => Err(*error),
                Err(other) => return Err(other),
            },
        };
        clients.insert(spec.id.clone(), client);
    }
    Ok(clients)
}

/// Resolves an agent for a tenant: rendered prompt, model binding, bound tools.
pub(crate) fn agent(
    config: &Config,
    models: &Models,
    tools: &BTreeMap<String, Arc<dyn Tool>>,
    sources: &BTreeMap<String, Arc<dyn ToolSource>>,
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
    if !spec.tools.is_empty() && !model_spec.capabilities.tools {
        return Err(config
            .error_at_agent(
                name,
                "main.model",
                format!("model '{}' cannot call tools (capabilities.tools: false) but the agent has tools", model_spec.id),
            )
            .into());
    }
    let execution = &config.raw().execution.tools;
    let mut bound: Vec<BoundTool> = Vec::with_capacity(spec.tools.len());
    let mut bound_sources: Vec<BoundSource> = Vec::new();
    for (index, reference) in spec.tools.iter().enumerate() {
        let at = |key: &str, message: String| {
            LoomError::from(config.error_at_agent(name, &format!("tools[{index}].{key}"), message))
        };
        if let Some(server) = &reference.mcp {
            let Some(source) = sources.get(server) else {
                return Err(at("mcp", format!("unknown MCP server '{server}'")));
            };
            for (tool, overrides) in &reference.tools {
                match overrides.approval {
                    Some(Approval::Policy) => {
                        return Err(at(
                            &format!("tools.{tool}.approval"),
                            loom_config::APPROVAL_POLICY.to_owned(),
                        ));
                    }
                    Some(Approval::Always) if !durable(config) => {
                        return Err(at(
                            &format!("tools.{tool}.approval"),
                            not_durable(&format!("{server}__{tool}")),
                        ));
                    }
                    _ => {}
                }
            }
            let agent_source = AgentSource::new(
                source.clone(),
                server,
                reference.alias.as_deref(),
                reference.include.clone(),
                reference.exclude.clone(),
                reference.tools.clone(),
            );
            bound_sources.push(BoundSource {
                source: Arc::new(agent_source),
                required: reference.required,
            });
            continue;
        }
        let tool_name = reference.tool.clone().unwrap_or_default();
        let tool: Arc<dyn Tool> = if tool_name.starts_with("loom.") {
            builtins(config, &tool_name, reference).map_err(|message| at("tool", message))?
        } else {
            let Some(tool) = tools.get(&tool_name) else {
                let registered: Vec<&str> = tools.keys().map(String::as_str).collect();
                let registered = if registered.is_empty() {
                    "none".to_owned()
                } else {
                    registered.join(", ")
                };
                return Err(at(
                    "tool",
                    format!("unknown tool '{tool_name}' (registered tools: {registered})"),
                ));
            };
            tool.clone()
        };
        let tool = &tool;
        if bound.iter().any(|b| b.name() == tool.spec().name) {
            return Err(at("tool", format!("tool '{tool_name}' is listed twice")));
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
        if declarations.approval == Approval::Policy {
            return Err(at(
                from_yaml(reference.approval.is_some(), "approval"),
                format!("tool '{tool_name}': {}", loom_config::APPROVAL_POLICY),
            ));
        }
        let can_pause = declarations.approval == Approval::Always
            || declarations.on_unknown == OnUnknown::Pause;
        if can_pause && !durable(config) {
            let key = from_yaml(reference.approval == Some(Approval::Always), "approval");
            return Err(at(key, not_durable(&tool_name)));
        }
        if declarations.business_key.is_some() && config.raw().storage.idempotency.is_none() {
            return Err(at(
                "tool",
                format!(
                    "tool '{tool_name}' declares a business key, which needs a shared durable \
                     idempotency store so that two runs never perform the same action twice; \
                     declare storage.idempotency: {{backend: sqlite, path: ...}}"
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
        main: binding(config, models, model_spec, &spec.main.llm)?,
        fallbacks: spec
            .main
            .fallbacks
            .iter()
            .enumerate()
            .map(|(f, id)| {
                let fallback = config.model(id).ok_or_else(|| {
                    LoomError::from(config.error_at_agent(name, &format!("main.fallbacks[{f}]"), format!("unknown model '{id}'")))
                })?;
                if !spec.tools.is_empty() && !fallback.capabilities.tools {
                    return Err(config
                        .error_at_agent(
                            name,
                            &format!("main.fallbacks[{f}]"),
                            format!("fallback model '{id}' cannot call tools (capabilities.tools: false) but the agent has tools"),
                        )
                        .into());
                }
                binding(config, models, fallback, &spec.main.llm)
            })
            .collect::<Result<Vec<_>, LoomError>>()?,
        tools: bound,
        sources: bound_sources,
        offload_over: execution.offload_over,
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
        approval: loom_engine::ApprovalSettings {
            expires_in: match spec.approval.expires_in {
                Some(secs) => Some(seconds(secs).ok_or_else(|| {
                    config.error_at_agent(
                        name,
                        "approval.expires_in",
                        format!("{secs} s is not a usable duration"),
                    )
                })?),
                None => None,
            },
            on_expiry: spec.approval.on_expiry,
        },
        policies: Vec::new(),
        output: None,
        subagents: Vec::new(),
        max_depth: 1,
    })
}

/// Whether paused runs survive the process: any journal but `memory`, or the `dev` profile
/// (where losing them at exit is accepted).
fn durable(config: &Config) -> bool {
    config.raw().storage.events.backend != loom_config::EventsBackend::Memory
        || config.profile() == Some(loom_config::Profile::Dev)
}

/// Why a tool that can pause the run is refused on the memory journal.
fn not_durable(tool: &str) -> String {
    format!(
        "tool '{tool}' can pause the run for a human decision (approval: always or on_unknown: pause), \
         which needs a durable journal: with the memory journal a paused run is lost at exit; \
         use storage.events.backend: jsonl (or the dev profile)"
    )
}

/// A built-in tool (`tool: loom.<name>`) with its parameters.
fn builtins(
    config: &Config,
    name: &str,
    reference: &loom_config::ToolRef,
) -> Result<Arc<dyn Tool>, String> {
    match name {
        "loom.current_datetime" => Ok(Arc::new(loom_builtins::current_datetime(Arc::new(
            crate::SystemClock,
        )))),
        "loom.local_files" => {
            let mut folders = Vec::new();
            for folder in reference.folders.iter().flatten() {
                let rights = Rights::list(folder.rights.iter().map(|right| match right {
                    FolderRight::Read => Right::Read,
                    FolderRight::Write => Right::Write,
                    FolderRight::Overwrite => Right::Overwrite,
                    FolderRight::Delete => Right::Delete,
                }));
                let needing: Vec<&str> = rights
                    .needing_approval()
                    .into_iter()
                    .map(Right::as_str)
                    .collect();
                if !needing.is_empty() {
                    return Err(format!(
                        "folder '{}': the rights {} need human approval by default, which this version \
                         cannot provide yet; grant read and write only",
                        folder.name,
                        needing.join(", ")
                    ));
                }
                folders.push(Folder::new(
                    folder.name.clone(),
                    config.base_dir().join(&folder.path),
                    rights,
                ));
            }
            loom_builtins::local_files(folders)
                .map(|t| Arc::new(t) as Arc<dyn Tool>)
                .map_err(|e| e.to_string())
        }
        "loom.fetch_page" => {
            let defaults = FetchOptions::default();
            Ok(Arc::new(loom_builtins::fetch_page(FetchOptions {
                allow_private: reference.allow_private.unwrap_or(false),
                max_bytes: reference.max_bytes.unwrap_or(defaults.max_bytes),
                ..defaults
            })))
        }
        other => Err(format!("unknown built-in tool '{other}'")),
    }
}

/// A positive number of seconds as a duration, `None` when it cannot be one (too large).
fn seconds(secs: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero())
}

/// The engine's view of a declared model in a slot: client, pricing, slot settings over the
/// model's, retry policy, timeouts and breaker.
fn binding(
    config: &Config,
    models: &Models,
    model: &ModelSpec,
    llm: &loom_config::LlmSettings,
) -> Result<ModelBinding, LoomError> {
    let client = match models.get(&model.id) {
        Some(Ok(client)) => client.clone(),
        Some(Err(error)) => return Err(error.clone().into()),
        None => {
            return Err(config
                .error_at_root("models", format!("model '{}' has no client", model.id))
                .into());
        }
    };
    let index = config
        .raw()
        .models
        .iter()
        .position(|m| m.id == model.id)
        .unwrap_or(0);
    let duration = |key: &str, secs: f64| {
        Duration::try_from_secs_f64(secs).map_err(|_| {
            LoomError::from(
                config.error_at_root(&format!("models[{index}].{key}"), "not a usable duration"),
            )
        })
    };
    let optional = |key: &str, secs: Option<f64>| secs.map(|s| duration(key, s)).transpose();
    let mut params = model.params.clone();
    for (key, value) in &llm.params {
        params.insert(key.clone(), value.clone());
    }
    let mut binding = ModelBinding::new(model.id.clone(), model.model.clone(), client);
    binding.pricing = model.pricing.clone();
    binding.max_tokens = llm.max_tokens.or(model.max_tokens);
    binding.params = params;
    binding.retry = loom_engine::RetryPolicy {
        max_attempts: model.retry.max_attempts,
        initial_delay: duration("retry.initial_delay", model.retry.initial_delay)?,
        multiplier: model.retry.multiplier,
        max_delay: duration("retry.max_delay", model.retry.max_delay)?,
    };
    binding.timeouts = loom_engine::ModelTimeouts {
        first_token: optional("timeouts.first_token", model.timeouts.first_token)?,
        idle: optional("timeouts.idle", model.timeouts.idle)?,
        total: optional("timeouts.total", model.timeouts.total)?,
    };
    binding.circuit = match &model.circuit_breaker {
        Some(breaker) => Some(loom_engine::CircuitSettings {
            failures: breaker.failures,
            cooldown: duration("circuit_breaker.cooldown", breaker.cooldown)?,
        }),
        None => None,
    };
    binding.context_window = model.capabilities.context_window;
    Ok(binding)
}

/// The client of a real provider, when its feature is built in.
fn provider(
    config: &Config,
    index: usize,
    spec: &ModelSpec,
) -> Result<Arc<dyn ModelClient>, LoomError> {
    let sdk = spec.sdk.as_str();
    let compiled = match spec.sdk {
        Sdk::Anthropic => cfg!(feature = "anthropic"),
        _ => cfg!(feature = "openai"),
    };
    if !compiled {
        return Err(config
            .error_at_root(
                &format!("models[{index}].sdk"),
                format!(
                    "model '{}': sdk '{sdk}' needs the Cargo feature '{sdk}' of loom-ia, which this build does not have",
                    spec.id
                ),
            )
            .into());
    }
    build_provider(config, index, spec)
}

#[cfg(any(feature = "anthropic", feature = "openai"))]
fn build_provider(
    config: &Config,
    index: usize,
    spec: &ModelSpec,
) -> Result<Arc<dyn ModelClient>, LoomError> {
    use loom_providers::ProviderOptions;

    let api_key = match &spec.api_key_env {
        Some(variable) => {
            match std::env::var(variable) {
                Ok(value) if !value.is_empty() => Some(value),
                _ => {
                    return Err(config
                    .error_at_root(
                        &format!("models[{index}].api_key_env"),
                        format!("model '{}': the environment variable {variable} is absent or empty", spec.id),
                    )
                    .into());
                }
            }
        }
        None => None,
    };
    let official = match spec.sdk {
        Sdk::Anthropic => "https://api.anthropic.com",
        _ => "https://api.openai.com/v1",
    };
    let options = ProviderOptions {
        base_url: spec.base_url.clone().unwrap_or_else(|| official.to_owned()),
        api_key,
        api_key_env: spec.api_key_env.clone(),
        model: spec.model.clone(),
        max_tokens: spec.max_tokens,
        headers: spec.headers.clone(),
        connect_timeout: Duration::from_secs(10),
        capture: capture(config),
    };
    let refused = |e: loom_providers::ProviderError| {
        LoomError::from(config.error_at_root(
            &format!("models[{index}]"),
            format!("model '{}': {e}", spec.id),
        ))
    };
    let capabilities = &spec.capabilities;
    match (spec.sdk, spec.effective_api()) {
        #[cfg(feature = "anthropic")]
        (Sdk::Anthropic, _) => {
            use loom_providers::anthropic::{AnthropicModel, AnthropicSettings, CacheSettings};
            let cache = spec.cache.clone().unwrap_or_default();
            let settings = AnthropicSettings {
                cache: CacheSettings {
                    system: cache.system,
                    tools: cache.tools,
                    messages: cache.messages,
                    ttl: cache.ttl,
                },
                vision: capabilities.vision,
                native_json: capabilities.native_json,
            };
            Ok(Arc::new(
                AnthropicModel::new(options, settings).map_err(refused)?,
            ))
        }
        #[cfg(feature = "openai")]
        (Sdk::Openai, loom_config::ModelApi::Chat) => {
            use loom_providers::openai_chat::{ChatSettings, OpenAiChatModel};
            let settings = ChatSettings {
                vision: capabilities.vision,
                native_json: capabilities.native_json,
                thinking: capabilities.reasoning,
            };
            Ok(Arc::new(
                OpenAiChatModel::new(options, settings).map_err(refused)?,
            ))
        }
        #[cfg(feature = "openai")]
        (Sdk::Openai, loom_config::ModelApi::Responses) => {
            use loom_providers::openai_responses::{OpenAiResponsesModel, ResponsesSettings};
            let settings = ResponsesSettings {
                vision: capabilities.vision,
                native_json: capabilities.native_json,
                reasoning: capabilities.reasoning,
            };
            Ok(Arc::new(
                OpenAiResponsesModel::new(options, settings).map_err(refused)?,
            ))
        }
        _ => Err(config
            .error_at_root(
                &format!("models[{index}].sdk"),
                format!("model '{}': this adapter is not built in", spec.id),
            )
            .into()),
    }
}

/// The body limit of raw-exchange capture (`telemetry.capture`), when it is on.
#[cfg(any(feature = "anthropic", feature = "openai"))]
fn capture(config: &Config) -> Option<usize> {
    config.raw().telemetry.capture.raw_limit()
}

#[cfg(not(any(feature = "anthropic", feature = "openai")))]
fn build_provider(
    config: &Config,
    index: usize,
    spec: &ModelSpec,
) -> Result<Arc<dyn ModelClient>, LoomError> {
    Err(config
        .error_at_root(
            &format!("models[{index}].sdk"),
            format!("model '{}': no provider adapter is built in", spec.id),
        )
        .into())
}
