//! Shared helpers of the serving tests: one CPU client per test binary (so
//! programs compile once), a tiny random llama model written once with the
//! 600-token fixture tokenizer (it has a chat template), servers on
//! ephemeral loopback ports, and JSON / server-sent-event helpers.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use grpo_model::config::Family;
use grpo_model::decoder::Decoder;
use grpo_model::init::{Preset, preset_config, random_weights};
use grpo_model::load::upload_parameters;
use grpo_model::pretrained::{Pretrained, write_model_dir};
use grpo_model::tokenizer::Tokenizer;
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_serving::{Server, ServerConfig};
use grpo_xla::{Client, ClientOptions, ElementType, Platform};
use serde_json::Value;

/// The served model's context.
pub const MAX_MODEL_LEN: usize = 64;
/// The name the tests serve the model under.
pub const MODEL: &str = "tiny";

/// One CPU client for the whole test binary.
pub fn cpu_client() -> Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            Client::for_platform(
                Platform::Cpu,
                ClientOptions::default().compile_cache_dir(None).cpu_device_count(1),
            )
            .unwrap_or_else(|e| panic!("{e}"))
        })
        .clone()
}

/// The fixture tokenizer (600 tokens, ChatML template).
pub fn tokenizer() -> Tokenizer {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/tokenizer/tiny/tokenizer.json");
    Tokenizer::from_file(path).unwrap()
}

/// Writes a random tiny `family` model with weights from `seed` into `dir`.
pub fn write_model(dir: &Path, family: Family, seed: u64) {
    let tokenizer = tokenizer();
    let eos = tokenizer.eos_id().unwrap();
    let config = preset_config(family, Preset::Tiny, tokenizer.vocab_size(), tokenizer.bos_id(), eos);
    let weights = random_weights(&config, seed).unwrap();
    write_model_dir(
        dir,
        &config.to_hf_json(),
        &config,
        &weights,
        &tokenizer,
        Default::default(),
    )
    .unwrap();
}

/// The tiny llama model folder the servers load (written once per binary).
pub fn model_dir() -> PathBuf {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        write_model(dir.path(), Family::Llama, 0);
        dir
    })
    .path()
    .to_path_buf()
}

/// A server running in the test's runtime, and how to reach it.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The HTTP client.
    pub http: reqwest::Client,
    /// Sent as `Authorization: Bearer KEY` when set.
    pub key: Option<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The serve task.
    pub task: tokio::task::JoinHandle<grpo_serving::Result<()>>,
}

/// A server of the fixture model with `max_num_seqs` slots; `configure` edits its config.
pub async fn start(max_num_seqs: usize, configure: impl FnOnce(&mut ServerConfig)) -> TestServer {
    start_with_len(max_num_seqs, MAX_MODEL_LEN, configure).await
}

/// As [`start`], with a context of `max_model_len` tokens.
pub async fn start_with_len(
    max_num_seqs: usize,
    max_model_len: usize,
    configure: impl FnOnce(&mut ServerConfig),
) -> TestServer {
    let engine_config = EngineConfig {
        max_num_seqs,
        max_model_len,
        dtype: ElementType::F32,
        ..EngineConfig::default()
    };
    start_engine(engine_config, configure).await
}

/// A server of the fixture model on an engine of `engine_config`.
pub async fn start_engine(engine_config: EngineConfig, configure: impl FnOnce(&mut ServerConfig)) -> TestServer {
    let client = cpu_client();
    let pretrained = Pretrained::open(model_dir().to_str().unwrap()).unwrap();
    let decoder = Decoder::new(pretrained.config.clone());
    let device = client.device(0).unwrap();
    let params = upload_parameters(&client, device, &decoder, pretrained.weights.as_ref(), ElementType::F32).unwrap();
    let engine = Engine::new(&client, decoder, params, engine_config).unwrap();
    let mut config = ServerConfig::new(MODEL);
    configure(&mut config);
    let tokenizer = Arc::new(pretrained.tokenizer.unwrap());
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), engine, tokenizer, config)
        .await
        .unwrap();
    let addr = server.local_addr();
    assert!(addr.ip().is_loopback());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    TestServer {
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        key: None,
        stop: Some(stop),
        task,
    }
}

impl TestServer {
    /// A request to `path` (with the key, if any).
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, format!("{}{path}", self.base));
        match &self.key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    /// POSTs `body` as JSON; the response.
    pub async fn send(&self, path: &str, body: &Value) -> reqwest::Response {
        self.request(reqwest::Method::POST, path)
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// POSTs `body` as JSON; the status and the JSON answer.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = self.send(path, body).await;
        status_json(response).await
    }

    /// GETs `path`; the status and the body text.
    pub async fn get(&self, path: &str) -> (u16, String) {
        let response = self.request(reqwest::Method::GET, path).send().await.unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    /// POSTs a streaming request; the chunks of its event stream (checking it ends with `[DONE]`).
    pub async fn stream(&self, path: &str, body: &Value) -> Vec<Value> {
        let response = self.send(path, body).await;
        assert_eq!(response.status().as_u16(), 200);
        let content_type = response.headers()["content-type"].to_str().unwrap().to_string();
        assert!(content_type.starts_with("text/event-stream"), "{content_type}");
        events(&response.text().await.unwrap())
    }

    /// A metric's value from `/metrics`: the first sample of the series
    /// `name{key="value",…}` (labels optional) whose labels include the
    /// given ones.
    pub async fn metric(&self, series: &str) -> f64 {
        let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
        let labels: Vec<&str> = labels
            .trim_end_matches('}')
            .split(',')
            .filter(|l| !l.is_empty())
            .collect();
        let (status, text) = self.get("/metrics").await;
        assert_eq!(status, 200);
        let value = text
            .lines()
            .filter(|line| !line.starts_with('#'))
            .filter_map(|line| line.rsplit_once(' '))
            .find(|(sample, _)| {
                sample.split('{').next() == Some(name) && labels.iter().all(|label| sample.contains(label))
            })
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
            .1;
        value.parse().unwrap()
    }

    /// Polls `/metrics` until `name` reads `value` (at most 10 s).
    pub async fn wait_for_metric(&self, name: &str, value: f64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.metric(name).await;
            if now == value {
                return;
            }
            assert!(Instant::now() < deadline, "{name} is {now}, not {value}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops the server and waits for it to return.
    pub async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap().unwrap();
    }
}

/// The status and JSON body of `response`.
pub async fn status_json(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, json)
}

/// The JSON chunks of an event stream's text, which must end with `data: [DONE]`.
pub fn events(text: &str) -> Vec<Value> {
    let data: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            e.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not an event: {e:?}"))
        })
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// Asserts `body` is an error of `status` in the API's shape; returns its message.
pub fn assert_error(status: u16, expected: u16, body: &Value) -> String {
    assert_eq!(status, expected, "{body}");
    let error = &body["error"];
    assert_eq!(error["code"], expected, "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(error.get("param").is_some(), "{body}");
    error["message"].as_str().expect("a message").to_string()
}

#[path = "../../../tools/test_python.rs"]
mod test_python;

#[path = "../../../tools/prometheus_page.rs"]
pub mod prometheus_page;

/// `/metrics` of `server` read with Prometheus' own Python parser.
pub async fn parsed_metrics(server: &TestServer) -> Vec<prometheus_page::Sample> {
    let (status, page) = server.get("/metrics").await;
    assert_eq!(status, 200);
    prometheus_page::parse_page(&test_python::test_python(), &page)
}

/// Runs `serving/tests/{script}` with `args` under the test venv's Python
/// (which must import the `openai` client: the test fails, never skips),
/// and asserts that it succeeded and printed `done`.
pub async fn run_client_script(script: &str, args: &[&str], done: &str) {
    let python = test_python::test_python();
    let check = std::process::Command::new(&python)
        .args(["-c", "import openai"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    assert!(
        check.status.success(),
        "{} cannot import openai: {}",
        python.display(),
        String::from_utf8_lossy(&check.stderr)
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join(script);
    let output = tokio::process::Command::new(&python)
        .arg(&path)
        .args(args)
        .env("PYTHONUNBUFFERED", "1")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success(),
        "{script} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    assert!(stdout.contains(done), "{stdout}");
}
