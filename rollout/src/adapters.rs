//! Adapters an engine serves side by side (vLLM's multi-LoRA serving):
//! an engine made with `max_loras` slots of rank up to `max_lora_rank`
//! holds up to that many LoRA adapters at once on its device, and each
//! request picks one (or none: the base model); rows of different adapters
//! share every prefill and decode program.
//!
//! The slots live in the parameters of a decoder with adapter slots
//! ([`Decoder::with_adapter_slots`]): slot `k` is rows (of `A`) and
//! columns (of `B`) `k·rank..(k+1)·rank` of each linear layer's bank. Each
//! program that runs an adapted row takes every row's adapter columns —
//! its adapter's scaling in its slot's columns, zeros elsewhere — and a
//! program whose rows all use the base model runs the base decoder alone,
//! at the base model's cost.
//!
//! Memory: the banks hold `max_loras · max_lora_rank · Σ(in + out)` values
//! of the engine's dtype over every linear layer (SmolLM2-135M, 4 slots of
//! rank 16, f32: 78 MB); loading an adapter also stages one slot's worth
//! on the host while it uploads.

use grpo_model::decoder::Decoder;
use grpo_model::lora::LoraConfig;
use grpo_model::weights::HostTensor;

use crate::error::{Error, Result};

/// An adapter loaded into an engine: unique for the engine's life (an
/// adapter unloaded and loaded again gets a new id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterId(pub u64);

/// The adapter one slot holds.
#[derive(Debug, Clone, Copy)]
struct Loaded {
    id: AdapterId,
    scaling: f32,
}

/// What the slots of an engine hold.
pub(crate) struct AdapterSlots {
    rank: usize,
    held: Vec<Option<Loaded>>,
    next_id: u64,
}

impl AdapterSlots {
    /// `slots` empty slots of rank `rank`.
    pub fn new(slots: usize, rank: usize) -> AdapterSlots {
        AdapterSlots {
            rank,
            held: vec![None; slots],
            next_id: 1,
        }
    }

    /// The highest rank a slot holds.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Adapters loaded.
    pub fn loaded(&self) -> usize {
        self.held.iter().flatten().count()
    }

    /// The slot holding adapter `id`.
    pub fn slot_of(&self, id: AdapterId) -> Option<usize> {
        self.held.iter().position(|h| h.is_some_and(|l| l.id == id))
    }

    /// The first empty slot, refused with what to do when every slot holds an adapter.
    pub fn empty_slot(&self) -> Result<usize> {
        self.held
            .iter()
            .position(Option::is_none)
            .ok_or_else(|| Error::InvalidRequest {
                message: format!(
                    "all {} adapter slots hold adapters (max_loras): unload one first, or start the engine with more",
                    self.held.len()
                ),
            })
    }

    /// Records that slot `slot` now holds an adapter of `scaling`; its new id.
    pub fn fill(&mut self, slot: usize, scaling: f64) -> AdapterId {
        let id = AdapterId(self.next_id);
        self.next_id += 1;
        self.held[slot] = Some(Loaded {
            id,
            scaling: scaling as f32,
        });
        id
    }

    /// Empties the slot holding `id`; false if none does.
    pub fn empty(&mut self, id: AdapterId) -> bool {
        match self.slot_of(id) {
            Some(slot) => {
                self.held[slot] = None;
                true
            }
            None => false,
        }
    }

    /// Each row's adapter columns `[rows, slots·rank]` for rows using
    /// `adapters` (`None`: the base model; a row past the list is idle).
    pub fn columns(&self, rows: usize, adapters: &[Option<AdapterId>]) -> Vec<f32> {
        let width = self.held.len() * self.rank;
        let mut columns = vec![0.0; rows * width];
        for (row, id) in adapters.iter().enumerate().take(rows) {
            let Some(slot) = id.and_then(|id| self.slot_of(id)) else {
                continue;
            };
            let scaling = self.held[slot].map_or(0.0, |l| l.scaling);
            let start = row * width + slot * self.rank;
            columns[start..start + self.rank].fill(scaling);
        }
        columns
    }

    /// The tensors one slot holds for the adapter `lora` with `tensors`
    /// (named as [`Decoder::with_adapters`] names them), in the order of
    /// `bank`'s adapter parameters: each layer's `A` `[rank, in]` then `B`
    /// `[out, rank]`, zero-padded past the adapter's rank and zero on
    /// layers it does not adapt. Refuses a rank over the slots', a layer
    /// the model lacks, a missing, repeated or misshapen tensor and a
    /// non-finite value, naming it.
    pub fn slot_tensors(
        &self,
        bank: &Decoder,
        lora: &LoraConfig,
        tensors: &[(String, HostTensor)],
    ) -> Result<Vec<HostTensor>> {
        let refuse = |message: String| Error::InvalidRequest { message };
        if lora.rank > self.rank {
            return Err(refuse(format!(
                "the adapter's rank {} is over the engine's max_lora_rank {}",
                lora.rank, self.rank
            )));
        }
        let adapter = Decoder::with_adapters(bank.config().clone(), lora.clone())?;
        let wanted = adapter.adapter_parameters();
        for (i, (name, tensor)) in tensors.iter().enumerate() {
            let spec = wanted
                .iter()
                .find(|s| &s.name == name)
                .ok_or_else(|| refuse(format!("the adapter's layout has no tensor `{name}`")))?;
            if tensors[..i].iter().any(|(other, _)| other == name) {
                return Err(refuse(format!("`{name}` appears twice")));
            }
            if tensor.dims != spec.dims {
                return Err(refuse(format!(
                    "`{name}` has shape {:?}, the adapter needs {:?}",
                    tensor.dims, spec.dims
                )));
            }
            if let Some(bad) = tensor.data.iter().find(|v| !v.is_finite()) {
                return Err(refuse(format!("`{name}` holds a non-finite value ({bad})")));
            }
        }
        if let Some(missing) = wanted.iter().find(|s| !tensors.iter().any(|(n, _)| n == &s.name)) {
            return Err(refuse(format!("the adapter lacks `{}`", missing.name)));
        }
        bank.adapter_parameters()
            .iter()
            .map(|slot| {
                let (rows, cols) = if slot.name.ends_with(".lora_A.weight") {
                    (self.rank, slot.dims[1])
                } else {
                    (slot.dims[0], self.rank)
                };
                let mut data = vec![0.0; rows * cols];
                if let Some((_, given)) = tensors.iter().find(|(n, _)| n == &slot.name) {
                    let given_cols = given.dims[1];
                    for (r, row) in given.data.chunks(given_cols).enumerate() {
                        data[r * cols..r * cols + given_cols].copy_from_slice(row);
                    }
                }
                Ok(HostTensor::new(vec![rows, cols], data)?)
            })
            .collect()
    }
}
