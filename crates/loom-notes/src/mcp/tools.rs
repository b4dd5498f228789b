//! The nine tools as MCP declares them (reference A.4, in English): names in `tools/list`
//! order, descriptions, input schemas (bounds, `additionalProperties: false`), output schemas
//! and annotations.

use std::sync::Arc;

use rmcp::model::{Tool, ToolAnnotations};
use serde_json::{Map, Value, json};

/// The server's instructions to the model: what the memory holds, when to read it, and that
/// writes happen only when the user asks for them.
pub(crate) const INSTRUCTIONS: &str = "\
The user's personal memory (loom-notes). Its content is chosen and added by the user
themselves: projects, products, decisions, technical notes, web pages they found useful.

Reading: call `search` before answering any question about the user's projects, products,
past decisions or notes, or as soon as they refer to something they \"already told\" you.
Without `project`, the search is global and each result names its project. Use `get` when a
snippet is not enough.

Writing: NEVER call `add_text`, `add_url`, `add_file`, `update` or `delete` on your own
initiative. Only when the user explicitly asks for it in their current message (\"add this to
my memory\", \"remember this page\", \"delete this document\"). When in doubt, ask them. Each
write tool returns what it actually did: show it to the user.
";

/// Appended to the description of every write tool.
pub(crate) const WRITE_GUARD: &str = " Call ONLY when the user explicitly asks for it in their \
current message; never on your own initiative.";

/// The tool names, in `tools/list` order.
pub(crate) const NAMES: [&str; 9] = [
    "search",
    "get",
    "list_docs",
    "projects",
    "add_text",
    "add_url",
    "add_file",
    "update",
    "delete",
];

/// The nine tools, in order.
pub(crate) fn all() -> Vec<Tool> {
    NAMES.iter().map(|name| tool(name)).collect()
}

fn tool(name: &str) -> Tool {
    let (description, input, output, annotations) = match name {
        "search" => (
            "Hybrid search (dense + sparse, reranking) in the user's memory. To call before \
             answering about their projects, decisions or notes. Returns short snippets with \
             doc_id, title, project and score; use `get` to read a whole document."
                .to_owned(),
            search_input(),
            list_of(hit_schema()),
            ToolAnnotations::new().read_only(true),
        ),
        "get" => (
            "Full text of a document of the memory, with its metadata.".to_owned(),
            input(
                json!({"doc_id": {"type": "string", "description": "Identifier returned by search."}}),
                &["doc_id"],
            ),
            document_schema(),
            ToolAnnotations::new().read_only(true),
        ),
        "list_docs" => (
            "Latest documents added, newest first (metadata, without the text).".to_owned(),
            input(
                json!({
                    "project": nullable_string("Filter on a project."),
                    "n": {"type": "integer", "minimum": 1, "maximum": 50, "default": 20,
                          "description": "How many documents."},
                }),
                &[],
            ),
            list_of(summary_schema()),
            ToolAnnotations::new().read_only(true),
        ),
        "projects" => (
            "Projects present in the memory and the number of documents of each. Useful to \
             choose the `project` filter of search."
                .to_owned(),
            input(json!({}), &[]),
            json!({"type": "object", "additionalProperties": {"type": "integer"}}),
            ToolAnnotations::new().read_only(true),
        ),
        "add_text" => (
            format!("Adds a raw text to the user's memory.{WRITE_GUARD}"),
            input(
                json!({
                    "text": {"type": "string", "description": "Content to remember, as is."},
                    "title": {"type": "string", "minLength": 3,
                              "description": "Short, explicit title (shown by list_docs)."},
                    "project": project_required(),
                    "tags": tags(),
                }),
                &["text", "title", "project"],
            ),
            ingest_schema(),
            ToolAnnotations::new(),
        ),
        "add_url" => (
            format!(
                "Downloads a web page, extracts its main content and adds it to the memory. \
                 The title is the page's.{WRITE_GUARD}"
            ),
            input(
                json!({
                    "url": {"type": "string", "description": "http(s) URL of the page."},
                    "project": project_required(),
                    "tags": tags(),
                }),
                &["url", "project"],
            ),
            ingest_schema(),
            ToolAnnotations::new(),
        ),
        "add_file" => (
            format!(
                "Adds a local markdown file to the memory, split by headings. The title is the \
                 first H1, else the file name.{WRITE_GUARD}"
            ),
            input(
                json!({
                    "path": {"type": "string",
                             "description": "Absolute path of the .md file, in one of the allowed roots."},
                    "project": project_required(),
                    "tags": tags(),
                }),
                &["path", "project"],
            ),
            ingest_schema(),
            ToolAnnotations::new(),
        ),
        "update" => (
            format!(
                "Replaces the text of an existing document (same doc_id, title, project and \
                 tags kept; chunks reindexed).{WRITE_GUARD}"
            ),
            input(
                json!({
                    "doc_id": {"type": "string", "description": "Identifier of the document."},
                    "text": {"type": "string", "description": "New full content."},
                }),
                &["doc_id", "text"],
            ),
            ingest_schema(),
            ToolAnnotations::new().idempotent(true),
        ),
        _ => (
            format!(
                "Deletes a document and its chunks for good. Returns the summary of what was \
                 deleted.{WRITE_GUARD}"
            ),
            input(
                json!({"doc_id": {"type": "string", "description": "Identifier of the document."}}),
                &["doc_id"],
            ),
            summary_schema(),
            ToolAnnotations::new().destructive(true),
        ),
    };
    Tool::new(name.to_owned(), description, object(input))
        .with_title(title_case(name))
        .with_raw_output_schema(object(output))
        .with_annotations(annotations)
}

/// `list_docs` → `List Docs`.
fn title_case(name: &str) -> String {
    name.split('_')
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|first| first.to_uppercase().chain(chars).collect::<String>())
                .unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn object(value: Value) -> Arc<Map<String, Value>> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(Map::new()),
    }
}

/// An input schema: these properties, these required, nothing else.
fn input(properties: Value, required: &[&str]) -> Value {
    let mut schema = json!({"type": "object", "properties": properties});
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    schema["additionalProperties"] = json!(false);
    schema
}

fn search_input() -> Value {
    input(
        json!({
            "query": {"type": "string", "description": "Question or keywords, in natural language."},
            "project": nullable_string("Restrict to a project; absent = global search."),
            "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
                     "default": null, "description": "All the tags must be present."},
            "k": {"type": "integer", "minimum": 1, "maximum": 10, "default": 5,
                  "description": "Number of results."},
        }),
        &["query"],
    )
}

fn nullable_string(description: &str) -> Value {
    json!({"anyOf": [{"type": "string"}, {"type": "null"}], "default": null, "description": description})
}

fn project_required() -> Value {
    json!({"type": "string", "description": "Project it belongs to."})
}

fn tags() -> Value {
    json!({"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
           "default": null, "description": "Optional tags."})
}

/// A list result, wrapped as `{"result": [...]}`.
fn list_of(items: Value) -> Value {
    json!({
        "type": "object",
        "properties": {"result": {"type": "array", "items": items}},
        "required": ["result"],
    })
}

fn string_or_null() -> Value {
    json!({"anyOf": [{"type": "string"}, {"type": "null"}]})
}

fn source_kind() -> Value {
    json!({"type": "string", "enum": ["text", "url", "file"]})
}

fn hit_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "doc_id": {"type": "string"},
            "title": {"type": "string"},
            "project": {"type": "string"},
            "score": {"type": "number"},
            "snippet": {"type": "string",
                        "description": "The whole chunk when it is short, else an extract (see `truncated`)."},
            "truncated": {"type": "boolean",
                          "description": "True when `snippet` is an extract; `get` gives the rest."},
            "heading_path": {"type": "string"},
            "source": string_or_null(),
            "added_at": {"type": "string"},
        },
        "required": ["doc_id", "title", "project", "score", "snippet", "truncated",
                     "heading_path", "source", "added_at"],
    })
}

fn document_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "doc_id": {"type": "string"},
            "title": {"type": "string"},
            "project": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "source_kind": source_kind(),
            "source": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
            "added_at": {"type": "string"},
            "updated_at": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null},
            "content_hash": {"type": "string"},
            "text": {"type": "string"},
        },
        "required": ["doc_id", "title", "project", "source_kind", "content_hash", "text"],
    })
}

fn summary_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "doc_id": {"type": "string"},
            "title": {"type": "string"},
            "project": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "source_kind": source_kind(),
            "source": string_or_null(),
            "added_at": {"type": "string"},
            "updated_at": string_or_null(),
            "chars": {"type": "integer"},
        },
        "required": ["doc_id", "title", "project", "tags", "source_kind", "source",
                     "added_at", "updated_at", "chars"],
    })
}

fn ingest_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "doc_id": {"type": "string"},
            "title": {"type": "string"},
            "project": {"type": "string"},
            "chunks": {"type": "integer"},
            "updated": {"type": "boolean", "default": false,
                        "description": "True when an existing document was replaced."},
            "duplicate_of": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null,
                             "description": "doc_id of a document with identical content; nothing was written."},
        },
        "required": ["doc_id", "title", "project", "chunks"],
    })
}

#[cfg(test)]
mod tests {
    use super::{NAMES, all, title_case};

    #[test]
    fn the_nine_tools_come_in_order_with_closed_schemas() {
        let tools = all();
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        assert_eq!(names, NAMES);
        for tool in &tools {
            assert_eq!(
                tool.input_schema.get("additionalProperties"),
                Some(&serde_json::json!(false)),
                "{}",
                tool.name
            );
            assert!(tool.output_schema.is_some(), "{}", tool.name);
        }
    }

    #[test]
    fn write_tools_end_with_the_guard_and_read_tools_do_not() {
        for tool in all() {
            let description = tool.description.as_deref().unwrap_or_default();
            let write = ["add_text", "add_url", "add_file", "update", "delete"]
                .contains(&tool.name.as_ref());
            assert_eq!(
                description.ends_with(super::WRITE_GUARD),
                write,
                "{}",
                tool.name
            );
        }
    }

    #[test]
    fn titles_are_the_names_in_title_case() {
        assert_eq!(title_case("list_docs"), "List Docs");
        assert_eq!(title_case("search"), "Search");
    }
}
