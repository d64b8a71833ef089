//! Generation through a KV cache: prefilling a prompt and then decoding one
//! token at a time gives the same logits as one forward over the whole
//! sequence (for every family: GQA, biases, q/k norms, llama3 RoPE) —
//! whether the prompt goes through the cache program or through
//! `prompt_kv` (padded, copied into row 1 of a two-row cache), and whether
//! decode reads the whole cache or only a window of it.

mod common;

use std::path::Path;

use common::cpu_client;
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::weights::Safetensors;
use grpo_xla::trace::{Graph, Tensor};
use grpo_xla::{Buffer, Client, ElementType, Executable, Pred};

const CAPACITY: i64 = 32;
/// Positions decode reads: enough for the 12 test tokens, less than the capacity.
const WINDOW: i64 = 16;

fn params(graph: &Graph, decoder: &Decoder) -> Vec<Tensor> {
    decoder.parameter_tensors(graph, ElementType::F32).unwrap()
}

/// `(params, ids [rows, t], positions [rows, t], cache…) → (logits, cache…)`
/// over a cache of `rows` rows, attending within `window`.
fn cached_program(client: &Client, decoder: &Decoder, rows: i64, t: i64, window: i64) -> Executable {
    let graph = Graph::new(&format!("cached_{rows}x{t}_{window}"));
    let p = params(&graph, decoder);
    let ids = graph.parameter(ElementType::S32, &[rows, t]).unwrap();
    let positions = graph.parameter(ElementType::S32, &[rows, t]).unwrap();
    let cache = cache_parameters(&graph, decoder, rows);
    let (logits, cache) = decoder.logits_with_cache(&p, &ids, &positions, &cache, window).unwrap();
    let mut outputs = vec![&logits];
    outputs.extend(cache.iter());
    graph.build(&outputs).unwrap().compile(client).unwrap()
}

fn cache_parameters(graph: &Graph, decoder: &Decoder, rows: i64) -> Vec<Tensor> {
    decoder
        .cache_types(rows, CAPACITY, ElementType::F32)
        .iter()
        .map(|ty| graph.parameter(ty.dtype, &ty.dims).unwrap())
        .collect()
}

/// `(params, ids [1, t], positions [1, t], cache…) → cache…`: the prompt's
/// keys and values from `prompt_kv`, written into row 1 from position 0.
fn prompt_program(client: &Client, decoder: &Decoder, t: i64) -> Executable {
    let graph = Graph::new(&format!("prompt_{t}"));
    let p = params(&graph, decoder);
    let ids = graph.parameter(ElementType::S32, &[1, t]).unwrap();
    let positions = graph.parameter(ElementType::S32, &[1, t]).unwrap();
    let cache = cache_parameters(&graph, decoder, 2);
    let kv = decoder.prompt_kv(&p, &ids, &positions).unwrap();
    let (one, zero) = (
        graph.scalar(1.0, ElementType::S32).unwrap(),
        graph.scalar(0.0, ElementType::S32).unwrap(),
    );
    let written: Vec<Tensor> = cache
        .iter()
        .zip(&kv)
        .map(|(c, new)| c.dynamic_update_slice(new, &[&one, &zero, &zero, &zero]).unwrap())
        .collect();
    graph
        .build(&written.iter().collect::<Vec<_>>())
        .unwrap()
        .compile(client)
        .unwrap()
}

fn check(family: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parity")
        .join(family);
    let decoder = Decoder::new(ModelConfig::from_file(dir.join("config.json")).unwrap());
    let client = cpu_client();
    let device = client.device(0).unwrap();
    let weights = upload_parameters(
        &client,
        device,
        &decoder,
        &Safetensors::open_dir(&dir).unwrap(),
        ElementType::F32,
    )
    .unwrap();
    let ids: Vec<i32> = vec![5, 17, 99, 3, 64, 120, 7, 7, 42, 0, 88, 11];
    let n = ids.len() as i64;
    let vocab = decoder.config().vocab_size;

    // One forward over the whole sequence.
    let graph = Graph::new("full");
    let p = params(&graph, &decoder);
    let ids_t = graph.parameter(ElementType::S32, &[1, n]).unwrap();
    let positions_t = graph.parameter(ElementType::S32, &[1, n]).unwrap();
    let mask_t = graph.parameter(ElementType::Pred, &[1, n]).unwrap();
    let logits = decoder.logits(&p, &ids_t, &positions_t, &mask_t).unwrap();
    let full = graph.build(&[&logits]).unwrap().compile(&client).unwrap();
    let upload_i32 = |v: &[i32]| client.buffer_from_host(v, &[1, v.len() as i64], device).unwrap();
    let positions: Vec<i32> = (0..n as i32).collect();
    let mask = client
        .buffer_from_host(&vec![Pred::from(true); n as usize], &[1, n], device)
        .unwrap();
    let (ids_b, positions_b) = (upload_i32(&ids), upload_i32(&positions));
    let mut args: Vec<&Buffer> = weights.iter().collect();
    args.extend([&ids_b, &positions_b, &mask]);
    let want = full.execute(&args).unwrap()[0].to_host::<f32>().unwrap();

    let zero_cache = |rows: i64| -> Vec<Buffer> {
        decoder
            .cache_types(rows, CAPACITY, ElementType::F32)
            .iter()
            .map(|ty| {
                client
                    .buffer_from_host(&vec![0.0f32; ty.element_count()], &ty.dims, device)
                    .unwrap()
            })
            .collect()
    };
    let run = |program: &Executable, inputs: &[&Buffer], cache: Vec<Buffer>, outputs_before_cache: usize| {
        let mut args: Vec<&Buffer> = weights.iter().collect();
        args.extend(inputs);
        args.extend(cache.iter());
        let mut out = program.execute(&args).unwrap();
        let cache = out.split_off(outputs_before_cache);
        (out, cache)
    };
    let compare = |got: &[f32], want: &[f32], path: &str| {
        assert_eq!(got.len(), want.len());
        let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
        assert!(
            worst < 1e-4,
            "{family} ({path}): cached and full logits differ by {worst}"
        );
    };

    // Prefill 5 tokens through the cache program, then decode the rest one at a time.
    let mut cache = zero_cache(1);
    let mut got = Vec::new();
    let prefill = cached_program(&client, &decoder, 1, 5, CAPACITY);
    let decode = cached_program(&client, &decoder, 1, 1, CAPACITY);
    let mut start = 0usize;
    for (program, len) in std::iter::once((&prefill, 5)).chain(std::iter::repeat_n((&decode, 1), ids.len() - 5)) {
        let (chunk_ids, chunk_positions) = (
            upload_i32(&ids[start..start + len]),
            upload_i32(&positions[start..start + len]),
        );
        let (out, next) = run(program, &[&chunk_ids, &chunk_positions], cache, 1);
        cache = next;
        got.extend(out[0].to_host::<f32>().unwrap());
        start += len;
    }
    assert_eq!(got.len(), ids.len() * vocab);
    compare(&got, &want, "cache program prefill");

    // Prompt keys of 5 tokens padded to 8 into row 1; decode the rest in a
    // window of the cache (row 0 idle at position −1 every step).
    let padded_ids = [&ids[..5], &[0; 3]].concat();
    let padded_positions = [&positions[..5], &[-1; 3]].concat();
    let (_, mut cache) = run(
        &prompt_program(&client, &decoder, 8),
        &[&upload_i32(&padded_ids), &upload_i32(&padded_positions)],
        zero_cache(2),
        0,
    );
    let decode = cached_program(&client, &decoder, 2, 1, WINDOW);
    let upload_rows = |v: [i32; 2]| client.buffer_from_host(&v, &[2, 1], device).unwrap();
    let mut got = Vec::new();
    for (position, &id) in ids.iter().enumerate().skip(5) {
        let (step_ids, step_positions) = (upload_rows([0, id]), upload_rows([-1, position as i32]));
        let (out, next) = run(&decode, &[&step_ids, &step_positions], cache, 1);
        cache = next;
        got.extend_from_slice(&out[0].to_host::<f32>().unwrap()[vocab..]);
    }
    compare(&got, &want[5 * vocab..], "prompt_kv prefill, windowed decode");
}

#[test]
fn llama_decodes_through_the_cache() {
    check("llama");
}

#[test]
fn qwen2_decodes_through_the_cache() {
    check("qwen2");
}

#[test]
fn qwen3_decodes_through_the_cache() {
    check("qwen3");
}

#[test]
fn mistral_decodes_through_the_cache() {
    check("mistral");
}

#[test]
fn phi3_decodes_through_the_cache() {
    check("phi3");
}

#[test]
fn gemma3_decodes_through_the_cache() {
    check("gemma3");
}

#[test]
fn gemma2_decodes_through_the_cache() {
    check("gemma2");
}

#[test]
fn qwen3_moe_decodes_through_the_cache() {
    check("qwen3_moe");
}
