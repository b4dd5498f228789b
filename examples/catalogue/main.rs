//! The `catalogue` example: the whole `loom` CLI with a kind of tool source of its own,
//! `catalogue`, registered with `App::source`. A configuration declares its sources under
//! `tool_sources` (`kind: catalogue`, the articles and their unit prices in `params`); agents
//! use them with `- source: <name>` and the model sees the tool `<name>__prix`.
//!
//! ```text
//! cargo run --example catalogue -- run vendeur "Combien coûtent 250 vis ?"
//! cargo run --example catalogue -- validate
//! ```
//!
//! Without `--config`, it uses `examples/catalogue/loom.yaml`.

use std::{collections::BTreeMap, process::ExitCode, sync::Arc};

use loom_ia::{
    FixedSource, FnTool, SourceFactoryError, SourceRequest, ToolError, ToolOutput, ToolSource,
    core::tool::{SideEffects, ToolDeclarations, ToolKind, ToolSpec},
};
use serde_json::{Value, json};

/// The factory of the `catalogue` kind: `params.devise` (a currency code) and `params.articles`
/// (the unit price of each article), each refused at its key when it is missing or wrong.
fn catalogue(request: &SourceRequest<'_>) -> Result<Arc<dyn ToolSource>, SourceFactoryError> {
    let devise = request
        .params
        .get("devise")
        .and_then(Value::as_str)
        .filter(|d| !d.trim().is_empty())
        .ok_or_else(|| SourceFactoryError::at("devise", "a currency code is expected (EUR)"))?
        .to_owned();
    let articles: BTreeMap<String, f64> =
        serde_json::from_value(request.params.get("articles").cloned().unwrap_or_default())
            .map_err(|e| {
                SourceFactoryError::at("articles", format!("the unit price of each article: {e}"))
            })?;
    if articles.is_empty() {
        return Err(SourceFactoryError::at("articles", "no article"));
    }
    let names: Vec<&String> = articles.keys().collect();
    let spec = ToolSpec {
        name: "prix".into(),
        description: format!("Prix d'une quantité d'un article du catalogue, en {devise}."),
        input_schema: json!({
            "type": "object",
            "properties": {
                "article": {"type": "string", "enum": names},
                "quantite": {"type": "integer", "minimum": 1},
            },
            "required": ["article", "quantite"],
        }),
        kind: ToolKind::Python,
        declarations: ToolDeclarations {
            side_effects: SideEffects::None,
            idempotent: true,
            ..ToolDeclarations::default()
        },
    };
    let tool = FnTool::new(spec, move |_, args| {
        let answer = prix(&articles, &devise, &args);
        Box::pin(async move { answer.map(ToolOutput::text) })
    });
    // One tool, `prix` (Loom names it `<source>__prix`).
    Ok(Arc::new(FixedSource::new(
        "catalogue",
        vec![Arc::new(tool)],
    )))
}

/// `quantite` × the unit price of `article`, computed in cents.
fn prix(articles: &BTreeMap<String, f64>, devise: &str, args: &Value) -> Result<String, ToolError> {
    let article = args["article"].as_str().unwrap_or_default();
    let Some(unit) = articles.get(article) else {
        return Err(ToolError::new(format!("unknown article: {article}")));
    };
    let Some(quantite) = args["quantite"].as_u64().filter(|q| *q > 0) else {
        return Err(ToolError::new(
            "invalid quantite (a positive whole number is expected)",
        ));
    };
    let cents = (unit * 100.0).round() as u64 * quantite;
    Ok(format!(
        "{quantite} × {article} : {},{:02} {devise}",
        cents / 100,
        cents % 100
    ))
}

fn main() -> ExitCode {
    loom_cli::App::new()
        .source("catalogue", Arc::new(catalogue))
        .default_config(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/catalogue/loom.yaml"
        ))
        .main()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_in_cents() {
        let articles = BTreeMap::from([("vis".to_owned(), 0.12)]);
        let args = json!({"article": "vis", "quantite": 250});
        assert_eq!(
            prix(&articles, "EUR", &args).unwrap(),
            "250 × vis : 30,00 EUR"
        );
        assert!(prix(&articles, "EUR", &json!({"article": "clou", "quantite": 1})).is_err());
        assert!(prix(&articles, "EUR", &json!({"article": "vis", "quantite": 0})).is_err());
    }
}
