//! The engine on the tiny fixture models: a batch gives each request the
//! tokens it gets alone, the samples of a group (one prefill) match
//! separate requests, returned log-probs equal the log-prob program's,
//! steady state compiles nothing, aborts free their slots, weight updates
//! take effect between steps (or are refused whole), LoRA adapters applied
//! beside the base generate as the merged model does, bad requests are
//! refused while the engine keeps serving.

mod common;

use common::{cpu_client, fixture};
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::logprobs::LogprobsRunner;
use grpo_model::lora::{AdapterFolder, Merged};
use grpo_model::weights::{HostTensor, Safetensors};
use grpo_rollout::Error;
use grpo_rollout::engine::{Engine, InFlight};
use grpo_rollout::output::{Completion, FinishReason, StopReason};
use grpo_rollout::request::{LogprobsMode, Request, SamplingParams};
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
                ignore_eos: true,
                ..SamplingParams::default()
            },
        })
        .collect()
}

/// The only sample of each request.
fn singles(outputs: Vec<Vec<Completion>>) -> Vec<Completion> {
    outputs
        .into_iter()
        .map(|mut samples| {
            assert_eq!(samples.len(), 1);
            samples.remove(0)
        })
        .collect()
}

#[test]
fn a_batch_gives_each_request_the_tokens_it_gets_alone() {
    let client = cpu_client();
    for family in ["llama", "qwen2", "qwen3", "phi3", "gemma3", "gemma2"] {
        let mut together = engine(&client, family, 4);
        let batch = singles(together.generate(&requests()).unwrap());
        let mut alone = engine(&client, family, 1);
        for (request, in_batch) in requests().iter().zip(&batch) {
            let single = singles(alone.generate(std::slice::from_ref(request)).unwrap()).remove(0);
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
                ignore_eos: true,
                ..SamplingParams::default()
            },
        })
        .collect();
    let mut three = engine(&client, "llama", 3);
    let together = singles(three.generate(&many).unwrap());
    let mut alone = engine(&client, "llama", 1);
    for (request, joined) in many.iter().zip(&together) {
        let single = singles(alone.generate(std::slice::from_ref(request)).unwrap()).remove(0);
        assert_eq!(single.tokens, joined.tokens, "{request:?}");
        assert_eq!(joined.tokens.len(), request.params.max_tokens);
    }
}

#[test]
fn the_samples_of_a_group_match_separate_requests() {
    let client = cpu_client();
    let mut engine = engine(&client, "qwen2", 8);
    let group = Request {
        prompt: vec![17, 99, 3, 64, 120, 8, 41],
        params: SamplingParams {
            n: 5,
            max_tokens: 9,
            temperature: 1.0,
            seed: 4242,
            ignore_eos: true,
            ..SamplingParams::default()
        },
    };
    let samples = engine.generate(std::slice::from_ref(&group)).unwrap().remove(0);
    assert_eq!(samples.len(), 5);
    let stats = engine.stats();
    assert_eq!(
        (stats.prompt_tokens, stats.shared_prompt_tokens),
        (35, 28),
        "one prefill for five samples"
    );
    assert_eq!(stats.generated_tokens, 45);
    let separate: Vec<Request> = (0..5)
        .map(|i| Request {
            prompt: group.prompt.clone(),
            params: SamplingParams {
                n: 1,
                seed: group.params.sample_seed(i),
                ..group.params.clone()
            },
        })
        .collect();
    let alone = singles(engine.generate(&separate).unwrap());
    for (i, (sample, single)) in samples.iter().zip(&alone).enumerate() {
        assert_eq!(sample.index, i);
        assert_eq!(sample.tokens, single.tokens, "sample {i}");
    }
    let distinct: std::collections::HashSet<&Vec<u32>> = samples.iter().map(|s| &s.tokens).collect();
    assert!(distinct.len() > 1, "the samples of a group draw different tokens");
}

#[test]
fn returned_log_probs_equal_the_log_prob_program() {
    let client = cpu_client();
    let mut engine = engine(&client, "qwen3", 4);
    let completions = singles(engine.generate(&requests()).unwrap());
    let scored = score(&client, &requests(), &completions, 1.0);
    assert_same_log_probs(&completions, &scored, "raw");
}

#[test]
fn processed_log_probs_equal_the_log_prob_program_at_the_temperature() {
    let client = cpu_client();
    let mut engine = engine(&client, "qwen3", 4);
    let warm: Vec<Request> = requests()
        .into_iter()
        .map(|mut r| {
            r.params.temperature = 1.6;
            r.params.logprobs_mode = LogprobsMode::Processed;
            r
        })
        .collect();
    let completions = singles(engine.generate(&warm).unwrap());
    assert_same_log_probs(&completions, &score(&client, &warm, &completions, 1.6), "processed");
    let raw = score(&client, &warm, &completions, 1.0);
    let differ = completions
        .iter()
        .zip(&raw)
        .any(|(c, s)| c.logprobs.iter().zip(s).any(|(a, b)| (a - b).abs() > 1e-2));
    assert!(differ, "processed log-probs at 1.6 are not the raw ones");
}

/// The log-prob program's log-probs (at `temperature`) of each request's
/// completion tokens, given its prompt.
fn score(client: &Client, requests: &[Request], completions: &[Completion], temperature: f64) -> Vec<Vec<f32>> {
    let dir = fixture("qwen3");
    let decoder = Decoder::new(ModelConfig::from_file(dir.join("config.json")).unwrap());
    let weights = Safetensors::open_dir(&dir).unwrap();
    let params = upload_parameters(client, client.device(0).unwrap(), &decoder, &weights, ElementType::F32).unwrap();
    let runner = LogprobsRunner::new(client, decoder, ElementType::F32).at_temperature(temperature);
    let sequences: Vec<Vec<u32>> = requests
        .iter()
        .zip(completions)
        .map(|(r, c)| [r.prompt.clone(), c.tokens.clone()].concat())
        .collect();
    let scored = runner.run(&params, &sequences).unwrap();
    // Entry t of a sequence's log-probs scores token t + 1.
    requests
        .iter()
        .zip(scored)
        .map(|(r, stats)| stats.logprobs[r.prompt.len() - 1..].to_vec())
        .collect()
}

/// Asserts that the engine returned the log-prob program's log-probs.
fn assert_same_log_probs(completions: &[Completion], scored: &[Vec<f32>], mode: &str) {
    for (completion, want) in completions.iter().zip(scored) {
        assert_eq!(completion.logprobs.len(), want.len());
        for (i, (lp, want)) in completion.logprobs.iter().zip(want).enumerate() {
            assert!(
                (lp - want).abs() < 1e-4,
                "{mode} token {i}: engine {lp}, logprobs {want}"
            );
        }
    }
}

#[test]
fn steady_state_compiles_nothing_and_stop_tokens_end_a_completion() {
    let client = cpu_client();
    let mut engine = engine(&client, "llama", 4);
    let first = singles(engine.generate(&requests()).unwrap());
    let compiled = client.compile_stats().compiles;
    let again = singles(engine.generate(&requests()).unwrap());
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
    let stopped = singles(engine.generate(std::slice::from_ref(&request)).unwrap()).remove(0);
    assert_eq!(stopped.finish_reason, FinishReason::Stop);
    assert_eq!(stopped.stop_reason, Some(StopReason::Token(stop)));
    assert_eq!(stopped.tokens, first[0].tokens[..=until]);
    // min_tokens holds the stop token back: the completion is longer than
    // `until + 1` and its first tokens never include the stop token.
    request.params.min_tokens = until + 2;
    let held = singles(engine.generate(&[request]).unwrap()).remove(0);
    assert!(held.tokens.len() >= until + 2, "{:?}", held.tokens);
    assert!(!held.tokens[..until + 1].contains(&stop), "{:?}", held.tokens);
}

#[test]
fn top_logprobs_are_the_most_likely_tokens_under_the_raw_policy() {
    let client = cpu_client();
    let mut engine = engine(&client, "llama", 2);
    let mut request = requests().remove(1);
    request.params.logprobs = Some(5);
    let sample = singles(engine.generate(&[request]).unwrap()).remove(0);
    for (step, top) in sample.top_logprobs.iter().enumerate() {
        assert_eq!(top.len(), 5);
        assert!(top.windows(2).all(|w| w[0].1 >= w[1].1), "most likely first: {top:?}");
        let drawn = sample.logprobs[step];
        assert!(drawn <= top[0].1 + 1e-6, "nothing beats the top token");
        if let Some((_, lp)) = top.iter().find(|(id, _)| *id == sample.tokens[step]) {
            assert!(
                (lp - drawn).abs() < 1e-5,
                "the drawn token's log-prob matches its top entry"
            );
        }
    }
}

#[test]
fn aborts_free_slots_at_once_and_a_thousand_short_requests_leave_nothing_behind() {
    let client = cpu_client();
    let mut engine = engine(&client, "llama", 2);
    let baseline = client.live_buffers();
    let long = |seed| Request {
        prompt: vec![3, 4, 5],
        params: SamplingParams {
            max_tokens: 40,
            seed,
            ignore_eos: true,
            ..SamplingParams::default()
        },
    };
    let running = engine.add_request(long(1)).unwrap();
    let other = engine.add_request(long(2)).unwrap();
    let waiting = engine.add_request(long(3)).unwrap();
    for _ in 0..3 {
        engine.step().unwrap();
    }
    assert_eq!((engine.stats().running, engine.stats().waiting), (2, 1));
    assert!(engine.abort(running) && engine.abort(waiting));
    assert!(!engine.abort(running), "a request is aborted once");
    assert_eq!(
        engine.stats().free_slots,
        1,
        "the aborted sample's slot is free at once"
    );
    let updates = engine.step().unwrap();
    let aborted: Vec<_> = updates
        .iter()
        .filter_map(|u| u.finished.as_ref().map(|c| (u.request, c)))
        .filter(|(_, c)| c.finish_reason == FinishReason::Abort)
        .collect();
    assert_eq!(aborted.len(), 2, "{updates:?}");
    let partial = aborted.iter().find(|(id, _)| *id == running).unwrap().1;
    assert_eq!(partial.tokens.len(), 3, "the tokens drawn before the abort are kept");
    assert!(aborted.iter().any(|(id, c)| *id == waiting && c.tokens.is_empty()));
    while engine.has_work() {
        for update in engine.step().unwrap() {
            assert_eq!(update.request, other);
        }
    }
    let short: Vec<Request> = (0..1000)
        .map(|i| Request {
            prompt: vec![1 + i % 100, 7],
            params: SamplingParams {
                max_tokens: 2,
                seed: i,
                ..SamplingParams::default()
            },
        })
        .collect();
    assert_eq!(engine.generate(&short).unwrap().len(), 1000);
    let stats = engine.stats();
    assert_eq!((stats.running, stats.waiting, stats.free_slots), (0, 0, 2));
    assert!(!engine.has_work());
    assert_eq!(client.live_buffers(), baseline, "no device buffer outlives its request");
}

/// The fixture's parameters replaced by freshly initialized ones (seed `seed`).
fn new_weights(family: &str, seed: u64) -> Vec<(String, HostTensor)> {
    let config = ModelConfig::from_file(fixture(family).join("config.json")).unwrap();
    grpo_model::init::random_weights(&config, seed)
        .unwrap()
        .into_iter()
        .collect()
}

#[test]
fn weight_updates_apply_between_steps_and_refused_ones_change_nothing() {
    let client = cpu_client();
    let mut request = requests().remove(0);
    request.params.max_tokens = 12;
    let before = singles(
        engine(&client, "llama", 2)
            .generate(std::slice::from_ref(&request))
            .unwrap(),
    )
    .remove(0);
    let update = new_weights("llama", 7);
    let mut reference = engine(&client, "llama", 2);
    reference.update_weights(1, &update, InFlight::Keep).unwrap();
    let after = singles(reference.generate(std::slice::from_ref(&request)).unwrap()).remove(0);
    assert_ne!(before.tokens, after.tokens, "the new weights generate differently");
    assert!(after.versions.iter().all(|&v| v == 1));

    // Mid-generation, keeping the sample: its first tokens are the old
    // weights', later ones carry version 1 and differ from the old run.
    let mut engine = engine(&client, "llama", 2);
    let id = engine.add_request(request.clone()).unwrap();
    for _ in 0..4 {
        engine.step().unwrap();
    }
    engine.update_weights(1, &update, InFlight::Keep).unwrap();
    let mut kept = None;
    while engine.has_work() {
        for u in engine.step().unwrap() {
            assert_eq!(u.request, id);
            kept = u.finished.or(kept);
        }
    }
    let kept = kept.unwrap();
    assert_eq!(kept.versions, [vec![0; 4], vec![1; 8]].concat());
    assert_eq!(kept.tokens[..4], before.tokens[..4]);
    assert_ne!(kept.tokens[4..], before.tokens[4..]);
    assert_eq!(engine.version(), 1);

    // Refused updates (unknown name, wrong shape, NaN) keep version 1's weights.
    let mut broken = update.clone();
    broken[0].0 = "model.layers.99.mlp.up_proj.weight".to_string();
    let mut misshapen = update.clone();
    misshapen[1].1 = HostTensor::new(vec![2, 2], vec![0.0; 4]).unwrap();
    let mut poisoned = update.clone();
    poisoned[2].1.data[0] = f32::NAN;
    for bad in [broken, misshapen, poisoned] {
        let error = engine.update_weights(2, &bad, InFlight::Keep).unwrap_err();
        assert!(matches!(error, Error::InvalidUpdate { version: 2, .. }), "{error}");
    }
    assert_eq!(engine.version(), 1);
    let still = singles(engine.generate(std::slice::from_ref(&request)).unwrap()).remove(0);
    assert_eq!(still.tokens, after.tokens, "the refused updates left version 1 serving");

    // Aborting in-flight samples on update.
    engine.add_request(request.clone()).unwrap();
    engine.step().unwrap();
    engine
        .update_weights(3, &new_weights("llama", 8), InFlight::Abort)
        .unwrap();
    let ended = engine.step().unwrap();
    assert!(
        ended
            .iter()
            .any(|u| u.finished.as_ref().unwrap().finish_reason == FinishReason::Abort)
    );
    assert!(!engine.has_work());
}

#[test]
fn weights_installed_on_the_device_generate_as_the_same_weights_from_the_host() {
    let client = cpu_client();
    let mut request = requests().remove(0);
    request.params.max_tokens = 12;
    let update = new_weights("llama", 7);
    let mut by_host = engine(&client, "llama", 2);
    by_host.update_weights(1, &update, InFlight::Keep).unwrap();
    let want = singles(by_host.generate(std::slice::from_ref(&request)).unwrap()).remove(0);

    let mut on_device = engine(&client, "llama", 2);
    let before = singles(on_device.generate(std::slice::from_ref(&request)).unwrap()).remove(0);
    let device = on_device.device().clone();
    let specs = on_device.decoder().parameters().to_vec();
    let upload = |values: &[f32], dims: &[usize]| {
        let dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        client.buffer_from_host(values, &dims, &device).unwrap()
    };
    let buffers = || -> Vec<grpo_xla::Buffer> {
        specs
            .iter()
            .map(|spec| {
                let (_, tensor) = update.iter().find(|(name, _)| name == &spec.name).unwrap();
                upload(&tensor.data, &spec.dims)
            })
            .collect()
    };
    // Refused: one missing, one misshapen, one in another dtype than the engine's.
    let mut short = buffers();
    short.pop();
    let mut misshapen = buffers();
    misshapen[1] = upload(&[0.0; 4], &[2, 2]);
    let mut halved = buffers();
    let (_, first) = update.iter().find(|(name, _)| name == &specs[0].name).unwrap();
    let values: Vec<half::bf16> = first.data.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let dims: Vec<i64> = specs[0].dims.iter().map(|&d| d as i64).collect();
    halved[0] = client.buffer_from_host(&values, &dims, &device).unwrap();
    for bad in [short, misshapen, halved] {
        let error = on_device.update_weights_on_device(1, bad, InFlight::Keep).unwrap_err();
        assert!(matches!(error, Error::InvalidUpdate { version: 1, .. }), "{error}");
    }
    assert_eq!(on_device.version(), 0);
    let same = singles(on_device.generate(std::slice::from_ref(&request)).unwrap()).remove(0);
    assert_eq!(same.tokens, before.tokens, "refused device updates changed nothing");

    on_device
        .update_weights_on_device(1, buffers(), InFlight::Keep)
        .unwrap();
    let got = singles(on_device.generate(std::slice::from_ref(&request)).unwrap()).remove(0);
    assert_eq!(got.tokens, want.tokens, "the same weights, the same tokens");
    assert_eq!(got.logprobs, want.logprobs);
    assert!(got.versions.iter().all(|&v| v == 1));
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
        (bad(&|r| r.params.stop_token_ids = vec![500]), "vocabulary"),
        (bad(&|r| r.params.max_tokens = 0), "max_tokens"),
        (bad(&|r| r.params.max_tokens = 64), "leaves 63"),
        (bad(&|r| r.params.n = 0), "n is 0"),
        (bad(&|r| r.params.n = 3), "max_num_seqs"),
        (bad(&|r| r.params.min_tokens = 7), "min_tokens"),
        (bad(&|r| r.params.temperature = -1.0), "temperature"),
        (bad(&|r| r.params.temperature = f32::NAN), "temperature"),
        (bad(&|r| r.params.top_p = 0.0), "top_p"),
        (bad(&|r| r.params.top_p = 1.5), "top_p"),
        (bad(&|r| r.params.min_p = 1.0), "min_p"),
        (bad(&|r| r.params.top_k = -1), "top_k"),
        (bad(&|r| r.params.presence_penalty = 3.0), "presence_penalty"),
        (bad(&|r| r.params.frequency_penalty = -2.5), "frequency_penalty"),
        (bad(&|r| r.params.repetition_penalty = 0.0), "repetition_penalty"),
        (bad(&|r| r.params.logprobs = Some(21)), "logprobs"),
        (bad(&|r| r.params.stop = vec!["x".to_string()]), "tokenizer"),
    ];
    for (request, needle) in cases {
        let error = engine.generate(&[good.clone(), request.clone()]).unwrap_err();
        assert!(matches!(error, Error::InvalidRequest { .. }), "{error}");
        let message = error.to_string();
        assert!(
            message.contains("request 1") && message.contains(needle),
            "{message} should name {needle}"
        );
        assert!(engine.add_request(request).is_err());
    }
    assert_eq!(engine.generate(&[good]).unwrap().len(), 1, "the engine keeps serving");
}

#[test]
fn bf16_engines_of_any_size_agree_and_stay_near_f32() {
    let client = cpu_client();
    let bf16 = |slots| {
        let pretrained = grpo_model::pretrained::Pretrained::open(fixture("llama").to_str().unwrap()).unwrap();
        let decoder = Decoder::new(pretrained.config.clone());
        let params = upload_parameters(
            &client,
            client.device(0).unwrap(),
            &decoder,
            pretrained.weights.as_ref(),
            ElementType::Bf16,
        )
        .unwrap();
        let config = grpo_rollout::engine::EngineConfig {
            max_num_seqs: slots,
            max_model_len: 64,
            dtype: ElementType::Bf16,
            ..grpo_rollout::engine::EngineConfig::default()
        };
        Engine::new(&client, decoder, params, config).unwrap()
    };
    let request = requests().remove(3);
    let one = singles(bf16(1).generate(std::slice::from_ref(&request)).unwrap()).remove(0);
    let four = singles(bf16(4).generate(&requests()).unwrap()).remove(3);
    assert_eq!(
        one.tokens, four.tokens,
        "a one-slot bf16 engine (two-row programs) matches a batch"
    );
    let f32 = singles(engine(&client, "llama", 1).generate(&[request]).unwrap()).remove(0);
    // Where both have drawn the same tokens so far, they score them alike.
    let same = one.tokens.iter().zip(&f32.tokens).take_while(|(a, b)| a == b).count();
    assert!(same > 0, "bf16 and f32 agree on the first greedy token");
    for (a, b) in one.logprobs[..same].iter().zip(&f32.logprobs) {
        assert!((a - b).abs() < 0.05, "bf16 log-prob {a} vs f32 {b}");
    }
}

#[test]
fn engines_on_two_devices_of_one_client_each_run_on_their_own_and_agree() {
    let client = Client::for_platform(
        grpo_xla::Platform::Cpu,
        grpo_xla::ClientOptions::default()
            .compile_cache_dir(None)
            .cpu_device_count(2),
    )
    .unwrap();
    let model = fixture("qwen2");
    let model = model.to_str().unwrap();
    let mut first = common::engine_on(&client, 0, model, 3, 64);
    let mut second = common::engine_on(&client, 1, model, 3, 64);
    assert_eq!(first.device(), client.device(0).unwrap());
    assert_eq!(second.device(), client.device(1).unwrap());
    let on_first = first.generate(&requests()).unwrap();
    let on_second = std::thread::scope(|scope| {
        let other = scope.spawn(|| second.generate(&requests()).unwrap());
        assert_eq!(
            first.generate(&requests()).unwrap(),
            on_first,
            "the same while the other device works"
        );
        other.join().unwrap()
    });
    assert_eq!(on_second, on_first, "the same tokens and log-probs on device 1");

    // Weights split over two devices are refused, naming both.
    let pretrained = grpo_model::pretrained::Pretrained::open(model).unwrap();
    let decoder = Decoder::new(pretrained.config.clone());
    let mut params = upload_parameters(
        &client,
        client.device(0).unwrap(),
        &decoder,
        pretrained.weights.as_ref(),
        ElementType::F32,
    )
    .unwrap();
    params[1] = params[1].copy_to_device(client.device(1).unwrap()).unwrap();
    let refused = Engine::new(&client, decoder, params, grpo_rollout::engine::EngineConfig::default());
    let message = refused.err().expect("refused").to_string();
    assert!(message.contains("one device"), "{message}");
}

#[test]
fn adapters_applied_beside_the_base_generate_as_the_merged_model_and_refused_ones_change_nothing() {
    let client = cpu_client();
    let adapters = fixture("llama").join("../../lora/llama/adapter");
    let config = ModelConfig::from_file(fixture("llama").join("config.json")).unwrap();
    let folder = AdapterFolder::read(&adapters, &config).unwrap();
    let update: Vec<(String, HostTensor)> = folder.tensors.clone().into_iter().collect();
    let requests = requests();

    // The reference: a plain engine on the weights with the adapters merged in.
    let base = Safetensors::open_dir(fixture("llama")).unwrap();
    let merged = Merged {
        base: &base,
        lora: &folder.lora,
        adapters: &folder.tensors,
    };
    let decoder = Decoder::new(config.clone());
    let device = client.device(0).unwrap();
    let params = upload_parameters(&client, device, &decoder, &merged, ElementType::F32).unwrap();
    let engine_config = grpo_rollout::engine::EngineConfig {
        max_num_seqs: 4,
        max_model_len: 64,
        ..Default::default()
    };
    let mut reference = Engine::new(&client, decoder, params, engine_config).unwrap();
    let want = singles(reference.generate(&requests).unwrap());

    let mut adapted = engine(&client, "llama", 4);
    adapted
        .update_adapters(1, &folder.lora, &update, InFlight::Keep)
        .unwrap();
    assert_eq!(adapted.decoder().lora(), Some(&folder.lora));
    let got = singles(adapted.generate(&requests).unwrap());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(
            g.tokens, w.tokens,
            "adapters beside the base draw what the merged model draws"
        );
        let worst = g
            .logprobs
            .iter()
            .zip(&w.logprobs)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst <= 1e-4, "log-probs {worst} apart");
        assert!(g.versions.iter().all(|&v| v == 1));
    }

    // Refused: a tensor the layout lacks, and another layout with a misshapen tensor.
    let mut broken = update.clone();
    broken[0].0 = "model.layers.0.mlp.up_proj.lora_C.weight".to_string();
    let error = adapted
        .update_adapters(2, &folder.lora, &broken, InFlight::Keep)
        .unwrap_err();
    assert!(matches!(error, Error::InvalidUpdate { version: 2, .. }), "{error}");
    let mut other = folder.lora.clone();
    other.rank = 2;
    let error = adapted.update_adapters(3, &other, &update, InFlight::Keep).unwrap_err();
    assert!(error.to_string().contains("shape"), "{error}");
    assert_eq!((adapted.version(), adapted.decoder().lora()), (1, Some(&folder.lora)));
    let still = singles(adapted.generate(&requests).unwrap());
    assert_eq!(
        still.iter().map(|c| &c.tokens).collect::<Vec<_>>(),
        got.iter().map(|c| &c.tokens).collect::<Vec<_>>(),
        "the refused updates left version 1's adapters serving"
    );
}
