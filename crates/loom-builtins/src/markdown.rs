//! HTML to readable markdown for `fetch_page`, with `htmd` (html5ever underneath).
//!
//! `htmd` walks the tree recursively; a page nested deeper than [`MAX_DEPTH`] (estimated by a
//! tag scan) is turned into plain text instead, so a hostile page cannot exhaust the stack.

/// Nesting depth above which the page is flattened to plain text instead.
const MAX_DEPTH: usize = 256;

/// Elements whose content is not readable text.
const SKIPPED: &[&str] = &[
    "head", "script", "style", "noscript", "template", "svg", "iframe", "object", "canvas",
];

/// The page's `<title>`, whitespace collapsed, when it has one.
pub(crate) fn title(html: &str) -> Option<String> {
    let lower = html.to_ascii_lowercase();
    let open = lower.find("<title")?;
    let start = open + lower[open..].find('>')? + 1;
    let end = start + lower[start..].find("</title")?;
    let text = collapse_whitespace(&decode_entities(html.get(start..end)?));
    let text: String = text.chars().take(300).collect();
    (!text.is_empty()).then_some(text)
}

/// The page as markdown (headings, links, lists, code, emphasis).
pub(crate) fn to_markdown(html: &str) -> String {
    if max_depth(html) > MAX_DEPTH {
        tracing::debug!("page nested too deeply for markdown; flattened to text");
        return plain_text(html);
    }
    let converter = htmd::HtmlToMarkdown::builder()
        .options(htmd::options::Options {
            bullet_list_marker: htmd::options::BulletListMarker::Dash,
            ul_bullet_spacing: 1,
            ol_number_spacing: 1,
            ..htmd::options::Options::default()
        })
        .skip_tags(SKIPPED.to_vec())
        .build();
    match converter.convert(html) {
        Ok(markdown) => markdown.trim().to_owned(),
        Err(error) => {
            tracing::debug!(%error, "markdown conversion failed; flattened to text");
            plain_text(html)
        }
    }
}

/// An upper estimate of the element nesting depth: opening tags count up, closing tags down,
/// void and self-closing elements do not count.
fn max_depth(html: &str) -> usize {
    const VOID: &[&str] = &[
        "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr", "!doctype", "!--",
    ];
    let bytes = html.as_bytes();
    let (mut depth, mut max) = (0usize, 0usize);
    let mut index = 0;
    while let Some(offset) = bytes[index..].iter().position(|b| *b == b'<') {
        let start = index + offset + 1;
        let end = bytes[start..]
            .iter()
            .position(|b| *b == b'>')
            .map_or(bytes.len(), |end| start + end);
        let tag = &html[start..end];
        index = (end + 1).min(bytes.len());
        if let Some(closing) = tag.strip_prefix('/') {
            if !closing.is_empty() {
                depth = depth.saturating_sub(1);
            }
            continue;
        }
        let name: String = tag
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '/')
            .collect::<String>()
            .to_ascii_lowercase();
        let is_tag = name.starts_with(|c: char| c.is_ascii_alphabetic());
        if is_tag && !tag.ends_with('/') && !VOID.contains(&name.as_str()) {
            depth += 1;
            max = max.max(depth);
        }
    }
    max
}

/// The text of the page: tags dropped, entities decoded, whitespace collapsed.
fn plain_text(html: &str) -> String {
    let mut text = String::with_capacity(html.len() / 2);
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => in_tag = true,
            '>' if in_tag => {
                in_tag = false;
                text.push(' ');
            }
            _ if !in_tag => text.push(c),
            _ => {}
        }
    }
    collapse_whitespace(&decode_entities(&text))
}

fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Decodes the few entities that matter in titles and flattened text.
fn decode_entities(text: &str) -> String {
    text.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&apos;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headings_links_and_lists() {
        let html = "<html><head><title>The &amp; Page</title><style>p{}</style></head><body>\
                    <h1>Hello</h1><p>See <a href=\"https://example.org/x\">this</a>.</p>\
                    <ul><li>one</li><li>two</li></ul><script>alert(1)</script></body></html>";
        assert_eq!(title(html).as_deref(), Some("The & Page"));
        let markdown = to_markdown(html);
        assert!(markdown.starts_with("# Hello"), "{markdown}");
        assert!(
            markdown.contains("[this](https://example.org/x)"),
            "{markdown}"
        );
        assert!(markdown.contains("- one\n- two"), "{markdown}");
        assert!(!markdown.contains("alert") && !markdown.contains("p{}"));
        assert!(!markdown.contains("The & Page"), "{markdown}");
    }

    #[test]
    fn deep_nesting_is_flattened_not_recursed() {
        let depth = 100_000;
        let html = format!("{}deep{}", "<div>".repeat(depth), "</div>".repeat(depth));
        assert_eq!(max_depth(&html), depth);
        assert_eq!(to_markdown(&html), "deep");
        // Just under the limit still converts, within a test thread's stack.
        let html = format!(
            "{}<b>ok</b>{}",
            "<div>".repeat(MAX_DEPTH - 2),
            "</div>".repeat(MAX_DEPTH - 2)
        );
        assert_eq!(to_markdown(&html), "**ok**");
    }

    #[test]
    fn void_and_closing_tags_do_not_deepen() {
        assert_eq!(max_depth("<p>a<br><img src=x/><br/></p><p>b</p>"), 1);
    }
}
