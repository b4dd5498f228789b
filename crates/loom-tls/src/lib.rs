//! # loom-tls
//!
//! Loom's HTTP clients (model providers, MCP servers over HTTP, `fetch_page`) use reqwest
//! built without a crypto provider, so that aws-lc's C build stays out of the tree (see the
//! workspace's `Cargo.toml`). rustls then needs a process-wide provider before the first
//! client is built, or building it panics: [`install_crypto_provider`] installs ring's, once.
//!
//! **Architecture invariant:** a leaf crate: it depends on no loom crate.

use std::sync::Once;

/// Installs ring as rustls' process-wide crypto provider, once, unless the process already
/// chose one. Call it before building a reqwest client; calling it again costs nothing.
pub fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Losing a race with another installer is fine: a provider is then in place.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_provider_is_installed_once_and_kept() {
        super::install_crypto_provider();
        let first = rustls::crypto::CryptoProvider::get_default().map(std::sync::Arc::as_ptr);
        assert!(first.is_some());
        super::install_crypto_provider();
        let second = rustls::crypto::CryptoProvider::get_default().map(std::sync::Arc::as_ptr);
        assert_eq!(first, second);
    }
}
