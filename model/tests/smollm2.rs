//! The bundled SmolLM2-135M-Instruct GGUF against transformers loading the
//! same file (its own dequantization and un-permutation): tokenizer ids and
//! per-token log-probs; and a GGUF → folder conversion that scores the same.

mod common;

use common::cpu_client;
use grpo_model::bundled::smollm2_gguf_path;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::logprobs::LogprobsRunner;
use grpo_model::pretrained::{Pretrained, convert_gguf};
use grpo_xla::ElementType;
use serde_json::Value;

fn gguf() -> std::path::PathBuf {
    let path = smollm2_gguf_path();
    assert!(path.is_file(), "{} is missing: run `grpo setup`", path.display());
    path
}

fn cases() -> Vec<(String, Vec<u32>, Vec<f32>)> {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/smollm2/logprobs.json"
    ))
    .unwrap();
    let value: Value = serde_json::from_str(&text).unwrap();
    value["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let ids = c["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let lps = c["logprobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap() as f32)
                .collect();
            (c["text"].as_str().unwrap().to_string(), ids, lps)
        })
        .collect()
}

/// Scores the fixture's sequences with `model`; returns the worst difference.
fn worst_difference(model: &Pretrained) -> f32 {
    let client = cpu_client();
    let decoder = Decoder::new(model.config.clone());
    let params = upload_parameters(
        &client,
        client.device(0).unwrap(),
        &decoder,
        model.weights.as_ref(),
        ElementType::F32,
    )
    .unwrap();
    let runner = LogprobsRunner::new(&client, decoder, ElementType::F32);
    let cases = cases();
    let tokenizer = model.tokenizer.as_ref().expect("a tokenizer");
    for (text, ids, _) in &cases {
        assert_eq!(&tokenizer.encode(text, true).unwrap(), ids, "tokenizing {text:?}");
    }
    let sequences: Vec<Vec<u32>> = cases.iter().map(|c| c.1.clone()).collect();
    let stats = runner.run(&params, &sequences).unwrap();
    let mut worst = 0.0f32;
    for ((_, _, want), got) in cases.iter().zip(&stats) {
        assert_eq!(got.logprobs.len(), want.len());
        for (g, w) in got.logprobs.iter().zip(want) {
            worst = worst.max((g - w).abs());
        }
    }
    worst
}

#[test]
fn the_gguf_scores_like_transformers() {
    let model = Pretrained::open(gguf().to_str().unwrap()).unwrap();
    let worst = worst_difference(&model);
    println!("max |grpo - transformers| log-prob: {worst:e}");
    assert!(worst <= 1e-3, "max log-prob difference {worst}");
}

#[test]
fn a_converted_folder_scores_the_same() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(convert_gguf(&gguf(), dir.path()).unwrap(), 272);
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        assert!(dir.path().join(file).is_file(), "{file} missing");
    }
    let model = Pretrained::open(dir.path().to_str().unwrap()).unwrap();
    assert!(worst_difference(&model) <= 1e-3);
}
