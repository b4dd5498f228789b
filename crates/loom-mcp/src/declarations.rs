//! Declarations of MCP tools: defaults from the MCP annotations, then the server's overrides.

use loom_core::tool::{SideEffects, ToolDeclarations};

use crate::options::ToolOverrides;

/// The MCP hints that give a tool's default declarations (`ToolAnnotations` of the protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AnnotationHints {
    /// `readOnlyHint`.
    pub read_only: Option<bool>,
    /// `destructiveHint`.
    pub destructive: Option<bool>,
    /// `idempotentHint`.
    pub idempotent: Option<bool>,
}

/// The default declarations of a tool from its MCP annotations (`None`: the tool has none).
///
/// - no annotations, or neither `readOnlyHint` nor `destructiveHint: false` ⇒
///   `side_effects: irreversible` (the safe assumption for an unknown tool);
/// - `readOnlyHint: true` ⇒ `side_effects: none`;
/// - `destructiveHint: false` (and not read-only) ⇒ `side_effects: reversible`;
/// - `idempotentHint: true` ⇒ `idempotent: true`.
///
/// Everything else keeps [`ToolDeclarations::default`].
pub fn declarations_from_annotations(hints: Option<AnnotationHints>) -> ToolDeclarations {
    let hints = hints.unwrap_or_default();
    let side_effects = if hints.read_only == Some(true) {
        SideEffects::None
    } else if hints.destructive == Some(false) {
        SideEffects::Reversible
    } else {
        SideEffects::Irreversible
    };
    ToolDeclarations {
        side_effects,
        idempotent: hints.idempotent == Some(true),
        ..ToolDeclarations::default()
    }
}

/// Applies the server-level overrides (`mcp_servers[].tools.<tool>`) on top of `declarations`.
pub fn apply_overrides(declarations: &mut ToolDeclarations, overrides: &ToolOverrides) {
    if let Some(side_effects) = overrides.side_effects {
        declarations.side_effects = side_effects;
    }
    if let Some(idempotent) = overrides.idempotent {
        declarations.idempotent = idempotent;
    }
    if let Some(timeout) = overrides.timeout {
        declarations.timeout = Some(timeout);
    }
    if let Some(offload_over) = overrides.offload_over {
        declarations.offload_over = Some(offload_over);
    }
}

impl From<&rmcp::model::ToolAnnotations> for AnnotationHints {
    fn from(annotations: &rmcp::model::ToolAnnotations) -> AnnotationHints {
        AnnotationHints {
            read_only: annotations.read_only_hint,
            destructive: annotations.destructive_hint,
            idempotent: annotations.idempotent_hint,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn hints(
        read_only: Option<bool>,
        destructive: Option<bool>,
        idempotent: Option<bool>,
    ) -> Option<AnnotationHints> {
        Some(AnnotationHints {
            read_only,
            destructive,
            idempotent,
        })
    }

    #[test]
    fn defaults_from_annotations() {
        let none = declarations_from_annotations(None);
        assert_eq!(none.side_effects, SideEffects::Irreversible);
        assert!(!none.idempotent);

        let empty = declarations_from_annotations(hints(None, None, None));
        assert_eq!(empty.side_effects, SideEffects::Irreversible);

        let read_only = declarations_from_annotations(hints(Some(true), Some(true), None));
        assert_eq!(read_only.side_effects, SideEffects::None);

        let additive = declarations_from_annotations(hints(Some(false), Some(false), Some(true)));
        assert_eq!(additive.side_effects, SideEffects::Reversible);
        assert!(additive.idempotent);

        let destructive = declarations_from_annotations(hints(None, Some(true), Some(false)));
        assert_eq!(destructive.side_effects, SideEffects::Irreversible);
        assert!(!destructive.idempotent);
    }

    #[test]
    fn overrides_win() {
        let mut declarations = declarations_from_annotations(None);
        apply_overrides(
            &mut declarations,
            &ToolOverrides {
                side_effects: Some(SideEffects::None),
                idempotent: Some(true),
                timeout: Some(Duration::from_secs(3)),
                description: None,
                offload_over: Some(20_000),
            },
        );
        assert_eq!(declarations.side_effects, SideEffects::None);
        assert!(declarations.idempotent);
        assert_eq!(declarations.timeout, Some(Duration::from_secs(3)));
        assert_eq!(declarations.offload_over, Some(20_000));
    }
}
