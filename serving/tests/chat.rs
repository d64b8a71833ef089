//! `/v1/chat/completions` and the info routes on the tiny fixture model
//! (ChatML template): the response shape, the default `max_tokens` (the
//! rest of the context), streaming with role chunks, chat log-probs and
//! usage; `/tokenize` of messages (and `continue_final_message`),
//! `/detokenize`, `/v1/models`, `/health`, `/version`, `/metrics`; a
//! server's own chat template (`--chat-template`) replacing the tokenizer's.

mod common;

use common::{MAX_MODEL_LEN, MODEL, start, tokenizer};
use serde_json::json;

fn conversation() -> serde_json::Value {
    json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_answers_with_the_rest_of_the_context_by_default() {
    let server = start(4, |_| {}).await;
    let (_, tokens) = server.post("/tokenize", &json!({"messages": conversation()})).await;
    let prompt_len = tokens["count"].as_u64().unwrap() as usize;
    let body = json!({"model": MODEL, "messages": conversation(), "temperature": 0, "ignore_eos": true});
    let (status, answer) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(answer["object"], "chat.completion");
    let choice = &answer["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(answer["usage"]["prompt_tokens"], prompt_len);
    assert_eq!(answer["usage"]["completion_tokens"], MAX_MODEL_LEN - prompt_len);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn chat_streams_role_chunks_logprobs_and_usage() {
    let server = start(4, |_| {}).await;
    let body = json!({
        "messages": conversation(), "max_completion_tokens": 4, "n": 2, "temperature": 0.8, "seed": 9,
        "ignore_eos": true, "logprobs": true, "top_logprobs": 2,
        "stream": true, "stream_options": {"include_usage": true},
    });
    let chunks = server.stream("/v1/chat/completions", &body).await;
    for (index, chunk) in chunks[..2].iter().enumerate() {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["choices"][0]["index"], index);
        assert_eq!(
            chunk["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
    }
    let usage = chunks.last().unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 8);
    let mut tokens = [0; 2];
    for chunk in &chunks[2..chunks.len() - 1] {
        let choice = &chunk["choices"][0];
        let entries = choice["logprobs"]["content"].as_array().unwrap();
        for entry in entries {
            assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
            assert!(entry["bytes"].is_array());
            assert_eq!(entry["top_logprobs"].as_array().unwrap().len(), 2);
        }
        tokens[choice["index"].as_u64().unwrap() as usize] += entries.len();
    }
    assert_eq!(tokens, [4, 4]);

    let whole = json!({"messages": conversation(), "max_tokens": 3, "logprobs": true, "temperature": 0});
    let (_, answer) = server.post("/v1/chat/completions", &whole).await;
    assert_eq!(
        answer["choices"][0]["logprobs"]["content"].as_array().unwrap().len(),
        answer["usage"]["completion_tokens"].as_u64().unwrap() as usize
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tokenize_detokenize_and_info_routes() {
    let server = start(4, |_| {}).await;
    let (status, tokens) = server
        .post(
            "/tokenize",
            &json!({"prompt": "hello there", "return_token_strs": true}),
        )
        .await;
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(tokens["max_model_len"], MAX_MODEL_LEN);
    assert_eq!(tokens["count"], tokens["tokens"].as_array().unwrap().len());
    assert_eq!(
        tokens["token_strs"].as_array().unwrap().len(),
        tokens["tokens"].as_array().unwrap().len()
    );
    let (_, text) = server.post("/detokenize", &json!({"tokens": tokens["tokens"]})).await;
    assert_eq!(text["prompt"], "hello there");

    let open = json!({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}], "add_generation_prompt": false, "continue_final_message": true});
    let (_, open) = server.post("/tokenize", &open).await;
    let (_, text) = server.post("/detokenize", &json!({"tokens": open["tokens"]})).await;
    assert!(text["prompt"].as_str().unwrap().ends_with("assistant\nHel"), "{text}");

    let (status, models) = server.get("/v1/models").await;
    assert_eq!(status, 200);
    let models: serde_json::Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["max_model_len"], MAX_MODEL_LEN);
    assert_eq!(server.get("/health").await.0, 200);
    let (_, version) = server.get("/version").await;
    assert!(version.contains("version"));

    server
        .post(
            "/v1/completions",
            &json!({"prompt": "count me", "max_tokens": 3, "ignore_eos": true}),
        )
        .await;
    let (_, metrics) = server.get("/metrics").await;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_sum",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ] {
        assert!(
            metrics.contains(&format!("\n{name}{{")),
            "{name} missing from\n{metrics}"
        );
    }
    assert_eq!(server.metric("vllm:generation_tokens_total").await, 3.0);
    assert_eq!(
        server
            .metric("vllm:request_success_total{finished_reason=\"length\"}")
            .await,
        1.0
    );
    assert_eq!(server.metric("vllm:e2e_request_latency_seconds_count").await, 1.0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_metrics_page_reads_back_with_prometheus_own_parser() {
    // A served name that needs every escape of a label value.
    let name = "tiny \"quoted\" \\ and\nsecond line";
    let server = start(2, |config| config.served_model_name = name.to_string()).await;
    for max_tokens in [3, 5] {
        server
            .post(
                "/v1/completions",
                &json!({"prompt": "count me", "max_tokens": max_tokens, "ignore_eos": true}),
            )
            .await;
    }
    let samples = common::parsed_metrics(&server).await;
    for sample in &samples {
        assert_eq!(sample.labels["model_name"], name, "{sample:?}");
    }
    let kind = |family: &str| {
        samples
            .iter()
            .find(|s| s.family == family)
            .unwrap_or_else(|| panic!("no {family}"))
            .kind
            .clone()
    };
    for (family, expected) in [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:generation_tokens", "counter"),
        ("vllm:prefix_cache_queries", "counter"),
        ("vllm:request_success", "counter"),
        ("vllm:e2e_request_latency_seconds", "histogram"),
        ("grpo_engine_weights_version", "gauge"),
    ] {
        assert_eq!(kind(family), expected, "{family}");
    }
    let value = |name: &str, labels: &[(&str, &str)]| common::prometheus_page::value(&samples, name, labels);
    assert_eq!(value("vllm:generation_tokens_total", &[]), 8.0);
    assert_eq!(value("grpo_engine_generated_tokens_total", &[]), 8.0);
    assert_eq!(
        value("vllm:request_success_total", &[("finished_reason", "length")]),
        2.0
    );
    assert_eq!(value("vllm:request_success_total", &[("finished_reason", "stop")]), 0.0);
    assert_eq!(value("vllm:e2e_request_latency_seconds_count", &[]), 2.0);
    assert_eq!(value("vllm:e2e_request_latency_seconds_bucket", &[("le", "+Inf")]), 2.0);
    // Two samples: a first token each, then 2 + 4 gaps between tokens.
    assert_eq!(value("vllm:time_to_first_token_seconds_count", &[]), 2.0);
    assert_eq!(value("vllm:inter_token_latency_seconds_count", &[]), 6.0);
    assert_eq!(value("vllm:num_requests_running", &[]), 0.0);
    assert_eq!(value("grpo_engine_slots", &[]), 2.0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_configured_chat_template_replaces_the_tokenizers() {
    let template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}\
                    {% if add_generation_prompt %}<assistant>{% endif %}";
    let server = start(2, |config| config.chat_template = Some(template.to_string())).await;
    let messages = json!([{"role": "user", "content": "hi"}]);
    let (status, tokens) = server.post("/tokenize", &json!({"messages": messages})).await;
    assert_eq!(status, 200, "{tokens}");
    let expected = tokenizer().encode("<user>hi<assistant>", false).unwrap();
    assert_eq!(tokens["tokens"], json!(expected));
    let body = json!({"messages": messages, "max_tokens": 3, "temperature": 0, "return_token_ids": true});
    let (status, answer) = server.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["prompt_token_ids"], json!(expected));
    server.shutdown().await;
}
