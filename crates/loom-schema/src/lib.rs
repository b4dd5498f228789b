//! # loom-schema
//!
//! The one place where Loom compiles a JSON Schema: tool argument schemas (registered tools,
//! MCP tools whose schema a server supplies, roles, sub-agents), output contracts checked
//! against model output, and the schemas the configuration declares.
//!
//! Every `pattern` and `patternProperties` key runs on the `regex` crate's engine, which
//! matches in time linear in the input: a hostile pattern such as `(a+)+$` cannot make a
//! validation backtrack for ever (ReDoS). The price is the `regex` syntax: lookaround and
//! backreferences are refused when the schema is compiled, with the compiler's message.
//! `jsonschema`'s default engine (`fancy-regex`) backtracks on such patterns.
//!
//! The draft comes from the schema's `$schema`, 2020-12 when it has none. No `$ref` is
//! resolved over the network or the filesystem (`jsonschema` is built without those features).
//!
//! `xtask` refuses a shipped dependency on `jsonschema` in any other crate, so a schema cannot
//! be compiled another way.
//!
//! **Architecture invariant:** a leaf crate: it depends on no loom crate.

pub use jsonschema::{ValidationError, Validator};

/// Compiles `schema` once, its patterns on the linear-time engine.
///
/// # Errors
/// The schema is not a valid JSON Schema for its draft, or one of its patterns is not a
/// `regex`-crate expression (lookaround, backreferences): the error's `instance_path` is the
/// faulty place in the schema.
pub fn compile(schema: &serde_json::Value) -> Result<Validator, ValidationError<'static>> {
    jsonschema::options()
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(schema)
}
