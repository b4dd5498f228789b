//! Evaluations ([`Loom::eval`]): each case of a suite under each variant, in its own scratch
//! memory journal, with the agent's side-effect tools answered by the suite's doubles
//! (`loom_engine::replay::doubled`), scored by `crate::eval`.

use std::sync::Arc;

use futures_util::StreamExt;
use loom_core::{
    Message,
    tool::{SideEffects, ToolOutput},
};
use loom_engine::{
    AgentRuntime, BeginRun, Cancel, JudgeMode, JudgeRuntime,
    replay::{Recording, doubled},
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

/// One case under one variant, ready to run.
struct Job {
    case: usize,
    variant: VariantSpec,
    agent: AgentRuntime,
}

impl Loom {
    /// Runs `suite` against this configuration's agent: every selected case under every
    /// selected variant, each in a scratch memory journal of its own (this instance's journal
    /// is never written), up to `options.concurrency` at once, and scores each run. The agent's
    /// tools whose `side_effects` is not `none` never run: they are answered by the suite's
    /// `doubles`, and a call of one without a double gets an error result and fails its case.
    /// `progress` is told of each run as it ends.
    ///
    /// Refused before any run ([`LoomError::Config`], located in the suite file): an unknown
    /// agent, tenant, model, case or variant named by the suite or the options, a double for a
    /// tool the agent does not have, an attachment that cannot be read; an agent that reads
    /// tools from MCP servers is refused too. A run that cannot be played is an [`EvalRun`]
    /// with its `error`.
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
                jobs.push(Job {
                    case,
                    variant: variant.clone(),
                    agent,
                });
            }
        }
        let doubles = &doubles;
        let runs: Vec<EvalRun> = futures_util::stream::iter(jobs)
            .map(|job| async move {
                let run = self.eval_run(suite, tenant, doubles, job).await;
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

    /// Plays one case under one variant in a scratch journal, and scores it.
    async fn eval_run(
        &self,
        suite: &Suite,
        tenant: &str,
        doubles: &[(String, ToolOutput)],
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
            passed: false,
            run_id: None,
            session_id: None,
            status: "error".into(),
            text: String::new(),
            cost_usd: 0.0,
            judge_cost_usd: 0.0,
            checks: Vec::new(),
            error: None,
            events: Vec::new(),
        };
        match self.play(suite, tenant, doubles, &job, &mut run).await {
            Ok(outcome) => {
                run.checks = suite.score(job.case, &outcome);
                run.passed = run.checks.iter().all(|c| c.passed);
                run.status = outcome.status;
                run.text = outcome.text;
                run.cost_usd = outcome.cost_usd;
                run.judge_cost_usd = outcome.judge_cost_usd;
            }
            Err(error) => run.error = Some(error.to_string()),
        }
        run
    }

    async fn play(
        &self,
        suite: &Suite,
        tenant: &str,
        doubles: &[(String, ToolOutput)],
        job: &Job,
        run: &mut EvalRun,
    ) -> Result<Outcome, LoomError> {
        let case = suite
            .spec
            .cases
            .get(job.case)
            .ok_or_else(|| LoomError::Invalid(format!("no case {}", job.case)))?;
        let mut attachments = Vec::with_capacity(case.attachments.len());
        for (index, file) in case.attachments.iter().enumerate() {
            let path = suite.dir.join(file);
            let key = format!("cases[{}].attachments[{index}]", job.case);
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
        let book = Arc::new(Recording::from_doubles(doubles.iter().cloned()));
        let agent = doubled(&job.agent, &book)?;
        let engine = self.scratch_engine();
        let begin = BeginRun {
            tenant_id: tenant.to_owned(),
            session_id: None,
            run_id: None,
            user_id: None,
            metadata: serde_json::Map::new(),
            message: Message::user(case.input.clone()),
            judges: JudgeMode::Auto,
            budget: None,
            attachments,
            trigger: None,
            state: case.state.clone(),
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
        Ok(Outcome::from_events(&result, &run.events, refused))
    }
}

/// The names of `agent`'s tools and its sub-agents', with their side effects (what a double
/// may answer).
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
