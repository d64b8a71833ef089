//! `/v1/completions` over HTTP on the tiny fixture model: text, texts and
//! token-id prompts, `n` and choice indices, usage, token ids, legacy
//! log-probs, echo, seed reproducibility, and streaming (chunks per token,
//! the same text as without streaming, the usage chunk, `[DONE]`).

mod common;

use common::{MODEL, start};
use serde_json::{Value, json};

fn greedy(prompt: Value, max_tokens: usize) -> Value {
    json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true})
}

#[tokio::test(flavor = "multi_thread")]
async fn completion_has_text_usage_and_token_ids() {
    let server = start(4, |_| {}).await;
    let mut body = greedy(json!("hello world"), 5);
    body["return_token_ids"] = json!(true);
    let (status, answer) = server.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(answer["object"], "text_completion");
    assert_eq!(answer["model"], MODEL);
    let choice = &answer["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["finish_reason"], "length");
    assert!(choice["text"].is_string());
    assert_eq!(choice["token_ids"].as_array().unwrap().len(), 5);
    let prompt_len = choice["prompt_token_ids"].as_array().unwrap().len();
    assert!(prompt_len > 0);
    assert_eq!(
        answer["usage"],
        json!({"prompt_tokens": prompt_len, "completion_tokens": 5, "total_tokens": prompt_len + 5})
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn prompts_times_n_choices_are_indexed_prompt_major() {
    let server = start(4, |_| {}).await;
    for prompt in [json!(["one", "two"]), json!([[5, 6, 7], [8, 9]])] {
        let mut body = greedy(prompt, 3);
        body["n"] = json!(2);
        body["temperature"] = json!(1.0);
        body["seed"] = json!(3);
        body["return_token_ids"] = json!(true);
        let (status, answer) = server.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{answer}");
        let choices = answer["choices"].as_array().unwrap();
        let indices: Vec<u64> = choices.iter().map(|c| c["index"].as_u64().unwrap()).collect();
        assert_eq!(indices, [0, 1, 2, 3]);
        assert_eq!(choices[0]["prompt_token_ids"], choices[1]["prompt_token_ids"]);
        assert_ne!(choices[1]["prompt_token_ids"], choices[2]["prompt_token_ids"]);
        assert_eq!(answer["usage"]["completion_tokens"], 12);
    }
    let (_, answer) = server.post("/v1/completions", &greedy(json!([5, 6, 7]), 2)).await;
    assert_eq!(answer["usage"]["prompt_tokens"], 3);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_seed_reproduces_its_samples() {
    let server = start(4, |_| {}).await;
    let body = json!({"prompt": "seeded", "max_tokens": 8, "temperature": 1.0, "seed": 1234, "ignore_eos": true, "return_token_ids": true, "n": 2});
    let (_, first) = server.post("/v1/completions", &body).await;
    let (_, second) = server.post("/v1/completions", &body).await;
    let ids = |a: &Value| {
        a["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["token_ids"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&first), ids(&second));
    assert_ne!(
        ids(&first)[0],
        ids(&first)[1],
        "the samples of a request draw different tokens"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn logprobs_come_in_the_legacy_shape_and_echo_prepends_the_prompt() {
    let server = start(4, |_| {}).await;
    let mut body = greedy(json!("log probs"), 4);
    body["logprobs"] = json!(3);
    let (status, answer) = server.post("/v1/completions", &body).await;
    assert_eq!(status, 200, "{answer}");
    let logprobs = &answer["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"].as_array().unwrap().len(), 4);
    let values = logprobs["token_logprobs"].as_array().unwrap();
    assert!(values.iter().all(|v| v.as_f64().unwrap() <= 0.0));
    let tops = logprobs["top_logprobs"].as_array().unwrap();
    assert!(tops.iter().all(|t| (1..=3).contains(&t.as_object().unwrap().len())));
    let offsets: Vec<u64> = logprobs["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]));

    let mut echo = greedy(json!("echo me"), 3);
    echo["echo"] = json!(true);
    let (_, answer) = server.post("/v1/completions", &echo).await;
    let (_, plain) = server.post("/v1/completions", &greedy(json!("echo me"), 3)).await;
    let text = answer["choices"][0]["text"].as_str().unwrap();
    assert_eq!(
        text,
        format!("echo me{}", plain["choices"][0]["text"].as_str().unwrap())
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_matches_the_whole_answer_and_ends_with_usage() {
    let server = start(4, |_| {}).await;
    let mut body = greedy(json!(["stream one", "stream two"]), 6);
    let (_, whole) = server.post("/v1/completions", &body).await;
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body["logprobs"] = json!(1);
    let chunks = server.stream("/v1/completions", &body).await;
    let (usage, chunks) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], whole["usage"]);
    let mut texts = vec![String::new(); 2];
    let mut tokens = [0; 2];
    let mut finish = vec![Value::Null; 2];
    for chunk in chunks {
        assert_eq!(chunk["id"], chunks[0]["id"]);
        assert!(chunk["usage"].is_null());
        let choice = &chunk["choices"][0];
        let index = choice["index"].as_u64().unwrap() as usize;
        texts[index].push_str(choice["text"].as_str().unwrap());
        tokens[index] += choice["logprobs"]["tokens"].as_array().unwrap().len();
        if !choice["finish_reason"].is_null() {
            finish[index] = choice["finish_reason"].clone();
        }
    }
    assert_eq!(tokens, [6, 6]);
    assert_eq!(finish, [json!("length"), json!("length")]);
    for (index, text) in texts.iter().enumerate() {
        assert_eq!(text, whole["choices"][index]["text"].as_str().unwrap());
    }
    body["stream_options"] = json!({"include_usage": false});
    let chunks = server.stream("/v1/completions", &body).await;
    assert!(
        chunks
            .iter()
            .all(|c| c["usage"].is_null() && c["choices"].as_array().unwrap().len() == 1)
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_strings_and_stop_tokens_end_samples_with_their_reason() {
    let server = start(4, |_| {}).await;
    let mut body = greedy(json!("stop here"), 8);
    body["return_token_ids"] = json!(true);
    let (_, whole) = server.post("/v1/completions", &body).await;
    let text = whole["choices"][0]["text"].as_str().unwrap().to_string();
    let ids = whole["choices"][0]["token_ids"].as_array().unwrap().clone();

    let stop: String = text.chars().skip(text.chars().count() / 2).take(1).collect();
    assert!(!stop.is_empty(), "the greedy text {text:?} has characters");
    body["stop"] = json!(stop);
    let (_, cut) = server.post("/v1/completions", &body).await;
    let choice = &cut["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["stop_reason"], json!(stop));
    assert_eq!(choice["text"].as_str().unwrap(), &text[..text.find(&stop).unwrap()]);

    body.as_object_mut().unwrap().remove("stop");
    body["stop_token_ids"] = json!([ids[2]]);
    let (_, cut) = server.post("/v1/completions", &body).await;
    let choice = &cut["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["stop_reason"], ids[2]);
    let first = ids.iter().position(|id| *id == ids[2]).unwrap();
    assert_eq!(choice["token_ids"].as_array().unwrap()[..], ids[..=first]);
    server.shutdown().await;
}
