//! The built-in tool source kind `forge`: `params` are `catalog_dir` (required, relative to
//! the configuration's directory; the catalog is `<catalog_dir>/<tenant>/<tool>/`) and
//! `sandbox` (optional: the keys of an agent's `sandbox:` but `scope`, since every example and
//! every call runs in a fresh working folder; the local backend's root defaults to
//! `<catalog_dir>/.sandbox`). See `loom_sandbox::forge` for the tools.

use std::{path::PathBuf, sync::Arc};

use loom_config::{SandboxBackend, SandboxSpec};
use loom_core::{ports::ToolSource, sandbox::Sandbox};
use loom_sandbox::forge::{ForgeSource, catalog::Catalog, runner::Runner};
use serde::Deserialize;
use serde_json::Value;

use crate::tool_sources::{SourceFactoryError, SourceRequest};

/// The `params` of a `forge` source.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForgeParams {
    /// The catalog's root.
    catalog_dir: PathBuf,
    /// The sandbox examples and calls run in.
    #[serde(default)]
    sandbox: serde_json::Map<String, Value>,
}

/// Builds a `forge` source.
pub(crate) fn build(
    request: &SourceRequest<'_>,
) -> Result<Arc<dyn ToolSource>, SourceFactoryError> {
    let params: ForgeParams = serde_json::from_value(request.params.clone())
        .map_err(|error| SourceFactoryError::new(format!("params: {error}")))?;
    if params.catalog_dir.as_os_str().is_empty() {
        return Err(SourceFactoryError::at("catalog_dir", "must not be empty"));
    }
    let catalog_dir = request.base_dir.join(&params.catalog_dir);
    if params.sandbox.contains_key("scope") {
        return Err(SourceFactoryError::at(
            "sandbox.scope",
            "does not apply to the forge: every example and every call runs in a fresh working \
             folder",
        ));
    }
    let spec: SandboxSpec = serde_json::from_value(Value::Object(params.sandbox))
        .map_err(|error| SourceFactoryError::at("sandbox", error.to_string()))?;
    let limits = crate::resolve::sandbox_limits(&spec);
    let given = spec.limits;
    for (key, value) in [
        ("wall_ms", given.wall_ms),
        ("cpu_ms", given.cpu_ms),
        ("memory_mb", given.memory_mb),
        ("output_bytes", given.output_bytes),
        ("processes", given.processes),
        ("file_mb", given.file_mb),
    ] {
        if value == Some(0) {
            return Err(SourceFactoryError::at(
                format!("sandbox.limits.{key}"),
                "must be at least 1",
            ));
        }
    }
    let sandbox: Arc<dyn Sandbox> = match spec.backend {
        SandboxBackend::Local => {
            let root = spec.root.as_ref().map_or_else(
                || catalog_dir.join(".sandbox"),
                |root| request.base_dir.join(root),
            );
            Arc::new(
                loom_sandbox::LocalSandbox::new(root)
                    .map_err(|e| SourceFactoryError::at("sandbox", e.to_string()))?,
            )
        }
        SandboxBackend::Remote => crate::resolve::remote_sandbox(&spec)
            .map_err(|message| SourceFactoryError::at("sandbox", message))?,
    };
    Ok(Arc::new(ForgeSource::new(
        request.name,
        Catalog::new(catalog_dir),
        Runner {
            sandbox,
            limits,
            network: spec.network,
        },
    )))
}
