//! Golden vectors of reference A.6 (captured from the Python loom-notes 1.1.0) and the upstream
//! chunking tests.

use super::*;

fn chunks(title: &str, text: &str) -> Vec<Chunk> {
    chunk_document("d", title, text, &ChunkSizes::default())
}

fn shape(chunks: &[Chunk]) -> Vec<(String, usize)> {
    chunks
        .iter()
        .map(|c| (c.heading_path.clone(), char_len(&c.text)))
        .collect()
}

fn owned(items: &[(&str, usize)]) -> Vec<(String, usize)> {
    items.iter().map(|(p, n)| ((*p).to_owned(), *n)).collect()
}

#[test]
fn heading_levels_make_paths() {
    let text = format!(
        "# Guide\n\nintro {}\n\n## Install\n\n{}\n\n### Sub ###\n\n{}",
        "a".repeat(250),
        "b".repeat(250),
        "c".repeat(250)
    );
    let got = chunks("Guide", &text);
    assert_eq!(
        shape(&got),
        owned(&[
            ("Guide", 256),
            ("Guide > Install", 250),
            ("Guide > Install > Sub", 250)
        ])
    );
    assert_eq!(
        got.iter().map(|c| c.index).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
}

#[test]
fn an_h1_other_than_the_title_is_kept() {
    let got = chunks("Titre", &format!("# Autre\n\n{}", "x".repeat(300)));
    assert_eq!(shape(&got), owned(&[("Titre > Autre", 300)]));
}

#[test]
fn headings_in_fences_are_body() {
    let text = format!(
        "```\n# not a heading\n```\n{}\n## Real\n{}",
        "y".repeat(300),
        "z".repeat(300)
    );
    let got = chunks("T", &text);
    assert_eq!(shape(&got), owned(&[("T", 324), ("T > Real", 300)]));
    assert!(got[0].text.contains("# not a heading"));
}

#[test]
fn headings_only_give_no_chunk() {
    assert!(chunks("T", "# A\n## B").is_empty());
    assert!(chunks("Titre seul", "# Titre seul").is_empty());
    assert!(chunks("T", "").is_empty());
}

#[test]
fn tiny_piece_is_merged_into_the_previous() {
    let text = format!(
        "## A\n{}\n## B\nshort\n## C\n{}",
        "a".repeat(500),
        "c".repeat(500)
    );
    let got = chunks("T", &text);
    assert_eq!(shape(&got), owned(&[("T > A", 507), ("T > C", 500)]));
    assert!(got[0].text.ends_with("\n\nshort"));
    assert_eq!(got[1].index, 1);
}

#[test]
fn first_piece_is_never_merged() {
    let got = chunks("T", &format!("short\n## B\n{}", "b".repeat(500)));
    assert_eq!(shape(&got), owned(&[("T", 5), ("T > B", 500)]));
}

#[test]
fn paragraphs_are_packed_with_overlap() {
    let paragraphs: Vec<String> = ('a'..='f')
        .map(|letter| {
            let word = format!("{} ", letter.to_string().repeat(9));
            py_strip(&word.repeat(70)).to_owned()
        })
        .collect();
    assert!(paragraphs.iter().all(|p| char_len(p) == 699));
    let got = chunks("T", &paragraphs.join("\n\n"));
    let lens: Vec<usize> = got.iter().map(|c| char_len(&c.text)).collect();
    assert_eq!(lens, vec![1400, 1581, 1581]);
}

#[test]
fn long_paragraph_is_cut_at_sentences() {
    let sentence = format!("{}.", "w".repeat(49));
    let paragraph = vec![sentence; 60].join(" ");
    assert_eq!(char_len(&paragraph), 3059);
    let lens: Vec<usize> = chunks("T", &paragraph)
        .iter()
        .map(|c| char_len(&c.text))
        .collect();
    assert_eq!(lens, vec![1580, 1632]);
}

#[test]
fn unbroken_text_is_hard_cut_and_overlap_kept_whole() {
    let lens: Vec<usize> = chunks("T", &"q".repeat(5000))
        .iter()
        .map(|c| char_len(&c.text))
        .collect();
    assert_eq!(lens, vec![1620, 1802, 1802, 322]);
}

#[test]
fn a_new_heading_pops_deeper_or_equal_levels() {
    let text = format!(
        "## A\n{}\n### A1\n{}\n## B\n{}\n# Top\n{}",
        "a".repeat(300),
        "b".repeat(300),
        "c".repeat(300),
        "d".repeat(300)
    );
    let paths: Vec<String> = chunks("T", &text)
        .into_iter()
        .map(|c| c.heading_path)
        .collect();
    assert_eq!(paths, vec!["T > A", "T > A > A1", "T > B", "T > Top"]);
}

#[test]
fn heading_syntax_edges() {
    let text = format!(
        "#NoSpace\n####### seven\n{}\n#   Spaced   ##  \n{}",
        "a".repeat(250),
        "b".repeat(250)
    );
    let got = chunks("T", &text);
    assert_eq!(shape(&got)[1].0, "T > Spaced");
    assert!(got[0].text.starts_with("#NoSpace\n####### seven\n"));
}

const DOC: &str = "# Guide\n\nIntro courte.\n\n## Installation\n\nÉtape un. Étape deux.\n\n### Linux\n\nDétail linux.\n\n## Usage\n\nParagraphe d'usage.\n";

#[test]
fn upstream_sections_carry_heading_path() {
    let sizes = ChunkSizes {
        min: 1,
        ..ChunkSizes::default()
    };
    let got = chunk_document("d", "Guide", DOC, &sizes);
    let paths: Vec<&str> = got.iter().map(|c| c.heading_path.as_str()).collect();
    assert_eq!(
        paths,
        vec![
            "Guide",
            "Guide > Installation",
            "Guide > Installation > Linux",
            "Guide > Usage"
        ]
    );
    assert_eq!(
        got.iter().map(|c| c.index).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert!(embed_text(&got[2]).starts_with("Guide > Installation > Linux\n\n"));
}

#[test]
fn upstream_tiny_sections_are_merged() {
    let got = chunks("Guide", DOC);
    assert_eq!(got.len(), 1);
    assert!(got[0].text.contains("Détail linux."));
}

#[test]
fn upstream_long_section_is_split_with_overlap() {
    let sizes = ChunkSizes {
        target: 300,
        max: 400,
        overlap: 40,
        min: 200,
    };
    let paragraphs: Vec<String> = (0..12)
        .map(|i| format!("Paragraphe numéro {i} {}", "mot ".repeat(30)))
        .collect();
    let text = format!("# T\n\n## S\n\n{}", paragraphs.join("\n\n"));
    let got = chunk_document("d", "T", &text, &sizes);
    assert!(got.len() > 1);
    assert!(got.iter().all(|c| char_len(&c.text) <= 460));
    assert!(got.iter().all(|c| c.heading_path == "T > S"));
    let first = &got[0].text;
    let n = char_len(first);
    assert!(got[1].text.contains(char_slice(first, n - 20, n)));
}

#[test]
fn upstream_headings_inside_code_fences_are_ignored() {
    let sizes = ChunkSizes {
        min: 1,
        ..ChunkSizes::default()
    };
    let text = "# T\n\ntexte\n\n```bash\n# pas un titre\necho ok\n```\n\nsuite";
    let got = chunk_document("d", "T", text, &sizes);
    assert_eq!(got.len(), 1);
    assert!(got[0].text.contains("# pas un titre"));
}

#[test]
fn upstream_oversized_paragraph_is_hard_split() {
    let sizes = ChunkSizes {
        target: 200,
        max: 200,
        overlap: 20,
        min: 200,
    };
    let got = chunk_document("d", "T", &"Phrase. ".repeat(100), &sizes);
    assert!(got.iter().all(|c| char_len(&c.text) <= 200));
    let total: usize = got.iter().map(|c| c.text.matches("Phrase").count()).sum();
    assert!(total >= 100);
}

#[test]
fn sentence_split_matches_python_lookbehind() {
    assert_eq!(
        sentences("A. B!  C? D… E"),
        vec!["A.", "B!", "C?", "D…", "E"]
    );
    assert_eq!(sentences("no end here"), vec!["no end here"]);
    assert_eq!(tail("abc def ghi", 5), "ghi");
    assert_eq!(tail("abcdefghi", 5), "efghi");
    assert_eq!(tail("abc", 5), "");
}
