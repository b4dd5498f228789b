//! Evaluations ([`Loom::eval`]): each case of a suite under each variant, `repeat` times, each
//! run in its own scratch memory journal, with the agent's side-effect tools answered by the
//! suite's doubles (`loom_engine::replay::doubled`), scored by `crate::eval`. A case that
//! replays a recorded conversation is re-driven as a variant replay
//! (`loom_engine::replay::replay_variant`), the suite's doubles given to the plan.

use std::{collections::BTreeMap, path::Path, sync::Arc};

use futures_util::StreamExt;
use loom_core::{
    Event, Message, Payload,
    tool::{SideEffects, Tool, ToolOutput},
};
use loom_engine::{
    AgentRuntime, Attachment, BeginRun, Cancel, JudgeMode, JudgeRuntime,
    replay::{Recording, VariantPlan, doubled},
};
use serde_json::Value;

use super::{DEFAULT_TENANT, Loom};
use crate::{
    LoomError, RunResult,
    eval::{EVAL_JUDGE, EvalReport, EvalRun, Outcome, Suite, VariantSpec},
};

/// Which runs of a suite to play, and how.
#[derive(Debug, Clone, Default)]
pub struct EvalOptions {
    /// Cases to run, by name (empty: all).
    pub cases: Vec<String>,
    /// Variants to run, by name (empty: all).
    pub variants: Vec<String>,
    /// Runs played at once (0 or 1: one after the other).
    pub concurrency: usize,
}

/// One run of a case under one variant, ready to play.
struct Job {
    case: usize,
    attempt: u32,
    variant: VariantSpec,
    agent: AgentRuntime,
}

/// Where a case's conversation comes from, read before any run.
enum Source {
    /// A new message, with its attachments and the state the run opens with.
    Message {
        input: String,
        attachments: Vec<Attachment>,
        state: serde_json::Map<String, Value>,
    },
    /// A recorded run's conversation: its session's events and the run.
    Replay { session: Vec<Event>, run_id: String },
}

impl Loom {
    /// Runs `suite` against this configuration's agent: every selected case under every
    /// selected variant, as many times as its `repeat`, each run in a scratch memory journal of
    /// its own (this instance's journal is never written), up to `options.concurrency` at
    /// once, and scores each run. The agent's tools whose `side_effects` is not `none` never
    /// run: they are answered by the suite's `doubles`, and a call of one without a double gets
    /// an error result and fails its case. A case that `replay`s a recorded run re-drives its
    /// conversation as a variant replay: the variant's model (every call made for real when the
    /// variant names one; otherwise a request the journal recorded is answered from it), tool
    /// calls answered from the journal, else by the doubles, else run only when the tool has
    /// no side effects. `progress` is told of each run as it ends.
    ///
    /// Refused before any run ([`LoomError::Config`], located in the suite file): an unknown
    /// agent, tenant, model, case or variant named by the suite or the options, a double for a
    /// tool the agent does not have, an attachment that cannot be read or is refused, a
    /// journal to replay that cannot be read, holds no closed run, or whose run is another
    /// agent's or tenant's. The tools of MCP servers are held back the same way once the
    /// server lists them (a double may name one, `<server>__<tool>`). A run
    /// that cannot be played is an [`EvalRun`] with its `error`.
    pub async fn eval(
        &self,
        suite: &Suite,
        options: &EvalOptions,
        progress: &(dyn Fn(&EvalRun) + Sync),
    ) -> Result<EvalReport, LoomError> {
        let spec = &suite.spec;
        let tenant = spec.tenant.as_deref().unwrap_or(DEFAULT_TENANT);
        let config = &self.inner.config;
        config
            .check_tenant(tenant)
            .map_err(|e| suite.error_at("tenant", e.to_string()))?;
        let base = self.agent(&spec.agent, tenant).map_err(|e| match e {
            LoomError::UnknownAgent { .. } => suite.error_at("agent", e.to_string()),
            other => other,
        })?;
        let doubles = self.doubles(suite, &base)?;
        let cases = select(
            spec.cases.iter().map(|c| c.name.as_str()),
            &options.cases,
            "case",
        )?;
        let all_variants = suite.variants();
        let variants = select(
            all_variants.iter().map(|v| v.name.as_str()),
            &options.variants,
            "variant",
        )?;
        let mut sources = BTreeMap::new();
        for &case in &cases {
            sources.insert(case, self.source(suite, tenant, case).await?);
        }
        let judge = match &spec.judge {
            Some(judge) => Some(self.model_of(suite, tenant, &judge.model, "judge.model")?),
            None => None,
        };
        let mut jobs = Vec::new();
        for &v in &variants {
            let Some(variant) = all_variants.get(v) else {
                continue;
            };
            let mut agent = (*base).clone();
            if let Some(model) = &variant.model {
                agent.main =
                    self.model_of(suite, tenant, model, &format!("variants[{v}].model"))?;
            }
            if let Some(system) = &variant.system {
                agent.system = system.clone();
            }
            for (key, value) in &variant.params {
                agent.main.params.insert(key.clone(), value.clone());
            }
            for &case in &cases {
                let mut agent = agent.clone();
                let criteria = suite.criteria(case);
                if let (Some(judge), false) = (&judge, criteria.is_empty()) {
                    let runtime =
                        JudgeRuntime::new(EVAL_JUDGE, judge.clone(), criteria).map_err(|e| {
                            suite.error_at(&format!("cases[{case}].criteria"), e.to_string())
                        })?;
                    agent.judges.push(runtime);
                }
                for attempt in 1..=suite.repeat(case) {
                    jobs.push(Job {
                        case,
                        attempt,
                        variant: variant.clone(),
                        agent: agent.clone(),
                    });
                }
            }
        }
        let (doubles, sources) = (&doubles, &sources);
        let runs: Vec<EvalRun> = futures_util::stream::iter(jobs)
            .map(|job| async move {
                let run = self.eval_run(suite, tenant, doubles, sources, job).await;
                progress(&run);
                run
            })
            .buffered(options.concurrency.max(1))
            .collect()
            .await;
        Ok(EvalReport::new(
            suite,
            variants
                .iter()
                .filter_map(|&v| all_variants.get(v).map(|v| v.name.clone()))
                .collect(),
            cases.len(),
            runs,
        ))
    }

    /// The suite's doubles as tool results, each checked to name a tool of the agent.
    fn doubles(
        &self,
        suite: &Suite,
        agent: &AgentRuntime,
    ) -> Result<Vec<(String, ToolOutput)>, LoomError> {
        let mut tools = Vec::new();
        collect_tools(agent, &mut tools);
        suite
            .spec
            .doubles
            .iter()
            .map(|(tool, value)| {
                let key = format!("doubles.{tool}");
                match tools.iter().find(|(name, _)| name == tool) {
                    // A tool of a source (an MCP server, named `<server>__<tool>`) is known
                    // only once the server lists it: its double is kept, and used when the
                    // server's declarations give it side effects.
                    None if source_tool(agent, tool) => {}
                    None => {
                        let names: Vec<&str> = tools.iter().map(|(n, _)| n.as_str()).collect();
                        return Err(suite.error_at(
                            &key,
                            format!(
                                "agent '{}' has no tool '{tool}' (its tools: {})",
                                agent.name,
                                names.join(", ")
                            ),
                        ));
                    }
                    Some((_, SideEffects::None)) => {
                        return Err(suite.error_at(
                            &key,
                            format!(
                                "tool '{tool}' has no side effects: it runs during an \
                                 evaluation, and a double for it would never be used"
                            ),
                        ));
                    }
                    Some(_) => {}
                }
                let output = match value {
                    Value::String(text) => ToolOutput::text(text.clone()),
                    other => ToolOutput::json(other.clone()),
                };
                Ok((tool.clone(), output))
            })
            .collect()
    }

    /// Where case `index`'s conversation comes from: its message and attachments (each read
    /// and checked), or the recorded run it replays.
    async fn source(&self, suite: &Suite, tenant: &str, index: usize) -> Result<Source, LoomError> {
        let case = suite
            .spec
            .cases
            .get(index)
            .ok_or_else(|| LoomError::Invalid(format!("no case {index}")))?;
        if let Some(reference) = &case.replay {
            return self.replayed(suite, tenant, index, reference).await;
        }
        let mut attachments = Vec::with_capacity(case.attachments.len());
        for (a, file) in case.attachments.iter().enumerate() {
            let path = suite.dir.join(file);
            let key = format!("cases[{index}].attachments[{a}]");
            let bytes = std::fs::read(&path)
                .map_err(|e| suite.error_at(&key, format!("{}: {e}", path.display())))?;
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| file.display().to_string());
            attachments.push(
                self.attachment(name, bytes, None)
                    .map_err(|e| suite.error_at(&key, e.to_string()))?,
            );
        }
        Ok(Source::Message {
            input: case.input.clone().unwrap_or_default(),
            attachments,
            state: case.state.clone(),
        })
    }

    /// The recorded run case `index` replays: the last closed root run of a JSONL journal
    /// file next to the suite, else the run of this configuration's journal with that id. It
    /// must be a run of the suite's agent and tenant.
    async fn replayed(
        &self,
        suite: &Suite,
        tenant: &str,
        index: usize,
        reference: &str,
    ) -> Result<Source, LoomError> {
        let key = format!("cases[{index}].replay");
        let path = suite.dir.join(reference);
        let (session, run_id) = if path.is_file() {
            let session = read_journal(&path).map_err(|m| suite.error_at(&key, m))?;
            let run_id = Loom::closed_root_runs(&session).pop().ok_or_else(|| {
                suite.error_at(
                    &key,
                    format!("{}: the file holds no closed run to replay", path.display()),
                )
            })?;
            (session, run_id)
        } else if reference.contains(['/', '\\']) || reference.ends_with(".jsonl") {
            return Err(suite.error_at(&key, format!("{}: no such journal file", path.display())));
        } else {
            let run = self
                .locate(reference, None, Some(tenant))
                .await
                .map_err(|e| match e {
                    LoomError::UnknownRun(_) => suite.error_at(
                        &key,
                        format!(
                            "'{reference}' is neither a journal file next to the suite nor a \
                             run of tenant '{tenant}'"
                        ),
                    ),
                    other => other,
                })?;
            (self.export_run(&run).await?, reference.to_owned())
        };
        let start = session
            .iter()
            .find(|e| e.run_id == run_id && matches!(e.payload, Payload::RunStarted(_)))
            .ok_or_else(|| suite.error_at(&key, format!("run {run_id} has no run.started")))?;
        let agent = start.agent.as_deref().unwrap_or_default();
        if agent != suite.spec.agent {
            return Err(suite.error_at(
                &key,
                format!(
                    "run {run_id} is a conversation of agent '{agent}', not of '{}'",
                    suite.spec.agent
                ),
            ));
        }
        if start.tenant_id != tenant {
            return Err(suite.error_at(
                &key,
                format!(
                    "run {run_id} belongs to tenant '{}', the suite's runs to '{tenant}'",
                    start.tenant_id
                ),
            ));
        }
        Ok(Source::Replay { session, run_id })
    }

    /// The declared model `id`, an error located at `key` of the suite when there is none.
    fn model_of(
        &self,
        suite: &Suite,
        tenant: &str,
        id: &str,
        key: &str,
    ) -> Result<loom_engine::ModelBinding, LoomError> {
        let inner = &self.inner;
        crate::resolve::declared_model(&inner.config, &inner.models, &inner.sources, tenant, id)?
            .ok_or_else(|| {
                let known: Vec<&str> = inner
                    .config
                    .raw()
                    .models
                    .iter()
                    .map(|m| m.id.as_str())
                    .collect();
                suite.error_at(
                    key,
                    format!(
                        "unknown model '{id}' (declared models: {})",
                        known.join(", ")
                    ),
                )
            })
    }

    /// Plays one run of a case under one variant in a scratch journal, and scores it.
    async fn eval_run(
        &self,
        suite: &Suite,
        tenant: &str,
        doubles: &[(String, ToolOutput)],
        sources: &BTreeMap<usize, Source>,
        job: Job,
    ) -> EvalRun {
        let name = suite
            .spec
            .cases
            .get(job.case)
            .map(|c| c.name.clone())
            .unwrap_or_default();
        let mut run = EvalRun {
            case: name,
            variant: job.variant.name.clone(),
            attempt: job.attempt,
            passed: false,
            run_id: None,
            session_id: None,
            status: "error".into(),
            text: String::new(),
            cost_usd: 0.0,
            judge_cost_usd: 0.0,
            input_tokens: 0,
            output_tokens: 0,
            latency_ms: 0,
            checks: Vec::new(),
            error: None,
            events: Vec::new(),
        };
        let played = match sources.get(&job.case) {
            Some(Source::Message {
                input,
                attachments,
                state,
            }) => {
                let message = (input.as_str(), attachments.as_slice(), state);
                self.play(tenant, doubles, &job, message, &mut run).await
            }
            Some(Source::Replay { session, run_id }) => {
                self.play_replay(doubles, &job, session, run_id, &mut run)
                    .await
            }
            None => Err(LoomError::Invalid(format!(
                "no source for case {}",
                job.case
            ))),
        };
        match played {
            Ok(outcome) => {
                run.checks = suite.score(job.case, &outcome);
                run.passed = run.checks.iter().all(|c| c.passed);
                run.status = outcome.status;
                run.text = outcome.text;
                run.cost_usd = outcome.cost_usd;
                run.judge_cost_usd = outcome.judge_cost_usd;
                run.input_tokens = outcome.input_tokens;
                run.output_tokens = outcome.output_tokens;
                run.latency_ms = outcome.latency_ms;
            }
            Err(error) => run.error = Some(error.to_string()),
        }
        run
    }

    /// Plays a case's message with the agent whose side-effect tools are answered by
    /// `doubles`.
    async fn play(
        &self,
        tenant: &str,
        doubles: &[(String, ToolOutput)],
        job: &Job,
        (input, attachments, state): (&str, &[Attachment], &serde_json::Map<String, Value>),
        run: &mut EvalRun,
    ) -> Result<Outcome, LoomError> {
        let book = Arc::new(Recording::from_doubles(doubles.iter().cloned()));
        let agent = doubled(&job.agent, &book)?;
        let engine = self.scratch_engine();
        let begin = BeginRun {
            tenant_id: tenant.to_owned(),
            session_id: None,
            run_id: None,
            user_id: None,
            metadata: serde_json::Map::new(),
            message: Message::user(input.to_owned()),
            judges: JudgeMode::Auto,
            budget: None,
            attachments: attachments.to_vec(),
            trigger: None,
            state: state.clone(),
        };
        let opened = engine.begin(&agent, begin, &()).await?;
        run.run_id = Some(opened.run_id.clone());
        run.session_id = Some(opened.session_id.clone());
        let driven = engine
            .drive_with(&opened, &agent, &(), Cancel::new(), None)
            .await;
        // What was journaled is kept for `--export` even when the drive failed.
        run.events = engine
            .store()
            .read(&opened.tenant_id, &opened.session_id, 0)
            .await?;
        driven?;
        let result = RunResult::from_events(&opened.run_id, &run.events)
            .map_err(|e| LoomError::Invalid(e.to_string()))?;
        let refused = book
            .misses()
            .into_iter()
            .filter(|m| m.kind == "tool")
            .map(|m| m.detail)
            .collect();
        let state = job.agent.state.fold_window(&run.events).values();
        Ok(Outcome::from_events(&result, &run.events, refused, state))
    }

    /// Replays the recorded run `run_id` of `session` as the variant of `job`: the variant's
    /// model named for the main step when the variant changes it (every call made for real),
    /// `doubles` answering the side-effect tools the journal has no result for.
    async fn play_replay(
        &self,
        doubles: &[(String, ToolOutput)],
        job: &Job,
        session: &[Event],
        run_id: &str,
        run: &mut EvalRun,
    ) -> Result<Outcome, LoomError> {
        let mut plan = VariantPlan::default();
        if job.variant.model.is_some() {
            plan.models.insert("main".into(), job.agent.main.clone());
        }
        for (tool, output) in doubles {
            let double: Arc<dyn Tool> =
                Arc::new(crate::testing::ToolDouble::returning(tool, output.clone()));
            plan.doubles.insert(tool.clone(), double);
        }
        let engine = self.scratch_engine();
        let replayed = loom_engine::replay::replay_variant(
            &engine,
            &job.agent,
            &plan,
            session,
            run_id,
            self.originals(),
        )
        .await?;
        let (tenant, session_id) = replayed
            .replayed
            .first()
            .map(|e| (e.tenant_id.clone(), e.session_id.clone()))
            .ok_or_else(|| LoomError::Invalid(format!("the replay of {run_id} wrote nothing")))?;
        run.run_id = Some(run_id.to_owned());
        run.session_id = Some(session_id.clone());
        run.events = engine.store().read(&tenant, &session_id, 0).await?;
        let result = RunResult::from_events(run_id, &run.events)
            .map_err(|e| LoomError::Invalid(e.to_string()))?;
        let refused = replayed
            .misses
            .into_iter()
            .filter(|m| m.kind == "tool")
            .map(|m| m.detail)
            .collect();
        let state = job.agent.state.fold_window(&run.events).values();
        Ok(Outcome::from_events(&result, &run.events, refused, state))
    }
}

/// The events of the JSONL journal `path`, one a line; the error names the file and line.
fn read_journal(path: &Path) -> Result<Vec<Event>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            Event::from_json(line).map_err(|e| format!("{}:{}: {e}", path.display(), index + 1))
        })
        .collect()
}

/// The names of `agent`'s tools and its sub-agents', with their side effects (what a double
/// may answer).
/// Whether `tool` is named as a tool of one of the sources (MCP servers) of `agent` or of its
/// sub-agents: `<source>__<tool>`.
fn source_tool(agent: &AgentRuntime, tool: &str) -> bool {
    agent.sources.iter().any(|bound| {
        tool.strip_prefix(bound.source.name())
            .and_then(|rest| rest.strip_prefix("__"))
            .is_some_and(|rest| !rest.is_empty())
    }) || agent
        .subagents
        .iter()
        .any(|sub| source_tool(&sub.agent, tool))
}

fn collect_tools(agent: &AgentRuntime, names: &mut Vec<(String, SideEffects)>) {
    for bound in &agent.tools {
        let name = bound.tool.spec().name.clone();
        if !names.iter().any(|(n, _)| *n == name) {
            names.push((name, bound.declarations.side_effects));
        }
    }
    for sub in &agent.subagents {
        collect_tools(&sub.agent, names);
    }
}

/// The indexes of `all` named in `wanted` (all of them when `wanted` is empty), in the order of
/// `all`; an unknown name is refused.
fn select<'a>(
    all: impl Iterator<Item = &'a str>,
    wanted: &[String],
    what: &str,
) -> Result<Vec<usize>, LoomError> {
    let all: Vec<&str> = all.collect();
    if let Some(unknown) = wanted.iter().find(|w| !all.contains(&w.as_str())) {
        return Err(LoomError::Invalid(format!(
            "the suite has no {what} '{unknown}' (its {what}s: {})",
            all.join(", ")
        )));
    }
    Ok((0..all.len())
        .filter(|&i| wanted.is_empty() || all.get(i).is_some_and(|n| wanted.iter().any(|w| w == n)))
        .collect())
}
