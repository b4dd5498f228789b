//! What the command line accepts: [`Cli`], its global options and the commands (clap).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use loom_ia::{Period, Profile};

/// Loom: run AI agents whose every fact is journaled.
#[derive(Debug, Parser)]
#[command(name = "loom", version, about, propagate_version = true)]
pub struct Cli {
    /// Configuration file.
    #[arg(long, global = true, value_name = "FILE")]
    pub(super) config: Option<PathBuf>,
    /// Profile (wins over LOOM_PROFILE and the file's `profile:`).
    #[arg(long, global = true, value_parser = parse_profile)]
    pub(super) profile: Option<Profile>,
    /// Env file (`KEY=VALUE` lines) whose variables fill in the environment (a variable
    /// already set wins). Default: the configuration's `env_file:`, else `.env` beside it.
    #[arg(long = "env-file", global = true, value_name = "FILE")]
    pub(super) env_file: Option<PathBuf>,
    /// Read no env file (not even the configuration's `env_file:`).
    #[arg(long = "no-env-file", global = true, conflicts_with = "env_file")]
    pub(super) no_env_file: bool,
    #[command(subcommand)]
    pub(super) command: Command,
}

fn parse_profile(text: &str) -> Result<Profile, String> {
    text.parse()
}

fn parse_period(text: &str) -> Result<Period, String> {
    text.parse()
}

/// One `--state KEY=VALUE`: the value as JSON when it reads as JSON, else as a string.
pub(super) fn parse_state_pair(text: &str) -> Result<(String, serde_json::Value), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!("expected KEY=VALUE, got '{text}'"));
    };
    if key.is_empty() {
        return Err(format!(
            "expected KEY=VALUE, got '{text}' (the key is empty)"
        ));
    }
    let value =
        serde_json::from_str(value).unwrap_or_else(|_| serde_json::Value::String(value.to_owned()));
    Ok((key.to_owned(), value))
}

/// What `approve` and `reject` share.
#[derive(Debug, clap::Args)]
pub(super) struct DecisionArgs {
    /// Run id.
    pub(super) run_id: String,
    /// The call to decide (default: every call waiting).
    #[arg(long = "call", value_name = "CALL_ID")]
    pub(super) call: Option<String>,
    /// Who decides (journaled; default: the user name).
    #[arg(long, value_name = "NAME")]
    pub(super) by: Option<String>,
    /// Why (journaled; a rejection's reason is given to the model).
    #[arg(long)]
    pub(super) reason: Option<String>,
    /// Session of the run (found by search when absent).
    #[arg(long)]
    pub(super) session: Option<String>,
    /// Tenant of the run (default `default`).
    #[arg(long)]
    pub(super) tenant: Option<String>,
    /// Only journal the decision: the run stays paused until `loom resume`.
    #[arg(long = "no-wait")]
    pub(super) no_wait: bool,
    /// Print the result as JSON.
    #[arg(long)]
    pub(super) json: bool,
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// Load and check everything, and print what was understood.
    Validate,
    /// Run an agent on a message.
    Run {
        /// Agent name.
        agent: String,
        /// The user's message.
        message: String,
        /// Continue this session (its conversation is re-read).
        #[arg(long)]
        session: Option<String>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// Stream the answer as it is written, with progress on stderr.
        #[arg(long)]
        stream: bool,
        /// Choose the run id.
        #[arg(long = "run-id")]
        run_id: Option<String>,
        /// Tenant the run is for (default `default`; must be declared when `tenants` is).
        #[arg(long)]
        tenant: Option<String>,
        /// Judges: as configured (`auto`), always (`force`) or never (`skip`, refused in prod).
        #[arg(long, value_parser = ["auto", "force", "skip"], default_value = "auto")]
        judges: String,
        /// Attach a file to the message (repeatable): an image the models that read images
        /// see; its type comes from its content or its extension (`execution.attachments`).
        #[arg(long = "attach", value_name = "FILE")]
        attach: Vec<PathBuf>,
        /// Set a key of the session state (repeatable; the agent declares its keys in
        /// `state:`). VALUE is read as JSON when it is JSON (`42`, `true`, `{"a":1}`), else
        /// as a string; a key given twice is refused.
        #[arg(long = "state", value_name = "KEY=VALUE", value_parser = parse_state_pair)]
        state: Vec<(String, serde_json::Value)>,
    },
    /// Print a session's state as indented JSON (`{}` when its agent declares none).
    State {
        /// Session id.
        session: String,
        /// Tenant of the session (default `default`).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Grant the approval a paused run waits for, then drive it on.
    Approve {
        #[command(flatten)]
        decision: DecisionArgs,
        /// Corrected arguments (JSON) the tool receives instead of the model's (needs --call).
        #[arg(long, value_name = "JSON")]
        arguments: Option<String>,
    },
    /// Reject the approval a paused run waits for (the model is told why), then drive it on.
    Reject {
        #[command(flatten)]
        decision: DecisionArgs,
    },
    /// Show a run as its trace: steps, model calls, tool calls, judges, approvals and sub-runs.
    Inspect {
        /// Run id.
        run_id: String,
        /// Session of the run (found by search when absent).
        #[arg(long)]
        session: Option<String>,
        /// Tenant of the run (default `default`).
        #[arg(long)]
        tenant: Option<String>,
        /// Show everything, uncut.
        #[arg(long)]
        full: bool,
        /// Print the trace as JSON (the reference's `Trace`, with its spans).
        #[arg(long)]
        json: bool,
    },
    /// Tokens and cost of a run, a session, or a tenant over the current UTC day or month.
    Report {
        /// Run id (without it: the session's report with --session, else the tenant's over
        /// --period, by default today).
        run_id: Option<String>,
        /// The session (of the run, found by search when absent; alone: the session's report).
        #[arg(long)]
        session: Option<String>,
        /// Tenant (default: default).
        #[arg(long)]
        tenant: Option<String>,
        /// The tenant's usage over the current UTC `day` or `month`.
        #[arg(long, value_parser = parse_period, conflicts_with_all = ["run_id", "session"])]
        period: Option<Period>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replay a closed run exactly: re-driven with today's configuration, its model calls and
    /// tool calls answered from its journal (nothing external is called), compared event by
    /// event. Exit code 0 identical, 1 divergent, 2 impossible. With `--mode variant`: the same
    /// conversation with other models (`--model`) and tool doubles (`--double`), reported side
    /// by side; exit code 0 when the variant completed with no tool call refused, 1 otherwise,
    /// 2 impossible.
    Replay {
        /// Run id (with --journal: the run of the file; without it, every closed run of the
        /// file).
        run_id: Option<String>,
        /// Session of the run (found by search when absent).
        #[arg(long)]
        session: Option<String>,
        /// Tenant of the run (default `default`).
        #[arg(long)]
        tenant: Option<String>,
        /// Replay from this JSONL journal file (an export, or a session's journal) instead of
        /// the configured journal.
        #[arg(long, value_name = "FILE")]
        journal: Option<std::path::PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Also write the run's events (its history before it, the run and its sub-runs) to this
        /// JSONL file, which `--journal` replays; with `--mode variant`, the variant run's.
        #[arg(long, value_name = "FILE")]
        export: Option<std::path::PathBuf>,
        /// `exact` (compare with the journal) or `variant` (try other models and doubles).
        #[arg(long, value_enum, default_value = "exact")]
        mode: ReplayMode,
        /// Variant: run step STEP (`main`, a role, `judge:<name>`) on the configured model
        /// MODEL; every call of that step is made for real. Repeatable.
        #[arg(long = "model", value_name = "STEP=MODEL")]
        models: Vec<String>,
        /// Variant: answer tool TOOL's calls the journal has no result for with REF, a JSON
        /// value inline (a string is a text result) or `@FILE` (a JSON file). Repeatable.
        #[arg(long = "double", value_name = "TOOL=REF")]
        doubles: Vec<String>,
    },
    /// Run an evaluation suite: each case under each variant, in scratch journals, the
    /// agent's side-effect tools answered by the suite's doubles (never run), every expectation
    /// scored; approvals granted when a double answers the call, refused when the tool would
    /// really run. Exit code 0 all pass, 1 some fail, 2 the suite or a run cannot be played.
    Eval {
        /// The suite file (YAML); its `config`, when set, is the configuration used (over
        /// `--config`).
        suite: std::path::PathBuf,
        /// Run only this case (repeatable).
        #[arg(long = "case", value_name = "NAME")]
        cases: Vec<String>,
        /// Run only this variant (repeatable).
        #[arg(long = "variant", value_name = "NAME")]
        variants: Vec<String>,
        /// Write each run's journal to DIR as `<variant>--<case>.jsonl` (replayable with
        /// `loom replay --journal`).
        #[arg(long, value_name = "DIR")]
        export: Option<std::path::PathBuf>,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
        /// Runs played at once.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
        concurrency: u16,
    },
    /// Continue a run from where its journal stops (after a crash, a stop, an approval).
    Resume {
        /// Run id.
        run_id: String,
        /// Session of the run (found by search when absent).
        #[arg(long)]
        session: Option<String>,
        /// Tenant of the run (default `default`).
        #[arg(long)]
        tenant: Option<String>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Stop a run: it closes as cancelled in its journal.
    Cancel {
        /// Run id.
        run_id: String,
        /// Session of the run (found by search when absent).
        #[arg(long)]
        session: Option<String>,
        /// Tenant of the run (default `default`).
        #[arg(long)]
        tenant: Option<String>,
        /// Who cancels (journaled).
        #[arg(long)]
        by: Option<String>,
    },
    /// Send a message to a running run: it joins the conversation before its next model call.
    Steer {
        /// Run id.
        run_id: String,
        /// The message.
        message: String,
        /// Session of the run (found by search when absent).
        #[arg(long)]
        session: Option<String>,
        /// Tenant of the run (default `default`).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Compact a session now (`sessions.compaction`): the turns before the last `keep_last`
    /// are summarized, checked for fidelity, and replaced by the summary.
    Compact {
        /// Session id.
        session: String,
        /// Tenant of the session (default `default`).
        #[arg(long)]
        tenant: Option<String>,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List, show, list the files of, export, repair or delete sessions.
    Sessions {
        #[command(subcommand)]
        command: crate::sessions::SessionsCommand,
        /// Tenant of the sessions (default `default`; must be declared when `tenants` is).
        #[arg(long, global = true)]
        tenant: Option<String>,
    },
    /// Erase the sessions whose last write is older than `storage.retention.events_days`
    /// (journal, files, idempotency keys), even with approvals pending. Without --yes, only
    /// lists them.
    Retention {
        /// Only this tenant (default: every tenant of the configuration).
        #[arg(long)]
        tenant: Option<String>,
        /// Erase (without it, the sessions that would go are only listed).
        #[arg(long)]
        yes: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Serve the REST API with SSE (`server.http` of the configuration) until Ctrl-C or SIGTERM.
    ///
    /// On stop, the runs in flight stop at a safe point, open in their journal
    /// (`execution.shutdown_timeout`), and the next `loom serve` resumes them.
    Serve {
        /// Address to listen on (default `server.http.host`).
        #[arg(long)]
        host: Option<String>,
        /// Port to listen on (default `server.http.port`; `0`: a free port).
        #[arg(long)]
        port: Option<u16>,
        /// Development: restart the server when loom.yaml, the agents or the prompts change (a
        /// broken configuration is refused and the running one keeps serving). Refused under
        /// the prod profile.
        #[arg(long)]
        reload: bool,
    },
    /// Drive the background runs of the job queue (`storage.queue: rabbitmq`) until Ctrl-C or
    /// SIGTERM.
    ///
    /// A job is acknowledged once its run closed or paused; on stop, the runs in flight stop at
    /// a safe point and their jobs go back to the queue for another worker. A killed worker's
    /// jobs are delivered again, and its runs resume once their lease expires.
    Worker {
        /// How many runs to drive at once (default `storage.queue.max_running`).
        #[arg(long)]
        jobs: Option<u16>,
    },
    /// The job queue: how many jobs wait, and the jobs of its dead-letter queue (given up after
    /// `storage.queue.max_attempts` deliveries).
    Queue {
        #[command(subcommand)]
        command: Option<QueueCommand>,
        /// How many dead jobs to show (or redrive).
        #[arg(long, default_value_t = 20, global = true)]
        limit: usize,
        /// Print as JSON.
        #[arg(long, global = true)]
        json: bool,
    },
    /// Serve the agents as MCP tools on stdin/stdout (for Claude Desktop, Claude Code or any MCP
    /// client), until the client closes the connection. No key: everything is allowed in the
    /// tenant; logs go to stderr.
    Mcp {
        /// Tenant every run is opened and looked up in (default `default`).
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Print the JSON Schema of the configuration.
    Schema,
    /// Manage the API keys of `loom serve`.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// The durable storage: print the PostgreSQL schema for a DBA.
    Storage {
        #[command(subcommand)]
        command: StorageCommand,
    },
    /// The sandbox runner of agents declaring `sandbox: {backend: remote}`.
    Sandbox {
        #[command(subcommand)]
        command: SandboxCommand,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum SandboxCommand {
    /// Serve the sandbox contract over HTTP (`POST /v1/read|write|list|exec`, bearer token):
    /// working folders under `--root`, commands in bubblewrap on this host.
    Serve {
        /// Address to listen on, e.g. `127.0.0.1:7070`.
        #[arg(long)]
        listen: String,
        /// Root of the working folders.
        #[arg(long)]
        root: std::path::PathBuf,
        /// The environment variable holding the bearer token clients must send.
        #[arg(long, default_value = "LOOM_SANDBOX_TOKEN")]
        token_env: String,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum StorageCommand {
    /// Print the PostgreSQL schema (versioned migrations, the application role, row-level
    /// security, grants) as one script to apply with `psql -v ON_ERROR_STOP=1` as the user
    /// that will own the tables. Applying it twice changes nothing.
    Sql {
        /// The application role Loom's connections switch to (`storage.events.role`).
        #[arg(long, default_value = loom_ia::config::DEFAULT_POSTGRES_ROLE)]
        role: String,
    },
}

#[derive(Debug, Subcommand)]
pub(super) enum KeysCommand {
    /// Create a key: print it once, and the `security.api_keys` entry holding only its hash.
    Create {
        /// Key id (named in logs and errors).
        id: String,
        /// Tenant every request made with the key acts for (default `default`).
        #[arg(long)]
        tenant: Option<String>,
        /// A scope: run, read, read_content, approve, admin (repeatable; default run and read).
        #[arg(long = "scope", value_name = "SCOPE", value_parser = parse_scope)]
        scopes: Vec<loom_ia::config::Scope>,
        /// An agent the key may use (repeatable; default every agent of its tenant).
        #[arg(long = "agents", alias = "agent", value_name = "AGENT")]
        agents: Vec<String>,
        /// Expiry: a duration from now (`90d`, `12h`) or a date (`2027-01-01`).
        #[arg(long)]
        expires: Option<String>,
        /// Requests per minute the key may make (`rate_limit.per_minute`; default no limit).
        #[arg(long, value_name = "PER_MINUTE")]
        rate_limit: Option<u32>,
    },
}

fn parse_scope(text: &str) -> Result<loom_ia::config::Scope, String> {
    text.parse()
}

/// `loom queue` subcommands.
#[derive(Debug, clap::Subcommand)]
pub(super) enum QueueCommand {
    /// Move dead jobs back to the queue (their attempts counted from 0), or drop them.
    Redrive {
        /// Drop them instead.
        #[arg(long)]
        drop: bool,
    },
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::parse_state_pair;

    #[test]
    fn a_state_value_is_json_when_it_reads_as_json_else_a_string() {
        let cases = [
            ("visits=3", json!(3)),
            ("vip=true", json!(true)),
            ("client=C-42", json!("C-42")),
            ("code=\"007\"", json!("007")),
            ("cart={\"items\":[1,2]}", json!({"items": [1, 2]})),
            ("note=", json!("")),
            ("eq=a=b", json!("a=b")),
        ];
        for (text, expected) in cases {
            let (key, value) = parse_state_pair(text).unwrap();
            assert_eq!(value, expected, "{text}");
            assert!(!key.is_empty());
        }
        assert_eq!(
            parse_state_pair("client").unwrap_err(),
            "expected KEY=VALUE, got 'client'"
        );
        assert_eq!(
            parse_state_pair("=3").unwrap_err(),
            "expected KEY=VALUE, got '=3' (the key is empty)"
        );
    }
}

/// How `loom replay` replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum ReplayMode {
    /// Models and tools answered from the journal, compared event by event.
    Exact,
    /// Other models for named steps and doubles for named tools, reported side by side.
    Variant,
}
