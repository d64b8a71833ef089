//! Opening a model the way users name it: a Hugging Face folder
//! (config.json, safetensors, tokenizer.json), a GGUF file (complete on its
//! own: config, weights and tokenizer come from it), or the bundled name
//! `smollm2-135m-instruct`. Also converting a GGUF file into a folder that
//! transformers loads.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::bundled::{SMOLLM2_NAME, smollm2_gguf_path};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gguf::{GgufFile, hf_config_json, hf_tensor_f32, hf_tensor_name};
use crate::names::parameters;
use crate::tokenizer::{GgufTokenizerSpec, Tokenizer};
use crate::weights::{HostTensor, Safetensors, SaveOptions, WeightSource, save_model_weights};

/// A model ready to load onto a device.
pub struct Pretrained {
    /// Its configuration.
    pub config: ModelConfig,
    /// Its weights, in Hugging Face names.
    pub weights: Box<dyn WeightSource>,
    /// Its tokenizer (a folder may come without `tokenizer.json`).
    pub tokenizer: Option<Tokenizer>,
}

/// A GGUF file's weights under their Hugging Face names.
pub struct GgufWeights {
    file: GgufFile,
    /// Hugging Face name → GGUF name.
    names: HashMap<String, String>,
}

impl GgufWeights {
    /// Indexes the tensors of `file` that have Hugging Face names.
    pub fn new(file: GgufFile) -> GgufWeights {
        let names = file
            .tensors()
            .iter()
            .filter_map(|t| hf_tensor_name(&t.name).map(|hf| (hf, t.name.clone())))
            .collect();
        GgufWeights { file, names }
    }

    /// The underlying file.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }
}

impl WeightSource for GgufWeights {
    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.names.keys().cloned().collect();
        names.sort();
        names
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let gguf = self.names.get(name).ok_or_else(|| Error::Tensor {
            path: self.file.path().to_path_buf(),
            tensor: name.to_string(),
            message: "is not in the GGUF file".to_string(),
        })?;
        let tensor = hf_tensor_f32(&self.file, gguf)?;
        HostTensor::new(tensor.dims, tensor.data)
    }

    fn location(&self) -> PathBuf {
        self.file.path().to_path_buf()
    }
}

/// The folder `grpo setup` converts the bundled GGUF into.
pub fn bundled_model_dir() -> PathBuf {
    grpo_xla::pjrt::cache_dir().join("models").join(SMOLLM2_NAME)
}

impl Pretrained {
    /// Opens `spec`: the bundled name, a `.gguf` file, or a model folder.
    pub fn open(spec: &str) -> Result<Pretrained> {
        if spec == SMOLLM2_NAME {
            let dir = bundled_model_dir();
            if dir.join("config.json").is_file() {
                return Pretrained::open_dir(&dir);
            }
            let gguf = smollm2_gguf_path();
            if !gguf.is_file() {
                return Err(Error::format(
                    &gguf,
                    format!("`{SMOLLM2_NAME}` is not installed: run `grpo setup`"),
                ));
            }
            return Pretrained::open_gguf(&gguf);
        }
        let path = Path::new(spec);
        if path.extension().is_some_and(|e| e == "gguf") {
            Pretrained::open_gguf(path)
        } else if path.is_dir() {
            Pretrained::open_dir(path)
        } else {
            Err(Error::format(
                path,
                format!("is neither a model folder nor a .gguf file (nor the name `{SMOLLM2_NAME}`)"),
            ))
        }
    }

    /// Opens a Hugging Face folder.
    pub fn open_dir(dir: &Path) -> Result<Pretrained> {
        let tokenizer_file = dir.join("tokenizer.json");
        Ok(Pretrained {
            config: ModelConfig::from_file(dir.join("config.json"))?,
            weights: Box::new(Safetensors::open_dir(dir)?),
            tokenizer: if tokenizer_file.is_file() {
                Some(Tokenizer::from_file(tokenizer_file)?)
            } else {
                None
            },
        })
    }

    /// Opens a GGUF file: config, weights and tokenizer all come from it.
    pub fn open_gguf(path: &Path) -> Result<Pretrained> {
        let file = GgufFile::open(path)?;
        let config = ModelConfig::from_json(&hf_config_json(&file)?.to_string())?;
        let tokenizer = Tokenizer::from_gguf_spec(&GgufTokenizerSpec::from_gguf(&file)?)?;
        Ok(Pretrained {
            config,
            weights: Box::new(GgufWeights::new(file)),
            tokenizer: Some(tokenizer),
        })
    }
}

/// Writes a GGUF file as a Hugging Face folder (see [`write_model_dir`]).
/// Returns the number of tensors written.
pub fn convert_gguf(gguf: &Path, out: &Path) -> Result<usize> {
    let file = GgufFile::open(gguf)?;
    let config_json = hf_config_json(&file)?;
    let config = ModelConfig::from_json(&config_json.to_string())?;
    let tokenizer = Tokenizer::from_gguf_spec(&GgufTokenizerSpec::from_gguf(&file)?)?;
    let weights = GgufWeights::new(file);
    let mut tensors = BTreeMap::new();
    for spec in parameters(&config) {
        tensors.insert(spec.name.clone(), weights.tensor(&spec.name)?);
    }
    write_model_dir(out, &config_json, &config, &tensors, &tokenizer, SaveOptions::default())?;
    Ok(tensors.len())
}

/// Writes a Hugging Face model folder as `options` say: config.json (its
/// `torch_dtype` the weights'), the weights (`model.safetensors`, or shards
/// and their index; sparse layers' experts one tensor each, as on the Hub), the tokenizer's files (with `chat_template.jinja`) and
/// generation_config.json. config.json is written last, so an interrupted
/// write leaves no folder that looks complete.
pub fn write_model_dir(
    out: &Path,
    config_json: &serde_json::Value,
    config: &ModelConfig,
    tensors: &BTreeMap<String, HostTensor>,
    tokenizer: &Tokenizer,
    options: SaveOptions,
) -> Result<()> {
    std::fs::create_dir_all(out).map_err(|e| Error::io("create", out, e))?;
    let write_json = |name: &str, value: &serde_json::Value| -> Result<()> {
        let path = out.join(name);
        let text = serde_json::to_string_pretty(value).map_err(|e| Error::format(&path, e.to_string()))?;
        std::fs::write(&path, text).map_err(|e| Error::io("write", &path, e))
    };
    let generation = serde_json::json!({
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_ids.first(),
    });
    write_json("generation_config.json", &generation)?;
    tokenizer.save(out)?;
    save_model_weights(out, &crate::experts::hub_layout(tensors)?, options)?;
    let mut config_json = config_json.clone();
    if let Some(fields) = config_json.as_object_mut() {
        fields.insert("torch_dtype".into(), options.dtype.torch_name().into());
    }
    write_json("config.json", &config_json)
}
