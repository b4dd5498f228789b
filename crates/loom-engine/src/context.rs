//! What a role or a judge receives besides its own input: the items its `context:` declares
//! ([`RoleContext`]), gathered from the run and, for the items that need earlier runs, from the
//! session's journal. The items mean the same for a role as for a judge, and are read the same
//! way.

use std::collections::{BTreeMap, BTreeSet};

use loom_core::{
    Block, BlockKind, Event, Message, Role, RunState, event::Payload, event::RunContext,
    ports::EventStore, state::SessionState,
};
use serde_json::{Value, json};

use crate::{error::EngineError, events::RunRef};

/// Where `tool_results` are taken from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ContextScope {
    /// The current run.
    #[default]
    Run,
    /// Every run of the session so far, the current one included.
    Session,
}

/// One item of what a role receives besides its arguments (`context:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoleContext {
    /// The text of the run's first user message.
    UserInput,
    /// What the application said about the run when opening it (`run.started.context`:
    /// tenant, user and metadata, as JSON).
    CallerContext,
    /// The images attached to the run's user messages.
    Attachments,
    /// The successful results of the named tools.
    ToolResults {
        /// Tool names as the orchestrator sees them.
        tools: Vec<String>,
        /// This run, or the whole session.
        scope: ContextScope,
    },
    /// The last N turns of the session before this run (one turn = one run: its request and
    /// its final answer).
    LastTurns(u32),
    /// The session state: every key (`None`) or these keys, as compact JSON sorted by key.
    SessionState(Option<Vec<String>>),
    /// The summary of the session's latest compaction applied to this run's history (written
    /// before the run began), empty when there is none.
    SessionSummary,
}

impl RoleContext {
    /// The item's name, as a tag and as a key under `context` in a template.
    pub fn key(&self) -> &'static str {
        match self {
            RoleContext::UserInput => "user_input",
            RoleContext::CallerContext => "caller_context",
            RoleContext::Attachments => "attachments",
            RoleContext::ToolResults { .. } => "tool_results",
            RoleContext::LastTurns(_) => "last_turns",
            RoleContext::SessionState(_) => "session_state",
            RoleContext::SessionSummary => "session_summary",
        }
    }
}

/// The images of the run's user messages (artifact blocks of an `image/*` type).
pub(crate) fn images(state: &RunState) -> Vec<Block> {
    state
        .messages
        .iter()
        .filter(|m| m.role == Role::User)
        .flat_map(|m| m.blocks.iter())
        .filter(|b| matches!(&b.kind, BlockKind::Artifact { media_type, .. } if media_type.starts_with("image/")))
        .cloned()
        .collect()
}

/// The tools that have at least one successful result in `messages` (one run's
/// conversation): what a `tool_results` item can give.
pub(crate) fn succeeded<'m>(messages: impl Iterator<Item = &'m Message>) -> BTreeSet<String> {
    let mut names: BTreeMap<&str, &str> = BTreeMap::new();
    let mut found = BTreeSet::new();
    for message in messages {
        names.extend(
            message
                .tool_calls()
                .map(|(call_id, name, _)| (call_id, name)),
        );
        for block in &message.blocks {
            if let BlockKind::ToolResult { call_id, output } = &block.kind
                && !output.is_error
                && let Some(name) = names.get(call_id.as_str())
            {
                found.insert((*name).to_owned());
            }
        }
    }
    found
}

/// The successful results of `tools` in one run's `messages` (text, `full` never included).
fn results_of<'m>(
    messages: impl Iterator<Item = &'m Message>,
    tools: &[String],
) -> Vec<(String, String)> {
    let mut names: BTreeMap<&str, &str> = BTreeMap::new();
    let mut found = Vec::new();
    for message in messages {
        names.extend(
            message
                .tool_calls()
                .map(|(call_id, name, _)| (call_id, name)),
        );
        for block in &message.blocks {
            if let BlockKind::ToolResult { call_id, output } = &block.kind
                && !output.is_error
                && let Some(name) = names.get(call_id.as_str())
                && tools.iter().any(|t| t == name)
            {
                found.push(((*name).to_owned(), output.visible_text()));
            }
        }
    }
    found
}

/// What a role receives, computed from the run (only the declared items).
pub(crate) struct Gathered {
    /// Template values under `context`.
    pub(crate) values: BTreeMap<String, Value>,
    /// Tagged blocks (`<tag>\nbody\n</tag>`), in declared order.
    pub(crate) blocks: Vec<String>,
    /// Images added to the role's message.
    pub(crate) images: Vec<Block>,
}

/// What the declared `context` items give a role or a judge: tagged blocks, template values
/// and images. The session journal is read only when an item needs earlier runs;
/// `session_state` is the session's state as the pilot holds it (a judge reads none).
pub(crate) async fn gather(
    store: &dyn EventStore,
    run: &RunRef,
    state: &RunState,
    context: &[RoleContext],
    session_state: Option<&SessionState>,
) -> Result<Gathered, EngineError> {
    let mut gathered = Gathered {
        values: BTreeMap::new(),
        blocks: Vec::new(),
        images: Vec::new(),
    };
    // Earlier runs of the session, read only when an item needs them, and only as far back
    // as it needs.
    let needs_session = context.iter().any(|c| {
        matches!(
            c,
            RoleContext::LastTurns(_)
                | RoleContext::SessionSummary
                | RoleContext::CallerContext
                | RoleContext::ToolResults {
                    scope: ContextScope::Session,
                    ..
                }
        )
    });
    let earlier = context.iter().fold(Earlier::Last(0), |wanted, c| match c {
        RoleContext::ToolResults {
            scope: ContextScope::Session,
            ..
        } => Earlier::All,
        RoleContext::LastTurns(n) => wanted.max(Earlier::Last(*n)),
        _ => wanted,
    });
    let session = if needs_session {
        Some(session(store, run, earlier).await?)
    } else {
        None
    };
    let tagged = |tag: &str, body: &str| format!("<{tag}>\n{body}\n</{tag}>");
    for item in context {
        let key = item.key();
        match item {
            RoleContext::UserInput => {
                let text = user_input(state);
                gathered.blocks.push(tagged(key, &text));
                gathered.values.insert(key.into(), Value::String(text));
            }
            RoleContext::CallerContext => {
                let context = session
                    .as_ref()
                    .and_then(|s| s.context.as_ref())
                    .and_then(|c| serde_json::to_value(c).ok())
                    .unwrap_or_else(|| json!({}));
                gathered.blocks.push(tagged(key, &context.to_string()));
                gathered.values.insert(key.into(), context);
            }
            RoleContext::Attachments => {
                let images = images(state);
                let listed: Vec<Value> = images
                    .iter()
                    .filter_map(|b| match &b.kind {
                        BlockKind::Artifact {
                            uri,
                            media_type,
                            name,
                            ..
                        } => Some(json!({"name": name, "media_type": media_type, "uri": uri})),
                        _ => None,
                    })
                    .collect();
                let lines: Vec<String> = listed
                    .iter()
                    .map(|i| {
                        format!(
                            "- {} ({})",
                            i["name"].as_str().unwrap_or("unnamed"),
                            i["media_type"].as_str().unwrap_or_default()
                        )
                    })
                    .collect();
                gathered
                    .blocks
                    .push(tagged(key, &or_none(lines.join("\n"))));
                gathered.values.insert(key.into(), Value::Array(listed));
                gathered.images = images;
            }
            RoleContext::ToolResults { tools, scope } => {
                let mut found = Vec::new();
                if *scope == ContextScope::Session
                    && let Some(session) = &session
                {
                    for earlier in &session.earlier {
                        found.extend(results_of(earlier.messages.iter(), tools));
                    }
                }
                found.extend(results_of(state.messages.iter(), tools));
                let lines: Vec<String> = found
                    .iter()
                    .map(|(tool, text)| format!("{tool}: {text}"))
                    .collect();
                gathered
                    .blocks
                    .push(tagged(key, &or_none(lines.join("\n"))));
                let mut by_tool = serde_json::Map::new();
                for tool in tools {
                    let texts: Vec<&str> = found
                        .iter()
                        .filter(|(t, _)| t == tool)
                        .map(|(_, text)| text.as_str())
                        .collect();
                    by_tool.insert(tool.clone(), Value::String(texts.join("\n\n")));
                }
                gathered.values.insert(key.into(), Value::Object(by_tool));
            }
            RoleContext::SessionState(keys) => {
                let values: serde_json::Map<String, Value> = session_state
                    .map(SessionState::values)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(k, _)| keys.as_ref().is_none_or(|keys| keys.contains(k)))
                    .collect();
                let sorted: BTreeMap<&String, &Value> = values.iter().collect();
                let json = serde_json::to_string(&sorted).unwrap_or_else(|_| "{}".into());
                gathered.blocks.push(tagged(key, &json));
                gathered.values.insert(key.into(), Value::Object(values));
            }
            RoleContext::SessionSummary => {
                let summary = session
                    .as_ref()
                    .and_then(|s| s.summary.clone())
                    .unwrap_or_default();
                gathered.blocks.push(tagged(key, &or_none(summary.clone())));
                gathered.values.insert(key.into(), Value::String(summary));
            }
            RoleContext::LastTurns(n) => {
                let earlier = session.as_ref().map_or(&[][..], |s| &s.earlier[..]);
                let turns = last_turns(earlier, *n);
                gathered.blocks.push(tagged(key, &or_none(turns.clone())));
                gathered.values.insert(key.into(), Value::String(turns));
            }
        }
    }
    Ok(gathered)
}

/// Which earlier root runs of the session a context needs folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Earlier {
    /// The last `n` of them (`last_turns: n`; 0: none).
    Last(u32),
    /// All of them (`tool_results` of the whole session).
    All,
}

/// Events read back from the run's start at first, per earlier run wanted.
const EVENTS_PER_RUN: u64 = 64;

/// The session as a judge's (or a role's) context sees it: the application's context of
/// this run, the summary of the latest compaction before it, and the `earlier` root runs,
/// folded. Unless every earlier run is wanted, the session is not read whole: the run's
/// start comes from the store's run index (`run_start`), the summary from its type index
/// (`last_of_type`), and the last runs from stretches read back from the run's start that
/// grow fourfold until they hold enough of them.
pub(crate) async fn session(
    store: &dyn EventStore,
    run: &RunRef,
    earlier: Earlier,
) -> Result<Session, EngineError> {
    let (tenant, session) = (run.tenant_id.as_str(), run.session_id.as_str());
    let start = match earlier {
        Earlier::All => None,
        Earlier::Last(_) => store.run_start(tenant, session, &run.run_id).await?,
    };
    let Some(start) = start else {
        let events = store.read(tenant, session, 0).await?;
        return session_of(&events, &run.run_id);
    };
    let wanted = match earlier {
        Earlier::Last(n) => usize::try_from(n).unwrap_or(usize::MAX),
        Earlier::All => usize::MAX,
    };
    let mut span = (wanted as u64).saturating_mul(EVENTS_PER_RUN);
    let mut found = loop {
        let after = start.saturating_sub(1).saturating_sub(span);
        let events = store.read(tenant, session, after).await?;
        let mut found = session_of(&events, &run.run_id)?;
        if found.context.is_none() {
            // The index pointed elsewhere (a hint, never the truth): read the session whole.
            let events = store.read(tenant, session, 0).await?;
            return session_of(&events, &run.run_id);
        }
        if after == 0 || found.earlier.len() >= wanted {
            let skip = found.earlier.len().saturating_sub(wanted);
            found.earlier.drain(..skip);
            break found;
        }
        span = span.saturating_mul(4);
    };
    if found.summary.is_none()
        && let Some(event) = store
            .last_of_type(tenant, session, "session.compacted", start)
            .await?
        && let Payload::SessionCompacted(compacted) = event.payload
    {
        found.summary = Some(compacted.summary);
    }
    Ok(found)
}

/// [`session`] from the session's events (in seq order) already read.
pub(crate) fn session_of<E: std::borrow::Borrow<Event>>(
    events: &[E],
    run_id: &str,
) -> Result<Session, EngineError> {
    let events: Vec<&Event> = events.iter().map(std::borrow::Borrow::borrow).collect();
    let start = events
        .iter()
        .position(|e| e.run_id == run_id)
        .unwrap_or(events.len());
    let context = events.get(start).and_then(|e| match &e.payload {
        Payload::RunStarted(started) => Some(started.context.clone()),
        _ => None,
    });
    let before = &events[..start];
    // Each earlier root run folded from its own events, grouped in one pass.
    let mut roots: Vec<&str> = Vec::new();
    let mut by_run: BTreeMap<&str, Vec<&Event>> = BTreeMap::new();
    for &event in before {
        if let Payload::RunStarted(started) = &event.payload
            && started.parent_run_id.is_none()
            && started.kind == "normal"
            && !by_run.contains_key(event.run_id.as_str())
        {
            roots.push(&event.run_id);
            by_run.insert(&event.run_id, Vec::new());
        }
        if let Some(events) = by_run.get_mut(event.run_id.as_str()) {
            events.push(event);
        }
    }
    let mut earlier = Vec::with_capacity(roots.len());
    for root in roots {
        earlier.push(RunState::fold(
            root,
            by_run.remove(root).unwrap_or_default(),
        )?);
    }
    let summary =
        loom_core::state::compaction::latest_compaction(before).map(|c| c.summary.clone());
    Ok(Session {
        context,
        earlier,
        summary,
    })
}

/// What the session gives a judge's (or a role's) context.
pub(crate) struct Session {
    /// `run.started.context` of the current run.
    pub(crate) context: Option<RunContext>,
    /// Earlier root runs of the session, in order.
    pub(crate) earlier: Vec<RunState>,
    /// The summary of the latest compaction written before the run began.
    pub(crate) summary: Option<String>,
}

/// The last `n` turns of `earlier` runs (one turn = one run): `user: <request>`, then
/// `assistant: <final answer>` when it has one.
pub(crate) fn last_turns(earlier: &[RunState], n: u32) -> String {
    let skip = earlier
        .len()
        .saturating_sub(usize::try_from(n).unwrap_or(usize::MAX));
    let mut lines = Vec::new();
    for run in &earlier[skip..] {
        lines.push(format!("user: {}", user_input(run)));
        if let Some(answer) = run.output_text() {
            lines.push(format!("assistant: {answer}"));
        }
    }
    lines.join("\n")
}

/// The text of the request that opened a run (its first user message).
pub(crate) fn user_input(state: &RunState) -> String {
    state
        .messages
        .iter()
        .find(|m| m.role == loom_core::Role::User)
        .map(Message::text)
        .unwrap_or_default()
}

/// `text`, or `(none)` when it is empty.
pub(crate) fn or_none(text: String) -> String {
    if text.is_empty() {
        "(none)".into()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use loom_journal::MemoryStore;
    use loom_testkit::{
        CountingStore,
        conformance::{event, started},
    };
    use serde_json::Map;

    use super::*;

    /// 200 root runs of 10 events each, then the run `now`: a session of 2,001 events.
    async fn long_session() -> CountingStore<MemoryStore> {
        let store = CountingStore::new(MemoryStore::new());
        for run in 0..200u64 {
            let run_id = format!("old-{run}");
            let mut batch = vec![started("t", "s", &run_id, Map::new())];
            batch.extend((1..10).map(|i| {
                let mut e = event("t", "s", &format!("{run}-{i}"));
                e.run_id = run_id.clone();
                e.root_run_id = run_id.clone();
                e
            }));
            store.inner.append(batch, run * 10).await.unwrap();
        }
        store
            .inner
            .append(vec![started("t", "s", "now", Map::new())], 2_000)
            .await
            .unwrap();
        store
    }

    fn now() -> RunRef {
        RunRef {
            tenant_id: "t".into(),
            session_id: "s".into(),
            run_id: "now".into(),
        }
    }

    #[tokio::test]
    async fn the_last_turns_of_a_long_session_are_read_from_its_end() {
        let store = long_session().await;
        let whole = session_of(&store.inner.read("t", "s", 0).await.unwrap(), "now").unwrap();
        assert_eq!(whole.earlier.len(), 200);

        store.reset();
        let last = session(&store, &now(), Earlier::Last(3)).await.unwrap();
        let ids: Vec<&str> = last.earlier.iter().map(|r| r.run_id.as_str()).collect();
        assert_eq!(ids, ["old-197", "old-198", "old-199"]);
        assert_eq!(last.earlier, whole.earlier[197..]);
        assert_eq!(last.context, whole.context);
        // One stretch of 3 × 64 events before the run, and the run's own event.
        assert_eq!(store.returned(), 193);

        // Only the run's context: its own events.
        store.reset();
        let none = session(&store, &now(), Earlier::Last(0)).await.unwrap();
        assert!(none.earlier.is_empty());
        assert_eq!(none.context, whole.context);
        assert_eq!(store.returned(), 1);

        // Every earlier run: the whole session.
        store.reset();
        let all = session(&store, &now(), Earlier::All).await.unwrap();
        assert_eq!(all.earlier, whole.earlier);
        assert_eq!(store.returned(), 2_001);
    }
}
