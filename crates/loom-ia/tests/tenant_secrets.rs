//! A tenant's own credentials (`tenants[].secrets`): two tenants' CRM tokens reach an HTTP MCP
//! server as its `Authorization` header, each tenant its own, and no token value is ever
//! written in the journal directory.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::Path,
    sync::{Arc, Mutex},
};

use loom_ia::{Loom, RunOptions, RunStatus};
use rmcp::{
    ErrorData, RoleServer, ServerHandler,
    model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
        PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool as McpTool,
    },
    service::RequestContext,
    transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService, session::local::LocalSessionManager,
    },
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const MARTIN_TOKEN: &str = "Bearer martin-crm-7f3a9c";
const DUPONT_TOKEN: &str = "Bearer dupont-crm-51be02";

/// A CRM that records the `Authorization` header of every call and answers without it.
#[derive(Debug, Clone, Default)]
struct Crm {
    seen: Arc<Mutex<Vec<Option<String>>>>,
}

impl ServerHandler for Crm {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = match json!({"type": "object", "properties": {}}) {
            Value::Object(map) => Arc::new(map),
            _ => unreachable!(),
        };
        Ok(ListToolsResult::with_all_items(vec![McpTool::new(
            "contacts",
            "Lists the tenant's contacts.",
            schema,
        )]))
    }

    async fn call_tool(
        &self,
        _request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let authorization = context
            .extensions
            .get::<axum::http::request::Parts>()
            .and_then(|parts| parts.headers.get("authorization"))
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        self.seen.lock().unwrap().push(authorization);
        Ok(CallToolResult::success(vec![ContentBlock::text("2 contacts")]).into())
    }
}

/// Serves `crm` at `http://127.0.0.1:<port>/mcp` until `stop` is cancelled.
async fn serve(crm: Crm, stop: &CancellationToken) -> String {
    let service: StreamableHttpService<Crm, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(crm.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = axum::Router::new().nest_service("/mcp", service);
    let shutdown = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
            .await;
    });
    format!("http://{addr}/mcp")
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(files_under(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_reaches_the_crm_with_its_own_token_and_no_token_is_journaled() {
    let stop = CancellationToken::new();
    let crm = Crm::default();
    let url = serve(crm.clone(), &stop).await;
    let dir = tempfile::tempdir().unwrap();
    // Martin's token is an environment variable (here from the env file, as the process
    // environment would give it); Dupont's is a file mounted beside the configuration.
    std::fs::write(
        dir.path().join(".env"),
        format!("LOOM_TEST_MARTIN_CRM={MARTIN_TOKEN}\n"),
    )
    .unwrap();
    std::fs::write(dir.path().join("dupont.token"), format!("{DUPONT_TOKEN}\n")).unwrap();
    std::fs::write(
        dir.path().join("loom.yaml"),
        format!(
            r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - tool_calls: [{{name: crm__contacts, arguments: {{}}}}]
        - text: "{{{{ tool_result }}}}"
mcp_servers:
  - name: crm
    transport: http
    url: {url}
    scope: tenant
    headers_env: {{Authorization: CRM_TOKEN}}
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: suivi
    main: {{model: fake-1}}
    tools: [{{mcp: crm, required: true}}]
tenants:
  - id: martin
    secrets: {{CRM_TOKEN: LOOM_TEST_MARTIN_CRM}}
  - id: dupont
    secrets: {{CRM_TOKEN: {{file: dupont.token}}}}
"#
        ),
    )
    .unwrap();
    let loom = Loom::open_config(dir.path().join("loom.yaml"), None)
        .await
        .unwrap();
    for tenant in ["martin", "dupont"] {
        let result = loom
            .run(
                "suivi",
                "Mes contacts ?",
                RunOptions {
                    tenant_id: Some(tenant.into()),
                    ..RunOptions::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(result.status, RunStatus::Completed, "{tenant}: {result:?}");
        assert_eq!(result.text, "2 contacts");
    }
    loom.stop(std::time::Duration::from_secs(5)).await;
    stop.cancel();
    // Each tenant's call carried its own token, and only its own.
    assert_eq!(
        *crm.seen.lock().unwrap(),
        [Some(MARTIN_TOKEN.to_owned()), Some(DUPONT_TOKEN.to_owned())]
    );
    // Not a byte of either token anywhere in the journal directory (events, indexes, files).
    let files = files_under(&dir.path().join("data"));
    assert!(files.len() >= 2, "{files:?}");
    for file in files {
        let bytes = std::fs::read(&file).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        for token in [
            MARTIN_TOKEN,
            DUPONT_TOKEN,
            "martin-crm-7f3a9c",
            "dupont-crm-51be02",
        ] {
            assert!(!text.contains(token), "{} holds a token", file.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_without_its_token_cannot_reach_the_crm_and_the_error_names_no_value() {
    let stop = CancellationToken::new();
    let crm = Crm::default();
    let url = serve(crm.clone(), &stop).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".env"),
        format!("LOOM_TEST_MARTIN_CRM={MARTIN_TOKEN}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("loom.yaml"),
        format!(
            r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - tool_calls: [{{name: crm__contacts, arguments: {{}}}}]
        - text: "{{{{ tool_result }}}}"
mcp_servers:
  - name: crm
    transport: http
    url: {url}
    scope: run
    headers_env: {{Authorization: CRM_TOKEN}}
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: suivi
    main: {{model: fake-1}}
    tools: [{{mcp: crm, required: true}}]
tenants:
  - id: martin
    secrets: {{CRM_TOKEN: LOOM_TEST_MARTIN_CRM}}
  - id: dupont
    secrets: {{CRM_TOKEN: LOOM_TEST_DUPONT_CRM_ABSENT}}
"#
        ),
    )
    .unwrap();
    let loom = Loom::open_config(dir.path().join("loom.yaml"), None)
        .await
        .unwrap();
    let options = |tenant: &str| RunOptions {
        tenant_id: Some(tenant.into()),
        ..RunOptions::default()
    };
    let dupont = loom.run("suivi", "?", options("dupont")).await.unwrap();
    assert_eq!(dupont.status, RunStatus::Failed, "{dupont:?}");
    let events = loom.events(&dupont.run_ref("dupont")).await.unwrap();
    let unavailable: Vec<String> = events
        .iter()
        .filter(|e| e.payload.type_name() == "tool.source_unavailable")
        .map(|e| serde_json::to_string(&e.payload).unwrap())
        .collect();
    assert_eq!(unavailable.len(), 1, "{unavailable:?}");
    assert!(
        unavailable[0].contains("the secret CRM_TOKEN")
            && unavailable[0].contains("env LOOM_TEST_DUPONT_CRM_ABSENT"),
        "{unavailable:?}"
    );
    // Martin, whose token is there, is not held back by Dupont's missing one.
    let martin = loom.run("suivi", "?", options("martin")).await.unwrap();
    assert_eq!(martin.status, RunStatus::Completed, "{martin:?}");
    loom.stop(std::time::Duration::from_secs(5)).await;
    stop.cancel();
    assert_eq!(*crm.seen.lock().unwrap(), [Some(MARTIN_TOKEN.to_owned())]);
}

/// A tenant's `tools_deny` and `approvals` apply to an MCP server's tools, by the name the model
/// sees (`<server>__<tool>`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_denies_or_guards_an_mcp_tool_by_its_model_name() {
    let stop = CancellationToken::new();
    let crm = Crm::default();
    let url = serve(crm.clone(), &stop).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("loom.yaml"),
        format!(
            r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - {{with_tool: crm__contacts, tool_calls: [{{name: crm__contacts, arguments: {{}}}}]}}
        - {{without_tool: crm__contacts, text: "no CRM for this tenant"}}
        - text: "{{{{ tool_result }}}}"
mcp_servers:
  - name: crm
    transport: http
    url: {url}
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: suivi
    main: {{model: fake-1}}
    tools: [{{mcp: crm}}]
tenants:
  - id: martin
    approvals: {{crm__contacts: always}}
  - id: dupont
    tools_deny: [crm__contacts]
  - id: durand
"#
        ),
    )
    .unwrap();
    let loom = Loom::open_config(dir.path().join("loom.yaml"), None)
        .await
        .unwrap();
    let run = |tenant: &'static str| {
        let loom = loom.clone();
        async move {
            loom.run(
                "suivi",
                "Mes contacts ?",
                RunOptions {
                    tenant_id: Some(tenant.into()),
                    ..RunOptions::default()
                },
            )
            .await
            .unwrap()
        }
    };
    let martin = run("martin").await;
    assert_eq!(martin.status, RunStatus::Paused, "{martin:?}");
    assert_eq!(martin.pending_approvals[0].tool_name, "crm__contacts");
    let dupont = run("dupont").await;
    assert_eq!(dupont.text, "no CRM for this tenant");
    let durand = run("durand").await;
    assert_eq!(durand.status, RunStatus::Completed, "{durand:?}");
    assert_eq!(durand.text, "2 contacts");
    loom.stop(std::time::Duration::from_secs(5)).await;
    stop.cancel();
    // Only Durand's call reached the server: Martin's waits for a human, Dupont had no tool.
    assert_eq!(crm.seen.lock().unwrap().len(), 1);
}
