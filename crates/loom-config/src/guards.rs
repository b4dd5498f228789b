//! The file model of delegation and guards: roles, sub-agents, policies, judges, output
//! contracts and budgets (tenants are in `tenant.rs`).
//!
//! Like the rest of the file model, these types only describe the shape of the file (every
//! struct refuses unknown keys); the rules between fields (declared models, known tools,
//! template variables, budget shares…) are checked when a [`crate::Config`] is built.

use std::{fmt, path::PathBuf};

use loom_core::event::RunBudget;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, de::Error as _};
use serde_json::Value;

use crate::model::{JsonObject, LlmSettings, Profile};

/// The built-in policy that forces a tool call while the run has called none.
pub const REQUIRE_TOOL_POLICY: &str = "loom.require_tool";

/// Budgets: limits of a run, of a session and of a tenant's calendar periods.
///
/// The root `budgets` block gives the defaults; an agent's `budget` and a tenant's `budgets`
/// are merged over it key by key ([`Budgets::overlay`]): a limit they leave out (or set to
/// `null`) keeps the value below it, so they can tighten or loosen a limit but not lift it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Budgets {
    /// Limits of one run (sub-agent runs included).
    pub run: RunBudgetSpec,
    /// Limits of one session: its previous runs plus the current one.
    pub session: SessionBudgetSpec,
    /// Ceilings of a tenant over UTC days and months, checked before a run is opened.
    pub tenant: TenantBudgetSpec,
    /// What reaching a run or session limit does: `stop` (default: the run is finalized) or
    /// `warn` (journaled only). Absent: inherited when merged, else `stop`; see
    /// [`Budgets::exceed_action`].
    pub on_exceed: Option<OnExceed>,
}

impl Budgets {
    /// `over` merged over `self`, key by key: each limit (and `on_exceed`) of `over` that is
    /// set replaces the one of `self`.
    pub fn overlay(&self, over: &Budgets) -> Budgets {
        Budgets {
            run: RunBudgetSpec {
                max_cost: over.run.max_cost.or(self.run.max_cost),
                max_tokens: over.run.max_tokens.or(self.run.max_tokens),
                max_calls: over.run.max_calls.or(self.run.max_calls),
            },
            session: SessionBudgetSpec {
                max_cost: over.session.max_cost.or(self.session.max_cost),
                max_tokens: over.session.max_tokens.or(self.session.max_tokens),
            },
            tenant: TenantBudgetSpec {
                max_cost_per_day: over
                    .tenant
                    .max_cost_per_day
                    .or(self.tenant.max_cost_per_day),
                max_tokens_per_day: over
                    .tenant
                    .max_tokens_per_day
                    .or(self.tenant.max_tokens_per_day),
                max_cost_per_month: over
                    .tenant
                    .max_cost_per_month
                    .or(self.tenant.max_cost_per_month),
                max_tokens_per_month: over
                    .tenant
                    .max_tokens_per_month
                    .or(self.tenant.max_tokens_per_month),
            },
            on_exceed: over.on_exceed.or(self.on_exceed),
        }
    }

    /// What reaching a run or session limit does (`stop` unless `warn` is set).
    pub fn exceed_action(&self) -> OnExceed {
        self.on_exceed.unwrap_or_default()
    }
}

/// Limits of one run; `null` (or absent): no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RunBudgetSpec {
    /// Dollars.
    #[schemars(range(min = 0))]
    pub max_cost: Option<f64>,
    /// Tokens (input and output).
    pub max_tokens: Option<u64>,
    /// Model calls.
    pub max_calls: Option<u64>,
}

impl RunBudgetSpec {
    /// Whether at least one limit is set.
    pub fn has_limit(&self) -> bool {
        self.max_cost.is_some() || self.max_tokens.is_some() || self.max_calls.is_some()
    }

    /// The journaled form (`run.started.budget`), `None` when no limit is set.
    pub fn to_run_budget(&self) -> Option<RunBudget> {
        self.has_limit().then_some(RunBudget {
            max_cost: self.max_cost,
            max_tokens: self.max_tokens,
            max_calls: self.max_calls,
        })
    }
}

/// Limits of one session (previous runs and the current one); `null`: no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SessionBudgetSpec {
    /// Dollars.
    #[schemars(range(min = 0))]
    pub max_cost: Option<f64>,
    /// Tokens.
    pub max_tokens: Option<u64>,
}

/// Ceilings of a tenant over UTC calendar windows; `null`: no ceiling. They bound what a
/// tenant may start, not what a run spends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TenantBudgetSpec {
    /// Dollars per UTC day.
    #[schemars(range(min = 0))]
    pub max_cost_per_day: Option<f64>,
    /// Tokens per UTC day.
    pub max_tokens_per_day: Option<u64>,
    /// Dollars per UTC month.
    #[schemars(range(min = 0))]
    pub max_cost_per_month: Option<f64>,
    /// Tokens per UTC month.
    pub max_tokens_per_month: Option<u64>,
}

/// What reaching a budget limit does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnExceed {
    /// The run is finalized (one last answer without tools).
    #[default]
    Stop,
    /// A `budget.exceeded` event is journaled and the run goes on.
    Warn,
}

/// What an output must satisfy: the final answer of an agent, or the result of a role or of a
/// tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OutputContract {
    /// JSON Schema the output (parsed as JSON) must match. When the contract was written with
    /// `schema_file`, this holds the file's content once loaded.
    #[serde(default)]
    pub schema: Option<JsonObject>,
    /// A JSON or YAML file holding the schema, relative to the config file (not with
    /// `schema`); read at load time into `schema`.
    #[serde(default)]
    pub schema_file: Option<PathBuf>,
    /// A regular expression the output must match somewhere (`regex` syntax: linear time).
    #[serde(default)]
    pub must_match: Option<String>,
    /// A regular expression the output must not match anywhere.
    #[serde(default)]
    pub must_not_match: Option<String>,
    /// Longest output, in characters.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub max_chars: Option<u64>,
    /// Strip whitespace and a surrounding code fence, and extract the JSON when a schema is
    /// expected, before checking.
    #[serde(default = "yes")]
    pub normalize: bool,
    /// Repairs asked of the output's author before `on_failure` applies.
    #[serde(default)]
    pub repair: RepairSettings,
    /// What a still-failing output becomes.
    #[serde(default)]
    pub on_failure: OnFailure,
    /// The replacement output for `on_failure: fallback` (required then, refused otherwise).
    #[serde(default)]
    pub fallback_message: Option<String>,
}

impl Default for OutputContract {
    fn default() -> Self {
        OutputContract {
            schema: None,
            schema_file: None,
            must_match: None,
            must_not_match: None,
            max_chars: None,
            normalize: true,
            repair: RepairSettings::default(),
            on_failure: OnFailure::default(),
            fallback_message: None,
        }
    }
}

fn yes() -> bool {
    true
}

/// Repairs asked of the author of a refused output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RepairSettings {
    /// Repair attempts (0: none).
    pub max_attempts: u32,
    /// Whether the author may call tools while repairing.
    pub tools: RepairTools,
}

impl Default for RepairSettings {
    fn default() -> Self {
        RepairSettings {
            max_attempts: 1,
            tools: RepairTools::Auto,
        }
    }
}

/// Tools during a repair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RepairTools {
    /// The guard decides (a contract repairs without tools, a judge with them).
    #[default]
    Auto,
    /// Never.
    None,
    /// Always allowed.
    Allowed,
}

/// What an output that still fails its guard becomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// The run fails (final output), or the call returns an error result (role, tool).
    #[default]
    Fail,
    /// Kept, flagged as unverified.
    Unverified,
    /// Replaced by `fallback_message`, flagged.
    Fallback,
}

/// What an error of a policy or a judge (not a refusal: a crash, a timeout) does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// The run fails.
    #[default]
    Block,
    /// Journaled, and the run goes on as if the policy had let it pass.
    Allow,
}

/// A delegated role: the orchestrator calls it like a tool, and it answers with its own model
/// and system prompt from the arguments and the context it declares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoleSpec {
    /// Tool name the orchestrator sees (`^[A-Za-z0-9_-]{1,64}$`, not `main`, unique among the
    /// agent's roles, sub-agents and tools).
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]{1,64}$"))]
    pub name: String,
    /// What the role does, shown to the orchestrator.
    #[schemars(length(min = 1))]
    pub description: String,
    /// Id of a declared model.
    #[schemars(length(min = 1))]
    pub model: String,
    /// Models tried in order when the role's model fails for good.
    #[serde(default)]
    pub fallbacks: Vec<String>,
    /// Inline system prompt (a template over `agent` and `tenant`).
    #[serde(default)]
    pub system: String,
    /// System prompt file, relative to `prompts_dir` (not with `system`).
    #[serde(default)]
    pub system_file: Option<PathBuf>,
    /// Call settings for this role.
    #[serde(default)]
    pub llm: LlmSettings,
    /// JSON Schema of the arguments (`type: object`).
    #[serde(default = "default_input_schema")]
    pub input_schema: JsonObject,
    /// The role's user message: a template over `args` (the arguments) and `context` (the
    /// declared context items: `context.user_input`, `context.tool_results.<tool>`…). Every
    /// variable it uses must be declared, and every declared context item used.
    #[serde(default)]
    pub input_template: Option<String>,
    /// What the role receives besides its arguments.
    #[serde(default)]
    pub context: Vec<ContextItem>,
    /// The role's answer ends the run as the agent's final answer.
    #[serde(default)]
    pub terminal: bool,
    /// Time limit of one call of the role, in seconds.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: Option<f64>,
    /// Contract of the role's answer.
    #[serde(default)]
    pub output: Option<OutputContract>,
    /// Judge of the role's answer.
    #[serde(default)]
    pub judge: Option<JudgeSpec>,
}

/// The default argument schema of a role: an object without properties.
pub fn default_input_schema() -> JsonObject {
    let mut schema = JsonObject::new();
    schema.insert("type".to_owned(), Value::String("object".to_owned()));
    schema.insert("properties".to_owned(), Value::Object(JsonObject::new()));
    schema
}

impl RoleSpec {
    /// A role on `model` without arguments, context, prompt or guards.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        model: impl Into<String>,
    ) -> RoleSpec {
        RoleSpec {
            name: name.into(),
            description: description.into(),
            model: model.into(),
            fallbacks: Vec::new(),
            system: String::new(),
            system_file: None,
            llm: LlmSettings::default(),
            input_schema: default_input_schema(),
            input_template: None,
            context: Vec::new(),
            terminal: false,
            timeout: None,
            output: None,
            judge: None,
        }
    }

    /// The names of the declared arguments (`input_schema.properties`).
    pub fn argument_names(&self) -> Vec<&str> {
        match self.input_schema.get("properties") {
            Some(Value::Object(props)) => props.keys().map(String::as_str).collect(),
            _ => Vec::new(),
        }
    }
}

/// A context item of a role or a judge: a name, `{tool_results: [...]}`, `{last_turns: N}` or
/// `{session_state: [keys]}`.
///
/// `session_state` is refused in a judge's context (checked when the configuration is loaded),
/// as the reference does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ContextItem {
    /// A named item.
    Name(ContextName),
    /// Successful results of the named tools.
    ToolResults(ToolResultsContext),
    /// The last turns of the session (one turn = one run).
    LastTurns(LastTurnsContext),
    /// Some keys of the session state (`session_state` alone: every key).
    SessionStateKeys(SessionStateContext),
}

impl ContextItem {
    /// The item's variable under `context` in an input template (`user_input`,
    /// `tool_results`, `last_turns`…).
    pub fn key(&self) -> &'static str {
        match self {
            ContextItem::Name(name) => name.as_str(),
            ContextItem::ToolResults(_) => "tool_results",
            ContextItem::LastTurns(_) => "last_turns",
            ContextItem::SessionStateKeys(_) => "session_state",
        }
    }

    /// The state keys the item reads: `None` for an item that is not session state, all of
    /// them (`Some(None)`) for `session_state`, some (`Some(Some(keys))`) for
    /// `{session_state: [keys]}`.
    pub fn state_keys(&self) -> Option<Option<&[String]>> {
        match self {
            ContextItem::Name(ContextName::SessionState) => Some(None),
            ContextItem::SessionStateKeys(keys) => Some(Some(&keys.session_state)),
            _ => None,
        }
    }
}

const CONTEXT_EXPECTED: &str = "expected one of: user_input, caller_context, attachments, \
session_summary, session_state, {tool_results: [tools]}, {last_turns: N}, {session_state: [keys]}";

impl<'de> Deserialize<'de> for ContextItem {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        match &value {
            Value::String(text) => match text.as_str() {
                "user_input" => Ok(ContextItem::Name(ContextName::UserInput)),
                "caller_context" => Ok(ContextItem::Name(ContextName::CallerContext)),
                "attachments" => Ok(ContextItem::Name(ContextName::Attachments)),
                "session_summary" => Ok(ContextItem::Name(ContextName::SessionSummary)),
                "session_state" => Ok(ContextItem::Name(ContextName::SessionState)),
                other => Err(D::Error::custom(format!(
                    "unknown context item '{other}' ({CONTEXT_EXPECTED})"
                ))),
            },
            Value::Object(map) if map.contains_key("tool_results") => {
                ToolResultsContext::deserialize(&value)
                    .map(ContextItem::ToolResults)
                    .map_err(D::Error::custom)
            }
            Value::Object(map) if map.contains_key("last_turns") => {
                LastTurnsContext::deserialize(&value)
                    .map(ContextItem::LastTurns)
                    .map_err(D::Error::custom)
            }
            Value::Object(map) if map.contains_key("session_state") => {
                SessionStateContext::deserialize(&value)
                    .map(ContextItem::SessionStateKeys)
                    .map_err(D::Error::custom)
            }
            Value::Object(map) => {
                let keys: Vec<&str> = map.keys().map(String::as_str).collect();
                Err(D::Error::custom(format!(
                    "unknown context item with keys {} ({CONTEXT_EXPECTED})",
                    keys.join(", ")
                )))
            }
            _ => Err(D::Error::custom(format!(
                "a context item is a name or a mapping ({CONTEXT_EXPECTED})"
            ))),
        }
    }
}

/// Named context items.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ContextName {
    /// The user's message of the run.
    UserInput,
    /// What the caller wrote when calling (the orchestrator's last text).
    CallerContext,
    /// The images attached to the run (the model needs `capabilities.vision`).
    Attachments,
    /// The session's latest applied compaction summary (empty when there is none).
    SessionSummary,
    /// The session state, every key the agent declares (not in a judge's context).
    SessionState,
}

impl ContextName {
    /// The name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            ContextName::UserInput => "user_input",
            ContextName::CallerContext => "caller_context",
            ContextName::Attachments => "attachments",
            ContextName::SessionSummary => "session_summary",
            ContextName::SessionState => "session_state",
        }
    }
}

impl fmt::Display for ContextName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Context `tool_results`: the successful results of the named tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolResultsContext {
    /// Tool names, as the model sees them (tools, roles or sub-agents of the agent).
    #[schemars(length(min = 1))]
    pub tool_results: Vec<String>,
    /// Results of this run only, or of the whole session.
    #[serde(default)]
    pub scope: ContextScope,
}

/// How far back a context item looks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ContextScope {
    /// The current run.
    #[default]
    Run,
    /// Every run of the session.
    Session,
}

/// Context `{session_state: [keys]}`: some keys of the session state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionStateContext {
    /// State keys the agent declares (at least one).
    #[schemars(length(min = 1))]
    pub session_state: Vec<String>,
}

/// Context `last_turns`: the last turns of the session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LastTurnsContext {
    /// How many turns (at least 1).
    #[schemars(range(min = 1))]
    pub last_turns: u32,
}

/// A sub-agent: another agent of the configuration, called like a tool with one argument,
/// `message`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubAgentRef {
    /// Name of a declared agent (not the agent itself).
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]{1,64}$"))]
    pub agent: String,
    /// Tool name the orchestrator sees (default: the agent's name; filled at load).
    #[serde(default)]
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]{1,64}$"))]
    pub name: Option<String>,
    /// Tool description (default: the agent's description, filled at load; one of them must
    /// be non-empty).
    #[serde(default)]
    pub description: Option<String>,
    /// Share in (0, 1] of the remaining run budget given to the child; needs a run budget.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0), range(max = 1))]
    pub budget_share: Option<f64>,
}

impl SubAgentRef {
    /// A reference to `agent` with its own name and description.
    pub fn new(agent: impl Into<String>) -> SubAgentRef {
        SubAgentRef {
            agent: agent.into(),
            name: None,
            description: None,
            budget_share: None,
        }
    }

    /// The tool name the orchestrator sees: `name`, else the agent's name.
    pub fn tool_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.agent)
    }
}

/// Where a policy can act.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HookPoint {
    /// Before each model call (can rewrite the request, stop or fail the run).
    BeforeModel,
    /// After each model answer (can retry, stop or fail).
    AfterModel,
    /// Before each tool call (can rewrite arguments, deny, pause or fail).
    BeforeTool,
    /// After each tool result (can replace it, retry or fail).
    AfterTool,
    /// On the final output (can replace it, retry or fail).
    OnOutput,
}

impl HookPoint {
    /// Every point, in the order of a run.
    pub const ALL: [HookPoint; 5] = [
        HookPoint::BeforeModel,
        HookPoint::AfterModel,
        HookPoint::BeforeTool,
        HookPoint::AfterTool,
        HookPoint::OnOutput,
    ];

    /// The point's name as written in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            HookPoint::BeforeModel => "before_model",
            HookPoint::AfterModel => "after_model",
            HookPoint::BeforeTool => "before_tool",
            HookPoint::AfterTool => "after_tool",
            HookPoint::OnOutput => "on_output",
        }
    }
}

impl fmt::Display for HookPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A policy plugged into an agent: a hook registered in code (checked by the facade) or the
/// built-in [`REQUIRE_TOOL_POLICY`]. Policies of one point run in declared order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyRef {
    /// The registered hook's name, or `loom.require_tool`.
    #[schemars(length(min = 1))]
    pub hook: String,
    /// The policy's name in events and errors (default: the hook; filled at load). Names
    /// starting with `loom.` are reserved.
    #[serde(default)]
    #[schemars(regex(pattern = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"))]
    pub name: Option<String>,
    /// The points where it acts, among those its hook declares (default: all of them).
    #[serde(default)]
    #[schemars(length(min = 1))]
    pub points: Option<Vec<HookPoint>>,
    /// Parameters passed to the hook.
    #[serde(default)]
    pub params: JsonObject,
    /// Time limit of one decision, in seconds.
    #[serde(default = "default_policy_timeout")]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: f64,
    /// What an error (crash, timeout, disallowed decision) does.
    #[serde(default)]
    pub on_error: OnError,
    /// Retries it may ask for (per run for the final output, per call for roles), at least 1.
    #[serde(default = "default_policy_attempts")]
    #[schemars(range(min = 1))]
    pub max_attempts: u32,
}

fn default_policy_timeout() -> f64 {
    5.0
}

fn default_policy_attempts() -> u32 {
    1
}

impl PolicyRef {
    /// The policy of `hook`, with every optional field at its default.
    pub fn new(hook: impl Into<String>) -> PolicyRef {
        PolicyRef {
            hook: hook.into(),
            name: None,
            points: None,
            params: JsonObject::new(),
            timeout: default_policy_timeout(),
            on_error: OnError::Block,
            max_attempts: default_policy_attempts(),
        }
    }

    /// The policy's name: `name`, else the hook.
    pub fn policy_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.hook)
    }
}

/// A judge of an output: a model scores it against criteria; a blocking criterion under its
/// threshold refuses the output, which its author repairs, then `on_failure` decides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JudgeSpec {
    /// Id of a declared model (better not the judged one: a warning, an error in `prod`).
    #[schemars(length(min = 1))]
    pub model: String,
    /// Models tried in order when the judge's model fails for good.
    #[serde(default)]
    pub fallbacks: Vec<String>,
    /// The judge's name (policy `loom.judge.<name>`); default `output` for an agent's judge,
    /// the role's name for a role's (filled at load). Unique in the agent.
    #[serde(default)]
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]{1,64}$"))]
    pub name: Option<String>,
    /// What the output is scored on (at least one; unique names).
    #[schemars(length(min = 1))]
    pub criteria: Vec<Criterion>,
    /// What the judge sees besides the output (and, for a role, its arguments).
    #[serde(default)]
    pub context: Vec<ContextItem>,
    /// When the judge runs.
    #[serde(default)]
    pub when: JudgeWhen,
    /// Repairs asked of the output's author.
    #[serde(default)]
    pub repair: RepairSettings,
    /// What a still-refused output becomes.
    #[serde(default)]
    pub on_failure: OnFailure,
    /// The replacement output for `on_failure: fallback` (required then, refused otherwise).
    #[serde(default)]
    pub fallback_message: Option<String>,
    /// Call settings of the judge's model.
    #[serde(default)]
    pub llm: LlmSettings,
    /// Time limit of one judgement, in seconds.
    #[serde(default)]
    #[schemars(extend("exclusiveMinimum" = 0))]
    pub timeout: Option<f64>,
    /// What an error of the judge (not a refusal) does.
    #[serde(default)]
    pub on_error: OnError,
}

impl JudgeSpec {
    /// A judge on `model` with `criteria` and every optional field at its default.
    pub fn new(model: impl Into<String>, criteria: Vec<Criterion>) -> JudgeSpec {
        JudgeSpec {
            model: model.into(),
            fallbacks: Vec::new(),
            name: None,
            criteria,
            context: Vec::new(),
            when: JudgeWhen::default(),
            repair: RepairSettings::default(),
            on_failure: OnFailure::default(),
            fallback_message: None,
            llm: LlmSettings::default(),
            timeout: None,
            on_error: OnError::Block,
        }
    }
}

/// A criterion of a judge.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Criterion {
    /// Name (`^[A-Za-z0-9_-]{1,64}$`, unique in the judge).
    #[schemars(regex(pattern = r"^[A-Za-z0-9_-]{1,64}$"))]
    pub name: String,
    /// What the output must satisfy, in words.
    #[schemars(length(min = 1))]
    pub rule: String,
    /// Lowest passing score, between 0 and 1.
    #[serde(default = "default_min_score")]
    #[schemars(range(min = 0, max = 1))]
    pub min_score: f64,
    /// Whether a score under `min_score` refuses the output (else it is only reported).
    #[serde(default = "yes")]
    pub blocking: bool,
}

fn default_min_score() -> f64 {
    0.8
}

impl Criterion {
    /// A blocking criterion with the default threshold (0.8).
    pub fn new(name: impl Into<String>, rule: impl Into<String>) -> Criterion {
        Criterion {
            name: name.into(),
            rule: rule.into(),
            min_score: default_min_score(),
            blocking: true,
        }
    }
}

/// When a judge runs: every clause given must hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct JudgeWhen {
    /// Fraction of runs judged, between 0 and 1 (deterministic per run).
    #[schemars(range(min = 0, max = 1))]
    pub sample: f64,
    /// Name of a condition registered in code (checked by the facade).
    #[schemars(length(min = 1))]
    pub condition: Option<String>,
    /// Only for these tenants (declared ones).
    #[schemars(length(min = 1))]
    pub tenants: Option<Vec<String>>,
    /// Only under these profiles.
    #[schemars(length(min = 1))]
    pub profiles: Option<Vec<Profile>>,
}

impl Default for JudgeWhen {
    fn default() -> Self {
        JudgeWhen {
            sample: 1.0,
            condition: None,
            tenants: None,
            profiles: None,
        }
    }
}
