//! A fetched page's HTML to a title and markdown text (reference A.10 item 4).
//!
//! The page is parsed by html5ever (through `htmd`) into a DOM, which is edited before the
//! markdown conversion:
//!
//! 1. title: the first non-empty of `meta[property=og:title]@content`, `head > title`, the
//!    first `h1`'s text (whitespace collapsed), else the final URL;
//! 2. noise removed: `nav, footer, script, style, noscript, iframe, svg, form, template`,
//!    `[aria-hidden=true]`, `[role=navigation]`, and `[role=banner]` that contains a `nav`;
//! 3. inline spacing: a space is inserted after an inline element (`span strong b em i code
//!    a small abbr time`) whose text ends with a non-space character and that is glued to
//!    following text starting with an uppercase letter (after a word character) or with a
//!    letter (after `.!?:;`), or glued to a following inline element whose text starts with
//!    a letter or a digit;
//! 4. the first `<main>`, else the first `<article>`, else `<body>` is converted: ATX
//!    headings, `-` bullets, links and images reduced to their text, fenced code blocks
//!    without a language, tables as markdownify writes them (`| a | b |`, then
//!    `| --- | --- |`; a table without a header row gets an empty one);
//! 5. tidy: spaces and tabs before a newline dropped, 3 or more newlines made 2, trimmed.
//!
//! Deep nesting is refused as unreadable ([`SourceError::HtmlUnreadable`]) twice: before
//! parsing, by a scan of the tags that estimates the nesting (the HTML parser is quadratic in
//! the depth of open elements: a page of 100 000 nested `<div>` would take many minutes), and
//! after parsing, on the tree's real depth (the markdown converter recurses). The work runs
//! on its own thread with a large stack. All walks over the DOM here are iterative.

use std::{
    cell::RefCell,
    rc::{Rc, Weak},
    sync::LazyLock,
};

use htmd::{Element, HtmlToMarkdown, Node, element_handler::Handlers};
use markup5ever_rcdom::NodeData;
use regex::Regex;

use crate::SourceError;

/// The deepest element nesting a page may have to be converted: the limit of the estimate
/// made before parsing (elements whose end tag is optional, such as `p`, `li` or `td`, are not
/// counted) and, doubled, of the parsed tree's real depth.
pub const MAX_HTML_DEPTH: usize = 512;

/// The stack of the thread that parses and converts a page.
const CONVERSION_STACK_BYTES: usize = 64 * 1024 * 1024;

/// Elements with no end tag.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
    "wbr", "param", "keygen", "frame", "basefont", "bgsound",
];

/// Elements whose end tag may be left out (the parser closes them): not counted by the
/// estimate, so sloppy but ordinary pages are not refused.
const OPTIONAL_END: &[&str] = &[
    "p", "li", "dt", "dd", "tr", "td", "th", "option", "optgroup", "thead", "tbody", "tfoot",
    "colgroup", "caption", "rb", "rt", "rp", "rtc", "html", "head", "body",
];

/// Elements whose content is raw text, skipped by the estimate.
const RAW_TEXT: &[&str] = &[
    "script",
    "style",
    "textarea",
    "title",
    "xmp",
    "iframe",
    "noembed",
    "noframes",
    "noscript",
    "plaintext",
];

const NOISE: &[&str] = &[
    "nav", "footer", "script", "style", "noscript", "iframe", "svg", "form", "template",
];

const INLINE: &[&str] = &[
    "span", "strong", "b", "em", "i", "code", "a", "small", "abbr", "time",
];

static TRAILING_SPACES: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"[ \t]+\n").ok());
static BLANK_RUNS: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"\n{3,}").ok());

/// A page's title and its main content as markdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractedPage {
    /// The page title: `og:title`, else `head > title`, else the first `h1`, else the final URL.
    pub title: String,
    /// The main content as markdown, tidied.
    pub text: String,
}

/// Extracts the title and the main content of `html`, fetched from `final_url` (the URL after
/// redirects: the title when the page has none, and named in errors).
///
/// 1. title: the first non-empty of `meta[property=og:title]@content`, `head > title`, the
///    first `h1`'s text (whitespace collapsed), else `final_url`;
/// 2. noise removed: `nav, footer, script, style, noscript, iframe, svg, form, template`,
///    `[aria-hidden=true]`, `[role=navigation]`, and `[role=banner]` containing a `nav`;
/// 3. a space inserted after an inline element (`span strong b em i code a small abbr time`)
///    glued to following text that starts with an uppercase letter (after a word character)
///    or a letter (after `.!?:;`), or to a following inline element starting with a letter or
///    a digit;
/// 4. the first `<main>`, else `<article>`, else `<body>` converted to markdown: ATX
///    headings, `-` bullets, links and images as their text, fenced code without language,
///    tables as markdownify writes them;
/// 5. tidied: no spaces or tabs before a newline, at most one blank line in a row, trimmed.
///
/// A page nested deeper than [`MAX_HTML_DEPTH`] is refused before it is parsed.
///
/// # Errors
/// [`SourceError::HtmlUnreadable`] when the document is empty or nested deeper than
/// [`MAX_HTML_DEPTH`]; [`SourceError::NoContent`] when nothing readable is left.
pub fn extract_from_html(html: &str, final_url: &str) -> Result<ExtractedPage, SourceError> {
    let unreadable = |reason: String| SourceError::HtmlUnreadable {
        url: final_url.to_owned(),
        reason,
    };
    if html.trim().is_empty() {
        return Err(unreadable("the document is empty".to_owned()));
    }
    let estimate = estimated_depth(html);
    if estimate > MAX_HTML_DEPTH {
        return Err(unreadable(format!(
            "elements nested about {estimate} deep, more than {MAX_HTML_DEPTH}"
        )));
    }
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("loom-notes-html".to_owned())
            .stack_size(CONVERSION_STACK_BYTES)
            .spawn_scoped(scope, || convert(html, final_url))
            .map_err(|error| unreadable(format!("no thread for the conversion: {error}")))?
            .join()
            .map_err(|_| unreadable("the conversion panicked".to_owned()))?
    })
}

fn convert(html: &str, final_url: &str) -> Result<ExtractedPage, SourceError> {
    let unreadable = |reason: String| SourceError::HtmlUnreadable {
        url: final_url.to_owned(),
        reason,
    };
    let converter = converter();
    let document = converter
        .html_to_tree(html)
        .map_err(|error| unreadable(error.to_string()))?;
    let depth = max_depth(&document);
    if depth > 2 * MAX_HTML_DEPTH {
        return Err(unreadable(format!(
            "elements nested {depth} deep, more than {MAX_HTML_DEPTH}"
        )));
    }
    let title = title(&document).unwrap_or_else(|| final_url.to_owned());
    remove_noise(&document);
    space_inline_elements(&document);
    strip_code_languages(&document);
    let root = ["main", "article", "body"]
        .iter()
        .find_map(|tag| first_element(&document, |node| is_tag(node, tag)))
        .unwrap_or_else(|| document.clone());
    let text = tidy(&converter.tree_to_markdown(&root));
    if text.is_empty() {
        return Err(SourceError::NoContent {
            url: final_url.to_owned(),
        });
    }
    Ok(ExtractedPage { title, text })
}

fn converter() -> HtmlToMarkdown {
    HtmlToMarkdown::builder()
        .options(htmd::options::Options {
            heading_style: htmd::options::HeadingStyle::Atx,
            bullet_list_marker: htmd::options::BulletListMarker::Dash,
            ul_bullet_spacing: 1,
            ol_number_spacing: 1,
            code_block_style: htmd::options::CodeBlockStyle::Fenced,
            ..htmd::options::Options::default()
        })
        // Links and images become their text (markdownify's `strip=["a", "img"]`).
        .add_handler(vec!["a"], |handlers: &dyn Handlers, element: Element| {
            Some(handlers.walk_children(element.node))
        })
        .add_handler(vec!["table"], table_handler)
        .skip_tags(vec!["img", "head"])
        .build()
}

/// A table as markdownify writes it: `| a | b |` rows, the `| --- |` line after the header
/// row, an empty header row when the first row is not one; cells on one line, `colspan`
/// adding empty cells.
fn table_handler(
    handlers: &dyn Handlers,
    element: Element,
) -> Option<htmd::element_handler::HandlerResult> {
    let table = element.node;
    let mut rows: Vec<(Rc<Node>, bool)> = Vec::new();
    for child in table.children.borrow().iter() {
        match tag_name(child) {
            Some("tr") => rows.push((child.clone(), false)),
            Some(section @ ("thead" | "tbody" | "tfoot")) => {
                for row in child.children.borrow().iter() {
                    if is_tag(row, "tr") {
                        rows.push((row.clone(), section == "thead"));
                    }
                }
            }
            _ => {}
        }
    }
    let mut lines = Vec::new();
    for (index, (row, in_head)) in rows.iter().enumerate() {
        let cells: Vec<Rc<Node>> = row
            .children
            .borrow()
            .iter()
            .filter(|cell| matches!(tag_name(cell), Some("td" | "th")))
            .cloned()
            .collect();
        let mut line = String::from("|");
        let mut width = 0usize;
        for cell in &cells {
            let text = handlers.walk_children(cell).content;
            let text = text.trim().replace('\n', " ");
            let span = attribute(cell, "colspan")
                .and_then(|span| span.trim().parse::<usize>().ok())
                .unwrap_or(1)
                .clamp(1, 1000);
            line.push(' ');
            line.push_str(&text);
            line.push_str(&" |".repeat(span));
            width += span;
        }
        let head = *in_head || (!cells.is_empty() && cells.iter().all(|cell| is_tag(cell, "th")));
        let underline = format!("|{}", " --- |".repeat(width));
        if head {
            lines.push(line);
            lines.push(underline);
        } else {
            if index == 0 {
                lines.push(format!("| {} |", vec![""; width].join(" | ")));
                lines.push(underline);
            }
            lines.push(line);
        }
    }
    Some(format!("\n\n{}\n\n", lines.join("\n")).into())
}

/// An upper estimate of the element nesting, from the tags alone: opening tags count up and
/// closing tags down, except void elements, elements whose end tag is optional, comments,
/// raw-text content and self-closed tags inside `svg`/`math`.
fn estimated_depth(html: &str) -> usize {
    let lower = html.to_ascii_lowercase();
    let bytes = lower.as_bytes();
    let (mut depth, mut max, mut foreign) = (0usize, 0usize, 0usize);
    let mut index = 0;
    while let Some(offset) = bytes[index..].iter().position(|b| *b == b'<') {
        let start = index + offset + 1;
        let rest = &lower[start..];
        if rest.starts_with("!--") {
            index = rest.find("-->").map_or(bytes.len(), |end| start + end + 3);
            continue;
        }
        let end = rest.find('>').map_or(bytes.len(), |end| start + end);
        let tag = &lower[start..end];
        index = (end + 1).min(bytes.len());
        let (closing, tag) = match tag.strip_prefix('/') {
            Some(tag) => (true, tag),
            None => (false, tag),
        };
        let name: &str = tag
            .split(|c: char| c.is_ascii_whitespace() || c == '/')
            .next()
            .unwrap_or_default();
        if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        let counted = !VOID.contains(&name) && !OPTIONAL_END.contains(&name);
        if closing {
            if counted {
                depth = depth.saturating_sub(1);
            }
            if matches!(name, "svg" | "math") {
                foreign = foreign.saturating_sub(1);
            }
            continue;
        }
        if RAW_TEXT.contains(&name) && !tag.ends_with('/') {
            let close = format!("</{name}");
            index = lower[index..]
                .find(&close)
                .map_or(bytes.len(), |found| index + found);
            continue;
        }
        if tag.ends_with('/') && (foreign > 0 || matches!(name, "svg" | "math")) {
            continue;
        }
        if matches!(name, "svg" | "math") {
            foreign += 1;
        }
        if counted {
            depth += 1;
            max = max.max(depth);
        }
    }
    max
}

/// Tidies converted markdown: no spaces or tabs before a newline, at most one blank line in a
/// row, no surrounding whitespace.
fn tidy(markdown: &str) -> String {
    let mut text = markdown.to_owned();
    if let Some(regex) = TRAILING_SPACES.as_ref() {
        text = regex.replace_all(&text, "\n").into_owned();
    }
    if let Some(regex) = BLANK_RUNS.as_ref() {
        text = regex.replace_all(&text, "\n\n").into_owned();
    }
    text.trim().to_owned()
}

fn tag_name(node: &Node) -> Option<&str> {
    match &node.data {
        NodeData::Element { name, .. } => Some(name.local.as_ref()),
        _ => None,
    }
}

fn is_tag(node: &Node, tag: &str) -> bool {
    tag_name(node) == Some(tag)
}

fn attribute(node: &Node, attribute: &str) -> Option<String> {
    match &node.data {
        NodeData::Element { attrs, .. } => attrs
            .borrow()
            .iter()
            .find(|attr| attr.name.local.as_ref() == attribute)
            .map(|attr| attr.value.to_string()),
        _ => None,
    }
}

/// Every node under `root` (itself included), in document order, with its depth.
fn descendants(root: &Rc<Node>) -> Vec<(Rc<Node>, usize)> {
    let mut out = Vec::new();
    let mut stack = vec![(root.clone(), 0)];
    while let Some((node, depth)) = stack.pop() {
        for child in node.children.borrow().iter().rev() {
            stack.push((child.clone(), depth + 1));
        }
        out.push((node, depth));
    }
    out
}

fn max_depth(root: &Rc<Node>) -> usize {
    descendants(root)
        .iter()
        .map(|(_, depth)| *depth)
        .max()
        .unwrap_or_default()
}

fn first_element(root: &Rc<Node>, test: impl Fn(&Node) -> bool) -> Option<Rc<Node>> {
    descendants(root)
        .into_iter()
        .map(|(node, _)| node)
        .find(|node| test(node))
}

/// The concatenated text of `node` and its descendants.
fn text_content(node: &Rc<Node>) -> String {
    let mut text = String::new();
    for (node, _) in descendants(node) {
        if let NodeData::Text { contents } = &node.data {
            text.push_str(&contents.borrow());
        }
    }
    text
}

fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn non_empty(text: String) -> Option<String> {
    (!text.is_empty()).then_some(text)
}

fn title(document: &Rc<Node>) -> Option<String> {
    let og = first_element(document, |node| {
        is_tag(node, "meta") && attribute(node, "property").as_deref() == Some("og:title")
    })
    .and_then(|meta| attribute(&meta, "content"))
    .map(|content| collapse_whitespace(&content))
    .and_then(non_empty);
    og.or_else(|| {
        let head = first_element(document, |node| is_tag(node, "head"))?;
        let title = head
            .children
            .borrow()
            .iter()
            .find(|child| is_tag(child, "title"))
            .cloned()?;
        non_empty(collapse_whitespace(&text_content(&title)))
    })
    .or_else(|| {
        let h1 = first_element(document, |node| is_tag(node, "h1"))?;
        non_empty(collapse_whitespace(&text_content(&h1)))
    })
}

fn is_noise(node: &Rc<Node>) -> bool {
    let Some(tag) = tag_name(node) else {
        return false;
    };
    if NOISE.contains(&tag) {
        return true;
    }
    if attribute(node, "aria-hidden").as_deref() == Some("true") {
        return true;
    }
    match attribute(node, "role").as_deref() {
        Some("navigation") => true,
        Some("banner") => first_element(node, |inner| is_tag(inner, "nav")).is_some(),
        _ => false,
    }
}

fn detach(node: &Rc<Node>) {
    let parent = node.parent.take().and_then(|parent| parent.upgrade());
    if let Some(parent) = parent {
        parent
            .children
            .borrow_mut()
            .retain(|child| !Rc::ptr_eq(child, node));
    }
}

fn remove_noise(document: &Rc<Node>) {
    // Collected first (a banner's `nav` is seen before the banner is removed), then detached;
    // detaching a node already inside a detached one is harmless.
    let noise: Vec<Rc<Node>> = descendants(document)
        .into_iter()
        .map(|(node, _)| node)
        .filter(is_noise)
        .collect();
    for node in &noise {
        detach(node);
    }
}

fn next_sibling(node: &Rc<Node>) -> Option<(Rc<Node>, Rc<Node>)> {
    let parent = node.parent.take();
    let upgraded = parent.as_ref().and_then(Weak::upgrade);
    node.parent.set(parent);
    let parent = upgraded?;
    let children = parent.children.borrow();
    let index = children.iter().position(|child| Rc::ptr_eq(child, node))?;
    let next = children.get(index + 1).cloned()?;
    drop(children);
    Some((parent, next))
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn space_inline_elements(document: &Rc<Node>) {
    let inline: Vec<Rc<Node>> = descendants(document)
        .into_iter()
        .map(|(node, _)| node)
        .filter(|node| tag_name(node).is_some_and(|tag| INLINE.contains(&tag)))
        .collect();
    for element in inline {
        let Some(last) = text_content(&element).chars().last() else {
            continue;
        };
        if last.is_whitespace() {
            continue;
        }
        let Some((parent, next)) = next_sibling(&element) else {
            continue;
        };
        match &next.data {
            NodeData::Text { contents } => {
                let first = contents.borrow().chars().next();
                let glued = first.is_some_and(|first| {
                    (first.is_uppercase() && is_word(last))
                        || (first.is_alphabetic() && ".!?:;".contains(last))
                });
                if glued {
                    let spaced = format!(" {}", &**contents.borrow());
                    *contents.borrow_mut() = spaced.as_str().into();
                }
            }
            NodeData::Element { name, .. } if INLINE.contains(&name.local.as_ref()) => {
                let starts_alphanumeric = text_content(&next)
                    .chars()
                    .next()
                    .is_some_and(char::is_alphanumeric);
                if starts_alphanumeric {
                    insert_space_before(&parent, &next);
                }
            }
            _ => {}
        }
    }
}

fn insert_space_before(parent: &Rc<Node>, next: &Rc<Node>) {
    let space = Node::new(NodeData::Text {
        contents: RefCell::new(" ".into()),
    });
    space.parent.set(Some(Rc::downgrade(parent)));
    let mut children = parent.children.borrow_mut();
    if let Some(index) = children.iter().position(|child| Rc::ptr_eq(child, next)) {
        children.insert(index, space);
    }
}

/// Code blocks come out without a language: the `class` that would name it is dropped.
fn strip_code_languages(document: &Rc<Node>) {
    for (node, _) in descendants(document) {
        if let NodeData::Element { name, attrs, .. } = &node.data
            && matches!(name.local.as_ref(), "pre" | "code")
        {
            attrs
                .borrow_mut()
                .retain(|attr| attr.name.local.as_ref() != "class");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(html: &str) -> String {
        extract_from_html(&format!("<html><body><p>{html}</p></body></html>"), "u")
            .unwrap()
            .text
    }

    #[test]
    fn inline_spacing_of_the_upstream_tests() {
        assert_eq!(
            body("<span>Ce qui arrive</span>L'agent plante."),
            "Ce qui arrive L'agent plante."
        );
        assert_eq!(
            body("<span>Ce que je fais</span><strong>Il reprend.</strong>État persisté."),
            "Ce que je fais **Il reprend.** État persisté."
        );
        assert_eq!(
            body("Des <code>tokens</code>s et du <em>texte</em>, normal."),
            "Des `tokens`s et du *texte*, normal."
        );
    }

    #[test]
    fn the_depth_estimate_skips_what_does_not_nest() {
        assert_eq!(
            estimated_depth("<div><div><p>a<br><img src=x></div></div>"),
            2
        );
        assert_eq!(estimated_depth("<ul><li>a<li>b<li>c</ul><ul><li>d</ul>"), 1);
        assert_eq!(estimated_depth("<!-- <div><div> --><div></div>"), 1);
        assert_eq!(estimated_depth("<script>'<div><div><div>'</script><p>x"), 0);
        assert_eq!(
            estimated_depth(&"<svg><path/><path d='x'/></svg>".repeat(100)),
            1
        );
        assert_eq!(estimated_depth("<svg/><div/><div/>"), 2);
        assert_eq!(estimated_depth(&"<div>".repeat(1000)), 1000);
        assert_eq!(estimated_depth("a < b and c<3"), 0);
    }

    #[test]
    fn tidy_trims_trailing_spaces_and_blank_runs() {
        assert_eq!(tidy("  a  \n\n\n\nb\t\nc  "), "a\n\nb\nc");
    }
}
