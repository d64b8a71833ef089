//! A mixture-of-experts model (Qwen3-MoE) end to end: `grpo init-model`
//! writes its experts as the Hub holds them; `grpo run` and `grpo sft`
//! train it, adding the load-balancing loss only when asked and logging it
//! as `aux_loss`, the same with the experts split over two devices (FSDP);
//! their final folders load again; `grpo serve` decodes
//! greedily the tokens transformers' `generate` does.

mod common;

use std::path::{Path, PathBuf};

use common::{grpo_installed, http, lines, logprobs, model_fixtures, model_with_tokenizer, run_ok, stdout};
use grpo_model::weights::{Safetensors, WeightSource};

/// A random tiny Qwen3-MoE (8 experts, 2 per token, every layer sparse) in `dir/moe`.
fn tiny_moe(dir: &Path) -> PathBuf {
    let model = dir.join("moe");
    stdout(&grpo_installed(&[
        "init-model",
        "--family",
        "qwen3_moe",
        "--preset",
        "tiny",
        "--out",
        model.to_str().unwrap(),
    ]));
    model
}

/// The tensor names of a model folder's `model.safetensors`.
fn tensor_names(model: &Path) -> Vec<String> {
    let bytes = std::fs::read(model.join("model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.names().into_iter().map(String::from).collect()
}

/// A GRPO config over `model` with `trainer` keys added: 4 samples a step,
/// one a row, in micro-batches of 2, so each step accumulates two (on one
/// device or two: the load-balancing loss depends on how rows are grouped).
fn grpo_config(dir: &Path, model: &Path, trainer: &str) -> PathBuf {
    let rows: String = (0..8)
        .map(|i| format!("{{\"prompt\": \"Say {i}:\", \"answer\": \"{i}\"}}\n"))
        .collect();
    std::fs::write(dir.join("data.jsonl"), rows).unwrap();
    let config = dir.join("config.toml");
    let text = format!(
        "[model]\nname = {model:?}\n\n[data]\npath = \"data.jsonl\"\neval_size = 0\n\n[rollout]\ngroup_size = 2\nprompts_per_step = 2\nmax_completion_tokens = 4\nmax_model_len = 32\ndtype = \"f32\"\nseed = 3\n\n[optimizer]\nlr = 1e-3\n\n[trainer]\nmax_steps = 2\nmicro_batch_size = 2\nshare_prompts = false\ncompute_dtype = \"f32\"\neval_every = 0\n{trainer}\n\n[logging]\nout = \"out\"\n\n[[reward]]\ntype = \"regex\"\npattern = \"^ [a-m]\"\n"
    );
    std::fs::write(&config, text).unwrap();
    config
}

#[test]
fn grpo_adds_the_load_balancing_loss_only_when_asked_shards_experts_and_saves_hub_experts() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_moe(dir.path());
    let names = tensor_names(&model);
    assert!(names.contains(&"model.layers.1.mlp.experts.7.down_proj.weight".to_string()));
    assert!(names.contains(&"model.layers.0.mlp.gate.weight".to_string()));
    assert!(
        !names.iter().any(|n| n.ends_with("experts.gate_proj")),
        "no stacked tensors"
    );

    let step = |name: &str, trainer: &str, flags: &[&str]| {
        let run = dir.path().join(name);
        std::fs::create_dir(&run).unwrap();
        let config = grpo_config(&run, &model, trainer);
        run_ok(&[&["run", config.to_str().unwrap()], flags].concat());
        (lines(&run.join("out/metrics.jsonl")), run)
    };
    let (without, _) = step("off", "router_aux_loss_coef = 0", &[]);
    let (with, run) = step("on", "router_aux_loss_coef = 1.0", &[]);
    // The experts' stacks split over two devices along the expert axis.
    let fsdp = "router_aux_loss_coef = 1.0\nparallelism = \"fsdp\"";
    let (sharded, _) = step("fsdp", fsdp, &["--cpu-devices", "2"]);
    for key in ["loss", "aux_loss", "grad_norm"] {
        let (a, b) = (with[0][key].as_f64().unwrap(), sharded[0][key].as_f64().unwrap());
        assert!(
            (a - b).abs() <= 1e-4 * a.abs(),
            "{key}: one device {a}, FSDP over two {b}"
        );
    }
    for (a, b) in without.iter().zip(&with).take(1) {
        assert_eq!(a["reward"], b["reward"], "the same first rollouts");
        assert!(
            a["reward_std"].as_f64().unwrap() > 0.0,
            "rewards that differ: a policy loss too"
        );
        assert!(a.get("aux_loss").is_none(), "no balance loss at coefficient 0: {a}");
        let balance = b["aux_loss"].as_f64().unwrap();
        // 2 for a router that spreads tokens evenly over the experts, 8 at worst.
        assert!((1.0..8.0).contains(&balance), "aux_loss {balance}");
        let (plain, balanced) = (a["loss"].as_f64().unwrap(), b["loss"].as_f64().unwrap());
        assert!(
            (balanced - plain - balance).abs() <= 1e-4 * balance,
            "the loss adds 1.0 × aux_loss: {plain} + {balance} vs {balanced}"
        );
        assert_ne!(a["grad_norm"], b["grad_norm"], "the balance loss has a gradient");
    }
    let final_dir = run.join("out/final");
    let saved = tensor_names(&final_dir);
    assert_eq!(saved.len(), names.len(), "the final folder holds the Hub's tensors");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(final_dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (config["model_type"].as_str(), config["num_experts"].as_u64()),
        (Some("qwen3_moe"), Some(8))
    );
    let input = dir.path().join("score.jsonl");
    std::fs::write(&input, "{\"prompt\": \"Say 3:\", \"completion\": \" 3\"}\n").unwrap();
    let (before, after) = (logprobs(&model, None, &input), logprobs(&final_dir, None, &input));
    assert_eq!(before[0].len(), after[0].len());
    assert_ne!(before, after, "training changed the model");
}

#[test]
fn sft_trains_a_mixture_of_experts_with_the_model_s_own_balance_setting() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_moe(dir.path());
    // The model asks for the loss itself (transformers' output_router_logits).
    let path = model.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["output_router_logits"] = true.into();
    config["router_aux_loss_coef"] = 0.5.into();
    std::fs::write(&path, config.to_string()).unwrap();
    let rows: String = (0..6)
        .map(|i| format!("{{\"prompt\": \"{i} + 1 =\", \"completion\": \" {}.\"}}\n", i + 1))
        .collect();
    std::fs::write(dir.path().join("data.jsonl"), rows).unwrap();
    let sft = dir.path().join("sft.toml");
    std::fs::write(
        &sft,
        format!("[model]\nname = {model:?}\n\n[data]\npath = \"data.jsonl\"\neval_size = 0\n\n[optimizer]\nlr = 1e-3\n\n[trainer]\nmax_steps = 2\nbatch_size = 4\nmicro_batch_size = 2\neval_every = 0\nmax_length = 32\n\n[logging]\nout = \"out\"\n"),
    )
    .unwrap();
    run_ok(&["sft", sft.to_str().unwrap()]);
    let metrics = lines(&dir.path().join("out/metrics.jsonl"));
    let trained: Vec<&serde_json::Value> = metrics.iter().filter(|l| l.get("loss").is_some()).collect();
    assert_eq!(trained.len(), 2);
    for line in trained {
        let balance = line["aux_loss"].as_f64().unwrap();
        assert!((1.0..8.0).contains(&balance), "aux_loss {balance} in {line}");
    }

    // A dense model has no router to balance: the key is refused, named.
    let dense = common::tiny_model(dir.path());
    let refused = dir.path().join("dense.toml");
    std::fs::write(
        &refused,
        std::fs::read_to_string(&sft)
            .unwrap()
            .replace(&format!("{model:?}"), &format!("{dense:?}"))
            .replace("max_length = 32\n", "max_length = 32\nrouter_aux_loss_coef = 0.1\n")
            .replace("\"out\"", "\"out2\""),
    )
    .unwrap();
    let output = grpo_installed(&["sft", refused.to_str().unwrap()]);
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && error.contains("router_aux_loss_coef"),
        "{error}"
    );
}

#[test]
fn serve_decodes_the_tokens_transformers_generates() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_with_tokenizer(dir.path(), "qwen3_moe");
    let expected = model_fixtures().join("parity/qwen3_moe/expected.safetensors");
    let greedy: Vec<u64> = Safetensors::open_files(&[expected])
        .unwrap()
        .tensor("greedy")
        .unwrap()
        .data
        .iter()
        .map(|&t| t as u64)
        .collect();
    let model = model.to_str().unwrap();
    let (server, addr) = common::serve(&["--model", model, "--port", "0", "--max-model-len", "64"]);
    let (_, models) = http(&addr, "GET", "/v1/models", None);
    let models: serde_json::Value = serde_json::from_str(&models).unwrap();
    let name = models["data"][0]["id"].clone();
    let ask = |prompt: serde_json::Value| {
        let body = serde_json::json!({"model": name, "prompt": prompt, "max_tokens": 6, "temperature": 0,
                                      "ignore_eos": true, "return_token_ids": true});
        let (status, answer) = http(&addr, "POST", "/v1/completions", Some(&body));
        assert_eq!(status, 200, "{answer}");
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        answer["choices"][0].clone()
    };
    let answer = ask(serde_json::json!([5, 17, 99]));
    drop(server);
    let ids: Vec<u64> = answer["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(ids, greedy, "grpo serve vs transformers generate: {answer}");
}
