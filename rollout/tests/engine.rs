//! The engine on the tiny fixture models: a batch gives each request the
//! tokens it gets alone, returned log-probs equal the log-prob program's,
//! steady state compiles nothing, bad requests are refused.

mod common;

use common::{cpu_client, fixture};
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::logprobs::LogprobsRunner;
use grpo_model::weights::Safetensors;
use grpo_rollout::Error;
use grpo_rollout::engine::{Engine, FinishReason, Request, SamplingParams};
use grpo_xla::{Client, ElementType};

fn engine(client: &Client, family: &str, max_num_seqs: usize) -> Engine {
    common::engine(client, fixture(family).to_str().unwrap(), max_num_seqs, 64)
}

fn requests() -> Vec<Request> {
    let prompts: [&[u32]; 4] = [
        &[5],
        &[17, 99, 3, 64, 120],
        &[7, 7, 42],
        &[88, 11, 2, 9, 31, 77, 5, 100, 64],
    ];
    prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            prompt: p.to_vec(),
            params: SamplingParams {
                max_tokens: 6 + i,
                temperature: if i % 2 == 0 { 0.0 } else { 0.9 },
                top_k: if i == 3 { 20 } else { 0 },
                top_p: if i == 1 { 0.9 } else { 1.0 },
                seed: 1000 + i as u32,
                ..SamplingParams::default()
            },
        })
        .collect()
}

#[test]
fn a_batch_gives_each_request_the_tokens_it_gets_alone() {
    let client = cpu_client();
    for family in ["llama", "qwen2", "qwen3"] {
        let mut together = engine(&client, family, 4);
        let batch = together.generate(&requests()).unwrap();
        let mut alone = engine(&client, family, 1);
        for (request, in_batch) in requests().iter().zip(&batch) {
            let single = alone.generate(std::slice::from_ref(request)).unwrap().remove(0);
            assert_eq!(single.tokens, in_batch.tokens, "{family}: {request:?}");
            assert_eq!(in_batch.tokens.len(), request.params.max_tokens);
            assert_eq!(in_batch.finish_reason, FinishReason::Length);
            for (a, b) in single.logprobs.iter().zip(&in_batch.logprobs) {
                assert!((a - b).abs() < 1e-4, "{family}: log-prob {a} alone vs {b} in a batch");
            }
        }
    }
}

#[test]
fn requests_join_as_slots_free_up_and_still_match_running_alone() {
    let client = cpu_client();
    // Seven requests of different lengths through three slots: later ones join mid-flight.
    let many: Vec<Request> = (0..7)
        .map(|i| Request {
            prompt: (0..1 + i as u32 * 2)
                .map(|t| (t * 37 + i as u32 * 11) % 127 + 1)
                .collect(),
            params: SamplingParams {
                max_tokens: 3 + (i * 5) % 9,
                temperature: if i % 3 == 0 { 0.0 } else { 1.1 },
                seed: 77 + i as u32,
                ..SamplingParams::default()
            },
        })
        .collect();
    let mut three = engine(&client, "llama", 3);
    let together = three.generate(&many).unwrap();
    let mut alone = engine(&client, "llama", 1);
    for (request, joined) in many.iter().zip(&together) {
        let single = alone.generate(std::slice::from_ref(request)).unwrap().remove(0);
        assert_eq!(single.tokens, joined.tokens, "{request:?}");
        assert_eq!(joined.tokens.len(), request.params.max_tokens);
    }
}

#[test]
fn returned_log_probs_equal_the_log_prob_program() {
    let client = cpu_client();
    let mut engine = engine(&client, "qwen3", 4);
    let completions = engine.generate(&requests()).unwrap();
    let dir = fixture("qwen3");
    let decoder = Decoder::new(ModelConfig::from_file(dir.join("config.json")).unwrap());
    let weights = Safetensors::open_dir(&dir).unwrap();
    let params = upload_parameters(&client, client.device(0).unwrap(), &decoder, &weights, ElementType::F32).unwrap();
    let runner = LogprobsRunner::new(&client, decoder, ElementType::F32);
    let sequences: Vec<Vec<u32>> = requests()
        .iter()
        .zip(&completions)
        .map(|(r, c)| [r.prompt.clone(), c.tokens.clone()].concat())
        .collect();
    let scored = runner.run(&params, &sequences).unwrap();
    for ((request, completion), stats) in requests().iter().zip(&completions).zip(&scored) {
        let start = request.prompt.len() - 1;
        for (i, lp) in completion.logprobs.iter().enumerate() {
            let want = stats.logprobs[start + i];
            assert!((lp - want).abs() < 1e-4, "token {i}: engine {lp}, logprobs {want}");
        }
    }
}

#[test]
fn steady_state_compiles_nothing_and_stop_tokens_end_a_completion() {
    let client = cpu_client();
    let mut engine = engine(&client, "llama", 4);
    let first = engine.generate(&requests()).unwrap();
    let compiled = client.compile_stats().compiles;
    let again = engine.generate(&requests()).unwrap();
    assert_eq!(
        client.compile_stats().compiles,
        compiled,
        "no recompiles in steady state"
    );
    assert_eq!(first, again, "same seeds, same weights, same tokens");
    // A stop token ends the greedy completion at its first occurrence, inclusive.
    let mut request = requests().remove(0);
    let stop = first[0].tokens[1];
    let until = first[0].tokens.iter().position(|&t| t == stop).unwrap();
    request.params.stop_token_ids = vec![stop];
    let stopped = engine.generate(&[request]).unwrap().remove(0);
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.tokens, first[0].tokens[..=until]);
}

#[test]
fn bad_requests_are_refused_naming_the_problem() {
    let client = cpu_client();
    let mut engine = engine(&client, "qwen2", 2);
    let good = requests().remove(0);
    let bad = |f: &dyn Fn(&mut Request)| {
        let mut r = good.clone();
        f(&mut r);
        r
    };
    let cases = [
        (bad(&|r| r.prompt.clear()), "empty"),
        (bad(&|r| r.prompt = vec![1; 64]), "max_model_len"),
        (bad(&|r| r.prompt = vec![500]), "vocabulary"),
        (bad(&|r| r.params.max_tokens = 0), "max_tokens"),
        (bad(&|r| r.params.temperature = -1.0), "temperature"),
        (bad(&|r| r.params.top_p = 0.0), "top_p"),
        (bad(&|r| r.params.top_p = 1.5), "top_p"),
        (bad(&|r| r.params.min_p = 1.0), "min_p"),
    ];
    for (request, needle) in cases {
        let error = engine.generate(&[good.clone(), request]).unwrap_err();
        assert!(matches!(error, Error::InvalidRequest { index: 1, .. }), "{error}");
        assert!(error.to_string().contains(needle), "{error} should mention {needle}");
    }
    assert_eq!(engine.generate(&[good]).unwrap().len(), 1, "the engine keeps serving");
}
