//! The trace viewer (`/ui`) end to end. Over plain HTTP: its files, its security headers, its
//! `whoami` behind the API keys, and its switch (off under `prod` unless `server.http.ui:
//! true`). In a real browser: Debian's Chromium, headless, driven by playwright-core
//! (`crates/loom-http/ui/e2e/viewer.mjs`) against a real `loom serve` of the `equipe` example
//! (the `loom` CLI with its tools: sub-agents, a tool needing approval, a tool that waits):
//! the runs list and its filters, a run's tree, a run followed live, approve, and a key without
//! `read_content`. Screenshots are saved under `<target>/tmp/ui-screenshots/` (the path is
//! printed). The browser test is skipped when Chromium, node or the UI's `node_modules` are
//! missing, and fails then when `LOOM_REQUIRE_SERVICES=1` (as `.ci/run` sets, which installs
//! them).

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use common::{
    copy_example, example_bin, repo,
    server::{Server, request, request_with},
    text,
};
use serde_json::Value;

/// Where Debian's Chromium is, unless `LOOM_UI_CHROMIUM` says otherwise.
const CHROMIUM: &str = "/usr/bin/chromium";

/// The viewer's sources, its build and its browser test.
fn ui_dir() -> PathBuf {
    repo().join("crates/loom-http/ui")
}

/// Creates a key with `scopes` with the project's binary; the key and its YAML entry.
fn key(bin: &Path, dir: &Path, id: &str, scopes: &[&str]) -> (String, String) {
    let mut args = vec!["keys", "create", id];
    for scope in scopes {
        args.extend(["--scope", scope]);
    }
    let output = Command::new(bin)
        .current_dir(dir)
        .args(&args)
        .output()
        .unwrap();
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", text(&output.stderr));
    let (key, entry) = stdout.split_once("\n\n").unwrap();
    (key.trim().to_owned(), entry.to_owned())
}

/// A copy of the equipe example with an admin-like key and a read-only key (their YAML
/// entries joined under `security.api_keys`), and `extra` appended to its `loom.yaml`.
fn project(extra: &str) -> (tempfile::TempDir, String, String) {
    let dir = copy_example("equipe");
    let bin = example_bin("equipe");
    let (admin, admin_entry) = key(
        &bin,
        dir.path(),
        "viewer-admin",
        &["run", "read", "read_content", "approve"],
    );
    let (reader, reader_entry) = key(&bin, dir.path(), "viewer-reader", &["read"]);
    let reader_item = reader_entry
        .lines()
        .skip_while(|line| !line.trim_start().starts_with("- "))
        .collect::<Vec<_>>()
        .join("\n");
    let config = dir.path().join("loom.yaml");
    let mut yaml = fs::read_to_string(&config).unwrap();
    yaml.push_str(&format!("\n{admin_entry}\n{reader_item}\n{extra}"));
    fs::write(&config, yaml).unwrap();
    (dir, admin, reader)
}

fn bearer(key: &str) -> String {
    format!("Authorization: Bearer {key}\r\n")
}

/// The headers of a response to `GET path`, lower-cased, and its status.
fn head(address: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(common::server::PATIENCE))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let (headers, _) = response.split_once("\r\n\r\n").unwrap();
    (status, headers.to_ascii_lowercase())
}

#[test]
fn the_viewer_is_served_with_its_headers_and_whoami_needs_a_key() {
    let (dir, admin, reader) = project("");
    let server = Server::start(
        &example_bin("equipe"),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
    );
    let address = server.address.clone();
    let (status, headers) = head(&address, "/ui");
    assert_eq!(status, 303, "{headers}");
    assert!(headers.contains("location: /ui/"), "{headers}");
    for (path, kind) in [
        ("/ui/", "text/html"),
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let (status, headers) = head(&address, path);
        assert_eq!(status, 200, "{path}: {headers}");
        assert!(
            headers.contains(&format!("content-type: {kind}")),
            "{headers}"
        );
        assert!(
            headers.contains("content-security-policy: default-src 'none'; script-src 'self';"),
            "{headers}"
        );
        assert!(headers.contains("x-frame-options: deny"), "{headers}");
    }
    let (_, page) = request(&address, "GET", "/ui/", "");
    assert!(
        page.contains(r#"<script type="module" src="app.js">"#),
        "{page}"
    );
    assert!(
        !page.contains("http"),
        "the page loads nothing from elsewhere:\n{page}"
    );

    let (status, body) = request(&address, "GET", "/ui/whoami", "");
    assert_eq!(status, 401, "{body}");
    let (status, body) = request_with(&address, "GET", "/ui/whoami", &bearer(&admin), "");
    assert_eq!(status, 200, "{body}");
    let who: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        who,
        serde_json::json!({"tenant": "default", "key": "viewer-admin", "open": false,
            "scopes": ["run", "read", "read_content", "approve"]})
    );
    let (status, body) = request_with(&address, "GET", "/ui/whoami", &bearer(&reader), "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["scopes"],
        serde_json::json!(["read"])
    );
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn the_viewer_is_off_under_prod_unless_the_configuration_turns_it_on() {
    let prod = [
        "--config",
        "loom.yaml",
        "--profile",
        "prod",
        "serve",
        "--port",
        "0",
    ];
    for (extra, served) in [("", false), ("server: {http: {ui: true}}\n", true)] {
        let (dir, admin, _) = project(extra);
        let server = Server::start(&example_bin("equipe"), dir.path(), &prod);
        let address = server.address.clone();
        let (status, body) = request(&address, "GET", "/ui/", "");
        assert_eq!(status, if served { 200 } else { 404 }, "{extra}: {body}");
        let (status, body) = request_with(&address, "GET", "/ui/whoami", &bearer(&admin), "");
        assert_eq!(status, if served { 200 } else { 404 }, "{extra}: {body}");
        let (code, log) = server.stop();
        assert_eq!(code, Some(0), "{log}");
    }
    // And a developer can turn it off.
    let (dir, _, _) = project("server: {http: {ui: false}}\n");
    let server = Server::start(
        &example_bin("equipe"),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
    );
    let (status, _) = request(&server.address.clone(), "GET", "/ui/", "");
    assert_eq!(status, 404);
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

/// Chromium, node and the UI's node_modules, or why the browser test cannot run.
fn browser_tools() -> Result<(PathBuf, PathBuf), String> {
    let chromium = std::env::var_os("LOOM_UI_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(CHROMIUM));
    if !chromium.exists() {
        return Err(format!(
            "{} is missing (apt-get install chromium)",
            chromium.display()
        ));
    }
    let node = Command::new("node").arg("--version").output();
    if !node.is_ok_and(|o| o.status.success()) {
        return Err("node is missing".to_owned());
    }
    let modules = ui_dir().join("node_modules/playwright-core");
    if !modules.is_dir() {
        return Err(format!(
            "{} is missing (npm ci in crates/loom-http/ui)",
            modules.display()
        ));
    }
    // A fresh folder each time: no screenshot of an earlier run is left to mislead a reader.
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui-screenshots");
    let _ = fs::remove_dir_all(&shots);
    fs::create_dir_all(&shots).unwrap();
    Ok((chromium, shots))
}

/// Opens a run of the secretariat on `message` in `session` and waits for its answer: the run.
fn seed(address: &str, key: &str, session: &str, message: &str, status: &str) -> String {
    let body = serde_json::json!({"message": message, "session_id": session}).to_string();
    let (code, answer) = request_with(
        address,
        "POST",
        "/v1/agents/secretariat/runs",
        &bearer(key),
        &body,
    );
    assert_eq!(code, 201, "{answer}");
    let result: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(result["status"], status, "{answer}");
    format!("{session}/{}", result["run_id"].as_str().unwrap())
}

fn status_of(address: &str, key: &str, run: &str) -> String {
    let (session, run_id) = run.split_once('/').unwrap();
    let (code, body) = request_with(
        address,
        "GET",
        &format!("/v1/runs/{run_id}?session_id={session}"),
        &bearer(key),
        "",
    );
    assert_eq!(code, 200, "{body}");
    let result: Value = serde_json::from_str(&body).unwrap();
    result["status"].as_str().unwrap().to_owned()
}

#[test]
fn the_viewer_works_in_a_real_browser() {
    let (chromium, shots) = match browser_tools() {
        Ok(tools) => tools,
        Err(missing) => {
            assert!(
                std::env::var("LOOM_REQUIRE_SERVICES").as_deref() != Ok("1"),
                "the browser test cannot run: {missing}"
            );
            eprintln!("skipped: {missing}");
            return;
        }
    };
    let (dir, admin, reader) = project("");
    let releves = dir.path().join("releves");
    fs::create_dir_all(&releves).unwrap();
    let server = Server::start_with(
        &example_bin("equipe"),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
        &[("RELEVES_DIR", releves.clone())],
    );
    let address = server.address.clone();
    let solde = seed(
        &address,
        &admin,
        "compta-solde",
        "Quel est le solde du compte bancaire 512 ?",
        "completed",
    );
    let virement = "Merci de payer la facture F-2024-031 de Dupont Matériaux par virement.";
    let approve = seed(&address, &admin, "virement-a", virement, "waiting_child");
    let paused = seed(&address, &admin, "virement-b", virement, "waiting_child");

    let output = Command::new("node")
        .arg(ui_dir().join("e2e/viewer.mjs"))
        .current_dir(ui_dir())
        .env("LOOM_UI_URL", format!("http://{address}/ui/"))
        .env("LOOM_UI_CHROMIUM", &chromium)
        .env("LOOM_UI_SCREENSHOTS", &shots)
        .env("LOOM_UI_ADMIN_KEY", &admin)
        .env("LOOM_UI_READER_KEY", &reader)
        .env("LOOM_UI_RELEVES_DIR", &releves)
        .env("LOOM_UI_SOLDE", &solde)
        .env("LOOM_UI_APPROVE", &approve)
        .env("LOOM_UI_PAUSED", &paused)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    eprintln!("{stdout}screenshots in {}", shots.display());
    assert!(
        output.status.success(),
        "the browser test failed:\n{stdout}\n{stderr}\nserver log:\n{}",
        server.log()
    );
    for step in [
        "ok runs list and filters",
        "ok run tree",
        "ok live run",
        "ok approve",
        "ok no read_content",
    ] {
        assert!(stdout.contains(step), "{step} missing:\n{stdout}");
    }
    // What the clicks did, read back from the API: the approved run finished, the other waits.
    assert_eq!(status_of(&address, &admin, &approve), "completed");
    assert_eq!(status_of(&address, &admin, &paused), "waiting_child");
    for name in [
        "runs-list",
        "run-tree",
        "live-completed",
        "approval-done",
        "reader-run",
    ] {
        let shot = shots.join(format!("{name}.png"));
        let bytes = fs::read(&shot).unwrap_or_else(|e| panic!("{}: {e}", shot.display()));
        assert!(bytes.starts_with(b"\x89PNG"), "{}", shot.display());
    }
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}
