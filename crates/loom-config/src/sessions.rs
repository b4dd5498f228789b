//! The file model of `sessions`: how a long session stays cheap to continue (snapshots,
//! compaction, history caps) and the limits of session state. Their rules are checked in
//! `config/sessions.rs`.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `sessions`: what a run of a long session reads and is sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// A `session.snapshot` (the session history projected up to then) is written after a root
    /// run once at least this many events were written since the last one, so that the next
    /// run reads the snapshot and what follows instead of the whole journal.
    #[schemars(range(min = 1))]
    pub snapshot_every: u32,
    /// Older turns are summarized by a model when the history grows past a threshold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionConfig>,
    /// Caps on the history sent to a run, for sessions that do not compact.
    pub history: HistoryCaps,
    /// Limits of session state values.
    pub state: StateLimits,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            snapshot_every: 50,
            compaction: None,
            history: HistoryCaps::default(),
            state: StateLimits::default(),
        }
    }
}

/// `sessions.compaction`: when a session's estimated history passes `over_tokens`, the turns
/// before the last `keep_last` are summarized by `model`, and the summary replaces them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompactionConfig {
    /// The model that writes the summary (a declared model id).
    pub model: String,
    /// Estimated history tokens past which the session is compacted after a run.
    #[serde(default = "default_over_tokens")]
    #[schemars(range(min = 1))]
    pub over_tokens: u64,
    /// Estimated history tokens past which a run compacts before it starts (must be greater
    /// than `over_tokens`).
    #[serde(default = "default_hard_tokens")]
    pub hard_tokens: u64,
    /// Turns kept verbatim after the summary.
    #[serde(default = "default_keep_last")]
    pub keep_last: u32,
    /// Checks that the amounts, dates, references, e-mails and names of the summarized turns
    /// appear in the summary.
    #[serde(default = "yes")]
    pub fidelity_check: bool,
    /// Compacts at the next run's opening instead of in the background after a run.
    #[serde(default)]
    pub blocking: bool,
    /// The summarizer's system prompt, relative to `prompts_dir` (a built-in one otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_file: Option<PathBuf>,
}

fn default_over_tokens() -> u64 {
    12_000
}

fn default_hard_tokens() -> u64 {
    150_000
}

fn default_keep_last() -> u32 {
    6
}

fn yes() -> bool {
    true
}

/// `sessions.history`: the history sent to a run is cut to its last `max_turns` turns and to
/// `max_tokens` estimated tokens (oldest first), a tool call and its result always together.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryCaps {
    /// Earlier turns (root runs) kept at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// Estimated tokens of history kept at most.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_tokens: Option<u64>,
}

/// `sessions.state`: bounds of a session's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct StateLimits {
    /// Bytes of one value's compact JSON at most.
    pub max_value_bytes: u64,
    /// Bytes of the whole state's compact JSON at most.
    pub max_total_bytes: u64,
}

impl Default for StateLimits {
    fn default() -> Self {
        StateLimits {
            max_value_bytes: 1024,
            max_total_bytes: 4096,
        }
    }
}
