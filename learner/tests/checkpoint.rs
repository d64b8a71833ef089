//! Checkpoints round-trip bit for bit (parameters, optimizer state, loop
//! state), load as a model folder, and `latest` skips what a crash left.

use std::path::Path;

use grpo_learner::checkpoint::{CheckpointParts, SavedModel, SavedPolicy, checkpoint_dir, latest, load, save};
use grpo_learner::learner::host_tensors;
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::pretrained::Pretrained;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::weights::{Safetensors, SaveOptions, WeightSource};
use grpo_xla::{Buffer, Client, ClientOptions, ElementType, Platform};

#[test]
fn checkpoints_round_trip_and_the_newest_complete_one_is_found() {
    let client = Client::for_platform(Platform::Cpu, ClientOptions::default().compile_cache_dir(None)).unwrap();
    let device = client.device(0).unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures");
    let model_dir = fixtures.join("parity/llama");
    let config = ModelConfig::from_file(model_dir.join("config.json")).unwrap();
    let decoder = Decoder::new(config.clone());
    let weights = Safetensors::open_dir(&model_dir).unwrap();
    let params = upload_parameters(&client, device, &decoder, &weights, ElementType::F32).unwrap();
    let tokenizer = Tokenizer::from_file(fixtures.join("tokenizer/tiny/tokenizer.json")).unwrap();
    let moments: Vec<Buffer> = (0..2)
        .map(|i| {
            let values: Vec<f32> = (0..6).map(|j| (i * 6 + j) as f32 * 0.37 - 1.1).collect();
            client.buffer_from_host(&values, &[2, 3], device).unwrap()
        })
        .collect();
    let names: Vec<&str> = decoder.parameters().iter().map(|p| p.name.as_str()).collect();
    let out = tempfile::tempdir().unwrap();
    let model = SavedModel {
        config: &config,
        tokenizer: &tokenizer,
        name: "parity/llama",
        options: SaveOptions::default(),
    };
    let parts = |step| CheckpointParts {
        step,
        model,
        policy: SavedPolicy::Model(host_tensors(&names.iter().copied().zip(&params).collect::<Vec<_>>()).unwrap()),
        optimizer: host_tensors(&[("m.0", &moments[0]), ("v.0", &moments[1])]).unwrap(),
        state: serde_json::json!({"step": step, "sampler": {"epoch": 1, "position": 7}}),
    };
    assert!(latest(out.path()).is_none());
    save(out.path(), &parts(10)).unwrap();
    // A crash mid-write leaves only a staging folder, which is never taken.
    std::fs::create_dir_all(out.path().join(".checkpoint-20.partial-1")).unwrap();
    assert_eq!(latest(out.path()).unwrap(), checkpoint_dir(out.path(), 10));
    let dir = save(out.path(), &parts(20)).unwrap();
    assert_eq!(latest(out.path()).unwrap(), dir);

    let loaded = load(&dir).unwrap();
    assert_eq!(loaded.state["sampler"]["position"], 7);
    let saved = Safetensors::open_dir(&dir).unwrap();
    for name in &names {
        assert_eq!(
            saved.tensor(name).unwrap(),
            weights.tensor(name).unwrap(),
            "{name} bit for bit"
        );
    }
    assert_eq!(loaded.optimizer["v.0"].data, moments[1].to_host::<f32>().unwrap());
    let reopened = Pretrained::open(dir.to_str().unwrap()).unwrap();
    assert_eq!(reopened.config, config, "the checkpoint is a model folder");
    assert!(reopened.tokenizer.is_some());
}
