//! Refusals: the keys and values of the Loom-IA format that Loom does not have (yet), and the
//! reason `approval: policy` is refused; each is refused rather than silently ignored.

use crate::yaml::{self, KeyPath};

/// Why `approval: policy` is refused on an agent without a policy that can ask a human.
pub const APPROVAL_POLICY: &str = "approval: policy means a policy decides when a human is asked, \
but no policy of the agent is hooked on before_tool with the decision 'pause'; hook one, or use \
always (a human decides every call) or never";

/// Why a key of the Loom-IA format is refused: Rust tools are registered in code, and some
/// sections of the reference are not implemented yet (refused rather than silently ignored).
/// `path` is the key path of the unknown key, `field` its name.
pub(super) fn not_yet(path: &KeyPath, field: &str) -> &'static str {
    const LATER: &[&str] = &["stream_output"];
    let parent = &path.0[..path.0.len().saturating_sub(1)];
    let in_tenant = matches!(parent, [yaml::Seg::Key(k), yaml::Seg::Index(_)] if k == "tenants");
    let in_tenant_key = |key: &str| matches!(parent, [yaml::Seg::Key(k), yaml::Seg::Index(_), yaml::Seg::Key(s), ..] if k == "tenants" && s == key);
    let in_tool = matches!(
        parent,
        [.., yaml::Seg::Key(k), yaml::Seg::Index(_)] if k == "tools"
    );
    if field == "imports" {
        " — Rust has no runtime imports: register tools in code (Loom::register, loom_cli::App::tool)"
    } else if in_tool && field == "judge" {
        " — a tool's results are not judged: judges apply to an agent's answer or a role's; \
give the tool an 'output' contract"
    } else if in_tenant_key("storage") && matches!(field, "encryption" | "idempotency") {
        " — a tenant's encryption and idempotency store are the deployment's (storage.encryption, \
storage.idempotency): a tenant declares only its own journal (events) and files (artifacts)"
    } else if in_tenant_key("telemetry") && matches!(field, "redaction" | "exporters" | "logging") {
        " — a tenant overrides only its capture: logging, redaction and exporters are the \
deployment's (a tenant chooses whether its content is captured, not where it goes)"
    } else if field == "exports" && in_tenant_key("telemetry") {
        " — a tenant's exported spans carry what the deployment's telemetry.capture.exports says: \
a per-tenant choice is not implemented in this version"
    } else if in_tenant {
        ""
    } else if LATER.contains(&field) {
        NOT_YET
    } else {
        ""
    }
}

/// Why a key or value of the Loom-IA format is refused: Loom does not have it yet.
const NOT_YET: &str = " — this part of the Loom-IA format is not implemented in this version yet";

/// Why a value of the Loom-IA format is refused (`value` at `path`): the backends of the
/// reference that Loom does not have yet (the journal and memory idempotency stores).
pub(super) fn not_yet_value(path: &KeyPath, value: &str) -> &'static str {
    let path = path.to_string();
    let later: &[&str] = match path.as_str() {
        "storage.idempotency.backend" => &["journal", "memory"],
        _ => &[],
    };
    if later.contains(&value) { NOT_YET } else { "" }
}
