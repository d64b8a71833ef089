//! The fault policy around an environment written in Rust: errors, hangs,
//! empty answers and non-finite rewards become a score, a skip or a
//! failure naming the environment and episode, as `on_error` says; the
//! counters count them.

mod common;

use std::time::{Duration, Instant};

use common::{Episode, fault, said, turn};
use grpo_env::Error;
use grpo_env::environment::{Environment, EnvironmentError, EpisodeView, Reply};
use grpo_env::guard::{Answer, GuardedEnvironment};
use grpo_model::chat::ChatMessage;
use grpo_model::tools::Tool;
use grpo_reward::{BoxFuture, OnError};
use serde_json::json;

/// Answers by the latest turn: "boom" fails, "hang" never answers,
/// "empty" continues with nothing, "nan" ends with a NaN reward, "done"
/// ends with 1, anything else continues.
struct Scripted;

impl Environment for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }

    fn tools(&self) -> Vec<Tool> {
        Vec::new()
    }

    fn step<'a>(&'a self, episode: EpisodeView<'a>) -> BoxFuture<'a, Result<Reply, EnvironmentError>> {
        Box::pin(async move {
            match episode.turn.content.as_str() {
                "boom" => Err(EnvironmentError("boom".into())),
                "hang" => std::future::pending().await,
                "empty" => Ok(Reply::Continue {
                    messages: Vec::new(),
                    failed_calls: 0,
                    guide: None,
                }),
                "nan" => Ok(Reply::Done { reward: Some(f32::NAN) }),
                "done" => Ok(Reply::Done { reward: Some(1.0) }),
                _ => Ok(Reply::Continue {
                    messages: vec![ChatMessage::new("user", "ok")],
                    failed_calls: 2,
                    guide: None,
                }),
            }
        })
    }
}

fn guarded(on_error: OnError) -> GuardedEnvironment {
    GuardedEnvironment::new(Box::new(Scripted), Duration::from_millis(200), on_error)
}

const FAULTS: [(&str, &str); 4] = [
    ("boom", "boom"),
    ("hang", "timed out after 0.2 s"),
    ("empty", "an answer with no messages"),
    ("nan", "reward NaN is not finite"),
];

#[tokio::test]
async fn answers_pass_through() {
    let environment = guarded(OnError::Fail);
    let mut episode = Episode::new(json!({}));
    let answer = turn(&environment, &mut episode, "hi").await;
    assert_eq!(said(&answer), ["user: ok"]);
    assert!(matches!(answer, Answer::Continue { failed_calls: 2, .. }));
    assert!(!answer.ends());
    let done = turn(&environment, &mut episode, "done").await;
    assert_eq!(done, Answer::Done { reward: Some(1.0) });
    assert!(done.ends());
    assert_eq!(environment.metrics().faults, 0);
}

#[tokio::test]
async fn a_score_stands_in_for_the_reward_of_a_faulted_episode() {
    let environment = guarded(OnError::Score(-0.5));
    for (text, want) in FAULTS {
        let start = Instant::now();
        let answer = turn(&environment, &mut Episode::new(json!({})), text).await;
        assert!(
            matches!(answer, Answer::Faulted { reward: -0.5, .. }),
            "{text}: {answer:?}"
        );
        assert!(fault(&answer).contains(want), "{text}: {}", fault(&answer));
        assert!(answer.ends());
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{text}: {:?}",
            start.elapsed()
        );
    }
    let metrics = environment.metrics();
    assert_eq!((metrics.calls, metrics.faults, metrics.timeouts), (4, 4, 1));
}

#[tokio::test]
async fn skip_leaves_the_sample_out() {
    let environment = guarded(OnError::Skip);
    for (text, want) in FAULTS {
        let answer = turn(&environment, &mut Episode::new(json!({})), text).await;
        assert!(matches!(answer, Answer::Skipped { .. }), "{text}: {answer:?}");
        assert!(fault(&answer).contains(want), "{text}: {}", fault(&answer));
    }
}

#[tokio::test]
async fn fail_names_the_environment_and_the_episode() {
    let environment = guarded(OnError::Fail);
    for (text, want) in FAULTS {
        let mut episode = Episode::new(json!({}));
        episode.say(text);
        let error = environment.step(episode.view(12)).await.unwrap_err();
        assert!(
            matches!(&error, Error::Failed { environment, episode: 12, .. } if environment == "scripted"),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.starts_with("environment scripted failed on episode 12: "),
            "{message}"
        );
        assert!(message.contains(want), "{message}");
    }
    assert_eq!(environment.metrics().faults, 4);
}
