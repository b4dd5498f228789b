//! The input schema of an operation: one property per path, query and header parameter, and
//! `body` for a JSON request body, each with its schema's local `$ref`s inlined.

use openapiv3::{Parameter, ParameterSchemaOrContent, ReferenceOr, RequestBody};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// How deep `$ref`s are followed inside one schema (a recursive schema stops here).
const MAX_REF_DEPTH: usize = 16;

/// Where a parameter goes in the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Location {
    /// Substituted into the path (`{name}`).
    Path,
    /// Added to the query string.
    Query,
    /// Sent as a header.
    Header,
}

/// A parameter of an operation, as its tool's argument of the same name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Param {
    /// Its name (the argument's and the request's).
    pub(super) name: String,
    /// Where it goes.
    pub(super) location: Location,
}

/// An operation's input: its schema, its parameters, whether it takes a JSON body (`body`).
pub(super) struct Input {
    pub(super) schema: Value,
    pub(super) parameters: Vec<Param>,
    pub(super) body: bool,
}

/// Resolves local `$ref`s (`#/...`) against the whole document.
pub(super) struct Resolver<'a> {
    document: &'a Value,
}

impl<'a> Resolver<'a> {
    pub(super) fn new(document: &'a Value) -> Resolver<'a> {
        Resolver { document }
    }

    /// The value a local reference points to.
    fn target(&self, reference: &str) -> Result<&'a Value, String> {
        let pointer = reference.strip_prefix('#').ok_or_else(|| {
            format!("'{reference}' is not a local reference (only '#/...' references are read)")
        })?;
        self.document
            .pointer(pointer)
            .ok_or_else(|| format!("the reference '{reference}' points to nothing"))
    }

    /// The item, or the item its reference points to.
    fn item<T: DeserializeOwned + Clone>(&self, item: &ReferenceOr<T>) -> Result<T, String> {
        match item {
            ReferenceOr::Item(item) => Ok(item.clone()),
            ReferenceOr::Reference { reference } => {
                serde_json::from_value(self.target(reference)?.clone()).map_err(|error| {
                    format!("the reference '{reference}' is not of the right kind: {error}")
                })
            }
        }
    }

    /// `schema` with every local `$ref` replaced by its target, `depth` levels deep at most.
    fn inline(&self, schema: &Value, depth: usize) -> Result<Value, String> {
        match schema {
            Value::Object(map) => {
                if let Some(Value::String(reference)) = map.get("$ref") {
                    if depth >= MAX_REF_DEPTH {
                        return Err(format!(
                            "the schema reference '{reference}' nests deeper than {MAX_REF_DEPTH} levels (a recursive schema)"
                        ));
                    }
                    return self.inline(self.target(reference)?, depth + 1);
                }
                let mut out = Map::with_capacity(map.len());
                for (key, value) in map {
                    out.insert(key.clone(), self.inline(value, depth)?);
                }
                Ok(Value::Object(out))
            }
            Value::Array(items) => items
                .iter()
                .map(|item| self.inline(item, depth))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array),
            other => Ok(other.clone()),
        }
    }

    /// The input of an operation with these parameters (the path item's, then the
    /// operation's, which override a same-named one) and this request body.
    pub(super) fn input(
        &self,
        parameters: &[&ReferenceOr<Parameter>],
        body: Option<&ReferenceOr<RequestBody>>,
    ) -> Result<Input, String> {
        let mut properties = Map::new();
        let mut required = Vec::new();
        let mut params: Vec<Param> = Vec::new();
        for parameter in parameters {
            let parameter = self.item(parameter)?;
            let (data, location) = match &parameter {
                Parameter::Path { parameter_data, .. } => (parameter_data, Location::Path),
                Parameter::Query { parameter_data, .. } => (parameter_data, Location::Query),
                Parameter::Header { parameter_data, .. } => (parameter_data, Location::Header),
                // Cookies are the browser's business: an API tool does not set them.
                Parameter::Cookie { parameter_data, .. } => {
                    if parameter_data.required {
                        return Err(format!(
                            "the required cookie parameter '{}' is not supported",
                            parameter_data.name
                        ));
                    }
                    continue;
                }
            };
            if data.name == "body" {
                return Err(
                    "a parameter named 'body' clashes with the request body's argument".into(),
                );
            }
            if let Some(existing) = params.iter().position(|p| p.name == data.name) {
                if params[existing].location != location {
                    return Err(format!(
                        "the parameter '{}' is given in two places (path, query or header)",
                        data.name
                    ));
                }
                params.remove(existing);
                required.retain(|name: &Value| name != data.name.as_str());
            }
            let mut schema = match &data.format {
                ParameterSchemaOrContent::Schema(schema) => {
                    let value = serde_json::to_value(schema).map_err(|e| e.to_string())?;
                    self.inline(&value, 0)?
                }
                ParameterSchemaOrContent::Content(_) => json!({}),
            };
            if let (Some(description), Value::Object(map)) = (&data.description, &mut schema)
                && !map.contains_key("description")
            {
                map.insert("description".into(), Value::String(description.clone()));
            }
            properties.insert(data.name.clone(), schema);
            if data.required || location == Location::Path {
                required.push(Value::String(data.name.clone()));
            }
            params.push(Param {
                name: data.name.clone(),
                location,
            });
        }
        let mut takes_body = false;
        if let Some(body) = body {
            let body = self.item(body)?;
            let json = body
                .content
                .iter()
                .find(|(media, _)| {
                    media.starts_with("application/json") || media.ends_with("+json")
                })
                .map(|(_, media)| media);
            match json {
                Some(media) => {
                    let mut schema = match &media.schema {
                        Some(schema) => {
                            let value = serde_json::to_value(schema).map_err(|e| e.to_string())?;
                            self.inline(&value, 0)?
                        }
                        None => json!({}),
                    };
                    if let (Some(description), Value::Object(map)) =
                        (&body.description, &mut schema)
                        && !map.contains_key("description")
                    {
                        map.insert("description".into(), Value::String(description.clone()));
                    }
                    properties.insert("body".into(), schema);
                    if body.required {
                        required.push(Value::String("body".into()));
                    }
                    takes_body = true;
                }
                None if body.required => {
                    let media: Vec<&str> = body.content.keys().map(String::as_str).collect();
                    return Err(format!(
                        "the request body is not JSON ({}): only JSON bodies are sent",
                        media.join(", ")
                    ));
                }
                None => {}
            }
        }
        let mut schema = Map::new();
        schema.insert("type".into(), "object".into());
        schema.insert("properties".into(), Value::Object(properties));
        if !required.is_empty() {
            schema.insert("required".into(), Value::Array(required));
        }
        schema.insert("additionalProperties".into(), Value::Bool(false));
        Ok(Input {
            schema: Value::Object(schema),
            parameters: params,
            body: takes_body,
        })
    }
}
