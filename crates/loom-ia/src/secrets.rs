//! Secrets: the one place where the facade reads a credential the configuration names.
//!
//! A secret name is what the configuration writes where a credential goes (a model's
//! `api_key_env`, an MCP server's `headers_env` and `env_from` values). For a tenant that
//! redirects the name (`tenants[].secrets`), its value is read from the tenant's own variable or
//! file; otherwise from the variable of that name, as always. Every read goes through
//! [`crate::env`] (the process environment, then the env file).
//!
//! A value is never journaled, never logged and never put in an error: errors name the secret,
//! the tenant and where the value was looked for.

use std::{io::Read, path::Path};

use loom_config::{Config, SecretSource};

use crate::LoomError;

/// Largest secret file read (`{file: path}`), in bytes.
pub(crate) const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// The value of the secret `name` for `tenant`'s runs: the tenant's own source when it
/// redirects the name, else the variable `name`. `Ok(None)` when it is absent or empty; an
/// error when a secret file cannot be read (naming the secret, the tenant and the file).
pub(crate) fn secret(
    config: &Config,
    tenant: &str,
    name: &str,
) -> Result<Option<String>, LoomError> {
    let value = match config.tenant_secret(tenant, name) {
        None => crate::env::var(config, name),
        Some(SecretSource::Env(variable)) => crate::env::var(config, variable),
        Some(SecretSource::File { file }) => {
            let path = config.base_dir().join(file);
            Some(read_file(&path).map_err(|problem| {
                LoomError::from(config.error_at_root(
                    &tenant_key(config, tenant, name),
                    format!(
                        "tenant '{tenant}': cannot read the secret {name} from {}: {problem}",
                        path.display()
                    ),
                ))
            })?)
        }
    };
    Ok(value.filter(|v| !v.is_empty()))
}

/// The value of the secret `name` for `tenant`, which must be set: absent or empty, it is a
/// configuration error located at `key` (the place that names it) or, when the tenant
/// redirects it, at the tenant's `secrets.<name>`.
#[cfg(any(feature = "mcp", feature = "anthropic", feature = "openai"))]
pub(crate) fn required(
    config: &Config,
    tenant: &str,
    name: &str,
    key: &str,
) -> Result<String, LoomError> {
    if let Some(value) = secret(config, tenant, name)? {
        return Ok(value);
    }
    let error = match config.tenant_secret(tenant, name) {
        None => config.error_at_root(
            key,
            format!("the environment variable {name} is absent or empty"),
        ),
        Some(source) => config.error_at_root(
            &tenant_key(config, tenant, name),
            format!(
                "tenant '{tenant}': the secret {name} ({key}) is absent or empty where the tenant \
                 keeps it ({source})"
            ),
        ),
    };
    Err(error.into())
}

/// Whether `tenant` reads any of `names` from its own source.
#[cfg(feature = "mcp")]
pub(crate) fn redirects<'a>(
    config: &Config,
    tenant: &str,
    mut names: impl Iterator<Item = &'a String>,
) -> bool {
    names.any(|name| config.tenant_secret(tenant, name).is_some())
}

/// `tenants[i].secrets.<name>` of `tenant`.
fn tenant_key(config: &Config, tenant: &str, name: &str) -> String {
    let index = config
        .raw()
        .tenants
        .iter()
        .position(|t| t.id == tenant)
        .unwrap_or(0);
    format!("tenants[{index}].secrets.{name}")
}

/// A secret file: a regular file of at most [`MAX_SECRET_FILE_BYTES`], UTF-8, trimmed. The
/// problem never quotes the content.
fn read_file(path: &Path) -> Result<String, String> {
    let meta = std::fs::metadata(path).map_err(|e| e.kind().to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_SECRET_FILE_BYTES {
        return Err(format!("larger than {} KiB", MAX_SECRET_FILE_BYTES / 1024));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(MAX_SECRET_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| e.kind().to_string())?;
    if bytes.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(format!("larger than {} KiB", MAX_SECRET_FILE_BYTES / 1024));
    }
    let text = String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())?;
    Ok(text.trim().to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config(dir: &Path, tenants: &str) -> Config {
        std::fs::write(
            dir.join("loom.yaml"),
            format!(
                "version: 1\nmodels:\n  - {{id: fake-1, sdk: fake, model: m}}\nmcp_servers:\n  - name: crm\n    transport: http\n    url: http://127.0.0.1:9/mcp\n    scope: tenant\n    headers_env: {{Authorization: LOOM_SECRETS_TEST_CRM}}\nagents:\n  - {{name: a, main: {{model: fake-1}}}}\ntenants:\n{tenants}"
            ),
        )
        .unwrap();
        loom_config::load(&dir.join("loom.yaml"), None, &|_| None).unwrap()
    }

    #[test]
    fn a_tenant_reads_its_secret_from_its_own_file_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("keys")).unwrap();
        std::fs::write(dir.path().join("keys/martin"), "Bearer m-token\n").unwrap();
        let config = config(
            dir.path(),
            "  - id: martin\n    secrets: {LOOM_SECRETS_TEST_CRM: {file: keys/martin}}\n  - id: dupont\n    secrets: {LOOM_SECRETS_TEST_CRM: {file: keys/none}}\n",
        );
        assert_eq!(
            secret(&config, "martin", "LOOM_SECRETS_TEST_CRM").unwrap(),
            Some("Bearer m-token".to_owned())
        );
        let missing = secret(&config, "dupont", "LOOM_SECRETS_TEST_CRM")
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("tenants[1].secrets.LOOM_SECRETS_TEST_CRM: tenant 'dupont': cannot read the secret LOOM_SECRETS_TEST_CRM from"),
            "{missing}"
        );
        assert!(missing.contains("not found"), "{missing}");
    }

    #[test]
    fn a_secret_file_too_large_or_not_a_file_is_refused_without_its_content() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("big"), "s3cret".repeat(20_000)).unwrap();
        std::fs::create_dir(dir.path().join("folder")).unwrap();
        let config = config(
            dir.path(),
            "  - id: big\n    secrets: {LOOM_SECRETS_TEST_CRM: {file: big}}\n  - id: folder\n    secrets: {LOOM_SECRETS_TEST_CRM: {file: folder}}\n",
        );
        let big = secret(&config, "big", "LOOM_SECRETS_TEST_CRM")
            .unwrap_err()
            .to_string();
        assert!(big.ends_with("larger than 64 KiB"), "{big}");
        assert!(!big.contains("s3cret"), "{big}");
        let folder = secret(&config, "folder", "LOOM_SECRETS_TEST_CRM")
            .unwrap_err()
            .to_string();
        assert!(folder.ends_with("not a regular file"), "{folder}");
    }

    #[cfg(any(feature = "mcp", feature = "anthropic", feature = "openai"))]
    #[test]
    fn an_absent_secret_names_where_the_tenant_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let config = config(
            dir.path(),
            "  - id: martin\n    secrets: {LOOM_SECRETS_TEST_CRM: LOOM_SECRETS_TEST_ABSENT}\n  - id: dupont\n",
        );
        let error = required(
            &config,
            "martin",
            "LOOM_SECRETS_TEST_CRM",
            "mcp_servers[0].headers_env.Authorization",
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("tenant 'martin': the secret LOOM_SECRETS_TEST_CRM (mcp_servers[0].headers_env.Authorization) is absent or empty where the tenant keeps it (env LOOM_SECRETS_TEST_ABSENT)"),
            "{error}"
        );
        // A tenant that does not redirect the name reads the variable of that name.
        let plain = required(&config, "dupont", "LOOM_SECRETS_TEST_CRM", "k")
            .unwrap_err()
            .to_string();
        assert!(
            plain.contains("the environment variable LOOM_SECRETS_TEST_CRM is absent or empty"),
            "{plain}"
        );
    }
}
