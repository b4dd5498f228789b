//! The relance example: an agent whose tool chases a quote by appending one line to a file — an
//! irreversible action declared with a business key (`relance:{numero}`), so that two different
//! runs asking to chase the same quote send one reminder. `crates/loom-cli/tests/idempotency.rs`
//! runs it twice and checks that the second run reuses the first one's result.
//!
//! ```text
//! RELANCE_FILE=/tmp/relances.txt cargo run --example relance -- \
//!     --config examples/relance/loom.yaml run relance "Relance le devis D-2024-017"
//! ```

use std::{fs::OpenOptions, io::Write, process::ExitCode};

/// Sends a reminder for the quote `numero` (appends one line to the file named by
/// `RELANCE_FILE`).
#[loom_ia::tool(side_effects = "irreversible", business_key = "relance:{numero}")]
fn envoyer_relance(numero: String) -> Result<String, String> {
    let path = std::env::var("RELANCE_FILE").map_err(|_| "RELANCE_FILE is not set".to_owned())?;
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| e.to_string())?;
    file.write_all(format!("relance {numero}\n").as_bytes())
        .map_err(|e| e.to_string())?;
    file.sync_data().map_err(|e| e.to_string())?;
    Ok(format!("relance envoyée pour le devis {numero}"))
}

fn main() -> ExitCode {
    loom_cli::App::new()
        .tool(envoyer_relance_tool())
        .default_config(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/relance/loom.yaml"
        ))
        .main()
}
