//! Continuing finished samples in their slots (multi-turn episodes): a
//! request whose prompt extends a finished sample's tokens computes only
//! the new ones, and samples exactly what an engine that prefills every
//! prompt whole samples — same tokens, log-probs within 1e-5, penalties
//! included; a slot needed by other work evicts what it keeps (counted)
//! and the continuation is prefilled whole; new weights drop what is kept.

mod common;

use common::{cpu_client, fixture};
use grpo_model::config::ModelConfig;
use grpo_model::weights::HostTensor;
use grpo_rollout::engine::{Engine, EngineConfig, InFlight};
use grpo_rollout::output::Completion;
use grpo_rollout::request::{Request, SamplingParams};
use grpo_xla::{Client, ElementType};

/// A qwen3 fixture engine of `slots` slots, continuing finished samples or
/// not; it shares no prefixes between slots.
fn engine(client: &Client, slots: usize, continue_sequences: bool) -> Engine {
    engine_reusing(client, slots, continue_sequences, false)
}

/// A qwen3 fixture engine of `slots` slots, continuing finished samples
/// and sharing prefixes between slots, or not.
fn engine_reusing(client: &Client, slots: usize, continue_sequences: bool, share_prefixes: bool) -> Engine {
    let pretrained = grpo_model::pretrained::Pretrained::open(fixture("qwen3").to_str().unwrap()).unwrap();
    let decoder = grpo_model::decoder::Decoder::new(pretrained.config.clone());
    let params = grpo_model::load::upload_parameters(
        client,
        client.device(0).unwrap(),
        &decoder,
        pretrained.weights.as_ref(),
        ElementType::F32,
    )
    .unwrap();
    let config = EngineConfig {
        max_num_seqs: slots,
        max_model_len: 128,
        dtype: ElementType::F32,
        continue_sequences,
        share_prefixes,
        ..EngineConfig::default()
    };
    Engine::new(client, decoder, params, config).unwrap()
}

/// Sampling with every history-dependent setting in use.
fn params(seed: u32, n: usize) -> SamplingParams {
    SamplingParams {
        n,
        max_tokens: 7,
        temperature: 0.9,
        repetition_penalty: 1.3,
        presence_penalty: 0.5,
        frequency_penalty: 0.4,
        seed,
        ignore_eos: true,
        ..SamplingParams::default()
    }
}

/// Each request's next turn: its prompt, its first sample's tokens, then
/// an answer of `answer` tokens (as an environment's message would be).
fn next_turn(requests: &[Request], outputs: &[Vec<Completion>], answer: usize, seed: u32) -> Vec<Request> {
    requests
        .iter()
        .zip(outputs)
        .enumerate()
        .map(|(i, (request, samples))| {
            let reply = (0..answer + i).map(|j| (31 * j as u32 + 7 * i as u32 + 3) % 120);
            Request {
                prompt: request
                    .prompt
                    .iter()
                    .chain(&samples[0].tokens)
                    .copied()
                    .chain(reply)
                    .collect(),
                params: params(seed + i as u32, if i == 1 { 2 } else { 1 }),
            }
        })
        .collect()
}

/// Asserts that two engines sampled the same tokens with log-probs within 1e-5.
fn assert_same(continued: &[Vec<Completion>], whole: &[Vec<Completion>], turn: usize) {
    for (r, (a, b)) in continued.iter().zip(whole).enumerate() {
        for (s, (a, b)) in a.iter().zip(b).enumerate() {
            assert_eq!(a.tokens, b.tokens, "turn {turn}, request {r}, sample {s}");
            for (j, (x, y)) in a.logprobs.iter().zip(&b.logprobs).enumerate() {
                assert!(
                    (x - y).abs() < 1e-5,
                    "turn {turn}, request {r}, sample {s}, token {j}: continued {x}, prefilled {y}"
                );
            }
        }
    }
}

#[test]
fn continued_turns_compute_only_new_tokens_and_sample_as_a_whole_prefill() {
    let client = cpu_client();
    let mut continuing = engine(&client, 6, true);
    let mut prefilling = engine(&client, 6, false);
    let prompts: [&[u32]; 3] = [&[5, 17, 99], &[7, 7, 42, 120, 3], &[88, 11, 2, 9, 31, 77, 5, 100, 64]];
    let mut requests: Vec<Request> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            prompt: p.to_vec(),
            params: params(100 + i as u32, 1),
        })
        .collect();
    let mut kept_expected = 0;
    for turn in 0..4 {
        let a = continuing.generate(&requests).unwrap();
        let b = prefilling.generate(&requests).unwrap();
        assert_same(&a, &b, turn);
        let stats = continuing.stats();
        assert_eq!(stats.kept_prompt_tokens, kept_expected, "turn {turn}");
        assert_eq!(stats.evicted_sequences, 0);
        assert_eq!(prefilling.stats().kept_prompt_tokens, 0);
        assert_eq!(stats.prompt_tokens, prefilling.stats().prompt_tokens);
        // The next turn of each request continues its first sample, whose
        // slot holds the keys and values of all its tokens but the last.
        kept_expected += requests
            .iter()
            .zip(&a)
            .map(|(r, samples)| (r.prompt.len() + samples[0].tokens.len() - 1) as u64)
            .sum::<u64>();
        requests = next_turn(&requests, &a, 2 + turn, 200 + 10 * turn as u32);
    }
}

#[test]
fn a_needed_slot_evicts_what_it_keeps_and_the_continuation_is_prefilled_whole() {
    let client = cpu_client();
    let mut continuing = engine(&client, 2, true);
    let mut prefilling = engine(&client, 2, false);
    let first: Vec<Request> = [[3u32, 1, 4], [1, 5, 9]]
        .iter()
        .enumerate()
        .map(|(i, p)| Request {
            prompt: p.to_vec(),
            params: params(7 + i as u32, 1),
        })
        .collect();
    let a = continuing.generate(&first).unwrap();
    assert_same(&a, &prefilling.generate(&first).unwrap(), 0);
    // An unrelated request takes the slot of the sample that finished first.
    let other = [Request {
        prompt: vec![2, 6, 5, 3],
        params: params(9, 1),
    }];
    assert_same(
        &continuing.generate(&other).unwrap(),
        &prefilling.generate(&other).unwrap(),
        1,
    );
    assert_eq!(continuing.stats().evicted_sequences, 1);
    let second = next_turn(&first[..1], &a[..1], 3, 50)
        .into_iter()
        .chain(next_turn(&first[1..], &a[1..], 3, 60))
        .collect::<Vec<_>>();
    let continued = continuing.generate(&second).unwrap();
    assert_same(&continued, &prefilling.generate(&second).unwrap(), 2);
    // Exactly one of the two found its sample kept.
    let kept = continuing.stats().kept_prompt_tokens;
    let lengths: Vec<u64> = first
        .iter()
        .zip(&a)
        .map(|(r, s)| (r.prompt.len() + s[0].tokens.len() - 1) as u64)
        .collect();
    assert!(lengths.contains(&kept), "kept {kept} of {lengths:?}");
}

#[test]
fn new_weights_drop_what_slots_keep() {
    let client = cpu_client();
    let (mut continuing, mut prefilling) = (engine(&client, 2, true), engine(&client, 2, false));
    let first = [Request {
        prompt: vec![10, 20, 30],
        params: params(1, 1),
    }];
    let a = continuing.generate(&first).unwrap();
    prefilling.generate(&first).unwrap();
    let config = ModelConfig::from_file(fixture("qwen3").join("config.json")).unwrap();
    let weights: Vec<(String, HostTensor)> = grpo_model::init::random_weights(&config, 3)
        .unwrap()
        .into_iter()
        .collect();
    for engine in [&mut continuing, &mut prefilling] {
        engine.update_weights(1, &weights, InFlight::Keep).unwrap();
    }
    let second = next_turn(&first, &a, 2, 5);
    assert_same(
        &continuing.generate(&second).unwrap(),
        &prefilling.generate(&second).unwrap(),
        1,
    );
    assert_eq!(continuing.stats().kept_prompt_tokens, 0);
    assert_eq!(continuing.stats().evicted_sequences, 0);
}

/// Prompts of `prefix` (40 tokens) then each of `tails`.
fn sharing(prefix: &[u32], tails: &[&[u32]], seed: u32, n: usize) -> Vec<Request> {
    tails
        .iter()
        .enumerate()
        .map(|(i, tail)| Request {
            prompt: prefix.iter().chain(tail.iter()).copied().collect(),
            params: params(seed + i as u32, n),
        })
        .collect()
}

#[test]
fn prompts_copy_the_prefix_another_slot_holds_and_sample_as_a_whole_prefill() {
    let client = cpu_client();
    let mut sharing_engine = engine_reusing(&client, 6, false, true);
    let mut prefilling = engine(&client, 6, false);
    let prefix: Vec<u32> = (0..40).map(|j| (13 * j + 5) % 120).collect();
    // A first request alone: nothing to copy from.
    let first = sharing(&prefix, &[&[1, 2, 3]], 10, 1);
    assert_same(
        &sharing_engine.generate(&first).unwrap(),
        &prefilling.generate(&first).unwrap(),
        0,
    );
    assert_eq!(sharing_engine.stats().copied_prompt_tokens, 0);
    // Two requests (one of two samples) copy the 40 tokens the kept sample
    // holds; a prompt sharing only 10 tokens (under the minimum) is prefilled whole.
    let mut second = sharing(&prefix, &[&[9, 9], &[4, 5, 6, 7]], 20, 2);
    second.push(Request {
        prompt: prefix[..10].iter().chain(&[77, 78, 79]).copied().collect(),
        params: params(30, 1),
    });
    assert_same(
        &sharing_engine.generate(&second).unwrap(),
        &prefilling.generate(&second).unwrap(),
        1,
    );
    assert_eq!(sharing_engine.stats().copied_prompt_tokens, 2 * 40);
    assert_eq!(sharing_engine.stats().evicted_sequences, 0);
    // A request arriving while another runs copies from the running slot:
    // the prefix and the part of the running one's tail it shares.
    let running = sharing(&prefix, &[&[50, 51, 52, 53, 54]], 40, 1);
    let joining = sharing(&prefix, &[&[50, 51, 52, 60]], 41, 1);
    let before = sharing_engine.stats().copied_prompt_tokens;
    let outputs = [&mut sharing_engine, &mut prefilling].map(|engine| {
        let first = engine.add_request(running[0].clone()).unwrap();
        engine.step().unwrap();
        engine.add_request(joining[0].clone()).unwrap();
        let mut done = Vec::new();
        while engine.has_work() {
            let updates = engine.step().unwrap();
            done.extend(updates.into_iter().filter_map(|u| u.finished.map(|c| (u.request, c))));
        }
        // The running request's sample, then the joining one's.
        done.sort_by_key(|(request, _)| *request != first);
        done.into_iter().map(|(_, c)| vec![c]).collect::<Vec<_>>()
    });
    // The first copies the 40 tokens the kept samples hold (evicting one of
    // them: every slot keeps one); the second, the 40 and the 3 tokens of
    // the tail it shares with the running one.
    assert_eq!(sharing_engine.stats().copied_prompt_tokens - before, 40 + 43);
    assert_same(&outputs[0], &outputs[1], 2);
}
