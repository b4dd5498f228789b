//! The chaos example: an agent whose only tool appends one line to a file — an irreversible
//! action made safe to resume by its idempotency key. `crates/loom-cli/tests/chaos.rs` and
//! `bench/chaos.sh` kill it with SIGKILL at random points and resume it, and check that every
//! run completes with exactly one line written.
//!
//! A second tool, `attendre`, waits until the file named by `CHAOS_GATE` exists: the agents of
//! `crates/loom-cli/tests/serve_ops.rs` use it to hold a run in a step while its server is
//! killed.
//!
//! ```text
//! CHAOS_FILE=/tmp/out.txt cargo run --example chaos -- --config examples/chaos/loom.yaml run chaos "go"
//! ```

use std::{fs::OpenOptions, io::Write, process::ExitCode};

use loom_ia::ToolContext;

/// Appends one line to the file named by `CHAOS_FILE`, once per call: the call's idempotency
/// key is written with the line, and a call whose key is already there writes nothing.
#[loom_ia::tool(side_effects = "irreversible", idempotent)]
fn append_line(text: String, ctx: ToolContext) -> Result<String, String> {
    let path = std::env::var("CHAOS_FILE").map_err(|_| "CHAOS_FILE is not set".to_owned())?;
    let existing = std::fs::read_to_string(&path).unwrap_or_default();
    if existing
        .lines()
        .any(|line| line.starts_with(&ctx.idempotency_key))
    {
        return Ok(format!("already written: {text}"));
    }
    // A little work, so that kills also land while the tool runs.
    std::thread::sleep(std::time::Duration::from_millis(3));
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| e.to_string())?;
    file.write_all(format!("{} {text}\n", ctx.idempotency_key).as_bytes())
        .map_err(|e| e.to_string())?;
    file.sync_data().map_err(|e| e.to_string())?;
    Ok(format!("written: {text}"))
}

/// Waits until the file named by `CHAOS_GATE` exists (at most 60 s), then says so.
#[loom_ia::tool(side_effects = "none")]
async fn attendre() -> Result<String, String> {
    let gate = std::env::var_os("CHAOS_GATE").ok_or_else(|| "CHAOS_GATE is not set".to_owned())?;
    let started = tokio::time::Instant::now();
    while !std::path::Path::new(&gate).exists() {
        if started.elapsed() > std::time::Duration::from_secs(60) {
            return Err("the gate never opened".into());
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok("feu vert".into())
}

fn main() -> ExitCode {
    loom_cli::App::new()
        .tool(append_line_tool())
        .tool(attendre_tool())
        .default_config(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/chaos/loom.yaml"
        ))
        .main()
}
