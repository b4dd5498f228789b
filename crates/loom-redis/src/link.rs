//! [`Link`]: one multiplexed connection to a Redis server, opened at its first use (so an
//! adapter is built without a runtime and without the server, which may come up later) and
//! re-opened by the client's connection manager when it drops.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use crate::RedisError;

/// How long connecting, then each command, may take before the server counts as unavailable.
const TIMEOUT: Duration = Duration::from_secs(2);

/// A lazily opened connection to one Redis server, shared by an adapter's clones behind an
/// `Arc`.
#[derive(Debug)]
pub(crate) struct Link {
    client: redis::Client,
    /// The URL without its password, for messages.
    shown: String,
    manager: OnceCell<ConnectionManager>,
}

impl Link {
    /// A link to the server at `url` (checked now, reached at first use).
    pub(crate) fn new(url: &str) -> Result<Link, RedisError> {
        let client =
            redis::Client::open(url).map_err(|err| RedisError::Url(format!("{:?}", err.kind())))?;
        Ok(Link {
            shown: shown(url),
            client,
            manager: OnceCell::new(),
        })
    }

    /// The server's URL, without a password.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// The connection, opened now if it is not yet (a failed opening is tried again at the
    /// next use).
    pub(crate) async fn connection(&self) -> Result<ConnectionManager, RedisError> {
        let manager = self
            .manager
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(TIMEOUT))
                    .set_response_timeout(Some(TIMEOUT))
                    .set_number_of_retries(1);
                ConnectionManager::new_with_config(self.client.clone(), config)
                    .await
                    .map_err(|err| RedisError::Unavailable(format!("{}: {err}", self.shown)))
            })
            .await?;
        Ok(manager.clone())
    }
}

/// `url` without the password it may carry.
fn shown(url: &str) -> String {
    match (url.split_once("://"), url.rfind('@')) {
        (Some((scheme, _)), Some(at)) => format!("{scheme}://…@{}", &url[at + 1..]),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_is_never_shown() {
        assert_eq!(
            shown("redis://user:secret@cache:6379/0"),
            "redis://…@cache:6379/0"
        );
        assert_eq!(shown("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }

    #[test]
    fn a_bad_url_is_refused_when_built() {
        assert!(matches!(Link::new("http://x"), Err(RedisError::Url(_))));
    }
}
