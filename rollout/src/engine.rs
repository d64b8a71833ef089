//! The generation engine: continuous batching of sampled sequences over a
//! per-slot contiguous KV cache on one device.
//!
//! Each of `max_num_seqs` slots holds one running sample. A request waits
//! in a first-come queue until `n` slots are free (admission by free
//! cache, never a failure); then its prompt is prefilled once into one slot
//! and forked into the others, and every later step decodes one token for
//! each running sample. Requests join between decode steps and a finished
//! sample leaves its slot at once; any request can be aborted at any time.
//! [`programs`](crate::programs) has the programs and their buckets.
//!
//! Memory: the cache holds `2 · layers · max_num_seqs · kv_heads ·
//! max_model_len · head_dim` elements of the parameter dtype (SmolLM2-135M,
//! f32, 16 slots × 1024 tokens: 720 MiB), plus three `max_num_seqs ×
//! vocab` f32 history tables (16 × 49,152: 9 MiB). Contiguous slots waste
//! what short sequences leave unused but need no block tables; slots are
//! reused without clearing, because a sequence writes every position
//! before it reads it.
//!
//! A finished sample's slot keeps its keys and values until the slot is
//! needed: a later request whose prompt starts with that sample's tokens
//! (its prompt, then all it generated) continues it in place, and only the
//! new tokens are computed (the **extend** program) — the next turn of a
//! multi-turn episode or chat prefills just the new messages. Free slots
//! are taken empty ones first, then kept ones, lowest first; taking a slot
//! that still keeps a sample evicts it (counted). New weights drop what
//! slots keep.
//!
//! A request that continues no kept sample still starts from the longest
//! prefix of its prompt that another slot holds — a running sample's or a
//! kept one's, at least [`MIN_SHARED_PREFIX`] tokens — copied into its
//! slot (the **fork** program), so the system prompt and tool list every
//! request of a run begins with, or an evicted episode's history, is
//! computed once (vLLM's automatic prefix caching, over slots).
//!
//! Weights can be replaced between steps ([`Engine::update_weights`]);
//! every token records the policy version that produced it.
//!
//! An engine made with adapter slots (`max_loras`) serves LoRA adapters
//! by request ([`Engine::load_adapter`], [`SamplingParams::adapter`]): rows
//! of different adapters share every program, and a sample shares or
//! continues only keys and values computed with its own adapter.
//!
//! [`SamplingParams::adapter`]: crate::request::SamplingParams::adapter

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use grpo_model::decoder::Decoder;
use grpo_model::lora::LoraConfig;
use grpo_model::tokenizer::Tokenizer;
use grpo_model::weights::HostTensor;
use grpo_xla::{Arg, Buffer, Client, Device, ElementType, TensorType};

use crate::adapters::{AdapterId, AdapterSlots};
use crate::error::{Error, Result};
use crate::guided::{Grammars, GuidedSample};
use crate::host_weights::ParameterValues;
use crate::inputs::{RowInputs, TokenInputs};
use crate::output::{Completion, FinishReason, RequestId, SampleUpdate, StopReason, Token};
use crate::programs::{DecodeKey, ProgramKey, Programs, upload};
use crate::request::{Limits, Request};
use crate::sampling::SamplerKind;
use crate::text::SampleText;

/// How big the engine is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineConfig {
    /// Sequences decoded together (cache slots). Default 8.
    pub max_num_seqs: usize,
    /// Longest prompt + completion. Default 1024.
    pub max_model_len: usize,
    /// Parameter and cache dtype. Default f32.
    pub dtype: ElementType,
    /// Continue finished samples in their slots: a request whose prompt
    /// starts with a finished sample's prompt and completion computes only
    /// the tokens after them. Default true.
    pub continue_sequences: bool,
    /// Start a request from the longest prefix of its prompt another slot
    /// holds (at least [`MIN_SHARED_PREFIX`] tokens), copied into its
    /// slot. Default true. With both off every prompt is prefilled whole.
    pub share_prefixes: bool,
    /// LoRA adapters the engine can hold at once, each request picking
    /// one or none ([`Engine::load_adapter`]). Default 0: none.
    pub max_loras: usize,
    /// The highest rank of an adapter it takes (with `max_loras` ≥ 1). Default 16.
    pub max_lora_rank: usize,
}

/// The fewest prompt tokens a request copies from another slot: a shorter
/// common prefix is cheaper to compute than to copy.
pub const MIN_SHARED_PREFIX: usize = 16;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_num_seqs: 8,
            max_model_len: 1024,
            dtype: ElementType::F32,
            continue_sequences: true,
            share_prefixes: true,
            max_loras: 0,
            max_lora_rank: 16,
        }
    }
}

/// What happens to running samples when the weights change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// They continue; their later tokens use (and record) the new version.
    Keep,
    /// They end now with [`FinishReason::Abort`], as do waiting requests.
    Abort,
}

/// A snapshot of the engine's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineStats {
    /// Requests waiting for slots.
    pub waiting: usize,
    /// Samples running in slots.
    pub running: usize,
    /// Free slots.
    pub free_slots: usize,
    /// The policy version of the current weights.
    pub version: u64,
    /// Programs compiled so far (fixed once every bucket in use is compiled).
    pub compiled_programs: usize,
    /// Prompt tokens of every sample admitted so far (vLLM's prefix-cache queries).
    pub prompt_tokens: u64,
    /// Of those, the tokens a sample took from its group's one prefill
    /// instead of computing them (vLLM's prefix-cache hits).
    pub shared_prompt_tokens: u64,
    /// Of the prompt tokens, those whose keys and values a sample found in
    /// its slot, kept from the earlier sample it continues.
    pub kept_prompt_tokens: u64,
    /// Of the prompt tokens, those whose keys and values a sample copied
    /// from another slot holding the same prefix.
    pub copied_prompt_tokens: u64,
    /// Finished samples whose kept keys and values were overwritten
    /// because their slot was needed.
    pub evicted_sequences: u64,
    /// Tokens generated so far.
    pub generated_tokens: u64,
    /// Of those, the tokens drawn under a guide's mask.
    pub guided_tokens: u64,
    /// Time spent computing guides' masks on the host, in microseconds.
    pub guide_mask_micros: u64,
    /// LoRA adapters loaded into its slots.
    pub adapters: usize,
}

impl EngineStats {
    /// The engine's slots (`max_num_seqs`): those running a sample and the free ones.
    pub fn slots(&self) -> usize {
        self.running + self.free_slots
    }
}

/// One running sample, in its slot.
pub(crate) struct Sequence {
    pub(crate) request: RequestId,
    pub(crate) index: usize,
    pub(crate) prompt_len: usize,
    /// The token the next decode step feeds (the last prompt token at first).
    pub(crate) next_input: u32,
    pub(crate) tokens: Vec<Token>,
    /// The text, when the engine has a tokenizer.
    pub(crate) text: Option<SampleText>,
    /// Its place in its request's grammar, when the request is guided.
    pub(crate) guide: Option<GuidedSample>,
    /// Whether every key and value in its slot comes from the current
    /// weights (false once they change under it): only then is it kept.
    pub(crate) current: bool,
    /// The adapter it runs with (none: the base model or the policy's adapters).
    pub(crate) adapter: Option<AdapterId>,
}

/// What a free slot still holds of the sample that last ran there: its
/// prompt then every token it generated, the keys and values of all but
/// the last, computed with `adapter`.
struct Kept {
    tokens: Vec<u32>,
    adapter: Option<AdapterId>,
}

impl Sequence {
    /// The position the next decode step writes.
    pub(crate) fn position(&self) -> usize {
        self.prompt_len - 1 + self.tokens.len()
    }
}

/// A request leaving the queue: its id, the slots of its samples, and the
/// keys and values its first slot starts with.
struct Admitted {
    id: RequestId,
    slots: Vec<usize>,
    cached: Cached,
}

/// The keys and values of its prompt an admitted request's first slot
/// holds before anything is computed for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cached {
    /// None: the prompt is prefilled whole.
    Nothing,
    /// The first `n` positions, kept in the slot by the sample it continues.
    Kept(usize),
    /// The first `n` positions, copied from another slot holding the same prefix.
    Copied(usize),
}

impl Cached {
    /// The positions cached.
    fn positions(self) -> usize {
        match self {
            Cached::Nothing => 0,
            Cached::Kept(n) | Cached::Copied(n) => n,
        }
    }
}

/// A request the engine holds (waiting or running).
pub(crate) struct Held {
    pub(crate) request: Request,
    /// EOS (unless `ignore_eos`) and the request's stop token ids.
    pub(crate) stop_tokens: Vec<u32>,
    /// Samples not yet finished.
    pub(crate) unfinished: usize,
    /// The request's guide, compiled; each sample starts from a fork of it.
    pub(crate) guide: Option<GuidedSample>,
}

/// The engine: weights, cache and compiled programs on one device.
pub struct Engine {
    client: Client,
    /// The device of the weights, where the cache lives and the programs run.
    device: Device,
    programs: Programs,
    config: EngineConfig,
    params: Vec<Buffer>,
    version: u64,
    state: Vec<Buffer>,
    slots: Vec<Option<Sequence>>,
    /// Per slot, the finished sample it keeps (free slots only).
    kept: Vec<Option<Kept>>,
    queue: VecDeque<RequestId>,
    held: HashMap<RequestId, Held>,
    next_id: RequestId,
    /// Updates made outside a step (aborts), returned by the next step.
    pending: Vec<SampleUpdate>,
    tokenizer: Option<Arc<Tokenizer>>,
    /// The guide compiler, made on the first guided request.
    grammars: Option<Grammars>,
    /// What its adapter slots hold, when it has some.
    adapters: Option<AdapterSlots>,
    counters: Counters,
}

/// Running totals for [`EngineStats`].
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    prompt_tokens: u64,
    shared_prompt_tokens: u64,
    kept_prompt_tokens: u64,
    copied_prompt_tokens: u64,
    evicted_sequences: u64,
    generated_tokens: u64,
    guided_tokens: u64,
    guide_mask_micros: u64,
}

impl Engine {
    /// An engine serving `decoder` with `params` (in [`Decoder::parameters`]
    /// order, `config.dtype`), as policy version 0, on the device that holds
    /// the params (one engine per device of a client is how several devices
    /// generate).
    pub fn new(client: &Client, decoder: Decoder, params: Vec<Buffer>, config: EngineConfig) -> Result<Engine> {
        if config.max_num_seqs == 0 || config.max_model_len < 2 {
            return Err(Error::InvalidRequest {
                message: format!(
                    "an engine needs max_num_seqs ≥ 1 and max_model_len ≥ 2, not {} and {}",
                    config.max_num_seqs, config.max_model_len
                ),
            });
        }
        let device = match params.first() {
            Some(first) => first.device().clone(),
            None => client.device(0)?.clone(),
        };
        if let Some(other) = params.iter().find(|p| p.device() != &device) {
            return Err(Error::InvalidRequest {
                message: format!(
                    "an engine's weights must be on one device: {:?} and {:?}",
                    device.id(),
                    other.device().id()
                ),
            });
        }
        let (decoder, adapters) = match config.max_loras {
            0 => (decoder, None),
            slots => {
                if decoder.lora().is_some() || config.max_lora_rank == 0 {
                    return Err(Error::InvalidRequest {
                        message: "adapter slots need a base model without adapters and max_lora_rank ≥ 1".to_string(),
                    });
                }
                let banked = Decoder::with_adapter_slots(decoder.config().clone(), slots, config.max_lora_rank)?;
                (banked, Some(AdapterSlots::new(slots, config.max_lora_rank)))
            }
        };
        let programs = Programs::new(
            client,
            &device,
            decoder,
            config.dtype,
            config.max_num_seqs,
            config.max_model_len,
        );
        let state = programs.zero_state()?;
        let mut params = params;
        if adapters.is_some() {
            let banks: Vec<TensorType> = programs
                .decoder()
                .adapter_parameters()
                .iter()
                .map(|s| TensorType::new(config.dtype, s.dims.iter().map(|&d| d as i64).collect::<Vec<_>>()))
                .collect();
            params.extend(programs.zeros(&banks)?);
        }
        Ok(Engine {
            client: client.clone(),
            device,
            programs,
            config,
            params,
            version: 0,
            state,
            slots: (0..config.max_num_seqs).map(|_| None).collect(),
            kept: (0..config.max_num_seqs).map(|_| None).collect(),
            queue: VecDeque::new(),
            held: HashMap::new(),
            next_id: 0,
            pending: Vec::new(),
            tokenizer: None,
            grammars: None,
            adapters,
            counters: Counters::default(),
        })
    }

    /// Detokenizes completions with `tokenizer`: updates stream their text
    /// and requests may stop on strings.
    pub fn with_tokenizer(mut self, tokenizer: Arc<Tokenizer>) -> Engine {
        self.tokenizer = Some(tokenizer);
        self
    }

    /// The device it runs on (its weights', cache's and programs').
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The engine's size.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The model.
    pub fn decoder(&self) -> &Decoder {
        self.programs.decoder()
    }

    /// Bytes the KV cache and token history hold on the device.
    pub fn cache_bytes(&self) -> usize {
        self.state.iter().map(Buffer::device_bytes).sum()
    }

    /// The current load.
    pub fn stats(&self) -> EngineStats {
        let running = self.slots.iter().flatten().count();
        EngineStats {
            waiting: self.queue.len(),
            running,
            free_slots: self.slots.len() - running,
            version: self.version,
            compiled_programs: self.programs.compiled(),
            prompt_tokens: self.counters.prompt_tokens,
            shared_prompt_tokens: self.counters.shared_prompt_tokens,
            kept_prompt_tokens: self.counters.kept_prompt_tokens,
            copied_prompt_tokens: self.counters.copied_prompt_tokens,
            evicted_sequences: self.counters.evicted_sequences,
            generated_tokens: self.counters.generated_tokens,
            guided_tokens: self.counters.guided_tokens,
            guide_mask_micros: self.counters.guide_mask_micros,
            adapters: self.adapters.as_ref().map_or(0, AdapterSlots::loaded),
        }
    }

    /// Whether any request is waiting or running, or updates are pending.
    pub fn has_work(&self) -> bool {
        !self.held.is_empty() || !self.pending.is_empty()
    }

    fn limits(&self) -> Limits {
        Limits {
            max_model_len: self.config.max_model_len,
            max_num_seqs: self.config.max_num_seqs,
            vocab_size: self.decoder().config().vocab_size,
            has_tokenizer: self.tokenizer.is_some(),
        }
    }

    /// Queues a request; its samples start as soon as `n` slots are free.
    /// A request the engine cannot serve is refused here with the reason.
    pub fn add_request(&mut self, request: Request) -> Result<RequestId> {
        request
            .check(&self.limits())
            .map_err(|message| Error::InvalidRequest { message })?;
        if let Some(id) = request.params.adapter {
            self.adapter_slot(id)?;
        }
        let guide = match &request.params.guide {
            Some(guide) => Some(self.grammars()?.compile(guide)?),
            None => None,
        };
        let p = &request.params;
        let mut stop_tokens = p.stop_token_ids.clone();
        if !p.ignore_eos {
            stop_tokens.extend(&self.decoder().config().eos_token_ids);
        }
        let id = self.next_id;
        self.next_id += 1;
        let unfinished = p.n;
        self.held.insert(
            id,
            Held {
                request,
                stop_tokens,
                unfinished,
                guide,
            },
        );
        self.queue.push_back(id);
        Ok(id)
    }

    /// The slot holding adapter `id`, refused when none does.
    fn adapter_slot(&self, id: AdapterId) -> Result<usize> {
        let slots = self.adapters.as_ref().ok_or_else(|| Error::InvalidRequest {
            message: "this engine serves no adapters: make it with max_loras ≥ 1".to_string(),
        })?;
        slots.slot_of(id).ok_or_else(|| Error::InvalidRequest {
            message: format!("no adapter {} is loaded", id.0),
        })
    }

    /// Loads the LoRA adapter `lora` with `tensors` (named as
    /// [`Decoder::with_adapters`] names them) into an empty slot, for
    /// requests to pick by the returned id. Refuses an engine without
    /// slots, full slots, a rank over `max_lora_rank`, and tensors that do
    /// not make the adapter; then nothing changes.
    pub fn load_adapter(&mut self, lora: &LoraConfig, tensors: &[(String, HostTensor)]) -> Result<AdapterId> {
        let slots = self.adapters.as_ref().ok_or_else(|| Error::InvalidRequest {
            message: "this engine takes no adapters: make it with max_loras ≥ 1".to_string(),
        })?;
        let staged = slots.slot_tensors(self.decoder(), lora, tensors)?;
        let (slot, rank) = (slots.empty_slot()?, slots.rank());
        let uploaded = staged
            .iter()
            .map(|t| t.upload(&self.client, &self.device, self.config.dtype))
            .collect::<Result<Vec<Buffer>>>()?;
        drop(staged);
        let offset = upload(&self.client, &self.device, &[(slot * rank) as i32], &[])?;
        let base = self.decoder().base_parameters().len();
        let banks = self.params.split_off(base);
        let mut args: Vec<Arg<'_>> = banks.iter().map(Arg::Donate).collect();
        args.push(Arg::Borrow(&offset));
        args.extend(uploaded.iter().map(Arg::Borrow));
        let written = self
            .programs
            .get(ProgramKey::WriteAdapter { rank })?
            .execute_args(&args)?;
        self.params.extend(written);
        Ok(self
            .adapters
            .as_mut()
            .expect("checked above")
            .fill(slot, lora.scaling()))
    }

    /// Unloads adapter `id`: the requests using it end as aborted (their
    /// updates come with the next step), what slots keep of its samples is
    /// dropped, and its slot is free. False if it is not loaded.
    pub fn unload_adapter(&mut self, id: AdapterId) -> bool {
        if self.adapters.as_ref().and_then(|a| a.slot_of(id)).is_none() {
            return false;
        }
        let users: Vec<RequestId> = self
            .held
            .iter()
            .filter(|(_, h)| h.request.params.adapter == Some(id))
            .map(|(&r, _)| r)
            .collect();
        for request in users {
            self.abort(request);
        }
        for kept in self.kept.iter_mut() {
            if kept.as_ref().is_some_and(|k| k.adapter == Some(id)) {
                *kept = None;
            }
        }
        self.adapters.as_mut().is_some_and(|a| a.empty(id))
    }

    /// The guide compiler, made the first time (the checks made sure of a tokenizer).
    fn grammars(&mut self) -> Result<&Grammars> {
        if self.grammars.is_none() {
            let tokenizer = self.tokenizer.clone().ok_or_else(|| Error::InvalidRequest {
                message: "structured outputs need an engine with a tokenizer".to_string(),
            })?;
            let config = self.decoder().config();
            self.grammars = Some(Grammars::new(tokenizer, config.vocab_size, &config.eos_token_ids)?);
        }
        Ok(self.grammars.as_ref().expect("made above"))
    }

    /// Ends a request now: its waiting or running samples finish with
    /// [`FinishReason::Abort`] (returned by the next [`Engine::step`]) and
    /// their slots are free at once. False if the request is unknown or done.
    pub fn abort(&mut self, id: RequestId) -> bool {
        let Some(held) = self.held.remove(&id) else {
            return false;
        };
        let n = held.request.params.n;
        let mut ended = vec![false; n];
        for slot in self.slots.iter_mut() {
            if slot.as_ref().is_some_and(|s| s.request == id) {
                let sequence = slot.take().expect("checked");
                ended[sequence.index] = true;
                self.pending.push(finished(sequence, FinishReason::Abort, None));
            }
        }
        if let Some(at) = self.queue.iter().position(|&q| q == id) {
            self.queue.remove(at);
            for index in 0..n {
                let empty = Sequence {
                    request: id,
                    index,
                    prompt_len: held.request.prompt.len(),
                    next_input: 0,
                    tokens: Vec::new(),
                    text: None,
                    guide: None,
                    current: false,
                    adapter: None,
                };
                self.pending.push(finished(empty, FinishReason::Abort, None));
            }
        }
        true
    }

    /// One scheduling iteration: admits waiting requests into free slots
    /// (prefilling each prompt once), then decodes one token for every
    /// running sample. Returns what happened to each sample (including
    /// aborts since the last call).
    pub fn step(&mut self) -> Result<Vec<SampleUpdate>> {
        self.admit()?;
        if self.slots.iter().any(Option::is_some) {
            self.decode()?;
        }
        Ok(self.take_updates())
    }

    /// The updates made outside a step (aborts, also those of a weight
    /// update), without stepping.
    pub fn take_updates(&mut self) -> Vec<SampleUpdate> {
        std::mem::take(&mut self.pending)
    }

    /// Ids of the requests waiting or running.
    pub fn requests(&self) -> Vec<RequestId> {
        self.held.keys().copied().collect()
    }

    /// Generates every request's samples (outer: per request, in order;
    /// inner: its `n` samples by index). All requests are checked first;
    /// one the engine cannot serve refuses the whole call, naming it.
    pub fn generate(&mut self, requests: &[Request]) -> Result<Vec<Vec<Completion>>> {
        if self.has_work() {
            return Err(Error::Busy {
                requests: self.held.len(),
            });
        }
        let limits = self.limits();
        for (i, request) in requests.iter().enumerate() {
            request.check(&limits).map_err(|message| Error::InvalidRequest {
                message: format!("request {i}: {message}"),
            })?;
        }
        let mut done: HashMap<RequestId, Vec<Option<Completion>>> = HashMap::new();
        let mut order = Vec::with_capacity(requests.len());
        for request in requests {
            let id = self.add_request(request.clone())?;
            done.insert(id, vec![None; request.params.n]);
            order.push(id);
        }
        while self.has_work() {
            for update in self.step()? {
                if let Some(completion) = update.finished {
                    done.get_mut(&update.request).expect("our request")[update.index] = Some(completion);
                }
            }
        }
        Ok(order
            .iter()
            .map(|id| {
                done.remove(id)
                    .expect("our request")
                    .into_iter()
                    .map(|c| c.expect("every sample finishes"))
                    .collect()
            })
            .collect())
    }

    /// The policy version of the current weights.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Replaces the named parameters (any subset, Hugging Face names) and
    /// makes `version` current; `in_flight` says what running samples do.
    /// Every tensor is checked (known name, no repeats, right shape, finite)
    /// and uploaded before any is swapped in: a refused update leaves the
    /// old weights serving.
    pub fn update_weights<T: ParameterValues>(
        &mut self,
        version: u64,
        tensors: &[(String, T)],
        in_flight: InFlight,
    ) -> Result<()> {
        let refuse = |message: String| Error::InvalidUpdate { version, message };
        let specs = self.decoder().parameters();
        let mut seen = vec![false; specs.len()];
        let mut staged = Vec::with_capacity(tensors.len());
        for (name, tensor) in tensors {
            let index = specs
                .iter()
                .position(|s| &s.name == name)
                .ok_or_else(|| refuse(format!("the model has no parameter `{name}`")))?;
            if std::mem::replace(&mut seen[index], true) {
                return Err(refuse(format!("`{name}` appears twice")));
            }
            if tensor.dims() != specs[index].dims {
                return Err(refuse(format!(
                    "`{name}` has shape {:?}, the model needs {:?}",
                    tensor.dims(),
                    specs[index].dims
                )));
            }
            if let Some(bad) = tensor.first_non_finite() {
                return Err(refuse(format!("`{name}` holds a non-finite value ({bad})")));
            }
            staged.push((index, tensor.upload(&self.client, &self.device, self.config.dtype)?));
        }
        for (index, buffer) in staged {
            self.params[index] = buffer;
        }
        self.now_serving(version, in_flight);
        Ok(())
    }

    /// Installs LoRA adapter tensors (named as [`Decoder::with_adapters`]
    /// names them) of the layout `lora` as policy `version`: the engine
    /// first takes adapters of that layout when it serves others or none
    /// (its programs then apply `(x·Aᵀ)·Bᵀ·s` beside every adapted layer,
    /// compiled anew), then updates them as [`Engine::update_weights`] does.
    /// A refused update leaves the old weights and layout serving.
    pub fn update_adapters<T: ParameterValues>(
        &mut self,
        version: u64,
        lora: &LoraConfig,
        tensors: &[(String, T)],
        in_flight: InFlight,
    ) -> Result<()> {
        if self.adapters.is_some() {
            return Err(Error::InvalidUpdate {
                version,
                message: "an engine with adapter slots serves adapters by request, not as the policy".to_string(),
            });
        }
        if self.decoder().lora() == Some(lora) {
            return self.update_weights(version, tensors, in_flight);
        }
        let config = self.decoder().config().clone();
        let decoder = Decoder::with_adapters(config, lora.clone())?;
        let base = decoder.base_parameters().len();
        let zeros = decoder
            .adapter_parameters()
            .iter()
            .map(|spec| {
                let zeros = HostTensor::new(spec.dims.clone(), vec![0.0; spec.dims.iter().product()])?;
                zeros.upload(&self.client, &self.device, self.config.dtype)
            })
            .collect::<Result<Vec<Buffer>>>()?;
        let c = &self.config;
        let programs = Programs::new(
            &self.client,
            &self.device,
            decoder,
            c.dtype,
            c.max_num_seqs,
            c.max_model_len,
        );
        let old_programs = std::mem::replace(&mut self.programs, programs);
        let old_adapters = self.params.split_off(base);
        self.params.extend(zeros);
        let installed = self.update_weights(version, tensors, in_flight);
        if installed.is_err() {
            self.programs = old_programs;
            self.params.truncate(base);
            self.params.extend(old_adapters);
        }
        installed
    }

    /// Installs `buffers` — every parameter in the model's order, already
    /// on this engine's device in its dtype (copies made on the device, e.g.
    /// by the learner sharing it) — as policy `version`, with no host round
    /// trip. The caller vouches that the values are finite; shapes, dtype,
    /// device and count are checked here.
    pub fn update_weights_on_device(&mut self, version: u64, buffers: Vec<Buffer>, in_flight: InFlight) -> Result<()> {
        let refuse = |message: String| Error::InvalidUpdate { version, message };
        let specs = self.decoder().parameters();
        if buffers.len() != specs.len() {
            return Err(refuse(format!(
                "{} buffers for the model's {} parameters",
                buffers.len(),
                specs.len()
            )));
        }
        for (buffer, spec) in buffers.iter().zip(specs) {
            let dims: Vec<i64> = spec.dims.iter().map(|&d| d as i64).collect();
            if buffer.dims() != dims.as_slice() || buffer.dtype() != self.config.dtype {
                return Err(refuse(format!(
                    "`{}` is {} {:?}, the engine needs {} {:?}",
                    spec.name,
                    buffer.dtype(),
                    buffer.dims(),
                    self.config.dtype,
                    dims
                )));
            }
            if buffer.device().id() != self.device.id() {
                return Err(refuse(format!(
                    "`{}` is on device {}, the engine on device {}",
                    spec.name,
                    buffer.device().id(),
                    self.device.id()
                )));
            }
        }
        self.params = buffers;
        self.now_serving(version, in_flight);
        Ok(())
    }

    /// Marks new weights as policy `version`, aborting what runs if asked.
    fn now_serving(&mut self, version: u64, in_flight: InFlight) {
        self.version = version;
        self.kept.fill_with(|| None);
        for sequence in self.slots.iter_mut().flatten() {
            sequence.current = false;
        }
        if in_flight == InFlight::Abort {
            for id in self.requests() {
                self.abort(id);
            }
        }
    }

    /// Moves waiting requests, first come first served, into free slots
    /// while the one at the front has room for all its samples. A request
    /// that continues a kept sample is extended in that slot; one whose
    /// prompt begins with a prefix another slot holds copies it and is
    /// extended; the others' prompts are prefilled, those of one length
    /// bucket together.
    fn admit(&mut self) -> Result<()> {
        let mut ids = Vec::new();
        let mut left = self.slots.iter().filter(|s| s.is_none()).count();
        while let Some(&id) = self.queue.front() {
            let n = self.held[&id].request.params.n;
            if n > left {
                break;
            }
            left -= n;
            self.queue.pop_front();
            ids.push(id);
        }
        // Continuations take their slots first, so that a request admitted
        // beside them cannot evict the samples they continue.
        let mut reserved = Vec::new();
        let mut continuing = HashMap::new();
        for &id in &ids {
            if let Some((slot, kept)) = self.continued_slot(&self.held[&id].request, &reserved) {
                reserved.push(slot);
                continuing.insert(id, (slot, kept));
                // Its keys and values are about to change.
                self.kept[slot] = None;
            }
        }
        let mut admitted = Vec::with_capacity(ids.len());
        for id in ids {
            let (mut slots, cached) = match continuing.get(&id) {
                Some(&(slot, kept)) => (vec![slot], Cached::Kept(kept)),
                None => (Vec::new(), Cached::Nothing),
            };
            let others = self.take_free_slots(self.held[&id].request.params.n - slots.len(), &reserved);
            reserved.extend(&others);
            slots.extend(others);
            admitted.push(Admitted { id, slots, cached });
        }
        // Every slot written below is reserved by now, so the slots lending
        // prefixes (the others) hold what they held before this call.
        for a in admitted.iter_mut().filter(|a| a.cached == Cached::Nothing) {
            if let Some((source, positions)) = self.shared_prefix(&self.held[&a.id].request, &reserved) {
                self.copy_slot(source, a.slots[0], positions)?;
                a.cached = Cached::Copied(positions);
            }
        }
        let (cached, fresh): (Vec<Admitted>, Vec<Admitted>) =
            admitted.into_iter().partition(|a| a.cached != Cached::Nothing);
        for (t, group) in self.by_bucket(fresh, |engine, a| engine.prompt(a).len()) {
            self.prefill(t, &group)?;
            self.start(&group)?;
        }
        for (t, group) in self.by_bucket(cached, |engine, a| engine.prompt(a).len() - a.cached.positions()) {
            self.extend(t, &group)?;
            self.start(&group)?;
        }
        Ok(())
    }

    /// The prompt of an admitted request.
    fn prompt(&self, admitted: &Admitted) -> &[u32] {
        &self.held[&admitted.id].request.prompt
    }

    /// `admitted` grouped by the prefill bucket of `tokens(admitted)`.
    fn by_bucket(
        &self,
        admitted: Vec<Admitted>,
        tokens: impl Fn(&Engine, &Admitted) -> usize,
    ) -> Vec<(usize, Vec<Admitted>)> {
        let mut groups: Vec<(usize, Vec<Admitted>)> = Vec::new();
        for a in admitted {
            let t = self.programs.prefill_bucket(tokens(self, &a));
            match groups.iter_mut().find(|(bucket, _)| *bucket == t) {
                Some((_, group)) => group.push(a),
                None => groups.push((t, vec![a])),
            }
        }
        groups
    }

    /// The free slot (none of `reserved`) keeping the longest finished
    /// sample of `request`'s adapter whose tokens its prompt starts with,
    /// and the positions it holds (the sample's length less one: its last
    /// token has none yet).
    fn continued_slot(&self, request: &Request, reserved: &[usize]) -> Option<(usize, usize)> {
        if !self.config.continue_sequences {
            return None;
        }
        let prompt = &request.prompt;
        (0..self.slots.len())
            .filter(|s| self.slots[*s].is_none() && !reserved.contains(s))
            .filter_map(|s| self.kept[s].as_ref().map(|k| (s, k)))
            .filter(|(_, k)| k.adapter == request.params.adapter)
            .map(|(s, k)| (s, &k.tokens))
            .filter(|(_, tokens)| tokens.len() >= 2 && prompt.starts_with(tokens))
            .map(|(s, tokens)| (s, tokens.len() - 1))
            .max_by_key(|&(_, positions)| positions)
    }

    /// The slot (none of `reserved`; running, or keeping a finished
    /// sample, with the current weights and `request`'s adapter) holding
    /// the longest prefix of its prompt, and the positions of it worth
    /// copying: at least [`MIN_SHARED_PREFIX`], at most all but the
    /// prompt's last token (which the first decode step feeds). The lowest
    /// such slot among equals.
    fn shared_prefix(&self, request: &Request, reserved: &[usize]) -> Option<(usize, usize)> {
        if !self.config.share_prefixes {
            return None;
        }
        let (prompt, adapter) = (&request.prompt, request.params.adapter);
        let common =
            |held: &mut dyn Iterator<Item = u32>| prompt.iter().zip(held).take_while(|(a, b)| **a == *b).count();
        let mut best: Option<(usize, usize)> = None;
        for slot in (0..self.slots.len()).filter(|s| !reserved.contains(s)) {
            let positions = match (&self.slots[slot], &self.kept[slot]) {
                (Some(running), _) if running.current && running.adapter == adapter => {
                    let request = &self.held[&running.request].request;
                    let mut held = request
                        .prompt
                        .iter()
                        .copied()
                        .chain(running.tokens.iter().map(|t| t.id));
                    // Positions before the one its next decode step writes hold keys and values.
                    common(&mut held).min(running.position())
                }
                (None, Some(kept)) if kept.adapter == adapter => {
                    common(&mut kept.tokens.iter().copied()).min(kept.tokens.len() - 1)
                }
                _ => 0,
            };
            let positions = positions.min(prompt.len() - 1);
            if positions >= MIN_SHARED_PREFIX && best.is_none_or(|(_, most)| positions > most) {
                best = Some((slot, positions));
            }
        }
        best
    }

    /// Copies the first `positions` cache positions of slot `from` into
    /// slot `to` (the fork program, in the bucket holding them).
    fn copy_slot(&mut self, from: usize, to: usize, positions: usize) -> Result<()> {
        let (c, d) = (&self.client, &self.device);
        let ends = [upload(c, d, &[from as i32], &[])?, upload(c, d, &[to as i32], &[])?];
        let mut args: Vec<Arg<'_>> = ends.iter().map(Arg::Borrow).collect();
        args.extend(self.state.iter().map(Arg::Donate));
        let key = ProgramKey::Fork {
            tokens: self.programs.prefill_bucket(positions),
        };
        self.state = self.programs.get(key)?.execute_args(&args)?;
        Ok(())
    }

    /// `n` free slots, none of `reserved`: empty ones, then those keeping a
    /// finished sample, which is evicted; lowest first within each (so the
    /// same calls take the same slots, and decode the same rows).
    fn take_free_slots(&mut self, n: usize, reserved: &[usize]) -> Vec<usize> {
        let mut free: Vec<usize> = (0..self.slots.len())
            .filter(|s| self.slots[*s].is_none() && !reserved.contains(s))
            .collect();
        free.sort_by_key(|&s| (self.kept[s].is_some(), s));
        free.truncate(n);
        for &s in &free {
            if self.kept[s].take().is_some() {
                self.counters.evicted_sequences += 1;
            }
        }
        free
    }

    /// The inputs of a prefill or extend program over `group`, each
    /// prompt's tokens after those its first slot holds (at most `t`, the
    /// last included).
    fn token_inputs(&self, t: usize, group: &[Admitted]) -> TokenInputs {
        let p = self.programs.prefill_rows(group.len());
        let mut inputs = TokenInputs::new(p, t, self.decoder().config().vocab_size);
        for (row, a) in group.iter().enumerate() {
            let held = &self.held[&a.id];
            inputs.add(
                row,
                &held.request.prompt,
                a.cached.positions(),
                &held.stop_tokens,
                a.slots[0],
            );
        }
        inputs
    }

    /// Prefills the prompts of `group` (prompts of at most `t` tokens) in
    /// one program, each into its first slot.
    fn prefill(&mut self, t: usize, group: &[Admitted]) -> Result<()> {
        let inputs = self.token_inputs(t, group);
        let adapters = self.group_adapters(group);
        let key = ProgramKey::Prefill {
            prompts: inputs.rows(),
            tokens: t,
            adapted: self.adapted(&adapters),
        };
        let buffers = inputs.upload(&self.client, &self.device)?;
        self.run_on_state(key, inputs.rows(), &adapters, &buffers)
    }

    /// The adapter of each request of `group`, in order.
    fn group_adapters(&self, group: &[Admitted]) -> Vec<Option<AdapterId>> {
        group.iter().map(|a| self.held[&a.id].request.params.adapter).collect()
    }

    /// Whether rows using `adapters` need the adapted programs.
    fn adapted(&self, adapters: &[Option<AdapterId>]) -> bool {
        self.adapters.is_some() && adapters.iter().any(Option::is_some)
    }

    /// Extends the prompts of `group`, whose first slots hold their first
    /// positions (kept or copied): each prompt's tokens after those (at
    /// most `t`, the last included) are written after them, in one program.
    fn extend(&mut self, t: usize, group: &[Admitted]) -> Result<()> {
        let inputs = self.token_inputs(t, group);
        let p = inputs.rows();
        let longest = group.iter().map(|a| self.prompt(a).len()).max().unwrap_or(1);
        let adapters = self.group_adapters(group);
        let key = ProgramKey::Extend {
            prompts: p,
            tokens: t,
            window: self.programs.window_bucket(longest),
            adapted: self.adapted(&adapters),
        };
        let buffers = inputs.upload(&self.client, &self.device)?;
        self.run_on_state(key, p, &adapters, &buffers)
    }

    /// The adapter columns of `rows` rows using `adapters` (see
    /// [`crate::adapters`]), when they need the adapted programs.
    fn adapter_columns(&self, rows: usize, adapters: &[Option<AdapterId>]) -> Result<Option<Buffer>> {
        match &self.adapters {
            Some(slots) if self.adapted(adapters) => {
                let columns = slots.columns(rows, adapters);
                let width = (columns.len() / rows) as i64;
                Ok(Some(upload(
                    &self.client,
                    &self.device,
                    &columns,
                    &[rows as i64, width],
                )?))
            }
            _ => Ok(None),
        }
    }

    /// How many parameters a program takes: the base model's alone on an
    /// engine with adapter slots whose rows need no adapter (`adapted`
    /// false), else all.
    fn weight_count(&self, adapted: bool) -> usize {
        match &self.adapters {
            Some(_) if !adapted => self.decoder().base_parameters().len(),
            _ => self.params.len(),
        }
    }

    /// Runs the program of `key` on the weights (with the adapter columns
    /// of `rows` rows using `adapters`), `inputs` and the device state
    /// (donated), which it replaces.
    fn run_on_state(
        &mut self,
        key: ProgramKey,
        rows: usize,
        adapters: &[Option<AdapterId>],
        inputs: &[Buffer],
    ) -> Result<()> {
        let columns = self.adapter_columns(rows, adapters)?;
        let count = self.weight_count(columns.is_some());
        let mut args = weight_args(&self.params[..count], columns.as_ref());
        args.extend(inputs.iter().map(Arg::Borrow));
        args.extend(self.state.iter().map(Arg::Donate));
        self.state = self.programs.get(key)?.execute_args(&args)?;
        Ok(())
    }

    /// Starts the samples of `group`, whose prompts are in their first
    /// slots: forks each into its other slots and makes them run.
    fn start(&mut self, group: &[Admitted]) -> Result<()> {
        for a in group {
            let len = self.prompt(a).len();
            for &dst in &a.slots[1..] {
                self.copy_slot(a.slots[0], dst, len)?;
            }
            let request = &self.held[&a.id].request;
            self.counters.prompt_tokens += (len * a.slots.len()) as u64;
            self.counters.shared_prompt_tokens += (len * (a.slots.len() - 1)) as u64;
            match a.cached {
                Cached::Nothing => {}
                Cached::Kept(n) => self.counters.kept_prompt_tokens += n as u64,
                Cached::Copied(n) => self.counters.copied_prompt_tokens += n as u64,
            }
            for (index, &slot) in a.slots.iter().enumerate() {
                let text = match &self.tokenizer {
                    Some(tokenizer) => Some(SampleText::new(tokenizer, &request.prompt, &request.params)?),
                    None => None,
                };
                let held = &self.held[&a.id];
                self.slots[slot] = Some(Sequence {
                    request: a.id,
                    index,
                    prompt_len: len,
                    next_input: request.prompt[len - 1],
                    tokens: Vec::new(),
                    text,
                    guide: held.guide.as_ref().map(GuidedSample::fork),
                    current: true,
                    adapter: request.params.adapter,
                });
            }
        }
        Ok(())
    }

    /// Per slot, the bitmask words of the tokens its guided sample may
    /// draw next (none for unguided slots; empty when no sample is guided,
    /// so unguided steps do no work here). A sample whose grammar fails
    /// ends here, aborted.
    fn guide_masks(&mut self) -> Vec<Option<Vec<u32>>> {
        if !self.slots.iter().flatten().any(|s| s.guide.is_some()) {
            return Vec::new();
        }
        let words = Grammars::words(self.decoder().config().vocab_size);
        let started = Instant::now();
        let mut masks = vec![None; self.slots.len()];
        let mut failed = Vec::new();
        for (row, slot) in self.slots.iter_mut().enumerate() {
            let Some(guide) = slot.as_mut().and_then(|s| s.guide.as_mut()) else {
                continue;
            };
            let mut mask = vec![0; words];
            match guide.allowed(&mut mask) {
                Ok(()) => masks[row] = Some(mask),
                Err(_) => failed.push(row),
            }
        }
        self.counters.guide_mask_micros += started.elapsed().as_micros() as u64;
        for row in failed {
            let update = self.end_sample(row, FinishReason::Abort, None);
            self.pending.push(update);
        }
        masks
    }

    /// Takes the sample out of slot `row` as finished for `reason`: its slot
    /// keeps its tokens (when they are current), and its request is done
    /// with its last sample.
    fn end_sample(&mut self, row: usize, reason: FinishReason, stop: Option<StopReason>) -> SampleUpdate {
        let sequence = self.slots[row].take().expect("running");
        if sequence.current && (self.config.continue_sequences || self.config.share_prefixes) {
            let prompt = &self.held[&sequence.request].request.prompt;
            let tokens = prompt
                .iter()
                .copied()
                .chain(sequence.tokens.iter().map(|t| t.id))
                .collect();
            self.kept[row] = Some(Kept {
                tokens,
                adapter: sequence.adapter,
            });
        }
        let update = finished(sequence, reason, stop);
        let held = self.held.get_mut(&update.request).expect("running request");
        held.unfinished -= 1;
        if held.unfinished == 0 {
            self.held.remove(&update.request);
        }
        update
    }

    /// One decode step for every running sample.
    fn decode(&mut self) -> Result<()> {
        let masks = self.guide_masks();
        let Some(top_slot) = self.slots.iter().rposition(Option::is_some) else {
            return Ok(());
        };
        let longest = self.slots.iter().flatten().map(|s| s.position() + 1).max().unwrap_or(1);
        let (rows, window) = self.programs.decode_bucket(top_slot, longest);
        let wants_top = self
            .slots
            .iter()
            .flatten()
            .any(|s| self.held[&s.request].request.params.logprobs.is_some());
        let guided = masks.iter().any(Option::is_some);
        let mut inputs = RowInputs::new(&self.slots, rows, &self.held);
        if guided {
            inputs.allow(&masks, Grammars::words(self.decoder().config().vocab_size));
        }
        let history = inputs.reads_history();
        let inputs = inputs.upload(&self.client, &self.device)?;
        let adapters: Vec<Option<AdapterId>> = (0..rows)
            .map(|row| self.slots.get(row).and_then(Option::as_ref).and_then(|s| s.adapter))
            .collect();
        let columns = self.adapter_columns(rows, &adapters)?;
        let count = self.weight_count(columns.is_some());
        let mut args = weight_args(&self.params[..count], columns.as_ref());
        args.extend(inputs.iter().map(Arg::Borrow));
        let layers = self.state.len() - 3;
        args.extend(self.state[..=layers].iter().map(Arg::Donate));
        args.extend(self.state[layers + 1..].iter().map(Arg::Borrow));
        let sampler = self
            .slots
            .iter()
            .flatten()
            .map(|s| {
                let p = &self.held[&s.request].request.params;
                SamplerKind::for_row(p.temperature, p.top_k, p.top_p)
            })
            .max()
            .unwrap_or(SamplerKind::Greedy);
        let key = ProgramKey::Decode(DecodeKey {
            rows,
            window,
            sampler,
            history,
            top: wants_top,
            guided,
            adapted: columns.is_some(),
        });
        let mut out = self.programs.get(key)?.execute_args(&args)?;
        let results = if wants_top { 4 } else { 2 };
        let history = self.state.split_off(layers + 1);
        self.state = out.split_off(results);
        self.state.extend(history);
        let tokens = out[0].to_host::<i32>()?;
        let logprobs = out[1].to_host::<f32>()?;
        let top = if wants_top {
            Some((out[2].to_host::<i32>()?, out[3].to_host::<f32>()?))
        } else {
            None
        };
        let k = crate::request::MAX_TOP_LOGPROBS;
        for row in 0..rows.min(self.slots.len()) {
            let Some(sequence) = self.slots[row].as_mut() else {
                continue;
            };
            let held = &self.held[&sequence.request];
            let top_logprobs = match (&top, held.request.params.logprobs) {
                (Some((ids, values)), Some(wanted)) => (0..wanted)
                    .map(|j| (ids[row * k + j] as u32, values[row * k + j]))
                    .collect(),
                _ => Vec::new(),
            };
            let token = Token {
                id: tokens[row] as u32,
                logprob: logprobs[row],
                top_logprobs,
                version: self.version,
            };
            sequence.tokens.push(token.clone());
            self.counters.generated_tokens += 1;
            sequence.next_input = token.id;
            let params = &held.request.params;
            let (mut text, stop_string) = match sequence.text.as_mut() {
                Some(t) => t.push(token.id)?,
                None => (String::new(), None),
            };
            let mut finish = if held.stop_tokens.contains(&token.id) {
                Some((FinishReason::Stop, Some(StopReason::Token(token.id))))
            } else if let Some(stop) = stop_string {
                Some((FinishReason::Stop, Some(StopReason::String(stop))))
            } else if sequence.tokens.len() >= params.max_tokens {
                Some((FinishReason::Length, None))
            } else {
                None
            };
            if let Some(guide) = sequence.guide.as_mut() {
                self.counters.guided_tokens += 1;
                // The mask allowed only what the grammar takes: a refusal means it failed.
                if finish.is_none() && guide.advance(token.id).is_err() {
                    finish = Some((FinishReason::Abort, None));
                }
            }
            if let (Some((_, None | Some(StopReason::Token(_)))), Some(t)) = (&finish, sequence.text.as_mut()) {
                text.push_str(&t.finish()?);
            }
            let mut update = SampleUpdate {
                request: sequence.request,
                index: sequence.index,
                token: Some(token),
                text,
                finished: None,
            };
            if let Some((reason, stop)) = finish {
                update.finished = self.end_sample(row, reason, stop).finished;
            }
            self.pending.push(update);
        }
        Ok(())
    }
}

/// `params` then the rows' adapter `columns` (when given), borrowed as program arguments.
fn weight_args<'a>(params: &'a [Buffer], columns: Option<&'a Buffer>) -> Vec<Arg<'a>> {
    let mut args: Vec<Arg<'a>> = params.iter().map(Arg::Borrow).collect();
    args.extend(columns.map(Arg::Borrow));
    args
}

/// The update that ends `sequence`.
fn finished(sequence: Sequence, reason: FinishReason, stop: Option<StopReason>) -> SampleUpdate {
    let tokens = &sequence.tokens;
    SampleUpdate {
        request: sequence.request,
        index: sequence.index,
        token: None,
        text: String::new(),
        finished: Some(Completion {
            index: sequence.index,
            tokens: tokens.iter().map(|t| t.id).collect(),
            logprobs: tokens.iter().map(|t| t.logprob).collect(),
            top_logprobs: tokens.iter().map(|t| t.top_logprobs.clone()).collect(),
            versions: tokens.iter().map(|t| t.version).collect(),
            text: sequence.text.as_ref().map(SampleText::text),
            finish_reason: reason,
            stop_reason: stop,
        }),
    }
}
