//! Arguments and commands.

use std::{path::PathBuf, sync::Mutex};

use clap::{Parser, Subcommand};
use loom_ia::{
    Event, Loom, LoomError, Period, Profile, RunOptions, RunStatus,
    config::{EnvFile, LoadOptions, LogFormat},
    core::event::Payload,
};

use crate::{
    App, FAILED, OK, REFUSED,
    output::{out, outln},
    render,
};

/// Loom: run AI agents whose every fact is journaled.
#[derive(Debug, Parser)]
#[command(name = "loom", version, about, propagate_version = true)]
pub struct Cli {
    /// Configuration file.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Profile (wins over LOOM_PROFILE and the file's `profile:`).
    #[arg(long, global = true, value_parser = parse_profile)]
    profile: Option<Profile>,
    /// Env file (`KEY=VALUE` lines) whose variables fill in the environment (a variable
    /// already set wins). Default: the configuration's `env_file:`, else `.env` beside it.
    #[arg(long = "env-file", global = true, value_name = "FILE")]
    env_file: Option<PathBuf>,
    /// Read no env file (not even the configuration's `env_file:`).
    #[arg(long = "no-env-file", global = true, conflicts_with = "env_file")]
    no_env_file: bool,
    #[command(subcommand)]
    command: Command,
}

fn parse_profile(text: &str) -> Result<Profile, String> {
    text.parse()
}

fn parse_period(text: &str) -> Result<Period, String> {
    text.parse()
}

/// What `approve` and `reject` share.
#[derive(Debug, clap::Args)]
struct DecisionArgs {
    /// Run id.
    run_id: String,
    /// The call to decide (default: every call waiting).
    #[arg(long = "call", value_name = "CALL_ID")]
    call: Option<String>,
    /// Who decides (journaled; default: the user name).
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
    /// Why (journaled; a rejection's reason is given to the model).
    #[arg(long)]
    reason: Option<String>,
    /// Session of the run (found by search when absent).
    #[arg(long)]
    session: Option<String>,
    /// Tenant of the run (default `default`).
    #[arg(long)]
    tenant: Option<String>,
    /// Only journal the decision: the run stays paused until `loom resume`.
    #[arg(long = "no-wait")]
    no_wait: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
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
}

#[derive(Debug, Subcommand)]
enum StorageCommand {
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
enum KeysCommand {
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

pub(crate) async fn execute(cli: Cli, app: App, args: Vec<std::ffi::OsString>) -> u8 {
    if let Command::Schema = cli.command {
        return print_json(&loom_ia::config::json_schema());
    }
    if let Command::Storage {
        command: StorageCommand::Sql { role },
    } = &cli.command
    {
        return match loom_ia::storage_sql(role) {
            Ok(text) => {
                out!("{text}");
                OK
            }
            Err(error) => {
                eprintln!("error: {error}");
                REFUSED
            }
        };
    }
    if let Command::Keys {
        command:
            KeysCommand::Create {
                id,
                tenant,
                scopes,
                agents,
                expires,
                rate_limit,
            },
    } = &cli.command
    {
        return match crate::keys::create(
            id,
            tenant.as_deref(),
            scopes,
            agents,
            expires.as_deref(),
            *rate_limit,
        ) {
            Ok(text) => {
                out!("{text}");
                eprintln!(
                    "The key is shown once: only its hash is stored. Add the entry to \
                     security.api_keys in loom.yaml."
                );
                OK
            }
            Err(error) => {
                eprintln!("error: {error}");
                REFUSED
            }
        };
    }
    let path = app.config_path(cli.config.as_deref());
    let options = LoadOptions {
        profile: cli.profile,
        env_file: match (&cli.env_file, cli.no_env_file) {
            (_, true) => EnvFile::Off,
            (Some(file), false) => EnvFile::Path(file.clone()),
            (None, false) => EnvFile::Beside,
        },
    };
    let loom = match Loom::open_config_with(&path, &options).await {
        Ok(loom) => loom,
        Err(error) => return fail(&error),
    };
    init_logging(&loom);
    // Setup warnings (e.g. a judge on the model it judges): said once, on stderr; `prod` makes
    // them errors when the configuration is loaded.
    for warning in loom.config().warnings() {
        eprintln!("warning: {warning}");
    }
    for tool in app.tools() {
        if let Err(error) = loom.register_arc(&tool.spec().name, tool.clone()) {
            return fail(&error);
        }
    }
    for (name, policy) in app.policies() {
        if let Err(error) = loom.register_policy(name, policy.clone()) {
            return fail(&error);
        }
    }
    for (name, condition) in app.conditions() {
        if let Err(error) = loom.register_condition(name, condition.clone()) {
            return fail(&error);
        }
    }
    let loom = app
        .tenant_budgets()
        .iter()
        .fold(loom, |loom, (tenant, budget)| {
            loom.with_tenant_budget(tenant.clone(), *budget)
        });
    // A server resolves every agent against the registered code before it serves: a
    // configuration a run would refuse never starts one (a refusal is exit 2).
    if matches!(cli.command, Command::Serve { .. } | Command::Mcp { .. })
        && let Err(error) = loom.check_agents()
    {
        return fail(&error);
    }
    let outcome = match cli.command {
        Command::Schema | Command::Keys { .. } | Command::Storage { .. } => Ok(OK),
        Command::Validate => validate(&loom).await,
        Command::Run {
            agent,
            message,
            session,
            json,
            stream,
            run_id,
            tenant,
            judges,
            attach,
        } => {
            let Ok(judges) = judges.parse::<loom_ia::JudgeMode>() else {
                eprintln!("error: --judges must be auto, force or skip");
                return REFUSED;
            };
            let attachments: Result<Vec<_>, _> = attach
                .iter()
                .map(|path| loom.read_attachment(path))
                .collect();
            match attachments {
                Ok(attachments) => {
                    run(
                        &loom,
                        &agent,
                        &message,
                        RunOptions {
                            session_id: session,
                            run_id,
                            tenant_id: tenant,
                            judges,
                            attachments,
                            ..RunOptions::default()
                        },
                        json,
                        stream,
                    )
                    .await
                }
                Err(error) => Err(error),
            }
        }
        Command::Approve {
            decision,
            arguments,
        } => decide(&loom, decision, Some(arguments)).await,
        Command::Reject { decision } => decide(&loom, decision, None).await,
        Command::Inspect {
            run_id,
            session,
            tenant,
            full,
            json,
        } => {
            let at = At::new(session, tenant);
            inspect(&loom, &run_id, &at, full, json).await
        }
        Command::Report {
            run_id,
            session,
            tenant,
            period,
            json,
        } => {
            let target = match (run_id, session) {
                (Some(run_id), session) => ReportOf::Run { run_id, session },
                (None, Some(session)) => ReportOf::Session(session),
                (None, None) => ReportOf::Tenant(period.unwrap_or(Period::Day)),
            };
            report(&loom, target, tenant.as_deref(), json).await
        }
        Command::Resume {
            run_id,
            session,
            tenant,
            json,
        } => resume(&loom, &run_id, &At::new(session, tenant), json).await,
        Command::Cancel {
            run_id,
            session,
            tenant,
            by,
        } => cancel(&loom, &run_id, &At::new(session, tenant), by).await,
        Command::Steer {
            run_id,
            message,
            session,
            tenant,
        } => steer(&loom, &run_id, &message, &At::new(session, tenant)).await,
        Command::Sessions { command, tenant } => {
            crate::sessions::run(&loom, command, tenant.as_deref()).await
        }
        Command::Retention { tenant, yes, json } => {
            crate::retention::run(&loom, tenant.as_deref(), yes, json).await
        }
        Command::Serve { host, port, reload } => serve(&loom, host, port, reload, &args).await,
        Command::Mcp { tenant } => mcp(&loom, tenant.as_deref()).await,
    };
    loom.shutdown().await;
    outcome.unwrap_or_else(|error| fail(&error))
}

/// `loom serve`: the REST API until Ctrl-C or SIGTERM; in-flight runs then stop at a safe
/// point, open and resumable (the next start resumes them), and open requests finish. With
/// `reload`, a supervisor restarts it on configuration changes (`reload.rs`).
async fn serve(
    loom: &Loom,
    host: Option<String>,
    port: Option<u16>,
    reload: bool,
    args: &[std::ffi::OsString],
) -> Result<u8, LoomError> {
    let mut settings = loom.config().raw().server.http.clone();
    if let Some(host) = host {
        settings.host = host;
    }
    if let Some(port) = port {
        settings.port = port;
    }
    if reload {
        #[cfg(unix)]
        return Ok(crate::reload::supervise(
            loom,
            args,
            &settings.host,
            settings.port,
            stop_signal(),
        )
        .await);
        #[cfg(not(unix))]
        {
            let _ = args;
            eprintln!("error: loom serve --reload needs a Unix system");
            return Ok(REFUSED);
        }
    }
    if loom.config().profile() == Some(Profile::Prod)
        && loom.config().raw().security.api_keys.is_empty()
    {
        eprintln!(
            "error: loom serve is refused under the prod profile without API keys: the API \
             would be open (create one with 'loom keys create <id>' and declare it in \
             security.api_keys)"
        );
        return Ok(REFUSED);
    }
    #[cfg(unix)]
    let inherited = crate::reload::inherited_listener();
    #[cfg(not(unix))]
    let inherited: Option<std::io::Result<tokio::net::TcpListener>> = None;
    let supervised = inherited.is_some();
    let listener = match inherited {
        Some(Ok(listener)) => listener,
        Some(Err(error)) => {
            eprintln!(
                "error: the listening socket handed over by loom serve --reload is unusable: {error}"
            );
            return Ok(FAILED);
        }
        None => match loom_http::bind(&settings.host, settings.port).await {
            Ok((listener, address)) => {
                eprintln!("Listening on http://{address}");
                listener
            }
            Err(error) => {
                eprintln!(
                    "error: cannot listen on {}:{}: {error}",
                    settings.host, settings.port
                );
                return Ok(FAILED);
            }
        },
    };
    if loom.config().raw().security.api_keys.is_empty() {
        tracing::warn!(
            "the REST API is open: no API key is required (tenant 'default', every scope)"
        );
    }
    if let Ok(address) = listener.local_addr() {
        for trigger in loom.config().triggers() {
            let signed = trigger
                .secret_env
                .as_ref()
                .map(|variable| format!(" (signed with {variable})"))
                .unwrap_or_default();
            eprintln!(
                "Hook: POST http://{address}{}/v1/hooks/{}{signed}",
                settings.base_path, trigger.name
            );
        }
    }
    // Runs an earlier process left open (a shutdown, a crash) go on.
    resume_left_open(loom).await;
    // SIGTERM and Ctrl-C stop the runs in flight at once; under `--reload`, the supervisor's
    // hand-over signal lets the requests in flight be answered first.
    // Caught from here on (before the ready line a supervisor waits for), not from the first
    // poll of the shutdown future: a SIGTERM right after start must not kill the process.
    let stopped = stop_signal();
    #[cfg(unix)]
    let mut hand_over: Option<tokio::signal::unix::Signal> = None;
    if supervised {
        // Under `--reload` only: elsewhere SIGHUP keeps its usual meaning (stop).
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            // Installed before the ready line: the supervisor's signals follow it.
            match (
                signal(SignalKind::hangup()),
                signal(SignalKind::from_raw(crate::reload::HAND_OVER as i32)),
            ) {
                (Ok(hangup), Ok(handing)) => {
                    tokio::spawn(resume_on_hangup(loom.clone(), hangup));
                    hand_over = Some(handing);
                }
                (Err(error), _) | (_, Err(error)) => {
                    eprintln!("error: cannot catch the signals of loom serve --reload: {error}");
                    return Ok(FAILED);
                }
            }
            crate::reload::report_ready();
        }
    }
    #[cfg(unix)]
    let drained = loom.clone();
    let shutdown = async move {
        #[cfg(unix)]
        if let Some(mut handing) = hand_over {
            let mut stopped = std::pin::pin!(stopped);
            return tokio::select! {
                () = stopped.as_mut() => loom_http::Shutdown::Stop,
                _ = handing.recv() => {
                    eprintln!("Handing over: the requests in flight are answered first.");
                    // SIGTERM or Ctrl-C during the drain stops the runs (after their step).
                    let escalated = stop_signal();
                    tokio::spawn(async move {
                        escalated.await;
                        drained.stop(drained.shutdown_timeout()).await;
                    });
                    loom_http::Shutdown::Drain
                }
            };
        }
        stopped.await;
        loom_http::Shutdown::Stop
    };
    match loom_http::serve_until(loom.clone(), listener, &settings, shutdown).await {
        Ok(()) => Ok(OK),
        Err(error) => {
            eprintln!("error: the server stopped: {error}");
            Ok(FAILED)
        }
    }
}

/// `loom mcp`: the MCP server on stdio until the client closes it (stdout is the protocol:
/// nothing else is printed there).
async fn mcp(loom: &Loom, tenant: Option<&str>) -> Result<u8, LoomError> {
    match loom_mcp_server::serve_stdio(loom.clone(), tenant).await {
        Ok(()) => Ok(OK),
        Err(loom_mcp_server::ServeError::UnknownTenant(message)) => {
            eprintln!("error: {message}");
            Ok(REFUSED)
        }
        Err(error) => {
            eprintln!("error: {error}");
            Ok(FAILED)
        }
    }
}

/// Resumes, in the background, the runs left open by an earlier process whose lease has ended.
async fn resume_left_open(loom: &Loom) {
    match loom.recover_all().await {
        Ok(runs) if runs.is_empty() => {}
        Ok(runs) => {
            let ids: Vec<&str> = runs.iter().map(|r| r.run_id.as_str()).collect();
            eprintln!(
                "Resuming {} run(s) left open by an earlier stop: {}",
                runs.len(),
                ids.join(", ")
            );
        }
        Err(error) => eprintln!("warning: the runs left open could not be listed: {error}"),
    }
}

/// On SIGHUP (sent by `loom serve --reload` once the server it replaced has stopped), resumes
/// the runs that server left open.
#[cfg(unix)]
async fn resume_on_hangup(loom: Loom, mut hangup: tokio::signal::unix::Signal) {
    while hangup.recv().await.is_some() {
        resume_left_open(&loom).await;
    }
}

/// Resolves on Ctrl-C or, on Unix, SIGTERM or SIGINT, caught from the call on (not from the
/// first poll).
fn stop_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{SignalKind, signal};
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    async move {
        #[cfg(unix)]
        match signals {
            (Ok(mut terminate), Ok(mut interrupt)) => {
                tokio::select! {
                    _ = terminate.recv() => {}
                    _ = interrupt.recv() => {}
                }
            }
            (terminate, interrupt) => {
                for error in [terminate.err(), interrupt.err()].into_iter().flatten() {
                    tracing::warn!(%error, "a stop signal cannot be caught: Ctrl-C only");
                }
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        eprintln!("Stopping.");
    }
}

fn fail(error: &LoomError) -> u8 {
    eprintln!("{}", error_line(error));
    if error.is_refusal() { REFUSED } else { FAILED }
}

/// What `loom` prints for an error.
fn error_line(error: &LoomError) -> String {
    match error {
        LoomError::Config(config) => format!("config error: {config}"),
        LoomError::BudgetExhausted { retry_in, .. } => format!(
            "error: {error} — retry in {}",
            loom_ia::budget::human_delay(*retry_in)
        ),
        LoomError::MissingKey { .. } => format!(
            "error: {error}\nhint: the tenant's key must be the one that sealed its journal \
             (storage.encryption.keys: the first seals, all open); a deleted key cannot be \
             recovered, and 'loom sessions delete' or 'loom retention' still erase the session"
        ),
        LoomError::Journal(loom_ia::core::ports::StoreError::Corrupted { .. }) => format!(
            "error: {error}\nhint: 'loom sessions export --valid-only <session>' exports what reads \
             back; 'loom sessions repair <session>' sets the unreadable line aside"
        ),
        other => format!("error: {other}"),
    }
}

fn init_logging(loom: &Loom) {
    let logging = &loom.config().raw().telemetry.logging;
    let level = logging.level().map_or("info", |l| match l {
        loom_ia::config::LogLevel::Error => "error",
        loom_ia::config::LogLevel::Warn => "warn",
        loom_ia::config::LogLevel::Info => "info",
        loom_ia::config::LogLevel::Debug => "debug",
        loom_ia::config::LogLevel::Trace => "trace",
    });
    // LOOM_LOG may come from the env file too.
    let loom_log = loom.env_var("LOOM_LOG");
    let filter = loom_log
        .as_deref()
        .and_then(|directives| tracing_subscriber::EnvFilter::try_new(directives).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new(level));
    // rmcp logs whole MCP messages (tool arguments, answers) at debug and info: logs never hold
    // content, so it says only warnings unless LOOM_LOG names it.
    let named = loom_log.is_some_and(|v| v.contains("rmcp"));
    let filter = match "rmcp=warn".parse() {
        Ok(quiet) if !named => filter.add_directive(quiet),
        _ => filter,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match logging.format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Console => builder.without_time().with_target(false).try_init(),
    };
}

/// Prints `value` as indented JSON on stdout.
pub(crate) fn print_json(value: &impl serde::Serialize) -> u8 {
    match serde_json::to_string_pretty(value) {
        Ok(text) => {
            outln!("{text}");
            OK
        }
        Err(error) => {
            eprintln!("error: {error}");
            FAILED
        }
    }
}

async fn validate(loom: &Loom) -> Result<u8, LoomError> {
    let validation = loom.validate().await?;
    out!("{}", render::validation(&validation));
    Ok(OK)
}

async fn run(
    loom: &Loom,
    agent: &str,
    message: &str,
    options: RunOptions,
    json: bool,
    stream: bool,
) -> Result<u8, LoomError> {
    // Ctrl-C cancels the run: it closes as `cancelled` in its journal instead of being left open.
    let interrupt = {
        let loom = loom.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                eprintln!("Interrupted.");
                loom.cancel_all();
            }
        })
    };
    let tenant = options
        .tenant_id
        .clone()
        .unwrap_or_else(|| loom_ia::DEFAULT_TENANT.to_owned());
    let result = if stream {
        let progress = Progress {
            deltas: !json,
            wrote_text: Mutex::new(false),
        };
        let result = loom
            .run_observed(agent, message, options, &progress)
            .await?;
        if progress.wrote() {
            outln!();
        }
        result
    } else {
        loom.run(agent, message, options).await?
    };
    interrupt.abort();
    Ok(report_result(&result, &tenant, json, stream))
}

/// Prints a run's result as `loom run` does: the answer on stdout (nothing for a paused run),
/// the summary on stderr; the exit code says whether it completed.
fn report_result(result: &loom_ia::RunResult, tenant: &str, json: bool, streamed: bool) -> u8 {
    if json {
        print_json(result);
    } else if !streamed && !waits(result.status) {
        outln!(
            "{}",
            if result.text.is_empty() {
                "—"
            } else {
                &result.text
            }
        );
    }
    eprint!("{}", render::run_summary(result, tenant));
    if result.ok() { OK } else { FAILED }
}

/// Whether a run stopped to wait for a human: its own approval, or a sub-run's.
fn waits(status: RunStatus) -> bool {
    matches!(status, RunStatus::Paused | RunStatus::WaitingChild)
}

/// `approve` (with `arguments`, possibly `None` inside) and `reject` (`arguments` `None`).
async fn decide(
    loom: &Loom,
    args: DecisionArgs,
    arguments: Option<Option<String>>,
) -> Result<u8, LoomError> {
    let approving = arguments.is_some();
    let corrected = match arguments.flatten() {
        Some(_) if args.call.is_none() => {
            eprintln!("error: --arguments corrects one named call: add --call.");
            return Ok(REFUSED);
        }
        Some(text) => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(value) => Some(value),
            Err(error) => {
                eprintln!("error: --arguments is not valid JSON: {error}");
                return Ok(REFUSED);
            }
        },
        None => None,
    };
    let by = args.by.clone().unwrap_or_else(user_name);
    let run = loom
        .locate(
            &args.run_id,
            args.session.as_deref(),
            args.tenant.as_deref(),
        )
        .await?;
    let call = args.call.as_deref();
    let reason = args.reason.as_deref();
    let decided = if approving {
        loom.approve(&run, call, &by, reason, corrected, args.no_wait)
            .await?
    } else {
        loom.reject(&run, call, &by, reason, args.no_wait).await?
    };
    let verb = if approving { "Approved" } else { "Rejected" };
    eprintln!("{verb}: {}", decided.calls.join(", "));
    let result = decided.result;
    if args.no_wait {
        if args.json {
            print_json(&result);
        }
        eprintln!(
            "Run {}: decision journaled; the run stays {} until `loom resume {}{}`.",
            result.run_id,
            result.status,
            result.run_id,
            render::tenant_flag(&run.tenant_id)
        );
        return Ok(OK);
    }
    if args.json {
        print_json(&result);
    } else if !waits(result.status) {
        outln!(
            "{}",
            if result.text.is_empty() {
                "—"
            } else {
                &result.text
            }
        );
    }
    eprint!("{}", render::run_summary(&result, &run.tenant_id));
    Ok(if result.ok() { OK } else { FAILED })
}

/// Who decides when `--by` is not given: the user name, else "cli".
pub(crate) fn user_name() -> String {
    ["USER", "USERNAME", "LOGNAME"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|n| !n.trim().is_empty()))
        .unwrap_or_else(|| "cli".to_owned())
}

/// `--stream`: text deltas on stdout as they come, one progress line per event on stderr.
struct Progress {
    deltas: bool,
    wrote_text: Mutex<bool>,
}

impl Progress {
    fn wrote(&self) -> bool {
        self.wrote_text.lock().map(|w| *w).unwrap_or(false)
    }
}

impl loom_ia::Observer for Progress {
    fn event(&self, event: &Event) {
        if let Some(line) = render::progress_line(event) {
            eprintln!("{line}");
        }
        if let Payload::ModelResponded(_) = &event.payload
            && self.wrote()
            && self.deltas
        {
            outln!();
            if let Ok(mut wrote) = self.wrote_text.lock() {
                *wrote = false;
            }
        }
    }

    fn reset(&self, _run_id: &str) {
        // The attempt that was streaming failed: what was shown of it is not the answer.
        if self.wrote() && self.deltas {
            outln!();
            if let Ok(mut wrote) = self.wrote_text.lock() {
                *wrote = false;
            }
        }
        eprintln!("· answer restarted");
    }

    fn text_delta(&self, _run_id: &str, text: &str) {
        if !self.deltas {
            return;
        }
        out!("{text}");
        if let Ok(mut wrote) = self.wrote_text.lock() {
            *wrote = true;
        }
    }
}

/// Where to look for a run: `--session` and `--tenant`.
struct At {
    session: Option<String>,
    tenant: Option<String>,
}

impl At {
    fn new(session: Option<String>, tenant: Option<String>) -> At {
        At { session, tenant }
    }

    async fn locate(&self, loom: &Loom, run_id: &str) -> Result<loom_ia::RunRef, LoomError> {
        loom.locate(run_id, self.session.as_deref(), self.tenant.as_deref())
            .await
    }
}

async fn inspect(
    loom: &Loom,
    run_id: &str,
    at: &At,
    full: bool,
    json: bool,
) -> Result<u8, LoomError> {
    let run = at.locate(loom, run_id).await?;
    let trace = loom.trace(&run).await?;
    if json {
        return Ok(print_json(&trace));
    }
    out!("{}", crate::inspect::trace(&trace, full));
    Ok(OK)
}

/// What `loom report` covers.
enum ReportOf {
    Run {
        run_id: String,
        session: Option<String>,
    },
    Session(String),
    Tenant(Period),
}

async fn report(
    loom: &Loom,
    target: ReportOf,
    tenant: Option<&str>,
    json: bool,
) -> Result<u8, LoomError> {
    let report = match target {
        ReportOf::Run { run_id, session } => {
            let run = loom.locate(&run_id, session.as_deref(), tenant).await?;
            loom.report(&run).await?
        }
        ReportOf::Session(session) => loom.session_report(&session, tenant).await?,
        ReportOf::Tenant(period) => {
            let tenant = tenant.unwrap_or(loom_ia::DEFAULT_TENANT);
            loom.tenant_report(tenant, period, chrono::Utc::now())
                .await?
        }
    };
    if json {
        return Ok(print_json(&report));
    }
    out!("{}", render::usage(&report));
    Ok(OK)
}

async fn resume(loom: &Loom, run_id: &str, at: &At, json: bool) -> Result<u8, LoomError> {
    let run = at.locate(loom, run_id).await?;
    let result = loom.resume(&run).await?;
    Ok(report_result(&result, &run.tenant_id, json, false))
}

async fn cancel(loom: &Loom, run_id: &str, at: &At, by: Option<String>) -> Result<u8, LoomError> {
    let run = at.locate(loom, run_id).await?;
    if loom.cancel(&run, by).await? {
        eprintln!("Run {run_id}: cancelled.");
        Ok(OK)
    } else {
        eprintln!("Run {run_id}: already closed, nothing to cancel.");
        Ok(REFUSED)
    }
}

async fn steer(loom: &Loom, run_id: &str, message: &str, at: &At) -> Result<u8, LoomError> {
    let run = at.locate(loom, run_id).await?;
    loom.steer(&run, message).await?;
    eprintln!("Run {run_id}: message journaled; the run reads it before its next model call.");
    Ok(OK)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use loom_ia::budget::Amount;

    use super::*;

    #[test]
    fn a_tenant_quota_says_when_to_retry_and_is_a_refusal() {
        let error = LoomError::QuotaExceeded {
            tenant: "acme".into(),
            limit: 30,
            retry_after: Duration::from_millis(41_200),
        };
        assert_eq!(
            error_line(&error),
            "error: tenant 'acme': 30 runs per minute exceeded, retry in 42 s"
        );
        assert_eq!(fail(&error), REFUSED);
    }

    #[test]
    fn an_exhausted_tenant_budget_says_when_to_retry() {
        let error = LoomError::BudgetExhausted {
            tenant: "dupont".into(),
            period: Period::Day,
            spent: Amount::Tokens(577),
            limit: Amount::Tokens(100),
            retry_in: Duration::from_secs(11 * 3600 + 57 * 60 + 12),
        };
        assert_eq!(
            error_line(&error),
            "error: tenant 'dupont': tenant budget reached for the day: 577 tokens (limit 100 tokens) — retry in 11 h 57 min"
        );
        assert_eq!(fail(&error), REFUSED);
    }
}
