//! The tools an agent with a sandbox gets: `sandbox__read`, `sandbox__write`, `sandbox__list`
//! and `sandbox__exec`, each on the working folder of the call's run or session.
//!
//! Named like a tool source's tools (`<source>__<tool>`), of kind `builtin`. `read` and `list`
//! change nothing (`side_effects: none`, idempotent); `write` is reversible and `exec`
//! irreversible, neither idempotent, so a call interrupted by a crash is never run again
//! blindly on resume. Every `exec` result carries the command, its exit code or signal, the
//! limit that ended it, its output sizes and truncation flags, and its duration: the engine
//! journals it in `tool.completed`.

use std::sync::Arc;

use loom_core::{
    sandbox::{ExecRequest, Limits, Sandbox, SandboxError, Workspace, rules},
    tool::{
        FnTool, SideEffects, ToolContext, ToolDeclarations, ToolError, ToolKind, ToolOutput,
        ToolSpec,
    },
};
use serde::Deserialize;
use serde_json::{Value, json};

/// The prefix of the sandbox tools' names.
pub const PREFIX: &str = "sandbox__";

/// Which working folder a call works in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// One folder per run (`<tenant>/run-<run id>`).
    #[default]
    Run,
    /// One folder per session, kept across its runs (`<tenant>/session-<session id>`).
    Session,
}

/// How an agent's sandbox tools call the sandbox.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The backend.
    pub sandbox: Arc<dyn Sandbox>,
    /// Per run or per session.
    pub scope: Scope,
    /// The limits of each command.
    pub limits: Limits,
    /// Whether commands may reach the network.
    pub network: bool,
}

impl Settings {
    /// The working folder of a call.
    pub fn workspace(&self, ctx: &ToolContext) -> Result<Workspace, ToolError> {
        let scope = match self.scope {
            Scope::Run => format!("run-{}", ctx.run_id),
            Scope::Session => format!("session-{}", ctx.session_id),
        };
        Workspace::new(&ctx.tenant_id, &scope).map_err(|e| tool_error(&e))
    }

    /// Runs `command` in the call's working folder under these settings.
    pub async fn exec(
        &self,
        ctx: &ToolContext,
        command: String,
    ) -> Result<loom_core::sandbox::ExecOutcome, ToolError> {
        let workspace = self.workspace(ctx)?;
        self.sandbox
            .exec(
                &workspace,
                ExecRequest {
                    command,
                    limits: self.limits,
                    network: self.network,
                },
            )
            .await
            .map_err(|e| tool_error(&e))
    }
}

/// A sandbox error as a tool error: a refusal keeps its rule.
pub fn tool_error(error: &SandboxError) -> ToolError {
    match error.rule() {
        Some(rule) => ToolError::refused(rule, error.to_string()),
        None => ToolError::new(error.to_string()),
    }
}

/// The four tools on `settings`.
pub fn sandbox_tools(settings: Settings) -> Vec<FnTool> {
    let settings = Arc::new(settings);
    vec![
        read(settings.clone()),
        write(settings.clone()),
        list(settings.clone()),
        exec(settings),
    ]
}

/// The spec of a built-in tool `<prefix><name>` of this crate: idempotent when it changes
/// nothing.
pub(crate) fn builtin_spec(
    prefix: &str,
    name: &str,
    description: String,
    schema: Value,
    side_effects: SideEffects,
) -> ToolSpec {
    ToolSpec {
        name: format!("{prefix}{name}"),
        description,
        input_schema: schema,
        kind: ToolKind::Builtin,
        declarations: ToolDeclarations {
            side_effects,
            idempotent: side_effects == SideEffects::None,
            ..ToolDeclarations::default()
        },
    }
}

/// A tool's arguments, read into `T` (a clear error when they do not fit).
pub(crate) fn arguments<T: for<'de> Deserialize<'de>>(value: Value) -> Result<T, ToolError> {
    serde_json::from_value(value).map_err(|e| ToolError::new(format!("invalid arguments: {e}")))
}

#[derive(Deserialize)]
struct PathArgs {
    #[serde(default)]
    path: String,
}

#[derive(Deserialize)]
struct WriteArgs {
    path: String,
    content: String,
}

#[derive(Deserialize)]
struct ExecArgs {
    command: String,
}

fn read(settings: Arc<Settings>) -> FnTool {
    let spec = builtin_spec(
        PREFIX,
        "read",
        "Read a UTF-8 text file of your working folder (at most 1 MiB). Paths are relative to \
         the folder."
            .into(),
        json!({
            "type": "object",
            "properties": {"path": {"type": "string", "description": "Path inside the working folder."}},
            "required": ["path"],
            "additionalProperties": false
        }),
        SideEffects::None,
    );
    FnTool::new(spec, move |ctx, args| {
        let settings = settings.clone();
        Box::pin(async move {
            let args: PathArgs = arguments(args)?;
            let workspace = settings.workspace(&ctx)?;
            let bytes = settings
                .sandbox
                .read(&workspace, &args.path)
                .await
                .map_err(|e| tool_error(&e))?;
            String::from_utf8(bytes)
                .map(ToolOutput::text)
                .map_err(|_| ToolError::new(format!("'{}' is not UTF-8 text", args.path)))
        })
    })
}

fn write(settings: Arc<Settings>) -> FnTool {
    let spec = builtin_spec(
        PREFIX,
        "write",
        "Write a text file in your working folder (created with its folders, or replaced; at \
         most 1 MiB). Paths are relative to the folder."
            .into(),
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path inside the working folder."},
                "content": {"type": "string", "description": "The text to write."}
            },
            "required": ["path", "content"],
            "additionalProperties": false
        }),
        SideEffects::Reversible,
    );
    FnTool::new(spec, move |ctx, args| {
        let settings = settings.clone();
        Box::pin(async move {
            let args: WriteArgs = arguments(args)?;
            let workspace = settings.workspace(&ctx)?;
            let bytes = settings
                .sandbox
                .write(&workspace, &args.path, args.content.into_bytes())
                .await
                .map_err(|e| tool_error(&e))?;
            Ok(ToolOutput::json(json!({"path": args.path, "bytes": bytes})))
        })
    })
}

fn list(settings: Arc<Settings>) -> FnTool {
    let spec = builtin_spec(
        PREFIX,
        "list",
        "List the files of your working folder, recursively (links are shown, not followed)."
            .into(),
        json!({
            "type": "object",
            "properties": {"path": {"type": "string", "description": "A folder inside the working folder; empty for all of it."}},
            "additionalProperties": false
        }),
        SideEffects::None,
    );
    FnTool::new(spec, move |ctx, args| {
        let settings = settings.clone();
        Box::pin(async move {
            let args: PathArgs = arguments(args)?;
            let workspace = settings.workspace(&ctx)?;
            let entries = settings
                .sandbox
                .list(&workspace, &args.path)
                .await
                .map_err(|e| tool_error(&e))?;
            let entries = serde_json::to_value(entries)
                .map_err(|e| ToolError::new(format!("cannot render the listing: {e}")))?;
            Ok(ToolOutput::json(json!({"entries": entries})))
        })
    })
}

fn exec(settings: Arc<Settings>) -> FnTool {
    let limits = settings.limits;
    let spec = builtin_spec(
        PREFIX,
        "exec",
        format!(
            "Run a shell command (/bin/sh -c) in your working folder, which is the current \
             directory (/work) and the only place you can write. No network{}. Limits: {} ms \
             of wall time, {} ms of CPU, {} MiB of memory, {} processes; each output stream \
             is cut after {} bytes. Returns the exit code (or signal), the outputs and their \
             sizes.",
            if settings.network {
                " restriction"
            } else {
                " access"
            },
            limits.wall_ms,
            limits.cpu_ms,
            limits.memory_mb,
            limits.processes,
            limits.output_bytes
        ),
        json!({
            "type": "object",
            "properties": {"command": {"type": "string", "minLength": 1, "description": "The shell command line."}},
            "required": ["command"],
            "additionalProperties": false
        }),
        SideEffects::Irreversible,
    );
    FnTool::new(spec, move |ctx, args| {
        let settings = settings.clone();
        Box::pin(async move {
            let args: ExecArgs = arguments(args)?;
            let outcome = settings.exec(&ctx, args.command).await?;
            exec_output(&outcome)
        })
    })
}

/// An exec outcome as a tool result: the whole outcome as JSON, with a note naming the rule
/// of a limit that ended the command or cut its output.
pub fn exec_output(outcome: &loom_core::sandbox::ExecOutcome) -> Result<ToolOutput, ToolError> {
    let mut value = serde_json::to_value(outcome)
        .map_err(|e| ToolError::new(format!("cannot render the outcome: {e}")))?;
    let mut notes = Vec::new();
    if let Some(limit) = &outcome.limit {
        notes.push(format!("stopped by rule '{limit}'"));
    }
    if outcome.stdout_truncated || outcome.stderr_truncated {
        notes.push(format!("output cut by rule '{}'", rules::OUTPUT_SIZE));
    }
    if let (Some(object), false) = (value.as_object_mut(), notes.is_empty()) {
        object.insert("note".into(), Value::String(notes.join("; ")));
    }
    Ok(ToolOutput::json(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_core::tool::Tool;

    #[test]
    fn exec_and_write_are_side_effecting_and_not_idempotent() {
        let settings = Settings {
            sandbox: Arc::new(
                crate::LocalSandbox::new(tempfile::tempdir().unwrap().path().join("s")).unwrap(),
            ),
            scope: Scope::Run,
            limits: Limits::default(),
            network: false,
        };
        let tools = sandbox_tools(settings);
        let declared: Vec<(&str, SideEffects, bool)> = tools
            .iter()
            .map(|t| {
                let spec = t.spec();
                (
                    spec.name.as_str(),
                    spec.declarations.side_effects,
                    spec.declarations.idempotent,
                )
            })
            .collect();
        assert_eq!(
            declared,
            [
                ("sandbox__read", SideEffects::None, true),
                ("sandbox__write", SideEffects::Reversible, false),
                ("sandbox__list", SideEffects::None, true),
                ("sandbox__exec", SideEffects::Irreversible, false),
            ]
        );
        assert!(tools.iter().all(|t| t.spec().kind == ToolKind::Builtin));
    }

    #[test]
    fn the_working_folder_follows_the_scope() {
        let ctx = ToolContext {
            tenant_id: "acme".into(),
            session_id: "s1".into(),
            run_id: "r1".into(),
            call_id: "c".into(),
            idempotency_key: "k".into(),
            traceparent: None,
        };
        let mut settings = Settings {
            sandbox: Arc::new(
                crate::LocalSandbox::new(tempfile::tempdir().unwrap().path().join("s")).unwrap(),
            ),
            scope: Scope::Run,
            limits: Limits::default(),
            network: false,
        };
        assert_eq!(settings.workspace(&ctx).unwrap().to_string(), "acme/run-r1");
        settings.scope = Scope::Session;
        assert_eq!(
            settings.workspace(&ctx).unwrap().to_string(),
            "acme/session-s1"
        );
    }
}
