//! Admission under hostile load: a request over the limits on prompts,
//! samples or stop strings is a 400 naming the field; a generation request
//! beyond the concurrent limit is an OpenAI-shaped 429 with `Retry-After`
//! until a place frees; a huge request does not hold up a later small one.

mod common;

use std::time::Duration;

use common::{assert_error, start, status_json};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn requests_over_the_limits_are_refused_naming_the_field() {
    let server = start(4, |config| {
        config.limits.max_prompts = 8;
        config.limits.max_samples = 16;
    })
    .await;
    let stops: Vec<String> = (0..65).map(|i| format!("stop{i}")).collect();
    for (body, field) in [
        (json!({"prompt": "hi", "stop": stops}), "stop"),
        (json!({"prompt": "hi", "stop": ["x".repeat(9000)]}), "stop"),
        (json!({"prompt": vec!["hi"; 9]}), "prompt"),
        (json!({"prompt": vec!["hi"; 4], "n": 5}), "n"),
    ] {
        let (status, answer) = server.post("/v1/completions", &body).await;
        assert_error(status, 400, &answer);
        assert_eq!(answer["error"]["param"], field, "{answer}");
    }
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "n": 17});
    let (status, answer) = server.post("/v1/chat/completions", &chat).await;
    assert_error(status, 400, &answer);
    // A text no context can hold is refused by its length, before tokenizing.
    let huge = "word ".repeat(200_000);
    let (status, answer) = server.post("/v1/completions", &json!({"prompt": huge})).await;
    assert!(assert_error(status, 400, &answer).contains("1000000 bytes, at least"));
    let chat = json!({"messages": [{"role": "user", "content": huge}]});
    let (status, answer) = server.post("/v1/chat/completions", &chat).await;
    assert!(assert_error(status, 400, &answer).contains("bytes, at least"));
    assert_eq!(
        server
            .post(
                "/v1/completions",
                &json!({"prompt": vec!["hi"; 4], "n": 4, "max_tokens": 1})
            )
            .await
            .0,
        200
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn beyond_the_concurrent_limit_is_a_429_with_retry_after() {
    let server = std::sync::Arc::new(start(4, |config| config.limits.max_concurrent_requests = 1).await);
    let long = json!({"prompt": [5, 6, 7], "max_tokens": 40, "ignore_eos": true, "stream": true});
    let holder = server.clone();
    let first = tokio::spawn(async move { holder.stream("/v1/completions", &long).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = server
        .request(reqwest::Method::POST, "/v1/completions")
        .json(&json!({"prompt": "hi", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.headers()["retry-after"], "1");
    let (status, answer) = status_json(refused).await;
    assert!(assert_error(status, 429, &answer).contains("limit of 1 requests"));
    assert_eq!(
        server.get("/health").await.0,
        200,
        "/health is not a generation request"
    );
    assert!(
        !first.await.unwrap().is_empty(),
        "the first request streamed to its end"
    );
    let (status, _) = server
        .post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 1}))
        .await;
    assert_eq!(status, 200, "its place is free again");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_request_does_not_hold_up_a_later_small_one() {
    let server = std::sync::Arc::new(start(4, |_| {}).await);
    let huge = json!({"prompt": vec![vec![5, 6, 7]; 48], "max_tokens": 24, "ignore_eos": true});
    let holder = server.clone();
    let big = tokio::spawn(async move { holder.post("/v1/completions", &huge).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = server
        .post(
            "/v1/completions",
            &json!({"prompt": [8, 9], "max_tokens": 2, "ignore_eos": true}),
        )
        .await;
    assert_eq!(status, 200);
    assert!(
        !big.is_finished(),
        "the small request finished while the huge one still ran"
    );
    assert_eq!(big.await.unwrap().0, 200);
}
