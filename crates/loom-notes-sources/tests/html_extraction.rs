//! `extract_from_html`: the verbatim test page of reference A.10, the upstream inline cases,
//! the title fallbacks, the noise removal and the main-content choice.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_notes_sources::{MAX_HTML_DEPTH, SourceError, extract_from_html};

/// The test page of A.10: og:title "OG Titre", a heading, a paragraph with bold text glued to
/// the next word and a link, a list, a code block and a table, plus navigation, footer,
/// script and other noise.
const TEST_PAGE: &str = r#"<!DOCTYPE html>
<html lang="fr">
<head>
  <meta charset="utf-8">
  <meta property="og:title" content="OG Titre">
  <title>Titre de la page</title>
  <style>body { color: red; }</style>
  <script>console.log("tracking");</script>
</head>
<body>
  <header role="banner"><nav><a href="/">Accueil</a> <a href="/blog">Blog</a></nav></header>
  <nav class="menu"><ul><li>Menu un</li><li>Menu deux</li></ul></nav>
  <div aria-hidden="true">Caché aux lecteurs</div>
  <div role="navigation">Fil d'Ariane</div>
  <h1>Bonjour</h1>
  <p>Un <strong>texte</strong>Important et un <a href="https://example.org/lien">lien</a>.</p>
  <h2>Liste</h2>
  <ul>
    <li>un</li>
    <li>deux</li>
  </ul>
  <pre><code class="language-bash">cargo build</code></pre>
  <table>
    <thead><tr><th>a</th><th>b</th></tr></thead>
    <tbody><tr><td>1</td><td>2</td></tr></tbody>
  </table>
  <form action="/subscribe"><input name="email"><button>S'abonner</button></form>
  <iframe src="https://ads.example/"></iframe>
  <svg><text>logo</text></svg>
  <noscript>Activez JavaScript</noscript>
  <template><p>modèle</p></template>
  <script>window.analytics = 1;</script>
  <footer>© 2026 Pied de page</footer>
</body>
</html>"#;

const EXPECTED: &str = "# Bonjour\n\nUn **texte** Important et un lien.\n\n## Liste\n\n- un\n- deux\n\n```\ncargo build\n```\n\n| a | b |\n| --- | --- |\n| 1 | 2 |";

#[test]
fn the_reference_test_page_gives_the_verbatim_markdown() {
    let page = extract_from_html(TEST_PAGE, "https://example.org/final").unwrap();
    assert_eq!(page.title, "OG Titre");
    assert_eq!(page.text, EXPECTED);
}

fn text_of(fragment: &str) -> String {
    extract_from_html(
        &format!("<html><body><p>{fragment}</p></body></html>"),
        "https://example.org/",
    )
    .unwrap()
    .text
}

#[test]
fn the_upstream_inline_spacing_cases() {
    assert_eq!(
        text_of("<span>Ce qui arrive</span>L'agent plante."),
        "Ce qui arrive L'agent plante."
    );
    assert_eq!(
        text_of("<span>Ce que je fais</span><strong>Il reprend.</strong>État persisté."),
        "Ce que je fais **Il reprend.** État persisté."
    );
    assert_eq!(
        text_of("Des <code>tokens</code>s et du <em>texte</em>, normal."),
        "Des `tokens`s et du *texte*, normal."
    );
}

#[test]
fn inline_spacing_leaves_lowercase_after_a_word_and_spaced_text_alone() {
    assert_eq!(text_of("<b>mot</b>suite"), "**mot**suite");
    assert_eq!(text_of("<b>Fin.</b>suite"), "**Fin.** suite");
    assert_eq!(text_of("<b>mot </b>Suite"), "**mot** Suite");
    assert_eq!(text_of("<i>a</i><b>-x</b>"), "*a***-x**");
}

#[test]
fn title_falls_back_to_head_title_then_h1_then_the_url() {
    let title = |html: &str| {
        extract_from_html(html, "https://example.org/final")
            .unwrap()
            .title
    };
    assert_eq!(
        title(
            "<html><head><title>  Le   titre </title><meta property=\"og:title\" content=\" \"></head><body><h1>H</h1></body></html>"
        ),
        "Le titre"
    );
    assert_eq!(
        title(
            "<html><body><h1>  Premier <em>titre</em>\n  ici </h1><h1>Second</h1><p>x</p></body></html>"
        ),
        "Premier titre ici"
    );
    assert_eq!(
        title("<html><body><p>sans titre</p></body></html>"),
        "https://example.org/final"
    );
}

#[test]
fn main_then_article_then_body_is_the_content() {
    let text = |html: &str| extract_from_html(html, "u").unwrap().text;
    assert_eq!(
        text(
            "<body><p>hors</p><article>article</article><main><p>principal</p></main><main>deux</main></body>"
        ),
        "principal"
    );
    assert_eq!(
        text("<body><p>hors</p><article><p>article</p></article></body>"),
        "article"
    );
    assert_eq!(text("<body><p>corps</p></body>"), "corps");
}

#[test]
fn a_banner_without_navigation_is_kept() {
    let html = "<body><div role=\"banner\"><p>Annonce</p></div><p>texte</p></body>";
    assert_eq!(
        extract_from_html(html, "u").unwrap().text,
        "Annonce\n\ntexte"
    );
}

#[test]
fn images_and_links_become_their_text() {
    let html = "<body><p>Voir <a href=\"https://x.example/\">la <b>doc</b></a> <img src=\"i.png\" alt=\"image\">ici.</p></body>";
    assert_eq!(
        extract_from_html(html, "u").unwrap().text,
        "Voir la **doc** ici."
    );
}

#[test]
fn a_page_of_noise_only_has_no_content() {
    let html = "<html><body><nav>menu</nav><script>x()</script><footer>pied</footer></body></html>";
    match extract_from_html(html, "https://example.org/vide") {
        Err(SourceError::NoContent { url }) => assert_eq!(url, "https://example.org/vide"),
        other => panic!("expected NoContent, got {other:?}"),
    }
    let error = extract_from_html("  \n ", "https://example.org/rien").unwrap_err();
    assert!(
        matches!(error, SourceError::HtmlUnreadable { .. }),
        "{error:?}"
    );
}

#[test]
fn a_page_nested_too_deep_is_refused_before_parsing() {
    // The HTML parser is quadratic in the nesting: parsing this page would take minutes.
    let depth = 100_000;
    let html = format!("{}deep{}", "<div>".repeat(depth), "</div>".repeat(depth));
    let start = std::time::Instant::now();
    let error = extract_from_html(&html, "u").unwrap_err();
    assert!(
        matches!(error, SourceError::HtmlUnreadable { .. }),
        "{error:?}"
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    // Just under the limit still converts.
    let html = format!(
        "{}<b>ok</b>{}",
        "<div>".repeat(MAX_HTML_DEPTH - 4),
        "</div>".repeat(MAX_HTML_DEPTH - 4)
    );
    assert_eq!(extract_from_html(&html, "u").unwrap().text, "**ok**");
    // Nested lists: the uncounted `li` doubles the real depth (about 1 000 levels), which the
    // recursive converter handles on its own large stack.
    let levels = MAX_HTML_DEPTH - 10;
    let html = format!(
        "<body>{}leaf{}</body>",
        "<ul><li>".repeat(levels),
        "</li></ul>".repeat(levels)
    );
    let start = std::time::Instant::now();
    let text = extract_from_html(&html, "u").unwrap().text;
    assert!(text.starts_with("- - - "), "{}", &text[..20]);
    assert!(text.ends_with("leaf"));
    assert!(
        start.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn long_sloppy_pages_are_not_mistaken_for_deep_ones() {
    // Unclosed list items and paragraphs, and many inline icons: shallow once parsed.
    let items = "<li>item".repeat(2_000);
    let paragraphs = "<p>para".repeat(2_000);
    let icons = "<svg><path d='M0'/><circle r='1'/></svg> x ".repeat(500);
    let html = format!("<body><ul>{items}</ul>{paragraphs}<div>{icons}</div></body>");
    let page = extract_from_html(&html, "u").unwrap();
    assert!(
        page.text.starts_with("- item\n- item"),
        "{}",
        &page.text[..40]
    );
    assert!(page.text.contains("para\n\npara"));
}

#[test]
fn tables_without_a_header_row_get_an_empty_one() {
    let html = "<body><table><tr><td>1</td><td colspan=\"2\">2\nbis</td></tr><tr><td>3</td><td>4</td><td>5</td></tr></table></body>";
    assert_eq!(
        extract_from_html(html, "u").unwrap().text,
        "|  |  |  |\n| --- | --- | --- |\n| 1 | 2 bis | |\n| 3 | 4 | 5 |"
    );
}
