//! The learner's GRPO step on a tiny fixture model (real CPU plugin): the loss and
//! its metrics equal the host formulas on the log-probs of the separate
//! log-prob program; one step raises the log-probs of positively advantaged
//! completions and lowers the others; two micro-batches update the
//! parameters as one whole batch does, and so do a group's samples sharing
//! one copy of their prompt in a row (whose log-probs are the separate
//! sequences'); at a sampling temperature the step's log-probs and
//! entropies are those of the tempered logits; tokens outside the loss
//! mask count for nothing; with LoRA adapters only they move, and engines
//! get the policy merged on the device as the host merges it in f64.

use std::path::Path;

use grpo_learner::advantage::{ScaleRewards, advantages};
use grpo_learner::batch::{PromptSharing, StepBatch, TrainSample, pack, pack_sharing};
use grpo_learner::completion_logprobs::LogprobPrograms;
use grpo_learner::learner::{Learner, Optimization};
use grpo_learner::loss::{GrpoLoss, LossType};
use grpo_learner::objective::grpo::GrpoObjective;
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::{upload_parameters, upload_tensors};
use grpo_model::logprobs::{LogprobsRunner, TokenStats};
use grpo_model::lora::{AdapterFolder, Merged, WithAdapters};
use grpo_model::weights::{Safetensors, WeightSource};
use grpo_xla::trace::{AdamW, Mesh, StepMetrics};
use grpo_xla::{Buffer, Client, ClientOptions, ElementType, Platform};

fn client() -> Client {
    Client::for_platform(
        Platform::Cpu,
        ClientOptions::default().compile_cache_dir(None).cpu_device_count(1),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn fixture() -> (Decoder, Safetensors) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/parity/llama");
    let config = ModelConfig::from_file(dir.join("config.json")).unwrap();
    (Decoder::new(config), Safetensors::open_dir(&dir).unwrap())
}

/// The fixture model with the adapters PEFT made for it (B nonzero): the
/// decoder with them, the base weights and the adapter folder.
fn adapted_fixture() -> (Decoder, Safetensors, AdapterFolder) {
    let (base, weights) = fixture();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures/lora/llama/adapter");
    let folder = AdapterFolder::read(&dir, base.config()).unwrap();
    let decoder = Decoder::with_adapters(base.config().clone(), folder.lora.clone()).unwrap();
    (decoder, weights, folder)
}

/// Four sequences (two groups of two): prompts of 4 and 3 tokens (so rows
/// are left-padded differently) and completions of 8, 5, 7, 3 tokens.
fn sequences() -> Vec<(Vec<u32>, usize)> {
    let lengths = [8, 5, 7, 3];
    (0..4)
        .map(|i| {
            let prompt = if i < 2 { vec![5, 17, 99, 3] } else { vec![64, 120, 7] };
            let completion: Vec<u32> = (0..lengths[i]).map(|j| ((i * 31 + j * 7) % 120 + 1) as u32).collect();
            ([prompt, completion].concat(), lengths[i])
        })
        .collect()
}

/// The sequences as scored rollouts, with the reference log-probs as the
/// behaviour's (entry `t` of a sequence's log-probs scores token `t + 1`).
fn rollouts(logprobs: &[Vec<f32>], adv: &[f32]) -> Vec<TrainSample> {
    sequences()
        .into_iter()
        .enumerate()
        .map(|(r, (ids, n))| {
            let p = ids.len() - n;
            TrainSample {
                prompt: ids[..p].to_vec(),
                completion: ids[p..].to_vec(),
                loss_mask: vec![true; n],
                behaviour_logprobs: logprobs[r][p - 1..p - 1 + n].to_vec(),
                advantage: adv[r],
                valid: true,
            }
        })
        .collect()
}

/// Mean completion log-prob of each sequence under `params`.
fn mean_logprobs<B: std::borrow::Borrow<Buffer>>(runner: &LogprobsRunner, params: &[B]) -> Vec<f64> {
    let seqs = sequences();
    let ids: Vec<Vec<u32>> = seqs.iter().map(|(ids, _)| ids.clone()).collect();
    let stats = runner.run(params, &ids).unwrap();
    seqs.iter()
        .zip(&stats)
        .map(|((ids, n), s)| {
            s.logprobs[ids.len() - n - 1..]
                .iter()
                .map(|&x| f64::from(x))
                .sum::<f64>()
                / *n as f64
        })
        .collect()
}

/// A one-device learner of `weights` toward the on-policy GRPO loss
/// `loss`, computing in `compute`, clipping at `max_grad_norm`.
fn learner(
    client: &Client,
    decoder: &Decoder,
    weights: &dyn WeightSource,
    loss: GrpoLoss,
    (compute, max_grad_norm): (ElementType, Option<f64>),
) -> Learner<GrpoObjective> {
    let device = client.device(0).unwrap();
    let params = upload_parameters(client, device, decoder, weights, ElementType::F32).unwrap();
    learner_of(client, decoder, params, loss, (compute, max_grad_norm))
}

/// The same from `params` already uploaded.
fn learner_of(
    client: &Client,
    decoder: &Decoder,
    params: Vec<Buffer>,
    loss: GrpoLoss,
    (compute, max_grad_norm): (ElementType, Option<f64>),
) -> Learner<GrpoObjective> {
    let optimization = Optimization {
        optimizer: AdamW {
            weight_decay: 0.0,
            ..AdamW::default()
        },
        max_grad_norm,
        compute,
    };
    let objective = GrpoObjective::new(loss, 1);
    let device = client.device(0).unwrap();
    Learner::new(
        client,
        decoder,
        Mesh::single(device),
        objective,
        optimization,
        params,
        None,
    )
    .unwrap()
}

/// An on-policy f32 DAPO loss at `temperature`.
fn dapo(temperature: f32) -> GrpoLoss {
    GrpoLoss {
        loss_type: LossType::Dapo,
        temperature,
        ..GrpoLoss::default()
    }
}

/// f32 compute, clipping at norm 1.
const F32_CLIPPED: (ElementType, Option<f64>) = (ElementType::F32, Some(1.0));

/// What [`on_policy_step`] leaves: the learner after the step, its metrics,
/// and the behaviour log-probs, advantages and normalizer it ran with.
struct OnPolicyStep {
    learner: Learner<GrpoObjective>,
    metrics: grpo_xla::trace::StepMetrics,
    logprobs: Vec<Vec<f32>>,
    adv: Vec<f32>,
    normalizer: f32,
}

/// The four sequences scored by the log-prob program at `temperature`:
/// its stats, its log-probs (the behaviour's), and the advantages of
/// rewards 1, 0 (one group) and 0.2, 0.9 (the other).
fn scored(
    client: &Client,
    decoder: &Decoder,
    weights: &dyn WeightSource,
    temperature: f32,
) -> (Vec<TokenStats>, Vec<Vec<f32>>, Vec<f32>) {
    let device = client.device(0).unwrap();
    let params = upload_parameters(client, device, decoder, weights, ElementType::F32).unwrap();
    let runner = LogprobsRunner::new(client, decoder.clone(), ElementType::F32).at_temperature(f64::from(temperature));
    let ids: Vec<Vec<u32>> = sequences().into_iter().map(|(ids, _)| ids).collect();
    let stats = runner.run(&params, &ids).unwrap();
    let logprobs: Vec<Vec<f32>> = stats.iter().map(|s| s.logprobs.clone()).collect();
    let rewards = [Some(1.0), Some(0.0), Some(0.2), Some(0.9)];
    let adv = advantages(&rewards, 2, ScaleRewards::Group).unwrap().values;
    (stats, logprobs, adv)
}

/// The on-policy DAPO loss, where ratios are 1 and nothing is clipped:
/// −Σ_b A_b·|b| / N over each sample's trained tokens.
fn on_policy_loss(rollouts: &[TrainSample], normalizer: f32) -> f64 {
    -rollouts
        .iter()
        .map(|r| f64::from(r.advantage) * r.loss_tokens() as f64)
        .sum::<f64>()
        / f64::from(normalizer)
}

/// One step of `learner` at rate 1e-2 over `batch`'s micro-batches, each
/// with its own normalizer.
fn train_micro_batches(client: &Client, learner: &mut Learner<GrpoObjective>, batch: &StepBatch) -> StepMetrics {
    let inputs: Vec<_> = batch
        .micro_batches
        .iter()
        .enumerate()
        .map(|(i, m)| m.upload(client, learner.mesh(), batch.micro_normalizer(i)).unwrap())
        .collect();
    learner.train(batch.shape(), &inputs, 1e-2, 0).unwrap()
}

/// The sum of the log-prob program's entropies over `rollouts`' trained tokens.
fn trained_entropy(stats: &[TokenStats], rollouts: &[TrainSample]) -> f64 {
    stats
        .iter()
        .zip(rollouts)
        .map(|(s, r)| {
            s.entropies[r.prompt.len() - 1..]
                .iter()
                .zip(&r.loss_mask)
                .filter(|(_, trained)| **trained)
                .map(|(&x, _)| f64::from(x))
                .sum::<f64>()
        })
        .sum()
}

/// One on-policy DAPO step over the four sequences, scored at
/// `temperature`, with the log-prob program's log-probs at that
/// temperature as the behaviour's; checks its loss and entropy against
/// that program's.
fn on_policy_step(client: &Client, decoder: &Decoder, weights: &dyn WeightSource, temperature: f32) -> OnPolicyStep {
    let seqs = sequences();
    let (stats, logprobs, adv) = scored(client, decoder, weights, temperature);
    let tokens: usize = seqs.iter().map(|(_, n)| n).sum();
    let normalizer = LossType::Dapo.normalizer(tokens, 4, 8);
    let packed = pack(&rollouts(&logprobs, &adv), 4, 64, LossType::Dapo, 8).unwrap();
    assert_eq!(packed.normalizer, normalizer);
    let mut learner = learner(client, decoder, weights, dapo(temperature), F32_CLIPPED);
    let batch = packed.micro_batches[0]
        .upload(client, learner.mesh(), normalizer)
        .unwrap();
    let metrics = learner.train(packed.shape(), &[batch], 1e-2, 0).unwrap();
    // On-policy the ratio is 1, the behaviour's importance weight too, and
    // nothing is clipped: loss = −Σ_b A_b·|b| / N.
    let want = on_policy_loss(&rollouts(&logprobs, &adv), normalizer);
    assert!(
        (f64::from(metrics.loss) - want).abs() < 1e-5,
        "T {temperature}: loss {} vs {want}",
        metrics.loss
    );
    assert_eq!(metrics.metrics[..3], [0.0, 0.0, 0.0], "no clipping, no KL on-policy");
    let entropy = trained_entropy(&stats, &rollouts(&logprobs, &adv));
    assert!(
        (f64::from(metrics.metrics[3]) - entropy).abs() < 1e-3 * entropy,
        "T {temperature}: entropy sum {} vs {entropy}",
        metrics.metrics[3]
    );
    OnPolicyStep {
        learner,
        metrics,
        logprobs,
        adv,
        normalizer,
    }
}

#[test]
fn a_step_at_a_sampling_temperature_scores_at_it() {
    let client = client();
    let (decoder, weights) = fixture();
    let hot = on_policy_step(&client, &decoder, &weights, 1.7);
    let cold = on_policy_step(&client, &decoder, &weights, 1.0);
    assert!(
        (hot.metrics.metrics[3] - cold.metrics.metrics[3]).abs() > 1e-2 * cold.metrics.metrics[3],
        "entropy at 1.7 ({}) differs from entropy at 1 ({})",
        hot.metrics.metrics[3],
        cold.metrics.metrics[3]
    );
}

#[test]
fn a_grpo_step_follows_the_advantages_and_micro_batches_match_the_whole() {
    let client = client();
    let (decoder, weights) = fixture();
    let device = client.device(0).unwrap();
    let params = || upload_parameters(&client, device, &decoder, &weights, ElementType::F32).unwrap();
    let runner = LogprobsRunner::new(&client, decoder.clone(), ElementType::F32);
    let OnPolicyStep {
        learner: stepped,
        metrics,
        logprobs,
        adv,
        normalizer,
    } = on_policy_step(&client, &decoder, &weights, 1.0);
    let fresh = || learner(&client, &decoder, &weights, dapo(1.0), F32_CLIPPED);

    let before = mean_logprobs(&runner, &params());
    let after = stepped
        .with_params_on_one_device(|p| Ok(mean_logprobs(&runner, p)))
        .unwrap();
    for (i, a) in adv.iter().enumerate() {
        let moved = after[i] - before[i];
        assert!(
            moved * f64::from(*a) > 0.0,
            "sequence {i}: advantage {a}, log-prob moved {moved}"
        );
    }

    // Two micro-batches of two rows: the same update.
    let halved = pack(&rollouts(&logprobs, &adv), 2, 64, LossType::Dapo, 8).unwrap();
    let mut micro = fresh();
    assert_eq!(halved.micro_normalizer(0), normalizer / 2.0);
    assert_eq!(halved.micro_normalizer(1), normalizer / 2.0);
    let micro_metrics = train_micro_batches(&client, &mut micro, &halved);
    assert!((micro_metrics.grad_norm - metrics.grad_norm).abs() < 1e-4 * metrics.grad_norm.max(1.0));
    assert_same_params(&stepped, &micro);

    // BNPO over the same two micro-batches: the mean of their token means.
    let r = rollouts(&logprobs, &adv);
    let bnpo = pack(&r, 2, 64, LossType::Bnpo, 8).unwrap();
    let bnpo_metrics = train_micro_batches(&client, &mut fresh(), &bnpo);
    let token_mean = |half: &[TrainSample]| {
        let tokens: usize = half.iter().map(TrainSample::loss_tokens).sum();
        on_policy_loss(half, tokens as f32)
    };
    let want = 0.5 * (token_mean(&r[..2]) + token_mean(&r[2..]));
    assert!(
        (f64::from(bnpo_metrics.loss) - want).abs() < 1e-5,
        "BNPO loss {} vs the mean of the micro-batches' token means {want}",
        bnpo_metrics.loss
    );

    // Each group's two samples in one row behind one copy of the prompt: the same update.
    let sharing = PromptSharing {
        max_slots: 2,
        attention_width: f64::INFINITY,
        row_multiple: 1,
    };
    let shared = pack_sharing(&rollouts(&logprobs, &adv), 4, 64, LossType::Dapo, 8, sharing).unwrap();
    let shape = shared.micro_batches[0].shape;
    assert_eq!((shape.rows, shape.slots), (2, 2), "two rows of two slots");
    let mut shared_learner = fresh();
    let batch = shared.micro_batches[0]
        .upload(&client, shared_learner.mesh(), normalizer)
        .unwrap();
    let shared_metrics = shared_learner.train(shape, &[batch], 1e-2, 0).unwrap();
    assert!(
        (shared_metrics.loss - metrics.loss).abs() < 1e-6,
        "loss {} vs {}",
        shared_metrics.loss,
        metrics.loss
    );
    assert!((shared_metrics.grad_norm - metrics.grad_norm).abs() < 1e-4 * metrics.grad_norm.max(1.0));
    assert!((shared_metrics.metrics[3] - metrics.metrics[3]).abs() < 1e-4 * metrics.metrics[3]);
    assert_same_params(&stepped, &shared_learner);

    // The old-policy / reference program reads the shared layout too: the
    // log-prob program's log-probs of each completion, in sample order.
    let start = fresh();
    let mut programs = LogprobPrograms::new(&client, &decoder, start.mesh(), 1.0);
    let mut inputs = shared.micro_batches[0]
        .upload(&client, start.mesh(), normalizer)
        .unwrap();
    programs.append(&start.policy(), shape, &mut inputs).unwrap();
    let scored = inputs.last().unwrap().to_host::<f32>().unwrap();
    let c = shape.completion_tokens;
    for (sample, r) in rollouts(&logprobs, &adv).iter().enumerate() {
        for (j, want) in r.behaviour_logprobs.iter().enumerate() {
            let got = scored[sample * c + j];
            assert!((got - want).abs() < 1e-5, "sample {sample} token {j}: {got} vs {want}");
        }
    }
}

/// Asserts that two learners hold the same parameters (within f32 rounding).
fn assert_same_params(a: &Learner<GrpoObjective>, b: &Learner<GrpoObjective>) {
    let (a, b) = (a.host_params().unwrap(), b.host_params().unwrap());
    for ((name, a), (_, b)) in a.iter().zip(&b) {
        for (x, y) in a.data.iter().zip(&b.data) {
            assert!((x - y).abs() < 1e-5, "{name}: {x} vs {y}");
        }
    }
}

#[test]
fn bf16_compute_on_f32_master_weights_follows_the_f32_step() {
    let client = client();
    let (decoder, weights) = fixture();
    let device = client.device(0).unwrap();
    let params = || upload_parameters(&client, device, &decoder, &weights, ElementType::F32).unwrap();
    let runner = LogprobsRunner::new(&client, decoder.clone(), ElementType::F32);
    let ids: Vec<Vec<u32>> = sequences().into_iter().map(|(ids, _)| ids).collect();
    let logprobs: Vec<Vec<f32>> = runner
        .run(&params(), &ids)
        .unwrap()
        .into_iter()
        .map(|s| s.logprobs)
        .collect();
    let adv = advantages(&[Some(1.0), Some(0.0), Some(0.2), Some(0.9)], 2, ScaleRewards::Group)
        .unwrap()
        .values;
    let packed = pack(&rollouts(&logprobs, &adv), 4, 64, LossType::Dapo, 8).unwrap();
    let run = |compute| {
        let mut learner = learner(&client, &decoder, &weights, GrpoLoss::default(), (compute, None));
        let batch = packed.micro_batches[0]
            .upload(&client, learner.mesh(), packed.normalizer)
            .unwrap();
        let metrics = learner.train(packed.shape(), &[batch], 1e-3, 0).unwrap();
        let moved: Vec<f32> = learner
            .state()
            .params
            .iter()
            .zip(params())
            .flat_map(|(after, before)| {
                assert_eq!(after.tensor_type().dtype, ElementType::F32, "master weights stay f32");
                let (a, b) = (after.to_host::<f32>().unwrap(), before.to_host::<f32>().unwrap());
                a.iter().zip(b).map(|(x, y)| x - y).collect::<Vec<_>>()
            })
            .collect();
        (metrics, moved)
    };
    let (exact, exact_moved) = run(ElementType::F32);
    let (mixed, mixed_moved) = run(ElementType::Bf16);
    let relative = |a: f32, b: f32| (a - b).abs() / b.abs().max(1e-6);
    assert!(
        relative(mixed.loss, exact.loss) < 0.05,
        "loss {} vs {}",
        mixed.loss,
        exact.loss
    );
    assert!(
        relative(mixed.grad_norm, exact.grad_norm) < 0.1,
        "grad norm {} vs {}",
        mixed.grad_norm,
        exact.grad_norm
    );
    let dot: f64 = exact_moved
        .iter()
        .zip(&mixed_moved)
        .map(|(a, b)| f64::from(*a) * f64::from(*b))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let cosine = dot / (norm(&exact_moved) * norm(&mixed_moved));
    assert!(
        cosine > 0.9,
        "the bf16 update points where the f32 one does: cosine {cosine}"
    );
}

#[test]
fn engine_weights_are_the_parameters_copied_on_the_device_in_the_engine_dtype() {
    let client = client();
    let (decoder, weights) = fixture();
    let OnPolicyStep {
        mut learner,
        logprobs,
        adv,
        normalizer,
        ..
    } = on_policy_step(&client, &decoder, &weights, 1.0);
    let host = learner.host_params().unwrap();

    let f32_copies = learner
        .engine_weights(0, ElementType::F32)
        .unwrap()
        .expect("one device");
    let bf16_copies = learner
        .engine_weights(0, ElementType::Bf16)
        .unwrap()
        .expect("one device");
    assert_eq!(f32_copies.len(), host.len());
    for (((name, tensor), exact), halved) in host.iter().zip(&f32_copies).zip(&bf16_copies) {
        assert_eq!(
            exact.to_host::<f32>().unwrap(),
            tensor.data,
            "{name}: an exact f32 copy"
        );
        let rounded: Vec<half::bf16> = tensor.data.iter().map(|&v| half::bf16::from_f32(v)).collect();
        assert_eq!(halved.dtype(), ElementType::Bf16);
        assert_eq!(
            halved.to_host::<half::bf16>().unwrap(),
            rounded,
            "{name}: rounded to nearest even"
        );
    }
    // The copies are the engine's own: the next train step, which donates
    // the learner's parameters and changes them, leaves them as they were.
    let packed = pack(&rollouts(&logprobs, &adv), 4, 64, LossType::Dapo, 8).unwrap();
    let batch = packed.micro_batches[0]
        .upload(&client, learner.mesh(), normalizer)
        .unwrap();
    learner.train(packed.shape(), &[batch], 1e-2, 0).unwrap();
    assert_ne!(
        learner.host_params().unwrap()[1].1.data,
        host[1].1.data,
        "the step moved the weights"
    );
    for ((name, tensor), exact) in host.iter().zip(&f32_copies) {
        assert_eq!(exact.to_host::<f32>().unwrap(), tensor.data, "{name} after the step");
    }
    // Another device than the learner's: through the host instead.
    assert!(learner.engine_weights(1, ElementType::F32).unwrap().is_none());
}

#[test]
fn engine_weights_refuse_a_non_finite_parameter_naming_it() {
    let client = client();
    let (decoder, weights) = fixture();
    let device = client.device(0).unwrap();
    let mut params = upload_parameters(&client, device, &decoder, &weights, ElementType::F32).unwrap();
    let spec = &decoder.parameters()[3];
    let mut values = params[3].to_host::<f32>().unwrap();
    let middle = values.len() / 2;
    values[middle] = f32::INFINITY;
    params[3] = client.buffer_from_host(&values, params[3].dims(), device).unwrap();
    let mut learner = learner_of(&client, &decoder, params, dapo(1.0), (ElementType::F32, None));
    let error = learner.engine_weights(0, ElementType::Bf16).unwrap_err().to_string();
    assert!(error.contains(&spec.name) && error.contains("non-finite"), "{error}");
}

/// Tokens outside the loss mask (what an environment wrote between a
/// multi-turn sample's turns) carry no loss, no metric and no gradient:
/// with junk behaviour log-probs there, the on-policy step is the step
/// over the other tokens alone.
#[test]
fn tokens_outside_the_loss_mask_carry_nothing() {
    let client = client();
    let (decoder, weights) = fixture();
    let (stats, logprobs, adv) = scored(&client, &decoder, &weights, 1.0);
    let mut masked = rollouts(&logprobs, &adv);
    for r in &mut masked {
        // Tokens 1, 4, 7 are context.
        for j in (1..r.completion.len()).step_by(3) {
            r.loss_mask[j] = false;
            r.behaviour_logprobs[j] = -50.0;
        }
    }
    let trained: Vec<usize> = masked.iter().map(TrainSample::loss_tokens).collect();
    let tokens: usize = trained.iter().sum();
    assert_eq!(tokens, 23 - 3 - 2 - 2 - 1);
    let normalizer = LossType::Dapo.normalizer(tokens, 4, 8);
    let packed = pack(&masked, 4, 64, LossType::Dapo, 8).unwrap();
    assert_eq!((packed.tokens, packed.normalizer), (tokens, normalizer));
    let mut learner = learner(&client, &decoder, &weights, dapo(1.0), F32_CLIPPED);
    let batch = packed.micro_batches[0]
        .upload(&client, learner.mesh(), normalizer)
        .unwrap();
    let metrics = learner.train(packed.shape(), &[batch], 1e-2, 0).unwrap();
    let want = on_policy_loss(&masked, normalizer);
    assert!(
        (f64::from(metrics.loss) - want).abs() < 1e-5,
        "loss {} vs {want}",
        metrics.loss
    );
    assert_eq!(
        metrics.metrics[..3],
        [0.0, 0.0, 0.0],
        "the junk log-probs are never read"
    );
    let entropy = trained_entropy(&stats, &masked);
    assert!(
        (f64::from(metrics.metrics[3]) - entropy).abs() < 1e-3 * entropy,
        "entropy sum {} vs {entropy}",
        metrics.metrics[3]
    );
}

#[test]
fn adapters_train_alone_and_engines_get_them_merged_as_the_host_merges_them() {
    let client = client();
    let (decoder, weights, folder) = adapted_fixture();
    let source = WithAdapters {
        base: &weights,
        adapters: &folder.tensors,
    };
    // The step's loss and entropy are the log-prob program's (checked inside).
    let OnPolicyStep { mut learner, .. } = on_policy_step(&client, &decoder, &source, 1.0);

    let base: Vec<Vec<f32>> = learner
        .state()
        .frozen
        .iter()
        .map(|b| b.to_host::<f32>().unwrap())
        .collect();
    for (spec, values) in decoder.base_parameters().iter().zip(&base) {
        assert_eq!(
            values,
            &weights.tensor(&spec.name).unwrap().data,
            "{} is frozen",
            spec.name
        );
    }
    // AdamW's first step moves each adapter value by at most lr (1e-2),
    // nearly lr wherever its gradient is not tiny.
    let trained = learner.host_params().unwrap();
    assert_eq!(trained.len(), decoder.adapter_parameters().len());
    let (mut moved, mut total) = (0, 0);
    for (name, after) in &trained {
        for (a, b) in after.data.iter().zip(&folder.tensors[name].data) {
            let step = (a - b).abs();
            assert!(step <= 1e-2 * 1.001, "{name}: moved {step}");
            moved += usize::from(step > 5e-3);
            total += 1;
        }
    }
    assert!(
        moved * 2 > total,
        "{moved} of {total} adapter values took near-full steps"
    );

    // The host's f64 merge of the trained adapters is the device's.
    let adapters: std::collections::BTreeMap<_, _> = trained.into_iter().collect();
    let merged = Merged {
        base: &weights,
        lora: &folder.lora,
        adapters: &adapters,
    };
    let on_device = learner
        .engine_weights(0, ElementType::F32)
        .unwrap()
        .expect("one device");
    let on_host = learner.host_policy().unwrap();
    assert_eq!(on_device.len(), decoder.base_parameters().len());
    for ((spec, copy), (name, host)) in decoder.base_parameters().iter().zip(&on_device).zip(&on_host) {
        assert_eq!(&spec.name, name);
        let want = merged.tensor(name).unwrap().data;
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        for got in [copy.to_host::<f32>().unwrap(), host.data.clone()] {
            let worst = got.iter().zip(&want).fold(0.0f32, |m, (g, w)| m.max((g - w).abs()));
            assert!(worst <= 1e-6 * scale.max(1.0), "{name}: {worst}");
        }
    }
    // Unadapted parameters (norms, embeddings) leave as they are.
    let norm = decoder
        .base_parameters()
        .iter()
        .position(|p| p.name.ends_with("norm.weight"))
        .unwrap();
    assert_eq!(on_host[norm].1.data, base[norm]);
}

/// Adapter dropout in the train step: one update number draws one set of
/// masks (the same step twice is the same update), another number others,
/// and either moves the adapters elsewhere than the step without dropout;
/// the loss it reports is no longer the on-policy loss (ratios move off 1).
#[test]
fn adapter_dropout_draws_masks_by_update_number() {
    let client = client();
    let (decoder, weights, folder, samples) = adapted_samples(&client);
    let source = beside(&weights, &folder);
    let packed = pack(&samples, 4, 64, LossType::Dapo, 8).unwrap();
    let step = |decoder: &Decoder, update: u64| {
        let mut learner = learner(&client, decoder, &source, dapo(1.0), F32_CLIPPED);
        let batch = packed.micro_batches[0]
            .upload(&client, learner.mesh(), packed.normalizer)
            .unwrap();
        let metrics = learner.train(packed.shape(), &[batch], 1e-2, update).unwrap();
        let moved: Vec<Vec<f32>> = learner
            .host_params()
            .unwrap()
            .into_iter()
            .map(|(_, t)| t.data)
            .collect();
        (metrics.loss, moved)
    };
    let dropped = decoder.clone().with_adapter_dropout(0.3, 5).unwrap();
    let (loss, first) = step(&dropped, 7);
    assert_eq!(
        step(&dropped, 7),
        (loss, first.clone()),
        "one update number, one set of masks"
    );
    assert_ne!(step(&dropped, 8).1, first, "another update number, other masks");
    let (plain_loss, plain) = step(&decoder, 7);
    assert_ne!(plain, first, "dropout changes the step");
    let on_policy = on_policy_loss(&samples, packed.normalizer);
    assert!((f64::from(plain_loss) - on_policy).abs() < 1e-5);
    assert!(
        (f64::from(loss) - on_policy).abs() > 1e-5,
        "masked forwards move the ratios off 1"
    );
}

/// `folder`'s adapters beside the base `weights`.
fn beside<'a>(weights: &'a Safetensors, folder: &'a AdapterFolder) -> WithAdapters<'a> {
    WithAdapters {
        base: weights,
        adapters: &folder.tensors,
    }
}

/// The adapted fixture and the four sequences as on-policy samples of it.
fn adapted_samples(client: &Client) -> (Decoder, Safetensors, AdapterFolder, Vec<TrainSample>) {
    let (decoder, weights, folder) = adapted_fixture();
    let (_, logprobs, adv) = scored(client, &decoder, &beside(&weights, &folder), 1.0);
    let samples = rollouts(&logprobs, &adv);
    (decoder, weights, folder, samples)
}

#[test]
fn a_bf16_base_takes_half_the_memory_and_trains_the_adapters_as_the_f32_base() {
    let client = client();
    let (decoder, weights, folder, samples) = adapted_samples(&client);
    let source = beside(&weights, &folder);
    let packed = pack(&samples, 4, 64, LossType::Dapo, 8).unwrap();
    let device = client.device(0).unwrap();
    let step = |base_dtype: ElementType| {
        let mut params = upload_tensors(&client, device, decoder.base_parameters(), &source, base_dtype).unwrap();
        params
            .extend(upload_tensors(&client, device, decoder.adapter_parameters(), &source, ElementType::F32).unwrap());
        let mut learner = learner_of(&client, &decoder, params, dapo(1.0), F32_CLIPPED);
        let bytes = learner.state_bytes_per_device()[0];
        let metrics = train_micro_batches(&client, &mut learner, &packed);
        let merged = learner
            .engine_weights(0, ElementType::F32)
            .unwrap()
            .expect("one device");
        let merged: Vec<Vec<f32>> = merged.iter().map(|b| b.to_host::<f32>().unwrap()).collect();
        (metrics, learner.host_params().unwrap(), bytes, merged)
    };
    let (want, want_adapters, f32_bytes, want_merged) = step(ElementType::F32);
    let (got, got_adapters, bf16_bytes, got_merged) = step(ElementType::Bf16);

    let base_bytes: usize = decoder
        .base_parameters()
        .iter()
        .map(|p| 4 * p.dims.iter().product::<usize>())
        .sum();
    assert_eq!(f32_bytes - bf16_bytes, base_bytes / 2, "the base takes half its bytes");
    // The rounded base moves the policy's log-probs by about 1e-2 a token
    // (the behaviour's are the f32 base's), and the importance weights with them.
    let per_token = got.metrics[4] / packed.tokens as f32;
    assert!(
        per_token > 1e-4 && per_token < 5e-2,
        "bf16 rounding moved log-probs by {per_token} a token"
    );
    assert!(
        (got.loss - want.loss).abs() <= 0.2 * want.loss.abs(),
        "{got:?} vs {want:?}"
    );
    // The update of the adapters points where the f32 base's does.
    let deltas = |after: &[(String, grpo_model::weights::HostTensor)]| -> Vec<f64> {
        after
            .iter()
            .flat_map(|(name, t)| {
                t.data
                    .iter()
                    .zip(&folder.tensors[name].data)
                    .map(|(a, b)| f64::from(a - b))
            })
            .collect()
    };
    let (a, b) = (deltas(&got_adapters), deltas(&want_adapters));
    let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let cosine = dot / (norm(&a) * norm(&b));
    println!("adapter updates over a bf16 base vs an f32 base: cosine {cosine}");
    assert!(
        cosine > 0.95,
        "adapter updates over a bf16 base vs an f32 base: cosine {cosine}"
    );
    // Engines get the policy merged from the bf16 base: the host's f64 merge
    // of the rounded base and the trained adapters.
    let rounded: std::collections::BTreeMap<String, grpo_model::weights::HostTensor> = decoder
        .base_parameters()
        .iter()
        .map(|p| {
            let mut t = weights.tensor(&p.name).unwrap();
            t.data.iter_mut().for_each(|v| *v = half::bf16::from_f32(*v).to_f32());
            (p.name.clone(), t)
        })
        .collect();
    let rounded_base = WithAdapters {
        base: &weights,
        adapters: &rounded,
    };
    let trained: std::collections::BTreeMap<_, _> = got_adapters.into_iter().collect();
    let merged = Merged {
        base: &rounded_base,
        lora: &folder.lora,
        adapters: &trained,
    };
    assert_eq!(got_merged.len(), want_merged.len());
    for (spec, got) in decoder.base_parameters().iter().zip(&got_merged) {
        let want = merged.tensor(&spec.name).unwrap().data;
        let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let worst = got.iter().zip(&want).fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(worst <= 1e-6 * scale.max(1.0), "{}: {worst} apart", spec.name);
    }
}
