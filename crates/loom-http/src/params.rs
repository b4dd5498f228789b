//! Query strings of the read routes: repeatable parameters (`status=a&status=b`), and a 422
//! `invalid_query` naming the parameter for anything unusable (an unknown parameter, a
//! single-valued one given twice, a value that does not parse).
//!
//! **The document is the list of accepted parameters.** Each route describes its query string
//! with a `utoipa::IntoParams` struct (named in its `#[utoipa::path(params(...))]`), and
//! [`Params::only`] accepts exactly the query parameters that struct documents, so a parameter
//! is accepted if and only if the OpenAPI document lists it. Reading a parameter that was not
//! accepted is a bug of the handler: a 500 `engine` naming the parameter, in every build (every
//! route's tests read through it).

use axum::{
    extract::{FromRequestParts, Query},
    http::request::Parts,
};
use chrono::{DateTime, Utc};
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

/// The query string as `(name, value)` pairs, in order.
#[derive(Debug, Default)]
pub(crate) struct Params {
    pairs: Vec<(String, String)>,
    /// The names [`Params::only`] accepted (what the handler may read).
    accepted: Vec<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Params, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state).await?;
        Ok(Params {
            pairs,
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
        if let Some((name, _)) = self.pairs.iter().find(|(name, _)| !known.contains(name)) {
            let expected = if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            };
            return Err(invalid(
                name,
                format!("unknown parameter (expected: {expected})"),
            ));
        }
        Ok(Params {
            pairs: self.pairs,
            accepted: known,
        })
    }

    /// Every value of `name`, in order. Refused (500 `engine`: the handler's bug, not the
    /// client's) when `name` is not a parameter the route documents, which the client could not
    /// have sent.
    pub(crate) fn all(&self, name: &str) -> Result<Vec<&str>, ApiError> {
        if !self.accepted.iter().any(|known| known == name) {
            return Err(ApiError::new(
                ErrorKind::Engine,
                format!(
                    "the query parameter '{name}' is read but not documented (accepted: {})",
                    self.accepted.join(", ")
                ),
            ));
        }
        Ok(self
            .pairs
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect())
    }

    /// The value of a single-valued parameter, refused when given twice.
    pub(crate) fn one(&self, name: &str) -> Result<Option<&str>, ApiError> {
        match self.all(name)?.as_slice() {
            [] => Ok(None),
            [value] => Ok(Some(value)),
            _ => Err(invalid(name, "given more than once")),
        }
    }

    /// A single-valued text parameter, refused when empty.
    pub(crate) fn text(&self, name: &str) -> Result<Option<String>, ApiError> {
        match self.one(name)? {
            Some("") => Err(invalid(name, "must not be empty")),
            other => Ok(other.map(str::to_owned)),
        }
    }

    /// A count (a whole number), `default` when absent; its range is the facade's to check.
    pub(crate) fn count(&self, name: &str, default: usize) -> Result<usize, ApiError> {
        match self.one(name)? {
            None => Ok(default),
            Some(text) => text
                .parse()
                .map_err(|_| invalid(name, format!("'{text}' is not a whole number"))),
        }
    }

    /// An instant: RFC 3339 (`2026-05-01T12:00:00Z`) or a date (`2026-05-01`: its first
    /// instant, UTC), read as every access path reads it ([`loom_ia::query::parse_instant`]).
    pub(crate) fn instant(&self, name: &'static str) -> Result<Option<DateTime<Utc>>, ApiError> {
        self.one(name)?
            .map(|text| loom_ia::query::parse_instant(name, text))
            .transpose()
            .map_err(|error| ApiError::from_loom(&error, 0))
    }

    /// Every value of a repeatable parameter read as one of the names of `T` (a serde enum
    /// of snake_case names); `expected` lists them for the error.
    pub(crate) fn names<T: DeserializeOwned>(
        &self,
        name: &str,
        expected: &str,
    ) -> Result<Vec<T>, ApiError> {
        self.all(name)?
            .into_iter()
            .map(|text| {
                serde_json::from_value(serde_json::Value::String(text.to_owned())).map_err(|_| {
                    invalid(
                        name,
                        format!("unknown value '{text}' (expected: {expected})"),
                    )
                })
            })
            .collect()
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
        Params {
            pairs: pairs
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            accepted: Vec::new(),
        }
        .only::<Documented>()
        .unwrap()
    }

    fn raw(pairs: &[(&str, &str)]) -> Params {
        Params {
            pairs: pairs
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
            accepted: Vec::new(),
        }
    }

    /// A handler cannot read a parameter its document does not list, in every build.
    #[test]
    fn reading_an_undocumented_parameter_is_refused() {
        let p = params(&[("status", "completed")]);
        for error in [
            p.all("page").unwrap_err(),
            p.one("page").unwrap_err(),
            p.count("page", 1).unwrap_err(),
        ] {
            assert_eq!(error.kind, ErrorKind::Engine);
            assert_eq!(
                error.message,
                "the query parameter 'page' is read but not documented (accepted: status, limit, \
                 sessions, since, until, agent)"
            );
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
            p.one("agent").unwrap_err().message,
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
