//! One line per event worth telling while a run goes on: what `loom run --stream` prints on
//! stderr and what the MCP server sends as progress notifications.

use loom_core::{Event, event::Payload};
use serde_json::Value;

/// The progress line of `event` (tool calls and results, retries, fallbacks, approvals,
/// budgets, failure, cancellation), or `None` for an event not worth a line.
pub fn progress_line(event: &Event) -> Option<String> {
    match &event.payload {
        Payload::ToolCalled(called) => Some(format!(
            "· {}({})",
            called.tool_name,
            compact(&called.arguments)
        )),
        Payload::ToolCompleted(done) => Some(if done.output.is_error {
            format!(
                "· {}: done (error) — {}",
                done.tool_name,
                first_line(&done.output.visible_text())
            )
        } else {
            format!("· {}: done", done.tool_name)
        }),
        Payload::ModelRetried(retried) => Some(format!(
            "· {} failed ({}, attempt {}), retrying in {:.1} s",
            retried.model.as_deref().unwrap_or(&retried.model_id),
            retried.error_kind,
            retried.attempt,
            retried.delay_s
        )),
        Payload::ModelFellBack(fell) => Some(format!(
            "· fallback {}: {} → {} — {}",
            fell.slot, fell.from_model, fell.to_model, fell.reason
        )),
        Payload::CircuitOpened(circuit) => Some(format!(
            "· circuit opened: {} {} skipped for {} s ({} failures in a row)",
            circuit.target_kind, circuit.target, circuit.cooldown_s, circuit.failures
        )),
        Payload::ToolSourceUnavailable(source) => Some(format!(
            "· tool source {} unavailable{} — {}",
            source.source,
            if source.required { " (required)" } else { "" },
            source.error
        )),
        Payload::ArtifactStored(stored) if stored.origin == "offload" => Some(format!(
            "· result offloaded: {} ({}, {} bytes)",
            stored.name.as_deref().unwrap_or(&stored.uri),
            stored.media_type,
            stored.size
        )),
        Payload::RunFailed(failed) => Some(format!(
            "· failed ({}): {}",
            failed.error_type, failed.error
        )),
        Payload::RunCancelled(cancelled) => Some(format!("· cancelled ({})", cancelled.reason)),
        Payload::ApprovalRequested(requested) => Some(format!(
            "· approval requested: {} — {}{}",
            requested.tool_name,
            requested.reason,
            requested
                .expire_at
                .map(|at| format!(", until {}", at.format("%d/%m at %H:%M:%S")))
                .unwrap_or_default()
        )),
        Payload::ApprovalGranted(granted) => Some(format!(
            "· approval granted by {}: {}",
            granted.by, granted.tool_name
        )),
        Payload::ApprovalRejected(rejected) => Some(format!(
            "· approval rejected by {}: {}{}",
            rejected.by,
            rejected.tool_name,
            rejected
                .reason
                .as_deref()
                .map(|r| format!(" — {r}"))
                .unwrap_or_default()
        )),
        Payload::ApprovalExpired(expired) => Some(format!(
            "· approval expired: {} ({})",
            expired.tool_name, expired.action
        )),
        Payload::IdempotencyReused(reused) => Some(format!(
            "· {}: already done (key {}), recorded result reused",
            reused.tool_name, reused.key
        )),
        Payload::BudgetExceeded(budget) => Some(format!(
            "· {} budget reached: {} (limit {}) — {}",
            budget.scope,
            budget_amount(&budget.limit, budget.spent),
            budget_amount(&budget.limit, budget.value),
            if budget.action == "stop" {
                "stop"
            } else {
                "warning"
            }
        )),
        _ => None,
    }
}

/// A budget amount of `limit` (`max_cost`, `max_tokens`, `max_calls`) as people read it.
fn budget_amount(limit: &str, value: f64) -> String {
    match limit {
        "max_cost" => format!("{value:.5} $"),
        "max_tokens" if value == 1.0 => "1 token".to_owned(),
        "max_tokens" => format!("{value} tokens"),
        "max_calls" if value == 1.0 => "1 call".to_owned(),
        "max_calls" => format!("{value} calls"),
        _ => format!("{value}"),
    }
}

fn compact(value: &Value) -> String {
    value.to_string()
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use loom_core::event::{BudgetExceeded, Envelope};

    use super::*;

    #[test]
    fn a_budget_reached_gets_a_progress_line() {
        let event = |limit: &str, value: f64, spent: f64, action: &str| {
            Event::new(
                Envelope {
                    event_id: "e1".into(),
                    ts: chrono::Utc::now(),
                    tenant_id: "default".into(),
                    session_id: "s1".into(),
                    run_id: "r1".into(),
                    root_run_id: "r1".into(),
                    span_id: "span".into(),
                    parent_span_id: None,
                    agent: Some("demo".into()),
                    role: None,
                },
                Payload::BudgetExceeded(BudgetExceeded {
                    scope: "run".into(),
                    limit: limit.into(),
                    value,
                    spent,
                    action: action.into(),
                    policy: Some("loom.budget".into()),
                }),
            )
        };
        assert_eq!(
            progress_line(&event("max_calls", 2.0, 2.0, "stop")).as_deref(),
            Some("· run budget reached: 2 calls (limit 2 calls) — stop")
        );
        assert_eq!(
            progress_line(&event("max_cost", 0.001, 0.002_31, "warn")).as_deref(),
            Some("· run budget reached: 0.00231 $ (limit 0.00100 $) — warning")
        );
        assert_eq!(
            progress_line(&event("max_tokens", 1.0, 577.0, "stop")).as_deref(),
            Some("· run budget reached: 577 tokens (limit 1 token) — stop")
        );
    }
}
