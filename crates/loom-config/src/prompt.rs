//! System prompts are minijinja templates over `agent`, `tenant` and the tenant's `variables`
//! (`tenants[].variables`, each a top-level name: `{{ company }}`); the input templates of roles
//! are templates over `args` and `context`.
//!
//! Load time: syntax and unknown variables are refused (static analysis, since minijinja's
//! strict mode only acts when rendering). Run time: rendered with strict undefined behaviour.

use minijinja::{Environment, UndefinedBehavior, context};

/// Variables a system prompt may use.
pub(crate) const KNOWN_VARIABLES: [&str; 2] = ["agent", "tenant"];

/// Why a template was refused, with a 1-based position inside the template text.
#[derive(Debug)]
pub(crate) struct TemplateIssue {
    pub(crate) message: String,
    pub(crate) line: Option<usize>,
    pub(crate) column: Option<usize>,
}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env
}

/// Checks syntax and variables of a system prompt template: `agent`, `tenant` and `extra` (the
/// variables some tenant defines) are known.
pub(crate) fn check(text: &str, extra: &[&str]) -> Result<(), TemplateIssue> {
    let mut known: Vec<&str> = KNOWN_VARIABLES.to_vec();
    known.extend(extra.iter().filter(|v| !KNOWN_VARIABLES.contains(v)));
    check_variables(text, &known)
}

/// A variable a template uses, with the 1-based line and column of its first use when found.
pub(crate) type UsedVariable = (String, Option<(usize, usize)>);

/// The top-level variables a system prompt uses besides `agent` and `tenant` (globals such as
/// `range` aside), each with its 1-based line and column, in the order they first appear.
pub(crate) fn tenant_variables(text: &str) -> Result<Vec<UsedVariable>, TemplateIssue> {
    let mut env = environment();
    if let Err(err) = env.add_template_owned("system", text.to_owned()) {
        return Err(syntax_issue(text, &err));
    }
    let template = env
        .get_template("system")
        .map_err(|err| syntax_issue(text, &err))?;
    let globals: Vec<String> = env.globals().map(|(name, _)| name.to_owned()).collect();
    let mut used: Vec<(String, Option<usize>)> = template
        .undeclared_variables(false)
        .into_iter()
        .filter(|v| !KNOWN_VARIABLES.contains(&v.as_str()) && !globals.contains(v))
        .map(|v| {
            let at = find_variable(text, &v);
            (v, at)
        })
        .collect();
    used.sort_by(|a, b| {
        a.1.unwrap_or(usize::MAX)
            .cmp(&b.1.unwrap_or(usize::MAX))
            .then_with(|| a.0.cmp(&b.0))
    });
    Ok(used
        .into_iter()
        .map(|(v, at)| (v, at.map(|offset| line_col(text, offset))))
        .collect())
}

/// Checks the syntax of a template and that it uses no variable outside `known` (globals such
/// as `range` aside).
pub(crate) fn check_variables(text: &str, known: &[&str]) -> Result<(), TemplateIssue> {
    let mut env = environment();
    if let Err(err) = env.add_template_owned("system", text.to_owned()) {
        return Err(syntax_issue(text, &err));
    }
    let template = env
        .get_template("system")
        .map_err(|err| syntax_issue(text, &err))?;
    let globals: Vec<String> = env.globals().map(|(name, _)| name.to_owned()).collect();
    let mut unknown: Vec<String> = template
        .undeclared_variables(false)
        .into_iter()
        .filter(|v| !known.contains(&v.as_str()) && !globals.contains(v))
        .collect();
    // Report the variable that appears first in the text.
    unknown.sort_by_key(|v| find_variable(text, v).unwrap_or(usize::MAX));
    match unknown.first() {
        None => Ok(()),
        Some(var) => {
            let (line, column) = match find_variable(text, var) {
                Some(offset) => {
                    let (l, c) = line_col(text, offset);
                    (Some(l), Some(c))
                }
                None => (None, None),
            };
            Err(TemplateIssue {
                message: format!(
                    "unknown template variable '{var}' (known variables: {})",
                    known.join(", ")
                ),
                line,
                column,
            })
        }
    }
}

/// The variables an input template uses, as dotted paths (`args.city`,
/// `context.tool_results.lookup`, or just `args` when it is used whole or by subscript), in the
/// order they first appear in the text; globals such as `range` are left out.
pub(crate) fn input_variables(text: &str) -> Result<Vec<String>, TemplateIssue> {
    let mut env = environment();
    if let Err(err) = env.add_template_owned("input", text.to_owned()) {
        return Err(syntax_issue(text, &err));
    }
    let template = env
        .get_template("input")
        .map_err(|err| syntax_issue(text, &err))?;
    let globals: Vec<String> = env.globals().map(|(name, _)| name.to_owned()).collect();
    let mut used: Vec<String> = template
        .undeclared_variables(true)
        .into_iter()
        .filter(|v| {
            let head = v.split('.').next().unwrap_or_default();
            !globals.iter().any(|g| g == head)
        })
        .collect();
    used.sort_by(|a, b| {
        let pos = |v: &str| text.find(v).unwrap_or(usize::MAX);
        pos(a).cmp(&pos(b)).then_with(|| a.cmp(b))
    });
    Ok(used)
}

/// Renders a role's input template over `args` and `context` (strict).
pub(crate) fn render_input(
    text: &str,
    args: &serde_json::Value,
    context: &serde_json::Value,
) -> Result<String, TemplateIssue> {
    let env = environment();
    let args = to_template_value(args);
    let context = to_template_value(context);
    env.render_str(text, context! { args => args, context => context })
        .map_err(|err| {
            let mut issue = syntax_issue(text, &err);
            issue.message = format!(
                "cannot render input_template: {}",
                err.detail().unwrap_or("template error")
            );
            issue
        })
}

/// Renders a trigger's `message` or `session` template over `payload` (the request's JSON),
/// `trigger` (its name) and `delivery` (the delivery id, or none); strict, like the others.
pub(crate) fn render_trigger(
    text: &str,
    payload: &serde_json::Value,
    trigger: &str,
    delivery: Option<&str>,
) -> Result<String, TemplateIssue> {
    let env = environment();
    let payload = to_template_value(payload);
    env.render_str(
        text,
        context! { payload => payload, trigger => trigger, delivery => delivery },
    )
    .map_err(|err| {
        let mut issue = syntax_issue(text, &err);
        let detail = err
            .detail()
            .map(str::to_owned)
            .unwrap_or_else(|| err.kind().to_string());
        issue.message = format!("cannot render the template: {detail}");
        issue
    })
}

/// A JSON value as a template value (minijinja is built without its `serde` feature).
fn to_template_value(value: &serde_json::Value) -> minijinja::Value {
    use minijinja::Value as V;
    use serde_json::Value as J;
    match value {
        J::Null => V::from(()),
        J::Bool(b) => V::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => V::from(i),
            (None, Some(u), _) => V::from(u),
            (None, None, Some(f)) => V::from(f),
            (None, None, None) => V::from(n.to_string()),
        },
        J::String(s) => V::from(s.as_str()),
        J::Array(items) => V::from(items.iter().map(to_template_value).collect::<Vec<_>>()),
        J::Object(map) => V::from(
            map.iter()
                .map(|(k, v)| (k.clone(), to_template_value(v)))
                .collect::<std::collections::BTreeMap<String, V>>(),
        ),
    }
}

/// Renders a system prompt over `agent`, `tenant` and the tenant's `variables` (strict: an
/// undefined variable is an error).
pub(crate) fn render(
    text: &str,
    agent: &str,
    tenant: &str,
    variables: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Result<String, TemplateIssue> {
    let env = environment();
    let mut values: std::collections::BTreeMap<String, minijinja::Value> = variables
        .iter()
        .map(|(name, value)| (name.clone(), to_template_value(value)))
        .collect();
    values.insert("agent".into(), minijinja::Value::from(agent));
    values.insert("tenant".into(), minijinja::Value::from(tenant));
    env.render_str(text, minijinja::Value::from(values))
        .map_err(|err| {
            let mut issue = syntax_issue(text, &err);
            issue.message = format!(
                "cannot render system prompt: {}",
                err.detail().unwrap_or("template error")
            );
            issue
        })
}

fn syntax_issue(text: &str, err: &minijinja::Error) -> TemplateIssue {
    let (line, column) = match err.range() {
        Some(range) if range.start <= text.len() => {
            let (l, c) = line_col(text, range.start);
            (Some(l), Some(c))
        }
        _ => (err.line(), err.line().map(|_| 1)),
    };
    let detail = err
        .detail()
        .map(str::to_owned)
        .unwrap_or_else(|| err.kind().to_string());
    TemplateIssue {
        message: format!("template syntax error: {detail}"),
        line,
        column,
    }
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// Byte offset of the first use of `var` as a whole identifier inside a `{{ }}` or `{% %}` tag.
fn find_variable(text: &str, var: &str) -> Option<usize> {
    let mut pos = 0;
    while let Some(open) = text[pos..].find(['{']).map(|i| pos + i) {
        let rest = &text[open..];
        let close = if rest.starts_with("{{") {
            "}}"
        } else if rest.starts_with("{%") {
            "%}"
        } else {
            pos = open + 1;
            continue;
        };
        let end = rest.find(close).map_or(text.len(), |i| open + i);
        let tag = &text[open + 2..end];
        let mut search = 0;
        while let Some(i) = tag[search..].find(var).map(|i| search + i) {
            let before = tag[..i].chars().next_back();
            let after = tag[i + var.len()..].chars().next();
            let is_ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            let member = before == Some('.');
            if !is_ident(before) && !is_ident(after) && !member {
                return Some(open + 2 + i);
            }
            search = i + var.len();
        }
        pos = end.max(open + 2);
        if pos >= text.len() {
            break;
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn known_variables_pass() {
        assert!(check("You are {{ agent }} for {{ tenant }}.", &[]).is_ok());
        assert!(check("{% for i in range(3) %}{{ i }}{% endfor %}", &[]).is_ok());
        assert!(check("{{ company }}", &["company"]).is_ok());
        assert!(check("{{ company }}", &[]).is_err());
    }

    #[test]
    fn unknown_variable_located() {
        let issue = check("Hello\n  {{ agent }} and {{ client.name }}", &[]).unwrap_err();
        assert_eq!(
            issue.message,
            "unknown template variable 'client' (known variables: agent, tenant)"
        );
        assert_eq!((issue.line, issue.column), (Some(2), Some(22)));
    }

    #[test]
    fn syntax_error_located() {
        let issue = check("Hi\n{{ agent ", &[]).unwrap_err();
        assert!(
            issue.message.starts_with("template syntax error: "),
            "{}",
            issue.message
        );
        assert_eq!(issue.line, Some(2));
    }

    #[test]
    fn input_variables_are_dotted_paths_in_order() {
        let used = input_variables(
            "{{ context.tool_results.lookup }} {{ args.city|upper }} {% for i in range(2) %}{{ args['x'] }}{% endfor %}",
        )
        .unwrap();
        assert_eq!(used, ["context.tool_results.lookup", "args", "args.city"]);
        let rendered = render_input(
            "{{ args.city }}: {{ context.user_input }}",
            &serde_json::json!({"city": "Lyon"}),
            &serde_json::json!({"user_input": "hi"}),
        )
        .unwrap();
        assert_eq!(rendered, "Lyon: hi");
        assert!(
            render_input(
                "{{ args.nope }}",
                &serde_json::json!({}),
                &serde_json::json!({})
            )
            .is_err()
        );
    }

    #[test]
    fn renders_strict() {
        let none = std::collections::BTreeMap::new();
        assert_eq!(
            render("{{ agent }}@{{ tenant }}", "a", "t", &none).unwrap(),
            "a@t"
        );
        assert!(render("{{ nope }}", "a", "t", &none).is_err());
        let variables = [("company".to_owned(), serde_json::json!({"name": "Dupont"}))].into();
        assert_eq!(
            render("{{ company.name }} / {{ tenant }}", "a", "t", &variables).unwrap(),
            "Dupont / t"
        );
    }

    #[test]
    fn tenant_variables_are_listed_with_their_place() {
        let used =
            tenant_variables("{{ agent }}\n{{ company.name }} {{ tone }} {{ company }}").unwrap();
        assert_eq!(
            used,
            [
                ("company".to_owned(), Some((2, 4))),
                ("tone".to_owned(), Some((2, 23)))
            ]
        );
    }
}
