//! grpo-model: decoder-only language models on grpo-xla.
//!
//! Hugging Face configs, weights (safetensors and GGUF), tokenizers and
//! chat templates, tool calls in model text, and the decoders (Llama,
//! Mistral, Phi-3, Qwen2, Qwen3, Qwen3-MoE, Gemma 2 and 3) as traced programs.

#![warn(missing_docs)]

pub mod bundled;
pub mod chat;
pub mod config;
pub mod decoder;
mod error;
pub mod experts;
pub mod gguf;
pub mod init;
pub mod load;
pub mod logprobs;
pub mod lora;
pub mod moe;
pub mod names;
pub mod pretrained;
pub mod text;
pub mod tokenizer;
pub mod tools;
pub mod weights;

pub use error::{Error, Result};
