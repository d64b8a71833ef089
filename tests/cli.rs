//! The `grpo` binary end to end: devices, the matmul benchmark, the disk
//! compile cache across processes, and errors for bad choices.

use std::path::PathBuf;
use std::process::{Command, Output};

use grpo_xla::{Platform, PluginSearch};

/// The installed CPU plugin, so runs with a fresh cache folder skip setup.
fn cpu_plugin() -> PathBuf {
    PluginSearch::from_environment(Platform::Cpu)
        .find(Platform::Cpu)
        .unwrap_or_else(|e| panic!("{e}"))
}

fn grpo(cache: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpo"))
        .args(args)
        .env("GRPO_CACHE_DIR", cache)
        .env("GRPO_PJRT_PLUGIN", cpu_plugin())
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "grpo failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

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

/// `grpo` with the real cache folder (for the bundled model).
fn grpo_installed(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpo")).args(args).output().unwrap()
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

/// A run config for a tiny random model in `dir` (see `grpo_run_…`), with `extra` appended.
fn tiny_run(dir: &std::path::Path, extra: &str) -> PathBuf {
    let model = dir.join("tiny");
    stdout(&grpo_installed(&[
        "init-model",
        "--family",
        "llama",
        "--preset",
        "tiny",
        "--out",
        model.to_str().unwrap(),
    ]));
    let rows: String = (0..12)
        .map(|i| format!("{{\"prompt\": \"Say {}:\", \"answer\": \"{}\"}}\n", i % 10, i % 10))
        .collect();
    std::fs::write(dir.join("data.jsonl"), rows).unwrap();
    let config = dir.join("config.toml");
    let text = format!(
        "[model]\nname = {model:?}\n\n[data]\npath = \"data.jsonl\"\neval_size = 2\n\n[rollout]\ngroup_size = 2\nprompts_per_step = 2\nmax_completion_tokens = 4\nmax_model_len = 32\n\n[optimizer]\nlr = 1e-3\n\n[trainer]\nmax_steps = 2\nmicro_batch_size = 4\n\n[logging]\nout = \"out\"\n\n[[reward]]\ntype = \"contains\"\n{extra}"
    );
    std::fs::write(&config, text).unwrap();
    config
}

#[test]
fn grpo_run_appends_metrics_and_writes_the_final_model() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(dir.path(), "");
    let config = config.to_str().unwrap();
    for _ in 0..2 {
        let out = grpo_installed(&["run", config]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let metrics = std::fs::read_to_string(dir.path().join("out/metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = metrics.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 4, "two runs of two steps append: {metrics}");
    for line in &lines {
        for key in [
            "reward",
            "reward_std",
            "frac_reward_zero_std",
            "loss",
            "grad_norm",
            "entropy",
            "step_time",
        ] {
            assert!(line[key].as_f64().is_some_and(f64::is_finite), "{key} in {line}");
        }
    }
    // The final folder is a model folder grpo loads and scores with (one line through XLA).
    let final_dir = dir.path().join("out/final");
    let input = dir.path().join("score.jsonl");
    std::fs::write(&input, "{\"prompt_ids\": [1, 2], \"completion_ids\": [3]}\n").unwrap();
    let scored = grpo_installed(&[
        "logprobs",
        "--model",
        final_dir.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(scored.status.success(), "{}", String::from_utf8_lossy(&scored.stderr));
}

#[test]
fn grpo_run_refuses_bad_configs_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(dir.path(), "");
    let config = config.to_str().unwrap();
    for (set, needle) in [
        ("rollout.group_size=1", "group_size"),
        ("optimizer.lr=0.0", "lr"),
        ("trainer.typo=3", "typo"),
        ("algorithm.loss_type=\"ppo\"", "loss_type"),
    ] {
        let out = grpo_installed(&["run", config, "--set", set]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{set}: {err}");
    }
    assert!(
        !dir.path().join("out").exists(),
        "nothing is written before the config is valid"
    );
}
