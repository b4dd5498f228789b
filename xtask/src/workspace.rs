//! The workspace as the checks see it: member crates and their declared
//! dependencies, read from `cargo metadata --format-version 1 --no-deps`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Why the workspace could not be read.
#[derive(Debug)]
pub struct Error(String);

impl Error {
    /// An error carrying `message`.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// Which manifest table a dependency is declared in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepKind {
    /// `[dependencies]`: shipped with the crate.
    Normal,
    /// `[build-dependencies]`: run at build time, shipped too.
    Build,
    /// `[dev-dependencies]`: tests, examples and benches only.
    Dev,
}

/// One declared dependency of a workspace crate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependency {
    /// The package name (not the `package =` rename).
    pub name: String,
    /// The manifest table it is declared in.
    pub kind: DepKind,
    /// The version requirement; `*` when none was written.
    pub req: String,
    /// The local path, for a path dependency.
    pub path: Option<PathBuf>,
}

impl Dependency {
    /// A dependency named `name` of kind `kind`, from a registry.
    pub fn new(name: &str, kind: DepKind) -> Self {
        Self {
            name: name.to_owned(),
            kind,
            req: "*".to_owned(),
            path: None,
        }
    }

    /// Whether the dependency ships with the crate (normal or build).
    pub fn is_shipped(&self) -> bool {
        self.kind != DepKind::Dev
    }
}

/// One workspace member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Package {
    /// The package name, such as `loom-core`.
    pub name: String,
    /// Its declared dependencies, every kind and target.
    pub dependencies: Vec<Dependency>,
    /// Whether it may be published (`publish = false` makes it private).
    pub publish: bool,
    /// Its `[features]`: each name with what it enables (`dep:x`, `x/f`, other features).
    pub features: BTreeMap<String, Vec<String>>,
    /// The directory holding its `Cargo.toml`, when known.
    pub dir: Option<PathBuf>,
}

impl Package {
    /// A package named `name` with the given dependencies.
    pub fn new(name: &str, dependencies: Vec<Dependency>) -> Self {
        Self {
            name: name.to_owned(),
            dependencies,
            publish: true,
            features: BTreeMap::new(),
            dir: None,
        }
    }
}

/// The workspace members and their manifests' dependencies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    /// The directory holding the root `Cargo.toml`.
    pub root: PathBuf,
    /// Every workspace member.
    pub packages: Vec<Package>,
}

impl Workspace {
    /// Runs `cargo metadata --no-deps` on the workspace at `root` and reads it.
    ///
    /// Uses the `CARGO` environment variable when set (as under `cargo test`
    /// and `cargo run`), else `cargo` from the `PATH`.
    pub fn load(root: &Path) -> Result<Self, Error> {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let output = Command::new(cargo)
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .arg("--manifest-path")
            .arg(root.join("Cargo.toml"))
            .output()
            .map_err(|e| Error::new(format!("cannot run cargo metadata: {e}")))?;
        if !output.status.success() {
            return Err(Error::new(format!(
                "cargo metadata failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        let metadata: Value = serde_json::from_slice(&output.stdout)
            .map_err(|e| Error::new(format!("cargo metadata printed invalid JSON: {e}")))?;
        Self::from_metadata(&metadata)
    }

    /// Reads the output of `cargo metadata --format-version 1 --no-deps`.
    pub fn from_metadata(metadata: &Value) -> Result<Self, Error> {
        let root = metadata["workspace_root"]
            .as_str()
            .ok_or_else(|| Error::new("cargo metadata: no workspace_root"))?;
        let members: Vec<&str> = metadata["workspace_members"]
            .as_array()
            .ok_or_else(|| Error::new("cargo metadata: no workspace_members"))?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let packages = metadata["packages"]
            .as_array()
            .ok_or_else(|| Error::new("cargo metadata: no packages"))?
            .iter()
            .filter(|p| p["id"].as_str().is_some_and(|id| members.contains(&id)))
            .map(package_from_metadata)
            .collect::<Result<_, _>>()?;
        Ok(Self {
            root: PathBuf::from(root),
            packages,
        })
    }

    /// Whether `name` is a workspace member.
    pub fn is_member(&self, name: &str) -> bool {
        self.packages.iter().any(|p| p.name == name)
    }
}

fn package_from_metadata(package: &Value) -> Result<Package, Error> {
    let name = package["name"]
        .as_str()
        .ok_or_else(|| Error::new("cargo metadata: a package has no name"))?;
    let dependencies = package["dependencies"]
        .as_array()
        .ok_or_else(|| Error::new(format!("cargo metadata: {name} has no dependencies list")))?
        .iter()
        .map(|d| dependency_from_metadata(name, d))
        .collect::<Result<_, _>>()?;
    // `publish = false` reads as an empty list of allowed registries.
    let publish = package["publish"]
        .as_array()
        .is_none_or(|registries| !registries.is_empty());
    let features = package["features"]
        .as_object()
        .map(|features| {
            features
                .iter()
                .map(|(name, enables)| {
                    let enables = enables
                        .as_array()
                        .map(|list| {
                            list.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_owned)
                                .collect()
                        })
                        .unwrap_or_default();
                    (name.clone(), enables)
                })
                .collect()
        })
        .unwrap_or_default();
    let dir = package["manifest_path"]
        .as_str()
        .and_then(|manifest| Path::new(manifest).parent())
        .map(Path::to_path_buf);
    Ok(Package {
        publish,
        features,
        dir,
        ..Package::new(name, dependencies)
    })
}

fn dependency_from_metadata(package: &str, dep: &Value) -> Result<Dependency, Error> {
    let name = dep["name"].as_str().ok_or_else(|| {
        Error::new(format!(
            "cargo metadata: a dependency of {package} has no name"
        ))
    })?;
    let kind = match dep["kind"].as_str() {
        None | Some("normal") => DepKind::Normal,
        Some("build") => DepKind::Build,
        Some("dev") => DepKind::Dev,
        Some(other) => {
            return Err(Error::new(format!(
                "cargo metadata: {package} -> {name} has unknown kind {other}"
            )));
        }
    };
    Ok(Dependency {
        name: name.to_owned(),
        kind,
        req: dep["req"].as_str().unwrap_or("*").to_owned(),
        path: dep["path"].as_str().map(PathBuf::from),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_members_kinds_paths_and_publish_from_metadata() {
        let metadata = serde_json::json!({
            "workspace_root": "/ws",
            "workspace_members": ["engine-id", "xtask-id"],
            "packages": [
                {"id": "engine-id", "name": "loom-engine", "publish": null, "dependencies": [
                    {"name": "loom-journal", "kind": null, "req": "^0.1.0", "path": "/ws/j"},
                    {"name": "loom-testkit", "kind": "dev", "req": "*", "path": "/ws/t"},
                    {"name": "cc", "kind": "build", "req": "^1"}
                ]},
                {"id": "xtask-id", "name": "xtask", "publish": [], "dependencies": []},
                {"id": "other-id", "name": "not-a-member", "dependencies": []}
            ]
        });
        let workspace = Workspace::from_metadata(&metadata).unwrap();
        let names: Vec<&str> = workspace.packages.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["loom-engine", "xtask"]);
        let engine = &workspace.packages[0];
        assert!(engine.publish);
        assert!(!workspace.packages[1].publish);
        let kinds: Vec<DepKind> = engine.dependencies.iter().map(|d| d.kind).collect();
        assert_eq!(kinds, [DepKind::Normal, DepKind::Dev, DepKind::Build]);
        assert_eq!(engine.dependencies[0].path, Some(PathBuf::from("/ws/j")));
        assert_eq!(engine.dependencies[2].path, None);
        assert_eq!(
            crate::layers::check_layering(&workspace),
            [
                "loom-engine must not depend on loom-journal: the engine depends on loom-core \
              only and reaches adapters through ports"
            ]
        );
    }
}
