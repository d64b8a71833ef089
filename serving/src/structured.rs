//! Structured outputs: the request fields that ask for a guided answer, as
//! OpenAI and vLLM name them, read into one [`Guide`] for the engine.
//!
//! - OpenAI's `response_format`: `{"type": "text"}` (no guide),
//!   `{"type": "json_object"}`, `{"type": "json_schema", "json_schema":
//!   {"name", "schema", "strict", "description"}}`;
//! - vLLM's `structured_outputs` ([`Guide::from_options`]);
//! - vLLM's older `guided_json`, `guided_regex`, `guided_choice`,
//!   `guided_grammar`.
//!
//! A request asking for two guides gets a 400 naming both fields.

use grpo_rollout::guided::Guide;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::protocol::common::SamplingFields;

/// The guide the request's structured-output fields ask for, if any, with
/// the field that asks.
pub fn requested(fields: &SamplingFields) -> Result<Option<(&'static str, Guide)>> {
    let mut found: Vec<(&'static str, Guide)> = Vec::new();
    if let Some(format) = &fields.response_format
        && let Some(guide) = response_format(format)?
    {
        found.push(("response_format", guide));
    }
    if let Some(options) = &fields.structured_outputs {
        let guide = Guide::from_options(options)
            .map_err(|e| Error::invalid("structured_outputs", format!("structured_outputs: {e}")))?;
        found.push(("structured_outputs", guide));
    }
    if let Some(schema) = &fields.guided_json {
        found.push(("guided_json", Guide::JsonSchema(schema_value("guided_json", schema)?)));
    }
    if let Some(pattern) = &fields.guided_regex {
        found.push(("guided_regex", Guide::Regex(pattern.clone())));
    }
    if let Some(choices) = &fields.guided_choice {
        found.push(("guided_choice", choice("guided_choice", choices.clone())?));
    }
    if let Some(grammar) = &fields.guided_grammar {
        found.push(("guided_grammar", Guide::Lark(grammar.clone())));
    }
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => Err(Error::invalid(
            found[1].0,
            format!(
                "`{}` and `{}` both ask for a structured output: send one",
                found[0].0, found[1].0
            ),
        )),
    }
}

/// The guide of OpenAI's `response_format` (none for plain text).
fn response_format(format: &Value) -> Result<Option<Guide>> {
    let bad = |what: String| Error::invalid("response_format", format!("response_format: {what}"));
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Guide::JsonObject)),
        Some("json_schema") => {
            let Some(spec) = format.get("json_schema").and_then(Value::as_object) else {
                return Err(bad(
                    "type json_schema needs a `json_schema` object with the `schema`".into()
                ));
            };
            match spec.get("schema") {
                Some(schema) => Ok(Some(Guide::JsonSchema(schema_value("response_format", schema)?))),
                None => Err(bad("json_schema has no `schema`".into())),
            }
        }
        Some(other) => Err(bad(format!(
            "type {other:?} is not supported: use \"text\", \"json_object\" or \"json_schema\""
        ))),
        None => Err(bad(
            "needs a `type` (\"text\", \"json_object\" or \"json_schema\")".into()
        )),
    }
}

/// A JSON schema sent as an object (or boolean), or as JSON text.
fn schema_value(field: &str, schema: &Value) -> Result<Value> {
    match schema {
        Value::String(text) => serde_json::from_str(text)
            .map_err(|e| Error::invalid(field, format!("{field}: the schema is not JSON: {e}"))),
        Value::Object(_) | Value::Bool(_) => Ok(schema.clone()),
        other => Err(Error::invalid(
            field,
            format!("{field}: a JSON schema is an object, not {other}"),
        )),
    }
}

/// A choice among `choices` (at least one).
fn choice(field: &str, choices: Vec<String>) -> Result<Guide> {
    if choices.is_empty() {
        return Err(Error::invalid(field, format!("{field}: the list of choices is empty")));
    }
    Ok(Guide::Choice(choices))
}
