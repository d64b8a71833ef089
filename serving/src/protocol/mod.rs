//! The JSON of the API, as serde types in OpenAI's and vLLM's shapes. Unknown
//! request fields are ignored (as vLLM does); wrongly typed ones are refused.
//! Integers a client may send out of range are read as `i64` and range-checked
//! in [`crate::validate`], so the answer can name the allowed range.

pub mod chat;
pub mod common;
pub mod completions;
pub mod errors;
pub mod models;
pub mod tokenize;
