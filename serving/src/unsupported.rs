//! Request fields of the OpenAI and vLLM APIs that would change what is
//! generated or returned and that `grpo serve` does not implement. A request
//! that sets one to anything but its neutral value (absent, null, or the
//! value that leaves the answer as if it were absent) gets a 400 naming the
//! field, instead of an answer that silently ignores it. Fields unknown to
//! both APIs are still ignored, as vLLM ignores them.

use serde_json::{Map, Value};

use crate::error::Error;

/// The endpoint a request body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/chat/completions`.
    Chat,
}

/// A field grpo refuses, where, and which values leave the answer unchanged.
struct Refused {
    /// The field's name.
    field: &'static str,
    /// The endpoint it is refused on (`None`: both).
    only: Option<Endpoint>,
    /// Whether a value (not null) leaves the answer as if the field were absent.
    neutral: fn(&Value, &Map<String, Value>) -> bool,
    /// What to do instead.
    hint: &'static str,
}

fn never(_: &Value, _: &Map<String, Value>) -> bool {
    false
}

fn empty(value: &Value, _: &Map<String, Value>) -> bool {
    match value {
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        Value::String(text) => text.is_empty(),
        _ => false,
    }
}

fn is_false(value: &Value, _: &Map<String, Value>) -> bool {
    *value == Value::Bool(false)
}

fn is_true(value: &Value, _: &Map<String, Value>) -> bool {
    *value == Value::Bool(true)
}

/// `best_of` equal to `n` (default 1) picks every sample: plain sampling.
fn best_of_n(value: &Value, body: &Map<String, Value>) -> bool {
    let n = body.get("n").and_then(Value::as_i64).unwrap_or(1);
    value.as_i64() == Some(n)
}

/// `"none"`: no function is called.
fn no_function(value: &Value, _: &Map<String, Value>) -> bool {
    value.as_str() == Some("none")
}

/// `["text"]`: a text answer only.
fn text_only(value: &Value, _: &Map<String, Value>) -> bool {
    value
        .as_array()
        .is_some_and(|kinds| kinds.iter().all(|k| k.as_str() == Some("text")))
}

const LEGACY: &str = "the legacy functions API is not supported: use `tools`";

/// Every refused field.
const REFUSED: &[Refused] = &[
    Refused {
        field: "logit_bias",
        only: None,
        neutral: empty,
        hint: "logit_bias is not supported: leave it out",
    },
    Refused {
        field: "best_of",
        only: None,
        neutral: best_of_n,
        hint: "best_of other than n is not supported: ask for n samples and choose among them",
    },
    Refused {
        field: "use_beam_search",
        only: None,
        neutral: is_false,
        hint: "beam search is not supported: leave it out",
    },
    Refused {
        field: "guided_whitespace_pattern",
        only: None,
        neutral: never,
        hint: "structured outputs write JSON compactly; a whitespace pattern is not supported: leave it out",
    },
    Refused {
        field: "allowed_token_ids",
        only: None,
        neutral: never,
        hint: "allowed_token_ids is not supported: leave it out",
    },
    Refused {
        field: "bad_words",
        only: None,
        neutral: empty,
        hint: "bad_words is not supported: leave it out",
    },
    Refused {
        field: "logits_processors",
        only: None,
        neutral: empty,
        hint: "logits processors are not supported: leave it out",
    },
    Refused {
        field: "prompt_logprobs",
        only: None,
        neutral: never,
        hint: "prompt log-probs are not returned: leave it out",
    },
    Refused {
        field: "truncate_prompt_tokens",
        only: None,
        neutral: never,
        hint: "prompts are not truncated: send a shorter prompt",
    },
    Refused {
        field: "return_tokens_as_token_ids",
        only: None,
        neutral: is_false,
        hint: "log-prob tokens are always text: use return_token_ids for ids",
    },
    Refused {
        field: "spaces_between_special_tokens",
        only: None,
        neutral: is_true,
        hint: "special tokens are always decoded with the tokenizer's spacing: leave it out",
    },
    Refused {
        field: "suffix",
        only: Some(Endpoint::Completions),
        neutral: empty,
        hint: "suffix (fill-in-the-middle) is not supported: leave it out",
    },
    Refused {
        field: "prompt_embeds",
        only: Some(Endpoint::Completions),
        neutral: never,
        hint: "prompt embeddings are not supported: send the prompt as text or token ids",
    },
    Refused {
        field: "reasoning_effort",
        only: Some(Endpoint::Chat),
        neutral: never,
        hint: "reasoning_effort is not passed to the chat template: give it in chat_template_kwargs if the template reads it",
    },
    Refused {
        field: "web_search_options",
        only: Some(Endpoint::Chat),
        neutral: never,
        hint: "web search is not supported: leave it out",
    },
    Refused {
        field: "functions",
        only: Some(Endpoint::Chat),
        neutral: empty,
        hint: LEGACY,
    },
    Refused {
        field: "function_call",
        only: Some(Endpoint::Chat),
        neutral: no_function,
        hint: LEGACY,
    },
    Refused {
        field: "chat_template",
        only: Some(Endpoint::Chat),
        neutral: never,
        hint: "the server's chat template is used (the tokenizer's, or `grpo serve --chat-template FILE`): leave it out",
    },
    Refused {
        field: "documents",
        only: Some(Endpoint::Chat),
        neutral: empty,
        hint: "documents are not passed to the chat template: put them in a message",
    },
    Refused {
        field: "add_special_tokens",
        only: Some(Endpoint::Chat),
        neutral: is_false,
        hint: "the chat template's text is encoded without adding special tokens: leave it out",
    },
    Refused {
        field: "echo",
        only: Some(Endpoint::Chat),
        neutral: is_false,
        hint: "echo is supported on POST /v1/completions only",
    },
    Refused {
        field: "modalities",
        only: Some(Endpoint::Chat),
        neutral: text_only,
        hint: "only text answers are generated: leave it out",
    },
    Refused {
        field: "audio",
        only: Some(Endpoint::Chat),
        neutral: never,
        hint: "only text answers are generated: leave it out",
    },
];

/// The first field of `body` that `endpoint` refuses, as a 400 naming it.
pub fn refuse(body: &Map<String, Value>, endpoint: Endpoint) -> Result<(), Error> {
    for refused in REFUSED {
        if refused.only.is_some_and(|only| only != endpoint) {
            continue;
        }
        match body.get(refused.field) {
            None | Some(Value::Null) => {}
            Some(value) if (refused.neutral)(value, body) => {}
            Some(_) => {
                return Err(Error::invalid(
                    refused.field,
                    format!("`{}`: {}", refused.field, refused.hint),
                ));
            }
        }
    }
    Ok(())
}

/// The names of the fields `endpoint` refuses, for docs and tests.
pub fn refused_fields(endpoint: Endpoint) -> Vec<&'static str> {
    REFUSED
        .iter()
        .filter(|r| r.only.is_none_or(|only| only == endpoint))
        .map(|r| r.field)
        .collect()
}
