//! The error body every failed request gets.

use serde::Serialize;

/// `{"error": {...}}`.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorResponse {
    /// The error.
    pub error: ErrorBody,
}

/// What went wrong, as OpenAI's and vLLM's servers say it.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    /// A sentence saying what is wrong.
    pub message: String,
    /// The kind (`BadRequestError`, `NotFoundError`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// The HTTP status.
    pub code: u16,
}
