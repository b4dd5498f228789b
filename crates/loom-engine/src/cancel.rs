//! Cancelling a run this process drives, and saying who asked: [`Cancel`].
//!
//! A run driven nowhere is cancelled by writing its closing events
//! ([`Engine::cancel_idle`](crate::Engine::cancel_idle), which journals `by`). A run being
//! driven is cancelled through its pilot instead: the pilot stops between or during steps and
//! writes the same `run.cancelled` (reason `requested`), with the `by` its [`Cancel`] carries.

use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

/// The cancellation of a run being driven, carrying who asked for it (journaled as
/// `run.cancelled.by`). Clones share one cancellation.
///
/// A plain [`CancellationToken`] converts into a `Cancel` that names no one, so
/// [`Engine::drive`](crate::Engine::drive) accepts either.
#[derive(Debug, Clone, Default)]
pub struct Cancel {
    token: CancellationToken,
    by: Arc<OnceLock<String>>,
}

impl Cancel {
    /// A cancellation not yet requested.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Cancels the run; `by` (who asked) is what the run's `run.cancelled` records. Only the
    /// first cancellation counts: once cancelled, a later call changes nothing, not even `by`.
    pub fn cancel(&self, by: Option<String>) {
        if !self.token.is_cancelled()
            && let Some(by) = by
        {
            // Set before the token fires, so the pilot woken by it reads `by`.
            let _ = self.by.set(by);
        }
        self.token.cancel();
    }

    /// Whether the run was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Resolves once the run is cancelled.
    pub async fn cancelled(&self) {
        self.token.cancelled().await;
    }

    /// Whether `other` is this same cancellation (a clone of it), not another one.
    pub fn is_same(&self, other: &Cancel) -> bool {
        Arc::ptr_eq(&self.by, &other.by)
    }

    /// Who cancelled, when the cancellation said so.
    pub fn by(&self) -> Option<&str> {
        self.by.get().map(String::as_str)
    }

    /// A token cancelled with this one (what the run's child runs and tool batch obey).
    pub(crate) fn child_token(&self) -> CancellationToken {
        self.token.child_token()
    }
}

impl From<CancellationToken> for Cancel {
    fn from(token: CancellationToken) -> Cancel {
        Cancel {
            token,
            by: Arc::default(),
        }
    }
}

impl From<&CancellationToken> for Cancel {
    fn from(token: &CancellationToken) -> Cancel {
        Cancel::from(token.clone())
    }
}

impl From<&Cancel> for Cancel {
    fn from(cancel: &Cancel) -> Cancel {
        cancel.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_cancellation_says_who() {
        let cancel = Cancel::new();
        let shared = Cancel::from(&cancel);
        assert!(!shared.is_cancelled());
        cancel.cancel(Some("alice".into()));
        cancel.cancel(Some("bob".into()));
        assert!(shared.is_cancelled());
        assert_eq!(shared.by(), Some("alice"));

        let anonymous = Cancel::new();
        anonymous.cancel(None);
        anonymous.cancel(Some("bob".into()));
        assert_eq!(anonymous.by(), None);

        let token = CancellationToken::new();
        let plain = Cancel::from(&token);
        token.cancel();
        assert!(plain.is_cancelled());
        assert_eq!(plain.by(), None);
    }
}
