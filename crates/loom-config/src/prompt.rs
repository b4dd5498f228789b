//! System prompts are minijinja templates over two variables: `agent` and `tenant`.
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

/// Checks syntax and variables of a system prompt template.
pub(crate) fn check(text: &str) -> Result<(), TemplateIssue> {
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
        .filter(|v| !KNOWN_VARIABLES.contains(&v.as_str()) && !globals.contains(v))
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
                    KNOWN_VARIABLES.join(", ")
                ),
                line,
                column,
            })
        }
    }
}

/// Renders a system prompt (strict: an undefined variable is an error).
pub(crate) fn render(text: &str, agent: &str, tenant: &str) -> Result<String, TemplateIssue> {
    let env = environment();
    env.render_str(text, context! { agent => agent, tenant => tenant })
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
        assert!(check("You are {{ agent }} for {{ tenant }}.").is_ok());
        assert!(check("{% for i in range(3) %}{{ i }}{% endfor %}").is_ok());
    }

    #[test]
    fn unknown_variable_located() {
        let issue = check("Hello\n  {{ agent }} and {{ client.name }}").unwrap_err();
        assert_eq!(
            issue.message,
            "unknown template variable 'client' (known variables: agent, tenant)"
        );
        assert_eq!((issue.line, issue.column), (Some(2), Some(22)));
    }

    #[test]
    fn syntax_error_located() {
        let issue = check("Hi\n{{ agent ").unwrap_err();
        assert!(
            issue.message.starts_with("template syntax error: "),
            "{}",
            issue.message
        );
        assert_eq!(issue.line, Some(2));
    }

    #[test]
    fn renders_strict() {
        assert_eq!(render("{{ agent }}@{{ tenant }}", "a", "t").unwrap(), "a@t");
        assert!(render("{{ nope }}", "a", "t").is_err());
    }
}
