//! What `define` checks before anything runs, and how an example's output is compared with
//! the expected one. Every refusal is a [`ToolError::refused`] naming its rule ([`super::rules`]).

use loom_core::tool::ToolError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::rules;

/// Longest name of a forged tool (without the source's prefix).
pub const MAX_NAME: usize = 48;
/// Largest program accepted, in bytes.
pub const MAX_CODE_BYTES: usize = 64 * 1024;
/// Largest input schema accepted, in bytes of compact JSON.
pub const MAX_SCHEMA_BYTES: usize = 32 * 1024;
/// Most examples a definition may give.
pub const MAX_EXAMPLES: usize = 20;
/// Longest description accepted, in characters.
pub const MAX_DESCRIPTION: usize = 2_000;
/// Names a forged tool may not take: the source's own tools.
pub const RESERVED: [&str; 2] = ["define", "call"];

/// One example of a definition: an input and the output the program must print for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Example {
    /// The input, a JSON object matching the input schema.
    pub input: Value,
    /// The JSON value the program must print on its standard output.
    pub output: Value,
}

/// The arguments of `define`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Definition {
    /// The tool's name (see [`check_name`]).
    pub name: String,
    /// What the tool does, shown to the model.
    pub description: String,
    /// The JSON Schema of its input (`type: object`).
    pub input_schema: Value,
    /// A Python 3 program reading the JSON input on stdin and printing the JSON output.
    pub code: String,
    /// At least one example, each run and compared before the tool is offered.
    pub examples: Vec<Example>,
}

/// Checks a forged tool's name: lowercase ASCII letters, digits and single underscores,
/// starting with a letter, not ending with `_`, at most [`MAX_NAME`] characters, not one of
/// [`RESERVED`], and `<source>__<name>` a valid tool name (at most 64 characters).
pub fn check_name(source: &str, name: &str) -> Result<(), ToolError> {
    let refuse = |why: &str| {
        Err(ToolError::refused(
            rules::NAME,
            format!("refused by rule '{}': the name {name:?} {why}", rules::NAME),
        ))
    };
    let shape = name.len() <= MAX_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !name.contains("__")
        && !name.ends_with('_');
    if !shape {
        return refuse(&format!(
            "must be lowercase letters, digits and single underscores, start with a letter, \
             not end with '_', at most {MAX_NAME} characters"
        ));
    }
    if RESERVED.contains(&name) {
        return refuse(&format!(
            "is reserved ({} are the source's own tools)",
            RESERVED.join(", ")
        ));
    }
    let full = format!("{source}__{name}");
    if !loom_core::ids::is_valid_name(&full) {
        return refuse(&format!(
            "makes the tool name {full:?}, longer than 64 characters"
        ));
    }
    Ok(())
}

/// Checks everything of a definition but its examples' outcomes: the name, the description,
/// the code's size, the schema (a valid JSON Schema of `type: object`), and each example's
/// input against it. Returns the compiled schema.
pub fn check_definition(
    source: &str,
    definition: &Definition,
) -> Result<loom_schema::Validator, ToolError> {
    check_name(source, &definition.name)?;
    let description = definition.description.trim();
    if description.is_empty() || description.chars().count() > MAX_DESCRIPTION {
        return Err(ToolError::refused(
            rules::DESCRIPTION,
            format!(
                "refused by rule '{}': the description must be 1 to {MAX_DESCRIPTION} characters",
                rules::DESCRIPTION
            ),
        ));
    }
    if definition.code.trim().is_empty() || definition.code.len() > MAX_CODE_BYTES {
        return Err(ToolError::refused(
            rules::CODE,
            format!(
                "refused by rule '{}': the code must be 1 to {MAX_CODE_BYTES} bytes (it is {})",
                rules::CODE,
                definition.code.len()
            ),
        ));
    }
    let validator = check_schema(&definition.input_schema)?;
    if definition.examples.is_empty() || definition.examples.len() > MAX_EXAMPLES {
        return Err(ToolError::refused(
            rules::EXAMPLES,
            format!(
                "refused by rule '{}': give 1 to {MAX_EXAMPLES} examples (given {}); each is run \
                 and compared before the tool is offered",
                rules::EXAMPLES,
                definition.examples.len()
            ),
        ));
    }
    for (index, example) in definition.examples.iter().enumerate() {
        check_input(&validator, &example.input).map_err(|why| {
            ToolError::refused(
                rules::EXAMPLE_INPUT,
                format!(
                    "refused by rule '{}': examples[{index}].input does not match the input \
                     schema: {why}",
                    rules::EXAMPLE_INPUT
                ),
            )
        })?;
    }
    Ok(validator)
}

/// Checks an input schema: an object declaring `type: object`, small enough, and a valid JSON
/// Schema (compiled by `loom-schema`, patterns on the linear-time engine).
pub fn check_schema(schema: &Value) -> Result<loom_schema::Validator, ToolError> {
    let refuse = |why: String| {
        Err(ToolError::refused(
            rules::SCHEMA,
            format!("refused by rule '{}': input_schema {why}", rules::SCHEMA),
        ))
    };
    if schema.get("type") != Some(&Value::String("object".into())) {
        return refuse("must be a JSON Schema object with \"type\": \"object\"".into());
    }
    if schema.to_string().len() > MAX_SCHEMA_BYTES {
        return refuse(format!("is larger than {MAX_SCHEMA_BYTES} bytes"));
    }
    match loom_schema::compile(schema) {
        Ok(validator) => Ok(validator),
        Err(error) => refuse(format!(
            "is not a valid JSON Schema (at '{}'): {error}",
            error.instance_path()
        )),
    }
}

/// The first reason `input` does not match the schema, with its place.
pub fn check_input(validator: &loom_schema::Validator, input: &Value) -> Result<(), String> {
    match validator.iter_errors(input).next() {
        None => Ok(()),
        Some(error) => {
            let at = error.instance_path().to_string();
            Err(if at.is_empty() {
                error.to_string()
            } else {
                format!("at '{at}': {error}")
            })
        }
    }
}

/// The first place where `actual` differs from `expected` (exact JSON equality: `1` and `1.0`
/// differ, object key order does not matter), as a JSON pointer with both values there;
/// `None` when they are equal.
pub fn first_difference(expected: &Value, actual: &Value) -> Option<Difference> {
    difference_at(String::new(), expected, actual)
}

/// Where an output differs from the expected one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Difference {
    /// A JSON pointer (`""` for the whole value, `/total`, `/items/2`).
    pub at: String,
    /// The expected value there (`null` with `missing` when the key is absent from the
    /// output… or from the expectation).
    pub expected: Value,
    /// The value the program printed there.
    pub actual: Value,
    /// What differs, in words.
    pub why: String,
}

fn difference_at(at: String, expected: &Value, actual: &Value) -> Option<Difference> {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (key, value) in e {
                let here = format!("{at}/{}", pointer_token(key));
                match a.get(key) {
                    Some(other) => {
                        if let Some(found) = difference_at(here, value, other) {
                            return Some(found);
                        }
                    }
                    None => {
                        return Some(Difference {
                            at: here,
                            expected: value.clone(),
                            actual: Value::Null,
                            why: "the key is missing from the output".into(),
                        });
                    }
                }
            }
            a.iter()
                .find(|(key, _)| !e.contains_key(*key))
                .map(|(key, value)| Difference {
                    at: format!("{at}/{}", pointer_token(key)),
                    expected: Value::Null,
                    actual: value.clone(),
                    why: "the output has a key the example does not expect".into(),
                })
        }
        (Value::Array(e), Value::Array(a)) => {
            for (index, (x, y)) in e.iter().zip(a).enumerate() {
                if let Some(found) = difference_at(format!("{at}/{index}"), x, y) {
                    return Some(found);
                }
            }
            (e.len() != a.len()).then(|| Difference {
                at,
                expected: Value::from(e.len()),
                actual: Value::from(a.len()),
                why: format!("{} items expected, {} printed", e.len(), a.len()),
            })
        }
        _ if expected == actual => None,
        _ => Some(Difference {
            at,
            expected: expected.clone(),
            actual: actual.clone(),
            why: "the values differ".into(),
        }),
    }
}

/// `key` escaped as a JSON pointer token.
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn definition() -> Definition {
        Definition {
            name: "double".into(),
            description: "Doubles n.".into(),
            input_schema: json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
            code: "import json,sys\nprint(json.dumps({'r': json.load(sys.stdin)['n'] * 2}))\n"
                .into(),
            examples: vec![Example {
                input: json!({"n": 2}),
                output: json!({"r": 4}),
            }],
        }
    }

    fn rule(result: Result<impl std::fmt::Debug, ToolError>) -> &'static str {
        result.unwrap_err().rule.unwrap()
    }

    #[test]
    fn names_follow_the_pattern_and_leave_room_for_the_prefix() {
        for good in ["double", "a", "sum_of_squares", "v2"] {
            assert!(check_name("forge", good).is_ok(), "{good}");
        }
        for bad in [
            "", "Double", "2x", "_x", "x_", "a__b", "a-b", "a.b", "../x", "dé", "define", "call",
        ] {
            assert_eq!(rule(check_name("forge", bad)), rules::NAME, "{bad:?}");
        }
        assert_eq!(
            rule(check_name("forge", &"a".repeat(MAX_NAME + 1))),
            rules::NAME
        );
        // 40 + 2 + 23 > 64.
        let long_source = "s".repeat(40);
        assert_eq!(rule(check_name(&long_source, &"a".repeat(23))), rules::NAME);
        let error = check_name("forge", "define").unwrap_err();
        assert!(error.message.contains("reserved"), "{}", error.message);
    }

    #[test]
    fn a_definition_is_refused_by_the_rule_it_breaks() {
        assert!(check_definition("forge", &definition()).is_ok());
        let mut d = definition();
        d.description = "  ".into();
        assert_eq!(rule(check_definition("forge", &d)), rules::DESCRIPTION);
        let mut d = definition();
        d.code = "x".repeat(MAX_CODE_BYTES + 1);
        assert_eq!(rule(check_definition("forge", &d)), rules::CODE);
        let mut d = definition();
        d.examples.clear();
        assert_eq!(rule(check_definition("forge", &d)), rules::EXAMPLES);
        let mut d = definition();
        d.input_schema = json!({"type": "array"});
        assert_eq!(rule(check_definition("forge", &d)), rules::SCHEMA);
        let mut d = definition();
        d.input_schema = json!({"type": "object", "properties": {"n": {"type": 12}}});
        let error = check_definition("forge", &d).unwrap_err();
        assert_eq!(error.rule, Some(rules::SCHEMA));
        assert!(
            error.message.contains("not a valid JSON Schema"),
            "{}",
            error.message
        );
        let mut d = definition();
        d.input_schema =
            json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "(?=a)"}}});
        assert_eq!(rule(check_definition("forge", &d)), rules::SCHEMA);
        let mut d = definition();
        d.examples.push(Example {
            input: json!({"n": "two"}),
            output: json!({"r": 4}),
        });
        let error = check_definition("forge", &d).unwrap_err();
        assert_eq!(error.rule, Some(rules::EXAMPLE_INPUT));
        assert!(
            error.message.contains("examples[1].input") && error.message.contains("/n"),
            "{}",
            error.message
        );
    }

    #[test]
    fn the_first_difference_is_located_by_a_json_pointer() {
        assert_eq!(
            first_difference(&json!({"a": [1, 2]}), &json!({"a": [1, 2]})),
            None
        );
        // Key order does not matter.
        assert_eq!(
            first_difference(&json!({"a": 1, "b": 2}), &json!({"b": 2, "a": 1})),
            None
        );
        let d = first_difference(&json!({"a": [1, 2]}), &json!({"a": [1, 3]})).unwrap();
        assert_eq!(
            (d.at.as_str(), &d.expected, &d.actual),
            ("/a/1", &json!(2), &json!(3))
        );
        // Exact equality: an integer is not a float.
        let d = first_difference(&json!({"r": 1}), &json!({"r": 1.0})).unwrap();
        assert_eq!(d.at, "/r");
        let d = first_difference(&json!({"r": 1}), &json!({})).unwrap();
        assert_eq!(d.why, "the key is missing from the output");
        let d = first_difference(&json!({}), &json!({"x/y": 1})).unwrap();
        assert_eq!(d.at, "/x~1y");
        let d = first_difference(&json!([1]), &json!([1, 2])).unwrap();
        assert_eq!(
            (d.at.as_str(), &d.expected, &d.actual),
            ("", &json!(1), &json!(2))
        );
        let d = first_difference(&json!("a"), &json!(["a"])).unwrap();
        assert_eq!(d.at, "");
    }
}
