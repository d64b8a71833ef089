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

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let missing = || Error::Tensor {
            path: self.location(),
            tensor: name.to_string(),
            message: "is not in the checkpoint".to_string(),
        };
        let &file = self.index.get(name).ok_or_else(missing)?;
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
    let path = path.as_ref();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, t)| {
            // SAFETY: f32 slices are plain bytes.
            let bytes = unsafe { std::slice::from_raw_parts(t.data.as_ptr().cast::<u8>(), t.data.len() * 4) };
            safetensors::tensor::TensorView::new(Dtype::F32, t.dims.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::Tensor {
                    path: path.to_path_buf(),
                    tensor: name.clone(),
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
