//! grpo-model: decoder-only language models on grpo-xla.
//!
//! Hugging Face configs, weights (safetensors and GGUF), tokenizers and
//! chat templates, and the Llama / Qwen2 / Qwen3 decoders as traced programs.

#![warn(missing_docs)]

mod error;

pub use error::{Error, Result};
