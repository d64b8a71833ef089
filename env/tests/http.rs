//! The `http` environment against a real local server: tools asked once,
//! steps that continue and end, ends delivered, and server errors, bad
//! bodies, wrong ids and a hang — each a fault naming the problem, within
//! the timeout.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use common::{Episode, fault, said, turn};
use grpo_env::config::{EnvironmentConfig, EnvironmentKind};
use grpo_env::guard::{Answer, GuardedEnvironment};
use serde_json::{Value, json};

/// What the server saw: each request's method, and the episodes ended.
#[derive(Clone, Default)]
struct Seen {
    methods: Arc<Mutex<Vec<String>>>,
    ended: Arc<Mutex<Vec<u64>>>,
}

/// Answers by the latest message: "done" ends with 0.5; "500", "garbage",
/// "wrong id", "empty" and "hang" misbehave; "auth" echoes the
/// Authorization header; anything else continues.
async fn answer(State(seen): State<Seen>, headers: HeaderMap, Json(request): Json<Value>) -> Response {
    let id = request["id"].as_u64().unwrap();
    let method = request["method"].as_str().unwrap().to_string();
    seen.methods.lock().unwrap().push(method.clone());
    match method.as_str() {
        "tools" => {
            Json(json!({"id": id, "tools": [{"type": "function", "function": {"name": "lookup"}}]})).into_response()
        }
        "end" => {
            seen.ended.lock().unwrap().push(request["episode"].as_u64().unwrap());
            Json(json!({})).into_response()
        }
        _ => {
            let messages = request["messages"].as_array().unwrap();
            let text = messages.last().unwrap()["content"].as_str().unwrap();
            match text {
                "done" => Json(json!({"id": id, "done": true, "reward": 0.5})).into_response(),
                "500" => (StatusCode::INTERNAL_SERVER_ERROR, "it broke").into_response(),
                "garbage" => "not json".into_response(),
                "wrong id" => Json(json!({"id": id + 10, "done": true})).into_response(),
                "empty" => Json(json!({"messages": []})).into_response(),
                "hang" => {
                    tokio::time::sleep(Duration::from_secs(10)).await;
                    Json(json!({"done": true})).into_response()
                }
                "auth" => {
                    let auth = headers.get("authorization").map_or("none", |v| v.to_str().unwrap());
                    Json(json!({"messages": [{"role": "user", "content": auth}]})).into_response()
                }
                _ => Json(json!({"id": id, "messages": [{"role": "user", "content":
                    format!("{} messages in episode {}, row {}", messages.len(), request["episode"], request["row"])}]}))
                .into_response(),
            }
        }
    }
}

/// A server on a free local port, and what it sees.
async fn serve() -> (SocketAddr, Seen) {
    let seen = Seen::default();
    let app = axum::Router::new()
        .route("/env", axum::routing::post(answer))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (address, seen)
}

fn environment(address: SocketAddr, keys: EnvironmentConfig) -> GuardedEnvironment {
    EnvironmentConfig {
        kind: EnvironmentKind::Http,
        url: Some(format!("http://{address}/env")),
        ..keys
    }
    .build(Path::new("."))
    .unwrap()
}

// Building blocks its thread while the tools are asked: the server needs another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_asked_once_steps_continue_and_end_and_ends_are_sent() {
    let (address, seen) = serve().await;
    let environment = environment(address, EnvironmentConfig::default());
    assert_eq!(environment.name(), format!("http://{address}/env"));
    assert_eq!(environment.tools()[0].name, "lookup");
    let mut episode = Episode::new(json!({"secret": 9}));
    assert_eq!(
        said(&turn(&environment, &mut episode, "hello").await),
        ["user: 2 messages in episode 7, row {\"secret\":9}"]
    );
    assert_eq!(
        turn(&environment, &mut episode, "done").await,
        Answer::Done { reward: Some(0.5) }
    );
    environment.end(7).await;
    assert_eq!(*seen.ended.lock().unwrap(), [7]);
    assert_eq!(*seen.methods.lock().unwrap(), ["tools", "step", "step", "end"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_answers_and_a_hang_are_faults_naming_the_problem() {
    let (address, _) = serve().await;
    let environment = environment(
        address,
        EnvironmentConfig {
            timeout_s: 0.5,
            ..EnvironmentConfig::default()
        },
    );
    for (text, want) in [
        ("500", "answered 500 Internal Server Error: it broke"),
        ("garbage", "the body is not JSON"),
        ("wrong id", "answer to request 13 while waiting for 3"),
        ("empty", "`messages` is empty"),
        ("hang", "timed out after 0.5 s"),
    ] {
        let start = Instant::now();
        let answer = turn(&environment, &mut Episode::new(json!({})), text).await;
        assert!(fault(&answer).contains(want), "{text}: {}", fault(&answer));
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "{text}: {:?}",
            start.elapsed()
        );
    }
    let metrics = environment.metrics();
    assert_eq!((metrics.calls, metrics.faults, metrics.timeouts), (5, 5, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bearer_token_comes_from_the_named_variable() {
    let (address, _) = serve().await;
    let environment = environment(
        address,
        EnvironmentConfig {
            bearer_token_env: Some("PATH".into()),
            ..EnvironmentConfig::default()
        },
    );
    let path = std::env::var("PATH").unwrap();
    assert_eq!(
        said(&turn(&environment, &mut Episode::new(json!({})), "auth").await),
        [format!("user: Bearer {path}")]
    );
}

#[test]
fn a_server_that_is_not_there_fails_the_build_naming_it() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let config = EnvironmentConfig {
        kind: EnvironmentKind::Http,
        url: Some(format!("http://{address}/env")),
        timeout_s: 2.0,
        ..EnvironmentConfig::default()
    };
    let message = config.build(Path::new(".")).err().unwrap().to_string();
    assert!(
        message.starts_with(&format!("environment http://{address}/env did not start: ")),
        "{message}"
    );
}
