//! Bad input gets the right status and `{"error": {message, type, param,
//! code}}`, never a panic or a dropped connection, and the server keeps
//! serving: malformed JSON, wrong types, missing fields, negative or huge
//! values, an unknown model, an over-long prompt, an oversized body, a
//! missing or wrong API key, an unknown route, a field grpo does not
//! implement. Fields unknown to both APIs are ignored.

mod common;

use common::{MAX_MODEL_LEN, MODEL, TestServer, assert_error, start, status_json};
use grpo_serving::auth::ApiKey;
use grpo_serving::unsupported::{Endpoint, refused_fields};
use serde_json::{Value, json};

const KEY: &str = "sk-test-key";
const BODY_LIMIT: usize = 16 << 10;

async fn server() -> TestServer {
    let mut server = start(4, |config| {
        config.api_key = Some(ApiKey::new(KEY));
        config.max_body_bytes = BODY_LIMIT;
    })
    .await;
    server.key = Some(KEY.to_string());
    server
}

async fn still_serves(server: &TestServer) {
    let (status, answer) = server
        .post("/v1/completions", &json!({"prompt": "ok", "max_tokens": 2}))
        .await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_bodies_get_400s_naming_the_field() {
    let server = server().await;
    let completion = |extra: Value| {
        let mut body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let cases: Vec<(Value, Option<&str>)> = vec![
        (completion(json!({"n": "two"})), Some("n")),
        (completion(json!({"n": 0})), Some("n")),
        (completion(json!({"max_tokens": -1})), Some("max_tokens")),
        (
            completion(json!({"max_tokens": 1_000_000_000_000i64})),
            Some("max_tokens"),
        ),
        (completion(json!({"temperature": -1})), Some("temperature")),
        (completion(json!({"top_p": 2})), Some("top_p")),
        (completion(json!({"top_k": -5})), Some("top_k")),
        (completion(json!({"min_p": 1.5})), Some("min_p")),
        (completion(json!({"presence_penalty": 3})), Some("presence_penalty")),
        (completion(json!({"repetition_penalty": 0})), Some("repetition_penalty")),
        (completion(json!({"seed": -5})), Some("seed")),
        (completion(json!({"logprobs": 21})), Some("logprobs")),
        (completion(json!({"stop": [""]})), Some("stop")),
        (completion(json!({"stop": 7})), Some("stop")),
        (completion(json!({"stream": "yes"})), Some("stream")),
        (completion(json!({"prompt": []})), Some("prompt")),
        (completion(json!({"prompt": [[1, 2], []]})), Some("prompt")),
        (completion(json!({"prompt": [99999999]})), None),
        (completion(json!({"prompt": [-3]})), Some("prompt")),
        (completion(json!({"n": 5})), None),
        (json!({"model": MODEL}), None),
    ];
    for (body, param) in cases {
        let (status, answer) = server.post("/v1/completions", &body).await;
        assert_error(status, 400, &answer);
        if let Some(param) = param {
            assert_eq!(
                answer["error"]["param"].as_str().map(|p| p.split('.').next().unwrap()),
                Some(param),
                "{body} → {answer}"
            );
            assert!(answer["error"]["message"].as_str().unwrap().contains(param), "{answer}");
        }
    }
    let chats = [
        json!({"model": MODEL}),
        json!({"messages": []}),
        json!({"messages": "hi"}),
        json!({"messages": [{"role": "user"}], "max_completion_tokens": 0}),
        json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
        json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 3}),
    ];
    for body in chats {
        let (status, answer) = server.post("/v1/chat/completions", &body).await;
        assert_error(status, 400, &answer);
    }
    let with_kwargs = json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 2,
        "chat_template_kwargs": {"enable_thinking": false}});
    let (status, answer) = server.post("/v1/chat/completions", &with_kwargs).await;
    assert_eq!(status, 200, "chat_template_kwargs reach the template: {answer}");
    let (status, answer) = server.post("/detokenize", &json!({"tokens": [1, "a"]})).await;
    assert_error(status, 400, &answer);
    still_serves(&server).await;
    server.shutdown().await;
}

/// A value of `field` that would change the answer (not its neutral value).
fn changing(field: &str) -> Value {
    match field {
        "spaces_between_special_tokens" => json!(false),
        "use_beam_search" | "return_tokens_as_token_ids" | "add_special_tokens" | "echo" => json!(true),
        "best_of" => json!(3),
        "function_call" => json!("auto"),
        "modalities" => json!(["text", "audio"]),
        "logit_bias" => json!({"17": 100}),
        "suffix" => json!(" and so on"),
        "tools" | "functions" => json!([{"type": "function", "function": {"name": "f"}}]),
        _ => json!(["x"]),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn fields_that_would_change_the_answer_are_refused_by_name_unless_neutral() {
    let server = server().await;
    let completion = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2});
    let chat = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let endpoints = [
        ("/v1/completions", Endpoint::Completions, completion),
        ("/v1/chat/completions", Endpoint::Chat, chat),
    ];
    for (route, endpoint, base) in &endpoints {
        let fields = refused_fields(*endpoint);
        assert!(
            fields.contains(&"logit_bias") && fields.contains(&"guided_whitespace_pattern"),
            "{fields:?}"
        );
        for field in fields {
            let mut body = base.clone();
            body[field] = changing(field);
            let (status, answer) = server.post(route, &body).await;
            assert_error(status, 400, &answer);
            assert_eq!(answer["error"]["param"], field, "{route} {body} → {answer}");
            assert!(answer["error"]["message"].as_str().unwrap().contains(field), "{answer}");
        }
    }
    // Neutral values, and fields of the other endpoint or of neither API, change nothing.
    let neutral_completion = json!({"prompt": "hi", "max_tokens": 2, "logit_bias": {}, "best_of": 2, "n": 2,
        "response_format": {"type": "text"}, "bad_words": [], "use_beam_search": false, "suffix": "",
        "spaces_between_special_tokens": true, "guided_json": null, "tools": [{"type": "function"}],
        "no_such_field": 1});
    let (status, answer) = server.post("/v1/completions", &neutral_completion).await;
    assert_eq!(status, 200, "{answer}");
    let neutral_chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "tools": [],
        "tool_choice": "none", "echo": false, "add_special_tokens": false, "modalities": ["text"],
        "parallel_tool_calls": true, "suffix": "x", "metadata": {"a": "b"}});
    let (status, answer) = server.post("/v1/chat/completions", &neutral_chat).await;
    assert_eq!(status, 200, "{answer}");
    still_serves(&server).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_oversized_unknown_and_unauthorized_requests() {
    let server = server().await;
    let raw = |body: &'static str| {
        server
            .request(reqwest::Method::POST, "/v1/completions")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for body in [
        "{\"prompt\": ",
        "not json",
        "",
        "[1, 2]",
        "{\"prompt\": \"a\"} trailing",
    ] {
        let (status, answer) = status_json(raw(body).await.unwrap()).await;
        assert_error(status, 400, &answer);
    }

    let (status, answer) = server
        .post("/v1/completions", &json!({"model": "gpt-9", "prompt": "hi"}))
        .await;
    assert!(assert_error(status, 404, &answer).contains("gpt-9"));

    let long: Vec<u32> = (0..MAX_MODEL_LEN as u32 + 10).collect();
    let (status, answer) = server
        .post("/v1/completions", &json!({"prompt": long, "max_tokens": 1}))
        .await;
    let message = assert_error(status, 400, &answer);
    assert!(
        message.contains(&(MAX_MODEL_LEN + 10).to_string()) && message.contains(&MAX_MODEL_LEN.to_string()),
        "{message}"
    );

    let big = json!({"prompt": "x".repeat(BODY_LIMIT * 2)});
    let (status, answer) = server.post("/v1/completions", &big).await;
    assert_error(status, 413, &answer);

    let (status, answer) = server.post("/v1/no/such/route", &json!({})).await;
    assert_error(status, 404, &answer);
    let (status, answer) = status_json(
        server
            .request(reqwest::Method::GET, "/v1/completions")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert!(assert_error(status, 405, &answer).contains("GET is not allowed on /v1/completions"));

    // A body declared as another media type is a 415; JSON types with
    // parameters, `+json` types and no Content-Type at all are read as JSON.
    let body = json!({"prompt": "hi", "max_tokens": 1}).to_string();
    for (content_type, expected) in [
        (Some("application/x-www-form-urlencoded"), 415),
        (Some("text/plain"), 415),
        (Some("multipart/form-data; boundary=x"), 415),
        (Some("application/json; charset=utf-8"), 200),
        (Some("Application/JSON"), 200),
        (Some("application/vnd.api+json"), 200),
        (None, 200),
    ] {
        let mut request = server
            .request(reqwest::Method::POST, "/v1/completions")
            .body(body.clone());
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let (status, answer) = status_json(request.send().await.unwrap()).await;
        if expected == 415 {
            let message = assert_error(status, 415, &answer);
            assert!(
                message.contains(content_type.unwrap()) && message.contains("application/json"),
                "{message}"
            );
        } else {
            assert_eq!(status, 200, "{content_type:?}: {answer}");
        }
    }

    let unknown = json!({"prompt": "hi", "max_tokens": 2, "no_such_field": [1, 2, 3], "suffix": null});
    assert_eq!(server.post("/v1/completions", &unknown).await.0, 200);

    let anonymous = reqwest::Client::new();
    let url = format!("{}/v1/completions", server.base);
    let body = json!({"prompt": "hi", "max_tokens": 2});
    for key in [None, Some("wrong"), Some("sk-test-ke")] {
        let mut request = anonymous.post(&url).json(&body);
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        let (status, answer) = status_json(request.send().await.unwrap()).await;
        assert_error(status, 401, &answer);
    }
    let health = anonymous.get(format!("{}/health", server.base)).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 200, "/health needs no key");
    still_serves(&server).await;
    server.shutdown().await;
}
