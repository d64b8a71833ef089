//! The engine's routing against the learner's: the experts each token of
//! the Qwen3-MoE fixture is routed to when the engine's programs prefill a
//! prompt and decode the rest one token at a time through the KV cache,
//! and when a scoring forward (the learner's) runs over the whole
//! sequences. With f32 weights on both sides they agree on every token of
//! every sparse layer; with the engine in bf16 the mismatch rate is
//! measured and bounded.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::cpu_client;
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::{upload_parameters, upload_values};
use grpo_model::weights::Safetensors;
use grpo_xla::trace::{Graph, Tensor};
use grpo_xla::{Buffer, Client, ElementType, Pred};

const ROWS: usize = 8;
const LENGTH: usize = 24;
const PROMPT: usize = 8;
const CAPACITY: i64 = 32;

fn fixture() -> (Decoder, Safetensors) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/parity/qwen3_moe");
    let decoder = Decoder::new(ModelConfig::from_file(dir.join("config.json")).unwrap());
    (decoder, Safetensors::open_dir(&dir).unwrap())
}

/// Token ids of the test rows (the fixture's vocabulary is 128).
fn rows() -> Vec<Vec<i32>> {
    (0..ROWS)
        .map(|r| (0..LENGTH).map(|t| ((r * 37 + t * t * 11 + 5) % 128) as i32).collect())
        .collect()
}

/// Per (sparse layer, row, token): the set of experts chosen, from a
/// `[layers, rows, tokens, k]` output.
fn sets(choices: &[i32], layers: usize, tokens: usize, k: usize) -> Vec<Vec<Vec<BTreeSet<i32>>>> {
    let mut chunks = choices.chunks(k);
    (0..layers)
        .map(|_| {
            (0..ROWS)
                .map(|_| {
                    (0..tokens)
                        .map(|_| chunks.next().unwrap().iter().copied().collect())
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The learner's routing: one scoring forward over the whole rows, f32.
fn scoring_routes(client: &Client, decoder: &Decoder, weights: &[Buffer]) -> Vec<i32> {
    let graph = Graph::new("scoring_routes");
    let params = decoder.parameter_tensors(&graph, ElementType::F32).unwrap();
    let dims = [ROWS as i64, LENGTH as i64];
    let ids = graph.parameter(ElementType::S32, &dims).unwrap();
    let mask = graph.parameter(ElementType::Pred, &dims).unwrap();
    let choices = decoder.expert_choices(&params, &ids, &mask).unwrap();
    let program = graph.build(&[&choices]).unwrap().compile(client).unwrap();
    let device = client.device(0).unwrap();
    let ids = client.buffer_from_host(&rows().concat(), &dims, device).unwrap();
    let mask = client
        .buffer_from_host(&[Pred::from(true); ROWS * LENGTH], &dims, device)
        .unwrap();
    let mut args: Vec<&Buffer> = weights.iter().collect();
    args.extend([&ids, &mask]);
    program.execute(&args).unwrap()[0].to_host::<i32>().unwrap()
}

/// The engine's routing: the prompt prefilled through the cache, then one
/// token a step, with weights and cache in `dtype`; per step `[layers, rows, t, k]`.
fn engine_routes(client: &Client, decoder: &Decoder, weights: &[Buffer], dtype: ElementType) -> Vec<Vec<i32>> {
    let device = client.device(0).unwrap();
    let program = |t: i64| {
        let graph = Graph::new(&format!("engine_routes_{t}"));
        let params = decoder.parameter_tensors(&graph, dtype).unwrap();
        let ids = graph.parameter(ElementType::S32, &[ROWS as i64, t]).unwrap();
        let positions = graph.parameter(ElementType::S32, &[ROWS as i64, t]).unwrap();
        let cache: Vec<Tensor> = decoder
            .cache_types(ROWS as i64, CAPACITY, dtype)
            .iter()
            .map(|ty| graph.parameter(ty.dtype, &ty.dims).unwrap())
            .collect();
        let (_, cache, choices) = decoder
            .routed_logits_with_cache(&params, &ids, &positions, &cache, CAPACITY)
            .unwrap();
        let mut outputs = vec![&choices];
        outputs.extend(cache.iter());
        graph.build(&outputs).unwrap().compile(client).unwrap()
    };
    let mut cache: Vec<Buffer> = decoder
        .cache_types(ROWS as i64, CAPACITY, dtype)
        .iter()
        .map(|ty| {
            let count = ty.dims.iter().product::<i64>() as usize;
            upload_values(client, device, &vec![0.0; count], &ty.dims, dtype).unwrap()
        })
        .collect();
    let all = rows();
    let mut steps = Vec::new();
    for (start, end) in std::iter::once((0, PROMPT)).chain((PROMPT..LENGTH).map(|t| (t, t + 1))) {
        let t = (end - start) as i64;
        let ids: Vec<i32> = all.iter().flat_map(|r| r[start..end].iter().copied()).collect();
        let positions: Vec<i32> = (0..ROWS).flat_map(|_| start as i32..end as i32).collect();
        let ids = client.buffer_from_host(&ids, &[ROWS as i64, t], device).unwrap();
        let positions = client.buffer_from_host(&positions, &[ROWS as i64, t], device).unwrap();
        let mut args: Vec<&Buffer> = weights.iter().collect();
        args.extend([&ids, &positions]);
        args.extend(cache.iter());
        let mut out = program(t).execute(&args).unwrap();
        cache = out.split_off(1);
        steps.push(out[0].to_host::<i32>().unwrap());
    }
    steps
}

/// The fraction of (sparse layer, token) whose experts differ between the
/// engine, run with weights in `dtype`, and the f32 scoring forward.
fn mismatch_rate(dtype: ElementType) -> f64 {
    let (decoder, source) = fixture();
    let client = cpu_client();
    let device = client.device(0).unwrap();
    let f32_weights = upload_parameters(&client, device, &decoder, &source, ElementType::F32).unwrap();
    let experts = decoder.config().experts.clone().unwrap();
    let layers = experts.sparse_layers.iter().filter(|&&s| s).count();
    let k = experts.top_k;
    let scored = sets(&scoring_routes(&client, &decoder, &f32_weights), layers, LENGTH, k);
    let weights = upload_parameters(&client, device, &decoder, &source, dtype).unwrap();
    let steps = engine_routes(&client, &decoder, &weights, dtype);
    let mut compared = 0;
    let mut differing = 0;
    let mut start = 0;
    for step in &steps {
        let tokens = step.len() / (layers * ROWS * k);
        let engine = sets(step, layers, tokens, k);
        for (layer, rows) in engine.iter().enumerate() {
            for (row, tokens) in rows.iter().enumerate() {
                for (t, chosen) in tokens.iter().enumerate() {
                    compared += 1;
                    differing += usize::from(chosen != &scored[layer][row][start + t]);
                }
            }
        }
        start += tokens;
    }
    assert_eq!(
        compared,
        layers * ROWS * LENGTH,
        "every token of every sparse layer compared"
    );
    let rate = differing as f64 / compared as f64;
    println!("{dtype} engine vs f32 scoring forward: {differing} of {compared} routings differ ({rate:.3})");
    rate
}

#[test]
fn an_f32_engine_routes_every_token_as_the_learner_does() {
    assert_eq!(mismatch_rate(ElementType::F32), 0.0);
}

#[test]
fn a_bf16_engine_rarely_routes_a_token_elsewhere() {
    let rate = mismatch_rate(ElementType::Bf16);
    assert!(rate <= 0.05, "bf16 engine routes {rate:.3} of the tokens elsewhere");
}
