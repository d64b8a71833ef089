//! The decoders against Hugging Face transformers on the same weights:
//! per-token log-probs, entropies and gradients of the summed log-prob for
//! a tiny model of every family (fixtures made by
//! `tools/make_parity_fixtures.py`).

mod common;

use std::path::{Path, PathBuf};

use common::cpu_client;
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::moe::ExpertProduct;
use grpo_model::weights::{Safetensors, WeightSource};
use grpo_xla::trace::{Graph, Tensor, grad};
use grpo_xla::{ElementType, Pred};

fn fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parity")
        .join(family)
}

struct Inputs {
    ids: Vec<Vec<i32>>,
    mask: Vec<Vec<i32>>,
}

fn inputs(dir: &Path) -> Inputs {
    let text = std::fs::read_to_string(dir.join("inputs.json")).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = |key: &str| -> Vec<Vec<i32>> {
        value[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_i64().unwrap() as i32)
                    .collect()
            })
            .collect()
    };
    Inputs {
        ids: rows("input_ids"),
        mask: rows("attention_mask"),
    }
}

/// Runs logprobs, entropy and ∂Σ(mask·logprob)/∂params for one fixture and
/// compares with transformers.
fn check_family(family: &str) {
    check_decoder(family, |d| d);
}

/// [`check_family`] for the fixture's decoder as `configure` sets it up
/// (layer checkpoints, the expert product).
fn check_decoder(family: &str, configure: impl Fn(Decoder) -> Decoder) {
    let dir = fixture(family);
    let config = ModelConfig::from_file(dir.join("config.json")).unwrap();
    let decoder = configure(Decoder::new(config));
    let weights = Safetensors::open_dir(&dir).unwrap();
    let expected = Safetensors::open_files(&[dir.join("expected.safetensors")]).unwrap();
    let input = inputs(&dir);
    let (b, t) = (input.ids.len() as i64, input.ids[0].len() as i64);

    let graph = Graph::new("parity");
    let params: Vec<Tensor> = decoder.parameter_tensors(&graph, ElementType::F32).unwrap();
    let ids = graph.parameter(ElementType::S32, &[b, t]).unwrap();
    let mask = graph.parameter(ElementType::Pred, &[b, t]).unwrap();
    let scores = decoder.token_logprobs(&params, &ids, &mask, t - 1, 1.0).unwrap();
    let (logprobs, entropy) = (&scores.logprobs, &scores.entropy);
    let target_mask = mask.slice_axis(1, 1, t).unwrap();
    let weight = target_mask
        .select(&logprobs.ones_like().unwrap(), &logprobs.zeros_like().unwrap())
        .unwrap();
    let total = logprobs.mul(&weight).unwrap().sum_all().unwrap();
    let wrt: Vec<&Tensor> = params.iter().collect();
    let grads = grad(&total, &wrt).unwrap();
    let mut outputs = vec![logprobs, entropy];
    outputs.extend(grads.iter());
    // Sparse models: the load-balancing loss and its gradients after the rest.
    let balance_grads = match &scores.balance {
        Some(balance) => grad(balance, &wrt).unwrap(),
        None => Vec::new(),
    };
    outputs.extend(scores.balance.iter());
    outputs.extend(balance_grads.iter());
    let client = cpu_client();
    let executable = graph.build(&outputs).unwrap().compile(&client).unwrap();

    let device = client.device(0).unwrap();
    let param_buffers = upload_parameters(&client, device, &decoder, &weights, ElementType::F32).unwrap();
    let flat_ids: Vec<i32> = input.ids.concat();
    let flat_mask: Vec<Pred> = input.mask.concat().into_iter().map(|m| Pred::from(m != 0)).collect();
    let ids_buffer = client.buffer_from_host(&flat_ids, &[b, t], device).unwrap();
    let mask_buffer = client.buffer_from_host(&flat_mask, &[b, t], device).unwrap();
    let mut args: Vec<&grpo_xla::Buffer> = param_buffers.iter().collect();
    args.push(&ids_buffer);
    args.push(&mask_buffer);
    let out = executable.execute(&args).unwrap();

    let target = expected.tensor("mask").unwrap().data;
    for (index, name) in [(0, "logprobs"), (1, "entropy")] {
        let got = out[index].to_host::<f32>().unwrap();
        let want = expected.tensor(name).unwrap().data;
        let worst = got
            .iter()
            .zip(&want)
            .zip(&target)
            .filter(|(_, m)| **m != 0.0)
            .map(|((g, w), _)| (g - w).abs())
            .fold(0.0f32, f32::max);
        println!("{family} {name}: max |grpo - transformers| = {worst:e}");
        assert!(worst <= 1e-4, "{family} {name}: max difference {worst} (> 1e-4)");
    }
    let count = decoder.parameters().len();
    compare_gradients(family, "grad", &decoder, &out[2..2 + count], &expected);
    if scores.balance.is_some() {
        let got = out[2 + count].to_host::<f32>().unwrap()[0];
        let want = expected.tensor("balance").unwrap().data[0];
        println!("{family} load-balancing loss: grpo {got}, transformers {want}");
        assert!((got - want).abs() <= 1e-5 * want, "{family} balance {got} vs {want}");
        compare_gradients(family, "grad_balance", &decoder, &out[3 + count..], &expected);
    } else {
        assert!(expected.tensor("balance").is_err(), "{family} has sparse layers");
    }
}

/// Each of `grads` (in the decoder's parameter order) against `expected`'s
/// `{prefix}.{name}` tensors, to 1e-3 of the largest value.
fn compare_gradients(
    family: &str,
    prefix: &str,
    decoder: &Decoder,
    grads: &[grpo_xla::Buffer],
    expected: &Safetensors,
) {
    let mut worst_relative = 0.0f32;
    for (spec, buffer) in decoder.parameters().iter().zip(grads) {
        let got = buffer.to_host::<f32>().unwrap();
        let want = expected.tensor(&format!("{prefix}.{}", spec.name)).unwrap().data;
        let scale = want.iter().map(|v| v.abs()).fold(0.0f32, f32::max).max(1e-6);
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
        assert!(
            worst / scale <= 1e-3,
            "{family} {prefix} of {}: max difference {worst}, scale {scale}",
            spec.name
        );
        worst_relative = worst_relative.max(worst / scale);
    }
    println!("{family} {prefix}: worst max-relative difference {worst_relative:e}");
}

#[test]
fn llama_matches_transformers() {
    check_family("llama");
}

#[test]
fn qwen2_matches_transformers() {
    check_family("qwen2");
}

#[test]
fn qwen3_matches_transformers() {
    check_family("qwen3");
}

#[test]
fn mistral_matches_transformers() {
    check_family("mistral");
}

#[test]
fn phi3_matches_transformers() {
    check_family("phi3");
}

#[test]
fn gemma3_matches_transformers() {
    check_family("gemma3");
}

#[test]
fn gemma2_matches_transformers() {
    check_family("gemma2");
}

/// Qwen3-MoE: routing, both expert products, a dense layer between sparse
/// ones, and the load-balancing loss with its gradients.
#[test]
fn qwen3_moe_matches_transformers() {
    for product in [ExpertProduct::Grouped, ExpertProduct::Dense, ExpertProduct::Auto] {
        check_decoder("qwen3_moe", |d| d.with_expert_product(product));
    }
}

/// Layer checkpoints change what the backward pass keeps, not what it
/// computes: every family still matches transformers.
#[test]
fn every_family_matches_transformers_with_layer_checkpoints() {
    for family in [
        "llama",
        "qwen2",
        "qwen3",
        "mistral",
        "phi3",
        "gemma3",
        "gemma2",
        "qwen3_moe",
    ] {
        check_decoder(family, |d| d.with_layer_checkpoints(true));
    }
}

/// The bucketed runner pads to 16 tokens; real positions must not change.
#[test]
fn the_logprobs_runner_pads_without_changing_results() {
    let dir = fixture("qwen3");
    let decoder = Decoder::new(ModelConfig::from_file(dir.join("config.json")).unwrap());
    let weights = Safetensors::open_dir(&dir).unwrap();
    let expected = Safetensors::open_files(&[dir.join("expected.safetensors")]).unwrap();
    let client = cpu_client();
    let params = upload_parameters(&client, client.device(0).unwrap(), &decoder, &weights, ElementType::F32).unwrap();
    let input = inputs(&dir);
    let sequences: Vec<Vec<u32>> = input
        .ids
        .iter()
        .zip(&input.mask)
        .map(|(ids, mask)| {
            ids.iter()
                .zip(mask)
                .filter(|(_, m)| **m != 0)
                .map(|(&id, _)| id as u32)
                .collect()
        })
        .collect();
    let runner = grpo_model::logprobs::LogprobsRunner::new(&client, decoder, ElementType::F32);
    let stats = runner.run(&params, &sequences).unwrap();
    let want = expected.tensor("logprobs").unwrap().data;
    let columns = input.ids[0].len() - 1;
    for (row, stat) in stats.iter().enumerate() {
        assert_eq!(stat.logprobs.len(), sequences[row].len() - 1);
        for (t, got) in stat.logprobs.iter().enumerate() {
            let w = want[row * columns + t];
            assert!((got - w).abs() <= 1e-4, "row {row} token {t}: {got} vs {w}");
        }
    }
    let error = runner.run(&params, &[vec![5]]).unwrap_err().to_string();
    assert!(error.contains("at least 2 tokens"), "{error}");
    let error = runner.run(&params, &[vec![5, 999]]).unwrap_err().to_string();
    assert!(error.contains("999") && error.contains("vocabulary"), "{error}");
}

/// bf16 parameters: the same program in bf16 stays close to transformers' f32.
#[test]
fn bf16_parameters_stay_close() {
    let dir = fixture("llama");
    let decoder = Decoder::new(ModelConfig::from_file(dir.join("config.json")).unwrap());
    let weights = Safetensors::open_dir(&dir).unwrap();
    let expected = Safetensors::open_files(&[dir.join("expected.safetensors")]).unwrap();
    let client = cpu_client();
    let params = upload_parameters(
        &client,
        client.device(0).unwrap(),
        &decoder,
        &weights,
        ElementType::Bf16,
    )
    .unwrap();
    assert!(params.iter().all(|p| p.dtype() == ElementType::Bf16));
    let input = inputs(&dir);
    let row: Vec<u32> = input.ids[0].iter().map(|&i| i as u32).collect();
    let runner = grpo_model::logprobs::LogprobsRunner::new(&client, decoder, ElementType::Bf16);
    let stats = runner.run(&params, &[row]).unwrap();
    let want = expected.tensor("logprobs").unwrap().data;
    let worst = stats[0]
        .logprobs
        .iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0f32, f32::max);
    println!("llama bf16: max |grpo bf16 - transformers f32| = {worst:e}");
    assert!(worst < 0.1, "bf16 log-probs drift by {worst}");
    assert!(worst > 0.0, "bf16 must really round");
}
