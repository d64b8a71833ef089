//! `grpo run` end to end on a tiny random model: what a run writes
//! (metrics with evals, the rollout log, checkpoints, the final folder, the
//! plot), config errors naming the key, and a run killed with SIGKILL that
//! resumes to the same parameters as a run never interrupted — on one
//! device and as an FSDP learner over two.

mod common;
#[path = "../tools/test_python.rs"]
mod test_python;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{grpo_installed, lines, run_ok, tiny_run};
use grpo_learner::record::read_rollouts;
use serde_json::Value;

#[test]
fn a_run_writes_metrics_evals_rollouts_checkpoints_the_final_model_and_a_plot() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(
        dir.path(),
        "max_steps = 4\neval_every = 2\n\n[checkpoint]\nevery = 2\nkeep_last = 1",
    );
    let config = config.to_str().unwrap();
    run_ok(&["run", config]);
    let out = dir.path().join("out");

    let metrics = lines(&out.join("metrics.jsonl"));
    let steps: Vec<u64> = metrics.iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(
        steps,
        [0, 1, 2, 3, 4],
        "an eval line before training, then one line per step"
    );
    for line in &metrics[1..] {
        for key in [
            "reward",
            "reward_std",
            "frac_reward_zero_std",
            "loss",
            "grad_norm",
            "entropy",
            "step_time",
            "time_generation",
            "time_train",
            "kl",
            "fleet_members",
            "fleet_ready",
            "completions/mean_length",
            "completions/min_length",
            "completions/max_length",
            "completions/clipped_ratio",
            "completions/mean_terminated_length",
            "clip_ratio/low_mean",
            "clip_ratio/high_mean",
            "clip_ratio/region_mean",
            "rewards/regex/mean",
            "rewards/regex/std",
            "num_tokens",
            "epoch",
        ] {
            assert!(line[key].as_f64().is_some_and(f64::is_finite), "{key} in {line}");
        }
    }
    for (before, line) in metrics[1..].iter().zip(&metrics[2..]) {
        let f = |l: &Value, k: &str| l[k].as_f64().unwrap();
        // 2 prompts × 2 samples, each counting its prompt and ≤ 4 completion tokens.
        let added = f(line, "num_tokens") - f(before, "num_tokens");
        assert!(added >= 4.0 * (1.0 + f(line, "completions/min_length")), "{line}");
        // 2 prompts per step of 10 training rows (12 less the eval's 2).
        assert!((f(line, "epoch") - f(before, "epoch") - 0.2).abs() < 1e-12, "{line}");
    }
    for line in &metrics[1..] {
        let f = |k: &str| line[k].as_f64().unwrap();
        assert_eq!(f("rewards/regex/mean"), f("reward"), "one reward of weight 1: {line}");
        assert!((f("clip_ratio/region_mean") - f("clip_ratio/low_mean") - f("clip_ratio/high_mean")).abs() < 1e-12);
        assert!(f("completions/min_length") <= f("completions/mean_length"));
        assert!(f("completions/mean_length") <= f("completions/max_length"));
        // Memory: the learner's state (f32 parameters + AdamW's two moments)
        // is among the live buffers, which the process's peak holds.
        let state = line["learner_state_bytes"][0].as_f64().unwrap();
        assert!(state > 0.0 && f("live_buffer_bytes") > state, "{line}");
        assert!(f("peak_rss_bytes") > f("live_buffer_bytes"), "{line}");
    }
    let peaks: Vec<f64> = metrics[1..]
        .iter()
        .map(|l| l["peak_rss_bytes"].as_f64().unwrap())
        .collect();
    assert!(peaks.windows(2).all(|w| w[0] <= w[1]), "a peak never falls: {peaks:?}");
    for key in [
        "eval_completions/mean_length",
        "eval_runtime",
        "eval_rewards/regex/mean",
        "eval_reward",
    ] {
        assert!(metrics[0][key].as_f64().is_some(), "{key} in {}", metrics[0]);
    }
    let evals: Vec<u64> = metrics
        .iter()
        .filter(|l| l.get("eval_accuracy").is_some())
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(evals, [0, 2, 4], "evals before training, every 2 steps and at the end");

    let rows = read_rollouts(&out.join("rollouts.parquet")).unwrap();
    assert_eq!(rows.len(), 4 * 2 * 2, "every sample of every step");
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row.step, 1 + i as u64 / 4);
        assert_eq!(
            row.policy_version,
            row.step - 1,
            "sampled by the policy before the step"
        );
        assert!(row.columns.contains("\"answer\""), "{}", row.columns);
    }

    assert!(out.join("checkpoint-4").is_dir());
    assert!(!out.join("checkpoint-2").exists(), "keep_last = 1 pruned the older one");
    assert!(out.join("progress.png").is_file());
    // The final folder is a model folder grpo loads and scores with (one line through XLA).
    let input = dir.path().join("score.jsonl");
    std::fs::write(&input, "{\"prompt_ids\": [1, 2], \"completion_ids\": [3]}\n").unwrap();
    let final_dir = out.join("final");
    run_ok(&[
        "logprobs",
        "--model",
        final_dir.to_str().unwrap(),
        "--input",
        input.to_str().unwrap(),
    ]);

    let again = grpo_installed(&["run", config]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && err.contains("--resume"),
        "a second run refuses the folder: {err}"
    );
}

/// A run of `trainer` settings killed (SIGKILL) after its checkpoint at
/// step 4 and resumed ends at step 8 with the same checkpoint, bit for bit,
/// and the same logs as a run never interrupted (`args` added to both);
/// returns the folders of the uninterrupted run and of the resumed one.
fn a_killed_run_resumes_as_if_never_interrupted(
    trainer: &str,
    args: &[&str],
) -> (tempfile::TempDir, tempfile::TempDir) {
    let whole = tempfile::tempdir().unwrap();
    let config = tiny_run(whole.path(), trainer);
    run_ok(&[&["run", config.to_str().unwrap()], args].concat());

    let killed = tempfile::tempdir().unwrap();
    let config = tiny_run(killed.path(), trainer);
    let out = killed.path().join("out");
    common::kill_when(&[&["run", config.to_str().unwrap()], args].concat(), || {
        out.join("checkpoint-4").is_dir()
    });
    assert!(!out.join("final").exists());
    written_under_old_names(&out.join("metrics.jsonl"));

    run_ok(&[&["run", config.to_str().unwrap(), "--resume"], args].concat());
    let (before, after) = if out.join("checkpoint-8/adapter_model.safetensors").is_file() {
        let adapters =
            |step: u32| std::fs::read(out.join(format!("checkpoint-{step}/adapter_model.safetensors"))).unwrap();
        (adapters(4), adapters(8))
    } else {
        let model = |dir: &Path| std::fs::read(dir.join("model.safetensors")).unwrap();
        (model(&killed.path().join("tiny")), model(&out.join("checkpoint-8")))
    };
    assert!(before.len() == after.len() && before != after, "the run trained");
    common::assert_same_checkpoint(&whole.path().join("out/checkpoint-8"), &out.join("checkpoint-8"));

    let rows = |dir: &Path| read_rollouts(&dir.join("rollouts.parquet")).unwrap();
    assert_eq!(
        rows(&out),
        rows(&whole.path().join("out")),
        "no rollout row lost or repeated"
    );
    // Each step logged once, the same, under one set of names (the lines
    // kept from before the kill renamed), the token count carried on.
    let steps = |dir: &Path| -> Vec<(Vec<String>, [Value; 5])> {
        lines(&dir.join("metrics.jsonl"))
            .iter()
            .filter(|l| l.get("reward").is_some())
            .map(|l| {
                let keys = l.as_object().unwrap().keys().cloned().collect();
                let values = ["step", "reward", "num_tokens", "epoch", "completions/mean_length"].map(|k| l[k].clone());
                (keys, values)
            })
            .collect()
    };
    assert_eq!(steps(&out), steps(&whole.path().join("out")));
    (whole, killed)
}

/// Rewrites a run's `metrics.jsonl` with the metric names grpo wrote
/// before it took TRL's, as a run of an older grpo left it.
fn written_under_old_names(path: &Path) {
    let old = [
        ("completions/mean_length", "mean_length"),
        ("completions/clipped_ratio", "clipped_ratio"),
        ("clip_ratio/low_mean", "clip_ratio_low"),
        ("clip_ratio/high_mean", "clip_ratio_high"),
        ("eval_completions/mean_length", "eval_mean_length"),
        ("eval_runtime", "eval_time"),
    ];
    let text: String = lines(path)
        .into_iter()
        .map(|line| {
            let renamed: serde_json::Map<String, Value> = line
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| match old.iter().find(|(new, _)| new == k) {
                    Some((_, was)) => (was.to_string(), v.clone()),
                    None => (k.clone(), v.clone()),
                })
                .collect();
            format!("{}\n", Value::Object(renamed))
        })
        .collect();
    assert!(text.contains("\"clip_ratio_low\""), "{text}");
    std::fs::write(path, text).unwrap();
}

/// The shared settings of the resume tests: 8 steps, checkpoints every 4,
/// with a KL term (the resumed run must take its reference from the
/// model, not the checkpoint).
const RESUMED: &str =
    "max_steps = 8\neval_every = 4\n\n[checkpoint]\nevery = 4\nkeep_last = 0\n\n[algorithm]\nbeta = 0.05";

#[test]
fn a_run_killed_between_checkpoints_resumes_to_the_same_parameters() {
    a_killed_run_resumes_as_if_never_interrupted(RESUMED, &[]);
}

#[test]
fn a_resumed_run_reports_each_step_once_to_tensorboard_with_completions_tables() {
    let reports = [
        "--set",
        "logging.report_to=\"tensorboard\"",
        "--set",
        "logging.logging_steps=3",
        "--set",
        "logging.log_completions=true",
        "--set",
        "logging.num_completions_to_print=3",
    ];
    let (_, resumed) = a_killed_run_resumes_as_if_never_interrupted(RESUMED, &reports);
    // Resumed once more from step 4, the run logs steps 5 to 8 again: the
    // third file's start at step 5 drops what the second logged from there.
    let out = resumed.path().join("out");
    std::fs::remove_dir_all(out.join("checkpoint-8")).unwrap();
    std::fs::remove_dir_all(out.join("final")).unwrap();
    let config = resumed.path().join("config.toml");
    run_ok(&[&["run", config.to_str().unwrap(), "--resume"], &reports[..]].concat());
    let files = std::fs::read_dir(out.join("tensorboard")).unwrap().count();
    assert_eq!(files, 3, "an event file per start");
    let output = std::process::Command::new(test_python::test_python())
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tensorboard_check.py"))
        .args([out.to_str().unwrap(), "3", "8", "3"])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && said.contains("tensorboard checks passed"),
        "{said}"
    );
}

#[test]
fn an_fsdp_run_on_two_devices_resumes_to_the_same_parameters() {
    // Sharded parameters and AdamW state are gathered into the checkpoint
    // and cut again on resume; two passes per batch gather the parameters
    // for the old log-probs.
    let trainer = format!("parallelism = \"fsdp\"\n{RESUMED}\nnum_iterations = 2");
    let (dir, _) = a_killed_run_resumes_as_if_never_interrupted(&trainer, &["--cpu-devices", "2"]);
    let one_device = tempfile::tempdir().unwrap();
    run_ok(&["run", tiny_run(one_device.path(), "max_steps = 1").to_str().unwrap()]);
    let state_bytes = |dir: &Path| -> Vec<u64> {
        let first_step = lines(&dir.join("out/metrics.jsonl"))
            .into_iter()
            .find(|l| l.get("reward").is_some())
            .unwrap();
        first_step["learner_state_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect()
    };
    let (sharded, whole) = (state_bytes(dir.path()), state_bytes(one_device.path()));
    println!("parameters + AdamW state per device: FSDP over 2 {sharded:?} B, one device {whole:?} B");
    assert_eq!(sharded.len(), 2, "the learner spans two devices");
    assert!(
        sharded.iter().all(|&b| b < whole[0] * 6 / 10),
        "about half each: {sharded:?} of {whole:?}"
    );
}

#[test]
fn a_killed_lora_run_with_dropout_resumes_to_the_same_adapters_and_writes_peft_folders() {
    let lora = "[lora]\nrank = 4\nlora_alpha = 8\nlora_dropout = 0.1\ntarget_modules = [\"q_proj\", \"v_proj\", \"down_proj\"]";
    let trainer = format!("{RESUMED}\n\n{lora}");
    let (dir, _) = a_killed_run_resumes_as_if_never_interrupted(&trainer, &[]);
    let out = dir.path().join("out");
    for folder in [out.join("checkpoint-8"), out.join("final")] {
        let settings: Value =
            serde_json::from_str(&std::fs::read_to_string(folder.join("adapter_config.json")).unwrap()).unwrap();
        assert_eq!(settings["peft_type"], "LORA");
        assert_eq!(settings["r"], 4);
        assert_eq!(settings["lora_alpha"], 8.0);
        assert_eq!(settings["lora_dropout"], 0.1, "the dropout the adapters trained with");
        assert_eq!(
            settings["target_modules"],
            serde_json::json!(["down_proj", "q_proj", "v_proj"])
        );
        assert_eq!(
            settings["base_model_name_or_path"],
            dir.path().join("tiny").to_str().unwrap(),
            "the base is the config's model"
        );
        assert!(folder.join("tokenizer.json").is_file());
        assert!(!folder.join("model.safetensors").exists(), "adapters only");
    }
    let size = |path: &Path| std::fs::metadata(path).unwrap().len();
    let (adapters, model) = (
        size(&out.join("final/adapter_model.safetensors")),
        size(&dir.path().join("tiny/model.safetensors")),
    );
    println!("adapter folder {adapters} B, model {model} B");
    assert!(adapters * 5 < model, "{adapters} B of adapters vs a {model} B model");

    // The same folder without its [lora] section: refused, the checkpoints left as they are.
    let config = dir.path().join("config.toml");
    let text = std::fs::read_to_string(&config).unwrap().replace(lora, "");
    std::fs::write(&config, text).unwrap();
    let refused = grpo_installed(&["run", config.to_str().unwrap(), "--resume"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("checkpoint of LoRA adapters") && stderr.contains("[lora]"),
        "{stderr}"
    );
    assert!(
        out.join("checkpoint-8/adapter_model.safetensors").is_file(),
        "not set aside"
    );
}

#[test]
fn a_run_with_layer_checkpoints_takes_the_step_a_run_without_takes() {
    // LoRA with dropout: recomputed layers must draw the masks the forward
    // drew. A reward on the completions' characters differs within groups.
    let trainer = "max_steps = 1\neval_every = 0\n{}\n\n[checkpoint]\nevery = 1\n\n[lora]\nrank = 4\nlora_dropout = 0.2\ntarget_modules = [\"q_proj\", \"down_proj\"]\n\n[[reward]]\ntype = \"length\"\nmax_tokens = 40\noverlong_buffer = 40\nunit = \"chars\"";
    let step = |checkpointing: &str| {
        let dir = tempfile::tempdir().unwrap();
        let config = tiny_run(dir.path(), &trainer.replace("{}", checkpointing));
        run_ok(&["run", config.to_str().unwrap()]);
        let line = lines(&dir.path().join("out/metrics.jsonl")).pop().unwrap();
        let adapters = std::fs::read(dir.path().join("out/checkpoint-1/adapter_model.safetensors")).unwrap();
        (dir, line, adapters)
    };
    let (_plain, plain, plain_adapters) = step("activation_checkpointing = \"none\"");
    let (_kept, kept, kept_adapters) = step("gradient_checkpointing = true");
    assert_eq!(plain["reward"], kept["reward"], "the same rollouts");
    for key in ["loss", "grad_norm", "entropy"] {
        let (a, b) = (plain[key].as_f64().unwrap(), kept[key].as_f64().unwrap());
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1e-3),
            "{key}: {a} without, {b} with checkpoints"
        );
    }
    assert!(plain["grad_norm"].as_f64().unwrap() > 0.0, "the step trained");
    // The adapters after the step agree to float noise.
    let (a, b) = (
        safetensors::SafeTensors::deserialize(&plain_adapters).unwrap(),
        safetensors::SafeTensors::deserialize(&kept_adapters).unwrap(),
    );
    let values = |t: safetensors::tensor::TensorView<'_>| -> Vec<f32> {
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    assert_eq!(a.names().len(), b.names().len());
    for name in a.names() {
        let (x, y) = (values(a.tensor(name).unwrap()), values(b.tensor(name).unwrap()));
        let worst = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
        assert!(worst <= 1e-6, "{name}: adapters differ by {worst}");
    }
}

#[test]
fn lora_adapters_alone_reach_several_in_process_engines_unless_merged_from_a_bf16_base() {
    let sync_bytes = |merge: bool| -> Vec<u64> {
        let dir = tempfile::tempdir().unwrap();
        let lora = format!(
            "max_steps = 2\neval_every = 0\n\n[algorithm]\nbeta = 0.05\n\n[lora]\nrank = 2\nmerge_on_push = {merge}\nbase_dtype = \"bf16\""
        );
        let config = tiny_run(dir.path(), &lora);
        let config = config.to_str().unwrap();
        run_ok(&["run", config, "--set", "rollout.engines=2", "--cpu-devices", "2"]);
        lines(&dir.path().join("out/metrics.jsonl"))
            .iter()
            .filter_map(|l| l.get("weight_sync_bytes").and_then(Value::as_u64))
            .collect()
    };
    let (alone, merged) = (sync_bytes(false), sync_bytes(true));
    println!("bytes a sync to two engines: adapters {alone:?}, merged {merged:?}");
    assert_eq!(alone.len(), 2);
    assert!(
        alone.iter().all(|&b| b > 0 && b * 10 < merged[0]),
        "{alone:?} vs {merged:?}"
    );
}

#[test]
fn an_fsdp_lora_run_splits_its_bf16_base_and_merges_it_for_the_engine() {
    let state_bytes = |parallel: bool| -> Vec<u64> {
        let dir = tempfile::tempdir().unwrap();
        let lora = "max_steps = 2\neval_every = 0\n\n[lora]\nrank = 2\nbase_dtype = \"bf16\"\nmerge_on_push = true";
        let config = tiny_run(dir.path(), lora);
        let config = config.to_str().unwrap();
        let layout = ["--set", "trainer.parallelism=\"fsdp\"", "--cpu-devices", "2"];
        run_ok(&[&["run", config][..], if parallel { &layout[..] } else { &[] }].concat());
        assert!(dir.path().join("out/final/adapter_model.safetensors").is_file());
        let metrics = lines(&dir.path().join("out/metrics.jsonl"));
        let step = metrics.iter().find(|l| l.get("loss").is_some()).unwrap();
        step["learner_state_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect()
    };
    let (whole, split) = (state_bytes(false), state_bytes(true));
    println!("LoRA on a bf16 base, learner state per device: one device {whole:?} B, FSDP over 2 {split:?} B");
    assert_eq!(split.len(), 2);
    assert!(split.iter().all(|&b| b < whole[0] * 6 / 10), "{split:?} of {whole:?}");
}

#[test]
fn bad_configs_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(dir.path(), "max_steps = 2");
    let config = config.to_str().unwrap();
    for (set, needle) in [
        ("rollout.group_size=1", "group_size"),
        ("optimizer.lr=0.0", "lr"),
        ("trainer.typo=3", "typo"),
        (
            "algorithm.loss_type=\"ppo\"",
            "`algorithm.loss_type`: unknown variant `ppo`, expected one of",
        ),
        ("checkpoint.every=-1", "every"),
        ("trainer.parallelism=\"tensor\"", "trainer.parallelism"),
        ("trainer.parallelism=\"fsdp\"", "trainer.devices"),
        ("rollout.worker_timeout_s=1e30", "rollout.worker_timeout_s"),
        ("rollout.heartbeat_s=nan", "rollout.heartbeat_s"),
        ("rollout.max_completion_tokens=32", "below rollout.max_model_len = 32"),
        ("rollout.max_completion_tokens=30", "the longest prompt"),
        ("logging.report_to=\"wandb\"", "wandb sync --sync-tensorboard"),
        ("logging.report_to=[\"tensorboard\", \"comet\"]", "logging.report_to"),
        ("logging.logging_steps=0", "logging.logging_steps"),
        ("logging.num_completions_to_print=0", "logging.num_completions_to_print"),
    ] {
        let out = grpo_installed(&["run", config, "--set", set]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{set}: {err}");
    }
    let resumed = grpo_installed(&["run", config, "--resume"]);
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert!(
        !resumed.status.success() && err.contains("no run here to continue"),
        "{err}"
    );
    assert!(
        !dir.path().join("out").exists(),
        "nothing is written before the config is valid"
    );
}

#[test]
fn a_hanging_reward_plugin_costs_its_scores_not_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(dir.path(), "max_steps = 2\neval_every = 0\n\n[checkpoint]\nevery = 0");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(
        "\n[[reward]]\ntype = \"command\"\ncommand = [\"sleep\", \"1000\"]\ntimeout_s = 0.5\non_error = \"skip\"\n",
    );
    std::fs::write(&config, text).unwrap();
    let started = Instant::now();
    run_ok(&["run", config.to_str().unwrap()]);
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the run did not wait on the plug-in"
    );
    for line in &lines(&dir.path().join("out/metrics.jsonl")) {
        let waited = line["time_reward"].as_f64().unwrap();
        assert!(
            (0.4..30.0).contains(&waited),
            "each step waited out the timeout once: {line}"
        );
    }
    let rows = read_rollouts(&dir.path().join("out/rollouts.parquet")).unwrap();
    assert!(
        rows.iter().all(|r| r.reward.is_some()),
        "the regex reward still scored every sample"
    );
}

#[test]
fn generating_ahead_logs_each_batch_with_the_version_that_sampled_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(dir.path(), "max_steps = 4\neval_every = 2\n\n[checkpoint]\nevery = 0");
    run_ok(&["run", config.to_str().unwrap(), "--set", "rollout.max_staleness=1"]);
    let rows = read_rollouts(&dir.path().join("out/rollouts.parquet")).unwrap();
    assert!(
        rows.iter().all(|r| r.policy_version == r.step.saturating_sub(2)),
        "one version behind"
    );
    let staleness: Vec<u64> = lines(&dir.path().join("out/metrics.jsonl"))
        .iter()
        .filter_map(|l| l["staleness"].as_u64())
        .collect();
    assert_eq!(staleness, [0, 1, 1, 1]);
}

#[test]
fn the_final_folder_is_written_in_bf16_shards_while_checkpoints_stay_f32() {
    use grpo_model::weights::{Safetensors, WeightSource};
    let dir = tempfile::tempdir().unwrap();
    let settings = "max_steps = 1\n\n[checkpoint]\nevery = 1\nsave_dtype = \"bf16\"\nmax_shard_size = \"20KB\"";
    let config = tiny_run(dir.path(), settings);
    run_ok(&["run", config.to_str().unwrap()]);
    let (out, final_dir) = (dir.path().join("out"), dir.path().join("out/final"));
    let config: Value = serde_json::from_str(&std::fs::read_to_string(final_dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["torch_dtype"], "bfloat16");
    let index: Value =
        serde_json::from_str(&std::fs::read_to_string(final_dir.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    let mut shards: Vec<&str> = index["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .map(|f| f.as_str().unwrap())
        .collect();
    shards.sort();
    shards.dedup();
    assert!(shards.len() > 1, "{shards:?}");
    for shard in &shards {
        let bytes = std::fs::read(final_dir.join(shard)).unwrap();
        let read = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        // A tensor larger than a shard (the embedding) has one to itself.
        assert!(
            bytes.len() <= 20_000 + 4096 || read.len() == 1,
            "{shard}: {} bytes",
            bytes.len()
        );
        assert!(
            read.tensors()
                .iter()
                .all(|(_, v)| v.dtype() == safetensors::Dtype::BF16),
            "{shard}"
        );
    }
    // The checkpoint keeps f32 (a resumed run is exact); the final folder is its rounding.
    let checkpoint = Safetensors::open_dir(out.join("checkpoint-1")).unwrap();
    let saved = Safetensors::open_dir(&final_dir).unwrap();
    for name in index["weight_map"].as_object().unwrap().keys() {
        let (exact, rounded) = (checkpoint.tensor(name).unwrap(), saved.tensor(name).unwrap());
        let expected: Vec<f32> = exact.data.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        assert_eq!(rounded.data, expected, "{name}");
    }
    // grpo reads its own output.
    run_ok(&[
        "run",
        dir.path().join("config.toml").to_str().unwrap(),
        "--max-steps",
        "0",
        "--set",
        &format!("model.name={:?}", final_dir.to_str().unwrap()),
        "--out",
        dir.path().join("again").to_str().unwrap(),
    ]);
}

#[test]
fn trl_key_names_work_and_out_overrides_output_dir() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(
        dir.path(),
        "max_steps = 1\neval_steps = 0\n\n[checkpoint]\nsave_steps = 0",
    );
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("out = \"out\"", "output_dir = \"elsewhere\"")).unwrap();
    let out = dir.path().join("given");
    run_ok(&["run", config.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    assert_eq!(lines(&out.join("metrics.jsonl")).len(), 1, "one step, no eval");
    assert!(!dir.path().join("elsewhere").exists(), "--out wins over output_dir");
}

/// The zeros the config sweep (`learner/tests/config.rs`) takes — "none",
/// "never", "all", a seed — run together for a step; a run of 0 steps
/// evaluates the start and writes the final folder.
#[test]
fn every_zero_the_config_takes_runs() {
    let zeros = [
        "algorithm.beta=0",
        "checkpoint.every=0",
        "checkpoint.keep_last=0",
        "data.eval_size=0",
        "data.seed=0",
        "optimizer.max_grad_norm=0",
        "optimizer.warmup_steps=0",
        "optimizer.weight_decay=0",
        "rollout.max_staleness=0",
        "rollout.seed=0",
        "trainer.devices=0",
        "trainer.eval_every=0",
        "lora.dropout=0",
        "lora.seed=0",
    ];
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(dir.path(), "max_steps = 1");
    let sets: Vec<String> = zeros
        .iter()
        .flat_map(|z| ["--set".to_string(), z.to_string()])
        .collect();
    let args: Vec<&str> = sets.iter().map(String::as_str).collect();
    run_ok(&[&["run", config.to_str().unwrap()], args.as_slice()].concat());
    let out = dir.path().join("out");
    assert_eq!(lines(&out.join("metrics.jsonl")).len(), 1, "one step, no eval");
    assert!(out.join("final").is_dir());

    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(dir.path(), "max_steps = 0\neval_every = 1");
    run_ok(&["run", config.to_str().unwrap()]);
    let out = dir.path().join("out");
    let metrics = lines(&out.join("metrics.jsonl"));
    assert_eq!(metrics.len(), 1, "the start's evaluation alone");
    assert!(metrics[0]["eval_reward"].is_number());
    assert!(out.join("final/model.safetensors").is_file());
}

/// A crash that tore the last metrics line and left the newest checkpoint
/// unreadable: `--resume` drops the torn line, sets the checkpoint aside,
/// goes back to the one before and ends where an unbroken run ends, bit
/// for bit.
#[test]
fn resume_repairs_a_torn_metrics_line_and_falls_back_from_an_unreadable_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(
        dir.path(),
        "max_steps = 4\neval_every = 0\n\n[checkpoint]\nevery = 2\nkeep_last = 0",
    );
    let config = config.to_str().unwrap();
    run_ok(&["run", config]);
    let out = dir.path().join("out");
    let unbroken = std::fs::read(out.join("checkpoint-4/model.safetensors")).unwrap();

    let model = out.join("checkpoint-4/model.safetensors");
    std::fs::write(&model, &unbroken[..unbroken.len() / 2]).unwrap();
    let metrics = out.join("metrics.jsonl");
    let mut text = std::fs::read_to_string(&metrics).unwrap();
    text.push_str("{\"step\": 5, \"loss\": 0.1");
    std::fs::write(&metrics, text).unwrap();
    std::fs::remove_dir_all(out.join("final")).unwrap();

    let resumed = grpo_installed(&["run", config, "--resume"]);
    let err = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{err}");
    assert!(
        err.contains("torn") && err.contains("unreadable"),
        "said what it repaired: {err}"
    );
    assert!(out.join("checkpoint-4.unreadable").is_dir(), "kept for inspection");
    assert_eq!(
        std::fs::read(&model).unwrap(),
        unbroken,
        "steps 3 and 4 again, the same"
    );
    let steps: Vec<u64> = lines(&metrics).iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1, 2, 3, 4]);
}

/// A run that failed at its first step leaves nothing that blocks the next
/// start; one that logged steps but no checkpoint starts over on `--resume`.
#[test]
fn a_failed_start_does_not_block_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(dir.path(), "max_steps = 2\neval_every = 0\n\n[checkpoint]\nevery = 0");
    let good = std::fs::read_to_string(&config).unwrap();
    let failing = format!(
        "{good}on_error = \"fail\"\n[[reward]]\ntype = \"command\"\ncommand = [\"false\"]\non_error = \"fail\"\n"
    );
    std::fs::write(&config, failing).unwrap();
    let config = config.to_str().unwrap();
    let failed = grpo_installed(&["run", config]);
    assert!(!failed.status.success());
    assert!(dir.path().join("out").is_dir(), "it got as far as its first step");

    std::fs::write(config, &good).unwrap();
    run_ok(&["run", config]);
    let metrics = dir.path().join("out/metrics.jsonl");
    let steps: Vec<u64> = lines(&metrics).iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1, 2]);

    // Logged steps, no checkpoint (checkpoint.every = 0): --resume starts over.
    std::fs::remove_dir_all(dir.path().join("out/final")).unwrap();
    let again = grpo_installed(&["run", config, "--resume"]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        again.status.success() && err.contains("starts again from step 0"),
        "{err}"
    );
    let steps: Vec<u64> = lines(&metrics).iter().map(|l| l["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, [1, 2], "each step once");
}

/// `auto` dtypes are decided by probes when a run starts, written to its
/// folder (`choices.json`), every step's metrics and every checkpoint, and
/// kept on `--resume`, even when the probes would now choose otherwise.
#[test]
fn auto_dtypes_are_recorded_and_kept_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(
        dir.path(),
        "max_steps = 4\neval_every = 0\n\n[checkpoint]\nevery = 2\nkeep_last = 0",
    );
    let config = config.to_str().unwrap();
    let auto = ["--set", "trainer.compute_dtype=auto", "--set", "rollout.dtype=auto"];
    run_ok(&[&["run", config, "--set", "trainer.max_steps=2"][..], &auto].concat());
    let out = dir.path().join("out");
    let read = |path: &Path| -> Value { serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap() };
    let record = read(&out.join("choices.json"));
    let probes = record["probes"].as_array().unwrap();
    assert_eq!(probes.len(), 2, "{record}");
    assert!(
        probes
            .iter()
            .all(|p| p["f32_ms"].as_f64() > Some(0.0) && p["bf16_ms"].as_f64() > Some(0.0))
    );
    let picked = (record["compute_dtype"].clone(), record["engine_dtype"].clone());
    let dtypes = |line: &Value| (line["compute_dtype"].clone(), line["engine_dtype"].clone());
    let logged = |from: u64| -> Vec<(Value, Value)> {
        lines(&out.join("metrics.jsonl"))
            .iter()
            .filter(|l| l["step"].as_u64() >= Some(from))
            .map(dtypes)
            .collect()
    };
    assert_eq!(logged(1), vec![picked.clone(); 2], "every step logs the run's dtypes");
    let state_file = out.join("checkpoint-2/trainer_state.json");
    let mut state = read(&state_file);
    assert_eq!(dtypes(&state["choices"]), picked);

    // Record the other dtypes in the checkpoint: the resumed run must take them, not probe again.
    let flip = |d: &Value| Value::from(if d == "f32" { "bf16" } else { "f32" });
    let flipped = (flip(&picked.0), flip(&picked.1));
    state["choices"] = serde_json::json!({"compute_dtype": flipped.0, "engine_dtype": flipped.1});
    std::fs::write(&state_file, state.to_string()).unwrap();
    run_ok(&[&["run", config, "--resume"][..], &auto].concat());
    assert_eq!(logged(3), vec![flipped.clone(); 2]);
    assert_eq!(
        dtypes(&read(&out.join("checkpoint-4/trainer_state.json"))["choices"]),
        flipped
    );
    let record = read(&out.join("choices.json"));
    assert_eq!(dtypes(&record), flipped);
    assert_eq!(record["probes"], serde_json::json!([]), "nothing measured on resume");
}
