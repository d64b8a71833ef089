//! Load: 64 concurrent streaming requests all complete with the right
//! token counts; 16 more clients that disconnect mid-stream leave no
//! running or waiting request behind.

mod common;

use common::{events, start};
use futures::StreamExt;
use serde_json::json;

const TOKENS: usize = 8;

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_streams_complete_and_disconnects_free_their_slots() {
    let server = std::sync::Arc::new(start(16, |_| {}).await);
    let body = json!({"prompt": "load", "max_tokens": TOKENS, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
    let clients: Vec<_> = (0..64)
        .map(|i| {
            let server = server.clone();
            let mut body = body.clone();
            body["seed"] = json!(i);
            tokio::spawn(async move {
                let response = server.send("/v1/completions", &body).await;
                assert_eq!(response.status().as_u16(), 200);
                events(&response.text().await.unwrap())
            })
        })
        .collect();
    for client in clients {
        let chunks = client.await.unwrap();
        let usage = chunks.last().unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], TOKENS);
        let token_chunks = chunks
            .iter()
            .filter(|c| c["choices"].as_array().is_some_and(|c| !c.is_empty()));
        assert_eq!(token_chunks.count(), TOKENS);
    }

    let mut long = body.clone();
    long["max_tokens"] = json!(40);
    let mut open = Vec::new();
    for _ in 0..16 {
        let response = server.send("/v1/completions", &long).await;
        let mut stream = response.bytes_stream();
        stream.next().await.unwrap().unwrap();
        open.push(stream);
    }
    drop(open);
    server.wait_for_metric("vllm:num_requests_running", 0.0).await;
    server.wait_for_metric("vllm:num_requests_waiting", 0.0).await;
    let aborted = server
        .metric("vllm:request_success_total{finished_reason=\"abort\"}")
        .await;
    assert!(aborted > 0.0, "the disconnected requests were aborted");
    let (status, _) = server
        .post("/v1/completions", &json!({"prompt": "after", "max_tokens": 2}))
        .await;
    assert_eq!(status, 200);
}
