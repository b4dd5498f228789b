//! Output contracts: what a final answer, or a role's or tool's result, must respect.
//!
//! A [`ContractSpec`] is plain data (the configuration layer builds it); [`Contract::new`]
//! compiles it once (JSON Schema validator, regular expressions) and refuses a spec that can
//! never be checked. [`Contract::check`] is pure: it normalizes an output, checks it and
//! returns a [`Verdict`]. What a failed check leads to (a repair, `unverified`, a fallback, a
//! failure) is decided by the caller from [`ContractSpec::repair`] and
//! [`ContractSpec::on_failure`].
//!
//! Checking follows the reference `guards/contract.py`:
//!
//! 1. **normalize** (when [`ContractSpec::normalize`]): trim; remove one surrounding
//!    ```` ``` ```` fence (with an optional language tag); when a schema is expected and the
//!    text is not JSON, extract JSON from it: the first fenced `json` block that parses, then
//!    the span from the first `{` (or `[`) to the last `}` (or `]`) that parses.
//! 2. **check**: an empty output is refused (unless structured data comes with it); with a
//!    schema, the JSON (the tool's structured data when given, else the text) is validated;
//!    `must_match` must match somewhere; `must_not_match` must match nowhere; `max_chars`
//!    bounds the length in characters.
//! 3. **verdict**: [`Verdict::Passed`] carries the normalized text and the validated JSON;
//!    [`Verdict::Failed`] carries the problems and a diagnostic for the model that produced
//!    the output.
//!
//! **Secrets stay out of reports.** A `must_not_match` violation is reported by position and
//! length, never by the matched text, and schema errors mask the offending values: problems
//! are journaled, and the output may hold secrets or personal data.
//!
//! Regular expressions are compiled by the `regex` crate, whose matching time is linear in the
//! input: no pattern can make a check hang (no look-around nor back-references, which
//! [`Contract::new`] refuses with the compiler's message).

use std::sync::Arc;

use regex::Regex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which tools a repair call may use (`repair.tools`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RepairTools {
    /// Each guard's default: a contract repair goes without tools (a judge's keeps them).
    #[default]
    Auto,
    /// Never offer tools to a repair.
    None,
    /// Offer the author's tools to a repair.
    Allowed,
}

impl RepairTools {
    /// The configuration spelling (`auto`, `none`, `allowed`).
    pub fn as_str(self) -> &'static str {
        match self {
            RepairTools::Auto => "auto",
            RepairTools::None => "none",
            RepairTools::Allowed => "allowed",
        }
    }
}

/// How repairs are asked of the output's author (`repair:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RepairSettings {
    /// Repairs asked before `on_failure` applies (`0`: none).
    pub max_attempts: u32,
    /// Which tools a repair may use.
    pub tools: RepairTools,
}

impl Default for RepairSettings {
    /// One repair, tools `auto`.
    fn default() -> Self {
        RepairSettings {
            max_attempts: 1,
            tools: RepairTools::Auto,
        }
    }
}

/// What a non-compliant output becomes once repairs are exhausted (`on_failure`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// The final answer fails the run; a role's or tool's result becomes an error.
    #[default]
    Fail,
    /// The output is kept and flagged as unverified.
    Unverified,
    /// The output is replaced with [`ContractSpec::fallback_message`] and flagged.
    Fallback,
}

impl OnFailure {
    /// The configuration spelling (`fail`, `unverified`, `fallback`), also journaled as a
    /// `guard.checked` resolution.
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::Fail => "fail",
            OnFailure::Unverified => "unverified",
            OnFailure::Fallback => "fallback",
        }
    }
}

/// An output contract as declared (`output:` of an agent, a role or a tool).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContractSpec {
    /// JSON Schema the output must validate against (the output is then JSON).
    pub schema: Option<Value>,
    /// Regular expression that must match somewhere in the output.
    pub must_match: Option<String>,
    /// Regular expression that must match nowhere in the output.
    pub must_not_match: Option<String>,
    /// Maximum length of the output, in characters (Unicode scalar values, not bytes).
    pub max_chars: Option<usize>,
    /// Whether the output is normalized before it is checked (trim, fence, JSON extraction).
    pub normalize: bool,
    /// How repairs are asked.
    pub repair: RepairSettings,
    /// What a non-compliant output becomes once repairs are exhausted.
    pub on_failure: OnFailure,
    /// The replacement output under [`OnFailure::Fallback`] (required then).
    pub fallback_message: Option<String>,
}

impl Default for ContractSpec {
    /// No rule, normalization on, one repair, then `fail`.
    fn default() -> Self {
        ContractSpec {
            schema: None,
            must_match: None,
            must_not_match: None,
            max_chars: None,
            normalize: true,
            repair: RepairSettings::default(),
            on_failure: OnFailure::Fail,
            fallback_message: None,
        }
    }
}

/// Why a [`ContractSpec`] cannot be compiled; each variant names the faulty rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    /// `must_match` or `must_not_match` is not a valid regular expression (or uses a
    /// feature the linear-time engine refuses: look-around, back-references).
    #[error("contract: {rule} is not a valid regular expression: {message}")]
    InvalidRegex {
        /// The rule: `must_match` or `must_not_match`.
        rule: &'static str,
        /// The compiler's message.
        message: String,
    },
    /// `schema` is not a valid JSON Schema (or references one that cannot be resolved).
    #[error("contract: schema is not a valid JSON Schema: {0}")]
    InvalidSchema(String),
    /// `max_chars` is zero: no output could pass.
    #[error("contract: max_chars must be greater than 0")]
    ZeroMaxChars,
    /// `on_failure: fallback` without a (non-blank) `fallback_message`.
    #[error("contract: on_failure is 'fallback' but fallback_message is not set")]
    MissingFallbackMessage,
}

/// A compiled output contract, cheap to clone.
#[derive(Debug, Clone)]
pub struct Contract {
    spec: ContractSpec,
    validator: Option<Arc<loom_schema::Validator>>,
    must_match: Option<Regex>,
    must_not_match: Option<Regex>,
    /// The rules restated in every diagnostic, one line each.
    rules: Vec<String>,
}

/// The outcome of [`Contract::check`].
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The output meets its contract.
    Passed {
        /// The output after normalization (the input itself when nothing changed).
        text: String,
        /// The validated JSON when the contract has a schema (the structured data when it
        /// was given, else the text parsed), or else the structured data given.
        data: Option<Value>,
        /// Whether normalization changed the text.
        normalized: bool,
    },
    /// The output breaks its contract.
    Failed {
        /// The problems, one line each, without a leading dash.
        problems: Vec<String>,
        /// The message asking the output's author for a corrected output.
        diagnostic: String,
    },
}

impl Verdict {
    /// Whether the output passed.
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Passed { .. })
    }
}

impl Contract {
    /// Compiles a contract: its schema and regular expressions, checked once here.
    ///
    /// # Errors
    ///
    /// A [`ContractError`] naming the rule: an invalid regular expression, an invalid JSON
    /// Schema, `max_chars: 0`, `on_failure: fallback` without `fallback_message`.
    pub fn new(spec: ContractSpec) -> Result<Contract, ContractError> {
        let validator = match &spec.schema {
            Some(schema) => Some(Arc::new(loom_schema::compile(schema).map_err(|e| {
                // The location of a meta-schema error is the faulty place in the schema.
                let path = e.instance_path().to_string();
                ContractError::InvalidSchema(if path.is_empty() {
                    e.to_string()
                } else {
                    format!("at {path}: {e}")
                })
            })?)),
            None => None,
        };
        let must_match = compile("must_match", spec.must_match.as_deref())?;
        let must_not_match = compile("must_not_match", spec.must_not_match.as_deref())?;
        if spec.max_chars == Some(0) {
            return Err(ContractError::ZeroMaxChars);
        }
        if spec.on_failure == OnFailure::Fallback
            && spec
                .fallback_message
                .as_deref()
                .is_none_or(|m| m.trim().is_empty())
        {
            return Err(ContractError::MissingFallbackMessage);
        }
        let mut rules = Vec::new();
        if let Some(schema) = &spec.schema {
            rules.push(format!("Expected JSON Schema: {schema}"));
        }
        if let Some(max) = spec.max_chars {
            rules.push(format!("Maximum length: {max} characters"));
        }
        if let Some(pattern) = &spec.must_match {
            rules.push(format!("Must match: {pattern}"));
        }
        Ok(Contract {
            spec,
            validator,
            must_match,
            must_not_match,
            rules,
        })
    }

    /// The contract as declared.
    pub fn spec(&self) -> &ContractSpec {
        &self.spec
    }

    /// Checks an output: its visible text and, for tool results, its structured data.
    ///
    /// With a schema, `data` (when given) is what is validated, and the text is then not
    /// parsed nor mined for JSON; the text rules (`must_match`, `must_not_match`,
    /// `max_chars`) always apply to the text.
    pub fn check(&self, text: &str, data: Option<&Value>) -> Verdict {
        let expects_json = self.validator.is_some() && data.is_none();
        let (output, mut parsed) = if self.spec.normalize {
            normalize(text, expects_json)
        } else {
            (text, None)
        };
        let normalized = output != text;

        if output.trim().is_empty() && data.is_none() {
            return self.failed(vec!["the output is empty".to_owned()]);
        }

        let mut problems = Vec::new();
        if let Some(validator) = &self.validator {
            let instance = match data {
                Some(data) => Some(data),
                None => {
                    if parsed.is_none() {
                        match serde_json::from_str::<Value>(output) {
                            Ok(value) => parsed = Some(value),
                            Err(e) => problems.push(format!("the output is not valid JSON: {e}")),
                        }
                    }
                    parsed.as_ref()
                }
            };
            if let Some(instance) = instance {
                problems.extend(schema_problems(validator, instance));
            }
        }
        if let Some(re) = &self.must_match
            && !re.is_match(output)
        {
            problems.push("the output does not match the required pattern (must_match)".to_owned());
        }
        if let Some(re) = &self.must_not_match {
            let mut matches = re.find_iter(output);
            if let Some(first) = matches.next() {
                // Positions in characters, as the reference reports them; never the text.
                let start = output[..first.start()].chars().count();
                let length = first.as_str().chars().count();
                let others = matches.count();
                let more = match others {
                    0 => String::new(),
                    1 => ", and 1 more occurrence".to_owned(),
                    n => format!(", and {n} more occurrences"),
                };
                problems.push(format!(
                    "the output contains a forbidden pattern (must_not_match) at character \
                     {start}, length {length}{more}"
                ));
            }
        }
        if let Some(max) = self.spec.max_chars {
            let count = output.chars().count();
            if count > max {
                problems.push(format!(
                    "the output is {count} characters long, more than the maximum of {max}"
                ));
            }
        }

        if !problems.is_empty() {
            return self.failed(problems);
        }
        let data = if self.validator.is_some() {
            data.cloned().or(parsed)
        } else {
            data.cloned()
        };
        Verdict::Passed {
            text: output.to_owned(),
            data,
            normalized,
        }
    }

    /// The diagnostic for `problems`: the problems, the rules, the request for a new output.
    fn failed(&self, problems: Vec<String>) -> Verdict {
        let mut diagnostic = String::from("The output does not meet its contract:");
        for problem in &problems {
            diagnostic.push_str("\n- ");
            diagnostic.push_str(problem);
        }
        for rule in &self.rules {
            diagnostic.push('\n');
            diagnostic.push_str(rule);
        }
        diagnostic.push_str("\nAnswer again with the corrected output, and only it.");
        Verdict::Failed {
            problems,
            diagnostic,
        }
    }
}

/// Compiles one regular expression of the spec, if set.
fn compile(rule: &'static str, pattern: Option<&str>) -> Result<Option<Regex>, ContractError> {
    pattern
        .map(|p| {
            Regex::new(p).map_err(|e| ContractError::InvalidRegex {
                rule,
                message: e.to_string(),
            })
        })
        .transpose()
}

/// Schema errors, `<JSON pointer>: <message>` with the instance values masked, sorted and
/// deduplicated.
fn schema_problems(validator: &loom_schema::Validator, instance: &Value) -> Vec<String> {
    let mut problems: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| {
            let path = e.instance_path().to_string();
            let path = if path.is_empty() { "(root)" } else { &path };
            format!("{path}: {}", e.masked())
        })
        .collect();
    problems.sort();
    problems.dedup();
    problems
}

/// Normalizes `text`: trimmed, one surrounding fence removed and, when `expects_json`, JSON
/// extracted from it. Returns the normalized text and, when JSON was looked for and found,
/// its value (so that it is parsed once).
fn normalize(text: &str, expects_json: bool) -> (&str, Option<Value>) {
    let trimmed = text.trim();
    let output = strip_fence(trimmed).unwrap_or(trimmed);
    if !expects_json {
        return (output, None);
    }
    if let Ok(value) = serde_json::from_str::<Value>(output) {
        return (output, Some(value));
    }
    match extract_json(output) {
        Some((json, value)) => (json, Some(value)),
        None => (output, None),
    }
}

/// The body of a text wrapped in one code fence (```` ```lang ```` … ```` ``` ````), trimmed.
///
/// The opening line holds at most a tag (one word); a body holding other fence lines is not
/// unwrapped (the text is several blocks, not one).
fn strip_fence(text: &str) -> Option<&str> {
    let (first, rest) = text.split_once('\n')?;
    let tag = first.strip_prefix("```")?;
    if tag.contains(|c: char| c == '`' || c.is_whitespace()) {
        return None;
    }
    let body = rest.trim_end().strip_suffix("```")?;
    if body.lines().any(|l| l.trim_start().starts_with("```")) {
        return None;
    }
    Some(body.trim())
}

/// JSON found in prose: the first fenced `json` block that parses, else the first span from
/// an opening `{`/`[` to the last matching closer that parses.
fn extract_json(text: &str) -> Option<(&str, Value)> {
    fenced_json_blocks(text)
        .into_iter()
        .map(str::trim)
        .chain(bracketed_spans(text))
        .find_map(|s| serde_json::from_str::<Value>(s).ok().map(|v| (s, v)))
}

/// The bodies of the fenced blocks tagged `json` (any case), in order.
fn fenced_json_blocks(text: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut open: Option<(bool, usize)> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let Some(info) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let info = info.trim();
        match open {
            None => open = Some((info.eq_ignore_ascii_case("json"), offset)),
            Some((is_json, body)) if info.is_empty() => {
                if is_json {
                    blocks.push(&text[body..start]);
                }
                open = None;
            }
            Some(_) => {}
        }
    }
    blocks
}

/// The spans from the first `{` to the last `}`, and from the first `[` to the last `]`,
/// the one opening first coming first.
fn bracketed_spans(text: &str) -> Vec<&str> {
    let mut spans: Vec<(usize, &str)> = [('{', '}'), ('[', ']')]
        .into_iter()
        .filter_map(|(open, close)| {
            let start = text.find(open)?;
            let end = text.rfind(close)?;
            (end > start).then(|| (start, &text[start..=end]))
        })
        .collect();
    spans.sort_by_key(|&(start, _)| start);
    spans.into_iter().map(|(_, span)| span).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn contract(spec: ContractSpec) -> Contract {
        Contract::new(spec).unwrap()
    }

    fn with_schema(schema: Value) -> Contract {
        contract(ContractSpec {
            schema: Some(schema),
            ..ContractSpec::default()
        })
    }

    fn total_schema() -> Value {
        json!({
            "type": "object",
            "properties": {"total": {"type": "integer"}},
            "required": ["total"],
            "additionalProperties": false
        })
    }

    fn failed(verdict: Verdict) -> (Vec<String>, String) {
        match verdict {
            Verdict::Failed {
                problems,
                diagnostic,
            } => (problems, diagnostic),
            passed => panic!("expected a failure, got {passed:?}"),
        }
    }

    fn passed(verdict: Verdict) -> (String, Option<Value>, bool) {
        match verdict {
            Verdict::Passed {
                text,
                data,
                normalized,
            } => (text, data, normalized),
            failed => panic!("expected a pass, got {failed:?}"),
        }
    }

    #[test]
    fn a_surrounding_fence_is_removed_with_its_tag() {
        let c = contract(ContractSpec::default());
        let (text, data, normalized) =
            passed(c.check("  ```markdown\nHello **world**\n```\n", None));
        assert_eq!(text, "Hello **world**");
        assert_eq!(data, None);
        assert!(normalized);

        let (text, _, normalized) = passed(c.check("```\nplain\n```", None));
        assert_eq!(text, "plain");
        assert!(normalized);
    }

    #[test]
    fn several_blocks_are_not_unwrapped_and_a_clean_text_is_not_normalized() {
        let c = contract(ContractSpec::default());
        let two = "```sh\nls\n```\nthen\n```sh\npwd\n```";
        let (text, _, normalized) = passed(c.check(two, None));
        assert_eq!(text, two);
        assert!(!normalized);

        let (text, _, normalized) = passed(c.check("Bonjour", None));
        assert_eq!(text, "Bonjour");
        assert!(!normalized);
    }

    #[test]
    fn without_normalize_the_text_is_checked_as_is() {
        let c = contract(ContractSpec {
            normalize: false,
            max_chars: Some(5),
            ..ContractSpec::default()
        });
        let (problems, _) = failed(c.check("  abcd  ", None));
        assert_eq!(
            problems,
            ["the output is 8 characters long, more than the maximum of 5"]
        );
        let (text, _, normalized) = passed(c.check("abcd", None));
        assert_eq!((text.as_str(), normalized), ("abcd", false));
    }

    #[test]
    fn json_is_extracted_from_a_fenced_block_inside_prose() {
        let c = with_schema(total_schema());
        let output = "Here is the quote:\n```json\n{\"total\": 10}\n```\nAnything else?";
        let (text, data, normalized) = passed(c.check(output, None));
        assert_eq!(text, "{\"total\": 10}");
        assert_eq!(data, Some(json!({"total": 10})));
        assert!(normalized);
    }

    #[test]
    fn json_is_extracted_from_the_first_brace_to_the_last() {
        let c = with_schema(total_schema());
        let output = "Sure! The result is {\"total\": 42} as requested.";
        let (text, data, normalized) = passed(c.check(output, None));
        assert_eq!(text, "{\"total\": 42}");
        assert_eq!(data, Some(json!({"total": 42})));
        assert!(normalized);

        // An array, after a bracket that is not JSON.
        let c = with_schema(json!({"type": "array", "items": {"type": "integer"}}));
        let (text, data, _) = passed(c.check("Notes {see below}: [1, 2, 3].", None));
        assert_eq!(text, "[1, 2, 3]");
        assert_eq!(data, Some(json!([1, 2, 3])));
    }

    #[test]
    fn a_schema_pass_returns_the_parsed_json() {
        let c = with_schema(total_schema());
        let (text, data, normalized) = passed(c.check("{\"total\": 10}", None));
        assert_eq!(text, "{\"total\": 10}");
        assert_eq!(data, Some(json!({"total": 10})));
        assert!(!normalized);
    }

    #[test]
    fn a_schema_failure_lists_each_error_with_its_path_sorted() {
        let c = with_schema(json!({
            "type": "object",
            "properties": {
                "total": {"type": "integer"},
                "lines": {"type": "array", "items": {"type": "object", "required": ["sku"]}}
            },
            "required": ["total", "lines"]
        }));
        let (problems, diagnostic) = failed(c.check(
            r#"{"total": "cinquante", "lines": [{"sku": "a"}, {}]}"#,
            None,
        ));
        assert_eq!(problems.len(), 2, "{problems:?}");
        assert!(problems[0].starts_with("/lines/1: "), "{problems:?}");
        assert!(problems[0].contains("\"sku\""), "{problems:?}");
        assert!(problems[1].starts_with("/total: "), "{problems:?}");
        assert!(problems[1].contains("integer"), "{problems:?}");
        // The offending value is masked.
        assert!(!diagnostic.contains("cinquante"), "{diagnostic}");
        assert!(diagnostic.starts_with("The output does not meet its contract:\n- /lines/1: "));
        assert!(diagnostic.contains("\n- /total: "));
        assert!(
            diagnostic.contains(
                "\nExpected JSON Schema: {\"type\":\"object\",\"properties\":{\"total\":"
            )
        );
        assert!(diagnostic.ends_with("\nAnswer again with the corrected output, and only it."));
    }

    #[test]
    fn an_error_at_the_root_is_named_root() {
        let c = with_schema(total_schema());
        let (problems, _) = failed(c.check("[1]", None));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("(root): "), "{problems:?}");
    }

    #[test]
    fn text_that_is_not_json_is_refused_under_a_schema() {
        let c = with_schema(total_schema());
        let (problems, diagnostic) = failed(c.check("I could not compute the total.", None));
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].starts_with("the output is not valid JSON: "),
            "{problems:?}"
        );
        assert!(diagnostic.contains("Expected JSON Schema: "));
    }

    #[test]
    fn must_not_match_reports_position_and_length_never_the_text() {
        let secret = "sk-live-4242424242";
        let c = contract(ContractSpec {
            must_not_match: Some(r"sk-live-\d+".to_owned()),
            ..ContractSpec::default()
        });
        // Multibyte text before the match: the position counts characters.
        let output = format!("Clé déjà là : {secret}, et {secret}");
        let (problems, diagnostic) = failed(c.check(&output, None));
        assert_eq!(
            problems,
            [
                "the output contains a forbidden pattern (must_not_match) at character 14, \
              length 18, and 1 more occurrence"
            ]
        );
        assert!(!diagnostic.contains(secret), "{diagnostic}");
        assert!(!diagnostic.contains("4242"), "{diagnostic}");
        // Nor is the pattern restated among the rules.
        assert!(!diagnostic.contains("sk-live"), "{diagnostic}");
        assert!(!problems.iter().any(|p| p.contains(secret)));

        passed(c.check("no key here", None));
    }

    #[test]
    fn must_match_must_match_somewhere() {
        let c = contract(ContractSpec {
            must_match: Some(r"(?i)total\s*:\s*\d+".to_owned()),
            ..ContractSpec::default()
        });
        passed(c.check("The TOTAL: 12 euros.", None));
        let (problems, diagnostic) = failed(c.check("No total.", None));
        assert_eq!(
            problems,
            ["the output does not match the required pattern (must_match)"]
        );
        assert!(diagnostic.contains("\nMust match: (?i)total\\s*:\\s*\\d+\n"));
    }

    #[test]
    fn max_chars_counts_characters_not_bytes() {
        let c = contract(ContractSpec {
            max_chars: Some(5),
            ..ContractSpec::default()
        });
        // 5 characters, 10 bytes.
        let (text, _, _) = passed(c.check("éàçüö", None));
        assert_eq!(text, "éàçüö");
        let (problems, diagnostic) = failed(c.check("éàçüöï", None));
        assert_eq!(
            problems,
            ["the output is 6 characters long, more than the maximum of 5"]
        );
        assert_eq!(
            diagnostic,
            "The output does not meet its contract:\n\
             - the output is 6 characters long, more than the maximum of 5\n\
             Maximum length: 5 characters\n\
             Answer again with the corrected output, and only it."
        );
    }

    #[test]
    fn an_empty_output_is_refused_unless_data_comes_with_it() {
        let c = contract(ContractSpec::default());
        let (problems, diagnostic) = failed(c.check("  \n ", None));
        assert_eq!(problems, ["the output is empty"]);
        assert_eq!(
            diagnostic,
            "The output does not meet its contract:\n- the output is empty\n\
             Answer again with the corrected output, and only it."
        );
        let (problems, _) = failed(c.check("```\n\n```", None));
        assert_eq!(problems, ["the output is empty"]);

        let (text, data, _) = passed(c.check("", Some(&json!({"ok": true}))));
        assert_eq!(text, "");
        assert_eq!(data, Some(json!({"ok": true})));
    }

    #[test]
    fn tool_data_takes_precedence_over_the_text() {
        let c = with_schema(total_schema());
        // The text is not JSON, the data is valid: it passes, the text is not mined.
        let (text, data, normalized) = passed(c.check(
            "Total computed: {\"total\": \"x\"}",
            Some(&json!({"total": 7})),
        ));
        assert_eq!(text, "Total computed: {\"total\": \"x\"}");
        assert_eq!(data, Some(json!({"total": 7})));
        assert!(!normalized);

        // The text is valid JSON, the data is not: it fails on the data.
        let (problems, _) = failed(c.check("{\"total\": 7}", Some(&json!({"total": "7"}))));
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("/total: "), "{problems:?}");
    }

    #[test]
    fn every_problem_is_reported_together() {
        let c = contract(ContractSpec {
            schema: Some(total_schema()),
            must_match: Some("total".to_owned()),
            must_not_match: Some("9".to_owned()),
            max_chars: Some(10),
            ..ContractSpec::default()
        });
        let (problems, diagnostic) = failed(c.check("{\"sum\": 99}", None));
        assert_eq!(problems.len(), 5, "{problems:?}");
        let rules: Vec<&str> = diagnostic.lines().skip(6).collect();
        assert_eq!(
            rules,
            [
                &*format!("Expected JSON Schema: {}", total_schema()),
                "Maximum length: 10 characters",
                "Must match: total",
                "Answer again with the corrected output, and only it.",
            ]
        );
    }

    #[test]
    fn invalid_rules_are_refused_at_construction_naming_the_rule() {
        let err = Contract::new(ContractSpec {
            must_match: Some("(unclosed".to_owned()),
            ..ContractSpec::default()
        })
        .unwrap_err();
        assert!(matches!(
            err,
            ContractError::InvalidRegex {
                rule: "must_match",
                ..
            }
        ));
        assert!(
            err.to_string()
                .starts_with("contract: must_match is not a valid regular expression")
        );

        // Look-around needs backtracking: refused, not silently slow.
        let err = Contract::new(ContractSpec {
            must_not_match: Some("secret(?=\\d)".to_owned()),
            ..ContractSpec::default()
        })
        .unwrap_err();
        assert!(matches!(
            err,
            ContractError::InvalidRegex {
                rule: "must_not_match",
                ..
            }
        ));

        let err = Contract::new(ContractSpec {
            schema: Some(json!({"type": "nope"})),
            ..ContractSpec::default()
        })
        .unwrap_err();
        assert!(matches!(err, ContractError::InvalidSchema(_)), "{err:?}");
        assert!(
            err.to_string()
                .starts_with("contract: schema is not a valid JSON Schema: at /type: ")
        );

        let err = Contract::new(ContractSpec {
            on_failure: OnFailure::Fallback,
            ..ContractSpec::default()
        })
        .unwrap_err();
        assert_eq!(err, ContractError::MissingFallbackMessage);
        assert_eq!(
            err.to_string(),
            "contract: on_failure is 'fallback' but fallback_message is not set"
        );

        let err = Contract::new(ContractSpec {
            on_failure: OnFailure::Fallback,
            fallback_message: Some("  ".to_owned()),
            ..ContractSpec::default()
        })
        .unwrap_err();
        assert_eq!(err, ContractError::MissingFallbackMessage);

        let err = Contract::new(ContractSpec {
            max_chars: Some(0),
            ..ContractSpec::default()
        })
        .unwrap_err();
        assert_eq!(err, ContractError::ZeroMaxChars);

        let ok = Contract::new(ContractSpec {
            on_failure: OnFailure::Fallback,
            fallback_message: Some("Service unavailable.".to_owned()),
            ..ContractSpec::default()
        })
        .unwrap();
        assert_eq!(ok.spec().on_failure.as_str(), "fallback");
    }

    #[test]
    fn a_pathological_pattern_runs_in_linear_time() {
        let c = contract(ContractSpec {
            must_match: Some("(a+)+$".to_owned()),
            must_not_match: Some("(a|aa)+b".to_owned()),
            ..ContractSpec::default()
        });
        let output = format!("{}!", "a".repeat(100_000));
        let (problems, _) = failed(c.check(&output, None));
        assert_eq!(
            problems,
            ["the output does not match the required pattern (must_match)"]
        );
    }

    #[test]
    fn the_spec_reads_its_configuration_spelling() {
        let spec: ContractSpec = serde_json::from_value(json!({
            "must_match": "ok",
            "repair": {"tools": "allowed"},
            "on_failure": "unverified"
        }))
        .unwrap();
        assert_eq!(
            spec,
            ContractSpec {
                must_match: Some("ok".to_owned()),
                repair: RepairSettings {
                    max_attempts: 1,
                    tools: RepairTools::Allowed,
                },
                on_failure: OnFailure::Unverified,
                ..ContractSpec::default()
            }
        );
        assert!(spec.normalize);
        assert!(serde_json::from_value::<ContractSpec>(json!({"maxchars": 3})).is_err());
    }
}
