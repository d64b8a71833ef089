//! One GRPO iteration in one process, on-policy: sample prompts → the
//! rollout engine draws `G` completions of each (one prefill per group) →
//! the reward pool scores them → group advantages → micro-batches → the
//! compiled GRPO step (forward, loss, backward, clipping, AdamW) → the new
//! weights go to the engine as the next policy version.
//!
//! The engine and the learner share the device; the learner keeps f32
//! master weights and AdamW state (donated, updated in place); the engine
//! holds its own copy of the weights in its dtype and receives every update
//! through [`Engine::update_weights`] (the in-memory path; the gRPC path is
//! [`grpo_rollout::worker`]). Memory per step beyond those: the step's
//! completions and their micro-batches on the host.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use grpo_model::chat::{ChatMessage, ChatTemplate};
use grpo_model::decoder::Decoder;
use grpo_model::tokenizer::Tokenizer;
use grpo_reward::{Message, RewardPool, Sample};
use grpo_rollout::engine::{Engine, InFlight};
use grpo_rollout::request::{Request, SamplingParams};
use grpo_xla::trace::{AdamW, TrainState};
use grpo_xla::{Buffer, Client, ElementType};

use crate::advantage::{ScaleRewards, advantages};
use crate::batch::{Rollout, pack};
use crate::checkpoint::host_tensor;
use crate::data::{Example, Prompt, PromptSampler};
use crate::error::{Error, Result};
use crate::loss::GrpoLoss;
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
    /// Sampling temperature of the rollouts.
    pub temperature: f32,
    /// The loss.
    pub loss: GrpoLoss,
    /// Advantage scaling.
    pub scale_rewards: ScaleRewards,
    /// The learning-rate schedule.
    pub schedule: Schedule,
    /// AdamW's settings (the rate comes from the schedule).
    pub optimizer: AdamW,
    /// Global gradient-norm clipping.
    pub max_grad_norm: Option<f64>,
    /// Rows per micro-batch.
    pub micro_batch_rows: usize,
    /// The longest prompt + completion the learner takes.
    pub max_tokens: usize,
    /// The seed of the rollouts' sampling.
    pub seed: u32,
}

/// What one step did (TRL's metric names where they exist).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StepReport {
    /// The step (0-based).
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
    /// Seconds generating, scoring, training and syncing weights.
    pub time_generation: f64,
    /// See `time_generation`.
    pub time_reward: f64,
    /// See `time_generation`.
    pub time_train: f64,
    /// See `time_generation`.
    pub time_weight_sync: f64,
}

/// The GRPO iteration's components and state.
pub struct GrpoLoop {
    client: Client,
    decoder: Decoder,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    engine: Engine,
    rewards: RewardPool,
    runtime: tokio::runtime::Runtime,
    config: GrpoConfig,
    data: Vec<Example>,
    sampler: PromptSampler,
    state: TrainState,
    steps: HashMap<(MicroBatchShape, bool), GrpoStep>,
    step: usize,
}

/// What the loop is built from.
pub struct GrpoParts {
    /// The device client (shared by the engine and the learner).
    pub client: Client,
    /// The policy's decoder.
    pub decoder: Decoder,
    /// Its tokenizer (with the chat template for chat prompts).
    pub tokenizer: Arc<Tokenizer>,
    /// The rollout engine (with the same tokenizer, for completion text).
    pub engine: Engine,
    /// The rewards.
    pub rewards: RewardPool,
    /// The training prompts.
    pub data: Vec<Example>,
    /// The seed of the prompt order.
    pub data_seed: u64,
    /// The learner's initial weights: f32, in the decoder's order.
    pub params: Vec<Buffer>,
}

impl GrpoLoop {
    /// The loop from its parts.
    pub fn new(parts: GrpoParts, config: GrpoConfig) -> Result<GrpoLoop> {
        let GrpoParts {
            client,
            decoder,
            tokenizer,
            engine,
            rewards,
            data,
            data_seed,
            params,
        } = parts;
        if config.group_size < 2 {
            return Err(Error::Config {
                field: "group_size",
                message: format!("{}: GRPO needs at least 2 samples per prompt", config.group_size),
            });
        }
        config.loss.validate()?;
        config.schedule.validate()?;
        let template = tokenizer.chat_template().map(ChatTemplate::new).transpose()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::Config {
                field: "runtime",
                message: format!("cannot start the reward runtime: {e}"),
            })?;
        let sampler = PromptSampler::new(data.len(), data_seed);
        let optimizer_state = TrainState {
            params,
            optimizer: Vec::new(),
        };
        Ok(GrpoLoop {
            client,
            decoder,
            tokenizer,
            template,
            engine,
            rewards,
            runtime,
            config,
            data,
            sampler,
            state: optimizer_state,
            steps: HashMap::new(),
            step: 0,
        })
    }

    /// The prompt's token ids (chat prompts through the template).
    fn encode(&self, prompt: &Prompt) -> Result<(String, Vec<Message>, Vec<u32>)> {
        let (text, messages) = match prompt {
            Prompt::Text(text) => (text.clone(), Vec::new()),
            Prompt::Chat(turns) => {
                let template = self.template.as_ref().ok_or_else(|| Error::Config {
                    field: "prompt",
                    message: "chat prompts need a tokenizer with a chat template".to_string(),
                })?;
                let special = self.tokenizer.special_tokens();
                let token = |id: Option<u32>| id.and_then(|i| self.tokenizer.id_to_token(i)).unwrap_or_default();
                let chat: Vec<ChatMessage> = turns.iter().map(|t| ChatMessage::new(&t.role, &t.content)).collect();
                let text = template.render(&chat, true, &token(special.bos), &token(special.eos))?;
                let messages = turns
                    .iter()
                    .map(|t| Message {
                        role: t.role.clone(),
                        content: t.content.clone(),
                    })
                    .collect();
                (text, messages)
            }
        };
        let ids = self.tokenizer.encode(&text, true)?;
        Ok((text, messages, ids))
    }

    /// Runs one step and reports it.
    pub fn step(&mut self) -> Result<StepReport> {
        let c = self.config.clone();
        let started = Instant::now();
        let rows = self.sampler.next_batch(c.prompts_per_step);
        let mut prompts = Vec::with_capacity(rows.len());
        for &row in &rows {
            prompts.push(self.encode(&self.data[row].prompt)?);
        }
        let requests: Vec<Request> = prompts
            .iter()
            .enumerate()
            .map(|(i, (_, _, ids))| Request {
                prompt: ids.clone(),
                params: SamplingParams {
                    n: c.group_size,
                    max_tokens: c.max_completion_tokens,
                    temperature: c.temperature,
                    seed: c.seed.wrapping_add((self.step * c.prompts_per_step + i) as u32),
                    ..SamplingParams::default()
                },
            })
            .collect();
        let groups = self.engine.generate(&requests)?;
        let generated = started.elapsed().as_secs_f64();

        let scoring = Instant::now();
        let mut samples = Vec::new();
        for (g, (group, (text, messages, _))) in groups.iter().zip(&prompts).enumerate() {
            for completion in group {
                samples.push(Sample {
                    id: samples.len() as u64,
                    group_id: g as u64,
                    prompt: text.clone(),
                    messages: messages.clone(),
                    completion: completion.text.clone().unwrap_or_default(),
                    completion_ids: completion.tokens.clone(),
                    row: self.data[rows[g]].columns.clone(),
                });
            }
        }
        let totals = self.runtime.block_on(self.rewards.score(&samples))?;
        let rewards: Vec<Option<f32>> = totals.iter().map(|t| t.reward).collect();
        let adv = advantages(&rewards, c.group_size, c.scale_rewards)?;
        let scored = scoring.elapsed().as_secs_f64();

        let training = Instant::now();
        let completions: Vec<_> = groups.iter().flatten().collect();
        let rollouts: Vec<Rollout> = completions
            .iter()
            .zip(prompts.iter().flat_map(|p| std::iter::repeat_n(&p.2, c.group_size)))
            .enumerate()
            .map(|(i, (completion, prompt))| Rollout {
                prompt: prompt.clone(),
                completion: completion.tokens.clone(),
                behaviour_logprobs: completion.logprobs.clone(),
                advantage: adv.values[i],
                valid: adv.valid[i],
            })
            .collect();
        let batch = pack(
            &rollouts,
            c.micro_batch_rows,
            c.max_tokens,
            c.loss.loss_type,
            c.max_completion_tokens,
        )?;
        let count = batch.micro_batches.len();
        let shape = batch.micro_batches[0].shape;
        let lr = c.schedule.at(self.step);
        self.compile_step(shape, count)?;
        let step = &self.steps[&(shape, count > 1)];
        let share = micro_normalizer(batch.normalizer, count);
        let uploaded = batch
            .micro_batches
            .iter()
            .map(|m| upload_micro_batch(&self.client, m, share))
            .collect::<Result<Vec<_>>>()?;
        let refs: Vec<Vec<&Buffer>> = uploaded.iter().map(|b| b.iter().collect()).collect();
        if self.state.optimizer.is_empty() {
            let params = std::mem::take(&mut self.state.params);
            self.state = step.init_state(params)?;
        }
        let metrics = step.step(&mut self.state, &refs, lr as f32)?;
        let trained = training.elapsed().as_secs_f64();

        let syncing = Instant::now();
        let tensors = self
            .decoder
            .parameters()
            .iter()
            .map(|p| p.name.clone())
            .zip(&self.state.params)
            .map(|(name, buffer)| Ok((name, host_tensor(buffer)?)))
            .collect::<Result<Vec<_>>>()?;
        self.engine
            .update_weights(self.step as u64 + 1, &tensors, InFlight::Keep)?;
        let synced = syncing.elapsed().as_secs_f64();

        let present: Vec<f64> = rewards.iter().flatten().map(|&r| f64::from(r)).collect();
        let mean = present.iter().sum::<f64>() / present.len().max(1) as f64;
        let std = (present.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / present.len().max(1) as f64).sqrt();
        let tokens = batch.tokens.max(1) as f64;
        let report = StepReport {
            step: self.step,
            reward: mean,
            reward_std: std,
            frac_reward_zero_std: adv.frac_zero_std(),
            mean_length: completions.iter().map(|c| c.tokens.len()).sum::<usize>() as f64 / completions.len() as f64,
            clipped_ratio: completions
                .iter()
                .filter(|c| c.finish_reason == grpo_rollout::output::FinishReason::Length)
                .count() as f64
                / completions.len() as f64,
            loss: metrics.loss,
            grad_norm: metrics.grad_norm,
            learning_rate: lr,
            entropy: f64::from(metrics.metrics[3]) / tokens,
            clip_ratio_low: f64::from(metrics.metrics[0]) / tokens,
            clip_ratio_high: f64::from(metrics.metrics[1]) / tokens,
            time_generation: generated,
            time_reward: scored,
            time_train: trained,
            time_weight_sync: synced,
        };
        self.step += 1;
        Ok(report)
    }

    /// Compiles the GRPO step for `count` micro-batches of `shape` unless it is.
    fn compile_step(&mut self, shape: MicroBatchShape, count: usize) -> Result<()> {
        let key = (shape, count > 1);
        if !self.steps.contains_key(&key) {
            let config = StepConfig {
                dtype: ElementType::F32,
                loss: self.config.loss,
                old: OldLogprobs::OnPolicy,
                optimizer: &self.config.optimizer,
                max_grad_norm: self.config.max_grad_norm,
            };
            let step = GrpoStep::compile(&self.client, &self.decoder, &config, shape, count)?;
            self.steps.insert(key, step);
        }
        Ok(())
    }

    /// The learner's current parameters (f32, the decoder's order).
    pub fn params(&self) -> &[Buffer] {
        &self.state.params
    }

    /// The parameters with their names.
    pub fn named_params(&self) -> Vec<(&str, &Buffer)> {
        self.decoder
            .parameters()
            .iter()
            .map(|p| p.name.as_str())
            .zip(&self.state.params)
            .collect()
    }
}

/// A micro-batch's device inputs (see [`crate::trainer::batch_types`]).
fn upload_micro_batch(client: &Client, m: &crate::batch::MicroBatch, normalizer: f32) -> Result<Vec<Buffer>> {
    let d = client.device(0)?;
    let (b, t) = (m.shape.rows as i64, m.shape.tokens as i64);
    let attention: Vec<grpo_xla::Pred> = m.attention.iter().map(|&a| grpo_xla::Pred::from(a)).collect();
    Ok(vec![
        client.buffer_from_host(&m.ids, &[b, t], d)?,
        client.buffer_from_host(&attention, &[b, t], d)?,
        client.buffer_from_host(&m.completion, &[b, t - 1], d)?,
        client.buffer_from_host(&m.behaviour, &[b, t - 1], d)?,
        client.buffer_from_host(&m.advantages, &[b], d)?,
        client.buffer_from_host(&[normalizer], &[], d)?,
    ])
}
