//! Shared helpers of the rollout tests.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::pretrained::Pretrained;
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_xla::{Client, ClientOptions, ElementType, Platform};

/// A one-device client of the installed CPU plugin, without a disk cache.
pub fn cpu_client() -> Client {
    Client::for_platform(
        Platform::Cpu,
        ClientOptions::default().compile_cache_dir(None).cpu_device_count(1),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// A tiny fixture model folder of `family` (llama, qwen2, qwen3).
pub fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../model/tests/fixtures/parity")
        .join(family)
}

/// An f32 engine for `model` (as `--model` takes it) with these sizes.
pub fn engine(client: &Client, model: &str, max_num_seqs: usize, max_model_len: usize) -> Engine {
    engine_on(client, 0, model, max_num_seqs, max_model_len)
}

/// The same on the client's device `device` (its weights there).
pub fn engine_on(client: &Client, device: usize, model: &str, max_num_seqs: usize, max_model_len: usize) -> Engine {
    engine_in(client, device, model, max_num_seqs, max_model_len, ElementType::F32)
}

/// The same with weights and KV cache in `dtype`.
pub fn engine_in(
    client: &Client,
    device: usize,
    model: &str,
    max_num_seqs: usize,
    max_model_len: usize,
    dtype: ElementType,
) -> Engine {
    let pretrained = Pretrained::open(model).unwrap();
    let decoder = Decoder::new(pretrained.config.clone());
    let params = upload_parameters(
        client,
        client.device(device).unwrap(),
        &decoder,
        pretrained.weights.as_ref(),
        dtype,
    )
    .unwrap();
    let config = EngineConfig {
        max_num_seqs,
        max_model_len,
        dtype,
        ..EngineConfig::default()
    };
    Engine::new(client, decoder, params, config).unwrap()
}

/// SmolLM2's byte-level BPE tokenizer (49,152 tokens), loaded once per test binary.
pub fn smollm2_tokenizer() -> std::sync::Arc<grpo_model::tokenizer::Tokenizer> {
    static TOKENIZER: std::sync::OnceLock<std::sync::Arc<grpo_model::tokenizer::Tokenizer>> =
        std::sync::OnceLock::new();
    TOKENIZER
        .get_or_init(|| {
            let pretrained = Pretrained::open(grpo_model::bundled::SMOLLM2_NAME).unwrap();
            std::sync::Arc::new(pretrained.tokenizer.expect("SmolLM2 has a tokenizer: run `grpo setup`"))
        })
        .clone()
}

/// The tiny byte-level BPE fixture tokenizer (600 tokens) of the model crate's tests.
pub fn tiny_tokenizer() -> std::sync::Arc<grpo_model::tokenizer::Tokenizer> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tokenizer/tiny/tokenizer.json");
    std::sync::Arc::new(grpo_model::tokenizer::Tokenizer::from_file(path).unwrap())
}
