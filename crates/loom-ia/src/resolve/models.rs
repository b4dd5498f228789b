//! Model clients, built once when the configuration is opened, and the bindings of agents'
//! slots to them.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use loom_config::{Config, ConfigError, ModelSpec, Sdk};
use loom_core::{
    BoxStream,
    model::{ModelChunk, ModelClient, ModelError, ModelErrorKind, ModelRequest},
};
use loom_engine::ModelBinding;
use loom_models::FakeModel;

use super::{Resolver, Stage};
use crate::LoomError;

/// The clients of the declared models, as one tenant's runs use them.
type Clients = BTreeMap<String, Result<Arc<dyn ModelClient>, ConfigError>>;

/// The clients of the declared models; a provider that cannot be set up (a missing API key
/// variable) is only an error for the agents that use it. A tenant that reads a model's API key
/// from its own secret (`tenants[].secrets`) or captures otherwise (`tenants[].telemetry`) has
/// its own client of that model.
#[derive(Default)]
pub(crate) struct Models {
    /// The clients of every tenant that has none of its own.
    common: Clients,
    /// The tenants' own clients, by tenant then model id.
    tenants: BTreeMap<String, Clients>,
    /// Clients plugged in place of declared models ([`crate::Loom::register_model`]), by model
    /// id, for every tenant.
    plugged: std::sync::RwLock<BTreeMap<String, Arc<dyn ModelClient>>>,
}

impl Models {
    /// Plugs `client` in place of the declared model `id`, for every tenant.
    pub(crate) fn plug(&self, id: &str, client: Arc<dyn ModelClient>) {
        match self.plugged.write() {
            Ok(mut plugged) => plugged.insert(id.to_owned(), client),
            Err(poisoned) => poisoned.into_inner().insert(id.to_owned(), client),
        };
    }

    /// The client plugged in place of model `id`, if any.
    fn plugged(&self, id: &str) -> Option<Arc<dyn ModelClient>> {
        match self.plugged.read() {
            Ok(plugged) => plugged.get(id).cloned(),
            Err(poisoned) => poisoned.into_inner().get(id).cloned(),
        }
    }

    /// The client of model `id` for `tenant`'s runs.
    fn get(&self, tenant: &str, id: &str) -> Option<&Result<Arc<dyn ModelClient>, ConfigError>> {
        self.tenants
            .get(tenant)
            .and_then(|own| own.get(id))
            .or_else(|| self.common.get(id))
    }
}

/// Builds the client of every declared model, and the tenants' own clients.
pub(crate) fn models(config: &Config) -> Result<Models, LoomError> {
    let mut models = Models {
        common: clients(config, None)?,
        ..Models::default()
    };
    for tenant in &config.raw().tenants {
        let own = clients(config, Some(&tenant.id))?;
        if !own.is_empty() {
            models.tenants.insert(tenant.id.clone(), own);
        }
    }
    Ok(models)
}

/// Whether `tenant` needs its own client of `spec`: it reads the model's API key from its own
/// secret, or captures exchanges otherwise than the root.
fn own_client(config: &Config, tenant: &str, spec: &ModelSpec) -> bool {
    spec.sdk != Sdk::Fake
        && (spec
            .api_key_env
            .as_ref()
            .is_some_and(|name| config.tenant_secret(tenant, name).is_some())
            || config.capture_for(tenant) != config.raw().telemetry.capture)
}

/// The clients of the declared models: every one (`tenant` `None`), or those `tenant` needs of
/// its own.
fn clients(config: &Config, tenant: Option<&str>) -> Result<Clients, LoomError> {
    let mut clients: Clients = BTreeMap::new();
    for (index, spec) in config.raw().models.iter().enumerate() {
        if let Some(tenant) = tenant
            && !own_client(config, tenant, spec)
        {
            continue;
        }
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
            // A build without the SDK's feature cannot run the model in any environment:
            // refused when the configuration is opened, used by an agent or not.
            Sdk::Anthropic | Sdk::Openai if !compiled(spec.sdk) => {
                return Err(missing_feature(config, index, spec));
            }
            Sdk::Anthropic | Sdk::Openai => {
                let tenant = tenant.unwrap_or(loom_config::DEFAULT_TENANT);
                match build_provider(config, index, spec, tenant) {
                    Ok(client) => Ok(client),
                    Err(LoomError::Config(error)) => Err(*error),
                    Err(other) => return Err(other),
                }
            }
        };
        clients.insert(spec.id.clone(), client);
    }
    Ok(clients)
}

/// Stands for a model whose client could not be set up while the configuration is checked
/// at open ([`Stage::Open`]): the runtime built then is never run.
#[derive(Debug)]
struct NotSetUp;

impl ModelClient for NotSetUp {
    fn provider(&self) -> &str {
        "not-set-up"
    }

    fn stream(
        &self,
        _request: &ModelRequest,
    ) -> BoxStream<'static, Result<ModelChunk, ModelError>> {
        Box::pin(futures_util::stream::once(async {
            Err(ModelError::new(
                ModelErrorKind::Auth,
                "the model's client could not be set up",
            ))
        }))
    }
}

impl Resolver<'_> {
    /// The client of `model`: the one plugged in its place, else its own. When the
    /// configuration is opened ([`Stage::Open`]), a client that could not be set up (an absent
    /// API key variable) is the environment's matter: it stands as [`NotSetUp`] and is refused
    /// when the agent is resolved to run.
    fn client(&self, model: &ModelSpec) -> Result<Arc<dyn ModelClient>, LoomError> {
        if let Some(client) = self.models.plugged(&model.id) {
            return Ok(client);
        }
        match self.models.get(self.tenant, &model.id) {
            Some(Ok(client)) => Ok(client.clone()),
            Some(Err(_)) if self.stage == Stage::Open => Ok(Arc::new(NotSetUp)),
            Some(Err(error)) => Err(error.clone().into()),
            None => Err(self
                .config
                .error_at_root("models", format!("model '{}' has no client", model.id))
                .into()),
        }
    }

    /// The engine's view of a declared model in a slot: client, pricing, slot settings over
    /// the model's, retry policy, timeouts and breaker.
    pub(super) fn binding(
        &self,
        model: &ModelSpec,
        llm: &loom_config::LlmSettings,
    ) -> Result<ModelBinding, LoomError> {
        let config = self.config;
        let client = self.client(model)?;
        let index = config
            .raw()
            .models
            .iter()
            .position(|m| m.id == model.id)
            .unwrap_or(0);
        let duration = |key: &str, secs: f64| {
            Duration::try_from_secs_f64(secs).map_err(|_| {
                LoomError::from(
                    config
                        .error_at_root(&format!("models[{index}].{key}"), "not a usable duration"),
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
        binding.params = Arc::new(params);
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
        binding.vision = model.capabilities.vision;
        binding.forced_tool_choice = model.capabilities.forced_tool_choice;
        Ok(binding)
    }
}

/// Whether this build has the provider adapter of `sdk`.
fn compiled(sdk: Sdk) -> bool {
    match sdk {
        Sdk::Fake => true,
        Sdk::Anthropic => cfg!(feature = "anthropic"),
        Sdk::Openai => cfg!(feature = "openai"),
    }
}

/// The refusal of a model whose `sdk` needs a Cargo feature this build lacks.
fn missing_feature(config: &Config, index: usize, spec: &ModelSpec) -> LoomError {
    let sdk = spec.sdk.as_str();
    config
        .error_at_root(
            &format!("models[{index}].sdk"),
            format!(
                "model '{}': sdk '{sdk}' needs the Cargo feature '{sdk}' of loom-ia, which this build does not have",
                spec.id
            ),
        )
        .into()
}

/// The client of a real provider whose feature is built in.
#[cfg(any(feature = "anthropic", feature = "openai"))]
fn build_provider(
    config: &Config,
    index: usize,
    spec: &ModelSpec,
    tenant: &str,
) -> Result<Arc<dyn ModelClient>, LoomError> {
    use loom_providers::ProviderOptions;

    let api_key = match &spec.api_key_env {
        Some(variable) if config.tenant_secret(tenant, variable).is_some() => {
            Some(crate::secrets::required(
                config,
                tenant,
                variable,
                &format!("models[{index}].api_key_env"),
            )?)
        }
        Some(variable) => {
            match crate::secrets::secret(config, tenant, variable)? {
                Some(value) => Some(value),
                None => {
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
        capture: config.capture_for(tenant).raw_limit(),
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
                streaming: capabilities.streaming,
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
                streaming: capabilities.streaming,
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
                streaming: capabilities.streaming,
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

#[cfg(not(any(feature = "anthropic", feature = "openai")))]
fn build_provider(
    config: &Config,
    index: usize,
    spec: &ModelSpec,
    _tenant: &str,
) -> Result<Arc<dyn ModelClient>, LoomError> {
    Err(config
        .error_at_root(
            &format!("models[{index}].sdk"),
            format!("model '{}': no provider adapter is built in", spec.id),
        )
        .into())
}

#[cfg(all(test, not(feature = "anthropic")))]
mod tests {
    /// A model whose SDK this build lacks is refused when the configuration is opened, even
    /// when no agent uses it (a build matter, not the environment's).
    #[test]
    fn an_unused_model_of_a_missing_sdk_is_refused_at_open() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("loom.yaml"),
            "version: 1\nmodels:\n  - {id: fake-1, sdk: fake, model: m}\n  - {id: claude, sdk: anthropic, model: claude-x, api_key_env: K}\nagents:\n  - {name: a, main: {model: fake-1}}\n",
        )
        .unwrap();
        let error = crate::Loom::from_config(dir.path().join("loom.yaml")).unwrap_err();
        assert!(
            error.to_string().contains(
                "models[1].sdk: model 'claude': sdk 'anthropic' needs the Cargo feature 'anthropic'"
            ),
            "{error}"
        );
    }
}
