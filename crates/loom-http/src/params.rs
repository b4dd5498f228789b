//! Query strings of the read routes: repeatable parameters (`status=a&status=b`), and a 422
//! `invalid_query` naming the parameter for anything unusable (an unknown parameter, a
//! single-valued one given twice, a value that does not parse).

use axum::{
    extract::{FromRequestParts, Query},
    http::{StatusCode, request::Parts},
};
use chrono::{DateTime, NaiveDate, NaiveTime, Utc};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A 422 `invalid_query` about `parameter`.
pub(crate) fn invalid(parameter: &str, reason: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_query",
        format!("{parameter}: {reason}"),
    )
}

/// The query string as `(name, value)` pairs, in order.
#[derive(Debug, Default)]
pub(crate) struct Params {
    pairs: Vec<(String, String)>,
}

impl<S: Send + Sync> FromRequestParts<S> for Params {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Params, ApiError> {
        let Query(pairs) = Query::<Vec<(String, String)>>::from_request_parts(parts, state).await?;
        Ok(Params { pairs })
    }
}

impl Params {
    /// Refuses a parameter not in `known`.
    pub(crate) fn only(&self, known: &[&str]) -> Result<(), ApiError> {
        match self
            .pairs
            .iter()
            .find(|(name, _)| !known.contains(&name.as_str()))
        {
            Some((name, _)) => Err(invalid(
                name,
                format!("unknown parameter (expected: {})", known.join(", ")),
            )),
            None => Ok(()),
        }
    }

    /// Every value of `name`, in order.
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.pairs
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The value of a single-valued parameter, refused when given twice.
    pub(crate) fn one(&self, name: &str) -> Result<Option<&str>, ApiError> {
        match self.all(name).as_slice() {
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
    /// instant, UTC).
    pub(crate) fn instant(&self, name: &str) -> Result<Option<DateTime<Utc>>, ApiError> {
        let Some(text) = self.one(name)? else {
            return Ok(None);
        };
        if let Ok(at) = DateTime::parse_from_rfc3339(text) {
            return Ok(Some(at.with_timezone(&Utc)));
        }
        NaiveDate::parse_from_str(text, "%Y-%m-%d")
            .map(|date| Some(date.and_time(NaiveTime::MIN).and_utc()))
            .map_err(|_| {
                invalid(
                    name,
                    format!("'{text}' is neither an RFC 3339 instant nor a YYYY-MM-DD date"),
                )
            })
    }

    /// Every value of a repeatable parameter read as one of the names of `T` (a serde enum
    /// of snake_case names); `expected` lists them for the error.
    pub(crate) fn names<T: DeserializeOwned>(
        &self,
        name: &str,
        expected: &str,
    ) -> Result<Vec<T>, ApiError> {
        self.all(name)
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

    fn params(pairs: &[(&str, &str)]) -> Params {
        Params {
            pairs: pairs
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .collect(),
        }
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
        assert_eq!(p.all("status"), vec!["completed", "failed"]);
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
        let error = p.only(&["status", "limit"]).unwrap_err();
        assert_eq!(error.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            error.message,
            "since: unknown parameter (expected: status, limit)"
        );
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
