//! What the integration tests of the built-in tools share: the context of a call.

use loom_core::tool::ToolContext;

/// The context of a call made outside any run.
pub(crate) fn ctx() -> ToolContext {
    ToolContext {
        tenant_id: "t".into(),
        session_id: "s".into(),
        run_id: "r".into(),
        call_id: "c".into(),
        idempotency_key: "k".into(),
        traceparent: None,
    }
}
