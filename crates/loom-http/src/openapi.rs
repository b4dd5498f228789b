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
their events as Server-Sent Events, approvals and cancellation. Every error is JSON \
`{\"error\": {\"kind\", \"message\"}}` with a stable `kind`.",
    ),
    tags(
        (name = "agents", description = "The agents the caller may run."),
        (name = "runs", description = "Runs: open, read, follow, decide, cancel."),
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

/// The finished document: the paths of `api` under the fixed part, and, when no key is
/// declared (the API is open), an empty requirement added to every operation so the document
/// says a request without a key is served.
pub(crate) fn finish(mut api: openapi::OpenApi, open: bool) -> openapi::OpenApi {
    api.openapi = openapi::OpenApiVersion::Version31;
    if open {
        for item in api.paths.paths.values_mut() {
            for operation in operations(item) {
                if let Some(security) = &mut operation.security {
                    security.insert(0, openapi::security::SecurityRequirement::default());
                }
            }
        }
    }
    api
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

/// The definitions of every facade type a handler names through [`schemars_schema!`].
fn schemars_components() -> Vec<(String, Value)> {
    schemars_definitions::<loom_ia::RunResult>()
}

/// The document as served: utoipa's, with the facade's schemas written in
/// `components.schemas` exactly as schemars generates them (no conversion between models).
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
    /// Stable classification, chosen by the error's variant (never by its text):
    /// `unknown_agent`, `unknown_run`, `unknown_session`, `not_found` (404); `missing_key`,
    /// `unknown_key`, `expired_key` (401); `missing_scope`, `agent_not_allowed` (403);
    /// `refused`, `conflict` (409); `body_too_large` (413); `invalid_body`, `invalid_query`,
    /// `invalid_header` (422); `budget_exhausted` (429); `config`, `registration`, `journal`,
    /// `engine` (500); `interrupted` (503).
    #[schema(example = "unknown_run")]
    pub(crate) kind: Cow<'static, str>,
    /// What went wrong, for a human (English).
    pub(crate) message: String,
    /// `interrupted` only: the run the server stopped driving (it resumes at the next start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) run_id: Option<String>,
    /// `interrupted` only: the run's session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) session_id: Option<String>,
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
