//! The tools of an agent's skills: `skills__load`, `skills__read` and `skills__run`.
//!
//! The model sees only each skill's name and description, in the description of
//! `skills__load` (not in the system prompt: the agent's prompt stays what its author wrote,
//! and the list sits where the model decides to call the tool). It loads a skill's
//! instructions and the list of its files on demand, reads a file with `skills__read`, and
//! runs a script (a file under `scripts/`) with `skills__run`: the skill's files are copied
//! into the working folder (`skills/<name>/`) and the script runs there, in the sandbox, never
//! on the host. An agent without a sandbox gets the refusal `sandbox-required`.

use std::sync::Arc;

use loom_core::{
    sandbox::rules,
    tool::{FnTool, SideEffects, ToolError, ToolOutput},
};
use serde::Deserialize;
use serde_json::json;

use crate::tools::{Settings, arguments, builtin_spec, exec_output, tool_error};

/// The prefix of the skill tools' names.
pub const SKILLS_PREFIX: &str = "skills__";

/// A skill as the tools serve it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillDoc {
    /// Its name.
    pub name: String,
    /// What it is for.
    pub description: String,
    /// Its instructions.
    pub body: String,
    /// Its other files, by `/`-separated path relative to its folder.
    pub files: Vec<(String, String)>,
}

impl SkillDoc {
    fn file(&self, path: &str) -> Option<&str> {
        self.files
            .iter()
            .find(|(name, _)| name == path)
            .map(|(_, text)| text.as_str())
    }
}

struct Shelf {
    skills: Vec<SkillDoc>,
    sandbox: Option<Settings>,
}

impl Shelf {
    fn skill(&self, name: &str) -> Result<&SkillDoc, ToolError> {
        self.skills.iter().find(|s| s.name == name).ok_or_else(|| {
            let names: Vec<&str> = self.skills.iter().map(|s| s.name.as_str()).collect();
            ToolError::new(format!(
                "no skill is named '{name}'; the skills are: {}",
                names.join(", ")
            ))
        })
    }
}

/// The three skill tools over `skills`, running scripts with `sandbox` (refused without one).
pub fn skill_tools(skills: Vec<SkillDoc>, sandbox: Option<Settings>) -> Vec<FnTool> {
    let shelf = Arc::new(Shelf { skills, sandbox });
    vec![load(shelf.clone()), read(shelf.clone()), run(shelf)]
}

#[derive(Deserialize)]
struct LoadArgs {
    name: String,
}

#[derive(Deserialize)]
struct ReadArgs {
    name: String,
    file: String,
}

#[derive(Deserialize)]
struct RunArgs {
    name: String,
    script: String,
    #[serde(default)]
    args: Vec<String>,
}

fn names(shelf: &Shelf) -> Vec<&str> {
    shelf.skills.iter().map(|s| s.name.as_str()).collect()
}

fn load(shelf: Arc<Shelf>) -> FnTool {
    let listing: Vec<String> = shelf
        .skills
        .iter()
        .map(|s| format!("- {}: {}", s.name, s.description))
        .collect();
    let spec = builtin_spec(
        SKILLS_PREFIX,
        "load",
        format!(
            "Load the instructions of a skill, and the list of its files, before doing what it \
             covers. Skills:\n{}",
            listing.join("\n")
        ),
        json!({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": names(&shelf)}},
            "required": ["name"],
            "additionalProperties": false
        }),
        SideEffects::None,
    );
    FnTool::new(spec, move |_ctx, args| {
        let shelf = shelf.clone();
        Box::pin(async move {
            let args: LoadArgs = arguments(args)?;
            let skill = shelf.skill(&args.name)?;
            let files: Vec<&str> = skill.files.iter().map(|(n, _)| n.as_str()).collect();
            Ok(ToolOutput::json(json!({
                "name": skill.name,
                "instructions": skill.body,
                "files": files,
            })))
        })
    })
}

fn read(shelf: Arc<Shelf>) -> FnTool {
    let spec = builtin_spec(
        SKILLS_PREFIX,
        "read",
        "Read a file of a skill (as listed by skills__load).".into(),
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": names(&shelf)},
                "file": {"type": "string", "description": "The file's path in the skill."}
            },
            "required": ["name", "file"],
            "additionalProperties": false
        }),
        SideEffects::None,
    );
    FnTool::new(spec, move |_ctx, args| {
        let shelf = shelf.clone();
        Box::pin(async move {
            let args: ReadArgs = arguments(args)?;
            let skill = shelf.skill(&args.name)?;
            skill.file(&args.file).map(ToolOutput::text).ok_or_else(|| {
                ToolError::new(format!(
                    "skill '{}' has no file '{}'; load it to see its files",
                    skill.name, args.file
                ))
            })
        })
    })
}

fn run(shelf: Arc<Shelf>) -> FnTool {
    let spec = builtin_spec(
        SKILLS_PREFIX,
        "run",
        "Run a script of a skill (a file under scripts/) in your sandbox: the skill's files are \
         copied to skills/<name>/ in your working folder, and the script runs from the working \
         folder (python3 for .py, sh otherwise) with the given arguments."
            .into(),
        json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": names(&shelf)},
                "script": {"type": "string", "description": "The script's path in the skill, e.g. scripts/report.py."},
                "args": {"type": "array", "items": {"type": "string"}}
            },
            "required": ["name", "script"],
            "additionalProperties": false
        }),
        SideEffects::Irreversible,
    );
    FnTool::new(spec, move |ctx, args| {
        let shelf = shelf.clone();
        Box::pin(async move {
            let args: RunArgs = arguments(args)?;
            let skill = shelf.skill(&args.name)?;
            let Some(sandbox) = &shelf.sandbox else {
                return Err(ToolError::refused(
                    rules::REQUIRED,
                    format!(
                        "refused by rule '{}': the scripts of skill '{}' run only in a sandbox, \
                         and this agent has none (declare sandbox: in its configuration)",
                        rules::REQUIRED,
                        skill.name
                    ),
                ));
            };
            if !args.script.starts_with("scripts/") || skill.file(&args.script).is_none() {
                let scripts: Vec<&str> = skill
                    .files
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .filter(|n| n.starts_with("scripts/"))
                    .collect();
                return Err(ToolError::new(format!(
                    "skill '{}' has no script '{}'; its scripts are: {}",
                    skill.name,
                    args.script,
                    scripts.join(", ")
                )));
            }
            let workspace = sandbox.workspace(&ctx)?;
            for (file, text) in &skill.files {
                let path = format!("skills/{}/{file}", skill.name);
                sandbox
                    .sandbox
                    .write(&workspace, &path, text.clone().into_bytes())
                    .await
                    .map_err(|e| tool_error(&e))?;
            }
            let script = format!("skills/{}/{}", skill.name, args.script);
            let interpreter = if args.script.ends_with(".py") {
                "python3"
            } else {
                "sh"
            };
            let mut command = format!("{interpreter} {}", quote(&script));
            for arg in &args.args {
                command.push(' ');
                command.push_str(&quote(arg));
            }
            let outcome = sandbox.exec(&ctx, command).await?;
            exec_output(&outcome)
        })
    })
}

/// `text` as one word for `/bin/sh`.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_core::tool::{Tool, ToolContext};

    fn ctx() -> ToolContext {
        ToolContext {
            tenant_id: "t".into(),
            session_id: "s".into(),
            run_id: "r".into(),
            call_id: "c".into(),
            idempotency_key: "k".into(),
            traceparent: None,
        }
    }

    fn shelf() -> Vec<FnTool> {
        skill_tools(
            vec![SkillDoc {
                name: "sums".into(),
                description: "Adds numbers.".into(),
                body: "Run scripts/sum.py.".into(),
                files: vec![("scripts/sum.py".into(), "print(1)".into())],
            }],
            None,
        )
    }

    #[tokio::test]
    async fn only_names_and_descriptions_are_offered_and_bodies_load_on_demand() {
        let tools = shelf();
        let load = &tools[0];
        assert_eq!(load.spec().name, "skills__load");
        assert!(load.spec().description.contains("- sums: Adds numbers."));
        assert!(!load.spec().description.contains("Run scripts/sum.py"));
        let out = load.call(ctx(), json!({"name": "sums"})).await.unwrap();
        assert!(out.visible_text().contains("Run scripts/sum.py."));
        let out = tools[1]
            .call(ctx(), json!({"name": "sums", "file": "scripts/sum.py"}))
            .await
            .unwrap();
        assert_eq!(out.visible_text(), "print(1)");
        let error = tools[1]
            .call(ctx(), json!({"name": "sums", "file": "nope"}))
            .await
            .unwrap_err();
        assert!(error.message.contains("no file 'nope'"));
    }

    #[tokio::test]
    async fn scripts_are_refused_without_a_sandbox() {
        let tools = shelf();
        let error = tools[2]
            .call(ctx(), json!({"name": "sums", "script": "scripts/sum.py"}))
            .await
            .unwrap_err();
        assert_eq!(error.rule, Some(rules::REQUIRED));
        assert!(
            error.message.contains("run only in a sandbox"),
            "{}",
            error.message
        );
    }

    #[test]
    fn arguments_are_quoted_for_the_shell() {
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
