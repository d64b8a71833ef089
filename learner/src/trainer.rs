//! The training loop's step level, one type for every objective: a
//! [`Learner`] and the [`Task`] that feeds it (GRPO's rollouts and rewards
//! in [`crate::grpo`], SFT's pairs in [`crate::sft`]), the step counter,
//! and the checkpoint of both. [`crate::run::Run`] drives a trainer from a
//! config with hooks; tests drive one step by step.

use std::path::{Path, PathBuf};

use grpo_model::weights::HostTensor;
use serde_json::{Map, Value};

use crate::checkpoint::{LoadedCheckpoint, STATE_FILE, SavedModel};
use crate::choices::Choices;
use crate::data::SamplerState;
use crate::error::{Error, Result};
use crate::learner::Learner;
use crate::objective::Objective;
use crate::record::RolloutRow;

/// What one step did.
#[derive(Debug, Clone, Default)]
pub struct StepRecord {
    /// The step's number, 1-based as TRL's `global_step` (0: the run's
    /// start, before training, which carries only an evaluation).
    pub step: usize,
    /// Its metrics under TRL's names (the trainer adds `num_tokens` and
    /// `epoch`, hooks theirs: `step_time`, evaluation results), one line of
    /// `metrics.jsonl`.
    pub metrics: Map<String, Value>,
    /// The completions it sampled, for the rollout log (none for SFT).
    pub rollouts: Vec<RolloutRow>,
    /// Completion tokens it trained on or sampled (for tokens/s).
    pub tokens: usize,
    /// Prompt and completion tokens of its samples, each sample counting
    /// its prompt (what TRL's `num_tokens` adds up).
    pub input_tokens: usize,
    /// Lines for the run's log from hooks (a checkpoint written, …).
    pub notes: Vec<String>,
}

/// What makes a learner's batches each step and evaluates it: GRPO's
/// rollouts and rewards, SFT's prompt/completion pairs, …
pub trait Task {
    /// The objective its batches are for.
    type Objective: Objective;

    /// Runs step `step` (0-based: the steps done before it) on `learner`:
    /// draws its batch, trains, and hands the new weights on where they go.
    fn step(&mut self, learner: &mut Learner<Self::Objective>, step: usize) -> Result<StepRecord>;

    /// Evaluates `learner` on the held-out data, as `eval_…` metrics
    /// (`None` when there is no held-out data).
    fn evaluate(&mut self, learner: &Learner<Self::Objective>) -> Result<Option<Map<String, Value>>>;

    /// Where its data order stands (what a checkpoint keeps).
    fn sampler(&self) -> SamplerState;

    /// Passes over the training data so far, fractional (TRL's `epoch`).
    fn epoch(&self) -> f64;
}

/// Where the loop is, as a checkpoint's `trainer_state.json` keeps it. The
/// rollouts' sampling seeds derive from the step, so this is all a resumed
/// run needs to continue exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoopState {
    /// Steps completed.
    pub step: u64,
    /// The data sampler's position.
    pub sampler: SamplerState,
    /// The data order's seed (a resumed run must use the same).
    pub data_seed: u64,
    /// Prompt and completion tokens seen (TRL's `num_tokens`; checkpoints
    /// written before grpo kept it count from their step on).
    #[serde(default)]
    pub num_tokens: u64,
    /// The run's machine-dependent choices, which a resumed run keeps
    /// (none for SFT, and in checkpoints written before grpo kept them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choices: Option<Choices>,
}

impl LoopState {
    /// The start of a new run with data seed `data_seed`.
    pub fn start(data_seed: u64) -> LoopState {
        LoopState {
            step: 0,
            sampler: SamplerState { epoch: 0, position: 0 },
            data_seed,
            num_tokens: 0,
            choices: None,
        }
    }

    /// The loop state of `checkpoint`, checked to continue a run of data seed `data_seed`.
    pub fn of_checkpoint(checkpoint: &LoadedCheckpoint, data_seed: u64) -> Result<LoopState> {
        let state: LoopState = serde_json::from_value(checkpoint.state.clone()).map_err(|e| Error::Data {
            path: checkpoint.dir.join(STATE_FILE),
            line: 0,
            message: format!("not a grpo run's loop state: {e}"),
        })?;
        if state.data_seed != data_seed {
            return Err(Error::Config {
                field: "data.seed",
                message: format!(
                    "the checkpoint's run used seed {}, this config {data_seed}: resume with the same data settings",
                    state.data_seed
                ),
            });
        }
        Ok(state)
    }
}

/// A learner, its task and the steps done.
pub struct Trainer<T: Task> {
    learner: Learner<T::Objective>,
    task: T,
    step: usize,
    data_seed: u64,
    num_tokens: u64,
    choices: Option<Choices>,
}

impl<T: Task> Trainer<T> {
    /// A trainer at `state` (a new run's [`LoopState::start`], or a
    /// checkpoint's, whose weights and optimizer state `learner` holds and
    /// whose data position `task` starts from).
    pub fn new(learner: Learner<T::Objective>, task: T, state: LoopState) -> Trainer<T> {
        Trainer {
            learner,
            task,
            step: state.step as usize,
            data_seed: state.data_seed,
            num_tokens: state.num_tokens,
            choices: state.choices,
        }
    }

    /// Runs the next step.
    pub fn step(&mut self) -> Result<StepRecord> {
        let mut record = self.task.step(&mut self.learner, self.step)?;
        self.step += 1;
        self.num_tokens += record.input_tokens as u64;
        record.metrics.insert("num_tokens".to_string(), self.num_tokens.into());
        record.metrics.insert("epoch".to_string(), self.task.epoch().into());
        Ok(record)
    }

    /// Evaluates the current weights (`None` without held-out data).
    pub fn evaluate(&mut self) -> Result<Option<Map<String, Value>>> {
        self.task.evaluate(&self.learner)
    }

    /// Steps completed.
    pub fn steps_done(&self) -> usize {
        self.step
    }

    /// Where the loop is (what a checkpoint stores).
    pub fn loop_state(&self) -> LoopState {
        LoopState {
            step: self.step as u64,
            sampler: self.task.sampler(),
            data_seed: self.data_seed,
            num_tokens: self.num_tokens,
            choices: self.choices,
        }
    }

    /// The learner.
    pub fn learner(&self) -> &Learner<T::Objective> {
        &self.learner
    }

    /// The current trained parameters as named f32 host tensors (the
    /// decoder's order; the adapters alone when they train).
    pub fn host_params(&self) -> Result<Vec<(String, HostTensor)>> {
        self.learner.host_params()
    }

    /// Writes `OUT/checkpoint-<step>/` (policy, optimizer state, loop state), atomically.
    pub fn checkpoint(&self, out: &Path, model: SavedModel<'_>) -> Result<PathBuf> {
        let state = serde_json::to_value(self.loop_state()).expect("the loop state serializes");
        self.learner.save_checkpoint(out, self.step as u64, model, state)
    }
}
