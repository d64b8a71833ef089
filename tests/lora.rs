//! `--adapter` and `grpo merge` on the PEFT-made adapters of the tiny llama
//! parity model: `grpo logprobs --adapter` gives PEFT's log-probs, and so
//! does the folder `grpo merge` writes, alone; bad adapters and outputs are
//! refused naming them. `grpo serve --enable-lora --lora-modules` serves
//! the adapter by name beside the base model; LoRA flags it cannot honour
//! stop it at start, naming them.

mod common;

use std::path::{Path, PathBuf};

use common::{grpo_installed, http, logprobs, model_fixtures, model_with_tokenizer, stdout};
use grpo_model::weights::{Safetensors, WeightSource};

/// The parity inputs as `grpo logprobs` lines (each row's real tokens: the
/// first as the prompt, the rest as the completion).
fn logprobs_input(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(model_fixtures().join("parity/llama/inputs.json")).unwrap();
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
    let expected = Safetensors::open_files(&[model_fixtures().join("lora/llama/expected.safetensors")]).unwrap();
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
    let base = model_fixtures().join("parity/llama");
    let adapter = model_fixtures().join("lora/llama/adapter");
    let want = peft_logprobs();
    assert_close(
        &flat_logprobs(&base, Some(&adapter), &input),
        &want,
        "logprobs --adapter",
    );

    let model = model_with_tokenizer(dir.path(), "llama");
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
    let foreign = model_fixtures().join("lora/phi3/adapter");
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

#[test]
fn serve_with_lora_modules_serves_the_adapter_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_with_tokenizer(dir.path(), "llama");
    let adapter = model_fixtures().join("lora/llama/adapter");
    let module = format!("tuned={}", adapter.display());
    let serve = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "serve",
            "--model",
            model.to_str().unwrap(),
            "--port",
            "0",
            "--max-model-len",
            "64",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    };

    // Flags that cannot be honoured stop it at start, naming them.
    for (extra, named) in [
        (vec!["--lora-modules", module.as_str()], "--enable-lora"),
        (
            vec![
                "--enable-lora",
                "--max-lora-rank",
                "2",
                "--lora-modules",
                module.as_str(),
            ],
            "max_lora_rank 2",
        ),
        (
            vec![
                "--enable-lora",
                "--max-loras",
                "1",
                "--lora-modules",
                module.as_str(),
                "other=/x",
            ],
            "--max-loras is 1",
        ),
    ] {
        let args = serve(&extra);
        let refused = grpo_installed(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let error = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && error.contains(named), "{extra:?}: {error}");
    }

    let args = serve(&["--enable-lora", "--lora-modules", module.as_str()]);
    let (server, addr) = common::serve(&args[1..]);
    let (status, models) = http(&addr, "GET", "/v1/models", None);
    let models: serde_json::Value = serde_json::from_str(&models).unwrap();
    assert_eq!(status, 200);
    assert_eq!(models["data"][1]["id"], "tuned", "{models}");
    assert_eq!(models["data"][1]["parent"], models["data"][0]["id"], "{models}");
    let ask = |name: &serde_json::Value| {
        let body = serde_json::json!({"model": name, "prompt": [5, 17, 99], "max_tokens": 6, "temperature": 0,
                                      "ignore_eos": true, "return_token_ids": true});
        let (status, answer) = http(&addr, "POST", "/v1/completions", Some(&body));
        assert_eq!(status, 200, "{answer}");
        serde_json::from_str::<serde_json::Value>(&answer).unwrap()
    };
    let (tuned, base) = (ask(&models["data"][1]["id"]), ask(&models["data"][0]["id"]));
    assert_eq!(tuned["model"], "tuned");
    assert_ne!(tuned["choices"][0]["token_ids"], base["choices"][0]["token_ids"]);
    drop(server);
}
