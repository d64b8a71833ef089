//! The `command` environment against real Python processes: the bundled
//! helper on user files (tools, continuing, ending, the guessing example),
//! and raw programs that crash, hang or answer out of protocol — each a
//! fault handled per `on_error` within its timeout, the process restarted.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Episode, fault, python, said, turn};
use grpo_env::Error;
use grpo_env::config::{EnvironmentConfig, EnvironmentKind};
use grpo_env::guard::{Answer, GuardedEnvironment};
use grpo_model::chat::ChatMessage;
use grpo_reward::OnError;
use grpo_rollout::guided::Guide;
use serde_json::json;

/// A user file: one tool; a turn calling it gets a tool message per call;
/// "done" ends with reward 1, "none" without; "crash" exits, "hang" sleeps,
/// "raise" raises, "empty" returns [], "pid" answers the process id, "ask"
/// asks a question whose answer it guides.
const USER: &str = r#"
import os, time

TOOLS = [{"name": "lookup", "description": "Looks a word up.",
          "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}]

def step(messages, secret, **row):
    print("user output goes to stderr")
    last = messages[-1]
    assert last["role"] == "assistant"
    if last.get("tool_calls"):
        return [{"role": "tool", "content": "found " + call["function"]["arguments"]["word"]}
                for call in last["tool_calls"]]
    text = last["content"]
    if text == "crash":
        os._exit(3)
    if text == "hang":
        time.sleep(60)
    if text == "raise":
        raise ValueError("bad turn")
    if text == "empty":
        return []
    if text == "pid":
        return str(os.getpid())
    if text == "done":
        return 1.0
    if text == "none":
        return None
    if text == "ask":
        return {"messages": "Yes or no?", "structured_outputs": {"choice": ["yes", "no"]}}
    return f"Turn {len(messages) // 2}, secret {secret}."
"#;

/// A command environment running the helper on `source`, saved in `dir` as `env.py`.
fn user_config(dir: &Path, source: &str) -> EnvironmentConfig {
    std::fs::write(dir.join("env.py"), source).unwrap();
    EnvironmentConfig {
        kind: EnvironmentKind::Command,
        script: Some("env.py".into()),
        python: Some(python()),
        restart_backoff_s: Some(0.2),
        timeout_s: 1.0,
        ..EnvironmentConfig::default()
    }
}

fn build(config: EnvironmentConfig, base_dir: &Path) -> GuardedEnvironment {
    config.build(base_dir).unwrap()
}

#[tokio::test]
async fn a_python_environment_offers_tools_answers_calls_and_ends_with_a_reward() {
    let dir = tempfile::tempdir().unwrap();
    let environment = build(user_config(dir.path(), USER), dir.path());
    assert_eq!(environment.name(), "env.py");
    let tools = environment.tools();
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].name, "lookup");
    assert_eq!(tools[0].parameters["properties"]["word"]["type"], json!("string"));

    let mut episode = Episode::new(json!({"secret": 42}));
    let call = "<tool_call>{\"name\": \"lookup\", \"arguments\": {\"word\": \"grpo\"}}</tool_call>";
    assert_eq!(
        said(&turn(&environment, &mut episode, call).await),
        ["tool: found grpo"]
    );
    assert_eq!(
        said(&turn(&environment, &mut episode, "hello").await),
        ["user: Turn 2, secret 42."]
    );
    assert_eq!(
        turn(&environment, &mut episode, "ask").await,
        Answer::Continue {
            messages: vec![ChatMessage::new("user", "Yes or no?")],
            failed_calls: 0,
            guide: Some(Guide::Choice(vec!["yes".into(), "no".into()])),
        }
    );
    assert_eq!(
        turn(&environment, &mut episode, "done").await,
        Answer::Done { reward: Some(1.0) }
    );
    assert_eq!(
        turn(&environment, &mut episode, "none").await,
        Answer::Done { reward: None }
    );
    environment.end(7).await;
    assert_eq!(environment.metrics().calls, 5);
    assert_eq!(environment.metrics().faults, 0);
}

#[tokio::test]
async fn the_guessing_example_plays_like_the_built_in_game() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/environments");
    let config = EnvironmentConfig {
        kind: EnvironmentKind::Command,
        script: Some("guess_number.py".into()),
        python: Some(python()),
        ..EnvironmentConfig::default()
    };
    let plugin = build(config, &examples);
    let built_in = build(
        EnvironmentConfig {
            kind: EnvironmentKind::Guess,
            ..EnvironmentConfig::default()
        },
        &examples,
    );
    assert!(plugin.tools().is_empty());
    let mut episodes = [Episode::new(json!({"secret": 42})), Episode::new(json!({"secret": 42}))];
    for text in ["I'd say 50.", "Then 25", "3.5?", "no idea", "-4", "x-7", "42"] {
        let [a, b] = &mut episodes;
        let (from_plugin, from_built_in) = (turn(&plugin, a, text).await, turn(&built_in, b, text).await);
        assert_eq!(from_plugin, from_built_in, "{text}");
    }
    assert_eq!(
        turn(
            &plugin,
            &mut Episode::new(json!({"secret": 7, "low": 5, "high": 9})),
            "4"
        )
        .await,
        turn(
            &built_in,
            &mut Episode::new(json!({"secret": 7, "low": 5, "high": 9})),
            "4"
        )
        .await,
    );
    let [a, _] = &mut episodes;
    let texts: Vec<String> = a.messages.iter().skip(1).map(|m| m.content.clone()).collect();
    assert_eq!(
        texts[..6],
        [
            "I'd say 50.",
            "Lower.",
            "Then 25",
            "Higher.",
            "3.5?",
            "Say a whole number between 1 and 100."
        ]
    );
}

#[tokio::test]
async fn a_crash_is_a_fault_and_the_next_step_restarts_after_the_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let config = EnvironmentConfig {
        on_error: OnError::Score(-1.0),
        ..user_config(dir.path(), USER)
    };
    let environment = build(config, dir.path());
    let mut episode = Episode::new(json!({"secret": 1}));
    let pid = said(&turn(&environment, &mut episode, "pid").await);
    let answer = turn(&environment, &mut episode, "crash").await;
    assert!(matches!(answer, Answer::Faulted { reward: -1.0, .. }), "{answer:?}");
    assert!(fault(&answer).contains("exited"), "{}", fault(&answer));
    let start = Instant::now();
    assert_eq!(
        said(&turn(&environment, &mut Episode::new(json!({"secret": 1})), "hi").await),
        ["user: Turn 1, secret 1."]
    );
    assert!(
        start.elapsed() >= Duration::from_millis(200),
        "restarted after {:?}",
        start.elapsed()
    );
    assert_ne!(
        said(&turn(&environment, &mut episode, "pid").await),
        pid,
        "a new process"
    );
    let metrics = environment.metrics();
    assert_eq!((metrics.calls, metrics.faults, metrics.timeouts), (4, 1, 0));
}

#[tokio::test]
async fn a_hang_times_out_within_the_timeout_and_the_process_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let config = EnvironmentConfig {
        timeout_s: 0.5,
        restart_backoff_s: Some(0.0),
        ..user_config(dir.path(), USER)
    };
    let environment = build(config, dir.path());
    let start = Instant::now();
    let answer = turn(&environment, &mut Episode::new(json!({"secret": 1})), "hang").await;
    assert!(start.elapsed() < Duration::from_millis(1500), "{:?}", start.elapsed());
    assert!(matches!(answer, Answer::Skipped { .. }), "{answer:?}");
    assert_eq!(fault(&answer), "timed out after 0.5 s");
    assert_eq!(
        said(&turn(&environment, &mut Episode::new(json!({"secret": 1})), "hi").await),
        ["user: Turn 1, secret 1."]
    );
    let metrics = environment.metrics();
    assert_eq!((metrics.calls, metrics.faults, metrics.timeouts), (2, 1, 1));
}

#[tokio::test]
async fn user_exceptions_and_empty_answers_are_faults_and_the_helper_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let environment = build(user_config(dir.path(), USER), dir.path());
    let mut episode = Episode::new(json!({"secret": 1}));
    let pid = said(&turn(&environment, &mut episode, "pid").await);
    let raised = turn(&environment, &mut episode, "raise").await;
    assert_eq!(fault(&raised), "the plug-in reported: ValueError: bad turn");
    let empty = turn(&environment, &mut episode, "empty").await;
    assert!(
        fault(&empty).contains("TypeError: step returned []"),
        "{}",
        fault(&empty)
    );
    let missing = environment
        .step(Episode::new(json!({})).say("hi").view(3))
        .await
        .unwrap();
    assert!(fault(&missing).contains("secret"), "{}", fault(&missing));
    assert_eq!(
        said(&turn(&environment, &mut episode, "pid").await),
        pid,
        "the same process"
    );
    assert_eq!(environment.metrics().faults, 3);
}

/// A raw plug-in that lists no tools and answers steps with `answer`, a
/// Python expression of the request `r`; it logs `end` requests to stderr.
fn raw(answer: &str) -> EnvironmentConfig {
    let script = format!(
        "import json, sys\nfor line in sys.stdin:\n    r = json.loads(line)\n    \
         if r['method'] == 'tools':\n        print(json.dumps({{'id': r['id'], 'tools': []}}), flush=True)\n    \
         elif r['method'] == 'end':\n        print(json.dumps({{'id': r['id']}}), flush=True)\n    \
         else:\n        print({answer}, flush=True)\n"
    );
    EnvironmentConfig {
        kind: EnvironmentKind::Command,
        command: Some(vec![python(), "-c".into(), script]),
        restart_backoff_s: Some(0.0),
        timeout_s: 5.0,
        ..EnvironmentConfig::default()
    }
}

#[tokio::test]
async fn garbled_answers_are_faults_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    for (answer, want) in [
        ("'not json'", "bad plug-in output: not a protocol line"),
        (
            "json.dumps({'id': r['id'] + 1, 'done': True})",
            "bad plug-in output: answer to request 1 while waiting for 0",
        ),
        (
            "json.dumps({'id': r['id'], 'messages': [{'role': 'user'}]})",
            "bad answer to `step`: messages[0] is {\"role\":\"user\"}",
        ),
        (
            "json.dumps({'id': r['id'], 'messages': 'Higher.'})",
            "`messages` is \"Higher.\", not a list",
        ),
        (
            "json.dumps({'id': r['id'], 'done': True, 'reward': 'nan'})",
            "reward \"nan\" is not a number or null",
        ),
        ("json.dumps({'id': r['id']})", "neither `messages`, `done` nor `error`"),
    ] {
        let environment = build(raw(answer), dir.path());
        let start = Instant::now();
        let answer = turn(&environment, &mut Episode::new(json!({})), "hi").await;
        assert!(fault(&answer).contains(want), "{want}: {}", fault(&answer));
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "at once, not after the timeout"
        );
        assert_eq!(environment.metrics().faults, 1);
    }
}

#[tokio::test]
async fn requests_carry_the_episode_row_and_messages() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("requests.jsonl");
    let echo = format!(
        "(open({:?}, 'a').write(line), json.dumps({{'id': r['id'], 'messages': [{{'role': 'user', 'content': 'ok'}}]}}))[1]",
        log.display().to_string()
    );
    let environment = build(raw(&echo), dir.path());
    let mut episode = Episode::new(json!({"secret": 3, "tags": ["a"]}));
    let call = "Let me look.<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
    assert_eq!(said(&turn(&environment, &mut episode, call).await), ["user: ok"]);
    let request: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&log).unwrap().trim()).unwrap();
    assert_eq!(
        request,
        json!({"id": 0, "method": "step", "episode": 7, "row": {"secret": 3, "tags": ["a"]}, "messages": [
            {"role": "user", "content": "Guess my number."},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}]})
    );
}

#[tokio::test]
async fn a_plugin_that_cannot_list_its_tools_fails_the_build_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = raw("''");
    config.command = Some(vec![
        python(),
        "-c".into(),
        "import sys\nsys.stdin.readline()\nprint('{}')".into(),
    ]);
    let message = config.build(dir.path()).err().unwrap().to_string();
    assert!(message.starts_with("environment python"), "{message}");
    assert!(message.contains("not a protocol line (no `id`)"), "{message}");

    config.command = Some(vec!["./no-such-plugin".into()]);
    let error = config.build(dir.path()).err().unwrap();
    assert!(
        matches!(&error, Error::Start { environment, .. } if environment == "no-such-plugin"),
        "{error}"
    );
    assert!(error.to_string().contains("cannot start"), "{error}");

    config.command = Some(vec![python(), "-c".into(), "import time\ntime.sleep(60)".into()]);
    config.timeout_s = 0.3;
    let start = Instant::now();
    let message = config.build(dir.path()).err().unwrap().to_string();
    assert!(message.contains("timed out after 0.3 s"), "{message}");
    assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
}
