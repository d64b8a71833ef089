//! Weights on the host: safetensors checkpoints (one file, or sharded with
//! `model.safetensors.index.json`), memory-mapped and converted to f32 one
//! tensor at a time, and writing a checkpoint in Hugging Face layout.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{Error, Result};

/// A dense row-major f32 tensor on the host.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first.
    pub dims: Vec<usize>,
    /// Values.
    pub data: Vec<f32>,
}

impl HostTensor {
    /// A tensor of `dims` from `data`, checking the element count.
    pub fn new(dims: Vec<usize>, data: Vec<f32>) -> Result<HostTensor> {
        let count: usize = dims.iter().product();
        if count != data.len() {
            return Err(Error::format(
                "tensor",
                format!("{} values do not fill shape {dims:?}", data.len()),
            ));
        }
        Ok(HostTensor { dims, data })
    }

    /// Dimensions as `i64`, as grpo-xla takes them.
    pub fn dims_i64(&self) -> Vec<i64> {
        self.dims.iter().map(|&d| d as i64).collect()
    }
}

/// Anything that yields named weights: a safetensors checkpoint or a GGUF file.
pub trait WeightSource {
    /// Names of every tensor, sorted.
    fn names(&self) -> Vec<String>;
    /// The tensor called `name`, as f32.
    fn tensor(&self, name: &str) -> Result<HostTensor>;
    /// The file (or first file) the weights come from, for error messages.
    fn location(&self) -> PathBuf;
}

impl<T: WeightSource + ?Sized> WeightSource for &T {
    fn names(&self) -> Vec<String> {
        (**self).names()
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        (**self).tensor(name)
    }

    fn location(&self) -> PathBuf {
        (**self).location()
    }
}

/// A safetensors checkpoint: one or more memory-mapped files.
pub struct Safetensors {
    files: Vec<(PathBuf, Mmap)>,
    /// Tensor name → index into `files`.
    index: HashMap<String, usize>,
}

impl Safetensors {
    /// Opens `dir/model.safetensors`, or the shards `dir/model.safetensors.index.json` names.
    pub fn open_dir(dir: impl AsRef<Path>) -> Result<Safetensors> {
        let dir = dir.as_ref();
        let single = dir.join("model.safetensors");
        if single.is_file() {
            return Safetensors::open_files(&[single]);
        }
        let index_path = dir.join("model.safetensors.index.json");
        if index_path.exists() && !index_path.is_file() {
            return Err(Error::format(&index_path, "is not a regular file"));
        }
        let text = std::fs::read_to_string(&index_path)
            .map_err(|e| Error::io("read (neither model.safetensors nor an index is here)", &index_path, e))?;
        let index: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::format(&index_path, format!("not JSON: {e}")))?;
        let map = index
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| Error::format(&index_path, "has no `weight_map` object"))?;
        let mut shards = map
            .values()
            .filter_map(|v| v.as_str())
            .map(|name| shard_in(dir, name, &index_path))
            .collect::<Result<Vec<PathBuf>>>()?;
        shards.sort();
        shards.dedup();
        Safetensors::open_files(&shards)
    }

    /// Opens the given safetensors files as one checkpoint.
    pub fn open_files(paths: &[PathBuf]) -> Result<Safetensors> {
        let mut files = Vec::new();
        let mut index = HashMap::new();
        for path in paths {
            let file = std::fs::File::open(path).map_err(|e| Error::io("open", path, e))?;
            // SAFETY: the file is only read; the map lives as long as `Safetensors`.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io("memory-map", path, e))?;
            let parsed = SafeTensors::deserialize(&map)
                .map_err(|e| Error::format(path, format!("not a valid safetensors file: {e}")))?;
            for name in parsed.names() {
                index.insert(name.to_string(), files.len());
            }
            files.push((path.clone(), map));
        }
        Ok(Safetensors { files, index })
    }
}

/// Shard `name` of the index at `index_path` in folder `dir`: a relative
/// path inside the folder (no root, no `..`) naming a regular file (or a
/// link to one, as the Hugging Face cache makes) — never a pipe or device,
/// which would block the reader for good.
fn shard_in(dir: &Path, name: &str, index_path: &Path) -> Result<PathBuf> {
    let inside = Path::new(name)
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !inside {
        return Err(Error::format(
            index_path,
            format!("shard `{name}` is not a path inside its folder"),
        ));
    }
    let path = dir.join(name);
    if !path.is_file() {
        return Err(Error::format(
            index_path,
            format!("shard `{name}` is missing or not a regular file"),
        ));
    }
    Ok(path)
}

impl WeightSource for Safetensors {
    fn location(&self) -> PathBuf {
        self.files.first().map(|f| f.0.clone()).unwrap_or_default()
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.index.keys().cloned().collect();
        names.sort();
        names
    }

    /// The tensor `name`, or a sparse layer's stacked experts assembled
    /// from the tensors the checkpoint holds them in ([`crate::experts`]).
    fn tensor(&self, name: &str) -> Result<HostTensor> {
        if let Some(&file) = self.index.get(name) {
            return self.read(file, name);
        }
        let held = |part: &str| self.index.get(part).map(|&file| self.read(file, part));
        crate::experts::stacked_tensor(name, held).unwrap_or_else(|| {
            Err(Error::Tensor {
                path: self.location(),
                tensor: name.to_string(),
                message: "is not in the checkpoint".to_string(),
            })
        })
    }
}

impl Safetensors {
    /// Tensor `name` of file `file`, as f32.
    fn read(&self, file: usize, name: &str) -> Result<HostTensor> {
        let (path, map) = &self.files[file];
        let fail = |message: String| Error::Tensor {
            path: path.clone(),
            tensor: name.to_string(),
            message,
        };
        let parsed = SafeTensors::deserialize(map).map_err(|e| fail(e.to_string()))?;
        let view = parsed.tensor(name).map_err(|e| fail(e.to_string()))?;
        let bytes = view.data();
        let data: Vec<f32> = match view.dtype() {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            other => return Err(fail(format!("dtype {other:?} is not supported (f32, bf16, f16 are)"))),
        };
        HostTensor::new(view.shape().to_vec(), data).map_err(|e| fail(e.to_string()))
    }
}

/// Writes `tensors` as one f32 safetensors file, atomically (temporary file,
/// then rename), so transformers can load it.
pub fn save_safetensors(path: impl AsRef<Path>, tensors: &BTreeMap<String, HostTensor>) -> Result<()> {
    write_file(path.as_ref(), tensors.iter(), SaveDtype::F32)
}

/// The dtype a model folder's weights are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SaveDtype {
    /// 32-bit floats, as trained.
    #[default]
    F32,
    /// bfloat16, rounded to nearest even: half the bytes.
    Bf16,
}

impl SaveDtype {
    /// Bytes per value.
    fn bytes(self) -> u64 {
        match self {
            SaveDtype::F32 => 4,
            SaveDtype::Bf16 => 2,
        }
    }

    /// transformers' name of it (config.json's `torch_dtype`).
    pub fn torch_name(self) -> &'static str {
        match self {
            SaveDtype::F32 => "float32",
            SaveDtype::Bf16 => "bfloat16",
        }
    }
}

/// How a model folder's weights are written, as transformers'
/// `save_pretrained` writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveOptions {
    /// The values' dtype.
    pub dtype: SaveDtype,
    /// Largest shard in bytes (transformers' `max_shard_size`, default
    /// 5 GB): above it the weights go into `model-0000k-of-0000n.safetensors`
    /// files named by `model.safetensors.index.json`.
    pub max_shard_bytes: u64,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            dtype: SaveDtype::F32,
            max_shard_bytes: 5_000_000_000,
        }
    }
}

/// Writes `tensors` into `dir` as `options` say: `model.safetensors`, or
/// shards in name order (a tensor larger than a shard alone in its own)
/// with `model.safetensors.index.json` (`metadata.total_size`, `weight_map`).
pub fn save_model_weights<T: std::borrow::Borrow<HostTensor>>(
    dir: &Path,
    tensors: &BTreeMap<String, T>,
    options: SaveOptions,
) -> Result<()> {
    let size = |t: &HostTensor| t.data.len() as u64 * options.dtype.bytes();
    let total: u64 = tensors.values().map(|t| size(t.borrow())).sum();
    if total <= options.max_shard_bytes {
        let all = tensors.iter().map(|(name, t)| (name, t.borrow()));
        return write_file(&dir.join("model.safetensors"), all, options.dtype);
    }
    let mut shards: Vec<Vec<(&String, &HostTensor)>> = vec![Vec::new()];
    let mut filled = 0;
    for (name, tensor) in tensors {
        let tensor = tensor.borrow();
        let last = shards.last_mut().expect("one shard at least");
        if !last.is_empty() && filled + size(tensor) > options.max_shard_bytes {
            shards.push(Vec::new());
            filled = 0;
        }
        shards.last_mut().expect("one shard at least").push((name, tensor));
        filled += size(tensor);
    }
    let mut weight_map = serde_json::Map::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, shards.len());
        write_file(&dir.join(&file), shard.iter().copied(), options.dtype)?;
        for (name, _) in shard {
            weight_map.insert(name.to_string(), file.clone().into());
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
    let path = dir.join("model.safetensors.index.json");
    let text = serde_json::to_string_pretty(&index).map_err(|e| Error::format(&path, e.to_string()))?;
    std::fs::write(&path, text).map_err(|e| Error::io("write", &path, e))
}

/// Writes `tensors` in `dtype` to the safetensors file `path`, through a
/// temporary file renamed into place.
fn write_file<'a>(
    path: &Path,
    tensors: impl Iterator<Item = (&'a String, &'a HostTensor)>,
    dtype: SaveDtype,
) -> Result<()> {
    let encoded: Vec<(&String, &HostTensor, std::borrow::Cow<'_, [u8]>)> = tensors
        .map(|(name, t)| {
            let bytes = match dtype {
                // SAFETY: f32 slices are plain bytes (little-endian on every supported target).
                SaveDtype::F32 => std::borrow::Cow::Borrowed(unsafe {
                    std::slice::from_raw_parts(t.data.as_ptr().cast::<u8>(), t.data.len() * 4)
                }),
                SaveDtype::Bf16 => t.data.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
            };
            (name, t, bytes)
        })
        .collect();
    let kind = match dtype {
        SaveDtype::F32 => Dtype::F32,
        SaveDtype::Bf16 => Dtype::BF16,
    };
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = encoded
        .iter()
        .map(|(name, t, bytes)| {
            safetensors::tensor::TensorView::new(kind, t.dims.clone(), bytes)
                .map(|v| (name.to_string(), v))
                .map_err(|e| Error::Tensor {
                    path: path.to_path_buf(),
                    tensor: name.to_string(),
                    message: e.to_string(),
                })
        })
        .collect::<Result<_>>()?;
    let mut metadata = HashMap::new();
    metadata.insert("format".to_string(), "pt".to_string());
    let temporary = path.with_extension("safetensors.tmp");
    safetensors::serialize_to_file(views, Some(metadata), &temporary)
        .map_err(|e| Error::format(&temporary, format!("cannot write safetensors: {e}")))?;
    std::fs::rename(&temporary, path).map_err(|e| Error::io("rename into", path, e))
}
