//! The RL control routes and shutdown: pause (keep, abort) and resume,
//! `/is_paused`; `/update_weights_from_disk` swaps in a checkpoint (the
//! output changes, and going back restores it) and refuses one that does
//! not fit, keeping the old weights, and reads only regular files inside
//! the folder; the routes that change the server are off unless enabled or
//! behind a key; a shutdown aborts what still runs after the grace period
//! and the server returns.

mod common;

use std::time::Duration;

use common::{model_dir, start, write_model};
use grpo_model::config::Family;
use grpo_model::weights::{HostTensor, Safetensors, WeightSource, save_safetensors};
use serde_json::json;

/// A checkpoint folder of the served model's weights, edited by `edit`.
fn checkpoint(edit: impl Fn(&str, &mut HostTensor)) -> tempfile::TempDir {
    let source = Safetensors::open_dir(model_dir()).unwrap();
    let tensors = source
        .names()
        .into_iter()
        .map(|name| {
            let mut tensor = source.tensor(&name).unwrap();
            edit(&name, &mut tensor);
            (name, tensor)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    save_safetensors(dir.path().join("model.safetensors"), &tensors).unwrap();
    dir
}

fn greedy() -> serde_json::Value {
    json!({"prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0, "ignore_eos": true, "return_token_ids": true})
}

#[tokio::test(flavor = "multi_thread")]
async fn pause_keep_holds_requests_until_resume_and_abort_ends_them() {
    let server = std::sync::Arc::new(start(4, |config| config.enable_control_routes = true).await);
    let (_, paused) = server.get("/is_paused").await;
    assert_eq!(paused, r#"{"is_paused":false}"#);
    assert_eq!(server.post("/pause?mode=keep", &json!({})).await.0, 200);
    assert_eq!(server.get("/is_paused").await.1, r#"{"is_paused":true}"#);
    let held = {
        let server = server.clone();
        tokio::spawn(async move { server.post("/v1/completions", &greedy()).await })
    };
    server.wait_for_metric("vllm:num_requests_waiting", 1.0).await;
    assert_eq!(server.post("/resume", &json!({})).await.0, 200);
    let (status, answer) = held.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(answer["choices"][0]["finish_reason"], "length");

    let mut long = greedy();
    long["max_tokens"] = json!(50);
    let running = {
        let server = server.clone();
        tokio::spawn(async move { server.post("/v1/completions", &long).await })
    };
    server.wait_for_metric("vllm:num_requests_running", 1.0).await;
    assert_eq!(server.post("/pause?mode=abort", &json!({})).await.0, 200);
    let (_, answer) = running.await.unwrap();
    assert_eq!(answer["choices"][0]["finish_reason"], "abort");
    let (status, answer) = server.post("/pause?mode=sometimes", &json!({})).await;
    common::assert_error(status, 400, &answer);
    server.post("/resume", &json!({})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn weights_from_disk_swap_in_and_bad_checkpoints_are_refused() {
    let server = start(4, |config| config.enable_control_routes = true).await;
    // Random tiny models all repeat one token greedily: compare log-probs.
    let ids = |answer: &serde_json::Value| answer["choices"][0]["logprobs"]["token_logprobs"].clone();
    let mut greedy = greedy();
    greedy["logprobs"] = json!(1);
    let greedy = || greedy.clone();
    let (_, before) = server.post("/v1/completions", &greedy()).await;

    let other = tempfile::tempdir().unwrap();
    write_model(other.path(), Family::Llama, 1);
    let update = json!({"model_path": other.path(), "version": 1});
    let (status, answer) = server.post("/update_weights_from_disk", &update).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["version"], 1);
    let (_, after) = server.post("/v1/completions", &greedy()).await;
    assert_ne!(ids(&before), ids(&after), "new weights, new log-probs");

    let misshapen = checkpoint(|name, tensor| {
        if name == "model.embed_tokens.weight" {
            *tensor = HostTensor::new(vec![3, 4], vec![0.0; 12]).unwrap();
        }
    });
    let non_finite = checkpoint(|name, tensor| {
        if name == "model.norm.weight" {
            tensor.data[0] = f32::NAN;
        }
    });
    let missing = other.path().join("missing");
    for path in [misshapen.path(), non_finite.path(), missing.as_path()] {
        let (status, answer) = server
            .post("/update_weights_from_disk", &json!({"model_path": path, "version": 2}))
            .await;
        common::assert_error(status, 400, &answer);
        let (_, still) = server.post("/v1/completions", &greedy()).await;
        // Within round-off: the engine keeps the earlier answers' slots, so
        // this one decodes in another row of a batch of another size.
        assert!(
            close(&ids(&still), &ids(&after)),
            "a refused update keeps the old weights: {} vs {}",
            ids(&still),
            ids(&after)
        );
    }

    let back = json!({"model_path": model_dir(), "version": 3});
    assert_eq!(server.post("/update_weights_from_disk", &back).await.0, 200);
    let (_, restored) = server.post("/v1/completions", &greedy()).await;
    assert!(
        close(&ids(&restored), &ids(&before)),
        "{} vs {}",
        ids(&restored),
        ids(&before)
    );
    server.shutdown().await;
}

/// Whether two lists of log-probs agree within 1e-5 (a different model's
/// differ by far more).
fn close(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x.as_f64().unwrap() - y.as_f64().unwrap()).abs() < 1e-5)
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_aborts_what_runs_after_the_grace_period() {
    let server = start(4, |config| config.shutdown_grace = Duration::from_millis(200)).await;
    let mut long = greedy();
    long["max_tokens"] = json!(55);
    long["stream"] = json!(true);
    let response = server.send("/v1/completions", &long).await;
    let base = server.base.clone();
    server.wait_for_metric("vllm:num_requests_running", 1.0).await;
    let stopped = tokio::spawn(server.shutdown());
    let chunks = common::events(&response.text().await.unwrap());
    let last = chunks.last().unwrap();
    assert!(
        ["abort", "length"].contains(&last["choices"][0]["finish_reason"].as_str().unwrap()),
        "{last}"
    );
    tokio::time::timeout(Duration::from_secs(10), stopped)
        .await
        .unwrap()
        .unwrap();
    assert!(
        reqwest::get(format!("{base}/health")).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn control_routes_are_off_unless_enabled_or_behind_a_key() {
    let server = start(4, |_| {}).await;
    let update = json!({"model_path": model_dir(), "version": 1});
    for (path, body) in [
        ("/pause", json!({})),
        ("/resume", json!({})),
        ("/update_weights_from_disk", update.clone()),
    ] {
        let (status, answer) = server.post(path, &body).await;
        let message = common::assert_error(status, 403, &answer);
        assert!(
            message.contains("--api-key") && message.contains("--enable-control-routes"),
            "{message}"
        );
    }
    assert_eq!(server.get("/is_paused").await.0, 200, "reading the state stays open");
    server.shutdown().await;

    let keyed = start(4, |config| {
        config.api_key = Some(grpo_serving::auth::ApiKey::new("sk-control"))
    })
    .await;
    let (status, _) = common::status_json(
        keyed
            .request(reqwest::Method::POST, "/update_weights_from_disk")
            .bearer_auth("sk-control")
            .json(&update)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200, "the key's holders may");
    keyed.shutdown().await;
}

/// A weight folder whose index names a pipe, a path outside the folder or
/// an absolute path: refused at once (a pipe used to block the reader for
/// good), the old weights serving on.
#[tokio::test(flavor = "multi_thread")]
async fn weight_folders_are_read_only_from_regular_files_inside_them() {
    let server = start(4, |config| config.enable_control_routes = true).await;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("shard.safetensors");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    for shard in ["shard.safetensors", "../outside.safetensors", "/etc/hostname"] {
        let index = json!({"weight_map": {"model.embed_tokens.weight": shard}});
        std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
        let started = std::time::Instant::now();
        let (status, answer) = server
            .post(
                "/update_weights_from_disk",
                &json!({"model_path": dir.path(), "version": 1}),
            )
            .await;
        let message = common::assert_error(status, 400, &answer);
        assert!(message.contains(shard), "{message}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(dir.path().join("model.safetensors.index.json"))
            .status()
            .unwrap()
            .success()
    );
    let (status, answer) = server
        .post(
            "/update_weights_from_disk",
            &json!({"model_path": dir.path(), "version": 1}),
        )
        .await;
    assert!(common::assert_error(status, 400, &answer).contains("not a regular file"));
    server.shutdown().await;
}
