//! The forge (tool source kind `forge`): a model defines a new tool — name, description, input
//! schema, a Python 3 program, examples —, every example runs in the sandbox and its output is
//! compared with the expected one, and only when all pass is the tool published in the
//! tenant's catalog and offered.
//!
//! [`ForgeSource`] gives, named `<source>__<tool>` by the facade:
//!
//! - `define`: checks the definition ([`check::check_definition`]: the name's pattern, the
//!   schema compiled by `loom-schema`, each example's input against it), refuses a name the
//!   tenant already has, runs each example in a fresh working folder ([`runner`]), compares the
//!   printed JSON with the expected JSON exactly ([`check::first_difference`]), and publishes
//!   the tool ([`catalog::Catalog::publish`], whole or not at all). Its result reports every
//!   example's outcome; the engine journals it in `tool.completed`, which is the record of the
//!   definition (no event of its own is needed: the call, its arguments — the code included —
//!   and its result are already journaled).
//! - `call`: runs a tool defined *in the same run*, its input checked against its schema. A
//!   tool defined before the run is refused here: it is offered under its own name, where the
//!   declarations and approvals configured for it apply, and `call` must not bypass them.
//! - one tool per catalog entry of the tenant, listed when the source opens for a run: a tool
//!   defined during a run is offered from the next run (or the next resume) on, so the tools of
//!   a model turn never change under it and a replay offers what the journal recorded.
//!
//! Every tool is `irreversible` and not idempotent by default, so `approval` declarations and
//! approval policies apply to forged tools as to any other, and an interrupted call is never
//! run again blindly. Every failure is a refusal naming its rule ([`rules`], or the sandbox's
//! own limit rules).

pub mod catalog;
pub mod check;
pub mod runner;

use std::sync::Arc;

use loom_core::{
    BoxFuture,
    ports::{SourceContext, SourceError, ToolSource},
    tool::{
        FnTool, SideEffects, Tool, ToolContext, ToolDeclarations, ToolError, ToolKind, ToolOutput,
        ToolSpec,
    },
};
use serde::Deserialize;
use serde_json::{Value, json};

use catalog::{Catalog, CatalogEntry, CatalogError, DefinedBy, code_sha256};
use check::{Definition, check_definition, check_input, check_schema, first_difference};
use runner::Runner;

use crate::tools::arguments;

/// The rules the forge refuses by, as they appear in messages.
pub mod rules {
    /// A tool name outside the pattern, reserved, or too long with its prefix.
    pub const NAME: &str = "forge-name";
    /// The tenant already has a tool of that name (entries are never replaced).
    pub const NAME_TAKEN: &str = "forge-name-taken";
    /// An empty or overlong description.
    pub const DESCRIPTION: &str = "forge-description";
    /// An empty or overlong program.
    pub const CODE: &str = "forge-code";
    /// An input schema that is not a valid JSON Schema of `type: object`.
    pub const SCHEMA: &str = "forge-schema";
    /// No example, or too many.
    pub const EXAMPLES: &str = "forge-examples";
    /// An example whose input does not match the input schema.
    pub const EXAMPLE_INPUT: &str = "forge-example-input";
    /// An example whose run failed or whose output differs from the expected one.
    pub const EXAMPLE_FAILED: &str = "forge-example-failed";
    /// No forged tool of that name for the tenant.
    pub const UNKNOWN: &str = "forge-unknown-tool";
    /// `call` of a tool defined before the run (it is offered under its own name).
    pub const OFFERED: &str = "forge-call-offered";
    /// A call's input that does not match the tool's schema.
    pub const INPUT: &str = "forge-input";
    /// A program that exited with a non-zero code or was killed.
    pub const EXIT: &str = "forge-exit";
    /// A program whose standard output is not one JSON value.
    pub const OUTPUT_JSON: &str = "forge-output-json";
    /// The catalog could not be read or written.
    pub const CATALOG: &str = "forge-catalog";
}

/// The forge source of one configured name.
#[derive(Debug, Clone)]
pub struct ForgeSource {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    source: String,
    catalog: Catalog,
    runner: Runner,
}

impl ForgeSource {
    /// The source named `source` (the prefix of its tools), publishing into `catalog` and
    /// running programs with `runner`.
    pub fn new(source: impl Into<String>, catalog: Catalog, runner: Runner) -> ForgeSource {
        ForgeSource {
            shared: Arc::new(Shared {
                source: source.into(),
                catalog,
                runner,
            }),
        }
    }

    /// The catalog it publishes into.
    pub fn catalog(&self) -> &Catalog {
        &self.shared.catalog
    }
}

impl ToolSource for ForgeSource {
    fn name(&self) -> &str {
        &self.shared.source
    }

    fn open<'a>(
        &'a self,
        ctx: &'a SourceContext,
    ) -> BoxFuture<'a, Result<Vec<Arc<dyn Tool>>, SourceError>> {
        Box::pin(async move {
            let catalog = self.shared.catalog.clone();
            let tenant = ctx.tenant_id.clone();
            let listed = blocking(move || catalog.list(&tenant))
                .await
                .map_err(|error| SourceError {
                    message: format!("the forge catalog cannot be read: {error}"),
                    circuit: None,
                })?;
            let mut tools: Vec<Arc<dyn Tool>> = vec![
                Arc::new(define(self.shared.clone())),
                Arc::new(call(self.shared.clone())),
            ];
            for entry in listed {
                let code = {
                    let catalog = self.shared.catalog.clone();
                    let (tenant, name) = (ctx.tenant_id.clone(), entry.name.clone());
                    match blocking(move || catalog.get(&tenant, &name)).await {
                        Ok((_, code)) => code,
                        Err(error) => {
                            tracing::warn!(tenant = %ctx.tenant_id, tool = %entry.name, %error, "forged tool left out");
                            continue;
                        }
                    }
                };
                match forged(self.shared.clone(), entry, code) {
                    Ok(tool) => tools.push(Arc::new(tool)),
                    Err(error) => {
                        tracing::warn!(tenant = %ctx.tenant_id, %error, "forged tool left out");
                    }
                }
            }
            Ok(tools)
        })
    }

    fn release<'a>(&'a self, _ctx: &'a SourceContext) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }
}

/// Runs catalog work on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, CatalogError> + Send + 'static,
) -> Result<T, CatalogError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| CatalogError::Io {
            path: std::path::PathBuf::new(),
            source: std::io::Error::other(error.to_string()),
        })?
}

/// A catalog error as a tool error.
fn catalog_error(error: CatalogError) -> ToolError {
    match error {
        CatalogError::Unknown(name) => ToolError::refused(
            rules::UNKNOWN,
            format!(
                "refused by rule '{}': no forged tool named '{name}' for this tenant",
                rules::UNKNOWN
            ),
        ),
        CatalogError::NameTaken(name) => ToolError::refused(
            rules::NAME_TAKEN,
            format!(
                "refused by rule '{}': this tenant already has a tool named '{name}'; forged \
                 tools are never replaced, choose another name",
                rules::NAME_TAKEN
            ),
        ),
        other => ToolError::refused(
            rules::CATALOG,
            format!("refused by rule '{}': {other}", rules::CATALOG),
        ),
    }
}

fn declarations() -> ToolDeclarations {
    ToolDeclarations {
        side_effects: SideEffects::Irreversible,
        idempotent: false,
        ..ToolDeclarations::default()
    }
}

fn define(shared: Arc<Shared>) -> FnTool {
    let limits = shared.runner.limits;
    let spec = ToolSpec {
        name: "define".into(),
        description: format!(
            "Define a new tool. `code` is a Python 3 program that reads one JSON object (the \
             input, matching `input_schema`) on standard input and prints one JSON value (the \
             output) on standard output. Each example's input is run in a sandbox (no network, \
             {} ms of wall time, {} MiB of memory) and its output must equal the example's \
             output exactly (1 and 1.0 differ). Only when every example passes is the tool \
             published: callable in this run through {source}__call, offered as \
             {source}__<name> from the next run on. Names: lowercase letters, digits and single \
             underscores; a name is never reused.",
            limits.wall_ms,
            limits.memory_mb,
            source = shared.source
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$", "maxLength": check::MAX_NAME},
                "description": {"type": "string", "minLength": 1},
                "input_schema": {"type": "object", "description": "JSON Schema of the input, with \"type\": \"object\"."},
                "code": {"type": "string", "minLength": 1, "description": "The Python 3 program."},
                "examples": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": check::MAX_EXAMPLES,
                    "items": {
                        "type": "object",
                        "properties": {"input": {"type": "object"}, "output": {}},
                        "required": ["input", "output"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["name", "description", "input_schema", "code", "examples"],
            "additionalProperties": false
        }),
        kind: ToolKind::Builtin,
        declarations: declarations(),
    };
    FnTool::new(spec, move |ctx, args| {
        let shared = shared.clone();
        Box::pin(async move { shared.define(ctx, arguments(args)?).await })
    })
}

impl Shared {
    /// `define`: checked, examples run and compared, published.
    async fn define(
        &self,
        ctx: ToolContext,
        definition: Definition,
    ) -> Result<ToolOutput, ToolError> {
        check_definition(&self.source, &definition)?;
        let catalog = self.catalog.clone();
        let (tenant, name) = (ctx.tenant_id.clone(), definition.name.clone());
        match blocking(move || catalog.get(&tenant, &name)).await {
            Err(CatalogError::Unknown(_)) => {}
            Ok(_) => return Err(catalog_error(CatalogError::NameTaken(definition.name))),
            Err(other) => return Err(catalog_error(other)),
        }
        let mut outcomes = Vec::new();
        let mut failed = 0;
        for (index, example) in definition.examples.iter().enumerate() {
            let workspace = runner::workspace(&ctx, &format!("e{index}"))?;
            let outcome = match self
                .runner
                .run(&workspace, &definition.code, &example.input)
                .await
            {
                Ok(ran) => match first_difference(&example.output, &ran.output) {
                    None => {
                        json!({"example": index, "passed": true, "duration_ms": ran.duration_ms})
                    }
                    Some(difference) => {
                        failed += 1;
                        json!({
                            "example": index,
                            "passed": false,
                            "rule": rules::EXAMPLE_FAILED,
                            "output": ran.output,
                            "first_difference": difference,
                        })
                    }
                },
                Err(error) => {
                    failed += 1;
                    json!({
                        "example": index,
                        "passed": false,
                        "rule": error.rule.unwrap_or(rules::EXAMPLE_FAILED),
                        "error": error.message,
                    })
                }
            };
            outcomes.push(outcome);
        }
        let full_name = format!("{}__{}", self.source, definition.name);
        if failed > 0 {
            let report = json!({
                "defined": false,
                "name": full_name,
                "rule": rules::EXAMPLE_FAILED,
                "examples": outcomes,
            });
            return Ok(ToolOutput {
                blocks: vec![
                    loom_core::content::Block::text(format!(
                        "refused by rule '{}': {failed} of {} examples failed; the tool was not \
                         defined. Fix the code or the examples and define it again.",
                        rules::EXAMPLE_FAILED,
                        definition.examples.len()
                    )),
                    loom_core::content::Block::json(report.clone()),
                ],
                data: Some(report),
                is_error: true,
                ..ToolOutput::default()
            });
        }
        let sha256 = code_sha256(&definition.code);
        let entry = CatalogEntry {
            name: definition.name.clone(),
            description: definition.description.trim().to_owned(),
            input_schema: definition.input_schema,
            examples: definition.examples,
            language: "python3".into(),
            code_sha256: sha256.clone(),
            defined_by: DefinedBy {
                session_id: ctx.session_id.clone(),
                run_id: ctx.run_id.clone(),
                call_id: ctx.call_id.clone(),
            },
        };
        let catalog = self.catalog.clone();
        let tenant = ctx.tenant_id.clone();
        let code = definition.code;
        blocking(move || catalog.publish(&tenant, &entry, &code))
            .await
            .map_err(catalog_error)?;
        tracing::info!(tenant = %ctx.tenant_id, tool = %full_name, %sha256, "forged tool published");
        Ok(ToolOutput::json(json!({
            "defined": true,
            "name": full_name,
            "sha256": sha256,
            "examples": outcomes,
            "note": format!(
                "in this run, call it through {}__call with {{\"name\": \"{}\", \"input\": …}}; \
                 from the next run on it is offered as {full_name}",
                self.source, definition.name
            ),
        })))
    }

    /// Runs `code` on `input` (checked against `schema`) for a call.
    async fn run(
        &self,
        ctx: &ToolContext,
        schema: &Value,
        code: &str,
        input: &Value,
    ) -> Result<ToolOutput, ToolError> {
        let validator = check_schema(schema)?;
        check_input(&validator, input).map_err(|why| {
            ToolError::refused(
                rules::INPUT,
                format!(
                    "refused by rule '{}': the input does not match the tool's schema: {why}",
                    rules::INPUT
                ),
            )
        })?;
        let workspace = runner::workspace(ctx, "call")?;
        let ran = self.runner.run(&workspace, code, input).await?;
        Ok(ToolOutput::json(ran.output))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallArgs {
    name: String,
    input: Value,
}

fn call(shared: Arc<Shared>) -> FnTool {
    let spec = ToolSpec {
        name: "call".into(),
        description: format!(
            "Call a tool you defined in this run with {0}__define (tools defined before this \
             run are offered as {0}__<name>; call them that way).",
            shared.source
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "description": "The name given to define."},
                "input": {"type": "object", "description": "The input, matching the tool's schema."}
            },
            "required": ["name", "input"],
            "additionalProperties": false
        }),
        kind: ToolKind::Builtin,
        declarations: declarations(),
    };
    FnTool::new(spec, move |ctx, args| {
        let shared = shared.clone();
        Box::pin(async move {
            let args: CallArgs = arguments(args)?;
            let catalog = shared.catalog.clone();
            let (tenant, name) = (ctx.tenant_id.clone(), args.name.clone());
            let (entry, code) = blocking(move || catalog.get(&tenant, &name))
                .await
                .map_err(catalog_error)?;
            if entry.defined_by.run_id != ctx.run_id {
                return Err(ToolError::refused(
                    rules::OFFERED,
                    format!(
                        "refused by rule '{}': '{}' was defined before this run; call it as \
                         {}__{}, where the declarations and approvals set for it apply",
                        rules::OFFERED,
                        entry.name,
                        shared.source,
                        entry.name
                    ),
                ));
            }
            shared
                .run(&ctx, &entry.input_schema, &code, &args.input)
                .await
        })
    })
}

/// The tool of a catalog entry, its program as read when the source opened.
fn forged(shared: Arc<Shared>, entry: CatalogEntry, code: String) -> Result<FnTool, ToolError> {
    check_schema(&entry.input_schema)?;
    let spec = ToolSpec {
        name: entry.name.clone(),
        description: entry.description.clone(),
        input_schema: entry.input_schema.clone(),
        kind: ToolKind::Builtin,
        declarations: declarations(),
    };
    let entry = Arc::new((entry, code));
    Ok(FnTool::new(spec, move |ctx, input| {
        let (shared, entry) = (shared.clone(), entry.clone());
        Box::pin(async move {
            let (entry, code) = &*entry;
            shared.run(&ctx, &entry.input_schema, code, &input).await
        })
    }))
}
