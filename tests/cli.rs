//! The `grpo` binary end to end: devices, the matmul benchmark, the disk
//! compile cache across processes, errors for bad choices, and two
//! `grpo setup`s at once into an empty cache folder.

mod common;

use std::path::PathBuf;

use common::{cpu_plugin, grpo, grpo_installed, stdout};

#[test]
fn devices_lists_the_plugin_and_its_devices() {
    let cache = tempfile::tempdir().unwrap();
    let text = stdout(&grpo(cache.path(), &["devices", "--cpu-devices", "2"]));
    assert!(text.contains(&cpu_plugin().display().to_string()), "{text}");
    assert!(text.contains("PJRT API:  0."), "{text}");
    assert!(text.contains("devices:   2"), "{text}");
    assert!(text.contains("[1] id 1 kind cpu"), "{text}");
}

#[test]
fn bench_matmul_reports_rates_and_reuses_the_disk_cache() {
    let cache = tempfile::tempdir().unwrap();
    let args = [
        "bench", "matmul", "--sizes", "32,64", "--dtypes", "f32,bf16", "--runs", "3", "--warmup", "1",
    ];
    let first = stdout(&grpo(cache.path(), &args));
    let rows: Vec<&str> = first
        .lines()
        .filter(|l| l.starts_with("f32") || l.starts_with("bf16"))
        .collect();
    assert_eq!(rows.len(), 4, "{first}");
    for row in rows {
        let rate: f64 = row.split_whitespace().nth(4).unwrap().parse().unwrap();
        assert!(rate > 0.0 && rate.is_finite(), "{row}");
    }
    assert!(
        first.contains("programs: 4 compiled, 0 loaded from the disk cache"),
        "{first}"
    );
    let second = stdout(&grpo(cache.path(), &args));
    assert!(
        second.contains("programs: 0 compiled, 4 loaded from the disk cache"),
        "{second}"
    );
}

#[test]
fn bad_choices_are_errors_that_say_what_to_do() {
    let cache = tempfile::tempdir().unwrap();
    let platform = grpo(cache.path(), &["devices", "--platform", "gpu"]);
    assert!(!platform.status.success());
    let message = String::from_utf8_lossy(&platform.stderr);
    assert!(message.contains("choose cpu, cuda or tpu"), "{message}");

    let missing = grpo(cache.path(), &["devices", "--plugin", "/nonexistent/plugin.so"]);
    assert!(!missing.status.success());
    let message = String::from_utf8_lossy(&missing.stderr);
    assert!(message.contains("/nonexistent/plugin.so"), "{message}");

    let dtype = grpo(cache.path(), &["bench", "matmul", "--dtypes", "s32"]);
    let message = String::from_utf8_lossy(&dtype.stderr);
    assert!(
        !dtype.status.success() && message.contains("not a float type"),
        "{message}"
    );
}

fn parity_fixture(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("model/tests/fixtures/parity")
        .join(family)
}

#[test]
fn logprobs_of_token_ids_match_transformers() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    // Row 0 of the qwen3 fixture: prompt = its first 5 tokens, completion = the other 7.
    let fixture = parity_fixture("qwen3");
    let inputs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("inputs.json")).unwrap()).unwrap();
    let ids: Vec<u64> = inputs["input_ids"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let line = serde_json::json!({"prompt_ids": &ids[..5], "completion_ids": &ids[5..]});
    std::fs::write(&input, format!("{line}\n\n{line}\n")).unwrap();
    let text = stdout(&grpo(
        dir.path(),
        &[
            "logprobs",
            "--model",
            fixture.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
        ],
    ));
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        lines.len(),
        2,
        "one output line per request, blank lines skipped: {text}"
    );
    let got: Vec<f64> = lines[0]["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(got.len(), 7);
    // Expected: transformers' log-probs of tokens 5..12 (positions 4..11 of the fixture).
    let expected = std::fs::read(fixture.join("expected.safetensors")).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&expected).unwrap();
    let view = tensors.tensor("logprobs").unwrap();
    let want: Vec<f32> = view
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    for (i, g) in got.iter().enumerate() {
        assert!(
            (g - f64::from(want[4 + i])).abs() < 1e-4,
            "token {i}: {g} vs {}",
            want[4 + i]
        );
    }
}

#[test]
fn logprobs_input_errors_name_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let model = parity_fixture("llama");
    std::fs::write(
        &input,
        "{\"prompt_ids\": [1, 2], \"completion_ids\": [3]}\n{\"prompt\": \"hi\", \"completion\": \"x\"}\n",
    )
    .unwrap();
    let out = grpo(
        dir.path(),
        &[
            "logprobs",
            "--model",
            model.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
        ],
    );
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && message.contains("in.jsonl:2") && message.contains("tokenizer"),
        "{message}"
    );
    std::fs::write(&input, "{\"prompt_ids\": [1, 2], \"completion_ids\": []}\n").unwrap();
    let out = grpo(
        dir.path(),
        &[
            "logprobs",
            "--model",
            model.to_str().unwrap(),
            "--input",
            input.to_str().unwrap(),
        ],
    );
    let message = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && message.contains("in.jsonl:1"), "{message}");
}

#[test]
fn init_model_writes_a_model_that_scores_text() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    let out = grpo_installed(&["init-model", "--family", "qwen2", "--out", model.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        "{\"prompt\": \"Janet has 1234 eggs.\", \"completion\": \" She eats 3.\"}\n",
    )
    .unwrap();
    let text = stdout(&grpo_installed(&[
        "logprobs",
        "--model",
        model.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]));
    let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    let logprobs = line["logprobs"].as_array().unwrap();
    // " She eats 3." is Ġshe-like tokens + Ġ + 3 + .: at least 4 tokens, each about -ln(49152) for random weights.
    assert!(logprobs.len() >= 4, "{text}");
    assert!(
        logprobs.iter().all(|v| (v.as_f64().unwrap() + 10.8).abs() < 1.5),
        "{text}"
    );
}

#[test]
fn generate_with_the_chat_template_matches_transformers_greedy() {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("model/tests/fixtures/generate/expected.json");
    let expected: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let case = &expected["smollm2"]["cases"][0];
    let question = case["question"].as_str().unwrap();
    let out = grpo_installed(&[
        "generate",
        "--prompt",
        question,
        "--chat",
        "--temperature",
        "0",
        "--max-tokens",
        "32",
        "--json",
    ]);
    let text = stdout(&out);
    let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
    assert_eq!(line["token_ids"], case["generated_ids"], "{text}");
    assert_eq!(line["finish_reason"], "stop");
    let logprobs = line["logprobs"].as_array().unwrap();
    assert_eq!(logprobs.len(), line["token_ids"].as_array().unwrap().len());
    assert!(logprobs.iter().all(|v| v.as_f64().unwrap() <= 0.0));
    let bad = grpo_installed(&["generate", "--prompt", "x", "--top-p", "0"]);
    let message = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && message.contains("top_p"), "{message}");
}

#[test]
fn two_setups_at_once_into_an_empty_cache_folder_both_succeed() {
    let cache = tempfile::tempdir().unwrap();
    let setup = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_grpo"))
            .arg("setup")
            .env("GRPO_CACHE_DIR", cache.path())
            .env_remove("GRPO_PJRT_PLUGIN")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (first, second) = (setup(), setup());
    for child in [first, second] {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("smollm2-135m-instruct ready"));
    }
    let model = cache.path().join("models/smollm2-135m-instruct");
    assert!(model.join("config.json").is_file() && model.join("model.safetensors").is_file());
    let leftovers: Vec<_> = std::fs::read_dir(cache.path().join("plugins"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("installing"))
        .collect();
    assert!(leftovers.is_empty(), "no staging folder left: {leftovers:?}");
}
