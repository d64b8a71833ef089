//! One GRPO iteration: sample prompts → the rollout fleet draws `G`
//! completions of each (one prefill per group) → the reward pool scores
//! them ([`crate::rollouts`]: inline, or up to `max_staleness` steps ahead
//! on a thread) → group advantages → micro-batches → the compiled GRPO
//! step (forward, loss, backward, clipping, AdamW; old log-probs for μ > 1
//! passes and the frozen reference's for β > 0 from
//! [`crate::completion_logprobs`]) → the new weights go to the fleet as the
//! next policy version ([`crate::fleet`]: in memory to the in-process
//! engine, over gRPC to workers).
//!
//! The learner keeps f32 master weights and AdamW state on its device, or
//! sharded over several ([`crate::placement`]), donated and updated in
//! place; an in-process engine shares the first device and holds its own
//! copy of the weights in its dtype (the frozen reference of β > 0 is laid
//! out as the learner's weights). Memory per step beyond those: the step's
//! completions, their micro-batches and one host copy of the weights while
//! they are sent.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::weights::HostTensor;
use grpo_reward::RewardPool;
use grpo_rollout::output::FinishReason;
use grpo_xla::trace::{AdamW, StepMetrics};
use grpo_xla::{Buffer, Client, ElementType};

use crate::advantage::{ScaleRewards, advantages};
use crate::batch::{PromptSharing, Rollout, attention_width, pack_sharing};
use crate::checkpoint::{LoadedCheckpoint, TrainingCheckpoint, named_params, optimizer_names};
use crate::collect::PromptEncoder;
use crate::completion_logprobs::CompletionLogprobs;
use crate::data::{Example, PromptSampler, SamplerState};
use crate::error::{Error, Result};
use crate::fleet::{Fleet, FleetHealth, Weights};
use crate::loss::GrpoLoss;
use crate::placement::{LearnerState, OptimizerState, Placement};
use crate::record::RolloutRow;
use crate::rollouts::{Drawn, RolloutSide, Rollouts, Sampling};
use crate::schedule::Schedule;
use crate::trainer::{GrpoStep, MicroBatchShape, OldLogprobs, StepConfig, micro_normalizer};

/// The settings of the iteration.
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
    /// Optimizer steps per batch, μ ≥ 1 (TRL's `num_iterations`); with
    /// more than one the clipped ratio is against the policy before the first.
    pub iterations: usize,
    /// How many versions behind the learner a batch's policy may be: 0 is
    /// synchronous on-policy, k ≥ 1 generates ahead while training.
    pub max_staleness: usize,
    /// The train step's compute dtype (f32, or bf16 on f32 master weights).
    pub compute: ElementType,
}

/// What one step did (TRL's metric names where they exist).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
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
    /// Mean completion length in tokens.
    pub mean_length: f64,
    /// Fraction of completions that reached the token limit.
    pub clipped_ratio: f64,
    /// The loss.
    pub loss: f32,
    /// Gradient norm before clipping.
    pub grad_norm: f32,
    /// The learning rate used.
    pub learning_rate: f64,
    /// Mean policy entropy over completion tokens.
    pub entropy: f64,
    /// Fraction of completion tokens clipped from below / above.
    pub clip_ratio_low: f64,
    /// See `clip_ratio_low`.
    pub clip_ratio_high: f64,
    /// Mean k3 KL to the reference over completion tokens (0 without one).
    pub kl: f64,
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
    /// Versions between the learner and the policy that sampled the batch.
    pub staleness: u64,
    /// Samples left out for being more than max_staleness versions old.
    pub stale_samples: usize,
    /// How the rollout fleet stood after sampling the batch (written as
    /// `fleet_members`, `fleet_ready`, `fleet_requeued_groups`).
    #[serde(flatten)]
    pub fleet: FleetHealth,
}

/// What a greedy evaluation on held-out prompts found.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EvalReport {
    /// Prompts evaluated.
    pub prompts: usize,
    /// Mean reward of the greedy completions.
    pub reward: f64,
    /// Fraction of prompts whose greedy completion earned a positive reward
    /// (for 0/1 rewards such as `math`: the accuracy).
    pub accuracy: f64,
    /// Mean completion length in tokens.
    pub mean_length: f64,
    /// Seconds it took.
    pub seconds: f64,
}

/// Where the loop is, as a checkpoint's `trainer_state.json` keeps it. The
/// rollouts' sampling seeds derive from the step, so this is all a resumed
/// run needs to continue exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoopState {
    /// Steps completed.
    pub step: u64,
    /// The prompt sampler's position.
    pub sampler: SamplerState,
    /// The data order's seed (a resumed run must use the same).
    pub data_seed: u64,
}

/// The GRPO iteration's components and state.
pub struct GrpoLoop {
    client: Client,
    decoder: Decoder,
    rollouts: Rollouts,
    config: GrpoConfig,
    sampler: SamplerState,
    data_seed: u64,
    placement: Placement,
    state: LearnerState,
    steps: HashMap<(MicroBatchShape, bool), GrpoStep>,
    logprobs_programs: CompletionLogprobs,
    reference: Option<LearnerState>,
    step: usize,
}

/// What the loop is built from.
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
    /// The seed of the prompt order.
    pub data_seed: u64,
    /// The learner's initial weights: f32 on the client's first device, in
    /// the decoder's order.
    pub params: Vec<Buffer>,
    /// Where the learner keeps its state and batches (one device, or
    /// sharded over several).
    pub placement: Placement,
    /// The frozen reference policy of the KL term (f32 on the client's
    /// first device, the decoder's order; laid out on `placement` as the
    /// learner's weights): required when β > 0, unused otherwise.
    pub reference: Option<Vec<Buffer>>,
}

/// A checkpoint's state for the loop to continue from (its parameters are
/// the [`GrpoParts::params`] and the engine's weights).
pub struct Resume {
    /// The loop state.
    pub state: LoopState,
    /// The optimizer state, in [`grpo_xla::trace::Optimizer::state_spec`]
    /// order (empty before the first step), on the host until the loop
    /// lays it out on its placement.
    pub optimizer: Vec<HostTensor>,
}

impl Resume {
    /// The loop and optimizer state of `checkpoint`, checked against the model.
    pub fn from_checkpoint(checkpoint: LoadedCheckpoint, decoder: &Decoder, optimizer: &AdamW) -> Result<Resume> {
        let LoadedCheckpoint {
            dir,
            optimizer: mut saved,
            state,
        } = checkpoint;
        let state: LoopState = serde_json::from_value(state).map_err(|e| Error::Data {
            path: dir.join(crate::checkpoint::STATE_FILE),
            line: 0,
            message: format!("not a grpo run's loop state: {e}"),
        })?;
        let names = optimizer_names(decoder, optimizer);
        let tensors = if saved.is_empty() {
            Vec::new()
        } else {
            names
                .iter()
                .map(|(name, ty)| {
                    let tensor = saved.remove(name).ok_or_else(|| Error::Data {
                        path: dir.join(crate::checkpoint::OPTIMIZER_FILE),
                        line: 0,
                        message: format!(
                            "no optimizer tensor `{name}`: the checkpoint is of another model or optimizer"
                        ),
                    })?;
                    let dims = tensor.dims_i64();
                    if dims != ty.dims {
                        return Err(Error::Data {
                            path: dir.join(crate::checkpoint::OPTIMIZER_FILE),
                            line: 0,
                            message: format!("`{name}` has shape {dims:?}, the model needs {:?}", ty.dims),
                        });
                    }
                    Ok(tensor)
                })
                .collect::<Result<Vec<_>>>()?
        };
        Ok(Resume {
            state,
            optimizer: tensors,
        })
    }
}

impl GrpoLoop {
    /// The loop from its parts, starting at step 0.
    pub fn new(parts: GrpoParts, config: GrpoConfig) -> Result<GrpoLoop> {
        Self::resume(parts, config, None)
    }

    /// The loop from its parts, continuing from `resume` when given.
    pub fn resume(parts: GrpoParts, config: GrpoConfig, resume: Option<Resume>) -> Result<GrpoLoop> {
        let GrpoParts {
            client,
            decoder,
            tokenizer,
            mut fleet,
            rewards,
            data,
            data_seed,
            params,
            placement,
            reference,
        } = parts;
        placement.check_rows(config.micro_batch_rows)?;
        if (config.loss.beta > 0.0) != reference.is_some() {
            return Err(Error::Config {
                field: "algorithm.beta",
                message: format!(
                    "β = {} needs a reference policy exactly when it is above 0",
                    config.loss.beta
                ),
            });
        }
        if config.iterations == 0 {
            return Err(Error::Config {
                field: "algorithm.num_iterations",
                message: "0: at least one optimizer step per batch".to_string(),
            });
        }
        if config.group_size < 2 {
            return Err(Error::Config {
                field: "group_size",
                message: format!("{}: GRPO needs at least 2 samples per prompt", config.group_size),
            });
        }
        config.loss.validate()?;
        config.schedule.validate()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::Config {
                field: "runtime",
                message: format!("cannot start the reward runtime: {e}"),
            })?;
        let (sampler, step, optimizer) = match resume {
            Some(Resume { state, optimizer }) => {
                if state.data_seed != data_seed {
                    return Err(Error::Config {
                        field: "data.seed",
                        message: format!(
                            "the checkpoint's run used seed {}, this config {data_seed}: resume with the same data settings",
                            state.data_seed
                        ),
                    });
                }
                (state.sampler, state.step as usize, optimizer)
            }
            None => (SamplerState { epoch: 0, position: 0 }, 0, Vec::new()),
        };
        // The fleet starts on the learner's weights, as version `step`.
        fleet.start_at(step as u64, &named_params(&decoder, &params))?;
        let side = RolloutSide {
            fleet,
            rewards,
            runtime,
            encoder: PromptEncoder::new(tokenizer)?,
            sampler: PromptSampler::resume(data.len(), data_seed, sampler),
            data,
            sampling: Sampling {
                group_size: config.group_size,
                prompts_per_step: config.prompts_per_step,
                max_completion_tokens: config.max_completion_tokens,
                temperature: config.loss.temperature,
                seed: config.seed,
            },
            version: step as u64,
        };
        let logprobs_programs = CompletionLogprobs::new(&client, &decoder, &placement, config.loss.temperature);
        let zeros = optimizer_names(&decoder, &config.optimizer);
        let optimizer = match optimizer.is_empty() {
            true => OptimizerState::Zeros(&zeros),
            false => OptimizerState::Resumed(&optimizer),
        };
        let state = placement.state(&client, params, optimizer)?;
        let reference = reference
            .map(|weights| placement.state(&client, weights, OptimizerState::Frozen))
            .transpose()?;
        Ok(GrpoLoop {
            logprobs_programs,
            reference,
            client,
            decoder,
            rollouts: Rollouts::new(side, config.max_staleness, step)?,
            config,
            sampler,
            data_seed,
            placement,
            state,
            steps: HashMap::new(),
            step,
        })
    }

    /// Steps completed.
    pub fn steps_done(&self) -> usize {
        self.step
    }

    /// Where the loop is (what a checkpoint stores).
    pub fn loop_state(&self) -> LoopState {
        LoopState {
            step: self.step as u64,
            sampler: self.sampler,
            data_seed: self.data_seed,
        }
    }

    /// Runs one step and reports it with the step's rollouts.
    pub fn step(&mut self) -> Result<(StepReport, Vec<RolloutRow>)> {
        let c = self.config.clone();
        let drawn = self.rollouts.next(self.step)?;
        let staleness = self.step as u64 - drawn.version.min(self.step as u64);
        let stale = staleness > c.max_staleness as u64;
        let collected = &drawn.collected;
        let rewards = collected.rewards();
        let adv = advantages(&rewards, c.group_size, c.scale_rewards)?;

        let training = Instant::now();
        let rollouts: Vec<Rollout> = collected
            .groups
            .iter()
            .zip(&collected.prompts)
            .enumerate()
            .flat_map(|(g, (group, prompt))| group.iter().map(move |completion| (g, completion, prompt)))
            .enumerate()
            .filter(|(_, (g, _, _))| !(stale || c.dynamic_sampling && adv.zero_std[*g]))
            .map(|(i, (_, completion, prompt))| Rollout {
                prompt: prompt.ids.clone(),
                completion: completion.tokens.clone(),
                behaviour_logprobs: completion.logprobs.clone(),
                advantage: adv.values[i],
                valid: adv.valid[i],
            })
            .collect();
        let lr = c.schedule.at(self.step);
        let (metrics, tokens) = if rollouts.is_empty() {
            // Dynamic sampling dropped every group: nothing to learn from this step.
            let nothing = StepMetrics {
                loss: 0.0,
                grad_norm: 0.0,
                metrics: vec![0.0; 4],
            };
            (nothing, 0)
        } else {
            self.train(&rollouts, lr)?
        };
        let trained = training.elapsed().as_secs_f64();

        let syncing = Instant::now();
        let tensors: Weights = self.state.host_params(&self.decoder)?.into();
        let sync = self
            .rollouts
            .update_weights(self.step as u64 + 1, tensors)?
            .or(drawn.sync);
        let synced = syncing.elapsed().as_secs_f64();

        let present: Vec<f64> = rewards.iter().flatten().map(|&r| f64::from(r)).collect();
        let mean = present.iter().sum::<f64>() / present.len().max(1) as f64;
        let std = (present.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / present.len().max(1) as f64).sqrt();
        let samples = collected.completions().count().max(1) as f64;
        let per_token = |sum: f32| f64::from(sum) / tokens.max(1) as f64;
        let report = StepReport {
            step: self.step + 1,
            reward: mean,
            reward_std: std,
            frac_reward_zero_std: adv.frac_zero_std(),
            mean_length: collected.completions().map(|c| c.tokens.len()).sum::<usize>() as f64 / samples,
            clipped_ratio: collected
                .completions()
                .filter(|c| c.finish_reason == FinishReason::Length)
                .count() as f64
                / samples,
            loss: metrics.loss,
            grad_norm: metrics.grad_norm,
            learning_rate: lr,
            entropy: per_token(metrics.metrics[3]),
            clip_ratio_low: per_token(metrics.metrics[0]),
            clip_ratio_high: per_token(metrics.metrics[1]),
            kl: per_token(metrics.metrics[2]),
            trained_samples: rollouts.len(),
            time_generation: collected.time_generation,
            time_reward: collected.time_reward,
            time_train: trained,
            time_weight_sync: synced,
            weight_sync_gb_per_s: sync.map_or(0.0, |s| s.gb_per_second()),
            staleness,
            stale_samples: if stale { collected.completions().count() } else { 0 },
            fleet: drawn.fleet,
        };
        let log = self.rollout_rows(&drawn, &rewards, &adv.values);
        self.sampler = drawn.sampler;
        self.step += 1;
        Ok((report, log))
    }

    /// The step's rollouts as rollout-log rows (the step numbered 1-based).
    fn rollout_rows(&self, drawn: &Drawn, rewards: &[Option<f32>], advantages: &[f32]) -> Vec<RolloutRow> {
        let collected = &drawn.collected;
        let mut log = Vec::with_capacity(rewards.len());
        for (g, (group, prompt)) in collected.groups.iter().zip(&collected.prompts).enumerate() {
            let columns = serde_json::Value::Object(drawn.columns[g].clone()).to_string();
            for completion in group {
                let i = log.len();
                log.push(RolloutRow {
                    step: self.step as u64 + 1,
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
                });
            }
        }
        log
    }

    /// Greedy completions of `examples` (one each, at most
    /// `max_completion_tokens`), scored by the rewards.
    pub fn evaluate(&mut self, examples: &[Example]) -> Result<EvalReport> {
        let started = Instant::now();
        let collected = self.rollouts.evaluate(examples, self.config.max_completion_tokens)?;
        let rewards = collected.rewards();
        let n = rewards.len().max(1) as f64;
        Ok(EvalReport {
            prompts: examples.len(),
            reward: rewards.iter().map(|r| f64::from(r.unwrap_or(0.0))).sum::<f64>() / n,
            accuracy: rewards.iter().filter(|r| r.is_some_and(|r| r > 0.0)).count() as f64 / n,
            mean_length: collected.completions().map(|c| c.tokens.len()).sum::<usize>() as f64 / n,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Writes `OUT/checkpoint-<step>/` (policy, optimizer state, loop state), atomically.
    pub fn checkpoint(&self, out: &Path, config: &ModelConfig, tokenizer: &Tokenizer) -> Result<PathBuf> {
        TrainingCheckpoint {
            step: self.step as u64,
            model: (config, tokenizer),
            decoder: &self.decoder,
            optimizer: &self.config.optimizer,
            state: &self.state,
            loop_state: serde_json::to_value(self.loop_state()).expect("the loop state serializes"),
        }
        .save(out)
    }

    /// `iterations` optimizer steps on `rollouts` at learning rate `lr`
    /// (the old log-probs of the ratio taken before the first when there
    /// are several): the last step's metrics and the completion tokens
    /// that counted.
    fn train(&mut self, rollouts: &[Rollout], lr: f64) -> Result<(StepMetrics, usize)> {
        let c = &self.config;
        let sharing = PromptSharing {
            max_slots: if c.share_prompts { c.group_size } else { 1 },
            attention_width: attention_width(self.decoder.config()),
            row_multiple: self.placement.device_count(),
        };
        let batch = pack_sharing(
            rollouts,
            c.micro_batch_rows,
            c.max_tokens,
            c.loss.loss_type,
            c.max_completion_tokens,
            sharing,
        )?;
        let count = batch.micro_batches.len();
        let shape = batch.micro_batches[0].shape;
        let share = micro_normalizer(batch.normalizer, count);
        let mut uploaded = batch
            .micro_batches
            .iter()
            .map(|m| m.upload(&self.client, &self.placement, share))
            .collect::<Result<Vec<_>>>()?;
        let iterations = c.iterations;
        for inputs in &mut uploaded {
            // After the six batch inputs: the old log-probs, then the reference's.
            if iterations > 1 {
                self.logprobs_programs.append(&self.state, shape, inputs)?;
            }
            if let Some(reference) = &self.reference {
                self.logprobs_programs.append(reference, shape, inputs)?;
            }
        }
        self.compile_step(shape, count)?;
        let step = &self.steps[&(shape, count > 1)];
        let mut metrics = step.step(&mut self.state, &uploaded, lr as f32)?;
        for _ in 1..iterations {
            metrics = step.step(&mut self.state, &uploaded, lr as f32)?;
        }
        Ok((metrics, batch.tokens))
    }

    /// Compiles the GRPO step for `count` micro-batches of `shape` unless it is.
    fn compile_step(&mut self, shape: MicroBatchShape, count: usize) -> Result<()> {
        let key = (shape, count > 1);
        if !self.steps.contains_key(&key) {
            let config = StepConfig {
                dtype: ElementType::F32,
                compute: self.config.compute,
                loss: self.config.loss,
                old: if self.config.iterations > 1 {
                    OldLogprobs::Input
                } else {
                    OldLogprobs::OnPolicy
                },
                optimizer: &self.config.optimizer,
                max_grad_norm: self.config.max_grad_norm,
            };
            let step = GrpoStep::compile(&self.client, &self.decoder, &config, &self.placement, shape, count)?;
            self.steps.insert(key, step);
        }
        Ok(())
    }

    /// Train-step programs compiled so far (one per token bucket and accumulation mode).
    pub fn compiled_steps(&self) -> usize {
        self.steps.len()
    }

    /// The learner's current parameters as named f32 host tensors (the
    /// decoder's order), gathered from their shards.
    pub fn host_params(&self) -> Result<Vec<(String, HostTensor)>> {
        self.state.host_params(&self.decoder)
    }

    /// Device bytes of parameters and optimizer state held by each of the
    /// learner's devices.
    pub fn state_bytes_per_device(&self) -> Vec<usize> {
        self.state.device_bytes()
    }
}
