//! # loom-providers
//!
//! Model adapters for real providers, behind [`loom_core::model::ModelClient`]:
//! the Anthropic Messages API (feature `anthropic`) and the OpenAI Chat Completions and
//! Responses APIs (feature `openai`), which many other providers also speak (Ollama, vLLM,
//! OpenRouter, DeepSeek, Together, MiniMax…).
//!
//! Streaming is the primitive: each adapter turns the provider's server-sent events into
//! [`loom_core::model::ModelChunk`]s as they arrive. Errors are classified by kind (HTTP status
//! and the provider's error type or code, never by free message text except where a provider
//! gives nothing else), so the engine decides retries and fallbacks from the kind alone.
//!
//! **Architecture invariant:** adapters depend on `loom-core` only; retries, fallbacks, circuit
//! breakers and timeouts are the engine's (an adapter makes exactly one HTTP attempt).

pub mod capture;
pub mod error;
pub mod http;

#[cfg(feature = "anthropic")]
pub mod anthropic;
#[cfg(feature = "openai")]
pub mod openai_chat;
#[cfg(feature = "openai")]
pub mod openai_responses;

pub use error::{ErrorClass, ProviderError};
pub use http::ProviderOptions;
