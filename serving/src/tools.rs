//! Tool calling in chat completions, as OpenAI and vLLM define it: the
//! request's `tools` (rendered by the chat template), `tool_choice` (`auto`,
//! the default with tools; `none`; `required` or a named function, whose
//! answers are guided to well-formed calls, see
//! [`grpo_rollout::guided::Guide::tool_calls`]) and `parallel_tool_calls`; the calls of
//! assistant messages in the history; and the calls parsed from an answer
//! with the template family's parser (`grpo_model::tools`, the one `grpo run`
//! uses), whole or as stream deltas. A call the parser cannot use stays in
//! the answer's text, as vLLM's parsers leave it.

use grpo_model::tools::{Tool, ToolCall, ToolCallEvent, ToolCallFormat, ToolCallParser};
use grpo_rollout::guided::Guide;
use grpo_rollout::output::FinishReason;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::protocol::chat::{ChatRequest, FunctionOut, ToolCallIn, ToolCallOut};
use crate::routes::generate::request_id;

/// How an answer's tool calls are read: present when the request offers
/// tools and lets the model call them (`tool_choice` `auto`).
#[derive(Debug, Clone, Copy)]
pub struct ToolCalling {
    /// The template family's call format.
    format: ToolCallFormat,
    /// Whether an answer may make several calls (`parallel_tool_calls`,
    /// default true); if not, only its first call is returned.
    parallel: bool,
}

impl ToolCalling {
    /// Calls written in `format`; `parallel`: several calls an answer.
    pub fn new(format: ToolCallFormat, parallel: bool) -> ToolCalling {
        ToolCalling { format, parallel }
    }
}

/// What a request offers the model: its tools, how to read its calls
/// (when it may call them) and the guide that makes the answer calls.
#[derive(Debug)]
pub struct Offer {
    /// The tools, rendered by the chat template.
    pub tools: Vec<Tool>,
    /// How the answer's calls are read; none with `tool_choice` `none` or no tools.
    pub calling: Option<ToolCalling>,
    /// With `tool_choice` `required` or a named function: an answer of
    /// well-formed calls (of any tool, or of the named one) only.
    pub guide: Option<Guide>,
}

/// What the request offers, its calls written in `format` (the chat
/// template family's).
pub fn offered(request: &ChatRequest, format: ToolCallFormat) -> Result<Offer> {
    let tools = tool_list(request.tools.as_ref())?;
    let parallel = request.parallel_tool_calls.unwrap_or(true);
    let calling = ToolCalling::new(format, parallel);
    let bad = |what: String| Error::invalid("tool_choice", format!("tool_choice: {what}"));
    let forced = |called: &[Tool]| Guide::tool_calls(format, called, parallel).map_err(&bad);
    let (calling, guide) = match &request.tool_choice {
        None | Some(Value::Null) => ((!tools.is_empty()).then_some(calling), None),
        Some(Value::String(choice)) => match choice.as_str() {
            "none" => (None, None),
            "auto" => ((!tools.is_empty()).then_some(calling), None),
            "required" if tools.is_empty() => return Err(bad("\"required\" needs `tools`".into())),
            "required" => (Some(calling), Some(forced(&tools)?)),
            other => return Err(bad(format!("{other:?} is not one of \"none\", \"auto\", \"required\""))),
        },
        Some(named) => {
            let name = named
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| {
                    named
                        .get("type")
                        .and_then(Value::as_str)
                        .is_none_or(|t| t == "function")
                })
                .ok_or_else(|| bad("a named choice is {\"type\": \"function\", \"function\": {\"name\": …}}".into()))?;
            let Some(tool) = tools.iter().find(|t| t.name == name) else {
                return Err(bad(format!("there is no tool named `{name}` in `tools`")));
            };
            (Some(calling), Some(forced(std::slice::from_ref(tool))?))
        }
    };
    Ok(Offer { tools, calling, guide })
}

/// A request's `tools`, in OpenAI's shape (none when absent).
pub fn tool_list(tools: Option<&Value>) -> Result<Vec<Tool>> {
    tools.map_or(Ok(Vec::new()), |list| {
        Tool::list_from_json(list).map_err(|e| Error::invalid("tools", e))
    })
}

/// The calls of an assistant message in the history; `arguments` may be
/// OpenAI's JSON string or an object.
pub fn history_calls(calls: &[ToolCallIn]) -> Result<Vec<ToolCall>> {
    calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let bad = |what: String| Error::invalid("messages", format!("tool_calls[{i}]: {what}"));
            if call.kind.as_deref().is_some_and(|kind| kind != "function") {
                return Err(bad("only calls of type \"function\" are supported".into()));
            }
            let arguments = match &call.function.arguments {
                Value::String(text) => serde_json::from_str::<Value>(text)
                    .map_err(|e| bad(format!("function.arguments is not JSON: {e}")))?,
                other => other.clone(),
            };
            let Value::Object(arguments) = arguments else {
                return Err(bad("function.arguments must be a JSON object".into()));
            };
            Ok(ToolCall {
                name: call.function.name.clone(),
                arguments,
            })
        })
        .collect()
}

/// A call as the API returns it, with a new id; `index` in stream deltas.
fn call_out(call: &ToolCall, index: Option<usize>) -> ToolCallOut {
    ToolCallOut {
        index,
        id: request_id("chatcmpl-tool"),
        kind: "function",
        function: FunctionOut {
            name: call.name.clone(),
            arguments: Value::Object(call.arguments.clone()).to_string(),
        },
    }
}

/// `tool_calls` when the model called a tool and stopped on its own, as vLLM reports it.
pub fn finish_reason(reason: FinishReason, called: bool) -> &'static str {
    if called && reason == FinishReason::Stop {
        "tool_calls"
    } else {
        reason.as_str()
    }
}

/// A whole answer's text and calls, read as one stream piece: the text
/// outside the calls, trimmed (`None` when empty), and the calls; with no
/// call, the text as the model wrote it.
pub fn answer(text: &str, calling: ToolCalling) -> (Option<String>, Vec<ToolCallOut>) {
    let (content, mut calls) = StreamedCalls::new(calling).push(text, true);
    if calls.is_empty() {
        return (Some(text.to_string()), calls);
    }
    for call in &mut calls {
        call.index = None; // an index belongs to stream deltas only
    }
    let content = content.trim();
    ((!content.is_empty()).then(|| content.to_string()), calls)
}

/// One streamed answer's calls, read as its text arrives.
#[derive(Debug, Clone)]
pub struct StreamedCalls {
    /// The answer's parser, until its end.
    parser: Option<ToolCallParser>,
    parallel: bool,
    /// Calls sent so far.
    sent: usize,
}

impl StreamedCalls {
    /// A parser for one answer.
    pub fn new(calling: ToolCalling) -> StreamedCalls {
        StreamedCalls {
            parser: Some(ToolCallParser::new(calling.format)),
            parallel: calling.parallel,
            sent: 0,
        }
    }

    /// The content and calls that `delta` (and, when `last`, the end of
    /// the answer) make known; nothing after the end.
    pub fn push(&mut self, delta: &str, last: bool) -> (String, Vec<ToolCallOut>) {
        let mut events = Vec::new();
        if let Some(parser) = self.parser.as_mut() {
            events = parser.push(delta);
        }
        if last && let Some(parser) = self.parser.take() {
            events.extend(parser.finish());
        }
        let mut content = String::new();
        let mut calls = Vec::new();
        for event in events {
            match event {
                ToolCallEvent::Content(text) => content.push_str(&text),
                ToolCallEvent::Malformed(call) => content.push_str(&call.text),
                ToolCallEvent::Call(call) if self.parallel || self.sent == 0 => {
                    calls.push(call_out(&call, Some(self.sent)));
                    self.sent += 1;
                }
                ToolCallEvent::Call(_) => {}
            }
        }
        (content, calls)
    }

    /// Whether any call was sent.
    pub fn called(&self) -> bool {
        self.sent > 0
    }
}
