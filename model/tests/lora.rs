//! LoRA adapters against PEFT, both ways (fixtures from
//! `tools/make_lora_fixtures.py`): adapters PEFT made on the tiny parity
//! models load in grpo and give PEFT's log-probs and adapter gradients, and
//! merged into the base they score the same; adapters grpo trained score in
//! PEFT as in grpo. New adapters leave the model as it is, PEFT folders
//! round-trip, and options grpo does not apply are refused.

mod common;

use std::path::{Path, PathBuf};

use common::cpu_client;
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::lora::{AdapterFolder, LoraConfig, Merged, Targets, WithAdapters, new_adapters, peft_name};
use grpo_model::weights::{Safetensors, WeightSource};
use grpo_xla::trace::{Graph, Tensor, grad};
use grpo_xla::{ElementType, Pred};

fn parity(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parity")
        .join(family)
}

fn lora_fixture(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/lora")
        .join(family)
}

/// The parity inputs: ids and mask `[B, T]`.
fn inputs(family: &str) -> (Vec<i32>, Vec<Pred>, i64, i64) {
    let text = std::fs::read_to_string(parity(family).join("inputs.json")).unwrap();
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rows = |key: &str| -> Vec<Vec<i64>> {
        value[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect())
            .collect()
    };
    let (ids, mask) = (rows("input_ids"), rows("attention_mask"));
    let (b, t) = (ids.len() as i64, ids[0].len() as i64);
    let ids = ids.concat().into_iter().map(|v| v as i32).collect();
    let mask = mask.concat().into_iter().map(|m| Pred::from(m != 0)).collect();
    (ids, mask, b, t)
}

/// Per-token log-probs `[B·(T−1)]` of `decoder` on the parity inputs of
/// `family`, and the gradient of their masked sum with respect to each
/// parameter the decoder has beyond its base model's.
fn logprobs_and_adapter_grads(
    family: &str,
    decoder: &Decoder,
    weights: &dyn WeightSource,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    logprobs_and_adapter_grads_drawn(family, decoder, weights, None)
}

/// The same, in a training forward with dropout masks of draw `draw` when given.
fn logprobs_and_adapter_grads_drawn(
    family: &str,
    decoder: &Decoder,
    weights: &dyn WeightSource,
    draw: Option<u32>,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (ids, mask, b, t) = inputs(family);
    let graph = Graph::new("lora");
    let mut params = decoder.parameter_tensors(&graph, ElementType::F32).unwrap();
    if draw.is_some() {
        params.push(decoder.dropout_draw(&graph).unwrap());
    }
    let ids_in = graph.parameter(ElementType::S32, &[b, t]).unwrap();
    let mask_in = graph.parameter(ElementType::Pred, &[b, t]).unwrap();
    let logprobs = decoder
        .token_logprobs(&params, &ids_in, &mask_in, t - 1, 1.0)
        .unwrap()
        .logprobs;
    let real = mask_in.slice_axis(1, 1, t).unwrap();
    let weight = real
        .select(&logprobs.ones_like().unwrap(), &logprobs.zeros_like().unwrap())
        .unwrap();
    let total = logprobs.mul(&weight).unwrap().sum_all().unwrap();
    let adapters: Vec<&Tensor> = params[decoder.base_parameters().len()..decoder.parameters().len()]
        .iter()
        .collect();
    let grads = grad(&total, &adapters).unwrap();
    let mut outputs = vec![&logprobs];
    outputs.extend(grads.iter());
    let client = cpu_client();
    let program = graph.build(&outputs).unwrap().compile(&client).unwrap();
    let device = client.device(0).unwrap();
    let buffers = upload_parameters(&client, device, decoder, weights, ElementType::F32).unwrap();
    let ids = client.buffer_from_host(&ids, &[b, t], device).unwrap();
    let mask = client.buffer_from_host(&mask, &[b, t], device).unwrap();
    let draw = draw.map(|d| client.buffer_from_host(&[d], &[], device).unwrap());
    let mut args: Vec<&grpo_xla::Buffer> = buffers.iter().chain(&draw).collect();
    args.push(&ids);
    args.push(&mask);
    let out = program.execute(&args).unwrap();
    let host: Vec<Vec<f32>> = out.iter().map(|o| o.to_host::<f32>().unwrap()).collect();
    (host[0].clone(), host[1..].to_vec())
}

/// The largest difference over real target tokens.
fn worst(got: &[f32], want: &[f32], mask: &[f32]) -> f32 {
    got.iter()
        .zip(want)
        .zip(mask)
        .filter(|(_, m)| **m != 0.0)
        .map(|((g, w), _)| (g - w).abs())
        .fold(0.0, f32::max)
}

fn check_peft_made(family: &str) {
    let config = ModelConfig::from_file(parity(family).join("config.json")).unwrap();
    let folder = AdapterFolder::read(&lora_fixture(family).join("adapter"), &config).unwrap();
    let expected = Safetensors::open_files(&[lora_fixture(family).join("expected.safetensors")]).unwrap();
    let mask = expected.tensor("mask").unwrap().data;
    let base = Safetensors::open_dir(parity(family)).unwrap();

    let decoder = Decoder::with_adapters(config.clone(), folder.lora.clone()).unwrap();
    let source = WithAdapters {
        base: &base,
        adapters: &folder.tensors,
    };
    let (logprobs, grads) = logprobs_and_adapter_grads(family, &decoder, &source);
    let difference = worst(&logprobs, &expected.tensor("logprobs").unwrap().data, &mask);
    println!("{family}: max |grpo − PEFT| log-prob {difference:e}");
    assert!(
        difference <= 1e-4,
        "{family} log-probs differ from PEFT's by {difference}"
    );
    assert_eq!(grads.len(), decoder.adapter_parameters().len());
    for (spec, got) in decoder.adapter_parameters().iter().zip(&grads) {
        let want = expected
            .tensor(&format!("grad.{}", peft_name(&spec.name)))
            .unwrap()
            .data;
        let scale = want.iter().map(|v| v.abs()).fold(0.0f32, f32::max);
        let diff = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
        assert!(
            scale > 0.0 && diff <= 1e-3 * scale,
            "{family} grad of {}: {diff} (scale {scale})",
            spec.name
        );
    }

    // Merged into the base weights: the plain decoder scores as PEFT does.
    let merged = Merged {
        base: &base,
        lora: &folder.lora,
        adapters: &folder.tensors,
    };
    let (merged_logprobs, _) = logprobs_and_adapter_grads(family, &decoder.base(), &merged);
    let difference = worst(&merged_logprobs, &expected.tensor("logprobs").unwrap().data, &mask);
    assert!(
        difference <= 1e-4,
        "{family} merged log-probs differ from PEFT's by {difference}"
    );

    // Adapters off: the base decoder on the base weights is PEFT's base.
    let (base_logprobs, none) = logprobs_and_adapter_grads(family, &decoder.base(), &base);
    assert!(none.is_empty());
    let difference = worst(&base_logprobs, &expected.tensor("base_logprobs").unwrap().data, &mask);
    assert!(difference <= 1e-4, "{family} base log-probs differ by {difference}");
}

#[test]
fn peft_adapters_on_every_linear_layer_of_llama_match_peft() {
    check_peft_made("llama");
}

#[test]
fn peft_rslora_adapters_on_biased_qwen2_projections_match_peft() {
    check_peft_made("qwen2");
}

#[test]
fn peft_adapters_on_fused_phi3_projections_match_peft() {
    check_peft_made("phi3");
}

#[test]
fn new_adapters_leave_the_model_unchanged_and_round_trip_as_peft_folders() {
    let config = ModelConfig::from_file(parity("llama").join("config.json")).unwrap();
    let lora = LoraConfig {
        rank: 3,
        alpha: 6.0,
        targets: Targets::Modules(vec!["down_proj".into(), "q_proj".into()]),
        use_rslora: false,
    };
    let layers = lora.layers(&config).unwrap();
    assert_eq!(layers.len(), 2 * config.layers, "q_proj and down_proj of every layer");
    let tensors = new_adapters(&layers, lora.rank, 7).unwrap();
    for (name, tensor) in &tensors {
        if name.ends_with("lora_B.weight") {
            assert!(tensor.data.iter().all(|&v| v == 0.0), "{name} starts at zero");
        } else {
            // PEFT's Kaiming-uniform: ±1/√in, and not all near zero.
            let bound = 1.0 / (tensor.dims[1] as f32).sqrt();
            assert!(tensor.data.iter().all(|v| v.abs() <= bound), "{name}");
            assert!(tensor.data.iter().any(|v| v.abs() > bound / 2.0), "{name}");
        }
    }
    let base = Safetensors::open_dir(parity("llama")).unwrap();
    let decoder = Decoder::with_adapters(config.clone(), lora.clone()).unwrap();
    let (adapted, grads) = logprobs_and_adapter_grads(
        "llama",
        &decoder,
        &WithAdapters {
            base: &base,
            adapters: &tensors,
        },
    );
    let (plain, _) = logprobs_and_adapter_grads("llama", &decoder.base(), &base);
    assert_eq!(adapted, plain, "B = 0: the adapted model is the base model");
    // With B at zero only B gets a gradient (A's passes through B).
    for (spec, g) in decoder.adapter_parameters().iter().zip(&grads) {
        let moved = g.iter().any(|&v| v != 0.0);
        assert_eq!(moved, spec.name.ends_with("lora_B.weight"), "{}", spec.name);
    }

    let dir = tempfile::tempdir().unwrap();
    let folder = AdapterFolder {
        lora,
        tensors,
        dropout: 0.05,
    };
    folder.write(dir.path(), &config, "tiny-llama").unwrap();
    let back = AdapterFolder::read(dir.path(), &config).unwrap();
    assert_eq!(back.lora, folder.lora);
    assert_eq!(back.tensors, folder.tensors);
    assert_eq!(back.dropout, 0.05);
    let settings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!(settings["target_modules"], serde_json::json!(["down_proj", "q_proj"]));
    assert_eq!(settings["base_model_name_or_path"], "tiny-llama");
    assert_eq!(settings["lora_dropout"], 0.05);
    let names = Safetensors::open_files(&[dir.path().join("adapter_model.safetensors")])
        .unwrap()
        .names();
    assert!(
        names.iter().all(|n| n.starts_with("base_model.model.model.layers.")),
        "{names:?}"
    );
}

#[test]
fn adapters_grpo_cannot_apply_are_refused_by_name() {
    let config = ModelConfig::from_file(parity("llama").join("config.json")).unwrap();
    let source = lora_fixture("llama").join("adapter");
    let settings: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(source.join("adapter_config.json")).unwrap()).unwrap();
    let refused = |field: &str, value: serde_json::Value| {
        let dir = tempfile::tempdir().unwrap();
        let mut changed = settings.clone();
        changed[field] = value;
        std::fs::write(dir.path().join("adapter_config.json"), changed.to_string()).unwrap();
        std::fs::copy(
            source.join("adapter_model.safetensors"),
            dir.path().join("adapter_model.safetensors"),
        )
        .unwrap();
        AdapterFolder::read(dir.path(), &config).unwrap_err().to_string()
    };
    for (field, value) in [
        ("use_dora", serde_json::json!(true)),
        ("bias", serde_json::json!("all")),
        ("modules_to_save", serde_json::json!(["lm_head"])),
        ("rank_pattern", serde_json::json!({"q_proj": 8})),
        ("layers_to_transform", serde_json::json!([0])),
    ] {
        let error = refused(field, value);
        assert!(error.contains(field) && error.contains("not supported"), "{error}");
    }
    let error = refused("target_modules", serde_json::json!(["q_proj", "c_attn"]));
    assert!(error.contains("c_attn") && error.contains("q_proj"), "{error}");
    let error = refused("r", serde_json::json!(5));
    assert!(error.contains("shape") && error.contains("lora_A"), "{error}");
    let error = refused("peft_type", serde_json::json!("IA3"));
    assert!(error.contains("LORA"), "{error}");

    let bad_rank = LoraConfig {
        rank: 0,
        alpha: 1.0,
        targets: Targets::AllLinear,
        use_rslora: false,
    };
    let error = Decoder::with_adapters(config, bad_rank).unwrap_err().to_string();
    assert!(error.contains("rank"), "{error}");
}

/// An adapter folder grpo wrote (`grpo sft` with `[lora]`, by
/// `tools/make_lora_fixtures.py --grpo-made`) scores in grpo as PEFT,
/// loading it with `PeftModel.from_pretrained`, scores it.
#[test]
fn a_grpo_made_adapter_folder_scores_as_peft_scores_it() {
    let config = ModelConfig::from_file(parity("llama").join("config.json")).unwrap();
    let made = lora_fixture("grpo_made");
    let folder = AdapterFolder::read(&made.join("adapter"), &config).unwrap();
    let expected = Safetensors::open_files(&[made.join("peft_expected.safetensors")]).unwrap();
    let base = Safetensors::open_dir(parity("llama")).unwrap();
    let decoder = Decoder::with_adapters(config, folder.lora.clone()).unwrap();
    let source = WithAdapters {
        base: &base,
        adapters: &folder.tensors,
    };
    let (logprobs, _) = logprobs_and_adapter_grads("llama", &decoder, &source);
    let mask = expected.tensor("mask").unwrap().data;
    let difference = worst(&logprobs, &expected.tensor("logprobs").unwrap().data, &mask);
    println!("grpo-made adapters: max |grpo − PEFT| log-prob {difference:e}");
    assert!(
        difference <= 1e-4,
        "grpo's adapters score {difference} away from PEFT's reading of them"
    );
}

#[test]
fn adapter_dropout_draws_masks_per_draw_and_keeps_gradients_exact() {
    let config = ModelConfig::from_file(parity("llama").join("config.json")).unwrap();
    let folder = AdapterFolder::read(&lora_fixture("llama").join("adapter"), &config).unwrap();
    let base = Safetensors::open_dir(parity("llama")).unwrap();
    let plain = Decoder::with_adapters(config.clone(), folder.lora.clone()).unwrap();
    let dropped = plain.clone().with_adapter_dropout(0.5, 7).unwrap();
    let mask = Safetensors::open_files(&[lora_fixture("llama").join("expected.safetensors")])
        .unwrap()
        .tensor("mask")
        .unwrap()
        .data;
    let run = |adapters: &std::collections::BTreeMap<String, grpo_model::weights::HostTensor>, draw| {
        let source = WithAdapters { base: &base, adapters };
        logprobs_and_adapter_grads_drawn("llama", &dropped, &source, draw)
    };

    // Without a draw number it is the evaluation forward: no dropout.
    let (evaluation, _) = run(&folder.tensors, None);
    let source = WithAdapters {
        base: &base,
        adapters: &folder.tensors,
    };
    let (want, _) = logprobs_and_adapter_grads("llama", &plain, &source);
    assert_eq!(evaluation, want);
    // One draw gives one set of masks; another draw others.
    let (first, grads) = run(&folder.tensors, Some(1));
    let (again, grads_again) = run(&folder.tensors, Some(1));
    let (second, _) = run(&folder.tensors, Some(2));
    assert_eq!((&first, &grads), (&again, &grads_again), "a draw's masks are fixed");
    // Recomputed layers draw the same masks: the same log-probs and gradients.
    let source = WithAdapters {
        base: &base,
        adapters: &folder.tensors,
    };
    let checkpointed = dropped.clone().with_layer_checkpoints(true);
    let (recomputed, recomputed_grads) = logprobs_and_adapter_grads_drawn("llama", &checkpointed, &source, Some(1));
    assert!(worst(&recomputed, &first, &mask) <= 1e-6);
    for (got, want) in recomputed_grads.iter().zip(&grads) {
        let scale = want.iter().map(|v| v.abs()).fold(1e-6f32, f32::max);
        let error = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
        assert!(
            error <= 1e-5 * scale,
            "checkpointed gradient off by {error} (scale {scale})"
        );
    }
    assert!(worst(&first, &second, &mask) > 1e-3, "other draws, other masks");
    assert!(worst(&first, &evaluation, &mask) > 1e-3, "dropout changes the forward");

    // Under fixed masks the gradient is the derivative: central differences
    // of the masked log-prob sum along the largest gradient entry of an adapter B.
    let total = |logprobs: &[f32]| -> f64 { logprobs.iter().zip(&mask).map(|(l, m)| f64::from(l * m)).sum() };
    let (index, spec) = dropped
        .adapter_parameters()
        .iter()
        .enumerate()
        .find(|(_, s)| s.name.ends_with("lora_B.weight"))
        .unwrap();
    let (at, &analytic) = grads[index]
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
        .unwrap();
    let eps = 1e-2f32;
    let moved = |delta: f32| {
        let mut adapters = folder.tensors.clone();
        adapters.get_mut(&spec.name).unwrap().data[at] += delta;
        total(&run(&adapters, Some(1)).0)
    };
    let numeric = (moved(eps) - moved(-eps)) / (2.0 * f64::from(eps));
    println!(
        "d/d{}[{at}]: autodiff {analytic}, central difference {numeric}",
        spec.name
    );
    assert!(
        (numeric - f64::from(analytic)).abs() <= 2e-2 * f64::from(analytic.abs()).max(1e-2),
        "autodiff {analytic} vs central difference {numeric}"
    );

    for bad in [-0.1, 1.0, f64::NAN] {
        assert!(plain.clone().with_adapter_dropout(bad, 0).is_err(), "{bad}");
    }
    assert!(
        Decoder::new(config).with_adapter_dropout(0.1, 0).is_err(),
        "no adapters, no dropout"
    );
}
