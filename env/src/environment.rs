//! The [`Environment`] trait: what answers a model's turns in an episode.
//!
//! An episode starts from a data row (its chat messages and other
//! columns). The model writes an assistant turn; the environment reads the
//! transcript so far (the turn included, its tool calls parsed) and either
//! answers with messages the model reads next — tool results, a user or
//! observation message — or ends the episode, optionally with a reward.
//! The caller owns the transcript and the budgets (turns, tokens); an
//! environment only answers, so a stateless one (the transcript and the row
//! carry everything) survives restarts of a plug-in process.

use std::time::Duration;

use grpo_model::chat::ChatMessage;
use grpo_model::tools::{ParsedTurn, Tool};
use grpo_reward::BoxFuture;
use grpo_rollout::guided::Guide;
use serde_json::{Map, Value};

use crate::toolbox::Toolbox;

/// What an environment sees of an episode when it answers a turn.
#[derive(Debug, Clone, Copy)]
pub struct EpisodeView<'a> {
    /// The episode's id, unique within a run (plug-ins may key state on it).
    pub id: u64,
    /// The data row's columns other than the prompt.
    pub row: &'a Map<String, Value>,
    /// Every message so far, the prompt's first and the model's latest turn last.
    pub messages: &'a [ChatMessage],
    /// The latest turn's tool calls, parsed in the template family's format.
    pub turn: &'a ParsedTurn,
}

/// An environment's answer to a turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The episode goes on.
    Continue {
        /// The messages the model reads next (at least one).
        messages: Vec<ChatMessage>,
        /// Of the turn's tool calls, those that could not run (malformed,
        /// an unknown tool, arguments refused, the tool failed): TRL's
        /// `tools/failure_frequency` counts them.
        failed_calls: usize,
        /// What the model's next turn must be (guided decoding), in place of
        /// the row's or the run's guide for that turn alone; `None` keeps
        /// theirs.
        guide: Option<Guide>,
    },
    /// The episode is over.
    Done {
        /// The environment's reward for the episode (`None`: the run's
        /// `[[reward]]` tables alone score it).
        reward: Option<f32>,
    },
}

/// Why an environment could not answer (a plug-in that crashed, timed
/// out or answered out of protocol); the caller applies its fault policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EnvironmentError(pub String);

/// What answers a model's turns.
pub trait Environment: Send + Sync {
    /// Its name, for logs and errors.
    fn name(&self) -> &str;

    /// The tools the model is offered (rendered by the chat template's `tools`).
    fn tools(&self) -> Vec<Tool>;

    /// The answer to the latest turn of `episode`.
    fn step<'a>(&'a self, episode: EpisodeView<'a>) -> BoxFuture<'a, Result<Reply, EnvironmentError>>;

    /// The answer to the latest turn within `limit` of the environment's
    /// own time, or `None` when it ran past it. An environment that makes
    /// calls wait their turn (one plug-in process) starts the clock when
    /// the turn comes, so that waiting is never counted against it.
    /// Default: [`Environment::step`] under the limit.
    fn step_within<'a>(
        &'a self,
        episode: EpisodeView<'a>,
        limit: Duration,
    ) -> BoxFuture<'a, Option<Result<Reply, EnvironmentError>>> {
        Box::pin(async move { tokio::time::timeout(limit, self.step(episode)).await.ok() })
    }

    /// Episode `id` is over (ended by the environment, a budget or a
    /// fault): state kept for it may go. Default: nothing kept.
    fn end(&self, id: u64) -> BoxFuture<'_, ()> {
        let _ = id;
        Box::pin(async {})
    }
}

/// The tool-calling environment: each call of a turn is answered with one
/// `tool` message (the result, or an error the model reads); a turn without
/// calls is the final answer and ends the episode, which the run's rewards
/// score.
pub struct ToolEnvironment {
    toolbox: Toolbox,
}

impl ToolEnvironment {
    /// An environment offering `toolbox`'s tools.
    pub fn new(toolbox: Toolbox) -> ToolEnvironment {
        ToolEnvironment { toolbox }
    }
}

impl Environment for ToolEnvironment {
    fn name(&self) -> &str {
        "tools"
    }

    fn tools(&self) -> Vec<Tool> {
        self.toolbox.specs()
    }

    fn step<'a>(&'a self, episode: EpisodeView<'a>) -> BoxFuture<'a, Result<Reply, EnvironmentError>> {
        let reply = if episode.turn.calls.is_empty() {
            Reply::Done { reward: None }
        } else {
            let outcomes = self.toolbox.answer(episode.turn);
            Reply::Continue {
                messages: outcomes
                    .iter()
                    .map(|outcome| ChatMessage::new("tool", outcome.text()))
                    .collect(),
                failed_calls: outcomes.iter().filter(|o| o.failed()).count(),
                guide: None,
            }
        };
        Box::pin(async move { Ok(reply) })
    }
}

#[cfg(test)]
mod tests {
    use grpo_model::tools::{ToolCallFormat, parse_tool_calls};

    use super::*;
    use crate::calculate::Calculate;

    fn step(env: &dyn Environment, text: &str) -> Reply {
        let turn = parse_tool_calls(text, ToolCallFormat::Hermes);
        let messages = [ChatMessage::new("assistant", text)];
        let view = EpisodeView {
            id: 0,
            row: &Map::new(),
            messages: &messages,
            turn: &turn,
        };
        block_on(env.step(view)).unwrap()
    }

    /// Runs a future that never waits (the tool environment's).
    fn block_on<T>(future: BoxFuture<'_, T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(future)
    }

    #[test]
    fn calls_get_tool_messages_and_a_turn_without_calls_ends_the_episode() {
        let env = ToolEnvironment::new(Toolbox::new().with(Calculate::new()).unwrap());
        assert_eq!(env.tools()[0].name, "calculate");
        let text = "<tool_call>{\"name\": \"calculate\", \"arguments\": {\"expression\": \"12*12\"}}</tool_call>\
                    <tool_call>{\"name\": \"calculate\", \"arguments\": {}}</tool_call>";
        let Reply::Continue {
            messages, failed_calls, ..
        } = step(&env, text)
        else {
            panic!("calls continue the episode")
        };
        assert_eq!(failed_calls, 1);
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0], ChatMessage::new("tool", "144"));
        assert_eq!(messages[1].role, "tool");
        assert!(messages[1].content.starts_with("error: "), "{}", messages[1].content);
        assert_eq!(step(&env, "The answer is 144."), Reply::Done { reward: None });
    }
}
