//! The env file (`.env`) read with a configuration: `KEY=VALUE` lines whose variables fill in
//! what the environment lacks (a variable already set in the environment wins).
//!
//! Which file: `--env-file F` (it must exist), else `env_file:` of the root file (relative to
//! it; it must exist; refused inside `profiles`), else `.env` beside the configuration when
//! there is one; `--no-env-file` reads none ([`EnvFile`]). The file is read like the other
//! files a configuration names (a regular file of at most 1 MiB of UTF-8 text).
//!
//! The syntax is the one of python-dotenv, which the reference reads it with: blank lines and
//! `#` comments, an optional `export ` before the key, spaces around `=`, values unquoted
//! (up to a ` #` comment, trimmed), in single quotes (literal) or double quotes (escapes
//! `\n`, `\t`, `\r`, `\"`, `\\`), both quotes spanning lines; `${NAME}` and `${NAME:-default}`
//! in unquoted and double-quoted values expand from the environment, then from the lines
//! above. A key without `=` sets nothing. Unlike python-dotenv, which warns and skips a line it
//! cannot parse, a malformed line is a configuration error naming its file and line.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use crate::{ConfigError, ConfigErrorKind};

/// Which env file a configuration is loaded with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum EnvFile {
    /// `env_file:` of the configuration (which must exist), else `.env` beside the
    /// configuration when there is one.
    #[default]
    Beside,
    /// This file (`--env-file`), which must exist; `env_file:` is not read.
    Path(PathBuf),
    /// None (`--no-env-file`), whatever `env_file:` says.
    Off,
}

/// What a configuration is loaded with besides its file and the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// The profile (`--profile`), which wins over `LOOM_PROFILE` and `profile:`.
    pub profile: Option<crate::Profile>,
    /// The env file.
    pub env_file: EnvFile,
}

/// An env file that was read: where, and its variables.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EnvVars {
    path: Option<PathBuf>,
    vars: BTreeMap<String, String>,
}

impl std::fmt::Debug for EnvVars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: an env file holds secrets.
        f.debug_struct("EnvVars")
            .field("path", &self.path)
            .field("names", &self.vars.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl EnvVars {
    /// The file read (`None`: no env file).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The value the file gives `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// The names the file sets, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.vars.keys().map(String::as_str)
    }

    /// The variables the file sets, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// Reads the env file at `path` (shown as `shown` in errors), expanding `${NAME}` from `env`
/// first, then from the lines above.
pub(crate) fn read(
    path: &Path,
    shown: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<EnvVars, ConfigError> {
    let text = crate::files::read_regular(path).map_err(|problem| {
        let kind = match problem {
            crate::files::FileProblem::NotFound => ConfigErrorKind::MissingFile,
            crate::files::FileProblem::Io(_) => ConfigErrorKind::Io,
            _ => ConfigErrorKind::Invalid,
        };
        error(
            shown,
            None,
            kind,
            format!("cannot read env file: {problem}"),
        )
    })?;
    let vars = parse(&text, env)
        .map_err(|(line, message)| error(shown, Some(line), ConfigErrorKind::Syntax, message))?;
    Ok(EnvVars {
        path: Some(shown.to_path_buf()),
        vars,
    })
}

fn error(file: &Path, line: Option<usize>, kind: ConfigErrorKind, message: String) -> ConfigError {
    ConfigError {
        file: file.to_path_buf(),
        line,
        column: line.map(|_| 1),
        key_path: "(env file)".to_owned(),
        message,
        kind,
    }
}

/// A cursor over the file's characters that knows its line.
struct Cursor<'t> {
    chars: std::iter::Peekable<std::str::Chars<'t>>,
    line: usize,
}

impl Cursor<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.chars.next();
        if c == Some('\n') {
            self.line += 1;
        }
        c
    }

    /// Skips spaces and tabs (not newlines).
    fn blanks(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t')) {
            self.next();
        }
    }

    /// The rest of the line (without its newline, which is consumed).
    fn rest_of_line(&mut self) -> String {
        let mut rest = String::new();
        while let Some(c) = self.next() {
            if c == '\n' {
                break;
            }
            rest.push(c);
        }
        rest
    }
}

type ParseError = (usize, String);

/// Parses the text of an env file.
fn parse(
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, String>, ParseError> {
    let mut vars = BTreeMap::new();
    let mut at = Cursor {
        chars: text.chars().peekable(),
        line: 1,
    };
    loop {
        while matches!(at.peek(), Some(' ' | '\t' | '\r' | '\n')) {
            at.next();
        }
        match at.peek() {
            None => break,
            Some('#') => {
                at.rest_of_line();
                continue;
            }
            Some(_) => {}
        }
        let line = at.line;
        let mut key = read_key(&mut at);
        if key == "export" && matches!(at.peek(), Some(' ' | '\t')) {
            at.blanks();
            key = read_key(&mut at);
        }
        if key.is_empty() {
            let rest = at.rest_of_line();
            return Err((line, format!("expected KEY=VALUE, found '{}'", rest.trim())));
        }
        at.blanks();
        match at.peek() {
            Some('=') => {
                at.next();
            }
            // A key alone sets nothing (python-dotenv gives it no value).
            None | Some('\n' | '\r' | '#') => {
                at.rest_of_line();
                continue;
            }
            Some(_) => {
                let rest = at.rest_of_line();
                return Err((
                    line,
                    format!("expected '=' after {key}, found '{}'", rest.trim()),
                ));
            }
        }
        at.blanks();
        let value = value(&mut at, &key, &|name| {
            env(name).or_else(|| vars.get(name).cloned())
        })?;
        vars.insert(key, value);
    }
    Ok(vars)
}

/// A key: letters, digits, `_`, `.` and `-`, not starting with a digit.
fn read_key(at: &mut Cursor<'_>) -> String {
    let mut key = String::new();
    while let Some(c) = at.peek() {
        let fits = c.is_ascii_alphabetic()
            || c == '_'
            || (!key.is_empty() && (c.is_ascii_digit() || c == '.' || c == '-'));
        if !fits {
            break;
        }
        key.push(c);
        at.next();
    }
    key
}

/// The value after `=`, up to and including the end of its line.
fn value(
    at: &mut Cursor<'_>,
    key: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ParseError> {
    let start = at.line;
    let value = match at.peek() {
        Some(quote @ ('\'' | '"')) => {
            at.next();
            let mut raw = String::new();
            loop {
                match at.next() {
                    None => {
                        return Err((start, format!("{key}: the {quote} quote is never closed")));
                    }
                    Some('\\') => match at.next() {
                        Some(c) if quote == '\'' && matches!(c, '\'' | '\\') => raw.push(c),
                        Some(c) if quote == '\'' => {
                            raw.push('\\');
                            raw.push(c);
                        }
                        Some('n') => raw.push('\n'),
                        Some('t') => raw.push('\t'),
                        Some('r') => raw.push('\r'),
                        Some(c @ ('"' | '\\' | '\'' | '$')) => raw.push(c),
                        Some(c) => {
                            raw.push('\\');
                            raw.push(c);
                        }
                        None => {
                            return Err((
                                start,
                                format!("{key}: the {quote} quote is never closed"),
                            ));
                        }
                    },
                    Some(c) if c == quote => break,
                    Some(c) => raw.push(c),
                }
            }
            let after = at.line;
            let rest = at.rest_of_line();
            let rest = rest.trim();
            if !rest.is_empty() && !rest.starts_with('#') {
                return Err((
                    after,
                    format!("{key}: unexpected '{rest}' after the closing quote"),
                ));
            }
            if quote == '"' {
                expand(&raw, key, start, lookup)?
            } else {
                raw
            }
        }
        _ => {
            let line = at.rest_of_line();
            // A comment starts at a `#` after a blank.
            let mut cut = line.len();
            let bytes = line.as_bytes();
            for (i, b) in bytes.iter().enumerate() {
                if *b == b'#' && (i == 0 || matches!(bytes[i - 1], b' ' | b'\t')) {
                    cut = i;
                    break;
                }
            }
            expand(line[..cut].trim(), key, start, lookup)?
        }
    };
    Ok(value)
}

/// Expands `${NAME}` and `${NAME:-default}`.
fn expand(
    text: &str,
    key: &str,
    line: usize,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ParseError> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err((line, format!("{key}: '${{' is never closed by '}}'")));
        };
        let inner = &after[..end];
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (inner, None),
        };
        match lookup(name) {
            Some(value) => out.push_str(&value),
            None => out.push_str(default.unwrap_or("")),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> BTreeMap<String, String> {
        parse(text, &|name| {
            (name == "HOME").then(|| "/home/me".to_owned())
        })
        .unwrap()
    }

    #[test]
    fn the_python_dotenv_syntax_is_read() {
        let vars = parsed(
            "# a comment\n\
             \n\
             PLAIN=value  # trailing comment\n\
             export EXPORTED = spaced \n\
             HASH=a#b\n\
             SINGLE='lit ${HOME} \\n'\n\
             DOUBLE=\"line\\nnext \\\"q\\\" ${HOME}\"\n\
             MULTI=\"one\n\
             two\"\n\
             EXPANDED=${HOME}/x ${PLAIN} ${MISSING:-fallback} ${MISSING}.\n\
             EMPTY=\n\
             ALONE\n\
             dotted.name-x=1\n",
        );
        let expected: BTreeMap<String, String> = [
            ("PLAIN", "value"),
            ("EXPORTED", "spaced"),
            ("HASH", "a#b"),
            ("SINGLE", "lit ${HOME} \\n"),
            ("DOUBLE", "line\nnext \"q\" /home/me"),
            ("MULTI", "one\ntwo"),
            ("EXPANDED", "/home/me/x value fallback ."),
            ("EMPTY", ""),
            ("dotted.name-x", "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(vars, expected);
    }

    #[test]
    fn a_malformed_line_is_refused_with_its_line() {
        let env = |_: &str| None;
        assert_eq!(
            parse("A=1\nnot a pair\n", &env).unwrap_err(),
            (2, "expected '=' after not, found 'a pair'".to_owned())
        );
        assert_eq!(
            parse("A=1\n\nB=\"open\n", &env).unwrap_err(),
            (3, "B: the \" quote is never closed".to_owned())
        );
        assert_eq!(
            parse("C='x' y\n", &env).unwrap_err(),
            (1, "C: unexpected 'y' after the closing quote".to_owned())
        );
        assert_eq!(
            parse("=x\n", &env).unwrap_err(),
            (1, "expected KEY=VALUE, found '=x'".to_owned())
        );
    }

    #[test]
    fn the_debug_view_shows_names_not_values() {
        let vars = EnvVars {
            path: Some(PathBuf::from(".env")),
            vars: [("API_KEY".to_owned(), "sk-secret".to_owned())].into(),
        };
        let shown = format!("{vars:?}");
        assert!(
            shown.contains("API_KEY") && !shown.contains("sk-secret"),
            "{shown}"
        );
    }
}
