//! `triggers`, `tenants[].quotas` and `security.api_keys[].rate_limit`: read, checked where
//! written, and trigger templates rendered over a payload.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{load_str, no_env, refused};
use loom_config::{ConfigErrorKind, Quotas, RateLimit, RenderedTrigger};
use serde_json::json;

const ROOT: &str = "\
version: 1
models:
  - id: fake-1
    sdk: fake
    model: scripted
agents:
  - name: support
    main: {model: fake-1}
";

const HASH: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn triggers_quotas_and_rate_limits_are_read() {
    let root = format!(
        "{ROOT}triggers:
  - name: orders
    agent: support
    message: \"Order {{{{ payload.order.id }}}} from {{{{ payload.customer }}}} ({{{{ trigger }}}})\"
    session: \"customer-{{{{ payload.customer }}}}\"
    delivery_header: X-Delivery-Id
    secret_env: ORDERS_HOOK_SECRET
    signature_tolerance: 120
    tenant: acme
  - name: ping
    agent: support
    message: Ping
tenants:
  - id: acme
    quotas: {{runs_per_minute: 30}}
  - id: beta
security:
  api_keys:
    - {{id: k1, hash: \"{HASH}\", tenant: acme, rate_limit: {{per_minute: 120}}}}
"
    );
    let config = load_str(&root, &[], None, &no_env).unwrap();
    let names: Vec<&str> = config.triggers().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["orders", "ping"]);
    let orders = config.trigger("orders").unwrap();
    assert_eq!(orders.delivery_header.as_deref(), Some("X-Delivery-Id"));
    assert_eq!(orders.secret_env.as_deref(), Some("ORDERS_HOOK_SECRET"));
    assert_eq!(orders.signature_tolerance, 120);
    assert_eq!(orders.signed_tenant(), Some("acme"));
    let ping = config.trigger("ping").unwrap();
    assert_eq!(
        (
            ping.secret_env.as_deref(),
            ping.signature_tolerance,
            ping.signed_tenant()
        ),
        (None, loom_config::DEFAULT_SIGNATURE_TOLERANCE, None)
    );
    assert!(config.trigger("nope").is_none());
    assert_eq!(
        config.tenant("acme").unwrap().quotas,
        Some(Quotas {
            runs_per_minute: Some(30)
        })
    );
    assert_eq!(config.tenant("beta").unwrap().quotas, None);
    assert_eq!(
        config.raw().security.api_keys[0].rate_limit,
        Some(RateLimit { per_minute: 120 })
    );

    let payload = json!({"order": {"id": 42}, "customer": "martin"});
    assert_eq!(
        config
            .render_trigger("orders", &payload, Some("d-1"))
            .unwrap(),
        RenderedTrigger {
            message: "Order 42 from martin (orders)".into(),
            session: Some("customer-martin".into()),
        }
    );
    assert_eq!(
        config.render_trigger("ping", &json!(null), None).unwrap(),
        RenderedTrigger {
            message: "Ping".into(),
            session: None,
        }
    );
    // Strict: a field missing from the payload is an error at the template's key.
    let missing = config
        .render_trigger("orders", &json!({"customer": "martin"}), None)
        .unwrap_err();
    assert_eq!(missing.kind, ConfigErrorKind::Template);
    assert_eq!(missing.key_path, "triggers[0].message");
    assert!(
        missing.message.starts_with("cannot render the template: "),
        "{missing}"
    );
    let unknown = config.render_trigger("nope", &json!({}), None).unwrap_err();
    assert_eq!(unknown.kind, ConfigErrorKind::Reference);
}

#[test]
fn trigger_refusals_are_located() {
    let trigger = |body: &str| format!("{ROOT}triggers:\n  - {body}\n");
    let cases: Vec<(String, &str)> = vec![
        (
            trigger("{name: Orders, agent: support, message: hi}"),
            "loom.yaml:10:12 triggers[0].name: invalid trigger name 'Orders' (expected ^[a-z0-9][a-z0-9_-]{0,63}$)",
        ),
        (
            format!(
                "{ROOT}triggers:\n  - {{name: a, agent: support, message: hi}}\n  - {{name: a, agent: support, message: ho}}\n"
            ),
            "loom.yaml:11:12 triggers[1].name: duplicate trigger name 'a' (already declared at triggers[0])",
        ),
        (
            trigger("{name: a, agent: nobody, message: hi}"),
            "loom.yaml:10:22 triggers[0].agent: unknown agent 'nobody' (declared agents: support)",
        ),
        (
            trigger("{name: a, agent: support, message: \" \"}"),
            "loom.yaml:10:40 triggers[0].message: must not be empty",
        ),
        (
            trigger("{name: a, agent: support, message: \"{{ payload.x \"}"),
            "loom.yaml:10:40 triggers[0].message: template syntax error: unexpected end of input, expected end of variable block",
        ),
        (
            trigger("{name: a, agent: support, message: \"{{ customer }}\"}"),
            "loom.yaml:10:40 triggers[0].message: unknown template variable 'customer' (known variables: payload, trigger, delivery)",
        ),
        (
            trigger("{name: a, agent: support, message: hi, session: \"{% if %}\"}"),
            "loom.yaml:10:53 triggers[0].session: template syntax error: unexpected end of block",
        ),
        (
            trigger("{name: a, agent: support, message: hi, delivery_header: \"X Delivery\"}"),
            "loom.yaml:10:61 triggers[0].delivery_header: 'X Delivery' is not a usable HTTP header name",
        ),
        (
            trigger("{name: a, agent: support}"),
            "loom.yaml:10:5 triggers[0].message: missing required key 'message'",
        ),
        (
            trigger("{name: a, agent: support, message: hi, tenant: default}"),
            "loom.yaml:10:52 triggers[0].tenant: names the tenant of signed deliveries and needs secret_env; an unsigned delivery takes the tenant of the caller's API key",
        ),
        (
            trigger("{name: a, agent: support, message: hi, secret_env: S, tenant: acme}"),
            "loom.yaml:10:67 triggers[0].tenant: tenant 'acme' is not declared (without a 'tenants' list, only 'default' exists)",
        ),
        (
            format!(
                "{ROOT}tenants:\n  - {{id: acme}}\ntriggers:\n  - {{name: a, agent: support, message: hi, secret_env: S}}\n"
            ),
            "loom.yaml:12:56 triggers[0].secret_env: tenant 'default' is not declared (tenants: acme) (signed deliveries run in it: set tenant)",
        ),
        (
            trigger("{name: a, agent: support, message: hi, secret_env: \"orders-secret\"}"),
            "loom.yaml:10:56 triggers[0].secret_env: 'orders-secret' is not an environment variable name (expected [A-Za-z_][A-Za-z0-9_]*)",
        ),
        (
            trigger(
                "{name: a, agent: support, message: hi, secret_env: S, signature_tolerance: 0}",
            ),
            "loom.yaml:10:80 triggers[0].signature_tolerance: must be greater than 0",
        ),
        (
            format!("{ROOT}tenants:\n  - {{id: acme, quotas: {{runs_per_minute: 0}}}}\n"),
            "loom.yaml:10:42 tenants[0].quotas.runs_per_minute: must be greater than 0",
        ),
        (
            format!("{ROOT}tenants:\n  - {{id: acme, quotas: {{runs_per_hour: 3}}}}\n"),
            "loom.yaml:10:25 tenants[0].quotas.runs_per_hour: unknown key 'runs_per_hour'",
        ),
        (
            format!(
                "{ROOT}security:\n  api_keys:\n    - {{id: k, hash: \"{HASH}\", rate_limit: {{per_minute: 0}}}}\n"
            ),
            "loom.yaml:11:121 security.api_keys[0].rate_limit.per_minute: must be greater than 0",
        ),
    ];
    let mut wrong = Vec::new();
    for (root, expected) in cases {
        let message = refused(&root, &[]);
        if !message.starts_with(expected) {
            wrong.push(format!("expected: {expected}\n     got: {message}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
