//! Tool calling in chat completions: answers' calls read whole and as
//! stream deltas (split anywhere), `parallel_tool_calls`, the finish
//! reason; on a server, `tools` rendered by a template that renders them
//! (the same ids as the template rendered here), refused by one that does
//! not, assistant calls and tool messages in the history, and bad calls,
//! tools and choices refused by name.

mod common;

use common::{MODEL, start, start_with_len, tokenizer};
use grpo_model::chat::{ChatMessage, ChatTemplate};
use grpo_model::tools::{Tool, ToolCall, ToolCallFormat};
use grpo_rollout::output::FinishReason;
use grpo_serving::tools::{StreamedCalls, ToolCalling, answer, finish_reason};
use serde_json::{Value, json};

const TOOLS_TEMPLATE: &str = include_str!("../../model/templates/chatml_tools.jinja");

/// Room for the tools template's prompts (about 550 tokens of this tokenizer).
const LONG: usize = 1024;

const TEXT: &str = "Let me compute.\n<tool_call>\n{\"name\": \"calculate\", \"arguments\": {\"expression\": \"2*3\"}}\n\
                    </tool_call>\n<tool_call>\n{\"name\": \"lookup\", \"arguments\": {\"word\": \"six\"}}\n</tool_call>";

fn hermes(parallel: bool) -> ToolCalling {
    ToolCalling::new(ToolCallFormat::Hermes, parallel)
}

fn arguments(call: &Value) -> Value {
    serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap()
}

#[test]
fn a_whole_answer_gives_its_calls_with_arguments_as_json_text() {
    let (content, calls) = answer(TEXT, hermes(true));
    assert_eq!(content.as_deref(), Some("Let me compute."));
    let calls = serde_json::to_value(&calls).unwrap();
    assert_eq!(calls.as_array().unwrap().len(), 2);
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("chatcmpl-tool-"));
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    assert!(calls[0].get("index").is_none(), "whole answers carry no index");
    assert_eq!(calls[0]["function"]["name"], "calculate");
    assert_eq!(arguments(&calls[0]), json!({"expression": "2*3"}));
    assert_eq!(arguments(&calls[1]), json!({"word": "six"}));

    let (_, first_only) = answer(TEXT, hermes(false));
    assert_eq!(first_only.len(), 1);
    assert_eq!(first_only[0].function.name, "calculate");

    // No call: the text exactly as written, whitespace included.
    let plain = "  six \n";
    let (content, calls) = answer(plain, hermes(true));
    assert_eq!(content.as_deref(), Some(plain));
    assert!(calls.is_empty());
    // A malformed call stays in the text, and is no call.
    let (content, calls) = answer("<tool_call>{\"name\": </tool_call>", hermes(true));
    assert!(calls.is_empty());
    assert!(content.unwrap().contains("<tool_call>"));
}

#[test]
fn streamed_deltas_split_anywhere_give_the_same_calls_and_text() {
    for size in [1, 2, 3, 7, 1000] {
        let chars: Vec<char> = TEXT.chars().collect();
        let pieces: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
        let mut stream = StreamedCalls::new(hermes(true));
        let (mut content, mut calls) = (String::new(), Vec::new());
        for (i, piece) in pieces.iter().enumerate() {
            let (text, new) = stream.push(piece, i + 1 == pieces.len());
            content.push_str(&text);
            calls.extend(new);
        }
        assert!(stream.called());
        assert_eq!(content.trim(), "Let me compute.", "pieces of {size}");
        let calls = serde_json::to_value(&calls).unwrap();
        assert_eq!(calls[0]["index"], 0);
        assert_eq!(calls[1]["index"], 1);
        assert_eq!(arguments(&calls[1]), json!({"word": "six"}));
    }
    let mut single = StreamedCalls::new(hermes(false));
    let (_, calls) = single.push(TEXT, true);
    assert_eq!(calls.len(), 1, "parallel_tool_calls false: the first call only");
}

#[test]
fn a_call_that_stopped_on_its_own_finishes_as_tool_calls() {
    assert_eq!(finish_reason(FinishReason::Stop, true), "tool_calls");
    assert_eq!(finish_reason(FinishReason::Stop, false), "stop");
    assert_eq!(finish_reason(FinishReason::Length, true), "length");
}

fn calculate() -> Value {
    json!({"type": "function", "function": {"name": "calculate", "description": "Evaluates arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}})
}

#[tokio::test(flavor = "multi_thread")]
async fn tools_and_history_calls_render_through_a_template_that_renders_them() {
    let server = start_with_len(2, LONG, |config| {
        config.chat_template = Some(TOOLS_TEMPLATE.to_string())
    })
    .await;
    let messages = json!([
        {"role": "user", "content": "What is 2*3?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "calculate", "arguments": "{\"expression\": \"2*3\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "6"},
    ]);
    let body = json!({"model": MODEL, "messages": messages, "tools": [calculate()], "max_tokens": 3,
        "temperature": 0, "return_token_ids": true});
    let (status, answer) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");

    // The same prompt as the template renders it here.
    let history = vec![
        ChatMessage::new("user", "What is 2*3?"),
        ChatMessage::new("assistant", "").with_tool_calls(vec![ToolCall {
            name: "calculate".into(),
            arguments: json!({"expression": "2*3"}).as_object().unwrap().clone(),
        }]),
        ChatMessage::new("tool", "6"),
    ];
    let tools = vec![Tool::from_json(&calculate()).unwrap()];
    let text = ChatTemplate::new(TOOLS_TEMPLATE)
        .unwrap()
        .render_with(&history, true, "", "", &tools, &serde_json::Map::new())
        .unwrap();
    assert!(text.contains("<tools>") && text.contains("<tool_response>"), "{text}");
    let expected = tokenizer().encode(&text, false).unwrap();
    assert_eq!(answer["prompt_token_ids"], json!(expected));
    let (_, tokens) = server
        .post("/tokenize", &json!({"messages": messages, "tools": [calculate()]}))
        .await;
    assert_eq!(tokens["tokens"], json!(expected), "/tokenize renders the tools too");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tools_a_template_ignores_and_bad_calls_are_refused_by_name() {
    let plain = start(2, |_| {}).await;
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "tools": [calculate()], "max_tokens": 2});
    let (status, answer) = plain.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["param"], "tools");
    assert!(
        answer["error"]["message"].as_str().unwrap().contains("--chat-template"),
        "{answer}"
    );
    plain.shutdown().await;

    let server = start_with_len(2, LONG, |config| {
        config.chat_template = Some(TOOLS_TEMPLATE.to_string())
    })
    .await;
    let with = |extra: Value| {
        let mut body =
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": [calculate()], "max_tokens": 2});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let bad_call = |arguments: Value| {
        json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "calculate", "arguments": arguments}}]}], "max_tokens": 2})
    };
    let cases = [
        (with(json!({"tools": [{"type": "function", "function": {}}]})), "tools"),
        (with(json!({"tools": [calculate(), calculate()]})), "tools"),
        (with(json!({"tool_choice": "required", "tools": []})), "tool_choice"),
        (with(json!({"tool_choice": "sometimes"})), "tool_choice"),
        (
            with(json!({"tool_choice": {"type": "function", "function": {"name": "lookup"}}})),
            "tool_choice",
        ),
        (with(json!({"tool_choice": {"type": "function"}})), "tool_choice"),
        (
            with(json!({"tool_choice": "required", "response_format": {"type": "json_object"}})),
            "tool_choice",
        ),
        (bad_call(json!("{not json")), "messages"),
        (bad_call(json!("[1, 2]")), "messages"),
    ];
    for (body, param) in cases {
        let (status, answer) = server.post("/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{body} → {answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
    }
    for choice in ["auto", "none"] {
        let (status, answer) = server
            .post("/v1/chat/completions", &with(json!({"tool_choice": choice})))
            .await;
        assert_eq!(status, 200, "{answer}");
        let choice = &answer["choices"][0];
        assert!(choice["message"]["content"].is_string(), "{answer}");
    }
    // Arguments given as an object are taken as they are.
    let (status, answer) = server
        .post("/v1/chat/completions", &bad_call(json!({"expression": "1+1"})))
        .await;
    assert_eq!(status, 200, "{answer}");
    server.shutdown().await;
}
