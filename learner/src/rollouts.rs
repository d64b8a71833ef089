//! The rollout side of the GRPO loop: drawing a step's prompts, generating
//! their groups on the fleet and scoring them — inline, or on a thread of
//! its own that runs ahead of the learner.
//!
//! With `max_staleness` k = 0 the loop is synchronous and on-policy: the
//! learner draws a batch, trains on it, and the fleet takes the new
//! weights before the next one is drawn. With k ≥ 1 a rollout thread draws
//! the next batches while the learner trains (joined by bounded crossbeam
//! channels: up to k − 1 batches wait ready), so generation overlaps
//! training; a batch is then sampled by a policy up to k versions older
//! than the learner's (the truncated importance correction of the loss
//! accounts for it), and samples older than that are dropped and counted.
//! New weights and evaluations reach the thread as commands between two
//! batches; its errors reach the learner with the next batch.
//!
//! Memory: at most k drawn batches (their completions and prompts) on the
//! host, plus one host copy of the weights per pending update.

use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Select, Sender, TryRecvError};
use grpo_reward::RewardPool;
use grpo_rollout::guided::Guide;
use grpo_rollout::request::{LogprobsMode, SamplingParams};
use grpo_xla::ElementType;
use serde_json::{Map, Value};

use crate::collect::{Collected, EpisodeSetup, PromptEncoder, collect, collect_episodes};
use crate::data::{Example, PromptSampler, SamplerState};
use crate::error::{Error, Result};
use crate::fleet::{Fleet, FleetHealth, PolicyWeights, SyncReport};

/// How a step's rollouts are sampled.
#[derive(Debug, Clone, Copy)]
pub struct Sampling {
    /// Samples per prompt.
    pub group_size: usize,
    /// Prompts per step.
    pub prompts_per_step: usize,
    /// Most completion tokens.
    pub max_completion_tokens: usize,
    /// Temperature.
    pub temperature: f32,
    /// The seed the per-request seeds derive from (with the step).
    pub seed: u32,
    /// How tokens are filtered and penalized.
    pub filters: Filters,
}

/// The rollouts' token filters and penalty (`[rollout] top_p`, `top_k`,
/// `min_p`, `repetition_penalty`); the default filters nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Filters {
    /// Nucleus mass, in (0, 1].
    pub top_p: f32,
    /// Most likely tokens kept; 0 keeps all.
    pub top_k: i32,
    /// Fraction of the most likely token's probability below which tokens drop.
    pub min_p: f32,
    /// vLLM's repetition penalty; 1 is off.
    pub repetition_penalty: f32,
}

impl Default for Filters {
    fn default() -> Self {
        Filters {
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

impl Filters {
    /// `params` with these filters (greedy rows ignore all but the penalty).
    fn apply(self, params: SamplingParams) -> SamplingParams {
        SamplingParams {
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            ..params
        }
    }
}

/// One step's scored groups, as the learner receives them.
pub struct Drawn {
    /// The policy version that sampled them.
    pub version: u64,
    /// The groups and their rewards.
    pub collected: Collected,
    /// Per group, its dataset row's other columns.
    pub columns: Vec<Map<String, Value>>,
    /// The prompt sampler's state after this batch (what a checkpoint keeps).
    pub sampler: SamplerState,
    /// The last weight update the fleet took before sampling them.
    pub sync: Option<SyncReport>,
    /// How the fleet stood after sampling them.
    pub fleet: FleetHealth,
}

/// What the rollout side owns.
pub struct RolloutSide {
    /// The rollout engines.
    pub fleet: Box<dyn Fleet>,
    /// The rewards.
    pub rewards: RewardPool,
    /// The runtime the rewards run on.
    pub runtime: tokio::runtime::Runtime,
    /// Prompts to token ids.
    pub encoder: PromptEncoder,
    /// The training rows.
    pub data: Vec<Example>,
    /// Their order.
    pub sampler: PromptSampler,
    /// How they are sampled.
    pub sampling: Sampling,
    /// The fleet's policy version.
    pub version: u64,
    /// Multi-turn runs: the environment and budgets of the episodes
    /// (`None`: one completion per sample).
    pub episodes: Option<EpisodeSetup>,
    /// The guide of rows without their own (every turn of an episode).
    pub guide: Option<Guide>,
}

impl RolloutSide {
    /// Draws, generates and scores the batch of step `step` (0-based).
    fn draw(&mut self, step: usize, sync: Option<SyncReport>) -> Result<Drawn> {
        let s = self.sampling;
        let rows = self.sampler.next_batch(s.prompts_per_step);
        // Copies of the step's rows (a few prompts), as sampling borrows the fleet.
        let examples: Vec<Example> = rows.iter().map(|&r| self.data[r].clone()).collect();
        let first_seed = step * s.prompts_per_step;
        let default = self.guide.clone();
        let params = |i: usize| {
            s.filters.apply(SamplingParams {
                n: s.group_size,
                max_tokens: s.max_completion_tokens,
                temperature: s.temperature,
                seed: s.seed.wrapping_add((first_seed + i) as u32),
                // Behaviour log-probs at the sampling temperature, as the learner scores.
                logprobs_mode: LogprobsMode::Processed,
                guide: examples[i].guide.clone().or_else(|| default.clone()),
                ..SamplingParams::default()
            })
        };
        let collected = self.collect(&examples.iter().collect::<Vec<_>>(), params)?;
        Ok(Drawn {
            version: self.version,
            columns: examples.iter().map(|e| e.columns.clone()).collect(),
            collected,
            sampler: self.sampler.state(),
            sync,
            fleet: self.fleet.health(),
        })
    }

    /// Greedy completions (or episodes) of `examples`, at most
    /// `max_tokens` a completion (or turn) each, scored.
    fn evaluate(&mut self, examples: &[Example], max_tokens: usize) -> Result<Collected> {
        let rows: Vec<&Example> = examples.iter().collect();
        let default = self.guide.clone();
        let filters = self.sampling.filters;
        self.collect(&rows, |i| {
            filters.apply(SamplingParams {
                max_tokens,
                temperature: 0.0,
                guide: rows[i].guide.clone().or_else(|| default.clone()),
                ..SamplingParams::default()
            })
        })
    }

    /// Samples and scores `rows` (row `i` with `params(i)`): completions,
    /// or episodes in a multi-turn run.
    fn collect(&mut self, rows: &[&Example], params: impl Fn(usize) -> SamplingParams) -> Result<Collected> {
        let fleet = self.fleet.as_mut();
        match &self.episodes {
            None => collect(fleet, &self.rewards, &self.runtime, &self.encoder, rows, params),
            Some(setup) => collect_episodes(fleet, &self.rewards, &self.runtime, &self.encoder, setup, rows, params),
        }
    }

    /// Installs `weights` as policy `version` on the fleet.
    fn update_weights(&mut self, version: u64, weights: PolicyWeights) -> Result<SyncReport> {
        let sync = self.fleet.update_weights(version, weights)?;
        self.version = version;
        Ok(sync)
    }
}

/// A request to the rollout thread.
enum Command {
    /// Install new weights before the next batch.
    Weights(u64, PolicyWeights),
    /// Evaluate greedily and answer.
    Evaluate(Vec<Example>, usize, Sender<Result<Collected>>),
}

/// Where the learner's batches come from.
pub enum Rollouts {
    /// Drawn when asked for (max_staleness 0).
    Inline(Box<RolloutSide>),
    /// Drawn ahead on a thread.
    Ahead(Ahead),
}

/// The rollout thread and its channels.
pub struct Ahead {
    /// The fleet's [`Fleet::shared_device`], read before it left for the thread.
    shared_device: Option<(i32, ElementType)>,
    commands: Option<Sender<Command>>,
    batches: Receiver<Result<Drawn>>,
    thread: Option<JoinHandle<()>>,
}

impl Rollouts {
    /// Batches from `side`, the first for step `first_step`; with
    /// `max_staleness` ≥ 1 drawn ahead on a thread.
    pub fn new(side: RolloutSide, max_staleness: usize, first_step: usize) -> Result<Rollouts> {
        if max_staleness == 0 {
            return Ok(Rollouts::Inline(Box::new(side)));
        }
        let shared_device = side.fleet.shared_device();
        let (commands, inbox) = crossbeam_channel::unbounded();
        let (outbox, batches) = crossbeam_channel::bounded(max_staleness - 1);
        let thread = std::thread::Builder::new()
            .name("grpo-rollouts".to_string())
            .spawn(move || run_ahead(side, first_step, &inbox, &outbox))
            .map_err(|e| Error::Config {
                field: "rollout.max_staleness",
                message: format!("cannot start the rollout thread: {e}"),
            })?;
        Ok(Rollouts::Ahead(Ahead {
            shared_device,
            commands: Some(commands),
            batches,
            thread: Some(thread),
        }))
    }

    /// Where the fleet's lone in-process engine runs, and its dtype
    /// ([`Fleet::shared_device`]).
    pub fn shared_device(&self) -> Option<(i32, ElementType)> {
        match self {
            Rollouts::Inline(side) => side.fleet.shared_device(),
            Rollouts::Ahead(ahead) => ahead.shared_device,
        }
    }

    /// The batch of step `step`.
    pub fn next(&mut self, step: usize) -> Result<Drawn> {
        match self {
            Rollouts::Inline(side) => side.draw(step, None),
            Rollouts::Ahead(ahead) => ahead.batches.recv().map_err(|_| ahead.gone())?,
        }
    }

    /// Hands the fleet policy `version`: at once inline (and reports the
    /// sync), else before the thread's next batch (reported with it).
    pub fn update_weights(&mut self, version: u64, weights: PolicyWeights) -> Result<Option<SyncReport>> {
        match self {
            Rollouts::Inline(side) => side.update_weights(version, weights).map(Some),
            Rollouts::Ahead(ahead) => {
                ahead.send(Command::Weights(version, weights))?;
                Ok(None)
            }
        }
    }

    /// Greedy completions of `examples`, scored (after the weights sent so far).
    pub fn evaluate(&mut self, examples: &[Example], max_tokens: usize) -> Result<Collected> {
        match self {
            Rollouts::Inline(side) => side.evaluate(examples, max_tokens),
            Rollouts::Ahead(ahead) => {
                let (reply, answer) = crossbeam_channel::bounded(1);
                ahead.send(Command::Evaluate(examples.to_vec(), max_tokens, reply))?;
                answer.recv().map_err(|_| ahead.gone())?
            }
        }
    }
}

impl Ahead {
    fn send(&self, command: Command) -> Result<()> {
        let commands = self.commands.as_ref().expect("open until dropped");
        commands.send(command).map_err(|_| self.gone())
    }

    /// The error of a rollout thread that stopped without saying why (it
    /// sends its errors as batches, so only a panic gets here).
    fn gone(&self) -> Error {
        Error::Worker {
            endpoint: "rollout thread".to_string(),
            message: "it stopped unexpectedly".to_string(),
        }
    }
}

impl Drop for Ahead {
    fn drop(&mut self) {
        // Closing both channels ends the thread after its current batch.
        self.commands.take();
        drop(std::mem::replace(&mut self.batches, crossbeam_channel::never()));
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The rollout thread: applies commands between batches and draws batch
/// after batch, each waiting in `outbox` until the learner takes it.
fn run_ahead(mut side: RolloutSide, mut step: usize, inbox: &Receiver<Command>, outbox: &Sender<Result<Drawn>>) {
    let mut sync = None;
    let handle = |side: &mut RolloutSide, command: Command, sync: &mut Option<SyncReport>| -> Result<()> {
        match command {
            Command::Weights(version, weights) => *sync = Some(side.update_weights(version, weights)?),
            Command::Evaluate(examples, max_tokens, reply) => {
                let _ = reply.send(side.evaluate(&examples, max_tokens));
            }
        }
        Ok(())
    };
    loop {
        loop {
            match inbox.try_recv() {
                Ok(command) => {
                    if let Err(e) = handle(&mut side, command, &mut sync) {
                        let _ = outbox.send(Err(e));
                        return;
                    }
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => return,
            }
        }
        let drawn = side.draw(step, sync.take());
        let failed = drawn.is_err();
        step += 1;
        // Wait for the learner to take the batch, serving commands meanwhile.
        let mut pending = Some(drawn);
        while let Some(batch) = pending.take() {
            let mut select = Select::new();
            let give = select.send(outbox);
            let take = select.recv(inbox);
            let ready = select.select();
            match ready.index() {
                i if i == give => {
                    if ready.send(outbox, batch).is_err() {
                        return;
                    }
                }
                i if i == take => {
                    let Ok(command) = ready.recv(inbox) else { return };
                    if let Err(e) = handle(&mut side, command, &mut sync) {
                        let _ = outbox.send(Err(e));
                        return;
                    }
                    pending = Some(batch);
                }
                _ => unreachable!("two operations"),
            }
        }
        if failed {
            return;
        }
    }
}
