//! Redaction: the patterns replaced in every text of a span before it leaves the process
//! (`telemetry.redaction.patterns`): API keys and bearer tokens (`secret`), e-mail addresses,
//! IBANs and phone numbers, and the deployment's own regular expressions. A match becomes
//! `[REDACTED:<name>]`.

use std::borrow::Cow;

use regex::Regex;

use crate::OtelError;

/// A redaction pattern, built in or the deployment's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// API keys of the usual providers (`sk-…`, `sk-ant-…`, `ghp_…`, `xox?-…`, `AKIA…`,
    /// `AIza…`) and `Bearer <token>`.
    Secret,
    /// E-mail addresses.
    Email,
    /// International bank account numbers, with or without spaces.
    Iban,
    /// Phone numbers: international (`+33 6 12 34 56 78`, `0044…`) and ten-digit national
    /// numbers starting with 0 (`06 12 34 56 78`).
    Phone,
    /// A named regular expression.
    Custom {
        /// Shown in the replacement.
        name: String,
        /// The regular expression (Rust `regex` syntax).
        regex: String,
    },
}

const SECRET: &str = r"\b(?:sk-(?:ant-)?[A-Za-z0-9_-]{16,}|ghp_[A-Za-z0-9]{30,}|xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|AIza[0-9A-Za-z_-]{35})|(?i:bearer)\s+[A-Za-z0-9._~+/-]{16,}=*";
const EMAIL: &str = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}";
const IBAN: &str = r"\b[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b";
const PHONE: &str =
    r"(?:\+|\b00)[0-9]{1,3}(?:[ .-]?\(?[0-9]{1,4}\)?){2,5}[0-9]\b|\b0[0-9](?:[ .-]?[0-9]{2}){4}\b";

impl Pattern {
    /// The built-in pattern named `name` (`secret`, `email`, `iban`, `phone`).
    pub fn named(name: &str) -> Option<Pattern> {
        match name {
            "secret" => Some(Pattern::Secret),
            "email" => Some(Pattern::Email),
            "iban" => Some(Pattern::Iban),
            "phone" => Some(Pattern::Phone),
            _ => None,
        }
    }

    /// Its name, as the replacement shows it.
    pub fn name(&self) -> &str {
        match self {
            Pattern::Secret => "secret",
            Pattern::Email => "email",
            Pattern::Iban => "iban",
            Pattern::Phone => "phone",
            Pattern::Custom { name, .. } => name,
        }
    }

    fn regex(&self) -> &str {
        match self {
            Pattern::Secret => SECRET,
            Pattern::Email => EMAIL,
            Pattern::Iban => IBAN,
            Pattern::Phone => PHONE,
            Pattern::Custom { regex, .. } => regex,
        }
    }
}

/// Compiled redaction patterns, applied in order (secrets, then e-mails, IBANs and phone
/// numbers, so that the digits of an IBAN are not taken for a phone number).
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    patterns: Vec<(Regex, String)>,
}

impl Redactor {
    /// Compiles `patterns`; the built-in ones are applied first, in the order above, then the
    /// custom ones in the order given.
    pub fn new(patterns: &[Pattern]) -> Result<Redactor, OtelError> {
        let rank = |pattern: &Pattern| match pattern {
            Pattern::Secret => 0,
            Pattern::Email => 1,
            Pattern::Iban => 2,
            Pattern::Phone => 3,
            Pattern::Custom { .. } => 4,
        };
        let mut ordered: Vec<&Pattern> = patterns.iter().collect();
        ordered.sort_by_key(|pattern| rank(pattern));
        let patterns = ordered
            .into_iter()
            .map(|pattern| {
                Regex::new(pattern.regex())
                    .map(|regex| (regex, format!("[REDACTED:{}]", pattern.name())))
                    .map_err(|error| OtelError::Pattern {
                        name: pattern.name().to_owned(),
                        reason: error.to_string(),
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Redactor { patterns })
    }

    /// `text` with every match replaced.
    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(text);
        for (regex, replacement) in &self.patterns {
            if let Cow::Owned(replaced) = regex.replace_all(&text, replacement.as_str()) {
                text = Cow::Owned(replaced);
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> Redactor {
        let mut patterns: Vec<Pattern> = ["phone", "iban", "email", "secret"]
            .iter()
            .filter_map(|name| Pattern::named(name))
            .collect();
        patterns.push(Pattern::Custom {
            name: "dossier".into(),
            regex: r"DOS-[0-9]{6}".into(),
        });
        Redactor::new(&patterns).unwrap()
    }

    #[test]
    fn emails_are_redacted() {
        let out = all().redact("écrire à jean.dupont+devis@exemple.co.uk, merci");
        assert_eq!(out, "écrire à [REDACTED:email], merci");
    }

    #[test]
    fn ibans_are_redacted_with_or_without_spaces() {
        let redactor = all();
        assert_eq!(
            redactor.redact("IBAN FR76 3000 6000 0112 3456 7890 189 ok"),
            "IBAN [REDACTED:iban] ok"
        );
        assert_eq!(
            redactor.redact("de:DE89370400440532013000."),
            "de:[REDACTED:iban]."
        );
    }

    #[test]
    fn phone_numbers_are_redacted() {
        let redactor = all();
        assert_eq!(
            redactor.redact("appelez le +33 6 12 34 56 78 ou le 06.12.34.56.78"),
            "appelez le [REDACTED:phone] ou le [REDACTED:phone]"
        );
        assert_eq!(
            redactor.redact("tel 0044 20 7946 0958"),
            "tel [REDACTED:phone]"
        );
    }

    #[test]
    fn api_keys_and_bearer_tokens_are_redacted() {
        let redactor = all();
        assert_eq!(
            redactor.redact("key=sk-ant-api03-abcdefghijklmnop1234 end"),
            "key=[REDACTED:secret] end"
        );
        assert_eq!(
            redactor.redact("Authorization: Bearer abcdefghijklmnopqrstuvwxyz"),
            "Authorization: [REDACTED:secret]"
        );
        assert_eq!(redactor.redact("AKIAIOSFODNN7EXAMPLE"), "[REDACTED:secret]");
    }

    #[test]
    fn custom_patterns_apply_after_the_built_in_ones() {
        assert_eq!(
            all().redact("dossier DOS-123456 suivi"),
            "dossier [REDACTED:dossier] suivi"
        );
    }

    #[test]
    fn ordinary_text_and_numbers_stay() {
        let redactor = all();
        for text in [
            "12 × 7 + 3 = 87",
            "total 1234.56 EUR, 3 articles",
            "run 01a2272b-2a46-75bb-bb32-13148c9b02a6",
            "version 2026-11-29",
        ] {
            assert_eq!(redactor.redact(text), text, "{text}");
        }
    }

    #[test]
    fn only_the_chosen_patterns_apply() {
        let redactor = Redactor::new(&[Pattern::Email]).unwrap();
        assert_eq!(
            redactor.redact("a@b.fr +33 6 12 34 56 78"),
            "[REDACTED:email] +33 6 12 34 56 78"
        );
        assert_eq!(Redactor::default().redact("a@b.fr"), "a@b.fr");
    }

    #[test]
    fn a_bad_custom_pattern_is_named() {
        let error = Redactor::new(&[Pattern::Custom {
            name: "x".into(),
            regex: "(".into(),
        }])
        .unwrap_err();
        assert!(
            error.to_string().starts_with("redaction pattern 'x':"),
            "{error}"
        );
    }
}
