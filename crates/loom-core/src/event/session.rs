//! The payloads of what is kept beside a session's journal: `artifact.stored` (a file stored
//! beside it) and `session.repaired` (an unreadable line set aside).

use serde::{Deserialize, Serialize};

/// `artifact.stored`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArtifactStored {
    /// `artifact://<tenant>/<session>/<sha256>.<ext>`.
    pub uri: String,
    /// MIME type.
    pub media_type: String,
    /// Bytes.
    pub size: u64,
    /// Display name.
    #[serde(default)]
    pub name: Option<String>,
    /// "attachment", "tool_output" or "offload".
    pub origin: String,
    /// The call that produced it.
    #[serde(default)]
    pub call_id: Option<String>,
}

/// `session.repaired`: a line of the session's journal that could not be read was set aside
/// (its bytes kept in `moved_to`), and this event was written in its place, at its seq, so that
/// the journal reads again. Not in the reference catalogue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRepaired {
    /// Bytes of the line set aside.
    pub bytes: u64,
    /// Why it could not be read.
    pub error: String,
    /// Where its bytes are kept: the side file beside the journal (`<session>.jsonl.corrupt`),
    /// or the SQLite table `set_aside`.
    pub moved_to: String,
    /// Who asked for the repair.
    #[serde(default)]
    pub by: Option<String>,
}
