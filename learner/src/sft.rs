//! SFT's task (warm starts before GRPO): seeded batches of tokenized
//! prompt/completion pairs over epochs, packed one pair a row, trained
//! toward [`SftObjective`] (TRL `SFTTrainer`'s completion-only loss), and
//! the eval loss on held-out pairs. Its config is [`crate::config::sft`].

use grpo_model::logprobs::LogprobsRunner;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::tools::Tool;
use grpo_xla::trace::{AdamW, Mesh};
use grpo_xla::{Buffer, Client, ElementType};
use serde_json::{Map, Value};

use crate::batch::{StepBatch, TrainSample, batch_input, pack};
use crate::checkpoint::LoadedCheckpoint;
use crate::collect::PromptEncoder;
use crate::config::sft::SftRunConfig;
use crate::conversation::Conversation;
use crate::data::{ChatTurn, Example, Prompt, PromptSampler, SamplerState};
use crate::error::{Error, Result};
use crate::learner::{Learner, Optimization, check_rows};
use crate::loss::LossType;
use crate::metrics::metrics_of;
use crate::objective::sft::SftObjective;
use crate::schedule::Schedule;
use crate::trainer::{LoopState, StepRecord, Task, Trainer};

/// The role whose turns SFT trains on.
const ASSISTANT: &str = "assistant";

/// The settings of the SFT loop.
#[derive(Debug, Clone)]
pub struct SftConfig {
    /// Sequences per optimizer step.
    pub batch_size: usize,
    /// Rows per micro-batch.
    pub micro_batch_rows: usize,
    /// Longest prompt + completion (longer completions are cut).
    pub max_length: usize,
    /// The learning-rate schedule.
    pub schedule: Schedule,
    /// AdamW's settings (the rate comes from the schedule).
    pub optimizer: AdamW,
    /// Global gradient-norm clipping.
    pub max_grad_norm: Option<f64>,
}

impl SftConfig {
    /// The settings of `config` (validated as it was read) for a run of `steps` steps.
    pub fn of(config: &SftRunConfig, steps: usize) -> SftConfig {
        let (t, o) = (&config.trainer, &config.optimizer);
        SftConfig {
            batch_size: t.batch_size,
            micro_batch_rows: t.micro_batch_size.min(t.batch_size),
            max_length: t.max_length,
            schedule: o.schedule(steps),
            optimizer: o.adamw(),
            max_grad_norm: o.max_grad_norm(),
        }
    }
}

/// One tokenized training pair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SftExample {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// The completion's token ids: the assistant's turns, EOS included,
    /// and in a multi-turn completion the turns between them.
    pub completion: Vec<u32>,
    /// Which completion tokens are trained on (the assistant's).
    pub loss_mask: Vec<bool>,
}

impl SftExample {
    /// Tokens trained on.
    fn loss_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m).count()
    }
}

/// The completion column of `row`.
enum CompletionColumn {
    /// Text, trained on whole.
    Text(String),
    /// Chat turns.
    Turns(Vec<ChatTurn>),
}

/// The completion of `row`'s `column`.
fn read_completion(row: &Example, column: &str) -> Result<CompletionColumn> {
    let bad = |message: String| Error::Config {
        field: "data.completion_column",
        message: format!("row {}: {message}", row.index + 1),
    };
    match row.columns.get(column) {
        Some(Value::String(text)) => Ok(CompletionColumn::Text(text.clone())),
        Some(turns @ Value::Array(_)) => ChatTurn::parse_all(turns.clone())
            .map(CompletionColumn::Turns)
            .map_err(|e| bad(format!("`{column}` as chat turns ({{role, content, tool_calls}}): {e}"))),
        Some(_) => Err(bad(format!("`{column}` must be text or a list of chat turns"))),
        None => Err(bad(format!("no `{column}` column"))),
    }
}

/// The tools of `row`'s `tools` column (TRL's: OpenAI's tool objects),
/// none without one.
fn read_tools(row: &Example) -> Result<Vec<Tool>> {
    match row.columns.get(TOOLS_COLUMN) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(tools) => Tool::list_from_json(tools).map_err(|e| Error::Config {
            field: "data.completion_column",
            message: format!("row {}: column `{TOOLS_COLUMN}`: {e}", row.index + 1),
        }),
    }
}

/// The column of a chat row holding the tools its conversation offers (TRL's name).
pub const TOOLS_COLUMN: &str = "tools";

/// Tokenizes `rows`: the prompt as `grpo run` renders it ([`PromptEncoder`]),
/// then the completion. A text completion (or chat turns after a text
/// prompt: their contents joined) is tokenized without special tokens,
/// EOS appended, and trained on whole. Chat turns after a chat prompt are
/// rendered turn by turn ([`Conversation`]): the first must be the
/// assistant's; only the assistant's turns are trained on, each up to and
/// including its EOS (TRL's `assistant_only_loss`); the other turns and the
/// template's turn headers are context. A chat row's `tools` column (TRL's:
/// a list of OpenAI tool objects) is rendered by the template's `tools`, as
/// `grpo run` renders an environment's tools. Pairs longer than `max_length`
/// lose the end of their completion (a prompt must leave room for one
/// trained token).
pub fn encode_examples(
    tokenizer: &std::sync::Arc<Tokenizer>,
    rows: &[Example],
    completion_column: &str,
    max_length: usize,
) -> Result<Vec<SftExample>> {
    let encoder = PromptEncoder::new(tokenizer.clone())?;
    rows.iter()
        .map(|row| {
            let (prompt, mut completion, mut loss_mask) = match (&row.prompt, read_completion(row, completion_column)?) {
                (Prompt::Chat(prompt), CompletionColumn::Turns(turns)) => {
                    let tools = read_tools(row)?;
                    encode_turns(&encoder, &tools, prompt, &turns).map_err(|e| match e {
                        // The row, for a turn it refuses (the field stays the one to fix).
                        Error::Config { field, message } => Error::Config {
                            field,
                            message: format!("row {}: {message}", row.index + 1),
                        },
                        other => other,
                    })?
                }
                (prompt, completion) => {
                    let text = match completion {
                        CompletionColumn::Text(text) => text,
                        CompletionColumn::Turns(turns) => turns.iter().map(ChatTurn::text).collect(),
                    };
                    let mut ids = tokenizer.encode(&text, false)?;
                    ids.extend(tokenizer.eos_id());
                    let mask = vec![true; ids.len()];
                    (encoder.encode(prompt)?.ids, ids, mask)
                }
            };
            completion.truncate(max_length.saturating_sub(prompt.len()));
            loss_mask.truncate(completion.len());
            let example = SftExample {
                prompt,
                completion,
                loss_mask,
            };
            if example.prompt.is_empty() || example.loss_tokens() == 0 {
                return Err(Error::Config {
                    field: "trainer.max_length",
                    message: format!(
                        "row {}: a prompt of {} tokens and a completion of {} leave nothing to train on within {max_length} tokens",
                        row.index + 1,
                        example.prompt.len(),
                        example.completion.len()
                    ),
                });
            }
            Ok(example)
        })
        .collect()
}

/// A chat prompt and its completion turns rendered turn by turn: the
/// prompt's ids, the completion's, and which of those are trained on.
fn encode_turns(
    encoder: &PromptEncoder,
    tools: &[Tool],
    prompt: &[ChatTurn],
    turns: &[ChatTurn],
) -> Result<(Vec<u32>, Vec<u32>, Vec<bool>)> {
    if turns.first().is_none_or(|t| t.role != ASSISTANT) {
        return Err(Error::Config {
            field: "data.completion_column",
            message: "chat completions must start with an assistant turn".to_string(),
        });
    }
    let mut conversation = Conversation::start(encoder, tools, prompt.iter().map(ChatTurn::message).collect(), true)?;
    let prompt = conversation.ids().to_vec();
    let eos = encoder.tokenizer().eos_id();
    let (mut completion, mut mask) = (Vec::new(), Vec::new());
    for (i, turn) in turns.iter().enumerate() {
        let next_is_assistant = turns.get(i + 1).is_some_and(|t| t.role == ASSISTANT);
        let ids = conversation.append(turn.message(), next_is_assistant)?;
        // The assistant writes its turn up to its EOS; what the template puts after is context.
        let written = match (turn.role == ASSISTANT, eos) {
            (false, _) => 0,
            (true, Some(eos)) => ids.iter().position(|&id| id == eos).map_or(ids.len(), |at| at + 1),
            (true, None) => ids.len(),
        };
        mask.extend((0..ids.len()).map(|j| j < written));
        completion.extend(ids);
    }
    // Nothing is trained after the last assistant token.
    let end = mask.iter().rposition(|&m| m).map_or(0, |last| last + 1);
    completion.truncate(end);
    mask.truncate(end);
    Ok((prompt, completion, mask))
}

/// Packs `examples` into micro-batches of `rows` rows (the layout of
/// [`crate::batch::pack`]); the normalizer is the completion token count.
pub fn pack_examples(examples: &[SftExample], rows: usize, max_tokens: usize) -> Result<StepBatch> {
    let rollouts: Vec<TrainSample> = examples
        .iter()
        .map(|e| TrainSample {
            prompt: e.prompt.clone(),
            completion: e.completion.clone(),
            loss_mask: e.loss_mask.clone(),
            behaviour_logprobs: vec![0.0; e.completion.len()],
            advantage: 0.0,
            valid: true,
        })
        .collect();
    pack(&rollouts, rows, max_tokens, LossType::Dapo, max_tokens)
}

/// What one SFT step did (TRL's metric names).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SftReport {
    /// The step (1-based).
    pub step: usize,
    /// Mean NLL over the batch's completion tokens.
    pub loss: f32,
    /// Global gradient norm before clipping.
    pub grad_norm: f32,
    /// The step's learning rate.
    pub learning_rate: f64,
    /// Completion tokens trained on.
    pub tokens: usize,
    /// The sparse layers' load-balancing loss, without its coefficient
    /// (transformers' `aux_loss`; absent unless the step adds it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aux_loss: Option<f32>,
}

/// The mean NLL of held-out pairs.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct SftEval {
    /// Mean NLL over their completion tokens.
    pub loss: f64,
    /// Completion tokens scored.
    pub tokens: usize,
}

/// What SFT's trainer is built from.
pub struct SftParts {
    /// The device client.
    pub client: Client,
    /// The model's decoder.
    pub decoder: grpo_model::decoder::Decoder,
    /// The training pairs.
    pub data: Vec<SftExample>,
    /// The held-out pairs of the eval loss (may be empty).
    pub eval: Vec<SftExample>,
    /// The seed of the example order.
    pub data_seed: u64,
    /// The weights (a new run's start, or a checkpoint's): f32 on the
    /// client's first device (a frozen base under adapters f32 or bf16), in
    /// the decoder's order.
    pub params: Vec<Buffer>,
    /// The devices the learner keeps its state and batches on.
    pub mesh: Mesh,
}

/// SFT's batches of pairs and eval loss.
pub struct SftTask {
    client: Client,
    config: SftConfig,
    data: Vec<SftExample>,
    eval: Vec<SftExample>,
    sampler: PromptSampler,
    scorer: LogprobsRunner,
}

impl Trainer<SftTask> {
    /// SFT's trainer from its parts: a new run, or one continuing from
    /// `checkpoint` (whose weights are [`SftParts::params`]).
    pub fn sft(parts: SftParts, config: SftConfig, checkpoint: Option<&LoadedCheckpoint>) -> Result<Self> {
        if parts.data.is_empty() || config.batch_size == 0 || config.micro_batch_rows == 0 {
            return Err(Error::Config {
                field: "trainer.batch_size",
                message: format!(
                    "{} pairs, batches of {} in micro-batches of {}: all must be ≥ 1",
                    parts.data.len(),
                    config.batch_size,
                    config.micro_batch_rows
                ),
            });
        }
        check_rows(&parts.mesh, config.micro_batch_rows)?;
        let start = match checkpoint {
            Some(checkpoint) => LoopState::of_checkpoint(checkpoint, parts.data_seed)?,
            None => LoopState::start(parts.data_seed),
        };
        let task = SftTask {
            scorer: LogprobsRunner::new(&parts.client, parts.decoder.clone(), ElementType::F32),
            sampler: PromptSampler::resume(parts.data.len(), parts.data_seed, start.sampler),
            client: parts.client.clone(),
            data: parts.data,
            eval: parts.eval,
            config: config.clone(),
        };
        let optimization = Optimization {
            optimizer: config.optimizer,
            max_grad_norm: config.max_grad_norm,
            compute: ElementType::F32,
        };
        let optimizer = checkpoint.map(|c| &c.optimizer);
        let learner = Learner::new(
            &parts.client,
            &parts.decoder,
            parts.mesh,
            SftObjective,
            optimization,
            parts.params,
            optimizer,
        )?;
        Ok(Trainer::new(learner, task, start))
    }
}

impl Task for SftTask {
    type Objective = SftObjective;

    fn step(&mut self, learner: &mut Learner<SftObjective>, step: usize) -> Result<StepRecord> {
        let c = &self.config;
        let rows = self.sampler.next_batch(c.batch_size);
        let examples: Vec<SftExample> = rows.iter().map(|&r| self.data[r].clone()).collect();
        let batch = pack_examples(&examples, c.micro_batch_rows, c.max_length)?;
        let lr = c.schedule.at(step);
        let uploaded = upload_batch(&self.client, learner.mesh(), &batch)?;
        let metrics = learner.train(batch.shape(), &uploaded, lr as f32, step as u64)?;
        let report = SftReport {
            step: step + 1,
            loss: metrics.loss,
            grad_norm: metrics.grad_norm,
            learning_rate: lr,
            tokens: batch.tokens,
            aux_loss: learner.balance_loss(&metrics),
        };
        Ok(StepRecord {
            step: step + 1,
            metrics: metrics_of(&report),
            rollouts: Vec::new(),
            tokens: batch.tokens,
            input_tokens: examples.iter().map(|e| e.prompt.len() + e.completion.len()).sum(),
            notes: Vec::new(),
        })
    }

    fn evaluate(&mut self, learner: &Learner<SftObjective>) -> Result<Option<Map<String, Value>>> {
        if self.eval.is_empty() {
            return Ok(None);
        }
        let eval = learner.with_params_on_one_device(|params| self.score(params, &self.eval))?;
        let line = serde_json::json!({"eval_loss": eval.loss, "eval_tokens": eval.tokens});
        Ok(line.as_object().cloned())
    }

    fn sampler(&self) -> SamplerState {
        self.sampler.state()
    }

    fn epoch(&self) -> f64 {
        self.sampler.state().epochs(self.data.len())
    }
}

impl SftTask {
    /// The mean NLL of `examples`' trained completion tokens under `params` on the
    /// client's first device (the log-prob program, `micro_batch_rows`
    /// pairs at a time).
    pub fn score(&self, params: &[&Buffer], examples: &[SftExample]) -> Result<SftEval> {
        let rows = self.config.micro_batch_rows;
        let (mut nll, mut tokens) = (0.0f64, 0usize);
        for chunk in examples.chunks(rows) {
            // Padded to full chunks with copies of the first, so one program serves.
            let mut sequences: Vec<Vec<u32>> = chunk
                .iter()
                .map(|e| [e.prompt.clone(), e.completion.clone()].concat())
                .collect();
            sequences.resize(rows, sequences[0].clone());
            let stats = self.scorer.run(params, &sequences)?;
            for (e, s) in chunk.iter().zip(&stats) {
                let first = e.prompt.len() - 1;
                nll -= s.logprobs[first..first + e.completion.len()]
                    .iter()
                    .zip(&e.loss_mask)
                    .filter(|(_, trained)| **trained)
                    .map(|(&x, _)| f64::from(x))
                    .sum::<f64>();
                tokens += e.loss_tokens();
            }
        }
        Ok(SftEval {
            loss: nll / tokens.max(1) as f64,
            tokens,
        })
    }
}

/// The inputs of a packed batch's micro-batches on `mesh`, each with its
/// share of the batch normalizer ([`StepBatch::micro_normalizer`]), in
/// [`crate::objective::sft`]'s order.
pub fn upload_batch(client: &Client, mesh: &Mesh, batch: &StepBatch) -> Result<Vec<Vec<grpo_xla::ShardedBuffer>>> {
    batch
        .micro_batches
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut inputs = m.upload_tokens(client, mesh)?;
            inputs.push(batch_input(client, mesh, &[batch.micro_normalizer(i)], &[])?);
            Ok(inputs)
        })
        .collect()
}
