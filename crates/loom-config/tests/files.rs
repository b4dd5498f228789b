//! Files a configuration names are regular files under their folder, at most 1 MiB: a link to
//! `/dev/zero`, a FIFO, a `..` path, a link leading out and an oversize file are each a
//! located error, and loading never hangs on them.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{os::unix::fs::symlink, path::Path, sync::mpsc, time::Duration};

use common::{dir_with, no_env};
use loom_config::ConfigErrorKind;

const ROOT: &str = "\
version: 1
models:
  - id: fake-1
    sdk: fake
    model: scripted
";

fn agent(system_file: &str) -> String {
    format!("name: devis\nmain:\n  model: fake-1\n  system_file: {system_file}\n")
}

/// Loads `dir/loom.yaml` on another thread: a load that hangs (a FIFO opened for reading)
/// fails the test after a minute instead of blocking it for ever.
fn load(dir: &Path) -> Result<loom_config::Config, loom_config::ConfigError> {
    let path = dir.join("loom.yaml");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = sender.send(loom_config::load(&path, None, &no_env));
    });
    receiver
        .recv_timeout(Duration::from_secs(60))
        .expect("loading the configuration hung")
}

fn refusal(dir: &Path) -> (String, ConfigErrorKind) {
    let error = load(dir).expect_err("the configuration should be refused");
    let text = error.to_string();
    // Errors name the file with the config file's directory: keep what follows it.
    let shown = text
        .strip_prefix(&format!("{}/", dir.display()))
        .unwrap_or(&text)
        .to_owned();
    (shown, error.kind)
}

const RULE: &str = "a prompt file is a regular file of at most 1 MiB under prompts_dir (prompts)";

#[test]
fn a_prompt_linked_to_dev_zero_is_refused() {
    let dir = dir_with(&[
        ("loom.yaml", ROOT),
        ("agents/devis.yaml", &agent("devis.md")),
    ]);
    std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
    symlink("/dev/zero", dir.path().join("prompts/devis.md")).unwrap();
    let (message, kind) = refusal(dir.path());
    assert_eq!(
        message,
        format!(
            "agents/devis.yaml:4:16 main.system_file: system prompt file prompts/devis.md: it \
             resolves outside the folder; {RULE}"
        )
    );
    assert_eq!(kind, ConfigErrorKind::Invalid);
}

#[test]
fn a_device_inside_the_folder_is_not_a_regular_file() {
    // A prompts folder that is /dev itself: `zero` is inside it, but not a regular file.
    let dir = dir_with(&[
        ("loom.yaml", &format!("{ROOT}prompts_dir: /dev\n")),
        ("agents/devis.yaml", &agent("zero")),
    ]);
    let (message, _) = refusal(dir.path());
    assert_eq!(
        message,
        "agents/devis.yaml:4:16 main.system_file: system prompt file /dev/zero: not a regular \
         file (a directory, FIFO, device or socket); a prompt file is a regular file of at most \
         1 MiB under prompts_dir (/dev)"
    );
}

#[test]
fn a_fifo_prompt_is_refused_without_waiting_for_a_writer() {
    let dir = dir_with(&[
        ("loom.yaml", ROOT),
        ("agents/devis.yaml", &agent("devis.md")),
    ]);
    std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
    nix::unistd::mkfifo(
        &dir.path().join("prompts/devis.md"),
        nix::sys::stat::Mode::S_IRWXU,
    )
    .unwrap();
    let (message, _) = refusal(dir.path());
    assert_eq!(
        message,
        format!(
            "agents/devis.yaml:4:16 main.system_file: system prompt file prompts/devis.md: not \
             a regular file (a directory, FIFO, device or socket); {RULE}"
        )
    );
}

#[test]
fn a_parent_path_is_refused_before_anything_is_read() {
    let dir = dir_with(&[
        ("loom.yaml", ROOT),
        ("agents/devis.yaml", &agent("../../../etc/passwd")),
        ("prompts/devis.md", "unused"),
    ]);
    let (message, kind) = refusal(dir.path());
    assert!(
        message.starts_with(
            "agents/devis.yaml:4:16 main.system_file: system prompt file prompts/../../../etc/passwd: \
             an absolute path or a '..' component would leave the folder;"
        ),
        "{message}"
    );
    assert_eq!(kind, ConfigErrorKind::Invalid);
    // An absolute path too.
    let dir = dir_with(&[
        ("loom.yaml", ROOT),
        ("agents/devis.yaml", &agent("/etc/passwd")),
    ]);
    let (message, _) = refusal(dir.path());
    assert!(
        message.contains("main.system_file: system prompt file /etc/passwd: an absolute path"),
        "{message}"
    );
}

#[test]
fn a_link_leading_out_of_the_folder_is_refused() {
    let dir = dir_with(&[
        ("loom.yaml", ROOT),
        ("agents/devis.yaml", &agent("devis.md")),
        ("secret.txt", "not a prompt"),
    ]);
    std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
    symlink(
        dir.path().join("secret.txt"),
        dir.path().join("prompts/devis.md"),
    )
    .unwrap();
    let (message, _) = refusal(dir.path());
    assert_eq!(
        message,
        format!(
            "agents/devis.yaml:4:16 main.system_file: system prompt file prompts/devis.md: it \
             resolves outside the folder; {RULE}"
        )
    );
    // A link that stays inside is followed.
    std::fs::remove_file(dir.path().join("prompts/devis.md")).unwrap();
    std::fs::write(dir.path().join("prompts/shared.md"), "Tu es {{ agent }}.").unwrap();
    symlink(
        dir.path().join("prompts/shared.md"),
        dir.path().join("prompts/devis.md"),
    )
    .unwrap();
    let config = load(dir.path()).unwrap();
    assert_eq!(
        config.render_system("devis", "default").unwrap(),
        "Tu es devis."
    );
}

#[test]
fn an_oversize_prompt_is_refused() {
    let dir = dir_with(&[
        ("loom.yaml", ROOT),
        ("agents/devis.yaml", &agent("devis.md")),
    ]);
    std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
    let size = loom_config::MAX_FILE_BYTES + 1;
    std::fs::write(
        dir.path().join("prompts/devis.md"),
        "x".repeat(usize::try_from(size).unwrap()),
    )
    .unwrap();
    let (message, _) = refusal(dir.path());
    assert_eq!(
        message,
        format!(
            "agents/devis.yaml:4:16 main.system_file: system prompt file prompts/devis.md: \
             {size} bytes, above the limit of 1048576 bytes (1 MiB); {RULE}"
        )
    );
}

#[test]
fn agent_files_follow_the_same_rules() {
    let dir = dir_with(&[("loom.yaml", ROOT), ("outside.yaml", &agent("devis.md"))]);
    std::fs::create_dir_all(dir.path().join("agents")).unwrap();
    symlink(
        dir.path().join("outside.yaml"),
        dir.path().join("agents/devis.yaml"),
    )
    .unwrap();
    let (message, _) = refusal(dir.path());
    assert_eq!(
        message,
        "agents/devis.yaml (root): agent file: it resolves outside the folder; an agent file is \
         a regular file of at most 1 MiB under agents_dir"
    );
    std::fs::remove_file(dir.path().join("agents/devis.yaml")).unwrap();
    symlink("/dev/zero", dir.path().join("agents/devis.yaml")).unwrap();
    let (message, _) = refusal(dir.path());
    assert!(
        message.contains("agent file: it resolves outside the folder"),
        "{message}"
    );
}
