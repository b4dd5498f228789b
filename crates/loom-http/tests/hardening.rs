//! What a slow, greedy or hostile client meets, through real sockets: a request whose headers
//! or body never finish is closed (`408` for a body), connections beyond
//! `server.http.max_connections` wait until one frees, the open API refuses another `Host`
//! (DNS rebinding) and another site's `Origin` (a cross-site form), an MCP origin without a
//! port admits only the default port, and a server error answers an id, never a file path.
//!
//! No assertion is on a duration: each waits for an outcome (a closed connection, an answer)
//! under a generous bound that only a failure reaches.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use loom_ia::{
    Loom,
    config::{AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Sdk},
};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// A bound no passing test reaches.
const PATIENCE: Duration = Duration::from_secs(30);

const KEY: &str = "lk_hardening-000000000000000000000000000000000";

fn config(dir: &std::path::Path, adapt: impl FnOnce(&mut LoomConfig)) -> Config {
    let mut model = ModelSpec::new("fake-echo", Sdk::Fake, "FAKE");
    model
        .params
        .insert("script".into(), json!([{"text": "Bonjour."}]));
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![AgentSpec::new("echo", "fake-echo")],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    adapt(&mut raw);
    Config::new(raw, dir.to_path_buf()).unwrap()
}

/// A key with every scope, for the configurations with keys.
fn with_key(raw: &mut LoomConfig) {
    raw.security.api_keys = vec![loom_ia::config::ApiKeySpec {
        id: "all".into(),
        hash: loom_http::key_hash(KEY),
        tenant: "default".into(),
        expires: None,
        scopes: vec![loom_ia::config::Scope::Admin],
        rate_limit: None,
        agents: Vec::new(),
    }];
}

struct Served {
    address: String,
    dir: tempfile::TempDir,
}

async fn serve(adapt: impl FnOnce(&mut LoomConfig)) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let loom = Loom::new(config(dir.path(), adapt)).unwrap();
    let settings = loom.config().raw().server.http.clone();
    let (listener, address) = loom_http::bind("127.0.0.1", 0).await.unwrap();
    tokio::spawn(async move {
        loom_http::serve(loom, listener, &settings, std::future::pending()).await
    });
    Served {
        address: address.to_string(),
        dir,
    }
}

/// Reads until the server closes the connection (or resets it); what it sent.
async fn until_closed(stream: &mut TcpStream) -> String {
    let mut received = Vec::new();
    let read = tokio::time::timeout(PATIENCE, async {
        let mut buffer = [0_u8; 4096];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buffer[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server kept the connection open");
    String::from_utf8(received).unwrap()
}

/// One response read from a keep-alive connection (its headers and its `Content-Length` body).
async fn one_response(stream: &mut TcpStream) -> (u16, String) {
    let mut received = Vec::new();
    let mut buffer = [0_u8; 4096];
    tokio::time::timeout(PATIENCE, async {
        loop {
            let text = String::from_utf8_lossy(&received).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length: usize = head
                    .lines()
                    .find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if body.len() >= length {
                    return (head[9..12].parse().unwrap(), body[..length].to_owned());
                }
            }
            let n = stream.read(&mut buffer).await.unwrap();
            assert!(n > 0, "the connection closed before its response");
            received.extend_from_slice(&buffer[..n]);
        }
    })
    .await
    .expect("no response")
}

/// A plain request on a fresh connection: its status and JSON body.
async fn request(address: &str, head: &str, body: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let text = format!(
        "{head}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(text.as_bytes()).await.unwrap();
    let (status, body) = one_response(&mut stream).await;
    (
        status,
        serde_json::from_str(&body).unwrap_or(Value::String(body)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_never_finishes_is_closed() {
    let served = serve(|raw| {
        raw.server.http.header_timeout = 0.5;
        raw.server.http.body_timeout = 0.5;
    })
    .await;
    // Headers cut short: the connection is closed.
    let mut stream = TcpStream::connect(&served.address).await.unwrap();
    stream
        .write_all(b"GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .unwrap();
    let answered = until_closed(&mut stream).await;
    assert!(!answered.contains("200 OK"), "{answered}");
    // A body cut short: 408, and the connection is closed.
    let mut stream = TcpStream::connect(&served.address).await.unwrap();
    stream
        .write_all(
            b"POST /v1/agents/echo/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n\
              Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"message\": ",
        )
        .await
        .unwrap();
    let answered = until_closed(&mut stream).await;
    assert!(answered.starts_with("HTTP/1.1 408 "), "{answered}");
    assert!(answered.contains("\"request_timeout\""), "{answered}");
    // Nothing was run.
    assert!(!served.dir.path().join("journal/default").exists());
    // A whole request is still served.
    let (status, body) = request(
        &served.address,
        "GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_wait_until_one_frees() {
    let served = serve(|raw| raw.server.http.max_connections = 1).await;
    let get = b"GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    // The first connection holds the only slot (kept alive).
    let mut first = TcpStream::connect(&served.address).await.unwrap();
    first.write_all(get).await.unwrap();
    assert_eq!(one_response(&mut first).await.0, 200);
    // The second is accepted by the kernel, its request sent, but it is not served...
    let mut second = TcpStream::connect(&served.address).await.unwrap();
    second.write_all(get).await.unwrap();
    // ... while the first is, again and again.
    for _ in 0..3 {
        first.write_all(get).await.unwrap();
        assert_eq!(one_response(&mut first).await.0, 200);
    }
    let mut probe = [0_u8; 16];
    match second.try_read(&mut probe) {
        Err(error) => assert_eq!(error.kind(), std::io::ErrorKind::WouldBlock),
        Ok(n) => panic!(
            "a connection beyond the cap was served: {}",
            String::from_utf8_lossy(&probe[..n])
        ),
    }
    // The first closes: the second is served.
    drop(first);
    assert_eq!(one_response(&mut second).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_api_refuses_other_hosts_and_other_sites() {
    let served = serve(|_| {}).await;
    let address = &served.address;
    let port = address.rsplit(':').next().unwrap();
    let run = r#"{"message": "Salut"}"#;
    // DNS rebinding: the attacker's name, pointing at 127.0.0.1.
    let (status, body) = request(
        address,
        &format!("GET /v1/agents HTTP/1.1\r\nHost: rebind.example:{port}\r\n"),
        "",
    )
    .await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (403, Some("host_not_allowed")),
        "{body}"
    );
    // A cross-site form post.
    let (status, body) = request(
        address,
        &format!(
            "POST /v1/agents/echo/runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Origin: https://evil.example\r\n"
        ),
        run,
    )
    .await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (403, Some("origin_not_allowed")),
        "{body}"
    );
    assert!(!served.dir.path().join("journal/default").exists());
    // The loopback names on any port, and the server's own origin (its docs page), pass.
    let (status, _) = request(
        address,
        &format!("GET /v1/agents HTTP/1.1\r\nHost: localhost:{port}\r\n"),
        "",
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = request(
        address,
        &format!(
            "POST /v1/agents/echo/runs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Origin: http://127.0.0.1:{port}\r\n"
        ),
        run,
    )
    .await;
    assert_eq!(status, 201, "{body}");

    // Declared hosts and origins.
    let named = serve(|raw| {
        raw.server.http.allowed_hosts = vec!["loom.example.com".into()];
        raw.server.http.allowed_origins = vec!["https://front.example".into()];
    })
    .await;
    let (status, body) = request(
        &named.address,
        "POST /v1/agents/echo/runs HTTP/1.1\r\nHost: loom.example.com\r\nOrigin: https://front.example\r\n",
        run,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, _) = request(
        &named.address,
        &format!("GET /v1/agents HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"),
        "",
    )
    .await;
    assert_eq!(status, 403);

    // With keys, the key protects the API: any Host is answered.
    let keyed = serve(with_key).await;
    let (status, body) = request(
        &keyed.address,
        &format!(
            "GET /v1/agents HTTP/1.1\r\nHost: loom.example.com\r\nAuthorization: Bearer {KEY}\r\n"
        ),
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// `server.mcp.allowed_origins: [https://app.example.com]` admits that origin on its default
/// port only; rmcp alone would admit any port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_origin_without_a_port_is_the_default_port_only() {
    let served = serve(|raw| {
        with_key(raw);
        raw.server.mcp.http = true;
        raw.server.mcp.allowed_origins = vec!["https://app.example.com".into()];
    })
    .await;
    let initialize = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}},
    })
    .to_string();
    let mcp = |origin: &str| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n\
             Accept: application/json, text/event-stream\r\nOrigin: {origin}\r\n"
        )
    };
    let (status, body) = request(
        &served.address,
        &mcp("https://app.example.com:8443"),
        &initialize,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = request(
        &served.address,
        &mcp("https://app.example.com"),
        &initialize,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = request(
        &served.address,
        &mcp("https://app.example.com:443"),
        &initialize,
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

/// A journal that cannot be read is a 500 whose answer names no file: its detail is logged
/// under the id the answer gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_answers_an_id_not_a_path() {
    let served = serve(|_| {}).await;
    let tenant = served.dir.path().join("journal/default");
    std::fs::create_dir_all(&tenant).unwrap();
    std::fs::write(tenant.join("s-bad.jsonl"), "{\"not\": \"an event\"}\n").unwrap();
    let (status, body) = request(
        &served.address,
        "GET /v1/sessions/s-bad HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        "",
    )
    .await;
    assert_eq!(status, 500, "{body}");
    let text = body.to_string();
    let root = served.dir.path().to_string_lossy().into_owned();
    assert!(!text.contains(&root), "the answer names a file: {text}");
    assert!(!text.contains(".jsonl"), "the answer names a file: {text}");
    let id = body["error"]["error_id"].as_str().unwrap();
    assert!(
        body["error"]["message"].as_str().unwrap().contains(id),
        "{body}"
    );
}
