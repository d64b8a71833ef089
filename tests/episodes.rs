//! `grpo run` with an `[environment]` table: each sample is a multi-turn
//! episode with a Python plug-in environment on a tiny random model. The
//! run trains, logs TRL's tool metrics and grpo's episode metrics, and its
//! rollout log keeps each episode (transcript, token ids, loss mask) as
//! pyarrow reads it. (That episodes learn is `learner/tests/grpo.rs`'s.)

mod common;

#[path = "../tools/test_python.rs"]
mod test_python;

use std::path::Path;

use common::{lines, run_ok, tiny_run};

/// A two-turn environment: the first turn is answered "Go on.", the
/// second ends the episode with reward 1 when both turns start with a
/// letter from a to m (0.5 when one does).
const ENVIRONMENT: &str = r#"
def starts_early(text):
    text = text.strip()
    return bool(text) and "a" <= text[0] <= "m"

def step(messages, **row):
    turns = [m["content"] for m in messages if m["role"] == "assistant"]
    if len(turns) < 2:
        return "Go on."
    return sum(starts_early(t) for t in turns) / 2
"#;

/// A tiny run in `dir` whose samples are episodes of [`ENVIRONMENT`].
fn episode_run(dir: &Path, steps: usize) -> std::path::PathBuf {
    let config = tiny_run(dir, &format!("max_steps = {steps}"));
    std::fs::write(dir.join("env.py"), ENVIRONMENT).unwrap();
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "max_completion_tokens = 4\nmax_model_len = 32",
        "max_completion_tokens = 32\nmax_model_len = 128",
    );
    let text = format!(
        "{text}\n[environment]\ntype = \"command\"\nscript = \"env.py\"\nmax_turns = 3\nmax_turn_tokens = 6\non_error = \"fail\"\n"
    );
    std::fs::write(&config, text).unwrap();
    config
}

#[test]
fn a_multi_turn_run_trains_on_episodes_and_logs_each_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = episode_run(dir.path(), 2);
    run_ok(&["run", config.to_str().unwrap()]);
    let out = dir.path().join("out");
    let metrics = lines(&out.join("metrics.jsonl"));
    assert_eq!(metrics.len(), 3, "an eval line, then two steps");
    assert_eq!(metrics[0]["eval_episode/turns_mean"], 2.0, "{}", metrics[0]);
    for line in &metrics[1..] {
        assert_eq!(line["episode/turns_mean"], 2.0, "{line}");
        assert_eq!(line["episode/ended_done"], 1.0, "{line}");
        assert_eq!(line["tools/call_frequency"], 0.0, "{line}");
        assert!(line["rewards/environment/mean"].is_number(), "{line}");
        assert!(line["loss"].as_f64().unwrap().is_finite(), "{line}");
        // Two turns of at most 6 tokens and the answer between them.
        let longest = line["completions/max_length"].as_f64().unwrap();
        assert!(longest > 12.0 && longest <= 32.0, "{line}");
    }
    let script = r#"
import json, sys
import pyarrow.dataset as ds
print(json.dumps(ds.dataset(sys.argv[1]).to_table().to_pylist()))
"#;
    let output = std::process::Command::new(test_python::test_python())
        .arg("-c")
        .arg(script)
        .arg(out.join("rollouts.parquet"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(rows.len(), 2 * 2 * 2, "two steps of two prompts by two episodes");
    for row in &rows {
        let messages: Vec<serde_json::Value> = serde_json::from_str(row["messages"].as_str().unwrap()).unwrap();
        let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["assistant", "user", "assistant"], "{row}");
        assert_eq!(messages[1]["content"], "Go on.");
        assert_eq!(
            (&row["turns"], &row["tool_calls"], &row["episode_end"]),
            (&2.into(), &0.into(), &"done".into())
        );
        // The episode's tokens: the model's two turns with the answer's
        // tokens between them, which carry no loss.
        let ids = row["token_ids"].as_array().unwrap();
        let mask: Vec<bool> = row["loss_mask"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_bool().unwrap())
            .collect();
        assert_eq!(
            (ids.len(), mask.len()),
            (row["completion_tokens"].as_u64().unwrap() as usize, ids.len())
        );
        let spans: Vec<bool> = mask.iter().fold(Vec::new(), |mut spans, &m| {
            if spans.last() != Some(&m) {
                spans.push(m);
            }
            spans
        });
        assert_eq!(spans, [true, false, true], "{row}");
        // The logged reward is the environment's plus the regex reward on the last turn.
        let last = messages[2]["content"].as_str().unwrap();
        let early = |t: &str| {
            t.strip_prefix(' ')
                .is_some_and(|t| t.starts_with(|c: char| ('a'..='m').contains(&c)))
        };
        let starts = |t: &str| {
            let t = t.trim();
            t.starts_with(|c: char| ('a'..='m').contains(&c))
        };
        let first = messages[0]["content"].as_str().unwrap();
        let environment = (f64::from(u8::from(starts(first))) + f64::from(u8::from(starts(last)))) / 2.0;
        let regex = f64::from(u8::from(early(last)));
        let reward = row["reward"].as_f64().unwrap();
        assert!((reward - (environment + regex)).abs() < 1e-6, "{row}");
    }
}
