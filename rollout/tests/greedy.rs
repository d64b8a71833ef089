//! Greedy generation token-identical to transformers' `generate` (fixtures
//! by `tools/make_generate_fixtures.py`): the tiny Llama, Qwen2 and Qwen3
//! models, and SmolLM2-135M-Instruct after `grpo setup` (chat prompts, 32
//! new tokens, stopping at its EOS).

mod common;

use std::path::PathBuf;

use common::{cpu_client, fixture};
use grpo_rollout::request::{Request, SamplingParams};
use serde_json::Value;

fn expected() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/generate/expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// Runs every case of `cases` with `model` greedily and compares the tokens.
fn check(model: &str, cases: &[&Value], max_tokens: usize, max_model_len: usize) {
    let client = cpu_client();
    let mut engine = common::engine(&client, model, cases.len(), max_model_len);
    let greedy = SamplingParams {
        max_tokens,
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let requests: Vec<Request> = cases
        .iter()
        .map(|c| Request {
            prompt: ids(&c["prompt_ids"]),
            params: greedy.clone(),
        })
        .collect();
    let completions = engine.generate(&requests).unwrap();
    for (case, completion) in cases.iter().zip(&completions) {
        assert_eq!(
            completion[0].tokens,
            ids(&case["generated_ids"]),
            "{model}: prompt {:?}",
            case["prompt_ids"]
        );
    }
}

#[test]
fn tiny_models_match_transformers_generate() {
    let expected = expected();
    for family in ["llama", "qwen2", "qwen3"] {
        let cases: Vec<&Value> = expected["tiny"]["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["family"] == family)
            .collect();
        assert_eq!(cases.len(), 3, "{family}");
        check(fixture(family).to_str().unwrap(), &cases, 16, 64);
    }
}

#[test]
fn smollm2_matches_transformers_generate() {
    let dir = grpo_model::pretrained::bundled_model_dir();
    assert!(
        dir.join("config.json").is_file(),
        "{} is missing: run `grpo setup`",
        dir.display()
    );
    let expected = expected();
    let cases: Vec<&Value> = expected["smollm2"]["cases"].as_array().unwrap().iter().collect();
    assert_eq!(cases.len(), 5);
    check(grpo_model::bundled::SMOLLM2_NAME, &cases, 32, 128);
}
