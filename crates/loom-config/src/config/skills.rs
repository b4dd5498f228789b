//! An agent's `sandbox:` checks, and its `skills:` loaded from their folders.
//!
//! A skill is a folder holding a `SKILL.md`: YAML front matter between `---` lines with `name`
//! (`^[a-z0-9][a-z0-9-]{0,63}$`, unique among the agent's skills) and `description` (1 to 1024
//! characters), then the instructions (the body). Every other file of the folder (UTF-8 text,
//! under the rules of `files`: no link out, no FIFO, at most 1 MiB each, at most
//! [`MAX_SKILL_FILES`]) is a resource the model may read, and those under `scripts/` may run
//! in the agent's sandbox. All of it is read when the configuration loads, so a run never reads
//! the skill's folder; every problem is located at `skills[i].path` of the agent.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{ConfigError, ConfigErrorKind};
use crate::files::{self, FileProblem};
use crate::model::{AgentSpec, SandboxBackend};
use crate::yaml::KeyPath;

use super::{Doc, NOT_POSITIVE, display_path};

/// The most files (besides `SKILL.md`) a skill folder may hold.
pub const MAX_SKILL_FILES: usize = 200;

/// A skill, loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skill {
    /// Its name (front matter `name`).
    pub name: String,
    /// What it is for (front matter `description`): all the model sees before loading it.
    pub description: String,
    /// Its instructions: `SKILL.md` after the front matter.
    pub body: String,
    /// Its other files, by path relative to its folder (`/`-separated), sorted.
    pub files: Vec<(String, String)>,
}

impl Skill {
    /// The text of its file `path`, if it has one.
    pub fn file(&self, path: &str) -> Option<&str> {
        self.files
            .iter()
            .find(|(name, _)| name == path)
            .map(|(_, text)| text.as_str())
    }

    /// Its scripts: the files under `scripts/`.
    pub fn scripts(&self) -> impl Iterator<Item = &(String, String)> {
        self.files
            .iter()
            .filter(|(name, _)| name.starts_with("scripts/"))
    }
}

/// The front matter of a `SKILL.md`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FrontMatter {
    name: String,
    description: String,
    // Keys of the format that Loom reads but does not use.
    #[serde(default)]
    #[allow(dead_code)]
    license: Option<String>,
    #[serde(default, rename = "allowed-tools")]
    #[allow(dead_code)]
    allowed_tools: Option<serde_json::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<serde_json::Value>,
}

fn valid_skill_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=64).contains(&bytes.len())
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// Checks the agent's `sandbox:` block (at `p.sandbox`).
pub(super) fn check_sandbox(doc: &Doc, p: &KeyPath, spec: &AgentSpec) -> Result<(), ConfigError> {
    let Some(sandbox) = &spec.sandbox else {
        return Ok(());
    };
    let sp = p.key("sandbox");
    let invalid = |key: &str, msg: String| doc.error(&sp.key(key), ConfigErrorKind::Invalid, msg);
    let limits = sandbox.limits;
    for (key, value) in [
        ("wall_ms", limits.wall_ms),
        ("cpu_ms", limits.cpu_ms),
        ("memory_mb", limits.memory_mb),
        ("output_bytes", limits.output_bytes),
        ("processes", limits.processes),
        ("file_mb", limits.file_mb),
    ] {
        if value == Some(0) {
            return Err(doc.error(
                &sp.key("limits").key(key),
                ConfigErrorKind::Invalid,
                NOT_POSITIVE,
            ));
        }
    }
    match sandbox.backend {
        SandboxBackend::Local => {
            for (key, set) in [
                ("url", sandbox.url.is_some()),
                ("token_env", sandbox.token_env.is_some()),
            ] {
                if set {
                    return Err(invalid(
                        key,
                        format!("'{key}' is for backend: remote; this sandbox is local"),
                    ));
                }
            }
        }
        SandboxBackend::Remote => {
            if sandbox.root.is_some() {
                return Err(invalid(
                    "root",
                    "'root' is for backend: local; a remote runner keeps its folders under its \
                     own --root"
                        .into(),
                ));
            }
            match sandbox.url.as_deref() {
                None => {
                    return Err(invalid(
                        "backend",
                        "backend: remote needs 'url', the runner's base URL (loom sandbox serve)"
                            .into(),
                    ));
                }
                Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                    return Err(invalid(
                        "url",
                        format!("'{url}' is not an http:// or https:// URL"),
                    ));
                }
                Some(_) => {}
            }
            if sandbox.token_env.is_none() {
                return Err(invalid(
                    "backend",
                    "backend: remote needs 'token_env', the environment variable holding the \
                     runner's bearer token"
                        .into(),
                ));
            }
        }
    }
    Ok(())
}

/// Loads the agent's skills, each problem located at `skills[i].path`.
pub(super) fn load_skills(
    doc: &Doc,
    base: &Path,
    p: &KeyPath,
    spec: &AgentSpec,
) -> Result<Vec<Skill>, ConfigError> {
    let mut skills: Vec<Skill> = Vec::with_capacity(spec.skills.len());
    for (i, reference) in spec.skills.iter().enumerate() {
        let at = p.key("skills").index(i).key("path");
        let folder = base.join(&reference.path);
        let shown = display_path(base, &folder);
        let fail = |kind: ConfigErrorKind, msg: String| doc.error(&at, kind, msg);
        if !folder.is_dir() {
            return Err(fail(
                ConfigErrorKind::MissingFile,
                format!("skill folder {} not found", shown.display()),
            ));
        }
        let text = match files::read_under(&folder, Path::new("SKILL.md")) {
            Ok(text) => text,
            Err(FileProblem::NotFound) => {
                return Err(fail(
                    ConfigErrorKind::MissingFile,
                    format!(
                        "skill folder {} has no SKILL.md (front matter with name and \
                         description, then the instructions)",
                        shown.display()
                    ),
                ));
            }
            Err(problem) => {
                return Err(fail(
                    ConfigErrorKind::Invalid,
                    format!("{}/SKILL.md: {problem}", shown.display()),
                ));
            }
        };
        let skill_md = format!("{}/SKILL.md", shown.display());
        let (front, body) = split_front_matter(&text)
            .map_err(|msg| fail(ConfigErrorKind::Invalid, format!("{skill_md}: {msg}")))?;
        let front: FrontMatter = serde_saphyr::from_str(front).map_err(|e| {
            fail(
                ConfigErrorKind::Invalid,
                format!("{skill_md}: bad front matter: {e}"),
            )
        })?;
        if !valid_skill_name(&front.name) {
            return Err(fail(
                ConfigErrorKind::Invalid,
                format!(
                    "{skill_md}: invalid skill name '{}' (expected ^[a-z0-9][a-z0-9-]{{0,63}}$)",
                    front.name
                ),
            ));
        }
        let description = front.description.trim();
        if description.is_empty() || description.chars().count() > 1024 {
            return Err(fail(
                ConfigErrorKind::Invalid,
                format!("{skill_md}: the description must hold 1 to 1024 characters"),
            ));
        }
        if let Some(j) = skills.iter().position(|s| s.name == front.name) {
            return Err(fail(
                ConfigErrorKind::Invalid,
                format!(
                    "duplicate skill name '{}' (already the name of skills[{j}], {})",
                    front.name,
                    spec.skills[j].path.display()
                ),
            ));
        }
        let files = skill_files(&folder).map_err(|msg| {
            fail(
                ConfigErrorKind::Invalid,
                format!("skill '{}': {msg}", front.name),
            )
        })?;
        skills.push(Skill {
            name: front.name,
            description: description.to_owned(),
            body: body.trim_start_matches(['\r', '\n']).to_owned(),
            files,
        });
    }
    Ok(skills)
}

/// The front matter and the body of a `SKILL.md`.
fn split_front_matter(text: &str) -> Result<(&str, &str), String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let Some(rest) = text
        .strip_prefix("---\n")
        .or_else(|| text.strip_prefix("---\r\n"))
    else {
        return Err("it must start with a front matter line '---'".into());
    };
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Ok((&rest[..offset], &rest[offset + line.len()..]));
        }
        offset += line.len();
    }
    Err("its front matter has no closing '---' line".into())
}

/// Every file of a skill folder but `SKILL.md`, read under the rules of `files`.
fn skill_files(folder: &Path) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let dir = folder.join(&relative);
        let entries = std::fs::read_dir(&dir)
            .map_err(|e| format!("cannot list {}: {e}", relative.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", relative.display()))?;
            let path = relative.join(entry.file_name());
            let kind = entry
                .file_type()
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if kind.is_dir() {
                pending.push(path);
                continue;
            }
            if path == Path::new("SKILL.md") {
                continue;
            }
            let text = files::read_under(folder, &path)
                .map_err(|problem| format!("file {}: {problem}", path.display()))?;
            let name = path
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((name, text));
            if out.len() > MAX_SKILL_FILES {
                return Err(format!("more than {MAX_SKILL_FILES} files"));
            }
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_matter_is_split_from_the_body() {
        let (front, body) = split_front_matter("---\nname: a\n---\nDo this.\n").unwrap();
        assert_eq!(front, "name: a\n");
        assert_eq!(body, "Do this.\n");
        assert!(split_front_matter("name: a\n").is_err());
        assert!(split_front_matter("---\nname: a\n").is_err());
    }

    #[test]
    fn skill_names_follow_the_pattern() {
        for good in ["pdf", "csv-report", "a1"] {
            assert!(valid_skill_name(good), "{good}");
        }
        for bad in ["", "-x", "Upper", "a_b", "a b", &"x".repeat(65)] {
            assert!(!valid_skill_name(bad), "{bad}");
        }
    }
}
