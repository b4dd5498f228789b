//! The `devis` example: the whole `loom` CLI with one Rust tool, `prix_ttc`.
//!
//! ```text
//! cargo run --release --example devis -- run devis "Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?"
//! cargo run --release --example devis -- inspect <run_id>
//! cargo run --release --example devis -- report <run_id>
//! ```
//!
//! Without `--config`, it uses `examples/devis/loom.yaml`.

use std::{fmt, process::ExitCode};

/// Why a price cannot be computed.
#[derive(Debug)]
enum PrixError {
    /// The amount is negative or not a number.
    Montant(f64),
    /// The rate is outside 0–100 %.
    Taux(f64),
}

impl fmt::Display for PrixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PrixError::Montant(m) => write!(
                f,
                "montant HT invalide : {m} (attendu : un nombre positif d'euros)"
            ),
            PrixError::Taux(t) => write!(
                f,
                "taux de TVA invalide : {t} (attendu : un pourcentage entre 0 et 100, par exemple 10)"
            ),
        }
    }
}

/// Calcule le prix TTC d'un montant HT en euros pour un taux de TVA donné en pourcentage
/// (20, 10, 5.5 ou 2.1 en France). Le calcul se fait en centimes, arrondis au plus proche.
// `inline`: a computation of a few microseconds, called in place on the call's task
// rather than handed to the blocking thread pool.
#[loom_ia::tool(side_effects = "none", inline)]
fn prix_ttc(montant_ht: f64, taux_tva: f64) -> Result<String, PrixError> {
    if !montant_ht.is_finite() || montant_ht < 0.0 {
        return Err(PrixError::Montant(montant_ht));
    }
    if !taux_tva.is_finite() || !(0.0..=100.0).contains(&taux_tva) {
        return Err(PrixError::Taux(taux_tva));
    }
    let ht = (montant_ht * 100.0).round() as i64;
    let tva = (ht as f64 * taux_tva / 100.0).round() as i64;
    let ttc = ht + tva;
    Ok(format!(
        "{} TTC ({} HT + {} de TVA à {} %)",
        euros(ttc),
        euros(ht),
        euros(tva),
        taux_tva.to_string().replace('.', ",")
    ))
}

/// `137500` → `1 375 €`, `12345` → `123,45 €` (French format, narrow no-break spaces).
fn euros(cents: i64) -> String {
    let units = cents / 100;
    let rest = cents % 100;
    let digits = units.to_string();
    let mut grouped = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push('\u{202f}');
        }
        grouped.push(c);
    }
    if rest == 0 {
        format!("{grouped} €")
    } else {
        format!("{grouped},{rest:02} €")
    }
}

fn main() -> ExitCode {
    loom_cli::App::new()
        .tool(prix_ttc_tool())
        .default_config(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/devis/loom.yaml"
        ))
        .main()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computes_in_cents() {
        assert_eq!(
            prix_ttc(1250.0, 10.0).unwrap(),
            "1\u{202f}375 € TTC (1\u{202f}250 € HT + 125 € de TVA à 10 %)"
        );
        assert_eq!(
            prix_ttc(99.99, 5.5).unwrap(),
            "105,49 € TTC (99,99 € HT + 5,50 € de TVA à 5,5 %)"
        );
        assert!(prix_ttc(-1.0, 10.0).is_err());
        assert!(
            prix_ttc(10.0, 120.0)
                .unwrap_err()
                .to_string()
                .contains("taux de TVA invalide")
        );
    }
}
