//! `tool_sources`: a source of tools built by a factory registered in code under a `kind`
//! (`Loom::register_source`), or by a built-in kind (`openapi`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::ToolOverrides;

/// A tool source whose tools agents may use (`tools: [{source: <name>}]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolSourceSpec {
    /// Name, and prefix of its tools (`<name>__<tool>`).
    #[schemars(regex(pattern = r"^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$"), length(max = 40))]
    pub name: String,
    /// The factory that builds it: a kind registered in code, or the built-in `openapi`
    /// (`entry_point` is accepted for users of the Python reference).
    #[serde(alias = "entry_point")]
    #[schemars(length(min = 1))]
    pub kind: String,
    /// Handed as they are to the factory, which checks them.
    #[serde(default)]
    pub params: serde_json::Map<String, serde_json::Value>,
    /// Declarations per tool (names without the prefix), over the source's own.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolOverrides>,
}
