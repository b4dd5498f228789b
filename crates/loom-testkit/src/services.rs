//! The addresses of the Redis and RabbitMQ test servers, with the same rule as
//! [`crate::postgres`]: unset in a developer's quick run, the test prints `skipped <test>: … is
//! not set` and returns early; under `LOOM_REQUIRE_SERVICES=1` (`.ci/run`) it fails instead.
//!
//! Tests sharing one server keep apart by naming what they create with [`unique`] (Redis key
//! prefixes and channels, RabbitMQ queue names).

use crate::postgres::{REQUIRE_SERVICES, services_required};

/// The variable naming the Redis test server (`redis://127.0.0.1:6379`).
pub const REDIS: &str = "LOOM_TEST_REDIS";
/// The variable naming the RabbitMQ test server (`amqp://guest:guest@127.0.0.1:5672/%2f`).
pub const RABBITMQ: &str = "LOOM_TEST_RABBITMQ";

/// The Redis test server's URL, or `None` after printing the skip notice for `test`.
pub fn redis(test: &str) -> Option<String> {
    address(REDIS, "Redis", test)
}

/// The RabbitMQ test server's URL, or `None` after printing the skip notice for `test`.
pub fn rabbitmq(test: &str) -> Option<String> {
    address(RABBITMQ, "RabbitMQ", test)
}

fn address(variable: &str, service: &str, test: &str) -> Option<String> {
    match std::env::var(variable) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if services_required() => panic!(
            "{test} needs {service}: {variable} is not set and {REQUIRE_SERVICES}=1 requires it"
        ),
        _ => {
            eprintln!("skipped {test}: {variable} is not set");
            None
        }
    }
}

/// A name no other test run uses: `<prefix>_<16 random hex>`.
pub fn unique(prefix: &str) -> String {
    let mut bytes = [0u8; 8];
    // The OS generator cannot fail on the platforms tests run on; a fixed suffix would only
    // make two runs share names.
    let _ = getrandom::fill(&mut bytes);
    format!("{prefix}_{}", hex::encode(bytes))
}

/// Whether bubblewrap can create the namespaces of a sandbox on this machine (checked once per
/// test binary by running `true` in one). When it cannot, prints `skipped <test>: …` and
/// returns `false`; under `LOOM_REQUIRE_SERVICES=1` (`.ci/run`, which installs bubblewrap) it
/// fails instead.
pub fn namespaces(test: &str) -> bool {
    static CHECK: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let check = CHECK.get_or_init(|| {
        let output = std::process::Command::new("bwrap")
            .args([
                "--unshare-all",
                "--die-with-parent",
                "--ro-bind",
                "/usr",
                "/usr",
                "--symlink",
                "usr/bin",
                "/bin",
                "--symlink",
                "usr/lib",
                "/lib",
                "--symlink",
                "usr/lib64",
                "/lib64",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "/usr/bin/true",
            ])
            .output()
            .map_err(|e| format!("cannot run bwrap: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "bwrap cannot create namespaces: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    });
    match check {
        Ok(()) => true,
        Err(why) if services_required() => {
            panic!("{test} needs a sandbox: {why}, and {REQUIRE_SERVICES}=1 requires it")
        }
        Err(why) => {
            eprintln!("skipped {test}: {why}");
            false
        }
    }
}
