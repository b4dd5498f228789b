//! `UrlFetcher` against a local HTTP server on 127.0.0.1 and fake DNS answers.
//!
//! No test reaches another host: names resolve through [`FakeDns`] only, and every
//! non-loopback address it hands out, or an URL names, is refused before any connection.
//! The server is reached either with the guard lifted (`allow_private`) or with the guard on
//! and 127.0.0.1 alone listed in `allowed_addresses`, so that refusals of every other
//! non-public address (redirects included) are tested with the guard in force.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    io::{self, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use async_trait::async_trait;
use axum::{
    Router,
    body::Body,
    extract::Path,
    http::{HeaderMap, Response, StatusCode, header},
    routing::get,
};
use loom_notes_sources::{FetchSettings, HostResolver, SourceError, UrlFetcher};

const MAX: u64 = 10_000;
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Fake DNS: fixed answers per name, "not found" for any other.
#[derive(Debug, Default)]
struct FakeDns(HashMap<String, Vec<IpAddr>>);

impl FakeDns {
    fn with(answers: &[(&str, &[&str])]) -> Arc<FakeDns> {
        Arc::new(FakeDns(
            answers
                .iter()
                .map(|(name, addresses)| {
                    (
                        (*name).to_owned(),
                        addresses.iter().map(|a| a.parse().unwrap()).collect(),
                    )
                })
                .collect(),
        ))
    }
}

#[async_trait]
impl HostResolver for FakeDns {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        self.0
            .get(host)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no such name {host}")))
    }
}

fn dns() -> Arc<FakeDns> {
    FakeDns::with(&[
        ("public.test", &["127.0.0.1"]),
        ("internal.test", &["127.0.0.2"]),
        ("private.test", &["10.0.0.5"]),
        ("mixed.test", &["127.0.0.1", "192.168.1.10"]),
        ("empty.test", &[]),
    ])
}

const PAGE: &str = r#"<html><head><meta property="og:title" content="OG Titre"><title>T</title></head>
<body><nav>menu</nav><h1>Bonjour</h1><p>Un <strong>texte</strong>Important.</p><footer>pied</footer></body></html>"#;

fn html(body: impl Into<Body>) -> Response<Body> {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/html; charset=utf-8")
        .body(body.into())
        .unwrap()
}

fn redirect(location: String) -> Response<Body> {
    Response::builder()
        .status(StatusCode::FOUND)
        .header(header::LOCATION, location)
        .body(Body::empty())
        .unwrap()
}

fn big_page() -> String {
    format!(
        "<html><body><p>{}</p></body></html>",
        "a".repeat(2 * MAX as usize)
    )
}

/// Starts the test server; returns its port.
async fn server() -> u16 {
    let listener = tokio::net::TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new()
        .route("/page", get(|| async { html(PAGE) }))
        .route(
            "/headers",
            get(|headers: HeaderMap| async move {
                let get = |name| {
                    headers
                        .get(name)
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default()
                };
                html(format!(
                    "<body><p>UA={}</p><p>ACCEPT={}</p></body>",
                    get(header::USER_AGENT),
                    get(header::ACCEPT)
                ))
            }),
        )
        .route(
            "/chain/{n}",
            get(move |Path(n): Path<u32>| async move {
                if n == 0 {
                    html(PAGE)
                } else {
                    redirect(format!("http://127.0.0.1:{port}/chain/{}", n - 1))
                }
            }),
        )
        .route(
            "/to-private-literal",
            get(|| async { redirect("http://10.0.0.1/admin".to_owned()) }),
        )
        .route(
            "/to-metadata",
            get(|| async { redirect("http://169.254.169.254/latest/meta-data/".to_owned()) }),
        )
        .route(
            "/to-internal-name",
            get(move || async move { redirect(format!("http://internal.test:{port}/page")) }),
        )
        .route(
            "/to-public-name",
            get(move || async move { redirect(format!("http://public.test:{port}/page")) }),
        )
        .route(
            "/to-file",
            get(|| async { redirect("file:///etc/passwd".to_owned()) }),
        )
        .route("/big-declared", get(|| async { html(big_page()) }))
        .route(
            "/big-streamed",
            get(|| async {
                let chunks = big_page()
                    .into_bytes()
                    .chunks(1000)
                    .map(|chunk| Ok::<_, io::Error>(chunk.to_vec()))
                    .collect::<Vec<_>>();
                html(Body::from_stream(futures_util::stream::iter(chunks)))
            }),
        )
        .route(
            "/gzip-bomb",
            get(|| async {
                let mut encoder =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                encoder.write_all(big_page().as_bytes()).unwrap();
                let compressed = encoder.finish().unwrap();
                assert!((compressed.len() as u64) < MAX / 10);
                Response::builder()
                    .header(header::CONTENT_TYPE, "text/html")
                    .header(header::CONTENT_ENCODING, "gzip")
                    .body(Body::from(compressed))
                    .unwrap()
            }),
        )
        .route(
            "/gzip-small",
            get(|| async {
                let mut encoder =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                encoder.write_all(PAGE.as_bytes()).unwrap();
                Response::builder()
                    .header(header::CONTENT_TYPE, "text/html")
                    .header(header::CONTENT_ENCODING, "gzip")
                    .body(Body::from(encoder.finish().unwrap()))
                    .unwrap()
            }),
        )
        .route(
            "/pdf",
            get(|| async {
                Response::builder()
                    .header(header::CONTENT_TYPE, "application/pdf")
                    .body(Body::from("%PDF-1.7"))
                    .unwrap()
            }),
        )
        .route(
            "/untyped",
            get(|| async { Response::new(Body::from("<html><body>x</body></html>")) }),
        )
        .route(
            "/xhtml",
            get(|| async {
                Response::builder()
                    .header(header::CONTENT_TYPE, "application/xhtml+xml")
                    .body(Body::from(PAGE))
                    .unwrap()
            }),
        )
        .route(
            "/missing",
            get(|| async { (StatusCode::NOT_FOUND, html("<p>not here</p>")) }),
        )
        .route(
            "/broken",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, html("<p>oops</p>")) }),
        )
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                html(PAGE)
            }),
        )
        .route(
            "/stalling-body",
            get(|| async {
                let first = futures_util::stream::iter([Ok::<_, io::Error>(
                    b"<html><body><p>start".to_vec(),
                )]);
                let stall = futures_util::stream::once(async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Ok::<_, io::Error>(b"end</p></body></html>".to_vec())
                });
                html(Body::from_stream(futures_util::StreamExt::chain(
                    first, stall,
                )))
            }),
        )
        .route(
            "/latin1",
            get(|| async {
                let mut body = b"<html><body><h1>Caf".to_vec();
                body.push(0xe9);
                body.extend_from_slice(b"</h1><p>cr\xe8me br\xfbl\xe9e</p></body></html>");
                Response::builder()
                    .header(header::CONTENT_TYPE, "text/html; charset=ISO-8859-1")
                    .body(Body::from(body))
                    .unwrap()
            }),
        )
        .route(
            "/empty",
            get(|| async { html("<html><body><nav>menu</nav></body></html>") }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

/// The guard on, 127.0.0.1 alone allowed (the test server), fake DNS.
fn guarded() -> FetchSettings {
    FetchSettings {
        timeout: Duration::from_secs(10),
        max_bytes: MAX,
        allowed_addresses: vec![LOOPBACK],
        resolver: dns(),
        ..FetchSettings::default()
    }
}

/// The guard lifted, fake DNS.
fn open() -> FetchSettings {
    FetchSettings {
        allow_private: true,
        allowed_addresses: Vec::new(),
        ..guarded()
    }
}

async fn fetch(
    settings: FetchSettings,
    url: &str,
) -> Result<loom_notes_sources::SourceDocument, SourceError> {
    UrlFetcher::new(settings).unwrap().fetch(url).await
}

#[tokio::test]
async fn a_page_is_fetched_and_extracted_with_the_requested_url_as_source() {
    let port = server().await;
    let url = format!("  http://public.test:{port}/page \n");
    let doc = fetch(open(), &url).await.unwrap();
    assert_eq!(doc.title, "OG Titre");
    assert_eq!(doc.text, "# Bonjour\n\nUn **texte** Important.");
    assert_eq!(doc.source, format!("http://public.test:{port}/page"));
    // The same through an IP literal, the guard on and the address allowed.
    let doc = fetch(guarded(), &format!("http://127.0.0.1:{port}/page"))
        .await
        .unwrap();
    assert_eq!(doc.title, "OG Titre");
}

#[tokio::test]
async fn user_agent_and_accept_headers_are_sent() {
    let port = server().await;
    let settings = FetchSettings {
        user_agent: "loom-notes-test/1".to_owned(),
        ..open()
    };
    let doc = fetch(settings, &format!("http://127.0.0.1:{port}/headers"))
        .await
        .unwrap();
    assert!(doc.text.contains("UA=loom-notes-test/1"), "{}", doc.text);
    assert!(
        doc.text.contains("ACCEPT=text/html,application/xhtml+xml"),
        "{}",
        doc.text
    );
}

#[tokio::test]
async fn the_guard_refuses_a_name_resolving_to_the_loopback_unless_allowed() {
    let port = server().await;
    let settings = FetchSettings {
        allowed_addresses: Vec::new(),
        ..guarded()
    };
    let error = fetch(settings, &format!("http://public.test:{port}/page"))
        .await
        .unwrap_err();
    match &error {
        SourceError::NonPublicAddress { host, address, .. } => {
            assert_eq!((host.as_str(), *address), ("public.test", LOOPBACK));
        }
        other => panic!("expected NonPublicAddress, got {other:?}"),
    }
    assert_eq!(
        error.to_string(),
        "non-public address refused: public.test (127.0.0.1, loopback (127.0.0.0/8)). \
         Set LOOM_NOTES_FETCH_ALLOW_PRIVATE=true to allow it."
    );
}

#[tokio::test]
async fn private_and_mixed_dns_answers_are_refused_before_connecting() {
    let port = server().await;
    for (host, refused) in [
        ("private.test", "10.0.0.5"),
        ("internal.test", "127.0.0.2"),
        // One public-enough answer (allowed 127.0.0.1) does not excuse a private one.
        ("mixed.test", "192.168.1.10"),
    ] {
        let error = fetch(guarded(), &format!("http://{host}:{port}/page"))
            .await
            .unwrap_err();
        match error {
            SourceError::NonPublicAddress {
                host: found,
                address,
                ..
            } => {
                assert_eq!(found, host);
                assert_eq!(address, refused.parse::<IpAddr>().unwrap());
            }
            other => panic!("{host}: expected NonPublicAddress, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn unknown_names_and_empty_answers_are_host_not_found() {
    for host in ["nowhere.test", "empty.test"] {
        let error = fetch(guarded(), &format!("http://{host}/"))
            .await
            .unwrap_err();
        match error {
            SourceError::HostNotFound { host: found, .. } => assert_eq!(found, host),
            other => panic!("{host}: expected HostNotFound, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn redirects_to_private_addresses_are_refused() {
    let port = server().await;
    let cases = [
        ("to-private-literal", "10.0.0.1"),
        ("to-metadata", "169.254.169.254"),
        ("to-internal-name", "127.0.0.2"),
    ];
    for (path, refused) in cases {
        let error = fetch(guarded(), &format!("http://127.0.0.1:{port}/{path}"))
            .await
            .unwrap_err();
        match error {
            SourceError::NonPublicAddress { address, .. } => {
                assert_eq!(address, refused.parse::<IpAddr>().unwrap(), "{path}");
            }
            other => panic!("{path}: expected NonPublicAddress, got {other:?}"),
        }
    }
    // A redirect to a name resolving to an allowed address is followed, and the source stays
    // the requested URL.
    let requested = format!("http://127.0.0.1:{port}/to-public-name");
    let doc = fetch(guarded(), &requested).await.unwrap();
    assert_eq!(
        (doc.title.as_str(), doc.source.as_str()),
        ("OG Titre", requested.as_str())
    );
    // With the guard lifted, the redirect to the internal name is followed too... to an
    // address nobody listens on: a download failure, not a refusal.
    let error = fetch(open(), &format!("http://127.0.0.1:{port}/to-internal-name"))
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::Download { .. }), "{error:?}");
}

#[tokio::test]
async fn a_redirect_to_another_scheme_is_refused() {
    let port = server().await;
    let error = fetch(open(), &format!("http://127.0.0.1:{port}/to-file"))
        .await
        .unwrap_err();
    match error {
        SourceError::SchemeNotAllowed { url } => assert_eq!(url, "file:///etc/passwd"),
        other => panic!("expected SchemeNotAllowed, got {other:?}"),
    }
}

#[tokio::test]
async fn redirect_chains_are_followed_up_to_the_limit() {
    let port = server().await;
    let url = format!("http://127.0.0.1:{port}/chain/3");
    let settings = || FetchSettings {
        max_redirects: 3,
        ..guarded()
    };
    let doc = fetch(settings(), &url).await.unwrap();
    assert_eq!(doc.source, url);
    let url = format!("http://127.0.0.1:{port}/chain/4");
    match fetch(settings(), &url).await.unwrap_err() {
        SourceError::TooManyRedirects { url: found, max } => {
            assert_eq!((found, max), (url, 3));
        }
        other => panic!("expected TooManyRedirects, got {other:?}"),
    }
}

#[tokio::test]
async fn oversize_pages_are_refused_declared_streamed_or_compressed() {
    let port = server().await;
    let base = format!("http://127.0.0.1:{port}");
    match fetch(guarded(), &format!("{base}/big-declared"))
        .await
        .unwrap_err()
    {
        SourceError::DeclaredTooLarge { declared, max } => {
            assert_eq!(declared, big_page().len() as u64);
            assert_eq!(max, MAX);
        }
        other => panic!("expected DeclaredTooLarge, got {other:?}"),
    }
    for path in ["big-streamed", "gzip-bomb"] {
        match fetch(guarded(), &format!("{base}/{path}"))
            .await
            .unwrap_err()
        {
            SourceError::BodyTooLarge { max } => assert_eq!(max, MAX),
            other => panic!("{path}: expected BodyTooLarge, got {other:?}"),
        }
    }
    // A small compressed page is decompressed and read.
    let doc = fetch(guarded(), &format!("{base}/gzip-small"))
        .await
        .unwrap();
    assert_eq!(doc.title, "OG Titre");
    // The same big pages pass under a larger limit.
    let roomy = || FetchSettings {
        max_bytes: 3 * MAX,
        ..guarded()
    };
    for path in ["big-declared", "big-streamed", "gzip-bomb"] {
        let doc = fetch(roomy(), &format!("{base}/{path}")).await.unwrap();
        assert_eq!(doc.text.len(), 2 * MAX as usize, "{path}");
    }
}

#[tokio::test]
async fn only_html_and_xml_content_types_are_read() {
    let port = server().await;
    let base = format!("http://127.0.0.1:{port}");
    match fetch(guarded(), &format!("{base}/pdf")).await.unwrap_err() {
        SourceError::UnsupportedContentType { content_type } => {
            assert_eq!(content_type.as_deref(), Some("application/pdf"));
        }
        other => panic!("expected UnsupportedContentType, got {other:?}"),
    }
    let error = fetch(guarded(), &format!("{base}/untyped"))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            SourceError::UnsupportedContentType { content_type: None }
        ),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "unsupported content type: unknown");
    assert!(fetch(guarded(), &format!("{base}/xhtml")).await.is_ok());
}

#[tokio::test]
async fn error_statuses_name_the_url_and_the_status() {
    let port = server().await;
    for (path, expected) in [("missing", 404), ("broken", 500)] {
        let url = format!("http://127.0.0.1:{port}/{path}");
        let error = fetch(guarded(), &url).await.unwrap_err();
        match &error {
            SourceError::HttpStatus { url: found, status } => {
                assert_eq!((found.as_str(), *status), (url.as_str(), expected));
            }
            other => panic!("{path}: expected HttpStatus, got {other:?}"),
        }
        assert_eq!(
            error.to_string(),
            format!("download failed: {url} (HTTP status {expected})")
        );
    }
}

#[tokio::test]
async fn a_slow_server_hits_the_timeout() {
    let port = server().await;
    let settings = FetchSettings {
        timeout: Duration::from_millis(300),
        ..guarded()
    };
    let start = Instant::now();
    let error = fetch(settings, &format!("http://127.0.0.1:{port}/slow"))
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::Timeout { .. }), "{error:?}");
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn the_response_charset_decodes_the_page() {
    let port = server().await;
    let doc = fetch(guarded(), &format!("http://127.0.0.1:{port}/latin1"))
        .await
        .unwrap();
    assert_eq!(doc.title, "Café");
    assert_eq!(doc.text, "# Café\n\ncrème brûlée");
}

#[tokio::test]
async fn a_page_without_content_is_refused() {
    let port = server().await;
    let url = format!("http://127.0.0.1:{port}/empty");
    match fetch(guarded(), &url).await.unwrap_err() {
        SourceError::NoContent { url: found } => assert_eq!(found, url),
        other => panic!("expected NoContent, got {other:?}"),
    }
}

#[tokio::test]
async fn a_closed_port_is_a_download_failure() {
    // Bind then drop: nobody listens on that port any more.
    let port = {
        let listener = std::net::TcpListener::bind(SocketAddr::from((LOOPBACK, 0))).unwrap();
        listener.local_addr().unwrap().port()
    };
    let error = fetch(guarded(), &format!("http://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::Download { .. }), "{error:?}");
}

/// Refused before any connection, with the system resolver for `localhost`.
#[tokio::test]
async fn literal_and_local_hosts_are_refused() {
    let settings = || FetchSettings {
        timeout: Duration::from_secs(5),
        ..FetchSettings::default()
    };
    let cases = [
        ("http://localhost/", "localhost"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
        ("http://0.0.0.0/", "0.0.0.0"),
        ("http://10.0.0.1/", "10.0.0.1"),
        (
            "http://169.254.169.254/latest/meta-data/",
            "169.254.169.254",
        ),
        ("http://[::1]:8080/", "::1"),
        ("http://192.168.1.10/", "192.168.1.10"),
        // Other spellings of 127.0.0.1, normalised by the URL parser.
        ("http://2130706433/", "127.0.0.1"),
        ("http://0x7f.1/", "127.0.0.1"),
    ];
    for (url, host) in cases {
        match fetch(settings(), url).await.unwrap_err() {
            SourceError::NonPublicAddress { host: found, .. } => assert_eq!(found, host, "{url}"),
            other => panic!("{url}: expected NonPublicAddress, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn only_http_and_https_urls_are_accepted() {
    for url in [
        "file:///etc/passwd",
        "ftp://example.org/file.html",
        "not a url",
        "javascript:alert(1)",
    ] {
        match fetch(FetchSettings::default(), url).await.unwrap_err() {
            SourceError::SchemeNotAllowed { url: found } => assert_eq!(found, url),
            other => panic!("{url}: expected SchemeNotAllowed, got {other:?}"),
        }
    }
    let error = fetch(FetchSettings::default(), "http://[::1")
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::InvalidUrl { .. }), "{error:?}");
    assert_eq!(
        fetch(FetchSettings::default(), "file:///etc/passwd")
            .await
            .unwrap_err()
            .to_string(),
        "only http(s) URLs are accepted: file:///etc/passwd"
    );
}
