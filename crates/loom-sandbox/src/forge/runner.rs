//! Running a forged tool's program once: the program and its input written into a fresh
//! working folder, `python3 tool.py < input.json` executed there through the [`Sandbox`] port
//! under the forge's limits, the standard output read as one JSON value.

use std::sync::Arc;

use loom_core::{
    sandbox::{ExecRequest, Limits, Sandbox, Workspace, rules as sandbox_rules},
    tool::{ToolContext, ToolError},
};
use serde_json::Value;

use super::rules;
use crate::tool_error;

/// Characters of standard error quoted in an error.
const STDERR_QUOTED: usize = 2_000;

/// How programs run: the backend, the limits of each run, the network.
#[derive(Debug, Clone)]
pub struct Runner {
    /// The backend.
    pub sandbox: Arc<dyn Sandbox>,
    /// The limits of each run (one example, one call).
    pub limits: Limits,
    /// Whether programs may reach the network.
    pub network: bool,
}

/// What a run printed.
#[derive(Debug, Clone, PartialEq)]
pub struct Ran {
    /// The JSON value of its standard output.
    pub output: Value,
    /// Its wall-clock duration, in milliseconds.
    pub duration_ms: u64,
}

/// The working folder of one run of a call: `<tenant>/forge-<call key>-<label>`, new for each
/// call and each example (the call key is derived from the run and call ids).
pub fn workspace(ctx: &ToolContext, label: &str) -> Result<Workspace, ToolError> {
    let key: String = ctx
        .idempotency_key
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(40)
        .collect();
    Workspace::new(&ctx.tenant_id, &format!("forge-{key}-{label}")).map_err(|e| tool_error(&e))
}

impl Runner {
    /// Runs `code` on `input` in `workspace`; every failure is a refusal naming its rule
    /// (a sandbox limit, [`rules::EXIT`], [`rules::OUTPUT_JSON`]).
    pub async fn run(
        &self,
        workspace: &Workspace,
        code: &str,
        input: &Value,
    ) -> Result<Ran, ToolError> {
        let write = |path: &'static str, bytes: Vec<u8>| async move {
            self.sandbox
                .write(workspace, path, bytes)
                .await
                .map_err(|e| tool_error(&e))
        };
        write("tool.py", code.as_bytes().to_vec()).await?;
        write("input.json", input.to_string().into_bytes()).await?;
        let outcome = self
            .sandbox
            .exec(
                workspace,
                ExecRequest {
                    command: "python3 tool.py < input.json".into(),
                    limits: self.limits,
                    network: self.network,
                },
            )
            .await
            .map_err(|e| tool_error(&e))?;
        let stderr = quoted(&outcome.stderr);
        if let Some(limit) = outcome.limit.as_deref() {
            let rule = sandbox_rules::by_name(limit).unwrap_or(rules::EXIT);
            return Err(ToolError::refused(
                rule,
                format!(
                    "refused by rule '{rule}': the program was stopped ({} ms of wall time, {} ms \
                     of CPU, {} MiB of memory at most){stderr}",
                    self.limits.wall_ms, self.limits.cpu_ms, self.limits.memory_mb
                ),
            ));
        }
        if outcome.exit_code != Some(0) {
            let ended = match (outcome.exit_code, outcome.signal) {
                (Some(code), _) => format!("exited with code {code}"),
                (None, Some(signal)) => format!("was killed by signal {signal}"),
                (None, None) => "ended without an exit code".to_owned(),
            };
            return Err(ToolError::refused(
                rules::EXIT,
                format!(
                    "refused by rule '{}': the program {ended}{stderr}",
                    rules::EXIT
                ),
            ));
        }
        if outcome.stdout_truncated {
            let rule = sandbox_rules::OUTPUT_SIZE;
            return Err(ToolError::refused(
                rule,
                format!(
                    "refused by rule '{rule}': the program printed {} bytes, more than the {} \
                     kept",
                    outcome.stdout_bytes, self.limits.output_bytes
                ),
            ));
        }
        let output = serde_json::from_str(outcome.stdout.trim()).map_err(|error| {
            ToolError::refused(
                rules::OUTPUT_JSON,
                format!(
                    "refused by rule '{}': the program must print one JSON value on its \
                     standard output ({error}); it printed {:?}{stderr}",
                    rules::OUTPUT_JSON,
                    quoted_plain(&outcome.stdout)
                ),
            )
        })?;
        Ok(Ran {
            output,
            duration_ms: outcome.duration_ms,
        })
    }
}

/// The end of standard error, as a suffix of a message (empty when there is none).
fn quoted(stderr: &str) -> String {
    let stderr = stderr.trim();
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; standard error: {}", quoted_plain(stderr))
    }
}

/// At most [`STDERR_QUOTED`] characters of `text`, its end kept (where a traceback ends).
fn quoted_plain(text: &str) -> String {
    let count = text.chars().count();
    if count <= STDERR_QUOTED {
        return text.to_owned();
    }
    let tail: String = text.chars().skip(count - STDERR_QUOTED).collect();
    format!("…{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_call_and_example_gets_its_own_folder() {
        let ctx = ToolContext {
            tenant_id: "acme".into(),
            session_id: "s".into(),
            run_id: "r".into(),
            call_id: "c/../x".into(),
            idempotency_key: "ab12".repeat(16),
            traceparent: None,
        };
        let first = workspace(&ctx, "e0").unwrap();
        assert_eq!(first.tenant(), "acme");
        assert_eq!(first.scope(), format!("forge-{}-e0", &"ab12".repeat(10)));
        assert_ne!(workspace(&ctx, "e1").unwrap(), first);
    }

    #[test]
    fn long_output_is_quoted_by_its_end() {
        let text = format!("{}END", "x".repeat(5_000));
        let tail = quoted_plain(&text);
        assert!(tail.starts_with('…') && tail.ends_with("END"));
        assert_eq!(tail.chars().count(), STDERR_QUOTED + 1);
        assert_eq!(quoted(""), "");
    }
}
