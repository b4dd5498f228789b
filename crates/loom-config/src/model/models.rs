//! `models`: a model declaration (`ModelSpec`), its SDK and API flavour, capabilities, time
//! limits, retries and prompt cache.

use std::collections::BTreeMap;

use loom_core::usage::Pricing;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::mcp::default_breaker;
use super::{CircuitBreaker, JsonObject};

/// A model declaration, referenced by `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Identifier used by agents (unique).
    #[schemars(length(min = 1))]
    pub id: String,
    /// Provider SDK.
    pub sdk: Sdk,
    /// API flavour; only with `sdk: openai` (default `chat`).
    #[serde(default)]
    pub api: Option<ModelApi>,
    /// The provider's model name.
    #[schemars(length(min = 1))]
    pub model: String,
    /// Endpoint override.
    #[serde(default)]
    pub base_url: Option<String>,
    /// NAME of the environment variable holding the API key (never the key itself).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Default output-token limit.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_tokens: Option<u32>,
    /// Passed through to the provider (the fake model reads `params.script`).
    #[serde(default)]
    pub params: JsonObject,
    /// What the model can do.
    #[serde(default)]
    pub capabilities: ModelCapabilities,
    /// Prices in dollars per million tokens.
    #[serde(default)]
    pub pricing: Pricing,
    /// Extra HTTP headers sent with every request (values are written here: no secrets).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Time limits of one call, in seconds (`null` disables one).
    #[serde(default)]
    pub timeouts: ModelTimeouts,
    /// Retries of transient failures.
    #[serde(default)]
    pub retry: RetryPolicy,
    /// Breaker over consecutive failures, shared by all runs of the process (`null` removes it).
    #[serde(default = "default_breaker")]
    pub circuit_breaker: Option<CircuitBreaker>,
    /// Anthropic prompt-cache breakpoints (refused for other SDKs).
    #[serde(default)]
    pub cache: Option<PromptCache>,
}

/// Time limits of one model call, in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelTimeouts {
    /// Until the first content chunk.
    pub first_token: Option<f64>,
    /// Between two chunks.
    pub idle: Option<f64>,
    /// The whole call.
    pub total: Option<f64>,
}

impl Default for ModelTimeouts {
    fn default() -> Self {
        ModelTimeouts {
            first_token: Some(60.0),
            idle: Some(60.0),
            total: Some(300.0),
        }
    }
}

/// Retries of transient failures: delay after attempt n = min(max_delay, initial_delay ×
/// multiplier^(n-1)) with jitter; a provider's Retry-After replaces it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryPolicy {
    /// Attempts in all (1 = no retry).
    #[schemars(range(min = 1))]
    pub max_attempts: u32,
    /// First delay, seconds.
    pub initial_delay: f64,
    /// Growth of the delay (≥ 1).
    pub multiplier: f64,
    /// Longest delay, seconds; a Retry-After above it abandons the model.
    pub max_delay: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 3,
            initial_delay: 1.0,
            multiplier: 2.0,
            max_delay: 30.0,
        }
    }
}

/// Anthropic prompt-cache breakpoints.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PromptCache {
    /// Cache the system prompt.
    pub system: bool,
    /// Cache the tool definitions.
    pub tools: bool,
    /// Cache the conversation up to the last user message.
    pub messages: bool,
    /// "5m" (default) or "1h".
    pub ttl: Option<String>,
}

impl ModelSpec {
    /// A model with every optional field at its default.
    pub fn new(id: impl Into<String>, sdk: Sdk, model: impl Into<String>) -> ModelSpec {
        ModelSpec {
            id: id.into(),
            sdk,
            api: None,
            model: model.into(),
            base_url: None,
            api_key_env: None,
            max_tokens: None,
            params: JsonObject::new(),
            capabilities: ModelCapabilities::default(),
            pricing: Pricing::default(),
            headers: BTreeMap::new(),
            timeouts: ModelTimeouts::default(),
            retry: RetryPolicy::default(),
            circuit_breaker: default_breaker(),
            cache: None,
        }
    }

    /// The API flavour in effect (`chat` unless `responses` is asked for).
    pub fn effective_api(&self) -> ModelApi {
        self.api.unwrap_or_default()
    }
}

/// Provider SDK of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Sdk {
    /// Anthropic Messages API.
    Anthropic,
    /// OpenAI (or compatible) API.
    Openai,
    /// Scripted model for tests (`params.script`).
    Fake,
}

impl Sdk {
    /// The SDK's name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Sdk::Anthropic => "anthropic",
            Sdk::Openai => "openai",
            Sdk::Fake => "fake",
        }
    }
}

/// OpenAI API flavour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ModelApi {
    /// Chat Completions.
    #[default]
    Chat,
    /// Responses API.
    Responses,
}

/// Declared capabilities of a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ModelCapabilities {
    /// Can call tools.
    pub tools: bool,
    /// Accepts images.
    pub vision: bool,
    /// Produces reasoning (alias `thinking`).
    #[serde(alias = "thinking")]
    pub reasoning: bool,
    /// Accepts a JSON output schema.
    pub native_json: bool,
    /// Can be forced to call a tool (`tool_choice: required`); needed by the policy
    /// `loom.require_tool`.
    pub forced_tool_choice: bool,
    /// Streams its answers. `false`, for servers that cannot stream: each call is one
    /// non-streamed request whose whole JSON answer is then read as the same chunks.
    pub streaming: bool,
    /// Context window in tokens, when known.
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub context_window: Option<u64>,
}

impl Default for ModelCapabilities {
    fn default() -> Self {
        ModelCapabilities {
            tools: true,
            vision: false,
            reasoning: false,
            native_json: false,
            forced_tool_choice: true,
            streaming: true,
            context_window: None,
        }
    }
}
