//! Tool sources declared in `tool_sources` (`{name, kind, params, tools}`): built by a factory
//! registered in code under the `kind` ([`Loom::register_source`](crate::Loom::register_source)),
//! or by the built-in kinds `openapi` (feature `openapi`, `openapi_source.rs`) and `forge`
//! (`forge_source.rs`).
//!
//! A factory is called once per source and tenant, with the source's name, its `params` as
//! written, the tenant's secrets (read by name through [`crate::secrets`], never journaled)
//! and the configuration's directory; what it returns is the engine's [`ToolSource`] port. Its
//! tools are named `<source>__<tool>` (a bare name gets the prefix), and the declarations of
//! `tool_sources[].tools` are applied over the source's own.
//!
//! When the configuration is opened, the sources whose kind is already known (the built-in
//! ones) are built, so a refused `params` is a located error at load; a kind registered in code
//! later is checked when an agent is resolved to run, and a kind nobody registered is a located
//! error naming the kinds that are.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex, RwLock},
};

use loom_config::{Config, ToolOverrides};
use loom_core::{
    BoxFuture,
    ids::is_valid_name,
    ports::{SourceContext, SourceError, ToolSource},
    tool::Tool,
};

use crate::{LoomError, resolve::Stage, sources::Declared};

/// A source whose tools are known when it is built: every run is offered the same ones, and
/// there is nothing to release. What most factories return.
#[derive(Debug)]
pub struct FixedSource {
    name: String,
    tools: Vec<Arc<dyn Tool>>,
}

impl FixedSource {
    /// The source `name` offering `tools` (bare names get the `<source>__` prefix when the
    /// source is declared in `tool_sources`).
    pub fn new(name: impl Into<String>, tools: Vec<Arc<dyn Tool>>) -> FixedSource {
        FixedSource {
            name: name.into(),
            tools,
        }
    }
}

impl ToolSource for FixedSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn open<'a>(
        &'a self,
        _ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, SourceError>> {
        Box::pin(async move { Ok(self.tools.clone()) })
    }

    fn release<'a>(&'a self, _ctx: &'a SourceContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// What builds a tool source of one `kind`: object safe, shared as `Arc<dyn SourceFactory>`.
/// Any `Fn(&SourceRequest) -> Result<Arc<dyn ToolSource>, SourceFactoryError>` is one.
pub trait SourceFactory: Send + Sync {
    /// Builds the source `request` describes, checking its `params`.
    fn build(&self, request: &SourceRequest<'_>)
    -> Result<Arc<dyn ToolSource>, SourceFactoryError>;
}

impl<F> SourceFactory for F
where
    F: Fn(&SourceRequest<'_>) -> Result<Arc<dyn ToolSource>, SourceFactoryError> + Send + Sync,
{
    fn build(
        &self,
        request: &SourceRequest<'_>,
    ) -> Result<Arc<dyn ToolSource>, SourceFactoryError> {
        self(request)
    }
}

/// What a [`SourceFactory`] is given.
#[derive(Debug)]
pub struct SourceRequest<'a> {
    /// The source's name (`tool_sources[].name`), the prefix of its tools.
    pub name: &'a str,
    /// Its `params`, as written.
    pub params: &'a serde_json::Value,
    /// The secrets of the tenant the source is built for.
    pub secrets: SourceSecrets<'a>,
    /// The configuration's directory (relative paths in `params` are relative to it).
    pub base_dir: &'a Path,
}

/// The secrets of one tenant, read by name: the tenant's own source when it redirects the name
/// (`tenants[].secrets`), else the environment variable of that name.
#[derive(Clone, Copy)]
pub struct SourceSecrets<'a> {
    config: &'a Config,
    tenant: &'a str,
}

impl std::fmt::Debug for SourceSecrets<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceSecrets")
            .field("tenant", &self.tenant)
            .finish_non_exhaustive()
    }
}

impl SourceSecrets<'_> {
    /// The tenant the secrets are of.
    pub fn tenant(&self) -> &str {
        self.tenant
    }

    /// The value of the secret `name`; absent or empty, an error naming the secret and the
    /// tenant (never a value).
    pub fn get(&self, name: &str) -> Result<String, SourceFactoryError> {
        match crate::secrets::secret(self.config, self.tenant, name) {
            Ok(Some(value)) => Ok(value),
            Ok(None) => Err(SourceFactoryError::new(format!(
                "the secret {name} is absent or empty for tenant '{}'",
                self.tenant
            ))),
            Err(error) => Err(SourceFactoryError::new(error.to_string())),
        }
    }
}

/// Why a factory refused to build a source; located at `tool_sources[i].params.<key>` when it
/// names a key, else at the source.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct SourceFactoryError {
    /// The key under `params` that is wrong (`operations[1]`), if one is.
    pub key: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl SourceFactoryError {
    /// An error about the source as a whole.
    pub fn new(message: impl Into<String>) -> SourceFactoryError {
        SourceFactoryError {
            key: None,
            message: message.into(),
        }
    }

    /// An error about the key `key` of its `params`.
    pub fn at(key: impl Into<String>, message: impl Into<String>) -> SourceFactoryError {
        SourceFactoryError {
            key: Some(key.into()),
            message: message.into(),
        }
    }
}

/// The factories by kind, and the sources built, by source and tenant.
pub(crate) struct ToolSources {
    factories: RwLock<BTreeMap<String, Arc<dyn SourceFactory>>>,
    built: Mutex<BTreeMap<(String, String), Arc<dyn ToolSource>>>,
}

impl Default for ToolSources {
    /// The built-in kinds only.
    fn default() -> Self {
        let mut factories: BTreeMap<String, Arc<dyn SourceFactory>> = BTreeMap::new();
        factories.insert(
            "forge".into(),
            Arc::new(crate::forge_source::build) as Arc<dyn SourceFactory>,
        );
        #[cfg(feature = "openapi")]
        factories.insert(
            "openapi".into(),
            Arc::new(crate::openapi_source::build) as Arc<dyn SourceFactory>,
        );
        ToolSources {
            factories: RwLock::new(factories),
            built: Mutex::new(BTreeMap::new()),
        }
    }
}

impl ToolSources {
    /// Registers `factory` under `kind`; a kind already registered is refused.
    pub(crate) fn register(
        &self,
        kind: &str,
        factory: Arc<dyn SourceFactory>,
    ) -> Result<(), LoomError> {
        if kind.trim().is_empty() {
            return Err(LoomError::Registration(
                "a tool source kind must not be empty".into(),
            ));
        }
        let mut factories = self
            .factories
            .write()
            .map_err(|_| LoomError::Registration("registry lock poisoned".into()))?;
        if factories.contains_key(kind) {
            return Err(LoomError::Registration(format!(
                "a tool source kind '{kind}' is already registered"
            )));
        }
        factories.insert(kind.to_owned(), factory);
        Ok(())
    }

    /// Registers in `other` every factory registered here whose kind it lacks.
    pub(crate) fn share_into(&self, other: &ToolSources) {
        let mine = self.factories.read().unwrap_or_else(|p| p.into_inner());
        let mut theirs = other.factories.write().unwrap_or_else(|p| p.into_inner());
        for (kind, factory) in mine.iter() {
            theirs
                .entry(kind.clone())
                .or_insert_with(|| factory.clone());
        }
    }

    /// The source `name` for `tenant`'s runs, built now if needed; `None` when the
    /// configuration is being opened and its kind is not registered yet.
    pub(crate) fn source(
        &self,
        config: &Config,
        name: &str,
        tenant: &str,
        stage: Stage,
    ) -> Result<Option<Arc<dyn ToolSource>>, LoomError> {
        let Some((index, spec)) = config.tool_source(name) else {
            return Err(LoomError::Registration(format!(
                "no tool source '{name}' is declared"
            )));
        };
        let key = (name.to_owned(), tenant.to_owned());
        let mut built = self.built.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(source) = built.get(&key) {
            return Ok(Some(source.clone()));
        }
        let factory = {
            let factories = self.factories.read().unwrap_or_else(|p| p.into_inner());
            match factories.get(&spec.kind) {
                Some(factory) => factory.clone(),
                None if stage == Stage::Open => return Ok(None),
                None => {
                    let kinds: Vec<&str> = factories.keys().map(String::as_str).collect();
                    let kinds = if kinds.is_empty() {
                        "none".to_owned()
                    } else {
                        kinds.join(", ")
                    };
                    return Err(config
                        .error_at_root(
                            &format!("tool_sources[{index}].kind"),
                            format!(
                                "unknown tool source kind '{}' (registered kinds: {kinds}); \
                                 register it with Loom::register_source",
                                spec.kind
                            ),
                        )
                        .into());
                }
            }
        };
        let params = serde_json::Value::Object(spec.params.clone());
        let request = SourceRequest {
            name,
            params: &params,
            secrets: SourceSecrets { config, tenant },
            base_dir: config.base_dir(),
        };
        let source = factory.build(&request).map_err(|error| {
            let key = match &error.key {
                Some(key) => format!("tool_sources[{index}].params.{key}"),
                None => format!("tool_sources[{index}]"),
            };
            LoomError::from(config.error_at_root(
                &key,
                format!(
                    "tool source '{name}' (kind '{}', tenant '{tenant}'): {}",
                    spec.kind, error.message
                ),
            ))
        })?;
        let source: Arc<dyn ToolSource> = Arc::new(Prefixed {
            inner: source,
            name: name.to_owned(),
            overrides: spec.tools.clone(),
        });
        built.insert(key, source.clone());
        Ok(Some(source))
    }

    /// Shuts every built source down.
    pub(crate) async fn shutdown(&self) {
        let built: Vec<Arc<dyn ToolSource>> = self
            .built
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for source in built {
            source.shutdown().await;
        }
    }
}

/// A factory's source under its configured name: tools prefixed `<name>__`, with the
/// declarations of `tool_sources[].tools` over their own.
#[derive(Debug)]
struct Prefixed {
    inner: Arc<dyn ToolSource>,
    name: String,
    overrides: BTreeMap<String, ToolOverrides>,
}

impl Prefixed {
    fn adapt(&self, tool: Arc<dyn Tool>) -> Option<Arc<dyn Tool>> {
        let prefix = format!("{}__", self.name);
        let mut spec = tool.spec().clone();
        let bare = spec
            .name
            .strip_prefix(&prefix)
            .unwrap_or(&spec.name)
            .to_owned();
        spec.name = format!("{prefix}{bare}");
        if !is_valid_name(&spec.name) {
            tracing::warn!(source = %self.name, tool = %spec.name, "tool name invalid (^[A-Za-z0-9_-]{{1,64}}$); dropped");
            return None;
        }
        if let Some(overrides) = self.overrides.get(&bare) {
            crate::sources::apply_overrides(&mut spec, overrides);
        }
        Some(Arc::new(Declared::new(tool, spec)))
    }
}

impl ToolSource for Prefixed {
    fn name(&self) -> &str {
        &self.name
    }

    fn open<'a>(
        &'a self,
        ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, SourceError>> {
        Box::pin(async move {
            let tools = self.inner.open(ctx).await?;
            Ok(tools.into_iter().filter_map(|t| self.adapt(t)).collect())
        })
    }

    fn release<'a>(&'a self, ctx: &'a SourceContext) -> BoxFuture<'a, ()> {
        self.inner.release(ctx)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        self.inner.shutdown()
    }
}
