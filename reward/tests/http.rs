//! The `http` plug-in against a local server that answers correctly,
//! slowly (past the timeout), with 500s (always, and once then fine), with
//! malformed, over-long and wrong-length bodies, and behind a bearer token.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use grpo_reward::{Registry, RewardPool, RewardsConfig, Sample, Total};
use serde_json::{Value, json};

fn batch(completions: &[&str]) -> Vec<Sample> {
    completions
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let row = json!({"prompt": "2+2?", "completion": c, "answer": "4"});
            Sample::from_row(i as u64, row.as_object().unwrap().clone()).unwrap()
        })
        .collect()
}

fn right(body: &Value) -> Value {
    let samples = body["samples"].as_array().unwrap();
    json!({"scores": samples.iter().map(|s| if s["completion"] == s["row"]["answer"] { 1.0 } else { 0.0 }).collect::<Vec<_>>()})
}

/// Starts the test server; returns its base URL and the count of requests to `/flaky` and `/down`.
async fn server() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/ok", post(|Json(body): Json<Value>| async move { Json(right(&body)) }))
        .route("/list", post(|| async { Json(json!([1.0, null])) }))
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                Json(json!([]))
            }),
        )
        .route(
            "/down",
            post(|State(hits): State<Arc<AtomicUsize>>| async move {
                hits.fetch_add(1, Ordering::SeqCst);
                StatusCode::INTERNAL_SERVER_ERROR
            }),
        )
        .route(
            "/flaky",
            post(
                |State(hits): State<Arc<AtomicUsize>>, Json(body): Json<Value>| async move {
                    match hits.fetch_add(1, Ordering::SeqCst) {
                        0 => Err(StatusCode::INTERNAL_SERVER_ERROR),
                        _ => Ok(Json(right(&body))),
                    }
                },
            ),
        )
        .route("/garbage", post(|| async { "<html>oops</html>" }))
        .route("/huge", post(|| async { vec![b' '; (64 << 20) + 1] }))
        .route("/short", post(|| async { Json(json!({"scores": [1.0]})) }))
        .route("/nan", post(|| async { Json(json!({"scores": ["nan", 1.0]})) }))
        .route(
            "/auth",
            post(|headers: HeaderMap, Json(body): Json<Value>| async move {
                match headers.get("authorization").and_then(|v| v.to_str().ok()) {
                    Some("Bearer grpo-reward") => Ok(Json(right(&body))),
                    _ => Err(StatusCode::UNAUTHORIZED),
                }
            }),
        )
        .with_state(hits.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, hits)
}

fn pool(url: &str, keys: &str) -> RewardPool {
    let text = format!(
        "[[reward]]\ntype = \"http\"\nurl = \"{url}\"\ntimeout_s = 1.0\nattempt_timeout_s = 0.5\nbackoff_s = 0.05\n{keys}"
    );
    RewardsConfig::from_toml_str(&text)
        .unwrap()
        .build(&Registry::default())
        .unwrap()
}

fn values(totals: &[Total]) -> Vec<Option<f32>> {
    totals.iter().map(|t| t.reward).collect()
}

#[tokio::test]
async fn correct_answers_score_in_both_body_shapes() {
    let (url, _) = server().await;
    assert_eq!(
        values(&pool(&format!("{url}/ok"), "").score(&batch(&["4", "5"])).await.unwrap()),
        [Some(1.0), Some(0.0)]
    );
    assert_eq!(
        values(
            &pool(&format!("{url}/list"), "")
                .score(&batch(&["4", "5"]))
                .await
                .unwrap()
        ),
        [Some(1.0), None]
    );
}

#[tokio::test]
async fn a_slow_server_times_out_within_the_timeout() {
    let (url, _) = server().await;
    let pool = pool(&format!("{url}/slow"), "on_error = -1");
    let start = Instant::now();
    assert_eq!(values(&pool.score(&batch(&["4"])).await.unwrap()), [Some(-1.0)]);
    assert!(start.elapsed() < Duration::from_millis(1500), "{:?}", start.elapsed());
    assert_eq!(pool.metrics()[0].1.timeouts, 1);
}

#[tokio::test]
async fn server_errors_are_retried_then_handled() {
    let (url, hits) = server().await;
    let down = pool(&format!("{url}/down"), "retries = 2\non_error = 0.0");
    assert_eq!(values(&down.score(&batch(&["4"])).await.unwrap()), [Some(0.0)]);
    assert_eq!(hits.swap(0, Ordering::SeqCst), 3, "one try and two retries");
    assert_eq!(down.metrics()[0].1.errors, 1);

    let flaky = pool(&format!("{url}/flaky"), "retries = 2");
    assert_eq!(
        values(&flaky.score(&batch(&["4"])).await.unwrap()),
        [Some(1.0)],
        "the retry succeeds"
    );
}

#[tokio::test]
async fn malformed_and_wrong_length_bodies_are_bad_outputs() {
    let (url, _) = server().await;
    for route in ["garbage", "short", "huge"] {
        let pool = pool(&format!("{url}/{route}"), "on_error = -2");
        assert_eq!(
            values(&pool.score(&batch(&["4", "4"])).await.unwrap()),
            [Some(-2.0), Some(-2.0)],
            "{route}"
        );
        assert_eq!(pool.metrics()[0].1.bad_outputs, 1, "{route}");
    }
    let huge = pool(&format!("{url}/huge"), "on_error = \"fail\"");
    let message = huge.score(&batch(&["4"])).await.unwrap_err().to_string();
    assert!(
        message.contains("an answer over 67108864 bytes"),
        "read no further: {message}"
    );
    let nan = pool(&format!("{url}/nan"), "on_error = -3");
    assert_eq!(
        values(&nan.score(&batch(&["4", "4"])).await.unwrap()),
        [Some(-3.0), Some(1.0)],
        "per sample"
    );
    assert_eq!(nan.metrics()[0].1.non_finite, 1);
}

#[tokio::test]
async fn a_bearer_token_is_sent_from_the_environment() {
    let (url, _) = server().await;
    // Cargo sets CARGO_PKG_NAME for test runs, so no test has to change the environment.
    let authed = pool(&format!("{url}/auth"), "bearer_token_env = \"CARGO_PKG_NAME\"");
    assert_eq!(values(&authed.score(&batch(&["4"])).await.unwrap()), [Some(1.0)]);
    let anonymous = pool(&format!("{url}/auth"), "on_error = \"fail\"");
    let message = anonymous.score(&batch(&["4"])).await.unwrap_err().to_string();
    assert!(message.contains("401"), "{message}");
}
