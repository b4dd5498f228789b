//! `local_files`: every refusal rule, and the allowed operations, on a temporary tree.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::ctx;

use std::{fs, os::unix::fs::symlink};

use loom_builtins::{BuiltinError, Folder, Right, Rights, local_files, refusal_rule, rules};
use loom_core::tool::{Approval, FnTool, SideEffects, Tool, ToolError, ToolOutput};
use serde_json::{Value, json};
use tempfile::TempDir;

/// `<tmp>/docs` (the root: `a.txt`, `sub/b.md`, links) beside `<tmp>/secret/s.txt`.
fn tree() -> TempDir {
    let tmp = TempDir::new().unwrap();
    let docs = tmp.path().join("docs");
    let secret = tmp.path().join("secret");
    fs::create_dir_all(docs.join("sub")).unwrap();
    fs::create_dir_all(&secret).unwrap();
    fs::write(docs.join("a.txt"), "hello").unwrap();
    fs::write(docs.join("sub/b.md"), "# B").unwrap();
    fs::write(secret.join("s.txt"), "top secret").unwrap();
    symlink(&secret, docs.join("link_out")).unwrap();
    symlink(secret.join("s.txt"), docs.join("file_out")).unwrap();
    symlink(secret.join("missing.txt"), docs.join("dangling")).unwrap();
    symlink(docs.join("sub"), docs.join("link_in")).unwrap();
    tmp
}

fn tool(tmp: &TempDir, rights: &[Right]) -> FnTool {
    local_files(vec![Folder::new(
        "docs",
        tmp.path().join("docs"),
        Rights::without_approval(rights.iter().copied()),
    )])
    .unwrap()
}

async fn call(tool: &FnTool, arguments: Value) -> Result<ToolOutput, ToolError> {
    tool.call(ctx(), arguments).await
}

async fn refused(tool: &FnTool, arguments: Value) -> (String, String) {
    let error = call(tool, arguments.clone())
        .await
        .expect_err(&format!("{arguments} should be refused"));
    let rule = refusal_rule(&error)
        .unwrap_or_else(|| panic!("not a refusal: {}", error.message))
        .to_owned();
    (rule, error.message)
}

const ALL: &[Right] = &[Right::Read, Right::Write, Right::Overwrite, Right::Delete];

#[tokio::test]
async fn parent_components_are_refused() {
    let tmp = tree();
    let tool = tool(&tmp, ALL);
    for path in ["../secret/s.txt", "sub/../../secret/s.txt", "sub/.."] {
        let (rule, message) =
            refused(&tool, json!({"op": "read", "folder": "docs", "path": path})).await;
        assert_eq!(rule, rules::NO_PARENT, "{message}");
    }
    let (rule, _) = refused(
        &tool,
        json!({"op": "write", "folder": "docs", "path": "../escape.txt", "content": "x"}),
    )
    .await;
    assert_eq!(rule, rules::NO_PARENT);
    assert!(!tmp.path().join("escape.txt").exists());
}

#[tokio::test]
async fn absolute_paths_must_resolve_inside_the_folder() {
    let tmp = tree();
    let tool = tool(&tmp, ALL);
    let outside = tmp.path().join("secret/s.txt");
    let (rule, message) = refused(
        &tool,
        json!({"op": "read", "folder": "docs", "path": outside.to_str().unwrap()}),
    )
    .await;
    assert_eq!(rule, rules::INSIDE_ROOTS);
    assert!(
        message.contains("resolves outside the folder 'docs'"),
        "{message}"
    );
    assert!(!message.contains("top secret"));
    for path in ["/etc/passwd", "/nonexistent/dir/file.txt"] {
        let (rule, _) = refused(&tool, json!({"op": "read", "folder": "docs", "path": path})).await;
        assert_eq!(rule, rules::INSIDE_ROOTS, "{path}");
    }
    let (rule, _) = refused(
        &tool,
        json!({"op": "write", "folder": "docs", "path": "/tmp/loom-escape.txt", "content": "x"}),
    )
    .await;
    assert_eq!(rule, rules::INSIDE_ROOTS);
    // An absolute path inside the folder is fine.
    let inside = tmp.path().join("docs/a.txt");
    let output = call(
        &tool,
        json!({"op": "read", "folder": "docs", "path": inside.to_str().unwrap()}),
    )
    .await
    .unwrap();
    assert_eq!(output.visible_text(), "hello");
}

#[tokio::test]
async fn symlinks_leaving_the_folder_are_refused() {
    let tmp = tree();
    let tool = tool(&tmp, ALL);
    for arguments in [
        json!({"op": "read", "folder": "docs", "path": "file_out"}),
        json!({"op": "read", "folder": "docs", "path": "link_out/s.txt"}),
        json!({"op": "list", "folder": "docs", "path": "link_out"}),
        json!({"op": "write", "folder": "docs", "path": "file_out", "content": "pwned"}),
        json!({"op": "write", "folder": "docs", "path": "link_out/new.txt", "content": "x"}),
        json!({"op": "write", "folder": "docs", "path": "dangling", "content": "x"}),
        json!({"op": "delete", "folder": "docs", "path": "file_out"}),
    ] {
        let (rule, message) = refused(&tool, arguments.clone()).await;
        assert_eq!(rule, rules::INSIDE_ROOTS, "{arguments}: {message}");
    }
    let secret = tmp.path().join("secret");
    assert_eq!(
        fs::read_to_string(secret.join("s.txt")).unwrap(),
        "top secret"
    );
    assert!(!secret.join("new.txt").exists());
    assert!(!secret.join("missing.txt").exists());
    // A link that stays inside is followed.
    let output = call(
        &tool,
        json!({"op": "read", "folder": "docs", "path": "link_in/b.md"}),
    )
    .await
    .unwrap();
    assert_eq!(output.visible_text(), "# B");
}

#[tokio::test]
async fn the_folder_must_be_declared() {
    let tmp = tree();
    let tool = tool(&tmp, ALL);
    let (rule, message) =
        refused(&tool, json!({"op": "list", "folder": "secret", "path": ""})).await;
    assert_eq!(rule, rules::DECLARED_FOLDER);
    assert!(
        message.contains("the declared folders are: docs"),
        "{message}"
    );
}

#[tokio::test]
async fn rights_are_enforced_per_operation() {
    let tmp = tree();
    let read_only = tool(&tmp, &[Right::Read]);
    let (rule, message) = refused(
        &read_only,
        json!({"op": "write", "folder": "docs", "path": "new.txt", "content": "x"}),
    )
    .await;
    assert_eq!(rule, rules::FOLDER_RIGHTS);
    assert!(message.contains("needs the right 'write'"), "{message}");
    assert!(!tmp.path().join("docs/new.txt").exists());
    let (rule, _) = refused(
        &read_only,
        json!({"op": "delete", "folder": "docs", "path": "a.txt"}),
    )
    .await;
    assert_eq!(rule, rules::FOLDER_RIGHTS);

    // `write` creates, but replacing needs `overwrite`.
    let write_only = tool(&tmp, &[Right::Write]);
    let (rule, message) = refused(
        &write_only,
        json!({"op": "write", "folder": "docs", "path": "a.txt", "content": "gone"}),
    )
    .await;
    assert_eq!(rule, rules::FOLDER_RIGHTS);
    assert!(message.contains("needs the right 'overwrite'"), "{message}");
    assert_eq!(
        fs::read_to_string(tmp.path().join("docs/a.txt")).unwrap(),
        "hello"
    );
    let (rule, _) = refused(
        &write_only,
        json!({"op": "read", "folder": "docs", "path": "a.txt"}),
    )
    .await;
    assert_eq!(rule, rules::FOLDER_RIGHTS);
    call(
        &write_only,
        json!({"op": "write", "folder": "docs", "path": "fresh.txt", "content": "new"}),
    )
    .await
    .unwrap();
    assert_eq!(
        fs::read_to_string(tmp.path().join("docs/fresh.txt")).unwrap(),
        "new"
    );
}

#[tokio::test]
async fn list_read_write_and_delete_inside_the_folder() {
    let tmp = tree();
    let tool = tool(&tmp, ALL);
    let listing = call(&tool, json!({"op": "list", "folder": "docs", "path": ""}))
        .await
        .unwrap()
        .data
        .unwrap();
    assert_eq!(listing["path"], ".");
    let entries = listing["entries"].as_array().unwrap();
    let names: Vec<_> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "a.txt", "dangling", "file_out", "link_in", "link_out", "sub"
        ]
    );
    assert_eq!(
        entries[0],
        json!({"name": "a.txt", "kind": "file", "size": 5})
    );
    assert_eq!(entries[3]["kind"], "symlink");
    assert_eq!(
        entries[5],
        json!({"name": "sub", "kind": "dir", "size": null})
    );

    let read = call(
        &tool,
        json!({"op": "read", "folder": "docs", "path": "./sub/b.md"}),
    )
    .await
    .unwrap();
    assert_eq!(read.visible_text(), "# B");

    let written = call(
        &tool,
        json!({"op": "write", "folder": "docs", "path": "notes/2026/today.md", "content": "- done"}),
    )
    .await
    .unwrap()
    .data
    .unwrap();
    assert_eq!(
        written,
        json!({"folder": "docs", "path": "notes/2026/today.md", "bytes": 6, "created": true})
    );
    let replaced = call(
        &tool,
        json!({"op": "write", "folder": "docs", "path": "notes/2026/today.md", "content": "- redone"}),
    )
    .await
    .unwrap()
    .data
    .unwrap();
    assert_eq!(replaced["created"], false);
    let docs = tmp.path().join("docs");
    assert_eq!(
        fs::read_to_string(docs.join("notes/2026/today.md")).unwrap(),
        "- redone"
    );

    call(
        &tool,
        json!({"op": "delete", "folder": "docs", "path": "notes/2026/today.md"}),
    )
    .await
    .unwrap();
    assert!(!docs.join("notes/2026/today.md").exists());

    let missing = call(
        &tool,
        json!({"op": "read", "folder": "docs", "path": "nope.txt"}),
    )
    .await
    .unwrap_err();
    assert_eq!(missing.message, "'nope.txt' does not exist");
}

#[tokio::test]
async fn reads_above_one_mebibyte_are_refused() {
    let tmp = tree();
    fs::write(tmp.path().join("docs/big.txt"), "x".repeat(1024 * 1024 + 1)).unwrap();
    fs::write(tmp.path().join("docs/bin"), [0xff, 0xfe, 0x00]).unwrap();
    let tool = tool(&tmp, ALL);
    let (rule, message) = refused(
        &tool,
        json!({"op": "read", "folder": "docs", "path": "big.txt"}),
    )
    .await;
    assert_eq!(rule, rules::SIZE_CAP);
    assert!(message.contains("1 MiB"), "{message}");
    let error = call(
        &tool,
        json!({"op": "read", "folder": "docs", "path": "bin"}),
    )
    .await
    .unwrap_err();
    assert!(
        error.message.contains("not UTF-8 text"),
        "{}",
        error.message
    );
    let (rule, _) = refused(
        &tool,
        json!({"op": "write", "folder": "docs", "path": "huge.txt", "content": "y".repeat(1024 * 1024 + 1)}),
    )
    .await;
    assert_eq!(rule, rules::SIZE_CAP);
}

#[test]
fn declarations_follow_the_rights() {
    let tmp = tree();
    let reading = tool(&tmp, &[Right::Read]);
    assert_eq!(reading.spec().declarations.side_effects, SideEffects::None);
    assert!(reading.spec().declarations.idempotent);
    let writing = tool(&tmp, &[Right::Read, Right::Write]);
    assert_eq!(
        writing.spec().declarations.side_effects,
        SideEffects::Reversible
    );
    assert_eq!(
        writing.spec().input_schema["properties"]["folder"]["enum"],
        json!(["docs"])
    );
    assert!(writing.spec().description.contains("docs (read, write)"));
}

#[test]
fn rights_tell_which_need_approval() {
    // The list form gives overwrite and delete an `always` approval, as the reference does.
    let listed = Rights::list([Right::Read, Right::Write, Right::Overwrite, Right::Delete]);
    assert_eq!(listed.needing_approval(), [Right::Overwrite, Right::Delete]);
    let explicit = Rights::none()
        .with(Right::Read, Approval::Never)
        .with(Right::Overwrite, Approval::Never);
    assert!(explicit.needing_approval().is_empty());
    assert_eq!(explicit.approval(Right::Overwrite), Some(Approval::Never));
    assert_eq!(explicit.approval(Right::Write), None);
    let folder: Folder = serde_json::from_value(
        json!({"name": "docs", "path": "/x", "rights": {"read": "never", "write": "always"}}),
    )
    .unwrap();
    assert_eq!(folder.rights.needing_approval(), [Right::Write]);
}

#[test]
fn bad_configurations_are_errors() {
    let tmp = tree();
    let docs = tmp.path().join("docs");
    let read = || Rights::list([Right::Read]);
    assert!(matches!(local_files(vec![]), Err(BuiltinError::NoFolder)));
    assert!(matches!(
        local_files(vec![Folder::new("Docs", &docs, read())]),
        Err(BuiltinError::InvalidFolderName(_))
    ));
    assert!(matches!(
        local_files(vec![
            Folder::new("docs", &docs, read()),
            Folder::new("docs", &docs, read())
        ]),
        Err(BuiltinError::DuplicateFolder(_))
    ));
    assert!(matches!(
        local_files(vec![Folder::new("docs", &docs, Rights::none())]),
        Err(BuiltinError::NoRight(_))
    ));
    assert!(matches!(
        local_files(vec![Folder::new("gone", tmp.path().join("gone"), read())]),
        Err(BuiltinError::FolderUnavailable { .. })
    ));
    assert!(matches!(
        local_files(vec![Folder::new("file", docs.join("a.txt"), read())]),
        Err(BuiltinError::NotADirectory { .. })
    ));
}

/// Swaps `docs/d` between a real directory (its files moved aside to `docs/hold` and back)
/// and a symbolic link to `secret`, until `stop`. A directory the tool created at `d` while it
/// was absent is removed, so the real one can come back.
fn swap_until(
    docs: &std::path::Path,
    secret: &std::path::Path,
    stop: &std::sync::atomic::AtomicBool,
) -> u64 {
    use std::sync::atomic::Ordering;
    let (d, hold) = (docs.join("d"), docs.join("hold"));
    let mut swaps = 0;
    while !stop.load(Ordering::Relaxed) {
        if fs::rename(&d, &hold).is_err() {
            continue;
        }
        if symlink(secret, &d).is_ok() {
            swaps += 1;
            for _ in 0..50 {
                std::hint::spin_loop();
            }
        }
        loop {
            match fs::symlink_metadata(&d) {
                Ok(meta) if meta.is_symlink() => drop(fs::remove_file(&d)),
                Ok(_) => drop(fs::remove_dir_all(&d)),
                Err(_) => {}
            }
            if fs::rename(&hold, &d).is_ok() {
                break;
            }
        }
    }
    swaps
}

/// The race of issue 13: a directory on the path swapped for a link leading out between the
/// tool's check and its open. Many reads, creations and overwrites through it while another
/// thread swaps it: nothing outside the folder is ever read or written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_swapped_for_a_link_during_calls_never_lets_one_out() {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    const CALLS: usize = 300;
    let tmp = TempDir::new().unwrap();
    let docs = tmp.path().join("docs");
    let secret = tmp.path().join("secret");
    fs::create_dir_all(docs.join("d")).unwrap();
    fs::create_dir_all(&secret).unwrap();
    fs::write(docs.join("d/x.txt"), "inside").unwrap();
    fs::write(secret.join("x.txt"), "top secret").unwrap();
    let tool = local_files(vec![Folder::new(
        "docs",
        &docs,
        Rights::without_approval([Right::Read, Right::Write, Right::Overwrite]),
    )])
    .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (docs, secret, stop) = (docs.clone(), secret.clone(), stop.clone());
        std::thread::spawn(move || swap_until(&docs, &secret, &stop))
    };
    let mut secrets_read = 0;
    for i in 0..CALLS {
        let read = call(
            &tool,
            json!({"op": "read", "folder": "docs", "path": "d/x.txt"}),
        )
        .await;
        if read.is_ok_and(|output| output.visible_text().contains("top secret")) {
            secrets_read += 1;
        }
        let _ = call(
            &tool,
            json!({"op": "write", "folder": "docs", "path": format!("d/new-{i}.txt"), "content": "x"}),
        )
        .await;
        let _ = call(
            &tool,
            json!({"op": "write", "folder": "docs", "path": "d/x.txt", "content": "overwritten"}),
        )
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(swaps > 0, "the directory was never swapped");
    assert_eq!(
        secrets_read, 0,
        "{secrets_read} of {CALLS} reads escaped the folder"
    );
    let mut outside: Vec<String> = fs::read_dir(&secret)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    outside.sort();
    assert_eq!(outside, ["x.txt"], "files were created outside the folder");
    assert_eq!(
        fs::read_to_string(secret.join("x.txt")).unwrap(),
        "top secret",
        "a write went through the link"
    );
}

/// A FIFO inside the folder is opened without blocking and refused as not a file.
#[tokio::test]
async fn a_fifo_is_refused_without_waiting_for_a_writer() {
    let tmp = tree();
    nix::unistd::mkfifo(&tmp.path().join("docs/pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let tool = tool(&tmp, ALL);
    for arguments in [
        json!({"op": "read", "folder": "docs", "path": "pipe"}),
        json!({"op": "write", "folder": "docs", "path": "pipe", "content": "x"}),
    ] {
        let outcome = tokio::time::timeout(
            std::time::Duration::from_secs(60),
            call(&tool, arguments.clone()),
        )
        .await
        .expect("the call hung on the FIFO");
        let error = outcome.unwrap_err();
        assert!(
            error.message.contains("'pipe' is not a file")
                || error.message.contains("cannot access 'pipe'"),
            "{arguments}: {}",
            error.message
        );
    }
}
