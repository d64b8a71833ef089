//! Chat templates: the Jinja templates of Hugging Face tokenizers, rendered
//! with minijinja as transformers' `apply_chat_template(..., tokenize=False)`.
//!
//! Like transformers, the environment trims blocks (`trim_blocks`,
//! `lstrip_blocks`), has loop controls, `raise_exception(message)`, a
//! Python-style `tojson` (`", "` and `": "` separators, no HTML escaping,
//! `indent` and `ensure_ascii`), and Python string / dict / list methods
//! (`.strip()`, `.startswith()`, `.split()`, `.items()`, ...); dicts keep
//! their keys' order, as Python's do. A render sees `messages` (an
//! assistant message's `tool_calls` in OpenAI's form), `add_generation_prompt`,
//! `bos_token`, `eos_token`, `tools` (OpenAI's form, or `none` when no tool is
//! on offer) and `documents` as `none`.

use std::path::Path;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, Value};
use minijinja::{Environment, ErrorKind};
use serde::Serialize;

use crate::tokenizer::TokenizerConfig;
use crate::tools::{Tool, ToolCall};
use crate::{Error, Result};

/// The name the template is stored under in its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The message's text.
    pub content: String,
    /// The tools an assistant message calls, in order.
    pub tool_calls: Vec<ToolCall>,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }

    /// The same message making `calls`.
    pub fn with_tool_calls(mut self, calls: Vec<ToolCall>) -> Self {
        self.tool_calls = calls;
        self
    }
}

/// Messages reach templates as objects whose keys keep the order `role`,
/// `content`, `tool_calls`, as a Python dict built in that order would;
/// `tool_calls` is there only when the message makes calls.
impl Object for ChatMessage {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "role" => Some(Value::from(self.role.as_str())),
            "content" => Some(Value::from(self.content.as_str())),
            "tool_calls" if !self.tool_calls.is_empty() => Some(Value::from_serialize(
                self.tool_calls.iter().map(ToolCall::to_json).collect::<Vec<_>>(),
            )),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        if self.tool_calls.is_empty() {
            Enumerator::Str(&["role", "content"])
        } else {
            Enumerator::Str(&["role", "content", "tool_calls"])
        }
    }
}

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl ChatTemplate {
    /// Compiles the Jinja `source`.
    pub fn new(source: impl Into<String>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.into())
            .map_err(template_error)?;
        Ok(ChatTemplate { env })
    }

    /// The template of the `tokenizer_config.json` at `path` (its `chat_template`,
    /// or of a list of named templates the `default` one).
    pub fn from_tokenizer_config(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let source = TokenizerConfig::load(path)?
            .chat_template
            .ok_or_else(|| Error::format(path, "no chat_template"))?;
        Self::new(source)
    }

    /// Renders `messages`; `add_generation_prompt` appends the opening of the
    /// assistant's turn. A template's `raise_exception(msg)` gives an
    /// [`Error::Template`] holding `msg`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<String> {
        self.render_with(
            messages,
            add_generation_prompt,
            bos_token,
            eos_token,
            &[],
            &serde_json::Map::new(),
        )
    }

    /// As [`ChatTemplate::render`], with `tools` on offer (transformers'
    /// `apply_chat_template(tools=...)`; none: `tools` is `none`) and
    /// `extra` variables for the template (its `**kwargs`, e.g.
    /// `enable_thinking`), which cannot replace the other variables.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        bos_token: &str,
        eos_token: &str,
        tools: &[Tool],
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let messages: Vec<Value> = messages.iter().map(|m| Value::from_object(m.clone())).collect();
        let tools = match tools {
            [] => Value::from(()),
            tools => Value::from_serialize(tools.iter().map(Tool::to_json).collect::<Vec<_>>()),
        };
        let template = self.env.get_template(TEMPLATE_NAME).map_err(template_error)?;
        template
            .render(minijinja::context! {
                messages,
                add_generation_prompt,
                bos_token,
                eos_token,
                tools,
                documents => Value::from(()),
                ..Value::from_serialize(extra)
            })
            .map_err(template_error)
    }
}

/// An [`Error::Template`] with minijinja's message (kind, detail, template line).
fn template_error(e: minijinja::Error) -> Error {
    Error::Template(e.to_string())
}

/// `raise_exception(message)`: stops rendering with `message`.
fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// `value | tojson(indent=None, ensure_ascii=False)` as Python's `json.dumps`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let mut out = Vec::new();
    let serialized = match indent {
        Some(n) => {
            let spaces = vec![b' '; n];
            let formatter = serde_json::ser::PrettyFormatter::with_indent(&spaces);
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, formatter))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PythonFormatter)),
    };
    serialized.map_err(|e| minijinja::Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    let json = String::from_utf8(out).map_err(|e| minijinja::Error::new(ErrorKind::BadSerialization, e.to_string()))?;
    Ok(Value::from(if ensure_ascii.unwrap_or(false) {
        escape_non_ascii(&json)
    } else {
        json
    }))
}

/// Every non-ASCII character as `\uXXXX` (UTF-16 units), as `ensure_ascii=True`.
/// Non-ASCII characters only occur inside JSON strings, so this is safe.
fn escape_non_ascii(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            for unit in c.encode_utf16(&mut [0; 2]) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    out
}

/// serde_json's compact output with Python's default separators `", "` and `": "`.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}
