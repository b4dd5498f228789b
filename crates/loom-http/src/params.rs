//! Query strings of the routes: repeatable parameters (`status=a&status=b`, or
//! `status=a,b`), and a 422 `invalid_query` naming the parameter for anything unusable (an
//! unknown parameter, a single-valued one given twice or empty, a value that does not parse).
//! The reading itself is [`loom_ia::QueryString`], the one reader of every access path (the
//! MCP resources read their URIs' queries with it too): RFC 3986 percent-decoding, `+` kept.
//!
//! **The document is the list of accepted parameters.** Each route describes its query string
//! with a `utoipa::IntoParams` struct (named in its `#[utoipa::path(params(...))]`), and
//! [`Params::only`] accepts exactly the query parameters that struct documents, so a parameter
//! is accepted if and only if the OpenAPI document lists it. Reading a parameter that was not
//! accepted is a bug of the handler: a 500 `engine` naming the parameter, in every build (every
//! route's tests read through it).

use std::str::FromStr;

use axum::{extract::FromRequestParts, http::request::Parts};
use chrono::{DateTime, Utc};
use loom_ia::QueryString;
use serde::de::DeserializeOwned;
use utoipa::{IntoParams, openapi::path::ParameterIn};

use crate::error::{ApiError, ErrorKind};

/// A 422 `invalid_query` about `parameter`.
pub(crate) fn invalid(parameter: &str, reason: impl std::fmt::Display) -> ApiError {
    ApiError::new(ErrorKind::InvalidQuery, format!("{parameter}: {reason}"))
}

/// The names of the query parameters `T` documents, in its order.
pub(crate) fn documented<T: IntoParams>() -> Vec<String> {
    T::into_params(|| Some(ParameterIn::Query))
        .into_iter()
        .filter(|parameter| parameter.parameter_in == ParameterIn::Query)
        .map(|parameter| parameter.name)
        .collect()
}

/// A refusal of the query reader, as a 422 `invalid_query`.
fn refused(error: loom_ia::LoomError) -> ApiError {
    ApiError::from_loom(&error, 0)
}

/// The query string of a request, read by [`QueryString`].
#[derive(Debug, Default)]
pub(crate) struct Params {
    query: QueryString,
    /// The names [`Params::only`] accepted (what the handler may read).
    accepted: Vec<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Params, ApiError> {
        let query = QueryString::parse(parts.uri.query().unwrap_or_default()).map_err(refused)?;
        Ok(Params {
            query,
            accepted: Vec::new(),
        })
    }
}

impl Params {
    /// The query string of a route whose query parameters `T` documents: a parameter `T` does
    /// not list is refused (422 naming it and the expected ones).
    pub(crate) fn only<T: IntoParams>(self) -> Result<Params, ApiError> {
        self.accept(documented::<T>())
    }

    /// The query string of a route without query parameters: any parameter is refused.
    pub(crate) fn none(self) -> Result<Params, ApiError> {
        self.accept(Vec::new())
    }

    fn accept(self, known: Vec<String>) -> Result<Params, ApiError> {
        self.query.only(&known).map_err(refused)?;
        Ok(Params {
            query: self.query,
            accepted: known,
        })
    }

    /// The reader, once `name` is checked to be accepted. Refused (500 `engine`: the handler's
    /// bug, not the client's) when `name` is not a parameter the route documents, which the
    /// client could not have sent.
    fn read(&self, name: &str) -> Result<&QueryString, ApiError> {
        if !self.accepted.iter().any(|known| known == name) {
            return Err(ApiError::new(
                ErrorKind::Engine,
                format!(
                    "the query parameter '{name}' is read but not documented (accepted: {})",
                    self.accepted.join(", ")
                ),
            ));
        }
        Ok(&self.query)
    }

    /// Every value of `name`, in order.
    pub(crate) fn all(&self, name: &str) -> Result<Vec<&str>, ApiError> {
        Ok(self.read(name)?.all(name))
    }

    /// A single-valued text parameter, refused when given twice or empty.
    pub(crate) fn text(&self, name: &str) -> Result<Option<String>, ApiError> {
        self.read(name)?.text(name).map_err(refused)
    }

    /// A count (a whole number), `default` when absent; its range is the facade's to check.
    pub(crate) fn count(&self, name: &str, default: usize) -> Result<usize, ApiError> {
        self.read(name)?.count(name, default).map_err(refused)
    }

    /// A whole number.
    pub(crate) fn number<T: FromStr>(&self, name: &str) -> Result<Option<T>, ApiError> {
        self.read(name)?.number(name).map_err(refused)
    }

    /// `true` or `false`.
    pub(crate) fn flag(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.read(name)?.flag(name).map_err(refused)
    }

    /// An instant: RFC 3339 (`2026-05-01T12:00:00Z`) or a date (`2026-05-01`: its first
    /// instant, UTC), read as every access path reads it ([`loom_ia::query::parse_instant`]).
    pub(crate) fn instant(&self, name: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
        self.read(name)?.instant(name).map_err(refused)
    }

    /// Every value of a repeatable parameter (repeated or comma-separated) read as one of the
    /// names of `T` (a serde enum of snake_case names); `expected` lists them for the error.
    pub(crate) fn names<T: DeserializeOwned>(
        &self,
        name: &str,
        expected: &str,
    ) -> Result<Vec<T>, ApiError> {
        self.read(name)?.choices(name, expected).map_err(refused)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The documented query string of a test route.
    #[derive(utoipa::IntoParams)]
    #[into_params(parameter_in = Query)]
    #[allow(dead_code)]
    struct Documented {
        status: Option<Vec<String>>,
        limit: Option<u32>,
        sessions: Option<u32>,
        since: Option<String>,
        until: Option<String>,
        agent: Option<String>,
    }

    /// The query string `pairs`, as `Documented` accepts it.
    fn params(pairs: &[(&str, &str)]) -> Params {
        raw(pairs).only::<Documented>().unwrap()
    }

    fn raw(pairs: &[(&str, &str)]) -> Params {
        let text: Vec<String> = pairs.iter().map(|(n, v)| format!("{n}={v}")).collect();
        Params {
            query: QueryString::parse(&text.join("&")).unwrap(),
            accepted: Vec::new(),
        }
    }

    /// A handler cannot read a parameter its document does not list, in every build.
    #[test]
    fn reading_an_undocumented_parameter_is_refused() {
        let p = params(&[("status", "completed")]);
        for error in [
            p.all("page").unwrap_err(),
            p.text("page").unwrap_err(),
            p.count("page", 1).unwrap_err(),
        ] {
            // A server error: the client reads its kind and an id, the detail is logged.
            assert_eq!(error.kind, ErrorKind::Engine);
            assert!(error.error_id.is_some(), "{}", error.message);
        }
        // Reading through `only::<T>()` is what makes a parameter readable.
        assert!(raw(&[]).all("status").is_err());
    }

    #[test]
    fn values_are_read_or_refused_naming_the_parameter() {
        let p = params(&[
            ("status", "completed"),
            ("status", "failed"),
            ("limit", "x"),
            ("since", "2026-05-01"),
            ("until", "2026-05-01T12:00:00+02:00"),
            ("agent", "a"),
            ("agent", "b"),
        ]);
        assert_eq!(p.all("status").unwrap(), vec!["completed", "failed"]);
        assert_eq!(
            p.count("limit", 5).unwrap_err().message,
            "limit: 'x' is not a whole number"
        );
        assert_eq!(p.count("sessions", 5).unwrap(), 5);
        assert_eq!(
            p.instant("since").unwrap().unwrap().to_rfc3339(),
            "2026-05-01T00:00:00+00:00"
        );
        assert_eq!(
            p.instant("until").unwrap().unwrap().to_rfc3339(),
            "2026-05-01T10:00:00+00:00"
        );
        assert_eq!(
            p.text("agent").unwrap_err().message,
            "agent: given more than once"
        );
        let error = raw(&[("status", "a"), ("page", "2")])
            .only::<Documented>()
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::InvalidQuery);
        assert_eq!(
            error.message,
            "page: unknown parameter (expected: status, limit, sessions, since, until, agent)"
        );
        assert_eq!(
            raw(&[("x", "1")]).none().unwrap_err().message,
            "x: unknown parameter (expected: none)"
        );
        assert!(raw(&[]).none().is_ok());
        let bad = params(&[("status", "done")]);
        let refused = bad
            .names::<loom_ia::RunStatus>("status", "completed, failed")
            .unwrap_err();
        assert_eq!(
            refused.message,
            "status: unknown value 'done' (expected: completed, failed)"
        );
    }
}
