//! The committed schema (`schema/loom.schema.json`) must match the types.
//! `LOOM_UPDATE_SCHEMA=1 cargo test -p loom-config` rewrites it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

#[test]
fn committed_schema_is_up_to_date() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../schema/loom.schema.json");
    let mut generated = serde_json::to_string_pretty(&loom_config::json_schema()).unwrap();
    generated.push('\n');
    if std::env::var_os("LOOM_UPDATE_SCHEMA").is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "schema/loom.schema.json is out of date with the loom-config types; \
         regenerate it with `LOOM_UPDATE_SCHEMA=1 cargo test -p loom-config` and commit it"
    );
}

#[test]
fn schema_is_draft_2020_12_and_closed() {
    let schema = loom_config::json_schema();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert_eq!(schema["title"], "LoomConfig");
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["required"], serde_json::json!(["version"]));
    assert_eq!(
        schema["$defs"]["AgentSpec"]["properties"]["name"]["pattern"],
        "^[A-Za-z0-9_-]{1,64}$"
    );
}
