//! The MCP server (reference A.4): nine tools over the memory service. Results are structured
//! (objects, lists wrapped as `{"result": [...]}`) and echoed as JSON text; a refusal of the
//! service and an invalid argument are `isError` results carrying their message, never
//! protocol errors.

mod args;
mod tools;

use std::sync::Arc;

use loom_notes_core::{Extracted, MemoryService, SearchQuery, SourceKind};
use loom_notes_sources::{FileAccess, UrlFetcher};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
        ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
    },
    service::RequestContext,
};
use serde::Serialize;
use serde_json::{Map, Value, json};

pub(crate) use tools::INSTRUCTIONS;

use args::{
    AddFileArgs, AddTextArgs, AddUrlArgs, DocIdArgs, ListArgs, NoArgs, SearchArgs, UpdateArgs,
    parse,
};

/// The loom-notes MCP server: the service, and the file and page readers of `add_file` and
/// `add_url`.
#[derive(Debug, Clone)]
pub(crate) struct NotesMcp {
    service: Arc<MemoryService>,
    files: Arc<FileAccess>,
    fetcher: Arc<UrlFetcher>,
}

impl NotesMcp {
    /// A server over `service`.
    pub(crate) fn new(service: Arc<MemoryService>, files: FileAccess, fetcher: UrlFetcher) -> Self {
        Self {
            service,
            files: Arc::new(files),
            fetcher: Arc::new(fetcher),
        }
    }

    /// Runs tool `name` on `arguments`: its result, or the message of why it failed.
    async fn call(&self, name: &str, arguments: Map<String, Value>) -> Result<Value, String> {
        let service = &self.service;
        let failed = |e: &dyn std::fmt::Display| e.to_string();
        match name {
            "search" => {
                let a: SearchArgs = parse(name, arguments)?;
                let k = a.k();
                let query = SearchQuery {
                    query: a.query,
                    project: a.project,
                    tags: a.tags.unwrap_or_default(),
                    k,
                    min_score: None,
                };
                wrapped(&service.search(&query).await.map_err(|e| failed(&e))?)
            }
            "get" => {
                let a: DocIdArgs = parse(name, arguments)?;
                to_value(&service.get(&a.doc_id).await.map_err(|e| failed(&e))?)
            }
            "list_docs" => {
                let a: ListArgs = parse(name, arguments)?;
                let docs = service
                    .list(a.project.as_deref(), a.n())
                    .await
                    .map_err(|e| failed(&e))?;
                wrapped(&docs)
            }
            "projects" => {
                let _: NoArgs = parse(name, arguments)?;
                to_value(&service.projects().await.map_err(|e| failed(&e))?)
            }
            "add_text" => {
                let a: AddTextArgs = parse(name, arguments)?;
                let result = service
                    .add_text(&a.text, &a.title, &a.project, a.tags.as_deref())
                    .await
                    .map_err(|e| failed(&e))?;
                to_value(&result)
            }
            "add_url" => {
                let a: AddUrlArgs = parse(name, arguments)?;
                let page = self
                    .fetcher
                    .fetch(a.url.trim())
                    .await
                    .map_err(|e| failed(&e))?;
                let extracted = Extracted {
                    title: page.title,
                    text: page.text,
                };
                let result = service
                    .ingest(
                        extracted,
                        SourceKind::Url,
                        Some(page.source),
                        &a.project,
                        a.tags.as_deref(),
                    )
                    .await
                    .map_err(|e| failed(&e))?;
                to_value(&result)
            }
            "add_file" => {
                let a: AddFileArgs = parse(name, arguments)?;
                let files = Arc::clone(&self.files);
                let path = a.path.clone();
                let file = tokio::task::spawn_blocking(move || files.read(&path))
                    .await
                    .map_err(|e| failed(&e))?
                    .map_err(|e| failed(&e))?;
                let extracted = Extracted {
                    title: file.title,
                    text: file.text,
                };
                let result = service
                    .ingest(
                        extracted,
                        SourceKind::File,
                        Some(file.source),
                        &a.project,
                        a.tags.as_deref(),
                    )
                    .await
                    .map_err(|e| failed(&e))?;
                to_value(&result)
            }
            "update" => {
                let a: UpdateArgs = parse(name, arguments)?;
                let result = service
                    .update(&a.doc_id, &a.text)
                    .await
                    .map_err(|e| failed(&e))?;
                to_value(&result)
            }
            "delete" => {
                let a: DocIdArgs = parse(name, arguments)?;
                to_value(&service.delete(&a.doc_id).await.map_err(|e| failed(&e))?)
            }
            _ => Err(format!("Unknown tool: '{name}'")),
        }
    }
}

/// An object result as JSON.
fn to_value<T: Serialize>(value: &T) -> Result<Value, String> {
    serde_json::to_value(value).map_err(|e| format!("cannot encode the result: {e}"))
}

/// A list result, wrapped as `{"result": [...]}`.
fn wrapped<T: Serialize>(items: &[T]) -> Result<Value, String> {
    Ok(json!({"result": to_value(&items)?}))
}

/// The tool result of `outcome`: structured content echoed as compact JSON text (a list as
/// its items; an empty list as no content), or an error carrying its message.
fn result_of(outcome: Result<Value, String>) -> CallToolResult {
    match outcome {
        Ok(value) => {
            let text = match value.get("result") {
                Some(Value::Array(items)) if value.as_object().is_some_and(|o| o.len() == 1) => {
                    (!items.is_empty()).then(|| Value::Array(items.clone()).to_string())
                }
                _ => Some(value.to_string()),
            };
            let mut result = CallToolResult::success(
                text.map(ContentBlock::text).into_iter().collect::<Vec<_>>(),
            );
            result.structured_content = Some(value);
            result
        }
        Err(message) => CallToolResult::error(vec![ContentBlock::text(message)]),
    }
}

impl ServerHandler for NotesMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("loom-notes", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::all()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let arguments = request.arguments.unwrap_or_default();
        let outcome = self.call(&name, arguments).await;
        if let Err(message) = &outcome {
            tracing::info!(tool = %name, %message, "tool call refused");
        }
        Ok(result_of(outcome).into())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::result_of;

    #[test]
    fn lists_are_wrapped_and_echoed_as_their_items() {
        let result = result_of(Ok(json!({"result": [{"a": 1}]})));
        assert_eq!(result.is_error, Some(false));
        assert_eq!(
            result.structured_content,
            Some(json!({"result": [{"a": 1}]}))
        );
        let text = serde_json::to_value(&result.content).unwrap_or_default();
        assert_eq!(text[0]["text"], json!("[{\"a\":1}]"));
        let empty = result_of(Ok(json!({"result": []})));
        assert!(empty.content.is_empty());
    }

    #[test]
    fn failures_are_error_results_with_their_message() {
        let result = result_of(Err("unknown document: d-1".into()));
        assert_eq!(result.is_error, Some(true));
        assert!(result.structured_content.is_none());
        let text = serde_json::to_value(&result.content).unwrap_or_default();
        assert_eq!(text[0]["text"], json!("unknown document: d-1"));
    }
}
