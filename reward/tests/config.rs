//! `[[reward]]` loading (standalone and inside a full run config), strict
//! keys, `on_error` values, the registry, and weighted composition.

use std::sync::Arc;

use grpo_reward::{BoxFuture, OnError, Registry, Result, Reward, RewardsConfig, Sample, Score, Total};
use serde_json::json;

fn samples(rows: &[(&str, serde_json::Value)]) -> Vec<Sample> {
    rows.iter()
        .enumerate()
        .map(|(i, (completion, row))| {
            let mut row = row.as_object().unwrap().clone();
            row.insert("prompt".into(), json!("q"));
            row.insert("completion".into(), json!(completion));
            Sample::from_row(i as u64, row).unwrap()
        })
        .collect()
}

fn error(text: &str) -> String {
    match RewardsConfig::from_toml_str(text).and_then(|c| c.build(&Registry::default()).map(|_| c)) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_full_run_config_keeps_only_its_reward_tables() {
    let config = RewardsConfig::from_toml_str(
        r#"
        [model]
        path = "smollm2"
        [trainer]
        lr = 1e-6
        [reward_pool]
        concurrency = 3
        [[reward]]
        type = "math"
        [[reward]]
        type = "format"
        name = "fmt"
        weight = 0.5
        timeout_s = 2.0
        on_error = -1
        "#,
    )
    .unwrap();
    assert_eq!(config.pool.concurrency, 3);
    assert_eq!(config.rewards.len(), 2);
    let (math, format) = (&config.rewards[0], &config.rewards[1]);
    assert_eq!(
        (math.name(), math.weight, math.timeout_s, math.on_error),
        ("math", 1.0, 30.0, OnError::Skip)
    );
    assert_eq!(
        (format.name(), format.weight, format.timeout_s, format.on_error),
        ("fmt", 0.5, 2.0, OnError::Score(-1.0))
    );
    config.build(&Registry::default()).unwrap();
}

#[test]
fn bad_configs_name_what_is_wrong() {
    let cases = [
        ("[[reward]]\ntype = \"math\"\ncolum = \"answer\"", "colum"),
        ("[[reward]]\ntype = \"math\"\nwieght = 2.0", "wieght"),
        ("[[reward]]\ntype = \"judge\"", "unknown type `judge`"),
        ("[[reward]]\ntype = \"math\"\non_error = \"ignore\"", "ignore"),
        ("[[reward]]\ntype = \"math\"\ntimeout_s = 0.0", "timeout_s"),
        // No value panics converting to a duration or poisons the total.
        (
            "[[reward]]\ntype = \"math\"\ntimeout_s = 1e30",
            "at most 1000000 seconds",
        ),
        ("[[reward]]\ntype = \"math\"\ntimeout_s = inf", "timeout_s"),
        ("[[reward]]\ntype = \"math\"\ntimeout_s = nan", "timeout_s"),
        (
            "[[reward]]\ntype = \"math\"\nweight = nan",
            "weight must be a finite number",
        ),
        (
            "[[reward]]\ntype = \"math\"\nweight = -inf",
            "weight must be a finite number",
        ),
        (
            "[[reward]]\ntype = \"command\"\ncommand = [\"true\"]\nmax_restart_backoff_s = 1e30",
            "max_restart_backoff_s",
        ),
        (
            "[[reward]]\ntype = \"http\"\nurl = \"http://x\"\nattempt_timeout_s = 1e30",
            "attempt_timeout_s",
        ),
        (
            "[[reward]]\ntype = \"http\"\nurl = \"http://x\"\nbackoff_s = nan",
            "backoff_s",
        ),
        ("[[reward]]\ntype = \"regex\"", "pattern"),
        ("[[reward]]\ntype = \"regex\"\npattern = \"(\"", "bad regex"),
        (
            "[[reward]]\ntype = \"math\"\n[[reward]]\ntype = \"math\"",
            "two rewards named `math`",
        ),
        ("[reward_pool]\nsize = 2\n[[reward]]\ntype = \"math\"", "size"),
        ("[model]\npath = \"x\"", "no [[reward]]"),
        (
            "[[reward]]\ntype = \"command\"",
            "exactly one of `script` and `command`",
        ),
        (
            "[[reward]]\ntype = \"http\"\nurl = \"http://x\"\nbearer_token_env = \"GRPO_TEST_UNSET_TOKEN\"",
            "GRPO_TEST_UNSET_TOKEN",
        ),
    ];
    for (text, expected) in cases {
        let message = error(text);
        assert!(message.contains(expected), "{text}\n→ {message}");
    }
}

#[test]
fn on_error_takes_a_score_skip_or_fail() {
    for (value, expected) in [
        ("0", OnError::Score(0.0)),
        ("-0.5", OnError::Score(-0.5)),
        ("\"skip\"", OnError::Skip),
        ("\"fail\"", OnError::Fail),
    ] {
        let config = RewardsConfig::from_toml_str(&format!("[[reward]]\ntype = \"math\"\non_error = {value}")).unwrap();
        assert_eq!(config.rewards[0].on_error, expected, "{value}");
    }
}

/// A registered Rust reward: the completion's length, with a sub-score.
struct Chars {
    scale: f32,
}

impl Reward for Chars {
    fn score<'a>(&'a self, batch: &'a [Sample]) -> BoxFuture<'a, Result<Vec<Score>>> {
        let scores = batch
            .iter()
            .map(|s| {
                let mut score = Score::new(self.scale * s.completion.len() as f32);
                score.components.insert("raw".into(), s.completion.len() as f32);
                score
            })
            .collect();
        Box::pin(std::future::ready(Ok(scores)))
    }
}

#[tokio::test]
async fn the_total_is_the_weighted_sum_of_the_entries_that_scored() {
    let mut registry = Registry::default();
    registry.register(
        "chars",
        Box::new(|table| {
            let scale = table.get("scale").and_then(toml::Value::as_float).unwrap_or(1.0) as f32;
            Ok(Arc::new(Chars { scale }) as Arc<dyn Reward>)
        }),
    );
    let config = RewardsConfig::from_toml_str(
        r#"
        [[reward]]
        type = "math"
        weight = 2.0
        [[reward]]
        type = "chars"
        scale = 0.5
        weight = 0.1
        "#,
    )
    .unwrap();
    let pool = config.build(&registry).unwrap();
    let batch = samples(&[("1234", json!({"answer": "1234"})), ("12", json!({"answer": "13"}))]);
    let totals = pool.score(&batch).await.unwrap();
    let expected = |reward: f32, math: f32, chars: f32, raw: f32| Total {
        reward: Some(reward),
        components: [
            ("math".into(), math),
            ("chars".into(), chars),
            ("chars/raw".into(), raw),
        ]
        .into(),
    };
    assert_eq!(
        totals,
        vec![
            expected(2.0 + 0.1 * 2.0, 1.0, 2.0, 4.0),
            expected(0.1 * 1.0, 0.0, 1.0, 2.0)
        ]
    );
    let metrics = pool.metrics();
    assert_eq!(metrics.len(), 2);
    assert_eq!((metrics[0].1.calls, metrics[0].1.samples), (1, 2));
}

#[tokio::test]
async fn skipped_and_failing_entries_follow_on_error() {
    let skip = RewardsConfig::from_toml_str("[[reward]]\ntype = \"length\"\nmax_tokens = 4").unwrap();
    let pool = skip.build(&Registry::default()).unwrap();
    let batch = samples(&[("no token ids", json!({}))]);
    assert_eq!(
        pool.score(&batch).await.unwrap(),
        vec![Total::default()],
        "skipped everywhere: no reward"
    );
    assert_eq!(pool.metrics()[0].1.errors, 1);

    let fail = RewardsConfig::from_toml_str("[[reward]]\ntype = \"math\"\non_error = \"fail\"").unwrap();
    let message = fail
        .build(&Registry::default())
        .unwrap()
        .score(&batch)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("reward math failed on sample 0") && message.contains("no column `answer`"),
        "{message}"
    );
}
