//! The dispatch of a parsed command line: loads Loom, runs the command, and the signals and
//! logging around it.

use loom_ia::{
    Loom, LoomError, Period, Profile, RunOptions,
    config::{EnvFile, LoadOptions, LogFormat},
};

use crate::{App, FAILED, OK, REFUSED, output::out};

use super::{
    args::{Cli, Command, KeysCommand, QueueCommand, SandboxCommand, StorageCommand},
    exit::{fail, print_json},
    runs::{At, ReportOf, cancel, compact, decide, inspect, report, resume, run, steer, validate},
};

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
    if let Command::Sandbox {
        command:
            SandboxCommand::Serve {
                listen,
                root,
                token_env,
            },
    } = &cli.command
    {
        return crate::sandbox::serve(listen, root, token_env).await;
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
    let mut path = app.config_path(cli.config.as_deref());
    // An evaluation suite that names its configuration runs against it, whatever `--config`
    // says; a suite that cannot be read is refused before any configuration is opened.
    if let Command::Eval { suite, .. } = &cli.command {
        match loom_ia::eval::Suite::load(suite) {
            Ok(suite) => {
                if let Some(config) = suite.config_path() {
                    if !config.is_file() {
                        let message = format!("{}: no such configuration file", config.display());
                        eprintln!(
                            "{}",
                            super::exit::error_line(&suite.error_at("config", message))
                        );
                        return REFUSED;
                    }
                    path = config;
                }
            }
            Err(error) => {
                eprintln!("{}", super::exit::error_line(&error));
                return REFUSED;
            }
        }
    }
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
    for (kind, factory) in app.sources() {
        if let Err(error) = loom.register_source(kind, factory.clone()) {
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
        Command::Schema
        | Command::Keys { .. }
        | Command::Storage { .. }
        | Command::Sandbox { .. } => Ok(OK),
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
            state,
        } => {
            let Ok(judges) = judges.parse::<loom_ia::JudgeMode>() else {
                eprintln!("error: --judges must be auto, force or skip");
                return REFUSED;
            };
            let mut given = serde_json::Map::new();
            for (key, value) in state {
                if given.contains_key(&key) {
                    eprintln!("error: --state: the key '{key}' is given twice");
                    return REFUSED;
                }
                given.insert(key, value);
            }
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
                            state: given,
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
        Command::State { session, tenant } => loom
            .session_state(&session, tenant.as_deref())
            .await
            .map(|state| print_json(&state)),
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
        Command::Replay {
            run_id,
            session,
            tenant,
            journal,
            json,
            export,
            mode,
            models,
            doubles,
        } => {
            let args = super::replay::ReplayArgs {
                run_id,
                at: At::new(session, tenant),
                journal,
                json,
                export,
                variant: mode == super::args::ReplayMode::Variant,
                models,
                doubles,
            };
            super::replay::replay(&loom, args).await
        }
        Command::Eval {
            suite,
            cases,
            variants,
            export,
            json,
            concurrency,
        } => {
            let args = super::eval::EvalArgs {
                suite,
                cases,
                variants,
                export,
                json,
                concurrency: usize::from(concurrency),
            };
            super::eval::eval(&loom, args).await
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
        Command::Compact {
            session,
            tenant,
            json,
        } => compact(&loom, &session, tenant.as_deref(), json).await,
        Command::Sessions { command, tenant } => {
            crate::sessions::run(&loom, command, tenant.as_deref()).await
        }
        Command::Retention { tenant, yes, json } => {
            crate::retention::run(&loom, tenant.as_deref(), yes, json).await
        }
        Command::Serve { host, port, reload } => serve(&loom, host, port, reload, &args).await,
        Command::Mcp { tenant } => mcp(&loom, tenant.as_deref()).await,
        Command::Worker { jobs } => crate::worker::worker(&loom, jobs, stop_signal()).await,
        Command::Queue {
            command,
            limit,
            json,
        } => match command {
            None => crate::worker::status(&loom, limit, json).await,
            Some(QueueCommand::Redrive { drop }) => {
                crate::worker::redrive(&loom, limit, drop, json).await
            }
        },
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
