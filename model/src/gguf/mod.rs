//! GGUF, llama.cpp's model file: a memory-mapped reader with typed metadata,
//! dequantization of the common ggml types to f32, and the mapping of
//! `llama`, `qwen2`, `qwen3` and `qwen3moe` files to Hugging Face names,
//! layouts and `config.json`.

mod dequant;
mod hf;
mod metadata;
mod reader;

pub use dequant::GgmlType;
pub use hf::{HfTensor, hf_config_json, hf_tensor_f32, hf_tensor_name};
pub use metadata::{MetadataValue, ValueType};
pub use reader::{GgufFile, TensorInfo};
