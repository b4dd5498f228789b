//! The architecture's layering, as data, and the check that enforces it.
//!
//! Every workspace crate sits in one [`Layer`] (the [`CRATES`] table); each
//! layer says which layers its shipped dependencies (`[dependencies]` and
//! `[build-dependencies]`) may point to, and which outside crates it refuses.
//! Dev-dependencies are free: tests may use the test kit and adapters.
//! Adding a crate means adding one line to [`CRATES`].

use crate::workspace::{Package, Workspace};

/// Where a workspace crate sits in the architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// `loom-core`: domain types, events, ports. No IO, no runtime.
    Core,
    /// `loom-config`: the configuration files, parsed and validated.
    Config,
    /// `loom-engine`: the run loop, reaching the world through ports.
    Engine,
    /// One crate per adapter family (journals, models, queues, ...).
    Adapter,
    /// `loom-macros`: the proc-macros, which name no loom crate.
    Macros,
    /// `loom-testkit`: fakes and builders, the engine's dev-dependency.
    Testkit,
    /// `loom-ia`: the facade, the only crate that knows every adapter.
    Facade,
    /// Access crates (the CLI, servers): they go through the facade.
    Access,
    /// Repository tooling such as `xtask`.
    Tooling,
    /// Leaf crates with one concern shared by several layers (`loom-schema`, `loom-tls`):
    /// they depend on no loom crate.
    Leaf,
    /// `loom-notes-core`: loom-notes' domain (documents, chunking, search, ports). No IO.
    NotesCore,
    /// loom-notes' adapters (its SQLite store, its sources, its in-process models): they depend
    /// on `loom-notes-core`, and may share Loom's leaf crates and adapters (`loom-builtins`'
    /// address checks), never Loom's engine or facade.
    NotesAdapter,
    /// The `loom-notes` binary (CLI and MCP server).
    NotesAccess,
}

/// Every workspace crate and its layer. Adding a crate means adding a line.
pub const CRATES: &[(&str, Layer)] = &[
    ("loom-core", Layer::Core),
    ("loom-config", Layer::Config),
    ("loom-engine", Layer::Engine),
    ("loom-journal", Layer::Adapter),
    ("loom-models", Layer::Adapter),
    ("loom-builtins", Layer::Adapter),
    ("loom-sandbox", Layer::Adapter),
    ("loom-providers", Layer::Adapter),
    ("loom-mcp", Layer::Adapter),
    ("loom-sqlite", Layer::Adapter),
    ("loom-postgres", Layer::Adapter),
    ("loom-crypto", Layer::Adapter),
    ("loom-redis", Layer::Adapter),
    ("loom-rabbitmq", Layer::Adapter),
    ("loom-otel", Layer::Adapter),
    ("loom-macros", Layer::Macros),
    ("loom-testkit", Layer::Testkit),
    ("loom-ia", Layer::Facade),
    ("loom-cli", Layer::Access),
    ("loom-http", Layer::Access),
    ("loom-mcp-server", Layer::Access),
    ("xtask", Layer::Tooling),
    ("loom-schema", Layer::Leaf),
    ("loom-tls", Layer::Leaf),
    ("loom-notes-core", Layer::NotesCore),
    ("loom-notes-sqlite", Layer::NotesAdapter),
    ("loom-notes-sources", Layer::NotesAdapter),
    ("loom-notes-candle", Layer::NotesAdapter),
    ("loom-notes", Layer::NotesAccess),
];

/// Outside crates that only one workspace crate may ship with, and why: the others go
/// through it.
pub const EXCLUSIVE: &[(&str, &str, &str)] = &[
    (
        "jsonschema",
        "loom-schema",
        "JSON Schemas are compiled by loom_schema::compile, whose patterns run in linear time",
    ),
    (
        "rustls",
        "loom-tls",
        "rustls' crypto provider is installed once, by loom_tls::install_crypto_provider",
    ),
];

/// The only outside crates `loom-core` may ship with.
pub const CORE_DEPENDENCIES: &[&str] = &[
    "serde",
    "serde_json",
    "thiserror",
    "uuid",
    "chrono",
    "futures-core",
    "schemars",
];

/// Crates that name an async runtime.
pub const RUNTIME_CRATES: &[&str] = &[
    "tokio",
    "tokio-util",
    "tokio-stream",
    "async-std",
    "smol",
    "async-io",
    "async-executor",
];

/// Crates that do network, database, queue or MCP IO: adapters' business.
pub const BACKEND_CRATES: &[&str] = &[
    "reqwest",
    "hyper",
    "hyper-util",
    "axum",
    "tower-http",
    "sqlx",
    "rusqlite",
    "postgres",
    "tokio-postgres",
    "lapin",
    "redis",
    "rmcp",
    "tonic",
    "ureq",
    "walkdir",
    "notify",
];

/// What a layer may ship with.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// The layers whose crates it may depend on.
    pub loom_layers: &'static [Layer],
    /// Why, for the failure message about a loom crate.
    pub loom_reason: &'static str,
    /// When set, the only outside crates it may depend on.
    pub only_external: Option<&'static [&'static str]>,
    /// Outside crates it must not depend on.
    pub refused_external: &'static [&'static [&'static str]],
    /// Why, for the failure message about an outside crate.
    pub external_reason: &'static str,
}

impl Layer {
    /// The rule for this layer.
    pub fn rule(self) -> Rule {
        use Layer::*;
        let free = Rule {
            loom_layers: &[],
            loom_reason: "",
            only_external: None,
            refused_external: &[],
            external_reason: "",
        };
        match self {
            Core => Rule {
                loom_reason: "the core is the bottom layer and depends on no loom crate",
                only_external: Some(CORE_DEPENDENCIES),
                refused_external: &[RUNTIME_CRATES, BACKEND_CRATES],
                external_reason: "the core does no IO and names no runtime",
                ..free
            },
            Config => Rule {
                loom_layers: &[Core, Leaf],
                loom_reason: "configuration depends on loom-core only among loom crates",
                refused_external: &[RUNTIME_CRATES, BACKEND_CRATES],
                external_reason: "configuration parses files and names no runtime",
                ..free
            },
            Engine => Rule {
                loom_layers: &[Core, Leaf],
                loom_reason: "the engine depends on loom-core only and reaches adapters through ports",
                refused_external: &[BACKEND_CRATES],
                external_reason: "the engine reaches the outside world only through ports",
                ..free
            },
            Adapter => Rule {
                loom_layers: &[Core, Leaf],
                loom_reason: "an adapter depends on loom-core only, never on the engine, \
                              the config, another adapter, the facade or an access crate",
                ..free
            },
            Macros => Rule {
                loom_reason: "the proc-macros depend on no loom crate",
                ..free
            },
            Testkit => Rule {
                loom_layers: &[Core, Adapter],
                loom_reason: "the test kit is the engine's dev-dependency and may use \
                              loom-core and adapters only",
                ..free
            },
            Facade => Rule {
                loom_layers: &[Core, Config, Engine, Adapter, Macros, Testkit, Leaf],
                loom_reason: "the facade sits below the access crates",
                ..free
            },
            Access => Rule {
                loom_layers: &[Facade, Access],
                loom_reason: "access crates go through the facade loom-ia (the CLI may \
                              mount another access crate, such as loom-http for `loom serve`), \
                              never directly to the engine or an adapter",
                ..free
            },
            Tooling => Rule {
                loom_reason: "repository tooling depends on no loom crate",
                ..free
            },
            Leaf => Rule {
                loom_reason: "a leaf crate depends on no loom crate",
                refused_external: &[RUNTIME_CRATES, BACKEND_CRATES],
                external_reason: "a leaf crate does no IO and names no runtime",
                ..free
            },
            NotesCore => Rule {
                loom_reason: "loom-notes' domain depends on no loom crate",
                refused_external: &[BACKEND_CRATES],
                external_reason: "loom-notes' domain reaches its store and models through ports",
                ..free
            },
            NotesAdapter => Rule {
                loom_layers: &[NotesCore, Leaf, Adapter],
                loom_reason: "a loom-notes adapter depends on loom-notes-core, Loom's leaf \
                              crates and adapters only, never on another loom-notes adapter, \
                              Loom's engine or facade",
                ..free
            },
            NotesAccess => Rule {
                loom_layers: &[NotesCore, NotesAdapter],
                loom_reason: "the loom-notes binary is built from loom-notes' crates only",
                ..free
            },
        }
    }
}

/// The layer of the workspace crate `name`, if it is classified.
pub fn layer_of(name: &str) -> Option<Layer> {
    CRATES
        .iter()
        .find(|(crate_name, _)| *crate_name == name)
        .map(|(_, layer)| *layer)
}

/// Checks every workspace crate's shipped dependencies against its layer.
///
/// Returns one message per violation, naming the crate, the forbidden
/// dependency and the rule; an unclassified workspace crate is a violation.
pub fn check_layering(workspace: &Workspace) -> Vec<String> {
    let mut violations = Vec::new();
    for package in &workspace.packages {
        match layer_of(&package.name) {
            Some(layer) => check_package(workspace, package, layer, &mut violations),
            None => violations.push(format!(
                "workspace crate {} is not classified: add a line for it to CRATES \
                 in xtask/src/layers.rs",
                package.name
            )),
        }
    }
    violations
}

fn check_package(workspace: &Workspace, package: &Package, layer: Layer, out: &mut Vec<String>) {
    let rule = layer.rule();
    for dep in package.dependencies.iter().filter(|d| d.is_shipped()) {
        let name = dep.name.as_str();
        if let Some((_, only, why)) = EXCLUSIVE
            .iter()
            .find(|(external, only, _)| *external == name && *only != package.name)
        {
            out.push(format!(
                "{} must not depend on {name}: only {only} may ({why})",
                package.name
            ));
            continue;
        }
        let reason = if workspace.is_member(name) || layer_of(name).is_some() {
            match layer_of(name) {
                Some(dep_layer) if rule.loom_layers.contains(&dep_layer) => continue,
                Some(_) => rule.loom_reason.to_owned(),
                // The dependency itself is reported as unclassified.
                None => continue,
            }
        } else if rule
            .refused_external
            .iter()
            .any(|list| list.contains(&name))
        {
            rule.external_reason.to_owned()
        } else {
            match rule.only_external {
                Some(only) if !only.contains(&name) => format!(
                    "{}; its only outside dependencies are {}",
                    rule.external_reason,
                    only.join(", ")
                ),
                _ => continue,
            }
        };
        out.push(format!(
            "{} must not depend on {name}: {reason}",
            package.name
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::{DepKind, Dependency};
    use std::path::PathBuf;

    fn workspace(packages: &[(&str, &[(&str, DepKind)])]) -> Workspace {
        Workspace {
            root: PathBuf::from("/nowhere"),
            packages: packages
                .iter()
                .map(|(name, deps)| {
                    Package::new(
                        name,
                        deps.iter().map(|(d, k)| Dependency::new(d, *k)).collect(),
                    )
                })
                .collect(),
        }
    }

    const ALL: &[(&str, &[(&str, DepKind)])] = &[
        ("loom-core", &[("serde", DepKind::Normal)]),
        ("loom-engine", &[("loom-core", DepKind::Normal)]),
        ("loom-journal", &[("loom-core", DepKind::Normal)]),
        ("loom-models", &[("loom-core", DepKind::Normal)]),
        ("loom-testkit", &[("loom-models", DepKind::Normal)]),
        ("loom-ia", &[("loom-engine", DepKind::Normal)]),
        ("loom-cli", &[("loom-ia", DepKind::Normal)]),
    ];

    fn with(extra: (&'static str, &'static [(&'static str, DepKind)])) -> Workspace {
        let mut packages: Vec<_> = ALL.iter().filter(|(n, _)| *n != extra.0).copied().collect();
        packages.push(extra);
        workspace(&packages)
    }

    #[test]
    fn a_clean_workspace_passes() {
        assert_eq!(check_layering(&workspace(ALL)), Vec::<String>::new());
    }

    #[test]
    fn the_core_refuses_tokio() {
        let ws = with((
            "loom-core",
            &[("serde", DepKind::Normal), ("tokio", DepKind::Normal)],
        ));
        assert_eq!(
            check_layering(&ws),
            ["loom-core must not depend on tokio: the core does no IO and names no runtime"]
        );
    }

    #[test]
    fn the_core_refuses_an_unlisted_crate_and_any_loom_crate() {
        let ws = with((
            "loom-core",
            &[("regex", DepKind::Build), ("loom-journal", DepKind::Normal)],
        ));
        let violations = check_layering(&ws);
        assert_eq!(violations.len(), 2, "{violations:?}");
        assert!(violations[0].starts_with("loom-core must not depend on regex: "));
        assert!(violations[1].starts_with("loom-core must not depend on loom-journal: "));
    }

    #[test]
    fn the_engine_refuses_an_adapter_but_its_tests_may_use_one() {
        let ws = with((
            "loom-engine",
            &[
                ("loom-core", DepKind::Normal),
                ("loom-journal", DepKind::Normal),
                ("loom-models", DepKind::Dev),
                ("loom-testkit", DepKind::Dev),
            ],
        ));
        assert_eq!(
            check_layering(&ws),
            [
                "loom-engine must not depend on loom-journal: the engine depends on loom-core \
              only and reaches adapters through ports"
            ]
        );
    }

    #[test]
    fn adapters_do_not_depend_on_each_other() {
        let ws = with(("loom-models", &[("loom-journal", DepKind::Normal)]));
        let violations = check_layering(&ws);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].starts_with("loom-models must not depend on loom-journal: "));
    }

    #[test]
    fn the_cli_goes_through_the_facade() {
        let ws = with((
            "loom-cli",
            &[
                ("loom-ia", DepKind::Normal),
                ("loom-engine", DepKind::Normal),
            ],
        ));
        let violations = check_layering(&ws);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].starts_with("loom-cli must not depend on loom-engine: "));
    }

    #[test]
    fn an_unknown_crate_must_be_classified() {
        let ws = with(("loom-mystery", &[]));
        assert_eq!(
            check_layering(&ws),
            [
                "workspace crate loom-mystery is not classified: add a line for it to CRATES \
              in xtask/src/layers.rs"
            ]
        );
    }

    #[test]
    fn schemas_and_tls_go_through_their_leaf_crates() {
        let ws = with((
            "loom-engine",
            &[
                ("loom-core", DepKind::Normal),
                ("loom-schema", DepKind::Normal),
                ("jsonschema", DepKind::Normal),
                ("rustls", DepKind::Dev),
            ],
        ));
        assert_eq!(
            check_layering(&ws),
            [
                "loom-engine must not depend on jsonschema: only loom-schema may (JSON Schemas \
                 are compiled by loom_schema::compile, whose patterns run in linear time)"
            ]
        );
        let ws = with(("loom-schema", &[("jsonschema", DepKind::Normal)]));
        assert_eq!(check_layering(&ws), Vec::<String>::new());
    }
}
