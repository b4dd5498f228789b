//! # Loom
//!
//! Run AI agents whose every fact is journaled.

pub use loom_core as core;
pub use loom_core::tool::{FnTool, IntoToolOutput, Json, Tool, ToolContext, ToolError, ToolOutput};
pub use loom_macros::tool;

#[doc(hidden)]
pub mod __private {
    //! Paths used by the code `#[tool]` generates. Not a public API.
    pub use loom_core::BoxFuture;
    pub use loom_core::tool::{
        Approval, FnTool, IntoToolOutput, Json, OnUnknown, SideEffects, ToolContext, ToolDeclarations,
        ToolError, ToolKind, ToolOutput, ToolSpec, schema_description, schema_for,
    };
    pub use schemars;
    pub use serde;
    pub use serde_json;

    /// Runs a synchronous tool function on the blocking thread pool.
    pub async fn run_blocking<T: Send + 'static>(
        function: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ToolError> {
        tokio::task::spawn_blocking(function)
            .await
            .map_err(|error| ToolError::new(format!("the tool stopped abnormally: {error}")))
    }
}
