//! `[environment]` tables: defaults, the built-in types, and every refused
//! value named by its key.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Episode, said, turn};
use grpo_env::Error;
use grpo_env::config::{EnvironmentConfig, EnvironmentKind};
use grpo_env::guard::Answer;
use grpo_reward::OnError;
use serde_json::json;

fn parse(table: &str) -> Result<EnvironmentConfig, Error> {
    EnvironmentConfig::from_toml_str(&format!("[environment]\n{table}")).map(|config| config.expect("a table"))
}

/// The error building `table` in `dir` gives.
fn refusal(table: &str, dir: &Path) -> String {
    match parse(table) {
        Ok(config) => match config.build(dir) {
            Ok(_) => panic!("{table:?} was accepted"),
            Err(error) => error.to_string(),
        },
        Err(error) => error.to_string(),
    }
}

#[test]
fn defaults_and_a_run_config_without_the_table() {
    let config = parse("").unwrap();
    assert_eq!(config, EnvironmentConfig::default());
    assert_eq!(config.kind, EnvironmentKind::Tools);
    assert_eq!(
        (
            config.timeout_s,
            config.on_error,
            config.max_turns,
            config.max_turn_tokens
        ),
        (30.0, OnError::Skip, 4, 256)
    );
    let environment = config.build(Path::new(".")).unwrap();
    assert_eq!(environment.name(), "tools");
    assert_eq!(environment.tools()[0].name, "calculate");
    assert_eq!(environment.timeout(), Duration::from_secs(30));

    let run = "[model]\nname = \"x\"\n[[reward]]\ntype = \"math\"\n";
    assert_eq!(EnvironmentConfig::from_toml_str(run).unwrap(), None);
    let with = format!("{run}[environment]\ntype = \"guess\"\non_error = -1\nmax_turns = 8\n");
    let config = EnvironmentConfig::from_toml_str(&with).unwrap().unwrap();
    assert_eq!(
        (config.kind, config.on_error, config.max_turns),
        (EnvironmentKind::Guess, OnError::Score(-1.0), 8)
    );
}

#[tokio::test]
async fn the_built_in_types_answer() {
    let tools = parse("type = \"tools\"\ntools = [\"calculate\"]")
        .unwrap()
        .build(Path::new("."))
        .unwrap();
    let mut episode = Episode::new(json!({}));
    let call = "<tool_call>{\"name\": \"calculate\", \"arguments\": {\"expression\": \"6*7\"}}</tool_call>";
    assert_eq!(said(&turn(&tools, &mut episode, call).await), ["tool: 42"]);
    assert_eq!(turn(&tools, &mut episode, "42").await, Answer::Done { reward: None });

    let guess = parse("type = \"guess\"").unwrap().build(Path::new(".")).unwrap();
    assert!(guess.tools().is_empty());
    let mut episode = Episode::new(json!({"secret": 42}));
    assert_eq!(said(&turn(&guess, &mut episode, "50").await), ["user: Lower."]);
    assert_eq!(
        turn(&guess, &mut episode, "42").await,
        Answer::Done { reward: Some(1.0) }
    );
    let answer = turn(&guess, &mut Episode::new(json!({"secret": "x"})), "42").await;
    assert!(
        matches!(&answer, Answer::Skipped { cause } if cause.0.contains("column `secret`")),
        "{answer:?}"
    );
}

#[test]
fn bad_values_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("env.py"),
        "def step(messages, **row):\n    return None\n",
    )
    .unwrap();
    for (table, want) in [
        ("colour = \"red\"", "unknown field `colour`"),
        ("type = \"chess\"", "unknown variant `chess`"),
        (
            "tools = [\"calculate\", \"search\"]",
            "[environment] tools: there is no built-in tool `search`",
        ),
        ("tools = []", "[environment] tools: no tools"),
        (
            "tools = [\"calculate\", \"calculate\"]",
            "[environment] tools: two tools are named `calculate`",
        ),
        (
            "type = \"guess\"\ntools = [\"calculate\"]",
            "[environment] tools: only type = \"tools\" takes it",
        ),
        (
            "url = \"http://localhost/env\"",
            "[environment] url: only type = \"http\" takes it",
        ),
        (
            "type = \"guess\"\nscript = \"env.py\"",
            "[environment] script: only type = \"command\"",
        ),
        (
            "timeout_s = 0",
            "[environment] timeout_s: 0 is not a number of seconds above 0",
        ),
        ("timeout_s = -1.0", "[environment] timeout_s: -1 is not"),
        ("timeout_s = nan", "[environment] timeout_s: NaN is not"),
        (
            "timeout_s = 1e30",
            "[environment] timeout_s: 1000000000000000000000000000000 is not",
        ),
        ("timeout_s = \"soon\"", "invalid type: string \"soon\", expected f64"),
        (
            "on_error = \"maybe\"",
            "on_error = \"maybe\": use a number, \"skip\" or \"fail\"",
        ),
        ("on_error = inf", "[environment] on_error: inf is not a finite score"),
        ("max_turns = 0", "[environment] max_turns: must be at least 1"),
        (
            "max_turn_tokens = 0",
            "[environment] max_turn_tokens: must be at least 1",
        ),
        ("max_episode_tokens = 1024", "unknown field `max_episode_tokens`"),
        ("max_turns = -1", "max_turns = -1"),
        (
            "type = \"command\"",
            "[environment] script: type = \"command\" needs exactly one of `script`",
        ),
        (
            "type = \"command\"\nscript = \"env.py\"\ncommand = [\"prog\"]",
            "[environment] script: type = \"command\" needs exactly one",
        ),
        (
            "type = \"command\"\nscript = \"missing.py\"",
            "[environment] script: there is no file",
        ),
        (
            "type = \"command\"\ncommand = []",
            "[environment] command: give the program",
        ),
        (
            "type = \"command\"\ncommand = [\"\"]",
            "[environment] command: give the program",
        ),
        (
            "type = \"command\"\ncommand = [\"prog\"]\npython = \"python3\"",
            "[environment] python: only `script` uses it",
        ),
        (
            "type = \"command\"\nscript = \"env.py\"\npython = \"\"",
            "[environment] python: is empty",
        ),
        (
            "type = \"command\"\nscript = \"env.py\"\nrestart_backoff_s = -1.0",
            "[environment] restart_backoff_s: -1 is not",
        ),
        (
            "type = \"command\"\nscript = \"env.py\"\nrestart_backoff_s = 2.0\nmax_restart_backoff_s = 1.0",
            "[environment] max_restart_backoff_s: 1 s is below restart_backoff_s (2 s)",
        ),
        (
            "type = \"http\"",
            "[environment] url: type = \"http\" needs the endpoint's URL",
        ),
        (
            "type = \"http\"\nurl = \"localhost:8000\"",
            "[environment] url: \"localhost:8000\" is not an http://",
        ),
        (
            "type = \"http\"\nurl = \"not a url\"",
            "[environment] url: \"not a url\" is not a URL",
        ),
        (
            "type = \"http\"\nurl = \"http://127.0.0.1:9/env\"\nbearer_token_env = \"GRPO_TEST_NO_SUCH_VARIABLE\"",
            "[environment] bearer_token_env: the environment variable GRPO_TEST_NO_SUCH_VARIABLE is not set",
        ),
    ] {
        let message = refusal(table, dir.path());
        assert!(message.contains(want), "{table}: {message}");
    }
}

#[test]
fn relative_paths_start_at_the_config_folder() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("envs");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(
        sub.join("env.py"),
        "TOOLS = [{'name': 'noop'}]\ndef step(messages, **row):\n    return 1\n",
    )
    .unwrap();
    let python = common::python();
    let config = parse(&format!(
        "type = \"command\"\nscript = \"envs/env.py\"\npython = {python:?}"
    ))
    .unwrap();
    let environment = config.build(dir.path()).unwrap();
    assert_eq!(environment.name(), "env.py");
    assert_eq!(environment.tools()[0].name, "noop");
    let message = config.build(&sub).err().unwrap().to_string();
    assert!(message.contains("envs/envs/env.py"), "{message}");
}
