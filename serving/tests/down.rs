//! A server whose engine is down answers 503 in the error shape on
//! `/health`, generation and `/metrics`, and keeps answering: the routes
//! run over a `Backend` whose every call fails with `EngineStopped`.

mod common;

use std::sync::Arc;

use futures::future::BoxFuture;
use grpo_model::lora::LoraConfig;
use grpo_model::weights::HostTensor;
use grpo_rollout::adapters::AdapterId;
use grpo_rollout::engine::InFlight;
use grpo_rollout::handle::{PauseMode, ServiceStats};
use grpo_rollout::request::Request;
use grpo_serving::backend::{Backend, Updates};
use grpo_serving::model::ServedModel;
use grpo_serving::{Server, ServerConfig};
use serde_json::json;

/// A backend whose engine has stopped.
struct Stopped;

fn stopped<T: Send + 'static>() -> BoxFuture<'static, grpo_rollout::Result<T>> {
    Box::pin(async {
        Err(grpo_rollout::Error::EngineStopped {
            reason: "the device failed".to_string(),
        })
    })
}

impl Backend for Stopped {
    fn generate(&self, _: Request) -> BoxFuture<'_, grpo_rollout::Result<Updates>> {
        stopped()
    }
    fn stats(&self) -> BoxFuture<'_, grpo_rollout::Result<ServiceStats>> {
        stopped()
    }
    fn is_running(&self) -> bool {
        false
    }
    fn pause(&self, _: PauseMode) -> BoxFuture<'_, grpo_rollout::Result<()>> {
        stopped()
    }
    fn resume(&self) -> BoxFuture<'_, grpo_rollout::Result<()>> {
        stopped()
    }
    fn update_weights(
        &self,
        _: u64,
        _: Vec<(String, HostTensor)>,
        _: InFlight,
    ) -> BoxFuture<'_, grpo_rollout::Result<()>> {
        stopped()
    }
    fn load_adapter(
        &self,
        _: LoraConfig,
        _: Vec<(String, HostTensor)>,
    ) -> BoxFuture<'_, grpo_rollout::Result<AdapterId>> {
        stopped()
    }
    fn unload_adapter(&self, _: AdapterId) -> BoxFuture<'_, grpo_rollout::Result<bool>> {
        stopped()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_engine_answers_503() {
    let model = ServedModel {
        name: common::MODEL.to_string(),
        root: common::MODEL.to_string(),
        config: grpo_model::init::preset_config(
            grpo_model::config::Family::Llama,
            grpo_model::init::Preset::Tiny,
            600,
            None,
            0,
        ),
        max_model_len: common::MAX_MODEL_LEN,
        max_num_seqs: 4,
        longest_token_bytes: 16,
        parameters: Vec::new(),
        tokenizer: Arc::new(common::tokenizer()),
        chat_template: None,
        tool_format: grpo_model::tools::ToolCallFormat::Hermes,
        eos_token_ids: Vec::new(),
    };
    let config = ServerConfig::new(common::MODEL);
    let server = Server::bind_backend("127.0.0.1:0".parse().unwrap(), Arc::new(Stopped), model, config)
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    tokio::spawn(server.serve(std::future::pending()));
    let http = reqwest::Client::new();
    for _ in 0..2 {
        for path in ["/health", "/metrics", "/is_paused"] {
            let (status, body) = common::status_json(http.get(format!("{base}{path}")).send().await.unwrap()).await;
            common::assert_error(status, 503, &body);
        }
        let request = http
            .post(format!("{base}/v1/completions"))
            .json(&json!({"prompt": "hi"}));
        let (status, body) = common::status_json(request.send().await.unwrap()).await;
        assert!(common::assert_error(status, 503, &body).contains("the device failed"));
    }
}
