//! The wire format of weight updates: how a sender cuts tensors into
//! checksummed chunks ([`EncodedUpdate`]), and how the
//! worker assembles them (`StagedUpdate`) and refuses anything short of
//! the whole, intact update.
//!
//! Values travel little-endian and row-major, as f32 or bf16
//! ([`WireDtype`]). Each chunk carries the CRC-32 of its bytes; each
//! tensor's announcement carries the CRC-32 of all its bytes in element
//! order, which the worker checks at the end by combining the chunks'
//! checksums in offset order (so chunks may arrive in any order).
//!
//! Memory: a staged update holds one host copy of the tensors it
//! replaces, in the engine's dtype (bf16 or f32), allocated when it starts
//! and decoded into chunk by chunk (the announced shapes must be the
//! model's, so that is at most one copy of the model in the engine's
//! dtype). A bf16 engine thus never sees an f32 copy of an update.

use std::collections::BTreeMap;

use grpo_model::decoder::Decoder;
use grpo_model::lora::LoraConfig;
use grpo_model::names::ParamSpec;
use grpo_model::weights::HostTensor;
use grpo_proto::rollout as proto;

use crate::convert::{lora_from_proto, lora_to_proto};
use grpo_rollout::engine::InFlight;
use grpo_rollout::host_weights::{Bf16Tensor, IncomingWeights};
use grpo_rollout::{Error, Result};
use grpo_xla::ElementType;
use half::bf16;

/// The most bytes of values one chunk may carry (the worker accepts gRPC
/// messages this big plus room for the other fields).
pub const MAX_CHUNK_BYTES: usize = 4 << 20;

/// How tensor values travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireDtype {
    /// 4 bytes a value, exact.
    F32,
    /// 2 bytes a value, rounded to nearest even (half the traffic).
    Bf16,
}

impl WireDtype {
    /// Bytes of one value.
    pub fn element_bytes(self) -> usize {
        match self {
            WireDtype::F32 => 4,
            WireDtype::Bf16 => 2,
        }
    }

    /// Appends `values` in this dtype.
    fn encode_into(self, values: &[f32], out: &mut Vec<u8>) {
        match self {
            WireDtype::F32 => out.extend(values.iter().flat_map(|v| v.to_le_bytes())),
            WireDtype::Bf16 => out.extend(values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())),
        }
    }

    /// Fills `out` from `bytes` (exactly `out.len()` values), converting
    /// to `T` (rounding to nearest even when that narrows).
    fn decode_into<T: FromWire>(self, bytes: &[u8], out: &mut [T]) {
        match self {
            WireDtype::F32 => {
                for (value, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *value = T::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                }
            }
            WireDtype::Bf16 => {
                for (value, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *value = T::from_bf16(bf16::from_le_bytes([b[0], b[1]]));
                }
            }
        }
    }

    /// The protocol's name for it.
    pub(crate) fn to_proto(self) -> proto::Dtype {
        match self {
            WireDtype::F32 => proto::Dtype::F32,
            WireDtype::Bf16 => proto::Dtype::Bf16,
        }
    }

    fn from_proto(code: i32) -> Option<WireDtype> {
        match proto::Dtype::try_from(code).ok()? {
            proto::Dtype::F32 => Some(WireDtype::F32),
            proto::Dtype::Bf16 => Some(WireDtype::Bf16),
            proto::Dtype::Unspecified => None,
        }
    }
}

/// A value type a staged tensor holds: the engine's dtype.
trait FromWire: Copy + Default {
    fn from_f32(value: f32) -> Self;
    fn from_bf16(value: bf16) -> Self;
}

impl FromWire for f32 {
    fn from_f32(value: f32) -> Self {
        value
    }

    fn from_bf16(value: bf16) -> Self {
        value.to_f32()
    }
}

impl FromWire for bf16 {
    fn from_f32(value: f32) -> Self {
        bf16::from_f32(value)
    }

    fn from_bf16(value: bf16) -> Self {
        value
    }
}

/// A weight update encoded once, for any number of workers: the
/// announcement (phase 1: names, shapes, dtype and each tensor's checksum)
/// and every tensor cut into checksummed chunks of at most `chunk_bytes`
/// bytes (phase 2). Encoding and checksums take one pass over the values;
/// it holds one encoded copy of the tensors (2 or 4 bytes a value), which
/// each worker's push then streams.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedUpdate {
    /// Phase 1's request.
    pub start: proto::StartWeightUpdateRequest,
    /// Phase 2's chunks, tensor by tensor in element order.
    pub chunks: Vec<proto::WeightChunk>,
}

impl EncodedUpdate {
    /// `tensors` (adapters of layout `adapters`, or model parameters)
    /// encoded in `dtype` as `version`, chunks of at most `chunk_bytes`
    /// bytes (rounded down to whole values, at least one).
    pub fn new(
        version: u64,
        (tensors, adapters): (&[(String, HostTensor)], Option<&LoraConfig>),
        dtype: WireDtype,
        chunk_bytes: usize,
        in_flight: InFlight,
    ) -> EncodedUpdate {
        let per_chunk = (chunk_bytes / dtype.element_bytes()).max(1);
        let mut chunks = Vec::new();
        let mut specs = Vec::with_capacity(tensors.len());
        for (name, tensor) in tensors {
            let mut whole = crc32fast::Hasher::new();
            for (i, values) in tensor.data.chunks(per_chunk).enumerate() {
                let mut data = Vec::with_capacity(values.len() * dtype.element_bytes());
                dtype.encode_into(values, &mut data);
                whole.update(&data);
                chunks.push(proto::WeightChunk {
                    version,
                    name: name.clone(),
                    offset_elements: (i * per_chunk) as u64,
                    crc32: crc32fast::hash(&data),
                    data,
                });
            }
            specs.push(proto::TensorSpec {
                name: name.clone(),
                shape: tensor.dims.iter().map(|&d| d as u64).collect(),
                dtype: dtype.to_proto().into(),
                crc32: whole.finalize(),
            });
        }
        EncodedUpdate {
            start: proto::StartWeightUpdateRequest {
                version,
                tensors: specs,
                in_flight: in_flight_to_proto(in_flight).into(),
                adapters: adapters.map(lora_to_proto),
            },
            chunks,
        }
    }

    /// The version it installs.
    pub fn version(&self) -> u64 {
        self.start.version
    }
}

/// The protocol's name for `in_flight`.
pub(crate) fn in_flight_to_proto(in_flight: InFlight) -> proto::InFlight {
    match in_flight {
        InFlight::Keep => proto::InFlight::Keep,
        InFlight::Abort => proto::InFlight::Abort,
    }
}

/// A chunk that arrived: where it lies in its tensor and its checksum.
#[derive(Debug)]
struct Received {
    /// One past its last element.
    end: usize,
    crc32: u32,
    bytes: u64,
}

/// One announced tensor being filled.
#[derive(Debug)]
struct StagedTensor {
    name: String,
    dims: Vec<usize>,
    dtype: WireDtype,
    crc32: u32,
    /// Element count.
    len: usize,
    /// Chunks by first element.
    received: BTreeMap<usize, Received>,
}

impl StagedTensor {
    /// Checks that the chunks cover every element exactly once and that
    /// their combined checksum is the announced one.
    fn check_complete(&self) -> std::result::Result<(), String> {
        let mut covered = 0;
        let mut hasher = crc32fast::Hasher::new();
        for (&start, chunk) in &self.received {
            if start != covered {
                return Err(format!("`{}`: elements {covered}..{start} never arrived", self.name));
            }
            hasher.combine(&crc32fast::Hasher::new_with_initial_len(chunk.crc32, chunk.bytes));
            covered = chunk.end;
        }
        if covered != self.len {
            return Err(format!(
                "`{}`: elements {covered}..{} never arrived",
                self.name, self.len
            ));
        }
        let crc = hasher.finalize();
        if crc != self.crc32 {
            return Err(format!(
                "`{}`: the tensor's checksum is {crc:#010x}, announced {:#010x}",
                self.name, self.crc32
            ));
        }
        Ok(())
    }
}

/// The values of every staged tensor, in the engine's dtype.
#[derive(Debug)]
enum StagedValues {
    F32(Vec<Vec<f32>>),
    Bf16(Vec<Vec<bf16>>),
}

/// A complete update, ready for [`grpo_rollout::handle::EngineHandle::update_weights`].
#[derive(Debug)]
pub(crate) struct Assembled {
    pub version: u64,
    /// The LoRA layout the tensors are adapters of (`None`: model parameters).
    pub adapters: Option<LoraConfig>,
    pub tensors: IncomingWeights,
    pub in_flight: InFlight,
}

/// The LoRA layout an update announces (if any) and the parameters its
/// tensors must be among: the model's (`decoder`, without adapters), or
/// with a layout the model's with those adapters.
pub(crate) fn announced_parameters(
    start: &proto::StartWeightUpdateRequest,
    decoder: &Decoder,
) -> Result<(Option<LoraConfig>, Vec<ParamSpec>)> {
    let refuse = |message: String| Error::InvalidUpdate {
        version: start.version,
        message,
    };
    let Some(message) = &start.adapters else {
        return Ok((None, decoder.parameters().to_vec()));
    };
    let lora = lora_from_proto(message).map_err(refuse)?;
    let adapted = Decoder::with_adapters(decoder.config().clone(), lora.clone())
        .map_err(|e| refuse(format!("adapters the model cannot take: {e}")))?;
    Ok((Some(lora), adapted.parameters().to_vec()))
}

/// A weight update between its start and its finish: announced tensors
/// being filled by chunks.
#[derive(Debug)]
pub(crate) struct StagedUpdate {
    version: u64,
    adapters: Option<LoraConfig>,
    in_flight: InFlight,
    tensors: Vec<StagedTensor>,
    /// `tensors`' values, in the same order.
    values: StagedValues,
}

impl StagedUpdate {
    /// Stages the update `start` announces for a model with `parameters`
    /// (those of `adapters`' layout when the update carries adapters, see
    /// [`announced_parameters`]) whose engine runs in `engine_dtype` (bf16,
    /// or f32 for anything else): each tensor must be one of the
    /// parameters (once), with its shape.
    pub fn new(
        start: &proto::StartWeightUpdateRequest,
        parameters: &[ParamSpec],
        adapters: Option<LoraConfig>,
        engine_dtype: ElementType,
    ) -> Result<StagedUpdate> {
        let version = start.version;
        let refuse = |message: String| Error::InvalidUpdate { version, message };
        let in_flight = match proto::InFlight::try_from(start.in_flight) {
            Ok(proto::InFlight::Keep) => InFlight::Keep,
            Ok(proto::InFlight::Abort) => InFlight::Abort,
            _ => return Err(refuse(format!("in_flight {} is not KEEP or ABORT", start.in_flight))),
        };
        let mut tensors: Vec<StagedTensor> = Vec::with_capacity(start.tensors.len());
        for spec in &start.tensors {
            let name = &spec.name;
            let param = parameters
                .iter()
                .find(|p| &p.name == name)
                .ok_or_else(|| refuse(format!("the model has no parameter `{name}`")))?;
            if tensors.iter().any(|t| &t.name == name) {
                return Err(refuse(format!("`{name}` appears twice")));
            }
            if !spec.shape.iter().map(|&d| d as usize).eq(param.dims.iter().copied()) {
                return Err(refuse(format!(
                    "`{name}` has shape {:?}, the model needs {:?}",
                    spec.shape, param.dims
                )));
            }
            let dtype = WireDtype::from_proto(spec.dtype)
                .ok_or_else(|| refuse(format!("`{name}`: dtype {} is not F32 or BF16", spec.dtype)))?;
            tensors.push(StagedTensor {
                name: name.clone(),
                dims: param.dims.clone(),
                dtype,
                crc32: spec.crc32,
                len: param.dims.iter().product(),
                received: BTreeMap::new(),
            });
        }
        let values = match engine_dtype {
            ElementType::Bf16 => StagedValues::Bf16(tensors.iter().map(|t| vec![bf16::ZERO; t.len]).collect()),
            _ => StagedValues::F32(tensors.iter().map(|t| vec![0.0; t.len]).collect()),
        };
        Ok(StagedUpdate {
            version,
            adapters,
            in_flight,
            tensors,
            values,
        })
    }

    /// The version this update installs.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Copies a chunk into its tensor; returns how many values it held.
    /// Refuses a chunk of another version or tensor, a checksum mismatch,
    /// a partial value, and a slice outside the tensor or overlapping one
    /// already received.
    pub fn add(&mut self, chunk: &proto::WeightChunk) -> Result<usize> {
        let refuse = |message: String| Error::InvalidUpdate {
            version: self.version,
            message,
        };
        if chunk.version != self.version {
            return Err(refuse(format!("a chunk of version {} arrived", chunk.version)));
        }
        let name = &chunk.name;
        let index = self
            .tensors
            .iter()
            .position(|t| &t.name == name)
            .ok_or_else(|| refuse(format!("a chunk of `{name}`, which the update did not announce")))?;
        let tensor = &mut self.tensors[index];
        let crc = crc32fast::hash(&chunk.data);
        if crc != chunk.crc32 {
            return Err(refuse(format!(
                "a chunk of `{name}` at element {} has checksum {crc:#010x}, announced {:#010x}",
                chunk.offset_elements, chunk.crc32
            )));
        }
        let size = tensor.dtype.element_bytes();
        if chunk.data.is_empty() || !chunk.data.len().is_multiple_of(size) {
            return Err(refuse(format!(
                "a chunk of `{name}` holds {} bytes, not a positive multiple of {size}",
                chunk.data.len()
            )));
        }
        let count = chunk.data.len() / size;
        let len = tensor.len;
        let start = usize::try_from(chunk.offset_elements).unwrap_or(usize::MAX);
        let end = start.checked_add(count).filter(|&end| end <= len).ok_or_else(|| {
            refuse(format!(
                "a chunk of `{name}` covers elements {}..+{count}, past its {len}",
                chunk.offset_elements
            ))
        })?;
        let before = tensor.received.range(..end).next_back();
        if let Some((&other, previous)) = before.filter(|(_, previous)| previous.end > start) {
            return Err(refuse(format!(
                "a chunk of `{name}` covers elements {start}..{end}, overlapping {other}..{} already received",
                previous.end
            )));
        }
        match &mut self.values {
            StagedValues::F32(values) => tensor.dtype.decode_into(&chunk.data, &mut values[index][start..end]),
            StagedValues::Bf16(values) => tensor.dtype.decode_into(&chunk.data, &mut values[index][start..end]),
        }
        tensor.received.insert(
            start,
            Received {
                end,
                crc32: chunk.crc32,
                bytes: chunk.data.len() as u64,
            },
        );
        Ok(count)
    }

    /// The complete update, if `version` is this one's, every element of
    /// every tensor arrived and each tensor's checksum matches.
    pub fn finish(self, version: u64) -> Result<Assembled> {
        let refuse = |message: String| Error::InvalidUpdate {
            version: self.version,
            message,
        };
        if version != self.version {
            return Err(refuse(format!("finishing version {version} instead")));
        }
        for tensor in &self.tensors {
            tensor.check_complete().map_err(refuse)?;
        }
        let named = self.tensors.into_iter().map(|t| (t.name, t.dims));
        let tensors = match self.values {
            StagedValues::F32(values) => named
                .zip(values)
                .map(|((name, dims), data)| (name, HostTensor { dims, data }))
                .collect::<Vec<_>>()
                .into(),
            StagedValues::Bf16(values) => named
                .zip(values)
                .map(|((name, dims), data)| (name, Bf16Tensor { dims, data }))
                .collect::<Vec<_>>()
                .into(),
        };
        Ok(Assembled {
            version,
            adapters: self.adapters,
            tensors,
            in_flight: self.in_flight,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parameters() -> Vec<ParamSpec> {
        vec![
            ParamSpec {
                name: "a".to_string(),
                dims: vec![3, 5],
            },
            ParamSpec {
                name: "b".to_string(),
                dims: vec![7],
            },
        ]
    }

    fn tensors() -> Vec<(String, HostTensor)> {
        parameters()
            .into_iter()
            .map(|p| {
                let count = p.dims.iter().product::<usize>();
                let data = (0..count).map(|i| (i as f32 - 4.0) * 0.37).collect();
                (p.name, HostTensor { dims: p.dims, data })
            })
            .collect()
    }

    fn encoded(dtype: WireDtype, chunk_bytes: usize) -> EncodedUpdate {
        EncodedUpdate::new(3, (&tensors(), None), dtype, chunk_bytes, InFlight::Keep)
    }

    fn staged(dtype: WireDtype) -> StagedUpdate {
        StagedUpdate::new(&encoded(dtype, 1 << 20).start, &parameters(), None, ElementType::F32).unwrap()
    }

    fn chunks(dtype: WireDtype, chunk_bytes: usize) -> Vec<proto::WeightChunk> {
        encoded(dtype, chunk_bytes).chunks
    }

    fn refusal(result: Result<impl std::fmt::Debug>) -> String {
        match result.unwrap_err() {
            Error::InvalidUpdate { version: 3, message } => message,
            other => panic!("{other}"),
        }
    }

    /// The assembled tensors' names, shapes and values (as f32).
    fn values(weights: &IncomingWeights) -> Vec<(String, Vec<usize>, Vec<f32>)> {
        match weights {
            IncomingWeights::F32(tensors) => tensors
                .iter()
                .map(|(name, t)| (name.clone(), t.dims.clone(), t.data.clone()))
                .collect(),
            IncomingWeights::Bf16(tensors) => tensors
                .iter()
                .map(|(name, t)| {
                    (
                        name.clone(),
                        t.dims.clone(),
                        t.data.iter().map(|v| v.to_f32()).collect(),
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn chunks_in_any_order_assemble_the_tensors_in_the_engines_dtype() {
        let engines = [ElementType::F32, ElementType::Bf16];
        let wires = [(WireDtype::F32, 12), (WireDtype::Bf16, 6), (WireDtype::F32, 1 << 20)];
        for (engine, (dtype, chunk_bytes)) in engines.into_iter().flat_map(|e| wires.map(|w| (e, w))) {
            let start = encoded(dtype, 1 << 20).start;
            let mut update = StagedUpdate::new(&start, &parameters(), None, engine).unwrap();
            let mut all = chunks(dtype, chunk_bytes);
            all.reverse();
            let count: usize = all.iter().map(|c| update.add(c).unwrap()).sum();
            assert_eq!(count, 22);
            let done = update.finish(3).unwrap();
            assert_eq!((done.version, done.in_flight), (3, InFlight::Keep));
            assert_eq!(
                matches!(done.tensors, IncomingWeights::Bf16(_)),
                engine == ElementType::Bf16
            );
            let exact = dtype == WireDtype::F32 && engine == ElementType::F32;
            let want: Vec<_> = tensors()
                .into_iter()
                .map(|(name, t)| {
                    let data = if exact {
                        t.data
                    } else {
                        t.data.iter().map(|&v| bf16::from_f32(v).to_f32()).collect()
                    };
                    (name, t.dims, data)
                })
                .collect();
            assert_eq!(values(&done.tensors), want, "{dtype:?} into {engine}");
        }
    }

    #[test]
    fn a_chunk_size_below_one_value_sends_one_value_a_chunk() {
        let all = chunks(WireDtype::F32, 1);
        assert_eq!(all.len(), 22);
        assert!(all.iter().all(|c| c.data.len() == 4));
    }

    #[test]
    fn bad_chunks_are_refused_naming_the_problem() {
        let good = chunks(WireDtype::F32, 8)[1].clone();
        let bad = |f: &dyn Fn(&mut proto::WeightChunk)| {
            let mut chunk = good.clone();
            f(&mut chunk);
            chunk
        };
        let cases = [
            (bad(&|c| c.version = 4), "version 4"),
            (bad(&|c| c.name = "c".to_string()), "did not announce"),
            (bad(&|c| c.data[0] ^= 1), "checksum"),
            (
                bad(&|c| {
                    c.data.pop();
                    c.crc32 = crc32fast::hash(&c.data);
                }),
                "multiple of 4",
            ),
            (
                bad(&|c| {
                    c.data.clear();
                    c.crc32 = crc32fast::hash(&c.data);
                }),
                "positive multiple",
            ),
            (bad(&|c| c.offset_elements = 14), "past its 15"),
            (bad(&|c| c.offset_elements = u64::MAX), "past its 15"),
        ];
        for (chunk, needle) in cases {
            let message = refusal(staged(WireDtype::F32).add(&chunk));
            assert!(message.contains(needle), "{message} should say {needle}");
        }
    }

    #[test]
    fn overlapping_chunks_are_refused() {
        let mut update = staged(WireDtype::F32);
        let all = chunks(WireDtype::F32, 8);
        update.add(&all[1]).unwrap(); // elements 2..4
        for offset in [1, 2, 3] {
            let mut chunk = all[1].clone();
            chunk.offset_elements = offset;
            let message = refusal(update.add(&chunk));
            assert!(message.contains("overlapping 2..4"), "{message}");
        }
        update.add(&all[0]).unwrap(); // 0..2 touches 2..4 without overlapping
    }

    #[test]
    fn an_incomplete_or_miscounted_update_is_refused_at_the_finish() {
        let all = chunks(WireDtype::Bf16, 4);
        let mut missing = staged(WireDtype::Bf16);
        for (i, chunk) in all.iter().enumerate() {
            if i != 2 {
                missing.add(chunk).unwrap();
            }
        }
        let message = refusal(missing.finish(3));
        assert!(message.contains("`a`: elements 4..6 never arrived"), "{message}");

        let mut short = staged(WireDtype::Bf16);
        for chunk in &all[..all.len() - 1] {
            short.add(chunk).unwrap();
        }
        let message = refusal(short.finish(3));
        assert!(message.contains("`b`: elements 6..7 never arrived"), "{message}");

        // Right chunks, wrong announcement: the whole-tensor checksum catches it.
        let mut start = encoded(WireDtype::Bf16, 1 << 20).start;
        start.tensors[1].crc32 ^= 1;
        let mut announced = StagedUpdate::new(&start, &parameters(), None, ElementType::F32).unwrap();
        for chunk in &all {
            announced.add(chunk).unwrap();
        }
        let message = refusal(announced.finish(3));
        assert!(message.contains("`b`: the tensor's checksum"), "{message}");

        let message = refusal(staged(WireDtype::Bf16).finish(4));
        assert!(message.contains("finishing version 4"), "{message}");
    }

    #[test]
    fn announcements_must_match_the_model() {
        let start = || EncodedUpdate::new(3, (&tensors(), None), WireDtype::F32, 1 << 20, InFlight::Abort).start;
        let bad = |f: &dyn Fn(&mut proto::StartWeightUpdateRequest)| {
            let mut request = start();
            f(&mut request);
            refusal(StagedUpdate::new(&request, &parameters(), None, ElementType::F32))
        };
        let cases = [
            (bad(&|r| r.tensors[0].name = "z".to_string()), "no parameter `z`"),
            (bad(&|r| r.tensors[1].name = "a".to_string()), "`a` appears twice"),
            (bad(&|r| r.tensors[0].shape = vec![5, 3]), "shape [5, 3]"),
            (bad(&|r| r.tensors[0].dtype = 0), "dtype 0"),
            (bad(&|r| r.in_flight = 0), "in_flight 0"),
        ];
        for (message, needle) in cases {
            assert!(message.contains(needle), "{message} should say {needle}");
        }
        let update = StagedUpdate::new(&start(), &parameters(), None, ElementType::Bf16).unwrap();
        assert_eq!((update.version(), update.in_flight), (3, InFlight::Abort));
    }
}
