//! The shared token: every call to a worker carries it as metadata
//! `authorization: Bearer <token>`; the worker compares it in constant time
//! and answers `Unauthenticated` when it is missing or wrong.

use std::sync::Arc;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::error::WorkerError;

/// The metadata key the token travels under.
const KEY: &str = "authorization";

/// The environment variable a token is read from when no file is named.
pub const TOKEN_VAR: &str = "GRPO_WORKER_TOKEN";

/// A shared secret between a worker and its callers: non-empty, visible
/// ASCII without spaces (it travels in an HTTP header). Its `Debug` hides it.
#[derive(Clone)]
pub struct AuthToken(Arc<str>);

impl AuthToken {
    /// Checks and wraps `secret`.
    pub fn new(secret: impl Into<String>) -> Result<AuthToken, WorkerError> {
        let secret = secret.into();
        if secret.is_empty() {
            return Err(WorkerError::Token {
                message: "it is empty".to_string(),
            });
        }
        if let Some(bad) = secret.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(WorkerError::Token {
                message: format!("it holds {bad:?}; use visible ASCII characters without spaces"),
            });
        }
        Ok(AuthToken(secret.into()))
    }

    /// The token in `file` (surrounding whitespace ignored), else in the
    /// `GRPO_WORKER_TOKEN` environment variable; `what` names the setting
    /// that names the file, for the error when there is neither.
    pub fn from_file_or_env(file: Option<&std::path::Path>, what: &str) -> Result<AuthToken, WorkerError> {
        let secret = match file {
            Some(path) => std::fs::read_to_string(path).map_err(|e| WorkerError::Token {
                message: format!("cannot read {}: {e}", path.display()),
            })?,
            None => std::env::var(TOKEN_VAR).map_err(|_| WorkerError::Token {
                message: format!("none given: set {what} to a file holding it, or set {TOKEN_VAR}"),
            })?,
        };
        AuthToken::new(secret.trim())
    }

    /// The header value, `Bearer <token>`.
    fn header(&self) -> String {
        format!("Bearer {}", self.0)
    }
}

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthToken(…)")
    }
}

/// Equal, in time that depends only on the lengths.
fn same(a: &[u8], b: &[u8]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0 && a.len() == b.len()
}

/// The worker's check of every call.
#[derive(Clone)]
pub(crate) struct CheckToken {
    expected: Arc<[u8]>,
}

impl CheckToken {
    pub fn new(token: &AuthToken) -> CheckToken {
        CheckToken {
            expected: token.header().into_bytes().into(),
        }
    }
}

impl Interceptor for CheckToken {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        match request.metadata().get(KEY) {
            Some(value) if same(value.as_bytes(), &self.expected) => Ok(request),
            Some(_) => Err(Status::unauthenticated("wrong worker token")),
            None => Err(Status::unauthenticated(
                "no worker token: send metadata `authorization: Bearer <token>`",
            )),
        }
    }
}

/// A caller's token, attached to every call.
#[derive(Clone)]
pub(crate) struct AttachToken {
    value: MetadataValue<Ascii>,
}

impl AttachToken {
    pub fn new(token: &AuthToken) -> AttachToken {
        let value = token
            .header()
            .parse()
            .expect("a checked token is visible ASCII, a valid header value");
        AttachToken { value }
    }
}

impl std::fmt::Debug for AttachToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AttachToken(…)")
    }
}

impl Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request.metadata_mut().insert(KEY, self.value.clone());
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked_and_hidden() {
        assert!(AuthToken::new("").is_err());
        assert!(AuthToken::new("a b").is_err());
        assert!(AuthToken::new("é").is_err());
        let token = AuthToken::new("s3cret-token_1").unwrap();
        assert_eq!(format!("{token:?}"), "AuthToken(…)");
    }

    #[test]
    fn the_check_accepts_only_the_same_token() {
        let token = AuthToken::new("right").unwrap();
        let mut check = CheckToken::new(&token);
        let call = |attach: Option<&AuthToken>| {
            let mut request = Request::new(());
            if let Some(token) = attach {
                request = AttachToken::new(token).call(request).unwrap();
            }
            request
        };
        assert!(check.call(call(Some(&token))).is_ok());
        for wrong in ["wrong", "righ", "right2"] {
            let status = check.call(call(Some(&AuthToken::new(wrong).unwrap()))).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated);
        }
        let status = check.call(call(None)).unwrap_err();
        assert!(status.message().contains("no worker token"), "{status}");
    }
}
