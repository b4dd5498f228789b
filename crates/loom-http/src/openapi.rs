//! The OpenAPI 3.1 document of the API, generated from the code, and its interactive page.
//!
//! The document is built by `utoipa-axum`'s `OpenApiRouter` from the same `routes!` calls that
//! build the router (see `routes::v1`), so a route and its description cannot part: a handler
//! without a `#[utoipa::path]` annotation does not compile into `routes!`.
//!
//! **Where the schemas come from.** Types that exist only for HTTP (request bodies, the small
//! answers of `approve`/`cancel`, the error body) derive `utoipa::ToSchema` here, beside the
//! serde attributes they describe. The facade's types (`RunResult` and the types it contains:
//! messages, blocks, tool outputs, usage, pending approvals) derive `schemars::JsonSchema`
//! where they are defined, from the same serde attributes as their JSON, so their schema is
//! written once and cannot drift from what is sent; utoipa stays out of `loom-core` and the
//! engine. Handlers name them through a marker ([`schemars_schema!`]): utoipa writes a `$ref`
//! to `#/components/schemas/<Name>`, and [`document`] writes the schemars JSON Schema there
//! verbatim (draft 2020-12, the dialect of OpenAPI 3.1, for the *serialize* contract). It is
//! not read into utoipa's schema model on the way: that model is narrower than JSON Schema
//! (no `const`, no boolean schemas, and an untagged enum that reads a full object schema back
//! as `{"type": "object"}`), so a serde conversion would silently weaken the document.
//!
//! **Masked answers.** Without `read_content`, a read loses its content fields and gains
//! `redacted` ([`loom_ia::Redact`]). The schemas of the redactable types are therefore
//! relaxed when the document is written: `redacted` is declared and every content field of
//! [`loom_ia::redact`] (nested ones too) is dropped from `required`, so a masked answer
//! validates against the same schema as a whole one.
//!
//! Served at `<base_path>/openapi.json` and `<base_path>/docs` (Scalar; the page loads its
//! script from a CDN in the browser, nothing is fetched at build time), without a key, unless
//! the profile is `prod` or `server.http.docs` is `false` (`docs: true` serves them in `prod`).

use std::borrow::Cow;

use axum::{
    Json, Router,
    response::{Html, IntoResponse},
    routing::get,
};
use schemars::{
    JsonSchema,
    generate::{SchemaGenerator, SchemaSettings},
};
use serde::Serialize;
use serde_json::{Map, Value};
use utoipa::{
    Modify, OpenApi, ToSchema,
    openapi::{
        self, RefOr,
        schema::Schema,
        security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme},
    },
};

/// The name of the bearer security scheme (`Authorization: Bearer lk_…`), named by every
/// handler's `security(...)`.
const BEARER: &str = "bearer";
/// The name of the header security scheme (`X-API-Key: lk_…`).
const API_KEY: &str = "api_key";

/// The document's fixed part: info, tags and security schemes; `routes::v1` adds the paths.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Loom REST API",
        description = "Run Loom agents over HTTP: synchronous or background runs, their results, \
their events as Server-Sent Events, approvals and cancellation, the run list, the event \
search, traces, sessions and webhooks. Every error is JSON `{\"error\": {\"kind\", \
\"message\"}}` with a stable `kind`. Without the scope `read_content`, reads lose their \
content fields and list them in `redacted`: the document requires no content field.",
    ),
    tags(
        (name = "agents", description = "The agents the caller may run."),
        (name = "runs", description = "Runs: open, list, read, follow, decide, cancel."),
        (name = "journal", description = "The journal read across a tenant: the event search \
and a run's trace."),
        (name = "sessions", description = "Sessions: list, read, their journal, files and \
report, and GDPR erasure."),
        (name = "webhooks", description = "Deliveries to the configuration's `triggers`, \
each opening a background run."),
        (name = "operations", description = "Liveness and readiness, for load balancers and \
orchestrators."),
    ),
    modifiers(&Security),
)]
pub(crate) struct ApiDoc;

/// Declares the API-key schemes.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut openapi::OpenApi) {
        let components = openapi
            .components
            .get_or_insert_with(openapi::Components::new);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("lk_…")
                    .description(Some(
                        "An API key of `security.api_keys` in `Authorization: Bearer <key>`.",
                    ))
                    .build(),
            ),
        );
        components.add_security_scheme(
            API_KEY,
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-API-Key",
                "An API key of `security.api_keys` in the `X-API-Key` header.",
            ))),
        );
    }
}

/// The finished document: the paths of `api` under the fixed part; when no key is declared
/// (the API is open), an empty requirement added to every operation so the document says a
/// request without a key is served, and the `403` of a refused `Host` or `Origin`; when keys
/// are declared, the `401` every operation can answer (written here once rather than on each
/// handler).
pub(crate) fn finish(mut api: openapi::OpenApi, open: bool) -> openapi::OpenApi {
    api.openapi = openapi::OpenApiVersion::Version31;
    const BROWSERS: &str = "The API is open and the request's `Host` is not in \
`server.http.allowed_hosts` (`host_not_allowed`), or its `Origin` is another site's, not in \
`server.http.allowed_origins` (`origin_not_allowed`).";
    for item in api.paths.paths.values_mut() {
        for operation in operations(item) {
            // Liveness and readiness take no key: nothing a key could cause applies.
            if operation
                .tags
                .as_ref()
                .is_some_and(|tags| tags.iter().any(|tag| tag == "operations"))
            {
                continue;
            }
            if open {
                if let Some(security) = &mut operation.security {
                    security.insert(0, openapi::security::SecurityRequirement::default());
                }
                match operation.responses.responses.get_mut("403") {
                    Some(RefOr::T(response)) => {
                        response.description = format!("{} Or: {BROWSERS}", response.description);
                    }
                    Some(RefOr::Ref(_)) => {}
                    None => {
                        operation
                            .responses
                            .responses
                            .insert("403".to_owned(), RefOr::T(error_response(BROWSERS)));
                    }
                }
            } else {
                operation.responses.responses.insert(
                    "401".to_owned(),
                    RefOr::T(unauthorized(
                        "The key is missing, unknown or expired (`missing_key`, `unknown_key`, \
`expired_key`).",
                    )),
                );
            }
        }
    }
    api
}

/// A `401` with the error body and the `WWW-Authenticate` challenge every `401` carries.
fn unauthorized(description: &str) -> openapi::Response {
    let challenge = openapi::HeaderBuilder::new()
        .schema(Some(
            openapi::ObjectBuilder::new()
                .schema_type(openapi::schema::SchemaType::new(openapi::Type::String))
                .enum_values(Some([crate::error::CHALLENGE])),
        ))
        .description(Some(
            "`Bearer`: the scheme to send the key with (`Authorization: Bearer <key>`).",
        ))
        .build();
    let mut response = error_response(description);
    response
        .headers
        .insert("WWW-Authenticate".to_owned(), RefOr::T(challenge));
    response
}

/// A response with the error body.
fn error_response(description: &str) -> openapi::Response {
    openapi::ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            openapi::ContentBuilder::new()
                .schema(Some(openapi::Ref::from_schema_name(
                    <ErrorBody as utoipa::ToSchema>::name(),
                )))
                .build(),
        )
        .build()
}

/// Lists the `delivery_header` of each trigger of the configuration as an optional header of
/// `POST <prefix>/hooks/{name}` (the header names come from the configuration, so the
/// document is built for it).
pub(crate) fn delivery_headers(
    api: &mut openapi::OpenApi,
    prefix: &str,
    triggers: &[loom_ia::config::TriggerSpec],
) {
    let mut headers: Vec<(String, Vec<&str>)> = Vec::new();
    for trigger in triggers {
        let Some(header) = &trigger.delivery_header else {
            continue;
        };
        match headers
            .iter_mut()
            .find(|(known, _)| known.eq_ignore_ascii_case(header))
        {
            Some((_, names)) => names.push(&trigger.name),
            None => headers.push((header.clone(), vec![&trigger.name])),
        }
    }
    let Some(operation) = api
        .paths
        .paths
        .get_mut(&format!("{prefix}/hooks/{{name}}"))
        .and_then(|item| item.post.as_mut())
    else {
        return;
    };
    for (header, names) in headers {
        let names = names
            .iter()
            .map(|name| format!("`{name}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let parameter = openapi::path::ParameterBuilder::new()
            .name(header)
            .parameter_in(openapi::path::ParameterIn::Header)
            .required(openapi::Required::False)
            .description(Some(format!(
                "The delivery id of the triggers {names} (their `delivery_header`): it becomes \
the run id, so a redelivery answers the run of the first (`200`, `repeated`). Blank: none."
            )))
            .schema(Some(openapi::ObjectBuilder::new().schema_type(
                openapi::schema::SchemaType::new(openapi::Type::String),
            )))
            .build();
        operation
            .parameters
            .get_or_insert_with(Vec::new)
            .push(RefOr::T(parameter));
    }
}

/// Lists the signature headers of `POST <prefix>/hooks/{name}` (`X-Loom-Timestamp`,
/// `X-Loom-Signature`) when a trigger of the configuration declares a `secret_env`, naming those
/// triggers, and the `401` `invalid_signature` their deliveries can answer; the operation then
/// also takes a request without a key (an empty security requirement), since a signed delivery
/// is authenticated by its signature.
pub(crate) fn signature_headers(
    api: &mut openapi::OpenApi,
    prefix: &str,
    triggers: &[loom_ia::config::TriggerSpec],
) {
    let signed: Vec<String> = triggers
        .iter()
        .filter(|trigger| trigger.secret_env.is_some())
        .map(|trigger| format!("`{}`", trigger.name))
        .collect();
    if signed.is_empty() {
        return;
    }
    let Some(operation) = api
        .paths
        .paths
        .get_mut(&format!("{prefix}/hooks/{{name}}"))
        .and_then(|item| item.post.as_mut())
    else {
        return;
    };
    let security = operation.security.get_or_insert_with(Vec::new);
    let anonymous = openapi::security::SecurityRequirement::default();
    if !security.contains(&anonymous) {
        security.push(anonymous);
    }
    let names = signed.join(", ");
    let timestamp = format!(
        "The triggers {names} (their `secret_env`): the Unix time of the delivery in seconds, \
within the trigger's `signature_tolerance` of the server's clock."
    );
    let signature = format!(
        "The triggers {names}: `v1=` and the lowercase hex HMAC-SHA256, keyed by the trigger's \
secret, of `<X-Loom-Timestamp>.<raw body>` (several comma-separated `v1=` entries while a secret \
is rotated)."
    );
    for (header, description) in [
        (crate::hooks::TIMESTAMP_HEADER, timestamp),
        (crate::hooks::SIGNATURE_HEADER, signature),
    ] {
        let parameter = openapi::path::ParameterBuilder::new()
            .name(header)
            .parameter_in(openapi::path::ParameterIn::Header)
            .required(openapi::Required::False)
            .description(Some(description))
            .schema(Some(openapi::ObjectBuilder::new().schema_type(
                openapi::schema::SchemaType::new(openapi::Type::String),
            )))
            .build();
        operation
            .parameters
            .get_or_insert_with(Vec::new)
            .push(RefOr::T(parameter));
    }
    const UNSIGNED: &str = "A delivery to a trigger with a `secret_env` is not signed, is \
signed wrongly or too long ago (`invalid_signature`).";
    match operation.responses.responses.get_mut("401") {
        Some(RefOr::T(response)) => {
            response.description = format!("{} Or: {UNSIGNED}", response.description);
        }
        Some(RefOr::Ref(_)) => {}
        None => {
            operation
                .responses
                .responses
                .insert("401".to_owned(), RefOr::T(unauthorized(UNSIGNED)));
        }
    }
}

/// When a key of the configuration has a `rate_limit`, every operation can answer `429`
/// (`rate_limited`, with `Retry-After`): added where an operation has no `429` yet, and said in
/// the description of those that have one (a tenant budget or quota).
pub(crate) fn rate_limits(api: &mut openapi::OpenApi, keys: &[loom_ia::config::ApiKeySpec]) {
    if keys.iter().all(|key| key.rate_limit.is_none()) {
        return;
    }
    const RATE: &str = "the key's `rate_limit` is reached (`rate_limited`)";
    for item in api.paths.paths.values_mut() {
        for operation in operations(item) {
            match operation.responses.responses.get_mut("429") {
                Some(RefOr::T(response)) => {
                    response.description = format!("{} Or {RATE}.", response.description);
                }
                Some(RefOr::Ref(_)) => {}
                None => {
                    let retry_after = openapi::HeaderBuilder::new()
                        .schema(Some(
                            openapi::ObjectBuilder::new()
                                .schema_type(openapi::schema::SchemaType::new(
                                    openapi::Type::Integer,
                                ))
                                .minimum(Some(1)),
                        ))
                        .description(Some("Seconds until the key's minute lets a request in."))
                        .build();
                    let mut response = error_response(&format!("Refused: {RATE}."));
                    response
                        .headers
                        .insert("Retry-After".to_owned(), RefOr::T(retry_after));
                    operation
                        .responses
                        .responses
                        .insert("429".to_owned(), RefOr::T(response));
                }
            }
        }
    }
}

/// When the limits are counted in Redis (`storage.limits` `backend: redis`), every operation
/// can answer `503` (`limits_unavailable`, with `Retry-After`): a key's rate limit, a tenant's
/// quota or budget could not be checked because Redis cannot be reached. Said in the
/// description of the operations that already answer `503` (`interrupted`).
pub(crate) fn shared_limits(api: &mut openapi::OpenApi, shared: bool) {
    if !shared {
        return;
    }
    const UNAVAILABLE: &str = "the shared limits (`storage.limits`, Redis) cannot be reached, \
so a rate limit, quota or budget cannot be checked (`limits_unavailable`); nothing was done";
    for item in api.paths.paths.values_mut() {
        for operation in operations(item) {
            match operation.responses.responses.get_mut("503") {
                Some(RefOr::T(response)) => {
                    response.description = format!("{} Or {UNAVAILABLE}.", response.description);
                }
                Some(RefOr::Ref(_)) => {}
                None => {
                    let retry_after = openapi::HeaderBuilder::new()
                        .schema(Some(
                            openapi::ObjectBuilder::new()
                                .schema_type(openapi::schema::SchemaType::new(
                                    openapi::Type::Integer,
                                ))
                                .minimum(Some(1)),
                        ))
                        .description(Some("Seconds before trying again."))
                        .build();
                    let mut response = error_response(&format!("Unavailable: {UNAVAILABLE}."));
                    response
                        .headers
                        .insert("Retry-After".to_owned(), RefOr::T(retry_after));
                    operation
                        .responses
                        .responses
                        .insert("503".to_owned(), RefOr::T(response));
                }
            }
        }
    }
}

/// When `storage.encryption` is declared, every operation can answer `424`
/// (`missing_encryption_key`): the tenant's journal or file is sealed with a key it no longer
/// has.
pub(crate) fn sealed(api: &mut openapi::OpenApi, encrypted: bool) {
    if !encrypted {
        return;
    }
    const SEALED: &str = "The tenant's journal or file is sealed (`storage.encryption`) with a key \
it does not have: deleted (crypto-shredding) or rotated out (`missing_encryption_key`). Nothing \
was read or written.";
    for item in api.paths.paths.values_mut() {
        for operation in operations(item) {
            operation
                .responses
                .responses
                .insert("424".to_owned(), RefOr::T(error_response(SEALED)));
        }
    }
}

fn operations(item: &mut openapi::PathItem) -> impl Iterator<Item = &mut openapi::path::Operation> {
    [
        item.get.as_mut(),
        item.put.as_mut(),
        item.post.as_mut(),
        item.delete.as_mut(),
        item.options.as_mut(),
        item.head.as_mut(),
        item.patch.as_mut(),
        item.trace.as_mut(),
    ]
    .into_iter()
    .flatten()
}

/// `<base_path>/openapi.json` and `<base_path>/docs`.
pub(crate) fn docs<S: Clone + Send + Sync + 'static>(json: Value, base_path: &str) -> Router<S> {
    let html = utoipa_scalar::Scalar::new(json.clone())
        .title("Loom REST API")
        .to_html();
    Router::new()
        .route(
            &format!("{base_path}/openapi.json"),
            get(move || {
                let json = json.clone();
                async move { Json(json).into_response() }
            }),
        )
        .route(
            &format!("{base_path}/docs"),
            get(move || {
                let html = html.clone();
                async move { Html(html).into_response() }
            }),
        )
}

/// The generator of the facade's schemas: JSON Schema 2020-12 (the dialect of OpenAPI 3.1)
/// for the serialize contract (a field is required when it is always written), definitions
/// under `#/components/schemas/`.
fn generator() -> SchemaGenerator {
    let mut settings = SchemaSettings::draft2020_12().for_serialize();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    settings.into_generator()
}

/// Every schema `T` needs, by name (`T`'s own included), as JSON Schema.
pub(crate) fn schemars_definitions<T: JsonSchema>() -> Vec<(String, Value)> {
    let mut generator = generator();
    let _ = generator.subschema_for::<T>();
    generator.take_definitions(true).into_iter().collect()
}

/// What a schemars-backed schema is in utoipa's model until [`document`] puts the real one in
/// its place.
const PLACEHOLDER: &str = "replaced by the type's schemars schema when the document is written";

/// A marker type whose schema in the document is the `schemars::JsonSchema` of a facade type:
/// `schemars_schema!(RunResultSchema => loom_ia::RunResult)` makes `body = RunResultSchema`
/// usable in `#[utoipa::path]`, a `$ref` to `#/components/schemas/RunResult`. Add the type to
/// [`schemars_components`] too: [`document`] writes its definitions there (a test fails on a
/// placeholder left in the document).
macro_rules! schemars_schema {
    ($(#[$doc:meta])* $marker:ident => $ty:ty) => {
        $(#[$doc])*
        pub(crate) struct $marker;

        impl utoipa::PartialSchema for $marker {
            fn schema() -> RefOr<Schema> {
                RefOr::T(Schema::Object(
                    utoipa::openapi::schema::ObjectBuilder::new()
                        .description(Some(PLACEHOLDER))
                        .build(),
                ))
            }
        }

        impl utoipa::ToSchema for $marker {
            fn name() -> Cow<'static, str> {
                <$ty as JsonSchema>::schema_name()
            }
        }
    };
}

schemars_schema!(
    /// `RunResult` (the facade's `loom_ia::RunResult`).
    RunResultSchema => loom_ia::RunResult
);
schemars_schema!(
    /// `RunPage` (`loom_ia::RunPage`): a page of the run list.
    RunPageSchema => loom_ia::RunPage
);
schemars_schema!(
    /// `RunStatus` (`loom_ia::RunStatus`), for the `status` filter of the run list.
    RunStatusSchema => loom_ia::RunStatus
);
schemars_schema!(
    /// `Event` (`loom_ia::Event`): the journaled event envelope.
    EventSchema => loom_ia::Event
);
schemars_schema!(
    /// `Category` (`loom_ia::core::Category`), for the `category` filter of the event search.
    CategorySchema => loom_ia::core::Category
);
schemars_schema!(
    /// `EventStatus` (`loom_ia::core::EventStatus`), for the `status` filter of the event
    /// search.
    EventStatusSchema => loom_ia::core::EventStatus
);
schemars_schema!(
    /// `Trace` (`loom_ia::Trace`): a run's figures and its spans, sub-runs included.
    TraceSchema => loom_ia::Trace
);
schemars_schema!(
    /// `SessionListed` (`loom_ia::SessionListed`): a session of the list.
    SessionListedSchema => loom_ia::SessionListed
);
schemars_schema!(
    /// `SessionInfo` (`loom_ia::SessionInfo`): a session's runs and waiting approvals.
    SessionInfoSchema => loom_ia::SessionInfo
);
schemars_schema!(
    /// `SessionFile` (`loom_ia::SessionFile`): a file stored beside a session.
    SessionFileSchema => loom_ia::SessionFile
);
schemars_schema!(
    /// `UsageReport` (`loom_ia::UsageReport`): tokens and cost in total, by run, by role, by
    /// agent and by model.
    UsageReportSchema => loom_ia::UsageReport
);
schemars_schema!(
    /// `SessionDeletion` (`loom_ia::SessionDeletion`): what erasing a session removed.
    SessionDeletionSchema => loom_ia::SessionDeletion
);
schemars_schema!(
    /// `CompactionNote` (`loom_ia::CompactionNote`): what a compaction did.
    CompactionNoteSchema => loom_ia::CompactionNote
);
schemars_schema!(
    /// `Triggered` (`loom_ia::Triggered`): what a webhook delivery did.
    TriggeredSchema => loom_ia::Triggered
);

/// The definitions of every facade type a handler names through [`schemars_schema!`] (a
/// definition shared by several types is written once).
fn schemars_components() -> Vec<(String, Value)> {
    let mut all: Vec<(String, Value)> = Vec::new();
    for definitions in [
        schemars_definitions::<loom_ia::RunResult>(),
        schemars_definitions::<loom_ia::RunPage>(),
        schemars_definitions::<loom_ia::RunStatus>(),
        schemars_definitions::<loom_ia::Event>(),
        schemars_definitions::<loom_ia::core::Category>(),
        schemars_definitions::<loom_ia::core::EventStatus>(),
        schemars_definitions::<loom_ia::Trace>(),
        schemars_definitions::<loom_ia::SessionListed>(),
        schemars_definitions::<loom_ia::SessionInfo>(),
        schemars_definitions::<loom_ia::SessionFile>(),
        schemars_definitions::<loom_ia::UsageReport>(),
        schemars_definitions::<loom_ia::SessionDeletion>(),
        schemars_definitions::<loom_ia::CompactionNote>(),
        schemars_definitions::<loom_ia::Triggered>(),
    ] {
        for (name, schema) in definitions {
            if !all.iter().any(|(known, _)| *known == name) {
                all.push((name, schema));
            }
        }
    }
    all
}

/// The facade types that a reader without `read_content` gets masked ([`loom_ia::Redact`]),
/// each with its content fields (paths as [`loom_ia::redact`] writes them; an event's are
/// inside its payload, which the document describes as a free object).
fn redactable() -> Vec<(Cow<'static, str>, &'static [&'static str])> {
    vec![
        (
            <loom_ia::RunResult as JsonSchema>::schema_name(),
            loom_ia::redact::RESULT_CONTENT,
        ),
        (
            <loom_ia::Trace as JsonSchema>::schema_name(),
            loom_ia::redact::TRACE_CONTENT,
        ),
        (
            <loom_ia::SessionInfo as JsonSchema>::schema_name(),
            loom_ia::redact::SESSION_CONTENT,
        ),
        (
            <loom_ia::SessionFile as JsonSchema>::schema_name(),
            loom_ia::redact::FILE_CONTENT,
        ),
        (<loom_ia::Event as JsonSchema>::schema_name(), &[]),
    ]
}

/// One step of a content path: a property, or the elements of an array (`key[]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step<'a> {
    Property(&'a str),
    Items,
}

fn steps(path: &str) -> Vec<Step<'_>> {
    let mut steps = Vec::new();
    for segment in path.split('.') {
        match segment.strip_suffix("[]") {
            Some(key) => steps.extend([Step::Property(key), Step::Items]),
            None => steps.push(Step::Property(segment)),
        }
    }
    steps
}

/// Makes the document truthful for masked answers: each redactable schema gains the optional
/// `redacted` (the paths removed), and its content fields, nested ones included (through
/// `$ref`, `items` and the variants of `oneOf`/`anyOf`/`allOf`), are dropped from `required`,
/// since a reader without `read_content` does not get them. A shared definition (such as
/// `PendingApproval`) is relaxed for every type that holds it.
fn relax_content(schemas: &mut Map<String, Value>) {
    for (name, content) in redactable() {
        let Some(Value::Object(schema)) = schemas.get_mut(name.as_ref()) else {
            tracing::error!(%name, "a redactable type has no schema in the document");
            continue;
        };
        let properties = schema
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(properties) = properties {
            properties.insert(
                "redacted".into(),
                serde_json::json!({
                    "description": "Without the scope `read_content` only: the content fields \
that were removed (JSON paths such as `pending_approvals[0].reason`); absent when nothing was.",
                    "type": "array",
                    "items": {"type": "string"},
                }),
            );
        }
        for path in content {
            let mut seen = Vec::new();
            relax(
                schemas,
                name.as_ref(),
                String::new(),
                &steps(path),
                &mut seen,
            );
        }
    }
}

/// Follows `steps` from the schema at `pointer` inside the definition `name`, and drops the
/// last property from the `required` of the schema that holds it.
fn relax(
    schemas: &mut Map<String, Value>,
    name: &str,
    pointer: String,
    steps: &[Step<'_>],
    seen: &mut Vec<(String, String, usize)>,
) {
    let visit = (name.to_owned(), pointer.clone(), steps.len());
    if seen.contains(&visit) {
        return;
    }
    seen.push(visit);
    let Some(node) = schemas
        .get(name)
        .and_then(|schema| schema.pointer(&pointer))
        .cloned()
    else {
        return;
    };
    if let Some(target) = node.get("$ref").and_then(Value::as_str)
        && let Some(target) = target.strip_prefix("#/components/schemas/")
    {
        relax(schemas, target, String::new(), steps, seen);
    }
    for combinator in ["oneOf", "anyOf", "allOf"] {
        if let Some(variants) = node.get(combinator).and_then(Value::as_array) {
            for index in 0..variants.len() {
                let at = format!("{pointer}/{combinator}/{index}");
                relax(schemas, name, at, steps, seen);
            }
        }
    }
    match steps {
        [] => {}
        [Step::Property(key)] => {
            if node
                .pointer(&format!("/properties/{}", escape(key)))
                .is_some()
                && let Some(Value::Array(required)) = schemas
                    .get_mut(name)
                    .and_then(|schema| schema.pointer_mut(&format!("{pointer}/required")))
            {
                required.retain(|field| field.as_str() != Some(key));
            }
        }
        [Step::Property(key), rest @ ..] => {
            let at = format!("{pointer}/properties/{}", escape(key));
            if node
                .pointer(&format!("/properties/{}", escape(key)))
                .is_some()
            {
                relax(schemas, name, at, rest, seen);
            }
        }
        [Step::Items, rest @ ..] => {
            if node.get("items").is_some() {
                relax(schemas, name, format!("{pointer}/items"), rest, seen);
            }
        }
    }
}

/// A key as a JSON Pointer token.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The document as served: utoipa's, with the facade's schemas written in
/// `components.schemas` exactly as schemars generates them (no conversion between models),
/// then relaxed for masked answers ([`relax_content`]: `redacted` declared, content fields not
/// required).
pub(crate) fn document(api: &openapi::OpenApi) -> Value {
    let mut json = serde_json::to_value(api).unwrap_or_else(|error| {
        tracing::error!(%error, "the OpenAPI document could not be serialized");
        Value::Object(Map::new())
    });
    if let Some(root) = json.as_object_mut() {
        let components = root
            .entry("components")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(components) = components.as_object_mut() {
            let schemas = components
                .entry("schemas")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Some(schemas) = schemas.as_object_mut() {
                for (name, schema) in schemars_components() {
                    schemas.insert(name, schema);
                }
                relax_content(schemas);
            }
        }
    }
    json
}

/// The body of every error: `{"error": {"kind", "message"}}`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Error)]
pub(crate) struct ErrorBody {
    /// What went wrong.
    pub(crate) error: ErrorDetail,
}

/// The error itself.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorDetail {
    /// Stable classification, chosen by the error's variant (never by its text); it decides
    /// the status.
    pub(crate) kind: crate::error::ErrorKind,
    /// What went wrong, for a human (English).
    pub(crate) message: String,
    /// `interrupted` only: the run the server stopped driving (it resumes at the next start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) run_id: Option<String>,
    /// `interrupted` only: the run's session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) session_id: Option<String>,
    /// A server error (status 500) only: the id under which the server logged the error's
    /// detail, which the message does not give.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error_id: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The facade's schemas are in the document, in place of their placeholders, and no name
    /// of theirs hides a utoipa schema.
    #[test]
    fn the_schemars_components_replace_their_placeholders() {
        let api = openapi::OpenApiBuilder::new().build();
        let mut with_routes =
            utoipa_axum::router::OpenApiRouter::<crate::AppState>::with_openapi(api)
                .nest("/v1", crate::routes::v1());
        let utoipa_names: Vec<String> = with_routes
            .get_openapi()
            .components
            .as_ref()
            .map(|c| {
                c.schemas
                    .iter()
                    .filter(|(_, schema)| {
                        !serde_json::to_string(schema)
                            .unwrap_or_default()
                            .contains(PLACEHOLDER)
                    })
                    .map(|(name, _)| name.clone())
                    .collect()
            })
            .unwrap_or_default();
        let document = document(&with_routes.to_openapi());
        let text = document.to_string();
        assert!(!text.contains(PLACEHOLDER), "a placeholder is left: {text}");
        let schemas = document["components"]["schemas"].as_object().unwrap();
        for name in [
            "RunResult",
            "RunStatus",
            "Message",
            "Block",
            "Usage",
            "PendingApproval",
        ] {
            assert!(schemas.contains_key(name), "{name} missing");
        }
        for (name, _) in schemars_components() {
            assert!(!utoipa_names.contains(&name), "{name} is defined twice");
        }
        assert_eq!(
            document["components"]["schemas"]["RunResult"]["properties"]["status"]["$ref"],
            "#/components/schemas/RunStatus"
        );
    }
}
