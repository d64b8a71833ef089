//! The `command` plug-in against Python scripts that answer correctly,
//! crash, print garbage, answer the wrong length, return NaN and hang —
//! each handled per `on_error` within its timeout, the process restarted.

use std::path::Path;
use std::time::{Duration, Instant};

use grpo_reward::{Registry, RewardPool, RewardsConfig, Sample, Total};
use serde_json::json;

fn batch(completions: &[&str]) -> Vec<Sample> {
    completions
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let row = json!({"prompt": [{"role": "user", "content": "2+2?"}], "completion": c, "answer": "4"});
            Sample::from_row(i as u64, row.as_object().unwrap().clone()).unwrap()
        })
        .collect()
}

/// A pool of one `command` reward; `keys` are the entry's extra TOML lines (timeout 1 s unless they set one).
fn pool(keys: &str) -> RewardPool {
    let timeout = if keys.contains("timeout_s") {
        ""
    } else {
        "timeout_s = 1.0\n"
    };
    let text = format!("[[reward]]\ntype = \"command\"\nname = \"py\"\n{timeout}restart_backoff_s = 0.05\n{keys}");
    RewardsConfig::from_toml_str(&text)
        .unwrap()
        .build(&Registry::default())
        .unwrap()
}

fn user_file(dir: &Path, source: &str) -> String {
    let path = dir.join("user_reward.py");
    std::fs::write(&path, source).unwrap();
    format!("script = {:?}", path.display().to_string())
}

fn values(totals: &[Total]) -> Vec<Option<f32>> {
    totals.iter().map(|t| t.reward).collect()
}

/// Per sample: 1 for "4", 0 otherwise; crashes on "crash", hangs on "hang", NaN on "nan", raises on "raise".
const USER: &str = r#"
import math, os, sys, time

def reward(prompt, completion, answer, **row):
    assert prompt[0]["content"] == "2+2?" and "completion_ids" in row and "group_id" in row
    print("user output goes to stderr")
    if completion == "crash":
        os._exit(3)
    if completion == "hang":
        time.sleep(60)
    if completion == "nan":
        return math.nan
    if completion == "raise":
        raise ValueError("bad sample")
    if completion == "skip":
        return None
    return 1.0 if completion.strip() == answer else 0.0
"#;

#[tokio::test]
async fn a_python_reward_scores_and_skips() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&user_file(dir.path(), USER));
    for _ in 0..2 {
        assert_eq!(
            values(&pool.score(&batch(&["4", "5", "skip"])).await.unwrap()),
            [Some(1.0), Some(0.0), None]
        );
    }
    assert_eq!(pool.metrics()[0].1.calls, 2);
}

#[tokio::test]
async fn a_batched_python_reward_gets_columns_as_lists() {
    let dir = tempfile::tempdir().unwrap();
    let source = "def rewards(prompts, completions, completion_ids, answer, **columns):\n    \
                  return [float(len(c)) if a == '4' else 0.0 for c, a in zip(completions, answer)]\n";
    let pool = pool(&user_file(dir.path(), source));
    assert_eq!(
        values(&pool.score(&batch(&["4", "four"])).await.unwrap()),
        [Some(1.0), Some(4.0)]
    );
}

#[tokio::test]
async fn a_crash_scores_on_error_and_the_process_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&format!("on_error = -1.0\n{}", user_file(dir.path(), USER)));
    assert_eq!(
        values(&pool.score(&batch(&["4", "crash"])).await.unwrap()),
        [Some(-1.0), Some(-1.0)]
    );
    assert_eq!(
        values(&pool.score(&batch(&["4"])).await.unwrap()),
        [Some(1.0)],
        "restarted"
    );
    let metrics = pool.metrics()[0].1;
    assert_eq!((metrics.calls, metrics.crashes), (2, 1));
}

#[tokio::test]
async fn a_hang_times_out_the_child_is_killed_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&format!("timeout_s = 0.5\n{}", user_file(dir.path(), USER)));
    let start = Instant::now();
    assert_eq!(
        values(&pool.score(&batch(&["hang", "4"])).await.unwrap()),
        [None, None],
        "skipped"
    );
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    assert_eq!(
        values(&pool.score(&batch(&["4"])).await.unwrap()),
        [Some(1.0)],
        "restarted"
    );
    assert_eq!(pool.metrics()[0].1.timeouts, 1);
}

#[tokio::test]
async fn nan_and_user_exceptions_follow_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&format!("on_error = 0.0\n{}", user_file(dir.path(), USER)));
    assert_eq!(
        values(&pool.score(&batch(&["4", "nan"])).await.unwrap()),
        [Some(1.0), Some(0.0)],
        "per sample"
    );
    assert_eq!(
        values(&pool.score(&batch(&["4", "raise"])).await.unwrap()),
        [Some(0.0), Some(0.0)],
        "per batch"
    );
    assert_eq!(
        values(&pool.score(&batch(&["4"])).await.unwrap()),
        [Some(1.0)],
        "the helper keeps serving"
    );
    let metrics = pool.metrics()[0].1;
    assert_eq!((metrics.non_finite, metrics.bad_outputs, metrics.crashes), (1, 1, 0));
}

#[tokio::test]
async fn garbage_and_wrong_length_answers_are_bad_outputs() {
    let garbage = "import sys\nfor line in sys.stdin:\n    print('not json', flush=True)\n";
    let short = "import json, sys\nfor line in sys.stdin:\n    \
                 print(json.dumps({'id': json.loads(line)['id'], 'scores': [1.0]}), flush=True)\n";
    for script in [garbage, short] {
        let pool = pool(&format!("on_error = -2\ncommand = [\"python3\", \"-c\", {script:?}]"));
        assert_eq!(
            values(&pool.score(&batch(&["4", "4"])).await.unwrap()),
            [Some(-2.0), Some(-2.0)]
        );
        assert_eq!(pool.metrics()[0].1.bad_outputs, 1);
    }
}

#[tokio::test]
async fn fail_names_the_reward_and_sample_and_a_missing_program_is_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let failing = pool(&format!("on_error = \"fail\"\n{}", user_file(dir.path(), USER)));
    let message = failing.score(&batch(&["4", "nan"])).await.unwrap_err().to_string();
    assert!(message.contains("reward py failed on sample 1"), "{message}");

    let missing = pool("command = [\"/nonexistent/grpo-reward-plugin\"]");
    assert_eq!(values(&missing.score(&batch(&["4"])).await.unwrap()), [None]);
    assert_eq!(missing.metrics()[0].1.crashes, 1);
}

/// Plug-ins that print a line that is not UTF-8, close their stdout while
/// still running, or start with an answer line over the limit: each batch
/// fails at once with its reason, not after the timeout.
#[tokio::test]
async fn bad_output_fails_the_batch_at_once_with_the_reason() {
    let not_utf8 =
        "import sys\nfor line in sys.stdin:\n    sys.stdout.buffer.write(b'\\xff\\xfe\\n'); sys.stdout.flush()\n";
    let closes = "import os, sys, time\nsys.stdin.readline()\nos.close(1)\ntime.sleep(60)\n";
    let endless =
        "import sys\nsys.stdin.readline()\nchunk = b'x' * (1 << 20)\nwhile True:\n    sys.stdout.buffer.write(chunk)\n";
    for (script, reason, metric) in [
        (not_utf8, "not UTF-8", "bad_outputs"),
        (closes, "closed its stdout", "crashes"),
        (endless, "over 67108864 bytes", "bad_outputs"),
    ] {
        let pool = pool(&format!(
            "timeout_s = 30.0\ncommand = [\"python3\", \"-c\", {script:?}]"
        ));
        let start = Instant::now();
        assert_eq!(values(&pool.score(&batch(&["4"])).await.unwrap()), [None]);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{reason}: {:?}",
            start.elapsed()
        );
        let metrics = pool.metrics()[0].1;
        let count = if metric == "crashes" {
            metrics.crashes
        } else {
            metrics.bad_outputs
        };
        assert_eq!((count, metrics.timeouts), (1, 0), "{reason}");
        let failing = pool_failing(script);
        let message = failing.score(&batch(&["4"])).await.unwrap_err().to_string();
        assert!(message.contains(reason), "{message}");
    }
}

/// A pool of one `command` reward running `script` that fails the run on a fault.
fn pool_failing(script: &str) -> RewardPool {
    pool(&format!(
        "timeout_s = 30.0\non_error = \"fail\"\ncommand = [\"python3\", \"-c\", {script:?}]"
    ))
}

/// A plug-in that started a child of its own: on timeout the whole group
/// goes, the child too.
#[tokio::test]
async fn a_timeout_kills_the_plugin_and_what_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("child.pid");
    let script = format!(
        "import subprocess, sys, time\nchild = subprocess.Popen(['sleep', '60'])\nopen({:?}, 'w').write(str(child.pid))\n\
         sys.stdin.readline()\ntime.sleep(60)\n",
        pid_file.display().to_string()
    );
    let pool = pool(&format!("timeout_s = 1.0\ncommand = [\"python3\", \"-c\", {script:?}]"));
    assert_eq!(values(&pool.score(&batch(&["4"])).await.unwrap()), [None]);
    assert_eq!(pool.metrics()[0].1.timeouts, 1);
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| stat.split_whitespace().nth(2).is_none_or(|state| state != "Z"))
    };
    let start = Instant::now();
    while alive() && start.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive(), "the plug-in's child {pid} outlived it");
}

/// Twelve small batches at once on one plug-in that takes 0.2 s a batch:
/// they wait their turns (2.4 s in all) yet none times out at 1 s, since a
/// batch's clock starts with its turn.
#[tokio::test]
async fn waiting_for_the_plugin_does_not_count_toward_the_timeout() {
    let slow = "import json, sys, time\nfor line in sys.stdin:\n    time.sleep(0.2)\n    \
                n = len(json.loads(line)['samples'])\n    \
                print(json.dumps({'id': json.loads(line)['id'], 'scores': [1.0] * n}), flush=True)\n";
    let pool = pool(&format!(
        "timeout_s = 1.0\ncommand = [\"python3\", \"-c\", {slow:?}]\n[reward_pool]\nconcurrency = 12"
    ));
    let calls: Vec<_> = (0..12).map(|_| pool.spawn(batch(&["4"]))).collect();
    for call in calls {
        assert_eq!(values(&call.await.unwrap().unwrap()), [Some(1.0)]);
    }
    assert_eq!(pool.metrics()[0].1.timeouts, 0);
}
