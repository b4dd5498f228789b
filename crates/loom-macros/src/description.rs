//! Doc comments → tool description.

use syn::{Attribute, Expr, ExprLit, Lit, Meta};

/// The raw text of the `#[doc = "..."]` attributes, one entry per attribute.
pub(crate) fn doc_strings(attrs: &[Attribute]) -> syn::Result<Vec<String>> {
    let mut docs = Vec::new();
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("doc")) {
        match &attr.meta {
            Meta::NameValue(nv) => match &nv.value {
                Expr::Lit(ExprLit {
                    lit: Lit::Str(text),
                    ..
                }) => docs.push(text.value()),
                other => {
                    return Err(syn::Error::new_spanned(
                        other,
                        "#[tool] reads the description from literal doc comments only",
                    ));
                }
            },
            // `#[doc(hidden)]`, `#[doc(alias = ...)]`: not text.
            Meta::List(_) | Meta::Path(_) => {}
        }
    }
    Ok(docs)
}

/// Collapses doc comments into one description.
///
/// The common indentation is removed; the lines of a paragraph are joined with a space; paragraphs
/// are separated by a blank line (`\n\n`). List items, headings and fenced code blocks keep their
/// own lines.
pub(crate) fn collapse(docs: &[String]) -> String {
    let lines = unindent(docs);
    let mut paragraphs: Vec<Vec<String>> = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut in_fence = false;
    // Whether the next line must start a new line rather than continue the last one.
    let mut break_next = true;

    for line in &lines {
        let trimmed = line.trim();
        let is_fence = trimmed.starts_with("```") || trimmed.starts_with("~~~");
        if in_fence || is_fence {
            current.push(line.trim_end().to_owned());
            if is_fence {
                in_fence = !in_fence;
            }
            break_next = true;
            continue;
        }
        if trimmed.is_empty() {
            if !current.is_empty() {
                paragraphs.push(std::mem::take(&mut current));
            }
            break_next = true;
            continue;
        }
        let is_heading = trimmed.starts_with('#')
            && trimmed
                .trim_start_matches('#')
                .chars()
                .next()
                .is_none_or(char::is_whitespace);
        if break_next || is_heading || is_list_item(trimmed) || current.is_empty() {
            current.push(trimmed.to_owned());
        } else if let Some(last) = current.last_mut() {
            last.push(' ');
            last.push_str(trimmed);
        }
        break_next = is_heading;
    }
    if !current.is_empty() {
        paragraphs.push(current);
    }
    paragraphs
        .iter()
        .map(|lines| lines.join("\n"))
        .collect::<Vec<_>>()
        .join("\n\n")
        .trim()
        .to_owned()
}

/// The doc lines with their common leading whitespace (and block-comment stars) removed.
fn unindent(docs: &[String]) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for doc in docs {
        let mut block: Vec<&str> = doc.lines().collect();
        if block.is_empty() {
            block.push("");
        }
        // `/** ... */` blocks written with a leading ` * ` on each line.
        let starred = block.len() > 1
            && block
                .iter()
                .filter(|line| !line.trim().is_empty())
                .all(|line| line.trim_start().starts_with('*'));
        for line in block {
            if starred {
                let rest = line.trim_start();
                lines.push(rest.strip_prefix('*').unwrap_or(rest).to_owned());
            } else {
                lines.push(line.to_owned());
            }
        }
    }
    let indent = lines
        .iter()
        .filter(|line| !line.trim().is_empty())
        .map(|line| leading_blanks(line))
        .min()
        .unwrap_or(0);
    lines
        .into_iter()
        .map(|line| {
            if line.trim().is_empty() {
                String::new()
            } else {
                // Only ASCII blanks are counted, so this is a char boundary.
                let strip = indent.min(leading_blanks(&line));
                line[strip..].to_owned()
            }
        })
        .collect()
}

/// Number of leading ASCII spaces and tabs.
fn leading_blanks(line: &str) -> usize {
    line.bytes()
        .take_while(|b| *b == b' ' || *b == b'\t')
        .count()
}

fn is_list_item(line: &str) -> bool {
    if ["- ", "* ", "+ "]
        .iter()
        .any(|marker| line.starts_with(marker))
    {
        return true;
    }
    let digits = line.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && (line[digits..].starts_with(". ") || line[digits..].starts_with(") "))
}

#[cfg(test)]
mod tests {
    use super::collapse;

    fn docs(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|line| (*line).to_owned()).collect()
    }

    #[test]
    fn one_line() {
        assert_eq!(
            collapse(&docs(&[" Calcule le prix TTC."])),
            "Calcule le prix TTC."
        );
    }

    #[test]
    fn paragraphs() {
        let text = collapse(&docs(&[
            " First line",
            " continues here.",
            "",
            " Second paragraph.",
            "",
        ]));
        assert_eq!(text, "First line continues here.\n\nSecond paragraph.");
    }

    #[test]
    fn lists_and_code_keep_their_lines() {
        let text = collapse(&docs(&[
            " Modes:",
            " - fast",
            " - slow,",
            "   really",
            "",
            " ```",
            " let x = 1;",
            "     indented();",
            " ```",
        ]));
        assert_eq!(
            text,
            "Modes:\n- fast\n- slow, really\n\n```\nlet x = 1;\n    indented();\n```"
        );
    }

    #[test]
    fn block_comments() {
        let text = collapse(&docs(&["\n * Block\n * comment.\n *\n * Next.\n "]));
        assert_eq!(text, "Block comment.\n\nNext.");
    }
}
