//! Case-sensitive shell-style matching of one path component, as Python's
//! `fnmatch.fnmatchcase`: `*` (any run of characters), `?` (one character), `[seq]`, `[!seq]`
//! (ranges `a-z`; a `]` right after the opening is literal; a `[` with no closing `]` is
//! literal). Matching is iterative (one backtrack point), linear in practice on hostile input.

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Literal(char),
    Any,
    Star,
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
}

fn parse(pattern: &str) -> Vec<Token> {
    let chars: Vec<char> = pattern.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => {
                if tokens.last() != Some(&Token::Star) {
                    tokens.push(Token::Star);
                }
                i += 1;
            }
            '?' => {
                tokens.push(Token::Any);
                i += 1;
            }
            '[' => match parse_class(&chars, i + 1) {
                Some((token, next)) => {
                    tokens.push(token);
                    i = next;
                }
                None => {
                    tokens.push(Token::Literal('['));
                    i += 1;
                }
            },
            c => {
                tokens.push(Token::Literal(c));
                i += 1;
            }
        }
    }
    tokens
}

/// Parses a class whose content starts at `start` (just after `[`); `None` when it has no
/// closing `]`. Returns the token and the index just after the `]`.
fn parse_class(chars: &[char], start: usize) -> Option<(Token, usize)> {
    let mut j = start;
    let negated = chars.get(j) == Some(&'!');
    if negated {
        j += 1;
    }
    // A `]` first in the set is a literal member.
    if chars.get(j) == Some(&']') {
        j += 1;
    }
    let end = j + chars.get(j..)?.iter().position(|c| *c == ']')?;
    let body = &chars[start + usize::from(negated)..end];
    let mut ranges = Vec::new();
    let mut k = 0;
    while k < body.len() {
        if k + 2 < body.len() && body[k + 1] == '-' {
            // A reversed range (`z-a`) matches nothing, as in Python.
            if body[k] <= body[k + 2] {
                ranges.push((body[k], body[k + 2]));
            }
            k += 3;
        } else {
            ranges.push((body[k], body[k]));
            k += 1;
        }
    }
    Some((Token::Class { negated, ranges }, end + 1))
}

fn matches_one(token: &Token, c: char) -> bool {
    match token {
        Token::Literal(l) => *l == c,
        Token::Any => true,
        Token::Star => false,
        Token::Class { negated, ranges } => {
            ranges.iter().any(|(low, high)| (*low..=*high).contains(&c)) != *negated
        }
    }
}

/// Whether `name` matches the shell-style `pattern`, case-sensitively (Python's
/// `fnmatch.fnmatchcase`).
///
/// ```
/// use loom_notes_sources::fnmatch_case;
/// assert!(fnmatch_case(".env.local", ".env.*"));
/// assert!(fnmatch_case("id_rsa.md", "id_rsa*"));
/// assert!(!fnmatch_case("KEY.PEM", "*.pem"));
/// ```
pub fn fnmatch_case(name: &str, pattern: &str) -> bool {
    let tokens = parse(pattern);
    let text: Vec<char> = name.chars().collect();
    let (mut t, mut p) = (0, 0);
    // The last `*` seen and the text position it is currently matched up to.
    let mut backtrack: Option<(usize, usize)> = None;
    while t < text.len() {
        match tokens.get(p) {
            Some(Token::Star) => {
                backtrack = Some((p, t));
                p += 1;
            }
            Some(token) if matches_one(token, text[t]) => {
                p += 1;
                t += 1;
            }
            _ => match backtrack {
                Some((star, from)) => {
                    p = star + 1;
                    t = from + 1;
                    backtrack = Some((star, from + 1));
                }
                None => return false,
            },
        }
    }
    tokens[p..].iter().all(|token| *token == Token::Star)
}

#[cfg(test)]
mod tests {
    use super::fnmatch_case;

    #[test]
    fn stars_and_question_marks() {
        assert!(fnmatch_case(".env", ".env"));
        assert!(!fnmatch_case(".env", ".env.*"));
        assert!(fnmatch_case(".env.", ".env.*"));
        assert!(fnmatch_case("key.pem", "*.pem"));
        assert!(fnmatch_case(".pem", "*.pem"));
        assert!(!fnmatch_case("key.pem.md", "*.pem"));
        assert!(fnmatch_case("id_ed25519.pub", "id_ed25519*"));
        assert!(fnmatch_case("abc", "a?c"));
        assert!(!fnmatch_case("ac", "a?c"));
        assert!(fnmatch_case("aXbXc", "a*b*c"));
        assert!(fnmatch_case("abbbc", "a**c"));
        assert!(!fnmatch_case("abcd", "a*c"));
        assert!(fnmatch_case("", "*"));
        assert!(!fnmatch_case("", "?"));
        assert!(fnmatch_case("été.md", "?t?.md"));
    }

    #[test]
    fn case_sensitive() {
        assert!(!fnmatch_case(".ENV", ".env"));
        assert!(!fnmatch_case("Node_Modules", "node_modules"));
        assert!(!fnmatch_case("x.PEM", "*.pem"));
    }

    #[test]
    fn classes() {
        assert!(fnmatch_case("a1", "a[0-9]"));
        assert!(!fnmatch_case("ax", "a[0-9]"));
        assert!(fnmatch_case("ax", "a[!0-9]"));
        assert!(!fnmatch_case("a5", "a[!0-9]"));
        assert!(fnmatch_case("a]", "a[]]"));
        assert!(fnmatch_case("a-", "a[a-]"));
        assert!(fnmatch_case("b", "[abc]"));
        assert!(!fnmatch_case("b", "[z-a]"));
        assert!(fnmatch_case("^", "[^]"));
        // No closing bracket: the `[` is literal.
        assert!(fnmatch_case("[ab", "[ab"));
        assert!(!fnmatch_case("a", "[ab"));
    }

    #[test]
    fn many_stars_on_a_long_name_stay_fast() {
        let name = "a".repeat(5_000);
        let pattern = format!("{}b", "*a".repeat(50));
        let start = std::time::Instant::now();
        assert!(!fnmatch_case(&name, &pattern));
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }
}
