//! The equipe example: an orchestrator agent (`secretariat`) delegates to a sub-agent
//! (`comptable`), which has three Rust tools: `solde_compte` (reads a balance), `virement`
//! (orders a transfer; declared `approval: always` in `agents/comptable.yaml`) and
//! `releve_bancaire` (asks the bank for a statement and waits until its file arrives).
//! `crates/loom-cli/tests/delegation.rs` drives it end to end: child runs in the root's journal,
//! budget shares, depth, cancellation and approvals through the root, run, session and tenant
//! budgets, reports.
//!
//! ```text
//! cargo run --example equipe -- run secretariat "Quel est le solde du compte bancaire 512 ?"
//! cargo run --example equipe -- report <run_id>
//! cargo run --example equipe -- run secretariat "Règle la facture F-2024-031 par virement."
//! cargo run --example equipe -- approve <run_id>
//! ```
//!
//! Without `--config`, it uses `examples/equipe/loom.yaml`.

use std::{path::PathBuf, process::ExitCode, time::Duration};

/// How long `releve_bancaire` waits for the bank's file.
const RELEVE_WAIT: Duration = Duration::from_secs(30);

/// Donne le solde d'un compte du grand livre (numéro du plan comptable : 512, 411 ou 401).
#[loom_ia::tool(side_effects = "none")]
fn solde_compte(compte: String) -> Result<String, String> {
    let (libelle, solde) = match compte.trim() {
        "512" => ("Banque", "solde débiteur de 12\u{202f}480,50 €"),
        "411" => ("Clients", "solde débiteur de 8\u{202f}215,00 €"),
        "401" => ("Fournisseurs", "solde créditeur de 5\u{202f}730,20 €"),
        other => {
            return Err(format!(
                "compte inconnu : {other} (comptes tenus : 512, 411, 401)"
            ));
        }
    };
    Ok(format!("compte {compte} ({libelle}) : {solde}"))
}

/// Ordonne un virement de `montant` euros vers l'IBAN `iban`, avec le libellé `libelle`.
#[loom_ia::tool(side_effects = "irreversible")]
fn virement(iban: String, montant: f64, libelle: String) -> Result<String, String> {
    let iban: String = iban.chars().filter(|c| !c.is_whitespace()).collect();
    if iban.len() < 15 || !iban.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!("IBAN invalide : {iban}"));
    }
    if !montant.is_finite() || montant <= 0.0 {
        return Err(format!(
            "montant invalide : {montant} (attendu : des euros, > 0)"
        ));
    }
    Ok(format!(
        "virement de {} € vers {}…{} enregistré ({libelle})",
        montant.to_string().replace('.', ","),
        &iban[..4],
        &iban[iban.len() - 3..]
    ))
}

/// Demande à la banque `banque` le relevé du mois et attend qu'il arrive : la demande est déposée
/// dans le dossier `RELEVES_DIR` (`demande-<banque>.txt`), le relevé y est attendu
/// (`releve-<banque>.txt`) pendant 30 secondes au plus.
#[loom_ia::tool(side_effects = "reversible", idempotent)]
async fn releve_bancaire(banque: String) -> Result<String, String> {
    if banque.is_empty()
        || !banque
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(format!(
            "banque invalide : {banque} (lettres, chiffres et tirets)"
        ));
    }
    let dir = std::env::var_os("RELEVES_DIR")
        .map(PathBuf::from)
        .ok_or_else(|| "RELEVES_DIR is not set".to_owned())?;
    // Small files: plain std::fs calls, between the awaits.
    std::fs::write(
        dir.join(format!("demande-{banque}.txt")),
        format!("relevé du mois demandé à {banque}\n"),
    )
    .map_err(|e| e.to_string())?;
    let releve = dir.join(format!("releve-{banque}.txt"));
    let started = tokio::time::Instant::now();
    loop {
        match std::fs::read_to_string(&releve) {
            Ok(text) => return Ok(text.trim().to_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.to_string()),
        }
        if started.elapsed() >= RELEVE_WAIT {
            return Err(format!(
                "relevé de {banque} non reçu après {} s",
                RELEVE_WAIT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn main() -> ExitCode {
    loom_cli::App::new()
        .tool(solde_compte_tool())
        .tool(virement_tool())
        .tool(releve_bancaire_tool())
        .default_config(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/equipe/loom.yaml"
        ))
        .main()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn balances_and_transfers() {
        assert_eq!(
            solde_compte("512".into()).unwrap(),
            "compte 512 (Banque) : solde débiteur de 12\u{202f}480,50 €"
        );
        assert!(
            solde_compte("999".into())
                .unwrap_err()
                .contains("512, 411, 401")
        );
        assert_eq!(
            virement(
                "FR76 3000 4000 0100 0000 0000 123".into(),
                1250.0,
                "Facture F-2024-031".into()
            )
            .unwrap(),
            "virement de 1250 € vers FR76…123 enregistré (Facture F-2024-031)"
        );
        assert!(virement("FR76".into(), 10.0, "x".into()).is_err());
        assert!(virement("FR7630004000010000000000123".into(), -1.0, "x".into()).is_err());
    }
}
