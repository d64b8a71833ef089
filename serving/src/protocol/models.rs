//! `GET /v1/models` and `GET /version`.

use serde::Serialize;

/// `{"object": "list", "data": [...]}`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    /// `list`.
    pub object: &'static str,
    /// The served model, then its adapters.
    pub data: Vec<ModelCard>,
}

/// One served model.
#[derive(Debug, Clone, Serialize)]
pub struct ModelCard {
    /// The name requests use.
    pub id: String,
    /// `model`.
    pub object: &'static str,
    /// When the server started (Unix seconds).
    pub created: u64,
    /// `grpo`.
    pub owned_by: &'static str,
    /// The model as `--model` named it; an adapter's folder.
    pub root: String,
    /// An adapter's base model (none for the model itself).
    pub parent: Option<String>,
    /// Longest prompt + completion (null for adapters, as vLLM gives it).
    pub max_model_len: Option<usize>,
}

/// `{"version": ...}`.
#[derive(Debug, Clone, Serialize)]
pub struct Version {
    /// The server's version.
    pub version: &'static str,
}
