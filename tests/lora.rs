//! `--adapter` and `grpo merge` on the PEFT-made adapters of the tiny llama
//! parity model: `grpo logprobs --adapter` gives PEFT's log-probs, and so
//! does the folder `grpo merge` writes, alone; bad adapters and outputs are
//! refused naming them.

mod common;

use std::path::{Path, PathBuf};

use common::{grpo_installed, logprobs, stdout};
use grpo_model::weights::{Safetensors, WeightSource};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("model/tests/fixtures")
}

/// The parity inputs as `grpo logprobs` lines (each row's real tokens: the
/// first as the prompt, the rest as the completion).
fn logprobs_input(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(fixtures().join("parity/llama/inputs.json")).unwrap();
    let inputs: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut lines = String::new();
    for (ids, mask) in inputs["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .zip(inputs["attention_mask"].as_array().unwrap())
    {
        let real: Vec<u64> = ids
            .as_array()
            .unwrap()
            .iter()
            .zip(mask.as_array().unwrap())
            .filter(|(_, m)| m.as_u64() == Some(1))
            .map(|(id, _)| id.as_u64().unwrap())
            .collect();
        let line = serde_json::json!({"prompt_ids": &real[..1], "completion_ids": &real[1..]});
        lines.push_str(&format!("{line}\n"));
    }
    let path = dir.join("input.jsonl");
    std::fs::write(&path, lines).unwrap();
    path
}

/// `grpo logprobs` of the parity inputs under `model` (with `--adapter` if given), flattened.
fn flat_logprobs(model: &Path, adapter: Option<&Path>, input: &Path) -> Vec<f32> {
    logprobs(model, adapter, input)
        .into_iter()
        .flatten()
        .map(|v| v as f32)
        .collect()
}

/// PEFT's log-probs of the parity inputs' real targets, flattened.
fn peft_logprobs() -> Vec<f32> {
    let expected = Safetensors::open_files(&[fixtures().join("lora/llama/expected.safetensors")]).unwrap();
    let (values, mask) = (
        expected.tensor("logprobs").unwrap().data,
        expected.tensor("mask").unwrap().data,
    );
    values
        .into_iter()
        .zip(mask)
        .filter(|(_, m)| *m != 0.0)
        .map(|(v, _)| v)
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let worst = got.iter().zip(want).fold(0.0f32, |m, (g, w)| m.max((g - w).abs()));
    println!("{what}: max |grpo − PEFT| {worst:e}");
    assert!(worst <= 1e-4, "{what}: {worst}");
}

#[test]
fn an_adapter_applied_or_merged_scores_as_peft_scores_it() {
    let dir = tempfile::tempdir().unwrap();
    let input = logprobs_input(dir.path());
    let base = fixtures().join("parity/llama");
    let adapter = fixtures().join("lora/llama/adapter");
    let want = peft_logprobs();
    assert_close(
        &flat_logprobs(&base, Some(&adapter), &input),
        &want,
        "logprobs --adapter",
    );

    // A base with a tokenizer (merge writes one into the folder).
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    for (from, name) in [
        (&base, "config.json"),
        (&base, "model.safetensors"),
        (&fixtures().join("tokenizer/tiny"), "tokenizer.json"),
        (&fixtures().join("tokenizer/tiny"), "tokenizer_config.json"),
    ] {
        std::fs::copy(from.join(name), model.join(name)).unwrap();
    }
    let merged = dir.path().join("merged");
    let merge = [
        "merge",
        "--base",
        model.to_str().unwrap(),
        "--adapter",
        adapter.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ];
    let said = stdout(&grpo_installed(&merge));
    assert!(said.contains("rank 4, alpha 8"), "{said}");
    assert!(merged.join("tokenizer.json").is_file() && !merged.join("adapter_config.json").exists());
    assert_close(&flat_logprobs(&merged, None, &input), &want, "the merged folder");

    let again = grpo_installed(&merge);
    let error = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success() && error.contains("already exists"), "{error}");

    // Phi-3's adapters (on its fused projections) do not fit the llama model: refused, naming them.
    let foreign = fixtures().join("lora/phi3/adapter");
    let refused = grpo_installed(&[
        "logprobs",
        "--model",
        base.to_str().unwrap(),
        "--adapter",
        foreign.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{error}");
    assert!(error.contains("--adapter") && error.contains("gate_up_proj"), "{error}");
}
