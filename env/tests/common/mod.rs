//! Helpers shared by the integration tests: the Python interpreter, and
//! episodes whose turns are written by hand.

#![allow(dead_code)]

use grpo_env::environment::EpisodeView;
use grpo_env::guard::{Answer, GuardedEnvironment};
use grpo_model::chat::ChatMessage;
use grpo_model::tools::{ParsedTurn, ToolCallFormat, parse_tool_calls};
use serde_json::{Map, Value};

/// The Python interpreter the plug-ins run on: `GRPO_TEST_PYTHON`, else `python3`.
pub fn python() -> String {
    std::env::var("GRPO_TEST_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// An episode's row and transcript.
pub struct Episode {
    /// The row's columns.
    pub row: Map<String, Value>,
    /// Every message so far.
    pub messages: Vec<ChatMessage>,
    /// The latest turn, parsed.
    pub turn: ParsedTurn,
}

impl Episode {
    /// An episode of `row` (a JSON object) opened by a user message.
    pub fn new(row: Value) -> Episode {
        Episode {
            row: row.as_object().expect("a row is an object").clone(),
            messages: vec![ChatMessage::new("user", "Guess my number.")],
            turn: ParsedTurn::default(),
        }
    }

    /// The model's next turn says `text` (Hermes tool calls parsed).
    pub fn say(&mut self, text: &str) -> &mut Episode {
        self.turn = parse_tool_calls(text, ToolCallFormat::Hermes);
        let calls = self.turn.well_formed().into_iter().cloned().collect();
        self.messages
            .push(ChatMessage::new("assistant", self.turn.content.clone()).with_tool_calls(calls));
        self
    }

    /// The view of episode `id`.
    pub fn view(&self, id: u64) -> EpisodeView<'_> {
        EpisodeView {
            id,
            row: &self.row,
            messages: &self.messages,
            turn: &self.turn,
        }
    }
}

/// The answer of `environment` to a turn saying `text` in `episode` (id 7),
/// its messages appended when it continues.
pub async fn turn(environment: &GuardedEnvironment, episode: &mut Episode, text: &str) -> Answer {
    episode.say(text);
    let answer = environment
        .step(episode.view(7))
        .await
        .expect("no on_error = \"fail\" here");
    if let Answer::Continue { messages, .. } = &answer {
        episode.messages.extend(messages.iter().cloned());
    }
    answer
}

/// The contents of a continuing answer's messages, as `role: content`.
pub fn said(answer: &Answer) -> Vec<String> {
    match answer {
        Answer::Continue { messages, .. } => messages.iter().map(|m| format!("{}: {}", m.role, m.content)).collect(),
        other => panic!("expected the episode to go on, got {other:?}"),
    }
}

/// The fault message of an answer that a fault ended.
pub fn fault(answer: &Answer) -> String {
    match answer {
        Answer::Faulted { cause, .. } | Answer::Skipped { cause } => cause.0.clone(),
        other => panic!("expected a fault, got {other:?}"),
    }
}
