//! Tool sources built by a factory registered in Rust (`Loom::register_source`), through the
//! public API: the factory gets the source's name, its `params`, the tenant's secrets and the
//! configuration's directory; its tools reach the model prefixed `<source>__` with the
//! declarations of `tool_sources[].tools`; the run journals what the source offered and replays
//! exactly; an unregistered kind and a refused `params` are located errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};

use loom_ia::{
    FixedSource, FnTool, Loom, LoomError, RunOptions, SourceFactoryError, SourceRequest,
    ToolOutput, ToolSource,
    core::tool::{SideEffects, ToolDeclarations, ToolKind, ToolSpec},
    testing::{Script, assert_tool_called},
};
use serde_json::json;

const CONFIG: &str = r#"
version: 1
storage:
  events: {backend: jsonl, path: journal}
models:
  - id: claude
    sdk: fake
    model: claude-x
    retry: {max_attempts: 1}
tool_sources:
  - name: catalog
    kind: catalog
    params: {currency: EUR, auth: {secret: CATALOG_KEY}}
    tools:
      price: {description: "Price of an article, in the catalog's currency."}
tenants:
  - id: acme
    secrets: {CATALOG_KEY: {file: acme.key}}
  - id: bare
agents:
  - name: seller
    main: {model: claude, system: Tu vends.}
    tools:
      - source: catalog
"#;

/// What the factory saw, per call: name, tenant, currency, whether the key was right, and
/// whether the base directory holds the config.
type Seen = Arc<Mutex<Vec<(String, String, String, bool, bool)>>>;

fn factory(
    seen: Seen,
) -> impl Fn(&SourceRequest<'_>) -> Result<Arc<dyn ToolSource>, SourceFactoryError> {
    move |request: &SourceRequest<'_>| {
        let currency = request.params["currency"]
            .as_str()
            .ok_or_else(|| SourceFactoryError::at("currency", "a currency code is needed"))?
            .to_owned();
        let key = request.secrets.get("CATALOG_KEY")?;
        seen.lock().unwrap().push((
            request.name.to_owned(),
            request.secrets.tenant().to_owned(),
            currency.clone(),
            key.trim() == "k-acme",
            request.base_dir.join("loom.yaml").is_file(),
        ));
        let spec = ToolSpec {
            name: "price".into(),
            description: "price".into(),
            input_schema: json!({"type": "object", "properties": {"article": {"type": "string"}}}),
            kind: ToolKind::Python,
            declarations: ToolDeclarations {
                side_effects: SideEffects::None,
                ..ToolDeclarations::default()
            },
        };
        let tool = FnTool::new(spec, move |_, args| {
            let currency = currency.clone();
            Box::pin(async move {
                Ok(ToolOutput::text(format!(
                    "{}: 12 {currency}",
                    args["article"].as_str().unwrap_or("?")
                )))
            })
        });
        // One tool, `price`, named bare (Loom adds the prefix).
        Ok(Arc::new(FixedSource::new("catalog", vec![Arc::new(tool)])))
    }
}

fn open(config: &str) -> (tempfile::TempDir, Loom) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.yaml"), config).unwrap();
    std::fs::write(dir.path().join("acme.key"), "k-acme\n").unwrap();
    let loom = Loom::from_config(dir.path().join("loom.yaml")).unwrap();
    (dir, loom)
}

#[tokio::test]
async fn a_registered_source_offers_its_tools_to_an_agent() {
    let (_dir, loom) = open(CONFIG);
    let seen = Seen::default();
    loom.register_source("catalog", Arc::new(factory(seen.clone())))
        .unwrap();
    loom.register_model(
        "claude",
        Script::new()
            .tool_call("Je regarde.", "catalog__price", json!({"article": "vis"}))
            .text("Prix : {{ tool_result }}")
            .model("scripted")
            .unwrap(),
    )
    .unwrap();
    let options = RunOptions {
        tenant_id: Some("acme".into()),
        ..RunOptions::default()
    };
    let result = loom.run("seller", "Prix des vis ?", options).await.unwrap();
    assert!(result.ok(), "{result:?}");
    assert_eq!(result.text, "Prix : vis: 12 EUR");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [(
            "catalog".to_owned(),
            "acme".to_owned(),
            "EUR".to_owned(),
            true,
            true
        )]
    );
    let run = result.run_ref("acme");
    let events = loom.events(&run).await.unwrap();
    assert_tool_called(&events, "catalog__price", &json!({"article": "vis"}));
    let opened = events
        .iter()
        .find(|e| e.event_type == "tool.source_opened")
        .expect("the source's offer is journaled");
    let payload = serde_json::to_value(&opened.payload).unwrap();
    assert_eq!(payload["source"], "catalog");
    assert_eq!(payload["tools"][0]["name"], "catalog__price");
    // The declarations of `tool_sources[].tools` apply.
    assert_eq!(
        payload["tools"][0]["description"],
        "Price of an article, in the catalog's currency."
    );
    // Built once per source and tenant.
    loom.register_model(
        "claude",
        Script::new().text("Rien.").model("again").unwrap(),
    )
    .unwrap();
    let options = RunOptions {
        tenant_id: Some("acme".into()),
        ..RunOptions::default()
    };
    loom.run("seller", "Encore ?", options).await.unwrap();
    assert_eq!(seen.lock().unwrap().len(), 1);
    // The run replays exactly, from what the journal recorded of the source.
    let report = loom.replay(&run).await.unwrap();
    assert_eq!(report.outcome, "identical", "{report:?}");
}

#[tokio::test]
async fn an_unregistered_kind_is_a_located_error_naming_the_registered_ones() {
    let (_dir, loom) = open(CONFIG);
    let options = RunOptions {
        tenant_id: Some("acme".into()),
        ..RunOptions::default()
    };
    let error = loom.run("seller", "Prix ?", options).await.unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, LoomError::Config(_)), "{error:?}");
    assert!(text.contains("tool_sources[0].kind"), "{text}");
    assert!(
        text.contains("unknown tool source kind 'catalog'"),
        "{text}"
    );
    assert!(text.contains("registered kinds:"), "{text}");
    assert!(
        loom.register_source("catalog", Arc::new(factory(Seen::default())))
            .is_ok()
    );
    let again = loom.register_source("catalog", Arc::new(factory(Seen::default())));
    assert!(
        matches!(again, Err(LoomError::Registration(_))),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_refused_params_key_and_a_missing_secret_are_located() {
    let (_dir, loom) = open(&CONFIG.replace("currency: EUR, ", ""));
    loom.register_source("catalog", Arc::new(factory(Seen::default())))
        .unwrap();
    let options = RunOptions {
        tenant_id: Some("acme".into()),
        ..RunOptions::default()
    };
    let text = loom
        .run("seller", "Prix ?", options)
        .await
        .unwrap_err()
        .to_string();
    assert!(text.contains("tool_sources[0].params.currency"), "{text}");
    assert!(text.contains("a currency code is needed"), "{text}");

    // The tenant `bare` has no CATALOG_KEY (nor does the environment): the factory's error
    // names the secret, never a value.
    let (_dir, loom) = open(CONFIG);
    loom.register_source("catalog", Arc::new(factory(Seen::default())))
        .unwrap();
    let options = RunOptions {
        tenant_id: Some("bare".into()),
        ..RunOptions::default()
    };
    let text = loom
        .run("seller", "Prix ?", options)
        .await
        .unwrap_err()
        .to_string();
    assert!(text.contains("tool_sources[0]"), "{text}");
    assert!(
        text.contains("the secret CATALOG_KEY is absent or empty for tenant 'bare'"),
        "{text}"
    );
}

#[test]
fn an_agent_naming_an_undeclared_source_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("loom.yaml"),
        CONFIG.replace("      - source: catalog", "      - source: stock"),
    )
    .unwrap();
    let text = match Loom::from_config(dir.path().join("loom.yaml")) {
        Ok(_) => panic!("an undeclared source is refused"),
        Err(error) => error.to_string(),
    };
    assert!(
        text.contains("unknown tool source 'stock' (declared sources: catalog)"),
        "{text}"
    );
}
