//! Guided decoding (structured outputs): a sample's text held to a JSON
//! schema, a regular expression, a list of choices or a Lark grammar, as
//! vLLM's structured outputs hold it.
//!
//! The grammar engine is llguidance. A request's [`Guide`] is compiled once
//! when it is queued ([`Grammars::compile`]); each of its samples then runs
//! its own [`GuidedSample`], which before every decode step writes the
//! tokens the grammar allows next as a bitmask (one bit per token, 32 to a
//! word, token `t` at bit `t % 32` of word `t / 32`) and after it takes the
//! token drawn. The decode program sets the logits of disallowed tokens to
//! −∞ before drawing; once the grammar is complete only the model's EOS is
//! allowed, so a guided sample ends with `finish_reason` stop, or length
//! when `max_tokens` cuts it first.
//!
//! JSON is written compactly, as Python's `json.dumps` writes it (`", "`
//! between items, `": "` after keys, no other whitespace), so a model
//! cannot stall in whitespace.

use std::sync::Arc;

use grpo_model::tokenizer::Tokenizer;
use grpo_model::tools::{Tool, ToolCallFormat};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::Value;

use crate::error::{Error, Result};

/// What a sample's text must be.
#[derive(Debug, Clone, PartialEq)]
pub enum Guide {
    /// JSON valid under this JSON schema.
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// Text matching this regular expression (Rust `regex` syntax) whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text of this grammar, in llguidance's Lark dialect (where
    /// `%json { … }` embeds a JSON schema).
    Lark(String),
}

impl Guide {
    /// An answer of tool calls only, written as `format` writes them (the
    /// chat template family's): one call of one of `tools` — several, one
    /// after another, when `parallel` — each naming its tool and giving
    /// arguments valid under the tool's parameters. What OpenAI's
    /// `tool_choice` `required` (or, with one tool, a named function) asks.
    pub fn tool_calls(format: ToolCallFormat, tools: &[Tool], parallel: bool) -> Result<Guide, String> {
        let arguments = match format {
            ToolCallFormat::Hermes => "arguments",
            ToolCallFormat::Llama3Json => "parameters",
        };
        let calls: Vec<Value> = tools
            .iter()
            .map(|tool| {
                serde_json::json!({
                    "type": "object",
                    "properties": {"name": {"const": tool.name}, arguments: tool.parameters},
                    "required": ["name", arguments],
                    "additionalProperties": false,
                })
            })
            .collect();
        let schema = match calls.len() {
            0 => return Err("there are no tools to call".to_string()),
            1 => calls.into_iter().next().expect("one"),
            _ => serde_json::json!({"anyOf": calls}),
        };
        let call = format!("%json {}", compact(schema)?);
        let quoted = |text: &str| Value::String(text.to_string()).to_string();
        let (call, separator) = match format {
            ToolCallFormat::Hermes => (
                format!("{} {call} {}", quoted("<tool_call>\n"), quoted("\n</tool_call>")),
                quoted("\n"),
            ),
            ToolCallFormat::Llama3Json => (call, quoted("; ")),
        };
        let start = if parallel {
            format!("start: call ({separator} call)*")
        } else {
            "start: call".to_string()
        };
        Ok(Guide::Lark(format!("{start}\ncall: {call}\n")))
    }

    /// The guide of vLLM's structured-output options (`structured_outputs`
    /// in a request, the same object in grpo's config and data): exactly
    /// one of `json` (a schema, as an object or JSON text), `regex`,
    /// `choice`, `grammar` (llguidance's Lark syntax) or `json_object:
    /// true`. `disable_fallback` and `disable_any_whitespace` are accepted
    /// and change nothing (one backend; JSON is always compact); other
    /// options are refused, naming them.
    pub fn from_options(options: &Value) -> Result<Guide, String> {
        let Some(options) = options.as_object() else {
            return Err("must be an object".into());
        };
        let text = |key: &str, value: &Value| {
            value
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("{key} must be a string"))
        };
        let mut guides = Vec::new();
        for (key, value) in options {
            if value.is_null() {
                continue;
            }
            let guide = match key.as_str() {
                "json" => Guide::JsonSchema(match value {
                    Value::String(schema) => {
                        serde_json::from_str(schema).map_err(|e| format!("json: the schema is not JSON: {e}"))?
                    }
                    schema => schema.clone(),
                }),
                "regex" => Guide::Regex(text(key, value)?),
                "grammar" => Guide::Lark(text(key, value)?),
                "choice" => Guide::Choice(
                    serde_json::from_value(value.clone())
                        .map_err(|_| "choice must be a list of strings".to_string())?,
                ),
                "json_object" if value == &Value::Bool(true) => Guide::JsonObject,
                "json_object" | "disable_fallback" | "disable_any_whitespace" => continue,
                "disable_additional_properties" if value == &Value::Bool(false) => continue,
                other => {
                    return Err(format!(
                        "`{other}` is not supported: use one of json, regex, choice, grammar, json_object"
                    ));
                }
            };
            guides.push((key.clone(), guide));
        }
        match guides.len() {
            1 => Ok(guides.pop().expect("one").1),
            0 => Err("set one of json, regex, choice, grammar, json_object".into()),
            _ => Err(format!(
                "`{}` and `{}` are both set: send one",
                guides[0].0, guides[1].0
            )),
        }
    }

    /// The grammar llguidance compiles.
    fn grammar(&self) -> Result<TopLevelGrammar, String> {
        Ok(match self {
            Guide::JsonSchema(schema) => TopLevelGrammar::from_json_schema(compact(schema.clone())?),
            Guide::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))?),
            Guide::Regex(pattern) => TopLevelGrammar::from_regex(pattern),
            Guide::Choice(choices) => {
                if choices.is_empty() {
                    return Err("the list of choices is empty".to_string());
                }
                let alternatives: Vec<String> = choices.iter().map(|c| regex::escape(c)).collect();
                TopLevelGrammar::from_regex(&alternatives.join("|"))
            }
            Guide::Lark(grammar) => TopLevelGrammar::from_lark(grammar.clone()),
        })
    }
}

/// `schema` with the compact JSON layout of the module docs.
fn compact(mut schema: Value) -> Result<Value, String> {
    if schema.as_object().is_some_and(|o| o.contains_key("x-guidance")) {
        return Err("the schema's `x-guidance` key is grpo's to set: leave it out".to_string());
    }
    let options = JsonCompileOptions {
        item_separator: ", ".to_string(),
        key_separator: ": ".to_string(),
        whitespace_flexible: false,
        ..JsonCompileOptions::default()
    };
    match schema {
        Value::Object(_) => {}
        // `true` accepts any JSON value, as `{}` does; `false` nothing.
        Value::Bool(true) => schema = serde_json::json!({}),
        Value::Bool(false) => return Err("the schema `false` accepts nothing".to_string()),
        other => return Err(format!("a JSON schema must be an object or a boolean, not {other}")),
    }
    options.apply_to(&mut schema);
    Ok(schema)
}

/// The tokenizer as llguidance sees it: each token's bytes (special tokens
/// marked as llguidance marks them), and the tokenizer's own encoding.
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(bytes)
            .ok()
            .map(|text| self.tokenizer.encode(text, false))
        {
            Some(Ok(ids)) => ids,
            _ => self.trie.greedy_tokenize(bytes),
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        // Bytes that are not UTF-8 are tokenized greedily.
        false
    }
}

/// Compiles guides for one model's vocabulary. Building it reads every
/// token's bytes (about 0.15 s for a 49k vocabulary); it is made once per
/// engine, on the first guided request.
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// Grammars over a model's `vocab_size` ids (the tokenizer's tokens
    /// among them; ids without a token are never allowed), ended by `eos`.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab_size: usize, eos: &[u32]) -> Result<Grammars> {
        let failed = |what: String| Error::InvalidRequest {
            message: format!("guided decoding is not available for this model: {what}"),
        };
        let Some(&first_eos) = eos.first() else {
            return Err(failed("it has no EOS token to end a guided answer".to_string()));
        };
        let json: Value = serde_json::from_str(&tokenizer.to_json()?).map_err(|e| failed(e.to_string()))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| failed(e.to_string()))?;
        if let Some(&outside) = eos.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(failed(format!("EOS {outside} is outside the model's {vocab_size} ids")));
        }
        // Tokens the model has no logits for are never drawn: only its ids count.
        words.resize(vocab_size, Vec::new());
        let info = TokRxInfo::new(vocab_size as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(Vocabulary { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| failed(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// `guide` compiled, ready for a sample; an invalid guide is refused
    /// with llguidance's reason.
    pub fn compile(&self, guide: &Guide) -> Result<GuidedSample> {
        let invalid = |message: String| Error::InvalidGuide { message };
        let grammar = guide.grammar().map_err(invalid)?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(error) => Err(invalid(error)),
            None => Ok(GuidedSample { matcher }),
        }
    }

    /// Bitmask words per row for this vocabulary.
    pub fn words(vocab_size: usize) -> usize {
        vocab_size.div_ceil(32)
    }
}

/// One sample's place in its grammar.
pub struct GuidedSample {
    matcher: Matcher,
}

impl GuidedSample {
    /// A sample starting where this one stands, independent of it.
    pub fn fork(&self) -> GuidedSample {
        GuidedSample {
            matcher: self.matcher.deep_clone(),
        }
    }

    /// Writes the tokens allowed next into `words` (a row of
    /// [`Grammars::words`] words): the grammar's, or only EOS once it is
    /// complete.
    pub fn allowed(&mut self, words: &mut [u32]) -> Result<(), String> {
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
        let bits = mask.as_slice();
        for (i, word) in words.iter_mut().enumerate() {
            *word = bits.get(i).copied().unwrap_or(0);
        }
        Ok(())
    }

    /// Takes the token drawn; one the grammar does not allow is an error.
    pub fn advance(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }
}
