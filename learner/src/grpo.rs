//! GRPO's task: sample prompts → the rollout fleet draws `G` completions
//! of each (one prefill per group) → the reward pool scores them
//! ([`crate::rollouts`]: inline, or up to `max_staleness` steps ahead on a
//! thread) → group advantages → micro-batches → the learner's GRPO step
//! ([`crate::objective::grpo`]; old log-probs for μ > 1 passes and the
//! frozen reference's for β > 0 from [`crate::completion_logprobs`]) → the
//! new weights go to the fleet as the next policy version
//! ([`crate::fleet`]: in memory to the in-process engine, over gRPC to
//! workers).
//!
//! Memory beyond the learner's: an in-process engine's own copy of the
//! weights in its dtype, the frozen reference of β > 0 (laid out as the
//! learner's weights), the step's completions and micro-batches, and one
//! host copy of the weights while they are sent.

use std::collections::BTreeMap;
use std::time::Instant;

use grpo_model::chat::ChatMessage;
use grpo_model::decoder::Decoder;
use grpo_model::tokenizer::Tokenizer;
use grpo_reward::RewardPool;
use grpo_rollout::guided::{Grammars, Guide};
use grpo_rollout::output::FinishReason;
use grpo_xla::trace::{AdamW, Mesh, StepMetrics};
use grpo_xla::{Buffer, Client, ElementType, ShardedBuffer};
use serde_json::{Map, Value};

use crate::advantage::{ScaleRewards, advantages};
use crate::batch::{PromptSharing, TrainSample, attention_width, pack_sharing};
use crate::checkpoint::LoadedCheckpoint;
use crate::choices::Choices;
use crate::collect::{EpisodeSetup, PromptEncoder};
use crate::completion_logprobs::LogprobPrograms;
use crate::config::RunConfig;
use crate::data::{Example, PromptSampler, SamplerState};
use crate::episode::Episode;
use crate::error::{Error, Result};
use crate::fleet::{Fleet, FleetHealth, PolicyWeights};
use crate::learner::{Learner, Optimization, check_rows, lay_out};
use crate::loss::GrpoLoss;
use crate::metrics::{CompletionStats, EpisodeStats, eval_names, metrics_of, reward_breakdown};
use crate::objective::grpo::GrpoObjective;
use crate::record::{EpisodeRecord, RolloutRow};
use crate::rollouts::{Drawn, Filters, RolloutSide, Rollouts, Sampling};
use crate::schedule::Schedule;
use crate::trainer::{LoopState, StepRecord, Task, Trainer};

/// The settings of the iteration (from [`GrpoConfig::of`] a validated
/// run config: they are not checked again).
#[derive(Debug, Clone)]
pub struct GrpoConfig {
    /// Samples per prompt (G ≥ 2).
    pub group_size: usize,
    /// Prompts per step.
    pub prompts_per_step: usize,
    /// Most completion tokens.
    pub max_completion_tokens: usize,
    /// The loss (with the rollouts' sampling temperature).
    pub loss: GrpoLoss,
    /// Advantage scaling.
    pub scale_rewards: ScaleRewards,
    /// The learning-rate schedule.
    pub schedule: Schedule,
    /// AdamW's settings (the rate comes from the schedule).
    pub optimizer: AdamW,
    /// Global gradient-norm clipping.
    pub max_grad_norm: Option<f64>,
    /// Samples per micro-batch.
    pub micro_batch_rows: usize,
    /// Whether a group's samples may share one copy of their prompt in a
    /// row of the train step ([`crate::batch::PromptSharing`]).
    pub share_prompts: bool,
    /// The longest prompt + completion the learner takes.
    pub max_tokens: usize,
    /// The seed of the rollouts' sampling.
    pub seed: u32,
    /// Drop groups whose rewards are all equal before the update (DAPO's
    /// dynamic sampling, without re-sampling): they carry no signal.
    pub dynamic_sampling: bool,
    /// Completions cut by their token limit carry no loss (TRL's
    /// `mask_truncated_completions`).
    pub mask_truncated: bool,
    /// Optimizer steps per batch, μ ≥ 1 (TRL's `num_iterations`); with
    /// more than one the clipped ratio is against the policy before the first.
    pub iterations: usize,
    /// How many versions behind the learner a batch's policy may be: 0 is
    /// synchronous on-policy, k ≥ 1 generates ahead while training.
    pub max_staleness: usize,
    /// The run's dtypes: the train step's compute dtype (f32, or bf16 on
    /// f32 master weights) and the in-process engines'.
    pub choices: Choices,
    /// The rollouts' token filters and repetition penalty.
    pub filters: Filters,
    /// The rollouts' guide (a row's own takes precedence): their tokens
    /// are drawn under its mask; their recorded log-probs, like the
    /// learner's, are the unmasked policy's.
    pub guide: Option<Guide>,
    /// With adapters: push the policy merged into whole weights, not the
    /// adapters alone.
    pub merge_on_push: bool,
}

/// What one step did, under TRL's metric names where it has them (the
/// time split, weight sync, staleness and fleet are grpo's own).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepReport {
    /// The step's number (1-based, as TRL's `global_step`): the policy
    /// after it is version `step`, its checkpoint `checkpoint-<step>`.
    pub step: usize,
    /// Mean reward of the scored samples.
    pub reward: f64,
    /// Std of the rewards.
    pub reward_std: f64,
    /// Fraction of groups whose rewards were all equal.
    pub frac_reward_zero_std: f64,
    /// The completions' lengths (`completions/…`).
    #[serde(flatten)]
    pub completions: CompletionStats,
    /// A multi-turn run's tool calls, turns and episode ends (`tools/…`,
    /// `episode/…`; absent otherwise).
    #[serde(flatten)]
    pub episodes: Option<EpisodeStats>,
    /// The loss.
    pub loss: f32,
    /// Gradient norm before clipping.
    pub grad_norm: f32,
    /// The learning rate used.
    pub learning_rate: f64,
    /// Mean policy entropy over completion tokens.
    pub entropy: f64,
    /// Fraction of completion tokens whose ratio was clipped from below
    /// with a negative advantage.
    #[serde(rename = "clip_ratio/low_mean")]
    pub clip_ratio_low: f64,
    /// Fraction clipped from above with a positive advantage.
    #[serde(rename = "clip_ratio/high_mean")]
    pub clip_ratio_high: f64,
    /// Fraction clipped either way (the sum of the two: they are disjoint).
    #[serde(rename = "clip_ratio/region_mean")]
    pub clip_ratio_region: f64,
    /// Mean k3 KL to the reference over completion tokens (0 without one).
    pub kl: f64,
    /// Mean `|old − behaviour|` log-prob over completion tokens: how far
    /// the rollout engine's log-probs are from the learner's (TRL's name).
    #[serde(rename = "sampling/sampling_logp_difference/mean")]
    pub sampling_logp_difference: f64,
    /// The sparse layers' load-balancing loss, without its coefficient
    /// (transformers' `aux_loss`; absent unless the step adds it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aux_loss: Option<f32>,
    /// Seconds generating, scoring, training and syncing weights.
    pub time_generation: f64,
    /// See `time_generation`.
    pub time_reward: f64,
    /// See `time_generation`.
    pub time_train: f64,
    /// See `time_generation` (device → host copy and the fleet's update).
    pub time_weight_sync: f64,
    /// Samples the update trained on (fewer than drawn under dynamic sampling).
    pub trained_samples: usize,
    /// The rate at which the fleet took the new weights (GB/s of values;
    /// with max_staleness ≥ 1 the last update taken before this batch).
    pub weight_sync_gb_per_s: f64,
    /// Bytes of values that update sent (f32; LoRA adapters alone, or whole weights).
    pub weight_sync_bytes: u64,
    /// Versions between the learner and the policy that sampled the batch.
    pub staleness: u64,
    /// Samples left out for being more than max_staleness versions old.
    pub stale_samples: usize,
    /// The run's dtypes (`compute_dtype`, `engine_dtype`: null without an
    /// in-process engine), decided once ([`crate::choices`]).
    #[serde(flatten)]
    pub choices: Choices,
    /// How the rollout fleet stood after sampling the batch (written as
    /// `fleet_members`, `fleet_ready`, `fleet_requeued_groups`).
    #[serde(flatten)]
    pub fleet: FleetHealth,
    /// Each reward function's `rewards/<name>/mean` and `…/std`
    /// ([`reward_breakdown`]; last, as it takes every other key when read back).
    #[serde(flatten)]
    pub per_reward: BTreeMap<String, Option<f64>>,
}

/// What a greedy evaluation on held-out prompts found (written with
/// TRL's `eval_` prefix: `eval_reward`, `eval_completions/mean_length`, …).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EvalReport {
    /// Prompts evaluated.
    pub prompts: usize,
    /// Mean reward of the greedy completions.
    pub reward: f64,
    /// Fraction of prompts whose greedy completion earned a positive reward
    /// (for 0/1 rewards such as `math`: the accuracy).
    pub accuracy: f64,
    /// The completions' lengths.
    #[serde(flatten)]
    pub completions: CompletionStats,
    /// A multi-turn run's tool calls, turns and episode ends.
    #[serde(flatten)]
    pub episodes: Option<EpisodeStats>,
    /// Each reward function's mean and std.
    #[serde(flatten)]
    pub per_reward: BTreeMap<String, Option<f64>>,
    /// Seconds it took (transformers' `eval_runtime`).
    pub runtime: f64,
}

/// Compiles the run's guide and every row's own once, before anything
/// runs, so that one the engines would refuse stops the run at its start,
/// named (a row by its number).
fn check_guides<'a>(
    decoder: &Decoder,
    tokenizer: &std::sync::Arc<Tokenizer>,
    run: Option<&Guide>,
    rows: impl Iterator<Item = &'a Example>,
) -> Result<()> {
    let mut guides: Vec<(String, &Guide)> = run
        .map(|g| ("rollout.structured_outputs".to_string(), g))
        .into_iter()
        .collect();
    guides.extend(rows.filter_map(|row| {
        let guide = row.guide.as_ref()?;
        Some((format!("data row {} `structured_outputs`", row.index + 1), guide))
    }));
    if guides.is_empty() {
        return Ok(());
    }
    let model = decoder.config();
    let grammars =
        Grammars::new(tokenizer.clone(), model.vocab_size, &model.eos_token_ids).map_err(|e| Error::Config {
            field: "rollout.structured_outputs",
            message: e.to_string(),
        })?;
    let mut seen = std::collections::HashSet::new();
    for (place, guide) in guides {
        if seen.insert(format!("{guide:?}")) {
            grammars.compile(guide).map_err(|e| Error::Config {
                field: "rollout.structured_outputs",
                message: format!("{place}: {e}"),
            })?;
        }
    }
    Ok(())
}

impl GrpoConfig {
    /// The settings of `config` (validated as it was read) for a run of
    /// `steps` steps, with its `auto` settings decided as `choices`.
    pub fn of(config: &RunConfig, steps: usize, choices: Choices) -> GrpoConfig {
        let (r, a, o, t) = (&config.rollout, &config.algorithm, &config.optimizer, &config.trainer);
        GrpoConfig {
            group_size: r.group_size,
            prompts_per_step: r.prompts_per_step,
            max_completion_tokens: r.max_completion_tokens,
            loss: a.loss(r.temperature),
            scale_rewards: a.scale_rewards,
            schedule: o.schedule(steps),
            optimizer: o.adamw(),
            max_grad_norm: o.max_grad_norm(),
            micro_batch_rows: t.micro_batch_size,
            share_prompts: t.share_prompts,
            max_tokens: r.max_model_len,
            seed: r.seed,
            dynamic_sampling: a.dynamic_sampling,
            mask_truncated: a.mask_truncated_completions,
            iterations: a.num_iterations,
            max_staleness: r.max_staleness,
            choices,
            guide: r.guide().ok().flatten(),
            merge_on_push: config.lora.as_ref().is_some_and(|l| l.merge_on_push),
            filters: Filters {
                top_p: r.top_p,
                top_k: r.top_k as i32,
                min_p: r.min_p,
                repetition_penalty: r.repetition_penalty,
            },
        }
    }

    /// How the learner updates its weights.
    pub fn optimization(&self) -> Optimization {
        Optimization {
            optimizer: self.optimizer,
            max_grad_norm: self.max_grad_norm,
            compute: self.choices.compute_dtype.element_type(),
        }
    }
}

/// What GRPO's trainer is built from.
pub struct GrpoParts {
    /// The device client (shared by the engine and the learner).
    pub client: Client,
    /// The policy's decoder.
    pub decoder: Decoder,
    /// Its tokenizer (with the chat template for chat prompts).
    pub tokenizer: std::sync::Arc<Tokenizer>,
    /// The rollout engines (with the same tokenizer, for completion text).
    pub fleet: Box<dyn Fleet>,
    /// The rewards.
    pub rewards: RewardPool,
    /// The training prompts.
    pub data: Vec<Example>,
    /// The held-out prompts of the greedy evaluation (may be empty).
    pub eval: Vec<Example>,
    /// The seed of the prompt order.
    pub data_seed: u64,
    /// The learner's weights (a new run's start, or a checkpoint's): f32
    /// on the client's first device (a frozen base under adapters f32 or
    /// bf16), in the decoder's order.
    pub params: Vec<Buffer>,
    /// The devices the learner keeps its state and batches on.
    pub mesh: Mesh,
    /// The frozen reference policy of the KL term (f32 on the client's
    /// first device, the decoder's order; laid out on the mesh as the
    /// learner's weights): required when β > 0 without adapters; with
    /// adapters the reference is the learner's frozen base (adapters off)
    /// and this is `None`.
    pub reference: Option<Vec<Buffer>>,
    /// Multi-turn runs: the episodes' environment and budgets (`None`:
    /// one completion per sample).
    pub episodes: Option<EpisodeSetup>,
}

/// GRPO's rollouts, rewards and advantages feeding the learner.
pub struct GrpoTask {
    client: Client,
    rollouts: Rollouts,
    config: GrpoConfig,
    sampler: SamplerState,
    /// Rows of the training data (for the fractional epoch).
    data_rows: usize,
    /// The reward functions' names (for the per-reward metrics).
    reward_names: Vec<String>,
    eval: Vec<Example>,
    logprobs_programs: LogprobPrograms,
    reference: Option<Reference>,
}

/// The frozen reference policy of the KL term and its log-prob programs.
struct Reference {
    programs: LogprobPrograms,
    /// Its own weights; `None`: the learner's frozen base (the policy's
    /// adapters off), so the model is held once.
    weights: Option<Vec<ShardedBuffer>>,
}

impl Trainer<GrpoTask> {
    /// GRPO's trainer from its parts: a new run, or one continuing from
    /// `checkpoint` (whose weights are [`GrpoParts::params`]).
    pub fn grpo(parts: GrpoParts, config: GrpoConfig, checkpoint: Option<&LoadedCheckpoint>) -> Result<Self> {
        let GrpoParts {
            client,
            decoder,
            tokenizer,
            mut fleet,
            rewards,
            data,
            eval,
            data_seed,
            params,
            mesh,
            reference,
            episodes,
        } = parts;
        check_rows(&mesh, config.micro_batch_rows)?;
        check_guides(&decoder, &tokenizer, config.guide.as_ref(), data.iter().chain(&eval))?;
        let adapted = decoder.lora().is_some();
        if (config.loss.beta > 0.0 && !adapted) != reference.is_some() {
            return Err(Error::Config {
                field: "algorithm.beta",
                message: format!(
                    "β = {} needs reference weights exactly when it is above 0 without adapters",
                    config.loss.beta
                ),
            });
        }
        let objective = GrpoObjective::new(config.loss, config.iterations);
        let optimization = config.optimization();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::Config {
                field: "runtime",
                message: format!("cannot start the reward runtime: {e}"),
            })?;
        let mut start = match checkpoint {
            Some(checkpoint) => LoopState::of_checkpoint(checkpoint, data_seed)?,
            None => LoopState::start(data_seed),
        };
        start.choices = Some(config.choices);
        let step = start.step as usize;
        let optimizer = checkpoint.map(|c| &c.optimizer);
        let mut learner = Learner::new(&client, &decoder, mesh, objective, optimization, params, optimizer)?;
        let mesh = learner.mesh().clone();
        // The fleet starts on the learner's weights, as version `step`. Its
        // engines were built on the base model's: with adapters they take
        // the policy merged as every later sync merges it, so a resumed run
        // samples exactly as the run it continues.
        if decoder.lora().is_some() {
            let weights = policy_weights(&mut learner, fleet.shared_device(), !config.merge_on_push)?;
            fleet.update_weights(start.step, weights)?;
        } else {
            fleet.start_at(start.step, &|| learner.host_policy())?;
        }
        let reward_names = rewards.names();
        let data_rows = data.len();
        let side = RolloutSide {
            fleet,
            rewards,
            runtime,
            encoder: PromptEncoder::new(tokenizer)?,
            sampler: PromptSampler::resume(data.len(), data_seed, start.sampler),
            data,
            sampling: Sampling {
                group_size: config.group_size,
                prompts_per_step: config.prompts_per_step,
                max_completion_tokens: config.max_completion_tokens,
                temperature: config.loss.temperature,
                seed: config.seed,
                filters: config.filters,
            },
            version: start.step,
            episodes,
            guide: config.guide.clone(),
        };
        let temperature = config.loss.temperature;
        let reference = (config.loss.beta > 0.0)
            .then(|| -> Result<Reference> {
                Ok(Reference {
                    programs: LogprobPrograms::new(&client, &decoder.base(), &mesh, temperature),
                    weights: reference.map(|weights| lay_out(&client, &mesh, weights)).transpose()?,
                })
            })
            .transpose()?;
        let task = GrpoTask {
            logprobs_programs: LogprobPrograms::new(&client, &decoder, &mesh, config.loss.temperature),
            reference,
            client: client.clone(),
            rollouts: Rollouts::new(side, config.max_staleness, step)?,
            sampler: start.sampler,
            data_rows,
            reward_names,
            eval,
            config,
        };
        Ok(Trainer::new(learner, task, start))
    }
}

impl Task for GrpoTask {
    type Objective = GrpoObjective;

    fn step(&mut self, learner: &mut Learner<GrpoObjective>, step: usize) -> Result<StepRecord> {
        let c = self.config.clone();
        let drawn = self.rollouts.next(step)?;
        let staleness = step as u64 - drawn.version.min(step as u64);
        let stale = staleness > c.max_staleness as u64;
        let collected = &drawn.collected;
        let rewards = collected.rewards();
        let adv = advantages(&rewards, c.group_size, c.scale_rewards)?;

        let training = Instant::now();
        let rollouts: Vec<TrainSample> = collected
            .groups
            .iter()
            .zip(&collected.prompts)
            .enumerate()
            .flat_map(|(g, (group, prompt))| {
                group
                    .iter()
                    .enumerate()
                    .map(move |(j, completion)| (g, j, completion, prompt))
            })
            .enumerate()
            .filter(|(_, (g, _, _, _))| !(stale || c.dynamic_sampling && adv.zero_std[*g]))
            .map(|(i, (g, j, completion, prompt))| TrainSample {
                prompt: prompt.ids.clone(),
                completion: completion.tokens.clone(),
                loss_mask: if c.mask_truncated && completion.finish_reason == FinishReason::Length {
                    vec![false; completion.tokens.len()]
                } else {
                    collected.loss_mask(g, j)
                },
                behaviour_logprobs: completion.logprobs.clone(),
                advantage: adv.values[i],
                valid: adv.valid[i],
            })
            .collect();
        let lr = c.schedule.at(step);
        let (metrics, tokens) = if rollouts.is_empty() {
            // Dynamic sampling dropped every group: nothing to learn from this step.
            let nothing = StepMetrics {
                loss: 0.0,
                grad_norm: 0.0,
                metrics: vec![0.0; GrpoObjective::METRICS],
            };
            (nothing, 0)
        } else {
            self.train(learner, &rollouts, lr, step)?
        };
        let trained = training.elapsed().as_secs_f64();

        let syncing = Instant::now();
        let weights = policy_weights(learner, self.rollouts.shared_device(), !c.merge_on_push)?;
        let sync = self.rollouts.update_weights(step as u64 + 1, weights)?.or(drawn.sync);
        let synced = syncing.elapsed().as_secs_f64();

        let present: Vec<f64> = rewards.iter().flatten().map(|&r| f64::from(r)).collect();
        let mean = present.iter().sum::<f64>() / present.len().max(1) as f64;
        let std = (present.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / present.len().max(1) as f64).sqrt();
        let per_token = |sum: f32| f64::from(sum) / tokens.max(1) as f64;
        let report = StepReport {
            step: step + 1,
            reward: mean,
            reward_std: std,
            frac_reward_zero_std: adv.frac_zero_std(),
            completions: CompletionStats::of(collected.completions()),
            episodes: EpisodeStats::of(collected.episodes.iter().flatten()),
            loss: metrics.loss,
            grad_norm: metrics.grad_norm,
            learning_rate: lr,
            entropy: per_token(metrics.metrics[3]),
            clip_ratio_low: per_token(metrics.metrics[0]),
            clip_ratio_high: per_token(metrics.metrics[1]),
            clip_ratio_region: per_token(metrics.metrics[0] + metrics.metrics[1]),
            kl: per_token(metrics.metrics[2]),
            sampling_logp_difference: per_token(metrics.metrics[4]),
            aux_loss: learner.balance_loss(&metrics),
            trained_samples: rollouts.len(),
            time_generation: collected.time_generation,
            time_reward: collected.time_reward,
            time_train: trained,
            time_weight_sync: synced,
            weight_sync_gb_per_s: sync.map_or(0.0, |s| s.gb_per_second()),
            weight_sync_bytes: sync.map_or(0, |s| s.bytes),
            staleness,
            stale_samples: if stale { collected.completions().count() } else { 0 },
            choices: c.choices,
            fleet: drawn.fleet,
            per_reward: reward_breakdown(&self.reward_names, &collected.totals),
        };
        let rows = rollout_rows(step + 1, &drawn, &rewards, &adv.values);
        self.sampler = drawn.sampler;
        Ok(StepRecord {
            step: step + 1,
            metrics: metrics_of(&report),
            tokens: rows.iter().map(|r| r.completion_tokens as usize).sum(),
            input_tokens: collected
                .groups
                .iter()
                .zip(&collected.prompts)
                .map(|(group, prompt)| group.iter().map(|c| prompt.ids.len() + c.tokens.len()).sum::<usize>())
                .sum(),
            rollouts: rows,
            notes: Vec::new(),
        })
    }

    fn evaluate(&mut self, _: &Learner<GrpoObjective>) -> Result<Option<Map<String, Value>>> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let report = self.greedy_eval()?;
        Ok(Some(eval_names(metrics_of(&report))))
    }

    fn sampler(&self) -> SamplerState {
        self.sampler
    }

    fn epoch(&self) -> f64 {
        self.sampler.epochs(self.data_rows)
    }
}

/// The step's rollouts as rollout-log rows of step `step` (1-based).
fn rollout_rows(step: usize, drawn: &Drawn, rewards: &[Option<f32>], advantages: &[f32]) -> Vec<RolloutRow> {
    let collected = &drawn.collected;
    let mut log = Vec::with_capacity(rewards.len());
    for (g, (group, prompt)) in collected.groups.iter().zip(&collected.prompts).enumerate() {
        let columns = serde_json::Value::Object(drawn.columns[g].clone()).to_string();
        for (j, completion) in group.iter().enumerate() {
            let i = log.len();
            log.push(RolloutRow {
                step: step as u64,
                policy_version: completion.versions.first().copied().unwrap_or(drawn.version),
                group: g as u32,
                sample: completion.index as u32,
                prompt: prompt.text.clone(),
                completion: completion.text.clone().unwrap_or_default(),
                reward: rewards[i],
                advantage: advantages[i],
                completion_tokens: completion.tokens.len() as u32,
                finish_reason: completion.finish_reason.as_str().to_string(),
                columns: columns.clone(),
                episode: collected.episodes.get(g).map(|e| episode_record(&e[j])),
            });
        }
    }
    log
}

/// What the rollout log keeps of `episode`.
fn episode_record(episode: &Episode) -> EpisodeRecord {
    let messages: Vec<serde_json::Value> = episode.messages.iter().map(openai_message).collect();
    EpisodeRecord {
        messages: serde_json::Value::Array(messages).to_string(),
        token_ids: episode.tokens.clone(),
        loss_mask: episode.loss_mask.clone(),
        turns: episode.turns as u32,
        tool_calls: episode.tool_calls as u32,
        end: episode.end.as_str().to_string(),
    }
}

/// `message` as OpenAI's chat API writes it (a call's arguments as JSON text).
fn openai_message(message: &ChatMessage) -> serde_json::Value {
    let mut json = serde_json::json!({"role": message.role, "content": message.content});
    if !message.tool_calls.is_empty() {
        let calls: Vec<serde_json::Value> = message
            .tool_calls
            .iter()
            .map(|call| {
                serde_json::json!({
                    "type": "function",
                    "function": {"name": call.name, "arguments": serde_json::Value::Object(call.arguments.clone()).to_string()},
                })
            })
            .collect();
        json["tool_calls"] = serde_json::Value::Array(calls);
    }
    json
}

impl GrpoTask {
    /// Greedy completions of the held-out prompts (one each, at most
    /// `max_completion_tokens`), scored by the rewards.
    fn greedy_eval(&mut self) -> Result<EvalReport> {
        let started = Instant::now();
        let collected = self.rollouts.evaluate(&self.eval, self.config.max_completion_tokens)?;
        let rewards = collected.rewards();
        let n = rewards.len().max(1) as f64;
        Ok(EvalReport {
            prompts: self.eval.len(),
            reward: rewards.iter().map(|r| f64::from(r.unwrap_or(0.0))).sum::<f64>() / n,
            accuracy: rewards.iter().filter(|r| r.is_some_and(|r| r > 0.0)).count() as f64 / n,
            completions: CompletionStats::of(collected.completions()),
            episodes: EpisodeStats::of(collected.episodes.iter().flatten()),
            per_reward: reward_breakdown(&self.reward_names, &collected.totals),
            runtime: started.elapsed().as_secs_f64(),
        })
    }

    /// `iterations` optimizer steps of `learner` on `rollouts` at learning
    /// rate `lr` for the run's step `step` (the old log-probs of the ratio
    /// taken before the first when there are several): the last step's
    /// metrics and the completion tokens that counted.
    fn train(
        &mut self,
        learner: &mut Learner<GrpoObjective>,
        rollouts: &[TrainSample],
        lr: f64,
        step: usize,
    ) -> Result<(StepMetrics, usize)> {
        let c = &self.config;
        let sharing = PromptSharing {
            max_slots: if c.share_prompts { c.group_size } else { 1 },
            attention_width: attention_width(learner.decoder().config()),
            row_multiple: learner.mesh().size(),
        };
        let batch = pack_sharing(
            rollouts,
            c.micro_batch_rows,
            c.max_tokens,
            c.loss.loss_type,
            c.max_completion_tokens,
            sharing,
        )?;
        let shape = batch.shape();
        let mut uploaded = batch
            .micro_batches
            .iter()
            .enumerate()
            .map(|(i, m)| m.upload(&self.client, learner.mesh(), batch.micro_normalizer(i)))
            .collect::<Result<Vec<_>>>()?;
        for inputs in &mut uploaded {
            // After the six batch inputs: the old log-probs, then the reference's.
            if c.iterations > 1 {
                self.logprobs_programs.append(&learner.policy(), shape, inputs)?;
            }
            if let Some(reference) = &mut self.reference {
                let weights: Vec<&ShardedBuffer> = match &reference.weights {
                    Some(own) => own.iter().collect(),
                    None => learner.state().frozen.iter().collect(),
                };
                reference.programs.append(&weights, shape, inputs)?;
            }
        }
        let first = (step * c.iterations) as u64;
        let mut metrics = learner.train(shape, &uploaded, lr as f32, first)?;
        for iteration in 1..c.iterations {
            metrics = learner.train(shape, &uploaded, lr as f32, first + iteration as u64)?;
        }
        Ok((metrics, batch.tokens))
    }
}

/// The learner's new weights for the fleet: its adapters alone when it
/// trains some and `adapters` asks for them alone; else the policy
/// (adapters merged in) as copies made on the device when the fleet's lone
/// in-process engine shares the learner's one device (`shared`), else as
/// host tensors.
fn policy_weights(
    learner: &mut Learner<GrpoObjective>,
    shared: Option<(i32, ElementType)>,
    adapters: bool,
) -> Result<PolicyWeights> {
    if adapters && let Some(lora) = learner.decoder().lora() {
        return Ok(PolicyWeights::Adapters {
            lora: lora.clone(),
            tensors: learner.host_params()?.into(),
        });
    }
    let started = Instant::now();
    if let Some((device, dtype)) = shared
        && let Some(buffers) = learner.engine_weights(device, dtype)?
    {
        return Ok(PolicyWeights::Device {
            buffers,
            copy_seconds: started.elapsed().as_secs_f64(),
        });
    }
    Ok(PolicyWeights::Host(learner.host_policy()?.into()))
}
