//! `FileAccess` against the attacks of reference A.9: traversal, symbolic links, deny
//! patterns on nested components, extensions, special files, encodings.

#![cfg(unix)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    sync::mpsc,
    time::Duration,
};

use loom_notes_sources::{FileAccess, SourceError};
use tempfile::TempDir;

/// A temporary tree: `root/` (the allowed root) and `outside/` next to it.
struct Tree {
    _dir: TempDir,
    root: PathBuf,
    outside: PathBuf,
}

fn tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    // Canonical, so that expected paths compare equal whatever /tmp is.
    let base = fs::canonicalize(dir.path()).unwrap();
    let root = base.join("root");
    let outside = base.join("outside");
    fs::create_dir_all(&root).unwrap();
    fs::create_dir_all(&outside).unwrap();
    Tree {
        _dir: dir,
        root,
        outside,
    }
}

fn write(path: &Path, content: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

fn access(tree: &Tree) -> FileAccess {
    FileAccess::new(vec![tree.root.clone()], Vec::new())
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn no_root_configured_disables_add_file() {
    let tree = tree();
    write(&tree.root.join("a.md"), b"# A\ntext");
    let error = FileAccess::new(Vec::new(), Vec::new())
        .read(s(&tree.root.join("a.md")))
        .unwrap_err();
    assert!(matches!(error, SourceError::NoRoots), "{error:?}");
    assert!(error.to_string().contains("LOOM_NOTES_ALLOWED_ROOTS"));
    // Blank roots are dropped: still no root.
    let error = FileAccess::new(vec![PathBuf::new()], Vec::new())
        .read("a.md")
        .unwrap_err();
    assert!(matches!(error, SourceError::NoRoots), "{error:?}");
}

#[test]
fn a_plain_file_reads_with_its_heading_as_title_and_its_resolved_path_as_source() {
    let tree = tree();
    let path = tree.root.join("notes/guide.md");
    write(&path, b"\n\n  intro line\n# Le Guide  \n\nbody text\n\n");
    let doc = access(&tree).read(s(&path)).unwrap();
    assert_eq!(doc.title, "Le Guide");
    assert_eq!(doc.text, "intro line\n# Le Guide  \n\nbody text");
    assert_eq!(doc.source, s(&path));
}

#[test]
fn without_a_heading_the_title_is_the_file_stem() {
    let tree = tree();
    let path = tree.root.join("release.notes.txt");
    write(&path, b"## only a sub heading\nplain");
    let doc = access(&tree).read(s(&path)).unwrap();
    assert_eq!(doc.title, "release.notes");
}

#[test]
fn dot_dot_traversal_out_of_the_root_is_refused_with_the_resolved_path() {
    let tree = tree();
    write(&tree.outside.join("secret.md"), b"secret");
    fs::create_dir_all(tree.root.join("notes")).unwrap();
    let attempt = tree.root.join("notes/../../outside/secret.md");
    let error = access(&tree).read(s(&attempt)).unwrap_err();
    match &error {
        SourceError::OutsideRoots { target } => {
            assert_eq!(target, &tree.outside.join("secret.md"));
        }
        other => panic!("expected OutsideRoots, got {other:?}"),
    }
    assert_eq!(
        error.to_string(),
        format!(
            "path outside the allowed roots: {}",
            tree.outside.join("secret.md").display()
        )
    );
}

#[test]
fn a_root_prefix_is_not_a_root() {
    // `/x/root-evil/a.md` starts with the string `/x/root` but is not inside it.
    let tree = tree();
    let sibling = tree.root.with_file_name("root-evil/a.md");
    write(&sibling, b"x");
    let error = access(&tree).read(s(&sibling)).unwrap_err();
    assert!(
        matches!(error, SourceError::OutsideRoots { .. }),
        "{error:?}"
    );
}

#[test]
fn a_symlink_leaving_the_root_is_refused_with_the_resolved_target() {
    let tree = tree();
    let secret = tree.outside.join("secret.md");
    write(&secret, b"secret");
    symlink(&secret, tree.root.join("innocent.md")).unwrap();
    // A linked directory leaving the root too.
    symlink(&tree.outside, tree.root.join("linked-dir")).unwrap();
    for attempt in [
        tree.root.join("innocent.md"),
        tree.root.join("linked-dir/secret.md"),
    ] {
        let error = access(&tree).read(s(&attempt)).unwrap_err();
        match error {
            SourceError::OutsideRoots { target } => assert_eq!(target, secret),
            other => panic!("expected OutsideRoots, got {other:?}"),
        }
    }
}

#[test]
fn a_symlink_inside_the_root_is_followed_and_the_source_is_the_real_file() {
    let tree = tree();
    let real = tree.root.join("real/doc.md");
    write(&real, b"# Real\nbody");
    symlink(&real, tree.root.join("alias.md")).unwrap();
    // A relative link, resolved against the link's directory.
    symlink("real/doc.md", tree.root.join("relative.md")).unwrap();
    for alias in ["alias.md", "relative.md"] {
        let doc = access(&tree).read(s(&tree.root.join(alias))).unwrap();
        assert_eq!(doc.source, s(&real));
        assert_eq!(doc.title, "Real");
    }
}

#[test]
fn a_root_given_through_a_symlink_is_resolved_too() {
    let tree = tree();
    let file = tree.root.join("a.md");
    write(&file, b"text");
    let link = tree.outside.join("root-link");
    symlink(&tree.root, &link).unwrap();
    let access = FileAccess::new(vec![link.clone()], Vec::new());
    assert_eq!(access.read(s(&file)).unwrap().source, s(&file));
    assert_eq!(access.read(s(&link.join("a.md"))).unwrap().source, s(&file));
}

#[test]
fn a_symlink_loop_is_refused() {
    let tree = tree();
    symlink(tree.root.join("b.md"), tree.root.join("a.md")).unwrap();
    symlink(tree.root.join("a.md"), tree.root.join("b.md")).unwrap();
    let error = access(&tree).read(s(&tree.root.join("a.md"))).unwrap_err();
    assert!(
        matches!(error, SourceError::Unresolvable { .. }),
        "{error:?}"
    );
}

#[test]
fn deny_patterns_match_any_component_under_the_root() {
    let tree = tree();
    let cases = [
        ("proj/.git/x.md", ".git"),
        ("secrets/.env.local", ".env.*"),
        ("secrets/.env", ".env"),
        ("id_rsa.md", "id_rsa*"),
        ("keys/id_ed25519.txt", "id_ed25519*"),
        ("home/.ssh/notes.md", ".ssh"),
        ("a/node_modules/pkg/README.md", "node_modules"),
        ("py/__pycache__/x.txt", "__pycache__"),
        ("certs/server.pem", "*.pem"),
        ("deep/.aws/credentials.md", ".aws"),
        ("venv/.venv/notes.md", ".venv"),
    ];
    for (relative, pattern) in cases {
        let path = tree.root.join(relative);
        write(&path, b"content");
        let error = access(&tree).read(s(&path)).unwrap_err();
        match &error {
            SourceError::Denied {
                pattern: found,
                target,
            } => {
                assert_eq!(found, pattern, "{relative}");
                assert_eq!(target, &path);
            }
            other => panic!("{relative}: expected Denied, got {other:?}"),
        }
        assert_eq!(
            error.to_string(),
            format!(
                "path refused by the pattern '{pattern}': {}",
                path.display()
            )
        );
    }
}

#[test]
fn deny_patterns_are_case_sensitive_and_apply_only_under_the_root() {
    let tree = tree();
    // Same as Python's fnmatchcase: `.GIT` is not `.git`.
    let upper = tree.root.join(".GIT/x.md");
    write(&upper, b"content");
    assert!(access(&tree).read(s(&upper)).is_ok());
    // A root whose own path has a denied name: only the part under the root is tested.
    let root = tree.outside.join(".git/notes");
    let file = root.join("ok.md");
    write(&file, b"content");
    let access = FileAccess::new(vec![root], Vec::new());
    assert!(access.read(s(&file)).is_ok());
}

#[test]
fn configured_deny_patterns_add_to_the_built_in_ones() {
    let tree = tree();
    let access = FileAccess::new(
        vec![tree.root.clone()],
        vec![
            "private*".to_owned(),
            "  ".to_owned(),
            "draft-?.md".to_owned(),
        ],
    );
    assert_eq!(access.deny_patterns().len(), 19 + 2);
    let private = tree.root.join("private-notes/a.md");
    let draft = tree.root.join("draft-1.md");
    let kept = tree.root.join("draft-10.md");
    let env = tree.root.join(".env.md");
    for path in [&private, &draft, &kept, &env] {
        write(path, b"content");
    }
    let pattern = |path: &Path| match access.read(s(path)) {
        Err(SourceError::Denied { pattern, .. }) => Some(pattern),
        Ok(_) => None,
        Err(other) => panic!("unexpected {other:?}"),
    };
    assert_eq!(pattern(&private).as_deref(), Some("private*"));
    assert_eq!(pattern(&draft).as_deref(), Some("draft-?.md"));
    assert_eq!(pattern(&kept), None);
    assert_eq!(pattern(&env).as_deref(), Some(".env.*"));
}

#[test]
fn only_markdown_and_text_extensions_are_read() {
    let tree = tree();
    let cases: [(&str, Option<&str>); 4] = [
        ("doc.pdf", Some(".pdf")),
        ("script.md.sh", Some(".sh")),
        ("README", None),
        (".md", None),
    ];
    for (name, suffix) in cases {
        let path = tree.root.join(name);
        write(&path, b"content");
        let error = access(&tree).read(s(&path)).unwrap_err();
        match &error {
            SourceError::Extension { suffix: found } => assert_eq!(found.as_deref(), suffix),
            other => panic!("{name}: expected Extension, got {other:?}"),
        }
    }
    let error = access(&tree)
        .read(s(&tree.root.join("README")))
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "extension not allowed (none); expected: .markdown, .md, .txt"
    );
    for name in ["UPPER.MD", "long.markdown", "Mixed.Txt"] {
        let path = tree.root.join(name);
        write(&path, b"content");
        assert!(access(&tree).read(s(&path)).is_ok(), "{name}");
    }
}

#[test]
fn a_directory_named_like_a_markdown_file_is_not_a_regular_file() {
    let tree = tree();
    let dir = tree.root.join("dir.md");
    fs::create_dir_all(&dir).unwrap();
    let error = access(&tree).read(s(&dir)).unwrap_err();
    match error {
        SourceError::NotRegularFile { path, kind } => {
            assert_eq!(path, dir);
            assert_eq!(kind, "directory");
        }
        other => panic!("expected NotRegularFile, got {other:?}"),
    }
}

#[test]
fn dot_dot_inside_the_root_resolves() {
    let tree = tree();
    let up = tree.root.join("notes/UP.MD");
    write(&up, b"up");
    fs::create_dir_all(tree.root.join("notes/sub")).unwrap();
    let doc = access(&tree)
        .read(s(&tree.root.join("notes/sub/../UP.MD")))
        .unwrap();
    assert_eq!(doc.source, s(&up));
    assert_eq!(doc.title, "UP");
    // Through a component that does not exist: `..` is applied lexically, as in Python.
    let doc = access(&tree)
        .read(s(&tree.root.join("notes/missing/../UP.MD")))
        .unwrap();
    assert_eq!(doc.source, s(&up));
}

#[test]
fn relative_paths_are_taken_against_the_working_directory() {
    let tree = tree();
    let file = tree.root.join("rel.md");
    write(&file, b"relative");
    let cwd = fs::canonicalize(std::env::current_dir().unwrap()).unwrap();
    let ups = cwd.components().count() - 1;
    let relative = format!(
        "{}{}",
        "../".repeat(ups),
        file.strip_prefix("/").unwrap().display()
    );
    let doc = access(&tree).read(&relative).unwrap();
    assert_eq!(doc.source, s(&file));
}

#[test]
fn tilde_expands_to_home() {
    let home = PathBuf::from(std::env::var_os("HOME").expect("HOME is set for tests"));
    let dir = tempfile::tempdir_in(&home).unwrap();
    let name = dir.path().file_name().unwrap().to_str().unwrap().to_owned();
    let file = dir.path().join("home-note.md");
    write(&file, b"# From home\ntext");
    // The root itself given with `~`, the path too.
    let access = FileAccess::new(vec![PathBuf::from(format!("~/{name}"))], Vec::new());
    let doc = access.read(&format!("~/{name}/home-note.md")).unwrap();
    assert_eq!(doc.title, "From home");
    assert_eq!(
        doc.source,
        fs::canonicalize(&file).unwrap().to_str().unwrap()
    );
}

#[test]
fn invalid_utf8_is_refused_with_its_position() {
    let tree = tree();
    let path = tree.root.join("latin1.txt");
    write(&path, b"hello \xff world");
    let error = access(&tree).read(s(&path)).unwrap_err();
    match &error {
        SourceError::InvalidUtf8 {
            path: found,
            position,
            byte,
        } => {
            assert_eq!(found, &path);
            assert_eq!((*position, *byte), (6, 0xff));
        }
        other => panic!("expected InvalidUtf8, got {other:?}"),
    }
    assert!(error.to_string().contains("0xff at position 6"), "{error}");
}

#[test]
fn empty_and_blank_files_are_refused() {
    let tree = tree();
    for (name, content) in [("empty.md", &b""[..]), ("blank.md", b" \n\t\n  ")] {
        let path = tree.root.join(name);
        write(&path, content);
        let error = access(&tree).read(s(&path)).unwrap_err();
        match error {
            SourceError::EmptyFile { path: found } => assert_eq!(found, path),
            other => panic!("{name}: expected EmptyFile, got {other:?}"),
        }
    }
}

#[test]
fn a_missing_file_is_not_found() {
    let tree = tree();
    let path = tree.root.join("nowhere/missing.md");
    let error = access(&tree).read(s(&path)).unwrap_err();
    match &error {
        SourceError::FileNotFound { path: found } => assert_eq!(found, &path),
        other => panic!("expected FileNotFound, got {other:?}"),
    }
    assert_eq!(
        error.to_string(),
        format!("file not found: {}", path.display())
    );
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let tree = tree();
    let fifo = tree.root.join("pipe.md");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let access = access(&tree);
    let (send, receive) = mpsc::channel();
    let path = fifo.clone();
    // No writer ever opens the FIFO: a blocking open would hang this thread.
    std::thread::spawn(move || send.send(access.read(s(&path))).unwrap());
    let result = receive
        .recv_timeout(Duration::from_secs(10))
        .expect("reading a FIFO must not block");
    match result {
        Err(SourceError::NotRegularFile { path, kind }) => {
            assert_eq!(path, fifo);
            assert_eq!(kind, "fifo");
        }
        other => panic!("expected NotRegularFile, got {other:?}"),
    }
}

#[test]
fn files_over_the_size_cap_are_refused() {
    let tree = tree();
    let path = tree.root.join("big.txt");
    write(&path, &[b'a'; 11]);
    let capped = access(&tree).with_max_bytes(10);
    match capped.read(s(&path)) {
        Err(SourceError::FileTooLarge { path: found, max }) => {
            assert_eq!((found, max), (path.clone(), 10));
        }
        other => panic!("expected FileTooLarge, got {other:?}"),
    }
    write(&path, &[b'a'; 10]);
    assert_eq!(capped.read(s(&path)).unwrap().text.len(), 10);
}
