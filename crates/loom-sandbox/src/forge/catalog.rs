//! The catalog of forged tools: `<catalog_dir>/<tenant>/<name>/` holding `tool.json` (the
//! [`CatalogEntry`]) and `tool.py` (the program), one folder per tool and tenant.
//!
//! A tool is published whole or not at all: both files are written into a hidden temporary
//! folder of the tenant (`.tmp-<name>-<nonce>`, never listed), synced, then the folder is
//! renamed into place; a name already taken makes the rename fail, so two runs defining the
//! same name at once cannot both win. Entries are never replaced: a name, once published,
//! always means the same code (its SHA-256 is in `tool.json` and checked on every read).
//! A tenant's folder is named by its id (a safe id): no tenant reads another's folder.

use std::{
    io::Write,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    sync::Arc,
};

use loom_core::ids::is_safe_id;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::check::Example;

/// The file holding an entry's description.
pub const ENTRY_FILE: &str = "tool.json";
/// The file holding an entry's program.
pub const CODE_FILE: &str = "tool.py";

/// Who defined a tool: the call that published it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefinedBy {
    /// The session of the run.
    pub session_id: String,
    /// The run.
    pub run_id: String,
    /// The `define` call.
    pub call_id: String,
}

/// A forged tool as the catalog keeps it (`tool.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CatalogEntry {
    /// Its name, without the source's prefix.
    pub name: String,
    /// What it does, shown to the model.
    pub description: String,
    /// The JSON Schema of its input.
    pub input_schema: Value,
    /// The examples it passed.
    pub examples: Vec<Example>,
    /// The language its program is run with (`python3`).
    pub language: String,
    /// The SHA-256 of its program (hex), checked whenever it is read.
    pub code_sha256: String,
    /// The call that defined it.
    pub defined_by: DefinedBy,
}

/// An error of the catalog.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    /// The tenant id cannot name a folder.
    #[error("unsafe tenant id {0:?}")]
    UnsafeTenant(String),
    /// The tenant already has a tool of that name.
    #[error("the tenant already has a tool named '{0}'")]
    NameTaken(String),
    /// The tenant has no tool of that name.
    #[error("the tenant has no forged tool named '{0}'")]
    Unknown(String),
    /// An entry that does not read back (bad JSON, a program whose hash differs).
    #[error("the catalog entry {path} is corrupt: {why}")]
    Corrupt {
        /// The entry's folder.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A file operation failed.
    #[error("catalog i/o error at {path}: {source}")]
    Io {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The SHA-256 of `code`, in hex.
pub fn code_sha256(code: &str) -> String {
    hex::encode(Sha256::digest(code.as_bytes()))
}

/// The catalog under one root directory.
#[derive(Debug, Clone)]
pub struct Catalog {
    root: Arc<PathBuf>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CatalogError + '_ {
    move |source| CatalogError::Io {
        path: path.to_owned(),
        source,
    }
}

impl Catalog {
    /// The catalog under `root` (created on the first publication).
    pub fn new(root: impl Into<PathBuf>) -> Catalog {
        Catalog {
            root: Arc::new(root.into()),
        }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn tenant_dir(&self, tenant: &str) -> Result<PathBuf, CatalogError> {
        if !is_safe_id(tenant) {
            return Err(CatalogError::UnsafeTenant(tenant.to_owned()));
        }
        Ok(self.root.join(tenant))
    }

    /// The entries of `tenant`, by name. An entry that does not read back is left out with a
    /// warning (a run still gets the others).
    pub fn list(&self, tenant: &str) -> Result<Vec<CatalogEntry>, CatalogError> {
        let dir = self.tenant_dir(tenant)?;
        let read = match std::fs::read_dir(&dir) {
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => return Err(io(&dir)(error)),
        };
        let mut entries = Vec::new();
        for item in read {
            let item = item.map_err(io(&dir))?;
            let name = item.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            match self.get(tenant, &name) {
                Ok((entry, _)) => entries.push(entry),
                Err(error) => {
                    tracing::warn!(tenant, tool = %name, %error, "forge catalog entry left out");
                }
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(entries)
    }

    /// The entry `name` of `tenant` and its program, the program's hash checked.
    pub fn get(&self, tenant: &str, name: &str) -> Result<(CatalogEntry, String), CatalogError> {
        let tenant_dir = self.tenant_dir(tenant)?;
        if super::check::check_name("x", name).is_err() {
            return Err(CatalogError::Unknown(name.to_owned()));
        }
        let folder = tenant_dir.join(name);
        let corrupt = |why: String| CatalogError::Corrupt {
            path: folder.clone(),
            why,
        };
        let text = match std::fs::read_to_string(folder.join(ENTRY_FILE)) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Err(CatalogError::Unknown(name.to_owned()));
            }
            Err(error) => return Err(io(&folder)(error)),
        };
        let entry: CatalogEntry =
            serde_json::from_str(&text).map_err(|e| corrupt(format!("{ENTRY_FILE}: {e}")))?;
        if entry.name != name {
            return Err(corrupt(format!(
                "{ENTRY_FILE} names the tool '{}'",
                entry.name
            )));
        }
        let code = std::fs::read_to_string(folder.join(CODE_FILE)).map_err(io(&folder))?;
        if code_sha256(&code) != entry.code_sha256 {
            return Err(corrupt(format!(
                "{CODE_FILE} does not have the SHA-256 recorded in {ENTRY_FILE}"
            )));
        }
        Ok((entry, code))
    }

    /// Publishes `entry` with its program `code` for `tenant`, whole or not at all; a name
    /// the tenant already has is refused ([`CatalogError::NameTaken`]).
    pub fn publish(
        &self,
        tenant: &str,
        entry: &CatalogEntry,
        code: &str,
    ) -> Result<(), CatalogError> {
        let tenant_dir = self.tenant_dir(tenant)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&tenant_dir)
            .map_err(io(&tenant_dir))?;
        let target = tenant_dir.join(&entry.name);
        if target.exists() {
            return Err(CatalogError::NameTaken(entry.name.clone()));
        }
        let nonce = &code_sha256(&format!(
            "{}:{}:{}",
            entry.defined_by.run_id,
            entry.defined_by.call_id,
            std::process::id()
        ))[..16];
        let temp = tenant_dir.join(format!(".tmp-{}-{nonce}", entry.name));
        let _ = std::fs::remove_dir_all(&temp);
        let result = write_entry(&temp, entry, code).and_then(|()| {
            std::fs::rename(&temp, &target).map_err(|error| {
                // A folder renamed over a non-empty one: another run won the name.
                if target.join(ENTRY_FILE).exists() {
                    CatalogError::NameTaken(entry.name.clone())
                } else {
                    io(&target)(error)
                }
            })
        });
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&temp);
        }
        result?;
        sync_dir(&tenant_dir)
    }
}

/// Writes both files of an entry into `folder` (created), synced.
fn write_entry(folder: &Path, entry: &CatalogEntry, code: &str) -> Result<(), CatalogError> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(folder)
        .map_err(io(folder))?;
    let json = serde_json::to_vec_pretty(entry).map_err(|e| CatalogError::Corrupt {
        path: folder.to_owned(),
        why: e.to_string(),
    })?;
    for (file, bytes) in [(CODE_FILE, code.as_bytes()), (ENTRY_FILE, &json)] {
        let path = folder.join(file);
        let mut out = std::fs::File::create(&path).map_err(io(&path))?;
        out.write_all(bytes).map_err(io(&path))?;
        out.sync_all().map_err(io(&path))?;
    }
    sync_dir(folder)
}

/// Syncs a directory, so a rename in it survives a crash.
fn sync_dir(dir: &Path) -> Result<(), CatalogError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(name: &str, code: &str) -> CatalogEntry {
        CatalogEntry {
            name: name.into(),
            description: "Doubles n.".into(),
            input_schema: json!({"type": "object"}),
            examples: vec![Example {
                input: json!({"n": 1}),
                output: json!(2),
            }],
            language: "python3".into(),
            code_sha256: code_sha256(code),
            defined_by: DefinedBy {
                session_id: "s".into(),
                run_id: "r".into(),
                call_id: "c".into(),
            },
        }
    }

    #[test]
    fn an_entry_is_published_once_and_read_back_with_its_code() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::new(dir.path().join("catalog"));
        assert!(catalog.list("acme").unwrap().is_empty());
        let code = "print(2)\n";
        catalog
            .publish("acme", &entry("double", code), code)
            .unwrap();
        let (read, read_code) = catalog.get("acme", "double").unwrap();
        assert_eq!(read, entry("double", code));
        assert_eq!(read_code, code);
        assert_eq!(catalog.list("acme").unwrap(), vec![entry("double", code)]);
        // Never replaced.
        let other = "print(3)\n";
        assert!(matches!(
            catalog.publish("acme", &entry("double", other), other),
            Err(CatalogError::NameTaken(name)) if name == "double"
        ));
        assert_eq!(catalog.get("acme", "double").unwrap().1, code);
        // No temporary folder is left behind.
        let names: Vec<String> = std::fs::read_dir(dir.path().join("catalog/acme"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["double"]);
    }

    #[test]
    fn a_tenant_never_sees_another_tenants_tools() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::new(dir.path());
        let code = "print(2)\n";
        catalog
            .publish("acme", &entry("double", code), code)
            .unwrap();
        assert!(catalog.list("globex").unwrap().is_empty());
        assert!(matches!(
            catalog.get("globex", "double"),
            Err(CatalogError::Unknown(_))
        ));
        // The same name is free for another tenant.
        let theirs = "print(4)\n";
        catalog
            .publish("globex", &entry("double", theirs), theirs)
            .unwrap();
        assert_eq!(catalog.get("globex", "double").unwrap().1, theirs);
        assert_eq!(catalog.get("acme", "double").unwrap().1, code);
        for tenant in ["..", "a/b", ""] {
            assert!(matches!(
                catalog.list(tenant),
                Err(CatalogError::UnsafeTenant(_))
            ));
        }
        assert!(matches!(
            catalog.get("acme", "../globex/double"),
            Err(CatalogError::Unknown(_))
        ));
    }

    #[test]
    fn a_tampered_program_or_entry_is_refused_and_left_out_of_the_listing() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Catalog::new(dir.path());
        for name in ["double", "triple", "half"] {
            let code = format!("# {name}\n");
            catalog.publish("acme", &entry(name, &code), &code).unwrap();
        }
        std::fs::write(dir.path().join("acme/double/tool.py"), "import os\n").unwrap();
        std::fs::write(dir.path().join("acme/triple/tool.json"), "{").unwrap();
        assert!(matches!(
            catalog.get("acme", "double"),
            Err(CatalogError::Corrupt { .. })
        ));
        let names: Vec<String> = catalog
            .list("acme")
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, ["half"]);
    }
}
