//! Patterns of compiled schemas: linear time on hostile inputs, backtracking syntax refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;

/// Long enough that a backtracking engine trying every split of the `a`s would not finish.
const LENGTH: usize = 100_000;

#[test]
fn a_catastrophic_pattern_is_answered_on_a_long_input() {
    for pattern in ["(a+)+$", "^(a+)+$", "(a|aa)+$", "^(\\w+\\s?)+$"] {
        let validator =
            loom_schema::compile(&json!({"type": "string", "pattern": pattern})).unwrap();
        let hostile = format!("{}!", "a".repeat(LENGTH));
        assert!(!validator.is_valid(&json!(hostile)), "{pattern}");
        assert!(validator.is_valid(&json!("a".repeat(LENGTH))), "{pattern}");
        let errors: Vec<String> = validator
            .iter_errors(&json!(hostile))
            .map(|e| e.instance_path().to_string())
            .collect();
        assert_eq!(errors, [""], "{pattern}");
    }
}

#[test]
fn pattern_properties_run_on_the_same_engine() {
    let validator = loom_schema::compile(&json!({
        "type": "object",
        "patternProperties": {"^(a|aa)+$": {"type": "integer"}},
    }))
    .unwrap();
    let key = format!("{}b", "a".repeat(LENGTH));
    assert!(validator.is_valid(&json!({key.clone(): "not checked: the key does not match"})));
    assert!(!validator.is_valid(&json!({"a".repeat(LENGTH): "checked"})));
}

/// Lookaround and backreferences need a backtracking engine (`fancy-regex`, jsonschema's
/// default, runs `(?=a)(a+)+$` for seconds on 5,000 characters): they are refused at compile.
#[test]
fn patterns_that_need_backtracking_are_refused_at_compile() {
    for pattern in ["(?=a)(a+)+$", "^(a+)+(?!b)$", "^(a)\\1$"] {
        let error = loom_schema::compile(&json!({"type": "string", "pattern": pattern}))
            .err()
            .unwrap_or_else(|| panic!("{pattern} compiled"));
        assert!(
            error.to_string().contains("is not a \"regex\""),
            "{pattern}: {error}"
        );
        assert_eq!(error.instance_path().to_string(), "/pattern");
    }
    let error = loom_schema::compile(&json!({
        "properties": {"code": {"patternProperties": {"(?<=x)y": {}}}}
    }))
    .err()
    .unwrap();
    assert!(
        error
            .instance_path()
            .to_string()
            .starts_with("/properties/code/patternProperties"),
        "{}",
        error.instance_path()
    );
}
