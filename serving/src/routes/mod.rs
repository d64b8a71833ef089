//! The HTTP routes, one module per area, and the router joining them with
//! the API-key check, the body limit, admission of generation requests and
//! the JSON 404 and 405.

pub mod chat;
pub mod completions;
pub mod control;
pub mod generate;
pub mod info;
pub mod lora;
pub mod tokenize;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::middleware;
use axum::routing::{get, post};

use crate::admission::admit;
use crate::auth::require_key;
use crate::error::Error;
use crate::state::AppState;

/// A JSON 404 for paths without a route.
async fn fallback(method: Method, uri: Uri) -> Error {
    Error::RouteNotFound {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

/// A JSON 405 for a route called with a method it does not take.
async fn method_not_allowed(method: Method, uri: Uri) -> Error {
    Error::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

/// Every route, over `state`.
pub fn router(state: AppState) -> Router {
    let generation = Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat))
        .route_layer(middleware::from_fn_with_state(state.clone(), admit));
    Router::new()
        .merge(generation)
        .route("/v1/models", get(info::models))
        .route("/health", get(info::health))
        .route("/version", get(info::version))
        .route("/metrics", get(info::metrics))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/pause", post(control::pause))
        .route("/resume", post(control::resume))
        .route("/is_paused", get(control::is_paused))
        .route("/update_weights_from_disk", post(control::update_weights_from_disk))
        .route("/v1/load_lora_adapter", post(lora::load))
        .route("/v1/unload_lora_adapter", post(lora::unload))
        .fallback(fallback)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), require_key))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .with_state(state)
}
