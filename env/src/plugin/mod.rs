//! Environment plug-ins: environments that answer from outside the process.
//!
//! - [`command`]: a long-running subprocess speaking JSON lines (the reward
//!   crate's [`grpo_reward::plugin::process::JsonLinesProcess`]: lazy start,
//!   id-matched answers, process-group kills, restarts with backoff).
//! - [`http`]: each request POSTed as JSON to a URL, the body its answer.
//!
//! # Protocol
//!
//! Every request is a JSON object with an integer `id` and a `method`; its
//! answer is a JSON object with the same `id` (over HTTP the `id` may be
//! left out of the answer; if given it must match).
//!
//! ```text
//! → {"id": 0, "method": "tools"}
//! ← {"id": 0, "tools": [{"type": "function", "function": {"name": "…", "description": "…", "parameters": {…}}}]}
//!
//! → {"id": 1, "method": "step", "episode": 12, "row": {"secret": 42, …},
//!    "messages": [{"role": "user", "content": "…"},
//!                 {"role": "assistant", "content": "…",
//!                  "tool_calls": [{"type": "function", "function": {"name": "…", "arguments": {…}}}]}]}
//! ← {"id": 1, "messages": [{"role": "tool", "content": "…"}, …]}   the episode goes on
//!                                                (optional "failed_calls": n, the turn's calls that could not run;
//!                                                 optional "structured_outputs": {…}, what the next turn must be)
//! ← {"id": 1, "done": true, "reward": 1.0}                         it ends (`reward` null or absent: none)
//! ← {"id": 1, "error": "what went wrong"}                          a fault
//!
//! → {"id": 2, "method": "end", "episode": 12}
//! ← {"id": 2}
//! ```
//!
//! - `tools` is asked once, when the environment is built; a plug-in
//!   without tools answers `[]`. Each tool is OpenAI's shape; `type` may be
//!   left out, `description` defaults to "" and `parameters` to an empty
//!   object schema.
//! - `step` carries the episode's id, the data row's columns other than the
//!   prompt, and every message so far, the model's latest turn last
//!   (`tool_calls` only on assistant turns that make calls; `arguments` is
//!   a JSON object). Continuing needs at least one message, each with a
//!   non-empty string `role` and a string `content` (other keys are
//!   ignored), and may count the turn's tool calls that could not run in
//!   `failed_calls` (default 0), and may guide the model's next turn with
//!   `structured_outputs`, vLLM's options (`{"json": schema}`, `{"regex":
//!   "…"}`, `{"choice": […]}`, `{"grammar": "…"}` or `{"json_object":
//!   true}`), in place of the row's or the run's guide for that turn
//!   alone; `done` must be `true`, and the reward a finite number.
//!   Anything else — an answer with both `messages` and `done`, or with
//!   neither — is a fault naming what is wrong, handled per `on_error`
//!   (see [`crate::guard`]).
//! - `end` says an episode is over (ended by the plug-in, a budget or a
//!   fault), so state kept for it may go. It is best effort: a failure is
//!   only logged.
//!
//! Episodes should be stateless where they can (the row and the messages
//! carry everything), so that a restarted plug-in picks up where the last
//! one died.

pub mod command;
pub mod http;

use grpo_model::chat::ChatMessage;
use grpo_model::tools::Tool;
use grpo_rollout::guided::Guide;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::environment::{EnvironmentError, EpisodeView, Reply};

/// A request of the protocol, without its id.
#[derive(Serialize)]
#[serde(tag = "method", rename_all = "lowercase")]
enum Request<'a> {
    /// The tools on offer.
    Tools,
    /// The answer to an episode's latest turn.
    Step {
        episode: u64,
        row: &'a Map<String, Value>,
        messages: Vec<Value>,
    },
    /// An episode is over.
    End { episode: u64 },
}

impl<'a> Request<'a> {
    /// The `step` request of `episode`.
    fn step(episode: EpisodeView<'a>) -> Request<'a> {
        Request::Step {
            episode: episode.id,
            row: episode.row,
            messages: episode.messages.iter().map(message_json).collect(),
        }
    }
}

/// A message as the protocol sends it: `role`, `content`, and `tool_calls`
/// when it makes calls.
fn message_json(message: &ChatMessage) -> Value {
    let mut value = json!({"role": message.role, "content": message.content});
    if !message.tool_calls.is_empty() {
        value["tool_calls"] = message.tool_calls.iter().map(|call| call.to_json()).collect();
    }
    value
}

/// A value's JSON, cut to 100 characters for messages.
fn short(value: &Value) -> String {
    value.to_string().chars().take(100).collect()
}

/// The fault an answer reports in its `error`, if it has one.
fn reported(answer: &Map<String, Value>) -> Option<String> {
    answer.get("error").map(|error| match error {
        Value::String(text) => format!("the plug-in reported: {text}"),
        other => format!("the plug-in reported: {}", short(other)),
    })
}

/// The tools of an answer to `tools`.
fn parse_tools(answer: &Map<String, Value>) -> Result<Vec<Tool>, EnvironmentError> {
    let bad = |what: String| EnvironmentError(format!("bad answer to `tools`: {what}"));
    if let Some(fault) = reported(answer) {
        return Err(EnvironmentError(fault));
    }
    Tool::list_from_json(answer.get("tools").unwrap_or(&Value::Null)).map_err(bad)
}

/// The reply of an answer to `step`.
fn parse_step(answer: &Map<String, Value>) -> Result<Reply, EnvironmentError> {
    let bad = |what: String| EnvironmentError(format!("bad answer to `step`: {what}"));
    if let Some(fault) = reported(answer) {
        return Err(EnvironmentError(fault));
    }
    match (answer.get("done"), answer.get("messages")) {
        (Some(Value::Bool(true)), Some(_)) => Err(bad("both `done` and `messages`: give one".into())),
        (Some(Value::Bool(true)), None) => match answer.get("reward") {
            None | Some(Value::Null) => Ok(Reply::Done { reward: None }),
            Some(Value::Number(n)) => match n.as_f64().map(|v| v as f32) {
                Some(reward) if reward.is_finite() => Ok(Reply::Done { reward: Some(reward) }),
                _ => Err(bad(format!("reward {n} is not a finite 32-bit number"))),
            },
            Some(other) => Err(bad(format!("reward {} is not a number or null", short(other)))),
        },
        (Some(Value::Bool(false)) | None, Some(messages)) => Ok(Reply::Continue {
            messages: parse_messages(messages).map_err(bad)?,
            failed_calls: match answer.get("failed_calls").filter(|count| !count.is_null()) {
                None => 0,
                Some(count) => count
                    .as_u64()
                    .ok_or_else(|| bad(format!("`failed_calls` is {}, not a count", short(count))))?
                    as usize,
            },
            guide: match answer.get("structured_outputs").filter(|options| !options.is_null()) {
                None => None,
                Some(options) => {
                    Some(Guide::from_options(options).map_err(|e| bad(format!("`structured_outputs` {e}")))?)
                }
            },
        }),
        (Some(Value::Bool(false)) | None, None) => Err(bad("neither `messages`, `done` nor `error`".into())),
        (Some(other), _) => Err(bad(format!("`done` is {}, not true or false", short(other)))),
    }
}

/// The messages an answer continues with: a non-empty list of `{role, content}`.
fn parse_messages(messages: &Value) -> Result<Vec<ChatMessage>, String> {
    let Value::Array(items) = messages else {
        return Err(format!("`messages` is {}, not a list", short(messages)));
    };
    if items.is_empty() {
        return Err("`messages` is empty: continue with at least one message, or end with {\"done\": true}".into());
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match (item.get("role"), item.get("content")) {
            (Some(Value::String(role)), Some(Value::String(content))) if !role.is_empty() => {
                Ok(ChatMessage::new(role.as_str(), content.as_str()))
            }
            _ => Err(format!(
                "messages[{i}] is {}, not an object with a non-empty string `role` and a string `content`",
                short(item)
            )),
        })
        .collect()
}

/// Whether an answer to `end` is in order.
fn check_end(answer: &Map<String, Value>) -> Result<(), EnvironmentError> {
    reported(answer).map_or(Ok(()), |fault| Err(EnvironmentError(fault)))
}

/// Runs `work` to its end on a runtime of its own, on a thread of its own
/// (so that building an environment works inside or outside a runtime).
fn on_own_runtime<T: Send>(work: impl Future<Output = T> + Send) -> Result<T, EnvironmentError> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| EnvironmentError(format!("cannot start a runtime: {e}")))?;
                Ok(runtime.block_on(work))
            })
            .join()
            .unwrap_or_else(|_| Err(EnvironmentError("the thread asking for the tools panicked".into())))
    })
}

#[cfg(test)]
mod tests {
    use grpo_model::tools::ToolCall;

    use super::*;

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn step_error(answer: Value) -> String {
        parse_step(&object(answer)).unwrap_err().0
    }

    #[test]
    fn requests_have_the_protocol_shape() {
        let call = ToolCall {
            name: "calculate".into(),
            arguments: object(json!({"expression": "1+1"})),
        };
        let messages = [
            ChatMessage::new("user", "hi"),
            ChatMessage::new("assistant", "").with_tool_calls(vec![call]),
        ];
        let row = object(json!({"secret": 4}));
        let turn = Default::default();
        let view = EpisodeView {
            id: 12,
            row: &row,
            messages: &messages,
            turn: &turn,
        };
        assert_eq!(
            serde_json::to_value(Request::step(view)).unwrap(),
            json!({"method": "step", "episode": 12, "row": {"secret": 4}, "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "calculate", "arguments": {"expression": "1+1"}}}]}]})
        );
        assert_eq!(
            serde_json::to_value(Request::Tools).unwrap(),
            json!({"method": "tools"})
        );
        assert_eq!(
            serde_json::to_value(Request::End { episode: 3 }).unwrap(),
            json!({"method": "end", "episode": 3})
        );
    }

    #[test]
    fn answers_are_read_strictly() {
        assert_eq!(
            parse_step(&object(
                json!({"messages": [{"role": "user", "content": "Higher.", "name": "x"}]})
            )),
            Ok(Reply::Continue {
                messages: vec![ChatMessage::new("user", "Higher.")],
                failed_calls: 0,
                guide: None
            })
        );
        assert_eq!(
            parse_step(&object(
                json!({"messages": [{"role": "tool", "content": "error"}], "failed_calls": 1})
            )),
            Ok(Reply::Continue {
                messages: vec![ChatMessage::new("tool", "error")],
                failed_calls: 1,
                guide: None
            })
        );
        assert_eq!(
            parse_step(&object(
                json!({"messages": [{"role": "user", "content": "Yes or no?"}], "structured_outputs": {"choice": ["yes", "no"]}})
            )),
            Ok(Reply::Continue {
                messages: vec![ChatMessage::new("user", "Yes or no?")],
                failed_calls: 0,
                guide: Some(Guide::Choice(vec!["yes".into(), "no".into()]))
            })
        );
        assert_eq!(
            parse_step(&object(json!({"done": true, "reward": 0.5}))),
            Ok(Reply::Done { reward: Some(0.5) })
        );
        assert_eq!(
            parse_step(&object(json!({"done": true, "reward": null}))),
            Ok(Reply::Done { reward: None })
        );
        for (answer, want) in [
            (json!({"messages": []}), "`messages` is empty"),
            (json!({"messages": "hi"}), "not a list"),
            (
                json!({"messages": [{"role": "user"}]}),
                "messages[0] is {\"role\":\"user\"}",
            ),
            (
                json!({"messages": [{"role": "", "content": "x"}]}),
                "non-empty string `role`",
            ),
            (json!({"done": true, "reward": 1e300}), "reward 1e+300 is not a finite"),
            (json!({"done": true, "reward": "1"}), "reward \"1\" is not a number"),
            (json!({"done": "yes"}), "`done` is \"yes\""),
            (
                json!({"messages": [{"role": "user", "content": ""}], "failed_calls": -1}),
                "`failed_calls` is -1",
            ),
            (json!({"done": true, "messages": []}), "both `done` and `messages`"),
            (json!({}), "neither `messages`, `done` nor `error`"),
            (json!({"error": "no such row"}), "the plug-in reported: no such row"),
        ] {
            let error = step_error(answer.clone());
            assert!(error.contains(want), "{answer}: {error}");
        }
    }

    #[test]
    fn tools_are_read_in_openai_shape() {
        let tools = parse_tools(&object(json!({"tools": [
            {"type": "function", "function": {"name": "guess", "description": "d", "parameters": {"type": "object"}}},
            {"function": {"name": "bare"}},
        ]})))
        .unwrap();
        assert_eq!(tools[0].to_json()["function"]["name"], json!("guess"));
        assert_eq!(tools[1].parameters, json!({"type": "object", "properties": {}}));
        assert_eq!(parse_tools(&object(json!({"tools": []}))), Ok(Vec::new()));
        for (answer, want) in [
            (json!({}), "`tools` must be a list"),
            (json!({"tools": [1]}), "tools[0] is 1"),
            (
                json!({"tools": [{"type": "code", "function": {"name": "x"}}]}),
                "not \"function\"",
            ),
            (json!({"tools": [{"function": {"name": ""}}]}), "no `function.name`"),
            (
                json!({"tools": [{"function": {"name": "x", "parameters": 1}}]}),
                "not a JSON schema",
            ),
            (
                json!({"tools": [{"function": {"name": "x"}}, {"function": {"name": "x"}}]}),
                "two tools are named `x`",
            ),
        ] {
            let error = parse_tools(&object(answer.clone())).unwrap_err().0;
            assert!(error.contains(want), "{answer}: {error}");
        }
    }
}
