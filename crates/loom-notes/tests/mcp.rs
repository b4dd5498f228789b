//! The MCP server through the official Python MCP SDK, over stdio and over streamable HTTP,
//! and the CLI and the server on one data directory at once.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Notes, mcp_client, python_mcp};
use serde_json::{Value, json};

/// The data directories of a `full` scenario: one allowing private addresses and a file root,
/// one with neither; and the files inside and outside the root.
struct Setup {
    open: Notes,
    strict: Notes,
    _root: tempfile::TempDir,
    _outside: tempfile::TempDir,
    inside: String,
    outside: String,
}

fn setup() -> Setup {
    let root = tempfile::tempdir().unwrap();
    let inside = root.path().join("runbook.md");
    std::fs::write(
        &inside,
        "# Runbook\n\nRestart the indexer with systemctl.\n",
    )
    .unwrap();
    let outside_dir = tempfile::tempdir().unwrap();
    let outside = outside_dir.path().join("secret.md");
    std::fs::write(&outside, "# Secret\n\nNot for the memory.\n").unwrap();
    let open = Notes::new()
        .with("LOOM_NOTES_ALLOWED_ROOTS", root.path().to_str().unwrap())
        .with("LOOM_NOTES_FETCH_ALLOW_PRIVATE", "true");
    Setup {
        open,
        strict: Notes::new(),
        inside: inside.to_str().unwrap().to_owned(),
        outside: outside.to_str().unwrap().to_owned(),
        _root: root,
        _outside: outside_dir,
    }
}

fn error_text(call: &Value) -> String {
    assert_eq!(call["is_error"], true, "{call}");
    assert!(call["structured"].is_null(), "{call}");
    call["texts"][0].as_str().unwrap().to_owned()
}

fn structured(call: &Value) -> &Value {
    assert_eq!(call["is_error"], false, "{call}");
    &call["structured"]
}

/// What every transport must show.
fn check_full(out: &Value, setup: &Setup) {
    assert_eq!(
        out["server"],
        json!({"name": "loom-notes", "version": env!("CARGO_PKG_VERSION")})
    );
    let instructions = out["instructions"].as_str().unwrap();
    assert!(
        instructions.contains("NEVER call `add_text`"),
        "{instructions}"
    );
    assert!(instructions.ends_with('\n'));

    // tools/list: names, order, schemas, annotations.
    let tools = out["tools"].as_array().unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "search",
            "get",
            "list_docs",
            "projects",
            "add_text",
            "add_url",
            "add_file",
            "update",
            "delete"
        ]
    );
    for tool in tools {
        assert_eq!(tool["input"]["additionalProperties"], false, "{tool}");
        let description = tool["description"].as_str().unwrap();
        let write = ["add_text", "add_url", "add_file", "update", "delete"]
            .contains(&tool["name"].as_str().unwrap());
        assert_eq!(
            description.ends_with("never on your own initiative."),
            write,
            "{tool}"
        );
    }
    let tool = |name: &str| tools.iter().find(|t| t["name"] == name).unwrap();
    let search = tool("search");
    assert_eq!(search["input"]["required"], json!(["query"]));
    assert_eq!(search["input"]["properties"]["k"]["minimum"], 1);
    assert_eq!(search["input"]["properties"]["k"]["maximum"], 10);
    assert_eq!(search["input"]["properties"]["k"]["default"], 5);
    assert_eq!(search["annotations"]["readOnlyHint"], true);
    assert_eq!(search["output"]["required"], json!(["result"]));
    assert_eq!(tool("list_docs")["input"]["properties"]["n"]["maximum"], 50);
    assert_eq!(tool("list_docs")["title"], "List Docs");
    assert_eq!(
        tool("add_text")["input"]["properties"]["title"]["minLength"],
        3
    );
    assert_eq!(
        tool("add_text")["input"]["required"],
        json!(["text", "title", "project"])
    );
    assert_eq!(tool("add_text")["annotations"], json!({}));
    assert_eq!(tool("update")["annotations"]["idempotentHint"], true);
    assert_eq!(tool("delete")["annotations"]["destructiveHint"], true);
    assert_eq!(
        tool("projects")["output"]["additionalProperties"],
        json!({"type": "integer"})
    );

    // add_text → search → get → list_docs → projects → update → delete.
    let added = structured(&out["add_text"]);
    let doc_id = added["doc_id"].as_str().unwrap();
    assert_eq!(added["project"], "alpha");
    assert_eq!(added["chunks"], 1);
    assert_eq!(
        out["add_text"]["texts"][0]
            .as_str()
            .map(|t| serde_json::from_str::<Value>(t).unwrap()),
        Some(added.clone())
    );
    let duplicate = structured(&out["duplicate"]);
    assert_eq!(duplicate["duplicate_of"], doc_id);
    assert_eq!(duplicate["chunks"], 0);

    let hits = structured(&out["search"])["result"].as_array().unwrap();
    assert_eq!(hits[0]["doc_id"], doc_id);
    assert_eq!(hits[0]["score"], 1.0);
    assert_eq!(hits[0]["truncated"], false);
    assert_eq!(hits[0]["heading_path"], "Qdrant note");
    assert_eq!(
        structured(&out["search_other_project"])["result"],
        json!([])
    );
    assert_eq!(out["search_other_project"]["texts"], json!([]));
    assert_eq!(
        structured(&out["search_tags"])["result"][0]["doc_id"],
        doc_id
    );

    let doc = structured(&out["get"]);
    assert_eq!(doc["tags"], json!(["rag", "search"]));
    assert_eq!(
        doc["text"],
        "Qdrant stores the vectors. The gRPC port is 6334."
    );
    let listed = structured(&out["list_docs"])["result"].as_array().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["chars"], 49);
    assert_eq!(structured(&out["projects"]), &json!({"alpha": 1}));

    let updated = structured(&out["update"]);
    assert_eq!(updated["doc_id"], doc_id);
    assert_eq!(updated["updated"], true);
    assert_eq!(
        structured(&out["search_updated"])["result"][0]["doc_id"],
        doc_id
    );

    // add_file: refused outside the roots, accepted inside.
    let refused = error_text(&out["add_file_outside"]);
    assert!(
        refused.contains("outside the allowed roots") && refused.contains("secret.md"),
        "{refused}"
    );
    let file = structured(&out["add_file_inside"]);
    assert_eq!(file["title"], "Runbook");
    let _ = &setup.inside;

    // add_url against the local page (private addresses allowed on this server).
    let page = structured(&out["add_url"]);
    assert_eq!(page["title"], "Loom 2.0 release notes");
    assert_eq!(
        structured(&out["search_url"])["result"][0]["doc_id"],
        page["doc_id"]
    );

    let deleted = structured(&out["delete"]);
    assert_eq!(deleted["doc_id"], doc_id);
    assert!(error_text(&out["get_deleted"]).contains(doc_id));
    assert_eq!(out["search_empty"]["is_error"], false);

    // Validation errors are tool errors naming the field.
    assert!(error_text(&out["k_0"]).contains("k: must be between 1 and 10 (got 0)"));
    assert!(error_text(&out["n_51"]).contains("n: must be between 1 and 50 (got 51)"));
    assert!(error_text(&out["title_ab"]).contains("title: must be at least 3 characters"));
    assert!(error_text(&out["missing_query"]).contains("missing field `query`"));
    assert!(error_text(&out["unknown_field"]).contains("unknown field `verbose`"));
    assert_eq!(
        error_text(&out["unknown_tool"]),
        "Unknown tool: 'nonexistent_tool'"
    );

    // The strict server: private addresses and files refused.
    let private = error_text(&out["add_url_private"]);
    assert!(
        private.contains("127.0.0.1") && private.contains("LOOM_NOTES_FETCH_ALLOW_PRIVATE=true"),
        "{private}"
    );
    let closed = error_text(&out["add_file_no_roots"]);
    assert!(closed.contains("LOOM_NOTES_ALLOWED_ROOTS"), "{closed}");
}

#[test]
fn a_client_over_stdio_uses_every_tool() {
    if !python_mcp() {
        return;
    }
    let setup = setup();
    let out = mcp_client(
        "full",
        json!({
            "open": setup.open.stdio_spec(),
            "strict": setup.strict.stdio_spec(),
            "inside": setup.inside,
            "outside": setup.outside,
        }),
    );
    check_full(&out, &setup);
}

#[test]
fn a_client_over_streamable_http_uses_every_tool() {
    if !python_mcp() {
        return;
    }
    let setup = setup();
    let open = setup.open.http_server();
    let strict = setup.strict.http_server();
    let out = mcp_client(
        "full",
        json!({
            "open": open.spec(),
            "strict": strict.spec(),
            "inside": setup.inside,
            "outside": setup.outside,
        }),
    );
    check_full(&out, &setup);
}

#[test]
fn the_cli_and_the_server_share_the_data_directory_at_once() {
    if !python_mcp() {
        return;
    }
    let notes = Notes::new();
    let server = notes.http_server();
    let before = mcp_client(
        "search",
        json!({"server": server.spec(), "query": "lighthouse keeper"}),
    );
    assert_eq!(before["structured"]["result"], json!([]), "{before}");
    let doc_id = notes.add(
        "sea",
        "Lighthouse",
        "The lighthouse keeper logs every ship.",
    );
    let after = mcp_client(
        "search",
        json!({"server": server.spec(), "query": "lighthouse keeper"}),
    );
    assert_eq!(
        after["structured"]["result"][0]["doc_id"], doc_id,
        "{after}"
    );
    // And the other way round: what the server holds, the CLI lists while it runs.
    assert!(notes.run(&["list"]).ok().contains(&doc_id));
}
