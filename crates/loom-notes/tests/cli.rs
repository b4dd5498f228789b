//! The CLI through the built binary, with the fake models on a temporary data directory.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Notes;
use serde_json::json;

#[test]
fn add_text_then_search_prints_the_hits_in_the_reference_format() {
    let notes = Notes::new();
    let result = notes
        .run(&[
            "add-text",
            "Alpha",
            "Qdrant note",
            "Qdrant stores the vectors.",
            "-t",
            "Rag",
            "-t",
            "rag",
        ])
        .json();
    assert_eq!(result["title"], "Qdrant note");
    assert_eq!(result["project"], "alpha");
    assert_eq!(result["chunks"], 1);
    assert_eq!(result["updated"], false);
    assert_eq!(result["duplicate_of"], json!(null));
    let doc_id = result["doc_id"].as_str().unwrap();
    notes.add("beta", "Other note", "Completely unrelated words here.");

    let printed = notes.run(&["search", "qdrant vectors"]).ok();
    assert_eq!(
        printed,
        format!(
            "1.000  Qdrant note  [alpha]  {doc_id}\n       Qdrant note\n       Qdrant stores the vectors.\n\n"
        )
    );
    // Tag and project filters.
    assert!(
        notes
            .run(&["search", "qdrant", "-t", "rag"])
            .ok()
            .contains(doc_id)
    );
    assert_eq!(
        notes.run(&["search", "qdrant", "-p", "beta"]).ok(),
        "no results\n"
    );
    assert_eq!(
        notes.run(&["search", "qdrant", "-t", "other"]).ok(),
        "no results\n"
    );
    assert_eq!(notes.run(&["search", "   "]).ok(), "no results\n");
}

#[test]
fn add_text_reads_stdin_when_the_text_is_absent() {
    let notes = Notes::new();
    let result = notes
        .run_with_stdin(
            &["add-text", "p", "From stdin"],
            "Piped text about tokio.\n",
        )
        .json();
    let doc = notes
        .run(&["get", result["doc_id"].as_str().unwrap()])
        .json();
    assert_eq!(doc["text"], "Piped text about tokio.");
    assert_eq!(doc["source_kind"], "text");
    assert_eq!(doc["tags"], json!([]));
}

#[test]
fn get_list_projects_and_delete() {
    let notes = Notes::new();
    let first = notes.add(
        "alpha",
        "Note qdrant",
        "Qdrant stores the vectors of the memory.",
    );
    let second = notes.add("proj", "Second", "Another note, in another project.");
    let third = notes.add("proj", "Third", "A third note.");

    let doc = notes.run(&["get", &first]).json();
    let fields: Vec<&str> = doc
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        fields,
        [
            "doc_id",
            "title",
            "project",
            "tags",
            "source_kind",
            "source",
            "added_at",
            "updated_at",
            "content_hash",
            "text"
        ]
    );
    assert_eq!(doc["content_hash"].as_str().unwrap().len(), 64);

    let listed = notes.run(&["list"]).ok();
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    // Newest first; `date  project(12)  title  (N chars)  doc_id`.
    assert!(
        lines[0].ends_with(&format!("  proj          Third  (13 chars)  {third}")),
        "{listed}"
    );
    assert!(
        lines[2].ends_with(&format!("  alpha         Note qdrant  (40 chars)  {first}")),
        "{listed}"
    );
    assert_eq!(
        lines[0].len() - lines[0].trim_start_matches(|c: char| c != ' ').len(),
        19
    );
    assert_eq!(
        notes
            .run(&["list", "-p", "alpha", "-n", "1"])
            .ok()
            .lines()
            .count(),
        1
    );
    assert_eq!(notes.run(&["list", "-n", "2"]).ok().lines().count(), 2);

    assert_eq!(
        notes.run(&["projects"]).json(),
        json!({"alpha": 1, "proj": 2})
    );

    let deleted = notes.run(&["delete", &second]).json();
    assert_eq!(deleted["doc_id"], second.as_str());
    assert_eq!(deleted["chars"], 33);
    assert_eq!(
        notes.run(&["projects"]).json(),
        json!({"alpha": 1, "proj": 1})
    );
    let stderr = notes.run(&["get", &second]).failed(1);
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains(&second), "{stderr}");
    let stderr = notes.run(&["delete", &second]).failed(1);
    assert!(stderr.contains(&second), "{stderr}");
}

#[test]
fn service_refusals_exit_1_and_usage_errors_exit_2() {
    let notes = Notes::new();
    let stderr = notes.run(&["add-text", "p", "ab", "text"]).failed(1);
    assert!(
        stderr.starts_with("error: ") && stderr.contains("title"),
        "{stderr}"
    );
    let stderr = notes.run(&["add-text", " ", "A title", "text"]).failed(1);
    assert!(stderr.contains("project"), "{stderr}");
    let stderr = notes.run(&["add-text", "p", "A title", "   "]).failed(1);
    assert!(stderr.starts_with("error: "), "{stderr}");

    let stderr = notes.run(&["search", "q", "-k", "11"]).failed(2);
    assert!(stderr.contains("11"), "{stderr}");
    notes.run(&["search", "q", "-k", "0"]).failed(2);
    notes.run(&["list", "-n", "501"]).failed(2);
    notes.run(&["eval", "--k", "11"]).failed(2);
    notes.run(&["frobnicate"]).failed(2);
    notes.run(&["get"]).failed(2);
}

#[test]
fn add_file_follows_the_allowed_roots() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("guide.md");
    std::fs::write(&file, "Intro.\n\n# The Guide\n\nInstall with cargo.\n").unwrap();
    let outside = tempfile::tempdir().unwrap();
    let stray = outside.path().join("stray.md");
    std::fs::write(&stray, "# Stray\n\nNot allowed.\n").unwrap();

    let closed = Notes::new();
    let stderr = closed
        .run(&["add-file", "p", file.to_str().unwrap()])
        .failed(1);
    assert!(stderr.contains("LOOM_NOTES_ALLOWED_ROOTS"), "{stderr}");

    let notes = Notes::new().with("LOOM_NOTES_ALLOWED_ROOTS", root.path().to_str().unwrap());
    let result = notes
        .run(&["add-file", "docs", file.to_str().unwrap(), "-t", "guide"])
        .json();
    assert_eq!(result["title"], "The Guide");
    let doc = notes
        .run(&["get", result["doc_id"].as_str().unwrap()])
        .json();
    assert_eq!(doc["source_kind"], "file");
    assert_eq!(doc["tags"], json!(["guide"]));
    let stderr = notes
        .run(&["add-file", "p", stray.to_str().unwrap()])
        .failed(1);
    assert!(stderr.contains("outside the allowed roots"), "{stderr}");
}

#[test]
fn add_url_refuses_private_addresses_unless_allowed() {
    let notes = Notes::new();
    let stderr = notes
        .run(&["add-url", "p", "http://127.0.0.1:9/page"])
        .failed(1);
    assert!(
        stderr.contains("LOOM_NOTES_FETCH_ALLOW_PRIVATE"),
        "{stderr}"
    );
    let stderr = notes.run(&["add-url", "p", "file:///etc/passwd"]).failed(1);
    assert!(stderr.starts_with("error: "), "{stderr}");
}

#[test]
fn export_then_import_round_trips_and_skips_known_ids() {
    let notes = Notes::new();
    let first = notes.add("alpha", "First note", "Tokio runs the futures.");
    notes.add("beta", "Second note", "Axum serves the routes.");
    let printed = notes.run(&["export"]).ok();
    let default = notes.data_dir().join("export.jsonl");
    assert_eq!(
        printed,
        format!("2 document(s) exported to {}\n", default.display())
    );
    let exported = std::fs::read_to_string(&default).unwrap();
    assert_eq!(exported.lines().count(), 2);
    assert!(
        exported
            .lines()
            .all(|l| !l.contains("\n") && l.starts_with("{\"doc_id\":"))
    );

    let copy = tempfile::tempdir().unwrap();
    let path = copy.path().join("memory.jsonl");
    notes.run(&["export", path.to_str().unwrap()]).ok();
    let other = Notes::new();
    assert_eq!(
        other.run(&["import", path.to_str().unwrap()]).ok(),
        "2 imported, 0 skipped\n"
    );
    assert_eq!(
        other.run(&["import", path.to_str().unwrap()]).ok(),
        "0 imported, 2 skipped\n"
    );
    assert_eq!(
        other.run(&["get", &first]).json(),
        notes.run(&["get", &first]).json()
    );
    assert!(
        other
            .run(&["search", "tokio futures"])
            .ok()
            .contains(&first)
    );

    // A missing file is an error, not a crash.
    let missing = copy.path().join("nothing.jsonl");
    let stderr = other.run(&["import", missing.to_str().unwrap()]).failed(1);
    assert!(stderr.starts_with("error: cannot read "), "{stderr}");
    assert!(stderr.contains("nothing.jsonl"), "{stderr}");
    // A line that is not a document names the file and the line.
    std::fs::write(
        &missing,
        format!("{}\n\nnot json\n", exported.lines().next().unwrap()),
    )
    .unwrap();
    let stderr = other.run(&["import", missing.to_str().unwrap()]).failed(1);
    assert!(stderr.contains("line 3"), "{stderr}");
}

#[test]
fn eval_reports_the_upstream_scenario_in_text_and_json() {
    let notes = Notes::new();
    let qdrant = notes.add(
        "alpha",
        "Note qdrant",
        "Qdrant fuses the dense and sparse lists with RRF.",
    );
    let grpc = notes.add(
        "other",
        "Guide Qdrant",
        "The gRPC port of the server is 6334.",
    );
    let docker = notes.add("alpha", "Docker", "The container runs with docker start.");
    let golden = notes.data_dir().join("golden.jsonl");

    // No golden set yet.
    let stderr = notes.run(&["eval"]).failed(1);
    assert!(
        stderr.contains("no cases in") && stderr.contains("loom-notes eval-add"),
        "{stderr}"
    );

    assert_eq!(
        notes.run(&["eval-add", "fusion RRF qdrant", &qdrant]).ok(),
        "added: \"fusion RRF qdrant\" → Note qdrant\n"
    );
    notes
        .run(&["eval-add", "port gRPC", &grpc, "-p", "other"])
        .ok();
    notes.run(&["eval-add", "docker container", &docker]).ok();
    let stderr = notes.run(&["eval-add", "q", "no-such-doc"]).failed(1);
    assert!(stderr.contains("no-such-doc"), "{stderr}");
    let lines = std::fs::read_to_string(&golden).unwrap();
    let second: serde_json::Value = serde_json::from_str(lines.lines().nth(1).unwrap()).unwrap();
    assert_eq!(
        second,
        json!({"query": "port gRPC", "doc_id": grpc, "title": "Guide Qdrant", "project": "other"})
    );
    // A case whose document is not in the memory.
    std::fs::write(
        &golden,
        format!(
            "{lines}{}\n",
            json!({"query": "unicorn", "doc_id": "00000000-0000-4000-8000-000000000000"})
        ),
    )
    .unwrap();

    let text = notes.run(&["eval"]).ok();
    assert!(text.contains("recall@1 0.75"), "{text}");
    assert!(text.contains("MRR 0.75"), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("ok ")).count(),
        3,
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("KO ")).count(),
        1,
        "{text}"
    );

    let report = notes.run(&["eval", "--json", "--k", "5"]).json();
    assert_eq!(report["cases"], 4);
    assert_eq!(report["recall_at_1"], 0.75);
    assert_eq!(report["recall_at_5"], 0.75);
    assert_eq!(report["mrr"], 0.75);
    let ranks: Vec<_> = report["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rank"].clone())
        .collect();
    assert_eq!(ranks, [json!(1), json!(1), json!(1), json!(null)]);
    let suggested = report["suggested_min_score"].as_f64().unwrap();
    assert!(suggested > 0.0 && suggested <= 1.0, "{report}");
    assert!(!report["noise_removed_at_suggested"].is_null(), "{report}");

    // Another path.
    let elsewhere = notes.home.path().join("set.jsonl");
    notes
        .run(&[
            "eval-add",
            "docker",
            &docker,
            "--path",
            elsewhere.to_str().unwrap(),
        ])
        .ok();
    let report = notes
        .run(&["eval", elsewhere.to_str().unwrap(), "--json"])
        .json();
    assert_eq!(report["cases"], 1);
}

#[test]
fn without_fake_models_and_without_candle_the_error_says_what_to_do() {
    let notes = Notes::new();
    let run = notes.run_real(&["list"]);
    if cfg!(feature = "candle") {
        return;
    }
    let stderr = run.failed(1);
    assert!(
        stderr.contains("--fake") && stderr.contains("candle"),
        "{stderr}"
    );
    // LOOM_NOTES_FAKE_MODELS=true is the same as --fake.
    let notes = notes.with("LOOM_NOTES_FAKE_MODELS", "true");
    assert_eq!(notes.run_real(&["list"]).ok(), "");
}

#[test]
fn a_bad_setting_is_an_error_naming_the_variable() {
    let notes = Notes::new().with("LOOM_NOTES_CHUNK_MAX_CHARS", "many");
    let stderr = notes.run(&["list"]).failed(1);
    assert!(
        stderr.to_uppercase().contains("CHUNK_MAX_CHARS") && stderr.contains("many"),
        "{stderr}"
    );
}

#[test]
fn the_data_directory_comes_from_the_environment_without_the_flag() {
    let notes = Notes::new();
    let home = notes.home.path();
    let run = |vars: &[(&str, &str)], args: &[&str]| {
        let output = common::command(home, vars)
            .arg("--fake")
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "{output:?}");
    };
    run(&[], &["add-text", "p", "In home", "Stored under HOME."]);
    assert!(home.join(".local/share/loom-notes").is_dir());
    let xdg = home.join("xdg");
    run(&[("XDG_DATA_HOME", xdg.to_str().unwrap())], &["list"]);
    assert!(xdg.join("loom-notes").is_dir());
    let explicit = home.join("explicit");
    run(
        &[("LOOM_NOTES_DATA_DIR", explicit.to_str().unwrap())],
        &["list"],
    );
    assert!(explicit.is_dir());
}

#[test]
fn a_store_indexed_with_another_model_is_refused_until_reindexed() {
    let notes = Notes::new();
    let doc_id = notes.add("alpha", "Note qdrant", "Qdrant stores the vectors.");
    // Record another embedder in the store's meta, as a store built with BGE-M3 would.
    let db = notes.data_dir().join("notes.sqlite");
    let meta = json!({"dense_model": "BAAI/bge-m3", "dense_dim": 1024, "indexed_at": "2026-11-29T11:55:32.695750+00:00"});
    let script = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); \
         c.execute(\"UPDATE meta SET value = ? WHERE key = 'index'\", (sys.argv[2],)); c.commit(); \
         assert c.total_changes == 1";
    let status = std::process::Command::new("python3")
        .args(["-c", script, db.to_str().unwrap(), &meta.to_string()])
        .status()
        .unwrap();
    assert!(status.success());

    let expected = "error: the index was built with BAAI/bge-m3 (1024), the configuration asks for \
                    fake-64 (64): run `loom-notes reindex`\n";
    // Read commands are refused too.
    assert_eq!(notes.run(&["list"]).failed(1), expected);
    assert_eq!(notes.run(&["search", "qdrant"]).failed(1), expected);
    assert_eq!(
        notes
            .run(&["add-text", "p", "Another", "More text."])
            .failed(1),
        expected
    );
    // The server does not start on it either.
    assert!(notes.run(&["serve"]).failed(1).ends_with(expected));

    assert_eq!(notes.run(&["reindex"]).ok(), "1 document(s) reindexed\n");
    assert!(notes.run(&["search", "qdrant"]).ok().contains(&doc_id));
}

/// With the `candle` feature and a model directory in `LOOM_NOTES_TEST_MODEL_DIR` (MiniLM:
/// `crates/loom-notes-candle/install-test-model.sh DIR`): the real embedder is used, the
/// missing reranker falls back loudly to the fake one, and a note is found again by meaning.
#[cfg(feature = "candle")]
#[test]
fn with_candle_the_real_embedder_is_loaded_from_the_model_directory() {
    let Some(model) = std::env::var_os("LOOM_NOTES_TEST_MODEL_DIR") else {
        eprintln!("skipped: LOOM_NOTES_TEST_MODEL_DIR is not set");
        return;
    };
    let notes = Notes::new();
    let stderr = notes.run_real(&["list"]).failed(1);
    assert!(
        stderr.contains("LOOM_NOTES_MODEL_DIR") && stderr.contains("--fake"),
        "{stderr}"
    );

    let notes = notes.with("LOOM_NOTES_MODEL_DIR", model.to_str().unwrap());
    let run = notes.run_real(&[
        "add-text",
        "p",
        "Cats",
        "The cat sleeps on the warm sofa all afternoon.",
    ]);
    assert!(
        run.stderr.contains("LOOM_NOTES_RERANKER_DIR is not set"),
        "{}",
        run.stderr
    );
    let cats = run.json();
    let dogs = notes
        .run_real(&[
            "add-text",
            "p",
            "Invoices",
            "Invoices are paid within thirty days.",
        ])
        .json();
    let found = notes.run_real(&["search", "cat sofa"]).ok();
    assert!(found.starts_with("1.000  Cats"), "{found}");
    assert!(found.contains(cats["doc_id"].as_str().unwrap()));
    assert!(!found.contains(dogs["doc_id"].as_str().unwrap()), "{found}");
    // The store now records MiniLM: the fake models are refused on it.
    let stderr = notes.run(&["list"]).failed(1);
    assert!(
        stderr.contains("fake-64 (64)") && stderr.contains("reindex"),
        "{stderr}"
    );
}
