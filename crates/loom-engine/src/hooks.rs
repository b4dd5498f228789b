//! The policy chain of a hook point: the agent's policies, in declared order.
//!
//! A `replace` passes the new value on to the next policy; any other decision but `continue`
//! ends the chain. Every decision but `continue` becomes a `policy.decided` payload, which the
//! caller journals before (or in the same append as) its effect. A policy that errs, times
//! out, or returns a decision it did not declare or that its point does not allow is handled
//! by its `on_error`: `block` fails the run, `allow` journals a `continue` marked as an error
//! and lets the chain go on. A `retry` beyond the policy's `max_attempts` becomes a failure.

use std::time::Duration;

use loom_core::{
    Message, RunState,
    event::{Payload, PolicyDecided},
    policy::{Decision, DecisionKind, Point, PolicyContext, Replacement, Subject},
};

use crate::{
    binding::{BoundPolicy, PolicyOnError},
    events::Events,
};

/// How a chain ended.
#[derive(Debug)]
pub(crate) enum End {
    /// Every policy let the subject through (possibly replaced).
    Continue,
    /// Send the output back to its author.
    Retry {
        /// The policy.
        policy: String,
        /// Its diagnostic.
        feedback: String,
    },
    /// Refuse the tool call.
    Deny {
        /// The policy.
        policy: String,
        /// Why.
        reason: String,
    },
    /// Ask a human before the call.
    Pause {
        /// The policy.
        policy: String,
        /// Why.
        reason: String,
    },
    /// Finish the run now.
    Stop {
        /// Why.
        reason: String,
    },
    /// Fail the run.
    Fail {
        /// `policy.<name>`.
        error_type: String,
        /// Why.
        reason: String,
    },
}

/// The outcome of a chain: the subject as the last policy left it, the decisions to journal,
/// and how the chain ended.
#[derive(Debug)]
pub(crate) struct Chain {
    /// The subject, after replacements.
    pub(crate) subject: Subject,
    /// Whether a policy replaced it.
    pub(crate) replaced: bool,
    /// `policy.decided` payloads, in decision order.
    pub(crate) decisions: Vec<Payload>,
    /// How it ended.
    pub(crate) end: End,
}

/// Runs the policies hooked on `subject`'s point. `call_id` names the tool call at tool
/// points (repairs are then counted per call).
pub(crate) async fn run(
    policies: &[BoundPolicy],
    events: &Events<'_>,
    state: &RunState,
    subject: Subject,
    call_id: Option<&str>,
) -> Chain {
    let run = events.run();
    let point = subject.point();
    let mut chain = Chain {
        subject,
        replaced: false,
        decisions: Vec::new(),
        end: End::Continue,
    };
    for bound in policies.iter().filter(|p| p.points.contains(&point)) {
        let key = match call_id {
            Some(call_id) => format!("{}#{call_id}", bound.name),
            None => bound.name.clone(),
        };
        let attempt = state.retries.get(&key).copied().unwrap_or(0);
        let context = PolicyContext {
            name: bound.name.clone(),
            params: bound.params.clone(),
            point,
            attempt,
            tenant_id: run.tenant_id.clone(),
            session_id: run.session_id.clone(),
            run_id: run.run_id.clone(),
            agent: events.agent().to_owned(),
            tools_called: state.tools_called.clone(),
            iterations: state.iterations,
        };
        let decided = decide(bound, &chain.subject, &context).await;
        let decision = match decided {
            Ok(decision) => decision,
            Err(problem) => match bound.on_error {
                PolicyOnError::Allow => {
                    tracing::warn!(policy = %bound.name, %point, error = %problem, "policy failed; allowed by on_error");
                    chain.decisions.push(decided_payload(
                        bound,
                        point,
                        DecisionKind::Continue,
                        Some(problem),
                        call_id,
                        true,
                    ));
                    continue;
                }
                PolicyOnError::Block => {
                    let reason = format!("policy {} failed: {problem}", bound.name);
                    chain.decisions.push(decided_payload(
                        bound,
                        point,
                        DecisionKind::Fail,
                        Some(reason.clone()),
                        call_id,
                        true,
                    ));
                    chain.end = End::Fail {
                        error_type: format!("policy.{}", bound.name),
                        reason,
                    };
                    return chain;
                }
            },
        };
        let kind = decision.kind();
        match decision {
            Decision::Continue => {}
            Decision::Replace { value, reason } => {
                let mut payload =
                    decided_payload(bound, point, DecisionKind::Replace, reason, call_id, false);
                if let Payload::PolicyDecided(p) = &mut payload {
                    match &value {
                        Replacement::Arguments(arguments) => p.arguments = Some(arguments.clone()),
                        Replacement::Output(output) => {
                            p.output = serde_json::to_value(output).ok();
                        }
                        Replacement::Message(message) => {
                            p.output = serde_json::to_value(message).ok();
                        }
                        Replacement::Request(_) => {}
                    }
                }
                chain.decisions.push(payload);
                chain.subject = replaced(chain.subject, value);
                chain.replaced = true;
            }
            Decision::Retry { feedback, tools } => {
                if attempt >= bound.max_attempts {
                    let reason = format!(
                        "{} repair(s) asked without success; last diagnostic: {feedback}",
                        attempt
                    );
                    chain.decisions.push(decided_payload(
                        bound,
                        point,
                        DecisionKind::Fail,
                        Some(reason.clone()),
                        call_id,
                        false,
                    ));
                    chain.end = End::Fail {
                        error_type: format!("policy.{}", bound.name),
                        reason,
                    };
                    return chain;
                }
                let mut payload =
                    decided_payload(bound, point, kind, Some(feedback.clone()), call_id, false);
                if let Payload::PolicyDecided(p) = &mut payload {
                    p.attempt = Some(attempt + 1);
                    p.tools = Some(tools);
                }
                chain.decisions.push(payload);
                chain.end = End::Retry {
                    policy: bound.name.clone(),
                    feedback,
                };
                return chain;
            }
            Decision::Deny(reason)
            | Decision::Pause(reason)
            | Decision::Stop(reason)
            | Decision::Fail(reason) => {
                chain.decisions.push(decided_payload(
                    bound,
                    point,
                    kind,
                    Some(reason.clone()),
                    call_id,
                    false,
                ));
                let policy = bound.name.clone();
                chain.end = match kind {
                    DecisionKind::Deny => End::Deny { policy, reason },
                    DecisionKind::Pause => End::Pause { policy, reason },
                    DecisionKind::Stop => End::Stop { reason },
                    _ => End::Fail {
                        error_type: format!("policy.{policy}"),
                        reason,
                    },
                };
                return chain;
            }
        }
    }
    chain
}

/// Asks one policy, within its timeout, and checks what it answered.
async fn decide(
    bound: &BoundPolicy,
    subject: &Subject,
    context: &PolicyContext,
) -> Result<Decision, String> {
    let point = context.point;
    // The policy decides in its own task: a slow synchronous policy cannot hold the timeout
    // back (it fires on another worker), and a panic is the policy's error, not the run's.
    let policy = bound.policy.clone();
    let (owned_subject, owned_context) = (subject.clone(), context.clone());
    let mut task = tokio::spawn(async move { policy.decide(&owned_subject, &owned_context).await });
    let joined = match bound.timeout {
        Some(limit) => match tokio::time::timeout(limit, &mut task).await {
            Ok(joined) => joined,
            Err(_) => {
                task.abort();
                return Err(format!("no decision in {}", secs(limit)));
            }
        },
        None => task.await,
    };
    let decision = match joined {
        Ok(result) => result.map_err(|e| e.0)?,
        Err(error) if error.is_panic() => {
            let panic = error.into_panic();
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".to_owned());
            return Err(format!("it stopped abnormally: {why}"));
        }
        Err(_) => return Err("its task was cancelled".into()),
    };
    let kind = decision.kind();
    if kind != DecisionKind::Continue && !bound.policy.decisions().contains(&kind) {
        return Err(format!("it returned '{kind}', which it does not declare"));
    }
    if !point.allows(kind) {
        return Err(format!("'{kind}' is not allowed at {point}"));
    }
    if let Decision::Replace { value, .. } = &decision {
        if value.point() != point {
            return Err(format!(
                "its replacement is for {}, not for {point}",
                value.point()
            ));
        }
        match value {
            Replacement::Arguments(arguments) if !arguments.is_object() => {
                return Err("replacement arguments must be a JSON object".into());
            }
            Replacement::Message(message) => {
                if message.role != loom_core::Role::Assistant {
                    return Err("a replacement answer must be an assistant message".into());
                }
                if message.blocks.iter().any(|b| {
                    !matches!(
                        b.kind,
                        loom_core::BlockKind::Text { .. } | loom_core::BlockKind::Json { .. }
                    )
                }) {
                    return Err("a replacement answer may hold only text and JSON blocks".into());
                }
                message
                    .check()
                    .map_err(|e| format!("its replacement answer is not valid: {e}"))?;
            }
            Replacement::Output(output)
                if output
                    .blocks
                    .iter()
                    .any(|b| matches!(b.kind, loom_core::BlockKind::InlineData { .. })) =>
            {
                return Err(
                    "a replacement result may not carry file bytes (store them as an artifact)"
                        .into(),
                );
            }
            _ => {}
        }
    }
    Ok(decision)
}

fn secs(duration: Duration) -> String {
    crate::units::fmt_secs(duration) + " s"
}

fn replaced(subject: Subject, value: Replacement) -> Subject {
    match (subject, value) {
        (Subject::Request(_), Replacement::Request(request)) => Subject::Request(request),
        (Subject::Call { tool, call_id, .. }, Replacement::Arguments(arguments)) => Subject::Call {
            tool,
            call_id,
            arguments,
        },
        (Subject::Result { tool, call_id, .. }, Replacement::Output(output)) => Subject::Result {
            tool,
            call_id,
            output,
        },
        (Subject::Output(_), Replacement::Message(message)) => Subject::Output(message),
        // `decide` checked that the replacement fits the point.
        (subject, _) => subject,
    }
}

/// A `policy.decided` payload.
pub(crate) fn decided_payload(
    bound: &BoundPolicy,
    point: Point,
    kind: DecisionKind,
    reason: Option<String>,
    call_id: Option<&str>,
    error: bool,
) -> Payload {
    decided(&bound.name, point, kind, reason, call_id, error)
}

/// A `policy.decided` payload for any policy, built-in ones included.
pub(crate) fn decided(
    policy: &str,
    point: Point,
    kind: DecisionKind,
    reason: Option<String>,
    call_id: Option<&str>,
    error: bool,
) -> Payload {
    Payload::PolicyDecided(PolicyDecided {
        policy: policy.to_owned(),
        point: point.as_str().to_owned(),
        decision: kind.as_str().to_owned(),
        reason,
        call_id: call_id.map(str::to_owned),
        attempt: None,
        tools: None,
        arguments: None,
        output: None,
        error,
    })
}

/// The `policy.decided` of a built-in guard (`loom.contract`, `loom.judge.<name>`) that puts
/// `message` in place of the final output.
pub(crate) fn output_replaced(policy: &str, reason: String, message: &Message) -> Payload {
    let mut payload = decided(
        policy,
        Point::OnOutput,
        DecisionKind::Replace,
        Some(reason),
        None,
        false,
    );
    if let Payload::PolicyDecided(p) = &mut payload {
        p.output = serde_json::to_value(message).ok();
    }
    payload
}

/// The text of a refused call's result.
pub(crate) fn denied(policy: &str, reason: &str) -> String {
    format!("Call refused ({policy}): {reason}")
}

/// The text of a plain tool's result refused by an `after_tool` retry.
pub(crate) fn result_refused(policy: &str, feedback: &str) -> String {
    format!("Result refused ({policy}): {feedback}")
}

/// The repair message given to the model (an engine note: a scripted model does not count it
/// as a turn of the user).
pub(crate) fn repair_text(policy: &str, feedback: &str) -> String {
    loom_core::model::repair_message(policy, feedback)
}

/// The result of a call closed without running because its answer was refused.
pub(crate) fn not_run_refused(policy: &str) -> String {
    format!("Not run: the answer was refused by the check {policy}.")
}

/// The result of a call closed without running because the run was stopped.
pub(crate) fn not_run_stopped(why: &str) -> String {
    format!("Not run: the run was stopped ({why}).")
}
