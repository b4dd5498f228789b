//! Evaluations ([`Loom::eval`]): each case of a suite under each variant, `repeat` times, each
//! run in its own scratch memory journal, with the agent's side-effect tools answered by the
//! suite's doubles (`loom_engine::replay::doubled`), scored by `crate::eval`. A case that
//! replays a recorded conversation (a journal file, each file a glob matches, or a run of the
//! journal) is re-driven as a variant replay (`loom_engine::replay::replay_variant`), the
//! suite's doubles given to the plan.
//!
//! The suite's `config` and a variant's `config` open another configuration (its agent, models
//! and prompts; the registered code of this instance shared with it); each case runs under its
//! `tenant` (else the suite's). An approval a run asks for is decided at once, inline: granted
//! when the call is answered by a double (nothing runs for real), refused when the tool would
//! really run (in a replayed case, a request the journal recorded a decision for gets it
//! again; the others are decided the same way, `VariantPlan::approvals`).

use std::{collections::BTreeMap, path::Path, sync::Arc};

use futures_util::StreamExt;
use loom_core::{
    Event, Message, Payload,
    approval::{Approver, Decision, PendingApproval},
    tool::{SideEffects, Tool, ToolOutput},
};
use loom_engine::{
    AgentRuntime, Attachment, BeginRun, Cancel, JudgeMode, JudgeRuntime, ModelBinding,
    replay::{Recording, VariantPlan, doubled},
};
use serde_json::Value;

use super::Loom;
use crate::{
    LoomError, RunResult,
    eval::{EVAL_JUDGE, EvalReport, EvalRun, Outcome, Suite, VariantSpec},
};

/// Who decides an evaluation's approvals, as the journal names them.
pub const EVAL_APPROVER: &str = "loom eval";

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
    /// Which of the case's recorded conversations it replays (0 for a message).
    trial: usize,
    tenant: String,
    variant: VariantSpec,
    agent: AgentRuntime,
    /// The models the variant names, by step (a replayed case makes their calls for real).
    steps: BTreeMap<String, ModelBinding>,
    /// The instance of the variant's configuration.
    loom: Loom,
}

/// Where a case's conversation comes from, read before any run.
enum Source {
    /// A new message, with its attachments and the state the run opens with.
    Message {
        input: String,
        attachments: Vec<Attachment>,
        state: serde_json::Map<String, Value>,
    },
    /// Recorded conversations: one, or one per file a glob matched.
    Replay(Vec<Trial>),
}

/// A recorded run a case replays.
struct Trial {
    session: Vec<Event>,
    run_id: String,
    /// The journal file it was read from, as the suite names it (none: this instance's journal).
    file: Option<String>,
}

/// A variant as applied: its instance, its agent under each tenant, its named models.
struct Applied {
    loom: Loom,
    /// The agent with the variant's changes and the models it names by step, by tenant.
    agents: BTreeMap<String, (AgentRuntime, BTreeMap<String, ModelBinding>)>,
}

impl Loom {
    /// Runs `suite` against this configuration's agent (or the configuration the suite's
    /// `config` names): every selected case under every selected variant, as many times as its
    /// `repeat` (and once per journal file its `replay` glob matches), each run in a scratch
    /// memory journal of its own (no journal is ever written), up to `options.concurrency` at
    /// once, and scores each run. A variant with a `config` runs the agent as that file
    /// declares it, this instance's registered tools, policies and conditions shared with it.
    /// Each case runs under its `tenant`, else the suite's, else `default`.
    ///
    /// The agent's tools whose `side_effects` is not `none` never run: they are answered by the
    /// suite's `doubles`, and a call of one without a double gets an error result and fails
    /// its case. An approval a run asks for is decided at once ([`EVAL_APPROVER`]): granted for
    /// a tool with side effects (a double answers it: nothing runs for real), refused for a
    /// tool that would really run. A case that `replay`s a recorded run re-drives its
    /// conversation as a variant replay: the variant's models (every call made for real when
    /// the variant names one; otherwise a request the journal recorded is answered from it),
    /// tool calls answered from the journal, else by the doubles, else run only when the tool
    /// has no side effects; the approvals the journal recorded are decided again as recorded,
    /// any other the same way as for a message (a call whose result the journal holds is
    /// answered from it: granted).
    /// `progress` is told of each run as it ends.
    ///
    /// Refused before any run ([`LoomError::Config`], located in the suite file): a
    /// configuration that cannot be opened, an unknown agent, tenant, model, step, case or
    /// variant named by the suite or the options, a double for a tool the agent does not have,
    /// an attachment that cannot be read or is refused, a journal to replay that cannot be
    /// read, holds no closed run, or whose run is another agent's or tenant's, a glob that
    /// matches no file. The tools of MCP servers are held back the same way once the server
    /// lists them (a double may name one, `<server>__<tool>`). A run that cannot be played is
    /// an [`EvalRun`] with its `error`.
    pub async fn eval(
        &self,
        suite: &Suite,
        options: &EvalOptions,
        progress: &(dyn Fn(&EvalRun) + Sync),
    ) -> Result<EvalReport, LoomError> {
        let base = match suite.config_path() {
            Some(path) => self.configured(suite, &path, "config").await?,
            None => self.clone(),
        };
        base.eval_on(suite, options, progress).await
    }

    /// [`Loom::eval`] once the suite's configuration is this instance's.
    async fn eval_on(
        &self,
        suite: &Suite,
        options: &EvalOptions,
        progress: &(dyn Fn(&EvalRun) + Sync),
    ) -> Result<EvalReport, LoomError> {
        let cases = select(
            suite.spec.cases.iter().map(|c| c.name.as_str()),
            &options.cases,
            "case",
        )?;
        let all_variants = suite.variants();
        let variants = select(
            all_variants.iter().map(|v| v.name.as_str()),
            &options.variants,
            "variant",
        )?;
        let mut tenants: Vec<String> = Vec::new();
        for &case in &cases {
            let tenant = self.tenant_of(suite, case)?;
            if !tenants.contains(&tenant) {
                tenants.push(tenant);
            }
        }
        let mut sources = BTreeMap::new();
        for &case in &cases {
            let tenant = self.tenant_of(suite, case)?;
            sources.insert(case, self.source(suite, &tenant, case).await?);
        }
        let mut doubles = None;
        let mut jobs = Vec::new();
        for &v in &variants {
            let Some(variant) = all_variants.get(v) else {
                continue;
            };
            let applied = self.apply(suite, v, variant, &tenants).await?;
            for (agent, _) in applied.agents.values() {
                let checked = self.doubles(suite, agent)?;
                doubles.get_or_insert(checked);
            }
            for &case in &cases {
                let tenant = self.tenant_of(suite, case)?;
                let Some((mut agent, steps)) = applied.agents.get(&tenant).cloned() else {
                    continue;
                };
                self.add_eval_judge(suite, &applied.loom, v, case, &mut agent)?;
                let trials = match sources.get(&case) {
                    Some(Source::Replay(trials)) => trials.len(),
                    _ => 1,
                };
                let mut attempt = 0;
                for trial in 0..trials {
                    for _ in 0..suite.repeat(case) {
                        attempt += 1;
                        jobs.push(Job {
                            case,
                            attempt,
                            trial,
                            tenant: tenant.clone(),
                            variant: variant.clone(),
                            agent: agent.clone(),
                            steps: steps.clone(),
                            loom: applied.loom.clone(),
                        });
                    }
                }
            }
        }
        let doubles = doubles.unwrap_or_default();
        let (doubles, sources) = (&doubles, &sources);
        let runs: Vec<EvalRun> = futures_util::stream::iter(jobs)
            .map(|job| async move {
                let run = self.eval_run(suite, doubles, sources, job).await;
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

    /// The instance of the configuration file `path` that `key` of the suite names: this one
    /// when it is the same file, else the file opened (as `loom` opens any, its profile this
    /// instance's) with this instance's registered code shared with it.
    async fn configured(&self, suite: &Suite, path: &Path, key: &str) -> Result<Loom, LoomError> {
        let same = match (path.canonicalize(), self.config().file().canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if same {
            return Ok(self.clone());
        }
        if !path.is_file() {
            return Err(suite.error_at(
                key,
                format!("{}: no such configuration file", path.display()),
            ));
        }
        let options = loom_config::LoadOptions {
            profile: self.config().profile(),
            env_file: loom_config::EnvFile::Beside,
        };
        let loom = Loom::open_config_with(path, &options)
            .await
            .map_err(|e| suite.error_at(key, e.to_string()))?;
        self.share_registrations(&loom)?;
        Ok(loom)
    }

    /// The tenant case `index` runs under, checked to be declared.
    fn tenant_of(&self, suite: &Suite, index: usize) -> Result<String, LoomError> {
        let (tenant, key) = suite.tenant(index);
        self.config()
            .check_tenant(tenant)
            .map_err(|e| suite.error_at(key.as_deref().unwrap_or("agent"), e.to_string()))?;
        Ok(tenant.to_owned())
    }

    /// Variant `v` applied: its configuration opened, the suite's agent resolved under each of
    /// `tenants` and changed as the variant says.
    async fn apply(
        &self,
        suite: &Suite,
        v: usize,
        variant: &VariantSpec,
        tenants: &[String],
    ) -> Result<Applied, LoomError> {
        let at = |key: &str| format!("variants[{v}].{key}");
        let (loom, agent_key) = match &variant.config {
            Some(config) => {
                let path = suite.dir.join(config);
                (
                    self.configured(suite, &path, &at("config")).await?,
                    at("config"),
                )
            }
            None => (self.clone(), "agent".to_owned()),
        };
        let mut agents = BTreeMap::new();
        for tenant in tenants {
            if variant.config.is_some() {
                loom.config()
                    .check_tenant(tenant)
                    .map_err(|e| suite.error_at(&agent_key, e.to_string()))?;
            }
            let base = loom.agent(&suite.spec.agent, tenant).map_err(|e| match e {
                LoomError::UnknownAgent { .. } => suite.error_at(&agent_key, e.to_string()),
                other => other,
            })?;
            let mut agent = (*base).clone();
            if let Some(model) = &variant.model {
                agent.main = loom.model_of(suite, tenant, model, &at("model"))?;
            }
            if let Some(system) = &variant.system {
                agent.system = system.clone();
            }
            if !variant.params.is_empty() {
                let params = Arc::make_mut(&mut agent.main.params);
                for (key, value) in &variant.params {
                    params.insert(key.clone(), value.clone());
                }
            }
            let mut steps = BTreeMap::new();
            if variant.model.is_some() {
                steps.insert("main".to_owned(), agent.main.clone());
            }
            for (step, model) in &variant.models {
                let key = at(&format!("models.{step}"));
                let binding = loom.model_of(suite, tenant, model, &key)?;
                set_step(&mut agent, step, binding.clone()).map_err(|known| {
                    suite.error_at(
                        &key,
                        format!(
                            "agent '{}' has no step '{step}' (its steps: {known})",
                            agent.name
                        ),
                    )
                })?;
                steps.insert(step.clone(), binding);
            }
            agents.insert(tenant.clone(), (agent, steps));
        }
        Ok(Applied { loom, agents })
    }

    /// Adds the suite's judge to `agent` for the criteria of case `case` (none: nothing).
    fn add_eval_judge(
        &self,
        suite: &Suite,
        loom: &Loom,
        v: usize,
        case: usize,
        agent: &mut AgentRuntime,
    ) -> Result<(), LoomError> {
        let Some(judge) = &suite.spec.judge else {
            return Ok(());
        };
        let criteria = suite.criteria(case);
        if criteria.is_empty() {
            return Ok(());
        }
        let tenant = self.tenant_of(suite, case)?;
        let key = if suite
            .spec
            .variants
            .get(v)
            .and_then(|s| s.config.as_ref())
            .is_some()
        {
            format!("variants[{v}].config")
        } else {
            "judge.model".to_owned()
        };
        let model = loom.model_of(suite, &tenant, &judge.model, &key)?;
        let runtime = JudgeRuntime::new(EVAL_JUDGE, model, criteria)
            .map_err(|e| suite.error_at(&format!("cases[{case}].criteria"), e.to_string()))?;
        agent.judges.push(runtime);
        Ok(())
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

    /// The recorded runs case `index` replays: the last closed root run of a JSONL journal
    /// file next to the suite, of each file a glob matches (in path order), else the run of
    /// this configuration's journal with that id. Each must be a run of the suite's agent and
    /// of the case's tenant.
    async fn replayed(
        &self,
        suite: &Suite,
        tenant: &str,
        index: usize,
        reference: &str,
    ) -> Result<Source, LoomError> {
        let key = format!("cases[{index}].replay");
        if crate::eval::glob::is_glob(reference) {
            let files = crate::eval::glob::files(&suite.dir, reference)
                .map_err(|m| suite.error_at(&key, m))?;
            if files.is_empty() {
                return Err(suite.error_at(
                    &key,
                    format!(
                        "'{reference}' matches no journal file (looked under {})",
                        suite.dir.display()
                    ),
                ));
            }
            let mut trials = Vec::with_capacity(files.len());
            for path in files {
                let trial = journal_trial(suite, &key, &path)?;
                check_trial(suite, &key, tenant, &trial)?;
                trials.push(trial);
            }
            return Ok(Source::Replay(trials));
        }
        let path = suite.dir.join(reference);
        let trial = if path.is_file() {
            journal_trial(suite, &key, &path)?
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
            Trial {
                session: self.export_run(&run).await?,
                run_id: reference.to_owned(),
                file: None,
            }
        };
        check_trial(suite, &key, tenant, &trial)?;
        Ok(Source::Replay(vec![trial]))
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
            tenant: job.tenant.clone(),
            journal: None,
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
                self.play(doubles, &job, message, &mut run).await
            }
            Some(Source::Replay(trials)) => match trials.get(job.trial) {
                Some(trial) => {
                    run.journal = trial.file.clone();
                    self.play_replay(doubles, &job, trial, &mut run).await
                }
                None => Err(LoomError::Invalid(format!(
                    "no trial {} of case {}",
                    job.trial, job.case
                ))),
            },
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
    /// `doubles`, in a scratch journal of the variant's instance, its approvals decided by
    /// [`EvalApprover`].
    async fn play(
        &self,
        doubles: &[(String, ToolOutput)],
        job: &Job,
        (input, attachments, state): (&str, &[Attachment], &serde_json::Map<String, Value>),
        run: &mut EvalRun,
    ) -> Result<Outcome, LoomError> {
        let book = Arc::new(Recording::from_doubles(doubles.iter().cloned()));
        let agent = doubled(&job.agent, &book)?;
        let engine = job.loom.scratch_engine();
        let begin = BeginRun {
            tenant_id: job.tenant.clone(),
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
        let mut tools = Vec::new();
        collect_tools(&job.agent, &mut tools);
        let approver: Arc<dyn Approver> = Arc::new(EvalApprover { tools });
        let driven = engine
            .drive_with(&opened, &agent, &(), Cancel::new(), Some(approver))
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

    /// Replays the recorded run of `trial` as the variant of `job`: the models the variant
    /// names for their steps (every call made for real), `doubles` answering the side-effect
    /// tools the journal has no result for.
    async fn play_replay(
        &self,
        doubles: &[(String, ToolOutput)],
        job: &Job,
        trial: &Trial,
        run: &mut EvalRun,
    ) -> Result<Outcome, LoomError> {
        let mut plan = VariantPlan {
            models: job.steps.clone(),
            approvals: Some(EVAL_APPROVER.to_owned()),
            ..VariantPlan::default()
        };
        for (tool, output) in doubles {
            let double: Arc<dyn Tool> =
                Arc::new(crate::testing::ToolDouble::returning(tool, output.clone()));
            plan.doubles.insert(tool.clone(), double);
        }
        let engine = job.loom.scratch_engine();
        let run_id = &trial.run_id;
        let replayed = loom_engine::replay::replay_variant(
            &engine,
            &job.agent,
            &plan,
            &trial.session,
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

/// Decides an evaluation's approvals at once: a call of a tool with side effects is granted (a
/// double answers it, or it is refused for want of one: nothing runs for real); a call of any
/// other tool (one that declares no side effect, a sub-agent) is refused, since it would really
/// run.
#[derive(Debug)]
struct EvalApprover {
    /// The agent's tools and its sub-agents', with their side effects.
    tools: Vec<(String, SideEffects)>,
}

impl Approver for EvalApprover {
    fn decide(&self, pending: PendingApproval) -> loom_core::BoxFuture<'_, Decision> {
        let doubled = self
            .tools
            .iter()
            .any(|(name, effects)| *name == pending.tool_name && *effects != SideEffects::None);
        let decision = if doubled {
            Decision::Approved {
                by: EVAL_APPROVER.to_owned(),
                reason: Some(
                    "evaluation: the call is answered by a double, nothing runs for real".into(),
                ),
                arguments: None,
            }
        } else {
            Decision::Rejected {
                by: EVAL_APPROVER.to_owned(),
                reason: Some(format!(
                    "evaluation: '{}' would really run (no double answers it), so its \
                     approval is refused",
                    pending.tool_name
                )),
            }
        };
        Box::pin(std::future::ready(decision))
    }
}

/// Puts `model` (alone, without fallbacks) on `step` of `agent`: `main`, a role's name, or
/// `judge:<name>`. An unknown step is refused with the agent's steps, comma-separated.
fn set_step(agent: &mut AgentRuntime, step: &str, model: ModelBinding) -> Result<(), String> {
    if step == "main" {
        agent.main = model;
        agent.fallbacks.clear();
        return Ok(());
    }
    if let Some(role) = agent.roles.iter_mut().find(|r| r.name == step) {
        role.main = model;
        role.fallbacks.clear();
        return Ok(());
    }
    if let Some(name) = step.strip_prefix("judge:")
        && let Some(judge) = agent.judges.iter_mut().find(|j| j.name == name)
    {
        judge.main = model;
        judge.fallbacks.clear();
        return Ok(());
    }
    let mut known = vec!["main".to_owned()];
    known.extend(agent.roles.iter().map(|r| r.name.clone()));
    known.extend(agent.judges.iter().map(|j| format!("judge:{}", j.name)));
    Err(known.join(", "))
}

/// The last closed root run of the JSONL journal file `path`, to replay; an error located at
/// `key` of the suite when it cannot be read or holds none.
fn journal_trial(suite: &Suite, key: &str, path: &Path) -> Result<Trial, LoomError> {
    let session = read_journal(path).map_err(|m| suite.error_at(key, m))?;
    let run_id = Loom::closed_root_runs(&session).pop().ok_or_else(|| {
        suite.error_at(
            key,
            format!("{}: the file holds no closed run to replay", path.display()),
        )
    })?;
    let file = path
        .strip_prefix(&suite.dir)
        .unwrap_or(path)
        .display()
        .to_string();
    Ok(Trial {
        session,
        run_id,
        file: Some(file),
    })
}

/// Refuses a recorded run that is not a conversation of the suite's agent under `tenant`.
fn check_trial(suite: &Suite, key: &str, tenant: &str, trial: &Trial) -> Result<(), LoomError> {
    let run_id = &trial.run_id;
    let whose = match &trial.file {
        Some(file) => format!("run {run_id} ({file})"),
        None => format!("run {run_id}"),
    };
    let start = trial
        .session
        .iter()
        .find(|e| e.run_id == *run_id && matches!(e.payload, Payload::RunStarted(_)))
        .ok_or_else(|| suite.error_at(key, format!("{whose} has no run.started")))?;
    let agent = start.agent.as_deref().unwrap_or_default();
    if agent != suite.spec.agent {
        return Err(suite.error_at(
            key,
            format!(
                "{whose} is a conversation of agent '{agent}', not of '{}'",
                suite.spec.agent
            ),
        ));
    }
    if start.tenant_id != tenant {
        return Err(suite.error_at(
            key,
            format!(
                "{whose} belongs to tenant '{}', the case's runs to '{tenant}'",
                start.tenant_id
            ),
        ));
    }
    Ok(())
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
