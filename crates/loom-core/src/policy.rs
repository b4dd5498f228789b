//! Policies: deterministic code hooked on fixed points of the loop.
//!
//! "Code decides, the model proposes." A [`Policy`] looks at what crosses one [`Point`] of the
//! loop (the request about to go to the model, the model's answer, a tool call about to run,
//! a tool result, the final output) and returns a [`Decision`]. Which decisions make sense at
//! which point is fixed by [`Point::allows`] (the reference's table, §7.1): a policy declaring
//! a decision that its point does not allow is refused when the agent is loaded.
//!
//! The engine runs the policies of a point in declared order: a `replace` passes the new value
//! on to the next policy, any other decision but `continue` ends the chain, and every decision
//! but `continue` is journaled (`policy.decided`) before it takes effect.

use std::{fmt, sync::Arc};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{BoxFuture, Message, model::ModelRequest, tool::ToolOutput};

/// A point of the loop where policies are hooked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Point {
    /// Before each orchestrator model call; the subject is the request.
    BeforeModel,
    /// After each orchestrator answer; the subject is the answer.
    AfterModel,
    /// Before each tool call; the subject is the call and its arguments.
    BeforeTool,
    /// After each tool result; the subject is the result.
    AfterTool,
    /// Before the run completes; the subject is the final answer.
    OnOutput,
}

impl Point {
    /// Every point, in loop order.
    pub const ALL: [Point; 5] = [
        Point::BeforeModel,
        Point::AfterModel,
        Point::BeforeTool,
        Point::AfterTool,
        Point::OnOutput,
    ];

    /// The journal string.
    pub fn as_str(self) -> &'static str {
        match self {
            Point::BeforeModel => "before_model",
            Point::AfterModel => "after_model",
            Point::BeforeTool => "before_tool",
            Point::AfterTool => "after_tool",
            Point::OnOutput => "on_output",
        }
    }

    /// Parses a journal string.
    pub fn parse(text: &str) -> Option<Point> {
        Point::ALL.into_iter().find(|p| p.as_str() == text)
    }

    /// Whether a decision of this kind is allowed at this point (reference §7.1).
    pub fn allows(self, kind: DecisionKind) -> bool {
        use DecisionKind as D;
        match self {
            Point::BeforeModel => matches!(kind, D::Continue | D::Replace | D::Stop | D::Fail),
            Point::AfterModel => matches!(kind, D::Continue | D::Retry | D::Stop | D::Fail),
            Point::BeforeTool => matches!(
                kind,
                D::Continue | D::Replace | D::Deny | D::Pause | D::Fail
            ),
            Point::AfterTool | Point::OnOutput => {
                matches!(kind, D::Continue | D::Replace | D::Retry | D::Fail)
            }
        }
    }
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kinds of decision, without their values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// Nothing to say.
    Continue,
    /// Replace the subject.
    Replace,
    /// Send the output back to the model that produced it, with a diagnostic.
    Retry,
    /// Refuse the tool call (the model gets an error result).
    Deny,
    /// Ask a human before the tool call.
    Pause,
    /// Make the run finish now (one last answer without tools).
    Stop,
    /// Fail the run.
    Fail,
}

impl DecisionKind {
    /// Every kind.
    pub const ALL: [DecisionKind; 7] = [
        DecisionKind::Continue,
        DecisionKind::Replace,
        DecisionKind::Retry,
        DecisionKind::Deny,
        DecisionKind::Pause,
        DecisionKind::Stop,
        DecisionKind::Fail,
    ];

    /// The journal string.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Continue => "continue",
            DecisionKind::Replace => "replace",
            DecisionKind::Retry => "retry",
            DecisionKind::Deny => "deny",
            DecisionKind::Pause => "pause",
            DecisionKind::Stop => "stop",
            DecisionKind::Fail => "fail",
        }
    }
}

impl fmt::Display for DecisionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a policy looks at.
#[derive(Debug, Clone, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one subject per policy point, built and dropped there, never stored in bulk"
)]
pub enum Subject {
    /// `before_model`: the request about to be sent.
    Request(ModelRequest),
    /// `after_model`: the orchestrator's answer.
    Response(Message),
    /// `before_tool`: a call about to run.
    Call {
        /// The tool.
        tool: String,
        /// The call id.
        call_id: String,
        /// Its arguments (after earlier replacements).
        arguments: Value,
    },
    /// `after_tool`: a tool result.
    Result {
        /// The tool.
        tool: String,
        /// The call id.
        call_id: String,
        /// The result (after earlier replacements).
        output: ToolOutput,
    },
    /// `on_output`: the final answer.
    Output(Message),
}

impl Subject {
    /// The point this subject belongs to.
    pub fn point(&self) -> Point {
        match self {
            Subject::Request(_) => Point::BeforeModel,
            Subject::Response(_) => Point::AfterModel,
            Subject::Call { .. } => Point::BeforeTool,
            Subject::Result { .. } => Point::AfterTool,
            Subject::Output(_) => Point::OnOutput,
        }
    }

    /// The subject's text: the answer's or the output's text, a result's visible text, a
    /// call's arguments as JSON, or the last message of a request.
    pub fn text(&self) -> String {
        match self {
            Subject::Request(request) => request
                .messages
                .last()
                .map(|message| message.text())
                .unwrap_or_default(),
            Subject::Response(message) | Subject::Output(message) => message.text(),
            Subject::Call { arguments, .. } => arguments.to_string(),
            Subject::Result { output, .. } => output.visible_text(),
        }
    }
}

/// The new value of a `replace` decision; it must fit the point.
#[derive(Debug, Clone, PartialEq)]
pub enum Replacement {
    /// `before_model`: the request to send instead.
    Request(ModelRequest),
    /// `before_tool`: the arguments to run the tool with (a JSON object, checked again
    /// against the tool's schema).
    Arguments(Value),
    /// `after_tool`: the result to give the model instead.
    Output(ToolOutput),
    /// `on_output`: the final answer instead.
    Message(Message),
}

impl Replacement {
    /// The point where this replacement fits.
    pub fn point(&self) -> Point {
        match self {
            Replacement::Request(_) => Point::BeforeModel,
            Replacement::Arguments(_) => Point::BeforeTool,
            Replacement::Output(_) => Point::AfterTool,
            Replacement::Message(_) => Point::OnOutput,
        }
    }
}

/// A policy's decision.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // short-lived; boxing would burden every policy author
pub enum Decision {
    /// Nothing to say: the next policy looks.
    Continue,
    /// Replace the subject; the next policy sees the new value.
    Replace {
        /// The new value.
        value: Replacement,
        /// Why (journaled).
        reason: Option<String>,
    },
    /// Send the output back to its author with `feedback`.
    Retry {
        /// The diagnostic given to the model.
        feedback: String,
        /// Whether the repair may call tools.
        tools: bool,
    },
    /// Refuse the call; the model gets `Call refused (<policy>): <reason>`.
    Deny(String),
    /// Ask a human before the call runs.
    Pause(String),
    /// Make the run finish: one last answer without tools.
    Stop(String),
    /// Fail the run.
    Fail(String),
}

impl Decision {
    /// The decision's kind.
    pub fn kind(&self) -> DecisionKind {
        match self {
            Decision::Continue => DecisionKind::Continue,
            Decision::Replace { .. } => DecisionKind::Replace,
            Decision::Retry { .. } => DecisionKind::Retry,
            Decision::Deny(_) => DecisionKind::Deny,
            Decision::Pause(_) => DecisionKind::Pause,
            Decision::Stop(_) => DecisionKind::Stop,
            Decision::Fail(_) => DecisionKind::Fail,
        }
    }

    /// A replacement with a reason.
    pub fn replace(value: Replacement, reason: impl Into<String>) -> Decision {
        Decision::Replace {
            value,
            reason: Some(reason.into()),
        }
    }
}

/// What a policy knows of the run when it decides.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyContext {
    /// The policy's name in the agent.
    pub name: String,
    /// Its `params` from the configuration.
    pub params: Map<String, Value>,
    /// The point.
    pub point: Point,
    /// Repairs this policy already asked for (in this run, or for this call).
    pub attempt: u32,
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
    /// Run.
    pub run_id: String,
    /// Agent.
    pub agent: String,
    /// Names of the tools called so far in the run, in call order.
    pub tools_called: Vec<String>,
    /// Orchestrator model calls so far.
    pub iterations: u32,
}

/// Why a policy could not decide (journaled as `policy.decided` with `error: true`, then
/// `on_error` decides).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

/// A policy: deterministic code that decides at one or more points.
///
/// Object-safe; the engine holds policies as `Arc<dyn Policy>`.
pub trait Policy: Send + Sync {
    /// The points this policy may be hooked on.
    fn points(&self) -> &[Point];

    /// The decisions it may return; each must be allowed at each point it is hooked on
    /// (checked when the agent is loaded). A decision outside this list is an error.
    fn decisions(&self) -> &[DecisionKind];

    /// Decides on `subject`.
    fn decide<'a>(
        &'a self,
        subject: &'a Subject,
        context: &'a PolicyContext,
    ) -> BoxFuture<'a, Result<Decision, PolicyError>>;
}

impl fmt::Debug for dyn Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("points", &self.points())
            .field("decisions", &self.decisions())
            .finish()
    }
}

/// Checks that every decision a policy declares is allowed at every point it is hooked on:
/// the first (point, decision) pair that is not.
pub fn refused_decision(
    points: &[Point],
    decisions: &[DecisionKind],
) -> Option<(Point, DecisionKind)> {
    points.iter().find_map(|&point| {
        decisions
            .iter()
            .find(|&&kind| !point.allows(kind))
            .map(|&kind| (point, kind))
    })
}

type DecideFn =
    dyn Fn(&Subject, &PolicyContext) -> Result<Decision, PolicyError> + Send + Sync + 'static;

/// A policy from a plain function: `FnPolicy::new(points, decisions, |subject, ctx| …)`.
#[derive(Clone)]
pub struct FnPolicy {
    points: Vec<Point>,
    decisions: Vec<DecisionKind>,
    decide: Arc<DecideFn>,
}

impl fmt::Debug for FnPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FnPolicy")
            .field("points", &self.points)
            .field("decisions", &self.decisions)
            .finish_non_exhaustive()
    }
}

impl FnPolicy {
    /// A policy deciding with `decide` at `points`, declaring `decisions` (`continue` is
    /// always allowed and need not be listed).
    pub fn new(
        points: impl Into<Vec<Point>>,
        decisions: impl Into<Vec<DecisionKind>>,
        decide: impl Fn(&Subject, &PolicyContext) -> Result<Decision, PolicyError>
        + Send
        + Sync
        + 'static,
    ) -> FnPolicy {
        let mut decisions = decisions.into();
        if !decisions.contains(&DecisionKind::Continue) {
            decisions.insert(0, DecisionKind::Continue);
        }
        FnPolicy {
            points: points.into(),
            decisions,
            decide: Arc::new(decide),
        }
    }
}

impl Policy for FnPolicy {
    fn points(&self) -> &[Point] {
        &self.points
    }

    fn decisions(&self) -> &[DecisionKind] {
        &self.decisions
    }

    fn decide<'a>(
        &'a self,
        subject: &'a Subject,
        context: &'a PolicyContext,
    ) -> BoxFuture<'a, Result<Decision, PolicyError>> {
        let decision = (self.decide)(subject, context);
        Box::pin(std::future::ready(decision))
    }
}

/// Name of the built-in [`RequireTool`] policy.
pub const REQUIRE_TOOL: &str = "loom.require_tool";

/// `loom.require_tool` (`before_model`): while no tool was called in the run, a request that
/// offers tools with `tool_choice: auto` is replaced by the same request with
/// `tool_choice: required`.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequireTool;

impl Policy for RequireTool {
    fn points(&self) -> &[Point] {
        &[Point::BeforeModel]
    }

    fn decisions(&self) -> &[DecisionKind] {
        &[DecisionKind::Continue, DecisionKind::Replace]
    }

    fn decide<'a>(
        &'a self,
        subject: &'a Subject,
        context: &'a PolicyContext,
    ) -> BoxFuture<'a, Result<Decision, PolicyError>> {
        let decision = match subject {
            Subject::Request(request)
                if context.tools_called.is_empty()
                    && !request.tools.is_empty()
                    && request.tool_choice == crate::model::ToolChoice::Auto =>
            {
                let mut forced = request.clone();
                forced.tool_choice = crate::model::ToolChoice::Required;
                Decision::replace(
                    Replacement::Request(forced),
                    "no tool called yet in the run: a tool call is required",
                )
            }
            _ => Decision::Continue,
        };
        Box::pin(std::future::ready(Ok(decision)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_of_allowed_decisions_follows_the_reference() {
        use DecisionKind as D;
        let allowed =
            |p: Point| -> Vec<D> { D::ALL.into_iter().filter(|&k| p.allows(k)).collect() };
        assert_eq!(
            allowed(Point::BeforeModel),
            [D::Continue, D::Replace, D::Stop, D::Fail]
        );
        assert_eq!(
            allowed(Point::AfterModel),
            [D::Continue, D::Retry, D::Stop, D::Fail]
        );
        assert_eq!(
            allowed(Point::BeforeTool),
            [D::Continue, D::Replace, D::Deny, D::Pause, D::Fail]
        );
        assert_eq!(
            allowed(Point::AfterTool),
            [D::Continue, D::Replace, D::Retry, D::Fail]
        );
        assert_eq!(
            allowed(Point::OnOutput),
            [D::Continue, D::Replace, D::Retry, D::Fail]
        );
    }

    #[test]
    fn a_decision_refused_at_its_point_is_found() {
        assert_eq!(
            refused_decision(
                &[Point::BeforeTool, Point::AfterModel],
                &[DecisionKind::Deny]
            ),
            Some((Point::AfterModel, DecisionKind::Deny))
        );
        assert_eq!(
            refused_decision(&[Point::BeforeTool], &[DecisionKind::Deny]),
            None
        );
    }

    #[test]
    fn points_parse_their_journal_strings() {
        for point in Point::ALL {
            assert_eq!(Point::parse(point.as_str()), Some(point));
        }
        assert_eq!(Point::parse("during_lunch"), None);
    }
}
