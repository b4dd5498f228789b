//! The `garde` example: guards around an agent — policies at the five points of the loop, an
//! output contract and a judge — with one Rust tool, `chercher_devis`, and the scripted fake
//! model. "Code decides, the model proposes": every decision is journaled (`policy.decided`,
//! `guard.checked`, `judge.evaluated`) before it takes effect.
//!
//! ```text
//! cargo run --example garde -- run devis "Que vaut le devis 42 ?"      # denied, then normalized
//! cargo run --example garde -- run fiche "Fiche du devis D-2026-042"    # JSON contract, repaired
//! cargo run --example garde -- run courrier "Le devis D-2026-042 ?"     # judged, repaired
//! cargo run --example garde -- inspect <run_id>
//! ```
//!
//! Without `--config`, it uses `examples/garde/loom.yaml`. The agents hook the policies below
//! by name in their `policies:` (with `params`); `crates/loom-cli/tests/guards.rs` runs every
//! point and decision through this binary.
//!
//! | policy | point | decisions |
//! |---|---|---|
//! | `numero_devis` | before_tool | deny a malformed quote number, replace a sloppy one |
//! | `acces_devis` | before_tool | pause (`params.a_valider`), fail (`params.interdits`) |
//! | `quota_appels` | before_model | stop or fail (`params.action`) past `params.max_appels` |
//! | `ton_professionnel` | after_model | retry, stop or fail (`params.action`) on a casual word |
//! | `anonymisation` | after_tool | replace the client's name by its initial |
//! | `plafond_montant` | after_tool | retry or fail (`params.action`) above `params.plafond` |
//! | `signature` | on_output | replace: the answer gets signed |
//! | `cite_le_devis` | on_output | retry or fail (`params.action`) without a quote number |
//!
//! The judge condition `montant_cite` lets a judge run only on answers that give an amount.

use std::process::ExitCode;

use loom_ia::{
    JudgeInput, Message, ToolOutput,
    policy::{
        Decision, DecisionKind, FnPolicy, Point, PolicyContext, PolicyError, Replacement, Subject,
    },
};
use serde::Serialize;
use serde_json::Value;

/// A quote, as `chercher_devis` returns it.
#[derive(Debug, Clone, PartialEq, Serialize)]
struct Devis {
    numero: String,
    client: String,
    montant_ttc: f64,
}

/// The quotes this example knows.
const DEVIS: &[(&str, &str, f64)] = &[
    ("D-2026-042", "Mme Martin", 1840.0),
    ("D-2026-017", "M. Durand", 12480.0),
];

/// Retrouve un devis par son numéro (format D-AAAA-NNN) : client et montant TTC en euros.
#[loom_ia::tool(side_effects = "none")]
fn chercher_devis(numero: String) -> Result<Devis, String> {
    DEVIS
        .iter()
        .find(|(n, ..)| *n == numero)
        .map(|(numero, client, montant_ttc)| Devis {
            numero: (*numero).to_owned(),
            client: (*client).to_owned(),
            montant_ttc: *montant_ttc,
        })
        .ok_or_else(|| format!("aucun devis n'a le numéro {numero}"))
}

/// Whether `text` is a well-formed quote number: `D-YYYY-NNN`.
fn is_numero(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 10
        && text.starts_with("D-")
        && bytes[6] == b'-'
        && bytes[2..6].iter().all(u8::is_ascii_digit)
        && bytes[7..].iter().all(u8::is_ascii_digit)
}

/// Whether `text` cites a quote number somewhere.
fn cites_numero(text: &str) -> bool {
    text.char_indices()
        .any(|(i, _)| text.get(i..i + 10).is_some_and(is_numero))
}

/// `before_tool` — deny: a quote number that cannot be one; replace: a lower-case or padded
/// number becomes `D-YYYY-NNN`, and the tool runs with it (the model's arguments stay in
/// `tool.called`, the corrected ones in `policy.decided`).
fn numero_devis(subject: &Subject, _: &PolicyContext) -> Result<Decision, PolicyError> {
    let Subject::Call { arguments, .. } = subject else {
        return Ok(Decision::Continue);
    };
    let Some(raw) = arguments.get("numero").and_then(Value::as_str) else {
        return Ok(Decision::Continue);
    };
    let clean = raw.trim().to_uppercase();
    if !is_numero(&clean) {
        return Ok(Decision::Deny(format!(
            "numéro de devis mal formé : '{raw}' (format attendu : D-AAAA-NNN)"
        )));
    }
    if clean == raw {
        return Ok(Decision::Continue);
    }
    let mut corrected = arguments.clone();
    corrected["numero"] = Value::String(clean.clone());
    Ok(Decision::replace(
        Replacement::Arguments(corrected),
        format!("'{raw}' → '{clean}'"),
    ))
}

/// The strings of the list `params.<key>` (empty when absent).
fn strings(context: &PolicyContext, key: &str) -> Vec<String> {
    context
        .params
        .get(key)
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The number `params.<key>`, or `default`.
fn number(context: &PolicyContext, key: &str, default: f64) -> f64 {
    context
        .params
        .get(key)
        .and_then(Value::as_f64)
        .unwrap_or(default)
}

/// The decision named by `params.action` (`retry`, `stop` or `fail`; `default` when absent),
/// with `reason`. A decision the policy did not declare is refused by the engine.
fn action(context: &PolicyContext, default: &str, reason: String) -> Result<Decision, PolicyError> {
    let name = context
        .params
        .get("action")
        .and_then(Value::as_str)
        .unwrap_or(default);
    match name {
        "retry" => Ok(Decision::Retry {
            feedback: reason,
            tools: true,
        }),
        "stop" => Ok(Decision::Stop(reason)),
        "fail" => Ok(Decision::Fail(reason)),
        other => Err(PolicyError(format!(
            "params.action must be retry, stop or fail, not '{other}'"
        ))),
    }
}

/// `before_tool` — pause: the quotes of `params.a_valider` are only looked up once a human
/// approved (`loom approve`); fail: those of `params.interdits` fail the run.
fn acces_devis(subject: &Subject, context: &PolicyContext) -> Result<Decision, PolicyError> {
    let Subject::Call { arguments, .. } = subject else {
        return Ok(Decision::Continue);
    };
    let numero = arguments
        .get("numero")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if strings(context, "interdits").iter().any(|n| n == numero) {
        return Ok(Decision::Fail(format!(
            "consultation du devis {numero} interdite"
        )));
    }
    if strings(context, "a_valider").iter().any(|n| n == numero) {
        return Ok(Decision::Pause(format!(
            "le devis {numero} ne se consulte qu'après validation"
        )));
    }
    Ok(Decision::Continue)
}

/// `before_model` — past `params.max_appels` model calls (default 5), `params.action`: `stop`
/// (the run finishes with one last answer without tools, the default) or `fail`.
fn quota_appels(_: &Subject, context: &PolicyContext) -> Result<Decision, PolicyError> {
    let max = number(context, "max_appels", 5.0);
    if f64::from(context.iterations) < max {
        return Ok(Decision::Continue);
    }
    action(
        context,
        "stop",
        format!("quota de {max} appel(s) au modèle atteint"),
    )
}

/// `after_model` — an answer with a casual word of `params.mots_interdits` (default: "super",
/// "cool") gets `params.action`: `retry` (the default: the model answers again), `stop` or
/// `fail`.
///
/// It also declares `on_output`, where `stop` is not allowed: hooked there (or without
/// `points:`), the agent is refused at load. Agents hook it with `points: [after_model]`.
fn ton_professionnel(subject: &Subject, context: &PolicyContext) -> Result<Decision, PolicyError> {
    let mut words = strings(context, "mots_interdits");
    if words.is_empty() {
        words = vec!["super".into(), "cool".into()];
    }
    let text = subject.text().to_lowercase();
    match words.iter().find(|w| text.contains(&w.to_lowercase())) {
        Some(word) => action(
            context,
            "retry",
            format!("ton trop familier (« {word} ») : reformule sur un ton professionnel"),
        ),
        None => Ok(Decision::Continue),
    }
}

/// `after_tool` — replace: the client's name in a quote becomes its title and initial
/// ("Mme Martin" → "Mme M."), before the model sees it.
fn anonymisation(subject: &Subject, _: &PolicyContext) -> Result<Decision, PolicyError> {
    let Subject::Result { output, .. } = subject else {
        return Ok(Decision::Continue);
    };
    let Some(mut data) = output.data.clone() else {
        return Ok(Decision::Continue);
    };
    let Some(client) = data.get("client").and_then(Value::as_str) else {
        return Ok(Decision::Continue);
    };
    let masked = match client.split_once(' ') {
        Some((title, name)) => format!(
            "{title} {}.",
            name.chars().next().map(String::from).unwrap_or_default()
        ),
        None => "client masqué".to_owned(),
    };
    // The reason is journaled: it names the masked form only.
    let reason = format!("nom du client masqué : '{masked}'");
    data["client"] = Value::String(masked);
    Ok(Decision::replace(
        Replacement::Output(ToolOutput::json(data)),
        reason,
    ))
}

/// `after_tool` — a quote above `params.plafond` euros (default 10 000) gets `params.action`:
/// `retry` (the default: the result is refused, the model reads why) or `fail`.
fn plafond_montant(subject: &Subject, context: &PolicyContext) -> Result<Decision, PolicyError> {
    let Subject::Result { output, .. } = subject else {
        return Ok(Decision::Continue);
    };
    let plafond = number(context, "plafond", 10_000.0);
    let montant = output
        .data
        .as_ref()
        .and_then(|d| d.get("montant_ttc"))
        .and_then(Value::as_f64);
    match montant {
        Some(montant) if montant > plafond => action(
            context,
            "retry",
            format!(
                "montant de {montant} € au-dessus du plafond de {plafond} € : vérifie le numéro du devis"
            ),
        ),
        _ => Ok(Decision::Continue),
    }
}

/// `on_output` — replace: the final answer is signed (`params.texte`, default "— Le service
/// devis").
fn signature(subject: &Subject, context: &PolicyContext) -> Result<Decision, PolicyError> {
    let texte = context
        .params
        .get("texte")
        .and_then(Value::as_str)
        .unwrap_or("— Le service devis");
    Ok(Decision::replace(
        Replacement::Message(Message::assistant(format!("{}\n{texte}", subject.text()))),
        "réponse signée",
    ))
}

/// `on_output` — a final answer that cites no quote number gets `params.action`: `retry`
/// (the default: the model answers again) or `fail`.
fn cite_le_devis(subject: &Subject, context: &PolicyContext) -> Result<Decision, PolicyError> {
    if cites_numero(&subject.text()) {
        return Ok(Decision::Continue);
    }
    action(
        context,
        "retry",
        "la réponse doit citer le numéro du devis (D-AAAA-NNN)".to_owned(),
    )
}

fn main() -> ExitCode {
    use DecisionKind as D;
    use Point as P;
    loom_cli::App::new()
        .tool(chercher_devis_tool())
        .policy(
            "numero_devis",
            FnPolicy::new([P::BeforeTool], [D::Deny, D::Replace], numero_devis),
        )
        .policy(
            "acces_devis",
            FnPolicy::new([P::BeforeTool], [D::Pause, D::Fail], acces_devis),
        )
        .policy(
            "quota_appels",
            FnPolicy::new([P::BeforeModel], [D::Stop, D::Fail], quota_appels),
        )
        .policy(
            "ton_professionnel",
            FnPolicy::new(
                [P::AfterModel, P::OnOutput],
                [D::Retry, D::Stop, D::Fail],
                ton_professionnel,
            ),
        )
        .policy(
            "anonymisation",
            FnPolicy::new([P::AfterTool], [D::Replace], anonymisation),
        )
        .policy(
            "plafond_montant",
            FnPolicy::new([P::AfterTool], [D::Retry, D::Fail], plafond_montant),
        )
        .policy(
            "signature",
            FnPolicy::new([P::OnOutput], [D::Replace], signature),
        )
        .policy(
            "cite_le_devis",
            FnPolicy::new([P::OnOutput], [D::Retry, D::Fail], cite_le_devis),
        )
        .condition("montant_cite", |input: &JudgeInput| {
            input.output.contains('€')
        })
        .default_config(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/garde/loom.yaml"
        ))
        .main()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_numbers_are_recognized() {
        assert!(is_numero("D-2026-042"));
        assert!(!is_numero("42"));
        assert!(!is_numero("d-2026-042"));
        assert!(!is_numero("D-2026-04"));
        assert!(cites_numero("Le devis D-2026-042 s'élève à 1 840 €."));
        assert!(!cites_numero("Le devis s'élève à 1 840 €."));
    }
}
