//! Measures an embedder loaded from a model directory: throughput on ~300-character chunks and
//! the latency of one short query.
//!
//! ```text
//! cargo run --release -p loom-notes-candle --features candle --example embed_bench -- DIR [CHUNKS]
//! ```

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

const SENTENCES: &[&str] = &[
    "Qdrant stores dense and sparse vectors for each chunk of a document.",
    "The hybrid search fuses a cosine ranking and a lexical ranking with reciprocal rank fusion.",
    "A cat sits on the mat while the dog sleeps near the door.",
    "Quarterly revenue grew by twelve percent thanks to the new subscription plans.",
    "Markdown headings give each chunk a path such as Guide > Install > Linux.",
    "The reranker scores every candidate passage against the query between zero and one.",
    "Files outside the allowed roots are refused before they are opened.",
    "Pages fetched from the web are converted to markdown and stripped of navigation noise.",
    "Rust's ownership rules make data races a compile-time error.",
    "The meeting was moved to Thursday afternoon because of the train strike.",
];

/// Chunk `index`: sentences picked from the list until ~300 characters.
fn chunk(index: usize) -> String {
    let mut text = String::new();
    let mut k = index;
    while text.chars().count() < 280 {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(SENTENCES[k % SENTENCES.len()]);
        k = k * 7 + 3;
    }
    text
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().context("usage: embed_bench DIR [CHUNKS]")?;
    let count: usize = match args.next() {
        Some(count) => count.parse().context("CHUNKS must be a number")?,
        None => 256,
    };

    let started = Instant::now();
    let embedder = loom_notes_candle::load_embedder(&dir)?;
    println!(
        "model {} (dim {}) loaded in {:.2?}",
        embedder.model_name(),
        embedder.dim(),
        started.elapsed()
    );

    let chunks: Vec<String> = (0..count).map(chunk).collect();
    let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
    let mean_chars = chunks.iter().map(|c| c.chars().count()).sum::<usize>() as f64 / count as f64;
    embedder.embed(&refs[..count.min(16)])?; // warm-up

    let started = Instant::now();
    let embeddings = embedder.embed(&refs)?;
    let elapsed = started.elapsed();
    assert_eq!(embeddings.len(), count);
    println!(
        "embed: {count} chunks of {mean_chars:.0} chars on average in {elapsed:.2?} = {:.1} chunks/s",
        count as f64 / elapsed.as_secs_f64()
    );

    let queries = [
        "how does the hybrid search fuse rankings?",
        "where is the cat?",
        "revenue growth last quarter",
        "which files are refused?",
    ];
    let mut latencies: Vec<Duration> = Vec::new();
    for round in 0..50 {
        let query = queries[round % queries.len()];
        let started = Instant::now();
        embedder.embed_query(query)?;
        latencies.push(started.elapsed());
    }
    latencies.sort();
    println!(
        "embed_query: median {:.2?}, p90 {:.2?}, min {:.2?} over {} queries",
        latencies[latencies.len() / 2],
        latencies[latencies.len() * 9 / 10],
        latencies[0],
        latencies.len()
    );
    Ok(())
}
