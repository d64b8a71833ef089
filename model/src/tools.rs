//! Tools: what a chat template renders of a tool on offer ([`Tool`]), and
//! the calls a model writes, parsed from its text in its chat template
//! family's format:
//!
//! - [`ToolCallFormat::Hermes`] (Qwen 2/2.5/3, Hermes, and most templates
//!   that render `tools`): each call is a JSON object
//!   `{"name": …, "arguments": {…}}` between `<tool_call>` and
//!   `</tool_call>`; text around the calls is the turn's content.
//! - [`ToolCallFormat::Llama3Json`] (Llama 3.1+ templates with JSON tool
//!   calling): a turn that starts with a JSON object (after whitespace and
//!   an optional `<|python_tag|>`) is one or more calls
//!   `{"name": …, "parameters": {…}}` (or `"arguments"`), separated by `;`;
//!   any other turn is plain content.
//!
//! [`ToolCallParser`] reads text as it streams, a piece at a time (calls may
//! be split anywhere, even inside a tag), and reports content and calls as
//! soon as they are known; [`parse_tool_calls`] does the same for a whole
//! turn. A call that cannot be used — bad JSON, no name, arguments that are
//! not an object, a tag never closed — is reported as a [`MalformedCall`]
//! with the reason, for the caller to show the model; it is never an error.

use serde_json::{Map, Value, json};

use crate::text::partial_tag_len;

/// A tool on offer: a name, a description and a JSON schema of its
/// arguments, as OpenAI's and transformers' `tools` take it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// The name calls use.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON schema of its arguments (an object schema).
    pub parameters: Value,
}

impl Tool {
    /// A tool in OpenAI's shape, `{"type": "function", "function": {"name",
    /// "description", "parameters"}}` (`type` may be left out, `description`
    /// defaults to "" and `parameters` to an empty object schema); the error
    /// says what is wrong with it.
    pub fn from_json(item: &Value) -> Result<Tool, String> {
        let short = |value: &Value| value.to_string().chars().take(100).collect::<String>();
        let Value::Object(item) = item else {
            return Err(format!("is {}, not an object", short(item)));
        };
        match item.get("type") {
            None => {}
            Some(Value::String(kind)) if kind == "function" => {}
            Some(other) => return Err(format!("has type {}, not \"function\"", short(other))),
        }
        let Some(Value::Object(function)) = item.get("function") else {
            return Err("has no `function` object".into());
        };
        let name = match function.get("name") {
            Some(Value::String(name)) if !name.is_empty() => name.clone(),
            _ => return Err("has no `function.name` (a non-empty string)".into()),
        };
        let description = match function.get("description") {
            None => String::new(),
            Some(Value::String(text)) => text.clone(),
            Some(other) => return Err(format!("`{name}` has description {}, not a string", short(other))),
        };
        let parameters = match function.get("parameters") {
            None => json!({"type": "object", "properties": {}}),
            Some(Value::Object(schema)) => Value::Object(schema.clone()),
            Some(other) => {
                return Err(format!(
                    "`{name}` has parameters {}, not a JSON schema object",
                    short(other)
                ));
            }
        };
        Ok(Tool {
            name,
            description,
            parameters,
        })
    }

    /// A list of tools in OpenAI's shape ([`Tool::from_json`]), their
    /// names distinct; the error names the item.
    pub fn list_from_json(list: &Value) -> Result<Vec<Tool>, String> {
        let Value::Array(items) = list else {
            return Err("`tools` must be a list of tools (`[]` for none)".into());
        };
        let mut tools: Vec<Tool> = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let tool = Tool::from_json(item).map_err(|what| format!("tools[{i}] {what}"))?;
            if tools.iter().any(|t| t.name == tool.name) {
                return Err(format!("two tools are named `{}`", tool.name));
            }
            tools.push(tool);
        }
        Ok(tools)
    }

    /// The tool as chat templates see it:
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub fn to_json(&self) -> Value {
        json!({
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        })
    }
}

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments (a JSON object).
    pub arguments: Map<String, Value>,
}

impl ToolCall {
    /// The call as chat templates see it in an assistant message's
    /// `tool_calls`: `{"type": "function", "function": {"name", "arguments"}}`.
    pub fn to_json(&self) -> Value {
        json!({"type": "function", "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// A call the model tried to make and that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedCall {
    /// The call's text as the model wrote it (tags included).
    pub text: String,
    /// What is wrong with it, in words the model can act on.
    pub reason: String,
}

/// How a chat template family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>{"name": …, "arguments": …}</tool_call>` blocks.
    Hermes,
    /// A turn of JSON objects `{"name": …, "parameters": …}` separated by `;`.
    Llama3Json,
}

/// Llama 3's tag before a tool call.
const PYTHON_TAG: &str = "<|python_tag|>";
/// Where a Hermes call starts.
const OPEN: &str = "<tool_call>";
/// Where a Hermes call ends.
const CLOSE: &str = "</tool_call>";

impl ToolCallFormat {
    /// The format a chat template's model writes: Llama 3's for a template
    /// built on Llama 3's header tokens, Hermes' for any other.
    pub fn of_template(source: &str) -> ToolCallFormat {
        if source.contains("<|start_header_id|>") {
            ToolCallFormat::Llama3Json
        } else {
            ToolCallFormat::Hermes
        }
    }
}

/// What the parser found in the text so far, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolCallEvent {
    /// Text outside any call.
    Content(String),
    /// A well-formed call.
    Call(ToolCall),
    /// A call that cannot be used.
    Malformed(MalformedCall),
}

/// A whole turn, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedTurn {
    /// The text outside the well-formed calls, trimmed of surrounding
    /// whitespace: a malformed call's text stays in it as the model wrote it
    /// (as vLLM's parsers leave text they cannot parse as content), so a
    /// transcript shows every word of the turn.
    pub content: String,
    /// Every call in order, well-formed or not.
    pub calls: Vec<Result<ToolCall, MalformedCall>>,
}

/// Parses a whole assistant turn.
pub fn parse_tool_calls(text: &str, format: ToolCallFormat) -> ParsedTurn {
    let mut parser = ToolCallParser::new(format);
    let mut events = parser.push(text);
    events.extend(parser.finish());
    ParsedTurn::from_events(events)
}

impl ParsedTurn {
    /// The turn that a whole text's events make.
    fn from_events(events: impl IntoIterator<Item = ToolCallEvent>) -> ParsedTurn {
        let mut turn = ParsedTurn::default();
        for event in events {
            match event {
                ToolCallEvent::Content(text) => turn.content.push_str(&text),
                ToolCallEvent::Call(call) => turn.calls.push(Ok(call)),
                ToolCallEvent::Malformed(call) => {
                    turn.content.push_str(&call.text);
                    turn.calls.push(Err(call));
                }
            }
        }
        turn.content = turn.content.trim().to_string();
        turn
    }

    /// The well-formed calls, in order.
    pub fn well_formed(&self) -> Vec<&ToolCall> {
        self.calls.iter().filter_map(|c| c.as_ref().ok()).collect()
    }

    /// The malformed calls, in order.
    pub fn malformed(&self) -> Vec<&MalformedCall> {
        self.calls.iter().filter_map(|c| c.as_ref().err()).collect()
    }
}

/// Where a Llama 3 turn stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Llama3 {
    /// Only whitespace (or part of `<|python_tag|>`) so far.
    Undecided,
    /// The turn is calls: everything is kept until the end.
    Calls,
    /// The turn is content: text passes through.
    Content,
}

/// An incremental tool-call parser over streamed text.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    format: ToolCallFormat,
    /// Text not reported yet.
    held: String,
    /// Hermes: inside a `<tool_call>` block (its opening tag consumed).
    inside: bool,
    /// Llama 3: what the turn is.
    llama3: Llama3,
}

impl ToolCallParser {
    /// A parser for a turn written in `format`.
    pub fn new(format: ToolCallFormat) -> ToolCallParser {
        ToolCallParser {
            format,
            held: String::new(),
            inside: false,
            llama3: Llama3::Undecided,
        }
    }

    /// Takes the next piece of text; returns what it completes.
    pub fn push(&mut self, text: &str) -> Vec<ToolCallEvent> {
        self.held.push_str(text);
        match self.format {
            ToolCallFormat::Hermes => self.hermes(),
            ToolCallFormat::Llama3Json => self.llama3(),
        }
    }

    /// Ends the turn: reports what was held back (an unclosed call is malformed).
    pub fn finish(mut self) -> Vec<ToolCallEvent> {
        let held = std::mem::take(&mut self.held);
        match self.format {
            ToolCallFormat::Hermes if self.inside => vec![ToolCallEvent::Malformed(MalformedCall {
                text: format!("{OPEN}{held}"),
                reason: format!("the call has no closing {CLOSE}"),
            })],
            ToolCallFormat::Llama3Json if self.llama3 == Llama3::Calls => llama3_calls(&held),
            _ if held.is_empty() => Vec::new(),
            _ => vec![ToolCallEvent::Content(held)],
        }
    }

    fn hermes(&mut self) -> Vec<ToolCallEvent> {
        let mut events = Vec::new();
        loop {
            if self.inside {
                let Some(end) = self.held.find(CLOSE) else {
                    return events;
                };
                let body = self.held[..end].to_string();
                self.held.drain(..end + CLOSE.len());
                self.inside = false;
                events.push(hermes_call(&body));
            } else {
                match self.held.find(OPEN) {
                    Some(start) => {
                        if start > 0 {
                            events.push(ToolCallEvent::Content(self.held[..start].to_string()));
                        }
                        self.held.drain(..start + OPEN.len());
                        self.inside = true;
                    }
                    None => {
                        // Keep back what may be the start of an opening tag.
                        let keep = partial_tag_len(&self.held, &[OPEN]);
                        let ready = self.held.len() - keep;
                        if ready > 0 {
                            events.push(ToolCallEvent::Content(self.held[..ready].to_string()));
                            self.held.drain(..ready);
                        }
                        return events;
                    }
                }
            }
        }
    }

    fn llama3(&mut self) -> Vec<ToolCallEvent> {
        if self.llama3 == Llama3::Undecided {
            let start = self.held.trim_start();
            self.llama3 = if start.is_empty() || (PYTHON_TAG.starts_with(start) && start.len() < PYTHON_TAG.len()) {
                Llama3::Undecided
            } else if start.starts_with('{') || start.starts_with(PYTHON_TAG) {
                Llama3::Calls
            } else {
                Llama3::Content
            };
        }
        match self.llama3 {
            Llama3::Content => vec![ToolCallEvent::Content(std::mem::take(&mut self.held))],
            _ => Vec::new(),
        }
    }
}

/// One Hermes call from the text between its tags.
fn hermes_call(body: &str) -> ToolCallEvent {
    let text = format!("{OPEN}{body}{CLOSE}");
    match serde_json::from_str::<Value>(body.trim()) {
        Ok(value) => call_event(value, "arguments", &["arguments"], text),
        Err(error) => ToolCallEvent::Malformed(MalformedCall {
            text,
            reason: format!("the call is not valid JSON: {error}"),
        }),
    }
}

/// The calls of a Llama 3 turn: JSON objects separated by `;`.
fn llama3_calls(held: &str) -> Vec<ToolCallEvent> {
    let body = held.trim_start();
    let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body);
    let mut events = Vec::new();
    let mut rest = body.trim();
    while !rest.is_empty() {
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match stream.next() {
            Some(Ok(value)) => {
                let used = stream.byte_offset();
                let text = rest[..used].to_string();
                events.push(call_event(value, "parameters", &["parameters", "arguments"], text));
                rest = rest[used..].trim_start();
                rest = rest.strip_prefix(';').unwrap_or(rest).trim_start();
            }
            Some(Err(error)) => {
                events.push(ToolCallEvent::Malformed(MalformedCall {
                    text: rest.to_string(),
                    reason: format!("the call is not valid JSON: {error}"),
                }));
                break;
            }
            None => break,
        }
    }
    events
}

/// A parsed JSON value as a call: an object with a string `name` and an
/// object under the first of `argument_keys` present (`expected` names it
/// in messages).
fn call_event(value: Value, expected: &str, argument_keys: &[&str], text: String) -> ToolCallEvent {
    let malformed = |reason: String| {
        ToolCallEvent::Malformed(MalformedCall {
            text: text.clone(),
            reason,
        })
    };
    let Value::Object(mut object) = value else {
        return malformed("the call is not a JSON object".to_string());
    };
    let name = match object.remove("name") {
        Some(Value::String(name)) if !name.trim().is_empty() => name,
        Some(_) => return malformed("the call's \"name\" is not a non-empty string".to_string()),
        None => return malformed("the call has no \"name\"".to_string()),
    };
    let arguments = argument_keys.iter().find_map(|key| object.remove(*key));
    match arguments {
        Some(Value::Object(arguments)) => ToolCallEvent::Call(ToolCall { name, arguments }),
        Some(_) => malformed(format!("the call's \"{expected}\" is not a JSON object")),
        None => malformed(format!("the call has no \"{expected}\" object")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, arguments: Value) -> ToolCall {
        let Value::Object(arguments) = arguments else { panic!() };
        ToolCall {
            name: name.to_string(),
            arguments,
        }
    }

    /// Every way of cutting `text` into two or three pieces gives the events
    /// the whole text gives, once merged.
    fn same_when_streamed(text: &str, format: ToolCallFormat) {
        let whole = parse_tool_calls(text, format);
        let cuts: Vec<usize> = (0..=text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        for &a in &cuts {
            for &b in cuts.iter().filter(|&&b| b >= a).step_by(3) {
                let mut parser = ToolCallParser::new(format);
                let mut events = Vec::new();
                for piece in [&text[..a], &text[a..b], &text[b..]] {
                    events.extend(parser.push(piece));
                }
                events.extend(parser.finish());
                assert_eq!(ParsedTurn::from_events(events), whole, "cut at {a} and {b} of {text:?}");
            }
        }
    }

    #[test]
    fn hermes_calls_and_the_text_around_them() {
        let text = "Let me compute.\n<tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"expression\": \"12*34\"}}\n</tool_call>\n<tool_call>{\"name\": \"lookup\", \"arguments\": {\"key\": \"π\", \"exact\": true}}</tool_call>";
        let turn = parse_tool_calls(text, ToolCallFormat::Hermes);
        assert_eq!(turn.content, "Let me compute.");
        assert_eq!(
            turn.calls,
            [
                Ok(call("calculate", json!({"expression": "12*34"}))),
                Ok(call("lookup", json!({"key": "π", "exact": true})))
            ]
        );
        same_when_streamed(text, ToolCallFormat::Hermes);
    }

    #[test]
    fn text_without_calls_is_content_even_with_a_partial_tag() {
        for text in ["The answer is 408.", "a < b and <tool_ca", "<tool", ""] {
            let turn = parse_tool_calls(text, ToolCallFormat::Hermes);
            assert_eq!((turn.content.as_str(), turn.calls.len()), (text.trim(), 0));
            same_when_streamed(text, ToolCallFormat::Hermes);
        }
    }

    #[test]
    fn malformed_hermes_calls_say_what_is_wrong() {
        let cases = [
            (
                "<tool_call>{\"name\": \"calculate\", \"arguments\": {\"x\": 1}</tool_call>",
                "not valid JSON",
            ),
            ("<tool_call>[1, 2]</tool_call>", "not a JSON object"),
            ("<tool_call>{\"arguments\": {}}</tool_call>", "no \"name\""),
            (
                "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
                "\"name\" is not",
            ),
            ("<tool_call>{\"name\": \"f\"}</tool_call>", "no \"arguments\" object"),
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": \"x=1\"}</tool_call>",
                "\"arguments\" is not a JSON object",
            ),
            (
                "<tool_call>{\"name\": \"f\", \"arguments\": {}}",
                "no closing </tool_call>",
            ),
        ];
        for (text, needle) in cases {
            let turn = parse_tool_calls(&format!("ok {text} then"), ToolCallFormat::Hermes);
            let [Err(bad)] = turn.calls.as_slice() else {
                panic!("{text}: {turn:?}")
            };
            assert!(bad.reason.contains(needle), "{text}: {}", bad.reason);
            assert!(
                bad.text.starts_with(OPEN) && text.starts_with(&bad.text[..20]),
                "{bad:?}"
            );
            assert!(
                turn.content.starts_with("ok ") && turn.content.contains(&bad.text),
                "the bad call's text stays in the content: {turn:?}"
            );
            same_when_streamed(text, ToolCallFormat::Hermes);
        }
        // A bad call does not spoil a good one after it.
        let turn = parse_tool_calls(
            "<tool_call>{oops}</tool_call><tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>",
            ToolCallFormat::Hermes,
        );
        assert_eq!(
            (turn.malformed().len(), turn.well_formed()),
            (1, vec![&call("f", json!({}))])
        );
    }

    #[test]
    fn llama3_turns_are_calls_or_content() {
        let text = " <|python_tag|>{\"name\": \"calculate\", \"parameters\": {\"expression\": \"7/8\"}}; {\"name\": \"f\", \"arguments\": {\"a\": [1]}}";
        let turn = parse_tool_calls(text, ToolCallFormat::Llama3Json);
        assert_eq!(
            (turn.content.as_str(), turn.calls),
            (
                "",
                vec![
                    Ok(call("calculate", json!({"expression": "7/8"}))),
                    Ok(call("f", json!({"a": [1]})))
                ]
            )
        );
        same_when_streamed(text, ToolCallFormat::Llama3Json);
        for content in ["The answer is {x}.", "  <|python", "no calls"] {
            let turn = parse_tool_calls(content, ToolCallFormat::Llama3Json);
            assert_eq!((turn.content.as_str(), turn.calls.len()), (content.trim(), 0));
            same_when_streamed(content, ToolCallFormat::Llama3Json);
        }
        let turn = parse_tool_calls(
            "{\"name\": \"f\", \"parameters\": {}}; {\"name\": ",
            ToolCallFormat::Llama3Json,
        );
        assert_eq!(turn.well_formed(), [&call("f", json!({}))]);
        assert!(turn.malformed()[0].reason.contains("not valid JSON"), "{turn:?}");
        let turn = parse_tool_calls("{\"name\": \"f\"}", ToolCallFormat::Llama3Json);
        assert!(
            turn.malformed()[0].reason.contains("no \"parameters\" object"),
            "{turn:?}"
        );
    }

    #[test]
    fn the_format_follows_the_template() {
        let llama3 = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}";
        assert_eq!(ToolCallFormat::of_template(llama3), ToolCallFormat::Llama3Json);
        assert_eq!(
            ToolCallFormat::of_template("<|im_start|>{{ role }}"),
            ToolCallFormat::Hermes
        );
    }
}
