//! `grpo reward` end to end: a config mixing built-ins and a Python
//! plug-in, the shipped example, and errors that name the problem.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn grpo_reward(config: &Path, input: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_grpo"))
        .args(["reward", "--config"])
        .arg(config)
        .arg("--input")
        .arg(input)
        .args(["--batch-size", "2"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap()
}

fn lines(output: &Output) -> Vec<Value> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "grpo reward failed: {stderr}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn a_built_in_and_a_python_plug_in_score_every_line_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("len_reward.py");
    std::fs::write(
        &script,
        "def reward(prompt, completion, **row):\n    return None if completion == 'skip' else len(completion)\n",
    )
    .unwrap();
    let config = dir.path().join("run.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\npath = \"ignored by the reward loader\"\n\n\
             [[reward]]\ntype = \"math\"\nweight = 2.0\n\n\
             [[reward]]\ntype = \"command\"\nname = \"len\"\nscript = {:?}\nweight = 0.5\ntimeout_s = 5.0\n",
            script.display().to_string()
        ),
    )
    .unwrap();
    let input = dir.path().join("samples.jsonl");
    std::fs::write(
        &input,
        [
            r#"{"prompt": "2+2?", "completion": "\\boxed{4}", "answer": "2 + 2 = 4\n#### 4"}"#,
            r#"{"prompt": [{"role": "user", "content": "3+3?"}], "completion": "It is 7", "answer": "6"}"#,
            "",
            r#"{"prompt": "1+1?", "completion": "skip", "answer": "2"}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let out = lines(&grpo_reward(&config, &input));
    let expected = [
        serde_json::json!({"reward": 2.0 + 0.5 * 9.0, "components": {"math": 1.0, "len": 9.0}}),
        serde_json::json!({"reward": 0.5 * 7.0, "components": {"math": 0.0, "len": 7.0}}),
        serde_json::json!({"reward": 0.0, "components": {"math": 0.0}}),
    ];
    assert_eq!(out, expected);
}

#[test]
fn the_shipped_example_runs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = lines(&grpo_reward(
        &root.join("examples/rewards/config.toml"),
        &root.join("examples/rewards/samples.jsonl"),
    ));
    let rewards: Vec<f64> = out.iter().map(|l| l["reward"].as_f64().unwrap()).collect();
    assert_eq!(rewards.len(), 4);
    assert!((rewards[0] - 1.6).abs() < 1e-6 && rewards[3] == 0.0, "{rewards:?}");
}

#[test]
fn bad_inputs_are_errors_that_say_where() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("rewards.toml");
    std::fs::write(&config, "[[reward]]\ntype = \"math\"\ncolumn = \"answer\"\nbogus = 1\n").unwrap();
    let input = dir.path().join("samples.jsonl");
    std::fs::write(&input, "{\"prompt\": \"q\", \"completion\": \"1\"}\n").unwrap();
    let output = grpo_reward(&config, &input);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("bogus"), "{stderr}");

    std::fs::write(&config, "[[reward]]\ntype = \"math\"\n").unwrap();
    std::fs::write(&input, "{\"completion\": \"1\"}\n").unwrap();
    let output = grpo_reward(&config, &input);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("no `prompt`"), "{stderr}");
}
