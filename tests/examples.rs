//! Every example config runs as a smoke test with `--max-steps 1` (its
//! learning-rate warm-up cut short, with a warning): one step on the
//! bundled SmolLM2, a metrics line and the final folder. Evaluations and
//! intermediate checkpoints are switched off to keep it short; the
//! arithmetic example's own cadence runs in `tests/reference.rs`.
//! `examples/gsm8k` is left out: one step of its 256-token completions
//! needs more memory than the 24 GiB development machines have.

mod common;

use std::path::{Path, PathBuf};

use common::{grpo_installed, lines};

/// `grpo COMMAND examples/EXAMPLE --max-steps 1` into a fresh folder, with
/// `sets` as overrides; returns its stderr after checking what it wrote.
fn smoke(command: &str, example: &str, sets: &[&str]) -> String {
    let out = tempfile::tempdir().unwrap();
    let config = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples").join(example);
    let mut args = vec![command, config.to_str().unwrap(), "--max-steps", "1"];
    args.extend(["--out", out.path().to_str().unwrap()]);
    for set in sets {
        args.extend(["--set", set]);
    }
    let done = grpo_installed(&args);
    let stderr = String::from_utf8_lossy(&done.stderr).into_owned();
    assert!(done.status.success(), "{example}: {stderr}");
    let steps: Vec<u64> = lines(&out.path().join("metrics.jsonl"))
        .iter()
        .filter(|l| l.get("loss").is_some())
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1], "{example}: one step logged");
    assert!(final_model(out.path()), "{example}: a final folder");
    stderr
}

/// Whether `out/final/` holds a model folder (or, from a `[lora]` run, an adapter folder).
fn final_model(out: &Path) -> bool {
    let dir = out.join("final");
    let model = dir.join("config.json").is_file() && dir.join("model.safetensors").is_file();
    let adapters = dir.join("adapter_config.json").is_file() && dir.join("adapter_model.safetensors").is_file();
    model || adapters
}

const QUICK_RUN: &[&str] = &["trainer.eval_every=0", "checkpoint.every=0"];

#[test]
fn the_arithmetic_example_runs_one_step_with_its_warm_up_cut_short() {
    let stderr = smoke("run", "arithmetic/config.toml", QUICK_RUN);
    assert!(stderr.contains("5 warm-up steps are more than the run's 1"), "{stderr}");
}

#[test]
fn the_arithmetic_lora_example_runs_one_step() {
    smoke("run", "arithmetic/lora.toml", QUICK_RUN);
}

#[test]
fn the_reference_config_runs_one_step() {
    smoke("run", "reference.toml", QUICK_RUN);
}

#[test]
fn the_sft_example_runs_one_step() {
    let stderr = smoke("sft", "sft/config.toml", &["trainer.eval_every=0"]);
    assert!(stderr.contains("warm-up steps are more than the run's 1"), "{stderr}");
}

#[test]
fn the_calculator_examples_run_one_step_each() {
    // Small batches: a step of the examples' own holds 16 sequences of
    // about 300 tokens.
    let small_sft = [
        "trainer.eval_every=0",
        "trainer.batch_size=2",
        "trainer.micro_batch_size=2",
    ];
    smoke("sft", "calculator/sft_tool.toml", &small_sft);
    smoke("sft", "calculator/sft_plain.toml", &small_sft);
    // From the bundled model (the SFT warm starts are not made here).
    let small = [
        "model.name=\"smollm2-135m-instruct\"",
        "rollout.group_size=2",
        "rollout.prompts_per_step=2",
        "trainer.micro_batch_size=4",
        "trainer.eval_every=0",
        "checkpoint.every=0",
    ];
    smoke("run", "calculator/config.toml", &small);
    smoke("run", "calculator/config_plain.toml", &small);
}

/// The tool the calculator's SFT transcripts offer is the built-in
/// `calculate` exactly as `grpo run` offers it, so the SFT prompts are the
/// GRPO prompts.
#[test]
fn the_calculator_transcripts_offer_the_built_in_tool() {
    use grpo_env::toolbox::ToolFunction;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/calculator/sft_tool.jsonl");
    let text = std::fs::read_to_string(path).unwrap();
    let built_in = grpo_env::calculate::Calculate::new().spec().to_json();
    for line in text.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(row["tools"], serde_json::json!([built_in]));
    }
}
