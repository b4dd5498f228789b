//! `loom-notes`: the user's local memory — notes, Markdown files and web pages, chunked,
//! embedded and found again by hybrid search — as a CLI (`loom-notes add-text …`,
//! `search`, `list`, `export`, `eval`, …) and as an MCP server (`loom-notes serve`, over
//! stdio or streamable HTTP). The CLI and the server share one SQLite store in the data
//! directory, so both can run at once.
//!
//! The behaviour follows the Python loom-notes 1.1.0 (`../shared/reference/loom-notes.md`,
//! A.4 and A.11), in English; see the crate's README for what differs.

mod cli;
mod commands;
mod mcp;
mod models;
mod output;
mod progress;
mod serve;
mod setup;
mod sources;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    init_logs();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to stderr (stdout is the protocol under `serve`), at WARN unless `RUST_LOG` says
/// otherwise (`serve` logs its start at INFO).
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("warn,loom_notes::serve=info,loom_notes::mcp=info")
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .without_time()
        .try_init();
}
