//! Generation through a KV cache: prefilling a prompt and then decoding one
//! token at a time gives the same logits as one forward over the whole
//! sequence (for every family: GQA, biases, q/k norms, llama3 RoPE).

mod common;

use std::path::Path;

use common::cpu_client;
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::weights::Safetensors;
use grpo_xla::trace::{Graph, Tensor};
use grpo_xla::{Buffer, Client, ElementType, Executable, Pred};

const CAPACITY: i64 = 16;

fn params(graph: &Graph, decoder: &Decoder) -> Vec<Tensor> {
    decoder.parameter_tensors(graph, ElementType::F32).unwrap()
}

/// `(params, ids [1, t], positions [1, t], cache…) → (logits, cache…)`.
fn cached_program(client: &Client, decoder: &Decoder, t: i64) -> Executable {
    let graph = Graph::new(&format!("cached_{t}"));
    let p = params(&graph, decoder);
    let ids = graph.parameter(ElementType::S32, &[1, t]).unwrap();
    let positions = graph.parameter(ElementType::S32, &[1, t]).unwrap();
    let cache: Vec<Tensor> = decoder
        .cache_types(1, CAPACITY, ElementType::F32)
        .iter()
        .map(|ty| graph.parameter(ty.dtype, &ty.dims).unwrap())
        .collect();
    let (logits, cache) = decoder.logits_with_cache(&p, &ids, &positions, &cache).unwrap();
    let mut outputs = vec![&logits];
    outputs.extend(cache.iter());
    graph.build(&outputs).unwrap().compile(client).unwrap()
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

    // Prefill 5 tokens, then decode the rest one at a time.
    let mut cache: Vec<Buffer> = decoder
        .cache_types(1, CAPACITY, ElementType::F32)
        .iter()
        .map(|ty| {
            client
                .buffer_from_host(&vec![0.0f32; ty.element_count()], &ty.dims, device)
                .unwrap()
        })
        .collect();
    let mut got = Vec::new();
    let prefill = cached_program(&client, &decoder, 5);
    let decode = cached_program(&client, &decoder, 1);
    let mut start = 0usize;
    for (program, len) in std::iter::once((&prefill, 5)).chain(std::iter::repeat_n((&decode, 1), ids.len() - 5)) {
        let (chunk_ids, chunk_positions) = (
            upload_i32(&ids[start..start + len]),
            upload_i32(&positions[start..start + len]),
        );
        let mut args: Vec<&Buffer> = weights.iter().collect();
        args.extend([&chunk_ids, &chunk_positions]);
        args.extend(cache.iter());
        let mut out = program.execute(&args).unwrap();
        cache = out.split_off(1);
        got.extend(out[0].to_host::<f32>().unwrap());
        start += len;
    }
    assert_eq!(got.len(), ids.len() * vocab);
    let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "{family}: cached and full logits differ by {worst}");
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
