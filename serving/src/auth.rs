//! The API key: `Authorization: Bearer KEY`, compared in constant time
//! (SHA-256 digests of both sides, XOR-folded), checked on every route but
//! `/health`, `/version` and `/metrics`.

use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};

use crate::error::Error;
use crate::state::AppState;

/// A key to check requests against.
#[derive(Clone)]
pub struct ApiKey {
    digest: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

impl ApiKey {
    /// The key `secret`.
    pub fn new(secret: &str) -> ApiKey {
        ApiKey {
            digest: Sha256::digest(secret.as_bytes()).into(),
        }
    }

    /// Whether `candidate` is the key, in time independent of where they differ.
    pub fn matches(&self, candidate: &str) -> bool {
        let other: [u8; 32] = Sha256::digest(candidate.as_bytes()).into();
        self.digest.iter().zip(other).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

/// Paths anyone may call.
const OPEN_PATHS: &[&str] = &["/health", "/version", "/metrics"];

/// Middleware refusing a request without the server's key (when it has one).
pub async fn require_key(State(state): State<AppState>, request: Request, next: Next) -> Result<Response, Error> {
    if let Some(key) = &state.config.api_key
        && !OPEN_PATHS.contains(&request.uri().path())
    {
        let given = request
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|given| key.matches(given.trim())) {
            return Err(Error::Unauthorized);
        }
    }
    Ok(next.run(request).await)
}
