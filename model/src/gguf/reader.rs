//! Reading GGUF files (versions 2 and 3, little-endian): the header,
//! metadata, tensor infos and tensor data of a memory-mapped file.
//!
//! Layout: magic `GGUF`, version (u32), tensor count and metadata count
//! (u64 each); the metadata as key (u64 length + UTF-8), value type (u32),
//! value; per tensor its name, dimension count (u32), dimensions (u64 each,
//! innermost first), ggml type (u32) and offset (u64) into the data section,
//! which starts at the next multiple of `general.alignment` (default 32).

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::dequant::{GgmlType, Layout};
use super::metadata::{MetadataValue, ValueType};
use crate::{Error, Result};

/// The GGUF versions grpo reads (3 only added big-endian files, which grpo refuses).
const VERSIONS: [u32; 2] = [2, 3];
/// Data alignment when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: usize = 32;
/// ggml's limit on tensor dimensions.
const MAX_DIMS: u32 = 4;
/// How deep arrays of arrays may nest (real files use one level).
const MAX_NESTING: usize = 8;

/// What a GGUF file says about one tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    /// The tensor's GGUF name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, outermost first as in numpy and Hugging Face (GGUF stores
    /// them innermost first): a `[rows, cols]` matrix has rows of `cols` values.
    pub dims: Vec<usize>,
    /// The element type.
    pub ggml_type: GgmlType,
    /// Byte offset of the data from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// The number of values (the product of `dims`).
    pub fn element_count(&self) -> usize {
        self.dims.iter().product()
    }
}

/// A memory-mapped GGUF file with its metadata and tensor infos parsed.
pub struct GgufFile {
    path: PathBuf,
    map: Mmap,
    version: u32,
    alignment: usize,
    data_start: usize,
    metadata: BTreeMap<String, MetadataValue>,
    tensors: Vec<TensorInfo>,
}

impl GgufFile {
    /// Maps and parses `path`. Checks that the data of every tensor of a type
    /// grpo can read lies inside the file, so a truncated file fails here
    /// with an error naming the first tensor cut off.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| Error::io("opening", &path, e))?;
        // SAFETY: the map is read-only; like every reader of mapped model
        // files, grpo assumes nobody truncates the file while it is open.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io("memory-mapping", &path, e))?;
        let header = Header::parse(&map).map_err(|message| Error::format(&path, message))?;
        let gguf = GgufFile {
            path,
            map,
            version: header.version,
            alignment: header.alignment,
            data_start: header.data_start,
            metadata: header.metadata,
            tensors: header.tensors,
        };
        for info in &gguf.tensors {
            if info.ggml_type.layout().is_some() {
                gguf.tensor_data(info)?;
            }
        }
        Ok(gguf)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of tensor data in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// All metadata, by key.
    pub fn metadata(&self) -> &BTreeMap<String, MetadataValue> {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata.get(key)
    }

    /// `Some` typed value of `key` through `get` (one of the `get_*`
    /// methods), or `None` when the key is absent; a value of the wrong type
    /// is still an error: `file.optional("llama.vocab_size", GgufFile::get_u32)?`.
    pub fn optional<'a, T>(&'a self, key: &str, get: impl FnOnce(&'a Self, &str) -> Result<T>) -> Result<Option<T>> {
        match self.get(key) {
            Some(_) => get(self, key).map(Some),
            None => Ok(None),
        }
    }

    /// The string `key`.
    pub fn get_str(&self, key: &str) -> Result<&str> {
        self.typed(key, "a string", MetadataValue::as_str)
    }

    /// The integer `key`, of any integer type whose value fits a `u32`.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.typed(key, "an integer that fits a u32", MetadataValue::as_u32)
    }

    /// The float `key` (`FLOAT32`, or `FLOAT64` rounded).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.typed(key, "a float", MetadataValue::as_f32)
    }

    /// The flag `key`.
    pub fn get_bool(&self, key: &str) -> Result<bool> {
        self.typed(key, "a bool", MetadataValue::as_bool)
    }

    /// The array of strings `key`.
    pub fn get_string_array(&self, key: &str) -> Result<Vec<&str>> {
        self.typed(key, "an array of strings", |v| {
            v.as_array()?.iter().map(MetadataValue::as_str).collect()
        })
    }

    /// The array of integers `key`, each of any integer type whose value fits an `i32`.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        self.typed(key, "an array of integers that fit an i32", |v| {
            v.as_array()?.iter().map(MetadataValue::as_i32).collect()
        })
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The info of tensor `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Tensor `name` dequantized to f32: its dims (outermost first) and its
    /// values in row-major order.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<usize>, Vec<f32>)> {
        let info = self
            .tensor(name)
            .ok_or_else(|| self.tensor_error(name, "no such tensor in the file".into()))?;
        let (layout, data) = self.tensor_data(info)?;
        Ok((info.dims.clone(), layout.dequantize(data)))
    }

    /// The layout and the bytes of a tensor, checked against the file.
    fn tensor_data(&self, info: &TensorInfo) -> Result<(Layout, &[u8])> {
        let fail = |message: String| self.tensor_error(&info.name, message);
        let layout = info.ggml_type.layout().ok_or_else(|| {
            fail(format!(
                "ggml type {} is not supported (grpo reads {})",
                info.ggml_type,
                GgmlType::supported_names()
            ))
        })?;
        let row = info.dims.last().copied().unwrap_or(1);
        if !row.is_multiple_of(layout.elems) {
            return Err(fail(format!(
                "rows of {row} values are not whole blocks of {} of type {}",
                layout.elems, info.ggml_type
            )));
        }
        if !info.offset.is_multiple_of(self.alignment as u64) {
            return Err(fail(format!(
                "data offset {} is not a multiple of the alignment {}",
                info.offset, self.alignment
            )));
        }
        let bytes = (info.element_count() / layout.elems).checked_mul(layout.bytes);
        let range = bytes.and_then(|n| data_range(self.data_start, info.offset, n));
        match range.filter(|r| r.end <= self.map.len()) {
            Some(r) => Ok((layout, &self.map[r])),
            None => Err(fail(format!(
                "its data ({} bytes at offset {} of the data section, which starts at byte {}) \
                 run past the end of the file ({} bytes): truncated?",
                bytes.map_or("too many".into(), |n| n.to_string()),
                info.offset,
                self.data_start,
                self.map.len()
            ))),
        }
    }

    /// A metadata value through `view`, or an error naming the key and file.
    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        view: impl FnOnce(&'a MetadataValue) -> Option<T>,
    ) -> Result<T> {
        let value = self
            .get(key)
            .ok_or_else(|| Error::format(&self.path, format!("metadata key `{key}` is missing")))?;
        view(value).ok_or_else(|| {
            Error::format(
                &self.path,
                format!("metadata key `{key}` holds {value}, expected {expected}"),
            )
        })
    }

    fn tensor_error(&self, tensor: &str, message: String) -> Error {
        Error::Tensor {
            path: self.path.clone(),
            tensor: tensor.into(),
            message,
        }
    }
}

/// `data_start + offset .. + len`, if it does not overflow.
fn data_range(data_start: usize, offset: u64, len: usize) -> Option<Range<usize>> {
    let start = data_start.checked_add(usize::try_from(offset).ok()?)?;
    Some(start..start.checked_add(len)?)
}

/// Everything before the tensor data.
struct Header {
    version: u32,
    alignment: usize,
    data_start: usize,
    metadata: BTreeMap<String, MetadataValue>,
    tensors: Vec<TensorInfo>,
}

/// A parse failure, described with where in the file it happened.
type Parse<T> = std::result::Result<T, String>;

impl Header {
    fn parse(bytes: &[u8]) -> Parse<Header> {
        let mut cur = Cursor { bytes, pos: 0 };
        let magic = cur.take(4).map_err(|e| format!("reading the magic: {e}"))?;
        if magic != b"GGUF" {
            return Err(format!(
                "not a GGUF file: it starts with {magic:02x?}, not the magic \"GGUF\""
            ));
        }
        let version = cur.u32().map_err(|e| format!("reading the version: {e}"))?;
        if !VERSIONS.contains(&version) {
            return Err(if VERSIONS.contains(&version.swap_bytes()) {
                "big-endian GGUF files are not supported".into()
            } else {
                format!("GGUF version {version} is not supported (grpo reads 2 and 3)")
            });
        }
        let counts = |e| format!("reading the tensor and metadata counts: {e}");
        let n_tensors = cur.u64().map_err(counts)?;
        let n_metadata = cur.u64().map_err(counts)?;

        let mut metadata = BTreeMap::new();
        for i in 0..n_metadata {
            let key = cur.string().map_err(|e| format!("key of metadata entry {i}: {e}"))?;
            if key.is_empty() {
                return Err(format!("metadata entry {i} has an empty key"));
            }
            let value = cur
                .u32()
                .and_then(|id| cur.value(value_type(id)?, 0))
                .map_err(|e| format!("metadata entry {i} (`{key}`): {e}"))?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(format!("metadata key `{key}` appears twice"));
            }
        }
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(value) => value
                .as_u32()
                .filter(|a| a.is_power_of_two())
                .map(|a| a as usize)
                .ok_or_else(|| format!("`general.alignment` holds {value}, expected a power of two"))?,
        };

        let mut tensors: Vec<TensorInfo> = Vec::new();
        for i in 0..n_tensors {
            let info = cur.tensor_info().map_err(|e| format!("info of tensor {i}: {e}"))?;
            if tensors.iter().any(|t| t.name == info.name) {
                return Err(format!("tensor `{}` appears twice", info.name));
            }
            tensors.push(info);
        }
        let data_start = cur.pos.next_multiple_of(alignment);
        Ok(Header {
            version,
            alignment,
            data_start,
            metadata,
            tensors,
        })
    }
}

fn value_type(id: u32) -> Parse<ValueType> {
    ValueType::from_id(id).ok_or_else(|| format!("unknown value type {id}"))
}

/// Little-endian reads that fail, rather than panic, past the end.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, len: u64) -> Parse<&'a [u8]> {
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| self.pos.checked_add(len))
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "{len} bytes at offset {} run past the end of the file ({} bytes): truncated?",
                    self.pos,
                    self.bytes.len()
                )
            })?;
        let taken = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self) -> Parse<[u8; N]> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N as u64)?);
        Ok(out)
    }

    fn u32(&mut self) -> Parse<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Parse<u64> {
        self.array().map(u64::from_le_bytes)
    }

    fn string(&mut self) -> Parse<String> {
        let at = self.pos;
        let len = self.u64()?;
        String::from_utf8(self.take(len)?.to_vec()).map_err(|e| format!("the string at offset {at} is not UTF-8: {e}"))
    }

    fn value(&mut self, ty: ValueType, depth: usize) -> Parse<MetadataValue> {
        use MetadataValue as M;
        Ok(match ty {
            ValueType::U8 => M::U8(u8::from_le_bytes(self.array()?)),
            ValueType::I8 => M::I8(i8::from_le_bytes(self.array()?)),
            ValueType::U16 => M::U16(u16::from_le_bytes(self.array()?)),
            ValueType::I16 => M::I16(i16::from_le_bytes(self.array()?)),
            ValueType::U32 => M::U32(self.u32()?),
            ValueType::I32 => M::I32(i32::from_le_bytes(self.array()?)),
            ValueType::U64 => M::U64(self.u64()?),
            ValueType::I64 => M::I64(i64::from_le_bytes(self.array()?)),
            ValueType::F32 => M::F32(f32::from_le_bytes(self.array()?)),
            ValueType::F64 => M::F64(f64::from_le_bytes(self.array()?)),
            ValueType::Bool => match self.array::<1>()? {
                [0] => M::Bool(false),
                [1] => M::Bool(true),
                [b] => return Err(format!("BOOL byte {b} at offset {} is neither 0 nor 1", self.pos - 1)),
            },
            ValueType::String => M::String(self.string()?),
            ValueType::Array => {
                if depth == MAX_NESTING {
                    return Err(format!("arrays nest deeper than {MAX_NESTING} levels"));
                }
                let elem = value_type(self.u32()?)?;
                let count = self.u64()?;
                // Refuse counts the rest of the file cannot hold before allocating.
                let left = (self.bytes.len() - self.pos) as u64;
                if count > left / min_size(elem) {
                    return Err(format!(
                        "an array of {count} {elem} at offset {} does not fit in the {left} bytes left",
                        self.pos
                    ));
                }
                let items = (0..count).map(|_| self.value(elem, depth + 1)).collect::<Parse<_>>()?;
                M::Array(elem, items)
            }
        })
    }

    fn tensor_info(&mut self) -> Parse<TensorInfo> {
        let name = self.string()?;
        let in_tensor = |e: String| format!("`{name}`: {e}");
        let n_dims = self.u32().map_err(in_tensor)?;
        if n_dims > MAX_DIMS {
            return Err(in_tensor(format!(
                "{n_dims} dimensions, ggml allows at most {MAX_DIMS}"
            )));
        }
        let mut dims = (0..n_dims)
            .map(|_| {
                let dim = self.u64()?;
                usize::try_from(dim).map_err(|_| format!("dimension {dim} is too large"))
            })
            .collect::<Parse<Vec<usize>>>()
            .map_err(in_tensor)?;
        dims.reverse();
        if dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).is_none() {
            return Err(in_tensor(format!("dimensions {dims:?} overflow")));
        }
        let ggml_type = GgmlType(self.u32().map_err(in_tensor)?);
        let offset = self.u64().map_err(in_tensor)?;
        Ok(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
        })
    }
}

/// The fewest bytes one element of type `ty` takes.
fn min_size(ty: ValueType) -> u64 {
    match ty {
        ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
        ValueType::U16 | ValueType::I16 => 2,
        ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
        ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
        ValueType::Array => 12,
    }
}
