//! The JSON body extractors: a body declared as another media type is a
//! 415 (no Content-Type, `application/json` and `application/*+json` are
//! read as JSON, as FastAPI reads them); a body over the limit is a 413;
//! malformed JSON, a body that is not an object, or a wrongly typed field
//! a 400 in the API's error shape, naming the field. Generation requests are read
//! twice from one parsed body, into their own fields and the shared
//! [`SamplingFields`] (serde's `flatten` would lose the field names), after
//! the fields grpo does not implement are refused ([`crate::unsupported`]).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::blocking::off_thread;
use crate::error::Error;
use crate::protocol::chat::ChatRequest;
use crate::protocol::common::SamplingFields;
use crate::protocol::completions::CompletionRequest;
use crate::state::AppState;
use crate::unsupported::{self, Endpoint};

/// A request body parsed as `T`.
pub struct JsonBody<T>(pub T);

/// A generation request's body: its own fields and the sampling fields.
pub struct WithSampling<T>(pub T, pub SamplingFields);

/// Whether a Content-Type declares JSON: `application/json`, or
/// `application/<anything>+json`, with any parameters.
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence
        .strip_prefix("application/")
        .is_some_and(|subtype| subtype == "json" || subtype.ends_with("+json"))
}

/// The body as a JSON object.
async fn object(request: Request, state: &AppState) -> Result<Value, Error> {
    if let Some(declared) = request.headers().get(CONTENT_TYPE) {
        let text = String::from_utf8_lossy(declared.as_bytes());
        if !is_json(&text) {
            return Err(Error::UnsupportedMediaType {
                content_type: text.chars().take(100).collect(),
            });
        }
    }
    let bytes = Bytes::from_request(request, state).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Error::BodyTooLarge {
                limit: state.config.max_body_bytes,
            }
        } else {
            Error::InvalidRequest {
                message: rejection.body_text(),
                param: None,
            }
        }
    })?;
    let value: Value = off_thread(move || {
        serde_json::from_slice(&bytes).map_err(|e| Error::InvalidRequest {
            message: format!("invalid JSON body: {e}"),
            param: None,
        })
    })
    .await?;
    if !value.is_object() {
        return Err(Error::InvalidRequest {
            message: "the body must be a JSON object".to_string(),
            param: None,
        });
    }
    Ok(value)
}

/// `value` as `T`; a failure names the field at fault.
fn parse<T: DeserializeOwned>(value: Value) -> Result<T, Error> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.inner().to_string();
        if path == "." {
            Error::InvalidRequest { message, param: None }
        } else {
            Error::InvalidRequest {
                message: format!("{path}: {message}"),
                param: Some(path),
            }
        }
    })
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = Error;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Error> {
        Ok(JsonBody(parse(object(request, state).await?)?))
    }
}

/// A generation request's body type, and the endpoint it is for (which
/// decides the fields it refuses, [`crate::unsupported`]).
pub trait GenerationBody: DeserializeOwned {
    /// The endpoint.
    const ENDPOINT: Endpoint;
}

impl GenerationBody for CompletionRequest {
    const ENDPOINT: Endpoint = Endpoint::Completions;
}

impl GenerationBody for ChatRequest {
    const ENDPOINT: Endpoint = Endpoint::Chat;
}

impl<T: GenerationBody> FromRequest<AppState> for WithSampling<T> {
    type Rejection = Error;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Error> {
        let value = object(request, state).await?;
        if let Value::Object(body) = &value {
            unsupported::refuse(body, T::ENDPOINT)?;
        }
        Ok(WithSampling(parse(value.clone())?, parse(value)?))
    }
}
