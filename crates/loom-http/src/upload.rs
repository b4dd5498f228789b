//! The body of `POST /agents/{name}/runs`: JSON, or `multipart/form-data` with the same fields
//! as form fields and the files in `attachments` parts.
//!
//! A multipart body's text fields are read as the JSON body would be (`metadata` is JSON text,
//! `background` is `true` or `false`, the others are text; an unknown or repeated field is a
//! 422), so both forms are checked by the same rules. Files are checked by the facade
//! ([`loom_ia::Loom::attachment`]) exactly as `loom run --attach` checks them: size, accepted
//! type, count (`execution.attachments`), each refusal a 422 naming the file and the limit. A
//! body over `server.http.max_body_bytes` is a 413.

use axum::{
    Json,
    extract::{FromRequest, Multipart, Request, multipart::MultipartError},
    http::{StatusCode, header},
};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::{AppState, error::ApiError};

/// The form field that carries files.
pub(crate) const ATTACHMENTS: &str = "attachments";

/// A file received in an `attachments` part, not checked yet.
#[derive(Debug)]
pub(crate) struct Upload {
    /// The part's file name.
    pub(crate) name: String,
    /// The part's `Content-Type`, when it has one.
    pub(crate) media_type: Option<String>,
    /// The file's bytes.
    pub(crate) bytes: Vec<u8>,
}

/// A request body read as JSON or as a multipart form: the fields as `T`, and the files.
#[derive(Debug)]
pub(crate) struct RunBody<T> {
    /// The fields.
    pub(crate) request: T,
    /// The files of the `attachments` parts, in order (none for a JSON body).
    pub(crate) uploads: Vec<Upload>,
}

impl<T: DeserializeOwned> FromRequest<AppState> for RunBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<RunBody<T>, ApiError> {
        let multipart = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("multipart/form-data")
            });
        if !multipart {
            let Json(request) = Json::<T>::from_request(request, state).await?;
            return Ok(RunBody {
                request,
                uploads: Vec::new(),
            });
        }
        let form = Multipart::from_request(request, state)
            .await
            .map_err(|rejection| ApiError::invalid_body(rejection.body_text()))?;
        read_form(form).await
    }
}

/// Reads every part of `form`.
async fn read_form<T: DeserializeOwned>(mut form: Multipart) -> Result<RunBody<T>, ApiError> {
    let mut fields = Map::new();
    let mut uploads = Vec::new();
    while let Some(field) = form.next_field().await.map_err(multipart_error)? {
        let Some(name) = field.name().map(str::to_owned) else {
            return Err(ApiError::invalid_body("a form part has no name"));
        };
        if name == ATTACHMENTS {
            let Some(file) = field.file_name().map(str::to_owned) else {
                return Err(ApiError::invalid_body(
                    "an 'attachments' part must be a file (with a file name)",
                ));
            };
            let media_type = field.content_type().map(str::to_owned);
            let bytes = field.bytes().await.map_err(multipart_error)?;
            uploads.push(Upload {
                name: file,
                media_type,
                bytes: bytes.to_vec(),
            });
            continue;
        }
        if fields.contains_key(&name) {
            return Err(ApiError::invalid_body(format!(
                "the form field '{name}' is given twice"
            )));
        }
        let text = field.text().await.map_err(multipart_error)?;
        let value = match name.as_str() {
            "metadata" | "state" => serde_json::from_str(&text).map_err(|e| {
                ApiError::invalid_body(format!("the form field '{name}' is not JSON: {e}"))
            })?,
            "background" => match text.trim() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                other => {
                    return Err(ApiError::invalid_body(format!(
                        "the form field 'background' must be true or false, not '{other}'"
                    )));
                }
            },
            _ => Value::String(text),
        };
        fields.insert(name, value);
    }
    let request = serde_json::from_value(Value::Object(fields))
        .map_err(|e| ApiError::invalid_body(format!("form fields: {e}")))?;
    Ok(RunBody { request, uploads })
}

fn multipart_error(error: MultipartError) -> ApiError {
    if error.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large()
    } else {
        ApiError::invalid_body(error.body_text())
    }
}
