//! The crate's error type, and the one place it becomes an HTTP answer:
//! `{"error": {"message", "type", "param", "code"}}` with its status.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::protocol::errors::{ErrorBody, ErrorResponse};

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong serving a request (or starting the server).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request that breaks the API's rules; `param` names the field when one is at fault.
    #[error("{message}")]
    InvalidRequest {
        /// What is wrong and what is allowed.
        message: String,
        /// The field at fault.
        param: Option<String>,
    },
    /// The request names a model this server does not serve.
    #[error("The model `{model}` does not exist (this server serves {served})")]
    ModelNotFound {
        /// The name asked for.
        model: String,
        /// The names served, quoted and comma-separated.
        served: String,
    },
    /// No LoRA adapter folder at the path, or no adapter of the name.
    #[error("{message}")]
    AdapterNotFound {
        /// What was not found.
        message: String,
    },
    /// A run-time adapter route of a server that keeps them off.
    #[error(
        "{path} changes the served adapters, which this server does not allow: start grpo serve with --enable-lora \
         and --allow-runtime-lora-updating (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true)"
    )]
    AdapterUpdatesOff {
        /// The route.
        path: &'static str,
    },
    /// No route at this path.
    #[error("no route {method} {path}")]
    RouteNotFound {
        /// The HTTP method.
        method: String,
        /// The path.
        path: String,
    },
    /// The API key is missing or wrong.
    #[error("a missing or wrong API key: send `Authorization: Bearer KEY`")]
    Unauthorized,
    /// A control route of a server that keeps them off.
    #[error(
        "{path} changes the server, and its control routes are off: start grpo serve with --api-key KEY, or with \
         --enable-control-routes on a machine whose local users are trusted"
    )]
    ControlOff {
        /// The route.
        path: &'static str,
    },
    /// The route exists, but not for this method.
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed {
        /// The HTTP method.
        method: String,
        /// The path.
        path: String,
    },
    /// As many generation requests as allowed are running.
    #[error("the server is at its limit of {limit} requests at once: retry shortly")]
    Overloaded {
        /// The limit.
        limit: usize,
    },
    /// Loading weights took longer than the limit.
    #[error("loading the weights took over {seconds} s; the old weights keep serving")]
    LoadTimeout {
        /// The limit.
        seconds: u64,
    },
    /// The body is over the size limit.
    #[error("the request body is over the limit of {limit} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The body is declared as something other than JSON.
    #[error("the body is `{content_type}`; send JSON (Content-Type: application/json)")]
    UnsupportedMediaType {
        /// The request's Content-Type.
        content_type: String,
    },
    /// The engine refused the request or stopped.
    #[error(transparent)]
    Engine(#[from] grpo_rollout::Error),
    /// Tokenizing, rendering the chat template or reading a checkpoint failed on the request's input.
    #[error(transparent)]
    Model(#[from] grpo_model::Error),
    /// The server could not start listening.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The server failed while running.
    #[error("serving: {0}")]
    Serve(std::io::Error),
}

impl Error {
    /// An [`Error::InvalidRequest`] about field `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Error {
        Error::InvalidRequest {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    /// This error, naming `field` as its `param` when it is the engine's
    /// refusal of the grammar that field asked for.
    pub fn guided_by(self, field: Option<&str>) -> Error {
        match (self, field) {
            (error @ Error::Engine(grpo_rollout::Error::InvalidGuide { .. }), Some(field)) => {
                Error::invalid(field, error.to_string())
            }
            (error, _) => error,
        }
    }

    /// The HTTP status and OpenAI error type of this error.
    fn status(&self) -> (StatusCode, &'static str) {
        use grpo_rollout::Error as Engine;
        match self {
            Error::InvalidRequest { .. }
            | Error::Model(_)
            | Error::Engine(
                Engine::InvalidRequest { .. } | Engine::InvalidGuide { .. } | Engine::InvalidUpdate { .. },
            ) => (StatusCode::BAD_REQUEST, "BadRequestError"),
            Error::ModelNotFound { .. } | Error::RouteNotFound { .. } | Error::AdapterNotFound { .. } => {
                (StatusCode::NOT_FOUND, "NotFoundError")
            }
            Error::Unauthorized => (StatusCode::UNAUTHORIZED, "AuthenticationError"),
            Error::ControlOff { .. } | Error::AdapterUpdatesOff { .. } => {
                (StatusCode::FORBIDDEN, "PermissionDeniedError")
            }
            Error::MethodNotAllowed { .. } => (StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowedError"),
            Error::LoadTimeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "TimeoutError"),
            Error::Overloaded { .. } => (StatusCode::TOO_MANY_REQUESTS, "RateLimitError"),
            Error::BodyTooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLarge"),
            Error::UnsupportedMediaType { .. } => (StatusCode::UNSUPPORTED_MEDIA_TYPE, "UnsupportedMediaTypeError"),
            Error::Engine(Engine::EngineStopped { .. }) => (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailableError"),
            Error::Engine(_) | Error::Bind { .. } | Error::Serve(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError")
            }
        }
    }

    /// The JSON body of this error.
    pub fn body(&self) -> ErrorResponse {
        let (status, kind) = self.status();
        let param = match self {
            Error::InvalidRequest { param, .. } => param.clone(),
            _ => None,
        };
        ErrorResponse {
            error: ErrorBody {
                message: self.to_string(),
                kind: kind.to_string(),
                param,
                code: status.as_u16(),
            },
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, _) = self.status();
        if status.is_server_error() {
            tracing::warn!("{self}");
        }
        let mut response = (status, Json(self.body())).into_response();
        if let Error::Overloaded { .. } = self {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from_static("1"),
            );
        }
        response
    }
}
