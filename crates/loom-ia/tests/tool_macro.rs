//! The `#[tool]` attribute: a plain function becomes a tool.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{fmt, time::Duration};

use loom_ia::__private::{
    Approval, OnUnknown, SideEffects, ToolDeclarations, ToolKind, serde_json::json,
};
use loom_ia::{Tool, ToolContext, ToolError, ToolOutput};
use serde_json::Value;

fn ctx() -> ToolContext {
    ToolContext {
        tenant_id: "tenant-1".to_owned(),
        session_id: "session-1".to_owned(),
        run_id: "run-1".to_owned(),
        call_id: "call-42".to_owned(),
        idempotency_key: "key-abc".to_owned(),
        traceparent: None,
    }
}

async fn call(tool: &dyn Tool, arguments: Value) -> Result<ToolOutput, ToolError> {
    tool.call(ctx(), arguments).await
}

fn text(output: &ToolOutput) -> String {
    output.visible_text()
}

// --- A sync tool with a typed error -------------------------------------------------------------

#[derive(Debug)]
enum PrixError {
    TauxNegatif(f64),
}

impl fmt::Display for PrixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrixError::TauxNegatif(taux) => write!(f, "taux de TVA négatif : {taux}"),
        }
    }
}

/// Calcule le prix TTC à partir d'un montant HT et d'un taux de TVA en pourcentage.
#[loom_ia::tool]
fn prix_ttc(montant_ht: f64, taux_tva: f64) -> Result<String, PrixError> {
    if taux_tva < 0.0 {
        return Err(PrixError::TauxNegatif(taux_tva));
    }
    Ok(format!("{:.2}", montant_ht * (1.0 + taux_tva / 100.0)))
}

#[test]
fn original_function_is_kept() {
    assert_eq!(prix_ttc(100.0, 20.0).unwrap(), "120.00");
    assert!(prix_ttc(100.0, -1.0).is_err());
}

#[test]
fn spec_of_a_plain_tool() {
    let tool = prix_ttc_tool();
    let spec = tool.spec();
    assert_eq!(spec.name, "prix_ttc");
    assert_eq!(
        spec.description,
        "Calcule le prix TTC à partir d'un montant HT et d'un taux de TVA en pourcentage."
    );
    assert_eq!(spec.kind, ToolKind::Python);
    assert_eq!(spec.declarations, ToolDeclarations::default());
    assert_eq!(
        spec.input_schema,
        json!({
            "type": "object",
            "properties": {
                "montant_ht": { "type": "number", "format": "double" },
                "taux_tva": { "type": "number", "format": "double" }
            },
            "additionalProperties": false,
            "required": ["montant_ht", "taux_tva"]
        })
    );
}

#[tokio::test]
async fn sync_tool_runs() {
    let output = call(
        &prix_ttc_tool(),
        json!({ "montant_ht": 72.5, "taux_tva": 20 }),
    )
    .await
    .unwrap();
    assert_eq!(output, ToolOutput::text("87.00"));
    assert!(output.data.is_none());
    assert!(!output.is_error);
}

#[tokio::test]
async fn err_becomes_a_tool_error() {
    let error = call(
        &prix_ttc_tool(),
        json!({ "montant_ht": 10.0, "taux_tva": -5.5 }),
    )
    .await
    .unwrap_err();
    assert_eq!(error.message, "taux de TVA négatif : -5.5");
}

#[tokio::test]
async fn missing_field_is_invalid_arguments() {
    let error = call(&prix_ttc_tool(), json!({ "montant_ht": 10.0 }))
        .await
        .unwrap_err();
    assert!(
        error.message.starts_with("invalid arguments: "),
        "{}",
        error.message
    );
    assert!(error.message.contains("taux_tva"), "{}", error.message);
}

#[tokio::test]
async fn extra_field_is_invalid_arguments() {
    let error = call(
        &prix_ttc_tool(),
        json!({ "montant_ht": 10.0, "taux_tva": 20.0, "devise": "EUR" }),
    )
    .await
    .unwrap_err();
    assert!(
        error.message.starts_with("invalid arguments: "),
        "{}",
        error.message
    );
    assert!(error.message.contains("devise"), "{}", error.message);
}

#[tokio::test]
async fn wrong_type_is_invalid_arguments_naming_the_field() {
    let error = call(
        &prix_ttc_tool(),
        json!({ "montant_ht": 10.0, "taux_tva": "vingt" }),
    )
    .await
    .unwrap_err();
    assert!(
        error
            .message
            .starts_with("invalid arguments: field `taux_tva`: invalid type: string \"vingt\""),
        "{}",
        error.message
    );
}

#[tokio::test]
async fn non_object_arguments_are_invalid() {
    let error = call(&prix_ttc_tool(), json!([1, 2])).await.unwrap_err();
    assert_eq!(
        error.message,
        "invalid arguments: expected a JSON object, got [1,2]"
    );
}

// --- Async tools, context injection, optional parameters ---------------------------------------

/// Says who is calling.
///
/// Used to check the context
/// reaches the tool.
#[loom_ia::tool]
pub async fn whoami(ctx: ToolContext, greeting: Option<String>) -> String {
    tokio::task::yield_now().await;
    format!(
        "{} {} {}",
        greeting.unwrap_or_else(|| "hello".to_owned()),
        ctx.call_id,
        ctx.idempotency_key
    )
}

#[test]
fn multi_paragraph_description() {
    assert_eq!(
        whoami_tool().spec().description,
        "Says who is calling.\n\nUsed to check the context reaches the tool."
    );
}

#[test]
fn context_is_not_in_the_schema_and_options_are_optional() {
    assert_eq!(
        whoami_tool().spec().input_schema,
        json!({
            "type": "object",
            "properties": {
                "greeting": { "type": ["string", "null"] }
            },
            "additionalProperties": false
        })
    );
}

#[tokio::test]
async fn async_tool_reads_the_context() {
    let tool = whoami_tool();
    let output = call(&tool, json!({})).await.unwrap();
    assert_eq!(text(&output), "hello call-42 key-abc");
    let output = call(&tool, json!({ "greeting": "bonjour" })).await.unwrap();
    assert_eq!(text(&output), "bonjour call-42 key-abc");
    // No arguments at all counts as an empty object.
    let output = call(&tool, Value::Null).await.unwrap();
    assert_eq!(text(&output), "hello call-42 key-abc");
}

/// Reads the context by reference, from a sync function.
#[loom_ia::tool]
fn run_of(ctx: &loom_ia::ToolContext) -> &'static str {
    if ctx.run_id == "run-1" {
        "first run"
    } else {
        "another run"
    }
}

#[tokio::test]
async fn context_by_reference_in_a_sync_tool() {
    let tool = run_of_tool();
    assert_eq!(
        tool.spec().input_schema,
        json!({ "type": "object", "properties": {}, "additionalProperties": false })
    );
    let output = call(&tool, json!({})).await.unwrap();
    assert_eq!(output, ToolOutput::text("first run"));
}

// --- Where a sync tool runs ---------------------------------------------------------------------

/// The thread the function ran on.
#[loom_ia::tool]
fn thread_of_pool() -> String {
    format!("{:?}", std::thread::current().id())
}

/// The thread the function ran on, called in place.
#[loom_ia::tool(inline, side_effects = "none")]
fn thread_of_inline(ctx: &loom_ia::ToolContext) -> String {
    format!("{:?} {}", std::thread::current().id(), ctx.call_id)
}

/// A sync tool runs on the blocking thread pool, never on the call's task; an `inline` one runs
/// in place, on the caller's thread, with the same arguments, context and result conversion.
#[tokio::test]
async fn a_sync_tool_runs_on_the_blocking_pool_unless_inline() {
    let here = format!("{:?}", std::thread::current().id());
    let pooled = text(&call(&thread_of_pool_tool(), json!({})).await.unwrap());
    assert_ne!(pooled, here);
    let tool = thread_of_inline_tool();
    assert_eq!(
        text(&call(&tool, json!({})).await.unwrap()),
        format!("{here} call-42")
    );
    assert_eq!(tool.spec().declarations.side_effects, SideEffects::None);
    // Its arguments are checked as any tool's.
    let refused = call(&tool, json!({ "extra": 1 })).await.unwrap_err();
    assert!(refused.to_string().contains("extra"), "{refused}");
}

// --- #[args] struct, structured results ----------------------------------------------------------

/// Search the catalogue.
#[derive(serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    /// Words to look for.
    query: String,
    /// Maximum number of hits.
    #[serde(default = "default_limit")]
    limit: u32,
}

fn default_limit() -> u32 {
    3
}

#[derive(Debug, serde::Serialize)]
struct Hit {
    title: String,
    rank: u32,
}

/// Searches the catalogue and returns the hits.
#[loom_ia::tool(idempotent)]
async fn search(#[args] args: SearchArgs, ctx: ToolContext) -> Result<Vec<Hit>, ToolError> {
    if args.query.is_empty() {
        return Err(ToolError::new("empty query; give at least one word"));
    }
    Ok((1..=args.limit)
        .map(|rank| Hit {
            title: format!("{} #{rank} ({})", args.query, ctx.tenant_id),
            rank,
        })
        .collect())
}

#[test]
fn args_struct_schema_keeps_field_docs() {
    let tool = search_tool();
    let schema = &tool.spec().input_schema;
    assert_eq!(schema["type"], "object");
    assert_eq!(
        schema["properties"]["query"]["description"],
        "Words to look for."
    );
    assert_eq!(
        schema["properties"]["limit"]["description"],
        "Maximum number of hits."
    );
    assert_eq!(schema["required"], json!(["query"]));
    assert_eq!(schema["additionalProperties"], json!(false));
    assert_eq!(
        tool.spec().description,
        "Searches the catalogue and returns the hits."
    );
    assert!(tool.spec().declarations.idempotent);
}

#[tokio::test]
async fn struct_result_is_a_json_block_with_data() {
    let output = call(&search_tool(), json!({ "query": "loom", "limit": 2 }))
        .await
        .unwrap();
    let expected = json!([
        { "title": "loom #1 (tenant-1)", "rank": 1 },
        { "title": "loom #2 (tenant-1)", "rank": 2 }
    ]);
    assert_eq!(output, ToolOutput::json(expected.clone()));
    assert_eq!(output.data, Some(expected));
    assert!(!output.is_error);
}

#[tokio::test]
async fn tool_error_passes_through() {
    let error = call(&search_tool(), json!({ "query": "" }))
        .await
        .unwrap_err();
    assert_eq!(error, ToolError::new("empty query; give at least one word"));
}

#[tokio::test]
async fn bad_args_struct_arguments() {
    let error = call(&search_tool(), json!({ "limit": 2 }))
        .await
        .unwrap_err();
    assert_eq!(error.message, "invalid arguments: missing field `query`");
    let error = call(&search_tool(), json!({ "query": "x", "page": 2 }))
        .await
        .unwrap_err();
    assert!(
        error
            .message
            .starts_with("invalid arguments: unknown field `page`"),
        "{}",
        error.message
    );
}

/// Statistics about a text.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct StatsArgs {
    text: String,
}

#[derive(serde::Serialize)]
struct Stats {
    words: usize,
}

#[loom_ia::tool(name = "text-stats")]
fn stats(#[args] StatsArgs { text }: StatsArgs) -> Stats {
    Stats {
        words: text.split_whitespace().count(),
    }
}

#[tokio::test]
async fn description_falls_back_to_the_args_struct() {
    let tool = stats_tool();
    assert_eq!(tool.spec().name, "text-stats");
    assert_eq!(tool.spec().description, "Statistics about a text.");
    let output = call(&tool, json!({ "text": "un deux trois" }))
        .await
        .unwrap();
    assert_eq!(output.data, Some(json!({ "words": 3 })));
}

/// Lists a customer's invoices: a summary for the model, every invoice for interfaces.
#[loom_ia::tool]
fn invoices(customer: String) -> loom_ia::Views<String, Vec<Hit>> {
    let all: Vec<Hit> = (1..=3)
        .map(|rank| Hit {
            title: format!("{customer} invoice {rank}"),
            rank,
        })
        .collect();
    loom_ia::Views {
        model: format!("{} invoices for {customer}", all.len()),
        full: all,
    }
}

#[tokio::test]
async fn views_give_the_model_a_summary_and_interfaces_everything() {
    let output = call(&invoices_tool(), json!({ "customer": "ACME" }))
        .await
        .unwrap();
    assert_eq!(output.visible_text(), "3 invoices for ACME");
    assert_eq!(output.data, None);
    assert_eq!(
        output.full.as_ref().and_then(|f| f[2]["title"].as_str()),
        Some("ACME invoice 3")
    );
}

// --- Parameter docs and serde attributes --------------------------------------------------------

/// Repeats a word.
#[loom_ia::tool]
fn repeat(
    /// The word to repeat.
    word: String,
    /// How many times.
    #[serde(default)]
    times: usize,
) -> Value {
    json!({ "words": vec![word; times] })
}

#[tokio::test]
async fn parameter_docs_and_serde_attributes_move_to_the_schema() {
    let tool = repeat_tool();
    let schema = &tool.spec().input_schema;
    assert_eq!(
        schema["properties"]["word"]["description"],
        "The word to repeat."
    );
    assert_eq!(
        schema["properties"]["times"]["description"],
        "How many times."
    );
    assert_eq!(schema["required"], json!(["word"]));
    let output = call(&tool, json!({ "word": "a", "times": 2 }))
        .await
        .unwrap();
    assert_eq!(output, ToolOutput::json(json!({ "words": ["a", "a"] })));
    let output = call(&tool, json!({ "word": "a" })).await.unwrap();
    assert_eq!(output.data, Some(json!({ "words": [] })));
    assert_eq!(repeat("b".to_owned(), 1), json!({ "words": ["b"] }));
}

// --- Options ------------------------------------------------------------------------------------

/// Sends an e-mail.
#[loom_ia::tool(
    name = "send_email",
    side_effects = "irreversible",
    approval = "always",
    idempotent = false,
    on_unknown = "pause",
    timeout = 10,
    offload_over = 1000,
    crate = ::loom_ia
)]
fn send(to: String) {
    let _ = to;
}

/// Refunds an order.
#[loom_ia::tool(
    side_effects = "reversible",
    approval = "policy",
    idempotent = true,
    timeout = 2.5
)]
async fn refund(order: u64) -> loom_ia::ToolOutput {
    ToolOutput::text(format!("refunded {order}"))
}

#[tokio::test]
async fn options_land_in_the_declarations() {
    let tool = send_tool();
    assert_eq!(tool.spec().name, "send_email");
    assert_eq!(
        tool.spec().declarations,
        ToolDeclarations {
            side_effects: SideEffects::Irreversible,
            approval: Approval::Always,
            idempotent: false,
            on_unknown: OnUnknown::Pause,
            timeout: Some(Duration::from_secs(10)),
            offload_over: Some(1000),
            business_key: None,
        }
    );
    let output = call(&tool, json!({ "to": "a@b.c" })).await.unwrap();
    assert_eq!(output, ToolOutput::default());
    send("x".to_owned());

    let tool = refund_tool();
    assert_eq!(tool.spec().name, "refund");
    assert_eq!(
        tool.spec().declarations,
        ToolDeclarations {
            side_effects: SideEffects::Reversible,
            approval: Approval::Policy,
            idempotent: true,
            on_unknown: OnUnknown::Error,
            timeout: Some(Duration::from_millis(2500)),
            offload_over: None,
            business_key: None,
        }
    );
    let output = call(&tool, json!({ "order": 7 })).await.unwrap();
    assert_eq!(text(&output), "refunded 7");
}

#[test]
fn tools_are_object_safe_and_shareable() {
    let tools: Vec<std::sync::Arc<dyn Tool>> = vec![
        std::sync::Arc::new(prix_ttc_tool()),
        std::sync::Arc::new(whoami_tool()),
        std::sync::Arc::new(search_tool()),
    ];
    let names: Vec<&str> = tools.iter().map(|tool| tool.spec().name.as_str()).collect();
    assert_eq!(names, ["prix_ttc", "whoami", "search"]);
}

// --- A business key ---------------------------------------------------------------------------

/// Sends a reminder for a quote.
#[loom_ia::tool(
    side_effects = "irreversible",
    business_key = "relance:{numero}/{rang}"
)]
fn envoyer_relance(numero: String, rang: Option<u32>) -> String {
    format!("relance {numero} envoyée (rang {})", rang.unwrap_or(1))
}

#[tokio::test]
async fn a_business_key_template_is_computed_from_the_arguments() {
    let tool = envoyer_relance_tool();
    let declarations = &tool.spec().declarations;
    assert_eq!(declarations.side_effects, SideEffects::Irreversible);
    let key = declarations.business_key.as_ref().unwrap();
    assert_eq!(key.template_text(), Some("relance:{numero}/{rang}"));
    assert_eq!(
        key.key(&json!({"numero": "D-2024-017", "rang": 2}))
            .as_deref(),
        Some("relance:D-2024-017/2")
    );
    // A missing argument gives no key.
    assert_eq!(key.key(&json!({"numero": "D-2024-017"})), None);
    assert_eq!(
        text(
            &call(&tool, json!({"numero": "D-1", "rang": 1}))
                .await
                .unwrap()
        ),
        "relance D-1 envoyée (rang 1)"
    );
    // Tools without one have none.
    assert!(ToolDeclarations::default().business_key.is_none());
}
