//! An engine with adapter slots on the tiny llama fixture: requests of
//! different LoRA adapters (and none) share its batches, and each draws
//! what a plain engine on the weights with its adapter merged in (f64 on
//! the host) draws alone — also when they share a prompt, so a sample
//! never takes or continues keys and values another adapter computed.
//! Unloading ends an adapter's requests and frees its slot for another;
//! what the slots cannot take is refused and changes nothing.

mod common;

use std::collections::BTreeMap;

use common::{cpu_client, fixture};
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::lora::{AdapterFolder, LoraConfig, Merged, Targets, new_adapters};
use grpo_model::weights::{HostTensor, Safetensors};
use grpo_rollout::adapters::AdapterId;
use grpo_rollout::engine::{Engine, EngineConfig, InFlight};
use grpo_rollout::output::{Completion, FinishReason};
use grpo_rollout::request::{Request, SamplingParams};
use grpo_xla::{Client, ElementType};

/// A LoRA layout and its tensors.
#[derive(Clone)]
struct Adapter {
    lora: LoraConfig,
    tensors: BTreeMap<String, HostTensor>,
}

impl Adapter {
    fn list(&self) -> Vec<(String, HostTensor)> {
        self.tensors.clone().into_iter().collect()
    }
}

fn config() -> ModelConfig {
    ModelConfig::from_file(fixture("llama").join("config.json")).unwrap()
}

/// The PEFT-made fixture adapter (rank 4, α 8, every linear layer).
fn peft_adapter() -> Adapter {
    let folder = AdapterFolder::read(&fixture("llama").join("../../lora/llama/adapter"), &config()).unwrap();
    Adapter {
        lora: folder.lora,
        tensors: folder.tensors,
    }
}

/// An adapter of `rank` on `targets` with PEFT's `A` from `seed` and a
/// deterministic non-zero `B` (so it changes the model).
fn made_adapter(rank: usize, alpha: f64, targets: &[&str], use_rslora: bool, seed: u64) -> Adapter {
    let lora = LoraConfig {
        rank,
        alpha,
        targets: Targets::Modules(targets.iter().map(|t| t.to_string()).collect()),
        use_rslora,
    };
    let mut tensors = new_adapters(&lora.layers(&config()).unwrap(), rank, seed).unwrap();
    for (name, tensor) in tensors.iter_mut() {
        if name.ends_with("lora_B.weight") {
            for (i, v) in tensor.data.iter_mut().enumerate() {
                let h = (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15 ^ seed) >> 40;
                *v = (h % 2001) as f32 / 1000.0 - 1.0;
            }
        }
    }
    Adapter { lora, tensors }
}

/// A plain engine on the fixture's weights with `adapter` merged in (or none).
fn merged_engine(client: &Client, adapter: Option<&Adapter>, slots: usize) -> Engine {
    let config = config();
    let base = Safetensors::open_dir(fixture("llama")).unwrap();
    let decoder = Decoder::new(config);
    let device = client.device(0).unwrap();
    let params = match adapter {
        Some(a) => {
            let merged = Merged {
                base: &base,
                lora: &a.lora,
                adapters: &a.tensors,
            };
            upload_parameters(client, device, &decoder, &merged, ElementType::F32).unwrap()
        }
        None => upload_parameters(client, device, &decoder, &base, ElementType::F32).unwrap(),
    };
    let engine_config = EngineConfig {
        max_num_seqs: slots,
        max_model_len: 64,
        ..Default::default()
    };
    Engine::new(client, decoder, params, engine_config).unwrap()
}

/// An engine with `max_loras` adapter slots of rank up to 4 and `slots` sequences.
fn slotted_engine(client: &Client, max_loras: usize, slots: usize) -> Engine {
    let config = EngineConfig {
        max_num_seqs: slots,
        max_model_len: 64,
        max_loras,
        max_lora_rank: 4,
        ..Default::default()
    };
    let base = Safetensors::open_dir(fixture("llama")).unwrap();
    let decoder = Decoder::new(self::config());
    let params = upload_parameters(client, client.device(0).unwrap(), &decoder, &base, ElementType::F32).unwrap();
    Engine::new(client, decoder, params, config).unwrap()
}

fn request(prompt: &[u32], seed: u32, sampled: bool, adapter: Option<AdapterId>) -> Request {
    Request {
        prompt: prompt.to_vec(),
        params: SamplingParams {
            max_tokens: 8,
            temperature: if sampled { 0.8 } else { 0.0 },
            seed,
            ignore_eos: true,
            adapter,
            ..SamplingParams::default()
        },
    }
}

/// The only sample of each request.
fn singles(outputs: Vec<Vec<Completion>>) -> Vec<Completion> {
    outputs.into_iter().map(|mut s| s.remove(0)).collect()
}

/// `got` draws `want`'s tokens with log-probs within 1e-4.
fn assert_same(got: &Completion, want: &Completion, what: &str) {
    assert_eq!(got.tokens, want.tokens, "{what}: tokens");
    let worst = got
        .logprobs
        .iter()
        .zip(&want.logprobs)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(worst <= 1e-4, "{what}: log-probs {worst} apart");
}

/// The completion of `request` (its adapter cleared) from `engine` alone.
fn alone(engine: &mut Engine, request: &Request) -> Completion {
    let mut plain = request.clone();
    plain.params.adapter = None;
    singles(engine.generate(&[plain]).unwrap()).remove(0)
}

#[test]
fn requests_of_different_adapters_share_batches_and_each_draws_what_its_merged_model_draws() {
    let client = cpu_client();
    let (first, second) = (peft_adapter(), made_adapter(2, 3.0, &["q_proj", "v_proj"], true, 7));
    let mut engine = slotted_engine(&client, 2, 3);
    let a = engine.load_adapter(&first.lora, &first.list()).unwrap();
    let b = engine.load_adapter(&second.lora, &second.list()).unwrap();
    assert_ne!(a, b);
    assert_eq!(engine.stats().adapters, 2);
    let mut references = [
        merged_engine(&client, None, 1),
        merged_engine(&client, Some(&first), 1),
        merged_engine(&client, Some(&second), 1),
    ];
    let mut run = |engine: &mut Engine, requests: &[Request], what: &str| -> Vec<Completion> {
        let got = singles(engine.generate(requests).unwrap());
        for (i, (request, got)) in requests.iter().zip(&got).enumerate() {
            let reference = match request.params.adapter {
                None => 0,
                Some(id) if id == a => 1,
                Some(_) => 2,
            };
            let want = alone(&mut references[reference], request);
            assert_same(got, &want, &format!("{what}, request {i}"));
        }
        got
    };
    let copied = |engine: &Engine| engine.stats().copied_prompt_tokens;

    // A 20-token prompt, long enough to be copied between slots: answered
    // under a (slot 0 keeps it), then under b and the base in the empty
    // slots, which must not copy a's keys and values.
    let shared: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % 120 + 3).collect();
    let under_a = run(&mut engine, &[request(&shared, 1, false, Some(a))], "a alone");
    let pair = [request(&shared, 2, false, Some(b)), request(&shared, 3, false, None)];
    let under_b_and_base = run(&mut engine, &pair, "b beside the base");
    assert_eq!(copied(&engine), 0, "no prefix is copied across adapters");
    assert_ne!(under_a[0].tokens, under_b_and_base[0].tokens);
    assert_ne!(under_a[0].tokens, under_b_and_base[1].tokens);
    // Under b again: it takes slot 0 (evicting a's) and copies b's prefix.
    run(
        &mut engine,
        &[request(&shared, 4, true, Some(b))],
        "b sharing b's prefix",
    );
    assert_eq!(copied(&engine), 19, "a prefix is copied within an adapter");

    // Continuing the base's answer under a computes the whole prompt with a;
    // continuing it without an adapter continues the slot that keeps it.
    let mut continued = shared.clone();
    continued.extend(&under_b_and_base[1].tokens);
    run(
        &mut engine,
        &[request(&continued, 5, false, Some(a))],
        "a continuation under a",
    );
    assert_eq!(
        engine.stats().kept_prompt_tokens,
        0,
        "nothing continued across adapters"
    );
    run(
        &mut engine,
        &[request(&continued, 6, false, None)],
        "the base's continuation",
    );
    assert!(engine.stats().kept_prompt_tokens > 0);

    // One batch of three adapters (none, a, b), greedy and sampled.
    let mixed = [
        request(&[17, 99, 3, 64, 120], 7, true, None),
        request(&[7, 7, 42], 8, true, Some(b)),
        request(&[88, 11, 2, 9], 9, false, Some(a)),
    ];
    run(&mut engine, &mixed, "a mixed batch");
}

#[test]
fn unloading_ends_an_adapters_requests_and_frees_its_slot_for_another() {
    let client = cpu_client();
    let (first, third) = (peft_adapter(), made_adapter(3, 6.0, &["o_proj"], false, 11));
    let mut engine = slotted_engine(&client, 1, 2);
    let a = engine.load_adapter(&first.lora, &first.list()).unwrap();

    let running = engine.add_request(request(&[5, 6, 7], 1, false, Some(a))).unwrap();
    let base = engine.add_request(request(&[9, 10], 2, false, None)).unwrap();
    engine.step().unwrap();
    assert!(engine.unload_adapter(a));
    assert!(!engine.unload_adapter(a), "unloaded already");
    let mut finished = BTreeMap::new();
    while engine.has_work() {
        for update in engine.step().unwrap() {
            if let Some(done) = update.finished {
                finished.insert(update.request, done);
            }
        }
    }
    assert_eq!(finished[&running].finish_reason, FinishReason::Abort);
    assert_eq!(
        finished[&base].finish_reason,
        FinishReason::Length,
        "the base request ran on"
    );
    let error = engine.add_request(request(&[5], 3, false, Some(a))).unwrap_err();
    assert!(error.to_string().contains("no adapter"), "{error}");

    // The freed slot takes an adapter of another rank and layers: what
    // the first left in it is gone.
    let c = engine.load_adapter(&third.lora, &third.list()).unwrap();
    assert_ne!(a, c);
    let asked = request(&[88, 11, 2, 9, 31], 4, true, Some(c));
    let got = singles(engine.generate(std::slice::from_ref(&asked)).unwrap()).remove(0);
    let want = alone(&mut merged_engine(&client, Some(&third), 1), &asked);
    assert_same(&got, &want, "the adapter loaded into a freed slot");
}

#[test]
fn what_the_slots_cannot_take_is_refused_and_changes_nothing() {
    let client = cpu_client();
    let first = peft_adapter();
    let mut engine = slotted_engine(&client, 1, 1);

    let wide = made_adapter(8, 8.0, &["q_proj"], false, 3);
    let error = engine.load_adapter(&wide.lora, &wide.list()).unwrap_err();
    assert!(error.to_string().contains("max_lora_rank 4"), "{error}");

    let mut broken = first.list();
    broken[0].1 = HostTensor::new(vec![1, 1], vec![0.0]).unwrap();
    let error = engine.load_adapter(&first.lora, &broken).unwrap_err();
    assert!(error.to_string().contains("shape"), "{error}");
    let mut missing = first.list();
    missing.pop();
    let error = engine.load_adapter(&first.lora, &missing).unwrap_err();
    assert!(error.to_string().contains("lacks"), "{error}");
    assert_eq!(engine.stats().adapters, 0, "refused loads take no slot");

    engine.load_adapter(&first.lora, &first.list()).unwrap();
    let error = engine.load_adapter(&first.lora, &first.list()).unwrap_err();
    assert!(error.to_string().contains("max_loras"), "{error}");
    let error = engine
        .update_adapters(1, &first.lora, &first.list(), InFlight::Keep)
        .unwrap_err();
    assert!(error.to_string().contains("by request"), "{error}");

    let mut plain = merged_engine(&client, None, 1);
    let error = plain.load_adapter(&first.lora, &first.list()).unwrap_err();
    assert!(error.to_string().contains("max_loras"), "{error}");
    let error = plain
        .add_request(request(&[5], 1, false, Some(AdapterId(1))))
        .unwrap_err();
    assert!(error.to_string().contains("serves no adapters"), "{error}");
}
