//! LoRA adapters served by name, as vLLM serves them: a server with
//! adapter slots loads PEFT folders at run time (`/v1/load_lora_adapter`),
//! lists them in `/v1/models` with the model as parent, generates a request
//! whose `model` names one with that adapter — what a plain engine on the
//! merged weights draws — beside base requests, answers with the
//! adapter's name, and unloads it (`/v1/unload_lora_adapter`); vLLM's
//! errors for what it cannot do; the routes are off unless allowed; and
//! the official `openai` client lists and uses an adapter.

mod common;

use std::path::Path;

use common::{MODEL, model_dir, start_engine};
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::lora::{AdapterFolder, LoraConfig, Merged, Targets, new_adapters};
use grpo_model::pretrained::Pretrained;
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_rollout::request::{Request, SamplingParams};
use grpo_serving::ServerConfig;
use grpo_xla::ElementType;
use serde_json::{Value, json};

/// Writes an adapter of `rank` on `targets` for the served model into
/// `dir`, with a non-zero `B` from `seed`.
fn write_adapter(dir: &Path, rank: usize, targets: &[&str], seed: u64) -> AdapterFolder {
    let config = Pretrained::open(model_dir().to_str().unwrap()).unwrap().config;
    let lora = LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        targets: Targets::Modules(targets.iter().map(|t| t.to_string()).collect()),
        use_rslora: false,
    };
    let mut tensors = new_adapters(&lora.layers(&config).unwrap(), rank, seed).unwrap();
    for (name, tensor) in tensors.iter_mut().filter(|(n, _)| n.ends_with("lora_B.weight")) {
        for (i, v) in tensor.data.iter_mut().enumerate() {
            let h = (i as u64 + name.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15 ^ seed) >> 40;
            *v = (h % 2001) as f32 / 1000.0 - 1.0;
        }
    }
    let folder = AdapterFolder {
        lora,
        tensors,
        dropout: 0.0,
    };
    folder.write(dir, &config, "tiny").unwrap();
    folder
}

/// The greedy tokens a plain engine on the served weights with `folder`
/// merged in draws for `prompt`.
fn merged_tokens(folder: &AdapterFolder, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let client = common::cpu_client();
    let pretrained = Pretrained::open(model_dir().to_str().unwrap()).unwrap();
    let decoder = Decoder::new(pretrained.config.clone());
    let merged = Merged {
        base: pretrained.weights.as_ref(),
        lora: &folder.lora,
        adapters: &folder.tensors,
    };
    let device = client.device(0).unwrap();
    let params = upload_parameters(&client, device, &decoder, &merged, ElementType::F32).unwrap();
    let config = EngineConfig {
        max_num_seqs: 1,
        max_model_len: common::MAX_MODEL_LEN,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(&client, decoder, params, config).unwrap();
    let request = Request {
        prompt: prompt.to_vec(),
        params: SamplingParams {
            max_tokens,
            temperature: 0.0,
            ignore_eos: true,
            ..SamplingParams::default()
        },
    };
    engine.generate(&[request]).unwrap().remove(0).remove(0).tokens
}

/// An engine with `max_loras` adapter slots of rank up to 8.
fn slots(max_loras: usize) -> EngineConfig {
    EngineConfig {
        max_num_seqs: 4,
        max_model_len: common::MAX_MODEL_LEN,
        max_loras,
        max_lora_rank: 8,
        ..EngineConfig::default()
    }
}

fn serving_adapters(config: &mut ServerConfig) {
    config.enable_lora = true;
    config.allow_runtime_lora_updating = true;
}

/// A greedy completion of `prompt` (token ids) by `model`: its token ids and the `model` it names.
fn completion(model: &str, prompt: &[u32]) -> Value {
    json!({"model": model, "prompt": prompt, "max_tokens": 6, "temperature": 0,
           "ignore_eos": true, "return_token_ids": true})
}

fn token_ids(response: &Value) -> Vec<u32> {
    serde_json::from_value(response["choices"][0]["token_ids"].clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn adapters_load_list_generate_beside_the_base_and_unload() {
    let dir = tempfile::tempdir().unwrap();
    let (sql, math) = (dir.path().join("sql"), dir.path().join("math"));
    let sql_folder = write_adapter(&sql, 4, &["q_proj", "v_proj", "down_proj"], 1);
    let math_folder = write_adapter(&math, 8, &["o_proj", "up_proj"], 2);
    let server = start_engine(slots(2), serving_adapters).await;
    let load = |name: &str, path: &Path| json!({"lora_name": name, "lora_path": path.to_str().unwrap()});

    for (name, path) in [("sql", &sql), ("math", &math)] {
        let response = server.send("/v1/load_lora_adapter", &load(name, path)).await;
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(
            response.text().await.unwrap(),
            format!("Success: LoRA adapter '{name}' added successfully.")
        );
    }
    let (status, listed) = server.get("/v1/models").await;
    assert_eq!(status, 200);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let cards = listed["data"].as_array().unwrap();
    let ids: Vec<&str> = cards.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [MODEL, "math", "sql"]);
    assert_eq!(cards[0]["parent"], Value::Null);
    assert_eq!(cards[2]["parent"], MODEL);
    assert_eq!(cards[2]["root"], sql.to_str().unwrap());
    assert_eq!(cards[2]["max_model_len"], Value::Null);

    // Requests of both adapters and of the base at once, each drawing
    // what its merged model draws, answered under the name asked for.
    let prompt: Vec<u32> = vec![5, 17, 99, 3, 64, 120, 8];
    let names = ["sql", MODEL, "math", "sql"];
    let bodies: Vec<Value> = names.iter().map(|name| completion(name, &prompt)).collect();
    let answers = futures::future::join_all(bodies.iter().map(|body| server.post("/v1/completions", body))).await;
    let sql_tokens = merged_tokens(&sql_folder, &prompt, 6);
    let math_tokens = merged_tokens(&math_folder, &prompt, 6);
    let base_tokens = token_ids(&answers[1].1);
    for (name, (status, body)) in names.iter().zip(&answers) {
        assert_eq!(*status, 200, "{body}");
        assert_eq!(body["model"], *name);
        let want = match *name {
            "sql" => &sql_tokens,
            "math" => &math_tokens,
            _ => &base_tokens,
        };
        assert_eq!(&token_ids(body), want, "{name}");
    }
    assert_ne!(token_ids(&answers[1].1), sql_tokens, "the adapter changes the answer");
    let (status, chat) = server
        .post(
            "/v1/chat/completions",
            &json!({"model": "math", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}),
        )
        .await;
    assert_eq!((status, chat["model"].as_str()), (200, Some("math")), "{chat}");

    // vLLM's errors.
    let (status, body) = server.post("/v1/load_lora_adapter", &load("sql", &math)).await;
    assert_eq!(status, 400);
    assert_eq!(
        body["error"]["message"],
        "The lora adapter 'sql' has already been loaded."
    );
    let (status, body) = server
        .post("/v1/load_lora_adapter", &load("third", &dir.path().join("nowhere")))
        .await;
    assert_eq!((status, body["error"]["type"].as_str()), (404, Some("NotFoundError")));
    assert!(
        body["error"]["message"].as_str().unwrap().contains("No adapter found"),
        "{body}"
    );
    let (status, body) = server.post("/v1/load_lora_adapter", &load("third", &sql)).await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"].as_str().unwrap().contains("max_loras"),
        "{body}"
    );
    let (status, body) = server.post("/v1/load_lora_adapter", &load(MODEL, &sql)).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = server.post("/v1/completions", &completion("nope", &prompt)).await;
    assert_eq!(status, 404);
    assert!(body["error"]["message"].as_str().unwrap().contains("`math`"), "{body}");

    // Unloaded, the name is gone and its slot takes another adapter.
    let response = server
        .send("/v1/unload_lora_adapter", &json!({"lora_name": "sql"}))
        .await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.text().await.unwrap(),
        "Success: LoRA adapter 'sql' removed successfully."
    );
    let (status, body) = server
        .post("/v1/unload_lora_adapter", &json!({"lora_name": "sql"}))
        .await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["message"], "The lora adapter 'sql' cannot be found.");
    let (status, _) = server.post("/v1/completions", &completion("sql", &prompt)).await;
    assert_eq!(status, 404);
    let response = server.send("/v1/load_lora_adapter", &load("sql2", &sql)).await;
    assert_eq!(response.status().as_u16(), 200);
    let (status, body) = server.post("/v1/completions", &completion("sql2", &prompt)).await;
    assert_eq!((status, token_ids(&body)), (200, sql_tokens));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_adapter_routes_are_off_unless_allowed() {
    let dir = tempfile::tempdir().unwrap();
    write_adapter(dir.path(), 2, &["q_proj"], 3);
    let body = json!({"lora_name": "a", "lora_path": dir.path().to_str().unwrap()});

    // Adapters on, run-time changes not allowed: a 403 saying how.
    let server = start_engine(slots(1), |config| config.enable_lora = true).await;
    let (status, answer) = server.post("/v1/load_lora_adapter", &body).await;
    assert_eq!(status, 403);
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--allow-runtime-lora-updating")
    );
    server.shutdown().await;

    // Run-time changes allowed without adapters on; a field vLLM lacks.
    let server = start_engine(slots(0), |config| config.allow_runtime_lora_updating = true).await;
    let (status, _) = server.post("/v1/load_lora_adapter", &body).await;
    assert_eq!(status, 403);
    server.shutdown().await;
    let server = start_engine(slots(1), serving_adapters).await;
    let mut extra = body.clone();
    extra["load_inplace"] = json!(true);
    let (status, answer) = server.post("/v1/load_lora_adapter", &extra).await;
    assert_eq!(status, 400);
    assert!(
        answer["error"]["message"].as_str().unwrap().contains("load_inplace"),
        "{answer}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_official_openai_client_lists_and_uses_an_adapter() {
    let dir = tempfile::tempdir().unwrap();
    write_adapter(dir.path(), 4, &["q_proj", "o_proj"], 4);
    let server = start_engine(slots(1), serving_adapters).await;
    let path = dir.path().to_str().unwrap();
    let response = server
        .send(
            "/v1/load_lora_adapter",
            &json!({"lora_name": "tuned", "lora_path": path}),
        )
        .await;
    assert_eq!(response.status().as_u16(), 200);
    common::run_client_script(
        "lora_client.py",
        &[server.base.as_str(), MODEL, "tuned", path],
        "all lora client checks passed",
    )
    .await;
    server.shutdown().await;
}
