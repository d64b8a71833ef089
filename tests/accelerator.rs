//! The CPU dry run of `bench/accelerator.sh --quick`: every stage of the
//! accelerator check runs on the CPU plugin with tiny shapes and leaves its
//! figures in the report, so the script a GPU session runs is known to work
//! before any device time is spent on it.

mod common;

use std::process::Command;

use serde_json::Value;

#[test]
fn accelerator_check_runs_every_stage_on_cpu() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let output = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/accelerator.sh"))
        .args(["--grpo", env!("CARGO_BIN_EXE_grpo"), "--platform", "cpu", "--quick"])
        .args(["--budget", "900", "--stage-timeout", "300", "--out"])
        .arg(&out)
        .env("GRPO_PJRT_PLUGIN", common::cpu_plugin())
        .output()
        .unwrap();
    let log = std::fs::read_to_string(out.join("accelerator.log")).unwrap_or_default();
    assert!(
        output.status.success(),
        "accelerator.sh failed: {}\nits log:\n{log}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(out.join("accelerator.json")).unwrap();
    let report: Value = serde_json::from_str(&text).unwrap();
    let summary = &report["summary"];
    assert_eq!(
        summary["stages_failed"],
        serde_json::json!([]),
        "failed stages; the log:\n{log}"
    );
    let stages: Vec<&str> = summary["stages_ok"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    for stage in [
        "env",
        "smoke",
        "matmul",
        "step-135m",
        "gen-135m",
        "run-135m",
        "step-1b",
        "gen-1b",
    ] {
        assert!(stages.contains(&stage), "stage {stage} missing from {stages:?}");
    }
    assert!(report["finished"].is_string(), "the report was not finished");

    let positive = |v: &Value| v.as_f64().is_some_and(|x| x.is_finite() && x > 0.0);
    let ceilings = &summary["ceilings"];
    assert!(positive(&ceilings["grpo_f32_tflops"]) && positive(&ceilings["grpo_bf16_tflops"]));
    // Both dtypes of the small model, one of the large, each with its FLOPs and MFU.
    let steps = summary["model_step"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{steps:?}");
    for step in steps {
        assert!(positive(&step["grpo_ms"]) && positive(&step["grpo_tflops"]), "{step}");
        assert!(positive(&step["mfu_of_grpo_matmul"]), "{step}");
    }
    // Two batches per model, each with its prefill and decode rates.
    let generated = summary["generate"].as_array().unwrap();
    assert_eq!(generated.len(), 4, "{generated:?}");
    for row in generated {
        assert!(
            positive(&row["grpo_decode_tps"]) && positive(&row["grpo_prefill_tps"]),
            "{row}"
        );
    }
    // The smoke run's 2 steps and the measured run's 4, with every phase timed.
    assert_eq!(summary["run"]["smoke"]["steps"], 2);
    let run = &summary["run"]["run-135m"];
    assert_eq!(run["steps"], 4);
    for phase in ["step_time", "time_generation", "time_train", "time_weight_sync"] {
        assert!(positive(&run[phase]), "{phase}: {run}");
    }
}
