//! The rmcp [`ServerHandler`] over a [`Loom`]: agents as tools, control tools, resources.

use std::sync::Arc;

use loom_ia::{Loom, LoomError, Redact, RunOptions, RunRef, RunResult, RunStatus, config::Scope};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, DiscoverResult,
        Implementation, InitializeRequestParams, InitializeResult, InputRequest, InputRequests,
        InputRequiredResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
        PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
        Request, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
    },
    service::RequestContext,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::{
    Access,
    approvals::{self, Answer},
    attachments,
    progress::{self, Progress},
    resources, told,
};

/// The control tools, next to one tool per agent.
const RUN_STATUS: &str = "run_status";
const RUN_REPORT: &str = "run_report";
const CANCEL: &str = "cancel";
/// Offered when the configuration declares `sessions.compaction`.
const COMPACT: &str = "compact_session";

/// Loom as an MCP server: one tool per agent offered over MCP (`expose.mcp`) that the caller
/// may use, the control tools `run_status`, `run_report`, `cancel` and (with
/// `sessions.compaction`) `compact_session`, and the journal as
/// `loom://` resources — everything in the caller's tenant.
#[derive(Debug, Clone)]
pub struct LoomMcp {
    loom: Loom,
    over: Over,
}

/// How the server is reached.
#[derive(Debug, Clone)]
enum Over {
    /// `loom mcp`: one client, one tenant, everything allowed; approvals may be asked to the
    /// user through elicitation.
    Stdio(Access),
    /// `/mcp` in `loom serve`: stateless, the access of each request comes from its API key;
    /// no elicitation (runs needing an approval pause).
    Http,
}

/// What the retry of an agent call that asked for input carries back (SEP-2322
/// `requestState`): the run it continues. It only names a run, looked up again in the
/// caller's tenant.
#[derive(Debug, Serialize, Deserialize)]
struct Waiting {
    run_id: String,
    session_id: String,
    agent: String,
}

/// How approvals can be put to the user during this call.
enum Ask {
    /// A server-to-client `elicitation/create` request (protocols before 2026-07-28).
    Inline(rmcp::Peer<RoleServer>),
    /// An `InputRequiredResult` the client answers by retrying the call (2026-07-28 and later).
    Rounds,
    /// Not at all: the run stays paused.
    No,
}

impl LoomMcp {
    /// The server `loom mcp` runs on stdio: everything allowed in `access`'s tenant.
    pub fn stdio(loom: Loom, access: Access) -> LoomMcp {
        LoomMcp {
            loom,
            over: Over::Stdio(access),
        }
    }

    /// The server mounted at `/mcp`: each request must carry its [`Access`] in the extensions of
    /// its HTTP request (put there by the layer that checked its API key).
    pub fn http(loom: Loom) -> LoomMcp {
        LoomMcp {
            loom,
            over: Over::Http,
        }
    }

    fn access(&self, context: &RequestContext<RoleServer>) -> Result<Access, ErrorData> {
        match &self.over {
            Over::Stdio(access) => Ok(access.clone()),
            Over::Http => context
                .extensions
                .get::<http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<Access>())
                .cloned()
                .ok_or_else(|| {
                    ErrorData::invalid_request("no API key was checked for this request", None)
                }),
        }
    }

    /// The agents offered to `access` (all of them for the stdio tenant when `access` is
    /// unknown).
    fn agents(&self, access: &Access) -> Vec<(String, String)> {
        let config = self.loom.config();
        config
            .agents()
            .iter()
            .filter(|agent| agent.expose.mcp && access.allows_agent(config, &agent.name))
            .map(|agent| (agent.name.clone(), agent.description.clone()))
            .collect()
    }

    fn info(&self, access: Option<&Access>) -> ServerConfig {
        let names: Vec<String> = match access {
            Some(access) if access.allows(Scope::Run) => self
                .agents(access)
                .into_iter()
                .map(|(name, _)| name)
                .collect(),
            Some(_) => Vec::new(),
            None => self
                .loom
                .config()
                .agents()
                .iter()
                .filter(|agent| agent.expose.mcp)
                .map(|agent| agent.name.clone())
                .collect(),
        };
        let agents = if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        };
        let instructions = format!(
            "Loom agents available: {agents}. Each agent is a tool taking a message (and a \
             session_id to continue a conversation, and attachments); run_status, run_report \
             and cancel follow a run by its run_id; the journal is readable as loom:// \
             resources (runs, sessions, events, traces, artifacts)."
        );
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("loom", env!("CARGO_PKG_VERSION")).with_title("Loom"))
        .with_instructions(instructions)
    }

    /// How approvals can be asked during this call.
    fn ask(&self, context: &RequestContext<RoleServer>) -> Ask {
        if matches!(self.over, Over::Http) {
            return Ask::No;
        }
        let forms = context
            .client_capabilities()
            .and_then(|caps| caps.elicitation)
            .is_some_and(|e| e.form.is_some() || e.url.is_none());
        if !forms {
            Ask::No
        } else if context
            .protocol_version()
            .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28)
        {
            Ask::Rounds
        } else {
            Ask::Inline(context.peer.clone())
        }
    }

    fn tools(&self, access: &Access) -> Vec<Tool> {
        let mut tools = Vec::new();
        if access.allows(Scope::Run) {
            for (name, description) in self.agents(access) {
                let description = if description.trim().is_empty() {
                    format!("Runs the Loom agent '{name}' on a message and returns its answer.")
                } else {
                    description
                };
                tools.push(
                    Tool::new(name, description, object(agent_input_schema()))
                        .with_raw_output_schema(object(run_result_schema())),
                );
            }
        }
        if access.allows(Scope::Read) {
            tools.push(
                Tool::new(
                    RUN_STATUS,
                    "The status and result of a Loom run (its answer once it completed, the \
                     approvals it waits for when paused).",
                    object(json!({
                        "type": "object",
                        "properties": {
                            "run_id": {"type": "string", "description": "The run."},
                            "session_id": {"type": "string", "description": "Its session, when the run is in a named session."},
                        },
                        "required": ["run_id"],
                        "additionalProperties": false,
                    })),
                )
                .with_raw_output_schema(object(run_result_schema()))
                .with_annotations(ToolAnnotations::new().read_only(true)),
            );
            tools.push(
                Tool::new(
                    RUN_REPORT,
                    "Tokens and cost of a Loom run (its sub-runs included) or of a whole session, \
                     in total and by run, role, agent and model: give run_id or session_id.",
                    object(json!({
                        "type": "object",
                        "properties": {
                            "run_id": {"type": "string", "description": "A run."},
                            "session_id": {"type": "string", "description": "A session (alone), or the run's session."},
                        },
                        "additionalProperties": false,
                    })),
                )
                .with_annotations(ToolAnnotations::new().read_only(true)),
            );
        }
        if access.allows(Scope::Run) {
            tools.push(
                Tool::new(
                    CANCEL,
                    "Cancels a Loom run that has not finished: it stops at once and its journal \
                     closes it as cancelled.",
                    object(json!({
                        "type": "object",
                        "properties": {
                            "run_id": {"type": "string", "description": "The run."},
                            "session_id": {"type": "string", "description": "Its session, when the run is in a named session."},
                            "by": {"type": "string", "description": "Who cancels (journaled)."},
                        },
                        "required": ["run_id"],
                        "additionalProperties": false,
                    })),
                )
                .with_raw_output_schema(object(json!({
                    "type": "object",
                    "properties": {"run_id": {"type": "string"}, "cancelled": {"type": "boolean"}},
                    "required": ["run_id", "cancelled"],
                })))
                .with_annotations(ToolAnnotations::new().destructive(true)),
            );
            // A key limited to some agents may not act on a whole session.
            if self.loom.config().raw().sessions.compaction.is_some() && !access.agent_limited() {
                tools.push(compact_tool());
            }
        }
        tools
    }

    /// A run of the caller's tenant as `run_status`, `run_report` and the run resources
    /// address it, as REST's reads do ([`loom_ia::Loom::address`]: a run of a named session is
    /// found only with its `session_id`), checked against the key's agents.
    async fn run_of(
        &self,
        access: &Access,
        run_id: &str,
        session: Option<&str>,
    ) -> Result<RunRef, String> {
        let run = self
            .loom
            .address(run_id, session, Some(access.tenant()))
            .await
            .map_err(|e| told(&e))?;
        self.seen(access, run).await
    }

    /// The run `cancel` names, found as REST's cancellation finds it (whose body, as in the
    /// reference, need not name the session): in `session` when given, else wherever the
    /// journal's run index finds it; checked against the key's agents.
    async fn run_to_cancel(
        &self,
        access: &Access,
        run_id: &str,
        session: Option<&str>,
    ) -> Result<RunRef, String> {
        let run = self
            .loom
            .locate(run_id, session, Some(access.tenant()))
            .await
            .map_err(|e| told(&e))?;
        self.seen(access, run).await
    }

    /// `run`, when the caller's key may use its agent; else unknown, as if it did not exist.
    async fn seen(&self, access: &Access, run: RunRef) -> Result<RunRef, String> {
        if access.agent_limited() {
            let agent = self
                .loom
                .state(&run)
                .await
                .map_err(|e| told(&e))?
                .agent
                .unwrap_or_default();
            if !access.allows_agent(self.loom.config(), &agent) {
                // As if it did not exist: the key does not see this agent's runs.
                return Err(LoomError::UnknownRun(run.run_id).to_string());
            }
        }
        Ok(run)
    }

    /// A run whose whole tree the caller may see: [`Self::run_of`], then
    /// [`Self::tree_allowed`].
    async fn tree_of(
        &self,
        access: &Access,
        run_id: &str,
        session: Option<&str>,
    ) -> Result<RunRef, String> {
        let run = self.run_of(access, run_id, session).await?;
        self.tree_allowed(access, &run).await?;
        Ok(run)
    }

    /// For a key limited to some agents, whether it may use every agent of the run tree: a
    /// trace and a report show the sub-runs too, so they are refused as REST's
    /// `GET /traces/{run_id}` is (403 there).
    async fn tree_allowed(&self, access: &Access, run: &RunRef) -> Result<(), String> {
        if access.agent_limited() {
            let agents = self.loom.tree_agents(run).await.map_err(|e| told(&e))?;
            for agent in &agents {
                access.require_agent(agent)?;
            }
        }
        Ok(())
    }

    async fn call_control(
        &self,
        access: &Access,
        name: &str,
        arguments: &Map<String, Value>,
        client: Option<&str>,
    ) -> Result<CallToolResult, String> {
        let text = |key: &str| -> Result<Option<String>, String> {
            match arguments.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
                Some(_) => Err(format!("{key} must be a non-empty string")),
            }
        };
        let allowed: &[&str] = match name {
            CANCEL => &["run_id", "session_id", "by"],
            COMPACT => &["session_id"],
            _ => &["run_id", "session_id"],
        };
        if let Some(key) = arguments.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(format!(
                "unknown argument '{key}' (expected {})",
                allowed.join(", ")
            ));
        }
        let run_id = text("run_id")?;
        let session = text("session_id")?;
        match name {
            RUN_STATUS => {
                access.require(Scope::Read)?;
                let run_id = run_id.ok_or("run_id is required")?;
                let run = self.run_of(access, &run_id, session.as_deref()).await?;
                let result = self.loom.result(&run).await.map_err(|e| told(&e))?;
                Ok(structured(result.view(access.reads_content())))
            }
            RUN_REPORT => {
                access.require(Scope::Read)?;
                // Masked as every read is ([`loom_ia::redact::REPORT_CONTENT`]: a report holds
                // names, counts, tokens and costs, no content).
                let content = access.reads_content();
                let value = match (run_id, session) {
                    (Some(run_id), session) => {
                        let run = self.tree_of(access, &run_id, session.as_deref()).await?;
                        self.loom
                            .report(&run)
                            .await
                            .map_err(|e| told(&e))?
                            .view(content)
                    }
                    (None, Some(session)) => {
                        if access.agent_limited() {
                            return Err(
                                "a key limited to some agents cannot read a whole session's \
                                 report: give the run_id"
                                    .to_owned(),
                            );
                        }
                        self.loom
                            .session_report(&session, Some(access.tenant()))
                            .await
                            .map_err(|e| told(&e))?
                            .view(content)
                    }
                    (None, None) => return Err("give run_id or session_id".to_owned()),
                };
                Ok(structured(value))
            }
            COMPACT => {
                access.require(Scope::Run)?;
                let session = session.ok_or("session_id is required")?;
                if access.agent_limited() {
                    // As REST's `POST /sessions/{id}/compact` would have to check every agent
                    // of the session, and a whole-session read is refused to such a key.
                    return Err(
                        "a key limited to some agents cannot compact a whole session".to_owned(),
                    );
                }
                let note = self
                    .loom
                    .compact(Some(access.tenant()), &session)
                    .await
                    .map_err(|e| told(&e))?;
                let value = serde_json::to_value(&note).map_err(|e| e.to_string())?;
                Ok(structured(value))
            }
            _ => {
                access.require(Scope::Run)?;
                let run_id = run_id.ok_or("run_id is required")?;
                let by = text("by")?.unwrap_or_else(|| Access::by(client));
                let run = self
                    .run_to_cancel(access, &run_id, session.as_deref())
                    .await?;
                let cancelled = self
                    .loom
                    .cancel(&run, Some(by))
                    .await
                    .map_err(|e| told(&e))?;
                Ok(structured(
                    json!({"run_id": run.run_id, "cancelled": cancelled}),
                ))
            }
        }
    }

    /// An agent tool: runs the agent, asks the user for the approvals it pauses on when the
    /// client can, and returns the answer.
    async fn call_agent(
        &self,
        access: &Access,
        agent: &str,
        request: CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Err(refused) = access.require(Scope::Run) {
            return Ok(tool_error(refused).into());
        }
        let client = context.client_info().map(|info| info.name);
        let by = Access::by(client.as_deref());
        let token = context.meta.get_progress_token();
        let (progress, lines) = Progress::new(token.is_some(), access.reads_content());
        let ask = self.ask(context);
        let cancelled = context.ct.clone();
        let body = async move {
            let progress = progress;
            let work = self.agent_body(access, agent, request, &progress, &ask, &by);
            tokio::pin!(work);
            tokio::select! {
                outcome = &mut work => outcome,
                () = cancelled.cancelled() => {
                    // The client gave up the call: the run is cancelled, not left running.
                    // The drive goes on being polled meanwhile: `cancel` answers once the
                    // drive has journaled the cancellation.
                    match progress.root() {
                        Some(run) => {
                            let (_, outcome) =
                                tokio::join!(self.loom.cancel(&run, Some(by.clone())), work);
                            outcome
                        }
                        None => work.await,
                    }
                }
            }
        };
        let (outcome, ()) =
            tokio::join!(body, progress::forward(lines, context.peer.clone(), token));
        outcome
    }

    async fn agent_body(
        &self,
        access: &Access,
        agent: &str,
        request: CallToolRequestParams,
        progress: &Progress,
        ask: &Ask,
        by: &str,
    ) -> Result<CallToolResponse, ErrorData> {
        // Asked again in a new round only when the last round decided something (a dismissed
        // form leaves the run paused instead of asking forever).
        let mut ask_again = true;
        let mut result = match &request.request_state {
            Some(state) => {
                // The retry of a call that asked for approvals: decide them, then go on.
                match self
                    .answered(access, agent, state, &request, progress, by)
                    .await
                {
                    Ok((result, decided)) => {
                        ask_again = decided;
                        result
                    }
                    Err(refused) => return Ok(tool_error(refused).into()),
                }
            }
            None => match self
                .start(
                    access,
                    agent,
                    request.arguments.unwrap_or_default(),
                    progress,
                )
                .await
            {
                Ok(result) => result,
                Err(refused) => return Ok(tool_error(refused).into()),
            },
        };
        loop {
            if !waits(result.status) || result.pending_approvals.is_empty() {
                break;
            }
            match ask {
                Ask::No => break,
                Ask::Rounds if !ask_again => break,
                Ask::Rounds => {
                    let waiting = Waiting {
                        run_id: result.run_id.clone(),
                        session_id: result.session_id.clone(),
                        agent: agent.to_owned(),
                    };
                    let mut requests = InputRequests::new();
                    for pending in &result.pending_approvals {
                        requests.insert(
                            pending.call_id.clone(),
                            InputRequest::Elicitation(Request::new(approvals::form(pending))),
                        );
                    }
                    let state = serde_json::to_string(&waiting).map_err(|e| {
                        ErrorData::internal_error(format!("request state: {e}"), None)
                    })?;
                    tracing::debug!(run_id = %result.run_id, "approvals asked to the MCP client");
                    return Ok(InputRequiredResult::new(Some(requests), Some(state)).into());
                }
                Ask::Inline(peer) => {
                    let root = result.run_ref(access.tenant());
                    let mut decided = false;
                    for pending in result.pending_approvals.clone() {
                        let answer = match peer.create_elicitation(approvals::form(&pending)).await
                        {
                            Ok(answer) => approvals::answer(&answer),
                            Err(error) => {
                                tracing::info!(%error, "approval not asked through MCP elicitation");
                                Answer::Undecided
                            }
                        };
                        match approvals::decide(&self.loom, &root, &pending.call_id, &answer, by)
                            .await
                        {
                            Ok(written) => decided |= written,
                            Err(error) => return Ok(tool_error(told(&error)).into()),
                        }
                    }
                    if !decided {
                        break;
                    }
                    result = match self.loom.resume_observed(&root, progress).await {
                        Ok(result) => result,
                        Err(error) => return Ok(tool_error(told(&error)).into()),
                    };
                }
            }
        }
        tracing::debug!(run_id = %result.run_id, status = %result.status, "agent tool answered");
        Ok(agent_result(&result, access).into())
    }

    /// Opens and drives a run of `agent` from the call's arguments.
    pub(crate) async fn start(
        &self,
        access: &Access,
        agent: &str,
        arguments: Map<String, Value>,
        progress: &Progress,
    ) -> Result<RunResult, String> {
        if let Some(key) = arguments
            .keys()
            .find(|k| !["message", "session_id", "attachments", "state"].contains(&k.as_str()))
        {
            return Err(format!(
                "unknown argument '{key}' (expected message, session_id, attachments, state)"
            ));
        }
        let message = match arguments.get("message") {
            Some(Value::String(message)) if !message.trim().is_empty() => message.clone(),
            Some(Value::String(_)) => return Err("message must not be empty".to_owned()),
            Some(_) => return Err("message must be a string".to_owned()),
            None => return Err("message is required".to_owned()),
        };
        let session_id = match arguments.get("session_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(session)) if !session.is_empty() => Some(session.clone()),
            Some(_) => return Err("session_id must be a non-empty string".to_owned()),
        };
        let state = match arguments.get("state") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(state)) => state.clone(),
            Some(_) => {
                return Err("state must be an object of the agent's state keys".to_owned());
            }
        };
        let attachments =
            attachments::read(&self.loom, access.tenant(), arguments.get("attachments")).await?;
        let mut metadata = Map::new();
        metadata.insert("access".to_owned(), Value::String("mcp".to_owned()));
        let options = RunOptions {
            session_id,
            tenant_id: Some(access.tenant().to_owned()),
            metadata,
            attachments,
            state,
            ..RunOptions::default()
        };
        self.loom
            .run_observed(agent, message, options, progress)
            .await
            .map_err(|e| told(&e))
    }

    /// The retry of a call that asked for approvals: the answers are journaled, then the run
    /// is driven on. Also says whether anything was decided.
    async fn answered(
        &self,
        access: &Access,
        agent: &str,
        state: &str,
        request: &CallToolRequestParams,
        progress: &Progress,
        by: &str,
    ) -> Result<(RunResult, bool), String> {
        let waiting: Waiting = serde_json::from_str(state).map_err(|_| {
            "the request state of this retry is not one this server gave".to_owned()
        })?;
        if waiting.agent != agent {
            return Err(format!(
                "the request state of this retry belongs to the agent '{}', not '{agent}'",
                waiting.agent
            ));
        }
        let root = self
            .run_of(access, &waiting.run_id, Some(&waiting.session_id))
            .await?;
        let result = self.loom.result(&root).await.map_err(|e| told(&e))?;
        let responses = request.input_responses.clone().unwrap_or_default();
        let mut decided = false;
        for pending in &result.pending_approvals {
            let Some(response) = responses.get(&pending.call_id) else {
                continue;
            };
            let answer = serde_json::from_value(response.clone())
                .map(|answer| approvals::answer(&answer))
                .unwrap_or(Answer::Undecided);
            decided |= approvals::decide(&self.loom, &root, &pending.call_id, &answer, by)
                .await
                .map_err(|e| told(&e))?;
        }
        if !decided {
            return Ok((result, false));
        }
        let result = self
            .loom
            .resume_observed(&root, progress)
            .await
            .map_err(|e| told(&e))?;
        Ok((result, true))
    }
}

impl ServerHandler for LoomMcp {
    fn get_info(&self) -> ServerConfig {
        match &self.over {
            Over::Stdio(access) => self.info(Some(access)),
            Over::Http => self.info(None),
        }
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        context.peer.set_peer_info(request.clone());
        let mut result = self.negotiate_initialize(&request)?;
        if let Ok(access) = self.access(&context) {
            result.instructions = self.info(Some(&access)).instructions;
        }
        Ok(result)
    }

    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        let info = match self.access(&context) {
            Ok(access) => self.info(Some(&access)),
            Err(_) => self.get_info(),
        };
        Ok(DiscoverResult::from_server_info(
            self.supported_protocol_versions().into_owned(),
            info,
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let access = self.access(&context)?;
        Ok(ListToolsResult::with_all_items(self.tools(&access)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let access = self.access(&context)?;
        let name = request.name.to_string();
        let compaction = self.loom.config().raw().sessions.compaction.is_some();
        if [RUN_STATUS, RUN_REPORT, CANCEL].contains(&name.as_str())
            || (compaction && name == COMPACT)
        {
            let client = context.client_info().map(|info| info.name);
            let arguments = request.arguments.unwrap_or_default();
            let result = self
                .call_control(&access, &name, &arguments, client.as_deref())
                .await
                .unwrap_or_else(tool_error);
            return Ok(result.into());
        }
        let offered = self
            .loom
            .config()
            .agent(&name)
            .is_some_and(|agent| agent.expose.mcp)
            && access.allows_agent(self.loom.config(), &name);
        if !offered {
            return Err(ErrorData::invalid_params(
                format!("unknown tool '{name}'"),
                None,
            ));
        }
        self.call_agent(&access, &name, request, &context).await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let access = self.access(&context)?;
        Ok(ListResourcesResult::with_all_items(resources::listed(
            &access,
        )))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let access = self.access(&context)?;
        Ok(ListResourceTemplatesResult::with_all_items(
            resources::templates(&access),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let access = self.access(&context)?;
        let read = resources::read(self, &access, &request.uri).await?;
        Ok(read.into())
    }
}

impl LoomMcp {
    /// The facade, for the resources.
    pub(crate) fn loom(&self) -> &Loom {
        &self.loom
    }

    /// A run of the caller's tenant (for the resources): `None` when there is none the caller
    /// may see.
    pub(crate) async fn visible_run(
        &self,
        access: &Access,
        run_id: &str,
        session: Option<&str>,
    ) -> Result<RunRef, ErrorData> {
        self.run_of(access, run_id, session)
            .await
            .map_err(|message| ErrorData::resource_not_found(message, None))
    }

    /// [`Self::visible_run`] whose whole run tree the caller may see (for traces): a sub-run
    /// of an agent the key may not use is refused.
    pub(crate) async fn visible_tree(
        &self,
        access: &Access,
        run_id: &str,
        session: Option<&str>,
    ) -> Result<RunRef, ErrorData> {
        let run = self.visible_run(access, run_id, session).await?;
        self.tree_allowed(access, &run)
            .await
            .map_err(|refused| ErrorData::invalid_request(refused, None))?;
        Ok(run)
    }
}

/// Whether a run stopped to wait for a human: its own approval, or a sub-run's.
fn waits(status: RunStatus) -> bool {
    matches!(status, RunStatus::Paused | RunStatus::WaitingChild)
}

/// What an agent tool returns: the answer as text (and a second text when it was kept
/// unverified or replaced by a fallback), the run result as structured content, `isError` when
/// the run failed.
fn agent_result(result: &RunResult, access: &Access) -> CallToolResult {
    let mut content = Vec::new();
    let content_readable = access.reads_content();
    if !content_readable {
        content.push(ContentBlock::text(format!(
            "Run {} {}: its content is withheld (the API key lacks the scope 'read_content').",
            result.run_id, result.status
        )));
    } else if !result.text.is_empty() {
        content.push(ContentBlock::text(result.text.clone()));
    }
    if result.unverified {
        content.push(ContentBlock::text(
            "Unverified: this answer was kept although it failed its output contract or its judge.",
        ));
    }
    if result.fallback {
        content.push(ContentBlock::text(
            "Fallback: the agent's answer failed its checks and was replaced by the configured fallback message.",
        ));
    }
    if content_readable && result.text.is_empty() || waits(result.status) {
        content.push(ContentBlock::text(status_note(result)));
    }
    let mut call = CallToolResult::success(content);
    call.structured_content = Some(result.view(content_readable));
    call.is_error = Some(result.status == RunStatus::Failed);
    call
}

/// A sentence on a run without an answer (or waiting for a human).
fn status_note(result: &RunResult) -> String {
    let run = &result.run_id;
    match result.status {
        RunStatus::Paused | RunStatus::WaitingChild => {
            let calls: Vec<String> = result
                .pending_approvals
                .iter()
                .map(|p| format!("{} (call {})", p.tool_name, p.call_id))
                .collect();
            format!(
                "Run {run} is paused: it waits for a human approval of {}. Approve or reject it \
                 with `loom approve {run}` / `loom reject {run}` or POST /v1/runs/{run}/approve \
                 (a key with the approve scope); follow it with run_status.",
                calls.join(", ")
            )
        }
        RunStatus::Failed => format!(
            "Run {run} failed ({}): {}",
            result.error_type.as_deref().unwrap_or("error"),
            result.error.as_deref().unwrap_or("no detail")
        ),
        RunStatus::Cancelled => format!("Run {run} was cancelled."),
        status => format!("Run {run}: {status}, no answer text."),
    }
}

/// A tool result carrying `value` as structured content and as JSON text.
fn structured(value: Value) -> CallToolResult {
    let mut call = CallToolResult::success(vec![ContentBlock::text(value.to_string())]);
    call.structured_content = Some(value);
    call
}

/// A refused or failed call the client (and its model) reads.
fn tool_error(message: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

fn object(value: Value) -> Arc<Map<String, Value>> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(Map::new()),
    }
}

/// The arguments of an agent tool.
fn agent_input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "message": {"type": "string", "minLength": 1, "description": "What to ask the agent."},
            "session_id": {
                "type": "string",
                "description": "Continue this session: the agent re-reads its conversation. A new session when absent.",
            },
            "state": {
                "type": "object",
                "description": "Session-state values: keys the agent declares, each following its schema (a refused value runs nothing).",
            },
            "attachments": {
                "type": "array",
                "description": "Files for the agent: a base64 image, an artifact:// link, or a file:// path under the server's file roots.",
                "items": {
                    "oneOf": [
                        {
                            "type": "object",
                            "properties": {
                                "data": {"type": "string", "contentEncoding": "base64"},
                                "media_type": {"type": "string", "description": "e.g. image/png"},
                                "name": {"type": "string"},
                            },
                            "required": ["data", "media_type"],
                            "additionalProperties": false,
                        },
                        {
                            "type": "object",
                            "properties": {
                                "uri": {"type": "string", "description": "artifact://… or file:///…"},
                                "name": {"type": "string"},
                            },
                            "required": ["uri"],
                            "additionalProperties": false,
                        },
                    ],
                },
            },
        },
        "required": ["message"],
        "additionalProperties": false,
    })
}

/// What an agent tool (and `run_status`) returns as structured content: the run result
/// (`loom_ia::RunResult`, the same object as `loom run --json` and the REST API), whose content
/// fields are absent when the key lacks `read_content` (then `redacted` lists them).
/// `compact_session`: compacts a session now, as `loom compact` and REST's
/// `POST /v1/sessions/{id}/compact` do.
fn compact_tool() -> Tool {
    Tool::new(
        COMPACT,
        "Compacts a Loom session now: the turns before the last keep_last ones are summarized \
         by the compaction model, checked for fidelity (amounts, dates, references and e-mail \
         addresses must survive), and replace the originals in the history of the session's \
         next runs. Outcome: applied, kept (the summary missed details: the originals stay), \
         failed or nothing.",
        object(json!({
            "type": "object",
            "properties": {
                "session_id": {"type": "string", "description": "The session."},
            },
            "required": ["session_id"],
            "additionalProperties": false,
        })),
    )
    .with_raw_output_schema(object(json!({
        "type": "object",
        "properties": {
            "outcome": {"type": "string", "enum": ["applied", "kept", "failed", "running", "queued", "nothing"]},
            "run_id": {"type": "string"},
            "up_to_seq": {"type": "integer"},
            "kept": {"type": "integer"},
            "tokens_before": {"type": "integer"},
            "tokens_after": {"type": "integer"},
            "cost_usd": {"type": "number"},
        },
        "required": ["outcome"],
    })))
    .with_annotations(ToolAnnotations::new().destructive(false).idempotent(false))
}

fn run_result_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "run_id": {"type": "string"},
            "session_id": {"type": "string"},
            "agent": {"type": "string"},
            "status": {
                "type": "string",
                "enum": ["ready_for_model", "awaiting_tools", "finalizing", "paused", "waiting_child", "completed", "failed", "cancelled"],
            },
            "text": {"type": "string"},
            "output": {"type": "object"},
            "error_type": {"type": "string"},
            "error": {"type": "string"},
            "iterations": {"type": "integer"},
            "usage": {"type": "object"},
            "cost_usd": {"type": "number"},
            "artifacts": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "uri": {"type": "string"},
                        "origin": {"type": "string", "enum": ["attachment", "tool_output", "offload"]},
                        "media_type": {"type": "string"},
                        "size": {"type": "integer", "minimum": 0},
                        "name": {"type": "string"},
                    },
                    "required": ["uri", "origin", "media_type", "size"],
                },
            },
            "data": {},
            "unverified": {"type": "boolean"},
            "fallback": {"type": "boolean"},
            "report": {"type": "object"},
            "verdicts": {"type": "array", "items": {"type": "object"}},
            "skipped_judges": {"type": "array", "items": {"type": "object"}},
            "pending_approvals": {"type": "array", "items": {"type": "object"}},
            "redacted": {"type": "array", "items": {"type": "string"}},
        },
        "required": [
            "run_id", "session_id", "agent", "status", "iterations", "usage", "cost_usd",
            "artifacts", "unverified", "fallback", "report", "verdicts", "skipped_judges",
            "pending_approvals",
        ],
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use loom_ia::{Message, PendingApproval, Usage, UsageReport, config::ApiKeySpec};

    use super::*;

    fn paused() -> RunResult {
        RunResult {
            run_id: "r1".into(),
            session_id: "s1".into(),
            agent: "paiement".into(),
            status: RunStatus::Paused,
            text: "secret answer".into(),
            output: Some(Message::assistant("secret answer")),
            error_type: None,
            error: None,
            iterations: 1,
            usage: Usage::default(),
            cost_usd: 0.25,
            artifacts: Vec::new(),
            data: None,
            unverified: false,
            fallback: false,
            report: UsageReport::default(),
            verdicts: Vec::new(),
            skipped_judges: Vec::new(),
            pending_approvals: vec![PendingApproval {
                call_id: "c1".into(),
                tool_name: "virement".into(),
                arguments: json!({"iban": "secret iban"}),
                reason: "secret reason".into(),
                policy: None,
                scope: "approve".into(),
                expire_at: None,
                run_id: "r1".into(),
                session_id: "s1".into(),
                tenant_id: "acme".into(),
            }],
            redacted: Vec::new(),
            compaction: None,
        }
    }

    fn key(scopes: Vec<Scope>) -> Access {
        Access::key(Arc::new(ApiKeySpec {
            id: "k".into(),
            hash: format!("sha256:{}", "0".repeat(64)),
            tenant: "acme".into(),
            expires: None,
            scopes,
            agents: Vec::new(),
            rate_limit: None,
        }))
    }

    /// Without `read_content`, an agent tool returns the run result masked as the REST API
    /// masks it (`RunResult::view(false)`), and no text block quotes the content.
    #[test]
    fn an_agent_result_without_read_content_is_the_rest_view() {
        let result = paused();
        let call = agent_result(&result, &key(vec![Scope::Run, Scope::Read]));
        let structured = call.structured_content.clone().unwrap();
        assert_eq!(structured, result.view(false));
        assert_eq!(
            structured["redacted"],
            json!([
                "text",
                "output",
                "pending_approvals[0].arguments",
                "pending_approvals[0].reason"
            ])
        );
        let shown = serde_json::to_string(&call).unwrap();
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("virement"), "{shown}");
    }

    #[test]
    fn an_agent_result_with_read_content_is_whole() {
        let result = paused();
        let call = agent_result(
            &result,
            &key(vec![Scope::Run, Scope::Read, Scope::ReadContent]),
        );
        assert_eq!(
            call.structured_content,
            Some(serde_json::to_value(&result).unwrap())
        );
        assert_eq!(call.is_error, Some(false));
    }
}
