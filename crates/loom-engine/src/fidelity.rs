//! The fidelity check of a compaction summary (`loom.fidelity`): deterministic code, no model.
//!
//! The markers of the summarized turns ([`markers`]: e-mail addresses, references such as
//! `DEV-2041`, dates, amounts and numbers of three digits or more) must all appear in the
//! summary, compared by a key with spacing and separators normalized (`1 842,50 €` and
//! `1842,50` are one amount, `12/03/2026` and `2026-03-12` one date, `dev_2041` and `DEV-2041`
//! one reference). Proper names are not checked: no rule tells them apart from the capitalized
//! words of a sentence without a dictionary, and a check that cries wolf would keep every
//! original.
//!
//! As a guard of the `_compaction` agent's final output (`guard`), a summary that misses
//! markers is sent back once to its model, naming them; missing again, the run fails
//! (`guard.fidelity`) and the compaction keeps the original turns.

use std::collections::BTreeSet;

use loom_core::{
    RunState,
    event::{GuardChecked, Payload},
    policy::{DecisionKind, Point},
};

use crate::{
    error::EngineError,
    hooks,
    io::Io,
    output::{Final, Guarded},
};

/// Name of the built-in fidelity guard (its retries are counted under it).
pub const FIDELITY: &str = "loom.fidelity";

/// What a marker is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MarkerKind {
    /// An e-mail address.
    Email,
    /// A reference: 1 to 6 letters, `-` or `_`, 2 digits or more (`DEV-2041`, `FA_0042`).
    Reference,
    /// A date (`2026-03-12`, `12/03/2026`, `12.03.2026`).
    Date,
    /// An amount or number of 3 digits or more (thousand separators, decimals).
    Number,
}

/// One fact of the originals that a summary must keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    /// What it is.
    pub kind: MarkerKind,
    /// How it is compared (spacing and separators normalized).
    pub key: String,
    /// How it was written first (with an adjacent currency sign).
    pub text: String,
}

/// The markers a summary must keep, as the `_compaction` agent's guard reads them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fidelity {
    /// The markers of the summarized turns.
    pub markers: Vec<Marker>,
}

impl Fidelity {
    /// The markers of `originals`.
    pub fn of(originals: &str) -> Fidelity {
        Fidelity {
            markers: markers(originals),
        }
    }

    /// The markers `summary` lacks, as first written.
    pub fn missing(&self, summary: &str) -> Vec<String> {
        let found: BTreeSet<(MarkerKind, String)> = markers(summary)
            .into_iter()
            .map(|m| (m.kind, m.key))
            .collect();
        self.markers
            .iter()
            .filter(|m| !found.contains(&(m.kind, m.key.clone())))
            .map(|m| m.text.clone())
            .collect()
    }
}

/// The markers of `text`, each once (by kind and key), in the order they first appear.
pub fn markers(text: &str) -> Vec<Marker> {
    let chars: Vec<char> = text.chars().collect();
    let mut used = vec![false; chars.len()];
    let mut found: Vec<(usize, Marker)> = Vec::new();
    let passes: [(MarkerKind, Scan); 4] = [
        (MarkerKind::Email, email),
        (MarkerKind::Reference, reference),
        (MarkerKind::Date, date),
        (MarkerKind::Number, number),
    ];
    for (kind, scan) in passes {
        let mut i = 0;
        while i < chars.len() {
            if used[i] {
                i += 1;
                continue;
            }
            match scan(&chars, i) {
                Some((end, key)) if !used[i..end].iter().any(|u| *u) => {
                    used[i..end].iter_mut().for_each(|u| *u = true);
                    let text = shown(&chars, i, end, kind);
                    found.push((i, Marker { kind, key, text }));
                    i = end;
                }
                _ => i += 1,
            }
        }
    }
    found.sort_by_key(|(at, _)| *at);
    let mut seen = BTreeSet::new();
    found
        .into_iter()
        .map(|(_, m)| m)
        .filter(|m| seen.insert((m.kind, m.key.clone())))
        .collect()
}

/// A scanner: from `start`, the end of its marker and its key, if one starts there.
type Scan = fn(&[char], usize) -> Option<(usize, String)>;

/// Whether `start` begins a word (nothing alphanumeric right before it).
fn word_start(chars: &[char], start: usize) -> bool {
    start == 0 || !chars[start - 1].is_alphanumeric()
}

/// The end of the run of chars from `start` that satisfy `keep`.
fn run_of(chars: &[char], start: usize, keep: impl Fn(char) -> bool) -> usize {
    let mut end = start;
    while end < chars.len() && keep(chars[end]) {
        end += 1;
    }
    end
}

fn email(chars: &[char], start: usize) -> Option<(usize, String)> {
    let local = |c: char| c.is_ascii_alphanumeric() || "._%+-".contains(c);
    if !local(chars[start]) || (start > 0 && local(chars[start - 1])) {
        return None;
    }
    let at = run_of(chars, start, local);
    if at == start || chars.get(at) != Some(&'@') {
        return None;
    }
    let mut end = run_of(chars, at + 1, |c| {
        c.is_ascii_alphanumeric() || c == '.' || c == '-'
    });
    while end > at + 1 && chars[end - 1] == '.' {
        end -= 1;
    }
    let domain: String = chars[at + 1..end].iter().collect();
    if !domain.contains('.') || domain.starts_with('.') {
        return None;
    }
    Some((
        end,
        chars[start..end].iter().collect::<String>().to_lowercase(),
    ))
}

fn reference(chars: &[char], start: usize) -> Option<(usize, String)> {
    if !word_start(chars, start) {
        return None;
    }
    let letters = run_of(chars, start, |c| c.is_ascii_alphabetic());
    if !(1..=6).contains(&(letters - start)) {
        return None;
    }
    let separator = |c: char| c == '-' || c == '_';
    if !chars.get(letters).is_some_and(|c| separator(*c)) {
        return None;
    }
    let digits = run_of(chars, letters + 1, |c| c.is_ascii_digit());
    if digits - (letters + 1) < 2 {
        return None;
    }
    // Further groups: `DEV-2041-B`, `FA_2026_0042`.
    let mut end = digits;
    while chars.get(end).is_some_and(|c| separator(*c)) {
        let group = run_of(chars, end + 1, |c| c.is_ascii_alphanumeric());
        if group == end + 1 {
            break;
        }
        end = group;
    }
    if chars.get(end).is_some_and(|c| c.is_alphanumeric()) {
        return None;
    }
    let key = chars[start..end]
        .iter()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_uppercase();
    Some((end, key))
}

fn date(chars: &[char], start: usize) -> Option<(usize, String)> {
    if !word_start(chars, start) {
        return None;
    }
    let mut parts: Vec<String> = Vec::new();
    let mut separator = None;
    let mut at = start;
    loop {
        let end = run_of(chars, at, |c| c.is_ascii_digit());
        if end == at {
            return None;
        }
        parts.push(chars[at..end].iter().collect());
        at = end;
        if parts.len() == 3 {
            break;
        }
        let sep = *chars.get(at)?;
        if !"-/.".contains(sep) || separator.is_some_and(|s| s != sep) {
            return None;
        }
        separator = Some(sep);
        at += 1;
    }
    if chars.get(at).is_some_and(|c| c.is_alphanumeric()) {
        return None;
    }
    let (year, month, day) = match (parts[0].len(), parts[1].len(), parts[2].len()) {
        (4, 1..=2, 1..=2) => (&parts[0], &parts[1], &parts[2]),
        (1..=2, 1..=2, 4) => (&parts[2], &parts[1], &parts[0]),
        _ => return None,
    };
    let month: u32 = month.parse().ok()?;
    let day: u32 = day.parse().ok()?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    Some((at, format!("{year}-{month:02}-{day:02}")))
}

fn number(chars: &[char], start: usize) -> Option<(usize, String)> {
    if !chars[start].is_ascii_digit() || !word_start(chars, start) {
        return None;
    }
    let mut end = run_of(chars, start, |c| c.is_ascii_digit());
    while let Some(&sep) = chars.get(end) {
        let group_end = run_of(chars, end + 1, |c| c.is_ascii_digit());
        let group = group_end - (end + 1);
        if group == 0 {
            break;
        }
        let thousands_only = [' ', '\u{a0}', '\u{202f}', '\''].contains(&sep);
        let decimal_or_thousands = sep == ',' || sep == '.';
        if thousands_only && group == 3 {
            end = group_end;
        } else if decimal_or_thousands {
            end = group_end;
            if group != 3 {
                // Decimals end the number.
                break;
            }
        } else {
            break;
        }
    }
    let key: String = chars[start..end]
        .iter()
        .filter(|c| c.is_ascii_digit())
        .collect();
    (key.len() >= 3).then_some((end, key))
}

/// The marker as written, with the currency sign right before or after an amount.
fn shown(chars: &[char], start: usize, end: usize, kind: MarkerKind) -> String {
    let text: String = chars[start..end].iter().collect();
    if kind != MarkerKind::Number {
        return text;
    }
    let currency = |c: char| "€$£¥".contains(c);
    if chars.get(end).is_some_and(|c| currency(*c)) {
        return format!("{text}{}", chars[end]);
    }
    if chars.get(end) == Some(&' ') && chars.get(end + 1).is_some_and(|c| currency(*c)) {
        return format!("{text} {}", chars[end + 1]);
    }
    if start > 0 && currency(chars[start - 1]) {
        return format!("{}{text}", chars[start - 1]);
    }
    text
}

/// The request a summary that misses markers is sent back with.
fn feedback(missing: &[String]) -> String {
    format!(
        "The summary leaves out details of the exchanges it replaces: {}. Write the whole \
         summary again, and copy each of them exactly as written.",
        missing.join(", ")
    )
}

/// The `guard.checked` of the fidelity check.
fn checked(
    attempt: u32,
    outcome: &str,
    reason: Option<String>,
    resolution: Option<&str>,
) -> Payload {
    Payload::GuardChecked(GuardChecked {
        guard: "fidelity".into(),
        target: "output".into(),
        outcome: outcome.into(),
        reason,
        attempt: Some(attempt),
        normalized: false,
        resolution: resolution.map(str::to_owned),
        policy: Some(FIDELITY.into()),
        call_id: None,
    })
}

/// The fidelity guard on the final output of a `_compaction` run: passed, journaled; markers
/// missing, the summary goes back to its model once, naming them; missing again, the run
/// fails with `guard.fidelity`, naming them (the compaction then keeps the original turns).
pub(crate) async fn guard(
    io: &mut Io<'_>,
    fidelity: Option<&Fidelity>,
    state: &mut RunState,
    output: &Final,
) -> Result<Guarded, EngineError> {
    let Some(fidelity) = fidelity else {
        return Ok(Guarded::Pass);
    };
    let span = state.run_span_id.clone();
    let text = output
        .message
        .as_ref()
        .map(loom_core::Message::text)
        .unwrap_or_default();
    let missing = fidelity.missing(&text);
    let attempt = state.retries.get(FIDELITY).copied().unwrap_or(0);
    if missing.is_empty() {
        let passed = io.event(
            &span,
            None,
            None,
            checked(attempt + 1, "passed", None, None),
        );
        io.write(state, vec![passed]).await?;
        return Ok(Guarded::Pass);
    }
    let reason = format!("missing markers: {}", missing.join(", "));
    if attempt < 1 {
        let mut decided = hooks::decided(
            FIDELITY,
            Point::OnOutput,
            DecisionKind::Retry,
            Some(feedback(&missing)),
            None,
            false,
        );
        if let Payload::PolicyDecided(p) = &mut decided {
            p.attempt = Some(attempt + 1);
            p.tools = Some(false);
        }
        let batch = vec![
            io.event(
                &span,
                None,
                None,
                checked(attempt + 1, "failed", Some(reason), Some("retry")),
            ),
            io.event(&span, None, None, decided),
        ];
        io.write(state, batch).await?;
        return Ok(Guarded::Done);
    }
    let mut batch = vec![io.event(
        &span,
        None,
        None,
        checked(attempt + 1, "failed", Some(reason), Some("fail")),
    )];
    batch.extend(io.events().failure(
        state,
        "guard.checked",
        "guard.fidelity",
        &format!(
            "the summary leaves out markers of the turns it replaces ({}): the original turns \
             are kept",
            missing.join(", ")
        ),
    ));
    io.write(state, batch).await?;
    Ok(Guarded::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(text: &str) -> Vec<(MarkerKind, String, String)> {
        markers(text)
            .into_iter()
            .map(|m| (m.kind, m.key, m.text))
            .collect()
    }

    #[test]
    fn markers_are_amounts_dates_references_and_emails() {
        let found = keys(
            "Devis DEV-2041 du 12/03/2026 : 1 842,50 € TTC pour 12 postes, envoyé à \
             marie.dupont@exemple.fr (copie FA_2026_0042), total 1,842.50 $ ou 2026.",
        );
        assert_eq!(
            found,
            [
                (MarkerKind::Reference, "DEV2041".into(), "DEV-2041".into()),
                (MarkerKind::Date, "2026-03-12".into(), "12/03/2026".into()),
                (MarkerKind::Number, "184250".into(), "1 842,50 €".into()),
                (
                    MarkerKind::Email,
                    "marie.dupont@exemple.fr".into(),
                    "marie.dupont@exemple.fr".into()
                ),
                (
                    MarkerKind::Reference,
                    "FA20260042".into(),
                    "FA_2026_0042".into()
                ),
                (MarkerKind::Number, "2026".into(), "2026".into()),
            ],
            "1,842.50 is the amount already found; 12 has two digits"
        );
    }

    #[test]
    fn spacing_and_separators_do_not_count() {
        let fidelity =
            Fidelity::of("Order dev_2041 of 2026-03-12: 12 500 EUR, 3.14159, to A@B.io.");
        assert!(
            fidelity
                .missing("DEV-2041 (12.03.2026) 12500 EUR, 3,14159, a@b.io")
                .is_empty()
        );
        assert_eq!(
            fidelity.missing("DEV-2041 on 2026-03-13 for 12,500"),
            ["2026-03-12", "3.14159", "A@B.io"]
                .map(String::from)
                .to_vec(),
            "12,500 is 12 500; the 13th is not the 12th"
        );
    }

    #[test]
    fn phone_numbers_words_and_short_numbers_are_not_markers() {
        assert!(markers("Call 06 12 34 56 78 about item 42, version v2.3 or A4.").is_empty());
        assert_eq!(
            keys("REFERENCE-123"),
            [(MarkerKind::Number, "123".into(), "123".into())],
            "seven letters: not a reference, its number stays"
        );
    }
}
