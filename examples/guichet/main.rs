//! The guichet example: Loom as an MCP server. Three agents become MCP tools — `devis` (a
//! price, with a Rust tool), `paiement` (a transfer a human approves) and `attente` (a long
//! wait, to cancel) — next to the control tools `run_status`, `run_report` and `cancel`, and
//! the journal as `loom://` resources. `interne` is kept off MCP (`expose: {mcp: false}`); its
//! tool `plan_des_locaux` returns an image (`loom_ia::Image`), stored as an artifact of the run.
//! `crates/loom-cli/tests/mcp_server.rs` drives it with the official Python MCP client, over
//! stdio (`guichet mcp`) and over streamable HTTP (`guichet serve` with `server.mcp.http`).
//!
//! ```text
//! cargo run --example guichet -- mcp                       # stdio, tenant `default`
//! cargo run --example guichet -- mcp --tenant acme
//! claude mcp add guichet -- cargo run --example guichet -- mcp
//! ```
//!
//! Without `--config`, it uses `examples/guichet/loom.yaml`.

use std::{process::ExitCode, time::Duration};

/// Calcule le prix TTC à partir d'un montant HT et d'un taux de TVA en pourcentage.
// `inline`: a computation of a few microseconds, called in place on the call's task
// rather than handed to the blocking thread pool.
#[loom_ia::tool(side_effects = "none", inline)]
fn prix_ttc(montant_ht: f64, taux_tva: f64) -> String {
    format!("{:.2} € TTC", montant_ht * (1.0 + taux_tva / 100.0)).replace('.', ",")
}

/// Ordonne un virement de `montant` euros vers l'IBAN `iban`.
#[loom_ia::tool(side_effects = "irreversible")]
fn virement(iban: String, montant: f64) -> Result<String, String> {
    let iban: String = iban.chars().filter(|c| !c.is_whitespace()).collect();
    if iban.len() < 15 || !iban.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!("IBAN invalide : {iban}"));
    }
    if !montant.is_finite() || montant <= 0.0 {
        return Err(format!("montant invalide : {montant}"));
    }
    Ok(format!(
        "virement de {montant} € vers {}…{} enregistré",
        &iban[..4],
        &iban[iban.len() - 3..]
    ))
}

/// Attend `secondes` secondes (une opération longue, qu'on peut annuler).
#[loom_ia::tool(side_effects = "none")]
async fn patienter(secondes: u64) -> String {
    tokio::time::sleep(Duration::from_secs(secondes)).await;
    format!("attendu {secondes} s")
}

/// The plan of the premises, a PNG image.
const PLAN: &[u8] = include_bytes!("documents/plan.png");

/// Donne le plan des locaux du guichet (une image).
#[loom_ia::tool(side_effects = "none")]
fn plan_des_locaux() -> loom_ia::Image {
    loom_ia::Image::png(PLAN.to_vec()).named("plan.png")
}

fn main() -> ExitCode {
    loom_cli::App::new()
        .tool(prix_ttc_tool())
        .tool(virement_tool())
        .tool(patienter_tool())
        .tool(plan_des_locaux_tool())
        .default_config("examples/guichet/loom.yaml")
        .main()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_and_transfers() {
        assert_eq!(prix_ttc(1250.0, 10.0), "1375,00 € TTC");
        assert_eq!(
            virement("FR76 3000 4000 0100 0000 0000 123".into(), 1250.0).unwrap(),
            "virement de 1250 € vers FR76…123 enregistré"
        );
        assert!(virement("FR76".into(), 10.0).is_err());
    }
}
