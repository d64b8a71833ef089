//! `--adapter DIR`: a PEFT LoRA adapter folder applied to a command's model,
//! merged into its weights as they load (`W + s·B·A`, summed in f64).

use std::path::{Path, PathBuf};

use anyhow::Context;
use grpo_model::config::ModelConfig;
use grpo_model::lora::{AdapterFolder, Merged};
use grpo_model::weights::WeightSource;

/// The `--adapter` argument.
#[derive(Debug, Clone, clap::Args)]
pub struct AdapterArgs {
    /// A PEFT LoRA adapter folder (adapter_config.json and
    /// adapter_model.safetensors, as `grpo run` with [lora] and PEFT's
    /// save_pretrained write them) to apply to the model: merged into its
    /// weights when they load.
    #[arg(long)]
    pub adapter: Option<PathBuf>,
}

impl AdapterArgs {
    /// The adapter folder, read and checked against the model of `config`, when one is given.
    pub fn read(&self, config: &ModelConfig) -> anyhow::Result<Option<AdapterFolder>> {
        self.adapter.as_deref().map(|dir| read(dir, config)).transpose()
    }
}

/// The adapter folder `dir`, read and checked against the model of `config`.
pub fn read(dir: &Path, config: &ModelConfig) -> anyhow::Result<AdapterFolder> {
    AdapterFolder::read(dir, config).with_context(|| format!("--adapter {}", dir.display()))
}

/// `weights` with `folder`'s adapters merged in (as they are without one).
pub fn merged<'a>(weights: &'a dyn WeightSource, folder: Option<&'a AdapterFolder>) -> Box<dyn WeightSource + 'a> {
    match folder {
        Some(folder) => Box::new(Merged {
            base: weights,
            lora: &folder.lora,
            adapters: &folder.tensors,
        }),
        None => Box::new(weights),
    }
}
