//! `fetch_page` against a hand-written HTTP/1.1 server on 127.0.0.1 and a test resolver.
//!
//! No test reaches another host: names resolve through [`TestResolver`] only, and every
//! non-loopback address it hands out (10.0.0.5, 8.8.8.8) is refused before any connection.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::ctx;

use std::{
    collections::HashMap,
    io::{self, Write},
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use flate2::{Compression, write::GzEncoder};
use loom_builtins::{FetchOptions, Resolver, fetch_page, refusal_rule, rules};
use loom_core::{
    BoxFuture,
    tool::{FnTool, SideEffects, Tool, ToolContext, ToolError},
};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

/// Maps test names to addresses and counts the look-ups.
#[derive(Debug, Default, Clone)]
struct TestResolver {
    names: Arc<HashMap<String, Vec<IpAddr>>>,
    lookups: Arc<Mutex<Vec<String>>>,
}

impl TestResolver {
    fn new(names: &[(&str, &[&str])]) -> TestResolver {
        let names = names
            .iter()
            .map(|(name, ips)| {
                let ips = ips.iter().map(|ip| ip.parse().unwrap()).collect();
                (name.to_string(), ips)
            })
            .collect();
        TestResolver {
            names: Arc::new(names),
            lookups: Arc::default(),
        }
    }

    fn lookups(&self) -> Vec<String> {
        self.lookups.lock().unwrap().clone()
    }
}

impl Resolver for TestResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'_, io::Result<Vec<SocketAddr>>> {
        self.lookups.lock().unwrap().push(host.to_owned());
        let found = self.names.get(host).map(|ips| {
            ips.iter()
                .map(|ip| SocketAddr::new(*ip, port))
                .collect::<Vec<_>>()
        });
        Box::pin(async move {
            found.ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "unknown test name"))
        })
    }
}

/// One canned answer.
struct Reply {
    status: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn ok(content_type: &str, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status: "200 OK",
            headers: vec![("Content-Type", content_type.to_owned())],
            body: body.into(),
        }
    }

    fn redirect(location: impl Into<String>) -> Reply {
        Reply {
            status: "302 Found",
            headers: vec![("Location", location.into())],
            body: Vec::new(),
        }
    }
}

type Routes = Arc<dyn Fn(&str) -> Reply + Send + Sync>;

/// A tiny HTTP/1.1 server on 127.0.0.1:0; it records the paths it was asked for, and the
/// `traceparent` header of each request.
struct Server {
    address: SocketAddr,
    hits: Arc<Mutex<Vec<String>>>,
    traces: Arc<Mutex<Vec<Option<String>>>>,
}

impl Server {
    async fn start(routes: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Server {
        let routes: Routes = Arc::new(routes);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let traces = Arc::new(Mutex::new(Vec::new()));
        let recorded = hits.clone();
        let traced = traces.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let routes = routes.clone();
                let hits = recorded.clone();
                let traces = traced.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buffer[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&request).into_owned();
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    hits.lock().unwrap().push(path.clone());
                    let trace = head.lines().find_map(|line| {
                        let (name, value) = line.split_once(':')?;
                        name.eq_ignore_ascii_case("traceparent")
                            .then(|| value.trim().to_owned())
                    });
                    traces.lock().unwrap().push(trace);
                    if path == "/slow" {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                    let reply = routes(&path);
                    let mut out = format!("HTTP/1.1 {}\r\n", reply.status);
                    for (name, value) in &reply.headers {
                        out.push_str(&format!("{name}: {value}\r\n"));
                    }
                    out.push_str(&format!(
                        "Content-Length: {}\r\nConnection: close\r\n\r\n",
                        reply.body.len()
                    ));
                    let _ = stream.write_all(out.as_bytes()).await;
                    let _ = stream.write_all(&reply.body).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        Server {
            address,
            hits,
            traces,
        }
    }

    fn traces(&self) -> Vec<Option<String>> {
        self.traces.lock().unwrap().clone()
    }

    fn port(&self) -> u16 {
        self.address.port()
    }

    fn hits(&self) -> Vec<String> {
        self.hits.lock().unwrap().clone()
    }
}

const PAGE: &str = "<!doctype html><html><head><title>Loom &amp; tools</title>\
    <script>var hidden = 1;</script></head><body>\
    <h1>Fetched</h1><p>Read <a href=\"https://example.org/doc\">the doc</a>.</p>\
    <ul><li>first</li><li>second</li></ul></body></html>";

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

fn site(path: &str) -> Reply {
    match path {
        "/page" => Reply::ok("text/html; charset=utf-8", PAGE),
        "/notes.txt" => Reply::ok("text/plain", "just *text*, <b>kept</b>"),
        "/image.png" => Reply::ok("image/png", vec![0x89, b'P', b'N', b'G']),
        "/gzip-page" => {
            let mut reply = Reply::ok("text/html", gzip(PAGE.as_bytes()));
            reply.headers.push(("Content-Encoding", "gzip".to_owned()));
            reply
        }
        "/bomb" => {
            // 8 MiB of text that compresses to a few KiB.
            let mut reply = Reply::ok("text/plain", gzip(&vec![b'a'; 8 * 1024 * 1024]));
            reply.headers.push(("Content-Encoding", "gzip".to_owned()));
            reply
        }
        "/hop" => Reply::redirect("/page"),
        "/loop" => Reply::redirect("/loop"),
        "/to-ftp" => Reply::redirect("ftp://files.test/x"),
        "/to-internal" => Reply::redirect("http://internal.test/admin"),
        "/to-ipv6-loopback" => Reply::redirect("http://[::1]/"),
        other if other.starts_with("/to-local/") => Reply::redirect(format!(
            "http://127.0.0.1:{}/page",
            &other["/to-local/".len()..]
        )),
        _ => Reply {
            status: "404 Not Found",
            headers: vec![],
            body: b"nothing here".to_vec(),
        },
    }
}

fn options(resolver: &TestResolver) -> FetchOptions {
    FetchOptions {
        resolver: Arc::new(resolver.clone()),
        timeout: Duration::from_secs(10),
        ..FetchOptions::default()
    }
}

async fn fetch(tool: &FnTool, url: &str) -> Result<String, ToolError> {
    tool.call(ctx(), json!({ "url": url }))
        .await
        .map(|output| output.visible_text())
}

async fn refused(tool: &FnTool, url: &str) -> (String, String) {
    let error = fetch(tool, url)
        .await
        .expect_err(&format!("{url} should be refused"));
    let rule = refusal_rule(&error)
        .unwrap_or_else(|| panic!("not a refusal: {}", error.message))
        .to_owned();
    (rule, error.message)
}

#[tokio::test]
async fn non_public_ip_literals_are_refused() {
    let resolver = TestResolver::default();
    let tool = fetch_page(options(&resolver));
    assert_eq!(tool.spec().name, "fetch_page");
    assert_eq!(tool.spec().declarations.side_effects, SideEffects::None);
    for url in [
        "http://127.0.0.1/",
        "http://[::1]/",
        "https://127.0.0.1:8443/admin",
        "http://[::ffff:127.0.0.1]/",
        "http://2130706433/",
        "http://0.0.0.0/",
        "http://10.0.0.5/",
        "http://169.254.169.254/latest/meta-data/",
        "http://100.64.0.1/",
        "http://[fd00::1]/",
        "http://[fe80::1]/",
        "http://224.0.0.1/",
        "http://255.255.255.255/",
        "http://192.0.2.1/",
    ] {
        let (rule, message) = refused(&tool, url).await;
        assert_eq!(rule, rules::PUBLIC_ADDRESS, "{url}: {message}");
    }
    let (_, message) = refused(&tool, "http://[::1]/").await;
    assert_eq!(
        message,
        "refused by rule 'public-address': ::1 is a loopback (::1) address; only public \
         addresses can be fetched (http://[::1]/)"
    );
    assert!(
        resolver.lookups().is_empty(),
        "IP literals are not resolved"
    );
}

#[tokio::test]
async fn only_http_and_https() {
    let resolver = TestResolver::new(&[("files.test", &["8.8.8.8"])]);
    let tool = fetch_page(options(&resolver));
    for url in [
        "ftp://files.test/x",
        "file:///etc/passwd",
        "gopher://files.test/",
    ] {
        let (rule, message) = refused(&tool, url).await;
        assert_eq!(rule, rules::HTTP_ONLY, "{url}: {message}");
    }
    assert!(resolver.lookups().is_empty());
}

#[tokio::test]
async fn names_resolving_to_private_addresses_are_refused() {
    let resolver = TestResolver::new(&[
        ("intranet.test", &["10.0.0.5"]),
        ("sneaky.test", &["127.0.0.1"]),
        ("mixed.test", &["8.8.8.8", "10.0.0.5"]),
        ("mapped.test", &["::ffff:192.168.1.1"]),
    ]);
    let tool = fetch_page(options(&resolver));
    for (url, address) in [
        ("http://intranet.test/", "10.0.0.5"),
        ("https://sneaky.test/login", "127.0.0.1"),
        ("http://mixed.test/", "10.0.0.5"),
        ("http://mapped.test/", "::ffff:192.168.1.1"),
    ] {
        let (rule, message) = refused(&tool, url).await;
        assert_eq!(rule, rules::PUBLIC_ADDRESS, "{url}: {message}");
        assert!(
            message.contains(&format!("resolves to {address}")),
            "{message}"
        );
    }
}

#[tokio::test]
async fn html_becomes_markdown_when_private_addresses_are_allowed() {
    let server = Server::start(site).await;
    let resolver = TestResolver::new(&[("docs.test", &["127.0.0.1"])]);
    let tool = fetch_page(FetchOptions {
        allow_private: true,
        ..options(&resolver)
    });
    let port = server.port();
    let text = fetch(&tool, &format!("http://docs.test:{port}/page"))
        .await
        .unwrap();
    assert_eq!(
        text,
        format!(
            "URL: http://docs.test:{port}/page\nTitle: Loom & tools\n\n# Fetched\n\n\
             Read [the doc](https://example.org/doc).\n\n- first\n- second"
        )
    );
    // Checked once, then connected to the pinned address: no second look-up to rebind.
    assert_eq!(resolver.lookups(), ["docs.test"]);

    let text = fetch(&tool, &format!("http://127.0.0.1:{port}/notes.txt"))
        .await
        .unwrap();
    assert_eq!(
        text,
        format!("URL: http://127.0.0.1:{port}/notes.txt\n\njust *text*, <b>kept</b>")
    );

    let (rule, message) = refused(&tool, &format!("http://127.0.0.1:{port}/image.png")).await;
    assert_eq!(rule, rules::TEXT_ONLY, "{message}");

    let error = fetch(&tool, &format!("http://127.0.0.1:{port}/missing"))
        .await
        .unwrap_err();
    assert!(error.message.contains("HTTP 404"), "{}", error.message);

    // Redirects are followed, and the final URL is reported.
    let text = fetch(&tool, &format!("http://docs.test:{port}/hop"))
        .await
        .unwrap();
    assert!(
        text.starts_with(&format!(
            "URL: http://docs.test:{port}/page\nTitle: Loom & tools"
        )),
        "{text}"
    );
}

#[tokio::test]
async fn gzip_is_decompressed_and_capped_after_decompression() {
    let server = Server::start(site).await;
    let resolver = TestResolver::default();
    let tool = fetch_page(FetchOptions {
        allow_private: true,
        max_bytes: 64 * 1024,
        ..options(&resolver)
    });
    let port = server.port();
    let text = fetch(&tool, &format!("http://127.0.0.1:{port}/gzip-page"))
        .await
        .unwrap();
    assert!(text.contains("Title: Loom & tools"), "{text}");
    assert!(text.contains("# Fetched"), "{text}");

    let text = fetch(&tool, &format!("http://127.0.0.1:{port}/bomb"))
        .await
        .unwrap();
    let (head, body) = text.split_once("\n\n").unwrap();
    assert!(
        head.contains("[cut: the page is larger than 65536 bytes"),
        "{head}"
    );
    assert_eq!(body.len(), 64 * 1024);
    assert!(body.bytes().all(|b| b == b'a'));
}

#[tokio::test]
async fn redirects_to_private_addresses_are_refused() {
    // The public side: a server whose exact address the operator allowed. The local server
    // behind it is not allowed.
    let public = Server::start(site).await;
    let local = Server::start(site).await;
    let resolver = TestResolver::new(&[
        ("public.test", &["127.0.0.1"]),
        ("internal.test", &["10.0.0.5"]),
    ]);
    let tool = fetch_page(FetchOptions {
        allowed_addresses: vec![public.address],
        max_redirects: 3,
        ..options(&resolver)
    });
    let port = public.port();
    // The allowed server itself answers.
    let text = fetch(&tool, &format!("http://public.test:{port}/page"))
        .await
        .unwrap();
    assert!(text.contains("# Fetched"), "{text}");

    let (rule, message) = refused(
        &tool,
        &format!("http://public.test:{port}/to-local/{}", local.port()),
    )
    .await;
    assert_eq!(rule, rules::PUBLIC_ADDRESS, "{message}");
    assert!(
        message.contains("127.0.0.1 is a loopback (127.0.0.0/8) address"),
        "{message}"
    );
    assert!(
        local.hits().is_empty(),
        "the local server was reached: {:?}",
        local.hits()
    );

    let (rule, message) = refused(&tool, &format!("http://public.test:{port}/to-internal")).await;
    assert_eq!(rule, rules::PUBLIC_ADDRESS, "{message}");
    assert!(
        message.contains("'internal.test' resolves to 10.0.0.5"),
        "{message}"
    );

    let (rule, _) = refused(
        &tool,
        &format!("http://public.test:{port}/to-ipv6-loopback"),
    )
    .await;
    assert_eq!(rule, rules::PUBLIC_ADDRESS);

    let (rule, _) = refused(&tool, &format!("http://public.test:{port}/to-ftp")).await;
    assert_eq!(rule, rules::HTTP_ONLY);

    let (rule, message) = refused(&tool, &format!("http://public.test:{port}/loop")).await;
    assert_eq!(rule, rules::MAX_REDIRECTS, "{message}");
    assert_eq!(public.hits().iter().filter(|p| *p == "/loop").count(), 4);

    // Without the allowance, the public name's own address is refused too.
    let strict = fetch_page(options(&resolver));
    let (rule, _) = refused(&strict, &format!("http://public.test:{port}/page")).await;
    assert_eq!(rule, rules::PUBLIC_ADDRESS);
}

#[tokio::test]
async fn the_whole_call_has_a_time_limit() {
    let server = Server::start(site).await;
    let resolver = TestResolver::default();
    let tool = fetch_page(FetchOptions {
        allow_private: true,
        timeout: Duration::from_millis(300),
        ..options(&resolver)
    });
    let error = fetch(&tool, &format!("http://127.0.0.1:{}/slow", server.port()))
        .await
        .unwrap_err();
    assert!(
        error.message.contains("did not load within 0.3 s"),
        "{}",
        error.message
    );
}

/// The call's W3C `traceparent` goes with every request of the call, redirect hops included;
/// a call without one sends none.
#[tokio::test]
async fn the_calls_traceparent_is_sent_as_an_http_header() {
    let server = Server::start(site).await;
    let resolver = TestResolver::new(&[("site.test", &["127.0.0.1"])]);
    let tool = fetch_page(FetchOptions {
        allow_private: true,
        ..options(&resolver)
    });
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = ToolContext {
        traceparent: Some(traceparent.into()),
        ..ctx()
    };
    let url = format!("http://site.test:{}/hop", server.port());
    let page = tool.call(traced, json!({ "url": url })).await.unwrap();
    assert!(page.visible_text().contains("Fetched"));
    assert_eq!(server.hits(), vec!["/hop", "/page"]);
    assert_eq!(
        server.traces(),
        vec![Some(traceparent.to_owned()), Some(traceparent.to_owned())]
    );

    fetch(&tool, &format!("http://site.test:{}/page", server.port()))
        .await
        .unwrap();
    assert_eq!(server.traces().last(), Some(&None));
}
