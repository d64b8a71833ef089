//! `grpo sft` end to end on a tiny random model: metrics lines with the
//! eval loss, a final folder `grpo logprobs` scores, a bad key refused
//! naming it, an output folder that already holds a run refused, and a run
//! killed with SIGKILL that resumes to the same parameters as a run never
//! interrupted.

mod common;

use std::path::{Path, PathBuf};

use common::{grpo_installed, lines, logprobs, run_ok, stdout, tiny_model};

/// A tiny random model, a JSONL of sums and an SFT config in `dir`.
fn tiny_sft(dir: &Path, extra: &str) -> PathBuf {
    let model = tiny_model(dir);
    let rows: String = (0..10)
        .map(|i| format!("{{\"prompt\": \"{i} + 1 =\", \"completion\": \" {}.\"}}\n", i + 1))
        .collect();
    std::fs::write(dir.join("data.jsonl"), rows).unwrap();
    let config = dir.join("config.toml");
    let text = format!(
        "[model]\nname = {model:?}\n\n[data]\npath = \"data.jsonl\"\neval_size = 2\n\n[optimizer]\nlr = 1e-3\n\n[trainer]\nmax_steps = 3\nbatch_size = 4\nmicro_batch_size = 2\neval_every = 2\nmax_length = 32\n{extra}\n[logging]\nout = \"out\"\n"
    );
    std::fs::write(&config, text).unwrap();
    config
}

#[test]
fn sft_writes_metrics_and_a_final_model_that_logprobs_scores() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_sft(dir.path(), "");
    stdout(&grpo_installed(&["sft", config.to_str().unwrap()]));
    let out = dir.path().join("out");
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let steps: Vec<u64> = lines.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [0, 1, 2, 3], "an eval line, then one line per step");
    assert!(lines[0]["eval_loss"].as_f64().unwrap() > 0.0);
    for line in &lines[1..] {
        for key in ["loss", "grad_norm", "learning_rate", "step_time"] {
            assert!(line[key].as_f64().is_some_and(f64::is_finite), "{key} in {line}");
        }
        assert!(line["tokens"].as_u64().unwrap() > 0);
    }
    assert!(lines[1].get("eval_loss").is_none());
    assert!(lines[2]["eval_loss"].is_f64() && lines[3]["eval_loss"].is_f64());

    let input = dir.path().join("score.jsonl");
    std::fs::write(&input, "{\"prompt\": \"3 + 1 =\", \"completion\": \" 4.\"}\n").unwrap();
    let final_dir = out.join("final");
    let scored = stdout(&grpo_installed(&[
        "logprobs",
        "--model",
        final_dir.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]));
    let line: serde_json::Value = serde_json::from_str(scored.lines().next().unwrap()).unwrap();
    let logprobs = line["logprobs"].as_array().unwrap();
    assert!(!logprobs.is_empty() && logprobs.iter().all(|v| v.as_f64().is_some_and(|x| x <= 0.0)));

    let again = grpo_installed(&["sft", config.to_str().unwrap()]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds a run"));
}

#[test]
fn sft_refuses_an_unknown_key_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_sft(dir.path(), "warmup = 3\n");
    let out = grpo_installed(&["sft", config.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("trainer.warmup"), "{stderr}");
    let out = grpo_installed(&["sft", config.to_str().unwrap(), "--set", "trainer.warmup=1"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("trainer.warmup"));
}

#[test]
fn an_sft_run_killed_between_checkpoints_resumes_to_the_same_parameters() {
    let settings = "\n[checkpoint]\nevery = 20\nkeep_last = 0\n";
    let steps = ["--set", "trainer.max_steps=40"];
    let whole = tempfile::tempdir().unwrap();
    let config = tiny_sft(whole.path(), settings);
    run_ok(&[&["sft", config.to_str().unwrap()][..], &steps].concat());

    let killed = tempfile::tempdir().unwrap();
    let config = tiny_sft(killed.path(), settings);
    let out = killed.path().join("out");
    common::kill_when(&[&["sft", config.to_str().unwrap()][..], &steps].concat(), || {
        out.join("checkpoint-20").is_dir()
    });
    assert!(!out.join("checkpoint-40").exists());
    run_ok(&[&["sft", config.to_str().unwrap(), "--resume"][..], &steps].concat());
    common::assert_same_checkpoint(&whole.path().join("out/checkpoint-40"), &out.join("checkpoint-40"));
    let losses = |dir: &Path| -> Vec<(u64, f64)> {
        lines(&dir.join("out/metrics.jsonl"))
            .iter()
            .filter(|l| l.get("loss").is_some())
            .map(|l| (l["step"].as_u64().unwrap(), l["loss"].as_f64().unwrap()))
            .collect()
    };
    assert_eq!(
        losses(killed.path()),
        losses(whole.path()),
        "each step logged once, the same"
    );
    assert_eq!(losses(whole.path()).len(), 40);
}

#[test]
fn sft_with_lora_on_a_bf16_base_trains_adapters_that_logprobs_applies() {
    let dir = tempfile::tempdir().unwrap();
    // The base held in bf16: the eval's log-prob program reads it in f32.
    let lora = "\n[lora]\nrank = 4\nalpha = 8\ntarget_modules = [\"q_proj\", \"v_proj\"]\nbase_dtype = \"bf16\"\n";
    let config = tiny_sft(dir.path(), lora);
    stdout(&grpo_installed(&[
        "sft",
        config.to_str().unwrap(),
        "--set",
        "optimizer.lr=1e-2",
    ]));
    let metrics = lines(&dir.path().join("out/metrics.jsonl"));
    let eval: Vec<f64> = metrics.iter().filter_map(|l| l["eval_loss"].as_f64()).collect();
    assert!(
        eval.last() < eval.first(),
        "the adapters lowered the eval loss: {eval:?}"
    );
    let adapters = dir.path().join("out/final");
    assert!(adapters.join("adapter_config.json").is_file() && !adapters.join("model.safetensors").exists());

    let input = dir.path().join("score.jsonl");
    std::fs::write(&input, "{\"prompt\": \"3 + 1 =\", \"completion\": \" 4.\"}\n").unwrap();
    let model = dir.path().join("tiny");
    let score = |adapter: Option<&Path>| -> f64 { logprobs(&model, adapter, &input)[0].iter().sum() };
    let (base, tuned) = (score(None), score(Some(&adapters)));
    assert!(
        tuned > base,
        "the trained adapters make the answer likelier: {base} → {tuned}"
    );
}

/// The zeros the config sweep (`learner/tests/config.rs`) takes run
/// together for a step; a run of 0 steps writes the final folder.
#[test]
fn every_zero_the_sft_config_takes_runs() {
    let zeros = [
        "checkpoint.every=0",
        "checkpoint.keep_last=0",
        "data.eval_size=0",
        "data.seed=0",
        "optimizer.max_grad_norm=0",
        "optimizer.warmup_steps=0",
        "optimizer.weight_decay=0",
        "trainer.devices=0",
        "trainer.eval_every=0",
    ];
    for steps in [1, 0] {
        let dir = tempfile::tempdir().unwrap();
        let config = tiny_sft(dir.path(), "");
        let max_steps = format!("trainer.max_steps={steps}");
        let mut args = vec!["sft", config.to_str().unwrap(), "--set", max_steps.as_str()];
        for zero in zeros {
            args.extend(["--set", zero]);
        }
        run_ok(&args);
        let out = dir.path().join("out");
        assert_eq!(
            lines(&out.join("metrics.jsonl")).len(),
            steps,
            "one line a step, no eval"
        );
        assert!(out.join("final/model.safetensors").is_file());
    }
}
