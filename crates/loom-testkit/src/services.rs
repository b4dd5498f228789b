//! Services a test needs beside the code (PostgreSQL): where they are, from the environment.
//!
//! A test asks [`postgres`] for the server's URL (`LOOM_TEST_POSTGRES`, e.g.
//! `postgres://postgres@127.0.0.1:5432/test`). When it is unset the test writes
//! `skipped <test>: …` on stderr and returns early; with `LOOM_REQUIRE_SERVICES=1` (as `.ci/run`
//! sets where the services run) it fails instead: there, the tests that need them must run.

use std::io::Write;

/// The variable naming the PostgreSQL server of the tests.
pub const POSTGRES: &str = "LOOM_TEST_POSTGRES";

/// The variable that turns a skip into a failure when set to `1`.
pub const REQUIRE_SERVICES: &str = "LOOM_REQUIRE_SERVICES";

/// What [`locate`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Service {
    /// The service's URL.
    At(String),
    /// Unset and not required: the notice to print.
    Skip(String),
    /// Unset and required: the failure message.
    Missing(String),
}

/// Decides for the service in `variable` (its value `value`) on behalf of `test`.
pub fn locate(variable: &str, value: Option<String>, test: &str, required: bool) -> Service {
    match value.filter(|v| !v.is_empty()) {
        Some(url) => Service::At(url),
        None if required => Service::Missing(format!(
            "{test} needs {variable}, which is not set, and {REQUIRE_SERVICES}=1 requires it"
        )),
        None => Service::Skip(format!("skipped {test}: {variable} is not set")),
    }
}

/// The PostgreSQL server's URL, or `None` (the test returns) when unset and not required.
/// Panics when unset and [`REQUIRE_SERVICES`] is `1`.
pub fn postgres() -> Option<String> {
    let test = std::thread::current()
        .name()
        .filter(|name| *name != "main")
        .unwrap_or("this test")
        .to_owned();
    let required = std::env::var(REQUIRE_SERVICES).as_deref() == Ok("1");
    match locate(POSTGRES, std::env::var(POSTGRES).ok(), &test, required) {
        Service::At(url) => Some(url),
        Service::Skip(notice) => {
            let _ = writeln!(std::io::stderr(), "{notice}");
            None
        }
        Service::Missing(message) => panic!("{message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unset_service_skips_unless_required() {
        assert_eq!(
            locate("V", Some("postgres://h/db".into()), "t", true),
            Service::At("postgres://h/db".into())
        );
        assert!(
            matches!(locate("V", None, "t", false), Service::Skip(m) if m.contains("skipped t: V"))
        );
        assert!(
            matches!(locate("V", Some(String::new()), "t", true), Service::Missing(m) if m.contains("LOOM_REQUIRE_SERVICES=1"))
        );
    }
}
