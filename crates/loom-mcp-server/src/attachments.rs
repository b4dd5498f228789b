//! The `attachments` of an agent tool: a base64 image, an `artifact://` link to a file the
//! tenant already has, or a `file://` path under `server.mcp.file_roots`.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use loom_ia::{Attachment, Loom};
use serde_json::Value;

/// The attachments of one call, or the refusal naming the one at fault and why.
pub(crate) async fn read(
    loom: &Loom,
    tenant: &str,
    value: Option<&Value>,
) -> Result<Vec<Attachment>, String> {
    let items = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err("attachments must be an array".to_owned()),
    };
    let mut attachments = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("attachments[{i}]");
        let attachment = match item {
            Value::String(uri) => by_uri(loom, tenant, &at, uri, None).await?,
            Value::Object(fields) => {
                for key in fields.keys() {
                    if !["data", "media_type", "name", "uri"].contains(&key.as_str()) {
                        return Err(format!(
                            "{at}: unknown field '{key}' (expected data, media_type and name, or \
                             uri and name)"
                        ));
                    }
                }
                let name = match fields.get("name") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(name)) => Some(name.clone()),
                    Some(_) => return Err(format!("{at}.name must be a string")),
                };
                match (fields.get("data"), fields.get("uri")) {
                    (Some(data), None) => inline(&at, data, fields.get("media_type"), name, i)?,
                    (None, Some(Value::String(uri))) => {
                        by_uri(loom, tenant, &at, uri, name).await?
                    }
                    (None, Some(_)) => return Err(format!("{at}.uri must be a string")),
                    (Some(_), Some(_)) => {
                        return Err(format!("{at}: give either data or uri, not both"));
                    }
                    (None, None) => {
                        return Err(format!(
                            "{at}: expected {{data, media_type}} (a base64 file) or {{uri}} \
                             (artifact:// or file://)"
                        ));
                    }
                }
            }
            _ => {
                return Err(format!(
                    "{at}: expected an object ({{data, media_type}} or {{uri}}) or a URI string"
                ));
            }
        };
        attachments.push(attachment);
    }
    Ok(attachments)
}

/// A base64 file given in the call.
fn inline(
    at: &str,
    data: &Value,
    media_type: Option<&Value>,
    name: Option<String>,
    index: usize,
) -> Result<Attachment, String> {
    let Value::String(data) = data else {
        return Err(format!("{at}.data must be a base64 string"));
    };
    let Some(Value::String(media_type)) = media_type else {
        return Err(format!(
            "{at}.media_type is required with data (e.g. image/png)"
        ));
    };
    let compact: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(compact.as_bytes())
        .map_err(|e| format!("{at}.data is not base64: {e}"))?;
    let extension = media_type
        .split_once('/')
        .map(|(_, sub)| sub.split(['+', ';']).next().unwrap_or(sub))
        .filter(|ext| !ext.is_empty())
        .unwrap_or("bin");
    Ok(Attachment {
        name: name.unwrap_or_else(|| format!("attachment-{}.{extension}", index + 1)),
        media_type: media_type.clone(),
        bytes,
    })
}

/// A file named by its URI: `artifact://` (of the caller's tenant) or `file://` (under a file
/// root).
async fn by_uri(
    loom: &Loom,
    tenant: &str,
    at: &str,
    uri: &str,
    name: Option<String>,
) -> Result<Attachment, String> {
    if uri.starts_with("artifact://") {
        let bytes = loom
            .artifact(tenant, uri)
            .await
            .map_err(|e| format!("{at}: {uri} cannot be read: {e}"))?
            .ok_or_else(|| format!("{at}: no artifact {uri}"))?;
        let name = name.unwrap_or_else(|| uri.rsplit('/').next().unwrap_or(uri).to_owned());
        return Attachment::detect(name, bytes)
            .ok_or_else(|| format!("{at}: {uri}: unsupported type"));
    }
    if uri.starts_with("file://") {
        let path = file_path(uri).ok_or_else(|| {
            format!("{at}: {uri} is not a usable file URI (expected file:///absolute/path)")
        })?;
        // Resolving the path and reading the file block: on the blocking pool, not on a
        // worker thread of the runtime (a slow disk, a FIFO, would stall every other request).
        let reader = loom.clone();
        let at_owned = at.to_owned();
        let mut attachment = tokio::task::spawn_blocking(move || {
            let path = under_roots(&reader.config().mcp_file_roots(), &path, &at_owned)?;
            reader
                .read_attachment(&path)
                .map_err(|e| format!("{at_owned}: {e}"))
        })
        .await
        .map_err(|e| format!("{at}: the file could not be read: {e}"))??;
        if let Some(name) = name {
            attachment.name = name;
        }
        return Ok(attachment);
    }
    Err(format!(
        "{at}: unsupported URI '{uri}' (expected artifact://… or file://…)"
    ))
}

/// The path of a `file://` URI (host empty or `localhost`), read and percent-decoded by the
/// `url` crate; `None` for another host, a query or fragment, or a NUL byte.
fn file_path(uri: &str) -> Option<PathBuf> {
    let url = url::Url::parse(uri).ok()?;
    if url.scheme() != "file" || url.query().is_some() || url.fragment().is_some() {
        return None;
    }
    let path = url.to_file_path().ok()?;
    if path.as_os_str().as_encoded_bytes().contains(&0) {
        return None;
    }
    Some(path)
}

/// `path` resolved (symbolic links included), when it lies inside one of `roots` (resolved
/// too); else the refusal naming the rule.
fn under_roots(roots: &[PathBuf], path: &Path, at: &str) -> Result<PathBuf, String> {
    let shown = path.display();
    if roots.is_empty() {
        return Err(format!(
            "{at}: file://{shown} is refused: server.mcp.file_roots declares no folder, so no \
             file:// attachment is accepted"
        ));
    }
    let resolved = path
        .canonicalize()
        .map_err(|e| format!("{at}: file://{shown} cannot be read: {e}"))?;
    let inside = roots
        .iter()
        .filter_map(|root| root.canonicalize().ok())
        .any(|root| resolved.starts_with(&root));
    if inside {
        Ok(resolved)
    } else {
        let listed: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
        Err(format!(
            "{at}: file://{shown} is outside server.mcp.file_roots ({}): a file:// attachment \
             must be under one of them",
            listed.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_are_decoded() {
        assert_eq!(
            file_path("file:///tmp/a%20b.png"),
            Some(PathBuf::from("/tmp/a b.png"))
        );
        assert_eq!(
            file_path("file://localhost/tmp/x.png"),
            Some(PathBuf::from("/tmp/x.png"))
        );
        assert_eq!(file_path("file://server/share/x.png"), None);
        assert_eq!(file_path("file:///tmp/%00"), None);
        assert_eq!(file_path("file:///tmp/x.png?v=1"), None);
        // Not an escape: kept as written (a sign is not a hex digit, `%+1` is not byte 1).
        assert_eq!(
            file_path("file:///tmp/%+1.png"),
            Some(PathBuf::from("/tmp/%+1.png"))
        );
        assert_eq!(
            file_path("file:///tmp/%zz"),
            Some(PathBuf::from("/tmp/%zz"))
        );
    }

    #[test]
    fn a_file_must_be_under_a_root_even_through_a_link() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let inside = root.path().join("ok.png");
        std::fs::write(&inside, b"x").unwrap();
        let secret = outside.path().join("secret.png");
        std::fs::write(&secret, b"x").unwrap();
        let roots = vec![root.path().to_path_buf()];
        assert!(under_roots(&roots, &inside, "attachments[0]").is_ok());
        let refused = under_roots(&roots, &secret, "attachments[0]").unwrap_err();
        assert!(
            refused.contains("is outside server.mcp.file_roots"),
            "{refused}"
        );
        #[cfg(unix)]
        {
            let link = root.path().join("link.png");
            std::os::unix::fs::symlink(&secret, &link).unwrap();
            let refused = under_roots(&roots, &link, "attachments[0]").unwrap_err();
            assert!(refused.contains("outside"), "{refused}");
        }
        let none = under_roots(&[], &inside, "attachments[0]").unwrap_err();
        assert!(none.contains("declares no folder"), "{none}");
    }

    /// A `file://` attachment is read off the runtime's threads: on a one-thread runtime, a
    /// FIFO whose writer is a task of that runtime is read (read on the runtime's thread, the
    /// read would wait for a writer that cannot run: a watchdog thread then writes instead, and
    /// the test fails).
    #[cfg(unix)]
    #[tokio::test(flavor = "current_thread")]
    async fn a_file_attachment_is_read_off_the_runtime_threads() {
        use std::{
            io::Write,
            sync::{
                Arc,
                atomic::{AtomicBool, Ordering},
            },
            time::Duration,
        };

        use loom_ia::config::{AgentSpec, Config, LoomConfig, ModelSpec, Sdk};

        const PNG: &[u8] = &[
            0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48,
            0x44, 0x52, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00,
            0x00, 0x1f, 0x15, 0xc4, 0x89,
        ];
        let dir = tempfile::tempdir().unwrap();
        let mut raw = LoomConfig {
            models: vec![ModelSpec::new("fake", Sdk::Fake, "FAKE")],
            agents: vec![AgentSpec::new("echo", "fake")],
            ..LoomConfig::default()
        };
        raw.server.mcp.file_roots = vec![dir.path().to_path_buf()];
        let loom = Loom::new(Config::new(raw, dir.path().to_path_buf()).unwrap()).unwrap();
        let fifo = dir.path().join("pipe.png");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());

        let write = {
            let fifo = fifo.clone();
            move || {
                let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
                writer.write_all(PNG).unwrap();
            }
        };
        // The writer, started by a task of this runtime: it starts only if the thread is free.
        let writer = tokio::spawn({
            let write = write.clone();
            async move { std::thread::spawn(write) }
        });
        let done = Arc::new(AtomicBool::new(false));
        let fired = Arc::new(AtomicBool::new(false));
        let watchdog = {
            let (done, fired) = (done.clone(), fired.clone());
            std::thread::spawn(move || {
                let read = loom_testkit::wait::blocking_poll_within(
                    "the attachment to be read",
                    Duration::from_secs(20),
                    || done.load(Ordering::SeqCst),
                );
                if read.is_err() {
                    // Unblock the reader, and say the runtime's thread was held.
                    fired.store(true, Ordering::SeqCst);
                    write();
                }
            })
        };
        let uri = format!("file://{}", fifo.display());
        let read = read(&loom, "default", Some(&serde_json::json!([uri]))).await;
        done.store(true, Ordering::SeqCst);
        watchdog.join().unwrap();
        assert!(
            !fired.load(Ordering::SeqCst),
            "the runtime's thread was blocked reading the attachment"
        );
        let attachments = read.unwrap();
        assert_eq!(attachments.len(), 1);
        assert_eq!(attachments[0].media_type, "image/png");
        assert_eq!(attachments[0].bytes, PNG);
        writer.await.unwrap().join().unwrap();
    }
}
