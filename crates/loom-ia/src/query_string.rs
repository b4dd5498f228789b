//! Query strings of the access paths, read one way: the REST routes' (`GET /v1/runs?…`) and the
//! MCP resources' (`loom://runs{?…}`).
//!
//! A query string is `name=value` pairs joined by `&`. Names and values are percent-decoded by
//! the `percent-encoding` crate as RFC 3986 says: a `+` stays a `+` (so an offset such as
//! `+02:00` may be written as is; a space is `%20`), an escape must be `%` and two hex digits,
//! and the decoded bytes must be UTF-8. Every refusal is a [`LoomError::InvalidQuery`] naming
//! the parameter: an unknown parameter, a single-valued one given twice or empty, a value that
//! does not read.

use std::str::FromStr;

use chrono::{DateTime, Utc};
use percent_encoding::percent_decode_str;
use serde::de::DeserializeOwned;

use crate::{
    LoomError,
    query::{invalid, parse_instant},
};

/// A query string as `(name, value)` pairs, in order, percent-decoded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryString {
    pairs: Vec<(String, String)>,
}

/// `text` percent-decoded (RFC 3986: `+` is kept), refused when an escape is not `%` and two
/// hex digits or the bytes are not UTF-8; `parameter` names the refusal.
fn decoded(parameter: &str, text: &str) -> Result<String, LoomError> {
    let bytes = text.as_bytes();
    let broken = bytes.iter().enumerate().any(|(at, byte)| {
        *byte == b'%'
            && !bytes
                .get(at + 1..at + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if broken {
        return Err(invalid(
            parameter,
            format!("'{text}' holds a broken %-escape"),
        ));
    }
    percent_decode_str(text)
        .decode_utf8()
        .map(|text| text.into_owned())
        .map_err(|_| invalid(parameter, format!("'{text}' does not decode to UTF-8")))
}

impl QueryString {
    /// Reads `query` (what follows `?`, without it; empty: no parameter).
    pub fn parse(query: &str) -> Result<QueryString, LoomError> {
        let mut pairs = Vec::new();
        for piece in query.split('&').filter(|piece| !piece.is_empty()) {
            let (name, value) = piece.split_once('=').unwrap_or((piece, ""));
            let name = decoded(name, name)?;
            let value = decoded(&name, value)?;
            pairs.push((name, value));
        }
        Ok(QueryString { pairs })
    }

    /// The parameters' names, in order (repeated ones repeated).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.pairs.iter().map(|(name, _)| name.as_str())
    }

    /// Refuses a parameter that `known` does not list, naming the expected ones.
    pub fn only<S: AsRef<str>>(&self, known: &[S]) -> Result<(), LoomError> {
        let Some(name) = self
            .names()
            .find(|name| !known.iter().any(|k| k.as_ref() == *name))
        else {
            return Ok(());
        };
        let expected = if known.is_empty() {
            "none".to_owned()
        } else {
            known
                .iter()
                .map(AsRef::as_ref)
                .collect::<Vec<_>>()
                .join(", ")
        };
        Err(invalid(
            name,
            format!("unknown parameter (expected: {expected})"),
        ))
    }

    /// Every value of `name`, in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.pairs
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The value of a single-valued parameter, refused when given twice or empty.
    pub fn one(&self, name: &str) -> Result<Option<&str>, LoomError> {
        match self.all(name).as_slice() {
            [] => Ok(None),
            [""] => Err(invalid(name, "must not be empty")),
            [value] => Ok(Some(value)),
            _ => Err(invalid(name, "given more than once")),
        }
    }

    /// [`QueryString::one`], owned.
    pub fn text(&self, name: &str) -> Result<Option<String>, LoomError> {
        Ok(self.one(name)?.map(str::to_owned))
    }

    /// A whole number; its range is the caller's to check.
    pub fn number<T: FromStr>(&self, name: &str) -> Result<Option<T>, LoomError> {
        self.one(name)?
            .map(|text| {
                text.parse()
                    .map_err(|_| invalid(name, format!("'{text}' is not a whole number")))
            })
            .transpose()
    }

    /// A count, `default` when absent; its range is the facade's to check.
    pub fn count(&self, name: &str, default: usize) -> Result<usize, LoomError> {
        Ok(self.number(name)?.unwrap_or(default))
    }

    /// `true` or `false`.
    pub fn flag(&self, name: &str) -> Result<Option<bool>, LoomError> {
        self.one(name)?
            .map(|text| match text {
                "true" => Ok(true),
                "false" => Ok(false),
                other => Err(invalid(
                    name,
                    format!("'{other}' is neither true nor false"),
                )),
            })
            .transpose()
    }

    /// An instant: RFC 3339 (`2026-05-01T12:00:00Z`) or a date (`2026-05-01`: its first
    /// instant, UTC).
    pub fn instant(&self, name: &str) -> Result<Option<DateTime<Utc>>, LoomError> {
        self.one(name)?
            .map(|text| parse_instant(name, text))
            .transpose()
    }

    /// Every value of a repeatable parameter read as one of the names of `T` (a serde enum of
    /// snake_case names), repeated (`status=a&status=b`) or comma-separated (`status=a,b`, the
    /// RFC 6570 expansion of a list); `expected` lists the names for the refusal.
    pub fn choices<T: DeserializeOwned>(
        &self,
        name: &str,
        expected: &str,
    ) -> Result<Vec<T>, LoomError> {
        self.all(name)
            .into_iter()
            .flat_map(|value| value.split(','))
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
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::RunStatus;

    fn refused(query: &str) -> String {
        QueryString::parse(query).unwrap_err().to_string()
    }

    #[test]
    fn values_are_percent_decoded_as_rfc_3986_says() {
        let query = QueryString::parse(
            "until=2026-05-01T12%3A00%3A00+02:00&agent=d%C3%A9vis&x%20y=a%2Bb&empty",
        )
        .unwrap();
        assert_eq!(
            query.instant("until").unwrap().unwrap().to_rfc3339(),
            "2026-05-01T10:00:00+00:00"
        );
        assert_eq!(query.one("agent").unwrap(), Some("dévis"));
        assert_eq!(query.all("x y"), vec!["a+b"]);
        assert_eq!(query.all("empty"), vec![""]);
        assert_eq!(
            query.names().collect::<Vec<_>>(),
            ["until", "agent", "x y", "empty"]
        );
    }

    /// `u8::from_str_radix` reads a sign: a hand-written decoder turned `%+1` into byte 1.
    #[test]
    fn an_escape_is_two_hex_digits_and_nothing_else() {
        for query in [
            "agent=%+1",
            "agent=%-1",
            "agent=%1",
            "agent=a%",
            "agent=%zz",
            "agent=% 1",
        ] {
            assert!(
                refused(query).contains("holds a broken %-escape"),
                "{query}: {}",
                refused(query)
            );
        }
        assert_eq!(
            refused("agent=%E9"),
            "agent: '%E9' does not decode to UTF-8"
        );
        assert_eq!(refused("a%2=1"), "a%2: 'a%2' holds a broken %-escape");
    }

    #[test]
    fn every_refusal_names_its_parameter() {
        let query =
            QueryString::parse("agent=a&agent=b&limit=x&empty=&on=yes&status=paused,done").unwrap();
        assert_eq!(
            query.one("agent").unwrap_err().to_string(),
            "agent: given more than once"
        );
        assert_eq!(
            query.count("limit", 5).unwrap_err().to_string(),
            "limit: 'x' is not a whole number"
        );
        assert_eq!(query.count("sessions", 5).unwrap(), 5);
        assert_eq!(
            query.one("empty").unwrap_err().to_string(),
            "empty: must not be empty"
        );
        assert_eq!(
            query.flag("on").unwrap_err().to_string(),
            "on: 'yes' is neither true nor false"
        );
        assert_eq!(
            query
                .choices::<RunStatus>("status", "paused, failed")
                .unwrap_err()
                .to_string(),
            "status: unknown value 'done' (expected: paused, failed)"
        );
        assert_eq!(
            query.only(&["agent", "limit"]).unwrap_err().to_string(),
            "empty: unknown parameter (expected: agent, limit)"
        );
        let none: [&str; 0] = [];
        assert_eq!(
            QueryString::parse("x=1")
                .unwrap()
                .only(&none)
                .unwrap_err()
                .to_string(),
            "x: unknown parameter (expected: none)"
        );
        let statuses = QueryString::parse("status=paused,failed&status=completed").unwrap();
        assert_eq!(
            statuses.choices::<RunStatus>("status", "").unwrap(),
            [RunStatus::Paused, RunStatus::Failed, RunStatus::Completed]
        );
    }
}
