//! The tools' arguments, checked as their input schemas declare them: unknown fields, missing
//! or mistyped fields and out-of-bounds values are refused with a message naming the tool,
//! the field and the rule.

use serde::{Deserialize, de::DeserializeOwned};
use serde_json::{Map, Value};

/// Arguments that check their bounds after decoding.
pub(crate) trait Checked {
    /// The first bound broken, as `field: rule (got value)`.
    fn check(&self) -> Result<(), String>;
}

/// Decodes and checks the arguments of `tool`.
pub(crate) fn parse<T: DeserializeOwned + Checked>(
    tool: &str,
    arguments: Map<String, Value>,
) -> Result<T, String> {
    let args: T = serde_json::from_value(Value::Object(arguments))
        .map_err(|e| format!("invalid arguments for {tool}: {e}"))?;
    args.check()
        .map_err(|e| format!("invalid arguments for {tool}: {e}"))?;
    Ok(args)
}

fn in_range(field: &str, value: i64, min: i64, max: i64) -> Result<(), String> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "{field}: must be between {min} and {max} (got {value})"
        ))
    }
}

fn default_k() -> i64 {
    5
}

fn default_n() -> i64 {
    20
}

/// `search`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SearchArgs {
    pub(crate) query: String,
    #[serde(default)]
    pub(crate) project: Option<String>,
    #[serde(default)]
    pub(crate) tags: Option<Vec<String>>,
    #[serde(default = "default_k")]
    k: i64,
}

impl SearchArgs {
    /// The number of results asked (checked: 1..=10).
    pub(crate) fn k(&self) -> usize {
        usize::try_from(self.k).unwrap_or(1)
    }
}

impl Checked for SearchArgs {
    fn check(&self) -> Result<(), String> {
        in_range("k", self.k, 1, 10)
    }
}

/// `get` and `delete`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DocIdArgs {
    pub(crate) doc_id: String,
}

impl Checked for DocIdArgs {
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// `list_docs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListArgs {
    #[serde(default)]
    pub(crate) project: Option<String>,
    #[serde(default = "default_n")]
    n: i64,
}

impl ListArgs {
    /// The number of documents asked (checked: 1..=50).
    pub(crate) fn n(&self) -> usize {
        usize::try_from(self.n).unwrap_or(1)
    }
}

impl Checked for ListArgs {
    fn check(&self) -> Result<(), String> {
        in_range("n", self.n, 1, 50)
    }
}

/// `projects`: no arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoArgs {}

impl Checked for NoArgs {
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// `add_text`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AddTextArgs {
    pub(crate) text: String,
    pub(crate) title: String,
    pub(crate) project: String,
    #[serde(default)]
    pub(crate) tags: Option<Vec<String>>,
}

impl Checked for AddTextArgs {
    fn check(&self) -> Result<(), String> {
        let length = self.title.chars().count();
        if length < 3 {
            return Err(format!(
                "title: must be at least 3 characters long (got {length})"
            ));
        }
        Ok(())
    }
}

/// `add_url`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AddUrlArgs {
    pub(crate) url: String,
    pub(crate) project: String,
    #[serde(default)]
    pub(crate) tags: Option<Vec<String>>,
}

impl Checked for AddUrlArgs {
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// `add_file`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AddFileArgs {
    pub(crate) path: String,
    pub(crate) project: String,
    #[serde(default)]
    pub(crate) tags: Option<Vec<String>>,
}

impl Checked for AddFileArgs {
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// `update`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateArgs {
    pub(crate) doc_id: String,
    pub(crate) text: String,
}

impl Checked for UpdateArgs {
    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, Value, json};

    use super::{AddTextArgs, ListArgs, NoArgs, SearchArgs, parse};

    fn map(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    #[test]
    fn bounds_and_defaults() {
        let search: SearchArgs = parse("search", map(json!({"query": "q"}))).unwrap();
        assert_eq!(search.k(), 5);
        let error = parse::<SearchArgs>("search", map(json!({"query": "q", "k": 0}))).unwrap_err();
        assert_eq!(
            error,
            "invalid arguments for search: k: must be between 1 and 10 (got 0)"
        );
        let list: ListArgs = parse("list_docs", map(json!({"project": null}))).unwrap();
        assert_eq!(list.n(), 20);
        let error = parse::<ListArgs>("list_docs", map(json!({"n": 51}))).unwrap_err();
        assert!(
            error.contains("n: must be between 1 and 50 (got 51)"),
            "{error}"
        );
        let error = parse::<AddTextArgs>(
            "add_text",
            map(json!({"text": "t", "title": "ab", "project": "p"})),
        )
        .unwrap_err();
        assert!(
            error.contains("title: must be at least 3 characters"),
            "{error}"
        );
    }

    #[test]
    fn unknown_missing_and_mistyped_fields_are_named() {
        let error = parse::<SearchArgs>("search", map(json!({}))).unwrap_err();
        assert!(error.contains("missing field `query`"), "{error}");
        let error = parse::<NoArgs>("projects", map(json!({"x": 1}))).unwrap_err();
        assert!(error.contains("unknown field `x`"), "{error}");
        let error =
            parse::<SearchArgs>("search", map(json!({"query": "q", "k": "5"}))).unwrap_err();
        assert!(error.contains("invalid type"), "{error}");
    }
}
