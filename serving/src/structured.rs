//! Structured outputs: the request fields that ask for a guided answer, as
//! OpenAI and vLLM name them, read into one [`Guide`] for the engine.
//!
//! - OpenAI's `response_format`: `{"type": "text"}` (no guide),
//!   `{"type": "json_object"}`, `{"type": "json_schema", "json_schema":
//!   {"name", "schema", "strict", "description"}}`;
//! - vLLM's `structured_outputs`: exactly one of `json` (a schema, as an
//!   object or JSON text), `regex`, `choice`, `grammar` (llguidance's Lark
//!   syntax) or `json_object: true`; `disable_fallback` and
//!   `disable_any_whitespace` are accepted (one backend; JSON is always
//!   written compactly), the options that would change the answer
//!   otherwise are refused;
//! - vLLM's older `guided_json`, `guided_regex`, `guided_choice`,
//!   `guided_grammar`.
//!
//! A request asking for two guides gets a 400 naming both fields.

use grpo_rollout::guided::Guide;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::protocol::common::SamplingFields;

/// The guide the request's structured-output fields ask for, if any.
pub fn requested(fields: &SamplingFields) -> Result<Option<Guide>> {
    let mut found: Vec<(&'static str, Guide)> = Vec::new();
    if let Some(format) = &fields.response_format
        && let Some(guide) = response_format(format)?
    {
        found.push(("response_format", guide));
    }
    if let Some(options) = &fields.structured_outputs {
        found.push(("structured_outputs", structured_outputs(options)?));
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
        0 | 1 => Ok(found.pop().map(|(_, guide)| guide)),
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

/// vLLM's `structured_outputs` options.
fn structured_outputs(options: &Value) -> Result<Guide> {
    let field = "structured_outputs";
    let bad = |what: String| Error::invalid(field, format!("structured_outputs: {what}"));
    let Some(options) = options.as_object() else {
        return Err(bad("must be an object".into()));
    };
    let mut guides = Vec::new();
    for (key, value) in options {
        if value.is_null() {
            continue;
        }
        let guide = match key.as_str() {
            "json" => Guide::JsonSchema(schema_value(field, value)?),
            "regex" => Guide::Regex(text(field, key, value)?),
            "grammar" => Guide::Lark(text(field, key, value)?),
            "choice" => {
                let choices: Vec<String> = serde_json::from_value(value.clone())
                    .map_err(|_| bad("choice must be a list of strings".into()))?;
                choice(field, choices)?
            }
            "json_object" if value == &Value::Bool(true) => Guide::JsonObject,
            "json_object" | "disable_fallback" | "disable_any_whitespace" => continue,
            "disable_additional_properties" if value == &Value::Bool(false) => continue,
            other => {
                return Err(bad(format!(
                    "`{other}` is not supported: use one of json, regex, choice, grammar, json_object"
                )));
            }
        };
        guides.push((key.clone(), guide));
    }
    match guides.len() {
        1 => Ok(guides.pop().expect("one").1),
        0 => Err(bad("set one of json, regex, choice, grammar, json_object".into())),
        _ => Err(bad(format!(
            "`{}` and `{}` are both set: send one",
            guides[0].0, guides[1].0
        ))),
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

/// A string option.
fn text(field: &str, key: &str, value: &Value) -> Result<String> {
    value
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| Error::invalid(field, format!("{field}: {key} must be a string")))
}

/// A choice among `choices` (at least one).
fn choice(field: &str, choices: Vec<String>) -> Result<Guide> {
    if choices.is_empty() {
        return Err(Error::invalid(field, format!("{field}: the list of choices is empty")));
    }
    Ok(Guide::Choice(choices))
}
