//! Progress notifications: one per progress event of a run, with the lines `loom run --stream`
//! prints, sent while the agent tool call is in flight when the client gave a progress token.

use std::sync::Mutex;

use loom_ia::{Event, Observer, RunRef, core::event::Payload, progress_line};
use rmcp::{
    Peer, RoleServer,
    model::{ProgressNotificationParam, ProgressToken},
};
use tokio::sync::mpsc;

/// Watches a run for the tool call: remembers the root run (to cancel it when the client
/// cancels the call) and queues the progress lines for [`forward`].
#[derive(Debug)]
pub(crate) struct Progress {
    lines: Option<mpsc::UnboundedSender<String>>,
    /// Whether the lines name content (tool arguments, error texts).
    content: bool,
    root: Mutex<Option<RunRef>>,
}

impl Progress {
    /// A watcher sending its lines to the returned receiver when `notify` (the client asked for
    /// progress); `content` false keeps content out of the lines.
    pub(crate) fn new(notify: bool, content: bool) -> (Progress, mpsc::UnboundedReceiver<String>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let progress = Progress {
            lines: notify.then_some(sender),
            content,
            root: Mutex::new(None),
        };
        (progress, receiver)
    }

    /// The root run, once it started.
    pub(crate) fn root(&self) -> Option<RunRef> {
        self.root.lock().ok().and_then(|r| r.clone())
    }

    fn line(&self, event: &Event) -> Option<String> {
        if self.content {
            return progress_line(event);
        }
        // Without read_content: the same events, without arguments or error texts.
        progress_line(event)?;
        Some(match &event.payload {
            Payload::ToolCalled(called) => format!("· {}(…)", called.tool_name),
            Payload::ToolCompleted(done) if done.output.is_error => {
                format!("· {}: done (error)", done.tool_name)
            }
            Payload::RunFailed(failed) => format!("· failed ({})", failed.error_type),
            Payload::ApprovalRequested(requested) => {
                format!("· approval requested: {}", requested.tool_name)
            }
            Payload::ApprovalRejected(rejected) => format!(
                "· approval rejected by {}: {}",
                rejected.by, rejected.tool_name
            ),
            _ => progress_line(event)?,
        })
    }
}

impl Observer for Progress {
    fn event(&self, event: &Event) {
        if let Payload::RunStarted(started) = &event.payload
            && started.parent_run_id.is_none()
            && let Ok(mut root) = self.root.lock()
            && root.is_none()
        {
            *root = Some(RunRef {
                tenant_id: event.tenant_id.clone(),
                session_id: event.session_id.clone(),
                run_id: event.run_id.clone(),
            });
        }
        if let Some(lines) = &self.lines
            && let Some(line) = self.line(event)
        {
            let _ = lines.send(line);
        }
    }
}

/// Sends each queued line as a progress notification (progress 1, 2, 3…), in order, until the
/// watcher is dropped; a client that went away ends nothing but the notifications.
pub(crate) async fn forward(
    mut lines: mpsc::UnboundedReceiver<String>,
    peer: Peer<RoleServer>,
    token: Option<ProgressToken>,
) {
    let mut sent = 0u32;
    while let Some(line) = lines.recv().await {
        let Some(token) = &token else { continue };
        sent += 1;
        let notification =
            ProgressNotificationParam::new(token.clone(), f64::from(sent)).with_message(line);
        if let Err(error) = peer.notify_progress(notification).await {
            tracing::debug!(%error, "progress notification not sent");
        }
    }
}
