//! API keys' rate limits counted in Redis (`storage.limits` `backend: redis`, on the server
//! `LOOM_TEST_REDIS`): two servers enforce one key's limit, and a Redis that cannot be reached
//! answers 503 `limits_unavailable` with `Retry-After`, as the OpenAPI document says.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use loom_ia::Loom;
use reqwest::{StatusCode, header::HeaderMap};
use serde_json::Value;
use sha2::{Digest, Sha256};

const SECRET: &str = "lk_shared_limits_0123456789abcdef";

/// A configuration whose key `key_id` may make 2 requests a minute, limits in Redis at the URL
/// the variable `url_env` names.
fn yaml(key_id: &str, url_env: &str) -> String {
    let hash = format!("sha256:{}", hex::encode(Sha256::digest(SECRET.as_bytes())));
    format!(
        "version: 1\n\
         models:\n  - {{id: fake-1, sdk: fake, model: FAKE}}\n\
         agents:\n  - {{name: echo, main: {{model: fake-1}}}}\n\
         tenants:\n  - {{id: acme}}\n\
         security:\n  api_keys:\n    - {{id: {key_id}, hash: \"{hash}\", tenant: acme, rate_limit: {{per_minute: 2}}}}\n\
         storage:\n  events: {{backend: memory}}\n  limits: {{backend: redis, url_env: {url_env}}}\n"
    )
}

/// A server over the configuration written in `dir` (with its env file); its `/v1` base URL.
async fn start(dir: &Path, yaml: &str, env: &str) -> (String, Loom) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    std::fs::write(dir.join("loom.yaml"), yaml).unwrap();
    std::fs::write(dir.join(".env"), env).unwrap();
    let loom = Loom::open_config(dir.join("loom.yaml"), None)
        .await
        .unwrap();
    let settings = loom.config().raw().server.http.clone();
    let (listener, address) = loom_http::bind("127.0.0.1", 0).await.unwrap();
    let served = loom.clone();
    tokio::spawn(async move {
        loom_http::serve(served, listener, &settings, std::future::pending()).await
    });
    (format!("http://{address}/v1"), loom)
}

async fn agents(base: &str) -> (StatusCode, HeaderMap, Value) {
    let response = reqwest::Client::new()
        .get(format!("{base}/agents"))
        .bearer_auth(SECRET)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, headers, body)
}

/// Erases the window `loom:rate:<key id>` when dropped.
struct Window {
    url: String,
    key: String,
}

impl Drop for Window {
    fn drop(&mut self) {
        if let Ok(mut conn) =
            redis::Client::open(self.url.as_str()).and_then(|client| client.get_connection())
        {
            let _: Result<i64, _> = redis::cmd("DEL").arg(&self.key).query(&mut conn);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_enforce_one_key_rate_limit() {
    let Some(url) = loom_testkit::services::redis("two_servers_enforce_one_key_rate_limit") else {
        return;
    };
    let key_id = loom_testkit::services::unique("limited");
    let _window = Window {
        url: url.clone(),
        key: format!("loom:rate:{key_id}"),
    };
    let yaml = yaml(&key_id, "LIMITS_URL");
    let env = format!("LIMITS_URL={url}\n");
    let (one_dir, two_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (one, _a) = start(one_dir.path(), &yaml, &env).await;
    let (two, _b) = start(two_dir.path(), &yaml, &env).await;
    assert_eq!(agents(&one).await.0, StatusCode::OK);
    assert_eq!(agents(&two).await.0, StatusCode::OK);
    // The key's third request of the minute is refused by either server.
    for base in [&one, &two] {
        let (status, headers, body) = agents(base).await;
        assert_eq!(
            (status, body["error"]["kind"].as_str()),
            (StatusCode::TOO_MANY_REQUESTS, Some("rate_limited"))
        );
        let seconds: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
        assert!((1..=60).contains(&seconds), "{seconds}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_is_503_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 1 of this host.
    let (base, loom) = start(
        dir.path(),
        &yaml("limited", "LIMITS_URL"),
        "LIMITS_URL=redis://127.0.0.1:1\n",
    )
    .await;
    let (status, headers, body) = agents(&base).await;
    assert_eq!(
        (status, body["error"]["kind"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("limits_unavailable"))
    );
    assert_eq!(headers["retry-after"], "5");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the rate limit of key 'limited'"),
        "{message}"
    );
    // The document says so, on every operation, with the header and the kind.
    let settings = loom.config().raw().server.http.clone();
    let document = loom_http::openapi_document(&loom, &settings);
    let answer = &document["paths"]["/v1/agents"]["get"]["responses"]["503"];
    assert!(
        answer["description"]
            .as_str()
            .unwrap()
            .contains("limits_unavailable"),
        "{answer}"
    );
    assert!(answer["headers"]["Retry-After"].is_object(), "{answer}");
    let kinds = document.to_string();
    assert!(kinds.contains("\"limits_unavailable\""));
}
