//! [`YamlDocument`]: a YAML file other than the configuration (an evaluation suite, for
//! instance) read the way the configuration is, so its errors name the file, the line and
//! column, and the key path of the bad value.

use std::path::PathBuf;

use serde::de::DeserializeOwned;

use crate::{
    config::Doc,
    error::{ConfigError, ConfigErrorKind},
    yaml::KeyPath,
};

/// A parsed YAML document that keeps the location of every key and value.
///
/// Duplicate keys are refused when it is parsed; [`YamlDocument::typed`] deserializes it and
/// locates what serde refuses (unknown key, missing key, wrong type);
/// [`YamlDocument::error_at`] locates the errors found afterwards by the reader's own checks.
#[derive(Debug, Clone)]
pub struct YamlDocument {
    doc: Doc,
}

impl YamlDocument {
    /// Parses `text`; `display` is the file name shown in errors.
    pub fn parse(text: &str, display: impl Into<PathBuf>) -> Result<YamlDocument, ConfigError> {
        let mut doc = Doc::parse(text, display.into())?;
        doc.without_config_hints();
        Ok(YamlDocument { doc })
    }

    /// The document deserialized as `T`, an error naming the bad key's location otherwise.
    pub fn typed<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        self.doc.typed()
    }

    /// An error located at the value under `key_path` (such as `cases[1].expect.matches[0]`),
    /// or at its deepest existing ancestor.
    pub fn error_at(
        &self,
        key_path: &str,
        kind: ConfigErrorKind,
        message: impl Into<String>,
    ) -> ConfigError {
        self.doc.error(&KeyPath::parse(key_path), kind, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Suite {
        name: String,
        cases: Vec<Case>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Case {
        name: String,
    }

    #[test]
    fn an_unknown_key_is_located_without_configuration_hints() {
        let text = "name: s\ncases:\n  - name: a\n  - name: b\n    tool_sources: 1\n";
        let doc = YamlDocument::parse(text, "suite.yaml").unwrap();
        let error = doc.typed::<Suite>().unwrap_err();
        assert_eq!(error.kind, ConfigErrorKind::UnknownKey);
        assert_eq!(error.key_path, "cases[1].tool_sources");
        assert_eq!(error.line, Some(5));
        assert!(!error.message.contains("not implemented"), "{error}");
    }

    #[test]
    fn a_later_check_is_located_at_its_key_path() {
        let text = "name: s\ncases:\n  - name: a\n  - name: b\n";
        let doc = YamlDocument::parse(text, "suite.yaml").unwrap();
        let error = doc.error_at("cases[1].name", ConfigErrorKind::Invalid, "bad");
        assert_eq!(error.to_string(), "suite.yaml:4:11 cases[1].name: bad");
    }
}
