//! Prompts for training: a JSONL file of rows, one column holding the
//! prompt (text, or a chat list of turns in OpenAI's form: `{role,
//! content}`, an assistant turn's `tool_calls`, a tool turn's
//! `tool_call_id`; other keys are refused), every other column
//! kept for the rewards (e.g. `answer`); a held-out eval split; and a
//! seeded sampler over epochs whose position can be saved and restored.
//!
//! Shuffling uses its own SplitMix64 generator, so an order depends only
//! on the seed and the epoch — not on a library's version — and a resumed
//! run continues exactly.

use std::path::Path;

use grpo_model::chat::ChatMessage;
use grpo_model::tools::ToolCall;
use grpo_rollout::guided::Guide;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::dataset::read_rows;
use crate::error::{Error, Result};

/// A chat turn, in OpenAI's form.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatTurn {
    /// `system`, `user`, `assistant`, `tool`, …
    pub role: String,
    /// The text (absent or null only in an assistant turn that calls tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// An assistant turn's tool calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<TurnToolCall>,
    /// A tool turn's answer to this call id (kept, not rendered by most templates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatTurn {
    /// A turn of `role` saying `content`.
    pub fn new(role: &str, content: &str) -> ChatTurn {
        ChatTurn {
            role: role.to_string(),
            content: Some(content.to_string()),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// The text (empty when there is none).
    pub fn text(&self) -> &str {
        self.content.as_deref().unwrap_or_default()
    }

    /// A JSON list of turns, or why it is not one: unknown keys, and a turn
    /// without a text `content` that is not an assistant turn calling tools,
    /// are refused.
    pub fn parse_all(value: Value) -> std::result::Result<Vec<ChatTurn>, String> {
        let turns: Vec<ChatTurn> = serde_json::from_value(value).map_err(|e| e.to_string())?;
        match turns
            .iter()
            .position(|t| t.content.is_none() && (t.role != "assistant" || t.tool_calls.is_empty()))
        {
            Some(i) => Err(format!(
                "turn {} ({}) has no text `content` (only an assistant turn with tool_calls may leave it out)",
                i + 1,
                turns[i].role
            )),
            None => Ok(turns),
        }
    }

    /// The turn as the chat template renders it.
    pub fn message(&self) -> ChatMessage {
        let calls = self
            .tool_calls
            .iter()
            .map(|call| ToolCall {
                name: call.function.name.clone(),
                arguments: call.function.arguments.clone(),
            })
            .collect();
        ChatMessage::new(&self.role, self.text()).with_tool_calls(calls)
    }
}

/// A tool call in an assistant turn: `{"type": "function", "function":
/// {"name", "arguments"}}` (an `id` is kept).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnToolCall {
    /// The call's id, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `function`.
    #[serde(rename = "type", default = "function_type", deserialize_with = "function_only")]
    pub kind: String,
    /// The tool called and its arguments.
    pub function: TurnFunction,
}

/// The function a [`TurnToolCall`] calls.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnFunction {
    /// The tool's name.
    pub name: String,
    /// Its arguments: a JSON object, or (as OpenAI's API sends them) a
    /// string holding one.
    #[serde(deserialize_with = "object_or_json_string")]
    pub arguments: Map<String, Value>,
}

fn function_type() -> String {
    "function".to_string()
}

fn function_only<'de, D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<String, D::Error> {
    let kind = String::deserialize(deserializer)?;
    if kind != "function" {
        return Err(serde::de::Error::custom(format!(
            "a tool call's type is `function`, not `{kind}`"
        )));
    }
    Ok(kind)
}

fn object_or_json_string<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Map<String, Value>, D::Error> {
    let not_object =
        || serde::de::Error::custom("a tool call's `arguments` must be a JSON object (or a string of one)");
    match Value::deserialize(deserializer)? {
        Value::Object(arguments) => Ok(arguments),
        Value::String(text) => match serde_json::from_str(&text) {
            Ok(Value::Object(arguments)) => Ok(arguments),
            _ => Err(not_object()),
        },
        _ => Err(not_object()),
    }
}

/// A row's prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Plain text, tokenized as it is.
    Text(String),
    /// Chat turns, rendered with the model's chat template.
    Chat(Vec<ChatTurn>),
}

impl Prompt {
    /// The prompt as chat messages (plain text is one user message), as an
    /// episode starts from it.
    pub fn chat(&self) -> Vec<ChatMessage> {
        match self {
            Prompt::Text(text) => vec![ChatMessage::new("user", text.clone())],
            Prompt::Chat(turns) => turns.iter().map(ChatTurn::message).collect(),
        }
    }
}

/// One row of the data.
#[derive(Debug, Clone, PartialEq)]
pub struct Example {
    /// Its line number in the file (0-based), a stable id.
    pub index: usize,
    /// The prompt.
    pub prompt: Prompt,
    /// Every other column, for the rewards.
    pub columns: Map<String, Value>,
    /// Its rollouts' guide, from its `structured_outputs` column (vLLM's
    /// options; the column stays among the others).
    pub guide: Option<Guide>,
}

/// The column of a row's guided-decoding options.
pub const GUIDE_COLUMN: &str = "structured_outputs";

/// Reads the dataset at `path` (a JSONL, Parquet or Arrow file, or its
/// `split` of a dataset folder: [`crate::dataset`]), taking the prompt from
/// `prompt_column`. Errors name the file and line (or row).
pub fn load_examples(path: &Path, split: &str, prompt_column: &str) -> Result<Vec<Example>> {
    let mut examples = Vec::new();
    for row in read_rows(path, split)? {
        let number = row.number;
        let fail = |line: usize, message: String| Error::Data {
            path: row.file.clone(),
            line,
            message,
        };
        let mut columns = row.columns;
        let prompt = match columns.remove(prompt_column) {
            Some(Value::String(text)) => Prompt::Text(text),
            Some(chat @ Value::Array(_)) => {
                let turns = ChatTurn::parse_all(chat).map_err(|e| {
                    fail(
                        number,
                        format!("`{prompt_column}` as chat turns ({{role, content, tool_calls}}): {e}"),
                    )
                })?;
                Prompt::Chat(turns)
            }
            Some(_) => {
                return Err(fail(
                    number,
                    format!("`{prompt_column}` must be text or a list of chat turns"),
                ));
            }
            None => return Err(fail(number, format!("no `{prompt_column}` column"))),
        };
        let guide = match columns.get(GUIDE_COLUMN) {
            None | Some(Value::Null) => None,
            Some(options) => {
                Some(Guide::from_options(options).map_err(|e| fail(number, format!("`{GUIDE_COLUMN}`: {e}")))?)
            }
        };
        examples.push(Example {
            index: examples.len(),
            prompt,
            columns,
            guide,
        });
    }
    if examples.is_empty() {
        return Err(Error::Data {
            path: path.to_path_buf(),
            line: 0,
            message: "no rows".to_string(),
        });
    }
    Ok(examples)
}

/// `examples` with chat prompts: with `as_chat`, a text prompt becomes one
/// user turn; with `system`, a chat prompt without a system turn gets one
/// first (the model's template then renders it).
pub fn to_chat(examples: Vec<Example>, as_chat: bool, system: Option<&str>) -> Vec<Example> {
    examples
        .into_iter()
        .map(|mut example| {
            if as_chat && let Prompt::Text(text) = &example.prompt {
                example.prompt = Prompt::Chat(vec![ChatTurn::new("user", text)]);
            }
            if let (Some(system), Prompt::Chat(turns)) = (system, &mut example.prompt)
                && turns.first().is_none_or(|t| t.role != "system")
            {
                turns.insert(0, ChatTurn::new("system", system));
            }
            example
        })
        .collect()
}

/// SplitMix64: a small, fixed generator for shuffles.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Fisher–Yates.
    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = (self.next() % (i as u64 + 1)) as usize;
            items.swap(i, j);
        }
    }
}

/// `examples` split into (train, eval): `eval_size` rows chosen by `seed`
/// are held out; both keep file order.
pub fn split(examples: Vec<Example>, eval_size: usize, seed: u64) -> Result<(Vec<Example>, Vec<Example>)> {
    if eval_size >= examples.len() {
        return Err(Error::Config {
            field: "eval_size",
            message: format!("{eval_size} leaves nothing of {} rows to train on", examples.len()),
        });
    }
    let mut order: Vec<usize> = (0..examples.len()).collect();
    SplitMix64(seed ^ 0xE7A1).shuffle(&mut order);
    let mut held = vec![false; examples.len()];
    for &i in &order[..eval_size] {
        held[i] = true;
    }
    Ok(examples.into_iter().partition(|e| !held[e.index]))
}

/// Where a [`PromptSampler`] is: restore it with [`PromptSampler::resume`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SamplerState {
    /// Completed passes over the data.
    pub epoch: u64,
    /// Rows of this epoch already handed out.
    pub position: usize,
}

impl SamplerState {
    /// Passes over data of `rows` rows, fractional (TRL's `epoch`).
    pub fn epochs(&self, rows: usize) -> f64 {
        self.epoch as f64 + self.position as f64 / rows.max(1) as f64
    }
}

/// Hands out training rows in a seeded order, reshuffled every epoch.
pub struct PromptSampler {
    rows: usize,
    seed: u64,
    order: Vec<usize>,
    state: SamplerState,
}

impl PromptSampler {
    /// A sampler over `rows` rows (indices into the train split).
    pub fn new(rows: usize, seed: u64) -> PromptSampler {
        Self::resume(rows, seed, SamplerState { epoch: 0, position: 0 })
    }

    /// A sampler continuing from `state`.
    pub fn resume(rows: usize, seed: u64, state: SamplerState) -> PromptSampler {
        let mut sampler = PromptSampler {
            rows,
            seed,
            order: Vec::new(),
            state,
        };
        sampler.order = sampler.epoch_order(state.epoch);
        sampler
    }

    fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.rows).collect();
        SplitMix64(self.seed.wrapping_add(epoch.wrapping_mul(0x2545_F491_4F6C_DD1D))).shuffle(&mut order);
        order
    }

    /// The next `n` row indices (crossing into the next epoch as needed).
    pub fn next_batch(&mut self, n: usize) -> Vec<usize> {
        let mut batch = Vec::with_capacity(n);
        while batch.len() < n && self.rows > 0 {
            if self.state.position == self.rows {
                self.state = SamplerState {
                    epoch: self.state.epoch + 1,
                    position: 0,
                };
                self.order = self.epoch_order(self.state.epoch);
            }
            batch.push(self.order[self.state.position]);
            self.state.position += 1;
        }
        batch
    }

    /// Where the sampler is.
    pub fn state(&self) -> SamplerState {
        self.state
    }
}
