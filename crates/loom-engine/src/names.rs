//! Which model configs produced each provider model name in a session ([`ModelNames`]), read
//! from `model.responded` events and carried by session snapshots.

use std::collections::{BTreeMap, BTreeSet};

use loom_core::{Event, event::Payload};

use crate::binding::ModelBinding;

/// Which model configs produced each provider model name (from `model.responded`), so that
/// reasoning blocks of other models are not sent to a fallback.
#[derive(Debug, Default, Clone)]
pub(crate) struct ModelNames(BTreeMap<String, BTreeSet<String>>);

impl ModelNames {
    /// The names a snapshot carried forward.
    pub(crate) fn from_map(map: BTreeMap<String, BTreeSet<String>>) -> ModelNames {
        ModelNames(map)
    }

    /// The names seen, for a snapshot.
    pub(crate) fn into_map(self) -> BTreeMap<String, BTreeSet<String>> {
        self.0
    }

    pub(crate) fn note(&mut self, event: &Event) {
        if let Payload::ModelResponded(p) = &event.payload
            && let Some(config) = &p.model
        {
            self.0
                .entry(p.model_id.clone())
                .or_default()
                .insert(config.clone());
        }
    }

    /// Whether a reasoning block produced by the provider model `model_id` belongs to `model`
    /// (a name never seen answering is given the benefit of the doubt).
    pub(crate) fn is_own(&self, model_id: &str, model: &ModelBinding) -> bool {
        model_id == model.model_id
            || self
                .0
                .get(model_id)
                .is_none_or(|configs| configs.contains(&model.config_id))
    }
}
