//! The whole on-policy iteration on a tiny fixture model: the reward (the
//! fraction of completion tokens equal to one target token) rises over a
//! few dozen steps, of single completions and of two-turn episodes; every
//! step's weights reach the engine as a new version;
//! data-parallel and FSDP learners over two devices train as one device does.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use grpo_env::environment::{Environment, EnvironmentError, EpisodeView, Reply};
use grpo_env::guard::GuardedEnvironment;
use grpo_learner::advantage::ScaleRewards;
use grpo_learner::choices::Choices;
use grpo_learner::collect::EpisodeSetup;
use grpo_learner::data::{Example, Prompt};
use grpo_learner::episode::Budget;
use grpo_learner::fleet::LocalFleet;
use grpo_learner::grpo::{GrpoConfig, GrpoParts, GrpoTask, StepReport};
use grpo_learner::loss::GrpoLoss;
use grpo_learner::record::RolloutRow;
use grpo_learner::rollouts::Filters;
use grpo_learner::schedule::{Decay, Schedule};
use grpo_learner::trainer::Trainer;
use grpo_model::chat::ChatMessage;
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::lora::{LoraConfig, Targets, WithAdapters, new_adapters};
use grpo_model::tokenizer::Tokenizer;
use grpo_model::tools::Tool;
use grpo_model::weights::Safetensors;
use grpo_reward::metrics::RewardMetrics;
use grpo_reward::pool::Entry;
use grpo_reward::{BoxFuture, OnError, RewardPool, Sample, SampleReward, Score};
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_rollout::guided::Guide;
use grpo_xla::trace::{AdamW, Mesh, Parallelism};
use grpo_xla::{Client, ClientOptions, ElementType, Platform};

/// The fraction of a completion's tokens equal to `0`.
struct TargetToken(u32);

impl SampleReward for TargetToken {
    fn score_sample(&self, sample: &Sample) -> grpo_reward::Result<Score> {
        let ids = &sample.completion_ids;
        let hits = ids.iter().filter(|&&t| t == self.0).count();
        Ok(Score::new(hits as f32 / ids.len().max(1) as f32))
    }
}

/// The four training prompts.
fn prompts() -> Vec<Example> {
    ["qzx", "zz", "xyz", "jkq"]
        .iter()
        .enumerate()
        .map(|(index, p)| Example {
            index,
            prompt: Prompt::Text(p.to_string()),
            columns: Default::default(),
            guide: None,
        })
        .collect()
}

/// The loop options the tests vary.
#[derive(Default)]
struct Variant {
    dynamic_sampling: bool,
    /// μ (0 means 1).
    iterations: usize,
    beta: f32,
    max_staleness: usize,
    /// The learner's SPMD layout (`None`: one device).
    parallelism: Option<Parallelism>,
    /// Samples are two-turn episodes of [`GoOnce`].
    episodes: bool,
    /// The rollouts' guide (the model then ends its answers with `<|im_end|>`).
    guide: Option<Guide>,
    /// The rollouts' token filters.
    filters: Filters,
    /// Completions cut by their token limit carry no loss.
    mask_truncated: bool,
    /// LoRA adapters train instead of the whole model.
    lora: Option<LoraConfig>,
    /// The learning rate (`None`: 3e-3).
    lr: Option<f64>,
    /// With adapters, push them merged into whole weights.
    merge_on_push: bool,
    /// The clip range ε, low and high (`None`: 0.2).
    epsilon: Option<f32>,
}

/// Answers a first turn with "!" and ends the episode after the second,
/// leaving the reward to the rewards.
struct GoOnce;

impl Environment for GoOnce {
    fn name(&self) -> &str {
        "go-once"
    }

    fn tools(&self) -> Vec<Tool> {
        Vec::new()
    }

    fn step<'a>(&'a self, episode: EpisodeView<'a>) -> BoxFuture<'a, Result<Reply, EnvironmentError>> {
        let first = episode.messages.iter().filter(|m| m.role == "assistant").count() == 1;
        let reply = if first {
            Reply::Continue {
                messages: vec![ChatMessage::new("user", "!")],
                failed_calls: 0,
                guide: None,
            }
        } else {
            Reply::Done { reward: None }
        };
        Box::pin(async move { Ok(reply) })
    }
}

/// A chat template whose markup is the fixture tokenizer's special tokens
/// (ids below the fixture model's 128), roles left out.
const BARE_TEMPLATE: &str = "{% for m in messages %}{{ '<|im_start|>' + m['content'] + '<|im_end|>' }}{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>' }}{% endif %}";

/// The loop on the tiny fixture model scoring with `reward`.
fn tiny_loop(reward: Arc<dyn grpo_reward::Reward>, variant: Variant) -> Trainer<GrpoTask> {
    try_tiny_loop(reward, variant).unwrap_or_else(|e| panic!("{e}"))
}

/// The same, or why it cannot start.
fn try_tiny_loop(reward: Arc<dyn grpo_reward::Reward>, variant: Variant) -> grpo_learner::Result<Trainer<GrpoTask>> {
    let devices = variant.parallelism.map_or(1, Parallelism::devices);
    let options = ClientOptions::default()
        .compile_cache_dir(None)
        .cpu_device_count(devices);
    let client = Client::for_platform(Platform::Cpu, options).unwrap();
    let device = client.device(0).unwrap();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model/tests/fixtures");
    let dir = fixtures.join("parity/llama");
    let mut config = ModelConfig::from_file(dir.join("config.json")).unwrap();
    if variant.guide.is_some() {
        // A guided answer ends with EOS once its grammar is complete.
        config.eos_token_ids = vec![2];
    }
    let decoder = Decoder::new(config.clone());
    let weights = Safetensors::open_dir(&dir).unwrap();
    let upload = || upload_parameters(&client, device, &decoder, &weights, ElementType::F32).unwrap();
    // The policy: the model, or the model with new adapters (the engine's
    // weights either way, as new adapters change nothing).
    let (policy, adapters) = match &variant.lora {
        Some(lora) => {
            let adapters = new_adapters(&lora.layers(&config).unwrap(), lora.rank, 3).unwrap();
            (Decoder::with_adapters(config, lora.clone()).unwrap(), adapters)
        }
        None => (decoder.clone(), Default::default()),
    };
    let policy_weights = WithAdapters {
        base: &weights,
        adapters: &adapters,
    };
    let tokenizer = Tokenizer::from_file(fixtures.join("tokenizer/tiny/tokenizer.json")).unwrap();
    let tokenizer = Arc::new(if variant.episodes {
        tokenizer.with_chat_template(BARE_TEMPLATE.to_string())
    } else {
        tokenizer
    });
    let engine = Engine::new(
        &client,
        decoder.clone(),
        upload(),
        EngineConfig {
            max_num_seqs: 16,
            max_model_len: 32,
            dtype: ElementType::F32,
            ..EngineConfig::default()
        },
    )
    .unwrap()
    .with_tokenizer(tokenizer.clone());
    let rewards = RewardPool::new(
        vec![Entry {
            name: "target".to_string(),
            weight: 1.0,
            timeout: Duration::from_secs(5),
            on_error: OnError::Fail,
            reward,
            metrics: RewardMetrics::default(),
        }],
        2,
    );
    let data = prompts();
    let config = GrpoConfig {
        group_size: 4,
        prompts_per_step: 4,
        // An episode: two turns of at most 6 tokens and the answer between them.
        max_completion_tokens: if variant.episodes { 18 } else { 8 },
        loss: GrpoLoss {
            beta: variant.beta,
            epsilon: variant.epsilon.unwrap_or(0.2),
            epsilon_high: variant.epsilon.unwrap_or(0.2),
            ..GrpoLoss::default()
        },
        scale_rewards: ScaleRewards::Group,
        schedule: Schedule {
            lr: variant.lr.unwrap_or(3e-3),
            warmup: 0,
            total: 40,
            decay: Decay::Constant,
        },
        optimizer: AdamW {
            weight_decay: 0.0,
            ..AdamW::default()
        },
        max_grad_norm: Some(1.0),
        micro_batch_rows: 8,
        share_prompts: true,
        max_tokens: 32,
        seed: 11,
        dynamic_sampling: variant.dynamic_sampling,
        mask_truncated: variant.mask_truncated,
        iterations: variant.iterations.max(1),
        max_staleness: variant.max_staleness,
        choices: Choices::F32,
        guide: variant.guide,
        merge_on_push: variant.merge_on_push,
        filters: variant.filters,
    };
    let params = upload_parameters(&client, device, &policy, &policy_weights, ElementType::F32).unwrap();
    let reference = (variant.beta > 0.0 && variant.lora.is_none()).then(upload);
    let parts = GrpoParts {
        client: client.clone(),
        decoder: policy,
        tokenizer,
        fleet: Box::new(LocalFleet::new(engine)),
        rewards,
        data,
        eval: prompts(),
        data_seed: 5,
        params,
        mesh: Mesh::new(&client, variant.parallelism).unwrap(),
        reference,
        episodes: variant.episodes.then(|| {
            let environment = GuardedEnvironment::new(Box::new(GoOnce), Duration::from_secs(5), OnError::Fail);
            let budget = Budget {
                max_turns: 2,
                max_turn_tokens: 6,
                max_episode_tokens: 18,
            };
            EpisodeSetup::new(environment, budget)
        }),
    };
    Trainer::grpo(parts, config, None)
}

/// The next step's report and rollouts.
fn step(grpo: &mut Trainer<GrpoTask>) -> (StepReport, Vec<RolloutRow>) {
    let record = grpo.step().unwrap();
    let report = serde_json::from_value(serde_json::Value::Object(record.metrics)).unwrap();
    (report, record.rollouts)
}

#[test]
fn the_reward_rises_and_the_engine_follows_the_learner() {
    let mut grpo = tiny_loop(Arc::new(TargetToken(40)), Variant::default());
    let reports: Vec<_> = (0..40).map(|_| step(&mut grpo).0).collect();
    let mean = |r: &[StepReport]| r.iter().map(|s| s.reward).sum::<f64>() / r.len() as f64;
    let (first, last) = (mean(&reports[..5]), mean(&reports[35..]));
    eprintln!("reward {first:.3} → {last:.3}");
    assert!(last > first + 0.2, "the reward rises: {first:.3} → {last:.3}");
    assert!(reports.iter().all(|r| r.loss.is_finite() && r.grad_norm.is_finite()));
    assert_eq!(reports[39].step, 40);
}

/// 1 when a completion's first token is odd: rewards that vary within a group.
struct FirstTokenParity;

impl SampleReward for FirstTokenParity {
    fn score_sample(&self, sample: &Sample) -> grpo_reward::Result<Score> {
        let odd = sample.completion_ids.first().is_some_and(|t| t % 2 == 1);
        Ok(Score::new(if odd { 1.0 } else { 0.0 }))
    }
}

/// Scores every sample the same.
struct Constant;

impl SampleReward for Constant {
    fn score_sample(&self, _: &Sample) -> grpo_reward::Result<Score> {
        Ok(Score::new(1.0))
    }
}

#[test]
fn two_turn_episodes_learn_from_their_own_tokens() {
    let mut grpo = tiny_loop(
        Arc::new(TargetToken(40)),
        Variant {
            episodes: true,
            ..Variant::default()
        },
    );
    let mut reports = Vec::new();
    for _ in 0..40 {
        let (report, rows) = step(&mut grpo);
        for row in &rows {
            let episode = row.episode.as_ref().expect("every row an episode");
            assert_eq!((episode.turns, episode.end.as_str()), (2, "done"));
            // The answer between the turns carries no loss.
            let answer = episode.loss_mask.iter().filter(|m| !**m).count();
            assert!(answer > 0 && episode.loss_mask.len() == episode.token_ids.len());
        }
        reports.push(report);
    }
    let mean = |r: &[StepReport]| r.iter().map(|s| s.reward).sum::<f64>() / r.len() as f64;
    let (first, last) = (mean(&reports[..5]), mean(&reports[35..]));
    eprintln!("episode reward {first:.3} → {last:.3}");
    assert!(last > first + 0.2, "the reward rises: {first:.3} → {last:.3}");
}

#[test]
fn guided_rollouts_keep_to_their_grammar_and_their_log_probs_to_the_learners() {
    // Token 70 is `b`: the reward asks for b's, the guide for 1 to 5 lowercase letters.
    let guide = Guide::Regex("[a-z]{1,5}".to_string());
    let variant = Variant {
        guide: Some(guide),
        // A clip range below f32's step at 1: a ratio off 1 by any amount is clipped.
        epsilon: Some(1e-7),
        ..Variant::default()
    };
    let mut grpo = tiny_loop(Arc::new(TargetToken(70)), variant);
    for _ in 0..3 {
        let (report, rollouts) = step(&mut grpo);
        for row in &rollouts {
            assert_eq!(row.finish_reason, "stop", "{row:?}");
            let text = &row.completion;
            assert!(
                (1..=5).contains(&text.len()) && text.chars().all(|c| c.is_ascii_lowercase()),
                "{text:?} is not [a-z]{{1,5}}"
            );
        }
        // The engine recorded the unmasked policy's log-probs, as the
        // learner computes them: masked ones (renormalized over the letters
        // the grammar allows) would differ by the log of the mass it removed.
        assert!(
            report.sampling_logp_difference < 1e-4,
            "engine and learner log-probs differ by {} a token",
            report.sampling_logp_difference
        );
        // On-policy: every token's ratio is exactly 1, so even a clip range
        // of 1e-7 clips none.
        assert_eq!(report.clip_ratio_region, 0.0);
    }
    let bad = Variant {
        guide: Some(Guide::Regex("[a-z".to_string())),
        ..Variant::default()
    };
    match try_tiny_loop(Arc::new(TargetToken(70)), bad) {
        Ok(_) => panic!("a regex that does not compile was taken"),
        Err(e) => assert!(e.to_string().contains("rollout.structured_outputs"), "{e}"),
    }
}

#[test]
fn truncated_completions_can_carry_no_loss() {
    // The fixture model has no EOS: every completion runs to its limit.
    let variant = Variant {
        mask_truncated: true,
        ..Variant::default()
    };
    let mut grpo = tiny_loop(Arc::new(FirstTokenParity), variant);
    let (report, rollouts) = step(&mut grpo);
    assert!(rollouts.iter().all(|r| r.finish_reason == "length"));
    assert!(report.reward_std > 0.0, "the advantages are not all 0");
    assert_eq!((report.loss, report.grad_norm), (0.0, 0.0), "no token is trained");
    let mut unmasked = tiny_loop(Arc::new(FirstTokenParity), Variant::default());
    assert!(step(&mut unmasked).0.grad_norm > 0.0);
}

#[test]
fn top_k_reaches_the_rollouts() {
    // With only the most likely token kept, a group's samples are all the same.
    let variant = Variant {
        filters: Filters {
            top_k: 1,
            ..Filters::default()
        },
        ..Variant::default()
    };
    let mut grpo = tiny_loop(Arc::new(TargetToken(40)), variant);
    let (report, rollouts) = step(&mut grpo);
    assert_eq!(report.frac_reward_zero_std, 1.0);
    for group in rollouts.chunk_by(|a, b| a.group == b.group) {
        assert!(group.iter().all(|r| r.completion == group[0].completion), "{group:?}");
    }
}

#[test]
fn dynamic_sampling_trains_only_on_groups_whose_rewards_vary() {
    let mut flat = tiny_loop(
        Arc::new(Constant),
        Variant {
            dynamic_sampling: true,
            ..Variant::default()
        },
    );
    let before = flat.host_params().unwrap();
    let (report, rows) = step(&mut flat);
    assert_eq!(
        (report.trained_samples, rows.len()),
        (0, 16),
        "every group dropped, every row logged"
    );
    assert_eq!(report.frac_reward_zero_std, 1.0);
    let after = flat.host_params().unwrap();
    assert!(before == after, "no update without signal");

    let mut varied = tiny_loop(
        Arc::new(TargetToken(40)),
        Variant {
            dynamic_sampling: true,
            ..Variant::default()
        },
    );
    for _ in 0..3 {
        let (report, _) = step(&mut varied);
        let kept_groups = (1.0 - report.frac_reward_zero_std) * 4.0;
        assert_eq!(report.trained_samples as f64, kept_groups * 4.0, "{report:?}");
    }
}

#[test]
fn several_passes_over_a_batch_clip_against_the_policy_before_the_first() {
    let mut grpo = tiny_loop(
        Arc::new(TargetToken(40)),
        Variant {
            iterations: 4,
            ..Variant::default()
        },
    );
    let reports: Vec<_> = (0..8).map(|_| step(&mut grpo).0).collect();
    assert!(reports.iter().all(|r| r.loss.is_finite()), "{reports:?}");
    assert!(reports.iter().any(|r| r.grad_norm > 0.0), "some step had signal");
    // By the fourth pass at this learning rate the policy has left the
    // trust region somewhere: the ratio against the old policy clips
    // (with one pass the ratio is 1 and nothing ever clips).
    let clipped: f64 = reports.iter().map(|r| r.clip_ratio_low + r.clip_ratio_high).sum();
    assert!(clipped > 0.0, "no token clipped in 8 × 4 passes: {reports:?}");
}

#[test]
fn a_kl_term_measures_the_distance_from_the_frozen_start() {
    let mut grpo = tiny_loop(
        Arc::new(TargetToken(40)),
        Variant {
            beta: 0.1,
            ..Variant::default()
        },
    );
    let reports: Vec<_> = (0..6).map(|_| step(&mut grpo).0).collect();
    assert!(
        reports[0].kl.abs() < 1e-6,
        "the first step's policy is the reference: {}",
        reports[0].kl
    );
    assert!(
        reports.iter().all(|r| r.kl.is_finite() && r.kl >= -1e-6),
        "k3 is never negative"
    );
    assert!(reports[5].kl > 1e-6, "the policy moved away: {reports:?}");
    let plain: Vec<_> = {
        let mut grpo = tiny_loop(Arc::new(TargetToken(40)), Variant::default());
        (0..2).map(|_| step(&mut grpo).0.kl).collect()
    };
    assert_eq!(plain, [0.0, 0.0], "no reference, no KL");
}

#[test]
fn generating_ahead_samples_one_version_behind_and_still_learns() {
    let mut grpo = tiny_loop(
        Arc::new(TargetToken(40)),
        Variant {
            max_staleness: 1,
            ..Variant::default()
        },
    );
    let mut reports = Vec::new();
    for _ in 0..40 {
        let (report, rows) = step(&mut grpo);
        // Batch 1 is drawn by the starting policy; batch s ≥ 2 while step s − 1 trains.
        let version = report.step.saturating_sub(2) as u64;
        let versions: Vec<u64> = rows.iter().map(|r| r.policy_version).collect();
        assert!(
            versions.iter().all(|&v| v == version),
            "step {}: versions {versions:?}, staleness {}",
            report.step,
            report.staleness
        );
        assert_eq!(report.staleness, u64::from(report.step > 1), "step {}", report.step);
        assert_eq!(report.stale_samples, 0);
        reports.push(report);
    }
    let mean = |r: &[StepReport]| r.iter().map(|s| s.reward).sum::<f64>() / r.len() as f64;
    let (first, last) = (mean(&reports[..5]), mean(&reports[35..]));
    assert!(
        last > first + 0.2,
        "the reward rises one version behind: {first:.3} → {last:.3}"
    );
    // Evaluation goes through the rollout thread, after the weights sent so far.
    let eval = grpo.evaluate().unwrap().unwrap();
    assert_eq!(eval["eval_prompts"], 4);
}

/// The fraction of a completion's tokens below 64: it varies within every
/// group from the first step, so every update has a signal (a zero-signal
/// step's gradient is round-off, which AdamW's normalisation would blow up
/// to full-size steps that differ between layouts).
struct LowTokens;

impl SampleReward for LowTokens {
    fn score_sample(&self, sample: &Sample) -> grpo_reward::Result<Score> {
        let ids = &sample.completion_ids;
        let low = ids.iter().filter(|&&t| t < 64).count();
        Ok(Score::new(low as f32 / ids.len().max(1) as f32))
    }
}

#[test]
fn data_parallel_and_fsdp_learners_train_as_the_one_device_learner_with_and_without_adapters() {
    let adapters = LoraConfig {
        rank: 2,
        alpha: 4.0,
        targets: Targets::Modules(vec!["q_proj".into(), "down_proj".into()]),
        use_rslora: false,
    };
    for lora in [None, Some(adapters)] {
        same_training_on_every_layout(lora);
    }
}

/// Three steps of the loop (of `lora`'s adapters, if any) train alike on
/// one device, data parallel and FSDP.
fn same_training_on_every_layout(lora: Option<LoraConfig>) {
    // μ = 2 and β > 0: the old and reference log-probs come from the
    // first device and are cut like the batch; 16 rows in micro-batches of 8.
    let variant = |parallelism| Variant {
        iterations: 2,
        beta: 0.04,
        parallelism,
        lora: lora.clone(),
        ..Variant::default()
    };
    let run = |parallelism| {
        let mut grpo = tiny_loop(Arc::new(LowTokens), variant(parallelism));
        let reports: Vec<_> = (0..3).map(|_| step(&mut grpo).0).collect();
        (
            reports,
            grpo.host_params().unwrap(),
            grpo.learner().state_bytes_per_device(),
        )
    };
    let (want, want_params, whole) = run(None);
    for parallelism in [
        Parallelism::DataParallel { devices: 2 },
        Parallelism::Fsdp { devices: 2 },
    ] {
        let (reports, params, per_device) = run(Some(parallelism));
        for (got, want) in reports.iter().zip(&want) {
            assert_eq!(got.reward, want.reward, "{parallelism:?}: the same samples");
            // The loss is a small sum of terms near 1: a few f32 roundings apart.
            assert!(
                (got.loss - want.loss).abs() <= 1e-5 * want.loss.abs().max(1e-3) + 5e-7,
                "{got:?} vs {want:?}"
            );
            // k3 = r − log r − 1 cancels to a small value: relative round-off grows.
            assert!(
                (got.kl - want.kl).abs() <= 1e-4 * want.kl.abs().max(1e-6),
                "{got:?} vs {want:?}"
            );
        }
        let worst = common::worst_relative_error(&params, &want_params);
        println!(
            "{parallelism:?}, adapters {}: worst parameter relative error after 3 steps {worst:?}; state bytes per device {per_device:?} (one device {whole:?})",
            lora.is_some()
        );
        assert!(worst.0 <= 1e-5, "{parallelism:?}: {worst:?}");
        if let Parallelism::Fsdp { .. } = parallelism {
            assert!(
                per_device.iter().all(|&b| b < whole[0] * 6 / 10),
                "{per_device:?} of {whole:?}"
            );
        }
    }
}

#[test]
fn lora_adapters_learn_with_the_engine_on_the_policy_and_the_base_as_reference() {
    for merge_on_push in [false, true] {
        lora_learns(merge_on_push);
    }
}

/// 40 steps of LoRA on every linear layer, pushing the adapters alone or
/// (`merge_on_push`) merged into whole weights.
fn lora_learns(merge_on_push: bool) {
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: Targets::AllLinear,
        use_rslora: false,
    };
    let mut grpo = tiny_loop(
        Arc::new(TargetToken(40)),
        Variant {
            lora: Some(lora),
            beta: 0.05,
            // LoRA's usual rate: ten times full fine-tuning's.
            lr: Some(3e-2),
            merge_on_push,
            ..Variant::default()
        },
    );
    let base: Vec<_> = {
        let learner = grpo.learner();
        learner
            .state()
            .frozen
            .iter()
            .map(|b| b.to_host::<f32>().unwrap())
            .collect()
    };
    let reports: Vec<_> = (0..40).map(|_| step(&mut grpo).0).collect();
    let mean = |r: &[StepReport]| r.iter().map(|s| s.reward).sum::<f64>() / r.len() as f64;
    let (first, last) = (mean(&reports[..5]), mean(&reports[35..]));
    eprintln!("LoRA (merge_on_push {merge_on_push}) reward {first:.3} → {last:.3}");
    assert!(last > first + 0.2, "the reward rises: {first:.3} → {last:.3}");
    for report in &reports {
        // The engine samples the policy the learner scores, after every step.
        assert!(
            report.sampling_logp_difference < 1e-4,
            "step {}: engine and learner log-probs differ by {} a token",
            report.step,
            report.sampling_logp_difference
        );
    }
    // The reference is the base: the first step's policy (B = 0) is it.
    assert!(reports[0].kl.abs() < 1e-6, "{}", reports[0].kl);
    assert!(reports[39].kl > 1e-6, "the adapters moved the policy: {reports:?}");
    let learner = grpo.learner();
    let after: Vec<_> = learner
        .state()
        .frozen
        .iter()
        .map(|b| b.to_host::<f32>().unwrap())
        .collect();
    assert!(after == base, "the base stays frozen");
    let trained = grpo.host_params().unwrap();
    assert!(
        trained.iter().all(|(name, _)| name.contains(".lora_")),
        "only adapters train"
    );
    let state = grpo.learner().host_optimizer().unwrap();
    let moments: Vec<&String> = state
        .iter()
        .map(|(name, _)| name)
        .filter(|n| n.starts_with("m.") || n.starts_with("v."))
        .collect();
    assert_eq!(moments.len(), 2 * trained.len(), "{moments:?}");
    assert!(
        moments.iter().all(|n| n.contains(".lora_")),
        "AdamW's moments of the adapters alone"
    );
    // What each sync sent: the adapters' f32 values, or the whole model's.
    let values = |tensors: &[(String, grpo_model::weights::HostTensor)]| -> u64 {
        tensors.iter().map(|(_, t)| 4 * t.data.len() as u64).sum()
    };
    let adapters = values(&trained);
    let model = 4 * base.iter().map(|b| b.len() as u64).sum::<u64>();
    let want = if merge_on_push { model } else { adapters };
    assert!(
        reports.iter().all(|r| r.weight_sync_bytes == want),
        "{want} B a sync: {reports:?}"
    );
    eprintln!("bytes a sync: {want} ({adapters} B of adapters, {model} B of model)");
}
