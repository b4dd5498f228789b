//! The command line (reference A.11): global options before the command, usage errors exit 2.

use std::{net::SocketAddr, path::PathBuf};

use clap::{Parser, Subcommand};

/// loom-notes: your local memory (notes, Markdown files, web pages) found again by hybrid
/// search, as a CLI and an MCP server.
#[derive(Debug, Parser)]
#[command(name = "loom-notes", version, about, long_about = None)]
pub(crate) struct Cli {
    /// Use the deterministic fake models (tests, demos); also LOOM_NOTES_FAKE_MODELS=true.
    #[arg(long)]
    pub(crate) fake: bool,
    /// The data directory (default: LOOM_NOTES_DATA_DIR, else $XDG_DATA_HOME/loom-notes, else
    /// ~/.local/share/loom-notes).
    #[arg(long, value_name = "PATH")]
    pub(crate) data_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Add a text (read from stdin when TEXT is absent).
    AddText {
        /// The project it belongs to.
        project: String,
        /// A short, explicit title (at least 3 characters).
        title: String,
        /// The text; stdin when absent.
        text: Option<String>,
        /// A tag (repeatable).
        #[arg(short = 't', long = "tag", value_name = "TAG")]
        tags: Vec<String>,
    },
    /// Add a web page (its main content; the title is the page's).
    AddUrl {
        /// The project it belongs to.
        project: String,
        /// An http(s) URL.
        url: String,
        /// A tag (repeatable).
        #[arg(short = 't', long = "tag", value_name = "TAG")]
        tags: Vec<String>,
    },
    /// Add a local Markdown or text file inside LOOM_NOTES_ALLOWED_ROOTS.
    AddFile {
        /// The project it belongs to.
        project: String,
        /// The file's path.
        path: String,
        /// A tag (repeatable).
        #[arg(short = 't', long = "tag", value_name = "TAG")]
        tags: Vec<String>,
    },
    /// Search the memory (hybrid search, then reranking).
    Search {
        /// A question or keywords.
        query: String,
        /// Restrict to a project.
        #[arg(short = 'p', long)]
        project: Option<String>,
        /// A tag every result must have (repeatable).
        #[arg(short = 't', long = "tag", value_name = "TAG")]
        tags: Vec<String>,
        /// How many results (1 to 10).
        #[arg(short = 'k', long = "k", default_value_t = 5,
              value_parser = clap::value_parser!(u16).range(1..=10))]
        k: u16,
    },
    /// Print a document (JSON).
    Get {
        /// Its id.
        doc_id: String,
    },
    /// List the latest documents, newest first.
    List {
        /// Only this project.
        #[arg(short = 'p', long)]
        project: Option<String>,
        /// How many (1 to 500).
        #[arg(short = 'n', long = "n", default_value_t = 20,
              value_parser = clap::value_parser!(u16).range(1..=500))]
        n: u16,
    },
    /// The projects and their number of documents.
    Projects,
    /// Delete a document and its chunks.
    Delete {
        /// Its id.
        doc_id: String,
    },
    /// Export every document as JSON lines (default DATA_DIR/export.jsonl).
    Export {
        /// Where to write.
        path: Option<PathBuf>,
    },
    /// Import documents from JSON lines (default DATA_DIR/export.jsonl); known ids are skipped.
    Import {
        /// What to read.
        path: Option<PathBuf>,
    },
    /// Evaluate the search on a golden set (default DATA_DIR/golden.jsonl).
    Eval {
        /// The golden set.
        path: Option<PathBuf>,
        /// How many results per query (1 to 10).
        #[arg(long = "k", default_value_t = 10,
              value_parser = clap::value_parser!(u16).range(1..=10))]
        k: u16,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Add a case to the golden set: QUERY should find DOC_ID.
    EvalAdd {
        /// The query.
        query: String,
        /// The document it should find.
        doc_id: String,
        /// The project the query is restricted to.
        #[arg(short = 'p', long)]
        project: Option<String>,
        /// The golden set (default DATA_DIR/golden.jsonl).
        #[arg(long)]
        path: Option<PathBuf>,
    },
    /// Rebuild every chunk from the documents with the current model (no model check).
    Reindex,
    /// Serve MCP: over stdio by default, over streamable HTTP with --http.
    Serve {
        /// Serve streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8765).
        #[arg(long, value_name = "ADDR")]
        http: Option<SocketAddr>,
    },
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::Cli;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn k_out_of_bounds_is_a_usage_error() {
        let error = Cli::try_parse_from(["loom-notes", "search", "q", "-k", "11"])
            .err()
            .map(|e| e.kind());
        assert_eq!(error, Some(clap::error::ErrorKind::ValueValidation));
        assert!(Cli::try_parse_from(["loom-notes", "search", "q", "-k", "10"]).is_ok());
    }
}
