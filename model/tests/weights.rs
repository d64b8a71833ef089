//! Safetensors checkpoints: dtypes, shards, round trips, and bad files
//! giving errors that name the file and tensor.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use common::cpu_client;
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::weights::{
    HostTensor, Safetensors, SaveDtype, SaveOptions, WeightSource, save_model_weights, save_safetensors,
};
use grpo_xla::ElementType;
use half::{bf16, f16};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

fn write_raw(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None::<HashMap<String, String>>, path).unwrap();
}

#[test]
fn f32_bf16_and_f16_tensors_read_as_f32() {
    let dir = tempfile::tempdir().unwrap();
    let values = [0.5f32, -1.25, 3.0, 0.0];
    let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let bf16_bytes: Vec<u8> = values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect();
    let f16_bytes: Vec<u8> = values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
    write_raw(
        &dir.path().join("model.safetensors"),
        &[
            ("a", Dtype::F32, vec![2, 2], f32_bytes),
            ("b", Dtype::BF16, vec![4], bf16_bytes),
            ("c", Dtype::F16, vec![1, 4], f16_bytes),
            ("d", Dtype::I64, vec![1], 7i64.to_le_bytes().to_vec()),
        ],
    );
    let weights = Safetensors::open_dir(dir.path()).unwrap();
    assert_eq!(weights.names(), ["a", "b", "c", "d"]);
    for (name, dims) in [("a", vec![2, 2]), ("b", vec![4]), ("c", vec![1, 4])] {
        let t = weights.tensor(name).unwrap();
        assert_eq!(t.dims, dims);
        assert_eq!(t.data, values);
    }
    let error = weights.tensor("d").unwrap_err().to_string();
    assert!(
        error.contains("model.safetensors") && error.contains("`d`") && error.contains("I64"),
        "{error}"
    );
    let missing = weights.tensor("e").unwrap_err().to_string();
    assert!(
        missing.contains("`e`") && missing.contains("not in the checkpoint"),
        "{missing}"
    );
}

#[test]
fn sharded_checkpoints_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let one = HostTensor::new(vec![2], vec![1.0, 2.0]).unwrap();
    let two = HostTensor::new(vec![1, 3], vec![3.0, 4.0, 5.0]).unwrap();
    save_safetensors(
        dir.path().join("part-1.safetensors"),
        &BTreeMap::from([("x".to_string(), one.clone())]),
    )
    .unwrap();
    save_safetensors(
        dir.path().join("part-2.safetensors"),
        &BTreeMap::from([("y".to_string(), two.clone())]),
    )
    .unwrap();
    let index =
        serde_json::json!({"metadata": {}, "weight_map": {"x": "part-1.safetensors", "y": "part-2.safetensors"}});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();
    let weights = Safetensors::open_dir(dir.path()).unwrap();
    assert_eq!(weights.tensor("x").unwrap(), one);
    assert_eq!(weights.tensor("y").unwrap(), two);
}

#[test]
fn corrupt_and_truncated_files_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(&path, b"this is not a checkpoint").unwrap();
    let error = Safetensors::open_dir(dir.path()).err().unwrap().to_string();
    assert!(
        error.contains("model.safetensors") && error.contains("not a valid safetensors"),
        "{error}"
    );

    let good = HostTensor::new(vec![64], vec![1.5; 64]).unwrap();
    save_safetensors(&path, &BTreeMap::from([("w".to_string(), good)])).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    for cut in [4, 12, bytes.len() - 10] {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let error = Safetensors::open_dir(dir.path()).err().unwrap().to_string();
        assert!(error.contains("model.safetensors"), "cut at {cut}: {error}");
    }
    let empty = tempfile::tempdir().unwrap();
    let error = Safetensors::open_dir(empty.path()).err().unwrap().to_string();
    assert!(error.contains("model.safetensors.index.json"), "{error}");
}

#[test]
fn a_checkpoint_of_the_wrong_shape_is_refused_naming_the_tensor() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity/llama");
    let text = std::fs::read_to_string(fixture.join("config.json")).unwrap();
    let wider = text.replace("\"intermediate_size\": 64", "\"intermediate_size\": 96");
    let decoder = Decoder::new(ModelConfig::from_json(&wider).unwrap());
    let weights = Safetensors::open_dir(&fixture).unwrap();
    let client = cpu_client();
    let error = upload_parameters(&client, client.device(0).unwrap(), &decoder, &weights, ElementType::F32)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("mlp.gate_proj.weight") && error.contains("[64, 32]") && error.contains("[96, 32]"),
        "{error}"
    );
}

#[test]
fn models_save_sharded_and_in_bf16_as_transformers_writes_them() {
    // 1000 + 600 + 300 values: at 2 bytes, shards of at most 2400 bytes hold
    // `a` alone (2000), then `b` and `c` (1800).
    let values = |n: usize, scale: f32| (0..n).map(|i| (i as f32 * scale).sin() * 3.7).collect::<Vec<f32>>();
    let tensors = BTreeMap::from([
        (
            "a".to_string(),
            HostTensor::new(vec![10, 100], values(1000, 0.31)).unwrap(),
        ),
        ("b".to_string(), HostTensor::new(vec![600], values(600, 0.17)).unwrap()),
        (
            "c".to_string(),
            HostTensor::new(vec![3, 100], values(300, 0.05)).unwrap(),
        ),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let options = SaveOptions {
        dtype: SaveDtype::Bf16,
        max_shard_bytes: 2400,
    };
    save_model_weights(dir.path(), &tensors, options).unwrap();
    assert!(!dir.path().join("model.safetensors").exists());
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("model.safetensors.index.json")).unwrap())
            .unwrap();
    assert_eq!(index["metadata"]["total_size"], 3800);
    let (first, second) = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors");
    assert_eq!(
        index["weight_map"],
        serde_json::json!({"a": first, "b": second, "c": second})
    );
    for (file, names) in [(first, vec!["a"]), (second, vec!["b", "c"])] {
        let bytes = std::fs::read(dir.path().join(file)).unwrap();
        let read = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut found: Vec<String> = read.names().into_iter().map(str::to_string).collect();
        found.sort();
        assert_eq!(found, names);
        assert!(read.tensors().iter().all(|(_, view)| view.dtype() == Dtype::BF16));
    }
    // Read back through the index: each value the nearest bf16.
    let weights = Safetensors::open_dir(dir.path()).unwrap();
    for (name, tensor) in &tensors {
        let back = weights.tensor(name).unwrap();
        assert_eq!(back.dims, tensor.dims);
        for (&got, &want) in back.data.iter().zip(&tensor.data) {
            assert_eq!(got, bf16::from_f32(want).to_f32(), "{name}");
        }
    }
    // Under the shard size: one f32 file, as before.
    let whole = tempfile::tempdir().unwrap();
    save_model_weights(whole.path(), &tensors, SaveOptions::default()).unwrap();
    let weights = Safetensors::open_dir(whole.path()).unwrap();
    assert_eq!(weights.tensor("a").unwrap(), tensors["a"]);
    assert!(!whole.path().join("model.safetensors.index.json").exists());
}
