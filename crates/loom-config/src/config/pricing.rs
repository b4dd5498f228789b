//! A money budget needs priced models.
//!
//! The cost of a call to a model without `pricing` is 0 $, so a `max_cost` over an agent that
//! calls one counts those calls as free and may never be reached. Every money limit (`max_cost`
//! of `run` and `session`, `max_cost_per_day` and `max_cost_per_month` of `tenant`) is checked
//! against the models of the agents it bounds: the root `budgets` bound every agent, an agent's
//! `budget` its runs and those of its sub-agents (whose cost rolls up into them), a tenant's
//! `budgets` the agents it may run. The models of an agent are those of its orchestrator, its
//! roles and its judges, fallbacks included.
//!
//! As in the reference, this is a setup warning that the `prod` profile makes an error: under
//! `prod` the configuration is refused, located at the money limit and naming the model.

use loom_core::usage::Pricing;

use crate::error::{ConfigError, ConfigErrorKind};
use crate::guards::Budgets;
use crate::model::{AgentSpec, Profile};
use crate::yaml::KeyPath;

use super::Config;

/// A model without pricing called by an agent: `(agent, where the agent names it, model id)`.
struct Unpriced<'c> {
    agent: &'c str,
    slot: String,
    model: &'c str,
}

/// Refuses (under `prod`) or warns about each money limit over an agent calling a model
/// without pricing.
pub(super) fn check_money_budgets(config: &mut Config) -> Result<(), ConfigError> {
    let prod = config.raw.profile == Some(Profile::Prod);
    let mut warnings = Vec::new();
    for (doc, path, budgets, agents) in money_budgets(config) {
        for (key, amount) in money_limits(budgets) {
            if amount.is_none() {
                continue;
            }
            let Some(unpriced) = agents.iter().find_map(|a| unpriced(config, a)) else {
                continue;
            };
            let at = path.join(&KeyPath::parse(key));
            let message = format!(
                "a money budget, but model '{}' ({} of agent '{}') has no pricing: its calls \
                 would count as 0 $ and the budget might never be reached; declare the model's \
                 pricing (models[].pricing, dollars per million tokens)",
                unpriced.model, unpriced.slot, unpriced.agent,
            );
            let doc = &config.docs[doc];
            if prod {
                return Err(doc.error(
                    &at,
                    ConfigErrorKind::Invalid,
                    format!("{message} (refused under the prod profile)"),
                ));
            }
            warnings.push(
                doc.error(
                    &at,
                    ConfigErrorKind::Invalid,
                    format!("{message} (an error under the prod profile)"),
                )
                .to_string(),
            );
        }
    }
    config.warnings.extend(warnings);
    Ok(())
}

/// The money limits of a budgets block, by key path relative to it.
fn money_limits(budgets: &Budgets) -> [(&'static str, Option<f64>); 4] {
    [
        ("run.max_cost", budgets.run.max_cost),
        ("session.max_cost", budgets.session.max_cost),
        ("tenant.max_cost_per_day", budgets.tenant.max_cost_per_day),
        (
            "tenant.max_cost_per_month",
            budgets.tenant.max_cost_per_month,
        ),
    ]
}

/// Every budgets block: its document, its key path, and the agents it bounds.
fn money_budgets(config: &Config) -> Vec<(usize, KeyPath, &Budgets, Vec<&AgentSpec>)> {
    let all: Vec<&AgentSpec> = config.agents.iter().collect();
    let mut blocks = vec![(
        0,
        KeyPath::root().key("budgets"),
        &config.raw.budgets,
        all.clone(),
    )];
    for (i, agent) in config.agents.iter().enumerate() {
        if let Some(budget) = &agent.budget {
            let meta = &config.meta[i];
            blocks.push((
                meta.doc,
                meta.prefix.key("budget"),
                budget,
                with_subagents(config, agent),
            ));
        }
    }
    for (t, tenant) in config.raw.tenants.iter().enumerate() {
        if let Some(budgets) = &tenant.budgets {
            let agents = if tenant.agents.is_empty() {
                all.clone()
            } else {
                tenant
                    .agents
                    .iter()
                    .filter_map(|name| config.agent(name))
                    .collect()
            };
            blocks.push((
                0,
                KeyPath::root().key("tenants").index(t).key("budgets"),
                budgets,
                agents,
            ));
        }
    }
    blocks
}

/// `agent` and the agents it delegates to, transitively, each once.
fn with_subagents<'c>(config: &'c Config, agent: &'c AgentSpec) -> Vec<&'c AgentSpec> {
    let mut found = vec![agent];
    let mut next = 0;
    while let Some(current) = found.get(next).copied() {
        next += 1;
        for sub in &current.subagents {
            if let Some(child) = config.agent(&sub.agent)
                && !found.iter().any(|a| a.name == child.name)
            {
                found.push(child);
            }
        }
    }
    found
}

/// The first model of `agent` without pricing: its orchestrator's, then its roles', then its
/// judges', fallbacks after each main model.
fn unpriced<'c>(config: &'c Config, agent: &'c AgentSpec) -> Option<Unpriced<'c>> {
    let mut models: Vec<(String, &str)> = Vec::new();
    let mut chain = |slot: &str, main: &'c str, fallbacks: &'c [String]| {
        models.push((format!("{slot}.model"), main));
        for (f, id) in fallbacks.iter().enumerate() {
            models.push((format!("{slot}.fallbacks[{f}]"), id.as_str()));
        }
    };
    chain("main", &agent.main.model, &agent.main.fallbacks);
    for (r, role) in agent.roles.iter().enumerate() {
        chain(&format!("roles[{r}]"), &role.model, &role.fallbacks);
        if let Some(judge) = &role.judge {
            chain(&format!("roles[{r}].judge"), &judge.model, &judge.fallbacks);
        }
    }
    if let Some(judge) = &agent.judge {
        chain("judge", &judge.model, &judge.fallbacks);
    }
    models.into_iter().find_map(|(slot, id)| {
        let model = config.model(id)?;
        (model.pricing == Pricing::default()).then_some(Unpriced {
            agent: &agent.name,
            slot,
            model: id,
        })
    })
}
