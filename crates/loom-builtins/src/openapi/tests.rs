//! Unit tests of the `openapi` source: operations selected, input schemas, declarations, URLs.

use std::time::Duration;

use serde_json::json;

use super::*;

fn document() -> Value {
    let mut doc = raw_document();
    for item in doc["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|p| p.values_mut())
    {
        for (key, op) in item.as_object_mut().into_iter().flatten() {
            if key != "parameters" {
                op["responses"] = json!({"200": {"description": "ok"}});
            }
        }
    }
    doc
}

fn raw_document() -> Value {
    json!({
        "openapi": "3.0.3",
        "info": {"title": "Shop", "version": "1"},
        "servers": [{"url": "http://{host}/api", "variables": {"host": {"default": "127.0.0.1:9"}}}],
        "paths": {
            "/orders/{id}": {
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "get": {
                    "operationId": "getOrder",
                    "summary": "One order",
                    "parameters": [
                        {"name": "fields", "in": "query", "schema": {"type": "array", "items": {"type": "string"}}},
                        {"$ref": "#/components/parameters/Trace"}
                    ]
                },
                "delete": {"operationId": "deleteOrder"}
            },
            "/orders": {
                "post": {
                    "operationId": "createOrder",
                    "requestBody": {
                        "required": true,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Order"}}}
                    }
                }
            }
        },
        "components": {
            "parameters": {"Trace": {"name": "X-Trace", "in": "header", "schema": {"type": "string"}}},
            "schemas": {
                "Order": {"type": "object", "required": ["item"], "properties": {
                    "item": {"type": "string"}, "line": {"$ref": "#/components/schemas/Line"}
                }},
                "Line": {"type": "object", "properties": {"qty": {"type": "integer"}}}
            }
        }
    })
}

fn options(operations: &[&str]) -> OpenApiOptions {
    OpenApiOptions {
        name: "shop".into(),
        operations: operations.iter().map(|s| (*s).to_owned()).collect(),
        base_url: None,
        auth: None,
        timeout: Duration::from_secs(5),
    }
}

#[test]
fn operations_become_tools_with_their_inputs_and_side_effects() {
    let source = OpenApiSource::new(
        options(&["getOrder", "createOrder", "deleteOrder"]),
        &document(),
        None,
    )
    .unwrap();
    let tools = source.tools();
    let names: Vec<&str> = tools.iter().map(|t| t.spec().name.as_str()).collect();
    assert_eq!(
        names,
        ["shop__getOrder", "shop__createOrder", "shop__deleteOrder"]
    );
    let get = tools[0].spec();
    assert_eq!(get.description, "One order");
    assert_eq!(get.declarations.side_effects, SideEffects::None);
    assert_eq!(
        get.input_schema,
        json!({
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "fields": {"type": "array", "items": {"type": "string"}},
                "X-Trace": {"type": "string"}
            },
            "required": ["id"],
            "additionalProperties": false
        })
    );
    let post = tools[1].spec();
    assert_eq!(post.declarations.side_effects, SideEffects::Irreversible);
    assert!(!post.declarations.idempotent);
    // The body's `$ref`s are inlined, nested ones too.
    assert_eq!(
        post.input_schema["properties"]["body"]["properties"]["line"]["properties"]["qty"],
        json!({"type": "integer"})
    );
    assert_eq!(post.input_schema["required"], json!(["body"]));
    assert_eq!(post.description, "POST /orders");
    let delete = tools[2].spec();
    assert_eq!(delete.declarations.side_effects, SideEffects::Irreversible);
    assert!(delete.declarations.idempotent);
}

#[test]
fn an_unknown_operation_is_refused_naming_the_known_ones() {
    let error =
        OpenApiSource::new(options(&["getOrder", "listOrders"]), &document(), None).unwrap_err();
    match &error {
        OpenApiError::UnknownOperation { index, id, known } => {
            assert_eq!((*index, id.as_str()), (1, "listOrders"));
            assert_eq!(known, "getOrder, deleteOrder, createOrder");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn duplicates_empty_lists_and_bad_refs_are_refused() {
    assert!(matches!(
        OpenApiSource::new(options(&["getOrder", "getOrder"]), &document(), None),
        Err(OpenApiError::DuplicateOperation { index: 1, .. })
    ));
    assert!(matches!(
        OpenApiSource::new(options(&[]), &document(), None),
        Err(OpenApiError::NoOperation)
    ));
    let mut doc = document();
    doc["paths"]["/orders"]["post"]["requestBody"]["content"]["application/json"]["schema"] =
        json!({"$ref": "#/components/schemas/Missing"});
    let error = OpenApiSource::new(options(&["createOrder"]), &doc, None).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("'#/components/schemas/Missing' points to nothing"),
        "{error}"
    );
    let mut doc = document();
    doc["components"]["schemas"]["Line"] = json!({"$ref": "#/components/schemas/Line"});
    let error = OpenApiSource::new(options(&["createOrder"]), &doc, None).unwrap_err();
    assert!(error.to_string().contains("recursive schema"), "{error}");
}

#[test]
fn the_base_url_comes_from_the_options_or_the_servers() {
    let source = OpenApiSource::new(options(&["getOrder"]), &document(), None).unwrap();
    assert_eq!(source.name(), "shop");
    let mut doc = document();
    doc["servers"] = json!([{"url": "/api"}]);
    assert!(matches!(
        OpenApiSource::new(options(&["getOrder"]), &doc, None),
        Err(OpenApiError::NoBaseUrl(_))
    ));
    // Relative to the document's own URL when it was fetched.
    assert!(OpenApiSource::new(options(&["getOrder"]), &doc, Some("http://h/spec.json")).is_ok());
    let mut with_base = options(&["getOrder"]);
    with_base.base_url = Some("ftp://h".into());
    assert!(matches!(
        OpenApiSource::new(with_base, &document(), None),
        Err(OpenApiError::BadBaseUrl(_))
    ));
}

#[test]
fn urls_fill_path_segments_encoded_and_the_query() {
    let source = OpenApiSource::new(options(&["getOrder"]), &document(), None).unwrap();
    let api: OpenAPI = serde_json::from_value(document()).unwrap();
    let base = base_url(&options(&["getOrder"]), &api, None).unwrap();
    let tool = OperationTool::new(
        source.tools()[0].spec().clone(),
        "get",
        &base,
        "/orders/{id}",
        vec![
            schema::Param {
                name: "id".into(),
                location: schema::Location::Path,
            },
            schema::Param {
                name: "fields".into(),
                location: schema::Location::Query,
            },
        ],
        false,
        None,
        call::client(Duration::from_secs(1)).unwrap(),
    );
    let args = json!({"id": "a/b c", "fields": ["x", "y"]});
    let url = tool.url_for_test(args.as_object().unwrap());
    assert_eq!(
        url.as_str(),
        "http://127.0.0.1:9/api/orders/a%2Fb%20c?fields=x&fields=y"
    );
}

#[test]
fn documents_read_as_json_or_yaml() {
    let yaml = "openapi: 3.0.0\ninfo: {title: t, version: '1'}\npaths: {}\n";
    assert_eq!(parse_document(yaml).unwrap()["openapi"], "3.0.0");
    assert!(matches!(
        parse_document("{nope"),
        Err(OpenApiError::Document(_))
    ));
    let swagger = json!({"swagger": "2.0", "info": {"title": "t", "version": "1"}, "paths": {}});
    assert!(matches!(
        OpenApiSource::new(options(&["x"]), &swagger, None),
        Err(OpenApiError::Document(_))
    ));
}

#[test]
fn the_credential_never_shows_in_debug_output() {
    let header = AuthHeader::new(
        &AuthParams::Bearer {
            secret: "TOKEN".into(),
        },
        "s3cret".into(),
    );
    assert_eq!(header.name, "Authorization");
    assert_eq!(header.value, "Bearer s3cret");
    assert!(!format!("{header:?}").contains("s3cret"));
    let key = AuthHeader::new(
        &AuthParams::ApiKey {
            header: "X-Api-Key".into(),
            secret: "K".into(),
        },
        "v".into(),
    );
    assert_eq!((key.name.as_str(), key.value.as_str()), ("X-Api-Key", "v"));
}
